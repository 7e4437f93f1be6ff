//! Wire shapes of the OpenAI Responses API that this adapter writes and reads: the content
//! parts of the input message of `POST /responses` (the message itself is the provider kit's
//! `openai_compat::UserMessage`), and the few streamed events it maps. Every other event and
//! field is ignored, so a new event type from the provider never breaks a stream.
//!
//! Events are first parsed as plain JSON and their `type` read from there; a typed struct is
//! decoded only for the event types mapped, so an unexpected shape in an event this adapter
//! does not use is never an error.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One part of the user message [R 63].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum InputContent<'a> {
    /// Text, and JSON parts serialized to text.
    InputText { text: Cow<'a, str> },
    /// An image by URL (https or `data:`), passed through unchanged.
    InputImage { image_url: &'a str },
    /// A file by URL, passed through unchanged.
    InputFile { file_url: &'a str },
}

/// `response.output_text.delta`.
#[derive(Debug, Clone, Deserialize)]
pub struct OutputTextDelta {
    /// Index of the output item in `response.output`; 0 when absent.
    #[serde(default)]
    pub output_index: Option<u32>,
    #[serde(default)]
    pub delta: String,
}

/// `response.output_item.added` whose `item.type` is `function_call`.
#[derive(Debug, Clone, Deserialize)]
pub struct FunctionCallItemAdded {
    pub item: FunctionCallItem,
}

/// A `function_call` output item: `id` names the item in later argument deltas, `call_id` is
/// the id the caller answers with.
#[derive(Debug, Clone, Deserialize)]
pub struct FunctionCallItem {
    #[serde(default)]
    pub id: Option<String>,
    pub call_id: String,
    pub name: String,
}

/// `response.function_call_arguments.delta`.
#[derive(Debug, Clone, Deserialize)]
pub struct FunctionCallArgumentsDelta {
    pub item_id: String,
    #[serde(default)]
    pub delta: String,
}

/// `response.completed`: only `response.usage` is read, and only its numeric fields.
#[derive(Debug, Clone, Deserialize)]
pub struct Completed {
    #[serde(default)]
    pub response: Option<CompletedResponse>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CompletedResponse {
    /// Kept as JSON: a missing or non-numeric counter is skipped, not an error [R 65].
    #[serde(default)]
    pub usage: Option<Value>,
}
