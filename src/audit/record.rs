//! The records themselves, typed: built on the call path with a few string copies and
//! serialized only by the writer, off the async threads.

use serde::Serialize;
use serde_json::Value;

/// One record of the audit trail (one JSON line).
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum AuditRecord {
    /// A call was admitted or denied.
    Started {
        /// The call's id (unique within one harness).
        call_id: u64,
        /// Unix milliseconds.
        time_ms: u64,
        /// The caller's agent id.
        agent: Option<String>,
        /// The caller's auth context, as a keyed hash.
        auth: Option<String>,
        /// `tool`, `prompt` or `resource`.
        kind: &'static str,
        /// The name or uri asked for.
        name: String,
        /// The arguments, as the redaction setting keeps them.
        arguments: Value,
    },
    /// A call ended.
    Finished {
        /// The call's id.
        call_id: u64,
        /// Unix milliseconds.
        time_ms: u64,
        /// The last server tried.
        server: Option<String>,
        /// How many servers the call could have gone to.
        candidates: usize,
        /// Servers failed over from, with why.
        hops: Vec<Hop>,
        /// `input_required` rounds, with their input methods.
        rounds: Vec<Round>,
        /// `ok`, `tool_error`, `error` or `cancelled`.
        outcome: &'static str,
        /// The stable error code, if any.
        error: Option<&'static str>,
        /// The error, for people.
        message: Option<String>,
        /// How long the call took.
        latency_us: u64,
    },
}

/// A failover hop.
#[derive(Clone, Debug, Serialize)]
pub struct Hop {
    /// The server failed over from.
    pub server: String,
    /// Why.
    pub error: String,
}

/// One `input_required` round.
#[derive(Clone, Debug, Serialize)]
pub struct Round {
    /// The server that asked.
    pub server: String,
    /// The input methods it asked for.
    pub methods: Vec<String>,
}
