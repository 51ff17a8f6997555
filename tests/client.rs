//! The `sluice-client` crate against an in-process node (fake clock): answers
//! from Sluice, batching of concurrent checks, and every `on_unavailable`
//! choice when the limiter cannot be reached.

mod common;

use std::time::Duration;

use common::{config, start};
use sluice_client::{Check, Client, Decision, Limit, LocalLimits, OnUnavailable, Source};

/// A loopback address nothing listens on.
fn dead_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    drop(l);
    addr
}

fn per_minute(key: &str, limit: u64) -> Check {
    Check::inline("client", key, limit, Duration::from_secs(60))
}

#[tokio::test(flavor = "multi_thread")]
async fn decisions_come_from_sluice() {
    let node = start(config()).await;
    let client = Client::builder([node.node.grpc_addr.to_string()])
        .deadline(Duration::from_secs(2))
        .build()
        .unwrap();
    let check = per_minute("alice", 10);
    for i in 0..10 {
        let d = client.check(&check).await.unwrap();
        assert!(d.allowed, "#{i}: {d:?}");
        assert_eq!(d.remaining, 9 - i);
        assert_eq!(d.source, Source::Sluice { approximate: false });
    }
    let d = client.check(&check).await.unwrap();
    assert!(!d.allowed, "the 11th of 10/min: {d:?}");
    let retry = d.retry_after.expect("a refusal says when to retry");
    assert!(
        retry > Duration::ZERO && retry <= Duration::from_secs(6),
        "{retry:?}"
    );
    assert_eq!(d.limit, 10);
    // Cost weighting: 5 of a fresh 10 leaves 5.
    let d = client.check(&per_minute("bob", 10).hits(5)).await.unwrap();
    assert_eq!((d.allowed, d.remaining), (true, 5));
    // A bad request is an error naming the field, not a decision.
    let e = client
        .check(&Check::policy("client", "carol", "no-such-policy"))
        .await
        .unwrap_err();
    assert_eq!(e.field, "policy", "{e}");
    assert_eq!(
        client
            .stats()
            .unavailable_allowed
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    // Several checks in one call, answered in order.
    let calls = || {
        client
            .stats()
            .calls
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let before = calls();
    let both = client
        .check_all(&[per_minute("dave", 3).hits(3), per_minute("dave", 3)])
        .await;
    assert_eq!(calls(), before + 1, "one call");
    let both: Vec<bool> = both.into_iter().map(|d| d.unwrap().allowed).collect();
    assert_eq!(both, [true, false], "in order: the first spends all 3");
}

/// `checks` all at once through `client`: the decisions, in order, and how
/// many `Check` calls the client has made so far.
async fn concurrently(client: &Client, checks: &[Check]) -> (Vec<Decision>, u64) {
    let tasks: Vec<_> = checks
        .iter()
        .map(|check| {
            let (client, check) = (client.clone(), check.clone());
            tokio::spawn(async move { client.check(&check).await.unwrap() })
        })
        .collect();
    let mut decisions = Vec::new();
    for t in tasks {
        decisions.push(t.await.unwrap());
    }
    let calls = client
        .stats()
        .calls
        .load(std::sync::atomic::Ordering::Relaxed);
    (decisions, calls)
}

/// 300 checks over three keys of limits 40, 41 and 42 (each key 100 times).
fn three_keys(name: &str) -> Vec<Check> {
    (0..300)
        .map(|i| per_minute(&format!("{name}-{}", i % 3), 40 + i % 3))
        .collect()
}

/// Each key admitted exactly its limit, and every answer is its own
/// check's (the limit it names is the one that check asked for).
fn exact_per_key(checks: &[Check], decisions: &[Decision]) {
    let mut allowed = std::collections::BTreeMap::new();
    for (c, d) in checks.iter().zip(decisions) {
        assert!(matches!(d.source, Source::Sluice { .. }), "{d:?}");
        let Limit::Inline { limit, .. } = c.limit else {
            unreachable!("inline checks")
        };
        assert_eq!(d.limit, limit, "{}: another check's answer: {d:?}", c.key);
        *allowed.entry((c.key.clone(), limit)).or_insert(0) += u64::from(d.allowed);
    }
    for ((key, limit), allowed) in allowed {
        assert_eq!(allowed, limit, "{key}: exactly its limit");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn batching_sends_concurrent_checks_together_and_exactly() {
    let node = start(config()).await;
    let builder =
        || Client::builder([node.node.grpc_addr.to_string()]).deadline(Duration::from_secs(5));
    // Batching is the default: no `.batching(..)` here.
    let client = builder().build().unwrap();
    let checks = three_keys("batched");
    let (decisions, calls) = concurrently(&client, &checks).await;
    println!("300 concurrent checks in {calls} Check calls");
    exact_per_key(&checks, &decisions);
    assert!(calls < 300, "batched: {calls} calls for 300 checks");

    // `.batching(0)`: one call per check, however many are in flight.
    let single = builder().batching(0).build().unwrap();
    let checks = three_keys("unbatched");
    let (decisions, calls) = concurrently(&single, &checks).await;
    exact_per_key(&checks, &decisions);
    assert_eq!(calls, 300, "one call per check");
}

/// A node taking fewer items per call than the client batches refuses the
/// larger calls and says its maximum; the client sends no more than that
/// from then on, so its checks are decided again.
#[tokio::test(flavor = "multi_thread")]
async fn a_batching_client_learns_the_node_s_max_batch() {
    let mut c = config();
    c.limits.max_batch = 10;
    let node = start(c).await;
    let client = Client::builder([node.node.grpc_addr.to_string()])
        .deadline(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut rounds = Vec::new();
    for round in 0..5 {
        let checks: Vec<Check> = (0..200)
            .map(|i| per_minute(&format!("r{round}-{i}"), 1_000))
            .collect();
        let (decisions, _) = concurrently(&client, &checks).await;
        let refused = decisions
            .iter()
            .filter(|d| d.source == Source::Unavailable)
            .count();
        rounds.push(refused);
        if refused == 0 {
            break;
        }
    }
    println!("checks refused as part of too-large calls, by round: {rounds:?}");
    assert_eq!(
        rounds.last(),
        Some(&0),
        "a round decided wholly by the node once it said its max: {rounds:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_limiter_is_a_decision_and_is_counted() {
    use std::sync::atomic::Ordering::Relaxed;
    let deadline = Duration::from_millis(50);
    let check = per_minute("down", 10);

    // Batched (the default) and one call per check alike.
    for batching in [sluice_client::DEFAULT_BATCH, 0] {
        let allow = Client::builder([dead_addr()])
            .deadline(deadline)
            .on_unavailable(OnUnavailable::Allow)
            .batching(batching)
            .build()
            .unwrap();
        for _ in 0..20 {
            let d = allow.check(&check).await.unwrap();
            assert!(d.allowed && d.source == Source::Unavailable, "{d:?}");
        }
        assert_eq!(allow.stats().unavailable_allowed.load(Relaxed), 20);
    }

    let deny = Client::builder([dead_addr()])
        .deadline(deadline)
        .on_unavailable(OnUnavailable::Deny)
        .build()
        .unwrap();
    let d = deny.check(&check).await.unwrap();
    assert!(!d.allowed && d.source == Source::Unavailable, "{d:?}");
    // With no count to go by, the client says: try again after a second.
    assert_eq!(
        d.retry_after,
        Some(Duration::from_secs(1)),
        "a refusal says when to retry"
    );
    assert_eq!(deny.stats().unavailable_denied.load(Relaxed), 1);

    // Local: a quarter of 10/min in process; a policy only if told its limit.
    let local = Client::builder([dead_addr()])
        .deadline(deadline)
        .on_unavailable(OnUnavailable::Local {
            share: 0.25,
            limits: LocalLimits::new().with("login", 8, Duration::from_secs(60)),
        })
        .build()
        .unwrap();
    let mut allowed = 0;
    for _ in 0..10 {
        allowed += usize::from(local.check(&check).await.unwrap().allowed);
    }
    assert_eq!(allowed, 2, "⌊10 × 0.25⌋ in process");
    let mut allowed = 0;
    for _ in 0..10 {
        allowed += usize::from(
            local
                .check(&Check::policy("auth", "eve", "login"))
                .await
                .unwrap()
                .allowed,
        );
    }
    assert_eq!(allowed, 2, "⌊8 × 0.25⌋ of the policy's local limit");
    let unknown = local
        .check(&Check::policy("auth", "eve", "unknown-policy"))
        .await
        .unwrap();
    assert!(!unknown.allowed, "a policy with no local limit is refused");
    assert_eq!(local.stats().unavailable_local.load(Relaxed), 21);
}

/// A node that takes calls and never answers them (a stuck process; it
/// ignores `grpc-timeout` as a half-open connection would, and never opens
/// a stream): each call must give its slot back at the deadline, or once
/// the client's few calls in flight are all stuck, every later check waits
/// unsent behind them.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_that_never_answers_holds_no_call_past_its_deadline() {
    use sluice_api::v1 as pb;
    use sluice_api::v1::rate_limiter_server::{RateLimiter, RateLimiterServer};
    use std::sync::atomic::Ordering::Relaxed;

    struct Stuck;
    #[tonic::async_trait]
    impl RateLimiter for Stuck {
        async fn check(
            &self,
            _: tonic::Request<pb::CheckRequest>,
        ) -> Result<tonic::Response<pb::CheckResponse>, tonic::Status> {
            std::future::pending().await
        }

        type CheckStreamStream =
            tokio_stream::wrappers::ReceiverStream<Result<pb::CheckStreamResponse, tonic::Status>>;

        /// Stuck too: the stream never opens.
        async fn check_stream(
            &self,
            _: tonic::Request<tonic::Streaming<pb::CheckStreamRequest>>,
        ) -> Result<tonic::Response<Self::CheckStreamStream>, tonic::Status> {
            std::future::pending().await
        }
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RateLimiterServer::new(Stuck))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let client = Client::builder([addr])
        .deadline(Duration::from_millis(50))
        .on_unavailable(OnUnavailable::Deny)
        .build()
        .unwrap();
    for n in 0..10u64 {
        let d = client.check(&per_minute("stuck", 10)).await.unwrap();
        assert_eq!(d.source, Source::Unavailable, "check {n}: {d:?}");
    }
    assert_eq!(client.stats().unavailable_denied.load(Relaxed), 10);
    // A client keeps 4 calls in flight: more than 4 calls means stuck ones
    // gave their slots back (else checks 5 to 10 were never sent).
    let calls = client.stats().calls.load(Relaxed);
    assert!(calls > 4, "{calls} calls for 10 checks");
    server.abort();
}
