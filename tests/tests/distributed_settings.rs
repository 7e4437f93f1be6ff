//! Distributed mode: settings of an existing namespace follow the processes started on it. A
//! worker restarted with another `--ack-wait-ms` changes the lease for real (time to detect a
//! killed worker), and a worker heartbeats at the lease the server holds, never at its flag's.
//! A worker's `--append-pace-ms` stores a token stream in fewer messages, with the same events.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use e2e_tests::*;

const ACK_WAIT: &str = "MODEL_RUNTIME_ACK_WAIT_MS";

/// The workers' consumer's `ack_wait` on the server, once the consumer exists.
async fn consumer_ack_wait(cluster: &Cluster) -> Option<Duration> {
    let js = testkit::jetstream::connect(&cluster.nats.url()).await;
    let upper = cluster.namespace.to_ascii_uppercase();
    let stream = js.get_stream(format!("{upper}_JOBS")).await.ok()?;
    let info = stream
        .consumer_info(format!("{}_workers", cluster.namespace))
        .await
        .ok()?;
    Some(info.config.ack_wait)
}

/// Starts a worker with `ack_wait_ms`, waits until the consumer holds that lease, and kills the
/// worker, leaving the consumer behind as the namespace's first settings.
async fn leave_a_consumer_with(cluster: &Cluster, ack_wait_ms: u64) {
    let first = cluster.worker_with(&[(ACK_WAIT, &ack_wait_ms.to_string())]);
    poll_until(PROMPT, Duration::from_millis(50), async || {
        if consumer_ack_wait(cluster).await == Some(Duration::from_millis(ack_wait_ms)) {
            Ok(())
        } else {
            Err(first.log_text())
        }
    })
    .await;
    first.signal("KILL");
}

/// A gateway over a mock of `chunks` chunks 300 ms apart, on a namespace whose consumer was
/// first made with a lease of `first_ack_wait_ms`; then a worker with `ack_wait_ms` (as a flag
/// value) and one execution submitted. Returns what runs and the execution's id.
async fn after_a_first_lease(
    chunks: usize,
    first_ack_wait_ms: u64,
    ack_wait_ms: &str,
) -> (Cluster, Gateway, Process, String) {
    let cluster = Cluster::start(&chunked_mock(300, chunks));
    let gateway = cluster.gateway();
    leave_a_consumer_with(&cluster, first_ack_wait_ms).await;
    let worker = cluster.worker_with(&[(ACK_WAIT, ack_wait_ms)]);
    let id = submit_accepted(&gateway.url, &text_request("hi")).await;
    (cluster, gateway, worker, id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shorter_ack_wait_on_restart_detects_a_killed_worker_in_seconds() {
    let (cluster, gateway, doomed, id) = after_a_first_lease(100, 30_000, "3000").await;
    // Running, with output: the worker holds the job.
    wait_snapshot(&gateway.url, &id, "running with output", PROMPT, |s| {
        s["last_sequence"].as_u64().unwrap_or(0) >= 3
    })
    .await;
    doomed.signal("KILL");
    let killed_at = Instant::now();
    let _survivor = cluster.worker_with(&[(ACK_WAIT, "3000")]);
    // With the 30 s lease of the first consumer this would take 30 s.
    wait_snapshot(&gateway.url, &id, "failed", Duration::from_secs(25), |s| {
        s["status"] == "failed"
    })
    .await;
    let took = killed_at.elapsed();
    eprintln!("the killed worker's execution failed {took:?} after the kill");
    assert!(
        took < Duration::from_secs(15),
        "the killed worker's execution failed after {took:?}; the 3 s lease was not applied"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_started_after_a_shorter_lease_keeps_healthy_executions_alive() {
    // 25 chunks every 300 ms: about 7.5 s, far longer than the 2 s lease of the first worker.
    let (_cluster, gateway, _worker, id) = after_a_first_lease(25, 2_000, "30000").await;
    let snap = wait_terminal(&gateway.url, &id).await;
    assert_eq!(snap["status"], "succeeded", "{snap}");
}

/// Runs `binary` on the cluster's namespace with `extra` env and waits for it to exit (it must,
/// within the bound): its exit code and log.
fn run_to_exit(cluster: &Cluster, binary_name: &str, extra: (&str, &str)) -> (Option<i32>, String) {
    let log = cluster
        .dir
        .path()
        .join(format!("{binary_name}-refused.log"));
    let mut command = std::process::Command::new(binary(binary_name));
    command
        .env_clear()
        .envs(cluster.env())
        .env(extra.0, extra.1)
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .args(if binary_name == "gateway" {
            &["--port", "0"][..]
        } else {
            &[]
        })
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let mut child = command.spawn().unwrap();
    let deadline = Instant::now() + PROMPT;
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!(
                "{binary_name} kept running: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (code, std::fs::read_to_string(&log).unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_with_several_partitions_serves_every_gateway_and_keeps_its_count() {
    const PARTITIONS: &str = "MODEL_RUNTIME_PARTITIONS";
    let mut cluster = Cluster::start(&chunked_mock(2, 4));
    cluster.extra_env.push((PARTITIONS.into(), "3".into()));
    let ([g1, g2], _workers) = cluster.processes::<2, 1>();
    // 30 executions: each of the three partitions holds some (odds of one left empty < 1e-4).
    for _ in 0..30 {
        let id = submit_accepted(&g1.url, &text_request("hi")).await;
        let all = events(&g2.url, &id, 0).await;
        assert_log_well_formed(&all);
        let deltas = all.iter().filter(|e| e["type"] == "output.delta").count();
        assert_eq!(deltas, 4);
        assert_eq!(all.last().unwrap()["type"], "execution.completed");
    }
    let js = testkit::jetstream::connect(&cluster.nats.url()).await;
    let layout = runtime::nats::EventShards::new(cluster.namespace.clone(), 3)
        .unwrap()
        .with_lanes(runtime::nats::DEFAULT_TENANT_LANES)
        .unwrap();
    for name in layout.streams() {
        let state = testkit::jetstream::stream_state(&js, &name).await;
        assert!(state.messages > 0, "{name} holds no log");
    }
    // Each partition's jobs went through its own stream and consumer (work-queue streams
    // drop acknowledged jobs, so their last sequence shows what they carried): the consumer of
    // the default tenant's lane, which anonymous submits go to.
    let lane = layout.lane_of(protocol::Tenant::DEFAULT_NAME);
    for (name, consumer) in
        (0..3).map(|p| (layout.jobs_stream(p), layout.jobs_lane_consumer(p, lane)))
    {
        let state = testkit::jetstream::stream_state(&js, &name).await;
        assert!(state.last_sequence > 0, "{name} carried no job");
        let stream = js.get_stream(&name).await.unwrap();
        let info = stream
            .consumer_info(&consumer)
            .await
            .unwrap_or_else(|e| panic!("{name} has no consumer {consumer}: {e}"));
        assert!(
            info.delivered.stream_sequence > 0,
            "{consumer} delivered nothing"
        );
    }
    // Processes asking for no count use the namespace's; another count stops the start, and
    // the message names both counts, under the flag's name and its earlier one alike.
    cluster.extra_env.clear();
    let g3 = cluster.gateway();
    let id = submit_accepted(&g3.url, &text_request("hi")).await;
    assert_eq!(
        events(&g1.url, &id, 0).await.last().unwrap()["type"],
        "execution.completed"
    );
    for (binary_name, variable) in [
        ("gateway", PARTITIONS),
        ("worker", PARTITIONS),
        ("worker", "MODEL_RUNTIME_EVENT_SHARDS"),
    ] {
        let (code, log) = run_to_exit(&cluster, binary_name, (variable, "2"));
        assert_ne!(code, Some(0), "{binary_name}: {log}");
        assert!(
            log.contains("has 3 partition(s) and this process asks for 2"),
            "{binary_name} with {variable}: {log}"
        );
    }
    // The tenant lanes are fixed the same way: 8 for a namespace created without the setting.
    for binary_name in ["gateway", "worker"] {
        let (code, log) = run_to_exit(&cluster, binary_name, ("MODEL_RUNTIME_TENANT_LANES", "2"));
        assert_ne!(code, Some(0), "{binary_name}: {log}");
        assert!(
            log.contains("has 8 tenant lane(s) per partition and this process asks for 2"),
            "{binary_name}: {log}"
        );
    }
}

/// Messages the events stream holds for execution `id` (the one-stream layout).
async fn messages_of(cluster: &Cluster, id: &str) -> usize {
    use futures_util::TryStreamExt;
    let js = testkit::jetstream::connect(&cluster.nats.url()).await;
    let upper = cluster.namespace.to_ascii_uppercase();
    let stream = js.get_stream(format!("{upper}_EVENTS")).await.unwrap();
    let subject = format!("{}.events.{id}", cluster.namespace);
    let counts: Vec<(String, usize)> = stream
        .info_with_subjects(&subject)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    counts.into_iter().map(|(_, n)| n).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paced_worker_stores_a_token_stream_in_fewer_messages_with_the_same_events() {
    const PACE: &str = "MODEL_RUNTIME_APPEND_PACE_MS";
    // 20 deltas 10 ms apart: without a pace, a round trip shorter than 10 ms stores about one
    // message per delta (22 messages in all when measured); a 100 ms pace holds each interval's
    // deltas for one message.
    let cluster = Cluster::start(&chunked_mock(10, 20));
    let gateway = cluster.gateway();
    let _worker = cluster.worker_with(&[(PACE, "100")]);
    let id = submit_accepted(&gateway.url, &text_request("hi")).await;
    let all = events(&gateway.url, &id, 0).await;
    assert_log_well_formed(&all);
    let texts = delta_texts(&all);
    let expected: Vec<String> = (0..20).map(|i| format!("c{i} ")).collect();
    assert_eq!(texts, expected);
    assert_eq!(all.last().unwrap()["type"], "execution.completed");
    // accepted, route.selected, the first delta alone, then one message per 100 ms (the
    // deltas span about 200 ms; up to twice that leaves room for a busy machine) and the last
    // deltas with the terminal events: 6 when measured.
    let messages = messages_of(&cluster, &id).await;
    eprintln!("{messages} messages for {} events", all.len());
    assert!(
        (4..=12).contains(&messages),
        "{messages} messages for {} events",
        all.len()
    );
    // Resuming inside a stored run gives the same events.
    let after = all[5]["sequence"].as_u64().unwrap();
    let resumed = events(&gateway.url, &id, after).await;
    assert_eq!(resumed, all[5 + 1..].to_vec());
}
