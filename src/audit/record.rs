//! The records themselves: views that borrow what the call already holds, serialized
//! straight into the sink's buffer. A record costs the call path no allocation of its
//! own, and nothing crosses threads but whole buffers.

use serde::Serialize;
use serde::ser::SerializeSeq;
use serde_json::Value;

use super::{AuditConfig, Redaction, fold};

/// A call was admitted or denied.
#[derive(Serialize)]
pub(crate) struct Started<'a> {
    pub(crate) event: &'static str,
    /// The call's id (unique within one harness).
    pub(crate) call_id: u64,
    /// Unix milliseconds.
    pub(crate) time_ms: u64,
    /// The caller's agent id.
    pub(crate) agent: Option<&'a str>,
    /// The caller's auth context, as a keyed hash.
    pub(crate) auth: Option<&'a str>,
    /// `tool`, `prompt` or `resource`.
    pub(crate) kind: &'static str,
    /// The name or uri asked for.
    pub(crate) name: &'a str,
    /// The arguments, as the redaction setting keeps them.
    pub(crate) arguments: Redacted<'a>,
}

/// A call ended.
#[derive(Serialize)]
pub(crate) struct Finished<'a> {
    pub(crate) event: &'static str,
    /// The call's id.
    pub(crate) call_id: u64,
    /// Unix milliseconds.
    pub(crate) time_ms: u64,
    /// The last server tried.
    pub(crate) server: Option<&'a str>,
    /// How many servers the call could have gone to.
    pub(crate) candidates: usize,
    /// Servers failed over from, with why.
    pub(crate) hops: &'a [Hop],
    /// `input_required` rounds, with their input methods.
    pub(crate) rounds: &'a [Round],
    /// `ok`, `tool_error`, `error` or `cancelled`.
    pub(crate) outcome: &'static str,
    /// The stable error code, if any.
    pub(crate) error: Option<&'static str>,
    /// The error, for people.
    pub(crate) message: Option<&'a str>,
    /// How long the call took.
    pub(crate) latency_us: u64,
}

/// A failover hop.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Hop {
    /// The server failed over from.
    pub(crate) server: String,
    /// Why.
    pub(crate) error: String,
}

/// One `input_required` round.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Round {
    /// The server that asked.
    pub(crate) server: String,
    /// The input methods it asked for.
    pub(crate) methods: Vec<String>,
}

/// A call's arguments as the redaction setting records them, written without a copy.
pub(crate) struct Redacted<'a> {
    pub(crate) config: &'a AuditConfig,
    pub(crate) args: &'a Value,
}

impl Serialize for Redacted<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match (self.config.redaction, self.args) {
            (Redaction::Keys, Value::Object(map)) => {
                let mut seq = s.serialize_seq(Some(map.len()))?;
                for k in map.keys() {
                    seq.serialize_element(k)?;
                }
                seq.end()
            }
            (Redaction::Full, _) => self.config.redact(self.args).serialize(s),
            _ => s.serialize_none(),
        }
    }
}

/// Whether a key name is one whose value is always hidden.
pub(crate) fn is_secret(config: &AuditConfig, key: &str) -> bool {
    let folded = fold(key);
    config
        .redact_keys
        .iter()
        .any(|s| !s.is_empty() && folded.contains(&fold(s)))
}
