//! `synth.lock`: what a pipeline's upstreams resolved to (a hub repository's revision →
//! its commit, a URL → its content hash and ETag, local files → their BLAKE3, each
//! provider → the model ids it actually served), so a run can reproduce exactly those (`synth run --locked`) and a scheduled
//! regeneration can tell what moved. One file next to the pipelines holds one entry
//! per (pipeline file, profile); written atomically as TOML.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::atomic::write_atomic;

/// The lock file's name (next to the pipeline file unless `--lockfile` says otherwise).
pub const LOCK_FILE: &str = "synth.lock";
/// Format version written into every lock file.
pub const LOCK_VERSION: u32 = 1;

const HEADER: &str = "# synth.lock: the upstreams each pipeline resolved to (hub commits, file hashes, served models).\n\
# Written by `synth lock` (`--update` re-resolves); `synth run --locked` uses exactly these. Do not edit by hand.\n";

/// Something outside the pipeline a stage resolved to a fixed version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Upstream {
    /// A Hugging Face Hub repository: the configured revision and the commit it pointed to.
    Hub {
        repo: String,
        #[serde(default = "dataset")]
        repo_type: String,
        revision: String,
        commit: String,
        /// The repository files the stage reads.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        files: Vec<String>,
    },
    /// A file read from an http(s) URL: its content hash, and the validators the server gave.
    Url {
        url: String,
        blake3: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        etag: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        last_modified: Option<String>,
    },
}

fn dataset() -> String {
    "dataset".into()
}

impl Upstream {
    /// One line for humans: `proj/repo@main = 0123abcd`.
    pub fn describe(&self) -> String {
        match self {
            Upstream::Hub { repo, revision, commit, .. } => format!("{repo}@{revision} = {}", short(commit)),
            Upstream::Url { url, blake3, etag, .. } => match etag {
                Some(e) => format!("{url} = {} (ETag {e})", short(blake3)),
                None => format!("{url} = {}", short(blake3)),
            },
        }
    }

    /// What identifies the upstream regardless of the version it resolved to.
    pub fn key(&self) -> String {
        match self {
            Upstream::Hub { repo, repo_type, revision, .. } => format!("hub:{repo_type}:{repo}@{revision}"),
            Upstream::Url { url, .. } => format!("url:{url}"),
        }
    }

    pub fn version(&self) -> &str {
        match self {
            Upstream::Hub { commit, .. } => commit,
            Upstream::Url { blake3, .. } => blake3,
        }
    }
}

/// The first 8 characters of a commit or hash.
pub fn short(s: &str) -> &str {
    &s[..s.len().min(8)]
}

/// What one stage was locked to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageLock {
    /// `kind@version` of the stage when it was locked.
    pub kind: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub upstream: Vec<Upstream>,
    /// Local files the stage reads (relative to the pipeline root) → BLAKE3.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, String>,
}

/// The models a provider actually served (from the `model` and `system_fingerprint`
/// fields of its answers), which can change behind an alias such as `gpt-4o`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderLock {
    /// The model the configuration asks for.
    pub model: String,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub served: BTreeSet<String>,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub system_fingerprint: BTreeSet<String>,
    /// An in-process (`local`) provider's model file on the hub: the commit its revision
    /// resolved to (`synth run --locked` downloads that commit's file).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub upstream: Vec<Upstream>,
}

/// The lock of one pipeline file under one profile.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PipelineLock {
    /// The pipeline file, relative to the lock file's directory.
    pub file: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    pub locked_at: String,
    pub synth_version: String,
    #[serde(default)]
    pub stages: BTreeMap<String, StageLock>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub providers: BTreeMap<String, ProviderLock>,
}

/// A whole lock file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LockFile {
    pub version: u32,
    #[serde(default, rename = "pipeline")]
    pub pipelines: Vec<PipelineLock>,
}

impl LockFile {
    /// Read a lock file; a missing file is an empty lock.
    pub fn load(path: &Path) -> Result<LockFile> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(LockFile { version: LOCK_VERSION, pipelines: Vec::new() });
            }
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        Self::parse(&text).with_context(|| format!("{}: not a synth lock file", path.display()))
    }

    pub fn parse(text: &str) -> Result<LockFile> {
        let lock: LockFile = toml::from_str(text)?;
        if lock.version > LOCK_VERSION {
            bail!("lock format {} is newer than this synth understands ({LOCK_VERSION})", lock.version);
        }
        Ok(lock)
    }

    pub fn to_text(&self) -> Result<String> {
        Ok(format!("{HEADER}{}", toml::to_string_pretty(self).context("writing the lock as TOML")?))
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        write_atomic(path, self.to_text()?.as_bytes())
    }

    pub fn find(&self, file: &str, profile: Option<&str>) -> Option<&PipelineLock> {
        self.pipelines.iter().find(|p| p.file == file && p.profile.as_deref() == profile)
    }

    /// Insert or replace the entry of `entry.file` / `entry.profile`, keeping the order.
    pub fn upsert(&mut self, entry: PipelineLock) {
        self.version = LOCK_VERSION;
        match self.pipelines.iter_mut().find(|p| p.file == entry.file && p.profile == entry.profile) {
            Some(slot) => *slot = entry,
            None => {
                self.pipelines.push(entry);
                self.pipelines.sort_by(|a, b| (&a.file, &a.profile).cmp(&(&b.file, &b.profile)));
            }
        }
    }

    /// A lock file holding one entry (what a snapshot carries).
    pub fn single(entry: PipelineLock) -> LockFile {
        LockFile { version: LOCK_VERSION, pipelines: vec![entry] }
    }
}

/// Where the lock of `pipeline` lives by default, and the key its entry is filed under.
pub fn default_location(pipeline: &Path) -> (PathBuf, String) {
    let dir = pipeline.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    (dir.join(LOCK_FILE), file_key(pipeline, dir))
}

/// The pipeline file relative to the lock's directory (its name when it lies beside it).
pub fn file_key(pipeline: &Path, lock_dir: &Path) -> String {
    let abs = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let (p, d) = (abs(pipeline), abs(lock_dir));
    match p.strip_prefix(&d) {
        Ok(rel) => rel.to_string_lossy().replace('\\', "/"),
        Err(_) => p.to_string_lossy().to_string(),
    }
}

/// What differs between an older and a newer lock of the same pipeline, one line each.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LockChanges {
    /// Upstreams that resolved to another version: `stage: repo@main 0123abcd → 4567ef01`.
    pub upstream: Vec<String>,
    /// Local files whose content changed, appeared or went away.
    pub files: Vec<String>,
    /// Providers that served another model.
    pub models: Vec<String>,
    /// Stages added to or removed from the pipeline.
    pub stages: Vec<String>,
}

impl LockChanges {
    pub fn is_empty(&self) -> bool {
        self.upstream.is_empty() && self.files.is_empty() && self.models.is_empty() && self.stages.is_empty()
    }

    pub fn lines(&self) -> impl Iterator<Item = &String> {
        self.upstream.iter().chain(&self.files).chain(&self.models).chain(&self.stages)
    }
}

fn joined(set: &BTreeSet<String>) -> String {
    if set.is_empty() { "(none recorded)".into() } else { set.iter().cloned().collect::<Vec<_>>().join(", ") }
}

/// Compare two locks of one pipeline. Served models are compared only where both
/// recorded some (a lock written before any run knows none).
pub fn changes(old: &PipelineLock, new: &PipelineLock) -> LockChanges {
    let mut out = LockChanges::default();
    for (name, n) in &new.stages {
        let Some(o) = old.stages.get(name) else {
            out.stages.push(format!("{name}: new stage"));
            continue;
        };
        for up in &n.upstream {
            match o.upstream.iter().find(|u| u.key() == up.key()) {
                Some(prev) if prev.version() != up.version() => out.upstream.push(format!(
                    "{name}: {} {} → {}",
                    up.key().trim_start_matches("hub:dataset:").trim_start_matches("hub:").trim_start_matches("url:"),
                    short(prev.version()),
                    short(up.version())
                )),
                Some(_) => {}
                None => out.upstream.push(format!("{name}: new upstream {}", up.describe())),
            }
        }
        for (file, hash) in &n.files {
            match o.files.get(file) {
                Some(h) if h != hash => out.files.push(format!("{name}: {file} changed")),
                Some(_) => {}
                None => out.files.push(format!("{name}: {file} added")),
            }
        }
        for file in o.files.keys().filter(|f| !n.files.contains_key(*f)) {
            out.files.push(format!("{name}: {file} no longer read"));
        }
    }
    for name in old.stages.keys().filter(|s| !new.stages.contains_key(*s)) {
        out.stages.push(format!("{name}: stage removed"));
    }
    for (name, n) in &new.providers {
        let Some(o) = old.providers.get(name) else { continue };
        for up in &n.upstream {
            match o.upstream.iter().find(|u| u.key() == up.key()) {
                Some(prev) if prev.version() != up.version() => out.upstream.push(format!(
                    "provider {name}: {} {} → {}",
                    up.key().trim_start_matches("hub:"),
                    short(prev.version()),
                    short(up.version())
                )),
                Some(_) => {}
                None => out.upstream.push(format!("provider {name}: new upstream {}", up.describe())),
            }
        }
        if o.model != n.model {
            out.models.push(format!("provider {name}: model {} → {}", o.model, n.model));
        } else if !o.served.is_empty() && !n.served.is_empty() && o.served != n.served {
            out.models.push(format!("provider {name}: served {} → {}", joined(&o.served), joined(&n.served)));
        } else if !o.system_fingerprint.is_empty()
            && !n.system_fingerprint.is_empty()
            && o.system_fingerprint != n.system_fingerprint
        {
            out.models.push(format!(
                "provider {name}: system_fingerprint {} → {}",
                joined(&o.system_fingerprint),
                joined(&n.system_fingerprint)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub(commit: &str) -> Upstream {
        Upstream::Hub {
            repo: "org/data".into(),
            repo_type: "dataset".into(),
            revision: "main".into(),
            commit: commit.into(),
            files: vec!["train.jsonl".into()],
        }
    }

    fn lock(commit: &str, file_hash: &str, served: &[&str]) -> PipelineLock {
        let mut stages = BTreeMap::new();
        stages.insert(
            "src".to_string(),
            StageLock {
                kind: "source@1".into(),
                upstream: vec![hub(commit)],
                files: BTreeMap::from([("prompts/a.j2".to_string(), file_hash.to_string())]),
            },
        );
        let providers = BTreeMap::from([(
            "gpt".to_string(),
            ProviderLock {
                model: "gpt-4o".into(),
                served: served.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            },
        )]);
        PipelineLock {
            file: "p.toml".into(),
            profile: None,
            locked_at: "2026-01-01T00:00:00Z".into(),
            synth_version: "0.1.0".into(),
            stages,
            providers,
        }
    }

    #[test]
    fn round_trips_through_toml_and_keeps_entries_apart() {
        let mut file = LockFile::default();
        file.upsert(lock("0123456789abcdef", "h1", &["gpt-4o-2024-08-06"]));
        let mut other = lock("fedcba", "h2", &[]);
        other.profile = Some("offline".into());
        file.upsert(other.clone());
        let text = file.to_text().unwrap();
        assert!(text.starts_with("# synth.lock"), "{text}");
        let back = LockFile::parse(&text).unwrap();
        assert_eq!(back, file);
        assert_eq!(back.find("p.toml", Some("offline")), Some(&other));
        assert_eq!(back.find("p.toml", None).unwrap().stages["src"].upstream[0].version(), "0123456789abcdef");
        // Replacing an entry keeps one per (file, profile).
        file.upsert(lock("aaaa", "h1", &[]));
        assert_eq!(file.pipelines.len(), 2);
    }

    #[test]
    fn changes_name_what_moved() {
        let old = lock("0123456789", "h1", &["gpt-4o-2024-08-06"]);
        assert!(changes(&old, &old).is_empty());
        let new = lock("abcdef0123", "h2", &["gpt-4o-2024-11-20"]);
        let c = changes(&old, &new);
        assert_eq!(c.upstream, vec!["src: org/data@main 01234567 → abcdef01"]);
        assert_eq!(c.files, vec!["src: prompts/a.j2 changed"]);
        assert_eq!(c.models, vec!["provider gpt: served gpt-4o-2024-08-06 → gpt-4o-2024-11-20"]);
        // A lock written before any run knows no served model: not a change.
        let unknown = lock("0123456789", "h1", &[]);
        assert!(changes(&unknown, &old).is_empty());
        let mut fewer = old.clone();
        fewer.stages.clear();
        assert_eq!(changes(&old, &fewer).stages, vec!["src: stage removed"]);
    }
}
