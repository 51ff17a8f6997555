//! envoyproxy/ratelimit's `test/config/config_test.go`, through the real
//! gRPC server: each upstream test's rules (written again here, in the same
//! shapes and key names) and the answers that test expects — the limit, and
//! the stats key as Sluice's `limit` label. Matching and errors here; stats
//! keys in `upstream_stats`, `share_threshold` in `upstream_share`.

use prost_types::value::Kind;
use sluice::clock::FakeClock;
use sluice::policy::Policies;
use sluice::proto::envoy::r#type::v3::RateLimitUnit;
use sluice::server::Node;

use super::common::{BASE, config};
use super::*;

const TEST_DOMAIN: &str = r#"
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 30}
  - key: key2
    value: value3
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: key4
    rate_limit: {name: key4_rate_limit, unit: day, requests_per_unit: 1}
  - key: key5
    value: value5
    rate_limit: {unit: day, requests_per_unit: 15}
    descriptors:
      - key: subkey5
        value: subvalue5
        rate_limit: {unit: day, requests_per_unit: 25}
  - key: key6
    rate_limit: {unlimited: true}
  - key: key7
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 70}
"#;

const T: &str = "test-domain";

/// TestBasicConfig.
#[tokio::test(flavor = "multi_thread")]
async fn basic_config() {
    let dir = rules_dir("up-basic", TEST_DOMAIN);
    let n = serve(&dir, |_| {}).await;
    for (domain, d) in [
        ("foo_domain", desc(&[])),
        (T, desc(&[])),
        (T, desc(&[("key1", "something")])),
        (T, desc(&[("key1", "value1")])),
        (T, desc(&[("key2", "value2"), ("subkey", "subvalue")])),
        (T, desc(&[("key5", "value5"), ("subkey5", "subvalue")])),
        (T, desc(&[("key2", "value3")])),
    ] {
        assert_eq!(
            probe(&n, domain, d.clone()).await,
            unlimited(),
            "{domain} {d:?}"
        );
    }
    let cases = [
        (
            &[("key1", "value1"), ("subkey1", "something")][..],
            limited(5, Unit::Second, "", "test-domain.key1_value1.subkey1"),
        ),
        (
            &[("key1", "value1"), ("subkey1", "subvalue1")],
            limited(
                10,
                Unit::Second,
                "",
                "test-domain.key1_value1.subkey1_subvalue1",
            ),
        ),
        (
            &[("key2", "something")],
            limited(20, Unit::Minute, "", "test-domain.key2"),
        ),
        (
            &[("key2", "value2")],
            limited(30, Unit::Minute, "", "test-domain.key2_value2"),
        ),
        (
            &[("key3", "foo")],
            limited(1, Unit::Hour, "", "test-domain.key3"),
        ),
        (
            &[("key4", "foo")],
            limited(1, Unit::Day, "key4_rate_limit", "test-domain.key4"),
        ),
        (
            &[("key7", "unspecified_value")],
            limited(70, Unit::Minute, "", "test-domain.key7_unspecified_value"),
        ),
        (
            &[("key7", "another_value")],
            limited(70, Unit::Minute, "", "test-domain.key7_another_value"),
        ),
    ];
    for (entries, want) in cases {
        assert_eq!(probe(&n, T, desc(entries)).await, want, "{entries:?}");
    }
    // Unlimited: OK, everything left, nothing counted.
    let r = ask_in(&n, T, vec![desc(&[("key6", "foo")])], 0).await;
    assert_eq!(
        (r.statuses[0].code, r.statuses[0].limit_remaining),
        (Code::Ok as i32, u32::MAX)
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// TestDomainMerge, and TestDuplicateDomain / TestDuplicateKeyDomainMerge
/// through a node's start.
#[tokio::test(flavor = "multi_thread")]
async fn domains_merge_when_asked() {
    let key1 = "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit: {unit: minute, requests_per_unit: 10}\n";
    let key2 = "domain: test-domain\ndescriptors:\n  - key: key2\n    value: value2\n    rate_limit: {unit: minute, requests_per_unit: 20}\n";
    let dir = rules_files("up-merge", &[("merge1.yaml", key1), ("merge2.yaml", key2)]);
    let n = serve(&dir, |c| c.envoy.merge_domain_config = true).await;
    assert_eq!(probe(&n, "foo_domain", desc(&[])).await, unlimited());
    assert_eq!(probe(&n, T, desc(&[])).await, unlimited());
    assert_eq!(
        probe(&n, T, desc(&[("key1", "value1")])).await,
        limited(10, Unit::Minute, "", "test-domain.key1_value1")
    );
    assert_eq!(
        probe(&n, T, desc(&[("key2", "value2")])).await,
        limited(20, Unit::Minute, "", "test-domain.key2_value2")
    );
    let e = refused(
        "up-merge-off",
        &[("merge1.yaml", key1), ("merge2.yaml", key2)],
        false,
    )
    .await;
    assert!(
        e.contains("merge2.yaml: domain: 'test-domain' is already defined in"),
        "{e}"
    );
    let e = refused("up-merge-dup", &[("a.yaml", key1), ("b.yaml", key1)], true).await;
    assert!(
        e.contains("b.yaml: line 3: duplicate descriptor composite key 'test-domain.key1_value1'"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// The error a node refuses to start with, on these rule files.
async fn refused(tag: &str, files: &[(&str, &str)], merge: bool) -> String {
    let dir = rules_files(tag, files);
    let mut c = config();
    c.envoy.rules_path = Some(dir.clone());
    c.envoy.merge_domain_config = merge;
    let policies = Policies::from_config(&c).unwrap();
    let started = Node::start(c, policies, None, FakeClock::new(BASE)).await;
    std::fs::remove_dir_all(&dir).ok();
    match started {
        Ok(_) => panic!("{files:?} loaded"),
        Err(e) => e.to_string(),
    }
}

/// TestEmptyDomain … TestUnlimitedWithRateLimitUnit: every broken file is
/// refused, naming the file, the line (where the text has one) and the
/// problem.
#[tokio::test(flavor = "multi_thread")]
async fn broken_files_are_refused_with_file_line_and_field() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "empty_domain",
            "descriptors:\n",
            "domain: the file must name a domain",
        ),
        (
            "empty_key",
            "domain: test-domain\ndescriptors:\n  - value: value1\n",
            "line 3: test-domain: descriptor has an empty key",
        ),
        (
            "duplicate_key",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n\n  - key: key1\n    value: value1\n",
            "line 6: duplicate descriptor composite key 'test-domain.key1_value1'",
        ),
        (
            "bad_limit_unit",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: foo\n      requests_per_unit: 5\n",
            "line 6: test-domain.key1_value1: rate_limit.unit: invalid unit 'foo'",
        ),
        (
            "replaces_self",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    descriptors:\n      - key: subkey1\n        rate_limit:\n          name: self\n          replaces:\n            - name: self\n          unit: second\n          requests_per_unit: 5\n",
            "line 10: test-domain.key1_value1.subkey1: rate_limit.replaces: a limit cannot replace itself ('self')",
        ),
        (
            "replaces_empty",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    descriptors:\n      - key: subkey1\n        rate_limit:\n          name: self\n          replaces:\n            - name:\n          unit: second\n",
            "line 10: test-domain.key1_value1.subkey1: rate_limit.replaces: an entry has an empty name",
        ),
        (
            "bad_yaml",
            "'''\n",
            "found unexpected end of stream at line 2",
        ),
        (
            "misspelled_key",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    ratelimit:\n      unit: day\n",
            "descriptors[0]: unknown field `ratelimit`",
        ),
        (
            "misspelled_key2",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    rate_limit:\n      unit: day\n      requestsperunit: 5\n",
            "descriptors[0].rate_limit: unknown field `requestsperunit`",
        ),
        (
            "non_string_key",
            "0.25: test-domain\ndescriptors:\n",
            "unknown field `0.25`, expected `domain` or `descriptors`",
        ),
        (
            "non_map_list",
            "domain: test-domain\ndescriptors:\n  - a\n  - b\n  - c\n",
            "descriptors[0]: invalid type: string \"a\", expected a descriptor: a map such as `{key: user, value: alice, rate_limit: {unit: minute, requests_per_unit: 10}}`",
        ),
        (
            "unlimited_with_unit",
            "domain: test-domain\ndescriptors:\n  - key: foo\n    rate_limit:\n      unlimited: true\n      unit: day\n      requests_per_unit: 25\n",
            "line 6: test-domain.foo: rate_limit.unit: should not be set when unlimited",
        ),
        (
            "share_threshold_without_wildcard",
            "domain: test-domain\ndescriptors:\n  - key: files\n    value: plain\n    share_threshold: true\n",
            "line 5: test-domain.files_plain: share_threshold only applies to a wildcard value",
        ),
    ];
    for (name, text, want) in cases {
        let file = format!("{name}.yaml");
        let e = refused(&format!("up-bad-{name}"), &[(&file, text)], false).await;
        assert!(e.contains(&format!("{file}: ")), "{name}: no file in {e:?}");
        assert!(e.contains(want), "{name}: want {want:?} in {e:?}");
        assert!(
            !e.contains("Yaml"),
            "{name}: an internal type name in {e:?}"
        );
    }
    // serde's own refusals carry the line at their end.
    let e = refused("up-bad-lines", &[("m.yaml", cases[7].1)], false).await;
    assert!(e.contains("at line 5 column 5"), "{e}");
    let e = refused("up-bad-list", &[("l.yaml", cases[10].1)], false).await;
    assert!(e.contains("at line 3 column 5"), "{e}");
}

/// TestConfigLimitOverride: an override applies only in a known domain, and
/// is counted under the request's entries.
#[tokio::test(flavor = "multi_thread")]
async fn limit_overrides() {
    let dir = rules_dir("up-override", TEST_DOMAIN);
    let n = serve(&dir, |_| {}).await;
    let with = |entries: &[(&str, &str)], rpu: u32, unit: RateLimitUnit| {
        let mut d = desc(entries);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: rpu,
            unit: unit as i32,
        });
        d
    };
    // Unknown domain: no limit, even one denying everything.
    let deny_all = with(&[("key1", "value1")], 0, RateLimitUnit::Day);
    assert_eq!(probe(&n, "foo_domain", deny_all.clone()).await, unlimited());
    let r = ask_in(&n, "foo_domain", vec![deny_all], 0).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    let something = [("key1", "value1"), ("subkey1", "something")];
    let label = "test-domain.key1_value1.subkey1_something";
    assert_eq!(
        probe(&n, T, with(&something, 10, RateLimitUnit::Day)).await,
        limited(10, Unit::Day, "", label)
    );
    // Another override value: same stats, kept counting.
    assert_eq!(
        probe(&n, T, with(&something, 42, RateLimitUnit::Hour)).await,
        limited(42, Unit::Hour, "", label)
    );
    assert_eq!(decisions(&n).await[label], 2.0);
    assert_eq!(
        probe(
            &n,
            T,
            with(
                &[("key1", "value1"), ("subkey1", "something_else")],
                42,
                RateLimitUnit::Hour
            )
        )
        .await,
        limited(
            42,
            Unit::Hour,
            "",
            "test-domain.key1_value1.subkey1_something_else"
        )
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// TestShadowModeConfig: shadow rules count and always answer OK.
#[tokio::test(flavor = "multi_thread")]
async fn shadow_mode() {
    let rules = "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    descriptors:\n      - key: subkey1\n        rate_limit: {unit: second, requests_per_unit: 5}\n      - key: subkey1\n        value: subvalue1\n        shadow_mode: true\n        rate_limit: {unit: second, requests_per_unit: 10}\n  - key: key2\n    shadow_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 20}\n  - key: key2\n    value: value2\n    rate_limit: {unit: minute, requests_per_unit: 30}\n";
    let dir = rules_dir("up-shadow", rules);
    let n = serve(&dir, |_| {}).await;
    let run = |entries: &'static [(&'static str, &'static str)], calls: usize| {
        let n = &n;
        async move {
            let mut last = None;
            let mut ok = 0;
            for _ in 0..calls {
                let r = ask_in(n, T, vec![desc(entries)], 0).await;
                ok += usize::from(r.overall_code == Code::Ok as i32);
                last = Some(r.statuses[0].clone());
            }
            (ok, last.unwrap())
        }
    };
    let (ok, last) = run(&[("key1", "value1"), ("subkey1", "something")], 6).await;
    assert_eq!(
        (ok, last.code),
        (5, Code::OverLimit as i32),
        "not in shadow mode"
    );
    let (ok, last) = run(&[("key1", "value1"), ("subkey1", "subvalue1")], 11).await;
    assert_eq!(
        (ok, last.code, last.limit_remaining),
        (11, Code::Ok as i32, 0)
    );
    let (ok, _) = run(&[("key2", "something")], 21).await;
    assert_eq!(ok, 21);
    let (ok, _) = run(&[("key2", "value2")], 31).await;
    assert_eq!(ok, 30, "not in shadow mode");
    let (_, text) = n.http_get("/metrics").await;
    for line in [
        "sluice_decisions_total{limit=\"test-domain.key1_value1.subkey1_subvalue1\",status=\"under_limit\",reason=\"shadow\"} 1",
        "sluice_decisions_total{limit=\"test-domain.key2\",status=\"under_limit\",reason=\"shadow\"} 1",
    ] {
        assert!(text.contains(line), "{line} missing");
    }
    std::fs::remove_dir_all(&dir).ok();
}

const WILDCARD: &str = r#"
domain: test-domain
descriptors:
  - key: wild
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: noWild
    value: foo
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: noVal
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: midWild
    value: bar*b
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: multiWild
    value: foo*bar*baz
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: nestedWild
    value: val1
    descriptors:
      - key: wild
        value: goo*
        rate_limit: {unit: minute, requests_per_unit: 20}
  # Overlapping: the first in file order wins, not the longest.
  - key: over
    value: a*
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: over
    value: ab*
    rate_limit: {unit: minute, requests_per_unit: 2}
"#;

/// TestWildcardConfig: `*` at the end, in the middle, several times, and
/// nested; plus overlapping wildcards.
#[tokio::test(flavor = "multi_thread")]
async fn wildcards() {
    let dir = rules_dir("up-wild", WILDCARD);
    let n = serve(&dir, |_| {}).await;
    let m = Unit::Minute;
    let cases: &[(&[(&str, &str)], Probe)] = &[
        (
            &[("noVal", "foo1")],
            limited(20, m, "", "test-domain.noVal"),
        ),
        (
            &[("noVal", "foo2")],
            limited(20, m, "", "test-domain.noVal"),
        ),
        (
            &[("wild", "foo1")],
            limited(20, m, "", "test-domain.wild_foo*"),
        ),
        (
            &[("wild", "foo2")],
            limited(20, m, "", "test-domain.wild_foo*"),
        ),
        (
            &[("nestedWild", "val1"), ("wild", "goo2")],
            limited(20, m, "", "test-domain.nestedWild_val1.wild_goo*"),
        ),
        (&[("wild", "bar")], unlimited()),
        (&[("noWild", "foo1")], unlimited()),
        (
            &[("midWild", "barab")],
            limited(20, m, "", "test-domain.midWild_bar*b"),
        ),
        (
            &[("midWild", "bar123b")],
            limited(20, m, "", "test-domain.midWild_bar*b"),
        ),
        (
            &[("midWild", "barb")],
            limited(20, m, "", "test-domain.midWild_bar*b"),
        ),
        (&[("midWild", "bara")], unlimited()),
        (&[("midWild", "xbarb")], unlimited()),
        (
            &[("multiWild", "foo123bar456baz")],
            limited(10, m, "", "test-domain.multiWild_foo*bar*baz"),
        ),
        (
            &[("multiWild", "foobarbaz")],
            limited(10, m, "", "test-domain.multiWild_foo*bar*baz"),
        ),
        (&[("multiWild", "foo123baz")], unlimited()),
        (&[("multiWild", "bar456baz")], unlimited()),
        (&[("over", "abc")], limited(1, m, "", "test-domain.over_a*")),
    ];
    for (entries, want) in cases {
        assert_eq!(&probe(&n, T, desc(entries)).await, want, "{entries:?}");
    }
    // Enforced, each value on its own counter (no share_threshold).
    let mut ok = 0;
    for _ in 0..12 {
        let r = ask_in(&n, T, vec![desc(&[("multiWild", "foo9bar9baz")])], 0).await;
        ok += usize::from(r.overall_code == Code::Ok as i32);
    }
    assert_eq!(ok, 10);
    std::fs::remove_dir_all(&dir).ok();
}

/// TestMetadata, and upstream's RESPONSE_DYNAMIC_METADATA answer.
#[tokio::test(flavor = "multi_thread")]
async fn metadata() {
    let rules = r#"
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
        metadata:
          name: service_1
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
    metadata:
      service_with_quota:
        name: service_2
"#;
    let dir = rules_dir("up-metadata", rules);
    let n = serve(&dir, |c| c.envoy.response_dynamic_metadata = true).await;
    let sub = [("key1", "value1"), ("subkey1", "something")];
    let mut over = desc(&[("key2", "something")]);
    over.hits_addend = Some(3);
    let r = ask_in(&n, T, vec![desc(&sub), over], 2).await;
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        5
    );
    let md = r.dynamic_metadata.expect("dynamic metadata");
    assert_eq!(
        to_json(&md),
        serde_json::json!({
            "domain": "test-domain",
            "descriptors": [
                {"entries": ["key1=value1", "subkey1=something"]},
                {"entries": ["key2=something"], "hitsAddend": 3.0},
            ],
            "hitsAddend": 2.0,
            "metadata": {"name": "service_1", "service_with_quota": {"name": "service_2"}},
        })
    );
    // A refused descriptor's metadata is left out; an override is shown.
    let mut with_override = desc(&[("other", "x")]);
    with_override.limit = Some(RateLimitOverride {
        requests_per_unit: 10,
        unit: sluice::proto::envoy::r#type::v3::RateLimitUnit::Day as i32,
    });
    for _ in 0..3 {
        ask_in(&n, T, vec![desc(&sub)], 0).await;
    }
    let r = ask_in(
        &n,
        T,
        vec![desc(&sub), desc(&[("key2", "y")]), with_override],
        0,
    )
    .await;
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
    let md = to_json(&r.dynamic_metadata.unwrap());
    assert_eq!(
        md["metadata"],
        serde_json::json!({"service_with_quota": {"name": "service_2"}})
    );
    assert_eq!(
        md["descriptors"][2]["limit"],
        "requests_per_unit:10 unit:DAY"
    );
    std::fs::remove_dir_all(&dir).ok();
    // Off (the default): no dynamic metadata.
    let dir = rules_dir("up-metadata-off", rules);
    let n = serve(&dir, |_| {}).await;
    assert_eq!(
        ask_in(&n, T, vec![desc(&sub)], 0).await.dynamic_metadata,
        None
    );
    std::fs::remove_dir_all(&dir).ok();
}

fn to_json(s: &prost_types::Struct) -> serde_json::Value {
    fn value(v: &prost_types::Value) -> serde_json::Value {
        match &v.kind {
            Some(Kind::StringValue(s)) => s.clone().into(),
            Some(Kind::NumberValue(n)) => (*n).into(),
            Some(Kind::BoolValue(b)) => (*b).into(),
            Some(Kind::StructValue(s)) => to_json(s),
            Some(Kind::ListValue(l)) => l.values.iter().map(value).collect(),
            Some(Kind::NullValue(_)) | None => serde_json::Value::Null,
        }
    }
    s.fields
        .iter()
        .map(|(k, v)| (k.clone(), value(v)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}
