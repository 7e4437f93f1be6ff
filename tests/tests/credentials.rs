//! Infrastructure credentials end to end (contract.md section 7, last bullet): the real
//! `gateway` and `worker` binaries against nats-server and redis-server that require a password,
//! a token, an nkey, TLS with client certificates, and Redis TLS. For each: a submission
//! completes; wrong credentials or an untrusted certificate stop the start with one line that
//! names what failed and holds no secret; and at `RUST_LOG=trace` no log line of any process
//! holds a password, token or seed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e_tests::*;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use serde_json::json;
use testkit::{KillOnDrop, TempDir, free_port, nats_server_binary, unique_namespace};

/// A server child killed on drop; its output goes to `log`.
struct Server {
    child: KillOnDrop,
    log: PathBuf,
}

impl Server {
    fn start(program: &Path, args: &[&str], port: u16, log: PathBuf) -> Self {
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(Stdio::from(
                std::fs::OpenOptions::new().append(true).open(&log).unwrap(),
            ))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", program.display()));
        let mut server = Self {
            child: KillOnDrop(child),
            log,
        };
        let deadline = Instant::now() + PROMPT;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!(
                    "{} exited ({status}): {}",
                    program.display(),
                    std::fs::read_to_string(&server.log).unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} did not listen",
                program.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }
}

/// nats-server with JetStream and `settings` (config file syntax) on a free port.
fn nats_server(dir: &TempDir, settings: &str) -> (Server, u16) {
    let port = free_port();
    let name = unique_namespace("nats");
    let store = dir.path().join(format!("{name}-store"));
    let config = dir.path().join(format!("{name}.conf"));
    std::fs::write(
        &config,
        format!("listen: \"127.0.0.1:{port}\"\njetstream {{ store_dir: {store:?} }}\n{settings}\n"),
    )
    .unwrap();
    let log = dir.path().join(format!("{name}.log"));
    let server = Server::start(
        &nats_server_binary(),
        &["-c", config.to_str().unwrap()],
        port,
        log,
    );
    (server, port)
}

/// redis-server on a free port with `extra` arguments; `tls` moves it to a TLS-only port.
fn redis_server(dir: &TempDir, extra: &[&str], tls: bool) -> (Server, u16) {
    let port = free_port();
    let name = unique_namespace("redis");
    let data = dir.path().join(&name);
    std::fs::create_dir_all(&data).unwrap();
    let port_text = port.to_string();
    let mut args = vec!["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"];
    if tls {
        args.extend(["--port", "0", "--tls-port", &port_text]);
    } else {
        args.extend(["--port", &port_text]);
    }
    args.extend(["--dir", data.to_str().unwrap()]);
    args.extend(extra);
    let program = std::env::var("MRT_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
    let log = dir.path().join(format!("{name}.log"));
    let server = Server::start(Path::new(&program), &args, port, log);
    (server, port)
}

/// A CA and the certificates the tests need, as PEM files in `dir`.
struct Pki {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    /// A CA that signed nothing here: trusting only it, the server is untrusted.
    other_ca: PathBuf,
}

fn certificate_authority(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

fn leaf(
    ca: &CertifiedIssuer<'static, KeyPair>,
    name: &str,
    usage: ExtendedKeyUsagePurpose,
) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut params =
        CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
    params.distinguished_name.push(DnType::CommonName, name);
    params.extended_key_usages = vec![usage];
    let cert = params.signed_by(&key, ca).unwrap();
    (cert.pem(), key.serialize_pem())
}

impl Pki {
    fn new(dir: &TempDir) -> Self {
        let write = |name: &str, pem: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, pem).unwrap();
            path
        };
        let ca = certificate_authority("mrt test CA");
        let (server_cert, server_key) = leaf(&ca, "server", ExtendedKeyUsagePurpose::ServerAuth);
        let (client_cert, client_key) = leaf(&ca, "client", ExtendedKeyUsagePurpose::ClientAuth);
        Self {
            ca: write("ca.pem", &ca.pem()),
            server_cert: write("server.pem", &server_cert),
            server_key: write("server-key.pem", &server_key),
            client_cert: write("client.pem", &client_cert),
            client_key: write("client-key.pem", &client_key),
            other_ca: write("other-ca.pem", &certificate_authority("other CA").pem()),
        }
    }
}

fn path(p: &Path) -> String {
    p.to_str().unwrap().to_owned()
}

/// The environment of a process in nats mode against `nats_url` and `redis_url`.
fn base_env(dir: &TempDir, nats_url: &str, redis_url: &str) -> Vec<(String, String)> {
    let config = dir.path().join("deployment.json");
    if !config.exists() {
        let deployment = json!({
            "providers": [{"type": "mock", "id": "provider-mock", "model": "model-alpha",
                           "abilities": ["text-generation"]}],
        });
        std::fs::write(&config, serde_json::to_vec(&deployment).unwrap()).unwrap();
    }
    let namespace = unique_namespace("cred");
    let config = path(&config);
    [
        ("MODEL_RUNTIME_BACKEND", "nats"),
        ("NATS_URL", nats_url),
        ("REDIS_URL", redis_url),
        ("MODEL_RUNTIME_NAMESPACE", namespace.as_str()),
        ("MODEL_RUNTIME_CONFIG", config.as_str()),
        ("MODEL_RUNTIME_ADMIN_PORT", "0"),
        ("MODEL_RUNTIME_SHUTDOWN_GRACE_MS", "2000"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// Changes to an environment: a value `None` removes the variable.
type Changes<'a> = [(&'a str, Option<&'a str>)];

/// `env` with `changes` applied.
fn with(env: &[(String, String)], changes: &Changes<'_>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = env
        .iter()
        .filter(|(k, _)| !changes.iter().any(|(name, _)| name == k))
        .cloned()
        .collect();
    for (name, value) in changes {
        if let Some(value) = value {
            out.push(((*name).to_owned(), (*value).to_owned()));
        }
    }
    out
}

fn start_gateway(env: &[(String, String)], dir: &TempDir) -> (Process, String) {
    let gateway = spawn_gateway(env, dir);
    (gateway.process, gateway.url)
}

fn start_worker(env: &[(String, String)], dir: &TempDir) -> Process {
    spawn("worker", &[], env, "worker started", dir).0
}

/// Runs `name` with `env`, expecting it to fail at startup: returns its stderr after checking
/// the exit code is non-zero and exactly one line is the startup error (`name: ...`); returns
/// that line.
fn fails_to_start(name: &str, env: &[(String, String)], dir: &TempDir) -> String {
    let log = dir
        .path()
        .join(format!("{name}-fail-{}.log", unique_namespace("")));
    let mut command = Command::new(binary(name));
    if name == "gateway" {
        command.args(["--port", "0"]);
    }
    command
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUST_LOG", "info")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let mut child = command.spawn().unwrap();
    let deadline = Instant::now() + PROMPT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "{name} did not stop; log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(
        !status.success() && status.code().is_some(),
        "{name}: {status:?}\n{stderr}"
    );
    let prefix = format!("{name}: ");
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with(&prefix)).collect();
    assert_eq!(lines.len(), 1, "one startup error line:\n{stderr}");
    lines[0].to_owned()
}

/// [`fails_to_start`] for `name` with `env` changed by `changes`; asserts the startup error line
/// holds every one of `expected` and returns it.
fn refused(
    name: &str,
    env: &[(String, String)],
    changes: &Changes<'_>,
    dir: &TempDir,
    expected: &[&str],
) -> String {
    let line = fails_to_start(name, &with(env, changes), dir);
    for text in expected {
        assert!(line.contains(text), "{line}");
    }
    line
}

/// Asserts no line of any of `logs` holds any of `secrets`.
fn assert_no_secret(logs: &[String], secrets: &[&str]) {
    for log in logs {
        for secret in secrets {
            if let Some(line) = log.lines().find(|l| l.contains(secret)) {
                panic!("a log line holds a secret: {line}");
            }
        }
    }
}

/// A submission through `gateway` completes (a worker ran it).
async fn submission_completes(gateway: &str) {
    let (status, body) = submit(gateway, &text_request("hi"), None).await;
    assert_eq!(status, 202, "{body}");
    let id = body["execution_id"]
        .as_str()
        .expect("execution id")
        .to_owned();
    let snap = wait_terminal(gateway, &id).await;
    assert_eq!(snap["status"], "succeeded", "{snap}");
}

/// Password NATS user (the gateway, `NATS_USER`/`NATS_PASSWORD`) and nkey NATS user (the
/// worker, `NATS_NKEY`), Redis with a password (`redis://default:PASSWORD@`), all at
/// `RUST_LOG=trace`; then wrong and missing credentials of each kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_and_nkeys() {
    const NATS_PASSWORD: &str = "nats-pw-7f3a91c2";
    const REDIS_PASSWORD: &str = "redis-pw-4e8b03d6";
    let dir = TempDir::new("mrt-cred-");
    let nkey = nkeys::KeyPair::new_user();
    let seed = nkey.seed().unwrap();
    let seed_file = dir.path().join("worker.nk");
    std::fs::write(&seed_file, format!("{seed}\n")).unwrap();
    let (_nats, nats_port) = nats_server(
        &dir,
        &format!(
            "authorization {{ users = [ {{ user: mrt, password: \"{NATS_PASSWORD}\" }}, \
             {{ nkey: {} }} ] }}",
            nkey.public_key()
        ),
    );
    let (_redis, redis_port) = redis_server(&dir, &["--requirepass", REDIS_PASSWORD], false);
    let env = base_env(
        &dir,
        &format!("nats://127.0.0.1:{nats_port}"),
        &format!("redis://default:{REDIS_PASSWORD}@127.0.0.1:{redis_port}"),
    );
    let trace = [("RUST_LOG", Some("trace"))];
    let gateway_env = with(
        &env,
        &[
            ("NATS_USER", Some("mrt")),
            ("NATS_PASSWORD", Some(NATS_PASSWORD)),
        ],
    );
    let worker_env = with(&env, &[("NATS_NKEY", Some(seed_file.to_str().unwrap()))]);

    let (gateway, url) = start_gateway(&with(&gateway_env, &trace), &dir);
    let worker = start_worker(&with(&worker_env, &trace), &dir);
    submission_completes(&url).await;
    let (status, body) = get_json(&format!("{url}/readyz")).await;
    assert_eq!(status, 200, "{body}");

    // Wrong or missing credentials: one line naming what failed, never the secret.
    let wrong = "wrong-pw-0c1d2e";
    let stranger = dir.path().join("stranger.nk");
    let stranger_seed = nkeys::KeyPair::new_user().seed().unwrap();
    std::fs::write(&stranger, &stranger_seed).unwrap();
    let wrong_redis = format!("redis://default:{wrong}@127.0.0.1:{redis_port}");
    let no_redis_password = format!("redis://127.0.0.1:{redis_port}");
    let nats_refused = "NATS refused the credentials";
    let redis_refused = "Redis refused the credentials";
    // Which binary, its environment, the changes to it, what its error line says.
    type Case<'a> = (&'a str, &'a [(String, String)], &'a Changes<'a>, &'a str);
    let cases: [Case<'_>; 7] = [
        (
            "gateway",
            &gateway_env,
            &[("NATS_PASSWORD", Some(wrong))],
            nats_refused,
        ),
        (
            "gateway",
            &gateway_env,
            &[("NATS_USER", None), ("NATS_PASSWORD", None)],
            nats_refused,
        ),
        (
            "gateway",
            &gateway_env,
            &[("NATS_USER", None)],
            "NATS_PASSWORD is set without NATS_USER",
        ),
        (
            "worker",
            &worker_env,
            &[("NATS_NKEY", Some(stranger.to_str().unwrap()))],
            nats_refused,
        ),
        (
            "gateway",
            &gateway_env,
            &[("REDIS_URL", Some(&wrong_redis))],
            redis_refused,
        ),
        (
            "gateway",
            &gateway_env,
            &[("REDIS_URL", Some(&no_redis_password))],
            redis_refused,
        ),
        // Workers bind the keys of keyed jobs, so they check Redis at startup too.
        (
            "worker",
            &worker_env,
            &[("REDIS_URL", Some(&wrong_redis))],
            redis_refused,
        ),
    ];
    for (name, env, changes, expected) in cases {
        refused(name, env, changes, &dir, &[expected]);
    }

    // The same processes keep working; every line they logged at trace is clean.
    submission_completes(&url).await;
    let mut logs = vec![gateway.log_text(), worker.log_text()];
    assert!(
        logs[0].lines().count() > 100 && logs[1].lines().count() > 100,
        "trace logging is on"
    );
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("gateway-fail-") || name.starts_with("worker-fail-") {
            logs.push(std::fs::read_to_string(&path).unwrap());
        }
    }
    assert_no_secret(
        &logs,
        &[NATS_PASSWORD, REDIS_PASSWORD, &seed, &stranger_seed, wrong],
    );
}

/// A token NATS server: `NATS_TOKEN` (the gateway, at `RUST_LOG=trace`) and `token@` in
/// `NATS_URL` (the worker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens() {
    const TOKEN: &str = "nats-token-9d2c5b1a";
    let dir = TempDir::new("mrt-cred-");
    let (_nats, nats_port) = nats_server(&dir, &format!("authorization {{ token: \"{TOKEN}\" }}"));
    let (_redis, redis_port) = redis_server(&dir, &[], false);
    let env = base_env(
        &dir,
        &format!("nats://127.0.0.1:{nats_port}"),
        &format!("redis://127.0.0.1:{redis_port}"),
    );
    let gateway_env = with(
        &env,
        &[("NATS_TOKEN", Some(TOKEN)), ("RUST_LOG", Some("trace"))],
    );
    let (gateway, url) = start_gateway(&gateway_env, &dir);
    let worker = start_worker(
        &with(
            &env,
            &[(
                "NATS_URL",
                Some(&format!("nats://{TOKEN}@127.0.0.1:{nats_port}")),
            )],
        ),
        &dir,
    );
    submission_completes(&url).await;

    let wrong = "wrong-token-5a6b7c";
    let wrong_url = format!("nats://{wrong}@127.0.0.1:{nats_port}");
    let changes = [("NATS_URL", Some(wrong_url.as_str()))];
    refused(
        "worker",
        &env,
        &changes,
        &dir,
        &["NATS refused the credentials"],
    );
    let line = refused(
        "gateway",
        &gateway_env,
        &changes,
        &dir,
        &["NATS credentials are given more than once (a token in NATS_URL, NATS_TOKEN)"],
    );
    assert_no_secret(
        &[gateway.log_text(), worker.log_text(), line],
        &[TOKEN, wrong],
    );
}

/// NATS over TLS with client certificates required (`tls://`, `NATS_CA`, `NATS_CERT`,
/// `NATS_KEY`) and Redis over TLS (`rediss://`, `REDIS_CA`); an untrusted server certificate
/// or a missing client certificate stops the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls() {
    let dir = TempDir::new("mrt-cred-");
    let pki = Pki::new(&dir);
    let (_nats, nats_port) = nats_server(
        &dir,
        &format!(
            "tls {{ cert_file: {:?}, key_file: {:?}, ca_file: {:?}, verify: true, timeout: 10 }}",
            pki.server_cert, pki.server_key, pki.ca
        ),
    );
    let (_redis, redis_port) = redis_server(
        &dir,
        &[
            "--tls-cert-file",
            pki.server_cert.to_str().unwrap(),
            "--tls-key-file",
            pki.server_key.to_str().unwrap(),
            "--tls-ca-cert-file",
            pki.ca.to_str().unwrap(),
            "--tls-auth-clients",
            "no",
        ],
        true,
    );
    let env = with(
        &base_env(
            &dir,
            &format!("tls://127.0.0.1:{nats_port}"),
            &format!("rediss://127.0.0.1:{redis_port}"),
        ),
        &[
            ("NATS_CA", Some(&path(&pki.ca))),
            ("NATS_CERT", Some(&path(&pki.client_cert))),
            ("NATS_KEY", Some(&path(&pki.client_key))),
            ("REDIS_CA", Some(&path(&pki.ca))),
        ],
    );
    let (_gateway, url) = start_gateway(&env, &dir);
    let _worker = start_worker(&env, &dir);
    submission_completes(&url).await;

    let other_ca = path(&pki.other_ca);
    let ca = path(&pki.ca);
    let cases: [(&str, &Changes<'_>, &[&str]); 4] = [
        (
            "gateway",
            &[("NATS_CA", Some(&other_ca))],
            &["TLS with NATS failed", "UnknownIssuer"],
        ),
        (
            "worker",
            &[("NATS_CERT", None), ("NATS_KEY", None)],
            &["TLS with NATS failed"],
        ),
        (
            "gateway",
            &[("REDIS_CA", Some(&other_ca))],
            &["TLS with Redis failed", "UnknownIssuer"],
        ),
        (
            "gateway",
            &[("NATS_KEY", Some(&ca))],
            &["NATS_KEY holds no PEM private key"],
        ),
    ];
    for (name, changes, expected) in cases {
        refused(name, &env, changes, &dir, expected);
    }
}
