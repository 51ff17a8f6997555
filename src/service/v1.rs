//! `sluice.v1.RateLimiter`: the public API. Converts, calls the limiter,
//! converts back — no business rules here.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Semaphore;

use tonic::{Request, Response, Status};

use super::wire;
use crate::config::Limits;
use crate::limiter::Limiter;
use crate::proto::v1 as pb;
use crate::proto::v1::rate_limiter_server::RateLimiter;

pub struct RateLimiterService {
    limiter: Limiter,
    limits: Limits,
    /// Calls in progress; a call that finds none left is shed, not queued.
    in_flight: Arc<Semaphore>,
}

impl RateLimiterService {
    pub fn new(limiter: Limiter, limits: Limits) -> RateLimiterService {
        let in_flight = Arc::new(Semaphore::new(limits.max_in_flight_checks.max(1)));
        RateLimiterService {
            limiter,
            limits,
            in_flight,
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
        let requests = request.into_inner().requests;
        if requests.len() > self.limits.max_batch {
            self.limiter.metrics().resources.exhausted("requests");
            return Err(Status::resource_exhausted(format!(
                "requests: at most {} per call, got {}",
                self.limits.max_batch,
                requests.len()
            )));
        }
        let Ok(_permit) = self.in_flight.clone().try_acquire_owned() else {
            // Saturated: answer at once with a typed reason instead of
            // queueing work whose caller may already have given up.
            self.limiter.metrics().overloaded.inc();
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
        let in_flight =
            self.limits.max_in_flight_checks.max(1) - self.in_flight.available_permits();
        self.limiter.metrics().in_flight.set(in_flight as i64);
        let checks = requests
            .iter()
            .map(|r| wire::check_from_wire(r, &self.limits))
            .collect();
        let verdicts = self.limiter.check_batch_within(checks, budget).await;
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
