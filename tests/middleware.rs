//! The `sluice-client` tower middleware in front of an axum app, against an
//! in-process node (fake clock): headers when admitted, 429 with the right
//! `Retry-After` and quota headers when refused, cost weighting, principal
//! before IP, the trusted proxy header, and 503 when the limiter is down
//! under `Deny`.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{self, Request, StatusCode};
use axum::routing::get;
use common::{config, start};
use sluice_client::middleware::{Principal, RateLimitLayer, Rule};
use sluice_client::{Client, Limit, OnUnavailable};
use tower::ServiceExt;

fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route("/items", get(|| async { "items" }))
        .route("/export", get(|| async { "export" }))
        .layer(layer)
}

fn per_minute(n: u64) -> Limit {
    Limit::Inline {
        limit: n,
        per: Duration::from_secs(60),
    }
}

fn from(ip: &str, path: &str) -> Request<Body> {
    let mut r = Request::get(path).body(Body::empty()).unwrap();
    let addr: SocketAddr = format!("{ip}:40000").parse().unwrap();
    r.extensions_mut().insert(ConnectInfo(addr));
    r
}

fn header(r: &http::Response<Body>, name: &str) -> String {
    r.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

async fn body(r: http::Response<Body>) -> String {
    let bytes = axum::body::to_bytes(r.into_body(), 64 * 1024)
        .await
        .unwrap();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn layer(client: Client) -> RateLimitLayer {
    RateLimitLayer::new(client)
        .principal_header("x-api-key")
        .peer_ip(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()))
        .cost(|_, path| if path == "/export" { 5 } else { 1 })
        .rule(Rule::per_caller("per_caller", per_minute(10)))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_eleventh_request_of_ten_per_minute_gets_a_429_with_headers() {
    let node = start(config()).await;
    let client = Client::builder([node.node.grpc_addr.to_string()])
        .deadline(Duration::from_secs(2))
        .build()
        .unwrap();
    let app = app(layer(client));
    for i in 0..10 {
        let r = app
            .clone()
            .oneshot(from("10.0.0.1", "/items"))
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "#{i}");
        assert_eq!(header(&r, "x-ratelimit-limit"), "10");
        assert_eq!(header(&r, "x-ratelimit-remaining"), (9 - i).to_string());
        assert_eq!(header(&r, "ratelimit-policy"), "\"per_caller\";q=10;w=60");
        assert!(
            header(&r, "retry-after").is_empty(),
            "no Retry-After when admitted"
        );
    }
    let r = app
        .clone()
        .oneshot(from("10.0.0.1", "/items"))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    // One token per 6 s; the clock is frozen right after the 10th.
    assert_eq!(header(&r, "retry-after"), "6");
    assert_eq!(header(&r, "x-ratelimit-remaining"), "0");
    assert_eq!(header(&r, "ratelimit"), "\"per_caller\";r=0;t=60");
    let b = body(r).await;
    assert!(
        b.contains(r#""error":"rate_limited""#) && b.contains(r#""retry_after_ms":6000"#),
        "{b}"
    );
    // Another IP is another caller.
    let r = app
        .clone()
        .oneshot(from("10.0.0.2", "/items"))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread")]
async fn cost_principal_and_trusted_proxy() {
    let node = start(config()).await;
    let client = Client::builder([node.node.grpc_addr.to_string()])
        .deadline(Duration::from_secs(2))
        .build()
        .unwrap();
    let app = app(layer(client.clone()));
    // Cost: /export costs 5 of 10.
    let r = app
        .clone()
        .oneshot(from("10.0.1.1", "/export"))
        .await
        .unwrap();
    assert_eq!(header(&r, "x-ratelimit-remaining"), "5");
    let r = app
        .clone()
        .oneshot(from("10.0.1.1", "/export"))
        .await
        .unwrap();
    assert_eq!(header(&r, "x-ratelimit-remaining"), "0");
    assert_eq!(
        app.clone()
            .oneshot(from("10.0.1.1", "/export"))
            .await
            .unwrap()
            .status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // Principal before IP: the same exhausted IP with an API key is the key's.
    let mut r = from("10.0.1.1", "/items");
    r.headers_mut()
        .insert("x-api-key", "k-123".parse().unwrap());
    let r = app.clone().oneshot(r).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "x-ratelimit-remaining"), "9");
    // A Principal extension (from an auth layer) wins over the header.
    let mut r = from("10.0.1.1", "/items");
    r.headers_mut()
        .insert("x-api-key", "k-123".parse().unwrap());
    r.extensions_mut().insert(Principal("user-7".into()));
    let r = app.clone().oneshot(r).await.unwrap();
    assert_eq!(
        header(&r, "x-ratelimit-remaining"),
        "9",
        "user-7's own counter"
    );
    // Without a trusted proxy header configured, X-Forwarded-For is ignored:
    let mut r = from("10.0.1.1", "/items");
    r.headers_mut()
        .insert("x-forwarded-for", "203.0.113.9".parse().unwrap());
    assert_eq!(
        app.clone().oneshot(r).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // ...with it, the first address is the client.
    let proxied = self::app(layer(client).trusted_proxy_header("x-forwarded-for"));
    let mut r = from("10.0.1.1", "/items");
    r.headers_mut()
        .insert("x-forwarded-for", "203.0.113.9, 10.0.1.1".parse().unwrap());
    let r = proxied.oneshot(r).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        header(&r, "x-ratelimit-remaining"),
        "9",
        "203.0.113.9's counter"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_limiter_down_answers_by_on_unavailable() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let build = |choice| {
        Client::builder([dead.clone()])
            .deadline(Duration::from_millis(50))
            .on_unavailable(choice)
            .build()
            .unwrap()
    };
    let deny = app(layer(build(OnUnavailable::Deny)));
    let r = deny.oneshot(from("10.0.2.1", "/items")).await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE, "503, not 429");
    assert_eq!(header(&r, "retry-after"), "1");
    assert!(
        header(&r, "x-ratelimit-remaining").is_empty(),
        "no count to report"
    );
    assert!(body(r).await.contains("rate_limiter_unavailable"));

    let allow = app(layer(build(OnUnavailable::Allow)));
    let r = allow.oneshot(from("10.0.2.1", "/items")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);

    let local = app(layer(build(OnUnavailable::Local {
        share: 0.5,
        limits: Default::default(),
    })));
    let mut statuses = Vec::new();
    for _ in 0..7 {
        statuses.push(
            local
                .clone()
                .oneshot(from("10.0.2.1", "/items"))
                .await
                .unwrap()
                .status(),
        );
    }
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!(ok, 5, "half of 10 in process: {statuses:?}");
    assert_eq!(statuses[6], StatusCode::SERVICE_UNAVAILABLE);
}
