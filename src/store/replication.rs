//! The replication queue: keys this node changed as their owner, each
//! once, waiting for the replicator to send them to their successor.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::time::Instant;

use super::{Entry, Snapshot, Store};

/// Keys waiting for the replicator, each once, with when it changed; and
/// how many were ever queued and taken — the replicator's progress
/// measure (see [`Store::queue_mark`]).
#[derive(Debug, Default)]
pub(super) struct ChangeQueue {
    keys: std::collections::VecDeque<(Arc<[u8]>, Instant)>,
    queued: u64,
    taken: u64,
    /// The oldest change each failed push returned, with the mark past
    /// which every key it returned was taken again: a key it returned
    /// goes to the queue's back (behind changes made while it was out),
    /// and one queued again meanwhile keeps its newer stamp — reading the
    /// front alone, the lag fell to the newest change while pushes kept
    /// failing (simulator seed 504 of `--mix any`: an owner on a lossy
    /// link reported 34 ms while its holder's copy was 8 s old — and a
    /// crash's loss is bounded by that figure). At most [`MAX_HELD`]: past
    /// it the two newest merge (the older stamp, the later mark: the lag
    /// says too old for a while, never too young).
    held: std::collections::VecDeque<(u64, Instant)>,
}

/// Failed pushes' stamps kept apart at most (see `ChangeQueue::held`).
const MAX_HELD: usize = 64;

impl ChangeQueue {
    /// The oldest change waiting: the front's, or a failed push's.
    fn oldest(&self) -> Option<Instant> {
        let front = self.keys.front().map(|(_, at)| *at);
        let held = self.held.iter().filter(|(mark, _)| self.taken < *mark);
        front.into_iter().chain(held.map(|(_, at)| *at)).min()
    }
}

/// What the replicator takes in one round.
pub struct Changed {
    pub states: Vec<(Arc<[u8]>, Snapshot)>,
    /// When the oldest of them changed.
    pub oldest: Option<Instant>,
}

impl Store {
    /// Record changes from now on for the replicator (a cluster of two or
    /// more); off, nothing is queued.
    pub fn set_replicating(&self, on: bool) {
        self.replicating.store(on, Ordering::Relaxed);
    }

    /// This node changed the key as its owner (a decision, a report, a
    /// reset, a merge it owns): the count here is no longer a copy.
    pub(super) fn changed(&self, key: &[u8], e: &mut Entry) {
        e.counted_here();
        self.changed_at(key, e, None)
    }

    /// Queue `key` once, stamped `at` (default: now, read only if queued).
    /// The queue holds its own copy of the key (the table keeps keys inline).
    pub(super) fn changed_at(&self, key: &[u8], e: &mut Entry, at: Option<Instant>) {
        if self.replicating.load(Ordering::Relaxed) && e.enqueue() {
            let at = at.unwrap_or_else(Instant::now);
            let key = Arc::from(key); // allocated before the queue's lock
            let first = {
                let mut changed = self.changed_lock();
                changed.keys.push_back((key, at));
                changed.queued += 1;
                changed.keys.len() == 1
            };
            if first {
                // Once per empty-to-waiting, not per change: a busy queue
                // is drained by the replicator's rounds without being woken.
                self.queued.notify_one();
            }
        }
    }

    /// Returns once a change waits for the replicator. Race-free with
    /// [`Store::changed_at`]: a change queued after the check below leaves
    /// the `Notify` a permit, so the wait returns at once.
    pub async fn changes_waiting(&self) {
        while self.changed_len() == 0 {
            self.queued.notified().await;
        }
    }

    fn changed_lock(&self) -> std::sync::MutexGuard<'_, ChangeQueue> {
        self.changed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keys changed since last asked, with their snapshots, at most `max`
    /// (the rest stay queued), and when the oldest of them changed: the
    /// replicator's work list.
    pub fn take_changed(&self, max: usize) -> Changed {
        let (keys, oldest): (Vec<Arc<[u8]>>, Option<Instant>) = {
            let mut changed = self.changed_lock();
            let n = changed.keys.len().min(max);
            // Held stamps count for every round until their mark is passed
            // (which round carries their keys is not known: the round says
            // too old, never too young) — the round that passes it too.
            let oldest = changed.oldest();
            changed.taken += n as u64;
            let taken = changed.taken;
            changed.held.retain(|(mark, _)| taken < *mark);
            (changed.keys.drain(..n).map(|(k, _)| k).collect(), oldest)
        };
        let taken = keys
            .into_iter()
            .filter_map(|k| {
                let snap = self.map.with_mut(&k, |e| {
                    e.dequeue();
                    e.snapshot()
                })?;
                Some((k, snap))
            })
            .collect();
        Changed {
            states: taken,
            oldest,
        }
    }

    /// When the oldest change still waiting for the replicator was made.
    pub fn oldest_changed(&self) -> Option<Instant> {
        self.changed_lock().oldest()
    }

    /// Queue keys again (their replica holder did not confirm).
    /// `since`: when their oldest change was made, so the lag keeps counting
    /// from there rather than from the retry — also for a key queued again
    /// meanwhile (see `ChangeQueue::held`).
    pub fn requeue(&self, keys: impl IntoIterator<Item = Arc<[u8]>>, since: Instant) {
        if !self.replicating.load(Ordering::Relaxed) {
            return;
        }
        for k in keys {
            self.map
                .with_mut(&k, |e| self.changed_at(&k, e, Some(since)));
        }
        let mut changed = self.changed_lock();
        let mark = changed.queued;
        if changed.taken >= mark {
            // Nothing waits (nothing was returned, or none of it is held
            // any more): no stamp to keep (a holdings scan requeues an
            // empty list every round).
            return;
        }
        if changed.held.len() >= MAX_HELD
            && let Some((m, at)) = changed.held.pop_back()
            && let Some(last) = changed.held.back_mut()
        {
            *last = (last.0.max(m), last.1.min(at));
        }
        changed.held.push_back((mark, since));
    }

    /// Keys waiting for the replicator.
    pub fn changed_len(&self) -> usize {
        self.changed_lock().keys.len()
    }

    /// How many changes were ever queued: every key waiting now was queued
    /// before this mark. Once [`Store::taken_past`] it, each was taken by
    /// the replicator — a round since then that failed no push sent them
    /// all (a failed push queues its keys again: take a new mark then).
    pub fn queue_mark(&self) -> u64 {
        self.changed_lock().queued
    }

    /// Whether the replicator has taken every change queued before `mark`
    /// (the queue is first in, first out).
    pub fn taken_past(&self, mark: u64) -> bool {
        self.changed_lock().taken >= mark
    }
}
