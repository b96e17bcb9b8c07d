//! The RoleMRC data plan: which profile, triplet, seed script, rule and variant
//! every synthesized sample uses, and the LLM requests that produce it (§3.2,
//! Figure 3, Table 2). Pure and deterministic: the same profiles, seeds, rules,
//! counts and pipeline seed always give the same plan.
//!
//! Categories and the eight single-turn types:
//!
//! | type | triplet | answerable | naive answer            | narration |
//! |------|---------|------------|-------------------------|-----------|
//! | 1, 2 | most    | yes        | ground truth            | 1 with, 2 without |
//! | 3, 4 | most    | no         | "no_answer" seed        | 3 with, 4 without |
//! | 5, 6 | least   | yes        | "refusal" seed          | 5 with, 6 without |
//! | 7, 8 | least   | yes        | "attempt" seed + answer | 7 with, 8 without |
//!
//! Ruled chats extend them: multi-turn adds an "omnipotence" user turn to 3–6
//! (3/4 refuse again with another no_answer seed, 5/6 attempt); nested adds a
//! "formatting" or "output_constraint" system rule to 1–4 and rewrites the reply;
//! prioritized adds a "domain_ban" system rule to 1/2 and answers with a
//! "system_ban" seed.

use std::collections::BTreeMap;

use rand::RngExt;
use serde::{Deserialize, Serialize};

use synth_core::rng::record_rng;

/// Train counts per category (each split evenly over its types), as Table 2.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Counts {
    pub free_chat: usize,
    pub onscene_chat: usize,
    pub answer: usize,
    pub no_answer: usize,
    pub refusal: usize,
    pub attempt: usize,
    pub multi_turn: usize,
    pub nested: usize,
    pub prioritized: usize,
}

impl Default for Counts {
    fn default() -> Self {
        Counts {
            free_chat: 5000,
            onscene_chat: 5000,
            answer: 2000,
            no_answer: 2000,
            refusal: 2000,
            attempt: 2000,
            multi_turn: 2000,
            nested: 1600,
            prioritized: 2400,
        }
    }
}

/// Held-out test counts, as the official release: 100 per single-turn type and per
/// multi-turn task, and per narration setting `[with, without]` the nested
/// special-content / special-format rows and the prioritized rows.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TestCounts {
    pub per_task: usize,
    pub nested_content: [usize; 2],
    pub nested_format: [usize; 2],
    pub prioritized: [usize; 2],
}

impl Default for TestCounts {
    fn default() -> Self {
        TestCounts { per_task: 100, nested_content: [20, 22], nested_format: [58, 58], prioritized: [22, 20] }
    }
}

/// Spare instances per sample group (a category's type × split), planned after the
/// counted ones: `rolemrc_assemble` uses them, in order, in place of instances that
/// failed (e.g. a degenerate preference pair after its re-asks), so the configured counts
/// are still met; unused spares are kept apart (split `spare`).
#[derive(Debug, Clone, Copy, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Spares {
    /// Spares as a share of the group's count, rounded up.
    pub ratio: f64,
    /// At least this many per group that has any sample.
    pub min: usize,
}

impl Default for Spares {
    fn default() -> Self {
        Spares { ratio: 0.02, min: 1 }
    }
}

impl Spares {
    /// Spares for a group of `n` counted samples (none for an empty group).
    pub fn for_count(&self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        ((n as f64 * self.ratio).ceil() as usize).max(self.min)
    }
}

/// One MRC triplet as matched to a profile.
#[derive(Debug, Clone, Default)]
pub struct Triplet {
    pub id: String,
    pub question: String,
    pub passages: String,
    pub answer: String,
    pub answerable: bool,
}

/// One meta-pool entry: a standardized profile with its two matches.
#[derive(Debug, Clone, Default)]
pub struct Profile {
    pub id: String,
    pub role_name: String,
    pub text: String,
    pub text_no_narration: String,
    pub most: Option<Triplet>,
    pub least: Option<Triplet>,
}

/// A seed script or a rule (`seeds/`, `rules/`).
#[derive(Debug, Clone, Deserialize)]
pub struct Script {
    pub id: String,
    pub category: String,
    pub text: String,
}

/// The seed categories and rule categories the plan needs.
pub const SEED_CATEGORIES: &[&str] = &["no_answer", "refusal", "attempt", "system_ban"];
pub const RULE_CATEGORIES: &[&str] = &["omnipotence", "formatting", "output_constraint", "domain_ban"];

/// Sample categories in Table 2 order.
pub const CATEGORIES: &[&str] =
    &["free_chat", "onscene_chat", "answer", "no_answer", "refusal", "attempt", "multi_turn", "nested", "prioritized"];

/// The official task label of a single-turn type (1–8).
pub fn base_task(ty: u8) -> &'static str {
    match ty {
        1 => "role_related_mrc_answer_with_narration",
        2 => "role_related_mrc_answer_no_narration",
        3 => "role_related_mrc_refused_with_narration",
        4 => "role_related_mrc_refused_no_narration",
        5 => "role_unrelated_mrc_refused_with_narration",
        6 => "role_unrelated_mrc_refused_no_narration",
        7 => "role_unrelated_mrc_answer_with_narration",
        8 => "role_unrelated_mrc_answer_no_narration",
        _ => panic!("single-turn types are 1..=8, not {ty}"),
    }
}

/// Single-turn category of a type.
pub fn single_category(ty: u8) -> &'static str {
    match ty {
        1 | 2 => "answer",
        3 | 4 => "no_answer",
        5 | 6 => "refusal",
        7 | 8 => "attempt",
        _ => panic!("single-turn types are 1..=8, not {ty}"),
    }
}

/// Seed category whose script is the naive answer of a type (None: the ground truth).
pub fn seed_category(ty: u8) -> Option<&'static str> {
    match single_category(ty) {
        "answer" => None,
        c => Some(c),
    }
}

/// Odd types keep narration.
pub fn with_narration(ty: u8) -> bool {
    ty % 2 == 1
}

/// Types 1–4 use the most relevant triplet, 5–8 the least relevant one.
pub fn uses_most(ty: u8) -> bool {
    ty <= 4
}

/// One LLM request of the plan, with the metadata of the sample it belongs to.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Request {
    /// `<instance>/<part>`.
    pub id: String,
    pub instance: String,
    /// The sample group `<category key>/<split>` (e.g. `answer-1/train`): spares replace
    /// failed instances within their group.
    pub group: String,
    /// Planned as a spare (used only to replace a failed instance of its group).
    pub spare: bool,
    /// `dialogue`, `reply` (final single reply), `reply2` (multi-turn second reply), `base` (nested, before rewrite).
    pub part: String,
    /// Prompt template: `free_chat`, `onscene_chat`, `stylize`, `rewrite`.
    pub prompt: String,
    /// For `rewrite`: the request whose reply is rewritten.
    pub base_id: String,
    pub split: String,
    pub category: String,
    /// Single-turn type 1–8 (0 for chats).
    pub r#type: i64,
    pub task: String,
    pub narration: bool,
    /// Who speaks first in a dialogue: `role` or `user` (`any` elsewhere).
    pub first: String,
    pub profile_id: String,
    pub role_name: String,
    /// The profile text, with or without narration in its speech examples.
    pub profile: String,
    pub triplet_id: String,
    pub passages: String,
    pub question: String,
    /// The naive answer this request stylizes.
    pub answer: String,
    /// The ground-truth answer of the triplet.
    pub reference_answer: String,
    /// For `rewrite`: the system format rule the reply must follow.
    pub format: String,
    /// System rule added to the role's system prompt (nested, prioritized).
    pub system_rule: String,
    /// The second user turn (multi-turn).
    pub user2: String,
    /// The raw (unstylized) answer of the sample's final turn: the DPO rejected side.
    pub rejected: String,
    pub seed_id: String,
    pub seed2_id: String,
    pub rule_id: String,
}

/// How the plan went: requests and what had to be reused.
#[derive(Debug, Default)]
pub struct Plan {
    pub requests: Vec<Request>,
    /// Samples per (split, category), spares not counted.
    pub samples: BTreeMap<(String, String), usize>,
    /// Spare instances planned.
    pub spares: usize,
    /// Samples that had to reuse a profile because the pool was smaller than asked.
    pub reused: usize,
    /// Categories that asked for samples but had no eligible profile.
    pub empty_pools: Vec<String>,
}

pub struct Planner<'a> {
    pub seed: u64,
    pub stage: &'a str,
    pub counts: &'a Counts,
    pub test: &'a TestCounts,
    pub seeds: BTreeMap<String, Vec<Script>>,
    pub rules: BTreeMap<String, Vec<Script>>,
    /// Between an attempt seed and the answer it introduces.
    pub attempt_join: &'a str,
    pub spares: Spares,
}

/// Split `total` over `k` parts, the first ones taking the remainder.
fn split_even(total: usize, k: usize) -> Vec<usize> {
    (0..k).map(|i| total / k + usize::from(i < total % k)).collect()
}

/// One sample to build: which pool, type, split and extra kind.
#[derive(Clone, Copy)]
enum Kind {
    Free,
    OnScene,
    Single(u8),
    Multi(u8),
    /// Nested with a formatting rule (`true`) or an output constraint (`false`); `None`: drawn.
    Nested(u8, Option<bool>),
    Prioritized(u8),
}

impl Planner<'_> {
    /// Check that the categories the counts need are present.
    pub fn check(&self) -> Result<(), String> {
        let c = self.counts;
        let t = self.test;
        let need_seed = [
            ("no_answer", c.no_answer + c.multi_turn + c.nested + t.per_task),
            ("refusal", c.refusal + c.multi_turn + t.per_task),
            ("attempt", c.attempt + c.multi_turn + t.per_task),
            ("system_ban", c.prioritized + t.prioritized.iter().sum::<usize>()),
        ];
        for (cat, n) in need_seed {
            if n > 0 && self.seeds.get(cat).is_none_or(Vec::is_empty) {
                return Err(format!("no seed script of category \"{cat}\""));
            }
        }
        let need_rule = [
            ("omnipotence", c.multi_turn + t.per_task),
            ("domain_ban", c.prioritized + t.prioritized.iter().sum::<usize>()),
            ("formatting", t.nested_format.iter().sum::<usize>()),
            ("output_constraint", t.nested_content.iter().sum::<usize>()),
        ];
        for (cat, n) in need_rule {
            if n > 0 && self.rules.get(cat).is_none_or(Vec::is_empty) {
                return Err(format!("no rule of category \"{cat}\""));
            }
        }
        if c.nested > 0
            && self.rules.get("formatting").is_none_or(Vec::is_empty)
            && self.rules.get("output_constraint").is_none_or(Vec::is_empty)
        {
            return Err("no rule of category \"formatting\" or \"output_constraint\"".into());
        }
        Ok(())
    }

    pub fn plan(&self, profiles: &[Profile]) -> Plan {
        let mut plan = Plan::default();
        // Pools by what a type needs.
        let answerable_most: Vec<&Profile> =
            profiles.iter().filter(|p| p.most.as_ref().is_some_and(|t| t.answerable)).collect();
        let unanswerable_most: Vec<&Profile> =
            profiles.iter().filter(|p| p.most.as_ref().is_some_and(|t| !t.answerable)).collect();
        let answerable_least: Vec<&Profile> =
            profiles.iter().filter(|p| p.least.as_ref().is_some_and(|t| t.answerable)).collect();
        let all: Vec<&Profile> = profiles.iter().collect();
        let with_most: Vec<&Profile> = profiles.iter().filter(|p| p.most.is_some()).collect();
        let pool = |ty: u8| -> &Vec<&Profile> {
            match ty {
                1 | 2 => &answerable_most,
                3 | 4 => &unanswerable_most,
                _ => &answerable_least,
            }
        };
        let (c, t) = (self.counts, self.test);
        // (group key, pool, kind, test count, train count)
        let mut groups: Vec<(String, &Vec<&Profile>, Kind, usize, usize)> = Vec::new();
        groups.push(("free_chat".into(), &all, Kind::Free, 0, c.free_chat));
        groups.push(("onscene_chat".into(), &with_most, Kind::OnScene, 0, c.onscene_chat));
        for (cat, total, types) in [
            ("answer", c.answer, [1u8, 2]),
            ("no_answer", c.no_answer, [3, 4]),
            ("refusal", c.refusal, [5, 6]),
            ("attempt", c.attempt, [7, 8]),
        ] {
            for (ty, n) in types.iter().zip(split_even(total, 2)) {
                groups.push((format!("{cat}-{ty}"), pool(*ty), Kind::Single(*ty), t.per_task, n));
            }
        }
        for (ty, n) in [3u8, 4, 5, 6].iter().zip(split_even(c.multi_turn, 4)) {
            groups.push((format!("multi_turn-{ty}"), pool(*ty), Kind::Multi(*ty), t.per_task, n));
        }
        for (ty, n) in [1u8, 2, 3, 4].iter().zip(split_even(c.nested, 4)) {
            groups.push((format!("nested-{ty}"), pool(*ty), Kind::Nested(*ty, None), 0, n));
        }
        // Test nested rows per narration setting, spread over the two types of that setting.
        for (w, (tys, name)) in [([1u8, 3], "with"), ([2, 4], "no")].iter().enumerate() {
            for (format, counts) in [(true, t.nested_format), (false, t.nested_content)] {
                for (ty, n) in tys.iter().zip(split_even(counts[w], 2)) {
                    let kind = if format { "format" } else { "content" };
                    groups.push((
                        format!("nested-{ty}-{kind}-{name}"),
                        pool(*ty),
                        Kind::Nested(*ty, Some(format)),
                        n,
                        0,
                    ));
                }
            }
        }
        for (ty, n) in [1u8, 2].iter().zip(split_even(c.prioritized, 2)) {
            let test_n = t.prioritized[usize::from(*ty == 2)];
            groups.push((format!("prioritized-{ty}"), pool(*ty), Kind::Prioritized(*ty), test_n, n));
        }

        for (key, pool, kind, n_test, n_train) in groups {
            if n_test + n_train == 0 {
                continue;
            }
            if pool.is_empty() {
                plan.empty_pools.push(key);
                continue;
            }
            // A seeded order of the pool: test takes the first profiles, train the next.
            let mut order: Vec<usize> = (0..pool.len()).collect();
            let mut rng = record_rng(self.seed, self.stage, &key, "pool");
            for i in (1..order.len()).rev() {
                let j = rng.random_range(0..=i);
                order.swap(i, j);
            }
            let (s_test, s_train) = (self.spares.for_count(n_test), self.spares.for_count(n_train));
            let total = n_test + n_train + s_test + s_train;
            if total > pool.len() {
                plan.reused += total - pool.len();
            }
            // The counted samples first (test, then train), then the spares (test, then
            // train), so spares never change which profile a counted sample draws.
            for k in 0..total {
                let (split, idx, spare) = if k < n_test {
                    ("test", k, false)
                } else if k < n_test + n_train {
                    ("train", k - n_test, false)
                } else if k < n_test + n_train + s_test {
                    ("test", n_test + (k - n_test - n_train), true)
                } else {
                    ("train", n_train + (k - n_test - n_train - s_test), true)
                };
                let profile = pool[order[k % pool.len()]];
                let instance = format!("{key}-{split}-{idx:05}");
                let before = plan.requests.len();
                self.sample(&mut plan.requests, &instance, split, kind, idx, profile);
                for r in &mut plan.requests[before..] {
                    r.group = format!("{key}/{split}");
                    r.spare = spare;
                }
                if plan.requests.len() > before {
                    if spare {
                        plan.spares += 1;
                    } else {
                        let cat = plan.requests[before].category.clone();
                        *plan.samples.entry((split.to_string(), cat)).or_default() += 1;
                    }
                }
            }
        }
        plan
    }

    fn pick<'s>(&self, list: &'s [Script], instance: &str, purpose: &str, avoid: Option<&str>) -> &'s Script {
        let mut rng = record_rng(self.seed, self.stage, instance, purpose);
        let i = rng.random_range(0..list.len());
        if avoid == Some(list[i].id.as_str()) && list.len() > 1 {
            return &list[(i + 1 + rng.random_range(0..list.len() - 1)) % list.len()];
        }
        &list[i]
    }

    fn seed_of(&self, cat: &str, instance: &str, purpose: &str, avoid: Option<&str>) -> &Script {
        self.pick(&self.seeds[cat], instance, purpose, avoid)
    }

    /// The naive answer of a single-turn type for a triplet, and the seed used.
    fn naive(&self, ty: u8, triplet: &Triplet, instance: &str, purpose: &str, avoid: Option<&str>) -> (String, String) {
        match seed_category(ty) {
            None => (triplet.answer.clone(), String::new()),
            Some("attempt") => {
                let s = self.seed_of("attempt", instance, purpose, avoid);
                (format!("{}{}{}", s.text, self.attempt_join, triplet.answer), s.id.clone())
            }
            Some(cat) => {
                let s = self.seed_of(cat, instance, purpose, avoid);
                (s.text.clone(), s.id.clone())
            }
        }
    }

    fn sample(&self, out: &mut Vec<Request>, instance: &str, split: &str, kind: Kind, idx: usize, p: &Profile) {
        let base = |narration: bool| Request {
            instance: instance.to_string(),
            split: split.to_string(),
            narration,
            first: "any".into(),
            profile_id: p.id.clone(),
            role_name: p.role_name.clone(),
            profile: if narration { p.text.clone() } else { p.text_no_narration.clone() },
            ..Default::default()
        };
        let with_triplet = |mut r: Request, t: &Triplet| {
            r.triplet_id = t.id.clone();
            r.passages = t.passages.clone();
            r.question = t.question.clone();
            r.reference_answer = t.answer.clone();
            r
        };
        match kind {
            Kind::Free | Kind::OnScene => {
                // Four equal variants: role or user first × with or without narration.
                let first = if idx.is_multiple_of(2) { "role" } else { "user" };
                let narration = (idx / 2).is_multiple_of(2);
                let mut r = base(narration);
                let onscene = matches!(kind, Kind::OnScene);
                if onscene {
                    r = with_triplet(r, p.most.as_ref().expect("pool has most"));
                }
                r.first = first.into();
                r.category = if onscene { "onscene_chat" } else { "free_chat" }.into();
                r.prompt = r.category.clone();
                r.part = "dialogue".into();
                let scene = if onscene { "related" } else { "free" };
                let nar = if narration { "with_narration" } else { "no_narration" };
                r.task = format!("role_{scene}_dialogue---{first}_first---{nar}");
                if onscene {
                    r.task.push_str("---answer");
                }
                r.id = format!("{instance}/dialogue");
                out.push(r);
            }
            Kind::Single(ty) | Kind::Multi(ty) | Kind::Nested(ty, _) | Kind::Prioritized(ty) => {
                let t = if uses_most(ty) { p.most.as_ref() } else { p.least.as_ref() }.expect("pool has triplet");
                let mut r = with_triplet(base(with_narration(ty)), t);
                r.r#type = ty as i64;
                r.prompt = "stylize".into();
                let (naive, seed_id) = self.naive(ty, t, instance, "seed", None);
                r.answer = naive.clone();
                r.seed_id = seed_id.clone();
                r.rejected = naive;
                match kind {
                    Kind::Single(_) => {
                        r.category = single_category(ty).into();
                        r.task = base_task(ty).into();
                        r.part = "reply".into();
                        r.id = format!("{instance}/reply");
                        out.push(r);
                    }
                    Kind::Multi(_) => {
                        r.category = "multi_turn".into();
                        let (suffix, ty2) = if ty <= 4 { ("-2ndrefused", ty) } else { ("-2ndanswer", ty + 2) };
                        r.task = format!("{}{suffix}", base_task(ty));
                        let rule = self.pick(&self.rules["omnipotence"], instance, "omnipotence", None);
                        r.user2 = rule.text.clone();
                        r.rule_id = rule.id.clone();
                        let (naive2, seed2) = self.naive(ty2, t, instance, "seed2", Some(&seed_id));
                        r.rejected = naive2.clone();
                        r.seed2_id = seed2;
                        r.part = "reply".into();
                        r.id = format!("{instance}/reply");
                        let mut r2 = r.clone();
                        r2.part = "reply2".into();
                        r2.id = format!("{instance}/reply2");
                        r2.answer = naive2;
                        out.push(r);
                        out.push(r2);
                    }
                    Kind::Nested(_, format) => {
                        r.category = "nested".into();
                        let format = format.unwrap_or_else(|| {
                            // Draw from the union of both rule categories.
                            let nf = self.rules.get("formatting").map_or(0, Vec::len);
                            let nc = self.rules.get("output_constraint").map_or(0, Vec::len);
                            let mut rng = record_rng(self.seed, self.stage, instance, "nested-kind");
                            rng.random_range(0..nf + nc) < nf
                        });
                        let cat = if format { "formatting" } else { "output_constraint" };
                        let rule = self.pick(&self.rules[cat], instance, "rule", None);
                        let suffix = if format { "-special-format" } else { "-special-content" };
                        r.task = format!("{}{suffix}", base_task(ty));
                        r.system_rule = rule.text.clone();
                        r.rule_id = rule.id.clone();
                        r.part = "base".into();
                        r.id = format!("{instance}/base");
                        let mut rw = r.clone();
                        rw.prompt = "rewrite".into();
                        rw.part = "reply".into();
                        rw.id = format!("{instance}/reply");
                        rw.base_id = r.id.clone();
                        rw.format = rule.text.clone();
                        // DPO rejected: the stylized reply before the rewrite (filled at assembly).
                        rw.rejected = String::new();
                        r.rejected = String::new();
                        out.push(r);
                        out.push(rw);
                    }
                    Kind::Prioritized(_) => {
                        r.category = "prioritized".into();
                        r.task = format!("{}-refused", base_task(ty));
                        let rule = self.pick(&self.rules["domain_ban"], instance, "rule", None);
                        r.system_rule = rule.text.clone();
                        r.rule_id = rule.id.clone();
                        let s = self.seed_of("system_ban", instance, "seed", None);
                        r.answer = s.text.clone();
                        r.rejected = s.text.clone();
                        r.seed_id = s.id.clone();
                        r.part = "reply".into();
                        r.id = format!("{instance}/reply");
                        out.push(r);
                    }
                    _ => unreachable!(),
                }
            }
        }
    }
}

/// Parse a JSONL file of scripts (`{"id", "category", "text"}`), grouped by category;
/// errors name the line.
pub fn read_scripts(path: &std::path::Path, known: &[&str]) -> Result<BTreeMap<String, Vec<Script>>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out: BTreeMap<String, Vec<Script>> = BTreeMap::new();
    let mut ids = std::collections::BTreeSet::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("{}:{}", path.display(), n + 1);
        let s: Script = serde_json::from_str(line).map_err(|e| format!("{at}: {e}"))?;
        if !known.contains(&s.category.as_str()) {
            return Err(format!(
                "{at}: field \"category\": unknown category \"{}\" (known: {})",
                s.category,
                known.join(", ")
            ));
        }
        if s.text.trim().is_empty() {
            return Err(format!("{at}: field \"text\": empty"));
        }
        if !ids.insert(s.id.clone()) {
            return Err(format!("{at}: field \"id\": duplicate id \"{}\"", s.id));
        }
        out.entry(s.category.clone()).or_default().push(s);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scripts(cat: &str, n: usize) -> Vec<Script> {
        (0..n)
            .map(|i| Script { id: format!("{cat}-{i:02}"), category: cat.into(), text: format!("{cat} text {i}") })
            .collect()
    }

    fn profiles(n: usize) -> Vec<Profile> {
        (0..n)
            .map(|i| {
                let t = |tag: &str, answerable: bool| Triplet {
                    id: format!("{tag}-{i}"),
                    question: format!("question {i}?"),
                    passages: "[1] text".into(),
                    answer: if answerable { format!("answer {i}") } else { "No Answer Present.".into() },
                    answerable,
                };
                Profile {
                    id: format!("p{i}"),
                    role_name: format!("Role {i}"),
                    text: "profile (with narration)".into(),
                    text_no_narration: "profile".into(),
                    // A third of the profiles match an unanswerable most relevant triplet.
                    most: Some(t("most", i % 3 != 0)),
                    least: Some(t("least", true)),
                }
            })
            .collect()
    }

    fn planner<'a>(counts: &'a Counts, test: &'a TestCounts) -> Planner<'a> {
        let mut seeds = BTreeMap::new();
        for (c, n) in [("no_answer", 10), ("refusal", 10), ("attempt", 10), ("system_ban", 5)] {
            seeds.insert(c.to_string(), scripts(c, n));
        }
        let mut rules = BTreeMap::new();
        for (c, n) in [("omnipotence", 10), ("formatting", 5), ("output_constraint", 15), ("domain_ban", 15)] {
            rules.insert(c.to_string(), scripts(c, n));
        }
        Planner { seed: 7, stage: "plan", counts, test, seeds, rules, attempt_join: " ", spares: Spares::default() }
    }

    #[test]
    fn default_counts_reproduce_table_2_and_the_official_test_mix() {
        let (counts, test) = (Counts::default(), TestCounts::default());
        let plan = planner(&counts, &test).plan(&profiles(10_200));
        let n = |split: &str, cat: &str| plan.samples.get(&(split.to_string(), cat.to_string())).copied().unwrap_or(0);
        for (cat, want) in [
            ("free_chat", 5000),
            ("onscene_chat", 5000),
            ("answer", 2000),
            ("no_answer", 2000),
            ("refusal", 2000),
            ("attempt", 2000),
            ("multi_turn", 2000),
            ("nested", 1600),
            ("prioritized", 2400),
        ] {
            assert_eq!(n("train", cat), want, "train {cat}");
        }
        let test_total: usize = plan.samples.iter().filter(|((s, _), _)| s == "test").map(|(_, v)| v).sum();
        assert_eq!(test_total, 1400);
        let mut per_task: BTreeMap<&str, usize> = BTreeMap::new();
        for r in plan.requests.iter().filter(|r| r.split == "test" && r.part == "reply" && !r.spare) {
            *per_task.entry(r.task.as_str()).or_default() += 1;
        }
        assert_eq!(per_task.len(), 12 + 8 + 2, "{per_task:?}");
        for ty in 1..=8u8 {
            assert_eq!(per_task[base_task(ty)], 100);
        }
        assert_eq!(per_task["role_related_mrc_refused_with_narration-2ndrefused"], 100);
        assert_eq!(per_task["role_unrelated_mrc_refused_no_narration-2ndanswer"], 100);
        let with = |suffix: &str| -> usize {
            per_task.iter().filter(|(t, _)| t.contains("with_narration") && t.ends_with(suffix)).map(|(_, n)| n).sum()
        };
        let without = |suffix: &str| -> usize {
            per_task.iter().filter(|(t, _)| t.contains("no_narration") && t.ends_with(suffix)).map(|(_, n)| n).sum()
        };
        assert_eq!((with("-special-content"), with("-special-format"), with("-refused")), (20, 58, 22));
        assert_eq!((without("-special-content"), without("-special-format"), without("-refused")), (22, 58, 20));
        assert_eq!(plan.reused, 0);
    }

    #[test]
    fn categories_map_to_their_seeds_rules_and_triplets() {
        let (counts, test) = (Counts::default(), TestCounts::default());
        let plan = planner(&counts, &test).plan(&profiles(10_200));
        for r in &plan.requests {
            let prefix = |id: &str| id.rsplit_once('-').map(|(p, _)| p.to_string()).unwrap_or_default();
            match (r.category.as_str(), r.r#type as u8) {
                ("free_chat" | "onscene_chat", 0) => {
                    assert!(r.seed_id.is_empty() && r.rule_id.is_empty());
                    assert!(r.first == "role" || r.first == "user");
                    assert_eq!(r.category == "onscene_chat", !r.passages.is_empty());
                }
                (_, ty) if r.category != "prioritized" && (1..=8).contains(&ty) => {
                    assert_eq!(r.narration, ty % 2 == 1, "{}", r.id);
                    assert_eq!(r.triplet_id.starts_with("most"), ty <= 4, "{}", r.id);
                    match seed_category(ty) {
                        None => assert!(r.seed_id.is_empty() && r.answer.starts_with("answer")),
                        Some(cat) => assert_eq!(prefix(&r.seed_id), cat, "{}", r.id),
                    }
                    if ty >= 7 && r.part != "base" {
                        assert!(r.answer.ends_with(&r.reference_answer), "attempt = seed + answer: {}", r.answer);
                    }
                    if ty >= 5 || ty <= 2 {
                        assert!(!r.reference_answer.contains("No Answer"), "{}", r.id);
                    } else {
                        assert_eq!(r.reference_answer, "No Answer Present.");
                    }
                    match r.category.as_str() {
                        "multi_turn" => {
                            assert!((3..=6).contains(&ty));
                            assert_eq!(prefix(&r.rule_id), "omnipotence");
                            assert_eq!(r.user2.split(' ').next().unwrap(), "omnipotence");
                            let want = if ty <= 4 { "no_answer" } else { "attempt" };
                            assert_eq!(prefix(&r.seed2_id), want);
                            assert_ne!(r.seed2_id, r.seed_id, "the second refusal uses another script");
                            assert!(r.task.ends_with(if ty <= 4 { "-2ndrefused" } else { "-2ndanswer" }));
                        }
                        "nested" => {
                            assert!((1..=4).contains(&ty));
                            let cat = prefix(&r.rule_id);
                            let suffix = if cat == "formatting" { "-special-format" } else { "-special-content" };
                            assert!(cat == "formatting" || cat == "output_constraint");
                            assert!(r.task.ends_with(suffix), "{} {}", r.task, cat);
                            assert_eq!(r.prompt, if r.part == "base" { "stylize" } else { "rewrite" });
                        }
                        cat => {
                            assert_eq!(cat, single_category(ty));
                            assert_eq!(r.task, base_task(ty));
                        }
                    }
                }
                ("prioritized", ty) => {
                    assert!(ty == 1 || ty == 2);
                    assert_eq!(prefix(&r.rule_id), "domain_ban");
                    assert_eq!(prefix(&r.seed_id), "system_ban");
                    assert_eq!(r.answer, r.rejected);
                    assert!(r.task.ends_with("-refused"));
                }
                other => panic!("unexpected {other:?} for {}", r.id),
            }
        }
    }

    #[test]
    fn plans_are_deterministic_and_test_profiles_come_first() {
        let counts = Counts { free_chat: 8, onscene_chat: 8, answer: 6, ..Counts::default() };
        let test = TestCounts { per_task: 2, ..TestCounts::default() };
        let p = profiles(300);
        let a = planner(&counts, &test).plan(&p);
        let b = planner(&counts, &test).plan(&p);
        let ids = |pl: &Plan| {
            pl.requests.iter().map(|r| (r.id.clone(), r.profile_id.clone(), r.seed_id.clone())).collect::<Vec<_>>()
        };
        assert_eq!(ids(&a), ids(&b));
        let mut other = planner(&counts, &test);
        other.seed = 8;
        assert_ne!(ids(&a), ids(&other.plan(&p)), "the pipeline seed changes the draw");
        // Within one type, test and train use different profiles when the pool allows it.
        let test_profiles: std::collections::BTreeSet<_> = a
            .requests
            .iter()
            .filter(|r| r.split == "test" && r.r#type == 1 && r.category == "answer")
            .map(|r| &r.profile_id)
            .collect();
        assert!(
            a.requests
                .iter()
                .filter(|r| r.split == "train" && r.r#type == 1 && r.category == "answer")
                .all(|r| !test_profiles.contains(&r.profile_id))
        );
        // Chats: the four variants in equal shares.
        let mut variants = BTreeMap::new();
        for r in a.requests.iter().filter(|r| r.category == "free_chat" && !r.spare) {
            *variants.entry((r.first.clone(), r.narration)).or_insert(0) += 1;
        }
        assert_eq!(variants.values().copied().collect::<Vec<_>>(), vec![2, 2, 2, 2]);
    }

    #[test]
    fn spares_follow_the_counted_samples_of_their_group() {
        let counts = Counts { answer: 40, nested: 8, ..Counts::default() };
        let test = TestCounts { per_task: 4, ..TestCounts::default() };
        let p = profiles(300);
        let mut pl = planner(&counts, &test);
        pl.spares = Spares { ratio: 0.1, min: 1 };
        let plan = pl.plan(&p);
        // answer-1: 20 train → 2 spares, 4 test → 1 spare; ids continue the group's numbering.
        let ids = |group: &str, spare: bool| -> Vec<String> {
            let mut v: Vec<String> = plan
                .requests
                .iter()
                .filter(|r| r.group == group && r.spare == spare)
                .map(|r| r.instance.clone())
                .collect();
            v.dedup();
            v
        };
        assert_eq!(ids("answer-1/train", true), ["answer-1-train-00020", "answer-1-train-00021"]);
        assert_eq!(ids("answer-1/test", true), ["answer-1-test-00004"]);
        assert_eq!(ids("answer-1/train", false).len(), 20);
        // Counted samples draw the same profiles with or without spares.
        let mut none = planner(&counts, &test);
        none.spares = Spares { ratio: 0.0, min: 0 };
        let without = none.plan(&p);
        let key = |r: &Request| (r.id.clone(), r.profile_id.clone(), r.seed_id.clone(), r.rule_id.clone());
        let counted: Vec<_> = plan.requests.iter().filter(|r| !r.spare).map(key).collect();
        assert_eq!(counted, without.requests.iter().map(key).collect::<Vec<_>>());
        assert_eq!(without.spares, 0);
        assert_eq!(plan.samples, without.samples, "spares are not counted samples");
        assert!(plan.spares > 0);
        // Every request of an instance is in one group; nested spares have both parts.
        let nested: Vec<&Request> = plan.requests.iter().filter(|r| r.instance == "nested-1-train-00002").collect();
        assert_eq!(nested.len(), 2);
        assert!(nested.iter().all(|r| r.spare && r.group == "nested-1/train"));
        assert_eq!(Spares { ratio: 0.02, min: 1 }.for_count(0), 0);
        assert_eq!(Spares { ratio: 0.02, min: 1 }.for_count(1000), 20);
        assert_eq!(Spares { ratio: 0.02, min: 1 }.for_count(20), 1);
    }

    #[test]
    fn small_pools_are_reused_and_missing_categories_reported() {
        let counts = Counts::default();
        let test = TestCounts::default();
        let mut p = profiles(30);
        for x in &mut p {
            x.most.as_mut().unwrap().answerable = true;
        }
        let plan = planner(&counts, &test).plan(&p);
        assert!(plan.reused > 0);
        assert!(plan.empty_pools.iter().any(|k| k.starts_with("no_answer")), "{:?}", plan.empty_pools);
        let mut pl = planner(&counts, &test);
        pl.seeds.remove("system_ban");
        assert!(pl.check().unwrap_err().contains("system_ban"));
    }

    #[test]
    fn script_files_report_line_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("s.jsonl");
        std::fs::write(&f, "{\"id\":\"a\",\"category\":\"refusal\",\"text\":\"x\"}\n{\"id\":\"b\",\"category\":\"nope\",\"text\":\"y\"}\n").unwrap();
        let e = read_scripts(&f, SEED_CATEGORIES).unwrap_err();
        assert!(e.contains("s.jsonl:2") && e.contains("\"category\"") && e.contains("nope"), "{e}");
        std::fs::write(&f, "{\"id\":\"a\",\"category\":\"refusal\",\"text\":\"x\"}\n{\"id\":\"a\",\"category\":\"refusal\",\"text\":\"y\"}\n").unwrap();
        assert!(read_scripts(&f, SEED_CATEGORIES).unwrap_err().contains("duplicate id"));
    }
}
