//! One key's entry in the store: its limit and state (the `Limited` of the
//! decision core) plus what the store needs around it — lineage counters for
//! replication (`reset_gen`, `version`), usage for top-keys, and the CLOCK
//! bit for eviction.

use std::sync::Arc;

use crate::algorithm::{Cost, Decision, Limited, Nanos, Spec, State};

/// How long a reset key is remembered after its last use, though its state
/// is fresh: longer than any report is retried or replica lags while the
/// nodes can reach each other (reports every `report_interval`, replicas
/// every `replicate_interval`, a handoff within `handoff_timeout`).
pub const RESET_MEMORY: Nanos = 10 * 60 * 1_000_000_000;

/// A stored key (DESIGN §3: `{algorithm, limit, duration or window, burst,
/// reset_gen, version, state}` — the spec carries the first four).
#[derive(Clone, Debug)]
pub struct Entry {
    limited: Limited,
    /// Incremented by each admin reset; state from an older `reset_gen`
    /// never overrides a newer one.
    reset_gen: u64,
    /// Incremented by each decision that may change the state.
    version: u64,
    hits: u64,
    refusals: u64,
    last_seen: Nanos,
    /// Set on every access, cleared by the eviction hand: a key used since
    /// the hand last passed gets a second chance.
    referenced: bool,
    /// The last consumption report applied from each edge, by sequence
    /// number, so a retried report is never counted twice. One slot per
    /// edge that reported this key: bounded by the cluster's size.
    reports: Vec<(Arc<str>, u64)>,
    /// In the store's replication queue (so it is queued once).
    queued: bool,
    /// A copy of a count kept elsewhere: a replica held for its owner, a
    /// state merged from a peer, or a key this node passed on to a new
    /// owner (marked in the same lock step as the snapshot it sent). Another
    /// node may have counted past it, so a node that owns the key again
    /// takes the current state from the others before deciding on it (a
    /// max-merge afterwards would lose one side's increments). Cleared when
    /// this node counts as owner.
    copy: bool,
}

/// A key's whole entry as it travels between nodes (replicas, handoff,
/// pulls): DESIGN §3's `{algorithm, limit, duration or window, burst,
/// reset_gen, version, state}` plus the report slots that make a retried
/// lease report harmless wherever the key goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub spec: Spec,
    pub reset_gen: u64,
    pub version: u64,
    pub state: State,
    pub reports: Vec<(Arc<str>, u64)>,
}

impl Snapshot {
    /// About how many bytes this snapshot takes on the wire (pages and
    /// batches are bounded by it).
    pub fn approx_bytes(&self) -> usize {
        let state = match &self.state {
            State::SlidingWindowLog(log) => 16 * log.entries().count(),
            _ => 32,
        };
        64 + state
            + self
                .reports
                .iter()
                .map(|(edge, _)| edge.len() + 12)
                .sum::<usize>()
    }
}

/// A read-only view of an entry, for admin answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    pub spec: Spec,
    pub remaining: u64,
    pub reset_at: Nanos,
    pub reset_gen: u64,
    pub version: u64,
    pub hits: u64,
    pub refusals: u64,
    pub last_seen: Nanos,
}

/// Bytes an `Arc<T>` of `len` payload bytes allocates: the strong and weak
/// counts, then the payload, padded to the counts' alignment.
const fn arc_bytes(len: usize) -> usize {
    (2 * size_of::<usize>() + len).next_multiple_of(align_of::<usize>())
}

/// The bytes every entry holds in place, whatever its state: its slot in the
/// hash table (key pointer and entry, plus hashbrown's one control byte per
/// slot) and its slot in the eviction queue.
pub const INLINE_BYTES: usize = size_of::<(Arc<[u8]>, Entry)>() + 1 + size_of::<Arc<[u8]>>();

impl Entry {
    /// The bytes this entry holds under a key of `key_len` bytes — what
    /// `limits.max_memory` budgets. One function, so a change of the
    /// entry's layout changes the budget with it:
    ///
    /// - [`INLINE_BYTES`]: the table slot and the eviction queue slot;
    /// - the key's `Arc<[u8]>` allocation (one per key: the table, the
    ///   eviction queue and the replication queue share it);
    /// - the state's own allocation (the sliding log's queue, by capacity);
    /// - the report slots: the `Vec`'s capacity, and each edge id's
    ///   `Arc<str>` (counted here even when several keys share one edge's
    ///   id: the budget errs high, never low).
    ///
    /// Not counted: the table's spare capacity (hashbrown grows by doubling
    /// at 7/8 full, so between 1/7 and 9/7 of a slot more per key: for keys
    /// with small states `max_keys` bounds it), and the replication queue
    /// (one slot per changed key, only in a cluster, drained every
    /// `replicate_interval`).
    pub fn footprint(&self, key_len: usize) -> usize {
        let reports = self.reports.capacity() * size_of::<(Arc<str>, u64)>()
            + self
                .reports
                .iter()
                .map(|(edge, _)| arc_bytes(edge.len()))
                .sum::<usize>();
        INLINE_BYTES + arc_bytes(key_len) + self.limited.state().heap_bytes() + reports
    }

    pub fn new(spec: Spec, now: Nanos) -> Entry {
        Entry::from_limited(Limited::new(spec, now), now)
    }

    /// An entry that has consumed `tokens` already at `now`.
    pub fn seeded(spec: Spec, tokens: u64, now: Nanos) -> Entry {
        Entry::from_limited(Limited::seeded(spec, tokens, now), now)
    }

    fn from_limited(limited: Limited, now: Nanos) -> Entry {
        Entry {
            limited,
            reset_gen: 0,
            version: 0,
            hits: 0,
            refusals: 0,
            last_seen: now,
            referenced: true,
            reports: Vec::new(),
            queued: false,
            copy: false,
        }
    }

    /// An entry rebuilt from a snapshot.
    pub fn from_snapshot(s: Snapshot, now: Nanos) -> Entry {
        let mut e = Entry::from_limited(Limited::from_state(s.spec, s.state), now);
        e.reset_gen = s.reset_gen;
        e.version = s.version;
        e.reports = s.reports;
        e
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            spec: *self.limited.spec(),
            reset_gen: self.reset_gen,
            version: self.version,
            state: self.limited.state().clone(),
            reports: self.reports.clone(),
        }
    }

    /// Merge another copy of this key's lineage: a newer `reset_gen` wins
    /// outright, an older one is ignored; within one generation the
    /// more-consumed state wins (a join: order and repeats do not matter),
    /// under the spec of the higher version.
    pub fn merge(&mut self, other: Snapshot, now: Nanos) {
        if other.reset_gen < self.reset_gen {
            return;
        }
        if other.reset_gen > self.reset_gen {
            // A reset elsewhere: its state replaces this one — but this
            // entry stays what it was here (a copy stays a copy: a merge
            // never makes a node the owner of a count).
            *self = Entry {
                hits: self.hits,
                refusals: self.refusals,
                // The reset is news here: remembered from now (RESET_MEMORY).
                last_seen: self.last_seen.max(now),
                queued: self.queued,
                copy: self.copy,
                ..Entry::from_snapshot(other, now)
            };
            return;
        }
        let mine = *self.limited.spec();
        let (spec, theirs) = if other.spec == mine {
            (mine, other.state)
        } else if (other.version, format!("{:?}", other.spec)) > (self.version, format!("{mine:?}"))
        {
            // Their spec is newer: move ours to it, then join.
            let converted = self.limited.state().convert(&mine, &other.spec, now);
            self.limited = Limited::from_state(other.spec, converted);
            (other.spec, other.state)
        } else {
            (mine, other.state.convert(&other.spec, &mine, now))
        };
        self.limited.merge_state(&theirs);
        debug_assert_eq!(*self.limited.spec(), spec);
        self.version = self.version.max(other.version);
        for (edge, seq) in other.reports {
            match self.reports.iter_mut().find(|(e, _)| *e == edge) {
                Some((_, last)) => *last = (*last).max(seq),
                None => self.reports.push((edge, seq)),
            }
        }
    }

    /// Pass the count on: mark this entry a copy and return its snapshot,
    /// in one step (the caller holds the entry's lock), and whether it was
    /// this node's own count until now.
    pub fn take(&mut self) -> (Snapshot, bool) {
        let was_own = !std::mem::replace(&mut self.copy, true);
        (self.snapshot(), was_own)
    }

    /// The count now lives elsewhere (see the `copy` field).
    pub fn mark_copy(&mut self) {
        self.copy = true;
    }

    /// This node counted on the key as its owner.
    pub fn counted_here(&mut self) {
        self.copy = false;
    }

    pub fn is_copy(&self) -> bool {
        self.copy
    }

    pub fn is_queued(&self) -> bool {
        self.queued
    }

    /// Mark as queued for replication; true if it was not already.
    pub fn enqueue(&mut self) -> bool {
        !std::mem::replace(&mut self.queued, true)
    }

    /// Leave the replication queue.
    pub fn dequeue(&mut self) {
        self.queued = false;
    }

    /// Take in an authoritative figure seen from elsewhere: `tokens`
    /// consumed at `at` under `reset_gen` (an owner's answer, at an edge).
    /// A newer reset generation replaces the state; within one, the more
    /// consumed wins — what this edge spent on its lease and has not yet
    /// reported is not in the owner's figure, and must not be forgotten (or
    /// the next lease would grant it again).
    pub fn observe(&mut self, spec: Spec, tokens: u64, reset_gen: u64, at: Nanos) {
        if reset_gen < self.reset_gen {
            return;
        }
        let seen = Limited::seeded(spec, tokens, at);
        if reset_gen > self.reset_gen || *self.limited.spec() != spec {
            self.limited = seen;
            self.reset_gen = reset_gen;
        } else {
            self.limited.merge_state(seen.state());
        }
        self.version += 1;
        self.last_seen = self.last_seen.max(at);
        self.referenced = true;
    }

    /// Add consumption an edge reports, once per `(edge, seq)`: a report
    /// with a sequence number at or below the last applied from that edge is
    /// a retry and changes nothing. Returns whether it was applied.
    pub fn absorb_report(&mut self, edge: &str, seq: u64, hits: u64, at: Nanos) -> bool {
        match self.reports.iter_mut().find(|(e, _)| &**e == edge) {
            Some((_, last)) if *last >= seq => return false,
            Some((_, last)) => *last = seq,
            None => self.reports.push((Arc::from(edge), seq)),
        }
        self.limited.absorb(hits, at);
        self.version += 1;
        self.last_seen = self.last_seen.max(at);
        self.referenced = true;
        true
    }

    /// Count `hits` as consumed at `at`, with no report slot (see
    /// [`crate::store::Store::fold`]).
    pub fn fold(&mut self, hits: u64, at: Nanos) {
        self.limited.absorb(hits, at);
        self.version += 1;
    }

    pub fn reset_gen(&self) -> u64 {
        self.reset_gen
    }

    pub fn decide(&mut self, spec: &Spec, req: Cost, now: Nanos) -> Decision {
        let d = self.limited.decide(spec, req, now);
        self.last_seen = self.last_seen.max(now);
        self.referenced = true;
        if req.hits > 0 {
            self.version += 1;
            self.hits = self.hits.saturating_add(req.hits);
            if !d.allowed() {
                self.refusals += 1;
            }
        }
        d
    }

    pub fn reset(&mut self, now: Nanos) {
        self.limited.reset(now);
        self.reset_gen += 1;
        self.version += 1;
        self.last_seen = self.last_seen.max(now);
    }

    /// After this time forgetting the entry loses nothing: its state equals
    /// a fresh one — and, for a key an operator reset, the reset is
    /// [`RESET_MEMORY`] old. Its state is fresh the moment it is reset, but
    /// its reset generation is what refuses consumption from before the
    /// reset (a lease report, a replica) that arrives after it; a fresh
    /// entry would count it again. (Found by `reset_is_the_admin_way_to_
    /// refill_a_key`: the sweeper removed the key between the reset and the
    /// inspect, once in seven runs.)
    pub fn idle_after(&self) -> Nanos {
        let fresh = self.limited.state().idle_after(self.limited.spec());
        if self.reset_gen > 0 {
            fresh.max(self.last_seen.saturating_add(RESET_MEMORY))
        } else {
            fresh
        }
    }

    /// How far from fresh, in millionths of the capacity: the eviction score
    /// (lowest goes first, so a key at 99% of a monthly quota goes last).
    pub fn fullness_ppm(&self, now: Nanos) -> u64 {
        let spec = self.limited.spec();
        let used = u128::from(self.limited.state().consumed(spec, now));
        match u128::from(spec.capacity()) {
            0 => 0,
            cap => u64::try_from(used * 1_000_000 / cap).unwrap_or(u64::MAX),
        }
    }

    /// Clear the CLOCK bit; return whether it was set.
    pub fn take_reference(&mut self) -> bool {
        std::mem::replace(&mut self.referenced, false)
    }

    pub fn hits(&self) -> u64 {
        self.hits
    }

    pub fn refusals(&self) -> u64 {
        self.refusals
    }

    pub fn last_seen(&self) -> Nanos {
        self.last_seen
    }

    pub fn view(&self, now: Nanos) -> View {
        let spec = *self.limited.spec();
        let mut state = self.limited.state().clone();
        let peek = state.decide(&spec, Cost::hits(0), now);
        View {
            spec,
            remaining: peek.remaining,
            reset_at: peek.reset_at,
            reset_gen: self.reset_gen,
            version: self.version,
            hits: self.hits,
            refusals: self.refusals,
            last_seen: self.last_seen,
        }
    }
}
