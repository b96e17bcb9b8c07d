//! The regeneration lock: one `synth regenerate` (or `synth snapshot gc`) per output
//! directory at a time. A second one finds the lock held and exits with the holder's
//! pid, host and start time in its message (exit status 75).

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::Path;

use synth_core::store::state::{INTERNAL_DIR, now_rfc3339};

pub const LOCK_NAME: &str = "regenerate.lock";

/// Held for as long as it lives (the OS drops the lock when the process ends, even killed).
pub struct RunGuard {
    _file: File,
}

fn host() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into the buffer we own.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown host".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).to_string()
}

/// Take the lock of `out_dir` for `what` (e.g. `regenerate of quickstart`), or say who holds it.
pub fn acquire(out_dir: &Path, what: &str) -> Result<RunGuard, String> {
    let dir = out_dir.join(INTERNAL_DIR);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let path = dir.join(LOCK_NAME);
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            return Err(format!(
                "another synth {} is running on {} ({}); this one exits without doing anything",
                what,
                out_dir.display(),
                if holder.is_empty() { format!("lock {}", path.display()) } else { holder.to_string() }
            ));
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(format!("cannot lock {}: {e}", path.display())),
    }
    let note = format!("pid {} on {} since {}", std::process::id(), host(), now_rfc3339());
    let _ = file.set_len(0);
    let _ = file.rewind();
    let _ = file.write_all(note.as_bytes());
    let _ = file.sync_all();
    Ok(RunGuard { _file: file })
}
