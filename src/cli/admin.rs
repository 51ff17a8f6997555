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
        /// Refresh the list in place until Ctrl-C (a table, the screen
        /// cleared each time).
        #[arg(long)]
        watch: bool,
        /// How often `--watch` refreshes.
        #[arg(long, default_value_t = 1000, requires = "watch")]
        interval_ms: u64,
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
        AdminCommand::Top {
            by,
            count,
            watch,
            interval_ms,
        } => {
            let by_name = by;
            let by = if by_name == "refusals" {
                pb::TopBy::Refusals
            } else {
                pb::TopBy::Hits
            };
            let request = pb::TopKeysRequest {
                by: by as i32,
                count,
            };
            if !watch {
                let r = client.top_keys(request).await?.into_inner();
                for s in r.keys {
                    println!("{}", describe(&s));
                }
                return Ok(());
            }
            let every = std::time::Duration::from_millis(interval_ms.max(100));
            let stop = tokio::signal::ctrl_c();
            tokio::pin!(stop);
            loop {
                // Ctrl-C ends the watch even while a call hangs (listening
                // for it replaced the default SIGINT handling), and a call
                // gets a second at most beyond the interval.
                let call = tokio::time::timeout(
                    every + std::time::Duration::from_secs(1),
                    client.top_keys(request),
                );
                let keys = tokio::select! {
                    _ = &mut stop => break,
                    answer = call => match answer {
                        Ok(r) => r?.into_inner().keys,
                        Err(_) => return Err(format!("top_keys: no answer from {} within {:?}", args.addr, every + std::time::Duration::from_secs(1)).into()),
                    },
                };
                let title = format!(
                    "sluice admin top --by {by_name}  {}  every {} ms, Ctrl-C to stop",
                    args.addr,
                    every.as_millis()
                );
                // Clear the screen and home the cursor, then the table.
                print!("\x1b[2J\x1b[H{}", table(&title, &keys));
                use std::io::Write;
                std::io::stdout().flush()?;
                tokio::select! {
                    _ = &mut stop => break,
                    () = tokio::time::sleep(every) => {}
                }
            }
        }
    }
    Ok(())
}

/// The watch view: one row per key. Names and keys are client data: any
/// control character is shown escaped, so a key cannot drive the terminal.
fn table(title: &str, keys: &[pb::KeyState]) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .flat_map(|c| match c.is_control() {
                true => c.escape_default().collect::<Vec<_>>(),
                false => vec![c],
            })
            .collect()
    };
    let mut out = format!(
        "{title}\n\n{:<20} {:<40} {:>12} {:>10} {:>16}\n",
        "NAME", "KEY", "HITS", "REFUSALS", "REMAINING"
    );
    for s in keys {
        let key = s.key.clone().unwrap_or_default();
        out.push_str(&format!(
            "{:<20} {:<40} {:>12} {:>10} {:>16}\n",
            clean(&key.name),
            clean(&key.unique_key),
            s.hits,
            s.refusals,
            format!("{}/{}", s.remaining, s.limit)
        ));
    }
    if keys.is_empty() {
        out.push_str("(no keys yet)\n");
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watch_table_escapes_control_characters() {
        let s = pb::KeyState {
            key: Some(pb::KeyRef {
                name: "api".into(),
                unique_key: "evil\x1b[2Jkey".into(),
            }),
            hits: 7,
            refusals: 2,
            remaining: 0,
            limit: 5,
            ..Default::default()
        };
        let t = table("t", &[s]);
        assert!(!t.contains('\x1b'));
        assert!(t.contains("evil\\u{1b}[2Jkey"));
        assert!(t.contains("0/5"));
    }
}
