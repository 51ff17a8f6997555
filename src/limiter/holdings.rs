//! Ownership transfer, the holder's side: what this node holds of keys
//! that other nodes own in its view, passed on when they ask.
//!
//! On adopting a view, a node scans its store **once** and sorts every key
//! it holds (owned or as a copy) by the key's owner in the view — the
//! buckets its peers will ask for — and, for keys it owns, re-queues for
//! replication those whose successor changed (replicas follow the ring) or
//! that it takes over (a copy included). A newer view abandons the scan.
//!
//! A peer's request is answered only once this node's ring is the peer's
//! (the two agree who owns what; otherwise "not yet", and gossip is nudged
//! towards the peer): then each key of the peer's bucket is folded (tiered
//! promises become consumption), marked a copy and snapshotted in one lock
//! step, and sent — so nothing this node decides afterwards is lost to the
//! merge at the new owner. A key it marked a copy is never decided here
//! again until it is taken back.
//!
//! Pages are acknowledged by the next request (asking from a cursor
//! acknowledges what came before it; asking past the end acknowledges the
//! last page), so a leaving node knows what its new owners really received
//! and pushes the rest before it exits.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
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
    keys: Keys,
    /// The asker's view the `was_own` memory belongs to.
    asker_view: u64,
    /// Whether each key was this node's own count when first taken for the
    /// asker's view (a page asked again says the same, though the entry is
    /// a copy now; a newer view of the asker's starts afresh).
    was_own: Vec<Option<bool>>,
    /// Keys acknowledged (the asker asked from past them), and whether the
    /// end was.
    acked: usize,
    done: bool,
}

/// What this node holds for its peers in one view.
#[derive(Debug)]
pub struct Holdings {
    /// This node's number for the view.
    pub view: u64,
    pub epoch: u64,
    ring: Arc<Ring>,
    previous: Arc<Ring>,
    /// Set once, when the scan is done.
    buckets: OnceLock<HashMap<Arc<str>, Mutex<Bucket>>>,
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
    /// The holder's view `next` belongs to.
    pub holder_view: u64,
}

/// What one scan sorted out: the keys each peer owns, and the keys this
/// node owns whose successor changed or that it takes over.
struct Sorted {
    buckets: HashMap<Arc<str>, Keys>,
    requeue: Keys,
}

impl Sorted {
    fn new() -> Sorted {
        Sorted {
            buckets: HashMap::new(),
            requeue: Vec::new(),
        }
    }

    fn add(&mut self, k: &Arc<[u8]>, me: &str, ring: &Ring, previous: &Ring) {
        match ring.owner(k) {
            Some(o) if *o.node_id != *me => {
                self.buckets
                    .entry(o.node_id.clone())
                    .or_default()
                    .push(k.clone());
            }
            Some(_) => {
                let now = ring.successor(k).map(|m| &m.node_id);
                let before = previous.successor(k).map(|m| &m.node_id);
                let owned_before = previous.owner(k).is_some_and(|o| *o.node_id == *me);
                // A key this node takes over is sent on too, even as the
                // copy it holds: until it is decided here again, its new
                // replica holder has nothing of it, and an idle key's count
                // then lived on this node alone — lost with it if it went
                // before the key's next decision (simulator seed 36 of
                // `--mix zones`: a zone lost 2.2 s after another). A copy
                // merges as a copy there, and only ever upwards.
                if now != before || !owned_before {
                    self.requeue.push(k.clone());
                }
            }
            None => {}
        }
    }
}

impl Holdings {
    pub fn new(view: u64, epoch: u64, ring: Arc<Ring>, previous: Arc<Ring>) -> Holdings {
        Holdings {
            view,
            epoch,
            ring,
            previous,
            buckets: OnceLock::new(),
            scanned: watch::channel(false).0,
            cancel: CancellationToken::new(),
        }
    }

    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// The ring a newer view's scan compares with: this view's `ring` if
    /// its scan published, else the one this view compared with — keys
    /// whose replica holder changed in a view whose scan was abandoned
    /// were never queued for their new holder (a cold review: the next
    /// scan compared with the abandoned view, found nothing changed, and
    /// its owner then said it caught up).
    pub fn sorted_from(&self, ring: &Arc<Ring>) -> Arc<Ring> {
        if self.is_scanned() {
            ring.clone()
        } else {
            self.previous.clone()
        }
    }

    fn set(&self, buckets: HashMap<Arc<str>, Keys>) {
        let buckets = buckets
            .into_iter()
            .map(|(peer, keys)| {
                let n = keys.len();
                let bucket = Bucket {
                    keys,
                    was_own: vec![None; n],
                    ..Bucket::default()
                };
                (peer, Mutex::new(bucket))
            })
            .collect();
        if self.buckets.set(buckets).is_ok() {
            self.scanned.send_replace(true);
        }
    }

    /// Peers (by node id) that have not acknowledged their whole bucket
    /// (all of them while the scan is not done).
    pub fn undelivered(&self) -> Option<Vec<Arc<str>>> {
        let buckets = self.buckets.get()?;
        Some(
            buckets
                .iter()
                .filter(|(_, b)| !lock(b).done)
                .map(|(id, _)| id.clone())
                .collect(),
        )
    }

    /// Keys held for each peer from the last it acknowledged; None while the
    /// scan is not done.
    pub fn remaining(&self) -> Option<Vec<(Arc<str>, Keys)>> {
        let buckets = self.buckets.get()?;
        Some(
            buckets
                .iter()
                .filter_map(|(id, b)| {
                    let b = lock(b);
                    let rest = b.keys[b.acked..].to_vec();
                    (!b.done && !rest.is_empty()).then(|| (id.clone(), rest))
                })
                .collect(),
        )
    }

    pub fn is_scanned(&self) -> bool {
        self.buckets.get().is_some()
    }
}

fn lock(b: &Mutex<Bucket>) -> std::sync::MutexGuard<'_, Bucket> {
    b.lock().unwrap_or_else(|p| p.into_inner())
}

/// Keys sorted per scan slice before yielding to the runtime.
const SCAN_SLICE: usize = 4_096;

impl Limiter {
    /// Sort the store out for `holdings`' view: one scan, abandoned if a
    /// newer view comes.
    pub(super) async fn scan_holdings(&self, holdings: Arc<Holdings>) {
        // Transfer merges of the previous view still in flight land before
        // the scan (they check for cancellation under the read side).
        drop(self.shared.gate.write().await);
        let me = self.shared.node_id.clone();
        let keys = self.shared.store.keys();
        let mut sorted = Sorted::new();
        for slice in keys.chunks(SCAN_SLICE) {
            if holdings.cancel.is_cancelled() {
                return;
            }
            for (k, _) in slice {
                sorted.add(k, &me, &holdings.ring, &holdings.previous);
            }
            tokio::task::yield_now().await;
        }
        if holdings.cancel.is_cancelled() {
            return;
        }
        self.publish(&holdings, sorted);
    }

    /// Sort the store out at once, on the caller's thread (a leaving node
    /// whose scan was abandoned or is still running when it must push).
    pub(super) fn scan_now(&self, holdings: &Holdings) {
        let me = self.shared.node_id.clone();
        let mut sorted = Sorted::new();
        for (k, _) in self.shared.store.keys() {
            sorted.add(&k, &me, &holdings.ring, &holdings.previous);
        }
        self.publish(holdings, sorted);
    }

    fn publish(&self, holdings: &Holdings, sorted: Sorted) {
        let rereplicated = sorted.requeue.len() as u64;
        self.shared
            .store
            .requeue(sorted.requeue, tokio::time::Instant::now());
        self.shared
            .metrics
            .cluster
            .rereplicated
            .inc_by(rereplicated);
        let held: usize = sorted.buckets.values().map(Vec::len).sum();
        holdings.set(sorted.buckets);
        self.catch_up_from(holdings.view);
        tracing::debug!(
            view = holdings.view,
            held,
            rereplicated,
            "holdings sorted out"
        );
    }

    /// Wait until `deadline` for this node's ring to be `epoch`; nudge
    /// gossip towards `peer` meanwhile, so the two converge in a round trip
    /// rather than a gossip interval.
    pub(super) async fn agree_on(
        &self,
        peer: &str,
        epoch: u64,
        deadline: tokio::time::Instant,
    ) -> bool {
        let mut views = self.shared.views.subscribe();
        if views.borrow().0 == epoch {
            return true;
        }
        (self.shared.nudge)(peer);
        let agreed = tokio::time::timeout_at(deadline, views.wait_for(|v| v.0 == epoch)).await;
        matches!(agreed, Ok(Ok(_)))
    }

    /// One page of what this node holds for `peer` (in its view `asker`)
    /// in the view whose ring is `epoch`, from `cursor` in this node's view
    /// `holder_view` (0 at first).
    pub async fn transfer_page(
        &self,
        peer: &str,
        epoch: u64,
        asker: u64,
        cursor: u64,
        holder_view: u64,
        wait: Duration,
    ) -> Page {
        // One deadline for both waits: the asker's call outlives it.
        let deadline = tokio::time::Instant::now() + wait.min(Duration::from_secs(2));
        let not_yet = Page {
            next: cursor,
            mismatch: true,
            holder_view,
            ..Page::default()
        };
        if !self.agree_on(peer, epoch, deadline).await {
            return not_yet;
        }
        let holdings = self.shared.topology.load().holdings.clone();
        if holdings.epoch != epoch {
            return not_yet;
        }
        let mut scanned = holdings.scanned.subscribe();
        if !matches!(
            tokio::time::timeout_at(deadline, scanned.wait_for(|s| *s)).await,
            Ok(Ok(_))
        ) {
            return not_yet;
        }
        let Some(bucket) = holdings.buckets.get().and_then(|b| b.get(peer)) else {
            return Page {
                done: true,
                holder_view: holdings.view,
                ..Page::default()
            };
        };
        // Pages to one peer are served one at a time; others in parallel.
        let mut b = lock(bucket);
        if b.asker_view != asker {
            // A newer view of the asker's: what it was told before counts
            // for nothing (its own view may have passed keys on since).
            b.asker_view = asker;
            b.was_own.iter_mut().for_each(|w| *w = None);
        }
        let start = if holder_view == holdings.view {
            (cursor as usize).min(b.keys.len())
        } else {
            // The cursor belongs to another of this node's views: the
            // bucket is a new scan, in another order. From the start.
            0
        };
        b.acked = b.acked.max(start);
        if start == b.keys.len() {
            b.done = true;
            return Page {
                next: start as u64,
                done: true,
                holder_view: holdings.view,
                ..Page::default()
            };
        }
        let mut page = Page {
            holder_view: holdings.view,
            ..Page::default()
        };
        let mut bytes = 0;
        let mut i = start;
        while i < b.keys.len() && page.states.len() < PAGE_ITEMS && bytes < PAGE_BYTES {
            let k = b.keys[i].clone();
            self.fold_promises(&k);
            if let Some((snapshot, was_own)) = self.shared.store.take(&k) {
                let first = *b.was_own[i].get_or_insert(was_own);
                bytes += snapshot.approx_bytes() + k.len();
                page.states.push((k, snapshot, !first));
            }
            i += 1;
        }
        page.next = i as u64;
        page.done = i == b.keys.len();
        self.shared
            .metrics
            .cluster
            .transfer_sent
            .inc_by(page.states.len() as u64);
        page
    }

    /// A new owner pulls these keys (a batch it must decide before its
    /// transfer is done): each folded, marked a copy and snapshotted, as a
    /// page would be, up to a page's bytes (`answered`: how many of `keys`,
    /// from the first, the answer covers). `epoch`: the puller's ring
    /// (protocol 3) — answered only once this node's is the same (None:
    /// "mismatch"), and only for keys that ring gives the puller. Without
    /// one (protocol 2), only keys this node's ring gives the puller are
    /// handed over; for any other this node waits briefly and then refuses
    /// the call (Err), so two owners never count one key apart.
    pub async fn pulled_by(
        &self,
        peer: &str,
        keys: &[Vec<u8>],
        epoch: Option<u64>,
        wait: Duration,
    ) -> Result<Option<Vec<Option<(Snapshot, bool)>>>, String> {
        let deadline = tokio::time::Instant::now() + wait.min(Duration::from_secs(2));
        let theirs = |ring: &Ring, k: &[u8]| ring.owner(k).is_some_and(|o| *o.node_id == *peer);
        match epoch {
            Some(epoch) => {
                if !self.agree_on(peer, epoch, deadline).await {
                    return Ok(None);
                }
            }
            None => {
                let all_theirs = |ring: &Ring| keys.iter().all(|k| theirs(ring, k));
                if !all_theirs(&self.ring()) {
                    let mut views = self.shared.views.subscribe();
                    let wait =
                        deadline.min(tokio::time::Instant::now() + Duration::from_millis(200));
                    let _ =
                        tokio::time::timeout_at(wait, views.wait_for(|_| all_theirs(&self.ring())))
                            .await;
                    if !all_theirs(&self.ring()) {
                        return Err("this node's ring gives these keys to another node".into());
                    }
                }
            }
        }
        let ring = self.ring();
        let mut bytes = 0;
        let mut taken = Vec::with_capacity(keys.len());
        for k in keys {
            if bytes >= PAGE_BYTES {
                break;
            }
            if !theirs(&ring, k) {
                // Not the puller's in the ring both hold: not handed over.
                taken.push(None);
                continue;
            }
            self.fold_promises(k);
            let state = self.shared.store.take(k).map(|(s, was_own)| {
                bytes += s.approx_bytes() + k.len();
                (s, !was_own)
            });
            taken.push(state);
        }
        Ok(Some(taken))
    }
}
