//! Decoding a [`RuntimeEvent`] in one pass over its fields.
//!
//! Every read of a log decodes its events: a gateway's event streams and status reads from
//! NATS, a worker's read of a log's head, and in embedded mode every read of a terminal log,
//! whose events are kept as JSON alone. The derived decoder of a struct with a flattened,
//! internally tagged body buffers the whole object twice (the struct's unknown fields, then the
//! body's fields until its tag is found) before it builds anything. This one reads each field
//! straight into its slot, the fields of every event type at once (a field has the same type in
//! every event type that has it), and builds the body named by `type` at the end.
//!
//! It accepts what the derived decoder accepts and decodes it to the same event, with one
//! difference no writer produces: a field of another event type placed before `type` is read
//! as that field, so a value of the wrong type or a second copy is an error here, where the
//! derived decoder ignores both. Once `type` is known, fields of other event types are skipped
//! unread, as there. The tests check the two decoders against each other.

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, de::DeserializeOwned};
use serde_json::Value;

use super::{EventBody, ExecutionStatus, OutputArtifact, ProgressPhase, RuntimeEvent, Target};
use crate::error::RuntimeError;
use crate::id::{ExecutionId, Sequence};
use crate::time::Timestamp;
use crate::usage::UsageFact;

/// The fields of every event type and of the envelope; `Other` is anything else (ignored).
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum Field {
    Type,
    Status,
    ExecutionId,
    Sequence,
    Time,
    Target,
    Attempt,
    Error,
    OutputIndex,
    Delta,
    CallId,
    Name,
    Phase,
    Progress,
    Result,
    Artifacts,
    Facts,
    #[serde(other)]
    Other,
}

/// An event's `type`, named as [`EventBody`] names its variants on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
enum Kind {
    #[serde(rename = "execution.accepted")]
    Accepted,
    #[serde(rename = "route.selected")]
    RouteSelected,
    #[serde(rename = "route.attempt_failed")]
    RouteAttemptFailed,
    #[serde(rename = "output.delta")]
    OutputDelta,
    #[serde(rename = "tool.call.started")]
    ToolCallStarted,
    #[serde(rename = "tool.call.arguments.delta")]
    ToolCallArgumentsDelta,
    #[serde(rename = "execution.progress")]
    Progress,
    #[serde(rename = "output.result")]
    OutputResult,
    #[serde(rename = "usage.reported")]
    UsageReported,
    #[serde(rename = "execution.completed")]
    Completed,
    #[serde(rename = "execution.failed")]
    Failed,
}

impl Kind {
    /// Whether events of this type have `field` (the envelope's fields are in every one).
    fn has(self, field: &Field) -> bool {
        match field {
            Field::Type
            | Field::Status
            | Field::ExecutionId
            | Field::Sequence
            | Field::Time
            | Field::Other => true,
            Field::Target => matches!(
                self,
                Self::RouteSelected | Self::RouteAttemptFailed | Self::Completed
            ),
            Field::Attempt => matches!(self, Self::RouteSelected | Self::RouteAttemptFailed),
            Field::Error => matches!(self, Self::RouteAttemptFailed | Self::Failed),
            Field::OutputIndex => self == Self::OutputDelta,
            Field::Delta => matches!(self, Self::OutputDelta | Self::ToolCallArgumentsDelta),
            Field::CallId => matches!(self, Self::ToolCallStarted | Self::ToolCallArgumentsDelta),
            Field::Name => self == Self::ToolCallStarted,
            Field::Phase | Field::Progress => self == Self::Progress,
            Field::Result | Field::Artifacts => self == Self::OutputResult,
            Field::Facts => self == Self::UsageReported,
        }
    }
}

/// The fields read so far.
#[derive(Default)]
struct Slots {
    kind: Option<Kind>,
    status: Option<ExecutionStatus>,
    execution_id: Option<ExecutionId>,
    sequence: Option<Sequence>,
    time: Option<Timestamp>,
    target: Option<Target>,
    attempt: Option<u32>,
    error: Option<RuntimeError>,
    output_index: Option<u32>,
    delta: Option<String>,
    call_id: Option<String>,
    name: Option<String>,
    phase: Option<ProgressPhase>,
    /// Outer `Some` once the field was read; `null` reads as `Some(None)`.
    progress: Option<Option<f64>>,
    result: Option<Value>,
    artifacts: Option<Option<Vec<OutputArtifact>>>,
    facts: Option<Vec<UsageFact>>,
}

/// Reads the map's next value into `slot`; a field read twice is an error.
fn fill<'de, A, T>(map: &mut A, slot: &mut Option<T>, name: &'static str) -> Result<(), A::Error>
where
    A: MapAccess<'de>,
    T: DeserializeOwned,
{
    if slot.is_some() {
        return Err(de::Error::duplicate_field(name));
    }
    *slot = Some(map.next_value()?);
    Ok(())
}

/// `slot`'s value, or the error for a missing `name`.
fn take<T, E: de::Error>(slot: Option<T>, name: &'static str) -> Result<T, E> {
    slot.ok_or_else(|| E::missing_field(name))
}

impl Slots {
    fn read<'de, A: MapAccess<'de>>(&mut self, map: &mut A, field: Field) -> Result<(), A::Error> {
        match field {
            Field::Type => fill(map, &mut self.kind, "type"),
            Field::Status => fill(map, &mut self.status, "status"),
            Field::ExecutionId => fill(map, &mut self.execution_id, "execution_id"),
            Field::Sequence => fill(map, &mut self.sequence, "sequence"),
            Field::Time => fill(map, &mut self.time, "time"),
            Field::Target => fill(map, &mut self.target, "target"),
            Field::Attempt => fill(map, &mut self.attempt, "attempt"),
            Field::Error => fill(map, &mut self.error, "error"),
            Field::OutputIndex => fill(map, &mut self.output_index, "output_index"),
            Field::Delta => fill(map, &mut self.delta, "delta"),
            Field::CallId => fill(map, &mut self.call_id, "call_id"),
            Field::Name => fill(map, &mut self.name, "name"),
            Field::Phase => fill(map, &mut self.phase, "phase"),
            Field::Progress => fill(map, &mut self.progress, "progress"),
            Field::Result => fill(map, &mut self.result, "result"),
            Field::Artifacts => fill(map, &mut self.artifacts, "artifacts"),
            Field::Facts => fill(map, &mut self.facts, "facts"),
            Field::Other => map.next_value::<IgnoredAny>().map(drop),
        }
    }

    /// The event the fields read make up: the body named by `type`, then the envelope.
    fn into_event<E: de::Error>(self) -> Result<RuntimeEvent, E> {
        let body = match take(self.kind, "type")? {
            Kind::Accepted => EventBody::Accepted,
            Kind::RouteSelected => EventBody::RouteSelected {
                target: take(self.target, "target")?,
                attempt: take(self.attempt, "attempt")?,
            },
            Kind::RouteAttemptFailed => EventBody::RouteAttemptFailed {
                target: take(self.target, "target")?,
                attempt: take(self.attempt, "attempt")?,
                error: take(self.error, "error")?,
            },
            Kind::OutputDelta => EventBody::OutputDelta {
                output_index: take(self.output_index, "output_index")?,
                delta: take(self.delta, "delta")?,
            },
            Kind::ToolCallStarted => EventBody::ToolCallStarted {
                call_id: take(self.call_id, "call_id")?,
                name: take(self.name, "name")?,
            },
            Kind::ToolCallArgumentsDelta => EventBody::ToolCallArgumentsDelta {
                call_id: take(self.call_id, "call_id")?,
                delta: take(self.delta, "delta")?,
            },
            Kind::Progress => EventBody::Progress {
                phase: take(self.phase, "phase")?,
                progress: self.progress.flatten(),
            },
            Kind::OutputResult => EventBody::OutputResult {
                result: take(self.result, "result")?,
                artifacts: self.artifacts.flatten(),
            },
            Kind::UsageReported => EventBody::UsageReported {
                facts: take(self.facts, "facts")?,
            },
            Kind::Completed => EventBody::Completed {
                target: take(self.target, "target")?,
            },
            Kind::Failed => EventBody::Failed {
                error: take(self.error, "error")?,
            },
        };
        Ok(RuntimeEvent {
            body,
            status: take(self.status, "status")?,
            execution_id: take(self.execution_id, "execution_id")?,
            sequence: take(self.sequence, "sequence")?,
            time: take(self.time, "time")?,
        })
    }
}

struct EventVisitor;

impl<'de> Visitor<'de> for EventVisitor {
    type Value = RuntimeEvent;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a runtime event")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RuntimeEvent, A::Error> {
        let mut slots = Slots::default();
        while let Some(field) = map.next_key::<Field>()? {
            match slots.kind {
                // A field of another event type: skipped, as the derived decoder does.
                Some(kind) if !kind.has(&field) => {
                    map.next_value::<IgnoredAny>()?;
                }
                _ => slots.read(&mut map, field)?,
            }
        }
        slots.into_event()
    }
}

impl<'de> Deserialize<'de> for RuntimeEvent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(EventVisitor)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;
    use crate::usage::{UsageSource, UsageUnit};

    /// The derived decoder this module replaces: the reference it must agree with.
    #[derive(Deserialize)]
    struct Reference {
        #[serde(flatten)]
        body: EventBody,
        status: ExecutionStatus,
        execution_id: ExecutionId,
        sequence: Sequence,
        time: Timestamp,
    }

    fn reference(json: &str) -> Result<RuntimeEvent, serde_json::Error> {
        serde_json::from_str::<Reference>(json).map(|r| RuntimeEvent {
            body: r.body,
            status: r.status,
            execution_id: r.execution_id,
            sequence: r.sequence,
            time: r.time,
        })
    }

    fn decode(json: &str) -> Result<RuntimeEvent, serde_json::Error> {
        serde_json::from_str(json)
    }

    /// The decoder's name for `body`'s type. The match lists every event type, so a new one
    /// does not compile until this decoder reads it (and `body()` below generates it).
    fn kind_of(body: &EventBody) -> Kind {
        match body {
            EventBody::Accepted => Kind::Accepted,
            EventBody::RouteSelected { .. } => Kind::RouteSelected,
            EventBody::RouteAttemptFailed { .. } => Kind::RouteAttemptFailed,
            EventBody::OutputDelta { .. } => Kind::OutputDelta,
            EventBody::ToolCallStarted { .. } => Kind::ToolCallStarted,
            EventBody::ToolCallArgumentsDelta { .. } => Kind::ToolCallArgumentsDelta,
            EventBody::Progress { .. } => Kind::Progress,
            EventBody::OutputResult { .. } => Kind::OutputResult,
            EventBody::UsageReported { .. } => Kind::UsageReported,
            EventBody::Completed { .. } => Kind::Completed,
            EventBody::Failed { .. } => Kind::Failed,
        }
    }

    /// `{"k":v,...}` with the entries in the order given (a `Map` would sort them).
    fn object(entries: &[(String, Value)]) -> String {
        let fields: Vec<String> = entries
            .iter()
            .map(|(k, v)| format!("{}:{v}", Value::String(k.clone())))
            .collect();
        format!("{{{}}}", fields.join(","))
    }

    /// The entries of `event` as written, in the writer's order.
    fn entries(event: &RuntimeEvent) -> Vec<(String, Value)> {
        // The writer puts `type` first, then the body's fields, then the envelope.
        let json = event.to_json();
        let mut out = Vec::new();
        let mut de = serde_json::Deserializer::from_str(&json);
        (&mut de)
            .deserialize_map(Entries(&mut out))
            .unwrap_or_else(|e| panic!("{e}: {json}"));
        out
    }

    struct Entries<'a>(&'a mut Vec<(String, Value)>);

    impl<'de> Visitor<'de> for Entries<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some((k, v)) = map.next_entry::<String, Value>()? {
                self.0.push((k, v));
            }
            Ok(())
        }
    }

    fn text() -> impl Strategy<Value = String> {
        // Quotes, backslashes, control characters and non-ASCII text, which the writer escapes.
        prop_oneof!["[a-z ]{0,6}", "\\PC{0,6}", Just("\"\\\n\u{1}é".to_owned())]
    }

    fn target() -> impl Strategy<Value = Target> {
        (text(), text()).prop_map(|(provider, model)| Target { provider, model })
    }

    fn error() -> impl Strategy<Value = RuntimeError> {
        (
            prop_oneof![
                Just(RuntimeError::cancelled()),
                Just(RuntimeError::internal()),
                Just(RuntimeError::provider_queue_full()),
            ],
            proptest::option::of(text()),
        )
            .prop_map(|(mut e, code)| {
                e.provider_code = code;
                e
            })
    }

    fn body() -> impl Strategy<Value = EventBody> {
        prop_oneof![
            Just(EventBody::Accepted),
            (target(), any::<u32>())
                .prop_map(|(target, attempt)| EventBody::RouteSelected { target, attempt }),
            (target(), any::<u32>(), error()).prop_map(|(target, attempt, error)| {
                EventBody::RouteAttemptFailed {
                    target,
                    attempt,
                    error,
                }
            }),
            (any::<u32>(), text()).prop_map(|(output_index, delta)| EventBody::OutputDelta {
                output_index,
                delta
            }),
            (text(), text())
                .prop_map(|(call_id, name)| EventBody::ToolCallStarted { call_id, name }),
            (text(), text())
                .prop_map(|(call_id, delta)| EventBody::ToolCallArgumentsDelta { call_id, delta }),
            (
                prop_oneof![Just(ProgressPhase::Queued), Just(ProgressPhase::Processing)],
                proptest::option::of(0.0f64..1.0),
            )
                .prop_map(|(phase, progress)| EventBody::Progress { phase, progress }),
            (
                prop_oneof![
                    Just(Value::Null),
                    any::<i64>().prop_map(Value::from),
                    text().prop_map(Value::from),
                    Just(json!({"a": [1, {"b": null}], "type": "output.delta"})),
                ],
                proptest::option::of(proptest::collection::vec(
                    (text(), proptest::option::of(text()))
                        .prop_map(|(uri, media_type)| OutputArtifact { uri, media_type }),
                    0..3
                )),
            )
                .prop_map(|(result, artifacts)| EventBody::OutputResult { result, artifacts }),
            proptest::collection::vec((0.0f64..1e6, proptest::option::of(any::<bool>())), 0..3)
                .prop_map(|facts| EventBody::UsageReported {
                    facts: facts
                        .into_iter()
                        .filter_map(|(q, complete)| {
                            let mut fact =
                                UsageFact::new(UsageUnit::request(), q, UsageSource::Runtime)
                                    .ok()?;
                            fact.complete = complete;
                            Some(fact)
                        })
                        .collect(),
                }),
            target().prop_map(|target| EventBody::Completed { target }),
            error().prop_map(|error| EventBody::Failed { error }),
        ]
    }

    fn event() -> impl Strategy<Value = RuntimeEvent> {
        (body(), any::<u128>(), any::<u64>(), 0i64..4_102_444_800_000).prop_map(
            |(body, id, seq, millis)| {
                RuntimeEvent::new(
                    ExecutionId::from_uuid(uuid::Uuid::from_u128(id)),
                    Sequence(seq),
                    Timestamp::from_unix_millis(millis),
                    body,
                )
            },
        )
    }

    /// Extra entries: names no event has, or fields of the event types, with any value.
    fn extra() -> impl Strategy<Value = (String, Value)> {
        (
            prop_oneof![
                Just("zz"),
                Just("typ"),
                Just("delta"),
                Just("target"),
                Just("error"),
                Just("progress"),
                Just("facts"),
                Just("result"),
            ],
            prop_oneof![
                Just(Value::Null),
                Just(json!(7)),
                Just(json!("x")),
                Just(json!({"provider": "p", "model": "m"})),
                Just(json!([])),
            ],
        )
            .prop_map(|(k, v)| (k.to_owned(), v))
    }

    proptest! {
        /// `to_json_vec`, which writes the envelope (and a delta's body) by hand, writes the
        /// bytes of the derived serializer, for any event.
        #[test]
        fn any_event_is_written_as_the_derived_serializer_writes_it(e in event()) {
            let (written, derived) = (e.to_json_vec(), serde_json::to_vec(&e).unwrap_or_default());
            prop_assert_eq!(String::from_utf8_lossy(&written), String::from_utf8_lossy(&derived));
        }

        /// Whatever the order of an event's fields, both decoders read it back.
        #[test]
        fn any_event_in_any_field_order_decodes_as_written(
            (e, order) in event().prop_flat_map(|e| {
                let n = entries(&e).len();
                (Just(e), Just((0..n).collect::<Vec<_>>()).prop_shuffle())
            })
        ) {
            let all = entries(&e);
            let shuffled: Vec<_> = order.iter().map(|&i| all[i].clone()).collect();
            let json = object(&shuffled);
            let named: Option<Kind> = serde_json::from_value(e.type_name().into()).ok();
            prop_assert_eq!(named, Some(kind_of(&e.body)));
            prop_assert_eq!(decode(&json).ok(), Some(e.clone()), "{}", json);
            prop_assert_eq!(reference(&json).ok(), Some(e), "{}", json);
        }

        /// With entries removed, nulled or added after `type`, the two decoders agree: the
        /// same event, or both refuse.
        #[test]
        fn edited_events_decode_as_the_derived_decoder_does(
            e in event(),
            drop_at in proptest::option::of(0usize..16),
            null_at in proptest::option::of(0usize..16),
            extras in proptest::collection::vec((extra(), 0usize..16), 0..3),
        ) {
            let mut all = entries(&e);
            if let Some(i) = null_at.filter(|&i| i < all.len()) {
                all[i].1 = Value::Null;
            }
            if let Some(i) = drop_at.filter(|&i| i < all.len()) {
                all.remove(i);
            }
            let after_type = all.iter().position(|(k, _)| k == "type").map_or(0, |i| i + 1);
            for (entry, at) in extras {
                let at = (after_type + at).min(all.len());
                all.insert(at, entry);
            }
            let json = object(&all);
            let (ours, theirs) = (decode(&json), reference(&json));
            prop_assert_eq!(ours.as_ref().ok(), theirs.as_ref().ok(), "{}", json);
        }
    }

    #[test]
    fn what_the_writer_writes_reads_back() {
        let json = r#"{"type":"route.selected","target":{"provider":"provider-mock","model":"model-alpha"},"attempt":1,"status":"routing","execution_id":"ac2f7958-3a6f-4e0e-99a9-e24a5b1ea370","sequence":2,"time":"2026-12-06T09:55:36.716Z"}"#;
        let e = decode(json).unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(e.to_json(), json);
        assert_eq!(Some(e), reference(json).ok());
    }

    #[test]
    fn a_second_copy_of_a_field_or_a_missing_one_is_refused() {
        let base = r#""status":"accepted","execution_id":"ac2f7958-3a6f-4e0e-99a9-e24a5b1ea370","sequence":1,"time":"2026-12-06T09:55:36.716Z""#;
        for json in [
            format!(r#"{{"type":"execution.accepted","type":"execution.accepted",{base}}}"#),
            format!(r#"{{"type":"execution.accepted",{base},"sequence":2}}"#),
            format!(r#"{{{base}}}"#),
            format!(r#"{{"type":"output.delta","output_index":0,{base}}}"#),
            format!(r#"{{"type":"no.such.event",{base}}}"#),
            r#"{"type":"execution.accepted","status":"accepted"}"#.to_owned(),
            "[]".to_owned(),
        ] {
            assert!(decode(&json).is_err(), "{json}");
            assert!(reference(&json).is_err(), "{json}");
        }
    }

    /// The one documented difference: a field of another event type before `type`, with a
    /// value that field cannot have.
    #[test]
    fn a_malformed_field_of_another_type_before_type_is_refused() {
        let json = r#"{"delta":7,"type":"execution.accepted","status":"accepted","execution_id":"ac2f7958-3a6f-4e0e-99a9-e24a5b1ea370","sequence":1,"time":"2026-12-06T09:55:36.716Z"}"#;
        assert!(decode(json).is_err());
        assert!(reference(json).is_ok());
        let after = json.replace(
            r#""delta":7,"type":"execution.accepted","#,
            r#""type":"execution.accepted","delta":7,"#,
        );
        assert_eq!(decode(&after).ok(), reference(&after).ok());
        assert!(decode(&after).is_ok());
    }
}
