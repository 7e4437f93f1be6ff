//! The lifecycle of one fal queue request after submission [R 70-73]: polling, progress,
//! result and artifacts, and the remote cancel.
//!
//! | status document | provider event |
//! | --- | --- |
//! | `IN_QUEUE` | `execution.progress{phase:"queued"}` when the phase changes |
//! | `IN_PROGRESS` | `execution.progress{phase:"processing"}` when the phase changes |
//! | `COMPLETED` | `GET response_url`, then `output.result{result, artifacts}`; the attempt completes |
//! | `COMPLETED` with `error` | `provider_unavailable`, `provider_code` = `error_type` |
//! | anything else | `provider_protocol_error` |
//! | no `COMPLETED` within `max_polls` | `deadline_exceeded` "fal polling limit was reached" |
//!
//! The one decision a reader must know: a submitted request is remote state that costs money,
//! so every way out of an attempt that has not seen `COMPLETED` (error, cancel, deadline, poll
//! exhaustion, a refused event, or the attempt being dropped) sends exactly one `PUT
//! cancel_url`, bounded by its own timeout rather than the execution's cancellation, and its
//! outcome never replaces the attempt's error. Once fal has said `COMPLETED` nothing is
//! cancelled, even if fetching the result fails.

use std::collections::HashSet;
use std::time::Duration;

use protocol::event::{OutputArtifact, ProgressPhase};
use protocol::{ErrorCode, RuntimeError};
use reqwest::header::{AUTHORIZATION, HeaderValue};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use url::Url;

use super::wire::{QueueStatus, queue_status};
use crate::provider::http::{self, protocol_error};
use crate::provider::{ProviderEvent, ProviderSink};

/// Objects nested deeper than this are not searched for artifacts.
pub const MAX_ARTIFACT_DEPTH: usize = 6;

/// Where the lifecycle polls and fetches, and how.
#[derive(Debug)]
pub struct Lifecycle<'a> {
    pub client: &'static reqwest::Client,
    /// `Key <credential>`, marked sensitive.
    pub auth: &'a HeaderValue,
    pub status_url: &'a Url,
    pub response_url: &'a Url,
    pub poll_interval: Duration,
    /// At least 1.
    pub max_polls: u32,
    pub cancel: &'a CancellationToken,
}

impl Lifecycle<'_> {
    /// Polls until `COMPLETED` and reports the result. Calls `task.completed()` as soon as fal
    /// reports completion, so that a later failure does not cancel a finished request.
    pub async fn run(
        &self,
        task: &mut RemoteTask,
        sink: &mut dyn ProviderSink,
    ) -> Result<(), RuntimeError> {
        let mut phase: Option<ProgressPhase> = None;
        for poll in 0..self.max_polls.max(1) {
            if poll > 0 {
                tokio::select! {
                    biased;
                    () = self.cancel.cancelled() => return Err(RuntimeError::cancelled()),
                    () = tokio::time::sleep(self.poll_interval) => {}
                }
            }
            let document = self.get_json(self.status_url).await?;
            let next = match queue_status(&document) {
                QueueStatus::InQueue => ProgressPhase::Queued,
                QueueStatus::InProgress => ProgressPhase::Processing,
                QueueStatus::Completed => {
                    task.completed();
                    let result = self.get_json(self.response_url).await?;
                    let artifacts = collect_artifacts(&result);
                    sink.emit(ProviderEvent::OutputResult {
                        result,
                        artifacts: Some(artifacts),
                    })
                    .await?;
                    return Ok(());
                }
                QueueStatus::Failed { error_type } => {
                    task.completed();
                    let error = RuntimeError::new(
                        ErrorCode::ProviderUnavailable,
                        "Provider reported a failed request",
                        false,
                    );
                    return Err(match error_type {
                        Some(code) => error.with_provider_code(code),
                        None => error,
                    });
                }
                QueueStatus::Unknown => {
                    return Err(protocol_error("Provider returned an unknown queue status"));
                }
            };
            // Progress on change only: a long queue polled every 500 ms would otherwise write
            // one identical event per poll into the execution's bounded log.
            if phase != Some(next) {
                phase = Some(next);
                sink.emit(ProviderEvent::Progress {
                    phase: next,
                    progress: None,
                })
                .await?;
            }
        }
        Err(RuntimeError::new(
            ErrorCode::DeadlineExceeded,
            "fal polling limit was reached",
            false,
        ))
    }

    /// An authorized GET of a lifecycle URL, interrupted by cancellation.
    async fn get_json(&self, url: &Url) -> Result<Value, RuntimeError> {
        let request = self
            .client
            .get(url.clone())
            .header(AUTHORIZATION, self.auth.clone());
        tokio::select! {
            biased;
            () = self.cancel.cancelled() => Err(RuntimeError::cancelled()),
            document = async { http::read_json::<Value>(http::send(request).await?).await } => document,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TaskState {
    /// Submitted, not known to be finished: leaving must cancel it.
    Pending,
    /// fal reported `COMPLETED`: never cancelled.
    Completed,
    /// The cancel was sent (or the task is no longer ours to cancel).
    Released,
}

/// A submitted fal request that is cancelled when the attempt leaves it unfinished. The cancel
/// is sent at most once: by [`RemoteTask::cancel`], or from `Drop` (on a spawned task) when the
/// attempt future is dropped without finishing.
#[derive(Debug)]
pub struct RemoteTask {
    client: &'static reqwest::Client,
    auth: HeaderValue,
    cancel_url: Option<Url>,
    timeout: Duration,
    state: TaskState,
}

impl RemoteTask {
    /// A submitted task whose cancel URL is not known yet (nothing can be cancelled until
    /// [`RemoteTask::arm`]).
    pub fn new(client: &'static reqwest::Client, auth: HeaderValue, timeout: Duration) -> Self {
        Self {
            client,
            auth,
            cancel_url: None,
            timeout,
            state: TaskState::Pending,
        }
    }

    pub fn arm(&mut self, cancel_url: Url) {
        self.cancel_url = Some(cancel_url);
    }

    /// fal reported completion: from now on the task is never cancelled.
    pub fn completed(&mut self) {
        if self.state == TaskState::Pending {
            self.state = TaskState::Completed;
        }
    }

    /// Sends the cancel if the task is still pending; later calls do nothing. Never fails: a
    /// failed cancel is logged and the caller keeps its own error.
    pub async fn cancel(&mut self) {
        if self.state != TaskState::Pending {
            return;
        }
        self.state = TaskState::Released;
        if let Some(url) = self.cancel_url.take() {
            send_cancel(self.client, url, self.auth.clone(), self.timeout).await;
        }
    }

    /// The attempt is over and handled its remote state; dropping does nothing.
    pub fn release(mut self) {
        self.state = TaskState::Released;
    }
}

impl Drop for RemoteTask {
    fn drop(&mut self) {
        if self.state != TaskState::Pending {
            return;
        }
        let Some(url) = self.cancel_url.take() else {
            return;
        };
        // Dropped mid-attempt (the runner gave up waiting): cancel in the background.
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(send_cancel(
                    self.client,
                    url,
                    self.auth.clone(),
                    self.timeout,
                ));
            }
            Err(_) => tracing::warn!("fal request dropped outside a runtime; not cancelled"),
        }
    }
}

/// `PUT cancel_url`, bounded by `timeout`. The outcome is only logged (status, never the URL or
/// body).
async fn send_cancel(
    client: &'static reqwest::Client,
    url: Url,
    auth: HeaderValue,
    timeout: Duration,
) {
    let request = client.put(url).header(AUTHORIZATION, auth).send();
    match tokio::time::timeout(timeout, request).await {
        Ok(Ok(response)) if response.status().is_success() => {
            tracing::debug!("fal request cancelled");
        }
        Ok(Ok(response)) => {
            // 400 ALREADY_COMPLETED is expected when the request finished meanwhile.
            tracing::info!(status = response.status().as_u16(), "fal cancel refused");
        }
        Ok(Err(error)) => {
            tracing::warn!(
                timeout = error.is_timeout(),
                connect = error.is_connect(),
                "fal cancel failed"
            );
        }
        Err(_) => tracing::warn!("fal cancel timed out"),
    }
}

/// Artifact references in a result [R 73]: every object (to depth [`MAX_ARTIFACT_DEPTH`], the
/// result itself at depth 0) whose `url` (else `uri`) is an `http://` or `https://` string,
/// with `content_type` as the media type, parents before children, the first of each uri kept. The
/// runtime never fetches them.
pub fn collect_artifacts(result: &Value) -> Vec<OutputArtifact> {
    let mut found = Vec::new();
    let mut seen = HashSet::new();
    walk(result, 0, &mut found, &mut seen);
    found
}

fn walk(value: &Value, depth: usize, found: &mut Vec<OutputArtifact>, seen: &mut HashSet<String>) {
    if depth > MAX_ARTIFACT_DEPTH {
        return;
    }
    match value {
        Value::Array(items) => {
            for item in items {
                walk(item, depth + 1, found, seen);
            }
        }
        Value::Object(object) => {
            let uri = match object.get("url") {
                Some(Value::String(url)) => Some(url),
                _ => match object.get("uri") {
                    Some(Value::String(uri)) => Some(uri),
                    _ => None,
                },
            };
            if let Some(uri) = uri.filter(|u| u.starts_with("https://") || u.starts_with("http://"))
                && seen.insert(uri.clone())
            {
                found.push(OutputArtifact {
                    uri: uri.clone(),
                    media_type: object
                        .get("content_type")
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                });
            }
            for nested in object.values() {
                walk(nested, depth + 1, found, seen);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn uris(artifacts: &[OutputArtifact]) -> Vec<&str> {
        artifacts.iter().map(|a| a.uri.as_str()).collect()
    }

    #[test]
    fn artifacts_are_collected_recursively_and_deduplicated() {
        let result = json!({
            "images": [
                {"url": "https://v3.fal.media/files/a.png", "content_type": "image/png", "width": 1024},
                {"url": "https://v3.fal.media/files/b.jpeg", "content_type": "image/jpeg"},
                {"url": "https://v3.fal.media/files/a.png", "content_type": "image/webp"}
            ],
            "video": {"uri": "http://127.0.0.1:9/v.mp4"},
            "inline": {"url": "data:image/png;base64,AAAA"},
            "relative": {"url": "/files/c.png"},
            "ftp": {"url": "ftp://x/y"},
            "both": {"url": 7, "uri": "https://v3.fal.media/files/d.bin"},
            "seed": 42
        });
        let found = collect_artifacts(&result);
        // The first occurrence of a uri wins (object keys are visited in sorted order).
        let a = found.iter().find(|a| a.uri.ends_with("/a.png")).unwrap();
        assert_eq!(a.media_type.as_deref(), Some("image/png"));
        let mut got = uris(&found);
        got.sort_unstable();
        assert_eq!(
            got,
            [
                "http://127.0.0.1:9/v.mp4",
                "https://v3.fal.media/files/a.png",
                "https://v3.fal.media/files/b.jpeg",
                "https://v3.fal.media/files/d.bin"
            ]
        );
    }

    #[test]
    fn the_walk_stops_below_depth_six() {
        // depth: root 0, a 1, b 2, c 3, d 4, e 5, f 6 (found), g 7 (not searched).
        let result = json!({"a": {"b": {"c": {"d": {"e": {"f": {
            "url": "https://x.example/6.png",
            "g": {"url": "https://x.example/7.png"}
        }}}}}}});
        assert_eq!(
            uris(&collect_artifacts(&result)),
            ["https://x.example/6.png"]
        );
        // Arrays count as a level.
        let result = json!([[[[[[[{"url": "https://x.example/7.png"}]]]]]]]);
        assert!(collect_artifacts(&result).is_empty());
        let result = json!([[[[[[{"url": "https://x.example/6.png"}]]]]]]);
        assert_eq!(collect_artifacts(&result).len(), 1);
    }
}
