//! The fastembed embedder with the real all-MiniLM-L6-v2 ONNX model from
//! `../shared/models` (skipped, with a printed reason, only when that folder is
//! absent): output equals the sentence-transformers reference vectors within 1e-5;
//! an `embed` stage uses it; a named model downloads through a fake hub on
//! 127.0.0.1 (fastembed reads HF_ENDPOINT). ONNX Runtime comes from `.ci/setup`.

use crate::support;

use std::path::PathBuf;
use std::sync::Arc;

use support::{Project, onnxruntime, parquet_rows};

fn model_dir() -> Option<PathBuf> {
    support::minilm_dir()
}

fn reference(dir: &std::path::Path) -> Vec<(String, Vec<f32>)> {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("reference_vectors.json")).unwrap()).unwrap();
    v["vectors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["text"].as_str().unwrap().to_string(),
                e["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect(),
            )
        })
        .collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn model_dir_matches_sentence_transformers_reference() {
    let Some(dir) = model_dir() else { return };
    let ort = onnxruntime();
    let options = serde_json::json!({
        "model_dir": dir.to_string_lossy(), "pooling": "mean", "max_length": 256, "dim": 384,
        "batch_size": 4, "ort_dylib": ort.to_string_lossy(),
    });
    let e = synth::embed::fastembed::FastEmbed::from_options("minilm", &options, std::path::Path::new("/")).unwrap();
    let refs = reference(&dir);
    assert!(refs.len() >= 5);
    let texts: Vec<String> = refs.iter().map(|(t, _)| t.clone()).collect();
    let got = e.embed_blocking(&texts).unwrap();
    for ((text, want), have) in refs.iter().zip(&got) {
        let d = max_diff(want, have);
        assert!(d <= 1e-5, "{text:?}: max abs difference {d}");
    }
}

#[test]
fn an_embed_stage_runs_fastembed() {
    let Some(dir) = model_dir() else { return };
    let ort = onnxruntime();
    let p = Project::new();
    let refs = reference(&dir);
    let lines: String = refs.iter().map(|(t, _)| format!("{}\n", serde_json::json!({"text": t}))).collect();
    p.write("texts.jsonl", lines);
    p.write(
        "p.toml",
        format!(
            r#"
[pipeline]
output_dir = "out"

[embedders.minilm]
kind = "fastembed"
model_dir = "{}"
dim = 384

[stages.texts]
kind = "source"
path = "texts.jsonl"
allow_empty = true

[stages.vectors]
kind = "embed"
inputs = ["texts"]
embedder = "minilm"
column = "text"

[stages.out]
kind = "parquet"
inputs = ["vectors"]
"#,
            dir.display()
        ),
    );
    p.synth_env(&["run", "p.toml"], &[("ORT_DYLIB_PATH", ort.to_str().unwrap())]).ok();
    let rows = parquet_rows(&p.path().join("out/vectors.parquet"));
    assert_eq!(rows.len(), refs.len());
    for (row, (text, want)) in rows.iter().zip(&refs) {
        let have: Vec<f32> = row["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
        assert!(max_diff(want, &have) <= 1e-5, "{text:?}");
    }
}

#[test]
fn a_missing_onnx_runtime_is_a_clear_error() {
    let Some(dir) = model_dir() else { return };
    let p = Project::new();
    p.write("texts.jsonl", "{\"text\": \"hello\"}\n");
    p.write(
        "p.toml",
        format!(
            "[pipeline]\noutput_dir = \"out\"\n[embedders.m]\nkind = \"fastembed\"\nmodel_dir = \"{}\"\ndim = 384\nort_dylib = \"nowhere/libonnxruntime.so\"\n\
             [stages.t]\nkind = \"source\"\npath = \"texts.jsonl\"\n[stages.v]\nkind = \"embed\"\ninputs = [\"t\"]\nembedder = \"m\"\ncolumn = \"text\"\n\
             [stages.o]\nkind = \"parquet\"\ninputs = [\"v\"]\n",
            dir.display()
        ),
    );
    let out = p.synth(&["run", "p.toml"]).code(2);
    assert!(out.stderr.contains("ONNX Runtime library") && out.stderr.contains("does not exist"), "{}", out.stderr);
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
}

/// (repo path, bytes) of every file a fake hub serves.
type Files = Arc<Vec<(String, Vec<u8>)>>;

/// A fake model hub serving the shared MiniLM files as `Qdrant/all-MiniLM-L6-v2-onnx`.
fn serve_model_hub(dir: PathBuf) -> (String, tokio::sync::oneshot::Sender<()>) {
    use axum::extract::{Path as AxPath, State};
    use axum::http::{HeaderMap, StatusCode, header};
    use axum::response::IntoResponse;
    const SHA: &str = "1111111111111111111111111111111111111111";
    async fn info(State(files): State<Files>) -> impl IntoResponse {
        let siblings: Vec<_> = files.iter().map(|(n, _)| serde_json::json!({"rfilename": n})).collect();
        axum::Json(serde_json::json!({"sha": SHA, "siblings": siblings}))
    }
    async fn resolve(
        State(files): State<Files>,
        AxPath((_org, _name, _rev, path)): AxPath<(String, String, String, String)>,
        headers: HeaderMap,
    ) -> axum::response::Response {
        let Some((_, bytes)) = files.iter().find(|(n, _)| *n == path) else {
            return StatusCode::NOT_FOUND.into_response();
        };
        let size = bytes.len();
        let etag = format!("\"{}\"", blake3::hash(bytes).to_hex());
        let range = headers
            .get(header::RANGE)
            .and_then(|r| r.to_str().ok())
            .and_then(|r| r.strip_prefix("bytes="))
            .and_then(|r| r.split_once('-'));
        match range {
            Some((a, b)) => {
                let start: usize = a.parse().unwrap_or(0);
                let end: usize = b.parse::<usize>().unwrap_or(size - 1).min(size - 1);
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
            None => {
                (StatusCode::OK, [(header::ETAG.as_str(), etag), ("x-repo-commit", SHA.to_string())], bytes.clone())
                    .into_response()
            }
        }
    }
    let files: Vec<(String, Vec<u8>)> =
        ["model.onnx", "tokenizer.json", "config.json", "special_tokens_map.json", "tokenizer_config.json"]
            .iter()
            .map(|f| (f.to_string(), std::fs::read(dir.join(f)).unwrap()))
            .collect();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let (atx, arx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async move {
            let app = axum::Router::new()
                .route("/api/models/{org}/{name}/revision/{rev}", axum::routing::get(info))
                .route("/{org}/{name}/resolve/{rev}/{*path}", axum::routing::get(resolve))
                .with_state(Arc::new(files));
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            atx.send(listener.local_addr().unwrap()).unwrap();
            tokio::select! {
                _ = axum::serve(listener, app) => {}
                _ = rx => {}
                _ = tokio::time::sleep(std::time::Duration::from_secs(300)) => {}
            }
        });
    });
    (format!("http://{}", arx.recv().unwrap()), tx)
}

#[test]
fn a_named_model_downloads_through_the_hub() {
    let Some(dir) = model_dir() else { return };
    let ort = onnxruntime();
    let (endpoint, _stop) = serve_model_hub(dir.clone());
    let p = Project::new();
    let refs = reference(&dir);
    p.write("texts.jsonl", format!("{}\n", serde_json::json!({"text": refs[0].0})));
    p.write(
        "p.toml",
        "[pipeline]\noutput_dir = \"out\"\n[embedders.m]\nkind = \"fastembed\"\nmodel = \"sentence-transformers/all-MiniLM-L6-v2\"\ncache_dir = \"models\"\n\
         [stages.t]\nkind = \"source\"\npath = \"texts.jsonl\"\n[stages.v]\nkind = \"embed\"\ninputs = [\"t\"]\nembedder = \"m\"\ncolumn = \"text\"\n\
         [stages.o]\nkind = \"parquet\"\ninputs = [\"v\"]\n",
    );
    p.synth_env(&["run", "p.toml"], &[("ORT_DYLIB_PATH", ort.to_str().unwrap()), ("HF_ENDPOINT", &endpoint)]).ok();
    let rows = parquet_rows(&p.path().join("out/v.parquet"));
    let have: Vec<f32> = rows[0]["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
    assert!(max_diff(&refs[0].1, &have) <= 1e-5);
    assert!(p.path().join("models").exists(), "downloaded into the configured cache dir");
}
