//! envoyproxy/ratelimit's `config_test.go`, continued: the stats keys
//! (`detailed_metric`, `value_to_metric`, wildcards). Upstream's inline
//! configs each get their own domain here, so one node serves them all; the
//! expected keys are upstream's with that domain.

use super::*;

/// Every probe: entries and what it must answer, in `domain`.
pub(crate) async fn expect(n: &TestNode, domain: &str, cases: &[(&[(&str, &str)], Probe)]) {
    for (entries, want) in cases {
        assert_eq!(
            &probe(n, domain, desc(entries)).await,
            want,
            "{domain} {entries:?}"
        );
    }
}

pub(crate) const MIN: Unit = Unit::Minute;

/// TestDetailedMetric.
#[tokio::test(flavor = "multi_thread")]
async fn detailed_metric() {
    let nested = |domain: &str, top: bool, leaf: bool| {
        format!(
            "domain: {domain}\ndescriptors:\n  - key: key-1\n    detailed_metric: {top}\n    rate_limit: {{unit: minute, requests_per_unit: 100}}\n    descriptors:\n      - key: key-2\n        detailed_metric: {leaf}\n        rate_limit: {{unit: minute, requests_per_unit: 5}}\n"
        )
    };
    let realistic = r#"
domain: nested
descriptors:
  - key: key_1
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 500}
  - key: key_1
    value: some-value-for-key-1
    rate_limit: {unit: minute, requests_per_unit: 500}
  - key: key_2
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5000}
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: key_2
    value: specific-id
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 50000}
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 100}
"#;
    let dir = rules_files(
        "up-detailed",
        &[
            ("1.yaml", nested("nested1", true, false).as_str()),
            ("2.yaml", &nested("nested2", false, false)),
            ("3.yaml", &nested("nested3", true, true)),
            ("4.yaml", &nested("nested4", false, false)),
            ("5.yaml", realistic),
        ],
    );
    let n = serve(&dir, |_| {}).await;
    let one = [("key-1", "value-1")];
    let two = [("key-1", "value-1"), ("key-2", "value-2")];
    expect(
        &n,
        "nested1",
        &[(&one, limited(100, MIN, "", "nested1.key-1_value-1"))],
    )
    .await;
    expect(
        &n,
        "nested2",
        &[(&one, limited(100, MIN, "", "nested2.key-1"))],
    )
    .await;
    expect(
        &n,
        "nested3",
        &[(
            &two,
            limited(5, MIN, "", "nested3.key-1_value-1.key-2_value-2"),
        )],
    )
    .await;
    expect(
        &n,
        "nested4",
        &[(&two, limited(5, MIN, "", "nested4.key-1.key-2"))],
    )
    .await;
    expect(
        &n,
        "nested",
        &[
            (
                &[("key_1", "value-for-key-1")],
                limited(500, MIN, "", "nested.key_1_value-for-key-1"),
            ),
            (
                &[("key_2", "key-2-value")],
                limited(5000, MIN, "", "nested.key_2_key-2-value"),
            ),
            (
                &[("key_2", "key-2-value"), ("key_3", "requested-key3-value")],
                limited(
                    5,
                    MIN,
                    "",
                    "nested.key_2_key-2-value.key_3_requested-key3-value",
                ),
            ),
        ],
    )
    .await;
    std::fs::remove_dir_all(&dir).ok();
}

/// TestValueToMetric_*.
#[tokio::test(flavor = "multi_thread")]
async fn value_to_metric() {
    let three = |domain: &str, flags: [&str; 3]| {
        format!(
            "domain: {domain}\ndescriptors:\n  - key: route\n    {}\n    descriptors:\n      - key: http_method\n        {}\n        descriptors:\n          - key: subject_id\n            {}\n            rate_limit: {{unit: minute, requests_per_unit: 60}}\n",
            flags[0], flags[1], flags[2]
        )
    };
    let vtm = "value_to_metric: true";
    let none = "shadow_mode: false";
    let configured = r#"
domain: configured
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value: GET
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
      - key: http_method
        value: POST
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 30}
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {unit: minute, requests_per_unit: 100}
"#;
    let dir = rules_files(
        "up-vtm",
        &[
            ("1.yaml", three("runtime", [vtm, vtm, none]).as_str()),
            ("2.yaml", &three("mid", [none, vtm, none])),
            ("3.yaml", &three("noflag", [none, none, none])),
            (
                "4.yaml",
                &three("detailed", [vtm, vtm, "detailed_metric: true"]),
            ),
            ("5.yaml", configured),
        ],
    );
    let n = serve(&dir, |_| {}).await;
    let req = |r, m, s| [("route", r), ("http_method", m), ("subject_id", s)];
    expect(
        &n,
        "runtime",
        &[
            (
                &req("draw", "GET", "123"),
                limited(60, MIN, "", "runtime.route_draw.http_method_GET.subject_id"),
            ),
            // Empty values add no `_`.
            (
                &req("", "GET", "123"),
                limited(60, MIN, "", "runtime.route.http_method_GET.subject_id"),
            ),
            (
                &req("draw", "", "123"),
                limited(60, MIN, "", "runtime.route_draw.http_method.subject_id"),
            ),
            (
                &req("", "", "123"),
                limited(60, MIN, "", "runtime.route.http_method.subject_id"),
            ),
        ],
    )
    .await;
    expect(
        &n,
        "mid",
        &[(
            &req("X", "Y", "Z"),
            limited(60, MIN, "", "mid.route.http_method_Y.subject_id"),
        )],
    )
    .await;
    expect(
        &n,
        "noflag",
        &[(
            &req("X", "Y", "Z"),
            limited(60, MIN, "", "noflag.route.http_method.subject_id"),
        )],
    )
    .await;
    expect(
        &n,
        "detailed",
        &[(
            &req("draw", "GET", "123"),
            limited(
                60,
                MIN,
                "",
                "detailed.route_draw.http_method_GET.subject_id_123",
            ),
        )],
    )
    .await;
    expect(
        &n,
        "configured",
        &[
            (
                &req("api", "GET", "user123"),
                limited(
                    60,
                    MIN,
                    "",
                    "configured.route_api.http_method_GET.subject_id",
                ),
            ),
            (
                &req("api", "POST", "user456"),
                limited(
                    30,
                    MIN,
                    "",
                    "configured.route_api.http_method_POST.subject_id",
                ),
            ),
            (
                &[
                    ("user", "alice"),
                    ("action", "readfile"),
                    ("resource", "documents"),
                ],
                limited(
                    100,
                    MIN,
                    "",
                    "configured.user_alice.action_readfile.resource",
                ),
            ),
            (
                &[
                    ("user", "bob"),
                    ("action", "readdata"),
                    ("resource", "database"),
                ],
                limited(100, MIN, "", "configured.user_bob.action_readdata.resource"),
            ),
        ],
    )
    .await;
    std::fs::remove_dir_all(&dir).ok();
}

/// TestWildcardStatsBehavior: trailing and middle wildcards name their
/// stats alike under every flag.
#[tokio::test(flavor = "multi_thread")]
async fn wildcard_stats() {
    let one = |domain: &str, value: &str, flags: &str| {
        format!(
            "domain: {domain}\ndescriptors:\n  - key: wild\n    value: \"{value}\"\n    {flags}\n    rate_limit: {{unit: minute, requests_per_unit: 20}}\n"
        )
    };
    let nested = "domain: other\ndescriptors:\n  - key: wild\n    value: foo*\n    descriptors:\n      - key: other\n        value_to_metric: true\n        descriptors:\n          - key: limit\n            rate_limit: {unit: minute, requests_per_unit: 20}\n";
    let files = [
        ("1.yaml", one("plain", "foo*", "shadow_mode: false")),
        ("2.yaml", one("vtm", "foo*", "value_to_metric: true")),
        ("3.yaml", one("share", "foo*", "share_threshold: true")),
        (
            "4.yaml",
            one(
                "both",
                "foo*",
                "share_threshold: true\n    value_to_metric: true",
            ),
        ),
        ("5.yaml", nested.to_string()),
        ("6.yaml", one("midplain", "foo*bar*", "shadow_mode: false")),
        ("7.yaml", one("midvtm", "foo*bar*", "value_to_metric: true")),
    ];
    let files: Vec<(&str, &str)> = files.iter().map(|(f, t)| (*f, t.as_str())).collect();
    let dir = rules_files("up-wildstats", &files);
    let n = serve(&dir, |_| {}).await;
    let foo1 = [("wild", "foo1")];
    expect(
        &n,
        "plain",
        &[(&foo1, limited(20, MIN, "", "plain.wild_foo*"))],
    )
    .await;
    expect(&n, "vtm", &[(&foo1, limited(20, MIN, "", "vtm.wild_foo1"))]).await;
    expect(
        &n,
        "share",
        &[(&foo1, limited(20, MIN, "", "share.wild_foo*"))],
    )
    .await;
    expect(
        &n,
        "both",
        &[(&foo1, limited(20, MIN, "", "both.wild_foo*"))],
    )
    .await;
    expect(
        &n,
        "other",
        &[(
            &[("wild", "foo1"), ("other", "bar"), ("limit", "X")],
            limited(20, MIN, "", "other.wild_foo*.other_bar.limit"),
        )],
    )
    .await;
    expect(
        &n,
        "midplain",
        &[
            (
                &[("wild", "foo123bar456")],
                limited(20, MIN, "", "midplain.wild_foo*bar*"),
            ),
            (
                &[("wild", "fooXbarY")],
                limited(20, MIN, "", "midplain.wild_foo*bar*"),
            ),
        ],
    )
    .await;
    expect(
        &n,
        "midvtm",
        &[(
            &[("wild", "foo123bar456")],
            limited(20, MIN, "", "midvtm.wild_foo123bar456"),
        )],
    )
    .await;
    std::fs::remove_dir_all(&dir).ok();
}
