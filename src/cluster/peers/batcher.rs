//! A peer's micro-batcher: items queue up (bounded) and leave in batches,
//! one RPC each, while earlier batches are in flight.

use super::*;

/// A batch does not send an item with less budget than this left.
pub(super) const LEAST_BUDGET: Duration = Duration::from_millis(1);

/// Collect items into batches and send them, a bounded number at a time.
///
/// A batch leaves when it is full; when no RPC to this peer is outstanding
/// (so a lone item at low load pays no wait); when an outstanding RPC
/// completes (items that queued meanwhile leave together: Nagle's rule);
/// or at the latest `batch_wait` after its first item. Under load, batches
/// fill while RPCs are in flight; idle, nothing waits. (A fixed 500 µs wait
/// would cost ~1–2 ms anyway: tokio's timer ticks in milliseconds.)
pub(super) async fn batch_loop(
    mut rx: mpsc::Receiver<Pending>,
    sender: Sender,
    settings: ForwardSettings,
    stop: CancellationToken,
) {
    let in_flight = Arc::new(Semaphore::new(settings.in_flight.max(1)));
    let outstanding = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let done = Arc::new(tokio::sync::Notify::new());
    let max = settings.batch_max_items.max(1);
    loop {
        let first = tokio::select! {
            _ = stop.cancelled() => break,
            first = rx.recv() => match first { Some(p) => p, None => break },
        };
        let mut batch = Vec::with_capacity(max.min(64));
        batch.push(first);
        while batch.len() < max {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        let leave_at = tokio::time::Instant::now() + settings.batch_wait;
        while batch.len() < max && outstanding.load(Ordering::Acquire) > 0 {
            tokio::select! {
                biased;
                next = rx.recv() => match next { Some(p) => batch.push(p), None => break },
                _ = done.notified() => break,
                _ = tokio::time::sleep_until(leave_at) => break,
            }
        }
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            break;
        };
        outstanding.fetch_add(1, Ordering::AcqRel);
        let (sender, outstanding, done) = (sender.clone(), outstanding.clone(), done.clone());
        tokio::spawn(async move {
            let now = tokio::time::Instant::now();
            let (live, late): (Vec<_>, Vec<_>) = batch
                .into_iter()
                // Not sent: an item whose caller has gone (its handler was
                // dropped at the caller's deadline) or whose budget is all
                // but spent — the owner would apply it after the edge fell
                // back or gave up.
                .partition(|p| {
                    !p.reply.is_closed()
                        && (p.item.budget_ns == 0 || p.deadline > now + LEAST_BUDGET)
                });
            for p in late {
                let _ = p.reply.send(Err(ForwardError::Unreachable {
                    peer: sender.node_id.to_string(),
                    reason: "its budget ran out while queued".into(),
                }));
            }
            let (items, replies): (Vec<_>, Vec<_>) = live
                .into_iter()
                .map(|mut p| {
                    if p.item.budget_ns != 0 {
                        p.item.budget_ns =
                            p.deadline.saturating_duration_since(now).as_nanos() as u64;
                    }
                    (p.item, p.reply)
                })
                .unzip();
            if items.is_empty() {
                drop(permit);
                outstanding.fetch_sub(1, Ordering::AcqRel);
                done.notify_one();
                return;
            }
            let outcome = sender.send(items, false).await;
            drop(permit);
            outstanding.fetch_sub(1, Ordering::AcqRel);
            done.notify_one();
            match outcome {
                Ok(results) => {
                    for (reply, r) in replies.into_iter().zip(results) {
                        let _ = reply.send(Ok(r));
                    }
                }
                Err(e) => {
                    for reply in replies {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
            }
        });
    }
    // Pending items get an answer: the peer left.
    rx.close();
    while let Ok(p) = rx.try_recv() {
        let _ = p.reply.send(Err(ForwardError::Unreachable {
            peer: sender.node_id.to_string(),
            reason: "the peer left the ring".into(),
        }));
    }
}
