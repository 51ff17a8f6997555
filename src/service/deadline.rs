//! The caller's deadline, from gRPC's `grpc-timeout` header: how long a
//! call may take, so forwards and pulls share the caller's budget rather
//! than a fixed one (a busy machine answered approximately when forwards
//! missed a fixed 10 ms).

use std::time::Duration;

/// The budget a `grpc-timeout` value gives (`<digits><unit>`, at most 8
/// digits; units `H M S m u n`); None when absent or malformed.
pub fn grpc_timeout(metadata: &tonic::metadata::MetadataMap) -> Option<Duration> {
    parse(metadata.get("grpc-timeout")?.to_str().ok()?)
}

fn parse(value: &str) -> Option<Duration> {
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3_600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_grpc_timeouts() {
        assert_eq!(parse("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse("1H"), Some(Duration::from_secs(3_600)));
        assert_eq!(parse("250u"), Some(Duration::from_micros(250)));
        assert_eq!(parse("12345678n"), Some(Duration::from_nanos(12_345_678)));
        for bad in ["", "m", "100", "100x", "123456789m", "-1m", "1.5S"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
