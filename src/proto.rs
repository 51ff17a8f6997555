//! Generated wire types. Services convert these to domain types at the edge;
//! nothing else in the crate uses them.

#![allow(clippy::all, missing_docs)]

pub mod v1 {
    tonic::include_proto!("sluice.v1");
}

/// The peer protocol (node to node).
pub mod peer {
    tonic::include_proto!("sluice.peer.v1");
}

/// The peer protocol version this build speaks.
pub const PEER_PROTOCOL_VERSION: u32 = 1;

/// The encoded descriptors of every Sluice proto, served by gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("sluice_descriptor");
