//! In-process cancellation: reference-counted tokens registered by runners.

use async_trait::async_trait;
use protocol::ExecutionId;

use crate::cancel::{CancelBus, Watches};
use crate::error::StoreError;

/// See the module docs.
#[derive(Debug, Default)]
pub struct MemoryCancelBus {
    watches: Watches,
}

impl MemoryCancelBus {
    pub fn new() -> Self {
        Self::default()
    }

    /// Executions being watched (for tests: must return to zero).
    pub fn watched(&self) -> usize {
        self.watches.len()
    }
}

#[async_trait]
impl CancelBus for MemoryCancelBus {
    fn watches(&self) -> &Watches {
        &self.watches
    }

    async fn request(&self, id: ExecutionId) -> Result<(), StoreError> {
        self.watches.cancel(id);
        Ok(())
    }
}
