//! `gateway`: see [`gateway::server`].

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    gateway::server::run(gateway::server::GatewayArgs::parse()).await
}
