//! Ready-to-install recipes that run `synth regenerate` on a schedule: a systemd service
//! and timer (`Persistent=true`: a slot missed while the machine was off runs at boot), a
//! crontab line under `flock -n`, a Kubernetes CronJob with `concurrencyPolicy: Forbid`.
//! `--every` (hourly, daily, weekly, monthly, `<N>m`, `<N>h`, or a 5-field cron
//! expression checked with croner) becomes a cron expression, and for systemd an
//! `OnCalendar=` value. Each recipe names the secrets the pipeline needs.

use std::fmt::Write as _;
use std::str::FromStr;

use anyhow::{Result, bail};

use crate::pipeline::Pipeline;
use synth_core::config::decl::Decl;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Systemd,
    Cron,
    K8s,
}

/// Everything a recipe needs besides the pipeline.
#[derive(Debug, Clone)]
pub struct Recipe {
    pub target: Target,
    /// The pipeline file as the scheduled command names it (relative to `workdir`).
    pub pipeline_arg: String,
    /// `--every` as given.
    pub every: String,
    /// 5-field cron expression.
    pub cron: String,
    pub timezone: String,
    /// Arguments after `synth` (regenerate ...).
    pub args: Vec<String>,
    pub workdir: String,
    pub synth: String,
    pub image: String,
    /// Unit / job name: `synth-<pipeline name>`.
    pub name: String,
    pub timeout: String,
    /// (variable, what needs it)
    pub secrets: Vec<(String, String)>,
}

const DAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];

/// `--every` (with `--at HH:MM`, `--on DAY`) as a 5-field cron expression.
pub fn cron_of(every: &str, at: Option<&str>, on: Option<&str>) -> Result<String> {
    let every = every.trim();
    let (hour, minute) = match at {
        None => (3, 0),
        Some(t) => {
            let (h, m) = t.split_once(':').unwrap_or((t, "0"));
            match (h.parse::<u32>(), m.parse::<u32>()) {
                (Ok(h), Ok(m)) if h < 24 && m < 60 => (h, m),
                _ => bail!("--at {t}: expected HH:MM (24-hour clock)"),
            }
        }
    };
    let day = match on {
        None => 1,
        Some(d) => {
            let d3 = d.get(..3).unwrap_or(d).to_ascii_lowercase();
            match DAYS.iter().position(|x| x.to_ascii_lowercase() == d3) {
                Some(i) => i,
                None => bail!("--on {d}: expected a day of the week (mon, tue, ...)"),
            }
        }
    };
    let expr = match every {
        "hourly" => format!("{minute} * * * *"),
        "daily" => format!("{minute} {hour} * * *"),
        "weekly" => format!("{minute} {hour} * * {day}"),
        "monthly" => format!("{minute} {hour} 1 * *"),
        _ if every.split_whitespace().count() == 5 => every.split_whitespace().collect::<Vec<_>>().join(" "),
        _ => {
            let (n, unit) = every.split_at(every.len().saturating_sub(1));
            let n: u32 = n.parse().map_err(|_| {
                anyhow::anyhow!(
                    "--every {every}: expected hourly, daily, weekly, monthly, <N>m, <N>h or a 5-field cron expression (\"0 3 * * 1\")"
                )
            })?;
            match unit {
                "m" if n > 0 && 60 % n == 0 => format!("*/{n} * * * *"),
                "h" if n > 0 && 24 % n == 0 => format!("{minute} */{n} * * *"),
                "m" | "h" => bail!("--every {every}: N must divide {} evenly", if unit == "m" { 60 } else { 24 }),
                _ => bail!("--every {every}: the unit is m (minutes) or h (hours)"),
            }
        }
    };
    croner::Cron::from_str(&expr).map_err(|e| anyhow::anyhow!("cron expression \"{expr}\": {e}"))?;
    Ok(expr)
}

/// One cron field in systemd's calendar syntax (`*`, `5`, `1,15`, `1..5`, `0/15`).
fn systemd_field(field: &str, lo: u32, what: &str) -> Result<String> {
    let mut parts = Vec::new();
    for item in field.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => (r, Some(s.parse::<u32>().map_err(|_| anyhow::anyhow!("{what}: bad step in \"{item}\""))?)),
            None => (item, None),
        };
        let base = match (range, step) {
            ("*", None) => "*".to_string(),
            ("*", Some(s)) => format!("{lo}/{s}"),
            (r, step) => {
                let r = match r.split_once('-') {
                    Some((a, b)) => format!("{a}..{b}"),
                    None => r.to_string(),
                };
                if !r.chars().all(|c| c.is_ascii_digit() || c == '.') {
                    bail!("{what}: \"{item}\" has no systemd equivalent here; give --every as numbers");
                }
                match step {
                    Some(s) if !r.contains("..") => format!("{r}/{s}"),
                    Some(_) => bail!("{what}: a stepped range \"{item}\" has no systemd equivalent; list the values"),
                    None => r,
                }
            }
        };
        parts.push(base);
    }
    Ok(parts.join(","))
}

fn systemd_weekday(field: &str) -> Result<Option<String>> {
    if field == "*" {
        return Ok(None);
    }
    let name = |v: &str| -> Result<String> {
        if let Ok(n) = v.parse::<usize>() {
            return DAYS.get(n % 7).map(|d| d.to_string()).ok_or_else(|| anyhow::anyhow!("day of week {v}"));
        }
        let v3 = v.get(..3).unwrap_or(v).to_ascii_lowercase();
        DAYS.iter()
            .find(|d| d.to_ascii_lowercase() == v3)
            .map(|d| d.to_string())
            .ok_or_else(|| anyhow::anyhow!("day of week \"{v}\""))
    };
    let mut out = Vec::new();
    for item in field.split(',') {
        if item.contains('/') || item.contains('#') || item.contains('L') {
            bail!("day of week \"{item}\" has no systemd equivalent here");
        }
        out.push(match item.split_once('-') {
            Some((a, b)) => format!("{}..{}", name(a)?, name(b)?),
            None => name(item)?,
        });
    }
    Ok(Some(out.join(",")))
}

/// A 5-field cron expression as a systemd `OnCalendar=` value (in `timezone`).
pub fn on_calendar(cron: &str, timezone: &str) -> Result<String> {
    let f: Vec<&str> = cron.split_whitespace().collect();
    let [minute, hour, dom, month, dow] = f[..] else { bail!("\"{cron}\" is not a 5-field cron expression") };
    if dom != "*" && dow != "*" {
        bail!(
            "\"{cron}\" restricts both the day of month and the day of week: cron runs when either matches, systemd when both do"
        );
    }
    let weekday = systemd_weekday(dow)?;
    let date = format!("*-{}-{}", systemd_field(month, 1, "month")?, systemd_field(dom, 1, "day of month")?);
    let time = format!("{}:{}:00", systemd_field(hour, 0, "hour")?, systemd_field(minute, 0, "minute")?);
    let tz = if timezone.is_empty() { String::new() } else { format!(" {timezone}") };
    Ok(match weekday {
        Some(w) => format!("{w} {date} {time}{tz}"),
        None => format!("{date} {time}{tz}"),
    })
}

/// Environment variables the scheduled run needs: the providers' API keys, the hub token
/// for publishing, the token of hub sources (private datasets).
pub fn secrets_of(p: &Pipeline, push_token: Option<&str>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut add = |var: &str, why: String| {
        if !out.iter().any(|(v, _)| v == var) {
            out.push((var.to_string(), why));
        }
    };
    if let Some(t) = push_token {
        add(t, "Hub token with write access (publishing)".into());
    }
    let providers: Vec<(&String, &Decl)> = p.providers.iter().chain(p.embedders.iter()).collect();
    for (name, d) in providers {
        // Every kind that reads a key names its variable `api_key_env`.
        if let Some(var) = d.options.get("api_key_env").and_then(|v| v.as_str()) {
            add(var, format!("API key of provider \"{name}\""));
        }
    }
    for s in &p.stages {
        if let Some(hf) = s.options.get("hf")
            && let Some(var) = hf.get("token_env").and_then(|v| v.as_str())
        {
            add(var, format!("Hub token to read stage \"{}\"'s dataset (private or gated repositories)", s.name));
        }
    }
    out
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,@+".contains(c)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

fn command_line(synth: &str, args: &[String]) -> String {
    std::iter::once(synth).chain(args.iter().map(String::as_str)).map(shell_quote).collect::<Vec<_>>().join(" ")
}

/// The recipe as text.
pub fn render(r: &Recipe) -> Result<String> {
    let mut s = String::new();
    let env_file = format!("/etc/synth/{}.env", r.name.trim_start_matches("synth-"));
    let secret_lines: String = if r.secrets.is_empty() {
        "#   (this pipeline reads no secret from the environment)\n".into()
    } else {
        r.secrets.iter().map(|(v, why)| format!("#   {v}=...    # {why}\n")).collect()
    };
    match r.target {
        Target::Systemd => {
            let calendar = on_calendar(&r.cron, &r.timezone)?;
            writeln!(
                s,
                "# synth regenerate {} {} (cron \"{}\"), as a systemd service + timer.",
                r.pipeline_arg, r.every, r.cron
            )?;
            writeln!(s, "# Secrets: {env_file} (chmod 600), one VAR=value per line:")?;
            s.push_str(&secret_lines);
            writeln!(s, "# Install: save both units below, then")?;
            writeln!(s, "#   sudo systemctl daemon-reload && sudo systemctl enable --now {}.timer", r.name)?;
            writeln!(s, "# systemd never starts the service again while it still runs; synth's own lock")?;
            writeln!(s, "# (exit status 75) covers manual runs of the same output directory.")?;
            writeln!(s)?;
            writeln!(s, "# /etc/systemd/system/{}.service", r.name)?;
            writeln!(s, "[Unit]")?;
            writeln!(s, "Description=synth regenerate {}", r.pipeline_arg)?;
            writeln!(s, "Wants=network-online.target")?;
            writeln!(s, "After=network-online.target")?;
            writeln!(s)?;
            writeln!(s, "[Service]")?;
            writeln!(s, "Type=oneshot")?;
            writeln!(s, "WorkingDirectory={}", r.workdir)?;
            writeln!(s, "EnvironmentFile={env_file}")?;
            writeln!(s, "ExecStart={}", command_line(&r.synth, &r.args))?;
            writeln!(s, "TimeoutStartSec={}", r.timeout)?;
            writeln!(s, "# 75: another regeneration of this output directory was running")?;
            writeln!(s, "SuccessExitStatus=75")?;
            writeln!(s, "Nice=10")?;
            writeln!(s)?;
            writeln!(s, "# /etc/systemd/system/{}.timer", r.name)?;
            writeln!(s, "[Unit]")?;
            writeln!(s, "Description=synth regenerate {} {}", r.pipeline_arg, r.every)?;
            writeln!(s)?;
            writeln!(s, "[Timer]")?;
            writeln!(s, "OnCalendar={calendar}")?;
            writeln!(s, "# Run a slot missed while the machine was off as soon as it is back.")?;
            writeln!(s, "Persistent=true")?;
            writeln!(s, "RandomizedDelaySec=5m")?;
            writeln!(s, "Unit={}.service", r.name)?;
            writeln!(s)?;
            writeln!(s, "[Install]")?;
            writeln!(s, "WantedBy=timers.target")?;
        }
        Target::Cron => {
            let inner = format!("set -a; . {env_file}; set +a; exec {}", command_line(&r.synth, &r.args));
            writeln!(s, "# synth regenerate {} {}, as a crontab line (crontab -e).", r.pipeline_arg, r.every)?;
            writeln!(s, "# Secrets: {env_file} (chmod 600), one VAR=value per line:")?;
            s.push_str(&secret_lines);
            writeln!(s, "# flock -n skips a slot while the previous run still holds the lock; cron uses the")?;
            writeln!(s, "# system time zone unless your cron honours CRON_TZ (cronie does).")?;
            writeln!(s, "CRON_TZ={}", r.timezone)?;
            writeln!(
                s,
                "{} cd {} && flock -n /var/lock/{}.lock sh -c {} >> /var/log/{}.log 2>&1",
                r.cron,
                shell_quote(&r.workdir),
                r.name,
                shell_quote(&inner),
                r.name
            )?;
        }
        Target::K8s => {
            let q = |v: &str| serde_json::to_string(v).expect("string");
            let command: Vec<String> =
                std::iter::once(r.synth.as_str()).chain(r.args.iter().map(String::as_str)).map(q).collect();
            writeln!(s, "# synth regenerate {} {}, as a Kubernetes CronJob.", r.pipeline_arg, r.every)?;
            writeln!(s, "# Secrets: the Secret {} holds them as keys:", r.name)?;
            if r.secrets.is_empty() {
                writeln!(s, "#   (this pipeline reads no secret from the environment; the Secret may be empty)")?;
            }
            for (v, why) in &r.secrets {
                writeln!(s, "#   {v}    # {why}")?;
            }
            let literals: String = r.secrets.iter().map(|(v, _)| format!(" --from-literal={v}=...")).collect();
            writeln!(s, "#   kubectl create secret generic {}{literals}", r.name)?;
            writeln!(s, "# Outputs, snapshots and caches persist on the PersistentVolumeClaim {}-state", r.name)?;
            writeln!(s, "# (mounted at {}/state; create it first). The image holds synth and the project", r.workdir)?;
            writeln!(s, "# at {}. concurrencyPolicy Forbid never starts a run while one is active;", r.workdir)?;
            writeln!(s, "# synth's own lock (exit status 75) covers a job created twice.")?;
            writeln!(s, "apiVersion: batch/v1")?;
            writeln!(s, "kind: CronJob")?;
            writeln!(s, "metadata:")?;
            writeln!(s, "  name: {}", r.name)?;
            writeln!(s, "spec:")?;
            writeln!(s, "  schedule: {}", q(&r.cron))?;
            writeln!(s, "  timeZone: {}", q(&r.timezone))?;
            writeln!(s, "  concurrencyPolicy: Forbid")?;
            writeln!(s, "  startingDeadlineSeconds: 3600")?;
            writeln!(s, "  successfulJobsHistoryLimit: 3")?;
            writeln!(s, "  failedJobsHistoryLimit: 3")?;
            writeln!(s, "  jobTemplate:")?;
            writeln!(s, "    spec:")?;
            writeln!(s, "      backoffLimit: 0")?;
            writeln!(s, "      activeDeadlineSeconds: {}", humantime::parse_duration(&r.timeout)?.as_secs())?;
            writeln!(s, "      template:")?;
            writeln!(s, "        spec:")?;
            writeln!(s, "          restartPolicy: Never")?;
            writeln!(s, "          containers:")?;
            writeln!(s, "            - name: synth")?;
            writeln!(s, "              image: {}", q(&r.image))?;
            writeln!(s, "              workingDir: {}", q(&r.workdir))?;
            writeln!(s, "              command: [{}]", command.join(", "))?;
            writeln!(s, "              env:")?;
            writeln!(s, "                - name: HF_HOME")?;
            writeln!(s, "                  value: {}", q(&format!("{}/state/hf", r.workdir)))?;
            writeln!(s, "              envFrom:")?;
            writeln!(s, "                - secretRef:")?;
            writeln!(s, "                    name: {}", r.name)?;
            if r.secrets.is_empty() {
                writeln!(s, "                    optional: true")?;
            }
            writeln!(s, "              volumeMounts:")?;
            writeln!(s, "                - name: state")?;
            writeln!(s, "                  mountPath: {}", q(&format!("{}/state", r.workdir)))?;
            writeln!(s, "          volumes:")?;
            writeln!(s, "            - name: state")?;
            writeln!(s, "              persistentVolumeClaim:")?;
            writeln!(s, "                claimName: {}-state", r.name)?;
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_becomes_cron() {
        assert_eq!(cron_of("daily", None, None).unwrap(), "0 3 * * *");
        assert_eq!(cron_of("weekly", Some("04:30"), Some("fri")).unwrap(), "30 4 * * 5");
        assert_eq!(cron_of("hourly", None, None).unwrap(), "0 * * * *");
        assert_eq!(cron_of("monthly", Some("1:05"), None).unwrap(), "5 1 1 * *");
        assert_eq!(cron_of("15m", None, None).unwrap(), "*/15 * * * *");
        assert_eq!(cron_of("6h", None, None).unwrap(), "0 */6 * * *");
        assert_eq!(cron_of("0  3 * *  mon", None, None).unwrap(), "0 3 * * mon");
        assert!(cron_of("7m", None, None).unwrap_err().to_string().contains("divide 60"));
        assert!(cron_of("fortnightly", None, None).is_err());
        assert!(cron_of("daily", Some("25:00"), None).is_err());
        assert!(cron_of("61 3 * * *", None, None).is_err(), "croner rejects minute 61");
    }

    #[test]
    fn cron_becomes_on_calendar() {
        assert_eq!(on_calendar("0 3 * * *", "UTC").unwrap(), "*-*-* 3:0:00 UTC");
        assert_eq!(on_calendar("30 4 * * 5", "UTC").unwrap(), "Fri *-*-* 4:30:00 UTC");
        assert_eq!(on_calendar("*/15 * * * *", "").unwrap(), "*-*-* *:0/15:00");
        assert_eq!(on_calendar("0 */6 1 * *", "UTC").unwrap(), "*-*-1 0/6:0:00 UTC");
        assert_eq!(on_calendar("0 9 * * 1-5", "UTC").unwrap(), "Mon..Fri *-*-* 9:0:00 UTC");
        assert_eq!(on_calendar("0 9 * 1,7 sun", "UTC").unwrap(), "Sun *-1,7-* 9:0:00 UTC");
        assert!(on_calendar("0 9 1 * 1", "UTC").is_err(), "cron ORs day of month and weekday");
    }

    #[test]
    fn commands_are_quoted_for_the_shell() {
        assert_eq!(shell_quote("pipelines/quickstart.toml"), "pipelines/quickstart.toml");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
    }
}
