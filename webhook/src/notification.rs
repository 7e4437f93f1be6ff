//! What a delivery says: the JSON body and the `webhook-id` of one stored event.
//!
//! The one decision a reader must know: the body is a pure function of the stored log (the
//! event, and for a terminal event the usage facts of the log before it), never of the moment
//! or the process that builds it, so a delivery built twice (a re-read after a crash) is
//! byte-identical and its id the same: `{execution_id}_{sequence}`, one per event, shared by
//! every endpoint that hears of it (as Standard Webhooks' message ids are). It never carries
//! input or output content: a receiver reads the result with its own key.

use bytes::Bytes;
use config::WebhookEvent;
use protocol::event::{EventBody, ExecutionStatus, Target};
use protocol::usage::UsageFact;
use protocol::{ExecutionId, RuntimeError, RuntimeEvent, Sequence, Timestamp};
use serde::Serialize;

/// One event to notify endpoints of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    pub event: WebhookEvent,
    pub execution_id: ExecutionId,
    pub sequence: Sequence,
    /// `webhook-id`: the same for every attempt and every endpoint.
    pub webhook_id: String,
    /// The JSON body, as signed and sent.
    pub body: Bytes,
}

#[derive(Serialize)]
struct Body<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    timestamp: Timestamp,
    data: Data<'a>,
}

#[derive(Serialize)]
struct Data<'a> {
    execution_id: ExecutionId,
    sequence: Sequence,
    status: ExecutionStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    target: Option<&'a Target>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<&'a [UsageFact]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a RuntimeError>,
}

/// The webhook event an event is, if endpoints may ask for it.
pub fn webhook_event(event: &RuntimeEvent) -> Option<WebhookEvent> {
    WebhookEvent::from_type(event.type_name())
}

/// The `webhook-id` of an execution's event.
pub fn webhook_id(execution_id: ExecutionId, sequence: Sequence) -> String {
    format!("{execution_id}_{sequence}")
}

/// The notification of `event`, or `None` for events endpoints cannot ask for. `usage`: every
/// usage fact of the log (terminal events carry them; others ignore it).
pub fn notification(event: &RuntimeEvent, usage: &[UsageFact]) -> Option<Notification> {
    let kind = webhook_event(event)?;
    let (target, error) = match &event.body {
        EventBody::RouteSelected { target, .. } | EventBody::Completed { target } => {
            (Some(target), None)
        }
        EventBody::Failed { error } => (None, Some(error)),
        _ => (None, None),
    };
    let usage = (event.is_terminal() && !usage.is_empty()).then_some(usage);
    let body = Body {
        kind: kind.as_str(),
        timestamp: event.time,
        data: Data {
            execution_id: event.execution_id,
            sequence: event.sequence,
            status: event.status,
            target,
            usage,
            error,
        },
    };
    // Serializing these types fails only for non-finite floats, which validated events and
    // usage facts never hold.
    let body = serde_json::to_vec(&body).ok()?;
    Some(Notification {
        event: kind,
        execution_id: event.execution_id,
        sequence: event.sequence,
        webhook_id: webhook_id(event.execution_id, event.sequence),
        body: Bytes::from(body),
    })
}

#[cfg(test)]
mod tests {
    use protocol::ErrorCode;
    use serde_json::{Value, json};

    use super::*;

    fn event(sequence: u64, body: EventBody) -> RuntimeEvent {
        RuntimeEvent::new(
            "6f1c2a9e-0d4b-4c1e-9a57-3b2d8e4f7a10".parse().unwrap(),
            Sequence(sequence),
            Timestamp::from_unix_millis(1_700_000_000_000),
            body,
        )
    }

    fn body(n: &Notification) -> Value {
        serde_json::from_slice(&n.body).unwrap()
    }

    #[test]
    fn a_completed_event_carries_target_and_usage_and_nothing_of_the_output() {
        let target = Target {
            provider: "mock".into(),
            model: "echo".into(),
        };
        let usage: Vec<UsageFact> = serde_json::from_value(
            json!([{"unit": "output_token", "quantity": 3, "source": "provider"}]),
        )
        .unwrap();
        let n = notification(&event(5, EventBody::Completed { target }), &usage).unwrap();
        assert_eq!(n.event, WebhookEvent::Completed);
        assert_eq!(n.webhook_id, "6f1c2a9e-0d4b-4c1e-9a57-3b2d8e4f7a10_5");
        assert_eq!(
            body(&n),
            json!({"type": "execution.completed", "timestamp": "2023-11-14T22:13:20.000Z",
                   "data": {"execution_id": "6f1c2a9e-0d4b-4c1e-9a57-3b2d8e4f7a10",
                            "sequence": 5, "status": "succeeded",
                            "target": {"provider": "mock", "model": "echo"},
                            "usage": [{"unit": "output_token", "quantity": 3, "source": "provider"}]}})
        );
        // Built twice, byte-identical (a re-read after a crash sends the same body).
        let again = notification(
            &event(
                5,
                EventBody::Completed {
                    target: Target {
                        provider: "mock".into(),
                        model: "echo".into(),
                    },
                },
            ),
            &usage,
        )
        .unwrap();
        assert_eq!(again, n);
    }

    #[test]
    fn a_failed_event_carries_its_error_and_status() {
        let error = RuntimeError::new(ErrorCode::Cancelled, "Execution cancelled", false);
        let n = notification(&event(3, EventBody::Failed { error }), &[]).unwrap();
        let b = body(&n);
        assert_eq!(b["type"], "execution.failed");
        assert_eq!(b["data"]["status"], "cancelled");
        assert_eq!(b["data"]["error"]["code"], "cancelled");
        assert!(b["data"].get("usage").is_none());
        assert!(b["data"].get("target").is_none());
    }

    #[test]
    fn only_the_four_webhook_events_notify() {
        let accepted = notification(&event(1, EventBody::Accepted), &[]).unwrap();
        assert_eq!(
            body(&accepted)["data"],
            json!({"execution_id": "6f1c2a9e-0d4b-4c1e-9a57-3b2d8e4f7a10", "sequence": 1,
                   "status": "accepted"})
        );
        let delta = EventBody::OutputDelta {
            output_index: 0,
            delta: "secret text".into(),
        };
        assert!(notification(&event(2, delta), &[]).is_none());
    }
}
