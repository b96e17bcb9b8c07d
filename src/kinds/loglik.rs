//! `loglik`: multiple choice by log-likelihood, as lm-evaluation-harness scores
//! `multiple_choice` tasks: for each record and each choice, the log-probability of
//! `target_delimiter + choice` right after the record's `context` column (one
//! completions request per choice, `echo` + `logprobs`, through the shared call path:
//! cached, rate limited, resumable), and `pred`, the most likely choice (ties to the
//! earlier choice, as `numpy.argmax`). Output: the kept input columns, one
//! `ll_<choice>` column per choice, `pred`, `model`. A record whose calls fail goes
//! to the failure table. With `batch = true` the requests go through the provider's
//! batch API (`/v1/completions` lines) and the output is the same.

use anyhow::{Result, anyhow};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;
use synth_core::data::arrow::datatypes::{DataType, Field, SchemaRef};

use super::llm::{BATCH, BATCH_FALLBACK, CONCURRENCY, KEEP_COLUMNS, MAX_COST_USD};
use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, Ty};
use synth_core::data::{self, Row};
use synth_core::store::failures::FailureKind;
use synth_engine::stages::exec::{RowError, batch_map_rows, map_rows};
use synth_engine::stages::{
    BuildCtx, KindInfo, PartitionCtx, Partitioning, PlanCtx, PrepareCtx, Prepared, RunCtx, Stage,
};
use synth_llm::{CallCtx, Loglik, LoglikRequest};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::required(
        "provider",
        Ty::Str,
        "name of a [providers.NAME] table (an OpenAI-compatible completions server)",
    ),
    OptionSpec::required("context", Ty::Str, "column with the text the choices continue"),
    OptionSpec::required("choices", Ty::StrList, "the candidate continuations, e.g. [\"A\", \"B\", \"C\", \"D\"]"),
    OptionSpec::default(
        "target_delimiter",
        Ty::Str,
        "\" \"",
        "text between the context and each choice (lm-evaluation-harness's default is one space)",
    ),
    KEEP_COLUMNS,
    CONCURRENCY,
    BATCH,
    BATCH_FALLBACK,
    MAX_COST_USD,
];

pub static KIND: KindInfo = KindInfo {
    name: "loglik",
    about: "multiple choice by log-likelihood (completions with echo + logprobs): ll_<choice> per choice and the argmax",
    options: OPTIONS,
    example: "provider = \"p\"\ncontext = \"prompt\"\nchoices = [\"A\", \"B\"]",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
struct Options {
    provider: String,
    context: String,
    choices: Vec<String>,
    target_delimiter: String,
    keep_columns: Option<Vec<String>>,
    concurrency: Option<usize>,
    batch: Option<bool>,
    batch_fallback: Option<String>,
    max_cost_usd: Option<f64>,
}

struct LoglikStage {
    opts: Options,
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    let mut seen = std::collections::BTreeSet::new();
    if opts.choices.is_empty() || !opts.choices.iter().all(|c| seen.insert(c)) {
        ctx.error(diags, "choices", "give at least one choice, each once");
        return None;
    }
    Some(Box::new(LoglikStage { opts }))
}

/// The index of the largest value, the first one on ties (`numpy.argmax`).
pub fn argmax(values: &[f64]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, v) in values.iter().enumerate() {
        if best.is_none_or(|b| *v > values[b]) {
            best = Some(i);
        }
    }
    best
}

impl LoglikStage {
    fn output_schema(&self, input: &SchemaRef) -> std::result::Result<SchemaRef, String> {
        let kept: Vec<Field> = match &self.opts.keep_columns {
            Some(cols) => cols
                .iter()
                .filter(|c| c.as_str() != data::ID)
                .map(|c| {
                    input
                        .field_with_name(c)
                        .cloned()
                        .map_err(|_| format!("no column \"{c}\" to keep (columns: {})", data::column_list(input)))
                })
                .collect::<std::result::Result<_, _>>()?,
            None => input.fields().iter().skip(1).map(|f| f.as_ref().clone()).collect(),
        };
        let mut added: Vec<Field> =
            self.opts.choices.iter().map(|c| Field::new(format!("ll_{c}"), DataType::Float64, false)).collect();
        added.push(Field::new("pred", DataType::Utf8, false));
        added.push(Field::new("model", DataType::Utf8, false));
        for f in &added {
            if kept.iter().any(|k| k.name() == f.name()) {
                return Err(format!("the input already has a column \"{}\"; leave it out with keep_columns", f.name()));
            }
        }
        Ok(data::schema_with_id(kept.into_iter().chain(added)))
    }
}

#[async_trait]
impl Stage for LoglikStage {
    fn partitioning(&self, ctx: &PartitionCtx<'_>) -> Partitioning {
        super::llm::partitioning(ctx, &self.opts.provider, self.opts.batch)
    }

    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        super::llm::check_provider(ctx, &self.opts.provider);
        ctx.require_columns("context", 0, [self.opts.context.as_str()]);
        let input = ctx.input_schema(0)?;
        match self.output_schema(&input) {
            Ok(s) => Some(s),
            Err(msg) => {
                ctx.error("keep_columns", msg);
                None
            }
        }
    }

    fn network_bound(&self, services: &synth_engine::services::Services) -> bool {
        services.provider_networked(&self.opts.provider)
    }

    async fn prepare(&self, ctx: &PrepareCtx<'_>) -> Result<Option<Prepared>> {
        super::llm::provider_prepared(ctx, &self.opts.provider)
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let (provider, call, concurrency) =
            super::llm::start_provider(ctx, &self.opts.provider, self.opts.concurrency, self.opts.max_cost_usd)?;
        let schema = self.output_schema(&ctx.inputs[0].schema).map_err(|m| anyhow!(m))?;
        ctx.report.info.insert("target_delimiter".into(), format!("{:?}", self.opts.target_delimiter));
        let rate = provider.rate.clone();
        let services = ctx.services.clone();
        let this = &*self;
        let answer = |row: Row, call: CallCtx| {
            let (provider, services) = (provider.clone(), services.clone());
            async move {
                let context = row.get(&this.opts.context).and_then(Value::as_str).ok_or_else(|| {
                    RowError::new(FailureKind::Input, format!("column \"{}\" is not text", this.opts.context))
                })?;
                // Every choice asked side by side (one pass of batch mode collects them all).
                let answers = futures::future::join_all(this.opts.choices.iter().map(|choice| {
                    let req = LoglikRequest {
                        context: context.to_string(),
                        continuation: format!("{}{choice}", this.opts.target_delimiter),
                    };
                    let (services, provider, call) = (&services, &provider, &call);
                    async move { services.loglik(provider, req, call).await }
                }))
                .await;
                let mut values = Vec::with_capacity(this.opts.choices.len());
                let mut model = String::new();
                for done in answers {
                    let done = done.map_err(|e| RowError {
                        kind: FailureKind::Llm,
                        message: e.to_string(),
                        fatal: e.kind.fatal(),
                        answers: None,
                    })?;
                    let ll = Loglik::from_text(&done.response.text)
                        .map_err(|m| RowError::new(FailureKind::Validation, m))?;
                    values.push(ll.logprob);
                    model = done.response.model.clone();
                }
                let best = argmax(&values).expect("at least one choice");
                let mut out = Row::new();
                for (k, v) in &row {
                    if this.opts.keep_columns.as_ref().is_none_or(|cols| k == data::ID || cols.contains(k)) {
                        out.insert(k.clone(), v.clone());
                    }
                }
                for (choice, v) in this.opts.choices.iter().zip(&values) {
                    out.insert(format!("ll_{choice}"), Value::from(*v));
                }
                out.insert("pred".into(), Value::String(this.opts.choices[best].clone()));
                out.insert("model".into(), Value::String(model));
                Ok(vec![out])
            }
        };
        let batch =
            super::llm::start_batch(ctx, &provider, &call, self.opts.batch, self.opts.batch_fallback.as_deref())?;
        match &batch {
            Some(b) => batch_map_rows(ctx, 0, schema, concurrency, concurrency.max(256), b, &call, &answer).await?,
            None => map_rows(ctx, 0, schema, concurrency, |row: Row| answer(row, call.clone())).await?,
        }
        if let Some(b) = &batch {
            super::llm::report_batch(ctx, b);
        }
        super::llm::report_limits(ctx, &rate);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::argmax;

    #[test]
    fn ties_go_to_the_earlier_choice() {
        assert_eq!(argmax(&[-1.0, -0.5, -0.5, -2.0]), Some(1));
        assert_eq!(argmax(&[-3.0, -3.0]), Some(0));
        assert_eq!(argmax(&[]), None);
    }
}
