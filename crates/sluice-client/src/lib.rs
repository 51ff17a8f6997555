//! A Sluice client for Rust services.
//!
//! [`Client`] is a cheap-to-clone handle (an `Arc` inside) over one address
//! or several: a sidecar on localhost, the DaemonSet pod on the host IP (or
//! its Unix socket), or a Service. Calls go on a long-lived `CheckStream`
//! per address, round the addresses (`stream.rs`: a call is then a message
//! each way, not an HTTP/2 stream of its own); a node without streams gets
//! unary calls, and [`Builder::streams`] turns them off. Every check has a deadline
//! (default 5 ms). When Sluice cannot answer in time the client does not
//! return an error: it *decides*, by the configured [`OnUnavailable`] —
//! `Allow`, `Deny`, or `Local` (an in-process token bucket holding a share of
//! the limit) — and says so in [`Decision::source`], and counts it.
//!
//! Concurrent checks are sent together in one `Check` call (up to 100 by
//! default, [`Builder::batching`]): a call leaves at once when fewer than
//! four are in flight, else checks queue until one returns — so an idle
//! client adds no wait and a busy one pays one RPC for many decisions
//! (`batch.rs` says why it is the default, and what keeps a batch honest).

mod allot;
mod batch;
mod local;
pub mod middleware;
mod stream;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sluice_api::v1 as pb;
use sluice_api::v1::rate_limiter_client::RateLimiterClient;
use stream::{Called, Calls, Streams};
use tokio::sync::{mpsc, oneshot};
use tonic::transport::{Channel, Endpoint};

pub use allot::{AllotmentStats, DEFAULT_ALLOTMENT_KEYS, REPORT_EVERY};
pub use batch::DEFAULT_BATCH;
use batch::Queued;
pub use local::LocalLimits;

/// What a check asks: a counter (`name` + `key`), a cost, and a limit —
/// inline, or a policy named in the node's config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    pub name: String,
    pub key: String,
    /// Cost; 0 reads without consuming.
    pub hits: u64,
    pub limit: Limit,
    /// Tiered mode: decide on an allotment held in this process when one
    /// covers it (`allot.rs`). Checks of a policy the node decides in
    /// tiered mode use allotments without this.
    pub tiered: bool,
}

/// The limit a check is decided against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Limit {
    /// `limit` per `per` (a token bucket unless the node's default differs).
    Inline { limit: u64, per: Duration },
    /// A policy from the node's config.
    Policy(String),
}

impl Check {
    /// `hits` 1 of `name`/`key` under a policy.
    pub fn policy(name: &str, key: &str, policy: &str) -> Check {
        Check {
            name: name.into(),
            key: key.into(),
            hits: 1,
            limit: Limit::Policy(policy.into()),
            tiered: false,
        }
    }

    /// `hits` 1 of `name`/`key` at `limit` per `per`.
    pub fn inline(name: &str, key: &str, limit: u64, per: Duration) -> Check {
        Check {
            name: name.into(),
            key: key.into(),
            hits: 1,
            limit: Limit::Inline { limit, per },
            tiered: false,
        }
    }

    pub fn hits(mut self, hits: u64) -> Check {
        self.hits = hits;
        self
    }

    /// Decide in tiered mode: on an allotment held in this process while
    /// one covers the check, else by the node (which grants the next).
    pub fn tiered(mut self) -> Check {
        self.tiered = true;
        self
    }

    fn to_wire(&self) -> pb::RateLimitRequest {
        let mut r = pb::RateLimitRequest {
            name: self.name.clone(),
            unique_key: self.key.clone(),
            hits: Some(i64::try_from(self.hits).unwrap_or(i64::MAX)),
            mode: if self.tiered {
                pb::Mode::Tiered as i32
            } else {
                pb::Mode::Unspecified as i32
            },
            ..Default::default()
        };
        match &self.limit {
            Limit::Inline { limit, per } => {
                r.limit = i64::try_from(*limit).unwrap_or(i64::MAX);
                r.duration_ms = Some(i64::try_from(per.as_millis()).unwrap_or(i64::MAX).max(1));
            }
            Limit::Policy(p) => r.policy = Some(p.clone()),
        }
        r
    }
}

/// What to do when Sluice cannot answer within the deadline.
#[derive(Clone, Debug, PartialEq)]
pub enum OnUnavailable {
    /// Admit: availability over the limit.
    Allow,
    /// Refuse: the limit over availability (e.g. logins).
    Deny,
    /// Decide in process on a token bucket holding `share` (0 to 1) of the
    /// limit — of an inline limit, or of a policy's as given in `limits` —
    /// so one app instance never spends more than its share. A policy with
    /// no local limit is refused.
    Local { share: f64, limits: LocalLimits },
}

/// A decision, and who made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// The limit decided against (0 if unknown: an unavailable policy check).
    pub limit: u64,
    pub remaining: u64,
    /// On refusal, when to retry.
    pub retry_after: Option<Duration>,
    /// Until the limit is whole again.
    pub reset_after: Duration,
    /// The limit's period (for quota headers).
    pub window: Duration,
    /// The policy's name, or `name`, for headers.
    pub policy: String,
    pub source: Source,
    /// Which path decided.
    pub path: Path,
    /// Decided in this process, on its allotment, with no call and no wait
    /// for one (a check that waited for its key's ask in flight and was
    /// then decided on what it brought says false).
    pub in_process: bool,
}

/// Which path decided a check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// The key's owner (the node asked, or the node it forwarded to).
    Owner,
    /// Tiered mode: an allotment, with no hop — this process's own, or the
    /// node's.
    LocalAllotment,
    /// Tiered mode: the allotment could not cover it; decided exactly.
    Slow,
    /// The key's owner was unreachable: its `on_owner_unreachable`.
    Fallback,
    /// Sluice did not answer: this client's [`OnUnavailable`].
    Unavailable,
}

/// Who decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Sluice (`approximate`: decided on a node's lease, its owner unreachable).
    Sluice { approximate: bool },
    /// Sluice did not answer in time: the client's `OnUnavailable` decided.
    Unavailable,
}

/// Sluice answered, but with an error for this check (a bad request: the
/// field is named). Never returned for an unreachable limiter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckError {
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for CheckError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for CheckError {}

/// Counts of how checks were decided.
#[derive(Debug, Default)]
pub struct Stats {
    pub decided_by_sluice: AtomicU64,
    pub unavailable_allowed: AtomicU64,
    pub unavailable_denied: AtomicU64,
    pub unavailable_local: AtomicU64,
    /// `Check` calls sent (with batching, fewer than checks).
    pub calls: AtomicU64,
}

/// Configures a [`Client`].
pub struct Builder {
    addrs: Vec<String>,
    deadline: Duration,
    on_unavailable: OnUnavailable,
    batch: Option<usize>,
    allotment_keys: usize,
    streams: bool,
}

impl Builder {
    /// Send calls on a long-lived `CheckStream` per address (default), or
    /// each as a unary `Check` (`false`). A node without streams gets unary
    /// calls either way (`stream.rs`).
    pub fn streams(mut self, on: bool) -> Builder {
        self.streams = on;
        self
    }

    /// Hold allotments of up to `max_keys` tiered keys in this process
    /// (default [`DEFAULT_ALLOTMENT_KEYS`]); 0: never, every tiered check
    /// goes to the node.
    pub fn allotments(mut self, max_keys: usize) -> Builder {
        self.allotment_keys = max_keys;
        self
    }

    /// How long a check may take before `on_unavailable` decides (default 5 ms).
    pub fn deadline(mut self, deadline: Duration) -> Builder {
        self.deadline = deadline;
        self
    }

    pub fn on_unavailable(mut self, choice: OnUnavailable) -> Builder {
        self.on_unavailable = choice;
        self
    }

    /// Send concurrent checks together, up to `max_items` per call (at most
    /// 1,000; default [`DEFAULT_BATCH`]); 0: one call per check.
    pub fn batching(mut self, max_items: usize) -> Builder {
        self.batch = (max_items > 0).then(|| max_items.min(1_000));
        self
    }

    /// Build the client. Connections are made lazily: an unreachable Sluice
    /// at start is not an error, its checks are decided by `on_unavailable`.
    pub fn build(self) -> Result<Client, tonic::transport::Error> {
        let endpoints = self
            .addrs
            .iter()
            .map(|a| {
                // `unix:/path`: a node's `grpc_uds` on this host.
                let url = if a.contains("://") || a.starts_with("unix:") {
                    a.clone()
                } else {
                    format!("http://{a}")
                };
                Endpoint::from_shared(url).map(|e| {
                    e.tcp_nodelay(true)
                        .connect_timeout(self.deadline.max(Duration::from_millis(100)))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Allotments talk to one node: it keeps the books of what it passed
        // on (a report or give-back reaching another node would be counted
        // there, and the first would pass the same tokens on again). One of
        // the addresses, by the client's random id: a fleet of apps spreads
        // over them. (So each address must be one node, not a balancer.)
        let id = allot::client_id();
        let pick = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            id.hash(&mut h);
            h.finish() as usize
        };
        let channels: Vec<Channel> = endpoints.iter().map(Endpoint::connect_lazy).collect();
        let allotments_channel = channels.get(pick % channels.len().max(1)).cloned();
        let calls = match (self.streams, channels.as_slice()) {
            // A stream per address: calls go round them (`stream.rs`).
            (true, _) => Calls::Streams(Arc::new(Streams::new(channels.clone()))),
            (false, [one]) => Calls::Unary(RateLimiterClient::new(one.clone())),
            (false, _) => Calls::Unary(RateLimiterClient::new(Channel::balance_list(
                endpoints.into_iter(),
            ))),
        };
        let allotter = (self.allotment_keys > 0)
            .then_some(())
            .and(allotments_channel)
            .map(|ch| {
                let a = Arc::new(allot::Allotter::new(id, ch, self.allotment_keys));
                tokio::spawn(allot::report_loop(Arc::downgrade(&a), a.wake.clone()));
                a
            });
        let stats = Arc::new(Stats::default());
        let batcher = self.batch.map(|max| {
            let (tx, rx) = mpsc::channel(max.saturating_mul(64).max(1_024));
            tokio::spawn(batch::batch_loop(
                rx,
                calls.clone(),
                max,
                self.deadline,
                stats.clone(),
            ));
            tx
        });
        Ok(Client {
            inner: Arc::new(Inner {
                calls,
                deadline: self.deadline,
                local: match &self.on_unavailable {
                    OnUnavailable::Local { share, limits } => {
                        Some(local::Buckets::new(*share, limits.clone()))
                    }
                    _ => None,
                },
                on_unavailable: self.on_unavailable,
                batcher,
                stats,
                allotter,
            }),
        })
    }
}

/// A cloneable handle to Sluice.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    calls: Calls,
    deadline: Duration,
    on_unavailable: OnUnavailable,
    local: Option<local::Buckets>,
    batcher: Option<mpsc::Sender<Queued>>,
    stats: Arc<Stats>,
    allotter: Option<Arc<allot::Allotter>>,
}

impl Client {
    /// Configure a client of `addrs` (host:port or URLs; several are balanced).
    pub fn builder<S: Into<String>>(addrs: impl IntoIterator<Item = S>) -> Builder {
        Builder {
            addrs: addrs.into_iter().map(Into::into).collect(),
            deadline: Duration::from_millis(5),
            on_unavailable: OnUnavailable::Allow,
            batch: Some(DEFAULT_BATCH),
            allotment_keys: DEFAULT_ALLOTMENT_KEYS,
            streams: true,
        }
    }

    pub fn stats(&self) -> &Stats {
        &self.inner.stats
    }

    /// Figures of the allotments held in this process (None: off).
    pub fn allotment_stats(&self) -> Option<&AllotmentStats> {
        self.inner.allotter.as_deref().map(|a| &*a.stats)
    }

    /// Report every unreported allotment spending now, within `within`;
    /// whether all of it was acknowledged. Call it at shutdown: spending
    /// not reported when the last handle is dropped is lost (the node
    /// releases the tokens after its grace: the limit admits up to that
    /// much more, as for an app killed).
    pub async fn flush_allotments(&self, within: Duration) -> bool {
        let Some(a) = &self.inner.allotter else {
            return true;
        };
        tokio::time::timeout(within, async {
            while !a.report(true).await {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .is_ok()
    }

    /// Decide one check. An error only for a request Sluice refused as bad;
    /// an unreachable or slow Sluice is a decision (see [`OnUnavailable`]).
    pub async fn check(&self, check: &Check) -> Result<Decision, CheckError> {
        if let Some(a) = &self.inner.allotter
            && a.applies(check)
        {
            let until = tokio::time::Instant::now() + self.inner.deadline;
            // Spend; or wait for the key's ask in flight and spend what it
            // brought (refused here if it cannot cover the check).
            let mut waited = false;
            loop {
                match a.spend(check, waited) {
                    allot::Spend::Decided(d) => return Ok(d),
                    allot::Spend::Ask {
                        demand,
                        unused,
                        asking,
                    } => {
                        let asked = tokio::time::timeout_at(
                            until,
                            a.ask(check, demand, unused, asking.pace, self.inner.deadline),
                        )
                        .await;
                        match asked {
                            Ok(Ok(r)) => {
                                asking.ended(allot::Asked::Answered);
                                drop(asking);
                                return self.decided(check, r);
                            }
                            // Out of time: `on_unavailable` decides.
                            Err(_) => {
                                asking.ended(allot::Asked::Failed);
                                return Ok(self.unavailable(check));
                            }
                            // This node serves no allotments, or could not
                            // be reached: decided as usual, by whichever
                            // node the balanced channel reaches.
                            Ok(Err(_)) => {
                                asking.ended(allot::Asked::Failed);
                                drop(asking);
                                break;
                            }
                        }
                    }
                    allot::Spend::Wait(mut done) => {
                        let ended = tokio::time::timeout_at(until, done.changed()).await;
                        match ended {
                            Err(_) => return Ok(self.unavailable(check)),
                            // Answered: spend what it brought, or refuse.
                            Ok(Ok(())) if *done.borrow() == allot::Asked::Answered => waited = true,
                            // Failed or cancelled: decided as usual.
                            _ => break,
                        }
                    }
                    allot::Spend::Bypass => break,
                }
            }
        }
        let answer = tokio::time::timeout(self.inner.deadline, self.ask(check.to_wire())).await;
        match answer {
            Ok(Some(r)) => self.decided(check, r),
            _ => Ok(self.unavailable(check)),
        }
    }

    /// Decide several checks in one `Check` call (e.g. the rules of one
    /// HTTP request), under one deadline; answers in order.
    /// With a tiered check among them (allotments on), each is decided as
    /// [`Client::check`] would, in order, each under its own deadline:
    /// those an allotment covers take no call.
    pub async fn check_all(&self, checks: &[Check]) -> Vec<Result<Decision, CheckError>> {
        if let Some(a) = &self.inner.allotter
            && checks.iter().any(|c| a.applies(c))
        {
            let mut out = Vec::with_capacity(checks.len());
            for c in checks {
                out.push(self.check(c).await);
            }
            return out;
        }
        let requests = checks.iter().map(Check::to_wire).collect();
        match tokio::time::timeout(self.inner.deadline, self.call(requests)).await {
            Ok(Some(responses)) if responses.len() == checks.len() => checks
                .iter()
                .zip(responses)
                .map(|(c, r)| self.decided(c, r))
                .collect(),
            _ => checks.iter().map(|c| Ok(self.unavailable(c))).collect(),
        }
    }

    fn decided(&self, check: &Check, r: pb::RateLimitResponse) -> Result<Decision, CheckError> {
        // The node decided nothing (still joining, or shedding load): the
        // same as not reaching Sluice, so this client's own setting says.
        let undecided = [pb::Reason::NotReady as i32, pb::Reason::Overloaded as i32];
        if r.error.is_none()
            && r.status == pb::Status::Unavailable as i32
            && undecided.contains(&r.reason)
        {
            return Ok(self.unavailable(check));
        }
        self.inner
            .stats
            .decided_by_sluice
            .fetch_add(1, Ordering::Relaxed);
        if let Some(a) = &self.inner.allotter {
            a.learn(check, r.path);
        }
        from_wire(check, r)
    }

    async fn ask(&self, request: pb::RateLimitRequest) -> Option<pb::RateLimitResponse> {
        if let Some(batcher) = &self.inner.batcher {
            let (answer, rx) = oneshot::channel();
            batcher.try_send(Queued { request, answer }).ok()?;
            return rx.await.ok();
        }
        let mut responses = self.call(vec![request]).await?;
        (responses.len() == 1).then(|| responses.remove(0))
    }

    /// One `Check` call.
    async fn call(
        &self,
        requests: Vec<pb::RateLimitRequest>,
    ) -> Option<Vec<pb::RateLimitResponse>> {
        self.inner.stats.calls.fetch_add(1, Ordering::Relaxed);
        match self.inner.calls.call(requests, self.inner.deadline).await {
            Called::Answered(responses) => Some(responses),
            Called::TooMany(_) | Called::Failed => None,
        }
    }

    fn unavailable(&self, check: &Check) -> Decision {
        let stats = &self.inner.stats;
        let (allowed, limit, remaining, window) = match &self.inner.on_unavailable {
            OnUnavailable::Allow => {
                stats.unavailable_allowed.fetch_add(1, Ordering::Relaxed);
                (true, 0, 0, Duration::from_secs(1))
            }
            OnUnavailable::Deny => {
                stats.unavailable_denied.fetch_add(1, Ordering::Relaxed);
                (false, 0, 0, Duration::from_secs(1))
            }
            OnUnavailable::Local { .. } => {
                stats.unavailable_local.fetch_add(1, Ordering::Relaxed);
                match &self.inner.local {
                    Some(b) => b.decide(check),
                    None => (false, 0, 0, Duration::from_secs(1)),
                }
            }
        };
        Decision {
            allowed,
            limit,
            remaining,
            // A refusal without a count to go by: try again after a second.
            retry_after: (!allowed).then_some(Duration::from_secs(1)),
            reset_after: Duration::from_secs(1),
            window,
            policy: policy_name(check),
            source: Source::Unavailable,
            path: Path::Unavailable,
            in_process: false,
        }
    }
}

fn policy_name(check: &Check) -> String {
    match &check.limit {
        Limit::Policy(p) => p.clone(),
        Limit::Inline { .. } => check.name.clone(),
    }
}

fn from_wire(check: &Check, r: pb::RateLimitResponse) -> Result<Decision, CheckError> {
    if let Some(e) = r.error {
        return Err(CheckError {
            field: e.field,
            message: e.message,
        });
    }
    let ms = |v: i64| Duration::from_millis(u64::try_from(v).unwrap_or(0));
    Ok(Decision {
        allowed: r.status == pb::Status::UnderLimit as i32,
        limit: u64::try_from(r.limit).unwrap_or(0),
        remaining: u64::try_from(r.remaining).unwrap_or(0),
        retry_after: (r.status == pb::Status::OverLimit as i32).then(|| ms(r.retry_after_ms)),
        reset_after: ms(r.reset_after_ms),
        window: ms(r.window_ms),
        policy: policy_name(check),
        source: Source::Sluice {
            approximate: r.approximate,
        },
        path: match pb::Path::try_from(r.path) {
            Ok(pb::Path::LocalAllotment) => Path::LocalAllotment,
            Ok(pb::Path::Slow) => Path::Slow,
            Ok(pb::Path::Fallback) => Path::Fallback,
            _ => Path::Owner,
        },
        in_process: false,
    })
}
