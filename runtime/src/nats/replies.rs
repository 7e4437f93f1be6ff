//! One subscription for the replies of many requests on a connection.
//!
//! A batched direct get is answered with several messages (`event_store::direct`), which the
//! client's own request multiplexer (one reply per request) cannot take. Subscribing an inbox
//! for each request cost the server a subscription and its removal per read, and on a cluster
//! every node hears of each (the subscription's interest is propagated to all of them). Here a
//! connection holds one wildcard subscription, `{prefix}.*`, made once: a request gets a token,
//! names `{prefix}.{token}` as its reply subject, and its replies are handed to it alone.
//!
//! A request registers before it is sent, so no reply can arrive unclaimed; replies for a
//! request that is no longer waiting (it timed out) are dropped. When the connection closes for
//! good the subscription ends, and every waiting request sees its replies end.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::unavailable;
use crate::error::StoreError;

type Waiting = parking_lot::Mutex<HashMap<u64, mpsc::UnboundedSender<async_nats::Message>>>;

/// The replies multiplexer of one connection; clones share it, and the last one stops it.
#[derive(Clone)]
pub(crate) struct Replies(Arc<Shared>);

struct Shared {
    prefix: String,
    next: AtomicU64,
    waiting: Arc<Waiting>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Replies {
    /// Subscribes `client` to the replies of every request made through this multiplexer.
    pub(crate) async fn new(client: &async_nats::Client) -> Result<Self, StoreError> {
        let prefix = client.new_inbox();
        let mut subscription = client
            .subscribe(format!("{prefix}.*"))
            .await
            .map_err(|e| unavailable("subscribe replies", e))?;
        let waiting = Arc::new(Waiting::default());
        let task = tokio::spawn({
            let waiting = Arc::clone(&waiting);
            async move {
                while let Some(reply) = subscription.next().await {
                    let token = reply
                        .subject
                        .rsplit('.')
                        .next()
                        .and_then(|t| t.parse::<u64>().ok());
                    // Sent under the lock (an unbounded send never waits), without a clone of
                    // the sender per reply; a request that stopped waiting is not in the map.
                    if let Some(token) = token
                        && let Some(to) = waiting.lock().get(&token)
                    {
                        let _ = to.send(reply);
                    }
                }
                // The connection closed for good: every waiting request's replies end.
                waiting.lock().clear();
            }
        });
        Ok(Self(Arc::new(Shared {
            prefix,
            next: AtomicU64::new(0),
            waiting,
            task,
        })))
    }

    /// A new request's reply subject and the receiver of its replies, registered until dropped.
    pub(crate) fn register(&self) -> Pending {
        let token = self.0.next.fetch_add(1, Ordering::Relaxed);
        let (to, replies) = mpsc::unbounded_channel();
        self.0.waiting.lock().insert(token, to);
        Pending {
            subject: format!("{}.{token}", self.0.prefix),
            token,
            replies,
            waiting: Arc::clone(&self.0.waiting),
        }
    }
}

/// A registered request: its reply subject and its replies, in the order they came.
pub(crate) struct Pending {
    pub(crate) subject: String,
    token: u64,
    replies: mpsc::UnboundedReceiver<async_nats::Message>,
    waiting: Arc<Waiting>,
}

impl Pending {
    /// The next reply; `None` once the connection has closed for good.
    pub(crate) async fn next(&mut self) -> Option<async_nats::Message> {
        self.replies.recv().await
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.waiting.lock().remove(&self.token);
    }
}
