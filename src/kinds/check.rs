//! `check`: the content checks of `llm` stages (`checks = { name = { kind, ... } }`) on
//! any table, without a model: a record that fails a check goes to the failure table
//! (kind `check`, the check's name in column `check`) with every reason; `action =
//! "flag"` only counts. By default a check reads every text of the record but its id.

use std::sync::Arc;

use anyhow::Result;
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;
use synth_core::data::arrow::array::BooleanArray;
use synth_core::data::arrow::datatypes::SchemaRef;

use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data;
use synth_core::store::failures::{Failure, FailureKind};
use synth_engine::stages::{BuildCtx, KindInfo, PartitionCtx, Partitioning, PlanCtx, RunCtx, Sharding, Stage};
use synth_quality::{Checks, Env, Subject, Tally};

const OPTIONS: &[OptionSpec] = &[OptionSpec::required(
    "checks",
    Ty::Map(&Ty::Any),
    "the checks, a table `name = { kind, action, fields, ... }` as on `llm` stages (kinds: debris, repetition, echo, language, length, chat)",
)];

pub static KIND: KindInfo = KindInfo {
    name: "check",
    about: "content checks on every record (debris, repetition, echo, language, length, chat): failing records go to the failure table with the check's name",
    options: OPTIONS,
    example: "checks = { debris = {} }",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    checks: Value,
}

struct Check {
    checks: Arc<Checks>,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    match Checks::build(&opts.checks, &Env { default_fields: &[] }) {
        Ok(c) => Some(Box::new(Check { checks: Arc::new(c) })),
        Err(problems) => {
            for (name, msg) in problems {
                ctx.error(diags, &if name.is_empty() { "checks".to_string() } else { format!("checks.{name}") }, msg);
            }
            None
        }
    }
}

#[async_trait]
impl Stage for Check {
    fn partitioning(&self, _ctx: &PartitionCtx<'_>) -> Partitioning {
        Sharding::LIGHT
    }

    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        for (name, column) in self.checks.columns() {
            if let Some(s) = ctx.input_schema(0)
                && s.field_with_name(&column).is_err()
            {
                let input = ctx.inputs[0].name.clone();
                ctx.error(&format!("checks.{name}"), format!("input \"{input}\" has no column \"{column}\""));
            }
        }
        ctx.input_schema(0)
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let schema = ctx.inputs[0].schema.clone();
        let checks = self.checks.clone();
        let tally = Arc::new(Tally::default());
        let counted = tally.clone();
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
                        let verdict = checks.run(&Subject { fields: &row, record: &row, prompt: None });
                        let blocking = verdict.blocking();
                        counted.count(&checks, &verdict, false, !blocking.is_empty());
                        let Some(first) = blocking.first() else { return Some(true) };
                        let reason = blocking
                            .iter()
                            .map(|f| format!("check \"{}\": {}", f.check, f.reason))
                            .collect::<Vec<_>>()
                            .join("; ");
                        let mut failure = Failure::new(
                            ids.value(i),
                            FailureKind::Check,
                            synth_core::secrets::scrub(&reason),
                            serde_json::to_string(&row).ok().map(|r| synth_core::secrets::scrub(&r)),
                        );
                        failure.check = Some(first.check.clone());
                        failures.push(failure);
                        Some(false)
                    })
                    .collect();
                Ok(synth_core::data::arrow::compute::filter_record_batch(batch, &mask)?)
            },
        )
        .await?;
        let counts = tally.counts();
        for name in self.checks.names() {
            ctx.report.metrics.extend(counts.get(name).copied().unwrap_or_default().metrics(name));
        }
        Ok(())
    }
}
