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
    /// A failed push returned keys that were queued again meanwhile (they
    /// changed while the push was out): their entries keep the newer
    /// stamp, so the oldest change they carry is held here, with the mark
    /// past which every one of them was taken. Without it the lag fell to
    /// the newest change while pushes kept failing (simulator seed 504 of
    /// `--mix any`: an owner on a lossy link reported 34 ms while its
    /// holder's copy was 8 s old — and a crash's loss is bounded by that
    /// figure).
    held: Option<(u64, Instant)>,
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
            changed.taken += n as u64;
            // Held stamps count for every round until the mark is passed
            // (which round carries their keys is not known: the round says
            // too old, never too young).
            let held = changed.held.map(|(_, at)| at);
            if changed.held.is_some_and(|(mark, _)| changed.taken >= mark) {
                changed.held = None;
            }
            let front = changed.keys.front().map(|(_, at)| *at);
            let oldest = front.into_iter().chain(held).min();
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
        let changed = self.changed_lock();
        let front = changed.keys.front().map(|(_, at)| *at);
        let held = changed.held.map(|(_, at)| at);
        front.into_iter().chain(held).min()
    }

    /// Queue keys again (their replica holder did not confirm).
    /// `since`: when their oldest change was made, so the lag keeps counting
    /// from there rather than from the retry — also for a key queued again
    /// meanwhile (see `ChangeQueue::held`).
    pub fn requeue(&self, keys: impl IntoIterator<Item = Arc<[u8]>>, since: Instant) {
        let replicating = self.replicating.load(Ordering::Relaxed);
        for k in keys {
            let waiting = self.map.with_mut(&k, |e| {
                let waiting = e.is_queued();
                self.changed_at(&k, e, Some(since));
                waiting
            });
            if replicating && waiting == Some(true) {
                let mut changed = self.changed_lock();
                let mark = changed.queued;
                changed.held = Some(match changed.held {
                    Some((m, at)) => (m.max(mark), at.min(since)),
                    None => (mark, since),
                });
            }
        }
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
