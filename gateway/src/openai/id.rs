//! Response and completion ids: `resp_<execution id without dashes>` and
//! `chatcmpl-<execution id without dashes>`, so an OpenAI id names its execution on any gateway
//! with no table to look it up in. The native id (a canonical UUID) works too.

use protocol::ExecutionId;

/// `resp_…` of an execution.
pub fn response_id(id: ExecutionId) -> String {
    format!("resp_{}", id.as_uuid().simple())
}

/// `chatcmpl-…` of an execution.
pub fn completion_id(id: ExecutionId) -> String {
    format!("chatcmpl-{}", id.as_uuid().simple())
}

/// The execution a path segment names: `resp_` + 32 lowercase hex digits, or a native id.
/// Anything else names nothing (answered 404 like an unknown id).
pub fn parse(raw: &str) -> Option<ExecutionId> {
    let Some(hex) = raw.strip_prefix("resp_") else {
        return raw.parse().ok();
    };
    if hex.len() != 32 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let canonical = format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    );
    canonical.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_the_native_form_is_accepted() {
        let id = ExecutionId::new_random();
        let resp = response_id(id);
        assert_eq!(resp.len(), 37);
        assert_eq!(parse(&resp), Some(id));
        assert_eq!(parse(&id.to_string()), Some(id));
        assert!(completion_id(id).starts_with("chatcmpl-"));
        for bad in [
            "resp_",
            "resp_xyz",
            &resp.to_uppercase(),
            &format!("{resp}0"),
            "nope",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
