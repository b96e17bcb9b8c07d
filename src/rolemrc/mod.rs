//! The RoleMRC method (Lu et al., 2025): the parsers that read and check what its
//! prompts produce, and the planner that decides which profile, triplet, seed script
//! and rule each sample uses. Prompts, seed scripts and rules are data files under
//! `pipelines/`, `seeds/` and `rules/`.

pub mod parsers;
pub mod plan;
