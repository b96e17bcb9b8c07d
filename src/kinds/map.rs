//! `map`: reshape records without an LLM — derive columns from templates or typed
//! expressions, re-key records, rename, drop and select columns. Applied in that
//! order: derive (and id) → rename → drop → select. Without derivations it never
//! touches row data, so it costs only the Parquet read and write.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Result, anyhow};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;
use synth_core::data::arrow::array::{ArrayRef, BooleanArray, RecordBatch, StringArray};
use synth_core::data::arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data::{self, ID, Row};
use synth_core::store::failures::FailureKind;
use synth_core::template::Templates;
use synth_engine::stages::{BuildCtx, KindInfo, PartitionCtx, Partitioning, PlanCtx, RunCtx, Sharding, Stage};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::optional(
        "derive",
        Ty::Map(&Ty::Any),
        "new columns: name = \"template\" (text), or name = { expr = \"expression\", type = \"int64\" }",
    ),
    OptionSpec::optional("id", Ty::Str, "template for a new record id (must stay unique)"),
    OptionSpec::optional("rename", Ty::Map(&Ty::Str), "old name = new name"),
    OptionSpec::optional("drop", Ty::List(&Ty::Str), "columns to remove"),
    OptionSpec::optional("select", Ty::List(&Ty::Str), "columns to keep, in this order (id is always kept)"),
];

pub static KIND: KindInfo = KindInfo {
    name: "map",
    about: "derive, rename, drop and select columns (templates and expressions, no LLM)",
    options: OPTIONS,
    example: "rename = { a = \"b\" }",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    derive: Option<indexmap::IndexMap<String, Value>>,
    id: Option<String>,
    rename: Option<BTreeMap<String, String>>,
    drop: Option<Vec<String>>,
    select: Option<Vec<String>>,
}

#[derive(Clone)]
enum DeriveKind {
    Template,
    /// Typed expression; `json` keeps the value as JSON text.
    Expr {
        ty: DataType,
        json: bool,
    },
}

#[derive(Clone)]
struct Derive {
    name: String,
    kind: DeriveKind,
}

struct MapStage {
    templates: Arc<Templates>,
    derives: Vec<Derive>,
    rekey: bool,
    vars: Vec<(String, Vec<String>)>,
    rename: Vec<(String, String)>,
    drop: Vec<String>,
    select: Option<Vec<String>>,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    let mut templates = Templates::new();
    let mut derives = Vec::new();
    let mut vars = Vec::new();
    for (name, spec) in opts.derive.iter().flatten() {
        let option = format!("derive.{name}");
        if name == ID {
            ctx.error(diags, &option, "use the \"id\" option to change record ids");
            continue;
        }
        let (kind, added) = match spec {
            Value::String(t) => (DeriveKind::Template, templates.add(&option, t)),
            Value::Object(m) => {
                let expr = m.get("expr").and_then(Value::as_str);
                let ty_name = m.get("type").and_then(Value::as_str).unwrap_or("json");
                let unknown: Vec<&String> = m.keys().filter(|k| *k != "expr" && *k != "type").collect();
                if !unknown.is_empty() || expr.is_none() {
                    ctx.error(diags, &option, "a derived expression is { expr = \"...\", type = \"...\" }");
                    continue;
                }
                let Some(ty) = data::parse_type_name(ty_name) else {
                    ctx.error(
                        diags,
                        &option,
                        format!("unknown type \"{ty_name}\" (types: {})", data::TYPE_NAMES.join(", ")),
                    );
                    continue;
                };
                (
                    DeriveKind::Expr { ty, json: ty_name == "json" },
                    templates.add_expression(&option, expr.expect("checked")),
                )
            }
            _ => {
                ctx.error(diags, &option, "a derived column is a template string or { expr, type }");
                continue;
            }
        };
        match added {
            Ok(v) => {
                vars.push((option, v.into_iter().collect()));
                derives.push(Derive { name: name.clone(), kind });
            }
            Err(e) => ctx.error(diags, &option, format!("bad template: {e}")),
        }
    }
    if let Some(id) = &opts.id {
        match templates.add("id", id) {
            Ok(v) => vars.push(("id".to_string(), v.into_iter().collect())),
            Err(e) => ctx.error(diags, "id", format!("bad template: {e}")),
        }
    }
    let rename: Vec<(String, String)> = opts.rename.unwrap_or_default().into_iter().collect();
    for (old, new) in &rename {
        if old == ID || new == ID {
            ctx.error(diags, &format!("rename.{old}"), "the id column cannot be renamed (use \"id\" to re-key)");
        }
    }
    Some(Box::new(MapStage {
        templates: Arc::new(templates),
        derives,
        rekey: opts.id.is_some(),
        vars,
        rename,
        drop: opts.drop.unwrap_or_default(),
        select: opts.select,
    }))
}

impl MapStage {
    /// Output schema from the input schema; errors name the offending option.
    fn output_schema(&self, input: &Schema) -> std::result::Result<Schema, (String, String)> {
        let mut fields: Vec<Field> = input.fields().iter().map(|f| f.as_ref().clone()).collect();
        for d in &self.derives {
            let ty = match &d.kind {
                DeriveKind::Template => DataType::Utf8,
                DeriveKind::Expr { ty, .. } => ty.clone(),
            };
            let field = Field::new(&d.name, ty, true);
            match fields.iter_mut().find(|f| f.name() == &d.name) {
                Some(existing) => *existing = field,
                None => fields.push(field),
            }
        }
        for (old, new) in &self.rename {
            let opt = format!("rename.{old}");
            if fields.iter().any(|f| f.name() == new) {
                return Err((opt, format!("cannot rename \"{old}\" to \"{new}\": that column exists")));
            }
            let f = fields.iter_mut().find(|f| f.name() == old).ok_or_else(|| (opt.clone(), no_column(old, input)))?;
            *f = f.clone().with_name(new);
        }
        for col in &self.drop {
            if col == ID {
                return Err(("drop".into(), "the id column cannot be dropped".into()));
            }
            let before = fields.len();
            fields.retain(|f| f.name() != col);
            if fields.len() == before {
                return Err(("drop".into(), no_column(col, &Schema::new(fields.clone()))));
            }
        }
        if let Some(select) = &self.select {
            let mut picked = vec![fields[0].clone()];
            for col in select.iter().filter(|c| *c != ID) {
                let f = fields
                    .iter()
                    .find(|f| f.name() == col)
                    .ok_or_else(|| ("select".to_string(), no_column(col, &Schema::new(fields.clone()))))?;
                picked.push(f.clone());
            }
            fields = picked;
        }
        Ok(Schema::new(fields))
    }
}

fn no_column(col: &str, schema: &Schema) -> String {
    let hint = synth_core::config::diag::did_you_mean(col, schema.fields().iter().map(|f| f.name().as_str()))
        .unwrap_or_default();
    format!("no column \"{col}\"{hint} (columns: {})", data::column_list(schema))
}

#[async_trait]
impl Stage for MapStage {
    fn partitioning(&self, _ctx: &PartitionCtx<'_>) -> Partitioning {
        Sharding::LIGHT
    }

    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        for (option, vars) in &self.vars {
            ctx.check_variables(option, "template", vars.iter().map(String::as_str), &[]);
        }
        let input = ctx.input_schema(0)?;
        match self.output_schema(&input) {
            Ok(s) => Some(Arc::new(s)),
            Err((option, msg)) => {
                ctx.error(&option, msg);
                None
            }
        }
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let input_schema = ctx.inputs[0].schema.clone();
        let out_schema = Arc::new(self.output_schema(&input_schema).map_err(|(opt, msg)| anyhow!("{opt}: {msg}"))?);
        let derives = self.derives.clone();
        let templates = self.templates.clone();
        let rekey = self.rekey;
        let needs_rows = !derives.is_empty() || rekey;
        let ids_mode =
            if rekey { synth_engine::stages::exec::Ids::Changed } else { synth_engine::stages::exec::Ids::Kept };
        let plan = Arc::new(Reshape::new(&input_schema, &derives, &self.rename, &out_schema));
        synth_engine::stages::exec::map_batches(ctx, 0, out_schema.clone(), ids_mode, move |batch, failures| {
            if !needs_rows {
                return plan.apply(batch, Vec::new(), None);
            }
            let ids = data::ids(batch);
            let mut keep = vec![true; batch.num_rows()];
            let mut derived: Vec<Vec<Value>> = vec![Vec::with_capacity(batch.num_rows()); derives.len()];
            let mut new_ids: Vec<String> = Vec::new();
            for (i, keep_row) in keep.iter_mut().enumerate() {
                let row: Row = data::row_json(batch, i);
                let mut values = Vec::with_capacity(derives.len());
                let mut error = None;
                for d in &derives {
                    let name = format!("derive.{}", d.name);
                    let v = match &d.kind {
                        DeriveKind::Template => templates.render(&name, &row).map(Value::String),
                        DeriveKind::Expr { json: true, .. } => {
                            templates.eval(&name, &row).map(|v| Value::String(v.to_string()))
                        }
                        DeriveKind::Expr { .. } => templates.eval(&name, &row),
                    };
                    match v {
                        Ok(v) => values.push(v),
                        Err(e) => {
                            error = Some(format!("{name}: {e}"));
                            break;
                        }
                    }
                }
                if error.is_none() && rekey {
                    match templates.render("id", &row) {
                        Ok(id) if !id.is_empty() => new_ids.push(id),
                        Ok(_) => error = Some("id: template rendered an empty id".into()),
                        Err(e) => error = Some(format!("id: {e}")),
                    }
                }
                match error {
                    Some(e) => {
                        failures.record(ids.value(i), FailureKind::Template, e, serde_json::to_string(&row).ok());
                        *keep_row = false;
                    }
                    None => {
                        for (col, v) in derived.iter_mut().zip(values) {
                            col.push(v);
                        }
                    }
                }
            }
            let mask = BooleanArray::from(keep);
            let kept = synth_core::data::arrow::compute::filter_record_batch(batch, &mask)?;
            let arrays =
                derives.iter().zip(derived).map(|(d, values)| build_column(d, values)).collect::<Result<Vec<_>>>()?;
            let ids = rekey.then(|| Arc::new(StringArray::from(new_ids)) as ArrayRef);
            plan.apply(&kept, arrays, ids)
        })
        .await
    }
}

fn build_column(d: &Derive, values: Vec<Value>) -> Result<ArrayRef> {
    let ty = match &d.kind {
        DeriveKind::Template | DeriveKind::Expr { json: true, .. } => DataType::Utf8,
        DeriveKind::Expr { ty, .. } => ty.clone(),
    };
    let schema = Arc::new(Schema::new(vec![Field::new(&d.name, ty, true)]));
    let rows: Vec<Row> = values.into_iter().map(|v| Row::from_iter([(d.name.clone(), v)])).collect();
    let batch = data::rows_to_batch(&schema, &rows)
        .map_err(|(i, e)| anyhow!("derive.{}: value of row {i} does not fit its type: {e}", d.name))?;
    Ok(batch.column(0).clone())
}

/// Column plumbing from input (+ derived) columns to the output schema.
struct Reshape {
    /// For each output column: Left(input index) or Right(derived index).
    sources: Vec<std::result::Result<usize, usize>>,
    schema: SchemaRef,
}

impl Reshape {
    fn new(input: &Schema, derives: &[Derive], rename: &[(String, String)], out: &SchemaRef) -> Reshape {
        let original_name = |name: &str| -> String {
            rename.iter().find(|(_, new)| new == name).map(|(old, _)| old.clone()).unwrap_or_else(|| name.to_string())
        };
        let sources = out
            .fields()
            .iter()
            .map(|f| {
                let name = original_name(f.name());
                match derives.iter().position(|d| d.name == name) {
                    Some(d) => Err(d),
                    None => Ok(input.index_of(&name).expect("output schema derives from input")),
                }
            })
            .collect();
        Reshape { sources, schema: out.clone() }
    }

    fn apply(&self, batch: &RecordBatch, derived: Vec<ArrayRef>, ids: Option<ArrayRef>) -> Result<RecordBatch> {
        let mut cols: Vec<ArrayRef> = self
            .sources
            .iter()
            .map(|s| match s {
                Ok(i) => batch.column(*i).clone(),
                Err(d) => derived[*d].clone(),
            })
            .collect();
        if let Some(ids) = ids {
            cols[0] = ids;
        }
        // Derived columns may be typed more loosely than the input they replace.
        for (col, field) in cols.iter_mut().zip(self.schema.fields()) {
            if col.data_type() != field.data_type() {
                *col = data::strict_cast(col, field.data_type())?;
            }
        }
        Ok(RecordBatch::try_new(self.schema.clone(), cols)?)
    }
}
