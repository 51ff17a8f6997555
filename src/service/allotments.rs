//! `sluice.v1.Allotments`: apps that decide hot keys in process ask here
//! for a share of this node's allotment and report what they spent.
//! Converts, calls the limiter, converts back — the rules are in
//! `limiter::clients`.

use tonic::{Request, Response, Status};

use super::admission::Admission;
use super::wire;
use crate::config::Limits;
use crate::limiter::{AppAsk, ClientAck, Limiter};
use crate::proto::v1 as pb;
use crate::proto::v1::allotments_server::Allotments;

/// An app's id: what it chose at start (random). Bounded: every id a node
/// remembers costs memory.
const MAX_CLIENT_ID: usize = 128;

/// Items per report (recording spending is cheaper than deciding: not
/// `limits.max_batch`, which a client cannot know; sluice-client sends at
/// most 500).
const MAX_REPORT_ITEMS: usize = 1_000;

pub struct AllotmentsService {
    limiter: Limiter,
    limits: Limits,
    admission: Admission,
}

impl AllotmentsService {
    pub fn new(limiter: Limiter, limits: Limits, admission: Admission) -> AllotmentsService {
        AllotmentsService {
            limiter,
            limits,
            admission,
        }
    }
}

fn client_id(id: &str) -> Result<&str, Status> {
    if id.is_empty() || id.len() > MAX_CLIENT_ID {
        return Err(Status::invalid_argument(format!(
            "client_id: 1 to {MAX_CLIENT_ID} bytes"
        )));
    }
    Ok(id)
}

#[tonic::async_trait]
impl Allotments for AllotmentsService {
    async fn allot(
        &self,
        request: Request<pb::AllotRequest>,
    ) -> Result<Response<pb::AllotResponse>, Status> {
        let budget = super::deadline::grpc_timeout(request.metadata());
        let ask = request.into_inner();
        let client = client_id(&ask.client_id)?;
        let Some(mut r) = ask.request else {
            return Err(Status::invalid_argument("request: required"));
        };
        let Ok(_admitted) = self.admission.admit() else {
            let mut response = wire::overloaded();
            response.request_id = r.request_id;
            return Ok(Response::new(pb::AllotResponse {
                response: Some(response),
                granted: 0,
                expires_in_us: 0,
                paced: 0,
                paced_after_us: 0,
            }));
        };
        let check = wire::check_from_wire(&mut r, &self.limits);
        let outcome = match check {
            Ok(check) => {
                self.limiter
                    .allot(
                        check,
                        client,
                        AppAsk {
                            demand: ask.demand,
                            unused: ask.unused,
                            unreported: ask.unreported,
                            pace: ask.pace,
                        },
                        budget,
                    )
                    .await
            }
            Err(e) => Err(e),
        };
        let (mut response, granted, expires_in_us, (paced, paced_after_us)) = match outcome {
            Ok(a) => (
                wire::verdict_to_wire(&a.verdict, self.limiter.now()),
                a.granted,
                a.expires_in / 1_000,
                // Rounded up: the app starts the pace no earlier than lent.
                (a.paced, a.paced_after.div_ceil(1_000)),
            ),
            Err(e) => {
                self.limiter.metrics().invalid(e.field);
                (wire::error_to_wire(&e), 0, 0, (0, 0))
            }
        };
        response.request_id = r.request_id;
        response.metadata = r.metadata;
        Ok(Response::new(pb::AllotResponse {
            response: Some(response),
            granted,
            expires_in_us,
            paced,
            paced_after_us,
        }))
    }

    async fn report(
        &self,
        request: Request<pb::ReportRequest>,
    ) -> Result<Response<pb::ReportResponse>, Status> {
        let report = request.into_inner();
        let client = client_id(&report.client_id)?;
        if report.sequence == 0 {
            return Ok(Response::new(invalid("sequence", "starts at 1")));
        }
        if report.spent.len() > MAX_REPORT_ITEMS {
            return Ok(Response::new(invalid(
                "spent",
                &format!(
                    "at most {MAX_REPORT_ITEMS} items per report, got {}",
                    report.spent.len()
                ),
            )));
        }
        // Not behind admission: a report only lowers what is promised, and
        // one held back past the grace would have its tokens promised again
        // while its spending still counts when it lands.
        let checks = report
            .spent
            .into_iter()
            .map(|mut r| wire::check_from_wire(&mut r, &self.limits))
            .collect();
        let ack = self.limiter.client_report(client, report.sequence, checks);
        let (ack, errors) = match ack {
            ClientAck::Applied(errors) => (pb::Ack::Applied, errors),
            ClientAck::Duplicate => (pb::Ack::Duplicate, Vec::new()),
            ClientAck::Retry => (pb::Ack::Retry, Vec::new()),
        };
        Ok(Response::new(pb::ReportResponse {
            ack: ack as i32,
            errors: errors
                .iter()
                .map(|e| pb::Error {
                    code: tonic::Code::InvalidArgument as i32,
                    field: e.field.to_string(),
                    message: e.message.clone(),
                })
                .collect(),
        }))
    }
}

fn invalid(field: &str, message: &str) -> pb::ReportResponse {
    pb::ReportResponse {
        ack: pb::Ack::Invalid as i32,
        errors: vec![pb::Error {
            code: tonic::Code::InvalidArgument as i32,
            field: field.into(),
            message: message.into(),
        }],
    }
}
