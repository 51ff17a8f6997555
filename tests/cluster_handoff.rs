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
