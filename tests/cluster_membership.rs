//! Gossip membership on 127.0.0.1: join, ready, graceful leave within 1 s,
//! crash detection (the measured figure is printed), a wrong secret never
//! joins, and a restart counts once in `N`.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::eventually;
use sluice::cluster::auth::Secret;
use sluice::cluster::membership::{ClusterView, Lifecycle, Membership, MembershipConfig};

const WAIT: Duration = Duration::from_secs(20);

async fn start(id: &str, generation: u64, seeds: &[String], secret: &[u8]) -> (Membership, String) {
    use sluice::net::Network;
    let socket = sluice::net::Os
        .datagrams("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = socket.local_addr().unwrap();
    let m = Membership::start(MembershipConfig {
        cluster_id: "test".into(),
        node_id: id.into(),
        generation,
        gossip_socket: socket,
        gossip_advertise: addr,
        seeds: seeds.to_vec(),
        bootstrap_expect: 2,
        zone: String::new(),
        secret: Secret::new(Some(secret)),
        gossip_interval: Duration::from_millis(100),
        phi_threshold: 8.0,
        dead_grace: Duration::from_secs(3_600),
        grpc_advertise: format!("{id}.grpc:8081"),
        policy_hash: "p".into(),
        faults: Default::default(),
        protocol: sluice::proto::PEER_PROTOCOL_VERSION,
        clock: Arc::new(sluice::clock::SystemClock::new()),
        threads: sluice::threads::Threads::Own,
    })
    .await
    .unwrap();
    (m, addr.to_string())
}

fn ring_ids(v: &ClusterView) -> Vec<String> {
    v.ring
        .members()
        .iter()
        .map(|m| m.node_id.to_string())
        .collect()
}

async fn until_ring(nodes: &[&Membership], want: &[&str], what: &str) {
    eventually(what, WAIT, || async {
        nodes.iter().all(|n| ring_ids(&n.view()) == want)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn join_leave_and_crash() {
    let (a, seed) = start("a", 1, &[], b"s3cret").await;
    let (b, _) = start("b", 1, std::slice::from_ref(&seed), b"s3cret").await;
    let (c, _) = start("c", 1, std::slice::from_ref(&seed), b"s3cret").await;
    let all = [&a, &b, &c];
    eventually("three live members", WAIT, || async {
        all.iter().all(|n| n.view().members.len() == 3)
    })
    .await;
    // Joining members are not in the ring yet.
    assert!(ring_ids(&a.view()).is_empty());
    for n in all {
        n.set_state(Lifecycle::Ready).await;
    }
    until_ring(&all, &["a", "b", "c"], "a ring of three").await;
    assert_eq!(a.view().size, 3);
    let epoch = a.view().ring.epoch();
    assert!(
        all.iter().all(|n| n.view().ring.epoch() == epoch),
        "one epoch everywhere"
    );

    // Graceful leave: out of every ring within 1 s.
    let started = Instant::now();
    c.set_state(Lifecycle::Leaving).await;
    until_ring(&[&a, &b], &["a", "b"], "c out of the rings").await;
    let left = started.elapsed();
    println!("graceful leave: out of every ring after {left:?}");
    assert!(
        left < Duration::from_secs(1),
        "graceful leave took {left:?}"
    );
    assert_eq!(a.view().size, 2, "a leaving node shrinks N at once");
    c.shutdown().await;

    // Crash: b stops gossiping without a word. a suspects it, but a
    // burial takes a majority of N = 2, which a alone is not: b keeps its
    // place in the ring (no one takes its keys on one detector's word)
    // and a, hearing 1 of 2, is in a minority (every key on leases).
    let started = Instant::now();
    b.shutdown().await;
    eventually("b suspected", WAIT, || async {
        a.view().member("b").is_some_and(|m| m.suspected)
    })
    .await;
    println!("crash: suspected after {:?}", started.elapsed());
    assert_eq!(
        ring_ids(&a.view()),
        ["a", "b"],
        "unburied: still in the ring"
    );
    assert!(!a.view().has_majority());
    // b died without leaving: it still counts in N (a partitioned node must
    // not conclude it is alone); c left, so it does not.
    assert_eq!(a.view().size, 2);
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_secret_never_joins() {
    let (a, seed) = start("a", 1, &[], b"right").await;
    let (intruder, _) = start("x", 1, std::slice::from_ref(&seed), b"wrong").await;
    let (b, _) = start("b", 1, std::slice::from_ref(&seed), b"right").await;
    for n in [&a, &b, &intruder] {
        n.set_state(Lifecycle::Ready).await;
    }
    until_ring(&[&a, &b], &["a", "b"], "a and b see each other").await;
    // Keep gossiping for a while: the intruder's datagrams are dropped.
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        for n in [&a, &b] {
            assert!(n.view().member("x").is_none(), "the intruder got in");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        ring_ids(&intruder.view()),
        ["x"],
        "the intruder sees only itself"
    );
    for n in [a, b, intruder] {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_is_not_two_nodes() {
    let (a, seed) = start("a", 1, &[], b"k").await;
    let (b1, _) = start("b", 1, std::slice::from_ref(&seed), b"k").await;
    a.set_state(Lifecycle::Ready).await;
    b1.set_state(Lifecycle::Ready).await;
    until_ring(&[&a], &["a", "b"], "a and b").await;
    b1.shutdown().await;
    let (b2, _) = start("b", 2, std::slice::from_ref(&seed), b"k").await;
    b2.set_state(Lifecycle::Ready).await;
    eventually("b's new generation in a's ring", WAIT, || async {
        a.view().ring.member("b").is_some_and(|m| m.generation == 2)
    })
    .await;
    let v: Arc<ClusterView> = a.view();
    assert_eq!(v.size, 2, "{v:?}");
    a.shutdown().await;
    b2.shutdown().await;
}
