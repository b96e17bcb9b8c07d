//! Provider and embedder declarations: a checked `[providers.NAME]` or
//! `[embedders.NAME]` table ([`Decl`]) and the option schema of each kind
//! ([`ProviderKind`]). The kinds themselves live with what they build (`llm::provider`,
//! `embed`); this is the vocabulary the compiler and the run services share.

use super::options::OptionSpec;

/// A provider or embedder kind: its options and what it does.
pub struct ProviderKind {
    pub name: &'static str,
    pub about: &'static str,
    pub options: &'static [OptionSpec],
    /// Checks of the kind's own beyond the option schema (e.g. a model file is GGUF), given
    /// the checked options and the pipeline's root: (option, message) for each problem.
    pub check: Option<KindCheck>,
}

/// A provider kind's own plan-time check.
pub type KindCheck = fn(&serde_json::Map<String, serde_json::Value>, &std::path::Path) -> Vec<(&'static str, String)>;

/// A checked `[providers.NAME]` or `[embedders.NAME]` table.
#[derive(Debug, Clone)]
pub struct Decl {
    pub name: String,
    pub kind: String,
    pub options: serde_json::Value,
}
