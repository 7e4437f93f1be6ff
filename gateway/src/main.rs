//! `gateway`: see [`gateway::server`].

use std::process::ExitCode;

use clap::Parser;

/// mimalloc: glibc's allocator serialises the runtime's threads on its arena locks under load
/// (BENCHMARKS.md, "Allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    gateway::server::run(gateway::server::GatewayArgs::parse()).await
}
