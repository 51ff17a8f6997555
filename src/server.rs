//! A running node: the gRPC and HTTP servers, the idle-key sweeper and the
//! config watcher, all stopped by one cancellation token.
//!
//! [`Node::start`] binds both ports before returning (so tests can start a
//! node on port 0 and read the real addresses), and graceful shutdown is
//! threaded through every task: [`Node::shutdown`] marks the node not ready,
//! stops accepting, lets in-flight calls finish, and [`Node::wait`] returns
//! once every task has ended.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::config::{Config, Sources};
use crate::limiter::Limiter;
use crate::metrics::Metrics;
use crate::policy::Policies;
use crate::proto::FILE_DESCRIPTOR_SET;
use crate::proto::v1::admin_server::AdminServer;
use crate::proto::v1::rate_limiter_server::RateLimiterServer;
use crate::service::{admin::AdminService, http, v1::RateLimiterService};
use crate::store::Store;

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("config watcher: {0}")]
    Watch(#[from] notify::Error),
}

/// A started node.
pub struct Node {
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub limiter: Limiter,
    ready: Arc<AtomicBool>,
    shutdown: CancellationToken,
    tasks: JoinSet<()>,
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
        let store = Arc::new(Store::new(config.limits.max_keys));
        let metrics = Arc::new(Metrics::new(store.clone(), config.limits.max_metric_names));
        let limiter = Limiter::new(&config.node_id, store, policies, clock, metrics);
        let shutdown = CancellationToken::new();
        let ready = Arc::new(AtomicBool::new(false));
        let mut tasks = JoinSet::new();

        let bind = |what, addr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|source| StartError::Bind { what, addr, source })
        };
        let grpc = bind("gRPC", config.grpc_addr).await?;
        let http = bind("HTTP admin", config.http_addr).await?;
        let grpc_addr = grpc.local_addr().map_err(|source| StartError::Bind {
            what: "gRPC",
            addr: config.grpc_addr,
            source,
        })?;
        let http_addr = http.local_addr().map_err(|source| StartError::Bind {
            what: "HTTP admin",
            addr: config.http_addr,
            source,
        })?;

        tasks.spawn(serve_grpc(
            grpc,
            &config,
            limiter.clone(),
            shutdown.clone(),
        )?);
        let router = http::router(limiter.clone(), ready.clone());
        let token = shutdown.clone();
        tasks.spawn(async move {
            let served = axum::serve(http, router)
                .with_graceful_shutdown(token.cancelled_owned())
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "HTTP admin server failed");
            }
        });
        tasks.spawn(sweep(
            limiter.clone(),
            config.limits.sweep_interval,
            shutdown.clone(),
        ));
        if let Some(sources) = sources
            && let Some(path) = sources.file().map(PathBuf::from)
        {
            let watcher = watch_config(
                path,
                sources,
                config.clone(),
                limiter.clone(),
                shutdown.clone(),
            )?;
            tasks.spawn(watcher);
        }
        ready.store(true, Ordering::SeqCst);
        tracing::info!(%grpc_addr, %http_addr, node_id = %config.node_id, "serving");
        Ok(Node {
            grpc_addr,
            http_addr,
            limiter,
            ready,
            shutdown,
            tasks,
        })
    }

    /// Begin a graceful shutdown: not ready, stop accepting, finish in-flight calls.
    pub fn shutdown(&self) {
        self.ready.store(false, Ordering::SeqCst);
        self.shutdown.cancel();
    }

    /// Wait until every task has stopped (after [`Node::shutdown`]).
    pub async fn wait(mut self) {
        while self.tasks.join_next().await.is_some() {}
    }
}

fn serve_grpc(
    listener: TcpListener,
    config: &Config,
    limiter: Limiter,
    token: CancellationToken,
) -> Result<impl std::future::Future<Output = ()> + use<>, StartError> {
    let max = config.limits.max_message_bytes;
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;
    let (health, health_service) = tonic_health::server::health_reporter();
    let v1 = RateLimiterServer::new(RateLimiterService::new(
        limiter.clone(),
        config.limits.clone(),
    ))
    .max_decoding_message_size(max);
    let admin = AdminServer::new(AdminService::new(limiter)).max_decoding_message_size(max);
    let router = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(v1)
        .add_service(admin);
    Ok(async move {
        health
            .set_serving::<RateLimiterServer<RateLimiterService>>()
            .await;
        health
            .set_service_status("", tonic_health::ServingStatus::Serving)
            .await;
        let incoming = TcpListenerStream::new(listener);
        let stopping = token.clone();
        let shutdown = async move {
            stopping.cancelled().await;
            health
                .set_service_status("", tonic_health::ServingStatus::NotServing)
                .await;
        };
        if let Err(e) = router
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
        {
            tracing::error!(error = %e, "gRPC server failed");
        }
    })
}

/// Forget idle keys every `interval`.
async fn sweep(limiter: Limiter, interval: Duration, token: CancellationToken) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tick.tick() => {
                let removed = limiter.sweep();
                if removed > 0 {
                    tracing::debug!(removed, "swept idle keys");
                }
            }
        }
    }
}

/// Reload policies when the config file changes. A broken edit is refused
/// with a message naming the key, and the previous config keeps serving.
fn watch_config(
    path: PathBuf,
    sources: Sources,
    running: Config,
    limiter: Limiter,
    token: CancellationToken,
) -> Result<impl std::future::Future<Output = ()>, StartError> {
    use notify::{RecursiveMode, Watcher};

    // Editors replace files (write a temp file, rename it over), so watch
    // the directory and filter on the file's name.
    let dir = path
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    let dir = if dir.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        dir
    };
    let name = path.file_name().map(|n| n.to_os_string());
    let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(16);
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(event) = event
            && event
                .paths
                .iter()
                .any(|p| p.file_name().map(|n| n.to_os_string()) == name)
        {
            // A full channel already holds a pending reload.
            let _ = tx.try_send(());
        }
    })?;
    watcher.watch(&dir, RecursiveMode::NonRecursive)?;
    Ok(async move {
        let _watcher = watcher; // dropped (and stopped) with this task
        loop {
            tokio::select! {
                _ = token.cancelled() => return,
                Some(()) = rx.recv() => {
                    // Let a burst of events from one save settle into one reload.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    while rx.try_recv().is_ok() {}
                    reload(&sources, &running, &limiter);
                }
            }
        }
    })
}

fn reload(sources: &Sources, running: &Config, limiter: &Limiter) {
    match sources.load() {
        Ok((config, policies)) => {
            let count = policies.len();
            limiter.set_policies(policies);
            limiter.metrics().reloaded(true);
            let mut rest = config.clone();
            rest.policies = running.policies.clone();
            if rest != *running {
                tracing::warn!("config reloaded: policies applied; other changes need a restart");
            }
            tracing::info!(policies = count, "config reloaded");
        }
        Err(e) => {
            limiter.metrics().reloaded(false);
            tracing::error!(error = %e, "config reload refused; the previous config keeps serving");
        }
    }
}
