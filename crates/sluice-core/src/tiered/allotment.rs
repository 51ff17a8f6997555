//! One edge's allotment of one key: its tokens, the pace that brings
//! more due over its life, and the demand meter that sizes the next ask.
//! The table of them is [`super::Allotments`].

use super::NANOS_PER_SEC;
use super::mul_div;
use crate::algorithm::Nanos;

/// An edge's allotment of one key, and its demand meter.
#[derive(Clone, Debug)]
pub(super) struct Allotment {
    pub(super) tokens: u64,
    pub(super) expires: Nanos,
    /// Tokens to give back with the next ask, never to spend: what came
    /// back from elsewhere ([`Allotments::keep`]) — possibly of an earlier
    /// grant, or of one whose grantor has since released it.
    pub(super) returned: u64,
    /// Its tokens count in `Allotments::held`: it has not been seen
    /// expired since its last grant.
    pub(super) counted: bool,
    /// The owner had nothing to grant: refuse here until then rather than
    /// send every refusal of an exhausted hot key across the network.
    pub(super) empty_until: Nanos,
    /// The last grant's paced tokens (they come due evenly from
    /// `pace_from` until `expires`), and how many of them have come due
    /// (moved into `tokens`).
    pub(super) paced: u64,
    pub(super) pace_from: Nanos,
    pub(super) pace_until: Nanos,
    pub(super) due: u64,
    /// The paced ask in flight (0: none), and until when it is at most:
    /// other asks meanwhile are not paced ([`super::Allotments::spend`]).
    pub(super) pace_ask: u64,
    pub(super) pace_asked_until: Nanos,
    /// Part of its pace was passed on ([`Allotments::take`]) until then:
    /// an ask before it is not sent. The grantor replaces this edge's pace
    /// with the next grant's, and the pace passed on still comes due
    /// elsewhere until then — the two would add up beyond the rate.
    pub(super) lent_until: Nanos,
    /// The last grant's size, and whether its running low was signalled.
    pub(super) last_grant: u64,
    pub(super) low_signalled: bool,
    /// Hits seen in the current second, and the rate of the last full one.
    pub(super) window_start: Nanos,
    pub(super) window_hits: u64,
    pub(super) rate: u64,
}

impl Allotment {
    /// Nothing to spend, no demand seen yet.
    pub(super) fn empty(now: Nanos) -> Allotment {
        Allotment {
            tokens: 0,
            expires: now,
            returned: 0,
            counted: false,
            empty_until: 0,
            paced: 0,
            pace_from: now,
            pace_until: now,
            due: 0,
            pace_ask: 0,
            pace_asked_until: 0,
            lent_until: 0,
            last_grant: 0,
            low_signalled: false,
            window_start: now,
            window_hits: 0,
            rate: 0,
        }
    }

    /// Move the paced tokens due by `now` into `tokens`; returns how many
    /// moved.
    pub(super) fn come_due(&mut self, now: Nanos) -> u64 {
        if self.paced == self.due {
            return 0;
        }
        let at = now.min(self.pace_until);
        let span = self.pace_until.saturating_sub(self.pace_from);
        let due = if span == 0 {
            self.paced
        } else {
            mul_div(
                self.paced,
                u128::from(at.saturating_sub(self.pace_from)),
                u128::from(span),
            )
        };
        let moved = due.saturating_sub(self.due);
        self.due = self.due.max(due);
        self.tokens = self.tokens.saturating_add(moved);
        moved
    }

    /// Paced tokens not yet due.
    pub(super) fn not_due(&self) -> u64 {
        self.paced - self.due
    }

    /// How long until `hits` tokens are in hand, if the pace brings them
    /// before the allotment ends.
    pub(super) fn due_in(&self, hits: u64, now: Nanos) -> Option<Nanos> {
        let short = hits.saturating_sub(self.tokens);
        if short > self.not_due() || now >= self.pace_until {
            return None;
        }
        let span = self.pace_until.saturating_sub(self.pace_from);
        // The instant `due` reaches `due + short`: ceil(span × due' / paced).
        let target = u128::from(self.due + short) * u128::from(span);
        let at = self
            .pace_from
            .saturating_add(u64::try_from(target.div_ceil(u128::from(self.paced.max(1)))).ok()?);
        Some(at.saturating_sub(now).max(1))
    }

    /// Count `hits` of demand (admitted here or not) at `now`.
    pub(super) fn see(&mut self, hits: u64, now: Nanos) {
        let second = NANOS_PER_SEC as u64;
        let elapsed = now.saturating_sub(self.window_start);
        if elapsed >= second {
            // The last window's rate; a gap of more than a window is idle.
            self.rate = if elapsed >= 2 * second {
                0
            } else {
                self.window_hits
            };
            self.window_start = now;
            self.window_hits = 0;
        }
        self.window_hits = self.window_hits.saturating_add(hits);
    }

    /// Hits per second: the last full second's, or this one's so far if
    /// higher (so a burst is seen before its second ends), over at least
    /// 100 ms (one hit is not a rate of millions).
    pub(super) fn demand(&self, now: Nanos) -> u64 {
        let elapsed = now
            .saturating_sub(self.window_start)
            .max(NANOS_PER_SEC as u64 / 10);
        let so_far = mul_div(self.window_hits, NANOS_PER_SEC, u128::from(elapsed));
        self.rate.max(so_far)
    }
}
