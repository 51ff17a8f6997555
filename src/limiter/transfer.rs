//! Ownership transfer, the new owner's side: known to be complete, never
//! guessed by a timer (DESIGN §4).
//!
//! On adopting a view (a new ring) a node asks **every live member** for
//! the keys it now owns that they hold — owned, or as a copy (replicas of
//! idle keys sit at old successors: replication ships only changed keys).
//! Each member answers in pages bounded by items and bytes and ends with
//! `done`. A member answers only once its own ring is the asker's, and
//! marks each key a copy in the same lock step as its snapshot (see
//! `holdings.rs`), so `done` is a barrier: nothing it decides or absorbs
//! afterwards is lost to the new owner.
//!
//! Until `done` has come from every live member, a key the new owner lacks
//! (no entry, or only a copy) is **pulled** before it is decided — all the
//! missing keys of a batch in one `Pull` per member (`owner.rs`). After,
//! a missing key is new and is decided at once, exact, with no RPC.
//!
//! A newer view cancels the requests of the one before. A member that
//! cannot be reached is retried with backoff while the view lasts; meanwhile
//! the keys only it could hold follow `on_owner_unreachable`. A member that
//! leaves the view is no longer waited for (it can answer no more); one
//! suspected but not buried is still a member and still waited for — it
//! may hold counts — until a majority buries it (usually within a second).
//! One lost so, before it said `done`, may have held the only current
//! count of a key this node took in the meantime: those keys are in doubt
//! for the grace (`Limiter::sources_lost`, `doubt.rs`).
//! A protocol-2 member (a rolling upgrade) has no `Transfer`: it never says
//! `done`, and lacking keys are pulled from it for as long as it is live.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use tokio_util::sync::CancellationToken;

use super::doubt::Held;
use super::{Limiter, Topology};
use crate::cluster::peers::Received;
use crate::cluster::ring::Member;
use crate::store::Holding;

/// Where one member stands in this node's transfer for a view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Asked; pages coming (or its ring is not this view's yet).
    Pending,
    /// Sent every key it held for this node, and said so.
    Done,
    /// Its last attempt failed (an error, a deadline, an open breaker);
    /// retried with backoff.
    Unreachable,
    /// Speaks protocol 2: never says `done`; lacking keys are pulled from it.
    Legacy,
}

impl Standing {
    pub fn name(self) -> &'static str {
        match self {
            Standing::Pending => "pending",
            Standing::Done => "done",
            Standing::Unreachable => "unreachable",
            Standing::Legacy => "legacy",
        }
    }
}

/// One member's progress, for status and metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Progress {
    /// The member's generation (a rejoin is another member).
    pub generation: u64,
    pub standing: Standing,
    /// States received from it in this view.
    pub received: u64,
    /// Failed attempts in a row.
    pub failures: u32,
}

/// This node's transfer for one view.
#[derive(Debug)]
pub struct Incoming {
    /// This node's number for the view.
    pub view: u64,
    pub epoch: u64,
    members: Mutex<BTreeMap<Arc<str>, Progress>>,
    complete: AtomicBool,
    received: AtomicU64,
    started: Instant,
    /// When the last member said `done` (for the figures).
    finished: Mutex<Option<Duration>>,
    /// Cancelled by the next view.
    cancel: CancellationToken,
}

impl Incoming {
    /// A transfer from `members` (the live members but this node); with
    /// none, complete at once. Protocol-2 members are `Legacy`.
    pub fn new<'a>(view: u64, epoch: u64, members: impl Iterator<Item = &'a Member>) -> Incoming {
        let members: BTreeMap<Arc<str>, Progress> = members
            .map(|m| {
                let standing = if m.protocol >= 3 {
                    Standing::Pending
                } else {
                    Standing::Legacy
                };
                (
                    m.node_id.clone(),
                    Progress {
                        generation: m.generation,
                        standing,
                        received: 0,
                        failures: 0,
                    },
                )
            })
            .collect();
        let complete = members.is_empty();
        Incoming {
            view,
            epoch,
            members: Mutex::new(members),
            complete: AtomicBool::new(complete),
            received: AtomicU64::new(0),
            started: Instant::now(),
            finished: Mutex::new(complete.then_some(Duration::ZERO)),
            cancel: CancellationToken::new(),
        }
    }

    /// Every live member said `done`: a key this node lacks is new.
    pub fn complete(&self) -> bool {
        self.complete.load(Ordering::Acquire)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Arc<str>, Progress>> {
        self.members.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The members a lacking key must still be pulled from (all but those
    /// done), and whether each speaks protocol 3.
    pub fn sources(&self) -> Vec<(Arc<str>, bool)> {
        self.lock()
            .iter()
            .filter(|(_, p)| p.standing != Standing::Done)
            .map(|(id, p)| (id.clone(), p.standing != Standing::Legacy))
            .collect()
    }

    /// Whether this transfer asks (or asked) `id` at `generation`.
    pub fn asks(&self, id: &str, generation: u64) -> bool {
        self.lock()
            .get(id)
            .is_some_and(|p| p.generation == generation)
    }

    /// The members that have not said `done` yet, by id and generation
    /// (a protocol-2 member never says it: not counted).
    pub fn unfinished(&self) -> Vec<(Arc<str>, u64)> {
        self.lock()
            .iter()
            .filter(|(_, p)| !matches!(p.standing, Standing::Done | Standing::Legacy))
            .map(|(id, p)| (id.clone(), p.generation))
            .collect()
    }

    pub fn progress(&self) -> Vec<(Arc<str>, Progress)> {
        self.lock()
            .iter()
            .map(|(id, p)| (id.clone(), p.clone()))
            .collect()
    }

    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// How long the transfer took, once complete.
    pub fn took(&self) -> Option<Duration> {
        *self.finished.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn started(&self) -> Instant {
        self.started
    }

    /// Whether `node` is still one of the members this transfer waits for.
    pub fn is_member(&self, node: &str) -> bool {
        self.lock().contains_key(node)
    }

    pub fn cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    fn update(&self, node: &str, f: impl FnOnce(&mut Progress)) {
        let mut members = self.lock();
        if let Some(p) = members.get_mut(node) {
            f(p);
        }
        self.recheck(&members);
    }

    fn recheck(&self, members: &BTreeMap<Arc<str>, Progress>) {
        if !self.complete() && members.values().all(|p| p.standing == Standing::Done) {
            *self.finished.lock().unwrap_or_else(|p| p.into_inner()) = Some(self.started.elapsed());
            self.complete.store(true, Ordering::Release);
        }
    }

    /// Members no longer among `holders` (live members that can hold
    /// counts, by node id and generation) are no longer waited for: what
    /// they held is gone with them (their replicas answer for them).
    pub fn prune(&self, holders: &[Member]) {
        let mut members = self.lock();
        members.retain(|id, p| {
            holders
                .iter()
                .any(|m| m.node_id == *id && m.generation == p.generation)
        });
        self.recheck(&members);
    }
}

/// States per page, and the bytes a page may reach (a sliding-window log
/// of 10,000 entries is ~160 KB: a page holds at least one key).
pub const PAGE_ITEMS: usize = 500;
pub const PAGE_BYTES: usize = 1 << 20;

/// How long a holder may wait for its ring to become the asker's before it
/// answers "not yet".
const HOLDER_WAIT: Duration = Duration::from_millis(500);

impl Limiter {
    /// On every view, before the transfer stops waiting for members gone
    /// (`Incoming::prune`): what this node holds current after `old` (its
    /// transfer there settled once every member it could ask said `done` —
    /// a protocol-2 member never does: it is pulled from — and while no
    /// lost source's region is open: one back since may be lost again
    /// before it said `done`, and a ring settled without it says nothing
    /// of what it held); and the members it still waited for
    /// (`unfinished`), no longer among `holders` and not seen leaving
    /// (`leavers.rs` reads those), lost before they said `done`: the keys
    /// this node owns and did not hold current, that they may have held,
    /// are in doubt (`Doubts::sources_lost`) — read against its rings
    /// since, as copies only after a rejoin. A decision must not see the
    /// transfer complete before the doubt is open. Returns what it holds
    /// current in view `number`.
    pub(super) fn sources_lost(
        &self,
        old: &Topology,
        number: u64,
        rejoined: bool,
        unfinished: &[(Arc<str>, u64)],
        holders: &[Member],
    ) -> Held {
        let settles = unfinished.is_empty() && !self.shared.doubts.sources_open();
        let after = || old.held.after(old.ring.clone(), old.ring_since);
        let (current, held) = if rejoined {
            (Held::fresh(number), after().copies_only())
        } else if settles {
            let held = Held::complete(old.ring.clone(), old.ring_since);
            (held.clone(), held)
        } else {
            let held = after();
            (held.clone(), held)
        };
        self.open_sources(&held, unfinished, holders);
        current
    }

    fn open_sources(&self, held: &Held, unfinished: &[(Arc<str>, u64)], holders: &[Member]) {
        let lost: Vec<(Arc<str>, u64)> = unfinished
            .iter()
            .filter(|(id, generation)| {
                !holders
                    .iter()
                    .any(|m| m.node_id == *id && m.generation == *generation)
                    && !self.shared.leavers.noted(id, *generation)
            })
            .cloned()
            .collect();
        if lost.is_empty() {
            return;
        }
        tracing::warn!(
            members = ?lost,
            "members this node's transfer waited for were lost before they handed it their keys: the keys it took since its last complete transfer are in doubt"
        );
        let ended = self
            .shared
            .doubts
            .sources_lost(&lost, held.clone(), self.now());
        self.doubts_ended(ended);
    }

    /// Ask every pending member of `incoming` for this node's keys, page by
    /// page, until each says `done` or the view is replaced.
    pub(super) fn start_transfer(&self, incoming: Arc<Incoming>) {
        for (node, protocol_3) in incoming.sources() {
            if !protocol_3 {
                continue;
            }
            let limiter = self.clone();
            let incoming = incoming.clone();
            tokio::spawn(async move {
                let cancel = incoming.cancel.clone();
                tokio::select! {
                    _ = cancel.cancelled() => {}
                    _ = limiter.transfer_from(&node, &incoming) => {}
                }
            });
        }
    }

    async fn transfer_from(&self, node: &Arc<str>, incoming: &Incoming) {
        let peers = &self.shared.peers;
        let metrics = &self.shared.metrics.cluster;
        let (mut cursor, mut holder_view) = (0u64, 0u64);
        let mut backoff = Duration::from_millis(50);
        // Until it says done — or leaves the live set (nothing more can
        // come from it) or a newer view cancels this task.
        while incoming.is_member(node) {
            let page = peers
                .transfer_page(
                    node,
                    (incoming.epoch, incoming.view),
                    cursor,
                    holder_view,
                    HOLDER_WAIT,
                )
                .await;
            match page {
                Ok(page) if page.mismatch => {
                    // Its ring is not this one yet (gossip still spreading
                    // the change), or it is still sorting its keys out.
                    incoming.update(node, |p| p.standing = Standing::Pending);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Ok(page) => {
                    let n = page.states.len() as u64;
                    if !self.merge_received(incoming, page.states).await {
                        return; // a newer view took over
                    }
                    incoming.received.fetch_add(n, Ordering::Relaxed);
                    metrics.transfer_received.inc_by(n);
                    (cursor, holder_view) = (page.next, page.holder_view);
                    backoff = Duration::from_millis(50);
                    // Done once the holder has heard that its last page
                    // arrived (an empty `done` page answers the ask past it).
                    let acknowledged = page.done && n == 0;
                    incoming.update(node, |p| {
                        p.received += n;
                        p.failures = 0;
                        p.standing = if acknowledged {
                            Standing::Done
                        } else {
                            Standing::Pending
                        };
                    });
                    if acknowledged {
                        if incoming.complete() {
                            tracing::debug!(view = incoming.view, took = ?incoming.took(), received = incoming.received(), "ownership transfer complete");
                            self.transfer_done();
                        }
                        return;
                    }
                }
                Err(e) => {
                    tracing::debug!(peer = %node, error = %e, "transfer page failed; will retry");
                    incoming.update(node, |p| {
                        p.standing = Standing::Unreachable;
                        p.failures += 1;
                    });
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    /// Merge states received for `incoming`'s view: as this node's count
    /// where the holder held it as its own, as copies otherwise. Refused
    /// (false) once a newer view replaced it: this node's holdings for the
    /// newer view are sorted out from one scan of the store, which must not
    /// miss a key merged after it (the `gate`).
    pub(super) async fn merge_received(&self, incoming: &Incoming, states: Vec<Received>) -> bool {
        let _gate = self.shared.gate.read().await;
        if incoming.cancelled() {
            return false;
        }
        let now = self.now();
        for r in states {
            let holding = if r.copy {
                Holding::Copy
            } else {
                Holding::Owned
            };
            self.fenced(incoming.view, |fence| {
                self.shared
                    .store
                    .merge(&r.key, r.snapshot, now, holding, Some(fence))
            });
        }
        true
    }
}

/// The transfer of this node's current view, for `cluster status`.
#[derive(Clone, Debug)]
pub struct TransferStatus {
    pub view: u64,
    pub complete: bool,
    /// Per source member: its progress, and whether it is silent past
    /// `handoff_timeout`.
    pub members: Vec<(Arc<str>, Progress, bool)>,
}

impl Limiter {
    /// Where this node's transfer for its current view stands.
    pub fn transfer_status(&self) -> TransferStatus {
        let t = self.shared.topology.load_full();
        let late = t.incoming.started().elapsed() > self.shared.settings.handoff_timeout;
        TransferStatus {
            view: t.view,
            complete: t.incoming.complete(),
            members: t
                .incoming
                .progress()
                .into_iter()
                .map(|(id, p)| {
                    let stalled =
                        late && matches!(p.standing, Standing::Pending | Standing::Unreachable);
                    (id, p, stalled)
                })
                .collect(),
        }
    }

    /// Publish the transfer's progress in `/metrics` (called on every view
    /// and periodically), and warn about members silent past
    /// `handoff_timeout`.
    pub fn export_transfer(&self) {
        let t = self.shared.topology.load_full();
        let incoming = &t.incoming;
        let m = &self.shared.metrics.cluster;
        m.transfer_view.set(t.view as i64);
        m.transfer_complete.set(i64::from(incoming.complete()));
        let progress = incoming.progress();
        for standing in [
            Standing::Pending,
            Standing::Done,
            Standing::Unreachable,
            Standing::Legacy,
        ] {
            let n = progress
                .iter()
                .filter(|(_, p)| p.standing == standing)
                .count();
            m.transfer_members
                .get_or_create(&vec![("standing", standing.name())])
                .set(n as i64);
        }
        let stalled: Vec<Arc<str>> = self
            .transfer_status()
            .members
            .into_iter()
            .filter(|(_, _, stalled)| *stalled)
            .map(|(id, _, _)| id)
            .collect();
        if !stalled.is_empty() && m.transfer_stalled.get() == 0 {
            tracing::warn!(view = t.view, members = ?stalled, "ownership transfer: members silent past handoff_timeout");
        }
        m.transfer_stalled.set(stalled.len() as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, protocol: u32) -> Member {
        Member {
            node_id: id.into(),
            generation: 1,
            grpc_addr: String::new(),
            protocol,
            ..Member::default()
        }
    }

    #[test]
    fn complete_once_every_live_member_is_done() {
        let members = [member("a", 3), member("b", 3)];
        let t = Incoming::new(1, 9, members.iter());
        assert!(t.is_member("a"));
        assert!(!t.complete());
        assert_eq!(t.sources().len(), 2);
        t.update("a", |p| p.standing = Standing::Done);
        assert!(!t.complete());
        assert_eq!(t.sources(), vec![(Arc::from("b"), true)]);
        // b leaves the live set: nothing more can come from it.
        assert!(t.is_member("b"));
        t.prune(&members[..1]);
        assert!(!t.is_member("b"));
        assert!(t.complete());
        assert!(t.sources().is_empty());
        assert!(t.took().is_some());
    }

    #[test]
    fn a_protocol_2_member_never_completes_it() {
        let members = [member("old", 2)];
        let t = Incoming::new(1, 9, members.iter());
        assert_eq!(t.sources(), vec![(Arc::from("old"), false)]);
        assert!(!t.complete());
        assert!(Incoming::new(2, 9, [].iter()).complete(), "alone: complete");
    }
}
