//! ONNX Runtime for the whole process: where its library is found and the one
//! environment it allows, shared by the fastembed embedders (`embed`) and the
//! BERTScore encoder (`eval`).

use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow};

/// Where to load ONNX Runtime from: the option, then $ORT_DYLIB_PATH, then the
/// library `.ci/setup` installs under the pipeline root's `.tools/onnxruntime/`.
pub fn find_onnxruntime(option: Option<&str>, root: &Path) -> Option<PathBuf> {
    if let Some(p) = option {
        return Some(root.join(p));
    }
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    for dir in [root.to_path_buf(), std::env::current_dir().unwrap_or_default()] {
        let mut d = Some(dir.as_path());
        while let Some(cur) = d {
            let candidate = cur.join(".tools/onnxruntime/libonnxruntime.so");
            if candidate.exists() {
                return Some(candidate);
            }
            d = cur.parent();
        }
    }
    None
}

static ORT_ENV: std::sync::OnceLock<Result<ort::environment::Environment, String>> = std::sync::OnceLock::new();

/// Load ONNX Runtime once per process and create the process's one ONNX Runtime
/// environment (ONNX Runtime allows only one), shared by every fastembed model and the
/// BERTScore encoder.
pub fn ort_environment(dylib: &Option<PathBuf>) -> Result<ort::environment::Environment> {
    let result = ORT_ENV.get_or_init(|| {
        let Some(path) = dylib else {
            return Err("ONNX Runtime was not found: set ORT_DYLIB_PATH to libonnxruntime.so (1.24 or newer), \
                        set `ort_dylib` on the embedder, or run `.ci/setup` to install it under .tools/onnxruntime/"
                .to_string());
        };
        if !path.exists() {
            return Err(format!("ONNX Runtime library {} does not exist", path.display()));
        }
        let path = path.clone();
        let loaded = std::panic::catch_unwind(move || {
            ort::init_from(&path).map_err(|e| e.to_string()).and_then(|b| b.build().map_err(|e| e.to_string()))
        });
        match loaded {
            Ok(Ok(env)) => Ok(env),
            Ok(Err(e)) => Err(format!("loading ONNX Runtime from {}: {e}", dylib.as_ref().expect("checked").display())),
            Err(_) => Err(format!(
                "loading ONNX Runtime from {} failed (wrong version? 1.24 or newer is needed)",
                dylib.as_ref().expect("checked").display()
            )),
        }
    });
    result.clone().map_err(|e| anyhow!(e))
}
