//! `synth score`: score any file of (response, reference) pairs — JSONL or Parquet —
//! with the same code as the `metrics` stage, write per-sample scores (Parquet or
//! JSONL by the extension of `--out`) and print a one-line JSON summary.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use rayon::prelude::*;
use serde_json::{Value, json};
use synth_core::data::arrow::array::{ArrayRef, Float64Array, RecordBatch, StringArray};
use synth_core::data::arrow::datatypes::{DataType, Field};

use super::args::ScoreArgs;
use super::common::{EXIT_OK, EXIT_RUNTIME};
use synth_core::data;
use synth_core::store::atomic::{create_tmp, finish_file};
use synth_core::store::failures::{Failure, FailureKind, write_failures};
use synth_core::store::parquet::{ParquetOut, read_all};
use synth_eval::bertscore::BertScoreConfig;
use synth_eval::rouge::RougeTarget;
use synth_eval::score::{OVERALL, Scorer, per_sample, summarize};

pub fn run(args: &ScoreArgs) -> i32 {
    match score(args) {
        Ok(summary) => {
            println!("{summary}");
            EXIT_OK
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            EXIT_RUNTIME
        }
    }
}

/// One input row: (id, response, reference, group).
type Pair = (String, String, String, String);

fn text(row: &serde_json::Map<String, Value>, field: &str, what: &str) -> Result<String, String> {
    match row.get(field) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Null) => Ok(String::new()),
        None => Err(format!("no field \"{field}\" ({what})")),
        Some(other) => Err(format!("field \"{field}\" is not a string: {other}")),
    }
}

fn pair(row: &serde_json::Map<String, Value>, n: usize, args: &ScoreArgs) -> Result<Pair, String> {
    let id = row_id(row, n);
    let group = match &args.group_by {
        Some(g) => text(row, g, "--group-by")?,
        None => String::new(),
    };
    Ok((
        id,
        text(row, &args.response_field, "--response-field")?,
        text(row, &args.reference_field, "--reference-field")?,
        group,
    ))
}

/// The file's pairs, and the rows that could not be read as one (each with its file:line
/// or row, and its reason). With `--strict` the first bad row is an error instead.
fn read_pairs(args: &ScoreArgs) -> Result<(Vec<Pair>, Vec<Failure>)> {
    let path = &args.input;
    let mut out = Vec::new();
    let mut failed = Vec::new();
    let mut bad = |id: String, kind: FailureKind, message: String, record: Option<String>| -> Result<()> {
        if args.strict {
            bail!("{message}");
        }
        failed.push(Failure::new(id, kind, message, record));
        Ok(())
    };
    if path.extension().is_some_and(|e| e == "parquet") {
        let (schema, batches) = read_all(path)?;
        // A missing column is the file's problem, not one row's.
        let wanted = [Some(&args.response_field), Some(&args.reference_field), args.group_by.as_ref()];
        for field in wanted.into_iter().flatten() {
            if schema.field_with_name(field).is_err() {
                bail!("{}: no column \"{field}\" (columns: {})", path.display(), data::column_list(&schema));
            }
        }
        let mut n = 0;
        for b in &batches {
            for i in 0..b.num_rows() {
                n += 1;
                let row = data::row_json(b, i);
                match pair(&row, n, args) {
                    Ok(p) => out.push(p),
                    Err(e) => bad(
                        row_id(&row, n),
                        FailureKind::Schema,
                        format!("{}: row {n}: {e}", path.display()),
                        Some(Value::Object(row).to_string()),
                    )?,
                }
            }
        }
    } else {
        let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let mut reader = BufReader::new(f);
        let mut buf = Vec::new();
        let mut n = 0;
        loop {
            buf.clear();
            if reader.read_until(b'\n', &mut buf).with_context(|| format!("reading {}", path.display()))? == 0 {
                break;
            }
            n += 1;
            let at = format!("{}:{n}", path.display());
            let Ok(line) = std::str::from_utf8(&buf) else {
                bad(format!("line-{n}"), FailureKind::Parse, format!("{at}: not UTF-8 text"), None)?;
                continue;
            };
            if line.trim().is_empty() {
                continue;
            }
            let record = Some(line.trim_end().to_string());
            match serde_json::from_str::<serde_json::Map<String, Value>>(line) {
                Ok(row) => match pair(&row, n, args) {
                    Ok(p) => out.push(p),
                    Err(e) => bad(row_id(&row, n), FailureKind::Schema, format!("{at}: {e}"), record)?,
                },
                Err(e) => {
                    bad(format!("line-{n}"), FailureKind::Parse, format!("{at}: not a JSON object: {e}"), record)?
                }
            }
        }
    }
    Ok((out, failed))
}

/// A row's id: its `id` field, else `row-N` (N: its line or row number).
fn row_id(row: &serde_json::Map<String, Value>, n: usize) -> String {
    match row.get("id") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(x)) => x.to_string(),
        _ => format!("row-{n}"),
    }
}

/// Where the rows that could not be scored go: `<out>` with `.failures.parquet` for its
/// extension.
pub fn failures_path(out: &Path) -> std::path::PathBuf {
    let stem = out.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "scores".into());
    out.with_file_name(format!("{stem}.failures.parquet"))
}

pub fn score(args: &ScoreArgs) -> Result<Value> {
    let default = if args.bertscore_model.is_some() { "bleu,rouge,meteor,bertscore" } else { "bleu,rouge,meteor" };
    let metrics: Vec<String> = args
        .metrics
        .as_deref()
        .unwrap_or(default)
        .split(',')
        .map(|m| m.trim().to_string())
        .filter(|m| !m.is_empty())
        .collect();
    let bert = args.bertscore_model.as_ref().map(|dir| {
        let mut cfg = BertScoreConfig::new(dir);
        cfg.output = args.bertscore_output.clone();
        cfg.sessions = args.bertscore_sessions.map(usize::from);
        cfg.pair_batch = args.bertscore_pair_batch as usize;
        cfg
    });
    let target = RougeTarget::parse(&args.rouge_target).unwrap_or_default();
    let mut scorer = Scorer::new(&metrics, &args.wordnet_dir, bert.as_ref())?.with_rouge_target(target);
    if let Some(dir) = &args.punkt_dir {
        scorer = scorer.with_punkt(dir)?;
    }
    let (pairs, failed) = read_pairs(args)?;
    let fpath = failures_path(&args.out);
    let n_failed = failed.len();
    if let Some(first) = failed.first() {
        eprintln!(
            "warning: {n_failed} row(s) of {} could not be scored (first: {}); all are in {}",
            args.input.display(),
            first.message,
            fpath.display()
        );
        write_failures(&fpath, failed, Vec::new())?.commit()?;
    } else if fpath.exists() {
        // A failures file from an earlier run of the same output no longer applies.
        std::fs::remove_file(&fpath).with_context(|| format!("removing the stale {}", fpath.display()))?;
    }
    if pairs.is_empty() {
        match n_failed {
            0 => bail!("{}: no rows", args.input.display()),
            n => bail!("{}: none of its {n} rows could be scored (see {})", args.input.display(), fpath.display()),
        }
    }
    let columns = scorer.columns();
    let texts: Vec<(&str, &str)> = pairs.iter().map(|(_, r, f, _)| (r.as_str(), f.as_str())).collect();
    // String metrics first: they run while the BERTScore encoder loads.
    let mut scores: Vec<Vec<f64>> = texts.par_iter().map(|(r, f)| scorer.score(r, f)).collect();
    if let Some(bert) = scorer.bertscore_f1(&texts)? {
        scores.iter_mut().zip(bert).for_each(|(s, b)| s.push(b));
    }
    write_scores(&args.out, &columns, &pairs, &scores, args.group_by.as_deref())?;
    let groups: Vec<String> = pairs.iter().map(|p| p.3.clone()).collect();
    let mut sizes: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for g in &groups {
        *sizes.entry(g.as_str()).or_default() += 1;
    }
    let mut summary = serde_json::Map::new();
    for s in summarize(&columns, &groups, &scores) {
        // The group's rows; each metric's own n leaves out its undefined scores.
        let rows = if s.group == OVERALL { groups.len() } else { sizes.get(s.group.as_str()).copied().unwrap_or(0) };
        let entry = summary.entry(s.group.clone()).or_insert_with(|| json!({"n": rows}));
        entry[s.metric.as_str()] = json!({"mean": s.mean, "std": s.std, "n": s.n});
    }
    if args.group_by.is_none() {
        summary = summary.into_iter().filter(|(g, _)| g == OVERALL).collect();
    }
    let mut line =
        json!({"input": args.input.display().to_string(), "out": args.out.display().to_string(), "rows": pairs.len()});
    if n_failed > 0 {
        line["failed"] = json!(n_failed);
        line["failures"] = json!(fpath.display().to_string());
    }
    line["summary"] = Value::Object(summary);
    Ok(line)
}

fn write_scores(out: &Path, columns: &[&str], pairs: &[Pair], scores: &[Vec<f64>], group: Option<&str>) -> Result<()> {
    if out.extension().is_some_and(|e| e == "parquet") {
        let mut fields = Vec::new();
        if let Some(g) = group {
            fields.push(Field::new(g, DataType::Utf8, false));
        }
        fields.extend(columns.iter().map(|c| Field::new(*c, DataType::Float64, false)));
        let schema = data::schema_with_id(fields);
        let mut arrays: Vec<ArrayRef> =
            vec![Arc::new(StringArray::from_iter_values(pairs.iter().map(|p| p.0.as_str())))];
        if group.is_some() {
            arrays.push(Arc::new(StringArray::from_iter_values(pairs.iter().map(|p| p.3.as_str()))));
        }
        for k in 0..columns.len() {
            arrays.push(Arc::new(Float64Array::from_iter_values(scores.iter().map(|s| per_sample(s[k])))));
        }
        let mut w = ParquetOut::create(out, schema.clone(), Vec::new(), true)?;
        w.write(&RecordBatch::try_new(schema, arrays)?)?;
        let (pending, _) = w.finish()?;
        pending.commit()?;
    } else {
        let (mut file, pending) = create_tmp(out)?;
        for (p, s) in pairs.iter().zip(scores) {
            let mut row = serde_json::Map::new();
            row.insert("id".into(), json!(p.0));
            if let Some(g) = group {
                row.insert(g.into(), json!(p.3));
            }
            for (c, v) in columns.iter().zip(s) {
                row.insert((*c).into(), json!(per_sample(*v)));
            }
            writeln!(file, "{}", Value::Object(row))?;
        }
        finish_file(file, &pending)?;
        pending.commit()?;
    }
    Ok(())
}
