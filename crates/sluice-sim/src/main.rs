//! `sluice-sim`: run the cluster under the deterministic simulator.
//!
//! ```text
//! sluice-sim run --seed 7                 # one run, in this process; exit 1 if it fails
//! sluice-sim run --schedule s.json        # replay a kept schedule
//! sluice-sim seeds --from 0 --count 1000  # many seeds, a process each, two at a time
//! sluice-sim shrink --seed 7 --out s.json # cut a failing run down to the faults that matter
//! ```
//!
//! **Randomness.** This binary defines `getrandom` and exports it (see
//! `build.rs`): std's hash-map keys, tokio's scheduler seeds and
//! chitchat's RNG (through `rand` and the `getrandom` crate) all look the
//! symbol up at run time and find this one first, which draws from the
//! run's seed. Together with one process per run (tokio numbers its
//! runtimes in a process-wide counter), a run is a function of its
//! schedule alone — nothing of chitchat is vendored or patched.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use clap::{Parser, Subcommand};
use sluice_sim::Report;
use sluice_sim::schedule::{Mix, Schedule};

/// The process's random stream (splitmix64), seeded from the run's seed
/// before the run starts.
static STREAM: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);

fn splitmix(state: u64) -> u64 {
    let mut z = state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `getrandom(2)` for this process: bytes from the seeded stream.
///
/// # Safety
/// `buf` must be valid for `len` bytes of writes, as for the libc call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getrandom(buf: *mut u8, len: usize, _flags: u32) -> isize {
    if buf.is_null() && len > 0 {
        // SAFETY: errno is this thread's; EFAULT is what the kernel says.
        unsafe { *libc::__errno_location() = libc::EFAULT };
        return -1;
    }
    let mut written = 0;
    while written < len {
        let word = splitmix(STREAM.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed));
        let bytes = word.to_le_bytes();
        let n = (len - written).min(8);
        // SAFETY: the caller gives `len` writable bytes at `buf`.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.add(written), n) };
        written += n;
    }
    len as isize
}

thread_local! {
    /// This thread runs the simulation: its monotonic clock is the run's.
    static SIMULATED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Where the run's monotonic clock starts (ns): far enough from zero that
/// an `Instant` minus a few hours stays an `Instant`.
const MONOTONIC_BASE: u64 = 1_000_000 * 1_000_000_000;

/// `clock_gettime(2)` for this process. On the run's thread
/// `CLOCK_MONOTONIC` — `std::time::Instant` — reads the simulated time,
/// advanced a tick at a time by the simulator; every other clock, and
/// every other thread, reads the kernel's. Sluice's clocks go through its
/// seam (`sluice::clock`) and tokio's are paused and advanced by hand, but
/// its dependencies read `Instant` themselves: h2 keeps a locally reset
/// stream for one second of it (later frames on the stream are dropped
/// quietly within that second, answered `RST_STREAM` after) — a second of
/// the machine's time, so a run's history depended on how fast the
/// machine ran it (seed 504 of `--mix any` gave three histories in eight
/// runs of one binary under load).
///
/// # Safety
/// `tp` must be valid for a write of one `timespec`, as for the libc call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn clock_gettime(
    clock: libc::clockid_t,
    tp: *mut libc::timespec,
) -> libc::c_int {
    if clock == libc::CLOCK_MONOTONIC && !tp.is_null() && SIMULATED.with(|s| s.get()) {
        let ns = MONOTONIC_BASE + sluice_sim::sim::LOG_NOW.load(Ordering::Relaxed);
        // SAFETY: the caller gives a writable `timespec` at `tp`.
        unsafe {
            (*tp).tv_sec = (ns / 1_000_000_000) as libc::time_t;
            (*tp).tv_nsec = (ns % 1_000_000_000) as libc::c_long;
        }
        return 0;
    }
    // SAFETY: the system call with the caller's arguments, as libc makes it.
    unsafe { libc::syscall(libc::SYS_clock_gettime, clock, tp) as libc::c_int }
}

#[derive(Parser)]
#[command(
    name = "sluice-sim",
    about = "Sluice's cluster under a deterministic simulator"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// One run in this process: prints its report (JSON) and, if it
    /// failed, the violations and the schedule; exits 1 on failure.
    Run {
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Simulated seconds (at least 60).
        #[arg(long, default_value_t = 60)]
        secs: u64,
        /// Which faults the seed draws.
        #[arg(long, value_enum, default_value_t = Mix::Any)]
        mix: Mix,
        /// Nodes, instead of the 3–7 the seed draws.
        #[arg(long)]
        nodes: Option<usize>,
        /// Replay this schedule (JSON) instead of drawing one.
        #[arg(long)]
        schedule: Option<PathBuf>,
        /// Print only the report line.
        #[arg(long)]
        quiet: bool,
        /// Print every call of this key (its whole history).
        #[arg(long)]
        key: Option<usize>,
    },
    /// Many seeds, each in a process of its own; prints failures and the
    /// rate (simulated seconds per wall second, seeds per hour).
    Seeds {
        #[arg(long, default_value_t = 0)]
        from: u64,
        #[arg(long, default_value_t = 100)]
        count: u64,
        #[arg(long, default_value_t = 60)]
        secs: u64,
        /// Runs at once.
        #[arg(long, default_value_t = 2)]
        jobs: usize,
        /// Which faults the seeds draw.
        #[arg(long, value_enum, default_value_t = Mix::Any)]
        mix: Mix,
        /// Nodes, instead of the 3–7 each seed draws.
        #[arg(long)]
        nodes: Option<usize>,
    },
    /// Shrink a failing run to fewer faults that still fail; writes the
    /// schedule.
    Shrink {
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long, default_value_t = 60)]
        secs: u64,
        #[arg(long)]
        schedule: Option<PathBuf>,
        #[arg(long)]
        out: PathBuf,
        /// Runs to try at most.
        #[arg(long, default_value_t = 60)]
        budget: usize,
    },
    /// Print the schedule a seed draws.
    Schedule {
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long, default_value_t = 60)]
        secs: u64,
        #[arg(long, value_enum, default_value_t = Mix::Any)]
        mix: Mix,
    },
}

fn load(seed: u64, secs: u64, mix: Mix, nodes: Option<usize>, file: &Option<PathBuf>) -> Schedule {
    match file {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            Schedule::from_json(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        }
        None => Schedule::draw_sized(seed, secs, mix, nodes),
    }
}

/// Run `schedule` in a child process; its report.
fn child(schedule: &Schedule) -> Report {
    let dir = std::env::temp_dir().join(format!("sluice-sim-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join(format!("{}-{}.json", schedule.seed, schedule.faults.len()));
    std::fs::write(
        &path,
        serde_json::to_string(schedule).expect("serializable"),
    )
    .expect("writes the schedule");
    let out = Command::new(std::env::current_exe().expect("its own path"))
        .args(["run", "--quiet", "--schedule"])
        .arg(&path)
        .output()
        .expect("runs a child");
    let _ = std::fs::remove_file(&path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.lines().last().map(serde_json::from_str::<Report>) {
        Some(Ok(r)) => r,
        _ => Report {
            seed: schedule.seed,
            nodes: schedule.nodes,
            faults: schedule.faults.len(),
            calls: 0,
            admitted: 0,
            approximate: 0,
            failed: 0,
            hash: String::new(),
            violations: vec![format!(
                "the run crashed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .rev()
                    .take(20)
                    .collect::<Vec<_>>()
                    .join("\n")
            )],
            moved_ports: 0,
            doubt_checked: 0,
            resets: 0,
            resets_answered: 0,
            monotonic_secs: 0.0,
            sim_secs: 0.0,
            wall_secs: 0.0,
        },
    }
}

/// The log's stamp under the simulator: the run's time and the host
/// logging, so one node's story can be read out of the run's.
struct SimStamp;

impl tracing_subscriber::fmt::time::FormatTime for SimStamp {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        use std::sync::atomic::Ordering::Relaxed;
        let ms = sluice_sim::sim::LOG_NOW.load(Relaxed) as f64 / 1e6;
        match sluice_sim::sim::LOG_HOST.load(Relaxed) {
            u64::MAX => write!(w, "{ms:10.3} app"),
            n => write!(w, "{ms:10.3} n{n}"),
        }
    }
}

fn main() {
    let cli = Cli::parse();
    if let Ok(filter) = std::env::var("SIM_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_timer(SimStamp)
            .with_ansi(false)
            .init();
    }
    match cli.command {
        Cmd::Run {
            seed,
            secs,
            mix,
            nodes,
            schedule,
            quiet,
            key,
        } => {
            let schedule = load(seed, secs, mix, nodes, &schedule);
            // The run gets a thread of its own, started after the stream is
            // seeded: std draws a thread's hash keys on its first hash map,
            // and whatever this thread drew before (a log subscriber's maps,
            // say) must not move the run's.
            STREAM.store(splitmix(schedule.seed ^ 0x5151), Ordering::Relaxed);
            let (report, history) = std::thread::scope(|scope| {
                std::thread::Builder::new()
                    .name("sluice-sim".into())
                    .spawn_scoped(scope, || {
                        SIMULATED.with(|s| s.set(true));
                        sluice_sim::run_with_history(&schedule)
                    })
                    .expect("a thread for the run")
                    .join()
                    .unwrap_or_else(|p| std::panic::resume_unwind(p))
            });
            if let Some(k) = key {
                for c in history.calls.iter().filter(|c| c.key == k) {
                    println!("{c}");
                }
            }
            if !quiet && !report.passed() {
                eprintln!("seed {} FAILED:", schedule.seed);
                for v in &report.violations {
                    eprintln!("- {v}");
                }
                eprintln!(
                    "schedule (replay: sluice-sim run --schedule FILE):\n{}",
                    serde_json::to_string_pretty(&schedule).expect("serializable")
                );
            }
            println!("{}", serde_json::to_string(&report).expect("serializable"));
            std::process::exit(if report.passed() { 0 } else { 1 });
        }
        Cmd::Seeds {
            from,
            count,
            secs,
            jobs,
            mix,
            nodes,
        } => {
            let started = std::time::Instant::now();
            let next = std::sync::atomic::AtomicU64::new(from);
            let results = std::sync::Mutex::new(Vec::new());
            std::thread::scope(|scope| {
                for _ in 0..jobs.max(1) {
                    scope.spawn(|| {
                        loop {
                            let seed = next.fetch_add(1, Ordering::SeqCst);
                            if seed >= from + count {
                                return;
                            }
                            let r = child(&Schedule::draw_sized(seed, secs, mix, nodes));
                            let line = format!(
                                "seed {seed}: {} ({} nodes, {} faults, {} calls, {} checked for doubt, {}/{} resets answered, {:.1} s)",
                                if r.passed() { "ok" } else { "FAILED" },
                                r.nodes,
                                r.faults,
                                r.calls,
                                r.doubt_checked,
                                r.resets_answered,
                                r.resets,
                                r.wall_secs
                            );
                            println!("{line}");
                            if !r.passed() {
                                for v in &r.violations {
                                    println!("  - {}", v.lines().next().unwrap_or(""));
                                }
                            }
                            let _ = std::io::stdout().flush();
                            results.lock().unwrap_or_else(|p| p.into_inner()).push(r);
                        }
                    });
                }
            });
            let results = results.into_inner().unwrap_or_else(|p| p.into_inner());
            let wall = started.elapsed().as_secs_f64();
            let sim: f64 = results.iter().map(|r| r.sim_secs).sum();
            let failed: Vec<u64> = results
                .iter()
                .filter(|r| !r.passed())
                .map(|r| r.seed)
                .collect();
            println!(
                "{} seeds in {wall:.0} s ({:.0} seeds/hour, {:.1} simulated s per wall s over {jobs} jobs); {} losses' keys checked for needless doubt; {} failed: {failed:?}",
                results.len(),
                results.len() as f64 * 3_600.0 / wall,
                sim / wall,
                results.iter().map(|r| r.doubt_checked).sum::<usize>(),
                failed.len()
            );
            std::process::exit(if failed.is_empty() { 0 } else { 1 });
        }
        Cmd::Shrink {
            seed,
            secs,
            schedule,
            out,
            budget,
        } => {
            let schedule = load(seed, secs, Mix::Any, None, &schedule);
            let first = child(&schedule);
            if first.passed() {
                eprintln!("seed {}: the run passes; nothing to shrink", schedule.seed);
                std::process::exit(2);
            }
            eprintln!(
                "seed {}: fails with {} faults; shrinking",
                schedule.seed,
                schedule.faults.len()
            );
            let small = sluice_sim::shrink::shrink(&schedule, budget, |s| {
                let r = child(s);
                eprintln!(
                    "  {} faults: {}",
                    s.faults.len(),
                    if r.passed() { "passes" } else { "fails" }
                );
                !r.passed()
            });
            std::fs::write(
                &out,
                serde_json::to_string_pretty(&small).expect("serializable") + "\n",
            )
            .expect("writes the schedule");
            let r = child(&small);
            eprintln!(
                "{} faults left, written to {}; it fails with:",
                small.faults.len(),
                out.display()
            );
            for v in &r.violations {
                eprintln!("- {v}");
            }
        }
        Cmd::Schedule { seed, secs, mix } => {
            println!(
                "{}",
                serde_json::to_string_pretty(&Schedule::draw(seed, secs, mix))
                    .expect("serializable")
            );
        }
    }
}
