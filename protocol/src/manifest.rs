//! Provider manifests: what each configured model can do. Capabilities describe a configured
//! model, never the union of a vendor's features, and are never inferred from an adapter name.

use serde::{Deserialize, Serialize};

use crate::request::{ExecutionRequest, Modality};

/// The declared capabilities of one configured model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ModelCapability {
    pub model: String,
    pub abilities: Vec<String>,
    pub input_modalities: Vec<Modality>,
    pub output_modalities: Vec<Modality>,
    pub stream: bool,
    pub tools: bool,
    pub structured_output: bool,
    #[serde(rename = "async")]
    pub r#async: bool,
    pub cancel: bool,
}

impl ModelCapability {
    /// A model that takes text and streams text back, cancellable, without tools, structured
    /// output or async delivery: the baseline the text adapters and the mock declare.
    pub fn streamed_text(model: impl Into<String>, abilities: Vec<String>) -> Self {
        Self {
            model: model.into(),
            abilities,
            input_modalities: vec![Modality::Text],
            output_modalities: vec![Modality::Text],
            stream: true,
            tools: false,
            structured_output: false,
            r#async: false,
            cancel: true,
        }
    }

    /// Whether this model can serve `request` [R 25]: the ability is declared, every input
    /// part's modality is accepted (inferred, so narrowing `requirements` cannot bypass it),
    /// required lists are subsets, and each boolean requirement is met when it is `true`.
    pub fn satisfies(&self, request: &ExecutionRequest) -> bool {
        if !self.abilities.iter().any(|a| a == &request.ability) {
            return false;
        }
        if !request
            .input
            .iter()
            .all(|p| self.input_modalities.contains(&p.modality()))
        {
            return false;
        }
        let Some(req) = &request.requirements else {
            return true;
        };
        let subset = |wanted: &Option<Vec<Modality>>, have: &[Modality]| {
            wanted
                .as_ref()
                .is_none_or(|w| w.iter().all(|m| have.contains(m)))
        };
        let flag = |wanted: Option<bool>, have: bool| wanted != Some(true) || have;
        subset(&req.input_modalities, &self.input_modalities)
            && subset(&req.output_modalities, &self.output_modalities)
            && flag(req.stream, self.stream)
            && flag(req.tools, self.tools)
            && flag(req.structured_output, self.structured_output)
            && flag(req.r#async, self.r#async)
            && flag(req.cancel, self.cancel)
    }
}

/// Informational flow-control limits of a provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProviderLimits {
    pub max_concurrency: u32,
    pub max_queue_depth: u32,
}

/// What one configured provider offers [R 23].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProviderManifest {
    pub provider: String,
    pub protocol_version: String,
    pub models: Vec<ModelCapability>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ProviderLimits>,
}

/// `GET /v1/providers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProviderList {
    pub data: Vec<ProviderManifest>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{InputPart, Requirements};

    fn text_model() -> ModelCapability {
        ModelCapability::streamed_text("m", vec!["text-generation".into()])
    }

    fn request(parts: Vec<InputPart>, requirements: Option<Requirements>) -> ExecutionRequest {
        ExecutionRequest {
            ability: "text-generation".into(),
            input: parts,
            requirements,
            routing: None,
            deadline_ms: None,
            metadata: None,
            extensions: None,
        }
    }

    #[test]
    fn inferred_modalities_cannot_be_bypassed_by_narrow_requirements() {
        let image = InputPart::Image {
            uri: "https://x/y.png".into(),
            media_type: None,
        };
        let narrowed = Requirements {
            input_modalities: Some(vec![Modality::Text]),
            ..Default::default()
        };
        assert!(!text_model().satisfies(&request(vec![image.clone()], Some(narrowed))));
        assert!(!text_model().satisfies(&request(
            vec![InputPart::Text { text: "a".into() }, image],
            None
        )));
        assert!(text_model().satisfies(&request(vec![InputPart::Text { text: "a".into() }], None)));
    }

    #[test]
    fn boolean_requirements_only_checked_when_true() {
        let text = vec![InputPart::Text {
            text: String::new(),
        }];
        let tools_false = Requirements {
            tools: Some(false),
            ..Default::default()
        };
        assert!(text_model().satisfies(&request(text.clone(), Some(tools_false))));
        let tools_true = Requirements {
            tools: Some(true),
            ..Default::default()
        };
        assert!(!text_model().satisfies(&request(text.clone(), Some(tools_true))));
        let json_out = Requirements {
            output_modalities: Some(vec![Modality::Json]),
            ..Default::default()
        };
        assert!(!text_model().satisfies(&request(text, Some(json_out))));
    }
}
