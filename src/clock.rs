//! The one source of time.
//!
//! Decisions need epoch nanoseconds (so a state means the same on every
//! node) that never jump (so NTP stepping the wall clock cannot refund a
//! bucket mid-flight). [`SystemClock`] counts on `CLOCK_BOOTTIME` —
//! monotonic, and counting time the machine was suspended (`Instant` does
//! not: a node resumed from a suspend would stamp its states in the past,
//! and its peers would refill them) — plus a correction toward the wall
//! clock. The correction is fixed at boot and then *slewed*: every
//! [`Clock::resync`] it moves toward the wall clock at most [`MAX_SLEW`] of
//! the time passing, so the clock never goes backwards and never jumps, yet
//! a node started before NTP synced comes into step instead of staying off
//! all its life. [`FakeClock`] lets tests drive time by hand.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;

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

    /// Steer toward the wall clock (see [`SystemClock`]); called about once
    /// a second. Clocks that follow nothing ignore it.
    fn resync(&self) {}
}

/// A shared clock handle.
pub type SharedClock = Arc<dyn Clock>;

/// The most the correction moves per unit of time passing: 5% (a node a
/// second off comes into step in 20 s; its clock runs at 0.95–1.05 speed
/// meanwhile, never backwards).
pub const MAX_SLEW: f64 = 0.05;

/// Boot-clock time plus a correction that moves linearly from `at` (boot
/// ns) at `rate` until `until`, then stays.
#[derive(Debug, Clone, Copy)]
struct Line {
    at: u64,
    correction: i128,
    /// Correction per ns of boot time, in millionths (|rate| ≤ MAX_SLEW).
    rate_ppm: i64,
    until: u64,
}

impl Line {
    fn correction(&self, boot: u64) -> i128 {
        let run = boot.clamp(self.at, self.until.max(self.at)) - self.at;
        self.correction + i128::from(run) * i128::from(self.rate_ppm) / 1_000_000
    }
}

/// Epoch time from the boot clock, slewed toward the wall clock (plus a
/// configured offset: a test aid, to run one node's clock off on purpose).
#[derive(Debug)]
pub struct SystemClock {
    /// Added to the wall clock when steering (ns; 0 outside tests).
    offset: i64,
    line: ArcSwap<Line>,
}

fn wall() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0)
}

impl SystemClock {
    pub fn new() -> SystemClock {
        SystemClock::with_offset(0)
    }

    /// A clock `offset` ns off the wall clock (negative: behind).
    pub fn with_offset(offset: i64) -> SystemClock {
        let boot = boot_time();
        SystemClock {
            offset,
            line: ArcSwap::from_pointee(Line {
                at: boot,
                correction: wall() + i128::from(offset) - i128::from(boot),
                rate_ppm: 0,
                until: boot,
            }),
        }
    }

    /// The clock as it reads at boot time `boot`.
    fn at(&self, boot: u64) -> Nanos {
        let t = i128::from(boot) + self.line.load().correction(boot);
        t.clamp(0, i128::from(u64::MAX)) as u64
    }

    /// Steer from boot time `boot` toward `target` (epoch ns then): over
    /// the next `horizon` ns, at most [`MAX_SLEW`].
    fn steer(&self, boot: u64, target: i128, horizon: u64) {
        let now = self.line.load();
        let correction = now.correction(boot);
        let error = target - (i128::from(boot) + correction);
        let max = (MAX_SLEW * 1e6) as i64;
        let want = (error * 1_000_000 / i128::from(horizon.max(1)))
            .clamp(-i128::from(max), i128::from(max)) as i64;
        let until = if want == 0 {
            boot
        } else {
            // Long enough to close the error at this rate, no longer.
            let run = (error.unsigned_abs() * 1_000_000 / u128::from(want.unsigned_abs())) as u64;
            boot.saturating_add(run)
        };
        self.line.store(Arc::new(Line {
            at: boot,
            correction,
            rate_ppm: want,
            until,
        }));
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Nanos {
        self.at(boot_time())
    }

    fn resync(&self) {
        // Close the error over the next second (at most MAX_SLEW of it).
        self.steer(boot_time(), wall() + i128::from(self.offset), 1_000_000_000);
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
    fn an_offset_clock_is_that_far_off() {
        let c = SystemClock::with_offset(-500_000_000);
        let off = wall() - i128::from(c.now());
        assert!((499_000_000..600_000_000).contains(&off), "{off}");
    }

    /// Steered by hand over a fake boot timeline: the clock never goes
    /// backwards and never moves faster than 1 + MAX_SLEW or slower than
    /// 1 − MAX_SLEW, and it reaches its target.
    #[test]
    fn slewing_never_goes_backwards_and_converges() {
        let c = SystemClock::with_offset(0);
        let start = c.line.load().at;
        let epoch = |b: u64| c.at(start + b);
        let t0 = epoch(0);
        // The wall clock turns out 1 s behind this clock: slow down.
        c.steer(start, i128::from(t0) - 1_000_000_000, 1_000_000_000);
        let mut last = t0;
        let step = 10_000_000; // 10 ms
        for i in 1..=3_000u64 {
            let t = epoch(i * step);
            let moved = t - last;
            assert!(
                moved >= (step as f64 * (1.0 - MAX_SLEW)) as u64 - 1,
                "{i}: {moved}"
            );
            assert!(moved <= step, "{i}: {moved}");
            last = t;
        }
        // 30 s of boot time later: 1 s slower, exactly (in step, then
        // running at full speed again).
        assert_eq!(epoch(30_000_000_000), t0 + 30_000_000_000 - 1_000_000_000);
        // Now 2 s behind the wall clock: speed up, never past it.
        let b = 30_000_000_000;
        let target = i128::from(epoch(b)) + 2_000_000_000;
        c.steer(start + b, target, 1_000_000_000);
        let later = epoch(b + 100_000_000_000);
        assert_eq!(i128::from(later), target + 100_000_000_000);
        let mid = epoch(b + 10_000_000_000);
        assert_eq!(mid, epoch(b) + 10_000_000_000 + 500_000_000, "5% of 10 s");
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
