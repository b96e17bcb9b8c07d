//! RoleMRC: the offline synthesis end to end, its parsers against fixtures, degenerate
//! preference pairs, the judge, the RoleBench cross-evaluation.

mod e2e;
mod judge;
mod pairs;
mod parsers;
mod rolebench;
