//! `sluice check`: send N checks for one key and print each decision.

use clap::Args;

use super::{CliResult, connect};
use crate::proto::v1 as pb;
use crate::proto::v1::rate_limiter_client::RateLimiterClient;

#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The node's gRPC address.
    #[arg(long, default_value = "127.0.0.1:8081")]
    addr: String,
    /// What is limited, e.g. requests_per_key.
    #[arg(long)]
    name: String,
    /// Who is limited, e.g. an API key.
    #[arg(long = "key")]
    unique_key: String,
    /// Requests per period (inline limit).
    #[arg(long)]
    limit: Option<i64>,
    /// The period in milliseconds.
    #[arg(long)]
    duration_ms: Option<i64>,
    /// A calendar window instead: minute, hour, day, week, month, year.
    #[arg(long)]
    window: Option<String>,
    /// token_bucket, gcra, leaky_bucket, fixed_window,
    /// sliding_window_counter or sliding_window_log.
    #[arg(long)]
    algorithm: Option<String>,
    #[arg(long)]
    burst: Option<i64>,
    /// A named policy from the node's config instead of an inline limit.
    #[arg(long)]
    policy: Option<String>,
    /// Cost of each check (0 peeks).
    #[arg(long)]
    hits: Option<i64>,
    /// How many checks to send, one after another.
    #[arg(short = 'n', long, default_value_t = 1)]
    count: u64,
    #[arg(long)]
    drain_over_limit: bool,
    #[arg(long)]
    nodelay: bool,
    /// One JSON object per decision.
    #[arg(long)]
    json: bool,
}

impl CheckArgs {
    fn request(&self) -> Result<pb::RateLimitRequest, String> {
        let algorithm = match &self.algorithm {
            None => pb::Algorithm::Unspecified,
            Some(a) => pb::Algorithm::from_str_name(&format!("ALGORITHM_{}", a.to_uppercase()))
                .ok_or_else(|| format!("--algorithm: unknown algorithm {a:?}"))?,
        };
        let window = match &self.window {
            None => pb::CalendarWindow::Unspecified,
            Some(w) => {
                pb::CalendarWindow::from_str_name(&format!("CALENDAR_WINDOW_{}", w.to_uppercase()))
                    .ok_or_else(|| format!("--window: unknown window {w:?}"))?
            }
        };
        Ok(pb::RateLimitRequest {
            name: self.name.clone(),
            unique_key: self.unique_key.clone(),
            hits: self.hits,
            limit: self.limit.unwrap_or(0),
            duration_ms: self.duration_ms,
            window: window as i32,
            burst: self.burst,
            algorithm: algorithm as i32,
            drain_over_limit: self.drain_over_limit,
            nodelay: self.nodelay,
            policy: self.policy.clone(),
            ..Default::default()
        })
    }
}

pub async fn run(args: CheckArgs) -> CliResult {
    let request = args.request()?;
    let mut client = RateLimiterClient::new(connect(&args.addr).await?);
    for n in 1..=args.count {
        let reply = client
            .check(pb::CheckRequest {
                requests: vec![request.clone()],
            })
            .await?
            .into_inner();
        let r = reply
            .responses
            .into_iter()
            .next()
            .ok_or("the node sent no answer")?;
        println!("{}", if args.json { json(n, &r) } else { human(n, &r) });
    }
    Ok(())
}

/// Status and reason names without their enum prefixes, e.g. UNDER_LIMIT.
fn names(r: &pb::RateLimitResponse) -> (String, String) {
    let status = match pb::Status::try_from(r.status) {
        Ok(pb::Status::Unspecified) => "ERROR".to_string(),
        Ok(s) => s.as_str_name().trim_start_matches("STATUS_").to_string(),
        Err(e) => e.0.to_string(),
    };
    let reason = match pb::Reason::try_from(r.reason) {
        Ok(x) => x.as_str_name().trim_start_matches("REASON_").to_string(),
        Err(e) => e.0.to_string(),
    };
    (status, reason)
}

fn human(n: u64, r: &pb::RateLimitResponse) -> String {
    if let Some(e) = &r.error {
        return format!("#{n:<3} ERROR  {}", e.message);
    }
    let (status, reason) = names(r);
    let mut line = format!(
        "#{n:<3} {status:<11} {reason:<21} remaining {}/{}",
        r.remaining, r.limit
    );
    if r.retry_after_ms > 0 {
        line += &format!("  retry after {} ms", r.retry_after_ms);
    }
    if r.delay_ms > 0 {
        line += &format!("  delay {} ms", r.delay_ms);
    }
    if r.approximate {
        line += "  (approximate)";
    }
    line
}

fn json(n: u64, r: &pb::RateLimitResponse) -> String {
    let value = match &r.error {
        Some(e) => serde_json::json!({
            "n": n,
            "error": {"code": e.code, "field": e.field, "message": e.message},
        }),
        None => {
            let (status, reason) = names(r);
            serde_json::json!({
                "n": n,
                "status": status,
                "reason": reason,
                "limit": r.limit,
                "remaining": r.remaining,
                "reset_at_ms": r.reset_at_ms,
                "retry_after_ms": r.retry_after_ms,
                "delay_ms": r.delay_ms,
                "approximate": r.approximate,
                "owner": r.owner,
            })
        }
    };
    value.to_string()
}
