//! Two runs side by side (`synth view DIR --compare OTHER`): per stage its status and rows
//! in / out / failed in each, and per table written by both the rows added, removed and
//! changed by id (a row's content hashed without its id, as snapshots are compared).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Value, json};

use super::app::{App, Fail, blocking, read_json};
use synth_core::store::state::MANIFEST;
use synth_runner::regen::diff::{RowIndex, diff};

/// Ids listed per kind of change at most.
const MAX_IDS: usize = 1000;

/// Per stage of a manifest: status and rows in / out / failed.
pub(super) fn stage_rows(manifest: &Value) -> BTreeMap<String, Value> {
    manifest["stages"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(name, s)| {
            let r = &s["report"];
            (
                name.clone(),
                json!({"status": s["status"], "kind": s["kind"], "rows_in": r["rows_in"], "rows_out": r["rows_out"],
                    "failed": r["rows_failed"]}),
            )
        })
        .collect()
}

/// Stages of both, side by side (a stage only one has: `null` on the other side), in the
/// order of the first manifest, then those only the second has.
pub(super) fn stages_side_by_side(a: &Value, b: &Value) -> Vec<Value> {
    let (ra, rb) = (stage_rows(a), stage_rows(b));
    let mut names: Vec<String> = a["stages"].as_object().into_iter().flatten().map(|(k, _)| k.clone()).collect();
    let known: BTreeSet<String> = names.iter().cloned().collect();
    names.extend(rb.keys().filter(|k| !known.contains(*k)).cloned());
    names.into_iter().map(|n| json!({"name": n, "this": ra.get(&n), "other": rb.get(&n)})).collect()
}

/// Parquet outputs of a manifest's stages (not failure tables), by path.
fn tables(manifest: &Value) -> BTreeSet<String> {
    manifest["stages"]
        .as_object()
        .into_iter()
        .flatten()
        .flat_map(|(_, s)| s["outputs"].as_array().cloned().unwrap_or_default())
        .filter_map(|o| o["path"].as_str().map(str::to_string))
        .filter(|p| p.ends_with(".parquet"))
        .collect()
}

fn index(dir: &Path, rel: &str) -> Option<RowIndex> {
    let path = super::app::inside(dir, rel)?;
    RowIndex::of_parquet(&path, None).ok().flatten()
}

/// Per table both runs wrote: rows added / removed / changed / unchanged (`other` → this).
fn table_changes(this: &Path, other: &Path, a: &Value, b: &Value, ids: usize) -> Vec<Value> {
    let (ta, tb) = (tables(a), tables(b));
    ta.intersection(&tb)
        .map(|rel| match (index(this, rel), index(other, rel)) {
            (Some(new), Some(old)) => {
                let (c, d) = diff(&old, &new);
                json!({"file": rel, "rows": c.rows, "other_rows": old.rows.len(), "added": c.added, "removed": c.removed,
                    "changed": c.changed, "unchanged": c.unchanged,
                    "added_ids": d.added.iter().take(ids).collect::<Vec<_>>(),
                    "removed_ids": d.removed.iter().take(ids).collect::<Vec<_>>(),
                    "changed_ids": d.changed.iter().take(ids).collect::<Vec<_>>()})
            }
            _ => json!({"file": rel, "note": "no ids to compare by"}),
        })
        .collect()
}

#[derive(Deserialize)]
pub(super) struct CompareQuery {
    #[serde(default)]
    ids: usize,
}

/// This run against the one given with `--compare`.
pub(super) async fn runs(State(app): State<Arc<App>>, Query(q): Query<CompareQuery>) -> Response {
    blocking(move || {
        let Some(other) = app.viewed.compare.clone() else {
            return Err(Fail(
                StatusCode::NOT_FOUND,
                "no run to compare with: start the viewer with `synth view DIR --compare OTHER_DIR`".into(),
            ));
        };
        let this = &app.viewed.dir;
        let a = read_json(&this.join(MANIFEST)).unwrap_or(Value::Null);
        let b = read_json(&other.join(MANIFEST)).unwrap_or(Value::Null);
        Ok(json!({
            "this": this.display().to_string(),
            "other": other.display().to_string(),
            "this_status": a["status"], "other_status": b["status"],
            "stages": stages_side_by_side(&a, &b),
            "tables": table_changes(this, &other, &a, &b, q.ids.min(MAX_IDS)),
        }))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stage_only_one_run_has_is_null_on_the_other_side() {
        let a = json!({"stages": {"x": {"status": "ran", "report": {"rows_in": 3, "rows_out": 2, "rows_failed": 1}},
            "y": {"status": "ran", "report": {}}}});
        let b = json!({"stages": {"x": {"status": "ran", "report": {"rows_in": 3, "rows_out": 3, "rows_failed": 0}},
            "z": {"status": "failed", "report": {}}}});
        let rows = stages_side_by_side(&a, &b);
        let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["x", "y", "z"]);
        assert_eq!(rows[0]["this"]["failed"], 1);
        assert_eq!(rows[0]["other"]["rows_out"], 3);
        assert!(rows[1]["other"].is_null() && rows[2]["this"].is_null());
    }
}
