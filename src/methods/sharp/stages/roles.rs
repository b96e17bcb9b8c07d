//! `sharp_roles`: the roles around each script's main character with their affection
//! toward it (spec §2 `sh_role_freq` → `sh_role_select` → `sh_affection`), from
//!
//! - a relationship table (first input): one row per role (`script`, `main`, `role` and an
//!   affection level, an HPD-style score −10..10 or a relationship class mapped through
//!   `affection_rules`), or one row per character with a `relations` list (the
//!   `sharp_relations` parser's output over RoleMRC meta-pool profiles: script = the
//!   profile's id, main = its `role_name`);
//! - optionally dialogue logs (second input, turns in order with script, scene, speaker):
//!   interaction counts, the main character by degree centrality where the table names
//!   none, and the `top_k` most frequent partners with at least `min_interactions` ([R]).
//!
//! A role whose affection cannot be told (an unknown affection level, a class missing from
//! the rules, a selected role with no row) is a failure row with the reason (or, as
//! configured, neutral / dropped and counted); a role listed twice is a failure row.

use std::collections::{BTreeMap, HashMap};

use anyhow::{Result, anyhow};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use synth_core::data::arrow::datatypes::{DataType, Field, SchemaRef};

use crate::metrics::Affection;
use crate::roles::{self as r, Graph};
use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data::{self, Row};
use synth_core::store::failures::FailureKind;
use synth_engine::stages::{Arity, BuildCtx, KindInfo, PlanCtx, RunCtx, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::default(
        "affection_rules",
        Ty::File,
        "\"rules/sharp/affection.tsv\"",
        "[R] relationship class -> high / low / neutral (the paper maps Wiki relationship classes by HPD's rule, unpublished)",
    ),
    OptionSpec::default(
        "unmapped",
        Ty::Enum(&["fail", "neutral", "drop"]),
        "\"fail\"",
        "a role whose affection cannot be told: a failure row with the reason, neutral (kept, left out of CRF), or dropped (counted)",
    ),
    OptionSpec::default(
        "top_k",
        Ty::Int(1, 100_000),
        "10",
        "[R] with dialogues: the main character's most frequent partners kept",
    ),
    OptionSpec::default(
        "min_interactions",
        Ty::Int(0, i64::MAX),
        "1",
        "[R] with dialogues: fewer interactions and a role is not selected",
    ),
    OptionSpec::optional(
        "main",
        Ty::Str,
        "the main character of every script (default: the table's main column, else the dialogues' highest degree centrality)",
    ),
    OptionSpec::default("script_column", Ty::Str, "\"script\"", "the table's script column (RoleMRC profiles: \"id\")"),
    OptionSpec::default(
        "main_column",
        Ty::Str,
        "\"main\"",
        "the table's main-character column (RoleMRC profiles: \"role_name\")",
    ),
    OptionSpec::default(
        "relations_column",
        Ty::Str,
        "\"relations\"",
        "a list column of {role, relation, affection} per row, flattened when present",
    ),
    OptionSpec::default("scene_column", Ty::Str, "\"scene\"", "the dialogues' scene column"),
    OptionSpec::default("speaker_column", Ty::Str, "\"speaker\"", "the dialogues' speaker column"),
    OptionSpec::default(
        "carry",
        Ty::StrList,
        "[]",
        "table columns copied to each of its roles (e.g. profile_text for the agent's system prompt)",
    ),
];

pub static KIND: KindInfo = KindInfo {
    name: "sharp_roles",
    about: "roles and their affection toward the main character from a relationship table (or RoleMRC profiles' relations) and optional dialogue logs (interaction counts, degree centrality, top-k)",
    arity: Arity::AtLeast(1),
    options: OPTIONS,
    example: "",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    affection_rules: String,
    unmapped: String,
    top_k: usize,
    min_interactions: u64,
    main: Option<String>,
    script_column: String,
    main_column: String,
    relations_column: String,
    scene_column: String,
    speaker_column: String,
    carry: Vec<String>,
}

struct RolesStage {
    o: Options,
    rules: HashMap<String, Affection>,
    choices: Map<String, Value>,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let o: Options = ctx.parse(diags)?;
    let path = ctx.root.join(&o.affection_rules);
    let parsed = std::fs::read_to_string(&path)
        .map_err(|e| format!("{}: {e}", path.display()))
        .and_then(|t| r::parse_affection_rules(&t, &o.affection_rules));
    let choices = crate::reconstructed(OPTIONS, ctx.options);
    match parsed {
        Ok(rules) => Some(Box::new(RolesStage { o, rules, choices })),
        Err(e) => {
            ctx.error(diags, "affection_rules", e);
            None
        }
    }
}

fn schema(carried: &[Field]) -> SchemaRef {
    let s = |n: &str, null: bool| Field::new(n, DataType::Utf8, null);
    data::schema_with_id(
        [
            s("script", false),
            s("main", false),
            s("role", false),
            s("affection", false),
            s("relation", true),
            Field::new("affection_score", DataType::Float64, true),
            Field::new("n_interactions", DataType::UInt64, true),
            Field::new("rank", DataType::UInt64, true),
        ]
        .into_iter()
        .chain(carried.iter().cloned()),
    )
}

/// One role of the table.
#[derive(Clone)]
struct Entry {
    script: String,
    main: String,
    role: String,
    level: Option<String>,
    relation: Option<String>,
    score: Option<f64>,
    carried: Row,
}

impl RolesStage {
    fn carried(&self, input: &SchemaRef) -> Vec<Field> {
        self.o
            .carry
            .iter()
            .filter_map(|c| input.field_with_name(c).ok().map(|f| f.clone().with_nullable(true)))
            .collect()
    }

    /// The table's rows as roles (a `relations` list flattened).
    fn entries(&self, rows: &[Row]) -> Vec<Entry> {
        let text = |r: &Row, k: &str| {
            r.get(k).and_then(Value::as_str).map(str::trim).filter(|s| !s.is_empty()).map(str::to_string)
        };
        let item_text = |v: &Value, k: &str| {
            v.get(k).and_then(Value::as_str).map(str::trim).filter(|s| !s.is_empty()).map(str::to_string)
        };
        let mut out = Vec::new();
        for row in rows {
            let script = text(row, &self.o.script_column).unwrap_or_default();
            let main = self.o.main.clone().or_else(|| text(row, &self.o.main_column)).unwrap_or_default();
            let carried: Row =
                self.o.carry.iter().map(|c| (c.clone(), row.get(c).cloned().unwrap_or(Value::Null))).collect();
            let score = |v: Option<&Value>| v.and_then(|v| v.as_f64().or_else(|| v.as_str()?.trim().parse().ok()));
            match row.get(&self.o.relations_column).and_then(Value::as_array) {
                Some(items) => {
                    for item in items {
                        out.push(Entry {
                            script: script.clone(),
                            main: main.clone(),
                            role: item_text(item, "role").unwrap_or_default(),
                            level: None,
                            relation: item_text(item, "relation"),
                            score: score(item.get("affection")),
                            carried: carried.clone(),
                        });
                    }
                }
                None => out.push(Entry {
                    script,
                    main,
                    role: text(row, "role").unwrap_or_default(),
                    level: text(row, "affection"),
                    relation: text(row, "relation"),
                    score: score(row.get("affection_score")),
                    carried,
                }),
            }
        }
        out
    }

    /// The affection of a role, or why it cannot be told.
    fn affection(&self, e: &Entry) -> Result<Affection, String> {
        if let Some(level) = &e.level {
            return Affection::parse(level)
                .ok_or_else(|| format!("unknown affection class \"{level}\" (one of high, low, neutral)"));
        }
        if let Some(x) = e.score {
            return Ok(Affection::from_score(x));
        }
        match &e.relation {
            Some(class) => self.rules.get(&class.to_lowercase()).copied().ok_or_else(|| {
                format!(
                    "relationship class \"{class}\" is not in {} (add it there, or set unmapped)",
                    self.o.affection_rules
                )
            }),
            None => Err("no affection, affection_score or relation (no row in the relationship table?)".into()),
        }
    }
}

#[async_trait]
impl Stage for RolesStage {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        ctx.files.push(ctx.root.join(&self.o.affection_rules));
        if ctx.inputs.len() > 2 {
            ctx.error("inputs", "a relationship table, and optionally dialogue logs");
        }
        if ctx.inputs.len() == 2 {
            let cols = ["script", self.o.scene_column.as_str(), self.o.speaker_column.as_str()];
            ctx.require_columns("inputs", 1, cols);
        }
        let input = ctx.input_schema(0)?;
        for c in &self.o.carry {
            if input.field_with_name(c).is_err() {
                ctx.error("carry", format!("input \"{}\" has no column \"{c}\"", ctx.inputs[0].name));
            }
        }
        Some(schema(&self.carried(&input)))
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let read = |i: usize| -> Result<Vec<Row>> {
            let (_, batches) = synth_core::store::parquet::read_all(&ctx.inputs[i].path)?;
            Ok(batches.iter().flat_map(|b| (0..b.num_rows()).map(move |i| data::row_json(b, i))).collect())
        };
        let table = read(0)?;
        ctx.report.rows_in = table.len() as u64;
        let entries = self.entries(&table);
        let graphs: Option<BTreeMap<String, Graph>> = match ctx.inputs.len() {
            2 => {
                let turns = read(1)?;
                let get = |r: &Row, k: &str| r.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
                let t: Vec<(String, String, String)> = turns
                    .iter()
                    .map(|r| (get(r, "script"), get(r, &self.o.scene_column), get(r, &self.o.speaker_column)))
                    .collect();
                ctx.report.metrics.insert("dialogue_turns".into(), t.len() as f64);
                Some(r::interactions(t.iter().map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str()))))
            }
            _ => None,
        };
        let carried = self.carried(&ctx.inputs[0].schema);
        let mut rows: Vec<Row> = Vec::new();
        let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
        let push = |e: &Entry, aff: Affection, n: Option<u64>, rank: Option<u64>, rows: &mut Vec<Row>| {
            let mut row = Row::from_iter([
                (data::ID.to_string(), json!(format!("{}/{}", e.script, e.role))),
                ("script".into(), json!(e.script)),
                ("main".into(), json!(e.main)),
                ("role".into(), json!(e.role)),
                ("affection".into(), json!(aff.name())),
                ("relation".into(), e.relation.clone().map(Value::String).unwrap_or(Value::Null)),
                ("affection_score".into(), e.score.map(|x| json!(x)).unwrap_or(Value::Null)),
                ("n_interactions".into(), n.map(|x| json!(x)).unwrap_or(Value::Null)),
                ("rank".into(), rank.map(|x| json!(x)).unwrap_or(Value::Null)),
            ]);
            row.extend(e.carried.iter().map(|(k, v)| (k.clone(), v.clone())));
            rows.push(row);
        };
        // Each (script, role) once; the rest are failures.
        let mut seen: BTreeMap<(String, String), usize> = BTreeMap::new();
        let mut unique: Vec<&Entry> = Vec::new();
        for e in &entries {
            let id = format!("{}/{}", e.script, e.role);
            if e.script.is_empty() || e.role.is_empty() || (e.main.is_empty() && graphs.is_none()) {
                ctx.fail(
                    &id,
                    FailureKind::Input,
                    format!("{id}: a role needs a script, a role name and a main character"),
                    None,
                );
                continue;
            }
            if seen.insert((e.script.clone(), e.role.clone()), unique.len()).is_some() {
                ctx.fail(
                    &id,
                    FailureKind::Input,
                    format!("{id}: role \"{}\" of \"{}\" is listed twice", e.role, e.script),
                    None,
                );
                continue;
            }
            unique.push(e);
        }
        let decide = |e: &Entry, ctx: &RunCtx, counts: &mut BTreeMap<&str, u64>| -> Option<Affection> {
            match self.affection(e) {
                Ok(a) => Some(a),
                Err(why) => {
                    let id = format!("{}/{}", e.script, e.role);
                    match self.o.unmapped.as_str() {
                        "neutral" if e.level.is_none() => {
                            *counts.entry("unmapped_neutral").or_default() += 1;
                            Some(Affection::Neutral)
                        }
                        "drop" if e.level.is_none() => {
                            *counts.entry("unmapped_dropped").or_default() += 1;
                            None
                        }
                        _ => {
                            ctx.fail(&id, FailureKind::Input, format!("{id}: {why}"), None);
                            None
                        }
                    }
                }
            }
        };
        match &graphs {
            None => {
                for e in &unique {
                    if let Some(a) = decide(e, ctx, &mut counts) {
                        push(e, a, None, None, &mut rows);
                    }
                }
            }
            Some(graphs) => {
                let mut scripts: Vec<String> = unique.iter().map(|e| e.script.clone()).collect();
                scripts.dedup();
                let empty = Graph::new();
                for script in scripts.iter().filter(|s| !s.is_empty()) {
                    let graph = graphs.get(script).unwrap_or(&empty);
                    let named =
                        unique.iter().find(|e| &e.script == script && !e.main.is_empty()).map(|e| e.main.clone());
                    let Some(main) = named.or_else(|| r::main_character(graph)) else {
                        ctx.fail(
                            script,
                            FailureKind::Input,
                            format!("{script}: no main character (none named, no dialogue turns)"),
                            None,
                        );
                        continue;
                    };
                    let selected: Vec<(String, u64)> = r::partners(graph, &main)
                        .into_iter()
                        .filter(|(_, n)| *n >= self.o.min_interactions)
                        .take(self.o.top_k)
                        .collect();
                    for (rank, (role, n)) in selected.iter().enumerate() {
                        let found = unique.iter().find(|e| &e.script == script && &e.role == role);
                        let e = match found {
                            Some(e) => Entry { main: main.clone(), ..(*e).clone() },
                            None => Entry {
                                script: script.clone(),
                                main: main.clone(),
                                role: role.clone(),
                                level: None,
                                relation: None,
                                score: None,
                                carried: Row::new(),
                            },
                        };
                        if let Some(a) = decide(&e, ctx, &mut counts) {
                            push(&e, a, Some(*n), Some(rank as u64 + 1), &mut rows);
                        }
                    }
                    let not_selected = unique
                        .iter()
                        .filter(|e| &e.script == script && !selected.iter().any(|(r, _)| r == &e.role))
                        .count();
                    *counts.entry("not_selected").or_default() += not_selected as u64;
                }
            }
        }
        for (k, v) in counts {
            ctx.report.metrics.insert(k.into(), v as f64);
        }
        let schema = schema(&carried);
        let mut out = ctx.create_output(schema.clone())?;
        out.write(&data::rows_to_batch(&schema, &rows).map_err(|(i, e)| anyhow!("row {i}: {e}"))?)?;
        crate::record_choices(ctx, KIND.name, &self.choices)?;
        ctx.set_output(out)
    }
}
