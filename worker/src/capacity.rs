//! How many executions one process runs at once: what its providers allow, never a multiple
//! of its cores.
//!
//! Model calls are I/O-bound: an execution spends its life waiting on a remote provider and
//! almost no CPU, so a core-based rule (the old default, 2 × cores) left a 2-core process
//! running 4 model calls at once. A process therefore takes as many jobs as its providers can
//! run together (the sum of their `max_concurrency`), at most the deployment's
//! `max_active_executions`, and at most the operator's optional cap (`--workers` /
//! `MODEL_RUNTIME_WORKERS`). An idle slot is one semaphore permit, so thousands cost nothing;
//! a running execution costs its task and buffers.
//!
//! The one decision a reader must know: a job waiting in a provider's own queue
//! (`max_queue_depth`) is not counted. Those queues absorb bursts of one provider while
//! others are idle; taking more jobs than all providers can run would hold work in this
//! process that another worker could start at once.

use crate::registry::ProviderRegistry;

/// Concurrent executions for a process with `registry`'s providers, the deployment's
/// `max_active_executions` and the operator's optional `cap`; at least 1.
pub fn concurrency(registry: &ProviderRegistry, max_active: usize, cap: Option<usize>) -> usize {
    registry
        .total_concurrency()
        .min(max_active)
        .min(cap.unwrap_or(usize::MAX))
        .max(1)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::provider::mock::{MockConfig, MockProvider};

    fn registry(concurrencies: &[u32]) -> ProviderRegistry {
        let mut registry = ProviderRegistry::new();
        for (i, &c) in concurrencies.iter().enumerate() {
            let provider = MockProvider::new(MockConfig {
                id: format!("mock-{i}"),
                ..MockConfig::default()
            });
            registry.register(Arc::new(provider), c, 0).unwrap();
        }
        registry
    }

    #[test]
    fn the_providers_capacity_sets_it_not_the_cores() {
        assert_eq!(concurrency(&registry(&[128]), 1024, None), 128);
        assert_eq!(concurrency(&registry(&[16, 64, 4]), 1024, None), 84);
    }

    #[test]
    fn max_active_executions_and_the_cap_bound_it() {
        assert_eq!(concurrency(&registry(&[4096]), 1024, None), 1024);
        assert_eq!(concurrency(&registry(&[4096]), 1024, Some(32)), 32);
        assert_eq!(concurrency(&registry(&[8]), 1024, Some(32)), 8);
        assert_eq!(concurrency(&registry(&[]), 1024, None), 1);
    }
}
