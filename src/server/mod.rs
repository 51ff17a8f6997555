//! A running node: the gRPC and HTTP servers, gossip membership, the ring
//! follower, the lease reporter, the idle-key sweeper and the config and
//! rules watchers ([`watch`]), all stopped by one cancellation token.
//!
//! [`Node::start`] binds every port before returning (so tests can start
//! nodes on port 0 and read the real addresses) and joins the cluster as
//! `ready` once it serves. [`Node::leave`] is the graceful exit: announce
//! `leaving` (peers drop this node from their rings at once), keep answering
//! for `leave_grace`, then stop. [`Node::kill`] stops without a word, as a
//! crash would.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::algorithm::Bounds;
use tasks::{every, follow_ring, replicate, report};
mod shutdown;
mod tasks;
mod uds;
mod watch;
mod world;

pub use watch::apply_policies;

pub use world::World;

use crate::clock::SharedClock;
use crate::cluster::auth::Secret;
use crate::cluster::faults::Faults;
use crate::cluster::membership::{Lifecycle, Membership, MembershipConfig};
use crate::cluster::peers::{ForwardSettings, Peers};
use crate::config::{Config, ConfigError, Sources};
use crate::lease::Leases;
use crate::limiter::{ClusterSettings, Limiter, Parts};
use crate::metrics::Metrics;
use crate::policy::Policies;
use crate::service::admission::Admission;
use crate::service::grpc::{Api, NodeLife, Services};
use crate::service::headers::Families;
use crate::service::operator::{AdminToken, OperatorAuth};
use crate::service::readiness::Readiness;
use crate::service::{admin::AdminService, http, peer::PeerService};
use crate::store::Store;
use crate::tls::{Reloading, ServerFiles, TlsError};

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("cluster.advertise_host {host:?}: {reason}")]
    Advertise { host: String, reason: String },
    #[error("{0}")]
    Grpc(#[from] crate::service::grpc::GrpcError),
    #[error("config watcher: {0}")]
    Watch(#[from] notify::Error),
    #[error("{0}")]
    Membership(#[from] crate::cluster::membership::MembershipError),
    #[error("{0}")]
    AdminToken(#[from] crate::service::operator::TokenError),
}

/// A started node.
pub struct Node {
    pub grpc_addr: SocketAddr,
    /// The peer and admin listener, when `cluster.peer_addr` is set.
    pub peer_addr: Option<SocketAddr>,
    /// The admin listener (`admin.addr`).
    pub admin_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub gossip_addr: SocketAddr,
    pub limiter: Limiter,
    pub membership: Membership,
    /// Test hook: links to behave as cut (see `cluster::faults`).
    pub faults: Arc<Faults>,
    readiness: Readiness,
    leave_grace: Duration,
    handoff_timeout: Duration,
    shutdown: CancellationToken,
    tasks: JoinSet<()>,
    /// `grpc_uds`'s socket file, removed when the node is dropped (after
    /// its servers stopped).
    _socket_file: Option<uds::SocketFile>,
}

fn bind_error(what: &'static str, addr: SocketAddr) -> impl FnOnce(std::io::Error) -> StartError {
    move |source| StartError::Bind { what, addr, source }
}

impl Node {
    /// Start a node. `sources` (when the config came from a file) enables
    /// reloading policies when that file changes.
    pub async fn start(
        config: Config,
        policies: Policies,
        sources: Option<Sources>,
        clock: SharedClock,
    ) -> Result<Node, StartError> {
        Node::start_until(config, policies, sources, clock, CancellationToken::new()).await
    }

    /// [`Node::start`], cut short by `stop`: a node told to stop while it
    /// still joins returns at once, not ready (it never turns ready only to
    /// hand its keys straight back), and its caller makes it leave.
    pub async fn start_until(
        config: Config,
        policies: Policies,
        sources: Option<Sources>,
        clock: SharedClock,
        stop: CancellationToken,
    ) -> Result<Node, StartError> {
        Node::start_in(World::os(clock), config, policies, sources, stop).await
    }

    /// [`Node::start_until`] in `world`: its clock, network and threads
    /// (production's are [`World::os`]).
    pub async fn start_in(
        world: World,
        config: Config,
        policies: Policies,
        sources: Option<Sources>,
        stop: CancellationToken,
    ) -> Result<Node, StartError> {
        let World {
            clock,
            net,
            threads,
            hash_seed,
        } = world;
        let cluster = &config.cluster;
        let secret = Secret::with_clock(
            cluster.secret_bytes()?.as_deref(),
            cluster.token_window,
            clock.clone(),
        );
        if !secret.is_set() {
            tracing::warn!(
                "no cluster secret: gossip and peer calls are not authenticated (set cluster.secret_file)"
            );
        }
        // One byte budget for what this node keeps: an eighth for the
        // owners' answers it remembers as an edge (a cache: losing one
        // costs a lease's precision, never a count), the rest for the keys
        // it holds as owner or replica.
        let max_memory = usize::try_from(config.limits.max_memory_bytes()).unwrap_or(usize::MAX);
        let lease_memory = max_memory / 8;
        let mut store = Store::bounded(config.limits.max_keys, max_memory - lease_memory);
        if let Some(seed) = hash_seed {
            store = store.seeded(seed);
        }
        let store = Arc::new(store);
        let metrics = Arc::new(Metrics::new(
            Box::new(crate::store::StoreCollector(store.clone())),
            config.limits.max_metric_names,
        ));
        let faults = Arc::new(Faults::default());
        let peers = Peers::new(
            &config.node_id,
            secret.clone(),
            ForwardSettings {
                timeout: cluster.forward_timeout,
                batch_max_items: cluster.batch_max_items,
                batch_wait: cluster.batch_wait,
                queue: cluster.peer_queue,
                in_flight: cluster.peer_in_flight,
                breaker_failures: cluster.breaker_failures,
                breaker_cooldown: cluster.breaker_cooldown,
                tls: match &cluster.tls {
                    Some(tls) => {
                        Some(crate::tls::peer_client(tls).map_err(|e| ConfigError(e.to_string()))?)
                    }
                    None => None,
                },
                bounds: Bounds {
                    max_log_entries: config.limits.max_log_entries,
                },
                clock: clock.clone(),
                connector: net.connector(),
            },
            metrics.cluster.clone(),
            faults.clone(),
        );
        let clock_handle = clock.clone();
        let policy_hash = policies.hash();
        let shutdown = CancellationToken::new();
        let mut tasks = JoinSet::new();

        let grpc = net
            .listen(config.grpc_addr)
            .await
            .map_err(bind_error("gRPC", config.grpc_addr))?;
        let http = net
            .listen(config.http_addr)
            .await
            .map_err(bind_error("HTTP admin", config.http_addr))?;
        let admin_listener = net
            .listen(config.admin.addr)
            .await
            .map_err(bind_error("admin gRPC", config.admin.addr))?;
        let admin_addr = admin_listener
            .local_addr()
            .map_err(bind_error("admin gRPC", config.admin.addr))?;
        let admin_token = AdminToken::load(&config.admin)?;
        if !admin_addr.ip().is_loopback() {
            tracing::warn!(
                %admin_addr,
                "the admin API listens beyond loopback in plaintext: its token crosses the network in clear; keep admin.addr on loopback or a private network"
            );
        }
        if config.grpc_uds.is_some()
            && config
                .tls
                .as_ref()
                .is_some_and(|t| t.client_ca_file.is_some())
        {
            tracing::warn!(
                "grpc_uds takes callers without client certificates (tls.client_ca_file guards the TCP port only): the socket's directory is its only guard"
            );
        }
        let uds = match &config.grpc_uds {
            Some(path) => Some(uds::bind(path).await?),
            None => None,
        };
        let peer_listener = match cluster.peer_addr {
            Some(addr) => Some(
                net.listen(addr)
                    .await
                    .map_err(bind_error("peer gRPC", addr))?,
            ),
            None => None,
        };
        let gossip = net
            .datagrams(cluster.gossip_addr)
            .await
            .map_err(bind_error("gossip", cluster.gossip_addr))?;
        let grpc_addr = grpc
            .local_addr()
            .map_err(bind_error("gRPC", config.grpc_addr))?;
        let http_addr = http
            .local_addr()
            .map_err(bind_error("HTTP admin", config.http_addr))?;
        let gossip_addr = gossip
            .local_addr()
            .map_err(bind_error("gossip", cluster.gossip_addr))?;

        let host = advertise_host(cluster.advertise_host.as_deref(), grpc_addr.ip());
        let gossip_advertise = resolve(&host, gossip_addr.port()).await?;
        let peer_addr = match &peer_listener {
            Some(l) => Some(l.local_addr().map_err(bind_error("peer gRPC", grpc_addr))?),
            None => None,
        };
        // Peers reach this node's peer API: its own listener when it has one.
        let grpc_advertise = format!("{host}:{}", peer_addr.unwrap_or(grpc_addr).port());
        if !cluster.seeds.is_empty()
            && gossip_advertise.ip().is_loopback()
            && cluster.advertise_host.is_none()
        {
            tracing::warn!("advertising a loopback address to seeds; set cluster.advertise_host");
        }
        let membership = Membership::start(MembershipConfig {
            cluster_id: cluster.cluster_id.clone(),
            node_id: config.node_id.clone(),
            generation: cluster
                .generation
                .unwrap_or_else(|| clock.wall() / 1_000_000),
            gossip_socket: gossip,
            gossip_advertise,
            seeds: cluster.seeds.clone(),
            bootstrap_expect: cluster.bootstrap_expect,
            zone: cluster.zone.clone().unwrap_or_default(),
            secret: secret.clone(),
            gossip_interval: cluster.gossip_interval,
            phi_threshold: cluster.phi_threshold,
            dead_grace: cluster.dead_grace,
            grpc_advertise,
            policy_hash,
            faults: faults.clone(),
            protocol: crate::proto::PEER_PROTOCOL_VERSION,
            clock: clock.clone(),
            threads,
        })
        .await?;
        peers.attach(membership.presence());
        let mut leases = Leases::new(cluster.lease_max_keys, lease_memory, clock.wall());
        if let Some(seed) = hash_seed {
            leases = leases.seeded(seed ^ 0x1ea5e);
        }
        let limiter = Limiter::new(Parts {
            node_id: config.node_id.clone(),
            store,
            policies,
            clock,
            metrics,
            peers,
            leases,
            presence: membership.presence(),
            nudge: {
                let membership = membership.clone();
                Arc::new(move |node: &str| membership.gossip_with(node))
            },
            settings: ClusterSettings {
                handoff_timeout: cluster.handoff_timeout,
                budget: cluster.forward_timeout,
                in_doubt_grace: cluster.in_doubt_grace,
                tiered: crate::lease::tiered::Terms {
                    ttl: cluster.tiered_allotment_ttl.as_nanos() as u64,
                    // Reports of an allotment's last hits may take a few
                    // report rounds to arrive: keep it reserved that long.
                    grace: (cluster.report_interval * 3 + cluster.forward_timeout).as_nanos()
                        as u64,
                    max_edges: 1_024,
                    memory: (cluster.tiered_allotment_ttl * 8)
                        .max(Duration::from_secs(1))
                        .as_nanos() as u64,
                },
                tiered_max_keys: cluster.lease_max_keys,
                client_allotments: cluster.client_allotments.enabled.then(|| {
                    let c = &cluster.client_allotments;
                    (
                        crate::lease::tiered::Caps {
                            max_keys: cluster.lease_max_keys,
                            max_clients: c.max_clients,
                            max_keys_per_client: c.max_keys_per_client,
                            max_clients_per_key: c.max_clients_per_key,
                        },
                        c.report_interval.as_nanos() as u64,
                    )
                }),
            },
        });
        tasks.spawn(follow_ring(
            membership.clone(),
            limiter.clone(),
            shutdown.clone(),
        ));
        tasks.spawn(replicate(
            limiter.clone(),
            cluster.replicate_interval,
            shutdown.clone(),
        ));
        tasks.spawn(report(
            limiter.clone(),
            cluster.report_interval,
            shutdown.clone(),
        ));

        let bounds = Bounds {
            max_log_entries: config.limits.max_log_entries,
        };
        if let Some(path) = &config.envoy.rules_path {
            watch::load_rules(path, &config.envoy, &bounds, &limiter)
                .map_err(|e| ConfigError(format!("envoy.rules_path: {e}")))?;
        }
        let peer = PeerService::new(
            limiter.clone(),
            secret.clone(),
            bounds,
            cluster.batch_max_items.max(1_000),
        );
        let admin = AdminService::new(limiter.clone(), membership.clone());
        let resources = limiter.metrics().resources.clone();
        resources.set_bounds(&bounds_of(&config));
        let api_tls = match &config.tls {
            Some(tls) => Some(Reloading::new(ServerFiles::api(tls)).map_err(tls_error)?),
            None => None,
        };
        let peer_tls = match &cluster.tls {
            Some(tls) => Some(Reloading::new(ServerFiles::peer(tls)).map_err(tls_error)?),
            None => None,
        };
        for tls in api_tls.iter().chain(peer_tls.iter()) {
            let metrics = limiter.metrics().clone();
            tasks.spawn(
                tls.clone()
                    .watch(move |ok| metrics.reloaded(ok), shutdown.clone()),
            );
        }
        let readiness = Readiness::new(limiter.clone()).await;
        // One budget of checks in progress for every front end.
        let admission = Admission::new(&config.limits, limiter.metrics().clone()).on(threads);
        let services = Services::new(
            &config,
            limiter.clone(),
            admin,
            peer,
            OperatorAuth::new(admin_token.clone(), secret, &config.node_id),
            NodeLife {
                readiness: &readiness,
                stopping: shutdown.clone(),
            },
            admission.clone(),
        )?
        .with_status(crate::service::status::router(
            limiter.clone(),
            membership.clone(),
            admin_token.clone(),
        ));
        let grpc = crate::service::listener::Listener {
            name: "grpc",
            listener: grpc,
            max_connections: config.limits.max_connections,
            idle_timeout: config.limits.idle_connection_timeout,
            resources: resources.clone(),
        };
        match peer_listener {
            None => {
                tasks.spawn(services.serve(Api::All, grpc, api_tls, shutdown.clone())?);
            }
            Some(listener) => {
                tasks.spawn(services.serve(Api::Public, grpc, api_tls, shutdown.clone())?);
                let peer = crate::service::listener::Listener {
                    name: "peer",
                    listener,
                    max_connections: config.limits.max_connections,
                    idle_timeout: config.limits.idle_connection_timeout,
                    resources,
                };
                tasks.spawn(services.serve(Api::Peer, peer, peer_tls, shutdown.clone())?);
            }
        }
        let socket_file = match uds {
            Some((listener, file)) => {
                let uds = crate::service::listener::Listener {
                    name: "grpc_uds",
                    listener,
                    max_connections: config.limits.max_connections,
                    idle_timeout: config.limits.idle_connection_timeout,
                    resources: limiter.metrics().resources.clone(),
                };
                tasks.spawn(services.serve_on(
                    Api::Public,
                    crate::service::grpc::Socket::Unix(uds),
                    shutdown.clone(),
                )?);
                Some(file)
            }
            None => None,
        };
        let admin_listener = crate::service::listener::Listener {
            name: "admin",
            listener: admin_listener,
            max_connections: config.limits.max_connections,
            idle_timeout: config.limits.idle_connection_timeout,
            resources: limiter.metrics().resources.clone(),
        };
        tasks.spawn(services.serve(Api::Admin, admin_listener, None, shutdown.clone())?);
        let families = Families::parse(&config.header_families).map_err(ConfigError)?;
        tasks.spawn(readiness.clone().follow(shutdown.clone()));
        let router = http::router(
            limiter.clone(),
            readiness.clone(),
            config.limits.clone(),
            families,
            admission,
        );
        let token = shutdown.clone();
        let http = crate::service::listener::HttpListener::new(
            crate::service::listener::Listener {
                name: "http",
                listener: http,
                max_connections: config.limits.max_connections,
                idle_timeout: config.limits.idle_connection_timeout,
                resources: limiter.metrics().resources.clone(),
            },
            shutdown.clone(),
        )
        .map_err(bind_error("HTTP admin", http_addr))?;
        tasks.spawn(async move {
            let served = axum::serve(
                http,
                router.into_make_service_with_connect_info::<crate::service::idle::HttpConn>(),
            )
            .with_graceful_shutdown(token.cancelled_owned())
            .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "HTTP admin server failed");
            }
        });
        // The status page's decision rates: one sample a second.
        limiter.sample_rates();
        let sampled = limiter.clone();
        tasks.spawn(every(Duration::from_secs(1), shutdown.clone(), move || {
            sampled.sample_rates();
            std::future::ready(())
        }));
        // Steer the clock toward the wall clock, a little at a time.
        let steered = clock_handle.clone();
        tasks.spawn(every(Duration::from_secs(1), shutdown.clone(), move || {
            steered.resync();
            std::future::ready(())
        }));
        let sweeper = limiter.clone();
        tasks.spawn(every(
            config.limits.sweep_interval,
            shutdown.clone(),
            move || {
                // A sweep reads every key (tens of milliseconds at a
                // million): on a blocking thread, so no runtime worker —
                // and no call queued behind it — waits for it.
                let sweeper = sweeper.clone();
                async move {
                    if let Some(removed) = threads.blocking(move || sweeper.sweep()).await
                        && removed > 0
                    {
                        tracing::debug!(removed, "swept idle keys")
                    }
                }
            },
        ));
        if let Some(sources) = sources
            && let Some(path) = sources.file().map(PathBuf::from)
        {
            let watcher = watch::config(
                path,
                sources,
                config.clone(),
                limiter.clone(),
                membership.clone(),
                shutdown.clone(),
            )?;
            tasks.spawn(watcher);
        }
        if let Some(path) = &config.envoy.rules_path {
            tasks.spawn(watch::rules(
                path.clone(),
                config.envoy.clone(),
                bounds,
                limiter.clone(),
                shutdown.clone(),
            )?);
        }
        // Join before owning anything (see `Membership::join`).
        membership.join(&stop).await;
        if !stop.is_cancelled() {
            // Serve as ready once the limiter follows the view that holds it.
            tokio::select! {
                _ = limiter.adopted(membership.view().ring.epoch(), Duration::from_secs(2)) => {}
                _ = stop.cancelled() => {}
            }
        }
        if !stop.is_cancelled() {
            readiness.set_serving(true).await;
            tracing::info!(%grpc_addr, %http_addr, %gossip_addr, node_id = %config.node_id, "serving");
        } else {
            tracing::info!(node_id = %config.node_id, "stopped before it joined");
        }
        Ok(Node {
            grpc_addr,
            peer_addr,
            admin_addr,
            http_addr,
            gossip_addr,
            limiter,
            membership,
            faults,
            readiness,
            leave_grace: cluster.leave_grace,
            handoff_timeout: cluster.handoff_timeout,
            shutdown,
            tasks,
            _socket_file: socket_file,
        })
    }
}

/// The host peers use to reach this node.
fn advertise_host(configured: Option<&str>, listen: IpAddr) -> String {
    match configured {
        Some(h) => h.to_string(),
        None if !listen.is_unspecified() => listen.to_string(),
        None => "127.0.0.1".to_string(),
    }
}

async fn resolve(host: &str, port: u16) -> Result<SocketAddr, StartError> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    let error = |reason: String| StartError::Advertise {
        host: host.to_string(),
        reason,
    };
    tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| error(e.to_string()))?
        .next()
        .ok_or_else(|| error("resolves to no address".into()))
}

fn tls_error(e: TlsError) -> StartError {
    StartError::Config(ConfigError(e.to_string()))
}

/// The configured resource bounds, as `/metrics` publishes them.
fn bounds_of(config: &Config) -> Vec<(&'static str, u64)> {
    let (l, c) = (&config.limits, &config.cluster);
    let n = |v: usize| v as u64;
    vec![
        ("max_keys", n(l.max_keys)),
        ("max_memory_bytes", l.max_memory_bytes()),
        ("max_batch", n(l.max_batch)),
        ("max_key_bytes", n(l.max_key_bytes)),
        ("max_message_bytes", n(l.max_message_bytes)),
        ("max_inbound_bytes", n(l.max_inbound_bytes)),
        ("max_in_flight_checks", n(l.max_in_flight_checks)),
        ("max_connections", n(l.max_connections)),
        (
            "idle_connection_timeout_ms",
            u64::try_from(l.idle_connection_timeout.as_millis()).unwrap_or(u64::MAX),
        ),
        (
            "max_concurrent_streams",
            u64::from(l.max_concurrent_streams),
        ),
        ("max_log_entries", l.max_log_entries),
        ("peer_queue", n(c.peer_queue)),
        ("peer_in_flight", n(c.peer_in_flight)),
        ("lease_max_keys", n(c.lease_max_keys)),
    ]
}
