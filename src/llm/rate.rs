//! Rate control for one (provider, base URL, model, key): requests-per-minute and
//! tokens-per-minute limiters (governor), an adaptive concurrency limit that halves
//! on overload and grows by one per window of successes (so servers that publish no
//! limits are not flooded), a shared pause when the server asks for one
//! (Retry-After, x-ratelimit-reset-*), a circuit breaker, and the retry loop with
//! exponential backoff and jitter (backoff crate). This layer owns retries:
//! async-openai is given an HTTP service that never retries.

use std::future::Future;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backoff::backoff::Backoff;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{ChatResponse, ErrorKind, LlmError};
use crate::progress::StageProgress;

/// Limits and retry settings of one provider.
#[derive(Debug, Clone, PartialEq)]
pub struct RateConfig {
    pub requests_per_minute: Option<u32>,
    pub tokens_per_minute: Option<u32>,
    pub max_concurrency: usize,
    pub initial_concurrency: usize,
    pub timeout: Duration,
    pub max_retries: u32,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Continuous failure for this long trips the breaker.
    pub breaker_after: Duration,
    /// How long the breaker stays open before a probe.
    pub breaker_pause: Duration,
    /// Consecutive trips after which the provider is declared unavailable.
    pub breaker_max_trips: u32,
}

impl Default for RateConfig {
    fn default() -> Self {
        RateConfig {
            requests_per_minute: None,
            tokens_per_minute: None,
            max_concurrency: 16,
            initial_concurrency: 4,
            timeout: Duration::from_secs(120),
            max_retries: 8,
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(60),
            breaker_after: Duration::from_secs(120),
            breaker_pause: Duration::from_secs(30),
            breaker_max_trips: 5,
        }
    }
}

/// Counters of one rate controller (all stages sharing it).
#[derive(Debug, Default)]
pub struct RateStats {
    pub sent: AtomicU64,
    pub retries: AtomicU64,
    pub rate_limited: AtomicU64,
    pub timeouts: AtomicU64,
    pub server_errors: AtomicU64,
    pub malformed: AtomicU64,
    pub breaker_trips: AtomicU64,
}

/// AIMD concurrency limit over a semaphore.
struct AdaptiveLimit {
    sem: Arc<Semaphore>,
    state: Mutex<Aimd>,
    min: usize,
    max: usize,
}

struct Aimd {
    limit: usize,
    successes: usize,
    /// Permits to retire as they come back (the limit shrank).
    to_forget: usize,
    last_decrease: Option<Instant>,
}

/// A concurrency slot; returned on drop unless the limit shrank meanwhile.
pub struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    limit: Arc<AdaptiveLimit>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(p) = self.permit.take() {
            let mut s = self.limit.state.lock().expect("aimd");
            if s.to_forget > 0 {
                s.to_forget -= 1;
                p.forget();
            }
        }
    }
}

impl AdaptiveLimit {
    fn new(initial: usize, max: usize) -> Arc<AdaptiveLimit> {
        let max = max.max(1);
        let initial = initial.clamp(1, max);
        Arc::new(AdaptiveLimit {
            sem: Arc::new(Semaphore::new(initial)),
            state: Mutex::new(Aimd { limit: initial, successes: 0, to_forget: 0, last_decrease: None }),
            min: 1,
            max,
        })
    }

    async fn acquire(self: &Arc<Self>) -> Slot {
        let permit = self.sem.clone().acquire_owned().await.expect("semaphore never closed");
        Slot { permit: Some(permit), limit: self.clone() }
    }

    fn on_success(&self) {
        let mut s = self.state.lock().expect("aimd");
        s.successes += 1;
        if s.successes >= s.limit && s.limit < self.max {
            s.successes = 0;
            if s.to_forget > 0 {
                s.to_forget -= 1;
            } else {
                self.sem.add_permits(1);
            }
            s.limit += 1;
        }
    }

    /// Halve, at most once per second (a burst of 429s from one window counts once).
    fn on_overload(&self) {
        let mut s = self.state.lock().expect("aimd");
        if s.last_decrease.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            return;
        }
        let new = (s.limit / 2).max(self.min);
        s.to_forget += s.limit - new;
        s.limit = new;
        s.successes = 0;
        s.last_decrease = Some(Instant::now());
    }

    fn current(&self) -> usize {
        self.state.lock().expect("aimd").limit
    }
}

struct Breaker {
    state: Mutex<BreakerState>,
}

#[derive(Default)]
struct BreakerState {
    failing_since: Option<Instant>,
    open_until: Option<Instant>,
    trips: u32,
}

/// Everything that paces requests to one endpoint.
pub struct RateControl {
    pub name: String,
    pub cfg: RateConfig,
    rpm: Option<DefaultDirectRateLimiter>,
    tpm: Option<(DefaultDirectRateLimiter, u32)>,
    /// Requests queue here (FIFO) so only the head waits on the limiters' timers;
    /// otherwise every freed cell would wake every waiting request.
    gate: tokio::sync::Mutex<()>,
    token_debt: AtomicU64,
    limit: Arc<AdaptiveLimit>,
    pause_until: Mutex<Option<Instant>>,
    breaker: Breaker,
    pub stats: RateStats,
}

fn per_second_quota(per_minute: u32) -> Quota {
    let per_minute = NonZeroU32::new(per_minute.max(1)).expect("nonzero");
    // Replenish evenly; allow at most one second's worth at once, so a full bucket at
    // start cannot overrun a server that enforces the same limit per second.
    let burst = NonZeroU32::new((per_minute.get() / 60).max(1)).expect("nonzero");
    Quota::per_minute(per_minute).allow_burst(burst)
}

impl RateControl {
    pub fn new(name: &str, cfg: RateConfig) -> Arc<RateControl> {
        let rpm = cfg.requests_per_minute.map(|r| RateLimiter::direct(per_second_quota(r)));
        let tpm = cfg.tokens_per_minute.map(|t| {
            let burst = (t / 60).max(1);
            let quota = Quota::per_minute(NonZeroU32::new(t.max(1)).expect("nonzero"))
                .allow_burst(NonZeroU32::new(burst).expect("nonzero"));
            (RateLimiter::direct(quota), burst)
        });
        let limit = AdaptiveLimit::new(cfg.initial_concurrency, cfg.max_concurrency);
        Arc::new(RateControl {
            name: name.to_string(),
            cfg,
            rpm,
            tpm,
            gate: tokio::sync::Mutex::new(()),
            token_debt: AtomicU64::new(0),
            limit,
            pause_until: Mutex::new(None),
            breaker: Breaker { state: Mutex::new(BreakerState::default()) },
            stats: RateStats::default(),
        })
    }

    pub fn concurrency(&self) -> usize {
        self.limit.current()
    }

    async fn wait_pause(&self) {
        loop {
            let until = *self.pause_until.lock().expect("pause");
            match until {
                Some(t) if t > Instant::now() => tokio::time::sleep_until(t.into()).await,
                _ => return,
            }
        }
    }

    fn pause_for(&self, d: Duration) {
        let until = Instant::now() + d;
        let mut p = self.pause_until.lock().expect("pause");
        if p.is_none_or(|cur| cur < until) {
            *p = Some(until);
        }
    }

    /// Wait while the breaker is open.
    async fn breaker_wait(&self) {
        loop {
            let until = self.breaker.state.lock().expect("breaker").open_until;
            match until {
                Some(t) if t > Instant::now() => tokio::time::sleep_until(t.into()).await,
                _ => return,
            }
        }
    }

    fn breaker_success(&self) {
        let mut s = self.breaker.state.lock().expect("breaker");
        s.failing_since = None;
        s.open_until = None;
        s.trips = 0;
    }

    /// Record a failure; errors when the provider has been down for good.
    fn breaker_failure(&self, last: &LlmError) -> Result<(), LlmError> {
        let mut s = self.breaker.state.lock().expect("breaker");
        let now = Instant::now();
        if s.open_until.is_some_and(|t| t > now) {
            return Ok(());
        }
        let since = *s.failing_since.get_or_insert(now);
        if now.duration_since(since) < self.cfg.breaker_after {
            return Ok(());
        }
        s.trips += 1;
        s.failing_since = None;
        self.stats.breaker_trips.fetch_add(1, Ordering::Relaxed);
        if s.trips > self.cfg.breaker_max_trips {
            return Err(LlmError::new(
                ErrorKind::Unavailable,
                format!(
                    "provider \"{}\" kept failing for {} trips of the circuit breaker; last error: {}",
                    self.name,
                    s.trips - 1,
                    last.message
                ),
            ));
        }
        s.open_until = Some(now + self.cfg.breaker_pause);
        tracing::warn!(
            "provider \"{}\" has failed continuously for {:?} (last: {}); pausing requests for {:?} (trip {} of {})",
            self.name,
            self.cfg.breaker_after,
            last,
            self.cfg.breaker_pause,
            s.trips,
            self.cfg.breaker_max_trips
        );
        Ok(())
    }

    fn backoff(&self) -> backoff::ExponentialBackoff {
        backoff::ExponentialBackoff {
            initial_interval: self.cfg.backoff_initial,
            current_interval: self.cfg.backoff_initial,
            randomization_factor: 0.5,
            multiplier: 2.0,
            max_interval: self.cfg.backoff_max,
            max_elapsed_time: None,
            ..Default::default()
        }
    }

    /// Run one logical request through rate control, retrying transient failures.
    /// `attempt` makes one HTTP attempt. Returns the response and the number of retries.
    pub async fn call<F, Fut>(
        &self,
        estimated_tokens: u64,
        progress: Option<&StageProgress>,
        mut attempt: F,
    ) -> Result<(ChatResponse, u32), LlmError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<ChatResponse, LlmError>>,
    {
        let mut backoff = self.backoff();
        let mut retries = 0u32;
        loop {
            self.breaker_wait().await;
            self.wait_pause().await;
            let slot = self.limit.acquire().await;
            if self.rpm.is_some() || self.tpm.is_some() {
                let _turn = self.gate.lock().await;
                if let Some(l) = &self.rpm {
                    wait_cells(l, NonZeroU32::MIN).await;
                }
                if let Some((l, burst)) = &self.tpm {
                    let want = estimated_tokens + self.token_debt.swap(0, Ordering::Relaxed);
                    let n = NonZeroU32::new(want.clamp(1, *burst as u64) as u32).expect("nonzero");
                    wait_cells(l, n).await;
                }
            }
            self.stats.sent.fetch_add(1, Ordering::Relaxed);
            if let Some(p) = progress {
                p.requests.fetch_add(1, Ordering::Relaxed);
            }
            let result = match tokio::time::timeout(self.cfg.timeout, attempt()).await {
                Ok(r) => r,
                Err(_) => Err(LlmError::new(ErrorKind::Timeout, format!("no answer within {:?}", self.cfg.timeout))),
            };
            drop(slot);
            let err = match result {
                Ok(resp) => {
                    self.limit.on_success();
                    self.breaker_success();
                    let actual = resp.usage.prompt_tokens + resp.usage.completion_tokens;
                    if actual > estimated_tokens {
                        self.token_debt.fetch_add(actual - estimated_tokens, Ordering::Relaxed);
                    }
                    return Ok((resp, retries));
                }
                Err(e) => e,
            };
            match err.kind {
                ErrorKind::RateLimited => {
                    self.stats.rate_limited.fetch_add(1, Ordering::Relaxed);
                    self.limit.on_overload();
                }
                ErrorKind::Timeout => {
                    self.stats.timeouts.fetch_add(1, Ordering::Relaxed);
                }
                ErrorKind::Server | ErrorKind::Connection => {
                    self.stats.server_errors.fetch_add(1, Ordering::Relaxed);
                }
                ErrorKind::Malformed => {
                    self.stats.malformed.fetch_add(1, Ordering::Relaxed);
                }
                _ => {}
            }
            if !err.kind.retryable() {
                return Err(err);
            }
            self.breaker_failure(&err)?;
            if retries >= self.cfg.max_retries {
                return Err(LlmError {
                    message: format!("gave up after {} attempts: {}", retries + 1, err.message),
                    ..err
                });
            }
            let mut wait = backoff.next_backoff().unwrap_or(self.cfg.backoff_max);
            if let Some(after) = err.retry_after {
                // The server said when: everyone waits, not just this request.
                self.pause_for(after);
                wait = wait.max(after);
            }
            retries += 1;
            self.stats.retries.fetch_add(1, Ordering::Relaxed);
            if let Some(p) = progress {
                p.retries.fetch_add(1, Ordering::Relaxed);
            }
            tracing::debug!("provider \"{}\": {err}; retry {retries} in {wait:?}", self.name);
            tokio::time::sleep(wait).await;
        }
    }
}

/// Wait until `n` cells are available, sleeping on tokio's timer (governor's own
/// async wait runs a separate timer thread, which costs a wake-up per request).
async fn wait_cells(limiter: &DefaultDirectRateLimiter, n: NonZeroU32) {
    use governor::clock::Clock;
    // The limiter's own clock: creating one per call would run CPUID (a VM exit) each time.
    let clock = limiter.clock();
    loop {
        match limiter.check_n(n) {
            Ok(Ok(())) => return,
            Ok(Err(not_until)) => tokio::time::sleep(not_until.wait_time_from(clock.now())).await,
            // More than the bucket holds: n was clamped to the burst, so this cannot happen.
            Err(_) => return,
        }
    }
}

/// The wait a response asks for: `retry-after-ms`, `retry-after` (seconds or an
/// HTTP date), or the larger of `x-ratelimit-reset-requests` / `-tokens` (`1s`, `6m0s`, `20ms`).
pub fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    if let Some(ms) = get("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        return Some(Duration::from_secs_f64((ms / 1000.0).max(0.0)));
    }
    if let Some(v) = get("retry-after") {
        if let Ok(secs) = v.parse::<f64>() {
            return Some(Duration::from_secs_f64(secs.max(0.0)));
        }
        if let Ok(when) = httpdate::parse_http_date(v) {
            return Some(when.duration_since(std::time::SystemTime::now()).unwrap_or_default());
        }
    }
    ["x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"]
        .iter()
        .filter_map(|h| get(h).and_then(parse_go_duration))
        .max()
}

/// Parse durations like `1s`, `6m0s`, `1h2m3.5s`, `250ms` (OpenAI's reset headers).
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    let mut total = 0f64;
    let mut rest = s.trim();
    if rest.is_empty() {
        return None;
    }
    if let Ok(secs) = rest.parse::<f64>() {
        return Some(Duration::from_secs_f64(secs.max(0.0)));
    }
    while !rest.is_empty() {
        let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let value: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let factor = match &rest[..unit_end] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            "us" | "µs" => 0.000_001,
            "ns" => 0.000_000_001,
            _ => return None,
        };
        total += value * factor;
        rest = &rest[unit_end..];
    }
    Some(Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("1s"), Some(Duration::from_secs(1)));
        assert_eq!(parse_go_duration("6m0s"), Some(Duration::from_secs(360)));
        assert_eq!(parse_go_duration("20ms"), Some(Duration::from_millis(20)));
        assert_eq!(parse_go_duration("1h2m3.5s"), Some(Duration::from_secs_f64(3723.5)));
        assert_eq!(parse_go_duration("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse_go_duration("soon"), None);
    }

    #[test]
    fn retry_after_headers() {
        let mut h = reqwest::header::HeaderMap::new();
        h.insert("retry-after", "2".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
        let mut h = reqwest::header::HeaderMap::new();
        h.insert("x-ratelimit-reset-requests", "1s".parse().unwrap());
        h.insert("x-ratelimit-reset-tokens", "6m0s".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(360)));
        let mut h = reqwest::header::HeaderMap::new();
        h.insert("retry-after-ms", "150".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_millis(150)));
    }

    #[test]
    fn aimd_halves_and_grows() {
        let l = AdaptiveLimit::new(8, 16);
        l.on_overload();
        assert_eq!(l.current(), 4);
        l.on_overload(); // within a second: counted once
        assert_eq!(l.current(), 4);
        for _ in 0..4 {
            l.on_success();
        }
        assert_eq!(l.current(), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_transient_errors_then_gives_up() {
        let cfg = RateConfig { max_retries: 2, backoff_initial: Duration::from_millis(10), ..Default::default() };
        let rc = RateControl::new("t", cfg);
        let mut n = 0;
        let r = rc
            .call(10, None, || {
                n += 1;
                let attempt = n;
                async move {
                    if attempt < 3 {
                        Err(LlmError::new(ErrorKind::Server, "boom"))
                    } else {
                        Ok(ChatResponse {
                            text: "ok".into(),
                            finish_reason: "stop".into(),
                            usage: Default::default(),
                            model: "m".into(),
                        })
                    }
                }
            })
            .await
            .unwrap();
        assert_eq!((r.0.text.as_str(), r.1), ("ok", 2));
        let err = rc.call(10, None, || async { Err(LlmError::new(ErrorKind::Server, "down")) }).await.unwrap_err();
        assert!(err.message.starts_with("gave up after 3 attempts"), "{}", err.message);
        let err = rc.call(10, None, || async { Err(LlmError::new(ErrorKind::Auth, "bad key")) }).await.unwrap_err();
        assert_eq!(err.kind, ErrorKind::Auth);
        assert_eq!(rc.stats.sent.load(Ordering::Relaxed), 7);
    }
}

/// One rate controller per endpoint identity (kind, base URL, model, key hash), shared
/// by every provider and embedder of a run that points there.
#[derive(Default)]
pub struct RateRegistry {
    rates: std::sync::Mutex<std::collections::HashMap<String, Arc<RateControl>>>,
}

impl RateRegistry {
    /// The controller for `key`, made with `cfg` on first use; a later user with other
    /// limits shares the first one's (and is warned).
    pub fn get(&self, key: &str, name: &str, cfg: RateConfig) -> Arc<RateControl> {
        let mut rates = self.rates.lock().expect("rates");
        if let Some(r) = rates.get(key) {
            if r.cfg != cfg {
                tracing::warn!(
                    "provider \"{name}\" shares its endpoint, model and key with \"{}\": using the limits of \"{}\"",
                    r.name,
                    r.name
                );
            }
            return r.clone();
        }
        let r = RateControl::new(name, cfg);
        rates.insert(key.to_string(), r.clone());
        r
    }

    /// Every controller made so far (for benchmarks and logs).
    pub fn all(&self) -> Vec<Arc<RateControl>> {
        self.rates.lock().expect("rates").values().cloned().collect()
    }
}
