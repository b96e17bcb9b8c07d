//! Where a run's outputs and state live: a local directory, written in place as it
//! always was, or an object store (`s3://bucket/prefix`, `gs://`, `az://`, `file://`,
//! `memory://`, through the `object_store` crate) worked on through a local mirror
//! directory. Stages only ever read and write local files; the runner asks this store
//! to fetch a committed file before reading it and to publish a file right after
//! committing it locally, in the commit protocol's order (failures, outputs, state
//! record, manifest), so the remote state is always a prefix of that order. Each
//! object is written whole by one PUT (a reader never sees half of one). Markers are
//! written create-only (`PutMode::Create`; a local directory: a hard link, which
//! fails when the name exists), and leases are updated conditionally on the version
//! they read (`PutMode::Update`, an ETag match; `store::lease`).
//!
//! The mirror remembers which version (ETag) of each object it holds
//! (`_synth/mirror.json`), so a file is downloaded only when the object changed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, anyhow, bail};
use futures::TryStreamExt;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use serde::{Deserialize, Serialize};

use super::atomic::{create_tmp, finish_file, write_atomic};
use super::state::INTERNAL_DIR;

/// Objects at least this large are uploaded in parts.
const MULTIPART_BYTES: u64 = 32 << 20;
const PART_BYTES: usize = 16 << 20;

/// A run's state: a local directory, or an object store prefix with a local mirror.
#[derive(Clone)]
pub struct StateStore {
    dir: PathBuf,
    remote: Option<Arc<Remote>>,
}

struct Remote {
    store: Arc<dyn ObjectStore>,
    prefix: ObjPath,
    url: String,
    /// A `file://` store: its directory (leases there are OS locks, since the local
    /// file system cannot update conditionally).
    local_root: Option<PathBuf>,
    /// What the mirror holds: object path (relative) → (size, e_tag).
    index: Mutex<MirrorIndex>,
    /// Bytes sent and received (for `synth stats` and the benchmarks).
    moved: Arc<Moved>,
}

/// Bytes moved to and from the object store.
#[derive(Default, Debug)]
pub struct Moved {
    pub up: std::sync::atomic::AtomicU64,
    pub down: std::sync::atomic::AtomicU64,
}

#[derive(Default, Serialize, Deserialize)]
struct MirrorIndex {
    files: BTreeMap<String, Held>,
}

#[derive(Clone, Serialize, Deserialize, PartialEq)]
struct Held {
    size: u64,
    e_tag: Option<String>,
}

/// The version of an object a conditional update must match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    e_tag: Option<String>,
    version: Option<String>,
}

/// What a conditional write found.
#[derive(Debug)]
pub enum Conditional {
    Done(Version),
    /// Someone else wrote first (the object exists, or changed since it was read).
    Lost,
}

const MIRROR_INDEX: &str = "mirror.json";

/// Make a local mirror directory ready and read its index (what it holds of the store;
/// empty when new or unreadable: files are then fetched again).
fn open_mirror(dir: &Path) -> Result<MirrorIndex> {
    std::fs::create_dir_all(dir.join(INTERNAL_DIR))
        .with_context(|| format!("creating the work directory {}", dir.display()))?;
    Ok(std::fs::read(dir.join(INTERNAL_DIR).join(MIRROR_INDEX))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default())
}

impl StateStore {
    /// A local directory (the default: `--out DIR`).
    pub fn local(dir: &Path) -> StateStore {
        StateStore { dir: dir.to_path_buf(), remote: None }
    }

    /// An object store URL, worked on through the local directory `mirror`; credentials,
    /// endpoint and region from the environment, as the providers' SDKs read them
    /// (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT`, `GOOGLE_SERVICE_ACCOUNT`, ...).
    pub fn open(url: &str, mirror: &Path) -> Result<StateStore> {
        Self::open_with(url, mirror, std::env::vars())
    }

    /// [`StateStore::open`] with the store's options given (`aws_endpoint`, ...).
    pub fn open_with(
        url: &str,
        mirror: &Path,
        options: impl IntoIterator<Item = (String, String)>,
    ) -> Result<StateStore> {
        let parsed = url::Url::parse(url).map_err(|e| anyhow!("--state {url}: not a URL ({e})"))?;
        let (store, prefix, local_root): (Arc<dyn ObjectStore>, ObjPath, Option<PathBuf>) = match parsed.scheme() {
            "file" => {
                let dir = parsed.to_file_path().map_err(|_| anyhow!("--state {url}: not a local path"))?;
                std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
                let fs = object_store::local::LocalFileSystem::new_with_prefix(&dir)
                    .with_context(|| format!("--state {url}"))?;
                (Arc::new(fs), ObjPath::from(""), Some(dir))
            }
            "memory" => (Arc::new(object_store::memory::InMemory::new()), ObjPath::from(parsed.path()), None),
            "s3" | "s3a" | "gs" | "az" | "abfs" | "abfss" | "azure" | "http" | "https" => {
                let (store, path) =
                    object_store::parse_url_opts(&parsed, options).map_err(|e| anyhow!("--state {url}: {e}"))?;
                (Arc::from(store), path, None)
            }
            other => bail!("--state {url}: unknown scheme \"{other}\" (s3://, gs://, az://, file://)"),
        };
        let index = open_mirror(mirror)?;
        Ok(StateStore {
            dir: mirror.to_path_buf(),
            remote: Some(Arc::new(Remote {
                store,
                prefix,
                url: url.trim_end_matches('/').to_string(),
                local_root,
                index: Mutex::new(index),
                moved: Arc::default(),
            })),
        })
    }

    /// The same store under `rel` (a shard's prefix), worked on in `dir`.
    pub fn child(&self, rel: &str, dir: &Path) -> Result<StateStore> {
        match &self.remote {
            None => Ok(StateStore::local(&self.dir.join(rel))),
            Some(r) => {
                let index = open_mirror(dir)?;
                Ok(StateStore {
                    dir: dir.to_path_buf(),
                    remote: Some(Arc::new(Remote {
                        store: r.store.clone(),
                        prefix: join(&r.prefix, rel),
                        url: format!("{}/{}", r.url, rel.trim_matches('/')),
                        local_root: r.local_root.as_ref().map(|d| d.join(rel)),
                        index: Mutex::new(index),
                        moved: r.moved.clone(),
                    })),
                })
            }
        }
    }

    /// The local directory stages work in: the output directory itself, or the mirror.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn is_remote(&self) -> bool {
        self.remote.is_some()
    }

    /// The state's address for messages: the directory or the URL.
    pub fn display(&self) -> String {
        match &self.remote {
            None => self.dir.display().to_string(),
            Some(r) => r.url.clone(),
        }
    }

    /// `file://` stores and local directories: the directory holding the objects.
    pub fn local_root(&self) -> Option<PathBuf> {
        match &self.remote {
            None => Some(self.dir.clone()),
            Some(r) => r.local_root.clone(),
        }
    }

    /// Bytes uploaded and downloaded so far (zero for a local directory).
    pub fn moved(&self) -> (u64, u64) {
        match &self.remote {
            None => (0, 0),
            Some(r) => (
                r.moved.up.load(std::sync::atomic::Ordering::Relaxed),
                r.moved.down.load(std::sync::atomic::Ordering::Relaxed),
            ),
        }
    }

    fn path_of(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    /// Bring the run's records into the mirror: the manifest and every state record
    /// (small files; data files are fetched when a stage reads them).
    pub async fn pull_state(&self) -> Result<()> {
        let Some(_) = &self.remote else { return Ok(()) };
        let state_dir = format!("{INTERNAL_DIR}/state/");
        let listed = self.list(&state_dir).await?;
        // A record the remote no longer has must not survive in the mirror.
        if let Ok(read) = std::fs::read_dir(self.path_of(&state_dir)) {
            for e in read.flatten() {
                let rel = format!("{state_dir}{}", e.file_name().to_string_lossy());
                if !listed.iter().any(|(r, _)| *r == rel) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        for (rel, _) in &listed {
            self.fetch(rel).await?;
        }
        if self.size(super::state::MANIFEST).await?.is_some() {
            self.fetch(super::state::MANIFEST).await?;
        }
        self.pull_cache().await
    }

    /// Bring the stored cache into the mirror: as it is when the mirror has none, else
    /// merged into the local one when another machine uploaded a newer copy (entries
    /// are content-addressed: merging never conflicts).
    pub async fn pull_cache(&self) -> Result<()> {
        let Some(r) = &self.remote else { return Ok(()) };
        let rel = format!("{INTERNAL_DIR}/{}", super::cache::CACHE_FILE);
        let meta = match r.store.head(&join(&r.prefix, &rel)).await {
            Ok(m) => m,
            Err(object_store::Error::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e).with_context(|| format!("reading {}/{rel}", r.url)),
        };
        let want = Held { size: meta.size, e_tag: meta.e_tag.clone() };
        let live = self.path_of(&rel);
        if live.exists() && r.index.lock().expect("mirror index").files.get(&rel) == Some(&want) {
            return Ok(());
        }
        let downloaded = format!("{INTERNAL_DIR}/cache.remote.sqlite");
        let tmp = self.fetch_as(&rel, &downloaded).await?;
        if live.exists() {
            let added = super::cache::import(&self.dir.join(INTERNAL_DIR), &tmp)?;
            tracing::info!("merged {added} response(s) from the stored cache of {} into the local one", r.url);
            let _ = std::fs::remove_file(&tmp);
        } else {
            std::fs::rename(&tmp, &live).with_context(|| format!("moving {} into place", tmp.display()))?;
        }
        self.remember(&rel, want)
    }

    /// Download `rel` into the mirror under another name (not remembered).
    async fn fetch_as(&self, rel: &str, local_rel: &str) -> Result<PathBuf> {
        let r = self.remote.as_ref().expect("remote");
        let local = self.path_of(local_rel);
        let (mut file, pending) = create_tmp(&local)?;
        let mut stream = r
            .store
            .get(&join(&r.prefix, rel))
            .await
            .with_context(|| format!("downloading {}/{rel}", r.url))?
            .into_stream();
        let mut n = 0u64;
        while let Some(chunk) = stream.try_next().await.with_context(|| format!("downloading {}/{rel}", r.url))? {
            use std::io::Write;
            file.write_all(&chunk).with_context(|| format!("writing {}", pending.tmp.display()))?;
            n += chunk.len() as u64;
        }
        finish_file(file, &pending)?;
        pending.commit()?;
        r.moved.down.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        Ok(local)
    }

    /// Make sure the local copy of a committed file is the stored one; its local path.
    pub async fn fetch(&self, rel: &str) -> Result<PathBuf> {
        let local = self.path_of(rel);
        let Some(r) = &self.remote else { return Ok(local) };
        let loc = join(&r.prefix, rel);
        let meta = match r.store.head(&loc).await {
            Ok(m) => m,
            Err(object_store::Error::NotFound { .. }) => bail!("{}/{rel} does not exist", r.url),
            Err(e) => return Err(e).with_context(|| format!("reading {}/{rel}", r.url)),
        };
        let want = Held { size: meta.size, e_tag: meta.e_tag.clone() };
        let have = r.index.lock().expect("mirror index").files.get(rel).cloned();
        let size_ok = std::fs::metadata(&local).map(|m| m.len() == meta.size).unwrap_or(false);
        if have.as_ref() == Some(&want) && size_ok {
            return Ok(local);
        }
        self.fetch_as(rel, rel).await?;
        self.remember(rel, want)?;
        Ok(local)
    }

    fn remember(&self, rel: &str, held: Held) -> Result<()> {
        let Some(r) = &self.remote else { return Ok(()) };
        let bytes = {
            let mut index = r.index.lock().expect("mirror index");
            index.files.insert(rel.to_string(), held);
            serde_json::to_vec(&*index)?
        };
        write_atomic(&self.dir.join(INTERNAL_DIR).join(MIRROR_INDEX), &bytes)
    }

    /// Upload a file just committed locally (a local directory: nothing to do).
    pub async fn publish(&self, rel: &str) -> Result<()> {
        self.publish_as(&self.path_of(rel), rel).await
    }

    /// Upload the local file `local` as `rel` (a snapshot taken beside a live file).
    pub async fn publish_as(&self, local: &Path, rel: &str) -> Result<()> {
        let Some(r) = &self.remote else { return Ok(()) };
        let local = local.to_path_buf();
        let loc = join(&r.prefix, rel);
        let size = std::fs::metadata(&local).with_context(|| format!("reading {}", local.display()))?.len();
        let result = if size >= MULTIPART_BYTES {
            let upload = r.store.put_multipart(&loc).await.with_context(|| format!("uploading {}/{rel}", r.url))?;
            let mut w = object_store::WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
            let mut f = std::fs::File::open(&local).with_context(|| format!("reading {}", local.display()))?;
            let mut buf = vec![0u8; 1 << 20];
            loop {
                use std::io::Read;
                let k = f.read(&mut buf).with_context(|| format!("reading {}", local.display()))?;
                if k == 0 {
                    break;
                }
                w.wait_for_capacity(4).await.with_context(|| format!("uploading {}/{rel}", r.url))?;
                w.write(&buf[..k]);
            }
            w.finish().await.with_context(|| format!("uploading {}/{rel}", r.url))?
        } else {
            let bytes = std::fs::read(&local).with_context(|| format!("reading {}", local.display()))?;
            r.store.put(&loc, PutPayload::from(bytes)).await.with_context(|| format!("uploading {}/{rel}", r.url))?
        };
        r.moved.up.fetch_add(size, std::sync::atomic::Ordering::Relaxed);
        self.remember(rel, Held { size, e_tag: result.e_tag })
    }

    /// Remove a committed file (locally, and from the store).
    pub async fn remove(&self, rel: &str) -> Result<()> {
        let local = self.path_of(rel);
        if local.exists() {
            std::fs::remove_file(&local).with_context(|| format!("removing stale {}", local.display()))?;
        }
        let Some(r) = &self.remote else { return Ok(()) };
        match r.store.delete(&join(&r.prefix, rel)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}/{rel}", r.url)),
        }
        r.index.lock().expect("mirror index").files.remove(rel);
        Ok(())
    }

    /// Remove every object under `rel_prefix` (a folder).
    pub async fn remove_all(&self, rel_prefix: &str) -> Result<()> {
        let rel_prefix = format!("{}/", rel_prefix.trim_end_matches('/'));
        if self.remote.is_none() {
            let dir = self.path_of(&rel_prefix);
            return match std::fs::remove_dir_all(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(e).with_context(|| format!("removing {}", dir.display()))
                }
                _ => Ok(()),
            };
        }
        for (rel, _) in self.list(&rel_prefix).await? {
            self.remove(&rel).await?;
        }
        Ok(())
    }

    /// Size of a committed file, `None` when there is none.
    pub async fn size(&self, rel: &str) -> Result<Option<u64>> {
        match &self.remote {
            None => Ok(std::fs::metadata(self.path_of(rel)).ok().map(|m| m.len())),
            Some(r) => match r.store.head(&join(&r.prefix, rel)).await {
                Ok(m) => Ok(Some(m.size)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e).with_context(|| format!("reading {}/{rel}", r.url)),
            },
        }
    }

    /// The footer metadata of a committed Parquet file (`None`: missing or unreadable),
    /// read from the mirror when it holds the stored version, else by two range reads.
    pub async fn parquet_meta(&self, rel: &str) -> Option<BTreeMap<String, String>> {
        let from_file = |p: &Path| {
            super::parquet::read_footer(p).ok().map(|f| f.meta.into_iter().collect::<BTreeMap<String, String>>())
        };
        let Some(r) = &self.remote else { return from_file(&self.path_of(rel)) };
        let loc = join(&r.prefix, rel);
        let meta = r.store.head(&loc).await.ok()?;
        let have = r.index.lock().expect("mirror index").files.get(rel).cloned();
        if have == Some(Held { size: meta.size, e_tag: meta.e_tag.clone() })
            && std::fs::metadata(self.path_of(rel)).map(|m| m.len() == meta.size).unwrap_or(false)
        {
            return from_file(&self.path_of(rel));
        }
        if meta.size < 12 {
            return None;
        }
        let tail = r.store.get_range(&loc, meta.size - 8..meta.size).await.ok()?;
        if &tail[4..] != b"PAR1" {
            return None;
        }
        let len = u32::from_le_bytes(tail[..4].try_into().ok()?) as u64;
        if len + 8 > meta.size {
            return None;
        }
        let footer = r.store.get_range(&loc, meta.size - 8 - len..meta.size - 8).await.ok()?;
        r.moved.down.fetch_add(8 + len, std::sync::atomic::Ordering::Relaxed);
        let md = parquet::file::metadata::ParquetMetaDataReader::decode_metadata(&footer).ok()?;
        Some(
            md.file_metadata()
                .key_value_metadata()
                .map(|kvs| kvs.iter().filter_map(|kv| Some((kv.key.clone(), kv.value.clone()?))).collect())
                .unwrap_or_default(),
        )
    }

    /// A small object's bytes (`None`: there is none).
    pub async fn read(&self, rel: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.read_versioned(rel).await?.map(|(b, _)| b))
    }

    /// A small object's bytes and version.
    pub async fn read_versioned(&self, rel: &str) -> Result<Option<(Vec<u8>, Version)>> {
        match &self.remote {
            None => match std::fs::read(self.path_of(rel)) {
                Ok(b) => Ok(Some((b, Version { e_tag: None, version: None }))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e).with_context(|| format!("reading {}", self.path_of(rel).display())),
            },
            Some(r) => match r.store.get(&join(&r.prefix, rel)).await {
                Ok(got) => {
                    let v = Version { e_tag: got.meta.e_tag.clone(), version: got.meta.version.clone() };
                    let bytes = got.bytes().await.with_context(|| format!("reading {}/{rel}", r.url))?;
                    r.moved.down.fetch_add(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
                    Ok(Some((bytes.to_vec(), v)))
                }
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e).with_context(|| format!("reading {}/{rel}", r.url)),
            },
        }
    }

    /// Write `bytes` under `rel` only if nothing is there yet (markers, plans): whole or
    /// not at all, and only one of concurrent writers wins.
    pub async fn create(&self, rel: &str, bytes: &[u8]) -> Result<Conditional> {
        match &self.remote {
            None => {
                let dest = self.path_of(rel);
                let (mut file, pending) = create_tmp(&dest)?;
                {
                    use std::io::Write;
                    file.write_all(bytes).with_context(|| format!("writing {}", pending.tmp.display()))?;
                }
                finish_file(file, &pending)?;
                // A hard link fails when the name exists: create-only, and complete.
                let linked = std::fs::hard_link(&pending.tmp, &dest);
                drop(pending);
                match linked {
                    Ok(()) => {
                        if let Some(dir) = dest.parent()
                            && let Ok(d) = std::fs::File::open(dir)
                        {
                            let _ = d.sync_all();
                        }
                        Ok(Conditional::Done(Version { e_tag: None, version: None }))
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(Conditional::Lost),
                    Err(e) => Err(e).with_context(|| format!("creating {}", dest.display())),
                }
            }
            Some(r) => {
                let opts = PutOptions { mode: PutMode::Create, ..Default::default() };
                match r.store.put_opts(&join(&r.prefix, rel), PutPayload::from(bytes.to_vec()), opts).await {
                    Ok(res) => {
                        r.moved.up.fetch_add(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
                        Ok(Conditional::Done(Version { e_tag: res.e_tag, version: res.version }))
                    }
                    Err(object_store::Error::AlreadyExists { .. }) | Err(object_store::Error::Precondition { .. }) => {
                        Ok(Conditional::Lost)
                    }
                    Err(e) => Err(e).with_context(|| format!("creating {}/{rel}", r.url)),
                }
            }
        }
    }

    /// Replace `rel` only if it is still at `version` (leases). Object stores only: a
    /// local file system cannot (its leases are OS locks).
    pub async fn update(&self, rel: &str, bytes: &[u8], version: &Version) -> Result<Conditional> {
        let Some(r) = &self.remote else { bail!("conditional update on a local directory") };
        let v = UpdateVersion { e_tag: version.e_tag.clone(), version: version.version.clone() };
        let opts = PutOptions { mode: PutMode::Update(v), ..Default::default() };
        match r.store.put_opts(&join(&r.prefix, rel), PutPayload::from(bytes.to_vec()), opts).await {
            Ok(res) => {
                r.moved.up.fetch_add(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
                Ok(Conditional::Done(Version { e_tag: res.e_tag, version: res.version }))
            }
            Err(object_store::Error::Precondition { .. }) | Err(object_store::Error::NotFound { .. }) => {
                Ok(Conditional::Lost)
            }
            Err(e) => Err(e).with_context(|| format!("updating {}/{rel}", r.url)),
        }
    }

    /// Every committed file under `rel_prefix` (a folder, ending in `/`): relative path
    /// and size, sorted.
    pub async fn list(&self, rel_prefix: &str) -> Result<Vec<(String, u64)>> {
        let mut out = Vec::new();
        match &self.remote {
            None => {
                let mut stack = vec![self.path_of(rel_prefix)];
                while let Some(d) = stack.pop() {
                    let Ok(read) = std::fs::read_dir(&d) else { continue };
                    for e in read.flatten() {
                        let p = e.path();
                        if p.is_dir() {
                            stack.push(p);
                        } else if !e.file_name().to_string_lossy().starts_with(super::atomic::TMP_MARK) {
                            let rel = p.strip_prefix(&self.dir).unwrap_or(&p).to_string_lossy().to_string();
                            out.push((rel, e.metadata().map(|m| m.len()).unwrap_or(0)));
                        }
                    }
                }
            }
            Some(r) => {
                let base = join(&r.prefix, rel_prefix);
                let mut stream = r.store.list(Some(&base));
                while let Some(m) =
                    stream.try_next().await.with_context(|| format!("listing {}/{rel_prefix}", r.url))?
                {
                    let full = m.location.as_ref();
                    let rel = full.strip_prefix(r.prefix.as_ref()).unwrap_or(full).trim_start_matches('/');
                    out.push((rel.to_string(), m.size));
                }
            }
        }
        out.sort();
        Ok(out)
    }
}

fn join(prefix: &ObjPath, rel: &str) -> ObjPath {
    let mut s = prefix.as_ref().trim_end_matches('/').to_string();
    for part in rel.split('/').filter(|p| !p.is_empty()) {
        if !s.is_empty() {
            s.push('/');
        }
        s.push_str(part);
    }
    ObjPath::from(s)
}

impl Version {
    /// The version of a lease read from a local file (no versions there).
    pub fn none() -> Version {
        Version { e_tag: None, version: None }
    }
}
