//! The `sluice` command line: `serve`, `check`, `admin`, `cluster`, `bench`,
//! `config`.

mod admin;
mod bench;
mod check;
mod cluster;
mod config;
mod serve;

/// The token-bucket Lua script `sluice bench --target redis` runs: the
/// design Sluice replaces, for `benches/app.rs` to run through redis-rs.
pub use bench::redis::SCRIPT as REDIS_TOKEN_BUCKET_SCRIPT;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "sluice",
    version,
    about = "A clustered, in-memory rate limiter"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a node (a single node with no config).
    Serve(serve::ServeArgs),
    /// Send checks for one key and print each decision.
    Check(check::CheckArgs),
    /// Operator commands: reset, inspect, top keys.
    Admin(admin::AdminArgs),
    /// Cluster commands: status.
    Cluster(cluster::ClusterArgs),
    /// Load generator: closed or open loop, percentiles, JSON summary.
    Bench(bench::BenchArgs),
    /// The configuration reference: every setting, its default and variable.
    Config(config::ConfigArgs),
}

/// Parse the command line and run it; the process exit code.
pub fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sluice: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Serve(args) => serve::run(args).await,
            Command::Check(args) => check::run(args).await,
            Command::Admin(args) => admin::run(args).await,
            Command::Cluster(args) => cluster::run(args).await,
            Command::Bench(args) => bench::run(args).await,
            Command::Config(args) => config::run(args).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// A CLI failure: printed as one line.
pub type CliResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Connect to a node's gRPC address (`host:port` or a URL).
async fn connect(
    addr: &str,
) -> Result<tonic::transport::Channel, Box<dyn std::error::Error + Send + Sync>> {
    connect_with(addr, None).await
}

/// Credentials for the admin API: the cluster secret (each call carries a
/// fresh token), and for a node with peer mTLS, a certificate from the
/// cluster CA (the admin API is then on `cluster.peer_addr`).
#[derive(clap::Args, Debug, Clone)]
pub struct Operator {
    /// The cluster secret.
    #[arg(
        long,
        env = "SLUICE_CLUSTER__SECRET",
        hide_env_values = true,
        global = true
    )]
    secret: Option<String>,
    /// A file holding the cluster secret.
    #[arg(long, env = "SLUICE_CLUSTER__SECRET_FILE", global = true)]
    secret_file: Option<std::path::PathBuf>,
    /// The cluster CA (PEM), to reach a peer listener over mutual TLS.
    /// (`--tls-*`: `--key` is the limited key of `check` and `admin`.)
    #[arg(long = "tls-ca", requires_all = ["cert", "key"], global = true)]
    ca: Option<std::path::PathBuf>,
    /// A certificate signed by the cluster CA (PEM).
    #[arg(long = "tls-cert", global = true)]
    cert: Option<std::path::PathBuf>,
    /// Its private key (PEM).
    #[arg(long = "tls-key", global = true)]
    key: Option<std::path::PathBuf>,
    /// The name the nodes' certificates carry.
    #[arg(long, default_value = "sluice-peer", global = true)]
    server_name: String,
    /// The admin token (default: read from --token-file).
    #[arg(
        long,
        env = "SLUICE_ADMIN__TOKEN",
        hide_env_values = true,
        global = true
    )]
    token: Option<String>,
    /// The file the node wrote its admin token to (`admin.token_file`;
    /// default `sluice-admin.token`, used when it exists).
    #[arg(long, env = "SLUICE_ADMIN__TOKEN_FILE", global = true)]
    token_file: Option<std::path::PathBuf>,
}

/// Adds the operator's credentials to each admin call: the admin token,
/// and a fresh peer token when the cluster secret is known.
#[derive(Clone)]
struct Signer {
    secret: crate::cluster::auth::Secret,
    bearer: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
}

impl tonic::service::Interceptor for Signer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(bearer) = &self.bearer {
            request
                .metadata_mut()
                .insert("authorization", bearer.clone());
        }
        if let Some(token) = self.secret.peer_token("sluice-cli")
            && let Ok(value) = token.parse()
        {
            request
                .metadata_mut()
                .insert(crate::cluster::auth::TOKEN_HEADER, value);
        }
        Ok(request)
    }
}

type AdminClient = crate::proto::v1::admin_client::AdminClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Signer>,
>;

impl Operator {
    async fn admin(
        &self,
        addr: &str,
    ) -> Result<AdminClient, Box<dyn std::error::Error + Send + Sync>> {
        let secret = match (&self.secret, &self.secret_file) {
            (_, Some(path)) => Some(
                std::fs::read(path)
                    .map_err(|e| format!("--secret-file {}: {e}", path.display()))?
                    .trim_ascii()
                    .to_vec(),
            ),
            (Some(s), None) => Some(s.as_bytes().to_vec()),
            (None, None) => None,
        };
        let tls = match (&self.ca, &self.cert, &self.key) {
            (Some(ca), Some(cert), Some(key)) => Some(
                crate::tls::peer_client(&crate::tls::PeerTls {
                    ca_file: ca.clone(),
                    cert_file: cert.clone(),
                    key_file: key.clone(),
                    server_name: self.server_name.clone(),
                })
                .map_err(|e| {
                    e.to_string()
                        .replace("cluster.tls.", "--")
                        .replace("_file", "")
                })?,
            ),
            _ => None,
        };
        let token = match (&self.token, &self.token_file) {
            (Some(t), _) => Some(t.trim().to_string()),
            (None, Some(path)) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| format!("--token-file {}: {e}", path.display()))?
                    .trim()
                    .to_string(),
            ),
            // The node's default file, when this runs beside it.
            (None, None) => std::fs::read_to_string(crate::config::DEFAULT_ADMIN_TOKEN_FILE)
                .ok()
                .map(|t| t.trim().to_string()),
        };
        let bearer = match token {
            Some(t) => Some(
                format!("Bearer {t}")
                    .parse()
                    .map_err(|_| "--token: not a valid header value")?,
            ),
            None => None,
        };
        let channel = connect_with(addr, tls).await?;
        let signer = Signer {
            secret: crate::cluster::auth::Secret::new(secret.as_deref()),
            bearer,
        };
        Ok(crate::proto::v1::admin_client::AdminClient::with_interceptor(channel, signer))
    }
}

async fn connect_with(
    addr: &str,
    tls: Option<tonic::transport::ClientTlsConfig>,
) -> Result<tonic::transport::Channel, Box<dyn std::error::Error + Send + Sync>> {
    let url = if addr.contains("://") || addr.starts_with("unix:") {
        addr.to_string()
    } else if tls.is_some() {
        format!("https://{addr}")
    } else {
        format!("http://{addr}")
    };
    let mut endpoint = tonic::transport::Endpoint::from_shared(url.clone())
        .map_err(|e| format!("--addr {addr}: {e}"))?
        .connect_timeout(std::time::Duration::from_secs(3));
    if let Some(tls) = tls {
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| format!("--tls-ca/--tls-cert/--tls-key: {e}"))?;
    }
    Ok(endpoint
        .connect()
        .await
        .map_err(|e| format!("cannot connect to {url}: {e}"))?)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    /// clap checks a command's definition (no two arguments with one long
    /// name) only in debug builds, and the tests run optimized: the global
    /// TLS key once took `--key`, which `admin inspect` uses for the
    /// limited key. Both must parse to what they name.
    #[test]
    fn admin_key_and_tls_key_are_different_flags() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
        let cli = super::Cli::try_parse_from([
            "sluice",
            "admin",
            "inspect",
            "--name",
            "api",
            "--key",
            "alice",
            "--tls-ca",
            "ca.pem",
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "k.pem",
        ])
        .unwrap();
        let text = format!("{cli:?}");
        assert!(text.contains(r#"unique_key: "alice""#), "{text}");
        assert!(text.contains(r#"key: Some("k.pem")"#), "{text}");
    }
}
