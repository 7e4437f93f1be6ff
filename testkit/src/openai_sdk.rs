//! The official `openai` SDKs (the Python package and the npm package), run unchanged against
//! a gateway by the check scripts `gateway/tests/openai/sdk_check.py` and `sdk_check.cjs`
//! (which `scripts/test.sh` installs the SDKs for). The embedded test in `gateway` and the
//! `nats`-mode test in `tests` drive them the same way, with different environments.
//!
//! A missing SDK fails the test with a message naming the installer rather than an obscure
//! import error; the scripts print `ok CASE` for every case that passed.

use std::path::Path;
use std::process::{Command, Output};

/// Where the check scripts (and the npm package's `node_modules`) live.
pub const SCRIPT_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../gateway/tests/openai");

/// The cases every run of `sdk_check.py` passes.
pub const PYTHON_CASES: [&str; 11] = [
    "create_plain",
    "create_stream",
    "background",
    "resume",
    "stream_helper",
    "cancel",
    "chat",
    "models",
    "chat_cancelled",
    "idempotency",
    "errors",
];

/// The cases of `sdk_check.cjs`.
pub const NODE_CASES: [&str; 5] = ["create", "stream", "background", "resume", "cancel"];

/// One of the two SDKs and its check script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sdk {
    Python,
    Node,
}

impl Sdk {
    /// Panics, naming the installer, unless the SDK is installed.
    pub fn assert_installed(self) {
        let installed = match self {
            Sdk::Python => Command::new("python3")
                .args(["-c", "import openai"])
                .status()
                .is_ok_and(|s| s.success()),
            Sdk::Node => Path::new(SCRIPT_DIR).join("node_modules/openai").exists(),
        };
        assert!(
            installed,
            "the openai {self} package is missing: run scripts/test.sh, which installs it"
        );
    }

    /// Starts the check script on a blocking thread with `env` added (and `OPENAI_API_KEY`
    /// removed, so that only the keys given here are used); the handle yields its output.
    pub fn spawn(self, env: Vec<(&'static str, String)>) -> tokio::task::JoinHandle<Output> {
        let (program, script) = match self {
            Sdk::Python => ("python3", "sdk_check.py"),
            Sdk::Node => ("node", "sdk_check.cjs"),
        };
        tokio::task::spawn_blocking(move || {
            Command::new(program)
                .arg(format!("{SCRIPT_DIR}/{script}"))
                .envs(env)
                .env_remove("OPENAI_API_KEY")
                .output()
                .unwrap_or_else(|e| panic!("run {program}: {e}"))
        })
    }

    /// Asserts that the script exited successfully and passed every one of `cases`; `context`
    /// (a gateway's log, say) is added to the message of a failed run.
    pub fn assert_passed(self, output: &Output, cases: &[&str], context: &str) {
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{self} stdout:\n{stdout}\nstderr:\n{}\n{context}",
            String::from_utf8_lossy(&output.stderr)
        );
        for case in cases {
            assert!(
                stdout.contains(&format!("ok {case}\n")),
                "{self} {case}:\n{stdout}"
            );
        }
    }
}

impl std::fmt::Display for Sdk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Sdk::Python => "Python",
            Sdk::Node => "npm",
        })
    }
}
