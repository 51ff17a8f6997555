//! Three real `sluice serve` processes on loopback: they form one cluster
//! (as `sluice cluster status` shows), enforce one limit exactly whichever
//! process is asked, drop a SIGTERMed member within 1 s and a SIGKILLed one
//! within a few seconds (the measured figures are printed).

mod common;

use std::time::{Duration, Instant};

use common::load::{Load, Tally, keys_owned_by};
use common::procs::{Proc, channel, check, inspect_remaining, ports, rings_are, spawn, status};
use common::{inline, under};
use sluice::proto::v1 as pb;

#[tokio::test(flavor = "multi_thread")]
async fn three_processes_enforce_one_limit() {
    let g = ports(3);
    let p0 = spawn("proc-0", g[0], &[], &[]);
    let p1 = spawn("proc-1", g[1], &[g[0]], &[]);
    let p2 = spawn("proc-2", g[2], &[g[0]], &[]);
    let all = ["proc-0", "proc-1", "proc-2"];
    rings_are(
        &[&p0, &p1, &p2],
        &all,
        "three ready members",
        Duration::from_secs(30),
    )
    .await;

    // Every member is ready and owns about a third of the key space.
    let s = status(&p1.grpc).unwrap();
    for m in s["members"].as_array().unwrap() {
        assert_eq!(m["state"], "ready", "{m}");
        let share = m["ring_share"].as_f64().unwrap();
        assert!((0.25..0.42).contains(&share), "{m}");
    }
    assert_eq!(s["cluster_size"], 3);
    // Its ownership transfer for the current view is complete: every other
    // member said `done` (the node asked is no source of its own).
    common::eventually(
        "proc-1's transfer complete",
        Duration::from_secs(10),
        || async {
            let s = status(&p1.grpc).unwrap();
            s["transfer_complete"] == true
                && s["members"].as_array().unwrap().iter().all(|m| {
                    let want = if m["node_id"] == "proc-1" { "" } else { "done" };
                    m["transfer"] == want
                })
        },
    )
    .await;

    let mut clients = Vec::new();
    for p in [&p0, &p1, &p2] {
        clients.push(p.client().await);
    }
    // 50 per year: real time passes in this test, and a limit per minute
    // would refill a token every 1.2 s of it.
    let year_ms = 365 * 24 * 3_600 * 1_000;
    let mut admitted = 0;
    for i in 0..150 {
        let r = check(
            &mut clients[i % 3],
            vec![inline("proc", "one-key", 50, year_ms)],
        )
        .await
        .unwrap()
        .remove(0);
        assert!(r.error.is_none() && !r.approximate, "{r:?}");
        assert_ne!(r.status, pb::Status::Unavailable as i32, "{r:?}");
        admitted += usize::from(under(&r));
    }
    assert_eq!(admitted, 50, "one limit across three processes");

    // SIGTERM: the member leaves gracefully, out of every ring within 1 s.
    let started = Instant::now();
    assert!(p2.signal("TERM"));
    let mut p2 = p2;
    rings_are(
        &[&p0, &p1],
        &["proc-0", "proc-1"],
        "proc-2 gone after SIGTERM",
        Duration::from_secs(5),
    )
    .await;
    let left = started.elapsed();
    println!("SIGTERM: out of every ring after {left:?}");
    assert!(
        left < Duration::from_secs(1),
        "graceful leave took {left:?}"
    );
    let exit = p2.child.wait().unwrap();
    assert!(exit.success(), "SIGTERM exits cleanly: {exit:?}");

    // SIGKILL: found dead by the failure detector.
    let mut p1 = p1;
    let started = Instant::now();
    p1.child.kill().unwrap();
    let took = rings_are(
        &[&p0],
        &["proc-0"],
        "proc-1 gone after SIGKILL",
        Duration::from_secs(30),
    )
    .await;
    println!(
        "SIGKILL: out of the ring after {:?} (gossip every {})",
        started.elapsed().max(took),
        common::procs::GOSSIP_INTERVAL
    );
    drop(p0);
}

/// Owner kill -9 under load, `local_share`, keys already at 90% of their
/// limit: no errors; per key, the survivors' keys exact, the dead owner's
/// within the bound.
///
/// Bound: while the dead owner is undetected, each of the N−1 surviving
/// edges spends at most its 1/N lease of the `r` it last saw (r = 3 of 30
/// here: ⌈3/3⌉ = 1 each); the new owner (its successor) then decides from
/// its replica, which replication kept current before the kill. So at most
/// N−1 = 2 over per key of the dead owner.
#[tokio::test(flavor = "multi_thread")]
async fn owner_kill_9_near_the_limit_over_admits_at_most_the_leases() {
    const LIMIT: i64 = 30;
    const BEFORE: i64 = 27;
    const LEASES: i64 = 2;
    let g = ports(3);
    let ids = ["proc-0", "proc-1", "proc-2"];
    let mut procs: Vec<Proc> = (0..3).map(|i| spawn(ids[i], g[i], &g, &[])).collect();
    rings_are(
        &procs.iter().collect::<Vec<_>>(),
        &ids,
        "three ready members",
        Duration::from_secs(30),
    )
    .await;
    let keys = keys_owned_by(&ids, "kill", 3);
    let mut clients = Vec::new();
    for p in &procs {
        clients.push(p.client().await);
    }
    let mut t = Tally::default();
    // One request per key, round-robin over the first `alive` clients.
    let mut round = async |t: &mut Tally, alive: usize, step: usize| {
        for (i, k) in keys.iter().enumerate() {
            let via = (step + i) % alive;
            let sent = Instant::now();
            let got = check(
                &mut clients[via],
                vec![inline("kill", k, LIMIT, common::load::YEAR_MS)],
            )
            .await
            .map(|mut r| r.remove(0));
            t.latencies.push(sent.elapsed());
            t.record(k, ids[via], got);
        }
    };
    // 27 of 30 consumed through every node: 10% left everywhere.
    for step in 0..BEFORE as usize {
        round(&mut t, 3, step).await;
    }
    assert!(
        t.admitted.values().all(|&a| a == BEFORE),
        "{:?}",
        t.admitted
    );
    // Replication has carried the dead owner's keys to their successors
    // (what a kill loses beyond the leases is one replication lag, which
    // `owner_kill_9_with_replicas_loses_at_most_the_lag` measures).
    let of_dead: Vec<String> = keys
        .iter()
        .filter(|k| k.starts_with("proc-2"))
        .cloned()
        .collect();
    common::eventually("replicas current", Duration::from_secs(10), || async {
        for k in &of_dead {
            let mut current = false;
            for p in &procs[..2] {
                current |= inspect_remaining(p, "kill", k).await == Some(LIMIT - BEFORE);
            }
            if !current {
                return false;
            }
        }
        true
    })
    .await;
    // kill -9 the third owner, and keep offering through the survivors
    // while its death is detected and after.
    procs[2].child.kill().unwrap();
    let started = Instant::now();
    let mut step = 0;
    while started.elapsed() < Duration::from_secs(4) || t.min_offered() < 3 * LIMIT {
        round(&mut t, 2, step).await;
        step += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "owner kill -9 at 90%: {} (bound +{LEASES} per key of the dead owner)",
        t.summary(LIMIT)
    );
    assert_eq!(t.errors, 0, "{:?}", t.first_errors);
    t.assert_per_key(LIMIT, |k| of_dead.iter().any(|d| d == k), LEASES);
}

/// Three processes that seed each other (so any of them can restart).
async fn three(gossip: &[u16]) -> Vec<Proc> {
    let procs: Vec<Proc> = (0..3)
        .map(|i| spawn(&format!("proc-{i}"), gossip[i], gossip, &[]))
        .collect();
    rings_are(
        &procs.iter().collect::<Vec<_>>(),
        &["proc-0", "proc-1", "proc-2"],
        "three ready members",
        Duration::from_secs(30),
    )
    .await;
    procs
}

/// Rolling restart of all three processes with SIGTERM under load (issue 6,
/// row 1): each leaves — announces `leaving`, hands its keys to their new
/// owners — and comes back, pulling its keys again. Load goes to the
/// processes not terminating, as a load balancer drops a terminating
/// endpoint. No errors; per key, the count survives every move.
#[tokio::test(flavor = "multi_thread")]
async fn rolling_restart_with_sigterm_keeps_counts() {
    const LIMIT: i64 = 200;
    /// Per key: what a caller's fallback while rings converge may add (a
    /// forward that found no owner decided on a lease share).
    const CONVERGENCE: i64 = 3;
    let gossip = ports(3);
    let mut procs = three(&gossip).await;
    let ids = ["proc-0", "proc-1", "proc-2"];
    let mut targets = Vec::new();
    for (i, p) in procs.iter().enumerate() {
        targets.push((ids[i].to_string(), channel(p).await));
    }
    let keys = keys_owned_by(&ids, "rolling", 3);
    let load = Load::start("rolling", keys, LIMIT, Duration::from_millis(10), targets);
    load.until_offered(LIMIT / 4).await;
    let mut at = Vec::new();
    for i in 0..3 {
        at.push(load.snapshot().min_offered());
        load.drop_target(ids[i]).await;
        procs[i].terminate();
        procs[i] = spawn(ids[i], gossip[i], &gossip, &[]);
        rings_are(
            &procs.iter().collect::<Vec<_>>(),
            &ids,
            "the restarted member back in every ring",
            Duration::from_secs(30),
        )
        .await;
        load.add_target(ids[i], channel(&procs[i]).await);
    }
    let tally = load.finish(3 * LIMIT).await;
    println!(
        "rolling restart via SIGTERM (restarts began at {at:?} offered per key): {}",
        tally.summary(LIMIT)
    );
    assert_eq!(tally.errors, 0, "{:?}", tally.first_errors);
    tally.assert_per_key(LIMIT, |_| true, CONVERGENCE);
}

/// Owner kill -9 with replicas on, under load mid-way through the keys'
/// limits (issue 6, row 3): the owner's successor holds a replica at most
/// the replication lag behind, and takes over from it. No errors; per key,
/// the survivors' keys exact and the dead owner's within lag × rate.
#[tokio::test(flavor = "multi_thread")]
async fn owner_kill_9_with_replicas_loses_at_most_the_lag() {
    const LIMIT: i64 = 200;
    let gossip = ports(3);
    let mut procs = three(&gossip).await;
    let ids = ["proc-0", "proc-1", "proc-2"];
    let mut targets = Vec::new();
    for (i, p) in procs.iter().enumerate() {
        targets.push((ids[i].to_string(), channel(p).await));
    }
    let keys = keys_owned_by(&ids, "replica", 3);
    let of_dead: Vec<String> = keys
        .iter()
        .filter(|k| k.starts_with("proc-2"))
        .cloned()
        .collect();
    let started = Instant::now();
    let load = Load::start("replica", keys, LIMIT, Duration::from_millis(10), targets);
    load.until_offered(LIMIT / 2).await;
    // Measured just before the kill, from the victim itself.
    let lag =
        Duration::from_micros(procs[2].metric("sluice_replication_lag_microseconds").await as u64);
    let rate = load.snapshot().min_offered() as f64 / started.elapsed().as_secs_f64();
    load.drop_target("proc-2").await;
    procs[2].child.kill().unwrap();
    let killed_at = load.snapshot().min_offered();
    let tally = load.finish(3 * LIMIT).await;
    // Per key of the dead owner: what arrived within the worst lag — the
    // gauge is the last round's; a change waits up to one round
    // (`replicate_interval`) before it is sent — plus the one request a
    // round may be cut in the middle of. (Sampling the gauge alone was
    // flaky: 5 over against a bound of 3 once.)
    let round: Duration = humantime::parse_duration(common::procs::REPLICATE_INTERVAL).unwrap();
    let worst = lag + round;
    let bound = ((worst.as_secs_f64() * rate).ceil() as i64).max(1) + 1;
    println!(
        "owner kill -9 with replicas (at {killed_at} offered per key; replication lag {lag:?} (+{round:?} round), {rate:.0} requests/s per key, bound +{bound} per key of the dead owner): {}",
        tally.summary(LIMIT)
    );
    assert_eq!(tally.errors, 0, "{:?}", tally.first_errors);
    tally.assert_per_key(LIMIT, |k| of_dead.iter().any(|d| d == k), bound);
}
