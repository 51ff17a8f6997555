//! Whether this node answers as ready — `/readyz` and the gRPC health
//! service (`grpc.health.v1`, the DaemonSet's readiness probe) say the same
//! thing, from this one place.
//!
//! Ready means: the node finished joining (its limiter follows a view that
//! holds it) and may own keys now (not back from being away until it
//! rejoined), and it is not leaving. Before that a load balancer must not
//! send it traffic: it would answer `UNAVAILABLE` (reason `NOT_READY`) for
//! any key whose owner it cannot name yet.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic::server::NamedService;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::limiter::Limiter;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use crate::proto::v1::rate_limiter_server::RateLimiterServer;

/// How often the gRPC health status follows this node's presence (which
/// changes with gossip rounds, not with an event to wait on).
const FOLLOW_EVERY: Duration = Duration::from_millis(100);

/// What gRPC health answers for: the server ("") and each decision API.
const SERVICES: [&str; 3] = [
    "",
    <RateLimiterServer<()> as NamedService>::NAME,
    <RateLimitServiceServer<()> as NamedService>::NAME,
];

/// The node's readiness; cheap to clone.
#[derive(Clone)]
pub struct Readiness {
    limiter: Limiter,
    /// Set by the node: joined and serving, not leaving.
    serving: Arc<AtomicBool>,
    health: HealthReporter,
    /// What gRPC health says now. A tokio mutex, held across the
    /// reporter's await, so two publishers never leave an older answer
    /// last.
    published: Arc<tokio::sync::Mutex<bool>>,
}

impl Readiness {
    /// Not ready, and the gRPC health service says `NOT_SERVING` for the
    /// server and every decision service from the start.
    pub async fn new(limiter: Limiter) -> Readiness {
        let r = Readiness {
            limiter,
            serving: Arc::new(AtomicBool::new(false)),
            health: HealthReporter::new(),
            published: Arc::new(tokio::sync::Mutex::new(true)),
        };
        r.publish().await;
        r
    }

    pub(super) fn reporter(&self) -> HealthReporter {
        self.health.clone()
    }

    /// Ready or not as far as the node's lifecycle goes (joined; leaving),
    /// published at once.
    pub async fn set_serving(&self, on: bool) {
        self.serving.store(on, Ordering::SeqCst);
        self.publish().await;
    }

    /// Ready now: serving, and this node may own keys.
    pub fn is_ready(&self) -> bool {
        self.serving.load(Ordering::SeqCst) && self.limiter.presence().is_ready()
    }

    /// Make gRPC health say [`Readiness::is_ready`], read under the lock.
    async fn publish(&self) {
        let mut published = self.published.lock().await;
        let ready = self.is_ready();
        self.limiter.metrics().cluster.ready.set(i64::from(ready));
        if ready == *published {
            return;
        }
        let status = if ready {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        for service in SERVICES {
            self.health.set_service_status(service, status).await;
        }
        *published = ready;
    }

    /// Keep gRPC health equal to [`Readiness::is_ready`] as presence
    /// changes, until `token` is cancelled (then `NOT_SERVING`).
    pub async fn follow(self, token: CancellationToken) {
        loop {
            self.publish().await;
            tokio::select! {
                _ = token.cancelled() => break,
                _ = tokio::time::sleep(FOLLOW_EVERY) => {}
            }
        }
        self.set_serving(false).await;
        // Drop the statuses: their watch channels close, so open `Watch`
        // streams end and the servers' graceful shutdown is not held up.
        let mut reporter = self.health.clone();
        for service in SERVICES {
            reporter.clear_service_status(service).await;
        }
    }
}
