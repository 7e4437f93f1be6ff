//! The gateway's base URL, validated once.
//!
//! The reference SDKs reject base URLs with credentials, a query or a fragment [R 89]: user
//! info would be sent to whoever answers, and a query or fragment would silently change or be
//! dropped from every endpoint URL. A path prefix is allowed (a gateway behind a reverse proxy at
//! `https://example.com/runtime/`); endpoints are resolved below it.

use std::fmt;

use protocol::{ExecutionId, Sequence};
use url::Url;

use crate::error::ClientError;

/// Largest cursor every peer can represent exactly (JavaScript's `Number.MAX_SAFE_INTEGER`); the
/// gateway rejects larger ones [R 51].
pub const MAX_CURSOR: u64 = protocol::MAX_SAFE_INTEGER;

/// A validated `http`/`https` base URL whose path ends with `/`.
#[derive(Clone, PartialEq, Eq)]
pub struct BaseUrl(Url);

impl fmt::Debug for BaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BaseUrl").field(&self.0.as_str()).finish()
    }
}

impl fmt::Display for BaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.as_str())
    }
}

impl BaseUrl {
    /// Parses and checks `input`. Messages never echo the input (it may hold a password).
    pub fn parse(input: &str) -> Result<Self, ClientError> {
        // `Url::parse` drops an empty `?` or `#`; they are rejected from the raw text as well.
        if input.contains(['?', '#']) {
            return Err(ClientError::InvalidBaseUrl(
                "a query or fragment is not allowed",
            ));
        }
        let mut url =
            Url::parse(input).map_err(|_| ClientError::InvalidBaseUrl("not an absolute URL"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(ClientError::InvalidBaseUrl(
                "the scheme must be http or https",
            ));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(ClientError::InvalidBaseUrl("credentials are not allowed"));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(ClientError::InvalidBaseUrl("a host is required"));
        }
        if !url.path().ends_with('/') {
            let path = format!("{}/", url.path());
            url.set_path(&path);
        }
        Ok(Self(url))
    }

    /// The URL as given (normalized, path ending with `/`).
    pub fn as_url(&self) -> &Url {
        &self.0
    }

    /// `relative` resolved below the base path.
    fn endpoint(&self, relative: &str) -> Url {
        // `relative` is one of this module's literals or contains a hyphenated UUID only, so
        // joining cannot fail; the base itself is the fallback that keeps this total.
        self.0.join(relative).unwrap_or_else(|_| self.0.clone())
    }

    pub(crate) fn runtime(&self) -> Url {
        self.endpoint("v1/runtime")
    }

    pub(crate) fn providers(&self) -> Url {
        self.endpoint("v1/providers")
    }

    pub(crate) fn executions(&self) -> Url {
        self.endpoint("v1/executions")
    }

    pub(crate) fn execution(&self, id: ExecutionId) -> Url {
        self.endpoint(&format!("v1/executions/{id}"))
    }

    pub(crate) fn result(&self, id: ExecutionId) -> Url {
        self.endpoint(&format!("v1/executions/{id}/result"))
    }

    pub(crate) fn cancel(&self, id: ExecutionId) -> Url {
        self.endpoint(&format!("v1/executions/{id}/cancel"))
    }

    pub(crate) fn events(&self, id: ExecutionId, after: Sequence) -> Url {
        let mut url = self.endpoint(&format!("v1/executions/{id}/events"));
        url.set_query(Some(&format!("after={}", after.get())));
        url
    }
}

/// Checks a cursor before any request is made [R 89].
pub fn check_cursor(after: Sequence) -> Result<Sequence, ClientError> {
    if after.get() <= MAX_CURSOR {
        Ok(after)
    } else {
        Err(ClientError::InvalidCursor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_and_prefixed_urls() {
        let id = ExecutionId::new_random();
        let base = BaseUrl::parse("http://127.0.0.1:4320").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(base.runtime().as_str(), "http://127.0.0.1:4320/v1/runtime");
        assert_eq!(
            base.events(id, Sequence(3)).as_str(),
            format!("http://127.0.0.1:4320/v1/executions/{id}/events?after=3")
        );
        let prefixed =
            BaseUrl::parse("https://example.com/runtime").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            prefixed.cancel(id).as_str(),
            format!("https://example.com/runtime/v1/executions/{id}/cancel")
        );
        let slash =
            BaseUrl::parse("https://example.com/runtime/").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(slash, prefixed);
    }

    #[test]
    fn rejects_credentials_query_fragment_and_other_schemes() {
        for bad in [
            "http://user:secret@127.0.0.1:4320",
            "http://user@127.0.0.1:4320",
            "http://127.0.0.1:4320/?a=1",
            "http://127.0.0.1:4320/?",
            "http://127.0.0.1:4320/#frag",
            "http://127.0.0.1:4320#",
            "ftp://127.0.0.1/",
            "file:///tmp/x",
            "127.0.0.1:4320",
            "",
            "not a url",
        ] {
            let err = BaseUrl::parse(bad).err();
            assert!(
                matches!(err, Some(ClientError::InvalidBaseUrl(_))),
                "{bad}: {err:?}"
            );
            if let Some(err) = err {
                assert!(!err.to_string().contains("secret"));
            }
        }
    }

    #[test]
    fn cursor_bounds() {
        assert!(check_cursor(Sequence(0)).is_ok());
        assert!(check_cursor(Sequence(MAX_CURSOR)).is_ok());
        assert!(matches!(
            check_cursor(Sequence(MAX_CURSOR + 1)),
            Err(ClientError::InvalidCursor)
        ));
    }
}
