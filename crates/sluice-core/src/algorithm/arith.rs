//! Integer helpers shared by the algorithms.
//!
//! Every product in a decision is of two values that fit in a `u64`, so it is
//! computed in `u128` and cannot overflow; sums saturate. Results that become
//! times or counts are clamped back to `u64` (a time past year 2554 is "never").

/// `a / b` for `b > 0`. A `u128` division is a slow library call, and
/// almost every operand in practice fits in 64 bits, so take the hardware
/// divide when it does.
pub(crate) fn div(a: u128, b: u128) -> u128 {
    match (u64::try_from(a), u64::try_from(b)) {
        (Ok(a), Ok(b)) => u128::from(a / b),
        _ => a / b,
    }
}

/// `ceil(a / b)` for `b > 0`.
pub(crate) fn ceil_div(a: u128, b: u128) -> u128 {
    debug_assert!(b > 0);
    match (u64::try_from(a), u64::try_from(b)) {
        (Ok(a), Ok(b)) => u128::from(a.div_ceil(b)),
        _ => a / b + u128::from(!a.is_multiple_of(b)),
    }
}

/// Clamp a wide value to `u64`, saturating.
pub(crate) fn sat64(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// `a * b` in `u128`; cannot overflow for `u64` inputs.
pub(crate) fn wide(a: u64, b: u64) -> u128 {
    u128::from(a) * u128::from(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceil_div_rounds_up_only_with_a_remainder() {
        assert_eq!(ceil_div(10, 5), 2);
        assert_eq!(ceil_div(11, 5), 3);
        assert_eq!(ceil_div(0, 5), 0);
        assert_eq!(ceil_div(u128::MAX, 1), u128::MAX);
        assert_eq!(ceil_div(u128::MAX, u128::MAX), 1);
    }

    #[test]
    fn fast_and_wide_paths_agree() {
        for (a, b) in [
            (7u128, 2u128),
            (u128::from(u64::MAX) + 5, 3),
            (9, u128::from(u64::MAX) + 1),
        ] {
            assert_eq!(div(a, b), a / b);
            assert_eq!(ceil_div(a, b), a.div_ceil(b));
        }
    }

    #[test]
    fn products_of_u64_fit() {
        assert_eq!(
            wide(u64::MAX, u64::MAX),
            u128::from(u64::MAX) * u128::from(u64::MAX)
        );
        assert_eq!(sat64(u128::MAX), u64::MAX);
        assert_eq!(sat64(7), 7);
    }
}
