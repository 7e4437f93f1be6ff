//! Wire shapes of the OpenAI Chat Completions API (as spoken by OpenAI, vLLM, Ollama,
//! llama.cpp and most hosted gateways) that this adapter writes and reads: the content parts of
//! the user message of `POST /chat/completions` (the message itself is the provider kit's
//! `openai_compat::UserMessage`), and the `chat.completion.chunk` objects of its stream.
//!
//! Only the fields mapped are declared; everything else in a chunk is ignored. Nullable fields
//! are `Option` because servers differ on whether they send `null` or omit a field; every
//! chunk struct is `#[serde(default)]`, so an omitted field is `None`.

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

/// One `chat.completion.chunk`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Chunk {
    pub choices: Option<Vec<Choice>>,
    /// Present (non-null) on the usage chunk requested with `stream_options.include_usage`;
    /// kept as JSON so that missing or non-numeric counters are skipped, not errors.
    pub usage: Option<Value>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Choice {
    /// The choice's index (`n > 1` gives several); its position in `choices` when absent.
    pub index: Option<u32>,
    pub delta: Option<Delta>,
    pub finish_reason: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Delta {
    pub content: Option<String>,
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// A fragment of one tool call. The first fragment of a call carries `id` and `function.name`;
/// later ones only `index` and an `arguments` fragment.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ToolCallDelta {
    /// The call's position among the choice's tool calls; its position in `tool_calls` when
    /// absent (some servers omit it and send each call whole).
    pub index: Option<u32>,
    pub id: Option<String>,
    pub function: Option<FunctionDelta>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct FunctionDelta {
    pub name: Option<String>,
    pub arguments: Option<String>,
}
