//! `model` → the deployment's provider and model, and `GET /v1/models` (contract.md section 10).
//!
//! The one decision a reader must know: a name resolves only when it is unambiguous. A bare
//! model id names the one provider that serves it; when several serve it the caller must say
//! `provider/model`. `/v1/models` lists exactly the names that resolve to a model serving
//! text generation (the ability these routes ask for), so every listed id works as `model`.
//! Every provider of this runtime serves one model, so a resolved name is a provider, and
//! routing puts it first.

use protocol::manifest::{ModelCapability, ProviderManifest};
use serde::Serialize;

use super::error::OpenAiError;
use super::translate::ABILITY;

/// How a provider's adapter reads the fields OpenAI requests carry beyond input (its
/// `extensions` key and dialect), from the deployment file's `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// `openai-responses`: `extensions.openai.request`.
    Responses,
    /// `openai-chat`: `extensions["openai-chat"].request`.
    Chat,
    /// `anthropic-messages`: `extensions.anthropic.request`.
    Anthropic,
    /// The mock, fal and anything else: no request fields beyond input.
    Plain,
}

impl Dialect {
    /// The dialect of a provider of deployment `type` `type_name`.
    pub fn of_type(type_name: &str) -> Self {
        match type_name {
            "openai-responses" => Dialect::Responses,
            "openai-chat" => Dialect::Chat,
            "anthropic-messages" => Dialect::Anthropic,
            _ => Dialect::Plain,
        }
    }
}

/// A resolved `model`: the provider serving it, and its declared capabilities.
#[derive(Debug, Clone)]
pub struct ResolvedModel {
    pub provider: String,
    pub capability: ModelCapability,
    /// Other providers serving the same model id, in registration order: the fallback.
    pub alternates: Vec<String>,
}

/// Resolves `name` (`model` or `provider/model`) against the deployment's manifests.
pub fn resolve(manifests: &[ProviderManifest], name: &str) -> Result<ResolvedModel, OpenAiError> {
    let exact = |provider: &str, model: &str| {
        let found = serving(manifests, model).find(|(p, _)| p.provider == provider);
        found.map(|(p, m)| ResolvedModel {
            provider: p.provider.clone(),
            capability: m.clone(),
            alternates: serving(manifests, model)
                .filter(|(q, _)| q.provider != p.provider)
                .map(|(q, _)| q.provider.clone())
                .collect(),
        })
    };
    let mut bare = serving(manifests, name);
    if let (Some((p, _)), None) = (bare.next(), bare.next()) {
        return exact(&p.provider, name).ok_or_else(OpenAiError::model_not_found);
    }
    if let Some((provider, model)) = name.split_once('/')
        && let Some(resolved) = exact(provider, model)
    {
        return Ok(resolved);
    }
    Err(OpenAiError::model_not_found())
}

/// Every (provider, model) declaring model id `model`.
fn serving<'a>(
    manifests: &'a [ProviderManifest],
    model: &'a str,
) -> impl Iterator<Item = (&'a ProviderManifest, &'a ModelCapability)> + 'a {
    manifests
        .iter()
        .flat_map(|p| p.models.iter().map(move |m| (p, m)))
        .filter(move |(_, m)| m.model == model)
}

/// `GET /v1/models`.
#[derive(Debug, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<Model>,
}

/// One entry of [`ModelList`].
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct Model {
    pub id: String,
    pub object: &'static str,
    /// The deployment has no creation times: 0 for every model.
    pub created: i64,
    pub owned_by: String,
}

/// Every name that resolves to a text-generation model: a model id served by one provider as
/// itself, else one `provider/model` per provider serving it.
pub fn list(manifests: &[ProviderManifest]) -> ModelList {
    let mut data = Vec::new();
    for p in manifests {
        for m in p
            .models
            .iter()
            .filter(|m| m.abilities.iter().any(|a| a == ABILITY))
        {
            let shared = manifests
                .iter()
                .flat_map(|q| q.models.iter())
                .filter(|n| n.model == m.model)
                .count()
                > 1;
            let id = if shared {
                format!("{}/{}", p.provider, m.model)
            } else {
                m.model.clone()
            };
            data.push(Model {
                id,
                object: "model",
                created: 0,
                owned_by: p.provider.clone(),
            });
        }
    }
    ModelList {
        object: "list",
        data,
    }
}

/// `GET /v1/models/{id}`: the entry of [`list`] named `id`.
pub fn find(manifests: &[ProviderManifest], id: &str) -> Option<Model> {
    list(manifests).data.into_iter().find(|m| m.id == id)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn manifest(provider: &str, model: &str) -> ProviderManifest {
        ProviderManifest {
            provider: provider.into(),
            protocol_version: "0.1.0".into(),
            models: vec![ModelCapability::streamed_text(
                model,
                vec!["text-generation".into()],
            )],
            limits: None,
        }
    }

    #[test]
    fn unique_ids_resolve_bare_and_shared_ids_need_the_provider() {
        let manifests = [
            manifest("a", "alpha"),
            manifest("b", "beta"),
            manifest("c", "beta"),
        ];
        let alpha = resolve(&manifests, "alpha").unwrap();
        assert_eq!(alpha.provider, "a");
        assert!(alpha.alternates.is_empty());
        assert_eq!(resolve(&manifests, "a/alpha").unwrap().provider, "a");
        assert_eq!(
            resolve(&manifests, "beta").unwrap_err().code(),
            "model_not_found"
        );
        let c = resolve(&manifests, "c/beta").unwrap();
        assert_eq!(
            (c.provider.as_str(), c.alternates),
            ("c", vec!["b".to_owned()])
        );
        for unknown in ["gamma", "a/beta", "", "/", "x/alpha"] {
            assert!(resolve(&manifests, unknown).is_err(), "{unknown}");
        }
        let ids: Vec<String> = list(&manifests).data.into_iter().map(|m| m.id).collect();
        assert_eq!(ids, ["alpha", "b/beta", "c/beta"]);
        for id in &ids {
            assert!(resolve(&manifests, id).is_ok(), "{id}");
            assert_eq!(find(&manifests, id).unwrap().id, *id);
        }
        assert!(find(&manifests, "beta").is_none());
        assert_eq!(find(&manifests, "c/beta").unwrap().owned_by, "c");
    }

    #[test]
    fn models_that_cannot_generate_text_are_not_listed() {
        let mut image = manifest("img", "pixels");
        image.models[0].abilities = vec!["image-generation".into()];
        let manifests = [manifest("a", "alpha"), image];
        let ids: Vec<String> = list(&manifests).data.into_iter().map(|m| m.id).collect();
        assert_eq!(ids, ["alpha"]);
        assert!(find(&manifests, "pixels").is_none());
    }
}
