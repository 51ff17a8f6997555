//! Matching a request descriptor to the rules, and naming what matched the
//! way upstream's stats do.
//!
//! Per entry, at the current level: `key_value` exactly; else the level's
//! wildcards in file order, the first match winning (a `*` matches any run
//! of characters, empty included, anywhere in the value and any number of
//! times); else `key` alone. The walk stops where the rules or the entries
//! end; only a rule reached by the *last* entry applies.

use std::collections::HashMap;
use std::sync::Arc;

use super::RuleLimit;

/// One level of the rules tree: a domain's top level or a descriptor.
#[derive(Debug, Default)]
pub(super) struct Node {
    pub limit: Option<Arc<RuleLimit>>,
    /// By `key_value`, or `key` for a descriptor without a value.
    pub children: HashMap<String, Node>,
    /// The children whose key contains `*`, in file order.
    pub wildcards: Vec<Wildcard>,
    /// Metrics name the request's value at this level (see [`find`]).
    pub value_to_metric: bool,
    /// Every value this node's wildcard matches counts as one.
    pub share_threshold: bool,
}

/// A child key with `*` in it, split once at load so a lookup allocates
/// nothing.
#[derive(Debug)]
pub(super) struct Wildcard {
    key: String,
    parts: Vec<String>,
}

impl Wildcard {
    pub fn new(key: &str) -> Wildcard {
        Wildcard {
            key: key.to_string(),
            parts: key.split('*').map(String::from).collect(),
        }
    }

    /// Whether `s` is the literal parts in order, each `*` standing for any
    /// run of characters (empty included).
    pub fn matches(&self, s: &str) -> bool {
        let (first, last) = match self.parts.as_slice() {
            [] => return false,
            [only] => return only == s,
            [first, .., last] => (first, last),
        };
        let fixed: usize = self.parts.iter().map(String::len).sum();
        if s.len() < fixed || !s.starts_with(first.as_str()) || !s.ends_with(last.as_str()) {
            return false;
        }
        // The middle parts, in order, between the prefix and the suffix
        // (which cannot overlap: the length check above).
        let mut rest = &s[first.len()..s.len() - last.len()];
        for part in &self.parts[1..self.parts.len() - 1] {
            match rest.find(part.as_str()) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

/// The rule one request descriptor matched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// Its `label` is this request's stats key (see [`find`]).
    pub limit: Arc<RuleLimit>,
    /// Per entry: the wildcard value it counts under instead of its own
    /// (`share_threshold`); empty when no entry shares.
    pub shared: Vec<Option<Arc<str>>>,
}

impl Found {
    /// The entries the counter is keyed by: the request's, with each
    /// shared entry's value replaced by its wildcard, so every value the
    /// wildcard matches lands on one counter (upstream's cache key).
    pub fn counter_entries<'a>(
        &'a self,
        entries: &'a [(String, String)],
    ) -> Vec<(&'a str, &'a str)> {
        entries
            .iter()
            .enumerate()
            .map(
                |(i, (k, v))| match self.shared.get(i).and_then(Option::as_deref) {
                    Some(pattern) => (k.as_str(), pattern),
                    None => (k.as_str(), v.as_str()),
                },
            )
            .collect()
    }
}

/// How one entry matched its level.
#[derive(Clone, Copy)]
enum How<'n> {
    /// `key_value` exactly.
    Value,
    /// A wildcard; the value part of its key (`key_` stripped).
    Wildcard(&'n str),
    /// `key` alone.
    Key,
}

/// The rule for `entries` under `root` (the domain `domain`), if any.
///
/// Its label follows upstream's stats key: the rule's path, except that
/// `detailed_metric` on the rule names every entry by the request's value
/// (a shared entry by its wildcard), and `value_to_metric` on a level names
/// that entry by the request's value where the rule has none or a wildcard
/// (a shared wildcard keeps its pattern).
pub(super) fn find(root: &Node, domain: &str, entries: &[(&str, &str)]) -> Option<Found> {
    let mut level = root;
    let mut steps: Vec<(How<'_>, &Node)> = Vec::with_capacity(entries.len());
    let mut found = None;
    for (i, (key, value)) in entries.iter().enumerate() {
        let composite = format!("{key}_{value}");
        let (next, how) = match level.children.get(&composite) {
            Some(n) => (Some(n), How::Value),
            None => match level.wildcards.iter().find(|w| w.matches(&composite)) {
                Some(w) => (
                    level.children.get(&w.key),
                    How::Wildcard(w.key.strip_prefix(&format!("{key}_")).unwrap_or(&w.key)),
                ),
                None => (level.children.get(*key), How::Key),
            },
        };
        let Some(next) = next else { break };
        steps.push((how, next));
        if i + 1 == entries.len() {
            found = next.limit.clone();
        }
        if next.children.is_empty() {
            break;
        }
        level = next;
    }
    let limit = found?;
    let shared: Vec<Option<Arc<str>>> = if steps
        .iter()
        .any(|(how, n)| matches!(how, How::Wildcard(_)) && n.share_threshold)
    {
        steps
            .iter()
            .map(|(how, n)| match how {
                How::Wildcard(p) if n.share_threshold => Some(Arc::from(*p)),
                _ => None,
            })
            .collect()
    } else {
        Vec::new()
    };
    let label = if limit.detailed_metric {
        Some(detailed_label(domain, entries, &shared))
    } else if steps.iter().any(|(_, n)| n.value_to_metric) {
        Some(value_label(domain, entries, &steps))
    } else {
        None
    };
    let limit = match label {
        Some(label) if *label != *limit.label => Arc::new(RuleLimit {
            label: Arc::from(label),
            ..(*limit).clone()
        }),
        _ => limit,
    };
    Some(Found { limit, shared })
}

/// `detailed_metric`: `domain.key_value…` for every entry. Upstream writes
/// `key_` for an empty value here, except when an entry shares, where an
/// empty value is `key` alone; kept as is, so dashboards carry over.
fn detailed_label(domain: &str, entries: &[(&str, &str)], shared: &[Option<Arc<str>>]) -> String {
    let mut s = String::from(domain);
    for (i, (k, v)) in entries.iter().enumerate() {
        s.push('.');
        s.push_str(k);
        if shared.is_empty() {
            s.push('_');
            s.push_str(v);
        } else if let Some(p) = shared.get(i).and_then(Option::as_deref) {
            s.push('_');
            s.push_str(p);
        } else if !v.is_empty() {
            s.push('_');
            s.push_str(v);
        }
    }
    s
}

/// `value_to_metric` somewhere on the path: each entry as the rule names
/// it, or by the request's value where that level asks.
fn value_label(domain: &str, entries: &[(&str, &str)], steps: &[(How<'_>, &Node)]) -> String {
    let mut s = String::from(domain);
    for ((k, v), (how, node)) in entries.iter().zip(steps) {
        let value = match how {
            How::Wildcard(p) if node.share_threshold => p,
            How::Wildcard(_) if node.value_to_metric => v,
            How::Wildcard(p) => p,
            How::Value => v,
            How::Key if node.value_to_metric => v,
            How::Key => "",
        };
        s.push('.');
        s.push_str(k);
        if !value.is_empty() {
            s.push('_');
            s.push_str(value);
        }
    }
    s
}
