//! Every front end meets the same admission bounds (issue 18): one budget of
//! check calls in progress per node (`limits.max_in_flight_checks`),
//! whichever front a call arrives by — v1, Envoy RLS, HTTP `/v1/check` —
//! and the batch bound (`limits.max_batch`) on Envoy's descriptors as on
//! v1's requests; the HTTP body is bounded by `limits.max_message_bytes`.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{TestNode, cluster, config, eventually, http_post, inline, start, under};
use sluice::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use sluice::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use sluice::proto::envoy::service::ratelimit::v3 as rls;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use sluice::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice::proto::v1 as pb;
use sluice::store::key;

/// Rules for the Envoy calls: 10 a minute per user.
const RULES: &str = r#"
domain: edge
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 10
"#;

fn rules_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-admission-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("edge.yaml"), RULES).unwrap();
    dir
}

fn user(name: &str) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![Entry {
            key: "user".into(),
            value: name.into(),
        }],
        ..Default::default()
    }
}

async fn envoy(
    node: &TestNode,
    descriptors: Vec<RateLimitDescriptor>,
) -> Result<rls::RateLimitResponse, tonic::Status> {
    RateLimitServiceClient::new(node.channel.clone())
        .should_rate_limit(rls::RateLimitRequest {
            domain: "edge".into(),
            descriptors,
            hits_addend: 0,
        })
        .await
        .map(tonic::Response::into_inner)
}

/// `POST /v1/check` of `body`: status, headers, the JSON body.
async fn http_check(
    node: &TestNode,
    body: &str,
) -> (u16, HashMap<String, String>, serde_json::Value) {
    let (status, headers, text) =
        http_post(&format!("http://{}/v1/check", node.node.http_addr), body).await;
    let json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    (status, headers, json)
}

fn json_check(key: &str) -> String {
    format!(r#"{{"name":"adm","unique_key":"{key}","limit":10,"duration_ms":60000}}"#)
}

/// A key of `name` whose owner is `owner`, by `node`'s ring.
fn owned_by(node: &TestNode, name: &str, owner: &str) -> String {
    let ring = node.node.limiter.ring();
    (0..)
        .map(|i| format!("k{i}"))
        .find(|k| &*ring.owner(&key::encode(name, k)).unwrap().node_id == owner)
        .unwrap()
}

/// With `max_in_flight_checks = 1`, a call held in progress on node-0 — a
/// check of a key node-1 owns, forwarded over a gRPC link the test fault
/// hook cuts, so the forward waits out its whole budget
/// (`forward_timeout`) — leaves no room for a second call on any front:
/// the v1 holder refuses an Envoy and an HTTP call, an HTTP holder refuses
/// a v1 and an Envoy call. Each refusal is at once and counted; the gauge
/// follows the holder in and out; once it is done every front answers.
#[tokio::test(flavor = "multi_thread")]
async fn one_budget_of_checks_in_progress_for_every_front() {
    let dir = rules_dir("budget");
    let nodes = cluster(2, |c| {
        c.limits.max_in_flight_checks = 1;
        c.envoy.rules_path = Some(dir.clone());
        // Long enough that the refusals below happen while the holder
        // waits, on a loaded machine too; the breaker never opens.
        c.cluster.forward_timeout = Duration::from_secs(4);
        c.cluster.breaker_failures = 1_000_000;
    })
    .await;
    let n = &nodes[0];
    let slow = owned_by(n, "adm", "node-1");
    let local = owned_by(n, "adm", "node-0");
    n.node.faults.cut_grpc("node-1");
    let metrics = n.node.limiter.metrics().clone();
    let in_flight = || metrics.in_flight.get();
    assert_eq!(in_flight(), 0);

    // Held by a v1 call.
    let mut client = n.client();
    let request = inline("adm", &slow, 10, 60_000);
    let held = tokio::spawn(async move {
        client
            .check(pb::CheckRequest {
                requests: vec![request],
            })
            .await
    });
    eventually(
        "the v1 call to hold the slot",
        Duration::from_secs(10),
        || async { in_flight() == 1 },
    )
    .await;
    let err = envoy(n, vec![user("alice")]).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(
        err.message()
            .starts_with("overloaded: 1 check calls in progress (limits.max_in_flight_checks)"),
        "{err:?}"
    );
    let (status, headers, body) = http_check(n, &json_check(&local)).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["status"], "unavailable", "{body}");
    assert_eq!(body["reason"], "overloaded", "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("limits.max_in_flight_checks"),
        "{body}"
    );
    assert_eq!(headers.get("retry-after").map(String::as_str), Some("1"));
    assert_eq!(in_flight(), 1, "the refusals came while the holder held");
    let answer = held
        .await
        .unwrap()
        .unwrap()
        .into_inner()
        .responses
        .remove(0);
    assert_eq!(answer.path, pb::Path::Fallback as i32, "{answer:?}");
    assert_ne!(answer.reason, pb::Reason::Overloaded as i32, "{answer:?}");
    assert_eq!(in_flight(), 0, "the gauge follows the call out");

    // Held by an HTTP check.
    let url = format!("http://{}/v1/check", n.node.http_addr);
    let held = tokio::spawn(async move { http_post(&url, &json_check(&slow)).await });
    eventually(
        "the HTTP check to hold the slot",
        Duration::from_secs(10),
        || async { in_flight() == 1 },
    )
    .await;
    let shed = n.check(inline("adm", &local, 10, 60_000)).await;
    assert_eq!(shed.status, pb::Status::Unavailable as i32, "{shed:?}");
    assert_eq!(shed.reason, pb::Reason::Overloaded as i32, "{shed:?}");
    let err = envoy(n, vec![user("bob")]).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert_eq!(in_flight(), 1, "the refusals came while the holder held");
    let (status, _, text) = held.await.unwrap();
    let body: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_ne!(status, 503, "{text}");
    assert_eq!(
        body["approximate"], true,
        "decided without the owner: {text}"
    );
    assert_eq!(in_flight(), 0);

    // Four refusals, each counted once in both series.
    assert_eq!(metrics.overloaded.get(), 4);
    assert_eq!(metrics.resources.exhausted_count("in_flight_checks"), 4);
    let text = n.http_get("/metrics").await.1;
    for line in [
        "sluice_checks_in_flight 0",
        "sluice_overloaded_checks_total 4",
        "sluice_resource_exhausted_total{resource=\"in_flight_checks\"} 4",
        "sluice_resource_limit{resource=\"max_in_flight_checks\"} 1",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
    assert!(!n.node.limiter.store().contains(&key::encode("adm", &local)));

    // The budget is back (and the link: alice's key may be node-1's): every
    // front decides again, and the refused calls consumed nothing (alice's
    // first hit, the local key's first two).
    n.node.faults.heal();
    assert!(under(&n.check(inline("adm", &local, 10, 60_000)).await));
    let ok = envoy(n, vec![user("alice")]).await.unwrap();
    assert_eq!(ok.overall_code, Code::Ok as i32);
    assert_eq!(ok.statuses[0].limit_remaining, 9);
    let (status, _, body) = http_check(n, &json_check(&local)).await;
    assert_eq!((status, &body["remaining"]), (200, &serde_json::json!(8)));
}

/// Envoy's descriptors meet `max_batch` as v1's requests do: above it the
/// call is refused before anything is decided, `RESOURCE_EXHAUSTED` naming
/// `descriptors` and the bound, and counted; at it, every descriptor is
/// decided.
#[tokio::test]
async fn envoy_descriptors_beyond_max_batch_are_refused_naming_the_field() {
    let dir = rules_dir("batch");
    let mut c = config();
    c.limits.max_batch = 3;
    c.envoy.rules_path = Some(dir);
    let n = start(c).await;
    let four = ["a", "b", "c", "d"].map(user).to_vec();
    let err = envoy(&n, four.clone()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert_eq!(err.message(), "descriptors: at most 3 per call, got 4");
    assert!(n.node.limiter.store().is_empty(), "nothing decided");
    let resources = &n.node.limiter.metrics().resources;
    assert_eq!(resources.exhausted_count("descriptors"), 1);
    let ok = envoy(&n, four[..3].to_vec()).await.unwrap();
    assert_eq!(ok.statuses.len(), 3);
    assert!(ok.statuses.iter().all(|s| s.limit_remaining == 9), "{ok:?}");
    assert_eq!(n.node.limiter.store().len(), 3);
    // v1 says the same of its requests.
    let err = n
        .client()
        .check(pb::CheckRequest {
            requests: vec![inline("adm", "k", 10, 60_000); 4],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    assert_eq!(err.message(), "requests: at most 3 per call, got 4");
    assert_eq!(resources.exhausted_count("requests"), 1);
}

/// The HTTP check's body is bounded by `max_message_bytes`, as a gRPC
/// message is: above it, 413 naming `body` and the bound, counted with the
/// gRPC refusals, nothing decided; the node still answers.
#[tokio::test]
async fn an_http_body_beyond_max_message_bytes_is_refused_naming_the_field() {
    let mut c = config();
    c.limits.max_message_bytes = 1024;
    let n = start(c).await;
    let big = json_check(&"k".repeat(1_500));
    let (status, _, body) = http_check(&n, &big).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["field"], "body", "{body}");
    assert_eq!(
        body["error"]["message"],
        "body: at most 1024 bytes (limits.max_message_bytes)"
    );
    assert_eq!(
        n.node
            .limiter
            .metrics()
            .resources
            .exhausted_count("message_bytes"),
        1
    );
    assert!(n.node.limiter.store().is_empty());
    let (status, _, body) = http_check(&n, &json_check("small")).await;
    assert_eq!((status, &body["remaining"]), (200, &serde_json::json!(9)));
}

/// A body that cannot be read (here malformed chunked encoding) is a bad
/// request naming `body`, not a body too large; nothing is decided or
/// counted as a size refusal.
#[tokio::test]
async fn an_unreadable_http_body_is_a_bad_request_not_too_large() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let n = start(config()).await;
    let mut tcp = tokio::net::TcpStream::connect(n.node.http_addr)
        .await
        .unwrap();
    tcp.write_all(
        b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Transfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut buf))
        .await
        .expect("the server answers and closes")
        .unwrap();
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(text.contains(r#""field":"body""#), "{text}");
    assert!(text.contains("could not be read"), "{text}");
    assert_eq!(
        n.node
            .limiter
            .metrics()
            .resources
            .exhausted_count("message_bytes"),
        0
    );
    assert!(n.node.limiter.store().is_empty());
}

/// Issue 39, item 5: bytes of messages being received are bounded
/// node-wide before tonic buffers them (`limits.max_inbound_bytes`),
/// charged as they arrive. A raw HTTP/2 client announces a 500,000-byte
/// message and sends none of it (holding nothing), then opens calls that
/// send all but the last byte of 400,000-byte messages: two fit in a 1 MiB
/// budget, a third's bytes are refused at once with RESOURCE_EXHAUSTED, a
/// small call still goes through, and once the held calls go away a large
/// one fits again.
#[tokio::test(flavor = "multi_thread")]
async fn half_sent_messages_are_bounded_before_they_are_decoded() {
    let mut c = config();
    c.limits.max_message_bytes = 512 * 1024;
    c.limits.max_inbound_bytes = 1024 * 1024;
    let node = start(c).await;
    let tcp = tokio::net::TcpStream::connect(node.node.grpc_addr)
        .await
        .unwrap();
    let (mut h2, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut open = |announced: u32, sent: usize| {
        let request = http::Request::post(format!(
            "http://{}/sluice.v1.RateLimiter/Check",
            node.node.grpc_addr
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
        let (response, mut body) = h2.send_request(request, false).unwrap();
        let mut head = vec![0u8];
        head.extend_from_slice(&announced.to_be_bytes());
        head.extend(std::iter::repeat_n(0u8, sent));
        body.send_data(head.into(), false).unwrap();
        (response, body)
    };
    // Announcing alone holds nothing: only bytes sent take memory.
    let announced = open(500_000, 0);
    let held = [open(400_000, 399_999), open(400_000, 399_999)];
    let resources = node.node.limiter.metrics().resources.clone();
    eventually(
        "the two half-sent messages held",
        Duration::from_secs(10),
        || {
            let held = resources.inbound_bytes();
            async move { held == 2 * 399_999 }
        },
    )
    .await;
    let (refused, _body) = open(400_000, 300_000);
    let refused = tokio::time::timeout(Duration::from_secs(10), refused)
        .await
        .expect("the third call is answered at once")
        .unwrap();
    let status = refused
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_string());
    let trailers_status = if status.is_none() {
        let mut body = refused.into_body();
        tokio::time::timeout(Duration::from_secs(10), body.trailers())
            .await
            .expect("its trailers at once")
            .unwrap()
            .and_then(|t| {
                t.get("grpc-status")
                    .map(|v| v.to_str().unwrap().to_string())
            })
    } else {
        status
    };
    assert_eq!(
        trailers_status.as_deref(),
        Some("8"),
        "RESOURCE_EXHAUSTED for the third"
    );
    assert_eq!(resources.exhausted_count("inbound_bytes"), 1);
    // A small call fits beside the two held ones.
    let small = tokio::time::timeout(
        Duration::from_secs(10),
        node.check(inline("small", "k", 10, 60_000)),
    )
    .await
    .expect("a small call answered");
    assert!(under(&small), "{small:?}");
    drop(held);
    drop(announced);
    drop(h2);
    // The held calls' bytes are given back once their streams are gone.
    let big = pb::CheckRequest {
        requests: (0..1_000)
            .map(|i| {
                let mut r = inline("big", &format!("{i:0>200}"), 10, 60_000);
                r.hits = Some(0);
                r
            })
            .collect(),
    };
    eventually(
        "room for a large call again",
        Duration::from_secs(10),
        || {
            let mut client = node.client();
            let big = big.clone();
            async move { client.check(big).await.is_ok() }
        },
    )
    .await;
}
