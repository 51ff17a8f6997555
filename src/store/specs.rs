//! Shared specs: the keys of a fleet use a handful of limits (a policy, an
//! Envoy rule, a few inline shapes), so an entry points at one shared copy
//! of its spec (8 bytes) instead of carrying its own (40).
//!
//! The table is process-wide and bounded: at most [`MAX_SHARED`] distinct
//! specs. When it is full, specs no entry uses any more are dropped from it;
//! if it is still full (a client sending ever new inline limits), a key gets
//! a spec of its own — as before sharing, and counted so in its footprint —
//! so a client can make its keys dearer, never the table larger.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use crate::algorithm::Spec;

/// Distinct specs shared at once.
pub const MAX_SHARED: usize = 4_096;

/// `spec`'s shared copy, and whether it is shared (false: the table is
/// full of specs in use, and this copy is the caller's own).
pub fn share(spec: &Spec) -> (Arc<Spec>, bool) {
    static TABLE: LazyLock<Table> = LazyLock::new(|| Table::new(MAX_SHARED));
    thread_local! {
        // The last spec this thread shared: a run of new keys under one
        // limit takes the table's lock once, not once per key.
        static LAST: RefCell<Option<Arc<Spec>>> = const { RefCell::new(None) };
    }
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        if let Some(s) = last.as_ref().filter(|s| ***s == *spec) {
            return (s.clone(), true);
        }
        match TABLE.intern(spec) {
            Some(s) => {
                *last = Some(s.clone());
                (s, true)
            }
            None => (Arc::new(*spec), false),
        }
    })
}

/// Distinct specs, each once, at most `max`.
struct Table {
    /// A std Mutex: held for one lookup, never across an await; a panic
    /// while holding it leaves a valid map.
    map: Mutex<HashMap<Spec, Arc<Spec>>>,
    max: usize,
}

impl Table {
    fn new(max: usize) -> Table {
        Table {
            map: Mutex::default(),
            max,
        }
    }

    /// The table's copy of `spec`, added if missing; None when the table
    /// is full of specs still in use.
    fn intern(&self, spec: &Spec) -> Option<Arc<Spec>> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = map.get(spec) {
            return Some(s.clone());
        }
        if map.len() >= self.max {
            // Held by the table alone: no entry uses it any more. (One
            // held by a thread's last-used slot stays: at most one each.)
            map.retain(|_, s| Arc::strong_count(s) > 1);
            if map.len() >= self.max {
                return None;
            }
        }
        let s = Arc::new(*spec);
        map.insert(*spec, s.clone());
        Some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Algorithm, Period};

    fn spec(limit: u64) -> Spec {
        Spec::new(Algorithm::Gcra, limit, Period::Duration(1_000), None).unwrap()
    }

    #[test]
    fn keys_of_one_limit_share_one_copy() {
        let table = Table::new(8);
        let a = table.intern(&spec(7)).unwrap();
        let b = table.intern(&spec(7)).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(*a, spec(7));
        assert!(!Arc::ptr_eq(&a, &table.intern(&spec(8)).unwrap()));
        // The process-wide table, from two threads: the same value, and
        // one thread's repeated spec is its last-used copy.
        let (x, _) = share(&spec(7_001));
        let (y, _) = share(&spec(7_001));
        assert!(Arc::ptr_eq(&x, &y));
        let z = std::thread::spawn(|| share(&spec(7_001)).0).join().unwrap();
        assert_eq!(*z, spec(7_001));
    }

    #[test]
    fn a_flood_of_distinct_limits_never_grows_the_table_past_its_bound() {
        // Hold every copy, as entries would: the table fills, then further
        // specs get no shared copy (the caller makes its own).
        let table = Table::new(64);
        let held: Vec<Option<Arc<Spec>>> =
            (0..100).map(|i| table.intern(&spec(1_000 + i))).collect();
        assert!(held[..64].iter().all(Option::is_some));
        assert!(held[64..].iter().all(Option::is_none));
        assert_eq!(table.map.lock().unwrap().len(), 64);
        // Once the keys are gone, their specs make room for new ones.
        drop(held);
        assert!(table.intern(&spec(5_000)).is_some());
        assert_eq!(table.map.lock().unwrap().len(), 1);
    }
}
