//! Startup reconciliation of the JetStream layout: streams, the workers' consumer and the cancel
//! bucket are created when missing and otherwise brought to this process's settings.
//!
//! A namespace outlives the processes that created it, so "create if missing" alone would keep
//! the first process's values forever (a changed ack wait or admission limit silently ignored).
//! Here every setting this crate manages is compared with the server's: what JetStream can
//! update is updated (the replica count included: JetStream moves the data), keeping every
//! setting this crate does not manage (placement, limits an operator set) as the server has it; what it cannot update (storage type, retention
//! to or from work-queue) is a startup error naming the setting, never a silent mismatch.

use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};

use crate::error::StoreError;

/// Settings JetStream refuses to change on an existing stream.
fn immutable_differences(current: &stream::Config, desired: &stream::Config) -> Vec<String> {
    let mut fixed = Vec::new();
    if current.storage != desired.storage {
        fixed.push(format!(
            "storage ({:?} on the server, {:?} wanted)",
            current.storage, desired.storage
        ));
    }
    let work_queue = |c: &stream::Config| c.retention == stream::RetentionPolicy::WorkQueue;
    if current.retention != desired.retention && (work_queue(current) || work_queue(desired)) {
        fixed.push(format!(
            "retention ({:?} on the server, {:?} wanted)",
            current.retention, desired.retention
        ));
    }
    fixed
}

/// JetStream stores "no limit" as -1 whatever a client sent (0 or -1).
fn limit(value: i64) -> i64 {
    if value <= 0 { -1 } else { value }
}

/// Names of the managed settings where the server's stream differs from `desired`.
fn stream_differences(current: &stream::Config, desired: &stream::Config) -> Vec<&'static str> {
    let mut out = Vec::new();
    let mut check = |name, differs: bool| {
        if differs {
            out.push(name);
        }
    };
    check("subjects", current.subjects != desired.subjects);
    check("retention", current.retention != desired.retention);
    check("storage", current.storage != desired.storage);
    check("max_age", current.max_age != desired.max_age);
    check(
        "max_msgs",
        limit(current.max_messages) != limit(desired.max_messages),
    );
    check(
        "max_msg_size",
        limit(current.max_message_size.into()) != limit(desired.max_message_size.into()),
    );
    check("discard", current.discard != desired.discard);
    check("allow_direct", current.allow_direct != desired.allow_direct);
    check(
        "duplicate_window",
        current.duplicate_window != desired.duplicate_window,
    );
    check("republish", current.republish != desired.republish);
    check("num_replicas", current.num_replicas != desired.num_replicas);
    out
}

/// `current` with the managed settings of `desired`; everything else as the server has it.
fn merged(current: &stream::Config, desired: &stream::Config) -> stream::Config {
    stream::Config {
        subjects: desired.subjects.clone(),
        retention: desired.retention,
        max_age: desired.max_age,
        max_messages: desired.max_messages,
        max_message_size: desired.max_message_size,
        discard: desired.discard,
        allow_direct: desired.allow_direct,
        duplicate_window: desired.duplicate_window,
        republish: desired.republish.clone(),
        num_replicas: desired.num_replicas,
        ..current.clone()
    }
}

/// The duplicate window JetStream accepts with `max_age`: never longer than the age limit.
pub(crate) fn duplicate_window(wanted: Duration, max_age: Duration) -> Duration {
    if max_age.is_zero() {
        wanted
    } else {
        wanted.min(max_age)
    }
}

/// Creates the stream or brings an existing one to `desired` (see the module docs). Several
/// processes may start at once: a create that loses the race is followed by a verify.
pub async fn stream(js: &jetstream::Context, desired: stream::Config) -> Result<(), StoreError> {
    let name = desired.name.clone();
    let mut last_refusal = String::new();
    for _ in 0..3 {
        match js.get_stream(&name).await {
            Ok(existing) => {
                let current = &existing.cached_info().config;
                let fixed = immutable_differences(current, &desired);
                if !fixed.is_empty() {
                    return Err(StoreError::Misconfigured(format!(
                        "JetStream stream {name}: {} cannot be changed on an existing stream; delete the \
                         stream or use another namespace",
                        fixed.join(", ")
                    )));
                }
                let differs = stream_differences(current, &desired);
                if differs.is_empty() {
                    return Ok(());
                }
                tracing::info!(stream = %name, settings = %differs.join(", "), "updating stream settings");
                return js
                    .update_stream(merged(current, &desired))
                    .await
                    .map(|_| ())
                    .map_err(|e| {
                        StoreError::Unavailable(format!(
                            "stream {name}: cannot update {}: {e}",
                            differs.join(", ")
                        ))
                    });
            }
            Err(e)
                if matches!(
                    e.kind(),
                    jetstream::context::GetStreamErrorKind::JetStream(_)
                ) =>
            {
                match js.create_stream(desired.clone()).await {
                    Ok(_) => return Ok(()),
                    // Another process created it between our get and create: verify again.
                    Err(create) => {
                        tracing::debug!(stream = %name, error = %create, "create stream raced");
                        last_refusal = format!(": {create}");
                    }
                }
            }
            Err(e) => return Err(StoreError::Unavailable(format!("get stream {name}: {e}"))),
        }
    }
    Err(StoreError::Unavailable(format!(
        "cannot create or verify stream {name}{last_refusal}"
    )))
}

/// The stream's metadata: `None` when the stream does not exist.
pub(crate) async fn stream_metadata(
    js: &jetstream::Context,
    name: &str,
) -> Result<Option<std::collections::HashMap<String, String>>, StoreError> {
    match js.get_stream(name).await {
        Ok(existing) => Ok(Some(existing.cached_info().config.metadata.clone())),
        Err(e)
            if matches!(
                e.kind(),
                jetstream::context::GetStreamErrorKind::JetStream(_)
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(StoreError::Unavailable(format!("get stream {name}: {e}"))),
    }
}

/// Names of the managed consumer settings where the server differs from `desired`.
fn consumer_differences(
    current: &consumer::Config,
    desired: &consumer::pull::Config,
) -> Vec<&'static str> {
    let mut out = Vec::new();
    if current.ack_policy != desired.ack_policy {
        out.push("ack_policy");
    }
    if current.ack_wait != desired.ack_wait {
        out.push("ack_wait");
    }
    if limit(current.max_ack_pending) != limit(desired.max_ack_pending) {
        out.push("max_ack_pending");
    }
    if limit(current.max_deliver) != limit(desired.max_deliver) {
        out.push("max_deliver");
    }
    out
}

/// Creates the durable pull consumer or updates it to `desired` (JetStream's create-or-update),
/// and returns it with the configuration the server holds now: the caller derives its lease
/// from that, not from its own flags.
pub async fn pull_consumer(
    stream: &stream::Stream,
    desired: consumer::pull::Config,
) -> Result<consumer::PullConsumer, StoreError> {
    let name = desired.durable_name.clone().unwrap_or_default();
    let differs = match stream.consumer_info(&name).await {
        Ok(info) => consumer_differences(&info.config, &desired),
        // Missing (or unreadable: the create below reports the real problem).
        Err(_) => Vec::new(),
    };
    if !differs.is_empty() {
        tracing::info!(consumer = %name, settings = %differs.join(", "), "updating consumer settings");
    }
    stream.create_consumer(desired).await.map_err(|e| {
        let what = if differs.is_empty() {
            String::new()
        } else {
            format!(
                " ({} differ from this process's settings)",
                differs.join(", ")
            )
        };
        StoreError::Unavailable(format!(
            "consumer {name}: cannot create or update{what}: {e}"
        ))
    })
}

/// Brings the stream behind a KV bucket to `max_age`, `history` and `replicas`, keeping the
/// rest.
pub(crate) async fn kv_bucket(
    js: &jetstream::Context,
    bucket: &str,
    max_age: Duration,
    history: i64,
    replicas: usize,
) -> Result<(), StoreError> {
    let name = format!("KV_{bucket}");
    let existing = js
        .get_stream(&name)
        .await
        .map_err(|e| StoreError::Unavailable(format!("bucket {bucket}: {e}")))?;
    let current = &existing.cached_info().config;
    let mut differs = Vec::new();
    if current.max_age != max_age {
        differs.push("max_age");
    }
    if current.max_messages_per_subject != history {
        differs.push("history");
    }
    if current.num_replicas != replicas {
        differs.push("num_replicas");
    }
    if differs.is_empty() {
        return Ok(());
    }
    tracing::info!(bucket, settings = %differs.join(", "), "updating bucket settings");
    let updated = stream::Config {
        max_age,
        max_messages_per_subject: history,
        num_replicas: replicas,
        duplicate_window: duplicate_window(current.duplicate_window, max_age),
        ..current.clone()
    };
    js.update_stream(updated).await.map(|_| ()).map_err(|e| {
        StoreError::Unavailable(format!(
            "bucket {bucket}: cannot update {}: {e}",
            differs.join(", ")
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> stream::Config {
        stream::Config {
            name: "S".into(),
            subjects: vec!["s.*".into()],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            max_messages: 10,
            max_age: Duration::from_secs(60),
            ..Default::default()
        }
    }

    #[test]
    fn unlimited_is_one_value_whatever_the_client_sent() {
        let mut current = config();
        let mut desired = config();
        current.max_message_size = -1;
        desired.max_message_size = 0;
        assert!(stream_differences(&current, &desired).is_empty());
    }

    #[test]
    fn changed_limits_are_named_and_merged_keeping_unmanaged_settings() {
        let mut current = config();
        current.num_replicas = 1;
        current.max_consumers = 7;
        let desired = stream::Config {
            max_messages: 20,
            max_age: Duration::from_secs(30),
            num_replicas: 3,
            ..config()
        };
        assert_eq!(
            stream_differences(&current, &desired),
            vec!["max_age", "max_msgs", "num_replicas"]
        );
        let m = merged(&current, &desired);
        assert_eq!((m.max_messages, m.max_age), (20, Duration::from_secs(30)));
        assert_eq!((m.num_replicas, m.max_consumers), (3, 7));
    }

    #[test]
    fn storage_and_work_queue_retention_are_fixed() {
        let current = config();
        let desired = stream::Config {
            storage: stream::StorageType::Memory,
            retention: stream::RetentionPolicy::Limits,
            ..config()
        };
        let fixed = immutable_differences(&current, &desired);
        assert_eq!(fixed.len(), 2);
        assert!(fixed[0].starts_with("storage"), "{fixed:?}");
        assert!(fixed[1].starts_with("retention"), "{fixed:?}");
        let interest = stream::Config {
            retention: stream::RetentionPolicy::Interest,
            ..Default::default()
        };
        let limits = stream::Config::default();
        assert!(immutable_differences(&limits, &interest).is_empty());
    }

    #[test]
    fn the_duplicate_window_never_exceeds_the_age_limit() {
        let two = Duration::from_secs(120);
        assert_eq!(
            duplicate_window(two, Duration::from_secs(5)),
            Duration::from_secs(5)
        );
        assert_eq!(duplicate_window(two, Duration::ZERO), two);
        assert_eq!(duplicate_window(two, Duration::from_secs(600)), two);
    }
}
