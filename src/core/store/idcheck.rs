//! Duplicate record-id detection in bounded memory: 64-bit hashes of ids collect
//! in a buffer that is sorted and spilled to a temporary run file when full; at the
//! end the runs are merged and any hash seen twice is reported. Memory stays below
//! `limit * 8` bytes whatever the number of records.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Hashes kept in memory before spilling (8 MiB).
const DEFAULT_LIMIT: usize = 1 << 20;

pub struct IdCheck {
    buf: Vec<u64>,
    runs: Vec<PathBuf>,
    dir: PathBuf,
    limit: usize,
}

/// The fixed hash used for ids (stable across runs, no random state).
pub fn id_hash(id: &str) -> u64 {
    let mut h = std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().build_hasher();
    h.write(id.as_bytes());
    h.finish()
}

impl IdCheck {
    /// Spill files go to `dir` (created on first spill).
    pub fn new(dir: &Path) -> IdCheck {
        IdCheck::with_limit(dir, DEFAULT_LIMIT)
    }

    pub fn with_limit(dir: &Path, limit: usize) -> IdCheck {
        IdCheck { buf: Vec::new(), runs: Vec::new(), dir: dir.to_path_buf(), limit: limit.max(1) }
    }

    pub fn push(&mut self, id: &str) -> Result<()> {
        self.buf.push(id_hash(id));
        if self.buf.len() >= self.limit {
            self.spill()?;
        }
        Ok(())
    }

    fn spill(&mut self) -> Result<()> {
        self.buf.sort_unstable();
        std::fs::create_dir_all(&self.dir).with_context(|| format!("creating {}", self.dir.display()))?;
        let path = super::atomic::tmp_path(&self.dir.join(format!("ids-{}.run", self.runs.len())));
        let mut w = BufWriter::new(File::create(&path).with_context(|| format!("creating {}", path.display()))?);
        for h in &self.buf {
            w.write_all(&h.to_le_bytes()).with_context(|| format!("writing {}", path.display()))?;
        }
        w.flush().with_context(|| format!("writing {}", path.display()))?;
        self.runs.push(path);
        self.buf.clear();
        Ok(())
    }

    /// A hash that occurred more than once, if any.
    pub fn finish(mut self) -> Result<Option<u64>> {
        self.buf.sort_unstable();
        if self.runs.is_empty() {
            return Ok(self.buf.windows(2).find(|w| w[0] == w[1]).map(|w| w[0]));
        }
        let mut readers: Vec<BufReader<File>> = Vec::new();
        for run in &self.runs {
            readers.push(BufReader::new(File::open(run).with_context(|| format!("opening {}", run.display()))?));
        }
        let next = |r: &mut BufReader<File>| -> Option<u64> {
            let mut b = [0u8; 8];
            r.read_exact(&mut b).ok().map(|_| u64::from_le_bytes(b))
        };
        let mut heap = BinaryHeap::new();
        for (i, r) in readers.iter_mut().enumerate() {
            if let Some(h) = next(r) {
                heap.push(Reverse((h, i)));
            }
        }
        let mem = self.buf.len();
        let mut mem_idx = 0;
        if mem > 0 {
            heap.push(Reverse((self.buf[0], usize::MAX)));
        }
        let mut last: Option<u64> = None;
        let mut found = None;
        while let Some(Reverse((h, src))) = heap.pop() {
            if last == Some(h) {
                found = Some(h);
                break;
            }
            last = Some(h);
            let following = if src == usize::MAX {
                mem_idx += 1;
                (mem_idx < mem).then(|| self.buf[mem_idx])
            } else {
                next(&mut readers[src])
            };
            if let Some(n) = following {
                heap.push(Reverse((n, src)));
            }
        }
        Ok(found)
    }
}

impl Drop for IdCheck {
    fn drop(&mut self) {
        for run in &self.runs {
            let _ = std::fs::remove_file(run);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_duplicates_in_memory_and_across_spills() {
        let dir = tempfile::tempdir().unwrap();
        for limit in [1_000_000, 7] {
            let mut c = IdCheck::with_limit(dir.path(), limit);
            for i in 0..100 {
                c.push(&format!("id-{i}")).unwrap();
            }
            assert_eq!(c.finish().unwrap(), None);
            let mut c = IdCheck::with_limit(dir.path(), limit);
            for i in 0..100 {
                c.push(&format!("id-{i}")).unwrap();
            }
            c.push("id-42").unwrap();
            assert_eq!(c.finish().unwrap(), Some(id_hash("id-42")));
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "spill files removed");
    }
}
