//! RoleMRC: the offline synthesis end to end, its parsers against fixtures, degenerate
//! preference pairs, the judge.

mod e2e;
mod judge;
mod pairs;
mod parsers;
