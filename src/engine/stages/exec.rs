//! Execution helpers shared by stage kinds: batch-at-a-time transforms on a blocking
//! thread, and record-at-a-time async processing with bounded concurrency that keeps
//! input order (so outputs are deterministic) and keeps memory bounded (bounded
//! channels on both sides, a fixed number of records in flight); and the collecting
//! passes of an LLM stage in batch mode ([`batch_rounds`]).

use std::collections::HashSet;
use std::future::Future;

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use synth_core::data::arrow::array::RecordBatch;
use synth_core::data::arrow::datatypes::SchemaRef;
use tokio::sync::mpsc;

use super::{Answers, Cancelled, RunCtx};
use crate::services::batch::{BatchStage, Interrupted, RowRoute};
use synth_core::data::{self, Row};
use synth_core::progress::StageProgress;
use synth_core::store::failures::FailureKind;
use synth_core::store::failures::FailureLog;
use synth_core::store::parquet::{ParquetOut, open_reader, stream_batches};
use synth_llm::CallCtx;

/// Rows per batch read from inputs.
pub const BATCH_ROWS: usize = 8192;
/// Rows per batch written by record-at-a-time stages.
const ROW_BATCH: usize = 256;

/// Whether a batch transform keeps (a subset of) its input's ids unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ids {
    /// The output is a subset of the input's rows, in order, ids unchanged.
    Kept,
    /// One output row per input row that did not fail (recorded in the failure log with
    /// its input id), in order, under new ids.
    Changed,
}

/// Transform each input batch with `f` on a blocking thread and write the results.
/// `f` may record per-record failures in the log it is given.
pub async fn map_batches<F>(ctx: &mut RunCtx, input: usize, schema: SchemaRef, ids: Ids, mut f: F) -> Result<()>
where
    F: FnMut(&RecordBatch, &FailureLog) -> Result<RecordBatch> + Send + 'static,
{
    let mut out = match ids {
        Ids::Kept => ctx.create_output_keeping_ids(schema)?,
        Ids::Changed => ctx.create_output(schema)?,
    };
    let path = ctx.inputs[input].path.clone();
    let cancel = ctx.cancel.clone();
    let progress = ctx.progress.clone();
    let failures = ctx.failures.clone();
    let lineage = ctx.lineage.clone().filter(|_| input == 0);
    progress.set_total(ctx.inputs[input].num_rows);
    let (out, rows_in) = tokio::task::spawn_blocking(move || -> Result<(ParquetOut, u64)> {
        let reader = open_reader(&path, BATCH_ROWS)?;
        let mut rows_in = 0u64;
        for batch in reader {
            if cancel.is_cancelled() {
                bail!(Cancelled);
            }
            let batch = batch.with_context(|| format!("reading {}", path.display()))?;
            let failed_before = failures.len();
            let result = f(&batch, &failures)?;
            if let Some(lineage) = &lineage {
                match ids {
                    Ids::Kept => lineage.push_same_ids(rows_in, &batch, &result)?,
                    Ids::Changed => {
                        let failed: std::collections::HashSet<String> = failures.ids_since(failed_before);
                        let keep: Vec<bool> =
                            data::ids(&batch).iter().map(|id| !failed.contains(id.unwrap_or(""))).collect();
                        let kept = keep.iter().filter(|k| **k).count();
                        if kept != result.num_rows() {
                            bail!(
                                "{kept} input rows did not fail but {} rows came out (cannot run as shards)",
                                result.num_rows()
                            );
                        }
                        lineage.push_kept(rows_in, &keep);
                    }
                }
            }
            rows_in += batch.num_rows() as u64;
            out.write(&result)?;
            progress.inc(batch.num_rows() as u64);
        }
        Ok((out, rows_in))
    })
    .await
    .context("stage worker panicked")??;
    ctx.report.rows_in = rows_in;
    ctx.set_output(out)
}

/// Why one record failed, for the failure table.
#[derive(Debug, Clone)]
pub struct RowError {
    pub kind: FailureKind,
    pub message: String,
    /// Not the record's fault (bad API key, unknown model): stop the stage at once
    /// with this one message instead of failing every record the same way.
    pub fatal: bool,
    /// A model stage's last answer and every rejected answer's reason (the failure
    /// table's `raw` and `attempts`), so a user sees what the model said.
    pub answers: Option<Box<Answers>>,
}

impl RowError {
    pub fn new(kind: FailureKind, message: impl Into<String>) -> RowError {
        RowError { kind, message: message.into(), fatal: false, answers: None }
    }

    /// The same error, with what the model answered.
    pub fn with_answers(mut self, answers: Answers) -> RowError {
        self.answers = Some(Box::new(answers));
        self
    }
}

/// Records a record loop keeps beyond its `concurrency` for those whose answers are in
/// and wait for the cache to make them durable: two of the cache's group commits (it
/// closes one at 256 paid answers), so a rate the senders sustain survives a slow fsync.
const AWAITING_DURABLE: usize = 512;

/// A writer running on a blocking thread, fed through a bounded channel.
pub struct WriterTask {
    tx: mpsc::Sender<RecordBatch>,
    handle: tokio::task::JoinHandle<Result<ParquetOut>>,
}

impl WriterTask {
    pub fn spawn(mut out: ParquetOut) -> WriterTask {
        let (tx, mut rx) = mpsc::channel::<RecordBatch>(4);
        let handle = tokio::task::spawn_blocking(move || {
            while let Some(batch) = rx.blocking_recv() {
                out.write(&batch)?;
            }
            Ok(out)
        });
        WriterTask { tx, handle }
    }

    pub async fn write(&self, batch: RecordBatch) -> Result<()> {
        if self.tx.send(batch).await.is_err() {
            // The writer stopped: its error explains why.
            bail!("output writer stopped");
        }
        Ok(())
    }

    pub async fn finish(self) -> Result<ParquetOut> {
        drop(self.tx);
        self.handle.await.context("writer panicked")?
    }
}

/// Process every record of input `input` with `f` (at most `concurrency` being prepared or
/// sent at once; see [`AWAITING_DURABLE`]),
/// writing the rows it returns in input order. A record for which `f` fails goes
/// to the failure table; a returned row that does not fit `schema` fails its record.
/// On cancellation no new record starts; records in flight finish, then the stage
/// stops with [`Cancelled`] (nothing is committed).
pub async fn map_rows<F, Fut>(ctx: &mut RunCtx, input: usize, schema: SchemaRef, concurrency: usize, f: F) -> Result<()>
where
    F: Fn(Row) -> Fut,
    Fut: Future<Output = Result<Vec<Row>, RowError>>,
{
    map_rows_unless(ctx, input, schema, concurrency, f, || false).await.map(|_| ())
}

/// [`map_rows`], except that when `discard()` says so once every record is done, the
/// output is dropped and the failures it recorded are forgotten (as if the pass had not
/// run). Returns whether the output was kept.
async fn map_rows_unless<F, Fut>(
    ctx: &mut RunCtx,
    input: usize,
    schema: SchemaRef,
    concurrency: usize,
    f: F,
    discard: impl Fn() -> bool,
) -> Result<bool>
where
    F: Fn(Row) -> Fut,
    Fut: Future<Output = Result<Vec<Row>, RowError>>,
{
    let failures_before = ctx.failures.len();
    let failed_before = ctx.progress.failed.load(std::sync::atomic::Ordering::Relaxed);
    let hits_before = ctx.progress.cache_hits.load(std::sync::atomic::Ordering::Relaxed);
    let writer = WriterTask::spawn(ctx.create_output(schema.clone())?);
    let rx = stream_batches(ctx.inputs[input].path.clone(), ROW_BATCH);
    ctx.progress.set_total(ctx.inputs[input].num_rows);
    let cancel = ctx.cancel.clone();
    // Stops feeding records (on Ctrl-C, or after a fatal error) while the records in
    // flight finish: a request already sent is paid, so its answer reaches the cache
    // instead of being dropped and paid again by the next run.
    let stop = cancel.child_token();

    let batches = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) });
    let mut read_error: Option<anyhow::Error> = None;
    let mut fatal: Option<String> = None;
    let rows = batches
        .map(|batch| match batch {
            Ok(batch) => (0..batch.num_rows()).map(|i| Ok(Source { batch: batch.clone(), row: i })).collect::<Vec<_>>(),
            Err(e) => vec![Err(e)],
        })
        .flat_map(futures::stream::iter)
        .take_until(stop.clone().cancelled_owned());

    let f = &f;
    // `concurrency` records are prepared or sent at once; a record whose answer is in and
    // only waits for the cache's group commit gives its slot back (`llm::slot`), so up to
    // `AWAITING_DURABLE` more may be waiting for theirs without holding the others back.
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
    let (slots, stop_feeding) = (&slots, &stop);
    let mut results = std::pin::pin!(
        rows.map(|row| async move {
            match row {
                Ok(record) => {
                    let permit = tokio::select! {
                        biased;
                        // Stopped before its turn: the record never starts.
                        _ = stop_feeding.cancelled() => return Ok(None),
                        p = slots.clone().acquire_owned() => p.expect("the slots are never closed"),
                    };
                    let row = data::row_json(&record.batch, record.row);
                    let id = row.get(data::ID).and_then(|v| v.as_str()).unwrap_or_default().to_string();
                    let out = synth_llm::slot::hold(slots.clone(), permit, f(row)).await;
                    Ok(Some((id, record, out)))
                }
                Err(e) => Err(e),
            }
        })
        .buffered(concurrency.max(1) + AWAITING_DURABLE)
    );

    let mut pending: Vec<Group> = Vec::new();
    let mut n_pending = 0usize;
    let mut rows_in = 0u64;
    while let Some(item) = results.next().await {
        let (id, record, out) = match item {
            Ok(Some(x)) => x,
            // Only once feeding stopped (Ctrl-C or a fatal error): the stage fails below.
            Ok(None) => continue,
            Err(e) => {
                read_error = Some(e);
                break;
            }
        };
        if fatal.is_some() {
            // Draining the records in flight after a fatal error: their answers are in
            // the cache now; the stage fails below with the first fatal error.
            continue;
        }
        let input_row = rows_in;
        rows_in += 1;
        ctx.progress.inc(1);
        match out {
            Ok(rows) => {
                n_pending += rows.len();
                pending.push(Group { input_row, id, record, rows });
            }
            Err(e) if e.fatal => {
                fatal = Some(e.message);
                stop.cancel();
                continue;
            }
            Err(e) => ctx.fail_answered(&id, e.kind, e.message, record.text(), e.answers.map(|a| *a)),
        }
        if n_pending >= ROW_BATCH {
            flush_rows(ctx, &schema, &writer, std::mem::take(&mut pending)).await?;
            n_pending = 0;
        }
    }
    if let Some(e) = read_error {
        return Err(e);
    }
    if let Some(message) = fatal {
        bail!("{message}");
    }
    flush_rows(ctx, &schema, &writer, pending).await?;
    let out = writer.finish().await?;
    if cancel.is_cancelled() {
        bail!(Cancelled);
    }
    if discard() {
        drop(out);
        let kept: Vec<_> = ctx.failures.take().into_iter().take(failures_before).collect();
        for f in kept {
            ctx.failures.push(f);
        }
        ctx.progress.failed.store(failed_before, std::sync::atomic::Ordering::Relaxed);
        ctx.progress.done.store(0, std::sync::atomic::Ordering::Relaxed);
        ctx.progress.cache_hits.store(hits_before, std::sync::atomic::Ordering::Relaxed);
        return Ok(false);
    }
    ctx.report.rows_in = rows_in;
    ctx.set_output(out)?;
    Ok(true)
}

/// The rows one input record produced.
struct Group {
    input_row: u64,
    id: String,
    record: Source,
    rows: Vec<Row>,
}

/// An input record where it was read (its JSON text is made only for a failure).
struct Source {
    batch: RecordBatch,
    row: usize,
}

impl Source {
    /// The record as JSON, for the failure table.
    fn text(&self) -> Option<String> {
        serde_json::to_string(&data::row_json(&self.batch, self.row)).ok()
    }
}

/// Convert gathered rows to a batch; a record whose rows do not fit the schema fails.
async fn flush_rows(ctx: &RunCtx, schema: &SchemaRef, writer: &WriterTask, mut groups: Vec<Group>) -> Result<()> {
    loop {
        let rows: Vec<&Row> = groups.iter().flat_map(|g| g.rows.iter()).collect();
        if rows.is_empty() {
            return Ok(());
        }
        match data::rows_to_batch(schema, &rows) {
            Ok(batch) => {
                if let Some(lineage) = &ctx.lineage {
                    for g in &groups {
                        lineage.push(g.input_row, g.rows.len());
                    }
                }
                return writer.write(batch).await;
            }
            Err((bad_row, e)) => {
                // Find the record that produced the bad row and fail it.
                let mut seen = 0;
                let idx = groups
                    .iter()
                    .position(|g| {
                        seen += g.rows.len();
                        seen > bad_row
                    })
                    .expect("row index within groups");
                let g = groups.remove(idx);
                ctx.fail(
                    &g.id,
                    FailureKind::Schema,
                    format!("output does not fit the stage schema: {e}"),
                    g.record.text(),
                );
            }
        }
    }
}

/// Batch mode of an LLM stage (`services::batch`), in place of [`map_rows`]: run `f`
/// over the input's records with every request that is not cached deferred to a
/// provider batch instead of sent (a collecting pass, which writes and counts nothing),
/// then, once the batches are in, the output pass with the batches still open. Most
/// stages end every record with its answers, so that pass defers nothing and its output
/// is the stage's: the same output an online run writes, from the cache. When it does
/// defer (a re-ask follows an answer), its output is dropped, and collecting passes over
/// the records that defer follow, each once its batches are in, until a pass defers
/// nothing; then the output pass. Batches a stopped run left are collected first.
/// Ctrl-C leaves submitted batches running and stops the stage. Collected parts are
/// journaled done once their answers are committed, whatever the outcome
/// ([`BatchStage::finish_stores`]): the output pass runs while the writer commits.
#[allow(clippy::too_many_arguments)]
pub async fn batch_map_rows<F, Fut>(
    ctx: &mut RunCtx,
    input: usize,
    schema: SchemaRef,
    concurrency: usize,
    collect_concurrency: usize,
    batch: &BatchStage,
    call: &CallCtx,
    f: F,
) -> Result<()>
where
    F: Fn(Row, CallCtx) -> Fut,
    Fut: Future<Output = Result<Vec<Row>, RowError>>,
{
    let passes = async {
        batch_rounds(ctx, input, batch, call, collect_concurrency, &f, Some(1)).await?;
        batch.collector.begin_pass()?;
        let route = RowRoute::new(&batch.collector);
        let open = call.with_batch(route.clone());
        let kept =
            map_rows_unless(ctx, input, schema.clone(), concurrency, |row| f(row, open.clone()), || route.deferred())
                .await?;
        let deferred = batch.collector.end_pass()?;
        if !kept {
            tracing::info!(
                "stage \"{}\": {deferred} request(s) follow batch answers (re-asks); collecting until none is left",
                ctx.name
            );
            batch_rounds(ctx, input, batch, call, collect_concurrency, &f, None).await?;
            let closed = call.with_batch(batch.collector.clone());
            map_rows(ctx, input, schema, concurrency, |row| f(row, closed.clone())).await?;
        }
        batch.collector.close();
        Ok::<(), anyhow::Error>(())
    };
    let result = passes.await;
    let stored = batch.finish_stores().await;
    result.and(stored)
}

/// The collecting passes of [`batch_map_rows`]: every record first, then again those
/// that deferred something, once their batches are in, until a pass defers nothing
/// (or after `max_passes`).
async fn batch_rounds<F, Fut>(
    ctx: &RunCtx,
    input: usize,
    batch: &BatchStage,
    call: &CallCtx,
    concurrency: usize,
    f: &F,
    max_passes: Option<u32>,
) -> Result<()>
where
    F: Fn(Row, CallCtx) -> Fut,
    Fut: Future<Output = Result<Vec<Row>, RowError>>,
{
    let interrupted =
        |e: anyhow::Error| if e.downcast_ref::<Interrupted>().is_some() { anyhow::anyhow!(Cancelled) } else { e };
    batch.run_parts().await.map_err(interrupted)?;
    let quiet = CallCtx { progress: StageProgress::new(&ctx.name), ..call.clone() };
    let mut waiting: Option<HashSet<u64>> = None;
    let mut pass = 0u32;
    loop {
        pass += 1;
        if ctx.cancel.is_cancelled() {
            bail!(Cancelled);
        }
        batch.collector.begin_pass()?;
        ctx.progress.set_note(format!("batch: collecting requests (pass {pass})"));
        let rows = scan_rows(ctx, input, waiting.as_ref(), concurrency, |row| {
            let route = RowRoute::new(&batch.collector);
            let call = quiet.with_batch(route.clone());
            let fut = f(row, call);
            async move {
                let out = fut.await;
                (route.deferred(), out)
            }
        })
        .await?;
        let deferred = batch.collector.end_pass()?;
        if rows.is_empty() {
            break;
        }
        tracing::info!(
            "stage \"{}\": pass {pass}: {deferred} request(s) of {} record(s) wait for provider batches",
            ctx.name,
            rows.len()
        );
        batch.run_parts().await.map_err(interrupted)?;
        if max_passes.is_some_and(|m| pass >= m) {
            break;
        }
        waiting = Some(rows);
    }
    ctx.progress.set_note(String::new());
    Ok(())
}

/// Run `f` on the records of input `input` whose ordinals are in `only` (all when
/// `None`), `concurrency` at a time; the ordinals of those for which it said `true`.
/// A fatal error (a bad key, the cost cap, a full disk) stops the stage.
async fn scan_rows<F, Fut>(
    ctx: &RunCtx,
    input: usize,
    only: Option<&HashSet<u64>>,
    concurrency: usize,
    f: F,
) -> Result<HashSet<u64>>
where
    F: Fn(Row) -> Fut,
    Fut: Future<Output = (bool, Result<Vec<Row>, RowError>)>,
{
    let rx = stream_batches(ctx.inputs[input].path.clone(), ROW_BATCH);
    let batches = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) });
    let mut ordinal = 0u64;
    let rows = batches
        .map(move |batch| match batch {
            Ok(batch) => {
                let first = ordinal;
                ordinal += batch.num_rows() as u64;
                (0..batch.num_rows()).map(|i| Ok((first + i as u64, batch.clone(), i))).collect::<Vec<_>>()
            }
            Err(e) => vec![Err(e)],
        })
        .flat_map(futures::stream::iter)
        .filter(|r| {
            let keep = match r {
                Ok((n, _, _)) => only.is_none_or(|o| o.contains(n)),
                Err(_) => true,
            };
            async move { keep }
        })
        .take_until(ctx.cancel.clone().cancelled_owned());
    let f = &f;
    let mut results = std::pin::pin!(
        rows.map(|r| async move {
            let (n, batch, i) = r?;
            let (deferred, out) = f(data::row_json(&batch, i)).await;
            Ok::<_, anyhow::Error>((n, deferred, out))
        })
        .buffer_unordered(concurrency.max(1))
    );
    let mut deferred = HashSet::new();
    while let Some(item) = results.next().await {
        let (n, d, out) = item?;
        if let Err(e) = &out
            && e.fatal
        {
            bail!("{}", e.message);
        }
        if d {
            deferred.insert(n);
        }
    }
    if ctx.cancel.is_cancelled() {
        bail!(Cancelled);
    }
    Ok(deferred)
}
