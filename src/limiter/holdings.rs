//! Ownership transfer, the holder's side: what this node holds of keys
//! that other nodes own in its view, passed on when they ask.
//!
//! On adopting a view, a node scans its store **once** and sorts every key
//! it holds (owned or as a copy) by the key's owner in the view — the
//! buckets its peers will ask for — and, for keys it still owns, re-queues
//! for replication those whose successor changed (replicas follow the
//! ring). A newer view abandons the scan.
//!
//! A peer's request is answered only once this node's ring is the peer's
//! (the two agree who owns what; otherwise "not yet", and gossip is nudged
//! towards the peer): then each key of the peer's bucket is folded (tiered
//! promises become consumption), marked a copy and snapshotted in one lock
//! step, and sent — so nothing this node decides afterwards is lost to the
//! merge at the new owner. A key it marked a copy is never decided here
//! again until it is taken back.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::Limiter;
use super::transfer::{PAGE_BYTES, PAGE_ITEMS};
use crate::cluster::ring::Ring;
use crate::store::Snapshot;

/// Encoded keys.
pub type Keys = Vec<Arc<[u8]>>;

/// One peer's bucket: the keys this node held for it when it scanned.
#[derive(Debug, Default)]
struct Bucket {
    keys: Vec<Arc<[u8]>>,
    /// Whether each key was this node's own count when first taken (a
    /// page asked again says the same, though the entry is a copy now).
    was_own: Vec<Option<bool>>,
    /// The furthest cursor a page has reached, and whether the last page
    /// (with `done`) was served.
    served: usize,
    done: bool,
}

/// What this node holds for its peers in one view.
#[derive(Debug)]
pub struct Holdings {
    /// This node's number for the view (for logs).
    pub view: u64,
    pub epoch: u64,
    ring: Arc<Ring>,
    previous: Arc<Ring>,
    buckets: Mutex<HashMap<Arc<str>, Bucket>>,
    scanned: watch::Sender<bool>,
    cancel: CancellationToken,
}

/// A page for a peer, in domain terms (the peer service encodes it).
#[derive(Debug, Default)]
pub struct Page {
    /// Encoded key, state, and whether it was sent as a copy.
    pub states: Vec<(Arc<[u8]>, Snapshot, bool)>,
    pub next: u64,
    pub done: bool,
    /// This node's ring is not the asker's (yet), or its scan is not done:
    /// nothing was taken.
    pub mismatch: bool,
}

impl Holdings {
    pub fn new(view: u64, epoch: u64, ring: Arc<Ring>, previous: Arc<Ring>) -> Holdings {
        Holdings {
            view,
            epoch,
            ring,
            previous,
            buckets: Mutex::new(HashMap::new()),
            scanned: watch::channel(false).0,
            cancel: CancellationToken::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Bucket>> {
        self.buckets.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Peers (by node id) whose bucket has not been served to its end.
    pub fn undelivered(&self) -> Vec<Arc<str>> {
        self.lock()
            .iter()
            .filter(|(_, b)| !b.done && !b.keys.is_empty())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Keys still held for each peer from where its pages stopped.
    pub fn remaining(&self) -> Vec<(Arc<str>, Keys)> {
        self.lock()
            .iter()
            .filter(|(_, b)| !b.done)
            .map(|(id, b)| (id.clone(), b.keys[b.served..].to_vec()))
            .filter(|(_, keys)| !keys.is_empty())
            .collect()
    }

    pub fn is_scanned(&self) -> bool {
        *self.scanned.borrow()
    }
}

/// Keys sorted per scan slice before yielding to the runtime.
const SCAN_SLICE: usize = 4_096;

impl Limiter {
    /// Sort the store out for `holdings`' view: one scan, abandoned if a
    /// newer view comes.
    pub(super) async fn scan_holdings(&self, holdings: Arc<Holdings>) {
        // Transfer merges of the previous view still in flight land before
        // the scan (they check for cancellation under the read side).
        drop(self.shared.gate.write().unwrap_or_else(|p| p.into_inner()));
        let me = &self.shared.node_id;
        let keys = self.shared.store.keys();
        let mut buckets: HashMap<Arc<str>, Bucket> = HashMap::new();
        let mut requeue = Vec::new();
        for slice in keys.chunks(SCAN_SLICE) {
            if holdings.cancel.is_cancelled() {
                return;
            }
            for (k, copy) in slice {
                match holdings.ring.owner(k) {
                    Some(o) if o.node_id != *me => {
                        let b = buckets.entry(o.node_id.clone()).or_default();
                        b.keys.push(k.clone());
                        b.was_own.push(None);
                    }
                    Some(_) if !copy => {
                        let now = holdings.ring.successor(k).map(|m| &m.node_id);
                        let before = holdings.previous.successor(k).map(|m| &m.node_id);
                        if now != before {
                            requeue.push(k.clone());
                        }
                    }
                    _ => {}
                }
            }
            tokio::task::yield_now().await;
        }
        let rereplicated = requeue.len() as u64;
        self.shared
            .store
            .requeue(requeue, std::time::Instant::now());
        self.shared
            .metrics
            .cluster
            .rereplicated
            .inc_by(rereplicated);
        let held: usize = buckets.values().map(|b| b.keys.len()).sum();
        *holdings.lock() = buckets;
        holdings.scanned.send_replace(true);
        tracing::debug!(
            view = holdings.view,
            held,
            rereplicated,
            "holdings sorted out"
        );
    }

    /// Wait (at most `wait`) for this node's ring to be `epoch`; nudge
    /// gossip towards `peer` meanwhile, so the two converge in a round trip
    /// rather than a gossip interval.
    pub(super) async fn agree_on(&self, peer: &str, epoch: u64, wait: Duration) -> bool {
        let mut views = self.shared.views.subscribe();
        if views.borrow().0 == epoch {
            return true;
        }
        (self.shared.nudge)(peer);
        let agreed = tokio::time::timeout(wait, views.wait_for(|v| v.0 == epoch)).await;
        matches!(agreed, Ok(Ok(_)))
    }

    /// One page of what this node holds for `peer` in the view whose ring
    /// is `epoch`, from `cursor`.
    pub async fn transfer_page(&self, peer: &str, epoch: u64, cursor: u64, wait: Duration) -> Page {
        let wait = wait.min(Duration::from_secs(2));
        let not_yet = Page {
            next: cursor,
            mismatch: true,
            ..Page::default()
        };
        if !self.agree_on(peer, epoch, wait).await {
            return not_yet;
        }
        let holdings = self.shared.topology.load().holdings.clone();
        if holdings.epoch != epoch {
            return not_yet;
        }
        let mut scanned = holdings.scanned.subscribe();
        if !matches!(
            tokio::time::timeout(wait, scanned.wait_for(|s| *s)).await,
            Ok(Ok(_))
        ) {
            return not_yet;
        }
        // Under the bucket lock: pages to one peer are served one at a time.
        let mut buckets = holdings.lock();
        let Some(b) = buckets.get_mut(peer) else {
            return Page {
                next: 0,
                done: true,
                ..Page::default()
            };
        };
        let start = (cursor as usize).min(b.keys.len());
        let mut page = Page::default();
        let mut bytes = 0;
        let mut i = start;
        while i < b.keys.len() && page.states.len() < PAGE_ITEMS && bytes < PAGE_BYTES {
            let k = &b.keys[i];
            self.fold_promises(k);
            if let Some((snapshot, was_own)) = self.shared.store.take(k) {
                let first = *b.was_own[i].get_or_insert(was_own);
                bytes += snapshot.approx_bytes() + k.len();
                page.states.push((k.clone(), snapshot, !first));
            }
            i += 1;
        }
        page.next = i as u64;
        page.done = i == b.keys.len();
        b.served = b.served.max(i);
        b.done |= page.done;
        self.shared
            .metrics
            .cluster
            .transfer_sent
            .inc_by(page.states.len() as u64);
        page
    }

    /// A new owner pulls these keys (a batch it must decide before its
    /// transfer is done): each folded, marked a copy and snapshotted, as a
    /// page would be. `epoch`: the puller's ring (protocol 3) — answered
    /// only once this node's is the same (None: "mismatch"). Without one
    /// (protocol 2), only keys this node's ring gives the puller are handed
    /// over; for any other this node waits briefly and then refuses the
    /// call (Err), so two owners never count one key apart.
    pub async fn pulled_by(
        &self,
        peer: &str,
        keys: &[Vec<u8>],
        epoch: Option<u64>,
        wait: Duration,
    ) -> Result<Option<Vec<Option<(Snapshot, bool)>>>, String> {
        let wait = wait.min(Duration::from_secs(2));
        match epoch {
            Some(epoch) => {
                if !self.agree_on(peer, epoch, wait).await {
                    return Ok(None);
                }
            }
            None => {
                let theirs = |ring: &Ring| {
                    keys.iter()
                        .all(|k| ring.owner(k).is_some_and(|o| *o.node_id == *peer))
                };
                if !theirs(&self.ring()) {
                    let mut views = self.shared.views.subscribe();
                    let wait = wait.min(Duration::from_millis(200));
                    let _ =
                        tokio::time::timeout(wait, views.wait_for(|_| theirs(&self.ring()))).await;
                    if !theirs(&self.ring()) {
                        return Err("this node's ring gives these keys to another node".into());
                    }
                }
            }
        }
        let taken = keys
            .iter()
            .map(|k| {
                self.fold_promises(k);
                self.shared.store.take(k).map(|(s, was_own)| (s, !was_own))
            })
            .collect();
        Ok(Some(taken))
    }
}
