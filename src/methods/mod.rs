//! Benchmark methods, one folder each: a method's stage kinds, parsers, offline
//! stand-in shapes, planners and output layouts live in `methods/<name>/`; its
//! prompts, seed scripts and rules are data under `pipelines/prompts/<name>/`,
//! `seeds/<name>/` and `rules/<name>/`. The engine (everything outside this folder)
//! never names a method: it finds a method's kinds, parsers and shapes through
//! [`crate::registry::Registry`], which reads [`METHODS`].
//!
//! Adding a method is its folder plus one line in the `methods!` list below
//! (ARCHITECTURE.md, "Adding a method").

use crate::llm::offline::OfflineShape;
use crate::llm::parse::ParserKind;
use crate::stages::KindInfo;

/// Declares each method's module and lists it in `METHODS`.
macro_rules! methods {
    ($($name:ident),* $(,)?) => {
        $(pub mod $name;)*

        /// Every method, in `synth list` order.
        pub static METHODS: &[&Method] = &[$(&$name::METHOD),*];
    };
}

// One line per method: its folder's name.
methods! {
    rolemrc,
    roleeval,
    sharp,
    characterbench,
}

/// What a method contributes to the engine.
pub struct Method {
    /// Folder name here and under `pipelines/prompts/`, `seeds/`, `rules/`; the prefix
    /// of its kind names (`<name>_<file stem>`).
    pub name: &'static str,
    pub about: &'static str,
    /// Its stage kinds, in `synth list` order.
    pub kinds: &'static [&'static KindInfo],
    /// Parsers its `llm` stages name (`parser = "..."`).
    pub parsers: &'static [&'static ParserKind],
    /// What the offline provider answers for each of its parsers' shapes.
    pub shapes: &'static [&'static OfflineShape],
}

impl std::fmt::Debug for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Method({})", self.name)
    }
}
