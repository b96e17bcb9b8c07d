//! The built-in registry: the engine's kinds ([`synth_kinds::KINDS`]), parsers
//! ([`synth_llm::parse::GENERIC`]) and offline shapes ([`synth_llm::offline::SHAPES`]),
//! followed by every method's ([`crate::methods::METHODS`]); the provider kinds
//! ([`synth_providers::PROVIDERS`], then `offline`). The compiler and `synth list`
//! read it (the `Registry` type is `synth_engine::registry`'s); this crate is the only
//! one that knows every method.

use std::sync::LazyLock;

pub use synth_engine::registry::{Method, Registry};

use synth_engine::stages::KindInfo;
use synth_llm::offline::OfflineShape;
use synth_llm::parse::ParserKind;
use synth_llm::provider::ProviderDesc;

use crate::methods::METHODS;

static BUILTIN: LazyLock<Registry> = LazyLock::new(|| {
    let methods: Vec<&'static Method> = METHODS.to_vec();
    let mut kinds: Vec<&'static KindInfo> = synth_kinds::KINDS.to_vec();
    let mut parsers: Vec<&'static ParserKind> = synth_llm::parse::GENERIC.to_vec();
    let mut shapes: Vec<&'static OfflineShape> = synth_llm::offline::SHAPES.to_vec();
    for m in &methods {
        kinds.extend(m.kinds.iter().copied());
        parsers.extend(m.parsers.iter().copied());
        shapes.extend(m.shapes.iter().copied());
    }
    let mut providers: Vec<&'static ProviderDesc> = synth_providers::PROVIDERS.to_vec();
    providers.push(&synth_llm::offline::PROVIDER);
    Registry { kinds, parsers, shapes: shapes.into(), methods, providers: providers.into() }
});

/// The engine and every method.
pub fn builtin() -> &'static Registry {
    &BUILTIN
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_every_parser_has_a_shape() {
        let r = builtin();
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
