//! Generated wire types, and the enum mappers every edge shares
//! ([`convert`]). Services and the peer codec convert these to domain types
//! at the edge; nothing else in the crate uses them (`tests/architecture.rs`
//! holds this).

#![allow(clippy::all, missing_docs)]

pub mod convert;

/// The public API (`sluice.v1`), from the `sluice-api` crate.
pub use sluice_api::v1;

/// The peer protocol (node to node).
pub mod peer {
    tonic::include_proto!("sluice.peer.v1");
}

/// Envoy's rate limit service (a wire-compatible subset, vendored).
pub mod envoy {
    pub mod service {
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("envoy.service.ratelimit.v3");
            }
        }
    }
    pub mod extensions {
        pub mod common {
            pub mod ratelimit {
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                }
            }
        }
    }
    pub mod r#type {
        pub mod v3 {
            tonic::include_proto!("envoy.r#type.v3");
        }
    }
    pub mod config {
        pub mod core {
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
            }
        }
    }
}

/// The peer protocol version this build speaks: 2 added `Sync` (replicas
/// and handoff) and `Pull`; 3 adds views to `Pull`, `Transfer` (ownership
/// moves with a completion mark), `Reset` at the owner, relative forward
/// budgets and reset generations in reports, and peer tokens bound to
/// their receiver (a protocol-2 peer gets and sends unbound ones). It
/// answers peers one version apart.
pub const PEER_PROTOCOL_VERSION: u32 = 3;

/// The encoded descriptors of the server's own protos (Envoy's RLS), served
/// by gRPC reflection beside [`sluice_api::FILE_DESCRIPTOR_SET`].
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("sluice_descriptor");
