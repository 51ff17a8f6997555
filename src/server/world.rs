//! What a node reads from the world, in one place: its clock, its
//! network, where its off-path work runs and the seed of its hash tables.
//!
//! [`World::os`] is production's — the kernel's clocks, the operating
//! system's sockets, threads of their own, random hash seeds. The
//! deterministic simulator (`crates/sluice-sim`) starts the same
//! [`super::Node`] in a world of its own: simulated clocks and network,
//! everything on the node's one runtime, fixed seeds.

use std::sync::Arc;

use crate::clock::SharedClock;
use crate::net::{Network, Os};
use crate::threads::Threads;

/// A node's world (see the module doc).
#[derive(Clone)]
pub struct World {
    pub clock: SharedClock,
    pub net: Arc<dyn Network>,
    pub threads: Threads,
    /// The store's hash seed: `None` is random per process (a client
    /// cannot aim its keys at one shard), shards four per core; a
    /// simulation fixes the seed and the shards (`Store::seeded`), so a
    /// run replays the same iteration orders on any machine.
    pub hash_seed: Option<u64>,
}

impl World {
    /// Production's world, around `clock`.
    pub fn os(clock: SharedClock) -> World {
        World {
            clock,
            net: Arc::new(Os),
            threads: Threads::Own,
            hash_seed: None,
        }
    }
}
