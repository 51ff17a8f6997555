//! The store key: the pair (name, unique_key), length-prefixed.
//!
//! Encoding: `u32_le(len(name)) ‖ name ‖ u32_le(len(unique_key)) ‖
//! unique_key`. Every pair has exactly one encoding and every encoding one
//! pair, so `("a/b", "c")` and `("a", "b/c")` never share a counter. The
//! bytes are also what the cluster ring hashes, so this format is frozen.

use std::cell::RefCell;

/// Encode into `out` (cleared first).
pub fn encode_into(name: &str, unique_key: &str, out: &mut Vec<u8>) {
    out.clear();
    out.reserve(8 + name.len() + unique_key.len());
    for part in [name, unique_key] {
        // Validation bounds both parts far below u32::MAX.
        out.extend_from_slice(&(part.len() as u32).to_le_bytes());
        out.extend_from_slice(part.as_bytes());
    }
}

/// Encode into a new buffer.
pub fn encode(name: &str, unique_key: &str) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(name, unique_key, &mut out);
    out
}

/// Call `f` with the encoded key, reusing a per-thread buffer so that a
/// lookup of an existing key allocates nothing.
pub fn with_encoded<R>(name: &str, unique_key: &str, f: impl FnOnce(&[u8]) -> R) -> R {
    thread_local! {
        static BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    }
    BUF.with(|buf| match buf.try_borrow_mut() {
        Ok(mut buf) => {
            encode_into(name, unique_key, &mut buf);
            f(&buf)
        }
        // Re-entered from inside `f`: fall back to a fresh buffer.
        Err(_) => f(&encode(name, unique_key)),
    })
}

/// Decode an encoded key back into `(name, unique_key)`.
pub fn decode(bytes: &[u8]) -> Option<(&str, &str)> {
    let (name, rest) = part(bytes)?;
    let (key, rest) = part(rest)?;
    rest.is_empty().then_some((name, key))
}

fn part(bytes: &[u8]) -> Option<(&str, &[u8])> {
    let len = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
    let body = bytes.get(4..4 + len)?;
    Some((std::str::from_utf8(body).ok()?, &bytes[4 + len..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn separators_cannot_collide() {
        assert_ne!(encode("a/b", "c"), encode("a", "b/c"));
        assert_ne!(encode("ab", ""), encode("a", "b"));
        assert_ne!(encode("", "ab"), encode("a", "b"));
    }

    #[test]
    fn frozen_format() {
        assert_eq!(encode("ab", "c"), b"\x02\0\0\0ab\x01\0\0\0c".to_vec());
    }

    #[test]
    fn round_trips() {
        for (n, k) in [("a", "b"), ("", ""), ("näme", "ключ"), ("x/y", "z")] {
            assert_eq!(decode(&encode(n, k)), Some((n, k)));
            with_encoded(n, k, |b| assert_eq!(decode(b), Some((n, k))));
        }
        assert_eq!(decode(b"\x05\0\0\0ab"), None);
        assert_eq!(decode(b"\x01\0\0\0a\x00\0\0\0extra"), None);
    }
}
