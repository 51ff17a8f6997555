//! Answers envoyproxy/ratelimit's service gives beyond its config tests:
//! an entry-less descriptor, over-limit counting and `limit_remaining`,
//! `quota_mode`.

use super::*;

const RULES: &str = r#"
domain: edge
descriptors:
  - key: api
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: lenient
    rate_limit: {unit: minute, requests_per_unit: 20, drain_over_limit: false}
  - key: q1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: q2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 1}
"#;

/// (overall, per-descriptor (code, limit_remaining)) of one call.
async fn answer(n: &TestNode, ds: Vec<RateLimitDescriptor>, hits: u32) -> (i32, Vec<(i32, u32)>) {
    let r = ask(n, ds, hits).await;
    (
        r.overall_code,
        r.statuses
            .iter()
            .map(|s| (s.code, s.limit_remaining))
            .collect(),
    )
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

#[tokio::test(flavor = "multi_thread")]
async fn a_descriptor_with_no_entries_has_no_limit() {
    let dir = rules_dir("par-empty", RULES);
    let n = serve(&dir, |_| {}).await;
    let r = ask(&n, vec![desc(&[]), desc(&[("api", "a")])], 0).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses.len(), 2);
    assert_eq!(
        (r.statuses[0].code, r.statuses[0].current_limit.as_ref()),
        (OK, None)
    );
    assert_eq!(
        r.statuses[1].limit_remaining, 19,
        "the other descriptor is decided"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// Upstream's fixed window counts every hit, refused or not: over the limit
/// it reports nothing left, and the refused hits keep the window full.
#[tokio::test(flavor = "multi_thread")]
async fn refused_hits_count_and_leave_nothing() {
    let dir = rules_dir("par-over", RULES);
    let n = serve(&dir, |_| {}).await;
    let api = || desc(&[("api", "alice")]);
    assert_eq!(answer(&n, vec![api()], 21).await, (OVER, vec![(OVER, 0)]));
    assert_eq!(
        answer(&n, vec![api()], 1).await,
        (OVER, vec![(OVER, 0)]),
        "the 21 counted"
    );
    // Part of the window used: refused, 0 left, and still full after.
    assert_eq!(
        answer(&n, vec![desc(&[("api", "bob")])], 15).await,
        (OK, vec![(OK, 5)])
    );
    assert_eq!(
        answer(&n, vec![desc(&[("api", "bob")])], 10).await,
        (OVER, vec![(OVER, 0)])
    );
    assert_eq!(
        answer(&n, vec![desc(&[("api", "bob")])], 1).await,
        (OVER, vec![(OVER, 0)])
    );
    // `drain_over_limit: false` (a Sluice extension): a refusal consumes
    // nothing, yet still reports 0 left as upstream does.
    let lenient = || desc(&[("lenient", "carol")]);
    assert_eq!(
        answer(&n, vec![lenient()], 21).await,
        (OVER, vec![(OVER, 0)])
    );
    assert_eq!(answer(&n, vec![lenient()], 1).await, (OK, vec![(OK, 19)]));
    std::fs::remove_dir_all(&dir).ok();
}

/// `quota_mode`: quota descriptors refuse a request only when all of them
/// are over; any other descriptor over refuses it.
#[tokio::test(flavor = "multi_thread")]
async fn quota_mode_refuses_only_when_every_quota_is_over() {
    let dir = rules_dir("par-quota", RULES);
    let n = serve(&dir, |_| {}).await;
    let (q1, q2, plain) = (
        || desc(&[("q1", "u")]),
        || desc(&[("q2", "u")]),
        || desc(&[("plain", "u")]),
    );
    assert_eq!(answer(&n, vec![q1()], 0).await, (OK, vec![(OK, 0)]));
    // q1 over, q2 within: the request passes; q1's status says over.
    assert_eq!(
        answer(&n, vec![q1(), q2()], 0).await,
        (OK, vec![(OVER, 0), (OK, 0)])
    );
    // Both over.
    assert_eq!(
        answer(&n, vec![q1(), q2()], 0).await,
        (OVER, vec![(OVER, 0), (OVER, 0)])
    );
    // A plain descriptor over refuses, whatever the quotas.
    assert_eq!(answer(&n, vec![plain()], 0).await, (OK, vec![(OK, 0)]));
    let fresh = desc(&[("q1", "v")]);
    assert_eq!(
        answer(&n, vec![fresh, plain()], 0).await,
        (OVER, vec![(OK, 0), (OVER, 0)])
    );
    std::fs::remove_dir_all(&dir).ok();
}
