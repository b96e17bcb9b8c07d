//! The cost cap: `max_cost_usd` of a run (`[pipeline]`) and of a stage, the one place
//! synth refuses to spend. Every paid call reserves the most it can cost before it is
//! sent (online: its prompt estimate plus its `max_tokens` at the online price; a batch:
//! every line's, at the batch price) and settles to what it did cost when the answer
//! is stored. A reservation that would pass a cap is refused, so a run stops before
//! the cap, never after it. Counted: this run's spending (what earlier runs paid is in
//! the cache and costs nothing again). A run whose provider has no known price cannot
//! be capped: the stage refuses to start (see `check_priced`).

use std::collections::HashMap;
use std::sync::Mutex;

use synth_llm::{ErrorKind, LlmError};

#[derive(Default)]
struct Spend {
    spent: f64,
    reserved: f64,
}

/// Caps and spending of one run.
#[derive(Default)]
pub struct CostGuard {
    run_cap: Mutex<Option<f64>>,
    stage_caps: Mutex<HashMap<String, f64>>,
    run: Mutex<Spend>,
    stages: Mutex<HashMap<String, Spend>>,
}

/// A reservation to settle once the call is paid (or failed).
#[derive(Debug, Clone, Copy, Default)]
pub struct Reserved(pub f64);

impl CostGuard {
    pub fn set_run_cap(&self, cap: Option<f64>) {
        *self.run_cap.lock().expect("caps") = cap;
    }

    pub fn set_stage_cap(&self, stage: &str, cap: Option<f64>) {
        let mut caps = self.stage_caps.lock().expect("caps");
        match cap {
            Some(c) => caps.insert(stage.to_string(), c),
            None => caps.remove(stage),
        };
    }

    /// Whether a cap applies to this stage's calls.
    pub fn capped(&self, stage: &str) -> bool {
        self.run_cap.lock().expect("caps").is_some() || self.stage_caps.lock().expect("caps").contains_key(stage)
    }

    /// Reserve `amount` for a call of `stage`; refused (an error that stops the run)
    /// when the run's or the stage's cap would be passed.
    pub fn reserve(&self, stage: &str, amount: f64) -> Result<Reserved, LlmError> {
        let run_cap = *self.run_cap.lock().expect("caps");
        let stage_cap = self.stage_caps.lock().expect("caps").get(stage).copied();
        if run_cap.is_none() && stage_cap.is_none() {
            return Ok(Reserved(0.0));
        }
        let mut run = self.run.lock().expect("spend");
        let mut stages = self.stages.lock().expect("spend");
        let s = stages.entry(stage.to_string()).or_default();
        let over = |cap: f64, spend: &Spend, what: &str| {
            (spend.spent + spend.reserved + amount > cap + 1e-12).then(|| {
                LlmError::new(
                    ErrorKind::Budget,
                    format!(
                        "max_cost_usd of {what} (${cap:.4}) would be passed: ${:.4} spent in this run, ${:.4} more committed, the next submission may cost up to ${amount:.4}; nothing more is sent. Everything paid is kept in the cache: raise max_cost_usd and run again to go on",
                        spend.spent, spend.reserved
                    ),
                )
            })
        };
        if let Some(cap) = stage_cap
            && let Some(e) = over(cap, s, &format!("stage \"{stage}\""))
        {
            return Err(e);
        }
        if let Some(cap) = run_cap
            && let Some(e) = over(cap, &run, "the run")
        {
            return Err(e);
        }
        run.reserved += amount;
        s.reserved += amount;
        Ok(Reserved(amount))
    }

    /// Count `amount` as committed whatever the caps say (a batch already submitted,
    /// by an earlier run or before its create's answer was lost: it runs and is paid).
    pub fn force(&self, stage: &str, amount: f64) -> Reserved {
        self.run.lock().expect("spend").reserved += amount;
        self.stages.lock().expect("spend").entry(stage.to_string()).or_default().reserved += amount;
        Reserved(amount)
    }

    /// A reserved call cost `actual` (0 when it failed unpaid).
    pub fn settle(&self, stage: &str, reserved: Reserved, actual: f64) {
        let mut run = self.run.lock().expect("spend");
        run.reserved = (run.reserved - reserved.0).max(0.0);
        run.spent += actual;
        let mut stages = self.stages.lock().expect("spend");
        let s = stages.entry(stage.to_string()).or_default();
        s.reserved = (s.reserved - reserved.0).max(0.0);
        s.spent += actual;
    }

    /// What this run has spent: (run, stage).
    pub fn spent(&self, stage: &str) -> (f64, f64) {
        let run = self.run.lock().expect("spend").spent;
        let s = self.stages.lock().expect("spend").get(stage).map(|s| s.spent).unwrap_or(0.0);
        (run, s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_stop_before_the_cap() {
        let g = CostGuard::default();
        assert_eq!(g.reserve("a", 100.0).unwrap().0, 0.0, "no cap: nothing reserved");
        g.set_run_cap(Some(1.0));
        g.set_stage_cap("b", Some(0.5));
        let r = g.reserve("a", 0.6).unwrap();
        assert!(g.reserve("a", 0.5).is_err(), "0.6 committed + 0.5 > 1.0");
        g.settle("a", r, 0.2);
        let r2 = g.reserve("b", 0.4).unwrap();
        let e = g.reserve("b", 0.2).unwrap_err();
        assert!(e.kind.fatal() && e.message.contains("stage \"b\""), "{e}");
        g.settle("b", r2, 0.4);
        let (run, b) = g.spent("b");
        assert!((run - 0.6).abs() < 1e-9 && (b - 0.4).abs() < 1e-9, "{run} {b}");
        assert!(g.reserve("a", 0.4).is_ok(), "0.6 spent + 0.4 = the cap");
    }
}
