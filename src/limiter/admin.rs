//! Operator actions: reset a key (at its owner, wherever it is asked),
//! inspect a key, list the top keys.

use std::time::Duration;

use super::Limiter;
use super::route::Route;
use crate::cluster::peers::ResetAnswer;
use crate::store::{TopBy, View, key};

/// Why a reset could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ResetError(pub String);

impl Limiter {
    /// Reset a key (admin), at its owner: its reset generation grows, so
    /// every replica, copy and lease report from before the reset is
    /// ignored wherever it arrives. Returns whether the owner held it.
    pub async fn reset(&self, name: &str, unique_key: &str) -> Result<bool, ResetError> {
        let mut target = None;
        for _ in 0..3 {
            let owner = match target.take() {
                Some(owner) => owner,
                None => match self.reset_here(name, unique_key).await {
                    Ok(existed) => return Ok(existed),
                    Err(Some(owner)) => owner,
                    Err(None) => {
                        return Err(ResetError(
                            "this node cannot reach the key's owner now; try again".into(),
                        ));
                    }
                },
            };
            // The owner may have to take the key first: a budget's time.
            let budget = self.shared.settings.budget.max(Duration::from_millis(500));
            match self
                .shared
                .peers
                .reset(&owner, name, unique_key, budget)
                .await
            {
                Ok(ResetAnswer::Done { existed }) => {
                    self.forget_local(name, unique_key);
                    return Ok(existed);
                }
                Ok(ResetAnswer::Redirect(to)) if *to == *self.shared.node_id => {}
                Ok(ResetAnswer::Redirect(to)) => target = Some(to),
                Err(e) => return Err(ResetError(format!("owner {owner}: {e}"))),
            }
        }
        Err(ResetError(
            "the nodes disagree on the key's owner (a ring change); try again".into(),
        ))
    }

    /// Reset a key this node owns. `Err(Some(owner))`: another node owns
    /// it by this node's ring; `Err(None)`: this node can own nothing now.
    pub async fn reset_here(
        &self,
        name: &str,
        unique_key: &str,
    ) -> Result<bool, Option<std::sync::Arc<str>>> {
        let k = key::encode(name, unique_key);
        for _ in 0..super::route::ROUNDS {
            let t = self.shared.topology.load_full();
            match self.route(&k, &t, self.may_own()) {
                Route::Forward(owner) => return Err(Some(owner)),
                Route::NoOwner => return Err(None),
                Route::Lacking => {
                    // Take it first: a count merged after the reset would
                    // be from an older generation and ignored, but its
                    // holders must stop counting it.
                    let wait = self.shared.settings.budget;
                    let taken = self.take_lacking(std::slice::from_ref(&k), &t, wait).await;
                    if taken.stale {
                        continue;
                    }
                    if !(taken.reached_all || taken.owned.contains(&k)) {
                        return Err(None);
                    }
                }
                Route::Here => {}
            }
            let now = self.now();
            let Ok(existed) = self.fenced(t.view, |fence| {
                self.shared.store.reset(&k, now, Some(fence))
            }) else {
                continue; // the view changed: route again
            };
            self.forget_local(name, unique_key);
            tracing::info!(%name, %unique_key, existed, "admin reset");
            return Ok(existed);
        }
        Err(None)
    }

    /// Drop what this node keeps of a key outside its count: the tiered
    /// ledger and allotment, and the lease's view (its next answer from the
    /// owner brings the new generation).
    fn forget_local(&self, name: &str, unique_key: &str) {
        key::with_encoded(name, unique_key, |k| {
            self.shared.tiers.forget_key(k);
            self.shared.leases.forget(k);
        });
    }

    /// Inspect a key (admin): this node's entry for it.
    pub fn inspect(&self, name: &str, unique_key: &str) -> Option<View> {
        let now = self.now();
        key::with_encoded(name, unique_key, |k| self.shared.store.inspect(k, now))
    }

    /// The top keys (admin): `(name, unique_key, view)`.
    pub fn top(&self, by: TopBy, n: usize) -> Vec<(String, String, View)> {
        self.shared
            .store
            .top(by, n, self.now())
            .into_iter()
            .filter_map(|(k, v)| {
                let (name, key) = key::decode(&k)?;
                Some((name.to_string(), key.to_string(), v))
            })
            .collect()
    }
}
