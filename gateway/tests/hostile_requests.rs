//! Requests that only look right (contract.md section 2): Content-Type is checked by its exact
//! media type, and HEAD is an unknown method on every route [R 1, 24].

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use reqwest::{Method, StatusCode};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_json_media_type_is_json() {
    let gw = Gateway::start_default().await;
    let body = text_request("hi").to_string();
    for content_type in [
        "application/jsonp",
        "application/json-seq",
        "application/jsonx; charset=utf-8",
        "application/vnd.api+json",
        "application/merge-patch+json",
        "application/json-patch+json",
    ] {
        let response = gw.submit_as(Some(content_type), body.clone()).await;
        assert_invalid_request(
            &json_parts(response).await,
            415,
            "Content-Type must be application/json",
        );
    }
    assert_eq!(gw.accepted_count().await, 0.0);
    for content_type in [
        "application/json",
        "application/json;charset=utf-8",
        "APPLICATION/JSON ; charset=UTF-8",
        " application/json",
    ] {
        let response = gw.submit_as(Some(content_type), body.clone()).await;
        assert_eq!(response.status(), StatusCode::ACCEPTED, "{content_type}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_is_not_found_on_every_route() {
    let gw = Gateway::start_default().await;
    let id = gw.submit_ok(&text_request("hi")).await;
    gw.wait_terminal(&id).await;
    for path in [
        "/v1/runtime".to_owned(),
        "/v1/providers".to_owned(),
        "/healthz".to_owned(),
        "/readyz".to_owned(),
        "/metrics".to_owned(),
        "/v1/executions".to_owned(),
        format!("/v1/executions/{id}"),
        format!("/v1/executions/{id}/result"),
        format!("/v1/executions/{id}/events"),
        "/no/such/route".to_owned(),
    ] {
        let response = gw
            .client
            .request(Method::HEAD, gw.url(&path))
            .send()
            .await
            .expect("sent");
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "HEAD {path}");
        assert_security_headers(response.headers());
        // GET still answers on the GET routes.
        if path != "/v1/executions" && path != "/no/such/route" {
            let get = gw.get(&path).await;
            assert_eq!(get.status(), StatusCode::OK, "GET {path}");
        }
    }
}
