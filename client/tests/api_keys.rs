//! API keys from the client's side: `mrt keygen` output accepted by a real gateway, the key
//! sent as a bearer token by the library and by `mrt` (flag or `MODEL_RUNTIME_API_KEY`), and
//! never printed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use model_runtime_client::{Client, ClientError, SubmitOptions, text_request};
use protocol::{ErrorCode, Sequence};
use serde_json::{Value, json};
use support::*;

/// Runs `mrt ARGS` with `env`.
async fn mrt(args: &[&str], env: &[(&str, &str)]) -> Run {
    run_mrt(args, env, None).await
}

/// `mrt keygen --json`: the key and its entry.
async fn keygen(tenant: &str, id: &str, scopes: Option<&str>) -> (String, Value) {
    let mut args = vec!["keygen", "--json", "--tenant", tenant, "--id", id];
    if let Some(scopes) = scopes {
        args.extend(["--scopes", scopes]);
    }
    let run = mrt(&args, &[]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let doc: Value = serde_json::from_str(run.stdout.trim()).expect("one JSON document");
    let key = doc["key"].as_str().expect("key").to_owned();
    (key, doc["entry"].clone())
}

async fn gateway_with(keys: Vec<Value>) -> Gateway {
    Gateway::start(json!({
        "providers": [mock(json!({}))],
        "auth": {"tenants": {"t1": {}}, "keys": keys}
    }))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keygen_output_is_accepted_and_mrt_sends_the_key() {
    let (key, entry) = keygen("t1", "ci", None).await;
    assert!(key.starts_with("mrt_") && key.len() >= 4 + 32, "{key}");
    assert_eq!(entry["scopes"], json!(["submit", "read", "cancel"]));
    let (reader_key, reader) = keygen("t1", "reader", Some("read")).await;
    assert_ne!(key, reader_key);
    let gw = gateway_with(vec![entry, reader]).await;
    let url = gw.base.as_str();

    let run = mrt(
        &["submit", "--text", "hi"],
        &[("MODEL_RUNTIME_URL", url), ("MODEL_RUNTIME_API_KEY", &key)],
    )
    .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let id = run.stdout.trim().to_owned();
    let run = mrt(
        &["--api-key", &reader_key, "get", &id],
        &[("MODEL_RUNTIME_URL", url)],
    )
    .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    // Missing scope, missing key, wrong key: exit 3 with the code, never the key.
    let run = mrt(
        &["--api-key", &reader_key, "cancel", &id],
        &[("MODEL_RUNTIME_URL", url)],
    )
    .await;
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert!(run.stderr.contains("permission_denied"), "{}", run.stderr);
    let run = mrt(&["get", &id], &[("MODEL_RUNTIME_URL", url)]).await;
    assert_eq!(run.code, 3);
    assert!(run.stderr.contains("unauthenticated"), "{}", run.stderr);
    let wrong = format!("{key}x");
    let run = mrt(
        &["get", &id],
        &[
            ("MODEL_RUNTIME_URL", url),
            ("MODEL_RUNTIME_API_KEY", &wrong),
        ],
    )
    .await;
    assert_eq!(run.code, 3);
    assert!(run.stderr.contains("unauthenticated"), "{}", run.stderr);
    assert!(!run.stderr.contains(&key[4..]) && !run.stdout.contains(&key[4..]));
    // `--help` shows the variable but never its value.
    let run = mrt(&["--help"], &[("MODEL_RUNTIME_API_KEY", &key)]).await;
    assert!(
        run.stdout.contains("MODEL_RUNTIME_API_KEY"),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains(&key[4..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_library_sends_the_key_on_every_call_and_never_shows_it() {
    let generated = model_runtime_client::keygen::generate("t1", "lib", None).unwrap();
    let entry = serde_json::to_value(&generated.entry).unwrap();
    let gw = gateway_with(vec![entry]).await;
    let client = Client::builder(&gw.base)
        .api_key(generated.key.clone())
        .build()
        .unwrap();
    assert!(!format!("{client:?}").contains(&generated.key[4..]));
    let submission = client
        .submit(
            &text_request("text-generation", "hi"),
            &SubmitOptions::idempotent(),
        )
        .await
        .unwrap();
    let mut events = client
        .events(submission.execution_id, Sequence::ZERO)
        .unwrap();
    let mut last = None;
    while let Some(event) = events.next().await {
        last = Some(event.unwrap());
    }
    assert!(last.unwrap().is_terminal());
    client.get(submission.execution_id).await.unwrap();
    client.result(submission.execution_id).await.unwrap();
    client.runtime_info().await.unwrap();
    client.providers().await.unwrap();

    let anonymous = Client::new(&gw.base).unwrap();
    match anonymous.get(submission.execution_id).await {
        Err(ClientError::Api(e)) => {
            assert_eq!(
                (e.status, e.code, e.retryable),
                (401, ErrorCode::Unauthenticated, false)
            );
        }
        other => panic!("expected 401, got {other:?}"),
    }
    for bad in ["", "has space", "line\nbreak"] {
        let error = Client::builder(&gw.base).api_key(bad).build().unwrap_err();
        assert!(matches!(error, ClientError::InvalidApiKey), "{bad:?}");
        assert!(!error.to_string().contains("space"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_secret_prints_a_fresh_standard_webhooks_secret() {
    let first = mrt(&["webhook-secret"], &[]).await;
    assert_eq!(first.code, 0, "{}", first.stderr);
    let secret = first.stdout.trim();
    assert!(secret.starts_with("whsec_"), "{secret}");
    // 32 bytes of base64: 44 characters.
    assert_eq!(secret.len(), "whsec_".len() + 44, "{secret}");
    let json = mrt(&["webhook-secret", "--json"], &[]).await;
    assert_eq!(json.code, 0, "{}", json.stderr);
    let doc: Value = serde_json::from_str(json.stdout.trim()).unwrap();
    let other = doc["secret"].as_str().unwrap();
    assert!(other.starts_with("whsec_"));
    assert_ne!(other, secret);
}
