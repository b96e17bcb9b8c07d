//! `synth view`: a local web page over one output directory — the run (stage graph,
//! counters, live while a run writes there), any stage's output as a paged table with
//! facets and export, failures grouped by reason, the reviewer's desk, the reports, the
//! snapshots and another run beside it. It reads what the run writes (Parquet footers and
//! row groups, state files, `live.json`) and writes only review decisions from its own page
//! (appended to `review.jsonl`); it never takes the run's lock, serves nothing outside the
//! directory, and scrubs secrets from every answer.

mod app;
mod compare;
mod desk;
pub mod table;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use serde_json::{Value, json};

use app::{App, Fail, answer, blocking, fail, not_found, open_table, parquet_path, read_json};
pub use app::{Viewed, future_canonical, inside};
use synth_core::store::state::{INTERNAL_DIR, MANIFEST};
use table::Table;

/// The page: one file, no build step, no network (embedded in the binary).
const PAGE: &str = include_str!("page.html");

/// The most rows one page may ask for.
const MAX_PAGE: usize = 500;

/// Bytes of a report file served at most.
const MAX_FILE: u64 = 8 << 20;

/// How long the first answer to a new filter of a big table waits for its page: what has
/// been found by then is sent, and the page asks again until the search is complete.
const FIRST_PATIENCE: std::time::Duration = std::time::Duration::from_millis(150);

/// Serve until the process is stopped; `ready` gets the bound address.
pub async fn serve(viewed: Viewed, addr: SocketAddr, ready: impl FnOnce(SocketAddr)) -> Result<()> {
    synth_core::secrets::register_env(
        std::env::vars().collect::<Vec<_>>().iter().map(|(k, v)| (k.as_str(), v.as_str())),
    );
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
    let bound = listener.local_addr()?;
    ready(bound);
    // Only requests that name this server: a page of another site whose name is made to
    // resolve to 127.0.0.1 (DNS rebinding) sends its own name as Host and is refused.
    let guarded = router(viewed).layer(axum::middleware::from_fn(
        move |req: axum::extract::Request, next: axum::middleware::Next| async move {
            let host = req.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
            if !host_allowed(host, bound) {
                return fail(
                    StatusCode::FORBIDDEN,
                    format!("this viewer answers requests for http://{bound}/ only (Host: {host:?})"),
                );
            }
            // A write comes from this server's own page: a browser names the page's origin.
            if req.method() != axum::http::Method::GET && req.method() != axum::http::Method::HEAD {
                let origin = req.headers().get(header::ORIGIN).and_then(|h| h.to_str().ok()).unwrap_or_default();
                let same = origin.strip_prefix("http://").is_some_and(|o| host_allowed(o, bound));
                if !same {
                    return fail(
                        StatusCode::FORBIDDEN,
                        format!("a change must come from this viewer's page (Origin: {origin:?})"),
                    );
                }
            }
            next.run(req).await
        },
    ));
    axum::serve(listener, guarded).await.context("serving")
}

/// Whether a request's `Host` names the address the viewer is bound to: its port, and as
/// host an IP literal of that address (any IP literal when bound to all addresses: a literal
/// cannot be rebound) or `localhost` on a loopback or all-addresses bind. A DNS name is
/// refused whatever it resolves to.
pub fn host_allowed(host: &str, bound: SocketAddr) -> bool {
    let Ok(authority) = host.parse::<axum::http::uri::Authority>() else { return false };
    if authority.port_u16().unwrap_or(80) != bound.port() {
        return false;
    }
    let name = authority.host().trim_start_matches('[').trim_end_matches(']');
    let ip = bound.ip();
    if name.eq_ignore_ascii_case("localhost") {
        return ip.is_loopback() || ip.is_unspecified();
    }
    match name.parse::<std::net::IpAddr>() {
        Ok(asked) => asked == ip || ip.is_unspecified() || (ip.is_loopback() && asked.is_loopback()),
        Err(_) => false,
    }
}

/// The routes (the tests call them through a real socket too).
pub fn router(viewed: Viewed) -> Router {
    let reviewer =
        ["SYNTH_REVIEWER", "USER"].iter().find_map(|k| std::env::var(k).ok().filter(|v| !v.trim().is_empty()));
    let app = Arc::new(App {
        viewed,
        positions: Mutex::new(HashMap::new()),
        searches: Mutex::new(HashMap::new()),
        token: format!("{:032x}", rand::random::<u128>()),
        reviewer,
    });
    Router::new()
        .route("/", get(page))
        .route("/api/facets", get(facets))
        .route("/api/export", get(export))
        .route("/api/review", get(desk::review_state).post(desk::decide))
        .route("/api/compare", get(compare::runs))
        .route("/api/run", get(run))
        .route("/api/events", get(events))
        .route("/api/table", get(table_page))
        .route("/api/failures", get(failures))
        .route("/api/lookup", get(lookup))
        .route("/api/reports", get(reports))
        .route("/api/file/{*path}", get(file))
        .route("/api/snapshots", get(snapshots))
        .route("/api/snapshots/diff", get(snapshot_diff))
        .fallback(|| async { not_found() })
        .with_state(app)
}

/// Where the page holds the desk's token.
const TOKEN_MARK: &str = "__SYNTH_DESK_TOKEN__";

async fn page(State(app): State<Arc<App>>) -> Response {
    let mut r = PAGE.replacen(TOKEN_MARK, &app.token, 1).into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    r.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'",
        ),
    );
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

// ---- the run ----------------------------------------------------------------------

/// The run as the page shows it: the manifest's stages (or, before the first manifest,
/// the committed stage states), each with its live counters while a run goes on.
fn run_state(v: &Viewed) -> Value {
    let manifest = read_json(&v.dir.join(MANIFEST));
    let internal = v.dir.join(INTERNAL_DIR);
    let live = read_json(&internal.join(synth_core::progress::LIVE_FILE));
    // A live file is current while its writer updates it (once a second).
    let live_age = std::fs::metadata(internal.join(synth_core::progress::LIVE_FILE))
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok());
    let running =
        live.as_ref().is_some_and(|l| l["running"] == true) && live_age.is_some_and(|a| a < Duration::from_secs(5));
    let mut stages: Vec<Value> = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    if let Some(m) = &manifest
        && let Some(obj) = m["stages"].as_object()
    {
        for (name, s) in obj {
            let mut s = s.clone();
            s["name"] = json!(name);
            // A stage committed by a run still going on: its state file is newer.
            if let Some(state) = read_json(&synth_core::store::state::state_path(&v.dir, name))
                && state["fingerprint"] != s["fingerprint"]
                && running
            {
                s["report"] = state["report"].clone();
                s["outputs"] = state["outputs"].clone();
                s["failures"] = state["failures"].clone();
                s["status"] = json!("done");
            }
            seen.insert(name.clone());
            stages.push(s);
        }
    }
    if let Ok(read) = std::fs::read_dir(internal.join("state")) {
        let mut extra: Vec<Value> = read
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().strip_suffix(".json")?.to_string();
                // A state file being written (`.synth-tmp-…`) is not a stage.
                if seen.contains(&name) || name.starts_with(synth_core::store::atomic::TMP_MARK) {
                    return None;
                }
                let s = read_json(&e.path())?;
                Some(json!({"name": name, "kind": s["kind"], "status": "done", "report": s["report"],
                    "outputs": s["outputs"], "failures": s["failures"], "inputs": s["parts"]["inputs"].as_object()
                        .map(|o| o.keys().cloned().collect::<Vec<_>>()).unwrap_or_default()}))
            })
            .collect();
        extra.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        stages.extend(extra);
    }
    if let Some(l) = live.as_ref().filter(|_| running) {
        for ls in l["stages"].as_array().into_iter().flatten() {
            if let Some(s) = stages.iter_mut().find(|s| s["name"] == ls["name"]) {
                s["status"] = json!("running");
                s["live"] = ls.clone();
            } else {
                stages.push(json!({"name": ls["name"], "status": "running", "live": ls}));
            }
        }
    }
    let manifest_missing = manifest.is_none();
    let m = manifest.unwrap_or(Value::Null);
    json!({
        "dir": v.dir.display().to_string(),
        // No run has written here yet: the page waits for one.
        "waiting": manifest_missing && stages.is_empty(),
        "compare": v.compare.as_ref().map(|c| c.display().to_string()),
        "running": running,
        "pipeline": m["pipeline"],
        "profile": m["profile"],
        "status": if running { json!("running") } else { m["status"].clone() },
        "started_at": m["started_at"],
        "finished_at": m["finished_at"],
        "error": m["error"],
        "totals": m["totals"],
        "stages": stages,
        "config": m["config"],
    })
}

async fn run(State(app): State<Arc<App>>) -> Response {
    let v = app.viewed.clone();
    let (mut state, waves) = (
        tokio::task::spawn_blocking(move || run_state(&v)).await.unwrap_or_default(),
        synth_runner::dag::status::waves_json(&app.viewed.dir).await,
    );
    state["waves"] = waves;
    answer(&state)
}

/// What changes when a run writes: the live file, the state files, the manifest.
fn change_mark(v: &Viewed) -> Vec<(String, SystemTime)> {
    let mut marks = Vec::new();
    let mut note = |p: PathBuf| {
        if let Ok(t) = std::fs::metadata(&p).and_then(|m| m.modified()) {
            marks.push((p.display().to_string(), t));
        }
    };
    note(v.dir.join(MANIFEST));
    note(v.dir.join(INTERNAL_DIR).join(synth_core::progress::LIVE_FILE));
    if let Ok(read) = std::fs::read_dir(v.dir.join(INTERNAL_DIR).join("state")) {
        for e in read.flatten() {
            note(e.path());
        }
    }
    marks.sort();
    marks
}

/// Server-sent events: the run's state each time something the run writes changes
/// (checked twice a second), and a comment every 15 s to keep the stream open.
async fn events(State(app): State<Arc<App>>) -> impl IntoResponse {
    use axum::response::sse::{Event, KeepAlive, Sse};
    let stream = futures::stream::unfold((app, None::<Vec<(String, SystemTime)>>), |(app, last)| async move {
        loop {
            let v = app.viewed.clone();
            let mark = tokio::task::spawn_blocking(move || change_mark(&v)).await.unwrap_or_default();
            if last.as_ref() != Some(&mark) {
                let v = app.viewed.clone();
                let state = tokio::task::spawn_blocking(move || run_state(&v)).await.unwrap_or_default();
                let data = synth_core::secrets::scrub(
                    &serde_json::to_string(&synth_core::secrets::redact(&state)).expect("json"),
                );
                let event = Event::default().event("run").data(data);
                return Some((Ok::<_, std::convert::Infallible>(event), (app, Some(mark))));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

// ---- tables -----------------------------------------------------------------------

#[derive(Deserialize)]
struct TableQuery {
    file: String,
    #[serde(default)]
    offset: usize,
    #[serde(default)]
    limit: Option<usize>,
    sort: Option<String>,
    #[serde(default)]
    desc: bool,
    q: Option<String>,
    /// A facet filter as JSON (`table::FacetFilter`).
    facet: Option<String>,
}

/// The rows a table view selects: in file order or by one column, narrowed by a text
/// filter and a facet filter. `positions` is one page of them.
struct Selection {
    positions: Vec<u64>,
    matched: u64,
    complete: bool,
    scanned: u64,
}

fn facet_of(q: &TableQuery) -> Result<Option<table::FacetFilter>, Fail> {
    match q.facet.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
        Some(f) => serde_json::from_str(f).map(Some).map_err(|e| {
            Fail(StatusCode::BAD_REQUEST, format!("facet: {e} (expected {{\"column\", \"eq\" or \"min\"/\"max\"}})"))
        }),
        None => Ok(None),
    }
}

/// The selection of a table view, `limit` rows from `offset` (all of them with `None`).
fn select(app: &App, t: &Table, q: &TableQuery, limit: Option<usize>) -> Result<Selection, Fail> {
    let err = |e: anyhow::Error| Fail(StatusCode::BAD_REQUEST, format!("{}: {e:#}", q.file));
    let take = limit.unwrap_or(usize::MAX);
    let search = match q.q.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
        Some(needle) => Some(app.search(t, needle).map_err(err)?),
        None => None,
    };
    let ordered = match q.sort.as_deref().filter(|s| !s.is_empty()) {
        Some(col) => Some(app.positions(t, format!("sort:{col}:{}", q.desc), || t.order_by(col, q.desc)).map_err(err)?),
        None => None,
    };
    let facet = match facet_of(q)? {
        Some(f) => {
            let key = format!("facet:{}", serde_json::to_string(&f).expect("json"));
            Some(app.positions(t, key, || t.facet_positions(&f)).map_err(err)?)
        }
        None => None,
    };
    let page =
        |it: &mut dyn Iterator<Item = u32>| -> Vec<u64> { it.skip(q.offset).take(take).map(u64::from).collect() };
    Ok(match (&ordered, &search, &facet) {
        (None, None, None) => Selection {
            positions: (q.offset as u64..(q.offset as u64).saturating_add(take as u64).min(t.rows())).collect(),
            matched: t.rows(),
            complete: true,
            scanned: t.rows(),
        },
        (None, Some(s), None) => {
            // A big table's first answer comes with what was found in FIRST_PATIENCE.
            let patience = (s.is_big() && limit.is_some()).then_some(FIRST_PATIENCE);
            let p = if limit.is_some() {
                s.page(q.offset, take, patience).map_err(err)?
            } else {
                let all = s.all().map_err(err)?;
                table::Progress { matched: all.len() as u64, positions: all, complete: true, scanned: t.rows() }
            };
            Selection {
                positions: p
                    .positions
                    .iter()
                    .skip(if limit.is_some() { 0 } else { q.offset })
                    .map(|x| *x as u64)
                    .collect(),
                matched: p.matched,
                complete: p.complete,
                scanned: p.scanned,
            }
        }
        (Some(o), None, None) => {
            Selection { positions: page(&mut o.iter().copied()), matched: t.rows(), complete: true, scanned: t.rows() }
        }
        _ => {
            // Filters together: the rows every one of them keeps, in the order asked.
            let mut keep: Option<std::collections::HashSet<u32>> = None;
            let mut narrow = |list: &[u32]| {
                keep = Some(match keep.take() {
                    None => list.iter().copied().collect(),
                    Some(k) => list.iter().copied().filter(|p| k.contains(p)).collect(),
                })
            };
            if let Some(s) = &search {
                narrow(&s.all().map_err(err)?);
            }
            if let Some(f) = &facet {
                narrow(f);
            }
            let keep = keep.unwrap_or_default();
            let positions = match &ordered {
                Some(o) => page(&mut o.iter().copied().filter(|p| keep.contains(p))),
                None => {
                    let mut all: Vec<u32> = keep.iter().copied().collect();
                    all.sort_unstable();
                    page(&mut all.into_iter())
                }
            };
            Selection { positions, matched: keep.len() as u64, complete: true, scanned: t.rows() }
        }
    })
}

fn table_json(app: &App, q: &TableQuery) -> Result<Value, Fail> {
    let t = open_table(app, &q.file)?;
    let limit = q.limit.unwrap_or(50).clamp(1, MAX_PAGE);
    let sel = select(app, &t, q, Some(limit))?;
    let rows = t.read_rows(&sel.positions).map_err(|e| Fail(StatusCode::UNPROCESSABLE_ENTITY, format!("{e:#}")))?;
    // Each row's review decision, when the run has a review file.
    let review = desk::load(&app.viewed)?;
    let decisions: Vec<Value> =
        rows.iter()
            .map(|r| {
                r["id"].as_str().and_then(|id| review.get(id)).map_or(Value::Null, |d| {
                json!({"decision": d.decision.as_str(), "note": d.note, "reviewer": d.reviewer, "time": d.time})
            })
            })
            .collect();
    Ok(json!({
        "file": q.file,
        "rows": t.rows(),
        "matched": sel.matched,
        "complete": sel.complete,
        "scanned": sel.scanned,
        "offset": q.offset,
        "limit": limit,
        "columns": table::columns(&t.schema()),
        "positions": sel.positions,
        "data": rows,
        "review": decisions,
    }))
}

#[derive(Deserialize)]
struct FacetQuery {
    file: String,
    column: String,
}

async fn facets(State(app): State<Arc<App>>, Query(q): Query<FacetQuery>) -> Response {
    blocking(move || {
        let t = open_table(&app, &q.file)?;
        let started = std::time::Instant::now();
        let mut f = t.facet(&q.column).map_err(|e| Fail(StatusCode::BAD_REQUEST, format!("{}: {e:#}", q.file)))?;
        f["seconds"] = json!(started.elapsed().as_secs_f64());
        Ok(f)
    })
    .await
}

/// The rows a table view selects (every page of it), as JSON Lines to save: a download.
async fn export(State(app): State<Arc<App>>, Query(q): Query<TableQuery>) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<String, Fail>>(4);
    let name = Path::new(&q.file).file_stem().and_then(|s| s.to_str()).unwrap_or("rows").replace(['"', '\\'], "_");
    tokio::task::spawn_blocking(move || {
        let chunks = || -> Result<(), Fail> {
            let t = open_table(&app, &q.file)?;
            let sel = select(&app, &t, &q, None)?;
            for chunk in sel.positions.chunks(2048) {
                let rows = t.read_rows(chunk).map_err(|e| Fail(StatusCode::UNPROCESSABLE_ENTITY, format!("{e:#}")))?;
                let mut text = String::new();
                for r in rows {
                    text.push_str(&synth_core::secrets::scrub(
                        &serde_json::to_string(&synth_core::secrets::redact(&r)).expect("json"),
                    ));
                    text.push('\n');
                }
                if tx.blocking_send(Ok(text)).is_err() {
                    break;
                }
            }
            Ok(())
        };
        if let Err(e) = chunks() {
            let _ = tx.blocking_send(Err(e));
        }
    });
    let mut rx = rx;
    // The first chunk decides the status: an error before any row is an error answer.
    let first = rx.recv().await;
    let first = match first {
        Some(Err(f)) => return f.into_response(),
        Some(Ok(text)) => text,
        None => String::new(),
    };
    let rest = futures::stream::unfold(rx, |mut rx| async move {
        match rx.recv().await {
            Some(Ok(text)) => Some((Ok::<_, std::io::Error>(text), rx)),
            Some(Err(Fail(_, msg))) => Some((Err(std::io::Error::other(msg)), rx)),
            None => None,
        }
    });
    let body = futures::StreamExt::chain(futures::stream::once(async move { Ok(first) }), rest);
    let mut r = axum::body::Body::from_stream(body).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-ndjson"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{name}.selected.jsonl\"")) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    r
}

/// Run a view's file reading off the async threads; its answer or its error.
async fn table_page(State(app): State<Arc<App>>, Query(q): Query<TableQuery>) -> Response {
    blocking(move || table_json(&app, &q)).await
}

// ---- failures ---------------------------------------------------------------------

#[derive(Deserialize)]
struct StageQuery {
    stage: String,
}

/// A message with its numbers and quoted parts blanked, so failures of one cause group.
fn reason_of(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(160));
    let mut in_quote = false;
    let mut last_digit = false;
    for c in message.chars().take(160) {
        if c == '"' {
            if !in_quote {
                out.push_str("\"…");
            }
            in_quote = !in_quote;
            if !in_quote {
                out.push('"');
            }
            continue;
        }
        if in_quote {
            continue;
        }
        if c.is_ascii_digit() {
            if !last_digit {
                out.push('#');
            }
            last_digit = true;
            continue;
        }
        last_digit = false;
        out.push(c);
    }
    out
}

fn failures_json(v: &Viewed, stage: &str) -> Result<Value, Fail> {
    let state = read_json(&synth_core::store::state::state_path(&v.dir, stage));
    let rel = state
        .as_ref()
        .and_then(|s| s["failures"]["path"].as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{stage}.failures.parquet"));
    let Ok(path) = parquet_path(v, &rel) else {
        return Ok(json!({"stage": stage, "file": Value::Null, "rows": 0, "groups": []}));
    };
    let t = Table::open(&path).map_err(|e| Fail(StatusCode::UNPROCESSABLE_ENTITY, format!("{e:#}")))?;
    let all: Vec<u64> = (0..t.rows()).collect();
    // Grouping reads the kind and message of each failure, a page at a time.
    let mut groups: BTreeMap<(String, String), (u64, Vec<u64>)> = BTreeMap::new();
    for chunk in all.chunks(4096) {
        let rows = t.read_rows(chunk).map_err(|e| Fail(StatusCode::UNPROCESSABLE_ENTITY, format!("{e:#}")))?;
        for (pos, r) in chunk.iter().zip(rows) {
            let kind = r["kind"].as_str().unwrap_or("").to_string();
            let reason = reason_of(r["message"].as_str().unwrap_or(""));
            let g = groups.entry((kind, reason)).or_default();
            g.0 += 1;
            if g.1.len() < 5 {
                g.1.push(*pos);
            }
        }
    }
    let mut list: Vec<Value> = groups
        .into_iter()
        .map(|((kind, reason), (count, first))| json!({"kind": kind, "reason": reason, "count": count, "positions": first}))
        .collect();
    list.sort_by(|a, b| b["count"].as_u64().cmp(&a["count"].as_u64()));
    Ok(json!({"stage": stage, "file": rel, "rows": t.rows(), "groups": list}))
}

async fn failures(State(app): State<Arc<App>>, Query(q): Query<StageQuery>) -> Response {
    blocking(move || failures_json(&app.viewed, &q.stage)).await
}

// ---- provenance -------------------------------------------------------------------

#[derive(Deserialize)]
struct LookupQuery {
    id: String,
}

/// The rows with this `id` in every stage output (a sample's persona, profile, passage,
/// seed or rule is a row of an earlier stage).
fn lookup_json(v: &Viewed, id: &str) -> Value {
    let state = run_state(v);
    let mut found = Vec::new();
    for s in state["stages"].as_array().into_iter().flatten() {
        for o in s["outputs"].as_array().into_iter().flatten() {
            let Some(rel) = o["path"].as_str() else { continue };
            let Ok(path) = parquet_path(v, rel) else { continue };
            let Ok(t) = Table::open(&path) else { continue };
            let Ok(hits) = t.find("id", id) else { continue };
            let hits: Vec<u64> = hits.into_iter().take(5).collect();
            if let Ok(rows) = t.read_rows(&hits) {
                for (pos, row) in hits.iter().zip(rows) {
                    found.push(json!({"stage": s["name"], "file": rel, "position": pos, "row": row}));
                }
            }
        }
    }
    json!({"id": id, "found": found})
}

async fn lookup(State(app): State<Arc<App>>, Query(q): Query<LookupQuery>) -> Response {
    let v = app.viewed.clone();
    answer(&tokio::task::spawn_blocking(move || lookup_json(&v, &q.id)).await.unwrap_or_default())
}

// ---- reports and files ------------------------------------------------------------

const REPORT_EXTENSIONS: &[&str] = &["md", "json", "jsonl", "txt", "csv", "tsv"];

/// The dataset card and each report a stage wrote: text files of the directory (one level
/// of folders down), with the stage reports of the manifest.
fn reports_json(v: &Viewed) -> Value {
    let mut files = Vec::new();
    let mut stack = vec![(v.dir.clone(), 0)];
    while let Some((d, depth)) = stack.pop() {
        let Ok(read) = std::fs::read_dir(&d) else { continue };
        for e in read.flatten() {
            let p = e.path();
            let rel = p.strip_prefix(&v.dir).unwrap_or(&p).to_string_lossy().to_string();
            if rel.starts_with(INTERNAL_DIR) || rel == MANIFEST || rel.starts_with("snapshots") {
                continue;
            }
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() && depth < 1 {
                stack.push((p, depth + 1));
            } else if ft.is_file()
                && p.extension().and_then(|x| x.to_str()).is_some_and(|x| REPORT_EXTENSIONS.contains(&x))
            {
                let bytes = e.metadata().map(|m| m.len()).unwrap_or(0);
                files.push(json!({"path": rel, "bytes": bytes}));
            }
        }
    }
    files.sort_by(|a, b| {
        let card = |x: &Value| x["path"] != "README.md";
        (card(a), a["path"].as_str()).cmp(&(card(b), b["path"].as_str()))
    });
    let state = run_state(v);
    let stage_reports: Vec<Value> = state["stages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| {
            s["report"]["info"].is_object() || s["report"]["tables"].is_array() || s["report"]["metrics"].is_object()
        })
        .map(|s| json!({"stage": s["name"], "report": s["report"]}))
        .collect();
    json!({"files": files, "stages": stage_reports})
}

async fn reports(State(app): State<Arc<App>>) -> Response {
    let v = app.viewed.clone();
    answer(&tokio::task::spawn_blocking(move || reports_json(&v)).await.unwrap_or_default())
}

async fn file(State(app): State<Arc<App>>, axum::extract::Path(rel): axum::extract::Path<String>) -> Response {
    let Some(path) = inside(&app.viewed.dir, &rel) else { return not_found() };
    let ext = path.extension().and_then(|x| x.to_str()).unwrap_or("");
    let figure = ext == "svg";
    if rel.starts_with(INTERNAL_DIR) || !(REPORT_EXTENSIONS.contains(&ext) || figure) || !path.is_file() {
        return not_found();
    }
    let read = || -> std::io::Result<String> {
        use std::io::Read;
        let mut buf = Vec::new();
        std::fs::File::open(&path)?.take(MAX_FILE).read_to_end(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    };
    match read() {
        Ok(text) if figure => {
            // A report's figure (a method draws its tables' charts as SVG): an image that runs
            // nothing, even opened on its own (sandboxed, no script, no outside request).
            let mut r = synth_core::secrets::scrub(&text).into_response();
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("image/svg+xml"));
            r.headers_mut().insert(
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static("default-src 'none'; style-src 'unsafe-inline'; sandbox"),
            );
            r
        }
        Ok(text) => {
            let mut r = synth_core::secrets::scrub(&text).into_response();
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
            r
        }
        Err(e) => fail(StatusCode::UNPROCESSABLE_ENTITY, format!("{rel}: {e}")),
    }
}

// ---- snapshots --------------------------------------------------------------------

async fn snapshots(State(app): State<Arc<App>>) -> Response {
    let snaps = synth_runner::regen::snapshot::Snapshots::new(app.viewed.snapshots.clone());
    let latest = snaps.latest().ok().flatten().map(|s| s.meta.id.clone());
    match snaps.list() {
        Ok(list) => answer(&json!({
            "latest": latest,
            "snapshots": list.iter().map(|s| json!({
                "id": s.meta.id, "created_at": s.meta.created_at, "pipeline": s.meta.pipeline,
                "exports": s.meta.exports.iter().map(|e| json!({"stage": e.stage, "files": e.files, "rows": e.rows})).collect::<Vec<_>>(),
                "previous": s.meta.changelog.previous,
                "published": s.release.as_ref().map(|r| r.url.clone()),
            })).collect::<Vec<_>>(),
        })),
        Err(_) => answer(&json!({"latest": Value::Null, "snapshots": []})),
    }
}

#[derive(Deserialize)]
struct DiffQuery {
    old: Option<String>,
    new: String,
    #[serde(default)]
    ids: usize,
}

async fn snapshot_diff(State(app): State<Arc<App>>, Query(q): Query<DiffQuery>) -> Response {
    let snaps = synth_runner::regen::snapshot::Snapshots::new(app.viewed.snapshots.clone());
    let new = match snaps.get(&q.new) {
        Ok(s) => s,
        Err(e) => return fail(StatusCode::NOT_FOUND, format!("{e:#}")),
    };
    let old = match q.old.as_deref().filter(|s| !s.is_empty()) {
        Some(id) => match snaps.get(id) {
            Ok(s) => Some(s),
            Err(e) => return fail(StatusCode::NOT_FOUND, format!("{e:#}")),
        },
        None => None,
    };
    let take = q.ids.min(1000);
    let diffs = synth_runner::regen::snapshot::compare(old.as_ref(), &new);
    let exports: Vec<Value> = diffs
        .iter()
        .map(|(export, (c, ids))| {
            json!({"export": export, "rows": c.rows, "added": c.added, "removed": c.removed, "changed": c.changed,
                "unchanged": c.unchanged,
                "added_ids": ids.added.iter().take(take).collect::<Vec<_>>(),
                "removed_ids": ids.removed.iter().take(take).collect::<Vec<_>>(),
                "changed_ids": ids.changed.iter().take(take).collect::<Vec<_>>()})
        })
        .collect();
    // Per stage, rows in / out / failed of each snapshot's run, side by side.
    let manifest =
        |s: &synth_runner::regen::snapshot::Snapshot| read_json(&s.path.join(MANIFEST)).unwrap_or(Value::Null);
    let stages = compare::stages_side_by_side(&manifest(&new), &old.as_ref().map(manifest).unwrap_or(Value::Null));
    answer(&json!({"old": old.map(|o| o.meta.id), "new": new.meta.id, "exports": exports, "stages": stages}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().canonicalize().unwrap();
        std::fs::write(d.join("a.md"), "x").unwrap();
        std::fs::create_dir(d.join("sub")).unwrap();
        std::fs::write(d.join("sub/b.md"), "y").unwrap();
        assert!(inside(&d, "a.md").is_some());
        assert!(inside(&d, "sub/b.md").is_some());
        for bad in ["../a.md", "sub/../a.md", "/etc/passwd", "", "./a.md", "sub\\..\\a.md"] {
            assert!(inside(&d, bad).is_none(), "{bad}");
        }
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.md"), "s").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret.md"), d.join("link.md")).unwrap();
        assert!(inside(&d, "link.md").is_none(), "a symlink out is refused");
    }

    #[test]
    fn reasons_group_messages_that_differ_in_numbers_and_quotes() {
        assert_eq!(
            reason_of("prompt of 5000 tokens > context 2048"),
            reason_of("prompt of 6100 tokens > context 2048")
        );
        assert_eq!(reason_of("missing \"skills\" in answer 3"), reason_of("missing \"boundaries\" in answer 12"));
        assert_ne!(reason_of("HTTP 500"), reason_of("invalid JSON"));
    }

    #[test]
    fn only_the_bound_address_is_an_allowed_host() {
        let local: SocketAddr = "127.0.0.1:8642".parse().unwrap();
        for ok in ["127.0.0.1:8642", "localhost:8642", "LOCALHOST:8642", "[::1]:8642", "127.0.0.2:8642"] {
            assert!(host_allowed(ok, local), "{ok}");
        }
        for refused in [
            "evil.example:8642",
            "127.0.0.1:80",
            "127.0.0.1",
            "localhost",
            "",
            "127.0.0.1.nip.io:8642",
            "10.0.0.1:8642",
        ] {
            assert!(!host_allowed(refused, local), "{refused}");
        }
        let lan: SocketAddr = "10.1.2.3:9000".parse().unwrap();
        assert!(host_allowed("10.1.2.3:9000", lan));
        assert!(!host_allowed("localhost:9000", lan) && !host_allowed("127.0.0.1:9000", lan));
        let all: SocketAddr = "0.0.0.0:9000".parse().unwrap();
        assert!(host_allowed("192.168.1.5:9000", all) && host_allowed("localhost:9000", all));
        assert!(!host_allowed("my-box.example:9000", all), "a name can be rebound");
    }
}
