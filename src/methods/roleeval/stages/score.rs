//! `roleeval_score`: score a model's answers and summarize them in the paper's
//! layouts (spec §3.5). Inputs: the prompts (`roleeval_prompts`, the denominators)
//! and the stage that answered them (an `llm` stage with the `roleeval_mcq` parser,
//! or a `loglik` stage), matched by id; a prompt without an answer counts as wrong
//! and unanswered. The gold letter comes from `key` (a file the user supplies: the
//! test key is withheld by the authors) or from the question's own `answer` (dev
//! rows, the self-check). Output: one row per prompt (pred, gold, correct); a
//! summary (one table per shot setting: subsets × categories + Avg as Tables 3–6;
//! knowledge vs reasoning when the key has types, as Tables 7–8; the unanswered
//! rate; the share of questions whose options repeat a text, flagged as ambiguous); and `<stage>.submission.json`, the predictions by setting, file and id
//! (C-Eval's submission layout, `{"<subset>/<category>": {"<id>": "A"}}` per setting).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use synth_core::data::arrow::datatypes::{DataType, Field, SchemaRef};

use super::release::DEFAULT_FORMAT;
use crate::format::Format;
use crate::metrics::{Tally, accuracy_pct, average};
use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data::{self, Row};
use synth_core::store::atomic::{create_tmp, finish_file};
use synth_core::store::summary::{self, OVERALL, SummaryRow};
use synth_engine::stages::{Arity, BuildCtx, KindInfo, PlanCtx, RunCtx, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::optional("label", Ty::Str, "the model's name in the report (default: the answers' input name)"),
    OptionSpec::optional(
        "key",
        Ty::File,
        "answer key, CSV or JSONL: qkey (or subset, category, id), answer, optional type (knowledge / reasoning)",
    ),
    OptionSpec::default("format", Ty::File, DEFAULT_FORMAT, "language file: subsets and categories in table order"),
    OptionSpec::default(
        "pred_column",
        Ty::Str,
        "\"pred\"",
        "column of the answers with the predicted letter (null: none)",
    ),
];

pub static KIND: KindInfo = KindInfo {
    name: "roleeval_score",
    about: "RoleEval accuracy per subset and category (Tables 3-6 layout), knowledge vs reasoning, unanswered rate, submission file",
    arity: Arity::Exactly(2),
    options: OPTIONS,
    summary: true,
    example: "",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    label: Option<String>,
    key: Option<String>,
    format: String,
    pred_column: String,
}

struct Score {
    opts: Options,
    format: Format,
    files: Vec<PathBuf>,
    key: Option<PathBuf>,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    let file = ctx.root.join(&opts.format);
    let format = super::read_format(ctx, diags, &opts.format)?;
    let key = opts.key.as_ref().map(|k| ctx.root.join(k));
    let mut files = vec![file];
    files.extend(key.clone());
    Some(Box::new(Score { opts, format, files, key }))
}

/// A key entry: the gold letter and the question type, if given.
#[derive(Debug, Clone, PartialEq)]
pub struct Gold {
    pub answer: String,
    pub qtype: Option<String>,
}

/// Read an answer key (CSV with a header, or JSONL). Every problem is an error naming `file:line`.
pub fn read_key(path: &Path, choices: &[String]) -> Result<BTreeMap<String, Gold>, String> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| format!("{name}: {e}"))?;
    let jsonl = name.ends_with(".jsonl") || name.ends_with(".json");
    let mut records: Vec<(u64, BTreeMap<String, String>)> = Vec::new();
    if jsonl {
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let v: serde_json::Map<String, Value> =
                serde_json::from_str(line).map_err(|e| format!("{name}:{}: not a JSON object: {e}", i + 1))?;
            let fields = v
                .into_iter()
                .map(|(k, v)| (k, v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string())))
                .collect();
            records.push((i as u64 + 1, fields));
        }
    } else {
        let mut csv = csv::ReaderBuilder::new().from_reader(text.as_bytes());
        let header = csv.headers().map_err(|e| format!("{name}:1: {e}"))?.clone();
        for r in csv.records() {
            let r = r.map_err(|e| format!("{name}:{}: {e}", e.position().map(|p| p.line()).unwrap_or(0)))?;
            let line = r.position().map(|p| p.line()).unwrap_or(0);
            records.push((line, header.iter().zip(r.iter()).map(|(h, v)| (h.to_string(), v.to_string())).collect()));
        }
    }
    let mut out: BTreeMap<String, Gold> = BTreeMap::new();
    let mut first: HashMap<String, u64> = HashMap::new();
    for (line, f) in records {
        let at = format!("{name}:{line}");
        let qkey = match f.get("qkey") {
            Some(k) => k.clone(),
            None => match (f.get("subset"), f.get("category"), f.get("id")) {
                (Some(s), Some(c), Some(i)) => format!("{s}/{c}/{i}"),
                _ => return Err(format!("{at}: needs \"qkey\" or \"subset\", \"category\" and \"id\"")),
            },
        };
        let answer = f.get("answer").ok_or_else(|| format!("{at}: no \"answer\""))?.trim().to_string();
        if !choices.contains(&answer) {
            return Err(format!("{at}: answer \"{answer}\" of {qkey} is not one of {}", choices.join("/")));
        }
        if let Some(prev) = first.insert(qkey.clone(), line) {
            return Err(format!("{at}: duplicate key \"{qkey}\" (first at line {prev})"));
        }
        let qtype = f.get("type").map(|t| t.trim().to_string()).filter(|t| !t.is_empty());
        out.insert(qkey, Gold { answer, qtype });
    }
    if out.is_empty() {
        return Err(format!("{name}: the key has no entries"));
    }
    Ok(out)
}

fn output_schema() -> SchemaRef {
    let s = |n: &str| Field::new(n, DataType::Utf8, false);
    let o = |n: &str| Field::new(n, DataType::Utf8, true);
    data::schema_with_id([
        s("qkey"),
        s("subset"),
        s("category"),
        s("code"),
        Field::new("shots", DataType::Int64, false),
        o("pred"),
        o("gold"),
        o("qtype"),
        Field::new("correct", DataType::Boolean, true),
        Field::new("answered", DataType::Boolean, false),
    ])
}

/// The paper's table for a language and shot setting.
fn paper_table(lang: &str, shots: i64) -> Option<u32> {
    match (lang, shots) {
        ("zh", 5) => Some(3),
        ("en", 5) => Some(4),
        ("zh", 0) => Some(5),
        ("en", 0) => Some(6),
        _ => None,
    }
}

fn setting(shots: i64) -> String {
    match shots {
        0 => "zero-shot".into(),
        5 => "five-shot".into(),
        k => format!("{k}-shot"),
    }
}

fn text(row: &Row, col: &str) -> Option<String> {
    row.get(col).and_then(Value::as_str).map(str::to_string)
}

#[async_trait]
impl Stage for Score {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        ctx.require_columns("inputs", 0, ["qkey", "subset", "category", "code", "qid", "shots", "answer"]);
        ctx.require_columns("pred_column", 1, [self.opts.pred_column.as_str()]);
        ctx.files.extend(self.files.iter().cloned());
        Some(output_schema())
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let key = match &self.key {
            Some(p) => Some(read_key(p, &self.format.choices).map_err(|e| anyhow!(e))?),
            None => None,
        };
        // Answers by prompt id.
        let mut answers: HashMap<String, Option<String>> = HashMap::new();
        let (_, batches) = synth_core::store::parquet::read_all(&ctx.inputs[1].path)?;
        for b in &batches {
            for i in 0..b.num_rows() {
                let r = data::row_json(b, i);
                let id = text(&r, data::ID).unwrap_or_default();
                answers.insert(id, text(&r, &self.opts.pred_column));
            }
        }
        let schema = output_schema();
        let mut out = ctx.create_output_keeping_ids(schema.clone())?;
        let mut cells: BTreeMap<(i64, String, String), Tally> = BTreeMap::new();
        let mut types: BTreeMap<(i64, String, String), Tally> = BTreeMap::new();
        // Per setting: prompts, prompts without a usable letter.
        let mut unanswered: BTreeMap<i64, (u64, u64)> = BTreeMap::new();
        // Per setting: prompts, prompts whose options repeat a text (ambiguous; spec P9).
        let mut duplicates: BTreeMap<i64, (u64, u64)> = BTreeMap::new();
        let mut submission: BTreeMap<i64, serde_json::Map<String, Value>> = BTreeMap::new();
        let mut n_in = 0u64;
        let (_, prompts) = synth_core::store::parquet::read_all(&ctx.inputs[0].path)?;
        for b in &prompts {
            let mut rows = Vec::with_capacity(b.num_rows());
            for i in 0..b.num_rows() {
                n_in += 1;
                let r = data::row_json(b, i);
                let id = text(&r, data::ID).unwrap_or_default();
                let qkey = text(&r, "qkey").unwrap_or_default();
                let (subset, category, code) = (
                    text(&r, "subset").unwrap_or_default(),
                    text(&r, "category").unwrap_or_default(),
                    text(&r, "code").unwrap_or_default(),
                );
                let shots = r.get("shots").and_then(Value::as_i64).unwrap_or_default();
                let got = answers.get(&id);
                let pred = got.cloned().flatten();
                let (gold, qtype) = match key.as_ref().and_then(|k| k.get(&qkey)) {
                    Some(g) => (Some(g.answer.clone()), g.qtype.clone()),
                    None => (text(&r, "answer"), None),
                };
                let correct = gold.as_ref().map(|g| pred.as_ref() == Some(g));
                let u = unanswered.entry(shots).or_default();
                u.0 += 1;
                u.1 += u64::from(pred.is_none());
                let d = duplicates.entry(shots).or_default();
                d.0 += 1;
                d.1 += u64::from(r.get("duplicate_options").and_then(Value::as_bool).unwrap_or(false));
                if let Some(c) = correct {
                    cells.entry((shots, subset.clone(), code.clone())).or_default().add(c, pred.is_some());
                    if let Some(t) = &qtype {
                        types.entry((shots, subset.clone(), t.clone())).or_default().add(c, pred.is_some());
                    }
                }
                let file = submission.entry(shots).or_default();
                let per_file =
                    file.entry(format!("{subset}/{category}")).or_insert_with(|| Value::Object(Default::default()));
                per_file.as_object_mut().expect("object").insert(
                    text(&r, "qid").unwrap_or_default(),
                    pred.clone().map(Value::String).unwrap_or(Value::Null),
                );
                let mut row = Row::new();
                row.insert(data::ID.into(), json!(id));
                row.insert("qkey".into(), json!(qkey));
                row.insert("subset".into(), json!(subset));
                row.insert("category".into(), json!(category));
                row.insert("code".into(), json!(code));
                row.insert("shots".into(), json!(shots));
                row.insert("pred".into(), pred.map(Value::String).unwrap_or(Value::Null));
                row.insert("gold".into(), gold.map(Value::String).unwrap_or(Value::Null));
                row.insert("qtype".into(), qtype.map(Value::String).unwrap_or(Value::Null));
                row.insert("correct".into(), correct.map(Value::Bool).unwrap_or(Value::Null));
                row.insert("answered".into(), json!(got.is_some()));
                rows.push(row);
            }
            out.write(&data::rows_to_batch(&schema, &rows).map_err(|(i, e)| anyhow!("row {i}: {e}"))?)?;
        }
        ctx.report.rows_in = n_in;

        let label = self.opts.label.clone().unwrap_or_else(|| ctx.inputs[1].name.clone());
        let rows = self.summary(&label, &cells, &types, &unanswered, &duplicates);
        ctx.write_side_parquet(&summary::file_name(&ctx.name), &summary::to_batch(&rows)?)?;

        let doc: serde_json::Map<String, Value> =
            submission.into_iter().rev().map(|(k, v)| (format!("{k}shot"), Value::Object(v))).collect();
        let (mut f, pending) = create_tmp(&ctx.out_dir.join(format!("{}.submission.json", ctx.name)))?;
        std::io::Write::write_all(&mut f, serde_json::to_string_pretty(&doc)?.as_bytes())?;
        std::io::Write::write_all(&mut f, b"\n")?;
        finish_file(f, &pending)?;
        ctx.add_artifact(pending, None);
        ctx.set_output(out)
    }
}

impl Score {
    /// The summary rows: per shot setting (five-shot first, as the paper's tables) the
    /// subsets × categories + Avg; knowledge vs reasoning; the unanswered rate.
    fn summary(
        &self,
        label: &str,
        cells: &BTreeMap<(i64, String, String), Tally>,
        types: &BTreeMap<(i64, String, String), Tally>,
        unanswered: &BTreeMap<i64, (u64, u64)>,
        duplicates: &BTreeMap<i64, (u64, u64)>,
    ) -> Vec<SummaryRow> {
        let lang = &self.format.lang;
        let row =
            |table: String, title: String, metric: String, heading: String, value: f64, (n, invalid): (u64, u64)| {
                SummaryRow {
                    label: label.to_string(),
                    table,
                    title,
                    group: OVERALL.to_string(),
                    metric,
                    heading,
                    n,
                    value,
                    std: None,
                    invalid,
                }
            };
        let mut out = Vec::new();
        for &shots in unanswered.keys().rev() {
            let table = format!("{lang}_{shots}shot");
            let title = match paper_table(lang, shots) {
                Some(n) => format!("RoleEval ({lang}), {}: accuracy (%), Table {n} layout", setting(shots)),
                None => format!("RoleEval ({lang}), {}: accuracy (%)", setting(shots)),
            };
            for subset in &self.format.subsets {
                let mut present = Vec::new();
                for cat in &self.format.categories {
                    if let Some(t) = cells.get(&(shots, subset.stem.clone(), cat.code.clone()))
                        && let Some(p) = t.pct()
                    {
                        present.push(*t);
                        out.push(row(
                            table.clone(),
                            title.clone(),
                            format!("{}_{}", subset.stem, cat.code),
                            format!("{} {}", subset.heading, cat.code),
                            p,
                            (t.n, t.unanswered),
                        ));
                    }
                }
                if let Some((avg, total)) = average(&present) {
                    out.push(row(
                        table.clone(),
                        title.clone(),
                        format!("{}_avg", subset.stem),
                        format!("{} Avg", subset.heading),
                        avg,
                        (total.n, total.unanswered),
                    ));
                }
            }
        }
        let type_names: Vec<String> = {
            let mut v: Vec<String> = types.keys().map(|(_, _, t)| t.clone()).collect();
            v.sort();
            v.dedup();
            v
        };
        for &shots in unanswered.keys().rev() {
            for subset in &self.format.subsets {
                for t in &type_names {
                    if let Some(tally) = types.get(&(shots, subset.stem.clone(), t.clone()))
                        && let Some(p) = tally.pct()
                    {
                        out.push(row(
                            format!("{lang}_types"),
                            format!("RoleEval ({lang}), knowledge vs reasoning: accuracy (%), Tables 7-8 layout"),
                            format!("{}_{shots}shot_{t}", subset.stem),
                            format!("{} {} {t}", subset.heading, setting(shots)),
                            p,
                            (tally.n, tally.unanswered),
                        ));
                    }
                }
            }
        }
        for (&shots, &(n, none)) in unanswered.iter().rev() {
            out.push(row(
                format!("{lang}_unanswered"),
                format!("RoleEval ({lang}): answers without a usable letter (%)"),
                format!("{shots}shot_unanswered"),
                setting(shots),
                if n == 0 { 0.0 } else { accuracy_pct(none, n) },
                (n, 0),
            ));
        }
        // Kept as released, but flagged: a question whose options repeat a text.
        for (&shots, &(n, dup)) in duplicates.iter().rev() {
            out.push(row(
                format!("{lang}_duplicate_options"),
                format!("RoleEval ({lang}): questions whose options repeat a text (%; ambiguous, kept as released)"),
                format!("{shots}shot_duplicate_options"),
                setting(shots),
                if n == 0 { 0.0 } else { accuracy_pct(dup, n) },
                (n, dup),
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_files_are_checked_line_by_line() {
        let dir = tempfile::tempdir().unwrap();
        let choices: Vec<String> = ["A", "B", "C", "D"].iter().map(|s| s.to_string()).collect();
        let write = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let ok = write("k.csv", "qkey,answer,type\nglobal/games/0,A,knowledge\nglobal/games/1, B ,\n");
        let k = read_key(&ok, &choices).unwrap();
        assert_eq!(k["global/games/0"], Gold { answer: "A".into(), qtype: Some("knowledge".into()) });
        assert_eq!(k["global/games/1"], Gold { answer: "B".into(), qtype: None });
        let parts = write("p.jsonl", "{\"subset\":\"chinese\",\"category\":\"fiction\",\"id\":3,\"answer\":\"D\"}\n");
        assert_eq!(read_key(&parts, &choices).unwrap()["chinese/fiction/3"].answer, "D");
        let e = |text: &str| read_key(&write("bad.csv", text), &choices).unwrap_err();
        assert!(e("qkey,answer\nx/y/0,E\n").ends_with("bad.csv:2: answer \"E\" of x/y/0 is not one of A/B/C/D"));
        assert!(e("qkey,answer\nx/y/0,A\nx/y/0,B\n").ends_with("bad.csv:3: duplicate key \"x/y/0\" (first at line 2)"));
        assert!(e("qkey,gold\nx/y/0,A\n").ends_with("bad.csv:2: no \"answer\""));
        assert!(e("answer\nA\n").contains("needs \"qkey\""));
        assert!(e("qkey,answer\n").contains("no entries"));
    }
}
