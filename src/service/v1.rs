//! `sluice.v1.RateLimiter`: the public API. Converts, calls the limiter,
//! converts back — no business rules here. `CheckStream`'s driver is
//! `check_stream.rs`; each of its messages is decided here as a `Check`.

use tokio::time::Instant;

use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use super::admission::Admission;
use super::wire;
use crate::config::Limits;
use crate::limiter::{Check, ItemError, Limiter, Verdict};
use crate::proto::v1 as pb;
use crate::proto::v1::rate_limiter_server::RateLimiter;
use crate::threads::Threads;

/// Items from which a call is decided on the bulk lane rather than on a
/// runtime worker: eight of the limiter's `YIELD_EVERY` slices. A smaller call
/// stays on the worker, where a caller that goes away cancels it between
/// slices; a bulk call, once started, is decided to its end.
const BULK_ITEMS: usize = 128;

/// Cheap to clone (handles all): each `CheckStream` driver holds one.
#[derive(Clone)]
pub struct RateLimiterService {
    limiter: Limiter,
    limits: Limits,
    /// The node's admission bounds, shared with the other front ends.
    admission: Admission,
    /// Cancelled when the node stops: streams answer what is in flight and
    /// end (`check_stream.rs`), so the server's graceful shutdown is not
    /// held open by a client's long-lived stream.
    stopping: CancellationToken,
}

impl RateLimiterService {
    pub fn new(
        limiter: Limiter,
        limits: Limits,
        admission: Admission,
        stopping: CancellationToken,
    ) -> RateLimiterService {
        RateLimiterService {
            limiter,
            limits,
            admission,
            stopping,
        }
    }

    pub(super) fn metrics(&self) -> std::sync::Arc<crate::metrics::Metrics> {
        self.limiter.metrics().clone()
    }

    /// One `Check` call decided, `arrived` at the node with `budget` to
    /// run: what a unary call answers, and a stream's message.
    pub(super) async fn decide(
        &self,
        mut requests: Vec<pb::RateLimitRequest>,
        budget: Option<std::time::Duration>,
        arrived: Instant,
    ) -> Result<pb::CheckResponse, Status> {
        if let Err(e) = self.admission.batch("requests", requests.len()) {
            let mut status = Status::resource_exhausted(e.to_string());
            status.metadata_mut().insert(
                sluice_api::MAX_BATCH_METADATA,
                tonic::metadata::MetadataValue::from(e.max as u64),
            );
            return Err(status);
        }
        // Saturated: answer at once with a typed reason instead of queueing
        // work whose caller may already have given up.
        let Ok(admitted) = self.admission.admit() else {
            return Ok(overloaded(requests));
        };
        let lane = if requests.len() >= BULK_ITEMS {
            let Ok(place) = self.admission.admit_bulk() else {
                return Ok(overloaded(requests));
            };
            Some((admitted, place))
        } else {
            None
        };
        let checks: Vec<_> = requests
            .iter_mut()
            .map(|r| wire::check_from_wire(r, &self.limits))
            .collect();
        let verdicts = match lane {
            Some(places) => {
                decide_in_bulk(
                    &self.limiter,
                    self.admission.lane(),
                    checks,
                    budget,
                    arrived,
                    places,
                )
                .await?
            }
            None => self.limiter.check_batch_within(checks, budget).await,
        };
        let now = self.limiter.now();
        let responses = requests
            .into_iter()
            .zip(verdicts)
            .map(|(r, outcome)| {
                let mut response = match outcome {
                    Ok(verdict) => wire::verdict_to_wire(&verdict, now),
                    Err(e) => {
                        self.limiter.metrics().invalid(e.field);
                        wire::error_to_wire(&e)
                    }
                };
                response.request_id = r.request_id;
                response.metadata = r.metadata;
                response
            })
            .collect();
        self.limiter
            .metrics()
            .check_latency
            .observe(arrived.elapsed().as_secs_f64());
        Ok(pb::CheckResponse { responses })
    }
}

#[tonic::async_trait]
impl RateLimiter for RateLimiterService {
    async fn check(
        &self,
        request: Request<pb::CheckRequest>,
    ) -> Result<Response<pb::CheckResponse>, Status> {
        let arrived = Instant::now();
        let budget = super::deadline::grpc_timeout(request.metadata());
        let requests = request.into_inner().requests;
        self.decide(requests, budget, arrived)
            .await
            .map(Response::new)
    }

    type CheckStreamStream = super::check_stream::Answers;

    async fn check_stream(
        &self,
        request: Request<Streaming<pb::CheckStreamRequest>>,
    ) -> Result<Response<Self::CheckStreamStream>, Status> {
        let idle = self.limits.idle_connection_timeout;
        let stopping = self.stopping.clone();
        Ok(Response::new(super::check_stream::serve(
            self.clone(),
            request.into_inner(),
            idle,
            stopping,
        )))
    }
}

/// Every item of a call answered "overloaded".
fn overloaded(requests: Vec<pb::RateLimitRequest>) -> pb::CheckResponse {
    let responses = requests
        .into_iter()
        .map(|r| {
            let mut response = wire::overloaded();
            response.request_id = r.request_id;
            response.metadata = r.metadata;
            response
        })
        .collect();
    pb::CheckResponse { responses }
}

/// Decide a large call on the bulk lane (`bulk.rs`: why), not on a worker.
/// The job holds the call's places in admission (`places`: the node's and
/// the lane's), so the lane never holds more jobs than admission lets it,
/// even from callers that went away. Its budget is what is left of the
/// caller's `grpc-timeout` when it starts, not the whole of it again after
/// its wait in the lane's queue (the limiter's floor still applies: a job
/// starting at its deadline gets the limiter's minimum; a call with no
/// timeout gets the limiter's default).
async fn decide_in_bulk(
    limiter: &Limiter,
    threads: Threads,
    checks: Vec<Result<Check, ItemError>>,
    budget: Option<std::time::Duration>,
    arrived: Instant,
    places: (
        super::admission::Admitted,
        tokio::sync::OwnedSemaphorePermit,
    ),
) -> Result<Vec<Result<Verdict, ItemError>>, Status> {
    let limiter = limiter.clone();
    super::bulk::run(threads, async move {
        let _places = places;
        let budget = budget.map(|b| b.saturating_sub(arrived.elapsed()));
        limiter.check_batch_within(checks, budget).await
    })
    .await
    .ok_or_else(|| Status::internal("deciding the batch failed"))
}
