//! Reading one rules file: the YAML shapes upstream accepts, validated into
//! the matching tree, every refusal naming the line and the field.
//!
//! Serde refuses what does not fit the shapes (unknown keys, a list entry
//! that is not a map) with the line it stopped at. What only the whole
//! descriptor can tell (a bad unit, a duplicate, `share_threshold` without
//! a wildcard) is checked after parsing; [`locate`] then finds the line of
//! the offending node by walking the text again to it, so those errors name
//! their line too without carrying positions through the tree.

use std::fmt;
use std::sync::Arc;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::matching::{Node, Wildcard};
use super::{Metadata, RuleLimit, Unit, unit_spec};
use crate::algorithm::{Algorithm, Bounds};
use crate::policy::OnOwnerUnreachable;

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a rules file: a map with `domain: <name>` and `descriptors: [...]`"
)]
pub(super) struct YamlRoot {
    #[serde(default, deserialize_with = "nullable")]
    pub domain: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    descriptors: Vec<YamlDescriptor>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a descriptor: a map such as `{key: user, value: alice, rate_limit: {unit: minute, \
                 requests_per_unit: 10}}` (`key` is required; `value`, `rate_limit`, `descriptors`, \
                 `shadow_mode`, `quota_mode`, `detailed_metric`, `value_to_metric`, \
                 `share_threshold` and `metadata` are optional)"
)]
struct YamlDescriptor {
    #[serde(default, deserialize_with = "nullable")]
    key: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    value: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    rate_limit: Option<YamlRateLimit>,
    #[serde(default, deserialize_with = "nullable")]
    descriptors: Vec<YamlDescriptor>,
    #[serde(default, deserialize_with = "yaml11_bool")]
    shadow_mode: bool,
    #[serde(default, deserialize_with = "yaml11_bool")]
    quota_mode: bool,
    #[serde(default, deserialize_with = "yaml11_bool")]
    detailed_metric: bool,
    #[serde(default, deserialize_with = "yaml11_bool")]
    value_to_metric: bool,
    #[serde(default, deserialize_with = "yaml11_bool")]
    share_threshold: bool,
    #[serde(default, deserialize_with = "nullable")]
    metadata: Option<serde_yaml_ng::Mapping>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a rate limit: a map such as `{unit: minute, requests_per_unit: 10}` or \
                 `{unlimited: true}`"
)]
struct YamlRateLimit {
    #[serde(default, deserialize_with = "nullable")]
    requests_per_unit: u32,
    #[serde(default, deserialize_with = "nullable")]
    unit: Option<String>,
    #[serde(default, deserialize_with = "yaml11_bool")]
    unlimited: bool,
    #[serde(default, deserialize_with = "nullable")]
    name: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    replaces: Vec<YamlReplaces>,
    // Sluice's extensions (envoyproxy/ratelimit refuses them).
    #[serde(default, deserialize_with = "nullable")]
    algorithm: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    burst: Option<u64>,
    #[serde(default, deserialize_with = "nullable")]
    on_owner_unreachable: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    drain_over_limit: Option<bool>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a replaces entry: `{name: <the name of another rate_limit>}`"
)]
struct YamlReplaces {
    #[serde(default, deserialize_with = "nullable")]
    name: Option<String>,
}

/// A key with nothing after it (`descriptors:`) is null in YAML; upstream's
/// decoder reads it as the empty value, so does this.
fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Upstream's YAML is 1.1, where `yes`, `on`, `y` (and their negatives)
/// are booleans too; a flag written that way must not be refused here.
fn yaml11_bool<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = bool;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a boolean (true or false)")
        }
        fn visit_bool<E: de::Error>(self, b: bool) -> Result<bool, E> {
            Ok(b)
        }
        fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<bool, E> {
            match s {
                "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" | "true" | "True"
                | "TRUE" => Ok(true),
                "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" | "false" | "False"
                | "FALSE" => Ok(false),
                _ => Err(E::invalid_value(de::Unexpected::Str(s), &self)),
            }
        }
    }
    d.deserialize_any(V)
}

/// Parse a file's text into its shapes (no validation beyond them).
pub(super) fn parse(text: &str) -> Result<YamlRoot, String> {
    serde_yaml_ng::from_str(text).map_err(|e| e.to_string())
}

/// What a loaded file held, beyond its rules.
pub(super) struct Loaded {
    pub has_metadata: bool,
}

/// Validate `root`'s descriptors into `node` (a domain's top level).
pub(super) fn load_root(
    node: &mut Node,
    text: &str,
    domain: &str,
    root: &YamlRoot,
    bounds: &Bounds,
) -> Result<Loaded, String> {
    let mut cx = Cx {
        text,
        bounds,
        steps: vec![Step::Key("descriptors")],
        has_metadata: false,
    };
    cx.load(node, domain, &root.descriptors)?;
    Ok(Loaded {
        has_metadata: cx.has_metadata,
    })
}

struct Cx<'a> {
    text: &'a str,
    bounds: &'a Bounds,
    /// Where in the file the descriptor being loaded is.
    steps: Vec<Step>,
    has_metadata: bool,
}

impl Cx<'_> {
    /// An error at the current descriptor, or at `field` in it.
    fn fail(&self, field: &[Step], message: String) -> String {
        let mut at = self.steps.clone();
        at.extend_from_slice(field);
        match locate(self.text, &at) {
            Some(line) => format!("line {line}: {message}"),
            None => message,
        }
    }

    fn load(
        &mut self,
        node: &mut Node,
        parent: &str,
        list: &[YamlDescriptor],
    ) -> Result<(), String> {
        for (i, d) in list.iter().enumerate() {
            self.steps.push(Step::Index(i));
            self.descriptor(node, parent, d)?;
            self.steps.pop();
        }
        Ok(())
    }

    fn descriptor(
        &mut self,
        node: &mut Node,
        parent: &str,
        d: &YamlDescriptor,
    ) -> Result<(), String> {
        let key = d.key.as_deref().unwrap_or("");
        if key.is_empty() {
            return Err(self.fail(
                &[],
                format!(
                    "{parent}: descriptor has an empty key (every descriptor needs `key: <name>`)"
                ),
            ));
        }
        // Value is optional: the tree is keyed by `key_value`, or `key`.
        let final_key = match d.value.as_deref() {
            Some(v) if !v.is_empty() => format!("{key}_{v}"),
            _ => key.to_string(),
        };
        let here = format!("{parent}.{final_key}");
        if node.children.contains_key(&final_key) {
            return Err(self.fail(&[], format!("duplicate descriptor composite key '{here}'")));
        }
        let wildcard = final_key.contains('*');
        if d.share_threshold && !wildcard {
            return Err(self.fail(
                &[Step::Key("share_threshold")],
                format!(
                    "{here}: share_threshold only applies to a wildcard value (one containing \
                     '*'); this descriptor's is '{final_key}'"
                ),
            ));
        }
        let metadata = match &d.metadata {
            Some(m) if !m.is_empty() => {
                self.has_metadata = true;
                Some(Arc::new(metadata(m).map_err(|e| {
                    self.fail(&[Step::Key("metadata")], format!("{here}: metadata: {e}"))
                })?))
            }
            _ => None,
        };
        let mut child = Node {
            value_to_metric: d.value_to_metric,
            share_threshold: d.share_threshold,
            ..Node::default()
        };
        if let Some(rl) = &d.rate_limit {
            child.limit = Some(Arc::new(self.rule_limit(&here, d, rl, metadata)?));
        }
        self.steps.push(Step::Key("descriptors"));
        self.load(&mut child, &here, &d.descriptors)?;
        self.steps.pop();
        if wildcard {
            node.wildcards.push(Wildcard::new(&final_key));
        }
        node.children.insert(final_key, child);
        Ok(())
    }

    fn rule_limit(
        &self,
        here: &str,
        d: &YamlDescriptor,
        rl: &YamlRateLimit,
        metadata: Option<Arc<Metadata>>,
    ) -> Result<RuleLimit, String> {
        let field = |f: &'static str, m: String| {
            self.fail(
                &[Step::Key("rate_limit"), Step::Key(f)],
                format!("{here}: rate_limit.{f}: {m}"),
            )
        };
        let unit = rl.unit.as_deref().and_then(Unit::parse);
        let unit = match (unit, rl.unlimited) {
            (Some(_), true) => {
                return Err(field("unit", "should not be set when unlimited".into()));
            }
            // Unused: nothing is counted.
            (None, true) => Unit::Second,
            (Some(u), false) => u,
            (None, false) => {
                let names: Vec<&str> = Unit::ALL.iter().map(|u| u.name()).collect();
                let given = rl.unit.as_deref().unwrap_or("");
                return Err(field(
                    "unit",
                    format!(
                        "invalid unit '{given}': one of {}, or set `unlimited: true`",
                        names.join(", ")
                    ),
                ));
            }
        };
        let mut replaces = Vec::with_capacity(rl.replaces.len());
        for r in &rl.replaces {
            let name = r.name.as_deref().unwrap_or("");
            if name.is_empty() {
                return Err(field("replaces", "an entry has an empty name".into()));
            }
            if Some(name) == rl.name.as_deref() {
                return Err(field(
                    "replaces",
                    format!("a limit cannot replace itself ('{name}')"),
                ));
            }
            replaces.push(name.to_string());
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
                unit_spec(algorithm, rl.requests_per_unit, unit, rl.burst, self.bounds)
                    .map_err(|e| field("burst", e))?,
            )
        };
        Ok(RuleLimit {
            label: Arc::from(here),
            name: rl.name.clone().filter(|n| !n.is_empty()),
            requests_per_unit: rl.requests_per_unit,
            unit,
            spec,
            shadow: d.shadow_mode,
            quota_mode: d.quota_mode,
            detailed_metric: d.detailed_metric,
            replaces,
            on_owner_unreachable,
            drain_over_limit: rl.drain_over_limit.unwrap_or(true),
            metadata,
        })
    }
}

/// `metadata` as JSON: any YAML value, map keys that are scalars (upstream
/// formats them as strings too).
fn metadata(m: &serde_yaml_ng::Mapping) -> Result<Metadata, String> {
    let mut out = Metadata::new();
    for (k, v) in m {
        out.insert(metadata_key(k)?, to_json(v)?);
    }
    Ok(out)
}

fn metadata_key(k: &serde_yaml_ng::Value) -> Result<String, String> {
    use serde_yaml_ng::Value as Y;
    match k {
        Y::String(s) => Ok(s.clone()),
        Y::Number(n) => Ok(n.to_string()),
        Y::Bool(b) => Ok(b.to_string()),
        _ => Err("a map key must be a string, a number or a boolean".into()),
    }
}

fn to_json(v: &serde_yaml_ng::Value) -> Result<serde_json::Value, String> {
    use serde_json::Value as J;
    use serde_yaml_ng::Value as Y;
    Ok(match v {
        Y::Null => J::Null,
        Y::Bool(b) => J::Bool(*b),
        Y::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => J::from(i),
            (_, Some(u), _) => J::from(u),
            (_, _, Some(f)) => serde_json::Number::from_f64(f)
                .map(J::Number)
                .ok_or_else(|| format!("{n} is not a finite number"))?,
            _ => return Err(format!("{n} is not a number")),
        },
        Y::String(s) => J::String(s.clone()),
        Y::Sequence(items) => J::Array(items.iter().map(to_json).collect::<Result<_, _>>()?),
        Y::Mapping(m) => J::Object(metadata(m)?),
        Y::Tagged(t) => return Err(format!("YAML tags ({}) are not supported", t.tag)),
    })
}

/// One step from a node to a child: a map key or a list index.
#[derive(Clone, Copy, Debug)]
pub(super) enum Step {
    Key(&'static str),
    Index(usize),
}

/// The line (1-based) where the node at `path` starts in `text`, if there is
/// one. Walks the text with serde, skipping what is off the path, and stops
/// with a marker error at the node, whose location is the node's.
pub(super) fn locate(text: &str, path: &[Step]) -> Option<usize> {
    const HERE: &str = "sluice: located";
    struct Find<'a>(&'a [Step]);
    struct Here;
    impl<'de> DeserializeSeed<'de> for Find<'_> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            // The marker is raised *inside* the node, after its first
            // event: raised before, it would carry the previous node's mark.
            match self.0 {
                [] => d.deserialize_any(Here),
                _ => d.deserialize_any(self),
            }
        }
    }
    impl<'de> Visitor<'de> for Here {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("any node")
        }
        fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
            Err(de::Error::custom(HERE))
        }
        fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<(), A::Error> {
            Err(de::Error::custom(HERE))
        }
        fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
            Err(E::custom(HERE))
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
            Err(E::custom(HERE))
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
            Err(E::custom(HERE))
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
            Err(E::custom(HERE))
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
            Err(E::custom(HERE))
        }
        fn visit_unit<E: de::Error>(self) -> Result<(), E> {
            Err(E::custom(HERE))
        }
    }
    impl<'de> Visitor<'de> for Find<'_> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a map or a list on the path")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            let [Step::Key(want), rest @ ..] = self.0 else {
                return Err(de::Error::custom("off the path"));
            };
            while let Some(key) = map.next_key::<serde_yaml_ng::Value>()? {
                if key.as_str() == Some(want) {
                    return map.next_value_seed(Find(rest));
                }
                map.next_value::<IgnoredAny>()?;
            }
            Err(de::Error::custom("off the path"))
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            let [Step::Index(want), rest @ ..] = self.0 else {
                return Err(de::Error::custom("off the path"));
            };
            for _ in 0..*want {
                seq.next_element::<IgnoredAny>()?
                    .ok_or_else(|| de::Error::custom("off the path"))?;
            }
            seq.next_element_seed(Find(rest))?;
            Err(de::Error::custom("off the path"))
        }
    }
    let found = Find(path).deserialize(serde_yaml_ng::Deserializer::from_str(text));
    match found {
        Err(e) if e.to_string().contains(HERE) => e.location().map(|l| l.line()),
        _ => None,
    }
}
