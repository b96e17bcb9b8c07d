//! The `fastembed` embedder: local ONNX models through fastembed — a named model
//! (downloaded through the Hugging Face Hub into a cache dir) or a model directory
//! holding `model.onnx` and its tokenizer files, as in `shared/models/all-MiniLM-L6-v2`.
//! ONNX Runtime is loaded at run time (ort's `load-dynamic`); a missing library is
//! reported as an error naming where synth looked, not a panic.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, anyhow, bail};
use async_trait::async_trait;
use fastembed::{
    EmbeddingModel, InitOptionsUserDefined, Pooling, TextEmbedding, TextInitOptions, TokenizerFiles,
    UserDefinedEmbeddingModel,
};
use serde::Deserialize;

use super::embedder::Embedder;
use synth_core::onnx::{find_onnxruntime, ort_environment};
use synth_llm::CallCtx;
use synth_retrieval::l2_normalize;

#[derive(Debug, Clone, Deserialize)]
struct Options {
    model: Option<String>,
    model_dir: Option<String>,
    pooling: String,
    max_length: usize,
    dim: Option<usize>,
    batch_size: usize,
    ort_dylib: Option<String>,
    cache_dir: Option<String>,
    threads: Option<usize>,
}

/// Named models synth knows the dimension of (fastembed's model codes).
const NAMED: &[(&str, EmbeddingModel, usize)] = &[
    ("sentence-transformers/all-MiniLM-L6-v2", EmbeddingModel::AllMiniLML6V2, 384),
    ("sentence-transformers/all-MiniLM-L12-v2", EmbeddingModel::AllMiniLML12V2, 384),
    ("BAAI/bge-small-en-v1.5", EmbeddingModel::BGESmallENV15, 384),
    ("BAAI/bge-base-en-v1.5", EmbeddingModel::BGEBaseENV15, 768),
    ("BAAI/bge-large-en-v1.5", EmbeddingModel::BGELargeENV15, 1024),
    ("nomic-ai/nomic-embed-text-v1.5", EmbeddingModel::NomicEmbedTextV15, 768),
    ("intfloat/multilingual-e5-small", EmbeddingModel::MultilingualE5Small, 384),
];

pub fn named_models() -> Vec<&'static str> {
    NAMED.iter().map(|(n, _, _)| *n).collect()
}

fn find_named(m: &str) -> Option<&'static (&'static str, EmbeddingModel, usize)> {
    NAMED
        .iter()
        .find(|(n, _, _)| n.eq_ignore_ascii_case(m) || n.rsplit('/').next().is_some_and(|s| s.eq_ignore_ascii_case(m)))
}

/// The dimension of a named model.
pub fn named_dim(m: &str) -> Option<usize> {
    find_named(m).map(|(_, _, d)| *d)
}

pub struct FastEmbed {
    id: String,
    dim: usize,
    batch_size: usize,
    /// Built on first use (loading ONNX Runtime and the model takes a while).
    model: Mutex<Option<Arc<Mutex<TextEmbedding>>>>,
    source: Source,
    max_length: usize,
    threads: Option<usize>,
    dylib: Option<PathBuf>,
}

#[derive(Clone)]
enum Source {
    Named(EmbeddingModel, Option<PathBuf>),
    Dir(PathBuf, Pooling),
}

impl FastEmbed {
    pub fn from_options(name: &str, v: &serde_json::Value, root: &Path) -> Result<FastEmbed> {
        let o: Options = serde_json::from_value(v.clone())?;
        let pooling = if o.pooling == "cls" { Pooling::Cls } else { Pooling::Mean };
        let (source, dim, id_model) = match (&o.model, &o.model_dir) {
            (Some(m), None) => {
                let (_, model, dim) = find_named(m).ok_or_else(|| {
                    anyhow!(
                        "embedder \"{name}\": unknown fastembed model \"{m}\" (known: {}); or use model_dir",
                        named_models().join(", ")
                    )
                })?;
                (
                    Source::Named(model.clone(), o.cache_dir.as_ref().map(|d| root.join(d))),
                    o.dim.unwrap_or(*dim),
                    m.clone(),
                )
            }
            (None, Some(dir)) => {
                let dim = o.dim.ok_or_else(|| anyhow!("embedder \"{name}\": set `dim` for a model_dir"))?;
                let path = root.join(dir);
                if !path.join("model.onnx").is_file() {
                    bail!("embedder \"{name}\": {} has no model.onnx", path.display());
                }
                // The model's identity is its content, not its path.
                let digest = synth_core::store::filehash::hash_file(&path.join("model.onnx"))?;
                (Source::Dir(path, pooling), dim, format!("dir:{}", &digest[..16]))
            }
            _ => bail!("embedder \"{name}\": give exactly one of `model` and `model_dir`"),
        };
        Ok(FastEmbed {
            id: format!("fastembed:{id_model}:pool={}:len={}:dim={dim}", o.pooling, o.max_length),
            dim,
            batch_size: o.batch_size,
            model: Mutex::new(None),
            source,
            max_length: o.max_length,
            threads: o.threads,
            dylib: find_onnxruntime(o.ort_dylib.as_deref(), root),
        })
    }

    fn load(&self) -> Result<Arc<Mutex<TextEmbedding>>> {
        if let Some(m) = self.model.lock().expect("model").as_ref() {
            return Ok(m.clone());
        }
        let env = ort_environment(&self.dylib)?;
        let model = match &self.source {
            Source::Dir(dir, pooling) => {
                let read =
                    |f: &str| std::fs::read(dir.join(f)).with_context(|| format!("reading {}", dir.join(f).display()));
                let files = TokenizerFiles {
                    tokenizer_file: read("tokenizer.json")?,
                    config_file: read("config.json")?,
                    special_tokens_map_file: read("special_tokens_map.json")?,
                    tokenizer_config_file: read("tokenizer_config.json")?,
                };
                let user = UserDefinedEmbeddingModel::new(read("model.onnx")?, files).with_pooling(pooling.clone());
                let mut opts = InitOptionsUserDefined::new().with_max_length(self.max_length).with_environment(env);
                if let Some(t) = self.threads {
                    opts = opts.with_intra_threads(t);
                }
                TextEmbedding::try_new_from_user_defined(user, opts)
                    .map_err(|e| anyhow!("loading the model in {}: {e}", dir.display()))?
            }
            Source::Named(model, cache) => {
                let mut opts = TextInitOptions::new(model.clone())
                    .with_environment(env)
                    .with_max_length(self.max_length)
                    .with_show_download_progress(false);
                if let Some(c) = cache {
                    opts = opts.with_cache_dir(c.clone());
                }
                if let Some(t) = self.threads {
                    opts = opts.with_intra_threads(t);
                }
                TextEmbedding::try_new(opts).map_err(|e| anyhow!("loading fastembed model {model:?}: {e}"))?
            }
        };
        let model = Arc::new(Mutex::new(model));
        *self.model.lock().expect("model") = Some(model.clone());
        Ok(model)
    }

    /// Embed on the calling thread (blocking).
    pub fn embed_blocking(&self, texts: &[String]) -> Result<Vec<Vec<f32>>> {
        let model = self.load()?;
        let mut m = model.lock().expect("model");
        let mut out = m.embed(texts, Some(self.batch_size)).map_err(|e| anyhow!("embedding: {e}"))?;
        for v in &mut out {
            if v.len() != self.dim {
                bail!("the model returns {}-dimensional vectors but `dim` is {}", v.len(), self.dim);
            }
            l2_normalize(v);
        }
        Ok(out)
    }
}

#[async_trait]
impl Embedder for FastEmbed {
    fn id(&self) -> String {
        self.id.clone()
    }
    fn dim(&self) -> usize {
        self.dim
    }
    fn batch_size(&self) -> usize {
        self.batch_size
    }
    async fn embed(&self, texts: &[String], _ctx: &CallCtx) -> Result<Vec<Vec<f32>>> {
        // Model loading and inference are CPU-bound: keep them off the async workers.
        tokio::task::block_in_place(|| self.embed_blocking(texts))
    }
}
