//! The gRPC servers: which services each listener serves, the limits
//! every call meets before a handler sees it, and how long a connection
//! lives without one (`limits.idle_connection_timeout`, keepalive pings).
//!
//! With no `cluster.peer_addr`, one listener serves everything (a single
//! node needs no more). With one, the public listener serves only what apps
//! call — the v1 API, the Envoy front, health and reflection — and the peer
//! listener serves the peer and admin APIs (and health): an app's
//! credentials (its TLS client certificate, its network access to the
//! public port) never reach them.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Status};

use super::admission::Admission;
use super::idle::{CountCallsLayer, keepalive};
use super::listener::Listener;
use crate::cluster::auth::{Secret, TOKEN_HEADER};
use crate::config::{Config, ConfigError};
use crate::limiter::Limiter;
use crate::metrics::Resources;
use crate::proto::FILE_DESCRIPTOR_SET;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use crate::proto::peer::peer_server::PeerServer;
use crate::proto::v1::admin_server::AdminServer;
use crate::proto::v1::rate_limiter_server::RateLimiterServer;
use crate::service::headers::Families;
use crate::service::{
    admin::AdminService, envoy::RlsService, peer::PeerService, v1::RateLimiterService,
};
use crate::tls::Reloading;

/// Why the gRPC services could not be built.
#[derive(Debug, thiserror::Error)]
pub enum GrpcError {
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
}

/// Which services a listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// Everything, on one listener.
    All,
    /// What apps call.
    Public,
    /// Peer and admin.
    Peer,
}

type Health = tonic_health::pb::health_server::HealthServer<tonic_health::server::HealthService>;

/// Admin calls need operator credentials: a peer token from the cluster
/// secret (when one is set). With peer mTLS they also arrive only over the
/// peer listener, so only with a certificate from the cluster CA.
#[derive(Clone)]
struct OperatorAuth(Secret);

impl tonic::service::Interceptor for OperatorAuth {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let token = request
            .metadata()
            .get(TOKEN_HEADER)
            .and_then(|v| v.to_str().ok());
        match self.0.check_peer_token(token) {
            Ok(_) => Ok(request),
            Err(why) => Err(Status::unauthenticated(format!(
                "admin call refused: {why} (sign it with the cluster secret: --secret-file)"
            ))),
        }
    }
}

/// Every gRPC service of a node, built once and served by one or two
/// listeners.
#[derive(Clone)]
pub struct Services {
    v1: RateLimiterServer<RateLimiterService>,
    envoy: RateLimitServiceServer<RlsService>,
    admin: AdminServer<AdminService>,
    peer: PeerServer<PeerService>,
    /// Says what [`super::readiness::Readiness`] publishes.
    health: Health,
    secret: Secret,
    max_streams: u32,
    idle_timeout: std::time::Duration,
    resources: Arc<Resources>,
}

impl Services {
    pub fn new(
        config: &Config,
        limiter: Limiter,
        admin: AdminService,
        peer: PeerService,
        secret: Secret,
        readiness: &super::readiness::Readiness,
        admission: Admission,
    ) -> Result<Services, GrpcError> {
        let max = config.limits.max_message_bytes;
        let health = Health::new(tonic_health::server::HealthService::from_health_reporter(
            readiness.reporter(),
        ));
        let families = Families::parse(&config.header_families).map_err(ConfigError)?;
        let families = config.envoy.response_headers.then_some(families);
        Ok(Services {
            v1: RateLimiterServer::new(RateLimiterService::new(
                limiter.clone(),
                config.limits.clone(),
                admission.clone(),
            ))
            .max_decoding_message_size(max),
            envoy: RateLimitServiceServer::new(
                RlsService::new(
                    limiter.clone(),
                    admission,
                    config.limits.max_key_bytes,
                    families,
                )
                .with_dynamic_metadata(config.envoy.response_dynamic_metadata),
            )
            .max_decoding_message_size(max),
            admin: AdminServer::new(admin).max_decoding_message_size(max),
            peer: PeerServer::new(peer).max_decoding_message_size(max),
            health,
            secret,
            max_streams: config.limits.max_concurrent_streams,
            idle_timeout: config.limits.idle_connection_timeout,
            resources: limiter.metrics().resources.clone(),
        })
    }

    /// Serve `api` on `listener` (over TLS when `tls` is given) until
    /// `token` is cancelled.
    pub fn serve(
        &self,
        api: Api,
        listener: Listener,
        tls: Option<Arc<Reloading>>,
        token: CancellationToken,
    ) -> Result<impl std::future::Future<Output = ()> + use<>, GrpcError> {
        let reflection = || {
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(sluice_api::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        };
        let resources = self.resources.clone();
        let (ping_every, ping_ack_within) = keepalive(self.idle_timeout);
        let mut builder = tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .max_concurrent_streams(self.max_streams)
            // A dead peer's connection is closed even with a call in
            // progress (an idle one is closed by the listener).
            .http2_keepalive_interval(Some(ping_every))
            .http2_keepalive_timeout(Some(ping_ack_within))
            // Outermost: a call is in progress until its response ends.
            .layer(CountCallsLayer)
            .layer(tower::util::MapResponseLayer::new(
                move |r: http::Response<tonic::body::Body>| {
                    exhausted_not_out_of_range(r, &resources)
                },
            ));
        let mut router = builder.add_service(self.health.clone());
        if api != Api::Peer {
            router = router
                .add_service(reflection().build_v1()?)
                .add_service(reflection().build_v1alpha()?)
                .add_service(self.v1.clone())
                .add_service(self.envoy.clone());
        }
        if api != Api::Public {
            let admin =
                InterceptedService::new(self.admin.clone(), OperatorAuth(self.secret.clone()));
            router = router.add_service(admin).add_service(self.peer.clone());
        }
        let name = listener.name;
        Ok(async move {
            let shutdown = token.clone().cancelled_owned();
            let served = match tls {
                Some(tls) => {
                    router
                        .serve_with_incoming_shutdown(listener.tls(tls, token), shutdown)
                        .await
                }
                None => {
                    router
                        .serve_with_incoming_shutdown(listener.plain(token), shutdown)
                        .await
                }
            };
            if let Err(e) = served {
                tracing::error!(listener = name, error = %e, "gRPC server failed");
            }
        })
    }
}

/// tonic answers a message above `max_decoding_message_size` with
/// `OUT_OF_RANGE`; gRPC's convention (and every other implementation's) is
/// `RESOURCE_EXHAUSTED`, which is what a caller's retry logic looks for.
fn exhausted_not_out_of_range<B>(
    mut response: http::Response<B>,
    resources: &Resources,
) -> http::Response<B> {
    let headers = response.headers_mut();
    // grpc-message is percent-encoded on the wire.
    let too_large = headers.get("grpc-status").map(|v| v.as_bytes()) == Some(b"11")
        && headers.get("grpc-message").is_some_and(|m| {
            let m = m.as_bytes();
            m.starts_with(b"Error,%20decoded%20message%20length%20too%20large")
                || m.starts_with(b"Error, decoded message length too large")
        });
    if too_large {
        resources.exhausted("message_bytes");
        headers.insert("grpc-status", http::HeaderValue::from_static("8"));
    }
    response
}
