//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`: Envoy,
//! Istio, Envoy Gateway and Contour use Sluice with no code. Converts Envoy's
//! descriptors, asks the limiter to decide them together, converts back.
//!
//! Mapping choices (envoyproxy/ratelimit's where it has one):
//! - `overall_code` is `OVER_LIMIT` if any descriptor is, except that
//!   descriptors of `quota_mode` rules refuse only all together: one over
//!   its quota while another quota descriptor passes leaves the request OK
//!   (its own status still says `OVER_LIMIT`).
//! - Every descriptor gets a status: `OK` with no `current_limit` when no
//!   rule matches, `limit_remaining = u32::MAX` for an `unlimited` rule, and
//!   `limit_remaining = 0` whenever the limit was exceeded (shadow mode
//!   included), as upstream.
//! - An answer with status `UNAVAILABLE` (owner unreachable, policy `deny`)
//!   makes the whole call a gRPC `UNAVAILABLE` error, so Envoy's
//!   `failure_mode_deny` decides what the request gets. So does a node
//!   saturated with checks in progress (`limits.max_in_flight_checks`, one
//!   budget with the other front ends): the call is refused at once,
//!   `UNAVAILABLE` naming the bound, rather than queued.
//! - More descriptors than `limits.max_batch` is `RESOURCE_EXHAUSTED`
//!   naming `descriptors`, as too many `requests` is on the v1 API
//!   (DESIGN §6: the node's own inbound bounds); nothing is decided.
//! - Envoy has no field for a leaky bucket's delay: it travels as the request
//!   header `x-sluice-delay-ms` (in `request_headers_to_add`, for the
//!   upstream to honour), the largest delay of the request's descriptors.
//! - With `envoy.response_headers` on, the quota headers of the most
//!   restrictive descriptor (refused first, else least remaining) go in
//!   `response_headers_to_add`.
//! - With `envoy.response_dynamic_metadata` on, `dynamic_metadata` carries
//!   upstream's shape: the domain, the descriptors, `hitsAddend`, and the
//!   rules' `metadata` of the descriptors that passed, merged.

use std::time::Duration;

use prost_types::value::Kind;
use prost_types::{ListValue, Struct, Value};

use tonic::{Request, Response, Status as GrpcStatus};

use super::admission::Admission;
use super::headers::{self, Families, Quota};
use crate::limiter::{Descriptor, DescriptorOutcome, Limiter, Reason, Status};
use crate::policy::rules::Unit;
use crate::policy::rules::{Metadata, RuleLimit};
use crate::proto::envoy::config::core::v3::HeaderValue;
use crate::proto::envoy::service::ratelimit::v3 as rls;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit, rate_limit,
};
use crate::proto::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use crate::proto::envoy::r#type::v3::RateLimitUnit;

pub struct RlsService {
    limiter: Limiter,
    /// The node's admission bounds, shared with the other front ends.
    admission: Admission,
    max_key_bytes: usize,
    /// Families of `response_headers_to_add`; None: no headers.
    headers: Option<Families>,
    /// Fill `dynamic_metadata` (upstream's RESPONSE_DYNAMIC_METADATA).
    dynamic_metadata: bool,
}

impl RlsService {
    pub fn new(
        limiter: Limiter,
        admission: Admission,
        max_key_bytes: usize,
        headers: Option<Families>,
    ) -> RlsService {
        RlsService {
            limiter,
            admission,
            max_key_bytes,
            headers,
            dynamic_metadata: false,
        }
    }

    /// Fill `dynamic_metadata` in answers (`envoy.response_dynamic_metadata`).
    pub fn with_dynamic_metadata(mut self, on: bool) -> RlsService {
        self.dynamic_metadata = on;
        self
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
        // Envoy's filter timeout arrives as the call's deadline.
        let budget = super::deadline::grpc_timeout(request.metadata());
        let r = request.into_inner();
        self.admission
            .batch("descriptors", r.descriptors.len())
            .map_err(|e| GrpcStatus::resource_exhausted(e.to_string()))?;
        let _admitted = self
            .admission
            .admit()
            .map_err(|e| GrpcStatus::unavailable(format!("{e}; failure_mode_deny decides")))?;
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
                budget,
            )
            .await
            .map_err(|e| GrpcStatus::invalid_argument(e.to_string()))?;
        let now = self.limiter.now();
        let mut response = rls::RateLimitResponse::default();
        let mut strictest: Option<(&crate::limiter::Verdict, bool)> = None;
        let mut delay = 0;
        // Upstream's count: any refusing descriptor refuses the request;
        // quota descriptors only when every one of them is over.
        let (mut refused, mut quotas, mut quotas_over) = (0, 0, 0);
        let mut passed = Vec::new();
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
                    let exceeded = over || verdict.reason == Reason::Shadow;
                    quotas += usize::from(rule.quota_mode);
                    match (over, rule.quota_mode) {
                        (true, true) => quotas_over += 1,
                        (true, false) => refused += 1,
                        (false, _) => passed.push(rule),
                    }
                    // A quota descriptor over its quota does not refuse by
                    // itself: for the headers it ranks as a pass with
                    // nothing left.
                    let refusing = over && !rule.quota_mode;
                    let stricter = match strictest {
                        None => true,
                        Some((s, s_refusing)) => {
                            (refusing && !s_refusing)
                                || (refusing == s_refusing
                                    && verdict.decision.remaining < s.decision.remaining)
                        }
                    };
                    if stricter {
                        strictest = Some((verdict, refusing));
                    }
                    delay = delay.max(verdict.decision.delay);
                    DescriptorStatus {
                        code: if over { Code::OverLimit } else { Code::Ok } as i32,
                        current_limit: Some(RateLimit {
                            name: rule.name.clone().unwrap_or_default(),
                            requests_per_unit: rule.requests_per_unit,
                            unit: unit_to_wire(rule.unit) as i32,
                        }),
                        limit_remaining: if exceeded {
                            0
                        } else {
                            u32::try_from(verdict.decision.remaining).unwrap_or(u32::MAX)
                        },
                        duration_until_reset: Some(duration(
                            verdict.decision.reset_at.saturating_sub(now),
                        )),
                        quota: None,
                    }
                }
            };
            response.statuses.push(status);
        }
        response.overall_code = if refused > 0 || (quotas > 0 && quotas == quotas_over) {
            Code::OverLimit
        } else {
            Code::Ok
        } as i32;
        if self.dynamic_metadata {
            response.dynamic_metadata = Some(dynamic_metadata(&r, &passed));
        }
        if let (Some(families), Some((v, refusing))) = (self.headers, strictest) {
            let quota = Quota {
                // Envoy's limits are rules: each has its label.
                policy: v.label.as_deref().unwrap_or_default(),
                limit: v.decision.limit,
                remaining: if v.status == Status::OverLimit || v.reason == Reason::Shadow {
                    0
                } else {
                    v.decision.remaining
                },
                reset_in: Duration::from_nanos(v.decision.reset_at.saturating_sub(now)),
                window: Duration::from_nanos(v.window),
                retry_after: v
                    .decision
                    .retry_after
                    .filter(|_| refusing)
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

/// Upstream's `dynamic_metadata`: `domain`; `descriptors`, each with its
/// `entries` as `key=value`, its `limit` override (as text,
/// `requests_per_unit:N unit:U`) and its `hitsAddend` when set; the
/// request's `hitsAddend` when not 0; and `metadata`, the rules' metadata
/// of the descriptors that passed, merged (the first value of a key wins,
/// maps merge key by key).
fn dynamic_metadata(r: &rls::RateLimitRequest, passed: &[&std::sync::Arc<RuleLimit>]) -> Struct {
    let mut fields = std::collections::BTreeMap::new();
    fields.insert("domain".to_string(), string(&r.domain));
    let descriptors = r
        .descriptors
        .iter()
        .map(|d| {
            let mut f = std::collections::BTreeMap::new();
            let entries = d
                .entries
                .iter()
                .map(|e| string(&format!("{}={}", e.key, e.value)))
                .collect();
            f.insert("entries".to_string(), list(entries));
            if let Some(l) = &d.limit {
                let unit = RateLimitUnit::try_from(l.unit).map_or("UNKNOWN", |u| u.as_str_name());
                f.insert(
                    "limit".to_string(),
                    string(&format!(
                        "requests_per_unit:{} unit:{unit}",
                        l.requests_per_unit
                    )),
                );
            }
            if let Some(h) = d.hits_addend {
                f.insert("hitsAddend".to_string(), number(h as f64));
            }
            structure(Struct { fields: f })
        })
        .collect();
    fields.insert("descriptors".to_string(), list(descriptors));
    if r.hits_addend != 0 {
        fields.insert("hitsAddend".to_string(), number(f64::from(r.hits_addend)));
    }
    let mut merged = Metadata::new();
    for rule in passed {
        if let Some(m) = &rule.metadata {
            merge(&mut merged, m);
        }
    }
    if !merged.is_empty() {
        fields.insert(
            "metadata".to_string(),
            json(&serde_json::Value::Object(merged)),
        );
    }
    Struct { fields }
}

/// Add `src`'s keys that `dest` lacks; where both hold maps, recursively.
fn merge(dest: &mut Metadata, src: &Metadata) {
    for (k, v) in src {
        match (dest.get_mut(k), v) {
            (Some(serde_json::Value::Object(d)), serde_json::Value::Object(s)) => merge(d, s),
            (Some(_), _) => {}
            (None, _) => {
                dest.insert(k.clone(), v.clone());
            }
        }
    }
}

fn json(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match v {
        J::Null => Value {
            kind: Some(Kind::NullValue(0)),
        },
        J::Bool(b) => Value {
            kind: Some(Kind::BoolValue(*b)),
        },
        J::Number(n) => number(n.as_f64().unwrap_or_default()),
        J::String(s) => string(s),
        J::Array(items) => list(items.iter().map(json).collect()),
        J::Object(m) => structure(Struct {
            fields: m.iter().map(|(k, v)| (k.clone(), json(v))).collect(),
        }),
    }
}

fn string(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_string())),
    }
}

fn number(n: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(n)),
    }
}

fn list(values: Vec<Value>) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue { values })),
    }
}

fn structure(s: Struct) -> Value {
    Value {
        kind: Some(Kind::StructValue(s)),
    }
}
