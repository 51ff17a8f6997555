//! A check resolved against the policies of the moment: its spec, its
//! fallback, its mode and its replication, each a policy's setting unless
//! the request overrides it (and a request may ask for synchronous
//! replication but never waive a policy's).

use super::{Check, ItemError, LimitRef, Limiter, Mode, Replication, Resolved};
use crate::policy::{OnOwnerUnreachable, Policies, Policy};

impl Limiter {
    pub(super) fn resolve<'a>(
        &self,
        check: &'a Check,
        policies: &Policies,
    ) -> Result<Resolved<'a>, ItemError> {
        let (spec, shadow, policy_fallback, label, policy_mode, policy_replication) =
            match &check.limit {
                LimitRef::Inline(spec) => (
                    *spec,
                    false,
                    OnOwnerUnreachable::default(),
                    None,
                    Mode::default(),
                    Replication::default(),
                ),
                LimitRef::Rule(rule) => match rule.spec {
                    Some(spec) => (
                        spec,
                        rule.shadow,
                        rule.on_owner_unreachable,
                        Some(rule.label.clone()),
                        Mode::default(),
                        Replication::default(),
                    ),
                    None => {
                        return Err(ItemError::new(
                            "descriptors",
                            "an unlimited rule has nothing to decide",
                        ));
                    }
                },
                LimitRef::Policy(name) => match policies.get(name) {
                    Some(Policy {
                        spec,
                        shadow,
                        name,
                        on_owner_unreachable,
                        mode,
                        replication,
                    }) => (
                        *spec,
                        *shadow,
                        *on_owner_unreachable,
                        Some(name.clone()),
                        *mode,
                        *replication,
                    ),
                    None => {
                        return Err(ItemError::new("policy", format!("unknown policy {name:?}")));
                    }
                },
            };
        let tiered = check.mode.unwrap_or(policy_mode) == Mode::Tiered;
        // A request may ask for synchronous replication, never waive a
        // policy's: the policy is the operator's promise about crashes.
        let sync =
            policy_replication == Replication::Sync || check.replication == Some(Replication::Sync);
        if sync && tiered {
            return Err(ItemError::new(
                "replication",
                "sync needs mode exact (a tiered key is spent from allotments, not at its owner)",
            ));
        }
        Ok(Resolved {
            check,
            spec,
            shadow,
            fallback: check.on_owner_unreachable.unwrap_or(policy_fallback),
            label,
            tiered,
            // A shadow key always admits: nothing to protect.
            sync: sync && !shadow,
        })
    }
}
