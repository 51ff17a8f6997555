//! `RateLimiter/CheckStream` (issue 47), through a generated client and
//! through `sluice-client`: calls matched by id, in any order, each meeting
//! the bounds a unary call meets (the batch bound, the node's budget of
//! calls in progress); a call cancelled mid-flight gives its place back and
//! is not answered; an id in flight twice ends the stream; a quiet stream
//! is ended; a stopping node ends its streams rather than waiting on them; and
//! `sluice-client` falls back to unary calls on a node without streams.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{TestNode, cluster, config, eventually, inline, start};
use sluice::proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

/// An open stream: what the test sends, and what the node answers.
struct Stream {
    tx: mpsc::Sender<pb::CheckStreamRequest>,
    answers: Streaming<pb::CheckStreamResponse>,
}

async fn open(node: &TestNode) -> Stream {
    let (tx, rx) = mpsc::channel(256);
    let answers = node
        .client()
        .check_stream(ReceiverStream::new(rx))
        .await
        .expect("the stream opens")
        .into_inner();
    Stream { tx, answers }
}

impl Stream {
    async fn call(&self, id: u64, requests: Vec<pb::RateLimitRequest>) {
        let message = pb::CheckStreamRequest {
            id,
            check: Some(pb::CheckRequest { requests }),
            timeout_us: 10_000_000,
            cancel: false,
        };
        self.tx.send(message).await.expect("the stream takes it");
    }

    async fn cancel(&self, id: u64) {
        let message = pb::CheckStreamRequest {
            id,
            cancel: true,
            ..Default::default()
        };
        self.tx.send(message).await.expect("the stream takes it");
    }

    async fn next(&mut self) -> pb::CheckStreamResponse {
        tokio::time::timeout(Duration::from_secs(20), self.answers.message())
            .await
            .expect("an answer in time")
            .expect("the stream is whole")
            .expect("the stream is open")
    }

    /// Half-close, and every answer until the node ends the stream.
    async fn close(self) -> Vec<pb::CheckStreamResponse> {
        let Stream { tx, mut answers } = self;
        drop(tx);
        let mut all = Vec::new();
        loop {
            let next = tokio::time::timeout(Duration::from_secs(20), answers.message())
                .await
                .expect("the stream ends in time");
            match next.expect("the stream ends OK") {
                Some(answer) => all.push(answer),
                None => return all,
            }
        }
    }
}

/// A key of `name` that `owner` owns in `node`'s ring.
fn owned_by(node: &TestNode, name: &str, owner: &str) -> String {
    let ring = node.node.limiter.ring();
    (0..)
        .map(|i| format!("k{i}"))
        .find(|k| {
            &*ring
                .owner(&sluice::store::key::encode(name, k))
                .unwrap()
                .node_id
                == owner
        })
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn calls_are_answered_by_id_each_within_a_calls_bounds() {
    let mut c = config();
    c.limits.max_batch = 3;
    let node = start(c).await;
    let stream = open(&node).await;
    // Ten calls of one hit on a key of 5: exactly five admitted, each
    // answer under its own id.
    for id in 100..110 {
        stream.call(id, vec![inline("st", "k", 5, 60_000)]).await;
    }
    // A call over the batch bound fails whole, saying the bound, and
    // nothing of it is counted (the ten single hits still get five); the
    // stream goes on.
    let big = (0..4).map(|_| inline("st", "k", 5, 60_000)).collect();
    stream.call(7, big).await;
    stream.call(8, vec![inline("st", "other", 5, 60_000)]).await;
    let answers = stream.close().await;
    let by_id: HashMap<u64, &pb::CheckStreamResponse> = answers.iter().map(|a| (a.id, a)).collect();
    assert_eq!(answers.len(), 12, "one answer per call: {answers:?}");
    assert_eq!(
        by_id.keys().copied().collect::<HashSet<_>>(),
        (100..110).chain([7, 8]).collect(),
    );
    let refused = by_id[&7].error.as_ref().expect("call 7 fails whole");
    assert_eq!(refused.code, tonic::Code::ResourceExhausted as i32);
    assert_eq!(refused.max_batch, 3, "{refused:?}");
    assert!(by_id[&7].check.is_none());
    let mut remaining: Vec<i64> = (100..110)
        .map(|id| by_id[&id].check.as_ref().expect("decided").responses[0].clone())
        .filter(|r| r.status == pb::Status::UnderLimit as i32)
        .map(|r| r.remaining)
        .collect();
    remaining.sort_unstable();
    assert_eq!(remaining, [0, 1, 2, 3, 4], "five of ten, each once");
    let other = &by_id[&8].check.as_ref().unwrap().responses[0];
    assert_eq!(
        (other.status, other.remaining),
        (pb::Status::UnderLimit as i32, 4)
    );
    let text = node.http_get("/metrics").await.1;
    assert!(
        text.contains("sluice_check_stream_calls_total 12"),
        "{text}"
    );
    eventually(
        "the stream counted closed",
        Duration::from_secs(10),
        || async { node.node.limiter.metrics().check_streams.get() == 0 },
    )
    .await;
}

/// Calls held in flight by a forward to an owner cut off (answered by the
/// fallback at the forward timeout, 10 s: every step below comes well
/// before it): the node's budget of calls in progress counts each
/// message; a cancelled call gives its place back at once and gets no
/// answer; a call reusing an id in flight ends the stream, once what is in
/// flight is answered.
#[tokio::test(flavor = "multi_thread")]
async fn a_call_in_flight_is_counted_cancelled_and_not_taken_twice() {
    let nodes = cluster(2, |c| {
        c.limits.max_in_flight_checks = 2;
        c.cluster.forward_timeout = Duration::from_secs(10);
        c.cluster.breaker_failures = 1_000_000;
    })
    .await;
    let n = &nodes[0];
    let slow = owned_by(n, "st", "node-1");
    let slower = owned_by(n, "st2", "node-1");
    let local = owned_by(n, "st", "node-0");
    n.node.faults.cut_grpc("node-1");
    let metrics = n.node.limiter.metrics().clone();
    let in_flight = || metrics.in_flight.get();

    let mut stream = open(n).await;
    let started = std::time::Instant::now();
    stream.call(1, vec![inline("st", &slow, 10, 60_000)]).await;
    stream
        .call(2, vec![inline("st2", &slower, 10, 60_000)])
        .await;
    eventually(
        "calls 1 and 2 in flight",
        Duration::from_secs(5),
        || async { in_flight() == 2 },
    )
    .await;
    // The budget is two calls: a third message is shed at once.
    stream.call(3, vec![inline("st", &local, 10, 60_000)]).await;
    let shed = stream.next().await;
    assert_eq!(shed.id, 3, "{shed:?}");
    let r = &shed.check.expect("answered").responses[0];
    assert_eq!(r.reason, pb::Reason::Overloaded as i32, "{r:?}");
    // Cancelled: its place in the budget is given back at once (long
    // before its forward would have timed out).
    stream.cancel(1).await;
    eventually("call 1 gone", Duration::from_secs(3), || async {
        in_flight() == 1
    })
    .await;
    // Call 2's id again, while it is in flight: the stream reads no more,
    // answers call 2 (the fallback, at the forward timeout) and ends.
    stream.call(2, vec![inline("st", &local, 10, 60_000)]).await;
    assert!(
        started.elapsed() < Duration::from_secs(9),
        "the steps above came before the forward timeout"
    );
    let Stream { tx, mut answers } = stream;
    let answer = tokio::time::timeout(Duration::from_secs(30), answers.message())
        .await
        .expect("call 2 answered")
        .expect("the stream is whole")
        .expect("an answer");
    assert_eq!(
        answer.id, 2,
        "call 1 (cancelled) is never answered: {answer:?}"
    );
    let r = &answer.check.as_ref().unwrap().responses[0];
    assert_eq!(r.path, pb::Path::Fallback as i32, "{r:?}");
    let end = tokio::time::timeout(Duration::from_secs(30), answers.message())
        .await
        .expect("the stream ends");
    let status = end.expect_err("ended for the reused id");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().starts_with("id: 2"), "{status:?}");
    drop(tx);
    assert_eq!(in_flight(), 0);
    // Neither the shed call nor the one refused for its id spent anything.
    n.node.faults.heal();
    let fresh = n.check(inline("st", &local, 10, 60_000)).await;
    assert_eq!(fresh.remaining, 9, "{fresh:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_quiet_stream_is_ended_and_a_stopping_node_ends_its_streams() {
    let mut c = config();
    c.limits.idle_connection_timeout = Duration::from_secs(1);
    let node = start(c).await;
    let mut stream = open(&node).await;
    stream.call(1, vec![inline("st", "q", 5, 60_000)]).await;
    assert_eq!(stream.next().await.id, 1);
    // Nothing more sent: the node ends it (OK) within its idle timeout.
    let end = tokio::time::timeout(Duration::from_secs(20), stream.answers.message())
        .await
        .expect("the quiet stream is ended");
    assert!(matches!(end, Ok(None)), "{end:?}");

    let node = start(config()).await;
    let mut stream = open(&node).await;
    stream.call(1, vec![inline("st", "s", 5, 60_000)]).await;
    assert_eq!(stream.next().await.id, 1);
    let stopping = tokio::spawn(node.node.kill());
    let end = tokio::time::timeout(Duration::from_secs(20), stream.answers.message())
        .await
        .expect("the stream is ended");
    let status = end.expect_err("ended UNAVAILABLE");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    // The open stream did not hold the node's stop until its drain limit
    // (5 s): the stop ends once the stream did.
    tokio::time::timeout(Duration::from_secs(4), stopping)
        .await
        .expect("the node stops without waiting out its drain")
        .unwrap();
}

/// `sluice-client` calls over a stream by default; a node without
/// `CheckStream` (an older release) gets unary calls instead.
#[tokio::test(flavor = "multi_thread")]
async fn sluice_client_streams_and_falls_back_to_unary() {
    let node = start(config()).await;
    let client = sluice_client::Client::builder([node.node.grpc_addr.to_string()])
        .deadline(Duration::from_secs(2))
        .batching(0)
        .build()
        .unwrap();
    let check = sluice_client::Check::inline("st", "c", 3, Duration::from_secs(60));
    for left in [2, 1, 0] {
        let d = client.check(&check).await.unwrap();
        assert_eq!((d.allowed, d.remaining), (true, left), "{d:?}");
    }
    assert!(!client.check(&check).await.unwrap().allowed);
    let metrics = node.node.limiter.metrics();
    assert_eq!(metrics.stream_calls.get(), 4, "every call on the stream");
    assert_eq!(metrics.check_streams.get(), 1, "one stream");

    let old = OldNode::start().await;
    let client = sluice_client::Client::builder([old.addr.clone()])
        .deadline(Duration::from_secs(2))
        .batching(0)
        .build()
        .unwrap();
    for _ in 0..3 {
        let d = client.check(&check).await.unwrap();
        assert_eq!(d.remaining, 42, "answered by the unary call: {d:?}");
    }
    assert_eq!(old.unary.load(Ordering::SeqCst), 3);
    assert_eq!(
        old.streams.load(Ordering::SeqCst),
        1,
        "asked once; unary thereafter"
    );
}

/// Over the node's Unix socket too (the DaemonSet's path for apps on the
/// host): the stream and the TCP listener share one count.
#[tokio::test(flavor = "multi_thread")]
async fn sluice_client_streams_over_the_unix_socket() {
    let dir = std::env::temp_dir().join(format!("sluice-stream-uds-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sluice.sock");
    let mut c = config();
    c.grpc_uds = Some(path.clone());
    let node = start(c).await;
    let client = sluice_client::Client::builder([format!("unix:{}", path.display())])
        .deadline(Duration::from_secs(2))
        .build()
        .unwrap();
    let check = sluice_client::Check::inline("st", "u", 3, Duration::from_secs(60));
    for left in [2, 1] {
        let d = client.check(&check).await.unwrap();
        assert_eq!((d.allowed, d.remaining), (true, left), "{d:?}");
    }
    let tcp = node.check(inline("st", "u", 3, 60_000)).await;
    assert_eq!(tcp.remaining, 0, "one count over both listeners: {tcp:?}");
    assert!(!client.check(&check).await.unwrap().allowed);
    let metrics = node.node.limiter.metrics();
    assert_eq!(metrics.stream_calls.get(), 3, "the client's calls streamed");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A node of a release without `CheckStream`: its router answers the
/// method UNIMPLEMENTED (as tonic's does for a method it lacks); `Check`
/// admits with 42 remaining.
struct OldNode {
    addr: String,
    unary: Arc<AtomicU64>,
    streams: Arc<AtomicU64>,
}

#[derive(Clone)]
struct Old {
    unary: Arc<AtomicU64>,
    streams: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl pb::rate_limiter_server::RateLimiter for Old {
    async fn check(
        &self,
        request: tonic::Request<pb::CheckRequest>,
    ) -> Result<tonic::Response<pb::CheckResponse>, tonic::Status> {
        self.unary.fetch_add(1, Ordering::SeqCst);
        let responses = request
            .into_inner()
            .requests
            .iter()
            .map(|_| pb::RateLimitResponse {
                status: pb::Status::UnderLimit as i32,
                limit: 100,
                remaining: 42,
                ..Default::default()
            })
            .collect();
        Ok(tonic::Response::new(pb::CheckResponse { responses }))
    }

    type CheckStreamStream = ReceiverStream<Result<pb::CheckStreamResponse, tonic::Status>>;

    async fn check_stream(
        &self,
        _: tonic::Request<Streaming<pb::CheckStreamRequest>>,
    ) -> Result<tonic::Response<Self::CheckStreamStream>, tonic::Status> {
        self.streams.fetch_add(1, Ordering::SeqCst);
        Err(tonic::Status::unimplemented(""))
    }
}

impl OldNode {
    async fn start() -> OldNode {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let old = Old {
            unary: Arc::default(),
            streams: Arc::default(),
        };
        let server = tonic::transport::Server::builder()
            .add_service(pb::rate_limiter_server::RateLimiterServer::new(old.clone()));
        tokio::spawn(
            server.serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        OldNode {
            addr,
            unary: old.unary,
            streams: old.streams,
        }
    }
}
