//! Publishing to the Hugging Face Hub through its HTTP commit API: many files as one
//! commit, checked against the parent commit the caller saw (the Hub answers 412 when
//! the branch moved), then a tag. Large files go through the Git LFS batch API first
//! (basic or multipart transfer), as huggingface_hub does without hf_xet; the commit
//! itself is one NDJSON request: a header line, then one line per file
//! (`file` inline in base64, `lfsFile` by SHA-256, `deletedFile`).
//!
//! hf-hub 0.5 cannot upload and hf-hub 1.x pulls hf-xet and a second hf-hub major into
//! the build (fastembed keeps 0.5), so this is a small client over reqwest.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use base64::Engine;
use serde_json::{Value, json};
use sha2::Digest;

/// A file to add, by its path in the repository and on disk.
#[derive(Debug, Clone)]
pub struct CommitFile {
    pub path_in_repo: String,
    pub local: PathBuf,
}

/// The commit the Hub created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitInfo {
    pub commit: String,
    pub url: String,
}

/// Why a commit did not land.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitErrorKind {
    /// The branch no longer points to the parent commit: someone else pushed.
    ParentMoved,
    /// The token is missing, wrong, or cannot write to the repository.
    Auth,
    Other,
}

#[derive(Debug, Clone)]
pub struct CommitError {
    pub kind: CommitErrorKind,
    pub message: String,
}

impl std::fmt::Display for CommitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CommitError {}

/// Bytes of the start of a file the preupload call looks at.
const SAMPLE: usize = 512;
/// Files per preupload / LFS batch request (huggingface_hub uses 256).
const CHUNK_FILES: usize = 256;

/// One repository on one Hub endpoint, with a write token.
pub struct HubRepo {
    endpoint: String,
    repo: String,
    repo_type: String,
    token: String,
    client: reqwest::Client,
}

struct Prepared {
    file: CommitFile,
    size: u64,
    sha256: String,
    sample: Vec<u8>,
    lfs: bool,
    /// The repository's `.gitignore` excludes it (the preupload answer says so): not committed.
    ignored: bool,
}

/// Percent-encode one URL path segment (a branch such as `refs/pr/1` becomes one segment).
pub fn encode_segment(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn error_text(status: reqwest::StatusCode, body: &str) -> String {
    let said = serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_string))
        .unwrap_or_else(|| body.chars().take(300).collect());
    format!("HTTP {}: {}", status.as_u16(), said.trim())
}

impl HubRepo {
    /// `endpoint` defaults to `HF_ENDPOINT`, then https://huggingface.co.
    pub fn new(endpoint: Option<&str>, repo: &str, repo_type: &str, token: &str) -> Result<HubRepo> {
        let endpoint = endpoint
            .map(str::to_string)
            .or_else(|| std::env::var("HF_ENDPOINT").ok().filter(|e| !e.is_empty()))
            .unwrap_or_else(|| "https://huggingface.co".into())
            .trim_end_matches('/')
            .to_string();
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(30))
            .user_agent(concat!("synth/", env!("CARGO_PKG_VERSION")))
            .build()
            .context("building the Hub HTTP client")?;
        Ok(HubRepo { endpoint, repo: repo.into(), repo_type: repo_type.into(), token: token.into(), client })
    }

    pub fn repo(&self) -> &str {
        &self.repo
    }

    fn api(&self, what: &str, revision: &str) -> String {
        format!("{}/api/{}s/{}/{what}/{}", self.endpoint, self.repo_type, self.repo, encode_segment(revision))
    }

    /// `datasets/` for datasets, nothing for models (the Hub's URL layout).
    fn prefix(&self) -> &'static str {
        match self.repo_type.as_str() {
            "dataset" => "datasets/",
            "space" => "spaces/",
            _ => "",
        }
    }

    /// The web URL of a commit.
    pub fn commit_url(&self, commit: &str) -> String {
        format!("{}/{}{}/commit/{commit}", self.endpoint, self.prefix(), self.repo)
    }

    /// Send a request built by `make`, retrying connection errors, 429 and 5xx (not for
    /// commits, which could land twice).
    async fn send(&self, retry: bool, make: impl Fn() -> reqwest::RequestBuilder) -> Result<reqwest::Response> {
        let mut delay = Duration::from_millis(500);
        let attempts = if retry { 4 } else { 1 };
        for attempt in 1..=attempts {
            let result = make().bearer_auth(&self.token).send().await;
            let retryable = match &result {
                Ok(r) => r.status().as_u16() == 429 || r.status().is_server_error(),
                Err(e) => e.is_connect() || e.is_timeout(),
            };
            if !retryable || attempt == attempts {
                return result.map_err(|e| anyhow!("{} unreachable: {e}", self.endpoint));
            }
            tokio::time::sleep(delay).await;
            delay *= 2;
        }
        unreachable!("the last attempt returns")
    }

    async fn json_ok(&self, resp: reqwest::Response, what: &str) -> Result<Value> {
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        if !status.is_success() {
            bail!("{what} on {}: {}", self.repo, error_text(status, &body));
        }
        serde_json::from_str(&body).with_context(|| format!("{what} on {}: not JSON: {body:.200}", self.repo))
    }

    /// The commit a branch (or tag) points to now; `None` when the Hub does not know it.
    pub async fn head(&self, revision: &str) -> Result<Option<String>> {
        let url = self.api("revision", revision);
        let resp = self.send(true, || self.client.get(&url)).await?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if matches!(resp.status().as_u16(), 401 | 403) {
            let status = resp.status();
            let body = resp.text().await.unwrap_or_default();
            bail!(
                "reading {}: {} (is the token in the environment valid for it?)",
                self.repo,
                error_text(status, &body)
            );
        }
        let info = self.json_ok(resp, "reading the branch").await?;
        Ok(info.get("sha").and_then(|s| s.as_str()).map(str::to_string))
    }

    /// A file of the repository at a revision (`None` when absent).
    pub async fn read_file(&self, revision: &str, path: &str) -> Result<Option<Vec<u8>>> {
        let url =
            format!("{}/{}{}/resolve/{}/{path}", self.endpoint, self.prefix(), self.repo, encode_segment(revision));
        let resp = self.send(true, || self.client.get(&url)).await?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let status = resp.status();
        if !status.is_success() {
            let body = resp.text().await.unwrap_or_default();
            bail!("reading {path} from {}: {}", self.repo, error_text(status, &body));
        }
        Ok(Some(resp.bytes().await.context("reading a hub file")?.to_vec()))
    }

    /// Commit `files` (and delete `deletions`) on `branch` as one commit whose parent must
    /// be `parent` (when given); LFS uploads happen first.
    pub async fn commit(
        &self,
        branch: &str,
        parent: Option<&str>,
        summary: &str,
        description: &str,
        files: &[CommitFile],
        deletions: &[String],
    ) -> Result<CommitInfo, CommitError> {
        let other = |e: anyhow::Error| CommitError { kind: CommitErrorKind::Other, message: format!("{e:#}") };
        let mut prepared = Vec::new();
        for f in files {
            prepared.push(describe(f).map_err(other)?);
        }
        self.upload_modes(branch, &mut prepared).await.map_err(other)?;
        self.upload_lfs(branch, &prepared).await.map_err(other)?;
        let body = payload(summary, description, parent, &prepared, deletions).map_err(other)?;
        let url = self.api("commit", branch);
        let resp = self
            .send(false, || self.client.post(&url).header("Content-Type", "application/x-ndjson").body(body.clone()))
            .await
            .map_err(other)?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        if !status.is_success() {
            let kind = match status.as_u16() {
                412 | 409 if parent.is_some() => CommitErrorKind::ParentMoved,
                401 | 403 => CommitErrorKind::Auth,
                _ => CommitErrorKind::Other,
            };
            let message = match kind {
                CommitErrorKind::ParentMoved => format!(
                    "{} branch {branch} moved since {} was read ({}): someone else pushed; nothing was published",
                    self.repo,
                    parent.map(|p| &p[..p.len().min(8)]).unwrap_or_default(),
                    error_text(status, &text)
                ),
                _ => format!("committing to {}: {}", self.repo, error_text(status, &text)),
            };
            return Err(CommitError { kind, message });
        }
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| other(anyhow!("the commit answer is not JSON ({e}): {text:.200}")))?;
        let commit = v
            .get("commitOid")
            .and_then(|c| c.as_str())
            .ok_or_else(|| other(anyhow!("the commit answer has no commitOid: {text:.200}")))?
            .to_string();
        let url = v.get("commitUrl").and_then(|c| c.as_str()).map(str::to_string).unwrap_or(self.commit_url(&commit));
        Ok(CommitInfo { commit, url })
    }

    /// Create `tag` on `revision` (a commit).
    pub async fn tag(&self, revision: &str, tag: &str, message: &str) -> Result<()> {
        let url = self.api("tag", revision);
        let body = json!({"tag": tag, "message": message});
        let resp = self.send(true, || self.client.post(&url).json(&body)).await?;
        let status = resp.status();
        if status.as_u16() == 409 {
            bail!("tag {tag} already exists on {}", self.repo);
        }
        self.json_ok(resp, &format!("creating tag {tag}")).await.map(|_| ()).or_else(|e| {
            // Some answers to a successful tag creation carry no JSON body.
            if status.is_success() { Ok(()) } else { Err(e) }
        })
    }

    /// A Git LFS API call (its media type both ways), retried like any idempotent call.
    async fn lfs_post(&self, url: &str, body: &Value) -> Result<reqwest::Response> {
        let body = body.to_string();
        self.send(true, || {
            self.client
                .post(url)
                .header("Accept", "application/vnd.git-lfs+json")
                .header("Content-Type", "application/vnd.git-lfs+json")
                .body(body.clone())
        })
        .await
    }

    /// Ask the Hub which files go through LFS.
    async fn upload_modes(&self, branch: &str, files: &mut [Prepared]) -> Result<()> {
        let url = self.api("preupload", branch);
        for chunk in files.chunks_mut(CHUNK_FILES) {
            let b64 = base64::engine::general_purpose::STANDARD;
            let body = json!({"files": chunk.iter().map(|f| json!({
                "path": f.file.path_in_repo,
                "sample": b64.encode(&f.sample),
                "size": f.size,
            })).collect::<Vec<_>>()});
            let resp = self.send(true, || self.client.post(&url).json(&body)).await?;
            let v = self.json_ok(resp, "asking for upload modes").await?;
            let modes = v.get("files").and_then(|f| f.as_array()).ok_or_else(|| anyhow!("preupload answer: {v}"))?;
            for f in chunk.iter_mut() {
                let answer = modes
                    .iter()
                    .find(|m| m.get("path").and_then(|p| p.as_str()) == Some(f.file.path_in_repo.as_str()))
                    .ok_or_else(|| anyhow!("preupload answer has no mode for {}", f.file.path_in_repo))?;
                let mode = answer.get("uploadMode").and_then(|u| u.as_str()).unwrap_or("regular");
                // Empty files cannot go through LFS (huggingface_hub commits them inline too).
                f.lfs = mode == "lfs" && f.size > 0;
                f.ignored = answer.get("shouldIgnore").and_then(|i| i.as_bool()).unwrap_or(false);
            }
        }
        Ok(())
    }

    /// Upload the LFS files the Hub does not hold yet.
    async fn upload_lfs(&self, branch: &str, files: &[Prepared]) -> Result<()> {
        let lfs: Vec<&Prepared> = files.iter().filter(|f| f.lfs && !f.ignored).collect();
        let url = format!("{}/{}{}.git/info/lfs/objects/batch", self.endpoint, self.prefix(), self.repo);
        for chunk in lfs.chunks(CHUNK_FILES) {
            let body = json!({
                "operation": "upload",
                "transfers": ["basic", "multipart"],
                "objects": chunk.iter().map(|f| json!({"oid": f.sha256, "size": f.size})).collect::<Vec<_>>(),
                "hash_algo": "sha256",
                "ref": {"name": branch},
            });
            let resp = self.lfs_post(&url, &body).await?;
            let v = self.json_ok(resp, "the LFS batch request").await?;
            let objects = v.get("objects").and_then(|o| o.as_array()).ok_or_else(|| anyhow!("LFS batch: {v}"))?;
            for obj in objects {
                let oid = obj.get("oid").and_then(|o| o.as_str()).unwrap_or_default();
                let Some(f) = chunk.iter().find(|f| f.sha256 == oid) else { continue };
                if let Some(err) = obj.get("error") {
                    bail!("LFS refused {}: {err}", f.file.path_in_repo);
                }
                let Some(actions) = obj.get("actions") else { continue }; // already there
                self.lfs_object(f, actions).await.with_context(|| format!("uploading {}", f.file.path_in_repo))?;
            }
        }
        Ok(())
    }

    async fn lfs_object(&self, f: &Prepared, actions: &Value) -> Result<()> {
        let upload = actions.get("upload").ok_or_else(|| anyhow!("LFS batch answer without upload action"))?;
        let href = upload.get("href").and_then(|h| h.as_str()).ok_or_else(|| anyhow!("LFS upload without href"))?;
        let header = upload.get("header").and_then(|h| h.as_object()).cloned().unwrap_or_default();
        match header.get("chunk_size") {
            Some(size) => {
                let chunk: u64 = size
                    .as_str()
                    .and_then(|s| s.parse().ok())
                    .or_else(|| size.as_u64())
                    .filter(|c| *c > 0)
                    .ok_or_else(|| anyhow!("LFS multipart chunk_size is not a number: {size}"))?;
                let mut parts: Vec<(u64, &str)> =
                    header.iter().filter_map(|(k, v)| Some((k.parse::<u64>().ok()?, v.as_str()?))).collect();
                parts.sort();
                if parts.len() as u64 != f.size.div_ceil(chunk) {
                    bail!("LFS multipart: {} part URLs for {} bytes in chunks of {chunk}", parts.len(), f.size);
                }
                let mut etags = Vec::new();
                let mut file = std::fs::File::open(&f.file.local)?;
                for (n, part_url) in &parts {
                    let mut buf = Vec::with_capacity(chunk as usize);
                    (&mut file).take(chunk).read_to_end(&mut buf)?;
                    // Presigned part URLs carry their own authorization: no token sent there.
                    let resp = self.client.put(*part_url).body(buf).send().await?;
                    if !resp.status().is_success() {
                        let status = resp.status();
                        bail!("part {n}: {}", error_text(status, &resp.text().await.unwrap_or_default()));
                    }
                    let etag = resp
                        .headers()
                        .get("etag")
                        .and_then(|e| e.to_str().ok())
                        .ok_or_else(|| anyhow!("part {n}: no ETag in the answer"))?;
                    etags.push(json!({"partNumber": n, "etag": etag}));
                }
                let resp = self.lfs_post(href, &json!({"oid": f.sha256, "parts": etags})).await?;
                self.json_ok(resp, "completing a multipart upload")
                    .await
                    .map(|_| ())
                    .or_else(|e| if e.to_string().contains("not JSON") { Ok(()) } else { Err(e) })?;
            }
            None => {
                let file = tokio::fs::File::open(&f.file.local).await?;
                let mut req = self.client.put(href).body(reqwest::Body::from(file));
                for (k, v) in &header {
                    if let Some(v) = v.as_str() {
                        req = req.header(k.as_str(), v);
                    }
                }
                let resp = req.send().await?;
                if !resp.status().is_success() {
                    let status = resp.status();
                    bail!("{}", error_text(status, &resp.text().await.unwrap_or_default()));
                }
            }
        }
        if let Some(verify) = actions.get("verify").and_then(|v| v.get("href")).and_then(|h| h.as_str()) {
            let resp = self.lfs_post(verify, &json!({"oid": f.sha256, "size": f.size})).await?;
            if !resp.status().is_success() {
                let status = resp.status();
                bail!("LFS verify: {}", error_text(status, &resp.text().await.unwrap_or_default()));
            }
        }
        Ok(())
    }
}

/// Size, SHA-256 and the first bytes of a file.
fn describe(file: &CommitFile) -> Result<Prepared> {
    let mut f = std::fs::File::open(&file.local).with_context(|| format!("opening {}", file.local.display()))?;
    let mut hasher = sha2::Sha256::new();
    let mut sample = Vec::new();
    let mut size = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).with_context(|| format!("reading {}", file.local.display()))?;
        if n == 0 {
            break;
        }
        if sample.len() < SAMPLE {
            let take = (SAMPLE - sample.len()).min(n);
            sample.extend_from_slice(&buf[..take]);
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    let sha256 = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok(Prepared { file: file.clone(), size, sha256, sample, lfs: false, ignored: false })
}

/// The NDJSON body of a commit.
fn payload(
    summary: &str,
    description: &str,
    parent: Option<&str>,
    files: &[Prepared],
    deletions: &[String],
) -> Result<Vec<u8>> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut header = json!({"summary": summary, "description": description});
    if let Some(p) = parent {
        header["parentCommit"] = json!(p);
    }
    let mut out = Vec::new();
    let mut line = |v: Value| {
        out.extend_from_slice(v.to_string().as_bytes());
        out.push(b'\n');
    };
    line(json!({"key": "header", "value": header}));
    for f in files.iter().filter(|f| !f.ignored) {
        if f.lfs {
            line(json!({"key": "lfsFile", "value": {
                "path": f.file.path_in_repo, "algo": "sha256", "oid": f.sha256, "size": f.size,
            }}));
        } else {
            let bytes = std::fs::read(&f.file.local).with_context(|| format!("reading {}", f.file.local.display()))?;
            line(json!({"key": "file", "value": {
                "content": b64.encode(bytes), "path": f.file.path_in_repo, "encoding": "base64",
            }}));
        }
    }
    for d in deletions {
        line(json!({"key": "deletedFile", "value": {"path": d}}));
    }
    Ok(out)
}

/// Every regular file under `dir` (skipping `skip`-named folders) as commit files, paths
/// relative to `dir` with `/`.
pub fn folder_files(dir: &Path, skip: &[&str]) -> Result<Vec<CommitFile>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("listing {}", d.display()))? {
            let entry = entry?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().to_string();
            let kind = entry.file_type()?;
            if kind.is_dir() {
                if !skip.contains(&name.as_str()) {
                    stack.push(path);
                }
            } else if kind.is_file() || path.is_file() {
                let rel = path.strip_prefix(dir).expect("under dir").to_string_lossy().replace('\\', "/");
                out.push(CommitFile { path_in_repo: rel, local: path });
            }
        }
    }
    out.sort_by(|a, b| a.path_in_repo.cmp(&b.path_in_repo));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_is_a_header_then_one_line_per_file() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("README.md");
        std::fs::write(&small, "# card\n").unwrap();
        let big = dir.path().join("data.parquet");
        std::fs::write(&big, vec![7u8; 2000]).unwrap();
        let mut files: Vec<Prepared> = [("README.md", &small), ("data/train.parquet", &big)]
            .iter()
            .map(|(p, l)| describe(&CommitFile { path_in_repo: p.to_string(), local: l.to_path_buf() }).unwrap())
            .collect();
        files[1].lfs = true;
        assert_eq!(files[1].sample.len(), SAMPLE);
        assert_eq!(files[1].size, 2000);
        let body = payload("snap", "desc", Some("abc"), &files, &["old.jsonl".into()]).unwrap();
        let lines: Vec<Value> =
            String::from_utf8(body).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(
            lines[0],
            json!({"key": "header", "value": {"summary": "snap", "description": "desc", "parentCommit": "abc"}})
        );
        assert_eq!(lines[1]["key"], "file");
        assert_eq!(lines[1]["value"]["content"], "IyBjYXJkCg==");
        assert_eq!(lines[2]["key"], "lfsFile");
        assert_eq!(lines[2]["value"]["oid"].as_str().unwrap().len(), 64);
        assert_eq!(lines[2]["value"]["size"], 2000);
        assert_eq!(lines[3], json!({"key": "deletedFile", "value": {"path": "old.jsonl"}}));
    }

    #[test]
    fn branch_names_are_one_path_segment() {
        assert_eq!(encode_segment("main"), "main");
        assert_eq!(encode_segment("refs/pr/1"), "refs%2Fpr%2F1");
    }
}
