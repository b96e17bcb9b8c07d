//! The quality figures of a run, read from its stages' report metrics (`check.<name>.*`
//! of stages with content checks, `rejected.<kind>` and `answers.*` of model stages,
//! `dedup.*`, `review.*`, `dropped.<kind>`): per stage and check, answers checked /
//! failed / re-asked and records dropped; near-duplicates removed; records dropped in
//! review. The manifest's `quality` section and the dataset cards are written from it,
//! so both say what was measured.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{Value, json};

use super::Counts;

/// One stage's figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StageQuality {
    pub stage: String,
    /// Per configured check.
    pub checks: BTreeMap<String, Counts>,
    /// Answers a parser, schema or check rejected, by failure kind (each may have been re-asked).
    pub rejected: BTreeMap<String, u64>,
    /// Records whose answer was accepted first time, after re-asks, or never.
    pub answers: Option<[u64; 3]>,
    /// Candidate answers drawn beside the one taken or re-asked, and not used (`candidates`).
    pub discarded: Option<u64>,
    /// Records compared and near-duplicates removed.
    pub duplicates: Option<[u64; 2]>,
    /// Records with a review decision, and records dropped in review.
    pub review: Option<[u64; 2]>,
    /// Records dropped by the stage, by failure kind (a stage that assembles samples).
    pub dropped: BTreeMap<String, u64>,
}

fn get(m: &BTreeMap<String, f64>, k: &str) -> Option<u64> {
    m.get(k).map(|v| *v as u64)
}

/// A stage's quality figures from its report metrics; `None` when it has none.
pub fn of_stage(stage: &str, m: &BTreeMap<String, f64>) -> Option<StageQuality> {
    let mut q = StageQuality { stage: stage.to_string(), ..Default::default() };
    for (k, v) in m {
        let v = *v as u64;
        if let Some(rest) = k.strip_prefix("check.")
            && let Some((name, figure)) = rest.rsplit_once('.')
        {
            let c = q.checks.entry(name.to_string()).or_default();
            match figure {
                "checked" => c.checked = v,
                "failed" => c.failed = v,
                "reasked" => c.reasked = v,
                "dropped" => c.dropped = v,
                "flagged" => c.flagged = v,
                _ => {}
            }
        } else if let Some(kind) = k.strip_prefix("rejected.") {
            q.rejected.insert(kind.to_string(), v);
        } else if let Some(kind) = k.strip_prefix("dropped.") {
            q.dropped.insert(kind.to_string(), v);
        }
    }
    if let (Some(a), Some(b), Some(c)) =
        (get(m, "answers.first_attempt"), get(m, "answers.after_reask"), get(m, "answers.failed"))
    {
        q.answers = Some([a, b, c]);
    }
    q.discarded = get(m, "answers.discarded");
    if let (Some(a), Some(b)) = (get(m, "dedup.checked"), get(m, "dedup.removed")) {
        q.duplicates = Some([a, b]);
    }
    if let (Some(a), Some(b)) = (get(m, "review.reviewed"), get(m, "review.dropped")) {
        q.review = Some([a, b]);
    }
    let empty = q.checks.is_empty() && q.duplicates.is_none() && q.review.is_none() && q.dropped.is_empty();
    (!empty).then_some(q)
}

impl StageQuality {
    /// The manifest's view of the stage.
    pub fn to_json(&self) -> Value {
        let mut o = serde_json::Map::new();
        if let Some([first, after, failed]) = self.answers {
            let mut a = json!({"first_attempt": first, "after_reask": after, "failed": failed});
            if let Some(d) = self.discarded {
                a["discarded_candidates"] = d.into();
            }
            o.insert("answers".into(), a);
        }
        if !self.rejected.is_empty() {
            o.insert("rejected_answers".into(), json!(self.rejected));
        }
        if !self.checks.is_empty() {
            let checks: serde_json::Map<String, Value> = self
                .checks
                .iter()
                .map(|(n, c)| {
                    (
                        n.clone(),
                        json!({"checked": c.checked, "failed": c.failed, "reasked": c.reasked, "dropped": c.dropped, "flagged": c.flagged}),
                    )
                })
                .collect();
            o.insert("checks".into(), Value::Object(checks));
        }
        if let Some([checked, removed]) = self.duplicates {
            o.insert("near_duplicates".into(), json!({"checked": checked, "removed": removed}));
        }
        if let Some([reviewed, dropped]) = self.review {
            o.insert("review".into(), json!({"reviewed": reviewed, "dropped": dropped}));
        }
        if !self.dropped.is_empty() {
            o.insert("dropped".into(), json!(self.dropped));
        }
        Value::Object(o)
    }
}

/// The manifest's `quality` section: per stage, and totals over the run.
pub fn to_json(stages: &[StageQuality]) -> Value {
    let mut totals = Totals::default();
    for s in stages {
        totals.add(s);
    }
    json!({
        "stages": stages.iter().map(|s| (s.stage.clone(), s.to_json())).collect::<serde_json::Map<_, _>>(),
        "totals": {
            "answers_checked": totals.checked,
            "answers_failing_a_check": totals.failed_answers,
            "reasked_by_checks": totals.reasked,
            "dropped_by_checks": totals.dropped,
            "near_duplicates_removed": totals.duplicates,
            "dropped_in_review": totals.review,
        },
    })
}

/// Sums over stages.
#[derive(Debug, Default, Clone, Copy)]
pub struct Totals {
    /// Answers checked (the largest `checked` of a stage's checks: every check sees every answer).
    pub checked: u64,
    pub failed_answers: u64,
    pub reasked: u64,
    pub dropped: u64,
    pub duplicates: u64,
    pub review: u64,
    pub discarded: u64,
}

impl Totals {
    pub fn add(&mut self, s: &StageQuality) {
        self.checked += s.checks.values().map(|c| c.checked).max().unwrap_or(0);
        self.failed_answers += s.rejected.get("check").copied().unwrap_or(0);
        self.reasked += s.checks.values().map(|c| c.reasked).sum::<u64>();
        self.dropped += s.checks.values().map(|c| c.dropped).sum::<u64>();
        self.duplicates += s.duplicates.map(|d| d[1]).unwrap_or(0);
        self.discarded += s.discarded.unwrap_or(0);
        self.review += s.review.map(|r| r[1]).unwrap_or(0) + s.dropped.get("review").copied().unwrap_or(0);
    }
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The quality section of a dataset card (Markdown, without its heading): a paragraph
/// whose sentences follow from the figures, then a table per stage and check.
pub fn markdown(stages: &[StageQuality]) -> String {
    let mut md = String::new();
    let mut t = Totals::default();
    for s in stages {
        t.add(s);
    }
    let mut said = Vec::new();
    if t.checked == 0 {
        said.push("No content check ran on this data.".to_string());
    } else if t.failed_answers == 0 && t.dropped == 0 {
        said.push(format!("Every one of the {} checked answers passed its content checks.", t.checked));
    } else {
        let mut s = format!(
            "Content checks read {}; {} failed a check: {} asked again",
            plural(t.checked, "answer", "answers"),
            t.failed_answers,
            plural(t.reasked, "answer was", "answers were"),
        );
        if t.dropped > 0 {
            let _ =
                write!(s, ", and {} dropped after the last attempt", plural(t.dropped, "record was", "records were"));
        } else {
            s.push_str(", and no record was dropped by a check");
        }
        s.push('.');
        said.push(s);
    }
    if t.discarded > 0 {
        said.push(format!(
            "{} drawn beside another of the same ask (`candidates`) and not used: an earlier-numbered one passed, or the first was asked again.",
            plural(t.discarded, "candidate answer was", "candidate answers were")
        ));
    }
    let compared: u64 = stages.iter().filter_map(|s| s.duplicates.map(|d| d[0])).sum();
    if compared > 0 {
        said.push(if t.duplicates == 0 {
            format!("No near-duplicate was found among {} records compared.", compared)
        } else {
            format!(
                "{} removed as near-duplicates of earlier ones ({:.1}% of {} compared).",
                plural(t.duplicates, "record was", "records were"),
                100.0 * t.duplicates as f64 / compared as f64,
                compared
            )
        });
    }
    let reviewed: u64 = stages.iter().filter_map(|s| s.review.map(|r| r[0])).sum();
    if t.review > 0 || reviewed > 0 {
        said.push(format!("{} dropped in human review.", plural(t.review, "record was", "records were")));
    } else {
        said.push("No record has been dropped in human review (review.jsonl).".into());
    }
    writeln!(md, "{}\n", said.join(" ")).expect("string");
    let rows: Vec<(&StageQuality, &String, &Counts)> =
        stages.iter().flat_map(|s| s.checks.iter().map(move |(n, c)| (s, n, c))).collect();
    if !rows.is_empty() {
        writeln!(md, "| Stage | Check | Checked | Failed | Re-asked | Dropped |").expect("string");
        writeln!(md, "|---|---|---:|---:|---:|---:|").expect("string");
        for (s, n, c) in rows {
            let dropped =
                if c.flagged > 0 { format!("{} (flagged {})", c.dropped, c.flagged) } else { c.dropped.to_string() };
            writeln!(md, "| {} | `{n}` | {} | {} | {} | {dropped} |", s.stage, c.checked, c.failed, c.reasked)
                .expect("string");
        }
        writeln!(md).expect("string");
    }
    let other: Vec<String> = stages
        .iter()
        .filter_map(|s| {
            let mut parts = Vec::new();
            if let Some([checked, removed]) = s.duplicates {
                parts.push(format!("{removed} of {checked} removed as near-duplicates"));
            }
            if let Some([reviewed, dropped]) = s.review {
                parts.push(format!("{reviewed} reviewed, {dropped} dropped in review"));
            }
            for (k, n) in &s.dropped {
                parts.push(format!("{n} dropped (`{k}`)"));
            }
            let format_rejected: u64 = s.rejected.iter().filter(|(k, _)| k.as_str() != "check").map(|(_, n)| n).sum();
            if format_rejected > 0 {
                parts.push(format!("{format_rejected} answers rejected by the parser or schema"));
            }
            (!parts.is_empty()).then(|| format!("- {}: {}", s.stage, parts.join("; ")))
        })
        .collect();
    if !other.is_empty() {
        writeln!(md, "{}", other.join("\n")).expect("string");
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_come_from_metrics_and_the_words_follow_them() {
        let m: BTreeMap<String, f64> = [
            ("check.debris.checked", 10.0),
            ("check.debris.failed", 3.0),
            ("check.debris.reasked", 2.0),
            ("check.debris.dropped", 1.0),
            ("check.debris.flagged", 0.0),
            ("rejected.check", 3.0),
            ("rejected.validation", 2.0),
            ("answers.first_attempt", 7.0),
            ("answers.after_reask", 2.0),
            ("answers.failed", 1.0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let q = of_stage("profiles_llm", &m).unwrap();
        assert_eq!(q.checks["debris"], Counts { checked: 10, failed: 3, reasked: 2, dropped: 1, flagged: 0 });
        let dedup: BTreeMap<String, f64> =
            [("dedup.checked".to_string(), 50.0), ("dedup.removed".to_string(), 5.0)].into_iter().collect();
        let d = of_stage("unique", &dedup).unwrap();
        let md = markdown(&[q.clone(), d.clone()]);
        assert!(md.contains("Content checks read 10 answers; 3 failed a check: 2 answers were asked again"), "{md}");
        assert!(md.contains("1 record was dropped after the last attempt"), "{md}");
        assert!(
            md.contains("5 records were removed as near-duplicates of earlier ones (10.0% of 50 compared)"),
            "{md}"
        );
        assert!(md.contains("| profiles_llm | `debris` | 10 | 3 | 2 | 1 |"), "{md}");
        assert!(md.contains("2 answers rejected by the parser or schema"), "{md}");
        assert!(!md.contains("candidate"), "{md}");
        let mut drawn = m.clone();
        drawn.insert("answers.discarded".into(), 4.0);
        let c = of_stage("dialogues", &drawn).unwrap();
        assert_eq!(c.discarded, Some(4));
        assert_eq!(c.to_json()["answers"]["discarded_candidates"], 4);
        let md = markdown(&[c]);
        assert!(md.contains("4 candidate answers were drawn beside another of the same ask"), "{md}");
        let clean: BTreeMap<String, f64> =
            [("check.debris.checked".to_string(), 4.0), ("check.debris.failed".to_string(), 0.0)].into_iter().collect();
        let md = markdown(&[of_stage("s", &clean).unwrap()]);
        assert!(md.contains("Every one of the 4 checked answers passed"), "{md}");
        assert!(of_stage("plain", &BTreeMap::new()).is_none());
        let j = to_json(&[q, d]);
        assert_eq!(j["totals"]["near_duplicates_removed"], 5);
        assert_eq!(j["stages"]["profiles_llm"]["checks"]["debris"]["dropped"], 1);
    }
}
