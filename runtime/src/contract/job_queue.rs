//! The job queue's contract ([`JobQueue`]).

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use protocol::{ExecutionId, ExecutionRequest, Timestamp};

use super::PROMPT;
use crate::job::{Delivery, Job, JobQueue};

/// A job for `id` with a minimal text-generation request.
pub fn job(id: ExecutionId) -> Job {
    let request: ExecutionRequest = serde_json::from_str(
        r#"{"ability":"text-generation","input":[{"type":"text","text":"hi"}]}"#,
    )
    .unwrap();
    Job {
        execution_id: id,
        request,
        accepted_at: Timestamp::now(),
        deadline_at: Timestamp::now(),
        traceparent: None,
        key: None,
        tenant: None,
    }
}

/// Runs every job-queue check. Closes the queue at the end.
pub async fn job_queue_suite(queue: Arc<dyn JobQueue>) {
    queue.ready().await.unwrap();
    let a = job(ExecutionId::new_random());
    let b = job(ExecutionId::new_random());
    queue.publish(&a).await.unwrap();
    queue.publish(&a).await.unwrap(); // absorbed by the dedupe window
    queue.publish(&b).await.unwrap();
    // A scan lists held jobs without taking them, in publish order within a partition, and
    // continues after a position.
    let held = scan_all(&*queue).await;
    let mut held_ids: Vec<_> = held.iter().map(|(_, j)| j.execution_id).collect();
    held_ids.sort();
    let mut published = vec![a.execution_id, b.execution_id];
    published.sort();
    assert_eq!(held_ids, published);
    let find = |id| *held.iter().find(|(_, j)| j.execution_id == id).unwrap();
    let ((pa, held_a), (pb, held_b)) = (find(a.execution_id), find(b.execution_id));
    if pa == pb {
        assert!(held_a.position < held_b.position);
    }
    assert_eq!(held_a.deadline_at, a.deadline_at);
    assert_eq!(
        queue.scan_partition(pa, 0, 1).await.unwrap().len(),
        1,
        "the limit holds"
    );
    let after_a = queue.scan_partition(pa, held_a.position, 10).await.unwrap();
    let after_ids: Vec<_> = after_a.iter().map(|j| j.execution_id).collect();
    if pa == pb {
        assert_eq!(after_ids, [b.execution_id]);
    } else {
        assert!(after_ids.is_empty(), "{after_ids:?}");
    }
    // Where a queue says where a partition starts, it never passes a job still held, and it
    // counts the jobs held.
    let says = queue.held_span(pa).await.unwrap().first > 0;
    assert!(queue.held_span(pa).await.unwrap().first <= held_a.position);
    assert!(queue.held_span(pb).await.unwrap().first <= held_b.position);
    if says {
        assert_eq!(held_jobs(&*queue).await, 2);
    }
    let first = receive_promptly(&*queue).await;
    first.handle.in_progress().await.unwrap();
    assert!(!first.handle.withdrawn().await.unwrap());
    first.handle.ack().await.unwrap();
    let second = receive_promptly(&*queue).await;
    second.handle.ack().await.unwrap();
    // Acknowledged jobs leave the scan.
    let until = tokio::time::Instant::now() + PROMPT;
    while !scan_all(&*queue).await.is_empty() {
        assert!(
            tokio::time::Instant::now() < until,
            "acked jobs still scanned"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // And once they left, it starts past them and holds none.
    if says {
        for (partition, position) in [(pa, held_a.position), (pb, held_b.position)] {
            let until = tokio::time::Instant::now() + PROMPT;
            while queue.held_span(partition).await.unwrap().first <= position {
                assert!(
                    tokio::time::Instant::now() < until,
                    "the partition still starts at an acknowledged job"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        assert_eq!(held_jobs(&*queue).await, 0);
    }
    let mut got = vec![first.job.execution_id, second.job.execution_id];
    got.sort();
    let mut want = vec![a.execution_id, b.execution_id];
    want.sort();
    assert_eq!(got, want, "each job delivered once");
    assert_eq!(first.delivered, 1);
    assert_eq!(
        first.job,
        if first.job.execution_id == a.execution_id {
            a.clone()
        } else {
            b.clone()
        }
    );
    // The duplicate publish is not delivered.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), queue.receive())
            .await
            .is_err()
    );
    // Withdrawing: a delivery of the job learns it, a waiting job is never delivered, and a
    // job never published stays so.
    let (c, d, e) = (
        job(ExecutionId::new_random()),
        job(ExecutionId::new_random()),
        job(ExecutionId::new_random()),
    );
    queue.publish(&c).await.unwrap();
    queue.publish(&d).await.unwrap();
    // Either one (a queue of several partitions delivers them in no set order).
    let held = receive_promptly(&*queue).await;
    assert!([c.execution_id, d.execution_id].contains(&held.job.execution_id));
    for withdrawn in [&c, &d, &e, &d] {
        queue.withdraw(withdrawn).await.unwrap();
    }
    assert!(held.handle.withdrawn().await.unwrap());
    held.handle.ack().await.unwrap();
    assert!(
        scan_all(&*queue).await.is_empty(),
        "withdrawn jobs are not held"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(300), queue.receive())
            .await
            .is_err(),
        "withdrawn jobs are not delivered"
    );
    // Concurrent receivers share jobs without duplicates.
    let ids: Vec<_> = (0..20).map(|_| ExecutionId::new_random()).collect();
    let mut receivers = Vec::new();
    for _ in 0..4 {
        let queue = Arc::clone(&queue);
        receivers.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            while let Ok(Ok(Some(d))) =
                tokio::time::timeout(Duration::from_millis(1500), queue.receive()).await
            {
                d.handle.ack().await.unwrap();
                mine.push(d.job.execution_id);
            }
            mine
        }));
    }
    for id in &ids {
        queue.publish(&job(*id)).await.unwrap();
    }
    let mut received = Vec::new();
    for r in receivers {
        received.extend(r.await.unwrap());
    }
    received.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(received, expected);
    // One request for up to three jobs yields at most three, each job is delivered once, and
    // what a request did not take is left for the next.
    let batch: Vec<_> = (0..5).map(|_| job(ExecutionId::new_random())).collect();
    for j in &batch {
        queue.publish(j).await.unwrap();
    }
    let mut taken = Vec::new();
    let until = tokio::time::Instant::now() + 4 * PROMPT;
    while taken.len() < batch.len() {
        assert!(tokio::time::Instant::now() < until, "jobs left undelivered");
        let mut deliveries = tokio::time::timeout(PROMPT, queue.receive_up_to(3))
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let mut in_request = 0;
        while let Some(delivery) = deliveries.next().await {
            let delivery = delivery.unwrap();
            delivery.handle.ack().await.unwrap();
            taken.push(delivery.job.execution_id);
            in_request += 1;
        }
        assert!(in_request <= 3, "{in_request} jobs for a request of 3");
    }
    taken.sort();
    let mut published: Vec<_> = batch.iter().map(|j| j.execution_id).collect();
    published.sort();
    assert_eq!(taken, published);
    // Closing ends pending receives.
    let pending = {
        let queue = Arc::clone(&queue);
        tokio::spawn(async move { queue.receive().await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    queue.close();
    assert!(
        tokio::time::timeout(PROMPT, pending)
            .await
            .unwrap()
            .unwrap()
            .unwrap()
            .is_none()
    );
}

/// The jobs every partition says it holds.
async fn held_jobs(queue: &dyn JobQueue) -> u64 {
    let mut jobs = 0;
    for partition in 0..queue.partitions().max(1) {
        jobs += queue.held_span(partition).await.unwrap().jobs.unwrap();
    }
    jobs
}

/// Every job `queue` holds (at most 100 a partition), with its partition.
async fn scan_all(queue: &dyn JobQueue) -> Vec<(usize, crate::job::QueuedJob)> {
    let mut all = Vec::new();
    for partition in 0..queue.partitions() {
        for job in queue.scan_partition(partition, 0, 100).await.unwrap() {
            all.push((partition, job));
        }
    }
    all
}

/// The next delivery of `queue`, which must come promptly.
async fn receive_promptly(queue: &dyn JobQueue) -> Delivery {
    tokio::time::timeout(PROMPT, queue.receive())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
}
