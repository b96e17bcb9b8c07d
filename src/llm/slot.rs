//! A record's sending slot: a stage that maps records bounds how many are being prepared
//! or sent at once, but a record whose answer has arrived and only waits for the cache to
//! make it durable (a group commit: up to a quarter second plus an fsync) gives its slot
//! back, so a slow disk never holds back the requests behind it; a second call of the same
//! record takes a slot again.
//!
//! The slot travels with the record's future as a task-local value: the record loop
//! ([`hold`]) sets it, the call path ([`answered`], [`sending`]) returns and retakes it,
//! and a call handed to another runtime takes it along ([`current`], [`within`]).
//! Outside a record loop all are no-ops.

use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

struct Slot {
    pool: Arc<Semaphore>,
    held: Option<OwnedSemaphorePermit>,
}

/// One record's slot, shared by the futures that work for it.
#[derive(Clone)]
pub struct RecordSlot(Arc<Mutex<Slot>>);

tokio::task_local! {
    static SLOT: RecordSlot;
}

/// Run a record's future holding `permit` (a slot of `pool`).
pub async fn hold<F: Future>(pool: Arc<Semaphore>, permit: OwnedSemaphorePermit, f: F) -> F::Output {
    SLOT.scope(RecordSlot(Arc::new(Mutex::new(Slot { pool, held: Some(permit) }))), f).await
}

/// The slot of the record this future works for, to take along to another runtime.
pub fn current() -> Option<RecordSlot> {
    SLOT.try_with(RecordSlot::clone).ok()
}

/// Run `f` for the record that owns `slot` (on whatever runtime polls it).
pub async fn within<F: Future>(slot: Option<RecordSlot>, f: F) -> F::Output {
    match slot {
        Some(s) => SLOT.scope(s, f).await,
        None => f.await,
    }
}

/// The record's answer is in: give its slot back while it waits for the cache.
pub fn answered() {
    let _ = SLOT.try_with(|s| s.0.lock().expect("slot").held.take());
}

/// The record is about to send (again): take a slot if it gave its own back.
pub async fn sending() {
    let Some(slot) = current() else { return };
    let pool = {
        let s = slot.0.lock().expect("slot");
        if s.held.is_some() {
            return;
        }
        s.pool.clone()
    };
    let permit = pool.acquire_owned().await.expect("the slot pool is never closed");
    slot.0.lock().expect("slot").held = Some(permit);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_record_gives_its_slot_back_while_it_waits_and_retakes_one_to_send() {
        let pool = Arc::new(Semaphore::new(1));
        let permit = pool.clone().acquire_owned().await.unwrap();
        let p = pool.clone();
        hold(pool.clone(), permit, async move {
            assert_eq!(p.available_permits(), 0, "held while sending");
            answered();
            assert_eq!(p.available_permits(), 1, "given back once answered");
            answered();
            assert_eq!(p.available_permits(), 1, "given back once only");
            let other = p.clone().acquire_owned().await.unwrap();
            let retake = sending();
            tokio::pin!(retake);
            assert!(futures::poll!(retake.as_mut()).is_pending(), "a second call waits for a free slot");
            drop(other);
            retake.await;
            assert_eq!(p.available_permits(), 0, "the second call holds a slot");
        })
        .await;
        assert_eq!(pool.available_permits(), 1, "the slot is free when the record ends");
        // Taken along to another runtime's task, the same slot.
        let permit = pool.clone().acquire_owned().await.unwrap();
        let p = pool.clone();
        hold(pool.clone(), permit, async move {
            let slot = current();
            let elsewhere = tokio::spawn(within(slot, async { answered() }));
            elsewhere.await.unwrap();
            assert_eq!(p.available_permits(), 1, "given back from the other task");
        })
        .await;
        // Outside a record loop: nothing to give back or take.
        answered();
        sending().await;
    }
}
