//! The gossip thread: runs chitchat, turns its state into views, stamps
//! this node's presence every round, and rejoins as a new member when the
//! node was away.
//!
//! Gossip runs on its own thread with its own runtime, so a request path
//! that saturates the main runtime cannot delay heartbeats into a false
//! "dead" verdict.
//!
//! **Rejoining.** A round that finds its previous stamp older than
//! `away_after` (the process or machine was stopped — peers may have
//! declared it dead and moved its keys), or finds this node's own
//! generation in someone's tombstones (declared dead while cut off one
//! way), restarts chitchat under a new generation as `joining`. The new
//! member owns nothing until it turns ready again by the join rule (it saw
//! its peers and its view held still), and the limiter keeps its old
//! entries only as copies: the counts are wherever the ring sent them
//! meanwhile, and come back through the ownership transfer.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chitchat::transport::Transport;
use chitchat::{ChitchatConfig, ChitchatHandle, ChitchatId, FailureDetectorConfig};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::presence::Presence;
use super::view::{Burials, ClusterView, DEAD, Reading, STATE, SUSPECTS, encode_tombstones};
use super::{Lifecycle, Slot, join_wait};
use crate::cluster::auth::AuthTransport;

/// What the thread needs to (re)start chitchat.
pub(super) struct Settings {
    pub cluster_id: String,
    pub node_id: String,
    pub gossip_advertise: SocketAddr,
    pub listen: SocketAddr,
    pub seeds: Vec<String>,
    pub gossip_interval: Duration,
    pub phi_threshold: f64,
    pub dead_grace: Duration,
    /// The node's clock: a rejoin's generation comes from its wall clock.
    pub clock: crate::clock::SharedClock,
}

impl Settings {
    fn chitchat_config(&self, generation: u64, extra_seeds: &[String]) -> ChitchatConfig {
        let mut seeds = self.seeds.clone();
        seeds.extend(
            extra_seeds
                .iter()
                .filter(|s| !self.seeds.contains(s))
                .cloned(),
        );
        ChitchatConfig {
            chitchat_id: ChitchatId::new(self.node_id.clone(), generation, self.gossip_advertise),
            cluster_id: self.cluster_id.clone(),
            gossip_interval: self.gossip_interval,
            listen_addr: self.listen,
            seed_nodes: seeds,
            failure_detector_config: FailureDetectorConfig {
                phi_threshold: self.phi_threshold,
                initial_interval: self.gossip_interval,
                dead_node_grace_period: self.dead_grace,
                ..FailureDetectorConfig::default()
            },
            marked_for_deletion_grace_period: Duration::from_secs(3_600),
            catchup_callback: None,
            extra_liveness_predicate: None,
        }
    }
}

/// The gossip thread's work.
pub(super) struct Gossip {
    pub settings: Settings,
    pub transport: AuthTransport,
    pub slot: Arc<Mutex<Slot>>,
    pub presence: Arc<Presence>,
    pub view_tx: watch::Sender<Arc<ClusterView>>,
    pub push_rx: tokio::sync::mpsc::Receiver<SocketAddr>,
    pub refresh: Duration,
    /// This node's own state changed: publish a view now.
    pub refresh_now: Arc<tokio::sync::Notify>,
    pub stop: CancellationToken,
    /// Set when `Membership::join` first turns this node ready: a rejoin
    /// after that turns it ready again by itself.
    pub joined: watch::Receiver<bool>,
    /// After a rejoin, the cluster size `N` it had (a fresh chitchat knows
    /// no dead members), kept as a floor for `dead_grace`.
    pub size_floor: Option<(usize, tokio::time::Instant)>,
}

impl Gossip {
    async fn spawn(
        &self,
        generation: u64,
        extra_seeds: &[String],
    ) -> anyhow::Result<ChitchatHandle> {
        let config = self.settings.chitchat_config(generation, extra_seeds);
        // What this node publishes (the latest of each key), as `joining`.
        let mut initial = self
            .slot
            .lock()
            .map(|s| s.values.clone())
            .unwrap_or_default();
        // A rejoin is `joining` — unless this node is on its way out.
        let state = match self.presence.lifecycle() {
            Lifecycle::Leaving | Lifecycle::Left => self.presence.lifecycle(),
            _ => Lifecycle::Joining,
        };
        initial.insert(STATE.to_string(), state.name().to_string());
        initial.remove(DEAD);
        initial.remove(SUSPECTS);
        let handle = chitchat::spawn_chitchat(
            config,
            initial.into_iter().collect(),
            &self.transport as &dyn Transport,
        )
        .await?;
        if let Ok(mut slot) = self.slot.lock() {
            slot.chitchat = Some(handle.chitchat());
        }
        Ok(handle)
    }

    pub async fn run(
        mut self,
        generation: u64,
        ready: tokio::sync::oneshot::Sender<Result<(), String>>,
    ) {
        let mut handle = match self.spawn(generation, &[]).await {
            Ok(h) => h,
            Err(e) => {
                let _ = ready.send(Err(e.to_string()));
                return;
            }
        };
        let _ = ready.send(Ok(()));
        let mut burials = Burials::default();
        // Whether this chitchat has yet to gossip the burials (a rejoin's
        // new chitchat starts without them).
        let mut republish = false;
        let mut tick = tokio::time::interval(self.refresh);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let chitchat = handle.chitchat();
            let (mut live, _changes) = {
                let cc = chitchat.lock().await;
                // Any key a member publishes (its state, address, burials)
                // changing — by gossip or by this node — reads a new view
                // now. The listener runs under chitchat's lock: it only
                // wakes this loop. Dropped with this chitchat (a rejoin
                // subscribes its new one).
                let refresh_now = self.refresh_now.clone();
                let changes = cc.subscribe_event("", move |_| refresh_now.notify_one());
                (cc.live_nodes_watcher(), changes)
            };
            let (rejoin, was) = loop {
                let (gap, was) = self.presence.round(self.presence.boot());
                if gap >= self.presence.away_after() {
                    break (format!("away for {:?}", Duration::from_nanos(gap)), was);
                }
                let reading = {
                    let mut cc = chitchat.lock().await;
                    let size = self.view_tx.borrow().size;
                    if burials.update(&cc, size) || std::mem::take(&mut republish) {
                        let state = cc.self_node_state();
                        state.set(DEAD, encode_tombstones(&burials.published));
                        state.set(SUSPECTS, encode_tombstones(&burials.suspects));
                    }
                    Reading::from_chitchat(&cc, &burials.published)
                };
                // Chitchat's lock is released: a changed ring is built
                // without holding up gossip (see `Reading`).
                let previous = self.view_tx.borrow().clone();
                let mut view = reading.into_view(&previous);
                if let Some((floor, until)) = self.size_floor {
                    if tokio::time::Instant::now() < until {
                        view.size = view.size.max(floor);
                    } else {
                        self.size_floor = None;
                    }
                }
                if view.self_tombstoned {
                    let was = self.presence.lifecycle();
                    if was == Lifecycle::Ready {
                        self.presence.set_lifecycle(Lifecycle::Joining);
                    }
                    break ("declared dead by a peer".to_string(), was);
                }
                if !view.same_as(&self.view_tx.borrow()) {
                    let _ = self.view_tx.send(Arc::new(view));
                }
                tokio::select! {
                    _ = self.stop.cancelled() => {
                        let _ = handle.shutdown().await;
                        return;
                    }
                    _ = tick.tick() => {}
                    _ = live.changed() => {}
                    _ = self.refresh_now.notified() => {}
                    Some(addr) = self.push_rx.recv() => {
                        let _ = handle.gossip(addr);
                    }
                }
            };
            match self.rejoin(handle, &rejoin, was).await {
                Some(h) => {
                    handle = h;
                    burials.forget_seen();
                    // The members this node buried stay buried: a peer
                    // that was cut off learns it from these tombstones and
                    // rejoins (without them it would never know, and this
                    // node would leave it out of the ring for good).
                    republish = true;
                }
                None => return,
            }
        }
    }

    /// Restart chitchat as a new generation, `joining`; turn ready again
    /// by the join rule (in the background) if this node had joined.
    async fn rejoin(
        &mut self,
        handle: ChitchatHandle,
        why: &str,
        was: Lifecycle,
    ) -> Option<ChitchatHandle> {
        let old = self.presence.generation();
        let known: Vec<String> = self
            .view_tx
            .borrow()
            .members
            .iter()
            .filter(|m| m.node_id != self.view_tx.borrow().self_id)
            .map(|m| m.gossip_addr.to_string())
            .collect();
        let _ = handle.shutdown().await;
        let generation = (self.settings.clock.wall() / 1_000_000).max(old + 1);
        tracing::warn!(
            why,
            old_generation = old,
            generation,
            "this node may have been declared dead: rejoining as a new member"
        );
        // Publish the new, empty view at once: the limiter stops owning
        // anything (it sees itself in a minority of the `N` it knew, so
        // every key is on 1/N leases) and keeps its entries as copies.
        self.presence.set_generation(generation);
        let (self_id, size) = {
            let v = self.view_tx.borrow();
            (v.self_id.clone(), v.size)
        };
        self.size_floor = Some((size, tokio::time::Instant::now() + self.settings.dead_grace));
        let mut alone = ClusterView::alone(&self_id, generation);
        alone.size = size;
        let _ = self.view_tx.send(Arc::new(alone));
        self.presence.round(self.presence.boot());
        loop {
            match self.spawn(generation, &known).await {
                Ok(h) => {
                    if was == Lifecycle::Ready || *self.joined.borrow() {
                        let views = self.view_tx.subscribe();
                        let slot = self.slot.clone();
                        let presence = self.presence.clone();
                        let interval = self.settings.gossip_interval;
                        let stop = self.stop.clone();
                        // A node that knew no peer has none to wait for.
                        let has_peers = !known.is_empty();
                        tokio::spawn(async move {
                            tokio::select! {
                                _ = stop.cancelled() => {}
                                _ = turn_ready_again(views, slot, presence, interval, has_peers) => {}
                            }
                        });
                    }
                    return Some(h);
                }
                Err(e) => {
                    tracing::error!(error = %e, "gossip restart failed; retrying");
                    tokio::select! {
                        _ = self.stop.cancelled() => return None,
                        _ = tokio::time::sleep(self.settings.gossip_interval) => {}
                    }
                }
            }
        }
    }
}

async fn turn_ready_again(
    mut views: watch::Receiver<Arc<ClusterView>>,
    slot: Arc<Mutex<Slot>>,
    presence: Arc<Presence>,
    interval: Duration,
    has_peers: bool,
) {
    join_wait(&mut views, has_peers, interval).await;
    let chitchat = slot.lock().ok().and_then(|s| s.chitchat.clone());
    let Some(c) = chitchat else { return };
    let mut c = c.lock().await;
    // Under chitchat's lock: `Membership::set_state` (leaving) sets the
    // presence first and then the gossiped state under this lock, so a
    // leave is never overwritten.
    if presence.advance(Lifecycle::Joining, Lifecycle::Ready) {
        c.self_node_state().set(STATE, Lifecycle::Ready.name());
        tracing::info!("rejoined: ready");
    }
}
