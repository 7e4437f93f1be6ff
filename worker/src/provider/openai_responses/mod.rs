//! The `openai-responses` adapter: OpenAI's Responses API, streamed [R 63-65, 68].
//!
//! One attempt is one `POST {base}/responses` with `stream: true` and `store: false`, read as
//! server-sent events until `response.completed`. The request body starts from the caller's
//! `extensions.openai.request` object; the runtime-owned fields (`model`, `input`, `stream`,
//! `store`) are then written over it, so an extension can tune sampling but never redirect the
//! model, the input or the streaming mode.
//!
//! The decision a reader must know: **capabilities come only from the deployment file** [R 68].
//! The manifest is what the operator declared (`capabilities.input_modalities`, `tools`), and
//! [`Provider::admits`] refuses, before any credential read or I/O, an extension that would
//! turn on tools the deployment did not enable. Everything after the provider accepted the
//! request (a 2xx answer) is non-retryable, because a new attempt would repeat work the
//! provider may already be doing.
//!
//! The pieces shared with the `openai-chat` adapter (credential source, manifest, extension
//! policy, the streaming transport loop) live here and are `pub(crate)`.

pub mod stream;
pub mod wire;

use std::borrow::Cow;

use async_trait::async_trait;
use protocol::manifest::{ModelCapability, ProviderLimits, ProviderManifest};
use protocol::request::{InputPart, Modality};
use protocol::{ErrorCode, ExecutionRequest, RuntimeError};
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use self::stream::{FrameMapper, ResponsesStream};
use super::http::{self, SseStream};
use super::secret::Secret;
use super::{Provider, ProviderCall, ProviderSink};
use crate::config::{BaseUrl, TextProviderConfig};

/// The `extensions` key this adapter reads: `extensions.openai.request` [R 63].
pub const EXTENSION_KEY: &str = "openai";

/// Extension fields that enable tools in the Responses API; refused unless the deployment
/// declared `capabilities.tools` [R 68].
pub const TOOL_FIELDS: &[&str] = &["tools", "tool_choice"];

pub use super::secret::KeySource;

/// See the module docs.
#[derive(Debug)]
pub struct OpenAiResponsesProvider {
    id: String,
    base_url: BaseUrl,
    key: KeySource,
    tools: bool,
    manifest: ProviderManifest,
}

impl OpenAiResponsesProvider {
    /// The adapter for a deployment entry, with its credential from `config.api_key_env`.
    pub fn from_config(config: &TextProviderConfig) -> Self {
        Self::new(config, KeySource::Env(config.api_key_env.clone()))
    }

    /// The adapter for a deployment entry with an explicit credential source (tests).
    pub fn new(config: &TextProviderConfig, key: KeySource) -> Self {
        Self {
            id: config.id.clone(),
            base_url: config.base_url.clone(),
            key,
            tools: config.tools,
            manifest: text_manifest(config),
        }
    }

    /// The request body: the extension's object, then the runtime-owned fields over it.
    fn body(&self, call: &ProviderCall<'_>) -> Result<Map<String, Value>, RuntimeError> {
        let content = call
            .request
            .input
            .iter()
            .map(input_content)
            .collect::<Result<Vec<_>, _>>()?;
        let input = vec![wire::InputMessage {
            role: "user",
            content,
        }];
        let mut body = extension_request(call.request, EXTENSION_KEY);
        body.insert("model".into(), Value::String(call.model.to_owned()));
        body.insert(
            "input".into(),
            serde_json::to_value(input).map_err(|_| RuntimeError::internal())?,
        );
        body.insert("stream".into(), Value::Bool(true));
        body.insert("store".into(), Value::Bool(false));
        Ok(body)
    }
}

/// Maps one input part [R 63]. Routing admits only the declared modalities, so the error arm
/// is a guard, not a path callers reach.
fn input_content(part: &InputPart) -> Result<wire::InputContent<'_>, RuntimeError> {
    Ok(match part {
        InputPart::Text { text } => wire::InputContent::InputText {
            text: Cow::Borrowed(text.as_str()),
        },
        InputPart::Json { value } => wire::InputContent::InputText {
            text: Cow::Owned(json_text(value)?),
        },
        InputPart::Image { uri, .. } => wire::InputContent::InputImage { image_url: uri },
        InputPart::File { uri, .. } => wire::InputContent::InputFile { file_url: uri },
        InputPart::Audio { .. } | InputPart::Video { .. } => {
            return Err(RuntimeError::capability_unavailable());
        }
    })
}

#[async_trait]
impl Provider for OpenAiResponsesProvider {
    fn id(&self) -> &str {
        &self.id
    }

    fn manifest(&self) -> &ProviderManifest {
        &self.manifest
    }

    fn admits(&self, request: &ExecutionRequest) -> bool {
        extension_admits(request, EXTENSION_KEY, TOOL_FIELDS, self.tools)
    }

    async fn execute(
        &self,
        call: ProviderCall<'_>,
        sink: &mut dyn ProviderSink,
    ) -> Result<(), RuntimeError> {
        let endpoint = endpoint(&self.base_url, "responses")?;
        let body = self.body(&call)?;
        let key = self.key.resolve()?;
        let request = json_post(endpoint, &key, &body)?;
        stream_attempt(request, &call.cancel, sink, &mut ResponsesStream::new()).await
    }
}

// ---------------------------------------------------------------------------------------------
// Shared with the openai-chat adapter.

/// The manifest of a text adapter: exactly the deployment's declaration [R 68].
pub(crate) fn text_manifest(config: &TextProviderConfig) -> ProviderManifest {
    ProviderManifest {
        provider: config.id.clone(),
        protocol_version: protocol::PROTOCOL_VERSION.into(),
        models: vec![ModelCapability {
            model: config.model.clone(),
            abilities: config.abilities.clone(),
            input_modalities: config.input_modalities.clone(),
            output_modalities: vec![Modality::Text],
            stream: true,
            tools: config.tools,
            structured_output: false,
            r#async: false,
            cancel: true,
        }],
        limits: Some(ProviderLimits {
            max_concurrency: config.flow.max_concurrency,
            max_queue_depth: config.flow.max_queue_depth,
        }),
    }
}

/// The extension policy: `extensions.<key>`, when present, must be an object; its `request`,
/// when present, must be an object; and unless `tools_enabled`, that object must not contain
/// any of `tool_fields` (whatever their value, `null` included).
pub(crate) fn extension_admits(
    request: &ExecutionRequest,
    key: &str,
    tool_fields: &[&str],
    tools_enabled: bool,
) -> bool {
    let Some(extension) = request.extensions.as_ref().and_then(|e| e.get(key)) else {
        return true;
    };
    let Value::Object(extension) = extension else {
        return false;
    };
    match extension.get("request") {
        None => true,
        Some(Value::Object(fields)) => {
            tools_enabled || !tool_fields.iter().any(|f| fields.contains_key(*f))
        }
        Some(_) => false,
    }
}

/// A copy of `extensions.<key>.request`, or an empty object.
pub(crate) fn extension_request(request: &ExecutionRequest, key: &str) -> Map<String, Value> {
    request
        .extensions
        .as_ref()
        .and_then(|e| e.get(key))
        .and_then(|e| e.get("request"))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

/// A JSON part as text: its compact serialization.
pub(crate) fn json_text(value: &Value) -> Result<String, RuntimeError> {
    serde_json::to_string(value).map_err(|_| RuntimeError::internal())
}

/// `{base}/{path}`. The path is a constant, so this cannot leave the base; the error arm is a
/// guard.
pub(crate) fn endpoint(base: &BaseUrl, path: &str) -> Result<url::Url, RuntimeError> {
    base.endpoint(path).ok_or_else(RuntimeError::internal)
}

/// A streaming JSON POST with a bearer credential. The header is marked sensitive so the HTTP
/// stack never prints it; a key that is not a valid header value is treated as unavailable
/// (without saying why, which could reveal part of it).
pub(crate) fn json_post(
    endpoint: url::Url,
    key: &Secret,
    body: &Map<String, Value>,
) -> Result<reqwest::RequestBuilder, RuntimeError> {
    let mut authorization =
        HeaderValue::try_from(format!("Bearer {}", key.expose())).map_err(|_| {
            RuntimeError::new(
                ErrorCode::ProviderUnavailable,
                "Required provider credential is unavailable",
                false,
            )
        })?;
    authorization.set_sensitive(true);
    let body = serde_json::to_vec(body).map_err(|_| RuntimeError::internal())?;
    Ok(http::client()?
        .post(endpoint)
        .header(AUTHORIZATION, authorization)
        .header(CONTENT_TYPE, "application/json")
        .header(ACCEPT, "text/event-stream")
        .body(body))
}

/// Sends `request` and feeds its event stream to `mapper`, reporting through `sink`, until the
/// mapper sees completion.
///
/// - A non-2xx answer is classified by [`http::send`] [R 61] (body discarded unread).
/// - After a 2xx, every failure is non-retryable (the provider accepted the request).
/// - End of stream before completion is `provider_protocol_error` "Provider stream ended
///   without a completion event" [R 33].
/// - Cancellation (the execution's cancel or deadline) is checked while waiting for the answer
///   and for every frame; it returns `cancelled` at once, and dropping the response closes the
///   connection.
/// - At completion the response is dropped unread: the attempt stops reading the provider
///   [R 33].
pub(crate) async fn stream_attempt(
    request: reqwest::RequestBuilder,
    cancel: &CancellationToken,
    sink: &mut dyn ProviderSink,
    mapper: &mut dyn FrameMapper,
) -> Result<(), RuntimeError> {
    let response = tokio::select! {
        biased;
        () = cancel.cancelled() => return Err(RuntimeError::cancelled()),
        response = http::send(request) => response?,
    };
    let mut frames = SseStream::new(response);
    loop {
        let frame = tokio::select! {
            biased;
            () = cancel.cancelled() => return Err(RuntimeError::cancelled()),
            frame = frames.next() => frame.map_err(RuntimeError::not_retryable)?,
        };
        let Some(frame) = frame else {
            return Err(RuntimeError::stream_ended_early());
        };
        let outcome = mapper.on_frame(&frame)?;
        for event in outcome.events {
            sink.emit(event).await?;
        }
        if outcome.completed {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FlowLimits;

    fn config(tools: bool) -> TextProviderConfig {
        TextProviderConfig {
            id: "openai".into(),
            model: "gpt-test".into(),
            abilities: vec!["text-generation".into()],
            api_key_env: "MRT_TEST_UNSET_OPENAI_KEY".into(),
            base_url: BaseUrl::parse("https://api.openai.com/v1").unwrap(),
            input_modalities: vec![Modality::Text, Modality::Json],
            tools,
            flow: FlowLimits::CONFIG_DEFAULT,
        }
    }

    fn request(extensions: &str) -> ExecutionRequest {
        let json = format!(
            r#"{{"ability":"text-generation","input":[{{"type":"text","text":"x"}}],"extensions":{extensions}}}"#
        );
        protocol::validate::parse_request(json.as_bytes()).unwrap()
    }

    #[test]
    fn the_manifest_is_the_declaration() {
        let p = OpenAiResponsesProvider::from_config(&config(true));
        let m = p.manifest();
        assert_eq!(m.provider, p.id());
        assert_eq!(m.models.len(), 1);
        let c = &m.models[0];
        assert_eq!(c.model, "gpt-test");
        assert_eq!(c.input_modalities, [Modality::Text, Modality::Json]);
        assert_eq!(c.output_modalities, [Modality::Text]);
        assert!(c.stream && c.tools && c.cancel && !c.structured_output && !c.r#async);
    }

    #[test]
    fn extensions_cannot_enable_undeclared_tools() {
        let off = OpenAiResponsesProvider::from_config(&config(false));
        let on = OpenAiResponsesProvider::from_config(&config(true));
        for refused in [
            r#"{"openai":{"request":{"tools":[]}}}"#,
            r#"{"openai":{"request":{"tool_choice":"auto"}}}"#,
            r#"{"openai":{"request":{"tools":null}}}"#,
        ] {
            assert!(!off.admits(&request(refused)), "{refused}");
            assert!(on.admits(&request(refused)), "{refused}");
        }
        for malformed in [
            r#"{"openai":{"request":[]}}"#,
            r#"{"openai":{"request":"x"}}"#,
            r#"{"openai":{"request":null}}"#,
            r#"{"openai":7}"#,
        ] {
            assert!(!off.admits(&request(malformed)), "{malformed}");
            assert!(!on.admits(&request(malformed)), "{malformed}");
        }
        for fine in [
            r#"{}"#,
            r#"{"openai":{}}"#,
            r#"{"openai":{"request":{"temperature":0.2}}}"#,
            r#"{"openai-chat":{"request":{"tools":[]}},"anthropic":{"request":{"tools":[]}}}"#,
        ] {
            assert!(off.admits(&request(fine)), "{fine}");
        }
    }

    #[test]
    fn runtime_fields_override_the_extension() {
        let p = OpenAiResponsesProvider::from_config(&config(false));
        let req = protocol::validate::parse_request(
            br#"{"ability":"text-generation","input":[{"type":"text","text":"hi"},{"type":"json","value":{"a":[1,null]}},{"type":"image","uri":"https://x.test/a.png"},{"type":"file","uri":"https://x.test/a.pdf","media_type":"application/pdf"}],
                "extensions":{"openai":{"request":{"model":"other","input":"x","stream":false,"store":true,"temperature":0.5}}}}"#,
        )
        .unwrap();
        let call = ProviderCall {
            request: &req,
            model: "gpt-test",
            cancel: CancellationToken::new(),
        };
        let body = Value::Object(p.body(&call).unwrap());
        assert_eq!(
            body,
            serde_json::json!({
                "model": "gpt-test",
                "temperature": 0.5,
                "stream": true,
                "store": false,
                "input": [{"role": "user", "content": [
                    {"type": "input_text", "text": "hi"},
                    {"type": "input_text", "text": "{\"a\":[1,null]}"},
                    {"type": "input_image", "image_url": "https://x.test/a.png"},
                    {"type": "input_file", "file_url": "https://x.test/a.pdf"}
                ]}]
            })
        );
    }

    #[test]
    fn key_sources() {
        let e = KeySource::Env("MRT_TEST_SURELY_UNSET_OPENAI_KEY".into())
            .resolve()
            .unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (
                ErrorCode::ProviderUnavailable,
                "Required provider credential is unavailable"
            )
        );
        let fixed = KeySource::Fixed(Secret::new("sk-CANARY-1"));
        assert!(!format!("{fixed:?}").contains("CANARY"));
        assert_eq!(fixed.resolve().unwrap().expose(), "sk-CANARY-1");
    }
}
