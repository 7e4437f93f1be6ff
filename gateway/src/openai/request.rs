//! Parsing of the OpenAI request bodies (`POST /v1/responses`, `POST /v1/chat/completions`)
//! into an [`Intent`] and the route's own flags.
//!
//! The one decision a reader must know: bodies are read leniently, as OpenAI-compatible
//! servers do (fields this runtime has no use for, such as `store`, `user`,
//! `parallel_tool_calls`, are accepted and ignored), except the features contract.md section
//! 10 refuses, which are answered 400 naming the field. Errors name fields by fixed names only.

use serde_json::{Map, Value};

use super::error::OpenAiError;
use super::translate::{FunctionTool, Intent, Part, ToolChoice};

/// `POST /v1/responses`, parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponsesRequest {
    pub model: String,
    pub intent: Intent,
    pub stream: bool,
    pub background: bool,
}

/// `POST /v1/chat/completions`, parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub model: String,
    pub intent: Intent,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the usage.
    pub include_usage: bool,
}

/// What the shared submission flow reads of either create body.
pub trait CreateRequest: Sized + Send + 'static {
    /// The body parsed ([`responses`], [`chat`]).
    fn parse(bytes: &[u8]) -> Result<Self, OpenAiError>;
    /// The model asked for, the intent and whether the answer streams.
    fn plan(&self) -> (&str, &Intent, bool);
}

impl CreateRequest for ResponsesRequest {
    fn parse(bytes: &[u8]) -> Result<Self, OpenAiError> {
        responses(bytes)
    }
    fn plan(&self) -> (&str, &Intent, bool) {
        (&self.model, &self.intent, self.stream)
    }
}

impl CreateRequest for ChatRequest {
    fn parse(bytes: &[u8]) -> Result<Self, OpenAiError> {
        chat(bytes)
    }
    fn plan(&self) -> (&str, &Intent, bool) {
        (&self.model, &self.intent, self.stream)
    }
}

/// A JSON object body, or 400. A lone surrogate escape reads as U+FFFD, as in native bodies
/// (`protocol::json::replace_lone_surrogates`).
fn object(bytes: &[u8]) -> Result<Map<String, Value>, OpenAiError> {
    let bytes = protocol::json::replace_lone_surrogates(bytes);
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(map)) => Ok(map),
        _ => Err(OpenAiError::invalid(
            "body",
            "The request body must be a JSON object",
        )),
    }
}

/// Fields that must be absent (or `null`): features this runtime does not offer.
fn refuse(body: &Map<String, Value>, fields: &[&'static str]) -> Result<(), OpenAiError> {
    for field in fields {
        if body.get(*field).is_some_and(|v| !v.is_null()) {
            return Err(OpenAiError::unsupported(field));
        }
    }
    Ok(())
}

fn model(body: &Map<String, Value>) -> Result<String, OpenAiError> {
    match body.get("model") {
        Some(Value::String(m)) if !m.is_empty() => Ok(m.clone()),
        _ => Err(OpenAiError::invalid("model", "A model is required")),
    }
}

fn flag(body: &Map<String, Value>, field: &'static str) -> Result<bool, OpenAiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(OpenAiError::invalid(field, "Must be a boolean")),
    }
}

fn number(
    body: &Map<String, Value>,
    field: &'static str,
    max: f64,
) -> Result<Option<f64>, OpenAiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(x) if (0.0..=max).contains(&x) => Ok(Some(x)),
            _ => Err(OpenAiError::invalid(field, "Number out of range")),
        },
        Some(_) => Err(OpenAiError::invalid(field, "Must be a number")),
    }
}

fn positive(body: &Map<String, Value>, field: &'static str) -> Result<Option<u64>, OpenAiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n > 0 => Ok(Some(n)),
            _ => Err(OpenAiError::invalid(field, "Must be a positive integer")),
        },
    }
}

fn metadata(body: &Map<String, Value>) -> Result<Option<Map<String, Value>>, OpenAiError> {
    const BAD: &str = "Metadata must map at most 16 keys to strings";
    match body.get("metadata") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) if m.len() <= 16 && m.values().all(Value::is_string) => {
            Ok(Some(m.clone()))
        }
        Some(_) => Err(OpenAiError::invalid("metadata", BAD)),
    }
}

fn string(v: Option<&Value>) -> Option<String> {
    v.and_then(Value::as_str).map(str::to_owned)
}

/// `tools` (function tools only; `chat` nests each under `function`) and `tool_choice`.
fn tools(
    body: &Map<String, Value>,
    chat: bool,
) -> Result<(Vec<FunctionTool>, Option<ToolChoice>), OpenAiError> {
    const BAD_TOOL: &str = "Each tool must be a function with a name";
    let mut out = Vec::new();
    match body.get("tools") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            for item in items {
                let kind = item.get("type").and_then(Value::as_str);
                if kind != Some("function") {
                    return Err(OpenAiError::unsupported("tools"));
                }
                let f = if chat {
                    item.get("function")
                } else {
                    Some(item)
                };
                let Some(f) = f.filter(|f| f.is_object()) else {
                    return Err(OpenAiError::invalid("tools", BAD_TOOL));
                };
                let Some(name) = string(f.get("name")).filter(|n| !n.is_empty()) else {
                    return Err(OpenAiError::invalid("tools", BAD_TOOL));
                };
                out.push(FunctionTool {
                    name,
                    description: string(f.get("description")),
                    parameters: f.get("parameters").filter(|p| !p.is_null()).cloned(),
                    strict: f.get("strict").and_then(Value::as_bool),
                });
            }
        }
        Some(_) => return Err(OpenAiError::invalid("tools", "Tools must be an array")),
    }
    let choice = match body.get("tool_choice") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            _ => return Err(OpenAiError::invalid("tool_choice", "Unknown tool choice")),
        }),
        Some(Value::Object(c)) if c.get("type").and_then(Value::as_str) == Some("function") => {
            let name = if chat {
                c.get("function").and_then(|f| f.get("name"))
            } else {
                c.get("name")
            };
            match string(name) {
                Some(name) => Some(ToolChoice::Function(name)),
                None => return Err(OpenAiError::invalid("tool_choice", "Unknown tool choice")),
            }
        }
        Some(_) => return Err(OpenAiError::unsupported("tool_choice")),
    };
    Ok((out, choice))
}

/// One content part of a message (Responses or Chat spelling) as input parts.
fn content_part(
    part: &Value,
    parts: &mut Vec<Part>,
    param: &'static str,
) -> Result<(), OpenAiError> {
    const BAD: &str = "Unsupported content part";
    let kind = part.get("type").and_then(Value::as_str).unwrap_or_default();
    match kind {
        "input_text" | "output_text" | "text" | "refusal" => {
            let text = part
                .get("text")
                .or_else(|| part.get("refusal"))
                .and_then(Value::as_str)
                .ok_or(OpenAiError::invalid(param, BAD))?;
            parts.push(Part::Text(text.to_owned()));
        }
        "input_image" => match part.get("image_url") {
            Some(Value::String(url)) => parts.push(Part::Image(url.clone())),
            _ => return Err(OpenAiError::unsupported(param)),
        },
        "image_url" => match part.get("image_url").and_then(|i| i.get("url")) {
            Some(Value::String(url)) => parts.push(Part::Image(url.clone())),
            _ => return Err(OpenAiError::invalid(param, BAD)),
        },
        _ => return Err(OpenAiError::unsupported(param)),
    }
    Ok(())
}

/// A message's `content`: a string or an array of parts.
fn content(
    v: Option<&Value>,
    parts: &mut Vec<Part>,
    param: &'static str,
) -> Result<(), OpenAiError> {
    match v {
        Some(Value::String(s)) => parts.push(Part::Text(s.clone())),
        Some(Value::Array(items)) => {
            for part in items {
                content_part(part, parts, param)?;
            }
        }
        None | Some(Value::Null) => {}
        Some(_) => {
            return Err(OpenAiError::invalid(
                param,
                "Content must be a string or an array",
            ));
        }
    }
    Ok(())
}

/// A history item the native request cannot hold as such (a call and its output), as text.
fn item_text(item: &Value) -> Part {
    Part::Text(item.to_string())
}

/// `POST /v1/responses`.
pub fn responses(bytes: &[u8]) -> Result<ResponsesRequest, OpenAiError> {
    let body = object(bytes)?;
    refuse(
        &body,
        &[
            "previous_response_id",
            "conversation",
            "prompt",
            "reasoning",
        ],
    )?;
    let model = model(&body)?;
    let mut parts = Vec::new();
    match body.get("input") {
        Some(Value::String(s)) => parts.push(Part::Text(s.clone())),
        Some(Value::Array(items)) => {
            for item in items {
                let kind = item
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("message");
                match kind {
                    "message" => content(item.get("content"), &mut parts, "input")?,
                    "function_call" | "function_call_output" => parts.push(item_text(item)),
                    "item_reference" => return Err(OpenAiError::unsupported("input")),
                    _ => return Err(OpenAiError::unsupported("input")),
                }
            }
        }
        _ => {
            return Err(OpenAiError::invalid(
                "input",
                "Input must be a string or an array",
            ));
        }
    }
    let (tools, tool_choice) = tools(&body, false)?;
    let instructions = match body.get("instructions") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(OpenAiError::invalid("instructions", "Must be a string")),
    };
    Ok(ResponsesRequest {
        model,
        stream: flag(&body, "stream")?,
        background: flag(&body, "background")?,
        intent: Intent {
            instructions,
            parts,
            temperature: number(&body, "temperature", 2.0)?,
            top_p: number(&body, "top_p", 1.0)?,
            max_output_tokens: positive(&body, "max_output_tokens")?,
            tools,
            tool_choice,
            metadata: metadata(&body)?,
        },
    })
}

/// `POST /v1/chat/completions`.
pub fn chat(bytes: &[u8]) -> Result<ChatRequest, OpenAiError> {
    let body = object(bytes)?;
    refuse(
        &body,
        &["functions", "function_call", "audio", "prediction"],
    )?;
    if body
        .get("n")
        .is_some_and(|n| !n.is_null() && n.as_u64() != Some(1))
    {
        return Err(OpenAiError::unsupported("n"));
    }
    let model = model(&body)?;
    let mut parts = Vec::new();
    let Some(Value::Array(messages)) = body.get("messages") else {
        return Err(OpenAiError::invalid(
            "messages",
            "Messages must be an array",
        ));
    };
    for message in messages {
        let role = message.get("role").and_then(Value::as_str);
        match role {
            Some("system" | "developer" | "user") => {
                content(message.get("content"), &mut parts, "messages")?;
            }
            Some("assistant") => {
                content(message.get("content"), &mut parts, "messages")?;
                if let Some(calls) = message.get("tool_calls").filter(|c| !c.is_null()) {
                    parts.push(item_text(calls));
                }
            }
            Some("tool") => parts.push(item_text(message)),
            _ => return Err(OpenAiError::invalid("messages", "Unknown message role")),
        }
    }
    let (tools, tool_choice) = tools(&body, true)?;
    let max_output_tokens = match positive(&body, "max_completion_tokens")? {
        Some(n) => Some(n),
        None => positive(&body, "max_tokens")?,
    };
    let stream = flag(&body, "stream")?;
    let include_usage = body
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok(ChatRequest {
        model,
        stream,
        include_usage,
        intent: Intent {
            instructions: None,
            parts,
            temperature: number(&body, "temperature", 2.0)?,
            top_p: number(&body, "top_p", 1.0)?,
            max_output_tokens,
            tools,
            tool_choice,
            metadata: metadata(&body)?,
        },
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Checks `parts` against `expected`, each `("text", its text)` or `("image", its URL)`.
    fn assert_parts(parts: &[Part], expected: &[(&str, &str)]) {
        let shown: Vec<(&str, &str)> = parts
            .iter()
            .map(|part| match part {
                Part::Text(text) => ("text", text.as_str()),
                Part::Image(url) => ("image", url.as_str()),
            })
            .collect();
        assert_eq!(shown, expected);
    }

    #[test]
    fn a_string_cut_in_the_middle_of_a_character_is_read_with_a_replacement_character() {
        let r = responses(br#"{"model":"m","input":"cut \ud83d"}"#).unwrap();
        assert_eq!(r.intent.parts, vec![Part::Text("cut \u{fffd}".into())]);
        let c = chat(br#"{"model":"m","messages":[{"role":"user","content":"\ude00!"}]}"#).unwrap();
        assert_eq!(c.intent.parts, vec![Part::Text("\u{fffd}!".into())]);
    }

    #[test]
    fn responses_input_string_or_items() {
        let r = responses(
            br#"{"model":"m","input":"hi","stream":true,"instructions":"x","max_output_tokens":5}"#,
        )
        .unwrap();
        assert_eq!(r.model, "m");
        assert!(r.stream && !r.background);
        assert_eq!(r.intent.parts, vec![Part::Text("hi".into())]);
        assert_eq!(r.intent.instructions.as_deref(), Some("x"));
        assert_eq!(r.intent.max_output_tokens, Some(5));
        let r = responses(
            br#"{"model":"m","background":true,"input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"https://x/i.png"}]},
               {"type":"message","role":"assistant","content":"b"}],
               "tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],"tool_choice":"required"}"#,
        )
        .unwrap();
        assert!(r.background);
        assert_parts(
            &r.intent.parts,
            &[("text", "a"), ("image", "https://x/i.png"), ("text", "b")],
        );
        assert_eq!(r.intent.tools[0].name, "f");
        assert_eq!(r.intent.tool_choice, Some(ToolChoice::Required));
    }

    #[test]
    fn refused_features_name_their_field_and_never_echo_values() {
        for (body, param) in [
            (
                r#"{"model":"m","input":"x","previous_response_id":"resp_secret"}"#,
                "previous_response_id",
            ),
            (
                r#"{"model":"m","input":"x","conversation":"conv_secret"}"#,
                "conversation",
            ),
            (
                r#"{"model":"m","input":"x","tools":[{"type":"web_search"}]}"#,
                "tools",
            ),
            (r#"{"input":"x"}"#, "model"),
            (r#"{"model":"m","input":7}"#, "input"),
            (
                r#"{"model":"m","input":"x","temperature":"secret"}"#,
                "temperature",
            ),
        ] {
            let e = responses(body.as_bytes()).unwrap_err();
            assert_eq!(e.status().as_u16(), 400, "{body}");
            let json = serde_json::to_string(&e.body()).unwrap();
            assert!(json.contains(&format!("\"param\":\"{param}\"")), "{json}");
            assert!(!json.contains("secret"), "{json}");
        }
        let e = chat(br#"{"model":"m","messages":[],"n":2}"#).unwrap_err();
        assert_eq!(
            serde_json::to_value(e.body()).unwrap()["error"]["param"],
            "n"
        );
        assert!(responses(b"[1]").is_err());
    }

    #[test]
    fn chat_messages_flatten_in_order() {
        let c = chat(
            br#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":9,
                "messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"u"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AA"}}]}],
                "tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"f"}}}"#,
        )
        .unwrap();
        assert!(c.stream && c.include_usage);
        assert_eq!(c.intent.max_output_tokens, Some(9));
        let image = "data:image/png;base64,AA";
        assert_parts(
            &c.intent.parts,
            &[("text", "s"), ("text", "u"), ("image", image)],
        );
        assert_eq!(c.intent.tool_choice, Some(ToolChoice::Function("f".into())));
    }
}
