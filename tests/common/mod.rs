//! Test harness: an in-process node on 127.0.0.1 ports with a fake clock,
//! and helpers to build requests and await conditions with a deadline.
#![allow(dead_code)]

pub mod load;
pub mod pki;
pub mod procs;
pub mod together;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::clock::FakeClock;
use sluice::config::{Config, Sources};
use sluice::policy::Policies;
use sluice::proto::v1 as pb;
use sluice::proto::v1::rate_limiter_client::RateLimiterClient;
use sluice::server::Node;
use tonic::transport::Channel;

/// 2023-11-14T22:13:20Z: a realistic epoch time for the fake clock.
pub const BASE: u64 = 1_700_000_000_000_000_000;
pub const MS: u64 = 1_000_000;

pub struct TestNode {
    pub node: Node,
    pub clock: Arc<FakeClock>,
    pub channel: Channel,
}

/// The admin token of every node [`config`] makes.
pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789";

/// Adds `authorization: Bearer <ADMIN_TOKEN>` to each call.
#[derive(Clone)]
pub struct Bearer;

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut r: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        r.metadata_mut().insert(
            "authorization",
            format!("Bearer {ADMIN_TOKEN}").parse().unwrap(),
        );
        Ok(r)
    }
}

pub type Admin = sluice::proto::v1::admin_client::AdminClient<
    tonic::service::interceptor::InterceptedService<Channel, Bearer>,
>;

/// An admin client for the admin listener at `addr`, with the token.
pub async fn admin_client(addr: std::net::SocketAddr) -> Admin {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connects to the admin listener");
    sluice::proto::v1::admin_client::AdminClient::with_interceptor(channel, Bearer)
}

/// A config for tests: loopback, OS-chosen ports.
pub fn config() -> Config {
    let mut c = Config {
        node_id: "test-node".into(),
        grpc_addr: "127.0.0.1:0".parse().unwrap(),
        http_addr: "127.0.0.1:0".parse().unwrap(),
        ..Config::default()
    };
    c.admin.addr = "127.0.0.1:0".parse().unwrap();
    c.admin.token = Some(ADMIN_TOKEN.into());
    c.cluster.gossip_addr = "127.0.0.1:0".parse().unwrap();
    c.cluster.gossip_interval = Duration::from_millis(50);
    c.cluster.leave_grace = Duration::from_millis(100);
    // Generous: tests share two cores with everything else.
    c.cluster.forward_timeout = Duration::from_secs(2);
    c
}

/// Start `n` nodes on loopback that form one cluster (node-0 seeds the
/// rest), with `tweak` applied to each config, and wait until every node's
/// ring holds all of them.
pub async fn cluster(n: usize, tweak: impl Fn(&mut Config)) -> Vec<TestNode> {
    let mut nodes: Vec<TestNode> = Vec::new();
    for i in 0..n {
        let mut c = config();
        c.node_id = format!("node-{i}");
        c.cluster.secret = Some("test-secret".into());
        if let Some(first) = nodes.first() {
            c.cluster.seeds = vec![first.node.gossip_addr.to_string()];
        }
        tweak(&mut c);
        nodes.push(start(c).await);
    }
    eventually(
        "every ring to hold every node",
        Duration::from_secs(20),
        || async {
            nodes
                .iter()
                .all(|t| t.node.limiter.ring().members().len() == n)
        },
    )
    .await;
    // A ring holding every node is not a settled cluster: until each
    // member said `done` for the last change, a node decides a key it
    // lacks by asking the others first — and a test that cuts a link
    // then sees that key decided without its owner (`cluster_faults` in
    // CI at stop 61, and 2 of 11 runs of it here).
    eventually(
        "every node's transfer for the last change to be complete",
        Duration::from_secs(20),
        || async {
            nodes
                .iter()
                .all(|t| t.node.limiter.transfer_status().complete)
        },
    )
    .await;
    nodes
}

pub async fn start(config: Config) -> TestNode {
    let policies = Policies::from_config(&config).expect("valid policies");
    start_with(config, policies, None).await
}

pub async fn start_with(config: Config, policies: Policies, sources: Option<Sources>) -> TestNode {
    let clock = FakeClock::new(BASE);
    let node = Node::start(config, policies, sources, clock.clone())
        .await
        .expect("node starts");
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", node.grpc_addr))
        .unwrap()
        .connect()
        .await
        .expect("connects");
    TestNode {
        node,
        clock,
        channel,
    }
}

impl TestNode {
    pub fn client(&self) -> RateLimiterClient<Channel> {
        RateLimiterClient::new(self.channel.clone())
    }

    /// An operator's client: the admin listener, with the admin token.
    pub async fn admin(&self) -> Admin {
        admin_client(self.node.admin_addr).await
    }

    /// Send one request, return its response.
    pub async fn check(&self, r: pb::RateLimitRequest) -> pb::RateLimitResponse {
        self.check_all(vec![r]).await.remove(0)
    }

    /// Send one request with the caller's deadline `within` (the
    /// `grpc-timeout` header a real client sets).
    pub async fn check_within(
        &self,
        r: pb::RateLimitRequest,
        within: Duration,
    ) -> pb::RateLimitResponse {
        let mut request = tonic::Request::new(pb::CheckRequest { requests: vec![r] });
        request.set_timeout(within);
        self.client()
            .check(request)
            .await
            .expect("call succeeds")
            .into_inner()
            .responses
            .remove(0)
    }

    pub async fn check_all(
        &self,
        requests: Vec<pb::RateLimitRequest>,
    ) -> Vec<pb::RateLimitResponse> {
        self.client()
            .check(pb::CheckRequest { requests })
            .await
            .expect("call succeeds")
            .into_inner()
            .responses
    }

    pub async fn http_get(&self, path: &str) -> (u16, String) {
        http_get(&format!("http://{}{path}", self.node.http_addr)).await
    }
}

/// A minimal HTTP/1.1 GET over a raw socket (no client crate needed).
pub async fn http_get(url: &str) -> (u16, String) {
    try_http_get(url)
        .await
        .unwrap_or_else(|e| panic!("http connects to {url}: {e}"))
}

/// [`http_get`], or why it could not connect: for a port that may not be
/// bound yet (a process still starting).
pub async fn try_http_get(url: &str) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.trim_start_matches("http://");
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let mut s = tokio::net::TcpStream::connect(host).await?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// A minimal HTTP/1.1 POST of a JSON body: status, headers (lowercase
/// names), body.
pub async fn http_post(
    url: &str,
    body: &str,
) -> (u16, std::collections::HashMap<String, String>, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.trim_start_matches("http://");
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let mut s = tokio::net::TcpStream::connect(host)
        .await
        .expect("http connects");
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, body.to_string())
}

/// The sum of a metric's samples in a Prometheus text exposition (every
/// line starting with `name`: all label sets, or one if `name` has them).
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The node ids in the ring, sorted, from `sluice cluster status --json`.
pub fn ring_ids(status: &serde_json::Value) -> Vec<String> {
    let mut ids: Vec<String> = status["members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["in_ring"] == true)
        .filter_map(|m| m["node_id"].as_str().map(String::from))
        .collect();
    ids.sort();
    ids
}

/// An inline request.
pub fn inline(name: &str, key: &str, limit: i64, duration_ms: i64) -> pb::RateLimitRequest {
    pb::RateLimitRequest {
        name: name.into(),
        unique_key: key.into(),
        limit,
        duration_ms: Some(duration_ms),
        ..Default::default()
    }
}

pub fn policy(name: &str, key: &str, policy: &str) -> pb::RateLimitRequest {
    pb::RateLimitRequest {
        name: name.into(),
        unique_key: key.into(),
        policy: Some(policy.into()),
        ..Default::default()
    }
}

pub fn under(r: &pb::RateLimitResponse) -> bool {
    r.error.is_none() && r.status == pb::Status::UnderLimit as i32
}

/// Await `cond` until it holds or the deadline passes.
pub async fn eventually<F, Fut>(what: &str, deadline: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let until = Instant::now() + deadline;
    loop {
        if cond().await {
            return;
        }
        assert!(Instant::now() < until, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A loopback port free for both TCP and UDP, below the ephemeral range (a
/// port bound to 0 and released can be handed to someone's outgoing
/// connection before a child process binds it), spread by process id.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = (std::process::id() % 400) * 25;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (20_000 + (start + n) % 12_000) as u16;
        let tcp = std::net::TcpListener::bind(("127.0.0.1", port));
        let udp = std::net::UdpSocket::bind(("127.0.0.1", port));
        if tcp.is_ok() && udp.is_ok() {
            return port;
        }
    }
}

/// Move the nodes' fake clocks with real time (every millisecond) until the
/// returned task is aborted: for tests whose subject measures rates.
pub fn drive_clocks(nodes: &[TestNode]) -> tokio::task::JoinHandle<()> {
    drive_clocks_since(nodes, Instant::now())
}

/// [`drive_clocks`] with the clocks at `BASE` at `start` (so a node added
/// later joins the others' time, never behind it).
pub fn drive_clocks_since(nodes: &[TestNode], start: Instant) -> tokio::task::JoinHandle<()> {
    let clocks: Vec<Arc<FakeClock>> = nodes.iter().map(|n| n.clock.clone()).collect();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        loop {
            tick.tick().await;
            let now = BASE + start.elapsed().as_nanos() as u64;
            for c in &clocks {
                c.set(now);
            }
        }
    })
}
