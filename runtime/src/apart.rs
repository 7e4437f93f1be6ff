//! CPU-heavy work on large inputs, kept off the async runtime's threads.
//!
//! A task that parses, fingerprints or decodes a megabyte of JSON holds its thread for as long
//! as that takes: 3-12 ms in a release build for the costliest shapes, tenths of a second in a
//! debug build. Every other task queued on that thread waits meanwhile, and with it the
//! timers and sockets it drives: a store request whose answer has arrived still times out,
//! a Redis claim misses its bound. [`apart`] runs such work on the blocking pool once its
//! input reaches [`APART_BYTES`], and inline below that, where the hand-off would cost more
//! than the work.
//!
//! At most as many such works run at once as the machine has cores
//! ([`std::thread::available_parallelism`]); the others wait their turn. CPU-bound work gains
//! nothing from more threads than cores, and each thread that ran one keeps the allocator's
//! pages of its temporaries (megabytes for a large JSON document) until it allocates again or
//! exits, 10 s after it was last used. With a thread per concurrent large request, that memory
//! grew with the burst; with one per core it is a fixed step (a nats gateway holding 5
//! requests of 1 MiB, debug build on 2 cores: 55-64 MiB over idle with a thread each, 43-59
//! MiB with one per core).

/// The input size from which work runs on the blocking pool: a 64 KiB JSON document takes
/// well under a millisecond to parse in a release build, about the cost of the hand-off's
/// wake-ups on a busy machine.
pub const APART_BYTES: usize = 64 * 1024;

/// The turns of works run apart: one per core.
static TURNS: std::sync::LazyLock<tokio::sync::Semaphore> = std::sync::LazyLock::new(|| {
    tokio::sync::Semaphore::new(std::thread::available_parallelism().map_or(1, usize::from))
});

/// Runs `work`, whose input is `size` bytes, on the blocking pool when `size` is at least
/// [`APART_BYTES`], inline otherwise. `None` when the blocking task could not finish: the
/// runtime is shutting down. A panic in `work` resumes in the caller, as it would inline.
pub async fn apart<T, F>(size: usize, work: F) -> Option<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    if size < APART_BYTES {
        return Some(work());
    }
    // Never closed, so the permit always comes.
    let _turn = TURNS.acquire().await.ok()?;
    match tokio::task::spawn_blocking(work).await {
        Ok(value) => Some(value),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn small_work_runs_inline_and_large_work_on_the_blocking_pool() {
        let here = std::thread::current().id();
        let small = apart(APART_BYTES - 1, || std::thread::current().id()).await;
        assert_eq!(small, Some(here));
        let large = apart(APART_BYTES, || std::thread::current().id()).await;
        assert!(large.is_some_and(|id| id != here));
    }

    #[tokio::test]
    #[should_panic(expected = "the work's own panic")]
    async fn a_panic_in_the_work_reaches_the_caller() {
        apart(APART_BYTES, || panic!("the work's own panic")).await;
    }
}
