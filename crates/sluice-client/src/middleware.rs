//! A `tower::Layer` that rate-limits HTTP requests through Sluice, for axum
//! and any tower/hyper service.
//!
//! - **Key**: the authenticated principal first — a [`Principal`] request
//!   extension (set by your auth layer), else a configured header — then the
//!   client IP: the first address of a configured trusted proxy header, else
//!   what `peer_ip` finds in the request's extensions (e.g. axum's
//!   `ConnectInfo`). Never the IP alone when a principal exists.
//! - **Cost**: a function of the method and path (e.g. exports cost 25).
//! - **Rules**: one or several per request (per caller, per endpoint), each a
//!   Sluice check; every rule must admit.
//! - **Refusal**: `429 Too Many Requests` with `Retry-After`,
//!   `X-RateLimit-*`, `RateLimit-Policy` / `RateLimit` (the server's own
//!   formatting function, from `sluice-api`) and a small JSON body. Admitted
//!   responses carry the quota headers of the tightest rule.
//! - **Limiter down under `Deny`**: `503 Service Unavailable` with
//!   `Retry-After`, distinguishable from a 429.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use sluice_api::headers::{self, Families, Quota};

use super::{Check, Client, Decision, Limit, Source};

/// The authenticated caller, as an auth layer puts it in the request's
/// extensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal(pub String);

/// Who a rule counts by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyBy {
    /// The caller: principal, else client IP.
    Caller,
    /// The endpoint (method and path): one counter for everyone.
    Endpoint,
}

/// One check per request.
#[derive(Clone, Debug)]
pub struct Rule {
    /// The counter's name in Sluice (and the policy name in headers).
    pub name: String,
    pub limit: Limit,
    pub key: KeyBy,
}

impl Rule {
    pub fn per_caller(name: &str, limit: Limit) -> Rule {
        Rule {
            name: name.into(),
            limit,
            key: KeyBy::Caller,
        }
    }

    pub fn per_endpoint(name: &str, limit: Limit) -> Rule {
        Rule {
            name: name.into(),
            limit,
            key: KeyBy::Endpoint,
        }
    }
}

type CostFn = dyn Fn(&Method, &str) -> u64 + Send + Sync;
type PeerIpFn = dyn Fn(&http::Extensions) -> Option<IpAddr> + Send + Sync;

#[derive(Clone)]
struct Config {
    client: Client,
    rules: Vec<Rule>,
    principal_header: Option<HeaderName>,
    trusted_proxy_header: Option<HeaderName>,
    peer_ip: Arc<PeerIpFn>,
    cost: Arc<CostFn>,
    families: Families,
}

/// The layer; cheap to clone.
#[derive(Clone)]
pub struct RateLimitLayer {
    config: Arc<Config>,
}

impl RateLimitLayer {
    /// Checks through `client`; add rules with [`RateLimitLayer::rule`].
    pub fn new(client: Client) -> RateLimitLayer {
        RateLimitLayer {
            config: Arc::new(Config {
                client,
                rules: Vec::new(),
                principal_header: None,
                trusted_proxy_header: None,
                peer_ip: Arc::new(|ext| ext.get::<ClientIp>().map(|c| c.0)),
                cost: Arc::new(|_, _| 1),
                families: Families::default(),
            }),
        }
    }

    fn edit(mut self, f: impl FnOnce(&mut Config)) -> RateLimitLayer {
        // Copy-on-write: configuring a clone leaves the original alone.
        f(Arc::make_mut(&mut self.config));
        self
    }

    pub fn rule(self, rule: Rule) -> RateLimitLayer {
        self.edit(|c| c.rules.push(rule))
    }

    /// A header carrying the principal (e.g. `x-api-key`), used when no
    /// [`Principal`] extension is set.
    pub fn principal_header(self, name: &'static str) -> RateLimitLayer {
        self.edit(|c| c.principal_header = Some(HeaderName::from_static(name)))
    }

    /// Trust this header (e.g. `x-forwarded-for`) for the client IP: set it
    /// only behind a proxy that overwrites it.
    pub fn trusted_proxy_header(self, name: &'static str) -> RateLimitLayer {
        self.edit(|c| c.trusted_proxy_header = Some(HeaderName::from_static(name)))
    }

    /// Where the connection's peer IP is in the request's extensions
    /// (default: a [`ClientIp`] extension).
    pub fn peer_ip(
        self,
        f: impl Fn(&http::Extensions) -> Option<IpAddr> + Send + Sync + 'static,
    ) -> RateLimitLayer {
        self.edit(|c| c.peer_ip = Arc::new(f))
    }

    /// The cost of a request (default 1).
    pub fn cost(self, f: impl Fn(&Method, &str) -> u64 + Send + Sync + 'static) -> RateLimitLayer {
        self.edit(|c| c.cost = Arc::new(f))
    }

    /// Which header families to send (default: all).
    pub fn header_families(self, families: Families) -> RateLimitLayer {
        self.edit(|c| c.families = families)
    }
}

/// The connection's peer address, for apps that put it in extensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientIp(pub IpAddr);

impl<S> tower_layer::Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            config: self.config.clone(),
        }
    }
}

/// The service the layer wraps around yours.
#[derive(Clone)]
pub struct RateLimit<S> {
    inner: S,
    config: Arc<Config>,
}

impl Config {
    /// The caller's key: `p:<principal>` or `ip:<address>`.
    fn caller<B>(&self, req: &Request<B>) -> String {
        if let Some(p) = req.extensions().get::<Principal>() {
            return format!("p:{}", p.0);
        }
        if let Some(h) = &self.principal_header
            && let Some(v) = req.headers().get(h).and_then(|v| v.to_str().ok())
            && !v.is_empty()
        {
            return format!("p:{v}");
        }
        let forwarded = self.trusted_proxy_header.as_ref().and_then(|h| {
            let v = req.headers().get(h)?.to_str().ok()?;
            v.split(',').next()?.trim().parse::<IpAddr>().ok()
        });
        match forwarded.or_else(|| (self.peer_ip)(req.extensions())) {
            Some(ip) => format!("ip:{ip}"),
            None => "ip:unknown".into(),
        }
    }

    /// Every rule's decision, in one call; the first refusal, or the
    /// tightest admission.
    async fn decide(&self, checks: Vec<Check>) -> Result<(bool, Option<Decision>), String> {
        let mut tightest: Option<Decision> = None;
        for d in self.client.check_all(&checks).await {
            let d = d.map_err(|e| e.to_string())?;
            if !d.allowed {
                return Ok((false, Some(d)));
            }
            if tightest.as_ref().is_none_or(|t| d.remaining < t.remaining) {
                tightest = Some(d);
            }
        }
        Ok((true, tightest))
    }
}

fn quota(d: &Decision) -> Quota<'_> {
    Quota {
        policy: &d.policy,
        limit: d.limit,
        remaining: d.remaining,
        reset_in: d.reset_after,
        window: d.window,
        retry_after: d.retry_after,
    }
}

fn add_headers(h: &mut http::HeaderMap, d: &Decision, families: Families) {
    for (name, value) in headers::headers(&quota(d), families) {
        if let Ok(v) = HeaderValue::from_str(&value) {
            h.insert(HeaderName::from_static(name), v);
        }
    }
}

fn answer<B: From<String>>(status: StatusCode, body: String) -> Response<B> {
    let mut r = Response::new(B::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// A JSON string literal.
fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl<S, ReqB, ResB> tower_service::Service<Request<ReqB>> for RateLimit<S>
where
    S: tower_service::Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqB: Send + 'static,
    ResB: From<String> + Send + 'static,
{
    type Response = Response<ResB>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResB>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        // The inner service that was polled ready goes with this request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let config = self.config.clone();
        let hits = (config.cost)(req.method(), req.uri().path());
        let caller = config.caller(&req);
        let endpoint = format!("{} {}", req.method(), req.uri().path());
        let checks: Vec<Check> = config
            .rules
            .iter()
            .map(|rule| Check {
                name: rule.name.clone(),
                key: match rule.key {
                    KeyBy::Caller => caller.clone(),
                    KeyBy::Endpoint => endpoint.clone(),
                },
                hits,
                limit: rule.limit.clone(),
                tiered: false,
            })
            .collect();
        Box::pin(async move {
            let (allowed, decision) = match config.decide(checks).await {
                Ok(d) => d,
                Err(e) => {
                    let body = format!(
                        r#"{{"error":"rate_limit_misconfigured","message":{}}}"#,
                        json_str(&e)
                    );
                    return Ok(answer(StatusCode::INTERNAL_SERVER_ERROR, body));
                }
            };
            if !allowed {
                let d = decision.expect("a refusal carries its decision");
                let retry_ms = d.retry_after.map_or(0, |r| r.as_millis());
                let (status, error) = match d.source {
                    Source::Unavailable => {
                        (StatusCode::SERVICE_UNAVAILABLE, "rate_limiter_unavailable")
                    }
                    Source::Sluice { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
                };
                let body = format!(
                    r#"{{"error":"{error}","policy":{},"retry_after_ms":{retry_ms}}}"#,
                    json_str(&d.policy)
                );
                let mut r = answer(status, body);
                let families = match d.source {
                    // No count to report: only when to come back.
                    Source::Unavailable => Families {
                        retry_after: true,
                        x_ratelimit: false,
                        ietf: false,
                    },
                    Source::Sluice { .. } => config.families,
                };
                add_headers(r.headers_mut(), &d, families);
                return Ok(r);
            }
            let mut response = inner.call(req).await?;
            if let Some(d) = decision.filter(|d| matches!(d.source, Source::Sluice { .. })) {
                let families = Families {
                    retry_after: false,
                    ..config.families
                };
                add_headers(response.headers_mut(), &d, families);
            }
            Ok(response)
        })
    }
}
