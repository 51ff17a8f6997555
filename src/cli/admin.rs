//! `sluice admin`: reset a key, inspect a key, list the top keys.

use clap::{Args, Subcommand};

use super::CliResult;
use crate::proto::v1 as pb;

#[derive(Args, Debug)]
pub struct AdminArgs {
    /// The node's admin address (`admin.addr`; with a cluster secret, its
    /// peer or gRPC address will do too).
    #[arg(long, default_value = "127.0.0.1:8082", global = true)]
    addr: String,
    #[command(flatten)]
    operator: super::Operator,
    #[command(subcommand)]
    command: AdminCommand,
}

#[derive(Subcommand, Debug)]
enum AdminCommand {
    /// Forget a key's consumption.
    Reset(KeyArgs),
    /// Show a key's limit and state.
    Inspect(KeyArgs),
    /// The keys with the most hits or refusals.
    Top {
        /// hits or refusals
        #[arg(long, default_value = "hits", value_parser = ["hits", "refusals"])]
        by: String,
        #[arg(long, default_value_t = 10)]
        count: u32,
    },
}

#[derive(Args, Debug)]
struct KeyArgs {
    #[arg(long)]
    name: String,
    #[arg(long = "key")]
    unique_key: String,
}

impl KeyArgs {
    fn key(&self) -> Option<pb::KeyRef> {
        Some(pb::KeyRef {
            name: self.name.clone(),
            unique_key: self.unique_key.clone(),
        })
    }
}

pub async fn run(args: AdminArgs) -> CliResult {
    let mut client = args.operator.admin(&args.addr).await?;
    match args.command {
        AdminCommand::Reset(k) => {
            let r = client
                .reset_key(pb::ResetKeyRequest { key: k.key() })
                .await?
                .into_inner();
            println!(
                "{}",
                if r.existed {
                    "reset"
                } else {
                    "not in memory: nothing to reset"
                }
            );
        }
        AdminCommand::Inspect(k) => {
            let r = client
                .inspect_key(pb::InspectKeyRequest { key: k.key() })
                .await?
                .into_inner();
            match r.state {
                Some(s) if r.found => println!("{}", describe(&s)),
                _ => println!("not in memory (a fresh key)"),
            }
        }
        AdminCommand::Top { by, count } => {
            let by = if by == "refusals" {
                pb::TopBy::Refusals
            } else {
                pb::TopBy::Hits
            };
            let r = client
                .top_keys(pb::TopKeysRequest {
                    by: by as i32,
                    count,
                })
                .await?
                .into_inner();
            for s in r.keys {
                println!("{}", describe(&s));
            }
        }
    }
    Ok(())
}

fn describe(s: &pb::KeyState) -> String {
    let key = s.key.clone().unwrap_or_default();
    let algorithm = pb::Algorithm::try_from(s.algorithm)
        .map(|a| {
            a.as_str_name()
                .trim_start_matches("ALGORITHM_")
                .to_lowercase()
        })
        .unwrap_or_else(|_| s.algorithm.to_string());
    let period = match pb::CalendarWindow::try_from(s.window) {
        Ok(pb::CalendarWindow::Unspecified) | Err(_) => format!("{} ms", s.duration_ms),
        Ok(w) => w
            .as_str_name()
            .trim_start_matches("CALENDAR_WINDOW_")
            .to_lowercase(),
    };
    format!(
        "{}/{}  {algorithm} {} per {period} (burst {})  remaining {}  hits {}  refusals {}  reset_gen {}",
        key.name, key.unique_key, s.limit, s.burst, s.remaining, s.hits, s.refusals, s.reset_gen
    )
}
