//! `synth emit`: recipes for other systems, printed to stdout. `emit schedule
//! systemd|cron|k8s` runs `synth regenerate` on a schedule.

use super::{EXIT_CONFIG, EXIT_OK, EmitCommand, EmitScheduleArgs, ScheduleTarget};
use crate::regen::config::RegenConfig;
use crate::regen::schedule::{self, Recipe, Target};

pub fn run(cmd: EmitCommand) -> i32 {
    match cmd {
        EmitCommand::Schedule(a) => emit_schedule(&a),
    }
}

fn emit_schedule(a: &EmitScheduleArgs) -> i32 {
    let p = match super::load_or_report(&a.pipeline) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let fail = |e: anyhow::Error| {
        eprintln!("error: {e:#}");
        EXIT_CONFIG
    };
    let cron = match schedule::cron_of(&a.every, a.at.as_deref(), a.on.as_deref()) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    if let Err(e) = humantime::parse_duration(&a.timeout) {
        return fail(anyhow::anyhow!("--timeout {}: {e}", a.timeout));
    }
    let target = match a.target {
        ScheduleTarget::Systemd => Target::Systemd,
        ScheduleTarget::Cron => Target::Cron,
        ScheduleTarget::K8s => Target::K8s,
    };
    let cfg = match RegenConfig::of(&p) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    // The token variable of the repository it publishes to.
    let push_token = match &a.push.push {
        None => None,
        Some(_) => Some(cfg.hub.as_ref().map(|h| h.token_env.clone()).unwrap_or_else(|| "HF_TOKEN".into())),
    };
    if matches!(&a.push.push, Some(r) if r.is_empty()) && cfg.hub.is_none() {
        return fail(anyhow::anyhow!(
            "--push without a repository: give --push OWNER/NAME or set [regenerate.hub] repo"
        ));
    }
    let pipeline_arg = a.pipeline.pipeline.to_string_lossy().to_string();
    let mut args = vec!["regenerate".to_string(), pipeline_arg.clone()];
    if a.pipeline.offline {
        args.push("--offline".into());
    }
    if let Some(profile) = &a.pipeline.profile {
        args.extend(["--profile".to_string(), profile.clone()]);
    }
    for set in &a.pipeline.sets {
        args.extend(["--set".to_string(), set.clone()]);
    }
    args.extend(["--if-changed".to_string(), "--snapshot".to_string()]);
    if let Some(repo) = &a.push.push {
        args.push("--push".into());
        if !repo.is_empty() {
            args.push(repo.clone());
        }
    }
    let k8s = target == Target::K8s;
    let workdir = a.workdir.clone().unwrap_or_else(|| {
        if k8s {
            "/work".into()
        } else {
            std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_else(|_| ".".into())
        }
    });
    if k8s {
        // State (outputs, snapshots, caches) on the mounted volume.
        args.extend(["--out".to_string(), format!("{workdir}/state/{}", p.name)]);
    }
    let synth = a.synth.clone().unwrap_or_else(|| {
        if k8s {
            "synth".into()
        } else {
            std::env::current_exe().map(|e| e.display().to_string()).unwrap_or_else(|_| "synth".into())
        }
    });
    let name: String = format!("synth-{}", p.name)
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c.to_ascii_lowercase() } else { '-' })
        .collect();
    let recipe = Recipe {
        target,
        pipeline_arg,
        every: a.every.clone(),
        cron,
        timezone: a.timezone.clone(),
        args,
        workdir,
        synth,
        image: a.image.clone(),
        name,
        timeout: a.timeout.clone(),
        secrets: schedule::secrets_of(&p, push_token.as_deref()),
    };
    match schedule::render(&recipe) {
        Ok(text) => {
            print!("{text}");
            EXIT_OK
        }
        Err(e) => fail(e),
    }
}
