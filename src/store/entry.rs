//! One key's entry in the store: its limit and state (the `Limited` of the
//! decision core) plus what the store needs around it — lineage counters for
//! replication (`reset_gen`, `version`), usage for top-keys, and the CLOCK
//! bit for eviction.

use std::sync::Arc;

use crate::algorithm::{Cost, Decision, Nanos, Spec, State};

/// How long a reset key is remembered after its last use, though its state
/// is fresh: longer than any report is retried or replica lags while the
/// nodes can reach each other (reports every `report_interval`, replicas
/// every `replicate_interval`, a handoff within `handoff_timeout`).
pub const RESET_MEMORY: Nanos = 10 * 60 * 1_000_000_000;

/// A stored key (DESIGN §3: `{algorithm, limit, duration or window, burst,
/// reset_gen, version, state}` — the spec carries the first four).
///
/// Laid out small (88 bytes): the table holds one per key, and the table
/// is most of what a key costs. The spec is shared, the state sized by
/// the largest inline algorithm (the sliding log's is boxed), the report
/// slots boxed (most keys never get a report), the usage counters 32-bit.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The limit the state was built for, shared by the keys that have it
    /// (`specs.rs`). A request under another spec converts the state.
    spec: Arc<Spec>,
    state: State,
    /// Incremented by each admin reset; state from an older `reset_gen`
    /// never overrides a newer one.
    reset_gen: u64,
    /// Incremented by each decision that may change the state.
    version: u64,
    last_seen: Nanos,
    /// Hits and refusals, for the top-key rankings (saturating: a key
    /// past four billion of either is at the top anyway).
    hits: u32,
    refusals: u32,
    /// The last consumption report applied from each edge, by sequence
    /// number, so a retried report is never counted twice. One slot per
    /// edge that reported this key: bounded by the cluster's size.
    reports: Reports,
    /// Set on every access, cleared by the eviction hand: a key used since
    /// the hand last passed gets a second chance.
    referenced: bool,
    /// In the store's replication queue (so it is queued once).
    queued: bool,
    /// `spec` is this key's own copy, not the shared one (the table of
    /// shared specs was full): its bytes are in this key's footprint.
    own_spec: bool,
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

/// The bytes every entry holds in place, whatever its state: its slot in
/// the table (the entry and its key, inline when short) and the index's
/// slot number and control byte (`table.rs`).
pub const INLINE_BYTES: usize = super::table::SLOT_BYTES;

impl Entry {
    /// The bytes this entry holds under a key of `key_len` bytes — what
    /// `limits.max_memory` budgets. One function, so a change of the
    /// entry's layout changes the budget with it:
    ///
    /// - [`INLINE_BYTES`]: the table's slot and index slot;
    /// - a long key's box (a short one is inline);
    /// - the state's own allocation (the sliding log's box and queue, by
    ///   capacity);
    /// - the report slots, if any: their box, the `Vec`'s capacity, and
    ///   each edge id's `Arc<str>` (counted here even when several keys
    ///   share one edge's id: the budget errs high, never low);
    /// - the spec, only when it is the key's own (a shared spec belongs to
    ///   no key, and `specs::MAX_SHARED` bounds them).
    ///
    /// Not counted: the table's spare capacity (its index grows by doubling
    /// at 7/8 full, 5 bytes a slot; its slot array by an eighth), the holes
    /// removed keys leave in the slot array until new keys fill them (at
    /// most the keys a shard once held: `max_keys` bounds them), and the
    /// replication queue (one key copy per changed key, only in a cluster,
    /// drained every `replicate_interval`), and the top-key rankings' own
    /// copies of at most 2 × 200 keys.
    pub fn footprint(&self, key_len: usize) -> usize {
        let spec = if self.own_spec {
            arc_bytes(size_of::<Spec>())
        } else {
            0 // shared: bounded by specs::MAX_SHARED, not by keys
        };
        INLINE_BYTES
            + super::table::key_heap_bytes(key_len)
            + self.state.heap_bytes()
            + self.reports.heap_bytes()
            + spec
    }

    pub fn new(spec: Spec, now: Nanos) -> Entry {
        Entry::with_state(spec, State::fresh(&spec, now), now)
    }

    /// An entry that has consumed `tokens` already at `now`.
    pub fn seeded(spec: Spec, tokens: u64, now: Nanos) -> Entry {
        Entry::with_state(spec, State::with_consumed(&spec, tokens, now), now)
    }

    /// A key with a state of `spec`'s algorithm.
    fn with_state(spec: Spec, state: State, now: Nanos) -> Entry {
        debug_assert_eq!(spec.algorithm(), state.algorithm());
        let (spec, shared) = super::specs::share(&spec);
        Entry {
            spec,
            state,
            reset_gen: 0,
            version: 0,
            hits: 0,
            refusals: 0,
            last_seen: now,
            referenced: true,
            reports: Reports::default(),
            queued: false,
            own_spec: !shared,
            copy: false,
        }
    }

    /// Move to a changed spec (the state already converted to it).
    fn set_spec(&mut self, spec: &Spec) {
        let (spec, shared) = super::specs::share(spec);
        self.spec = spec;
        self.own_spec = !shared;
    }

    /// An entry rebuilt from a snapshot.
    pub fn from_snapshot(s: Snapshot, now: Nanos) -> Entry {
        let mut e = Entry::with_state(s.spec, s.state, now);
        e.reset_gen = s.reset_gen;
        e.version = s.version;
        e.reports = Reports::from(s.reports);
        e
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            spec: *self.spec,
            reset_gen: self.reset_gen,
            version: self.version,
            state: self.state.clone(),
            reports: self.reports.to_vec(),
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
        let mine = *self.spec;
        let theirs = if other.spec == mine {
            other.state
        } else if (other.version, format!("{:?}", other.spec)) > (self.version, format!("{mine:?}"))
        {
            // Their spec is newer: move ours to it, then join.
            self.state = self.state.convert(&mine, &other.spec, now);
            self.set_spec(&other.spec);
            other.state
        } else {
            other.state.convert(&other.spec, &mine, now)
        };
        self.state.merge(&theirs, &self.spec);
        self.version = self.version.max(other.version);
        for (edge, seq) in other.reports {
            self.reports.raise(edge, seq);
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
        let seen = State::with_consumed(&spec, tokens, at);
        if reset_gen > self.reset_gen || *self.spec != spec {
            self.state = seen;
            self.set_spec(&spec);
            self.reset_gen = reset_gen;
        } else {
            self.state.merge(&seen, &self.spec);
        }
        self.version += 1;
        self.last_seen = self.last_seen.max(at);
        self.referenced = true;
    }

    /// Add consumption an edge reports, once per `(edge, seq)`: a report
    /// with a sequence number at or below the last applied from that edge is
    /// a retry and changes nothing (`Err` holds that last).
    pub fn absorb_report(&mut self, edge: &str, seq: u64, hits: u64, at: Nanos) -> Result<(), u64> {
        self.reports.advance(edge, seq)?;
        self.absorb(hits, at);
        self.version += 1;
        self.last_seen = self.last_seen.max(at);
        self.referenced = true;
        Ok(())
    }

    /// Count `hits` as consumed at `at`, with no report slot (see
    /// [`crate::store::Store::fold`]).
    pub fn fold(&mut self, hits: u64, at: Nanos) {
        self.absorb(hits, at);
        self.version += 1;
    }

    /// Count `hits` spent elsewhere (see [`State::absorb`]). Nothing can be
    /// admitted under a deny-all spec, so there is nothing to absorb into one.
    fn absorb(&mut self, hits: u64, at: Nanos) {
        if self.spec.limit() > 0 {
            self.state.absorb(&self.spec, hits, at);
        }
    }

    pub fn reset_gen(&self) -> u64 {
        self.reset_gen
    }

    /// Decide under `spec`, as [`crate::algorithm::Limited::decide`] does:
    /// a changed spec takes effect at once and keeps what was consumed; a
    /// deny-all spec denies without converting.
    pub fn decide(&mut self, spec: &Spec, req: Cost, now: Nanos) -> Decision {
        let d = if spec.limit() == 0 {
            State::fresh(spec, now).decide(spec, req, now)
        } else {
            if *spec != *self.spec {
                self.state.follow(&self.spec, spec, now);
                self.set_spec(spec);
            }
            self.state.decide(spec, req, now)
        };
        self.last_seen = self.last_seen.max(now);
        self.referenced = true;
        if req.hits > 0 {
            self.version += 1;
            let hits = u32::try_from(req.hits).unwrap_or(u32::MAX);
            self.hits = self.hits.saturating_add(hits);
            if !d.allowed() {
                self.refusals = self.refusals.saturating_add(1);
            }
        }
        d
    }

    pub fn reset(&mut self, now: Nanos) {
        self.state = State::fresh(&self.spec, now);
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
        let fresh = self.state.idle_after(&self.spec);
        if self.reset_gen > 0 {
            fresh.max(self.last_seen.saturating_add(RESET_MEMORY))
        } else {
            fresh
        }
    }

    /// The eviction score, lowest first: how far from fresh, in millionths
    /// of the capacity (a key at 99% of a monthly quota goes last) — and a
    /// key an operator reset within [`RESET_MEMORY`] as full: fresh as its
    /// state is, its reset generation must outlive the copies from before
    /// the reset (evicted and recreated at generation 0, a replica holding
    /// the newer generation would refuse every later replica, and a
    /// failover would take its stale count).
    pub fn keep_score(&self, now: Nanos) -> u64 {
        if self.reset_gen > 0 && now < self.last_seen.saturating_add(RESET_MEMORY) {
            1_000_000
        } else {
            self.fullness_ppm(now)
        }
    }

    /// How far from fresh, in millionths of the capacity.
    pub fn fullness_ppm(&self, now: Nanos) -> u64 {
        let spec = &*self.spec;
        let used = u128::from(self.state.consumed(spec, now));
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
        u64::from(self.hits)
    }

    pub fn refusals(&self) -> u64 {
        u64::from(self.refusals)
    }

    pub fn last_seen(&self) -> Nanos {
        self.last_seen
    }

    /// What the key owes at `now`: consumption beyond its capacity
    /// (reports and folds absorbed into a state with nothing left).
    pub fn owed(&self, now: Nanos) -> u64 {
        if self.spec.limit() == 0 {
            return 0;
        }
        self.state
            .consumed(&self.spec, now)
            .saturating_sub(self.spec.capacity())
    }

    pub fn view(&self, now: Nanos) -> View {
        let spec = *self.spec;
        let mut state = self.state.clone();
        let peek = state.decide(&spec, Cost::hits(0), now);
        View {
            spec,
            remaining: peek.remaining,
            reset_at: peek.reset_at,
            reset_gen: self.reset_gen,
            version: self.version,
            hits: self.hits(),
            refusals: self.refusals(),
            last_seen: self.last_seen,
        }
    }
}

/// The last report sequence applied from each edge that reported a key.
/// Boxed, so the many keys never reported on pay one pointer.
#[derive(Clone, Debug, Default)]
#[expect(
    clippy::box_collection,
    reason = "one pointer in every entry, not a Vec's three"
)]
struct Reports(Option<Box<Vec<Slot>>>);

/// An edge's id and the last sequence applied from it.
type Slot = (Arc<str>, u64);

impl From<Vec<(Arc<str>, u64)>> for Reports {
    fn from(slots: Vec<(Arc<str>, u64)>) -> Reports {
        Reports((!slots.is_empty()).then(|| Box::new(slots)))
    }
}

impl Reports {
    fn slots(&self) -> &[(Arc<str>, u64)] {
        self.0.as_deref().map_or(&[], Vec::as_slice)
    }

    fn to_vec(&self) -> Vec<(Arc<str>, u64)> {
        self.slots().to_vec()
    }

    /// Record `seq` from `edge` if it is newer than the last; else the
    /// last (a report at or below it is a retry).
    fn advance(&mut self, edge: &str, seq: u64) -> Result<(), u64> {
        let slots = self.0.get_or_insert_with(Box::default);
        match slots.iter_mut().find(|(e, _)| &**e == edge) {
            Some((_, last)) if *last >= seq => Err(*last),
            Some((_, last)) => {
                *last = seq;
                Ok(())
            }
            None => {
                slots.push((Arc::from(edge), seq));
                Ok(())
            }
        }
    }

    /// Keep the later of `seq` and what `edge` has (a merge).
    fn raise(&mut self, edge: Arc<str>, seq: u64) {
        let slots = self.0.get_or_insert_with(Box::default);
        match slots.iter_mut().find(|(e, _)| *e == edge) {
            Some((_, last)) => *last = (*last).max(seq),
            None => slots.push((edge, seq)),
        }
    }

    /// Bytes held out of line: the box, the slots' capacity, and each edge
    /// id's `Arc<str>` (counted per key even when keys share an edge's id:
    /// the budget errs high, never low).
    fn heap_bytes(&self) -> usize {
        self.0.as_ref().map_or(0, |slots| {
            size_of::<Vec<(Arc<str>, u64)>>()
                + slots.capacity() * size_of::<(Arc<str>, u64)>()
                + slots
                    .iter()
                    .map(|(edge, _)| arc_bytes(edge.len()))
                    .sum::<usize>()
        })
    }
}
