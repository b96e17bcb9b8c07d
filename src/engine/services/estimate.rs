//! `synth run --dry-run`'s estimate of what a run would send and pay, per stage: the
//! run is simulated in a scratch directory with every model call answered by a stand-in
//! (the offline provider's shapes), so each stage's prompts are rendered on the records
//! its inputs would hold; the calls are counted, not sent. A call whose answer is in the
//! run's response cache counts as cached (free). With `--sample N`, the first N uncached
//! calls of each stage are sent for real (paid, and kept in the run's cache, so the run
//! does not pay for them again): their measured output length replaces `max_tokens`, and
//! their measured prompt tokens calibrate the prompt estimate (4 characters a token).
//!
//! What it is not: stages that answer in a different number of turns, tries or records
//! than the stand-in's answers lead to (re-asks after a check fails, dialogues that end
//! early) differ from the estimate; the estimate says so.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use synth_llm::pricing::Price;
use synth_llm::rate::RateConfig;

/// One stage's counted calls.
#[derive(Debug, Clone, Default)]
pub struct StageEstimate {
    pub provider: String,
    pub model: String,
    /// Calls the stage makes (cached, sampled and stood-in).
    pub requests: u64,
    /// Of them, answered from the run's cache (free).
    pub cached: u64,
    /// Of them, sent for real by `--sample`.
    pub sampled: u64,
    /// Prompt tokens of the stood-in calls, by the 4-characters rule.
    stand_in_in: u64,
    /// Their `max_tokens` (the most each may answer).
    stand_in_max_out: u64,
    stand_ins: u64,
    /// What the sampled calls measured: prompt tokens, answer tokens, the rule's prompt
    /// estimate for the same calls, and their latency.
    sampled_in: u64,
    sampled_out: u64,
    sampled_rule_in: u64,
    sampled_seconds: f64,
    /// Sampled calls that failed (their tokens are not known).
    pub sample_errors: u64,
    price: Option<Price>,
    batch_factor: Option<f64>,
    rate: Option<RateConfig>,
}

/// What one stage will cost, as printed.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    pub tokens_in: u64,
    pub tokens_out: u64,
    /// `tokens_out` is the stage's `max_tokens` summed (no sample measured it).
    pub out_is_bound: bool,
    /// USD at the provider's prices (`None`: no price known).
    pub cost: Option<f64>,
    /// The wall time its calls take at the configured limits (`None`: no limit and no
    /// measured latency to say it).
    pub wall: Option<Duration>,
    pub batch: bool,
}

impl StageEstimate {
    /// The stage's totals: sampled calls as measured, stood-in calls from the sample's
    /// means when there is a sample, else from the prompt rule and `max_tokens`.
    pub fn figures(&self) -> Figures {
        let measured = self.sampled.saturating_sub(self.sample_errors);
        let (stand_in_in, stand_in_out, bound) = if measured > 0 {
            let ratio =
                if self.sampled_rule_in > 0 { self.sampled_in as f64 / self.sampled_rule_in as f64 } else { 1.0 };
            let mean_out = self.sampled_out as f64 / measured as f64;
            ((self.stand_in_in as f64 * ratio).round() as u64, (mean_out * self.stand_ins as f64).round() as u64, false)
        } else {
            (self.stand_in_in, self.stand_in_max_out, self.stand_ins > 0)
        };
        let tokens_in = self.sampled_in + stand_in_in;
        let tokens_out = self.sampled_out + stand_in_out;
        // Only what is not cached is paid: the sample is (it was paid by this estimate).
        let paid_in = stand_in_in;
        let paid_out = stand_in_out;
        let batch = self.batch_factor.is_some();
        let cost = self.price.map(|p| p.cost(paid_in, paid_out) * self.batch_factor.unwrap_or(1.0));
        let wall = self.wall(self.stand_ins, paid_in + paid_out);
        Figures { tokens_in, tokens_out, out_is_bound: bound, cost, wall, batch }
    }

    /// The time `calls` calls of `tokens` tokens take at the provider's limits: the
    /// slowest of requests per minute, tokens per minute and concurrency × the sampled
    /// latency.
    fn wall(&self, calls: u64, tokens: u64) -> Option<Duration> {
        let rate = self.rate.as_ref()?;
        let mut seconds: Option<f64> = None;
        let mut at_least = |s: f64| seconds = Some(seconds.map_or(s, |t: f64| t.max(s)));
        if let Some(rpm) = rate.requests_per_minute.filter(|r| *r > 0) {
            at_least(calls as f64 * 60.0 / rpm as f64);
        }
        if let Some(tpm) = rate.tokens_per_minute.filter(|t| *t > 0) {
            at_least(tokens as f64 * 60.0 / tpm as f64);
        }
        let measured = self.sampled.saturating_sub(self.sample_errors);
        if measured > 0 {
            let latency = self.sampled_seconds / measured as f64;
            at_least(calls as f64 * latency / rate.max_concurrency.max(1) as f64);
        }
        seconds.map(Duration::from_secs_f64)
    }
}

/// The counts of one simulated run.
#[derive(Debug)]
pub struct Estimator {
    /// Calls per stage to send for real (`--sample`).
    pub sample: u64,
    stages: Mutex<BTreeMap<String, StageEstimate>>,
    /// Requests stood in already (by cache key): the run sends an identical request once
    /// and answers the others from its cache.
    seen: Mutex<std::collections::HashSet<String>>,
}

/// Who called, for [`Estimator::note`].
pub struct Caller<'a> {
    pub stage: &'a str,
    pub provider: &'a str,
    pub model: &'a str,
    pub price: Option<Price>,
    /// The batch price factor when the stage sends in batches.
    pub batch_factor: Option<f64>,
    pub rate: &'a RateConfig,
}

impl Estimator {
    pub fn new(sample: u64) -> Estimator {
        Estimator { sample, stages: Mutex::new(BTreeMap::new()), seen: Mutex::new(Default::default()) }
    }

    /// Whether a request (its cache key) is stood in for the first time in this run.
    pub fn first_time(&self, key: &str) -> bool {
        self.seen.lock().expect("estimate").insert(key.to_string())
    }

    fn entry<R>(&self, c: &Caller<'_>, f: impl FnOnce(&mut StageEstimate) -> R) -> R {
        let mut stages = self.stages.lock().expect("estimate");
        let e = stages.entry(c.stage.to_string()).or_default();
        if e.provider.is_empty() {
            e.provider = c.provider.to_string();
            e.model = c.model.to_string();
            e.price = c.price;
            e.rate = Some(c.rate.clone());
        }
        if c.batch_factor.is_some() {
            e.batch_factor = c.batch_factor;
        }
        f(e)
    }

    /// A call answered from the run's cache.
    pub fn cached(&self, c: &Caller<'_>) {
        self.entry(c, |e| {
            e.requests += 1;
            e.cached += 1;
        });
    }

    /// Whether this uncached call is one of the stage's sample (then it is sent, and
    /// [`Estimator::measured`] or [`Estimator::sample_failed`] follows).
    pub fn take_sample(&self, c: &Caller<'_>) -> bool {
        self.entry(c, |e| {
            if e.sampled < self.sample {
                e.requests += 1;
                e.sampled += 1;
                true
            } else {
                false
            }
        })
    }

    /// A sampled call's measured tokens, its prompt by the rule, and its latency.
    pub fn measured(&self, c: &Caller<'_>, tokens_in: u64, tokens_out: u64, rule_in: u64, seconds: f64) {
        self.entry(c, |e| {
            e.sampled_in += tokens_in;
            e.sampled_out += tokens_out;
            e.sampled_rule_in += rule_in;
            e.sampled_seconds += seconds;
        });
    }

    pub fn sample_failed(&self, c: &Caller<'_>) {
        self.entry(c, |e| e.sample_errors += 1);
    }

    /// A call answered by the stand-in: its prompt tokens by the rule, its `max_tokens`.
    pub fn stood_in(&self, c: &Caller<'_>, rule_in: u64, max_out: u64) {
        self.entry(c, |e| {
            e.requests += 1;
            e.stand_ins += 1;
            e.stand_in_in += rule_in;
            e.stand_in_max_out += max_out;
        });
    }

    /// Every stage that called a model, by name.
    pub fn stages(&self) -> BTreeMap<String, StageEstimate> {
        self.stages.lock().expect("estimate").clone()
    }
}

/// `1,234,567`.
fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `42 s`, `7 min`, `3.2 h`.
pub fn duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 90.0 {
        format!("{s:.0} s")
    } else if s < 5400.0 {
        format!("{:.0} min", s / 60.0)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

/// The estimate as a table, stages in `order` (the pipeline's), then a total line.
pub fn table(stages: &BTreeMap<String, StageEstimate>, order: &[String], sample: u64) -> String {
    let mut rows: Vec<[String; 8]> = vec![[
        "stage".into(),
        "provider".into(),
        "requests".into(),
        "cached".into(),
        "tokens in".into(),
        "tokens out".into(),
        "cost (USD)".into(),
        "time".into(),
    ]];
    let (mut tin, mut tout, mut cost, mut bound, mut unpriced, mut requests, mut cached) =
        (0u64, 0u64, 0.0f64, false, false, 0u64, 0u64);
    let mut wall = Duration::ZERO;
    let mut wall_unknown = false;
    for name in order {
        let Some(e) = stages.get(name) else { continue };
        let f = e.figures();
        tin += f.tokens_in;
        tout += f.tokens_out;
        bound |= f.out_is_bound;
        requests += e.requests;
        cached += e.cached;
        match f.cost {
            Some(c) => cost += c,
            None => unpriced = true,
        }
        match f.wall {
            Some(w) => wall += w,
            None if e.stand_ins > 0 => wall_unknown = true,
            None => {}
        }
        rows.push([
            name.clone(),
            format!("{} ({})", e.provider, e.model),
            thousands(e.requests),
            thousands(e.cached),
            thousands(f.tokens_in),
            format!("{}{}", if f.out_is_bound { "≤ " } else { "" }, thousands(f.tokens_out)),
            match f.cost {
                Some(c) => {
                    format!("{}{c:.2}{}", if f.out_is_bound { "≤ " } else { "" }, if f.batch { " (batch)" } else { "" })
                }
                None => "no price".into(),
            },
            match (f.batch, f.wall) {
                (true, _) => "batch: ≤ 24 h".into(),
                (false, Some(w)) => duration(w),
                (false, None) => "?".into(),
            },
        ]);
    }
    let le = if bound { "≤ " } else { "" };
    rows.push([
        "total".into(),
        String::new(),
        thousands(requests),
        thousands(cached),
        thousands(tin),
        format!("{le}{}", thousands(tout)),
        format!("{le}{cost:.2}{}", if unpriced { " + unpriced" } else { "" }),
        match (wall_unknown, wall.is_zero()) {
            (true, true) => "?".into(),
            (true, false) => format!("≥ {}", duration(wall)),
            (false, _) => duration(wall),
        },
    ]);
    let widths: Vec<usize> = (0..8).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for r in &rows {
        let cells: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(c, s)| {
                let pad = widths[c] - s.chars().count();
                if c < 2 { format!("{s}{}", " ".repeat(pad)) } else { format!("{}{s}", " ".repeat(pad)) }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    if bound {
        out.push_str(
            "≤: answers counted at max_tokens (no sample measured them); `--sample N` sends N calls a stage to measure them\n",
        );
    } else if sample > 0 {
        out.push_str(&format!(
            "answer lengths measured on up to {sample} call(s) a stage (sent, kept in the cache: the run does not pay for them again)\n"
        ));
    }
    if wall_unknown {
        out.push_str("?: no rate limit configured and no sampled latency to time it (`--sample N` measures it)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller<'a>(rate: &'a RateConfig) -> Caller<'a> {
        Caller {
            stage: "s",
            provider: "p",
            model: "gpt-4o",
            price: Some(Price { input: 2.5, output: 10.0 }),
            batch_factor: None,
            rate,
        }
    }

    #[test]
    fn a_sample_replaces_max_tokens_and_calibrates_the_prompt_rule() {
        let rate = RateConfig { requests_per_minute: Some(60), ..Default::default() };
        let e = Estimator::new(2);
        let c = caller(&rate);
        assert!(e.take_sample(&c));
        e.measured(&c, 120, 40, 100, 2.0);
        assert!(e.take_sample(&c));
        e.measured(&c, 120, 60, 100, 2.0);
        assert!(!e.take_sample(&c));
        for _ in 0..10 {
            e.stood_in(&c, 100, 1000);
        }
        e.cached(&c);
        let s = &e.stages()["s"];
        assert_eq!((s.requests, s.cached, s.sampled), (13, 1, 2));
        let f = s.figures();
        // 2 measured (240 in, 100 out) + 10 stood in at 1.2 × 100 in and 50 out each.
        assert_eq!((f.tokens_in, f.tokens_out, f.out_is_bound), (240 + 1200, 100 + 500, false));
        let cost = f.cost.unwrap();
        assert!((cost - (1200.0 * 2.5 + 500.0 * 10.0) / 1e6).abs() < 1e-12, "{cost}");
        // 10 calls at 60 a minute: 10 s (the sampled latency, 2 s over 16 in flight, is less).
        assert_eq!(f.wall, Some(Duration::from_secs(10)));
    }

    #[test]
    fn without_a_sample_answers_count_at_max_tokens_and_the_table_says_so() {
        let rate = RateConfig::default();
        let e = Estimator::new(0);
        let mut c = caller(&rate);
        c.batch_factor = Some(0.5);
        e.stood_in(&c, 1000, 256);
        e.stood_in(&c, 1000, 256);
        let f = e.stages()["s"].figures();
        assert_eq!((f.tokens_in, f.tokens_out, f.out_is_bound), (2000, 512, true));
        assert!((f.cost.unwrap() - 0.5 * (2000.0 * 2.5 + 512.0 * 10.0) / 1e6).abs() < 1e-12);
        let t = table(&e.stages(), &["s".to_string()], 0);
        assert!(t.contains("≤ 512") && t.contains("(batch)") && t.contains("max_tokens"), "{t}");
        assert!(t.lines().any(|l| l.starts_with("total")), "{t}");
    }
}
