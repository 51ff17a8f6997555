//! Concurrent checks sent together: one `Check` call for what is queued.
//!
//! Nagle's rule, for checks: while fewer than [`IN_FLIGHT`] calls are out a
//! check leaves at once (an idle client adds no wait); while they are all
//! out, checks queue and the next call takes everything waiting. An app of
//! 64 busy tasks measured about a fifth of the server's CPU and of its own
//! per decision against one call per check (`benches/app.py`).
//!
//! Three rules keep a batch from doing what a single call would not:
//! - a check whose caller has stopped waiting (its deadline passed, so
//!   `on_unavailable` already decided it) is not sent: it would spend the
//!   limit for an answer nobody reads;
//! - a call is dropped at the client's deadline, so a node that never
//!   answers (a half-open connection, a stuck process) frees its slot
//!   instead of holding it and, with every slot held, leaving every later
//!   check unsent until its deadline;
//! - a node that refuses a call as too large (`limits.max_batch` below the
//!   client's batch) says how many it takes, and later calls carry no
//!   more; that call's checks go to `on_unavailable`, as a failed call's
//!   do. A refusal that does not say (a proxy's) changes nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sluice_api::v1 as pb;
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::Stats;
use crate::stream::{Called, Calls};

/// Checks per `Check` call a client sends at most, unless told otherwise.
pub const DEFAULT_BATCH: usize = 100;

/// Calls a batching client keeps in flight; while they are all out, checks
/// queue and leave together when one returns.
const IN_FLIGHT: usize = 4;

/// A check waiting for the batcher, and where its answer goes.
pub(crate) struct Queued {
    pub request: pb::RateLimitRequest,
    pub answer: oneshot::Sender<pb::RateLimitResponse>,
}

/// Send what is queued, in calls of at most `max` checks, each within
/// `deadline`. A failed call drops its answers' senders, so those checks go
/// to `on_unavailable`. Ends when every sender of `rx` is gone.
pub(crate) async fn batch_loop(
    mut rx: mpsc::Receiver<Queued>,
    calls: Calls,
    max: usize,
    deadline: Duration,
    stats: Arc<Stats>,
) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    // What a call carries: `max`, until a node refuses a call as too large.
    let size = Arc::new(AtomicUsize::new(max.max(1)));
    while let Some(first) = rx.recv().await {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let batch = fill(first, &mut rx, size.load(Ordering::Relaxed));
        if batch.is_empty() {
            continue;
        }
        let (calls, size, stats) = (calls.clone(), size.clone(), stats.clone());
        tokio::spawn(async move {
            let _slot = slot;
            send(&calls, batch, deadline, &size, &stats).await;
        });
    }
}

/// `first` and whatever else is queued, up to `max` checks, less those
/// nobody waits for any more.
fn fill(first: Queued, rx: &mut mpsc::Receiver<Queued>, max: usize) -> Vec<Queued> {
    let mut batch = Vec::new();
    let mut next = Some(first);
    while let Some(q) = next {
        if !q.answer.is_closed() {
            batch.push(q);
        }
        if batch.len() >= max {
            break;
        }
        next = rx.try_recv().ok();
    }
    batch
}

/// One call for `batch`; answers in order, or none.
async fn send(
    calls: &Calls,
    batch: Vec<Queued>,
    deadline: Duration,
    size: &AtomicUsize,
    stats: &Stats,
) {
    stats.calls.fetch_add(1, Ordering::Relaxed);
    let (requests, answers): (Vec<_>, Vec<_>) =
        batch.into_iter().map(|q| (q.request, q.answer)).unzip();
    let n = answers.len();
    match calls.call(requests, deadline).await {
        Called::Answered(responses) if responses.len() == n => {
            for (answer, response) in answers.into_iter().zip(responses) {
                let _ = answer.send(response);
            }
        }
        Called::TooMany(Some(most)) if most > 0 => {
            size.fetch_min(most, Ordering::Relaxed);
        }
        _ => {}
    }
}

/// The most items per call a node said it takes, when it said so.
pub(crate) fn node_max_batch(status: &tonic::Status) -> Option<usize> {
    let value = status.metadata().get(sluice_api::MAX_BATCH_METADATA)?;
    let most: usize = value.to_str().ok()?.parse().ok()?;
    (most > 0).then_some(most)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queued(key: &str) -> (Queued, oneshot::Receiver<pb::RateLimitResponse>) {
        let (answer, rx) = oneshot::channel();
        let request = pb::RateLimitRequest {
            unique_key: key.into(),
            ..Default::default()
        };
        (Queued { request, answer }, rx)
    }

    fn keys(batch: &[Queued]) -> Vec<&str> {
        batch
            .iter()
            .map(|q| q.request.unique_key.as_str())
            .collect()
    }

    #[test]
    fn a_batch_skips_checks_nobody_waits_for_and_keeps_to_its_size() {
        let (tx, mut rx) = mpsc::channel(16);
        let (first, _wait_first) = queued("a");
        let mut waiting = Vec::new();
        for key in ["b", "c", "d", "e"] {
            let (q, wait) = queued(key);
            tx.try_send(q).unwrap();
            waiting.push(wait);
        }
        // "b"'s caller gave up (its deadline passed): not sent.
        drop(waiting.remove(0));
        let batch = fill(first, &mut rx, 2);
        assert_eq!(keys(&batch), ["a", "c"]);
        // The rest waits for the next call, in order.
        let (next, _wait_next) = queued("f");
        tx.try_send(next).unwrap();
        let batch = fill(rx.try_recv().unwrap(), &mut rx, 10);
        assert_eq!(keys(&batch), ["d", "e", "f"]);
        // A first check nobody waits for, and nothing behind it: no call.
        let (gone, wait_gone) = queued("g");
        drop(wait_gone);
        assert!(fill(gone, &mut rx, 10).is_empty());
    }

    #[test]
    fn only_a_node_that_says_its_max_batch_changes_the_batch_size() {
        let said = |value: &str| {
            let mut status = tonic::Status::resource_exhausted("requests: too many");
            status
                .metadata_mut()
                .insert(sluice_api::MAX_BATCH_METADATA, value.parse().unwrap());
            node_max_batch(&status)
        };
        assert_eq!(said("10"), Some(10));
        assert_eq!(said("0"), None, "a batch of none is no batch size");
        assert_eq!(said("ten"), None);
        let proxy = tonic::Status::resource_exhausted("quota");
        assert_eq!(node_max_batch(&proxy), None);
    }
}
