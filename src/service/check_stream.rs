//! `RateLimiter/CheckStream`: `Check` calls on one long-lived stream.
//!
//! Why: a unary call costs an HTTP/2 stream of its own — HEADERS and
//! HPACK both ways, a task, a write per response — and for a small call
//! that is most of what the node spends on it. On a stream a call is one
//! message each way.
//!
//! What a stream must not do is escape a bound a call meets. So every
//! message is a call in every bound's sense ([`RateLimiterService::decide`]
//! decides it): admitted against `max_in_flight_checks` (answered
//! "overloaded" when the node is saturated), refused whole past
//! `max_batch` (the answer says how many the node takes, as
//! `sluice-max-batch` does on a unary call), sent to the bulk lane from
//! its size up, and run within its own `timeout_us` as a unary call within
//! its `grpc-timeout`. A `cancel` message stops a call as a caller going
//! away stops a unary one (between the limiter's slices; a bulk call, once
//! started, is decided to its end).
//!
//! A call whose id is in flight already ends the stream (INVALID_ARGUMENT,
//! once what is in flight is answered): an answer under that id would be
//! taken for the first call's.
//!
//! A stream adds bounds of its own:
//! - at most [`IN_FLIGHT`] calls at once, counting answers the client has
//!   not read yet: the driver reads no message while that many are out —
//!   HTTP/2's flow control then holds the client back, rather than a
//!   queue growing here. Calls already in flight go on being decided
//!   while the client reads slowly, so they give their places in
//!   `max_in_flight_checks` back (a stream whose client stops reading
//!   holds none of the node's budget, only its own 64 answers);
//! - `idle_connection_timeout`: a stream with no call in flight and none
//!   received for that long (a `cancel` is no call) is ended (OK; the client opens another when
//!   it needs one), so an open stream does not keep its connection from
//!   counting as idle for ever (`idle.rs` counts a stream as a call);
//! - stopping: no further message is read, what is in flight is answered,
//!   then the stream ends UNAVAILABLE — the server's graceful shutdown
//!   waits for open streams, and a client's must not hold it.
//!
//! One task per stream drives it and owns its calls' futures: when the
//! client goes away (the answers' receiver is dropped) they are dropped
//! with it, as a unary call's handler is.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use futures::future::{AbortHandle, Abortable, FutureExt as _};
use futures::stream::FuturesUnordered;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Status, Streaming};

use super::v1::RateLimiterService;
use crate::proto::v1 as pb;

/// Calls of one stream in flight at most (the API documents it).
pub const IN_FLIGHT: usize = 64;

/// What the client reads: answers, in the order they are ready.
pub type Answers = ReceiverStream<Result<pb::CheckStreamResponse, Status>>;

/// Drive `calls` in a task of its own; the answers.
pub fn serve(
    service: RateLimiterService,
    calls: Streaming<pb::CheckStreamRequest>,
    idle: Duration,
    stopping: CancellationToken,
) -> Answers {
    let (tx, rx) = mpsc::channel(IN_FLIGHT);
    // Shared by the stream's calls: one count per call, not a copy of the
    // service's handles and bounds.
    tokio::spawn(drive(Arc::new(service), calls, tx, idle, stopping));
    ReceiverStream::new(rx)
}

/// A call in flight: `serial` tells it from a later call that reuses its
/// id once it was cancelled (its future may end after the new one began).
struct InFlight {
    serial: u64,
    abort: AbortHandle,
}

async fn drive(
    service: Arc<RateLimiterService>,
    mut inbound: Streaming<pb::CheckStreamRequest>,
    tx: mpsc::Sender<Result<pb::CheckStreamResponse, Status>>,
    idle: Duration,
    stopping: CancellationToken,
) {
    let metrics = service.metrics();
    metrics.check_streams.inc();
    let _open = Open(metrics.check_streams.clone());
    let mut calls = FuturesUnordered::new();
    let mut in_flight: HashMap<u64, InFlight> = HashMap::new();
    // Answers ready and not yet taken by the client: calls go on being
    // decided (and give their place in admission back) while it reads
    // slowly. With `calls`, at most IN_FLIGHT.
    let mut outbox: VecDeque<pb::CheckStreamResponse> = VecDeque::new();
    let mut serial = 0u64;
    // False once the client half-closed, its stream failed, or the node is
    // stopping: what is in flight is answered, then the stream ends.
    let mut reading = true;
    let mut stopped = false;
    // How the stream ends when it does not end OK: a call with an id in
    // flight (the client's bug), a broken request stream (its status).
    let mut ending: Option<Status> = None;
    let quiet = tokio::time::sleep(idle);
    tokio::pin!(quiet);
    while reading || !calls.is_empty() || !outbox.is_empty() {
        tokio::select! {
            biased;
            // The client went away: its calls are dropped with `calls`.
            () = tx.closed() => return,
            room = tx.reserve(), if !outbox.is_empty() => match (room, outbox.pop_front()) {
                (Ok(room), Some(answer)) => room.send(Ok(answer)),
                _ => return,
            },
            Some((id, of, answer)) = calls.next(), if !calls.is_empty() => {
                if in_flight.get(&id).is_some_and(|c: &InFlight| c.serial == of) {
                    in_flight.remove(&id);
                }
                outbox.extend(answer);
                if calls.is_empty() {
                    quiet.as_mut().reset(Instant::now() + idle);
                }
            }
            () = stopping.cancelled(), if !stopped => {
                stopped = true;
                reading = false;
            }
            message = inbound.message(), if reading && calls.len() + outbox.len() < IN_FLIGHT => {
                let m = match message {
                    Ok(Some(m)) => m,
                    // Half-closed: answer what is in flight, end OK.
                    Ok(None) => {
                        reading = false;
                        continue;
                    }
                    // Broken (a message too large, undecodable; a client
                    // that is gone is seen by `tx.closed()`): answer what
                    // is in flight, then say why.
                    Err(status) => {
                        reading = false;
                        ending = Some(status);
                        continue;
                    }
                };
                if m.cancel {
                    if let Some(call) = in_flight.remove(&m.id) {
                        call.abort.abort();
                    }
                    continue;
                }
                // An id in flight twice: answering the second under it
                // would be read as the first's answer. The client is
                // broken: what is in flight is answered, and the stream
                // ends saying so.
                if in_flight.contains_key(&m.id) {
                    reading = false;
                    ending = Some(Status::invalid_argument(format!(
                        "id: {} is in flight on this stream already", m.id
                    )));
                    continue;
                }
                // Only a call keeps the stream from being idle (a trickle
                // of stray cancels does not).
                quiet.as_mut().reset(Instant::now() + idle);
                metrics.stream_calls.inc();
                let arrived = Instant::now();
                let budget = (m.timeout_us > 0).then(|| Duration::from_micros(m.timeout_us));
                let requests = m.check.map(|c| c.requests).unwrap_or_default();
                let (abort, registration) = AbortHandle::new_pair();
                serial += 1;
                in_flight.insert(m.id, InFlight { serial, abort });
                let (id, of, service) = (m.id, serial, service.clone());
                let call = async move { service.decide(requests, budget, arrived).await };
                calls.push(Abortable::new(call, registration).map(move |done| {
                    // Cancelled: no answer (the client said it stopped waiting).
                    let answer = done.ok().map(|result| match result {
                        Ok(check) => pb::CheckStreamResponse {
                            id,
                            check: Some(check),
                            error: None,
                        },
                        Err(status) => refusal(id, &status),
                    });
                    (id, of, answer)
                }));
            }
            () = &mut quiet, if reading && calls.is_empty() && outbox.is_empty() => break,
        }
    }
    // Said if there is room (a client that reads nothing more sees the
    // stream end without it, and opens another all the same).
    let ending = match (stopped, ending) {
        (_, Some(status)) => Some(status),
        (true, None) => Some(Status::unavailable(
            "this node is stopping: open a stream to another",
        )),
        (false, None) => None,
    };
    if let Some(status) = ending {
        let _ = tx.try_send(Err(status));
    }
}

/// A stream counted open until its driver ends, however it ends.
struct Open(prometheus_client::metrics::gauge::Gauge);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// A call that failed whole, as its unary status would have said.
fn refusal(id: u64, status: &Status) -> pb::CheckStreamResponse {
    let max_batch = status
        .metadata()
        .get(sluice_api::MAX_BATCH_METADATA)
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    pb::CheckStreamResponse {
        id,
        check: None,
        error: Some(pb::CallError {
            code: status.code() as i32,
            message: status.message().to_owned(),
            max_batch,
        }),
    }
}
