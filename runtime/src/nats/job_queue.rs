//! The JetStream job queue: a WorkQueue stream with one durable pull consumer shared by all
//! workers. Each `receive` fetches exactly one job, so a worker never holds jobs it has no free
//! slot for; unacknowledged jobs are redelivered after `ack_wait` (worker loss), and running
//! executions extend their lease with progress acks.

use std::time::Duration;

use async_nats::jetstream::AckKind;
use async_nats::jetstream::consumer::{self, PullConsumer};
use async_nats::jetstream::message::{Acker, PublishMessage};
use async_trait::async_trait;
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use super::{NatsBackend, unavailable};
use crate::error::StoreError;
use crate::job::{Delivery, DeliveryHandle, Job, JobQueue};

/// How long one fetch waits for a job before asking again.
const FETCH_EXPIRES: Duration = Duration::from_secs(5);

/// See the module docs.
pub struct NatsJobQueue {
    backend: NatsBackend,
    consumer: OnceCell<PullConsumer>,
    closed: CancellationToken,
}

impl std::fmt::Debug for NatsJobQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsJobQueue").finish_non_exhaustive()
    }
}

impl NatsJobQueue {
    pub fn new(backend: NatsBackend) -> Self {
        Self {
            backend,
            consumer: OnceCell::new(),
            closed: CancellationToken::new(),
        }
    }

    /// The shared durable consumer, created or verified on first use (workers only).
    async fn consumer(&self) -> Result<&PullConsumer, StoreError> {
        self.consumer
            .get_or_try_init(|| async {
                let s = &self.backend.settings;
                let stream = self
                    .backend
                    .jetstream
                    .get_stream(s.jobs_stream())
                    .await
                    .map_err(|e| unavailable("jobs stream", e))?;
                let config = consumer::pull::Config {
                    durable_name: Some(s.workers_consumer()),
                    ack_policy: consumer::AckPolicy::Explicit,
                    ack_wait: s.ack_wait,
                    max_ack_pending: s.max_jobs,
                    max_deliver: -1,
                    ..Default::default()
                };
                stream
                    .get_or_create_consumer(&s.workers_consumer(), config)
                    .await
                    .map_err(|e| unavailable("workers consumer", e))
            })
            .await
    }
}

struct NatsDelivery {
    acker: Acker,
}

#[async_trait]
impl DeliveryHandle for NatsDelivery {
    async fn ack(&self) -> Result<(), StoreError> {
        self.acker
            .double_ack()
            .await
            .map_err(|e| unavailable("ack", e))
    }

    async fn in_progress(&self) -> Result<(), StoreError> {
        self.acker
            .ack_with(AckKind::Progress)
            .await
            .map_err(|e| unavailable("progress ack", e))
    }
}

#[async_trait]
impl JobQueue for NatsJobQueue {
    async fn publish(&self, job: &Job) -> Result<(), StoreError> {
        self.backend.check_connected()?;
        let payload = serde_json::to_vec(job)
            .map_err(|e| StoreError::Unavailable(format!("encode job: {e}")))?;
        let message = PublishMessage::build()
            .payload(Bytes::from(payload))
            .message_id(job.execution_id.to_string());
        let ack = self
            .backend
            .jetstream
            .send_publish(self.backend.settings.jobs_subject(), message)
            .await
            .map_err(|e| unavailable("publish job", e))?;
        match ack.await {
            Ok(_) => Ok(()),
            // `discard: new` on the jobs stream is the cluster-wide admission limit.
            Err(e) if e.to_string().contains("maximum messages") => Err(StoreError::AdmissionFull),
            Err(e) => Err(unavailable("publish job ack", e)),
        }
    }

    async fn receive(&self) -> Result<Option<Delivery>, StoreError> {
        loop {
            if self.closed.is_cancelled() {
                return Ok(None);
            }
            let consumer = self.consumer().await?;
            let fetch = async {
                let mut batch = consumer
                    .fetch()
                    .max_messages(1)
                    .expires(FETCH_EXPIRES)
                    .messages()
                    .await
                    .map_err(|e| unavailable("fetch", e))?;
                batch
                    .next()
                    .await
                    .transpose()
                    .map_err(|e| unavailable("fetch message", e))
            };
            let message = tokio::select! {
                m = fetch => m?,
                () = self.closed.cancelled() => return Ok(None),
            };
            let Some(message) = message else { continue };
            let delivered = message.info().map(|i| i.delivered).unwrap_or(1);
            let (message, acker) = message.split();
            match serde_json::from_slice::<Job>(&message.payload) {
                Ok(job) => {
                    return Ok(Some(Delivery {
                        job,
                        delivered: u32::try_from(delivered).unwrap_or(u32::MAX),
                        handle: Box::new(NatsDelivery { acker }),
                    }));
                }
                Err(e) => {
                    tracing::error!(error = %e, "undecodable job; terminating it");
                    let _ = acker.ack_with(AckKind::Term).await;
                }
            }
        }
    }

    fn close(&self) {
        self.closed.cancel();
    }

    async fn ready(&self) -> Result<(), StoreError> {
        self.backend.check_connected()
    }
}
