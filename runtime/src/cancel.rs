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
///
/// Watching is local to the process: an implementation keeps its tokens in [`Watches`] and
/// only carries requests to the process that watches.
#[async_trait]
pub trait CancelBus: Send + Sync + 'static {
    /// The tokens of the executions this process watches.
    fn watches(&self) -> &Watches;

    fn watch(&self, id: ExecutionId) -> CancellationToken {
        self.watches().watch(id)
    }

    fn unwatch(&self, id: ExecutionId) {
        self.watches().unwatch(id);
    }

    async fn request(&self, id: ExecutionId) -> Result<(), StoreError>;
}

/// Cancel tokens of the executions this process runs, reference-counted per execution so that a
/// duplicate delivery that watches and then drops out never disarms the live attempt's token.
#[derive(Debug, Default)]
pub struct Watches {
    tokens: parking_lot::Mutex<std::collections::HashMap<ExecutionId, (CancellationToken, usize)>>,
}

impl Watches {
    pub fn watch(&self, id: ExecutionId) -> CancellationToken {
        let mut tokens = self.tokens.lock();
        let entry = tokens
            .entry(id)
            .or_insert_with(|| (CancellationToken::new(), 0));
        entry.1 += 1;
        entry.0.clone()
    }

    pub fn unwatch(&self, id: ExecutionId) {
        let mut tokens = self.tokens.lock();
        if let Some(entry) = tokens.get_mut(&id) {
            entry.1 = entry.1.saturating_sub(1);
            if entry.1 == 0 {
                tokens.remove(&id);
            }
        }
    }

    /// Cancels the execution's token if it is watched here.
    pub fn cancel(&self, id: ExecutionId) {
        if let Some((token, _)) = self.tokens.lock().get(&id) {
            token.cancel();
        }
    }

    /// Executions watched here.
    pub fn len(&self) -> usize {
        self.tokens.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
