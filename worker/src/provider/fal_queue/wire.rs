//! The fal queue API on the wire: the submit body, the submit answer with its lifecycle URLs,
//! and the status document.
//!
//! The one decision a reader must know: lifecycle URLs come from the provider, and every one
//! of them receives the credential. Each must therefore be a safe URL (https, or http on
//! loopback; no user info, query or fragment) on exactly the configured base URL's origin,
//! otherwise the attempt fails with `provider_protocol_error` and the URL is never requested.

use protocol::request::InputPart;
use protocol::{ExecutionRequest, RuntimeError};
use serde_json::Value;
use url::Url;

use config::BaseUrl;

use crate::provider::extension;
use crate::provider::http::protocol_error;

/// The extension key under `extensions`.
pub use providers::fal::EXTENSION;
/// Body fields the runtime owns: whatever the extension says about them is replaced.
pub const OWNED_FIELDS: [&str; 3] = ["prompt", "image_url", "image_urls"];

/// `{...extensions.fal.input, prompt, image_url | image_urls}`.
///
/// - `prompt`: text parts and compact JSON parts in input order joined by `"\n"`; omitted when
///   the request has no text or JSON part.
/// - one image part gives `image_url`, several give `image_urls` (in input order).
/// - the extension's own `prompt`, `image_url` and `image_urls` are always dropped first.
pub fn submit_body(request: &ExecutionRequest) -> Result<String, RuntimeError> {
    let mut prompt: Vec<String> = Vec::new();
    let mut images: Vec<&str> = Vec::new();
    for part in &request.input {
        match part {
            InputPart::Text { text } => prompt.push(text.clone()),
            InputPart::Json { value } => prompt.push(value.compact()),
            InputPart::Image { uri, .. } => images.push(uri),
            // Never routed here: the manifest declares at most text, json and image.
            InputPart::Audio { .. } | InputPart::Video { .. } | InputPart::File { .. } => {}
        }
    }
    let prompt = if prompt.is_empty() {
        None
    } else {
        Some(extension::to_json(&prompt.join("\n"))?)
    };
    let images = match images.as_slice() {
        [] => None,
        [one] => Some(("image_url", extension::to_json(one)?)),
        several => Some(("image_urls", extension::to_json(several)?)),
    };
    let owned: Vec<(&str, &str)> = prompt
        .as_deref()
        .map(|p| ("prompt", p))
        .into_iter()
        .chain(images.as_ref().map(|(k, v)| (*k, v.as_str())))
        .collect();
    extension::body_over(request, EXTENSION, "input", &OWNED_FIELDS, &owned)
}

/// `submit[field]` as a safe URL on `base`'s origin, else `provider_protocol_error`.
pub fn lifecycle_url(submit: &Value, field: &str, base: &BaseUrl) -> Result<Url, RuntimeError> {
    let Some(text) = submit.get(field).and_then(Value::as_str) else {
        return Err(protocol_error("Provider response omitted a lifecycle URL"));
    };
    // BaseUrl::parse applies the scheme, host and credential rules; the URL itself is kept
    // exactly as sent (BaseUrl normalizes trailing slashes away).
    let url = Url::parse(text)
        .ok()
        .filter(|_| BaseUrl::parse(text).is_ok());
    match url {
        Some(url) if url.origin() == base.url().origin() => Ok(url),
        Some(_) => Err(protocol_error(
            "Provider lifecycle URL leaves the configured origin",
        )),
        None => Err(protocol_error("Provider returned an unsafe lifecycle URL")),
    }
}

/// A status document's meaning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueStatus {
    InQueue,
    InProgress,
    Completed,
    /// `COMPLETED` with an `error`; `error_type` when it is a well-formed code.
    Failed {
        error_type: Option<String>,
    },
    /// Missing, not a string, or not one of the above.
    Unknown,
}

/// Reads `{"status": "IN_QUEUE" | "IN_PROGRESS" | "COMPLETED", "error"?, "error_type"?, ...}`.
/// `logs`, `queue_position` and `metrics` are not read: logs are provider text.
pub fn queue_status(document: &Value) -> QueueStatus {
    match document.get("status").and_then(Value::as_str) {
        Some("IN_QUEUE") => QueueStatus::InQueue,
        Some("IN_PROGRESS") => QueueStatus::InProgress,
        Some("COMPLETED") if is_error(document.get("error")) => QueueStatus::Failed {
            error_type: document
                .get("error_type")
                .and_then(Value::as_str)
                .filter(|code| is_code(code))
                .map(str::to_owned),
        },
        Some("COMPLETED") => QueueStatus::Completed,
        _ => QueueStatus::Unknown,
    }
}

/// An `error` counts when it says something: not absent, null, false, 0 or "".
fn is_error(error: Option<&Value>) -> bool {
    match error {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        Some(Value::Array(_)) | Some(Value::Object(_)) | Some(Value::Bool(true)) => true,
    }
}

/// Provider codes are short identifiers (`runner_disconnected`, `internal_error`); free text is
/// never kept.
fn is_code(code: &str) -> bool {
    (1..=64).contains(&code.len())
        && code
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::ErrorCode;
    use serde_json::json;

    fn request(value: Value) -> ExecutionRequest {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn body_owns_prompt_and_images() {
        let req = request(json!({
            "ability": "image-generation",
            "input": [
                {"type": "text", "text": "a cat"},
                {"type": "image", "uri": "https://img.example/1.png"},
                {"type": "json", "value": {"style": "ink"}}
            ],
            "extensions": {"fal": {"input": {
                "num_images": 2, "prompt": "ignored", "image_urls": ["https://evil.example/x"]
            }}}
        }));
        assert_eq!(
            serde_json::from_str::<Value>(&submit_body(&req).unwrap()).unwrap(),
            json!({
                "num_images": 2,
                "prompt": "a cat\n{\"style\":\"ink\"}",
                "image_url": "https://img.example/1.png"
            })
        );
        let req = request(json!({
            "ability": "image-generation",
            "input": [
                {"type": "image", "uri": "https://img.example/1.png"},
                {"type": "image", "uri": "https://img.example/2.png"}
            ],
            "extensions": {"fal": {"input": {"prompt": "ignored", "image_url": "x"}}}
        }));
        assert_eq!(
            serde_json::from_str::<Value>(&submit_body(&req).unwrap()).unwrap(),
            json!({"image_urls": ["https://img.example/1.png", "https://img.example/2.png"]})
        );
    }

    #[test]
    fn lifecycle_urls_must_be_safe_and_same_origin() {
        let base = BaseUrl::parse("https://queue.fal.run").unwrap();
        let ok = json!({"status_url": "https://queue.fal.run/fal-ai/flux/requests/r1/status"});
        assert_eq!(
            lifecycle_url(&ok, "status_url", &base).unwrap().as_str(),
            "https://queue.fal.run/fal-ai/flux/requests/r1/status"
        );
        for bad in [
            json!({}),
            json!({"status_url": 7}),
            json!({"status_url": "/relative"}),
            json!({"status_url": "https://evil.example/fal-ai/requests/r1/status"}),
            json!({"status_url": "http://queue.fal.run/requests/r1/status"}),
            json!({"status_url": "https://queue.fal.run:8443/requests/r1/status"}),
            json!({"status_url": "https://user:pw@queue.fal.run/requests/r1/status"}),
            json!({"status_url": "https://queue.fal.run/requests/r1/status?x=1"}),
            json!({"status_url": "https://queue.fal.run/requests/r1/status#f"}),
        ] {
            let error = lifecycle_url(&bad, "status_url", &base).unwrap_err();
            assert_eq!(error.code, ErrorCode::ProviderProtocolError, "{bad}");
            assert!(!error.retryable);
        }
    }

    #[test]
    fn statuses() {
        assert_eq!(
            queue_status(&json!({"status": "IN_QUEUE", "queue_position": 3})),
            QueueStatus::InQueue
        );
        assert_eq!(
            queue_status(&json!({"status": "IN_PROGRESS", "logs": [{"message": "step 1"}]})),
            QueueStatus::InProgress
        );
        assert_eq!(
            queue_status(&json!({"status": "COMPLETED", "error": null})),
            QueueStatus::Completed
        );
        assert_eq!(
            queue_status(
                &json!({"status": "COMPLETED", "error": "boom", "error_type": "runner_disconnected"})
            ),
            QueueStatus::Failed {
                error_type: Some("runner_disconnected".into())
            }
        );
        assert_eq!(
            queue_status(
                &json!({"status": "COMPLETED", "error": {"x": 1}, "error_type": "has space"})
            ),
            QueueStatus::Failed { error_type: None }
        );
        for unknown in [
            json!({"status": "CANCELLED"}),
            json!({"status": 1}),
            json!({}),
            json!([]),
        ] {
            assert_eq!(queue_status(&unknown), QueueStatus::Unknown, "{unknown}");
        }
    }
}
