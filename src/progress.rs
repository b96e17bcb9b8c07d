//! Progress reporting: stages only bump atomic counters; a ticker renders them as
//! one indicatif bar per running stage on a terminal, or as periodic plain log
//! lines otherwise (CI, pipes), or not at all with `-q`.

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
    line_interval: Duration,
}

impl ProgressHub {
    pub fn new(mode: Mode) -> Arc<ProgressHub> {
        if mode == Mode::Bars {
            MULTI.get_or_init(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(8)));
        }
        Arc::new(ProgressHub { mode, stages: Mutex::new(Vec::new()), line_interval: Duration::from_secs(10) })
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
            let (_, bar) = stages.remove(idx);
            if let Some(bar) = bar {
                bar.finish_and_clear();
                if let Some(mp) = MULTI.get() {
                    mp.remove(&bar);
                }
            }
        }
    }

    /// Render until `stop` is cancelled.
    pub async fn tick(self: Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        if self.mode == Mode::Quiet {
            return;
        }
        let period = if self.mode == Mode::Bars { Duration::from_millis(150) } else { self.line_interval };
        let mut interval = tokio::time::interval(period);
        interval.tick().await;
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = interval.tick() => self.render(),
            }
        }
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
