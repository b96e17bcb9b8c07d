//! `characterbench_export` (construction): the judged scripts as a release in the official
//! layout — `<dir>/<dimension>_test.json`, a JSON array per dimension file (4-space
//! indent, text unescaped, as upstream), one record per script and responding model (ids
//! from 1 per file, input order): the script's record with `response_messages.model` /
//! `.response` (and the same under `translation_en` when the record has one), the judge's
//! mean score as `pred_<lang>_sc` and its first sample as `pred_<lang>`, and the human
//! fields `annotation_score` / `gold` null — or, with `annotations` (a CSV / JSONL of
//! `dimension`, `id`, `score` for an earlier export's ids), the imported human scores.
//! `<dir>/README.md` is a card: counts per dimension, models, judge, provenance, what is
//! reconstructed. The files are read back by `characterbench_release` unchanged.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Result, anyhow, bail};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use synth_core::data::arrow::datatypes::SchemaRef;

use super::{DEFAULT_DIMENSIONS, read_bench};
use crate::bench::Bench;
use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data;
use synth_core::store::atomic::{create_tmp, finish_file};
use synth_core::store::failures::FailureKind;
use synth_engine::stages::{BuildCtx, KindInfo, PlanCtx, Role, RunCtx, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::default("dir", Ty::OutPath, "\"release\"", "folder of the release, relative to the output directory"),
    OptionSpec::default("dimensions", Ty::File, DEFAULT_DIMENSIONS, "the benchmark definition (order, scales)"),
    OptionSpec::default("reply_column", Ty::Str, "\"reply\"", "the responding model's reply"),
    OptionSpec::default("model_column", Ty::Str, "\"responder\"", "the responding model's name"),
    OptionSpec::default("score_column", Ty::Str, "\"score\"", "the judge's (mean) score"),
    OptionSpec::optional("judge", Ty::Str, "the judge's name, for the card"),
    OptionSpec::optional("annotations", Ty::File, "human scores to import: CSV or JSONL with dimension, id, score"),
    OptionSpec::default("title", Ty::Str, "\"A CharacterBench-style test set\"", "the card's heading"),
];

pub static KIND: KindInfo = KindInfo {
    name: "characterbench_export",
    about: "construction: judged scripts as <dimension>_test.json files in the release's record layout (human fields left for import), with a card",
    role: Role::Sink,
    options: OPTIONS,
    example: "",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    dir: String,
    dimensions: String,
    reply_column: String,
    model_column: String,
    score_column: String,
    judge: Option<String>,
    annotations: Option<String>,
    title: String,
}

struct Export {
    opts: Options,
    bench: Bench,
    annotations: Option<PathBuf>,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    let bench = read_bench(ctx, diags, &opts.dimensions)?;
    let annotations = opts.annotations.as_ref().map(|a| ctx.root.join(a));
    Some(Box::new(Export { opts, bench, annotations }))
}

/// Human scores by (dimension, id) from a CSV or JSONL file.
fn read_annotations(path: &std::path::Path) -> Result<BTreeMap<(String, String), f64>> {
    let text = std::fs::read_to_string(path).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    let mut out = BTreeMap::new();
    let mut add = |line: usize, dim: Option<String>, id: Option<String>, score: Option<f64>| -> Result<()> {
        match (dim, id, score) {
            (Some(d), Some(i), Some(s)) => {
                out.insert((d, i), s);
                Ok(())
            }
            _ => bail!("{}:{line}: needs dimension, id and a numeric score", path.display()),
        }
    };
    let jsonl = path.extension().is_some_and(|e| e == "jsonl" || e == "json");
    if jsonl {
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let v: Value = serde_json::from_str(line).map_err(|e| anyhow!("{}:{}: {e}", path.display(), i + 1))?;
            let s = |k: &str| v.get(k).map(synth_core::data::python::py_str);
            add(i + 1, s("dimension"), s("id"), v.get("score").and_then(Value::as_f64))?;
        }
    } else {
        let mut rdr = csv::Reader::from_reader(text.as_bytes());
        let headers = rdr.headers()?.clone();
        let col = |name: &str| headers.iter().position(|h| h == name);
        let (d, i, s) = (col("dimension"), col("id"), col("score"));
        for (n, rec) in rdr.records().enumerate() {
            let rec = rec.map_err(|e| anyhow!("{}:{}: {e}", path.display(), n + 2))?;
            let get = |c: Option<usize>| c.and_then(|c| rec.get(c)).map(str::to_string);
            add(n + 2, get(d), get(i), get(s).and_then(|v| v.trim().parse().ok()))?;
        }
    }
    Ok(out)
}

/// `response_messages.model` / `.response` of a record (or its English copy).
fn set_response(rec: &mut Map<String, Value>, model: &str, reply: &str) {
    let rm = rec.entry("response_messages").or_insert_with(|| json!({}));
    if let Some(o) = rm.as_object_mut() {
        o.insert("model".into(), json!(model));
        o.insert("response".into(), json!(reply));
    }
}

fn pretty(v: &Value) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    let mut ser =
        serde_json::Serializer::with_formatter(&mut buf, serde_json::ser::PrettyFormatter::with_indent(b"    "));
    v.serialize(&mut ser)?;
    Ok(buf)
}

#[async_trait]
impl Stage for Export {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        ctx.require_columns(
            "inputs",
            0,
            [
                "record",
                "dimension",
                "lang",
                self.opts.reply_column.as_str(),
                self.opts.model_column.as_str(),
                self.opts.score_column.as_str(),
            ],
        );
        ctx.files.extend(self.bench.files.iter().cloned());
        if let Some(a) = &self.annotations {
            ctx.files.push(a.clone());
        }
        None
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let annotations = match &self.annotations {
            Some(p) => read_annotations(p)?,
            None => BTreeMap::new(),
        };
        let (_, batches) = synth_core::store::parquet::read_all(&ctx.inputs[0].path)?;
        let mut files: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        let mut models: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
        let (mut n, mut annotated) = (0u64, 0usize);
        for b in &batches {
            for i in 0..b.num_rows() {
                n += 1;
                let row = data::row_json(b, i);
                let rid = row.get(data::ID).and_then(Value::as_str).unwrap_or_default().to_string();
                let text = |k: &str| row.get(k).and_then(Value::as_str);
                let parsed = text("record").and_then(|r| serde_json::from_str::<Map<String, Value>>(r).ok());
                let (Some(mut rec), Some(dim), Some(lang), Some(reply), Some(model)) = (
                    parsed,
                    text("dimension"),
                    text("lang"),
                    text(&self.opts.reply_column),
                    text(&self.opts.model_column),
                ) else {
                    ctx.fail(
                        &rid,
                        FailureKind::Export,
                        "a row without record, dimension, lang, reply or model",
                        serde_json::to_string(&row).ok(),
                    );
                    continue;
                };
                let Some(d) = self.bench.dimension(dim) else {
                    ctx.fail(&rid, FailureKind::Export, format!("dimension \"{dim}\" is not in the definition"), None);
                    continue;
                };
                let list = files.entry(d.id.clone()).or_default();
                let id = list.len() as i64 + 1;
                rec.insert("id".into(), json!(id));
                rec.insert("script".into(), json!(text("script_id").unwrap_or_default()));
                set_response(&mut rec, model, reply);
                if let Some(Value::Object(en)) = rec.get_mut("translation_en") {
                    set_response(en, model, reply);
                }
                let score = row.get(&self.opts.score_column).and_then(Value::as_f64);
                let first = row
                    .get(&format!("{}_samples", self.opts.score_column))
                    .and_then(Value::as_array)
                    .and_then(|s| s.first())
                    .and_then(Value::as_f64)
                    .or(score);
                rec.insert(format!("pred_{lang}_sc"), json!(score));
                rec.insert(format!("pred_{lang}"), json!(first));
                match annotations.get(&(d.id.clone(), id.to_string())) {
                    Some(s) if *s >= d.scale.0 as f64 && *s <= d.scale.1 as f64 => {
                        let v = if s.fract() == 0.0 { json!(*s as i64) } else { json!(s) };
                        rec.insert("annotation_score".into(), v.clone());
                        rec.insert("gold".into(), v);
                        annotated += 1;
                    }
                    Some(s) => {
                        ctx.fail(
                            &rid,
                            FailureKind::Export,
                            format!(
                                "imported human score {s} of {}/{id} is outside the scale {}..={}",
                                d.id, d.scale.0, d.scale.1
                            ),
                            None,
                        );
                    }
                    None => {
                        rec.insert("annotation_score".into(), Value::Null);
                        rec.insert("gold".into(), Value::Null);
                    }
                }
                *models.entry(d.id.clone()).or_default().entry(model.to_string()).or_default() += 1;
                list.push(Value::Object(rec));
            }
        }
        let dir = ctx.out_dir.join(&self.opts.dir);
        let mut total = 0u64;
        for (dim, records) in &files {
            let (mut f, pending) = create_tmp(&dir.join(format!("{dim}_test.json")))?;
            std::io::Write::write_all(&mut f, &pretty(&Value::Array(records.clone()))?)?;
            finish_file(f, &pending)?;
            ctx.add_artifact(pending, Some(records.len() as u64));
            total += records.len() as u64;
        }
        let mut card = String::new();
        writeln!(card, "# {}\n", self.opts.title)?;
        writeln!(
            card,
            "Test scripts in CharacterBench's release layout (Zhou et al., AAAI 2025; thu-coai/CharacterBench), one \
             `<dimension>_test.json` per dimension file, built by synth's `pipelines/characterbench-build.toml`. \
             Read them with `characterbench_release` (`pipelines/characterbench.toml --set 'stages.release.path=\"<this folder>\"'`).\n"
        )?;
        writeln!(card, "| dimension | records | scripts × models |\n|---|---:|---|")?;
        for d in &self.bench.dimensions {
            if let Some(records) = files.get(&d.id) {
                let m = models
                    .get(&d.id)
                    .map(|m| m.iter().map(|(k, v)| format!("{k}: {v}")).collect::<Vec<_>>().join(", "));
                writeln!(card, "| {} ({}) | {} | {} |", d.heading, d.abbr, records.len(), m.unwrap_or_default())?;
            }
        }
        writeln!(
            card,
            "\n- Judge: {} (mean of its samples in `pred_<lang>_sc`, the first sample in `pred_<lang>`).",
            self.opts.judge.as_deref().unwrap_or("the pipeline's judge")
        )?;
        writeln!(
            card,
            "- Human scores: {}.",
            if annotated > 0 {
                format!("{annotated} of {total} records have imported `annotation_score` / `gold`")
            } else {
                "`annotation_score` and `gold` are null, left for annotation (import them with the `annotations` option)".to_string()
            }
        )?;
        writeln!(
            card,
            "- Reconstructed, not the paper's: the context, target-extraction, query and filter prompts \
             (`pipelines/prompts/characterbench/build/`, the paper's appendix is unpublished) and the hand-written \
             behaviour descriptions and immoral settings (`rules/characterbench/`).\n- Contexts, targets and queries are \
             model-generated: review them before use (the paper adds a manual filtering pass)."
        )?;
        let (mut f, pending) = create_tmp(&dir.join("README.md"))?;
        std::io::Write::write_all(&mut f, card.as_bytes())?;
        finish_file(f, &pending)?;
        ctx.add_artifact(pending, None);
        ctx.report.rows_in = n;
        ctx.report.rows_out = total;
        ctx.report.info.insert("annotated".into(), annotated.to_string());
        Ok(())
    }
}
