//! Test harness for the HTTP API: a real gateway in embedded mode and a client of its API,
//! from `testkit::gateway`.

pub use testkit::gateway::*;
