//! The Anthropic Messages API on the wire: the request body this adapter sends and the payloads
//! of the streamed events it reads (Messages API, `anthropic-version: 2023-06-01`).
//!
//! The one decision a reader must know: the caller's `extensions.anthropic.request` object is
//! the base of the body, and the runtime-owned fields (`model`, `messages`, `stream`) are then
//! written over it, so a caller can tune generation (`system`, `temperature`, ...) but never
//! redirect the model, inject conversation turns or turn streaming off.

use protocol::request::InputPart;
use protocol::{ErrorCode, ExecutionRequest, RuntimeError};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::provider::extension;

/// The API version header value the mapping in `stream.rs` is written against.
pub const API_VERSION: &str = "2023-06-01";
/// Path of the Messages endpoint below the base URL.
pub const MESSAGES_PATH: &str = "v1/messages";
/// `max_tokens` sent when the extension does not set a positive integer (the reference's value).
pub const DEFAULT_MAX_TOKENS: u64 = 1024;
/// The extension key under `extensions`.
pub const EXTENSION: &str = providers::text::ANTHROPIC_MESSAGES.extension_key;

/// One content block of the user message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock<'a> {
    Text { text: std::borrow::Cow<'a, str> },
    Image { source: ImageSource<'a> },
}

/// Where an image comes from: always by URL (the runtime never fetches media).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ImageSource<'a> {
    Url { url: &'a str },
}

/// Maps one input part: text as is, JSON as its compact text, images by URL. Other media are
/// never routed here (the manifest does not declare them); they fail as
/// `capability_unavailable` rather than being dropped silently.
pub fn content_block(part: &InputPart) -> Result<ContentBlock<'_>, RuntimeError> {
    match part {
        InputPart::Text { text } => Ok(ContentBlock::Text { text: text.into() }),
        InputPart::Json { value } => Ok(ContentBlock::Text {
            text: value.compact().into(),
        }),
        InputPart::Image { uri, .. } => Ok(ContentBlock::Image {
            source: ImageSource::Url { url: uri },
        }),
        InputPart::Audio { .. } | InputPart::Video { .. } | InputPart::File { .. } => {
            Err(RuntimeError::capability_unavailable())
        }
    }
}

/// `{...extensions.anthropic.request, model, max_tokens, messages:[{role:"user",content}],
/// stream:true}`. `max_tokens` from the extension is kept when it is a positive integer,
/// otherwise [`DEFAULT_MAX_TOKENS`]. A non-object extension is treated as absent (routing
/// refuses such requests before they reach the adapter).
pub fn request_body(request: &ExecutionRequest, model: &str) -> Result<String, RuntimeError> {
    let max_tokens = extension::object(request, EXTENSION, "request")
        .ok()
        .flatten()
        .and_then(|fields| protocol::json::member(fields, "max_tokens").ok().flatten())
        .and_then(|n| serde_json::from_str::<serde_json::Number>(n.get()).ok())
        .and_then(|n| n.as_u64())
        .filter(|n| *n > 0)
        .unwrap_or(DEFAULT_MAX_TOKENS);
    let content = request
        .input
        .iter()
        .map(content_block)
        .collect::<Result<Vec<_>, _>>()?;
    let messages = [Message {
        role: "user",
        content,
    }];
    extension::body_over(
        request,
        EXTENSION,
        "request",
        &[],
        &[
            ("model", &extension::to_json(model)?),
            ("max_tokens", &max_tokens.to_string()),
            ("messages", &extension::to_json(&messages)?),
            ("stream", "true"),
        ],
    )
}

/// The one user message of a request body.
#[derive(Debug, Serialize)]
struct Message<'a> {
    role: &'static str,
    content: Vec<ContentBlock<'a>>,
}

/// `message_start`: the message shell with the initial usage (input tokens, cache tokens).
#[derive(Debug, Clone, Deserialize)]
pub struct MessageStart {
    pub message: MessageShell,
}

#[derive(Debug, Clone, Deserialize)]
pub struct MessageShell {
    #[serde(default)]
    pub usage: Option<Map<String, Value>>,
}

/// `content_block_start`: a block at `index` begins.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentBlockStart {
    pub index: u32,
    pub content_block: StartedBlock,
}

/// The block being started: `text`, `tool_use` (with `id` and `name`), `thinking`,
/// `server_tool_use`, ...
#[derive(Debug, Clone, Deserialize)]
pub struct StartedBlock {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    /// A `tool_use` block's input as the start states it: `{}` from Anthropic, whose input
    /// follows in `input_json_delta` fragments; the whole input from servers that send none.
    #[serde(default)]
    pub input: Option<Value>,
}

/// `content_block_stop`: the block at `index` is complete.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentBlockStop {
    pub index: u32,
}

/// `content_block_delta`: a fragment for the block at `index`.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentBlockDelta {
    pub index: u32,
    pub delta: BlockDelta,
}

/// `text_delta` carries `text`; `input_json_delta` carries `partial_json`; other kinds
/// (`thinking_delta`, `signature_delta`, `citations_delta`) are not mapped.
#[derive(Debug, Clone, Deserialize)]
pub struct BlockDelta {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub partial_json: Option<String>,
}

/// `message_delta`: stop reason and the cumulative usage so far.
#[derive(Debug, Clone, Deserialize)]
pub struct MessageDelta {
    #[serde(default)]
    pub usage: Option<Map<String, Value>>,
}

/// `error`: `{"type":"error","error":{"type":"overloaded_error","message":"..."}}`. Only the
/// type is read; the message is provider text and never reaches an event.
#[derive(Debug, Clone, Deserialize)]
pub struct StreamError {
    #[serde(default)]
    pub error: Option<StreamErrorBody>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct StreamErrorBody {
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
}

/// A known event whose payload does not have the documented shape.
pub fn unexpected_event() -> RuntimeError {
    RuntimeError::new(
        ErrorCode::ProviderProtocolError,
        "Provider sent an event with an unexpected shape",
        false,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(value: Value) -> ExecutionRequest {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn body_spreads_the_extension_and_owns_model_messages_and_stream() {
        let req = request(json!({
            "ability": "text-generation",
            "input": [
                {"type": "text", "text": "Describe"},
                {"type": "json", "value": {"a": [1, null]}},
                {"type": "image", "uri": "https://img.example/cat.png", "media_type": "image/png"}
            ],
            "extensions": {"anthropic": {"request": {
                "system": "be brief", "temperature": 0.2,
                "model": "other", "stream": false, "messages": [{"role": "assistant"}]
            }}}
        }));
        let body: Value = serde_json::from_str(&request_body(&req, "claude-x").unwrap()).unwrap();
        assert_eq!(
            body,
            json!({
                "system": "be brief",
                "temperature": 0.2,
                "model": "claude-x",
                "max_tokens": 1024,
                "stream": true,
                "messages": [{"role": "user", "content": [
                    {"type": "text", "text": "Describe"},
                    {"type": "text", "text": "{\"a\":[1,null]}"},
                    {"type": "image", "source": {"type": "url", "url": "https://img.example/cat.png"}}
                ]}]
            })
        );
    }

    #[test]
    fn max_tokens_is_kept_only_when_a_positive_integer() {
        for (given, sent) in [
            (json!(4096), 4096),
            (json!(0), 1024),
            (json!(-5), 1024),
            (json!(1.5), 1024),
            (json!("2048"), 1024),
            (Value::Null, 1024),
        ] {
            let req = request(json!({
                "ability": "a", "input": [{"type": "text", "text": "x"}],
                "extensions": {"anthropic": {"request": {"max_tokens": given}}}
            }));
            let body: Value = serde_json::from_str(&request_body(&req, "m").unwrap()).unwrap();
            assert_eq!(body["max_tokens"], json!(sent));
        }
    }

    #[test]
    fn unsupported_media_is_capability_unavailable() {
        let part = InputPart::Audio {
            uri: "https://a.example/x.wav".into(),
            media_type: None,
        };
        assert_eq!(
            content_block(&part).unwrap_err().code,
            ErrorCode::CapabilityUnavailable
        );
    }
}
