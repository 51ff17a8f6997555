//! HTTP admin: `/metrics` (Prometheus text), `/healthz` (the process is up),
//! `/readyz` (the node is serving decisions).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::limiter::Limiter;

#[derive(Clone)]
struct AppState {
    limiter: Limiter,
    ready: Arc<AtomicBool>,
}

/// The admin router; `ready` flips to true once the gRPC port is serving
/// and back to false when the node starts shutting down.
pub fn router(limiter: Limiter, ready: Arc<AtomicBool>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(AppState { limiter, ready })
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

async fn readyz(State(s): State<AppState>) -> impl IntoResponse {
    if s.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}
