//! The node's background tasks: each runs until the node's shutdown token
//! is cancelled, so stopping a node stops them all.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::cluster::membership::view::Tombstone;
use crate::cluster::membership::{ClusterView, Lifecycle, Membership};
use crate::limiter::Limiter;

/// Run `work` every `interval` until cancelled (missed ticks are not
/// bunched up: a slow round delays the next).
pub(super) async fn every<F, Fut>(interval: Duration, token: CancellationToken, mut work: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tick.tick() => work().await,
        }
    }
}

/// Replicate changed keys: a round as soon as a change waits, then one
/// every `interval` while changes keep coming (they batch up meanwhile),
/// until a round finds none. An idle node sleeps until its next change:
/// polling the queue every 20 ms was a third of an idle node's wakeups
/// (each ~35 µs of CPU on a VM), all for nothing.
pub(super) async fn replicate(limiter: Limiter, interval: Duration, token: CancellationToken) {
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = limiter.changes_waiting() => {}
            // A view that moved nothing still owes its members the word
            // that they hold what they should (`limiter/caught_up.rs`).
            _ = limiter.catch_up_owed() => {}
        }
        loop {
            // A round that takes nothing still runs once after a burst: it
            // sets the replication lag back to zero (nothing waits), as the
            // gauge would otherwise keep the burst's last lag while idle —
            // a round that took keys but sent none (no successor any more,
            // a peer too old) sets it from them. Failed sends are queued
            // again and count as changes waiting.
            let took = limiter.replicate(10_000).await;
            tokio::select! {
                _ = token.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
            if took == 0 && limiter.changes_pending() == 0 {
                break;
            }
        }
    }
}

/// A quiet node's report task wakes this many intervals apart (a backstop:
/// new spending wakes it, see below).
const QUIET_INTERVALS: u32 = 10;

/// Send lease and allotment reports every `interval`, or sooner when an
/// allotment runs low — but never more often than a fifth of the interval.
/// A node with nothing to report and nothing held
/// ([`Flushed::quiet`](crate::limiter::Flushed)) waits instead for its first new spending
/// (then reports an interval later, with what follows it, as on the busy
/// pace): ten idle rounds a second were a tenth of an idle node's wakeups.
pub(super) async fn report(limiter: Limiter, interval: Duration, token: CancellationToken) {
    let soon = limiter.report_soon();
    let leases = limiter.leases().clone();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut quiet = false;
    let mut flushed = tokio::time::Instant::now();
    loop {
        if quiet {
            tokio::select! {
                _ = token.cancelled() => return,
                _ = soon.notified() => {}
                _ = tokio::time::sleep(interval * QUIET_INTERVALS) => {}
                // No later than the busy pace would have reported it.
                _ = leases.pending_begun() => tokio::select! {
                    _ = token.cancelled() => return,
                    _ = soon.notified() => {}
                    _ = tokio::time::sleep_until(flushed + interval) => {}
                },
            }
            // The busy pace resumes from this round, not with the ticks
            // missed while quiet.
            tick.reset();
        } else {
            tokio::select! {
                _ = token.cancelled() => return,
                _ = tick.tick() => {}
                _ = soon.notified() => {}
            }
        }
        flushed = tokio::time::Instant::now();
        quiet = limiter.flush_reports().await.quiet;
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tokio::time::sleep(interval / 5) => {}
        }
    }
}

/// Apply every new cluster view: the ring to the limiter (and its peers),
/// the figures to the metrics.
pub(super) async fn follow_ring(
    membership: Membership,
    limiter: Limiter,
    token: CancellationToken,
) {
    let mut views = membership.watch();
    let mut progress = tokio::time::interval(Duration::from_millis(500));
    progress.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The regions of doubt last published, by their losses, and when.
    let mut published: Option<(Vec<Published>, tokio::time::Instant)> = None;
    loop {
        let view: Arc<ClusterView> = views.borrow_and_update().clone();
        limiter.set_view(&view);
        publish_doubts(&membership, &limiter, &mut published).await;
        let m = &limiter.metrics().cluster;
        for state in [Lifecycle::Joining, Lifecycle::Ready, Lifecycle::Leaving] {
            let n = view.members.iter().filter(|x| x.state == state).count();
            m.members
                .get_or_create(&vec![("state", state.name())])
                .set(n as i64);
        }
        m.ring_epoch.set((view.ring.epoch() >> 1) as i64);
        m.size.set(view.size as i64);
        loop {
            tokio::select! {
                _ = token.cancelled() => return,
                changed = views.changed() => if changed.is_err() { return } else { break },
                // The transfer's progress, and regions of doubt opened or
                // ended, between views.
                _ = progress.tick() => {
                    limiter.export_transfer();
                    publish_doubts(&membership, &limiter, &mut published).await;
                }
            }
        }
    }
}

/// Publish this node's open regions of doubt when they changed, so a node
/// that did not see those losses (restarted, new) adopts them; and again
/// every [`REPUBLISH_DOUBTS`] while any is open, so the time left a reader
/// counts from its reading is never older than that.
async fn publish_doubts(
    membership: &Membership,
    limiter: &Limiter,
    published: &mut Option<(Vec<Published>, tokio::time::Instant)>,
) {
    let regions = limiter.published_doubts();
    // A region's losses and untold holders: a change of either is news.
    let losses: Vec<Published> = regions
        .iter()
        .map(|r| (r.gone.clone(), r.untold.clone()))
        .collect();
    let now = tokio::time::Instant::now();
    let due = match published {
        Some((last, at)) => {
            *last != losses || (!losses.is_empty() && now - *at >= REPUBLISH_DOUBTS)
        }
        None => true,
    };
    if due {
        membership.set_doubts(&regions).await;
        *published = Some((losses, now));
    }
}

/// What [`publish_doubts`] compares: a region's losses and untold holders.
type Published = (Vec<Tombstone>, Vec<(Arc<str>, Arc<str>)>);

/// How often open regions of doubt are published again (their time left).
const REPUBLISH_DOUBTS: Duration = Duration::from_secs(2);
