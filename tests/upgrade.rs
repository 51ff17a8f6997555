//! A rolling upgrade from the previous release (peer protocol 2) to this
//! one (3), under load, on real processes: three nodes of the previous
//! binary are replaced one at a time (SIGTERM, then this binary under the
//! same node id), so the cluster runs mixed 2 ↔ 3 between steps.
//!
//! Needs the previous release's binary: `PREVIOUS_SLUICE_BIN=path`
//! (`.ci/run` builds it from the commit `PREVIOUS_RELEASE` names). Ignored
//! by a plain `cargo test` for that reason; CI runs it as its own stage.
//!
//! Per key, as DESIGN §7 says: every key is offered at least 3× its limit;
//! a key admits at most its limit plus what a protocol-2 node can over-admit
//! while it is part of the cluster (its own new-owner rules: seeding from
//! the `remaining` it saw, within its ownership grace), bounded here at
//! `MIXED_SLACK` per key — and no key is refused below its limit by more
//! than the leases' rounding.

mod common;

use std::time::Duration;

use common::load::{Load, keys_owned_by};
use common::procs::{Proc, channel, ports, rings_are, spawn, spawn_bin};

const LIMIT: i64 = 100;
/// What one key may be over while protocol-2 nodes decide part of the time.
const MIXED_SLACK: i64 = 3;

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the previous release's binary: PREVIOUS_SLUICE_BIN"]
async fn a_rolling_upgrade_from_protocol_2_keeps_every_count() {
    let previous = std::env::var("PREVIOUS_SLUICE_BIN")
        .expect("PREVIOUS_SLUICE_BIN: the previous release's sluice binary");
    let ids = ["node-0", "node-1", "node-2"];
    let gossip = ports(3);
    let mut procs: Vec<Proc> = (0..3)
        .map(|i| spawn_bin(&previous, ids[i], gossip[i], &gossip, &[]))
        .collect();
    rings_are(
        &procs.iter().collect::<Vec<_>>(),
        &ids,
        "three previous-release nodes ready",
        Duration::from_secs(30),
    )
    .await;
    let mut targets = Vec::new();
    for p in &procs {
        targets.push((p.id.clone(), channel(p).await));
    }
    let keys = keys_owned_by(&ids, "upgrade", 4);
    let load = Load::start("upgrade", keys, LIMIT, Duration::from_millis(10), targets);
    load.until_offered(LIMIT / 4).await;
    let mut at = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        at.push(load.snapshot().min_offered());
        load.drop_target(id).await;
        procs[i].terminate();
        procs[i] = spawn(id, gossip[i], &gossip, &[]);
        rings_are(
            &procs.iter().collect::<Vec<_>>(),
            &ids,
            "the upgraded node back in every ring",
            Duration::from_secs(30),
        )
        .await;
        load.add_target(id, channel(&procs[i]).await);
        load.until_offered(load.snapshot().min_offered() + LIMIT / 4)
            .await;
    }
    let tally = load.finish(3 * LIMIT).await;
    println!(
        "rolling upgrade 2 → 3 (each node replaced at {at:?} offered per key): {}",
        tally.summary(LIMIT)
    );
    assert_eq!(tally.errors, 0, "{:?}", tally.first_errors);
    for (k, admitted) in &tally.admitted {
        assert!(
            (LIMIT - 1..=LIMIT + MIXED_SLACK).contains(admitted),
            "{k}: admitted {admitted} of a limit of {LIMIT}"
        );
    }
}
