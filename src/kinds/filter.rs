//! `filter`: keep the records for which a minijinja expression is true
//! (e.g. `where = "persona | length > 20 and lang == 'en'"`). A record whose
//! expression fails to evaluate goes to the failure table.

use std::sync::Arc;

use anyhow::Result;
use async_trait::async_trait;
use serde::Deserialize;
use synth_core::data::arrow::array::BooleanArray;
use synth_core::data::arrow::datatypes::SchemaRef;

use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data;
use synth_core::store::failures::FailureKind;
use synth_core::template::{Templates, truthy};
use synth_engine::stages::{BuildCtx, KindInfo, PartitionCtx, Partitioning, PlanCtx, RunCtx, Sharding, Stage};

const OPTIONS: &[OptionSpec] = &[OptionSpec::required(
    "where",
    Ty::Str,
    "expression over the record's columns; records where it is true are kept",
)];

pub static KIND: KindInfo = KindInfo {
    name: "filter",
    about: "keep records for which an expression is true",
    options: OPTIONS,
    example: "where = \"true\"",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
struct Options {
    #[serde(rename = "where")]
    predicate: String,
}

struct Filter {
    templates: Arc<Templates>,
    vars: Vec<String>,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    let mut templates = Templates::new();
    match templates.add_expression("where", &opts.predicate) {
        Ok(vars) => Some(Box::new(Filter { templates: Arc::new(templates), vars: vars.into_iter().collect() })),
        Err(e) => {
            ctx.error(diags, "where", format!("bad expression: {e}"));
            None
        }
    }
}

#[async_trait]
impl Stage for Filter {
    fn partitioning(&self, _ctx: &PartitionCtx<'_>) -> Partitioning {
        Sharding::LIGHT
    }

    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        ctx.check_variables("where", "expression", self.vars.iter().map(String::as_str), &[data::ID]);
        ctx.input_schema(0)
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let schema = ctx.inputs[0].schema.clone();
        let templates = self.templates.clone();
        synth_engine::stages::exec::map_batches(
            ctx,
            0,
            schema,
            synth_engine::stages::exec::Ids::Kept,
            move |batch, failures| {
                let ids = data::ids(batch);
                let mask: BooleanArray = (0..batch.num_rows())
                    .map(|i| {
                        let row = data::row_json(batch, i);
                        match templates.eval("where", &row) {
                            Ok(v) => Some(truthy(&v)),
                            Err(e) => {
                                failures.record(
                                    ids.value(i),
                                    FailureKind::Expression,
                                    e,
                                    serde_json::to_string(&row).ok(),
                                );
                                Some(false)
                            }
                        }
                    })
                    .collect();
                Ok(synth_core::data::arrow::compute::filter_record_batch(batch, &mask)?)
            },
        )
        .await
    }
}
