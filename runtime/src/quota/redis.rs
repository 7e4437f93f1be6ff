//! Quotas in Redis, shared by every gateway of a deployment: one Lua script per admit, so the
//! bucket check, the slot check and both commits are one atomic step on the server, timed by
//! the server's clock (`TIME`), never a gateway's.
//!
//! Keys, under the deployment's namespace like the idempotency keys:
//! - `{ns}:quota:{tenant}:active`: sorted set of slot holders (execution ids) scored by their
//!   expiry in server milliseconds; expired members are dropped by the next admit, and the key
//!   expires with its last member.
//! - `{ns}:quota:{tenant}:bucket`: hash `tokens`, `sec`, `usec` (the server time of the last
//!   take); it expires once the bucket would be full again, which is what a missing key means.
//!
//! The script is loaded once at construction and invoked by `EVALSHA` (reloaded by the client
//! if the server lost it, e.g. after a restart). The connection is the idempotency store's, so
//! it shares its address, credentials and reconnection.

use std::time::Duration;

use async_trait::async_trait;
use protocol::{ExecutionId, Tenant};
use redis::Script;
use redis::aio::ConnectionManager;

use super::{ACTIVE_RETRY_AFTER, Admission, AdmitRequest, QuotaStore};
use crate::error::StoreError;
use crate::redis_idempotency::bounded;

/// Longest hold or bucket lifetime the script is given, in ms (about 31 years): keeps every
/// number an exact integer in Lua's doubles.
const MAX_MS: u64 = 1_000_000_000_000;

/// KEYS: slot set, bucket. ARGV: execution id, hold ms, max active (-1: none), tokens per
/// second (0: no bucket), burst. Returns `{0, 0}` admitted, `{1, wait_ms}` rate limited,
/// `{2, 0}` at the active limit. Nothing is written unless the admit succeeds, except dropping
/// expired slots.
const ADMIT: &str = r"
local t = redis.call('TIME')
local sec, usec = tonumber(t[1]), tonumber(t[2])
local now_ms = sec * 1000 + math.floor(usec / 1000)
local hold = tonumber(ARGV[2])
local max_active = tonumber(ARGV[3])
local rate = tonumber(ARGV[4])
local burst = tonumber(ARGV[5])
if max_active >= 0 then
  local held = redis.call('ZSCORE', KEYS[1], ARGV[1])
  if held and tonumber(held) > now_ms then
    return {0, 0}
  end
end
local tokens = nil
if rate > 0 then
  local b = redis.call('HMGET', KEYS[2], 'tokens', 'sec', 'usec')
  tokens = burst
  if b[1] and b[2] and b[3] then
    local elapsed = (sec - tonumber(b[2])) + (usec - tonumber(b[3])) / 1000000
    if elapsed < 0 then elapsed = 0 end
    tokens = math.min(burst, tonumber(b[1]) + elapsed * rate)
  end
  if tokens < 1 then
    return {1, math.min(math.ceil((1 - tokens) / rate * 1000), 1000000000000)}
  end
end
if max_active >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
  if redis.call('ZCARD', KEYS[1]) >= max_active then
    return {2, 0}
  end
  redis.call('ZADD', KEYS[1], string.format('%d', now_ms + hold), ARGV[1])
  if redis.call('PTTL', KEYS[1]) < hold then
    redis.call('PEXPIRE', KEYS[1], string.format('%d', hold))
  end
end
if tokens then
  local full_ms = math.min(math.ceil(burst / rate * 1000) + 1000, 1000000000000)
  redis.call('HSET', KEYS[2], 'tokens', string.format('%.17g', tokens - 1), 'sec', t[1], 'usec', t[2])
  redis.call('PEXPIRE', KEYS[2], string.format('%d', full_ms))
end
return {0, 0}
";

/// See the module docs.
#[derive(Clone, derive_more::Debug)]
pub struct RedisQuotaStore {
    #[debug(skip)]
    conn: ConnectionManager,
    prefix: String,
    #[debug(skip)]
    admit: Script,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).min(MAX_MS)
}

impl RedisQuotaStore {
    /// Uses `conn` (see `RedisIdempotencyStore::connection`) and loads the script, so a server
    /// that cannot run it fails at startup rather than on the first submit.
    pub async fn new(conn: ConnectionManager, namespace: &str) -> Result<Self, StoreError> {
        let admit = Script::new(ADMIT);
        let mut loader = conn.clone();
        let _: String = bounded(admit.prepare_invoke().load_async(&mut loader)).await?;
        Ok(Self {
            conn,
            prefix: format!("{namespace}:quota:"),
            admit,
        })
    }

    fn active_key(&self, tenant: &Tenant) -> String {
        format!("{}{tenant}:active", self.prefix)
    }

    fn bucket_key(&self, tenant: &Tenant) -> String {
        format!("{}{tenant}:bucket", self.prefix)
    }
}

#[async_trait]
impl QuotaStore for RedisQuotaStore {
    async fn admit(&self, request: AdmitRequest<'_>) -> Result<Admission, StoreError> {
        let max_active = request
            .limits
            .max_active
            .map_or(-1, |m| i64::try_from(m).unwrap_or(i64::MAX));
        let (per_second, burst) = request
            .limits
            .rate
            .map_or((0.0, 0), |r| (r.per_second(), r.burst()));
        let mut invocation = self.admit.key(self.active_key(request.tenant));
        invocation
            .key(self.bucket_key(request.tenant))
            .arg(request.execution.to_string())
            .arg(millis(request.hold).max(1))
            .arg(max_active)
            .arg(per_second.to_string())
            .arg(burst);
        let mut conn = self.conn.clone();
        let (outcome, wait_ms): (i64, u64) = bounded(invocation.invoke_async(&mut conn)).await?;
        match outcome {
            0 => Ok(Admission::Admitted),
            1 => Ok(Admission::RateLimited {
                retry_after: Duration::from_millis(wait_ms.max(1)),
            }),
            2 => Ok(Admission::ActiveLimit {
                retry_after: ACTIVE_RETRY_AFTER,
            }),
            other => Err(StoreError::Unavailable(format!(
                "redis: unexpected quota script answer {other}"
            ))),
        }
    }

    async fn release(&self, tenant: &Tenant, executions: &[ExecutionId]) -> Result<(), StoreError> {
        if executions.is_empty() {
            return Ok(());
        }
        let mut cmd = redis::cmd("ZREM");
        cmd.arg(self.active_key(tenant));
        for id in executions {
            cmd.arg(id.to_string());
        }
        let mut conn = self.conn.clone();
        let _: i64 = bounded(cmd.query_async(&mut conn)).await?;
        Ok(())
    }

    async fn holders(&self, tenant: &Tenant, limit: usize) -> Result<Vec<ExecutionId>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let last = i64::try_from(limit).unwrap_or(i64::MAX) - 1;
        let mut conn = self.conn.clone();
        let mut cmd = redis::cmd("ZRANGE");
        cmd.arg(self.active_key(tenant)).arg(0).arg(last);
        let members: Vec<String> = bounded(cmd.query_async(&mut conn)).await?;
        // Members are only ever written by `admit`, as execution ids; anything else is not ours
        // to interpret and is skipped (it expires with the key).
        Ok(members.iter().filter_map(|m| m.parse().ok()).collect())
    }
}
