//! The `mrt` command line: arguments, one function per subcommand, exit codes.
//!
//! The binary parses [`Cli`] and calls [`run`]; everything else lives here so that the tests
//! that run the binary exercise the same code a user does. Output goes through
//! [`output::Terminal`], which owns stdout, stderr and the live progress line.
//!
//! Exit codes (also printed by `mrt --help`):
//! - 0: success (the execution succeeded, the request was accepted, ...);
//! - 1: the execution failed or was cancelled;
//! - 2: usage error (bad arguments, unreadable or invalid request file, bad URL, key or cursor);
//! - 3: transport or API error (gateway unreachable, error response, protocol violation, a
//!   stream that could not be resumed, gateway not ready);
//! - 4: nothing to act on: `cancel` of an unknown or already finished execution, `result` of
//!   an execution that has not finished yet.

mod output;

use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, Parser, Subcommand};
use protocol::snapshot::ExecutionSubmission;
use protocol::{ExecutionId, Sequence};
use serde_json::Value;

use crate::client::{Client, SubmitOptions};
use crate::error::ClientError;
use crate::idempotency::IdempotencyKey;
use crate::retry::RetryPolicy;
use crate::transcript::{Outcome, Transcript};
use output::Terminal;

const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  the execution failed or was cancelled
  2  usage error (arguments, request file, URL, idempotency key, cursor)
  3  transport or API error (unreachable gateway, error response, broken stream)
  4  nothing to act on (cancel of a finished or unknown execution, result not ready yet)";

/// `mrt` arguments.
#[derive(Debug, Parser)]
#[command(
    name = "mrt",
    version,
    about = "Command-line client of the model runtime",
    after_help = EXIT_CODES
)]
pub struct Cli {
    /// Gateway base URL (no credentials, query or fragment).
    #[arg(
        long,
        global = true,
        env = "MODEL_RUNTIME_URL",
        default_value = "http://127.0.0.1:4320"
    )]
    pub url: String,
    /// API key, sent as `Authorization: Bearer` (required by gateways with an `auth` section;
    /// empty: none). Prefer the environment variable: a flag shows in the process list.
    #[arg(
        long,
        global = true,
        env = "MODEL_RUNTIME_API_KEY",
        hide_env_values = true,
        value_name = "KEY"
    )]
    pub api_key: Option<SecretArg>,
    /// Machine output: one JSON document per line (one event per line for run and watch).
    #[arg(long, global = true)]
    pub json: bool,
    /// Retries after a transient failure (connection loss, 429, 503): reads, keyed submissions
    /// and event-stream resumption, with exponential backoff and jitter.
    #[arg(long, global = true, value_name = "N", default_value_t = RetryPolicy::default().max_retries)]
    pub retries: u32,
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Submit a request and print its output live (text on stdout, usage on stderr).
    Run(RequestArgs),
    /// Submit a request and print the execution id.
    Submit(RequestArgs),
    /// Follow an execution's events until its terminal event, resuming after connection loss.
    Watch {
        /// Execution id.
        id: ExecutionId,
        /// Print only events after this sequence.
        #[arg(long, value_name = "N", default_value_t = 0)]
        after: u64,
    },
    /// Print an execution's snapshot (JSON).
    Get {
        /// Execution id.
        id: ExecutionId,
    },
    /// Print an execution's result (JSON); exit 1 if it failed, 4 if it is still running.
    Result {
        /// Execution id.
        id: ExecutionId,
    },
    /// Request cancellation; exit 4 if the execution is unknown or already finished.
    Cancel {
        /// Execution id.
        id: ExecutionId,
    },
    /// List the configured providers and models.
    Providers,
    /// Print the runtime information; exit 3 unless the runtime is ready.
    Runtime,
    /// Generate an API key: prints the key (once) and the `auth.keys` entry, with the key's
    /// SHA-256, for the deployment file. Contacts no gateway.
    Keygen {
        /// Tenant the key acts for (must be listed in `auth.tenants`).
        #[arg(long)]
        tenant: String,
        /// Key id, unique in the file; may appear in logs.
        #[arg(long)]
        id: String,
        /// Comma-separated scopes among submit, read, cancel (default: all three).
        #[arg(long, value_name = "LIST")]
        scopes: Option<String>,
    },
    /// Generate a webhook signing secret (`whsec_…`) for the variable an endpoint's
    /// `secret_env` names; give the same value to the receiver. Contacts no gateway.
    WebhookSecret,
}

/// A command-line value that must never be printed (`Debug` hides it).
#[derive(Clone)]
pub struct SecretArg(String);

impl SecretArg {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for SecretArg {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self(s.to_owned()))
    }
}

impl std::fmt::Debug for SecretArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Where the request comes from, and how it is submitted.
#[derive(Debug, Args)]
pub struct RequestArgs {
    /// Request JSON file, or `-` to read it from stdin.
    #[arg(
        value_name = "FILE",
        required_unless_present = "text",
        conflicts_with = "text"
    )]
    pub file: Option<PathBuf>,
    /// Submit this prompt: {"ability":ABILITY,"input":[{"type":"text","text":TEXT}]}.
    #[arg(long, value_name = "TEXT")]
    pub text: Option<String>,
    /// Ability of a --text request.
    #[arg(long, default_value = "text-generation")]
    pub ability: String,
    /// Send this Idempotency-Key (repeating the command then returns the same execution).
    #[arg(long, value_name = "KEY", conflicts_with = "idempotent")]
    pub idempotency_key: Option<String>,
    /// Generate an Idempotency-Key (printed on stderr) so that failed attempts can be retried
    /// safely.
    #[arg(long)]
    pub idempotent: bool,
}

/// Process exit status of `mrt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Success = 0,
    ExecutionFailed = 1,
    Usage = 2,
    Api = 3,
    NothingToDo = 4,
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> Self {
        ExitCode::from(exit as u8)
    }
}

/// Why a command stopped early.
#[derive(Debug)]
enum Failure {
    Usage(String),
    Client(ClientError),
    Output,
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Self {
        Failure::Client(e)
    }
}

impl From<std::io::Error> for Failure {
    fn from(_: std::io::Error) -> Self {
        Failure::Output
    }
}

/// Runs `mrt` with the process's stdout and stderr.
pub async fn run(cli: Cli) -> ExitCode {
    let progress = std::io::stderr().is_terminal();
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    let mut term = Terminal::new(&mut stdout, &mut stderr, cli.json, progress);
    run_with(cli, &mut term).await.into()
}

/// Runs `mrt` against `term`.
pub async fn run_with(cli: Cli, term: &mut Terminal<'_>) -> Exit {
    match dispatch(cli, term).await {
        Ok(exit) => exit,
        Err(failure) => {
            term.clear_progress();
            match failure {
                Failure::Usage(message) => {
                    term.note(&format!("mrt: {message}"));
                    Exit::Usage
                }
                Failure::Output => {
                    term.note("mrt: error: cannot write the output");
                    Exit::Api
                }
                Failure::Client(e) => report(term, &e),
            }
        }
    }
}

/// Prints `e` on stderr with its code and returns the exit code it implies.
fn report(term: &mut Terminal<'_>, e: &ClientError) -> Exit {
    let code = e.code().map_or("not_ready", |c| c.as_str());
    match e {
        ClientError::InvalidBaseUrl(_)
        | ClientError::InvalidCursor
        | ClientError::InvalidIdempotencyKey
        | ClientError::InvalidApiKey
        | ClientError::InvalidRequest => {
            term.note(&format!("mrt: {code}: {e}"));
            Exit::Usage
        }
        ClientError::NotReady(not_ready) => {
            // The message already names the status and, once terminal, the error code.
            term.note(&format!("mrt: {e}"));
            if not_ready.status.is_terminal() {
                Exit::ExecutionFailed
            } else {
                Exit::NothingToDo
            }
        }
        ClientError::Api(api) => {
            term.note(&format!(
                "mrt: error: {code}: {} (HTTP {})",
                api.message, api.status
            ));
            Exit::Api
        }
        _ => {
            term.note(&format!("mrt: error: {code}: {e}"));
            Exit::Api
        }
    }
}

async fn dispatch(cli: Cli, term: &mut Terminal<'_>) -> Result<Exit, Failure> {
    // Needs no gateway: runs before the URL and key are checked.
    if let Command::Keygen { tenant, id, scopes } = &cli.command {
        return keygen(term, tenant, id, scopes.as_deref());
    }
    if let Command::WebhookSecret = &cli.command {
        return webhook_secret(term);
    }
    let mut builder = Client::builder(&cli.url).retry(RetryPolicy {
        max_retries: cli.retries,
        ..RetryPolicy::default()
    });
    // An empty key (`MODEL_RUNTIME_API_KEY=` exported to "unset" it) is no key.
    if let Some(key) = cli.api_key.as_ref().filter(|key| !key.expose().is_empty()) {
        builder = builder.api_key(key.expose());
    }
    let client = builder.build()?;
    match cli.command {
        Command::Run(args) => {
            let submission = submit(&client, &args, term).await?;
            if !term.json() {
                term.note(&format!("mrt: execution {}", submission.execution_id));
            }
            watch(&client, submission.execution_id, Sequence::ZERO, term).await
        }
        Command::Submit(args) => {
            let submission = submit(&client, &args, term).await?;
            if term.json() {
                term.json_document(&submission)?;
            } else {
                term.line(&submission.execution_id.to_string())?;
            }
            Ok(Exit::Success)
        }
        Command::Watch { id, after } => watch(&client, id, Sequence(after), term).await,
        Command::Get { id } => {
            let snapshot = client.get(id).await?;
            term.json_document(&snapshot)?;
            Ok(Exit::Success)
        }
        Command::Result { id } => match client.result(id).await {
            Ok(result) => {
                term.json_document(&result)?;
                Ok(Exit::Success)
            }
            Err(ClientError::NotReady(not_ready)) => {
                if term.json() {
                    term.json_document(&not_ready)?;
                }
                Err(ClientError::NotReady(not_ready).into())
            }
            Err(e) => Err(e.into()),
        },
        Command::Cancel { id } => {
            let requested = client.cancel(id).await?;
            if term.json() {
                let status = if requested {
                    "cancellation_requested"
                } else {
                    "not_found"
                };
                term.json_document(&serde_json::json!({ "status": status }))?;
            } else if requested {
                term.line("cancellation requested")?;
            }
            if requested {
                Ok(Exit::Success)
            } else {
                term.note("mrt: not_found: the execution is unknown or already finished");
                Ok(Exit::NothingToDo)
            }
        }
        Command::Providers => {
            let providers = client.providers().await?;
            if term.json() {
                term.json_document(&serde_json::json!({ "data": providers }))?;
            } else {
                term.providers(&providers)?;
            }
            Ok(Exit::Success)
        }
        Command::Keygen { tenant, id, scopes } => keygen(term, &tenant, &id, scopes.as_deref()),
        Command::WebhookSecret => webhook_secret(term),
        Command::Runtime => {
            let info = client.runtime_info().await?;
            term.json_document(&info)?;
            if info.state == protocol::snapshot::RuntimeState::Ready {
                Ok(Exit::Success)
            } else {
                let state = serde_json::to_value(info.state).unwrap_or_default();
                term.note(&format!(
                    "mrt: unavailable: the runtime is {}",
                    state.as_str().unwrap_or("not ready")
                ));
                Ok(Exit::Api)
            }
        }
    }
}

/// Reads the request and submits it; a generated key and a replay are noted on stderr.
/// `mrt keygen`: the key on stdout (once), then the entry; `--json`: one document with both.
fn keygen(
    term: &mut Terminal<'_>,
    tenant: &str,
    id: &str,
    scopes: Option<&str>,
) -> Result<Exit, Failure> {
    let generated =
        crate::keygen::generate(tenant, id, scopes).map_err(|e| Failure::Usage(e.to_string()))?;
    if term.json() {
        term.json_document(&generated)?;
    } else {
        term.note("mrt: the key is shown once; give it to the client (MODEL_RUNTIME_API_KEY)");
        term.line(&generated.key)?;
        term.note("mrt: add this entry to auth.keys in the deployment file:");
        let entry = serde_json::to_string(&generated.entry).map_err(|_| Failure::Output)?;
        term.line(&entry)?;
    }
    Ok(Exit::Success)
}

/// `mrt webhook-secret`: the secret on stdout; `--json`: `{"secret": …}`.
fn webhook_secret(term: &mut Terminal<'_>) -> Result<Exit, Failure> {
    let secret = crate::webhook_secret::generate().map_err(|e| Failure::Usage(e.to_string()))?;
    if term.json() {
        term.json_document(&serde_json::json!({ "secret": secret }))?;
    } else {
        term.note("mrt: set this in the variable named by the endpoint's secret_env, and give it to the receiver:");
        term.line(&secret)?;
    }
    Ok(Exit::Success)
}

async fn submit(
    client: &Client,
    args: &RequestArgs,
    term: &mut Terminal<'_>,
) -> Result<ExecutionSubmission, Failure> {
    let request = read_request(args)?;
    let options = if let Some(key) = &args.idempotency_key {
        SubmitOptions::with_key(IdempotencyKey::new(key.as_str())?)
    } else if args.idempotent {
        let options = SubmitOptions::idempotent();
        if let Some(key) = &options.idempotency_key {
            term.note(&format!("mrt: idempotency key {key}"));
        }
        options
    } else {
        SubmitOptions::default()
    };
    let submission = client.submit_json(&request, &options).await?;
    if submission.idempotent_replay {
        term.note(&format!(
            "mrt: idempotent replay of execution {} (status {})",
            submission.execution_id, submission.status
        ));
    }
    Ok(submission)
}

/// The request JSON from `--text`, a file, or stdin.
fn read_request(args: &RequestArgs) -> Result<Value, Failure> {
    if let Some(text) = &args.text {
        return serde_json::to_value(crate::text_request(&args.ability, text))
            .map_err(|_| Failure::Usage("the request cannot be encoded".into()));
    }
    let Some(path) = &args.file else {
        return Err(Failure::Usage(
            "a request FILE, `-` or --text is required".into(),
        ));
    };
    let bytes = if path.as_os_str() == "-" {
        let mut bytes = Vec::new();
        std::io::stdin()
            .read_to_end(&mut bytes)
            .map_err(|e| Failure::Usage(format!("cannot read the request from stdin: {e}")))?;
        bytes
    } else {
        std::fs::read(path)
            .map_err(|e| Failure::Usage(format!("cannot read {}: {}", path.display(), e.kind())))?
    };
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|_| Failure::Usage("the request is not valid JSON".into()))?;
    if !value.is_object() {
        return Err(Failure::Usage("the request must be a JSON object".into()));
    }
    Ok(value)
}

/// Streams the events of `id` after `after`, rendering them, and maps the outcome to the exit
/// code.
async fn watch(
    client: &Client,
    id: ExecutionId,
    after: Sequence,
    term: &mut Terminal<'_>,
) -> Result<Exit, Failure> {
    let started = Instant::now();
    let mut events = client.events(id, after)?;
    let mut transcript = Transcript::new();
    while let Some(item) = events.next().await {
        let event = item?;
        transcript.apply(&event);
        term.event(&event, started)?;
    }
    term.clear_progress();
    term.summary(&transcript)?;
    let outcome = match transcript.outcome.clone() {
        Some(outcome) => outcome,
        // The execution was already terminal at the cursor: the snapshot says how it ended.
        None => {
            let snapshot = client.get(id).await?;
            match (snapshot.status, snapshot.error, snapshot.target) {
                (protocol::ExecutionStatus::Succeeded, _, Some(target)) => {
                    Outcome::Succeeded { target }
                }
                (protocol::ExecutionStatus::Succeeded, _, None) => return Ok(Exit::Success),
                (protocol::ExecutionStatus::Cancelled, error, _) => Outcome::Cancelled {
                    error: error.unwrap_or_else(protocol::RuntimeError::cancelled),
                },
                (_, error, _) => Outcome::Failed {
                    error: error.unwrap_or_else(protocol::RuntimeError::internal),
                },
            }
        }
    };
    Ok(match outcome {
        Outcome::Succeeded { .. } => Exit::Success,
        Outcome::Failed { error } => {
            term.note(&format!(
                "mrt: execution failed: {}: {}",
                error.code, error.message
            ));
            Exit::ExecutionFailed
        }
        Outcome::Cancelled { error } => {
            term.note(&format!(
                "mrt: execution cancelled: {}: {}",
                error.code, error.message
            ));
            Exit::ExecutionFailed
        }
    })
}
