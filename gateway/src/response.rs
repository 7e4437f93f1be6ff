//! JSON response construction (error responses of both APIs included) and the headers every
//! response carries.

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use serde::Serialize;

/// `application/json; charset=utf-8`.
pub const JSON: HeaderValue = HeaderValue::from_static("application/json; charset=utf-8");

/// A JSON response. Serialization of our response types cannot fail; if it ever did, the client
/// gets a generic 500 rather than a partial body.
pub fn json_response<T: Serialize>(status: StatusCode, body: &T) -> Response {
    let (status, bytes) = match serde_json::to_vec(body) {
        Ok(bytes) => (status, bytes),
        Err(e) => {
            tracing::error!(error = %e, "response serialization failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                br#"{"error":{"code":"internal_error","message":"Runtime request could not be completed","retryable":false}}"#
                    .to_vec(),
            )
        }
    };
    let mut response = Response::new(Body::from(bytes));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, JSON);
    response
}

/// An error response in either API's shape (`body`): `Retry-After` when the refusal says when
/// to come back, and `WWW-Authenticate: Bearer` on a 401.
pub fn error_response<T: Serialize>(
    status: StatusCode,
    body: &T,
    retry_after_secs: Option<u64>,
) -> Response {
    let mut response = json_response(status, body);
    if let Some(secs) = retry_after_secs {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    if status == StatusCode::UNAUTHORIZED {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

/// Adds `cache-control: no-store` and `x-content-type-options: nosniff` to every response.
pub async fn security_headers(response: Response) -> Response {
    let mut response = response;
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}
