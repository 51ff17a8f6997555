//! The Envoy rate limit service as Envoy calls it, on one node and through a
//! 3-node cluster: rules in envoyproxy/ratelimit's format, several
//! descriptors per request, hits_addend, overrides, unlimited, shadow mode,
//! replaces, wildcards, per-value counters, deny-all, hot reload; and the
//! HTTP check endpoint with its refusal headers.
//!
//! `upstream` replays envoyproxy/ratelimit's own config tests (its rules
//! rewritten here, its expected answers) through the real server;
//! `parity` the answers upstream's service gives beyond its config;
//! `reload` what makes the rules watcher reload.

mod common;
#[path = "envoy_rls/parity.rs"]
mod parity;
#[path = "envoy_rls/reload.rs"]
mod reload;
#[path = "envoy_rls/upstream.rs"]
mod upstream;
#[path = "envoy_rls/upstream_share.rs"]
mod upstream_share;
#[path = "envoy_rls/upstream_stats.rs"]
mod upstream_stats;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use common::{TestNode, cluster, config, eventually, start};
use sluice::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use sluice::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use sluice::proto::envoy::service::ratelimit::v3 as rls;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

/// Rules in envoyproxy/ratelimit's documented format (and one extension).
const RULES: &str = r#"
domain: edge
descriptors:
  # Nested: the limit applies to the full path of entries.
  - key: category
    value: account
    descriptors:
      - key: source_cluster
        value: proxy
        rate_limit:
          unit: second
          requests_per_unit: 3
  # No value: one counter per remote address.
  - key: remote_address
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
  # A specific value is whitelisted.
  - key: user
    value: internal
    rate_limit:
      unlimited: true
  - key: user
    rate_limit:
      unit: hour
      requests_per_unit: 5
      name: per_user
  # Wildcard prefix.
  - key: path
    value: "/api/*"
    rate_limit:
      unit: day
      requests_per_unit: 4
  # Shadow mode: counted, never refused.
  - key: shadow
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
  # Deny all.
  - key: blocked
    rate_limit:
      unit: second
      requests_per_unit: 0
  # replaces: a premium user's limit replaces the per-user one.
  - key: plan
    value: premium
    rate_limit:
      unit: hour
      requests_per_unit: 50
      replaces:
        - name: per_user
  # Sluice extension: another algorithm and a burst.
  - key: tenant
    rate_limit:
      unit: minute
      requests_per_unit: 60
      algorithm: token_bucket
      burst: 2
"#;

fn rules_dir(tag: &str, body: &str) -> PathBuf {
    rules_files(tag, &[("edge.yaml", body)])
}

/// A fresh directory of rule files.
fn rules_files(tag: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-rules-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (name, body) in files {
        std::fs::write(dir.join(name), body).unwrap();
    }
    dir
}

/// Rules of domain `edge`: key `k`, `n` an hour.
fn hourly_rule(n: u32) -> String {
    format!(
        "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: {n}}}\n"
    )
}

/// The limit the node's rules set for key `k` now (a check that spends
/// nothing).
async fn limit_of(n: &TestNode) -> Option<u32> {
    ask(n, vec![desc(&[("k", "probe")])], 0).await.statuses[0]
        .current_limit
        .as_ref()
        .map(|l| l.requests_per_unit)
}

/// Replace `path` with `body` as editors do: a write, then a rename over.
fn write_over(path: &std::path::Path, body: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, body).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A node serving the rules in `dir`, with `tweak` applied to its config.
async fn serve(dir: &std::path::Path, tweak: impl Fn(&mut sluice::config::Config)) -> TestNode {
    let mut c = config();
    c.envoy.rules_path = Some(dir.to_path_buf());
    tweak(&mut c);
    start(c).await
}

/// One call to `ShouldRateLimit` in `domain`.
async fn ask_in(
    node: &TestNode,
    domain: &str,
    descriptors: Vec<RateLimitDescriptor>,
    hits: u32,
) -> rls::RateLimitResponse {
    RateLimitServiceClient::new(node.channel.clone())
        .should_rate_limit(rls::RateLimitRequest {
            domain: domain.into(),
            descriptors,
            hits_addend: hits,
        })
        .await
        .unwrap()
        .into_inner()
}

/// Decisions counted so far, by `limit` label (every status and reason).
async fn decisions(node: &TestNode) -> BTreeMap<String, f64> {
    let (_, text) = node.http_get("/metrics").await;
    let mut by = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("sluice_decisions_total{limit=\"") else {
            continue;
        };
        let (label, _) = rest.split_once("\",").unwrap();
        let n: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        *by.entry(label.to_string()).or_default() += n;
    }
    by
}

/// What one single-descriptor call answered: the limit it reported
/// (`requests_per_unit`, unit, name) and the stats labels it counted under.
#[derive(Debug, PartialEq)]
struct Probe {
    limit: Option<(u32, i32, String)>,
    labels: Vec<String>,
}

async fn probe(node: &TestNode, domain: &str, d: RateLimitDescriptor) -> Probe {
    let before = decisions(node).await;
    let r = ask_in(node, domain, vec![d], 0).await;
    let after = decisions(node).await;
    Probe {
        limit: r.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| (l.requests_per_unit, l.unit, l.name.clone())),
        labels: after
            .into_iter()
            .filter(|(k, v)| before.get(k) != Some(v))
            .map(|(k, _)| k)
            .collect(),
    }
}

/// The probe of a rule with this limit counted under `label`.
fn limited(rpu: u32, unit: Unit, name: &str, label: &str) -> Probe {
    Probe {
        limit: Some((rpu, unit as i32, name.into())),
        labels: vec![label.into()],
    }
}

/// The probe of a descriptor no rule limits.
fn unlimited() -> Probe {
    Probe {
        limit: None,
        labels: vec![],
    }
}

fn desc(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        ..Default::default()
    }
}

async fn ask(
    node: &TestNode,
    descriptors: Vec<RateLimitDescriptor>,
    hits: u32,
) -> rls::RateLimitResponse {
    RateLimitServiceClient::new(node.channel.clone())
        .should_rate_limit(rls::RateLimitRequest {
            domain: "edge".into(),
            descriptors,
            hits_addend: hits,
        })
        .await
        .unwrap()
        .into_inner()
}

/// How many of `n` single-descriptor requests get OK.
async fn oks(nodes: &[TestNode], d: &RateLimitDescriptor, n: usize) -> usize {
    let mut ok = 0;
    for i in 0..n {
        let r = ask(&nodes[i % nodes.len()], vec![d.clone()], 0).await;
        ok += usize::from(r.overall_code == Code::Ok as i32);
    }
    ok
}

async fn every_case(nodes: &[TestNode]) {
    // Nested rule, and entries deeper or shallower than it.
    assert_eq!(
        oks(
            nodes,
            &desc(&[("category", "account"), ("source_cluster", "proxy")]),
            5
        )
        .await,
        3
    );
    assert_eq!(
        oks(nodes, &desc(&[("category", "account")]), 5).await,
        5,
        "no limit at that depth"
    );
    // Per-value counters for a rule without a value.
    assert_eq!(
        oks(nodes, &desc(&[("remote_address", "10.0.0.1")]), 4).await,
        2
    );
    assert_eq!(
        oks(nodes, &desc(&[("remote_address", "10.0.0.2")]), 4).await,
        2
    );
    // Whitelisted value vs the general rule.
    assert_eq!(oks(nodes, &desc(&[("user", "internal")]), 10).await, 10);
    assert_eq!(oks(nodes, &desc(&[("user", "alice")]), 10).await, 5);
    // Wildcard, shadow, deny-all, unknown keys.
    assert_eq!(oks(nodes, &desc(&[("path", "/api/orders")]), 6).await, 4);
    assert_eq!(oks(nodes, &desc(&[("path", "/web")]), 6).await, 6);
    assert_eq!(
        oks(nodes, &desc(&[("shadow", "x")]), 5).await,
        5,
        "shadow mode never refuses"
    );
    assert_eq!(oks(nodes, &desc(&[("blocked", "x")]), 3).await, 0);
    assert_eq!(oks(nodes, &desc(&[("nothing", "here")]), 3).await, 3);
    // Sluice extension: a token bucket with burst 2.
    assert_eq!(oks(nodes, &desc(&[("tenant", "t1")]), 5).await, 2);

    // Several descriptors in one request: the most restrictive wins, each
    // has its own status.
    let r = ask(
        &nodes[0],
        vec![
            desc(&[("user", "bob")]),
            desc(&[("blocked", "y")]),
            desc(&[("none", "z")]),
        ],
        0,
    )
    .await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(r.statuses.len(), 3);
    assert_eq!(r.statuses[0].code, Code::Ok as i32);
    let current = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (current.requests_per_unit, current.name.as_str()),
        (5, "per_user")
    );
    assert_eq!(r.statuses[0].limit_remaining, 4);
    assert!(r.statuses[0].duration_until_reset.unwrap().seconds <= 3_600);
    assert_eq!(r.statuses[1].code, Code::OverLimit as i32);
    assert_eq!(r.statuses[2].code, Code::Ok as i32);
    assert!(r.statuses[2].current_limit.is_none(), "no rule, no limit");

    // hits_addend: per request (0 means 1) and per descriptor.
    let r = ask(&nodes[0], vec![desc(&[("user", "carol")])], 4).await;
    assert_eq!(r.statuses[0].limit_remaining, 1);
    let mut two = desc(&[("user", "carol")]);
    two.hits_addend = Some(2);
    let r = ask(&nodes[1 % nodes.len()], vec![two], 1).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32, "2 hits with 1 left");

    // replaces: with the premium plan matched, per_user no longer applies.
    let r = ask(
        &nodes[0],
        vec![desc(&[("user", "alice")]), desc(&[("plan", "premium")])],
        0,
    )
    .await;
    assert_eq!(r.overall_code, Code::Ok as i32, "{r:?}");
    assert_eq!(r.statuses[0].current_limit, None, "replaced");

    // A limit override from Envoy's config replaces the rule's.
    let mut over = desc(&[("user", "dave")]);
    over.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: sluice::proto::envoy::r#type::v3::RateLimitUnit::Minute as i32,
    });
    assert_eq!(oks(nodes, &over, 3).await, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn envoy_protocol_on_one_node() {
    let dir = rules_dir("one", RULES);
    let mut c = config();
    c.envoy.rules_path = Some(dir.clone());
    c.envoy.response_headers = true;
    let n = start(c).await;
    every_case(std::slice::from_ref(&n)).await;
    // Quota headers on a refusal, from the strictest descriptor.
    let r = ask(&n, vec![desc(&[("blocked", "h")])], 0).await;
    let keys: Vec<&str> = r
        .response_headers_to_add
        .iter()
        .map(|h| h.key.as_str())
        .collect();
    for k in [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "ratelimit-policy",
        "ratelimit",
    ] {
        assert!(keys.contains(&k), "{k} missing from {keys:?}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test(flavor = "multi_thread")]
async fn envoy_protocol_through_three_nodes() {
    let dir = rules_dir("three", RULES);
    let nodes = cluster(3, |c| c.envoy.rules_path = Some(dir.clone())).await;
    every_case(&nodes).await;
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test(flavor = "multi_thread")]
async fn rules_reload_on_edit_and_on_a_configmap_swap() {
    // A ConfigMap mount: files are symlinks into a directory `..data` points at.
    let root = std::env::temp_dir().join(format!("sluice-cm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let v1 = root.join("..v1");
    std::fs::create_dir_all(&v1).unwrap();
    std::fs::write(v1.join("edge.yaml"), hourly_rule(1)).unwrap();
    std::os::unix::fs::symlink("..v1", root.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/edge.yaml", root.join("edge.yaml")).unwrap();
    let mut c = config();
    c.envoy.rules_path = Some(root.clone());
    let n = start(c).await;
    assert_eq!(limit_of(&n).await, Some(1));
    // Swap `..data` atomically to a new version, as the kubelet does.
    let v2 = root.join("..v2");
    std::fs::create_dir_all(&v2).unwrap();
    std::fs::write(v2.join("edge.yaml"), hourly_rule(7)).unwrap();
    std::os::unix::fs::symlink("..v2", root.join("..data_tmp")).unwrap();
    std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
    eventually("the swapped rules", Duration::from_secs(10), || async {
        limit_of(&n).await == Some(7)
    })
    .await;
    // A broken version is refused; the old rules keep working.
    let v3 = root.join("..v3");
    std::fs::create_dir_all(&v3).unwrap();
    std::fs::write(
        v3.join("edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight}\n",
    )
    .unwrap();
    std::os::unix::fs::symlink("..v3", root.join("..data_tmp")).unwrap();
    std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
    eventually("the refused reload", Duration::from_secs(10), || async {
        n.http_get("/metrics")
            .await
            .1
            .contains("sluice_config_reloads_total{result=\"error\"} 1")
    })
    .await;
    assert_eq!(limit_of(&n).await, Some(7));
    std::fs::remove_dir_all(&root).ok();
}

/// The DaemonSet's layout (`deploy/k8s/daemonset.yaml`): the rules are a
/// directory inside the ConfigMap, reached through the symlink `rules ->
/// ..data/rules`. The kubelet points `..data` at a new directory and
/// deletes the old one, so a watch on the directory the symlink led to at
/// start dies with the first swap; every swap must still reload.
#[tokio::test(flavor = "multi_thread")]
async fn rules_reload_on_every_swap_of_a_configmap_directory() {
    let root = std::env::temp_dir().join(format!("sluice-cm-dir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let version = |v: u32, n: u32| {
        let dir = root.join(format!("..v{v}/rules"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("edge.yaml"), hourly_rule(n)).unwrap();
    };
    version(1, 1);
    std::os::unix::fs::symlink("..v1", root.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/rules", root.join("rules")).unwrap();
    let mut c = config();
    c.envoy.rules_path = Some(root.join("rules"));
    let n = start(c).await;
    assert_eq!(limit_of(&n).await, Some(1));
    for (v, want) in [(2, 7), (3, 9), (4, 11)] {
        // As the kubelet: the new version, `..data` swapped in one rename,
        // the old version deleted.
        version(v, want);
        std::os::unix::fs::symlink(format!("..v{v}"), root.join("..data_tmp")).unwrap();
        std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
        std::fs::remove_dir_all(root.join(format!("..v{}", v - 1))).unwrap();
        eventually(
            &format!("the rules of swap {}", v - 1),
            Duration::from_secs(10),
            || async { limit_of(&n).await == Some(want) },
        )
        .await;
    }
    // An edit inside the directory the symlink now leads to (a deploy
    // that swaps a symlink and then edits in place) reloads too: the
    // directory is watched anew after each reload.
    write_over(&root.join("..v4/rules/edge.yaml"), &hourly_rule(13));
    eventually("the edit in place", Duration::from_secs(10), || async {
        limit_of(&n).await == Some(13)
    })
    .await;
    std::fs::remove_dir_all(&root).ok();
}

/// `rules_path` relative to the working directory: edits inside it reload
/// (the watcher names events by absolute paths).
#[tokio::test(flavor = "multi_thread")]
async fn rules_reload_with_a_relative_path() {
    let dir = rules_dir("relative", &hourly_rule(1));
    let cwd = std::env::current_dir().unwrap();
    let mut relative = PathBuf::new();
    for _ in cwd.components().skip(1) {
        relative.push("..");
    }
    relative.push(dir.strip_prefix("/").unwrap());
    assert!(relative.is_relative() && relative.is_dir(), "{relative:?}");
    let n = serve(&relative, |_| {}).await;
    assert_eq!(limit_of(&n).await, Some(1));
    write_over(&dir.join("edge.yaml"), &hourly_rule(5));
    eventually("the edited rules", Duration::from_secs(10), || async {
        limit_of(&n).await == Some(5)
    })
    .await;
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test(flavor = "multi_thread")]
async fn http_check_endpoint_refuses_with_headers() {
    let n = start(config()).await;
    let post = |body: &'static str| async move {
        common::http_post(&format!("http://{}/v1/check", n.node.http_addr), body).await
    };
    let body = r#"{"name":"api","unique_key":"alice","limit":2,"duration_ms":60000}"#;
    let (code, _, json) = post(body).await;
    assert_eq!(code, 200, "{json}");
    assert!(json.contains("\"status\":\"under_limit\""), "{json}");
    post(body).await;
    let (code, headers, json) = post(body).await;
    assert_eq!(code, 429, "{json}");
    // Limit 2 a minute, both spent (a token bucket: one back every 30 s,
    // full again in 60 s).
    for (h, want) in [
        ("retry-after", "30"),
        ("x-ratelimit-limit", "2"),
        ("x-ratelimit-remaining", "0"),
        ("x-ratelimit-reset", "60"),
        ("ratelimit-policy", "\"api\";q=2;w=60"),
        ("ratelimit", "\"api\";r=0;t=60"),
    ] {
        assert_eq!(
            headers.get(h).map(String::as_str),
            Some(want),
            "{h}: {headers:?}"
        );
    }
    assert!(json.contains("\"reason\":\"limit_exceeded\""), "{json}");
    let (code, _, json) = post(r#"{"name":"api","unique_key":"","limit":2,"duration_ms":1}"#).await;
    assert_eq!(code, 400);
    assert!(json.contains("\"field\":\"unique_key\""), "{json}");
    let (code, _, json) = post("not json").await;
    assert_eq!(code, 400);
    assert!(json.contains("\"field\":\"body\""), "{json}");
}
