//! Cancellation signalling to whichever process is running an execution.

use async_trait::async_trait;
use protocol::ExecutionId;
use tokio_util::sync::CancellationToken;

use crate::error::StoreError;

/// Carries cancel requests to the runner of an execution.
///
/// Queued executions are cancelled by appending the terminal event directly (compare-and-set
/// at sequence 2), so the bus only matters once a runner has claimed the log.
///
/// Contract (checked by `contract::cancel_suite`):
/// - `watch(id)` is called by the runner *before* it claims the log; the returned token is
///   cancelled by any later `request(id)`, from any process.
/// - `request(id)` for an execution nobody watches is a no-op (the execution is either queued,
///   handled by the log, or already terminal).
/// - `unwatch(id)` after the runner has appended the terminal event releases resources.
#[async_trait]
pub trait CancelBus: Send + Sync + 'static {
    fn watch(&self, id: ExecutionId) -> CancellationToken;
    fn unwatch(&self, id: ExecutionId);
    async fn request(&self, id: ExecutionId) -> Result<(), StoreError>;
}
