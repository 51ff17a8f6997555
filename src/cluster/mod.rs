//! The cluster: membership by gossip, ownership by a consistent-hash ring,
//! forwarding to owners.

pub mod auth;
pub mod breaker;
pub mod faults;
pub mod membership;
pub mod peers;
pub mod replay;
pub mod ring;
