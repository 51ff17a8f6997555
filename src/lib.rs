//! Sluice: a clustered, in-memory rate limiter.
//!
//! The design is in `DESIGN.md` (shared with the team); each module here is
//! one part of it.

/// The decision core (`crates/sluice-core`), re-exported: the server's
/// modules name it `crate::algorithm` as when it lived here.
pub use sluice_core::algorithm;
pub mod cli;
pub mod clock;
pub mod cluster;
pub mod config;
#[doc(hidden)]
pub mod fuzzing;
pub mod lease;
pub mod limiter;
pub mod metrics;
pub mod net;
pub mod policy;
pub mod proto;
pub mod server;
pub mod service;
pub mod store;
pub mod threads;
pub mod tls;
pub mod verdict;
