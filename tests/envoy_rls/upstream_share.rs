//! envoyproxy/ratelimit's `config_test.go`, continued: `share_threshold`
//! (TestShareThreshold) — one counter for every value a shared wildcard
//! matches, and its stats keys.

use super::upstream_stats::{MIN, expect};
use super::*;

const SHARE: &str = r#"
domain: test-domain
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: nested
    value: parent
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 200}
  - key: files
    value: top/*
    share_threshold: true
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 300}
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: service
    value: svc/*
    share_threshold: true
    descriptors:
      - key: endpoint
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 80}
  - key: path
    value: path/*
    share_threshold: true
    descriptors:
      - key: file
        value: file/*
        share_threshold: false
        descriptors:
          - key: type
            rate_limit: {unit: minute, requests_per_unit: 120}
  - key: user
    value: user/*
    share_threshold: true
    descriptors:
      - key: resource
        value: res/*
        share_threshold: true
        descriptors:
          - key: action
            rate_limit: {unit: minute, requests_per_unit: 150}
  - key: file
    value: test1
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: file
    value: test*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: midpath
    value: /api*v1
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: multiroute
    value: svc*ep*rpc
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: midroute
    value: /api*v2
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 80}
  - key: tenant
    value: t*prod
    share_threshold: true
    descriptors:
      - key: resource
        value: res*v2
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 60}
"#;

/// The `limit_remaining` one more hit on `entries` leaves.
async fn remaining(n: &TestNode, entries: &[(&str, &str)]) -> u32 {
    ask_in(n, T, vec![desc(entries)], 0).await.statuses[0].limit_remaining
}

const T: &str = "test-domain";

/// TestShareThreshold: the stats keys, and one counter for every value a
/// shared wildcard matches.
#[tokio::test(flavor = "multi_thread")]
async fn share_threshold() {
    let dir = rules_dir("up-share", SHARE);
    let n = serve(&dir, |_| {}).await;
    let p = |rpu, label: &str| limited(rpu, MIN, "", &format!("test-domain.{label}"));
    expect(
        &n,
        T,
        &[
            (&[("files", "files/a.pdf")], p(100, "files_files/*")),
            (&[("files", "files/b.csv")], p(100, "files_files/*")),
            (&[("files", "files/c.txt")], p(100, "files_files/*")),
            (
                &[("route", "api/v1"), ("method", "GET")],
                p(60, "route_api/*.method"),
            ),
            (
                &[("service", "svc/user"), ("endpoint", "get")],
                p(80, "service_svc/*.endpoint_get"),
            ),
            (
                &[("nested", "parent"), ("files", "nested/file1.txt")],
                p(200, "nested_parent.files_nested/*"),
            ),
            (
                &[("files", "top/file1.txt"), ("files", "nested/file1.txt")],
                p(300, "files_top/*.files_nested/*"),
            ),
            (
                &[("path", "path/foo"), ("file", "file/doc1"), ("type", "pdf")],
                p(120, "path_path/*.file_file/*.type"),
            ),
            (
                &[
                    ("user", "user/alice"),
                    ("resource", "res/file1"),
                    ("action", "read"),
                ],
                p(150, "user_user/*.resource_res/*.action"),
            ),
            (&[("file", "test1")], p(50, "file_test1")),
            (&[("file", "test2")], p(100, "file_test*")),
            (&[("file", "test23")], p(100, "file_test*")),
            (&[("file", "test123")], p(100, "file_test*")),
            (&[("midpath", "/api/v1")], p(100, "midpath_/api*v1")),
            (&[("midpath", "/api-beta-v1")], p(100, "midpath_/api*v1")),
            (&[("midpath", "/apiXYZv1")], p(100, "midpath_/api*v1")),
            (&[("midpath", "/api/v2")], unlimited()),
            (
                &[("multiroute", "svcAepBrpc")],
                p(50, "multiroute_svc*ep*rpc"),
            ),
            (
                &[("multiroute", "svcXXXepYYYrpc")],
                p(50, "multiroute_svc*ep*rpc"),
            ),
            (
                &[("multiroute", "svceprpc")],
                p(50, "multiroute_svc*ep*rpc"),
            ),
            (&[("multiroute", "svcABCrpc")], unlimited()),
            (&[("midroute", "/api/v2")], p(80, "midroute_/api*v2")),
            (&[("midroute", "/api-beta-v2")], p(80, "midroute_/api*v2")),
            (
                &[("tenant", "t1prod"), ("resource", "resAv2")],
                p(60, "tenant_t*prod.resource_res*v2"),
            ),
            (
                &[("tenant", "t99prod"), ("resource", "resBBBv2")],
                p(60, "tenant_t*prod.resource_res*v2"),
            ),
        ],
    )
    .await;
    // One counter per shared wildcard, whatever the value: three hits on
    // files/* so far, three on test*, three on /api*v1, two on tenant.
    assert_eq!(remaining(&n, &[("files", "files/new.bin")]).await, 100 - 4);
    assert_eq!(remaining(&n, &[("file", "test9")]).await, 100 - 4);
    assert_eq!(
        remaining(&n, &[("file", "test1")]).await,
        50 - 2,
        "an exact value counts apart"
    );
    assert_eq!(remaining(&n, &[("midpath", "/apiQv1")]).await, 100 - 4);
    assert_eq!(
        remaining(&n, &[("tenant", "t2prod"), ("resource", "resCv2")]).await,
        60 - 3
    );
    // Without share_threshold each value counts apart (path/* shares,
    // file/* does not).
    assert_eq!(
        remaining(
            &n,
            &[("path", "path/bar"), ("file", "file/doc1"), ("type", "pdf")]
        )
        .await,
        120 - 2
    );
    assert_eq!(
        remaining(
            &n,
            &[
                ("path", "path/bar"),
                ("file", "file/other"),
                ("type", "pdf")
            ]
        )
        .await,
        120 - 1
    );
    std::fs::remove_dir_all(&dir).ok();
}
