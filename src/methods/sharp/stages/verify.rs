//! `sharp_verify`: the human check of the claims (spec §2 `sh_claim_verify`: the paper
//! checked every claim's factuality — each counterfactual really false — and each
//! translation by hand). It writes `<stage>.review.tsv`, every claim with the columns a
//! reviewer needs and its current verdict, and imports a verdict file of the same layout
//! (`verdicts`, tab- or comma-separated with a header: `id`, `verdict` = ok / reject / fix,
//! the corrected text in a claim column for `fix`, optional `note`).
//!
//! Output: the claims marked ok or fixed (`verified` true; a fix replaces the texts it
//! gives), and as `unreviewed` says those without a verdict (`verified` null). Rejected
//! claims are left out and counted. A verdict line that cannot be used (unknown verdict, a
//! `fix` without a text, an id that is no claim, a repeated id) is a failure row naming
//! `file:line`, with the claim it names: nothing is lost silently.

use std::collections::HashMap;
use std::io::Write as _;

use anyhow::{Context, Result, anyhow, bail};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use synth_core::data::arrow::datatypes::{DataType, Field, SchemaRef};

use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data::{self, Row};
use synth_core::store::atomic::{create_tmp, finish_file};
use synth_core::store::failures::FailureKind;
use synth_engine::stages::{BuildCtx, KindInfo, PlanCtx, RunCtx, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::optional("verdicts", Ty::File, "the reviewers' verdicts (the review sheet's layout, filled in)"),
    OptionSpec::default(
        "unreviewed",
        Ty::Enum(&["keep", "drop", "fail"]),
        "\"keep\"",
        "claims without a verdict: kept (verified null), left out (counted), or failure rows",
    ),
    OptionSpec::default(
        "columns",
        Ty::StrList,
        "[\"claim\"]",
        "claim text columns shown on the sheet; a fix may replace them",
    ),
    OptionSpec::default(
        "context",
        Ty::StrList,
        "[\"label\", \"cf_rule\", \"cf_detail\", \"factual_claim\"]",
        "further columns shown on the sheet (those the input has)",
    ),
];

pub static KIND: KindInfo = KindInfo {
    name: "sharp_verify",
    about: "the human check of claims: writes a review sheet, imports verdicts (ok / reject / fix with the corrected text)",
    options: OPTIONS,
    example: "",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    verdicts: Option<String>,
    unreviewed: String,
    columns: Vec<String>,
    context: Vec<String>,
}

struct VerifyStage {
    o: Options,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    Some(Box::new(VerifyStage { o: ctx.parse(diags)? }))
}

/// One verdict line.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub line: usize,
    pub verdict: String,
    pub texts: Vec<(String, String)>,
    pub note: Option<String>,
}

/// The usable verdicts by claim id, and the bad lines as `(id, "file:line: reason")`.
pub type Verdicts = (HashMap<String, Verdict>, Vec<(String, String)>);

/// Reads a verdict file: `id → verdict`; a bad line is `(id or "", "file:line: reason")`.
pub fn read_verdicts(text: &str, file: &str, columns: &[String]) -> Result<Verdicts> {
    let tab = file.ends_with(".tsv") || text.lines().next().is_some_and(|l| l.contains('\t'));
    let mut reader = csv::ReaderBuilder::new()
        .delimiter(if tab { b'\t' } else { b',' })
        .quoting(!tab)
        .flexible(true)
        .from_reader(text.as_bytes());
    let header: Vec<String> = reader
        .headers()
        .with_context(|| format!("{file}:1: no header"))?
        .iter()
        .map(|h| h.trim().to_string())
        .collect();
    let col = |n: &str| header.iter().position(|h| h == n);
    let (Some(id_at), Some(verdict_at)) = (col("id"), col("verdict")) else {
        bail!("{file}:1: the header needs the columns id and verdict (has: {})", header.join(", "));
    };
    let text_cols: Vec<(usize, String)> = columns.iter().filter_map(|c| col(c).map(|i| (i, c.clone()))).collect();
    let note_at = col("note");
    let mut out: HashMap<String, Verdict> = HashMap::new();
    let mut bad = Vec::new();
    for rec in reader.records() {
        let rec = rec.with_context(|| format!("reading {file}"))?;
        let line = rec.position().map_or(0, |p| p.line() as usize);
        let get = |i: usize| rec.get(i).map(str::trim).unwrap_or_default();
        let id = get(id_at).to_string();
        let verdict = get(verdict_at).to_ascii_lowercase();
        if id.is_empty() && verdict.is_empty() {
            continue;
        }
        let at = format!("{file}:{line}");
        if verdict.is_empty() {
            continue; // not reviewed yet
        }
        if !["ok", "reject", "fix"].contains(&verdict.as_str()) {
            bad.push((id, format!("{at}: unknown verdict \"{verdict}\" (ok, reject, fix)")));
            continue;
        }
        let texts: Vec<(String, String)> = text_cols
            .iter()
            .filter(|(i, _)| !get(*i).is_empty())
            .map(|(i, c)| (c.clone(), get(*i).to_string()))
            .collect();
        if verdict == "fix" && texts.is_empty() {
            bad.push((id, format!("{at}: a fix needs the corrected text in {}", columns.join(" or "))));
            continue;
        }
        let note = note_at.map(get).filter(|s| !s.is_empty()).map(str::to_string);
        if let Some(prev) = out.get(&id) {
            bad.push((id.clone(), format!("{at}: \"{id}\" has a verdict already (line {})", prev.line)));
            continue;
        }
        out.insert(id, Verdict { line, verdict, texts, note });
    }
    Ok((out, bad))
}

fn tsv_cell(v: Option<&Value>) -> String {
    let t = match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    };
    t.replace(['\t', '\n', '\r'], " ")
}

#[async_trait]
impl Stage for VerifyStage {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        let cols: Vec<&str> = self.o.columns.iter().map(String::as_str).collect();
        ctx.require_columns("columns", 0, cols);
        if let Some(v) = &self.o.verdicts {
            ctx.files.push(ctx.root.join(v));
        }
        let input = ctx.input_schema(0)?;
        if input.field_with_name("verified").is_ok() {
            ctx.error("inputs", "the input has a column \"verified\" already");
        }
        Some(data::schema_with_id(input.fields().iter().skip(1).map(|f| f.as_ref().clone()).chain([
            Field::new("verified", DataType::Boolean, true),
            Field::new("verdict_note", DataType::Utf8, true),
        ])))
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let (schema_in, batches) = synth_core::store::parquet::read_all(&ctx.inputs[0].path)?;
        let claims: Vec<Row> =
            batches.iter().flat_map(|b| (0..b.num_rows()).map(move |i| data::row_json(b, i))).collect();
        let (verdicts, bad) = match &self.o.verdicts {
            Some(f) => {
                let text = std::fs::read_to_string(ctx.root.join(f)).with_context(|| format!("reading {f}"))?;
                read_verdicts(&text, f, &self.o.columns)?
            }
            None => Default::default(),
        };
        let ids: HashMap<&str, usize> = claims
            .iter()
            .enumerate()
            .map(|(i, r)| (r.get(data::ID).and_then(Value::as_str).unwrap_or_default(), i))
            .collect();
        let mut failed: Vec<bool> = vec![false; claims.len()];
        for (id, why) in &bad {
            match ids.get(id.as_str()) {
                Some(&i) => {
                    failed[i] = true;
                    ctx.fail(id, FailureKind::Input, why.clone(), Some(Value::Object(claims[i].clone()).to_string()));
                }
                None => ctx.fail(why.split(": ").next().unwrap_or(why), FailureKind::Input, why.clone(), None),
            }
        }
        for (id, v) in &verdicts {
            if !ids.contains_key(id.as_str()) {
                let at = format!("{}:{}", self.o.verdicts.as_deref().unwrap_or_default(), v.line);
                ctx.fail(
                    &at,
                    FailureKind::Input,
                    format!("{at}: \"{id}\" is not a claim of input \"{}\"", ctx.inputs[0].name),
                    None,
                );
            }
        }
        // The review sheet: every claim with its current verdict.
        let context: Vec<&String> = self.o.context.iter().filter(|c| schema_in.field_with_name(c).is_ok()).collect();
        let mut sheet = String::new();
        let header: Vec<&str> = ["id", "verdict"]
            .into_iter()
            .chain(self.o.columns.iter().map(String::as_str))
            .chain(context.iter().map(|c| c.as_str()))
            .chain(["note"])
            .collect();
        sheet.push_str(&header.join("\t"));
        sheet.push('\n');
        let (mut kept, mut rejected, mut unreviewed, mut fixed) = (Vec::new(), 0u64, 0u64, 0u64);
        for (i, claim) in claims.iter().enumerate() {
            let id = claim.get(data::ID).and_then(Value::as_str).unwrap_or_default();
            let v = verdicts.get(id);
            let mut cells = vec![id.to_string(), v.map(|v| v.verdict.clone()).unwrap_or_default()];
            cells.extend(self.o.columns.iter().chain(context.iter().copied()).map(|c| tsv_cell(claim.get(c))));
            cells.push(v.and_then(|v| v.note.clone()).unwrap_or_default().replace(['\t', '\n'], " "));
            sheet.push_str(&cells.join("\t"));
            sheet.push('\n');
            if failed[i] {
                continue;
            }
            let mut row = claim.clone();
            match v.map(|v| v.verdict.as_str()) {
                Some("reject") => {
                    rejected += 1;
                    continue;
                }
                Some(verdict) => {
                    let v = v.expect("a verdict");
                    if verdict == "fix" {
                        fixed += 1;
                        for (c, t) in &v.texts {
                            row.insert(c.clone(), json!(t));
                        }
                    }
                    row.insert("verified".into(), json!(true));
                    row.insert("verdict_note".into(), v.note.clone().map(Value::String).unwrap_or(Value::Null));
                }
                None => {
                    unreviewed += 1;
                    match self.o.unreviewed.as_str() {
                        "drop" => continue,
                        "fail" => {
                            ctx.fail(
                                id,
                                FailureKind::Input,
                                format!("{id}: not reviewed (no verdict)"),
                                Some(Value::Object(claim.clone()).to_string()),
                            );
                            continue;
                        }
                        _ => {
                            row.insert("verified".into(), Value::Null);
                            row.insert("verdict_note".into(), Value::Null);
                        }
                    }
                }
            }
            kept.push(row);
        }
        let (mut f, pending) = create_tmp(&ctx.out_dir.join(format!("{}.review.tsv", ctx.name)))?;
        f.write_all(sheet.as_bytes())?;
        finish_file(f, &pending)?;
        ctx.add_artifact(pending, Some(claims.len() as u64));
        let m = &mut ctx.report.metrics;
        m.insert("rejected".into(), rejected as f64);
        m.insert("fixed".into(), fixed as f64);
        m.insert("unreviewed".into(), unreviewed as f64);
        ctx.report.rows_in = claims.len() as u64;
        let schema = data::schema_with_id(schema_in.fields().iter().skip(1).map(|f| f.as_ref().clone()).chain([
            Field::new("verified", DataType::Boolean, true),
            Field::new("verdict_note", DataType::Utf8, true),
        ]));
        let mut out = ctx.create_output_keeping_ids(schema.clone())?;
        for chunk in kept.chunks(1024) {
            out.write(&data::rows_to_batch(&schema, chunk).map_err(|(i, e)| anyhow!("row {i}: {e}"))?)?;
        }
        crate::record_choices(ctx, KIND.name, &Map::new())?;
        ctx.set_output(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_read_or_name_the_line() {
        let cols = vec!["claim".to_string()];
        let text = "id\tverdict\tclaim\tnote\na\tok\t\t\nb\tReject\t\tnot false\nc\tfix\tfire is cold\t\nd\tfix\t\t\ne\tokay\t\t\nf\t\t\t\na\tok\t\t\n";
        let (v, bad) = read_verdicts(text, "v.tsv", &cols).unwrap();
        assert_eq!(v["b"].verdict, "reject");
        assert_eq!(v["b"].note.as_deref(), Some("not false"));
        assert_eq!(v["c"].texts, vec![("claim".to_string(), "fire is cold".to_string())]);
        assert!(!v.contains_key("f"), "no verdict yet");
        let msgs: Vec<&str> = bad.iter().map(|b| b.1.as_str()).collect();
        assert_eq!(msgs.len(), 3, "{msgs:?}");
        assert!(msgs[0].starts_with("v.tsv:5: a fix needs the corrected text"), "{}", msgs[0]);
        assert!(msgs[1].starts_with("v.tsv:6: unknown verdict \"okay\""), "{}", msgs[1]);
        assert!(msgs[2].starts_with("v.tsv:8: \"a\" has a verdict already (line 2)"), "{}", msgs[2]);
        assert!(
            read_verdicts("id,claim\na,b\n", "v.csv", &cols)
                .unwrap_err()
                .to_string()
                .contains("needs the columns id and verdict")
        );
        let (v, _) = read_verdicts("id,verdict,claim\n\"x\",fix,\"a, b\"\n", "v.csv", &cols).unwrap();
        assert_eq!(v["x"].texts[0].1, "a, b");
    }
}
