//! The one source of time.
//!
//! Decisions need epoch nanoseconds (so a state means the same on every
//! node) that never jump (so NTP stepping the wall clock cannot refund a
//! bucket mid-flight). [`SystemClock`] reads the wall clock once at boot and
//! adds monotonic time since; [`FakeClock`] lets tests drive time by hand.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::algorithm::Nanos;

/// A source of epoch nanoseconds.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    fn now(&self) -> Nanos;
}

/// A shared clock handle.
pub type SharedClock = Arc<dyn Clock>;

/// Wall time at boot plus monotonic time since.
#[derive(Debug)]
pub struct SystemClock {
    boot_wall: Nanos,
    boot: Instant,
}

impl SystemClock {
    pub fn new() -> SystemClock {
        let boot_wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        SystemClock {
            boot_wall,
            boot: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Nanos {
        let since = u64::try_from(self.boot.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.boot_wall.saturating_add(since)
    }
}

/// A clock that only moves when told to.
#[derive(Debug, Default)]
pub struct FakeClock(AtomicU64);

impl FakeClock {
    pub fn new(start: Nanos) -> Arc<FakeClock> {
        Arc::new(FakeClock(AtomicU64::new(start)))
    }

    pub fn set(&self, t: Nanos) {
        self.0.store(t, Ordering::SeqCst);
    }

    pub fn advance(&self, by: Nanos) {
        self.0.fetch_add(by, Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Nanos {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_is_epoch_nanos_and_monotonic() {
        let c = SystemClock::new();
        let a = c.now();
        let b = c.now();
        assert!(b >= a);
        // After 2020 and before 2100.
        assert!(a > 1_577_836_800_000_000_000 && a < 4_102_444_800_000_000_000);
    }

    #[test]
    fn fake_clock_moves_only_when_told() {
        let c = FakeClock::new(5);
        assert_eq!(c.now(), 5);
        c.advance(10);
        assert_eq!(c.now(), 15);
        c.set(3);
        assert_eq!(c.now(), 3);
    }
}
