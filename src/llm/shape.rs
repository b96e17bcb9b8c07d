//! An answer shape the offline provider can imitate ([`OfflineShape`]): what the engine's
//! and each method's parsers expect, registered beside them; below the provider API
//! (`provider.rs`, whose build context carries the registry's shapes) and the `offline`
//! kind (`offline.rs`, which re-exports them).

use rand_chacha::ChaCha8Rng;

/// What a shape generator sees.
pub struct ShapeInput<'a> {
    /// Every message's content, joined by newlines.
    pub prompt: &'a str,
    /// What follows `name:` in the expected shape (`a,b` of `json:a,b`), else empty.
    pub args: &'a str,
    /// The provider's probability that a judge answers 1 (`score_one`).
    pub score_one: f64,
}

/// An answer shape the offline provider can imitate: the name a parser's
/// [`super::parse::Parser::expect`] returns (before any `:`), and its generator.
pub struct OfflineShape {
    pub name: &'static str,
    pub generate: fn(&ShapeInput<'_>, &mut ChaCha8Rng) -> String,
}

impl std::fmt::Debug for OfflineShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OfflineShape({})", self.name)
    }
}
