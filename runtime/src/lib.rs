//! Storage and messaging contracts of the execution runtime, and their in-memory implementations.
//!
//! Module map:
//! - [`backoff`]: `Backoff`, the pauses between tries of a transiently failing backend
//!   operation (short, so a write resumes soon after a JetStream leader election).
//! - [`error`]: `StoreError`, one error type for every backend, each variant tagged with its
//!   portable code and retryability where it is created.
//! - [`event_store`]: the `EventStore` trait (append-only, compare-and-set fenced logs),
//!   `EventRecord` (an event with its serialized JSON, shared by every reader) and subscriptions.
//! - [`job`]: `Job`, the `JobQueue` trait and delivery acknowledgement.
//! - [`idempotency`]: the `IdempotencyStore` trait (one atomic claim per key).
//! - [`cancel`]: the `CancelBus` trait that carries cancellation to the process running an
//!   execution.
//! - [`ended`]: the one log line of an execution's end, written by whoever stored its terminal
//!   event (a `warn` with the portable code for a failure).
//! - [`deadline`]: `DeadlineSweeper`, which closes executions whose deadline passed while no
//!   worker ran them (every gateway and worker process runs one).
//! - [`writer`]: `EventWriter`, the only place sequences and event times are assigned; the
//!   worker's runner and the gateway's submission flow both write through it.
//! - [`pace`]: `Pace`, how long a pipelined writer holds output between appends (off, fixed,
//!   or adaptive: only while the store's acknowledgements are slow).
//! - [`memory`]: in-process implementations of all four, used by embedded mode and tests.
//! - [`nats`]: JetStream event store (split by concern: the store, its stored format, the append
//!   path, the read path), job queue and cancel bus (distributed mode), connected together by
//!   `NatsServices::connect` for the gateway and the worker alike, with the credentials and TLS
//!   of `nats::NatsAccess`.
//! - [`nats_url`]: credentials split out of `NATS_URL`, so no address the client logs holds one.
//! - [`redis_idempotency`]: the Redis idempotency store (distributed mode).
//! - [`quota`]: per-tenant quotas (active executions, submit rate): the `QuotaStore` trait, its
//!   memory and Redis implementations, and `QuotaGate`, which the gateway calls per submit.
//! - [`apart`]: CPU-heavy work on large inputs (parsing, fingerprinting, decoding a job) run
//!   on the blocking pool, so the tasks sharing a runtime thread never wait on it.
//! - [`own_wakes`]: `OwnWakes`, a future polled only when its own waker fired, for the
//!   cancellation waits a task polls beside a stream it wakes for often.
//! - [`lazy_timer`]: `LazyTimer`, a timer whose deadline moves with every message without
//!   taking the runtime's timer lock each time (keep-alives, quiet spells, pace holds).
//! - [`tls`]: the rustls provider, certificate file checks and TLS failures, shared by the
//!   NATS and Redis connections.
//! - `intercept` (feature `test-support`): `Intercept` and `QueueIntercept`, one event store
//!   and one job queue for tests that forward to an inner one and override only the operations
//!   a test interferes with.
//! - `contract` (feature `contract-tests`): the test suite every implementation must pass, so
//!   the NATS and Redis implementations are held to exactly the same behaviour; one file per
//!   trait under test (event store, job queue, idempotency, cancel), the quota suite beside
//!   the quota module.
//!
//! The decision a reader must know: the log rules (sequence `last + 1`, one terminal, nothing
//! after it) are enforced *inside* every store by `protocol::materialize::Materializer`, and
//! appends are compare-and-set on the expected sequence, so a stale or duplicate writer can never
//! interleave, whatever process it runs in.

pub mod apart;
pub mod backoff;
pub mod cancel;
#[cfg(any(test, feature = "contract-tests"))]
pub mod contract;
pub mod deadline;
pub mod ended;
pub mod error;
pub mod event_store;
pub mod idempotency;
#[cfg(any(test, feature = "test-support"))]
pub mod intercept;
pub mod job;
pub mod lazy_timer;
pub mod memory;
pub mod nats;
pub mod nats_url;
pub mod own_wakes;
pub mod pace;
pub mod quota;
pub mod redis_idempotency;
pub mod tls;
pub mod writer;

pub use cancel::CancelBus;
pub use deadline::{DeadlineSweeper, SweepReport, SweeperSettings};
pub use error::StoreError;
pub use event_store::{
    EventRecord, EventStore, EventStream, LogHead, ReadResult, RunError, SubscribeResult, WriterId,
};
pub use idempotency::{IdempotencyRecord, IdempotencyStore};
pub use job::{Deliveries, Delivery, DeliveryHandle, HeldSpan, Job, JobQueue, KeyClaim, QueuedJob};
pub use pace::Pace;
pub use quota::{Admission, AdmitRequest, QuotaGate, QuotaLimits, QuotaStore};
pub use writer::{EventWriter, WriteError, WriteFailure};
