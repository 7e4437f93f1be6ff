//! Pull requests through one standing inbox per source.
//!
//! async-nats's `batch()` and `fetch()` subscribe a fresh inbox for every request and
//! unsubscribe it after: two changes to every NATS server's subscription list per request,
//! each taken under the list's write lock (and, on a cluster, sent to every route), which
//! busy servers pay for on every message they route. A source's [`Inbox`] subscribes once,
//! `{inbox}.*`, on the source's connection, and each request answers to `{inbox}.{token}`.
//!
//! The jobs a request brings arrive under the subject they were stored with, not its reply
//! subject, so they cannot be told apart by request: a source's requests take turns (one at a
//! time; a worker's receive loop asks one source one request at a time anyway), and the jobs
//! that arrive belong to the request in progress. The server's statuses (408 request expired,
//! 404 no jobs for a request that does not wait, 100 heartbeat, errors) arrive under the reply
//! subject and are read only for the request they name.
//!
//! A request also ends on the client: one that waits a few seconds after its `expires` (the
//! server's end may be lost in a reconnect), one that does not wait once the server has been
//! quiet for the request timeout. Should jobs of a request ended that way, or of one whose
//! caller dropped it early, arrive later, the next request to the source finds them first and
//! hands them back (`-NAK`, so another worker takes them at once) instead of taking more jobs
//! than it asked for; the request it sends then asks afresh.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::AckKind;
use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::consumer::pull::BatchConfig;
use async_nats::{StatusCode, Subscriber};
use futures_util::{FutureExt, StreamExt};
use tokio::sync::{Mutex, OwnedMutexGuard};
use tokio::time::Instant;

use super::Pulled;
use crate::error::StoreError;
use crate::nats::unavailable;

/// How long after its `expires` a request that waits ends on the client (as async-nats's
/// `batch()` does).
const EXPIRES_GRACE: Duration = Duration::from_secs(5);

/// One source's standing inbox (see the module docs).
pub(super) struct Inbox {
    prefix: String,
    turn: Arc<Mutex<Turn>>,
}

/// What the request in progress owns: the inbox's subscription and the count of requests.
struct Turn {
    subscriber: Subscriber,
    context: async_nats::jetstream::Context,
    requests: u64,
}

impl Inbox {
    /// Subscribes `{inbox}.*` on `context`'s connection, the one the source's pull requests
    /// go out on (so the subscription reaches the server before any request).
    pub(super) async fn new(context: &async_nats::jetstream::Context) -> Result<Self, StoreError> {
        let client = context.client();
        let prefix = client.new_inbox();
        let subscriber = client
            .subscribe(format!("{prefix}.*"))
            .await
            .map_err(|e| unavailable("subscribe job inbox", e))?;
        Ok(Self {
            prefix,
            turn: Arc::new(Mutex::new(Turn {
                subscriber,
                context: context.clone(),
                requests: 0,
            })),
        })
    }

    /// Waits for the source's turn, then asks `consumer` for up to `max` jobs (at least one)
    /// to come within `expires` (`None`: the jobs it holds now, without waiting). The turn is
    /// held until the returned stream ends or is dropped.
    pub(super) async fn request(
        &self,
        consumer: &PullConsumer,
        max: usize,
        expires: Option<Duration>,
        quiet: Duration,
    ) -> Result<Pulled, StoreError> {
        let max = max.max(1);
        let mut turn = Arc::clone(&self.turn).lock_owned().await;
        turn.hand_back_strays().await;
        turn.requests = turn.requests.wrapping_add(1);
        let reply = format!("{}.{}", self.prefix, turn.requests);
        let batch = BatchConfig {
            batch: max,
            expires,
            no_wait: expires.is_none(),
            ..Default::default()
        };
        consumer
            .request_batch(batch, reply.clone().into())
            .await
            .map_err(|e| unavailable("pull jobs", e))?;
        let end = match expires {
            Some(expires) => End::At(Instant::now() + expires + EXPIRES_GRACE),
            None => End::Quiet(quiet),
        };
        let request = Request {
            turn,
            reply,
            left: max,
            end,
        };
        Ok(futures_util::stream::unfold(request, Request::next).boxed())
    }
}

impl Turn {
    /// Hands back the jobs that arrived since the last request ended (see the module docs),
    /// and drops the statuses of earlier requests.
    async fn hand_back_strays(&mut self) {
        while let Some(Some(message)) = self.subscriber.next().now_or_never() {
            if message.status.is_some_and(|s| s != StatusCode::OK) {
                continue;
            }
            tracing::debug!(subject = %message.subject, "handing back a job that came after its request ended");
            let job = async_nats::jetstream::Message {
                message,
                context: self.context.clone(),
            };
            if let Err(e) = job.ack_with(AckKind::Nak(None)).await {
                tracing::debug!(error = %e, "could not hand back a stray job");
            }
        }
    }
}

/// When a request ends on the client.
#[derive(Clone, Copy)]
enum End {
    /// At this instant (a request that waits: its `expires` and [`EXPIRES_GRACE`]).
    At(Instant),
    /// Once the server has been quiet this long (a request that does not wait).
    Quiet(Duration),
}

/// One request in progress: its turn, its reply subject and the jobs it may still bring.
struct Request {
    turn: OwnedMutexGuard<Turn>,
    reply: String,
    left: usize,
    end: End,
}

impl Request {
    async fn next(
        mut self,
    ) -> Option<(
        Result<async_nats::jetstream::Message, async_nats::Error>,
        Self,
    )> {
        while self.left > 0 {
            let next = self.turn.subscriber.next();
            let message = match self.end {
                End::At(at) => tokio::time::timeout_at(at, next).await.ok()??,
                End::Quiet(quiet) => tokio::time::timeout(quiet, next).await.ok()??,
            };
            let status = message.status.unwrap_or(StatusCode::OK);
            if status == StatusCode::OK {
                self.left -= 1;
                let job = async_nats::jetstream::Message {
                    message,
                    context: self.turn.context.clone(),
                };
                return Some((Ok(job), self));
            }
            // An earlier request's status.
            if message.subject.as_str() != self.reply {
                continue;
            }
            match status {
                StatusCode::IDLE_HEARTBEAT => continue,
                // Expired, or (not waiting) no more jobs.
                StatusCode::TIMEOUT | StatusCode::NOT_FOUND => return None,
                status => {
                    self.left = 0;
                    let error = std::io::Error::other(format!(
                        "pull request refused: {status}, {}",
                        message.description.as_deref().unwrap_or("no description")
                    ));
                    return Some((Err(Box::new(error)), self));
                }
            }
        }
        None
    }
}
