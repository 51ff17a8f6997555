//! Gossip within its budget, on real chitchat over the MACed transport and
//! loopback UDP: a node whose digest alone is past a datagram still gossips
//! (every message fits once sealed), and a node rejoining in a loop leaves only
//! [`GENERATIONS_PER_ID`] generations in a peer's gossip state.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use chitchat::transport::Transport;
use chitchat::{
    ChitchatConfig, ChitchatHandle, ChitchatId, ChitchatMessage, Deserializable,
    FailureDetectorConfig, Serializable, spawn_chitchat,
};

use super::prune::{GENERATIONS_PER_ID, prune};
use crate::cluster::auth::{AuthTransport, Secret};
use crate::cluster::faults::Faults;
use crate::net::{DatagramSocket, Datagrams, Network, Os};

/// A UDP port that records the largest datagram sent through it.
struct Recording {
    inner: Arc<dyn Datagrams>,
    largest: Arc<AtomicUsize>,
}

struct RecordingSocket {
    inner: Box<dyn DatagramSocket>,
    largest: Arc<AtomicUsize>,
}

impl Datagrams for Recording {
    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn open(&self) -> std::io::Result<Box<dyn DatagramSocket>> {
        Ok(Box::new(RecordingSocket {
            inner: self.inner.open()?,
            largest: self.largest.clone(),
        }))
    }
}

#[async_trait]
impl DatagramSocket for RecordingSocket {
    async fn send_to(&self, datagram: &[u8], to: SocketAddr) -> std::io::Result<usize> {
        self.largest.fetch_max(datagram.len(), Ordering::Relaxed);
        self.inner.send_to(datagram, to).await
    }

    async fn recv_from(&self, buf: &mut [u8]) -> std::io::Result<(usize, SocketAddr)> {
        self.inner.recv_from(buf).await
    }
}

pub(super) async fn port(largest: &Arc<AtomicUsize>) -> (AuthTransport, SocketAddr) {
    port_with(largest, Arc::new(Faults::default())).await
}

/// A port whose links `faults` may cut.
pub(super) async fn port_with(
    largest: &Arc<AtomicUsize>,
    faults: Arc<Faults>,
) -> (AuthTransport, SocketAddr) {
    let inner = Os.datagrams("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = inner.local_addr().unwrap();
    let recording = Arc::new(Recording {
        inner,
        largest: largest.clone(),
    });
    let secret = Secret::new(Some(b"budget"));
    (AuthTransport::new(recording, secret, faults), addr)
}

pub(super) fn config(
    node: &str,
    generation: u64,
    addr: SocketAddr,
    seeds: &[SocketAddr],
) -> ChitchatConfig {
    let interval = Duration::from_millis(50);
    ChitchatConfig {
        chitchat_id: ChitchatId::new(node, generation, addr),
        cluster_id: "budget".into(),
        gossip_interval: interval,
        listen_addr: addr,
        seed_nodes: seeds.iter().map(|s| s.to_string()).collect(),
        failure_detector_config: FailureDetectorConfig {
            phi_threshold: 4.0,
            initial_interval: interval,
            dead_node_grace_period: Duration::from_secs(3_600),
            ..FailureDetectorConfig::default()
        },
        marked_for_deletion_grace_period: Duration::from_secs(3_600),
        catchup_callback: None,
        extra_liveness_predicate: None,
    }
}

pub(super) async fn spawn(
    config: ChitchatConfig,
    kvs: Vec<(String, String)>,
    t: &dyn Transport,
) -> ChitchatHandle {
    spawn_chitchat(config, kvs, t).await.unwrap()
}

/// Awaits `cond` on `handle`'s state, every 20 ms, up to `secs`.
pub(super) async fn until(
    handle: &ChitchatHandle,
    secs: u64,
    what: &str,
    mut cond: impl FnMut(&chitchat::Chitchat) -> bool,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if cond(&*handle.chitchat().lock().await) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within {secs} s: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Tells `to`, by one Syn as a peer would send it, of `count` nodes with
/// `id_len`-byte ids (heartbeat 1, no state): `to` keeps them as members
/// it has heard of. Returns the bytes they add to `to`'s digest.
async fn tell_of_nodes(
    t: &AuthTransport,
    to: SocketAddr,
    first: usize,
    count: usize,
    id_len: usize,
) -> usize {
    let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
    // A Syn as chitchat writes one: magic number, protocol version 0,
    // message type 0, the digest, the cluster id.
    let mut buf = Vec::new();
    45_139u16.serialize(&mut buf);
    buf.extend([0u8, 0u8]);
    (count as u16).serialize(&mut buf);
    for i in first..first + count {
        let id = ChitchatId::new(format!("{i:0>id_len$}"), 1, addr);
        id.serialize(&mut buf);
        // heartbeat, last GC version, max version
        for v in [1u64, 0, 0] {
            v.serialize(&mut buf);
        }
    }
    let added = buf.len() - 6;
    "budget".to_string().serialize(&mut buf);
    let syn = ChitchatMessage::deserialize(&mut &buf[..]).unwrap();
    assert!(matches!(syn, ChitchatMessage::Syn { .. }));
    let mut socket = t.open(addr).await.unwrap();
    socket.send(to, syn).await.unwrap();
    added
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_digest_past_a_datagram_still_gossips_within_one() {
    let largest = Arc::new(AtomicUsize::new(0));
    let (ta, a_addr) = port(&largest).await;
    let (tb, b_addr) = port(&largest).await;
    let (tc, _) = port(&Arc::new(AtomicUsize::new(0))).await;
    let kvs = vec![("k".to_string(), "v".to_string())];
    let a = spawn(config("a", 1, a_addr, &[]), kvs, &ta).await;
    // a hears of 500 members with 200-byte ids (a fleet's dead
    // generations, as a rejoin loop leaves them): its digest alone is past
    // a datagram.
    let mut added = 0;
    for first in [0, 250] {
        added += tell_of_nodes(&tc, a_addr, first, 250, 200).await;
    }
    assert!(added > 65_507, "{added} bytes of digest");
    until(&a, 10, "a knows the 500", |cc| cc.node_states().len() > 500).await;
    let b = spawn(config("b", 1, b_addr, &[a_addr]), vec![], &tb).await;
    let a_id = a.chitchat_id().clone();
    // Before chitchat's budget (vendor/chitchat/PATCHES.md) every message
    // a sent carried the whole digest: too large, dropped, every round.
    until(&b, 10, "b learns a's state", |cc| {
        cc.node_state(&a_id)
            .is_some_and(|s| s.get("k") == Some("v"))
    })
    .await;
    let largest = largest.load(Ordering::Relaxed);
    assert!(largest <= 65_507, "largest datagram {largest}");
    let _ = a.shutdown().await;
    let _ = b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_rejoining_in_a_loop_leaves_two_generations_in_gossip() {
    let largest = Arc::new(AtomicUsize::new(0));
    let (ta, a_addr) = port(&largest).await;
    let (tb, b_addr) = port(&largest).await;
    let a = spawn(config("a", 1, a_addr, &[]), vec![], &ta).await;
    let gens = 5u64;
    for g in 1..=gens {
        let b = spawn(config("b", g, b_addr, &[a_addr]), vec![], &tb).await;
        let id = b.chitchat_id().clone();
        until(&a, 10, "a hears b", |cc| cc.live_nodes().any(|n| *n == id)).await;
        let _ = b.shutdown().await;
        until(&a, 10, "a holds b dead", |cc| {
            cc.dead_nodes().any(|n| *n == id)
        })
        .await;
    }
    let chitchat = a.chitchat();
    let mut cc = chitchat.lock().await;
    let held = |cc: &chitchat::Chitchat| -> Vec<u64> {
        cc.node_states()
            .keys()
            .filter(|id| &*id.node_id == "b")
            .map(|id| id.generation_id)
            .collect()
    };
    assert_eq!(held(&cc), (1..=gens).collect::<Vec<_>>(), "before the rule");
    assert_eq!(prune(&mut cc), gens as usize - GENERATIONS_PER_ID);
    assert_eq!(held(&cc), vec![gens - 1, gens]);
    drop(cc);
    let _ = a.shutdown().await;
}
