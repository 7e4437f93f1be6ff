//! Provider base URLs: safe origins only, and endpoints that stay below the base; exact URLs
//! (webhook endpoints): the same rule, the path kept as written.

#![allow(clippy::unwrap_used)]

use config::{BaseUrl, ExactUrl, UnsafeBaseUrl};

#[test]
fn endpoint_stays_below_the_base() {
    let base = BaseUrl::parse("https://queue.example.com/api").unwrap();
    assert_eq!(
        base.endpoint("/fal-ai/flux/dev").unwrap().as_str(),
        "https://queue.example.com/api/fal-ai/flux/dev"
    );
    assert_eq!(
        base.endpoint("models/image").unwrap().as_str(),
        "https://queue.example.com/api/models/image"
    );
    for escape in [
        "../x",
        "a/../../x",
        "%2e%2e/x",
        "a?x=1",
        "a#f",
        "//evil.example/x",
    ] {
        let joined = base.endpoint(escape);
        assert!(
            joined
                .as_ref()
                .is_none_or(|url| url.host_str() == Some("queue.example.com")
                    && url.path().starts_with("/api/")
                    && url.query().is_none()
                    && url.fragment().is_none()),
            "{escape}: {joined:?}"
        );
    }
    assert!(base.endpoint("../x").is_none());
    assert!(base.endpoint("a?x=1").is_none());
    let root = BaseUrl::parse("https://queue.example.com").unwrap();
    assert_eq!(
        root.endpoint("a/b").unwrap().as_str(),
        "https://queue.example.com/a/b"
    );
    assert_eq!(
        UnsafeBaseUrl.to_string(),
        "base URL must be https or loopback http without credentials, query or fragment"
    );
}

#[test]
fn an_exact_url_keeps_its_path_and_the_base_url_rule() {
    for (input, kept) in [
        ("https://hooks.example/mrt/", "https://hooks.example/mrt/"),
        ("https://hooks.example/mrt", "https://hooks.example/mrt"),
        ("https://hooks.example", "https://hooks.example/"),
        ("http://127.0.0.1:9/hook/", "http://127.0.0.1:9/hook/"),
        ("http://[::1]:9/a//b/", "http://[::1]:9/a//b/"),
    ] {
        assert_eq!(ExactUrl::parse(input).unwrap().as_str(), kept, "{input}");
    }
    // The base URL of the same input loses its trailing slash; the exact one does not.
    assert_eq!(
        BaseUrl::parse("https://hooks.example/mrt/")
            .unwrap()
            .as_str(),
        "https://hooks.example/mrt"
    );
    for refused in [
        "http://hooks.example/mrt",
        "https://user:pass@hooks.example/mrt",
        "https://hooks.example/mrt?token=x",
        "https://hooks.example/mrt#f",
        "ftp://hooks.example/mrt",
        "not a url",
    ] {
        assert_eq!(ExactUrl::parse(refused), Err(UnsafeBaseUrl), "{refused}");
    }
}
