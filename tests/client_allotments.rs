//! Allotments decided inside apps (issue 23), with real processes: three
//! `sluice serve` nodes, and apps that are `sluice bench --target client
//! --mode tiered` processes (the client library, allotments on), one per
//! node, offering one hot token-bucket key 10× its limit.
//!
//! Asserted per key (each test has its own): admissions within 5% of the
//! exact token bucket's, most decisions made in the apps with no call, a
//! busy app's share of the admissions within 10 points of its share of the
//! demand. The kill test's apps are clients in this process, each on a
//! runtime of its own: dropping one with its runtime is what `kill -9` does
//! to an app (no report after it), and its admissions stay countable.
//! A lost acknowledgement is a report sent twice: applied once.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::procs::{BIN, Proc, ports, rings_are, spawn};
use common::under;
use sluice::proto::v1 as pb;
use sluice::proto::v1::allotments_client::AllotmentsClient;

/// The hot key's limit per second (its burst too).
const RATE: u64 = 1_000;

/// One test at a time: each runs three nodes and three loaded apps, and
/// two at once on a 2-core machine would measure each other.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
const SECONDS: u64 = 4;

async fn three_nodes() -> Vec<Proc> {
    let g = ports(3);
    let procs: Vec<Proc> = (0..3)
        .map(|i| spawn(&format!("allot-{i}"), g[i], &g, &[]))
        .collect();
    rings_are(
        &procs.iter().collect::<Vec<_>>(),
        &["allot-0", "allot-1", "allot-2"],
        "three nodes in every ring",
        Duration::from_secs(30),
    )
    .await;
    procs
}

/// The exact token bucket's admissions over `seconds`: its burst once,
/// then the rate.
fn exact(seconds: f64) -> f64 {
    RATE as f64 * (1.0 + seconds)
}

/// One app: `sluice bench` through the client library against `node`,
/// offering `rate` checks/s of `name`/hot in tiered mode.
fn app(node: &Proc, name: &str, rate: u64) -> std::process::Child {
    Command::new(BIN)
        .args(["bench", "--target", "client", "--mode", "tiered"])
        .args(["--addr", &node.grpc, "--name", name, "--dist", "hot"])
        .args(["--keys", "1", "--limit", &RATE.to_string()])
        .args(["--duration-ms", "1000", "--concurrency", "64"])
        .args(["--duration", &format!("{SECONDS}s")])
        .args(["--rate", &rate.to_string(), "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("sluice bench starts")
}

/// What one app's run says.
#[derive(Debug)]
struct AppRun {
    decisions: u64,
    admitted: u64,
    unavailable: u64,
    in_process: u64,
    seconds: f64,
    /// Asks sent, grants received, and tokens granted (printed).
    #[allow(dead_code)]
    asks: u64,
    grants: u64,
    #[allow(dead_code)]
    granted: u64,
    /// Reports sent (carried by asks, or calls of their own), and those
    /// carried by asks.
    reports: u64,
    carried: u64,
}

fn finish(child: std::process::Child) -> AppRun {
    let out = child.wait_with_output().expect("sluice bench runs");
    assert!(out.status.success(), "sluice bench: {:?}", out.status);
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().expect("a summary");
    let v: serde_json::Value = serde_json::from_str(line).expect("a JSON summary");
    let n = |p: &str| v.pointer(p).and_then(|x| x.as_u64()).unwrap_or(0);
    AppRun {
        decisions: n("/decisions"),
        admitted: n("/admitted"),
        unavailable: n("/unavailable"),
        in_process: n("/client/in_process_admitted") + n("/client/in_process_refused"),
        seconds: v["seconds"].as_f64().unwrap_or(0.0),
        asks: n("/client/asks"),
        grants: n("/client/grants"),
        granted: n("/client/granted_tokens"),
        reports: n("/client/reports_sent"),
        carried: n("/client/reports_carried"),
    }
}

/// Run one app per node at `rates`, together; their runs and the span
/// they covered (the longest run plus the spread of their starts).
async fn hammer(nodes: &[Proc], name: &str, rates: &[u64]) -> (Vec<AppRun>, f64) {
    let started = Instant::now();
    let mut children = Vec::new();
    for (node, rate) in nodes.iter().zip(rates) {
        children.push(app(node, name, *rate));
    }
    let spread = started.elapsed().as_secs_f64();
    let runs: Vec<AppRun> =
        tokio::task::spawn_blocking(move || children.into_iter().map(finish).collect::<Vec<_>>())
            .await
            .unwrap();
    let longest = runs.iter().map(|r| r.seconds).fold(0.0, f64::max);
    (runs, longest + spread)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_apps_on_one_hot_key_stay_within_five_percent_and_decide_in_process() {
    let _one = ONE_AT_A_TIME.lock().await;
    let nodes = three_nodes().await;
    let each = 10 * RATE / 3;
    let (runs, span) = hammer(&nodes, "even", &[each, each, each]).await;
    let admitted: u64 = runs.iter().map(|r| r.admitted).sum();
    let decisions: u64 = runs.iter().map(|r| r.decisions).sum();
    let in_process: u64 = runs.iter().map(|r| r.in_process).sum();
    let reference = exact(span);
    let over = admitted as f64 / reference - 1.0;
    println!(
        "even: admitted {admitted} of {decisions} over {span:.2} s, exact {reference:.0}: {:+.1}%; in process {:.1}%; apps {runs:?}",
        over * 100.0,
        100.0 * in_process as f64 / decisions as f64
    );
    for r in &runs {
        assert_eq!(r.unavailable, 0, "every app was answered: {r:?}");
        assert!(r.decisions > 0, "{r:?}");
        // Spending rides on the next ask, or goes once its allotment ends:
        // a report call of its own at most per grant (a few more for
        // resends), not one per 50 ms tick (80 in this run).
        assert!(r.carried > 0, "reports ride on asks: {r:?}");
        assert!(
            r.reports - r.carried <= r.grants + 3,
            "a report call per allotment at most: {r:?}"
        );
    }
    assert!(over <= 0.05, "over-admission {:.1}% > 5%", over * 100.0);
    assert!(
        admitted as f64 >= 0.8 * reference,
        "the limit is served: admitted {admitted} of exact {reference:.0}"
    );
    // Most decisions made in the apps (84% seen; the bench's figure).
    assert!(
        in_process * 3 >= decisions * 2,
        "most decisions in the apps: {in_process} of {decisions}"
    );
    let owner_side: f64 = {
        let mut sum = 0.0;
        for n in &nodes {
            sum += n.metric("sluice_client_allotment_reports_total").await;
        }
        sum
    };
    assert!(owner_side > 0.0, "the apps' reports reached the nodes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_app_gets_its_share_of_the_demand() {
    let _one = ONE_AT_A_TIME.lock().await;
    let nodes = three_nodes().await;
    let total = 10 * RATE;
    let rates = [total * 8 / 10, total / 10, total / 10];
    let (runs, span) = hammer(&nodes, "uneven", &rates).await;
    let admitted: u64 = runs.iter().map(|r| r.admitted).sum();
    let share = runs[0].admitted as f64 / admitted.max(1) as f64;
    let reference = exact(span);
    let over = admitted as f64 / reference - 1.0;
    println!(
        "uneven 80/10/10: busy app's share {:.1}%, admitted {admitted}, exact {reference:.0}: {:+.1}%; apps {runs:?}",
        share * 100.0,
        over * 100.0
    );
    assert!(over <= 0.05, "over-admission {:.1}% > 5%", over * 100.0);
    assert!(
        (0.70..=0.90).contains(&share),
        "the busy app's share {:.1}% is not 80% ± 10 points",
        share * 100.0
    );
}

/// An app on a runtime of its own: dropping both is a `kill -9` of it.
struct InProcessApp {
    runtime: tokio::runtime::Runtime,
    client: sluice_client::Client,
    admitted: std::sync::Arc<std::sync::atomic::AtomicU64>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl InProcessApp {
    fn start(node: &Proc, name: &str, rate: u64) -> InProcessApp {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let client = {
            // The client's tasks (its reporter) run on the app's runtime.
            let _app = runtime.enter();
            sluice_client::Client::builder([node.grpc.clone()])
                .deadline(Duration::from_millis(100))
                .build()
                .unwrap()
        };
        let admitted = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let check =
            sluice_client::Check::inline(name, "hot", RATE, Duration::from_secs(1)).tiered();
        let (c, a, s) = (client.clone(), admitted.clone(), stop.clone());
        runtime.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            while !s.load(Ordering::Relaxed) {
                tick.tick().await;
                if let Ok(d) = c.check(&check).await
                    && d.allowed
                {
                    a.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        InProcessApp {
            runtime,
            client,
            admitted,
            stop,
        }
    }

    fn admitted(&self) -> u64 {
        self.admitted.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stop calling, report what was spent, and end.
    fn finish(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let flushed = self
            .runtime
            .block_on(self.client.flush_allotments(Duration::from_secs(5)));
        assert!(flushed, "a live app's spending is acknowledged");
        self.admitted()
    }

    /// `kill -9`: nothing more is decided or reported. Returns what it
    /// admitted, and what it had spent and not had acknowledged.
    fn kill(self) -> (u64, u64) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let unreported = self.client.allotment_stats().map_or(0, |s| {
            s.unreported_hits.load(std::sync::atomic::Ordering::Relaxed)
        });
        let admitted = self.admitted();
        self.runtime.shutdown_background();
        (admitted, unreported)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_killed_mid_load_loses_at_most_its_unreported_allotment() {
    let _one = ONE_AT_A_TIME.lock().await;
    let nodes = three_nodes().await;
    let each = 10 * RATE / 3;
    let started = Instant::now();
    let apps: Vec<InProcessApp> = nodes
        .iter()
        .map(|n| InProcessApp::start(n, "killed", each))
        .collect();
    let mut apps = apps.into_iter();
    let doomed = apps.next().unwrap();
    let survivors: Vec<InProcessApp> = apps.collect();
    tokio::time::sleep(Duration::from_secs(SECONDS / 2)).await;
    let (killed_admitted, unreported) = tokio::task::spawn_blocking(move || doomed.kill())
        .await
        .unwrap();
    // Its node releases what it held once the grace is over (nothing
    // stays promised to an app that is gone).
    common::eventually(
        "the killed app's allotment released",
        Duration::from_secs(5),
        || async {
            nodes[0]
                .metric("sluice_client_allotment_outstanding_tokens")
                .await
                == 0.0
        },
    )
    .await;
    let rest = Duration::from_secs(SECONDS).saturating_sub(started.elapsed());
    tokio::time::sleep(rest).await;
    let span = started.elapsed().as_secs_f64();
    let survived: u64 = tokio::task::spawn_blocking(move || {
        survivors.into_iter().map(InProcessApp::finish).sum::<u64>()
    })
    .await
    .unwrap();
    let admitted = killed_admitted + survived;
    let reference = exact(span);
    let over = admitted as f64 - reference;
    println!(
        "kill: admitted {admitted} (the killed app {killed_admitted}, {unreported} unreported at the kill), exact {reference:.0} over {span:.2} s: {:+.0}",
        over
    );
    assert!(
        over <= 0.05 * reference + unreported as f64,
        "over-admission {over:.0} beyond 5% of {reference:.0} plus the killed app's unreported {unreported}"
    );
    assert!(
        admitted as f64 >= 0.8 * reference,
        "the survivors are still served: {admitted} of {reference:.0}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_resent_after_a_lost_acknowledgement_counts_once() {
    let _one = ONE_AT_A_TIME.lock().await;
    let nodes = three_nodes().await;
    let mut rpc = AllotmentsClient::new(common::procs::channel(&nodes[0]).await);
    let spent = |hits: i64| pb::RateLimitRequest {
        hits: Some(hits),
        mode: pb::Mode::Tiered as i32,
        ..common::inline("dup", "k", 100, 3_600_000)
    };
    // The app is passed an allotment of the key first: a node counts
    // reports only of keys it passed on to that app. Its ask spends 1.
    let allot = rpc
        .allot(pb::AllotRequest {
            client_id: "app-under-test".into(),
            request: Some(spent(1)),
            demand: 100,
            unused: 0,
            unreported: None,
            pace: true,
            report: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(under(allot.response.as_ref().unwrap()), "{allot:?}");
    let report = pb::ReportRequest {
        client_id: "app-under-test".into(),
        sequence: 1,
        spent: vec![spent(30)],
    };
    let first = rpc.report(report.clone()).await.unwrap().into_inner();
    assert_eq!(first.ack, pb::Ack::Applied as i32, "{first:?}");
    // The acknowledgement was lost: the app resends it unchanged.
    let again = rpc.report(report).await.unwrap().into_inner();
    assert_eq!(again.ack, pb::Ack::Duplicate as i32, "{again:?}");
    let next = pb::ReportRequest {
        client_id: "app-under-test".into(),
        sequence: 2,
        spent: vec![spent(5)],
    };
    let next = rpc.report(next).await.unwrap().into_inner();
    assert_eq!(next.ack, pb::Ack::Applied as i32, "{next:?}");
    // A report carried by an ask (which spends 1 more) is applied once
    // too: its resend on its own is a duplicate.
    let carried = pb::ReportRequest {
        client_id: String::new(),
        sequence: 3,
        spent: vec![spent(7)],
    };
    let ask = |report: pb::ReportRequest| pb::AllotRequest {
        client_id: "app-under-test".into(),
        request: Some(spent(1)),
        demand: 100,
        unused: 0,
        unreported: Some(7),
        pace: true,
        report: Some(report),
    };
    let allot = rpc.allot(ask(carried.clone())).await.unwrap().into_inner();
    assert!(under(allot.response.as_ref().unwrap()), "{allot:?}");
    let ack = allot.report.expect("the carried report's acknowledgement");
    assert_eq!(ack.ack, pb::Ack::Applied as i32, "{ack:?}");
    let again = rpc
        .report(pb::ReportRequest {
            client_id: "app-under-test".into(),
            ..carried
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.ack, pb::Ack::Duplicate as i32, "{again:?}");
    // One naming another app is refused by field, the ask still decided.
    let foreign = pb::ReportRequest {
        client_id: "another-app".into(),
        sequence: 4,
        spent: vec![spent(1)],
    };
    let allot = rpc.allot(ask(foreign)).await.unwrap().into_inner();
    let ack = allot.report.expect("the foreign report's answer");
    assert_eq!(ack.ack, pb::Ack::Invalid as i32, "{ack:?}");
    assert_eq!(ack.errors[0].field, "report.client_id", "{ack:?}");
    assert!(allot.response.is_some_and(|r| r.error.is_none()));
    // The owner counts 1 + 35 + 1 + 7 + 1, not 1 + 65 + 1 + 14 + 1: an
    // exact check of 0 hits reads what is left of the key.
    let read = pb::RateLimitRequest {
        hits: Some(0),
        ..common::inline("dup", "k", 100, 3_600_000)
    };
    let mut check = nodes[1].client().await;
    common::eventually(
        "the reports absorbed by the owner",
        Duration::from_secs(5),
        || {
            let mut check = check.clone();
            let read = read.clone();
            async move {
                let r = common::procs::check(&mut check, vec![read.clone()]).await;
                r.is_ok_and(|r| r[0].remaining == 55)
            }
        },
    )
    .await;
    let r = common::procs::check(&mut check, vec![read]).await.unwrap();
    assert_eq!(r[0].remaining, 55, "applied once: {:?}", r[0]);
    // A key this app was never passed here is booked all the same: the
    // node cannot tell it from spending of a grant made before it
    // restarted, and acknowledging spending unbooked would lose it.
    let stranger = rpc
        .report(pb::ReportRequest {
            client_id: "app-under-test".into(),
            sequence: 5,
            spent: vec![pb::RateLimitRequest {
                hits: Some(50),
                ..common::inline("dup", "other", 100, 3_600_000)
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stranger.ack, pb::Ack::Applied as i32);
    assert!(stranger.errors.is_empty(), "{stranger:?}");
    let other = pb::RateLimitRequest {
        hits: Some(0),
        ..common::inline("dup", "other", 100, 3_600_000)
    };
    remaining_becomes(&nodes[1], other, 50).await;
    // A report naming no client, or numbered 0, is refused by field.
    let bad = rpc
        .report(pb::ReportRequest {
            client_id: "app-under-test".into(),
            sequence: 0,
            spent: vec![spent(1)],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(bad.ack, pb::Ack::Invalid as i32);
    assert_eq!(bad.errors[0].field, "sequence");
    let nameless = rpc
        .report(pb::ReportRequest {
            client_id: String::new(),
            sequence: 1,
            spent: vec![],
        })
        .await
        .unwrap_err();
    assert!(nameless.message().contains("client_id"), "{nameless:?}");
}

/// Wait until an exact read (0 hits) of `read`'s key on `node` says
/// `want` are left.
async fn remaining_becomes(node: &Proc, read: pb::RateLimitRequest, want: i64) {
    let mut check = node.client().await;
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let r = common::procs::check(&mut check, vec![read.clone()]).await;
        let left = r.ok().map(|r| r[0].remaining);
        if left == Some(want) {
            return;
        }
        assert!(Instant::now() < until, "{want} left, last read {left:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// An app's ask of `restart`/`key`: one hit checked, `unused`
/// given back, `unreported` spent and not yet acknowledged.
fn ask(key: &str, unused: u64, unreported: Option<u64>) -> pb::AllotRequest {
    pb::AllotRequest {
        client_id: "app-under-test".into(),
        request: Some(pb::RateLimitRequest {
            hits: Some(1),
            mode: pb::Mode::Tiered as i32,
            ..common::inline("restart", key, 100, 3_600_000)
        }),
        demand: 100,
        unused,
        unreported,
        pace: false,
        report: None,
    }
}

/// The app's report of `hits` spent, numbered `seq`.
fn spent(key: &str, seq: u64, hits: i64) -> pb::ReportRequest {
    pb::ReportRequest {
        client_id: "app-under-test".into(),
        sequence: seq,
        spent: vec![pb::RateLimitRequest {
            hits: Some(hits),
            mode: pb::Mode::Tiered as i32,
            ..common::inline("restart", key, 100, 3_600_000)
        }],
    }
}

fn read_restart_key(key: &str) -> pb::RateLimitRequest {
    pb::RateLimitRequest {
        hits: Some(0),
        ..common::inline("restart", key, 100, 3_600_000)
    }
}

/// A key of `restart` that allot-1 owns: allot-0, which the tests restart
/// or let leave, is only the edge that passed it on (an owner leaving
/// counts what it promised as spent, a bound of its own).
fn key_of_allot_1() -> String {
    common::load::keys_owned_by(&["allot-0", "allot-1", "allot-2"], "restart", 1)[1].clone()
}

/// Issue 39, item 1: an app spent a sub-grant of a node that then
/// restarted (kill -9). The app's report reaches the new run, which never
/// granted it: it is booked and counted by the owner, not acknowledged
/// and dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spending_reported_to_a_node_restarted_since_it_granted_is_counted() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut nodes = three_nodes().await;
    let key = key_of_allot_1();
    let mut rpc = AllotmentsClient::new(common::procs::channel(&nodes[0]).await);
    let granted = rpc.allot(ask(&key, 0, None)).await.unwrap().into_inner();
    assert!(under(granted.response.as_ref().unwrap()), "{granted:?}");
    remaining_becomes(&nodes[1], read_restart_key(&key), 99).await;
    // kill -9, and the same node back on the same gossip port.
    assert!(nodes[0].signal("KILL"));
    nodes[0].child.wait().unwrap();
    let seeds: Vec<u16> = nodes.iter().map(|p| p.gossip).collect();
    nodes[0] = spawn("allot-0", seeds[0], &seeds, &[]);
    rings_are(
        &nodes.iter().collect::<Vec<_>>(),
        &["allot-0", "allot-1", "allot-2"],
        "the restarted node back in every ring",
        Duration::from_secs(30),
    )
    .await;
    let mut rpc = AllotmentsClient::new(common::procs::channel(&nodes[0]).await);
    let ack = rpc.report(spent(&key, 1, 30)).await.unwrap().into_inner();
    assert_eq!(ack.ack, pb::Ack::Applied as i32, "{ack:?}");
    assert!(ack.errors.is_empty(), "booked, not refused: {ack:?}");
    assert!(
        nodes[0]
            .metric("sluice_client_allotment_unknown_spent")
            .await
            >= 30.0
    );
    remaining_becomes(&nodes[1], read_restart_key(&key), 69).await;
}

/// Issue 39, item 1: a leaving node passes no allotment on to apps, and
/// books their last reports before its own last report round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaving_node_passes_nothing_on_and_carries_apps_last_reports() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut nodes = three_nodes().await;
    let key = key_of_allot_1();
    let mut rpc = AllotmentsClient::new(common::procs::channel(&nodes[0]).await);
    // Asks until the node holds an allotment of the key and passes part
    // of it on (its first ask of the owner may come back with none yet).
    let mut granted = 0;
    let mut checked = 0;
    for _ in 0..50 {
        let a = rpc.allot(ask(&key, 0, Some(0))).await.unwrap().into_inner();
        assert!(under(a.response.as_ref().unwrap()), "{a:?}");
        checked += 1;
        if a.granted > 0 {
            granted = a.granted;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(granted > 0, "an allotment passed on: {checked} asks");
    assert!(nodes[0].signal("TERM"));
    let http = nodes[0].http.clone();
    common::eventually("the node leaving", Duration::from_secs(5), || {
        let http = http.clone();
        async move { common::http_get(&format!("http://{http}/readyz")).await.0 == 503 }
    })
    .await;
    // Leaving: the app spent all it was passed and asks again — its check
    // is decided, nothing is passed on.
    let a = rpc
        .allot(ask(&key, 0, Some(granted)))
        .await
        .unwrap()
        .into_inner();
    assert!(under(a.response.as_ref().unwrap()), "{a:?}");
    checked += 1;
    assert_eq!(a.granted, 0, "a leaving node passes nothing on: {a:?}");
    let ack = rpc
        .report(spent(&key, 1, granted as i64))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ack.ack, pb::Ack::Applied as i32, "{ack:?}");
    assert!(ack.errors.is_empty(), "{ack:?}");
    let exit = nodes[0].child.wait().unwrap();
    assert!(exit.success(), "left cleanly: {exit:?}");
    // Its report round carried what the app spent.
    remaining_becomes(
        &nodes[1],
        read_restart_key(&key),
        100 - checked - granted as i64,
    )
    .await;
}
