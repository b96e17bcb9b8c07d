//! The registry type: every stage kind, parser, offline shape and provider kind a
//! pipeline may name, and the methods they come from. The compiler checks a pipeline against one and the
//! checked pipeline carries it; the runner hands its offline shapes to the run services.
//! This crate only defines it: the `synth` crate assembles the built-in one (the engine's
//! kinds, parsers and shapes, then every method's), so nothing below it knows which
//! methods exist.

use std::sync::Arc;

use synth_llm::offline::OfflineShape;
use synth_llm::parse::ParserKind;
use synth_llm::provider::ProviderDesc;

use crate::stages::KindInfo;

/// Kinds, parsers and shapes by name, in `synth list` order.
#[derive(Debug, Clone)]
pub struct Registry {
    /// The engine's kinds first, then each method's in the built-in method list order, then any extra
    /// kinds (tests, embedders of the library).
    pub kinds: Vec<&'static KindInfo>,
    pub parsers: Vec<&'static ParserKind>,
    pub shapes: Arc<[&'static OfflineShape]>,
    pub methods: Vec<&'static Method>,
    /// The provider kinds (`[providers.NAME]`'s `kind`), in `synth list` order.
    pub providers: Arc<[&'static ProviderDesc]>,
}

impl Registry {
    /// This registry with more stage kinds (after the others).
    pub fn with_kinds(&self, extra: &[&'static KindInfo]) -> Registry {
        let mut r = self.clone();
        r.kinds.extend(extra.iter().copied());
        r
    }

    pub fn kind(&self, name: &str) -> Option<&'static KindInfo> {
        self.kinds.iter().copied().find(|k| k.name == name)
    }

    /// The provider kind called `name`.
    pub fn provider(&self, name: &str) -> Option<&'static ProviderDesc> {
        synth_llm::provider::find_kind(&self.providers, name)
    }

    /// What a run's services build providers from: the provider kinds and the offline shapes.
    pub fn catalog(&self) -> crate::services::Catalog {
        crate::services::Catalog { kinds: self.providers.clone(), shapes: self.shapes.clone() }
    }

    pub fn parser(&self, name: &str) -> Option<&'static ParserKind> {
        self.parsers.iter().copied().find(|k| k.name == name)
    }

    /// Build the parser called `name` from its options (as given, no defaults filled).
    pub fn build_parser(
        &self,
        name: &str,
        options: &serde_json::Value,
    ) -> Result<Box<dyn synth_llm::parse::Parser>, String> {
        let k = self.parser(name).ok_or_else(|| format!("unknown parser \"{name}\""))?;
        (k.build)(options)
    }

    /// The method a kind belongs to (`None`: an engine kind, or an extra one).
    pub fn method_of(&self, kind: &str) -> Option<&'static Method> {
        self.methods.iter().copied().find(|m| m.kinds.iter().any(|k| k.name == kind))
    }

    /// Names registered twice (kinds, parsers, shapes, methods): must be empty.
    pub fn duplicates(&self) -> Vec<String> {
        fn dups<'a>(what: &str, names: impl Iterator<Item = &'a str>, out: &mut Vec<String>) {
            let mut seen = std::collections::BTreeSet::new();
            for n in names {
                if !seen.insert(n) {
                    out.push(format!("{what} \"{n}\""));
                }
            }
        }
        let mut out = Vec::new();
        dups("stage kind", self.kinds.iter().map(|k| k.name), &mut out);
        dups("parser", self.parsers.iter().map(|k| k.name), &mut out);
        dups("offline shape", self.shapes.iter().map(|k| k.name), &mut out);
        dups("method", self.methods.iter().map(|k| k.name), &mut out);
        dups("provider kind", self.providers.iter().map(|k| k.name()), &mut out);
        out
    }
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
