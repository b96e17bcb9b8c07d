//! `characterbench_release`: the release's dimension files (`<dimension>_test.json` in a
//! directory, each a JSON array) as one record per (record, language), id
//! `<dimension>/<record id>/<lang>`, normalized as the official code does
//! (`characterbench::release`): the role-play session (`messages`), the judge's view
//! (`judge_profile`, `judge_dialogue`, `user_query`, `speaker`, `target`), the shipped
//! response, the human score (`gold`) and the shipped judge predictions for the row's
//! language (`pred`, `pred_sc`, ... = `pred_<lang>`, `pred_<lang>_sc`, ...).
//!
//! A file whose dimension the definition (the scale table) does not know stops the
//! stage naming the file; so does a file that is not a JSON array. A record that breaks
//! a rule (an unknown speaker, a last turn that is not the user's, a missing
//! `translation_en`, a human score off the scale, ...) goes to the failure table naming
//! file, record id and field; its other language is still read. `fallback_path` is read
//! when `path` does not exist (e.g. generated files of the same layout when the
//! release is not on this machine); the directory used is in the fingerprint and the
//! report. `--limit N` reads the first N records of each file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow, bail};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use synth_core::data::arrow::datatypes::{DataType, Field, Fields, SchemaRef};

use super::{DEFAULT_DIMENSIONS, check_langs, read_bench};
use crate::bench::Bench;
use crate::release::{self, Item, PRED_SUFFIXES};
use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data::{self, Row};
use synth_core::store::failures::FailureKind;
use synth_engine::stages::{Arity, BuildCtx, KindInfo, PlanCtx, PrepareCtx, Prepared, Role, RunCtx, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::required(
        "path",
        Ty::Str,
        "directory of the release's <dimension>_test.json files (relative to the pipeline root)",
    ),
    OptionSpec::optional(
        "fallback_path",
        Ty::Str,
        "directory read instead when `path` does not exist (a warning says so)",
    ),
    OptionSpec::default(
        "dimensions",
        Ty::File,
        DEFAULT_DIMENSIONS,
        "the benchmark definition: dimensions, scales, templates",
    ),
    OptionSpec::default(
        "langs",
        Ty::StrList,
        "[\"zh\", \"en\"]",
        "languages to read (en: each record's translation_en)",
    ),
    OptionSpec::optional("only", Ty::StrList, "read only these dimensions (default: every dimension file present)"),
    OptionSpec::default("suffix", Ty::Str, "\"_test\"", "file names are <dimension><suffix>.json"),
];

pub static KIND: KindInfo = KindInfo {
    name: "characterbench_release",
    about: "CharacterBench's release (<dimension>_test.json arrays) as one record per language: the official session normalization, the judge's view, human scores, shipped predictions",
    role: Role::Source,
    arity: Arity::None,
    options: OPTIONS,
    example: "path = \"pipelines/data/characterbench-demo\"",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    path: String,
    fallback_path: Option<String>,
    dimensions: String,
    langs: Vec<String>,
    only: Option<Vec<String>>,
    suffix: String,
}

struct ReleaseStage {
    opts: Options,
    bench: Bench,
    root: PathBuf,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    let bench = read_bench(ctx, diags, &opts.dimensions)?;
    if !check_langs(ctx, diags, &bench, &opts.langs) {
        return None;
    }
    if let Some(only) = &opts.only {
        for d in only {
            if bench.dimension(d).is_none() {
                ctx.error(diags, "only", format!("unknown dimension \"{d}\" (the definition has: {})", bench.ids()));
                return None;
            }
        }
    }
    Some(Box::new(ReleaseStage { opts, bench, root: ctx.root.to_path_buf() }))
}

/// Output columns (the contract of the other CharacterBench kinds).
pub fn output_schema() -> SchemaRef {
    let s = |n: &str| Field::new(n, DataType::Utf8, false);
    let o = |n: &str| Field::new(n, DataType::Utf8, true);
    let i = |n: &str| Field::new(n, DataType::Int64, false);
    let f = |n: &str| Field::new(n, DataType::Float64, true);
    let message = DataType::Struct(Fields::from(vec![s("role"), s("content")]));
    let mut fields = vec![
        s("record_key"),
        s("dimension"),
        s("abbr"),
        s("aspect"),
        s("lang"),
        s("record_id"),
        i("index"),
        s("file"),
        i("scale_min"),
        i("scale_max"),
        s("character_name"),
        s("character_profile"),
        s("user_name"),
        s("user_profile"),
        o("greeting"),
        Field::new("messages", DataType::List(std::sync::Arc::new(Field::new("item", message, true))), false),
        s("judge_profile"),
        s("judge_dialogue"),
        s("user_query"),
        s("speaker"),
        o("target_slot"),
        o("target"),
        o("response"),
        o("response_model"),
        f("gold"),
    ];
    fields.extend(PRED_SUFFIXES.iter().map(|sfx| f(&format!("pred{sfx}"))));
    fields.push(o("data_source"));
    data::schema_with_id(fields)
}

/// The output row of an item (also the script rows of the construction pipeline).
pub(super) fn item_row(item: &Item, bench: &Bench, file: &str) -> Row {
    let dim = bench.dimension(&item.dimension).expect("read from the definition");
    let mut r = Row::new();
    r.insert(data::ID.into(), json!(item.key));
    for (k, v) in [
        ("record_key", &item.record_key),
        ("dimension", &item.dimension),
        ("abbr", &dim.abbr),
        ("aspect", &dim.aspect),
        ("lang", &item.lang),
        ("record_id", &item.record_id),
    ] {
        r.insert(k.into(), json!(v));
    }
    r.insert("index".into(), json!(item.index));
    r.insert("file".into(), json!(file));
    r.insert("scale_min".into(), json!(dim.scale.0));
    r.insert("scale_max".into(), json!(dim.scale.1));
    r.insert("character_name".into(), json!(item.character_name));
    r.insert("character_profile".into(), json!(item.character_profile));
    r.insert("user_name".into(), json!(item.user_name));
    r.insert("user_profile".into(), json!(item.user_profile));
    r.insert("greeting".into(), json!(item.greeting));
    r.insert(
        "messages".into(),
        Value::Array(item.messages.iter().map(|(role, content)| json!({"role": role, "content": content})).collect()),
    );
    r.insert("judge_profile".into(), json!(item.judge_profile));
    r.insert("judge_dialogue".into(), json!(item.judge_dialogue));
    r.insert("user_query".into(), json!(item.user_query));
    r.insert("speaker".into(), json!(item.speaker));
    r.insert("target_slot".into(), json!(item.target_slot));
    r.insert("target".into(), json!(item.target));
    r.insert("response".into(), json!(item.response));
    r.insert("response_model".into(), json!(item.response_model));
    r.insert("gold".into(), json!(item.gold));
    for (sfx, p) in PRED_SUFFIXES.iter().zip(&item.preds) {
        r.insert(format!("pred{sfx}"), json!(p));
    }
    r.insert("data_source".into(), json!(item.data_source));
    r
}

impl ReleaseStage {
    /// The directory to read: `path`, else `fallback_path`.
    fn directory(&self) -> Result<PathBuf> {
        let main = self.root.join(&self.opts.path);
        if main.is_dir() {
            return Ok(main);
        }
        match &self.opts.fallback_path {
            Some(f) if self.root.join(f).is_dir() => Ok(self.root.join(f)),
            Some(f) => {
                bail!("neither {} nor the fallback {} is a directory", main.display(), self.root.join(f).display())
            }
            None => bail!("{} is not a directory (the release's eval_data/raw_data)", main.display()),
        }
    }

    /// The dimension files in the directory, in the definition's order; an unknown one is an error.
    fn files(&self, dir: &Path) -> Result<Vec<(String, PathBuf)>> {
        let mut found: BTreeMap<String, PathBuf> = BTreeMap::new();
        for e in std::fs::read_dir(dir).map_err(|e| anyhow!("{}: {e}", dir.display()))? {
            let path = e?.path();
            if path.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let Some(dim) = release::dimension_of(&path, &self.opts.suffix) else { continue };
            if self.bench.dimension(&dim).is_none() {
                bail!(
                    "{}: dimension \"{dim}\" is not in the scale table {} (it knows: {}); rename or move the file, or add the dimension with its scale",
                    path.display(),
                    self.opts.dimensions,
                    self.bench.ids()
                );
            }
            found.insert(dim, path);
        }
        let wanted = |d: &str| self.opts.only.as_ref().is_none_or(|o| o.iter().any(|x| x == d));
        let files: Vec<(String, PathBuf)> = self
            .bench
            .dimensions
            .iter()
            .filter(|d| wanted(&d.id))
            .filter_map(|d| found.get(&d.id).map(|p| (d.id.clone(), p.clone())))
            .collect();
        if files.is_empty() {
            bail!("{}: no <dimension>{}.json file of the definition's dimensions", dir.display(), self.opts.suffix);
        }
        Ok(files)
    }

    fn display_path(&self, path: &Path) -> String {
        path.strip_prefix(&self.root).unwrap_or(path).to_string_lossy().replace('\\', "/")
    }
}

#[async_trait]
impl Stage for ReleaseStage {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        ctx.files.extend(self.bench.files.iter().cloned());
        Some(output_schema())
    }

    async fn prepare(&self, _ctx: &PrepareCtx<'_>) -> Result<Option<Prepared>> {
        let dir = self.directory()?;
        let files = self.files(&dir)?;
        let mut p =
            Prepared { files: files.into_iter().map(|(_, p)| p).collect(), hash_files: true, ..Default::default() };
        p.fingerprint.insert("directory".into(), self.display_path(&dir));
        Ok(Some(p))
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let dir = self.directory()?;
        if !self.root.join(&self.opts.path).is_dir() {
            tracing::warn!(
                "stage \"{}\": {} is not here; reading {} instead (fallback_path)",
                ctx.name,
                self.opts.path,
                self.display_path(&dir)
            );
        }
        ctx.report.info.insert("directory".into(), self.display_path(&dir));
        let schema = output_schema();
        let mut out = ctx.create_output(schema.clone())?;
        let (mut rows_in, mut rows_out) = (0u64, 0u64);
        for (dim_id, path) in self.files(&dir)? {
            let dim = self.bench.dimension(&dim_id).expect("listed by files()");
            let (mut items, problems) =
                release::read_file(&path, dim, &self.bench, &self.opts.langs).map_err(|e| anyhow!(e))?;
            let shown = self.display_path(&path);
            if let Some(limit) = ctx.limit {
                items.retain(|i| (i.index as u64) < limit);
            }
            for p in &problems {
                let kind = if p.field.is_empty() { FailureKind::Parse } else { FailureKind::BadRecord };
                ctx.fail(&p.id, kind, p.message.clone(), p.record.clone());
            }
            // P12: the divisor is the scale's maximum, not the largest human score of the file.
            let gold_max = items.iter().filter_map(|i| i.gold).fold(f64::NEG_INFINITY, f64::max);
            if gold_max.is_finite() {
                ctx.report.info.insert(format!("gold_max.{dim_id}"), gold_max.to_string());
                if gold_max < dim.scale.1 as f64 {
                    tracing::warn!(
                        "stage \"{}\": {shown}: no human score reaches {}'s scale maximum {} (the largest is {gold_max}); scores divide by the scale maximum, the official all_eval.py would divide by {gold_max}",
                        ctx.name,
                        dim_id,
                        dim.scale.1
                    );
                }
            }
            rows_in += (items.len() + problems.len()) as u64;
            let rows: Vec<Row> = items.iter().map(|i| item_row(i, &self.bench, &shown)).collect();
            for chunk in rows.chunks(512) {
                out.write(&data::rows_to_batch(&schema, chunk).map_err(|(i, e)| anyhow!("{shown}: row {i}: {e}"))?)?;
            }
            rows_out += rows.len() as u64;
            ctx.report.info.insert(format!("records.{dim_id}"), rows.len().to_string());
        }
        ctx.report.rows_in = rows_in;
        let _ = rows_out;
        ctx.set_output(out)
    }
}
