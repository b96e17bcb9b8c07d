//! `review`: apply the run's review file (`review.jsonl` in the output directory,
//! `quality::review`) to a table: a record a person dropped goes to the failure table
//! (kind `review`, with the reviewer's note), the rest pass unchanged. The drop
//! decisions are part of the stage's fingerprint, so a changed review re-runs this
//! stage and what reads it, nothing above.

use std::sync::Arc;

use anyhow::Result;
use async_trait::async_trait;
use synth_core::data::arrow::array::BooleanArray;
use synth_core::data::arrow::datatypes::SchemaRef;

use synth_core::config::diag::Diagnostics;
use synth_core::data;
use synth_core::store::failures::{Failure, FailureKind};
use synth_engine::stages::{BuildCtx, KindInfo, PlanCtx, PrepareCtx, Prepared, RunCtx, Stage};
use synth_quality::review::{Decision, Review};

pub static KIND: KindInfo = KindInfo {
    name: "review",
    about: "drop the records a person dropped in the run's review file (review.jsonl); the rest pass unchanged",
    options: &[],
    example: "",
    build,
    ..KindInfo::DEFAULT
};

struct ReviewStage;

fn build(_ctx: &BuildCtx<'_>, _diags: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    Some(Box::new(ReviewStage))
}

/// What a stage that applies the review adds to its fingerprint: the drop decisions
/// (nothing when there are none, so a run without a review keeps its fingerprints).
pub fn review_prepared(review: &Review) -> Prepared {
    let mut p = Prepared::default();
    if review.dropped().next().is_some() {
        p.fingerprint.insert("review".into(), review.drops_digest());
    }
    p
}

/// The failure-table message of a record a person dropped.
pub fn dropped_message(d: &Decision) -> String {
    let mut m = String::from("dropped in review");
    if let Some(r) = &d.reviewer {
        m.push_str(&format!(" by {r}"));
    }
    if let Some(t) = &d.time {
        m.push_str(&format!(" on {t}"));
    }
    if let Some(n) = d.note.as_ref().filter(|n| !n.trim().is_empty()) {
        m.push_str(&format!(": {n}"));
    }
    m
}

#[async_trait]
impl Stage for ReviewStage {
    fn plan(&self, ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        ctx.input_schema(0)
    }

    async fn prepare(&self, ctx: &PrepareCtx<'_>) -> Result<Option<Prepared>> {
        Ok(Some(review_prepared(ctx.review)))
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        let schema = ctx.inputs[0].schema.clone();
        let review: Arc<Review> = ctx.review.clone();
        // (records with a decision, records dropped)
        let counts = Arc::new([std::sync::atomic::AtomicU64::new(0), std::sync::atomic::AtomicU64::new(0)]);
        let counted = counts.clone();
        synth_engine::stages::exec::map_batches(
            ctx,
            0,
            schema,
            synth_engine::stages::exec::Ids::Kept,
            move |batch, failures| {
                let ids = data::ids(batch);
                let mask: BooleanArray = (0..batch.num_rows())
                    .map(|i| match review.get(ids.value(i)) {
                        Some(d) if d.decision == synth_quality::review::Verdict::Drop => {
                            counted[0].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let mut f = Failure::new(
                                ids.value(i),
                                FailureKind::Review,
                                synth_core::secrets::scrub(&dropped_message(d)),
                                serde_json::to_string(&data::row_json(batch, i)).ok(),
                            );
                            f.check = Some("review".into());
                            failures.push(f);
                            counted[1].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            Some(false)
                        }
                        Some(_) => {
                            counted[0].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            Some(true)
                        }
                        None => Some(true),
                    })
                    .collect();
                Ok(synth_core::data::arrow::compute::filter_record_batch(batch, &mask)?)
            },
        )
        .await?;
        let load = |k: usize| counts[k].load(std::sync::atomic::Ordering::Relaxed) as f64;
        ctx.report.metrics.insert("review.reviewed".into(), load(0));
        ctx.report.metrics.insert("review.dropped".into(), load(1));
        Ok(())
    }
}
