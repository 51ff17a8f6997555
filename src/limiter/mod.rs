//! The `Limiter`: the one handle the services call.
//!
//! It ties the store, the policies, the ring and peers, the leases, the
//! clock and the metrics together. Services convert wire messages to
//! [`Check`]s and [`Verdict`]s back; all the business rules (policy
//! resolution, ownership, forwarding, fallback, shadow mode, counting) live
//! here. Cheap to clone: a handle over `Arc<Shared>`.
//!
//! - [`mod@self`]: the handle, the batch entry point, the view it follows;
//! - `route`: where a key is decided;
//! - `owner`: deciding keys this node owns, for itself or for an edge;
//! - `forward`: sending keys to their owners; `fallback`: deciding without;
//! - `transfer` and `holdings`: ownership moving between nodes on a ring
//!   change (the new owner's side, the holder's side);
//! - `reports`: lease spending, reported by edges and absorbed by owners;
//! - `replicate`: replicas to each key's successor, and a leaving node's
//!   last push;
//! - `tiered`: hot keys on allotments; `envoy`: descriptors; `admin`.

mod admin;
mod caught_up;
mod clients;
mod confirm;
mod doubt;
mod envoy;
mod fallback;
mod forward;
mod holdings;
mod leavers;
mod owner;
mod rates;
mod replicate;
mod reports;
mod resolve;
mod route;
mod status;
mod tiered;
pub mod transfer;
mod types;

pub use envoy::{Descriptor, DescriptorOutcome};
pub use holdings::Page;
pub use owner::ForwardedItem;
pub use replicate::Handoff;
pub use reports::Flushed;
pub use status::NodeStatus;

use std::sync::Arc;

use arc_swap::ArcSwap;

pub use crate::cluster::peers::{Forwarded, ReportOutcome};
/// What the limiter's admin API returns, and the key encoding peers name
/// keys by: the store's types, as the limiter hands them to services.
pub use crate::store::key::encode as encode_key;
pub use crate::store::{TopBy, View};
pub use clients::{Allotted, AppAsk, ClientAck};
pub use tiered::Ask;
pub use types::{
    Absorb, Check, ItemError, LimitRef, Mode, Path, Reason, Replication, Status, Verdict,
};

use crate::algorithm::{self, Decision, Nanos, Spec};
use crate::clock::SharedClock;
use crate::cluster::membership::{ClusterView, Lifecycle, Presence};
use crate::cluster::peers::Peers;
use crate::cluster::ring::Ring;
use crate::lease::Leases;
use crate::metrics::Metrics;
use crate::policy::{OnOwnerUnreachable, Policies};
use crate::store::Store;
use holdings::Holdings;
use transfer::Incoming;

/// Local decisions between yields to the runtime within one batch: ~0.1 ms
/// of work for new keys at the key cap (an eviction each). At 64 (~0.3 ms)
/// a steady one-item caller beside a key flood waited p50 0.8 ms, p99 5–6
/// ms; at 16, p50 0.5 ms, p99 4.4 ms, at the same flood throughput.
const YIELD_EVERY: usize = 16;

/// How the limiter behaves in a cluster.
#[derive(Clone, Debug)]
pub struct ClusterSettings {
    /// Tiered mode: how allotments are sized and kept.
    pub tiered: crate::lease::tiered::Terms,
    /// Tiered mode: keys with allotments (as an edge) and ledgers (as an owner).
    pub tiered_max_keys: usize,
    /// Tiered mode inside apps: what this node passes on to them, and how
    /// long before its own allotment ends theirs must (None: off).
    pub client_allotments: Option<(crate::lease::tiered::Caps, algorithm::Nanos)>,
    /// How long a member may stay silent in an ownership transfer before
    /// it is flagged (`sluice_transfer_stalled_members`).
    pub handoff_timeout: std::time::Duration,
    /// A call's budget when its caller sets no deadline (forwards and pulls
    /// share it).
    pub budget: std::time::Duration,
    /// How long a key whose holders of record are gone stays in doubt
    /// before its best copy is taken (`doubt.rs`).
    pub in_doubt_grace: std::time::Duration,
}

/// Asks gossip for an immediate round with a member (by node id): two
/// nodes whose rings differ converge in a round trip.
pub type Nudge = Arc<dyn Fn(&str) + Send + Sync>;

/// Everything a limiter is built from.
pub struct Parts {
    pub node_id: String,
    pub store: Arc<Store>,
    pub policies: Policies,
    pub clock: SharedClock,
    pub metrics: Arc<Metrics>,
    pub peers: Peers,
    pub leases: Leases,
    /// Whether this node may own keys now (ready, and not away).
    pub presence: Arc<Presence>,
    pub nudge: Nudge,
    pub settings: ClusterSettings,
}

/// What the limiter knows of the cluster, swapped whole on each change.
struct Topology {
    ring: Arc<Ring>,
    /// This node's number for its current view: one more on every ring
    /// change (an epoch alone can repeat). The store's fence.
    view: u64,
    /// The view number this node adopted `ring` in (a view can be new with
    /// the same ring: a holder the transfer never asked). The owners'
    /// words that this node caught up with the ring count from it.
    ring_since: u64,
    /// This node's generation (a rejoin is a new one).
    generation: u64,
    /// `N`, the remembered cluster size that sizes leases.
    size: u64,
    /// Seeing fewer than a majority of `N`: every key on leases.
    minority: bool,
    /// Keys coming to this node in this view.
    incoming: Arc<Incoming>,
    /// Keys this node holds for others in this view.
    holdings: Arc<Holdings>,
    /// Every tombstone this node knows of: peer calls from them are refused.
    buried: Arc<std::collections::BTreeSet<(Arc<str>, u64)>>,
    /// What this process holds current: the last ring whose transfer it
    /// completed and the rings since (`Limiter::sources_lost`).
    held: doubt::Held,
}

impl Topology {
    fn empty(generation: u64) -> Topology {
        let ring = Arc::new(Ring::default());
        Topology {
            holdings: Arc::new(Holdings::new(0, ring.epoch(), ring.clone(), ring.clone())),
            ring,
            view: 0,
            ring_since: 0,
            generation,
            size: 1,
            minority: false,
            incoming: Arc::new(Incoming::new(0, 0, [].iter())),
            buried: Arc::default(),
            held: doubt::Held::fresh(0),
        }
    }
}

#[derive(Clone)]
pub struct Limiter {
    shared: Arc<Shared>,
}

struct Shared {
    node_id: Arc<str>,
    store: Arc<Store>,
    /// Swapped whole on a config reload; read lock-free per request.
    policies: ArcSwap<Policies>,
    /// Envoy descriptor rules, swapped whole on a reload.
    rules: ArcSwap<crate::policy::rules::Rules>,
    clock: SharedClock,
    metrics: Arc<Metrics>,
    topology: ArcSwap<Topology>,
    /// `(ring epoch, view)` as adopted, for holders waiting to agree.
    views: tokio::sync::watch::Sender<(u64, u64)>,
    /// Transfer merges take it shared, a holdings scan exclusively (see
    /// `transfer::merge_received`). A tokio RwLock: the scan waits for the
    /// merges in flight without blocking a runtime thread.
    gate: tokio::sync::RwLock<()>,
    peers: Peers,
    presence: Arc<Presence>,
    nudge: Nudge,
    leases: Leases,
    tiers: tiered::Tiers,
    /// Keys whose holders of record are gone (issue 39).
    doubts: doubt::Doubts,
    /// Which members hold every replica of this node's keys, and which
    /// owners said this node does (`caught_up.rs`).
    catch_up: caught_up::CatchUp,
    /// Members seen leaving and the rings they left (`leavers.rs`).
    leavers: leavers::Leavers,
    settings: ClusterSettings,
    /// Decisions by status and path, sampled once a second (`rates.rs`).
    rates: rates::Rates,
}

/// A check resolved against the policies: what to decide and how to report it.
struct Resolved<'a> {
    check: &'a Check,
    spec: Spec,
    shadow: bool,
    fallback: OnOwnerUnreachable,
    /// A policy's or rule's name; `None`: the check's own (inline).
    label: Option<Arc<str>>,
    /// Tiered mode (hot keys): allotments at the edges.
    tiered: bool,
    /// Synchronous replication: an owner's exact answer waits for the
    /// replica holder's acknowledgement (`confirm.rs`). Never with `tiered`
    /// or `shadow`.
    sync: bool,
}

impl Resolved<'_> {
    /// The name decisions are counted under.
    fn label(&self) -> &str {
        self.label.as_deref().unwrap_or(&self.check.name)
    }
}

impl Limiter {
    pub fn new(parts: Parts) -> Limiter {
        let generation = parts.presence.generation();
        Limiter {
            shared: Arc::new(Shared {
                node_id: Arc::from(parts.node_id.as_str()),
                store: parts.store,
                policies: ArcSwap::from_pointee(parts.policies),
                rules: ArcSwap::from_pointee(crate::policy::rules::Rules::default()),
                clock: parts.clock,
                metrics: parts.metrics,
                topology: ArcSwap::from_pointee(Topology::empty(generation)),
                views: tokio::sync::watch::channel((0, 0)).0,
                gate: tokio::sync::RwLock::new(()),
                peers: parts.peers,
                presence: parts.presence,
                nudge: parts.nudge,
                leases: parts.leases,
                tiers: tiered::Tiers::new(
                    parts.settings.tiered_max_keys,
                    parts.settings.tiered,
                    parts.settings.client_allotments,
                ),
                doubts: doubt::Doubts::new(parts.settings.in_doubt_grace.as_nanos() as u64),
                catch_up: caught_up::CatchUp::default(),
                leavers: leavers::Leavers::default(),
                settings: parts.settings,
                rates: rates::Rates::new(),
            }),
        }
    }

    /// Follow a new cluster view (membership calls this on every change).
    /// A new ring is a new view: decisions routed under the old one are
    /// fenced off, the transfer of this node's new keys starts, and the
    /// store is sorted out for the peers that will ask for theirs.
    pub fn set_view(&self, view: &ClusterView) {
        let old = self.shared.topology.load_full();
        let me = self.shared.node_id.clone();
        // The minority rule counts the ready members this node hears: a
        // suspect keeps its place in the ring until buried, not its vote.
        let ready = view.reachable() as u64;
        let size = view.size as u64;
        let minority = ready * 2 <= size && size > 1;
        let rejoined = view.self_generation != old.generation;
        // Read before the change cancels it: whether this node held what
        // it owned in the ring before (for the regions of doubt).
        let transfer_done = old.incoming.complete();
        // And whom it still waited for (a leaver lost before it said
        // `done` is a crash: `leavers.rs`).
        let unfinished = old.incoming.unfinished();
        let live = view.live();
        self.shared.peers.follow(&view.ring, &live);
        // Who can hold counts this node may now own: members ready or
        // leaving (a joining member is new, or rejoining with copies only)
        // that speak a protocol this node can ask.
        let holders: Vec<_> = view
            .members
            .iter()
            .filter(|m| m.node_id != me && m.state != Lifecycle::Joining && m.in_protocol())
            .map(|m| m.as_member())
            .collect();
        // A holder the transfer never asked starts it again, as a new
        // view: a member told to leave while it was rejoining (paused past
        // failure detection) turns `leaving` without turning ready, so no
        // ring changes — yet it holds copies from before it was away,
        // maybe a key's only current one, and the regions of doubt read it
        // as back (simulator seed 2314 of `--mix any`: the key's owner
        // killed while its holder was paused; the holder, back, told to
        // leave; the new owner answered from an older copy, exact).
        let unasked = holders
            .iter()
            .any(|m| !old.incoming.asks(&m.node_id, m.generation));
        let changed = old.ring.epoch() != view.ring.epoch() || rejoined || old.view == 0 || unasked;
        // The members that can hold counts now, as the regions of doubt
        // read them. Members of the ring before gone from this one — or
        // suspected in it: a suspect keeps its keys (they are unreachable
        // meanwhile) but a region over it opens now, so a node that
        // restarts meanwhile learns it before it could own one of them:
        // their keys' copies here are the truth only when provably
        // current. On every view: suspicions change without the ring.
        let reachable: Vec<doubt::Heard> = view
            .members
            .iter()
            .filter(|m| {
                m.node_id != me && !m.suspected && m.state != Lifecycle::Joining && m.in_protocol()
            })
            .map(|m| doubt::Heard {
                node_id: m.node_id.clone(),
                born: m.born,
                generation: m.generation,
            })
            .collect();
        if rejoined {
            // Back as a new member after being away: what this node holds
            // is a copy now; the counts went where the ring sent them.
            self.shared.store.mark_all_copies();
            self.shared.tiers.forget_ledgers();
        }
        let (number, incoming, holdings) = if changed {
            old.incoming.cancel();
            old.holdings.cancel();
            // Keys this node no longer owns go with what it promised
            // counted (see `fold_promises`).
            self.fold_promises_unless(|k| view.ring.owner(k).is_none_or(|o| o.node_id == me));
            // Allotments are promises of the owner that granted them; a
            // key that moves arrives at its new owner without them. Stop
            // spending them: what was spent is still reported, and the next
            // ask goes to the key's owner now.
            self.shared.tiers.forget_allotments();
            let number = old.view + 1;
            self.shared.store.set_fence(number);
            let incoming = Arc::new(Incoming::new(number, view.ring.epoch(), holders.iter()));
            let holdings = Arc::new(Holdings::new(
                number,
                view.ring.epoch(),
                view.ring.clone(),
                old.holdings.sorted_from(&old.ring),
            ));
            (number, incoming, holdings)
        } else {
            (old.view, old.incoming.clone(), old.holdings.clone())
        };
        // The ring kept as the view changed without it: its words count
        // from when it was adopted.
        let ring_since = if old.ring.epoch() == view.ring.epoch() && !rejoined && old.view > 0 {
            old.ring_since
        } else {
            number
        };
        // Sources and leavers lost before `done` open their regions before
        // the transfer stops waiting for them (`prune`): a decision must not
        // see it complete and the key not yet in doubt. Sources first: a
        // leaver's note is let go once its loss is read.
        let current = self.sources_lost(&old, number, rejoined, &unfinished, &holders);
        self.leavers_lost(
            &old,
            view,
            number,
            &unfinished,
            &holders,
            &reachable,
            rejoined,
        );
        incoming.prune(&holders);
        // A member gone may have been the last the transfer waited for.
        self.transfer_done();
        // A node back as a new member after being away saw the ring
        // change only from outside: its own regions (over its old ring)
        // and that ring cannot say which keys moved meanwhile and whose
        // holders went since. It starts over as a new node does, from the
        // regions its peers publish (adopted below).
        let fresh;
        let previous = if rejoined {
            self.shared.doubts.forget();
            fresh = Arc::new(Ring::new(std::iter::empty()));
            &fresh
        } else {
            &old.ring
        };
        // Held what a member left it there: the transfer for that ring
        // complete, and the member's word that this node caught up with
        // it, said since this node adopted it (the same members make the
        // same epoch again: a word from an earlier stretch of that ring
        // is not about this one). A member of the previous release never
        // says it: its losses are never seen here (doubt on the safe side).
        let catch_up = &self.shared.catch_up;
        let (previous_epoch, since) = (previous.epoch(), old.ring_since);
        let held = |id: &str| transfer_done && catch_up.confirmed_since(id, previous_epoch, since);
        let change = doubt::Change {
            me: &me,
            born: self.shared.presence.born(),
            held: &held,
            previous,
            view: old.ring_since,
            live: &reachable,
        };
        let ended = self.shared.doubts.changed(&change, self.now());
        self.doubts_ended(ended);
        self.adopt_doubts(view, &reachable);
        // Changes are worth queueing while another node could hold them.
        let has_peer = view.ring.members().iter().any(|m| m.node_id != me);
        self.shared.store.set_replicating(has_peer);
        self.shared.topology.store(Arc::new(Topology {
            ring: view.ring.clone(),
            view: number,
            ring_since,
            generation: view.self_generation,
            size,
            minority,
            incoming: incoming.clone(),
            holdings: holdings.clone(),
            buried: view.buried.clone(),
            held: current,
        }));
        self.shared.views.send_replace((view.ring.epoch(), number));
        self.export_transfer();
        if changed {
            // Lease spending goes to the keys' new owners now, not at the
            // next report round: an owner that takes a key over decides on
            // it at once (this node's own forwards and decisions deliver a
            // key's spending first; this is for the keys it does not ask).
            self.shared.tiers.report_soon.notify_one();
            tracing::debug!(
                view = number,
                epoch = %format_args!("{:016x}", view.ring.epoch()),
                members = ready,
                ring = ?view.ring.members().iter().map(|m| (&*m.node_id, m.generation)).collect::<Vec<_>>(),
                "adopted a view"
            );
            self.start_transfer(incoming);
            let limiter = self.clone();
            tokio::spawn(async move { limiter.scan_holdings(holdings).await });
        }
        self.shared
            .metrics
            .cluster
            .minority
            .set(i64::from(minority));
        if minority != old.minority {
            tracing::warn!(
                ready,
                size,
                minority,
                "majority of the cluster {}",
                if minority {
                    "lost: every key on leases"
                } else {
                    "regained"
                }
            );
        }
    }

    /// Wait (at most `within`) until this node has adopted the ring whose
    /// epoch is `epoch`.
    pub async fn adopted(&self, epoch: u64, within: std::time::Duration) -> bool {
        let mut views = self.shared.views.subscribe();
        matches!(
            tokio::time::timeout(within, views.wait_for(|v| v.0 == epoch)).await,
            Ok(Ok(_))
        )
    }

    /// Whether `node_id` is a live member this node knows.
    pub fn is_member(&self, node_id: &str) -> bool {
        self.shared.peers.protocol(node_id).is_some()
    }

    pub fn ring(&self) -> Arc<Ring> {
        self.shared.topology.load().ring.clone()
    }

    pub fn node_id(&self) -> &Arc<str> {
        &self.shared.node_id
    }

    pub fn now(&self) -> Nanos {
        self.shared.clock.now()
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.shared.store
    }

    /// This node's view: its number and the progress of the keys coming to
    /// it (for status and metrics).
    pub fn transfer(&self) -> Arc<Incoming> {
        self.shared.topology.load().incoming.clone()
    }

    /// Whether this node's holdings for its current view have all been
    /// taken by their new owners (a leaving node waits for this).
    pub fn delivered(&self) -> bool {
        let holdings = self.shared.topology.load().holdings.clone();
        holdings.undelivered().is_some_and(|peers| {
            peers.iter().all(|peer| {
                // A protocol-2 peer never asks (its keys are pushed at the
                // end); a peer gone asks no more.
                self.shared.peers.protocol(peer).is_none_or(|p| p < 3)
            })
        })
    }

    /// Notified when reports should go before the next interval (a
    /// tiered allotment runs low).
    pub fn report_soon(&self) -> Arc<tokio::sync::Notify> {
        self.shared.tiers.report_soon.clone()
    }

    pub fn leases(&self) -> &Leases {
        &self.shared.leases
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }

    /// Whether `(node_id, generation)` is among the tombstones this node
    /// knows: a call from it comes from a member the cluster declared dead
    /// (cut off one way, it may not know), and is refused.
    pub fn is_buried(&self, node_id: &str, generation: u64) -> bool {
        self.shared
            .topology
            .load()
            .buried
            .contains(&(Arc::from(node_id), generation))
    }

    pub fn presence(&self) -> &Arc<Presence> {
        &self.shared.presence
    }

    /// Whether this node is leaving (it owns nothing more).
    pub fn leaving(&self) -> bool {
        self.shared.presence.lifecycle() == Lifecycle::Leaving
    }

    /// Replace the named policies (config reload).
    pub fn set_policies(&self, policies: Policies) {
        self.shared.policies.store(Arc::new(policies));
    }

    pub fn policies(&self) -> Arc<Policies> {
        self.shared.policies.load_full()
    }

    /// Decide one check (see [`Limiter::check_batch`]).
    pub async fn check(&self, check: Check) -> Result<Verdict, ItemError> {
        self.check_batch(vec![Ok(check)]).await.remove(0)
    }

    /// Turn a decision into the edge's verdict, counting it here (at the
    /// edge) so that each decision is counted once.
    fn verdict(
        &self,
        r: &Resolved<'_>,
        decision: Decision,
        owner: Arc<str>,
        approximate: bool,
    ) -> Verdict {
        let reason = match decision.reason {
            algorithm::Outcome::WithinLimit => Reason::WithinLimit,
            _ if r.shadow => Reason::Shadow,
            algorithm::Outcome::LimitExceeded => Reason::LimitExceeded,
            algorithm::Outcome::CostExceedsCapacity => Reason::CostExceedsCapacity,
        };
        self.shared.metrics.decisions.count(r.label(), reason);
        Verdict {
            status: reason.status(),
            reason,
            decision,
            approximate,
            owner,
            label: r.label.clone(),
            window: period_ns(&r.spec),
            path: Path::Owner,
        }
    }

    /// Forget idle keys now (the background sweeper calls this).
    pub fn sweep(&self) -> usize {
        let now = self.now();
        self.shared.store.sweep(now)
    }
}

/// A spec's period in ns (a calendar window counts as its nominal length).
pub(crate) fn period_ns(spec: &Spec) -> Nanos {
    match spec.period() {
        algorithm::Period::Duration(d) => d,
        algorithm::Period::Calendar(u) => {
            let (s, e) = u.bounds(0);
            e - s
        }
    }
}
