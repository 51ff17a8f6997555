//! Membership by gossip (chitchat), behind a small handle.
//!
//! Each node publishes its gRPC address, build version, peer protocol
//! version, policy-config hash, lifecycle state (`joining`, `ready`,
//! `leaving`) and the members it saw die. Members are parsed from those
//! key-values in one place ([`view`]), and every change is published as a
//! whole new [`ClusterView`] — live members, the ring over the ready ones,
//! and the cluster size `N` — on a watch channel. [`Presence`] says whether
//! this node may own keys right now (ready, and not away: see
//! [`presence`]); the gossip thread ([`gossip`]) rejoins as a new member
//! after being away.

#[cfg(test)]
mod budget_tests;
pub mod doubts;
mod generations;
mod gossip;
mod hearing;
mod join;
#[cfg(test)]
mod own_stall_tests;
pub mod presence;
mod prune;
pub mod view;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use presence::Presence;
pub use view::{ClusterView, MemberInfo};

pub(crate) use join::join_wait;

use super::auth::{AuthTransport, Secret};
use view::{BORN, DOUBTS, DOUBTS_UNTOLD, GRPC_ADDR, POLICY_HASH, PROTOCOL, STATE, VERSION, ZONE};

/// A node's lifecycle state, as gossiped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Lifecycle {
    /// Up, not yet deciding: not in the ring.
    Joining,
    /// In the ring.
    Ready,
    /// Announced its departure: out of every ring and of `N` at once, still
    /// answering while its new owners take its keys.
    Leaving,
    /// Gone after leaving: it holds nothing more (no one waits for it).
    Left,
}

impl Lifecycle {
    pub fn name(self) -> &'static str {
        match self {
            Lifecycle::Joining => "joining",
            Lifecycle::Ready => "ready",
            Lifecycle::Leaving => "leaving",
            Lifecycle::Left => "left",
        }
    }

    fn parse(s: &str) -> Option<Lifecycle> {
        [
            Lifecycle::Joining,
            Lifecycle::Ready,
            Lifecycle::Leaving,
            Lifecycle::Left,
        ]
        .into_iter()
        .find(|l| l.name() == s)
    }
}

/// What membership needs to start.
pub struct MembershipConfig {
    pub cluster_id: String,
    pub node_id: String,
    pub generation: u64,
    /// Bound in advance, so port 0 works.
    pub gossip_socket: Arc<dyn crate::net::Datagrams>,
    /// The address peers gossip to.
    pub gossip_advertise: SocketAddr,
    /// host:port, DNS names allowed (resolved again periodically).
    pub seeds: Vec<String>,
    /// With seeds: how many nodes, none ready, form a brand-new cluster
    /// (see [`join_wait`]).
    pub bootstrap_expect: usize,
    /// Its failure domain; empty: none (`cluster.zone`).
    pub zone: String,
    pub secret: Secret,
    pub gossip_interval: Duration,
    pub phi_threshold: f64,
    /// How long a dead member is remembered (for `N`).
    pub dead_grace: Duration,
    pub grpc_advertise: String,
    pub policy_hash: String,
    /// The peer protocol this node speaks.
    pub protocol: u32,
    /// Test hook: gossip links to behave as cut.
    pub faults: Arc<super::faults::Faults>,
    /// The node's clock (presence stamps, a rejoin's generation).
    pub clock: crate::clock::SharedClock,
    /// Gossip on a thread of its own, or on the caller's runtime.
    pub threads: crate::threads::Threads,
}

/// How long a node may go without a gossip round before it counts as away:
/// half the failure detector's patience, so a node resuming from a pause
/// stops owning keys before its peers could have moved them. A member is
/// declared dead after `phi_threshold` mean intervals between the
/// heartbeats its peers observe — and with several peers relaying them,
/// that mean is well under the gossip interval (measured: ~0.45 of it with
/// 3 members) — so the patience is taken as `phi × interval × 0.4`, and
/// half of it is `phi × interval / 5`; with a floor of two rounds, so a
/// busy gossip thread is not mistaken for one that was stopped.
pub fn away_after(gossip_interval: Duration, phi_threshold: f64) -> Duration {
    let detection = gossip_interval.mul_f64(phi_threshold.max(1.0) * 0.4);
    (detection / 2).max(gossip_interval * 2)
}

/// The membership handle: cheap to clone.
#[derive(Clone)]
pub struct Membership {
    inner: Arc<Inner>,
}

/// What the handle and the gossip thread share: chitchat's state (replaced
/// on a rejoin) and the key-values this node publishes (so a rejoin
/// publishes the latest). A std Mutex: held to clone or update, never
/// across an await.
#[derive(Default)]
pub(crate) struct Slot {
    chitchat: Option<Arc<tokio::sync::Mutex<chitchat::Chitchat>>>,
    values: BTreeMap<String, String>,
}

struct Inner {
    slot: Arc<Mutex<Slot>>,
    presence: Arc<Presence>,
    /// Asks the gossip thread for an immediate round with a member.
    push: tokio::sync::mpsc::Sender<SocketAddr>,
    /// Asks the gossip thread to publish a view now (this node's own state
    /// changed).
    refresh: Arc<tokio::sync::Notify>,
    view: watch::Receiver<Arc<ClusterView>>,
    /// Set once this node first turns ready (a rejoin then turns it ready
    /// again by itself).
    joined: watch::Sender<bool>,
    gossip_interval: Duration,
    /// None without seeds (a node of its own, ready at once); else
    /// `bootstrap_expect`.
    bootstrap: Option<usize>,
    stop: CancellationToken,
    /// The gossip thread (or task), joined on shutdown. A std Mutex: only
    /// touched there, never across an await.
    thread: Mutex<Option<Running>>,
}

/// Where gossip runs (see [`crate::threads`]).
enum Running {
    Thread(std::thread::JoinHandle<()>),
    Task(tokio::task::JoinHandle<()>),
}

/// Membership could not start.
#[derive(Debug, thiserror::Error)]
#[error("gossip: {0}")]
pub struct MembershipError(String);

impl Membership {
    /// Join the cluster (or form a one-node cluster with no seeds), as `joining`.
    pub async fn start(cfg: MembershipConfig) -> Result<Membership, MembershipError> {
        let listen = cfg
            .gossip_socket
            .local_addr()
            .map_err(|e| MembershipError(e.to_string()))?;
        let values: BTreeMap<String, String> = [
            (GRPC_ADDR, cfg.grpc_advertise.clone()),
            (STATE, Lifecycle::Joining.name().to_string()),
            (VERSION, env!("CARGO_PKG_VERSION").to_string()),
            (PROTOCOL, cfg.protocol.to_string()),
            (POLICY_HASH, cfg.policy_hash.clone()),
            (BORN, cfg.generation.to_string()),
        ]
        .into_iter()
        .chain((!cfg.zone.is_empty()).then(|| (ZONE, cfg.zone.clone())))
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let slot = Arc::new(Mutex::new(Slot {
            chitchat: None,
            values,
        }));
        let away = away_after(cfg.gossip_interval, cfg.phi_threshold);
        let presence = Arc::new(Presence::new(
            away.as_nanos() as u64,
            cfg.generation,
            cfg.clock.clone(),
        ));
        let transport = AuthTransport::new(cfg.gossip_socket, cfg.secret, cfg.faults.clone());
        let (view_tx, view_rx) =
            watch::channel(Arc::new(ClusterView::alone(&cfg.node_id, cfg.generation)));
        let (joined_tx, joined_rx) = watch::channel(false);
        let stop = CancellationToken::new();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let (push_tx, push_rx) = tokio::sync::mpsc::channel(64);
        // How often gossip's state is read into a view when nothing wakes
        // the reading sooner. A peer's new state (ready, leaving) wakes it
        // as it arrives (a key-change listener, `gossip.rs`), and a change
        // of the live set does too; what is left to the tick is what only
        // time changes — this node's presence stamp (`away` must see
        // several rounds, so a busy gossip thread is not taken for a
        // stopped one: eight), a burial's grace. Reading every 25 ms
        // whatever happened was a quarter of an idle node's wakeups.
        let refresh = (away / 8).clamp(Duration::from_millis(5), Duration::from_millis(100));
        let refresh_now = Arc::new(tokio::sync::Notify::new());
        let work = gossip::Gossip {
            refresh_now: refresh_now.clone(),
            settings: gossip::Settings {
                cluster_id: cfg.cluster_id.clone(),
                node_id: cfg.node_id.clone(),
                gossip_advertise: cfg.gossip_advertise,
                listen,
                seeds: cfg.seeds.clone(),
                bootstrap_expect: cfg.bootstrap_expect,
                gossip_interval: cfg.gossip_interval,
                phi_threshold: cfg.phi_threshold,
                dead_grace: cfg.dead_grace,
                clock: cfg.clock.clone(),
            },
            transport,
            slot: slot.clone(),
            presence: presence.clone(),
            view_tx,
            push_rx,
            refresh,
            stop: stop.clone(),
            joined: joined_rx,
            size_floor: None,
            mine: vec![cfg.generation],
        };
        let generation = cfg.generation;
        let running = match cfg.threads {
            crate::threads::Threads::Own => Running::Thread(
                std::thread::Builder::new()
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
                        rt.block_on(work.run(generation, ready_tx));
                    })
                    .map_err(|e| MembershipError(e.to_string()))?,
            ),
            crate::threads::Threads::Inline => {
                Running::Task(tokio::spawn(work.run(generation, ready_tx)))
            }
        };
        ready_rx
            .await
            .map_err(|_| MembershipError("the gossip thread stopped".into()))?
            .map_err(MembershipError)?;
        Ok(Membership {
            inner: Arc::new(Inner {
                slot,
                presence,
                push: push_tx,
                refresh: refresh_now,
                view: view_rx,
                joined: joined_tx,
                gossip_interval: cfg.gossip_interval,
                bootstrap: (!cfg.seeds.is_empty()).then_some(cfg.bootstrap_expect),
                stop,
                thread: Mutex::new(Some(running)),
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

    /// Whether this node may own keys (ready and present), for the limiter
    /// and the readiness probes.
    pub fn presence(&self) -> Arc<Presence> {
        self.inner.presence.clone()
    }

    fn chitchat(&self) -> Option<Arc<tokio::sync::Mutex<chitchat::Chitchat>>> {
        self.inner.slot.lock().ok().and_then(|s| s.chitchat.clone())
    }

    async fn set(&self, key: &str, value: &str) {
        if let Ok(mut slot) = self.inner.slot.lock() {
            slot.values.insert(key.to_string(), value.to_string());
        }
        if let Some(c) = self.chitchat() {
            c.lock().await.self_node_state().set(key, value);
        }
    }

    /// Publish a lifecycle state, and push it to every live member at once
    /// rather than waiting for the next gossip round.
    pub async fn set_state(&self, state: Lifecycle) {
        self.inner.presence.set_lifecycle(state);
        self.set(STATE, state.name()).await;
        self.inner.refresh.notify_one();
        let view = self.view();
        for m in view.members.iter().filter(|m| m.node_id != view.self_id) {
            // A full queue already holds pushes that will carry this state.
            let _ = self.inner.push.try_send(m.gossip_addr);
        }
    }

    /// Turn `ready` — own keys — once it is safe: with seeds, once this
    /// node has reached a ready peer (or enough nodes to form a new
    /// cluster) and its view has held still for a few rounds. Until then
    /// it is `joining` (`NOT_SERVING`, `NOT_READY`), however long that is.
    ///
    /// `stop` cancelled while waiting (the process was told to stop before
    /// it joined): the node stays `joining` — it never turns ready only to
    /// hand its keys straight back.
    pub async fn join(&self, stop: &CancellationToken) {
        let mut views = self.watch();
        let reached = tokio::select! {
            reached = join_wait(&mut views, self.inner.bootstrap, self.inner.gossip_interval) => reached,
            _ = stop.cancelled() => false,
        };
        if reached && self.inner.presence.lifecycle() == Lifecycle::Joining {
            self.set_state(Lifecycle::Ready).await;
            // Own keys from the first call on: wait for this node's view to
            // hold it in the ring (a round of the gossip thread).
            let _ = tokio::time::timeout(
                Duration::from_secs(2),
                views.wait_for(|v| v.ring.member(&v.self_id).is_some()),
            )
            .await;
        }
        let _ = self.inner.joined.send(true);
    }

    /// Gossip with `node_id` now rather than at the next round (two nodes
    /// whose rings differ converge in a round trip).
    pub fn gossip_with(&self, node_id: &str) {
        if let Some(m) = self.view().member(node_id) {
            let _ = self.inner.push.try_send(m.gossip_addr);
        }
    }

    /// Publish this node's open regions of doubt (`doubts.rs`).
    pub async fn set_doubts(&self, regions: &[doubts::PublishedDoubt]) {
        self.set(DOUBTS_UNTOLD, &doubts::encode_untold(regions))
            .await;
        self.set(DOUBTS, &doubts::encode(regions)).await;
    }

    pub async fn set_policy_hash(&self, hash: &str) {
        self.set(POLICY_HASH, hash).await;
    }

    /// The last word of a leaving node: `left` — it holds nothing more, so
    /// no peer waits for it — pushed to every member, with a moment for the
    /// datagrams to go out before gossip stops.
    pub async fn announce_left(&self) {
        self.set_state(Lifecycle::Left).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    /// Stop gossiping (peers then see this node die unless it announced
    /// `leaving` first) and wait for the gossip thread (or task) to end.
    pub async fn shutdown(&self) {
        self.inner.stop.cancel();
        let running = self.inner.thread.lock().ok().and_then(|mut t| t.take());
        match running {
            // Joining a thread blocks: off the runtime's workers.
            Some(Running::Thread(t)) => {
                let _ = tokio::task::spawn_blocking(move || t.join()).await;
            }
            Some(Running::Task(t)) => {
                let _ = t.await;
            }
            None => {}
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
