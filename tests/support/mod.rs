//! Helpers shared by the integration tests: temporary projects, running the
//! `synth` binary, reading outputs, comparing directories.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub mod batch_server;
pub mod eval_fixtures;
pub mod fake_hub;
pub mod openai_server;

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `../shared/<folder>` when it holds `probe`, or `None` after saying why (the shared
/// data and models are read in place, never copied, and absent on some machines).
pub fn shared(folder: &str, probe: &str) -> Option<PathBuf> {
    let dir = repo().join("../shared").join(folder);
    if dir.join(probe).exists() {
        Some(dir)
    } else {
        eprintln!("SKIPPED: {} is absent (the shared folder is not on this machine)", dir.display());
        None
    }
}

/// `../shared/models/all-MiniLM-L6-v2` (the real ONNX model), or `None` after saying why.
/// `.tools/torchpy` when it can import torch and transformers, else `None` after saying why.
pub fn torch_python() -> Option<PathBuf> {
    let py = repo().join(".tools/torchpy");
    let ok = py.exists()
        && std::process::Command::new(&py)
            .args(["-c", "import torch, transformers, numpy, matplotlib"])
            .output()
            .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!(
            "SKIPPED: {} cannot import torch/transformers (run pipelines/tools/setup_torch.sh; .ci/setup does)",
            py.display()
        );
    }
    ok.then_some(py)
}

pub fn minilm_dir() -> Option<PathBuf> {
    shared("models/all-MiniLM-L6-v2", "model.onnx")
}

/// Rows of a stage's failure table in an output directory (empty when it has none).
pub fn failures(dir: &Path, stage: &str) -> Vec<serde_json::Map<String, serde_json::Value>> {
    let p = dir.join(format!("{stage}.failures.parquet"));
    if p.exists() { parquet_rows(&p) } else { Vec::new() }
}

/// The ONNX Runtime library `.ci/setup` installs (panics when it is missing: the tests
/// need it wherever the model is present).
pub fn onnxruntime() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    synth::onnx::find_onnxruntime(None, &root)
        .filter(|p| p.exists())
        .expect("ONNX Runtime is missing: run .ci/setup (the README's test command .ci/test does)")
}

/// Every `.rs` file under `dir`, sorted.
pub fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out.sort();
}

pub fn synth_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_synth"))
}

/// A temporary directory holding a pipeline and its data.
pub struct Project {
    pub dir: tempfile::TempDir,
}

impl Project {
    pub fn new() -> Project {
        Project { dir: tempfile::tempdir().expect("tempdir") }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn write(&self, rel: &str, content: impl AsRef<[u8]>) -> PathBuf {
        let p = self.path().join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&p, content).unwrap();
        p
    }

    /// Run `synth ARGS...` with the project as working directory.
    pub fn synth(&self, args: &[&str]) -> Run {
        self.synth_env(args, &[])
    }

    /// Run `synth ARGS...` with extra environment variables.
    pub fn synth_env(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        let mut cmd = Command::new(synth_bin());
        cmd.args(args).current_dir(self.path()).env("CI", "1").env_remove("SYNTH_LOG").env_remove("OPENAI_API_KEY");
        // The suite runs two tests at once on CI's two cores: llama.cpp's two threads beside a
        // busy test spin at every barrier (8× slower, BENCHMARKS.md "llama.cpp's thread pool
        // vs OpenMP"); one thread has no barrier. Answers are the same bytes for any count.
        cmd.env(synth::providers::local::THREADS_ENV, "1");
        // The same for PyTorch's OpenMP threads (the trainer and the neuron analysis).
        cmd.env("OMP_NUM_THREADS", "1");
        for (k, v) in env {
            cmd.env(k, v);
        }
        Run::from(cmd.output().expect("run synth"))
    }

    /// Start `synth ARGS...` without waiting (stdout and stderr captured).
    pub fn spawn_env(&self, args: &[&str], env: &[(&str, &str)]) -> std::process::Child {
        let mut cmd = Command::new(synth_bin());
        cmd.args(args).current_dir(self.path()).env("CI", "1").env_remove("SYNTH_LOG").env_remove("OPENAI_API_KEY");
        // The suite runs two tests at once on CI's two cores: llama.cpp's two threads beside a
        // busy test spin at every barrier (8× slower, BENCHMARKS.md "llama.cpp's thread pool
        // vs OpenMP"); one thread has no barrier. Answers are the same bytes for any count.
        cmd.env(synth::providers::local::THREADS_ENV, "1");
        // The same for PyTorch's OpenMP threads (the trainer and the neuron analysis).
        cmd.env("OMP_NUM_THREADS", "1");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().expect("spawn synth")
    }

    pub fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path().join(rel)).unwrap_or_else(|e| panic!("reading {rel}: {e}"))
    }
}

/// Outcome of a `synth` invocation.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(o: Output) -> Run {
        Run {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).to_string(),
            stderr: String::from_utf8_lossy(&o.stderr).to_string(),
        }
    }
}

impl Run {
    pub fn ok(self) -> Run {
        assert_eq!(self.code, 0, "synth failed\nstdout:\n{}\nstderr:\n{}", self.stdout, self.stderr);
        self
    }

    pub fn code(self, expected: i32) -> Run {
        assert_eq!(self.code, expected, "unexpected exit code\nstdout:\n{}\nstderr:\n{}", self.stdout, self.stderr);
        self
    }
}

/// Write `n` JSONL records `{"name": ..., "age": ..., "city": ...}`.
pub fn people_jsonl(n: usize) -> String {
    let mut s = String::new();
    for i in 0..n {
        s.push_str(&format!(
            "{{\"name\": \"p{i}\", \"age\": {}, \"city\": \"{}\"}}\n",
            i % 90,
            ["rome", "oslo", "lima"][i % 3]
        ));
    }
    s
}

/// Every data file of an output directory (not `_synth/`, not the manifest) with its bytes.
pub fn output_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let p = entry.path();
            let rel = p.strip_prefix(dir).unwrap().to_string_lossy().to_string();
            if rel.starts_with("_synth") || rel == "manifest.json" {
                continue;
            }
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

/// Assert two output directories hold byte-identical data files.
pub fn assert_same_outputs(a: &Path, b: &Path) {
    let fa = output_files(a);
    let fb = output_files(b);
    assert_eq!(fa.keys().collect::<Vec<_>>(), fb.keys().collect::<Vec<_>>(), "different output files");
    for (name, bytes) in &fa {
        assert!(bytes == &fb[name], "{name} differs between {} and {}", a.display(), b.display());
    }
}

/// The manifest of an output directory as JSON.
pub fn manifest(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).expect("manifest")).expect("json")
}

/// Stage statuses from the manifest.
pub fn statuses(dir: &Path) -> BTreeMap<String, String> {
    manifest(dir)["stages"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v["status"].as_str().unwrap().to_string()))
        .collect()
}

/// Serve `app` on 127.0.0.1 from a thread of its own (at most 300 s): its base URL and a
/// stop handle.
pub fn serve_router(app: axum::Router) -> (String, tokio::sync::oneshot::Sender<()>) {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx.send(listener.local_addr().unwrap()).unwrap();
            let server = axum::serve(listener, app).with_graceful_shutdown(async {
                let _ = rx.await;
            });
            // Bounded in time: a test server never outlives a few minutes.
            let _ = tokio::time::timeout(std::time::Duration::from_secs(300), server).await;
        });
    });
    (format!("http://{}", addr_rx.recv().unwrap()), tx)
}

/// Rows of a Parquet file as JSON objects.
pub fn parquet_rows(path: &Path) -> Vec<serde_json::Map<String, serde_json::Value>> {
    let (_, batches) = synth::store::parquet::read_all(path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
    let mut rows = Vec::new();
    for b in &batches {
        for i in 0..b.num_rows() {
            rows.push(synth::data::row_json(b, i));
        }
    }
    rows
}

/// The folder of wave `k` of a sharded run's output directory (`_synth/waves/w<k>-...`).
pub fn wave_dir(out: &Path, k: usize) -> PathBuf {
    let prefix = format!("w{k}-");
    std::fs::read_dir(out.join("_synth/waves"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|d| d.is_dir() && d.file_name().unwrap().to_string_lossy().starts_with(&prefix))
        .unwrap_or_else(|| panic!("no folder of wave {k} in {}", out.display()))
}
