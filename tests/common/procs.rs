//! Real `sluice serve` processes on loopback: start, signal (SIGTERM,
//! SIGKILL, SIGSTOP, SIGCONT), read their cluster status and metrics, and
//! call them with an explicit deadline.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice::proto::v1 as pb;
use sluice::proto::v1::rate_limiter_client::RateLimiterClient;

use super::{eventually, free_port};

pub const BIN: &str = env!("CARGO_BIN_EXE_sluice");
pub const SECRET: &str = "process-test-secret";

/// Every interval these processes depend on, named (each ≤ 2 s).
pub const GOSSIP_INTERVAL: &str = "100ms";
pub const REPLICATE_INTERVAL: &str = "20ms";
pub const REPORT_INTERVAL: &str = "100ms";
pub const HANDOFF_TIMEOUT: &str = "2s";
pub const DEAD_GRACE: &str = "2s";
pub const BREAKER_COOLDOWN: &str = "300ms";
/// The callers' deadline (and the nodes' forward budget).
pub const DEADLINE: Duration = Duration::from_millis(100);
pub const FORWARD_TIMEOUT: &str = "100ms";

pub struct Proc {
    pub child: Child,
    pub id: String,
    pub grpc: String,
    pub http: String,
    pub gossip: u16,
}

impl Drop for Proc {
    fn drop(&mut self) {
        // A stopped process must be continued to die of SIGKILL cleanly.
        let _ = self.signal("CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    pub fn signal(&self, name: &str) -> bool {
        Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// SIGTERM, and wait for a clean exit.
    pub fn terminate(&mut self) {
        assert!(self.signal("TERM"));
        let exit = self.child.wait().unwrap();
        assert!(exit.success(), "{} exits cleanly: {exit:?}", self.id);
    }

    pub async fn client(&self) -> RateLimiterClient<tonic::transport::Channel> {
        RateLimiterClient::new(channel(self).await)
    }

    pub async fn metric(&self, name: &str) -> f64 {
        let (_, text) = super::http_get(&format!("http://{}/metrics", self.http)).await;
        super::metric_sum(&text, name)
    }
}

/// Start `id` gossiping on `gossip`, seeded by `seeds`, with the named
/// intervals above and `env` on top.
pub fn spawn(id: &str, gossip: u16, seeds: &[u16], env: &[(&str, &str)]) -> Proc {
    spawn_bin(BIN, id, gossip, seeds, env)
}

/// [`spawn`], its log (at `RUST_LOG=info`; `sluice serve` logs to stdout)
/// written to `log`.
pub fn spawn_logged(
    id: &str,
    gossip: u16,
    seeds: &[u16],
    env: &[(&str, &str)],
    log: std::fs::File,
) -> Proc {
    let mut env = env.to_vec();
    env.push(("RUST_LOG", "info"));
    spawn_with(BIN, id, gossip, seeds, &env, Stdio::from(log))
}

/// [`spawn`], running the binary at `bin` (another release, say).
pub fn spawn_bin(bin: &str, id: &str, gossip: u16, seeds: &[u16], env: &[(&str, &str)]) -> Proc {
    spawn_with(bin, id, gossip, seeds, env, Stdio::null())
}

fn spawn_with(
    bin: &str,
    id: &str,
    gossip: u16,
    seeds: &[u16],
    env: &[(&str, &str)],
    log: Stdio,
) -> Proc {
    let grpc = format!("127.0.0.1:{}", free_port());
    let http = format!("127.0.0.1:{}", free_port());
    let mut cmd = Command::new(bin);
    cmd.args(["serve", "--node-id", id, "--grpc-addr", &grpc])
        .args(["--http-addr", &http])
        .env("SLUICE_CLUSTER__GOSSIP_ADDR", format!("127.0.0.1:{gossip}"))
        .env("SLUICE_CLUSTER__SECRET", SECRET)
        .env("SLUICE_CLUSTER__GOSSIP_INTERVAL", GOSSIP_INTERVAL)
        .env("SLUICE_CLUSTER__REPLICATE_INTERVAL", REPLICATE_INTERVAL)
        .env("SLUICE_CLUSTER__REPORT_INTERVAL", REPORT_INTERVAL)
        .env("SLUICE_CLUSTER__HANDOFF_TIMEOUT", HANDOFF_TIMEOUT)
        .env("SLUICE_CLUSTER__DEAD_GRACE", DEAD_GRACE)
        .env("SLUICE_CLUSTER__BREAKER_COOLDOWN", BREAKER_COOLDOWN)
        .env("SLUICE_CLUSTER__FORWARD_TIMEOUT", FORWARD_TIMEOUT)
        .env("RUST_LOG", "warn")
        // The log (on stdout: none unless asked for); panics reach stderr.
        .stdout(log)
        .stderr(Stdio::inherit());
    let seeds: Vec<String> = seeds
        .iter()
        .filter(|&&s| s != gossip)
        .map(|s| format!("\"127.0.0.1:{s}\""))
        .collect();
    if !seeds.is_empty() {
        cmd.env("SLUICE_CLUSTER__SEEDS", format!("[{}]", seeds.join(",")));
    }
    if bin == BIN {
        // Releases before the admin listener know no `admin` section.
        cmd.env("SLUICE_ADMIN__ADDR", format!("127.0.0.1:{}", free_port()))
            .env("SLUICE_ADMIN__TOKEN", super::ADMIN_TOKEN);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    Proc {
        child: cmd.spawn().expect("sluice starts"),
        id: id.to_string(),
        grpc,
        http,
        gossip,
    }
}

/// `sluice cluster status --json` against `addr`.
pub fn status(addr: &str) -> Option<serde_json::Value> {
    let out = Command::new(BIN)
        .args(["cluster", "status", "--json", "--addr", addr])
        .env("SLUICE_CLUSTER__SECRET", SECRET)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())?
}

/// `node_id`'s generation as `via` sees it.
pub fn generation_of(via: &Proc, node_id: &str) -> Option<u64> {
    let s = status(&via.grpc)?;
    s["members"]
        .as_array()?
        .iter()
        .find(|m| m["node_id"] == node_id)?["generation"]
        .as_u64()
}

pub fn in_ring(addr: &str) -> Vec<String> {
    status(addr)
        .map(|s| super::ring_ids(&s))
        .unwrap_or_default()
}

/// Wait until every one of `procs` has `want` (sorted) in its ring.
pub async fn rings_are(procs: &[&Proc], want: &[&str], what: &str, within: Duration) -> Duration {
    let started = Instant::now();
    eventually(what, within, || async {
        procs.iter().all(|p| in_ring(&p.grpc) == want)
    })
    .await;
    started.elapsed()
}

pub async fn channel(p: &Proc) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{}", p.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// One `Check` call with the callers' deadline ([`DEADLINE`]).
pub async fn check(
    client: &mut RateLimiterClient<tonic::transport::Channel>,
    requests: Vec<pb::RateLimitRequest>,
) -> Result<Vec<pb::RateLimitResponse>, tonic::Status> {
    check_within(client, requests, DEADLINE).await
}

/// One `Check` call with its own deadline (a large batch's caller allows
/// it more than one check's).
pub async fn check_within(
    client: &mut RateLimiterClient<tonic::transport::Channel>,
    requests: Vec<pb::RateLimitRequest>,
    deadline: Duration,
) -> Result<Vec<pb::RateLimitResponse>, tonic::Status> {
    let mut request = tonic::Request::new(pb::CheckRequest { requests });
    request.set_timeout(deadline);
    client
        .check(request)
        .await
        .map(|r| r.into_inner().responses)
}

/// `n` gossip ports, each process seeding all the others.
pub fn ports(n: usize) -> Vec<u16> {
    (0..n).map(|_| free_port()).collect()
}

/// This process's entry for `name`/`key` (admin `InspectKey`, signed with
/// the cluster secret): its `remaining`, if it holds the key.
pub async fn inspect_remaining(p: &Proc, name: &str, key: &str) -> Option<i64> {
    let mut request = tonic::Request::new(pb::InspectKeyRequest {
        key: Some(pb::KeyRef {
            name: name.into(),
            unique_key: key.into(),
        }),
    });
    let token = sluice::cluster::auth::Secret::new(Some(SECRET.as_bytes()))
        .peer_token("operator")
        .unwrap();
    request
        .metadata_mut()
        .insert("x-sluice-peer", token.parse().unwrap());
    let answer = sluice::proto::v1::admin_client::AdminClient::new(channel(p).await)
        .inspect_key(request)
        .await
        .ok()?
        .into_inner();
    answer.state.map(|s| s.remaining)
}
