//! `sluice cluster status`: the members a node sees, their states and ring
//! shares (`--wait-for N`: once N are in the ring); `sluice cluster accept-best-copies`: end the regions of doubt.

use clap::{Args, Subcommand};

use super::CliResult;
use crate::proto::v1 as pb;

#[derive(Args, Debug)]
pub struct ClusterArgs {
    #[command(flatten)]
    operator: super::Operator,
    #[command(subcommand)]
    command: ClusterCommand,
}

#[derive(Subcommand, Debug)]
enum ClusterCommand {
    /// Members, lifecycle states, ring shares, epoch and N, as one node sees them.
    Status {
        /// The node's admin address (`admin.addr`; with a cluster secret,
        /// its peer or gRPC address will do too).
        #[arg(long, default_value = "127.0.0.1:8082")]
        addr: String,
        #[arg(long)]
        json: bool,
        /// Wait until the node sees this many members in its ring and its
        /// transfer for that view is complete (a node still starting, its
        /// port not bound yet, is waited for too), then print; fail after
        /// `--timeout-secs`. For scripts that start a cluster.
        #[arg(long, value_name = "MEMBERS")]
        wait_for: Option<usize>,
        #[arg(long, default_value_t = 60, requires = "wait_for")]
        timeout_secs: u64,
    },
    /// Decide every key in doubt from its best copy now, on the node asked
    /// and (`--all`) every member it sees: for when the owner and replica
    /// holder lost together are known not to come back (what they admitted
    /// past that copy is lost). Without it, that happens when
    /// `cluster.in_doubt_grace` passes.
    AcceptBestCopies {
        /// The node's admin address (as for `status`).
        #[arg(long, default_value = "127.0.0.1:8082")]
        addr: String,
        /// Every member the node asked sees, at its peer address (needs
        /// the cluster secret as the operator's credential).
        #[arg(long)]
        all: bool,
    },
}

pub async fn run(args: ClusterArgs) -> CliResult {
    let (addr, json, wait) = match args.command {
        ClusterCommand::Status {
            addr,
            json,
            wait_for,
            timeout_secs,
        } => (
            addr,
            json,
            wait_for.map(|n| (n, std::time::Duration::from_secs(timeout_secs))),
        ),
        ClusterCommand::AcceptBestCopies { addr, all } => {
            return accept_best_copies(&args.operator, &addr, all).await;
        }
    };
    let s = match wait {
        None => status(&args.operator, &addr).await?,
        Some((members, timeout)) => wait_for(&args.operator, &addr, members, timeout).await?,
    };
    if json {
        let members: Vec<_> = s
            .members
            .iter()
            .map(|m| {
                serde_json::json!({
                    "node_id": m.node_id, "generation": m.generation, "state": m.state,
                    "grpc_addr": m.grpc_addr, "gossip_addr": m.gossip_addr, "version": m.version,
                    "protocol": m.protocol, "policy_hash": m.policy_hash, "in_ring": m.in_ring,
                    "ring_share": m.ring_share, "transfer": m.transfer,
                    "transfer_received": m.transfer_received,
                })
            })
            .collect();
        let out = serde_json::json!({
            "self": s.self_node_id,
            "ring_epoch": format!("{:016x}", s.ring_epoch),
            "cluster_size": s.cluster_size,
            "view": s.view,
            "transfer_complete": s.transfer_complete,
            "doubt_regions": s.doubt_regions,
            "keys_in_doubt": s.keys_in_doubt,
            "members": members,
        });
        println!("{out}");
        return Ok(());
    }
    println!(
        "{:<20} {:<8} {:<22} {:>7} {:<8} {:<16} {:<12} {:>8}",
        "NODE", "STATE", "GRPC", "SHARE", "VERSION", "POLICY HASH", "TRANSFER", "RECEIVED"
    );
    for m in &s.members {
        let me = if m.node_id == s.self_node_id {
            " *"
        } else {
            ""
        };
        let transfer = if m.transfer.is_empty() {
            "-"
        } else {
            &m.transfer
        };
        println!(
            "{:<20} {:<8} {:<22} {:>6.1}% {:<8} {:<16} {:<12} {:>8}",
            format!("{}{me}", m.node_id),
            m.state,
            m.grpc_addr,
            m.ring_share * 100.0,
            m.version,
            m.policy_hash,
            transfer,
            m.transfer_received
        );
    }
    let ready = s.members.iter().filter(|m| m.in_ring).count();
    println!(
        "{} members, {ready} in the ring (epoch {:016x}, view {}), N = {}   (* = the node asked)",
        s.members.len(),
        s.ring_epoch,
        s.view,
        s.cluster_size
    );
    println!(
        "ownership transfer for view {}: {}",
        s.view,
        if s.transfer_complete {
            "complete (every source said done)"
        } else {
            "in progress (keys this node lacks are pulled before they are decided)"
        }
    );
    if s.doubt_regions > 0 {
        println!(
            "keys in doubt: {} region(s) open, {} key(s) decided as unreachable until a lost holder is back or cluster.in_doubt_grace passes (`sluice cluster accept-best-copies` ends them now)",
            s.doubt_regions, s.keys_in_doubt
        );
    }
    Ok(())
}

async fn status(
    operator: &super::Operator,
    addr: &str,
) -> Result<pb::ClusterStatusResponse, Box<dyn std::error::Error + Send + Sync>> {
    let mut client = operator.admin(addr).await?;
    Ok(client
        .cluster_status(pb::ClusterStatusRequest {})
        .await?
        .into_inner())
}

/// Whether `s` shows `members` in the ring and the transfer for its view
/// complete: the cluster formed, as this node sees it.
fn formed(s: &pb::ClusterStatusResponse, members: usize) -> bool {
    s.members.iter().filter(|m| m.in_ring).count() >= members && s.transfer_complete
}

/// Ask every 200 ms until the node's status is [`formed`], or fail at
/// `timeout` with what it last said.
async fn wait_for(
    operator: &super::Operator,
    addr: &str,
    members: usize,
    timeout: std::time::Duration,
) -> Result<pb::ClusterStatusResponse, Box<dyn std::error::Error + Send + Sync>> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let last = match status(operator, addr).await {
            Ok(s) if formed(&s, members) => return Ok(s),
            Ok(s) => format!(
                "{} of {} members in the ring, transfer {}",
                s.members.iter().filter(|m| m.in_ring).count(),
                s.members.len(),
                if s.transfer_complete {
                    "complete"
                } else {
                    "in progress"
                }
            ),
            Err(e) => format!("not reached: {e}"),
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "{addr}: not {members} members in the ring after {timeout:?} (last: {last})"
            )
            .into());
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

async fn accept_best_copies(operator: &super::Operator, addr: &str, all: bool) -> CliResult {
    let mut targets = vec![(String::from("(asked)"), addr.to_string())];
    if all {
        let status = operator
            .admin(addr)
            .await?
            .cluster_status(pb::ClusterStatusRequest {})
            .await?
            .into_inner();
        targets = status
            .members
            .iter()
            .map(|m| {
                let at = if m.node_id == status.self_node_id {
                    addr.to_string()
                } else {
                    m.grpc_addr.clone()
                };
                (m.node_id.clone(), at)
            })
            .collect();
    }
    let mut failed = 0;
    for (node, at) in &targets {
        let answer = match operator.admin(at).await {
            Ok(mut c) => c
                .accept_best_copies(pb::AcceptBestCopiesRequest {})
                .await
                .map(|r| r.into_inner())
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match answer {
            Ok(r) => println!(
                "{node} {at}: {} region(s) ended, {} key(s) now decided from their best copy",
                r.regions, r.keys
            ),
            Err(e) => {
                failed += 1;
                println!("{node} {at}: not reached: {e}");
            }
        }
    }
    if failed > 0 {
        return Err(format!("{failed} of {} node(s) not reached", targets.len()).into());
    }
    Ok(())
}
