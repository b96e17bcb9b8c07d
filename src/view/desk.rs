//! The reviewer's desk: keep / drop decisions made on the page, written through the server
//! into the run's review file (`quality::review`, appended, never rewritten), and how many
//! rows of a table have one. A decision is taken only from the page this server sent (its
//! per-start token in a header, the page's origin checked in `serve`), as JSON.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Value, json};

use super::app::{App, Fail, Viewed, blocking, fail, open_table};
use synth_quality::review::{self, Decision, Review, Verdict};

/// The header the page sends its token in.
pub const TOKEN_HEADER: &str = "x-synth-desk";

/// Longest note kept (characters).
const MAX_NOTE: usize = 2000;

/// The run's review file, read (a bad line is this view's error, with its file and line).
pub(super) fn load(v: &Viewed) -> Result<Review, Fail> {
    Review::load(&v.dir.join(review::FILE)).map_err(|e| Fail(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()))
}

#[derive(Deserialize)]
pub(super) struct DeskQuery {
    file: Option<String>,
}

/// Counts of the review file and, for a table, "reviewed N of M": the decisions on its
/// rows (its `id` column read alone), with those made in it on records a later run dropped
/// (no longer among its rows: `gone`).
fn state_json(app: &App, file: Option<&str>) -> Result<Value, Fail> {
    let review = load(&app.viewed)?;
    let (kept, dropped) = review.counts();
    let mut out = json!({"kept": kept, "dropped": dropped, "decisions": kept + dropped, "reviewer": app.reviewer});
    if let Some(file) = file {
        let t = open_table(app, file)?;
        let (mut here, mut present) = ((0u64, 0u64), std::collections::HashSet::new());
        if !review.is_empty() {
            t.each_id(|id| {
                if let Some(d) = review.get(id) {
                    match d.decision {
                        Verdict::Keep => here.0 += 1,
                        Verdict::Drop => here.1 += 1,
                    }
                    present.insert(id.to_string());
                }
            })
            .map_err(|e| Fail(StatusCode::UNPROCESSABLE_ENTITY, format!("{file}: {e:#}")))?;
        }
        let stem = std::path::Path::new(file).file_stem().and_then(|s| s.to_str()).unwrap_or_default();
        let gone: Vec<&Decision> =
            review.decisions().filter(|d| d.stage.as_deref() == Some(stem) && !present.contains(&d.id)).collect();
        let gone_dropped = gone.iter().filter(|d| d.decision == Verdict::Drop).count() as u64;
        out["file"] = json!(file);
        out["rows"] = json!(t.rows());
        out["reviewed"] = json!(here.0 + here.1 + gone.len() as u64);
        out["reviewed_here"] = json!(here.0 + here.1);
        out["reviewed_kept"] = json!(here.0 + gone.len() as u64 - gone_dropped);
        out["reviewed_dropped"] = json!(here.1 + gone_dropped);
        out["gone"] = json!(gone.len());
    }
    Ok(out)
}

pub(super) async fn review_state(State(app): State<Arc<App>>, Query(q): Query<DeskQuery>) -> Response {
    blocking(move || state_json(&app, q.file.as_deref())).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Decide {
    /// The table the record was reviewed in (an output of the run).
    file: String,
    id: String,
    decision: Verdict,
    #[serde(default)]
    note: Option<String>,
}

/// A decision from the page: checked (token, JSON, the record is in the table), appended
/// to the review file; the desk's counts for that table.
pub(super) async fn decide(State(app): State<Arc<App>>, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    let token = headers.get(TOKEN_HEADER).and_then(|h| h.to_str().ok()).unwrap_or_default();
    // Compared whole, in constant time (the token is short and fixed in length).
    let same = token.len() == app.token.len()
        && token.bytes().zip(app.token.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
    if !same {
        return fail(StatusCode::FORBIDDEN, "a decision comes from this viewer's page (its token is missing or wrong)");
    }
    let json_body = headers
        .get(header::CONTENT_TYPE)
        .and_then(|h| h.to_str().ok())
        .is_some_and(|c| c.split(';').next().is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json")));
    if !json_body {
        return fail(StatusCode::UNSUPPORTED_MEDIA_TYPE, "a decision is sent as application/json");
    }
    let d: Decide = match serde_json::from_slice(&body) {
        Ok(d) => d,
        Err(e) => {
            return fail(
                StatusCode::BAD_REQUEST,
                format!("{e} (a decision is {{\"file\", \"id\", \"decision\": \"keep\"|\"drop\", \"note\"}})"),
            );
        }
    };
    blocking(move || {
        if d.id.trim().is_empty() {
            return Err(Fail(StatusCode::BAD_REQUEST, "\"id\" is empty".into()));
        }
        let t = open_table(&app, &d.file)?;
        let found = t.find("id", &d.id).map_err(|e| Fail(StatusCode::UNPROCESSABLE_ENTITY, format!("{e:#}")))?;
        if found.is_empty() {
            return Err(Fail(StatusCode::NOT_FOUND, format!("{} has no record with id {:?}", d.file, d.id)));
        }
        let note = d.note.map(|n| n.trim().chars().take(MAX_NOTE).collect::<String>()).filter(|n| !n.is_empty());
        let stage = std::path::Path::new(&d.file).file_stem().and_then(|s| s.to_str()).map(str::to_string);
        let decision = Decision {
            id: d.id.clone(),
            decision: d.decision,
            note,
            reviewer: app.reviewer.clone(),
            time: Some(review::now()),
            stage,
        };
        let path = app.viewed.dir.join(review::FILE);
        review::append(&path, &[decision])
            .map_err(|e| Fail(StatusCode::INTERNAL_SERVER_ERROR, format!("writing {}: {e}", path.display())))?;
        let mut out = state_json(&app, Some(&d.file))?;
        out["id"] = json!(d.id);
        out["decision"] = json!(d.decision.as_str());
        Ok(out)
    })
    .await
}
