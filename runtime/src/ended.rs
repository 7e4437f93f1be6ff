//! The one log line and the count of an execution's end.
//!
//! Whoever appends an execution's terminal event calls [`record`] once the store has
//! acknowledged it: the worker's runner (success, failure, cancellation of a running
//! execution), the gateway's cancel of a queued execution and the deadline sweeper of any
//! process. A log has one terminal event (compare-and-set fences every other writer), so each
//! execution's end is logged and counted (`mrt_executions_total{outcome,code}`) exactly once,
//! by the process that ended it, and an operator holding an execution id finds it with its
//! portable code. (Its duration, `mrt_execution_duration_seconds`, is the runner's to record:
//! it knows the target.)
//!
//! The decision a reader must know: the level says who should look. A failure is a `warn` line
//! with its code, retryability and the runtime's fixed message (never caller or provider
//! content); a cancellation, which a caller asked for, is `info`; a success is `debug`, since
//! at thousands of executions a second one line each would drown everything else. Executions
//! closed before they were ever queued (the unqueued failure) log their own line where they are
//! closed: no caller was given their id as a running execution.

use std::sync::LazyLock;

use metrics::Counter;
use protocol::event::EventBody;
use protocol::{ErrorCode, ExecutionId};
use telemetry::metric;

/// The count of successes, resolved once (one per execution: the hot path).
static SUCCEEDED: LazyLock<Counter> = LazyLock::new(|| {
    metrics::counter!(
        metric::EXECUTIONS_TOTAL,
        "outcome" => metric::outcome::SUCCEEDED,
        "code" => metric::NO_CODE
    )
});

/// Logs and counts the end of `id` whose terminal event `terminal` was just stored; other
/// events record nothing.
pub fn record(id: ExecutionId, terminal: &EventBody) {
    match terminal {
        EventBody::Completed { target } => {
            SUCCEEDED.increment(1);
            tracing::debug!(
                execution_id = %id,
                provider = %target.provider,
                model = %target.model,
                "execution succeeded"
            );
        }
        EventBody::Failed { error } => {
            let code = error.code.as_str();
            let cancelled = error.code == ErrorCode::Cancelled;
            let outcome = if cancelled {
                metric::outcome::CANCELLED
            } else {
                metric::outcome::FAILED
            };
            metrics::counter!(metric::EXECUTIONS_TOTAL, "outcome" => outcome, "code" => code)
                .increment(1);
            if cancelled {
                tracing::info!(execution_id = %id, code, "execution cancelled");
            } else {
                tracing::warn!(
                    execution_id = %id,
                    code,
                    retryable = error.retryable,
                    message = %error.message,
                    "execution failed"
                );
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use protocol::{RuntimeError, Target};

    use super::*;

    /// The lines `f` logs at every level, without ANSI colours.
    fn logged(f: impl FnOnce()) -> String {
        let (logs, guard) = testkit::logs::capture();
        f();
        drop(guard);
        logs.text()
    }

    #[test]
    fn a_failure_is_one_warn_line_with_its_code_and_the_execution_id() {
        let id = ExecutionId::new_random();
        let error = RuntimeError::deadline_exceeded();
        let text = logged(|| record(id, &EventBody::Failed { error }));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "{text}");
        assert!(lines[0].contains(" WARN "), "{text}");
        assert!(lines[0].contains("execution failed"), "{text}");
        assert!(lines[0].contains(&format!("execution_id={id}")), "{text}");
        assert!(lines[0].contains("code=\"deadline_exceeded\""), "{text}");
    }

    #[test]
    fn a_cancellation_is_info_a_success_debug_and_other_events_nothing() {
        let id = ExecutionId::new_random();
        let cancelled = logged(|| {
            record(
                id,
                &EventBody::Failed {
                    error: RuntimeError::cancelled(),
                },
            )
        });
        assert!(cancelled.contains(" INFO ") && cancelled.contains("execution cancelled"));
        assert!(cancelled.contains("code=\"cancelled\""), "{cancelled}");
        let target = Target {
            provider: "provider-mock".to_owned(),
            model: "model-alpha".to_owned(),
        };
        let succeeded = logged(|| record(id, &EventBody::Completed { target }));
        assert!(succeeded.contains(" DEBUG ") && succeeded.contains("execution succeeded"));
        assert!(
            succeeded.contains(&format!("execution_id={id}")),
            "{succeeded}"
        );
        assert_eq!(logged(|| record(id, &EventBody::Accepted)), "");
    }
}
