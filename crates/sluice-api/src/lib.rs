//! Sluice's public API, shared by the server and the client crate so the two
//! never drift: the `sluice.v1` gRPC types (rate limiting and admin), their
//! descriptor set for reflection, and the one function that formats refusal
//! and quota headers for HTTP callers.

pub mod headers;

/// `sluice.v1`: `RateLimiter/Check` and the operator `Admin` service.
#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("sluice.v1");
}

/// Response metadata on a `Check` call refused as too large
/// (`RESOURCE_EXHAUSTED`, more items than the node's `limits.max_batch`):
/// the most items the node takes per call, so a batching client can send
/// that many from then on instead of guessing.
pub const MAX_BATCH_METADATA: &str = "sluice-max-batch";

/// The encoded descriptors of the `sluice.v1` protos, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("sluice_api_descriptor");
