//! `sluice.peer.v1.Peer`: the owner's side of a forward. Authenticated when a
//! cluster secret is set; converts, asks the limiter, converts back.

use tonic::{Request, Response, Status};

use crate::algorithm::{Bounds, Request as Cost};
use crate::cluster::auth::{Secret, TOKEN_HEADER};
use crate::cluster::wire;
use crate::limiter::{Absorb, Ask, Check, Forwarded, LimitRef, Limiter, Mode, ReportOutcome};
use crate::proto::PEER_PROTOCOL_VERSION;
use crate::proto::peer as pb;
use crate::proto::peer::peer_server::Peer;

pub struct PeerService {
    limiter: Limiter,
    secret: Secret,
    bounds: Bounds,
    max_items: usize,
    /// The protocol this node speaks: below 2 it answers `Sync` and `Pull`
    /// as a previous version would (unimplemented).
    protocol: u32,
}

impl PeerService {
    pub fn new(
        limiter: Limiter,
        secret: Secret,
        bounds: Bounds,
        max_items: usize,
        protocol: u32,
    ) -> PeerService {
        PeerService {
            limiter,
            secret,
            bounds,
            max_items,
            protocol,
        }
    }

    fn protocol_2(&self) -> Result<(), Status> {
        if self.protocol < 2 {
            return Err(Status::unimplemented("this node speaks peer protocol 1"));
        }
        Ok(())
    }

    async fn answer(&self, item: &pb::ForwardItem, from: &str) -> pb::forward_result::Result {
        use pb::forward_result::Result as R;
        let spec = match item
            .limit
            .as_ref()
            .map(|l| wire::limit_from_wire(l, &self.bounds))
        {
            Some(Ok(spec)) => spec,
            Some(Err(e)) => return R::Error(e),
            None => return R::Error("limit: required".into()),
        };
        if item.name.is_empty() || item.unique_key.is_empty() {
            return R::Error("name and unique_key must not be empty".into());
        }
        let check = Check {
            name: item.name.clone(),
            unique_key: item.unique_key.clone(),
            limit: LimitRef::Inline(spec),
            request: Cost {
                hits: item.hits,
                drain_over_limit: item.drain_over_limit,
                nodelay: item.nodelay,
            },
            unbatched: false,
            on_owner_unreachable: None,
            mode: item.tiered.is_some().then_some(Mode::Tiered),
        };
        let ask = item.tiered.as_ref().map(|a| Ask {
            edge: from.to_string(),
            demand: a.demand,
            unused: a.unused,
        });
        match self
            .limiter
            .decide_forwarded(
                &check,
                &spec,
                item.redirected,
                item.deadline_ns,
                ask.as_ref(),
            )
            .await
        {
            Forwarded::Decided {
                decision,
                approximate,
                grant,
            } => {
                let mut d = wire::decision_to_wire(&decision, self.limiter.node_id(), approximate);
                d.grant = grant.map(|(amount, ttl_ns)| pb::Grant { amount, ttl_ns });
                R::Decision(d)
            }
            Forwarded::Redirect(node_id) => R::Redirect(pb::Redirect {
                node_id: node_id.to_string(),
            }),
            Forwarded::Expired => R::Expired(pb::Expired {}),
        }
    }
}

impl PeerService {
    /// Refuse calls without a valid peer token (when a secret is set), from
    /// a protocol more than one version apart, or with too many items.
    fn admit<T>(&self, request: &Request<T>, version: u32, items: usize) -> Result<(), Status> {
        let token = request
            .metadata()
            .get(TOKEN_HEADER)
            .and_then(|v| v.to_str().ok());
        if let Err(why) = self.secret.check_peer_token(token) {
            return Err(Status::unauthenticated(format!("peer call refused: {why}")));
        }
        if version.abs_diff(PEER_PROTOCOL_VERSION) > 1 {
            return Err(Status::failed_precondition(format!(
                "protocol_version: this node speaks {PEER_PROTOCOL_VERSION}, got {version}"
            )));
        }
        if items > self.max_items {
            return Err(Status::resource_exhausted(format!(
                "items: at most {} per call, got {items}",
                self.max_items
            )));
        }
        Ok(())
    }

    fn absorb(&self, from: &str, item: &pb::ReportItem) -> pb::ReportOutcome {
        let spec = match item
            .limit
            .as_ref()
            .map(|l| wire::limit_from_wire(l, &self.bounds))
        {
            Some(Ok(spec)) => spec,
            _ => return pb::ReportOutcome::Invalid,
        };
        if item.name.is_empty() || item.unique_key.is_empty() || from.is_empty() {
            return pb::ReportOutcome::Invalid;
        }
        let report = Absorb {
            edge: from,
            seq: item.seq,
            hits: item.hits,
            at: item.at_ns,
        };
        let outcome = self
            .limiter
            .absorb_report(&item.name, &item.unique_key, &spec, &report);
        match outcome {
            ReportOutcome::Applied => pb::ReportOutcome::Applied,
            ReportOutcome::Duplicate => pb::ReportOutcome::Duplicate,
            ReportOutcome::NotOwner => pb::ReportOutcome::NotOwner,
        }
    }
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn forward(
        &self,
        request: Request<pb::ForwardRequest>,
    ) -> Result<Response<pb::ForwardResponse>, Status> {
        self.admit(
            &request,
            request.get_ref().protocol_version,
            request.get_ref().items.len(),
        )?;
        let r = request.into_inner();
        let mut results = Vec::with_capacity(r.items.len());
        for item in &r.items {
            results.push(pb::ForwardResult {
                result: Some(self.answer(item, &r.from_node).await),
            });
        }
        Ok(Response::new(pb::ForwardResponse {
            ring_epoch: self.limiter.ring().epoch(),
            results,
        }))
    }

    async fn report(
        &self,
        request: Request<pb::ReportRequest>,
    ) -> Result<Response<pb::ReportResponse>, Status> {
        self.admit(
            &request,
            request.get_ref().protocol_version,
            request.get_ref().items.len(),
        )?;
        let r = request.into_inner();
        let outcomes = r
            .items
            .iter()
            .map(|item| self.absorb(&r.from_node, item) as i32)
            .collect();
        Ok(Response::new(pb::ReportResponse { outcomes }))
    }

    async fn sync(
        &self,
        request: Request<pb::SyncRequest>,
    ) -> Result<Response<pb::SyncResponse>, Status> {
        self.protocol_2()?;
        self.admit(
            &request,
            request.get_ref().protocol_version,
            request.get_ref().states.len(),
        )?;
        let r = request.into_inner();
        let kind = pb::SyncKind::try_from(r.kind)
            .map_err(|_| Status::invalid_argument(format!("kind: unknown value {}", r.kind)))?;
        // All or nothing: a batch with one bad state merges none of it.
        let states = r
            .states
            .iter()
            .enumerate()
            .map(|(i, state)| {
                wire::snapshot_from_wire(state, &self.bounds)
                    .map_err(|e| Status::invalid_argument(format!("states[{i}]: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let merged = states.len() as u32;
        for (key, snapshot) in states {
            self.limiter.merge_snapshot(&key, snapshot, kind);
        }
        Ok(Response::new(pb::SyncResponse { merged }))
    }

    async fn pull(
        &self,
        request: Request<pb::PullRequest>,
    ) -> Result<Response<pb::PullResponse>, Status> {
        self.protocol_2()?;
        self.admit(
            &request,
            request.get_ref().protocol_version,
            request.get_ref().keys.len(),
        )?;
        let r = request.into_inner();
        if r.from_node.is_empty() {
            return Err(Status::invalid_argument("from_node: required"));
        }
        let keys: Vec<(String, String)> =
            r.keys.into_iter().map(|k| (k.name, k.unique_key)).collect();
        let results = self
            .limiter
            .pulled_by(&r.from_node, &keys)
            .into_iter()
            .map(|state| pb::PullResult { state })
            .collect();
        Ok(Response::new(pb::PullResponse { results }))
    }
}
