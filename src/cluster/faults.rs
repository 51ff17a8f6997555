//! A test hook: links this node behaves as if they were cut.
//!
//! Fault tests need partitions a real network would produce — gRPC to one
//! peer timing out while gossip still says it is alive (the non-transitive
//! case), or gossip lost both ways. This is reachable only from code (tests
//! hold the node), never from config or the network; with nothing cut it
//! costs one relaxed atomic load per RPC and per datagram.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Debug, Default)]
pub struct Faults {
    any: AtomicBool,
    /// Peers (node ids) whose gRPC calls time out.
    grpc: RwLock<HashSet<String>>,
    /// Gossip addresses whose datagrams are dropped, both ways.
    gossip: RwLock<HashSet<SocketAddr>>,
}

impl Faults {
    fn refresh(&self) {
        let any = !self.grpc.read().map(|g| g.is_empty()).unwrap_or(true)
            || !self.gossip.read().map(|g| g.is_empty()).unwrap_or(true);
        self.any.store(any, Ordering::Relaxed);
    }

    /// gRPC calls to `node_id` time out from now on.
    pub fn cut_grpc(&self, node_id: &str) {
        if let Ok(mut g) = self.grpc.write() {
            g.insert(node_id.to_string());
        }
        self.refresh();
    }

    /// Datagrams to and from `addr` are dropped from now on.
    pub fn cut_gossip(&self, addr: SocketAddr) {
        if let Ok(mut g) = self.gossip.write() {
            g.insert(addr);
        }
        self.refresh();
    }

    /// Restore every link.
    pub fn heal(&self) {
        if let Ok(mut g) = self.grpc.write() {
            g.clear();
        }
        if let Ok(mut g) = self.gossip.write() {
            g.clear();
        }
        self.refresh();
    }

    pub fn grpc_cut(&self, node_id: &str) -> bool {
        self.any.load(Ordering::Relaxed) && self.grpc.read().is_ok_and(|g| g.contains(node_id))
    }

    pub fn gossip_cut(&self, addr: &SocketAddr) -> bool {
        self.any.load(Ordering::Relaxed) && self.gossip.read().is_ok_and(|g| g.contains(addr))
    }
}
