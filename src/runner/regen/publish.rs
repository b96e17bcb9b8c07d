//! Publishing a snapshot to the Hugging Face Hub: all its files (exports, card with the
//! changelog, manifest, lock) as one commit whose parent is the branch head read when
//! the regeneration started, so a concurrent push makes it fail cleanly; then a tag; the
//! commit is recorded in the snapshot's manifest.

use anyhow::{Context, Result, anyhow, bail};

use super::config::HubTarget;
use super::snapshot::{Publication, Snapshot, Snapshots};
use synth_core::hub::commit::{CommitErrorKind, HubRepo, folder_files};
use synth_core::store::state::now_rfc3339;

/// A repository to publish to and the head its branch had when we looked.
pub struct Push {
    pub target: HubTarget,
    pub repo: HubRepo,
    pub parent: String,
}

/// Read the token and the branch head (fails before any work when either is missing).
pub async fn connect(target: &HubTarget) -> Result<Push> {
    let token = synth_core::secrets::key_from_env(&target.token_env).ok_or_else(|| {
        anyhow!("publishing to {} needs a Hub token with write access in ${}", target.repo, target.token_env)
    })?;
    let repo = HubRepo::new(target.endpoint.as_deref(), &target.repo, &target.repo_type, &token)?;
    let parent = repo.head(&target.branch).await?.ok_or_else(|| {
        anyhow!(
            "{} {} has no branch \"{}\" on the Hub (create the repository first, e.g. `huggingface-cli repo create {} --type {}`)",
            target.repo_type,
            target.repo,
            target.branch,
            target.repo,
            target.repo_type
        )
    })?;
    Ok(Push { target: target.clone(), repo, parent })
}

fn tag_name(template: &str, snap: &Snapshot) -> String {
    template
        .replace("{id}", &snap.meta.id)
        .replace("{date}", &snap.meta.created_at[..10])
        .replace("{fingerprint}", &snap.meta.fingerprint[..8])
        .replace("{name}", &snap.meta.pipeline)
}

/// Commit `snap` as one commit, tag it, record it. `previous` is the release the branch
/// holds from us (its files that this snapshot no longer has are deleted in the commit).
/// Returns the publication and warnings (a tag that could not be created).
pub async fn publish(
    push: &Push,
    snapshots: &Snapshots,
    snap: &Snapshot,
    previous: Option<&Publication>,
) -> Result<(Publication, Vec<String>)> {
    let t = &push.target;
    let files = folder_files(&snap.path, &["_synth"])?;
    let names: Vec<String> = files.iter().map(|f| f.path_in_repo.clone()).collect();
    let mut warnings = Vec::new();
    // A commit whose answer was lost may have landed: the head then holds this snapshot.
    let landed = match push.repo.read_file(&push.parent, synth_core::store::state::MANIFEST).await {
        Ok(Some(bytes)) => serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| v["snapshot"]["id"].as_str().map(str::to_string))
            .is_some_and(|id| id == snap.meta.id),
        _ => false,
    };
    let (commit, url, parent) = if landed {
        warnings.push(format!(
            "{} already holds snapshot {} at {}: recorded, not committed again",
            t.repo, snap.meta.id, push.parent
        ));
        (push.parent.clone(), push.repo.commit_url(&push.parent), None)
    } else {
        let deletions: Vec<String> = previous
            .filter(|p| p.repo == t.repo && p.branch == t.branch)
            .map(|p| p.files.iter().filter(|f| !names.contains(f)).cloned().collect())
            .unwrap_or_default();
        let summary = format!("synth: {} release {}", snap.meta.pipeline, snap.meta.id);
        let description = super::diff::changelog_markdown(std::slice::from_ref(&snap.meta.changelog), 1);
        let info = push
            .repo
            .commit(&t.branch, Some(&push.parent), &summary, description.trim(), &files, &deletions)
            .await
            .map_err(|e| match e.kind {
                CommitErrorKind::ParentMoved => anyhow!("{e}; run regenerate again to publish on top of the new head"),
                CommitErrorKind::Auth => anyhow!("{e} (the token in ${} cannot write to {})", t.token_env, t.repo),
                CommitErrorKind::Other => anyhow!("{e}"),
            })?;
        (info.commit, info.url, Some(push.parent.clone()))
    };
    let tag = tag_name(&t.tag, snap);
    let tag = if tag.is_empty() {
        None
    } else {
        match push.repo.tag(&commit, &tag, &format!("synth release {}", snap.meta.id)).await {
            Ok(()) => Some(tag),
            Err(e) => {
                warnings.push(format!("the commit landed but the tag was not created: {e:#}"));
                None
            }
        }
    };
    let publication = Publication {
        repo: t.repo.clone(),
        repo_type: t.repo_type.clone(),
        branch: t.branch.clone(),
        commit,
        parent,
        tag,
        url,
        published_at: now_rfc3339(),
        files: names,
    };
    snapshots.record_publication(snap, &publication).context("recording the publication in the snapshot")?;
    Ok((publication, warnings))
}

/// A repository id the Hub accepts: `owner/name`.
pub fn check_repo_id(repo: &str) -> Result<()> {
    let ok = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    match repo.split_once('/') {
        Some((a, b)) if ok(a) && ok(b) => Ok(()),
        _ => bail!("\"{repo}\" is not a Hub repository id (owner/name)"),
    }
}
