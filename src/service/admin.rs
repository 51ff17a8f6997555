//! `sluice.v1.Admin`: reset, inspect and top keys, cluster status, and
//! accepting the best copies of keys in doubt, for operators.

use tonic::{Request, Response, Status};

use super::wire;
use crate::cluster::membership::Membership;
use crate::limiter::Limiter;
use crate::limiter::{TopBy, View};
use crate::proto::v1 as pb;
use crate::proto::v1::admin_server::Admin;

pub struct AdminService {
    limiter: Limiter,
    membership: Membership,
}

impl AdminService {
    pub fn new(limiter: Limiter, membership: Membership) -> AdminService {
        AdminService {
            limiter,
            membership,
        }
    }
}

fn key_ref(key: Option<pb::KeyRef>) -> Result<pb::KeyRef, Status> {
    let key = key.ok_or_else(|| Status::invalid_argument("key: required"))?;
    if key.name.is_empty() {
        return Err(Status::invalid_argument("key.name: must not be empty"));
    }
    if key.unique_key.is_empty() {
        return Err(Status::invalid_argument(
            "key.unique_key: must not be empty",
        ));
    }
    Ok(key)
}

fn key_state(key: pb::KeyRef, v: &View) -> pb::KeyState {
    let (duration_ms, window) = wire::period_to_wire(&v.spec);
    let n = |x: u64| i64::try_from(x).unwrap_or(i64::MAX);
    pb::KeyState {
        key: Some(key),
        algorithm: wire::algorithm_to_wire(v.spec.algorithm()) as i32,
        limit: n(v.spec.limit()),
        duration_ms,
        window: window as i32,
        burst: n(v.spec.capacity()),
        remaining: n(v.remaining),
        reset_at_ms: wire::ms_up(v.reset_at),
        reset_gen: v.reset_gen,
        version: v.version,
        hits: v.hits,
        refusals: v.refusals,
        last_seen_ms: wire::ms_up(v.last_seen),
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn reset_key(
        &self,
        request: Request<pb::ResetKeyRequest>,
    ) -> Result<Response<pb::ResetKeyResponse>, Status> {
        let key = key_ref(request.into_inner().key)?;
        // At the key's owner, wherever it is asked.
        let existed = self
            .limiter
            .reset(&key.name, &key.unique_key)
            .await
            .map_err(|e| Status::unavailable(format!("reset not made: {e}")))?;
        Ok(Response::new(pb::ResetKeyResponse { existed }))
    }

    async fn inspect_key(
        &self,
        request: Request<pb::InspectKeyRequest>,
    ) -> Result<Response<pb::InspectKeyResponse>, Status> {
        let key = key_ref(request.into_inner().key)?;
        let view = self.limiter.inspect(&key.name, &key.unique_key);
        Ok(Response::new(match view {
            Some(v) => pb::InspectKeyResponse {
                found: true,
                state: Some(key_state(key, &v)),
            },
            None => pb::InspectKeyResponse {
                found: false,
                state: None,
            },
        }))
    }

    async fn top_keys(
        &self,
        request: Request<pb::TopKeysRequest>,
    ) -> Result<Response<pb::TopKeysResponse>, Status> {
        let r = request.into_inner();
        let by = match pb::TopBy::try_from(r.by) {
            Ok(pb::TopBy::Unspecified) | Ok(pb::TopBy::Hits) => TopBy::Hits,
            Ok(pb::TopBy::Refusals) => TopBy::Refusals,
            Err(_) => {
                return Err(Status::invalid_argument(format!(
                    "by: unknown value {}",
                    r.by
                )));
            }
        };
        let count = match r.count {
            0 => 10,
            n if n > 1_000 => {
                return Err(Status::invalid_argument(format!(
                    "count: at most 1000, got {n}"
                )));
            }
            n => n as usize,
        };
        let keys = self
            .limiter
            .top(by, count)
            .into_iter()
            .map(|(name, unique_key, v)| key_state(pb::KeyRef { name, unique_key }, &v))
            .collect();
        Ok(Response::new(pb::TopKeysResponse { keys }))
    }

    async fn cluster_status(
        &self,
        _request: Request<pb::ClusterStatusRequest>,
    ) -> Result<Response<pb::ClusterStatusResponse>, Status> {
        let view = self.membership.view();
        let shares: std::collections::HashMap<_, _> = view.ring.shares().into_iter().collect();
        let transfer = self.limiter.transfer_status();
        let standing = |id: &str| {
            transfer
                .members
                .iter()
                .find(|(m, _, _)| &**m == id)
                .map(|(_, p, stalled)| {
                    let name = if *stalled {
                        "stalled"
                    } else {
                        p.standing.name()
                    };
                    (name.to_string(), p.received)
                })
                .unwrap_or_default()
        };
        let members = view
            .members
            .iter()
            .map(|m| {
                let (transfer, transfer_received) = standing(&m.node_id);
                pb::ClusterMember {
                    transfer,
                    transfer_received,
                    node_id: m.node_id.to_string(),
                    generation: m.generation,
                    state: m.state.name().to_string(),
                    grpc_addr: m.grpc_addr.clone(),
                    gossip_addr: m.gossip_addr.to_string(),
                    version: m.version.clone(),
                    protocol: m.protocol,
                    policy_hash: m.policy_hash.clone(),
                    in_ring: view.ring.member(&m.node_id).is_some(),
                    ring_share: shares.get(&m.node_id).copied().unwrap_or(0.0),
                }
            })
            .collect();
        let (doubt_regions, keys_in_doubt) = self.limiter.doubt_figures();
        Ok(Response::new(pb::ClusterStatusResponse {
            self_node_id: view.self_id.to_string(),
            ring_epoch: view.ring.epoch(),
            cluster_size: view.size as u32,
            members,
            view: transfer.view,
            transfer_complete: transfer.complete,
            doubt_regions: u32::try_from(doubt_regions).unwrap_or(u32::MAX),
            keys_in_doubt,
        }))
    }

    async fn accept_best_copies(
        &self,
        _request: Request<pb::AcceptBestCopiesRequest>,
    ) -> Result<Response<pb::AcceptBestCopiesResponse>, Status> {
        let (regions, keys) = self.limiter.accept_best_copies();
        Ok(Response::new(pb::AcceptBestCopiesResponse {
            regions: u32::try_from(regions).unwrap_or(u32::MAX),
            keys,
        }))
    }
}
