//! One gRPC client per peer, each with a micro-batcher.
//!
//! Items for a peer queue up (bounded) and leave in batches, one RPC each
//! (see [`batch_loop`] for when a batch leaves). Forwards are at most once: an RPC that may have reached the
//! owner is never retried — a failure is reported to every item of the
//! batch, and the edge decides what to do (DESIGN §4). Connections are
//! opened lazily, reused, and dropped when the peer leaves the ring.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};

use super::auth::{Secret, TOKEN_HEADER};
use super::breaker::{Allow, Breaker, State as BreakerState};
use super::faults::Faults;
use super::ring::{Member, Ring};
use crate::metrics::ClusterMetrics;
use crate::proto::PEER_PROTOCOL_VERSION;
use crate::proto::peer as pb;
use crate::proto::peer::peer_client::PeerClient;

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
}

/// Why a forward produced no answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ForwardError {
    #[error("peer {0} is not in the ring")]
    UnknownPeer(String),
    #[error("queue to peer {0} is full")]
    QueueFull(String),
    #[error("peer {peer} did not answer: {reason}")]
    Unreachable { peer: String, reason: String },
    #[error("the breaker for peer {0} is open")]
    BreakerOpen(String),
}

type Reply = oneshot::Sender<Result<pb::ForwardResult, ForwardError>>;

struct Pending {
    item: pb::ForwardItem,
    reply: Reply,
}

/// A peer's client and batcher.
struct Peer {
    addr: String,
    protocol: u32,
    queue: mpsc::Sender<Pending>,
    sender: Sender,
    stop: CancellationToken,
}

/// Everything a batch needs to be sent, shared by a peer's tasks.
#[derive(Clone)]
struct Sender {
    node_id: Arc<str>,
    self_id: Arc<str>,
    client: PeerClient<Channel>,
    secret: Secret,
    epoch: Arc<AtomicU64>,
    timeout: Duration,
    metrics: Arc<ClusterMetrics>,
    breaker: Arc<Breaker>,
    faults: Arc<Faults>,
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
            }),
        }
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
    pub fn sync(&self, ring: &Ring, live: &[Member]) {
        self.inner.epoch.store(ring.epoch(), Ordering::Relaxed);
        let find = |id: &str| live.iter().find(|m| &*m.node_id == id);
        let mut peers = self.lock();
        peers.retain(|id, p| {
            let keep = find(id).is_some_and(|m| m.grpc_addr == p.addr && m.protocol == p.protocol);
            if !keep {
                p.stop.cancel();
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
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))?
            .connect_timeout(settings.timeout.max(Duration::from_millis(100)))
            .tcp_nodelay(true);
        if let Some(tls) = &settings.tls {
            endpoint = endpoint.tls_config(tls.clone())?;
        }
        let channel = endpoint.connect_lazy();
        let client = PeerClient::new(channel);
        let (queue, rx) = mpsc::channel(settings.queue.max(1));
        let stop = CancellationToken::new();
        let sender = Sender {
            node_id: node_id.clone(),
            self_id: self.inner.self_id.clone(),
            client,
            secret: self.inner.secret.clone(),
            epoch: self.inner.epoch.clone(),
            timeout: settings.timeout,
            metrics: self.inner.metrics.clone(),
            breaker: Arc::new(Breaker::new(
                settings.breaker_failures,
                settings.breaker_cooldown,
            )),
            faults: self.inner.faults.clone(),
        };
        tokio::spawn(batch_loop(
            rx,
            sender.clone(),
            settings.clone(),
            stop.clone(),
        ));
        Ok(Arc::new(Peer {
            addr: addr.to_string(),
            protocol,
            queue,
            sender,
            stop,
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
        item: pb::ForwardItem,
        unbatched: bool,
    ) -> Result<pb::ForwardResult, ForwardError> {
        let peer = self.peer(node_id)?;
        match peer.sender.breaker.allow() {
            Allow::No => {
                self.inner.metrics.breaker_rejections.inc();
                return Err(ForwardError::BreakerOpen(node_id.to_string()));
            }
            Allow::Probe => return peer.sender.send(vec![item]).await.map(|mut r| r.remove(0)),
            Allow::Yes if unbatched => {
                return peer.sender.send(vec![item]).await.map(|mut r| r.remove(0));
            }
            Allow::Yes => {}
        }
        let (reply, answer) = oneshot::channel();
        peer.queue.try_send(Pending { item, reply }).map_err(|_| {
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
        items: Vec<pb::ReportItem>,
    ) -> Result<Vec<i32>, ForwardError> {
        let peer = self.peer(node_id)?;
        if peer.sender.breaker.allow() == Allow::No {
            return Err(ForwardError::BreakerOpen(node_id.to_string()));
        }
        peer.sender.report(items).await
    }

    /// Merge these states at `node_id` (replicas, handoff). Protocol 2.
    pub async fn sync_states(
        &self,
        node_id: &str,
        kind: pb::SyncKind,
        states: Vec<pb::KeyState>,
    ) -> Result<u32, ForwardError> {
        let peer = self.peer(node_id)?;
        if peer.sender.breaker.allow() == Allow::No {
            return Err(ForwardError::BreakerOpen(node_id.to_string()));
        }
        let request = pb::SyncRequest {
            protocol_version: PEER_PROTOCOL_VERSION,
            from_node: self.inner.self_id.to_string(),
            kind: kind as i32,
            states,
        };
        peer.sender
            .call(request, |mut c, r| async move { c.sync(r).await })
            .await
            .map(|r| r.merged)
    }

    /// The states `node_id` holds for `keys`. Protocol 2.
    pub async fn pull(
        &self,
        node_id: &str,
        keys: Vec<pb::KeyRef>,
    ) -> Result<Vec<Option<pb::KeyState>>, ForwardError> {
        let peer = self.peer(node_id)?;
        if peer.sender.breaker.allow() == Allow::No {
            return Err(ForwardError::BreakerOpen(node_id.to_string()));
        }
        let n = keys.len();
        let request = pb::PullRequest {
            protocol_version: PEER_PROTOCOL_VERSION,
            from_node: self.inner.self_id.to_string(),
            keys,
        };
        let response = peer
            .sender
            .call(request, |mut c, r| async move { c.pull(r).await })
            .await?;
        if response.results.len() != n {
            return Err(ForwardError::Unreachable {
                peer: node_id.to_string(),
                reason: format!("answered {} results for {n} keys", response.results.len()),
            });
        }
        Ok(response.results.into_iter().map(|r| r.state).collect())
    }

    /// Breaker states by peer, for metrics and status.
    pub fn breakers(&self) -> Vec<(Arc<str>, BreakerState)> {
        self.lock()
            .iter()
            .map(|(id, p)| (id.clone(), p.sender.breaker.state()))
            .collect()
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

/// Collect items into batches and send them, a bounded number at a time.
///
/// A batch leaves when it is full; when no RPC to this peer is outstanding
/// (so a lone item at low load pays no wait); when an outstanding RPC
/// completes (items that queued meanwhile leave together: Nagle's rule);
/// or at the latest `batch_wait` after its first item. Under load, batches
/// fill while RPCs are in flight; idle, nothing waits. (A fixed 500 µs wait
/// would cost ~1–2 ms anyway: tokio's timer ticks in milliseconds.)
async fn batch_loop(
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
            let (items, replies): (Vec<_>, Vec<_>) =
                batch.into_iter().map(|p| (p.item, p.reply)).unzip();
            let outcome = sender.send(items).await;
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

impl Sender {
    /// The deadline and token of a peer call.
    fn authorize<T>(&self, request: &mut tonic::Request<T>) {
        request.set_timeout(self.timeout);
        if let Some(token) = self.secret.peer_token(&self.self_id)
            && let Ok(value) = token.parse()
        {
            request.metadata_mut().insert(TOKEN_HEADER, value);
        }
    }

    /// A test-injected cut behaves like a network that drops packets: the
    /// call times out.
    async fn cut(&self) -> Option<ForwardError> {
        if !self.faults.grpc_cut(&self.node_id) {
            return None;
        }
        tokio::time::sleep(self.timeout).await;
        Some(ForwardError::Unreachable {
            peer: self.node_id.to_string(),
            reason: "deadline exceeded (cut by a test fault)".into(),
        })
    }

    /// One RPC for `items`; never retried (at most once). Its outcome feeds
    /// the peer's breaker.
    async fn send(
        &self,
        items: Vec<pb::ForwardItem>,
    ) -> Result<Vec<pb::ForwardResult>, ForwardError> {
        let outcome = self.send_once(items).await;
        self.breaker.record(outcome.is_ok());
        self.metrics
            .breaker_state(&self.node_id, self.breaker.state());
        outcome
    }

    /// One authenticated unary call with the peer's deadline, fault hook and
    /// breaker; never retried.
    async fn call<Req, Resp, F, Fut>(&self, request: Req, rpc: F) -> Result<Resp, ForwardError>
    where
        F: FnOnce(PeerClient<Channel>, tonic::Request<Req>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        self.metrics.rpc_attempt(&self.node_id);
        let outcome = match self.cut().await {
            Some(e) => Err(e),
            None => {
                let mut request = tonic::Request::new(request);
                self.authorize(&mut request);
                match tokio::time::timeout(self.timeout, rpc(self.client.clone(), request)).await {
                    Ok(Ok(r)) => Ok(r.into_inner()),
                    Ok(Err(status)) => Err(format!("{}: {}", status.code(), status.message())),
                    Err(_) => Err("deadline exceeded".to_string()),
                }
                .map_err(|reason| ForwardError::Unreachable {
                    peer: self.node_id.to_string(),
                    reason,
                })
            }
        };
        self.breaker.record(outcome.is_ok());
        self.metrics
            .breaker_state(&self.node_id, self.breaker.state());
        outcome
    }

    async fn report(&self, items: Vec<pb::ReportItem>) -> Result<Vec<i32>, ForwardError> {
        let n = items.len();
        let request = pb::ReportRequest {
            protocol_version: PEER_PROTOCOL_VERSION,
            from_node: self.self_id.to_string(),
            items,
        };
        let r = self
            .call(request, |mut c, r| async move { c.report(r).await })
            .await?;
        if r.outcomes.len() != n {
            return Err(ForwardError::Unreachable {
                peer: self.node_id.to_string(),
                reason: "a wrong number of outcomes".into(),
            });
        }
        Ok(r.outcomes)
    }

    async fn send_once(
        &self,
        items: Vec<pb::ForwardItem>,
    ) -> Result<Vec<pb::ForwardResult>, ForwardError> {
        let n = items.len();
        let started = Instant::now();
        self.metrics.rpc_attempt(&self.node_id);
        if let Some(e) = self.cut().await {
            self.metrics.forward_error(&self.node_id, "timeout");
            return Err(e);
        }
        let mut request = tonic::Request::new(pb::ForwardRequest {
            protocol_version: PEER_PROTOCOL_VERSION,
            ring_epoch: self.epoch.load(Ordering::Relaxed),
            from_node: self.self_id.to_string(),
            items,
        });
        self.authorize(&mut request);
        let unreachable = |reason: String| ForwardError::Unreachable {
            peer: self.node_id.to_string(),
            reason,
        };
        let outcome =
            tokio::time::timeout(self.timeout, self.client.clone().forward(request)).await;
        self.metrics.forwarded(n, started.elapsed());
        let response = match outcome {
            Err(_) => {
                self.metrics.forward_error(&self.node_id, "timeout");
                return Err(unreachable("deadline exceeded".into()));
            }
            Ok(Err(status)) => {
                self.metrics.forward_error(&self.node_id, "rpc");
                return Err(unreachable(format!(
                    "{}: {}",
                    status.code(),
                    status.message()
                )));
            }
            Ok(Ok(r)) => r.into_inner(),
        };
        if response.results.len() != n {
            self.metrics.forward_error(&self.node_id, "protocol");
            return Err(unreachable(format!(
                "answered {} results for {n} items",
                response.results.len()
            )));
        }
        Ok(response.results)
    }
}
