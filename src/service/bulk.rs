//! The bulk lane: a call with many items is decided on a small pool of
//! threads of its own, at a lower OS priority than the runtime's workers,
//! so small calls are not queued behind it.
//!
//! Why not on the runtime: a 1,000-item batch is milliseconds of work. On a
//! worker it sat in front of every small call queued there, and its yields
//! let only one other task run between its slices, so a steady one-item
//! caller beside a key flood waited behind the flood's slices at each of its
//! hops (read, decide, write). Why not tokio's blocking pool: its threads
//! also run the sweep, file reads and name lookups, and a thread's priority
//! cannot be raised back without privilege once lowered.
//!
//! The future still runs on the caller's runtime (`Handle::block_on`): the
//! same clock, timers and connections as on a worker. Only the OS thread
//! differs: it runs under `SCHED_IDLE`, so a worker woken by a small call
//! preempts it at once and the batch takes every cycle the node's other
//! threads leave. Measured beside a 10M-key flood (`tests/key_flood.rs`),
//! the steady caller's p99 was 4–5 ms with the lane at nice +10 — the
//! kernel lets a running thread finish its slice before a woken one of
//! higher weight runs — and 1.9–2.6 ms under `SCHED_IDLE`.
//!
//! Why that cannot starve the batch in a deployment: the kernel schedules
//! `SCHED_IDLE` threads against the other threads of their own cgroup (a
//! container, a pod, a systemd service), so the batch waits only for
//! Sluice's own workers, never for a neighbour's load; and a caller's
//! deadline still bounds what it waits. Where `SCHED_IDLE` is refused (a
//! seccomp profile), the thread falls back to nice +10.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};

/// A call's work, ready to run on a pool thread.
type Job = Box<dyn FnOnce() + Send>;

/// The niceness of the pool's threads where `SCHED_IDLE` is refused:
/// lower priority than the workers' (0), never a higher one.
const NICE: libc::c_int = 10;

/// Run `work` on the bulk lane; its output, or `None` if it panicked.
///
/// The queue is unbounded here because its bound is admission's: each
/// admitted call queues at most one job. A caller that goes away before its
/// job starts cancels it; once started, the batch is decided to its end:
/// all of it or none, never half.
pub async fn run<F, T>(work: F) -> Option<T>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let runtime = tokio::runtime::Handle::current();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        // A caller gone before its job started (its deadline passed while
        // the job queued) is not decided at all: nobody would see it.
        if !tx.is_closed() {
            let _ = tx.send(runtime.block_on(work));
        }
    });
    pool().send(job).ok()?;
    rx.await.ok()
}

/// The process's pool: one thread per core, started on first use. A
/// process-wide pool (as tokio's blocking pool is) rather than one per
/// server: nodes in one process (tests) share the cores anyway.
fn pool() -> &'static Sender<Job> {
    static POOL: OnceLock<Sender<Job>> = OnceLock::new();
    POOL.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        for _ in 0..threads {
            let rx = rx.clone();
            let started = std::thread::Builder::new()
                .name("sluice-bulk".into())
                .spawn(move || serve(&rx));
            if let Err(e) = started {
                tracing::error!(error = %e, "cannot start a bulk-lane thread");
            }
        }
        tx
    })
}

/// A pool thread: lower its own priority, then run jobs until the process
/// ends. A job that panics answers nobody (its caller sees `None`) and the
/// thread goes on.
fn serve(jobs: &Mutex<Receiver<Job>>) {
    // On Linux a thread's policy and nice value are its own: pid 0 and
    // `who` 0 are this thread.
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler reads `param` only during the call, and
    // setpriority reads only its integer arguments.
    let idle = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } == 0;
    if !idle && unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, NICE) } != 0 {
        tracing::warn!("the bulk lane runs at the workers' priority: both priority calls failed");
    }
    loop {
        // The lock is held while waiting, so one idle thread waits on the
        // queue and the others on the lock; it is released before the job.
        let job = match jobs.lock() {
            Ok(rx) => rx.recv(),
            Err(poisoned) => poisoned.into_inner().recv(),
        };
        let Ok(job) = job else { return };
        let _ = std::panic::catch_unwind(AssertUnwindSafe(job));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_job_runs_on_a_lower_priority_thread_of_the_callers_runtime() {
        let (name, policy, nice, in_runtime) = run(async {
            // SAFETY: both read only their integer arguments.
            let policy = unsafe { libc::sched_getscheduler(0) };
            let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
            let name = std::thread::current().name().map(str::to_owned);
            (
                name,
                policy,
                nice,
                tokio::runtime::Handle::try_current().is_ok(),
            )
        })
        .await
        .expect("the job ran");
        assert_eq!(name.as_deref(), Some("sluice-bulk"));
        assert!(
            policy == libc::SCHED_IDLE || nice >= NICE,
            "policy {policy}, nice {nice}"
        );
        assert!(in_runtime, "the job sees its caller's runtime");
    }

    #[tokio::test]
    async fn a_job_that_panics_answers_none_and_the_lane_goes_on() {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        for _ in 0..threads + 1 {
            assert_eq!(run(async { panic!("a bad job") }).await, None::<()>);
        }
        assert_eq!(run(async { 7 }).await, Some(7));
    }
}
