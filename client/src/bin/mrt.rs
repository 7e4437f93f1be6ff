//! `mrt`: the command-line client of the model runtime. See `model_runtime_client::cli`.

use std::process::ExitCode;

use clap::Parser;
use model_runtime_client::cli::{Cli, run};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    run(Cli::parse()).await
}
