//! Front ends. Each translates its wire types to the limiter's domain types
//! and back; none holds business logic.
//!
//! - [`v1`]: `sluice.v1.RateLimiter`, the public API, and [`check_stream`]:
//!   its calls on one long-lived stream;
//! - [`admin`]: `sluice.v1.Admin`, for operators, and [`operator`]: who is one;
//! - [`admission`]: the bounds every check call meets first, whatever the
//!   front (batch size; one budget of calls in progress per node);
//! - [`http`]: `/metrics`, `/healthz`, `/readyz`;
//! - [`listener`], [`idle`]: the gRPC accept loops; connections bounded,
//!   and closed when idle;
//! - [`readiness`]: what `/readyz` and gRPC health both say;
//! - gRPC health and reflection are tonic's own services, mounted by the server.

pub mod admin;
pub mod admission;
pub mod allotments;
pub mod bulk;
pub mod check_stream;
pub mod coalesce;
pub mod deadline;
pub mod envoy;
pub mod grpc;
/// Refusal and quota headers: the `sluice-api` crate's, shared with the client.
pub use sluice_api::headers;
pub mod http;
pub mod idle;
pub mod inbound;
pub mod listener;
pub mod operator;
pub mod peer;
pub mod readiness;
pub mod runbooks;
pub mod status;
pub mod v1;
pub mod wire;
