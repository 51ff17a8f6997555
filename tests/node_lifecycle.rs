//! A node over time: config reloads (good and broken edits), idle keys
//! swept on the fake clock, eviction order when full, graceful shutdown.

mod common;

use std::time::Duration;

use common::{MS, config, eventually, inline, policy, start, start_with, under};
use sluice::config::Sources;

const WAIT: Duration = Duration::from_secs(10);

/// A node's config with policy `api` at `limit` per minute.
fn config_body(limit: &str) -> String {
    format!(
        "node_id = \"test-node\"\ngrpc_addr = \"127.0.0.1:0\"\nhttp_addr = \"127.0.0.1:0\"\n\
         [admin]\naddr = \"127.0.0.1:0\"\n\
         [cluster]\ngossip_addr = \"127.0.0.1:0\"\n\
         [policies.api]\nlimit = {limit}\nduration = \"1m\"\n"
    )
}

/// A node started from the config file at `file`, which it watches.
async fn start_from_file(file: std::path::PathBuf) -> common::TestNode {
    let sources = Sources {
        file: Some(file),
        ..Default::default()
    };
    let (cfg, policies) = sluice::policy::load(&sources).unwrap();
    start_with(cfg, policies, Some(sources)).await
}

/// A check of policy `api` for a fresh key of `name` that spends nothing:
/// its answer carries the limit in force.
fn peek_api(name: &str) -> sluice::proto::v1::RateLimitRequest {
    let mut r = policy(name, "fresh", "api");
    r.hits = Some(0);
    r
}

#[tokio::test]
async fn config_reload_applies_good_edits_and_refuses_broken_ones() {
    let dir = std::env::temp_dir().join(format!("sluice-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("sluice.toml");
    let write = |limit: &str| {
        // Write then rename, as editors do, so the watcher never reads half a file.
        let tmp = dir.join("sluice.toml.tmp");
        std::fs::write(&tmp, config_body(limit)).unwrap();
        std::fs::rename(&tmp, &file).unwrap();
    };
    write("2");
    let n = start_from_file(file.clone()).await;
    let peek = || peek_api("reload");
    assert_eq!(n.check(peek()).await.limit, 2);

    write("5");
    eventually("the new limit", WAIT, || async {
        n.check(peek()).await.limit == 5
    })
    .await;

    write("\"lots\"");
    eventually("the refused reload", WAIT, || async {
        n.http_get("/metrics")
            .await
            .1
            .contains("sluice_config_reloads_total{result=\"error\"} 1")
    })
    .await;
    // The previous config keeps serving.
    assert_eq!(n.check(peek()).await.limit, 5);
    let r = n.check(policy("reload", "k", "api")).await;
    assert!(under(&r));
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn config_reload_follows_a_configmap_swap() {
    // A ConfigMap mount: `sluice.toml` is a symlink through `..data`, which
    // the kubelet points at a new directory in one rename; the file's own
    // name sees no event.
    let dir = std::env::temp_dir().join(format!("sluice-configmap-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(dir.join("..v1")).unwrap();
    std::fs::write(dir.join("..v1/sluice.toml"), config_body("2")).unwrap();
    std::os::unix::fs::symlink("..v1", dir.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/sluice.toml", dir.join("sluice.toml")).unwrap();
    let n = start_from_file(dir.join("sluice.toml")).await;
    let peek = || peek_api("configmap");
    assert_eq!(n.check(peek()).await.limit, 2);
    std::fs::create_dir_all(dir.join("..v2")).unwrap();
    std::fs::write(dir.join("..v2/sluice.toml"), config_body("5")).unwrap();
    std::os::unix::fs::symlink("..v2", dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    eventually("the swapped-in limit", WAIT, || async {
        n.check(peek()).await.limit == 5
    })
    .await;
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn idle_keys_are_swept_once_fresh() {
    let mut cfg = config();
    cfg.limits.sweep_interval = Duration::from_millis(20);
    let n = start(cfg).await;
    let store = n.node.limiter.store().clone();
    // 10 per second: one hit refills in 100 ms, ten in a second.
    let mut one = inline("idle", "one", 10, 1_000);
    one.hits = Some(1);
    let mut ten = inline("idle", "ten", 10, 1_000);
    ten.hits = Some(10);
    n.check(one).await;
    n.check(ten).await;
    assert_eq!(store.len(), 2);
    n.clock.advance(100 * MS);
    eventually("the refilled key to go", WAIT, || async {
        store.len() == 1
    })
    .await;
    // A key still in use stays, with what it had: 10 hits, one refilled.
    let ten = n
        .node
        .limiter
        .inspect("idle", "ten")
        .expect("a key still in use stays");
    assert_eq!((ten.hits, ten.remaining), (10, 1));
    n.clock.advance(900 * MS);
    eventually("every key to go", WAIT, || async { store.is_empty() }).await;
}

#[tokio::test]
async fn a_full_table_evicts_the_key_closest_to_fresh() {
    let mut cfg = config();
    cfg.limits.max_keys = 3;
    let n = start(cfg).await;
    for (k, hits) in [("ninety", 9), ("ten", 1), ("fifty", 5)] {
        let mut r = inline("evict", k, 10, 60_000);
        r.hits = Some(hits);
        assert!(under(&n.check(r).await));
    }
    assert!(under(&n.check(inline("evict", "new", 10, 60_000)).await));
    let limiter = &n.node.limiter;
    assert_eq!(limiter.store().len(), 3);
    assert!(limiter.inspect("evict", "ten").is_none());
    // The kept keys keep their counts (an eviction would have restarted
    // one fresh).
    for (k, hits) in [("ninety", 9), ("fifty", 5), ("new", 1)] {
        let v = limiter
            .inspect("evict", k)
            .unwrap_or_else(|| panic!("{k} kept"));
        assert_eq!((v.hits, v.remaining), (hits, 10 - hits), "{k}");
    }
    let metrics = n.http_get("/metrics").await.1;
    assert!(metrics.contains("sluice_evictions_total 1"), "{metrics}");
}

#[tokio::test]
async fn leaving_stops_serving_and_ends_every_task() {
    let n = start(config()).await;
    assert!(under(&n.check(inline("bye", "k", 1, 60_000)).await));
    let (grpc, http) = (n.node.grpc_addr, n.node.http_addr);
    tokio::time::timeout(WAIT, n.node.leave())
        .await
        .expect("all tasks end");
    for addr in [grpc, http] {
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "{addr} still accepts"
        );
    }
}
