//! Record quality: content checks that vouch for each record (debris, repetition,
//! echo, language, length, chat rules), near-duplicate removal by MinHash + LSH, and
//! human review decisions read from a file. Pure: no stage, provider or file of a run
//! here; the `llm`, `check`, `dedup` and `review` stage kinds put them to work.

pub mod checks;
pub mod minhash;
pub mod review;
pub mod select;
pub mod summary;
pub mod text;

use std::collections::BTreeMap;

use serde_json::{Map, Value};

pub use checks::{CheckKind, Env, KINDS, Subject};

use synth_core::config::options::{OptionSpec, Ty};

/// What a failed check does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Ask the model again with the reason (a stage without a model drops the record).
    Reask,
    /// Drop the record at once.
    Drop,
    /// Count the failure, keep the record.
    Flag,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Reask => "reask",
            Action::Drop => "drop",
            Action::Flag => "flag",
        }
    }
}

/// A configured check.
struct Named {
    name: String,
    action: Action,
    check: Box<dyn checks::Check>,
    /// `when`: the check applies where this expression (named `name` in `Checks::when`) is true.
    when: bool,
}

/// A stage's checks, in the order configured (a TOML table keeps its order).
#[derive(Default)]
pub struct Checks {
    list: Vec<Named>,
    /// The `when` expressions, by check name.
    when: synth_core::template::Templates,
}

/// What the checks made of one record: the checks it failed, and those that did not
/// apply to it (`when`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Verdict {
    pub failed: Vec<Failed>,
    pub skipped: Vec<String>,
}

impl Verdict {
    /// The failures that keep the record out (all but `flag`).
    pub fn blocking(&self) -> Vec<&Failed> {
        self.failed.iter().filter(|f| f.action != Action::Flag).collect()
    }
}

impl std::fmt::Debug for Checks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.list.iter().map(|n| (&n.name, n.action))).finish()
    }
}

/// One failed check of a record.
#[derive(Debug, Clone, PartialEq)]
pub struct Failed {
    pub check: String,
    pub action: Action,
    pub reason: String,
}

/// A check's figures over a stage: answers (or records) checked, failed, re-asked after
/// failing it, and records dropped with it among the reasons.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counts {
    pub checked: u64,
    pub failed: u64,
    pub reasked: u64,
    pub dropped: u64,
    pub flagged: u64,
}

impl Counts {
    /// The report metrics of check `name` (`check.<name>.<figure>`).
    pub fn metrics(&self, name: &str) -> Vec<(String, f64)> {
        vec![
            (format!("check.{name}.checked"), self.checked as f64),
            (format!("check.{name}.failed"), self.failed as f64),
            (format!("check.{name}.reasked"), self.reasked as f64),
            (format!("check.{name}.dropped"), self.dropped as f64),
            (format!("check.{name}.flagged"), self.flagged as f64),
        ]
    }
}

impl Checks {
    /// Build the checks of a `checks` option (a table: name → options, the name being the
    /// kind unless `kind` says otherwise). Every problem is returned, each with the name
    /// of the entry it belongs to.
    pub fn build(options: &Value, env: &Env<'_>) -> Result<Checks, Vec<(String, String)>> {
        let mut list = Vec::new();
        let mut problems = Vec::new();
        let mut when = synth_core::template::Templates::new();
        let Some(table) = options.as_object() else {
            if options.is_null() {
                return Ok(Checks::default());
            }
            return Err(vec![(String::new(), "checks must be a table: name = { options }".into())]);
        };
        for (name, opts) in table {
            let opts = if opts.is_null() { Value::Object(Map::new()) } else { opts.clone() };
            match build_one(name, &opts, env) {
                Ok(mut n) => {
                    if let Some(expr) = opts.get("when").and_then(Value::as_str) {
                        match when.add_expression(name, expr) {
                            Ok(_) => n.when = true,
                            Err(e) => problems.push((name.clone(), format!("when: bad expression: {e}"))),
                        }
                    }
                    list.push(n)
                }
                Err(msgs) => problems.extend(msgs.into_iter().map(|m| (name.clone(), m))),
            }
        }
        if problems.is_empty() { Ok(Checks { list, when }) } else { Err(problems) }
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The configured check names, in order.
    pub fn names(&self) -> Vec<&str> {
        self.list.iter().map(|n| n.name.as_str()).collect()
    }

    /// Columns the checks read (of the checked fields), for plan-time checks.
    pub fn columns(&self) -> Vec<(String, String)> {
        self.list.iter().flat_map(|n| n.check.columns().into_iter().map(|c| (n.name.clone(), c))).collect()
    }

    /// Every failed check of one record (all checks run, so each is counted). A check
    /// whose `when` is false for the record (or cannot be evaluated on it) is skipped.
    pub fn run(&self, subject: &Subject<'_>) -> Verdict {
        let mut out = Verdict::default();
        for n in &self.list {
            if n.when && !self.when.eval(&n.name, subject.record).is_ok_and(|v| synth_core::template::truthy(&v)) {
                out.skipped.push(n.name.clone());
                continue;
            }
            let problems = n.check.problems(subject);
            if !problems.is_empty() {
                out.failed.push(Failed { check: n.name.clone(), action: n.action, reason: problems.join("; ") });
            }
        }
        out
    }
}

fn build_one(name: &str, opts: &Value, env: &Env<'_>) -> Result<Named, Vec<String>> {
    let Some(obj) = opts.as_object() else {
        return Err(vec![format!("check \"{name}\" must be a table of options, found {opts}")]);
    };
    let kind_name = obj.get("kind").and_then(Value::as_str).unwrap_or(name);
    let Some(kind) = KINDS.iter().find(|k| k.name == kind_name) else {
        let hint = synth_core::config::diag::did_you_mean(kind_name, KINDS.iter().map(|k| k.name)).unwrap_or_default();
        let names: Vec<&str> = KINDS.iter().map(|k| k.name).collect();
        return Err(vec![format!(
            "unknown check kind \"{kind_name}\"{hint} (kinds: {}; an entry named otherwise sets `kind`)",
            names.join(", ")
        )]);
    };
    let mut problems = validate(obj, checks::COMMON, kind.options, kind.name);
    if !problems.is_empty() {
        return Err(problems);
    }
    let filled = with_defaults(obj, kind.options);
    let action = match obj.get("action").and_then(Value::as_str).unwrap_or("reask") {
        "drop" => Action::Drop,
        "flag" => Action::Flag,
        _ => Action::Reask,
    };
    match (kind.build)(&Value::Object(filled), env) {
        Ok(check) => Ok(Named { name: name.to_string(), action, check, when: false }),
        Err(e) => {
            problems.push(format!("check \"{name}\": {e}"));
            Err(problems)
        }
    }
}

fn with_defaults(obj: &Map<String, Value>, specs: &[OptionSpec]) -> Map<String, Value> {
    let mut out = obj.clone();
    for s in specs {
        if !out.contains_key(s.name)
            && let Some(d) = s.default_json()
        {
            out.insert(s.name.to_string(), d);
        }
    }
    out
}

/// Unknown keys (with a did-you-mean), missing required options and values of the wrong
/// type in one check's options.
fn validate(obj: &Map<String, Value>, common: &[OptionSpec], own: &[OptionSpec], kind: &str) -> Vec<String> {
    let mut out = Vec::new();
    let all = || common.iter().chain(own);
    for (k, v) in obj {
        match all().find(|s| s.name == k) {
            None => {
                let hint = synth_core::config::diag::did_you_mean(k, all().map(|s| s.name)).unwrap_or_default();
                out.push(format!("unknown option \"{k}\" of check kind \"{kind}\"{hint}"));
            }
            Some(spec) => {
                if let Err(e) = type_check(v, &spec.ty) {
                    out.push(format!("option \"{k}\": {e}"));
                }
            }
        }
    }
    for s in own {
        if matches!(s.need, synth_core::config::options::Need::Required) && !obj.contains_key(s.name) {
            out.push(format!("check kind \"{kind}\" needs option \"{}\" ({})", s.name, s.ty.describe()));
        }
    }
    out
}

fn type_check(v: &Value, ty: &Ty) -> Result<(), String> {
    let ok = match ty {
        Ty::Str | Ty::File | Ty::OutPath => v.is_string(),
        Ty::Int(lo, hi) => v.as_i64().is_some_and(|n| n >= *lo && n <= *hi),
        Ty::Float(lo, hi) => v.as_f64().is_some_and(|n| n >= *lo && n <= *hi),
        Ty::Bool => v.is_boolean(),
        Ty::Enum(values) => v.as_str().is_some_and(|s| values.contains(&s)),
        Ty::StrList => v.is_string() || v.as_array().is_some_and(|a| a.iter().all(Value::is_string)),
        Ty::List(inner) => match v.as_array() {
            Some(items) => return items.iter().try_for_each(|x| type_check(x, inner)),
            None => false,
        },
        Ty::Map(_) | Ty::Struct(_) => v.is_object(),
        Ty::Files | Ty::Any => true,
    };
    if ok { Ok(()) } else { Err(format!("expected {}, found {v}", ty.describe())) }
}

/// Per-check figures of a stage, accumulated from many records (thread-safe).
#[derive(Default)]
pub struct Tally {
    inner: std::sync::Mutex<BTreeMap<String, Counts>>,
}

impl Tally {
    /// Count one checked answer: each check that applied checked it; `verdict.failed` are
    /// those it failed; `reasked`: it is asked again; `dropped`: its record is dropped
    /// (a failure then counts as a drop, unless the check only flags).
    pub fn count(&self, checks: &Checks, verdict: &Verdict, reasked: bool, dropped: bool) {
        let mut m = self.inner.lock().expect("tally");
        for n in &checks.list {
            let c = m.entry(n.name.clone()).or_default();
            if verdict.skipped.contains(&n.name) {
                continue;
            }
            c.checked += 1;
            if let Some(f) = verdict.failed.iter().find(|f| f.check == n.name) {
                c.failed += 1;
                match f.action {
                    Action::Flag => c.flagged += 1,
                    _ if reasked => c.reasked += 1,
                    _ if dropped => c.dropped += 1,
                    _ => {}
                }
            }
        }
    }

    pub fn counts(&self) -> BTreeMap<String, Counts> {
        self.inner.lock().expect("tally").clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn checks(v: Value, fields: &[&str]) -> Checks {
        let fields: Vec<String> = fields.iter().map(|s| s.to_string()).collect();
        Checks::build(&v, &Env { default_fields: &fields }).unwrap()
    }

    fn verdict(c: &Checks, fields: Value, record: Value) -> Verdict {
        let (f, r) = (fields.as_object().unwrap().clone(), record.as_object().unwrap().clone());
        c.run(&Subject {
            fields: &f,
            record: &r,
            prompt: Some("You are a master of data synthesis. Write the dialogue now please."),
        })
    }

    fn run(c: &Checks, fields: Value, record: Value) -> Vec<Failed> {
        verdict(c, fields, record).failed
    }

    #[test]
    fn bad_options_are_all_reported() {
        let err = Checks::build(
            &json!({"debris": {"min_leters": 2}, "lenght": {}, "echo": {}, "repetition": {"scope": "all"}}),
            &Env { default_fields: &[] },
        )
        .unwrap_err();
        let text = format!("{err:?}");
        assert!(text.contains("did you mean \\\"min_letters\\\""), "{text}");
        assert!(text.contains("unknown check kind \\\"lenght\\\""), "{text}");
        assert!(text.contains("needs option \\\"of\\\""), "{text}");
        assert!(text.contains("option \\\"scope\\\""), "{text}");
    }

    #[test]
    fn crafted_records_fail_the_right_check() {
        let c = checks(
            json!({
                "debris": {"allow_empty": ["narration"]},
                "repetition": {},
                "echo": {"of": ["prompt", "profile"], "n": 4},
                "language": {},
                "length": {"fields": ["reply"], "min_words": 3, "max_words": 80},
            }),
            &["reply", "narration"],
        );
        let rec =
            json!({"profile": "Thorin Ironfoot is a resourceful and imaginative dwarf known for his inventive ideas"});
        let ok =
            run(&c, json!({"reply": "Well, I would start with the garden path first.", "narration": ""}), rec.clone());
        assert!(ok.is_empty(), "{ok:?}");
        let names = |f: Vec<Failed>| f.into_iter().map(|f| f.check).collect::<Vec<_>>();
        assert_eq!(names(run(&c, json!({"reply": "][", "narration": ""}), rec.clone())), ["debris", "length"]);
        assert_eq!(
            names(run(&c, json!({"reply": "I like tea and cake. ".repeat(10), "narration": ""}), rec.clone())),
            ["repetition"]
        );
        assert_eq!(
            names(run(
                &c,
                json!({"reply": "Thorin Ironfoot is a resourceful and imaginative dwarf known for his ideas", "narration": ""}),
                rec.clone()
            )),
            ["echo"]
        );
        assert_eq!(
            names(run(&c, json!({"reply": "这是一个很好的问题，我们明天再谈吧。", "narration": ""}), rec.clone())),
            ["language"]
        );
        let zh = checks(json!({"language": {"language_column": "lang"}}), &["reply"]);
        assert!(run(&zh, json!({"reply": "这是一个很好的问题，我们明天再谈吧。"}), json!({"lang": "zh"})).is_empty());
        assert_eq!(run(&zh, json!({"reply": "这是一个很好的问题，我们明天再谈吧。"}), json!({"lang": "en"})).len(), 1);
        assert_eq!(run(&zh, json!({"reply": "A good question for tomorrow."}), json!({"lang": "zh"})).len(), 1);
        let french = "Je pense que nous devrions commencer par le jardin, puis construire une petite maison pour les oiseaux du quartier.";
        assert_eq!(names(run(&c, json!({"reply": french, "narration": ""}), rec.clone())), ["language"]);
        assert_eq!(names(run(&c, json!({"reply": "Too short", "narration": "x"}), rec)), ["debris", "length"]);
    }

    #[test]
    fn chat_rules() {
        let c = checks(json!({"chat": {"first_column": "first", "min_turns": 2}}), &[]);
        let turns = |roles: &[&str]| json!({"turns": roles.iter().map(|r| json!({"role": r, "content": "hello there"})).collect::<Vec<_>>()});
        assert!(run(&c, turns(&["Assistant", "User"]), json!({"first": "role"})).is_empty());
        let f = run(&c, turns(&["User", "Assistant"]), json!({"first": "role"}));
        assert!(f[0].reason.contains("must begin with the role"), "{f:?}");
        let f = run(&c, turns(&["User", "User"]), json!({"first": "any"}));
        assert!(f[0].reason.contains("twice in a row"), "{f:?}");
        let f = run(&c, turns(&["User"]), json!({}));
        assert!(f[0].reason.contains("at least 2"), "{f:?}");
    }

    #[test]
    fn tally_counts_reasks_drops_and_flags() {
        let c = checks(json!({"debris": {}, "len": {"kind": "length", "min_words": 2, "action": "flag"}}), &["a"]);
        let t = Tally::default();
        let f = verdict(&c, json!({"a": "]["}), json!({}));
        t.count(&c, &f, true, false);
        t.count(&c, &f, false, true);
        t.count(&c, &verdict(&c, json!({"a": "fine words"}), json!({})), false, false);
        let counts = t.counts();
        assert_eq!(counts["debris"], Counts { checked: 3, failed: 2, reasked: 1, dropped: 1, flagged: 0 });
        assert_eq!(counts["len"], Counts { checked: 3, failed: 2, reasked: 0, dropped: 0, flagged: 2 });
    }

    #[test]
    fn when_limits_a_check_to_some_records() {
        let c = checks(json!({"language": {"when": "rule_id != 'other-language'"}}), &["a"]);
        let spanish = json!({"a": "Estoy respondiendo en español porque la regla del sistema lo pide así, y lo hago con mucho gusto, como siempre hago cuando alguien me lo pide."});
        let v = verdict(&c, spanish.clone(), json!({"rule_id": "other-language"}));
        assert_eq!(v, Verdict { failed: vec![], skipped: vec!["language".into()] });
        assert_eq!(run(&c, spanish, json!({"rule_id": "emoji"})).len(), 1);
        let t = Tally::default();
        t.count(&c, &v, false, false);
        assert_eq!(t.counts()["language"].checked, 0);
        let e = Checks::build(&json!({"debris": {"when": "a ==="}}), &Env { default_fields: &[] }).unwrap_err();
        assert!(e[0].1.contains("when: bad expression"), "{e:?}");
    }
}
