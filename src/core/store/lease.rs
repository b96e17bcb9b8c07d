//! Leases: who may commit a run (its coordinator) or one shard of a wave, so that two
//! coordinators, or two copies of one shard (a Kubernetes retry while the first pod
//! still runs, a Slurm requeue), never commit the same thing. On an object store a
//! lease is a small JSON object (holder, expiry) taken with a create-only write or,
//! when it expired or its holder is gone, with a write conditional on the version
//! that was read (an ETag match); the holder renews it every third of its lifetime
//! the same way and knows it lost it when a renewal's condition fails. A local
//! directory, or a `file://` store, cannot update conditionally: there the lease is
//! an OS lock on a file beside it (released by the kernel when the holder dies).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::object::{Conditional, StateStore, Version};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Body {
    holder: String,
    host: String,
    pid: u32,
    /// Milliseconds since the Unix epoch after which anyone may take the lease.
    expires_ms: u64,
    what: String,
}

/// A lease held by this process; dropping it stops the renewals and releases it
/// (an OS lock: at once; an object: it stays until it expires unless `release` ran).
pub struct Lease {
    lost: CancellationToken,
    stop: CancellationToken,
    renewer: Option<tokio::task::JoinHandle<()>>,
    _lock: Option<std::fs::File>,
    state: Option<(StateStore, String, String)>,
    version: std::sync::Arc<std::sync::Mutex<Version>>,
}

/// Why a lease could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("{0}")]
    Held(String),
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into a buffer we own.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).to_string()
}

pub fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 checks for the process without sending anything.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

impl Lease {
    /// Take the lease `rel` of `store` for `ttl`, or say who holds it. `what` names
    /// the work in messages ("coordinator", "wave 2 shard 3").
    pub async fn acquire(store: &StateStore, rel: &str, ttl: Duration, what: &str) -> Result<Lease, LeaseError> {
        if let Some(root) = store.local_root() {
            return Self::lock_file(&root.join(format!("{rel}.lock")), what);
        }
        let me = format!("{}/{}/{:08x}", hostname(), std::process::id(), rand::random::<u32>());
        let body = |expires_ms| Body {
            holder: me.clone(),
            host: hostname(),
            pid: std::process::id(),
            expires_ms,
            what: what.to_string(),
        };
        let bytes = serde_json::to_vec(&body(now_ms() + ttl.as_millis() as u64)).expect("serializable");
        let version = match store.create(rel, &bytes).await? {
            Conditional::Done(v) => v,
            Conditional::Lost => {
                let Some((old, v)) = store.read_versioned(rel).await? else {
                    return Err(LeaseError::Held(format!(
                        "the lease of the {what} changed while it was read; try again"
                    )));
                };
                let old: Option<Body> = serde_json::from_slice(&old).ok();
                let free = match &old {
                    None => true,
                    Some(o) => o.expires_ms < now_ms() || (o.host == hostname() && !alive(o.pid)),
                };
                if !free {
                    let o = old.expect("held");
                    let left = o.expires_ms.saturating_sub(now_ms()) / 1000;
                    return Err(LeaseError::Held(format!(
                        "the {what} is being run by {} (its lease {} runs {left} s more, renewed while it works)",
                        o.holder,
                        store_path(store, rel)
                    )));
                }
                match store.update(rel, &bytes, &v).await? {
                    Conditional::Done(v) => v,
                    Conditional::Lost => {
                        return Err(LeaseError::Held(format!("another process took the lease of the {what} first")));
                    }
                }
            }
        };
        let version = std::sync::Arc::new(std::sync::Mutex::new(version));
        let (lost, stop) = (CancellationToken::new(), CancellationToken::new());
        let renewer = {
            let (store, rel, what) = (store.clone(), rel.to_string(), what.to_string());
            let (lost, stop, version) = (lost.clone(), stop.clone(), version.clone());
            let body = body(0);
            tokio::spawn(async move {
                let every = (ttl / 3).max(Duration::from_millis(200));
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(every) => {}
                    }
                    let b = Body { expires_ms: now_ms() + ttl.as_millis() as u64, ..body.clone() };
                    let bytes = serde_json::to_vec(&b).expect("serializable");
                    let v = version.lock().expect("lease version").clone();
                    match store.update(&rel, &bytes, &v).await {
                        Ok(Conditional::Done(v)) => *version.lock().expect("lease version") = v,
                        Ok(Conditional::Lost) => {
                            tracing::error!("the lease of the {what} was taken by another process: stopping");
                            lost.cancel();
                            return;
                        }
                        // A passing network error: the next renewal may go through
                        // before the lease expires.
                        Err(e) => tracing::warn!("renewing the lease of the {what}: {e:#}"),
                    }
                }
            })
        };
        Ok(Lease {
            lost,
            stop,
            renewer: Some(renewer),
            _lock: None,
            state: Some((store.clone(), rel.to_string(), me)),
            version,
        })
    }

    fn lock_file(path: &Path, what: &str) -> Result<Lease, LeaseError> {
        let file = open_lock_file(path)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let holder = std::fs::read_to_string(path).unwrap_or_default();
                return Err(LeaseError::Held(format!(
                    "the {what} is being run by another process ({}; lock {})",
                    holder.trim(),
                    path.display()
                )));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(LeaseError::Other(anyhow::anyhow!("cannot lock {}: {e}", path.display())));
            }
        }
        // Who holds it, for the message of the next one who tries.
        let _ = std::fs::write(path, format!("{}/{}", hostname(), std::process::id()));
        Ok(Lease {
            lost: CancellationToken::new(),
            stop: CancellationToken::new(),
            renewer: None,
            _lock: Some(file),
            state: None,
            version: std::sync::Arc::new(std::sync::Mutex::new(Version::none())),
        })
    }

    /// Cancelled when a renewal found the lease taken by another process.
    pub fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// Stop renewing and let anyone take the lease at once (a conditional write of an
    /// expired lease, so a lease someone else took meanwhile is left alone).
    pub async fn release(mut self) -> Result<()> {
        self.stop.cancel();
        if let Some(r) = self.renewer.take() {
            let _ = r.await;
        }
        if let Some((store, rel, me)) = self.state.take() {
            let body =
                Body { holder: me, host: hostname(), pid: std::process::id(), expires_ms: 0, what: String::new() };
            let v = self.version.lock().expect("lease version").clone();
            if let Err(e) = store.update(&rel, &serde_json::to_vec(&body).expect("serializable"), &v).await {
                tracing::warn!("releasing the lease {rel}: {e:#}");
            }
        }
        Ok(())
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn store_path(store: &StateStore, rel: &str) -> String {
    format!("{}/{rel}", store.display())
}

/// The lease file of a local path, for messages.
pub fn lock_path(root: &Path, rel: &str) -> PathBuf {
    root.join(format!("{rel}.lock"))
}

/// Fail unless `lease` is still held.
pub fn check(lease: &Lease, what: &str) -> Result<()> {
    if lease.lost.is_cancelled() {
        bail!("the lease of the {what} was lost to another process; nothing more is committed");
    }
    Ok(())
}
/// Open (creating it and its folder) a file to take an OS lock on; its content is kept.
pub fn open_lock_file(path: &Path) -> Result<std::fs::File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .read(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))
}
