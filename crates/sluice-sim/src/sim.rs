//! The simulator: real nodes on simulated hosts, one thread, one clock.
//!
//! Each host — one per node, and one for the apps — has a tokio runtime
//! with a paused clock. A step of the simulation ticks every running host
//! (its runtime runs whatever is ready and advances its clock by one tick,
//! firing the timers due within it), then carries the packets the hosts
//! sent through the fault rules to their destination kernels, and applies
//! the schedule's faults that are due. Nothing else runs: no thread of a
//! node's own, no OS clock; randomness is the run's seed (the binary
//! answers `getrandom` itself, `main.rs`) and the stores' hash seeds and
//! shard counts are fixed — so a schedule replays bit for bit, on any
//! machine.
//!
//! A crash drops the host's runtime — every task and socket of the
//! process, as kill -9 does — and a restart builds a new one, with the
//! host's clocks running on. A pause stops ticking the host: its kernel
//! still takes packets (TCP is acknowledged, datagrams queue), and when it
//! resumes, its runtime's clock jumps by the pause.

use std::cell::RefCell;
use std::collections::BinaryHeap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice::clock::SystemClock;
use sluice::config::Config;
use sluice::policy::Policies;
use sluice::server::{Node, World};
use sluice::threads::Threads;
use tokio_util::sync::CancellationToken;
use turmoil_net::{HostId, KernelConfig, Net, Packet, Rule, Transport, Verdict};

use crate::history::History;
use crate::schedule::{Fault, PROBE_SPAN, Proto, Schedule};
use crate::workload::{self, Apps};
use crate::world::{HostClock, SimNet, SimTicks};

/// One step of simulated time.
pub const TICK: Duration = Duration::from_millis(1);
/// The cluster's shared secret.
const SECRET: &str = "sluice-sim-secret";

/// What the log's stamp reads (`SIM_LOG`): the run's time in nanoseconds
/// and the host running now (`u64::MAX`: the apps). Set by the loop before
/// it runs a host; the log reads them, and the binary's monotonic clock
/// reads the time (`main.rs`).
pub static LOG_NOW: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub static LOG_HOST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(u64::MAX);
pub const ADMIN_TOKEN: &str = "sluice-sim-admin-token";

pub fn node_ip(n: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, n as u8 + 1))
}

const APP_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 1, 1));
pub const GRPC_PORT: u16 = 8081;
/// Every node's admin port (`admin.addr`): the operator's resets.
pub const ADMIN_PORT: u16 = 8082;
const GOSSIP_PORT: u16 = 7946;

fn index_of(ip: IpAddr) -> Option<usize> {
    match ip {
        IpAddr::V4(v4) if v4.octets()[..3] == [10, 0, 0] => Some(v4.octets()[3] as usize - 1),
        _ => None,
    }
}

/// A node's process state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Down,
    Up,
    /// Since this many ns of simulated time; `true`: the machine sleeps
    /// (its monotonic clock stands still when it wakes).
    Paused(u64, bool),
    /// Leaving (SIGTERM): runs until its leave ends.
    Leaving,
}

/// What happened to a node's process, as applied (the checker's account
/// of crashes and pauses: a fault on a node already down did nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    Started,
    /// Killed: state lost.
    Crashed,
    /// Stopped, or asleep, for `span` ns (recorded when it resumes, or is
    /// killed).
    Paused {
        span: u64,
    },
    /// Told to leave (SIGTERM).
    Leaving,
    /// The process rejoined as a new generation (the cluster buried it).
    Rejoined,
}

struct Host {
    id: HostId,
    clock: Arc<HostClock>,
    /// The process: its runtime (None: no process).
    rt: Option<tokio::runtime::Runtime>,
    node: Arc<Mutex<Option<Node>>>,
    state: State,
    /// Set when a leave has finished (the process then exits).
    left: Arc<std::sync::atomic::AtomicBool>,
    /// Processes started on this host so far.
    incarnation: u64,
    /// A start came while the node was leaving: start once it has left.
    start_after_leave: bool,
    /// The node's gRPC port, shared with the apps.
    port: Arc<Mutex<u16>>,
    /// This process's generation when last read (0: not read yet).
    generation: u64,
}

/// The links' faults, as the packet rule reads them.
#[derive(Default)]
struct Links {
    /// Active one-way cuts: (from, to, proto, until ns).
    cuts: Vec<(usize, usize, Proto, u64)>,
    /// Active slow nodes: (node, delay ns, until).
    slow: Vec<(usize, u64, u64)>,
    /// Active lossy nodes: (node, percent, until).
    loss: Vec<(usize, u8, u64)>,
    now: u64,
}

struct FaultRule {
    links: Rc<RefCell<Links>>,
    rng: fastrand::Rng,
}

impl Rule for FaultRule {
    fn on_packet(&mut self, pkt: &Packet) -> Verdict {
        let links = self.links.borrow();
        let now = links.now;
        let (from, to) = (index_of(pkt.src), index_of(pkt.dst));
        let tcp = matches!(pkt.payload, Transport::Tcp(_));
        if let (Some(f), Some(t)) = (from, to)
            && links
                .cuts
                .iter()
                .any(|&(cf, ct, p, until)| cf == f && ct == t && p.drops(tcp) && now < until)
        {
            return Verdict::Drop;
        }
        let touches = |n: usize| from == Some(n) || to == Some(n);
        for &(n, percent, until) in &links.loss {
            if touches(n) && now < until && self.rng.u8(0..100) < percent {
                return Verdict::Drop;
            }
        }
        // A base latency of 0.1–1 ms (so datagrams reorder), plus any
        // slow node's delay.
        let mut delay = self.rng.u64(100_000..1_000_000);
        for &(n, extra, until) in &links.slow {
            if touches(n) && now < until {
                delay += extra;
            }
        }
        Verdict::Deliver(Duration::from_nanos(delay))
    }
}

struct InFlight {
    at: u64,
    seq: u64,
    pkt: Packet,
}

impl PartialEq for InFlight {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for InFlight {
    /// Reversed: the heap pops the earliest first.
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

/// A timed change to the world, from the schedule.
#[derive(Clone, Debug)]
enum Action {
    Start(usize),
    Crash(usize),
    Pause(usize),
    Suspend(usize),
    Resume(usize),
    Leave(usize),
    Cut(usize, usize, Proto, u64),
    Slow(usize, u64, u64),
    Loss(usize, u8, u64),
    Step(usize, i64),
    Reload(usize),
    Heal,
}

/// One running node at the end of a run.
pub struct Standing {
    pub node: usize,
    /// Its ring's members: (node id, generation).
    pub ring: Vec<(String, u64)>,
    /// The members it suspects (kept in the ring until buried).
    pub suspects: Vec<String>,
}

/// What a run produced.
pub struct Outcome {
    pub history: History,
    /// What happened to each node's process: (ns, node, event).
    pub events: Vec<(u64, usize, Event)>,
    /// At the end: each running node's ring and suspects.
    pub rings: Vec<Standing>,
    /// Restarts that found the node's gRPC port still held (see
    /// `free_grpc_port`).
    pub moved_ports: usize,
    /// Problems of the run itself (a node that could not start).
    pub errors: Vec<String>,
    /// Wall seconds the run took.
    pub wall: f64,
    /// Seconds `std::time::Instant` counted on this thread over the run:
    /// the simulated seconds under the binary (`main.rs`), the machine's
    /// elsewhere.
    pub monotonic: f64,
}

/// Run `schedule` to its end on this thread.
pub fn run(schedule: &Schedule) -> Outcome {
    // The machine's time (the binary makes `Instant` the run's on this
    // thread: `main.rs`).
    let started = std::time::SystemTime::now();
    let monotonic = std::time::Instant::now();
    let mut net = Net::with_config(
        KernelConfig::default()
            // Gossip datagrams reach 64 KiB: no fragmentation is
            // simulated, so the MTU holds the largest.
            .mtu(66_000)
            // Retransmission counts egress passes, one a tick: 200 ticks
            // is Linux's minimum RTO (200 ms), so a slow link (tens of
            // ms) is slow, not reset. 15 tries (3 s, no backoff) lets a
            // connection stall through most cuts and resume after, as a
            // real one does; Linux's ~15 minutes would outlive every run.
            .retx_threshold(200)
            .retx_max(15),
    );
    let links = Rc::new(RefCell::new(Links::default()));
    net.rule(FaultRule {
        links: links.clone(),
        rng: fastrand::Rng::with_seed(schedule.seed ^ 0x0e7),
    });
    let mut hosts: Vec<Host> = (0..schedule.nodes)
        .map(|n| {
            let id = net.add_host(node_ip(n));
            let skew = schedule.skew.get(n).copied().unwrap_or(0);
            Host {
                id,
                clock: HostClock::new((n as u64 + 1) * 3_600_000_000_000, skew * 1_000_000),
                rt: None,
                node: Arc::default(),
                state: State::Down,
                left: Arc::default(),
                incarnation: 0,
                start_after_leave: false,
                port: Arc::new(Mutex::new(GRPC_PORT)),
                generation: 0,
            }
        })
        .collect();
    let app_id = net.add_host(APP_IP);
    let guard = net.enter();
    let history = Arc::new(Mutex::new(History::default()));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let mut log = Log::default();

    // The apps' host: never faulted, its clock is the run's.
    turmoil_net::set_current(app_id);
    let app_rt = runtime();
    let ports = hosts.iter().map(|h| h.port.clone()).collect();
    let apps = {
        let _g = app_rt.enter();
        Apps::new(schedule, history.clone(), ports)
    };
    app_rt.spawn(workload::drive(apps));

    let mut actions = timeline(schedule);
    let mut order_rng = fastrand::Rng::with_seed(schedule.seed ^ 0x0de7);
    let mut in_flight = BinaryHeap::new();
    let mut seq = 0u64;
    let mut egress = Vec::new();
    let total = (schedule.end + PROBE_SPAN) * 1_000_000;
    let tick = TICK.as_nanos() as u64;
    let mut now = 0u64;
    let mut order: Vec<usize> = (0..hosts.len()).collect();
    while now < total {
        // The schedule's changes due now.
        while let Some((at, _)) = actions.first()
            && *at <= now
        {
            let (_, action) = actions.remove(0);
            apply(
                &mut hosts, &links, &action, now, schedule, &errors, &mut log,
            );
        }
        // Leaves that finished: the process exits (and starts again if a
        // start came meanwhile).
        for (n, h) in hosts.iter_mut().enumerate() {
            if h.state == State::Leaving && h.left.load(std::sync::atomic::Ordering::SeqCst) {
                stop(h);
                if std::mem::take(&mut h.start_after_leave) {
                    start(h, n, now, schedule, &errors, &mut log);
                }
            }
        }
        // Every running host, in an order drawn from the seed.
        order_rng.shuffle(&mut order);
        for &i in &order {
            let h = &hosts[i];
            if matches!(h.state, State::Up | State::Leaving)
                && let Some(rt) = &h.rt
            {
                turmoil_net::set_current(h.id);
                LOG_HOST.store(i as u64, std::sync::atomic::Ordering::Relaxed);
                rt.block_on(async { tokio::time::sleep(TICK).await });
            }
        }
        // Rejoins: a running process's generation moved on.
        for (n, h) in hosts.iter_mut().enumerate() {
            let g = lock(&h.node)
                .as_ref()
                .map(|node| node.limiter.presence().generation());
            if let Some(g) = g {
                if h.generation != 0 && g != h.generation {
                    log.events.push((now, n, Event::Rejoined));
                }
                h.generation = g;
            }
        }
        turmoil_net::set_current(app_id);
        LOG_HOST.store(u64::MAX, std::sync::atomic::Ordering::Relaxed);
        app_rt.block_on(async { tokio::time::sleep(TICK).await });
        now += tick;
        LOG_NOW.store(now, std::sync::atomic::Ordering::Relaxed);
        links.borrow_mut().now = now;
        // The network: what was sent this tick, through the rules.
        guard.egress_all(&mut egress);
        for pkt in egress.drain(..) {
            match guard.evaluate(&pkt) {
                Verdict::Drop => {}
                Verdict::Deliver(d) => {
                    seq += 1;
                    in_flight.push(InFlight {
                        at: now + d.as_nanos() as u64,
                        seq,
                        pkt,
                    });
                }
                Verdict::Pass => {
                    seq += 1;
                    in_flight.push(InFlight { at: now, seq, pkt });
                }
            }
        }
        while in_flight.peek().is_some_and(|p| p.at <= now) {
            if let Some(p) = in_flight.pop() {
                guard.deliver(p.pkt);
            }
        }
    }
    // Where the run ends: each running node's ring, and whom it suspects.
    let rings = hosts
        .iter()
        .enumerate()
        .filter_map(|(n, h)| {
            let node = lock(&h.node);
            let node = node.as_ref()?;
            let ring = node.limiter.ring();
            let suspects = node
                .membership
                .view()
                .members
                .iter()
                .filter(|m| m.suspected)
                .map(|m| m.node_id.to_string())
                .collect();
            Some(Standing {
                node: n,
                ring: ring
                    .members()
                    .iter()
                    .map(|m| (m.node_id.to_string(), m.generation))
                    .collect(),
                suspects,
            })
        })
        .collect();
    // Tear down inside each host's scope (sockets close in their kernels).
    for h in hosts.iter_mut() {
        stop(h);
    }
    let Log {
        events,
        moved_ports,
    } = log;
    turmoil_net::set_current(app_id);
    drop(app_rt);
    drop(guard);
    let history = std::mem::take(&mut *history.lock().unwrap_or_else(|p| p.into_inner()));
    let errors = std::mem::take(&mut *errors.lock().unwrap_or_else(|p| p.into_inner()));
    Outcome {
        history,
        events,
        rings,
        moved_ports,
        errors,
        wall: started.elapsed().unwrap_or_default().as_secs_f64(),
        monotonic: monotonic.elapsed().as_secs_f64(),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime")
}

/// The schedule as timed actions, in order (ns).
fn timeline(s: &Schedule) -> Vec<(u64, Action)> {
    let ms = |t: u64| t * 1_000_000;
    let mut a = Vec::new();
    for n in 0..s.nodes {
        a.push((ms(s.start_of(n)), Action::Start(n)));
    }
    for f in &s.faults {
        let (at, end) = (ms(f.at()), ms(f.end()));
        match *f {
            Fault::Crash { node, .. } => {
                a.push((at, Action::Crash(node)));
                a.push((end, Action::Start(node)));
            }
            Fault::Leave { node, .. } => {
                a.push((at, Action::Leave(node)));
                a.push((end, Action::Start(node)));
            }
            Fault::Pause { node, .. } => {
                a.push((at, Action::Pause(node)));
                a.push((end, Action::Resume(node)));
            }
            Fault::Suspend { node, .. } => {
                a.push((at, Action::Suspend(node)));
                a.push((end, Action::Resume(node)));
            }
            Fault::Cut {
                from, to, proto, ..
            } => a.push((at, Action::Cut(from, to, proto, end))),
            Fault::Slow { node, delay, .. } => a.push((at, Action::Slow(node, ms(delay), end))),
            Fault::Loss { node, percent, .. } => a.push((at, Action::Loss(node, percent, end))),
            Fault::ClockStep { node, by, .. } => a.push((at, Action::Step(node, by))),
            Fault::Reload { node, .. } => a.push((at, Action::Reload(node))),
            // The operator's: the apps make it (`workload.rs`).
            Fault::Reset { .. } => {}
        }
    }
    a.push((ms(s.heal), Action::Heal));
    // Stable: actions at one instant keep the schedule's order.
    a.sort_by_key(|(t, _)| *t);
    a
}

/// What the run did to the nodes, for the checker.
#[derive(Default)]
struct Log {
    events: Vec<(u64, usize, Event)>,
    moved_ports: usize,
}

#[allow(clippy::too_many_arguments)]
fn apply(
    hosts: &mut [Host],
    links: &Rc<RefCell<Links>>,
    action: &Action,
    now: u64,
    s: &Schedule,
    errors: &Arc<Mutex<Vec<String>>>,
    log: &mut Log,
) {
    match *action {
        // A node that starts late starts no earlier (a crash and restart
        // drawn before its start do nothing).
        Action::Start(n) if now < s.start_of(n) * 1_000_000 => {}
        Action::Start(n) => match hosts[n].state {
            State::Down => start(&mut hosts[n], n, now, s, errors, log),
            State::Leaving => hosts[n].start_after_leave = true,
            State::Up | State::Paused(..) => {}
        },
        Action::Crash(n) => {
            // A pause the crash ends is recorded as a pause too: the
            // node's replication stopped at its start, not at the crash
            // (seed 499: two admissions 11 ms before a pause that a crash
            // ended were lost, counted from the crash they were not).
            if let State::Paused(since, _) = hosts[n].state {
                log.events
                    .push((since, n, Event::Paused { span: now - since }));
            }
            if hosts[n].state != State::Down {
                log.events.push((now, n, Event::Crashed));
            }
            hosts[n].start_after_leave = false;
            stop(&mut hosts[n]);
        }
        Action::Pause(n) | Action::Suspend(n) => {
            if hosts[n].state == State::Up {
                hosts[n].state = State::Paused(now, matches!(action, Action::Suspend(_)));
            }
        }
        Action::Resume(n) => resume(&mut hosts[n], n, now, log),
        Action::Leave(n) => {
            if hosts[n].state == State::Up {
                log.events.push((now, n, Event::Leaving));
            }
            leave(&mut hosts[n]);
        }
        Action::Cut(f, t, p, until) => links.borrow_mut().cuts.push((f, t, p, until)),
        Action::Slow(n, d, until) => links.borrow_mut().slow.push((n, d, until)),
        Action::Loss(n, p, until) => links.borrow_mut().loss.push((n, p, until)),
        Action::Step(n, by) => hosts[n].clock.step(by * 1_000_000),
        Action::Reload(n) => reload(&hosts[n], n, s, errors),
        Action::Heal => {
            {
                let mut l = links.borrow_mut();
                l.cuts.clear();
                l.slow.clear();
                l.loss.clear();
            }
            for (n, h) in hosts.iter_mut().enumerate() {
                match h.state {
                    State::Paused(..) => resume(h, n, now, log),
                    State::Down => start(h, n, now, s, errors, log),
                    State::Leaving => h.start_after_leave = true,
                    State::Up => {}
                }
            }
        }
    }
}

/// Node `n`'s config file changed: one more named policy (the apps'
/// keys carry their limits inline, so none of theirs changes), taken by
/// the product's reload path on the node's runtime. A node not running
/// reads the file when it starts (no change to its keys either).
fn reload(h: &Host, n: usize, s: &Schedule, errors: &Arc<Mutex<Vec<String>>>) {
    let (Some(rt), Some(node)) = (
        &h.rt,
        lock(&h.node)
            .as_ref()
            .map(|node| (node.limiter.clone(), node.membership.clone())),
    ) else {
        return;
    };
    let mut config = config(n, s);
    config.policies.insert(
        "reloaded".into(),
        sluice::config::PolicyConfig {
            limit: 10,
            duration: Some("1s".into()),
            ..Default::default()
        },
    );
    let policies = match Policies::from_config(&config) {
        Ok(p) => p,
        Err(e) => {
            lock(errors).push(format!("n{n}: reloaded policies: {e}"));
            return;
        }
    };
    let (limiter, membership) = node;
    rt.spawn(async move { sluice::server::apply_policies(&limiter, &membership, policies).await });
}

/// The config of node `n`: production defaults, addresses on its host.
pub fn config(n: usize, s: &Schedule) -> Config {
    let ip = node_ip(n);
    let mut c = Config {
        node_id: format!("n{n}"),
        grpc_addr: SocketAddr::new(ip, GRPC_PORT),
        http_addr: SocketAddr::new(ip, 8080),
        ..Config::default()
    };
    c.admin.addr = SocketAddr::new(ip, ADMIN_PORT);
    c.admin.token = Some(ADMIN_TOKEN.into());
    c.cluster.gossip_addr = SocketAddr::new(ip, GOSSIP_PORT);
    c.cluster.advertise_host = Some(ip.to_string());
    c.cluster.secret = Some(SECRET.into());
    c.cluster.zone = s.zones.get(n).cloned();
    c.cluster.seeds = (0..s.nodes)
        .filter(|&m| m != n)
        .map(|m| SocketAddr::new(node_ip(m), GOSSIP_PORT).to_string())
        .collect();
    c
}

/// The first of the node's gRPC ports that is free on its host. A killed
/// process's accepted connections linger in its kernel until their peers
/// close them (`turmoil-net` has no `SO_REUSEADDR`, which lets Linux
/// listen again at once): a restart then listens on the next port, and
/// peers learn it by gossip, as they would a new address.
fn free_grpc_port(rt: &tokio::runtime::Runtime, n: usize) -> u16 {
    // Within the host's runtime: the socket calls go to its kernel.
    rt.block_on(async {
        for k in 0..50u16 {
            let port = GRPC_PORT + 100 * k;
            let addr = SocketAddr::new(node_ip(n), port);
            if turmoil_net::shim::tokio::net::TcpListener::bind(addr)
                .await
                .is_ok()
            {
                return port;
            }
        }
        GRPC_PORT
    })
}

fn start(
    h: &mut Host,
    n: usize,
    now: u64,
    s: &Schedule,
    errors: &Arc<Mutex<Vec<String>>>,
    log: &mut Log,
) {
    turmoil_net::set_current(h.id);
    let rt = runtime();
    let port = free_grpc_port(&rt, n);
    log.events.push((now, n, Event::Started));
    log.moved_ports += usize::from(port != GRPC_PORT);
    lock(&h.port).clone_from(&port);
    h.incarnation += 1;
    h.generation = 0;
    h.left.store(false, std::sync::atomic::Ordering::SeqCst);
    let world = {
        let _g = rt.enter();
        h.clock.started(h.clock.boot_at(now));
        World {
            clock: Arc::new(SystemClock::over(SimTicks(h.clock.clone()), 0)),
            net: Arc::new(SimNet),
            threads: Threads::Inline,
            hash_seed: Some(s.seed ^ ((n as u64) << 32) ^ h.incarnation),
        }
    };
    let mut config = config(n, s);
    config.grpc_addr.set_port(port);
    let slot = h.node.clone();
    let errors = errors.clone();
    rt.spawn(async move {
        let policies = match Policies::from_config(&config) {
            Ok(p) => p,
            Err(e) => {
                lock(&errors).push(format!("n{n}: policies: {e}"));
                return;
            }
        };
        match Node::start_in(world, config, policies, None, CancellationToken::new()).await {
            Ok(node) => *lock(&slot) = Some(node),
            Err(e) => lock(&errors).push(format!("n{n} did not start: {e}")),
        }
    });
    h.rt = Some(rt);
    h.state = State::Up;
}

/// The process ends at once (kill -9), or after its leave.
fn stop(h: &mut Host) {
    turmoil_net::set_current(h.id);
    if let Some(rt) = h.rt.take() {
        let node = lock(&h.node).take();
        {
            let _g = rt.enter();
            drop(node);
        }
        drop(rt);
    }
    h.state = State::Down;
}

fn resume(h: &mut Host, n: usize, now: u64, log: &mut Log) {
    if let State::Paused(since, slept) = h.state {
        h.state = State::Up;
        log.events
            .push((since, n, Event::Paused { span: now - since }));
        if slept {
            // The monotonic clock stood still; boot and wall clocks ran.
            h.clock.slept(now - since);
        } else if let Some(rt) = &h.rt {
            turmoil_net::set_current(h.id);
            let gap = Duration::from_nanos(now - since);
            rt.block_on(async move { tokio::time::advance(gap).await });
        }
    }
}

fn leave(h: &mut Host) {
    if h.state != State::Up {
        return;
    }
    let Some(node) = lock(&h.node).take() else {
        // Still starting: a SIGTERM then is a stop before it joined.
        stop(h);
        return;
    };
    if let Some(rt) = &h.rt {
        let left = h.left.clone();
        rt.spawn(async move {
            node.leave().await;
            left.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        h.state = State::Leaving;
    }
}

pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
