//! Distributed mode end to end: real `gateway` and `worker` processes over a private NATS
//! JetStream and Redis. Each test owns its servers, namespace and ports.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashSet;
use std::time::{Duration, Instant};

use e2e_tests::*;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_on_one_gateway_stream_and_resume_on_another() {
    resume_on_another_gateway(Layout::Single).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_on_one_gateway_stream_and_resume_on_another_with_partitions() {
    resume_on_another_gateway(Layout::Partitioned).await;
}

async fn resume_on_another_gateway(layout: Layout) {
    let cluster = layout.cluster(&chunked_mock(150, 8));
    let ([g1, g2], _workers) = cluster.processes::<2, 2>();
    let id = layout.submit_followed(&g1.url, &text_request("hi")).await;
    // Read the first four events from gateway 2, then drop the connection.
    let head = read_events(event_stream(&g2.url, &id).await, Some(4)).await;
    let last_seen = head[3]["sequence"].as_u64().unwrap();
    // Resume on gateway 1 from the last committed sequence: no gap, no duplicate.
    let tail = events(&g1.url, &id, last_seen).await;
    let mut all = head[..4].to_vec();
    all.extend(tail);
    assert_log_well_formed(&all);
    assert_eq!(count_of(&all, "output.delta"), 8);
    assert_eq!(all.last().unwrap()["type"], "execution.completed");
    // Both gateways serve the same snapshot.
    let s1 = wait_terminal(&g1.url, &id).await;
    let s2 = wait_terminal(&g2.url, &id).await;
    assert_eq!(s1, s2);
    assert_eq!(
        s1["result"]["outputs"][0]["text"],
        "c0 c1 c2 c3 c4 c5 c6 c7 "
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_idempotency_key_across_gateways_gives_one_execution_and_one_run() {
    one_key_across_gateways(Layout::Single).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_idempotency_key_across_gateways_gives_one_run_with_partitions() {
    one_key_across_gateways(Layout::Partitioned).await;
}

/// 50 concurrent submits of one key over two gateways. With several partitions the executions
/// created for the key (one per submit that reached a gateway before the key was bound) fall
/// in different partitions, so the one answered and the ones closed unrun do too.
async fn one_key_across_gateways(layout: Layout) {
    let cluster = layout.cluster(&chunked_mock(50, 3));
    let ([g1, g2], _workers) = cluster.processes::<2, 2>();
    let key = unique_key();
    let mut tasks = Vec::new();
    for i in 0..50 {
        let url = if i % 2 == 0 {
            g1.url.clone()
        } else {
            g2.url.clone()
        };
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            submit(&url, &text_request("same"), Some(&key)).await
        }));
    }
    let mut ids = HashSet::new();
    let mut created = 0;
    for t in tasks {
        let (status, body) = t.await.unwrap();
        assert!(status == 202 || status == 200, "{status} {body}");
        if status == 202 {
            created += 1;
        } else {
            assert_eq!(body["idempotent_replay"], true);
        }
        ids.insert(body["execution_id"].as_str().unwrap().to_owned());
    }
    assert_eq!(ids.len(), 1, "one execution");
    assert_eq!(created, 1, "one creation");
    let id = ids.into_iter().next().unwrap();
    wait_terminal(&g1.url, &id).await;
    let all = events(&g2.url, &id, 0).await;
    assert_log_well_formed(&all);
    assert_eq!(count_of(&all, "route.selected"), 1, "one provider run");
    // A different request under the same key conflicts.
    let (status, body) = submit(&g2.url, &text_request("different"), Some(&key)).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], "idempotency_conflict");
    // The submits that reached a gateway before it saw the key bound created their execution
    // while binding the key (some in the background, after their answer): every execution but
    // the one answered ends closed unrun (by its worker or its gateway), never routed. Checked
    // until a listing of the logs finds nothing new.
    let mut checked = HashSet::from([id.clone()]);
    poll_until(PROMPT, Duration::from_millis(500), async || {
        let logged = logged_executions(&cluster, layout).await;
        let new: Vec<String> = logged
            .into_iter()
            .filter(|other| !checked.contains(other))
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        for other in new {
            let snap = wait_terminal(&g1.url, &other).await;
            assert_eq!(snap["status"], "failed", "{snap}");
            assert_eq!(
                snap["error"]["message"], "Execution could not be queued",
                "{snap}"
            );
            assert!(snap["target"].is_null(), "{other} was routed: {snap}");
            checked.insert(other);
        }
        Err("new executions were logged".to_owned())
    })
    .await;
    assert!(checked.len() <= 52, "{} executions", checked.len());
    eprintln!("{} executions created for one key", checked.len());
}

/// The executions that have a log in any of `cluster`'s events streams.
async fn logged_executions(cluster: &Cluster, layout: Layout) -> Vec<String> {
    use futures_util::TryStreamExt;
    let js = testkit::jetstream::connect(&cluster.nats.url()).await;
    let shards =
        runtime::nats::EventShards::new(cluster.namespace.clone(), layout.partitions()).unwrap();
    let mut logged = Vec::new();
    for shard in 0..layout.partitions() {
        let stream = js.get_stream(shards.stream(shard)).await.unwrap();
        let subjects: Vec<(String, usize)> = stream
            .info_with_subjects(shards.subjects(shard))
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        // A log's subject ends with its execution's id.
        logged.extend(
            subjects
                .into_iter()
                .filter_map(|(subject, _)| subject.rsplit('.').next().map(str::to_owned)),
        );
    }
    logged
}

/// How many of `events` are of type `kind`.
fn count_of(events: &[Value], kind: &str) -> usize {
    types(events).iter().filter(|t| **t == kind).count()
}

fn unique_key() -> String {
    testkit::unique_namespace("key-")
}

/// Waits until the log of `id` (read through `gateway`) satisfies `pred`.
async fn wait_for_events(gateway: &str, id: &str, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    poll_until(PROMPT, Duration::from_millis(50), async || {
        let resp = event_stream(gateway, id).await;
        // Read what is there now without waiting for the end of a live stream.
        let partial =
            tokio::time::timeout(Duration::from_millis(300), read_events(resp, None)).await;
        let events = match partial {
            Ok(all) => all,
            Err(_) => {
                let snap = get_json(&format!("{gateway}/v1/executions/{id}")).await.1;
                let n = snap["last_sequence"].as_u64().unwrap_or(0) as usize;
                read_events(event_stream(gateway, id).await, Some(n)).await
            }
        };
        if pred(&events) {
            Ok(events)
        } else {
            Err(format!("condition not reached: {events:?}"))
        }
    })
    .await
}

/// Submits a text request (of `layout`'s followed partition) and waits until its first output
/// delta is in the log.
async fn streaming_execution(base: &str, layout: Layout) -> String {
    let id = layout.submit_followed(base, &text_request("hi")).await;
    wait_for_events(base, &id, |e| types(e).contains(&"output.delta")).await;
    id
}

/// Signals (`KILL`, `STOP`) the only worker while it streams an execution, then starts another
/// worker, which takes the redelivered job after the lease lapses. Returns what runs (the
/// signalled worker before the other), the execution's id and its terminal snapshot.
async fn lose_the_worker(
    layout: Layout,
    deployment: &Value,
    signal: &str,
) -> (Cluster, Gateway, Process, Process, String, Value) {
    let cluster = layout.cluster(deployment);
    let ([gateway], [first]) = cluster.processes::<1, 1>();
    let id = streaming_execution(&gateway.url, layout).await;
    first.signal(signal);
    let second = cluster.worker();
    let snap = wait_terminal(&gateway.url, &id).await;
    (cluster, gateway, first, second, id, snap)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_leaves_exactly_one_terminal_and_no_repeated_output() {
    killed_worker(Layout::Single).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_leaves_one_terminal_and_no_repeat_with_partitions() {
    killed_worker(Layout::Partitioned).await;
}

async fn killed_worker(layout: Layout) {
    let (_cluster, gateway, _first, _second, id, snap) =
        lose_the_worker(layout, &chunked_mock(300, 20), "KILL").await;
    assert_eq!(snap["status"], "failed");
    assert_eq!(snap["error"]["code"], "internal_error");
    assert_eq!(snap["error"]["retryable"], false);
    assert!(
        snap["error"]["message"]
            .as_str()
            .unwrap()
            .contains("remote outcome is unknown")
    );
    let all = events(&gateway.url, &id, 0).await;
    assert_log_well_formed(&all);
    let deltas = delta_texts(&all);
    let unique: HashSet<&&str> = deltas.iter().collect();
    assert_eq!(
        unique.len(),
        deltas.len(),
        "no output delivered twice: {deltas:?}"
    );
    assert_eq!(
        count_of(&all, "route.selected"),
        1,
        "the provider was not called again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_that_resumes_cannot_append() {
    stopped_worker(Layout::Single).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_that_resumes_cannot_append_with_partitions() {
    stopped_worker(Layout::Partitioned).await;
}

async fn stopped_worker(layout: Layout) {
    let (_cluster, gateway, zombie, _healthy, id, snap) =
        lose_the_worker(layout, &chunked_mock(400, 30), "STOP").await;
    assert_eq!(snap["error"]["code"], "internal_error");
    let final_sequence = snap["last_sequence"].as_u64().unwrap();
    zombie.signal("CONT");
    // Give the zombie time to try its next appends (chunks every 400 ms).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let all = events(&gateway.url, &id, 0).await;
    assert_log_well_formed(&all);
    assert_eq!(
        all.len() as u64,
        final_sequence,
        "nothing appended after the terminal event"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_restart_loses_no_acknowledged_event() {
    let mut cluster = Cluster::start(&chunked_mock(0, 5));
    let ([gateway], [_worker]) = cluster.processes::<1, 1>();
    let mut logs = Vec::new();
    for _ in 0..5 {
        let id = submit_accepted(&gateway.url, &text_request("hi")).await;
        wait_terminal(&gateway.url, &id).await;
        logs.push((id.clone(), events(&gateway.url, &id, 0).await));
    }
    cluster.nats.restart();
    for (id, before) in &logs {
        let after = poll_until(PROMPT, Duration::from_millis(100), async || {
            let resp = event_stream(&gateway.url, id).await;
            if resp.status().as_u16() == 200 {
                Ok(read_events(resp, None).await)
            } else {
                Err("gateway did not recover after the NATS restart".to_owned())
            }
        })
        .await;
        assert_eq!(&after, before);
    }
    // And new work flows again.
    let id = submit_accepted(&gateway.url, &text_request("after restart")).await;
    let snap = wait_terminal(&gateway.url, &id).await;
    assert_eq!(snap["status"], "succeeded");
}

/// Redis down: keyed submits answer 503 within 2 s and nothing of them runs. A keyed submit
/// binds its key while it creates the execution, so the first one, made before the gateway
/// knew, created its execution: its log is closed unrun and its job withdrawn before the
/// answer. While claims keep failing the gateway claims first, so the later ones publish
/// nothing at all. When Redis is back, keyed submits are accepted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_means_503_for_keyed_submits_and_nothing_runs() {
    let mut cluster = Cluster::start(&chunked_mock(0, 3));
    let ([gateway], [_worker]) = cluster.processes::<1, 1>();
    cluster.redis.kill();
    let js = testkit::jetstream::connect(&cluster.nats.url()).await;
    let jobs = format!("{}_JOBS", cluster.namespace.to_ascii_uppercase());
    let events = format!("{}_EVENTS", cluster.namespace.to_ascii_uppercase());
    for attempt in ["first", "second", "third"] {
        let published = testkit::jetstream::stream_state(&js, &jobs)
            .await
            .last_sequence;
        let started = Instant::now();
        let (status, body) = submit(&gateway.url, &text_request("hi"), Some("k-1")).await;
        assert_eq!(status, 503, "{attempt}: {body}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{attempt}: answered within 2 s: {:?}",
            started.elapsed()
        );
        assert_eq!(body["error"]["code"], "unavailable");
        assert_eq!(body["error"]["retryable"], true);
        let now = testkit::jetstream::stream_state(&js, &jobs).await;
        assert_eq!(now.messages, 0, "{attempt}: no job is left in the queue");
        if attempt != "first" {
            assert_eq!(
                now.last_sequence, published,
                "{attempt}: nothing was published"
            );
        }
    }
    // At most the first submission's log: `execution.accepted` and the unqueued failure (one
    // message when created closed, two otherwise), never claimed by a worker.
    let logged = testkit::jetstream::stream_state(&js, &events).await;
    assert!(
        logged.subjects_count <= 1 && logged.messages <= 2,
        "{logged:?}"
    );
    assert_eq!(get_json(&format!("{}/readyz", gateway.url)).await.0, 503);
    let (runtime_status, info) = get_json(&format!("{}/v1/runtime", gateway.url)).await;
    assert_eq!(runtime_status, 503);
    assert_eq!(info["state"], "unavailable");
    cluster.redis.restart();
    submit_until_accepted(&gateway.url, Some("k-1")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_down_means_503_within_two_seconds_and_recovery_by_itself() {
    let mut cluster = Cluster::start(&chunked_mock(0, 3));
    let ([gateway], [_worker]) = cluster.processes::<1, 1>();
    cluster.nats.kill();
    // The client notices the broken connection within its ping/read cycle; from then on every
    // submit is answered promptly.
    let deadline = Instant::now() + PROMPT;
    loop {
        let started = Instant::now();
        let (status, body) = submit(&gateway.url, &text_request("hi"), None).await;
        let took = started.elapsed();
        if status == 503 {
            assert!(
                took < Duration::from_secs(2),
                "503 within 2 s, took {took:?}"
            );
            assert_eq!(body["error"]["code"], "unavailable");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never answered 503: {status} {body}"
        );
    }
    assert_eq!(get_json(&format!("{}/readyz", gateway.url)).await.0, 503);
    cluster.nats.restart();
    let snap = submit_until_accepted(&gateway.url, None).await;
    assert_eq!(snap["status"], "succeeded");
}
