//! Scoring (response, reference) pairs with a chosen set of metrics, and the mean and
//! population standard deviation per group and overall, as the official evaluation
//! reports them. Shared by the `metrics` stage and `synth score`.

use std::path::Path;
use std::sync::{Mutex, OnceLock};

use anyhow::{Result, anyhow, bail};

use super::bertscore::{BertScoreConfig, BertScorer};
use super::meteor::PunktParams;
use super::rouge::RougeTarget;
use super::wordnet::WordNet;
use super::{bleu, meteor, rouge};

/// Metric names accepted in configuration, in report order.
pub const METRICS: &[&str] = &["bleu", "rouge", "meteor", "bertscore"];

/// Default WordNet 3.0 location (Debian's `wordnet-base`).
pub const DEFAULT_WORDNET: &str = "/usr/share/wordnet";

/// Which metrics to compute; METEOR holds its WordNet, BERTScore its encoder.
pub struct Scorer {
    bleu: bool,
    rouge: bool,
    meteor: Option<WordNet>,
    bertscore: Option<LazyBert>,
    /// Punkt sentence-splitting parameters for METEOR's `word_tokenize` (NLTK's trained
    /// `punkt_tab/english`); the untrained tokenizer when absent.
    punkt: Option<PunktParams>,
    /// Which text is rouge_score's target (the official evaluation: the response).
    rouge_target: RougeTarget,
}

impl Scorer {
    /// `metrics` by name (see [`METRICS`]); WordNet is loaded only when METEOR is asked
    /// for, the BERTScore encoder (from `bertscore`, required then) only for BERTScore.
    pub fn new(metrics: &[String], wordnet_dir: &Path, bertscore: Option<&BertScoreConfig>) -> Result<Scorer> {
        for m in metrics {
            if !METRICS.contains(&m.as_str()) {
                bail!("unknown metric \"{m}\" (metrics: {})", METRICS.join(", "));
            }
        }
        let has = |m: &str| metrics.iter().any(|x| x == m);
        if has("bertscore") && bertscore.is_none() {
            bail!("{BERTSCORE_NEEDS_MODEL}");
        }
        // The encoder loads on its own thread from here on (ONNX Runtime's graph
        // optimisation keeps one core busy for a while): WordNet and the string metrics
        // run meanwhile, and the first BERTScore call waits for it.
        let bertscore = match bertscore.filter(|_| has("bertscore")) {
            Some(cfg) => {
                BertScorer::check_files(&cfg.model_dir)?;
                let cfg = cfg.clone();
                let loading = std::thread::Builder::new()
                    .name("bertscore-load".into())
                    .spawn(move || BertScorer::load(&cfg))
                    .map_err(|e| anyhow!("starting the BERTScore encoder load: {e}"))?;
                Some(LazyBert { loading: Mutex::new(Some(loading)), loaded: OnceLock::new() })
            }
            None => None,
        };
        let meteor = has("meteor").then(|| WordNet::load(wordnet_dir).map_err(|e| anyhow!("{e}"))).transpose()?;
        Ok(Scorer {
            bleu: has("bleu"),
            rouge: has("rouge"),
            meteor,
            bertscore,
            punkt: None,
            rouge_target: RougeTarget::Response,
        })
    }

    /// Split sentences for METEOR with Punkt parameters from a `punkt_tab/<language>`
    /// directory (as NLTK's `word_tokenize` does with its downloaded English model).
    pub fn with_punkt(mut self, dir: &Path) -> Result<Scorer> {
        let params =
            PunktParams::load(dir).map_err(|e| anyhow::anyhow!("Punkt parameters in {}: {e}", dir.display()))?;
        self.punkt = Some(params);
        Ok(self)
    }

    /// Score ROUGE with `target` as rouge_score's target (only ROUGE-Lsum changes).
    pub fn with_rouge_target(mut self, target: RougeTarget) -> Scorer {
        self.rouge_target = target;
        self
    }

    /// Output column names, in order.
    pub fn columns(&self) -> Vec<&'static str> {
        let mut c = Vec::new();
        if self.bleu {
            c.push("bleu");
        }
        if self.rouge {
            c.extend(["rouge1", "rouge2", "rougeL", "rougeLsum"]);
        }
        if self.meteor.is_some() {
            c.push("meteor");
        }
        if self.bertscore.is_some() {
            c.push("bertscore_f1");
        }
        c
    }

    /// Whether BERTScore is computed (it scores lists of pairs: see
    /// [`Scorer::bertscore_f1`]).
    pub fn has_bertscore(&self) -> bool {
        self.bertscore.is_some()
    }

    /// BERTScore F1 of every pair, in order (None when BERTScore is not asked for). Pairs
    /// must be the whole input in order: bert_score's batches of 64 decide its padding.
    /// Waits for the encoder's load (and reports its error) on first use.
    pub fn bertscore_f1(&self, pairs: &[(&str, &str)]) -> Result<Option<Vec<f64>>> {
        let Some(b) = &self.bertscore else { return Ok(None) };
        Ok(Some(b.get()?.score(pairs)?.into_iter().map(|s| s.f1).collect()))
    }

    /// The scores of one pair, in [`Scorer::columns`] order, without BERTScore (the
    /// caller appends [`Scorer::bertscore_f1`]'s value for the pair). A score the official
    /// evaluation cannot compute is NaN (BLEU where `evaluate` raises): [`summarize`]
    /// leaves it out, as the official summary does, and [`per_sample`] writes it as 0.
    pub fn score(&self, response: &str, reference: &str) -> Vec<f64> {
        let mut out = Vec::with_capacity(6);
        if self.bleu {
            out.push(bleu::sentence_bleu(response, reference).unwrap_or(f64::NAN));
        }
        if self.rouge {
            let r = rouge::rouge_with(response, reference, self.rouge_target);
            out.extend([r.rouge1, r.rouge2, r.rouge_l, r.rouge_lsum]);
        }
        if let Some(wn) = &self.meteor {
            out.push(match &self.punkt {
                Some(p) => meteor::meteor_with_punkt(response, reference, wn, p),
                None => meteor::meteor(response, reference, wn),
            });
        }
        out
    }
}

/// The BERTScore encoder, loading on its own thread until first used.
struct LazyBert {
    loading: Mutex<Option<std::thread::JoinHandle<Result<BertScorer>>>>,
    loaded: OnceLock<Result<BertScorer, String>>,
}

impl LazyBert {
    fn get(&self) -> Result<&BertScorer> {
        if self.loaded.get().is_none() {
            // The first caller joins the load; others wait on the lock, then find it set.
            let mut loading = self.loading.lock().map_err(|_| anyhow!("BERTScore encoder load poisoned"))?;
            if let Some(handle) = loading.take() {
                let loaded = handle.join().unwrap_or_else(|_| Err(anyhow!("loading the BERTScore encoder panicked")));
                let _ = self.loaded.set(loaded.map_err(|e| format!("{e:#}")));
            }
        }
        match self.loaded.get() {
            Some(Ok(b)) => Ok(b),
            Some(Err(e)) => Err(anyhow!("{e}")),
            None => Err(anyhow!("the BERTScore encoder was not loaded")),
        }
    }
}

/// The error when BERTScore is asked for without an encoder.
pub const BERTSCORE_NEEDS_MODEL: &str = "metric \"bertscore\" needs an encoder: a directory with model.onnx and \
     tokenizer.json (e.g. ../shared/models/all-MiniLM-L6-v2), as `bertscore_model` in a metrics stage or \
     --bertscore-model for synth score";

/// Mean and population standard deviation of one metric over one group.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub group: String,
    pub metric: String,
    pub n: u64,
    pub mean: f64,
    pub std: f64,
}

/// A score column's heading in reports (the metric's usual name).
pub fn heading(column: &str) -> &str {
    match column {
        "bleu" => "BLEU",
        "rouge1" => "ROUGE-1",
        "rouge2" => "ROUGE-2",
        "rougeL" => "ROUGE-L",
        "rougeLsum" => "ROUGE-Lsum",
        "meteor" => "METEOR",
        "bertscore_f1" => "BERTScore F1",
        other => other,
    }
}

/// The group every row also belongs to.
pub const OVERALL: &str = "overall";

/// A score as written per sample: an undefined one (NaN, see [`Scorer::score`]) is 0, the
/// value it would have (BLEU: every precision is 0 then).
pub fn per_sample(score: f64) -> f64 {
    if score.is_nan() { 0.0 } else { score }
}

/// Per group (sorted) and `overall`: mean and population std of every column over its
/// defined values (`n` counts them), as the official evaluation leaves NaN results out.
pub fn summarize(columns: &[&str], groups: &[String], scores: &[Vec<f64>]) -> Vec<Summary> {
    let mut names: Vec<&str> = groups.iter().map(String::as_str).collect();
    names.sort_unstable();
    names.dedup();
    let mut out = Vec::new();
    for group in names.into_iter().chain([OVERALL]) {
        let rows: Vec<&Vec<f64>> = scores
            .iter()
            .zip(groups.iter().map(String::as_str).chain(std::iter::repeat("")))
            .filter(|(_, g)| group == OVERALL || *g == group)
            .map(|(s, _)| s)
            .collect();
        for (k, metric) in columns.iter().enumerate() {
            let values: Vec<f64> = rows.iter().map(|r| r[k]).filter(|v| !v.is_nan()).collect();
            let (mean, std) = mean_std(&values);
            out.push(Summary {
                group: group.to_string(),
                metric: metric.to_string(),
                n: values.len() as u64,
                mean,
                std,
            });
        }
    }
    out
}

/// Mean and population standard deviation (numpy's default `ddof = 0`); 0 for no values.
pub fn mean_std(values: &[f64]) -> (f64, f64) {
    if values.is_empty() {
        return (0.0, 0.0);
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    (mean, var.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn population_std_and_groups() {
        let (m, s) = mean_std(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(m, 2.5);
        assert!((s - 1.118_033_988_749_895).abs() < 1e-12);
        let groups = vec!["b".to_string(), "a".to_string(), "b".to_string()];
        let scores = vec![vec![1.0], vec![0.0], vec![0.0]];
        let s = summarize(&["bleu"], &groups, &scores);
        let names: Vec<(&str, u64, f64)> = s.iter().map(|x| (x.group.as_str(), x.n, x.mean)).collect();
        assert_eq!(names, vec![("a", 1, 0.0), ("b", 2, 0.5), ("overall", 3, 1.0 / 3.0)]);
        // Undefined scores are left out of the mean, the std and n.
        let scores = vec![vec![1.0], vec![f64::NAN], vec![0.0]];
        let s = summarize(&["bleu"], &groups, &scores);
        let names: Vec<(&str, u64, f64)> = s.iter().map(|x| (x.group.as_str(), x.n, x.mean)).collect();
        assert_eq!(names, vec![("a", 0, 0.0), ("b", 2, 0.5), ("overall", 2, 0.5)]);
        assert_eq!(per_sample(f64::NAN), 0.0);
    }

    #[test]
    fn unknown_metric_is_named() {
        let err = Scorer::new(&["blue".to_string()], Path::new("/nonexistent"), None).err().unwrap();
        assert!(err.to_string().contains("unknown metric \"blue\""), "{err}");
        let err = Scorer::new(&["bertscore".to_string()], Path::new("/nonexistent"), None).err().unwrap();
        assert!(err.to_string().contains("bertscore_model"), "{err}");
    }
}
