//! The gossip thread: runs chitchat, turns its state into views, stamps
//! this node's presence every round, and rejoins as a new member when the
//! node was away.
//!
//! Gossip runs on its own thread with its own runtime, so a request path
//! that saturates the main runtime cannot delay heartbeats into a false
//! "dead" verdict.
//!
//! **Being slow is not being dead.** A round that finds its previous
//! stamp older than `away_after` (the process or machine was stopped, or
//! starved of CPU — peers may have declared it dead and moved its keys)
//! *fences* the node: it decides nothing as owner, and votes for no
//! burial, until gossip from after its return tells it where it stands —
//! a majority of the cluster (itself included) heard with a heartbeat that
//! moved on past the one read a gossip interval after the return (what
//! queued up while it was away is not news). Then either its own
//! generation is among the tombstones, and it rejoins (below), or it is
//! not, and it owns its keys again as the same member: peers take a
//! member's keys only once it is buried (`view.rs`), so no one decided
//! them meanwhile. The node is fenced too while nearly a majority
//! suspects it (one voice short of a burial): heard by some and not by
//! others (its outbound gossip lost), it stops deciding before anyone
//! may start. And it owns nothing while it has not heard a majority of
//! the cluster (itself included) within one and a half `away_after` —
//! short of the failure detection (twice `away_after`) and the vote its
//! peers need to bury it: a node cut off stops deciding
//! before the others could bury it and take its keys, where its own
//! failure detector (as slow as theirs) would race them.
//!
//! **Rejoining.** A node that finds its own generation in someone's
//! tombstones (declared dead while away or cut off one way) restarts
//! chitchat under a new generation as `joining`. The new member owns
//! nothing until it turns ready again by the join rule (it saw its peers
//! and its view held still), and the limiter keeps its old entries only as
//! copies: the counts are wherever the ring sent them meanwhile, and come
//! back through the ownership transfer.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chitchat::transport::Transport;
use chitchat::{ChitchatConfig, ChitchatHandle, ChitchatId, FailureDetectorConfig};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::hearing::{Hearing, Returning};
use super::presence::Presence;
use super::prune;
use super::view::{BORN, Burials, ClusterView, DEAD, Reading, STATE, SUSPECTS, encode_tombstones};
use super::{Lifecycle, Slot, join_wait};
use crate::cluster::auth::AuthTransport;

/// What the thread needs to (re)start chitchat.
pub(super) struct Settings {
    pub cluster_id: String,
    pub node_id: String,
    pub gossip_advertise: SocketAddr,
    pub listen: SocketAddr,
    pub seeds: Vec<String>,
    /// How many nodes, none ready, form a new cluster (`join_wait`).
    pub bootstrap_expect: usize,
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
                excuse_after: Some(excuse_after(self.gossip_interval, self.phi_threshold)),
                ..FailureDetectorConfig::default()
            },
            marked_for_deletion_grace_period: Duration::from_secs(3_600),
            catchup_callback: None,
            extra_liveness_predicate: None,
        }
    }
}

/// The shortest stall of its own a node excuses its peers' silence for
/// (chitchat patch 7): `away_after` and two rounds. Chitchat and this
/// node's presence stamps run on the same thread, so a stall chitchat sees
/// as this long (its last activity at most a round before the stall
/// began) is one the stamps see as past `away_after`: the node is fenced,
/// votes no burial, and owns nothing until it has heard a majority again
/// — its detector's slower word about the time it was away counts for
/// nothing meanwhile. Shorter stalls are not excused (the node is not
/// sure to be fenced for them): at the defaults, under 800 ms, about what
/// failure detection takes at its fastest.
pub fn excuse_after(gossip_interval: Duration, phi_threshold: f64) -> Duration {
    super::away_after(gossip_interval, phi_threshold) + gossip_interval * 2
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
    /// The generations this process took (its first, then each rejoin's;
    /// the latest [`MINE`]): any other of its id is another process's.
    pub mine: Vec<u64>,
}

/// Generations of its own a process remembers (gossip keeps two per id).
const MINE: usize = 16;

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
        // Back from being away, until gossip says where this node stands.
        let mut returning: Option<Returning> = None;
        let mut hearing = Hearing::default();
        let away = Duration::from_nanos(self.presence.away_after());
        // Heard from no majority this long: cut off. Half again
        // `away_after` — still short of the failure detection (twice
        // `away_after`) and the vote the others need to bury this node,
        // with room for a loaded machine's late rounds.
        let deaf_after = away + away / 2;
        // Hearing no majority (last round): this node suspects no one.
        let mut deaf = false;
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
            let (rejoin, was, past) = loop {
                let gap = self.presence.round(self.presence.boot());
                if gap >= self.presence.away_after() {
                    tracing::warn!(
                        away = ?Duration::from_nanos(gap),
                        "this node was away: owning nothing until gossip says whether the cluster declared it dead"
                    );
                    returning = Some(Returning::new(
                        tokio::time::Instant::now() + self.settings.gossip_interval,
                    ));
                }
                let reading = {
                    let mut cc = chitchat.lock().await;
                    let size = self.view_tx.borrow().size;
                    if let Some(r) = returning.as_mut() {
                        r.observe(&cc);
                    }
                    hearing.observe(&cc);
                    // Back from away, or hearing no majority, its failure
                    // detector's word is worth nothing: every peer looks
                    // silent to it, and no majority hears it anyway.
                    let may_suspect = returning.is_none() && !deaf;
                    if burials.update(&cc, size, may_suspect) || std::mem::take(&mut republish) {
                        let state = cc.self_node_state();
                        state.set(DEAD, encode_tombstones(&burials.published));
                        state.set(SUSPECTS, encode_tombstones(&burials.suspects));
                    }
                    // After the burials read them: dead generations stay
                    // bounded (`prune.rs`).
                    let forgot = prune::prune(&mut cc);
                    if forgot > 0 {
                        tracing::debug!(forgot, "dead generations forgotten");
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
                if view.self_tombstoned
                    || self.presence.buried_by_word()
                    || view.self_outranked.is_some()
                {
                    let was = self.presence.lifecycle();
                    if was == Lifecycle::Ready {
                        self.presence.set_lifecycle(Lifecycle::Joining);
                    }
                    let why = if view.self_tombstoned {
                        "declared dead by a peer".to_string()
                    } else if let Some(newer) = view.self_outranked {
                        format!(
                            "an earlier life of this node id, gone, is generation {newer}, newer than this one (the wall clock stepped back across a restart?)"
                        )
                    } else {
                        "a peer refused a call: this generation is buried".to_string()
                    };
                    break (why, was, view.self_outranked.unwrap_or(0));
                }
                if returning.as_ref().is_some_and(|r| r.settled(&view)) {
                    tracing::info!("back from away and not declared dead: owning again");
                    returning = None;
                }
                self.presence.set_fenced(returning.is_some());
                let heard = hearing.within(deaf_after, &view);
                deaf = view.size > 1 && (heard + 1) * 2 <= view.size;
                // Unheard: its outbound gossip lost, the others will bury
                // it as they would a node cut off (simulator seeds 119,
                // 151, 176 of `--mix any`: it owned for the whole cut).
                let unheard = view.size > 1 && hearing.unheard_for() >= deaf_after;
                let cut_off = view.self_suspected() || deaf || unheard;
                if cut_off != self.presence.cut_off() {
                    // A joining node owns nothing anyway: no word of it.
                    let word = cut_off && self.presence.lifecycle() == Lifecycle::Ready;
                    if word && view.self_suspected() {
                        tracing::warn!(
                            by = view.suspected_by,
                            size = view.size,
                            "suspected by nearly a majority: owning nothing until it clears"
                        );
                    } else if word && deaf {
                        tracing::warn!(
                            heard,
                            size = view.size,
                            "no majority heard lately: owning nothing until one is"
                        );
                    } else if word && unheard {
                        tracing::warn!(
                            unheard_for = ?hearing.unheard_for(),
                            "no peer has heard this node lately (its outbound gossip lost?): owning nothing until one has"
                        );
                    }
                    self.presence.set_cut_off(cut_off);
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
            returning = None;
            hearing = Hearing::default();
            deaf = false;
            match self.rejoin(handle, &rejoin, was, past).await {
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

    /// Restart chitchat as a new generation, `joining`, newer than this
    /// one and than `past` (an earlier life of this id); turn ready again
    /// by the join rule (in the background) if this node had joined.
    async fn rejoin(
        &mut self,
        handle: ChitchatHandle,
        why: &str,
        was: Lifecycle,
        past: u64,
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
        // Any generation of this id this process did not take is another
        // process's (an earlier life, started on a clock since stepped
        // back): the new one goes past it — the newest of an id is the
        // live one — and, if it is not older than this process's birth,
        // this process is born again (below).
        let foreign = {
            let chitchat = handle.chitchat();
            let cc = chitchat.lock().await;
            cc.node_states()
                .keys()
                .filter(|id| {
                    *id.node_id == *self.settings.node_id && !self.mine.contains(&id.generation_id)
                })
                .map(|id| id.generation_id)
                .max()
        };
        let past = past.max(foreign.unwrap_or(0));
        let _ = handle.shutdown().await;
        let generation = (self.settings.clock.wall() / 1_000_000)
            .max(old + 1)
            .max(past.saturating_add(1));
        if self.mine.len() >= MINE {
            self.mine.remove(0);
        }
        self.mine.push(generation);
        tracing::warn!(
            why,
            old_generation = old,
            generation,
            "this node may have been declared dead: rejoining as a new member"
        );
        // Past an earlier life of this id, the generations between are
        // that other process's: this one is born again here, or peers
        // (and this node) would take that life's losses for this
        // process's and end the doubt they opened.
        if past >= self.presence.born() {
            self.presence.set_born(generation);
            if let Ok(mut slot) = self.slot.lock() {
                slot.values.insert(BORN.to_string(), generation.to_string());
            }
        }
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
                        let bootstrap =
                            (!known.is_empty()).then_some(self.settings.bootstrap_expect);
                        tokio::spawn(async move {
                            tokio::select! {
                                _ = stop.cancelled() => {}
                                _ = turn_ready_again(views, slot, presence, interval, bootstrap) => {}
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
    bootstrap: Option<usize>,
) {
    if !join_wait(&mut views, bootstrap, interval).await {
        return;
    }
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
