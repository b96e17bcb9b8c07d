//! BERTScore as the `bert_score` package (0.3.13) computes it with `idf=False` and no
//! baseline rescaling: contextual token embeddings from an ONNX encoder, cosine
//! similarity, greedy matching (each candidate token to its most similar reference token
//! for precision, and the reverse for recall), [CLS]/[SEP] weighted 0, F1 = 2PR/(P+R).
//!
//! Details kept from the reference so scores agree to float precision:
//! - text is `str.strip()`ped and encoded with special tokens, truncated to the
//!   tokenizer's `model_max_length` (512 by default); an empty text is `[CLS] [SEP]`;
//! - byte-level BPE tokenizers (RoBERTa, GPT-2) get a leading space, as bert_score's
//!   `add_prefix_space=True`;
//! - pairs are compared in batches of 64 (bert_score's `batch_size`): a token's best
//!   match is taken over a zero-padded row, so when its pair is shorter than the longest
//!   one in its batch, a best similarity below 0 counts as 0;
//! - an empty candidate or reference scores 0 (P, R and F1); an undefined F1 is 0.
//!
//! The encoder is any ONNX export taking `input_ids` / `attention_mask` (and
//! `token_type_ids` when it declares it) and returning `[batch, seq, dim]` hidden states
//! (the output named `last_hidden_state` by default). bert_score's official setting is
//! roberta-large layer 17: export a model truncated to 17 layers to match it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, Result, anyhow, bail};
use ort::session::Session;
use ort::session::builder::GraphOptimizationLevel;
use ort::value::Tensor;
use rayon::prelude::*;
use tokenizers::{Tokenizer, TruncationParams};

/// bert_score's default batch size, which decides the zero padding seen by the greedy match.
pub const PAIR_BATCH: usize = 64;

/// Most texts per encoder call.
const MAX_BATCH: usize = 64;

/// Where the encoder is and how to run it.
#[derive(Debug, Clone)]
pub struct BertScoreConfig {
    /// Directory with `model.onnx` and `tokenizer.json` (plus `tokenizer_config.json` /
    /// `special_tokens_map.json` when the special tokens are not `[CLS]`/`[SEP]`/`[PAD]`).
    pub model_dir: PathBuf,
    /// ONNX output holding the hidden states; `last_hidden_state`, else the first output.
    pub output: Option<String>,
    /// Truncation length in tokens; default: `model_max_length` from
    /// `tokenizer_config.json`, else 512.
    pub max_length: Option<usize>,
    /// ONNX Runtime library (else $ORT_DYLIB_PATH or `.tools/onnxruntime/`).
    pub ort_dylib: Option<PathBuf>,
    /// Cores for ONNX Runtime in all (default: all cores).
    pub threads: Option<usize>,
    /// Encoder sessions run side by side, sharing `threads` (default: 2 with 2+ cores);
    /// each holds its own copy of the model's weights.
    pub sessions: Option<usize>,
    /// Padded tokens per encoder call (texts of similar length are batched up to this).
    pub batch_tokens: usize,
    /// Pairs per greedy-matching batch, as bert_score's `batch_size` (default 64): where a
    /// pair's zero padding enters the max. 1 scores each pair on its own, as the official
    /// `evaluation.py` does (it calls `evaluate`'s bertscore once per pair).
    pub pair_batch: usize,
}

impl BertScoreConfig {
    pub fn new(model_dir: impl Into<PathBuf>) -> BertScoreConfig {
        BertScoreConfig {
            model_dir: model_dir.into(),
            output: None,
            max_length: None,
            ort_dylib: None,
            threads: None,
            sessions: None,
            batch_tokens: 512,
            pair_batch: PAIR_BATCH,
        }
    }
}

/// Precision, recall and F1 of one pair.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prf {
    pub p: f64,
    pub r: f64,
    pub f1: f64,
}

/// A loaded encoder and tokenizer.
pub struct BertScorer {
    /// Independent sessions encode batches in parallel (each with its share of the
    /// cores): faster than one session's intra-op threads on small matrices.
    sessions: Vec<Mutex<Session>>,
    tokenizer: Tokenizer,
    output: String,
    token_type_ids: bool,
    prefix_space: bool,
    cls: u32,
    sep: u32,
    pad: u32,
    batch_tokens: usize,
    pair_batch: usize,
    /// What was loaded, for manifests and reports.
    pub description: String,
}

/// One text's normalised token embeddings (`len × dim`, row-major) and token weights.
struct Embedded {
    vectors: Vec<f32>,
    weights: Vec<f32>,
}

impl Embedded {
    fn len(&self) -> usize {
        self.weights.len()
    }
}

/// Python's `str.strip()` (Unicode whitespace plus the separators \x1c–\x1f).
fn py_strip(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c))
}

/// A special token named in `special_tokens_map.json` / `tokenizer_config.json`
/// (a string or `{"content": ...}`).
fn special_token(dir: &Path, key: &str) -> Option<String> {
    for file in ["special_tokens_map.json", "tokenizer_config.json"] {
        let Ok(text) = std::fs::read_to_string(dir.join(file)) else { continue };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else { continue };
        match &v[key] {
            serde_json::Value::String(s) => return Some(s.clone()),
            serde_json::Value::Object(o) => {
                if let Some(s) = o.get("content").and_then(|c| c.as_str()) {
                    return Some(s.to_string());
                }
            }
            _ => {}
        }
    }
    None
}

fn model_max_length(dir: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(dir.join("tokenizer_config.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    // Tokenizers without a limit store a huge sentinel (1e30); treat it as absent.
    v["model_max_length"].as_f64().filter(|n| *n >= 1.0 && *n <= 1e6).map(|n| n as usize)
}

impl BertScorer {
    /// The files an encoder directory must hold (checked before a load starts).
    pub fn check_files(dir: &Path) -> Result<()> {
        for name in ["model.onnx", "tokenizer.json"] {
            if !dir.join(name).is_file() {
                bail!(
                    "BERTScore model directory {}: {name} is missing (it needs model.onnx and tokenizer.json)",
                    dir.display()
                );
            }
        }
        Ok(())
    }

    /// Load the tokenizer and the ONNX model from `cfg.model_dir`.
    pub fn load(cfg: &BertScoreConfig) -> Result<BertScorer> {
        let started = std::time::Instant::now();
        let dir = &cfg.model_dir;
        Self::check_files(dir)?;
        let model = dir.join("model.onnx");
        let tok_path = dir.join("tokenizer.json");
        let mut tokenizer =
            Tokenizer::from_file(&tok_path).map_err(|e| anyhow!("reading tokenizer {}: {e}", tok_path.display()))?;
        let max_length = cfg.max_length.or_else(|| model_max_length(dir)).unwrap_or(512);
        tokenizer
            .with_truncation(Some(TruncationParams { max_length, ..Default::default() }))
            .map_err(|e| anyhow!("tokenizer {}: {e}", tok_path.display()))?;
        tokenizer.with_padding(None);
        let id = |key: &str, defaults: &[&str]| -> Result<u32> {
            let named = special_token(dir, key);
            named
                .iter()
                .map(String::as_str)
                .chain(defaults.iter().copied())
                .find_map(|t| tokenizer.token_to_id(t))
                .ok_or_else(|| anyhow!("tokenizer {}: no {key} in its vocabulary", tok_path.display()))
        };
        let cls = id("cls_token", &["[CLS]", "<s>"])?;
        let sep = id("sep_token", &["[SEP]", "</s>"])?;
        let pad = id("pad_token", &["[PAD]", "<pad>"]).unwrap_or(0);
        let tok_json = std::fs::read_to_string(&tok_path)?;
        let prefix_space = tok_json.contains("\"ByteLevel\"");

        let dylib = cfg
            .ort_dylib
            .clone()
            .or_else(|| synth_core::onnx::find_onnxruntime(None, &std::env::current_dir().unwrap_or_default()));
        let env = synth_core::onnx::ort_environment(&dylib)?;
        let threads = cfg.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1);
        let sessions = cfg.sessions.unwrap_or(if threads >= 2 { 2 } else { 1 }).clamp(1, threads);
        let sessions: Vec<Session> = (0..sessions)
            .map(|k| {
                // Cores split between the sessions (the first ones take the remainder).
                let intra = threads / sessions + usize::from(k < threads % sessions);
                Session::builder(&env)
                    .and_then(|b| b.with_optimization_level(GraphOptimizationLevel::All).map_err(Into::into))
                    .and_then(|b| b.with_intra_threads(intra).map_err(Into::into))
                    .and_then(|b| b.with_intra_op_spinning(false).map_err(Into::into))
                    .and_then(|mut b| b.commit_from_file(&model))
                    .map_err(|e| anyhow!("loading ONNX model {}: {e}", model.display()))
            })
            .collect::<Result<_>>()?;
        let session = &sessions[0];
        let inputs: Vec<String> = session.inputs().iter().map(|o| o.name().to_string()).collect();
        for need in ["input_ids", "attention_mask"] {
            if !inputs.iter().any(|i| i == need) {
                bail!("ONNX model {}: no input \"{need}\" (inputs: {})", model.display(), inputs.join(", "));
            }
        }
        let outputs: Vec<String> = session.outputs().iter().map(|o| o.name().to_string()).collect();
        let output = match &cfg.output {
            Some(o) if outputs.contains(o) => o.clone(),
            Some(o) => bail!("ONNX model {}: no output \"{o}\" (outputs: {})", model.display(), outputs.join(", ")),
            None if outputs.iter().any(|o| o == "last_hidden_state") => "last_hidden_state".to_string(),
            None => outputs.first().cloned().ok_or_else(|| anyhow!("ONNX model {} has no output", model.display()))?,
        };
        tracing::debug!(
            "BERTScore encoder {} loaded in {:.3} s ({} sessions)",
            model.display(),
            started.elapsed().as_secs_f64(),
            sessions.len()
        );
        Ok(BertScorer {
            token_type_ids: inputs.iter().any(|i| i == "token_type_ids"),
            sessions: sessions.into_iter().map(Mutex::new).collect(),
            tokenizer,
            description: format!("{} ({output}, max_length {max_length})", dir.display()),
            output,
            prefix_space,
            cls,
            sep,
            pad,
            batch_tokens: cfg.batch_tokens.max(1),
            pair_batch: cfg.pair_batch.max(1),
        })
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let text = py_strip(text);
        if text.is_empty() {
            return Ok(vec![self.cls, self.sep]);
        }
        let owned;
        let text = if self.prefix_space {
            owned = format!(" {text}");
            owned.as_str()
        } else {
            text
        };
        let enc = self.tokenizer.encode(text, true).map_err(|e| anyhow!("tokenizing: {e}"))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Encode one batch of texts (by index into `ids`) with `session`.
    fn run_batch(&self, session: &mut Session, chunk: &[usize], ids: &[Vec<u32>]) -> Result<Vec<(usize, Embedded)>> {
        let seq = chunk.iter().map(|&i| ids[i].len()).max().unwrap_or(0);
        let b = chunk.len();
        let mut input_ids = vec![self.pad as i64; b * seq];
        let mut mask = vec![0i64; b * seq];
        for (row, &i) in chunk.iter().enumerate() {
            for (k, &t) in ids[i].iter().enumerate() {
                input_ids[row * seq + k] = t as i64;
                mask[row * seq + k] = 1;
            }
        }
        let mut inputs = vec![
            ("input_ids", Tensor::from_array(([b, seq], input_ids))?.into_dyn()),
            ("attention_mask", Tensor::from_array(([b, seq], mask))?.into_dyn()),
        ];
        if self.token_type_ids {
            inputs.push(("token_type_ids", Tensor::from_array(([b, seq], vec![0i64; b * seq]))?.into_dyn()));
        }
        let outputs = session.run(inputs).context("running the BERTScore encoder")?;
        let (shape, data) = outputs[self.output.as_str()]
            .try_extract_tensor::<f32>()
            .with_context(|| format!("output \"{}\" is not a float tensor", self.output))?;
        if shape.len() != 3 || shape[0] as usize != b || shape[1] as usize != seq {
            bail!("output \"{}\" has shape {shape:?}; expected [{b}, {seq}, dim]", self.output);
        }
        let dim = shape[2] as usize;
        let mut out = Vec::with_capacity(b);
        for (row, &i) in chunk.iter().enumerate() {
            let n = ids[i].len();
            let mut vectors = data[row * seq * dim..(row * seq + n) * dim].to_vec();
            for v in vectors.chunks_mut(dim) {
                let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
                v.iter_mut().for_each(|x| *x /= norm);
            }
            let weights = ids[i].iter().map(|&t| if t == self.cls || t == self.sep { 0.0 } else { 1.0 }).collect();
            out.push((i, Embedded { vectors, weights }));
        }
        Ok(out)
    }

    /// Normalised token embeddings of each text (texts of similar length share a call).
    fn embed(&self, texts: &[&str]) -> Result<Vec<Embedded>> {
        let started = std::time::Instant::now();
        let ids: Vec<Vec<u32>> = texts.iter().map(|t| self.encode(t)).collect::<Result<_>>()?;
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(ids[i].len()));
        // Length-sorted batches bounded by padded tokens: ONNX Runtime's attention buffers
        // grow with batch × length², and a few big batches run slower than many small ones.
        let mut batches: Vec<&[usize]> = Vec::new();
        let mut start = 0;
        while start < order.len() {
            let seq = ids[order[start]].len().max(1);
            let n = (self.batch_tokens / seq).clamp(1, MAX_BATCH).min(order.len() - start);
            batches.push(&order[start..start + n]);
            start += n;
        }
        // One worker per session; each takes the next batch until none is left.
        let next = AtomicUsize::new(0);
        let results: Vec<Result<Vec<(usize, Embedded)>>> = std::thread::scope(|scope| {
            let workers: Vec<_> = self
                .sessions
                .iter()
                .map(|session| {
                    let (next, batches, ids) = (&next, &batches, &ids);
                    scope.spawn(move || -> Result<Vec<(usize, Embedded)>> {
                        let mut session = session.lock().map_err(|_| anyhow!("BERTScore encoder poisoned"))?;
                        let mut done = Vec::new();
                        loop {
                            let k = next.fetch_add(1, Ordering::Relaxed);
                            let Some(chunk) = batches.get(k) else { return Ok(done) };
                            done.extend(self.run_batch(&mut session, chunk, ids)?);
                        }
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().unwrap_or_else(|_| Err(anyhow!("BERTScore worker panicked"))))
                .collect()
        });
        tracing::debug!(
            "BERTScore encoder: {} texts, {} tokens, {} batches in {:.3} s",
            texts.len(),
            ids.iter().map(Vec::len).sum::<usize>(),
            batches.len(),
            started.elapsed().as_secs_f64()
        );
        let mut out: Vec<Option<Embedded>> = (0..texts.len()).map(|_| None).collect();
        for r in results {
            for (i, e) in r? {
                out[i] = Some(e);
            }
        }
        Ok(out.into_iter().map(|e| e.expect("every text embedded")).collect())
    }

    /// P, R and F1 of each (candidate, reference) pair, in order.
    pub fn score(&self, pairs: &[(&str, &str)]) -> Result<Vec<Prf>> {
        // Each distinct text is embedded once.
        let mut index: HashMap<&str, usize> = HashMap::new();
        let mut texts: Vec<&str> = Vec::new();
        for (c, r) in pairs {
            for t in [*c, *r] {
                index.entry(t).or_insert_with(|| {
                    texts.push(t);
                    texts.len() - 1
                });
            }
        }
        let emb = self.embed(&texts)?;
        // Batches of pairs are independent once embedded: scored on all cores.
        let scored: Vec<Vec<Prf>> = pairs
            .par_chunks(self.pair_batch)
            .map(|batch| {
                let cands: Vec<&Embedded> = batch.iter().map(|(c, _)| &emb[index[c]]).collect();
                let refs: Vec<&Embedded> = batch.iter().map(|(_, r)| &emb[index[r]]).collect();
                let cand_max = cands.iter().map(|e| e.len()).max().unwrap_or(0);
                let ref_max = refs.iter().map(|e| e.len()).max().unwrap_or(0);
                cands.iter().zip(&refs).map(|(c, r)| greedy(c, r, c.len() < cand_max, r.len() < ref_max)).collect()
            })
            .collect();
        Ok(scored.into_iter().flatten().collect())
    }
}

/// Greedy matching of one pair. `cand_padded` / `ref_padded`: the side is shorter than
/// the longest in its batch, so its zero-masked padding takes part in the other side's max.
fn greedy(c: &Embedded, r: &Embedded, cand_padded: bool, ref_padded: bool) -> Prf {
    if c.len() == 2 || r.len() == 2 {
        return Prf { p: 0.0, r: 0.0, f1: 0.0 };
    }
    let dim = c.vectors.len() / c.len();
    let (n, m) = (c.len(), r.len());
    let mut best_c = vec![if ref_padded { 0.0f32 } else { f32::NEG_INFINITY }; n];
    let mut best_r = vec![if cand_padded { 0.0f32 } else { f32::NEG_INFINITY }; m];
    best_matches(&c.vectors, &r.vectors, dim, &mut best_c, &mut best_r);
    let weighted = |best: &[f32], w: &[f32]| -> f64 {
        let total: f64 = w.iter().map(|&x| x as f64).sum();
        best.iter().zip(w).map(|(&b, &x)| b as f64 * x as f64).sum::<f64>() / total
    };
    let p = weighted(&best_c, &c.weights);
    let r = weighted(&best_r, &r.weights);
    let f1 = 2.0 * p * r / (p + r);
    Prf { p, r, f1: if f1.is_nan() { 0.0 } else { f1 } }
}

/// Every candidate token's best similarity into `best_c`, every reference token's into
/// `best_r` (both start at their floor); AVX-512 or AVX2+FMA code when the CPU has it.
fn best_matches(c: &[f32], r: &[f32], dim: usize, best_c: &mut [f32], best_r: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the features the function is compiled for were just detected.
            return unsafe { best_matches_avx512(c, r, dim, best_c, best_r) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: as above.
            return unsafe { best_matches_avx2(c, r, dim, best_c, best_r) };
        }
    }
    best_matches_generic(c, r, dim, best_c, best_r)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn best_matches_avx2(c: &[f32], r: &[f32], dim: usize, best_c: &mut [f32], best_r: &mut [f32]) {
    best_matches_generic(c, r, dim, best_c, best_r)
}

#[inline(always)]
fn best_matches_generic(c: &[f32], r: &[f32], dim: usize, best_c: &mut [f32], best_r: &mut [f32]) {
    for (cv, bc) in c.chunks_exact(dim).zip(best_c.iter_mut()) {
        for (rv, br) in r.chunks_exact(dim).zip(best_r.iter_mut()) {
            let s = dot(cv, rv);
            *bc = bc.max(s);
            *br = br.max(s);
        }
    }
}

/// AVX-512: tiles of 4 candidate × 4 reference tokens, so each loaded chunk of a vector
/// feeds four multiply-adds (16 accumulator registers); the edges go one inner product
/// at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn best_matches_avx512(c: &[f32], r: &[f32], dim: usize, best_c: &mut [f32], best_r: &mut [f32]) {
    let (n, m) = (best_c.len(), best_r.len());
    assert!(c.len() >= n * dim && r.len() >= m * dim, "embedding sizes");
    let (n4, m4) = (n - n % 4, m - m % 4);
    let row = |v: &[f32], i: usize| v[i * dim..(i + 1) * dim].as_ptr();
    for i in (0..n4).step_by(4) {
        let cs = [row(c, i), row(c, i + 1), row(c, i + 2), row(c, i + 3)];
        for j in (0..m4).step_by(4) {
            let rs = [row(r, j), row(r, j + 1), row(r, j + 2), row(r, j + 3)];
            // SAFETY: every pointer starts a row of `dim` floats (the slices checked above).
            let tile = unsafe { dot_tile_avx512(cs, rs, dim) };
            for (a, sims) in tile.iter().enumerate() {
                for (b, &s) in sims.iter().enumerate() {
                    best_c[i + a] = best_c[i + a].max(s);
                    best_r[j + b] = best_r[j + b].max(s);
                }
            }
        }
    }
    for i in 0..n {
        let cv = &c[i * dim..(i + 1) * dim];
        let js = if i < n4 { m4..m } else { 0..m };
        for j in js {
            let s = dot(cv, &r[j * dim..(j + 1) * dim]);
            best_c[i] = best_c[i].max(s);
            best_r[j] = best_r[j].max(s);
        }
    }
}

/// The 16 inner products of four candidate and four reference rows of `dim` floats.
///
/// # Safety
/// Needs AVX-512F; every pointer must be valid for `dim` reads.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dot_tile_avx512(cs: [*const f32; 4], rs: [*const f32; 4], dim: usize) -> [[f32; 4]; 4] {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); 4]; 4];
    let whole = dim - dim % 16;
    let mut k = 0;
    while k < whole {
        // SAFETY: k + 16 <= dim.
        unsafe {
            let rv = [
                _mm512_loadu_ps(rs[0].add(k)),
                _mm512_loadu_ps(rs[1].add(k)),
                _mm512_loadu_ps(rs[2].add(k)),
                _mm512_loadu_ps(rs[3].add(k)),
            ];
            for a in 0..4 {
                let cv = _mm512_loadu_ps(cs[a].add(k));
                for b in 0..4 {
                    acc[a][b] = _mm512_fmadd_ps(cv, rv[b], acc[a][b]);
                }
            }
        }
        k += 16;
    }
    let mut out = [[0.0f32; 4]; 4];
    for a in 0..4 {
        for b in 0..4 {
            // SAFETY: whole..dim are in bounds.
            let tail: f32 = (whole..dim).map(|k| unsafe { *cs[a].add(k) * *rs[b].add(k) }).sum();
            out[a][b] = _mm512_reduce_add_ps(acc[a][b]) + tail;
        }
    }
    out
}

/// Inner product with 16 independent accumulators, so the compiler vectorizes it (a
/// different summation order than torch's, far below BERTScore's 1e-4 tolerance).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    const L: usize = 16;
    let mut acc = [0.0f32; L];
    let (ac, bc) = (a.chunks_exact(L), b.chunks_exact(L));
    let tail: f32 = ac.remainder().iter().zip(bc.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ac.zip(bc) {
        for k in 0..L {
            acc[k] += x[k] * y[k];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    fn emb(rows: &[&[f32]], weights: &[f32]) -> Embedded {
        Embedded { vectors: rows.concat(), weights: weights.to_vec() }
    }

    /// The tiled kernels agree with plain inner products on shapes with edges.
    #[test]
    fn tiled_best_matches_equal_plain_ones() {
        let mut x = 1u64;
        let mut next = || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 33) as f32 / (1u64 << 31) as f32) - 0.5
        };
        for (n, m, dim) in [(1, 1, 3), (5, 7, 19), (8, 4, 32), (9, 13, 384), (4, 4, 16)] {
            let c: Vec<f32> = (0..n * dim).map(|_| next()).collect();
            let r: Vec<f32> = (0..m * dim).map(|_| next()).collect();
            let (mut bc, mut br) = (vec![f32::NEG_INFINITY; n], vec![f32::NEG_INFINITY; m]);
            best_matches(&c, &r, dim, &mut bc, &mut br);
            let (mut pc, mut pr) = (vec![f32::NEG_INFINITY; n], vec![f32::NEG_INFINITY; m]);
            for i in 0..n {
                for j in 0..m {
                    let s: f32 = (0..dim).map(|k| c[i * dim + k] * r[j * dim + k]).sum();
                    pc[i] = pc[i].max(s);
                    pr[j] = pr[j].max(s);
                }
            }
            for (a, b) in bc.iter().chain(&br).zip(pc.iter().chain(&pr)) {
                assert!((a - b).abs() < 1e-5, "{n}x{m}x{dim}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn greedy_matches_each_token_to_its_best_counterpart() {
        // [CLS] a b [SEP] against [CLS] a [SEP]; unit vectors on the axes.
        let (cls, sep) = (&[1.0, 0.0, 0.0, 0.0][..], &[0.0, 1.0, 0.0, 0.0][..]);
        let a = &[0.0, 0.0, 1.0, 0.0][..];
        let b = &[0.0, 0.0, 0.6, 0.8][..];
        let c = emb(&[cls, a, b, sep], &[0.0, 1.0, 1.0, 0.0]);
        let r = emb(&[cls, a, sep], &[0.0, 1.0, 0.0]);
        let s = greedy(&c, &r, false, false);
        assert!((s.p - 0.8).abs() < 1e-6, "{s:?}"); // a→a 1.0, b→a 0.6
        assert!((s.r - 1.0).abs() < 1e-6, "{s:?}");
        assert!((s.f1 - 2.0 * 0.8 / 1.8).abs() < 1e-6, "{s:?}");
    }

    #[test]
    fn padding_floors_negative_best_matches_at_zero() {
        let (cls, sep) = (&[1.0, 0.0, 0.0][..], &[0.0, 1.0, 0.0][..]);
        let x = &[0.0, 0.0, 1.0][..];
        let y = &[-0.48, -0.64, -0.6][..]; // unit, negative against cls, x and sep
        let c = emb(&[cls, y, sep], &[0.0, 1.0, 0.0]);
        let r = emb(&[cls, x, sep], &[0.0, 1.0, 0.0]);
        assert!((greedy(&c, &r, false, false).p + 0.48).abs() < 1e-6);
        // Shorter reference than another in its batch: the zero padding wins the max.
        assert_eq!(greedy(&c, &r, false, true).p, 0.0);
        // The candidate's own padding does not touch precision.
        assert!((greedy(&c, &r, true, false).p + 0.48).abs() < 1e-6);
    }

    #[test]
    fn empty_sides_score_zero() {
        let e = emb(&[&[1.0, 0.0], &[0.0, 1.0]], &[0.0, 0.0]);
        let t = emb(&[&[1.0, 0.0], &[0.6, 0.8], &[0.0, 1.0]], &[0.0, 1.0, 0.0]);
        assert_eq!(greedy(&e, &t, false, false), Prf { p: 0.0, r: 0.0, f1: 0.0 });
        assert_eq!(greedy(&t, &e, false, false), Prf { p: 0.0, r: 0.0, f1: 0.0 });
    }

    #[test]
    fn python_strip() {
        assert_eq!(py_strip("\u{1f} a b\u{3000}\n"), "a b");
        assert_eq!(py_strip(" \t "), "");
    }
}
