//! `sluice.v1.RateLimiter`: the public API. Converts, calls the limiter,
//! converts back — no business rules here.

use std::time::Instant;

use tonic::{Request, Response, Status};

use super::admission::Admission;
use super::wire;
use crate::config::Limits;
use crate::limiter::{Check, ItemError, Limiter, Verdict};
use crate::proto::v1 as pb;
use crate::proto::v1::rate_limiter_server::RateLimiter;

/// Items from which a call is decided on the bulk lane rather than on a
/// runtime worker (a few times the limiter's `YIELD_EVERY`).
const BULK_ITEMS: usize = 128;

pub struct RateLimiterService {
    limiter: Limiter,
    limits: Limits,
    /// The node's admission bounds, shared with the other front ends.
    admission: Admission,
}

impl RateLimiterService {
    pub fn new(limiter: Limiter, limits: Limits, admission: Admission) -> RateLimiterService {
        RateLimiterService {
            limiter,
            limits,
            admission,
        }
    }
}

#[tonic::async_trait]
impl RateLimiter for RateLimiterService {
    async fn check(
        &self,
        request: Request<pb::CheckRequest>,
    ) -> Result<Response<pb::CheckResponse>, Status> {
        let started = Instant::now();
        let budget = super::deadline::grpc_timeout(request.metadata());
        let mut requests = request.into_inner().requests;
        if let Err(e) = self.admission.batch("requests", requests.len()) {
            let mut status = Status::resource_exhausted(e.to_string());
            status.metadata_mut().insert(
                sluice_api::MAX_BATCH_METADATA,
                tonic::metadata::MetadataValue::from(e.max as u64),
            );
            return Err(status);
        }
        let Ok(_admitted) = self.admission.admit() else {
            // Saturated: answer at once with a typed reason instead of
            // queueing work whose caller may already have given up.
            let responses = requests
                .into_iter()
                .map(|r| {
                    let mut response = wire::overloaded();
                    response.request_id = r.request_id;
                    response.metadata = r.metadata;
                    response
                })
                .collect();
            return Ok(Response::new(pb::CheckResponse { responses }));
        };
        let checks: Vec<_> = requests
            .iter_mut()
            .map(|r| wire::check_from_wire(r, &self.limits))
            .collect();
        let verdicts = if checks.len() >= BULK_ITEMS {
            decide_in_bulk(&self.limiter, checks, budget).await?
        } else {
            self.limiter.check_batch_within(checks, budget).await
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
            .observe(started.elapsed().as_secs_f64());
        Ok(Response::new(pb::CheckResponse { responses }))
    }
}

/// Decide a large call on the bulk lane (`bulk.rs`: why), not on a worker.
async fn decide_in_bulk(
    limiter: &Limiter,
    checks: Vec<Result<Check, ItemError>>,
    budget: Option<std::time::Duration>,
) -> Result<Vec<Result<Verdict, ItemError>>, Status> {
    let limiter = limiter.clone();
    super::bulk::run(async move { limiter.check_batch_within(checks, budget).await })
        .await
        .ok_or_else(|| Status::internal("deciding the batch failed"))
}
