//! The RoleMRC method (Lu et al., 2025): its answer formats. Prompts, seed scripts
//! and rules are data files under `pipelines/`, `seeds/` and `rules/`; this module
//! holds only the code that reads and checks what those prompts produce.

pub mod parsers;
pub mod plan;
