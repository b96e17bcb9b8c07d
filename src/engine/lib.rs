//! synth's stage API and run services (layers L2-L3): the one [`stages::Stage`] trait
//! and the contexts a stage sees, the execution loops, the run services every stage
//! shares ([`services`]: providers, embedders, the cache, the cached call path) and the
//! [`registry::Registry`] type the compiler checks a pipeline against. The engine's
//! kinds are the `synth-kinds` crate, each method a crate under `src/methods/`; the
//! `synth` crate assembles the built-in registry from them.

pub mod registry;
pub mod services;
pub mod stages;
