//! Who holds an execution whose job was redelivered while its log is open.
//!
//! A job is redelivered when its lease lapses: the queue got no heartbeat for it. That is
//! not proof that its worker stopped. A consumer leader election (the new leader times the
//! leases afresh and never saw the old leader's heartbeats) or a partition between the worker
//! and the leader (the worker, healthy, heartbeats into the void) lapse the lease of a live
//! holder too. Writing "its worker stopped heartbeating" and closing the log then fails a
//! healthy execution under a false cause. So before the runner closes such a log it asks:
//! - **Is it running here?** This process's own attempt of the execution is alive: the
//!   redelivery waits for it to close the log (its delivery heartbeated meanwhile) and is then
//!   acknowledged; nothing is written for it.
//! - **Is it still being written?** With a lease to go by (a queue whose deliveries lapse),
//!   a log whose last event is younger than one lease has a holder that was alive a lease
//!   ago: the redelivery waits until the log closes or falls silent for a whole lease.
//! - **Did this process give it up?** An attempt here that gave its job back because the
//!   event store stayed unreachable is remembered (a bounded set), so its redelivery names
//!   that cause instead of a stopped worker.
//!
//! The one decision: waiting is bounded by the log's silence and the deadline, never by a
//! heartbeat the waiting delivery cannot see, so a holder that really is gone costs at most
//! one lease more than before.
//!
//! The same record of what runs here is how a shutdown interrupts it: [`Holders::cancel_all`]
//! cancels the token of every execution running here, so a running execution waits on its own
//! token alone and never polls one shared by the whole process (a lock every execution would
//! take on every wake-up).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use protocol::{ExecutionId, Timestamp};
use runtime::LogHead;
use tokio_util::sync::CancellationToken;

/// How often a waiting redelivery reads the log's head.
pub const POLL: Duration = Duration::from_millis(500);

/// How many executions given up here are remembered (oldest forgotten first).
const GAVE_UP_REMEMBERED: usize = 4096;

/// Whether the log's last event is younger than `lease` (by the wall clock: event times are
/// the writers' wall clocks).
pub fn written_within(head: &LogHead, lease: Duration) -> bool {
    let age = Timestamp::now().unix_millis() - head.last_time.unix_millis();
    i64::try_from(lease.as_millis()).is_ok_and(|lease| age < lease)
}

/// See the module docs.
#[derive(Default, Clone, derive_more::Debug)]
pub struct Holders {
    #[debug(skip)]
    inner: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    /// Attempts running here, per execution, and the execution's cancel token.
    running: HashMap<ExecutionId, (usize, CancellationToken)>,
    gave_up: HashSet<ExecutionId>,
    gave_up_order: VecDeque<ExecutionId>,
}

/// Marks an execution as running here while it lives.
#[derive(Debug)]
pub struct Running {
    holders: Holders,
    id: ExecutionId,
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut state = self.holders.inner.lock();
        if let Some((count, _)) = state.running.get_mut(&self.id) {
            *count -= 1;
            if *count == 0 {
                state.running.remove(&self.id);
            }
        }
    }
}

impl Holders {
    /// Marks `id` as running here until the returned guard is dropped; [`Holders::cancel_all`]
    /// cancels `cancel` meanwhile. Attempts of one execution share its cancel token (the cancel
    /// bus's), so the first one's is kept.
    pub fn running(&self, id: ExecutionId, cancel: &CancellationToken) -> Running {
        self.inner
            .lock()
            .running
            .entry(id)
            .or_insert_with(|| (0, cancel.clone()))
            .0 += 1;
        Running {
            holders: self.clone(),
            id,
        }
    }

    pub fn is_running(&self, id: ExecutionId) -> bool {
        self.inner.lock().running.contains_key(&id)
    }

    /// Cancels every execution running here now. One marked running later is not: whoever
    /// calls this first makes the interruption visible otherwise (the runner cancels its
    /// `abort_all` token before, and checks it after marking an execution running).
    pub fn cancel_all(&self) {
        for (_, cancel) in self.inner.lock().running.values() {
            cancel.cancel();
        }
    }

    /// Remembers that an attempt here gave `id`'s job back (its event store was unreachable).
    pub fn gave_up(&self, id: ExecutionId) {
        let mut state = self.inner.lock();
        if state.gave_up.insert(id) {
            state.gave_up_order.push_back(id);
            if state.gave_up_order.len() > GAVE_UP_REMEMBERED
                && let Some(oldest) = state.gave_up_order.pop_front()
            {
                state.gave_up.remove(&oldest);
            }
        }
    }

    /// Whether an attempt here gave `id`'s job back because its event store was unreachable.
    pub fn gave_up_unreachable(&self, id: ExecutionId) -> bool {
        self.inner.lock().gave_up.contains(&id)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use protocol::Sequence;

    fn head_written(ago_ms: i64) -> LogHead {
        LogHead {
            last_sequence: Sequence(3),
            terminal: false,
            last_time: Timestamp::from_unix_millis(Timestamp::now().unix_millis() - ago_ms),
        }
    }

    #[test]
    fn a_log_written_within_the_lease_has_a_live_holder() {
        let lease = Duration::from_secs(5);
        assert!(written_within(&head_written(1_000), lease));
        assert!(!written_within(&head_written(6_000), lease));
    }

    #[test]
    fn running_is_counted_per_attempt_and_gave_up_is_bounded() {
        let holders = Holders::default();
        let id = ExecutionId::new_random();
        let cancel = CancellationToken::new();
        let first = holders.running(id, &cancel);
        let second = holders.running(id, &cancel);
        drop(first);
        assert!(holders.is_running(id));
        drop(second);
        assert!(!holders.is_running(id));
        holders.gave_up(id);
        assert!(holders.gave_up_unreachable(id));
        for _ in 0..GAVE_UP_REMEMBERED {
            holders.gave_up(ExecutionId::new_random());
        }
        assert!(!holders.gave_up_unreachable(id), "the oldest is forgotten");
    }

    #[test]
    fn cancel_all_cancels_what_runs_now_and_nothing_finished() {
        let holders = Holders::default();
        let (running, finished) = (CancellationToken::new(), CancellationToken::new());
        let _running = holders.running(ExecutionId::new_random(), &running);
        drop(holders.running(ExecutionId::new_random(), &finished));
        holders.cancel_all();
        assert!(running.is_cancelled());
        assert!(
            !finished.is_cancelled(),
            "a finished execution is no longer held"
        );
    }
}
