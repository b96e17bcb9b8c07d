//! `neurons` — neuron-level activation analysis, the hand-off to a PyTorch script as
//! `train` hands off training (protocol in `pipelines/analysis/README.md`):
//!
//! 1. writes the probe rows (input 1: a conversation column, a group column mapped to
//!    capability groups by an optional groups file) to `<out>/<stage>/probe.jsonl`, and
//!    the run's configuration (models, comparisons, hook, top share...) to `config.json`;
//! 2. runs `command` (default: `pipelines/analysis/neurons.py`) in the pipeline root,
//!    following its progress (`SYNTH_PROGRESS`), outputs (`SYNTH_OUTPUT`) and metrics;
//! 3. reads the activation maps it wrote (per model × group × layer, how many probe rows
//!    had each neuron among their top p% activations) and records them: the stage output
//!    (Parquet, one row per map), `<stage>.discrepancy.parquet` (per compared pair ×
//!    group × layer: the mean absolute difference of activation frequencies, Appendix H's
//!    D_ℓ, the neurons that changed, the normalized delta per neuron), and a summary for
//!    `report` (D_ℓ per group, per layer and averaged over layers); the figures stay in
//!    `<out>/<stage>/figures/`, listed in the manifest.
//!
//! A model is a path or hub id passed to the script, `tiny-random-llama:SEED` (built by
//! the script, no download), or `checkpoint:PHASE`: the last checkpoint of that phase in
//! the optional second input (a `train` stage's table), so an analysis can follow training.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use synth_core::data::arrow::array::{
    ArrayRef, Float64Builder, Int64Array, Int64Builder, ListBuilder, RecordBatch, StringArray,
};
use synth_core::data::arrow::datatypes::{DataType, Field, SchemaRef};

use super::external::{self, absolute};
use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, POSITIVE, Ty};
use synth_core::data::{self, Row};
use synth_core::store::failures::FailureKind;
use synth_core::store::state::relative_to;
use synth_core::store::summary::{self, OVERALL, SummaryRow};
use synth_core::template::Templates;
use synth_engine::stages::{Arity, BuildCtx, KindInfo, PlanCtx, RunCtx, Stage};

const DEFAULT_COMMAND: &str = r#"["python3", "pipelines/analysis/neurons.py", "--config", "{{ config }}"]"#;

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::required(
        "models",
        Ty::Map(&Ty::Str),
        "label → model: a path or hub id, \"tiny-random-llama:SEED\" (no download), or \"checkpoint:PHASE\" (the second input's last checkpoint of that phase)",
    ),
    OptionSpec::default("compare", Ty::List(&Ty::StrList), "[]", "[base, tuned] label pairs to compare"),
    OptionSpec::default(
        "messages",
        Ty::Str,
        "\"question\"",
        "column with the conversation to forward (list of {role, content})",
    ),
    OptionSpec::default("group_by", Ty::Str, "\"task\"", "column whose value puts a row in its groups"),
    OptionSpec::optional(
        "groups",
        Ty::File,
        "JSON file: {\"map\": {value: [group, ...]}, \"titles\": {group: title}}; without it every value is its own group",
    ),
    OptionSpec::default(
        "hook",
        Ty::Enum(&["attn_out", "mlp_out"]),
        "\"attn_out\"",
        "which block output to probe per layer",
    ),
    OptionSpec::default(
        "top_percent",
        Ty::Float(1e-9, 100.0),
        "20.0",
        "share of a row's activations that count as active",
    ),
    OptionSpec::default(
        "normalize",
        Ty::Enum(&["dimension", "samples"]),
        "\"dimension\"",
        "discrepancy maps divided by d_model (visualize.py) or by the group's row count (Appendix H)",
    ),
    OptionSpec::default(
        "roles",
        Ty::Enum(&["as_written", "lower"]),
        "\"as_written\"",
        "message roles given to the chat template as written (interpret.py) or lowercased (evaluation.py)",
    ),
    OptionSpec::default("dtype", Ty::Enum(&["bfloat16", "float16", "float32"]), "\"bfloat16\"", "model weights' dtype"),
    OptionSpec::default("device", Ty::Str, "\"auto\"", "torch device (auto: the GPUs when there are any)")
        .runtime_only(),
    OptionSpec::optional("max_length", POSITIVE, "truncate each conversation to this many tokens"),
    OptionSpec::optional(
        "attn_implementation",
        Ty::Str,
        "transformers attention implementation, e.g. \"flash_attention_2\"",
    ),
    OptionSpec::default("figures", Ty::StrList, "[\"png\", \"svg\"]", "figure formats (png, svg; [] for none)"),
    OptionSpec::default(
        "save_activations",
        Ty::Bool,
        "false",
        "also keep the raw activations (float16 .npz per model)",
    ),
    OptionSpec::default(
        "verify_hooks",
        Ty::Bool,
        "false",
        "first check, on one row per model, that the hooked attention and MLP outputs add up to the residual stream",
    ),
    OptionSpec::optional("max_rows", POSITIVE, "probe only the first rows of the input"),
    OptionSpec::optional("threads", POSITIVE, "torch threads on CPU").runtime_only(),
    OptionSpec::default(
        "command",
        Ty::List(&Ty::Str),
        DEFAULT_COMMAND,
        "analysis command line, run in the pipeline root; each element a template over config, probe, output_dir, stage, root",
    ),
    OptionSpec::optional("env", Ty::Map(&Ty::Str), "extra environment variables for the script"),
    OptionSpec::optional("timeout_minutes", Ty::Float(0.0, f64::INFINITY), "stop the script after this long")
        .runtime_only(),
    OptionSpec::default(
        "title",
        Ty::Str,
        "\"Neuron activation discrepancy: mean |Δ activation frequency| of the top neurons per layer\"",
        "heading of the summary table in the report",
    ),
];

const VARIABLES: &[&str] = &["config", "probe", "output_dir", "stage", "root"];

pub static KIND: KindInfo = KindInfo {
    name: "neurons",
    about: "neuron activation maps per group (top-p% activations per layer) from an external PyTorch script, base vs tuned discrepancy, figures",
    arity: Arity::AtLeast(1),
    options: OPTIONS,
    summary: true,
    example: "models = { base = \"tiny-random-llama:1\", tuned = \"tiny-random-llama:2\" }\ncompare = [[\"base\", \"tuned\"]]",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Debug, Clone, Deserialize)]
struct Options {
    models: indexmap::IndexMap<String, String>,
    compare: Vec<Vec<String>>,
    messages: String,
    group_by: String,
    groups: Option<String>,
    hook: String,
    top_percent: f64,
    normalize: String,
    roles: String,
    dtype: String,
    device: String,
    max_length: Option<u64>,
    attn_implementation: Option<String>,
    figures: Vec<String>,
    save_activations: bool,
    verify_hooks: bool,
    max_rows: Option<u64>,
    threads: Option<u64>,
    command: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    timeout_minutes: Option<f64>,
    title: String,
}

/// The groups file: value → groups, and the groups' display titles.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Groups {
    #[serde(default)]
    source: Option<String>,
    /// Map entries that are not the source's (documentation: keys, and why).
    #[serde(default)]
    reconstructed: Vec<String>,
    #[serde(default)]
    reconstructed_why: Option<String>,
    map: BTreeMap<String, Vec<String>>,
    /// In the order the report shows the groups.
    #[serde(default)]
    titles: indexmap::IndexMap<String, String>,
}

struct Neurons {
    opts: Options,
    groups: Option<Groups>,
    templates: Templates,
}

/// What turns an input row into a probe row (owned: it runs on a blocking thread).
#[derive(Clone)]
struct ProbeSpec {
    messages: String,
    group_by: String,
    groups: Option<Groups>,
    groups_file: String,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    let mut ok = true;
    if opts.models.is_empty() {
        ctx.error(diags, "models", "give at least one model");
        ok = false;
    }
    for (label, _) in &opts.models {
        if label.is_empty() || label.contains(['/', '\\']) || label.starts_with('.') {
            ctx.error(diags, "models", format!("model label \"{label}\" must be a plain name (it names a folder)"));
            ok = false;
        }
    }
    for pair in &opts.compare {
        if pair.len() != 2 {
            ctx.error(diags, "compare", format!("{pair:?}: a comparison is [base, tuned]"));
            ok = false;
        } else if let Some(bad) = pair.iter().find(|l| !opts.models.contains_key(l.as_str())) {
            let names: Vec<&str> = opts.models.keys().map(String::as_str).collect();
            ctx.error(diags, "compare", format!("\"{bad}\" is not a model label (models: {})", names.join(", ")));
            ok = false;
        }
    }
    for f in &opts.figures {
        if f != "png" && f != "svg" {
            ctx.error(diags, "figures", format!("unknown figure format \"{f}\" (png, svg)"));
            ok = false;
        }
    }
    let groups = match &opts.groups {
        None => None,
        Some(path) => {
            let full = ctx.root.join(path);
            match std::fs::read_to_string(&full)
                .map_err(|e| e.to_string())
                .and_then(|t| serde_json::from_str::<Groups>(&t).map_err(|e| e.to_string()))
            {
                Ok(g) => Some(g),
                Err(e) => {
                    ctx.error(diags, "groups", format!("{}: {e}", full.display()));
                    ok = false;
                    None
                }
            }
        }
    };
    let mut templates = Templates::new();
    if opts.command.is_empty() {
        ctx.error(diags, "command", "command must not be empty");
        ok = false;
    }
    for (i, arg) in opts.command.iter().enumerate() {
        match templates.add(&format!("arg{i}"), arg) {
            Ok(vars) => {
                for v in vars.iter().filter(|v| !VARIABLES.contains(&v.as_str()) && !synth_core::template::is_global(v))
                {
                    let hint = synth_core::config::diag::did_you_mean(v, VARIABLES.iter().copied()).unwrap_or_default();
                    ctx.error(diags, "command", format!("command[{i}] uses unknown variable \"{v}\"{hint}"));
                    ok = false;
                }
            }
            Err(e) => {
                ctx.error(diags, "command", format!("command[{i}]: {e}"));
                ok = false;
            }
        }
    }
    ok.then(|| Box::new(Neurons { opts, groups, templates }) as Box<dyn Stage>)
}

fn int_list() -> DataType {
    DataType::List(Arc::new(Field::new("item", DataType::Int64, true)))
}

/// The stage output: one activation map row per model × group × layer.
fn output_schema() -> SchemaRef {
    let s = |n: &str| Field::new(n, DataType::Utf8, false);
    let i = |n: &str| Field::new(n, DataType::Int64, false);
    data::schema_with_id([
        s("model"),
        s("group"),
        s("title"),
        i("layer"),
        i("samples"),
        i("active"),
        Field::new("counts", int_list(), false),
    ])
}

fn discrepancy_schema() -> SchemaRef {
    let s = |n: &str| Field::new(n, DataType::Utf8, false);
    let i = |n: &str| Field::new(n, DataType::Int64, false);
    data::schema_with_id([
        s("base"),
        s("tuned"),
        s("group"),
        s("title"),
        i("layer"),
        i("samples_base"),
        i("samples_tuned"),
        Field::new("mean_abs_delta", DataType::Float64, false),
        i("changed"),
        Field::new("delta", DataType::List(Arc::new(Field::new("item", DataType::Float64, true))), false),
    ])
}

/// One activation map line of the script's `maps.jsonl`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct MapLine {
    pub model: String,
    pub group: String,
    pub layer: i64,
    pub samples: i64,
    pub counts: Vec<i64>,
}

/// Appendix H's D_ℓ for one layer: the mean over neurons of |f_tuned − f_base|, each
/// neuron's activation frequency f = N / N_total (rows in which it was active over rows).
pub fn mean_abs_delta(base: &MapLine, tuned: &MapLine) -> f64 {
    let n = base.counts.len().max(1) as f64;
    let (sb, st) = (base.samples.max(1) as f64, tuned.samples.max(1) as f64);
    base.counts.iter().zip(&tuned.counts).map(|(b, t)| (*t as f64 / st - *b as f64 / sb).abs()).sum::<f64>() / n
}

/// The per-neuron discrepancy of the figures: (tuned − base) / d_model (visualize.py) or
/// / the base's row count (`samples`).
pub fn normalized_delta(base: &MapLine, tuned: &MapLine, normalize: &str) -> Vec<f64> {
    let denom = if normalize == "samples" { base.samples.max(1) as f64 } else { base.counts.len().max(1) as f64 };
    base.counts.iter().zip(&tuned.counts).map(|(b, t)| (t - b) as f64 / denom).collect()
}

/// Read and check `maps.jsonl`: every model's maps, one length per model.
fn read_maps(path: &Path, models: &[&str]) -> Result<Vec<MapLine>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    let mut width: BTreeMap<String, usize> = BTreeMap::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let m: MapLine = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: not an activation map line", path.display(), n + 1))?;
        if !models.contains(&m.model.as_str()) {
            bail!("{}:{}: unknown model \"{}\"", path.display(), n + 1, m.model);
        }
        let w = *width.entry(m.model.clone()).or_insert(m.counts.len());
        if w != m.counts.len() || w == 0 {
            bail!("{}:{}: {} neurons where the model's other maps have {w}", path.display(), n + 1, m.counts.len());
        }
        out.push(m);
    }
    for m in models {
        if !width.contains_key(*m) {
            bail!("{}: no activation map of model \"{m}\"", path.display());
        }
    }
    Ok(out)
}

impl Neurons {
    fn title(&self, group: &str) -> String {
        self.groups.as_ref().and_then(|g| g.titles.get(group)).cloned().unwrap_or_else(|| group.to_string())
    }

    fn probe_spec(&self) -> ProbeSpec {
        ProbeSpec {
            messages: self.opts.messages.clone(),
            group_by: self.opts.group_by.clone(),
            groups: self.groups.clone(),
            groups_file: self.opts.groups.clone().unwrap_or_default(),
        }
    }

    /// Model labels → what the script loads (checkpoints from the second input made absolute).
    fn resolve_models(&self, ctx: &RunCtx) -> Result<indexmap::IndexMap<String, String>> {
        let mut checkpoints: BTreeMap<String, String> = BTreeMap::new();
        if let Some(input) = ctx.inputs.get(1) {
            let (_, batches) = synth_core::store::parquet::read_all(&input.path)?;
            for b in &batches {
                for i in 0..b.num_rows() {
                    let r = data::row_json(b, i);
                    if let (Some(p), Some(path)) =
                        (r.get("phase").and_then(Value::as_str), r.get("path").and_then(Value::as_str))
                    {
                        checkpoints.insert(p.to_string(), path.to_string());
                    }
                }
            }
        }
        let mut out = indexmap::IndexMap::new();
        for (label, spec) in &self.opts.models {
            let resolved = if let Some(phase) = spec.strip_prefix("checkpoint:") {
                let rel = checkpoints.get(phase).ok_or_else(|| {
                    let have: Vec<&str> = checkpoints.keys().map(String::as_str).collect();
                    anyhow!(
                        "model \"{label}\": no checkpoint of phase \"{phase}\" in the second input (phases: {})",
                        if have.is_empty() { "none".to_string() } else { have.join(", ") }
                    )
                })?;
                let p = Path::new(rel);
                absolute(&if p.is_absolute() { p.to_path_buf() } else { ctx.out_dir.join(p) })
                    .to_string_lossy()
                    .to_string()
            } else if spec.starts_with("tiny-random-llama:") {
                spec.clone()
            } else if ctx.root.join(spec).exists() {
                absolute(&ctx.root.join(spec)).to_string_lossy().to_string()
            } else {
                spec.clone()
            };
            out.insert(label.clone(), resolved);
        }
        Ok(out)
    }
}

#[async_trait]
impl Stage for Neurons {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        ctx.require_columns("messages", 0, [self.opts.messages.as_str()]);
        ctx.require_columns("group_by", 0, [self.opts.group_by.as_str()]);
        let wants_checkpoints = self.opts.models.values().any(|m| m.starts_with("checkpoint:"));
        match ctx.inputs.len() {
            1 if wants_checkpoints => ctx.error(
                "models",
                "a \"checkpoint:PHASE\" model needs a second input with the checkpoints (a train stage)",
            ),
            2 => ctx.require_columns("inputs", 1, ["phase", "path"]),
            n if n > 2 => ctx.error("inputs", "one input of probe rows, and optionally a train stage's checkpoints"),
            _ => {}
        }
        for p in external::command_files(ctx.root, &self.opts.command) {
            if !ctx.files.contains(&p) {
                ctx.files.push(p);
            }
        }
        if let Some(g) = &self.opts.groups {
            ctx.files.push(ctx.root.join(g));
        }
        Some(output_schema())
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let out_dir = absolute(&ctx.out_dir);
        let work = out_dir.join(&ctx.name);
        let (probe, config, maps) = (work.join("probe.jsonl"), work.join("config.json"), work.join("maps.jsonl"));
        // Last run's results are not this run's: the script writes them again.
        for stale in [maps.clone(), work.join("figures"), work.join("activations")] {
            if stale.is_dir() {
                std::fs::remove_dir_all(&stale).with_context(|| format!("removing {}", stale.display()))?;
            } else if stale.exists() {
                std::fs::remove_file(&stale).with_context(|| format!("removing {}", stale.display()))?;
            }
        }

        // 1. The probe rows and the configuration.
        let (input, dest, max_rows, spec) =
            (ctx.inputs[0].path.clone(), probe.clone(), self.opts.max_rows, self.probe_spec());
        let (rows, failed) = tokio::task::spawn_blocking(move || {
            external::write_work_jsonl(&input, &dest, max_rows, |row| probe_row(&spec, row))
        })
        .await??;
        for (id, e) in &failed {
            ctx.fail(id, FailureKind::Input, e.clone(), None);
        }
        ctx.report.rows_in = rows + failed.len() as u64;
        if rows == 0 {
            bail!("no probe rows: the input is empty or no row could be used");
        }
        let models = self.resolve_models(ctx)?;
        let titles = self.groups.as_ref().map(|g| g.titles.clone()).unwrap_or_default();
        let cfg = json!({
            "probe": probe.to_string_lossy(),
            "output_dir": work.to_string_lossy(),
            "models": models,
            "compare": self.opts.compare,
            "hook": self.opts.hook,
            "top_percent": self.opts.top_percent,
            "normalize": self.opts.normalize,
            "roles": self.opts.roles,
            "dtype": self.opts.dtype,
            "device": self.opts.device,
            "max_length": self.opts.max_length,
            "attn_implementation": self.opts.attn_implementation,
            "figures": self.opts.figures,
            "titles": titles,
            "save_activations": self.opts.save_activations,
            "verify_hooks": self.opts.verify_hooks,
            "threads": self.opts.threads,
        });
        external::write_work_file(&config, serde_json::to_string_pretty(&cfg)?.as_bytes())?;
        tracing::info!(stage = %ctx.name, rows, models = models.len(), "probe data written to {}", probe.display());

        // 2. The script.
        let root = absolute(&ctx.root);
        let vars = json!({
            "config": config.to_string_lossy(),
            "probe": probe.to_string_lossy(),
            "output_dir": work.to_string_lossy(),
            "stage": ctx.name,
            "root": root.to_string_lossy(),
        });
        let mut argv = Vec::new();
        for i in 0..self.opts.command.len() {
            let a = self
                .templates
                .render_value(&format!("arg{i}"), minijinja::Value::from(minijinja::value::Serde(&vars)))
                .map_err(|e| anyhow!("command[{i}]: {e}"))?;
            if !a.is_empty() {
                argv.push(a);
            }
        }
        let mut outputs: Vec<(String, String)> = Vec::new();
        let mut metrics: BTreeMap<String, f64> = BTreeMap::new();
        let launch = external::Launch {
            what: "analysis script",
            argv,
            cwd: root.clone(),
            env: self.opts.env.clone(),
            timeout_minutes: self.opts.timeout_minutes,
        };
        let name = ctx.name.clone();
        external::run(ctx, launch, |tag, phase, v| match tag {
            "SYNTH_OUTPUT" => {
                let kind = v.get("kind").and_then(Value::as_str).unwrap_or("file").to_string();
                if let Some(p) = v.get("path").and_then(Value::as_str) {
                    outputs.push((kind, p.to_string()));
                }
                true
            }
            "SYNTH_METRICS" => {
                for (k, x) in v.as_object().into_iter().flatten() {
                    if let Some(x) = x.as_f64() {
                        metrics.insert(format!("{phase}.{k}"), x);
                    }
                }
                tracing::info!(stage = %name, "metrics ({phase}): {v}");
                true
            }
            _ => false,
        })
        .await?;
        if !outputs.iter().any(|(k, _)| k == "maps") || !maps.exists() {
            bail!(
                "the analysis script exited successfully but reported no activation maps (expected `SYNTH_OUTPUT {{\"kind\": \"maps\", \"path\": ...}}` and {})",
                maps.display()
            );
        }

        // 3. Record the maps, the discrepancies and the summary.
        let labels: Vec<&str> = models.keys().map(String::as_str).collect();
        let lines = read_maps(&maps, &labels)?;
        let schema = output_schema();
        let mut w = ctx.create_output(schema.clone())?;
        w.write(&map_batch(&schema, &lines, |g| self.title(g))?)?;
        let by_key: BTreeMap<(&str, &str, i64), &MapLine> =
            lines.iter().map(|m| ((m.model.as_str(), m.group.as_str(), m.layer), m)).collect();
        let mut disc: Vec<(String, &MapLine, &MapLine)> = Vec::new();
        let mut summary_rows = Vec::new();
        for pair in &self.opts.compare {
            let (base, tuned) = (pair[0].as_str(), pair[1].as_str());
            let label = format!("{tuned} vs {base}");
            // Groups in the groups file's title order, then first-seen; layers ascending.
            let mut groups: Vec<&str> = Vec::new();
            for m in lines.iter().filter(|m| m.model == base) {
                if !groups.contains(&m.group.as_str()) && by_key.contains_key(&(tuned, m.group.as_str(), m.layer)) {
                    groups.push(&m.group);
                }
            }
            let rank = |g: &str| self.groups.as_ref().and_then(|x| x.titles.get_index_of(g)).unwrap_or(usize::MAX);
            groups.sort_by_key(|g| rank(g));
            for g in &groups {
                let mut per_layer = Vec::new();
                for m in lines.iter().filter(|m| m.model == base && m.group == *g) {
                    let Some(t) = by_key.get(&(tuned, *g, m.layer)) else { continue };
                    if t.counts.len() != m.counts.len() {
                        bail!(
                            "models \"{base}\" and \"{tuned}\" have layers of different widths: compare models of one architecture"
                        );
                    }
                    let d = mean_abs_delta(m, t);
                    per_layer.push((m.layer, d, m.samples.min(t.samples)));
                    disc.push((label.clone(), m, t));
                }
                let n = per_layer.iter().map(|x| x.2).min().unwrap_or(0).max(0) as u64;
                let row = |group: String, value: f64| SummaryRow {
                    label: label.clone(),
                    table: "neurons".into(),
                    title: self.opts.title.clone(),
                    group,
                    metric: g.to_string(),
                    heading: self.title(g),
                    n,
                    value,
                    std: None,
                    invalid: 0,
                };
                let mean = per_layer.iter().map(|x| x.1).sum::<f64>() / per_layer.len().max(1) as f64;
                summary_rows.push(row(OVERALL.to_string(), mean));
                let width = per_layer.iter().map(|x| x.0).max().unwrap_or(0).to_string().len();
                for (layer, d, _) in &per_layer {
                    summary_rows.push(row(format!("layer {layer:0width$}"), *d));
                }
            }
        }
        let disc_batch = discrepancy_batch(&disc, &self.opts.normalize, |g| self.title(g))?;
        ctx.write_side_parquet(&format!("{}.discrepancy.parquet", ctx.name), &disc_batch)?;
        ctx.write_side_parquet(&summary::file_name(&ctx.name), &summary::to_batch(&summary_rows)?)?;
        ctx.set_output(w)?;

        let figures = outputs.iter().filter(|(k, _)| k == "figure").count();
        ctx.report.info.insert("maps".into(), relative_to(&out_dir, &maps));
        ctx.report.info.insert("figures".into(), figures.to_string());
        if figures > 0 {
            ctx.report.info.insert("figures_dir".into(), relative_to(&out_dir, &work.join("figures")));
        }
        for (label, spec) in &models {
            ctx.report.info.insert(format!("model.{label}"), relative_or_spec(&out_dir, spec));
        }
        if let Some(g) = &self.groups {
            if let Some(source) = &g.source {
                ctx.report.info.insert("groups.source".into(), source.clone());
            }
            if !g.reconstructed.is_empty() {
                let why = g.reconstructed_why.as_deref().map(|w| format!(" ({w})")).unwrap_or_default();
                ctx.report.info.insert("groups.reconstructed".into(), format!("{}{why}", g.reconstructed.join(", ")));
            }
        }
        ctx.report.metrics.extend(metrics);
        Ok(())
    }
}

/// A probe row for the script, or why the input row cannot be one.
fn probe_row(spec: &ProbeSpec, row: &Row) -> std::result::Result<Value, String> {
    let messages = row
        .get(&spec.messages)
        .and_then(Value::as_array)
        .ok_or_else(|| format!("column \"{}\" is not a list of messages", spec.messages))?;
    let mut msgs = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        match (m.get("role").and_then(Value::as_str), m.get("content").and_then(Value::as_str)) {
            (Some(r), Some(c)) => msgs.push(json!({"role": r, "content": c})),
            _ => return Err(format!("{}[{i}]: a message needs a role and text content", spec.messages)),
        }
    }
    if msgs.is_empty() {
        return Err(format!("column \"{}\" is empty", spec.messages));
    }
    let value = match row.get(&spec.group_by) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => return Err(format!("column \"{}\" is missing or null", spec.group_by)),
        Some(other) => other.to_string(),
    };
    let groups = match &spec.groups {
        None => vec![value],
        Some(g) => g
            .map
            .get(&value)
            .cloned()
            .filter(|v| !v.is_empty())
            .ok_or_else(|| format!("{} \"{value}\" has no group in {}", spec.group_by, spec.groups_file))?,
    };
    let id = row.get(data::ID).and_then(Value::as_str).unwrap_or_default();
    Ok(json!({"id": id, "groups": groups, "messages": msgs}))
}

/// A model path inside the output directory as a relative path; anything else as given.
fn relative_or_spec(out_dir: &Path, spec: &str) -> String {
    let p = PathBuf::from(spec);
    if p.is_absolute() && p.starts_with(out_dir) { relative_to(out_dir, &p) } else { spec.to_string() }
}

fn map_batch(schema: &SchemaRef, lines: &[MapLine], title: impl Fn(&str) -> String) -> Result<RecordBatch> {
    let mut counts = ListBuilder::new(Int64Builder::new());
    for m in lines {
        counts.values().append_slice(&m.counts);
        counts.append(true);
    }
    let text =
        |f: &dyn Fn(&MapLine) -> String| -> ArrayRef { Arc::new(StringArray::from_iter_values(lines.iter().map(f))) };
    let int = |f: &dyn Fn(&MapLine) -> i64| -> ArrayRef { Arc::new(Int64Array::from_iter_values(lines.iter().map(f))) };
    Ok(RecordBatch::try_new(
        schema.clone(),
        vec![
            text(&|m| format!("{}/{}/{}", m.model, m.group, m.layer)),
            text(&|m| m.model.clone()),
            text(&|m| m.group.clone()),
            text(&|m| title(&m.group)),
            int(&|m| m.layer),
            int(&|m| m.samples),
            int(&|m| m.counts.iter().filter(|c| **c > 0).count() as i64),
            Arc::new(counts.finish()),
        ],
    )?)
}

fn discrepancy_batch(
    rows: &[(String, &MapLine, &MapLine)],
    normalize: &str,
    title: impl Fn(&str) -> String,
) -> Result<RecordBatch> {
    let mut delta = ListBuilder::new(Float64Builder::new());
    for (_, b, t) in rows {
        delta.values().append_slice(&normalized_delta(b, t, normalize));
        delta.append(true);
    }
    let text = |f: &dyn Fn(&(String, &MapLine, &MapLine)) -> String| -> ArrayRef {
        Arc::new(StringArray::from_iter_values(rows.iter().map(f)))
    };
    let int = |f: &dyn Fn(&(String, &MapLine, &MapLine)) -> i64| -> ArrayRef {
        Arc::new(Int64Array::from_iter_values(rows.iter().map(f)))
    };
    Ok(RecordBatch::try_new(
        discrepancy_schema(),
        vec![
            text(&|(l, b, _)| format!("{l}/{}/{}", b.group, b.layer)),
            text(&|(_, b, _)| b.model.clone()),
            text(&|(_, _, t)| t.model.clone()),
            text(&|(_, b, _)| b.group.clone()),
            text(&|(_, b, _)| title(&b.group)),
            int(&|(_, b, _)| b.layer),
            int(&|(_, b, _)| b.samples),
            int(&|(_, _, t)| t.samples),
            Arc::new(synth_core::data::arrow::array::Float64Array::from_iter_values(
                rows.iter().map(|(_, b, t)| mean_abs_delta(b, t)),
            )),
            int(&|(_, b, t)| b.counts.iter().zip(&t.counts).filter(|(x, y)| x != y).count() as i64),
            Arc::new(delta.finish()),
        ],
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(model: &str, samples: i64, counts: &[i64]) -> MapLine {
        MapLine { model: model.into(), group: "G".into(), layer: 0, samples, counts: counts.to_vec() }
    }

    #[test]
    fn appendix_h_discrepancy_of_activation_frequencies() {
        // f_base = [1, 0.5, 0, 0], f_tuned = [0.5, 0.5, 0.25, 0]: D = (0.5 + 0 + 0.25 + 0) / 4.
        let (b, t) = (line("sft", 2, &[2, 1, 0, 0]), line("dpo", 4, &[2, 2, 1, 0]));
        assert!((mean_abs_delta(&b, &t) - 0.1875).abs() < 1e-15);
        assert_eq!(mean_abs_delta(&b, &b), 0.0);
        // visualize.py: (dpo − sft) / d_model; Appendix H: / rows.
        assert_eq!(normalized_delta(&b, &t, "dimension"), vec![0.0, 0.25, 0.25, 0.0]);
        assert_eq!(normalized_delta(&b, &t, "samples"), vec![0.0, 0.5, 0.5, 0.0]);
    }

    #[test]
    fn maps_of_unknown_models_or_ragged_widths_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("maps.jsonl");
        let l = |m: &str, c: &str| {
            format!("{{\"model\": \"{m}\", \"group\": \"G\", \"layer\": 0, \"samples\": 1, \"counts\": {c}}}\n")
        };
        std::fs::write(&p, l("a", "[1, 0]") + &l("b", "[0, 1]")).unwrap();
        assert_eq!(read_maps(&p, &["a", "b"]).unwrap().len(), 2);
        assert!(read_maps(&p, &["a"]).unwrap_err().to_string().contains("unknown model \"b\""));
        assert!(read_maps(&p, &["a", "b", "c"]).unwrap_err().to_string().contains("no activation map of model \"c\""));
        std::fs::write(&p, l("a", "[1, 0]") + &l("a", "[1]")).unwrap();
        assert!(read_maps(&p, &["a"]).unwrap_err().to_string().contains("maps.jsonl:2: 1 neurons"));
    }
}
