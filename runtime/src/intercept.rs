//! One delegating event store and one delegating job queue for tests that interfere with a
//! few operations (feature `test-support`).
//!
//! A test that needs a store which fails, waits or records on one or two operations implements
//! [`Intercept`] for its own struct: it names the store it wraps ([`Intercept::inner`]) and
//! overrides only the operations it interferes with. Every [`Intercept`] is an [`EventStore`].
//! [`QueueIntercept`] does the same for a [`JobQueue`].

use async_trait::async_trait;
use protocol::materialize::Materializer;
use protocol::{ExecutionId, RuntimeEvent, Sequence, Tenant};

use crate::error::StoreError;
use crate::event_store::{
    EventRecord, EventStore, LogHead, ReadResult, RunError, SubscribeResult, WriterId,
    append_one_by_one,
};
use crate::job::{Deliveries, Delivery, Job, JobQueue, QueuedJob};

/// An [`EventStore`] that forwards to an inner store except where the implementation says
/// otherwise.
///
/// Contract:
/// - The operations every store implements (`create_owned`, `owner`, `append_as`, `state`,
///   `read`, `subscribe`, `ready`) forward to [`Intercept::inner`] unchanged unless overridden,
///   once [`Intercept::available`] allows it. An override does its own checks.
/// - The operations `EventStore` derives from those keep its defaults, built on *this*
///   wrapper's operations, so interfering with an operation also covers what is built on it:
///   `append_run_as` appends one by one through [`Intercept::append_as`], `head` materializes
///   through [`Intercept::state`], `latest_head` is `head`, `heads` asks `head` for each log,
///   and `create`, `append` and `owned_state` go through `create_owned`, `append_as`, `state`
///   and `owner`.
///   `pipelines_appends` is `false`. A wrapper that wants the inner store's own version (one
///   message per run, a cheap head) overrides the operation and forwards it.
///
/// Its operations share the names of [`EventStore`]'s: write the implementation by path
/// (`impl runtime::intercept::Intercept for MyStore`) and use the wrapper as an `EventStore`;
/// with both traits imported, calls on the wrapper are ambiguous.
#[async_trait]
pub trait Intercept: Send + Sync + 'static {
    /// The store every operation not overridden goes to.
    fn inner(&self) -> &dyn EventStore;

    /// Checked before every operation that is forwarded to [`Intercept::inner`]: an error is
    /// returned in the operation's place (an outage). By default every operation is served.
    fn available(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// [`EventStore::create_owned`].
    async fn create_owned(&self, accepted: RuntimeEvent, owner: &Tenant) -> Result<(), StoreError> {
        self.available()?;
        self.inner().create_owned(accepted, owner).await
    }

    /// [`EventStore::owner`].
    async fn owner(&self, id: ExecutionId) -> Result<Option<Tenant>, StoreError> {
        self.available()?;
        self.inner().owner(id).await
    }

    /// [`EventStore::append_as`].
    async fn append_as(&self, event: RuntimeEvent, writer: WriterId) -> Result<(), StoreError> {
        self.available()?;
        self.inner().append_as(event, writer).await
    }

    /// [`EventStore::append_run_as`]: by default one by one through [`Intercept::append_as`].
    async fn append_run_as(&self, run: &[EventRecord], writer: WriterId) -> Result<(), RunError> {
        append_one_by_one(run, |event| self.append_as(event, writer)).await
    }

    /// [`EventStore::pipelines_appends`]: by default `false`.
    fn pipelines_appends(&self) -> bool {
        false
    }

    /// [`EventStore::state`].
    async fn state(&self, id: ExecutionId) -> Result<Option<Materializer>, StoreError> {
        self.available()?;
        self.inner().state(id).await
    }

    /// [`EventStore::head`]: by default the head of [`Intercept::state`].
    async fn head(&self, id: ExecutionId) -> Result<Option<LogHead>, StoreError> {
        Ok(self.state(id).await?.as_ref().map(LogHead::of))
    }

    /// [`EventStore::latest_head`]: by default [`Intercept::head`].
    async fn latest_head(&self, id: ExecutionId) -> Result<Option<LogHead>, StoreError> {
        self.head(id).await
    }

    /// [`EventStore::read`].
    async fn read(&self, id: ExecutionId, after: Sequence, limit: usize) -> ReadResult {
        self.available()?;
        self.inner().read(id, after, limit).await
    }

    /// [`EventStore::subscribe`].
    async fn subscribe(&self, id: ExecutionId, after: Sequence) -> SubscribeResult {
        self.available()?;
        self.inner().subscribe(id, after).await
    }

    /// [`EventStore::ready`].
    async fn ready(&self) -> Result<(), StoreError> {
        self.available()?;
        self.inner().ready().await
    }
}

#[async_trait]
impl<T: Intercept> EventStore for T {
    async fn create_owned(&self, accepted: RuntimeEvent, owner: &Tenant) -> Result<(), StoreError> {
        Intercept::create_owned(self, accepted, owner).await
    }

    async fn owner(&self, id: ExecutionId) -> Result<Option<Tenant>, StoreError> {
        Intercept::owner(self, id).await
    }

    async fn append_as(&self, event: RuntimeEvent, writer: WriterId) -> Result<(), StoreError> {
        Intercept::append_as(self, event, writer).await
    }

    async fn append_run_as(&self, run: &[EventRecord], writer: WriterId) -> Result<(), RunError> {
        Intercept::append_run_as(self, run, writer).await
    }

    fn pipelines_appends(&self) -> bool {
        Intercept::pipelines_appends(self)
    }

    async fn state(&self, id: ExecutionId) -> Result<Option<Materializer>, StoreError> {
        Intercept::state(self, id).await
    }

    async fn head(&self, id: ExecutionId) -> Result<Option<LogHead>, StoreError> {
        Intercept::head(self, id).await
    }

    async fn latest_head(&self, id: ExecutionId) -> Result<Option<LogHead>, StoreError> {
        Intercept::latest_head(self, id).await
    }

    async fn read(&self, id: ExecutionId, after: Sequence, limit: usize) -> ReadResult {
        Intercept::read(self, id, after, limit).await
    }

    async fn subscribe(&self, id: ExecutionId, after: Sequence) -> SubscribeResult {
        Intercept::subscribe(self, id, after).await
    }

    async fn ready(&self) -> Result<(), StoreError> {
        Intercept::ready(self).await
    }
}

/// A [`JobQueue`] that forwards to an inner queue except where the implementation says
/// otherwise.
///
/// Contract:
/// - The operations every queue implements (`publish`, `withdraw`, `receive`, `close`, `ready`,
///   `scan`) forward to [`QueueIntercept::inner`] unchanged unless overridden.
/// - `receive_up_to` asks [`QueueIntercept::receive`] for one delivery unless overridden, and
///   the other operations keep `JobQueue`'s defaults, built on this wrapper's: one partition,
///   one source, `receive_from` and `take_from` are `receive_up_to`, `scan_partition` is
///   `scan`, and `held_span` says nothing. A queue that needs partitions of its own
///   implements `JobQueue` itself.
///
/// As for [`Intercept`], write the implementation by path
/// (`impl runtime::intercept::QueueIntercept for MyQueue`) and use the wrapper as a `JobQueue`.
#[async_trait]
pub trait QueueIntercept: Send + Sync + 'static {
    /// The queue every operation not overridden goes to.
    fn inner(&self) -> &dyn JobQueue;

    /// [`JobQueue::publish`].
    async fn publish(&self, job: &Job) -> Result<(), StoreError> {
        self.inner().publish(job).await
    }

    /// [`JobQueue::withdraw`].
    async fn withdraw(&self, job: &Job) -> Result<(), StoreError> {
        self.inner().withdraw(job).await
    }

    /// [`JobQueue::receive`].
    async fn receive(&self) -> Result<Option<Delivery>, StoreError> {
        self.inner().receive().await
    }

    /// [`JobQueue::receive_up_to`]: one delivery of [`QueueIntercept::receive`].
    async fn receive_up_to(&self, _max: usize) -> Result<Option<Deliveries>, StoreError> {
        use futures_util::StreamExt;
        Ok(QueueIntercept::receive(self)
            .await?
            .map(|delivery| futures_util::stream::iter([Ok(delivery)]).boxed()))
    }

    /// [`JobQueue::close`].
    fn close(&self) {
        self.inner().close();
    }

    /// [`JobQueue::ready`].
    async fn ready(&self) -> Result<(), StoreError> {
        self.inner().ready().await
    }

    /// [`JobQueue::scan`].
    async fn scan(&self, after: u64, limit: usize) -> Result<Vec<QueuedJob>, StoreError> {
        self.inner().scan(after, limit).await
    }
}

#[async_trait]
impl<T: QueueIntercept> JobQueue for T {
    async fn publish(&self, job: &Job) -> Result<(), StoreError> {
        QueueIntercept::publish(self, job).await
    }

    async fn withdraw(&self, job: &Job) -> Result<(), StoreError> {
        QueueIntercept::withdraw(self, job).await
    }

    async fn receive(&self) -> Result<Option<Delivery>, StoreError> {
        QueueIntercept::receive(self).await
    }

    async fn receive_up_to(&self, max: usize) -> Result<Option<Deliveries>, StoreError> {
        QueueIntercept::receive_up_to(self, max).await
    }

    fn close(&self) {
        QueueIntercept::close(self);
    }

    async fn ready(&self) -> Result<(), StoreError> {
        QueueIntercept::ready(self).await
    }

    async fn scan(&self, after: u64, limit: usize) -> Result<Vec<QueuedJob>, StoreError> {
        QueueIntercept::scan(self, after, limit).await
    }
}
