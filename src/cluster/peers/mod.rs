//! One gRPC client per peer, each with a micro-batcher.
//!
//! Items for a peer queue up (bounded) and leave in batches, one RPC each
//! (see `batcher.rs` for when a batch leaves). Forwards are at most once: an RPC that may have reached the
//! owner is never retried — a failure is reported to every item of the
//! batch, and the edge decides what to do (DESIGN §4). Connections are
//! opened lazily, reused, and dropped when the peer leaves the ring.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};

use super::auth::{BURIED_HEADER, CLOCK_HEADER, MEMBER_HEADER, Secret, TOKEN_HEADER};
use super::breaker::{Allow, Breaker, State as BreakerState};
use super::faults::Faults;
use super::membership::Presence;
use super::ring::{Member, Ring};
use crate::algorithm::Bounds;
use crate::clock::SharedClock;
use crate::metrics::ClusterMetrics;
use crate::proto::PEER_PROTOCOL_VERSION;
use crate::proto::peer as pb;
use crate::proto::peer::peer_client::PeerClient;
use crate::store::key;
use sender::Pass;

mod batcher;
pub mod codec;
mod figures;
mod link;
mod sender;
mod types;

pub use figures::PeerFigures;
pub use types::{
    Forward, ForwardError, Forwarded, Granted, Outgoing, Pulled, Received, ReportOutcome,
    ResetAnswer, SyncKind, TieredAsk, TransferPage,
};

/// How forwards behave.
#[derive(Clone, Debug)]
pub struct ForwardSettings {
    /// The whole forward, queueing included; items carry it as a deadline.
    pub timeout: Duration,
    pub batch_max_items: usize,
    pub batch_wait: Duration,
    /// Items waiting per peer; beyond it a forward fails at once.
    pub queue: usize,
    /// RPCs in flight per peer.
    pub in_flight: usize,
    /// Consecutive failures that open a peer's breaker.
    pub breaker_failures: u32,
    /// How long an open breaker waits before letting a probe through.
    pub breaker_cooldown: Duration,
    /// Mutual TLS to peers (`cluster.tls`); plain HTTP/2 without.
    pub tls: Option<tonic::transport::ClientTlsConfig>,
    /// Validation bounds for states received from peers.
    pub bounds: Bounds,
    /// This node's clock, to read each peer's offset from its answers.
    pub clock: SharedClock,
    /// How channels reach peers: `None` is tonic's own TCP (see
    /// [`crate::net`]).
    pub connector: Option<crate::net::Connector>,
}

/// HTTP/2 pings on each peer connection, and how long one may go
/// unanswered before the connection closes: a connection replaced because
/// it stalled (`link.rs`) may never drain what it holds, and would
/// otherwise wait for TCP to give up (about 15 minutes).
const KEEP_ALIVE: Duration = Duration::from_secs(10);

type Reply = oneshot::Sender<Result<pb::ForwardResult, ForwardError>>;

struct Pending {
    item: pb::ForwardItem,
    reply: Reply,
    /// When the item's budget runs out: its `budget_ns` is recomputed when
    /// its batch leaves (time spent queued is not the owner's to spend),
    /// and an item already out of time is not sent — the edge has fallen
    /// back, and an owner applying it too would count it twice.
    deadline: tokio::time::Instant,
}

/// A peer's client and batcher.
struct Peer {
    addr: String,
    protocol: u32,
    queue: mpsc::Sender<Pending>,
    sender: Sender,
    stop: CancellationToken,
    /// Unbatched forwards (a client's `skip_batching`) are bounded like
    /// batched ones: `slots` admits `queue + in_flight` at once (beyond, a
    /// forward fails at once, as a full queue does) and `in_flight` lets
    /// that many RPCs out — or one 1,000-item call would be 1,000
    /// concurrent RPCs, whose timeouts open the breaker for everyone.
    unbatched_slots: Arc<Semaphore>,
    unbatched_in_flight: Arc<Semaphore>,
}

/// Everything a batch needs to be sent, shared by a peer's tasks.
#[derive(Clone)]
struct Sender {
    node_id: Arc<str>,
    self_id: Arc<str>,
    /// The connection, renewed when calls on it go unanswered.
    link: Arc<link::Link>,
    secret: Secret,
    epoch: Arc<AtomicU64>,
    timeout: Duration,
    metrics: Arc<ClusterMetrics>,
    breaker: Arc<Breaker>,
    faults: Arc<Faults>,
    clock: SharedClock,
    /// A warning about this peer's clock offset is out (and not yet
    /// cleared by the offset falling back under the bound).
    clock_warned: Arc<AtomicBool>,
    /// Cancelled when the peer leaves the ring (its gauges are dropped).
    gone: CancellationToken,
    /// Forward latency and replication lag, for the status page.
    figures: Arc<figures::Figures>,
    /// This node's presence, once membership runs: each call carries its
    /// generation, and a peer's "buried" answer goes to it.
    presence: Arc<OnceLock<Arc<Presence>>>,
    /// How far (ms) this peer's clock is from this node's, as its last
    /// refusal of a token stamped outside its window said: tokens for it
    /// are stamped on its clock (0 until it refuses one).
    token_offset_ms: Arc<AtomicI64>,
    /// The peer protocol it speaks (3 and on: tokens bound to it).
    protocol: u32,
}

/// The set of peer clients; cheap to clone.
#[derive(Clone)]
pub struct Peers {
    inner: Arc<PeersInner>,
}

struct PeersInner {
    self_id: Arc<str>,
    secret: Secret,
    settings: ForwardSettings,
    epoch: Arc<AtomicU64>,
    metrics: Arc<ClusterMetrics>,
    faults: Arc<Faults>,
    /// A std Mutex: held to look up or swap a client, never across an await.
    peers: Mutex<HashMap<Arc<str>, Arc<Peer>>>,
    presence: Arc<OnceLock<Arc<Presence>>>,
    /// Connections opened for silence, all peers together (`link.rs`).
    renewals: Arc<link::Renewals>,
}

impl Peers {
    pub fn new(
        self_id: &str,
        secret: Secret,
        settings: ForwardSettings,
        metrics: Arc<ClusterMetrics>,
        faults: Arc<Faults>,
    ) -> Peers {
        Peers {
            inner: Arc::new(PeersInner {
                self_id: Arc::from(self_id),
                secret,
                settings,
                epoch: Arc::new(AtomicU64::new(0)),
                metrics,
                faults,
                peers: Mutex::new(HashMap::new()),
                presence: Arc::new(OnceLock::new()),
                renewals: Arc::default(),
            }),
        }
    }

    /// Calls carry this node's membership from now on, and a peer's word
    /// that this generation is buried reaches `presence` (membership
    /// starts after the peers exist: the limiter needs both).
    pub fn attach(&self, presence: Arc<Presence>) {
        let _ = self.inner.presence.set(presence);
    }

    pub fn settings(&self) -> &ForwardSettings {
        &self.inner.settings
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Arc<Peer>>> {
        self.inner.peers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The peer protocol `node_id` speaks, per the ring.
    pub fn protocol(&self, node_id: &str) -> Option<u32> {
        self.lock().get(node_id).map(|p| p.protocol)
    }

    /// Follow a new cluster view: clients for new live members (in the
    /// ring, joining or leaving — a leaving node can still be pulled from),
    /// closed for departed ones (or for a member that now listens
    /// elsewhere, or speaks another protocol).
    pub fn follow(&self, ring: &Ring, live: &[Member]) {
        self.inner.epoch.store(ring.epoch(), Ordering::Relaxed);
        let find = |id: &str| live.iter().find(|m| &*m.node_id == id);
        let mut peers = self.lock();
        peers.retain(|id, p| {
            let keep = find(id).is_some_and(|m| m.grpc_addr == p.addr && m.protocol == p.protocol);
            if !keep {
                p.stop.cancel();
                if find(id).is_none() {
                    // Gone: its last offset and breaker state are no
                    // one's any more.
                    self.inner.metrics.forget_peer(id);
                }
            }
            keep
        });
        for m in live {
            if m.node_id == self.inner.self_id || peers.contains_key(&m.node_id) {
                continue;
            }
            match self.spawn(&m.node_id, &m.grpc_addr, m.protocol) {
                Ok(peer) => {
                    peers.insert(m.node_id.clone(), peer);
                }
                Err(e) => {
                    tracing::warn!(peer = %m.node_id, addr = %m.grpc_addr, error = %e, "bad peer address")
                }
            }
        }
    }

    fn spawn(
        &self,
        node_id: &Arc<str>,
        addr: &str,
        protocol: u32,
    ) -> Result<Arc<Peer>, tonic::transport::Error> {
        let settings = &self.inner.settings;
        let scheme = if settings.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let connect_timeout = settings.timeout.max(Duration::from_millis(100));
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))?
            .connect_timeout(connect_timeout)
            .http2_keep_alive_interval(KEEP_ALIVE)
            .keep_alive_timeout(KEEP_ALIVE)
            .keep_alive_while_idle(true)
            .tcp_nodelay(true);
        if let Some(tls) = &settings.tls {
            endpoint = endpoint.tls_config(tls.clone())?;
        }
        let link = Arc::new(link::Link::new(
            endpoint,
            settings.connector.clone(),
            connect_timeout,
            self.inner.renewals.clone(),
        ));
        let (queue, rx) = mpsc::channel(settings.queue.max(1));
        let stop = CancellationToken::new();
        let sender = Sender {
            node_id: node_id.clone(),
            self_id: self.inner.self_id.clone(),
            link,
            secret: self.inner.secret.clone(),
            epoch: self.inner.epoch.clone(),
            timeout: settings.timeout,
            metrics: self.inner.metrics.clone(),
            breaker: Arc::new(Breaker::new(
                settings.breaker_failures,
                settings.breaker_cooldown,
            )),
            faults: self.inner.faults.clone(),
            clock: settings.clock.clone(),
            clock_warned: Arc::new(AtomicBool::new(false)),
            presence: self.inner.presence.clone(),
            gone: stop.clone(),
            figures: Arc::default(),
            token_offset_ms: Arc::default(),
            protocol,
        };
        tokio::spawn(batcher::batch_loop(
            rx,
            sender.clone(),
            settings.clone(),
            stop.clone(),
        ));
        let in_flight = settings.in_flight.max(1);
        Ok(Arc::new(Peer {
            addr: addr.to_string(),
            protocol,
            queue,
            sender,
            stop,
            unbatched_slots: Arc::new(Semaphore::new(settings.queue.max(1) + in_flight)),
            unbatched_in_flight: Arc::new(Semaphore::new(in_flight)),
        }))
    }

    fn peer(&self, node_id: &str) -> Result<Arc<Peer>, ForwardError> {
        self.lock()
            .get(node_id)
            .cloned()
            .ok_or_else(|| ForwardError::UnknownPeer(node_id.to_string()))
    }

    /// Forward one item to `node_id`, batched with others unless
    /// `unbatched`. An open breaker fails at once; a half-open one sends this
    /// item alone, as its probe.
    pub async fn forward(
        &self,
        node_id: &str,
        item: &Forward,
        unbatched: bool,
    ) -> Result<Forwarded, ForwardError> {
        let answer = self
            .forward_wire(node_id, codec::forward_to_wire(item), unbatched)
            .await?;
        codec::forwarded_from_wire(answer).map_err(|(decided, reason)| {
            let peer = node_id.to_string();
            if decided {
                ForwardError::Malformed { peer, reason }
            } else {
                ForwardError::BadAnswer { peer, reason }
            }
        })
    }

    async fn forward_wire(
        &self,
        node_id: &str,
        item: pb::ForwardItem,
        unbatched: bool,
    ) -> Result<pb::ForwardResult, ForwardError> {
        let peer = self.peer(node_id)?;
        match peer.sender.breaker.allow() {
            Allow::No => {
                self.inner.metrics.breaker_rejections.inc();
                return Err(ForwardError::BreakerOpen(node_id.to_string()));
            }
            Allow::Probe => {
                return peer
                    .sender
                    .send(vec![item], true)
                    .await
                    .map(|mut r| r.remove(0));
            }
            Allow::Yes if unbatched => {
                let Ok(_slot) = peer.unbatched_slots.clone().try_acquire_owned() else {
                    self.inner.metrics.forward_error(node_id, "queue_full");
                    return Err(ForwardError::QueueFull(node_id.to_string()));
                };
                let budget = match item.budget_ns {
                    0 => self.inner.settings.timeout,
                    b => Duration::from_nanos(b),
                };
                let queued = tokio::time::Instant::now();
                let permit = tokio::time::timeout(budget, peer.unbatched_in_flight.acquire()).await;
                let Ok(Ok(_permit)) = permit else {
                    return Err(ForwardError::Unreachable {
                        peer: node_id.to_string(),
                        reason: "its budget ran out while queued".into(),
                    });
                };
                // As a batch does: nothing is sent with its budget all but
                // spent (the edge falls back; an owner applying it too
                // would count it twice), nor past a breaker that opened
                // meanwhile.
                let left = budget.saturating_sub(queued.elapsed());
                if left < batcher::LEAST_BUDGET {
                    return Err(ForwardError::Unreachable {
                        peer: node_id.to_string(),
                        reason: "its budget ran out while queued".into(),
                    });
                }
                // Read, not `allow()`: that would take a half-open
                // breaker's probe slot, which only an attempt releases.
                if peer.sender.breaker.state() == BreakerState::Open {
                    self.inner.metrics.breaker_rejections.inc();
                    return Err(ForwardError::BreakerOpen(node_id.to_string()));
                }
                let mut item = item;
                if item.budget_ns != 0 {
                    item.budget_ns = left.as_nanos() as u64;
                }
                return peer
                    .sender
                    .send(vec![item], false)
                    .await
                    .map(|mut r| r.remove(0));
            }
            Allow::Yes => {}
        }
        let (reply, answer) = oneshot::channel();
        let deadline = tokio::time::Instant::now() + Duration::from_nanos(item.budget_ns);
        let pending = Pending {
            item,
            reply,
            deadline,
        };
        peer.queue.try_send(pending).map_err(|_| {
            self.inner.metrics.forward_error(node_id, "queue_full");
            ForwardError::QueueFull(node_id.to_string())
        })?;
        answer.await.unwrap_or_else(|_| {
            Err(ForwardError::Unreachable {
                peer: node_id.to_string(),
                reason: "the peer was removed".into(),
            })
        })
    }

    /// Send lease-consumption reports to `node_id` (the key's owner), through
    /// the same breaker as forwards.
    pub async fn report(
        &self,
        node_id: &str,
        reports: &[crate::lease::Report],
    ) -> Result<Vec<ReportOutcome>, ForwardError> {
        // A report whose key does not decode is not sent (it cannot be
        // absorbed anywhere); it stays Invalid, in its place.
        let items: Vec<_> = reports.iter().map(codec::report_to_wire).collect();
        let sent: Vec<pb::ReportItem> = items.iter().flatten().cloned().collect();
        let mut outcomes = if sent.is_empty() {
            Vec::new().into_iter()
        } else {
            let (peer, probe) = self.admit(node_id)?;
            peer.sender.report(sent, probe).await?.into_iter()
        };
        Ok(items
            .iter()
            .map(|i| match i {
                Some(_) => outcomes
                    .next()
                    .map_or(ReportOutcome::Invalid, |(o, applied)| {
                        codec::outcome_from_wire(o, applied)
                    }),
                None => ReportOutcome::Invalid,
            })
            .collect())
    }

    /// Merge these states at `node_id` (replicas, handoff). Protocol 2.
    /// An open breaker fails the push at once, as a forward: a caller
    /// waits on it (a synchronous key's confirmation, a leave).
    pub async fn push_states(
        &self,
        node_id: &str,
        kind: SyncKind,
        states: Vec<Outgoing>,
    ) -> Result<u32, ForwardError> {
        let (peer, probe) = self.admit(node_id)?;
        let request = self.sync_request(kind, states);
        peer.sender
            .call(request, None, Pass::of(probe), |mut c, r| async move {
                c.sync(r).await
            })
            .await
            .map(|r| r.merged)
    }

    /// [`Self::push_states`] for the replication rounds: past an open
    /// breaker. The breaker keeps requests from spending a deadline each on
    /// a peer that does not answer; a round is background work, and every
    /// moment its push waits is replication lag — what an owner's crash
    /// loses. Held back by the breaker, the lag ran on for up to
    /// `breaker_cooldown` (1 s) after a lossy link had healed (the
    /// simulator's seed 111 of `--mix any`). A push that lands closes the
    /// breaker for requests too; one past an open breaker that fails leaves
    /// it as it was (see [`Pass::PastOpen`]).
    pub async fn push_in_background(
        &self,
        node_id: &str,
        kind: SyncKind,
        states: Vec<Outgoing>,
    ) -> Result<u32, ForwardError> {
        self.sync_past_breaker(node_id, self.sync_request(kind, states))
            .await
    }

    /// Tell `node_id` that it holds every state this node owns and that
    /// the ring `epoch` makes it the replica holder of
    /// (`limiter/caught_up.rs`). Past an open breaker, as a replication
    /// round's push: it is one.
    pub async fn tell_caught_up(&self, node_id: &str, epoch: u64) -> Result<(), ForwardError> {
        let mut request = self.sync_request(SyncKind::Replica, Vec::new());
        request.caught_up_epoch = epoch;
        self.sync_past_breaker(node_id, request).await.map(|_| ())
    }

    async fn sync_past_breaker(
        &self,
        node_id: &str,
        request: pb::SyncRequest,
    ) -> Result<u32, ForwardError> {
        let peer = self.peer(node_id)?;
        let rpc = |mut c: PeerClient<Channel>, r| async move { c.sync(r).await };
        let pass = match peer.sender.breaker.allow() {
            Allow::No => Pass::PastOpen,
            Allow::Probe => Pass::Probe,
            Allow::Yes => Pass::Closed,
        };
        let answer = peer.sender.call(request, None, pass, rpc).await;
        answer.map(|r| r.merged)
    }

    fn sync_request(&self, kind: SyncKind, states: Vec<Outgoing>) -> pb::SyncRequest {
        pb::SyncRequest {
            protocol_version: PEER_PROTOCOL_VERSION,
            from_node: self.inner.self_id.to_string(),
            kind: codec::sync_kind_to_wire(kind) as i32,
            states: states.into_iter().map(|s| s.0).collect(),
            caught_up_epoch: 0,
        }
    }

    /// Take the states `node_id` holds for `keys` (encoded), waiting at
    /// most `wait` for its ring to be `view`'s (protocol 3; None: a
    /// protocol-2 peer, which has no views). A holder answers up to a
    /// page's bytes per call: the rest are asked again, within `wait`.
    pub async fn pull(
        &self,
        node_id: &str,
        keys: &[Vec<u8>],
        view: Option<(u64, u64)>,
        wait: Duration,
    ) -> Result<Pulled, ForwardError> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut states = Vec::with_capacity(keys.len());
        while states.len() < keys.len() {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Err(ForwardError::Unreachable {
                    peer: node_id.to_string(),
                    reason: "deadline exceeded between pull calls".into(),
                });
            }
            match self
                .pull_once(node_id, &keys[states.len()..], view, left)
                .await?
            {
                Pulled::Mismatch => return Ok(Pulled::Mismatch),
                Pulled::States(part) if part.is_empty() => {
                    return Err(ForwardError::Unreachable {
                        peer: node_id.to_string(),
                        reason: "answered no key".into(),
                    });
                }
                Pulled::States(part) => states.extend(part),
            }
        }
        Ok(Pulled::States(states))
    }

    async fn pull_once(
        &self,
        node_id: &str,
        keys: &[Vec<u8>],
        view: Option<(u64, u64)>,
        wait: Duration,
    ) -> Result<Pulled, ForwardError> {
        let (peer, probe) = self.admit(node_id)?;
        let n = keys.len();
        let refs = keys
            .iter()
            .filter_map(|k| {
                let (name, unique_key) = key::decode(k)?;
                Some(pb::KeyRef {
                    name: name.to_string(),
                    unique_key: unique_key.to_string(),
                })
            })
            .collect();
        let (ring_epoch, view) = view.unwrap_or((0, 0));
        // The holder waits a tenth less than the call: its answer has to
        // travel back.
        let holder_wait = wait.saturating_sub(wait / 10);
        let request = pb::PullRequest {
            protocol_version: PEER_PROTOCOL_VERSION,
            from_node: self.inner.self_id.to_string(),
            keys: refs,
            ring_epoch,
            view,
            wait_ns: holder_wait.as_nanos() as u64,
        };
        let response = peer
            .sender
            .call(
                request,
                Some(wait),
                Pass::of(probe),
                |mut c, r| async move { c.pull(r).await },
            )
            .await?;
        if response.mismatch {
            return Ok(Pulled::Mismatch);
        }
        if response.results.len() > n {
            return Err(ForwardError::Unreachable {
                peer: node_id.to_string(),
                reason: format!("answered {} results for {n} keys", response.results.len()),
            });
        }
        let bounds = &self.inner.settings.bounds;
        let states = response
            .results
            .into_iter()
            .map(|r| {
                let state = r.state?;
                match codec::snapshot_from_wire(&state, bounds) {
                    Ok((key, snapshot)) => Some(Received {
                        key,
                        snapshot,
                        copy: state.copy,
                    }),
                    Err(e) => {
                        tracing::warn!(peer = %node_id, error = %e, "pulled an invalid state");
                        None
                    }
                }
            })
            .collect();
        Ok(Pulled::States(states))
    }

    /// One page of what `node_id` holds of this node's keys in this node's
    /// view `(epoch, view)`, from `cursor` in the holder's view
    /// `holder_view`; the holder waits at most `wait` for its ring to be
    /// this one. Protocol 3.
    pub async fn transfer_page(
        &self,
        node_id: &str,
        (epoch, view): (u64, u64),
        cursor: u64,
        holder_view: u64,
        wait: Duration,
    ) -> Result<TransferPage, ForwardError> {
        let (peer, probe) = self.admit(node_id)?;
        let request = pb::TransferRequest {
            protocol_version: PEER_PROTOCOL_VERSION,
            from_node: self.inner.self_id.to_string(),
            ring_epoch: epoch,
            view,
            cursor,
            wait_ns: wait.as_nanos() as u64,
            holder_view,
        };
        // The holder may wait `wait`; the call lasts that and a forward's
        // time besides.
        let timeout = wait + self.inner.settings.timeout;
        let page = peer
            .sender
            .call(
                request,
                Some(timeout),
                Pass::of(probe),
                |mut c, r| async move { c.transfer(r).await },
            )
            .await?;
        let bounds = &self.inner.settings.bounds;
        let mut states = Vec::with_capacity(page.states.len());
        for (i, state) in page.states.iter().enumerate() {
            // All or nothing: a page with a bad state is not taken (the
            // holder's keys stay copies there; asked again, it resends).
            let (key, snapshot) = codec::snapshot_from_wire(state, bounds).map_err(|e| {
                ForwardError::Unreachable {
                    peer: node_id.to_string(),
                    reason: format!("states[{i}]: {e}"),
                }
            })?;
            states.push(Received {
                key,
                snapshot,
                copy: state.copy,
            });
        }
        Ok(TransferPage {
            states,
            next: page.next,
            done: page.done,
            mismatch: page.mismatch,
            holder_view: page.holder_view,
        })
    }

    /// Reset a key at its owner `node_id`. Protocol 3.
    pub async fn reset(
        &self,
        node_id: &str,
        name: &str,
        unique_key: &str,
        budget: Duration,
    ) -> Result<ResetAnswer, ForwardError> {
        let (peer, probe) = self.admit(node_id)?;
        let request = pb::ResetRequest {
            protocol_version: PEER_PROTOCOL_VERSION,
            from_node: self.inner.self_id.to_string(),
            name: name.to_string(),
            unique_key: unique_key.to_string(),
        };
        let r = peer
            .sender
            .call(
                request,
                Some(budget),
                Pass::of(probe),
                |mut c, r| async move { c.reset(r).await },
            )
            .await?;
        Ok(if r.redirect.is_empty() {
            ResetAnswer::Done { existed: r.existed }
        } else {
            ResetAnswer::Redirect(Arc::from(r.redirect.as_str()))
        })
    }

    /// The peer, if its breaker lets a call through, and whether the call
    /// is the half-open breaker's probe.
    fn admit(&self, node_id: &str) -> Result<(Arc<Peer>, bool), ForwardError> {
        let peer = self.peer(node_id)?;
        match peer.sender.breaker.allow() {
            Allow::No => {
                self.inner.metrics.breaker_rejections.inc();
                Err(ForwardError::BreakerOpen(node_id.to_string()))
            }
            Allow::Probe => Ok((peer, true)),
            Allow::Yes => Ok((peer, false)),
        }
    }

    /// Breaker states and figures by peer, for the status page.
    pub fn standing(&self) -> Vec<(Arc<str>, BreakerState, PeerFigures)> {
        self.lock()
            .iter()
            .map(|(id, p)| {
                (
                    id.clone(),
                    p.sender.breaker.state(),
                    p.sender.figures.read(),
                )
            })
            .collect()
    }

    /// A replication round to `node_id` ended (confirmed or not) `lag`
    /// after the oldest change it carried.
    pub fn replicated(&self, node_id: &str, lag: Duration) {
        if let Some(p) = self.lock().get(node_id) {
            p.sender.figures.replicated(lag);
        }
    }
}

impl Drop for PeersInner {
    fn drop(&mut self) {
        if let Ok(peers) = self.peers.lock() {
            for p in peers.values() {
                p.stop.cancel();
            }
        }
    }
}
