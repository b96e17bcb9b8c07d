//! Hugging Face Hub sources through the real hf-hub client against a fake hub
//! bound to 127.0.0.1: revision info, ranged downloads, the local cache (no second
//! download, and runs keep working when the hub is gone), config/split file
//! selection, and a clear error for a repository that does not exist.

use crate::support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use support::{Project, parquet_rows, statuses};

const SHA: &str = "0123456789abcdef0123456789abcdef01234567";

/// A fake hub (also used by method tests that read a release from the hub).
#[derive(Default)]
pub struct Hub {
    /// repo -> path -> bytes
    pub files: BTreeMap<String, BTreeMap<String, Vec<u8>>>,
    pub info_requests: AtomicUsize,
    pub downloads: Mutex<Vec<String>>,
}

async fn info(State(hub): State<Arc<Hub>>, Path((org, name, _rev)): Path<(String, String, String)>) -> Response {
    hub.info_requests.fetch_add(1, Ordering::SeqCst);
    let Some(files) = hub.files.get(&format!("{org}/{name}")) else {
        return (StatusCode::NOT_FOUND, "Repository not found").into_response();
    };
    let siblings: Vec<serde_json::Value> = files.keys().map(|f| serde_json::json!({"rfilename": f})).collect();
    axum::Json(serde_json::json!({"sha": SHA, "siblings": siblings})).into_response()
}

async fn resolve(
    State(hub): State<Arc<Hub>>,
    Path((org, name, _rev, path)): Path<(String, String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let Some(bytes) = hub.files.get(&format!("{org}/{name}")).and_then(|f| f.get(&path)) else {
        return (StatusCode::NOT_FOUND, "Entry not found").into_response();
    };
    let size = bytes.len();
    let (start, end) = headers
        .get(header::RANGE)
        .and_then(|r| r.to_str().ok())
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split_once('-'))
        .map(|(a, b)| (a.parse::<usize>().unwrap_or(0), b.parse::<usize>().unwrap_or(size - 1)))
        .unwrap_or((0, size - 1));
    let end = end.min(size - 1);
    if end - start + 1 > 1 {
        hub.downloads.lock().unwrap().push(path.clone());
    }
    let etag = format!("\"{}\"", blake3::hash(bytes).to_hex());
    (
        StatusCode::PARTIAL_CONTENT,
        [
            (header::ETAG.as_str(), etag),
            ("x-repo-commit", SHA.to_string()),
            (header::CONTENT_RANGE.as_str(), format!("bytes {start}-{end}/{size}")),
        ],
        bytes[start..=end].to_vec(),
    )
        .into_response()
}

/// Serve `hub` on 127.0.0.1 (at most 300 s): its endpoint URL and a stop handle.
pub fn serve(hub: Arc<Hub>) -> (String, tokio::sync::oneshot::Sender<()>) {
    support::serve_router(
        Router::new()
            .route("/api/datasets/{org}/{name}/revision/{rev}", get(info))
            .route("/datasets/{org}/{name}/resolve/{rev}/{*path}", get(resolve))
            .with_state(hub),
    )
}

fn personas() -> Vec<u8> {
    (0..30)
        .map(|i| format!("{{\"persona\": \"A person number {i} who likes tea.\"}}\n"))
        .collect::<String>()
        .into_bytes()
}

fn marco_part(offset: i64) -> Vec<u8> {
    use synth::data::arrow::array::{Int64Array, RecordBatch, StringArray};
    use synth::data::arrow::datatypes::{DataType, Field, Schema};
    let schema = Arc::new(Schema::new(vec![
        Field::new("query_id", DataType::Int64, false),
        Field::new("query", DataType::Utf8, false),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from((offset..offset + 5).collect::<Vec<_>>())),
            Arc::new(StringArray::from((0..5).map(|i| format!("question {}", offset + i)).collect::<Vec<_>>())),
        ],
    )
    .unwrap();
    let mut buf = Vec::new();
    let mut w = parquet::arrow::ArrowWriter::try_new(&mut buf, schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    buf
}

fn hub() -> Arc<Hub> {
    let mut files = BTreeMap::new();
    files.insert(
        "proj-persona/PersonaHub".to_string(),
        BTreeMap::from([("persona.jsonl".to_string(), personas()), ("README.md".to_string(), b"# card".to_vec())]),
    );
    files.insert(
        "microsoft/ms_marco".to_string(),
        BTreeMap::from([
            ("v2.1/train-00000-of-00002.parquet".to_string(), marco_part(0)),
            ("v2.1/train-00001-of-00002.parquet".to_string(), marco_part(5)),
            ("v2.1/validation-00000-of-00001.parquet".to_string(), marco_part(100)),
            ("v1.1/train-00000-of-00001.parquet".to_string(), marco_part(200)),
        ]),
    );
    Arc::new(Hub { files, ..Default::default() })
}

fn pipeline(endpoint: &str) -> String {
    format!(
        r#"
[pipeline]
output_dir = "out"

[stages.personas]
kind = "source"
hf = {{ repo = "proj-persona/PersonaHub", files = ["persona.jsonl"], endpoint = "{endpoint}", cache_dir = "hf-cache" }}

[stages.marco]
kind = "source"
hf = {{ repo = "microsoft/ms_marco", config = "v2.1", split = "train", endpoint = "{endpoint}", cache_dir = "hf-cache" }}
id_column = "query_id"

[stages.p_out]
kind = "jsonl"
inputs = ["personas"]

[stages.m_out]
kind = "jsonl"
inputs = ["marco"]
"#
    )
}

#[test]
fn hub_datasets_download_once_and_work_from_the_cache() {
    let hub = hub();
    let (url, stop) = serve(hub.clone());
    let p = Project::new();
    p.write("p.toml", pipeline(&url));
    p.synth(&["run", "p.toml"]).ok();

    let personas = parquet_rows(&p.path().join("out/personas.parquet"));
    assert_eq!(personas.len(), 30);
    assert_eq!(personas[0]["persona"], "A person number 0 who likes tea.");
    let marco = parquet_rows(&p.path().join("out/marco.parquet"));
    assert_eq!(marco.len(), 10, "config v2.1, split train: both train shards and nothing else");
    assert_eq!(marco[9]["id"], "9");
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(p.path().join("out/_synth/state/marco.json")).unwrap()).unwrap();
    assert_eq!(state["parts"]["extra"]["hf.commit"], SHA);
    assert_eq!(
        state["parts"]["extra"]["hf.files"],
        "v2.1/train-00000-of-00002.parquet,v2.1/train-00001-of-00002.parquet"
    );
    let downloads = hub.downloads.lock().unwrap().clone();
    assert_eq!(downloads.len(), 3, "{downloads:?}");

    // Unchanged: up to date, nothing downloaded again.
    p.synth(&["run", "p.toml"]).ok();
    assert!(statuses(&p.path().join("out")).values().all(|s| s == "up_to_date"));
    assert_eq!(hub.downloads.lock().unwrap().len(), 3);

    // Hub gone: the cache serves the same commit.
    stop.send(()).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    p.synth(&["run", "p.toml", "--force"]).ok();
    assert_eq!(parquet_rows(&p.path().join("out/marco.parquet")).len(), 10);
}

#[test]
fn a_missing_repository_is_one_clear_error() {
    let hub = hub();
    let (url, _stop) = serve(hub);
    let p = Project::new();
    p.write(
        "p.toml",
        format!(
            r#"
[stages.x]
kind = "source"
hf = {{ repo = "nobody/nothing", files = ["data.jsonl"], endpoint = "{url}", cache_dir = "hf-cache" }}

[stages.out]
kind = "jsonl"
inputs = ["x"]
"#
        ),
    );
    let run = p.synth(&["run", "p.toml"]).code(2);
    assert!(run.stderr.contains("stage \"x\"") && run.stderr.contains("nobody/nothing"), "{}", run.stderr);
    assert!(run.stderr.contains("404"), "{}", run.stderr);
    // A dry run never touches the network.
    let run = p.synth(&["run", "p.toml", "--dry-run"]).ok();
    assert!(run.stdout.contains("needs the network to check its source"), "{}", run.stdout);
}

#[test]
fn hub_sources_split_among_shards_on_request_read_the_cache_once_downloaded() {
    let hub = hub();
    let (url, _stop) = serve(hub.clone());
    let p = Project::new();
    // `shard = true`: a hub dataset's size is unknown before the download, so it splits
    // on request only; JSONL (personas) by lines, Parquet (two files of 5 rows) by rows.
    let sharded = pipeline(&url).replace("cache_dir = \"hf-cache\" }\n", "cache_dir = \"hf-cache\" }\nshard = true\n");
    assert_eq!(sharded.matches("shard = true").count(), 2);
    p.write("p.toml", &sharded);
    p.synth(&["run", "p.toml", "--out", "one", "-q"]).ok();
    assert_eq!(parquet_rows(&p.path().join("one/marco.parquet")).len(), 10);
    p.synth(&["run", "p.toml", "--out", "three", "--shards", "3", "--executor", "local", "-q"]).ok();
    support::assert_same_outputs(&p.path().join("one"), &p.path().join("three"));
    let status = p.synth(&["status", "three"]).ok().stdout;
    assert!(status.contains("wave 1 (3 shards, limits divided by 3): personas, marco"), "{status}");
    // Every shard resolved the same commit and read the machine's cache: no download
    // after the first run's three.
    assert_eq!(hub.downloads.lock().unwrap().len(), 3);
    let wave = support::wave_dir(&p.path().join("three"), 1);
    for i in 0..3 {
        let rows = parquet_rows(&wave.join(format!("s{i:05}/marco.parquet"))).len();
        assert!((3..=4).contains(&rows), "shard {i} read {rows} of the 10 rows");
    }
}
