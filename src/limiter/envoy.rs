//! Envoy descriptors: matching a request's descriptors to the rules and
//! deciding them together, in one batch.

use std::sync::Arc;

use super::{Check, ItemError, LimitRef, Limiter, Verdict};
use crate::algorithm::{Algorithm, Bounds, Cost};
use crate::policy::OnOwnerUnreachable;
use crate::policy::rules::{self, Found, RuleLimit, Rules, Unit};

/// One descriptor of an Envoy request, as the limiter sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Descriptor {
    pub entries: Vec<(String, String)>,
    /// Envoy's per-descriptor limit override: requests per unit.
    pub limit_override: Option<(u32, Unit)>,
    /// Envoy's per-descriptor `hits_addend`.
    pub hits: Option<u64>,
}

/// What became of one descriptor.
#[derive(Clone, Debug)]
pub enum DescriptorOutcome {
    /// No rule matches: not limited.
    NoRule,
    /// A rule matches and says `unlimited`.
    Unlimited(Arc<RuleLimit>),
    Decided {
        rule: Arc<RuleLimit>,
        verdict: Verdict,
    },
}

impl Limiter {
    /// Replace the descriptor rules (load or reload).
    pub fn set_rules(&self, rules: Rules) {
        self.shared.rules.store(Arc::new(rules));
    }

    /// The descriptor rules serving now.
    pub fn rules(&self) -> Arc<Rules> {
        self.shared.rules.load_full()
    }

    /// Decide every descriptor of one Envoy request together. `hits_addend`
    /// 0 means 1; a descriptor's own `hits` overrides it.
    ///
    /// As upstream: a descriptor with no entries matches nothing (no limit
    /// for it, the others still decided), and an unknown domain has no
    /// limits at all, Envoy's limit overrides included (upstream looks the
    /// domain up first).
    pub async fn check_descriptors(
        &self,
        domain: &str,
        descriptors: &[Descriptor],
        hits_addend: u64,
        max_key_bytes: usize,
        budget: Option<std::time::Duration>,
    ) -> Result<Vec<DescriptorOutcome>, ItemError> {
        if domain.is_empty() {
            return Err(ItemError::new("domain", "must not be empty"));
        }
        let rules = self.shared.rules.load_full();
        if !rules.has_domain(domain) {
            return Ok(vec![DescriptorOutcome::NoRule; descriptors.len()]);
        }
        let mut limits: Vec<Option<Found>> = Vec::with_capacity(descriptors.len());
        for d in descriptors {
            limits.push(match d.limit_override {
                Some((requests_per_unit, unit)) => Some(Found {
                    limit: Arc::new(override_rule(domain, d, requests_per_unit, unit)?),
                    shared: Vec::new(),
                }),
                None => {
                    let entries: Vec<(&str, &str)> = d
                        .entries
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_str()))
                        .collect();
                    rules.find(domain, &entries)
                }
            });
        }
        rules::apply_replaces(&mut limits);
        let hits = if hits_addend == 0 { 1 } else { hits_addend };
        let mut checks = Vec::new();
        for (d, found) in descriptors.iter().zip(&limits) {
            let Some(found) = found.as_ref().filter(|f| f.limit.spec.is_some()) else {
                continue;
            };
            // The counter: the domain, and every entry of the descriptor
            // (so a rule without a value counts each value apart), a shared
            // wildcard's entry by its pattern. JSON keeps the encoding
            // unambiguous whatever the values contain.
            let unique_key =
                serde_json::to_string(&found.counter_entries(&d.entries)).unwrap_or_default();
            if unique_key.len() > max_key_bytes {
                return Err(ItemError::new(
                    "descriptors",
                    format!(
                        "a descriptor's entries take {} bytes, above {max_key_bytes}",
                        unique_key.len()
                    ),
                ));
            }
            checks.push(Ok(Check {
                name: format!("envoy:{domain}"),
                unique_key,
                limit: LimitRef::Rule(found.limit.clone()),
                request: Cost {
                    hits: d.hits.unwrap_or(hits),
                    drain_over_limit: found.limit.drain_over_limit,
                    nodelay: false,
                },
                unbatched: false,
                on_owner_unreachable: None,
                mode: None,
                replication: None,
            }));
        }
        let mut verdicts = self.check_batch_within(checks, budget).await.into_iter();
        let mut out = Vec::with_capacity(descriptors.len());
        for found in limits {
            out.push(match found {
                None => DescriptorOutcome::NoRule,
                Some(f) if f.limit.spec.is_none() => DescriptorOutcome::Unlimited(f.limit),
                Some(f) => match verdicts.next() {
                    Some(Ok(verdict)) => DescriptorOutcome::Decided {
                        rule: f.limit,
                        verdict,
                    },
                    Some(Err(e)) => return Err(e),
                    None => return Err(ItemError::new("descriptors", "not decided")),
                },
            });
        }
        Ok(out)
    }
}

/// Envoy's limit override: a fixed window of `requests_per_unit` per `unit`,
/// never in shadow mode, counting refused hits, named by the request's
/// entries (as envoyproxy/ratelimit).
fn override_rule(
    domain: &str,
    d: &Descriptor,
    requests_per_unit: u32,
    unit: Unit,
) -> Result<RuleLimit, ItemError> {
    let spec = rules::unit_spec(
        Algorithm::FixedWindow,
        requests_per_unit,
        unit,
        None,
        &Bounds::default(),
    )
    .map_err(|e| ItemError::new("limit", e))?;
    let path: Vec<String> = d
        .entries
        .iter()
        .map(|(k, v)| {
            if v.is_empty() {
                k.clone()
            } else {
                format!("{k}_{v}")
            }
        })
        .collect();
    Ok(RuleLimit {
        label: Arc::from(format!("{domain}.{}", path.join("."))),
        name: None,
        requests_per_unit,
        unit,
        spec: Some(spec),
        shadow: false,
        quota_mode: false,
        detailed_metric: false,
        replaces: Vec::new(),
        on_owner_unreachable: OnOwnerUnreachable::default(),
        drain_over_limit: true,
        metadata: None,
    })
}
