//! Time between nodes (issue 18), on real `sluice serve` processes: one
//! node's clock runs 3 s ahead and another's 3 s behind
//! (`test_clock_offset_ms`, a test aid). Forwards carry how long the edge
//! still waits, not an instant on its clock, and owners decide on their
//! own clock, so every answer is exact — none `Expired` into a silent
//! fallback, none decided on a lease — and each node sees its peers'
//! offsets in `/metrics`. Every assertion is per key.
//!
//! Intervals: gossip 100 ms (`common::procs`); the callers' deadline 1 s
//! — well under the skew, so an instant sent on one clock and read on
//! another would expire (behind) or outlive (ahead) every forward, and
//! ample for a loaded 2-core machine. In the first test the skew stays
//! within the peer token's 10 s window (the two skewed nodes are 6 s
//! apart); in the second, nodes 10 minutes off learn each other's clocks
//! from their first refusals, and nothing falls back after.

mod common;

use std::time::Duration;

use common::inline;
use common::load::keys_owned_by;
use common::procs::{Proc, check_within, ports, rings_are, spawn};
use sluice::proto::v1 as pb;

const SETTLE: Duration = Duration::from_secs(30);
/// Per key, over a window no test outlives (no refill while it runs).
const LIMIT: i64 = 5;
const WINDOW_MS: i64 = 3_600_000;
const DEADLINE: Duration = Duration::from_secs(1);
const SKEW_S: f64 = 3.0;

/// Ten minutes off either way: far past the peer token's 10-s window
/// (a VM restored from a snapshot, a clock set by hand).
const FAR_S: f64 = 600.0;

/// One node per `(id, clock offset in ms)`, seeding each other; with the
/// ids sorted (as rings list them).
fn spawn_skewed<'a>(nodes: &[(&'a str, &str)]) -> (Vec<Proc>, Vec<&'a str>) {
    let gossip = ports(nodes.len());
    let procs = nodes
        .iter()
        .enumerate()
        .map(|(i, (id, offset))| {
            spawn(
                id,
                gossip[i],
                &gossip,
                &[("SLUICE_TEST_CLOCK_OFFSET_MS", offset)],
            )
        })
        .collect();
    let mut ids: Vec<&str> = nodes.iter().map(|n| n.0).collect();
    ids.sort();
    (procs, ids)
}

/// Through each node, keys owned by each node (itself included): the
/// first LIMIT hits admitted and the next refused, all exact.
async fn every_answer_exact(procs: &[Proc], ids: &[&str], name: &str) {
    for via in procs {
        let name = format!("{name}-via-{}", via.id);
        let keys = keys_owned_by(ids, &name, 4);
        let mut client = via.client().await;
        for k in &keys {
            for hit in 0..LIMIT + 2 {
                let request = vec![inline(&name, k, LIMIT, WINDOW_MS)];
                let answer = check_within(&mut client, request, DEADLINE)
                    .await
                    .unwrap_or_else(|e| panic!("via {}, {k}, hit {hit}: {e}", via.id))
                    .remove(0);
                let want = if hit < LIMIT {
                    pb::Status::UnderLimit
                } else {
                    pb::Status::OverLimit
                };
                assert_eq!(
                    answer.status, want as i32,
                    "via {}, {k}, hit {hit}: {answer:?}",
                    via.id
                );
                assert!(
                    !answer.approximate,
                    "via {}, {k}, hit {hit}: decided without its owner: {answer:?}",
                    via.id
                );
                let left = (LIMIT - 1 - hit).max(0);
                assert_eq!(answer.remaining, left, "via {}, {k}, hit {hit}", via.id);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_10_min_off_either_way_is_corrected_to_and_answers_exact() {
    // Peer tokens are stamped on one wall clock and checked on another:
    // each skewed node's first calls to and from the others are refused
    // for the time, with the refusing node's clock, and every later token
    // is stamped on the receiver's clock.
    let nodes = [
        ("far-ahead", "600000"),
        ("far-true", "0"),
        ("far-behind", "-600000"),
    ];
    let (procs, ids) = spawn_skewed(&nodes);
    // `sluice cluster status` signs its call on this machine's clock: only
    // the true node takes it (the CLI stamps no peer's clock).
    rings_are(
        &[&procs[1]],
        &ids,
        "three far-off nodes in the true node's ring",
        SETTLE,
    )
    .await;
    // Ready: through every node, a key of every owner answers exactly —
    // each pair's first refusal for the time is behind it.
    for via in &procs {
        let probe = keys_owned_by(&ids, &format!("far-probe-{}", via.id), 1);
        let client = via.client().await;
        for k in &probe {
            common::eventually(
                &format!("an exact answer via {} for {k}", via.id),
                SETTLE,
                || {
                    let request = vec![inline(
                        &format!("far-probe-{}", via.id),
                        k,
                        1_000,
                        WINDOW_MS,
                    )];
                    let mut client = client.clone();
                    async move {
                        check_within(&mut client, request, DEADLINE)
                            .await
                            .is_ok_and(|mut a| !a.remove(0).approximate)
                    }
                },
            )
            .await;
        }
    }
    // Nothing falls back from here on: every token is stamped on its
    // receiver's clock.
    let mut fell_back = Vec::new();
    for p in &procs {
        fell_back.push(p.metric("sluice_fallback_decisions").await);
    }
    every_answer_exact(&procs, &ids, "far").await;
    for (p, before) in procs.iter().zip(fell_back) {
        assert_eq!(
            p.metric("sluice_fallback_decisions").await,
            before,
            "{} decided without an owner after the first refusals",
            p.id
        );
    }
    // The true node reads its peers' clocks from their answers.
    let truth = &procs[1];
    for (peer, want) in [("far-ahead", FAR_S), ("far-behind", -FAR_S)] {
        let seen = truth
            .metric(&format!(
                "sluice_peer_clock_offset_seconds{{peer=\"{peer}\"}}"
            ))
            .await;
        assert!(
            (seen - want).abs() < 1.0,
            "{} sees {peer}'s clock {seen:+.3} s off, want {want:+.1}",
            truth.id
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_3_s_off_either_way_keeps_every_answer_exact() {
    let nodes = [
        ("skew-ahead", "3000"),
        ("skew-true", "0"),
        ("skew-behind", "-3000"),
    ];
    let (procs, ids) = spawn_skewed(&nodes);
    let refs: Vec<&Proc> = procs.iter().collect();
    rings_are(&refs, &ids, "three skewed nodes in every ring", SETTLE).await;

    every_answer_exact(&procs, &ids, "skew").await;

    // Nothing fell back, anywhere — and every check of a key another node
    // owns was forwarded exactly once (forwards are never retried): the 4
    // keys of each of the 2 others, LIMIT + 2 hits each.
    for p in &procs {
        assert_eq!(
            p.metric("sluice_forwarded_items").await,
            (2 * 4 * (LIMIT + 2)) as f64,
            "{} forwarded",
            p.id
        );
        assert_eq!(
            p.metric("sluice_fallback_decisions").await,
            0.0,
            "{} decided without an owner",
            p.id
        );
    }
    // Each node reads its peers' offsets from their answers: the true
    // node sees +3 s and −3 s (loopback round trips are well under the
    // 100 ms tolerance).
    let truth = &procs[1];
    for (peer, want) in [("skew-ahead", SKEW_S), ("skew-behind", -SKEW_S)] {
        let seen = truth
            .metric(&format!(
                "sluice_peer_clock_offset_seconds{{peer=\"{peer}\"}}"
            ))
            .await;
        assert!(
            (seen - want).abs() < 0.1,
            "{} sees {peer}'s clock {seen:+.3} s off, want {want:+.1}",
            truth.id
        );
    }
}
