//! synth's compile-and-run layer (L5): [`pipeline`] (a TOML file into a checked
//! pipeline, against a registry it is given), [`dag`] (the graph's waves, fingerprints,
//! the runner, shards and the run's status) and [`regen`] (locks, scheduled
//! regeneration, snapshots, Hub releases). Nothing here names a method or a kind.

pub mod dag;
pub mod pipeline;
pub mod regen;
