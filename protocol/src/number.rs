//! JSON numbers every peer reads exactly.
//!
//! The reference implementation and the SDKs are JavaScript, where a JSON number is an IEEE
//! double: integers above 2^53 - 1 silently lose precision. Every integer on the wire (cursors,
//! sequences, bounds in the spec and the deployment file) is therefore capped here, once.

/// Largest integer a JavaScript peer represents exactly (`Number.MAX_SAFE_INTEGER`, 2^53 - 1).
pub const MAX_SAFE_INTEGER: u64 = 9_007_199_254_740_991;

/// `f` as an integer when it is a whole number in `0..=MAX_SAFE_INTEGER` (so `5.0` is 5, as in
/// JSON Schema and JavaScript); `None` for fractions, negatives, NaN and infinities.
pub fn safe_integer(f: f64) -> Option<u64> {
    // `as` is exact here: the value is whole and within the range an f64 holds exactly.
    (f.fract() == 0.0 && (0.0..=MAX_SAFE_INTEGER as f64).contains(&f)).then_some(f as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_numbers_in_range_only() {
        assert_eq!(safe_integer(0.0), Some(0));
        assert_eq!(safe_integer(5.0), Some(5));
        assert_eq!(
            safe_integer(9_007_199_254_740_991.0),
            Some(MAX_SAFE_INTEGER)
        );
        for bad in [-1.0, 1.5, 9_007_199_254_740_992.0, f64::NAN, f64::INFINITY] {
            assert_eq!(safe_integer(bad), None, "{bad}");
        }
    }
}
