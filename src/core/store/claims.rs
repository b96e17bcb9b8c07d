//! Claims on paid work shared by the shards of a wave, content-addressed: two shards
//! whose records ask the very same request (different records, identical prompt) must
//! not both pay for it, as one process would not (its cache and single-flight answer
//! the second). Before sending a request its cache lacks, a shard claims its key with
//! a create-only write (`<dir>/<kk>/<key>.claim`); the one that wins sends it and
//! stores the answer under the key (`<key>.json`) before journaling it; the others
//! wait for that answer and keep it in their own cache. A claim whose holder is gone
//! (a dead process on this host, or a claim older than `stale_after`) is taken over; a
//! holder whose request failed removes its claim, so another may try.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use serde::{Deserialize, Serialize};

use super::object::{Conditional, StateStore};

#[derive(Serialize, Deserialize)]
struct ClaimBody {
    host: String,
    pid: u32,
    at_ms: u64,
}

/// What a claim found.
pub enum Claim {
    /// This process sends the request.
    Mine,
    /// Another one did: its answer.
    Answered(Vec<u8>),
}

/// The claims of one wave.
#[derive(Clone)]
pub struct Claims {
    store: StateStore,
    dir: String,
    stale_after: Duration,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

impl Claims {
    /// Claims under `dir` of `store`; a claim older than `stale_after` whose holder is
    /// on another host counts as abandoned.
    pub fn new(store: StateStore, dir: &str, stale_after: Duration) -> Claims {
        Claims { store, dir: dir.trim_end_matches('/').to_string(), stale_after }
    }

    fn path(&self, key: &str, ext: &str) -> String {
        format!("{}/{}/{key}.{ext}", self.dir, &key[..2.min(key.len())])
    }

    /// Claim `key`, or wait for the answer of whoever holds it.
    pub async fn claim(&self, key: &str) -> Result<Claim> {
        let (answer, claim) = (self.path(key, "json"), self.path(key, "claim"));
        let mut pause = Duration::from_millis(20);
        loop {
            if let Some(bytes) = self.store.read(&answer).await? {
                return Ok(Claim::Answered(bytes));
            }
            let mine = ClaimBody { host: super::lease::hostname(), pid: std::process::id(), at_ms: now_ms() };
            let bytes = serde_json::to_vec(&mine).expect("serializable");
            match self.store.create(&claim, &bytes).await? {
                Conditional::Done(_) => {
                    // Answered between the read and the claim: the claim is not needed.
                    if let Some(bytes) = self.store.read(&answer).await? {
                        self.release(key).await;
                        return Ok(Claim::Answered(bytes));
                    }
                    return Ok(Claim::Mine);
                }
                Conditional::Lost => {}
            }
            // Held: by a live holder, wait; by a dead or long-silent one, take over.
            if let Some((held, version)) = self.store.read_versioned(&claim).await? {
                let holder: Option<ClaimBody> = serde_json::from_slice(&held).ok();
                let gone = match &holder {
                    None => true,
                    Some(h) if h.host == super::lease::hostname() => !super::lease::alive(h.pid),
                    Some(h) => now_ms().saturating_sub(h.at_ms) > self.stale_after.as_millis() as u64,
                };
                if gone {
                    if self.store.is_remote() && self.store.local_root().is_none() {
                        if let Conditional::Done(_) = self.store.update(&claim, &bytes, &version).await? {
                            return Ok(Claim::Mine);
                        }
                    } else {
                        // A file system: remove the abandoned claim and race for it again.
                        self.store.remove(&claim).await?;
                    }
                    continue;
                }
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// Store the answer of a claimed key (before the holder journals it: once it is
    /// journaled, no other shard sends the request again).
    pub async fn answer(&self, key: &str, bytes: &[u8]) -> Result<()> {
        match self.store.create(&self.path(key, "json"), bytes).await? {
            Conditional::Done(_) | Conditional::Lost => Ok(()),
        }
    }

    /// Give a claim up (the request failed): another shard may try.
    pub async fn release(&self, key: &str) {
        if let Err(e) = self.store.remove(&self.path(key, "claim")).await {
            tracing::warn!("removing the claim of a request: {e:#}");
        }
    }
}
