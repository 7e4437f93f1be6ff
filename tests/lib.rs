//! Shared harness for end-to-end tests.
