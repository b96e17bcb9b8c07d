//! `sharp_claims`: claims from ConceptNet assertion dumps (the official 5-column
//! tab-separated layout, plain or gzip — detected by its magic bytes — read as a stream),
//! filtered (language on both ends, relation whitelist, weight, surface text), deduplicated
//! on the assertion URI, sampled (bottom-k on a seeded key of the URI: the same claims
//! whatever the file order) and, for a seeded share, turned counterfactual by the rules of
//! [`crate::methods::sharp::counterfact`]. Memory: the kept URIs' 16-byte hashes and the
//! sample, never the file. A line that does not parse goes to the failure table as
//! `file:line: reason`; dropped edges are counted per reason in the stage report.

use std::collections::{BinaryHeap, HashSet};
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow};
use arrow::datatypes::{DataType, Field, SchemaRef};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::diag::Diagnostics;
use crate::config::options::{OptionSpec, Ty};
use crate::data::{self, Row};
use crate::methods::sharp::conceptnet::{self, Drop, Edge, Filter};
use crate::methods::sharp::counterfact;
use crate::stages::{Arity, BuildCtx, KindInfo, PlanCtx, PrepareCtx, Prepared, Role, RunCtx, Stage};
use crate::store::failures::FailureKind;

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::required("path", Ty::File, "a ConceptNet assertions dump (5 tab-separated columns; .gz read directly)"),
    OptionSpec::default("lang", Ty::Str, "\"en\"", "[R] language of both ends (/c/<lang>/…)"),
    OptionSpec::optional("relations", Ty::StrList, "[R] relation whitelist without /r/ (default: the spec's 17 OMCS relations)"),
    OptionSpec::default("min_weight", Ty::Float(0.0, 1e9), "1.0", "[R] keep edges of at least this weight"),
    OptionSpec::default(
        "no_surface",
        Ty::Enum(&["drop", "fail", "template"]),
        "\"drop\"",
        "[R] an edge without surface text: dropped (counted), a failure row, or rendered from a relation template",
    ),
    OptionSpec::optional("sample", Ty::Int(1, i64::MAX), "claims to keep, seeded (paper: ~1,000 before the counterfactual split); default all"),
    OptionSpec::default(
        "counterfactual_share",
        Ty::Float(0.0, 1.0),
        "0.5",
        "[R] seeded share of the sampled claims made counterfactual (paper: about half)",
    ),
    OptionSpec::default(
        "counterfactual_rules",
        Ty::StrList,
        "[\"negation\", \"absolute_qualifier\", \"antonym\", \"relation_disruption\"]",
        "[R] rules tried from a seeded start in rotation; a claim no rule fits stays factual",
    ),
];

pub static KIND: KindInfo = KindInfo {
    name: "sharp_claims",
    version: 1,
    about: "claims from a ConceptNet assertions dump (plain or gzip, streamed): language / relation / weight / surface-text filter, dedupe, seeded sample, rule-based counterfactuals",
    role: Role::Source,
    arity: Arity::None,
    options: OPTIONS,
    uses_seed: true,
    summary: false,
    example: "path = \"tests/fixtures/sharp/edges.csv\"",
    build,
};

#[derive(Deserialize)]
struct Options {
    path: String,
    lang: String,
    relations: Option<Vec<String>>,
    min_weight: f64,
    no_surface: String,
    sample: Option<u64>,
    counterfactual_share: f64,
    counterfactual_rules: Vec<String>,
}

struct ClaimsStage {
    path: PathBuf,
    filter: Filter,
    fail_no_surface: bool,
    sample: Option<u64>,
    share: f64,
    rules: Vec<String>,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let o: Options = ctx.parse(diags)?;
    let mut ok = true;
    for r in &o.counterfactual_rules {
        if !counterfact::RULES.contains(&r.as_str()) {
            ctx.error(diags, "counterfactual_rules", format!("unknown rule \"{r}\" (rules: {})", counterfact::RULES.join(", ")));
            ok = false;
        }
    }
    if o.counterfactual_share > 0.0 && o.counterfactual_rules.is_empty() {
        ctx.error(diags, "counterfactual_rules", "a counterfactual_share above 0 needs at least one rule");
        ok = false;
    }
    let mut filter = Filter { lang: o.lang, min_weight: o.min_weight, require_surface: o.no_surface != "template", ..Filter::default() };
    if let Some(r) = o.relations {
        filter.relations = r.into_iter().map(|r| r.trim_start_matches("/r/").to_string()).collect();
    }
    ok.then(|| {
        Box::new(ClaimsStage {
            path: ctx.root.join(&o.path),
            filter,
            fail_no_surface: o.no_surface == "fail",
            sample: o.sample,
            share: o.counterfactual_share,
            rules: o.counterfactual_rules,
        }) as Box<dyn Stage>
    })
}

/// Output columns.
pub fn output_schema() -> SchemaRef {
    let s = |n: &str, null: bool| Field::new(n, DataType::Utf8, null);
    data::schema_with_id([
        s("claim", false),
        s("label", false),
        s("cf_rule", true),
        s("factual_claim", false),
        s("lang", false),
        s("rel", false),
        s("start", false),
        s("end", false),
        Field::new("weight", DataType::Float64, false),
        s("dataset", true),
        s("surface_text", true),
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

fn frac(key: u64) -> f64 {
    (key >> 11) as f64 / (1u64 << 53) as f64
}

#[async_trait]
impl Stage for ClaimsStage {
    fn plan(&self, _ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        Some(output_schema())
    }

    async fn prepare(&self, _ctx: &PrepareCtx<'_>) -> Result<Option<Prepared>> {
        Ok(Some(Prepared { files: vec![self.path.clone()], hash_files: true, ..Default::default() }))
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let name = self.path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
        let mut reader = open(&self.path)?;
        let cap = ctx.limit.into_iter().chain(self.sample).min().unwrap_or(u64::MAX) as usize;
        let mut seen: HashSet<[u8; 16]> = HashSet::new();
        let mut heap: BinaryHeap<Kept> = BinaryHeap::new();
        let (mut lines, mut dups) = (0u64, 0u64);
        let mut drops: std::collections::BTreeMap<Drop, u64> = Default::default();
        let mut buf = Vec::new();
        loop {
            buf.clear();
            if reader.read_until(b'\n', &mut buf).with_context(|| format!("reading {}", self.path.display()))? == 0 {
                break;
            }
            lines += 1;
            if lines.is_multiple_of(100_000) && ctx.cancel.is_cancelled() {
                return Err(crate::stages::Cancelled.into());
            }
            let at = format!("{name}:{lines}");
            let text = match std::str::from_utf8(&buf) {
                Ok(t) => t.trim_end_matches(['\n', '\r']),
                Err(e) => {
                    ctx.fail(&at, FailureKind::Parse, format!("{at}: not UTF-8 ({e})"), None);
                    continue;
                }
            };
            if text.trim().is_empty() {
                continue;
            }
            let edge = match conceptnet::parse_line(text) {
                Ok(e) => e,
                Err(why) => {
                    ctx.fail(&at, FailureKind::Parse, format!("{at}: {why}"), Some(text.chars().take(2000).collect()));
                    continue;
                }
            };
            let claim = match self.filter.claim(&edge) {
                Ok(c) => c,
                Err(Drop::NoSurface) if self.fail_no_surface => {
                    ctx.fail(&at, FailureKind::Input, format!("{at}: {} has no surface text", edge.uri), Some(text.chars().take(2000).collect()));
                    continue;
                }
                Err(d) => {
                    *drops.entry(d).or_default() += 1;
                    continue;
                }
            };
            let h = blake3::hash(edge.uri.as_bytes());
            if !seen.insert(h.as_bytes()[..16].try_into().expect("16 bytes")) {
                dups += 1;
                continue;
            }
            let key = ctx.record_key(&edge.uri, "sample");
            if heap.len() < cap {
                heap.push(Kept { key, line: lines, edge, claim });
            } else if heap.peek().is_some_and(|top| key < top.key) {
                heap.pop();
                heap.push(Kept { key, line: lines, edge, claim });
            }
        }
        let mut kept = heap.into_vec();
        kept.sort_by_key(|k| k.line);
        let rows: Vec<Row> = kept.iter().map(|k| self.row(ctx, k, &name)).collect();
        ctx.report.rows_in = lines;
        ctx.report.metrics.insert("duplicates".into(), dups as f64);
        ctx.report.metrics.insert("distinct_claims".into(), seen.len() as f64);
        for (d, n) in drops {
            ctx.report.metrics.insert(format!("dropped_{}", d.name().replace(' ', "_")), n as f64);
        }
        let counterfactual = rows.iter().filter(|r| r["label"] == "counterfactual").count();
        ctx.report.metrics.insert("counterfactual".into(), counterfactual as f64);
        let schema = output_schema();
        let mut out = ctx.create_output(schema.clone())?;
        for chunk in rows.chunks(1024) {
            out.write(&data::rows_to_batch(&schema, chunk).map_err(|(i, e)| anyhow!("row {i}: {e}"))?)?;
        }
        ctx.set_output(out)
    }
}

impl ClaimsStage {
    fn row(&self, ctx: &RunCtx, k: &Kept, file: &str) -> Row {
        let e = &k.edge;
        let mut cf: Option<(String, String)> = None;
        if !self.rules.is_empty() && frac(ctx.record_key(&e.uri, "counterfactual")) < self.share {
            let start = (ctx.record_key(&e.uri, "rule") % self.rules.len() as u64) as usize;
            cf = (0..self.rules.len()).find_map(|i| {
                let rule = &self.rules[(start + i) % self.rules.len()];
                counterfact::apply(rule, &k.claim, e.surface_text.as_deref()).map(|c| (c, rule.clone()))
            });
        }
        let (claim, label, rule) = match cf {
            Some((c, r)) => (c, "counterfactual", Value::String(r)),
            None => (k.claim.clone(), "factual", Value::Null),
        };
        let opt = |v: &Option<String>| v.clone().map(Value::String).unwrap_or(Value::Null);
        Row::from_iter([
            (data::ID.to_string(), json!(e.uri)),
            ("claim".into(), json!(claim)),
            ("label".into(), json!(label)),
            ("cf_rule".into(), rule),
            ("factual_claim".into(), json!(k.claim)),
            ("lang".into(), json!(self.filter.lang)),
            ("rel".into(), json!(e.rel)),
            ("start".into(), json!(e.start)),
            ("end".into(), json!(e.end)),
            ("weight".into(), json!(e.weight)),
            ("dataset".into(), opt(&e.dataset)),
            ("surface_text".into(), opt(&e.surface_text)),
            ("source".into(), json!(format!("{file}:{}", k.line))),
        ])
    }
}
