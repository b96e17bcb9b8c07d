//! The registry: every stage kind, parser and offline shape a pipeline may name —
//! the engine's ([`crate::stages::kinds::KINDS`], [`crate::llm::parse::GENERIC`],
//! [`crate::llm::offline::SHAPES`]) followed by every method's
//! ([`crate::methods::METHODS`]). The compiler and `synth list` read it; the checked
//! pipeline carries it, and the runner hands its offline shapes to the run services.
//! Nothing below this layer knows which methods exist.

use std::sync::{Arc, LazyLock};

use crate::llm::offline::OfflineShape;
use crate::llm::parse::ParserKind;
use crate::methods::{METHODS, Method};
use crate::stages::KindInfo;

/// Kinds, parsers and shapes by name, in `synth list` order.
#[derive(Debug, Clone)]
pub struct Registry {
    /// The engine's kinds first, then each method's in [`METHODS`] order, then any extra
    /// kinds (tests, embedders of the library).
    pub kinds: Vec<&'static KindInfo>,
    pub parsers: Vec<&'static ParserKind>,
    pub shapes: Arc<[&'static OfflineShape]>,
    pub methods: Vec<&'static Method>,
}

static BUILTIN: LazyLock<Registry> = LazyLock::new(|| {
    let methods: Vec<&'static Method> = METHODS.to_vec();
    let mut kinds: Vec<&'static KindInfo> = crate::stages::kinds::KINDS.to_vec();
    let mut parsers: Vec<&'static ParserKind> = crate::llm::parse::GENERIC.to_vec();
    let mut shapes: Vec<&'static OfflineShape> = crate::llm::offline::SHAPES.to_vec();
    for m in &methods {
        kinds.extend(m.kinds.iter().copied());
        parsers.extend(m.parsers.iter().copied());
        shapes.extend(m.shapes.iter().copied());
    }
    Registry { kinds, parsers, shapes: shapes.into(), methods }
});

impl Registry {
    /// The engine and every method.
    pub fn builtin() -> &'static Registry {
        &BUILTIN
    }

    /// This registry with more stage kinds (after the others).
    pub fn with_kinds(&self, extra: &[&'static KindInfo]) -> Registry {
        let mut r = self.clone();
        r.kinds.extend(extra.iter().copied());
        r
    }

    pub fn kind(&self, name: &str) -> Option<&'static KindInfo> {
        self.kinds.iter().copied().find(|k| k.name == name)
    }

    pub fn parser(&self, name: &str) -> Option<&'static ParserKind> {
        self.parsers.iter().copied().find(|k| k.name == name)
    }

    /// Build the parser called `name` from its options (as given, no defaults filled).
    pub fn build_parser(
        &self,
        name: &str,
        options: &serde_json::Value,
    ) -> Result<Box<dyn crate::llm::parse::Parser>, String> {
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
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_every_parser_has_a_shape() {
        let r = Registry::builtin();
        assert_eq!(r.duplicates(), Vec::<String>::new());
        // A parser whose shape the offline provider does not know would get a paragraph offline.
        for p in &r.parsers {
            // The simplest options each parser accepts (`json` needs its fields).
            let given =
                if p.name == "json" { serde_json::json!({"fields": {"a": "utf8"}}) } else { serde_json::Value::Null };
            let opts = crate::llm::parse::with_defaults(p.options, &given);
            let shape = (p.build)(&opts).unwrap_or_else(|e| panic!("parser {}: {e}", p.name)).expect();
            let name = shape.split(':').next().unwrap_or("");
            assert!(
                name == "text" || r.shapes.iter().any(|s| s.name == name),
                "parser \"{}\" expects shape \"{name}\", which no offline shape provides",
                p.name
            );
        }
    }
}
