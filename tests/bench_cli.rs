//! `sluice bench`, the load generator the benchmarks are measured with: an
//! open-loop run makes every call its schedule holds (none dropped when the
//! generator falls behind, none added), each decided, and reports the
//! generator's own delay beside the latency; a closed-loop run decides what
//! it calls.

mod common;

use common::{config, start};

/// Run `sluice bench --json` with `args` against `grpc`; its summary.
async fn bench(grpc: String, args: &[&str]) -> serde_json::Value {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["bench", "--json", "--addr", &grpc])
            .args(["--keys", "10", "--limit", "1000000"])
            .args(&args)
            .output()
            .expect("sluice runs")
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).expect("--json prints one object")
}

#[tokio::test(flavor = "multi_thread")]
async fn an_open_loop_run_makes_every_scheduled_call() {
    let n = start(config()).await;
    let summary = bench(
        n.node.grpc_addr.to_string(),
        &["--rate", "400", "--duration", "1s", "--concurrency", "8"],
    )
    .await;
    assert_eq!(summary["mode"], "open");
    // 400 a second for one second: calls 0..400, at 2.5 ms apart. The
    // interval is a float turned into nanoseconds, so the last may round
    // to just inside the second: 401.
    let calls = summary["calls"].as_u64().unwrap();
    assert!((400..=401).contains(&calls), "{summary}");
    assert_eq!(summary["decisions"].as_u64(), Some(calls), "{summary}");
    assert_eq!(summary["admitted"].as_u64(), Some(calls), "{summary}");
    assert_eq!(summary["errors"].as_u64(), Some(0), "{summary}");
    let late = &summary["late_us"];
    let latency = &summary["latency_us"];
    for q in ["p50", "p99"] {
        assert!(late[q].as_u64().unwrap() >= 1, "{summary}");
        // A call's latency counts from its intended start, so it includes
        // how late its task started.
        assert!(
            latency[q].as_u64().unwrap() >= late[q].as_u64().unwrap(),
            "{summary}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_closed_loop_run_decides_every_item_of_every_call() {
    let n = start(config()).await;
    let summary = bench(
        n.node.grpc_addr.to_string(),
        &["--duration", "300ms", "--concurrency", "4", "--items", "5"],
    )
    .await;
    assert_eq!(summary["mode"], "closed");
    let calls = summary["calls"].as_u64().unwrap();
    assert!(calls > 0, "{summary}");
    assert_eq!(summary["decisions"].as_u64(), Some(calls * 5), "{summary}");
    assert_eq!(summary["admitted"].as_u64(), Some(calls * 5), "{summary}");
    assert_eq!(summary["errors"].as_u64(), Some(0), "{summary}");
}
