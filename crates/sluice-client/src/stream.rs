//! `Check` calls on a long-lived `CheckStream`, one per node address.
//!
//! Why: a unary call is an HTTP/2 stream of its own (headers both ways, a
//! task on the node, a write per answer); on a stream a call is one
//! message each way, which is what a small call should cost.
//!
//! Each address has a lane: a task that owns that address's stream,
//! opens it on the first call (the call rides in the opening) and again
//! after it ended, sends calls, and hands each answer to its caller by id.
//! Calls go round the lanes, skipping one whose stream could not be
//! opened for [`DOWN_FOR`]. What a unary call does, a streamed one does:
//! - a call has the client's deadline, and the time it has left goes with
//!   it (`timeout_us`); a caller that stops waiting (its deadline passed,
//!   or its future was dropped) sends `cancel` — the node stops deciding
//!   it; at most 64 calls are out on a stream (what the node reads), the
//!   rest wait in the lane, and one whose caller gave up is never sent;
//! - a stream that cannot be opened (within [`OPEN_WITHIN`], not a call's
//!   deadline: a cold connection is not a dead node), or that the node
//!   ended as it stopped, makes the lane skipped for [`DOWN_FOR`]: its
//!   calls fail at once, unsent;
//! - a stream that breaks fails every call in flight on it: their callers
//!   decide by `on_unavailable`, as for a failed call. Nothing is resent:
//!   a call may have been applied;
//! - a node that answers `UNIMPLEMENTED` (an older release, or a proxy
//!   that does not pass streams) gets unary calls for [`UNARY_FOR`], then
//!   is tried again (a rolling upgrade reaches it).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use sluice_api::v1 as pb;
use sluice_api::v1::rate_limiter_client::RateLimiterClient;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tonic::transport::Channel;

/// A lane whose stream could not be opened is skipped this long.
const DOWN_FOR: Duration = Duration::from_secs(1);
/// A node without `CheckStream` gets unary calls this long between tries.
const UNARY_FOR: Duration = Duration::from_secs(60);
/// Calls queued for one lane at most (beyond: the call fails at once, and
/// its caller decides by `on_unavailable`).
const QUEUED: usize = 1_024;
/// Calls out on one stream at most: what the node reads of one stream
/// (`RateLimiter/CheckStream`).
const IN_FLIGHT: usize = 64;
/// How long a stream may take to open (a connection, its handshake),
/// whatever the first call's deadline: a cold connection slower than a
/// 5 ms deadline is not a node down.
const OPEN_WITHIN: Duration = Duration::from_secs(2);

/// How a call ended.
pub(crate) enum Called {
    /// Answered, item by item.
    Answered(Vec<pb::RateLimitResponse>),
    /// Refused whole: too many items, when the node says how many it takes.
    TooMany(Option<usize>),
    /// No answer (the stream broke, the node could not be reached, the
    /// deadline passed).
    Failed,
}

/// Where a client's calls go: its streams, or unary calls on its channel.
#[derive(Clone)]
pub(crate) enum Calls {
    Streams(Arc<Streams>),
    Unary(RateLimiterClient<Channel>),
}

impl Calls {
    /// One `Check` call within `timeout`.
    pub(crate) async fn call(
        &self,
        requests: Vec<pb::RateLimitRequest>,
        timeout: Duration,
    ) -> Called {
        match self {
            Calls::Streams(streams) => streams.call(requests, timeout).await,
            Calls::Unary(rpc) => unary(rpc.clone(), requests, timeout).await,
        }
    }
}

/// The lanes of one client.
pub(crate) struct Streams {
    lanes: Vec<Lane>,
    next: AtomicUsize,
    ids: AtomicU64,
    epoch: Instant,
}

struct Lane {
    /// For unary calls to a node without streams.
    rpc: RateLimiterClient<Channel>,
    ops: mpsc::Sender<Op>,
    /// Milliseconds since `epoch` until which the lane is skipped (its
    /// stream could not be opened), and until which it gets unary calls.
    down_until: Arc<AtomicU64>,
    unary_until: Arc<AtomicU64>,
}

enum Op {
    Call(Call),
    Cancel(u64),
}

/// A call for the lane: sent with what is left of its time when it goes.
struct Call {
    id: u64,
    requests: Vec<pb::RateLimitRequest>,
    deadline: Instant,
    answer: oneshot::Sender<Answer>,
}

enum Answer {
    Check(pb::CheckResponse),
    Refused(pb::CallError),
    /// The node has no `CheckStream`: call it unary (the call, back).
    Unimplemented(Vec<pb::RateLimitRequest>),
}

impl Streams {
    /// A lane per channel (one channel per address). Spawns the lanes'
    /// tasks: they end when the client's last handle is dropped.
    pub(crate) fn new(channels: Vec<Channel>) -> Streams {
        let epoch = Instant::now();
        let lanes = channels
            .into_iter()
            .map(|channel| {
                let rpc = RateLimiterClient::new(channel);
                let (ops, rx) = mpsc::channel(QUEUED);
                let down_until = Arc::new(AtomicU64::new(0));
                let unary_until = Arc::new(AtomicU64::new(0));
                tokio::spawn(drive(
                    rpc.clone(),
                    rx,
                    epoch,
                    down_until.clone(),
                    unary_until.clone(),
                ));
                Lane {
                    rpc,
                    ops,
                    down_until,
                    unary_until,
                }
            })
            .collect();
        Streams {
            lanes,
            next: AtomicUsize::new(0),
            ids: AtomicU64::new(0),
            epoch,
        }
    }

    /// One call within `timeout`.
    pub(crate) async fn call(
        &self,
        requests: Vec<pb::RateLimitRequest>,
        timeout: Duration,
    ) -> Called {
        let Some(lane) = self.pick() else {
            return Called::Failed;
        };
        let now = millis(self.epoch);
        if lane.unary_until.load(Ordering::Relaxed) > now {
            return unary(lane.rpc.clone(), requests, timeout).await;
        }
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        let deadline = Instant::now() + timeout;
        let (answer, rx) = oneshot::channel();
        let op = Op::Call(Call {
            id,
            requests,
            deadline,
            answer,
        });
        if lane.ops.try_send(op).is_err() {
            return Called::Failed;
        }
        let mut waiting = Waiting {
            ops: &lane.ops,
            id,
            answered: false,
        };
        let answer = tokio::time::timeout_at(deadline, rx).await;
        waiting.answered = true;
        match answer {
            Ok(Ok(Answer::Check(r))) => Called::Answered(r.responses),
            Ok(Ok(Answer::Refused(e))) => {
                if e.code == tonic::Code::ResourceExhausted as i32 {
                    Called::TooMany((e.max_batch > 0).then_some(e.max_batch as usize))
                } else {
                    Called::Failed
                }
            }
            // What is left of its time, not a new deadline.
            Ok(Ok(Answer::Unimplemented(requests))) => {
                let left = deadline.saturating_duration_since(Instant::now());
                unary(lane.rpc.clone(), requests, left).await
            }
            // The deadline passed: the node is told to stop.
            Err(_) => {
                waiting.answered = false;
                Called::Failed
            }
            Ok(Err(_)) => Called::Failed,
        }
    }

    /// The next lane, skipping those down unless every one is.
    fn pick(&self) -> Option<&Lane> {
        let n = self.lanes.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let now = millis(self.epoch);
        (0..n)
            .map(|i| &self.lanes[(start + i) % n])
            .find(|l| l.down_until.load(Ordering::Relaxed) <= now)
            .or_else(|| self.lanes.get(start % n.max(1)))
    }
}

/// A call whose caller may stop waiting: dropped unanswered, it tells the
/// lane to cancel it on the node.
struct Waiting<'a> {
    ops: &'a mpsc::Sender<Op>,
    id: u64,
    answered: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if !self.answered {
            let _ = self.ops.try_send(Op::Cancel(self.id));
        }
    }
}

async fn unary(
    mut rpc: RateLimiterClient<Channel>,
    requests: Vec<pb::RateLimitRequest>,
    timeout: Duration,
) -> Called {
    let mut request = tonic::Request::new(pb::CheckRequest { requests });
    request.set_timeout(timeout);
    match tokio::time::timeout(timeout, rpc.check(request)).await {
        Ok(Ok(r)) => Called::Answered(r.into_inner().responses),
        Ok(Err(status)) if status.code() == tonic::Code::ResourceExhausted => {
            Called::TooMany(crate::batch::node_max_batch(&status))
        }
        _ => Called::Failed,
    }
}

fn millis(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// One lane: open a stream on its first call, drive it until it ends,
/// and again. Ends when every sender of `ops` is gone (the client was
/// dropped), half-closing its stream.
///
/// At most [`IN_FLIGHT`] calls are out on the stream (the node reads no
/// more); the rest wait here, and one whose caller gave up meanwhile is
/// never sent — sent, the node would decide it for nobody (a cancel would
/// queue behind it).
async fn drive(
    mut rpc: RateLimiterClient<Channel>,
    mut ops: mpsc::Receiver<Op>,
    epoch: Instant,
    down_until: Arc<AtomicU64>,
    unary_until: Arc<AtomicU64>,
) {
    let mut waiting: VecDeque<Call> = VecDeque::new();
    loop {
        // No stream: the next live call opens one. While the node has no
        // streams each call goes back to its caller, to be made unary;
        // while its last opening failed, each fails at once (unsent).
        let first = loop {
            let call = match waiting.pop_front() {
                Some(call) => call,
                None => match ops.recv().await {
                    None => return,
                    Some(Op::Call(call)) => call,
                    Some(Op::Cancel(_)) => continue,
                },
            };
            let now = millis(epoch);
            if call.answer.is_closed() || down_until.load(Ordering::Relaxed) > now {
                continue;
            }
            if unary_until.load(Ordering::Relaxed) > now {
                let _ = call.answer.send(Answer::Unimplemented(call.requests));
                continue;
            }
            break call;
        };
        let (out, outgoing) = mpsc::channel(IN_FLIGHT + 1);
        // Kept until the stream is open: a node without streams gets it unary.
        let requests = first.requests.clone();
        let Call {
            id,
            deadline,
            answer,
            ..
        } = first;
        let _ = out.try_send(message(id, requests.clone(), deadline));
        let opened = tokio::time::timeout(
            OPEN_WITHIN,
            rpc.check_stream(tokio_stream::wrappers::ReceiverStream::new(outgoing)),
        )
        .await;
        let mut inbound = match opened {
            Ok(Ok(r)) => r.into_inner(),
            Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => {
                let until = millis(epoch).saturating_add(UNARY_FOR.as_millis() as u64);
                unary_until.store(until, Ordering::Relaxed);
                let _ = answer.send(Answer::Unimplemented(requests));
                continue;
            }
            // Not reached: this call fails (its caller decides by
            // `on_unavailable`), and the lane is skipped a while.
            _ => {
                let until = millis(epoch).saturating_add(DOWN_FOR.as_millis() as u64);
                down_until.store(until, Ordering::Relaxed);
                continue;
            }
        };
        drop(requests);
        let mut pending: HashMap<u64, oneshot::Sender<Answer>> = HashMap::new();
        pending.insert(id, answer);
        loop {
            // Send what waits, while there is room on the stream.
            while pending.len() < IN_FLIGHT
                && let Some(call) = waiting.pop_front()
            {
                if call.answer.is_closed() || call.deadline <= Instant::now() {
                    continue;
                }
                let Call {
                    id,
                    requests,
                    deadline,
                    answer,
                } = call;
                if out.try_send(message(id, requests, deadline)).is_ok() {
                    pending.insert(id, answer);
                }
            }
            tokio::select! {
                op = ops.recv() => match op {
                    None => return,
                    Some(Op::Call(call)) => {
                        if waiting.len() < QUEUED {
                            waiting.push_back(call);
                        }
                    }
                    Some(Op::Cancel(id)) => {
                        if pending.remove(&id).is_some() {
                            let _ = out.try_send(pb::CheckStreamRequest {
                                id,
                                cancel: true,
                                ..Default::default()
                            });
                        }
                    }
                },
                answered = inbound.message() => match answered {
                    Ok(Some(r)) => {
                        if let Some(answer) = pending.remove(&r.id) {
                            let _ = answer.send(match (r.error, r.check) {
                                (Some(e), _) => Answer::Refused(e),
                                (None, check) => Answer::Check(check.unwrap_or_default()),
                            });
                        }
                    }
                    // Ended (idle) or broken: the calls in flight on it
                    // fail (dropped senders); the next call opens another.
                    // A node stopping ends it UNAVAILABLE: skip it a while.
                    Ok(None) => break,
                    Err(status) => {
                        if status.code() == tonic::Code::Unavailable {
                            let until = millis(epoch).saturating_add(DOWN_FOR.as_millis() as u64);
                            down_until.store(until, Ordering::Relaxed);
                        }
                        break;
                    }
                },
            }
        }
    }
}

/// A call's message, with the time it has left as of now.
fn message(
    id: u64,
    requests: Vec<pb::RateLimitRequest>,
    deadline: Instant,
) -> pb::CheckStreamRequest {
    let left = deadline.saturating_duration_since(Instant::now());
    pb::CheckStreamRequest {
        id,
        check: Some(pb::CheckRequest { requests }),
        timeout_us: u64::try_from(left.as_micros()).unwrap_or(u64::MAX).max(1),
        cancel: false,
    }
}
