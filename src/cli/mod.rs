//! The `sluice` command line: `serve`, `check`, `admin`.

mod admin;
mod bench;
mod check;
mod cluster;
mod serve;

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
    let url = if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    };
    let endpoint = tonic::transport::Endpoint::from_shared(url.clone())
        .map_err(|e| format!("--addr {addr}: {e}"))?
        .connect_timeout(std::time::Duration::from_secs(3));
    Ok(endpoint
        .connect()
        .await
        .map_err(|e| format!("cannot connect to {url}: {e}"))?)
}
