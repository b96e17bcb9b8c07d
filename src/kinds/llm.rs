//! `llm`: for each record, render prompt templates (files; variables are the
//! record's columns), call a provider (`n` samples optional), parse the answer with
//! a named parser, and on a parse failure ask again with the reason appended, up to
//! `max_attempts`; a record that never parses goes to the failure table with the
//! reason. Output: the input columns, the parsed fields, and `raw`, `model`,
//! `tokens_in`, `tokens_out`, `finish_reason`, `attempts` (and `sample` when n > 1).
//! Every call goes through the shared cache, so re-runs and resumed runs do not pay
//! again. With `batch = true` (or the provider's `batch`), uncached requests go
//! through the provider's batch API (`exec::batch_map_rows`) and the output is the same.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Result, anyhow};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;
use synth_core::data::arrow::datatypes::{DataType, Field, SchemaRef};

use synth_core::config::diag::Diagnostics;
use synth_core::config::options::{OptionSpec, POSITIVE, RATIO, Ty};
use synth_core::data::chat::Role as ChatRole;
use synth_core::data::{self, Row};
use synth_core::store::failures::FailureKind;
use synth_core::template::Templates;
use synth_engine::services::Services;
use synth_engine::services::batch::{BatchStage, StageBatch};
use synth_engine::stages::Answers;
use synth_engine::stages::exec::{RowError, batch_map_rows, map_rows};
use synth_engine::stages::{
    BuildCtx, KindInfo, PartitionCtx, Partitioning, PlanCtx, PrepareCtx, Prepared, RunCtx, Sharding, Stage,
};
use synth_llm::parse::{self, Parser};
use synth_llm::provider::Provider;
use synth_llm::schema::{Form, SchemaFile, Structured};
use synth_llm::{CallCtx, ChatRequest, Completed, GenParams, Message};
use synth_quality::{Action, Checks, Tally};

const OPTIONS: &[OptionSpec] = &[
    OptionSpec::required("provider", Ty::Str, "name of a [providers.NAME] table"),
    OptionSpec::optional("prompt", Ty::File, "template file of the user message (or set `messages`)"),
    OptionSpec::optional(
        "messages",
        Ty::Str,
        "column with a whole conversation to send as it is (list of {role, content}; e.g. a test `question`), instead of `prompt`",
    ),
    OptionSpec::optional("system", Ty::File, "template file of the system message"),
    OptionSpec::default("parser", Ty::Str, "\"text\"", "how to read the answer (see `synth list`)"),
    OptionSpec::optional("parser_options", Ty::Any, "options of the parser"),
    SCHEMA,
    OptionSpec::optional(
        "schemas",
        Ty::Map(&Ty::File),
        "with `schema_column`: a JSON Schema file per value of that column (e.g. who speaks first, so the grammar holds it); records with other values use `schema`",
    ),
    OptionSpec::optional("schema_column", Ty::Str, "the input column whose value picks a schema of `schemas`"),
    STRUCTURED,
    CHECKS,
    OptionSpec::default("n", POSITIVE, "1", "answers per record (each its own row, id \"<id>/<k>\")"),
    OptionSpec::default("max_attempts", POSITIVE, "3", "asks per answer when it does not parse"),
    OptionSpec::default(
        "candidates",
        POSITIVE,
        "1",
        "answers drawn at once per ask, each its own sample (candidate j of sample s is sample s + j·n): the lowest-numbered one that parses and passes the checks is taken, whatever order they finish in; if none does, the first is re-asked with its reason (each re-ask draws `candidates` again). Paid `candidates` times; worth it where a model's first answers often fail and its re-asks rarely mend them (a small local model, on slots a stage of few records leaves idle). The others count as discarded (`answers.discarded`, the card)",
    ),
    OptionSpec::default(
        "reask",
        Ty::Str,
        "\"Your answer could not be used: {{ error }}. Answer again, following the required format exactly.\"",
        "message appended after an answer that did not parse ({{ error }} is the reason)",
    ),
    OptionSpec::default(
        "reask_history",
        Ty::Enum(&["all", "last"]),
        "\"all\"",
        "what a re-ask sends: \"all\": the first messages, every rejected answer and its reason; \"last\": the first messages, the last rejected answer and its reason (a re-ask stays as long as the second try: less to read again, and long answers such as dialogues stay within a local model's context)",
    ),
    OptionSpec::optional("temperature", Ty::Float(0.0, 2.0), "overrides the provider's"),
    OptionSpec::optional("max_tokens", POSITIVE, "overrides the provider's"),
    TOP_P,
    SEED,
    STOP,
    EXTRA,
    OptionSpec::default("output_prefix", Ty::Str, "\"\"", "prefix for the columns this stage adds"),
    OptionSpec::optional(
        "record_rejections",
        Ty::Bool,
        "true: add a `rejections` column: the failure kind of each answer the parser rejected before the accepted one (e.g. [\"degenerate_pair\"])",
    ),
    KEEP_COLUMNS,
    CONCURRENCY,
    BATCH,
    BATCH_FALLBACK,
    MAX_COST_USD,
];

// Structured answers (shared with kinds that preset the rest).
pub(super) const SCHEMA: OptionSpec = OptionSpec::optional(
    "schema",
    Ty::File,
    "JSON Schema file of a structured answer (a JSON object with the keys the parser reads): the provider enforces it (`structured`), every answer is validated against it and re-asked with the validator's message",
);
pub(super) const STRUCTURED: OptionSpec = OptionSpec::default(
    "structured",
    Ty::Enum(&["auto", "require", "off"]),
    "\"auto\"",
    "with `schema`: \"auto\" sends it in the provider's structured-output mode and falls back to the parser's text protocol (one warning, recorded in the manifest) when the provider has none or refuses it; \"require\": no fallback (a provider without one is an error); \"off\": the text protocol",
);

/// Content checks of each parsed answer (shared with kinds that preset the rest).
pub(super) const CHECKS: OptionSpec = OptionSpec::optional(
    "checks",
    Ty::Map(&Ty::Any),
    "content checks of each parsed answer, a table `name = { kind, action, fields, ... }` (kinds: debris, repetition, echo, language, length, chat; `synth list` has their options): a failed check re-asks with its reason (`action = \"reask\"`), then drops the record to the failures (kind `check`, column `check`); `drop` drops at once, `flag` only counts",
);

// Generation options shared with kinds that preset the rest (`generate`).
pub(super) const TOP_P: OptionSpec = OptionSpec::optional("top_p", RATIO, "overrides the provider's");
pub(super) const SEED: OptionSpec =
    OptionSpec::optional("seed", Ty::Int(i64::MIN, i64::MAX), "overrides the provider's");
pub(super) const STOP: OptionSpec = OptionSpec::optional("stop", Ty::StrList, "overrides the provider's");
pub(super) const EXTRA: OptionSpec =
    OptionSpec::optional("extra", Ty::Map(&Ty::Any), "extra body parameters (merged over the provider's)");
pub(super) const KEEP_COLUMNS: OptionSpec =
    OptionSpec::optional("keep_columns", Ty::StrList, "input columns to carry over (default: all)");
pub(super) const CONCURRENCY: OptionSpec = OptionSpec::optional(
    "concurrency",
    POSITIVE,
    "records being prepared or sent at once (default: twice the provider's concurrency)",
)
.runtime_only();
// Batch mode and the cost cap, shared by every provider-calling kind (none changes the output).
pub(super) const BATCH: OptionSpec = OptionSpec::optional(
    "batch",
    Ty::Bool,
    "send uncached requests through the provider's batch API (half price, answers within its window; default: the provider's `batch`)",
)
.runtime_only();
pub(super) const BATCH_FALLBACK: OptionSpec = OptionSpec::optional(
    "batch_fallback",
    Ty::Enum(&["batch", "online"]),
    "lines a batch did not answer: \"batch\" (a new batch) or \"online\" (default: the provider's)",
)
.runtime_only();
pub(super) const MAX_COST_USD: OptionSpec = OptionSpec::optional(
    "max_cost_usd",
    synth_core::config::options::NUMBER,
    "stop sending before this stage's spending in the run would pass this many USD (see also [pipeline] max_cost_usd)",
)
.runtime_only();

pub static KIND: KindInfo = KindInfo {
    name: "llm",
    about: "prompt a provider per record, parse and validate the answer, re-ask on failure",
    options: OPTIONS,
    example: "provider = \"p\"\nmessages = \"question\"",
    build,
    ..KindInfo::DEFAULT
};

#[derive(Deserialize)]
pub(super) struct Options {
    pub(super) provider: String,
    pub(super) prompt: Option<String>,
    pub(super) messages: Option<String>,
    pub(super) system: Option<String>,
    pub(super) parser: String,
    pub(super) parser_options: Option<Value>,
    #[serde(default)]
    pub(super) schema: Option<String>,
    #[serde(default = "structured_auto")]
    pub(super) structured: String,
    #[serde(default)]
    pub(super) schemas: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub(super) schema_column: Option<String>,
    #[serde(default)]
    pub(super) checks: Option<Value>,
    pub(super) n: u32,
    pub(super) max_attempts: u32,
    #[serde(default = "one")]
    pub(super) candidates: u32,
    pub(super) reask: String,
    #[serde(default = "reask_all")]
    pub(super) reask_history: String,
    pub(super) temperature: Option<f64>,
    pub(super) top_p: Option<f64>,
    pub(super) max_tokens: Option<u32>,
    pub(super) seed: Option<i64>,
    pub(super) stop: Option<Vec<String>>,
    pub(super) extra: Option<serde_json::Map<String, Value>>,
    pub(super) output_prefix: String,
    #[serde(default)]
    pub(super) record_rejections: bool,
    pub(super) keep_columns: Option<Vec<String>>,
    pub(super) concurrency: Option<usize>,
    pub(super) batch: Option<bool>,
    pub(super) batch_fallback: Option<String>,
    pub(super) max_cost_usd: Option<f64>,
    /// `generate` only: answer with this phase's exported checkpoint (the second input's
    /// `gguf`) on the `local` provider instead of the provider's own model.
    #[serde(default)]
    pub(super) checkpoint: Option<String>,
}

fn structured_auto() -> String {
    "auto".into()
}

fn one() -> u32 {
    1
}

fn reask_all() -> String {
    "all".into()
}

/// Columns every LLM stage adds besides the parser's.
pub fn meta_fields(n: u32) -> Vec<Field> {
    let mut f = vec![
        Field::new("raw", DataType::Utf8, false),
        Field::new("model", DataType::Utf8, false),
        Field::new("tokens_in", DataType::Int64, false),
        Field::new("tokens_out", DataType::Int64, false),
        Field::new("finish_reason", DataType::Utf8, false),
        Field::new("attempts", DataType::Int64, false),
    ];
    if n > 1 {
        f.push(Field::new("sample", DataType::Int64, false));
    }
    f
}

struct Llm {
    opts: Options,
    templates: Arc<Templates>,
    vars: BTreeMap<String, Vec<String>>,
    parser: Arc<dyn Parser>,
    params: GenParams,
    /// The checked `schema` file (structured answers).
    schema: Option<Arc<SchemaFile>>,
    /// `schemas` by value of `schema_column` (each checked like `schema`).
    schemas: BTreeMap<String, Arc<SchemaFile>>,
    /// The names of the columns every output row carries (`output_prefix` + name).
    columns: Columns,
    /// Content checks of each parsed answer.
    checks: Arc<Checks>,
}

/// The fixed output column names, formatted once (not per row).
struct Columns {
    raw: String,
    model: String,
    tokens_in: String,
    tokens_out: String,
    finish_reason: String,
    attempts: String,
    sample: String,
    rejections: String,
}

impl Columns {
    fn new(prefix: &str) -> Columns {
        let name = |n: &str| format!("{prefix}{n}");
        Columns {
            raw: name("raw"),
            model: name("model"),
            tokens_in: name("tokens_in"),
            tokens_out: name("tokens_out"),
            finish_reason: name("finish_reason"),
            attempts: name("attempts"),
            sample: name("sample"),
            rejections: name("rejections"),
        }
    }
}

fn build(ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let opts: Options = ctx.parse(diags)?;
    build_with(opts, ctx, diags)
}

/// Build from options already parsed (also by kinds that preset them, e.g. `generate`).
pub(super) fn build_with(opts: Options, ctx: &BuildCtx<'_>, diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    let mut templates = Templates::new();
    let mut vars = BTreeMap::new();
    let mut ok = true;
    if opts.prompt.is_some() == opts.messages.is_some() {
        ctx.error(
            diags,
            "prompt",
            "set either `prompt` (a template file) or `messages` (a column with the conversation)",
        );
        return None;
    }
    if opts.messages.is_some() && opts.system.is_some() {
        ctx.error(diags, "system", "`system` goes with `prompt`; with `messages` the conversation carries its own");
        return None;
    }
    for (option, path) in [("prompt", opts.prompt.as_ref()), ("system", opts.system.as_ref())] {
        let Some(path) = path else { continue };
        let full = ctx.root.join(path);
        match std::fs::read_to_string(&full) {
            Ok(text) => match templates.add(option, &text) {
                Ok(v) => {
                    vars.insert(option.to_string(), v.into_iter().collect());
                }
                Err(e) => {
                    ctx.error(diags, option, format!("template {}: {e}", full.display()));
                    ok = false;
                }
            },
            Err(e) => {
                ctx.error(diags, option, format!("cannot read {}: {e}", full.display()));
                ok = false;
            }
        }
    }
    if let Err(e) = templates.add("reask", &opts.reask) {
        ctx.error(diags, "reask", format!("bad template: {e}"));
        ok = false;
    }
    let Some(kind) = parse::find(ctx.parsers, &opts.parser) else {
        let names: Vec<&str> = ctx.parsers.iter().map(|k| k.name).collect();
        let hint = synth_core::config::diag::did_you_mean(&opts.parser, names.iter().copied()).unwrap_or_default();
        ctx.error(diags, "parser", format!("unknown parser \"{}\"{hint} (parsers: {})", opts.parser, names.join(", ")));
        return None;
    };
    // Check parser options against the parser's schema, with spans.
    let parser_options = opts.parser_options.clone().unwrap_or(Value::Null);
    if let Some(extra) = parser_options.as_object() {
        for key in extra.keys() {
            if !kind.options.iter().any(|s| s.name == key) {
                let hint = synth_core::config::diag::did_you_mean(key, kind.options.iter().map(|s| s.name))
                    .unwrap_or_default();
                ctx.error(
                    diags,
                    "parser_options",
                    format!("unknown option \"{key}\" of parser \"{}\"{hint}", kind.name),
                );
                ok = false;
            }
        }
    }
    let parser = match (kind.build)(&parse::with_defaults(kind.options, &parser_options)) {
        Ok(p) => p,
        Err(e) => {
            ctx.error(diags, "parser_options", e);
            return None;
        }
    };
    let schema = match &opts.schema {
        Some(path) => match SchemaFile::load(&ctx.root.join(path), path) {
            Ok(file) => {
                let keys = parser.json_keys();
                if keys.is_empty() {
                    ctx.error(
                        diags,
                        "schema",
                        format!(
                            "parser \"{}\" reads text answers only: it cannot read a structured answer",
                            opts.parser
                        ),
                    );
                    ok = false;
                } else if let Err(e) = file.check_keys(&opts.parser, &keys) {
                    ctx.error(diags, "schema", e);
                    ok = false;
                }
                Some(Arc::new(file))
            }
            Err(e) => {
                ctx.error(diags, "schema", e);
                return None;
            }
        },
        None if opts.structured == "require" => {
            ctx.error(diags, "structured", "structured = \"require\" needs a `schema` (the JSON Schema of the answer)");
            return None;
        }
        None => None,
    };
    let mut schemas = BTreeMap::new();
    match (&opts.schemas, &opts.schema_column) {
        (None, None) => {}
        (Some(_), None) | (None, Some(_)) => {
            ctx.error(diags, "schemas", "`schemas` and `schema_column` go together (a schema per value of the column)");
            ok = false;
        }
        (Some(_), Some(_)) if schema.is_none() => {
            ctx.error(
                diags,
                "schemas",
                "`schemas` needs `schema` too: the schema of the records whose value is not listed",
            );
            ok = false;
        }
        (Some(files), Some(_)) => {
            for (value, path) in files {
                match SchemaFile::load(&ctx.root.join(path), path) {
                    Ok(file) => {
                        if let Err(e) = file.check_keys(&opts.parser, &parser.json_keys()) {
                            ctx.error(diags, &format!("schemas.{value}"), e);
                            ok = false;
                        }
                        schemas.insert(value.clone(), Arc::new(file));
                    }
                    Err(e) => {
                        ctx.error(diags, &format!("schemas.{value}"), e);
                        ok = false;
                    }
                }
            }
        }
    }
    let checks = match Checks::build(
        opts.checks.as_ref().unwrap_or(&Value::Null),
        &synth_quality::Env { default_fields: &parser.checked_fields() },
    ) {
        Ok(c) => c,
        Err(problems) => {
            for (name, msg) in problems {
                ctx.error(diags, &if name.is_empty() { "checks".to_string() } else { format!("checks.{name}") }, msg);
            }
            return None;
        }
    };
    let params = GenParams {
        temperature: opts.temperature,
        top_p: opts.top_p,
        max_tokens: opts.max_tokens,
        seed: opts.seed,
        stop: opts.stop.clone(),
        extra: opts.extra.clone().unwrap_or_default(),
    };
    ok.then(|| {
        let columns = Columns::new(&opts.output_prefix);
        Box::new(Llm {
            opts,
            templates: Arc::new(templates),
            vars,
            parser: Arc::from(parser),
            params,
            schema,
            schemas,
            columns,
            checks: Arc::new(checks),
        }) as Box<dyn Stage>
    })
}

/// A conversation column as chat messages (roles lowercased: the official layout's
/// `System` / `User` / `Assistant` become `system` / `user` / `assistant`).
fn conversation(row: &Row, column: &str) -> std::result::Result<Vec<Message>, RowError> {
    let bad = |m: String| RowError::new(FailureKind::Input, m);
    let list = row
        .get(column)
        .and_then(Value::as_array)
        .ok_or_else(|| bad(format!("column \"{column}\" is not a list of messages")))?;
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).and_then(ChatRole::parse);
        let content = m.get("content").and_then(Value::as_str);
        match (role, content) {
            (Some(r), Some(c)) => out.push(Message::new(r, c)),
            _ => return Err(bad(format!("{column}[{i}]: a message needs role system/user/assistant and content"))),
        }
    }
    if out.last().is_none_or(|m| m.role == ChatRole::Assistant) {
        return Err(bad(format!("column \"{column}\" must end with a system or user message")));
    }
    Ok(out)
}

impl Llm {
    fn added_fields(&self) -> Vec<Field> {
        let prefix = &self.opts.output_prefix;
        let rejections = self.opts.record_rejections.then(|| {
            let item = Field::new("item", DataType::Utf8, false);
            Field::new("rejections", DataType::List(std::sync::Arc::new(item)), false)
        });
        self.parser
            .fields()
            .into_iter()
            .chain(meta_fields(self.opts.n))
            .chain(rejections)
            .map(|f| f.clone().with_name(format!("{prefix}{}", f.name())))
            .collect()
    }

    fn output_schema(&self, input: &SchemaRef) -> std::result::Result<SchemaRef, String> {
        let kept: Vec<Field> = match &self.opts.keep_columns {
            Some(cols) => {
                let mut out = Vec::new();
                for c in cols.iter().filter(|c| c.as_str() != data::ID) {
                    out.push(
                        input
                            .field_with_name(c)
                            .map_err(|_| format!("no column \"{c}\" to keep (columns: {})", data::column_list(input)))?
                            .clone(),
                    );
                }
                out
            }
            None => input.fields().iter().skip(1).map(|f| f.as_ref().clone()).collect(),
        };
        let added = self.added_fields();
        for f in &added {
            if kept.iter().any(|k| k.name() == f.name()) {
                return Err(format!(
                    "the input already has a column \"{}\"; set output_prefix (e.g. \"{}_\") or keep_columns",
                    f.name(),
                    self.opts.parser
                ));
            }
        }
        Ok(data::schema_with_id(kept.into_iter().chain(added)))
    }
}

#[async_trait]
impl Stage for Llm {
    fn partitioning(&self, ctx: &PartitionCtx<'_>) -> Partitioning {
        partitioning(ctx, &self.opts.provider, self.opts.batch)
    }

    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        check_provider(ctx, &self.opts.provider);
        for (option, vars) in &self.vars {
            ctx.check_variables(option, "template", vars.iter().map(String::as_str), &[data::ID]);
        }
        if let Some(p) = &self.opts.prompt {
            ctx.files.push(ctx.root.join(p));
        }
        if let Some(m) = &self.opts.messages {
            ctx.require_columns("messages", 0, [m.as_str()]);
        }
        if let Some(s) = &self.opts.system {
            ctx.files.push(ctx.root.join(s));
        }
        if let Some(s) = &self.opts.schema {
            ctx.files.push(ctx.root.join(s));
        }
        for s in self.opts.schemas.iter().flat_map(|m| m.values()) {
            ctx.files.push(ctx.root.join(s));
        }
        if let Some(c) = &self.opts.schema_column {
            ctx.require_columns("schema_column", 0, [c.as_str()]);
        }
        match (&self.opts.checkpoint, ctx.inputs.len()) {
            (Some(_), 2) => {
                ctx.require_columns("checkpoint", 1, ["phase", "gguf"]);
                let kind = ctx.providers.get(&self.opts.provider).map(|d| d.kind.clone());
                if let Some(kind) = kind.filter(|k| ctx.provider_kind(k).is_some_and(|k| k.with_model.is_none())) {
                    ctx.error(
                        "checkpoint",
                        format!(
                            "provider \"{}\" is of kind \"{kind}\": a checkpoint's GGUF runs on a \"local\" provider",
                            self.opts.provider
                        ),
                    );
                }
            }
            (Some(_), n) => ctx.error(
                "checkpoint",
                format!("checkpoint needs a second input, the train stage that exported it (inputs = [\"test\", \"train\"]); found {n}"),
            ),
            (None, 1) => {}
            (None, n) => ctx.error("inputs", format!("one input (a second only with `checkpoint`); found {n}")),
        }
        let input = ctx.input_schema(0)?;
        match self.output_schema(&input) {
            Ok(s) => Some(s),
            Err(msg) => {
                ctx.error("output_prefix", msg);
                None
            }
        }
    }

    fn network_bound(&self, services: &synth_engine::services::Services) -> bool {
        services.provider_networked(&self.opts.provider)
    }

    async fn prepare(&self, ctx: &PrepareCtx<'_>) -> Result<Option<Prepared>> {
        provider_prepared(ctx, &self.opts.provider)
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let model = match &self.opts.checkpoint {
            Some(phase) => Some(checkpoint_gguf(ctx, phase)?),
            None => None,
        };
        let (provider, call, concurrency) = start_provider_with(
            ctx,
            &self.opts.provider,
            model.as_deref(),
            self.opts.concurrency,
            self.opts.max_cost_usd,
        )?;
        let schema = self.output_schema(&ctx.inputs[0].schema).map_err(|m| anyhow!(m))?;
        let rate = provider.rate.clone();
        let services = ctx.services.clone();
        let this = &*self;
        let structured = StructuredRun::start(ctx, self.schema.clone(), &self.opts.structured, &provider)?;
        let local_before = provider.backend.engine_stats();
        // Rejected answers (the re-asks) per record, for the report: the last pass over a
        // record sees them all (batch mode passes over a record more than once).
        let rejected: std::sync::Mutex<BTreeMap<String, Vec<Outcome>>> = Default::default();
        let answer = |row: Row, call: CallCtx| {
            let (provider, services) = (provider.clone(), services.clone());
            let (rejected, structured) = (&rejected, &structured);
            async move { this.answer(row, &services, &provider, &call, rejected, structured).await }
        };
        let batch = start_batch(ctx, &provider, &call, self.opts.batch, self.opts.batch_fallback.as_deref())?;
        match &batch {
            Some(b) => {
                batch_map_rows(ctx, 0, schema, concurrency, concurrency.max(COLLECT_CONCURRENCY), b, &call, &answer)
                    .await?
            }
            None => map_rows(ctx, 0, schema, concurrency, |row: Row| answer(row, call.clone())).await?,
        }
        if let Some(b) = &batch {
            report_batch(ctx, b);
        }
        let outcomes = rejected.into_inner().expect("rejection counts");
        report_outcomes(ctx, self.opts.candidates, outcomes.values().flatten());
        report_checks(ctx, &self.checks, outcomes.values().flatten());
        structured.report(ctx);
        report_local(ctx, &provider, local_before);
        report_limits(ctx, &rate);
        Ok(())
    }
}

/// An in-process provider's engine figures (a `local` provider's) over the stage's run into its report: decode calls and
/// seconds, prompt tokens (and how many of them were copied from another sequence's cache),
/// generated tokens, generated tokens per decode second (the engine is
/// shared: stages running at the same time on the provider count each other's work too).
pub fn report_local(ctx: &mut RunCtx, provider: &Provider, before: Option<synth_llm::EngineStats>) {
    let (Some(now), Some(before)) = (provider.backend.engine_stats(), before) else { return };
    let m = &mut ctx.report.metrics;
    m.insert("local_engine.decode_calls".into(), (now.decode_calls - before.decode_calls) as f64);
    let seconds = now.decode_seconds - before.decode_seconds;
    m.insert("local_engine.decode_seconds".into(), seconds);
    m.insert("local_engine.sample_seconds".into(), now.sample_seconds - before.sample_seconds);
    m.insert("local_engine.prompt_tokens".into(), (now.prompt_tokens - before.prompt_tokens) as f64);
    m.insert(
        "local_engine.reused_prompt_tokens".into(),
        (now.reused_prompt_tokens - before.reused_prompt_tokens) as f64,
    );
    let generated = now.generated_tokens - before.generated_tokens;
    m.insert("local_engine.generated_tokens".into(), generated as f64);
    if seconds > 0.0 {
        m.insert("local_engine.generated_tokens_per_decode_second".into(), generated as f64 / seconds);
    }
    if now.load_seconds > 0.0 {
        ctx.report.info.insert("local_load_seconds".into(), format!("{:.2}", now.load_seconds));
    }
}

/// How one sample of a record went: the failure kind of each answer rejected on the way,
/// and whether an answer was accepted in the end.
#[derive(Debug, Clone, Default)]
struct Outcome {
    rejected: Vec<FailureKind>,
    accepted: bool,
    /// Accepted at the first ask (one of its candidates).
    first_attempt: bool,
    checks: Vec<CheckEvent>,
    check_seconds: f64,
    /// Candidate answers neither taken nor re-asked.
    discarded: u64,
}

/// The stage's answer figures into its report: answers accepted first time, after a re-ask,
/// never (`answers.*`), and rejected answers per failure kind (`rejected.<kind>`).
fn report_outcomes<'a>(ctx: &mut RunCtx, candidates: u32, outcomes: impl Iterator<Item = &'a Outcome>) {
    let (mut first, mut reasked, mut failed, mut discarded) = (0u64, 0u64, 0u64, 0u64);
    let mut counts: BTreeMap<FailureKind, u64> = BTreeMap::new();
    for o in outcomes {
        match (o.accepted, o.first_attempt) {
            (true, true) => first += 1,
            (true, false) => reasked += 1,
            (false, _) => failed += 1,
        }
        discarded += o.discarded;
        for kind in &o.rejected {
            *counts.entry(*kind).or_default() += 1;
        }
    }
    let m = &mut ctx.report.metrics;
    m.insert("answers.first_attempt".into(), first as f64);
    m.insert("answers.after_reask".into(), reasked as f64);
    m.insert("answers.failed".into(), failed as f64);
    if candidates > 1 {
        m.insert("answers.discarded".into(), discarded as f64);
    }
    for (kind, n) in &counts {
        m.insert(format!("rejected.{kind}"), *n as f64);
    }
}

/// The content checks' figures into the report (`check.<name>.checked|failed|reasked|dropped|flagged`).
fn report_checks<'a>(ctx: &mut RunCtx, checks: &Checks, outcomes: impl Iterator<Item = &'a Outcome>) {
    if checks.is_empty() {
        return;
    }
    let tally = Tally::default();
    let mut seconds = 0.0;
    for o in outcomes {
        for e in &o.checks {
            tally.count(checks, &e.verdict, e.reasked, e.dropped);
        }
        seconds += o.check_seconds;
    }
    // CPU time in the checks (summed over records checked side by side).
    ctx.report.metrics.insert("checks.seconds".into(), seconds);
    let counts = tally.counts();
    for name in checks.names() {
        let c = counts.get(name).copied().unwrap_or_default();
        ctx.report.metrics.extend(c.metrics(name));
    }
}

/// Whether a stage run asks for structured answers, and its fallback to the text protocol:
/// decided at the start from the stage's `structured` and the provider's forms, and again
/// when the provider refuses a form (then the next form, or the text protocol with one
/// warning; the report says which was used, `structured` in the manifest).
pub(super) struct StructuredRun {
    schema: Option<Arc<SchemaFile>>,
    /// `structured = "require"`: a refusal fails the record instead of falling back.
    require: bool,
    stage: String,
    provider: String,
    /// Why the stage fell back to the text protocol (the first refusal, or no mode at all).
    fallback: std::sync::Mutex<Option<String>>,
    /// Forms a request was sent in.
    used: std::sync::Mutex<std::collections::BTreeSet<&'static str>>,
}

impl StructuredRun {
    pub(super) fn start(
        ctx: &RunCtx,
        schema: Option<Arc<SchemaFile>>,
        mode: &str,
        provider: &Provider,
    ) -> Result<StructuredRun> {
        let schema = schema.filter(|_| mode != "off");
        let run = StructuredRun {
            require: mode == "require",
            stage: ctx.name.clone(),
            provider: provider.name.clone(),
            fallback: Default::default(),
            used: Default::default(),
            schema,
        };
        if run.schema.is_some() && provider.structured.current().is_none() {
            let why = if provider.structured.forms().is_empty() {
                format!("provider \"{}\" ({}) has no structured-output mode", provider.name, provider.kind)
            } else {
                format!("provider \"{}\" refused every structured-output form earlier in this run", provider.name)
            };
            if run.require {
                anyhow::bail!("structured = \"require\", but {why}");
            }
            run.fall_back(provider, why);
        }
        Ok(run)
    }

    /// Answers use the text protocol from now on, because `why` (said once per stage).
    fn fall_back(&self, provider: &Provider, why: String) {
        let mut fallback = self.fallback.lock().expect("fallback");
        if fallback.is_some() {
            return;
        }
        // A stand-in (the offline generator) has no structured mode by design: nothing to say.
        if provider.offline_identity.is_none() {
            tracing::warn!("stage \"{}\": {why}: answers use the parser's text protocol", self.stage);
        }
        *fallback = Some(why);
    }

    /// The structured part of the next request (`None`: the text protocol), in `pick` (a
    /// record's own schema) or the stage's schema.
    fn request<'a>(
        &'a self,
        provider: &Provider,
        pick: Option<&'a Arc<SchemaFile>>,
    ) -> Option<(Structured, &'a SchemaFile)> {
        let schema = pick.filter(|_| self.schema.is_some()).or(self.schema.as_ref())?;
        if self.fallback.lock().expect("fallback").is_some() && !self.require {
            return None;
        }
        let Some(form) = provider.structured.current() else {
            // Another stage on the provider had the last form refused after this one
            // started: this stage falls back too, and says so.
            if !self.require {
                let why =
                    format!("provider \"{}\" refused every structured-output form earlier in this run", self.provider);
                self.fall_back(provider, why);
            }
            return None;
        };
        self.used.lock().expect("forms").insert(form.name());
        Some((Structured { form, schema: schema.request.clone() }, schema))
    }

    /// A request in `form` failed with `err`: whether it was the provider refusing the form
    /// (then the next request uses the next form, or the text protocol).
    fn refused(&self, provider: &Provider, form: Form, err: &synth_llm::LlmError) -> bool {
        if self.require || err.kind != synth_llm::ErrorKind::Rejected || !form.refused_by(&err.message) {
            return false;
        }
        match provider.structured.refused(form) {
            Some(next) => {
                tracing::info!(
                    "stage \"{}\": provider \"{}\" refused structured form {} ({}); trying {}",
                    self.stage,
                    self.provider,
                    form.name(),
                    err.message,
                    next.name()
                );
            }
            None => {
                let mut fallback = self.fallback.lock().expect("fallback");
                if fallback.is_none() {
                    tracing::warn!(
                        "stage \"{}\": provider \"{}\" refused structured output ({}): answers use the parser's text protocol",
                        self.stage,
                        self.provider,
                        err.message
                    );
                    *fallback = Some(format!("provider \"{}\" refused it: {}", self.provider, err.message));
                }
            }
        }
        true
    }

    fn report(&self, ctx: &mut RunCtx) {
        if self.schema.is_none() {
            return;
        }
        let used: Vec<&str> = self.used.lock().expect("forms").iter().copied().collect();
        let info = &mut ctx.report.info;
        match self.fallback.lock().expect("fallback").as_ref() {
            Some(why) => {
                info.insert("structured".into(), "text".into());
                info.insert("structured_fallback".into(), synth_core::secrets::scrub(why));
                ctx.report.metrics.insert("structured.fallback".into(), 1.0);
            }
            None => {
                info.insert("structured".into(), used.join(", "));
            }
        }
        if !used.is_empty() {
            info.insert("structured_forms_tried".into(), used.join(", "));
        }
    }
}

/// Records in flight in a collecting pass of batch mode (no network: rendering and lookups).
const COLLECT_CONCURRENCY: usize = 256;

impl Llm {
    /// The output rows of one record: its `n` samples (asked side by side), each
    /// re-asked with the parser's reason until it parses or `max_attempts` is reached.
    async fn answer(
        &self,
        row: Row,
        services: &Arc<Services>,
        provider: &Arc<Provider>,
        call: &CallCtx,
        rejected: &std::sync::Mutex<BTreeMap<String, Vec<Outcome>>>,
        structured: &StructuredRun,
    ) -> std::result::Result<Vec<Row>, RowError> {
        let mut messages = Vec::new();
        if let Some(col) = &self.opts.messages {
            messages = conversation(&row, col)?;
        } else if self.opts.system.is_some() {
            let system = self
                .templates
                .render("system", &row)
                .map_err(|e| RowError::new(FailureKind::Template, format!("system: {e}")))?;
            messages.push(Message::new(ChatRole::System, system));
        }
        if self.opts.messages.is_none() {
            let user = self
                .templates
                .render("prompt", &row)
                .map_err(|e| RowError::new(FailureKind::Template, format!("prompt: {e}")))?;
            messages.push(Message::new(ChatRole::User, user));
        }
        let id = row.get(data::ID).and_then(Value::as_str).unwrap_or_default().to_string();
        // What an `echo` check compares with: the messages as sent.
        let prompt = if self.checks.is_empty() {
            String::new()
        } else {
            messages.iter().map(|m| m.content.as_str()).collect::<Vec<_>>().join("\n\n")
        };
        let samples = futures::future::join_all((0..self.opts.n).map(|sample| {
            self.sample(&messages, sample, &row, &prompt, Asker { services, provider, call, structured })
        }))
        .await;
        // Batch mode passes over a record more than once: the last pass has its outcome.
        let outcomes = samples
            .iter()
            .map(|(r, log)| Outcome {
                rejected: log.kinds.clone(),
                accepted: r.is_ok(),
                first_attempt: matches!(r, Ok((_, _, 1))),
                checks: log.checks.clone(),
                check_seconds: log.check_seconds,
                discarded: log.discarded,
            })
            .collect();
        rejected.lock().expect("rejection counts").insert(id.clone(), outcomes);
        let mut out_rows = Vec::with_capacity(samples.len());
        for (sample, (result, SampleLog { kinds, .. })) in samples.into_iter().enumerate() {
            let (fields, completed, attempts) = result?;
            let mut out = Row::new();
            let out_id = if self.opts.n > 1 { format!("{id}/{sample}") } else { id.clone() };
            out.insert(data::ID.into(), Value::String(out_id));
            for (k, v) in &row {
                if k != data::ID && self.opts.keep_columns.as_ref().is_none_or(|cols| cols.contains(k)) {
                    out.insert(k.clone(), v.clone());
                }
            }
            let prefix = &self.opts.output_prefix;
            for (k, v) in fields {
                out.insert(format!("{prefix}{k}"), v);
            }
            let r = completed.response;
            let c = &self.columns;
            out.insert(c.raw.clone(), Value::String(r.text));
            out.insert(c.model.clone(), Value::String(r.model));
            out.insert(c.tokens_in.clone(), Value::from(r.usage.prompt_tokens));
            out.insert(c.tokens_out.clone(), Value::from(r.usage.completion_tokens));
            out.insert(c.finish_reason.clone(), Value::String(r.finish_reason));
            out.insert(c.attempts.clone(), Value::from(attempts));
            if self.opts.n > 1 {
                out.insert(c.sample.clone(), Value::from(sample));
            }
            if self.opts.record_rejections {
                let kinds: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
                out.insert(c.rejections.clone(), serde_json::json!(kinds));
            }
            out_rows.push(out);
        }
        Ok(out_rows)
    }

    /// One sample: ask, parse, re-ask with the reason. Also returns the failure kind of
    /// every answer the parser rejected on the way.
    async fn sample(
        &self,
        messages: &[Message],
        sample: u32,
        row: &Row,
        prompt: &str,
        asker: Asker<'_>,
    ) -> (std::result::Result<(Row, Completed, u32), RowError>, SampleLog) {
        let Asker { services, provider, call, structured } = asker;
        let mut convo = messages.to_vec();
        let mut last_error = String::new();
        let mut last_kind = FailureKind::Validation;
        let mut log = SampleLog::default();
        let mut answers = Answers::default();
        let mut attempt = 1;
        // Each round asks `candidates` answers of the same messages at once (candidate j of
        // sample s is sample index s + j·n, so candidate 0 is the request asked without
        // candidates); the lowest index that passes is the answer, whatever order they end in.
        let k = self.opts.candidates.max(1);
        // A refused structured form is asked again in the next form (or as text), as the
        // same attempt; a provider has a handful of forms, so this ends.
        let mut refusals = 0;
        while attempt <= self.opts.max_attempts {
            let structured_req = structured.request(provider, self.schema_for(row));
            let asks = (0..k).map(|j| {
                let req = ChatRequest {
                    messages: convo.clone(),
                    params: self.params.clone(),
                    sample: sample + j * self.opts.n,
                    expect: self.parser.expect(),
                    structured: structured_req.as_ref().map(|(s, _)| s.clone()),
                };
                services.chat(provider, req, call)
            });
            let results = futures::future::join_all(asks).await;
            let last = attempt >= self.opts.max_attempts;
            // The round's rejected candidates, in index order, and the first that a check
            // drops at once.
            let mut failed: Vec<Rejected> = Vec::new();
            let mut drop_at: Option<usize> = None;
            let mut refused = false;
            for (j, result) in results.into_iter().enumerate() {
                let completed = match result {
                    Ok(c) => c,
                    Err(e) => {
                        if let Some((s, _)) = &structured_req
                            && refusals < 8
                            && structured.refused(provider, s.form, &e)
                        {
                            refused = true;
                            break;
                        }
                        // The lowest candidate decides: an error fails the record as it
                        // does without candidates.
                        self.settle_round(&mut log, &mut answers, &failed, None, false);
                        let err = RowError {
                            kind: FailureKind::Llm,
                            message: e.to_string(),
                            fatal: e.kind.fatal(),
                            answers: (answers.raw.is_some()).then(|| Box::new(answers.clone())),
                        };
                        return (Err(err), log);
                    }
                };
                let text = completed.response.text.clone();
                let accepted = match &structured_req {
                    Some((_, schema)) => match schema.read(&text) {
                        Ok(obj) => self.parser.accept_json(&obj, row),
                        Err(reason) => Err(parse::Rejection::invalid(reason)),
                    },
                    None => self.parser.accept(&text, row),
                };
                // Content checks of a parsed answer: a failure is a rejection of kind `check`
                // (re-asked with its reason), or drops the record (`action = "drop"`: at
                // once, unless another candidate of the round passes).
                let (accepted, check, event) = match accepted {
                    // (Not on `--dry-run`'s stand-in answers: their words are no model's, and a
                    // re-ask they caused would count calls a real model may not need.)
                    Ok(fields) if !self.checks.is_empty() && !services.estimating() => {
                        match self.vet(fields, row, prompt, &mut log) {
                            Vetted::Pass(fields) => (Ok(fields), None, None),
                            Vetted::Fail { check, reason, drop, event } => {
                                if drop && drop_at.is_none() {
                                    drop_at = Some(failed.len());
                                }
                                (Err(parse::Rejection { kind: FailureKind::Check, reason }), Some(check), Some(event))
                            }
                        }
                    }
                    other => (other, None, None),
                };
                match accepted {
                    Ok(fields) => {
                        // Candidates after this one are not read.
                        log.discarded += (k as usize - 1 - j) as u64;
                        self.settle_round(&mut log, &mut answers, &failed, None, false);
                        return (Ok((fields, completed, attempt)), log);
                    }
                    Err(parse::Rejection { kind, reason }) => {
                        failed.push(Rejected { kind, reason, text, check, event })
                    }
                }
            }
            if refused {
                refusals += 1;
                continue;
            }
            // No candidate passed: the record is dropped (a check said so, or no attempt
            // is left), or candidate 0's answer is re-asked with its reason.
            if let Some(d) = drop_at {
                self.settle_round(&mut log, &mut answers, &failed, Some(d), true);
                let r = &failed[d];
                let err = RowError::new(FailureKind::Check, format!("dropped by a check: {}", r.reason))
                    .with_answers(answers);
                return (Err(err), log);
            }
            self.settle_round(&mut log, &mut answers, &failed, Some(0), last);
            let first = &failed[0];
            last_kind = first.kind;
            last_error = first.reason.clone();
            if !last {
                let ctx = minijinja::context! { error => first.reason.clone() };
                let reask = self.templates.render_value("reask", ctx).unwrap_or_else(|_| last_error.clone());
                if self.opts.reask_history == "last" {
                    convo.truncate(messages.len());
                }
                convo.push(Message::new(ChatRole::Assistant, first.text.clone()));
                convo.push(Message::new(ChatRole::User, reask));
            }
            attempt += 1;
        }
        let err = RowError::new(
            last_kind,
            format!("no usable answer after {} attempt(s): {last_error}", self.opts.max_attempts),
        )
        .with_answers(answers);
        (Err(err), log)
    }

    /// Account for a round's rejected candidates: each is a rejected answer; the one at
    /// `kept` (re-asked, or the reason its record is dropped) goes into the record's history,
    /// its check event marked re-asked (`stop` false) or dropping (`stop` true); the others
    /// are discarded (a failed check counted, neither re-asked nor dropping).
    fn settle_round(
        &self,
        log: &mut SampleLog,
        answers: &mut Answers,
        failed: &[Rejected],
        kept: Option<usize>,
        stop: bool,
    ) {
        for (j, r) in failed.iter().enumerate() {
            log.kinds.push(r.kind);
            if Some(j) == kept {
                if let Some(e) = r.event {
                    log.checks[e].reasked = !stop;
                    log.checks[e].dropped = stop;
                }
                answers.attempts.push(r.reason.clone());
                answers.raw = Some(r.text.clone());
                answers.check = r.check.clone();
            } else {
                log.discarded += 1;
            }
        }
    }

    /// The schema of `row`'s structured answer: the one `schemas` lists for its
    /// `schema_column` value, else the stage's `schema`.
    fn schema_for(&self, row: &Row) -> Option<&Arc<SchemaFile>> {
        let column = self.opts.schema_column.as_ref()?;
        let value = match row.get(column) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None => return None,
            Some(v) => v.to_string(),
        };
        self.schemas.get(&value)
    }

    /// Run the content checks on a parsed answer; a failure's event is logged neither
    /// re-asked nor dropping (the round decides: `settle_round`).
    fn vet(&self, fields: Row, row: &Row, prompt: &str, log: &mut SampleLog) -> Vetted {
        let started = std::time::Instant::now();
        let verdict = self.checks.run(&synth_quality::Subject { fields: &fields, record: row, prompt: Some(prompt) });
        log.check_seconds += started.elapsed().as_secs_f64();
        let blocking = verdict.blocking();
        let drop = blocking.iter().any(|f| f.action == Action::Drop);
        let Some(first) = blocking.first() else {
            log.checks.push(CheckEvent { verdict, reasked: false, dropped: false });
            return Vetted::Pass(fields);
        };
        let check = first.check.clone();
        let reason =
            blocking.iter().map(|f| format!("check \"{}\": {}", f.check, f.reason)).collect::<Vec<_>>().join("; ");
        log.checks.push(CheckEvent { verdict: verdict.clone(), reasked: false, dropped: false });
        Vetted::Fail { check, reason, drop, event: log.checks.len() - 1 }
    }
}

/// What the content checks made of an answer.
enum Vetted {
    Pass(Row),
    /// It failed (the first failed check's name, the reasons, whether a failed check drops
    /// the record at once, its event in the sample's log).
    Fail {
        check: String,
        reason: String,
        drop: bool,
        event: usize,
    },
}

/// A candidate answer the parser, the schema or a check rejected.
struct Rejected {
    kind: FailureKind,
    reason: String,
    text: String,
    /// The check that failed it (`None`: the parser or the schema).
    check: Option<String>,
    /// Its check event in the sample's log.
    event: Option<usize>,
}

/// One checked answer: the checks it failed, and whether it was re-asked or its record dropped.
#[derive(Debug, Clone)]
struct CheckEvent {
    verdict: synth_quality::Verdict,
    reasked: bool,
    dropped: bool,
}

/// What happened on the way to a sample's answer: the failure kind of every rejected
/// answer, and every content-checked answer.
#[derive(Debug, Clone, Default)]
struct SampleLog {
    kinds: Vec<FailureKind>,
    checks: Vec<CheckEvent>,
    /// Time spent running the content checks.
    check_seconds: f64,
    /// Candidate answers neither taken nor re-asked (`candidates` > 1).
    discarded: u64,
}

/// Who a sample asks, and how: the services, the provider, the call context and the
/// stage's structured-answer state.
#[derive(Clone, Copy)]
struct Asker<'a> {
    services: &'a Arc<Services>,
    provider: &'a Arc<Provider>,
    call: &'a CallCtx,
    structured: &'a StructuredRun,
}

/// Plan check of a stage that calls a provider: the provider exists (with a hint).
pub fn check_provider(ctx: &mut PlanCtx<'_>, provider: &str) {
    if !ctx.providers.contains_key(provider) {
        let hint = synth_core::config::diag::did_you_mean(provider, ctx.providers.keys().map(String::as_str))
            .unwrap_or_default();
        ctx.error("provider", format!("no provider \"{provider}\" in [providers]{hint}"));
    }
}

/// What a provider-calling stage's outputs depend on besides its options: the provider's identity.
pub fn provider_prepared(ctx: &PrepareCtx<'_>, provider: &str) -> Result<Option<Prepared>> {
    let identity = ctx.services.provider_identity(provider)?;
    let mut p = Prepared::default();
    p.fingerprint.insert("provider".into(), identity.to_string());
    Ok(Some(p))
}

/// The provider a stage calls, its call context, and how many records to keep in flight
/// (`concurrency`, default twice the provider's); the provider is named in the report.
pub fn start_provider(
    ctx: &mut RunCtx,
    provider: &str,
    concurrency: Option<usize>,
    max_cost_usd: Option<f64>,
) -> Result<(Arc<Provider>, CallCtx, usize)> {
    start_provider_with(ctx, provider, None, concurrency, max_cost_usd)
}

/// The GGUF file the second input (a `train` stage's checkpoints) exported for `phase`.
fn checkpoint_gguf(ctx: &RunCtx, phase: &str) -> Result<std::path::PathBuf> {
    let input = ctx.inputs.get(1).ok_or_else(|| anyhow!("checkpoint needs a second input (a train stage)"))?;
    let (_, batches) = synth_core::store::parquet::read_all(&input.path)?;
    let mut found = None;
    let mut phases = Vec::new();
    for b in &batches {
        for i in 0..b.num_rows() {
            let r = data::row_json(b, i);
            let p = r.get("phase").and_then(Value::as_str).unwrap_or_default().to_string();
            if let Some(g) = r.get("gguf").and_then(Value::as_str) {
                if p == phase {
                    // The last one of the phase is its result.
                    found = Some(g.to_string());
                }
                phases.push(p);
            }
        }
    }
    let rel = found.ok_or_else(|| {
        anyhow!(
            "no GGUF checkpoint of phase \"{phase}\" in input \"{}\" (exported phases: {}; the trainer writes them with --export-gguf)",
            input.name,
            if phases.is_empty() { "none".to_string() } else { phases.join(", ") }
        )
    })?;
    let path = ctx.out_dir.join(&rel);
    if !path.is_file() {
        anyhow::bail!("the {phase} checkpoint {} (input \"{}\") is missing", path.display(), input.name);
    }
    Ok(path)
}

/// [`start_provider`], with `model` in place of a `local` provider's own model file.
pub fn start_provider_with(
    ctx: &mut RunCtx,
    provider: &str,
    model: Option<&std::path::Path>,
    concurrency: Option<usize>,
    max_cost_usd: Option<f64>,
) -> Result<(Arc<Provider>, CallCtx, usize)> {
    let p = match model {
        Some(m) => ctx.services.provider_with_model(provider, m)?,
        // The provider's name in the error, once (a build error may name it already).
        None => ctx.services.provider(provider).map_err(|e| {
            let named = format!("provider \"{provider}\"");
            if format!("{e:#}").starts_with(&named) { e } else { e.context(named) }
        })?,
    };
    ctx.report.info.insert("provider".into(), p.name.clone());
    ctx.report.info.insert("model".into(), p.model.clone());
    ctx.report.info.insert("provider_kind".into(), p.kind.into());
    let costs = &ctx.services.costs;
    costs.set_stage_cap(&ctx.name, max_cost_usd);
    if costs.capped(&ctx.name) && p.price.is_none() {
        anyhow::bail!(
            "max_cost_usd is set but no price is known for model \"{}\": set price_input_per_mtok and price_output_per_mtok on provider \"{}\" (a cap that cannot count would not stop anything)",
            p.model,
            p.name
        );
    }
    let call = CallCtx::new(&ctx.name, &ctx.fingerprint, ctx.progress.clone());
    let concurrency = concurrency.unwrap_or(p.rate.cfg.max_concurrency * 2);
    Ok((p, call, concurrency))
}

/// How a provider-calling stage splits: record by record, except in batch mode, which
/// runs once (a provider batch is already the provider's parallelism, and its journal
/// is one output directory's).
pub fn partitioning(ctx: &PartitionCtx<'_>, provider: &str, batch: Option<bool>) -> Partitioning {
    let provider_default =
        || ctx.providers.get(provider).and_then(|d| d.options.get("batch")).and_then(serde_json::Value::as_bool);
    if batch.or_else(provider_default).unwrap_or(false) { Partitioning::Whole } else { Sharding::HEAVY }
}

/// Batch mode for a provider-calling stage, when its `batch` option (else its
/// provider's) asks for it and the provider has a batch API; the mode is in the report.
pub fn start_batch(
    ctx: &mut RunCtx,
    provider: &Arc<Provider>,
    call: &CallCtx,
    batch: Option<bool>,
    fallback: Option<&str>,
) -> Result<Option<Arc<BatchStage>>> {
    let Some(settings) = &provider.batch else {
        if batch == Some(true) {
            tracing::info!(
                "stage \"{}\": provider \"{}\" is {} (no batch API): its requests are answered directly",
                ctx.name,
                provider.name,
                provider.kind
            );
        }
        return Ok(None);
    };
    if !batch.unwrap_or(settings.default_on) {
        return Ok(None);
    }
    let fallback_online = fallback.unwrap_or(&settings.fallback) == "online";
    let b = BatchStage::start(&ctx.services, provider, call, &ctx.cancel, StageBatch { fallback_online })?;
    let info = &mut ctx.report.info;
    info.insert("mode".into(), "batch".into());
    info.insert("batch_api".into(), provider.batch_api_kind().unwrap_or_default().into());
    info.insert("batch_price_factor".into(), settings.price_factor.to_string());
    info.insert("batch_fallback".into(), if fallback_online { "online" } else { "batch" }.into());
    Ok(Some(b))
}

/// A batch stage's figures into its report: batches, lines, answers, resubmissions, the
/// batch cost and what the same answers would have cost online. The last pass found
/// every batch answer in the cache: those are not counted as cache hits.
pub fn report_batch(ctx: &mut RunCtx, b: &BatchStage) {
    let f = b.figures();
    let hits = ctx.progress.cache_hits.load(std::sync::atomic::Ordering::Relaxed);
    ctx.progress.cache_hits.store(hits.saturating_sub(f.answered), std::sync::atomic::Ordering::Relaxed);
    let m = &mut ctx.report.metrics;
    m.insert("batch.batches".into(), f.batches as f64);
    m.insert("batch.submitted".into(), f.submitted as f64);
    m.insert("batch.answered".into(), f.answered as f64);
    m.insert("batch.resubmitted".into(), f.resubmitted as f64);
    m.insert("batch.rejected".into(), f.rejected as f64);
    m.insert("batch.gave_up".into(), f.gave_up as f64);
    m.insert("batch.online_fallback".into(), f.online_fallback as f64);
    m.insert("batch.cost_usd".into(), f.cost_usd);
    m.insert("batch.online_cost_usd".into(), f.online_cost_usd);
}

/// The request limits in force at the end of a stage (learned from the server where it
/// advertised any), into the report.
pub fn report_limits(ctx: &mut RunCtx, rate: &synth_llm::rate::RateControl) {
    for (k, v) in rate.limits() {
        ctx.report.info.insert(k.into(), v.to_string());
    }
}
