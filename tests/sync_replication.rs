//! Synchronous replication (issue 39), on in-process 3-node clusters: a
//! `replication = "sync"` key is answered exactly only once its replica
//! holder has the decision, so the holder's copy never lags an exact
//! answer; while the holder cannot acknowledge, the key is refused (`deny`)
//! at its owner and through a forward, without a forward missing its
//! deadline (the edge's breaker for the owner stays closed); an async key
//! of the same owner and holder answers exactly all along.

mod common;

use std::time::Duration;

use common::{TestNode, cluster, eventually, under};
use sluice::config::{Config, PolicyConfig};
use sluice::proto::v1 as pb;
use sluice::store::key;

const NAME: &str = "pay";
const LIMIT: u64 = 40;

fn policies(c: &mut Config) {
    c.cluster.forward_timeout = Duration::from_millis(100);
    c.cluster.breaker_cooldown = Duration::from_millis(300);
    c.cluster.replicate_interval = Duration::from_millis(20);
    c.cluster.gossip_interval = Duration::from_millis(50);
    for (name, replication) in [("sync", "sync"), ("async", "async")] {
        c.policies.insert(
            name.into(),
            PolicyConfig {
                limit: LIMIT,
                duration: Some("365days".into()),
                on_owner_unreachable: Some("deny".into()),
                replication: Some(replication.into()),
                ..Default::default()
            },
        );
    }
}

/// A key node-0 owns whose replica node-1 holds.
fn key_of_0_held_by_1(nodes: &[TestNode], prefix: &str) -> String {
    let ring = nodes[0].node.limiter.ring();
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|k| {
            let at = key::encode(NAME, k);
            &*ring.owner(&at).unwrap().node_id == "node-0"
                && &*ring.successor(&at).unwrap().node_id == "node-1"
        })
        .unwrap()
}

fn check(k: &str, policy: &str) -> pb::RateLimitRequest {
    common::policy(NAME, k, policy)
}

fn remaining_at(node: &TestNode, k: &str) -> Option<u64> {
    node.node.limiter.inspect(NAME, k).map(|v| v.remaining)
}

fn metric(text: &str, name: &str) -> f64 {
    common::metric_sum(text, name)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sync_key_is_exact_only_with_its_replica_holder() {
    let nodes = cluster(3, policies).await;
    let sync_key = key_of_0_held_by_1(&nodes, "sync");
    let async_key = key_of_0_held_by_1(&nodes, "async");

    // Healthy, at the owner and through a forward from node-2: every
    // answer exact, and the holder's copy already shows it — no lag.
    for via in [0, 2, 0, 2, 0] {
        let a = nodes[via].check(check(&sync_key, "sync")).await;
        assert!(under(&a) && !a.approximate && a.owner == "node-0", "{a:?}");
        assert_eq!(
            remaining_at(&nodes[1], &sync_key),
            Some(a.remaining as u64),
            "the holder's copy right after an exact answer via node-{via}"
        );
    }
    let metrics = nodes[0].http_get("/metrics").await.1;
    assert_eq!(
        metric(
            &metrics,
            "sluice_sync_replica_decisions_total{outcome=\"confirmed\"}"
        ),
        5.0
    );

    // The owner cannot reach the holder: the sync key is refused at the
    // owner and through a forward, its hits still counted at the owner;
    // the async key of the same owner and holder answers exactly.
    nodes[0].node.faults.cut_grpc("node-1");
    let spent_before = LIMIT - remaining_at(&nodes[0], &sync_key).unwrap();
    for via in [0, 2, 0, 2] {
        let a = nodes[via].check(check(&sync_key, "sync")).await;
        assert_eq!(
            a.status,
            pb::Status::Unavailable as i32,
            "via node-{via}: {a:?}"
        );
        assert_eq!(a.reason, pb::Reason::OwnerUnreachable as i32, "{a:?}");
        let b = nodes[via].check(check(&async_key, "async")).await;
        assert!(under(&b) && !b.approximate && b.owner == "node-0", "{b:?}");
    }
    // A request cannot waive its policy's synchronous replication.
    let mut waive = check(&sync_key, "sync");
    waive.replication = pb::Replication::Async as i32;
    let a = nodes[0].check(waive).await;
    assert_eq!(a.status, pb::Status::Unavailable as i32, "{a:?}");
    let spent = LIMIT - remaining_at(&nodes[0], &sync_key).unwrap();
    assert_eq!(spent, spent_before + 5, "refused, but counted at the owner");
    assert!(
        remaining_at(&nodes[1], &sync_key).unwrap() > LIMIT - spent,
        "the holder never got the refused decisions"
    );
    // node-0 answered node-2's forwards in time: node-2's breaker for it
    // stays closed.
    let metrics = nodes[2].http_get("/metrics").await.1;
    assert_eq!(
        metric(&metrics, "sluice_breaker_state{peer=\"node-0\"}"),
        0.0
    );
    let metrics = nodes[0].http_get("/metrics").await.1;
    assert_eq!(
        metric(
            &metrics,
            "sluice_sync_replica_decisions_total{outcome=\"unconfirmed\"}"
        ),
        5.0
    );

    // Healed: exact again once the breaker's probe goes through, and the
    // holder's copy carries everything the owner counted.
    nodes[0].node.faults.heal();
    eventually(
        "the sync key exact again",
        Duration::from_secs(5),
        || async {
            let a = nodes[0].check(check(&sync_key, "sync")).await;
            under(&a) && !a.approximate
        },
    )
    .await;
    let a = nodes[2].check(check(&sync_key, "sync")).await;
    assert!(under(&a) && !a.approximate, "{a:?}");
    assert_eq!(remaining_at(&nodes[1], &sync_key), Some(a.remaining as u64));
    assert_eq!(remaining_at(&nodes[0], &sync_key), Some(a.remaining as u64));
}

#[tokio::test(flavor = "multi_thread")]
async fn sync_with_tiered_is_refused_naming_the_field() {
    let nodes = cluster(1, policies).await;
    let mut r = common::inline(NAME, "k", LIMIT as i64, 60_000);
    r.replication = pb::Replication::Sync as i32;
    r.mode = pb::Mode::Tiered as i32;
    let a = nodes[0].check(r.clone()).await;
    let e = a.error.expect("an item error");
    assert_eq!(e.field, "replication", "{e:?}");
    // Alone, a sync key has no replica to wait for: exact at once.
    r.mode = pb::Mode::Exact as i32;
    let a = nodes[0].check(r).await;
    assert!(under(&a) && !a.approximate, "{a:?}");
}
