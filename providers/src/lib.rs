//! The providers a deployment declares, as both binaries need them: each provider type's
//! section of the deployment file, the manifest it publishes and its request policy, and the
//! capability check built from them. The gateway answers `/v1/providers` and refuses requests
//! no provider can serve from this crate alone; the worker builds its adapters (the code that
//! calls providers) from the same [`ProviderConfig`]s.
//!
//! Module map:
//! - [`deployment`]: the deployment file of this process (`open`, `parse`, `load`, the
//!   standalone mock) with its provider sections typed.
//! - [`catalog`]: [`ProviderConfig`], one variant per provider type, and the [`Catalog`] that
//!   dispatches each section to its type's parser.
//! - [`mock`], [`text`] (openai-responses, anthropic-messages, openai-chat), [`fal`]: each
//!   type's section, manifest and request policy.
//! - [`manifest`]: the single-model manifest every type publishes.
//! - [`extension`]: `extensions.<key>.<field>` shape checks and the tool policy.
//! - [`capability`]: [`Capabilities`], the synchronous capability check [R 25-28].
//!
//! Capabilities come only from the deployment file [R 68]: nothing here reads a credential or
//! does I/O beyond reading the file.

pub mod capability;
pub mod catalog;
pub mod deployment;
pub mod extension;
pub mod fal;
pub mod manifest;
pub mod mock;
pub mod text;

pub use capability::{Capabilities, Capability};
pub use catalog::{Catalog, ProviderConfig};
pub use deployment::DeploymentConfig;
