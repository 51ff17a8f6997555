//! Membership by gossip (chitchat), behind a small handle.
//!
//! Each node publishes its gRPC address, build version, peer protocol
//! version, policy-config hash and lifecycle state (`joining`, `ready`,
//! `leaving`). Members are parsed from those key-values in one place
//! ([`MemberInfo::parse`]), and every change is published as a whole new
//! [`ClusterView`] — live members, the ring over the ready ones, and the
//! cluster size `N` — on a watch channel.
//!
//! Gossip runs on its own thread with its own runtime, so a request path
//! that saturates the main runtime cannot delay heartbeats into a false
//! "dead" verdict.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chitchat::transport::Transport;
use chitchat::{ChitchatConfig, ChitchatHandle, ChitchatId, FailureDetectorConfig, NodeState};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::auth::{AuthTransport, Secret};
use super::ring::{Member, Ring};
use crate::proto::PEER_PROTOCOL_VERSION;

/// Gossip keys.
const GRPC_ADDR: &str = "grpc_addr";
const STATE: &str = "state";
const VERSION: &str = "version";
const PROTOCOL: &str = "protocol";
const POLICY_HASH: &str = "policy_hash";

/// A node's lifecycle state, as gossiped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lifecycle {
    /// Up, not yet deciding: not in the ring.
    Joining,
    /// In the ring.
    Ready,
    /// Announced its departure: out of every ring and of `N` at once.
    Leaving,
}

impl Lifecycle {
    pub fn name(self) -> &'static str {
        match self {
            Lifecycle::Joining => "joining",
            Lifecycle::Ready => "ready",
            Lifecycle::Leaving => "leaving",
        }
    }

    fn parse(s: &str) -> Option<Lifecycle> {
        [Lifecycle::Joining, Lifecycle::Ready, Lifecycle::Leaving]
            .into_iter()
            .find(|l| l.name() == s)
    }
}

/// One live member, parsed from its gossip state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberInfo {
    pub node_id: Arc<str>,
    pub generation: u64,
    pub gossip_addr: SocketAddr,
    pub grpc_addr: String,
    pub state: Lifecycle,
    pub version: String,
    pub protocol: u32,
    pub policy_hash: String,
}

impl MemberInfo {
    /// Parse a member from its gossip key-values; `None` until it has
    /// published the keys a member needs.
    pub fn parse(id: &ChitchatId, state: &NodeState) -> Option<MemberInfo> {
        Some(MemberInfo {
            node_id: id.node_id.clone(),
            generation: id.generation_id,
            gossip_addr: id.gossip_advertise_addr,
            grpc_addr: state.get(GRPC_ADDR)?.to_string(),
            state: Lifecycle::parse(state.get(STATE)?)?,
            version: state.get(VERSION).unwrap_or_default().to_string(),
            protocol: state.get(PROTOCOL)?.parse().ok()?,
            policy_hash: state.get(POLICY_HASH).unwrap_or_default().to_string(),
        })
    }

    /// Ready, and speaking a peer protocol at most one version apart.
    pub fn in_ring(&self) -> bool {
        self.state == Lifecycle::Ready && self.protocol.abs_diff(PEER_PROTOCOL_VERSION) <= 1
    }
}

/// The cluster as one node sees it at one moment.
#[derive(Clone, Debug)]
pub struct ClusterView {
    pub self_id: Arc<str>,
    /// Live members (this node included), by node id.
    pub members: Vec<MemberInfo>,
    /// The ring over the ready members.
    pub ring: Arc<Ring>,
    /// `N`: ready members plus members that died without announcing
    /// `leaving` (remembered for the dead-node grace period), one per node
    /// id. Shares of a limit are sized by it.
    pub size: usize,
}

impl ClusterView {
    /// A one-node view, before gossip has run.
    pub fn alone(self_id: &str) -> ClusterView {
        ClusterView {
            self_id: Arc::from(self_id),
            members: Vec::new(),
            ring: Arc::new(Ring::default()),
            size: 1,
        }
    }

    /// Every live member (ready, joining or leaving) as a peer to call.
    pub fn live(&self) -> Vec<Member> {
        self.members
            .iter()
            .map(|m| Member {
                node_id: m.node_id.clone(),
                generation: m.generation,
                grpc_addr: m.grpc_addr.clone(),
                protocol: m.protocol,
            })
            .collect()
    }

    pub fn member(&self, node_id: &str) -> Option<&MemberInfo> {
        self.members.iter().find(|m| &*m.node_id == node_id)
    }

    /// Build the view from chitchat's state.
    fn from_chitchat(chitchat: &chitchat::Chitchat) -> ClusterView {
        let self_id = chitchat.self_chitchat_id().node_id.clone();
        // One entry per node id: the newest generation (a restart is not two nodes).
        let mut members: BTreeMap<Arc<str>, MemberInfo> = BTreeMap::new();
        for id in chitchat.live_nodes() {
            let Some(m) = chitchat
                .node_state(id)
                .and_then(|s| MemberInfo::parse(id, s))
            else {
                continue;
            };
            match members.get(&m.node_id) {
                Some(old) if old.generation >= m.generation => {}
                _ => {
                    members.insert(m.node_id.clone(), m);
                }
            }
        }
        let ring = Ring::new(members.values().filter(|m| m.in_ring()).map(|m| Member {
            node_id: m.node_id.clone(),
            generation: m.generation,
            grpc_addr: m.grpc_addr.clone(),
            protocol: m.protocol,
        }));
        let mut counted: std::collections::BTreeSet<Arc<str>> = members
            .values()
            .filter(|m| m.state == Lifecycle::Ready)
            .map(|m| m.node_id.clone())
            .collect();
        for id in chitchat.dead_nodes() {
            let left = chitchat
                .node_state(id)
                .and_then(|s| s.get(STATE))
                .is_some_and(|s| s == Lifecycle::Leaving.name());
            // A node id that is live again (restarted) is already counted
            // or deliberately not (joining/leaving).
            if !left && !members.contains_key(&id.node_id) {
                counted.insert(id.node_id.clone());
            }
        }
        ClusterView {
            self_id,
            members: members.into_values().collect(),
            ring: Arc::new(ring),
            size: counted.len().max(1),
        }
    }

    fn same_as(&self, other: &ClusterView) -> bool {
        self.members == other.members && self.size == other.size
    }
}

/// What membership needs to start.
pub struct MembershipConfig {
    pub cluster_id: String,
    pub node_id: String,
    pub generation: u64,
    /// Bound in advance (non-blocking), so port 0 works.
    pub gossip_socket: std::net::UdpSocket,
    /// The address peers gossip to.
    pub gossip_advertise: SocketAddr,
    /// host:port, DNS names allowed (resolved again periodically).
    pub seeds: Vec<String>,
    pub secret: Secret,
    pub gossip_interval: Duration,
    pub phi_threshold: f64,
    /// How long a dead member is remembered (for `N`).
    pub dead_grace: Duration,
    pub grpc_advertise: String,
    pub policy_hash: String,
    /// The peer protocol this node speaks (the previous one, in a mixed-version test).
    pub protocol: u32,
    /// Test hook: gossip links to behave as cut.
    pub faults: Arc<super::faults::Faults>,
}

/// The membership handle: cheap to clone.
#[derive(Clone)]
pub struct Membership {
    inner: Arc<Inner>,
}

struct Inner {
    /// chitchat's state (a tokio Mutex, shared with the gossip thread).
    chitchat: Arc<tokio::sync::Mutex<chitchat::Chitchat>>,
    /// Asks the gossip thread for an immediate round with a member.
    push: tokio::sync::mpsc::Sender<SocketAddr>,
    view: watch::Receiver<Arc<ClusterView>>,
    stop: CancellationToken,
    /// The gossip thread, joined on shutdown. A std Mutex: only touched
    /// there, never across an await.
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// Membership could not start.
#[derive(Debug, thiserror::Error)]
#[error("gossip: {0}")]
pub struct MembershipError(String);

impl Membership {
    /// Join the cluster (or form a one-node cluster with no seeds), as `joining`.
    pub fn start(cfg: MembershipConfig) -> Result<Membership, MembershipError> {
        let id = ChitchatId::new(cfg.node_id.clone(), cfg.generation, cfg.gossip_advertise);
        let listen = cfg
            .gossip_socket
            .local_addr()
            .map_err(|e| MembershipError(e.to_string()))?;
        let chitchat_config = ChitchatConfig {
            chitchat_id: id,
            cluster_id: cfg.cluster_id.clone(),
            gossip_interval: cfg.gossip_interval,
            listen_addr: listen,
            seed_nodes: cfg.seeds.clone(),
            failure_detector_config: FailureDetectorConfig {
                phi_threshold: cfg.phi_threshold,
                initial_interval: cfg.gossip_interval,
                dead_node_grace_period: cfg.dead_grace,
                ..FailureDetectorConfig::default()
            },
            marked_for_deletion_grace_period: Duration::from_secs(3_600),
            catchup_callback: None,
            extra_liveness_predicate: None,
        };
        let initial = vec![
            (GRPC_ADDR.to_string(), cfg.grpc_advertise.clone()),
            (STATE.to_string(), Lifecycle::Joining.name().to_string()),
            (VERSION.to_string(), env!("CARGO_PKG_VERSION").to_string()),
            (PROTOCOL.to_string(), cfg.protocol.to_string()),
            (POLICY_HASH.to_string(), cfg.policy_hash.clone()),
        ];
        let transport = AuthTransport::new(cfg.gossip_socket, cfg.secret, cfg.faults.clone());
        let (view_tx, view_rx) = watch::channel(Arc::new(ClusterView::alone(&cfg.node_id)));
        let stop = CancellationToken::new();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (push_tx, push_rx) = tokio::sync::mpsc::channel(64);
        let thread_stop = stop.clone();
        let refresh = (cfg.gossip_interval / 2).max(Duration::from_millis(20));
        let thread = std::thread::Builder::new()
            .name("sluice-gossip".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let work = Gossip {
                    view_tx,
                    push_rx,
                    refresh,
                    stop: thread_stop,
                };
                rt.block_on(work.run(chitchat_config, initial, transport, ready_tx));
            })
            .map_err(|e| MembershipError(e.to_string()))?;
        let chitchat = ready_rx
            .recv()
            .map_err(|_| MembershipError("the gossip thread stopped".into()))?
            .map_err(MembershipError)?;
        Ok(Membership {
            inner: Arc::new(Inner {
                chitchat,
                push: push_tx,
                view: view_rx,
                stop,
                thread: Mutex::new(Some(thread)),
            }),
        })
    }

    /// The current view.
    pub fn view(&self) -> Arc<ClusterView> {
        self.inner.view.borrow().clone()
    }

    /// A receiver that sees every new view.
    pub fn watch(&self) -> watch::Receiver<Arc<ClusterView>> {
        self.inner.view.clone()
    }

    async fn set(&self, key: &str, value: &str) {
        self.inner
            .chitchat
            .lock()
            .await
            .self_node_state()
            .set(key, value);
    }

    /// Publish a lifecycle state, and push it to every live member at once
    /// rather than waiting for the next gossip round.
    pub async fn set_state(&self, state: Lifecycle) {
        self.set(STATE, state.name()).await;
        let view = self.view();
        for m in view.members.iter().filter(|m| m.node_id != view.self_id) {
            // A full queue already holds pushes that will carry this state.
            let _ = self.inner.push.try_send(m.gossip_addr);
        }
    }

    pub async fn set_policy_hash(&self, hash: &str) {
        self.set(POLICY_HASH, hash).await;
    }

    /// Stop gossiping (peers then see this node die unless it announced
    /// `leaving` first) and join the gossip thread.
    pub fn shutdown(&self) {
        self.inner.stop.cancel();
        let thread = self.inner.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The gossip thread's work: run chitchat, turn its state into views,
/// and push rounds on request.
struct Gossip {
    view_tx: watch::Sender<Arc<ClusterView>>,
    push_rx: tokio::sync::mpsc::Receiver<SocketAddr>,
    refresh: Duration,
    stop: CancellationToken,
}

type Shared = Arc<tokio::sync::Mutex<chitchat::Chitchat>>;

impl Gossip {
    async fn run(
        mut self,
        config: ChitchatConfig,
        initial: Vec<(String, String)>,
        transport: AuthTransport,
        ready: std::sync::mpsc::Sender<Result<Shared, String>>,
    ) {
        let handle: ChitchatHandle =
            match chitchat::spawn_chitchat(config, initial, &transport as &dyn Transport).await {
                Ok(h) => h,
                Err(e) => {
                    let _ = ready.send(Err(e.to_string()));
                    return;
                }
            };
        let chitchat = handle.chitchat();
        let mut live = chitchat.lock().await.live_nodes_watcher();
        let _ = ready.send(Ok(chitchat.clone()));
        let mut tick = tokio::time::interval(self.refresh);
        loop {
            let view = ClusterView::from_chitchat(&*chitchat.lock().await);
            if !view.same_as(&self.view_tx.borrow()) {
                let _ = self.view_tx.send(Arc::new(view));
            }
            tokio::select! {
                _ = self.stop.cancelled() => break,
                _ = tick.tick() => {}
                _ = live.changed() => {}
                Some(addr) = self.push_rx.recv() => {
                    let _ = handle.gossip(addr);
                }
            }
        }
        let _ = handle.shutdown().await;
    }
}
