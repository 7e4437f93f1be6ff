//! The `openai-chat` adapter: the Chat Completions API, streamed. Beyond the reference: it is
//! the dialect of vLLM, Ollama, llama.cpp's server and most hosted gateways, so one adapter
//! reaches them all.
//!
//! One attempt is one `POST {base}/chat/completions` (the deployment must give `base_url`)
//! with `stream: true` and `stream_options.include_usage: true`, read until `data: [DONE]`.
//! The body starts from the caller's `extensions["openai-chat"].request` object (the key is the
//! provider type name); the runtime-owned fields `model`, `messages`, `stream` and
//! `stream_options` are written over it.
//!
//! Section, capabilities, credentials, extension policy and the frame loop come from the
//! provider kit, as for `openai-responses` (see its module docs): the manifest is the
//! deployment's declaration, and an extension that would enable tools (`tools`, `tool_choice`, or the legacy
//! `functions`, `function_call`) is refused unless the deployment enabled them.

pub mod stream;
pub mod wire;

use std::borrow::Cow;

use protocol::RuntimeError;
use protocol::request::InputPart;

use self::stream::ChatStream;
use super::openai_compat::{OpenAiCompatible, OpenAiDialect};
use super::text::{TextKind, json_text};

/// The `extensions` key this adapter reads: `extensions["openai-chat"].request`.
pub const EXTENSION_KEY: &str = providers::text::OPENAI_CHAT.extension_key;

/// Extension fields that enable tools in Chat Completions, including the legacy function
/// calling fields; refused unless the deployment declared `capabilities.tools`.
pub const TOOL_FIELDS: &[&str] = providers::text::OPENAI_CHAT.tool_fields;

/// See the module docs.
pub type OpenAiChatProvider = OpenAiCompatible<ChatCompletions>;

/// The Chat Completions dialect of [`OpenAiCompatible`].
#[derive(Debug)]
pub enum ChatCompletions {}

impl OpenAiDialect for ChatCompletions {
    const KIND: TextKind = providers::text::OPENAI_CHAT;
    const PATH: &'static str = "chat/completions";
    const MESSAGES_FIELD: &'static str = "messages";
    const OWNED_FIELD: (&'static str, &'static str) =
        ("stream_options", r#"{"include_usage":true}"#);
    type Mapper = ChatStream;
    type Part<'a> = wire::ContentPart<'a>;

    /// The deployment file allows text, json and image here.
    fn part(part: &InputPart) -> Result<wire::ContentPart<'_>, RuntimeError> {
        Ok(match part {
            InputPart::Text { text } => wire::ContentPart::Text {
                text: Cow::Borrowed(text.as_str()),
            },
            InputPart::Json { value } => wire::ContentPart::Text {
                text: Cow::Owned(json_text(value)?),
            },
            InputPart::Image { uri, .. } => wire::ContentPart::ImageUrl {
                image_url: wire::ImageUrl { url: uri },
            },
            InputPart::File { .. } | InputPart::Audio { .. } | InputPart::Video { .. } => {
                return Err(RuntimeError::capability_unavailable());
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::Provider;
    use crate::provider::openai_compat::test_kit::{body_json, text_config};
    use crate::provider::text::TextProviderConfig;
    use protocol::ExecutionRequest;
    use protocol::request::Modality;

    fn config(tools: bool) -> TextProviderConfig {
        text_config(
            "openai-chat",
            "llama-3.1-8b",
            "http://127.0.0.1:8000/v1",
            &[Modality::Text, Modality::Json, Modality::Image],
            tools,
        )
    }

    fn request(json: &str) -> ExecutionRequest {
        protocol::validate::parse_request(json.as_bytes()).unwrap()
    }

    #[test]
    fn extensions_cannot_enable_undeclared_tools() {
        let off = OpenAiChatProvider::from_config(&config(false));
        let on = OpenAiChatProvider::from_config(&config(true));
        for field in TOOL_FIELDS {
            let req = request(&format!(
                r#"{{"ability":"text-generation","input":[{{"type":"text","text":"x"}}],"extensions":{{"openai-chat":{{"request":{{"{field}":[]}}}}}}}}"#
            ));
            assert!(!off.admits(&req), "{field}");
            assert!(on.admits(&req), "{field}");
        }
        let other_key = request(
            r#"{"ability":"text-generation","input":[{"type":"text","text":"x"}],"extensions":{"openai":{"request":{"tools":[]}}}}"#,
        );
        assert!(off.admits(&other_key));
        let not_object = request(
            r#"{"ability":"text-generation","input":[{"type":"text","text":"x"}],"extensions":{"openai-chat":{"request":"tools"}}}"#,
        );
        assert!(!on.admits(&not_object));
    }

    #[test]
    fn runtime_fields_override_the_extension() {
        let p = OpenAiChatProvider::from_config(&config(false));
        assert_eq!(
            body_json(
                &p,
                r#"{"ability":"text-generation","input":[{"type":"text","text":"hi"},{"type":"json","value":[true]},{"type":"image","uri":"data:image/png;base64,AAAA"}],
                "extensions":{"openai-chat":{"request":{"model":"x","messages":[],"stream":false,"stream_options":{"include_usage":false,"continuous_usage_stats":true},"max_tokens":64}}}}"#,
                "llama-3.1-8b",
            ),
            serde_json::json!({
                "model": "llama-3.1-8b",
                "max_tokens": 64,
                "stream": true,
                "stream_options": {"include_usage": true},
                "messages": [{"role": "user", "content": [
                    {"type": "text", "text": "hi"},
                    {"type": "text", "text": "[true]"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
                ]}]
            })
        );
    }
}
