//! `synth list --cli`: the command line as the Markdown page `docs/cli.md`, read from
//! the clap definitions (every command, argument, default, choice and conflict) plus
//! the exit codes; a test fails when the page is stale.

use clap::{Arg, ArgAction, Command, CommandFactory};

use super::args::Cli;
use super::common::{EXIT_BUSY, EXIT_CONFIG, EXIT_INTERRUPTED, EXIT_NOT_READY, EXIT_OK, EXIT_RUNTIME};

/// The page.
pub fn render() -> String {
    let mut cmd = Cli::command();
    cmd.build();
    let mut out = String::from(
        "# Command-line reference\n\n\
         Every `synth` command with its arguments, defaults, choices and conflicts. Generated from\n\
         the command-line definitions by `synth list --cli > docs/cli.md`; a test fails when this\n\
         page is stale. `synth COMMAND --help` says the same in the terminal.\n\n\
         ## Exit codes\n\n\
         | code | meaning |\n| ---: | --- |\n",
    );
    for (code, meaning) in [
        (EXIT_OK, "done (a dry run, a detached batch run and an up-to-date run included)"),
        (EXIT_RUNTIME, "a stage or the run failed (the error says which; what completed is kept)"),
        (
            EXIT_BUSY,
            "another run holds the output directory (nothing was done); for a shard or step of a sharded run: its wave is not ready yet (retry later, or `--wait`)",
        ),
        (EXIT_CONFIG, "the pipeline, a `--set` or the command line is wrong (file, line and field named)"),
        (EXIT_INTERRUPTED, "stopped by Ctrl-C / SIGTERM (what completed is kept; run again to resume)"),
    ] {
        out.push_str(&format!("| {code} | {meaning} |\n"));
    }
    debug_assert_eq!(EXIT_BUSY, EXIT_NOT_READY);
    let global: Vec<&Arg> = cmd.get_arguments().filter(|a| a.is_global_set() && !a.is_hide_set()).collect();
    out.push_str("\n## Options of every command\n\n");
    args_table(&mut out, &cmd, &global);
    let mut commands = String::from("\n## Commands\n\n");
    let mut sections = String::new();
    for sub in visible(&cmd) {
        section(&mut commands, &mut sections, sub, &["synth"]);
    }
    out.push_str(&commands);
    out.push_str(&sections);
    out
}

/// One command's section (and its subcommands'), and its line in the command list.
fn section(list: &mut String, out: &mut String, cmd: &Command, parents: &[&str]) {
    let mut path: Vec<&str> = parents.to_vec();
    path.push(cmd.get_name());
    let full = path.join(" ");
    let about = cmd.get_about().map(|s| s.to_string()).unwrap_or_default();
    let indent = "  ".repeat(parents.len() - 1);
    list.push_str(&format!("{indent}- [`{full}`](#{}): {}\n", anchor(&full), first_sentence(&about)));
    out.push_str(&format!("\n## {full}\n\n"));
    let long = cmd.get_long_about().map(|s| s.to_string()).unwrap_or(about);
    if !long.is_empty() {
        out.push_str(&format!("{}\n\n", one_paragraph(&long)));
    }
    let mut c = cmd.clone();
    let usage = c.render_usage().to_string();
    let usage = usage.trim_start_matches("Usage: ");
    out.push_str(&format!("```text\n{usage}\n```\n\n"));
    let args: Vec<&Arg> =
        cmd.get_arguments().filter(|a| !a.is_hide_set() && !a.is_global_set() && !is_help(a)).collect();
    if !args.is_empty() {
        args_table(out, cmd, &args);
    }
    for sub in visible(cmd) {
        section(list, out, sub, &path);
    }
}

/// The subcommands a user types (not clap's generated `help`).
fn visible(cmd: &Command) -> impl Iterator<Item = &Command> {
    cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help")
}

fn is_help(a: &Arg) -> bool {
    matches!(a.get_action(), ArgAction::Help | ArgAction::HelpShort | ArgAction::HelpLong | ArgAction::Version)
}

/// A table of arguments: how to write it, then what it does, its default, its choices and
/// what it does not combine with.
fn args_table(out: &mut String, cmd: &Command, args: &[&Arg]) {
    out.push_str("| argument | description |\n| --- | --- |\n");
    for a in args {
        let mut text = one_paragraph(&a.get_long_help().or(a.get_help()).map(|s| s.to_string()).unwrap_or_default());
        if !text.is_empty() && !text.ends_with(['.', ')', ']', ':']) {
            text.push('.');
        }
        let defaults: Vec<String> = a.get_default_values().iter().map(|v| v.to_string_lossy().to_string()).collect();
        let takes_value = a.get_num_args().is_some_and(|n| n.takes_values());
        if takes_value && !defaults.is_empty() && !text.contains("[default:") {
            text.push_str(&format!(" Default: `{}`.", defaults.join(",")));
        }
        let choices: Vec<String> = a
            .get_possible_values()
            .iter()
            .filter(|v| !v.is_hide_set())
            .map(|v| match v.get_help() {
                Some(h) => format!("`{}` ({})", v.get_name(), h.to_string().trim_end_matches('.')),
                None => format!("`{}`", v.get_name()),
            })
            .collect();
        if takes_value && !choices.is_empty() && !matches!(a.get_action(), ArgAction::SetTrue | ArgAction::SetFalse) {
            text.push_str(&format!(" One of: {}.", choices.join(", ")));
        }
        let conflicts: Vec<String> = cmd
            .get_arg_conflicts_with(a)
            .iter()
            .filter(|c| !c.is_hide_set())
            .map(|c| format!("`{}`", spelled(c)))
            .collect();
        if !conflicts.is_empty() {
            text.push_str(&format!(" Not with {}.", conflicts.join(", ")));
        }
        if a.is_required_set() && !a.is_positional() {
            text.push_str(" Required.");
        }
        out.push_str(&format!("| `{}` | {} |\n", written(a), text.replace('|', "\\|")));
    }
}

/// How an argument is written: `--out <DIR>`, `-v, --verbose`, `<PIPELINE>`.
fn written(a: &Arg) -> String {
    let values = a
        .get_value_names()
        .map(|v| v.iter().map(|n| format!("<{n}>")).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| format!("<{}>", a.get_id().as_str().to_uppercase()));
    if a.is_positional() {
        let many = matches!(a.get_action(), ArgAction::Append);
        return format!("{values}{}", if many { "..." } else { "" });
    }
    let mut names = Vec::new();
    if let Some(s) = a.get_short() {
        names.push(format!("-{s}"));
    }
    if let Some(l) = a.get_long() {
        names.push(format!("--{l}"));
    }
    let takes_value = a.get_num_args().is_some_and(|n| n.takes_values());
    if takes_value { format!("{} {values}", names.join(", ")) } else { names.join(", ") }
}

/// An argument's name as a conflict names it: `--out`, `<PIPELINE>`.
fn spelled(a: &Arg) -> String {
    match a.get_long() {
        Some(l) => format!("--{l}"),
        None => written(a),
    }
}

/// Help text on one line (a Markdown table cell).
fn one_paragraph(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn first_sentence(s: &str) -> String {
    let s = one_paragraph(s);
    match s.find(". ") {
        Some(i) => s[..=i].to_string(),
        None => s,
    }
}

/// GitHub's heading anchor: lower case, spaces to dashes, punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_command_and_every_long_option_is_on_the_page() {
        let page = super::render();
        let mut cmd = <super::Cli as clap::CommandFactory>::command();
        cmd.build();
        let mut stack: Vec<(String, clap::Command)> = vec![("synth".into(), cmd)];
        while let Some((path, c)) = stack.pop() {
            for sub in super::visible(&c) {
                let p = format!("{path} {}", sub.get_name());
                assert!(page.contains(&format!("\n## {p}\n")), "no section for {p}");
                for a in sub.get_arguments().filter(|a| !a.is_hide_set()) {
                    if let Some(l) = a.get_long() {
                        assert!(page.contains(&format!("--{l}")), "{p}: --{l} is not on the page");
                    }
                }
                stack.push((p, sub.clone()));
            }
        }
        assert!(page.contains("| 75 |") && page.contains("| 78 |"), "the exit codes");
        // A conflict clap enforces is written out: `--state` does not combine with `--out`.
        let run = page.split("\n## synth run\n").nth(1).unwrap().split("\n## ").next().unwrap();
        let state = run.lines().find(|l| l.starts_with("| `--state")).unwrap();
        assert!(state.contains("Not with `--out`"), "{state}");
    }
}
