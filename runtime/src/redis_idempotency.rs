//! The Redis idempotency store: one round trip per claim, `SET key value NX GET PX ttl`
//! (Redis 7), under `{ns}:idem:{key_hash}`. The value holds only hashes and the execution id.
//! Every call is bounded by a short timeout, so an outage becomes `Unavailable` (HTTP 503)
//! promptly instead of hanging a submit.

use std::time::Duration;

use async_trait::async_trait;
use protocol::ExecutionId;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::error::StoreError;
use crate::idempotency::{IdempotencyRecord, IdempotencyStore};

/// Bound of one Redis call.
const CALL_TIMEOUT: Duration = Duration::from_millis(1000);

/// Deletes the key only if it still names the execution (compare-and-delete).
const RELEASE: &str = r"
local v = redis.call('GET', KEYS[1])
if v and string.find(v, ARGV[1], 1, true) then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// See the module docs.
#[derive(Clone)]
pub struct RedisIdempotencyStore {
    conn: ConnectionManager,
    prefix: String,
    ttl: Duration,
}

impl std::fmt::Debug for RedisIdempotencyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisIdempotencyStore")
            .field("prefix", &self.prefix)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("redis: {e}"))
}

/// Runs one Redis call within [`CALL_TIMEOUT`]; failures and timeouts are `Unavailable`.
pub(crate) async fn bounded<T>(
    f: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(CALL_TIMEOUT, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(unavailable(e)),
        Err(_) => Err(StoreError::Unavailable("redis: timed out".into())),
    }
}

impl RedisIdempotencyStore {
    /// Connects, retrying for up to `connect_timeout`; afterwards the connection reconnects by
    /// itself.
    pub async fn connect(
        url: &str,
        namespace: &str,
        ttl: Duration,
        connect_timeout: Duration,
    ) -> Result<Self, StoreError> {
        let client = redis::Client::open(url)
            .map_err(|_| StoreError::Unavailable("redis: invalid URL".into()))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Duration::from_secs(1))
            .set_response_timeout(CALL_TIMEOUT)
            .set_number_of_retries(2)
            .set_max_delay(1000);
        let deadline = tokio::time::Instant::now() + connect_timeout;
        let conn = loop {
            match ConnectionManager::new_with_config(client.clone(), config.clone()).await {
                Ok(conn) => break conn,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::warn!(error = %e, "redis not reachable yet; retrying");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => return Err(unavailable(e)),
            }
        };
        Ok(Self {
            conn,
            prefix: format!("{namespace}:idem:"),
            ttl,
        })
    }
}

impl RedisIdempotencyStore {
    /// The store's connection, for other Redis-backed stores of the same deployment (quotas).
    pub fn connection(&self) -> ConnectionManager {
        self.conn.clone()
    }
}

#[async_trait]
impl IdempotencyStore for RedisIdempotencyStore {
    async fn claim(
        &self,
        key_hash: &str,
        record: &IdempotencyRecord,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        let value = serde_json::to_string(record)
            .map_err(|e| StoreError::Unavailable(format!("encode: {e}")))?;
        let ttl_ms = u64::try_from(self.ttl.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let mut conn = self.conn.clone();
        let mut cmd = redis::cmd("SET");
        cmd.arg(format!("{}{key_hash}", self.prefix))
            .arg(value)
            .arg("NX")
            .arg("GET")
            .arg("PX")
            .arg(ttl_ms);
        let previous: Option<String> = bounded(cmd.query_async(&mut conn)).await?;
        match previous {
            None => Ok(None),
            Some(text) => serde_json::from_str(&text).map(Some).map_err(|_| {
                StoreError::Unavailable("redis: undecodable idempotency record".into())
            }),
        }
    }

    async fn release(&self, key_hash: &str, execution_id: ExecutionId) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let script = redis::Script::new(RELEASE);
        let mut invocation = script.key(format!("{}{key_hash}", self.prefix));
        invocation.arg(format!("\"execution_id\":\"{execution_id}\""));
        let _: i64 = bounded(invocation.invoke_async(&mut conn)).await?;
        Ok(())
    }

    async fn ready(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let _: String = bounded(redis::cmd("PING").query_async(&mut conn)).await?;
        Ok(())
    }
}
