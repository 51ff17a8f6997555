//! When a starting node may turn ready: the join wait.
//!
//! A node with seeds that turned ready before it reached its cluster would
//! own every key alone, from empty counts, while the cluster it belongs to
//! decides the same keys (issue 39, item 4): restarted during a partition,
//! with a wrong secret, or before its seeds' DNS answers. So it waits —
//! `joining`, `NOT_SERVING`, answering `NOT_READY` — until it hears a ready
//! peer, or, for a brand-new cluster, `cluster.bootstrap_expect` nodes
//! joining together. A node with no seeds is a cluster of its own, ready
//! at once.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::{ClusterView, Lifecycle, MemberInfo};

/// Wait until a node may turn ready: with no seeds (`bootstrap` None) at
/// once. With seeds, first until it has reached a cluster: a ready peer
/// (an existing cluster, which it joins), or `bootstrap` nodes counting
/// itself, none ready (a brand-new cluster, formed together). Not bounded:
/// a node that turned ready alone because its seeds were down, partitioned
/// away or spoke another secret would own every key from empty counts
/// while the cluster it belongs to decides the same keys. It says so every
/// [`STILL_WAITING_EVERY`]. Then until its view has held still for 3
/// gossip rounds — gossip brings members in one by one, and a partial ring
/// would name the wrong owners — bounded by 10 rounds (1–5 s).
///
/// Whether the node may turn ready: false only when the views ended (the
/// gossip thread is gone) before it reached a cluster.
pub(crate) async fn join_wait(
    views: &mut watch::Receiver<Arc<ClusterView>>,
    bootstrap: Option<usize>,
    gossip_interval: Duration,
) -> bool {
    let Some(expect) = bootstrap else {
        return true;
    };
    let wait = (gossip_interval * 10).clamp(Duration::from_secs(1), Duration::from_secs(5));
    let started = tokio::time::Instant::now();
    // Told it may start alone: it still looks for a peer a while first.
    let alone_at = (expect <= 1).then_some(started + wait);
    loop {
        let next_word = tokio::time::Instant::now() + STILL_WAITING_EVERY;
        let until = alone_at.map_or(next_word, |at| at.min(next_word));
        let reached = tokio::time::timeout_at(
            until,
            views.wait_for(|v| may_form(v, expect.max(2)).is_some()),
        )
        .await
        .map(|r| r.map(|v| may_form(&v, expect.max(2)).unwrap_or("formed")));
        match reached {
            Ok(Ok(how)) => {
                tracing::info!(how, "reached the cluster");
                break;
            }
            // The gossip thread ended (shutdown, or it died): no cluster
            // reached, so never ready.
            Ok(Err(_)) => return false,
            Err(_) if alone_at.is_some_and(|at| tokio::time::Instant::now() >= at) => {
                tracing::info!(
                    ?wait,
                    "no peer seen; starting alone (cluster.bootstrap_expect = 1)"
                );
                break;
            }
            Err(_) => {
                let v = views.borrow().clone();
                tracing::warn!(
                    waited = ?started.elapsed(),
                    seen = v.members.iter().filter(|m| m.node_id != v.self_id).count(),
                    bootstrap_expect = expect,
                    "still joining: no ready peer reached and too few nodes to form a new cluster (are the seeds up, reachable, and on the same cluster.secret and cluster_id?)"
                );
            }
        }
    }
    let deadline = tokio::time::Instant::now() + wait;
    let quiet = gossip_interval * 3;
    while tokio::time::Instant::now() < deadline {
        let until = deadline.min(tokio::time::Instant::now() + quiet);
        match tokio::time::timeout_at(until, views.changed()).await {
            Ok(Ok(())) => continue,
            _ => break,
        }
    }
    true
}

/// How often a node still joining says so.
const STILL_WAITING_EVERY: Duration = Duration::from_secs(10);

/// Whether a node whose view is `v` has reached a cluster it may turn
/// ready in, and how: a ready peer it hears (`"joined"`), or `expect`
/// nodes it hears, itself included, joining or ready (`"formed"`).
fn may_form(v: &ClusterView, expect: usize) -> Option<&'static str> {
    let heard = |m: &&MemberInfo| !m.suspected && m.node_id != v.self_id;
    let peers = v.members.iter().filter(heard);
    if peers.clone().any(|m| m.state == Lifecycle::Ready) {
        return Some("joined");
    }
    let starting = peers.filter(|m| m.state == Lifecycle::Joining).count();
    (starting + 1 >= expect).then_some("formed")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, state: Lifecycle, suspected: bool) -> MemberInfo {
        MemberInfo {
            suspected,
            ..super::super::view::test_member(id, state)
        }
    }

    /// `a`'s view holding itself (joining) and `peers`.
    fn view(peers: Vec<MemberInfo>) -> Arc<ClusterView> {
        let mut v = ClusterView::alone("a", 1);
        v.members = peers;
        v.members.push(member("a", Lifecycle::Joining, false));
        Arc::new(v)
    }

    /// What counts as reaching a cluster: a ready peer heard (whatever
    /// `bootstrap_expect` says); else enough nodes joining together, this
    /// one included. A suspected peer is not one reached, and no number
    /// of seeds that answer nothing is either (the old wait started alone
    /// after 10 rounds).
    #[test]
    fn a_cluster_is_reached_by_a_ready_peer_or_enough_nodes_joining() {
        use Lifecycle::{Joining, Leaving, Ready};
        assert_eq!(may_form(&view(vec![]), 2), None);
        assert_eq!(may_form(&view(vec![member("b", Ready, true)]), 2), None);
        assert_eq!(may_form(&view(vec![member("b", Leaving, false)]), 2), None);
        assert_eq!(
            may_form(&view(vec![member("b", Ready, false)]), 5),
            Some("joined")
        );
        assert_eq!(
            may_form(&view(vec![member("b", Joining, false)]), 2),
            Some("formed")
        );
        let two = vec![member("b", Joining, false), member("c", Joining, true)];
        assert_eq!(may_form(&view(two), 3), None);
        let three = vec![member("b", Joining, false), member("c", Joining, false)];
        assert_eq!(may_form(&view(three), 3), Some("formed"));
    }

    const ROUND: Duration = Duration::from_millis(10);
    const DEADLINE: Duration = Duration::from_secs(30);

    /// The wait ends once a peer turns up, and not before.
    #[tokio::test]
    async fn the_wait_ends_when_a_peer_is_heard() {
        let (tx, mut rx) = watch::channel(view(vec![]));
        let mut wait = Box::pin(join_wait(&mut rx, Some(2), ROUND));
        // Past the 1 s the old wait took before it started alone.
        let early = tokio::time::timeout(Duration::from_millis(1_500), wait.as_mut()).await;
        assert!(early.is_err(), "no peer, yet the wait ended");
        tx.send(view(vec![member("b", Lifecycle::Joining, false)]))
            .unwrap();
        let reached = tokio::time::timeout(DEADLINE, wait).await;
        assert_eq!(reached, Ok(true), "a peer joining too: formed");

        // The gossip thread gone before a cluster was reached: never ready.
        let (tx, mut rx) = watch::channel(view(vec![]));
        drop(tx);
        let ended = tokio::time::timeout(DEADLINE, join_wait(&mut rx, Some(2), ROUND)).await;
        assert_eq!(ended, Ok(false));
    }

    /// `bootstrap_expect = 1`: it looks for a peer for 10 rounds (at least
    /// 1 s), then starts alone; with no seeds it is ready at once.
    #[tokio::test]
    async fn told_it_may_it_starts_alone_after_looking_for_a_peer() {
        let (_tx, mut rx) = watch::channel(view(vec![]));
        let started = tokio::time::Instant::now();
        let alone = tokio::time::timeout(DEADLINE, join_wait(&mut rx, Some(1), ROUND)).await;
        assert_eq!(alone, Ok(true), "starts alone");
        assert!(started.elapsed() >= Duration::from_secs(1));
        let at_once = tokio::time::timeout(DEADLINE, join_wait(&mut rx, None, ROUND)).await;
        assert_eq!(at_once, Ok(true), "no seeds: at once");
    }
}
