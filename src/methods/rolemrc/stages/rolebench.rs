//! `rolemrc_rolebench`: RoleBench's English sets (Wang et al., 2023; the hub dataset
//! `ZenMoore/RoleBench`) in their published layout, as RoleMRC's `evaluation.py` feeds
//! them to a model for Table 4: `rolebench-eng/<set>/<subset>/<file>.jsonl` (records
//! `{"role", "question", "generated": [...]}`) and `profiles-eng/desc.json` (role →
//! description), from a local copy (`path`) or the hub (`hf`). One record per line:
//! the official message layout in `question` (`System`: the role's prompt rendered from
//! its description by `system_template`, `User`: the instruction), the reference answer
//! (`generated[reference_index]`), and which set (`RoleBenchInstEng` for
//! instruction-generalization, `RoleBenchRoleEng` for role-generalization, the task names
//! of `evaluation.py`) and subset it came from. A line that is not a record of that shape,
//! or whose role has no description, goes to the failure table naming `file:line`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use synth_core::data::arrow::datatypes::{DataType, Field, SchemaRef};

use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty, UINT};
use synth_core::data::{self, Row};
use synth_core::hub::HubSpec;
use synth_core::store::failures::FailureKind;
use synth_core::template::Templates;
use synth_engine::stages::{Arity, BuildCtx, KindInfo, PlanCtx, PrepareCtx, Prepared, Role, RunCtx, Stage};

/// The English sets and their names in RoleMRC's `evaluation.py` (`AVALIABLE_TASKS`).
pub const SETS: &[(&str, &str)] =
    &[("instruction-generalization", "RoleBenchInstEng"), ("role-generalization", "RoleBenchRoleEng")];
const SUBSETS: &[&str] = &["general", "role_specific"];
const DESC: &str = "profiles-eng/desc.json";

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::optional("path", Ty::Str, "local copy of the dataset's root (holding rolebench-eng/ and profiles-eng/)")
        .instead_of(&["hf"]),
    OptionSpec::optional(
        "hf",
        Ty::Struct(synth_kinds::source::HF_OPTIONS),
        "the hub repository instead of `path`, e.g. { repo = \"ZenMoore/RoleBench\" } (files default to the selected ones)",
    )
    .instead_of(&["path"]),
    OptionSpec::default(
        "sets",
        Ty::StrList,
        "[\"instruction-generalization\", \"role-generalization\"]",
        "which English sets (folders of rolebench-eng/)",
    ),
    OptionSpec::default("subsets", Ty::StrList, "[\"general\", \"role_specific\"]", "which subsets of each set"),
    OptionSpec::default("file", Ty::Enum(&["test", "train"]), "\"test\"", "which file of each subset"),
    OptionSpec::default(
        "system_template",
        Ty::File,
        "\"pipelines/prompts/rolemrc/rolebench/system.j2\"",
        "the role's system prompt (variables role, desc); the default is RoleLLM's RoleGPT prompt",
    ),
    OptionSpec::default(
        "reference_index",
        UINT,
        "0",
        "which of a record's `generated` answers is the reference (0: the first, as OpenCompass reads RoleBench)",
    ),
];

pub static KIND: KindInfo = KindInfo {
    name: "rolemrc_rolebench",
    about: "RoleBench's English sets (ZenMoore/RoleBench layout, local or hub) as test rows: the role's system prompt from desc.json, question, reference",
    role: Role::Source,
    arity: Arity::None,
    options: OPTIONS,
    example: "path = \"pipelines/data/rolebench-demo\"",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    path: Option<String>,
    hf: Option<HubSpec>,
    sets: Vec<String>,
    subsets: Vec<String>,
    file: String,
    system_template: String,
    reference_index: usize,
}

struct RoleBench {
    opts: Options,
    root: Option<PathBuf>,
    pipeline_root: PathBuf,
    templates: Templates,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    match (&opts.path, &opts.hf) {
        (None, None) => {
            ctx.error(diags, "path", "give \"path\" (a local copy) or \"hf\" (a hub repository)");
            return None;
        }
        (Some(_), Some(_)) => {
            ctx.error(diags, "hf", "give either \"path\" or \"hf\", not both");
            return None;
        }
        _ => {}
    }
    let mut ok = true;
    for s in &opts.sets {
        if !SETS.iter().any(|(folder, _)| folder == s) {
            let known: Vec<&str> = SETS.iter().map(|(f, _)| *f).collect();
            ctx.error(diags, "sets", format!("unknown set \"{s}\" (RoleBench's English sets: {})", known.join(", ")));
            ok = false;
        }
    }
    for s in &opts.subsets {
        if !SUBSETS.contains(&s.as_str()) {
            ctx.error(diags, "subsets", format!("unknown subset \"{s}\" (each set has {})", SUBSETS.join(", ")));
            ok = false;
        }
    }
    let mut templates = Templates::new();
    let full = ctx.root.join(&opts.system_template);
    match std::fs::read_to_string(&full).map_err(|e| e.to_string()).and_then(|t| templates.add("system", &t)) {
        Ok(vars) => {
            for v in vars {
                if v != "role" && v != "desc" {
                    ctx.error(diags, "system_template", format!("template variable \"{v}\" is not one of role, desc"));
                    ok = false;
                }
            }
        }
        Err(e) => {
            ctx.error(diags, "system_template", format!("template {}: {e}", full.display()));
            ok = false;
        }
    }
    let root = opts.path.as_ref().map(|p| ctx.root.join(p));
    ok.then(|| Box::new(RoleBench { opts, root, pipeline_root: ctx.root.to_path_buf(), templates }) as Box<dyn Stage>)
}

impl RoleBench {
    /// The selected files' paths in the layout (`/`-separated): (set name, subset, path).
    fn data_files(&self) -> Vec<(&'static str, String, String)> {
        let mut out = Vec::new();
        for (folder, name) in SETS.iter().filter(|(f, _)| self.opts.sets.iter().any(|s| s == f)) {
            for subset in &self.opts.subsets {
                out.push((*name, subset.clone(), format!("rolebench-eng/{folder}/{subset}/{}.jsonl", self.opts.file)));
            }
        }
        out
    }

    fn wanted(&self) -> Vec<String> {
        std::iter::once(DESC.to_string()).chain(self.data_files().into_iter().map(|(_, _, p)| p)).collect()
    }
}

/// Output columns: the official test layout (`question` as messages, `reference`) plus
/// where each row came from.
fn output_schema() -> SchemaRef {
    let s = |n: &str| Field::new(n, DataType::Utf8, false);
    let text_list = DataType::List(std::sync::Arc::new(Field::new("item", DataType::Utf8, false)));
    data::schema_with_id([
        s("split"),
        s("subset"),
        s("role"),
        s("desc"),
        s("system"),
        s("instruction"),
        Field::new("question", crate::parsers::turns_type(), false),
        s("reference"),
        Field::new("references", text_list, false),
        s("file"),
        Field::new("line", DataType::Int64, false),
    ])
}

/// One line of a RoleBench file as a row, or why it cannot be one.
fn record(
    line: &str,
    desc: &BTreeMap<String, String>,
    templates: &Templates,
    reference_index: usize,
) -> std::result::Result<(Row, String), (FailureKind, String)> {
    let v: Value = serde_json::from_str(line).map_err(|e| (FailureKind::Parse, format!("not JSON: {e}")))?;
    let text = |k: &str| -> std::result::Result<String, (FailureKind, String)> {
        match v.get(k) {
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(s.clone()),
            Some(Value::String(_)) => Err((FailureKind::BadRecord, format!("field \"{k}\": empty"))),
            Some(other) => Err((FailureKind::BadRecord, format!("field \"{k}\": not text ({other})"))),
            None => Err((FailureKind::BadRecord, format!("field \"{k}\": missing"))),
        }
    };
    let (role, question) = (text("role")?, text("question")?);
    let generated: Vec<String> = match v.get("generated") {
        Some(Value::Array(a)) => a
            .iter()
            .map(|g| g.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or((FailureKind::BadRecord, "field \"generated\": not a list of texts".to_string()))?,
        _ => return Err((FailureKind::BadRecord, "field \"generated\": missing or not a list".into())),
    };
    let reference = generated.get(reference_index).cloned().ok_or_else(|| {
        (
            FailureKind::BadRecord,
            format!(
                "field \"generated\": {} answer(s), no answer {reference_index} (reference_index)",
                generated.len()
            ),
        )
    })?;
    let d = desc
        .get(&role)
        .ok_or_else(|| (FailureKind::BadRecord, format!("role \"{role}\" has no description in {DESC}")))?;
    let mut vars = Row::new();
    vars.insert("role".into(), json!(role));
    vars.insert("desc".into(), json!(d));
    let system = templates.render("system", &vars).map_err(|e| (FailureKind::Template, e))?.trim_end().to_string();
    let mut row = Row::new();
    row.insert("role".into(), json!(role));
    row.insert("desc".into(), json!(d));
    row.insert("system".into(), json!(system));
    row.insert("instruction".into(), json!(question));
    row.insert(
        "question".into(),
        json!([{"role": "System", "content": system}, {"role": "User", "content": question}]),
    );
    row.insert("reference".into(), json!(reference));
    row.insert("references".into(), json!(generated));
    Ok((row, role))
}

/// `profiles-eng/desc.json`: role → description.
fn read_desc(path: &Path) -> Result<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: Value = serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
    let Value::Object(map) = v else {
        return Err(anyhow!("{}: expected an object of role → description", path.display()));
    };
    map.into_iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k, s)),
            other => Err(anyhow!("{}: role \"{k}\": the description is not text ({other})", path.display())),
        })
        .collect()
}

#[async_trait]
impl Stage for RoleBench {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        ctx.files.push(self.pipeline_root.join(&self.opts.system_template));
        Some(output_schema())
    }

    async fn prepare(&self, ctx: &PrepareCtx<'_>) -> Result<Option<Prepared>> {
        let wanted = self.wanted();
        let Some(hf) = &self.opts.hf else {
            let root = self.root.as_deref().expect("path or hf");
            let mut files = Vec::new();
            for w in &wanted {
                let f = root.join(w);
                if !f.exists() {
                    return Err(anyhow!("{} is missing (is `path` the dataset's root, holding {w}?)", f.display()));
                }
                files.push(f);
            }
            return Ok(Some(Prepared { files, hash_files: true, ..Default::default() }));
        };
        ctx.hub_files(hf, &self.pipeline_root, &wanted, "RoleBench's layout").await
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        // The prepared files are the wanted ones, in order: desc.json, then the data files.
        let files = ctx.prepared.files.clone();
        let data_files = self.data_files();
        if files.len() != data_files.len() + 1 {
            return Err(anyhow!("expected {} prepared files, found {}", data_files.len() + 1, files.len()));
        }
        let desc = read_desc(&files[0])?;
        let schema = output_schema();
        let mut out = ctx.create_output(schema.clone())?;
        let limit = ctx.limit.map_or(usize::MAX, |l| l as usize);
        let (mut rows, mut kept, mut seen) = (Vec::new(), 0usize, 0u64);
        'files: for ((name, subset, rel), local) in data_files.iter().zip(&files[1..]) {
            let text = std::fs::read_to_string(local).with_context(|| format!("reading {}", local.display()))?;
            for (n, line) in text.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                if kept >= limit {
                    break 'files;
                }
                seen += 1;
                let id = format!("{name}/{subset}/{}", n + 1);
                match record(line, &desc, &self.templates, self.opts.reference_index) {
                    Ok((mut row, _)) => {
                        row.insert(data::ID.into(), json!(id));
                        row.insert("split".into(), json!(name));
                        row.insert("subset".into(), json!(subset));
                        row.insert("file".into(), json!(rel));
                        row.insert("line".into(), json!(n + 1));
                        rows.push(row);
                        kept += 1;
                    }
                    Err((kind, message)) => {
                        ctx.fail(&id, kind, format!("{rel}:{}: {message}", n + 1), Some(line.to_string()));
                    }
                }
                if rows.len() >= 2048 {
                    out.write(&data::rows_to_batch(&schema, &rows).map_err(|(i, e)| anyhow!("row {i}: {e}"))?)?;
                    rows.clear();
                }
            }
        }
        if !rows.is_empty() {
            out.write(&data::rows_to_batch(&schema, &rows).map_err(|(i, e)| anyhow!("row {i}: {e}"))?)?;
        }
        ctx.report.rows_in = seen;
        ctx.set_output(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn templates() -> Templates {
        let mut t = Templates::new();
        t.add("system", "You are {{ role }}, your description is: {{ desc }}.\n").unwrap();
        t
    }

    #[test]
    fn a_line_becomes_the_official_test_layout() {
        let desc = BTreeMap::from([("Ada".to_string(), "a mathematician".to_string())]);
        let (row, role) = record(
            r#"{"role": "Ada", "question": "Who are you?", "generated": ["I am Ada.", "Ada, at your service."]}"#,
            &desc,
            &templates(),
            1,
        )
        .unwrap();
        assert_eq!(role, "Ada");
        assert_eq!(row["system"], "You are Ada, your description is: a mathematician.");
        assert_eq!(
            row["question"],
            json!([{"role": "System", "content": "You are Ada, your description is: a mathematician."}, {"role": "User", "content": "Who are you?"}])
        );
        assert_eq!(row["reference"], "Ada, at your service.");
        assert_eq!(row["references"], json!(["I am Ada.", "Ada, at your service."]));
    }

    #[test]
    fn bad_lines_say_what_is_wrong() {
        let desc = BTreeMap::from([("Ada".to_string(), "a mathematician".to_string())]);
        let err = |line: &str| record(line, &desc, &templates(), 0).unwrap_err();
        assert_eq!(err("{not json").0, FailureKind::Parse);
        assert!(
            err(r#"{"role": "Bob", "question": "q", "generated": ["a"]}"#).1.contains("\"Bob\" has no description")
        );
        assert!(err(r#"{"role": "Ada", "question": "", "generated": ["a"]}"#).1.contains("\"question\": empty"));
        assert!(err(r#"{"role": "Ada", "question": "q", "generated": []}"#).1.contains("no answer 0"));
        assert!(err(r#"{"role": "Ada", "question": "q", "generated": "a"}"#).1.contains("not a list"));
    }
}
