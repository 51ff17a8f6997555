//! Where a node's work off the request path runs.
//!
//! In production three kinds of work leave the runtime's workers: gossip
//! runs on a thread with a runtime of its own (a saturated request path
//! must not delay heartbeats into a false "dead" verdict), large calls on
//! the bulk lane's low-priority pool (`service::bulk`), and blocking work
//! (the idle-key sweep, joining the gossip thread) on tokio's blocking
//! pool. That is [`Threads::Own`].
//!
//! The deterministic simulator runs every node of a cluster on one thread,
//! each on a runtime whose clock it advances by hand: a thread of the
//! node's own would run on the operating system's schedule and clock, and
//! no run could be replayed. There the same work runs on the node's own
//! runtime, as tasks: [`Threads::Inline`]. The code each kind runs is the
//! same either way; only the executor differs.

/// Where gossip, the bulk lane and blocking work run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Threads {
    /// Threads of their own (production).
    #[default]
    Own,
    /// On the runtime that starts them (the simulator).
    Inline,
}

impl Threads {
    /// Run blocking work `f`: on tokio's blocking pool, or inline. `None`
    /// if it panicked.
    pub async fn blocking<T, F>(self, f: F) -> Option<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        match self {
            Threads::Own => match tokio::task::spawn_blocking(f).await {
                Ok(t) => Some(t),
                Err(e) => {
                    tracing::error!(error = %e, "blocking work failed");
                    None
                }
            },
            Threads::Inline => Some(f()),
        }
    }
}
