//! The store's map from encoded key to [`Entry`]: a small index of slot
//! numbers over a dense array of slots, in shards.
//!
//! Why not `DashMap<Arc<[u8]>, Entry>`, as before: a hash table runs
//! between 44% and 87% full (it doubles at 7/8), so every byte of its slot
//! costs up to two per key; with the key's `Arc` beside the entry and the
//! eviction queue's pointer, a key took 410 bytes (issue 21). Here the
//! table's slot is a 4-byte number, and the entries, each with its key
//! inline (`key.rs` encoding; long keys out of line), sit densely in a
//! `Vec` whose holes are reused first. Its order is also what the eviction
//! hand walks (`evict.rs`), so no queue of keys is kept beside it.
//!
//! Shards, as in DashMap: a key's hash picks its shard, and one decision
//! locks one shard for the few tens of nanoseconds of its arithmetic. A
//! `parking_lot` RwLock each (as DashMap's own lock): it spins briefly
//! before it sleeps, so two threads on one hot key wait tens of
//! nanoseconds, not a futex round trip (std's lock doubled the hot key's
//! time on 2 threads in `benches/store.rs`). Held for a lookup and a
//! closure, never across an await.

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};

use hashbrown::HashTable;

use super::{Entry, Hasher};

/// A key's bytes inside its slot when they fit: most keys are a short
/// name and an API key, IP or tenant id.
const INLINE: usize = 46;

/// An encoded key, inline up to [`INLINE`] bytes, else in a box of its own.
#[derive(Clone, Debug)]
enum Key {
    Inline { len: u8, bytes: [u8; INLINE] },
    Boxed(Box<[u8]>),
}

impl Key {
    fn new(key: &[u8]) -> Key {
        if key.len() <= INLINE {
            let mut bytes = [0; INLINE];
            bytes[..key.len()].copy_from_slice(key);
            Key::Inline {
                len: key.len() as u8,
                bytes,
            }
        } else {
            Key::Boxed(key.into())
        }
    }

    #[inline]
    fn get(&self) -> &[u8] {
        match self {
            Key::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Key::Boxed(b) => b,
        }
    }
}

/// Bytes a key of `len` bytes holds outside its slot.
pub const fn key_heap_bytes(len: usize) -> usize {
    if len <= INLINE { 0 } else { len }
}

/// One key and its entry.
#[derive(Debug)]
struct Slot {
    key: Key,
    entry: Entry,
}

/// The bytes each key holds in place: its slot, and the index's slot
/// number and control byte.
pub const SLOT_BYTES: usize = size_of::<Option<Slot>>() + size_of::<u32>() + 1;

#[derive(Debug, Default)]
struct Shard {
    /// Slot numbers, hashed by their slot's key.
    index: HashTable<u32>,
    /// `None`: a hole, listed in `free`.
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
}

impl Shard {
    #[inline]
    fn find(&self, hash: u64, key: &[u8]) -> Option<u32> {
        let slots = &self.slots;
        self.index
            .find(hash, |&i| slot_key(slots, i) == key)
            .copied()
    }
}

#[inline]
fn slot_key(slots: &[Option<Slot>], i: u32) -> &[u8] {
    slots[i as usize].as_ref().map_or(&[], |s| s.key.get())
}

/// A place in the table, for the eviction hand: shard, then slot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pos {
    pub shard: usize,
    pub slot: usize,
}

/// What `Table::entry` finds.
pub enum Found<'a> {
    Occupied(&'a mut Entry),
    Vacant(Vacant<'a>),
}

/// A key not in the table, with its shard locked: insert it or leave.
pub struct Vacant<'a> {
    shard: &'a mut Shard,
    hash: u64,
    key: &'a [u8],
    hasher: &'a Hasher,
    places: &'a AtomicUsize,
}

impl<'a> Vacant<'a> {
    pub fn insert(self, entry: Entry) -> &'a mut Entry {
        let Vacant {
            shard,
            hash,
            key,
            hasher,
            places,
        } = self;
        let slot = Some(Slot {
            key: Key::new(key),
            entry,
        });
        let i = match shard.free.pop() {
            Some(i) => {
                shard.slots[i as usize] = slot;
                i
            }
            None => {
                // Grown by an eighth, not doubled: the slots are most of a
                // key's bytes, and a large array is moved by remapping its
                // pages (glibc's realloc), not by copying them.
                let len = shard.slots.len();
                if len == shard.slots.capacity() {
                    shard.slots.reserve_exact((len / 8).max(16));
                }
                // A shard's slots never outnumber the keys it held at once:
                // bounded by `limits.max_keys` (validated far below
                // u32::MAX).
                shard.slots.push(slot);
                places.fetch_add(1, Ordering::Relaxed);
                u32::try_from(shard.slots.len() - 1).expect("slots bounded by max_keys")
            }
        };
        let slots = &shard.slots;
        shard
            .index
            .insert_unique(hash, i, |&j| hasher.hash_one(slot_key(slots, j)));
        &mut shard.slots[i as usize]
            .as_mut()
            .expect("just written")
            .entry
    }
}

/// Slots `retain` reads under one lock of a shard (~0.1 ms of work).
const RETAIN_CHUNK: usize = 4_096;

/// A shard on cache lines of its own: threads deciding keys of two
/// neighbouring shards must not contend on one line.
#[derive(Debug)]
#[repr(align(128))]
struct Padded(RwLock<Shard>);

#[derive(Debug)]
pub struct Table {
    shards: Box<[Padded]>,
    hasher: Hasher,
    /// Slots in all shards, full or holes (they never shrink).
    places: AtomicUsize,
}

impl Table {
    /// A table with room for `capacity` keys before any shard grows.
    pub fn with_capacity(capacity: usize) -> Table {
        // As DashMap: four shards per core, a power of two.
        let n = std::thread::available_parallelism().map_or(1, |n| n.get()) * 4;
        Table::with_shards(capacity, n, Hasher::default())
    }

    /// A table of `n` shards (rounded up to a power of two) hashed by
    /// `hasher`.
    pub fn with_shards(capacity: usize, n: usize, hasher: Hasher) -> Table {
        let n = n.max(1).next_power_of_two();
        let per = capacity.div_ceil(n);
        let shards = (0..n)
            .map(|_| {
                Padded(RwLock::new(Shard {
                    index: HashTable::with_capacity(per),
                    slots: Vec::with_capacity(per),
                    free: Vec::new(),
                }))
            })
            .collect();
        Table {
            shards,
            hasher,
            places: AtomicUsize::new(0),
        }
    }

    #[inline]
    fn locate(&self, key: &[u8]) -> (u64, usize) {
        let hash = self.hasher.hash_one(key);
        // The high bits pick the shard; hashbrown uses the low ones and
        // the top seven (its control byte), so few bits are shared.
        let shard = ((hash >> 32) as usize) & (self.shards.len() - 1);
        (hash, shard)
    }

    #[inline]
    fn write(&self, shard: usize) -> RwLockWriteGuard<'_, Shard> {
        self.shards[shard].0.write()
    }

    #[inline]
    fn read(&self, shard: usize) -> RwLockReadGuard<'_, Shard> {
        self.shards[shard].0.read()
    }

    /// Run `f` on the key's entry, if it is in the table, under its
    /// shard's write lock.
    #[inline]
    pub fn with_mut<R>(&self, key: &[u8], f: impl FnOnce(&mut Entry) -> R) -> Option<R> {
        let (hash, s) = self.locate(key);
        let mut shard = self.write(s);
        let i = shard.find(hash, key)?;
        shard.slots[i as usize]
            .as_mut()
            .map(|slot| f(&mut slot.entry))
    }

    /// Run `f` on the key's entry, if it is in the table, under its
    /// shard's read lock.
    #[inline]
    pub fn with<R>(&self, key: &[u8], f: impl FnOnce(&Entry) -> R) -> Option<R> {
        let (hash, s) = self.locate(key);
        let shard = self.read(s);
        let i = shard.find(hash, key)?;
        shard.slots[i as usize].as_ref().map(|slot| f(&slot.entry))
    }

    pub fn contains(&self, key: &[u8]) -> bool {
        self.with(key, |_| ()).is_some()
    }

    /// Run `f` on the key's entry or on the place to insert it, under its
    /// shard's write lock.
    #[inline]
    pub fn entry<R>(&self, key: &[u8], f: impl FnOnce(Found<'_>) -> R) -> R {
        let (hash, s) = self.locate(key);
        let mut guard = self.write(s);
        let shard = &mut *guard;
        match shard.find(hash, key) {
            Some(i) => f(Found::Occupied(
                &mut shard.slots[i as usize]
                    .as_mut()
                    .expect("indexed slots are full")
                    .entry,
            )),
            None => f(Found::Vacant(Vacant {
                shard,
                hash,
                key,
                hasher: &self.hasher,
                places: &self.places,
            })),
        }
    }

    /// Take the key out of the table.
    pub fn remove(&self, key: &[u8]) -> Option<Entry> {
        let (hash, s) = self.locate(key);
        let mut guard = self.write(s);
        let shard = &mut *guard;
        let slots = &shard.slots;
        let found = shard
            .index
            .find_entry(hash, |&i| slot_key(slots, i) == key)
            .ok()?;
        let (i, _) = found.remove();
        shard.free.push(i);
        shard.slots[i as usize].take().map(|slot| slot.entry)
    }

    /// Keep the keys `keep` says to; returns how many it removed. The scan
    /// takes a shard's lock for `RETAIN_CHUNK` slots at a time, not for the
    /// whole shard: at a million keys a shard holds 125,000 of them, and a
    /// lock held while all were read stalled every decision on that shard
    /// for ~10 ms (a key flood's steady caller waited up to 90 ms per
    /// sweep). Keys added between chunks are either scanned by a later
    /// chunk or missed until the next sweep, as a key added to an
    /// already-swept shard always was.
    pub fn retain(&self, mut keep: impl FnMut(&[u8], &mut Entry) -> bool) -> usize {
        let mut removed = 0;
        for s in 0..self.shards.len() {
            let mut start = 0;
            loop {
                let mut guard = self.write(s);
                let shard = &mut *guard;
                let end = shard.slots.len().min(start + RETAIN_CHUNK);
                for i in start..end {
                    let Some(slot) = shard.slots[i].as_mut() else {
                        continue;
                    };
                    if keep(slot.key.get(), &mut slot.entry) {
                        continue;
                    }
                    let hash = self.hasher.hash_one(slot.key.get());
                    let i = i as u32;
                    if let Ok(found) = shard.index.find_entry(hash, |&j| j == i) {
                        found.remove();
                    }
                    shard.slots[i as usize] = None;
                    shard.free.push(i);
                    removed += 1;
                }
                if end >= shard.slots.len() {
                    break;
                }
                start = end;
            }
        }
        removed
    }

    /// Call `f` on every key and entry, one shard at a time.
    pub fn for_each(&self, mut f: impl FnMut(&[u8], &Entry)) {
        for s in 0..self.shards.len() {
            let shard = self.read(s);
            for slot in shard.slots.iter().flatten() {
                f(slot.key.get(), &slot.entry);
            }
        }
    }

    /// Call `f` on every entry, one shard at a time, under write locks.
    pub fn for_each_mut(&self, mut f: impl FnMut(&mut Entry)) {
        for s in 0..self.shards.len() {
            let mut shard = self.write(s);
            for slot in shard.slots.iter_mut().flatten() {
                f(&mut slot.entry);
            }
        }
    }

    /// Places the eviction hand steps through in one lap: every slot,
    /// full or not, and one per shard (an empty shard is one step).
    pub fn places(&self) -> usize {
        self.places.load(Ordering::Relaxed) + self.shards.len()
    }

    /// Run `f` on the next key from `pos` in its shard, if there is one,
    /// and move `pos` past it (to the next shard after a shard's last
    /// slot), under one lock of the shard. Holes are passed over under
    /// the same lock: after a sweep emptied most of the table, a turn of
    /// the hand still takes a lock per key, not per hole.
    pub fn step<R>(&self, pos: &mut Pos, f: impl FnOnce(&[u8], &mut Entry) -> R) -> Option<R> {
        let mut shard = self.write(pos.shard % self.shards.len());
        while matches!(shard.slots.get(pos.slot), Some(None)) {
            pos.slot += 1;
        }
        let r = match shard.slots.get_mut(pos.slot) {
            Some(Some(slot)) => Some(f(slot.key.get(), &mut slot.entry)),
            _ => None,
        };
        if pos.slot + 1 < shard.slots.len() {
            pos.slot += 1;
        } else {
            *pos = Pos {
                shard: (pos.shard + 1) % self.shards.len(),
                slot: 0,
            };
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Algorithm, Period, Spec};

    fn entry() -> Entry {
        let spec = Spec::new(Algorithm::Gcra, 10, Period::Duration(1_000), None).unwrap();
        Entry::new(spec, 0)
    }

    /// Insert `key` with a fresh entry, if it is not in the table.
    fn insert(table: &Table, key: &[u8]) {
        table.entry(key, |f| {
            if let Found::Vacant(v) = f {
                v.insert(entry());
            }
        });
    }

    #[test]
    fn keys_short_and_long_come_back_as_they_went_in() {
        let table = Table::with_capacity(0);
        let long = vec![7u8; INLINE + 1];
        let keys: Vec<Vec<u8>> = vec![vec![], b"a".to_vec(), vec![9; INLINE], long];
        for k in &keys {
            table.entry(k, |f| match f {
                Found::Vacant(v) => drop(v.insert(entry())),
                Found::Occupied(_) => panic!("new key found"),
            });
        }
        let mut seen = Vec::new();
        table.for_each(|k, _| seen.push(k.to_vec()));
        seen.sort();
        let mut want = keys.clone();
        want.sort();
        assert_eq!(seen, want);
        for k in &keys {
            assert!(table.contains(k));
        }
        assert!(!table.contains(b"b"));
    }

    #[test]
    fn a_removed_keys_slot_is_reused_and_the_rest_stay_found() {
        let table = Table::with_capacity(0);
        let key = |i: u32| i.to_le_bytes().to_vec();
        for i in 0..1_000 {
            insert(&table, &key(i));
        }
        let places = table.places();
        for i in (0..1_000).step_by(2) {
            assert!(table.remove(&key(i)).is_some());
        }
        assert!(table.remove(&key(0)).is_none(), "removed once");
        for i in 0..1_000 {
            assert_eq!(table.contains(&key(i)), i % 2 == 1, "key {i}");
        }
        // The same keys again land in the same shards: in their holes.
        for i in (0..1_000).step_by(2) {
            insert(&table, &key(i));
        }
        assert_eq!(
            table.places(),
            places,
            "holes filled before the array grows"
        );
        for i in 0..1_000 {
            assert!(table.contains(&key(i)), "key {i}");
        }
        let removed = table.retain(|k, _| k[0] % 3 != 0);
        let mut left = 0;
        table.for_each(|k, _| {
            assert_ne!(k[0] % 3, 0);
            left += 1;
        });
        assert_eq!(removed + left, 1_000);
        assert!(removed > 0 && left > 0);
    }

    #[test]
    fn retain_removes_exactly_its_keys_across_chunks_of_a_shard() {
        let table = Table::with_capacity(0);
        // Enough keys that every shard holds several chunks' worth.
        let n = (RETAIN_CHUNK * table.shards.len() * 3) as u32;
        let key = |i: u32| i.to_le_bytes();
        for i in 0..n {
            insert(&table, &key(i));
        }
        let places = table.places();
        let removed = table.retain(|k, _| u32::from_le_bytes(k.try_into().unwrap()) % 3 != 0);
        assert_eq!(removed, n.div_ceil(3) as usize);
        for i in 0..n {
            assert_eq!(table.contains(&key(i)), i % 3 != 0, "key {i}");
        }
        // The removed keys' slots are holes the same keys fill again.
        for i in (0..n).step_by(3) {
            insert(&table, &key(i));
        }
        assert_eq!(
            table.places(),
            places,
            "holes filled before the array grows"
        );
        for i in 0..n {
            assert!(table.contains(&key(i)), "key {i}");
        }
    }

    #[test]
    fn the_hand_visits_every_key_in_one_lap() {
        let table = Table::with_capacity(0);
        for i in 0..100u32 {
            insert(&table, &i.to_le_bytes());
        }
        // A lap: from the start back to it, within `places` steps.
        let mut pos = Pos::default();
        let mut seen = std::collections::HashSet::new();
        let mut steps = 0;
        loop {
            table.step(&mut pos, |k, _| {
                assert!(seen.insert(k.to_vec()), "twice in a lap")
            });
            steps += 1;
            if pos == Pos::default() {
                break;
            }
            assert!(steps <= table.places(), "a lap is at most `places` steps");
        }
        assert_eq!(seen.len(), 100);
    }
}
