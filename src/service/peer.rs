//! `sluice.peer.v1.Peer`: what nodes ask each other. Authenticated when a
//! cluster secret is set; converts, asks the limiter, converts back.

use std::time::Duration;

use tonic::{Request, Response, Status};

use crate::algorithm::{Bounds, Cost};
use crate::cluster::auth::{
    BURIED_HEADER, CLOCK_HEADER, EXPIRED, MEMBER_HEADER, Secret, TOKEN_HEADER,
};
use crate::cluster::peers::codec as wire;
use crate::limiter::{Absorb, Ask, Check, ForwardedItem, LimitRef, Limiter, Mode, Replication};
use crate::proto::PEER_PROTOCOL_VERSION;
use crate::proto::peer as pb;
use crate::proto::peer::peer_server::Peer;

/// A caller's membership from [`MEMBER_HEADER`]: its generation and node
/// id; `None` if malformed (the call is then judged as one without it).
fn caller(bytes: &[u8]) -> Option<(u64, String)> {
    let (generation, id) = bytes.split_first_chunk::<8>()?;
    let id = std::str::from_utf8(id).ok()?;
    Some((u64::from_be_bytes(*generation), id.to_string()))
}

pub struct PeerService {
    limiter: Limiter,
    secret: Secret,
    bounds: Bounds,
    max_items: usize,
}

impl PeerService {
    pub fn new(limiter: Limiter, secret: Secret, bounds: Bounds, max_items: usize) -> PeerService {
        PeerService {
            limiter,
            secret,
            bounds,
            max_items,
        }
    }

    /// A forwarded item as the limiter takes it, or why it is invalid.
    fn item(
        &self,
        item: &pb::ForwardItem,
        from: &str,
        received: u64,
    ) -> Result<ForwardedItem, String> {
        let spec = match item
            .limit
            .as_ref()
            .map(|l| wire::limit_from_wire(l, &self.bounds))
        {
            Some(Ok(spec)) => spec,
            Some(Err(e)) => return Err(e),
            None => return Err("limit: required".into()),
        };
        if item.name.is_empty() || item.unique_key.is_empty() {
            return Err("name and unique_key must not be empty".into());
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
            replication: (item.sync_replica && item.tiered.is_none()).then_some(Replication::Sync),
        };
        let ask = item.tiered.as_ref().map(|a| Ask {
            edge: from.to_string(),
            demand: a.demand,
            unused: a.unused,
            pace: a.pace,
        });
        // A protocol-3 edge sends how long it still waits (its clock and
        // this node's need not agree); a protocol-2 edge, its deadline.
        let deadline = if item.budget_ns > 0 {
            received.saturating_add(item.budget_ns)
        } else {
            item.deadline_ns
        };
        Ok(ForwardedItem {
            check,
            spec,
            deadline,
            ask,
        })
    }

    /// Refuse calls without a valid peer token (when a secret is set), from
    /// a protocol more than one version apart, with too many items, or from
    /// a member this node knows buried (the caller is told, and rejoins:
    /// its outbound gossip may be lost, so that gossip never tells it).
    fn admit<T>(&self, request: &Request<T>, version: u32, items: usize) -> Result<(), Status> {
        let token = request
            .metadata()
            .get(TOKEN_HEADER)
            .and_then(|v| v.to_str().ok());
        let me = self.limiter.node_id();
        if let Err(why) = self.secret.check_peer_token(token, me) {
            let mut status = Status::unauthenticated(format!("peer call refused: {why}"));
            // Stamped off this node's clock: say what it reads, so the
            // caller stamps its next tokens on it (`Secret::clock_word`).
            if why == EXPIRED
                && let Some(word) = token.and_then(|t| self.secret.clock_word(t, me))
                && let Ok(v) = word.parse()
            {
                status.metadata_mut().insert(CLOCK_HEADER, v);
            }
            return Err(status);
        }
        if let Some((generation, node_id)) = request
            .metadata()
            .get_bin(MEMBER_HEADER)
            .and_then(|v| v.to_bytes().ok())
            .and_then(|b| caller(&b))
            && self.limiter.is_buried(&node_id, generation)
        {
            let mut status = Status::failed_precondition(format!(
                "peer call refused: {node_id} generation {generation} was declared dead; rejoin"
            ));
            if let Ok(v) = generation.to_string().parse() {
                status.metadata_mut().insert(BURIED_HEADER, v);
            }
            return Err(status);
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

    /// A report as the limiter takes it; None if invalid.
    fn report_in<'a>(
        &self,
        from: &'a str,
        item: &pb::ReportItem,
    ) -> Option<(String, String, crate::algorithm::Spec, Absorb<'a>)> {
        let spec = item
            .limit
            .as_ref()
            .map(|l| wire::limit_from_wire(l, &self.bounds))?
            .ok()?;
        if item.name.is_empty() || item.unique_key.is_empty() || from.is_empty() {
            return None;
        }
        let report = Absorb {
            edge: from,
            seq: item.seq,
            hits: item.hits,
            at: item.at_ns,
            reset_gen: item.reset_gen,
        };
        Some((item.name.clone(), item.unique_key.clone(), spec, report))
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
        let received = self.limiter.now();
        let r = request.into_inner();
        let mut results: Vec<Option<pb::forward_result::Result>> = vec![None; r.items.len()];
        let mut valid = Vec::with_capacity(r.items.len());
        let mut at = Vec::with_capacity(r.items.len());
        for (i, item) in r.items.iter().enumerate() {
            match self.item(item, &r.from_node, received) {
                Ok(item) => {
                    valid.push(item);
                    at.push(i);
                }
                Err(e) => results[i] = Some(pb::forward_result::Result::Error(e)),
            }
        }
        let owner = self.limiter.node_id().clone();
        for (i, f) in at
            .into_iter()
            .zip(self.limiter.decide_forwarded(valid).await)
        {
            results[i] = Some(wire::forwarded_to_wire(f, &owner));
        }
        Ok(Response::new(pb::ForwardResponse {
            ring_epoch: self.limiter.ring().epoch(),
            results: results
                .into_iter()
                .map(|result| pb::ForwardResult { result })
                .collect(),
            now_ns: self.limiter.now(),
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
        // Report slots are kept per reporting node: only a member's reports
        // are taken (a caller inventing names would grow every entry).
        if !self.limiter.is_member(&r.from_node) {
            return Err(Status::failed_precondition(format!(
                "from_node: {:?} is not a member of this cluster",
                r.from_node
            )));
        }
        let parsed: Vec<_> = r
            .items
            .iter()
            .map(|item| self.report_in(&r.from_node, item))
            .collect();
        let valid: Vec<_> = parsed.iter().flatten().cloned().collect();
        let mut outcomes = self.limiter.absorb_reports(&valid).await.into_iter();
        let (outcomes, applied) = parsed
            .iter()
            .map(|p| match p {
                Some(_) => {
                    let (o, applied) = outcomes
                        .next()
                        .map_or((pb::ReportOutcome::Retry, 0), wire::outcome_to_wire);
                    (o as i32, applied)
                }
                None => (pb::ReportOutcome::Invalid as i32, 0),
            })
            .unzip();
        Ok(Response::new(pb::ReportResponse { outcomes, applied }))
    }

    async fn sync(
        &self,
        request: Request<pb::SyncRequest>,
    ) -> Result<Response<pb::SyncResponse>, Status> {
        self.admit(
            &request,
            request.get_ref().protocol_version,
            request.get_ref().states.len(),
        )?;
        let r = request.into_inner();
        pb::SyncKind::try_from(r.kind)
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
            self.limiter.merge_snapshot(&key, snapshot);
        }
        // After the states: the word covers what came before it.
        if r.caught_up_epoch != 0 && r.kind == pb::SyncKind::Replica as i32 {
            if r.from_node.is_empty() {
                return Err(Status::invalid_argument(
                    "from_node: required with caught_up_epoch",
                ));
            }
            // Only a member's word counts (it makes this node a holder of
            // record; and the map it goes to is bounded by the ring).
            if self.limiter.is_member(&r.from_node) {
                self.limiter
                    .owner_caught_up(&r.from_node, r.caught_up_epoch);
            }
        }
        Ok(Response::new(pb::SyncResponse { merged }))
    }

    async fn pull(
        &self,
        request: Request<pb::PullRequest>,
    ) -> Result<Response<pb::PullResponse>, Status> {
        self.admit(
            &request,
            request.get_ref().protocol_version,
            request.get_ref().keys.len(),
        )?;
        let r = request.into_inner();
        if r.from_node.is_empty() {
            return Err(Status::invalid_argument("from_node: required"));
        }
        let keys: Vec<Vec<u8>> = r
            .keys
            .iter()
            .map(|k| crate::limiter::encode_key(&k.name, &k.unique_key))
            .collect();
        // Protocol 3 names the puller's ring; protocol 2 does not.
        let epoch = (r.protocol_version >= 3).then_some(r.ring_epoch);
        let wait = Duration::from_nanos(r.wait_ns);
        let taken = self
            .limiter
            .pulled_by(&r.from_node, &keys, epoch, wait)
            .await
            .map_err(Status::unavailable)?;
        let Some(taken) = taken else {
            return Ok(Response::new(pb::PullResponse {
                results: Vec::new(),
                mismatch: true,
            }));
        };
        let results = keys
            .iter()
            .zip(taken)
            .map(|(k, state)| pb::PullResult {
                state: state.and_then(|(s, copy)| {
                    let mut w = wire::snapshot_to_wire(k, &s)?;
                    w.copy = copy;
                    Some(w)
                }),
            })
            .collect();
        Ok(Response::new(pb::PullResponse {
            results,
            mismatch: false,
        }))
    }

    async fn transfer(
        &self,
        request: Request<pb::TransferRequest>,
    ) -> Result<Response<pb::TransferPage>, Status> {
        self.admit(&request, request.get_ref().protocol_version, 0)?;
        let r = request.into_inner();
        if r.from_node.is_empty() {
            return Err(Status::invalid_argument("from_node: required"));
        }
        let page = self
            .limiter
            .transfer_page(
                &r.from_node,
                r.ring_epoch,
                r.view,
                r.cursor,
                r.holder_view,
                Duration::from_nanos(r.wait_ns),
            )
            .await;
        let states = page
            .states
            .iter()
            .filter_map(|(k, s, copy)| {
                let mut w = wire::snapshot_to_wire(k, s)?;
                w.copy = *copy;
                Some(w)
            })
            .collect();
        Ok(Response::new(pb::TransferPage {
            states,
            next: page.next,
            done: page.done,
            mismatch: page.mismatch,
            holder_view: page.holder_view,
        }))
    }

    async fn reset(
        &self,
        request: Request<pb::ResetRequest>,
    ) -> Result<Response<pb::ResetResponse>, Status> {
        self.admit(&request, request.get_ref().protocol_version, 0)?;
        let r = request.into_inner();
        if r.name.is_empty() || r.unique_key.is_empty() {
            return Err(Status::invalid_argument(
                "name and unique_key must not be empty",
            ));
        }
        match self.limiter.reset_here(&r.name, &r.unique_key).await {
            Ok(existed) => Ok(Response::new(pb::ResetResponse {
                existed,
                redirect: String::new(),
            })),
            Err(Some(owner)) => Ok(Response::new(pb::ResetResponse {
                existed: false,
                redirect: owner.to_string(),
            })),
            Err(None) => Err(Status::unavailable(
                "this node cannot decide the key now (not ready, or its holders are unreachable)",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::caller;

    #[test]
    fn a_callers_membership_reads_back_and_a_malformed_one_is_none() {
        let mut b = 7u64.to_be_bytes().to_vec();
        b.extend_from_slice("node-1/ü".as_bytes());
        assert_eq!(caller(&b), Some((7, "node-1/ü".to_string())));
        assert_eq!(caller(&[1, 2, 3]), None, "shorter than a generation");
        let mut bad = 7u64.to_be_bytes().to_vec();
        bad.push(0xff);
        assert_eq!(caller(&bad), None, "not UTF-8");
    }
}
