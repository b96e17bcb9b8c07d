//! The wave plan of a sharded run (pure, no I/O): which stages run as N shards and
//! which run once. A record-parallel stage ([`Partitioning::ByRecord`]) joins the wave
//! of its first input when that input is sharded in the same wave (the shard keeps its
//! records); any other input must be complete, i.e. merged or global, so the stage
//! goes to the next wave. A stage that needs its inputs whole runs once, in the
//! coordinator step that follows the merge of the waves it depends on. Step `k`
//! (0..=waves) merges wave `k` (step 0 has none) and runs the global stages placed
//! there; wave `k` runs after step `k - 1`:
//!
//! ```text
//! step 0 ─▶ wave 1 (N shards) ─▶ step 1 (merge wave 1, globals) ─▶ wave 2 ─▶ step 2 ─▶ ...
//! ```
//!
//! A wave whose stages are all cheap (filters, maps: [`Sharding::heavy`] false) is not
//! worth a round of shards, uploads and a merge: its stages run once instead, and the
//! plan is recomputed until every wave holds at least one heavy stage.

use std::collections::BTreeMap;

use crate::pipeline::Graph;
pub use synth_engine::stages::{Partitioning, Sharding};

/// Where one stage runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Once, in coordinator step `k` (after wave `k` is merged).
    Step(usize),
    /// As shards, in wave `k >= 1`.
    Wave(usize),
}

/// The plan: a placement per stage (indexed like the graph).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waves {
    pub placement: Vec<Placement>,
    /// Number of waves (steps are `0..=n_waves`).
    pub n_waves: usize,
}

impl Waves {
    /// Place every stage. `parts[i]` is stage `i`'s partitioning.
    pub fn plan(graph: &Graph, parts: &[Partitioning]) -> Waves {
        let mut parts = parts.to_vec();
        loop {
            let placement = place(graph, &parts);
            // Waves without a heavy stage are dissolved: their stages run once.
            let mut heavy: BTreeMap<usize, bool> = BTreeMap::new();
            for (i, p) in placement.iter().enumerate() {
                match (p, parts[i]) {
                    (Placement::Wave(w), Partitioning::ByRecord(s)) => *heavy.entry(*w).or_default() |= s.heavy,
                    (Placement::Wave(w), Partitioning::SplitInput { .. } | Partitioning::OwnParts) => {
                        *heavy.entry(*w).or_default() = true
                    }
                    _ => {}
                }
            }
            let light: Vec<usize> = heavy.iter().filter(|(_, h)| !**h).map(|(w, _)| *w).collect();
            if light.is_empty() {
                let n_waves = heavy.len();
                return Waves { placement: renumber(placement), n_waves };
            }
            // Dissolve the first light wave only: later ones may gain a heavy stage once
            // the earlier one moves.
            let w = light[0];
            for (i, p) in placement.iter().enumerate() {
                if *p == Placement::Wave(w) {
                    parts[i] = Partitioning::Whole;
                }
            }
        }
    }

    /// The stages of wave `k`, in the graph's order.
    pub fn wave(&self, graph: &Graph, k: usize) -> Vec<usize> {
        graph.order.iter().copied().filter(|&i| self.placement[i] == Placement::Wave(k)).collect()
    }

    /// The global stages of step `k`, in the graph's order.
    pub fn step(&self, graph: &Graph, k: usize) -> Vec<usize> {
        graph.order.iter().copied().filter(|&i| self.placement[i] == Placement::Step(k)).collect()
    }

    pub fn is_sharded(&self, i: usize) -> bool {
        matches!(self.placement[i], Placement::Wave(_))
    }
}

fn place(graph: &Graph, parts: &[Partitioning]) -> Vec<Placement> {
    let n = parts.len();
    // Wave of a sharded stage / step of a global one; both counted so that the output
    // of step s or wave s is complete before wave s + 1 and step s.
    let mut at = vec![0usize; n];
    // In a wave; and whose shards hold its output records (a later stage of the same
    // wave can go on with them), unlike a split-input stage (complete after the merge).
    let mut in_wave = vec![false; n];
    let mut by_record = vec![false; n];
    for &i in &graph.order {
        let ins = &graph.inputs[i];
        match parts[i] {
            Partitioning::Whole => {
                at[i] = ins.iter().map(|&j| at[j]).max().unwrap_or(0);
            }
            Partitioning::ByRecord(s) => {
                in_wave[i] = true;
                by_record[i] = true;
                let mut w = 1;
                for (pos, &j) in ins.iter().enumerate() {
                    let same_wave = pos == 0 && by_record[j] && !s.fits_whole_input;
                    w = w.max(if same_wave { at[j] } else { at[j] + 1 });
                }
                at[i] = w;
            }
            Partitioning::SplitInput { .. } | Partitioning::OwnParts => {
                in_wave[i] = true;
                at[i] = ins.iter().map(|&j| at[j] + 1).max().unwrap_or(1);
            }
        }
    }
    (0..n).map(|i| if in_wave[i] { Placement::Wave(at[i]) } else { Placement::Step(at[i]) }).collect()
}

/// Waves and steps numbered densely (dissolving may leave gaps).
fn renumber(placement: Vec<Placement>) -> Vec<Placement> {
    let mut used: Vec<usize> = placement
        .iter()
        .filter_map(|p| match p {
            Placement::Wave(w) => Some(*w),
            Placement::Step(_) => None,
        })
        .collect();
    used.sort_unstable();
    used.dedup();
    // New number of wave w: its rank (1-based); a step s keeps its place after the
    // waves at or before it.
    let wave_of = |w: usize| used.iter().position(|&u| u == w).expect("used") + 1;
    let step_of = |s: usize| used.iter().filter(|&&u| u <= s).count();
    placement
        .into_iter()
        .map(|p| match p {
            Placement::Wave(w) => Placement::Wave(wave_of(w)),
            Placement::Step(s) => Placement::Step(step_of(s)),
        })
        .collect()
}

/// Which shard a record belongs to: the first 8 bytes of BLAKE3 of its id, modulo the
/// shard count (NeMo Curator's scheme with BLAKE3). Stable across runs, machines and
/// input order.
pub fn shard_of(id: &str, shards: usize) -> usize {
    let h = blake3::hash(id.as_bytes());
    (u64::from_le_bytes(h.as_bytes()[..8].try_into().expect("8 bytes")) % shards.max(1) as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Partitioning = Partitioning::Whole;
    const H: Partitioning = Partitioning::ByRecord(Sharding { heavy: true, fits_whole_input: false });
    const L: Partitioning = Partitioning::ByRecord(Sharding { heavy: false, fits_whole_input: false });
    const FIT: Partitioning = Partitioning::ByRecord(Sharding { heavy: true, fits_whole_input: true });

    fn plan(inputs: Vec<Vec<usize>>, parts: &[Partitioning]) -> Vec<Placement> {
        Waves::plan(&Graph::new(inputs), parts).placement
    }

    #[test]
    fn chains_share_a_wave_and_globals_follow_the_merge() {
        use Placement::*;
        // 0 source, 1 llm(0), 2 map(1), 3 llm(2), 4 sample(3), 5 llm(4), 6 sink(5)
        let p = plan(vec![vec![], vec![0], vec![1], vec![2], vec![3], vec![4], vec![5]], &[W, H, L, H, W, H, W]);
        assert_eq!(p, vec![Step(0), Wave(1), Wave(1), Wave(1), Step(1), Wave(2), Step(2)]);
    }

    #[test]
    fn a_second_input_must_be_merged_first() {
        use Placement::*;
        // 0, 1 sources; 2 llm(0); 3 llm(1); 4 = llm(2 first, 3 second): 3 is read whole.
        let p = plan(vec![vec![], vec![], vec![0], vec![1], vec![2, 3]], &[W, W, H, H, H]);
        assert_eq!(p, vec![Step(0), Step(0), Wave(1), Wave(1), Wave(2)]);
    }

    #[test]
    fn fitting_needs_the_merged_input_and_light_waves_dissolve() {
        use Placement::*;
        // 0 source, 1 map(0) light, 2 embed(1) fits its input, 3 filter(2) light, 4 sink(3)
        let p = plan(vec![vec![], vec![0], vec![1], vec![2], vec![3]], &[W, L, FIT, L, W]);
        // The map alone would be a wave of its own: it runs once; the embed shards; the
        // filter chains with it.
        assert_eq!(p, vec![Step(0), Step(0), Wave(1), Wave(1), Step(1)]);
        // Nothing heavy at all: no waves.
        let w = Waves::plan(&Graph::new(vec![vec![], vec![0], vec![1]]), &[W, L, L]);
        assert_eq!(w.n_waves, 0);
        assert_eq!(w.placement, vec![Step(0), Step(0), Step(0)]);
    }

    #[test]
    fn light_stages_after_a_global_one_run_once() {
        use Placement::*;
        // 0 source, 1 llm, 2 assemble(1), 3 filter(2), 4 filter(2), 5 sink(3)
        let p = plan(vec![vec![], vec![0], vec![1], vec![2], vec![2], vec![3]], &[W, H, W, L, L, W]);
        assert_eq!(p, vec![Step(0), Wave(1), Step(1), Step(1), Step(1), Step(1)]);
    }

    #[test]
    fn a_split_input_stage_waits_for_its_inputs_and_ends_its_wave_at_the_merge() {
        use Placement::*;
        const SPLIT: Partitioning = Partitioning::SplitInput { split: 1 };
        // 0 queries, 1 corpus, 2 embed(0), 3 embed(1), 4 retrieve(2, 3), 5 llm(4),
        // 6 filter(4), 7 sink(5)
        let g = vec![vec![], vec![], vec![0], vec![1], vec![2, 3], vec![4], vec![4], vec![5]];
        let p = plan(g, &[W, W, H, H, SPLIT, H, L, W]);
        // Both embeddings must be merged before the retrieval shards read them; what
        // follows the retrieval reads its merged output, in the next wave.
        assert_eq!(p, vec![Step(0), Step(0), Wave(1), Wave(1), Wave(2), Wave(3), Wave(3), Step(3)]);
        // Straight after sources: the first wave.
        let p = plan(vec![vec![], vec![], vec![0, 1]], &[W, W, SPLIT]);
        assert_eq!(p, vec![Step(0), Step(0), Wave(1)]);
    }

    #[test]
    fn shards_are_stable_and_spread() {
        assert_eq!(shard_of("abc", 7), shard_of("abc", 7));
        assert_eq!(shard_of("abc", 1), 0);
        let mut counts = [0usize; 5];
        for i in 0..10_000 {
            counts[shard_of(&format!("record-{i}"), 5)] += 1;
        }
        assert!(counts.iter().all(|&c| (1800..2200).contains(&c)), "{counts:?}");
    }
}
