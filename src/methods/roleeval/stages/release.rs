//! `roleeval_release`: the RoleEval release (a local directory in the upstream
//! layout, `<lang>/<subset>/<split>/<category>_<split>.csv`) as records, one per
//! question, keyed `subset/category/id`, every cell as text. A missing file or
//! column stops the stage naming the file; a bad row (field count, empty question
//! or option, answer not a choice letter, duplicate key) goes to the failure table
//! naming `file:line` (`roleeval::release`).

use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use synth_core::data::arrow::datatypes::{DataType, Field, SchemaRef};

use crate::format::Format;
use crate::release::{self, Item, Selection};
use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data::{self, Row};
use synth_core::hub::HubSpec;
use synth_core::store::failures::FailureKind;
use synth_engine::stages::{Arity, BuildCtx, KindInfo, PlanCtx, PrepareCtx, Prepared, Role, RunCtx, Stage};

/// The language file every RoleEval kind reads by default.
pub const DEFAULT_FORMAT: &str = "\"pipelines/prompts/roleeval/zh.json\"";

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::optional("path", Ty::Str, "the release's root directory (holding zh/), relative to the pipeline root"),
    OptionSpec::optional(
        "hf",
        Ty::Struct(synth_kinds::source::HF_OPTIONS),
        "a hub repository in the release's layout instead of `path` (files default to the selected CSVs)",
    ),
    OptionSpec::required(
        "split",
        Ty::Enum(&["test", "dev"]),
        "which files: test (questions) or dev (exemplars with answers)",
    ),
    OptionSpec::default("format", Ty::File, DEFAULT_FORMAT, "language file: categories, subsets, choice letters"),
    OptionSpec::optional("subsets", Ty::StrList, "subsets to read (default: every subset of the format file)"),
    OptionSpec::optional("categories", Ty::StrList, "category file stems to read (default: all of the format file)"),
];

pub static KIND: KindInfo = KindInfo {
    name: "roleeval_release",
    about: "the RoleEval release (zh/<subset>/<split>/<category>_<split>.csv) as one record per question, key subset/category/id, cells as text",
    role: Role::Source,
    arity: Arity::None,
    options: OPTIONS,
    example: "path = \"pipelines/data/roleeval-demo\"\nsplit = \"dev\"",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    path: Option<String>,
    hf: Option<HubSpec>,
    split: String,
    format: String,
    subsets: Option<Vec<String>>,
    categories: Option<Vec<String>>,
}

struct ReleaseStage {
    /// The local root (`path`), or none when the release comes from the hub.
    root: Option<PathBuf>,
    hf: Option<HubSpec>,
    pipeline_root: PathBuf,
    format: Format,
    sel: Selection,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    match (&opts.path, &opts.hf) {
        (None, None) => {
            ctx.error(diags, "path", "give \"path\" (a local release) or \"hf\" (a hub repository)");
            return None;
        }
        (Some(_), Some(_)) => {
            ctx.error(diags, "hf", "give either \"path\" or \"hf\", not both");
            return None;
        }
        _ => {}
    }
    let format = super::read_format(ctx, diags, &opts.format)?;
    let subsets = opts.subsets.unwrap_or_else(|| format.subsets.iter().map(|s| s.stem.clone()).collect());
    let categories = opts.categories.unwrap_or_else(|| format.categories.iter().map(|c| c.stem.clone()).collect());
    let mut ok = true;
    for s in &subsets {
        if !format.subsets.iter().any(|x| &x.stem == s) {
            ctx.error(
                diags,
                "subsets",
                format!(
                    "unknown subset \"{s}\" (the format file has: {})",
                    names(format.subsets.iter().map(|x| &x.stem))
                ),
            );
            ok = false;
        }
    }
    for c in &categories {
        if format.category(c).is_none() {
            ctx.error(
                diags,
                "categories",
                format!(
                    "unknown category \"{c}\" (the format file has: {})",
                    names(format.categories.iter().map(|x| &x.stem))
                ),
            );
            ok = false;
        }
    }
    let sel = Selection { split: opts.split, subsets, categories };
    let root = opts.path.as_ref().map(|p| ctx.root.join(p));
    ok.then(|| {
        Box::new(ReleaseStage { root, hf: opts.hf, pipeline_root: ctx.root.to_path_buf(), format, sel })
            as Box<dyn Stage>
    })
}

impl ReleaseStage {
    /// The selected CSVs' paths relative to the release root (`/`-separated).
    fn repo_paths(&self) -> Vec<String> {
        release::files(Path::new(""), &self.format, &self.sel)
            .into_iter()
            .map(|(_, _, p)| p.to_string_lossy().replace('\\', "/"))
            .collect()
    }
}

fn names<'a>(it: impl Iterator<Item = &'a String>) -> String {
    it.map(String::as_str).collect::<Vec<_>>().join(", ")
}

/// Output columns (also the `roleeval_prompts` inputs' contract).
pub fn output_schema() -> SchemaRef {
    let s = |n: &str| Field::new(n, DataType::Utf8, false);
    data::schema_with_id([
        s("lang"),
        s("subset"),
        s("split"),
        s("category"),
        s("code"),
        s("qid"),
        Field::new("row", DataType::Int64, false),
        s("question"),
        s("A"),
        s("B"),
        s("C"),
        s("D"),
        Field::new("answer", DataType::Utf8, true),
        s("source"),
    ])
}

fn item_row(item: &Item, choices: &[String]) -> Row {
    let mut r = Row::new();
    r.insert(data::ID.into(), json!(item.qkey));
    for (k, v) in [
        ("lang", &item.lang),
        ("subset", &item.subset),
        ("split", &item.split),
        ("category", &item.category),
        ("code", &item.code),
        ("qid", &item.qid),
    ] {
        r.insert(k.into(), json!(v));
    }
    r.insert("row".into(), json!(item.row));
    r.insert("question".into(), json!(item.question));
    for (letter, option) in choices.iter().zip(&item.options) {
        r.insert(letter.clone(), json!(option));
    }
    r.insert("answer".into(), item.answer.clone().map(Value::String).unwrap_or(Value::Null));
    r.insert("source".into(), json!(item.source));
    r
}

#[async_trait]
impl Stage for ReleaseStage {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        if self.format.choices != ["A", "B", "C", "D"] {
            ctx.error("format", "the release layout has options A, B, C, D: the format file's choices must be those");
        }
        Some(output_schema())
    }

    async fn prepare(&self, ctx: &PrepareCtx<'_>) -> Result<Option<Prepared>> {
        let Some(hf) = &self.hf else {
            let root = self.root.as_deref().expect("path or hf");
            let files = release::files(root, &self.format, &self.sel);
            for (_, _, f) in &files {
                if !f.exists() {
                    return Err(anyhow!(
                        "{} is missing (is `path` the release's root, holding {}/?)",
                        f.display(),
                        self.format.lang
                    ));
                }
            }
            return Ok(Some(Prepared {
                files: files.into_iter().map(|(_, _, f)| f).collect(),
                hash_files: true,
                ..Default::default()
            }));
        };
        // The selected CSVs by their paths in the repository, unless `files` says otherwise.
        let wanted = self.repo_paths();
        ctx.hub_files(hf, &self.pipeline_root, &wanted, "the release layout").await
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        // Local: the root given. Hub: the snapshot directory the prepared files lie in.
        let root = match &self.root {
            Some(r) => r.clone(),
            None => {
                let (first, rel) = (ctx.prepared.files.first(), self.repo_paths().into_iter().next());
                let (Some(first), Some(rel)) = (first, rel) else { return Err(anyhow!("no files selected")) };
                first.ancestors().nth(Path::new(&rel).components().count()).map(Path::to_path_buf).unwrap_or_default()
            }
        };
        let files = release::files(&root, &self.format, &self.sel);
        let (items, problems) = release::read(&files, &self.format, &self.sel.split).map_err(|e| anyhow!(e))?;
        for p in &problems {
            ctx.fail(&p.id, FailureKind::Parse, p.message.clone(), p.record.clone());
        }
        let schema = output_schema();
        // `--limit` trims the questions; the exemplars stay whole (k-shot prompts need all of them).
        let limit = match ctx.limit {
            Some(l) if self.sel.split != "dev" => l as usize,
            _ => usize::MAX,
        };
        let rows: Vec<Row> = items.iter().take(limit).map(|i| item_row(i, &self.format.choices)).collect();
        ctx.report.rows_in = (items.len() + problems.len()) as u64;
        let mut out = ctx.create_output(schema.clone())?;
        for chunk in rows.chunks(1024) {
            out.write(&data::rows_to_batch(&schema, chunk).map_err(|(i, e)| anyhow!("row {i}: {e}"))?)?;
        }
        ctx.set_output(out)
    }
}
