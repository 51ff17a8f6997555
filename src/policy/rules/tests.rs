//! Parsing and matching edge cases; expected values from envoyproxy/ratelimit's
//! `test/config/config_test.go` where it has them (rules rewritten here).

use std::path::PathBuf;

use super::matching::Wildcard;
use super::*;

fn rules(text: &str) -> Rules {
    let mut r = Rules::default();
    r.add(text, &Bounds::default()).unwrap();
    r
}

fn err(text: &str) -> String {
    Rules::default().add(text, &Bounds::default()).unwrap_err()
}

/// The limit and stats label for one descriptor.
fn hit(r: &Rules, entries: &[(&str, &str)]) -> Option<(u32, String)> {
    r.find("d", entries)
        .map(|f| (f.limit.requests_per_unit, f.limit.label.to_string()))
}

#[test]
fn matches_like_envoyproxy_ratelimit() {
    let r = rules(
        "domain: d\ndescriptors:\n  - key: k\n    value: v\n    rate_limit: {unit: second, requests_per_unit: 5}\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: path\n    value: \"/api/*\"\n    rate_limit: {unit: hour, requests_per_unit: 7}\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {unit: day, requests_per_unit: 9}\n",
    );
    assert_eq!(hit(&r, &[("k", "v")]), Some((5, "d.k_v".into())));
    assert_eq!(hit(&r, &[("k", "other")]), Some((1, "d.k".into())));
    assert_eq!(
        hit(&r, &[("path", "/api/x")]),
        Some((7, "d.path_/api/*".into()))
    );
    assert_eq!(hit(&r, &[("path", "/web")]), None);
    assert_eq!(
        hit(&r, &[("a", "1"), ("b", "2")]),
        Some((9, "d.a.b".into()))
    );
    assert_eq!(hit(&r, &[("a", "1")]), None, "no limit at that depth");
    assert_eq!(
        hit(&r, &[("k", "v"), ("extra", "x")]),
        None,
        "deeper than the rules"
    );
    assert_eq!(hit(&r, &[]), None, "no entries, no limit");
    assert!(r.find("other", &[("k", "v")]).is_none());
}

#[test]
fn a_star_anywhere_matches_any_run_of_characters() {
    let w = Wildcard::new("midWild_bar*b");
    for yes in ["midWild_barab", "midWild_bar123b", "midWild_barb"] {
        assert!(w.matches(yes), "{yes}");
    }
    for no in ["midWild_bara", "midWild_xbarb", "midWild_ba"] {
        assert!(!w.matches(no), "{no}");
    }
    let w = Wildcard::new("multiWild_foo*bar*baz");
    for yes in ["multiWild_foo123bar456baz", "multiWild_foobarbaz"] {
        assert!(w.matches(yes), "{yes}");
    }
    for no in [
        "multiWild_foo123baz",
        "multiWild_bar456baz",
        "multiWild_foobazbar",
    ] {
        assert!(!w.matches(no), "{no}");
    }
    // The prefix and the suffix cannot share characters.
    assert!(!Wildcard::new("aba*aba").matches("aba"));
    assert!(Wildcard::new("aba*aba").matches("abaaba"));
    assert!(Wildcard::new("x_*").matches("x_"));
    assert!(Wildcard::new("x_**y").matches("x_y"));
}

#[test]
fn wildcards_match_at_every_level_in_file_order() {
    let r = rules(
        "domain: d\ndescriptors:\n  - key: p\n    value: a*\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: p\n    value: ab*\n    rate_limit: {unit: minute, requests_per_unit: 2}\n  - key: p\n    value: abc\n    rate_limit: {unit: minute, requests_per_unit: 3}\n  - key: n\n    value: v\n    descriptors:\n      - key: w\n        value: goo*\n        rate_limit: {unit: minute, requests_per_unit: 4}\n",
    );
    assert_eq!(
        hit(&r, &[("p", "abx")]),
        Some((1, "d.p_a*".into())),
        "first in file order, not the longest"
    );
    assert_eq!(
        hit(&r, &[("p", "abc")]),
        Some((3, "d.p_abc".into())),
        "an exact value first"
    );
    assert_eq!(
        hit(&r, &[("n", "v"), ("w", "goo2")]),
        Some((4, "d.n_v.w_goo*".into()))
    );
}

#[test]
fn share_threshold_counts_every_matching_value_under_the_pattern() {
    let r = rules(
        "domain: d\ndescriptors:\n  - key: files\n    value: files/*\n    share_threshold: true\n    rate_limit: {unit: minute, requests_per_unit: 100}\n  - key: tenant\n    value: t*prod\n    share_threshold: true\n    descriptors:\n      - key: resource\n        value: res*v2\n        share_threshold: true\n        rate_limit: {unit: minute, requests_per_unit: 60}\n  - key: path\n    value: path/*\n    share_threshold: true\n    descriptors:\n      - key: file\n        value: file/*\n        descriptors:\n          - key: type\n            rate_limit: {unit: minute, requests_per_unit: 120}\n",
    );
    let f = r.find("d", &[("files", "files/a.pdf")]).unwrap();
    assert_eq!(&*f.limit.label, "d.files_files/*");
    let entries = vec![("files".to_string(), "files/a.pdf".to_string())];
    assert_eq!(f.counter_entries(&entries), vec![("files", "files/*")]);
    let f = r
        .find("d", &[("tenant", "t1prod"), ("resource", "resAv2")])
        .unwrap();
    assert_eq!(
        f.shared,
        vec![Some(Arc::from("t*prod")), Some(Arc::from("res*v2"))]
    );
    assert_eq!(&*f.limit.label, "d.tenant_t*prod.resource_res*v2");
    let f = r
        .find(
            "d",
            &[("path", "path/foo"), ("file", "file/doc1"), ("type", "pdf")],
        )
        .unwrap();
    assert_eq!(f.shared, vec![Some(Arc::from("path/*")), None, None]);
    assert_eq!(&*f.limit.label, "d.path_path/*.file_file/*.type");
    // Without share_threshold a wildcard's values count apart.
    let f = r.find("d", &[("path", "path/foo")]);
    assert!(f.is_none(), "no limit at that depth");
    let msg =
        err("domain: d\ndescriptors:\n  - key: k\n    value: plain\n    share_threshold: true\n");
    assert!(
        msg.starts_with("line 5: d.k_plain: share_threshold only applies to a wildcard"),
        "{msg}"
    );
}

#[test]
fn stats_labels_follow_upstream() {
    let r = rules(
        "domain: d\ndescriptors:\n  - key: key4\n    rate_limit: {name: key4_rate_limit, unit: day, requests_per_unit: 1}\n  - key: key7\n    detailed_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 70}\n  - key: route\n    value_to_metric: true\n    descriptors:\n      - key: http_method\n        value_to_metric: true\n        descriptors:\n          - key: subject_id\n            rate_limit: {unit: minute, requests_per_unit: 60}\n  - key: user\n    value_to_metric: true\n    descriptors:\n      - key: action\n        value: read*\n        value_to_metric: true\n        descriptors:\n          - key: resource\n            detailed_metric: true\n            rate_limit: {unit: minute, requests_per_unit: 100}\n  - key: wild\n    value: foo*\n    value_to_metric: true\n    share_threshold: true\n    rate_limit: {unit: minute, requests_per_unit: 20}\n",
    );
    let named = r.find("d", &[("key4", "foo")]).unwrap();
    assert_eq!(&*named.limit.label, "d.key4", "the path, not the name");
    assert_eq!(named.limit.name.as_deref(), Some("key4_rate_limit"));
    assert_eq!(
        hit(&r, &[("key7", "unspecified_value")]),
        Some((70, "d.key7_unspecified_value".into()))
    );
    assert_eq!(hit(&r, &[("key7", "")]).unwrap().1, "d.key7_");
    assert_eq!(
        hit(
            &r,
            &[
                ("route", "draw"),
                ("http_method", "GET"),
                ("subject_id", "123")
            ]
        )
        .unwrap()
        .1,
        "d.route_draw.http_method_GET.subject_id"
    );
    assert_eq!(
        hit(
            &r,
            &[("route", ""), ("http_method", ""), ("subject_id", "123")]
        )
        .unwrap()
        .1,
        "d.route.http_method.subject_id"
    );
    assert_eq!(
        hit(
            &r,
            &[
                ("user", "alice"),
                ("action", "readfile"),
                ("resource", "docs")
            ]
        )
        .unwrap()
        .1,
        "d.user_alice.action_readfile.resource_docs",
        "detailed_metric on the rule wins over value_to_metric"
    );
    assert_eq!(
        hit(&r, &[("wild", "foo1")]).unwrap().1,
        "d.wild_foo*",
        "share_threshold keeps the pattern over value_to_metric"
    );
}

#[test]
fn units_keep_their_meaning_and_zero_denies() {
    let r = rules(
        "domain: d\ndescriptors:\n  - key: m\n    rate_limit: {unit: MONTH, requests_per_unit: 0}\n",
    );
    let l = r.find("d", &[("m", "x")]).unwrap().limit;
    let spec = l.spec.unwrap();
    assert_eq!(spec.period(), Period::Duration(30 * 86_400 * SECOND));
    assert_eq!(spec.algorithm(), Algorithm::FixedWindow);
    assert_eq!(spec.limit(), 0);
    assert!(l.drain_over_limit, "refused hits count, as upstream");
}

#[test]
fn upstream_shapes_load() {
    // Null lists, YAML 1.1 booleans, numbers as values, and every key
    // upstream accepts.
    let r = rules(
        "domain: d\ndescriptors:\n  - key: code\n    value: 200\n    shadow_mode: yes\n    quota_mode: on\n    detailed_metric: no\n    value_to_metric: off\n    metadata:\n      name: svc\n      nested: {a: 1, list: [x, 2.5, true, null], 7: seven}\n    rate_limit: {unit: second, requests_per_unit: 5, name: n, replaces: [{name: other}]}\n    descriptors:\n",
    );
    let l = r.find("d", &[("code", "200")]).unwrap().limit;
    assert!(l.shadow && l.quota_mode && !l.detailed_metric);
    assert_eq!(
        serde_json::Value::Object((*l.metadata.clone().unwrap()).clone()),
        serde_json::json!({"name": "svc", "nested": {"a": 1, "list": ["x", 2.5, true, null], "7": "seven"}})
    );
    assert!(r.has_metadata());
    assert!(rules("domain: d\ndescriptors:\n").has_domain("d"));
}

#[test]
fn malformed_files_name_the_line_and_the_field() {
    let cases: &[(&str, &str)] = &[
        ("descriptors:\n", "domain: the file must name a domain"),
        (
            "domain: d\ndescriptors:\n  - value: v\n",
            "line 3: d: descriptor has an empty key",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
            "line 4: d.k: rate_limit.unit: invalid unit 'fortnight'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      unit: day\n",
            "line 6: d.k: rate_limit.unit: should not be set when unlimited",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
            "line 5: duplicate descriptor composite key 'd.k_v'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: s\n        rate_limit:\n          name: self\n          replaces: [{name: self}]\n          unit: second\n",
            "line 8: d.a.s: rate_limit.replaces: a limit cannot replace itself ('self')",
        ),
        (
            "domain: d\ndescriptors:\n  - key: s\n    rate_limit:\n      replaces:\n        - name:\n      unit: second\n",
            "line 6: d.s: rate_limit.replaces: an entry has an empty name",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: magic}\n",
            "line 4: d.k: rate_limit.algorithm: unknown algorithm 'magic'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    metadata: {a: !thing 1}\n",
            "line 4: d.k: metadata: YAML tags (!thing) are not supported",
        ),
    ];
    for (text, want) in cases {
        let got = err(text);
        assert!(got.starts_with(want), "want {want:?}, got {got:?}");
    }
    // What serde refuses names the line and the key too.
    let got = err("domain: d\ndescriptors:\n  - key: k\n    ratelimit: {unit: day}\n");
    assert!(
        got.contains("unknown field `ratelimit`") && got.contains("line 4"),
        "{got}"
    );
    let got = err(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requestsperunit: 5}\n",
    );
    assert!(
        got.contains("unknown field `requestsperunit`") && got.contains("line 4"),
        "{got}"
    );
    let got = err(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
    );
    assert!(got.contains("line 4"), "{got}");
    assert!(err("0.25: d\ndescriptors:\n").contains("unknown field `0.25`"));
    assert!(err("'''\n").contains("line 2"));
}

#[test]
fn a_list_entry_that_is_not_a_map_says_what_a_descriptor_is() {
    let got = err("domain: d\ndescriptors:\n  - a\n  - b\n");
    assert!(got.contains("line 3"), "{got}");
    assert!(got.contains("invalid type: string \"a\""), "{got}");
    assert!(
        got.contains("expected a descriptor: a map such as `{key: user"),
        "{got}"
    );
    assert!(!got.contains("Yaml"), "no internal type names: {got}");
    let got = err("domain: d\ndescriptors:\n  - key: k\n    rate_limit: 5\n");
    assert!(
        got.contains("expected a rate limit: a map such as"),
        "{got}"
    );
    assert!(!got.contains("Yaml"), "{got}");
}

#[test]
fn domains_merge_only_when_asked() {
    let file = |n: &str, text: &str| (PathBuf::from(n), text.to_string());
    let one = file(
        "1.yaml",
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 10}\n",
    );
    let two = file(
        "2.yaml",
        "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 20}\n",
    );
    let bounds = Bounds::default();
    let e = Rules::from_files(&[one.clone(), two.clone()], &bounds, false).unwrap_err();
    assert_eq!(e.file, "2.yaml");
    assert!(
        e.message.contains("'d' is already defined in 1.yaml"),
        "{e}"
    );
    let r = Rules::from_files(&[one.clone(), two], &bounds, true).unwrap();
    assert_eq!(hit(&r, &[("a", "x")]).unwrap().0, 10);
    assert_eq!(hit(&r, &[("b", "x")]).unwrap().0, 20);
    let e = Rules::from_files(&[one.clone(), one], &bounds, true).unwrap_err();
    assert!(
        e.message
            .contains("duplicate descriptor composite key 'd.a'"),
        "{e}"
    );
}

#[test]
fn replaces_drops_the_named_limit() {
    let r = rules(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, name: general}\n  - key: b\n    rate_limit:\n      unit: second\n      requests_per_unit: 9\n      replaces: [{name: general}]\n",
    );
    let mut limits = vec![r.find("d", &[("a", "1")]), r.find("d", &[("b", "1")])];
    apply_replaces(&mut limits);
    assert!(limits[0].is_none());
    assert_eq!(limits[1].as_ref().unwrap().limit.requests_per_unit, 9);
    // An unlimited rule is never replaced away.
    let r = rules(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, name: free}\n  - key: b\n    rate_limit:\n      unit: second\n      requests_per_unit: 9\n      replaces: [{name: free}]\n",
    );
    let mut limits = vec![r.find("d", &[("a", "1")]), r.find("d", &[("b", "1")])];
    apply_replaces(&mut limits);
    assert_eq!(
        limits[0].as_ref().unwrap().limit.name.as_deref(),
        Some("free")
    );
}

#[test]
fn the_fingerprint_changes_with_names_and_contents_only() {
    let f = |n: &str, t: &str| vec![(PathBuf::from(n), t.to_string())];
    assert_eq!(
        fingerprint(&f("a.yaml", "x")),
        fingerprint(&f("a.yaml", "x"))
    );
    assert_ne!(
        fingerprint(&f("a.yaml", "x")),
        fingerprint(&f("a.yaml", "y"))
    );
    assert_ne!(
        fingerprint(&f("a.yaml", "x")),
        fingerprint(&f("b.yaml", "x"))
    );
    assert!(is_rule_file(std::path::Path::new("/r/edge.yml")));
    assert!(!is_rule_file(std::path::Path::new("/r/sluice.log")));
    assert!(!is_rule_file(std::path::Path::new("/r/..data")));
}
