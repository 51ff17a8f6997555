//! The cluster: membership by gossip, ownership by a consistent-hash ring,
//! forwarding to owners.

pub mod ring;
