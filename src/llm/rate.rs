//! Rate control for one (provider, base URL, model, key): requests-per-minute and
//! tokens-per-minute limiters (governor), an adaptive concurrency limit that halves
//! on overload and grows by one per window of successes (so servers that publish no
//! limits are not flooded), a shared pause when the server asks for one
//! (Retry-After, x-ratelimit-reset-*), a circuit breaker, and the retry loop with
//! exponential backoff and jitter (backoff crate). This layer owns retries:
//! async-openai is given an HTTP service that never retries. Limits a server advertises
//! (`x-ratelimit-limit-requests` / `-tokens`, with `-remaining-*` and `-reset-*`) are
//! learned from every answer: the pace is the lower of the configured and the advertised
//! limit, and an exhausted window pauses everyone until it refills.

use std::future::Future;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backoff::backoff::Backoff;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{ChatResponse, ErrorKind, LlmError};
use synth_core::progress::StageProgress;

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
    /// Pace by the limits the server advertises in its response headers.
    pub learn_limits: bool,
    /// This process's share of the endpoint's limits (1 alone; 1/P for one of P shards
    /// running at once): applied to the limits the server advertises, which are the
    /// whole key's (configured limits are divided by `RateRegistry::with_share`).
    pub limit_share: f64,
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
            learn_limits: true,
            limit_share: 1.0,
        }
    }
}

/// How long requests wait for the first answer of an endpoint (whose headers may
/// advertise its limits) before they go anyway.
pub const PROBE_WAIT: Duration = Duration::from_secs(5);

/// The share of an advertised limit the client paces at: requests leave on time but
/// reach the server with jitter, so pacing at exactly the limit would draw some 429s.
pub const ADVERTISED_SHARE: f64 = 0.985;

/// The share of a requests-per-minute limit the client paces at: a request leaves on
/// its tick but reaches the server up to a few milliseconds later or earlier than its
/// neighbours, so pacing at exactly the limit would put one request too many into some
/// windows a strict server counts (at 50/s, 0.5 % is 50 ms of slack per 10 s window).
pub const STRICT_SHARE: f64 = 0.995;

/// How far behind its schedule the request pacer may catch up: a timer wakes a
/// millisecond or so late, and without catching up every late wake-up is lost (at 100
/// requests/s, 10 % of the rate). Part of `STRICT_SHARE`'s slack (50 ms per 10 s
/// window): 30 ms for catching up, 20 ms for the network's jitter.
pub const CATCH_UP: Duration = Duration::from_millis(30);

/// What one answer's `x-ratelimit-*` headers say (OpenAI's names, also sent by Azure,
/// LiteLLM, vLLM behind gateways, Together, Groq, ...), or Anthropic's
/// `anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}` (the reset an RFC 3339
/// time; `tokens` is the most restrictive token limit in effect). Limits are per minute.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ServerLimits {
    pub requests_limit: Option<u32>,
    pub requests_remaining: Option<u32>,
    pub requests_reset: Option<Duration>,
    pub tokens_limit: Option<u32>,
    pub tokens_remaining: Option<u32>,
    pub tokens_reset: Option<Duration>,
}

impl ServerLimits {
    /// The advertised limits of a response, if it carries any.
    pub fn from_headers(headers: &reqwest::header::HeaderMap) -> Option<ServerLimits> {
        let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
        // "600", or a float some gateways send ("600.0").
        let num = |name: &str| get(name).and_then(|v| v.parse::<f64>().ok()).filter(|x| x.is_finite() && *x >= 0.0);
        // Per figure: OpenAI's name, else Anthropic's (spelled out, not formatted: this
        // runs on every answer). Each row: limit, remaining, reset.
        const REQUESTS: [[&str; 2]; 3] = [
            ["x-ratelimit-limit-requests", "anthropic-ratelimit-requests-limit"],
            ["x-ratelimit-remaining-requests", "anthropic-ratelimit-requests-remaining"],
            ["x-ratelimit-reset-requests", "anthropic-ratelimit-requests-reset"],
        ];
        const TOKENS: [[&str; 2]; 3] = [
            ["x-ratelimit-limit-tokens", "anthropic-ratelimit-tokens-limit"],
            ["x-ratelimit-remaining-tokens", "anthropic-ratelimit-tokens-remaining"],
            ["x-ratelimit-reset-tokens", "anthropic-ratelimit-tokens-reset"],
        ];
        let either = |[openai, anthropic]: [&str; 2]| num(openai).or_else(|| num(anthropic)).map(|x| x as u32);
        let figures = |[limit, remaining, [openai, anthropic]]: [[&str; 2]; 3]| {
            let reset = get(openai).and_then(parse_go_duration).or_else(|| get(anthropic).and_then(until_rfc3339));
            (either(limit).filter(|x| *x > 0), either(remaining), reset)
        };
        let (requests_limit, requests_remaining, requests_reset) = figures(REQUESTS);
        let (tokens_limit, tokens_remaining, tokens_reset) = figures(TOKENS);
        let l = ServerLimits {
            requests_limit,
            requests_remaining,
            requests_reset,
            tokens_limit,
            tokens_remaining,
            tokens_reset,
        };
        (l != ServerLimits::default()).then_some(l)
    }
}

tokio::task_local! {
    /// Where the HTTP layer leaves the advertised limits of the answer to the attempt
    /// that [`RateControl::call`] is running in this task.
    static OBSERVED: Arc<Mutex<Option<ServerLimits>>>;
}

/// Record the rate-limit headers of a response for the rate controller running this
/// attempt (a no-op outside one).
pub fn observe(headers: &reqwest::header::HeaderMap) {
    if let Some(l) = ServerLimits::from_headers(headers) {
        let _ = OBSERVED.try_with(|o| *o.lock().expect("observed") = Some(l));
    }
}

/// A governor limiter for `per_minute`, with the value it was made for.
struct Paced {
    per_minute: u32,
    limiter: Arc<DefaultDirectRateLimiter>,
    burst: u32,
}

impl Paced {
    fn requests(per_minute: u32) -> Paced {
        let quota = per_second_quota(per_minute);
        Paced { per_minute, burst: quota.burst_size().get(), limiter: Arc::new(RateLimiter::direct(quota)) }
    }

    /// Start empty: a limit learned mid-run meets a server whose window the requests so
    /// far have partly used, so a full bucket would send a burst into a 429.
    fn drained(self) -> Paced {
        if let Some(n) = NonZeroU32::new(self.burst) {
            let _ = self.limiter.check_n(n);
        }
        self
    }

    fn tokens(per_minute: u32) -> Paced {
        let burst = (per_minute / 60).max(1);
        let quota = Quota::per_minute(NonZeroU32::new(per_minute.max(1)).expect("nonzero"))
            .allow_burst(NonZeroU32::new(burst).expect("nonzero"));
        Paced { per_minute, burst, limiter: Arc::new(RateLimiter::direct(quota)) }
    }
}

/// The limits in force: configured, and lowered by what the server advertised.
#[derive(Default)]
struct Pacing {
    rpm: Option<Paced>,
    tpm: Option<Paced>,
    /// The last limits the server advertised (for the manifest).
    advertised_rpm: Option<u32>,
    advertised_tpm: Option<u32>,
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
    /// Set when the breaker gave up: every call of this run fails with it from then on,
    /// without sending (the other records must not keep retrying one by one).
    gave_up: Option<LlmError>,
}

/// Everything that paces requests to one endpoint.
pub struct RateControl {
    pub name: String,
    pub cfg: RateConfig,
    pacing: Mutex<Pacing>,
    /// Until the first answer has come back (and with it any advertised limits), one
    /// request goes alone while the others wait here (at most [`PROBE_WAIT`]).
    probe: tokio::sync::Mutex<()>,
    probed: std::sync::atomic::AtomicBool,
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
    let per_minute = f64::from(per_minute.max(1)) * STRICT_SHARE;
    // Evenly spaced, with a burst only as large as `CATCH_UP`: GCRA then sends at most
    // ceil(W * rate) + burst - 1 requests in any window of W seconds, so the configured
    // limit holds in every 10 s window a server may count over (a burst of a second's
    // worth would put that many more into the first window, or any after a pause).
    let period = Duration::from_secs_f64(60.0 / per_minute);
    let burst = 1 + (CATCH_UP.as_secs_f64() / period.as_secs_f64()).floor() as u32;
    Quota::with_period(period).expect("a positive period").allow_burst(NonZeroU32::new(burst).expect("nonzero"))
}

impl RateControl {
    pub fn new(name: &str, cfg: RateConfig) -> Arc<RateControl> {
        let pacing = Pacing {
            rpm: cfg.requests_per_minute.map(Paced::requests),
            tpm: cfg.tokens_per_minute.map(Paced::tokens),
            ..Default::default()
        };
        let limit = AdaptiveLimit::new(cfg.initial_concurrency, cfg.max_concurrency);
        Arc::new(RateControl {
            name: name.to_string(),
            cfg,
            pacing: Mutex::new(pacing),
            probe: tokio::sync::Mutex::new(()),
            probed: std::sync::atomic::AtomicBool::new(false),
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

    /// The limits in force and the ones the server advertised, for the manifest:
    /// `requests_per_minute`, `tokens_per_minute` (paced), `advertised_*` (last seen).
    pub fn limits(&self) -> Vec<(&'static str, u32)> {
        let p = self.pacing.lock().expect("pacing");
        [
            ("requests_per_minute", p.rpm.as_ref().map(|x| x.per_minute)),
            ("tokens_per_minute", p.tpm.as_ref().map(|x| x.per_minute)),
            ("advertised_requests_per_minute", p.advertised_rpm),
            ("advertised_tokens_per_minute", p.advertised_tpm),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect()
    }

    /// Take in what an answer advertised: pace at the lower of the configured and
    /// [`ADVERTISED_SHARE`] of the advertised limit; when a window is used up, everyone
    /// waits until one request (or the tokens of one) is back.
    fn learn(&self, l: &ServerLimits) {
        if !self.cfg.learn_limits {
            return;
        }
        let effective = |configured: Option<u32>, advertised: u32| {
            let share = ((advertised as f64 * ADVERTISED_SHARE * self.cfg.limit_share).floor() as u32).max(1);
            configured.map_or(share, |c| c.min(share))
        };
        let mut pause = None;
        {
            let mut p = self.pacing.lock().expect("pacing");
            if let Some(adv) = l.requests_limit {
                let want = effective(self.cfg.requests_per_minute, adv);
                if p.rpm.as_ref().is_none_or(|x| x.per_minute != want) {
                    if p.advertised_rpm != Some(adv) {
                        tracing::info!(
                            "provider \"{}\": the server allows {adv} requests/min; pacing at {want}",
                            self.name
                        );
                    }
                    p.rpm = Some(Paced::requests(want).drained());
                }
                p.advertised_rpm = Some(adv);
                if l.requests_remaining == Some(0) {
                    // One request's worth of the window, or the reset if sooner.
                    let one = Duration::from_secs_f64(60.0 / adv as f64);
                    pause = Some(l.requests_reset.map_or(one, |r| r.min(one)));
                }
            }
            if let Some(adv) = l.tokens_limit {
                let want = effective(self.cfg.tokens_per_minute, adv);
                if p.tpm.as_ref().is_none_or(|x| x.per_minute != want) {
                    if p.advertised_tpm != Some(adv) {
                        tracing::info!(
                            "provider \"{}\": the server allows {adv} tokens/min; pacing at {want}",
                            self.name
                        );
                    }
                    p.tpm = Some(Paced::tokens(want).drained());
                }
                p.advertised_tpm = Some(adv);
                if l.tokens_remaining == Some(0) {
                    let one = Duration::from_secs_f64(60.0 / adv as f64);
                    let tokens = l.tokens_reset.unwrap_or(one).min(Duration::from_secs(60));
                    pause = Some(pause.map_or(tokens, |p: Duration| p.max(tokens)));
                }
            }
        }
        if let Some(d) = pause {
            self.pause_for(d);
        }
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
        if let Some(e) = &s.gave_up {
            return Err(e.clone());
        }
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
            let e = LlmError::new(
                ErrorKind::Unavailable,
                format!(
                    "provider \"{}\" kept failing for {} trips of the circuit breaker; last error: {}",
                    self.name,
                    s.trips - 1,
                    last.message
                ),
            );
            s.gave_up = Some(e.clone());
            return Err(e);
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
            if let Some(e) = &self.breaker.state.lock().expect("breaker").gave_up {
                return Err(e.clone());
            }
            // The first request to an endpoint goes alone, so that a server advertising
            // its limits is never sent more than the first answer says it takes.
            let mut probe = None;
            if self.cfg.learn_limits
                && !self.probed.load(Ordering::Acquire)
                && let Ok(guard) = tokio::time::timeout(PROBE_WAIT, self.probe.lock()).await
                && !self.probed.load(Ordering::Acquire)
            {
                probe = Some(guard);
            }
            self.wait_pause().await;
            let slot = self.limit.acquire().await;
            let (rpm, tpm) = {
                let p = self.pacing.lock().expect("pacing");
                (p.rpm.as_ref().map(|x| x.limiter.clone()), p.tpm.as_ref().map(|x| (x.limiter.clone(), x.burst)))
            };
            if rpm.is_some() || tpm.is_some() {
                let _turn = self.gate.lock().await;
                if let Some(l) = &rpm {
                    wait_cells(l, NonZeroU32::MIN).await;
                }
                if let Some((l, burst)) = &tpm {
                    let want = estimated_tokens + self.token_debt.swap(0, Ordering::Relaxed);
                    let n = NonZeroU32::new(want.clamp(1, *burst as u64) as u32).expect("nonzero");
                    wait_cells(l, n).await;
                }
                // A limit learned while this request queued applies from the next one.
            }
            self.stats.sent.fetch_add(1, Ordering::Relaxed);
            if let Some(p) = progress {
                p.requests.fetch_add(1, Ordering::Relaxed);
            }
            let observed = Arc::new(Mutex::new(None));
            let result = match OBSERVED.scope(observed.clone(), tokio::time::timeout(self.cfg.timeout, attempt())).await
            {
                Ok(r) => r,
                Err(_) => Err(LlmError::new(ErrorKind::Timeout, format!("no answer within {:?}", self.cfg.timeout))),
            };
            drop(slot);
            let seen = *observed.lock().expect("observed");
            if let Some(l) = seen {
                self.learn(&l);
            }
            if probe.take().is_some() {
                self.probed.store(true, Ordering::Release);
            }
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

/// The time until an RFC 3339 instant (Anthropic's reset headers); zero once past.
fn until_rfc3339(v: &str) -> Option<Duration> {
    let when = humantime::parse_rfc3339_weak(v).ok()?;
    Some(when.duration_since(std::time::SystemTime::now()).unwrap_or_default())
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

/// One rate controller per endpoint identity (kind, base URL, model, key hash), shared
/// by every provider and embedder of a run that points there.
pub struct RateRegistry {
    rates: std::sync::Mutex<std::collections::HashMap<String, Arc<RateControl>>>,
    /// The share of every endpoint's limits this process may use.
    share: f64,
}

impl Default for RateRegistry {
    fn default() -> Self {
        RateRegistry::with_share(1.0)
    }
}

impl RateRegistry {
    /// Controllers pacing at `share` of every limit (configured or advertised) and of
    /// the concurrency: one of `1 / share` shards running at once. The AIMD
    /// concurrency, the retries and the circuit breaker stay per process.
    pub fn with_share(share: f64) -> RateRegistry {
        RateRegistry { rates: Default::default(), share: share.clamp(f64::MIN_POSITIVE, 1.0) }
    }

    /// A configuration scaled to this registry's share.
    pub fn shared(&self, mut cfg: RateConfig) -> RateConfig {
        if self.share < 1.0 {
            let part = |x: u32| ((x as f64 * self.share).floor() as u32).max(1);
            cfg.requests_per_minute = cfg.requests_per_minute.map(part);
            cfg.tokens_per_minute = cfg.tokens_per_minute.map(part);
            cfg.max_concurrency = ((cfg.max_concurrency as f64 * self.share).ceil() as usize).max(1);
            cfg.initial_concurrency = cfg.initial_concurrency.min(cfg.max_concurrency);
            cfg.limit_share = self.share;
        }
        cfg
    }

    /// The controller for `key`, made with `cfg` on first use; a later user with other
    /// limits shares the first one's (and is warned).
    pub fn get(&self, key: &str, name: &str, cfg: RateConfig) -> Arc<RateControl> {
        let cfg = self.shared(cfg);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anthropic_rate_limit_headers_are_learned() {
        let mut h = reqwest::header::HeaderMap::new();
        let reset = humantime::format_rfc3339_seconds(std::time::SystemTime::now() + Duration::from_secs(30));
        for (k, v) in [
            ("anthropic-ratelimit-requests-limit", "50".to_string()),
            ("anthropic-ratelimit-requests-remaining", "49".to_string()),
            ("anthropic-ratelimit-requests-reset", reset.to_string()),
            ("anthropic-ratelimit-tokens-limit", "40000".to_string()),
            ("anthropic-ratelimit-tokens-remaining", "39000".to_string()),
            ("anthropic-ratelimit-tokens-reset", "2001-01-01T00:00:00Z".to_string()),
        ] {
            h.insert(reqwest::header::HeaderName::from_static(k), v.parse().unwrap());
        }
        let l = ServerLimits::from_headers(&h).expect("limits");
        assert_eq!((l.requests_limit, l.requests_remaining), (Some(50), Some(49)));
        assert_eq!((l.tokens_limit, l.tokens_remaining), (Some(40000), Some(39000)));
        let r = l.requests_reset.expect("reset");
        assert!(r > Duration::from_secs(25) && r <= Duration::from_secs(30), "{r:?}");
        assert_eq!(l.tokens_reset, Some(Duration::ZERO), "a reset in the past is now");
        // OpenAI's names win when both are sent.
        h.insert("x-ratelimit-limit-requests", "600".parse().unwrap());
        assert_eq!(ServerLimits::from_headers(&h).unwrap().requests_limit, Some(600));
    }

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
    fn advertised_limits_are_read_and_lower_the_pace() {
        let mut h = reqwest::header::HeaderMap::new();
        assert_eq!(ServerLimits::from_headers(&h), None);
        h.insert("x-ratelimit-limit-requests", "600".parse().unwrap());
        h.insert("x-ratelimit-remaining-requests", "0".parse().unwrap());
        h.insert("x-ratelimit-reset-requests", "20ms".parse().unwrap());
        h.insert("x-ratelimit-limit-tokens", "150000.0".parse().unwrap());
        h.insert("x-ratelimit-remaining-tokens", "149000".parse().unwrap());
        let l = ServerLimits::from_headers(&h).unwrap();
        assert_eq!(l.requests_limit, Some(600));
        assert_eq!(l.requests_reset, Some(Duration::from_millis(20)));
        assert_eq!((l.tokens_limit, l.tokens_remaining, l.tokens_reset), (Some(150000), Some(149000), None));

        // Configured 500 rpm stays (lower); tokens are learned; remaining 0 pauses.
        let cfg = RateConfig { requests_per_minute: Some(500), ..Default::default() };
        let rc = RateControl::new("t", cfg);
        rc.learn(&l);
        let limits: std::collections::BTreeMap<_, _> = rc.limits().into_iter().collect();
        assert_eq!(limits["requests_per_minute"], 500);
        assert_eq!(limits["advertised_requests_per_minute"], 600);
        assert_eq!(limits["tokens_per_minute"], 147750);
        assert!(rc.pause_until.lock().unwrap().is_some(), "an exhausted window pauses");

        // Without a configured limit the advertised one (less the margin) paces; off, nothing does.
        let rc = RateControl::new("t", RateConfig::default());
        rc.learn(&l);
        assert_eq!(rc.limits()[0], ("requests_per_minute", 591));
        let rc = RateControl::new("t", RateConfig { learn_limits: false, ..Default::default() });
        rc.learn(&l);
        assert!(rc.limits().is_empty());
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
                            system_fingerprint: None,
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

    /// Once the breaker gives up, every other call fails at once without sending: the
    /// records still retrying do not each wait out another trip.
    /// (Real time: the breaker reads the clock, which a paused tokio runtime does not move.)
    #[tokio::test]
    async fn a_breaker_that_gave_up_fails_every_call_without_sending() {
        let cfg = RateConfig {
            max_retries: 100_000,
            backoff_initial: Duration::from_millis(1),
            backoff_max: Duration::from_millis(2),
            breaker_after: Duration::from_millis(30),
            breaker_pause: Duration::from_millis(10),
            breaker_max_trips: 1,
            ..Default::default()
        };
        let rc = RateControl::new("t", cfg);
        let down = || async { Err(LlmError::new(ErrorKind::Server, "down")) };
        let (a, b) = tokio::join!(rc.call(10, None, down), rc.call(10, None, down));
        for e in [a.unwrap_err(), b.unwrap_err()] {
            assert!(e.message.contains("kept failing"), "{}", e.message);
        }
        let sent = rc.stats.sent.load(Ordering::Relaxed);
        let mut called = false;
        let e = rc
            .call(10, None, || {
                called = true;
                down()
            })
            .await
            .unwrap_err();
        assert!(e.message.contains("kept failing") && !called, "{}", e.message);
        assert_eq!(rc.stats.sent.load(Ordering::Relaxed), sent);
    }
}
