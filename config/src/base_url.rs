//! [`BaseUrl`]: where a provider adapter sends its requests; [`ExactUrl`]: a URL requests go to
//! as written (a webhook endpoint).
//!
//! The one decision a reader must know: a base URL receives credentials, so only https, or
//! http on loopback, without user info, query or fragment, is accepted [R 62]; and
//! [`BaseUrl::endpoint`] refuses paths that would leave it.

use std::net::{Ipv4Addr, Ipv6Addr};

use url::{Host, Url};

/// The requirement a refused base URL broke, as errors state it.
pub(crate) const UNSAFE_BASE_URL: &str =
    "must be https or loopback http without credentials, query or fragment";

/// A provider base URL: https, or http only on 127.0.0.1, localhost or `[::1]`; no user
/// info, query or fragment [R 62]. Stored without a trailing slash, so `format!("{base}/x")`
/// and [`BaseUrl::endpoint`] both give `…/x`. It holds no secret and may be logged.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BaseUrl(Url);

/// Why a base URL was refused. Deliberately carries nothing of the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("base URL {UNSAFE_BASE_URL}")]
pub struct UnsafeBaseUrl;

impl BaseUrl {
    pub fn parse(input: &str) -> Result<Self, UnsafeBaseUrl> {
        let mut url = safe(input)?;
        let path = url.path().trim_end_matches('/').to_owned();
        url.set_path(&path);
        Ok(Self(url))
    }

    /// The URL without a trailing slash.
    pub fn as_str(&self) -> &str {
        // Query, fragment and trailing slashes are gone, so a final `/` is the root path.
        let s = self.0.as_str();
        s.strip_suffix('/').unwrap_or(s)
    }

    pub fn url(&self) -> &Url {
        &self.0
    }

    /// `suffix` appended below the base path, or `None` when the result would leave it: another
    /// origin, a path outside the base (`../`), or a query or fragment. Use this for paths built
    /// from configuration such as a fal model [R 69].
    pub fn endpoint(&self, suffix: &str) -> Option<Url> {
        let joined = format!("{}/{}", self.as_str(), suffix.trim_start_matches('/'));
        let url = Url::parse(&joined).ok()?;
        let base_path = self.0.path().trim_end_matches('/');
        let below = url
            .path()
            .strip_prefix(base_path)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
        let same_origin = url.origin() == self.0.origin();
        let clean = url.username().is_empty()
            && url.password().is_none()
            && url.query().is_none()
            && url.fragment().is_none();
        (same_origin && below && clean).then_some(url)
    }
}

/// `input` parsed, when it keeps the rule of [`BaseUrl`] (see the module docs).
fn safe(input: &str) -> Result<Url, UnsafeBaseUrl> {
    let url = Url::parse(input).map_err(|_| UnsafeBaseUrl)?;
    let loopback = match url.host() {
        Some(Host::Domain(domain)) => domain == "localhost",
        Some(Host::Ipv4(ip)) => ip == Ipv4Addr::LOCALHOST,
        Some(Host::Ipv6(ip)) => ip == Ipv6Addr::LOCALHOST,
        None => false,
    };
    let scheme_ok = url.scheme() == "https" || (url.scheme() == "http" && loopback);
    if !scheme_ok
        || url.host().is_none()
        || !url.username().is_empty()
        || url.password().is_some()
        || url.query().is_some()
        || url.fragment().is_some()
    {
        return Err(UnsafeBaseUrl);
    }
    Ok(url)
}

/// A URL under the rule of [`BaseUrl`], kept as written, a trailing slash included: where
/// requests go as they are, never below it (a webhook endpoint: `/hook/` and `/hook` may be
/// different resources to its receiver, and a redirect between them is never followed).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ExactUrl(Url);

impl ExactUrl {
    pub fn parse(input: &str) -> Result<Self, UnsafeBaseUrl> {
        safe(input).map(Self)
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    pub fn url(&self) -> &Url {
        &self.0
    }
}

impl std::fmt::Display for ExactUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for BaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
