//! A future polled only when its own waker fired: [`OwnWakes`].
//!
//! `select!` polls every branch each time its task wakes. A task that streams tokens wakes for
//! each one, and a branch that waits for a cancellation token is then polled for nothing: the
//! token's wait takes the token's lock (to read whether it was cancelled) and its waiter list's
//! (to renew the waker) on every poll, two cache lines that are cold by the next token.
//! [`OwnWakes`] hands the future it wraps a waker of its own and polls it only after that
//! waker fired (and on the first poll); a poll in between compares the task's waker with the
//! one it saw last and reads one flag.
//!
//! What the wrapped future sees is unchanged: it is polled whenever it asked to be, and its
//! wake-ups reach the task that polls the wrapper (the waker registered last, as with any
//! future).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use parking_lot::Mutex;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// `future`, polled only when it asked to be (see the module docs).
pub struct OwnWakes<F> {
    future: Pin<Box<F>>,
    signal: Arc<Signal>,
    /// The waker the wrapped future is polled with: it fires `signal`.
    own: Waker,
    /// The task's waker last registered in `signal`.
    task: Option<Waker>,
    /// Whether the future returned `Ready`: polled again, it is polled whatever woke the task
    /// (a finished wait stays ready, as it does unwrapped).
    finished: bool,
}

impl<F> std::fmt::Debug for OwnWakes<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnWakes")
            .field("woken", &self.signal.woken.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Set when the wrapped future's waker fired; forwards the wake-up to the task.
struct Signal {
    woken: AtomicBool,
    /// The task's waker registered last. A wake-up wakes it and leaves it registered: a
    /// registration a wake-up took would leave the next one nobody to wake, when that wake-up
    /// set the flag before a poll cleared it and took the registration the poll made after.
    task: Mutex<Option<Waker>>,
}

impl Signal {
    /// Registers `waker` as the task's.
    fn register(&self, waker: &Waker) {
        let mut task = self.task.lock();
        if !task.as_ref().is_some_and(|w| w.will_wake(waker)) {
            *task = Some(waker.clone());
        }
    }

    /// Wakes the task registered last.
    fn wake_task(&self) {
        let task = self.task.lock().clone();
        if let Some(task) = task {
            task.wake();
        }
    }
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.wake_task();
    }
}

/// Wraps `future` (see [`OwnWakes`]).
pub fn own_wakes<F: Future>(future: F) -> OwnWakes<F> {
    let signal = Arc::new(Signal {
        // The first poll polls the future.
        woken: AtomicBool::new(true),
        task: Mutex::new(None),
    });
    OwnWakes {
        future: Box::pin(future),
        own: Waker::from(Arc::clone(&signal)),
        signal,
        task: None,
        finished: false,
    }
}

/// The wait for `token`'s cancellation, polled only when the token was cancelled (or on the
/// first poll).
pub fn cancelled(token: &CancellationToken) -> OwnWakes<WaitForCancellationFutureOwned> {
    own_wakes(token.clone().cancelled_owned())
}

impl OwnWakes<WaitForCancellationFutureOwned> {
    /// Whether the token was cancelled, without waiting: what `CancellationToken::is_cancelled`
    /// answers, without its lock unless the token's waiter was woken (a cancellation wakes it
    /// before `cancel` returns). The wait is polled with the calling task's waker.
    pub async fn is_cancelled(&mut self) -> bool {
        std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *self).poll(cx).is_ready())).await
    }
}

impl<F: Future> Future for OwnWakes<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        // The task's waker is registered before the flag is read (the registration's lock
        // orders the two against a wake-up's flag and read of the registration), so a wake-up
        // after the read reaches it; a wake-up leaves it registered.
        if this.finished {
            return this.future.as_mut().poll(cx);
        }
        if !this.task.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            this.signal.register(cx.waker());
            this.task = Some(cx.waker().clone());
        }
        if !this.signal.woken.load(Ordering::Acquire) {
            return Poll::Pending;
        }
        // Cleared, then polled: a wake-up in between sets the flag again, and the poll below
        // sees what caused it.
        this.signal.woken.store(false, Ordering::Release);
        let polled = this
            .future
            .as_mut()
            .poll(&mut Context::from_waker(&this.own));
        this.finished = polled.is_ready();
        polled
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use futures_util::task::AtomicWaker;

    use super::*;

    /// A task's waker that counts its wake-ups.
    #[derive(Default)]
    struct Task(AtomicUsize);

    impl Wake for Task {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    impl Task {
        fn wakes(&self) -> usize {
            self.0.load(Ordering::SeqCst)
        }
    }

    /// Counts its polls; ready once `ready` is set. Its last waker is in `waker`.
    struct Counted {
        polls: Arc<AtomicUsize>,
        ready: Arc<AtomicBool>,
        waker: Arc<AtomicWaker>,
    }

    impl Future for Counted {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.polls.fetch_add(1, Ordering::SeqCst);
            self.waker.register(cx.waker());
            if self.ready.load(Ordering::SeqCst) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }
    }

    fn counted() -> (
        OwnWakes<Counted>,
        Arc<AtomicUsize>,
        Arc<AtomicBool>,
        Arc<AtomicWaker>,
    ) {
        let (polls, ready, waker) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicWaker::new()),
        );
        let wrapped = own_wakes(Counted {
            polls: Arc::clone(&polls),
            ready: Arc::clone(&ready),
            waker: Arc::clone(&waker),
        });
        (wrapped, polls, ready, waker)
    }

    fn poll<F: Future>(future: &mut OwnWakes<F>, task: &Arc<Task>) -> Poll<F::Output> {
        let waker = Waker::from(Arc::clone(task));
        Pin::new(future).poll(&mut Context::from_waker(&waker))
    }

    #[test]
    fn the_future_is_polled_first_then_only_after_its_own_wakes_and_every_wake_reaches_the_task() {
        let (mut wrapped, polls, ready, waker) = counted();
        let task = Arc::new(Task::default());
        // The task wakes a hundred times for other reasons.
        for _ in 0..100 {
            assert!(poll(&mut wrapped, &task).is_pending());
        }
        assert_eq!(polls.load(Ordering::SeqCst), 1, "polled once, at first");
        // Each of its own wake-ups reaches the task and has it polled once more, the second
        // as well as the first (a wake-up takes the registration it used).
        for round in 1..=3 {
            waker.wake();
            assert_eq!(task.wakes(), round);
            assert!(poll(&mut wrapped, &task).is_pending());
            assert!(poll(&mut wrapped, &task).is_pending());
            assert_eq!(polls.load(Ordering::SeqCst), 1 + round);
        }
        ready.store(true, Ordering::SeqCst);
        waker.wake();
        assert_eq!(task.wakes(), 4);
        assert!(poll(&mut wrapped, &task).is_ready());
    }

    #[test]
    fn a_wake_reaches_the_task_that_polled_last() {
        let (mut wrapped, polls, _ready, waker) = counted();
        let (first, second) = (Arc::new(Task::default()), Arc::new(Task::default()));
        assert!(poll(&mut wrapped, &first).is_pending());
        assert!(poll(&mut wrapped, &second).is_pending());
        waker.wake();
        assert_eq!((first.wakes(), second.wakes()), (0, 1));
        assert!(poll(&mut wrapped, &first).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 2);
        waker.wake();
        assert_eq!((first.wakes(), second.wakes()), (1, 1));
    }

    #[test]
    fn a_wake_up_split_around_a_poll_leaves_the_next_one_a_task_to_wake() {
        let (mut wrapped, polls, _ready, waker) = counted();
        let task = Arc::new(Task::default());
        assert!(poll(&mut wrapped, &task).is_pending());
        // A wake-up on another thread sets the flag; before it wakes the task, the task is
        // polled for another reason, clears the flag and polls the future.
        wrapped.signal.woken.store(true, Ordering::Release);
        assert!(poll(&mut wrapped, &task).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 2);
        // The wake-up's second half: it wakes the task, which finds nothing new.
        wrapped.signal.wake_task();
        assert_eq!(task.wakes(), 1);
        assert!(poll(&mut wrapped, &task).is_pending());
        // The next wake-up still reaches the task.
        waker.wake();
        assert_eq!(task.wakes(), 2, "the second wake-up found no task to wake");
        assert!(poll(&mut wrapped, &task).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn is_cancelled_answers_as_the_token_does() {
        let token = CancellationToken::new();
        let mut wait = cancelled(&token);
        for _ in 0..3 {
            assert!(!wait.is_cancelled().await);
        }
        token.cancel();
        assert!(wait.is_cancelled().await);
        assert!(wait.is_cancelled().await);
        let parent = CancellationToken::new();
        let mut child_wait = cancelled(&parent.child_token());
        assert!(!child_wait.is_cancelled().await);
        parent.cancel();
        assert!(
            child_wait.is_cancelled().await,
            "a parent's cancellation too"
        );
    }

    #[test]
    fn a_cancellation_is_seen_whenever_it_comes() {
        let token = CancellationToken::new();
        let task = Arc::new(Task::default());
        let mut wait = cancelled(&token);
        for _ in 0..3 {
            assert!(poll(&mut wait, &task).is_pending());
        }
        token.cancel();
        assert_eq!(task.wakes(), 1);
        assert!(poll(&mut wait, &task).is_ready());
        // Polled again once ready, it stays ready.
        assert!(poll(&mut wait, &task).is_ready());
        // Cancelled before the first poll: ready at once.
        assert!(poll(&mut cancelled(&token), &task).is_ready());
    }
}
