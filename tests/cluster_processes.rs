//! Three real `sluice serve` processes on loopback: they form one cluster
//! (as `sluice cluster status` shows), enforce one limit exactly whichever
//! process is asked, drop a SIGTERMed member within 1 s and a SIGKILLed one
//! within a few seconds (the measured figures are printed).

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{eventually, inline, under};
use sluice::proto::v1 as pb;
use sluice::proto::v1::rate_limiter_client::RateLimiterClient;

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

struct Proc {
    child: Child,
    grpc: String,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free loopback port (released just before the process binds it).
fn free_tcp() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn free_udp() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn spawn(i: usize, gossip: u16, seed: Option<u16>) -> Proc {
    let grpc = format!("127.0.0.1:{}", free_tcp());
    let mut cmd = Command::new(BIN);
    cmd.args([
        "serve",
        "--node-id",
        &format!("proc-{i}"),
        "--grpc-addr",
        &grpc,
    ])
    .args(["--http-addr", &format!("127.0.0.1:{}", free_tcp())])
    .env("SLUICE_CLUSTER__GOSSIP_ADDR", format!("127.0.0.1:{gossip}"))
    .env("SLUICE_CLUSTER__SECRET", "process-test-secret")
    .env("SLUICE_CLUSTER__GOSSIP_INTERVAL", "100ms")
    // Generous for a loaded 2-core CI machine; the default is 10 ms.
    .env("SLUICE_CLUSTER__FORWARD_TIMEOUT", "250ms")
    .env("RUST_LOG", "warn")
    .stdout(Stdio::null())
    .stderr(Stdio::inherit());
    if let Some(seed) = seed {
        cmd.env("SLUICE_CLUSTER__SEEDS", format!("[\"127.0.0.1:{seed}\"]"));
    }
    Proc {
        child: cmd.spawn().expect("sluice starts"),
        grpc,
    }
}

/// `sluice cluster status --json` against `addr`.
fn status(addr: &str) -> Option<serde_json::Value> {
    let out = Command::new(BIN)
        .args(["cluster", "status", "--json", "--addr", addr])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())?
}

fn in_ring(addr: &str) -> Vec<String> {
    let Some(s) = status(addr) else {
        return Vec::new();
    };
    let mut ids: Vec<String> = s["members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["in_ring"] == true)
        .filter_map(|m| m["node_id"].as_str().map(String::from))
        .collect();
    ids.sort();
    ids
}

async fn rings_are(procs: &[&Proc], want: &[&str], what: &str, within: Duration) -> Duration {
    let started = Instant::now();
    eventually(what, within, || async {
        procs.iter().all(|p| in_ring(&p.grpc) == want)
    })
    .await;
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread")]
async fn three_processes_enforce_one_limit() {
    let g0 = free_udp();
    let p0 = spawn(0, g0, None);
    let p1 = spawn(1, free_udp(), Some(g0));
    let p2 = spawn(2, free_udp(), Some(g0));
    let all = ["proc-0", "proc-1", "proc-2"];
    rings_are(
        &[&p0, &p1, &p2],
        &all,
        "three ready members",
        Duration::from_secs(30),
    )
    .await;

    // Every member is ready and owns about a third of the key space.
    let s = status(&p1.grpc).unwrap();
    for m in s["members"].as_array().unwrap() {
        assert_eq!(m["state"], "ready", "{m}");
        let share = m["ring_share"].as_f64().unwrap();
        assert!((0.25..0.42).contains(&share), "{m}");
    }
    assert_eq!(s["cluster_size"], 3);

    let mut clients = Vec::new();
    for p in [&p0, &p1, &p2] {
        clients.push(
            RateLimiterClient::connect(format!("http://{}", p.grpc))
                .await
                .unwrap(),
        );
    }
    // 50 per year: real time passes in this test, and a limit per minute
    // would refill a token every 1.2 s of it.
    let year_ms = 365 * 24 * 3_600 * 1_000;
    let mut admitted = 0;
    for i in 0..150 {
        let r = clients[i % 3]
            .check(pb::CheckRequest {
                requests: vec![inline("proc", "one-key", 50, year_ms)],
            })
            .await
            .unwrap()
            .into_inner()
            .responses
            .remove(0);
        assert!(r.error.is_none() && !r.approximate, "{r:?}");
        assert_ne!(r.status, pb::Status::Unavailable as i32, "{r:?}");
        admitted += usize::from(under(&r));
    }
    assert_eq!(admitted, 50, "one limit across three processes");

    // SIGTERM: the member leaves gracefully, out of every ring within 1 s.
    let started = Instant::now();
    let mut p2 = p2;
    let _ = Command::new("kill")
        .args(["-TERM", &p2.child.id().to_string()])
        .status();
    rings_are(
        &[&p0, &p1],
        &["proc-0", "proc-1"],
        "proc-2 gone after SIGTERM",
        Duration::from_secs(5),
    )
    .await;
    let left = started.elapsed();
    println!("SIGTERM: out of every ring after {left:?}");
    assert!(
        left < Duration::from_secs(1),
        "graceful leave took {left:?}"
    );
    let exit = p2.child.wait().unwrap();
    assert!(exit.success(), "SIGTERM exits cleanly: {exit:?}");

    // SIGKILL: found dead by the failure detector.
    let mut p1 = p1;
    let started = Instant::now();
    p1.child.kill().unwrap();
    let took = rings_are(
        &[&p0],
        &["proc-0"],
        "proc-1 gone after SIGKILL",
        Duration::from_secs(30),
    )
    .await;
    println!(
        "SIGKILL: out of the ring after {:?} (gossip every 100 ms)",
        started.elapsed().max(took)
    );
    drop(p0);
}
