//! The apps: callers on a host of their own, asking any node about a set
//! of keys with no refill over the run (so a count only ever goes down),
//! a third each `deny`, `local_share` and `allow` when the owner cannot be
//! reached — and the probes that end a run.
//!
//! Each call is one item with a 100 ms deadline (gRPC `grpc-timeout`, and
//! the app's own timeout): an answer is recorded as the app saw it, a
//! failure as "may or may not have counted".

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice::net::Connector;
use sluice::proto::v1 as pb;
use sluice::proto::v1::admin_client::AdminClient;
use sluice::proto::v1::rate_limiter_client::RateLimiterClient;
use tonic::transport::{Channel, Endpoint};

use crate::history::{Call, History, Outcome, Reset, Status};
use crate::schedule::{Fault, PROBE_SPAN, Schedule};
use crate::sim::{ADMIN_PORT, ADMIN_TOKEN, GRPC_PORT, lock, node_ip};
use crate::world::SimDial;

/// Every key answers exactly through every node within this long of the
/// last heal (ms): the cluster's `in_doubt_grace` (10 s) and 1.5 s. A key
/// whose last holder of record was lost as the faults ended (a crashed
/// generation is known lost at the latest when its process is back,
/// around the heal) is decided in doubt for the whole grace from that
/// loss, and the word of its end takes a gossip round or two to reach
/// every node (seed 19: a region a restart extended at the heal ended
/// 9,955 ms after it).
pub const LIVENESS: u64 = 11_500;
/// An app's deadline for one call.
pub const DEADLINE: Duration = Duration::from_millis(100);
/// The operator's deadline for a reset: the node may have to reach the
/// key's owner (and the owner take the key first). Under the shortest
/// restart (500 ms), so a reset a crash cut off has closed its connection
/// before the node listens again.
const RESET_DEADLINE: Duration = Duration::from_millis(400);

/// Apps calling at once.
const CALLERS: usize = 6;
/// Keys per run.
pub const KEYS: usize = 24;
/// Ten years, in ms: no key refills during a run.
const DURATION_MS: i64 = 10 * 365 * 24 * 3_600 * 1_000;

/// What a key does when its owner cannot be reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unreachable {
    Deny,
    Share,
    Allow,
}

#[derive(Clone, Copy, Debug)]
pub struct Key {
    pub unreachable: Unreachable,
    pub limit: u64,
    /// Synchronous replication: the owner answers once its replica holder
    /// has the decision, so no death loses an exact admission.
    pub sync: bool,
}

/// The run's keys: limits from 20 to 400, so some are spent early and
/// some only late in the run; half the `deny` keys (every sixth key, from
/// k0) replicate synchronously.
pub fn keys(seed: u64) -> Vec<Key> {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x6e75);
    (0..KEYS)
        .map(|k| Key {
            unreachable: [Unreachable::Deny, Unreachable::Share, Unreachable::Allow][k % 3],
            limit: [20, 50, 100, 200, 400][rng.usize(..5)],
            sync: k % 6 == 0,
        })
        .collect()
}

/// A client of one node, and the port it reaches.
type Client = (u16, RateLimiterClient<Channel>);

/// The apps' shared state.
#[derive(Clone)]
pub struct Apps {
    schedule: Arc<Schedule>,
    keys: Arc<Vec<Key>>,
    history: Arc<Mutex<History>>,
    /// Each node's gRPC port now (a restart may move it: `sim.rs`), and
    /// a client for it.
    ports: Arc<Vec<Arc<Mutex<u16>>>>,
    clients: Arc<Mutex<Vec<Client>>>,
    /// The run's time zero on the apps' runtime.
    zero: tokio::time::Instant,
}

impl Apps {
    /// Call inside the apps' runtime at simulated time 0.
    pub fn new(
        schedule: &Schedule,
        history: Arc<Mutex<History>>,
        ports: Vec<Arc<Mutex<u16>>>,
    ) -> Apps {
        let clients = (0..schedule.nodes)
            .map(|n| (GRPC_PORT, client(n, GRPC_PORT)))
            .collect();
        Apps {
            schedule: Arc::new(schedule.clone()),
            keys: Arc::new(keys(schedule.seed)),
            history,
            ports: Arc::new(ports),
            clients: Arc::new(Mutex::new(clients)),
            zero: tokio::time::Instant::now(),
        }
    }

    /// A client for node `n` where it listens now.
    fn client(&self, n: usize) -> RateLimiterClient<Channel> {
        let port = *lock(&self.ports[n]);
        let mut clients = lock(&self.clients);
        if clients[n].0 != port {
            clients[n] = (port, client(n, port));
        }
        clients[n].1.clone()
    }

    /// Simulated ns since the start of the run.
    fn now(&self) -> u64 {
        self.zero.elapsed().as_nanos() as u64
    }

    async fn until(&self, ms: u64) {
        tokio::time::sleep_until(self.zero + Duration::from_millis(ms)).await;
    }

    /// One call, recorded.
    async fn call(&self, key: usize, node: usize, hits: u64) -> Call {
        let k = self.keys[key];
        let request = pb::RateLimitRequest {
            name: "sim".into(),
            unique_key: format!("k{key}"),
            hits: Some(hits as i64),
            limit: k.limit as i64,
            duration_ms: Some(DURATION_MS),
            on_owner_unreachable: match k.unreachable {
                Unreachable::Deny => pb::OwnerUnreachable::Deny,
                Unreachable::Share => pb::OwnerUnreachable::LocalShare,
                Unreachable::Allow => pb::OwnerUnreachable::Allow,
            } as i32,
            replication: if k.sync {
                pb::Replication::Sync
            } else {
                pb::Replication::Async
            } as i32,
            ..Default::default()
        };
        let mut client = self.client(node);
        let sent = self.now();
        let answer = tokio::time::timeout(
            DEADLINE,
            client.check(pb::CheckRequest {
                requests: vec![request],
            }),
        )
        .await;
        let outcome = match answer {
            Err(_) => Outcome::Failed("timed out".into()),
            Ok(Err(status)) => Outcome::Failed(format!("{:?}", status.code())),
            Ok(Ok(r)) => match r.into_inner().responses.into_iter().next() {
                None => Outcome::Failed("no answer".into()),
                Some(a) => match a.error {
                    Some(e) => Outcome::Failed(format!("item error: {}", e.message)),
                    None => Outcome::Answer {
                        status: match pb::Status::try_from(a.status) {
                            Ok(pb::Status::UnderLimit) => Status::Under,
                            Ok(pb::Status::OverLimit) => Status::Over,
                            _ => Status::Unavailable,
                        },
                        reason: a.reason,
                        remaining: a.remaining,
                        approximate: a.approximate,
                        owner: a.owner,
                        path: a.path,
                    },
                },
            },
        };
        let call = Call {
            key,
            node,
            hits,
            sent,
            done: self.now(),
            outcome,
        };
        lock(&self.history).calls.push(call.clone());
        call
    }
}

impl Apps {
    /// An operator's reset of `key` through node `node`, recorded: on a
    /// connection of its own (closed after it: a killed node's accepted
    /// connections would hold its admin port), within [`RESET_DEADLINE`].
    async fn reset(&self, key: usize, node: usize) {
        let channel = Endpoint::from_shared(format!("http://{}:{ADMIN_PORT}", node_ip(node)))
            .expect("a valid URI")
            .connect_timeout(RESET_DEADLINE)
            .timeout(RESET_DEADLINE)
            .connect_with_connector_lazy(Connector(Arc::new(SimDial)));
        let mut admin = AdminClient::new(channel);
        let mut request = tonic::Request::new(pb::ResetKeyRequest {
            key: Some(pb::KeyRef {
                name: "sim".into(),
                unique_key: format!("k{key}"),
            }),
        });
        if let Ok(bearer) = format!("Bearer {ADMIN_TOKEN}").parse() {
            request.metadata_mut().insert("authorization", bearer);
        }
        let sent = self.now();
        let outcome = match tokio::time::timeout(RESET_DEADLINE, admin.reset_key(request)).await {
            Err(_) => Err("timed out".to_string()),
            Ok(Err(status)) => Err(format!("{:?}: {}", status.code(), status.message())),
            Ok(Ok(r)) => Ok(r.into_inner().existed),
        };
        let reset = Reset {
            key,
            node,
            sent,
            done: self.now(),
            outcome,
        };
        lock(&self.history).resets.push(reset);
    }
}

fn client(n: usize, port: u16) -> RateLimiterClient<Channel> {
    let channel = Endpoint::from_shared(format!("http://{}:{port}", node_ip(n)))
        .expect("a valid URI")
        .connect_timeout(DEADLINE)
        .timeout(DEADLINE)
        .connect_with_connector_lazy(Connector(Arc::new(SimDial)));
    RateLimiterClient::new(channel)
}

/// Everything the apps do in a run.
pub async fn drive(apps: Apps) {
    let s = apps.schedule.clone();
    let mut tasks = Vec::new();
    for c in 0..CALLERS {
        let apps = apps.clone();
        let s = s.clone();
        let mut rng = fastrand::Rng::with_seed(s.seed ^ 0xca11 ^ ((c as u64) << 40));
        tasks.push(tokio::spawn(async move {
            apps.until(1_000).await;
            while apps.now() < s.end * 1_000_000 {
                tokio::time::sleep(Duration::from_millis(rng.u64(10..40))).await;
                let key = rng.usize(..KEYS);
                let node = rng.usize(..s.nodes);
                apps.call(key, node, 1).await;
            }
        }));
    }
    // Liveness: from shortly after the last heal, every key through every
    // node, each pair on its own, until it answers exactly (or the window
    // closes).
    for key in 0..KEYS {
        for node in 0..s.nodes {
            let apps = apps.clone();
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                apps.until(s.heal + 1_000).await;
                let deadline = (s.heal + LIVENESS) * 1_000_000;
                while apps.now() < deadline {
                    if apps.call(key, node, 0).await.exact().is_some() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }));
        }
    }
    // The operator's resets.
    for f in &s.faults {
        if let Fault::Reset { node, at, key } = *f {
            let apps = apps.clone();
            tasks.push(tokio::spawn(async move {
                apps.until(at).await;
                apps.reset(key, node).await;
            }));
        }
    }
    for t in tasks {
        let _ = t.await;
    }
    // The final count of every key, after traffic stopped.
    apps.until(s.end + 1_000).await;
    let deadline = (s.end + PROBE_SPAN - 500) * 1_000_000;
    for key in 0..KEYS {
        let mut node = key % s.nodes;
        while apps.now() < deadline {
            if apps.call(key, node, 0).await.exact().is_some() {
                break;
            }
            node = (node + 1) % s.nodes;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The liveness window covers the cluster's whole in-doubt grace (a
    /// key in doubt at the heal answers exactly only after it), with room
    /// for the word of its end to spread.
    #[test]
    fn liveness_outlasts_the_in_doubt_grace() {
        let grace = sluice::config::ClusterConfig::default().in_doubt_grace;
        assert!(Duration::from_millis(LIVENESS) >= grace + Duration::from_millis(1_000));
    }
}
