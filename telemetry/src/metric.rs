//! The metric catalogue of contract.md section 9: names, help, buckets, label values.
//!
//! Names follow Prometheus conventions and, where they exist, the OpenTelemetry GenAI semantic
//! conventions (dots become underscores). Labels are bounded: route templates (never raw paths),
//! numeric statuses, the deployment's provider and model ids, portable error codes. Execution ids,
//! keys and content never become labels.

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};

pub const HTTP_REQUESTS_TOTAL: &str = "mrt_http_requests_total";
pub const HTTP_REQUEST_DURATION_SECONDS: &str = "mrt_http_request_duration_seconds";
pub const EXECUTIONS_TOTAL: &str = "mrt_executions_total";
pub const EXECUTION_DURATION_SECONDS: &str = "mrt_execution_duration_seconds";
pub const QUEUE_WAIT_SECONDS: &str = "mrt_queue_wait_seconds";
pub const TIME_TO_FIRST_TOKEN_SECONDS: &str = "gen_ai_server_time_to_first_token_seconds";
pub const OPERATION_DURATION_SECONDS: &str = "gen_ai_client_operation_duration_seconds";
pub const TOKEN_USAGE: &str = "gen_ai_client_token_usage";
pub const PROVIDER_ATTEMPTS_TOTAL: &str = "mrt_provider_attempts_total";
pub const PROVIDER_INFLIGHT: &str = "mrt_provider_inflight";
pub const EVENT_APPEND_DURATION_SECONDS: &str = "mrt_event_append_duration_seconds";
pub const JOBS_PENDING: &str = "mrt_jobs_pending";
pub const WEBHOOK_DELIVERIES_TOTAL: &str = "mrt_webhook_deliveries_total";
pub const WEBHOOK_DELIVERY_SECONDS: &str = "mrt_webhook_delivery_seconds";
pub const WEBHOOK_PENDING: &str = "mrt_webhook_pending";
/// How long a worker's pace holds each execution's next output message now (`runtime::pace`):
/// the adaptive default holds 0 while the event store keeps up; a fixed pace shows its value.
/// Sampled by the worker at every scrape.
pub const APPEND_PACE_HOLD_SECONDS: &str = "mrt_append_pace_hold_seconds";
pub const JOB_REDELIVERIES_TOTAL: &str = "mrt_job_redeliveries_total";
/// A worker's claims of keyed jobs' idempotency keys, by outcome ([`key_claim`]).
pub const KEY_CLAIMS_TOTAL: &str = "mrt_idempotency_key_claims_total";
/// Rendered by each gateway from its own stream count (its shutdown waits on that count), not
/// through the `metrics` facade.
pub const SSE_STREAMS_ACTIVE: &str = "mrt_sse_streams_active";
/// Submissions a tenant's quota refused, by tenant (a name from the deployment's `auth`
/// section, so bounded) and reason (`active_limit` or `rate_limited`).
pub const QUOTA_REJECTIONS_TOTAL: &str = "mrt_quota_rejections_total";

/// `outcome` label values of executions.
pub mod outcome {
    pub const SUCCEEDED: &str = "succeeded";
    pub const FAILED: &str = "failed";
    pub const CANCELLED: &str = "cancelled";
}

/// `code` label value of an execution that did not fail.
pub const NO_CODE: &str = "none";

/// `gen_ai_token_type` label values.
pub mod token_type {
    pub const INPUT: &str = "input";
    pub const OUTPUT: &str = "output";
}

/// Sub-millisecond resolution: a JetStream append is ~0.1-1 ms, a memory append ~1 µs.
pub const APPEND_BUCKETS: &[f64] = &[
    0.000_01, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 1.0,
];
/// HTTP handlers answer in well under a millisecond to seconds (SSE streams are excluded).
pub const HTTP_BUCKETS: &[f64] = &[
    0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0,
];
/// Executions and provider operations: the GenAI conventions' advice, 10 ms to ~80 s, plus the
/// long tail up to the largest deadline a deployment may allow (`max_deadline_ms`, 24 h).
pub const EXECUTION_BUCKETS: &[f64] = &[
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92, 300.0,
    900.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0,
];
/// Time to first token: the GenAI conventions' advice.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];
/// Queue wait: from acceptance to a worker starting the job.
pub const QUEUE_WAIT_BUCKETS: &[f64] = &[
    0.000_5, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0,
];
/// Token counts per operation: the GenAI conventions' powers of four.
pub const TOKEN_BUCKETS: &[f64] = &[
    1.0,
    4.0,
    16.0,
    64.0,
    256.0,
    1_024.0,
    4_096.0,
    16_384.0,
    65_536.0,
    262_144.0,
    1_048_576.0,
    4_194_304.0,
    16_777_216.0,
    67_108_864.0,
];

/// One webhook attempt: a local receiver answers in milliseconds, the timeout is 15 s.
pub const WEBHOOK_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0,
];

/// Every histogram with its buckets.
pub const HISTOGRAMS: &[(&str, &[f64])] = &[
    (HTTP_REQUEST_DURATION_SECONDS, HTTP_BUCKETS),
    (EXECUTION_DURATION_SECONDS, EXECUTION_BUCKETS),
    (QUEUE_WAIT_SECONDS, QUEUE_WAIT_BUCKETS),
    (TIME_TO_FIRST_TOKEN_SECONDS, TTFT_BUCKETS),
    (OPERATION_DURATION_SECONDS, EXECUTION_BUCKETS),
    (TOKEN_USAGE, TOKEN_BUCKETS),
    (EVENT_APPEND_DURATION_SECONDS, APPEND_BUCKETS),
    (WEBHOOK_DELIVERY_SECONDS, WEBHOOK_BUCKETS),
];

/// Execution-level codes of contract.md section 2 (the `code` label of failed executions).
pub const EXECUTION_CODES: &[&str] = &[
    "capability_unavailable",
    "queue_full",
    "rate_limited",
    "deadline_exceeded",
    "cancelled",
    "provider_unavailable",
    "provider_protocol_error",
    "internal_error",
];

/// Describes every metric and registers the unlabelled ones and every bounded label combination
/// known in advance at 0, so dashboards and alerts see a series from startup. Idempotent.
pub fn register() {
    describe_counter!(
        HTTP_REQUESTS_TOTAL,
        "HTTP requests by route template, method and status."
    );
    describe_histogram!(
        HTTP_REQUEST_DURATION_SECONDS,
        Unit::Seconds,
        "Time to answer an HTTP request (SSE streams: until headers)."
    );
    describe_counter!(
        EXECUTIONS_TOTAL,
        "Executions that reached a terminal event, by outcome and code."
    );
    describe_histogram!(
        EXECUTION_DURATION_SECONDS,
        Unit::Seconds,
        "Time from acceptance to the terminal event, by provider, model and outcome."
    );
    describe_histogram!(
        QUEUE_WAIT_SECONDS,
        Unit::Seconds,
        "Time from acceptance until a worker starts the execution."
    );
    describe_histogram!(
        TIME_TO_FIRST_TOKEN_SECONDS,
        Unit::Seconds,
        "Time from the start of a provider attempt to its first output."
    );
    describe_histogram!(
        OPERATION_DURATION_SECONDS,
        Unit::Seconds,
        "Duration of one provider attempt (GenAI client operation)."
    );
    describe_histogram!(
        TOKEN_USAGE,
        Unit::Count,
        "Tokens reported by providers per attempt, by token type."
    );
    describe_counter!(
        PROVIDER_ATTEMPTS_TOTAL,
        "Provider attempts by provider, model and outcome."
    );
    describe_gauge!(
        PROVIDER_INFLIGHT,
        "Provider attempts running now in this process."
    );
    describe_histogram!(
        EVENT_APPEND_DURATION_SECONDS,
        Unit::Seconds,
        "Time of one append to the event store, acknowledgement included."
    );
    describe_gauge!(
        APPEND_PACE_HOLD_SECONDS,
        Unit::Seconds,
        "How long this worker holds each execution's next output message now (adaptive pace: 0 while the event store keeps up)."
    );
    describe_gauge!(
        JOBS_PENDING,
        "Jobs waiting or unacknowledged in the namespace's queue, every partition and tenant lane (nats mode)."
    );
    describe_counter!(
        JOB_REDELIVERIES_TOTAL,
        "Jobs delivered again after a worker stopped acknowledging."
    );

    describe_counter!(
        KEY_CLAIMS_TOTAL,
        "Idempotency keys of keyed jobs a worker checked (read, and claimed when found free), by outcome."
    );
    for outcome in key_claim::ALL {
        metrics::counter!(KEY_CLAIMS_TOTAL, "outcome" => outcome).absolute(0);
    }

    metrics::counter!(JOB_REDELIVERIES_TOTAL).absolute(0);
    metrics::counter!(EXECUTIONS_TOTAL, "outcome" => outcome::SUCCEEDED, "code" => NO_CODE)
        .absolute(0);
    for &code in EXECUTION_CODES {
        let outcome = if code == "cancelled" {
            outcome::CANCELLED
        } else {
            outcome::FAILED
        };
        metrics::counter!(EXECUTIONS_TOTAL, "outcome" => outcome, "code" => code).absolute(0);
    }
}

/// Outcomes of [`KEY_CLAIMS_TOTAL`].
pub mod key_claim {
    /// The key is bound to the job's execution, which may run.
    pub const BOUND: &str = "bound";
    /// The key is bound to another execution: the job's execution was a retry's, never run.
    pub const ANOTHER: &str = "another";
    /// The key store could not be reached (within the worker's budget, or before the log was
    /// found closed): the job was not run.
    pub const UNREACHABLE: &str = "unreachable";
    pub const ALL: [&str; 3] = [BOUND, ANOTHER, UNREACHABLE];
}

/// Reasons of [`QUOTA_REJECTIONS_TOTAL`].
pub mod quota_reason {
    pub const ACTIVE_LIMIT: &str = "active_limit";
    pub const RATE_LIMITED: &str = "rate_limited";
}

/// Registers the quota-refusal series of one tenant that has limits at 0, so a tenant that was
/// never refused still shows up.
pub fn register_tenant_quota(tenant: &str) {
    describe_counter!(
        QUOTA_REJECTIONS_TOTAL,
        "Submissions refused by a tenant's quota, by tenant and reason."
    );
    for reason in [quota_reason::ACTIVE_LIMIT, quota_reason::RATE_LIMITED] {
        metrics::counter!(QUOTA_REJECTIONS_TOTAL, "tenant" => tenant.to_owned(), "reason" => reason)
            .absolute(0);
    }
}

/// Outcomes of [`WEBHOOK_DELIVERIES_TOTAL`] (contract.md section 11): one per attempt that
/// succeeded, failed and will be retried, failed for the last time, or was answered 410.
pub mod webhook_outcome {
    pub const DELIVERED: &str = "delivered";
    pub const RETRIED: &str = "retried";
    pub const ABANDONED: &str = "abandoned";
    pub const GONE: &str = "gone";
    pub const ALL: [&str; 4] = [DELIVERED, RETRIED, ABANDONED, GONE];
}

/// Describes the webhook metrics and registers one endpoint's series at 0, and the pending
/// gauge, so an endpoint that never received anything still shows up.
pub fn register_webhook_endpoint(tenant: &str, endpoint: &str) {
    describe_counter!(
        WEBHOOK_DELIVERIES_TOTAL,
        "Webhook delivery attempts by tenant, endpoint and outcome (delivered, retried, abandoned, gone)."
    );
    describe_histogram!(
        WEBHOOK_DELIVERY_SECONDS,
        Unit::Seconds,
        "Time of one webhook delivery attempt, by tenant and endpoint."
    );
    describe_gauge!(
        WEBHOOK_PENDING,
        "Webhook deliveries owed and not yet finished (nats mode: the deliveries stream, cluster-wide; embedded: this process)."
    );
    metrics::gauge!(WEBHOOK_PENDING).increment(0.0);
    for outcome in webhook_outcome::ALL {
        metrics::counter!(
            WEBHOOK_DELIVERIES_TOTAL,
            "tenant" => tenant.to_owned(),
            "endpoint" => endpoint.to_owned(),
            "outcome" => outcome
        )
        .absolute(0);
    }
}

/// Registers the per-provider series of one configured model at 0 (attempts by outcome,
/// in-flight), so a provider that never ran still shows up.
pub fn register_model(provider: &str, model: &str) {
    for outcome in ["succeeded", "failed"] {
        metrics::counter!(
            PROVIDER_ATTEMPTS_TOTAL,
            "provider" => provider.to_owned(),
            "model" => model.to_owned(),
            "outcome" => outcome
        )
        .absolute(0);
    }
    metrics::gauge!(PROVIDER_INFLIGHT, "provider" => provider.to_owned()).increment(0.0);
}
