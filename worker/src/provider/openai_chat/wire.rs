//! Wire shapes of the OpenAI Chat Completions API (as spoken by OpenAI, vLLM, Ollama,
//! llama.cpp and most hosted gateways) that this adapter writes and reads: the user message of
//! `POST /chat/completions`, and the `chat.completion.chunk` objects of its stream.
//!
//! Only the fields mapped are declared; everything else in a chunk is ignored. Nullable fields
//! are `Option` because servers differ on whether they send `null` or omit a field.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One part of the user message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart<'a> {
    /// Text, and JSON parts serialized to text.
    Text { text: Cow<'a, str> },
    /// An image by URL (https or `data:`), passed through unchanged.
    ImageUrl { image_url: ImageUrl<'a> },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ImageUrl<'a> {
    pub url: &'a str,
}

/// `messages: [{role: "user", content: [...]}]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Message<'a> {
    pub role: &'static str,
    pub content: Vec<ContentPart<'a>>,
}

/// One `chat.completion.chunk`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Chunk {
    #[serde(default)]
    pub choices: Option<Vec<Choice>>,
    /// Present (non-null) on the usage chunk requested with `stream_options.include_usage`;
    /// kept as JSON so that missing or non-numeric counters are skipped, not errors.
    #[serde(default)]
    pub usage: Option<Value>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Choice {
    /// The choice's index (`n > 1` gives several); its position in `choices` when absent.
    #[serde(default)]
    pub index: Option<u32>,
    #[serde(default)]
    pub delta: Option<Delta>,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Delta {
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// A fragment of one tool call. The first fragment of a call carries `id` and `function.name`;
/// later ones only `index` and an `arguments` fragment.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ToolCallDelta {
    /// The call's position among the choice's tool calls; its position in `tool_calls` when
    /// absent (some servers omit it and send each call whole).
    #[serde(default)]
    pub index: Option<u32>,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub function: Option<FunctionDelta>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct FunctionDelta {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub arguments: Option<String>,
}
