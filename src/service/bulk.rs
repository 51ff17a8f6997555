//! The bulk lane: a call with many items is decided on a small pool of
//! threads of its own, at a lower OS priority than the runtime's workers,
//! so small calls are not queued behind it.
//!
//! Why not on the runtime: a 1,000-item batch is milliseconds of work. On a
//! worker it sat in front of every small call queued there, and its yields
//! let only one other task run between its slices, so a steady one-item
//! caller beside a key flood waited behind the flood's slices at each of its
//! hops (read, decide, write). Why not tokio's blocking pool: its threads
//! also run the sweep, file reads and name lookups, a thread's priority
//! cannot be raised back without privilege once lowered, and a blocking
//! thread would sit idle through a batch's forwards.
//!
//! The pool is an executor (`futures`' thread pool), not threads blocked in
//! `block_on`: a batch waiting on a forward or a pull parks, and its thread
//! decides another batch meanwhile, so one slow peer holds no thread. Each
//! poll enters the caller's runtime (`Handle::enter`), so the batch has the
//! same clock, timers and connections as on a worker; the runtime's driver
//! wakes it, and the pool polls it again.
//!
//! The threads run under `SCHED_IDLE`, the lowest weight the kernel has
//! (a nice-0 thread weighs ~340 times more), and a worker woken by a small
//! call preempts them at once. Measured beside a 10M-key flood
//! (`tests/key_flood.rs`), the steady caller's p99 was 4–5 ms with the lane
//! at nice +10 — the kernel lets a running thread finish its slice before a
//! woken one of higher weight runs — and 1.8–3.3 ms under `SCHED_IDLE`.
//!
//! What that costs: the lane gets the cycles the node's small calls leave.
//! Under the cgroup CPU controller (a container or a pod; a systemd service
//! with `CPUWeight=` or `CPUQuota=`) it competes only within Sluice's group,
//! whose share of the host is set by the group's weight; without it (a bare
//! process on a busy host) with every thread of the host. A starved lane
//! could hold calls in progress for long — a started job runs to its end,
//! past its caller's deadline — so admission gives the lane at most
//! `MAX_JOBS` of the node's calls (`Admission::admit_bulk`): beyond that a
//! large call is answered "overloaded" at once, and small calls keep their
//! places. Where `SCHED_IDLE` is refused (a seccomp profile) the threads
//! fall back to nice +10; where the pool cannot start, large calls are
//! decided on the runtime as before.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};

use futures::executor::ThreadPool;

use crate::threads::Threads;

/// Jobs the lane holds at once, per node: eight per pool thread on a
/// two-core machine. Enough to keep the threads busy while batches wait on
/// peers; few enough that a starved lane holds a small share of a node's
/// calls in progress.
pub const MAX_JOBS: usize = 16;

/// The niceness of the pool's threads where `SCHED_IDLE` is refused:
/// lower priority than the workers' (0), never a higher one.
const NICE: libc::c_int = 10;

/// Run `work` on the bulk lane; its output, or `None` if it panicked.
///
/// The lane's queue has the bound of whatever `work` holds: the caller moves
/// its admission permits into it (`Admission::admit_bulk`), so a job holds
/// its place until it ends or is dropped, however early the caller goes
/// away. A caller gone before
/// its job's first poll cancels it (nobody would see the answer); once
/// started, a job runs to its end whether or not the caller waits.
pub async fn run<F, T>(threads: Threads, work: F) -> Option<T>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    // Inline (the simulator): the same work, on the caller's runtime.
    let pool = match threads {
        Threads::Own => pool(),
        Threads::Inline => None,
    };
    let Some(pool) = pool else {
        return Some(work.await);
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    pool.spawn_ok(OnRuntime {
        runtime: tokio::runtime::Handle::current(),
        work: Box::pin(async move {
            if !tx.is_closed() {
                let _ = tx.send(work.await);
            }
        }),
    });
    rx.await.ok()
}

/// A job: polled with its caller's runtime entered. A panic ends it (its
/// sender dropped with it: the caller sees `None`) and not the pool's
/// thread, which `futures`' pool would otherwise lose for good.
struct OnRuntime {
    runtime: tokio::runtime::Handle,
    work: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl Future for OnRuntime {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        let _entered = this.runtime.enter();
        std::panic::catch_unwind(AssertUnwindSafe(|| this.work.as_mut().poll(cx)))
            .unwrap_or(Poll::Ready(()))
    }
}

/// The process's pool: one thread per core, started on first use; `None`
/// if it could not start. Process-wide (as tokio's blocking pool is)
/// rather than one per server: nodes in one process (tests) share the
/// cores anyway, and each job carries its own runtime.
fn pool() -> Option<&'static ThreadPool> {
    static POOL: OnceLock<Option<ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        ThreadPool::builder()
            .pool_size(threads)
            .name_prefix("sluice-bulk-")
            .after_start(|_| lower_priority())
            .create()
            .inspect_err(|e| tracing::error!(error = %e, "the bulk lane cannot start"))
            .ok()
    })
    .as_ref()
}

/// Put the calling thread under `SCHED_IDLE`, or at nice +10 if refused.
fn lower_priority() {
    // On Linux a thread's policy and nice value are its own: pid 0 and
    // `who` 0 are this thread.
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler reads `param` only during the call, and
    // setpriority reads only its integer arguments.
    let idle = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } == 0;
    if !idle && unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, NICE) } != 0 {
        tracing::warn!("the bulk lane runs at the workers' priority: both priority calls failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The job's thread: its name, policy and nice value, and whether it
    /// sees the caller's runtime.
    fn where_am_i() -> (Option<String>, libc::c_int, libc::c_int, bool) {
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
    }

    #[tokio::test]
    async fn a_job_runs_on_a_lower_priority_thread_of_the_callers_runtime() {
        let (name, policy, nice, in_runtime) =
            run(Threads::Own, async { where_am_i() }).await.unwrap();
        assert!(name.unwrap().starts_with("sluice-bulk-"));
        assert!(
            policy == libc::SCHED_IDLE || nice >= NICE,
            "policy {policy}, nice {nice}"
        );
        assert!(in_runtime, "the job sees its caller's runtime");
    }

    #[tokio::test]
    async fn a_job_waiting_on_the_runtime_holds_no_thread() {
        assert!(pool().is_some(), "the pool started (else jobs run inline)");
        // More jobs than the pool has threads, each parked on the runtime's
        // timer until all have started: were a waiting job to hold its
        // thread, the last would never start and this would not end.
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let started = std::sync::Arc::new(tokio::sync::Barrier::new(threads * 2 + 1));
        let jobs: Vec<_> = (0..threads * 2)
            .map(|i| {
                let started = started.clone();
                tokio::spawn(run(Threads::Own, async move {
                    started.wait().await;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    i
                }))
            })
            .collect();
        tokio::time::timeout(Duration::from_secs(20), started.wait())
            .await
            .expect("every job started while the others waited");
        for (i, job) in jobs.into_iter().enumerate() {
            assert_eq!(job.await.unwrap(), Some(i));
        }
    }

    #[tokio::test]
    async fn a_job_that_panics_answers_none_and_the_lane_goes_on() {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        for _ in 0..threads + 1 {
            assert_eq!(
                run(Threads::Own, async { panic!("a bad job") }).await,
                None::<()>
            );
        }
        assert_eq!(run(Threads::Own, async { 7 }).await, Some(7));
    }
}
