//! `worker`: see [`worker::process`].

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    worker::process::run(
        worker::process::WorkerArgs::parse(),
        worker::process::shutdown_signal(),
    )
    .await
}
