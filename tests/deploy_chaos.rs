//! Chaos in containers: the compose cluster of `deploy/docker-compose.yml`
//! (three `sluice:dev` containers on a private Docker network, each with
//! its own address), under a steady load, through real faults — `docker
//! kill` of an owner, `docker pause` for 10 s, `docker network disconnect`
//! for 10 s, a rolling restart of all three with SIGTERM. For each it prints
//! client errors, over-admission (DESIGN §7: 3× the limit offered on keys
//! owned by every node, against the exact reference, which admits `limit`
//! per key as nothing refills within a year) and the client p99.
//!
//! Needs Docker and the image (`deploy/build-image.sh`), so it is ignored
//! by `cargo test`; `.ci/run` runs it with `--ignored`: the kill and the
//! rolling restart. `SLUICE_CHAOS=full` runs every fault (the recorded
//! figures). The load goes to the nodes not faulted, as a load balancer
//! stops sending to a node that fails its checks; every compose project,
//! container and network it made is removed when it ends, failing or not.

mod common;

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::eventually;
use common::load::{Load, Tally, keys_owned_by};
use tonic::transport::Channel;

const LIMIT: i64 = 200;
const NODES: [&str; 3] = ["sluice-1", "sluice-2", "sluice-3"];

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("command runs");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// One compose project; `down` on drop.
struct Compose {
    project: String,
    file: String,
}

impl Compose {
    fn up() -> Compose {
        let project = format!("sluicechaos{}", std::process::id());
        let file = format!("{}/deploy/docker-compose.yml", env!("CARGO_MANIFEST_DIR"));
        let c = Compose { project, file };
        run(c
            .cmd()
            .args(["up", "-d", "sluice-1", "sluice-2", "sluice-3"]));
        c
    }

    fn cmd(&self) -> Command {
        let mut cmd = Command::new("docker-compose");
        cmd.args(["-f", &self.file, "-p", &self.project])
            // No host ports: the test reaches each container at its own address.
            .env("SLUICE_GRPC_PORT", "")
            .env("SLUICE_HTTP_PORT", "");
        cmd
    }

    fn container(&self, service: &str) -> String {
        format!("{}_{service}_1", self.project)
    }

    fn network(&self) -> String {
        format!("{}_sluice", self.project)
    }

    fn ip(&self, service: &str) -> String {
        run(Command::new("docker").args([
            "inspect",
            "-f",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
            &self.container(service),
        ]))
    }

    fn docker(&self, args: &[&str]) {
        run(Command::new("docker").args(args));
    }

    /// `sluice cluster status` inside `service`: the ids in its ring.
    fn ring(&self, service: &str) -> Vec<String> {
        let out = Command::new("docker")
            .args([
                "exec",
                &self.container(service),
                "/usr/local/bin/sluice",
                "cluster",
                "status",
                "--json",
                "--addr",
                "127.0.0.1:8081",
            ])
            .output();
        let Ok(out) = out else { return Vec::new() };
        serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .map(|v| common::ring_ids(&v))
            .unwrap_or_default()
    }

    async fn all_in_ring(&self, what: &str) {
        eventually(what, Duration::from_secs(60), || async {
            NODES.iter().all(|n| self.ring(n) == NODES)
        })
        .await;
    }

    async fn channel(&self, service: &str) -> Channel {
        let ip = self.ip(service);
        tonic::transport::Endpoint::from_shared(format!("http://{ip}:8081"))
            .unwrap()
            .timeout(Duration::from_secs(2))
            .connect_timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap_or_else(|e| panic!("{service} at {ip}: {e}"))
    }

    async fn targets(&self, except: Option<&str>) -> Vec<(String, Channel)> {
        let mut t = Vec::new();
        for n in NODES.iter().filter(|n| Some(**n) != except) {
            t.push((n.to_string(), self.channel(n).await));
        }
        t
    }
}

impl Drop for Compose {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // What the nodes said, to find why (CI keeps nothing else).
            if let Ok(out) = self
                .cmd()
                .args(["logs", "--no-color", "--tail", "300"])
                .output()
            {
                eprintln!("{}", String::from_utf8_lossy(&out.stdout));
            }
        }
        let _ = self
            .cmd()
            .args(["down", "-v", "--remove-orphans", "-t", "1"])
            .output();
    }
}

/// What a fault scenario measured.
struct Outcome {
    tally: Tally,
    /// Requests per second per key offered before the fault.
    rate: f64,
}

/// Offer load on fresh keys (`name`) to every node, inject `fault` on
/// `victim` once half the limit is offered (the load skips the victim from
/// then on), recover, and run to 3× the limit.
async fn scenario<F, Fut>(c: &Compose, name: &str, victim: &str, fault: F) -> Outcome
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let keys = keys_owned_by(&NODES, name, 3);
    let started = Instant::now();
    let load = Load::start(
        name,
        keys,
        LIMIT,
        Duration::from_millis(10),
        c.targets(None).await,
    );
    load.until_offered(LIMIT / 2).await;
    load.drop_target(victim).await;
    let rate = load.snapshot().min_offered() as f64 / started.elapsed().as_secs_f64();
    fault().await;
    c.all_in_ring(&format!("{victim} back in every ring after {name}"))
        .await;
    load.add_target(victim, c.channel(victim).await);
    let tally = load.finish(3 * LIMIT).await;
    println!("{name}: {}", tally.summary(LIMIT));
    Outcome { tally, rate }
}

/// The replication lag a node reports (`sluice_replication_lag_microseconds`,
/// set after each round), sampled every 20 ms until the node stops
/// answering: the worst lag of its last seconds is what a kill can lose.
struct LagWatch {
    samples: Arc<Mutex<Vec<(Instant, Duration)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl LagWatch {
    fn start(addr: String) -> LagWatch {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn({
            let samples = samples.clone();
            async move {
                while let Some(lag) = replication_lag(&addr).await {
                    samples.lock().unwrap().push((Instant::now(), lag));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        });
        LagWatch { samples, task }
    }

    /// The worst lag sampled in the `window` before the last sample (the
    /// node's death), and how many samples there were.
    fn worst_before_death(self, window: Duration) -> (Duration, usize) {
        self.task.abort();
        let samples = self.samples.lock().unwrap();
        let Some(&(last, _)) = samples.last() else {
            return (Duration::ZERO, 0);
        };
        let worst = samples
            .iter()
            .filter(|(at, _)| last.duration_since(*at) <= window)
            .map(|(_, lag)| *lag)
            .max()
            .unwrap_or_default();
        (worst, samples.len())
    }
}

/// One reading of a node's replication lag; None once it does not answer.
async fn replication_lag(addr: &str) -> Option<Duration> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let read = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        let req = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf).to_string();
        text.lines()
            .find(|l| l.starts_with("sluice_replication_lag_microseconds "))?
            .rsplit(' ')
            .next()?
            .parse::<u64>()
            .ok()
    };
    tokio::time::timeout(Duration::from_millis(500), read)
        .await
        .ok()
        .flatten()
        .map(Duration::from_micros)
}

/// The intervals these faults depend on are the compose file's, the
/// defaults (README): gossip every 200 ms, reports every 100 ms,
/// replication every 20 ms, all ≤ 2 s; `dead_grace` (1 h) outlasts every
/// 10 s fault here, so a node cut off stays in the minority throughout.
///
/// Per key (keys are named for their owner): keys whose owner `touched`
/// admit at most `bound` over the limit, every other key exactly its limit.
fn check(name: &str, tally: &Tally, touched: impl Fn(&str) -> bool, bound: i64) {
    assert_eq!(tally.errors, 0, "{name}: {:?}", tally.first_errors);
    tally.assert_per_key(LIMIT, touched, bound);
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs Docker and the sluice:dev image; .ci/run runs it (deploy/build-image.sh first)"]
async fn faults_in_containers() {
    let full = std::env::var("SLUICE_CHAOS").is_ok_and(|v| v == "full");
    let c = Compose::up();
    c.all_in_ring("three ready containers").await;

    // kill -9 of an owner (replicas on): then it is started again.
    let lag = LagWatch::start(format!("{}:8080", c.ip("sluice-3")));
    let kill = scenario(&c, "kill", "sluice-3", || async {
        c.docker(&["kill", &c.container("sluice-3")]);
        eventually(
            "sluice-3 out of the rings",
            Duration::from_secs(30),
            || async { !c.ring("sluice-1").contains(&"sluice-3".to_string()) },
        )
        .await;
        c.docker(&["start", &c.container("sluice-3")]);
    })
    .await;
    // The dead owner's keys: what arrived within one replication lag —
    // the worst its last 2 s reported, plus the round a change waits for
    // (`replicate_interval`, 20 ms by default) and the one request a round
    // may be cut in the middle of; never less than +10 (a 100 ms lag).
    // Usually the lag is about a round; once in CI the dead owner's keys
    // were all +17 (a lag near 170 ms went unmeasured then).
    let (worst, samples) = lag.worst_before_death(Duration::from_secs(2));
    let round = Duration::from_millis(20);
    let bound = (((worst + round).as_secs_f64() * kill.rate).ceil() as i64 + 1).max(LIMIT / 20);
    println!(
        "docker kill: sluice-3's replication lag before it died: worst {worst:?} of {samples} samples in its last 2 s; {:.0} requests/s per key; bound +{bound} per key of the dead owner",
        kill.rate
    );
    assert!(samples > 0, "sluice-3's replication lag was never read");
    check(
        "docker kill",
        &kill.tally,
        |k| k.starts_with("sluice-3"),
        bound,
    );

    // Rolling restart with SIGTERM (docker stop), one container at a time.
    let keys = keys_owned_by(&NODES, "rolling", 3);
    let load = Load::start(
        "rolling",
        keys,
        LIMIT,
        Duration::from_millis(10),
        c.targets(None).await,
    );
    load.until_offered(LIMIT / 4).await;
    for n in NODES {
        load.drop_target(n).await;
        c.docker(&["stop", "-t", "20", &c.container(n)]);
        c.docker(&["start", &c.container(n)]);
        c.all_in_ring(&format!("{n} back after its restart")).await;
        load.add_target(n, c.channel(n).await);
    }
    let t = load.finish(3 * LIMIT).await;
    println!("rolling restart (docker stop/start): {}", t.summary(LIMIT));
    // Every key moves twice; the count goes with it (a caller's fallback
    // while rings converge may add a share).
    check("rolling restart", &t, |_| true, LIMIT / 50);

    if !full {
        return;
    }
    let t = scenario(&c, "pause", "sluice-2", || async {
        c.docker(&["pause", &c.container("sluice-2")]);
        tokio::time::sleep(Duration::from_secs(10)).await;
        c.docker(&["unpause", &c.container("sluice-2")]);
    })
    .await;
    // The paused node decided nothing while paused and rejoined as new;
    // the others' keys moved and back: at most a lease share each.
    check("docker pause 10 s", &t.tally, |_| true, LIMIT / 3);

    let t = scenario(&c, "disconnect", "sluice-1", || async {
        c.docker(&[
            "network",
            "disconnect",
            &c.network(),
            &c.container("sluice-1"),
        ]);
        tokio::time::sleep(Duration::from_secs(10)).await;
        // With its service name back, as compose attached it.
        c.docker(&[
            "network",
            "connect",
            "--alias",
            "sluice-1",
            &c.network(),
            &c.container("sluice-1"),
        ]);
    })
    .await;
    // The cut-off node decided every key on 1/N leases.
    check("network disconnect 10 s", &t.tally, |_| true, LIMIT / 3);
}
