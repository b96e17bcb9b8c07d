//! `synth list`: every stage kind with its options and defaults — the engine's kinds,
//! then each method's — plus the options common to all stages, those of the
//! `[pipeline]` table, and the provider, embedder, content check and parser kinds; as
//! text, or as the Markdown page `docs/reference.md`.

use super::common::EXIT_OK;
use synth_core::config::options::describe_specs;
use synth_engine::stages::{Arity, COMMON_OPTIONS, KindInfo, Role};

pub fn run(markdown: bool) -> i32 {
    print!("{}", if markdown { render_markdown() } else { render() });
    EXIT_OK
}

/// `render()` as a Markdown page: each section a `##` heading, each kind a `###` heading
/// with its summary, its options as a preformatted block (they are aligned text).
pub fn render_markdown() -> String {
    let mut out = String::from(
        "# Pipeline reference\n\nEvery stage, provider, embedder and parser kind synth checks pipelines against, with\n\
         its options and defaults. Generated from the registry by `synth list --markdown >\n\
         docs/reference.md`; a test fails when this page is stale.\n",
    );
    let mut in_options = false;
    for line in render().lines() {
        let options = line.starts_with("    ");
        if in_options && !options {
            out.push_str("```\n");
            in_options = false;
        }
        if options {
            if !in_options {
                out.push_str("\n```text\n");
                in_options = true;
            }
            out.push_str(&line[4..]);
            out.push('\n');
        } else if let Some(kind) = line.strip_prefix("  ") {
            let name = kind.split([' ', ':']).next().unwrap_or(kind);
            out.push_str(&format!("\n### `{name}`\n\n{kind}\n"));
        } else if !line.is_empty() {
            out.push_str(&format!("\n## {}\n", line.trim_end_matches(':')));
        }
    }
    if in_options {
        out.push_str("```\n");
    }
    out
}

pub fn render() -> String {
    let mut out = String::new();
    out.push_str("[pipeline] options:\n");
    describe_specs(synth_runner::pipeline::pipeline_options(), "    ", &mut out);
    out.push_str("\noptions of every stage:\n");
    describe_specs(COMMON_OPTIONS, "    ", &mut out);
    let registry = crate::registry::registry();
    out.push_str("\nengine stage kinds:\n");
    for k in registry.kinds.iter().filter(|k| registry.method_of(k.name).is_none()) {
        describe_kind(k, &mut out);
    }
    for m in &registry.methods {
        out.push_str(&format!("\nstage kinds of the method {} ({}):\n", m.name, m.about));
        for k in m.kinds {
            describe_kind(k, &mut out);
        }
    }
    out.push_str("\nprovider kinds ([providers.NAME] kind = ...):\n");
    for k in registry.providers.iter().map(|p| &p.kind) {
        out.push_str(&format!("\n  {}: {}\n", k.name, k.about));
        describe_specs(k.options, "    ", &mut out);
    }
    out.push_str("\nembedder kinds ([embedders.NAME] kind = ...):\n");
    for k in synth_embed::EMBEDDER_KINDS {
        out.push_str(&format!("\n  {}: {}\n", k.name, k.about));
        describe_specs(k.options, "    ", &mut out);
    }
    out.push_str(
        "\ncontent checks (llm and check stages: checks = { NAME = { kind, ... } }; options of every check):\n",
    );
    describe_specs(synth_quality::checks::COMMON, "    ", &mut out);
    for k in synth_quality::KINDS {
        out.push_str(&format!("\n  {}: {}\n", k.name, k.about));
        describe_specs(k.options, "    ", &mut out);
    }
    out.push_str("\nparsers (llm stages: parser = ..., parser_options = { ... }):\n");
    for k in &registry.parsers {
        out.push_str(&format!("\n  {}: {}\n", k.name, k.about));
        // The keys a structured answer needs (with the default options; `json` names none
        // until its `fields` are given).
        let keys = (k.build)(&synth_llm::parse::with_defaults(k.options, &serde_json::Value::Null))
            .map(|p| p.json_keys())
            .unwrap_or_default();
        if !keys.is_empty() {
            out.push_str(&format!("    structured answers (schema = ...): a JSON object with {}\n", keys.join(", ")));
        }
        describe_specs(k.options, "    ", &mut out);
    }
    out
}

fn describe_kind(k: &KindInfo, out: &mut String) {
    let role = match k.role {
        Role::Source => "source",
        Role::Transform => "transform",
        Role::Sink => "sink",
    };
    let arity = match k.arity {
        Arity::None => "no inputs".to_string(),
        Arity::Exactly(1) => "1 input".to_string(),
        Arity::Exactly(n) => format!("{n} inputs"),
        Arity::AtLeast(n) => format!("{n}+ inputs"),
    };
    out.push_str(&format!("\n  {} ({role}, {arity}, v{}): {}\n", k.name, k.version, k.about));
    describe_specs(k.options, "    ", out);
}
