//! `Terminal`: everything `mrt` writes.
//!
//! stdout carries the execution's output only (text, then tool calls and an `output.result`), so
//! `mrt run --text hi > answer.txt` captures the answer and nothing else; diagnostics (usage,
//! failed attempts, errors, the generated idempotency key) go to stderr. With `--json`, stdout
//! carries one JSON document per line instead.
//!
//! The progress line of asynchronous media executions (`execution.progress`) is drawn on stderr
//! only when stderr is a terminal, and is erased before anything else is written to either
//! stream, so the two never interleave on screen.

use std::io::{self, Write};
use std::time::Instant;

use protocol::event::ProgressPhase;
use protocol::manifest::ProviderManifest;
use protocol::{EventBody, RuntimeEvent};
use serde::Serialize;

use crate::transcript::Transcript;

/// stdout, stderr and the output mode.
pub struct Terminal<'a> {
    out: &'a mut dyn Write,
    err: &'a mut dyn Write,
    json: bool,
    progress_enabled: bool,
    progress_shown: bool,
    /// The output index streamed live; other indices are printed at the end.
    live_index: Option<u32>,
    /// Whether live text was printed and did not end with a newline.
    open_line: bool,
}

impl std::fmt::Debug for Terminal<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Terminal")
            .field("json", &self.json)
            .field("progress_enabled", &self.progress_enabled)
            .finish_non_exhaustive()
    }
}

impl<'a> Terminal<'a> {
    /// A terminal over `out` and `err`; `progress` enables the live progress line.
    pub fn new(out: &'a mut dyn Write, err: &'a mut dyn Write, json: bool, progress: bool) -> Self {
        Self {
            out,
            err,
            json,
            progress_enabled: progress && !json,
            progress_shown: false,
            live_index: None,
            open_line: false,
        }
    }

    /// Whether `--json` is on.
    pub fn json(&self) -> bool {
        self.json
    }

    /// A diagnostic line on stderr. Failures to write diagnostics are ignored: there is
    /// nowhere left to report them.
    pub fn note(&mut self, line: &str) {
        self.clear_progress();
        let _ = writeln!(self.err, "{line}");
        let _ = self.err.flush();
    }

    /// A line on stdout.
    pub fn line(&mut self, line: &str) -> io::Result<()> {
        self.clear_progress();
        writeln!(self.out, "{line}")?;
        self.out.flush()
    }

    /// A JSON document on stdout: pretty for people, one compact line with `--json`.
    pub fn json_document<T: Serialize>(&mut self, value: &T) -> io::Result<()> {
        let text = if self.json {
            serde_json::to_string(value)
        } else {
            serde_json::to_string_pretty(value)
        }
        .map_err(io::Error::other)?;
        self.line(&text)
    }

    /// Erases the progress line if one is shown.
    pub fn clear_progress(&mut self) {
        if self.progress_shown {
            let _ = write!(self.err, "\r\x1b[2K");
            let _ = self.err.flush();
            self.progress_shown = false;
        }
    }

    fn show_progress(&mut self, phase: ProgressPhase, progress: Option<f64>, started: Instant) {
        if !self.progress_enabled {
            return;
        }
        let phase = match phase {
            ProgressPhase::Queued => "queued",
            ProgressPhase::Processing => "processing",
        };
        let amount = match progress {
            Some(p) if (0.0..=1.0).contains(&p) => format!(" {:.0}%", p * 100.0),
            Some(p) if p.is_finite() => format!(" {p}"),
            _ => String::new(),
        };
        let elapsed = started.elapsed().as_secs();
        let _ = write!(self.err, "\r\x1b[2K{phase}{amount} ({elapsed}s)");
        let _ = self.err.flush();
        self.progress_shown = true;
    }

    /// Renders one event as it arrives.
    pub fn event(&mut self, event: &RuntimeEvent, started: Instant) -> io::Result<()> {
        if self.json {
            writeln!(self.out, "{}", event.to_json())?;
            return self.out.flush();
        }
        match &event.body {
            EventBody::OutputDelta {
                output_index,
                delta,
            } => {
                let live = *self.live_index.get_or_insert(*output_index);
                if live == *output_index && !delta.is_empty() {
                    self.clear_progress();
                    write!(self.out, "{delta}")?;
                    self.out.flush()?;
                    self.open_line = !delta.ends_with('\n');
                }
            }
            EventBody::Progress { phase, progress } => {
                self.show_progress(*phase, *progress, started);
            }
            EventBody::RouteAttemptFailed {
                target,
                attempt,
                error,
            } => self.note(&format!(
                "mrt: attempt {attempt} on {}/{} failed: {}: {}",
                target.provider, target.model, error.code, error.message
            )),
            _ => {}
        }
        Ok(())
    }

    /// After the last event (text mode): ends the live text line, prints the other outputs,
    /// tool calls and the result on stdout, and the usage on stderr.
    pub fn summary(&mut self, transcript: &Transcript) -> io::Result<()> {
        if self.json {
            return Ok(());
        }
        self.clear_progress();
        if self.open_line {
            writeln!(self.out)?;
            self.open_line = false;
        }
        for (index, text) in &transcript.outputs {
            if Some(*index) != self.live_index {
                writeln!(self.out, "[output {index}]")?;
                writeln!(self.out, "{text}")?;
            }
        }
        for call in &transcript.tool_calls {
            writeln!(
                self.out,
                "tool call {} ({}): {}",
                call.name, call.call_id, call.arguments
            )?;
        }
        if let Some((result, artifacts)) = &transcript.result {
            let text = serde_json::to_string_pretty(result).map_err(io::Error::other)?;
            writeln!(self.out, "{text}")?;
            for artifact in artifacts {
                match &artifact.media_type {
                    Some(media_type) => {
                        writeln!(self.out, "artifact: {} ({media_type})", artifact.uri)?
                    }
                    None => writeln!(self.out, "artifact: {}", artifact.uri)?,
                }
            }
        }
        self.out.flush()?;
        if !transcript.usage.is_empty() {
            let facts: Vec<String> = transcript
                .usage
                .iter()
                .map(|f| format!("{}={}", f.unit.as_str(), f.quantity))
                .collect();
            self.note(&format!("mrt: usage: {}", facts.join(" ")));
        }
        Ok(())
    }

    /// One line per provider model.
    pub fn providers(&mut self, providers: &[ProviderManifest]) -> io::Result<()> {
        for manifest in providers {
            for model in &manifest.models {
                let modalities = |list: &[protocol::request::Modality]| {
                    list.iter()
                        .map(|m| {
                            serde_json::to_value(m)
                                .ok()
                                .and_then(|v| v.as_str().map(str::to_owned))
                                .unwrap_or_default()
                        })
                        .collect::<Vec<_>>()
                        .join(",")
                };
                let mut flags = Vec::new();
                for (on, name) in [
                    (model.stream, "stream"),
                    (model.tools, "tools"),
                    (model.structured_output, "structured_output"),
                    (model.r#async, "async"),
                    (model.cancel, "cancel"),
                ] {
                    if on {
                        flags.push(name);
                    }
                }
                writeln!(
                    self.out,
                    "{}\t{}\t{}\tin:{}\tout:{}\t{}",
                    manifest.provider,
                    model.model,
                    model.abilities.join(","),
                    modalities(&model.input_modalities),
                    modalities(&model.output_modalities),
                    flags.join(",")
                )?;
            }
        }
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transcript::tests::event;
    use protocol::Target;
    use protocol::event::OutputArtifact;

    /// Renders `events` (text mode) and returns stdout and stderr.
    fn render(events: &[RuntimeEvent], progress: bool) -> (String, String) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        {
            let mut term = Terminal::new(&mut out, &mut err, false, progress);
            let mut transcript = Transcript::new();
            for e in events {
                transcript.apply(e);
                term.event(e, Instant::now()).unwrap();
            }
            term.clear_progress();
            term.summary(&transcript).unwrap();
        }
        (
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }

    fn media_run() -> Vec<RuntimeEvent> {
        vec![
            event(
                3,
                EventBody::Progress {
                    phase: ProgressPhase::Queued,
                    progress: None,
                },
            ),
            event(
                4,
                EventBody::Progress {
                    phase: ProgressPhase::Processing,
                    progress: Some(0.42),
                },
            ),
            event(
                5,
                EventBody::OutputResult {
                    result: serde_json::json!({"images": 1}),
                    artifacts: Some(vec![OutputArtifact {
                        uri: "https://cdn.example/a.png".into(),
                        media_type: Some("image/png".into()),
                    }]),
                },
            ),
            event(
                6,
                EventBody::Completed {
                    target: Target {
                        provider: "fal".into(),
                        model: "m".into(),
                    },
                },
            ),
        ]
    }

    #[test]
    fn progress_line_is_drawn_on_a_terminal_and_erased_before_output() {
        let (out, err) = render(&media_run(), true);
        assert!(err.contains("\r\x1b[2Kqueued (0s)"), "{err:?}");
        assert!(err.contains("\r\x1b[2Kprocessing 42% (0s)"), "{err:?}");
        assert!(err.ends_with("\r\x1b[2K"), "erased at the end: {err:?}");
        assert!(out.contains("\"images\": 1"), "{out}");
        assert!(out.contains("artifact: https://cdn.example/a.png (image/png)"));
    }

    #[test]
    fn no_progress_line_without_a_terminal() {
        let (_, err) = render(&media_run(), false);
        assert!(err.is_empty(), "{err:?}");
    }

    #[test]
    fn text_tool_calls_and_usage() {
        let events = vec![
            event(
                3,
                EventBody::OutputDelta {
                    output_index: 0,
                    delta: "hi".into(),
                },
            ),
            event(
                4,
                EventBody::OutputDelta {
                    output_index: 1,
                    delta: "second".into(),
                },
            ),
            event(
                5,
                EventBody::ToolCallStarted {
                    call_id: "c1".into(),
                    name: "weather".into(),
                },
            ),
            event(
                6,
                EventBody::ToolCallArgumentsDelta {
                    call_id: "c1".into(),
                    delta: "{\"city\":\"Oslo\"}".into(),
                },
            ),
            event(
                7,
                EventBody::UsageReported {
                    facts: vec![
                        protocol::UsageFact::new(
                            protocol::UsageUnit::output_token(),
                            2.0,
                            protocol::UsageSource::Provider,
                        )
                        .unwrap(),
                    ],
                },
            ),
        ];
        let (out, err) = render(&events, false);
        assert_eq!(
            out,
            "hi\n[output 1]\nsecond\ntool call weather (c1): {\"city\":\"Oslo\"}\n"
        );
        assert_eq!(err, "mrt: usage: output_token=2\n");
    }
}
