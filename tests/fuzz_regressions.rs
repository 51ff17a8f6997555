//! Every kept fuzz input, replayed on stable: the seeds each target starts
//! from (`fuzz/seeds/<target>/`) and every input that once crashed one
//! (`fuzz/regressions/<target>/`, added with the fix). The harness bodies
//! are the fuzz targets' own (`sluice::fuzzing`), so a regression here is a
//! finding there.

use std::path::Path;

type Target = fn(&[u8]);

const TARGETS: [(&str, Target); 4] = [
    ("check_request", sluice::fuzzing::check_request),
    ("config_text", sluice::fuzzing::config_text),
    ("rules_text", sluice::fuzzing::rules_text),
    ("algorithm", sluice::fuzzing::algorithm),
];

fn inputs(kind: &str, target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz")
        .join(kind)
        .join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut files: Vec<_> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.file_name().is_some_and(|n| n != ".gitkeep"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| (p.display().to_string(), std::fs::read(&p).unwrap()))
        .collect()
}

/// Every kept input passes its harness: each one that panics (an invariant
/// broken, or a crash) is named, all of them, not only the first.
#[test]
fn kept_inputs_pass_every_harness() {
    let mut replayed = 0;
    let mut failed = Vec::new();
    for (target, run) in TARGETS {
        let seeds = inputs("seeds", target);
        assert!(!seeds.is_empty(), "fuzz/seeds/{target} has a seed");
        let regressions = inputs("regressions", target);
        assert!(
            !regressions.is_empty(),
            "fuzz/regressions/{target} keeps its edge cases"
        );
        for (name, data) in seeds.iter().chain(regressions.iter()) {
            if std::panic::catch_unwind(|| run(data)).is_err() {
                failed.push(name.clone());
            }
            replayed += 1;
        }
    }
    assert!(failed.is_empty(), "harnesses panic on {failed:#?}");
    assert!(replayed >= TARGETS.len());
}

/// The hand-built regressions reach what they were built for: each
/// algorithm input makes a valid spec and runs steps, each check request
/// decodes and has items validated and decided — an input the harness
/// drops early would pass whatever the invariants.
#[test]
fn regressions_reach_the_arithmetic() {
    for (name, data) in inputs("regressions", "algorithm") {
        let steps = sluice::fuzzing::algorithm_steps(&data);
        assert!(steps >= 3, "{name}: {steps} steps");
    }
    for (name, data) in inputs("regressions", "check_request") {
        let decided = sluice::fuzzing::check_request_decided(&data);
        assert!(decided >= 1, "{name}: nothing decided");
    }
}

/// The harnesses are not vacuous: a seed is decoded and reaches the
/// validation, the config seed loads, the rules seed parses.
#[test]
fn seeds_reach_the_code_under_test() {
    use prost::Message;
    let check = &inputs("seeds", "check_request")[0].1;
    let decoded = sluice::proto::v1::CheckRequest::decode(&check[..]).unwrap();
    assert_eq!(decoded.requests.len(), 3);
    let config = String::from_utf8(inputs("seeds", "config_text")[0].1.clone()).unwrap();
    let (c, policies) = sluice::policy::from_toml_str(&config).unwrap();
    assert_eq!(c.limits.max_batch, 10);
    // The seed's `[policies.month]`, as written there.
    let month = policies.get("month").expect("the month policy loads");
    assert_eq!(
        month.spec.algorithm(),
        sluice::algorithm::Algorithm::FixedWindow
    );
    assert_eq!(month.spec.limit(), i64::MAX as u64);
    assert_eq!(
        month.spec.period(),
        sluice::algorithm::Period::Calendar(sluice::algorithm::CalendarUnit::Month)
    );
    assert_eq!(
        month.on_owner_unreachable,
        sluice::policy::OnOwnerUnreachable::Deny
    );
    let rules = String::from_utf8(inputs("seeds", "rules_text")[0].1.clone()).unwrap();
    let mut r = sluice::policy::rules::Rules::default();
    r.add(&rules, &sluice::algorithm::Bounds::default())
        .unwrap();
    assert_eq!(r.domains(), 1);
}
