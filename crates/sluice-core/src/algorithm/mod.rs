//! The decision core: pure rate-limiting arithmetic over an injected clock.
//!
//! Nothing here does I/O, reads a clock or allocates on the decision path
//! (except the sliding log, whose state *is* a list). Time is epoch
//! nanoseconds passed in by the caller, so the same state means the same
//! thing on every node, and tests drive time by hand.
//!
//! Rules every algorithm follows (DESIGN §3):
//! - `hits = 0` reads without consuming (a *peek*); it is always admitted.
//! - A request for more than is left is refused and consumes nothing, unless
//!   `drain_over_limit`, which empties what is left.
//! - A cost above the capacity can never pass: refused with
//!   [`Outcome::CostExceedsCapacity`] and no retry-after. `limit = 0` makes the
//!   capacity 0, so it denies everything.
//! - `retry_after` is the *earliest* time the same request would be admitted
//!   (after any drain): refused one nanosecond before it, admitted exactly at it.
//! - `now` is raised to the state's last update, so a clock stepping back
//!   never refunds.
//! - A changed limit or algorithm keeps what was consumed (in whole tokens,
//!   rounded up), not what was left.
//! - No floats. Products are of two `u64`s in `u128`; refill rounds down,
//!   retry-after rounds up.

mod arith;
pub mod calendar;
mod fixed_window;
mod gcra;
mod leaky_bucket;
mod meter;
mod parts;
mod sliding_log;
mod sliding_window;
mod spec;
mod token_bucket;

pub use calendar::CalendarUnit;
pub use fixed_window::FixedWindow;
pub use gcra::Gcra;
pub use leaky_bucket::LeakyBucket;
pub use meter::{Flow, Meter};
pub use parts::StateParts;
pub use sliding_log::SlidingLog;
pub use sliding_window::SlidingWindow;
pub use spec::{Algorithm, Bounds, DEFAULT_MAX_LOG_ENTRIES, MAX_DURATION, Period, Spec, SpecError};
pub use token_bucket::TokenBucket;

/// Nanoseconds since the Unix epoch.
pub type Nanos = u64;

/// One request against a key: its cost and behaviour flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cost {
    /// Cost of the request; 0 reads without consuming.
    pub hits: u64,
    /// On refusal, consume whatever is left (`remaining` becomes 0).
    pub drain_over_limit: bool,
    /// Leaky bucket only: admit at once instead of returning a `delay`.
    pub nodelay: bool,
}

impl Cost {
    /// A plain request of `hits`.
    pub fn hits(hits: u64) -> Cost {
        Cost {
            hits,
            drain_over_limit: false,
            nodelay: false,
        }
    }
}

/// Why a decision came out as it did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    WithinLimit,
    LimitExceeded,
    /// The cost is larger than the capacity: it can never pass.
    CostExceedsCapacity,
}

/// The answer to one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub reason: Outcome,
    /// The configured limit (per period).
    pub limit: u64,
    /// Whole hits still available after this decision, rounded down.
    pub remaining: u64,
    /// When the key is back to a fresh state (bucket full, window over).
    pub reset_at: Nanos,
    /// On [`Outcome::LimitExceeded`]: nanoseconds from `now` until the same
    /// request would be admitted.
    pub retry_after: Option<Nanos>,
    /// Leaky bucket: how long the caller should wait before acting, so the
    /// output is smooth. 0 for every other algorithm and with `nodelay`.
    pub delay: Nanos,
}

impl Decision {
    pub fn allowed(&self) -> bool {
        self.reason == Outcome::WithinLimit
    }
}

/// What each algorithm's state provides; [`decide`] builds the common rules
/// (peek, capacity, drain, retry-after) on top of it once.
pub(crate) trait Arithmetic: Clone + Sized {
    /// A state with nothing consumed.
    fn fresh(spec: &Spec, now: Nanos) -> Self;
    /// Bring the state to `max(now, last update)` (refill, roll windows,
    /// drop expired entries) and return that effective time.
    fn settle(&mut self, spec: &Spec, now: Nanos) -> Nanos;
    /// Would `hits` (≤ capacity) be admitted at the settled time `t`?
    fn fits(&self, spec: &Spec, hits: u64, t: Nanos) -> bool;
    /// Consume `hits` at `t` without checking (saturating; may go into debt).
    fn take(&mut self, spec: &Spec, hits: u64, t: Nanos);
    /// Consume whatever is left at `t`.
    fn drain(&mut self, spec: &Spec, t: Nanos);
    /// Earliest time at which `hits` (≤ capacity, not fitting now) fits.
    fn earliest(&self, spec: &Spec, hits: u64, t: Nanos) -> Nanos;
    /// Whole hits available at `t`, rounded down.
    fn remaining(&self, spec: &Spec, t: Nanos) -> u64;
    /// When the state becomes indistinguishable from fresh.
    fn reset_at(&self, spec: &Spec, t: Nanos) -> Nanos;
    /// How long an admitted request should wait (leaky bucket only).
    fn delay(&self, _spec: &Spec, _t: Nanos) -> Nanos {
        0
    }
    /// Consumption at `t` in whole tokens, rounded up (for conversions).
    fn consumed(&self, spec: &Spec, t: Nanos) -> u64;
    /// Consumption at `now`, as after settling, leaving the state as it
    /// is. The default settles a copy; a state whose copy is dear (the
    /// sliding log's queue) answers in place, since eviction asks this of
    /// every key its hand passes.
    fn consumed_at(&self, spec: &Spec, now: Nanos) -> u64 {
        let mut s = self.clone();
        let t = s.settle(spec, now);
        s.consumed(spec, t)
    }
    /// A state at `t` that has consumed `tokens`.
    fn with_consumed(spec: &Spec, tokens: u64, t: Nanos) -> Self {
        let mut s = Self::fresh(spec, t);
        s.take(spec, tokens, t);
        s
    }
    /// The same key under a changed limit of the same algorithm (`self` is
    /// settled at `t` under `old`). Keeps what was consumed.
    fn rescale(&self, old: &Spec, new: &Spec, t: Nanos) -> Self {
        Self::with_consumed(new, self.consumed(old, t), t)
    }
    /// Combine two copies of one lineage: the more consumed wins.
    fn merge(&mut self, other: &Self, spec: &Spec);
}

/// A boxed state (the sliding log's) is its state's arithmetic.
impl<A: Arithmetic> Arithmetic for Box<A> {
    fn fresh(spec: &Spec, now: Nanos) -> Self {
        Box::new(A::fresh(spec, now))
    }
    fn settle(&mut self, spec: &Spec, now: Nanos) -> Nanos {
        (**self).settle(spec, now)
    }
    fn fits(&self, spec: &Spec, hits: u64, t: Nanos) -> bool {
        (**self).fits(spec, hits, t)
    }
    fn take(&mut self, spec: &Spec, hits: u64, t: Nanos) {
        (**self).take(spec, hits, t)
    }
    fn drain(&mut self, spec: &Spec, t: Nanos) {
        (**self).drain(spec, t)
    }
    fn earliest(&self, spec: &Spec, hits: u64, t: Nanos) -> Nanos {
        (**self).earliest(spec, hits, t)
    }
    fn remaining(&self, spec: &Spec, t: Nanos) -> u64 {
        (**self).remaining(spec, t)
    }
    fn reset_at(&self, spec: &Spec, t: Nanos) -> Nanos {
        (**self).reset_at(spec, t)
    }
    fn delay(&self, spec: &Spec, t: Nanos) -> Nanos {
        (**self).delay(spec, t)
    }
    fn consumed(&self, spec: &Spec, t: Nanos) -> u64 {
        (**self).consumed(spec, t)
    }
    fn consumed_at(&self, spec: &Spec, now: Nanos) -> u64 {
        (**self).consumed_at(spec, now)
    }
    fn with_consumed(spec: &Spec, tokens: u64, t: Nanos) -> Self {
        Box::new(A::with_consumed(spec, tokens, t))
    }
    fn rescale(&self, old: &Spec, new: &Spec, t: Nanos) -> Self {
        Box::new((**self).rescale(old, new, t))
    }
    fn merge(&mut self, other: &Self, spec: &Spec) {
        (**self).merge(other, spec)
    }
}

/// The common decision rules over one algorithm's arithmetic.
fn decide<A: Arithmetic>(state: &mut A, spec: &Spec, req: Cost, now: Nanos) -> Decision {
    let t = state.settle(spec, now);
    let answer = |state: &A, reason, retry_after, delay| Decision {
        reason,
        limit: spec.limit(),
        remaining: state.remaining(spec, t),
        reset_at: state.reset_at(spec, t),
        retry_after,
        delay,
    };
    if req.hits == 0 {
        return answer(state, Outcome::WithinLimit, None, 0);
    }
    if req.hits > spec.capacity() {
        if req.drain_over_limit {
            state.drain(spec, t);
        }
        return answer(state, Outcome::CostExceedsCapacity, None, 0);
    }
    if state.fits(spec, req.hits, t) {
        let delay = if req.nodelay { 0 } else { state.delay(spec, t) };
        state.take(spec, req.hits, t);
        return answer(state, Outcome::WithinLimit, None, delay);
    }
    if req.drain_over_limit {
        state.drain(spec, t);
    }
    // After any drain: the answer is about the state the caller leaves.
    let retry_after = state.earliest(spec, req.hits, t).saturating_sub(now);
    answer(state, Outcome::LimitExceeded, Some(retry_after), 0)
}

/// The state of one key, for whichever algorithm it uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    TokenBucket(TokenBucket),
    Gcra(Gcra),
    LeakyBucket(LeakyBucket),
    FixedWindow(FixedWindow),
    SlidingWindowCounter(SlidingWindow),
    /// Boxed: its queue is out of line anyway, and inline it would size
    /// every other key's state (48 bytes, not 32) in the store.
    SlidingWindowLog(Box<SlidingLog>),
}

macro_rules! dispatch {
    ($state:expr, $s:ident => $body:expr) => {
        match $state {
            State::TokenBucket($s) => $body,
            State::Gcra($s) => $body,
            State::LeakyBucket($s) => $body,
            State::FixedWindow($s) => $body,
            State::SlidingWindowCounter($s) => $body,
            State::SlidingWindowLog($s) => $body,
        }
    };
}

impl State {
    /// Bytes the state holds outside its own struct (the store's byte
    /// budget counts them): only the sliding log's box and queue; every
    /// other state is a few words inline.
    pub fn heap_bytes(&self) -> usize {
        match self {
            State::SlidingWindowLog(log) => size_of::<SlidingLog>() + log.heap_bytes(),
            _ => 0,
        }
    }

    /// A state with nothing consumed, for `spec`'s algorithm.
    pub fn fresh(spec: &Spec, now: Nanos) -> State {
        State::with_consumed(spec, 0, now)
    }

    /// A state at `now` that has consumed `tokens` whole tokens (seeding a
    /// key from a remaining count seen elsewhere).
    pub fn with_consumed(spec: &Spec, tokens: u64, now: Nanos) -> State {
        match spec.algorithm() {
            Algorithm::TokenBucket => {
                State::TokenBucket(TokenBucket::with_consumed(spec, tokens, now))
            }
            Algorithm::Gcra => State::Gcra(Gcra::with_consumed(spec, tokens, now)),
            Algorithm::LeakyBucket => {
                State::LeakyBucket(LeakyBucket::with_consumed(spec, tokens, now))
            }
            Algorithm::FixedWindow => {
                State::FixedWindow(FixedWindow::with_consumed(spec, tokens, now))
            }
            Algorithm::SlidingWindowCounter => {
                State::SlidingWindowCounter(SlidingWindow::with_consumed(spec, tokens, now))
            }
            Algorithm::SlidingWindowLog => {
                State::SlidingWindowLog(Box::new(SlidingLog::with_consumed(spec, tokens, now)))
            }
        }
    }

    /// Which algorithm this state belongs to.
    pub fn algorithm(&self) -> Algorithm {
        match self {
            State::TokenBucket(_) => Algorithm::TokenBucket,
            State::Gcra(_) => Algorithm::Gcra,
            State::LeakyBucket(_) => Algorithm::LeakyBucket,
            State::FixedWindow(_) => Algorithm::FixedWindow,
            State::SlidingWindowCounter(_) => Algorithm::SlidingWindowCounter,
            State::SlidingWindowLog(_) => Algorithm::SlidingWindowLog,
        }
    }

    /// Decide one request. `spec` must be the spec this state was built
    /// for (use [`Limited`] to follow limit changes).
    pub fn decide(&mut self, spec: &Spec, req: Cost, now: Nanos) -> Decision {
        debug_assert_eq!(self.algorithm(), spec.algorithm());
        dispatch!(self, s => decide(s, spec, req, now))
    }

    /// Add consumption reported by an edge (fallback and tiered reports):
    /// `hits` admitted elsewhere at `at`. Unlike [`State::decide`] it never
    /// refuses: the hits were already spent, so the key may go into debt.
    pub fn absorb(&mut self, spec: &Spec, hits: u64, at: Nanos) {
        if hits == 0 {
            return;
        }
        dispatch!(self, s => {
            let t = s.settle(spec, at);
            s.take(spec, hits, t);
        })
    }

    /// Combine with another copy of the same key's lineage (replica, handoff,
    /// duplicated batch): the more-consumed state wins. Commutative,
    /// associative and idempotent. Both must be of `spec`'s algorithm;
    /// a mismatched `other` is converted first.
    pub fn merge(&mut self, other: &State, spec: &Spec) {
        match (self, other) {
            (State::TokenBucket(a), State::TokenBucket(b)) => a.merge(b, spec),
            (State::Gcra(a), State::Gcra(b)) => a.merge(b, spec),
            (State::LeakyBucket(a), State::LeakyBucket(b)) => a.merge(b, spec),
            (State::FixedWindow(a), State::FixedWindow(b)) => a.merge(b, spec),
            (State::SlidingWindowCounter(a), State::SlidingWindowCounter(b)) => a.merge(b, spec),
            (State::SlidingWindowLog(a), State::SlidingWindowLog(b)) => a.merge(b, spec),
            (a, b) => {
                // Different algorithms cannot share a lineage under one spec;
                // keep the more consumed, judged at the later of their times.
                let t = a.last_update().max(b.last_update());
                if b.consumed(spec, t) > a.consumed(spec, t) {
                    *a = State::with_consumed(spec, b.consumed(spec, t), t);
                }
            }
        }
    }

    /// Consumption at `now` in whole tokens, rounded up.
    pub fn consumed(&self, spec: &Spec, now: Nanos) -> u64 {
        dispatch!(self, s => s.consumed_at(spec, now))
    }

    /// Whole hits available at `now`, without consuming.
    pub fn remaining(&self, spec: &Spec, now: Nanos) -> u64 {
        self.clone().decide(spec, Cost::hits(0), now).remaining
    }

    /// The time after which this state is the same as a fresh one, so the
    /// store may forget it.
    pub fn idle_after(&self, spec: &Spec) -> Nanos {
        dispatch!(self, s => s.reset_at(spec, self.last_update()))
    }

    /// The latest time this state has recorded (GCRA records none: 0).
    pub fn last_update(&self) -> Nanos {
        match self {
            State::TokenBucket(m) => m.last(),
            State::LeakyBucket(m) => m.last(),
            State::Gcra(_) => 0,
            State::FixedWindow(w) => w.start(),
            State::SlidingWindowCounter(w) => w.start(),
            State::SlidingWindowLog(l) => l.newest().unwrap_or(0),
        }
    }

    /// Move in place to a changed spec `to` at `now` (`from` is the spec
    /// it was built for), keeping what was consumed — except under a
    /// deny-all `from`, under which nothing was consumed (see
    /// [`Limited::decide`]).
    pub fn follow(&mut self, from: &Spec, to: &Spec, now: Nanos) {
        *self = if from.limit() == 0 {
            State::fresh(to, now)
        } else {
            self.convert(from, to, now)
        };
    }

    /// Convert to a changed spec at `now`, keeping what was consumed.
    ///
    /// Same algorithm: the state is kept exactly where the algorithm allows
    /// (buckets with an unchanged duration keep their fixed-point
    /// consumption, windows their counts, the log its entries). Otherwise
    /// consumption moves as whole tokens, rounded up, placed at `now`.
    pub fn convert(&self, from: &Spec, to: &Spec, now: Nanos) -> State {
        if from == to {
            return self.clone();
        }
        macro_rules! rescale {
            ($($variant:ident),*) => {
                match self.clone() {
                    $(State::$variant(mut s) if from.algorithm() == to.algorithm() => {
                        let t = s.settle(from, now);
                        State::$variant(s.rescale(from, to, t))
                    })*
                    mut other => {
                        let (t, consumed) = dispatch!(&mut other, s => {
                            let t = s.settle(from, now);
                            (t, s.consumed(from, t))
                        });
                        State::with_consumed(to, consumed, t)
                    }
                }
            };
        }
        rescale!(
            TokenBucket,
            Gcra,
            LeakyBucket,
            FixedWindow,
            SlidingWindowCounter,
            SlidingWindowLog
        )
    }
}

/// A key's spec together with its state: follows limit and algorithm
/// changes as requests arrive with a new spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limited {
    spec: Spec,
    state: State,
}

impl Limited {
    pub fn new(spec: Spec, now: Nanos) -> Limited {
        Limited {
            state: State::fresh(&spec, now),
            spec,
        }
    }

    /// A key with a state moved from elsewhere (its spec and state must match).
    pub fn from_state(spec: Spec, state: State) -> Limited {
        debug_assert_eq!(spec.algorithm(), state.algorithm());
        Limited { spec, state }
    }

    /// Join another copy of this key's state (same spec): the more consumed wins.
    pub fn merge_state(&mut self, other: &State) {
        self.state.merge(other, &self.spec);
    }

    /// A key that has already consumed `tokens` at `now`.
    pub fn seeded(spec: Spec, tokens: u64, now: Nanos) -> Limited {
        Limited {
            state: State::with_consumed(&spec, tokens, now),
            spec,
        }
    }

    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    pub fn state(&self) -> &State {
        &self.state
    }

    /// Decide under `spec`. A changed spec takes effect at once and keeps
    /// what was consumed. A `limit = 0` spec denies without converting, so
    /// consumption survives a temporary deny-all; a key that only ever had a
    /// deny-all spec has consumed nothing and starts fresh under a real one.
    pub fn decide(&mut self, spec: &Spec, req: Cost, now: Nanos) -> Decision {
        if spec.limit() == 0 {
            let mut probe = State::fresh(spec, now);
            return probe.decide(spec, req, now);
        }
        if *spec != self.spec {
            self.state.follow(&self.spec, spec, now);
            self.spec = *spec;
        }
        self.state.decide(&self.spec, req, now)
    }

    /// See [`State::absorb`]. Nothing can be admitted under a deny-all spec,
    /// so there is nothing to absorb into one.
    pub fn absorb(&mut self, hits: u64, at: Nanos) {
        if self.spec.limit() > 0 {
            self.state.absorb(&self.spec, hits, at);
        }
    }

    /// Forget all consumption (an admin reset).
    pub fn reset(&mut self, now: Nanos) {
        self.state = State::fresh(&self.spec, now);
    }
}
