//! The `Idempotency-Key` rule (contract.md section 3), shared by the gateway that enforces it
//! and the client that checks keys before sending them.

/// Longest key, in bytes (every valid key is ASCII, so also in characters).
pub const MAX_KEY_LEN: usize = 256;

/// Whether `key` is a valid `Idempotency-Key` value: 1 to [`MAX_KEY_LEN`] visible ASCII
/// characters (`!` to `~`; no spaces or control characters).
pub fn is_valid_key(key: &[u8]) -> bool {
    (1..=MAX_KEY_LEN).contains(&key.len()) && key.iter().all(u8::is_ascii_graphic)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_and_characters() {
        assert!(is_valid_key(b"a"));
        assert!(is_valid_key(b"!~"));
        assert!(is_valid_key("k".repeat(MAX_KEY_LEN).as_bytes()));
        assert!(!is_valid_key("k".repeat(MAX_KEY_LEN + 1).as_bytes()));
        for bad in [
            &b""[..],
            b"has space",
            b"tab\t",
            "\u{e9}".as_bytes(),
            b"\x7f",
        ] {
            assert!(!is_valid_key(bad), "{bad:?}");
        }
    }
}
