//! Execution logs for the unit tests of the OpenAI projections (`projection`, `stream`,
//! `chat`), which all read the same shapes of log, and [`replay`], which runs one through a
//! projection.

use protocol::{EventBody, ExecutionId, RuntimeEvent, Target, Timestamp};

/// What `apply` writes for the events of `log`, in order (a projection replaying a log).
pub fn replay<O: Default>(log: &[RuntimeEvent], mut apply: impl FnMut(&RuntimeEvent, &mut O)) -> O {
    let mut out = O::default();
    for event in log {
        apply(event, &mut out);
    }
    out
}

/// One new execution's events with `bodies`, numbered from 1, all stamped 5 s after the epoch
/// (a Response's `created_at` of 5).
pub fn log(bodies: Vec<EventBody>) -> Vec<RuntimeEvent> {
    RuntimeEvent::numbered(ExecutionId::new_random(), bodies, |_| {
        Timestamp::from_unix_millis(5_000)
    })
}

/// The provider `p`'s model `m`.
pub fn target() -> Target {
    Target {
        provider: "p".into(),
        model: "m".into(),
    }
}

/// A run that routes to [`target`], writes `hi`, then `more`, and completes.
pub fn says_hi_then(more: Vec<EventBody>) -> Vec<RuntimeEvent> {
    says_then("hi", more)
}

/// A run that routes to [`target`], writes `first`, then `more`, and completes.
pub fn says_then(first: &str, more: Vec<EventBody>) -> Vec<RuntimeEvent> {
    let mut bodies = vec![
        EventBody::Accepted,
        EventBody::RouteSelected {
            target: target(),
            attempt: 1,
        },
        EventBody::OutputDelta {
            output_index: 0,
            delta: first.into(),
        },
    ];
    bodies.extend(more);
    bodies.push(EventBody::Completed { target: target() });
    log(bodies)
}
