//! `synth graph`: the stage DAG as text, Graphviz DOT or Mermaid.

use std::fmt::Write;

use super::args::{GraphArgs, GraphFormat};
use super::common::EXIT_OK;
use synth_engine::stages::Role;
use synth_runner::pipeline::Pipeline;

pub fn run(args: &GraphArgs) -> i32 {
    let p = match super::common::load_or_report(&args.pipeline) {
        Ok(p) => p,
        Err(code) => return code,
    };
    print!("{}", render(&p, args.format));
    EXIT_OK
}

pub fn render(p: &Pipeline, format: GraphFormat) -> String {
    let mut out = String::new();
    match format {
        GraphFormat::Text => {
            let width = p.stages.iter().map(|s| s.name.len()).max().unwrap_or(0);
            let _ = writeln!(out, "pipeline \"{}\": {} stages", p.name, p.stages.len());
            for &i in &p.graph.order {
                let s = &p.stages[i];
                let inputs = if s.inputs.is_empty() { String::new() } else { format!(" <- {}", s.inputs.join(", ")) };
                let _ = writeln!(out, "  {:width$}  [{}]{inputs}", s.name, s.kind.name);
            }
        }
        GraphFormat::Dot => {
            let _ =
                writeln!(out, "digraph \"{}\" {{\n  rankdir=LR;\n  node [fontname=\"Helvetica\"];", escape(&p.name));
            for &i in &p.graph.order {
                let s = &p.stages[i];
                let shape = match s.kind.role {
                    Role::Source => "cylinder",
                    Role::Sink => "note",
                    Role::Transform => "box",
                };
                let _ = writeln!(
                    out,
                    "  \"{}\" [shape={shape}, label=\"{}\\n({})\"];",
                    escape(&s.name),
                    escape(&s.name),
                    s.kind.name
                );
            }
            for &i in &p.graph.order {
                for input in &p.stages[i].inputs {
                    let _ = writeln!(out, "  \"{}\" -> \"{}\";", escape(input), escape(&p.stages[i].name));
                }
            }
            out.push_str("}\n");
        }
        GraphFormat::Mermaid => {
            out.push_str("flowchart LR\n");
            for &i in &p.graph.order {
                let s = &p.stages[i];
                let (open, close) = match s.kind.role {
                    Role::Source => ("[(", ")]"),
                    Role::Sink => ("[/", "/]"),
                    Role::Transform => ("[", "]"),
                };
                let _ = writeln!(out, "  s{i}{open}\"{}<br/>({})\"{close}", s.name, s.kind.name);
            }
            for &i in &p.graph.order {
                for input in &p.stages[i].inputs {
                    if let Some(k) = p.stage_index(input) {
                        let _ = writeln!(out, "  s{k} --> s{i}");
                    }
                }
            }
        }
    }
    out
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}
