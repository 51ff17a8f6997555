//! Refusal and quota headers for HTTP callers: one function, used by the
//! HTTP check endpoint and by Envoy's `response_headers_to_add` (and by the
//! client middleware).
//!
//! - `Retry-After`: delta-seconds, rounded up, only on refusal (RFC 9110 §10.2.3).
//! - `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`: the
//!   de-facto headers; `X-RateLimit-Reset` carries **seconds until the reset**
//!   (rounded up), not an epoch time.
//! - `RateLimit-Policy` and `RateLimit`, from the IETF draft
//!   (draft-ietf-httpapi-ratelimit-headers-10), as structured-field lists:
//!   `RateLimit-Policy: "name";q=100;w=60` and `RateLimit: "name";r=50;t=30`.

use std::time::Duration;

/// What the headers describe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quota<'a> {
    /// The policy's name (made a valid structured-field string).
    pub policy: &'a str,
    pub limit: u64,
    pub remaining: u64,
    /// Until the key is back to full.
    pub reset_in: Duration,
    /// The limit's period.
    pub window: Duration,
    /// Set on a refusal that can be retried.
    pub retry_after: Option<Duration>,
}

/// Which header families to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Families {
    pub retry_after: bool,
    pub x_ratelimit: bool,
    pub ietf: bool,
}

impl Default for Families {
    fn default() -> Self {
        Families {
            retry_after: true,
            x_ratelimit: true,
            ietf: true,
        }
    }
}

impl Families {
    /// Parse names as in config: `retry-after`, `x-ratelimit`, `ietf`.
    pub fn parse(names: &[String]) -> Result<Families, String> {
        let mut f = Families {
            retry_after: false,
            x_ratelimit: false,
            ietf: false,
        };
        for n in names {
            match n.as_str() {
                "retry-after" => f.retry_after = true,
                "x-ratelimit" => f.x_ratelimit = true,
                "ietf" => f.ietf = true,
                other => {
                    return Err(format!(
                        "unknown header family '{other}'; one of retry-after, x-ratelimit, ietf"
                    ));
                }
            }
        }
        Ok(f)
    }
}

/// Whole seconds, rounded up (a client must never retry early).
fn secs_up(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// An sf-string (RFC 8941 §3.3.3): printable ASCII in quotes, with `"` and
/// `\` escaped; anything else becomes `_`.
fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('_'),
        }
    }
    out.push('"');
    out
}

/// The headers for one answer, in a stable order.
pub fn headers(q: &Quota<'_>, f: Families) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if f.retry_after
        && let Some(r) = q.retry_after
    {
        out.push(("retry-after", secs_up(r).max(1).to_string()));
    }
    if f.x_ratelimit {
        out.push(("x-ratelimit-limit", q.limit.to_string()));
        out.push(("x-ratelimit-remaining", q.remaining.to_string()));
        out.push(("x-ratelimit-reset", secs_up(q.reset_in).to_string()));
    }
    if f.ietf {
        let name = sf_string(q.policy);
        out.push((
            "ratelimit-policy",
            format!("{name};q={};w={}", q.limit, secs_up(q.window).max(1)),
        ));
        out.push((
            "ratelimit",
            format!("{name};r={};t={}", q.remaining, secs_up(q.reset_in)),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(retry: Option<u64>) -> Quota<'static> {
        Quota {
            policy: "api",
            limit: 100,
            remaining: 0,
            reset_in: Duration::from_millis(29_001),
            window: Duration::from_secs(60),
            retry_after: retry.map(Duration::from_millis),
        }
    }

    #[test]
    fn refusal_headers_round_up_and_follow_the_draft() {
        let h = headers(&quota(Some(1_500)), Families::default());
        assert_eq!(
            h,
            vec![
                ("retry-after", "2".to_string()),
                ("x-ratelimit-limit", "100".to_string()),
                ("x-ratelimit-remaining", "0".to_string()),
                ("x-ratelimit-reset", "30".to_string()),
                ("ratelimit-policy", r#""api";q=100;w=60"#.to_string()),
                ("ratelimit", r#""api";r=0;t=30"#.to_string()),
            ]
        );
    }

    #[test]
    fn retry_after_only_on_refusal_and_families_are_chosen() {
        let h = headers(&quota(None), Families::default());
        assert!(h.iter().all(|(k, _)| *k != "retry-after"));
        let only = Families::parse(&["ietf".into()]).unwrap();
        assert_eq!(headers(&quota(Some(1)), only).len(), 2);
        assert!(Families::parse(&["nope".into()]).is_err());
        // Retry-After is delta-seconds, at least 1 (RFC 9110).
        let h = headers(&quota(Some(1)), Families::default());
        assert_eq!(h[0], ("retry-after", "1".to_string()));
    }

    #[test]
    fn names_become_valid_sf_strings() {
        assert_eq!(sf_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(sf_string("ключ"), r#""____""#);
    }
}
