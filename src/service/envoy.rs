//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`: Envoy,
//! Istio, Envoy Gateway and Contour use Sluice with no code. Converts Envoy's
//! descriptors, asks the limiter to decide them together, converts back.
//!
//! Mapping choices:
//! - `overall_code` is `OVER_LIMIT` if any descriptor is; every descriptor
//!   gets a status, `OK` with no `current_limit` when no rule matches, and
//!   `limit_remaining = u32::MAX` for an `unlimited` rule.
//! - An answer with status `UNAVAILABLE` (owner unreachable, policy `deny`)
//!   makes the whole call a gRPC `UNAVAILABLE` error, so Envoy's
//!   `failure_mode_deny` decides what the request gets.
//! - Envoy has no field for a leaky bucket's delay: it travels as the request
//!   header `x-sluice-delay-ms` (in `request_headers_to_add`, for the
//!   upstream to honour), the largest delay of the request's descriptors.
//! - With `envoy.response_headers` on, the quota headers of the most
//!   restrictive descriptor (refused first, else least remaining) go in
//!   `response_headers_to_add`.

use std::time::Duration;

use tonic::{Request, Response, Status as GrpcStatus};

use super::headers::{self, Families, Quota};
use crate::limiter::{Descriptor, DescriptorOutcome, Limiter, Status};
use crate::policy::rules::Unit;
use crate::proto::envoy::config::core::v3::HeaderValue;
use crate::proto::envoy::service::ratelimit::v3 as rls;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit, rate_limit,
};
use crate::proto::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use crate::proto::envoy::r#type::v3::RateLimitUnit;

pub struct RlsService {
    limiter: Limiter,
    max_key_bytes: usize,
    /// Families of `response_headers_to_add`; None: no headers.
    headers: Option<Families>,
}

impl RlsService {
    pub fn new(limiter: Limiter, max_key_bytes: usize, headers: Option<Families>) -> RlsService {
        RlsService {
            limiter,
            max_key_bytes,
            headers,
        }
    }
}

fn unit_from_wire(u: i32) -> Result<Unit, GrpcStatus> {
    Ok(match RateLimitUnit::try_from(u) {
        Ok(RateLimitUnit::Second) => Unit::Second,
        Ok(RateLimitUnit::Minute) => Unit::Minute,
        Ok(RateLimitUnit::Hour) => Unit::Hour,
        Ok(RateLimitUnit::Day) => Unit::Day,
        Ok(RateLimitUnit::Week) => Unit::Week,
        Ok(RateLimitUnit::Month) => Unit::Month,
        Ok(RateLimitUnit::Year) => Unit::Year,
        _ => {
            return Err(GrpcStatus::invalid_argument(format!(
                "descriptors.limit.unit: unknown unit {u}"
            )));
        }
    })
}

fn unit_to_wire(u: Unit) -> rate_limit::Unit {
    match u {
        Unit::Second => rate_limit::Unit::Second,
        Unit::Minute => rate_limit::Unit::Minute,
        Unit::Hour => rate_limit::Unit::Hour,
        Unit::Day => rate_limit::Unit::Day,
        Unit::Week => rate_limit::Unit::Week,
        Unit::Month => rate_limit::Unit::Month,
        Unit::Year => rate_limit::Unit::Year,
    }
}

fn duration(ns: u64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: (ns / 1_000_000_000) as i64,
        nanos: (ns % 1_000_000_000) as i32,
    }
}

#[tonic::async_trait]
impl RateLimitService for RlsService {
    async fn should_rate_limit(
        &self,
        request: Request<rls::RateLimitRequest>,
    ) -> Result<Response<rls::RateLimitResponse>, GrpcStatus> {
        let r = request.into_inner();
        let mut descriptors = Vec::with_capacity(r.descriptors.len());
        for d in &r.descriptors {
            descriptors.push(Descriptor {
                entries: d
                    .entries
                    .iter()
                    .map(|e| (e.key.clone(), e.value.clone()))
                    .collect(),
                limit_override: match &d.limit {
                    Some(l) => Some((l.requests_per_unit, unit_from_wire(l.unit)?)),
                    None => None,
                },
                hits: d.hits_addend,
            });
        }
        let outcomes = self
            .limiter
            .check_descriptors(
                &r.domain,
                &descriptors,
                u64::from(r.hits_addend),
                self.max_key_bytes,
            )
            .await
            .map_err(|e| GrpcStatus::invalid_argument(e.to_string()))?;
        let now = self.limiter.now();
        let mut response = rls::RateLimitResponse {
            overall_code: Code::Ok as i32,
            ..Default::default()
        };
        let mut strictest: Option<&crate::limiter::Verdict> = None;
        let mut delay = 0;
        for outcome in &outcomes {
            let status = match outcome {
                DescriptorOutcome::NoRule => DescriptorStatus {
                    code: Code::Ok as i32,
                    ..Default::default()
                },
                DescriptorOutcome::Unlimited(_) => DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..Default::default()
                },
                DescriptorOutcome::Decided { rule, verdict } => {
                    if verdict.status == Status::Unavailable {
                        return Err(GrpcStatus::unavailable(format!(
                            "{}: no decision ({:?}); failure_mode_deny decides",
                            rule.label, verdict.reason
                        )));
                    }
                    let over = verdict.status == Status::OverLimit;
                    if over {
                        response.overall_code = Code::OverLimit as i32;
                    }
                    let stricter = match strictest {
                        None => true,
                        Some(s) => {
                            (over && s.status != Status::OverLimit)
                                || (over == (s.status == Status::OverLimit)
                                    && verdict.decision.remaining < s.decision.remaining)
                        }
                    };
                    if stricter {
                        strictest = Some(verdict);
                    }
                    delay = delay.max(verdict.decision.delay);
                    DescriptorStatus {
                        code: if over { Code::OverLimit } else { Code::Ok } as i32,
                        current_limit: Some(RateLimit {
                            name: rule.name.clone().unwrap_or_default(),
                            requests_per_unit: rule.requests_per_unit,
                            unit: unit_to_wire(rule.unit) as i32,
                        }),
                        limit_remaining: u32::try_from(verdict.decision.remaining)
                            .unwrap_or(u32::MAX),
                        duration_until_reset: Some(duration(
                            verdict.decision.reset_at.saturating_sub(now),
                        )),
                        quota: None,
                    }
                }
            };
            response.statuses.push(status);
        }
        if let (Some(families), Some(v)) = (self.headers, strictest) {
            let quota = Quota {
                policy: &v.label,
                limit: v.decision.limit,
                remaining: v.decision.remaining,
                reset_in: Duration::from_nanos(v.decision.reset_at.saturating_sub(now)),
                window: Duration::from_nanos(v.window),
                retry_after: v
                    .decision
                    .retry_after
                    .filter(|_| v.status == Status::OverLimit)
                    .map(Duration::from_nanos),
            };
            response.response_headers_to_add = headers::headers(&quota, families)
                .into_iter()
                .map(|(key, value)| HeaderValue {
                    key: key.to_string(),
                    value,
                    raw_value: Vec::new(),
                })
                .collect();
        }
        if delay > 0 {
            response.request_headers_to_add.push(HeaderValue {
                key: "x-sluice-delay-ms".into(),
                value: delay.div_ceil(1_000_000).to_string(),
                raw_value: Vec::new(),
            });
        }
        Ok(Response::new(response))
    }
}
