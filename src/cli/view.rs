//! `synth view`: find the output directory (a directory, or a pipeline file's
//! output_dir and snapshots), then serve the viewer until interrupted.

use std::net::SocketAddr;

use super::args::{PipelineArgs, ViewArgs};
use super::common::{EXIT_CONFIG, EXIT_RUNTIME};
use synth_view::Viewed;

pub fn run(args: &ViewArgs) -> i32 {
    let viewed = if args.target.is_file() {
        let pa = PipelineArgs {
            pipeline: args.target.clone(),
            profile: args.profile.clone(),
            offline: args.offline,
            sets: Vec::new(),
        };
        let p = match super::common::load_or_report(&pa) {
            Ok(p) => p,
            Err(code) => return code,
        };
        let snapshots = synth_runner::regen::config::RegenConfig::of(&p).ok().map(|c| c.snapshots_dir(&p.output_dir));
        Viewed::dir(&p.output_dir, snapshots)
    } else {
        Viewed::dir(&args.target, None)
    };
    let viewed = match viewed.and_then(|v| match &args.compare {
        Some(other) => v.compared_with(other),
        None => Ok(v),
    }) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("error: {e:#}");
            return EXIT_CONFIG;
        }
    };
    if !viewed.exists() {
        eprintln!("{}: no run has written here yet; the page shows its stages as they appear", viewed.dir.display());
    }
    if !args.host.is_loopback() {
        eprintln!("warning: serving on {} shows this run's data to anyone who can reach this machine", args.host);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_RUNTIME;
        }
    };
    let addr = SocketAddr::new(args.host, args.port);
    let dir = viewed.dir.clone();
    let result = runtime.block_on(async move {
        let serve = synth_view::serve(viewed, addr, |bound| {
            println!("synth view: {} at http://{bound}/", dir.display());
            use std::io::Write;
            let _ = std::io::stdout().flush();
        });
        tokio::select! {
            r = serve => r,
            _ = tokio::signal::ctrl_c() => Ok(()),
        }
    });
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e:#}");
            EXIT_RUNTIME
        }
    }
}
