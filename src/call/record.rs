//! The audit records of one call: `started` when it is admitted (or denied), `finished`
//! with its outcome. [`CallRecord`] writes `started` when made and `finished` exactly
//! once: when the call ends, or, if the call is dropped first (cancelled, its worker
//! stopped, the harness shut down), as `cancelled` when it drops. When records go
//! nowhere (no file, no listener), nothing is built.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use super::Answer;
use super::caller::{CallKind, Caller};
use super::error::CallError;
use super::metrics::CallMetrics;
use crate::audit::{AuditSink, Finished, Hop, Redacted, Round, Started};
use crate::server::ServerRef;
use crate::util::text::one_line;

/// The longest error text an audit record keeps (characters, before control characters
/// are escaped): a server's words reach it through its errors, and the file must not
/// grow by what a server sends.
const MAX_AUDIT_TEXT: usize = 1000;

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What the audit trail says of one call; see the module docs.
pub(crate) struct CallRecord {
    /// `None` when records go nowhere.
    sink: Option<AuditSink>,
    call_id: u64,
    started: Instant,
    /// `started`'s wall-clock time (Unix milliseconds), when records go somewhere:
    /// `finished`'s is this plus the latency (one wall-clock read per call, not two).
    started_ms: u64,
    /// How many servers the call could have gone to.
    pub(crate) candidates: usize,
    hops: Vec<Hop>,
    rounds: Vec<Round>,
    /// Legacy servers' questions during the call (see [`CallRecord::questions`]).
    questions: Option<std::sync::Arc<super::context::Questions>>,
    /// The server tried last.
    pub(crate) server: Option<ServerRef>,
    /// Whether the call's spans are exported (its head-sampling decision), told to its
    /// children: an untraced call's spans are disabled unless a log layer keeps them,
    /// so the current span cannot say.
    pub(crate) traced: bool,
    finished: bool,
    /// Counted whether or not records go anywhere.
    metrics: std::sync::Arc<CallMetrics>,
    method: &'static str,
}

impl CallRecord {
    /// Writes `started` for a call.
    pub(crate) fn start(
        sink: &AuditSink,
        metrics: &std::sync::Arc<CallMetrics>,
        call_id: u64,
        caller: &Caller,
        kind: CallKind,
        name: &str,
        args: &Value,
    ) -> CallRecord {
        let recording = sink.is_recording();
        let started_ms = if recording { unix_ms() } else { 0 };
        if recording {
            // A resource's URI may carry credentials (`https://user:token@host/…`,
            // `?X-Amz-Signature=…`, `#access_token=…`).
            let scrubbed = (kind == CallKind::Resource && name.contains(['@', '?', '#']))
                .then(|| crate::audit::without_url_secrets(sink.config(), name));
            let name = scrubbed.as_deref().unwrap_or(name);
            // A caller's text, of any length: the record keeps what identifies it.
            let name = crate::audit::cut(name, crate::audit::MAX_RECORDED_TEXT);
            let agent = caller
                .agent_id
                .as_deref()
                .map(|a| crate::audit::cut(a, crate::audit::MAX_RECORDED_TEXT));
            let auth = sink.hash_context(caller.auth_context.as_deref());
            sink.record(&Started {
                event: "started",
                call_id,
                time_ms: started_ms,
                agent: agent.as_deref(),
                auth: auth.as_deref(),
                kind: kind.as_str(),
                name: &name,
                arguments: Redacted {
                    config: sink.config(),
                    args,
                },
            });
        }
        CallRecord {
            sink: recording.then(|| sink.clone()),
            call_id,
            started: Instant::now(),
            started_ms,
            candidates: 0,
            hops: Vec::new(),
            rounds: Vec::new(),
            questions: None,
            server: None,
            traced: true,
            finished: false,
            metrics: metrics.clone(),
            method: kind.method(),
        }
    }

    /// When the call started.
    pub(crate) fn started(&self) -> Instant {
        self.started
    }

    /// The call's id.
    pub(crate) fn call_id(&self) -> u64 {
        self.call_id
    }

    /// Notes a failover hop.
    pub(crate) fn hop(&mut self, server: &str, error: String) {
        if self.sink.is_some() {
            let error = self.scrubbed(&error);
            self.hops.push(Hop {
                server: server.to_string(),
                error: one_line(&error, MAX_AUDIT_TEXT),
            });
        }
    }

    /// `text` (an error, which may quote the call's URI) without the credentials of a
    /// URL in it, for a resource read; as it is otherwise.
    fn scrubbed<'t>(&self, text: &'t str) -> std::borrow::Cow<'t, str> {
        match (&self.sink, self.method == CallKind::Resource.method()) {
            (Some(sink), true) if text.contains(['@', '?', '#']) => {
                std::borrow::Cow::Owned(crate::audit::without_url_secrets(sink.config(), text))
            }
            _ => std::borrow::Cow::Borrowed(text),
        }
    }

    /// Notes an `input_required` round.
    pub(crate) fn round(&mut self, server: &str, methods: Vec<String>) {
        self.metrics.round();
        if self.sink.is_some() {
            let methods = methods.iter().map(|m| one_line(m, 100)).collect();
            self.rounds.push(Round {
                server: server.to_string(),
                methods,
            });
        }
    }

    /// Where the questions legacy servers ask during the call are noted, with how each
    /// ended: written with `finished`.
    pub(crate) fn questions(&mut self, questions: std::sync::Arc<super::context::Questions>) {
        if self.sink.is_some() {
            self.questions = Some(questions);
        }
    }

    /// Writes `finished` with the call's outcome.
    pub(crate) fn finish(&mut self, outcome: &Result<Answer, CallError>) {
        let (result, code) = match outcome {
            Ok(a) if a.input_required => ("input_required", None),
            Ok(a) if a.result.get("isError").and_then(Value::as_bool) == Some(true) => {
                ("tool_error", None)
            }
            Ok(_) => ("ok", None),
            Err(CallError::Cancelled) => ("cancelled", Some("cancelled")),
            Err(e) => ("error", Some(e.code())),
        };
        // The metric's `error.type` is the span's (a JSON-RPC code, `tool_error`), held
        // to a fixed set: a server's codes are its own to choose.
        let error_type = match outcome {
            Ok(_) if result == "tool_error" => Some("tool_error"),
            Ok(_) => None,
            Err(e) => Some(super::telemetry::metric_error_type(e)),
        };
        let message = match (&self.sink, outcome) {
            (Some(_), Err(e)) => Some(one_line(&self.scrubbed(&e.to_string()), MAX_AUDIT_TEXT)),
            _ => None,
        };
        self.write(result, (code, error_type), message.as_deref());
    }

    /// Writes `finished`; `code` is the audit record's error, `error_type` the metric's.
    fn write(
        &mut self,
        outcome: &'static str,
        (code, error_type): (Option<&'static str>, Option<&'static str>),
        message: Option<&str>,
    ) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        let latency = self.started.elapsed();
        let server = self.server.as_ref();
        self.metrics.finished(
            server.map(|s| s.id()),
            (self.method, outcome, error_type),
            latency,
            |v| server.is_none_or(|s| s.protocol_version_is(v)),
            || {
                let transport = server.map(super::telemetry::transport);
                (transport, server.and_then(|s| s.protocol_version()))
            },
        );
        let Some(sink) = &self.sink else {
            return;
        };
        let questions = self
            .questions
            .as_ref()
            .map(|q| q.take())
            .unwrap_or_default();
        sink.record(&Finished {
            event: "finished",
            call_id: self.call_id,
            time_ms: self
                .started_ms
                .saturating_add(u64::try_from(latency.as_millis()).unwrap_or(u64::MAX)),
            server: self.server.as_ref().map(|s| s.id()),
            candidates: self.candidates,
            hops: &self.hops,
            rounds: &self.rounds,
            questions: &questions,
            outcome,
            error: code,
            message,
            latency_us: latency.as_micros() as u64,
        });
    }
}

impl Drop for CallRecord {
    fn drop(&mut self) {
        // Dropped by a panic in the call's path: its worker died, as the caller hears
        // (`WorkerDied`), which a person reading the trail must not take for a cancel.
        if std::thread::panicking() {
            return self.write(
                "error",
                (Some("worker_died"), Some("worker_died")),
                Some("the call's worker panicked"),
            );
        }
        self.write(
            "cancelled",
            (Some("cancelled"), Some("cancelled")),
            Some("the call ended before it finished (cancelled or shut down)"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A record dropped by a panic says the worker died, not that the call was cancelled.
    #[tokio::test]
    async fn a_call_ended_by_a_panic_is_recorded_as_its_worker_dying() {
        let dir = crate::util::scratch::Scratch::new("panicked-call");
        let path = dir.join("audit.jsonl");
        let config = crate::audit::AuditConfig {
            path: Some(path.clone()),
            ..crate::audit::AuditConfig::default()
        };
        let sink = AuditSink::new(config, crate::util::slot::ActorSlot::default());
        let metrics = std::sync::Arc::new(CallMetrics::default());
        let start = |id| {
            let args = serde_json::json!({});
            CallRecord::start(
                &sink,
                &metrics,
                id,
                &Caller::agent("a"),
                CallKind::Tool,
                "t",
                &args,
            )
        };
        let panicked = start(1);
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _held = panicked;
            panic!("in the call's path");
        }));
        drop(start(2));
        sink.write_now().await;
        let text = std::fs::read_to_string(&path).expect("audit");
        let finished: Vec<Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|r| r["event"] == "finished")
            .collect();
        assert_eq!(finished.len(), 2, "{text}");
        assert_eq!(finished[0]["outcome"], "error", "{text}");
        assert_eq!(finished[0]["error"], "worker_died", "{text}");
        assert_eq!(finished[1]["outcome"], "cancelled", "{text}");
    }
}
