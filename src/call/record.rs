//! The audit records of one call: `started` when it is admitted (or denied), `finished`
//! with its outcome. [`CallRecord`] writes `started` when made and `finished` exactly
//! once: when the call ends, or, if the call is dropped first (cancelled, its worker
//! killed, the harness shut down), as `cancelled` when it drops.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::caller::{CallKind, Caller};
use super::error::CallError;
use crate::audit::AuditSink;

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What the audit trail says of one call; see the module docs.
pub(crate) struct CallRecord {
    sink: AuditSink,
    pub(crate) call_id: u64,
    started: Instant,
    /// How many servers the call could have gone to.
    pub(crate) candidates: usize,
    pub(crate) hops: Vec<Value>,
    pub(crate) rounds: Vec<Value>,
    pub(crate) server: Option<String>,
    finished: bool,
}

impl CallRecord {
    /// Writes `started` for a call.
    pub(crate) fn start(
        sink: &AuditSink,
        call_id: u64,
        caller: &Caller,
        kind: CallKind,
        name: &str,
        args: &Value,
    ) -> CallRecord {
        sink.record(json!({
            "event": "started", "call_id": call_id, "time_ms": unix_ms(),
            "agent": caller.agent_id, "auth": sink.hash_context(caller.auth_context.as_deref()),
            "kind": kind.as_str(), "name": name,
            "arguments": sink.config().redact(args),
        }));
        CallRecord {
            sink: sink.clone(),
            call_id,
            started: Instant::now(),
            candidates: 0,
            hops: Vec::new(),
            rounds: Vec::new(),
            server: None,
            finished: false,
        }
    }

    /// Writes `finished` with the call's outcome.
    pub(crate) fn finish(&mut self, outcome: &Result<Value, CallError>) {
        let (result, code) = match outcome {
            Ok(v) if v.get("isError").and_then(Value::as_bool) == Some(true) => {
                ("tool_error", None)
            }
            Ok(_) => ("ok", None),
            Err(CallError::Cancelled) => ("cancelled", Some("cancelled")),
            Err(e) => ("error", Some(e.code())),
        };
        let message = outcome.as_ref().err().map(|e| e.to_string());
        self.write(result, code, message);
    }

    fn write(&mut self, outcome: &str, code: Option<&str>, message: Option<String>) {
        if self.finished {
            return;
        }
        self.finished = true;
        let latency: Duration = self.started.elapsed();
        self.sink.record(json!({
            "event": "finished", "call_id": self.call_id, "time_ms": unix_ms(),
            "server": self.server, "candidates": self.candidates, "hops": self.hops, "rounds": self.rounds,
            "outcome": outcome, "error": code, "message": message,
            "latency_us": latency.as_micros() as u64,
        }));
    }
}

impl Drop for CallRecord {
    fn drop(&mut self) {
        self.write(
            "cancelled",
            Some("cancelled"),
            Some("the call ended before it finished (cancelled or shut down)".into()),
        );
    }
}
