//! Event streams through a proxy that cuts the server's bytes at random offsets: the client's
//! events and text equal the uncut run, every time.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use protocol::{EventBody, ExecutionStatus, RuntimeEvent, Sequence};
use serde_json::json;
use support::*;

/// Forty chunks mixing ASCII, multi-byte characters and newlines, so that cuts land inside
/// characters, inside JSON escapes and between frames.
fn chunks() -> Vec<String> {
    (0..40)
        .map(|i| match i % 5 {
            0 => format!("w{i} "),
            1 => "é".to_owned(),
            2 => "🙂 ".to_owned(),
            3 => "line\n".to_owned(),
            _ => format!("\"{i}\""),
        })
        .collect()
}

fn text_of(events: &[RuntimeEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::OutputDelta { delta, .. } => Some(delta.as_str()),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomly_cut_streams_resume_to_exactly_the_uncut_run() {
    let chunks = chunks();
    let gw = Gateway::start(json!({
        "providers": [mock(json!({ "chunks": chunks, "delay_ms": 3 }))]
    }))
    .await;
    let direct = gw.client();
    let expected_text = chunks.concat();
    let mut total_cuts = 0;
    let mut resumed_runs = 0;
    for seed in 0..20u64 {
        // Every 8th connection passes uncut, so at most 7 failures in a row (budget: 12).
        let proxy = CutProxy::start(gw.addr, seed, 1500, 8).await;
        let through_proxy = client_for(&proxy.base);
        let submission = submit_plain(&direct, "text-generation", "hi")
            .await
            .unwrap();
        let id = submission.execution_id;
        if seed % 2 == 1 {
            // Odd seeds replay a finished log; even seeds follow the execution live.
            wait_terminal(&direct, id).await;
        }

        let mut stream = through_proxy.events(id, Sequence::ZERO).unwrap();
        let mut got = Vec::new();
        while let Some(item) = stream.next().await {
            got.push(item.unwrap_or_else(|e| panic!("seed {seed}: {e}")));
        }

        let mut uncut = Vec::new();
        let mut reference = direct.events(id, Sequence::ZERO).unwrap();
        while let Some(item) = reference.next().await {
            uncut.push(item.unwrap());
        }
        assert_eq!(reference.connections(), 1);

        assert_eq!(got, uncut, "seed {seed}: events differ from the uncut run");
        assert_eq!(text_of(&got), expected_text, "seed {seed}: text differs");
        assert_eq!(got.len(), chunks.len() + 4, "seed {seed}");
        for (i, event) in got.iter().enumerate() {
            assert_eq!(event.sequence, Sequence(i as u64 + 1), "seed {seed}");
        }
        let last = got.last().unwrap();
        assert_eq!(last.status, ExecutionStatus::Succeeded, "seed {seed}");
        assert_eq!(stream.last_sequence(), last.sequence);
        assert!(
            stream.next().await.is_none(),
            "nothing after the terminal event"
        );

        total_cuts += proxy.cuts.load(std::sync::atomic::Ordering::SeqCst);
        if stream.connections() > 1 {
            resumed_runs += 1;
        }
    }
    eprintln!("{total_cuts} cuts, {resumed_runs} of 20 runs resumed");
    // The test means something only if streams were actually cut and resumed.
    assert!(total_cuts >= 40, "only {total_cuts} cuts");
    assert!(resumed_runs >= 15, "only {resumed_runs} runs resumed");
}
