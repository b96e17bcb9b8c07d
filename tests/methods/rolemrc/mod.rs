//! RoleMRC: the offline synthesis end to end, its parsers against fixtures, the judge.

mod e2e;
mod judge;
mod parsers;
mod shard;
