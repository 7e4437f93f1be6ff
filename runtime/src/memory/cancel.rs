//! In-process cancellation: a map of tokens registered by runners.

use std::collections::HashMap;

use async_trait::async_trait;
use parking_lot::Mutex;
use protocol::ExecutionId;
use tokio_util::sync::CancellationToken;

use crate::cancel::CancelBus;
use crate::error::StoreError;

/// See the module docs.
#[derive(Default)]
pub struct MemoryCancelBus {
    tokens: Mutex<HashMap<ExecutionId, CancellationToken>>,
}

impl std::fmt::Debug for MemoryCancelBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryCancelBus").finish_non_exhaustive()
    }
}

impl MemoryCancelBus {
    pub fn new() -> Self {
        Self::default()
    }

    /// Executions being watched (for tests: must return to zero).
    pub fn watched(&self) -> usize {
        self.tokens.lock().len()
    }
}

#[async_trait]
impl CancelBus for MemoryCancelBus {
    fn watch(&self, id: ExecutionId) -> CancellationToken {
        self.tokens.lock().entry(id).or_default().clone()
    }

    fn unwatch(&self, id: ExecutionId) {
        self.tokens.lock().remove(&id);
    }

    async fn request(&self, id: ExecutionId) -> Result<(), StoreError> {
        if let Some(token) = self.tokens.lock().get(&id) {
            token.cancel();
        }
        Ok(())
    }
}
