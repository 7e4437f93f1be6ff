//! One delivery attempt: sign, POST, classify the answer, count it, and decide what comes next
//! by the retry schedule. Both pipelines (NATS and in-memory) call [`Sender::attempt`], so an
//! attempt behaves the same in every mode.
//!
//! The one decision a reader must know: success is a 2xx within [`ATTEMPT_TIMEOUT`]; `410`
//! marks the endpoint gone (nothing more is sent to it until restart); everything else
//! (another status, a refused connection, a timeout) is a failure retried after the pause the
//! schedule gives for that attempt, and abandoned, with a log line naming the execution, once
//! the schedule is exhausted. Redirects are never followed (a 3xx is a failure), so a receiver
//! cannot bounce signed deliveries elsewhere.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use protocol::{ExecutionId, Timestamp};
use telemetry::metric::{self, webhook_outcome};

use crate::endpoint::Endpoint;
use crate::signature::{self, ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER};

/// How long a receiver has to answer an attempt.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(15);

/// The pauses before each retry (see `config::webhook`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetrySchedule(Vec<Duration>);

impl RetrySchedule {
    pub fn new(pauses: Vec<Duration>) -> Self {
        Self(pauses)
    }

    /// The deployment's schedule (`webhook_retry_schedule_ms`, or the default).
    pub fn of(config: &config::WebhookConfig) -> Self {
        Self(config.retry_schedule.clone())
    }

    /// The pause before retrying after failed attempt `attempt` (1-based), or `None` when that
    /// was the last attempt.
    pub fn after_failure(&self, attempt: u64) -> Option<Duration> {
        let index = usize::try_from(attempt.checked_sub(1)?).ok()?;
        self.0.get(index).copied()
    }

    /// Attempts a delivery gets at most.
    pub fn attempts(&self) -> usize {
        self.0.len() + 1
    }

    /// The sum of every pause: how long a delivery may stay owed after its first attempt
    /// (plus the attempts themselves).
    pub fn total(&self) -> Duration {
        self.0.iter().sum()
    }
}

/// One delivery to one endpoint, as the pipelines carry it.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub execution_id: ExecutionId,
    pub webhook_id: String,
    pub body: Bytes,
    /// The longest pause a retry of it can have: where it is held drops it after that (the
    /// NATS deliveries stream's maximum age). `None`: held as long as the schedule needs.
    pub retry_within: Option<Duration>,
}

/// What to do with a delivery after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Delivered, abandoned or gone: forget it.
    Done,
    /// Try again after this pause.
    Retry(Duration),
}

/// Sends attempts over one HTTP client.
#[derive(Debug, Clone)]
pub struct Sender {
    client: reqwest::Client,
    schedule: Arc<RetrySchedule>,
}

impl Sender {
    /// A sender with no redirects and [`ATTEMPT_TIMEOUT`] per attempt.
    pub fn new(schedule: RetrySchedule) -> Result<Self, reqwest::Error> {
        // The process-wide rustls provider; ignore "already installed".
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(ATTEMPT_TIMEOUT)
            .no_proxy()
            .build()?;
        Ok(Self {
            client,
            schedule: Arc::new(schedule),
        })
    }

    pub fn schedule(&self) -> &RetrySchedule {
        &self.schedule
    }

    /// Makes attempt number `attempt` (1-based) of `delivery` to `endpoint`, counts it, and
    /// says what comes next. An endpoint already gone is not contacted.
    pub async fn attempt(&self, endpoint: &Endpoint, delivery: &Delivery, attempt: u64) -> Next {
        if endpoint.is_gone() {
            count(endpoint, webhook_outcome::GONE);
            return Next::Done;
        }
        let started = Instant::now();
        let timestamp = Timestamp::now().unix_millis().div_euclid(1000);
        let signatures = signature::sign(
            &endpoint.secrets,
            &delivery.webhook_id,
            timestamp,
            &delivery.body,
        );
        let sent = self
            .client
            .post(endpoint.url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(ID_HEADER, delivery.webhook_id.as_str())
            .header(TIMESTAMP_HEADER, timestamp.to_string())
            .header(SIGNATURE_HEADER, signatures)
            .body(delivery.body.clone())
            .send()
            .await;
        metrics::histogram!(
            metric::WEBHOOK_DELIVERY_SECONDS,
            "tenant" => endpoint.tenant.as_str().to_owned(),
            "endpoint" => endpoint.id.clone()
        )
        .record(started.elapsed().as_secs_f64());
        let failure = match sent {
            Ok(response) if response.status().is_success() => {
                count(endpoint, webhook_outcome::DELIVERED);
                return Next::Done;
            }
            Ok(response) if response.status() == reqwest::StatusCode::GONE => {
                // Marked before counted: a reader of the count finds the endpoint gone.
                endpoint.mark_gone();
                count(endpoint, webhook_outcome::GONE);
                return Next::Done;
            }
            Ok(response) => format!("status {}", response.status().as_u16()),
            Err(e) if e.is_timeout() => "no answer in time".to_owned(),
            Err(e) if e.is_connect() => "connection failed".to_owned(),
            // The error's text may hold the URL; the kind is enough.
            Err(_) => "request failed".to_owned(),
        };
        match self.schedule.after_failure(attempt) {
            Some(pause) if delivery.retry_within.is_none_or(|within| pause <= within) => {
                count(endpoint, webhook_outcome::RETRIED);
                tracing::debug!(execution_id = %delivery.execution_id, tenant = %endpoint.tenant,
                    endpoint = %endpoint.id, attempt, failure = %failure, "webhook attempt failed; retrying");
                Next::Retry(pause)
            }
            Some(pause) => {
                // Counted and logged here rather than dropped unseen by the store later.
                count(endpoint, webhook_outcome::ABANDONED);
                tracing::warn!(execution_id = %delivery.execution_id, tenant = %endpoint.tenant,
                    endpoint = %endpoint.id, webhook_id = %delivery.webhook_id, attempts = attempt,
                    pause_s = pause.as_secs(), failure = %failure,
                    "webhook delivery abandoned: its next retry would come after the deliveries stream's maximum age");
                Next::Done
            }
            None => {
                count(endpoint, webhook_outcome::ABANDONED);
                tracing::warn!(execution_id = %delivery.execution_id, tenant = %endpoint.tenant,
                    endpoint = %endpoint.id, webhook_id = %delivery.webhook_id, attempts = attempt,
                    failure = %failure, "webhook delivery abandoned after its last attempt");
                Next::Done
            }
        }
    }
}

fn count(endpoint: &Endpoint, outcome: &'static str) {
    metrics::counter!(
        metric::WEBHOOK_DELIVERIES_TOTAL,
        "tenant" => endpoint.tenant.as_str().to_owned(),
        "endpoint" => endpoint.id.clone(),
        "outcome" => outcome
    )
    .increment(1);
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use config::{SigningSecret, WebhookConfig, WebhookEndpoint, WebhookEvent};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::endpoint::Endpoints;

    /// A loopback server answering every request with `status` (and a `location` header),
    /// counting the requests it got.
    async fn answering(status: u16) -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let count = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&count);
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                seen.fetch_add(1, Ordering::SeqCst);
                let mut buffer = vec![0u8; 8192];
                let _ = socket.read(&mut buffer).await;
                let answer = format!(
                    "HTTP/1.1 {status} X\r\nlocation: /elsewhere\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                );
                let _ = socket.write_all(answer.as_bytes()).await;
            }
        });
        (url, count)
    }

    fn endpoints(url: &str) -> Endpoints {
        let config = WebhookConfig {
            endpoints: vec![WebhookEndpoint {
                tenant: "default".into(),
                id: "main".into(),
                url: config::ExactUrl::parse(url).unwrap(),
                events: vec![WebhookEvent::Completed],
                secret_env: vec!["S".into()],
                path: "webhooks[0]".into(),
            }],
            ..WebhookConfig::default()
        };
        let secret = SigningSecret::parse(&SigningSecret::encode(&[5u8; 32])).unwrap();
        Endpoints::with_secrets(&config, vec![vec![secret]]).unwrap()
    }

    fn delivery() -> Delivery {
        Delivery {
            execution_id: protocol::ExecutionId::new_random(),
            webhook_id: "id_1".into(),
            body: Bytes::from_static(b"{}"),
            retry_within: None,
        }
    }

    #[tokio::test]
    async fn answers_decide_what_comes_next() {
        let schedule = RetrySchedule::new(vec![Duration::from_millis(7)]);
        let sender = Sender::new(schedule).unwrap();
        // 2xx: done.
        let (url, _) = answering(204).await;
        let e = endpoints(&url);
        assert_eq!(
            sender.attempt(&e.all()[0], &delivery(), 1).await,
            Next::Done
        );
        // Another status: retried after the schedule's pause, then abandoned.
        let (url, _) = answering(500).await;
        let e = endpoints(&url);
        let endpoint = &e.all()[0];
        assert_eq!(
            sender.attempt(endpoint, &delivery(), 1).await,
            Next::Retry(Duration::from_millis(7))
        );
        assert_eq!(sender.attempt(endpoint, &delivery(), 2).await, Next::Done);
        // A retry that would come after its store drops the delivery: abandoned now.
        let held = |within| Delivery {
            retry_within: Some(Duration::from_millis(within)),
            ..delivery()
        };
        assert_eq!(
            sender.attempt(endpoint, &held(7), 1).await,
            Next::Retry(Duration::from_millis(7))
        );
        assert_eq!(sender.attempt(endpoint, &held(6), 1).await, Next::Done);
        // A redirect is a failure, never followed.
        let (url, count) = answering(307).await;
        let e = endpoints(&url);
        assert!(matches!(
            sender.attempt(&e.all()[0], &delivery(), 1).await,
            Next::Retry(_)
        ));
        assert_eq!(count.load(Ordering::SeqCst), 1);
        // 410: done, and the endpoint is gone: it is not contacted again.
        let (url, count) = answering(410).await;
        let e = endpoints(&url);
        let endpoint = &e.all()[0];
        assert_eq!(sender.attempt(endpoint, &delivery(), 1).await, Next::Done);
        assert!(endpoint.is_gone());
        assert_eq!(sender.attempt(endpoint, &delivery(), 1).await, Next::Done);
        assert_eq!(count.load(Ordering::SeqCst), 1);
        // Nothing listening: a failure.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", closed.local_addr().unwrap());
        drop(closed);
        let e = endpoints(&url);
        assert!(matches!(
            sender.attempt(&e.all()[0], &delivery(), 1).await,
            Next::Retry(_)
        ));
    }

    #[tokio::test]
    async fn the_request_goes_to_the_endpoint_url_as_written() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook/", listener.local_addr().unwrap());
        let (line, seen) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buffer = vec![0u8; 8192];
            let n = socket.read(&mut buffer).await.unwrap();
            let head = String::from_utf8_lossy(&buffer[..n])
                .lines()
                .next()
                .map(str::to_owned);
            let _ = line.send(head);
            let answer = "HTTP/1.1 204 X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
            let _ = socket.write_all(answer.as_bytes()).await;
        });
        let sender = Sender::new(RetrySchedule::new(vec![])).unwrap();
        let e = endpoints(&url);
        assert_eq!(
            sender.attempt(&e.all()[0], &delivery(), 1).await,
            Next::Done
        );
        assert_eq!(seen.await.unwrap().as_deref(), Some("POST /hook/ HTTP/1.1"));
    }

    #[test]
    fn the_schedule_gives_one_pause_per_retry_then_ends() {
        let schedule = RetrySchedule::new(vec![Duration::ZERO, Duration::from_secs(5)]);
        assert_eq!(schedule.after_failure(1), Some(Duration::ZERO));
        assert_eq!(schedule.after_failure(2), Some(Duration::from_secs(5)));
        assert_eq!(schedule.after_failure(3), None);
        assert_eq!(schedule.after_failure(0), None);
        assert_eq!(schedule.attempts(), 3);
        assert_eq!(RetrySchedule::new(vec![]).after_failure(1), None);
    }
}
