//! Each algorithm against its exact reference model, decision by decision,
//! on generated traffic with costs, peeks, drains, limit changes, reported
//! consumption and clock steps backwards; and every refusal's retry-after
//! checked against the implementation itself: refused one nanosecond before,
//! admitted exactly at it.

mod reference;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use reference::traffic::{self, BASE, Op, Params};
use reference::{
    FixedWindowModel, GcraModel, LeakyBucketModel, MSpec, Model, Out, SlidingCounterModel,
    SlidingLogModel, TokenBucketModel,
};
use sluice::algorithm::{Algorithm, Cost, Decision, Limited, Outcome};

fn out(d: &Decision) -> Out {
    Out {
        reason: d.reason,
        remaining: d.remaining,
        reset_at: d.reset_at,
        retry_after: d.retry_after,
        delay: d.delay,
    }
}

/// The refused request must be refused at `now + retry − 1` and admitted at
/// `now + retry`, from the state the refusal left.
fn check_retry(key: &Limited, req: Cost, now: u64, retry: u64) -> Result<(), TestCaseError> {
    let spec = *key.spec();
    let probe = Cost {
        drain_over_limit: false,
        ..req
    };
    let at = now + retry;
    // A time past u64::MAX nanoseconds (year 2554) saturates: "never".
    if at < u64::MAX {
        let mut later = key.clone();
        let d = later.decide(&spec, probe, at);
        prop_assert!(
            d.allowed(),
            "not admitted at now + retry_after ({at}): {d:?}"
        );
    }
    if retry > 0 {
        let mut before = key.clone();
        let d = before.decide(&spec, probe, at - 1);
        prop_assert!(
            !d.allowed(),
            "admitted before now + retry_after ({}): {d:?}",
            at - 1
        );
    }
    Ok(())
}

fn run<M: Model>(first: Params, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut now = BASE;
    let mut params = first;
    let mut key = Limited::new(params.spec(), now);
    let mut model_spec: MSpec = params.mspec();
    let mut model = M::new(&model_spec, now);
    for (i, op) in ops.into_iter().enumerate() {
        match op {
            Op::Change(p) => params = p,
            Op::Absorb { step, cost } => {
                now = traffic::advance(now, step, params.span());
                let hits = traffic::hits(cost, model_spec.capacity);
                key.absorb(hits, now);
                if model_spec.limit > 0 {
                    reference::absorb(&mut model, &model_spec, hits, now);
                }
            }
            Op::Decide {
                step,
                cost,
                drain,
                nodelay,
            } => {
                now = traffic::advance(now, step, params.span());
                let spec = params.spec();
                let asked = params.mspec();
                let hits = traffic::hits(cost, asked.capacity);
                let req = Cost {
                    hits,
                    drain_over_limit: drain,
                    nodelay,
                };
                let got = key.decide(&spec, req, now);
                let want = if asked.limit == 0 {
                    // Deny-all answers without touching the key's state.
                    let mut fresh = M::new(&asked, now);
                    reference::decide(&mut fresh, &asked, hits, drain, nodelay, now)
                } else {
                    if model_spec.limit == 0 {
                        model = M::new(&asked, now);
                        model_spec = asked;
                    } else if asked != model_spec {
                        let t = model.settle(&model_spec, now);
                        model.change(&model_spec, &asked, t);
                        model_spec = asked;
                    }
                    reference::decide(&mut model, &model_spec, hits, drain, nodelay, now)
                };
                prop_assert_eq!(
                    out(&got),
                    want,
                    "op {} at {} with {:?}: {:?}",
                    i,
                    now,
                    params,
                    req
                );
                if got.reason == Outcome::LimitExceeded && asked.limit > 0 {
                    check_retry(&key, req, now, got.retry_after.unwrap())?;
                }
            }
        }
    }
    Ok(())
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 600,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn token_bucket_matches_model(
        p in traffic::params(Algorithm::TokenBucket),
        ops in traffic::ops(Algorithm::TokenBucket, true, true),
    ) {
        run::<TokenBucketModel>(p, ops)?;
    }

    #[test]
    fn gcra_matches_model(
        p in traffic::params(Algorithm::Gcra),
        ops in traffic::ops(Algorithm::Gcra, true, true),
    ) {
        run::<GcraModel>(p, ops)?;
    }

    #[test]
    fn leaky_bucket_matches_model(
        p in traffic::params(Algorithm::LeakyBucket),
        ops in traffic::ops(Algorithm::LeakyBucket, true, true),
    ) {
        run::<LeakyBucketModel>(p, ops)?;
    }

    #[test]
    fn fixed_window_matches_model(
        p in traffic::params(Algorithm::FixedWindow),
        ops in traffic::ops(Algorithm::FixedWindow, true, true),
    ) {
        run::<FixedWindowModel>(p, ops)?;
    }

    #[test]
    fn sliding_window_counter_matches_model(
        p in traffic::params(Algorithm::SlidingWindowCounter),
        ops in traffic::ops(Algorithm::SlidingWindowCounter, true, true),
    ) {
        run::<SlidingCounterModel>(p, ops)?;
    }

    #[test]
    fn sliding_window_log_matches_model(
        p in traffic::params(Algorithm::SlidingWindowLog),
        ops in traffic::ops(Algorithm::SlidingWindowLog, true, true),
    ) {
        run::<SlidingLogModel>(p, ops)?;
    }
}
