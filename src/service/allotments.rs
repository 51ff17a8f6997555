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
        let check = wire::check_from_wire(&mut r, &self.limits);
        // The report it carries first, and not behind admission (as a
        // `Report` call's): what it applies is no longer the app's to hold.
        let of_key = check
            .as_ref()
            .ok()
            .map(|c| (&c.name[..], &c.unique_key[..]));
        let (report, reported) = match ask.report {
            Some(report) if !report.client_id.is_empty() && report.client_id != client => (
                Some(invalid("report.client_id", "the ask's client_id, or unset")),
                0,
            ),
            Some(report) => {
                let (response, reported) =
                    self.apply_report(client, report.sequence, report.spent, of_key);
                (Some(response), reported)
            }
            None => (None, 0),
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
                report,
            }));
        };
        let outcome = match check {
            Ok(check) => {
                // The app counts its report's hits as unreported until it
                // hears the acknowledgement this answer carries: those of
                // this key are reported now, not held.
                let unreported = ask.unreported.map(|u| u.saturating_sub(reported));
                self.limiter
                    .allot(
                        check,
                        client,
                        AppAsk {
                            demand: ask.demand,
                            unused: ask.unused,
                            unreported,
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
            report,
        }))
    }

    async fn report(
        &self,
        request: Request<pb::ReportRequest>,
    ) -> Result<Response<pb::ReportResponse>, Status> {
        let report = request.into_inner();
        let client = client_id(&report.client_id)?;
        let (response, _) = self.apply_report(client, report.sequence, report.spent, None);
        Ok(Response::new(response))
    }
}

impl AllotmentsService {
    /// Apply an app's report (a `Report` call's, or one carried by an
    /// ask): its acknowledgement, and the hits it reported of `of_key`
    /// (name, unique key) when it is applied now (0 otherwise: a duplicate
    /// may be a resend of one still being applied by a call the app gave
    /// up on, so its hits may not be counted yet — the app's figure of
    /// what it holds unreported stays as it said, which is never less).
    fn apply_report(
        &self,
        client: &str,
        sequence: u64,
        spent: Vec<pb::RateLimitRequest>,
        of_key: Option<(&str, &str)>,
    ) -> (pb::ReportResponse, u64) {
        if sequence == 0 {
            return (invalid("sequence", "starts at 1"), 0);
        }
        if spent.len() > MAX_REPORT_ITEMS {
            let message = format!(
                "at most {MAX_REPORT_ITEMS} items per report, got {}",
                spent.len()
            );
            return (invalid("spent", &message), 0);
        }
        // Not behind admission: a report only lowers what is promised, and
        // one held back past the grace would have its tokens promised again
        // while its spending still counts when it lands.
        let checks: Vec<_> = spent
            .into_iter()
            .map(|mut r| wire::check_from_wire(&mut r, &self.limits))
            .collect();
        let reported = of_key.map_or(0, |(name, key)| {
            checks
                .iter()
                .flatten()
                .filter(|c| c.name == name && c.unique_key == key)
                .fold(0u64, |sum, c| sum.saturating_add(c.request.hits))
        });
        let ack = self.limiter.client_report(client, sequence, checks);
        let (ack, errors, reported) = match ack {
            ClientAck::Applied(errors) => (pb::Ack::Applied, errors, reported),
            ClientAck::Duplicate => (pb::Ack::Duplicate, Vec::new(), 0),
            ClientAck::Retry => (pb::Ack::Retry, Vec::new(), 0),
        };
        let response = pb::ReportResponse {
            ack: ack as i32,
            errors: errors
                .iter()
                .map(|e| pb::Error {
                    code: tonic::Code::InvalidArgument as i32,
                    field: e.field.to_string(),
                    message: e.message.clone(),
                })
                .collect(),
        };
        (response, reported)
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
