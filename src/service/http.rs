//! HTTP admin: `/metrics` (Prometheus text), `/healthz` (the process is up),
//! `/readyz` (the node is serving decisions), `/runbooks` (one per alert:
//! `runbooks.rs`), and `POST /v1/check` — one decision for curl users and
//! stacks without gRPC.
//!
//! `/v1/check` takes a JSON object with the fields of one `sluice.v1`
//! request (`name`, `unique_key`, `hits`, `limit`, `duration_ms` or `window`,
//! `burst`, `algorithm`, `policy`, `drain_over_limit`, `nodelay`,
//! `on_owner_unreachable`; enum values by their short lowercase names) and
//! answers 200 (admitted), 429 (refused), 503 (no decision) or 400 (invalid,
//! naming the field), with a JSON body and the quota headers.
//!
//! The endpoint meets the bounds the gRPC fronts do: its body is at most
//! `limits.max_message_bytes` (beyond it, 413 naming `body` — one check per
//! call, so the message is the only thing that can be too large), and it
//! shares the node's one budget of checks in progress
//! (`limits.max_in_flight_checks`, [`Admission`]): when that is spent the
//! call is answered at once, 503 with `"reason": "overloaded"` and
//! `Retry-After`, not queued.

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use serde::Deserialize;

use super::admission::{Admission, Overloaded};
use super::headers::{self, Families, Quota};
use super::readiness::Readiness;
use super::wire;
use crate::config::Limits;
use crate::limiter::{Limiter, Status};
use crate::proto::v1 as pb;

#[derive(Clone)]
struct AppState {
    limiter: Limiter,
    readiness: Readiness,
    limits: Limits,
    families: Families,
    admission: Admission,
}

/// The admin router; `/readyz` says what `readiness` does.
pub fn router(
    limiter: Limiter,
    readiness: Readiness,
    limits: Limits,
    families: Families,
    admission: Admission,
) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/v1/check", post(check))
        .route("/runbooks", get(super::runbooks::index))
        .route("/runbooks/{alert}", get(super::runbooks::one))
        // A request is a call in progress on its connection until its
        // answer is sent: the idle timeout closes only quiet connections.
        .layer(super::idle::CountCallsLayer)
        .with_state(AppState {
            limiter,
            readiness,
            limits,
            families,
            admission,
        })
}

async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.limiter.metrics().render(),
    )
}

/// Ready or not, by status code; the body also names a minority — a
/// node cut off from most of its cluster (a split) stays ready, deciding
/// on leases, and says so here as on the status page and in
/// `sluice_minority` (alert `SluiceMinority`).
async fn readyz(State(s): State<AppState>) -> impl IntoResponse {
    let (code, state) = if s.readiness.is_ready() {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    };
    match s.limiter.minority_of() {
        Some(n) => (
            code,
            format!(
                "{state}\nminority: no majority of the {n} members seen; every key on leases\n"
            ),
        ),
        None => (code, format!("{state}\n")),
    }
}

/// One check, as JSON.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonCheck {
    #[serde(default)]
    name: String,
    #[serde(default, alias = "key")]
    unique_key: String,
    hits: Option<i64>,
    #[serde(default)]
    limit: i64,
    duration_ms: Option<i64>,
    window: Option<String>,
    burst: Option<i64>,
    algorithm: Option<String>,
    policy: Option<String>,
    #[serde(default)]
    drain_over_limit: bool,
    #[serde(default)]
    nodelay: bool,
    on_owner_unreachable: Option<String>,
    /// `async` or `sync` (the policy's, else `async`).
    replication: Option<String>,
}

type Invalid = (&'static str, String);

/// An enum value by its short name (`gcra` for `ALGORITHM_GCRA`).
fn enum_value(
    field: &'static str,
    prefix: &str,
    value: &Option<String>,
    parse: impl Fn(&str) -> Option<i32>,
) -> Result<i32, Invalid> {
    match value {
        None => Ok(0),
        Some(v) => parse(&format!("{prefix}{}", v.to_uppercase()))
            .ok_or((field, format!("unknown value {v:?}"))),
    }
}

impl JsonCheck {
    fn into_wire(self) -> Result<pb::RateLimitRequest, Invalid> {
        Ok(pb::RateLimitRequest {
            algorithm: enum_value("algorithm", "ALGORITHM_", &self.algorithm, |s| {
                pb::Algorithm::from_str_name(s).map(|a| a as i32)
            })?,
            window: enum_value("window", "CALENDAR_WINDOW_", &self.window, |s| {
                pb::CalendarWindow::from_str_name(s).map(|a| a as i32)
            })?,
            on_owner_unreachable: enum_value(
                "on_owner_unreachable",
                "OWNER_UNREACHABLE_",
                &self.on_owner_unreachable,
                |s| pb::OwnerUnreachable::from_str_name(s).map(|a| a as i32),
            )?,
            replication: enum_value("replication", "REPLICATION_", &self.replication, |s| {
                pb::Replication::from_str_name(s).map(|a| a as i32)
            })?,
            name: self.name,
            unique_key: self.unique_key,
            hits: self.hits,
            limit: self.limit,
            duration_ms: self.duration_ms,
            burst: self.burst,
            drain_over_limit: self.drain_over_limit,
            nodelay: self.nodelay,
            policy: self.policy,
            ..Default::default()
        })
    }
}

fn invalid(field: &str, message: String) -> axum::response::Response {
    refused(StatusCode::BAD_REQUEST, field, message)
}

fn refused(code: StatusCode, field: &str, message: String) -> axum::response::Response {
    let body = serde_json::json!({"error": {"field": field, "message": message}});
    (code, axum::Json(body)).into_response()
}

/// The node's budget of checks in progress is spent: 503 at once, shaped
/// as any answer without a decision (`status` and `reason` as the v1 API's
/// `UNAVAILABLE` / `OVERLOADED`), with the bound named and `Retry-After`
/// (when that family is on) — a slot frees as soon as a call in progress
/// ends.
fn overloaded(families: Families, e: &Overloaded) -> axum::response::Response {
    let mut head = HeaderMap::new();
    if families.retry_after {
        head.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    let body = serde_json::json!({
        "status": "unavailable",
        "reason": "overloaded",
        "message": e.to_string(),
    });
    (StatusCode::SERVICE_UNAVAILABLE, head, axum::Json(body)).into_response()
}

async fn check(State(s): State<AppState>, body: axum::body::Body) -> axum::response::Response {
    // Read at most the bound: a larger body is refused, not buffered.
    let max = s.limits.max_message_bytes;
    let body = match axum::body::to_bytes(body, max).await {
        Ok(body) => body,
        Err(e) if beyond_limit(&e) => {
            s.limiter.metrics().resources.exhausted("message_bytes");
            return refused(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body",
                format!("body: at most {max} bytes (limits.max_message_bytes)"),
            );
        }
        // A body that could not be read (malformed chunked encoding, a
        // connection error) is the client's fault, not a size: 400.
        Err(e) => return invalid("body", format!("body: could not be read: {e}")),
    };
    let _admitted = match s.admission.admit() {
        Ok(admitted) => admitted,
        Err(e) => return overloaded(s.families, &e),
    };
    // Any content type: `curl -d` sends form-encoded by default.
    let request: JsonCheck = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => return invalid("body", format!("body: not a JSON check: {e}")),
    };
    let mut wire_request = match request.into_wire() {
        Ok(r) => r,
        Err((field, message)) => return invalid(field, format!("{field}: {message}")),
    };
    let check = match wire::check_from_wire(&mut wire_request, &s.limits) {
        Ok(c) => c,
        Err(e) => {
            s.limiter.metrics().invalid(e.field);
            return invalid(e.field, e.to_string());
        }
    };
    // An inline limit's verdict names no label: the request's name is it.
    let name = check.name.clone();
    let verdict = match s.limiter.check(check).await {
        Ok(v) => v,
        Err(e) => return invalid(e.field, e.to_string()),
    };
    let now = s.limiter.now();
    let d = &verdict.decision;
    let mut head = HeaderMap::new();
    let quota = Quota {
        policy: verdict.label.as_deref().unwrap_or(&name),
        limit: d.limit,
        remaining: d.remaining,
        reset_in: Duration::from_nanos(d.reset_at.saturating_sub(now)),
        window: Duration::from_nanos(verdict.window),
        retry_after: match verdict.status {
            Status::OverLimit => d.retry_after.map(Duration::from_nanos),
            // No decision: try again shortly (a breaker probes within a second).
            Status::Unavailable => Some(Duration::from_secs(1)),
            Status::UnderLimit => None,
        },
    };
    for (k, v) in headers::headers(&quota, s.families) {
        if let Ok(v) = HeaderValue::from_str(&v) {
            head.insert(HeaderName::from_static(k), v);
        }
    }
    let code = match verdict.status {
        Status::UnderLimit => StatusCode::OK,
        Status::OverLimit => StatusCode::TOO_MANY_REQUESTS,
        Status::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
    };
    let w = wire::verdict_to_wire(&verdict, s.limiter.now());
    let name = |v: i32, prefix: &str, f: fn(i32) -> Option<&'static str>| {
        f(v).map(|s| s.trim_start_matches(prefix).to_lowercase())
            .unwrap_or_default()
    };
    let body = serde_json::json!({
        "status": name(w.status, "STATUS_", |v| pb::Status::try_from(v).ok().map(|s| s.as_str_name())),
        "reason": name(w.reason, "REASON_", |v| pb::Reason::try_from(v).ok().map(|s| s.as_str_name())),
        "limit": w.limit,
        "remaining": w.remaining,
        "reset_at_ms": w.reset_at_ms,
        "retry_after_ms": w.retry_after_ms,
        "delay_ms": w.delay_ms,
        "approximate": w.approximate,
        "owner": w.owner,
    });
    (code, head, axum::Json(body)).into_response()
}

/// Whether reading a body failed because it passed the length limit (and
/// not for another reason), from the error's source chain.
fn beyond_limit(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = err.source();
    }
    false
}
