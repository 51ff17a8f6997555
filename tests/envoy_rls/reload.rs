//! What makes the rules watcher reload: a rule file whose content changed,
//! nothing else (seen before: a log file in the rules directory made it
//! reload 29 times in 2 s while idle).

use super::common::metric_sum;
use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn rules_reload_only_when_a_rule_file_changes() {
    let body = |n: u32| {
        format!(
            "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: {n}}}\n"
        )
    };
    let dir = rules_files("reload-only", &[("edge.yaml", &body(1))]);
    let n = serve(&dir, |_| {}).await;
    // (loaded, unchanged) so far.
    let reloads = || async {
        let (_, text) = n.http_get("/metrics").await;
        let count = |result: &str| {
            metric_sum(
                &text,
                &format!("sluice_config_reloads_total{{result=\"{result}\"}}"),
            )
        };
        (count("ok"), count("unchanged"))
    };
    // A log written next to the rules, again and again…
    for i in 0..30 {
        std::fs::write(dir.join("sluice.log"), format!("line {i}\n")).unwrap();
    }
    // …then the same rules written again: the watcher sees that one (it is a
    // rule file) after the log's events, and finds nothing new.
    std::fs::write(dir.join("edge.yaml"), body(1)).unwrap();
    eventually(
        "the rewrite to be seen",
        Duration::from_secs(10),
        || async {
            let (ok, unchanged) = reloads().await;
            ok + unchanged >= 1.0
        },
    )
    .await;
    let (ok, unchanged) = reloads().await;
    assert_eq!(
        ok, 0.0,
        "the log file or an unchanged rewrite reloaded the rules"
    );
    assert!(unchanged >= 1.0);
    // A change reloads.
    std::fs::write(dir.join("edge.yaml"), body(7)).unwrap();
    eventually("the changed rules", Duration::from_secs(10), || async {
        let r = ask(&n, vec![desc(&[("k", "probe")])], 0).await;
        r.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit)
            == Some(7)
    })
    .await;
    assert_eq!(reloads().await.0, 1.0);
    std::fs::remove_dir_all(&dir).ok();
}
