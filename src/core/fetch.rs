//! Files a pipeline reads from plain HTTP(S) URLs: downloaded into a cache folder with
//! conditional requests (`If-None-Match` / `If-Modified-Since`: an unchanged file is a
//! 304, not a download), kept by content hash so a version `synth.lock` pins can be read
//! again after the server moved on, and readable offline from the cache.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};

use crate::store::atomic::{create_tmp, finish_file, write_atomic};

/// A downloaded (or cached) file and the version it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    pub path: PathBuf,
    pub etag: Option<String>,
    pub last_modified: Option<String>,
    /// BLAKE3 of the content.
    pub blake3: String,
}

/// How to fetch.
#[derive(Debug, Clone, Copy, Default)]
pub struct Fetch<'a> {
    /// Only what the cache holds (dry runs).
    pub offline_only: bool,
    /// The content (BLAKE3) a lock pins: served from the cache when it holds it, and any
    /// other content is an error.
    pub pin: Option<&'a str>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Meta {
    url: String,
    #[serde(default)]
    etag: Option<String>,
    #[serde(default)]
    last_modified: Option<String>,
    blake3: String,
}

/// The file name a URL's content is kept under (its last path segment, made safe).
fn file_name(url: &str) -> String {
    let path = url.split(['?', '#']).next().unwrap_or_default();
    let last = path.rsplit('/').next().unwrap_or_default();
    let safe: String =
        last.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect();
    if safe.is_empty() || safe.starts_with('.') { format!("download{safe}") } else { safe }
}

/// Fetch `url` into `cache` (a folder per URL, a sub-folder per content hash).
/// `Ok(None)` when offline and the cache does not hold it.
pub async fn fetch(url: &str, cache: &Path, how: &Fetch<'_>) -> Result<Option<Fetched>> {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        bail!("\"{url}\" is not an http(s) URL");
    }
    let dir = cache.join(&blake3::hash(url.as_bytes()).to_hex()[..16]);
    let name = file_name(url);
    let meta_path = dir.join("meta.json");
    let meta: Option<Meta> = std::fs::read(&meta_path).ok().and_then(|b| serde_json::from_slice(&b).ok());
    let cached = |m: &Meta| {
        let path = dir.join(&m.blake3).join(&name);
        path.exists().then(|| Fetched {
            path,
            etag: m.etag.clone(),
            last_modified: m.last_modified.clone(),
            blake3: m.blake3.clone(),
        })
    };
    if let Some(pin) = how.pin {
        let path = dir.join(pin).join(&name);
        if path.exists() {
            let m = meta.as_ref().filter(|m| m.blake3 == pin);
            return Ok(Some(Fetched {
                path,
                etag: m.and_then(|m| m.etag.clone()),
                last_modified: m.and_then(|m| m.last_modified.clone()),
                blake3: pin.to_string(),
            }));
        }
    }
    if how.offline_only {
        return Ok(meta.as_ref().and_then(cached));
    }
    let client = reqwest::Client::builder()
        .user_agent(concat!("synth/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(std::time::Duration::from_secs(30))
        // A server that stops sending mid-file fails the fetch instead of hanging the run.
        .read_timeout(std::time::Duration::from_secs(120))
        .build()?;
    let mut req = client.get(url);
    let previous = meta.as_ref().and_then(|m| cached(m).map(|f| (m.clone(), f)));
    if let Some((m, _)) = &previous {
        if let Some(etag) = &m.etag {
            req = req.header("If-None-Match", etag);
        }
        if let Some(lm) = &m.last_modified {
            req = req.header("If-Modified-Since", lm);
        }
    }
    let mut resp = match req.send().await {
        Ok(r) => r,
        Err(e) => {
            // Unreachable: the cached copy serves, as hub sources do.
            return match previous {
                Some((_, f)) if how.pin.is_none_or(|p| p == f.blake3) => {
                    tracing::warn!("{url} unreachable ({e}); using the cached copy");
                    Ok(Some(f))
                }
                _ => Err(anyhow!("{url} unreachable: {e}")),
            };
        }
    };
    let status = resp.status();
    let fetched = if status == reqwest::StatusCode::NOT_MODIFIED {
        previous.map(|(_, f)| f).ok_or_else(|| anyhow!("{url}: 304 Not Modified but nothing is cached"))?
    } else if status.is_success() {
        let header = |h: &str| resp.headers().get(h).and_then(|v| v.to_str().ok()).map(str::to_string);
        let (etag, last_modified) = (header("etag"), header("last-modified"));
        let staging = dir.join("incoming").join(&name);
        let (mut file, pending) = create_tmp(&staging)?;
        let mut hasher = blake3::Hasher::new();
        while let Some(chunk) = resp.chunk().await.with_context(|| format!("downloading {url}"))? {
            hasher.update(&chunk);
            file.write_all(&chunk).with_context(|| format!("writing {}", pending.tmp.display()))?;
        }
        finish_file(file, &pending)?;
        let hash = hasher.finalize().to_hex().to_string();
        let dest = dir.join(&hash).join(&name);
        std::fs::create_dir_all(dest.parent().expect("has a parent"))?;
        std::fs::rename(&pending.tmp, &dest).with_context(|| format!("keeping {}", dest.display()))?;
        drop(pending); // already moved: its cleanup finds nothing
        let meta = Meta {
            url: url.to_string(),
            etag: etag.clone(),
            last_modified: last_modified.clone(),
            blake3: hash.clone(),
        };
        write_atomic(&meta_path, &serde_json::to_vec_pretty(&meta)?)?;
        Fetched { path: dest, etag, last_modified, blake3: hash }
    } else {
        let body = resp.text().await.unwrap_or_default();
        bail!("{url}: HTTP {}: {}", status.as_u16(), body.chars().take(200).collect::<String>().trim());
    };
    if let Some(pin) = how.pin
        && pin != fetched.blake3
    {
        bail!(
            "{url} now serves other content (BLAKE3 {}) than synth.lock pins ({pin}), and the cache no longer holds the pinned one; `synth lock --update` takes the new content",
            &fetched.blake3[..16]
        );
    }
    Ok(Some(fetched))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_the_last_path_segment() {
        assert_eq!(file_name("https://x.org/data/train.jsonl?sig=abc"), "train.jsonl");
        assert_eq!(file_name("https://x.org/"), "download");
        assert_eq!(file_name("https://x.org/a b.csv"), "a_b.csv");
    }
}
