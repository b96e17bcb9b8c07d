//! `judge_plan`: turn evaluated rows into LLM-as-judge queries, driven by data. A
//! judge is a folder (`prompts_dir`) of:
//! - `dimensions.json`: `[{"id": "...", "heading": "..."}, ...]`, the dimensions in
//!   report order (their headings are what `judge_score` writes to the summary);
//! - `tasks.json`: task label → list of queries `{"dimension": "...", ...}`, each other
//!   key a template variable of that query (keys starting with `_` are comments);
//! - `<dimension>.j2`: the prompt of each dimension (minijinja).
//!
//! Each row of the input (its `task_column` names the task) gives one query per entry
//! of its task, rendered with the row's columns, then the query's variables, then
//! `task` (the label) and `dimension` (later ones win on a name clash). A method's preset builds the same stage with
//! its own template variables ([`VarsFn`]) and defaults. The queries go to a generic
//! `llm` stage; the answers are scored by `judge_score`. A row whose task has no
//! entry, or whose prompt does not render, goes to the failures table.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Result, anyhow};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use synth_core::data::arrow::datatypes::{DataType, Field, SchemaRef};

use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, POSITIVE, Ty};
use synth_core::data::{self, Row};
use synth_core::store::failures::FailureKind;
use synth_core::template::Templates;
use synth_engine::stages::{BuildCtx, KindInfo, PartitionCtx, Partitioning, PlanCtx, RunCtx, Sharding, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::required(
        "prompts_dir",
        Ty::Str,
        "folder with dimensions.json, tasks.json (task -> queries) and <dimension>.j2 templates",
    ),
    OptionSpec::default("task_column", Ty::Str, "\"task\"", "column with the task label"),
    OptionSpec::default(
        "repeat",
        Ty::Map(&POSITIVE),
        "{}",
        "dimension -> copies of its query (ids <id>#<dimension>#2...), e.g. to weigh it twice in averages",
    ),
];

pub static KIND: KindInfo = KindInfo {
    name: "judge_plan",
    about: "LLM-as-judge queries from a judge folder (dimensions, task -> queries, one prompt template per dimension)",
    options: OPTIONS,
    example: "prompts_dir = \"tests/fixtures/judge\"",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    prompts_dir: String,
    task_column: String,
    repeat: BTreeMap<String, usize>,
}

/// A judge dimension: its id (template file stem, summary metric) and report heading.
#[derive(Deserialize, Clone, Debug, PartialEq)]
pub struct Dimension {
    pub id: String,
    pub heading: String,
}

/// One judge query of a task: its dimension and the template variables it sets.
#[derive(Clone, Debug)]
pub struct Query {
    pub dimension: String,
    pub vars: Map<String, Value>,
}

/// The template variables of one query of one row (besides the query's own): a
/// method's hook. The default is every column of the row.
pub type VarsFn = Arc<dyn Fn(&Row, &Query) -> std::result::Result<Map<String, Value>, String> + Send + Sync>;

/// Read `dimensions.json`: a non-empty list of `{id, heading}` with unique ids.
pub fn read_dimensions(path: &Path) -> std::result::Result<Vec<Dimension>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let dims: Vec<Dimension> = serde_json::from_str(&text).map_err(|e| {
        format!(
            "{}: line {} column {}: {e} (expected [{{\"id\": ..., \"heading\": ...}}, ...])",
            path.display(),
            e.line(),
            e.column()
        )
    })?;
    if dims.is_empty() {
        return Err(format!("{}: no dimension", path.display()));
    }
    for (i, d) in dims.iter().enumerate() {
        if dims[..i].iter().any(|e| e.id == d.id) {
            return Err(format!("{}: dimension \"{}\" listed twice", path.display(), d.id));
        }
    }
    Ok(dims)
}

/// A judge folder, read and checked.
pub struct Judge {
    pub dimensions: Vec<Dimension>,
    pub tasks: BTreeMap<String, Vec<Query>>,
    pub templates: Templates,
    /// The files read (for the fingerprint).
    pub files: Vec<PathBuf>,
}

impl Judge {
    /// Read `dir`: every problem as one message naming the file.
    pub fn read(dir: &Path) -> std::result::Result<Judge, String> {
        let dims_path = dir.join("dimensions.json");
        let dimensions = read_dimensions(&dims_path)?;
        let tasks_path = dir.join("tasks.json");
        let text = std::fs::read_to_string(&tasks_path).map_err(|e| format!("{}: {e}", tasks_path.display()))?;
        let raw: BTreeMap<String, Value> = serde_json::from_str(&text)
            .map_err(|e| format!("{}: line {} column {}: {e}", tasks_path.display(), e.line(), e.column()))?;
        let mut tasks = BTreeMap::new();
        for (task, v) in raw.into_iter().filter(|(k, _)| !k.starts_with('_')) {
            let bad = |why: &str| format!("{}: task \"{task}\": {why}", tasks_path.display());
            let items = v.as_array().ok_or_else(|| bad("must be a list of {\"dimension\": ...} objects"))?;
            let mut queries = Vec::with_capacity(items.len());
            for item in items {
                let mut vars = item.as_object().cloned().ok_or_else(|| bad("each query must be an object"))?;
                let dimension = match vars.remove("dimension") {
                    Some(Value::String(d)) => d,
                    _ => return Err(bad("a query without a \"dimension\" string")),
                };
                if !dimensions.iter().any(|d| d.id == dimension) {
                    let ids: Vec<&str> = dimensions.iter().map(|d| d.id.as_str()).collect();
                    return Err(bad(&format!(
                        "unknown dimension \"{dimension}\" (dimensions.json lists: {})",
                        ids.join(", ")
                    )));
                }
                queries.push(Query { dimension, vars });
            }
            tasks.insert(task, queries);
        }
        let mut templates = Templates::new();
        let mut files = vec![dims_path, tasks_path];
        for d in &dimensions {
            let path = dir.join(format!("{}.j2", d.id));
            std::fs::read_to_string(&path)
                .map_err(|e| e.to_string())
                .and_then(|t| templates.add(&d.id, &t).map(|_| ()))
                .map_err(|e| format!("{}: {e}", path.display()))?;
            files.push(path);
        }
        Ok(Judge { dimensions, tasks, templates, files })
    }
}

/// How a preset configures the stage.
pub struct Settings {
    /// The option that named the folder (for error spans).
    pub prompts_option: &'static str,
    pub prompts_dir: String,
    pub task_column: String,
    /// Columns the input must have (checked at plan time).
    pub required: Vec<String>,
    pub repeat: BTreeMap<String, usize>,
    /// Template variables; `None`: every column of the row.
    pub vars: Option<VarsFn>,
}

pub struct JudgePlan {
    settings: Settings,
    judge: Arc<Judge>,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let o: Options = ctx.parse(diags)?;
    build_with(
        ctx,
        diags,
        Settings {
            prompts_option: "prompts_dir",
            prompts_dir: o.prompts_dir,
            required: vec![o.task_column.clone()],
            task_column: o.task_column,
            repeat: o.repeat,
            vars: None,
        },
    )
}

/// Build the stage with a preset's settings.
pub fn build_with(ctx: &BuildCtx<'_>, diags: &mut Diagnostics, settings: Settings) -> Option<Box<dyn Stage>> {
    let judge = match Judge::read(&ctx.root.join(&settings.prompts_dir)) {
        Ok(j) => j,
        Err(e) => {
            ctx.error(diags, settings.prompts_option, e);
            return None;
        }
    };
    for d in settings.repeat.keys() {
        if !judge.dimensions.iter().any(|x| &x.id == d) {
            ctx.error(diags, "repeat", format!("unknown dimension \"{d}\""));
            return None;
        }
    }
    Some(Box::new(JudgePlan { settings, judge: Arc::new(judge) }))
}

fn output_schema() -> SchemaRef {
    let s = |n: &str| Field::new(n, DataType::Utf8, false);
    data::schema_with_id([s("source_id"), s("task"), s("dimension"), s("prompt")])
}

impl JudgePlan {
    fn queries(&self, row: &Row) -> std::result::Result<Vec<Row>, String> {
        let id = row.get(data::ID).and_then(Value::as_str).unwrap_or_default();
        let task_column = &self.settings.task_column;
        let task = row.get(task_column).and_then(Value::as_str).ok_or_else(|| format!("no {task_column}"))?;
        let queries =
            self.judge.tasks.get(task).ok_or_else(|| format!("no judge dimension for {task_column} \"{task}\""))?;
        let mut out = Vec::new();
        for q in queries {
            let mut vars = match &self.settings.vars {
                Some(f) => f(row, q)?,
                None => row.clone(),
            };
            for (k, v) in &q.vars {
                vars.insert(k.clone(), v.clone());
            }
            vars.insert("task".into(), json!(task));
            vars.insert("dimension".into(), json!(q.dimension));
            let prompt = self.judge.templates.render(&q.dimension, &vars)?;
            let copies = self.settings.repeat.get(&q.dimension).copied().unwrap_or(1);
            for c in 0..copies {
                let mut r = Row::new();
                let suffix = if c == 0 { String::new() } else { format!("#{}", c + 1) };
                r.insert(data::ID.into(), json!(format!("{id}#{}{suffix}", q.dimension)));
                r.insert("source_id".into(), json!(id));
                r.insert("task".into(), json!(task));
                r.insert("dimension".into(), json!(q.dimension));
                r.insert("prompt".into(), json!(prompt));
                out.push(r);
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl Stage for JudgePlan {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        ctx.require_columns("inputs", 0, self.settings.required.iter().map(String::as_str));
        ctx.files.extend(self.judge.files.iter().cloned());
        Some(output_schema())
    }

    /// Each row gives its queries on its own, in input order (cheap: a wave of its own
    /// only with `shard = true`; it joins the wave of a sharded input or of the LLM stage
    /// that answers it).
    fn partitioning(&self, _ctx: &PartitionCtx<'_>) -> Partitioning {
        Sharding::LIGHT
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let schema = output_schema();
        let mut out = ctx.create_output(schema.clone())?;
        let input = ctx.inputs[0].clone();
        let (_, batches) = synth_core::store::parquet::read_all(&input.path)?;
        let mut rows = Vec::new();
        let mut n = 0u64;
        for b in &batches {
            for i in 0..b.num_rows() {
                n += 1;
                let row = data::row_json(b, i);
                match self.queries(&row) {
                    Ok(q) => {
                        if let Some(lineage) = &ctx.lineage {
                            lineage.push(n - 1, q.len());
                        }
                        rows.extend(q)
                    }
                    Err(e) => {
                        let id = row.get(data::ID).and_then(Value::as_str).unwrap_or_default().to_string();
                        ctx.fail(&id, FailureKind::JudgePlan, e, serde_json::to_string(&row).ok());
                    }
                }
            }
        }
        out.write(&data::rows_to_batch(&schema, &rows).map_err(|(i, e)| anyhow!("query {i}: {e}"))?)?;
        ctx.report.rows_in = n;
        ctx.set_output(out)
    }
}
