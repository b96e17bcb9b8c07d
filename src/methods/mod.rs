//! Benchmark methods, one crate each: a method's stage kinds, parsers, offline
//! stand-in shapes, planners and output layouts live in `src/methods/<name>/` (the crate
//! `synth-<name>`); its prompts, seed scripts and rules are data under
//! `pipelines/prompts/<name>/`, `seeds/<name>/` and `rules/<name>/`. The engine's crates
//! never name a method: the compiler finds a method's kinds, parsers and shapes through
//! the registry [`crate::registry::builtin`] builds from [`METHODS`].
//!
//! Adding a method is its crate plus one line in the `methods!` list below and one
//! dependency line in the root Cargo.toml (ARCHITECTURE.md, "Adding a method").

pub use synth_engine::registry::Method;

/// Re-exports each method's crate under its folder's name and lists it in `METHODS`.
macro_rules! methods {
    ($($name:ident = $krate:ident),* $(,)?) => {
        $(pub use $krate as $name;)*

        /// Every method, in `synth list` order.
        pub static METHODS: &[&Method] = &[$(&$name::METHOD),*];
    };
}

// One line per method: its folder's name and its crate.
methods! {
    rolemrc = synth_rolemrc,
    roleeval = synth_roleeval,
    sharp = synth_sharp,
    characterbench = synth_characterbench,
}
