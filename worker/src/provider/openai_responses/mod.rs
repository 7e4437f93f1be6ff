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
//! The pieces shared with the other text adapters (section, manifest, extension policy,
//! credential, frame loop) live in the provider kit beside `http.rs`.

pub mod stream;
pub mod wire;

use std::borrow::Cow;

use protocol::RuntimeError;
use protocol::request::InputPart;

use self::stream::ResponsesStream;
use super::openai_compat::{OpenAiCompatible, OpenAiDialect};
use super::text::{TextKind, json_text};

/// The `extensions` key this adapter reads: `extensions.openai.request` [R 63].
pub const EXTENSION_KEY: &str = providers::text::OPENAI_RESPONSES.extension_key;

/// Extension fields that enable tools in the Responses API; refused unless the deployment
/// declared `capabilities.tools` [R 68].
pub const TOOL_FIELDS: &[&str] = providers::text::OPENAI_RESPONSES.tool_fields;

/// See the module docs.
pub type OpenAiResponsesProvider = OpenAiCompatible<Responses>;

/// The Responses API dialect of [`OpenAiCompatible`].
#[derive(Debug)]
pub enum Responses {}

impl OpenAiDialect for Responses {
    const KIND: TextKind = providers::text::OPENAI_RESPONSES;
    const PATH: &'static str = "responses";
    const MESSAGES_FIELD: &'static str = "input";
    const OWNED_FIELD: (&'static str, &'static str) = ("store", "false");
    type Mapper = ResponsesStream;
    type Part<'a> = wire::InputContent<'a>;

    /// [R 63].
    fn part(part: &InputPart) -> Result<wire::InputContent<'_>, RuntimeError> {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::Provider;
    use crate::provider::credential::{KeySource, Secret};
    use crate::provider::openai_compat::test_kit::{body_json, text_config};
    use crate::provider::text::TextProviderConfig;
    use protocol::ErrorCode;
    use protocol::ExecutionRequest;
    use protocol::request::Modality;

    fn config(tools: bool) -> TextProviderConfig {
        text_config(
            "openai",
            "gpt-test",
            "https://api.openai.com/v1",
            &[Modality::Text, Modality::Json],
            tools,
        )
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
        let body = body_json(
            &p,
            r#"{"ability":"text-generation","input":[{"type":"text","text":"hi"},{"type":"json","value":{"a":[1,null]}},{"type":"image","uri":"https://x.test/a.png"},{"type":"file","uri":"https://x.test/a.pdf","media_type":"application/pdf"}],
                "extensions":{"openai":{"request":{"model":"other","input":"x","stream":false,"store":true,"temperature":0.5}}}}"#,
            "gpt-test",
        );
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
