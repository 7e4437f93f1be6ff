//! `fal-queue`: fal's asynchronous queue API [R 69-73].
//!
//! One attempt submits `POST {base}/{model}` with `Authorization: Key <credential>`, then
//! polls the returned `status_url` until `COMPLETED` and fetches `response_url` (`stream.rs` has
//! the lifecycle table, `wire.rs` the body and URL rules).
//!
//! The one decision a reader must know: once fal may have accepted the submission, a new
//! attempt would run (and bill) the job twice, so every error from then on, including a submit
//! whose answer never arrived (transport failure), is `retryable: false` and never falls back
//! (architecture invariant 4). Only an explicit HTTP rejection of the submit keeps the usual
//! status mapping [R 61], so a 429 or 503 at submit may still fall back.

pub mod stream;
pub mod wire;

use std::time::Duration;

use ::config::BaseUrl;
use async_trait::async_trait;
use protocol::manifest::ProviderManifest;
use protocol::{ErrorCode, ExecutionRequest, RuntimeError};
use reqwest::header::{AUTHORIZATION, HeaderValue};
use serde_json::Value;
use url::Url;

use super::credential::{self, KeySource};
use super::{AttemptResult, Provider, ProviderCall, ProviderSink, http};
pub use providers::fal::FalConfig;
use stream::{Lifecycle, RemoteTask};

/// Polling and cleanup timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FalOptions {
    /// Wait between status polls; default 500 ms.
    pub poll_interval: Duration,
    /// Status polls before giving up with `deadline_exceeded`; default 120, at least 1.
    pub max_polls: u32,
    /// Bound of the cancel `PUT`, independent of the execution's cancellation; default 5 s
    /// (the runner waits 6 s for an interrupted attempt's cleanup).
    pub cancel_timeout: Duration,
}

impl Default for FalOptions {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_millis(500),
            max_polls: 120,
            cancel_timeout: Duration::from_secs(5),
        }
    }
}

/// See the module docs.
#[derive(Debug)]
pub struct FalQueueProvider {
    base_url: BaseUrl,
    /// `None` when the model path would leave the base URL (`../`, a query, another origin):
    /// every attempt then fails with `invalid_request` before any credential read or request.
    submit_url: Option<Url>,
    key: KeySource,
    options: FalOptions,
    manifest: ProviderManifest,
}

impl FalQueueProvider {
    /// The adapter for a deployment entry, reading `api_key_env` at execution time, with the
    /// default timing.
    pub fn from_config(config: &FalConfig) -> Self {
        Self::new(
            config,
            KeySource::Env(config.api_key_env.clone()),
            FalOptions::default(),
        )
    }

    /// The adapter with an explicit credential source and timing (tests).
    pub fn new(config: &FalConfig, key: KeySource, options: FalOptions) -> Self {
        let manifest = config.manifest();
        Self {
            submit_url: config.base_url.endpoint(&config.model),
            base_url: config.base_url.clone(),
            key,
            options,
            manifest,
        }
    }

    /// Submits; returns the submit answer once fal accepted the request.
    async fn submit(
        &self,
        call: &ProviderCall<'_>,
        submit_url: Url,
        auth: &HeaderValue,
    ) -> Result<Value, RuntimeError> {
        let body = wire::submit_body(call.request)?;
        let request = http::client()?
            .post(submit_url)
            .header(AUTHORIZATION, auth.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        let response = tokio::select! {
            biased;
            () = call.cancel.cancelled() => return Err(RuntimeError::cancelled()),
            response = request.send() => response,
        };
        // No answer: fal may have accepted the job, so a new attempt could run it twice.
        let response = response.map_err(|e| http::transport_error(&e).not_retryable())?;
        let status = response.status();
        if !status.is_success() {
            drop(response);
            return Err(http::status_error(status));
        }
        // Not interrupted by cancellation: the answer holds the cancel URL, and it is short.
        http::read_json::<Value>(response)
            .await
            .map_err(RuntimeError::not_retryable)
    }

    async fn run(
        &self,
        call: &ProviderCall<'_>,
        submit_url: Url,
        auth: &HeaderValue,
        sink: &mut dyn ProviderSink,
    ) -> Result<(), RuntimeError> {
        let client = http::client()?;
        let submitted = self.submit(call, submit_url, auth).await?;
        let mut task = RemoteTask::new(client, auth.clone(), self.options.cancel_timeout);
        let result = async {
            // The cancel URL first, so that a bad status or response URL still cancels.
            task.arm(wire::lifecycle_url(
                &submitted,
                "cancel_url",
                &self.base_url,
            )?);
            let status_url = wire::lifecycle_url(&submitted, "status_url", &self.base_url)?;
            let response_url = wire::lifecycle_url(&submitted, "response_url", &self.base_url)?;
            Lifecycle {
                client,
                auth,
                status_url: &status_url,
                response_url: &response_url,
                poll_interval: self.options.poll_interval,
                max_polls: self.options.max_polls,
                cancel: &call.cancel,
            }
            .run(&mut task, sink)
            .await
        }
        .await
        .map_err(RuntimeError::not_retryable);
        if result.is_err() {
            task.cancel().await;
        }
        task.release();
        result
    }
}

#[async_trait]
impl Provider for FalQueueProvider {
    fn manifest(&self) -> &ProviderManifest {
        &self.manifest
    }

    /// Refuses a non-object `extensions.fal` or `extensions.fal.input`.
    fn admits(&self, request: &ExecutionRequest) -> bool {
        providers::fal::admits(request)
    }

    async fn execute(&self, call: ProviderCall<'_>, sink: &mut dyn ProviderSink) -> AttemptResult {
        let submit_url = self.submit_url.clone().ok_or_else(|| {
            RuntimeError::new(
                ErrorCode::InvalidRequest,
                "fal model must remain on the configured origin",
                false,
            )
        })?;
        let key = self.key.resolve()?;
        let auth = credential::header(&format!("Key {}", key.expose()))?;
        self.run(&call, submit_url, &auth, sink)
            .await
            .map_err(|error| credential::scrub(error, &key))
    }
}
