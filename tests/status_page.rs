//! The status page on the admin listener: what `/status` shows of a
//! 3-node cluster after a key is refused, who may see it, and that hostile
//! input (a key that is markup, long URIs, unknown paths) gets a 4xx or
//! escaped data, never a panic.

mod common;

use std::time::Duration;

use common::{ADMIN_TOKEN, TestNode, cluster, eventually, inline};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A raw HTTP/1.1 GET with extra header lines: (status, head, body).
async fn get(addr: std::net::SocketAddr, target: &str, headers: &str) -> (u16, String, String) {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connects");
    let req =
        format!("GET {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{headers}\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf))
        .await
        .expect("the node answers and closes")
        .unwrap();
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, head.to_lowercase(), body.to_string())
}

fn bearer() -> String {
    format!("Authorization: Bearer {ADMIN_TOKEN}\r\n")
}

/// `/status` as JSON, with the Bearer token.
async fn status(n: &TestNode) -> serde_json::Value {
    let (code, _, body) = get(n.node.admin_addr, "/status", &bearer()).await;
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("JSON")
}

fn refused_keys(s: &serde_json::Value) -> Vec<String> {
    s["top_by_refusals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key"].as_str().unwrap().to_string())
        .collect()
}

const HOSTILE: &str = "<script>alert(1)</script>";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_shows_the_cluster_and_who_is_refused() {
    let nodes = cluster(3, |_| {}).await;
    for key in ["abuser", HOSTILE] {
        for _ in 0..5 {
            nodes[0].check(inline("status", key, 2, 60_000)).await;
        }
    }
    // Every node: three members whose shares make the whole ring.
    for n in &nodes {
        let s = status(n).await;
        let members = s["members"].as_array().unwrap();
        assert_eq!(members.len(), 3, "{s}");
        let total: f64 = members
            .iter()
            .map(|m| m["ring_share_pct"].as_f64().unwrap())
            .sum();
        assert!((total - 100.0).abs() < 0.5, "shares sum to {total}");
        assert_eq!(s["cluster_size"], 3);
        assert_eq!(s["minority"], false);
    }
    // The owner of each key ranks it among its refusals (its entry is
    // where the key is decided).
    for key in ["abuser", HOSTILE] {
        let mut found = false;
        for n in &nodes {
            let s = status(n).await;
            if let Some(k) = s["top_by_refusals"]
                .as_array()
                .unwrap()
                .iter()
                .find(|k| k["key"] == key)
            {
                assert_eq!(k["name"], "status");
                assert_eq!(k["refusals"], 3);
                assert_eq!(k["hits"], 5);
                found = true;
            }
        }
        assert!(found, "{key} in some node's top by refusals");
    }
    // The node the checks arrived at counted them: rates are nonzero.
    let s = status(&nodes[0]).await;
    assert!(s["rates"]["total_per_s"].as_f64().unwrap() > 0.0, "{s}");
    let over = s["rates"]["by_status"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r[0] == "over_limit")
        .unwrap()[1]
        .as_f64()
        .unwrap();
    assert!(over > 0.0, "{s}");
    // Per peer: forwards from node-0 to each peer (twenty keys spread over
    // the ring; none to itself) have a latency; replicas sent from an owner
    // to its successor, a lag (once the round that carried them is over).
    for i in 0..20 {
        nodes[0]
            .check(inline("spread", &i.to_string(), 5, 60_000))
            .await;
    }
    let s = status(&nodes[0]).await;
    for m in s["members"].as_array().unwrap() {
        if m["is_self"] == true {
            assert!(m["forward_latency_ms"].is_null(), "{m}");
        } else {
            let ms = m["forward_latency_ms"].as_f64().unwrap_or(0.0);
            assert!(ms > 0.0 && ms < 10_000.0, "{m}");
        }
    }
    eventually(
        "some owner shows its successor's replication lag",
        Duration::from_secs(10),
        || async {
            let mut seen = false;
            for n in &nodes {
                for m in status(n).await["members"].as_array().unwrap() {
                    seen |= m["replication_lag_ms"].as_f64().is_some();
                }
            }
            seen
        },
    )
    .await;
    // The key that is markup is escaped in the JSON text itself.
    let holder = {
        let mut holder = None;
        for (i, n) in nodes.iter().enumerate() {
            if refused_keys(&status(n).await).iter().any(|k| k == HOSTILE) {
                holder = Some(i);
            }
        }
        holder.expect("a node holds the hostile key")
    };
    let (_, _, raw) = get(nodes[holder].node.admin_addr, "/status", &bearer()).await;
    assert!(!raw.contains("<script>"), "raw markup in the JSON");
    assert!(raw.contains("\\u003cscript\\u003ealert(1)\\u003c/script\\u003e"));
    // The page is static: no data in it, and data only via textContent.
    let (code, head, html) = get(nodes[holder].node.admin_addr, "/", &bearer()).await;
    assert_eq!(code, 200);
    assert!(head.contains("content-type: text/html"));
    assert!(!html.contains("alert(1)"));
    assert!(!html.contains("abuser"));
    assert!(!html.contains("innerHTML"));
    assert!(html.contains("textContent"));
    assert!(html.contains("name=\"viewport\""));
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "no external assets"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_an_operator_sees_the_page_and_hostile_uris_get_4xx() {
    let nodes = cluster(1, |_| {}).await;
    let addr = nodes[0].node.admin_addr;
    for path in ["/", "/status"] {
        let (code, head, _) = get(addr, path, "").await;
        assert_eq!(code, 401, "{path} without credentials");
        assert!(
            head.contains("www-authenticate: basic realm=\"sluice\""),
            "{head}"
        );
        let (code, _, _) = get(
            addr,
            path,
            "Authorization: Bearer wrong-token-0123456789\r\n",
        )
        .await;
        assert_eq!(code, 401, "{path} with a wrong token");
        let (code, _, _) = get(addr, path, &bearer()).await;
        assert_eq!(code, 200, "{path} with Bearer");
        let basic = encode(&format!("anyone:{ADMIN_TOKEN}"));
        let (code, _, _) = get(addr, path, &format!("Authorization: Basic {basic}\r\n")).await;
        assert_eq!(code, 200, "{path} with Basic");
        let wrong = encode("anyone:not-the-token");
        let (code, _, _) = get(addr, path, &format!("Authorization: Basic {wrong}\r\n")).await;
        assert_eq!(code, 401, "{path} with a wrong Basic password");
    }
    let long = format!("/status?q={}", "a".repeat(10 * 1024));
    let (code, _, _) = get(addr, &long, &bearer()).await;
    assert!((400..500).contains(&code), "a 10 KB query string: {code}");
    let long = format!("/{}", "x".repeat(10 * 1024));
    let (code, _, _) = get(addr, &long, &bearer()).await;
    assert!((400..500).contains(&code), "a 10 KB path: {code}");
    for path in ["/nope", "/status/x", "/../etc/passwd", "/metrics"] {
        let (code, _, _) = get(addr, path, &bearer()).await;
        assert_eq!(code, 404, "{path}");
    }
    // Over HTTP/1.1 the listener serves the page only: not the admin gRPC
    // API (even with the token), so credentials a browser caches for the
    // page can never drive a reset.
    for path in ["/sluice.v1.Admin/ResetKey", "/grpc.health.v1.Health/Check"] {
        let (code, _, _) = get(addr, path, &bearer()).await;
        assert_eq!(code, 404, "{path} over HTTP/1.1");
    }
    // A credential longer than any token is refused before it is decoded.
    let huge = encode(&format!("anyone:{}", "t".repeat(8 * 1024)));
    let (code, _, _) = get(addr, "/status", &format!("Authorization: Basic {huge}\r\n")).await;
    assert_eq!(code, 401, "an 11 KB credential");
    // The admin gRPC API on the same listener still works, and still
    // needs the token.
    let mut admin = nodes[0].admin().await;
    admin
        .cluster_status(sluice::proto::v1::ClusterStatusRequest {})
        .await
        .expect("admin gRPC beside the page");
    // The node is still up after all of it.
    eventually("the page still answers", Duration::from_secs(5), || async {
        get(addr, "/status", &bearer()).await.0 == 200
    })
    .await;
}

/// Base64 for the Basic header.
fn encode(text: &str) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in text.as_bytes().chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
