//! Crash-safe file creation: write to a hidden temporary file in the destination
//! directory, fsync, then rename over the destination and fsync the directory.
//! A file at its final name is therefore always complete.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Prefix of temporary files; anything matching is debris from an interrupted run.
pub const TMP_MARK: &str = ".synth-tmp-";

/// When `e` is a full disk (ENOSPC, or a quota), say so in words a user can act on:
/// which file was being written (by its final name, not the temporary one) and what to do.
/// `None` for any other error.
pub fn explain_disk_full(e: &anyhow::Error) -> Option<String> {
    let full = e.chain().any(|c| {
        c.downcast_ref::<io::Error>()
            .is_some_and(|io| matches!(io.kind(), io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded))
    }) || format!("{e:#}").contains("No space left on device");
    if !full {
        return None;
    }
    // The file: the first path in the message, shown under its final name.
    let text = format!("{e:#}");
    let file = text
        .split([' ', ':', '\''])
        .find(|w| w.contains(TMP_MARK) || w.ends_with(".parquet") || w.ends_with(".json") || w.ends_with(".jsonl"))
        .map(final_name);
    Some(match file {
        Some(f) => format!("the disk is full: no space left while writing {f}"),
        None => "the disk is full: no space left on the device".to_string(),
    })
}

/// `dir/.synth-tmp-<pid>-<nonce>-name` → `dir/name`.
fn final_name(path: &str) -> String {
    let Some(at) = path.find(TMP_MARK) else { return path.to_string() };
    let rest = &path[at + TMP_MARK.len()..];
    // <pid>-<nonce>-<name>
    let name = rest.splitn(3, '-').nth(2).unwrap_or(rest);
    format!("{}{name}", &path[..at])
}

/// A finished temporary file waiting to be renamed to its destination.
/// Dropping it without `commit` removes the temporary file.
#[derive(Debug)]
pub struct PendingFile {
    pub tmp: PathBuf,
    pub dest: PathBuf,
    committed: bool,
}

impl PendingFile {
    /// Rename into place and make the rename durable.
    pub fn commit(mut self) -> Result<PathBuf> {
        std::fs::rename(&self.tmp, &self.dest)
            .with_context(|| format!("renaming {} to {}", self.tmp.display(), self.dest.display()))?;
        self.committed = true;
        sync_dir(&self.dest);
        Ok(self.dest.clone())
    }

    /// Size in bytes of the finished temporary file.
    pub fn bytes(&self) -> u64 {
        std::fs::metadata(&self.tmp).map(|m| m.len()).unwrap_or(0)
    }
}

impl Drop for PendingFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Temporary path next to `dest`.
pub fn tmp_path(dest: &Path) -> PathBuf {
    let name = dest.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
    let nonce: u32 = rand::random();
    dest.with_file_name(format!("{TMP_MARK}{}-{nonce:08x}-{name}", std::process::id()))
}

/// Open a new temporary file for `dest` (creating the directory).
pub fn create_tmp(dest: &Path) -> Result<(File, PendingFile)> {
    if let Some(dir) = dest.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating directory {}", dir.display()))?;
    }
    let tmp = tmp_path(dest);
    let file = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    Ok((file, PendingFile { tmp, dest: dest.to_path_buf(), committed: false }))
}

/// Flush and fsync a finished temporary file.
pub fn finish_file(file: File, pending: &PendingFile) -> Result<()> {
    file.sync_all().with_context(|| format!("syncing {}", pending.tmp.display()))
}

/// Write a whole file atomically.
pub fn write_atomic(dest: &Path, bytes: &[u8]) -> Result<()> {
    let (mut file, pending) = create_tmp(dest)?;
    file.write_all(bytes).with_context(|| format!("writing {}", pending.tmp.display()))?;
    finish_file(file, &pending)?;
    pending.commit()?;
    Ok(())
}

fn sync_dir(path: &Path) {
    if let Some(dir) = path.parent()
        && let Ok(d) = File::open(dir)
    {
        let _ = d.sync_all();
    }
}

/// Remove temporary files left by interrupted runs in `dir` (not recursive).
pub fn clean_debris(dir: &Path) -> io::Result<usize> {
    let mut n = 0;
    let Ok(read) = std::fs::read_dir(dir) else {
        return Ok(0);
    };
    for entry in read.flatten() {
        if entry.file_name().to_string_lossy().starts_with(TMP_MARK) {
            std::fs::remove_file(entry.path())?;
            n += 1;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_file_is_removed_unless_committed() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("a.txt");
        {
            let (mut f, pending) = create_tmp(&dest).unwrap();
            f.write_all(b"half").unwrap();
            assert!(pending.tmp.exists());
            drop(pending);
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        write_atomic(&dest, b"whole").unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"whole");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}

#[cfg(test)]
mod disk_full_tests {
    use super::*;

    #[test]
    fn a_full_disk_names_the_final_file() {
        let io = io::Error::from_raw_os_error(28);
        let e = anyhow::Error::new(io).context("finishing out/.synth-tmp-12510-5d47f338-big.parquet");
        assert_eq!(explain_disk_full(&e).unwrap(), "the disk is full: no space left while writing out/big.parquet");
        let e =
            anyhow::anyhow!("writing out/.synth-tmp-1-00ff00ff-manifest.json: No space left on device (os error 28)");
        assert_eq!(explain_disk_full(&e).unwrap(), "the disk is full: no space left while writing out/manifest.json");
        assert_eq!(explain_disk_full(&anyhow::anyhow!("permission denied")), None);
    }
}
