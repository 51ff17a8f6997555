//! A small API behind the Sluice middleware, with two rules: 10 requests a
//! minute per caller (API key, else IP) and 100 a minute per endpoint for
//! everyone; `/export` costs 5. Against a local node (`sluice serve`):
//!
//! ```sh
//! cargo run --release -- serve &                       # the node, default ports
//! cargo run --release --example axum_app               # the API on 127.0.0.1:3000
//! for i in $(seq 11); do curl -s -o /dev/null -w '%{http_code} ' -H 'x-api-key: demo' localhost:3000/items; done
//! # 200 200 200 200 200 200 200 200 200 200 429
//! curl -si -H 'x-api-key: demo' localhost:3000/items   # Retry-After, X-RateLimit-*, RateLimit-Policy, RateLimit
//! ```
//!
//! `SLUICE_ADDR` (default 127.0.0.1:8081) and `APP_ADDR` (default
//! 127.0.0.1:3000) move them.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::routing::get;
use sluice_client::middleware::{RateLimitLayer, Rule};
use sluice_client::{Client, Limit, OnUnavailable};

fn per_minute(n: u64) -> Limit {
    Limit::Inline {
        limit: n,
        per: Duration::from_secs(60),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let sluice_addr = std::env::var("SLUICE_ADDR").unwrap_or_else(|_| "127.0.0.1:8081".into());
    let app_addr = std::env::var("APP_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let sluice = Client::builder([sluice_addr])
        .deadline(Duration::from_millis(20))
        // If Sluice is down, keep serving (counted in sluice.stats()).
        .on_unavailable(OnUnavailable::Allow)
        .batching(100)
        .build()?;
    let limits = RateLimitLayer::new(sluice)
        .principal_header("x-api-key")
        .peer_ip(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()))
        .cost(|_, path| if path == "/export" { 5 } else { 1 })
        .rule(Rule::per_caller("per_caller", per_minute(10)))
        .rule(Rule::per_endpoint("per_endpoint", per_minute(100)));
    let app = Router::new()
        .route("/items", get(|| async { "[\"apple\", \"pear\"]\n" }))
        .route("/export", get(|| async { "id,name\n1,apple\n2,pear\n" }))
        .layer(limits);
    let listener = tokio::net::TcpListener::bind(&app_addr).await?;
    eprintln!(
        "serving on http://{app_addr} (Sluice at the address in SLUICE_ADDR, default 127.0.0.1:8081)"
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
