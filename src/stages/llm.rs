//! `llm`: for each record, render prompt templates (files; variables are the
//! record's columns), call a provider (`n` samples optional), parse the answer with
//! a named parser, and on a parse failure ask again with the reason appended, up to
//! `max_attempts`; a record that never parses goes to the failure table with the
//! reason. Output: the input columns, the parsed fields, and `raw`, `model`,
//! `tokens_in`, `tokens_out`, `finish_reason`, `attempts` (and `sample` when n > 1).
//! Every call goes through the shared cache, so re-runs and resumed runs do not pay
//! again.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow};
use arrow::datatypes::{DataType, Field, SchemaRef};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;

use super::exec::{RowError, map_rows};
use super::{Arity, BuildCtx, KindInfo, PlanCtx, PrepareCtx, Prepared, Role, RunCtx, Stage};
use crate::config::diag::Diagnostics;
use crate::config::options::{OptionSpec, POSITIVE, RATIO, Ty};
use crate::data::chat::Role as ChatRole;
use crate::data::{self, Row};
use crate::llm::parse::{self, Parser};
use crate::llm::{CallCtx, ChatRequest, GenParams, Message};
use crate::store::failures::FailureKind;
use crate::template::Templates;

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
    OptionSpec::default("n", POSITIVE, "1", "answers per record (each its own row, id \"<id>/<k>\")"),
    OptionSpec::default("max_attempts", POSITIVE, "3", "asks per answer when it does not parse"),
    OptionSpec::default(
        "reask",
        Ty::Str,
        "\"Your answer could not be used: {{ error }}. Answer again, following the required format exactly.\"",
        "message appended after an answer that did not parse ({{ error }} is the reason)",
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
];

// Generation options shared with kinds that preset the rest (`generate`).
pub(super) const TOP_P: OptionSpec = OptionSpec::optional("top_p", RATIO, "overrides the provider's");
pub(super) const SEED: OptionSpec =
    OptionSpec::optional("seed", Ty::Int(i64::MIN, i64::MAX), "overrides the provider's");
pub(super) const STOP: OptionSpec = OptionSpec::optional("stop", Ty::StrList, "overrides the provider's");
pub(super) const EXTRA: OptionSpec =
    OptionSpec::optional("extra", Ty::Map(&Ty::Any), "extra body parameters (merged over the provider's)");
pub(super) const KEEP_COLUMNS: OptionSpec =
    OptionSpec::optional("keep_columns", Ty::StrList, "input columns to carry over (default: all)");
pub(super) const CONCURRENCY: OptionSpec =
    OptionSpec::optional("concurrency", POSITIVE, "records in flight (default: twice the provider's concurrency)")
        .runtime_only();

pub static KIND: KindInfo = KindInfo {
    name: "llm",
    version: 1,
    about: "prompt a provider per record, parse and validate the answer, re-ask on failure",
    role: Role::Transform,
    arity: Arity::Exactly(1),
    options: OPTIONS,
    uses_seed: false,
    summary: false,
    example: "provider = \"p\"\nmessages = \"question\"",
    build,
};

#[derive(Deserialize)]
pub(super) struct Options {
    pub(super) provider: String,
    pub(super) prompt: Option<String>,
    pub(super) messages: Option<String>,
    pub(super) system: Option<String>,
    pub(super) parser: String,
    pub(super) parser_options: Option<Value>,
    pub(super) n: u32,
    pub(super) max_attempts: u32,
    pub(super) reask: String,
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
        let hint = crate::config::diag::did_you_mean(&opts.parser, names.iter().copied()).unwrap_or_default();
        ctx.error(diags, "parser", format!("unknown parser \"{}\"{hint} (parsers: {})", opts.parser, names.join(", ")));
        return None;
    };
    // Check parser options against the parser's schema, with spans.
    let parser_options = opts.parser_options.clone().unwrap_or(Value::Null);
    if let Some(extra) = parser_options.as_object() {
        for key in extra.keys() {
            if !kind.options.iter().any(|s| s.name == key) {
                let hint =
                    crate::config::diag::did_you_mean(key, kind.options.iter().map(|s| s.name)).unwrap_or_default();
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
    let params = GenParams {
        temperature: opts.temperature,
        top_p: opts.top_p,
        max_tokens: opts.max_tokens,
        seed: opts.seed,
        stop: opts.stop.clone(),
        extra: opts.extra.clone().unwrap_or_default(),
    };
    ok.then(|| {
        Box::new(Llm { opts, templates: Arc::new(templates), vars, parser: Arc::from(parser), params })
            as Box<dyn Stage>
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
        let input = ctx.input_schema(0)?;
        match self.output_schema(&input) {
            Ok(s) => Some(s),
            Err(msg) => {
                ctx.error("output_prefix", msg);
                None
            }
        }
    }

    fn network_bound(&self, services: &crate::services::Services) -> bool {
        services.provider_networked(&self.opts.provider)
    }

    async fn prepare(&self, ctx: &PrepareCtx<'_>) -> Result<Option<Prepared>> {
        provider_prepared(ctx, &self.opts.provider)
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let (provider, call, concurrency) = start_provider(ctx, &self.opts.provider, self.opts.concurrency)?;
        let schema = self.output_schema(&ctx.inputs[0].schema).map_err(|m| anyhow!(m))?;
        let rate = provider.rate.clone();
        let services = ctx.services.clone();
        let keep: Option<Vec<String>> = self.opts.keep_columns.clone();
        let expect = self.parser.expect();
        let this = &*self;
        // Rejected answers by failure kind (the re-asks), for the report.
        let rejected: Arc<std::sync::Mutex<BTreeMap<FailureKind, u64>>> = Arc::default();
        map_rows(ctx, 0, schema, concurrency, |row: Row| {
            let (provider, services, call, keep, expect, rejected) =
                (provider.clone(), services.clone(), call.clone(), keep.clone(), expect.clone(), rejected.clone());
            async move {
                let mut messages = Vec::new();
                if let Some(col) = &this.opts.messages {
                    messages = conversation(&row, col)?;
                } else if this.opts.system.is_some() {
                    let system = this
                        .templates
                        .render("system", &row)
                        .map_err(|e| RowError::new(FailureKind::Template, format!("system: {e}")))?;
                    messages.push(Message::new(ChatRole::System, system));
                }
                if this.opts.messages.is_none() {
                    let user = this
                        .templates
                        .render("prompt", &row)
                        .map_err(|e| RowError::new(FailureKind::Template, format!("prompt: {e}")))?;
                    messages.push(Message::new(ChatRole::User, user));
                }
                let id = row.get(data::ID).and_then(Value::as_str).unwrap_or_default().to_string();
                let mut out_rows = Vec::new();
                for sample in 0..this.opts.n {
                    let mut convo = messages.clone();
                    let mut last_error = String::new();
                    let mut last_kind = FailureKind::Validation;
                    let mut kinds: Vec<FailureKind> = Vec::new();
                    let mut done = None;
                    for attempt in 1..=this.opts.max_attempts {
                        let req = ChatRequest {
                            messages: convo.clone(),
                            params: this.params.clone(),
                            sample,
                            expect: expect.clone(),
                        };
                        let completed = services.chat(&provider, req, &call).await.map_err(|e| RowError {
                            kind: FailureKind::Llm,
                            message: e.to_string(),
                            fatal: e.kind.fatal(),
                        })?;
                        let text = completed.response.text.clone();
                        match this.parser.accept(&text, &row) {
                            Ok(fields) => {
                                done = Some((fields, completed, attempt));
                                break;
                            }
                            Err(parse::Rejection { kind, reason }) => {
                                *rejected.lock().expect("rejection counts").entry(kind).or_default() += 1;
                                kinds.push(kind);
                                last_kind = kind;
                                last_error = reason.clone();
                                let ctx = minijinja::context! { error => reason };
                                let reask =
                                    this.templates.render_value("reask", ctx).unwrap_or_else(|_| last_error.clone());
                                convo.push(Message::new(ChatRole::Assistant, text));
                                convo.push(Message::new(ChatRole::User, reask));
                            }
                        }
                    }
                    let Some((fields, completed, attempts)) = done else {
                        return Err(RowError::new(
                            last_kind,
                            format!("no usable answer after {} attempt(s): {last_error}", this.opts.max_attempts),
                        ));
                    };
                    let mut out = Row::new();
                    let out_id = if this.opts.n > 1 { format!("{id}/{sample}") } else { id.clone() };
                    out.insert(data::ID.into(), Value::String(out_id));
                    for (k, v) in &row {
                        if k != data::ID && keep.as_ref().is_none_or(|cols| cols.contains(k)) {
                            out.insert(k.clone(), v.clone());
                        }
                    }
                    let prefix = &this.opts.output_prefix;
                    for (k, v) in fields {
                        out.insert(format!("{prefix}{k}"), v);
                    }
                    let r = &completed.response;
                    out.insert(format!("{prefix}raw"), Value::String(r.text.clone()));
                    out.insert(format!("{prefix}model"), Value::String(r.model.clone()));
                    out.insert(format!("{prefix}tokens_in"), Value::from(r.usage.prompt_tokens));
                    out.insert(format!("{prefix}tokens_out"), Value::from(r.usage.completion_tokens));
                    out.insert(format!("{prefix}finish_reason"), Value::String(r.finish_reason.clone()));
                    out.insert(format!("{prefix}attempts"), Value::from(attempts));
                    if this.opts.n > 1 {
                        out.insert(format!("{prefix}sample"), Value::from(sample));
                    }
                    if this.opts.record_rejections {
                        let kinds: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
                        out.insert(format!("{prefix}rejections"), serde_json::json!(kinds));
                    }
                    out_rows.push(out);
                }
                Ok(out_rows)
            }
        })
        .await?;
        for (kind, n) in rejected.lock().expect("rejection counts").iter() {
            ctx.report.metrics.insert(format!("rejected.{kind}"), *n as f64);
        }
        report_limits(ctx, &rate);
        Ok(())
    }
}

/// Plan check of a stage that calls a provider: the provider exists (with a hint).
pub(crate) fn check_provider(ctx: &mut PlanCtx<'_>, provider: &str) {
    if !ctx.providers.contains_key(provider) {
        let hint =
            crate::config::diag::did_you_mean(provider, ctx.providers.keys().map(String::as_str)).unwrap_or_default();
        ctx.error("provider", format!("no provider \"{provider}\" in [providers]{hint}"));
    }
}

/// What a provider-calling stage's outputs depend on besides its options: the provider's identity.
pub(crate) fn provider_prepared(ctx: &PrepareCtx<'_>, provider: &str) -> Result<Option<Prepared>> {
    let identity = ctx.services.provider_identity(provider)?;
    let mut p = Prepared::default();
    p.fingerprint.insert("provider".into(), identity.to_string());
    Ok(Some(p))
}

/// The provider a stage calls, its call context, and how many records to keep in flight
/// (`concurrency`, default twice the provider's); the provider is named in the report.
pub(crate) fn start_provider(
    ctx: &mut RunCtx,
    provider: &str,
    concurrency: Option<usize>,
) -> Result<(std::sync::Arc<crate::llm::provider::Provider>, CallCtx, usize)> {
    let p = ctx.services.provider(provider).with_context(|| format!("provider \"{provider}\""))?;
    ctx.report.info.insert("provider".into(), p.name.clone());
    ctx.report.info.insert("model".into(), p.model.clone());
    ctx.report.info.insert("provider_kind".into(), p.kind.into());
    let call =
        CallCtx { stage: ctx.name.clone(), fingerprint: ctx.fingerprint.clone(), progress: ctx.progress.clone() };
    let concurrency = concurrency.unwrap_or(p.rate.cfg.max_concurrency * 2);
    Ok((p, call, concurrency))
}

/// The request limits in force at the end of a stage (learned from the server where it
/// advertised any), into the report.
pub(crate) fn report_limits(ctx: &mut RunCtx, rate: &crate::llm::rate::RateControl) {
    for (k, v) in rate.limits() {
        ctx.report.info.insert(k.into(), v.to_string());
    }
}
