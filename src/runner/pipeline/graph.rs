//! The stage graph: edges from `inputs`, topological order and cycle detection.

use std::collections::BTreeSet;

/// Stage indices and their edges.
#[derive(Debug, Clone)]
pub struct Graph {
    /// For each stage, the stages it reads, in declared order.
    pub inputs: Vec<Vec<usize>>,
    /// For each stage, the stages that read it.
    pub consumers: Vec<Vec<usize>>,
    /// Topological order of every stage not on or behind a cycle (ties by declaration order).
    pub order: Vec<usize>,
}

impl Graph {
    pub fn new(inputs: Vec<Vec<usize>>) -> Graph {
        let n = inputs.len();
        let mut consumers = vec![Vec::new(); n];
        for (i, ins) in inputs.iter().enumerate() {
            for &k in ins {
                consumers[k].push(i);
            }
        }
        // Kahn's algorithm, always taking the lowest ready index for a stable order.
        let mut indegree: Vec<usize> = inputs.iter().map(Vec::len).collect();
        let mut ready: BTreeSet<usize> = (0..n).filter(|&i| indegree[i] == 0).collect();
        let mut order = Vec::with_capacity(n);
        while let Some(i) = ready.pop_first() {
            order.push(i);
            for &c in &consumers[i] {
                indegree[c] -= 1;
                if indegree[c] == 0 {
                    ready.insert(c);
                }
            }
        }
        Graph { inputs, consumers, order }
    }

    /// Every elementary cycle found, once per strongly connected component, as a list
    /// of stage indices starting from the lowest index (`a -> b -> ... -> a`).
    pub fn cycles(&self) -> Vec<Vec<usize>> {
        let n = self.inputs.len();
        let in_order: BTreeSet<usize> = self.order.iter().copied().collect();
        let mut done = vec![false; n];
        let mut out = Vec::new();
        for start in 0..n {
            if in_order.contains(&start) || done[start] {
                continue;
            }
            // Follow input edges until a node repeats: that suffix is a cycle.
            if let Some(cycle) = self.find_cycle_from(start, &in_order) {
                let mut cycle = cycle;
                if cycle.iter().any(|&i| done[i]) {
                    continue;
                }
                for &i in &cycle {
                    done[i] = true;
                }
                // Rotate to start at the lowest index, and list in data-flow order.
                cycle.reverse();
                let min_pos = cycle.iter().enumerate().min_by_key(|(_, v)| **v).map(|(p, _)| p).unwrap_or(0);
                cycle.rotate_left(min_pos);
                out.push(cycle);
            }
        }
        out
    }

    fn find_cycle_from(&self, start: usize, acyclic: &BTreeSet<usize>) -> Option<Vec<usize>> {
        let mut path = vec![start];
        let mut on_path = vec![false; self.inputs.len()];
        on_path[start] = true;
        let mut cur = start;
        loop {
            let next = self.inputs[cur].iter().copied().find(|k| !acyclic.contains(k))?;
            if on_path[next] {
                let pos = path.iter().position(|&p| p == next).expect("on path");
                return Some(path[pos..].to_vec());
            }
            on_path[next] = true;
            path.push(next);
            cur = next;
        }
    }

    /// `stage` and everything downstream of it.
    pub fn descendants(&self, stage: usize) -> BTreeSet<usize> {
        reach(stage, &self.consumers)
    }

    /// `stage` and everything upstream of it (what it needs to be built).
    pub fn ancestors(&self, stage: usize) -> BTreeSet<usize> {
        reach(stage, &self.inputs)
    }
}

/// `start` and every node reachable from it along `edges`.
fn reach(start: usize, edges: &[Vec<usize>]) -> BTreeSet<usize> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![start];
    while let Some(i) = stack.pop() {
        if seen.insert(i) {
            stack.extend(edges[i].iter().copied());
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_and_cycles() {
        // 0 -> 1 -> 2, 3 <-> 4, 5 reads 4
        let g = Graph::new(vec![vec![], vec![0], vec![1], vec![4], vec![3], vec![4]]);
        assert_eq!(g.order, vec![0, 1, 2]);
        assert_eq!(g.ancestors(2), BTreeSet::from([0, 1, 2]));
        assert_eq!(g.descendants(0), BTreeSet::from([0, 1, 2]));
        let cycles = g.cycles();
        assert_eq!(cycles.len(), 1);
        assert_eq!(cycles[0], vec![3, 4]);
        assert_eq!(g.descendants(1), [1, 2].into_iter().collect());
        // self loop
        let g = Graph::new(vec![vec![0]]);
        assert_eq!(g.cycles(), vec![vec![0]]);
    }

    #[test]
    fn cycle_listed_in_data_flow_order() {
        // a(0) reads c(2), b(1) reads a, c reads b: a -> b -> c -> a
        let g = Graph::new(vec![vec![2], vec![0], vec![1]]);
        assert_eq!(g.cycles(), vec![vec![0, 1, 2]]);
    }
}
