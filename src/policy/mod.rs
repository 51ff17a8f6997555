//! Named limits from the config file, validated into decision specs, and
//! Envoy descriptor rules ([`rules`]).
//!
//! Services resolve a request's `policy` here instead of reading inline
//! fields; the set is swapped whole on a config reload, so a request sees
//! either the old policies or the new ones, never a mix.

pub mod rules;

use std::collections::HashMap;
use std::sync::Arc;

use crate::algorithm::{Algorithm, Bounds, CalendarUnit, Period, Spec};
use crate::config::{Config, ConfigError, PolicyConfig, Sources};

/// One named limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    pub name: Arc<str>,
    pub spec: Spec,
    /// Decide and count, but always allow.
    pub shadow: bool,
    pub on_owner_unreachable: OnOwnerUnreachable,
    /// exact (default) or tiered (hot keys: local allotments).
    pub mode: Mode,
    /// When the owner answers against its replica holder's copy.
    pub replication: Replication,
}

/// Load every layer of the config and build its policies: what a node
/// starts with and what a reload applies.
pub fn load(sources: &Sources) -> Result<(Config, Policies), ConfigError> {
    let config = sources.load()?;
    let policies = Policies::from_config(&config)?;
    Ok((config, policies))
}

/// A config given as TOML text over the defaults, and its policies.
pub fn from_toml_str(text: &str) -> Result<(Config, Policies), ConfigError> {
    let config = Sources::from_toml_str(text)?;
    let policies = Policies::from_config(&config)?;
    Ok((config, policies))
}

/// How a clustered node decides a key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Every decision by the key's owner.
    #[default]
    Exact,
    /// Hot keys: spend an allotment from the owner locally (`crate::lease::tiered`).
    Tiered,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Exact => "exact",
            Mode::Tiered => "tiered",
        }
    }

    pub fn from_name(name: &str) -> Option<Mode> {
        [Mode::Exact, Mode::Tiered]
            .into_iter()
            .find(|m| m.name() == name)
    }
}

/// When a key's owner answers, against the copy its replica holder keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Replication {
    /// At once; the copy follows within the replication lag, which a crash
    /// of the owner loses.
    #[default]
    Async,
    /// Once the replica holder acknowledged a copy holding the decision: a
    /// crash loses nothing, for a peer round trip per decision. While no
    /// acknowledgement comes, the key is decided as if its owner were
    /// unreachable (its hits stay counted at the owner: the safe side).
    Sync,
}

impl Replication {
    pub fn name(self) -> &'static str {
        match self {
            Replication::Async => "async",
            Replication::Sync => "sync",
        }
    }

    pub fn from_name(name: &str) -> Option<Replication> {
        [Replication::Async, Replication::Sync]
            .into_iter()
            .find(|m| m.name() == name)
    }
}

/// What an edge answers when a key's owner cannot be reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnOwnerUnreachable {
    /// Decide on this node's 1/N lease (approximate answers).
    #[default]
    LocalShare,
    /// Admit: availability over the limit.
    Allow,
    /// Answer UNAVAILABLE / OWNER_UNREACHABLE.
    Deny,
}

impl OnOwnerUnreachable {
    pub fn name(self) -> &'static str {
        match self {
            OnOwnerUnreachable::LocalShare => "local_share",
            OnOwnerUnreachable::Allow => "allow",
            OnOwnerUnreachable::Deny => "deny",
        }
    }

    pub fn from_name(name: &str) -> Option<OnOwnerUnreachable> {
        [
            OnOwnerUnreachable::LocalShare,
            OnOwnerUnreachable::Allow,
            OnOwnerUnreachable::Deny,
        ]
        .into_iter()
        .find(|m| m.name() == name)
    }
}

/// Every named limit of one config version.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policies {
    by_name: HashMap<String, Policy>,
    /// A hash of the policy config, gossiped so that drift between nodes is
    /// visible.
    hash: u64,
}

impl Policies {
    pub fn from_config(config: &Config) -> Result<Policies, ConfigError> {
        let bounds = Bounds {
            max_log_entries: config.limits.max_log_entries,
        };
        let mut by_name = HashMap::new();
        for (name, p) in &config.policies {
            let policy = parse(name, p, &bounds)
                .map_err(|(field, msg)| ConfigError(format!("policies.{name}.{field}: {msg}")))?;
            by_name.insert(name.clone(), policy);
        }
        let text = toml::to_string(&config.policies).unwrap_or_default();
        Ok(Policies {
            by_name,
            hash: xxhash_rust::xxh3::xxh3_64(text.as_bytes()),
        })
    }

    /// The policy config's hash, as 16 hex digits.
    pub fn hash(&self) -> String {
        format!("{:016x}", self.hash)
    }

    pub fn get(&self, name: &str) -> Option<&Policy> {
        self.by_name.get(name)
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

fn parse(name: &str, p: &PolicyConfig, bounds: &Bounds) -> Result<Policy, (&'static str, String)> {
    let algorithm = match &p.algorithm {
        None => Algorithm::default(),
        Some(a) => Algorithm::from_name(a).ok_or_else(|| {
            let known: Vec<_> = Algorithm::ALL.iter().map(|a| a.name()).collect();
            (
                "algorithm",
                format!("unknown algorithm {a:?}; one of {}", known.join(", ")),
            )
        })?,
    };
    let period = match (&p.duration, &p.window) {
        (Some(_), Some(_)) => {
            return Err(("duration", "set either duration or window, not both".into()));
        }
        (None, None) => {
            return Err((
                "duration",
                "set a duration (e.g. \"1m\") or a window".into(),
            ));
        }
        (Some(d), None) => {
            let d =
                humantime::parse_duration(d).map_err(|e| ("duration", format!("{d:?}: {e}")))?;
            Period::Duration(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        }
        (None, Some(w)) => Period::Calendar(CalendarUnit::from_name(w).ok_or_else(|| {
            (
                "window",
                format!("unknown window {w:?}; one of minute, hour, day, week, month, year"),
            )
        })?),
    };
    let spec = Spec::with_bounds(algorithm, p.limit, period, p.burst, bounds)
        .map_err(|e| (e.field, e.message))?;
    let on_owner_unreachable = match &p.on_owner_unreachable {
        None => OnOwnerUnreachable::default(),
        Some(m) => OnOwnerUnreachable::from_name(m).ok_or_else(|| {
            (
                "on_owner_unreachable",
                format!("unknown mode {m:?}; one of local_share, allow, deny"),
            )
        })?,
    };
    let mode = match &p.mode {
        None => Mode::default(),
        Some(m) => Mode::from_name(m)
            .ok_or_else(|| ("mode", format!("unknown mode {m:?}; one of exact, tiered")))?,
    };
    let replication = match &p.replication {
        None => Replication::default(),
        Some(r) => Replication::from_name(r).ok_or_else(|| {
            (
                "replication",
                format!("unknown value {r:?}; one of async, sync"),
            )
        })?,
    };
    if replication == Replication::Sync && mode == Mode::Tiered {
        // An allotment is spent with no owner in the way: nothing to wait for.
        return Err((
            "replication",
            "sync needs mode exact (a tiered key is spent from allotments, not at its owner)"
                .into(),
        ));
    }
    Ok(Policy {
        name: Arc::from(name),
        spec,
        shadow: p.shadow,
        on_owner_unreachable,
        mode,
        replication,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn policy_errors_name_the_key() {
        let cases = [
            ("[policies.p]\nlimit = 1\n", "policies.p.duration"),
            (
                "[policies.p]\nlimit = 1\nduration = \"soon\"\n",
                "policies.p.duration",
            ),
            (
                "[policies.p]\nlimit = 1\nduration = \"1s\"\nalgorithm = \"magic\"\n",
                "policies.p.algorithm",
            ),
            (
                "[policies.p]\nlimit = 20000\nduration = \"1s\"\nalgorithm = \"sliding_window_log\"\n",
                "policies.p.limit",
            ),
        ];
        for (body, key) in cases {
            let err = super::from_toml_str(body).unwrap_err();
            assert!(err.0.contains(key), "{body:?}: {err}");
        }
    }

    #[test]
    fn replication_is_async_unless_a_policy_asks_for_sync_in_exact_mode() {
        use super::Replication;
        let body = "[policies.pay]\nlimit = 5\nduration = \"1m\"\nreplication = \"sync\"\n\
                    [policies.api]\nlimit = 5\nduration = \"1m\"\n";
        let (_, policies) = super::from_toml_str(body).unwrap();
        assert_eq!(policies.get("pay").unwrap().replication, Replication::Sync);
        assert_eq!(policies.get("api").unwrap().replication, Replication::Async);
        for (body, says) in [
            (
                "[policies.p]\nlimit = 1\nduration = \"1s\"\nreplication = \"eventually\"\n",
                "policies.p.replication: unknown value \"eventually\"",
            ),
            (
                "[policies.p]\nlimit = 1\nduration = \"1s\"\nreplication = \"sync\"\nmode = \"tiered\"\n",
                "policies.p.replication: sync needs mode exact",
            ),
        ] {
            let err = super::from_toml_str(body).unwrap_err();
            assert!(err.0.contains(says), "{body:?}: {err}");
        }
    }
}
