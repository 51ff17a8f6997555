//! Byte sizes in the config (`limits.max_memory`): an integer of bytes, or
//! a string with a unit — "512MiB", "2GB" (decimal units are powers of
//! 1000); whole numbers only, so a size is exact — and the default memory
//! budget, read from the container's limit. (No size-parsing crate is a
//! dependency; this is all the config needs.)

use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A size in bytes, read from an integer or a string with a unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteSize(pub u64);

const UNITS: [(&str, u64); 9] = [
    ("b", 1),
    ("kib", 1 << 10),
    ("mib", 1 << 20),
    ("gib", 1 << 30),
    ("tib", 1 << 40),
    ("kb", 1_000),
    ("mb", 1_000_000),
    ("gb", 1_000_000_000),
    ("tb", 1_000_000_000_000),
];

/// Parse "512MiB", "2 GB", "1048576" (case-insensitive units; no fractions).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let what = || {
        format!(
            "{text:?} is not a size: an integer of bytes, or one with a unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), e.g. \"512MiB\""
        )
    };
    let n: u64 = digits.parse().map_err(|_| what())?;
    let scale = if unit.is_empty() {
        1
    } else {
        UNITS
            .iter()
            .find(|(u, _)| *u == unit)
            .map(|(_, s)| *s)
            .ok_or_else(what)?
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("{text:?} is more bytes than this machine can count"))
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ByteSize, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a size: an integer of bytes or a string like \"512MiB\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("{v}: a size cannot be negative")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                parse_bytes(v).map(ByteSize).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// What `limits.max_memory` is when unset: half the container's memory
/// limit (cgroup v2 `memory.max`, else v1 `memory.limit_in_bytes`) when one
/// is set — the other half is for the table's spare capacity, connections,
/// batches and the allocator's own slack — else 1 GiB.
pub fn default_max_memory() -> u64 {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    container_limit(
        read("/sys/fs/cgroup/memory.max").as_deref(),
        read("/sys/fs/cgroup/memory/memory.limit_in_bytes").as_deref(),
    )
    .map_or(DEFAULT_WITHOUT_LIMIT, |limit| limit / 2)
}

/// Without a container limit.
pub const DEFAULT_WITHOUT_LIMIT: u64 = 1 << 30;

/// The container's memory limit from the cgroup files' text, if one is set
/// ("max" in v2, or v1's huge "unlimited" figure, mean none).
pub fn container_limit(v2: Option<&str>, v1: Option<&str>) -> Option<u64> {
    // cgroup v1 writes an unlimited limit as a page-rounded i64::MAX.
    const V1_UNLIMITED: u64 = 1 << 62;
    let parse = |t: Option<&str>| t?.trim().parse::<u64>().ok();
    match v2 {
        Some(t) if t.trim() == "max" => None,
        Some(_) => parse(v2),
        None => parse(v1).filter(|&n| n < V1_UNLIMITED),
    }
    .filter(|&n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_and_without_units() {
        assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("2 gb"), Ok(2_000_000_000));
        assert_eq!(parse_bytes("1KiB"), Ok(1024));
        for bad in ["", "MiB", "1.5GiB", "-3", "12 parsecs", "99999999999TiB"] {
            assert!(parse_bytes(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_default_is_half_the_container_limit() {
        assert_eq!(container_limit(Some("max\n"), None), None);
        assert_eq!(container_limit(Some("2147483648\n"), None), Some(1 << 31));
        assert_eq!(
            container_limit(None, Some("9223372036854771712\n")),
            None,
            "v1's unlimited"
        );
        assert_eq!(container_limit(None, Some("536870912")), Some(1 << 29));
        assert_eq!(container_limit(None, None), None);
    }
}
