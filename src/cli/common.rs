//! What the subcommands share: the exit codes (0 ok, 2 runtime failure, 75 try later, 78
//! bad config, 130 interrupted) and loading a pipeline with its diagnostics printed.

use super::args::PipelineArgs;
use super::registry::registry;

pub const EXIT_OK: i32 = 0;
pub const EXIT_RUNTIME: i32 = 2;
/// Another run (or regeneration) holds the output directory: nothing was done (EX_TEMPFAIL).
pub const EXIT_BUSY: i32 = 75;
pub const EXIT_CONFIG: i32 = 78;
pub const EXIT_INTERRUPTED: i32 = 130;
/// A part of a sharded run whose prerequisites are not there yet (EX_TEMPFAIL).
pub const EXIT_NOT_READY: i32 = 75;

/// Print config diagnostics; returns true when there were errors.
pub fn report_diagnostics(diags: &synth_core::config::diag::Diagnostics) -> bool {
    for d in diags.iter() {
        eprintln!("{d}");
    }
    diags.has_errors()
}

/// Load a pipeline or print why not.
pub fn load_or_report(args: &PipelineArgs) -> Result<synth_runner::pipeline::Pipeline, i32> {
    let (pipeline, diags) = synth_runner::pipeline::load(&args.pipeline, &args.load_options(), registry());
    report_diagnostics(&diags);
    match pipeline {
        Some(p) if !diags.has_errors() => Ok(p),
        _ => {
            eprintln!("{}: {} error(s); nothing was run", args.pipeline.display(), diags.n_errors());
            Err(EXIT_CONFIG)
        }
    }
}
