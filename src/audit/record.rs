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
    /// The call's id (unique within one harness, and numbered from a random start).
    pub(crate) call_id: u64,
    /// Unix milliseconds.
    pub(crate) time_ms: u64,
    /// The caller's agent id.
    pub(crate) agent: Option<&'a str>,
    /// The caller's auth context, as a keyed hash (hex digits only).
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
    /// Legacy servers' own questions during the call (elicitation, sampling).
    pub(crate) questions: &'a [Question],
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

/// Appends `s` as a JSON string. Most strings here (ids, names, hashes, our own words)
/// have nothing to escape and are copied as they are; the rest go through `serde_json`.
/// The same bytes either way: `serde_json` escapes only `"`, `\` and controls.
fn string(out: &mut Vec<u8>, s: &str) {
    // No early exit: the whole string is checked in one vectorized pass.
    let escape = s
        .bytes()
        .fold(false, |e, b| e | (b < 0x20) | (b == b'"') | (b == b'\\'));
    if escape {
        json(out, &s);
    } else {
        quoted(out, s);
    }
}

/// Appends `s` in quotes as it is: for strings with nothing to escape (our own words,
/// hex digests).
fn quoted(out: &mut Vec<u8>, s: &str) {
    debug_assert!(!s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\'));
    out.reserve(s.len() + 2);
    out.push(b'"');
    out.extend_from_slice(s.as_bytes());
    out.push(b'"');
}

/// `,"key":` as one constant: keys are our own identifiers, nothing in them to escape.
macro_rules! key {
    ($name:literal) => {
        concat!(",\"", $name, "\":").as_bytes()
    };
}

/// Appends a key (`key!`) and `v` through `serde_json`.
fn field(out: &mut Vec<u8>, key: &[u8], v: &impl Serialize) {
    out.extend_from_slice(key);
    json(out, v);
}

/// Appends a key (`key!`) and a string, or `null`.
fn str_field(out: &mut Vec<u8>, key: &[u8], v: Option<&str>) {
    out.extend_from_slice(key);
    match v {
        Some(s) => string(out, s),
        None => out.extend_from_slice(b"null"),
    }
}

/// Appends a key (`key!`) and a number.
fn u64_field(out: &mut Vec<u8>, key: &[u8], v: u64) {
    out.extend_from_slice(key);
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

/// The fields every record starts with, the object left open.
fn head(out: &mut Vec<u8>, event: &'static str, call_id: u64, time_ms: u64) {
    out.extend_from_slice(b"{\"event\":");
    quoted(out, event);
    u64_field(out, key!("call_id"), call_id);
    u64_field(out, key!("time_ms"), time_ms);
}

impl Record for Started<'_> {
    fn write_json(&self, out: &mut Vec<u8>) {
        head(out, self.event, self.call_id, self.time_ms);
        str_field(out, key!("agent"), self.agent);
        // A hex digest the trail made: nothing to escape.
        out.extend_from_slice(key!("auth"));
        match self.auth {
            Some(hash) => quoted(out, hash),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(key!("kind"));
        quoted(out, self.kind);
        str_field(out, key!("name"), Some(self.name));
        out.extend_from_slice(key!("arguments"));
        self.arguments.write_json(out);
        out.push(b'}');
    }
}

impl Record for Finished<'_> {
    fn write_json(&self, out: &mut Vec<u8>) {
        head(out, self.event, self.call_id, self.time_ms);
        str_field(out, key!("server"), self.server);
        u64_field(out, key!("candidates"), self.candidates as u64);
        if self.hops.is_empty() {
            out.extend_from_slice(b",\"hops\":[]");
        } else {
            field(out, key!("hops"), &self.hops);
        }
        if self.rounds.is_empty() {
            out.extend_from_slice(b",\"rounds\":[]");
        } else {
            field(out, key!("rounds"), &self.rounds);
        }
        if self.questions.is_empty() {
            out.extend_from_slice(b",\"questions\":[]");
        } else {
            field(out, key!("questions"), &self.questions);
        }
        out.extend_from_slice(key!("outcome"));
        quoted(out, self.outcome);
        str_field(out, key!("error"), self.error);
        str_field(out, key!("message"), self.message);
        u64_field(out, key!("latency_us"), self.latency_us);
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

/// A question a legacy server asked during a call (its own `elicitation/create` or
/// `sampling/createMessage`), and how it ended: `answered`, `declined` or `cancelled`
/// (an elicitation the person declined or cancelled), `denied` (a policy, a person or
/// the client's user refused it), `refused` (a grant revoked, the call ended, not declared),
/// `failed` (no handler, a handler's error), `withdrawn` (the server or the calls it
/// came during gave up waiting), `unanswered` (still open when the call ended) or
/// `past_round_cap`.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Question {
    /// The server that asked.
    pub(crate) server: String,
    /// What it asked.
    pub(crate) method: String,
    /// How it ended.
    pub(crate) outcome: &'static str,
}

/// A call's arguments as the redaction setting records them, written without a copy.
pub(crate) struct Redacted<'a> {
    pub(crate) config: &'a AuditConfig,
    pub(crate) args: &'a Value,
}

/// The most bytes of one text a record keeps (a name, an argument's string value);
/// the rest is said (`…(+N bytes)`). A record is as large as what a caller sends: an
/// embedder's call has no size bound, and each record is also copied to the logs.
pub(crate) const MAX_RECORDED_TEXT: usize = 4096;
/// The most argument names a record lists (`redaction = "keys"`), each cut at
/// [`MAX_RECORDED_KEY`] bytes; past it a last entry says how many more.
const MAX_RECORDED_KEYS: usize = 256;
const MAX_RECORDED_KEY: usize = 256;
/// The most bytes of arguments a record keeps whole (`redaction = "full"`); larger
/// ones are recorded as `{"truncated": true, "bytes": N}`.
const MAX_RECORDED_ARGUMENTS: usize = 256 << 10;

/// `text`, or its first `max` bytes or fewer (on a character's boundary) and how many
/// more there were.
pub(crate) fn cut(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{}…(+{} bytes)", &text[..end], text.len() - end))
}

impl Redacted<'_> {
    /// Appends the arguments as recorded; the default (their keys) without `serde_json`.
    fn write_json(&self, out: &mut Vec<u8>) {
        match (self.config.redaction, self.args) {
            (Redaction::Keys, Value::Object(map)) => {
                out.push(b'[');
                for (i, k) in listed_keys(map).enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    string(out, &k);
                }
                out.push(b']');
            }
            _ => json(out, self),
        }
    }
}

/// The argument names a record lists: at most [`MAX_RECORDED_KEYS`], each cut, then
/// how many more there were.
fn listed_keys(
    map: &serde_json::Map<String, Value>,
) -> impl Iterator<Item = std::borrow::Cow<'_, str>> {
    let more = map.len().saturating_sub(MAX_RECORDED_KEYS);
    map.keys()
        .take(MAX_RECORDED_KEYS)
        .map(|k| cut(k, MAX_RECORDED_KEY))
        .chain((more > 0).then(|| format!("…(+{more} more)").into()))
}

/// The arguments as `redaction = "full"` records them: redacted, its texts cut, and
/// no larger than [`MAX_RECORDED_ARGUMENTS`] whole.
fn full_arguments(config: &AuditConfig, args: &Value) -> Value {
    /// Counts what is written to it: the size, without the copy.
    struct Counted(usize);
    impl std::io::Write for Counted {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let redacted = config.redact(args);
    let mut counted = Counted(0);
    let _ = serde_json::to_writer(&mut counted, &redacted);
    let bytes = counted.0;
    if bytes > MAX_RECORDED_ARGUMENTS {
        return serde_json::json!({"truncated": true, "bytes": bytes});
    }
    redacted
}

impl Serialize for Redacted<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match (self.config.redaction, self.args) {
            (Redaction::Keys, Value::Object(map)) => {
                let keys: Vec<_> = listed_keys(map).collect();
                let mut seq = s.serialize_seq(Some(keys.len()))?;
                for k in keys {
                    seq.serialize_element(&k)?;
                }
                seq.end()
            }
            (Redaction::Full, _) => full_arguments(self.config, self.args).serialize(s),
            _ => s.serialize_none(),
        }
    }
}

/// Whether a key name is one whose value is always hidden.
pub(crate) fn is_secret(config: &AuditConfig, key: &str) -> bool {
    let folded = fold(key);
    super::BUILTIN_REDACT_KEYS
        .iter()
        .any(|s| folded.contains(s))
        || config
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

    impl Record for Redacted<'_> {
        fn write_json(&self, out: &mut Vec<u8>) {
            Redacted::write_json(self, out);
        }
    }

    // A record is bounded whatever a caller sends: texts cut, names counted past a
    // number, whole arguments past a size replaced, the same bytes either way.
    #[test]
    fn a_records_arguments_are_bounded() {
        assert_eq!(cut("abc", 3), "abc");
        assert_eq!(cut("aé", 2), "a…(+2 bytes)");
        let keys = AuditConfig::default();
        let full = AuditConfig {
            redaction: Redaction::Full,
            ..AuditConfig::default()
        };
        let mut many = serde_json::Map::new();
        for k in 0..300 {
            many.insert(format!("k{k:03}"), json!(1));
        }
        many.insert("z".repeat(1000), json!("x".repeat(10_000)));
        let many = Value::Object(many);
        let listed: Value = serde_json::from_slice(&written(&Redacted {
            config: &keys,
            args: &many,
        }))
        .expect("json");
        let listed = listed.as_array().expect("names");
        assert_eq!(listed.len(), MAX_RECORDED_KEYS + 1);
        assert_eq!(listed[MAX_RECORDED_KEYS], "…(+45 more)");
        let long = json!({"note": "x".repeat(10_000), "long": "z".repeat(1000)});
        let recorded: Value = serde_json::from_slice(&written(&Redacted {
            config: &full,
            args: &long,
        }))
        .expect("json");
        let note = recorded["note"].as_str().expect("cut");
        assert!(note.starts_with(&"x".repeat(MAX_RECORDED_TEXT)), "{note}");
        assert!(note.ends_with("…(+5904 bytes)"), "{note}");
        let huge = Value::Array((0..100).map(|_| json!("y".repeat(4000))).collect());
        let recorded: Value = serde_json::from_slice(&written(&Redacted {
            config: &full,
            args: &huge,
        }))
        .expect("json");
        assert_eq!(recorded["truncated"], true, "{recorded}");
        assert!(recorded["bytes"].as_u64().is_some_and(|b| b > 400_000));
        for (config, args) in [(&keys, &many), (&full, &long), (&full, &huge)] {
            let r = Redacted { config, args };
            assert_eq!(written(&r), derived(&r));
        }
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
        let args = json!({"text": "hi \"there\"\n", "token": "s3cret", "n": [1, 2.5, null], "k\"e\\y\u{1}": 1});
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
        let questions = [Question {
            server: "s".into(),
            method: "sampling/createMessage".into(),
            outcome: "answered",
        }];
        for (server, hops, rounds, questions, error, message) in [
            (
                Some("s"),
                &hops[..0],
                &rounds[..0],
                &questions[..0],
                None,
                None,
            ),
            (
                None,
                &hops[..],
                &rounds[..],
                &questions[..],
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
                questions,
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
