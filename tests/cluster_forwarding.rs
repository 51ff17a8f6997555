//! In-process clusters on 127.0.0.1: every key decided by exactly one owner
//! whichever node is asked, batched forwards, redirects, deadlines, and
//! refused unauthenticated peer calls.

mod common;

use std::time::Duration;

use common::{cluster, eventually, inline, under};
use sluice::proto::peer as peer_pb;
use sluice::proto::peer::peer_client::PeerClient;
use sluice::proto::v1 as pb;
use sluice::store::key;

#[tokio::test(flavor = "multi_thread")]
async fn one_key_through_every_node_admits_exactly_its_limit() {
    let nodes = cluster(3, |_| {}).await;
    let mut admitted = 0;
    let mut owners = std::collections::BTreeSet::new();
    for i in 0..300 {
        let r = nodes[i % 3]
            .check(inline("api", "hot-key", 100, 60_000))
            .await;
        assert!(r.error.is_none(), "{r:?}");
        assert!(!r.approximate, "an exact count never answers approximately");
        assert_ne!(r.status, pb::Status::Unavailable as i32, "{r:?}");
        admitted += usize::from(under(&r));
        owners.insert(r.owner);
    }
    assert_eq!(admitted, 100);
    assert_eq!(owners.len(), 1, "one owner decides the key: {owners:?}");
    let owner = owners.into_iter().next().unwrap();
    let k = key::encode("api", "hot-key");
    for n in &nodes {
        assert_eq!(
            &*n.node.limiter.ring().owner(&k).unwrap().node_id,
            owner.as_str()
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_keys_each_admit_exactly_their_limit_in_batches() {
    let nodes = cluster(3, |_| {}).await;
    // Every node sends, concurrently, 8 checks for each of 1,000 keys with
    // limit 5, in Check calls of 100 items: forwards batch across calls.
    let mut tasks = Vec::new();
    for node in &nodes {
        for _ in 0..8 {
            let client = node.client();
            tasks.push(tokio::spawn(async move {
                let mut client = client;
                let mut answers = Vec::new();
                for chunk in 0..10 {
                    let requests = (0..100)
                        .map(|i| inline("many", &format!("k{}", chunk * 100 + i), 5, 60_000))
                        .collect();
                    let r = client
                        .check(pb::CheckRequest { requests })
                        .await
                        .unwrap()
                        .into_inner();
                    for (i, a) in r.responses.into_iter().enumerate() {
                        answers.push((chunk * 100 + i, a));
                    }
                }
                answers
            }));
        }
    }
    let mut admitted = vec![0; 1_000];
    for t in tasks {
        for (k, a) in t.await.unwrap() {
            assert!(a.error.is_none() && !a.approximate, "{a:?}");
            assert_ne!(a.status, pb::Status::Unavailable as i32, "{a:?}");
            admitted[k] += usize::from(under(&a));
        }
    }
    assert!(admitted.iter().all(|&a| a == 5), "{admitted:?}");
    // Forwards carried many items per RPC.
    let metrics = nodes[0].http_get("/metrics").await.1;
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    let (items, rpcs) = (
        value("sluice_forward_batch_size_sum"),
        value("sluice_forward_batch_size_count"),
    );
    println!("node-0 forwarded {items} items in {rpcs} RPCs");
    // Each of its 8 callers' checks of a key node-0 does not own went to
    // the owner exactly once (forwards are never retried; every answer
    // above was exact), and no others.
    let ring = nodes[0].node.limiter.ring();
    let not_owned = (0..1_000)
        .filter(|i| {
            &*ring
                .owner(&key::encode("many", &format!("k{i}")))
                .unwrap()
                .node_id
                != "node-0"
        })
        .count();
    assert_eq!(items, (8 * not_owned) as f64, "items node-0 forwarded");
    assert!(
        rpcs >= 1.0 && items / rpcs >= 4.0,
        "{items} items in {rpcs} RPCs"
    );
}

fn forward_item(name: &str, k: &str, redirected: bool, deadline_ns: u64) -> peer_pb::ForwardItem {
    peer_pb::ForwardItem {
        name: name.into(),
        unique_key: k.into(),
        limit: Some(peer_pb::Limit {
            algorithm: pb::Algorithm::TokenBucket as i32,
            limit: 10,
            duration_ns: 60_000_000_000,
            ..Default::default()
        }),
        hits: 1,
        redirected,
        deadline_ns,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn owners_redirect_what_they_do_not_own_and_drop_late_items() {
    let nodes = cluster(3, |_| {}).await;
    let ring = nodes[0].node.limiter.ring();
    // A key node-0 does not own.
    let (k, owner) = (0..)
        .map(|i| format!("key-{i}"))
        .map(|k| {
            let o = ring
                .owner(&key::encode("r", &k))
                .unwrap()
                .node_id
                .to_string();
            (k, o)
        })
        .find(|(_, o)| o != "node-0")
        .unwrap();
    let secret = sluice::cluster::auth::Secret::new(Some(b"test-secret"));
    let mut client = PeerClient::new(nodes[0].channel.clone());
    let call = |items| {
        let mut req = tonic::Request::new(peer_pb::ForwardRequest {
            protocol_version: sluice::proto::PEER_PROTOCOL_VERSION,
            from_node: "test".into(),
            items,
            ..Default::default()
        });
        let token = secret.peer_token("test").unwrap();
        req.metadata_mut()
            .insert("x-sluice-peer", token.parse().unwrap());
        req
    };
    let far = u64::MAX;
    let r = client
        .forward(call(vec![
            forward_item("r", &k, false, far),
            forward_item("r", &k, true, far),
            forward_item("r", &k, true, 1),
        ]))
        .await
        .unwrap()
        .into_inner()
        .results;
    use peer_pb::forward_result::Result as R;
    match &r[0].result {
        Some(R::Redirect(to)) => assert_eq!(to.node_id, owner),
        other => panic!("expected a redirect, got {other:?}"),
    }
    // A node decides only keys its own ring gives it, redirected or not
    // (callers follow at most two redirects, then decide without the
    // owner): never two counts for one key.
    match &r[1].result {
        Some(R::Redirect(to)) => assert_eq!(to.node_id, owner),
        other => panic!("expected a redirect, got {other:?}"),
    }
    assert!(
        nodes[0].node.limiter.store().is_empty(),
        "node-0 counted nothing"
    );
    assert!(matches!(r[2].result, Some(R::Expired(_))), "{:?}", r[2]);
}

#[tokio::test(flavor = "multi_thread")]
async fn peer_calls_without_the_secret_are_refused() {
    let nodes = cluster(2, |_| {}).await;
    let mut client = PeerClient::new(nodes[0].channel.clone());
    let request = || peer_pb::ForwardRequest {
        protocol_version: sluice::proto::PEER_PROTOCOL_VERSION,
        items: vec![forward_item("x", "y", true, u64::MAX)],
        ..Default::default()
    };
    let err = client.forward(request()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
    let mut forged = tonic::Request::new(request());
    let token = sluice::cluster::auth::Secret::new(Some(b"guess"))
        .peer_token("node-1")
        .unwrap();
    forged
        .metadata_mut()
        .insert("x-sluice-peer", token.parse().unwrap());
    let err = client.forward(forged).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
    assert!(
        nodes[0].node.limiter.store().is_empty(),
        "nothing was decided"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn rings_converge_after_a_leave_and_a_crash() {
    let mut nodes = cluster(4, |_| {}).await;
    let gone = nodes.pop().unwrap();
    gone.node.leave().await;
    eventually(
        "node-3 out after its leave",
        Duration::from_secs(5),
        || async {
            nodes
                .iter()
                .all(|n| n.node.limiter.ring().members().len() == 3)
        },
    )
    .await;
    let crashed = nodes.pop().unwrap();
    crashed.node.kill().await;
    eventually(
        "node-2 out after its crash",
        Duration::from_secs(20),
        || async {
            nodes
                .iter()
                .all(|n| n.node.limiter.ring().members().len() == 2)
        },
    )
    .await;
    let epochs: Vec<u64> = nodes
        .iter()
        .map(|n| n.node.limiter.ring().epoch())
        .collect();
    assert!(epochs.windows(2).all(|w| w[0] == w[1]), "{epochs:?}");
    // The survivors still enforce one limit together.
    let mut admitted = 0;
    for i in 0..20 {
        admitted += usize::from(under(
            &nodes[i % 2].check(inline("after", "k", 10, 60_000)).await,
        ));
    }
    assert_eq!(admitted, 10);
}

/// Issue 39, item 7: an edge whose clock is behind reports hits stamped in
/// the owner's past. Absorbed at that time, a token bucket would have
/// refilled them already (10 hits "spent 10 s ago" on a 10-per-10-s key
/// leave it full); counted at the owner's now, they leave it empty.
#[tokio::test(flavor = "multi_thread")]
async fn a_report_from_an_edge_whose_clock_is_behind_counts_at_the_owners_now() {
    let nodes = cluster(2, |_| {}).await;
    let ring = nodes[0].node.limiter.ring();
    // A key node-0 owns; node-1 reports spending on it.
    let k = (0..)
        .map(|i| format!("k{i}"))
        .find(|k| {
            ring.owner(&key::encode("skewed", k))
                .unwrap()
                .node_id
                .as_ref()
                == "node-0"
        })
        .unwrap();
    let node = &nodes[0];
    let secret = sluice::cluster::auth::Secret::new(Some(b"test-secret"));
    let mut client = PeerClient::new(node.channel.clone());
    let behind = common::BASE - 10_000_000_000;
    let mut req = tonic::Request::new(peer_pb::ReportRequest {
        protocol_version: sluice::proto::PEER_PROTOCOL_VERSION,
        from_node: "node-1".into(),
        items: vec![peer_pb::ReportItem {
            name: "skewed".into(),
            unique_key: k.clone(),
            limit: Some(peer_pb::Limit {
                algorithm: pb::Algorithm::TokenBucket as i32,
                limit: 10,
                duration_ns: 10_000_000_000,
                ..Default::default()
            }),
            seq: u64::MAX / 2,
            hits: 10,
            at_ns: behind,
            reset_gen: None,
        }],
    });
    req.metadata_mut().insert(
        "x-sluice-peer",
        secret.peer_token("node-1").unwrap().parse().unwrap(),
    );
    let outcomes = client.report(req).await.unwrap().into_inner().outcomes;
    assert_eq!(outcomes, vec![peer_pb::ReportOutcome::Applied as i32]);
    let mut peek = inline("skewed", &k, 10, 10_000);
    peek.hits = Some(0);
    let a = node.check(peek).await;
    assert!(!a.approximate);
    assert_eq!(a.remaining, 0, "the reported hits count now: {a:?}");
}

/// Issue 39, item 2, the owner's side: a report numbered at or below the
/// last one applied from its edge is answered DUPLICATE with that last
/// number, so an edge that restarted with its clock behind (its numbering
/// below its previous run's) knows how far to jump (`Leases::renumber`).
#[tokio::test(flavor = "multi_thread")]
async fn a_duplicate_report_says_what_was_applied() {
    let nodes = cluster(2, |_| {}).await;
    let ring = nodes[0].node.limiter.ring();
    let k = (0..)
        .map(|i| format!("k{i}"))
        .find(|k| {
            ring.owner(&key::encode("numbered", k))
                .unwrap()
                .node_id
                .as_ref()
                == "node-0"
        })
        .unwrap();
    let secret = sluice::cluster::auth::Secret::new(Some(b"test-secret"));
    let mut client = PeerClient::new(nodes[0].channel.clone());
    let report = |seq: u64| {
        let mut req = tonic::Request::new(peer_pb::ReportRequest {
            protocol_version: sluice::proto::PEER_PROTOCOL_VERSION,
            from_node: "node-1".into(),
            items: vec![peer_pb::ReportItem {
                name: "numbered".into(),
                unique_key: k.clone(),
                limit: Some(peer_pb::Limit {
                    algorithm: pb::Algorithm::TokenBucket as i32,
                    limit: 100,
                    duration_ns: 60_000_000_000,
                    ..Default::default()
                }),
                seq,
                hits: 1,
                at_ns: common::BASE,
                reset_gen: None,
            }],
        });
        req.metadata_mut().insert(
            "x-sluice-peer",
            secret.peer_token("node-1").unwrap().parse().unwrap(),
        );
        req
    };
    let first = client.report(report(50_000)).await.unwrap().into_inner();
    assert_eq!(first.outcomes, vec![peer_pb::ReportOutcome::Applied as i32]);
    assert_eq!(first.applied, vec![0]);
    let low = client.report(report(7)).await.unwrap().into_inner();
    assert_eq!(low.outcomes, vec![peer_pb::ReportOutcome::Duplicate as i32]);
    assert_eq!(low.applied, vec![50_000], "how far to jump");
    let mut peek = inline("numbered", &k, 100, 60_000);
    peek.hits = Some(0);
    assert_eq!(nodes[0].check(peek).await.remaining, 99, "counted once");
}
