//! `synth validate`: check the pipeline (and each of its profiles) without network
//! or side effects and print every problem as `path:line:col: stage "x": message`;
//! with a profile, print the stage tables as that profile resolves them.

use std::collections::BTreeSet;

use super::args::ValidateArgs;
use super::common::{EXIT_CONFIG, EXIT_OK};
use synth_core::config;
use synth_core::config::diag::Diagnostics;
use synth_runner::pipeline;

pub fn run(args: &ValidateArgs) -> i32 {
    let opts = args.pipeline.load_options();
    let (pipeline, mut diags) = pipeline::load(&args.pipeline.pipeline, &opts, crate::registry::registry());
    // Without an explicit profile, every profile must be valid too.
    if opts.profile.is_none() {
        let mut seen: BTreeSet<String> = diags.iter().map(|d| d.to_string()).collect();
        for name in profile_names(&args.pipeline.pipeline) {
            let mut o = opts.clone();
            o.profile = Some(name.clone());
            let (_, more) = pipeline::load(&args.pipeline.pipeline, &o, crate::registry::registry());
            let mut extra = Diagnostics::default();
            for d in more.iter() {
                if seen.insert(d.to_string()) {
                    let mut d = d.clone();
                    d.message = format!("{} (with --profile {name})", d.message);
                    match d.severity {
                        config::diag::Severity::Error => extra.error(&d.span, d.subject.as_deref(), d.message),
                        config::diag::Severity::Warning => extra.warning(&d.span, d.subject.as_deref(), d.message),
                    }
                }
            }
            diags.extend(extra);
        }
        diags.sort();
    }
    if args.deny_warnings {
        diags.deny_warnings();
    }
    super::common::report_diagnostics(&diags);
    let file = args.pipeline.pipeline.display();
    if diags.has_errors() {
        eprintln!("{file}: {} error(s), {} warning(s)", diags.n_errors(), diags.n_warnings());
        return EXIT_CONFIG;
    }
    match pipeline {
        Some(p) => {
            println!(
                "{file}: valid ({} stages, {} warning(s)); outputs go to {}",
                p.stages.len(),
                diags.n_warnings(),
                p.output_dir.display()
            );
            // With a profile: the stage, provider and embedder tables as resolved (the
            // profile merged over the base, `--set` applied), one line each.
            if opts.profile.is_some() {
                for line in resolved_lines(&p.resolved) {
                    println!("{line}");
                }
            }
            EXIT_OK
        }
        None => EXIT_CONFIG,
    }
}

/// Names of the `[profiles.*]` tables, read leniently (errors are reported by `load`).
fn profile_names(path: &std::path::Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return vec![];
    };
    let Ok(doc) = toml::de::DeTable::parse(&text) else {
        return vec![];
    };
    doc.get_ref()
        .iter()
        .find(|(k, _)| k.get_ref() == "profiles")
        .and_then(|(_, v)| v.get_ref().as_table().map(|t| t.keys().map(|k| k.get_ref().to_string()).collect()))
        .unwrap_or_default()
}

/// `section.name = { ... }` (inline TOML) for every stage, provider and embedder of a
/// resolved document, in the document's order.
fn resolved_lines(resolved: &serde_json::Value) -> Vec<String> {
    let mut lines = Vec::new();
    for section in ["providers", "embedders", "stages"] {
        let Some(entries) = resolved.get(section).and_then(|s| s.as_object()) else { continue };
        for (name, table) in entries {
            let text = match toml::Value::try_from(table) {
                Ok(v) => v.to_string(),
                Err(_) => table.to_string(),
            };
            lines.push(format!("{section}.{name} = {text}"));
        }
    }
    lines
}
