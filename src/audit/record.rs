//! The records themselves: views that borrow what the call already holds, serialized
//! straight into the sink's buffer. A record costs the call path no allocation of its
//! own, and nothing crosses threads but whole buffers. A record's keys are written as
//! the constant bytes they are and only its values go through `serde_json`: escaping
//! each key was most of a record's cost (every call writes two).

use serde::Serialize;
use serde::ser::SerializeSeq;
use serde_json::Value;

use super::{AuditConfig, Redaction, fold};

/// A call was admitted or denied.
#[cfg_attr(test, derive(Serialize))]
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
#[cfg_attr(test, derive(Serialize))]
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

/// What the audit trail can write: one JSON object.
pub(crate) trait Record {
    /// Appends the record as one JSON object (no newline).
    fn write_json(&self, out: &mut Vec<u8>);
}

/// Appends `v` as JSON. Serializing our own values into a `Vec` cannot fail: no I/O,
/// string keys.
fn json(out: &mut Vec<u8>, v: &impl Serialize) {
    let _ = serde_json::to_writer(&mut *out, v);
}

/// Appends `,"key":` and `v`. Keys are our own identifiers: nothing in them to escape.
fn field(out: &mut Vec<u8>, key: &str, v: &impl Serialize) {
    debug_assert!(!key.contains(['"', '\\']) && !key.contains(char::is_control));
    out.extend_from_slice(b",\"");
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\":");
    json(out, v);
}

/// The fields every record starts with, the object left open.
fn head(out: &mut Vec<u8>, event: &str, call_id: u64, time_ms: u64) {
    out.extend_from_slice(b"{\"event\":");
    json(out, &event);
    field(out, "call_id", &call_id);
    field(out, "time_ms", &time_ms);
}

impl Record for Started<'_> {
    fn write_json(&self, out: &mut Vec<u8>) {
        head(out, self.event, self.call_id, self.time_ms);
        field(out, "agent", &self.agent);
        field(out, "auth", &self.auth);
        field(out, "kind", &self.kind);
        field(out, "name", &self.name);
        field(out, "arguments", &self.arguments);
        out.push(b'}');
    }
}

impl Record for Finished<'_> {
    fn write_json(&self, out: &mut Vec<u8>) {
        head(out, self.event, self.call_id, self.time_ms);
        field(out, "server", &self.server);
        field(out, "candidates", &self.candidates);
        field(out, "hops", &self.hops);
        field(out, "rounds", &self.rounds);
        field(out, "outcome", &self.outcome);
        field(out, "error", &self.error);
        field(out, "message", &self.message);
        field(out, "latency_us", &self.latency_us);
        out.push(b'}');
    }
}

/// Any JSON value is a record as it is (the sink's tests write such records).
#[cfg(test)]
impl Record for Value {
    fn write_json(&self, out: &mut Vec<u8>) {
        json(out, self);
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The bytes `serde_json` writes for the record's derived form: the oracle.
    fn derived(record: &impl Serialize) -> Vec<u8> {
        serde_json::to_vec(record).expect("serializes")
    }

    /// The bytes the trail writes for it.
    fn written(record: &impl Record) -> Vec<u8> {
        let mut out = Vec::new();
        record.write_json(&mut out);
        out
    }

    #[test]
    fn records_write_the_bytes_serde_writes_for_them() {
        let config = AuditConfig::default();
        let full = AuditConfig {
            redaction: Redaction::Full,
            ..AuditConfig::default()
        };
        let none = AuditConfig {
            redaction: Redaction::None,
            ..AuditConfig::default()
        };
        let args = json!({"text": "hi \"there\"\n", "token": "s3cret", "n": [1, 2.5, null]});
        let not_an_object = json!(["a", 1]);
        for (agent, auth, name, config, args) in [
            (Some("planner"), Some("0123abcd"), "s__echo", &config, &args),
            (None, None, "we\"ird\\na\u{1}me é ✓", &full, &args),
            (Some("\u{7f}\u{2028}"), None, "", &config, &args),
            (Some("a"), None, "t", &none, &args),
            (Some("a"), None, "t", &config, &not_an_object),
        ] {
            let started = Started {
                event: "started",
                call_id: u64::MAX,
                time_ms: 1_733_000_000_000,
                agent,
                auth,
                kind: "tool",
                name,
                arguments: Redacted { config, args },
            };
            assert_eq!(written(&started), derived(&started), "{name:?}");
        }
        let hops = [Hop {
            server: "a\"b".into(),
            error: "crashed: \u{0}".into(),
        }];
        let rounds = [Round {
            server: "s".into(),
            methods: vec!["elicitation/create".into()],
        }];
        for (server, hops, rounds, error, message) in [
            (Some("s"), &hops[..0], &rounds[..0], None, None),
            (
                None,
                &hops[..],
                &rounds[..],
                Some("timeout"),
                Some("line\nbreak \"q\""),
            ),
        ] {
            let finished = Finished {
                event: "finished",
                call_id: 7,
                time_ms: 0,
                server,
                candidates: 3,
                hops,
                rounds,
                outcome: "error",
                error,
                message,
                latency_us: 123_456,
            };
            assert_eq!(written(&finished), derived(&finished));
        }
        let v = json!({"i": 3});
        assert_eq!(written(&v), derived(&v));
    }
}
