//! Idle gRPC connections are closed (issue 18): after
//! `limits.idle_connection_timeout` with no call in progress a connection
//! is closed and its place in `max_connections` freed — a raw TCP
//! connection that never speaks, and a gRPC client that goes quiet while
//! the server's keepalive pings keep flowing. A connection making calls,
//! or with a call in progress that sends nothing for longer than the
//! timeout (a health `Watch` stream), stays open.

mod common;

use std::time::{Duration, Instant};

use common::{BASE, config, eventually, inline, under};
use sluice::clock::FakeClock;
use sluice::policy::Policies;
use sluice::proto::v1::rate_limiter_client::RateLimiterClient;
use sluice::server::Node;
use tokio::io::AsyncReadExt;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

/// A node with `tweak` applied and no client of its own (every connection
/// in these tests is one the test opened).
async fn node(tweak: impl Fn(&mut sluice::config::Config)) -> Node {
    let mut c = config();
    tweak(&mut c);
    let policies = Policies::from_config(&c).unwrap();
    Node::start(c, policies, None, FakeClock::new(BASE))
        .await
        .unwrap()
}

/// Open connections on the public gRPC listener, from `/metrics`.
fn open(node: &Node) -> u64 {
    let text = node.limiter.metrics().render();
    let line = "sluice_connections{listener=\"grpc\"} ";
    text.lines()
        .find_map(|l| l.strip_prefix(line))
        .unwrap_or_else(|| panic!("no {line} in {text}"))
        .parse()
        .unwrap()
}

async fn channel(node: &Node) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{}", node.grpc_addr))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// Read until the server closes the connection, within `deadline`.
async fn until_closed(tcp: &mut tokio::net::TcpStream, deadline: Duration) {
    let mut buf = [0u8; 1024];
    tokio::time::timeout(deadline, async {
        // The server's HTTP/2 SETTINGS may come first; then the end.
        while matches!(tcp.read(&mut buf).await, Ok(n) if n > 0) {}
    })
    .await
    .expect("the server closes the connection");
}

/// With one place (`max_connections = 1`) and a 200 ms timeout: a raw TCP
/// connection that sends nothing is accepted, then closed by the server
/// once idle — not at once, as one beyond the bound is — and the place it
/// held is free for the next, which meets the same end; after both, a gRPC
/// client gets the place and its call is answered.
#[tokio::test(flavor = "multi_thread")]
async fn a_silent_connection_is_closed_and_its_place_freed() {
    const IDLE: Duration = Duration::from_millis(200);
    let n = node(|c| {
        c.limits.max_connections = 1;
        c.limits.idle_connection_timeout = IDLE;
    })
    .await;
    let resources = n.limiter.metrics().resources.clone();
    for i in 1..=2 {
        let started = Instant::now();
        let mut tcp = tokio::net::TcpStream::connect(n.grpc_addr).await.unwrap();
        until_closed(&mut tcp, Duration::from_secs(10)).await;
        let lived = started.elapsed();
        assert!(lived >= IDLE, "connection {i} closed after {lived:?}");
        assert_eq!(resources.idle_closed_count("grpc"), i);
        assert_eq!(
            resources.exhausted_count("connections"),
            0,
            "connection {i} was admitted, not refused at the bound"
        );
        eventually("the place to be freed", Duration::from_secs(5), || async {
            open(&n) == 0
        })
        .await;
    }
    let mut client = RateLimiterClient::new(channel(&n).await);
    let answer = client
        .check(sluice::proto::v1::CheckRequest {
            requests: vec![inline("idle", "k", 5, 60_000)],
        })
        .await
        .unwrap()
        .into_inner()
        .responses
        .remove(0);
    assert!(under(&answer), "{answer:?}");
    assert_eq!(open(&n), 1);
    assert_eq!(resources.exhausted_count("connections"), 0);
    let text = n.limiter.metrics().render();
    for line in [
        "sluice_resource_limit{resource=\"idle_connection_timeout_ms\"} 200",
        "sluice_idle_connections_closed_total{listener=\"grpc\"} 2",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
}

/// Idle means no call, not no bytes: with a 1 s timeout (keepalive pings
/// every 250 ms on every connection), a client that made one call and went
/// quiet is closed; one calling every 20 ms for 3 s, and one holding a
/// health `Watch` stream open (a call in progress that sends nothing), are
/// not. Once they stop, they are closed too, and a closed client's next
/// call reconnects and is answered.
#[tokio::test(flavor = "multi_thread")]
async fn a_quiet_client_is_closed_and_busy_ones_are_not() {
    const IDLE: Duration = Duration::from_secs(1);
    let n = node(|c| c.limits.idle_connection_timeout = IDLE).await;
    let resources = n.limiter.metrics().resources.clone();
    let request = || sluice::proto::v1::CheckRequest {
        requests: vec![inline("idle", "k", 1_000_000, 60_000)],
    };

    // A stream: a call in progress, silent after its first answer.
    let mut watcher = HealthClient::new(channel(&n).await);
    let mut watch = watcher
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    watch.message().await.unwrap().expect("the current status");
    // Quiet: one call, then nothing.
    let mut quiet = RateLimiterClient::new(channel(&n).await);
    quiet.check(request()).await.unwrap();
    // Busy: a call every 20 ms for three timeouts.
    let mut busy = RateLimiterClient::new(channel(&n).await);
    let calls = tokio::spawn(async move {
        let until = Instant::now() + 3 * IDLE;
        let mut answered = 0;
        while Instant::now() < until {
            busy.check(request()).await.expect("a busy client's call");
            answered += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (busy, answered)
    });
    eventually("three connections", Duration::from_secs(5), || async {
        open(&n) == 3
    })
    .await;

    eventually(
        "the quiet client to be closed",
        Duration::from_secs(10),
        || async { resources.idle_closed_count("grpc") >= 1 },
    )
    .await;
    let (mut busy, answered) = calls.await.unwrap();
    assert!(answered > 20, "{answered} calls");
    assert_eq!(
        resources.idle_closed_count("grpc"),
        1,
        "only the quiet client was closed"
    );
    assert_eq!(open(&n), 2, "the busy client and the stream are open");

    // Both stop: each is closed once idle for the whole timeout.
    drop(watch);
    eventually(
        "every connection to be closed",
        Duration::from_secs(10),
        || async { open(&n) == 0 },
    )
    .await;
    assert_eq!(resources.idle_closed_count("grpc"), 3);
    assert!(
        n.limiter
            .metrics()
            .render()
            .contains("sluice_idle_connections_closed_total{listener=\"grpc\"} 3")
    );
    // A closed client reconnects on its next call.
    busy.check(request()).await.unwrap();
    assert_eq!(open(&n), 1);
}

/// Over TLS too (the connection's activity travels in TLS connection info):
/// a client holding a `Watch` stream open keeps its connection, a quiet one
/// is closed. The stream was opened first: had its call not been counted,
/// its connection would have been closed first.
#[tokio::test(flavor = "multi_thread")]
async fn over_tls_a_stream_keeps_its_connection() {
    use common::pki::Ca;
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
    const IDLE: Duration = Duration::from_millis(300);
    let dir = std::env::temp_dir().join(format!("sluice-idle-tls-{}", std::process::id()));
    let ca = Ca::new(&dir, "idle");
    let served = ca.leaf("server", &["localhost"]);
    let n = node(|c| {
        c.limits.idle_connection_timeout = IDLE;
        c.tls = Some(sluice::tls::ApiTls {
            cert_file: served.cert_file.clone(),
            key_file: served.key_file.clone(),
            client_ca_file: None,
        });
    })
    .await;
    let tls_channel = || async {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(std::fs::read(&ca.ca_file).unwrap()))
            .domain_name("localhost");
        Endpoint::from_shared(format!("https://{}", n.grpc_addr))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .unwrap()
    };
    let resources = n.limiter.metrics().resources.clone();
    // The client is kept: dropping its last handle would close the
    // connection from the client's side.
    let mut watcher = HealthClient::new(tls_channel().await);
    let mut watch = watcher
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    watch.message().await.unwrap().expect("the current status");
    let mut quiet = RateLimiterClient::new(tls_channel().await);
    quiet
        .check(sluice::proto::v1::CheckRequest {
            requests: vec![inline("idle", "k", 5, 60_000)],
        })
        .await
        .unwrap();
    eventually(
        "the quiet client to be closed",
        Duration::from_secs(10),
        || async { resources.idle_closed_count("grpc") >= 1 },
    )
    .await;
    // The stream's connection, older, would have been closed first were its
    // call not counted: the stream ends then. It does not, over a whole
    // timeout more (status messages, if any, are fine).
    let ended = tokio::time::timeout(IDLE, async {
        loop {
            match watch.message().await {
                Ok(Some(_)) => continue,
                end => return end,
            }
        }
    })
    .await;
    assert!(ended.is_err(), "the stream ended: {ended:?}");
    assert_eq!(resources.idle_closed_count("grpc"), 1, "only the quiet one");
    assert_eq!(open(&n), 1, "the stream's connection is open");
    drop(watch);
    eventually(
        "the stream's connection to be closed",
        Duration::from_secs(10),
        || async { open(&n) == 0 },
    )
    .await;
    assert_eq!(resources.idle_closed_count("grpc"), 2);
}

/// The HTTP listener (metrics, health, the HTTP check) is bounded the same
/// way: with one place and a 200 ms timeout, a second connection is closed
/// at once, a silent one once idle; a keep-alive client asking every 40 ms
/// keeps its connection for 1 s (its requests are calls in progress), then,
/// quiet, loses it.
#[tokio::test(flavor = "multi_thread")]
async fn the_http_listener_is_bounded_and_closes_idle_connections() {
    use tokio::io::AsyncWriteExt;
    const IDLE: Duration = Duration::from_millis(200);
    let n = node(|c| {
        c.limits.max_connections = 1;
        c.limits.idle_connection_timeout = IDLE;
    })
    .await;
    let resources = n.limiter.metrics().resources.clone();
    let started = Instant::now();
    let mut silent = tokio::net::TcpStream::connect(n.http_addr).await.unwrap();
    // The accept loop takes connections in order: the first holds the place.
    eventually(
        "the first to hold the place",
        Duration::from_secs(5),
        || async {
            n.limiter
                .metrics()
                .render()
                .contains("sluice_connections{listener=\"http\"} 1")
        },
    )
    .await;
    let mut beyond = tokio::net::TcpStream::connect(n.http_addr).await.unwrap();
    until_closed(&mut beyond, Duration::from_secs(5)).await;
    assert_eq!(resources.exhausted_count("connections"), 1);
    until_closed(&mut silent, Duration::from_secs(10)).await;
    assert!(started.elapsed() >= IDLE, "closed once idle, not at once");
    assert_eq!(resources.idle_closed_count("http"), 1);
    eventually("the place to be freed", Duration::from_secs(5), || async {
        n.limiter
            .metrics()
            .render()
            .contains("sluice_connections{listener=\"http\"} 0")
    })
    .await;

    let mut client = tokio::net::TcpStream::connect(n.http_addr).await.unwrap();
    let busy = Instant::now();
    let mut answered = 0;
    while busy.elapsed() < Duration::from_secs(1) {
        client
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: sluice\r\n\r\n")
            .await
            .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 512];
        while !got.ends_with(b"\r\n\r\nok\n") {
            let read = tokio::time::timeout(Duration::from_secs(5), client.read(&mut buf))
                .await
                .expect("an answer")
                .unwrap();
            assert!(read > 0, "closed while busy, after {answered} answers");
            got.extend_from_slice(&buf[..read]);
        }
        assert!(got.starts_with(b"HTTP/1.1 200 OK\r\n"));
        answered += 1;
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    assert!(answered >= 10, "{answered} answers on one connection");
    assert_eq!(resources.idle_closed_count("http"), 1, "busy is not idle");
    until_closed(&mut client, Duration::from_secs(10)).await;
    assert_eq!(resources.idle_closed_count("http"), 2);
}
