//! `synth list`: every stage kind with its options and defaults, plus the options
//! common to all stages and those of the `[pipeline]` table.

use super::EXIT_OK;
use crate::config::options::describe_specs;
use crate::stages::{Arity, COMMON_OPTIONS, KINDS, Role};

pub fn run() -> i32 {
    print!("{}", render());
    EXIT_OK
}

pub fn render() -> String {
    let mut out = String::new();
    out.push_str("[pipeline] options:\n");
    describe_specs(crate::config::pipeline_options(), "    ", &mut out);
    out.push_str("\noptions of every stage:\n");
    describe_specs(COMMON_OPTIONS, "    ", &mut out);
    out.push_str("\nstage kinds:\n");
    for k in KINDS {
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
        describe_specs(k.options, "    ", &mut out);
    }
    out.push_str("\nprovider kinds ([providers.NAME] kind = ...):\n");
    for k in crate::llm::services::PROVIDER_KINDS {
        out.push_str(&format!("\n  {}: {}\n", k.name, k.about));
        describe_specs(k.options, "    ", &mut out);
    }
    out.push_str("\nembedder kinds ([embedders.NAME] kind = ...):\n");
    for k in crate::embed::EMBEDDER_KINDS {
        out.push_str(&format!("\n  {}: {}\n", k.name, k.about));
        describe_specs(k.options, "    ", &mut out);
    }
    out.push_str("\nparsers (llm stages: parser = ..., parser_options = { ... }):\n");
    for k in crate::llm::parse::kinds() {
        out.push_str(&format!("\n  {}: {}\n", k.name, k.about));
        describe_specs(k.options, "    ", &mut out);
    }
    out
}
