//! `synth emit`: recipes for other systems, written as text. `schedule
//! systemd|cron|k8s` runs `synth regenerate` on a schedule (a systemd service + timer, a
//! crontab line under flock, a Kubernetes CronJob). `k8s`: what a scheduler needs to run
//! a sharded pipeline, a Kubernetes Job per coordinator step and an Indexed Job per wave
//! (completionMode Indexed, parallelism, backoffLimitPerIndex, restartPolicy Never, the
//! provider keys from a Secret), applied together: each waits for what it needs through
//! the state (`--wait`), and all carry one run id so none takes an earlier run's plan.
//! `slurm`: a script that submits the steps and the `sbatch --array` waves in order
//! (`--dependency=afterok`).

use std::fmt::Write;

use serde_json::{Value, json};

use super::args::{EmitArgs, EmitCommand, EmitScheduleArgs, ScheduleTarget};
use super::common::{EXIT_CONFIG, EXIT_OK, EXIT_RUNTIME};
use synth_runner::regen::config::RegenConfig;
use synth_runner::regen::schedule::{self, Recipe, Target};

pub fn run(cmd: &EmitCommand) -> i32 {
    let (common, text) = match cmd {
        EmitCommand::Schedule(a) => return emit_schedule(a),
        EmitCommand::K8s(a) => (&a.common, k8s(a)),
        EmitCommand::Slurm(a) => (&a.common, slurm(a)),
    };
    let text = match text {
        Ok(t) => t,
        Err(code) => return code,
    };
    match &common.output {
        None => {
            print!("{text}");
            EXIT_OK
        }
        Some(path) => match synth_core::store::atomic::write_atomic(path, text.as_bytes()) {
            Ok(()) => {
                eprintln!("wrote {}", path.display());
                EXIT_OK
            }
            Err(e) => {
                eprintln!("error: {e:#}");
                EXIT_RUNTIME
            }
        },
    }
}

/// The pipeline's waves and the `synth run` arguments every job shares.
struct Plan {
    name: String,
    waves: usize,
    args: Vec<String>,
    run_id: String,
}

fn plan(a: &EmitArgs) -> Result<Plan, i32> {
    let p = super::common::load_or_report(&a.pipeline)?;
    let waves = synth_runner::dag::shard::waves(&p).n_waves;
    let mut args = vec!["run".to_string(), a.pipeline.pipeline.to_string_lossy().to_string()];
    if a.pipeline.offline {
        args.push("--offline".into());
    }
    if let Some(pr) = &a.pipeline.profile {
        args.extend(["--profile".into(), pr.clone()]);
    }
    for s in &a.pipeline.sets {
        args.extend(["--set".into(), s.clone()]);
    }
    match (&a.state, &a.out) {
        (Some(url), _) => args.extend(["--state".into(), url.clone()]),
        (None, Some(dir)) => args.extend(["--out".into(), dir.to_string_lossy().to_string()]),
        (None, None) => {
            eprintln!("error: give --state URL (or, with a file system every node shares, --out DIR)");
            return Err(EXIT_CONFIG);
        }
    }
    if a.locked {
        args.push("--locked".into());
        if let Some(l) = &a.lockfile.lockfile {
            args.extend(["--lockfile".into(), l.to_string_lossy().to_string()]);
        }
    }
    let parallel = a.parallel.unwrap_or(a.shards).min(a.shards);
    args.extend(["--shards".into(), a.shards.to_string(), "--parallel".into(), parallel.to_string()]);
    let run_id = a.run_id.clone().unwrap_or_else(|| {
        let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        format!("{}-{secs}", p.name)
    });
    args.extend(["--run-id".into(), run_id.clone()]);
    Ok(Plan { name: dns_name(&a.name.clone().unwrap_or_else(|| p.name.clone())), waves, args, run_id })
}

/// A Kubernetes object name: lowercase alphanumerics and '-'.
fn dns_name(s: &str) -> String {
    let mut out: String = s.to_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    out = out.trim_matches('-').to_string();
    out.truncate(40);
    if out.is_empty() { "synth".into() } else { out }
}

fn k8s(a: &super::args::EmitK8sArgs) -> Result<String, i32> {
    let c = &a.common;
    let plan = plan(c)?;
    let wait = c.wait.to_string();
    let parallel = c.parallel.unwrap_or(c.shards).min(c.shards);
    let labels = |role: &str, k: usize| {
        json!({
            "app.kubernetes.io/name": "synth",
            "app.kubernetes.io/instance": plan.name,
            "synth.dev/run-id": dns_name(&plan.run_id),
            "synth.dev/role": role,
            "synth.dev/index": k.to_string(),
        })
    };
    let container = |extra: &[String]| {
        let mut args: Vec<String> = plan.args.clone();
        args.extend(extra.iter().cloned());
        args.extend(["--wait".into(), wait.clone()]);
        let mut c_ = json!({
            "name": "synth",
            "image": a.image,
            "command": [c.synth],
            "args": args,
            "env": [{"name": "SYNTH_WORK_DIR", "value": "/work"}],
            "volumeMounts": [{"name": "work", "mountPath": "/work"}],
            "resources": {"requests": {"cpu": a.cpu, "memory": a.memory}, "limits": {"memory": a.memory}},
        });
        if let Some(secret) = &a.secret {
            c_["envFrom"] = json!([{"secretRef": {"name": secret}}]);
        }
        if let Some(dir) = &a.workdir {
            c_["workingDir"] = json!(dir);
        }
        c_
    };
    let pod = |role: &str, k: usize, extra: &[String]| {
        let mut spec = json!({
            "restartPolicy": "Never",
            "containers": [container(extra)],
            "volumes": [{"name": "work", "emptyDir": {}}],
        });
        if let Some(sa) = &a.service_account {
            spec["serviceAccountName"] = json!(sa);
        }
        json!({"metadata": {"labels": labels(role, k)}, "spec": spec})
    };
    let meta = |name: String, role: &str, k: usize| {
        let mut m = json!({"name": name, "labels": labels(role, k)});
        if let Some(ns) = &a.namespace {
            m["namespace"] = json!(ns);
        }
        m
    };
    let mut docs: Vec<Value> = Vec::new();
    for k in 0..=plan.waves {
        if k >= 1 {
            docs.push(json!({
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": meta(format!("{}-wave-{k}", plan.name), "wave", k),
                "spec": {
                    "completionMode": "Indexed",
                    "completions": c.shards,
                    "parallelism": parallel,
                    "backoffLimitPerIndex": a.backoff_limit_per_index,
                    "ttlSecondsAfterFinished": 86400,
                    "template": pod("wave", k, &["--wave".into(), k.to_string()]),
                },
            }));
        }
        docs.push(json!({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": meta(format!("{}-step-{k}", plan.name), "step", k),
            "spec": {
                "backoffLimit": a.backoff_limit_per_index,
                "ttlSecondsAfterFinished": 86400,
                "template": pod("step", k, &["--step".into(), k.to_string()]),
            },
        }));
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# synth: {} shards of pipeline \"{}\" ({} wave(s)), run id {}.\n\
         # Apply all at once (kubectl apply -f): every job waits, through the state, for what it\n\
         # needs (--wait {} s). `synth status --state URL` shows the shards done and missing.",
        c.shards, plan.name, plan.waves, plan.run_id, c.wait
    );
    for d in &docs {
        out.push_str("---\n");
        yaml(&mut out, d, 0);
    }
    Ok(out)
}

/// YAML in block style, every string double-quoted with JSON escapes (a valid YAML
/// double-quoted scalar), so no value is ever read as another type.
fn yaml(out: &mut String, v: &Value, indent: usize) {
    let pad = " ".repeat(indent);
    match v {
        Value::Object(m) => {
            for (k, val) in m {
                match val {
                    Value::Object(inner) if !inner.is_empty() => {
                        let _ = writeln!(out, "{pad}{k}:");
                        yaml(out, val, indent + 2);
                    }
                    Value::Array(items) if !items.is_empty() => {
                        let _ = writeln!(out, "{pad}{k}:");
                        yaml(out, val, indent);
                    }
                    _ => {
                        let _ = writeln!(out, "{pad}{k}: {}", scalar(val));
                    }
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                match item {
                    Value::Object(m) if !m.is_empty() => {
                        let mut inner = String::new();
                        yaml(&mut inner, item, indent + 2);
                        // The first key goes on the dash's line.
                        let trimmed = inner.trim_start_matches(' ');
                        let _ = write!(out, "{pad}- {trimmed}");
                    }
                    _ => {
                        let _ = writeln!(out, "{pad}- {}", scalar(item));
                    }
                }
            }
        }
        other => {
            let _ = writeln!(out, "{pad}{}", scalar(other));
        }
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::Object(_) => "{}".into(),
        Value::Array(_) => "[]".into(),
        other => other.to_string(),
    }
}

/// A word for a POSIX shell, single-quoted.
fn sh(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c)) {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', "'\\''"))
}

fn slurm(a: &super::args::EmitSlurmArgs) -> Result<String, i32> {
    let c = &a.common;
    let plan = plan(c)?;
    let parallel = c.parallel.unwrap_or(c.shards).min(c.shards);
    let cmd = |extra: &[String]| -> String {
        std::iter::once(c.synth.clone())
            .chain(plan.args.iter().cloned())
            .chain(extra.iter().cloned())
            .map(|w| sh(&w))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut opts = vec![format!("--output={}/%x-%A_%a.out", sh(&a.logs))];
    if let Some(p) = &a.partition {
        opts.push(format!("--partition={}", sh(p)));
    }
    if let Some(t) = &a.time {
        opts.push(format!("--time={}", sh(t)));
    }
    opts.push(format!("--cpus-per-task={}", a.cpus_per_task));
    if let Some(m) = &a.mem {
        opts.push(format!("--mem={}", sh(m)));
    }
    let opts = opts.join(" ");
    let mut out = String::new();
    let _ = writeln!(
        out,
        "#!/usr/bin/env bash\n\
         # synth: {} shards of pipeline \"{}\" ({} wave(s)), run id {}.\n\
         # Submits step 0, then for each wave an `sbatch --array` of its shards and the step\n\
         # that merges it, each after the one before succeeded (--dependency=afterok).\n\
         # A shard that failed keeps its step pending: `synth status` prints the retry set;\n\
         # submit that array again (e.g. --array=2,5), then the step.\n\
         # Run from the project folder (paths are relative to it): bash THIS_FILE\n\
         set -euo pipefail\n\
         mkdir -p {}\n\
         dep=\"\"",
        c.shards,
        plan.name,
        plan.waves,
        plan.run_id,
        sh(&a.logs)
    );
    let submit = |out: &mut String, job: &str, array: Option<String>, body: String| {
        let array = array.map(|x| format!(" --array={x}")).unwrap_or_default();
        let _ = writeln!(
            out,
            "jid=$(sbatch --parsable --job-name={} {opts}{array} ${{dep:+--dependency=afterok:$dep}} <<'SYNTH_JOB'\n\
             #!/usr/bin/env bash\n\
             exec {body}\n\
             SYNTH_JOB\n\
             )\n\
             dep=${{jid%%;*}}\n\
             echo \"submitted {job}: $dep\"",
            sh(&format!("{}-{job}", plan.name)),
        );
    };
    for k in 0..=plan.waves {
        if k >= 1 {
            let limit = if parallel < c.shards { format!("%{parallel}") } else { String::new() };
            submit(
                &mut out,
                &format!("wave-{k}"),
                Some(format!("0-{}{limit}", c.shards - 1)),
                cmd(&["--wave".into(), k.to_string()]),
            );
        }
        submit(&mut out, &format!("step-{k}"), None, cmd(&["--step".into(), k.to_string()]));
    }
    Ok(out)
}

fn emit_schedule(a: &EmitScheduleArgs) -> i32 {
    let p = match super::common::load_or_report(&a.pipeline) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_quotes_every_string_and_nests() {
        let v = json!({"a": {"b": ["x", "y: z"], "c": 1, "d": [{"e": "1", "f": {}}]}});
        let mut out = String::new();
        yaml(&mut out, &v, 0);
        assert_eq!(out, "a:\n  b:\n  - \"x\"\n  - \"y: z\"\n  c: 1\n  d:\n  - e: \"1\"\n    f: {}\n");
    }

    #[test]
    fn shell_words() {
        assert_eq!(sh("a-b/c.toml"), "a-b/c.toml");
        assert_eq!(sh("it's x"), "'it'\\''s x'");
        assert_eq!(dns_name("My_Pipeline v2"), "my-pipeline-v2");
    }
}
