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
#[derive(Clone, derive_more::Debug)]
pub struct RedisIdempotencyStore {
    #[debug(skip)]
    conn: ConnectionManager,
    prefix: String,
    ttl: Duration,
}

/// A stored record, decoded.
fn decode(text: &str) -> Result<IdempotencyRecord, StoreError> {
    serde_json::from_str(text)
        .map_err(|_| StoreError::Unavailable("redis: undecodable idempotency record".into()))
}

fn unavailable(e: &redis::RedisError) -> StoreError {
    match denied(e) {
        Some(why) => StoreError::Unavailable(format!("redis: {why}")),
        None => StoreError::Unavailable(format!("redis: {e}")),
    }
}

/// The words for a server that refuses this client outright (`DENIED`: protected mode, a
/// server without a password that accepts only loopback clients). The client skips its
/// `CLIENT SETINFO` handshake (feature `disable-client-setinfo`): that handshake's ignored
/// reply swallowed the `DENIED` line, and the next command then failed as "broken pipe".
fn denied(e: &redis::RedisError) -> Option<&'static str> {
    (e.code() == Some("DENIED")).then_some(
        "the server refused this client (DENIED: protected mode, which accepts only loopback \
         clients of a server without a password); give Redis a password (and put it in \
         REDIS_URL) or configure its protected-mode and bind settings",
    )
}

/// Runs one Redis call within [`CALL_TIMEOUT`]; failures and timeouts are `Unavailable`.
pub(crate) async fn bounded<T>(
    f: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(CALL_TIMEOUT, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(unavailable(&e)),
        Err(_) => Err(StoreError::Unavailable("redis: timed out".into())),
    }
}

impl RedisIdempotencyStore {
    /// Connects to `url` trusting the system's roots for `rediss://`; see
    /// [`RedisIdempotencyStore::connect_with`].
    pub async fn connect(
        url: &str,
        namespace: &str,
        ttl: Duration,
        connect_timeout: Duration,
    ) -> Result<Self, StoreError> {
        Self::connect_with(url, None, namespace, ttl, connect_timeout).await
    }

    /// Connects to `url` (`redis://[user:password@]host:port`, or `rediss://` for TLS, whose
    /// server certificate must chain to the PEM certificates in `ca_file` when given), retrying
    /// an unreachable server for up to `connect_timeout`, and checks access with a `PING`.
    /// Refused credentials and TLS failures end at once with `Misconfigured`. Afterwards the
    /// connection reconnects by itself.
    pub async fn connect_with(
        url: &str,
        ca_file: Option<&std::path::Path>,
        namespace: &str,
        ttl: Duration,
        connect_timeout: Duration,
    ) -> Result<Self, StoreError> {
        let client = open_client(url, ca_file)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Duration::from_secs(1))
            .set_response_timeout(CALL_TIMEOUT)
            .set_number_of_retries(2)
            .set_max_delay(1000);
        let deadline = tokio::time::Instant::now() + connect_timeout;
        loop {
            let attempt = async {
                let mut conn =
                    ConnectionManager::new_with_config(client.clone(), config.clone()).await?;
                // Without a password a server that requires one accepts the connection and
                // refuses the first command.
                let _: String = redis::cmd("PING").query_async(&mut conn).await?;
                Ok::<_, redis::RedisError>(conn)
            };
            match attempt.await {
                Ok(conn) => {
                    return Ok(Self {
                        conn,
                        prefix: format!("{namespace}:idem:"),
                        ttl,
                    });
                }
                Err(e) => {
                    if let Some(message) = fatal(&e) {
                        return Err(StoreError::Misconfigured(message));
                    }
                    if tokio::time::Instant::now() >= deadline {
                        return Err(unavailable(&e));
                    }
                    tracing::warn!(error = %e, "redis not reachable yet; retrying");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }
    }
}

/// The client for `url`, with `ca_file`'s roots for TLS. Errors never echo the URL.
fn open_client(url: &str, ca_file: Option<&std::path::Path>) -> Result<redis::Client, StoreError> {
    let invalid = |_| StoreError::Unavailable("redis: invalid URL".into());
    let tls = url.starts_with("rediss://");
    if tls {
        crate::tls::install_crypto_provider();
    }
    match ca_file {
        None => redis::Client::open(url).map_err(invalid),
        Some(_) if !tls => Err(StoreError::Misconfigured(
            "REDIS_CA is set but REDIS_URL is not rediss://".into(),
        )),
        Some(path) => {
            // Checked here, so a bad file is named as such rather than as a failed handshake.
            crate::tls::read_certificates("REDIS_CA", path)?;
            let root_cert = crate::tls::read("REDIS_CA", path)?;
            redis::Client::build_with_tls(
                url,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(root_cert),
                },
            )
            .map_err(invalid)
        }
    }
}

/// The startup failure retrying cannot fix, worded without a secret: refused credentials or a
/// failed TLS handshake.
fn fatal(e: &redis::RedisError) -> Option<String> {
    let refused = e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS" | "NOPERM"));
    if refused {
        return Some(
            "Redis refused the credentials; check the user and password in REDIS_URL".into(),
        );
    }
    if let Some(why) = denied(e) {
        return Some(format!("Redis: {why}"));
    }
    crate::tls::tls_failure(e).map(|tls| format!("TLS with Redis failed ({tls}); check REDIS_CA"))
}

impl RedisIdempotencyStore {
    /// The Redis key under which `key_hash` is bound.
    fn stored_key(&self, key_hash: &str) -> String {
        format!("{}{key_hash}", self.prefix)
    }

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
        cmd.arg(self.stored_key(key_hash))
            .arg(value)
            .arg("NX")
            .arg("GET")
            .arg("PX")
            .arg(ttl_ms);
        let previous: Option<String> = bounded(cmd.query_async(&mut conn)).await?;
        previous.map(|text| decode(&text)).transpose()
    }

    async fn bound(&self, key_hash: &str) -> Result<Option<IdempotencyRecord>, StoreError> {
        let mut conn = self.conn.clone();
        let mut cmd = redis::cmd("GET");
        cmd.arg(self.stored_key(key_hash));
        let value: Option<String> = bounded(cmd.query_async(&mut conn)).await?;
        value.map(|text| decode(&text)).transpose()
    }

    async fn release(&self, key_hash: &str, execution_id: ExecutionId) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let script = redis::Script::new(RELEASE);
        let mut invocation = script.key(self.stored_key(key_hash));
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A server that answers every connection as Redis in protected mode does to a client
    /// that is not on loopback: one `DENIED` error line, then it closes the connection.
    async fn protected_mode_server() -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let _ = socket
                    .write_all(
                        b"-DENIED Redis is running in protected mode because protected mode is \
                          enabled and no password is set for the default user.\r\n",
                    )
                    .await;
                let _ = socket.shutdown().await;
            }
        });
        addr
    }

    #[tokio::test]
    async fn a_server_in_protected_mode_is_named_as_refusing_this_client() {
        let addr = protected_mode_server().await;
        let url = format!("redis://{addr}");
        let refused = RedisIdempotencyStore::connect(
            &url,
            "t",
            Duration::from_secs(60),
            Duration::from_secs(5),
        )
        .await
        .expect_err("refused");
        let StoreError::Misconfigured(message) = refused else {
            panic!("not named as a refusal: {refused:?}");
        };
        assert!(message.contains("DENIED"), "{message}");
        assert!(message.contains("protected-mode"), "{message}");
        assert!(!message.contains("broken pipe"), "{message}");
    }
}
