//! What an OpenAI request (Responses or Chat Completions) asks for, in one neutral form
//! ([`Intent`]), and its translation into the native [`ExecutionRequest`] that the submission
//! flow runs (so an execution made through either API is the same kind of execution).
//!
//! Decisions a reader must know:
//! - The native request carries one user turn of typed parts. Messages and their content are
//!   flattened into parts in order (text, images by URL); history items the runtime cannot
//!   represent as roles (assistant turns, function calls and their outputs) become text parts.
//! - Sampling, `instructions` and function tools travel as the resolved provider's own
//!   extension (`extensions.<key>.request`, in the dialect of its adapter), the documented
//!   way to reach provider fields; providers without such fields (the mock) get the input
//!   only, with `instructions` as the first text part.
//! - `model` pins routing: the resolved provider first, then the other providers serving the
//!   same model id as fallback, and never another model.
//! - The request is built as JSON and parsed by the native validator, so every native bound
//!   holds for it exactly as for a native request.

use serde_json::{Map, Value, json};

use protocol::ExecutionRequest;

use super::error::OpenAiError;
use super::model::{Dialect, ResolvedModel};

/// The ability OpenAI's text APIs ask for.
pub const ABILITY: &str = "text-generation";

/// One input part of the user turn.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Text(String),
    /// An image by URL (`https:` or a `data:` URL).
    Image(String),
}

/// How the model may use tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    Auto,
    None,
    Required,
    Function(String),
}

/// A function tool the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionTool {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Option<Value>,
    pub strict: Option<bool>,
}

/// What an OpenAI request asks for, whatever its API.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Intent {
    pub instructions: Option<String>,
    pub parts: Vec<Part>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub max_output_tokens: Option<u64>,
    pub tools: Vec<FunctionTool>,
    pub tool_choice: Option<ToolChoice>,
    pub metadata: Option<Map<String, Value>>,
}

/// The native request for `intent` served by `model`, whose adapter speaks `dialect`.
pub fn execution_request(
    intent: &Intent,
    model: &ResolvedModel,
    dialect: Dialect,
) -> Result<ExecutionRequest, OpenAiError> {
    if !intent.tools.is_empty() && !model.capability.tools {
        return Err(crate::error::ApiError::CapabilityUnavailable.into());
    }
    let mut parts: Vec<Value> = Vec::with_capacity(intent.parts.len() + 1);
    if dialect != Dialect::Responses
        && dialect != Dialect::Anthropic
        && let Some(instructions) = &intent.instructions
    {
        parts.push(json!({"type": "text", "text": instructions}));
    }
    for part in &intent.parts {
        parts.push(match part {
            Part::Text(text) => json!({"type": "text", "text": text}),
            Part::Image(uri) => json!({"type": "image", "uri": uri}),
        });
    }
    if parts.is_empty() {
        return Err(OpenAiError::invalid("input", "Input must not be empty"));
    }
    let mut order = vec![model.provider.clone()];
    order.extend(model.alternates.iter().cloned());
    let mut request = json!({
        "ability": ABILITY,
        "input": parts,
        "routing": {"provider_order": order},
    });
    if !intent.tools.is_empty() {
        request["requirements"] = json!({"tools": true});
    }
    if let Some(metadata) = &intent.metadata
        && !metadata.is_empty()
    {
        request["metadata"] = Value::Object(metadata.clone());
    }
    if let Some((key, fields)) = extension(intent, dialect) {
        request["extensions"] = json!({ key: {"request": fields} });
    }
    let bytes = serde_json::to_vec(&request).map_err(|e| OpenAiError::internal(e.to_string()))?;
    protocol::validate::parse_request(&bytes)
        .map_err(|_| OpenAiError::invalid("input", "The request exceeds a bound of this runtime"))
}

/// Limits routing to the providers serving the resolved model: `candidates` are the targets
/// routing would try for `request`, in order (`ProviderRegistry::candidates`, where
/// `provider_order` put the resolved provider and its alternates first). Attempts stop after
/// the leading candidates serving the model, so a fallback never reaches another model; none
/// (the resolved provider cannot serve this input) is 422 `capability_unavailable`.
pub fn pin_to_model(
    request: &mut ExecutionRequest,
    model: &ResolvedModel,
    candidates: impl IntoIterator<Item = protocol::Target>,
) -> Result<(), OpenAiError> {
    let serving = |t: &protocol::Target| {
        t.model == model.capability.model
            && (t.provider == model.provider || model.alternates.contains(&t.provider))
    };
    let attempts = candidates.into_iter().take_while(serving).count();
    let attempts = u32::try_from(attempts).unwrap_or(u32::MAX);
    if attempts == 0 {
        return Err(crate::error::ApiError::CapabilityUnavailable.into());
    }
    let routing = request.routing.get_or_insert_with(Default::default);
    if attempts > 1 {
        routing.allow_fallback = Some(true);
        routing.max_attempts = Some(attempts.min(protocol::request::MAX_ATTEMPTS));
    }
    Ok(())
}

/// The provider fields of `intent` as `dialect`'s adapter reads them: its extension key and
/// the object its body starts from; `None` when there is nothing to send.
fn extension(intent: &Intent, dialect: Dialect) -> Option<(&'static str, Value)> {
    let mut fields = Map::new();
    let mut put = |k: &str, v: Option<Value>| {
        if let Some(v) = v {
            fields.insert(k.to_owned(), v);
        }
    };
    put("temperature", intent.temperature.map(Value::from));
    put("top_p", intent.top_p.map(Value::from));
    let key = match dialect {
        Dialect::Plain => return None,
        Dialect::Responses => {
            put("instructions", intent.instructions.clone().map(Value::from));
            put(
                "max_output_tokens",
                intent.max_output_tokens.map(Value::from),
            );
            if !intent.tools.is_empty() {
                let tools = intent.tools.iter().map(|t| {
                    let mut tool = json!({"type": "function", "name": t.name});
                    set_tool_fields(&mut tool, t, "parameters");
                    tool
                });
                put("tools", Some(Value::Array(tools.collect())));
            }
            put(
                "tool_choice",
                intent.tool_choice.as_ref().map(|c| match c {
                    ToolChoice::Function(name) => json!({"type": "function", "name": name}),
                    other => simple_choice(other),
                }),
            );
            "openai"
        }
        Dialect::Chat => {
            put("max_tokens", intent.max_output_tokens.map(Value::from));
            if !intent.tools.is_empty() {
                let tools = intent.tools.iter().map(|t| {
                    let mut function = json!({"name": t.name});
                    set_tool_fields(&mut function, t, "parameters");
                    json!({"type": "function", "function": function})
                });
                put("tools", Some(Value::Array(tools.collect())));
            }
            put(
                "tool_choice",
                intent.tool_choice.as_ref().map(|c| match c {
                    ToolChoice::Function(name) => {
                        json!({"type": "function", "function": {"name": name}})
                    }
                    other => simple_choice(other),
                }),
            );
            "openai-chat"
        }
        Dialect::Anthropic => {
            put("system", intent.instructions.clone().map(Value::from));
            put("max_tokens", intent.max_output_tokens.map(Value::from));
            if !intent.tools.is_empty() {
                let tools = intent.tools.iter().map(|t| {
                    let mut tool = json!({"name": t.name});
                    set_tool_fields(&mut tool, t, "input_schema");
                    if tool.get("input_schema").is_none() {
                        tool["input_schema"] = json!({"type": "object"});
                    }
                    tool
                });
                put("tools", Some(Value::Array(tools.collect())));
            }
            put(
                "tool_choice",
                intent.tool_choice.as_ref().map(|c| match c {
                    ToolChoice::Auto => json!({"type": "auto"}),
                    ToolChoice::None => json!({"type": "none"}),
                    ToolChoice::Required => json!({"type": "any"}),
                    ToolChoice::Function(name) => json!({"type": "tool", "name": name}),
                }),
            );
            "anthropic"
        }
    };
    (!fields.is_empty()).then_some((key, Value::Object(fields)))
}

fn simple_choice(choice: &ToolChoice) -> Value {
    Value::from(match choice {
        ToolChoice::None => "none",
        ToolChoice::Required => "required",
        _ => "auto",
    })
}

fn set_tool_fields(target: &mut Value, tool: &FunctionTool, schema_field: &str) {
    if let Some(d) = &tool.description {
        target["description"] = Value::from(d.as_str());
    }
    if let Some(p) = &tool.parameters {
        target[schema_field] = p.clone();
    }
    if let Some(s) = tool.strict
        && schema_field == "parameters"
    {
        target["strict"] = Value::from(s);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use protocol::manifest::ModelCapability;

    use super::*;

    fn model(tools: bool, alternates: &[&str]) -> ResolvedModel {
        ResolvedModel {
            provider: "p".into(),
            capability: ModelCapability {
                tools,
                ..ModelCapability::streamed_text("m", vec![ABILITY.into()])
            },
            alternates: alternates.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    fn intent() -> Intent {
        Intent {
            instructions: Some("be brief".into()),
            parts: vec![
                Part::Text("hi".into()),
                Part::Image("https://x/y.png".into()),
            ],
            temperature: Some(0.5),
            max_output_tokens: Some(64),
            tools: vec![FunctionTool {
                name: "lookup".into(),
                description: None,
                parameters: Some(json!({"type": "object"})),
                strict: None,
            }],
            tool_choice: Some(ToolChoice::Function("lookup".into())),
            ..Intent::default()
        }
    }

    fn as_json(r: &ExecutionRequest) -> Value {
        serde_json::to_value(r).unwrap()
    }

    #[test]
    fn each_dialect_gets_its_own_extension_and_routing_pins_the_provider() {
        let r =
            as_json(&execution_request(&intent(), &model(true, &[]), Dialect::Responses).unwrap());
        assert_eq!(r["ability"], ABILITY);
        assert_eq!(
            r["input"],
            json!([{"type":"text","text":"hi"},{"type":"image","uri":"https://x/y.png"}])
        );
        assert_eq!(r["routing"], json!({"provider_order": ["p"]}));
        assert_eq!(r["requirements"], json!({"tools": true}));
        assert_eq!(
            r["extensions"]["openai"]["request"],
            json!({"instructions":"be brief","temperature":0.5,"max_output_tokens":64,
                   "tools":[{"type":"function","name":"lookup","parameters":{"type":"object"}}],
                   "tool_choice":{"type":"function","name":"lookup"}})
        );
        let chat =
            as_json(&execution_request(&intent(), &model(true, &["q"]), Dialect::Chat).unwrap());
        assert_eq!(chat["input"][0], json!({"type":"text","text":"be brief"}));
        assert_eq!(chat["routing"], json!({"provider_order": ["p", "q"]}));
        let ext = &chat["extensions"]["openai-chat"]["request"];
        assert_eq!(ext["max_tokens"], 64);
        assert_eq!(ext["tools"][0]["function"]["name"], "lookup");
        assert_eq!(
            ext["tool_choice"],
            json!({"type":"function","function":{"name":"lookup"}})
        );
        let anthropic =
            as_json(&execution_request(&intent(), &model(true, &[]), Dialect::Anthropic).unwrap());
        let ext = &anthropic["extensions"]["anthropic"]["request"];
        assert_eq!(ext["system"], "be brief");
        assert_eq!(ext["tools"][0]["input_schema"], json!({"type": "object"}));
        assert_eq!(
            ext["tool_choice"],
            json!({"type": "tool", "name": "lookup"})
        );
        let plain = Intent {
            tools: vec![],
            tool_choice: None,
            ..intent()
        };
        let plain =
            as_json(&execution_request(&plain, &model(false, &[]), Dialect::Plain).unwrap());
        assert!(plain.get("extensions").is_none());
        assert_eq!(plain["input"].as_array().unwrap().len(), 3);
    }

    #[test]
    fn fallback_stays_within_the_providers_of_the_model() {
        let target = |p: &str, m: &str| protocol::Target {
            provider: p.into(),
            model: m.into(),
        };
        let plain = Intent {
            parts: vec![Part::Text("x".into())],
            ..Intent::default()
        };
        let resolved = model(false, &["q"]);
        let mut r = execution_request(&plain, &resolved, Dialect::Plain).unwrap();
        pin_to_model(
            &mut r,
            &resolved,
            [target("p", "m"), target("q", "m"), target("z", "other")],
        )
        .unwrap();
        let routing = r.routing.clone().unwrap();
        assert_eq!(
            (routing.allow_fallback, routing.max_attempts),
            (Some(true), Some(2))
        );
        // The resolved provider cannot serve this input: another model would, which is refused.
        let mut r = execution_request(&plain, &resolved, Dialect::Plain).unwrap();
        let e = pin_to_model(&mut r, &resolved, [target("z", "other")]).unwrap_err();
        assert_eq!(e.code(), "capability_unavailable");
        // One provider: one attempt, as a native request without fallback.
        let mut r = execution_request(&plain, &model(false, &[]), Dialect::Plain).unwrap();
        pin_to_model(
            &mut r,
            &model(false, &[]),
            [target("p", "m"), target("z", "other")],
        )
        .unwrap();
        assert_eq!(r.routing.unwrap().allow_fallback, None);
    }

    #[test]
    fn tools_need_the_declared_capability_and_input_must_not_be_empty() {
        let e = execution_request(&intent(), &model(false, &[]), Dialect::Responses).unwrap_err();
        assert_eq!(e.status().as_u16(), 422);
        assert_eq!(e.code(), "capability_unavailable");
        let empty = Intent::default();
        let e = execution_request(&empty, &model(false, &[]), Dialect::Plain).unwrap_err();
        assert_eq!(e.status().as_u16(), 400);
    }
}
