//! `rolemrc_card` sink: the dataset card (a README.md next to the data) with the
//! Table 2 statistics computed from the assembled samples — per category the
//! single-label and pair-label counts, average assistant turns and words per
//! reply — the test split per task, the preference-pair checks (pairs re-asked
//! because the edited answer repeated the answer it edits, samples dropped and why,
//! spares used in their place, groups left short), and provenance (synth version,
//! pipeline seed, configuration fingerprint, models). Table 2 counts the `train` split
//! only (unused spares are split `spare`). The first input is the samples; the failure
//! tables of every input are read for the dropped samples (a mix concatenates the
//! samples, so its card also names the `rolemrc_assemble` stage as an input).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::Result;
use async_trait::async_trait;
use serde::Deserialize;
use synth_core::data::arrow::array::{Array, AsArray};
use synth_core::data::arrow::datatypes::{Float64Type, Int64Type, SchemaRef};

use crate::plan::CATEGORIES;
use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::store::atomic::{create_tmp, finish_file};
use synth_core::store::parquet::read_all;
use synth_engine::stages::{Arity, BuildCtx, KindInfo, PlanCtx, Role, RunCtx, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::default("path", Ty::OutPath, "\"README.md\"", "card file, relative to the output directory"),
    OptionSpec::default("title", Ty::Str, "\"RoleMRC (synthesized with synth)\"", "first heading"),
    OptionSpec::optional(
        "note",
        Ty::Str,
        "a paragraph under the title (Markdown): which model wrote the data and what quality to expect",
    ),
    OptionSpec::optional(
        "reference_words",
        Ty::Map(&synth_core::config::options::NUMBER),
        "words per reply of a reference dataset by category (the paper's Table 2 #Words), shown beside the measured ones",
    ),
];

pub static KIND: KindInfo = KindInfo {
    name: "rolemrc_card",
    // 2: Table 2 from the train split only; the preference-pair checks section.
    // 3: the quality section (checks, near-duplicates, review; distinct-2, duplicate
    // replies), the reference #Words column.
    version: 3,
    about: "RoleMRC dataset card: Table 2 statistics from the data, test tasks, pair checks, provenance",
    role: Role::Sink,
    arity: Arity::AtLeast(1),
    options: OPTIONS,
    uses_seed: true,
    example: "",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    path: String,
    title: String,
    #[serde(default)]
    note: Option<String>,
    #[serde(default)]
    reference_words: Option<BTreeMap<String, f64>>,
}

struct Card {
    opts: Options,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    Some(Box::new(Card { opts: ctx.parse(diags)? }))
}

/// Table 2 row labels.
fn label(category: &str) -> &str {
    match category {
        "free_chat" => "Free Chats",
        "onscene_chat" => "On-scene Chats",
        "answer" => "Answer",
        "no_answer" => "No Answer",
        "refusal" => "Refusal",
        "attempt" => "Attempt",
        "multi_turn" => "Multi-turn",
        "nested" => "Nested",
        "prioritized" => "Prioritized",
        other => other,
    }
}

/// One Table 2 row: S, P (`/` when none), turns per sample, words per reply, and the
/// reference dataset's words per reply when the card has them (`reference`: `None` = no
/// such column).
fn row(md: &mut String, name: &str, s: &Stat, reference: Option<Option<f64>>) -> std::fmt::Result {
    let single = if s.single == 0 { "/".to_string() } else { s.single.to_string() };
    let pair = if s.pair == 0 { "/".to_string() } else { s.pair.to_string() };
    let samples = (s.single.max(s.pair)).max(1) as f64;
    let words = if s.turns == 0 { 0.0 } else { s.words / s.turns as f64 };
    let reference = match reference {
        None => String::new(),
        Some(Some(r)) => format!(" {r:.2} |"),
        Some(None) => " |".into(),
    };
    writeln!(md, "| {name} | {single} | {pair} | {:.2} | {words:.2} |{reference}", s.turns as f64 / samples)
}

/// What the card says about pairs and dropped samples.
#[derive(Default)]
struct Checks {
    /// Kept samples one of whose answers was re-asked for repeating what it edits, and those re-asks.
    reasked_samples: u64,
    reasks: u64,
    /// Dropped samples by failure kind.
    dropped: BTreeMap<String, u64>,
    spares_used: u64,
    spares_unused: u64,
    /// group → (counted samples planned, samples delivered)
    groups: BTreeMap<String, (u64, u64)>,
}

#[derive(Default)]
struct Stat {
    single: u64,
    pair: u64,
    turns: u64,
    words: f64,
}

/// The preference-pair checks section.
fn write_checks(md: &mut String, c: &Checks) -> std::fmt::Result {
    writeln!(md, "\n## Preference pairs and dropped samples\n")?;
    writeln!(
        md,
        "A pair whose chosen answer is its rejected answer again (equal after whitespace normalization, or above the configured similarity) is re-asked, then dropped (`degenerate_pair`); spare samples planned per group take the place of dropped ones.\n"
    )?;
    writeln!(
        md,
        "- re-asked because the edited answer repeated the answer it edits: {} sample(s), {} re-ask(s)",
        c.reasked_samples, c.reasks
    )?;
    let dropped: u64 = c.dropped.values().sum();
    let by_kind: Vec<String> = c.dropped.iter().map(|(k, n)| format!("`{k}` {n}")).collect();
    writeln!(
        md,
        "- dropped: {} as degenerate pairs; {dropped} in all{}",
        c.dropped.get("degenerate_pair").copied().unwrap_or(0),
        if by_kind.is_empty() { String::new() } else { format!(" ({})", by_kind.join(", ")) }
    )?;
    writeln!(
        md,
        "- spares: {} used in place of dropped samples, {} unused (in `samples.parquet` with split `spare`)",
        c.spares_used, c.spares_unused
    )?;
    let short: Vec<String> = c
        .groups
        .iter()
        .filter(|(_, (want, got))| got < want)
        .map(|(g, (want, got))| format!("`{g}` {got}/{want}"))
        .collect();
    if short.is_empty() {
        writeln!(md, "- every sample group has its planned count")?;
    } else {
        writeln!(md, "- groups short of their planned count (more dropped than spares): {}", short.join(", "))?;
    }
    Ok(())
}

#[async_trait]
impl Stage for Card {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        ctx.require_columns(
            "inputs",
            0,
            ["split", "category", "task", "conversations", "chosen", "assistant_turns", "reply_words", "models"],
        );
        None
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let input = ctx.inputs[0].clone();
        let (_, batches) = read_all(&input.path)?;
        let mut stats: BTreeMap<String, Stat> = BTreeMap::new();
        let mut tasks: BTreeMap<String, u64> = BTreeMap::new();
        let mut models = std::collections::BTreeSet::new();
        let mut checks = Checks::default();
        let mut rows = 0u64;
        // The train split's assistant replies (distinct-2, duplicate replies).
        let mut replies: Vec<String> = Vec::new();
        for b in &batches {
            let (group, spare, reasks) = (
                b.column_by_name("group").map(|c| c.as_string::<i32>().clone()),
                b.column_by_name("spare").map(|c| c.as_boolean().clone()),
                b.column_by_name("degenerate_reasks").map(|c| c.as_primitive::<Int64Type>().clone()),
            );
            for i in 0..b.num_rows() {
                let split = b.column_by_name("split").expect("planned column").as_string::<i32>().value(i);
                if let Some(r) = reasks.as_ref().filter(|r| r.is_valid(i) && r.value(i) > 0) {
                    checks.reasked_samples += 1;
                    checks.reasks += r.value(i) as u64;
                }
                let is_spare = spare.as_ref().is_some_and(|c| c.is_valid(i) && c.value(i));
                if split == "spare" {
                    checks.spares_unused += 1;
                    continue;
                }
                checks.spares_used += u64::from(is_spare);
                if let Some(g) = group.as_ref().filter(|g| g.is_valid(i)) {
                    let e = checks.groups.entry(g.value(i).to_string()).or_default();
                    e.0 += u64::from(!is_spare);
                    e.1 += 1;
                }
            }
        }
        for input in &ctx.inputs {
            for f in input.failures()? {
                *checks.dropped.entry(f.kind.as_str().to_string()).or_default() += 1;
                // A dropped counted sample is one its group still needed.
                let record: serde_json::Value =
                    f.record.as_deref().and_then(|r| serde_json::from_str(r).ok()).unwrap_or_default();
                if let (Some(g), Some(false)) =
                    (record.get("group").and_then(|g| g.as_str()), record.get("spare").and_then(|s| s.as_bool()))
                {
                    checks.groups.entry(g.to_string()).or_default().0 += 1;
                }
            }
        }
        for b in &batches {
            let col = |n: &str| b.column_by_name(n).expect("planned column");
            let (split, cat, task) =
                (col("split").as_string::<i32>(), col("category").as_string::<i32>(), col("task").as_string::<i32>());
            let (conversations, chosen) = (col("conversations"), col("chosen"));
            let turns = col("assistant_turns").as_primitive::<Int64Type>();
            let words = col("reply_words").as_primitive::<Float64Type>();
            let model = col("models").as_string::<i32>();
            let conv_list = conversations.as_list_opt::<i32>();
            for i in 0..b.num_rows() {
                if split.value(i) == "train"
                    && let Some(list) = conv_list.filter(|l| l.is_valid(i))
                {
                    let msgs = list.value(i);
                    let st = msgs.as_struct();
                    let (role, content) = (
                        st.column_by_name("role").map(|c| c.as_string::<i32>().clone()),
                        st.column_by_name("content").map(|c| c.as_string::<i32>().clone()),
                    );
                    if let (Some(role), Some(content)) = (role, content) {
                        for k in 0..st.len() {
                            if role.value(k) == "Assistant" {
                                replies.push(content.value(k).to_string());
                            }
                        }
                    }
                }
                rows += 1;
                for m in model.value(i).split(',').filter(|m| !m.is_empty()) {
                    models.insert(m.to_string());
                }
                if split.value(i) == "test" {
                    *tasks.entry(task.value(i).to_string()).or_default() += 1;
                    continue;
                }
                if split.value(i) != "train" {
                    continue;
                }
                let s = stats.entry(cat.value(i).to_string()).or_default();
                s.single += u64::from(conversations.is_valid(i));
                s.pair += u64::from(chosen.is_valid(i));
                s.turns += turns.value(i) as u64;
                s.words += words.value(i) * turns.value(i) as f64;
            }
        }
        let mut md = String::new();
        writeln!(md, "# {}\n", self.opts.title)?;
        if let Some(note) = &self.opts.note {
            writeln!(md, "{}\n", note.trim())?;
        }
        if models.contains("offline") {
            writeln!(
                md,
                "> **Not training data.** Generated with the `offline` provider: deterministic placeholder text of the right shape, for demos and tests.\n"
            )?;
        }
        writeln!(
            md,
            "Files: `sft.jsonl` (single-label, `conversations`), `dpo.jsonl` (pair-label, `prompt`/`chosen`/`rejected`), `test.jsonl` (`question`/`reference`/`task`), and the same as Parquet.\n"
        )?;
        writeln!(md, "## Statistics (train splits, as Table 2 of the RoleMRC paper)\n")?;
        let refs = self.opts.reference_words.as_ref();
        let reference = |cat: Option<&str>| refs.map(|r| cat.and_then(|c| r.get(c).copied()));
        if refs.is_some() {
            writeln!(md, "| Category | S | P | #Turns | #Words | #Words (paper) |")?;
            writeln!(md, "|---|---:|---:|---:|---:|---:|")?;
        } else {
            writeln!(md, "| Category | S | P | #Turns | #Words |")?;
            writeln!(md, "|---|---:|---:|---:|---:|")?;
        }
        let mut total = Stat::default();
        let known: Vec<String> = CATEGORIES.iter().map(|c| c.to_string()).collect();
        let mixed: Vec<&String> = stats.keys().filter(|k| !known.contains(k)).collect();
        let order = known.iter().map(|k| (k, false)).chain(mixed.iter().map(|k| (*k, true)));
        let mut mix_started = false;
        for (cat, mix) in order {
            let Some(s) = stats.get(cat) else { continue };
            if mix && !mix_started {
                // Table 2 lists the mix-in sources under the RoleMRC subtotal.
                mix_started = true;
                row(&mut md, "**RoleMRC**", &total, reference(None))?;
            }
            row(&mut md, &format!("{}{}", if mix { "+ " } else { "" }, label(cat)), s, reference(Some(cat)))?;
            total.single += s.single;
            total.pair += s.pair;
            total.turns += s.turns;
            total.words += s.words;
        }
        row(&mut md, "**Total**", &total, reference(None))?;
        writeln!(md)?;
        writeln!(
            md,
            "S: single-label samples; P: pair-label samples; #Turns: assistant replies per sample; #Words: words (whitespace-separated) per assistant reply.\n"
        )?;
        writeln!(md, "## Test split ({} rows)\n", tasks.values().sum::<u64>())?;
        writeln!(md, "| Task | Rows |")?;
        writeln!(md, "|---|---:|")?;
        for (t, n) in &tasks {
            writeln!(md, "| `{t}` | {n} |")?;
        }
        write_checks(&mut md, &checks)?;
        writeln!(md, "\n## Quality\n")?;
        writeln!(
            md,
            "What the content checks (debris, repetition, echo, language, length, chat rules), near-duplicate removal and human review did on the way to these samples, as measured in this run and its up-to-date stages.\n"
        )?;
        md.push_str(&synth_quality::summary::markdown(&ctx.upstream_quality()));
        let texts: Vec<&str> = replies.iter().map(String::as_str).collect();
        let distinct2 = synth_quality::text::distinct_n(texts.iter().copied(), 2);
        let mut seen = std::collections::HashSet::new();
        let repeated = replies.iter().filter(|r| !seen.insert(synth_quality::text::words(r))).count();
        writeln!(md)?;
        match distinct2 {
            Some(d) => writeln!(
                md,
                "- distinct-2 of the train split's assistant replies: {d:.3} (distinct word pairs / all word pairs, over {} replies)",
                replies.len()
            )?,
            None => writeln!(md, "- distinct-2: no reply of two words or more in the train split")?,
        }
        writeln!(
            md,
            "- duplicate replies: {repeated} of {} assistant replies repeat an earlier one word for word ({:.1}%)",
            replies.len(),
            if replies.is_empty() { 0.0 } else { 100.0 * repeated as f64 / replies.len() as f64 }
        )?;
        writeln!(md, "\n## Provenance\n")?;
        writeln!(md, "- synth {}", env!("CARGO_PKG_VERSION"))?;
        writeln!(md, "- pipeline seed: {}", ctx.seed)?;
        writeln!(md, "- configuration fingerprint: `{}`", ctx.fingerprint)?;
        writeln!(
            md,
            "- models: {}",
            if models.is_empty() { "none".to_string() } else { models.into_iter().collect::<Vec<_>>().join(", ") }
        )?;
        writeln!(
            md,
            "- method: Lu et al., *RoleMRC* (2025), §3 and Appendices D, E, I, J; prompts, seed scripts and rules are the files under `pipelines/prompts/rolemrc/`, `seeds/rolemrc/`, `rules/rolemrc/`."
        )?;
        let dest = ctx.out_dir.join(&self.opts.path);
        let (mut file, pending) = create_tmp(&dest)?;
        std::io::Write::write_all(&mut file, md.as_bytes())?;
        finish_file(file, &pending)?;
        ctx.report.rows_in = rows;
        ctx.report.rows_out = rows;
        ctx.add_artifact(pending, Some(rows));
        Ok(())
    }
}
