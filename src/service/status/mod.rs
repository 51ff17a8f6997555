//! The status page: `GET /` (one HTML page) and `GET /status` (the same
//! data as JSON), served over HTTP/1.1 on the admin listener beside the
//! admin gRPC API (see `grpc.rs`: that listener accepts HTTP/1.1 for them).
//!
//! Both show client keys (API keys, IPs), so both require the operator
//! credential: the admin token as `Authorization: Bearer <token>`, or as
//! the password of HTTP Basic (any user) so that a browser can log in —
//! compared in constant time over digests ([`AdminToken::matches`]). The
//! page is static: its script fetches `/status` and fills the DOM with
//! `textContent` only, so a key is never markup. Anything else — another
//! path, a long URI — is a 4xx before any work is done.

mod auth;
mod http1;

pub use http1::PageOnlyOverHttp1Layer;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::operator::AdminToken;
use crate::cluster::membership::Membership;
use crate::limiter::Limiter;

/// The page, embedded in the binary: nodes often have no internet, so
/// nothing is loaded from elsewhere.
const PAGE: &str = include_str!("page.html");
/// Longer URIs get 414: the page's own never come close.
pub const MAX_URI: usize = 2048;
/// Top keys the page shows per ranking.
const TOP_N: usize = 20;

/// What the handlers need.
#[derive(Clone)]
struct Page {
    limiter: Limiter,
    membership: Membership,
    token: AdminToken,
}

/// The status routes, for the admin listener. Unknown paths: 404 (gRPC
/// calls to services not served there: `UNIMPLEMENTED`, as before).
pub fn router(limiter: Limiter, membership: Membership, token: AdminToken) -> Router {
    let page = Page {
        limiter,
        membership,
        token,
    };
    Router::new()
        .route("/", get(html))
        .route("/status", get(json))
        .route_layer(middleware::from_fn_with_state(page.clone(), operator_only))
        .with_state(page)
        .fallback(not_found)
        .layer(middleware::from_fn(bounded_uri))
}

/// A URI longer than [`MAX_URI`] is refused before routing.
async fn bounded_uri(request: Request, next: Next) -> Response {
    let uri = request.uri();
    let len = uri.path().len() + uri.query().map_or(0, str::len);
    if len > MAX_URI {
        return (StatusCode::URI_TOO_LONG, "URI too long\n").into_response();
    }
    next.run(request).await
}

async fn operator_only(State(page): State<Page>, request: Request, next: Next) -> Response {
    if auth::is_operator(&page.token, request.headers()) {
        return next.run(request).await;
    }
    let mut r = (
        StatusCode::UNAUTHORIZED,
        "the admin token is required: Authorization: Bearer <token>, or Basic with the token as password\n",
    )
        .into_response();
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"sluice\", charset=\"UTF-8\""),
    );
    r
}

/// Not a page of this listener. A gRPC call to a service it does not
/// serve still gets gRPC's `UNIMPLEMENTED`, as tonic's own fallback gave.
async fn not_found(request: Request) -> Response {
    let grpc = request
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if grpc {
        return tonic::Status::unimplemented("").into_http();
    }
    (StatusCode::NOT_FOUND, "not found\n").into_response()
}

/// Headers for both answers: never cached (they hold client keys), never
/// framed, nothing loaded from anywhere but this node.
fn private(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; frame-ancestors 'none'",
        ),
    );
    r
}

async fn html() -> Response {
    private(([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE).into_response())
}

async fn json(State(page): State<Page>) -> Response {
    let view = page.membership.view();
    let status = page.limiter.status(&view, TOP_N);
    let body = match serde_json::to_string(&status) {
        Ok(body) => html_safe(&body),
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    private(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// `<`, `>` and `&` as `\u003c`, `\u003e`, `\u0026` (as Go's encoder
/// writes them): still the same JSON, but a key like `</script>` cannot
/// end a script or open a tag should the text ever be embedded or sniffed.
/// In serialized JSON these characters occur only inside strings.
fn html_safe(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            c => out.push(c),
        }
    }
    out
}
