//! Immutable snapshots of a pipeline's releases: `snapshots/<UTC date>-<fingerprint>/`
//! with the export files (hard links: synth only ever replaces output files, never
//! edits them), the card with its changelog, the run's manifest, the lock, and a row
//! index per data export (`_synth/rows/`, for diffs by stable id). A snapshot is built
//! in a hidden folder and renamed into place complete; `latest` is a symlink moved by
//! an atomic rename, last.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};

use super::config::Export;
use super::diff::{ChangelogEntry, DiffCounts, DiffIds, RowIndex, changelog_markdown, diff};
use synth_core::store::atomic::write_atomic;
use synth_core::store::lock::{LockFile, PipelineLock};
use synth_core::store::state::Manifest;

pub const LATEST: &str = "latest";
const INTERNAL: &str = "_synth";
const CHANGELOG: &str = "changelog.json";
/// Changelog entries shown in a card (all are kept in `_synth/changelog.json`).
const CARD_ENTRIES: usize = 20;

/// One export in a snapshot.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ExportMeta {
    pub stage: String,
    pub files: Vec<String>,
    /// The data file its rows were indexed from (the diff's label), when it has ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub indexed: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<u64>,
}

/// What a snapshot is, stored under `"snapshot"` in its `manifest.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SnapshotMeta {
    pub id: String,
    pub created_at: String,
    /// Hash of the export stages' fingerprints: equal fingerprints, equal release.
    pub fingerprint: String,
    pub pipeline: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    pub exports: Vec<ExportMeta>,
    /// This release's changelog entry (what moved, rows added / removed / changed).
    pub changelog: ChangelogEntry,
}

/// Where a snapshot was published, stored under `"release"` in its `manifest.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Publication {
    pub repo: String,
    pub repo_type: String,
    pub branch: String,
    pub commit: String,
    #[serde(default)]
    pub parent: Option<String>,
    #[serde(default)]
    pub tag: Option<String>,
    pub url: String,
    pub published_at: String,
    /// Files of the commit (what a later release deletes when it no longer has them).
    #[serde(default)]
    pub files: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct Snapshot {
    pub path: PathBuf,
    pub meta: SnapshotMeta,
    pub release: Option<Publication>,
}

impl Snapshot {
    pub fn id(&self) -> &str {
        &self.meta.id
    }

    fn load(path: &Path) -> Result<Snapshot> {
        let m = path.join(synth_core::store::state::MANIFEST);
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&m).with_context(|| format!("reading {}", m.display()))?)
                .with_context(|| format!("{}: not JSON", m.display()))?;
        let meta = serde_json::from_value(v.get("snapshot").cloned().unwrap_or_default())
            .with_context(|| format!("{}: no snapshot section", m.display()))?;
        let release = v.get("release").cloned().and_then(|r| serde_json::from_value(r).ok());
        Ok(Snapshot { path: path.to_path_buf(), meta, release })
    }

    /// The lock the snapshot carries.
    pub fn lock(&self) -> Option<PipelineLock> {
        LockFile::load(&self.path.join(synth_core::store::lock::LOCK_FILE)).ok()?.pipelines.into_iter().next()
    }

    fn index(&self, stage: &str) -> Option<RowIndex> {
        RowIndex::read(&index_path(&self.path, stage)).ok()
    }

    fn changelog(&self) -> Vec<ChangelogEntry> {
        std::fs::read(self.path.join(INTERNAL).join(CHANGELOG))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    pub fn published_to(&self, repo: &str, branch: &str) -> bool {
        self.release.as_ref().is_some_and(|r| r.repo == repo && r.branch == branch)
    }
}

fn index_path(snapshot: &Path, stage: &str) -> PathBuf {
    snapshot.join(INTERNAL).join("rows").join(format!("{stage}.parquet"))
}

/// The export diffs between two snapshots: per export label, counts and ids.
pub fn compare(old: Option<&Snapshot>, new: &Snapshot) -> BTreeMap<String, (DiffCounts, DiffIds)> {
    let mut out = BTreeMap::new();
    for e in &new.meta.exports {
        let (Some(label), Some(index)) = (&e.indexed, new.index(&e.stage)) else { continue };
        let previous = old.and_then(|o| o.index(&e.stage)).unwrap_or_default();
        out.insert(label.clone(), diff(&previous, &index));
    }
    out
}

/// What a new snapshot is made of.
pub struct NewSnapshot<'a> {
    pub out_dir: &'a Path,
    pub manifest: &'a Manifest,
    pub exports: &'a [Export],
    /// The card among the export files (relative to the output directory).
    pub card: Option<String>,
    pub lock: &'a PipelineLock,
    pub fingerprint: String,
    /// What moved since the previous release.
    pub changes: Vec<String>,
    pub previous: Option<&'a Snapshot>,
}

/// The snapshots folder of one output directory.
pub struct Snapshots {
    pub dir: PathBuf,
}

impl Snapshots {
    pub fn new(dir: PathBuf) -> Snapshots {
        Snapshots { dir }
    }

    /// Every complete snapshot, oldest first.
    pub fn list(&self) -> Result<Vec<Snapshot>> {
        let mut out = Vec::new();
        let Ok(read) = std::fs::read_dir(&self.dir) else { return Ok(out) };
        for entry in read.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if name.starts_with('.') || name == LATEST || !entry.path().is_dir() {
                continue;
            }
            match Snapshot::load(&entry.path()) {
                Ok(s) => out.push(s),
                Err(e) => tracing::warn!("{}: skipped ({e:#})", entry.path().display()),
            }
        }
        out.sort_by(|a, b| (&a.meta.created_at, &a.meta.id).cmp(&(&b.meta.created_at, &b.meta.id)));
        Ok(out)
    }

    pub fn get(&self, id: &str) -> Result<Snapshot> {
        let path = self.dir.join(id);
        if id == LATEST {
            return self.latest()?.ok_or_else(|| anyhow!("{}: no latest snapshot yet", self.dir.display()));
        }
        if !path.is_dir() {
            let ids: Vec<String> = self.list()?.iter().map(|s| s.meta.id.clone()).collect();
            bail!(
                "no snapshot \"{id}\" in {} (snapshots: {})",
                self.dir.display(),
                if ids.is_empty() { "none".into() } else { ids.join(", ") }
            );
        }
        Snapshot::load(&path)
    }

    /// The snapshot `latest` points to.
    pub fn latest(&self) -> Result<Option<Snapshot>> {
        let link = self.dir.join(LATEST);
        match std::fs::read_link(&link) {
            Ok(target) => {
                let path = if target.is_absolute() { target } else { self.dir.join(target) };
                Snapshot::load(&path).map(Some)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", link.display())),
        }
    }

    /// Point `latest` at `id` (a relative symlink swapped in by rename).
    pub fn set_latest(&self, id: &str) -> Result<()> {
        let tmp = self.dir.join(format!(".{LATEST}-{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        symlink(Path::new(id), &tmp).with_context(|| format!("creating {}", tmp.display()))?;
        std::fs::rename(&tmp, self.dir.join(LATEST))
            .with_context(|| format!("moving {}", self.dir.join(LATEST).display()))?;
        sync_dir(&self.dir);
        Ok(())
    }

    /// Build a snapshot in a hidden folder and rename it into place. An existing
    /// snapshot of the same id (same day, same fingerprint) is returned as it is.
    pub fn create(&self, new: NewSnapshot<'_>) -> Result<Snapshot> {
        // Milliseconds: snapshots made within one second still sort in order.
        let created_at = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
        let id = format!("{}-{}", &created_at[..10], &new.fingerprint[..8]);
        let dest = self.dir.join(&id);
        if dest.join(synth_core::store::state::MANIFEST).exists() {
            return Snapshot::load(&dest);
        }
        std::fs::create_dir_all(&self.dir).with_context(|| format!("creating {}", self.dir.display()))?;
        let tmp = self.dir.join(format!(".tmp-{id}-{}", std::process::id()));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp)?;
        }
        let result = self.fill(&tmp, &id, &created_at, &new);
        if let Err(e) = result {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
        if dest.exists() {
            // A half-built folder of an earlier crash under the final name: never trusted.
            std::fs::remove_dir_all(&dest)?;
        }
        std::fs::rename(&tmp, &dest).with_context(|| format!("moving the snapshot into {}", dest.display()))?;
        sync_dir(&self.dir);
        Snapshot::load(&dest)
    }

    fn fill(&self, tmp: &Path, id: &str, created_at: &str, new: &NewSnapshot<'_>) -> Result<()> {
        let mut metas = Vec::new();
        let mut entry = ChangelogEntry {
            snapshot: id.to_string(),
            created_at: created_at.to_string(),
            previous: new.previous.map(|p| p.meta.id.clone()),
            changes: new.changes.clone(),
            ..Default::default()
        };
        for e in new.exports {
            for f in &e.files {
                link_or_copy(&new.out_dir.join(f), &tmp.join(f))?;
            }
            // The data file rows are compared in: the first Parquet / JSONL output.
            let data = e.files.iter().find(|f| f.ends_with(".parquet") || f.ends_with(".jsonl"));
            // A sink's rows are keyed by the table it wrote from when the file has no ids.
            let input =
                e.input.as_ref().filter(|_| e.is_sink).map(|i| synth_engine::stages::output_path(new.out_dir, i));
            let index = match data {
                Some(f) if f.ends_with(".parquet") => RowIndex::of_parquet(&new.out_dir.join(f), input.as_deref())?,
                Some(f) => RowIndex::of_jsonl(&new.out_dir.join(f), input.as_deref())?,
                None => None,
            };
            let mut meta = ExportMeta { stage: e.stage.clone(), files: e.files.clone(), indexed: None, rows: None };
            match (data, index) {
                (Some(label), Some(index)) => {
                    index.write(&index_path(tmp, &e.stage))?;
                    let previous = new.previous.and_then(|p| p.index(&e.stage)).unwrap_or_default();
                    entry.diff.insert(label.clone(), diff(&previous, &index).0);
                    meta.indexed = Some(label.clone());
                    meta.rows = Some(index.rows.len() as u64);
                }
                (Some(label), None) => entry.unindexed.push(label.clone()),
                _ => {}
            }
            metas.push(meta);
        }
        let mut changelog = vec![entry.clone()];
        changelog.extend(new.previous.map(|p| p.changelog()).unwrap_or_default().into_iter().take(99));
        write_atomic(&tmp.join(INTERNAL).join(CHANGELOG), &serde_json::to_vec_pretty(&changelog)?)?;
        // The card, with the changelog appended, as README.md at the top.
        let card = match &new.card {
            Some(rel) => {
                // Written over the hard link below (a rename): the output's card is untouched.
                std::fs::read_to_string(new.out_dir.join(rel)).with_context(|| format!("reading the card {rel}"))?
            }
            None => format!(
                "# {}\n\nA release of the `{}` pipeline, written by synth {}. `manifest.json` lists how every file was made; `synth.lock` pins the upstreams it was built from.\n",
                new.manifest.pipeline.name,
                new.manifest.pipeline.path,
                env!("CARGO_PKG_VERSION")
            ),
        };
        write_atomic(
            &tmp.join("README.md"),
            format!("{}{}", card.trim_end(), changelog_markdown(&changelog, CARD_ENTRIES)).as_bytes(),
        )?;
        LockFile::single(new.lock.clone()).save(&tmp.join(synth_core::store::lock::LOCK_FILE))?;
        let meta = SnapshotMeta {
            id: id.to_string(),
            created_at: created_at.to_string(),
            fingerprint: new.fingerprint.clone(),
            pipeline: new.manifest.pipeline.name.clone(),
            profile: new.manifest.profile.clone(),
            exports: metas,
            changelog: entry,
        };
        let mut manifest = serde_json::to_value(new.manifest)?;
        manifest["snapshot"] = serde_json::to_value(&meta)?;
        write_atomic(&tmp.join(synth_core::store::state::MANIFEST), &serde_json::to_vec_pretty(&manifest)?)?;
        Ok(())
    }

    /// Record where a snapshot was published (its manifest gains `"release"`).
    pub fn record_publication(&self, snapshot: &Snapshot, publication: &Publication) -> Result<()> {
        let path = snapshot.path.join(synth_core::store::state::MANIFEST);
        let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
        v["release"] = serde_json::to_value(publication)?;
        write_atomic(&path, &serde_json::to_vec_pretty(&v)?)
    }

    /// Remove all but the newest `keep` snapshots (never the one `latest` points to) and
    /// debris of interrupted builds. Returns the removed ids.
    pub fn gc(&self, keep: usize, dry_run: bool) -> Result<Vec<String>> {
        let all = self.list()?;
        let latest = self.latest()?.map(|s| s.meta.id);
        let n = all.len();
        let mut removed = Vec::new();
        for (i, s) in all.iter().enumerate() {
            let newest = i + keep >= n;
            if newest || latest.as_deref() == Some(s.id()) {
                continue;
            }
            removed.push(s.meta.id.clone());
            if !dry_run {
                // Renamed away first, so a half-removed snapshot never looks complete.
                let trash = self.dir.join(format!(".trash-{}-{}", s.meta.id, std::process::id()));
                std::fs::rename(&s.path, &trash).with_context(|| format!("removing {}", s.path.display()))?;
                std::fs::remove_dir_all(&trash).with_context(|| format!("removing {}", trash.display()))?;
            }
        }
        if !dry_run && let Ok(read) = std::fs::read_dir(&self.dir) {
            for entry in read.flatten() {
                let name = entry.file_name().to_string_lossy().to_string();
                if (name.starts_with(".tmp-") || name.starts_with(".trash-")) && entry.path().is_dir() {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        Ok(removed)
    }
}

/// A hard link when possible (same file system), else a copy.
fn link_or_copy(src: &Path, dst: &Path) -> Result<()> {
    if let Some(parent) = dst.parent() {
        std::fs::create_dir_all(parent)?;
    }
    if std::fs::hard_link(src, dst).is_ok() {
        return Ok(());
    }
    std::fs::copy(src, dst).with_context(|| format!("copying {} into the snapshot", src.display()))?;
    Ok(())
}

#[cfg(unix)]
fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

#[cfg(not(unix))]
fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::windows::fs::symlink_dir(target, link)
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}
