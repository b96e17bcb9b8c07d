//! `roleeval_export`: questions as a release in RoleEval's layout,
//! `<dir>/<lang>/<subset>/<split>/<category>_<split>.csv` (header `id,question,A,B,C,D`,
//! and `answer` in dev; ids restart at 0 in every file, input order), `<dir>/key.csv`
//! (qkey, answer, type: the test key the public release withholds) and
//! `<dir>/README.md`, a card with the counts. The split is by character: the
//! characters in `dev_characters` go to dev (the paper's dev exemplars are about
//! characters outside the test set), every other one to test. A question whose
//! category or subset is not in the format file goes to the failure table.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::{Result, anyhow};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;
use synth_core::data::arrow::datatypes::SchemaRef;

use super::release::DEFAULT_FORMAT;
use crate::format::Format;
use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data::{self, Row};
use synth_core::store::atomic::{create_tmp, finish_file};
use synth_core::store::failures::FailureKind;
use synth_engine::stages::{BuildCtx, KindInfo, PlanCtx, Role, RunCtx, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::default("dir", Ty::OutPath, "\"release\"", "folder of the release, relative to the output directory"),
    OptionSpec::default("format", Ty::File, DEFAULT_FORMAT, "language file: language, subsets, categories, letters"),
    OptionSpec::default("dev_characters", Ty::StrList, "[]", "characters whose questions form the dev split"),
    OptionSpec::default("character_column", Ty::Str, "\"char_id\"", "column identifying the character"),
    OptionSpec::default("type_column", Ty::Str, "\"kind\"", "column with knowledge / reasoning, written to key.csv"),
    OptionSpec::default("title", Ty::Str, "\"A RoleEval-style benchmark\"", "the card's heading"),
];

pub static KIND: KindInfo = KindInfo {
    name: "roleeval_export",
    about: "RoleEval construction: questions as CSVs in the release's layout (dev/test by character), answer key, card",
    role: Role::Sink,
    options: OPTIONS,
    example: "",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    dir: String,
    format: String,
    dev_characters: Vec<String>,
    character_column: String,
    type_column: String,
    title: String,
}

struct Export {
    opts: Options,
    format: Format,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    let format = super::read_format(ctx, diags, &opts.format)?;
    Some(Box::new(Export { opts, format }))
}

fn text(r: &Row, c: &str) -> String {
    match r.get(c) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    }
}

fn csv_text(rows: &[Vec<String>]) -> Result<Vec<u8>> {
    let mut w = csv::WriterBuilder::new().terminator(csv::Terminator::Any(b'\n')).from_writer(Vec::new());
    for r in rows {
        w.write_record(r)?;
    }
    w.into_inner().map_err(|e| anyhow!("{e}"))
}

#[async_trait]
impl Stage for Export {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        let mut cols = vec!["subset", "category", "question", "answer", self.opts.character_column.as_str()];
        cols.extend(self.format.choices.iter().map(String::as_str));
        ctx.require_columns("inputs", 0, cols);
        None
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let f = &self.format;
        // (subset, split, category) -> rows; key rows.
        let mut files: BTreeMap<(usize, usize, usize), Vec<Vec<String>>> = BTreeMap::new();
        let mut key = vec![vec!["qkey".to_string(), "answer".into(), "type".into()]];
        let (_, batches) = synth_core::store::parquet::read_all(&ctx.inputs[0].path)?;
        let mut n = 0u64;
        for b in &batches {
            for i in 0..b.num_rows() {
                n += 1;
                let r = data::row_json(b, i);
                let id = text(&r, data::ID);
                let (subset, category) = (text(&r, "subset"), text(&r, "category"));
                let (Some(s), Some(c)) = (
                    f.subsets.iter().position(|x| x.stem == subset),
                    f.categories.iter().position(|x| x.stem == category),
                ) else {
                    ctx.fail(
                        &id,
                        FailureKind::Export,
                        format!("subset \"{subset}\" / category \"{category}\" is not in the format file"),
                        None,
                    );
                    continue;
                };
                let dev = self.opts.dev_characters.contains(&text(&r, &self.opts.character_column));
                let split = usize::from(!dev); // 0 dev, 1 test
                let rows = files.entry((s, split, c)).or_default();
                let qid = rows.len().to_string();
                let mut row = vec![qid.clone(), text(&r, "question")];
                row.extend(f.choices.iter().map(|l| text(&r, l)));
                if dev {
                    row.push(text(&r, "answer"));
                } else {
                    key.push(vec![
                        format!("{subset}/{category}/{qid}"),
                        text(&r, "answer"),
                        text(&r, &self.opts.type_column),
                    ]);
                }
                rows.push(row);
            }
        }
        let dir = ctx.out_dir.join(&self.opts.dir);
        let mut written = 0u64;
        let mut card = format!(
            "# {}\n\nQuestions in the layout of the RoleEval release (Shen et al., 2023): `{}/<subset>/<split>/<category>_<split>.csv`, \
             header `id,question,{}` (+ `answer` in dev), ids from 0 in every file; `key.csv` holds the test answers and question types.\n\n\
             | subset | split | category | questions |\n|---|---|---|---:|\n",
            self.opts.title,
            f.lang,
            f.choices.join(",")
        );
        for ((s, split, c), rows) in &files {
            let split_name = if *split == 0 { "dev" } else { "test" };
            let (subset, category) = (&f.subsets[*s].stem, &f.categories[*c].stem);
            let mut header = vec!["id".to_string(), "question".into()];
            header.extend(f.choices.iter().cloned());
            if *split == 0 {
                header.push("answer".into());
            }
            let mut all = vec![header];
            all.extend(rows.iter().cloned());
            let path = dir.join(format!("{}/{subset}/{split_name}/{category}_{split_name}.csv", f.lang));
            let (mut file, pending) = create_tmp(&path)?;
            std::io::Write::write_all(&mut file, &csv_text(&all)?)?;
            finish_file(file, &pending)?;
            ctx.add_artifact(pending, Some(rows.len() as u64));
            written += rows.len() as u64;
            writeln!(card, "| {subset} | {split_name} | {category} | {} |", rows.len())?;
        }
        card.push_str(
            "\nThe questions were drafted from the prompt templates in `pipelines/prompts/roleeval/build/` \
             (reconstructed: the paper publishes none) or imported, and kept when their character passed the \
             automatic quality check; check them by hand before use, as the paper's annotators did.\n",
        );
        for (name, bytes) in [("key.csv", csv_text(&key)?), ("README.md", card.into_bytes())] {
            let (mut file, pending) = create_tmp(&dir.join(name))?;
            std::io::Write::write_all(&mut file, &bytes)?;
            finish_file(file, &pending)?;
            ctx.add_artifact(pending, None);
        }
        ctx.report.rows_in = n;
        ctx.report.rows_out = written;
        Ok(())
    }
}
