//! Hugging Face Hub datasets through hf-hub: resolve a revision to a commit (or use the
//! commit a lock pins), pick the data files of a config/split, download them into the
//! local cache (or reuse it), and fall back to the cache alone when the hub cannot be
//! reached. Publishing (one commit of many files, then a tag) is [`commit`].

pub mod commit;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use anyhow::{Context, Result, bail};
use hf_hub::api::tokio::{Api, ApiBuilder};
use hf_hub::{Cache, Repo, RepoType};
use serde::Deserialize;

/// A dataset (or model) on the hub, as configured in a `source` stage.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HubSpec {
    pub repo: String,
    #[serde(default = "default_revision")]
    pub revision: String,
    #[serde(default)]
    pub files: Option<Vec<String>>,
    #[serde(default)]
    pub config: Option<String>,
    #[serde(default)]
    pub split: Option<String>,
    #[serde(default = "default_repo_type")]
    pub repo_type: String,
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default)]
    pub cache_dir: Option<String>,
    #[serde(default = "default_token_env")]
    pub token_env: String,
}

fn default_revision() -> String {
    "main".into()
}
fn default_repo_type() -> String {
    "dataset".into()
}
fn default_token_env() -> String {
    "HF_TOKEN".into()
}

/// How to resolve a hub dataset.
#[derive(Debug, Clone, Copy, Default)]
pub struct Resolve<'a> {
    /// Only the local cache (dry runs, no network).
    pub offline_only: bool,
    /// Resolve the commit and select files, but download nothing.
    pub resolve_only: bool,
    /// Use this commit instead of the configured revision (`synth run --locked`).
    pub pin: Option<&'a str>,
}

/// Resolved files of a hub dataset, downloaded into the cache.
#[derive(Debug, Clone)]
pub struct HubFiles {
    pub commit: String,
    /// (path in the repo, local path)
    pub files: Vec<(String, PathBuf)>,
}

const DATA_EXTENSIONS: &[&str] = &[".parquet", ".jsonl", ".json", ".csv", ".tsv", ".ndjson"];

impl HubSpec {
    fn repo_type(&self) -> RepoType {
        match self.repo_type.as_str() {
            "model" => RepoType::Model,
            "space" => RepoType::Space,
            _ => RepoType::Dataset,
        }
    }

    fn cache(&self, root: &Path) -> Cache {
        match &self.cache_dir {
            Some(dir) => Cache::new(root.join(dir)),
            None => Cache::from_env(),
        }
    }

    /// Patterns that select data files: the configured `files`, or the usual hub
    /// layouts for `config`/`split`.
    pub fn patterns(&self) -> Vec<String> {
        if let Some(files) = &self.files {
            return files.clone();
        }
        let split = self.split.clone().unwrap_or_else(|| "train".into());
        let mut out = Vec::new();
        if let Some(config) = &self.config {
            out.push(format!("{config}/{split}-*"));
            out.push(format!("{config}/{split}/*"));
            out.push(format!("data/{config}/{split}-*"));
            out.push(format!("{config}/*{split}*"));
        }
        out.push(format!("data/{split}-*"));
        out.push(format!("data/{split}/*"));
        out.push(format!("{split}-*"));
        out.push(format!("{split}.*"));
        out
    }

    fn api(&self, root: &Path) -> Result<Api> {
        let mut builder = ApiBuilder::from_env().with_progress(false);
        if let Some(endpoint) = &self.endpoint {
            builder = builder.with_endpoint(endpoint.trim_end_matches('/').to_string());
        }
        if let Some(dir) = &self.cache_dir {
            builder = builder.with_cache_dir(root.join(dir));
        }
        let token = std::env::var(&self.token_env).ok().filter(|t| !t.is_empty());
        if token.is_some() {
            builder = builder.with_token(token);
        }
        builder.build().context("building the Hugging Face Hub client")
    }

    /// Resolve and download. With `offline_only`, or when the hub cannot be reached,
    /// use only what the local cache holds.
    pub async fn resolve(&self, root: &Path, offline_only: bool) -> Result<HubFiles> {
        self.resolve_with(root, &Resolve { offline_only, ..Default::default() }).await
    }

    /// Resolve the configured revision (or the pinned commit) to a commit and select the
    /// files; download them unless `resolve_only` (then the paths are where the cache
    /// would hold them). With `offline_only`, or when the hub cannot be reached, use only
    /// what the local cache holds.
    ///
    /// The future is boxed here so that hf-hub's download code is compiled once, in this
    /// crate: an `async fn` is compiled in each crate that awaits it, and four crates do.
    pub fn resolve_with<'a>(
        &'a self,
        root: &'a Path,
        how: &'a Resolve<'a>,
    ) -> Pin<Box<dyn Future<Output = Result<HubFiles>> + Send + 'a>> {
        Box::pin(self.resolve_here(root, how))
    }

    async fn resolve_here(&self, root: &Path, how: &Resolve<'_>) -> Result<HubFiles> {
        let revision = how.pin.unwrap_or(&self.revision).to_string();
        if how.offline_only {
            return self.resolve_from_cache(root, &revision);
        }
        let api = self.api(root)?;
        let repo = Repo::with_revision(self.repo.clone(), self.repo_type(), revision.clone());
        let info = match api.repo(repo).info().await {
            Ok(info) => info,
            Err(e) => {
                return self.resolve_from_cache(root, &revision).map_err(|cache_err| {
                    anyhow::anyhow!(
                        "cannot reach the hub for {} ({e}) and the local cache cannot serve it ({cache_err:#})",
                        self.repo
                    )
                });
            }
        };
        if let Some(pin) = how.pin
            && info.sha != pin
        {
            bail!("{} at commit {pin} answered as commit {}", self.repo, info.sha);
        }
        let names: Vec<String> = info.siblings.into_iter().map(|s| s.rfilename).collect();
        let selected = self.select(&names)?;
        let cache = self.cache(root);
        if how.resolve_only {
            let snapshot = cache
                .path()
                .join(Repo::with_revision(self.repo.clone(), self.repo_type(), info.sha.clone()).folder_name())
                .join("snapshots")
                .join(&info.sha);
            let files = selected.into_iter().map(|n| (n.clone(), snapshot.join(&n))).collect();
            return Ok(HubFiles { commit: info.sha, files });
        }
        // One process at a time downloads into a cache (hf-hub's cache writes its refs by
        // truncating them: shards of one machine reading a dataset together would race).
        let _held = lock_cache(&cache.path().join(format!(
            "{}.synth-lock",
            Repo::with_revision(self.repo.clone(), self.repo_type(), info.sha.clone()).folder_name()
        )))
        .await?;
        // Download at the resolved commit so every file comes from the same revision.
        let pinned = api.repo(Repo::with_revision(self.repo.clone(), self.repo_type(), info.sha.clone()));
        let mut files = Vec::new();
        for name in selected {
            let path = pinned
                .get(&name)
                .await
                .with_context(|| format!("downloading {name} from {}@{}", self.repo, info.sha))?;
            files.push((name, path));
        }
        // Remember which commit the configured revision pointed to, for offline re-runs.
        if how.pin.is_none() {
            let repo_dir = cache
                .path()
                .join(Repo::with_revision(self.repo.clone(), self.repo_type(), self.revision.clone()).folder_name());
            let _ = write_ref(&repo_dir.join("refs").join(&self.revision), &info.sha);
        }
        Ok(HubFiles { commit: info.sha, files })
    }

    fn select(&self, names: &[String]) -> Result<Vec<String>> {
        // Configured `files`: every pattern must match, and all their files are read.
        if let Some(files) = &self.files {
            let mut all = std::collections::BTreeSet::new();
            for pattern in files {
                let glob = globset::GlobBuilder::new(pattern)
                    .literal_separator(true)
                    .build()
                    .with_context(|| format!("bad file pattern \"{pattern}\""))?
                    .compile_matcher();
                let before = all.len();
                all.extend(names.iter().filter(|n| glob.is_match(n.as_str())).cloned());
                if all.len() == before && !names.iter().any(|n| glob.is_match(n.as_str())) {
                    bail!(
                        "no file of {} matches \"{pattern}\" (files in the repo: {})",
                        self.repo,
                        names.iter().take(20).cloned().collect::<Vec<_>>().join(", ")
                    );
                }
            }
            return Ok(all.into_iter().collect());
        }
        // Otherwise the usual layouts, the first that has data files.
        for pattern in self.patterns() {
            let glob = globset::GlobBuilder::new(&pattern)
                .literal_separator(true)
                .build()
                .with_context(|| format!("bad file pattern \"{pattern}\""))?
                .compile_matcher();
            let mut hits: Vec<String> = names
                .iter()
                .filter(|n| glob.is_match(n.as_str()) && DATA_EXTENSIONS.iter().any(|ext| n.ends_with(ext)))
                .cloned()
                .collect();
            if !hits.is_empty() {
                hits.sort();
                return Ok(hits);
            }
        }
        bail!(
            "no data file of {} matches {} (files in the repo: {})",
            self.repo,
            self.patterns().join(", "),
            names.iter().take(20).cloned().collect::<Vec<_>>().join(", ")
        )
    }

    /// Serve from the standard hub cache layout: refs/<revision> -> snapshots/<commit>/...
    fn resolve_from_cache(&self, root: &Path, revision: &str) -> Result<HubFiles> {
        let cache = self.cache(root);
        let repo = Repo::with_revision(self.repo.clone(), self.repo_type(), revision.to_string());
        let repo_dir = cache.path().join(repo.folder_name());
        let commit = if is_commit(revision) {
            revision.to_string()
        } else {
            let ref_path = repo_dir.join("refs").join(revision);
            std::fs::read_to_string(&ref_path)
                .with_context(|| format!("{} is not in the local cache ({})", self.repo, ref_path.display()))?
                .trim()
                .to_string()
        };
        let snapshot = repo_dir.join("snapshots").join(&commit);
        let mut names = Vec::new();
        let mut stack = vec![snapshot.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(read) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in read.flatten() {
                let p = entry.path();
                if p.is_dir() {
                    stack.push(p);
                } else if let Ok(rel) = p.strip_prefix(&snapshot) {
                    names.push(rel.to_string_lossy().to_string());
                }
            }
        }
        if names.is_empty() {
            bail!("{}@{commit} has no files in the local cache ({})", self.repo, snapshot.display());
        }
        let selected = self.select(&names)?;
        let files = selected.into_iter().map(|n| (n.clone(), snapshot.join(&n))).collect();
        Ok(HubFiles { commit, files })
    }
}

/// Point a cache ref at `commit`, never leaving it empty or half written: a shard's dry run
/// reads it without the cache's lock while another shard re-resolves the same revision
/// (hf-hub's own `create_ref` truncates then writes, and such a reader saw an empty ref). An
/// unchanged ref is not written at all.
fn write_ref(path: &Path, commit: &str) -> std::io::Result<()> {
    if std::fs::read_to_string(path).is_ok_and(|old| old.trim() == commit) {
        return Ok(());
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp =
        dir.join(format!(".{}.{}.tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("ref"), std::process::id()));
    std::fs::write(&tmp, commit)?;
    std::fs::rename(&tmp, path)
}

fn is_commit(rev: &str) -> bool {
    rev.len() == 40 && rev.chars().all(|c| c.is_ascii_hexdigit())
}

/// An exclusive OS lock on `path` (created), held until the file is dropped.
async fn lock_cache(path: &Path) -> Result<std::fs::File> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || -> Result<std::fs::File> {
        // (`store::lease::open_lock_file` does the same; the hub is a leaf below the store.)
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        file.lock().with_context(|| format!("locking {}", path.display()))?;
        Ok(file)
    })
    .await
    .context("cache lock panicked")?
}

/// A GGUF file in a Hugging Face model repository.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct HubModel {
    pub repo: String,
    pub file: String,
    #[serde(default = "main_revision")]
    pub revision: String,
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default)]
    pub cache_dir: Option<String>,
}

fn main_revision() -> String {
    "main".into()
}

impl HubModel {
    /// The model repository as the hub code resolves it (one file, `repo_type = "model"`).
    pub fn spec(&self) -> HubSpec {
        HubSpec {
            repo: self.repo.clone(),
            revision: self.revision.clone(),
            files: Some(vec![self.file.clone()]),
            config: None,
            split: None,
            repo_type: "model".into(),
            endpoint: self.endpoint.clone(),
            cache_dir: self.cache_dir.clone(),
            token_env: "HF_TOKEN".into(),
        }
    }
}

/// Whether a file starts with GGUF's magic bytes.
pub fn is_gguf(path: &Path) -> std::io::Result<bool> {
    use std::io::Read;
    let mut magic = [0u8; 4];
    let mut f = std::fs::File::open(path)?;
    Ok(f.read_exact(&mut magic).is_ok() && &magic == b"GGUF")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refs_are_replaced_whole_and_left_alone_when_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("refs/pr/1");
        write_ref(&path, "a".repeat(40).as_str()).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a".repeat(40));
        let before = std::fs::metadata(&path).unwrap().modified().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        write_ref(&path, &"a".repeat(40)).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().modified().unwrap(), before, "an unchanged ref is not rewritten");
        write_ref(&path, &"b".repeat(40)).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "b".repeat(40));
        let names: Vec<_> =
            std::fs::read_dir(path.parent().unwrap()).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(names.len(), 1, "no temporary file is left: {names:?}");
    }

    fn spec(files: Option<Vec<&str>>, config: Option<&str>, split: Option<&str>) -> HubSpec {
        HubSpec {
            repo: "a/b".into(),
            revision: "main".into(),
            files: files.map(|f| f.into_iter().map(String::from).collect()),
            config: config.map(String::from),
            split: split.map(String::from),
            repo_type: "dataset".into(),
            endpoint: None,
            cache_dir: None,
            token_env: "HF_TOKEN".into(),
        }
    }

    #[test]
    fn selects_config_split_files() {
        let names: Vec<String> = [
            "README.md",
            "v2.1/train-00000-of-00002.parquet",
            "v2.1/train-00001-of-00002.parquet",
            "v2.1/validation-00000-of-00001.parquet",
            "v1.1/train-00000-of-00001.parquet",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let s = spec(None, Some("v2.1"), Some("train"));
        assert_eq!(
            s.select(&names).unwrap(),
            vec!["v2.1/train-00000-of-00002.parquet", "v2.1/train-00001-of-00002.parquet"]
        );
        let s = spec(Some(vec!["persona.jsonl"]), None, None);
        assert!(s.select(&names).is_err());
    }
}
