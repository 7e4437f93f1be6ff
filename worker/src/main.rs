//! `worker`: see [`worker::process`].

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    // Handlers first: a signal at any later instant is a graceful stop.
    let signal = worker::process::install_shutdown_signal();
    worker::process::run(worker::process::WorkerArgs::parse(), signal).await
}
