//! The one source of time.
//!
//! Decisions need epoch nanoseconds (so a state means the same on every
//! node) that never jump (so NTP stepping the wall clock cannot refund a
//! bucket mid-flight). [`SystemClock`] reads the wall clock once at boot and
//! adds the time since on `CLOCK_BOOTTIME` — monotonic, and counting time
//! the machine was suspended (`Instant` does not: a node resumed from a
//! suspend would stamp its states in the past, and its peers would refill
//! them); [`FakeClock`] lets tests drive time by hand.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Nanoseconds since boot, counting time suspended (`CLOCK_BOOTTIME`).
pub fn boot_time() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_BOOTTIME exists on
    // every Linux since 2.6.39 and cannot fail with a valid pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

use crate::algorithm::Nanos;

/// A source of epoch nanoseconds.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    fn now(&self) -> Nanos;
}

/// A shared clock handle.
pub type SharedClock = Arc<dyn Clock>;

/// Wall time at boot plus boot-clock time since.
#[derive(Debug)]
pub struct SystemClock {
    boot_wall: Nanos,
    boot: u64,
}

impl SystemClock {
    pub fn new() -> SystemClock {
        let boot_wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        SystemClock {
            boot_wall,
            boot: boot_time(),
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
        self.boot_wall
            .saturating_add(boot_time().saturating_sub(self.boot))
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
