//! The gRPC servers: which services each listener serves, the limits
//! every call meets before a handler sees it, and how long a connection
//! lives without one (`limits.idle_connection_timeout`, keepalive pings).
//!
//! The public listener serves what apps call — the v1 API, the Envoy front,
//! health and reflection. The admin listener (`admin.addr`, loopback by
//! default) serves the admin API and health. The peer API — which can
//! reset and spend any key — is served only where it is authenticated:
//! with a cluster secret (every call carries a token from it) or peer mTLS.
//! It goes on `cluster.peer_addr` when that is set, else on the public
//! listener; a single node with neither does not serve it at all. Where the
//! peer API is, the admin API is too, for operators who sign with the
//! cluster secret; every admin call, anywhere, needs an operator credential
//! ([`super::operator`]).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;

use super::admission::Admission;
use super::idle::{CountCallsLayer, keepalive};
use super::listener::Listener;
use crate::config::{Config, ConfigError};
use crate::limiter::Limiter;
use crate::metrics::Resources;
use crate::proto::FILE_DESCRIPTOR_SET;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use crate::proto::peer::peer_server::PeerServer;
use crate::proto::v1::admin_server::AdminServer;
use crate::proto::v1::allotments_server::AllotmentsServer;
use crate::proto::v1::rate_limiter_server::RateLimiterServer;
use crate::service::headers::Families;
use crate::service::operator::OperatorAuth;
use crate::service::{
    admin::AdminService, allotments::AllotmentsService, envoy::RlsService, peer::PeerService,
    v1::RateLimiterService,
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
    /// What apps call, and the peer API when it is authenticated.
    All,
    /// What apps call.
    Public,
    /// Peer and admin.
    Peer,
    /// Admin and health, on `admin.addr`.
    Admin,
}

type Health = tonic_health::pb::health_server::HealthServer<tonic_health::server::HealthService>;

/// Every gRPC service of a node, built once and served by one or two
/// listeners.
#[derive(Clone)]
pub struct Services {
    v1: RateLimiterServer<RateLimiterService>,
    allotments: AllotmentsServer<AllotmentsService>,
    envoy: RateLimitServiceServer<RlsService>,
    admin: AdminServer<AdminService>,
    peer: PeerServer<PeerService>,
    /// Says what [`super::readiness::Readiness`] publishes.
    health: Health,
    operator: OperatorAuth,
    /// Whether peer calls are authenticated (a cluster secret, or mTLS on
    /// the peer listener): else the peer API is not served.
    peer_authenticated: bool,
    max_streams: u32,
    /// Bytes of messages being received, node-wide (`inbound.rs`).
    inbound: super::inbound::Inbound,
    idle_timeout: std::time::Duration,
    resources: Arc<Resources>,
    /// The status page's routes (`status`), for the admin listener.
    status: Option<axum::Router>,
}

/// What the front ends hear of the node's life: whether it is ready
/// (health), and when it stops (long-lived streams end).
pub struct NodeLife<'a> {
    pub readiness: &'a super::readiness::Readiness,
    pub stopping: CancellationToken,
}

impl Services {
    pub fn new(
        config: &Config,
        limiter: Limiter,
        admin: AdminService,
        peer: PeerService,
        operator: OperatorAuth,
        life: NodeLife<'_>,
        admission: Admission,
    ) -> Result<Services, GrpcError> {
        let NodeLife {
            readiness,
            stopping,
        } = life;
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
                stopping,
            ))
            .max_decoding_message_size(max),
            allotments: AllotmentsServer::new(AllotmentsService::new(
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
            operator,
            peer_authenticated: config.cluster.secret_bytes()?.is_some()
                || (config.cluster.tls.is_some() && config.cluster.peer_addr.is_some()),
            max_streams: config.limits.max_concurrent_streams,
            inbound: super::inbound::Inbound::new(
                config.limits.max_inbound_bytes,
                limiter.metrics().resources.clone(),
            ),
            idle_timeout: config.limits.idle_connection_timeout,
            resources: limiter.metrics().resources.clone(),
            status: None,
        })
    }

    /// Serve the status page (`GET /`, `GET /status`) on the admin
    /// listener, over HTTP/1.1 beside its gRPC: a browser speaks HTTP/1.1,
    /// and the page needs no port of its own (nodes on one host would
    /// need one each), nor another bound or idle timeout — the admin
    /// listener's apply.
    pub fn with_status(mut self, router: axum::Router) -> Services {
        self.status = Some(router);
        self
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
        self.serve_on(api, Socket::Tcp(listener, tls), token)
    }

    /// Serve `api` on `socket` until `token` is cancelled.
    pub fn serve_on(
        &self,
        api: Api,
        socket: Socket,
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
        let status = match api {
            Api::Admin => self.status.clone(),
            _ => None,
        };
        let mut builder = tonic::transport::Server::builder()
            .accept_http1(status.is_some())
            .tcp_nodelay(true)
            .max_concurrent_streams(self.max_streams)
            // A dead peer's connection is closed even with a call in
            // progress (an idle one is closed by the listener).
            .http2_keepalive_interval(Some(ping_every))
            .http2_keepalive_timeout(Some(ping_ack_within))
            // Outermost: a call is in progress until its response ends.
            .layer(CountCallsLayer)
            // HTTP/1.1 (accepted on the admin listener only) reaches the
            // status page and nothing else.
            .layer(super::status::PageOnlyOverHttp1Layer)
            .layer(tower::util::MapResponseLayer::new(
                move |r: http::Response<tonic::body::Body>| {
                    exhausted_not_out_of_range(r, &resources)
                },
            ))
            // Innermost: a message's bytes are counted as they arrive,
            // before tonic buffers and decodes it.
            .layer(self.inbound.clone());
        let routes = status.map(tonic::service::Routes::from).unwrap_or_default();
        let mut router = builder.add_routes(routes).add_service(self.health.clone());
        if matches!(api, Api::All | Api::Public) {
            router = router
                .add_service(reflection().build_v1()?)
                .add_service(reflection().build_v1alpha()?)
                .add_service(self.v1.clone())
                .add_service(self.allotments.clone())
                .add_service(self.envoy.clone());
        }
        let admin = || InterceptedService::new(self.admin.clone(), self.operator.clone());
        match api {
            Api::Public => {}
            Api::Admin => router = router.add_service(admin()),
            Api::All | Api::Peer => {
                if self.peer_authenticated {
                    router = router.add_service(admin()).add_service(self.peer.clone());
                }
            }
        }
        let name = match &socket {
            Socket::Tcp(l, _) => l.name,
            Socket::Unix(l) => l.name,
        };
        Ok(async move {
            let shutdown = token.clone().cancelled_owned();
            let served = match socket {
                Socket::Tcp(listener, Some(tls)) => {
                    router
                        .serve_with_incoming_shutdown(listener.tls(tls, token), shutdown)
                        .await
                }
                Socket::Tcp(listener, None) => {
                    router
                        .serve_with_incoming_shutdown(listener.plain(token), shutdown)
                        .await
                }
                Socket::Unix(listener) => {
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

/// Where a gRPC server listens.
pub enum Socket {
    /// TCP, with TLS when configured.
    Tcp(Listener, Option<Arc<Reloading>>),
    /// A Unix socket (`grpc_uds`): same-host callers; no TLS — who
    /// reaches the socket's directory may connect.
    Unix(Listener<tokio::net::UnixListener>),
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
