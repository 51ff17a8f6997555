//! A node back from a stall of its own (stopped, or its gossip loop starved
//! of CPU) does not take its peers' silence meanwhile for their death
//! (chitchat patch 7, `vendor/chitchat/PATCHES.md`): on real chitchat over
//! the MACed transport and loopback UDP.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use chitchat::ChitchatConfig;

use super::budget_tests::{config, port, port_with, spawn, until};
use crate::cluster::faults::Faults;

/// A round of 100 ms and a phi threshold of 40: a silent peer is taken
/// for dead two to four seconds in, far from this test's own scheduling
/// on a loaded machine; stalls of a second or more excused, as Sluice
/// sets them (`gossip::excuse_after`).
fn patient(mut c: ChitchatConfig) -> ChitchatConfig {
    let round = Duration::from_millis(100);
    let phi = 40.0;
    c.gossip_interval = round;
    c.failure_detector_config.initial_interval = round;
    c.failure_detector_config.phi_threshold = phi;
    c.failure_detector_config.excuse_after = Some(super::gossip::excuse_after(round, phi));
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_back_from_its_own_stall_suspects_no_peer() {
    let largest = Arc::new(AtomicUsize::new(0));
    let faults = Arc::new(Faults::default());
    let (ta, a_addr) = port_with(&largest, faults.clone()).await;
    let (tb, b_addr) = port(&largest).await;
    let a = spawn(patient(config("a", 1, a_addr, &[])), vec![], &ta).await;
    let b = spawn(patient(config("b", 1, b_addr, &[a_addr])), vec![], &tb).await;
    let a_id = a.chitchat_id().clone();
    let b_id = b.chitchat_id().clone();
    until(&a, 10, "a holds b live", |cc| {
        cc.live_nodes().any(|n| *n == b_id)
    })
    .await;
    // a learns b's heartbeat intervals: ten heartbeats heard.
    let mut seen = Vec::new();
    until(&a, 10, "a hears ten of b's heartbeats", |cc| {
        if let Some(h) = cc.node_state(&b_id).map(|s| s.heartbeat())
            && seen.last() != Some(&h)
        {
            seen.push(h);
        }
        seen.len() > 10
    })
    .await;
    // a's gossip loop stalls for 5 s (it waits for the state this test
    // holds), and what b sends meanwhile is lost (a starved node's
    // receive buffer overflows): when a runs again no word of b waits
    // for it. Upstream its first round found b silent for 5 s — phi well
    // past 40 — and held it dead.
    faults.cut_gossip(b_addr);
    let before = {
        let state = a.chitchat();
        let stalled = state.lock().await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        stalled.node_state(&a_id).map(|s| s.heartbeat())
    };
    // a's rounds go on (its own heartbeat moves twice: a whole round,
    // its liveness check included, ran), b still unheard.
    let mut moved = 0;
    let mut last = before;
    until(&a, 10, "a gossips two rounds after its stall", |cc| {
        let now = cc.node_state(&a_id).map(|s| s.heartbeat());
        if now != last {
            moved += 1;
            last = now;
        }
        moved >= 2
    })
    .await;
    let live = a.chitchat().lock().await.live_nodes().any(|n| *n == b_id);
    assert!(live, "a took b for dead after a stall of its own");
    // Excused, not forgotten: b, still silent, is found dead as a peer
    // silent while a listens is.
    until(&a, 10, "a holds b dead, silent after the stall", |cc| {
        cc.dead_nodes().any(|n| *n == b_id)
    })
    .await;
    faults.heal();
    let _ = a.shutdown().await;
    let _ = b.shutdown().await;
}
