//! The one source of time.
//!
//! Decisions need epoch nanoseconds (so a state means the same on every
//! node) that never jump (so NTP stepping the wall clock cannot refund a
//! bucket mid-flight). [`SystemClock`] counts on `CLOCK_BOOTTIME` —
//! monotonic, and counting time the machine was suspended (`Instant` does
//! not: a node resumed from a suspend would stamp its states in the past,
//! and its peers would refill them) — plus a correction toward the wall
//! clock. The correction is fixed at boot and then *slewed*: every
//! [`Clock::resync`] it moves toward the wall clock at most
//! [`MAX_SLEW_PPM`] of the time passing, so the clock never goes backwards
//! and never jumps, yet
//! a node started before NTP synced comes into step instead of staying off
//! all its life. [`FakeClock`] lets tests drive time by hand.
//!
//! **The seam.** Everything a node reads of time outside tokio's timers
//! comes through a [`Clock`]: epoch time for decisions ([`Clock::now`]),
//! the boot clock for presence stamps ([`Clock::boot`]) and the system's
//! wall clock for generations and peer-token stamps ([`Clock::wall`]).
//! [`SystemClock`] reads the two raw clocks through a [`Ticks`] source:
//! [`OsTicks`] (the kernel's) in production, a simulated host's in the
//! deterministic simulator (`crates/sluice-sim`), where the same slewing
//! code then runs over simulated time. `SystemClock` is generic over the
//! source, so production's reads are the direct calls they always were.

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

/// The system's wall clock: epoch nanoseconds (it may step).
pub fn wall_time() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

use crate::algorithm::Nanos;

/// The two raw clocks a node reads: the boot clock (monotonic, counting
/// suspension) and the wall clock (epoch time; NTP may step it).
pub trait Ticks: Send + Sync + std::fmt::Debug + 'static {
    /// Nanoseconds since boot, counting time suspended.
    fn boot(&self) -> u64;
    /// Epoch nanoseconds by the wall clock.
    fn wall(&self) -> i64;
}

/// The kernel's clocks: `CLOCK_BOOTTIME` and `SystemTime`.
#[derive(Clone, Copy, Debug, Default)]
pub struct OsTicks;

impl Ticks for OsTicks {
    #[inline]
    fn boot(&self) -> u64 {
        boot_time()
    }

    #[inline]
    fn wall(&self) -> i64 {
        wall_time()
    }
}

/// A source of epoch nanoseconds, and the raw clocks behind it.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    fn now(&self) -> Nanos;

    /// Steer toward the wall clock (see [`SystemClock`]); called about once
    /// a second. Clocks that follow nothing ignore it.
    fn resync(&self) {}

    /// The boot clock (see [`Ticks::boot`]): presence stamps.
    fn boot(&self) -> u64;

    /// The wall clock as epoch ns (see [`Ticks::wall`]): generations, run
    /// ids, peer-token stamps — never a decision.
    fn wall(&self) -> u64;
}

/// A shared clock handle.
pub type SharedClock = Arc<dyn Clock>;

/// The most the correction moves per unit of time passing: 500 ppm, as
/// the kernel's own `adjtime` (a node a second off comes into step in
/// about half an hour; its clock runs at 0.9995–1.0005 speed meanwhile, so
/// no key refills or drains noticeably faster, and it never goes back).
pub const MAX_SLEW_PPM: i64 = 500;

/// How far ahead of its computation a new steering segment starts: a
/// reader that read the boot clock before the segment was stored, and so
/// still uses the old one, gets exactly what the new one says for that
/// instant (both agree until the segment starts).
const LEAD: u64 = 10_000_000;

/// The correction from boot time `at` on: `correction` there, moving at
/// `rate_ppm` until `until`, then constant; before `at`, the previous
/// segment's.
#[derive(Debug)]
struct Line {
    at: u64,
    correction: i64,
    rate_ppm: i64,
    until: u64,
    prev: Option<Arc<Line>>,
}

impl Line {
    fn correction(&self, boot: u64) -> i64 {
        if boot < self.at
            && let Some(prev) = &self.prev
        {
            return prev.correction(boot);
        }
        // At most ~213 days of run, so the product fits an i64.
        let run = (boot.clamp(self.at, self.until.max(self.at)) - self.at).min(1 << 54) as i64;
        self.correction
            .saturating_add(run.saturating_mul(self.rate_ppm) / 1_000_000)
    }
}

/// Epoch time from the boot clock, slewed toward the wall clock (plus a
/// configured offset: a test aid, to run one node's clock off on purpose).
#[derive(Debug)]
pub struct SystemClock<T: Ticks = OsTicks> {
    ticks: T,
    /// Added to the wall clock when steering (ns; 0 outside tests).
    offset: i64,
    line: ArcSwap<Line>,
}

impl SystemClock {
    pub fn new() -> SystemClock {
        SystemClock::with_offset(0)
    }

    /// A clock `offset` ns off the wall clock (negative: behind).
    pub fn with_offset(offset: i64) -> SystemClock {
        SystemClock::over(OsTicks, offset)
    }
}

impl<T: Ticks> SystemClock<T> {
    /// A clock over the raw clocks `ticks`, `offset` ns off their wall
    /// clock.
    pub fn over(ticks: T, offset: i64) -> SystemClock<T> {
        let boot = ticks.boot();
        let wall = ticks.wall();
        SystemClock {
            ticks,
            offset,
            line: ArcSwap::from_pointee(Line {
                at: boot,
                correction: wall.saturating_add(offset).saturating_sub(boot as i64),
                rate_ppm: 0,
                until: boot,
                prev: None,
            }),
        }
    }

    /// The clock as it reads at boot time `boot`.
    fn at(&self, boot: u64) -> Nanos {
        (boot as i64)
            .saturating_add(self.line.load().correction(boot))
            .max(0) as u64
    }

    /// Steer toward `target` (epoch ns as of boot time `boot`): a new
    /// segment from `start` (≥ `boot`) closing the error at up to
    /// [`MAX_SLEW_PPM`] over the next `horizon` ns.
    fn steer(&self, boot: u64, target: i64, horizon: u64, start: u64) {
        let old = self.line.load_full();
        let error = target.saturating_sub((boot as i64).saturating_add(old.correction(boot)));
        let rate = (i128::from(error) * 1_000_000 / i128::from(horizon.max(1)))
            .clamp(-i128::from(MAX_SLEW_PPM), i128::from(MAX_SLEW_PPM)) as i64;
        let start = start.max(boot);
        let until = if rate == 0 {
            start
        } else {
            // Long enough to close the error at this rate, no longer.
            let run =
                u128::from(error.unsigned_abs()) * 1_000_000 / u128::from(rate.unsigned_abs());
            start.saturating_add(u64::try_from(run).unwrap_or(u64::MAX))
        };
        // A pause past the lead (the steering thread descheduled) would let
        // readers past `start` use the old line: start later instead.
        let start = start.max(self.ticks.boot().saturating_add(LEAD / 2));
        let prev = Line {
            at: old.at,
            correction: old.correction,
            rate_ppm: old.rate_ppm,
            until: old.until,
            prev: None,
        };
        self.line.store(Arc::new(Line {
            at: start,
            correction: old.correction(start),
            rate_ppm: rate,
            until,
            prev: Some(Arc::new(prev)),
        }));
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl<T: Ticks> Clock for SystemClock<T> {
    fn now(&self) -> Nanos {
        self.at(self.ticks.boot())
    }

    fn resync(&self) {
        // Close the error over the next second (at most MAX_SLEW_PPM of
        // it), from LEAD on.
        let boot = self.ticks.boot();
        let target = self.ticks.wall().saturating_add(self.offset);
        self.steer(
            boot,
            target,
            1_000_000_000,
            self.ticks.boot().saturating_add(LEAD),
        );
    }

    fn boot(&self) -> u64 {
        self.ticks.boot()
    }

    /// The machine's wall clock — off by the test offset too, as a
    /// machine whose clock is off reads it (peer tokens, generations).
    fn wall(&self) -> u64 {
        self.ticks.wall().saturating_add(self.offset).max(0) as u64
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

/// Fake epoch time for decisions; the raw clocks stay the kernel's (a test
/// that moves decisions a minute on has not stopped its gossip loop for a
/// minute).
impl Clock for FakeClock {
    fn now(&self) -> Nanos {
        self.0.load(Ordering::SeqCst)
    }

    fn boot(&self) -> u64 {
        boot_time()
    }

    fn wall(&self) -> u64 {
        wall_time().max(0) as u64
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
        let off = wall_time() - c.now() as i64;
        assert!((499_000_000..600_000_000).contains(&off), "{off}");
    }

    /// Steered by hand over a fake boot timeline: the clock never goes
    /// backwards, never moves faster than 1 + MAX_SLEW or slower than
    /// 1 − MAX_SLEW, agrees with the old segment before the new one starts,
    /// and reaches its target.
    #[test]
    fn slewing_never_goes_backwards_and_converges() {
        let c = SystemClock::with_offset(0);
        let start = c.line.load().at;
        let epoch = |b: u64| c.at(start + b);
        let t0 = epoch(0);
        // The wall clock turns out 0.1 s behind this clock: slow down,
        // from 10 ms on.
        let lead = 10_000_000;
        let before = epoch(5_000_000);
        c.steer(start, t0 as i64 - 100_000_000, 1_000_000_000, start + lead);
        assert_eq!(epoch(5_000_000), before, "unchanged before the segment");
        let step = 10_000_000; // 10 ms
        let slow = (step as f64 * (1.0 - MAX_SLEW_PPM as f64 / 1e6)) as u64;
        let mut last = t0;
        for i in 1..=30_000u64 {
            let t = epoch(i * step);
            let moved = t - last;
            assert!(moved + 1 >= slow && moved <= step, "{i}: {moved}");
            last = t;
        }
        // 300 s of boot time later: 0.1 s slower, exactly (in step after
        // 200 s at 500 ppm, then at full speed again).
        assert_eq!(epoch(300_000_000_000), t0 + 300_000_000_000 - 100_000_000);
        // Now 1 s behind the wall clock: speed up, never past it.
        let b = 300_000_000_000;
        let target = epoch(b) as i64 + 1_000_000_000;
        c.steer(start + b, target, 1_000_000_000, start + b);
        let mid = epoch(b + 100_000_000_000);
        assert_eq!(
            mid,
            epoch(b) + 100_000_000_000 + 50_000_000,
            "500 ppm of 100 s"
        );
        let later = epoch(b + 3_000_000_000_000);
        assert_eq!(later as i64, target + 3_000_000_000_000);
        // A wall clock absurdly far off: no panic, still bounded speed.
        c.steer(start + b, i64::MAX, 1, start + b);
        let x = epoch(b + 3_000_000_000_001);
        assert!(x > later);
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
