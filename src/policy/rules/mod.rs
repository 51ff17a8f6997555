//! Envoy descriptor rules, in the format of envoyproxy/ratelimit's YAML, so an
//! existing file loads unchanged and means what it meant there.
//!
//! ```yaml
//! domain: edge
//! descriptors:
//!   - key: remote_address          # no value: one counter per address seen
//!     rate_limit: { unit: second, requests_per_unit: 10 }
//!   - key: path
//!     value: "/api/*/orders"       # wildcard: `*` anywhere, any number
//!     share_threshold: true        # every matching path shares one counter
//!     rate_limit:
//!       unit: minute
//!       requests_per_unit: 100
//!       algorithm: gcra            # Sluice extensions: algorithm, burst,
//!       burst: 20                  # on_owner_unreachable, drain_over_limit
//!   - key: user
//!     value: internal
//!     rate_limit: { unlimited: true }   # whitelisted
//! ```
//!
//! The behaviour is envoyproxy/ratelimit's (`src/config/config_impl.go`, the
//! commit the README pins), ported rather than translated: [`parse`] reads
//! and validates a file, [`matching`] walks a request descriptor down the
//! tree. Matching, at every level: `key_value` exactly, else the level's
//! wildcards in file order (the first that matches wins), else `key` alone;
//! a limit applies when the *last* entry lands on a rule that has one.
//! Units keep that service's meaning: fixed windows aligned to the epoch, a
//! month of 30 days and a year of 365. `requests_per_unit: 0` denies
//! everything. `replaces` drops a named limit matched by another descriptor
//! of the same request.

mod matching;
mod parse;
#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::OnOwnerUnreachable;
use crate::algorithm::{Algorithm, Bounds, Period, Spec};
pub use matching::Found;
use matching::Node;

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
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

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

    /// Case-insensitive, as upstream upper-cases the name before looking it
    /// up in the protobuf enum.
    pub fn parse(s: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|u| u.name().eq_ignore_ascii_case(s))
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

/// A rule's `metadata`: a JSON-like map, kept free of protobuf types (the
/// Envoy service converts it to a `google.protobuf.Struct`).
pub type Metadata = serde_json::Map<String, serde_json::Value>;

/// A limit a rule sets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleLimit {
    /// What metrics call it: upstream's stats key. Loaded, it is the rule's
    /// descriptor path (`domain.key_value.key`), whatever its `name`;
    /// [`Rules::find`] swaps in the per-request key when `detailed_metric`
    /// or `value_to_metric` asks for values.
    pub label: Arc<str>,
    pub name: Option<String>,
    pub requests_per_unit: u32,
    pub unit: Unit,
    /// None: unlimited (whitelisted).
    pub spec: Option<Spec>,
    pub shadow: bool,
    /// Over the limit, this descriptor alone does not refuse the request
    /// (see `service::envoy`): only all quota descriptors over do.
    pub quota_mode: bool,
    /// Metrics by the request's values, not the rule's path.
    pub detailed_metric: bool,
    pub replaces: Vec<String>,
    pub on_owner_unreachable: OnOwnerUnreachable,
    /// A refused request still counts (the window is left full), as
    /// upstream's fixed window counts every hit it refuses.
    pub drain_over_limit: bool,
    pub metadata: Option<Arc<Metadata>>,
}

/// Every loaded domain.
#[derive(Debug, Default)]
pub struct Rules {
    domains: HashMap<String, Node>,
    /// Upstream's MERGE_DOMAIN_CONFIG: a domain in several files is one
    /// domain (a duplicate descriptor across them is still an error).
    merge_domains: bool,
    /// Which file defined each domain, for the duplicate-domain error.
    defined_in: HashMap<String, String>,
    /// Keys that were accepted but do nothing here, for the load log.
    has_metadata: bool,
    /// Of the files loaded (see [`fingerprint`]).
    fingerprint: u64,
}

/// A rules file that did not load, naming the file and the line or key.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {message}")]
pub struct RulesError {
    pub file: String,
    pub message: String,
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

/// The rule files at `path` with their text, in load order: `path` itself,
/// or every `.yaml`/`.yml` file in it (a directory, as a Kubernetes
/// ConfigMap mounts one), sorted by name.
pub fn read_files(path: &Path) -> Result<Vec<(PathBuf, String)>, RulesError> {
    let err = |file: &Path, message: String| RulesError {
        file: file.display().to_string(),
        message,
    };
    let files: Vec<PathBuf> = if path.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| err(path, e.to_string()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| is_rule_file(p))
            .collect();
        files.sort();
        files
    } else {
        vec![path.to_path_buf()]
    };
    files
        .into_iter()
        .map(|file| {
            let text = std::fs::read_to_string(&file).map_err(|e| err(&file, e.to_string()))?;
            Ok((file, text))
        })
        .collect()
}

/// What identifies a set of rule files: their names and contents, in order.
pub fn fingerprint(files: &[(PathBuf, String)]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for (file, text) in files {
        let name = file.as_os_str().as_encoded_bytes();
        h.update(&(name.len() as u64).to_le_bytes());
        h.update(name);
        h.update(&(text.len() as u64).to_le_bytes());
        h.update(text.as_bytes());
    }
    h.digest()
}

/// A file a rules directory loads: `*.yaml` or `*.yml`, not a dotfile (so
/// not a ConfigMap's `..data` internals).
pub fn is_rule_file(p: &Path) -> bool {
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
    !name.starts_with('.') && p.extension().is_some_and(|x| x == "yaml" || x == "yml")
}

impl Rules {
    /// No rules; `merge_domains` as upstream's MERGE_DOMAIN_CONFIG.
    pub fn new(merge_domains: bool) -> Rules {
        Rules {
            merge_domains,
            ..Rules::default()
        }
    }

    /// Load the rule files at `path` (see [`read_files`]), all or nothing.
    pub fn load(path: &Path, bounds: &Bounds, merge_domains: bool) -> Result<Rules, RulesError> {
        Rules::from_files(&read_files(path)?, bounds, merge_domains)
    }

    /// Load files already read, all or nothing.
    pub fn from_files(
        files: &[(PathBuf, String)],
        bounds: &Bounds,
        merge_domains: bool,
    ) -> Result<Rules, RulesError> {
        let mut rules = Rules::new(merge_domains);
        rules.fingerprint = fingerprint(files);
        for (file, text) in files {
            let name = file.display().to_string();
            rules
                .add_file(&name, text, bounds)
                .map_err(|message| RulesError {
                    file: name.clone(),
                    message,
                })?;
        }
        Ok(rules)
    }

    /// Parse one file's text into these rules.
    pub fn add(&mut self, text: &str, bounds: &Bounds) -> Result<(), String> {
        self.add_file("(text)", text, bounds)
    }

    fn add_file(&mut self, file: &str, text: &str, bounds: &Bounds) -> Result<(), String> {
        let root = parse::parse(text)?;
        let domain = root.domain.clone().unwrap_or_default();
        if domain.is_empty() {
            return Err("domain: the file must name a domain (`domain: <name>`)".into());
        }
        let mut fresh = Node::default();
        let node = match self.domains.get_mut(&domain) {
            Some(node) if self.merge_domains => node,
            Some(_) => {
                return Err(format!(
                    "domain: '{domain}' is already defined in {} (set envoy.merge_domain_config \
                     to merge the files of one domain)",
                    self.defined_in.get(&domain).map_or("another file", |f| f)
                ));
            }
            None => &mut fresh,
        };
        // A refused file fails the whole load (`from_files`), so a domain
        // half-merged here is never served.
        let loaded = parse::load_root(node, text, &domain, &root, bounds)?;
        self.has_metadata |= loaded.has_metadata;
        if !self.domains.contains_key(&domain) {
            self.domains.insert(domain.clone(), fresh);
            self.defined_in.insert(domain, file.to_string());
        }
        Ok(())
    }

    pub fn domains(&self) -> usize {
        self.domains.len()
    }

    /// Whether `domain` has rules (a file named it, even with no
    /// descriptors). Upstream answers "no limit" for every descriptor of an
    /// unknown domain, a limit override included.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// What the loaded files were (names and contents), so a watcher can
    /// tell a rewrite with the same content from a change.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// Whether any rule has `metadata` (sent only with
    /// `envoy.response_dynamic_metadata`).
    pub fn has_metadata(&self) -> bool {
        self.has_metadata
    }

    /// The rule for one request descriptor, if any.
    pub fn find(&self, domain: &str, entries: &[(&str, &str)]) -> Option<Found> {
        matching::find(self.domains.get(domain)?, domain, entries)
    }
}

/// Limits matched by one request, after `replaces`: a named limit replaced
/// by another matched limit is dropped. Unlimited rules replace others but
/// are never dropped themselves (upstream sets them aside before it looks
/// at names), so they keep answering with everything left.
pub fn apply_replaces(limits: &mut [Option<Found>]) {
    let replaced: BTreeSet<String> = limits
        .iter()
        .flatten()
        .flat_map(|f| f.limit.replaces.iter().cloned())
        .collect();
    for slot in limits.iter_mut() {
        if slot
            .as_ref()
            .filter(|f| f.limit.spec.is_some())
            .and_then(|f| f.limit.name.as_ref())
            .is_some_and(|n| replaced.contains(n))
        {
            *slot = None;
        }
    }
}
