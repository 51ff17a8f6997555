//! `OnUnavailable::Local`: an in-process token bucket per counter, holding a
//! share of the limit, for when Sluice cannot be reached. Bounded: at most
//! `MAX_KEYS` counters (the least recently used goes first).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{Check, Limit};

const MAX_KEYS: usize = 10_000;

/// Local limits for policy checks (the client does not know a policy's
/// limit unless told): policy name → (limit, period).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LocalLimits(HashMap<String, (u64, Duration)>);

impl LocalLimits {
    pub fn new() -> LocalLimits {
        LocalLimits::default()
    }

    /// `policy` allows `limit` per `per` (the client keeps a share of it).
    pub fn with(mut self, policy: &str, limit: u64, per: Duration) -> LocalLimits {
        self.0.insert(policy.into(), (limit, per));
        self
    }
}

struct Bucket {
    tokens: f64,
    at: Instant,
    used: Instant,
}

/// The buckets. A std Mutex: held for a few arithmetic operations, never
/// across an await.
pub(crate) struct Buckets {
    share: f64,
    limits: LocalLimits,
    buckets: Mutex<HashMap<(String, String), Bucket>>,
}

impl Buckets {
    pub(crate) fn new(share: f64, limits: LocalLimits) -> Buckets {
        Buckets {
            share: if share.is_finite() {
                share.clamp(0.0, 1.0)
            } else {
                0.0
            },
            limits,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Admit or refuse `check` on its bucket: (allowed, local limit,
    /// remaining, period).
    pub(crate) fn decide(&self, check: &Check) -> (bool, u64, u64, Duration) {
        let (limit, per) = match &check.limit {
            Limit::Inline { limit, per } => (*limit, *per),
            Limit::Policy(p) => match self.limits.0.get(p) {
                Some(l) => *l,
                None => return (false, 0, 0, Duration::from_secs(1)),
            },
        };
        let capacity = (limit as f64 * self.share).floor();
        let rate = capacity / per.as_secs_f64().max(1e-9);
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let id = (check.name.clone(), check.key.clone());
        if !buckets.contains_key(&id) && buckets.len() >= MAX_KEYS {
            let oldest = buckets
                .iter()
                .min_by_key(|(_, b)| b.used)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                buckets.remove(&k);
            }
        }
        let b = buckets.entry(id).or_insert(Bucket {
            tokens: capacity,
            at: now,
            used: now,
        });
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * rate).min(capacity);
        b.at = now;
        b.used = now;
        let cost = check.hits as f64;
        let allowed = b.tokens >= cost;
        if allowed {
            b.tokens -= cost;
        }
        (allowed, capacity as u64, b.tokens.max(0.0) as u64, per)
    }
}
