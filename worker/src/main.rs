//! `worker`: see [`worker::process`].

use std::process::ExitCode;

use clap::Parser;

/// mimalloc: glibc's allocator serialises the runtime's threads on its arena locks under load
/// (BENCHMARKS.md, "Allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    // Handlers first: a signal at any later instant is a graceful stop.
    let signal = startup::install_shutdown_signal();
    worker::process::run(worker::process::WorkerArgs::parse(), signal).await
}
