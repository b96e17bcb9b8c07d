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
}

/// A checked `[providers.NAME]` or `[embedders.NAME]` table.
#[derive(Debug, Clone)]
pub struct Decl {
    pub name: String,
    pub kind: String,
    pub options: serde_json::Value,
}
