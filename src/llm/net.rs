//! The network runtime: one current-thread tokio runtime on its own thread that runs
//! every chat call to a network provider (cache lookup, journal, rate control, the
//! HTTP exchange, the durable store), whatever runtime the calling stage runs on.
//!
//! Why a runtime of its own: an LLM call is a few microseconds of work separated by
//! long waits (rate-limiter timers, the server's latency), so at a steady request rate
//! its cost is the wake-ups of idle threads, not the work. On the engine's
//! work-stealing runtime each wake-up also wakes an idle worker to look for work, and
//! a hand-over between runtimes costs two more. So the stages that call network
//! providers (`Stage::network_bound`) run as a whole on this one thread, which owns
//! every connection, timer and limiter, and their calls run inline; other callers
//! hand over (BENCHMARKS.md, "LLM provider layer"). CPU-heavy work never runs here:
//! the offline provider runs on the caller's runtime, and blocking work goes to this
//! runtime's blocking pool like anywhere else.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use anyhow::{Context as _, Result};
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

thread_local! {
    static ON_NET: Cell<bool> = const { Cell::new(false) };
}

/// Whether the caller runs on the network runtime's thread.
pub fn on_net_thread() -> bool {
    ON_NET.with(Cell::get)
}

/// Handle to the network runtime. The thread runs until the handle is dropped; tasks
/// still running then are cancelled (their journal entries say they were in flight).
pub struct NetRuntime {
    handle: Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl NetRuntime {
    /// Start the runtime thread.
    pub fn start() -> Result<NetRuntime> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name("synth-net")
            .build()
            .context("starting the network runtime")?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("synth-net".into())
            .spawn(move || {
                ON_NET.with(|on| on.set(true));
                runtime.block_on(async {
                    let _ = stopped.await;
                });
                // Dropping the runtime cancels what is left.
                drop(runtime);
            })
            .context("starting the network thread")?;
        Ok(NetRuntime { handle, stop: Some(stop) })
    }

    /// The runtime's handle (to spawn a whole stage onto it).
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Run `fut` on the network runtime. Dropping the returned future cancels it
    /// there too (a cancelled stage does not leave requests running).
    pub fn run<F>(&self, fut: F) -> Remote<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        Remote { task: self.handle.spawn(fut) }
    }
}

impl Drop for NetRuntime {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A task on the network runtime, awaited from another runtime; aborted when dropped.
pub struct Remote<T> {
    task: JoinHandle<T>,
}

/// Why a remote task gave no result.
#[derive(Debug)]
pub enum RemoteError {
    /// The task panicked (the message, if it was a string).
    Panicked(String),
    /// The network runtime stopped first.
    Cancelled,
}

impl std::fmt::Display for RemoteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RemoteError::Panicked(m) => write!(f, "the network task panicked: {m}"),
            RemoteError::Cancelled => write!(f, "the network runtime stopped"),
        }
    }
}

impl<T> Future for Remote<T> {
    type Output = Result<T, RemoteError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.task).poll(cx).map(|r| {
            r.map_err(|e| {
                if e.is_panic() {
                    let p = e.into_panic();
                    let msg = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    RemoteError::Panicked(msg)
                } else {
                    RemoteError::Cancelled
                }
            })
        })
    }
}

impl<T> Drop for Remote<T> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn runs_on_its_own_thread_and_cancels_on_drop() {
        let net = NetRuntime::start().unwrap();
        let name = net.run(async { std::thread::current().name().map(str::to_string) }).await.unwrap();
        assert_eq!(name.as_deref(), Some("synth-net"));
        assert!(net.run(async { on_net_thread() }).await.unwrap());
        assert!(!on_net_thread());

        // A dropped remote future aborts its task: the flag is never set.
        let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let f = flag.clone();
        let remote = net.run(async move {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            f.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        drop(remote);
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
        assert!(!flag.load(std::sync::atomic::Ordering::SeqCst));

        let err = net.run(async { panic!("boom") }).await.map(|_: ()| ()).unwrap_err();
        assert!(err.to_string().contains("boom"), "{err}");

        // After the runtime stops, tasks report cancellation instead of hanging.
        let handle = net.handle.clone();
        drop(net);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let late = Remote { task: handle.spawn(async { 1 }) };
        assert!(matches!(late.await, Err(RemoteError::Cancelled)));
    }
}
