//! `sluice serve`: run a node until SIGTERM or SIGINT.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::signal::unix::{Signal, SignalKind, signal};

use clap::Args;
use tracing_subscriber::EnvFilter;

use super::CliResult;
use crate::clock::SystemClock;
use crate::config::{LogFormat, Sources};
use crate::server::Node;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// A TOML config file; reloaded (policies) when it changes.
    #[arg(long, env = "SLUICE_CONFIG")]
    config: Option<PathBuf>,
    /// gRPC listen address [default: 0.0.0.0:8081].
    #[arg(long)]
    grpc_addr: Option<SocketAddr>,
    /// Also serve the decision APIs on this Unix socket (same-host apps).
    #[arg(long)]
    grpc_uds: Option<PathBuf>,
    /// HTTP admin listen address (/metrics, /healthz, /readyz) [default: 0.0.0.0:8080].
    #[arg(long)]
    http_addr: Option<SocketAddr>,
    /// Admin gRPC listen address (the admin API, with its token) [default: 127.0.0.1:8082].
    #[arg(long)]
    admin_addr: Option<SocketAddr>,
    /// A stable node name [default: $HOSTNAME].
    #[arg(long)]
    node_id: Option<String>,
    /// Log format: text or json. Levels come from RUST_LOG (default info).
    #[arg(long, value_parser = ["text", "json"])]
    log_format: Option<String>,
    /// Keys kept in memory before eviction [default: 1000000].
    #[arg(long)]
    max_keys: Option<usize>,
}

impl ServeArgs {
    fn sources(&self) -> Sources {
        let mut flags = BTreeMap::new();
        let mut set = |k: &str, v: toml::Value| {
            flags.insert(k.to_string(), v);
        };
        if let Some(a) = self.grpc_addr {
            set("grpc_addr", toml::Value::String(a.to_string()));
        }
        if let Some(p) = &self.grpc_uds {
            set(
                "grpc_uds",
                toml::Value::String(p.to_string_lossy().into_owned()),
            );
        }
        if let Some(a) = self.http_addr {
            set("http_addr", toml::Value::String(a.to_string()));
        }
        if let Some(a) = self.admin_addr {
            let mut admin = toml::Table::new();
            admin.insert("addr".into(), toml::Value::String(a.to_string()));
            set("admin", toml::Value::Table(admin));
        }
        if let Some(id) = &self.node_id {
            set("node_id", toml::Value::String(id.clone()));
        }
        if let Some(f) = &self.log_format {
            set("log_format", toml::Value::String(f.clone()));
        }
        if let Some(n) = self.max_keys {
            let mut limits = toml::Table::new();
            limits.insert(
                "max_keys".into(),
                toml::Value::Integer(n.min(i64::MAX as usize) as i64),
            );
            set("limits", toml::Value::Table(limits));
        }
        Sources {
            file: self.config.clone(),
            flags,
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

pub async fn run(args: ServeArgs) -> CliResult {
    let sources = args.sources();
    let (config, policies) = crate::policy::load(&sources)?;
    init_logging(config.log_format);
    let offset = config.test_clock_offset_ms;
    if offset != 0 {
        tracing::warn!(
            offset_ms = offset,
            "test_clock_offset_ms: this node's clock runs off on purpose"
        );
    }
    let clock = SystemClock::with_offset(offset.saturating_mul(1_000_000));
    // Listen for SIGTERM before starting: a node is in its peers' rings
    // (and Kubernetes may stop it) before `start` returns — it waits to
    // join and to adopt its view — and a SIGTERM then must still mean
    // "leave gracefully", not the default action (killed, nothing handed
    // off). One that arrives while it still joins cuts the start short:
    // it leaves without ever turning ready.
    let signal = ShutdownSignal::listen();
    let stop = tokio_util::sync::CancellationToken::new();
    let stopping = stop.clone();
    tokio::spawn(async move {
        signal.wait().await;
        stopping.cancel();
    });
    let node = Node::start_until(
        config,
        policies,
        Some(sources),
        Arc::new(clock),
        stop.clone(),
    )
    .await?;
    stop.cancelled().await;
    tracing::info!("leaving the cluster");
    node.leave().await;
    tracing::info!("stopped");
    Ok(())
}

/// SIGTERM (what Kubernetes and systemd send) or SIGINT (Ctrl-C).
struct ShutdownSignal {
    term: Option<Signal>,
    int: Option<Signal>,
}

impl ShutdownSignal {
    /// Install both handlers now; a signal from here on is not lost.
    fn listen() -> ShutdownSignal {
        let listen = |kind: SignalKind, name: &str| match signal(kind) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for {name}; it stops the node at once");
                None
            }
        };
        ShutdownSignal {
            term: listen(SignalKind::terminate(), "SIGTERM"),
            int: listen(SignalKind::interrupt(), "SIGINT"),
        }
    }

    async fn wait(mut self) {
        async fn recv(s: &mut Option<Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            _ = recv(&mut self.term) => {}
            _ = recv(&mut self.int) => {}
        }
    }
}
