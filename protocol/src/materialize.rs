//! The pure materializer: an execution's ordered events → its snapshot and result.
//!
//! [`Materializer`] is both the log-rule checker and the incremental projection. Every store
//! calls [`Materializer::check`] before an append becomes visible and [`Materializer::apply`]
//! after, so a snapshot costs O(1) per event instead of a replay, and no store can accept an
//! event that breaks the log: sequence exactly `last + 1`, `execution.accepted` first and only
//! first, status allowed for the type, nothing after the terminal event, terminal event at most
//! 2048 bytes, usage facts finite and non-negative [R 44, 47, 56-59].

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use crate::error::RuntimeError;
use crate::event::{
    EventBody, ExecutionStatus, MAX_TERMINAL_EVENT_BYTES, OutputArtifact, RuntimeEvent, Target,
};
use crate::id::{ExecutionId, Sequence};
use crate::snapshot::{
    ExecutionResultResponse, ExecutionSnapshot, ResultNotReady, SynthesizedResult, TextOutput,
    ToolCall,
};
use crate::time::Timestamp;
use crate::usage::UsageFact;

/// Why an event may not be appended. Stores report these as `internal_error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogViolation {
    #[error("event belongs to another execution")]
    WrongExecution,
    #[error("the first event must be execution.accepted with sequence 1")]
    FirstNotAccepted,
    #[error("execution.accepted may only be the first event")]
    AcceptedNotFirst,
    #[error("expected sequence {expected}, got {got}")]
    OutOfOrder { expected: Sequence, got: Sequence },
    #[error("the log already has a terminal event")]
    AfterTerminal,
    #[error("status {status} is not allowed for {event_type}")]
    StatusMismatch {
        event_type: &'static str,
        status: ExecutionStatus,
    },
    #[error("terminal event exceeds {MAX_TERMINAL_EVENT_BYTES} bytes")]
    TerminalTooLarge,
    #[error("usage fact quantity must be finite and non-negative")]
    InvalidUsage,
}

/// The rules one event must obey on its own, whatever the log holds: `execution.accepted`
/// only at sequence 1, a status allowed for the type, valid usage facts and a bounded terminal
/// event. Stores that fence on the sequence by other means (compare-and-set in JetStream) check
/// these before writing.
pub fn check_event(event: &RuntimeEvent) -> Result<(), LogViolation> {
    if (event.body == EventBody::Accepted) != (event.sequence == Sequence(1)) {
        return Err(if event.body == EventBody::Accepted {
            LogViolation::AcceptedNotFirst
        } else {
            LogViolation::FirstNotAccepted
        });
    }
    if !event.body.allows_status(event.status) {
        return Err(LogViolation::StatusMismatch {
            event_type: event.type_name(),
            status: event.status,
        });
    }
    if let EventBody::UsageReported { facts } = &event.body
        && facts.iter().any(|f| f.check().is_err())
    {
        return Err(LogViolation::InvalidUsage);
    }
    if event.is_terminal() && event.to_json_vec().len() > MAX_TERMINAL_EVENT_BYTES {
        return Err(LogViolation::TerminalTooLarge);
    }
    Ok(())
}

/// Incrementally materialized state of one execution.
#[derive(Debug, Clone)]
pub struct Materializer {
    execution_id: ExecutionId,
    created_at: Timestamp,
    updated_at: Timestamp,
    status: ExecutionStatus,
    last_sequence: Sequence,
    usage: Vec<UsageFact>,
    target: Option<Target>,
    error: Option<RuntimeError>,
    outputs: BTreeMap<u32, String>,
    tool_calls: Vec<ToolCall>,
    tool_index: HashMap<String, usize>,
    synthesized: bool,
    output_result: Option<(Value, Option<Vec<OutputArtifact>>)>,
    /// Whether output text, tool-call arguments and results are accumulated (`false`: the log
    /// rules only, see [`Materializer::checking_only`]).
    content: bool,
}

impl Materializer {
    /// Starts a log from its first event, which must be `execution.accepted` with sequence 1.
    pub fn start(first: &RuntimeEvent) -> Result<Self, LogViolation> {
        if first.body != EventBody::Accepted || first.sequence != Sequence(1) {
            return Err(LogViolation::FirstNotAccepted);
        }
        if !first.body.allows_status(first.status) {
            return Err(LogViolation::StatusMismatch {
                event_type: first.type_name(),
                status: first.status,
            });
        }
        Ok(Self {
            execution_id: first.execution_id,
            created_at: first.time,
            updated_at: first.time,
            status: ExecutionStatus::Accepted,
            last_sequence: Sequence(1),
            usage: Vec::new(),
            target: None,
            error: None,
            outputs: BTreeMap::new(),
            tool_calls: Vec::new(),
            tool_index: HashMap::new(),
            synthesized: false,
            output_result: None,
            content: true,
        })
    }

    /// This materializer keeping only what the log rules need (status, sequence, target,
    /// usage, error), not output text, tool-call arguments or results: for a store that holds
    /// the events anyway and folds a full snapshot from them when asked, so the output is not
    /// held twice.
    pub fn checking_only(mut self) -> Self {
        self.content = false;
        self.outputs.clear();
        self.tool_calls
            .iter_mut()
            .for_each(|call| call.arguments.clear());
        self.output_result = None;
        self
    }

    /// Replays a whole log.
    pub fn from_events<'a>(
        events: impl IntoIterator<Item = &'a RuntimeEvent>,
    ) -> Result<Option<Self>, LogViolation> {
        let mut iter = events.into_iter();
        let Some(first) = iter.next() else {
            return Ok(None);
        };
        let mut m = Self::start(first)?;
        for event in iter {
            m.apply(event)?;
        }
        Ok(Some(m))
    }

    /// Checks that `event` may be appended next, without changing anything.
    pub fn check(&self, event: &RuntimeEvent) -> Result<(), LogViolation> {
        if event.execution_id != self.execution_id {
            return Err(LogViolation::WrongExecution);
        }
        if self.status.is_terminal() {
            return Err(LogViolation::AfterTerminal);
        }
        let expected = self.last_sequence.next();
        if event.sequence != expected {
            return Err(LogViolation::OutOfOrder {
                expected,
                got: event.sequence,
            });
        }
        check_event(event)
    }

    /// Checks and applies `event`. On error nothing changes.
    pub fn apply(&mut self, event: &RuntimeEvent) -> Result<(), LogViolation> {
        self.check(event)?;
        self.last_sequence = event.sequence;
        self.updated_at = event.time;
        self.status = event.status;
        match &event.body {
            EventBody::Accepted
            | EventBody::RouteAttemptFailed { .. }
            | EventBody::Progress { .. } => {}
            EventBody::RouteSelected { target, .. } | EventBody::Completed { target } => {
                self.target = Some(target.clone());
            }
            EventBody::OutputDelta {
                output_index,
                delta,
            } => {
                self.synthesized = true;
                if self.content {
                    self.outputs
                        .entry(*output_index)
                        .or_default()
                        .push_str(delta);
                }
            }
            EventBody::ToolCallStarted { call_id, name } => {
                self.synthesized = true;
                if !self.tool_index.contains_key(call_id) {
                    self.tool_index
                        .insert(call_id.clone(), self.tool_calls.len());
                    self.tool_calls.push(ToolCall {
                        call_id: call_id.clone(),
                        name: name.clone(),
                        arguments: String::new(),
                    });
                }
            }
            EventBody::ToolCallArgumentsDelta { call_id, delta } => {
                self.synthesized = true;
                // An arguments delta for an unknown call is ignored [R 58].
                if let Some(call) = self
                    .tool_index
                    .get(call_id)
                    .and_then(|&i| self.tool_calls.get_mut(i))
                    && self.content
                {
                    call.arguments.push_str(delta);
                }
            }
            EventBody::OutputResult { result, artifacts } => {
                if self.content {
                    self.output_result = Some((result.clone(), artifacts.clone()));
                }
            }
            EventBody::UsageReported { facts } => self.usage.extend(facts.iter().cloned()),
            EventBody::Failed { error } => self.error = Some(error.clone()),
        }
        Ok(())
    }

    pub fn execution_id(&self) -> ExecutionId {
        self.execution_id
    }

    pub fn status(&self) -> ExecutionStatus {
        self.status
    }

    pub fn last_sequence(&self) -> Sequence {
        self.last_sequence
    }

    pub fn created_at(&self) -> Timestamp {
        self.created_at
    }

    /// Whether the log has its terminal event.
    pub fn is_terminal(&self) -> bool {
        self.status.is_terminal()
    }

    /// The result: the last `output.result`, else the synthesized text/tool result if any
    /// text or tool event exists [R 58-59].
    fn result(&self) -> (Option<Value>, Option<Vec<OutputArtifact>>) {
        if let Some((result, artifacts)) = &self.output_result {
            return (Some(result.clone()), artifacts.clone());
        }
        if !self.synthesized {
            return (None, None);
        }
        let synthesized = SynthesizedResult {
            outputs: self
                .outputs
                .iter()
                .map(|(index, text)| TextOutput {
                    index: *index,
                    kind: "text".into(),
                    text: text.clone(),
                })
                .collect(),
            tool_calls: self.tool_calls.clone(),
        };
        (serde_json::to_value(synthesized).ok(), None)
    }

    /// The snapshot served by `GET /v1/executions/{id}`.
    pub fn snapshot(&self) -> ExecutionSnapshot {
        let (result, artifacts) = self.result();
        ExecutionSnapshot {
            execution_id: self.execution_id,
            status: self.status,
            created_at: self.created_at,
            updated_at: self.updated_at,
            last_sequence: self.last_sequence,
            usage: self.usage.clone(),
            target: self.target.clone(),
            error: self.error.clone(),
            result,
            artifacts,
        }
    }

    /// The body of `GET /v1/executions/{id}/result`: the result on success, else the status
    /// (and error) for the 409 answer.
    pub fn result_response(&self) -> Result<ExecutionResultResponse, ResultNotReady> {
        if self.status != ExecutionStatus::Succeeded {
            return Err(ResultNotReady {
                status: self.status,
                error: self.error.clone(),
            });
        }
        let (result, artifacts) = self.result();
        Ok(ExecutionResultResponse {
            execution_id: self.execution_id,
            target: self.target.clone(),
            result,
            artifacts: artifacts.unwrap_or_default(),
            usage: self.usage.clone(),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;
    use crate::event::ProgressPhase;
    use crate::usage::{UsageSource, UsageUnit};
    use proptest::prelude::*;
    use serde_json::json;

    fn target(p: &str) -> Target {
        Target {
            provider: p.into(),
            model: "m".into(),
        }
    }

    /// `route.selected` of provider `p`'s model, attempt `attempt`.
    fn selected(p: &str, attempt: u32) -> EventBody {
        EventBody::RouteSelected {
            target: target(p),
            attempt,
        }
    }

    fn log(id: ExecutionId, bodies: Vec<EventBody>) -> Vec<RuntimeEvent> {
        RuntimeEvent::numbered(id, bodies, |i| Timestamp::from_unix_millis(1000 + i as i64))
    }

    fn mock_run(id: ExecutionId) -> Vec<RuntimeEvent> {
        log(
            id,
            vec![
                EventBody::Accepted,
                selected("provider-mock", 1),
                EventBody::OutputDelta {
                    output_index: 0,
                    delta: "hello".into(),
                },
                EventBody::OutputDelta {
                    output_index: 0,
                    delta: " from".into(),
                },
                EventBody::OutputDelta {
                    output_index: 0,
                    delta: " mock".into(),
                },
                EventBody::UsageReported {
                    facts: UsageFact::runtime_tokens(1.0, 3.0).unwrap(),
                },
                EventBody::Completed {
                    target: target("provider-mock"),
                },
            ],
        )
    }

    /// The state of a log of `bodies` (from sequence 1) of a fresh execution.
    fn materialize(bodies: Vec<EventBody>) -> Materializer {
        let events = log(ExecutionId::new_random(), bodies);
        Materializer::from_events(&events).unwrap().unwrap()
    }

    #[test]
    fn mock_sequence_materializes_like_the_reference() {
        let id = ExecutionId::new_random();
        let m = Materializer::from_events(&mock_run(id)).unwrap().unwrap();
        let snap = serde_json::to_value(m.snapshot()).unwrap();
        assert_eq!(snap["status"], "succeeded");
        assert_eq!(snap["last_sequence"], 7);
        assert_eq!(snap["created_at"], "1970-01-01T00:00:01.000Z");
        assert_eq!(snap["updated_at"], "1970-01-01T00:00:01.006Z");
        assert_eq!(
            snap["result"],
            json!({"outputs":[{"index":0,"type":"text","text":"hello from mock"}],"tool_calls":[]})
        );
        assert_eq!(snap["usage"].as_array().unwrap().len(), 2);
        assert_eq!(
            snap["target"],
            json!({"provider":"provider-mock","model":"m"})
        );
        assert!(snap.get("artifacts").is_none());
        assert!(snap.get("error").is_none());
        let result = m.result_response().unwrap();
        assert_eq!(result.artifacts, vec![]);
    }

    #[test]
    fn outputs_sort_by_index_and_tool_arguments_concatenate() {
        let m = materialize(vec![
            EventBody::Accepted,
            selected("p", 1),
            EventBody::OutputDelta {
                output_index: 2,
                delta: "b".into(),
            },
            EventBody::ToolCallStarted {
                call_id: "c1".into(),
                name: "lookup".into(),
            },
            EventBody::ToolCallArgumentsDelta {
                call_id: "c1".into(),
                delta: "{\"q\":".into(),
            },
            EventBody::ToolCallArgumentsDelta {
                call_id: "unknown".into(),
                delta: "zzz".into(),
            },
            EventBody::OutputDelta {
                output_index: 0,
                delta: "a".into(),
            },
            EventBody::ToolCallArgumentsDelta {
                call_id: "c1".into(),
                delta: "1}".into(),
            },
        ]);
        assert_eq!(m.status(), ExecutionStatus::Running);
        let snap = serde_json::to_value(m.snapshot()).unwrap();
        assert_eq!(
            snap["result"],
            json!({"outputs":[{"index":0,"type":"text","text":"a"},{"index":2,"type":"text","text":"b"}],
                   "tool_calls":[{"call_id":"c1","name":"lookup","arguments":"{\"q\":1}"}]})
        );
        assert_eq!(
            m.result_response().unwrap_err(),
            ResultNotReady {
                status: ExecutionStatus::Running,
                error: None
            }
        );
    }

    #[test]
    fn last_output_result_wins_and_suppresses_synthesis() {
        let artifact = OutputArtifact {
            uri: "https://cdn/x.png".into(),
            media_type: Some("image/png".into()),
        };
        let m = materialize(vec![
            EventBody::Accepted,
            selected("fal", 1),
            EventBody::Progress {
                phase: ProgressPhase::Queued,
                progress: None,
            },
            EventBody::OutputDelta {
                output_index: 0,
                delta: "ignored".into(),
            },
            EventBody::OutputResult {
                result: json!({"first":true}),
                artifacts: None,
            },
            EventBody::OutputResult {
                result: json!({"images":[1]}),
                artifacts: Some(vec![artifact.clone()]),
            },
            EventBody::Completed {
                target: target("fal"),
            },
        ]);
        let r = m.result_response().unwrap();
        assert_eq!(r.result, Some(json!({"images":[1]})));
        assert_eq!(r.artifacts, vec![artifact]);
    }

    #[test]
    fn failure_reports_attempted_target_and_error() {
        let m = materialize(vec![
            EventBody::Accepted,
            selected("a", 1),
            EventBody::RouteAttemptFailed {
                target: target("a"),
                attempt: 1,
                error: RuntimeError::provider_queue_full(),
            },
            selected("b", 2),
            EventBody::Failed {
                error: RuntimeError::cancelled(),
            },
        ]);
        let snap = m.snapshot();
        assert_eq!(snap.status, ExecutionStatus::Cancelled);
        assert_eq!(snap.target, Some(target("b")));
        assert_eq!(
            snap.error.as_ref().map(|e| e.code),
            Some(ErrorCode::Cancelled)
        );
        assert!(snap.result.is_none());
        let nr = m.result_response().unwrap_err();
        assert_eq!(nr.status, ExecutionStatus::Cancelled);
    }

    #[test]
    fn a_checking_only_materializer_keeps_the_rules_and_state_but_no_output() {
        let id = ExecutionId::new_random();
        let events = mock_run(id);
        let full = Materializer::from_events(&events).unwrap().unwrap();
        let mut checking = Materializer::start(&events[0]).unwrap().checking_only();
        for event in &events[1..] {
            checking.apply(event).unwrap();
        }
        assert_eq!(checking.status(), full.status());
        assert_eq!(checking.last_sequence(), full.last_sequence());
        assert!(checking.is_terminal());
        assert_eq!(checking.snapshot().usage, full.snapshot().usage);
        assert_eq!(
            full.snapshot().result.unwrap()["outputs"][0]["text"],
            "hello from mock"
        );
        assert_eq!(checking.snapshot().result.unwrap()["outputs"], json!([]));
        // The rules hold as before: nothing after the terminal event.
        let late = RuntimeEvent::new(
            id,
            checking.last_sequence().next(),
            Timestamp::from_unix_millis(9000),
            EventBody::Progress {
                phase: ProgressPhase::Processing,
                progress: None,
            },
        );
        assert_eq!(checking.check(&late), Err(LogViolation::AfterTerminal));
    }

    #[test]
    fn rejects_rule_breaking_appends() {
        let id = ExecutionId::new_random();
        let events = mock_run(id);
        let mut m = Materializer::start(&events[0]).unwrap();
        assert_eq!(
            m.apply(&events[2]),
            Err(LogViolation::OutOfOrder {
                expected: Sequence(2),
                got: Sequence(3)
            })
        );
        let mut wrong_status = events[1].clone();
        wrong_status.status = ExecutionStatus::Running;
        assert!(matches!(
            m.apply(&wrong_status),
            Err(LogViolation::StatusMismatch { .. })
        ));
        let mut other = events[1].clone();
        other.execution_id = ExecutionId::new_random();
        assert_eq!(m.apply(&other), Err(LogViolation::WrongExecution));
        let mut second_accept = events[1].clone();
        second_accept.body = EventBody::Accepted;
        second_accept.status = ExecutionStatus::Accepted;
        assert_eq!(m.apply(&second_accept), Err(LogViolation::AcceptedNotFirst));
        for e in &events[1..] {
            m.apply(e).unwrap();
        }
        let late = RuntimeEvent::new(
            id,
            Sequence(8),
            Timestamp::now(),
            EventBody::Failed {
                error: RuntimeError::cancelled(),
            },
        );
        assert_eq!(m.apply(&late), Err(LogViolation::AfterTerminal));
        assert!(Materializer::start(&events[1]).is_err());
    }

    #[test]
    fn rejects_oversized_terminal_and_bad_usage() {
        let id = ExecutionId::new_random();
        let events = mock_run(id);
        let mut m = Materializer::start(&events[0]).unwrap();
        let huge = RuntimeError::new(ErrorCode::InternalError, "x".repeat(3000), false);
        let e = RuntimeEvent::new(
            id,
            Sequence(2),
            Timestamp::now(),
            EventBody::Failed { error: huge },
        );
        assert_eq!(m.apply(&e), Err(LogViolation::TerminalTooLarge));
        let bad = UsageFact {
            unit: UsageUnit::request(),
            quantity: -1.0,
            source: UsageSource::Provider,
            complete: None,
        };
        let e = RuntimeEvent::new(
            id,
            Sequence(2),
            Timestamp::now(),
            EventBody::UsageReported { facts: vec![bad] },
        );
        assert_eq!(m.apply(&e), Err(LogViolation::InvalidUsage));
        assert_eq!(m.last_sequence(), Sequence(1));
    }

    /// One random mutation of a valid log.
    #[derive(Debug, Clone)]
    enum Mutation {
        Swap(usize, usize),
        Duplicate(usize),
        Drop(usize),
        AfterTerminal,
    }

    fn arb_body() -> impl Strategy<Value = EventBody> {
        prop_oneof![
            (0u32..3, "[a-z]{0,3}").prop_map(|(i, d)| EventBody::OutputDelta {
                output_index: i,
                delta: d
            }),
            "[ab]".prop_map(|c| EventBody::ToolCallStarted {
                call_id: c,
                name: "f".into()
            }),
            ("[abc]", "[{}0-9]{0,3}").prop_map(|(c, d)| EventBody::ToolCallArgumentsDelta {
                call_id: c,
                delta: d
            }),
            Just(EventBody::Progress {
                phase: ProgressPhase::Processing,
                progress: Some(0.5)
            }),
            (0u32..5).prop_map(|q| EventBody::UsageReported {
                facts: vec![UsageFact {
                    unit: UsageUnit::output_token(),
                    quantity: f64::from(q),
                    source: UsageSource::Provider,
                    complete: None
                }]
            }),
        ]
    }

    fn arb_log() -> impl Strategy<Value = Vec<RuntimeEvent>> {
        (proptest::collection::vec(arb_body(), 0..12), any::<bool>()).prop_map(|(mid, ok)| {
            let id = ExecutionId::new_random();
            let mut bodies = vec![EventBody::Accepted, selected("p", 1)];
            bodies.extend(mid);
            bodies.push(if ok {
                EventBody::Completed {
                    target: target("p"),
                }
            } else {
                EventBody::Failed {
                    error: RuntimeError::internal(),
                }
            });
            log(id, bodies)
        })
    }

    fn apply_all(events: &[RuntimeEvent]) -> (Option<Materializer>, Option<usize>) {
        let Some(first) = events.first() else {
            return (None, None);
        };
        let Ok(mut m) = Materializer::start(first) else {
            return (None, Some(0));
        };
        for (i, e) in events.iter().enumerate().skip(1) {
            let before = m.snapshot();
            if m.apply(e).is_err() {
                assert_eq!(m.snapshot(), before, "a rejected append changed state");
                return (Some(m), Some(i));
            }
        }
        (Some(m), None)
    }

    proptest! {
        #[test]
        fn valid_logs_apply_fully_and_match_a_naive_fold(events in arb_log()) {
            let (m, rejected) = apply_all(&events);
            prop_assert_eq!(rejected, None);
            let m = m.unwrap();
            prop_assert!(m.is_terminal());
            prop_assert_eq!(m.last_sequence(), Sequence(events.len() as u64));
            // Naive recomputation of text outputs.
            let mut texts: BTreeMap<u32, String> = BTreeMap::new();
            for e in &events {
                if let EventBody::OutputDelta { output_index, delta } = &e.body {
                    texts.entry(*output_index).or_default().push_str(delta);
                }
            }
            let snap = m.snapshot();
            if let Some(result) = snap.result {
                let synth: SynthesizedResult = serde_json::from_value(result).unwrap();
                let got: BTreeMap<u32, String> = synth.outputs.into_iter().map(|o| (o.index, o.text)).collect();
                prop_assert_eq!(got, texts);
            }
            let usage_events: usize = events.iter().map(|e| match &e.body { EventBody::UsageReported { facts } => facts.len(), _ => 0 }).sum();
            prop_assert_eq!(snap.usage.len(), usage_events);
        }

        #[test]
        fn mutated_logs_are_rejected_at_the_first_bad_event(events in arb_log(), a in 0usize..64, b in 0usize..64, kind in 0u8..4) {
            let n = events.len();
            let mutation = match kind {
                0 => Mutation::Swap(a % n, b % n),
                1 => Mutation::Duplicate(a % n),
                2 => Mutation::Drop(a % n),
                _ => Mutation::AfterTerminal,
            };
            let mut mutated = events.clone();
            match mutation {
                Mutation::Swap(i, j) => mutated.swap(i, j),
                Mutation::Duplicate(i) => { let e = mutated[i].clone(); mutated.insert(i + 1, e); }
                Mutation::Drop(i) => { mutated.remove(i); }
                Mutation::AfterTerminal => {
                    let last = mutated[n - 1].sequence;
                    mutated.push(RuntimeEvent::new(mutated[0].execution_id, last.next(), Timestamp::now(), EventBody::OutputDelta { output_index: 0, delta: "late".into() }));
                }
            }
            let changed = mutated != events;
            let (_, rejected) = apply_all(&mutated);
            if changed {
                // The first position where the mutated log departs from a valid one must be rejected.
                let first_diff = mutated.iter().zip(events.iter()).position(|(x, y)| x != y).unwrap_or(n.min(mutated.len()));
                // Dropping the terminal event leaves a valid, still-running prefix.
                let expected = (first_diff < mutated.len()).then_some(first_diff);
                prop_assert_eq!(rejected, expected);
            } else {
                prop_assert_eq!(rejected, None);
            }
        }
    }
}
