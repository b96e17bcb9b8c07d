//! `sharp_claims`: claims from ConceptNet assertion dumps (the official 5-column
//! tab-separated layout, plain or gzip — detected by its magic bytes — read as a stream),
//! filtered (language on both ends, relation whitelist, weight, surface text), deduplicated
//! on the assertion URI, sampled (bottom-k on a seeded key of the URI, stratified by
//! relation: the same claims whatever the file order) and, for a seeded share, turned
//! counterfactual by the rules of [`crate::counterfact`] with the words of
//! `rules/sharp/<lang>/` and the dump's own `/r/Antonym` edges.
//!
//! The scan is a pipeline: one thread inflates and cuts the stream into blocks of whole
//! lines, `threads` workers parse and filter blocks, and the merger takes their results in
//! block order (failures, dedupe, sample heaps), so the output never depends on the thread
//! count. Memory: blocks in flight, the kept URIs' 16-byte hashes, the sample heaps (at most
//! `sample` edges per relation) and the antonym graph of the language, never the file. A
//! line that does not parse goes to the failure table as `file:line: reason`; dropped edges
//! are counted per reason in the stage report.

use std::collections::{BTreeMap, BinaryHeap, HashSet};
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, mpsc};

use anyhow::{Context, Result, anyhow};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use synth_core::data::arrow::datatypes::{DataType, Field, SchemaRef};
use tokio_util::sync::CancellationToken;

use crate::conceptnet::{self, Drop, Edge, Filter};
use crate::counterfact::{self, AntonymGraph, Claim, Rewriter};
use crate::rules::Rules;
use crate::text::{ZH_CONVERSIONS, find_phrase};
use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data::{self, Row};
use synth_core::store::failures::{FailureKind, FailureLog};
use synth_engine::stages::{Arity, BuildCtx, KindInfo, PlanCtx, PrepareCtx, Prepared, Role, RunCtx, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::required("path", Ty::File, "a ConceptNet assertions dump (5 tab-separated columns; .gz read directly)"),
    OptionSpec::default("lang", Ty::Str, "\"en\"", "[R] language of both ends (/c/<lang>/…)"),
    OptionSpec::optional(
        "relations",
        Ty::StrList,
        "[R] relation whitelist without /r/ (default: the spec's 17 OMCS relations)",
    ),
    OptionSpec::default("min_weight", Ty::Float(0.0, 1e9), "1.0", "[R] keep edges of at least this weight"),
    OptionSpec::default(
        "no_surface",
        Ty::Enum(&["drop", "fail", "template"]),
        "\"drop\"",
        "[R] an edge without surface text: dropped (counted), a failure row, or rendered from a relation template",
    ),
    OptionSpec::default(
        "zh_convert",
        Ty::Enum(ZH_CONVERSIONS),
        "\"t2s\"",
        "[R] Chinese claims: OpenCC conversion to Simplified (t2s; tw2s / hk2s from the Taiwan / Hong Kong standards, tw2sp with Taiwan phrases) or none",
    ),
    OptionSpec::optional(
        "sample",
        Ty::Int(1, i64::MAX),
        "claims to keep, seeded (paper: ~1,000 before the counterfactual split); default all",
    ),
    OptionSpec::default(
        "stratify",
        Ty::Enum(&["proportional", "equal", "none"]),
        "\"proportional\"",
        "[R] the sample by relation: each relation's share of the kept edges (largest remainders), the same number per relation (as far as each has edges), or one pool",
    ),
    OptionSpec::default(
        "counterfactual_share",
        Ty::Float(0.0, 1.0),
        "0.5",
        "[R] share of the sampled claims made counterfactual (exact: round(share × n), seeded; paper: 481 of 953)",
    ),
    OptionSpec::optional(
        "counterfactuals",
        Ty::Int(0, i64::MAX),
        "an exact number of counterfactual claims instead of the share",
    ),
    OptionSpec::default(
        "counterfactual_rules",
        Ty::StrList,
        "[\"negation\", \"absolute_qualifier\", \"antonym\", \"relation_disruption\"]",
        "[R] rules tried from a seeded start in rotation; a claim no rule fits stays factual",
    ),
    OptionSpec::default(
        "llm_fallback",
        Ty::Bool,
        "false",
        "[R] a claim picked to be counterfactual that no rule fits is left to an LLM rewrite step (cf_rule \"llm\", text unchanged); sharp_turns refuses it if nothing rewrote it",
    ),
    OptionSpec::default(
        "rules",
        Ty::Str,
        "\"rules/sharp\"",
        "folder of the rule files, one subfolder per language (<rules>/<lang>/phrases.tsv, antonyms.tsv, templates.tsv)",
    ),
    OptionSpec::default(
        "antonym_sources",
        Ty::StrList,
        "[\"conceptnet\", \"lexicon\"]",
        "[R] the antonym rule's sources in order: the dump's /r/Antonym neighbours of the end (then start) node, the lexicon of the rules folder",
    ),
    OptionSpec::default(
        "disruption",
        Ty::Enum(counterfact::DISRUPTIONS),
        "\"swap\"",
        "[R] relation disruption: swap the two concepts, or put the tail of a sampled edge of another relation in place of the tail",
    ),
    OptionSpec::default(
        "check_json",
        Ty::Enum(&["all", "kept"]),
        "\"all\"",
        "check column 5 of every line (a bad one is a failure row) or only of lines that pass the language / relation filter",
    ),
    OptionSpec::optional(
        "threads",
        Ty::Int(1, 256),
        "parsing threads besides the reader (default: the CPU count); outputs never depend on it",
    )
    .runtime_only(),
];

pub static KIND: KindInfo = KindInfo {
    name: "sharp_claims",
    // 2: relation-stratified sampling, an exact counterfactual count, rules from files
    // (en and zh), ConceptNet antonyms, cf_detail / render / license columns.
    version: 2,
    about: "claims from a ConceptNet assertions dump (plain or gzip, streamed): language / relation / weight / surface-text filter, dedupe, seeded stratified sample, rule-based counterfactuals",
    role: Role::Source,
    arity: Arity::None,
    options: OPTIONS,
    uses_seed: true,
    example: "path = \"tests/fixtures/sharp/edges.csv\"",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    path: String,
    lang: String,
    relations: Option<Vec<String>>,
    min_weight: f64,
    no_surface: String,
    zh_convert: String,
    sample: Option<u64>,
    stratify: String,
    counterfactual_share: f64,
    counterfactuals: Option<u64>,
    counterfactual_rules: Vec<String>,
    llm_fallback: bool,
    rules: String,
    antonym_sources: Vec<String>,
    disruption: String,
    check_json: String,
    threads: Option<usize>,
}

struct ClaimsStage {
    path: PathBuf,
    rules_dir: PathBuf,
    o: Options,
    cfg: Arc<ScanCfg>,
    rules: Arc<Rules>,
    choices: serde_json::Map<String, Value>,
}

/// What a scan needs (shared by the scan's threads).
struct ScanCfg {
    filter: Filter,
    rules: Arc<Rules>,
    check_all: bool,
    fail_no_surface: bool,
    antonyms: bool,
    stratified: bool,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let o: Options = ctx.parse(diags)?;
    let mut ok = true;
    for r in &o.counterfactual_rules {
        if !counterfact::RULES.contains(&r.as_str()) {
            ctx.error(
                diags,
                "counterfactual_rules",
                format!("unknown rule \"{r}\" (rules: {})", counterfact::RULES.join(", ")),
            );
            ok = false;
        }
    }
    for s in &o.antonym_sources {
        if !counterfact::ANTONYM_SOURCES.contains(&s.as_str()) {
            let known = counterfact::ANTONYM_SOURCES.join(", ");
            ctx.error(diags, "antonym_sources", format!("unknown source \"{s}\" (sources: {known})"));
            ok = false;
        }
    }
    let wants_cf = o.counterfactuals.map_or(o.counterfactual_share > 0.0, |n| n > 0);
    if wants_cf && o.counterfactual_rules.is_empty() {
        ctx.error(diags, "counterfactual_rules", "counterfactual claims need at least one rule");
        ok = false;
    }
    let rules_dir = ctx.root.join(&o.rules);
    let rules = match Rules::load(&rules_dir, &o.rules, &o.lang) {
        Ok(r) => Arc::new(r),
        Err(e) => {
            ctx.error(diags, "rules", e);
            return None;
        }
    };
    let mut filter = Filter {
        lang: o.lang.clone(),
        min_weight: o.min_weight,
        require_surface: o.no_surface != "template",
        zh_convert: o.zh_convert.clone(),
        ..Filter::default()
    };
    if let Some(r) = &o.relations {
        filter.relations = r.iter().map(|r| r.trim_start_matches("/r/").to_string()).collect();
    }
    let cfg = Arc::new(ScanCfg {
        filter,
        rules: rules.clone(),
        check_all: o.check_json == "all",
        fail_no_surface: o.no_surface == "fail",
        antonyms: o.counterfactual_rules.iter().any(|r| r == "antonym")
            && o.antonym_sources.iter().any(|s| s == "conceptnet"),
        stratified: o.stratify != "none",
    });
    let choices = crate::reconstructed(OPTIONS, ctx.options);
    ok.then(|| {
        Box::new(ClaimsStage { path: ctx.root.join(&o.path), rules_dir, o, cfg, rules, choices }) as Box<dyn Stage>
    })
}

/// Output columns.
pub fn output_schema() -> SchemaRef {
    let s = |n: &str, null: bool| Field::new(n, DataType::Utf8, null);
    data::schema_with_id([
        s("claim", false),
        s("label", false),
        s("cf_rule", true),
        s("cf_detail", true),
        s("factual_claim", false),
        s("lang", false),
        s("rel", false),
        s("start", false),
        s("end", false),
        Field::new("weight", DataType::Float64, false),
        s("dataset", true),
        s("license", true),
        s("surface_text", true),
        s("render", false),
        s("source", false),
    ])
}

/// A kept edge with where it came from; ordered by its sampling key.
struct Kept {
    key: u64,
    line: u64,
    edge: Edge,
    claim: String,
}

impl PartialEq for Kept {
    fn eq(&self, o: &Self) -> bool {
        (self.key, self.line) == (o.key, o.line)
    }
}
impl Eq for Kept {}
impl PartialOrd for Kept {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Kept {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.key, self.line).cmp(&(o.key, o.line))
    }
}

/// The dump as a line reader: gzip (magic bytes 1f 8b, concatenated members) or plain.
pub fn open(path: &Path) -> Result<Box<dyn BufRead + Send>> {
    let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut magic = [0u8; 2];
    let n = f.read(&mut magic)?;
    let f = File::open(path)?;
    Ok(if n == 2 && magic == [0x1f, 0x8b] {
        Box::new(BufReader::with_capacity(1 << 20, flate2::read::MultiGzDecoder::new(f)))
    } else {
        Box::new(BufReader::with_capacity(1 << 20, f))
    })
}

/// Bytes per block handed to a worker (cut at the next newline).
const BLOCK: usize = 4 << 20;

/// What a worker made of one block (line numbers relative to the block).
#[derive(Default)]
struct BlockOut {
    lines: u64,
    kept: Vec<(u64, Edge, String)>,
    failures: Vec<(u64, FailureKind, String, String)>,
    drops: BTreeMap<Drop, u64>,
    antonyms: Vec<(String, String)>,
}

fn scan_block(bytes: &[u8], cfg: &ScanCfg) -> BlockOut {
    let mut out = BlockOut::default();
    let lang = cfg.filter.lang.as_str();
    for raw in bytes.split(|b| *b == b'\n') {
        out.lines += 1;
        let n = out.lines;
        let record = |t: &str| t.chars().take(2000).collect::<String>();
        let text = match std::str::from_utf8(raw) {
            Ok(t) => t.trim_end_matches('\r'),
            Err(e) => {
                out.failures.push((
                    n,
                    FailureKind::Parse,
                    format!("not UTF-8 ({e})"),
                    String::from_utf8_lossy(raw).chars().take(2000).collect(),
                ));
                continue;
            }
        };
        if text.trim().is_empty() {
            continue;
        }
        let line = match conceptnet::split(text) {
            Ok(l) => l,
            Err(why) => {
                out.failures.push((n, FailureKind::Parse, why, record(text)));
                continue;
            }
        };
        if let Err(d) = cfg.filter.quick(&line) {
            let checked = if cfg.check_all { conceptnet::check_info(&line) } else { Ok(()) };
            match checked {
                Err(why) => out.failures.push((n, FailureKind::Parse, why, record(text))),
                Ok(()) => {
                    *out.drops.entry(d).or_default() += 1;
                    if cfg.antonyms && line.rel == "Antonym" {
                        let (a, b) = (conceptnet::concept(line.start), conceptnet::concept(line.end));
                        if let ((Some(la), Some(ta)), (Some(lb), Some(tb))) = (a, b)
                            && la == lang
                            && lb == lang
                        {
                            out.antonyms.push((ta.to_string(), tb.to_string()));
                        }
                    }
                }
            }
            continue;
        }
        let (info, weight) = match conceptnet::info(&line) {
            Ok(x) => x,
            Err(why) => {
                out.failures.push((n, FailureKind::Parse, why, record(text)));
                continue;
            }
        };
        let edge = Edge::new(&line, &info, weight);
        match cfg.filter.claim(&edge, &cfg.rules) {
            Ok(claim) => out.kept.push((n, edge, claim)),
            Err(Drop::NoSurface) if cfg.fail_no_surface => {
                out.failures.push((n, FailureKind::Input, format!("{} has no surface text", edge.uri), record(text)))
            }
            Err(d) => *out.drops.entry(d).or_default() += 1,
        }
    }
    // A block ends with its newline: the split's last (empty) piece is not a line.
    if bytes.last() == Some(&b'\n') {
        out.lines -= 1;
    }
    out
}

/// The scan's result.
#[derive(Default)]
struct Scan {
    lines: u64,
    dups: u64,
    distinct: u64,
    drops: BTreeMap<Drop, u64>,
    /// Per stratum (relation, or "" when not stratified): kept edges in the stratum and
    /// the heap of the smallest keys.
    strata: BTreeMap<String, (u64, BinaryHeap<Kept>)>,
    graph: AntonymGraph,
}

struct ScanRun<'a> {
    cfg: &'a ScanCfg,
    file: &'a str,
    cap: usize,
    threads: usize,
    cancel: &'a CancellationToken,
    failures: &'a FailureLog,
    key: &'a (dyn Fn(&str) -> u64 + Sync),
    done: &'a std::sync::atomic::AtomicU64,
}

impl ScanRun<'_> {
    fn run(&self, mut reader: Box<dyn BufRead + Send>, path: &Path) -> Result<Scan> {
        let mut scan = Scan::default();
        let mut seen: HashSet<[u8; 16]> = HashSet::new();
        let (block_tx, block_rx) = mpsc::sync_channel::<(u64, Vec<u8>)>(self.threads * 2);
        let block_rx = Mutex::new(block_rx);
        let (out_tx, out_rx) = mpsc::channel::<(u64, BlockOut)>();
        std::thread::scope(|s| -> Result<()> {
            let reader = s.spawn(move || -> Result<()> {
                let mut idx = 0u64;
                loop {
                    if self.cancel.is_cancelled() {
                        return Ok(());
                    }
                    let mut block = Vec::with_capacity(BLOCK + 4096);
                    (&mut reader)
                        .take(BLOCK as u64)
                        .read_to_end(&mut block)
                        .with_context(|| format!("reading {}", path.display()))?;
                    if block.is_empty() {
                        return Ok(());
                    }
                    if block.last() != Some(&b'\n') {
                        reader.read_until(b'\n', &mut block).with_context(|| format!("reading {}", path.display()))?;
                    }
                    if block_tx.send((idx, block)).is_err() {
                        return Ok(());
                    }
                    idx += 1;
                }
            });
            for _ in 0..self.threads {
                let out_tx = out_tx.clone();
                let block_rx = &block_rx;
                s.spawn(move || {
                    loop {
                        let next = block_rx.lock().expect("block queue").recv();
                        let Ok((idx, block)) = next else { return };
                        if out_tx.send((idx, scan_block(&block, self.cfg))).is_err() {
                            return;
                        }
                    }
                });
            }
            drop(out_tx);
            let mut pending: BTreeMap<u64, BlockOut> = BTreeMap::new();
            let mut next = 0u64;
            for (idx, out) in out_rx {
                pending.insert(idx, out);
                while let Some(out) = pending.remove(&next) {
                    self.merge(&mut scan, &mut seen, out);
                    next += 1;
                }
            }
            reader.join().map_err(|_| anyhow!("the reader thread panicked"))?
        })?;
        if self.cancel.is_cancelled() {
            return Err(synth_engine::stages::Cancelled.into());
        }
        scan.distinct = seen.len() as u64;
        scan.graph.finish();
        Ok(scan)
    }

    /// One block's results, in file order: failures, drops, antonyms, then the kept edges
    /// (dedupe, then the stratum's heap of the `cap` smallest keys).
    fn merge(&self, scan: &mut Scan, seen: &mut HashSet<[u8; 16]>, out: BlockOut) {
        let base = scan.lines;
        for (n, kind, why, record) in out.failures {
            let at = format!("{}:{}", self.file, base + n);
            let message = synth_core::secrets::scrub(&format!("{at}: {why}"));
            self.failures.record(at, kind, message, Some(synth_core::secrets::scrub(&record)));
        }
        for (d, n) in out.drops {
            *scan.drops.entry(d).or_default() += n;
        }
        for (a, b) in out.antonyms {
            scan.graph.add(&a, &b);
        }
        for (n, edge, claim) in out.kept {
            let h = blake3::hash(edge.uri.as_bytes());
            if !seen.insert(h.as_bytes()[..16].try_into().expect("16 bytes")) {
                scan.dups += 1;
                continue;
            }
            let key = (self.key)(&edge.uri);
            let stratum = if self.cfg.stratified { edge.rel.clone() } else { String::new() };
            let (count, heap) = scan.strata.entry(stratum).or_default();
            *count += 1;
            let kept = Kept { key, line: base + n, edge, claim };
            if heap.len() < self.cap {
                heap.push(kept);
            } else if heap.peek().is_some_and(|top| kept < *top) {
                heap.pop();
                heap.push(kept);
            }
        }
        scan.lines += out.lines;
        self.done.store(scan.lines, Ordering::Relaxed);
    }
}

/// How many of `n` claims each stratum (of the given sizes, in order) gets: `proportional`
/// by largest remainders of `n · size / total` (ties to the earlier stratum), `equal` one
/// at a time in turn to each stratum with edges left. Never more than a stratum holds.
pub fn allocate(sizes: &[u64], n: u64, equal: bool) -> Vec<u64> {
    let total: u64 = sizes.iter().sum();
    if n >= total {
        return sizes.to_vec();
    }
    if equal {
        let mut got = vec![0u64; sizes.len()];
        let mut left = n;
        while left > 0 {
            let open: Vec<usize> = (0..sizes.len()).filter(|&i| got[i] < sizes[i]).collect();
            let each = (left / open.len() as u64).max(1);
            for i in open {
                let give = each.min(sizes[i] - got[i]).min(left);
                got[i] += give;
                left -= give;
                if left == 0 {
                    break;
                }
            }
        }
        return got;
    }
    let exact: Vec<(u64, u128)> = sizes
        .iter()
        .map(|&s| ((n as u128 * s as u128 / total as u128) as u64, n as u128 * s as u128 % total as u128))
        .collect();
    let mut got: Vec<u64> = exact.iter().map(|e| e.0).collect();
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(exact[i].1), i));
    let mut left = n - got.iter().sum::<u64>();
    for i in order {
        if left == 0 {
            break;
        }
        if got[i] < sizes[i] {
            got[i] += 1;
            left -= 1;
        }
    }
    got
}

#[async_trait]
impl Stage for ClaimsStage {
    fn plan(&self, _ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        Some(output_schema())
    }

    async fn prepare(&self, _ctx: &PrepareCtx<'_>) -> Result<Option<Prepared>> {
        let mut files = vec![self.path.clone()];
        files.extend(Rules::files(&self.rules_dir, &self.o.lang));
        Ok(Some(Prepared { files, hash_files: true, ..Default::default() }))
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let file = self.path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
        let reader = open(&self.path)?;
        let cap = ctx.limit.into_iter().chain(self.o.sample).min().unwrap_or(u64::MAX) as usize;
        let threads = self.o.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let (cfg, path, cancel, failures) =
            (self.cfg.clone(), self.path.clone(), ctx.cancel.clone(), ctx.failures.clone());
        let (seed, stage, progress) = (ctx.seed, ctx.name.clone(), ctx.progress.clone());
        let scan_file = file.clone();
        let mut scan = tokio::task::spawn_blocking(move || {
            let key = move |uri: &str| synth_core::rng::record_key(seed, &stage, uri, "sample");
            let run = ScanRun {
                cfg: &cfg,
                file: &scan_file,
                cap,
                threads,
                cancel: &cancel,
                failures: &failures,
                key: &key,
                done: &progress.done,
            };
            run.run(reader, &path)
        })
        .await??;
        ctx.progress.failed.store(ctx.failures.len() as u64, Ordering::Relaxed);

        // The sample: each stratum's share, its smallest keys; then file order.
        let sizes: Vec<u64> = scan.strata.values().map(|(n, _)| *n).collect();
        let n = (cap as u64).min(sizes.iter().sum());
        let shares = allocate(&sizes, n, self.o.stratify == "equal");
        let mut kept: Vec<Kept> = Vec::new();
        for ((_, (_, heap)), k) in std::mem::take(&mut scan.strata).into_iter().zip(shares) {
            let mut v = heap.into_sorted_vec();
            v.truncate(k as usize);
            kept.extend(v);
        }
        kept.sort_by_key(|k| k.line);
        let rows = self.rows(ctx, &kept, &scan.graph, &file);

        ctx.report.rows_in = scan.lines;
        let m = &mut ctx.report.metrics;
        m.insert("duplicates".into(), scan.dups as f64);
        m.insert("distinct_claims".into(), scan.distinct as f64);
        m.insert("antonym_terms".into(), scan.graph.len() as f64);
        for (d, n) in &scan.drops {
            m.insert(format!("dropped_{}", d.name().replace(' ', "_")), *n as f64);
        }
        let counterfactual = rows.iter().filter(|r| r["label"] == "counterfactual").count();
        m.insert("counterfactual".into(), counterfactual as f64);
        crate::record_choices(ctx, KIND.name, &self.choices)?;
        let schema = output_schema();
        let mut out = ctx.create_output(schema.clone())?;
        for chunk in rows.chunks(1024) {
            out.write(&data::rows_to_batch(&schema, chunk).map_err(|(i, e)| anyhow!("row {i}: {e}"))?)?;
        }
        ctx.set_output(out)
    }
}

impl ClaimsStage {
    /// The sampled claims as rows, an exact number of them counterfactual: in the order of a
    /// seeded key, each claim tries the rules from a seeded start in rotation until one fits.
    fn rows(&self, ctx: &RunCtx, kept: &[Kept], graph: &AntonymGraph, file: &str) -> Vec<Row> {
        let lang = self.o.lang.as_str();
        let script = |t: &Option<String>| t.as_deref().map(|t| self.cfg.filter.script(t));
        let term_span = |t: &Option<String>| t.as_deref().map(|t| self.cfg.filter.script(&t.replace('_', " ")));
        // The claim parts in the claim's script: (surface, start span, end span).
        let parts: Vec<(Option<String>, Option<String>, Option<String>)> = kept
            .iter()
            .map(|k| {
                let e = &k.edge;
                let start = script(&e.surface_start).or_else(|| term_span(&e.term_start));
                let end = script(&e.surface_end).or_else(|| term_span(&e.term_end));
                (script(&e.surface_text), start, end)
            })
            .collect();
        let rewriter = Rewriter {
            rules: &self.rules,
            graph,
            antonym_sources: &self.o.antonym_sources,
            disruption: &self.o.disruption,
            zh_convert: &self.o.zh_convert,
        };
        let target =
            self.o.counterfactuals.unwrap_or_else(|| (self.o.counterfactual_share * kept.len() as f64).round() as u64);
        let mut order: Vec<usize> = (0..kept.len()).collect();
        order.sort_by_key(|&i| (ctx.record_key(&kept[i].edge.uri, "counterfactual"), i));
        let mut cf: Vec<Option<(String, String, String)>> = vec![None; kept.len()];
        let mut made = 0u64;
        let rules = &self.o.counterfactual_rules;
        for &i in &order {
            if made >= target || rules.is_empty() {
                break;
            }
            let (k, (surface, start, end)) = (&kept[i], &parts[i]);
            let claim = Claim {
                text: &k.claim,
                surface: surface.as_deref(),
                start_span: start.as_deref(),
                end_span: end.as_deref(),
                term_start: k.edge.term_start.as_deref(),
                term_end: k.edge.term_end.as_deref(),
            };
            let pick = ctx.record_key(&k.edge.uri, "antonym");
            let foreign = self.foreign_tail(ctx, kept, &parts, i);
            let first = (ctx.record_key(&k.edge.uri, "rule") % rules.len() as u64) as usize;
            cf[i] = (0..rules.len()).find_map(|j| {
                let rule = &rules[(first + j) % rules.len()];
                rewriter
                    .apply(rule, &claim, pick, foreign)
                    .filter(|c| c.claim != k.claim)
                    .map(|c| (c.claim, rule.clone(), c.detail))
            });
            if cf[i].is_none() && self.o.llm_fallback {
                cf[i] = Some((k.claim.clone(), "llm".into(), "no rule fits: left to the LLM rewrite step".into()));
            }
            made += u64::from(cf[i].is_some());
        }
        let opt = |v: &Option<String>| v.clone().map(Value::String).unwrap_or(Value::Null);
        kept.iter()
            .zip(cf)
            .map(|(k, cf)| {
                let e = &k.edge;
                let (claim, label, rule, detail) = match cf {
                    Some((c, r, d)) => (c, "counterfactual", json!(r), json!(d)),
                    None => (k.claim.clone(), "factual", Value::Null, Value::Null),
                };
                let render = if e.surface_text.as_deref().is_some_and(|s| !s.trim().is_empty()) {
                    "surface"
                } else {
                    "template"
                };
                Row::from_iter([
                    (data::ID.to_string(), json!(e.uri)),
                    ("claim".into(), json!(claim)),
                    ("label".into(), json!(label)),
                    ("cf_rule".into(), rule),
                    ("cf_detail".into(), detail),
                    ("factual_claim".into(), json!(k.claim)),
                    ("lang".into(), json!(lang)),
                    ("rel".into(), json!(e.rel)),
                    ("start".into(), json!(e.start)),
                    ("end".into(), json!(e.end)),
                    ("weight".into(), json!(e.weight)),
                    ("dataset".into(), opt(&e.dataset)),
                    ("license".into(), opt(&e.license)),
                    ("surface_text".into(), opt(&e.surface_text)),
                    ("render".into(), json!(render)),
                    ("source".into(), json!(format!("{file}:{}", k.line))),
                ])
            })
            .collect()
    }

    /// For `foreign_tail` disruption: the end span of a sampled edge of another relation
    /// (seeded), present as a whole phrase in neither claim.
    fn foreign_tail<'a>(
        &self,
        ctx: &RunCtx,
        kept: &[Kept],
        parts: &'a [(Option<String>, Option<String>, Option<String>)],
        i: usize,
    ) -> Option<&'a str> {
        if self.o.disruption != "foreign_tail" || kept.len() < 2 {
            return None;
        }
        let start = (ctx.record_key(&kept[i].edge.uri, "foreign") % kept.len() as u64) as usize;
        (0..kept.len()).map(|j| (start + j) % kept.len()).find_map(|j| {
            let end = parts[j].2.as_deref()?;
            (j != i && kept[j].edge.rel != kept[i].edge.rel && find_phrase(&kept[i].claim, end).is_none())
                .then_some(end)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_is_proportional_or_equal_and_exact() {
        assert_eq!(allocate(&[50, 30, 20], 10, false), vec![5, 3, 2]);
        assert_eq!(allocate(&[1, 1, 1], 2, false), vec![1, 1, 0], "ties to the earlier stratum");
        assert_eq!(allocate(&[7, 2, 1], 5, false).iter().sum::<u64>(), 5);
        assert_eq!(allocate(&[3, 3], 10, false), vec![3, 3], "never more than there is");
        assert_eq!(allocate(&[100, 2, 1], 9, true), vec![6, 2, 1], "equal, then the rest to who has more");
        assert_eq!(allocate(&[100, 100, 100], 7, true), vec![3, 2, 2]);
        assert_eq!(allocate(&[], 3, true), Vec::<u64>::new());
    }

    #[test]
    fn blocks_count_lines_and_keep_order() {
        let cfg = ScanCfg {
            filter: Filter::default(),
            rules: Arc::new(Rules::default()),
            check_all: true,
            fail_no_surface: false,
            antonyms: true,
            stratified: true,
        };
        let good = "/a/1\t/r/IsA\t/c/en/a\t/c/en/b\t{\"surfaceText\": \"[[a]] is a type of [[b]]\", \"weight\": 1}";
        let bad_json_dropped = "/a/2\t/r/RelatedTo\t/c/en/a\t/c/en/b\t{nope}";
        let antonym = "/a/3\t/r/Antonym\t/c/en/hot\t/c/en/cold\t{\"weight\": 1}";
        let text = format!("{good}\n\n{bad_json_dropped}\r\n{antonym}\nshort\n");
        let out = scan_block(text.as_bytes(), &cfg);
        assert_eq!(out.lines, 5);
        assert_eq!(out.kept.len(), 1);
        assert_eq!(out.kept[0].2, "a is a type of b");
        let lines: Vec<u64> = out.failures.iter().map(|f| f.0).collect();
        assert_eq!(lines, vec![3, 5], "{:?}", out.failures);
        assert_eq!(out.antonyms, vec![("hot".to_string(), "cold".to_string())]);
        let kept_only = ScanCfg { check_all: false, ..cfg };
        assert_eq!(scan_block(text.as_bytes(), &kept_only).failures.len(), 1, "a dropped line's JSON is not checked");
        assert_eq!(scan_block(b"x\ty", &kept_only).lines, 1, "a last line without a newline counts");
    }
}
