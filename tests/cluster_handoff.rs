//! Ownership changes under load on in-process clusters (issue 6's table):
//! scale out 3 → 4 and in 4 → 3, and a mixed-version cluster upgraded in
//! place. A steady load offers at least 3× the limit on keys owned by every
//! node throughout; the figures (over-admission as DESIGN §7 defines it,
//! errors, approximate answers) are printed, and the bounds asserted.
//!
//! Each node's clock is frozen (a fake clock) and each limit lasts a year,
//! so nothing refills: the exact reference admits exactly `limit` per key.

mod common;

use std::time::Duration;

use common::load::{Load, keys_owned_by};
use common::{TestNode, cluster, config, eventually, start};
use sluice::config::Config;

const LIMIT: i64 = 100;
const PACE: Duration = Duration::from_millis(5);

fn settings(c: &mut Config) {
    // The gossip in tests runs every 50 ms; a leaving node answers for
    // 300 ms (the default is 500 ms).
    c.cluster.leave_grace = Duration::from_millis(300);
}

/// A node joining `nodes` (seeded by node-0) as `id`.
async fn join(nodes: &[TestNode], id: &str, tweak: impl Fn(&mut Config)) -> TestNode {
    let mut c = config();
    c.node_id = id.into();
    c.cluster.secret = Some("test-secret".into());
    c.cluster.seeds = vec![nodes[0].node.gossip_addr.to_string()];
    settings(&mut c);
    tweak(&mut c);
    start(c).await
}

async fn rings_hold(nodes: &[&TestNode], n: usize, what: &str) {
    eventually(what, Duration::from_secs(20), || async {
        nodes
            .iter()
            .all(|t| t.node.limiter.ring().members().len() == n)
    })
    .await;
}

fn targets(nodes: &[&TestNode]) -> Vec<(String, tonic::transport::Channel)> {
    nodes
        .iter()
        .map(|t| (t.node.limiter.node_id().to_string(), t.channel.clone()))
        .collect()
}

async fn metric(node: &TestNode, name: &str) -> f64 {
    let (_, text) = node.http_get("/metrics").await;
    common::metric_sum(&text, name)
}

#[tokio::test(flavor = "multi_thread")]
async fn scale_out_three_to_four_then_in_keeps_counts() {
    let nodes = cluster(3, settings).await;
    // Keys owned by each of the four nodes of the larger ring: the third of
    // them that move to node-3 and back, and the rest that stay.
    let ids = ["node-0", "node-1", "node-2", "node-3"];
    let keys = keys_owned_by(&ids, "scale", 3);
    let load = Load::start(
        "scale",
        keys,
        LIMIT,
        PACE,
        targets(&nodes.iter().collect::<Vec<_>>()),
    );
    load.until_offered(LIMIT / 3).await;

    // Scale out: node-3 joins, pulls the keys that move to it.
    let fourth = join(&nodes, "node-3", |_| {}).await;
    let all: Vec<&TestNode> = nodes.iter().chain([&fourth]).collect();
    rings_hold(&all, 4, "every ring to hold four nodes").await;
    load.add_target("node-3", fourth.channel.clone());
    let at_out = load.snapshot().min_offered();
    load.until_offered(at_out + LIMIT / 3).await;
    let pulls = metric(&fourth, "sluice_pulls_total{result=\"state\"}").await;
    let mut handed = 0.0;
    for n in &nodes {
        handed += metric(n, "sluice_handed_off_states_total").await;
    }

    // Scale in: node-3 leaves and hands its keys back.
    load.drop_target("node-3").await;
    fourth.node.leave().await;
    rings_hold(
        &nodes.iter().collect::<Vec<_>>(),
        3,
        "every ring back to three",
    )
    .await;
    let at_in = load.snapshot().min_offered();
    let tally = load.finish(3 * LIMIT).await;
    let over = tally.over_admission(LIMIT);
    println!(
        "scale out 3 → 4 (at {at_out} offered per key), in 4 → 3 (at {at_in}): {}; node-3 pulled {pulls} keys and was handed {handed}",
        tally.summary(LIMIT)
    );
    assert_eq!(tally.errors, 0, "{:?}", tally.first_errors);
    assert!(over <= 0.02, "over-admission {over}");
    assert!(
        pulls + handed > 0.0,
        "the keys that moved to node-3 reached it by pull or handoff"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_mixed_version_cluster_upgraded_in_place_keeps_counts() {
    // node-2 plays the previous release: peer protocol 1 (no replicas, no
    // handoff, no Pull call).
    let old = |c: &mut Config| {
        settings(c);
        if c.node_id == "node-2" {
            c.cluster.peer_protocol = 1;
        }
    };
    let mut nodes = cluster(3, old).await;
    let ids = ["node-0", "node-1", "node-2"];
    let keys = keys_owned_by(&ids, "upgrade", 4);
    let load = Load::start(
        "upgrade",
        keys,
        LIMIT,
        PACE,
        targets(&nodes.iter().collect::<Vec<_>>()),
    );
    load.until_offered(LIMIT / 2).await;
    let mixed = load.snapshot();
    assert_eq!(
        mixed.errors, 0,
        "mixed versions answer: {:?}",
        mixed.first_errors
    );

    // Upgrade node-2 in place: it leaves as protocol 1 (its new owners
    // take its counts with a peek, the one pull protocol 1 answers), and
    // comes back speaking protocol 2 (it pulls its keys back).
    load.drop_target("node-2").await;
    let v1 = nodes.pop().unwrap();
    v1.node.leave().await;
    rings_hold(&nodes.iter().collect::<Vec<_>>(), 2, "node-2 gone").await;
    let upgraded = join(&nodes, "node-2", |_| {}).await;
    nodes.push(upgraded);
    rings_hold(&nodes.iter().collect::<Vec<_>>(), 3, "node-2 back").await;
    eventually(
        "node-2 seen speaking protocol 2",
        Duration::from_secs(10),
        || async {
            nodes.iter().all(|n| {
                n.node
                    .limiter
                    .ring()
                    .members()
                    .iter()
                    .all(|m| m.protocol == sluice::proto::PEER_PROTOCOL_VERSION)
            })
        },
    )
    .await;
    load.add_target("node-2", nodes[2].channel.clone());
    let tally = load.finish(3 * LIMIT).await;
    let over = tally.over_admission(LIMIT);
    let mut peeks = 0.0;
    // Replica lag, handoff progress and pulls are in /metrics.
    let (_, text) = nodes[0].http_get("/metrics").await;
    for name in [
        "sluice_replication_lag_microseconds ",
        "sluice_replication_pending_keys ",
        "sluice_replicated_states_total ",
        "sluice_handed_off_states_total ",
        "sluice_pulls_total{",
    ] {
        assert!(text.contains(name), "/metrics lacks {name}");
    }
    for n in &nodes[..2] {
        peeks += metric(n, "sluice_pulls_total{result=\"peek\"}").await;
    }
    println!(
        "mixed-version cluster (node-2 on protocol 1 until {} offered per key), upgraded in place: {}; {peeks} protocol-1 peeks",
        mixed.min_offered(),
        tally.summary(LIMIT)
    );
    assert_eq!(tally.errors, 0, "{:?}", tally.first_errors);
    assert!(over <= 0.02, "over-admission {over}");
    assert!(peeks > 0.0, "new owners took node-2's counts by peeking");
}
