//! The status page's credential check: the admin token as a Bearer token
//! or as HTTP Basic's password (a browser's login prompt sends that), the
//! user name ignored. Either way compared in constant time over digests.

use axum::http::{HeaderMap, header};

use crate::service::operator::AdminToken;

/// The longest `Authorization` value looked at (an admin token is 64 hex
/// characters; Basic adds a user name and base64's third).
const MAX_CREDENTIAL_BYTES: usize = 4 * 1024;

/// Whether the request carries the admin token.
pub fn is_operator(token: &AdminToken, headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return false;
    };
    let value = value.as_bytes();
    if value.len() > MAX_CREDENTIAL_BYTES {
        // No token is this long: refused before any decoding or hashing.
        return false;
    }
    if let Some(bearer) = value.strip_prefix(b"Bearer ") {
        return token.matches(bearer.trim_ascii());
    }
    if let Some(basic) = value.strip_prefix(b"Basic ") {
        let Some(decoded) = base64(basic.trim_ascii()) else {
            return false;
        };
        let Some(colon) = decoded.iter().position(|b| *b == b':') else {
            return false;
        };
        return token.matches(&decoded[colon + 1..]);
    }
    false
}

/// Standard base64 (padding optional); None if it is not base64. Bounded
/// by the header's size (hyper's limit), so no allocation beyond it.
fn base64(text: &[u8]) -> Option<Vec<u8>> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let text = text
        .strip_suffix(b"==")
        .or_else(|| text.strip_suffix(b"="))
        .unwrap_or(text);
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    for chunk in text.chunks(4) {
        if chunk.len() == 1 {
            return None;
        }
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= value(*c)? << (18 - 6 * i);
        }
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, value.parse().unwrap());
        h
    }

    #[test]
    fn bearer_and_basic_with_the_token_pass_and_nothing_else_does() {
        let token = AdminToken::of(b"the-token-0123456789");
        assert!(is_operator(&token, &with("Bearer the-token-0123456789")));
        // "anyone:the-token-0123456789"
        assert!(is_operator(
            &token,
            &with("Basic YW55b25lOnRoZS10b2tlbi0wMTIzNDU2Nzg5")
        ));
        assert!(!is_operator(&token, &with("Bearer wrong")));
        // "the-token-0123456789:x": the token as the user is not enough.
        assert!(!is_operator(
            &token,
            &with("Basic dGhlLXRva2VuLTAxMjM0NTY3ODk6eA==")
        ));
        assert!(!is_operator(&token, &with("Basic !!!")));
        assert!(!is_operator(&token, &HeaderMap::new()));
    }

    #[test]
    fn base64_decodes_with_and_without_padding() {
        assert_eq!(base64(b"YQ==").unwrap(), b"a");
        assert_eq!(base64(b"YWI").unwrap(), b"ab");
        assert_eq!(base64(b"YWJj").unwrap(), b"abc");
        assert!(base64(b"Y").is_none());
    }
}
