//! Tiered mode for hot keys: one key hammered through three nodes at 10×
//! its limit, evenly and unevenly. Asserted: over-admission (DESIGN §7)
//! within 5%, the busy node's admitted share within 10 points of its share
//! of the demand, most decisions without a hop, every answer saying which
//! path decided. The figures are printed (`-- --nocapture`). One key per
//! test, so every bound is a per-key bound; callers set the load tests'
//! deadline (100 ms); `report_interval` is 20 ms.
//!
//! Real time (the nodes' clocks are driven by it): a token bucket of
//! `RATE`/s with a burst of `RATE`, offered 10× that for `SECONDS`. The
//! exact reference admits `burst + RATE × elapsed`.

mod common;

use std::time::{Duration, Instant};

use common::{TestNode, cluster, inline, metric_sum, under};
use sluice::proto::v1 as pb;

const RATE: i64 = 200;
const SECONDS: u64 = 4;

/// The exact token bucket's admissions over `elapsed` (its burst once,
/// then the rate: an upper bound when load paused), and the over-admission
/// against it.
fn against_exact(admitted: i64, elapsed: Duration) -> (f64, f64) {
    let exact = RATE as f64 * (1.0 + elapsed.as_secs_f64());
    (exact, admitted as f64 / exact - 1.0)
}

struct Run {
    /// Per node: offered, admitted.
    per_node: Vec<(i64, i64)>,
    /// Answers by `pb::Path`.
    paths: [i64; 5],
    elapsed: Duration,
}

/// `weights[i]` items per round to node `i`, rounds paced so the total is
/// 10× the rate, for `SECONDS`.
async fn hammer(nodes: &[&TestNode], key: &str, weights: &[usize], seconds: u64) -> Run {
    let mut run = Run {
        per_node: vec![(0, 0); nodes.len()],
        paths: [0; 5],
        elapsed: Duration::ZERO,
    };
    let per_round: usize = weights.iter().sum();
    let pace = Duration::from_secs_f64(per_round as f64 / (10 * RATE) as f64);
    let mut tick = tokio::time::interval(pace);
    let started = Instant::now();
    let mut round = 0;
    while started.elapsed() < Duration::from_secs(seconds) {
        tick.tick().await;
        // Each round's calls leave in a rotated order: in lockstep rounds
        // the node always asked first would take every token that refilled
        // since the last round (a bias of the harness, not of the limiter:
        // real callers do not move in rounds). Seen: node-0 admitted 43.5%
        // on an even third of the demand, once in six runs.
        round += 1;
        let order: Vec<usize> = (0..nodes.len())
            .map(|j| (j + round) % nodes.len())
            .collect();
        let calls = order.iter().map(|&i| (nodes[i], weights[i])).map(|(n, w)| {
            let mut r = inline("hot", key, RATE, 1_000);
            r.mode = pb::Mode::Tiered as i32;
            let mut client = n.client();
            async move {
                let mut request = tonic::Request::new(pb::CheckRequest {
                    requests: vec![r; w],
                });
                request.set_timeout(common::load::DEADLINE);
                client
                    .check(request)
                    .await
                    .expect("answered")
                    .into_inner()
                    .responses
            }
        });
        for (i, responses) in order
            .iter()
            .copied()
            .zip(futures::future::join_all(calls).await)
        {
            for r in responses {
                // Every caller answered: no error, never UNAVAILABLE.
                assert!(r.error.is_none(), "{r:?}");
                assert_ne!(r.status, pb::Status::Unavailable as i32, "{r:?}");
                run.per_node[i].0 += 1;
                run.per_node[i].1 += i64::from(under(&r));
                run.paths[r.path as usize] += 1;
            }
        }
    }
    run.elapsed = started.elapsed();
    run
}

async fn run(weights: &[usize], label: &str) {
    let nodes = cluster(3, |c| {
        c.cluster.report_interval = Duration::from_millis(20);
    })
    .await;
    // Demand is hits per second: the clocks move with real time.
    let clocks = common::drive_clocks(&nodes);
    // A key node-0 does not own, so node-0 is an edge.
    let key = common::load::keys_owned_by(&["node-0", "node-1", "node-2"], "hot", 1)[1].clone();
    let Run {
        per_node,
        paths,
        elapsed,
    } = hammer(&nodes.iter().collect::<Vec<_>>(), &key, weights, SECONDS).await;
    clocks.abort();
    let admitted: i64 = per_node.iter().map(|p| p.1).sum();
    let offered: i64 = per_node.iter().map(|p| p.0).sum();
    let (exact, over) = against_exact(admitted, elapsed);
    let demand_share = weights[0] as f64 / weights.iter().sum::<usize>() as f64;
    let admitted_share = per_node[0].1 as f64 / admitted.max(1) as f64;
    let local = paths[pb::Path::LocalAllotment as usize];
    let grants: f64 = nodes
        .iter()
        .map(|n| {
            metric_sum(
                &n.node.limiter.metrics().render(),
                "sluice_tiered_grants_total",
            )
        })
        .sum();
    println!(
        "tiered {label}: offered {offered} in {elapsed:.2?} ({:.1}x the rate), admitted \
         {admitted} of exact {exact:.0} (over-admission {:+.2}%); node-0 demand {:.0}%, \
         admitted {:.0}%; per node (offered, admitted) {per_node:?}; paths: owner {}, \
         local {local}, slow {}, fallback {}; grants {grants}",
        offered as f64 / elapsed.as_secs_f64() / RATE as f64,
        over * 100.0,
        demand_share * 100.0,
        admitted_share * 100.0,
        paths[pb::Path::Owner as usize],
        paths[pb::Path::Slow as usize],
        paths[pb::Path::Fallback as usize],
    );
    assert!(over <= 0.05, "over-admission {over:.4} within 5%");
    assert!(
        (admitted_share - demand_share).abs() <= 0.10,
        "node-0's admitted share {admitted_share:.3} tracks its demand {demand_share:.3}"
    );
    assert_eq!(
        paths[pb::Path::Fallback as usize],
        0,
        "no owner was unreachable"
    );
    let edges_offered = offered - per_node[1].0;
    assert!(
        local * 2 > edges_offered,
        "most edge decisions without a hop ({local} of {edges_offered})"
    );
    // A lower bound by nature: how many allotments the owner grants
    // depends on real-time demand and report timing (driven clocks). The
    // figures that matter — over-admission, shares, local decisions — are
    // bounded above.
    assert!(grants >= 1.0, "the owner granted allotments");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hot_key_at_ten_times_its_limit_evenly() {
    run(&[3, 3, 3], "even").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hot_key_at_ten_times_its_limit_eighty_percent_on_one_node() {
    run(&[8, 1, 1], "uneven").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_owner_killed_mid_load_leaves_no_caller_unanswered() {
    let mut nodes = cluster(3, |c| {
        c.cluster.report_interval = Duration::from_millis(20);
        c.cluster.forward_timeout = Duration::from_millis(200);
    })
    .await;
    let clocks = common::drive_clocks(&nodes);
    let key = common::load::keys_owned_by(&["node-0", "node-1", "node-2"], "hot", 1)[1].clone();
    // Two edges, the owner (node-1) hammered too, then killed.
    let before = hammer(&nodes.iter().collect::<Vec<_>>(), &key, &[3, 3, 3], 1).await;
    let owner = nodes.remove(1);
    owner.node.kill().await;
    let after = hammer(&nodes.iter().collect::<Vec<_>>(), &key, &[3, 3], 3).await;
    clocks.abort();
    let admitted: i64 = before
        .per_node
        .iter()
        .chain(&after.per_node)
        .map(|p| p.1)
        .sum();
    let elapsed = before.elapsed + after.elapsed;
    let (exact, over) = against_exact(admitted, elapsed);
    println!(
        "tiered, owner killed: admitted {admitted} of exact {exact:.0} in {elapsed:.2?} \
         (over-admission {:+.2}%); after the kill, paths: owner {}, local {}, slow {}, \
         fallback {}",
        over * 100.0,
        after.paths[pb::Path::Owner as usize],
        after.paths[pb::Path::LocalAllotment as usize],
        after.paths[pb::Path::Slow as usize],
        after.paths[pb::Path::Fallback as usize],
    );
    // The fallback issue's bound for an owner crash near the limit: 10%.
    assert!(over <= 0.10, "over-admission {over:.4} within 10%");
    // Presence only, by nature: each survivor's share of a rate on real
    // time depends on scheduling; the total is bounded above.
    assert!(
        after.per_node.iter().all(|p| p.1 > 0),
        "both survivors kept admitting: {:?}",
        after.per_node
    );
}

/// The key moves to the joining node mid-load. (This once showed +9.5% in
/// about one run in three: the joiner's first rings were partial, named it
/// the previous owner of keys it never had, and it started the key fresh.)
#[tokio::test(flavor = "multi_thread")]
async fn scale_out_mid_load_keeps_the_bound() {
    let tweak = |c: &mut sluice::config::Config| {
        c.cluster.report_interval = Duration::from_millis(20);
    };
    let mut nodes = cluster(3, tweak).await;
    let origin = Instant::now();
    let clocks = common::drive_clocks_since(&nodes, origin);
    // A key the fourth node will own: the key moves mid-load.
    let ids = ["node-0", "node-1", "node-2", "node-3"];
    let key = common::load::keys_owned_by(&ids, "hot", 1)[3].clone();
    let before = hammer(&nodes.iter().collect::<Vec<_>>(), &key, &[3, 3, 3], 2).await;
    let mut c = common::config();
    c.node_id = "node-3".into();
    c.cluster.secret = Some("test-secret".into());
    c.cluster.seeds = vec![nodes[0].node.gossip_addr.to_string()];
    tweak(&mut c);
    nodes.push(common::start(c).await);
    clocks.abort();
    let clocks = common::drive_clocks_since(&nodes, origin);
    common::eventually(
        "every ring holds four nodes",
        Duration::from_secs(20),
        || async {
            nodes
                .iter()
                .all(|n| n.node.limiter.ring().members().len() == 4)
        },
    )
    .await;
    let after = hammer(&nodes.iter().collect::<Vec<_>>(), &key, &[3, 3, 3, 3], 3).await;
    clocks.abort();
    let admitted: i64 = before
        .per_node
        .iter()
        .chain(&after.per_node)
        .map(|p| p.1)
        .sum();
    let elapsed = origin.elapsed();
    let (exact, over) = against_exact(admitted, elapsed);
    let local = after.paths[pb::Path::LocalAllotment as usize];
    println!(
        "tiered, scale-out 3 -> 4: admitted {admitted} of exact {exact:.0} in {elapsed:.2?} \
         (over-admission {:+.2}%); after: per node {:?}, local {local}, slow {}, owner {}",
        over * 100.0,
        after.per_node,
        after.paths[pb::Path::Slow as usize],
        after.paths[pb::Path::Owner as usize],
    );
    assert!(over <= 0.05, "over-admission {over:.4} within 5%");
    // Presence only, by nature: each node's share of a rate on real time
    // depends on scheduling; the total is bounded above.
    assert!(
        after.per_node.iter().all(|p| p.1 > 0),
        "the new node got a share: {:?}",
        after.per_node
    );
}
