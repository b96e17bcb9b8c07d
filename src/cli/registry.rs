//! The registry the command line checks pipelines against: handed to [`crate::main`] by the
//! `synth` binary (the built-in one), kept for every command.

static REGISTRY: std::sync::OnceLock<&'static synth_engine::registry::Registry> = std::sync::OnceLock::new();

/// Keep the registry `main` was given (the first one wins).
pub fn set_registry(registry: &'static synth_engine::registry::Registry) {
    REGISTRY.get_or_init(|| registry);
}

/// The registry `main` was given: the kinds, parsers and shapes pipelines are checked
/// against.
pub fn registry() -> &'static synth_engine::registry::Registry {
    REGISTRY.get().copied().expect("synth_cli::main is given the registry before any command runs")
}
