//! Content hashes of input files for fingerprints (BLAKE3), memoised by
//! (path, size, mtime) in `_synth/filehash.json` so an up-to-date re-run does not
//! re-read gigabytes of source data.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::atomic::write_atomic;
use super::state::INTERNAL_DIR;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Entry {
    len: u64,
    mtime_ns: u128,
    hash: String,
}

/// A memo of file hashes; load it, hash through it, save it.
#[derive(Debug, Default)]
pub struct FileHasher {
    path: Option<PathBuf>,
    entries: BTreeMap<String, Entry>,
    dirty: bool,
}

impl FileHasher {
    /// Load the memo of an output directory (missing or unreadable memo = empty).
    pub fn load(out_dir: &Path) -> FileHasher {
        let path = out_dir.join(INTERNAL_DIR).join("filehash.json");
        let entries = std::fs::read(&path).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
        FileHasher { path: Some(path), entries, dirty: false }
    }

    /// BLAKE3 hex digest of a file's content.
    pub fn hash(&mut self, file: &Path) -> Result<String> {
        let meta = std::fs::metadata(file).with_context(|| format!("reading {}", file.display()))?;
        let mtime_ns =
            meta.modified().ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map(|d| d.as_nanos()).unwrap_or(0);
        let key = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_path_buf()).to_string_lossy().to_string();
        if let Some(e) = self.entries.get(&key)
            && e.len == meta.len()
            && e.mtime_ns == mtime_ns
        {
            return Ok(e.hash.clone());
        }
        let hash = hash_file(file)?;
        self.entries.insert(key, Entry { len: meta.len(), mtime_ns, hash: hash.clone() });
        self.dirty = true;
        Ok(hash)
    }

    pub fn save(&mut self) -> Result<()> {
        if let (true, Some(path)) = (self.dirty, &self.path) {
            write_atomic(path, &serde_json::to_vec(&self.entries)?)?;
            self.dirty = false;
        }
        Ok(())
    }
}

/// BLAKE3 of a whole file, streamed.
pub fn hash_file(file: &Path) -> Result<String> {
    let mut f = std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).with_context(|| format!("reading {}", file.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().to_hex().to_string())
}
