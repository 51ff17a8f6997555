//! Ready means ready (issue 18), on real `sluice serve` processes: a node
//! whose seeds answer late says `NOT_SERVING` on gRPC health (the
//! DaemonSet's readiness probe) and 503 on `/readyz` until it joined, and in
//! between decides nothing from a fresh state — a key whose owner it cannot
//! name is answered `UNAVAILABLE`, reason `NOT_READY`.
//!
//! A node with seeds that reaches no peer never starts alone (issue 39,
//! item 4): it stays joining until it hears a ready peer, or, for a
//! brand-new cluster, `cluster.bootstrap_expect` nodes (2) joining
//! together.

mod common;

use std::time::Duration;

use common::procs::{Proc, check, inspect_remaining, ports, spawn, spawn_logged};
use common::{eventually, http_get, inline};
use sluice::proto::v1 as pb;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

const GOSSIP_INTERVAL: &str = "500ms";
const SETTLE: Duration = Duration::from_secs(20);

/// gRPC health of `service` ("" for the server) at `p`; None while the
/// port does not answer.
async fn health(p: &Proc, service: &str) -> Option<ServingStatus> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", p.grpc))
        .ok()?
        .connect_timeout(Duration::from_millis(200))
        .connect()
        .await
        .ok()?;
    let answer = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .ok()?;
    ServingStatus::try_from(answer.into_inner().status).ok()
}

/// gRPC health's `Watch` of the server at `p`, over one connection.
async fn watch_health(p: &Proc) -> tonic::Streaming<HealthCheckResponse> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", p.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
}

/// How `p`'s process exited, awaited up to [`SETTLE`].
async fn exit_of(p: &mut Proc) -> std::process::ExitStatus {
    let until = std::time::Instant::now() + SETTLE;
    loop {
        if let Some(exit) = p.child.try_wait().unwrap() {
            return exit;
        }
        assert!(std::time::Instant::now() < until, "{} exits", p.id);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every key answered `UNAVAILABLE`, reason `NOT_READY`: decided nothing.
fn assert_all_not_ready(keys: &[String], answers: &[pb::RateLimitResponse]) {
    assert_eq!(answers.len(), keys.len());
    for (k, answer) in keys.iter().zip(answers) {
        assert_eq!(
            answer.status,
            pb::Status::Unavailable as i32,
            "{k}: {answer:?}"
        );
        assert_eq!(
            answer.reason,
            pb::Reason::NotReady as i32,
            "{k}: {answer:?}"
        );
    }
}

/// One hit on `k` (limit `limit`, ten minutes), its answer.
async fn check_one(
    client: &mut sluice::proto::v1::rate_limiter_client::RateLimiterClient<
        tonic::transport::Channel,
    >,
    k: &str,
    limit: i64,
) -> pb::RateLimitResponse {
    check(client, vec![inline("alone", k, limit, 600_000)])
        .await
        .unwrap()
        .remove(0)
}

async fn readyz(p: &Proc) -> u16 {
    http_get(&format!("http://{}/readyz", p.http)).await.0
}

#[tokio::test(flavor = "multi_thread")]
async fn a_joining_node_is_not_serving_and_decides_nothing_until_it_joined() {
    let gossip = ports(2);
    let env = [("SLUICE_CLUSTER__GOSSIP_INTERVAL", GOSSIP_INTERVAL)];
    // Its only seed (b) is not up yet.
    let a = spawn("ready-a", gossip[0], &gossip[1..], &env);
    let until = std::time::Instant::now() + SETTLE;
    let first = loop {
        if let Some(status) = health(&a, "").await {
            break status;
        }
        assert!(
            std::time::Instant::now() < until,
            "a's gRPC port answers health checks"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(first, ServingStatus::NotServing, "health while joining");
    assert_eq!(
        health(&a, "sluice.v1.RateLimiter").await,
        Some(ServingStatus::NotServing)
    );
    assert_eq!(readyz(&a).await, 503);

    // Keys checked now: none decided (so none consumed), each says why.
    let keys: Vec<String> = (0..20).map(|i| format!("early-{i}")).collect();
    let requests = keys.iter().map(|k| inline("ready", k, 1, 60_000)).collect();
    let answers = check(&mut a.client().await, requests)
        .await
        .expect("a answers while joining");
    // Still joining when it answered (or the answers prove nothing).
    assert_eq!(health(&a, "").await, Some(ServingStatus::NotServing));
    assert_all_not_ready(&keys, &answers);

    // The seed comes up: a joins, and says so on both probes.
    let b = spawn("ready-b", gossip[1], &gossip[..1], &env);
    eventually("a serving once joined", SETTLE, || async {
        health(&a, "").await == Some(ServingStatus::Serving)
    })
    .await;
    assert_eq!(readyz(&a).await, 200);
    eventually("b serving once joined", SETTLE, || async {
        health(&b, "").await == Some(ServingStatus::Serving)
    })
    .await;

    // Every early key is still whole: a limit of 1 admits its first hit
    // now, exactly (nothing was taken from it while a was joining), and
    // refuses the second, through either node.
    for (k, via) in keys.iter().zip([&a, &b].into_iter().cycle()) {
        let mut client = via.client().await;
        for want in [pb::Status::UnderLimit, pb::Status::OverLimit] {
            let answer = check(&mut client, vec![inline("ready", k, 1, 60_000)])
                .await
                .unwrap()
                .remove(0);
            assert_eq!(answer.status, want as i32, "{k}: {answer:?}");
            assert!(!answer.approximate, "{k}: {answer:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leaving_node_stops_serving_before_it_goes() {
    let gossip = ports(1);
    let mut a = spawn("leaving-a", gossip[0], &[], &[]);
    eventually("a serving", SETTLE, || async {
        health(&a, "").await == Some(ServingStatus::Serving)
    })
    .await;
    // SIGTERM: the node leaves (announces it, hands off) and exits; it is
    // not ready from the moment it starts leaving. Watch the probe over one
    // connection until the process is gone.
    let mut watch = watch_health(&a).await;
    let serving = watch.message().await.unwrap().unwrap();
    assert_eq!(serving.status, ServingStatus::Serving as i32);
    assert!(a.signal("TERM"));
    let next = tokio::time::timeout(SETTLE, watch.message())
        .await
        .expect("health changes once the node leaves")
        .expect("the node says so before its server stops");
    assert_eq!(
        next.map(|n| n.status),
        Some(ServingStatus::NotServing as i32)
    );
    // Then the stream ends — the node drops its statuses at shutdown, so
    // an open Watch does not hold the graceful server up — and the node
    // exits.
    let end = tokio::time::timeout(SETTLE, watch.message())
        .await
        .expect("the watch ends with the node");
    assert!(
        matches!(end, Ok(None) | Err(_)),
        "nothing after NOT_SERVING: {end:?}"
    );
    let exit = exit_of(&mut a).await;
    assert!(exit.success(), "a exits cleanly: {exit:?}");
}

/// A node is stopped while it still joins (Kubernetes may send SIGTERM to
/// a pod that never became ready): it stops cleanly, as from any other
/// state, not by the signal's default action, and without ever turning
/// ready (which would move keys to it only to hand them straight back).
/// Before the fix, `serve` listened for SIGTERM only once `start` returned,
/// and this process died of the signal; with the signal heard but the
/// start not cut short, it said `SERVING` once its join wait ended.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_stopped_while_joining_exits_cleanly() {
    let gossip = ports(2);
    let env = [("SLUICE_CLUSTER__GOSSIP_INTERVAL", GOSSIP_INTERVAL)];
    // Its only seed never comes up: it stays joining.
    let log_path = std::env::temp_dir().join(format!("sluice-joining-a-{}.log", gossip[0]));
    let log = std::fs::File::create(&log_path).unwrap();
    let mut a = spawn_logged("joining-a", gossip[0], &gossip[1..], &env, log);
    let until = std::time::Instant::now() + SETTLE;
    while health(&a, "").await.is_none() {
        assert!(
            std::time::Instant::now() < until,
            "a's gRPC port answers health checks"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Still joining when it is told to stop (or the test proves nothing).
    assert_eq!(readyz(&a).await, 503);
    let mut watch = watch_health(&a).await;
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(first.status, ServingStatus::NotServing as i32);
    assert!(a.signal("TERM"));
    // Every status it says until the stream ends with the node.
    let mut said = Vec::new();
    while let Ok(Ok(Some(m))) = tokio::time::timeout(SETTLE, watch.message()).await {
        said.push(m.status);
    }
    assert!(
        !said.contains(&(ServingStatus::Serving as i32)),
        "never ready after SIGTERM: {said:?}"
    );
    let exit = exit_of(&mut a).await;
    assert!(exit.success(), "a exits cleanly: {exit:?}");
    // Its own word that it never served as ready (a health watch can miss
    // a moment of `SERVING` between two updates; the log cannot).
    let log = std::fs::read_to_string(&log_path).unwrap();
    let _ = std::fs::remove_file(&log_path);
    assert!(log.contains("stopped before it joined"), "{log}");
    assert!(!log.contains("serving"), "{log}");
}

/// Issue 39 item 4: a node of a running cluster restarted where it reaches
/// no peer (here a wrong secret, as after a botched rotation; a partition
/// or seeds whose DNS does not answer yet look the same to it) stays
/// joining however long it waits — `NOT_SERVING`, 503, `NOT_READY` — and
/// never owns keys from empty counts. The old wait started it alone after
/// 10 gossip rounds (1 s here), a cluster of one beside the real one.
/// Restarted with the right secret, it joins, and every key's count is
/// whole through it.
#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_node_that_reaches_no_peer_never_starts_alone() {
    let gossip = ports(3);
    let names = ["alone-a", "alone-b", "alone-c"];
    let mut nodes: Vec<Proc> = (0..3)
        .map(|i| spawn(names[i], gossip[i], &gossip, &[]))
        .collect();
    for p in &nodes {
        eventually("serving", SETTLE, || async {
            health(p, "").await == Some(ServingStatus::Serving)
        })
        .await;
    }
    const LIMIT: i64 = 3;
    let keys: Vec<String> = (0..12).map(|i| format!("spent-{i}")).collect();
    let mut client = nodes[0].client().await;
    for k in &keys {
        for _ in 0..LIMIT {
            let answer = check_one(&mut client, k, LIMIT).await;
            assert_eq!(
                answer.status,
                pb::Status::UnderLimit as i32,
                "{k}: {answer:?}"
            );
        }
    }

    // Replicated (a crash loses what its owner admitted within its last
    // replication lag; this test is not about that): each key held spent
    // by two nodes.
    for k in &keys {
        eventually("spent on owner and replica holder", SETTLE, || async {
            let mut spent = 0;
            for p in &nodes {
                spent += usize::from(inspect_remaining(p, "alone", k).await == Some(0));
            }
            spent >= 2
        })
        .await;
    }

    // c killed, and restarted speaking another secret: it hears no one.
    nodes.pop();
    let wrong = [("SLUICE_CLUSTER__SECRET", "not-the-cluster-secret")];
    let c = spawn(names[2], gossip[2], &gossip, &wrong);
    let until = std::time::Instant::now() + SETTLE;
    while health(&c, "").await.is_none() {
        assert!(std::time::Instant::now() < until, "c's gRPC port answers");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Watched for 4 s, four times the old wait: never ready, and no key
    // decided from nothing.
    let window = std::time::Instant::now() + Duration::from_secs(4);
    let mut via_c = c.client().await;
    while std::time::Instant::now() < window {
        assert_eq!(health(&c, "").await, Some(ServingStatus::NotServing));
        assert_eq!(readyz(&c).await, 503);
        let requests = keys
            .iter()
            .map(|k| inline("alone", k, LIMIT, 600_000))
            .collect();
        let answers = check(&mut via_c, requests).await.expect("c answers");
        assert_all_not_ready(&keys, &answers);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(c);

    // With the right secret it joins; every key is spent, through any node.
    nodes.push(spawn(names[2], gossip[2], &gossip, &[]));
    for p in &nodes {
        eventually("serving after c rejoined", SETTLE, || async {
            health(p, "").await == Some(ServingStatus::Serving)
        })
        .await;
    }
    for (k, via) in keys.iter().zip(nodes.iter().cycle()) {
        let mut client = via.client().await;
        let answer = check_one(&mut client, k, LIMIT).await;
        assert_eq!(
            answer.status,
            pb::Status::OverLimit as i32,
            "{k} via {}: {answer:?}",
            via.id
        );
        assert!(!answer.approximate, "{k} via {}: {answer:?}", via.id);
    }
}
