//! Canary checks: tests plant a recognisable secret (a credential, an unknown field name) in
//! what they send and assert that it never comes back out, in a response, an event, a snapshot
//! or a log line. One assertion, so every test reports a leak the same way.

/// A canary credential for `test`, unique per test so a leak names the test that planted it.
/// Every canary contains [`MARKER`].
pub fn credential(test: &str) -> String {
    format!("sk-{MARKER}-{test}-3f9a7c")
}

/// The part every canary shares; a text containing it leaked one.
pub const MARKER: &str = "CANARY";

/// Asserts that `text` (described by `context` in the failure message) does not contain
/// `canary`.
#[track_caller]
pub fn assert_absent(canary: &str, context: &str, text: &str) {
    assert!(
        !text.contains(canary),
        "canary {canary:?} leaked into {context}: {text}"
    );
}

/// Asserts that none of `texts` contains `canary`; `context` names what they are.
#[track_caller]
pub fn assert_absent_all<S: AsRef<str>>(
    canary: &str,
    context: &str,
    texts: impl IntoIterator<Item = S>,
) {
    for (i, text) in texts.into_iter().enumerate() {
        assert_absent(canary, &format!("{context} #{i}"), text.as_ref());
    }
}
