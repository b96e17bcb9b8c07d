//! Progress reporting: stages only bump atomic counters; a ticker renders them as
//! one indicatif bar per running stage on a terminal, or as periodic plain log
//! lines otherwise (CI, pipes), or not at all with `-q`; and, in every mode, as a small
//! JSON file a viewer can poll (`live.json` in the run's internal directory, replaced
//! once a second while the run goes on).

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Live counters of one running stage.
#[derive(Debug)]
pub struct StageProgress {
    pub name: String,
    total: AtomicU64,
    pub done: AtomicU64,
    pub failed: AtomicU64,
    pub requests: AtomicU64,
    pub cache_hits: AtomicU64,
    pub tokens_in: AtomicU64,
    pub tokens_out: AtomicU64,
    /// Cost in millionths of a dollar.
    pub cost_micro_usd: AtomicU64,
    pub retries: AtomicU64,
    /// The model ids the provider said answered (`model` of each answer, cached or not)
    /// and its `system_fingerprint`s: what `synth.lock` records as served.
    served: Mutex<(BTreeSet<String>, BTreeSet<String>)>,
    /// A line of state shown after the counters (e.g. a batch stage's batches).
    note: Mutex<String>,
    started: Instant,
    finished: AtomicBool,
}

const UNKNOWN: u64 = u64::MAX;

impl StageProgress {
    pub fn new(name: &str) -> Arc<StageProgress> {
        Arc::new(StageProgress {
            name: name.to_string(),
            total: AtomicU64::new(UNKNOWN),
            done: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            cache_hits: AtomicU64::new(0),
            tokens_in: AtomicU64::new(0),
            tokens_out: AtomicU64::new(0),
            cost_micro_usd: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            served: Mutex::new(Default::default()),
            note: Mutex::new(String::new()),
            started: Instant::now(),
            finished: AtomicBool::new(false),
        })
    }

    pub fn set_total(&self, total: u64) {
        self.total.store(total, Ordering::Relaxed);
    }

    pub fn total(&self) -> Option<u64> {
        match self.total.load(Ordering::Relaxed) {
            UNKNOWN => None,
            t => Some(t),
        }
    }

    pub fn inc(&self, n: u64) {
        self.done.fetch_add(n, Ordering::Relaxed);
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    pub fn set_note(&self, note: String) {
        *self.note.lock().expect("note") = note;
    }

    pub fn note(&self) -> String {
        self.note.lock().expect("note").clone()
    }

    pub fn cost_usd(&self) -> f64 {
        self.cost_micro_usd.load(Ordering::Relaxed) as f64 / 1e6
    }

    /// Note the model that answered a request (and its system fingerprint, if given).
    pub fn note_served(&self, model: &str, system_fingerprint: Option<&str>) {
        let mut served = self.served.lock().expect("served");
        if !served.0.contains(model) {
            served.0.insert(model.to_string());
        }
        if let Some(fp) = system_fingerprint.filter(|f| !f.is_empty() && !served.1.contains(*f)) {
            served.1.insert(fp.to_string());
        }
    }

    pub fn served_models(&self) -> BTreeSet<String> {
        self.served.lock().expect("served").0.clone()
    }

    pub fn system_fingerprints(&self) -> BTreeSet<String> {
        self.served.lock().expect("served").1.clone()
    }

    /// The counters as JSON (the live file's entry for this stage).
    pub fn live_json(&self) -> serde_json::Value {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        serde_json::json!({
            "name": self.name,
            "done": r(&self.done),
            "total": self.total(),
            "failed": r(&self.failed),
            "requests": r(&self.requests),
            "cache_hits": r(&self.cache_hits),
            "tokens_in": r(&self.tokens_in),
            "tokens_out": r(&self.tokens_out),
            "cost_usd": self.cost_usd(),
            "retries": r(&self.retries),
            "elapsed_seconds": self.elapsed().as_secs_f64(),
            "note": self.note(),
        })
    }

    /// "12 req/s · 3.4k tok/s · $0.0123" when the stage made requests, else "".
    fn llm_summary(&self) -> String {
        let req = self.requests.load(Ordering::Relaxed);
        if req == 0 {
            return String::new();
        }
        let secs = self.elapsed().as_secs_f64().max(1e-3);
        let toks = self.tokens_in.load(Ordering::Relaxed) + self.tokens_out.load(Ordering::Relaxed);
        format!(
            "{:.1} req/s · {:.0} tok/s · ${:.4} · {} cached",
            req as f64 / secs,
            toks as f64 / secs,
            self.cost_usd(),
            self.cache_hits.load(Ordering::Relaxed)
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Bars,
    Lines,
    Quiet,
}

/// The global multi-bar, so log output can be printed around the bars.
static MULTI: OnceLock<MultiProgress> = OnceLock::new();

/// Write log output without tearing progress bars.
pub struct LogWriter;

/// While set, log lines below WARN are dropped (`--dry-run`'s simulated run: its stages'
/// "starts" / "done" lines are not the user's run).
static MUTE_INFO: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Drop (or again print) log lines below WARN, process-wide.
pub fn mute_info(on: bool) {
    MUTE_INFO.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// The log's writer for each line: [`LogWriter`], or a sink while [`mute_info`] is on and the
/// line is below WARN.
pub struct LogSink;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogSink {
    type Writer = tracing_subscriber::fmt::writer::EitherWriter<LogWriter, std::io::Sink>;

    fn make_writer(&'a self) -> Self::Writer {
        tracing_subscriber::fmt::writer::EitherWriter::A(LogWriter)
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Self::Writer {
        // Levels compare by verbosity: INFO > WARN.
        if MUTE_INFO.load(std::sync::atomic::Ordering::Relaxed) && *meta.level() > tracing::Level::WARN {
            tracing_subscriber::fmt::writer::EitherWriter::B(std::io::sink())
        } else {
            tracing_subscriber::fmt::writer::EitherWriter::A(LogWriter)
        }
    }
}
impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match MULTI.get() {
            Some(mp) => mp.suspend(|| std::io::stderr().write_all(buf))?,
            None => std::io::stderr().write_all(buf)?,
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// Owner of all stage progress of one run.
pub struct ProgressHub {
    mode: Mode,
    stages: Mutex<Vec<(Arc<StageProgress>, Option<ProgressBar>)>>,
    /// Stages that finished (well or not): what they asked and spent still counts.
    done: Mutex<Vec<Arc<StageProgress>>>,
    line_interval: Duration,
    /// Where the live counters are written (set once the run knows its directory).
    live: Mutex<Option<std::path::PathBuf>>,
}

/// The file under a run's internal directory that holds its live counters.
pub const LIVE_FILE: &str = "live.json";

/// What a run's provider calls came to, failed stages included.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub requests: u64,
    pub cache_hits: u64,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost_usd: f64,
}

impl ProgressHub {
    pub fn new(mode: Mode) -> Arc<ProgressHub> {
        if mode == Mode::Bars {
            MULTI.get_or_init(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(8)));
        }
        Arc::new(ProgressHub {
            mode,
            stages: Mutex::new(Vec::new()),
            done: Mutex::new(Vec::new()),
            line_interval: Duration::from_secs(10),
            live: Mutex::new(None),
        })
    }

    /// Choose bars on a terminal, lines otherwise.
    pub fn auto(quiet: bool) -> Arc<ProgressHub> {
        use std::io::IsTerminal;
        let mode = if quiet {
            Mode::Quiet
        } else if std::io::stderr().is_terminal() && std::env::var_os("CI").is_none() {
            Mode::Bars
        } else {
            Mode::Lines
        };
        ProgressHub::new(mode)
    }

    pub fn start(&self, name: &str) -> Arc<StageProgress> {
        let p = StageProgress::new(name);
        let bar = (self.mode == Mode::Bars).then(|| {
            let bar = MULTI.get().expect("multi").add(ProgressBar::new(0));
            bar.set_style(
                ProgressStyle::with_template(
                    "{prefix:>22.bold} {spinner} {pos}/{len} [{bar:25}] {per_sec} eta {eta} {msg}",
                )
                .expect("template")
                .progress_chars("=> "),
            );
            bar.set_prefix(name.to_string());
            bar
        });
        self.stages.lock().expect("progress").push((p.clone(), bar));
        p
    }

    pub fn finish(&self, progress: &Arc<StageProgress>) {
        progress.finished.store(true, Ordering::Relaxed);
        let mut stages = self.stages.lock().expect("progress");
        if let Some(idx) = stages.iter().position(|(p, _)| Arc::ptr_eq(p, progress)) {
            let (p, bar) = stages.remove(idx);
            self.done.lock().expect("progress").push(p);
            if let Some(bar) = bar {
                bar.finish_and_clear();
                if let Some(mp) = MULTI.get() {
                    mp.remove(&bar);
                }
            }
        }
    }

    /// Requests, tokens and cost of every stage this hub saw, finished, failed or running.
    pub fn usage(&self) -> Usage {
        let running: Vec<Arc<StageProgress>> =
            self.stages.lock().expect("progress").iter().map(|(p, _)| p.clone()).collect();
        let done = self.done.lock().expect("progress").clone();
        let mut u = Usage::default();
        for p in running.iter().chain(done.iter()) {
            u.requests += p.requests.load(Ordering::Relaxed);
            u.cache_hits += p.cache_hits.load(Ordering::Relaxed);
            u.tokens_in += p.tokens_in.load(Ordering::Relaxed);
            u.tokens_out += p.tokens_out.load(Ordering::Relaxed);
            u.cost_usd += p.cost_usd();
        }
        u
    }

    /// Write the live counters to `path` from now on (see [`LIVE_FILE`]).
    pub fn write_live_to(&self, path: std::path::PathBuf) {
        *self.live.lock().expect("progress") = Some(path);
        self.write_live(true);
    }

    /// The live counters as JSON: each running stage's counters and the names of the
    /// stages that finished in this run.
    pub fn live(&self, running: bool) -> serde_json::Value {
        let stages: Vec<serde_json::Value> =
            self.stages.lock().expect("progress").iter().map(|(p, _)| p.live_json()).collect();
        let done: Vec<String> = self.done.lock().expect("progress").iter().map(|p| p.name.clone()).collect();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        serde_json::json!({
            "running": running,
            "pid": std::process::id(),
            "updated_unix_ms": now.as_millis() as u64,
            "stages": stages,
            "finished": done,
        })
    }

    fn write_live(&self, running: bool) {
        let Some(path) = self.live.lock().expect("progress").clone() else { return };
        let body = serde_json::to_vec_pretty(&self.live(running)).expect("json");
        // Replaced whole (a reader never sees half a file); a failure only costs the view.
        let tmp = path.with_extension("json.tmp");
        if std::fs::write(&tmp, body).is_ok() {
            let _ = std::fs::rename(&tmp, &path);
        }
    }

    /// Render until `stop` is cancelled (and keep the live file, in every mode).
    pub async fn tick(self: Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        let render = self.mode != Mode::Quiet;
        let period = if self.mode == Mode::Bars { Duration::from_millis(150) } else { self.line_interval };
        let mut interval = tokio::time::interval(period);
        let mut live = tokio::time::interval(Duration::from_secs(1));
        interval.tick().await;
        live.tick().await;
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = interval.tick(), if render => self.render(),
                _ = live.tick() => self.write_live(true),
            }
        }
        self.write_live(false);
    }

    fn render(&self) {
        let stages = self.stages.lock().expect("progress");
        for (p, bar) in stages.iter() {
            let done = p.done.load(Ordering::Relaxed);
            let failed = p.failed.load(Ordering::Relaxed);
            let mut extra = p.llm_summary();
            let note = p.note();
            if !note.is_empty() {
                extra = if extra.is_empty() { note } else { format!("{extra} · {note}") };
            }
            match bar {
                Some(bar) => {
                    if let Some(t) = p.total() {
                        bar.set_length(t);
                    }
                    bar.set_position(done);
                    let mut msg = String::new();
                    if failed > 0 {
                        msg.push_str(&format!("{failed} failed "));
                    }
                    msg.push_str(&extra);
                    bar.set_message(msg);
                }
                None => {
                    let secs = p.elapsed().as_secs_f64().max(1e-3);
                    let rate = done as f64 / secs;
                    let total = p.total().map(|t| format!("/{t}")).unwrap_or_default();
                    let eta = match p.total() {
                        Some(t) if rate > 0.0 && t > done => {
                            format!(
                                ", eta {}",
                                humantime::format_duration(Duration::from_secs(((t - done) as f64 / rate) as u64))
                            )
                        }
                        _ => String::new(),
                    };
                    let extra = if extra.is_empty() { String::new() } else { format!(", {extra}") };
                    tracing::info!(
                        "stage \"{}\": {done}{total} rows, {failed} failed ({rate:.0} rows/s{eta}{extra})",
                        p.name
                    );
                }
            }
        }
    }
}
