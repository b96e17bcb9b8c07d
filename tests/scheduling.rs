//! Scheduling through the library API with test-only stage kinds: independent
//! stages run concurrently (proved with a barrier both must reach — a serial
//! scheduler would never get past it), dependents start only after their inputs
//! finish, and cancellation keeps completed stages and resumes on the next run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::Result;
use async_trait::async_trait;
use synth::config::diag::Diagnostics;
use synth::dag::runner::{RunError, RunOptions, run};
use synth::data::arrow::array::{RecordBatch, StringArray};
use synth::data::arrow::datatypes::SchemaRef;
use synth::pipeline::{LoadOptions, load};
use synth::progress::{Mode, ProgressHub};
use synth::stages::{Arity, BuildCtx, Cancelled, KindInfo, PlanCtx, Role, RunCtx, Stage};
use tokio_util::sync::CancellationToken;

fn log() -> &'static Mutex<Vec<String>> {
    static LOG: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    LOG.get_or_init(|| Mutex::new(Vec::new()))
}

fn barrier() -> &'static tokio::sync::Barrier {
    static B: OnceLock<tokio::sync::Barrier> = OnceLock::new();
    B.get_or_init(|| tokio::sync::Barrier::new(2))
}

/// When false, `wait` stages block until the run is cancelled.
static RELEASE: AtomicBool = AtomicBool::new(false);

fn one_row(ctx: &mut RunCtx) -> Result<()> {
    let schema: SchemaRef = synth::data::schema_with_id([]);
    let mut out = ctx.create_output(schema.clone())?;
    out.write(&RecordBatch::try_new(schema, vec![Arc::new(StringArray::from(vec![ctx.name.clone()]))])?)?;
    ctx.report.rows_in = 1;
    ctx.set_output(out)
}

struct Test {
    behaviour: &'static str,
}

#[async_trait]
impl Stage for Test {
    fn plan(&self, _ctx: &mut PlanCtx<'_>) -> Option<SchemaRef> {
        Some(synth::data::schema_with_id([]))
    }

    async fn run(&self, ctx: &mut RunCtx) -> Result<()> {
        log().lock().unwrap().push(format!("start {}", ctx.name));
        match self.behaviour {
            "barrier" => {
                barrier().wait().await;
            }
            "wait" => {
                while !RELEASE.load(Ordering::SeqCst) {
                    tokio::select! {
                        _ = ctx.cancel.cancelled() => {
                            log().lock().unwrap().push(format!("cancelled {}", ctx.name));
                            return Err(Cancelled.into());
                        }
                        _ = tokio::time::sleep(Duration::from_millis(5)) => {}
                    }
                }
            }
            _ => {}
        }
        one_row(ctx)?;
        log().lock().unwrap().push(format!("end {}", ctx.name));
        Ok(())
    }
}

fn build_barrier(_: &BuildCtx<'_>, _: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    Some(Box::new(Test { behaviour: "barrier" }))
}
fn build_plain(_: &BuildCtx<'_>, _: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    Some(Box::new(Test { behaviour: "plain" }))
}
fn build_wait(_: &BuildCtx<'_>, _: &mut Diagnostics) -> Option<Box<dyn Stage>> {
    Some(Box::new(Test { behaviour: "wait" }))
}

static BARRIER_KIND: KindInfo = KindInfo {
    name: "test_barrier",
    version: 1,
    about: "waits until two such stages run at once",
    role: Role::Transform,
    arity: Arity::AtLeast(0),
    options: &[],
    uses_seed: false,
    summary: false,
    example: "",
    build: build_barrier,
};
static PLAIN_KIND: KindInfo = KindInfo { name: "test_plain", build: build_plain, ..BARRIER_KIND };
static WAIT_KIND: KindInfo = KindInfo { name: "test_wait", build: build_wait, ..BARRIER_KIND };

fn pipeline(dir: &std::path::Path, text: &str) -> Arc<synth::pipeline::Pipeline> {
    let path = dir.join("p.toml");
    std::fs::write(&path, text).unwrap();
    let opts = LoadOptions { extra_kinds: vec![&BARRIER_KIND, &PLAIN_KIND, &WAIT_KIND], ..Default::default() };
    let (p, diags) = load(&path, &opts);
    assert!(!diags.has_errors(), "{diags}");
    Arc::new(p.expect("pipeline"))
}

fn options(dir: &std::path::Path) -> RunOptions {
    RunOptions { out_dir: dir.join("out"), ..Default::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn independent_stages_run_concurrently_and_dependents_wait() {
    let dir = tempfile::tempdir().unwrap();
    let p = pipeline(
        dir.path(),
        r#"
[stages.left]
kind = "test_barrier"
[stages.right]
kind = "test_barrier"
[stages.after]
kind = "test_plain"
inputs = ["left", "right"]
"#,
    );
    let hub = ProgressHub::new(Mode::Quiet);
    let result =
        tokio::time::timeout(Duration::from_secs(30), run(p, options(dir.path()), hub, CancellationToken::new()))
            .await
            .expect("independent stages did not run concurrently (barrier never released)");
    let summary = result.expect("run");
    assert_eq!(summary.n_ran(), 3);
    let log = log().lock().unwrap().clone();
    let pos = |s: &str| log.iter().position(|l| l == s).unwrap_or_else(|| panic!("{s} missing from {log:?}"));
    assert!(pos("start after") > pos("end left"), "{log:?}");
    assert!(pos("start after") > pos("end right"), "{log:?}");
    assert!(pos("start left") < pos("end right") && pos("start right") < pos("end left"), "{log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_keeps_completed_stages_and_the_next_run_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let text = r#"
[stages.quick]
kind = "test_plain"
[stages.slow]
kind = "test_wait"
[stages.last]
kind = "test_plain"
inputs = ["quick", "slow"]
"#;
    let p = pipeline(dir.path(), text);
    let cancel = CancellationToken::new();
    let hub = ProgressHub::new(Mode::Quiet);
    let handle = tokio::spawn(run(p, options(dir.path()), hub, cancel.clone()));
    // Cancel once the quick stage is committed and the slow one is in flight.
    let state = dir.path().join("out/_synth/state/quick.json");
    for _ in 0..2000 {
        if state.exists() && log().lock().unwrap().iter().any(|l| l == "start slow") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cancel.cancel();
    let err = tokio::time::timeout(Duration::from_secs(30), handle).await.unwrap().unwrap().unwrap_err();
    match err {
        RunError::Interrupted(msg) => assert!(msg.contains("run the same command again to resume"), "{msg}"),
        other => panic!("expected an interruption, got {other:?}"),
    }
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("out/manifest.json")).unwrap()).unwrap();
    assert_eq!(m["status"], "interrupted");
    assert_eq!(m["stages"]["quick"]["status"], "ran");
    assert_eq!(m["stages"]["slow"]["status"], "cancelled");
    assert!(dir.path().join("out/quick.parquet").exists());
    assert!(!dir.path().join("out/slow.parquet").exists());

    RELEASE.store(true, Ordering::SeqCst);
    let p = pipeline(dir.path(), text);
    let summary =
        run(p, options(dir.path()), ProgressHub::new(Mode::Quiet), CancellationToken::new()).await.expect("resume");
    let status = |name: &str| summary.lines.iter().find(|l| l.stage == name).unwrap().status;
    use synth::store::state::StageStatus;
    assert_eq!(status("quick"), StageStatus::UpToDate);
    assert_eq!(status("slow"), StageStatus::Ran);
    assert_eq!(status("last"), StageStatus::Ran);
}
