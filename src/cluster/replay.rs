//! Replay protection for peer tokens.
//!
//! A peer token is a MAC over (sender, run, sequence number, time). The time
//! bounds how long a captured token is worth anything (the token window);
//! within that window, [`Replays`] refuses a token whose (sender, run,
//! sequence) it has already accepted. It keeps, per sender, the highest
//! sequence seen and a bitmap of the [`SLOTS`] below it — the anti-replay
//! window of IPsec — so calls that overtake each other on different
//! connections are accepted once each, in any order, and memory is a fixed
//! few hundred bytes per sender, never per call.
//!
//! A sender's run is its start time in nanoseconds: a restarted sender starts
//! a new window, and a token from an earlier run is refused while the newer
//! run is recent (a recorded run older than the window can no longer be
//! replayed into, so it is simply replaced).

use std::collections::HashMap;

/// Sequence numbers remembered below a sender's highest.
pub const SLOTS: u64 = 1_024;
const WORDS: usize = (SLOTS / 64) as usize;

/// Why a token was refused as a replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// This exact token was accepted before.
    Replayed,
    /// Older than the sender's remembered window or than its latest run.
    Stale,
    /// Every sender slot is held by a sender seen within the window.
    Full,
}

impl Refused {
    pub fn reason(self) -> &'static str {
        match self {
            Refused::Replayed => "replayed peer token",
            Refused::Stale => "stale peer token (an earlier run or sequence)",
            Refused::Full => "too many peer token senders",
        }
    }
}

struct Sender {
    run: u64,
    highest: u64,
    /// Bit `i` set: sequence `highest - i` was accepted.
    seen: [u64; WORDS],
    last_ms: u64,
}

/// The tokens accepted recently, per sender. Bounded by `max_senders`.
pub struct Replays {
    senders: HashMap<String, Sender>,
    max_senders: usize,
    window_ms: u64,
}

impl Replays {
    pub fn new(max_senders: usize, window_ms: u64) -> Replays {
        Replays {
            senders: HashMap::new(),
            max_senders: max_senders.max(1),
            window_ms,
        }
    }

    /// Accept (sender, run, seq) once; `now_ms` is this node's clock.
    pub fn accept(&mut self, sender: &str, run: u64, seq: u64, now_ms: u64) -> Result<(), Refused> {
        let window = self.window_ms;
        if let Some(s) = self.senders.get_mut(sender) {
            let recent = now_ms.saturating_sub(s.last_ms) <= window;
            if run < s.run && recent {
                return Err(Refused::Stale);
            }
            if run != s.run {
                *s = Sender::first(run, seq, now_ms);
                return Ok(());
            }
            s.last_ms = s.last_ms.max(now_ms);
            return s.mark(seq);
        }
        if self.senders.len() >= self.max_senders {
            self.senders
                .retain(|_, s| now_ms.saturating_sub(s.last_ms) <= window);
            if self.senders.len() >= self.max_senders {
                return Err(Refused::Full);
            }
        }
        self.senders
            .insert(sender.to_string(), Sender::first(run, seq, now_ms));
        Ok(())
    }

    pub fn senders(&self) -> usize {
        self.senders.len()
    }
}

impl Sender {
    fn first(run: u64, seq: u64, now_ms: u64) -> Sender {
        let mut seen = [0; WORDS];
        seen[0] = 1;
        Sender {
            run,
            highest: seq,
            seen,
            last_ms: now_ms,
        }
    }

    fn mark(&mut self, seq: u64) -> Result<(), Refused> {
        if seq > self.highest {
            self.shift(seq - self.highest);
            self.highest = seq;
            self.seen[0] |= 1;
            return Ok(());
        }
        let back = self.highest - seq;
        if back >= SLOTS {
            return Err(Refused::Stale);
        }
        let (word, bit) = ((back / 64) as usize, back % 64);
        if self.seen[word] & (1 << bit) != 0 {
            return Err(Refused::Replayed);
        }
        self.seen[word] |= 1 << bit;
        Ok(())
    }

    /// Move every remembered bit `by` places older (bit 0 = the highest).
    fn shift(&mut self, by: u64) {
        if by >= SLOTS {
            self.seen = [0; WORDS];
            return;
        }
        let (words, bits) = ((by / 64) as usize, (by % 64) as u32);
        for i in (0..WORDS).rev() {
            let from = i.checked_sub(words);
            let hi = from.map_or(0, |f| self.seen[f] << bits);
            let lo = match (from.and_then(|f| f.checked_sub(1)), bits) {
                (Some(f), b) if b > 0 => self.seen[f] >> (64 - b),
                _ => 0,
            };
            self.seen[i] = hi | lo;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn each_token_once_in_any_order() {
        let mut r = Replays::new(10, 10_000);
        assert_eq!(r.accept("a", 1, 5, 0), Ok(()));
        assert_eq!(r.accept("a", 1, 5, 0), Err(Refused::Replayed));
        assert_eq!(r.accept("a", 1, 3, 0), Ok(()));
        assert_eq!(r.accept("a", 1, 3, 0), Err(Refused::Replayed));
        assert_eq!(r.accept("a", 1, 7, 0), Ok(()));
        assert_eq!(r.accept("a", 1, 5, 0), Err(Refused::Replayed));
        assert_eq!(r.accept("a", 1, 6, 0), Ok(()));
        // Another sender has its own window.
        assert_eq!(r.accept("b", 1, 5, 0), Ok(()));
        // Beyond the remembered slots: refused, not accepted twice.
        assert_eq!(r.accept("a", 1, 7 + SLOTS, 0), Ok(()));
        assert_eq!(r.accept("a", 1, 7, 0), Err(Refused::Stale));
    }

    #[test]
    fn a_new_run_replaces_an_old_one_and_old_runs_are_refused() {
        let mut r = Replays::new(10, 10_000);
        assert_eq!(r.accept("a", 1, 100, 0), Ok(()));
        assert_eq!(r.accept("a", 2, 0, 5), Ok(()));
        assert_eq!(r.accept("a", 1, 101, 6), Err(Refused::Stale));
        // Once the newer run is older than the window, an earlier run's
        // token cannot be inside the window either: it is a new start.
        assert_eq!(r.accept("a", 1, 7, 20_000), Ok(()));
    }

    #[test]
    fn bounded_senders() {
        let mut r = Replays::new(2, 1_000);
        assert_eq!(r.accept("a", 1, 0, 0), Ok(()));
        assert_eq!(r.accept("b", 1, 0, 0), Ok(()));
        assert_eq!(r.accept("c", 1, 0, 500), Err(Refused::Full));
        assert_eq!(r.accept("c", 1, 0, 2_000), Ok(()));
        assert_eq!(r.senders(), 1);
    }

    proptest! {
        /// Whatever the order (reordered within the slots), each sequence
        /// number is accepted exactly once.
        #[test]
        fn exactly_once(order in Just((0..300u64).collect::<Vec<_>>()).prop_shuffle(),
                        dup in proptest::collection::vec(0..300usize, 0..100)) {
            let mut r = Replays::new(4, u64::MAX);
            let mut accepted = std::collections::HashSet::new();
            let mut calls: Vec<u64> = order.clone();
            for d in dup {
                calls.insert(d.min(calls.len()), order[d]);
            }
            for seq in calls {
                if r.accept("s", 9, seq, 0).is_ok() {
                    prop_assert!(accepted.insert(seq), "{} accepted twice", seq);
                }
            }
            prop_assert_eq!(accepted.len(), 300);
        }
    }
}
