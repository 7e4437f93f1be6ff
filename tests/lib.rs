//! Harness for end-to-end tests: the real binaries over private NATS and Redis, from
//! `testkit::gateway::process`.

pub use testkit::gateway::process::*;
