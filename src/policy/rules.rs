//! Envoy descriptor rules, in the format of envoyproxy/ratelimit's YAML, so an
//! existing file loads unchanged.
//!
//! ```yaml
//! domain: edge
//! descriptors:
//!   - key: remote_address          # no value: one counter per address seen
//!     rate_limit: { unit: second, requests_per_unit: 10 }
//!   - key: path
//!     value: "/api/*"              # wildcard: a prefix
//!     rate_limit:
//!       unit: minute
//!       requests_per_unit: 100
//!       algorithm: gcra            # Sluice extensions: algorithm, burst,
//!       burst: 20                  # on_owner_unreachable
//!   - key: user
//!     value: internal
//!     rate_limit: { unlimited: true }   # whitelisted
//! ```
//!
//! Matching follows that service: each entry of a request descriptor is
//! looked up as `key_value`, then as a wildcard prefix, then as `key` alone;
//! a limit applies when the *last* entry lands on a rule that has one. Units
//! keep its meaning: fixed windows aligned to the epoch, a month of 30 days
//! and a year of 365. `requests_per_unit: 0` denies everything. Its
//! `replaces` drops a named limit matched by another descriptor of the same
//! request. One deliberate difference: wildcards are matched at every level
//! of the tree, where envoyproxy/ratelimit consults the domain's top-level
//! wildcards only.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use super::OnOwnerUnreachable;
use crate::algorithm::{Algorithm, Bounds, Period, Spec};

const SECOND: u64 = 1_000_000_000;

/// A time unit of an Envoy rule, with envoyproxy/ratelimit's lengths.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    /// 30 days.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 604_800,
            Unit::Month => 2_592_000,
            Unit::Year => 31_536_000,
        }
    }

    pub fn parse(s: &str) -> Option<Unit> {
        Some(match s.to_ascii_lowercase().as_str() {
            "second" => Unit::Second,
            "minute" => Unit::Minute,
            "hour" => Unit::Hour,
            "day" => Unit::Day,
            "week" => Unit::Week,
            "month" => Unit::Month,
            "year" => Unit::Year,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }
}

/// A limit a rule sets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleLimit {
    /// What metrics and `replaces` call it: the rule's `name`, else its
    /// dotted path (`domain.key_value.key`).
    pub label: Arc<str>,
    pub name: Option<String>,
    pub requests_per_unit: u32,
    pub unit: Unit,
    /// None: unlimited (whitelisted).
    pub spec: Option<Spec>,
    pub shadow: bool,
    pub replaces: Vec<String>,
    pub on_owner_unreachable: OnOwnerUnreachable,
}

#[derive(Debug, Default)]
struct Node {
    limit: Option<Arc<RuleLimit>>,
    children: HashMap<String, Node>,
    /// Keys ending in `*`, longest prefix first.
    wildcards: Vec<String>,
}

/// Every loaded domain.
#[derive(Debug, Default)]
pub struct Rules {
    domains: HashMap<String, Node>,
    files: usize,
}

/// A rules file that did not load, naming the file and the key or line.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {message}")]
pub struct RulesError {
    pub file: String,
    pub message: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlRoot {
    domain: String,
    #[serde(default)]
    descriptors: Vec<YamlDescriptor>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlDescriptor {
    key: String,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    rate_limit: Option<YamlRateLimit>,
    #[serde(default)]
    descriptors: Vec<YamlDescriptor>,
    #[serde(default)]
    shadow_mode: bool,
    /// envoyproxy/ratelimit: per-value metrics for no-value rules. Sluice's
    /// metrics are per rule; accepted for compatibility.
    #[serde(default)]
    #[allow(dead_code)]
    detailed_metric: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlRateLimit {
    #[serde(default)]
    requests_per_unit: u32,
    #[serde(default)]
    unit: Option<String>,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<YamlReplaces>,
    // Sluice's compatible extensions.
    #[serde(default)]
    algorithm: Option<String>,
    #[serde(default)]
    burst: Option<u64>,
    #[serde(default)]
    on_owner_unreachable: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlReplaces {
    #[serde(default)]
    name: String,
}

/// The limit for `requests_per_unit` per `unit` as a spec.
pub fn unit_spec(
    algorithm: Algorithm,
    requests_per_unit: u32,
    unit: Unit,
    burst: Option<u64>,
    bounds: &Bounds,
) -> Result<Spec, String> {
    Spec::with_bounds(
        algorithm,
        u64::from(requests_per_unit),
        Period::Duration(unit.seconds() * SECOND),
        burst,
        bounds,
    )
    .map_err(|e| e.to_string())
}

impl Rules {
    /// Load every `.yaml`/`.yml` file in `path` (a file or a directory, as a
    /// Kubernetes ConfigMap mounts one), all or nothing.
    pub fn load(path: &Path, bounds: &Bounds) -> Result<Rules, RulesError> {
        let err = |file: &Path, message: String| RulesError {
            file: file.display().to_string(),
            message,
        };
        let files: Vec<PathBuf> = if path.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|e| err(path, e.to_string()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                // Skip ConfigMap internals (`..data`, `..2024_…`) and dotfiles.
                .filter(|p| {
                    !p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with('.'))
                })
                .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
                .collect();
            files.sort();
            files
        } else {
            vec![path.to_path_buf()]
        };
        let mut rules = Rules::default();
        for file in &files {
            let text = std::fs::read_to_string(file).map_err(|e| err(file, e.to_string()))?;
            rules.add(&text, bounds).map_err(|m| err(file, m))?;
        }
        Ok(rules)
    }

    /// Parse one file's text into these rules.
    pub fn add(&mut self, text: &str, bounds: &Bounds) -> Result<(), String> {
        let root: YamlRoot = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
        if root.domain.is_empty() {
            return Err("domain: must not be empty".into());
        }
        if self.domains.contains_key(&root.domain) {
            return Err(format!("domain: '{}' is defined twice", root.domain));
        }
        let mut node = Node::default();
        load(&mut node, &root.domain, &root.descriptors, bounds)?;
        self.domains.insert(root.domain, node);
        self.files += 1;
        Ok(())
    }

    pub fn domains(&self) -> usize {
        self.domains.len()
    }

    /// The rule for one request descriptor, if any.
    pub fn find(&self, domain: &str, entries: &[(&str, &str)]) -> Option<Arc<RuleLimit>> {
        let mut level = self.domains.get(domain)?;
        let mut found = None;
        for (i, (key, value)) in entries.iter().enumerate() {
            let exact = format!("{key}_{value}");
            let next = level
                .children
                .get(&exact)
                .or_else(|| {
                    level
                        .wildcards
                        .iter()
                        .find(|w| exact.starts_with(w.trim_end_matches('*')))
                        .and_then(|w| level.children.get(w))
                })
                .or_else(|| level.children.get(*key));
            let Some(next) = next else { break };
            if i == entries.len() - 1 {
                found = next.limit.clone();
            }
            if next.children.is_empty() {
                break;
            }
            level = next;
        }
        found
    }
}

fn load(
    node: &mut Node,
    path: &str,
    descriptors: &[YamlDescriptor],
    bounds: &Bounds,
) -> Result<(), String> {
    for d in descriptors {
        if d.key.is_empty() {
            return Err(format!("{path}: descriptor has an empty key"));
        }
        let final_key = match &d.value {
            Some(v) if !v.is_empty() => format!("{}_{v}", d.key),
            _ => d.key.clone(),
        };
        let here = format!("{path}.{final_key}");
        if node.children.contains_key(&final_key) {
            return Err(format!("{here}: duplicate descriptor"));
        }
        let mut child = Node::default();
        if let Some(rl) = &d.rate_limit {
            child.limit = Some(Arc::new(rule_limit(&here, rl, d.shadow_mode, bounds)?));
        }
        load(&mut child, &here, &d.descriptors, bounds)?;
        if final_key.ends_with('*') {
            node.wildcards.push(final_key.clone());
        }
        node.children.insert(final_key, child);
    }
    // Longest prefix first, so the most specific wildcard wins.
    node.wildcards.sort_by_key(|w| std::cmp::Reverse(w.len()));
    Ok(())
}

fn rule_limit(
    here: &str,
    rl: &YamlRateLimit,
    shadow: bool,
    bounds: &Bounds,
) -> Result<RuleLimit, String> {
    let field = |f: &str, m: String| format!("{here}.rate_limit.{f}: {m}");
    let unit = match (&rl.unit, rl.unlimited) {
        (Some(u), true) if Unit::parse(u).is_some() => {
            return Err(field("unit", "should not be set when unlimited".into()));
        }
        (_, true) => Unit::Second,
        (Some(u), false) => {
            Unit::parse(u).ok_or_else(|| field("unit", format!("invalid unit '{u}'")))?
        }
        (None, false) => {
            return Err(field(
                "unit",
                "required (second … year), or set unlimited: true".into(),
            ));
        }
    };
    for r in &rl.replaces {
        if r.name.is_empty() {
            return Err(field("replaces", "an entry has an empty name".into()));
        }
        if Some(&r.name) == rl.name.as_ref() {
            return Err(field("replaces", "a limit cannot replace itself".into()));
        }
    }
    let algorithm = match &rl.algorithm {
        // envoyproxy/ratelimit counts fixed windows.
        None => Algorithm::FixedWindow,
        Some(a) => Algorithm::from_name(a)
            .ok_or_else(|| field("algorithm", format!("unknown algorithm '{a}'")))?,
    };
    let on_owner_unreachable = match &rl.on_owner_unreachable {
        None => OnOwnerUnreachable::default(),
        Some(m) => OnOwnerUnreachable::from_name(m)
            .ok_or_else(|| field("on_owner_unreachable", format!("unknown mode '{m}'")))?,
    };
    let spec = if rl.unlimited {
        None
    } else {
        Some(
            unit_spec(algorithm, rl.requests_per_unit, unit, rl.burst, bounds)
                .map_err(|e| field("burst", e))?,
        )
    };
    Ok(RuleLimit {
        label: Arc::from(rl.name.clone().unwrap_or_else(|| here.to_string())),
        name: rl.name.clone(),
        requests_per_unit: rl.requests_per_unit,
        unit,
        spec,
        shadow,
        replaces: rl.replaces.iter().map(|r| r.name.clone()).collect(),
        on_owner_unreachable,
    })
}

/// Limits matched by one request, after `replaces`: a named limit replaced
/// by another matched limit is dropped.
pub fn apply_replaces(limits: &mut [Option<Arc<RuleLimit>>]) {
    let replaced: BTreeMap<String, ()> = limits
        .iter()
        .flatten()
        .flat_map(|l| l.replaces.iter().map(|r| (r.clone(), ())))
        .collect();
    for slot in limits.iter_mut() {
        if slot
            .as_ref()
            .and_then(|l| l.name.as_ref())
            .is_some_and(|n| replaced.contains_key(n))
        {
            *slot = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(text: &str) -> Rules {
        let mut r = Rules::default();
        r.add(text, &Bounds::default()).unwrap();
        r
    }

    fn err(text: &str) -> String {
        Rules::default().add(text, &Bounds::default()).unwrap_err()
    }

    #[test]
    fn matches_like_envoyproxy_ratelimit() {
        let r = rules(
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n    rate_limit: {unit: second, requests_per_unit: 5}\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: path\n    value: \"/api/*\"\n    rate_limit: {unit: hour, requests_per_unit: 7}\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {unit: day, requests_per_unit: 9}\n",
        );
        assert_eq!(r.find("d", &[("k", "v")]).unwrap().requests_per_unit, 5);
        assert_eq!(r.find("d", &[("k", "other")]).unwrap().requests_per_unit, 1);
        assert_eq!(
            r.find("d", &[("path", "/api/x")])
                .unwrap()
                .requests_per_unit,
            7
        );
        assert!(r.find("d", &[("path", "/web")]).is_none());
        assert_eq!(
            r.find("d", &[("a", "1"), ("b", "2")])
                .unwrap()
                .requests_per_unit,
            9
        );
        assert!(
            r.find("d", &[("a", "1")]).is_none(),
            "no limit at that depth"
        );
        assert!(
            r.find("d", &[("k", "v"), ("extra", "x")]).is_none(),
            "deeper than the rules"
        );
        assert!(r.find("other", &[("k", "v")]).is_none());
    }

    #[test]
    fn units_keep_their_meaning_and_zero_denies() {
        let r = rules(
            "domain: d\ndescriptors:\n  - key: m\n    rate_limit: {unit: month, requests_per_unit: 0}\n",
        );
        let l = r.find("d", &[("m", "x")]).unwrap();
        let spec = l.spec.unwrap();
        assert_eq!(spec.period(), Period::Duration(30 * 86_400 * SECOND));
        assert_eq!(spec.algorithm(), Algorithm::FixedWindow);
        assert_eq!(spec.limit(), 0);
    }

    #[test]
    fn malformed_files_name_the_key() {
        assert!(err("domain: \"\"\n").contains("domain"));
        assert!(err("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n").contains("d.k.rate_limit.unit"));
        assert!(err("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n").contains("unit"));
        assert!(err("domain: d\ndescriptors:\n  - key: k\n  - key: k\n").contains("duplicate"));
        assert!(err("domain: d\ndescriptors:\n  - key: k\n    bogus: 1\n").contains("bogus"));
        assert!(err("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: magic}\n").contains("algorithm"));
        let line = err(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
        );
        assert!(line.contains("line 4"), "{line}");
    }

    #[test]
    fn replaces_drops_the_named_limit() {
        let r = rules(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, name: general}\n  - key: b\n    rate_limit:\n      unit: second\n      requests_per_unit: 9\n      replaces: [{name: general}]\n",
        );
        let mut limits = vec![r.find("d", &[("a", "1")]), r.find("d", &[("b", "1")])];
        apply_replaces(&mut limits);
        assert!(limits[0].is_none());
        assert_eq!(limits[1].as_ref().unwrap().requests_per_unit, 9);
    }
}
