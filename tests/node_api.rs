//! The public API over real gRPC on 127.0.0.1: order, every algorithm inline
//! and by policy, peek, drain, shadow mode, and a field-naming error for
//! every bad input — with the node still serving and no counter touched.

mod common;

use common::{config, inline, policy, start, under};
use sluice::config::PolicyConfig;
use sluice::proto::v1 as pb;

const ALGORITHMS: [pb::Algorithm; 6] = [
    pb::Algorithm::TokenBucket,
    pb::Algorithm::Gcra,
    pb::Algorithm::LeakyBucket,
    pb::Algorithm::FixedWindow,
    pb::Algorithm::SlidingWindowCounter,
    pb::Algorithm::SlidingWindowLog,
];

fn algorithm_name(a: pb::Algorithm) -> String {
    a.as_str_name()
        .trim_start_matches("ALGORITHM_")
        .to_lowercase()
}

#[tokio::test]
async fn batch_answers_in_order_and_echoes() {
    let n = start(config()).await;
    let mut requests = Vec::new();
    for i in 0..50 {
        let mut r = inline("order", &format!("k{}", i % 5), 4, 60_000);
        r.request_id = format!("id-{i}");
        r.metadata.insert("i".into(), i.to_string());
        requests.push(r);
    }
    let responses = n.check_all(requests).await;
    assert_eq!(responses.len(), 50);
    for (i, r) in responses.iter().enumerate() {
        assert_eq!(r.request_id, format!("id-{i}"));
        assert_eq!(r.metadata.get("i"), Some(&i.to_string()));
        assert_eq!(r.owner, "test-node");
        // Each of the 5 keys admits its first 4 requests (i < 20).
        assert_eq!(under(r), i < 20, "request {i}: {r:?}");
    }
}

/// When a key of 10 a minute, all spent at one instant (the fake clock,
/// frozen at `common::BASE`, 20 s into a minute of the epoch), can take
/// one more hit, per algorithm (each one's table in `crates/sluice-core/src/algorithm/`).
fn retry_after_ms(a: pb::Algorithm) -> i64 {
    match a {
        // One hit drains or refills every 6 s.
        pb::Algorithm::Unspecified
        | pb::Algorithm::TokenBucket
        | pb::Algorithm::Gcra
        | pb::Algorithm::LeakyBucket => 6_000,
        // The window ends on the minute, 40 s on.
        pb::Algorithm::FixedWindow => 40_000,
        // The next window, 40 s on, weighs this one's 10 until 6 s into it.
        pb::Algorithm::SlidingWindowCounter => 46_000,
        // The oldest hit expires a minute after it was taken.
        pb::Algorithm::SlidingWindowLog => 60_000,
    }
}

#[tokio::test]
async fn twelve_checks_admit_ten_for_every_algorithm_inline_and_by_policy() {
    let mut cfg = config();
    for a in ALGORITHMS {
        cfg.policies.insert(
            algorithm_name(a),
            PolicyConfig {
                algorithm: Some(algorithm_name(a)),
                limit: 10,
                duration: Some("60s".into()),
                ..Default::default()
            },
        );
    }
    let n = start(cfg).await;
    for a in ALGORITHMS {
        let mut by_inline = inline("twelve", &algorithm_name(a), 10, 60_000);
        by_inline.algorithm = a as i32;
        let by_policy = policy("twelve-policy", &algorithm_name(a), &algorithm_name(a));
        for r in [by_inline, by_policy] {
            let mut answers = Vec::new();
            for _ in 0..12 {
                answers.push(n.check(r.clone()).await);
            }
            let admitted = answers.iter().filter(|x| under(x)).count();
            assert_eq!(admitted, 10, "{a:?}: {answers:?}");
            for refused in &answers[10..] {
                assert_eq!(refused.status, pb::Status::OverLimit as i32);
                assert_eq!(refused.reason, pb::Reason::LimitExceeded as i32);
                assert_eq!(
                    refused.retry_after_ms,
                    retry_after_ms(a),
                    "{a:?}: {refused:?}"
                );
            }
            if a == pb::Algorithm::LeakyBucket {
                // Admitted requests are spaced 6 s apart by their delays.
                let delays: Vec<i64> = answers[..10].iter().map(|x| x.delay_ms).collect();
                assert_eq!(delays, (0..10).map(|i| i * 6_000).collect::<Vec<_>>());
            }
        }
    }
}

#[tokio::test]
async fn peek_reads_and_drain_empties() {
    let n = start(config()).await;
    let mut peek = inline("p", "k", 5, 60_000);
    peek.hits = Some(0);
    assert_eq!(n.check(peek.clone()).await.remaining, 5);
    let mut three = inline("p", "k", 5, 60_000);
    three.hits = Some(3);
    assert!(under(&n.check(three.clone()).await));
    assert_eq!(n.check(peek.clone()).await.remaining, 2);
    // A refused request without drain consumes nothing...
    assert!(!under(&n.check(three.clone()).await));
    assert_eq!(n.check(peek.clone()).await.remaining, 2);
    // ...with drain it takes what is left.
    three.drain_over_limit = true;
    let r = n.check(three).await;
    assert_eq!((r.status, r.remaining), (pb::Status::OverLimit as i32, 0));
    assert_eq!(n.check(peek).await.remaining, 0);
}

#[tokio::test]
async fn cost_above_capacity_says_so_without_retry() {
    let n = start(config()).await;
    let mut r = inline("c", "k", 5, 60_000);
    r.hits = Some(6);
    let a = n.check(r).await;
    assert_eq!(a.reason, pb::Reason::CostExceedsCapacity as i32);
    assert_eq!(a.retry_after_ms, 0);
    let zero = n.check(inline("c", "zero", 0, 60_000)).await;
    assert_eq!(
        zero.status,
        pb::Status::OverLimit as i32,
        "limit 0 denies all"
    );
}

#[tokio::test]
async fn shadow_policies_count_but_allow() {
    let mut cfg = config();
    cfg.policies.insert(
        "shadow".into(),
        PolicyConfig {
            limit: 1,
            duration: Some("1m".into()),
            shadow: true,
            ..Default::default()
        },
    );
    let n = start(cfg).await;
    let first = n.check(policy("s", "k", "shadow")).await;
    assert_eq!(first.reason, pb::Reason::WithinLimit as i32);
    let second = n.check(policy("s", "k", "shadow")).await;
    assert_eq!(second.status, pb::Status::UnderLimit as i32);
    assert_eq!(second.reason, pb::Reason::Shadow as i32);
    assert_eq!(second.remaining, 0);
}

#[tokio::test]
async fn pairs_never_share_a_counter() {
    let n = start(config()).await;
    assert!(under(&n.check(inline("a/b", "c", 1, 60_000)).await));
    assert!(under(&n.check(inline("a", "b/c", 1, 60_000)).await));
}

#[tokio::test]
async fn every_bad_input_names_its_field_and_touches_nothing() {
    let n = start(config()).await;
    let good = || inline("bad", "k", 10, 60_000);
    let with = |f: &dyn Fn(&mut pb::RateLimitRequest)| {
        let mut r = good();
        f(&mut r);
        r
    };
    let cases: Vec<(&str, pb::RateLimitRequest)> = vec![
        ("unique_key", with(&|r| r.unique_key.clear())),
        ("unique_key", with(&|r| r.unique_key = "x".repeat(1025))),
        ("name", with(&|r| r.name.clear())),
        ("name", with(&|r| r.name = "x".repeat(1025))),
        ("limit", with(&|r| r.limit = -1)),
        ("duration_ms", with(&|r| r.duration_ms = Some(0))),
        ("duration_ms", with(&|r| r.duration_ms = Some(-5))),
        (
            "duration_ms",
            with(&|r| r.window = pb::CalendarWindow::Day as i32),
        ),
        ("duration_ms", with(&|r| r.duration_ms = None)),
        ("hits", with(&|r| r.hits = Some(-1))),
        ("algorithm", with(&|r| r.algorithm = 99)),
        (
            "window",
            with(&|r| {
                r.duration_ms = None;
                r.window = 42;
            }),
        ),
        (
            "window",
            with(&|r| {
                r.duration_ms = None;
                r.window = pb::CalendarWindow::Month as i32;
            }),
        ),
        (
            "policy",
            with(&|r| {
                *r = policy("bad", "k", "no-such-policy");
            }),
        ),
        (
            "limit",
            with(&|r| {
                r.policy = Some("whatever".into());
            }),
        ),
        ("burst", with(&|r| r.burst = Some(-3))),
        ("burst", with(&|r| r.burst = Some(0))),
        (
            "limit",
            with(&|r| {
                r.algorithm = pb::Algorithm::SlidingWindowLog as i32;
                r.limit = 10_001;
            }),
        ),
    ];
    let (fields, requests): (Vec<_>, Vec<_>) = cases.into_iter().unzip();
    let mut batch = requests.clone();
    batch.push(good());
    let responses = n.check_all(batch).await;
    for (i, field) in fields.iter().enumerate() {
        let r = &responses[i];
        let e = r
            .error
            .as_ref()
            .unwrap_or_else(|| panic!("case {i} ({field}): no error: {r:?}"));
        assert_eq!(e.field, *field, "case {i}: {e:?}");
        assert!(e.message.starts_with(field), "case {i}: {e:?}");
        assert_eq!(e.code, tonic::Code::InvalidArgument as i32);
        assert_eq!(r.status, pb::Status::Unspecified as i32);
    }
    // The good request in the same batch was decided, and it was the only
    // thing that touched the counter.
    let last = responses.last().unwrap();
    assert!(under(last));
    assert_eq!(last.remaining, 9);
    assert_eq!(n.node.limiter.store().len(), 1);
    let metrics = n.http_get("/metrics").await.1;
    assert!(
        metrics.contains("sluice_invalid_requests_total{field=\"unique_key\"} 2"),
        "{metrics}"
    );
}

#[tokio::test]
async fn oversized_calls_are_refused_and_the_node_keeps_serving() {
    let mut cfg = config();
    cfg.limits.max_message_bytes = 64 * 1024;
    let n = start(cfg).await;
    // More than 1,000 items.
    let many = vec![inline("m", "k", 10, 60_000); 1_001];
    let err = n
        .client()
        .check(pb::CheckRequest { requests: many })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    assert!(err.message().starts_with("requests:"), "{err:?}");
    // A message above the size bound.
    let big = vec![inline("m", &"k".repeat(1_000), 10, 60_000); 100];
    let err = n
        .client()
        .check(pb::CheckRequest { requests: big })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message().contains("message length too large"),
        "{err:?}"
    );
    // Nothing was counted, both refusals are in /metrics with their bounds,
    // and the node still answers.
    assert!(n.node.limiter.store().is_empty());
    let resources = &n.node.limiter.metrics().resources;
    assert_eq!(resources.exhausted_count("requests"), 1);
    assert_eq!(resources.exhausted_count("message_bytes"), 1);
    let metrics = n.node.limiter.metrics().render();
    for line in [
        "sluice_resource_limit{resource=\"max_message_bytes\"} 65536",
        "sluice_resource_limit{resource=\"max_batch\"} 1000",
        "sluice_resource_exhausted_total{resource=\"message_bytes\"} 1",
        "sluice_connections{listener=\"grpc\"} ",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    assert!(under(&n.check(inline("m", "k", 10, 60_000)).await));
}

/// `POST /v1/check` names the limit in its quota headers: an inline limit
/// by the request's `name`, a policy by the policy's.
#[tokio::test]
async fn http_quota_headers_name_the_request_or_its_policy() {
    let mut cfg = config();
    cfg.policies.insert(
        "per_user".into(),
        PolicyConfig {
            limit: 5,
            duration: Some("60s".into()),
            ..Default::default()
        },
    );
    let n = start(cfg).await;
    let url = format!("http://{}/v1/check", n.node.http_addr);
    let bodies = [
        (
            r#"{"name":"api","unique_key":"k","limit":10,"duration_ms":60000}"#,
            "\"api\";q=10;w=60",
        ),
        (
            r#"{"name":"login","unique_key":"k","policy":"per_user"}"#,
            "\"per_user\";q=5;w=60",
        ),
    ];
    for (body, expected) in bodies {
        let (status, headers, text) = common::http_post(&url, body).await;
        assert_eq!(status, 200, "{body}: {text}");
        assert_eq!(
            headers.get("ratelimit-policy").map(String::as_str),
            Some(expected),
            "{body}: {headers:?}"
        );
    }
}
