//! JSON-RPC 2.0 messages: parsing one line or body into a [`Message`], and writing one.
//!
//! Parsing is strict about shape (a message with both `result` and `error` is
//! malformed, a batch array is rejected) and lenient about what it passes along
//! (`params` and `result` stay raw [`Value`]s).

use serde::de::IgnoredAny;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use super::error::{ProtocolError, RpcError};
use super::meta::{Stamp, StampedParams};

/// A JSON-RPC request id: a string or an integer, never `null`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RequestId {
    /// An integer id; the harness numbers its own requests this way.
    Number(i64),
    /// A string id, as some servers use for their own requests.
    String(String),
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestId::Number(n) => write!(f, "{n}"),
            RequestId::String(s) => write!(f, "{s:?}"),
        }
    }
}

/// A request: expects exactly one response with the same id.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// Correlates the response.
    pub id: RequestId,
    /// The method, for example `tools/call`.
    pub method: String,
    /// Parameters as sent; `None` when the message had none.
    pub params: Option<Value>,
}

/// A request as it is written: borrowed from whoever holds its parts, so that sending
/// one copies nothing (a call keeps its params for its next round, a connection its id).
#[derive(Clone, Copy, Debug)]
pub struct RequestRef<'a> {
    /// Correlates the response.
    pub id: &'a RequestId,
    /// The method.
    pub method: &'a str,
    /// Parameters; `None` for none.
    pub params: Option<&'a Value>,
}

impl<'a> From<&'a Request> for RequestRef<'a> {
    fn from(r: &'a Request) -> RequestRef<'a> {
        RequestRef {
            id: &r.id,
            method: &r.method,
            params: r.params.as_ref(),
        }
    }
}

/// A notification: no id, no response.
#[derive(Clone, Debug, PartialEq)]
pub struct Notification {
    /// The method, for example `notifications/tools/list_changed`.
    pub method: String,
    /// Parameters as sent.
    pub params: Option<Value>,
}

/// A response: the result of a request, or its error.
#[derive(Clone, Debug, PartialEq)]
pub struct Response {
    /// The id of the request this answers; `None` only for an error about a request the
    /// peer could not parse.
    pub id: Option<RequestId>,
    /// `Ok(result)` or `Err(error)`.
    pub outcome: Result<Value, RpcError>,
}

/// Any one JSON-RPC message.
#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    /// See [`Request`].
    Request(Request),
    /// See [`Notification`].
    Notification(Notification),
    /// See [`Response`].
    Response(Response),
}

/// The wire shape before it is checked: every field optional, `null` kept apart from absent.
#[derive(Deserialize)]
struct RawMessage<'a> {
    #[serde(borrow)]
    jsonrpc: Option<Version<'a>>,
    #[serde(default, deserialize_with = "present")]
    id: Option<Value>,
    method: Option<String>,
    #[serde(default, deserialize_with = "present")]
    params: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    result: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    error: Option<Value>,
}

/// `jsonrpc`, borrowed from the line unless it has escapes: no allocation for `"2.0"`
/// (serde borrows a `Cow` only when it is the field's whole type, not inside `Option`).
#[derive(Deserialize)]
struct Version<'a>(#[serde(borrow)] std::borrow::Cow<'a, str>);

/// Maps a present field (even `null`) to `Some`, so that absence stays distinguishable.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// The routing fields of a line, its bodies skipped: enough to learn whether it carries
/// a result and for which id. The fields are [`RawMessage`]'s, so that a
/// duplicate is refused alike; `jsonrpc` is borrowed (one with escapes fails here and
/// is left to the full parse).
#[derive(Deserialize)]
struct PeekedMessage<'a> {
    #[serde(borrow)]
    jsonrpc: Option<&'a str>,
    #[serde(default, deserialize_with = "present")]
    id: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    result: Option<IgnoredAny>,
    // Never used: named so that a duplicate is refused.
    #[serde(rename = "method")]
    _method: Option<IgnoredAny>,
    #[serde(rename = "params", default, deserialize_with = "present")]
    _params: Option<IgnoredAny>,
    #[serde(rename = "error", default, deserialize_with = "present")]
    _error: Option<IgnoredAny>,
}

/// A message's id and kind, all else skipped unread: what [`Message::peek_head`] reads.
#[derive(Deserialize)]
struct HeadOnly {
    #[serde(default)]
    id: PlainId,
    #[serde(default)]
    method: Option<IgnoredAny>,
    // `null` is a result too, as the full parse has it.
    #[serde(default, deserialize_with = "present")]
    result: Option<IgnoredAny>,
    #[serde(default, deserialize_with = "present")]
    error: Option<IgnoredAny>,
}

impl HeadOnly {
    fn read(bytes: &[u8]) -> Option<HeadOnly> {
        // A struct's fields may come as an array to serde: `[7, null, {}]` is no reply.
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
            return None;
        }
        serde_json::from_slice::<HeadOnly>(bytes).ok()
    }
}

/// An id that is an integer or a short string; anything else (an array of millions of
/// numbers, a megabyte of text) is skipped, not built.
#[derive(Default)]
struct PlainId(Option<RequestId>);

/// The longest string id [`PlainId`] keeps, and a message may carry: a peer's id is
/// echoed in the answer, so a longer one would be held, and sent, as many times as
/// the peer sends it.
const PLAIN_ID_MAX: usize = 256;

impl<'de> Deserialize<'de> for PlainId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<PlainId, D::Error> {
        struct Plain;
        impl<'de> serde::de::Visitor<'de> for Plain {
            type Value = PlainId;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON-RPC id")
            }
            fn visit_i64<E>(self, v: i64) -> Result<PlainId, E> {
                Ok(PlainId(Some(RequestId::Number(v))))
            }
            fn visit_u64<E>(self, v: u64) -> Result<PlainId, E> {
                Ok(PlainId(i64::try_from(v).ok().map(RequestId::Number)))
            }
            fn visit_f64<E>(self, _: f64) -> Result<PlainId, E> {
                Ok(PlainId(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<PlainId, E> {
                Ok(PlainId(None))
            }
            fn visit_unit<E>(self) -> Result<PlainId, E> {
                Ok(PlainId(None))
            }
            fn visit_str<E>(self, v: &str) -> Result<PlainId, E> {
                Ok(PlainId(
                    (v.len() <= PLAIN_ID_MAX).then(|| RequestId::String(v.to_string())),
                ))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<PlainId, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(PlainId(None))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<PlainId, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(PlainId(None))
            }
        }
        d.deserialize_any(Plain)
    }
}

/// What [`Message::peek`] learned of a line.
#[derive(Debug, PartialEq)]
pub enum Peeked {
    /// A line with a `result` for this id: it parses as that response or not at all.
    Result(RequestId),
    /// Anything else, bad lines included: [`Message::parse`] decides.
    Other,
}

fn parse_id(id: Value) -> Result<Option<RequestId>, ProtocolError> {
    match id {
        Value::Null => Ok(None),
        Value::Number(n) => n
            .as_i64()
            .map(|n| Some(RequestId::Number(n)))
            .ok_or_else(|| ProtocolError::Malformed(format!("id {n} is not an integer"))),
        Value::String(s) if s.len() > PLAIN_ID_MAX => Err(ProtocolError::Malformed(format!(
            "a string id of {} bytes (at most {PLAIN_ID_MAX})",
            s.len()
        ))),
        Value::String(s) => Ok(Some(RequestId::String(s))),
        // Named, not echoed: the peer's value may be megabytes, and this text is sent
        // back and logged.
        other => Err(ProtocolError::Malformed(format!(
            "id must be a string or an integer, got {}",
            match other {
                Value::Bool(_) => "a boolean",
                Value::Number(_) => "a number",
                Value::Array(_) => "an array",
                _ => "an object",
            }
        ))),
    }
}

/// How the responses of this crate's serializer and of rmcp's begin: a line that starts
/// with it, then an integer id and `,"result":`, is a successful response to that id or
/// fails the full parse (a duplicate key, `method` or `error` beside `result`, bad
/// JSON), so it is routed without being scanned, which was most of a reader's work.
const RESULT_PREFIX: &[u8] = br#"{"jsonrpc":"2.0","id":"#;

/// The id of a line that starts as [`RESULT_PREFIX`] says, if it does.
fn peek_prefix(bytes: &[u8]) -> Option<RequestId> {
    let rest = bytes.strip_prefix(RESULT_PREFIX)?;
    let (negative, rest) = match rest.strip_prefix(b"-") {
        Some(rest) => (true, rest),
        None => (false, rest),
    };
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    // At most 18 digits cannot overflow an i64; a leading zero is not JSON.
    if digits == 0 || digits > 18 || (digits > 1 && rest[0] == b'0') {
        return None;
    }
    rest[digits..].strip_prefix(br#","result":"#)?;
    let n = rest[..digits]
        .iter()
        .fold(0i64, |n, d| n * 10 + i64::from(d - b'0'));
    // `-0` is a float to serde_json, not an id: left to the scan, which refuses it.
    if negative && n == 0 {
        return None;
    }
    Some(RequestId::Number(if negative { -n } else { n }))
}

impl Message {
    /// Parses one message from one line (stdio) or one body / SSE event (HTTP).
    pub fn parse(bytes: &[u8]) -> Result<Message, ProtocolError> {
        let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
        if first == Some(&b'[') {
            // A batch if it is JSON at all (checked without building it).
            let json = std::str::from_utf8(bytes)
                .is_ok_and(|t| serde_json::from_str::<serde::de::IgnoredAny>(t).is_ok());
            return Err(if json {
                ProtocolError::Batch
            } else {
                ProtocolError::InvalidJson("a [ that is not JSON".into())
            });
        }
        // Checked once here: from bytes, serde_json checks every string on its own
        // (1.4k instructions of a tool result's parse), from a `str` never again.
        let text = std::str::from_utf8(bytes)
            .map_err(|e| ProtocolError::InvalidJson(format!("not UTF-8: {e}")))?;
        // JSON of the wrong shape (a number for `method`, a string, `null`) is not a
        // JSON-RPC message; only what is not JSON is a parse error.
        // serde quotes the offending value (a whole line that is one string): the
        // peer's, so cut short.
        let raw: RawMessage = serde_json::from_str(text).map_err(|e| {
            let said = crate::util::text::one_line(&e.to_string(), 200);
            match e.classify() {
                serde_json::error::Category::Data => ProtocolError::Malformed(said),
                _ => ProtocolError::InvalidJson(said),
            }
        })?;
        if raw.jsonrpc.as_ref().map(|v| &*v.0) != Some("2.0") {
            return Err(ProtocolError::Malformed("jsonrpc must be \"2.0\"".into()));
        }
        let params = raw.params;
        match (raw.method, raw.id, raw.result, raw.error) {
            (Some(_), _, Some(_), _) | (Some(_), _, _, Some(_)) => Err(ProtocolError::Malformed(
                "a message with a method cannot carry result or error".into(),
            )),
            (Some(method), Some(id), None, None) => {
                let id = parse_id(id)?.ok_or_else(|| {
                    ProtocolError::Malformed("a request id cannot be null".into())
                })?;
                Ok(Message::Request(Request { id, method, params }))
            }
            (Some(method), None, None, None) => {
                Ok(Message::Notification(Notification { method, params }))
            }
            (None, _, Some(_), Some(_)) => Err(ProtocolError::Malformed(
                "a response cannot carry both result and error".into(),
            )),
            (None, Some(id), Some(result), None) => {
                let id = parse_id(id)?.ok_or_else(|| {
                    ProtocolError::Malformed("a result response needs an id".into())
                })?;
                Ok(Message::Response(Response {
                    id: Some(id),
                    outcome: Ok(result),
                }))
            }
            (None, id, None, Some(error)) => {
                let id = match id {
                    Some(id) => parse_id(id)?,
                    None => None,
                };
                let error: RpcError = serde_json::from_value(error).map_err(|e| {
                    // serde quotes the offending value; the peer's, so cut short.
                    let e = crate::util::text::one_line(&e.to_string(), 200);
                    ProtocolError::Malformed(format!("error object: {e}"))
                })?;
                Ok(Message::Response(Response {
                    id,
                    outcome: Err(error),
                }))
            }
            (None, None, Some(_), None) => Err(ProtocolError::Malformed(
                "a result response needs an id".into(),
            )),
            (None, _, None, None) => Err(ProtocolError::Malformed(
                "neither a method nor a result or error".into(),
            )),
        }
    }

    /// Learns from its routing fields alone (`jsonrpc`, `id`, whether a `result` is
    /// present) whether a line answers a request with a result, and which; the bodies
    /// are skipped, not built. A reader routes by it and leaves the full
    /// [`Message::parse`] to the thread that uses the result (a result built on one
    /// thread and freed on another costs the allocator's locks). A line it calls
    /// [`Peeked::Result`] parses as that response or fails to parse: for its bodies
    /// (nesting, numbers and strings the skip does not check), for `method` or `error`
    /// beside `result`, or, on a line that begins as responses do ([`RESULT_PREFIX`]),
    /// for what follows (a key twice, bad JSON); never as another message nor for
    /// another id.
    pub fn peek(bytes: &[u8]) -> Peeked {
        if let Some(id) = peek_prefix(bytes) {
            return Peeked::Result(id);
        }
        // A batch would be read as a struct's fields in order; the full parse refuses it.
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
            return Peeked::Other;
        }
        let Ok(raw) = serde_json::from_slice::<PeekedMessage<'_>>(bytes) else {
            return Peeked::Other;
        };
        // A `method` or an `error` beside `result` goes to the id too, to fail its request
        // at once, as it does on the prefix's path: one behaviour whatever the key order.
        match (raw.jsonrpc, raw.id, raw.result) {
            (Some("2.0"), Some(id), Some(_)) => match parse_id(id) {
                Ok(Some(id)) => Peeked::Result(id),
                _ => Peeked::Other,
            },
            _ => Peeked::Other,
        }
    }

    /// A message's id (an integer or a string of at most 256 bytes) and whether it is a
    /// reply (a result or an error, no method), read without building anything else: to
    /// answer a message refused before it is parsed (too costly to parse now).
    pub fn peek_head(bytes: &[u8]) -> Option<(Option<RequestId>, bool)> {
        let head = HeadOnly::read(bytes)?;
        let reply = head.method.is_none() && (head.result.is_some() || head.error.is_some());
        Some((head.id.0, reply))
    }

    /// The id of a message that does not parse, read as [`Message::peek_head`] reads,
    /// and whether it names a method: a request is answered under its id, anything
    /// else with one is taken for a broken reply to the request of that id (the two
    /// sides' requests have ids of their own: a broken reply is never answered).
    pub fn peek_id(bytes: &[u8]) -> Option<(RequestId, bool)> {
        let head = HeadOnly::read(bytes)?;
        let request = head.method.is_some();
        head.id.0.map(|id| (id, request))
    }

    /// The id of a message of which only the start is at hand (the rest was too long to
    /// keep), and whether it is a reply: each found when it comes before what was cut,
    /// so that the refusal can name the request, or fail the question it answers.
    pub fn peek_start(bytes: &[u8]) -> (Option<RequestId>, Option<bool>) {
        #[derive(Default)]
        struct Found {
            id: Option<RequestId>,
            reply: Option<bool>,
        }
        struct Find<'a>(&'a mut Found);
        impl<'de> serde::de::Visitor<'de> for Find<'_> {
            type Value = ();
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON-RPC message")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    let mut read = true;
                    match &*key {
                        "id" => self.0.id = map.next_value::<PlainId>()?.0,
                        // A null method is none, as `parse` takes it.
                        "method" => {
                            if map.next_value::<Option<IgnoredAny>>()?.is_some() {
                                self.0.reply = Some(false);
                            }
                        }
                        "result" | "error" => {
                            self.0.reply = self.0.reply.or(Some(true));
                            read = false;
                        }
                        _ => read = false,
                    }
                    if self.0.id.is_some() && self.0.reply.is_some() {
                        // Both found: what follows is not read (it ends cut short).
                        return Ok(());
                    }
                    if !read {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(())
            }
        }
        let mut found = Found::default();
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let _ = serde::Deserializer::deserialize_map(&mut de, Find(&mut found));
        (found.id, found.reply)
    }

    /// Appends this message as one JSON line (with the trailing `\n`) to `out`.
    pub fn write_line(&self, out: &mut Vec<u8>) {
        self.write_json(out);
        out.push(b'\n');
    }

    /// Appends this message as JSON (no newline) to `out`.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        // Serializing our own types into a Vec cannot fail: keys are strings, no I/O.
        let _ = serde_json::to_writer(out, &WireOut::Other(self));
    }

    /// Appends `request` as one JSON line without wrapping it in a [`Message`] (the hot
    /// path: no clone of its params).
    pub fn write_request_line(request: &Request, out: &mut Vec<u8>) {
        // Serializing our own types into a Vec cannot fail: keys are strings, no I/O.
        let _ = serde_json::to_writer(&mut *out, &WireOut::Request(request.into()));
        out.push(b'\n');
    }

    /// `request` as a JSON body.
    pub fn request_json(request: &Request) -> Vec<u8> {
        Self::stamped_json(request.into(), None)
    }

    /// Appends `request` as one JSON line, with `stamp`'s envelope merged into
    /// `params._meta` as it is written.
    pub fn write_stamped_line(
        request: RequestRef<'_>,
        stamp: Option<Stamp<'_>>,
        out: &mut Vec<u8>,
    ) {
        write_stamped(request, stamp, out);
        out.push(b'\n');
    }

    /// `request` as a JSON body, stamped as [`Message::write_stamped_line`] does.
    pub fn stamped_json(request: RequestRef<'_>, stamp: Option<Stamp<'_>>) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        write_stamped(request, stamp, &mut out);
        out
    }

    /// The message as a JSON value (for tests and records).
    pub fn to_value(&self) -> Value {
        serde_json::to_value(WireOut::Other(self)).unwrap_or(Value::Null)
    }
}

/// Appends `request` as one JSON object in the wire shape, `stamp`'s envelope merged
/// into `params._meta`. The fixed keys and an integer id are written as the bytes they
/// are, the rest through `serde_json` (every request of every call is written here;
/// serializing our own values into a `Vec` cannot fail: string keys, no I/O).
fn write_stamped(request: RequestRef<'_>, stamp: Option<Stamp<'_>>, out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    match request.id {
        RequestId::Number(n) => out.extend_from_slice(itoa::Buffer::new().format(*n).as_bytes()),
        id => {
            let _ = serde_json::to_writer(&mut *out, id);
        }
    }
    out.extend_from_slice(b",\"method\":");
    let _ = serde_json::to_writer(&mut *out, request.method);
    match (request.params, stamp) {
        (None, None) => {}
        (Some(params), None) => {
            out.extend_from_slice(b",\"params\":");
            let _ = serde_json::to_writer(&mut *out, params);
        }
        (params, Some(stamp)) => {
            let object = params.and_then(Value::as_object);
            // (A match guard would say this in one arm, but `if let` guards need a
            // newer compiler than the crate's `rust-version`.)
            match object.and_then(|p| stamp.text(p.get("_meta").and_then(Value::as_object))) {
                Some(meta) => {
                    // The common request: its own params, then the envelope's text as it is.
                    out.extend_from_slice(b",\"params\":{");
                    for (k, v) in object.into_iter().flatten().filter(|(k, _)| *k != "_meta") {
                        let _ = serde_json::to_writer(&mut *out, k);
                        out.push(b':');
                        let _ = serde_json::to_writer(&mut *out, v);
                        out.push(b',');
                    }
                    out.extend_from_slice(b"\"_meta\":");
                    meta.write(out);
                    out.push(b'}');
                }
                None => {
                    out.extend_from_slice(b",\"params\":");
                    let _ = serde_json::to_writer(&mut *out, &StampedParams { params, stamp });
                }
            }
        }
    }
    out.push(b'}');
}

/// Serializes a message in the wire shape, borrowing from it.
enum WireOut<'a> {
    Request(RequestRef<'a>),
    Other(&'a Message),
}

impl Serialize for WireOut<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("jsonrpc", "2.0")?;
        let message = match self {
            WireOut::Request(r) => {
                map.serialize_entry("id", r.id)?;
                map.serialize_entry("method", r.method)?;
                if let Some(p) = r.params {
                    map.serialize_entry("params", p)?;
                }
                return map.end();
            }
            WireOut::Other(m) => m,
        };
        match message {
            Message::Request(r) => {
                map.serialize_entry("id", &r.id)?;
                map.serialize_entry("method", &r.method)?;
                if let Some(p) = &r.params {
                    map.serialize_entry("params", p)?;
                }
            }
            Message::Notification(n) => {
                map.serialize_entry("method", &n.method)?;
                if let Some(p) = &n.params {
                    map.serialize_entry("params", p)?;
                }
            }
            Message::Response(r) => {
                // A response to an unparseable request carries `"id": null`.
                map.serialize_entry("id", &r.id)?;
                match &r.outcome {
                    Ok(v) => map.serialize_entry("result", v)?,
                    Err(e) => map.serialize_entry("error", e)?,
                }
            }
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_and_kind_of_a_message_cut_short_are_found_when_they_come_before_the_cut() {
        let start = |s: &str| Message::peek_start(s.as_bytes());
        assert_eq!(
            start(r#"{"id":7,"jsonrpc":"2.0","method":"tools/call","params":{"text":"xxxx"#),
            (Some(RequestId::Number(7)), Some(false))
        );
        assert_eq!(
            start(r#"{"jsonrpc":"2.0","id":"a\"b","result":{"content":"xx"#),
            (Some(RequestId::String("a\"b".into())), Some(true))
        );
        assert_eq!(start(r#"{"result":{"text":"xxxx"#), (None, Some(true)));
        // A null method is none, as the full parse takes it: a reply, not a request.
        assert_eq!(
            start(r#"{"id":3,"method":null,"result":{"x":"xxxx"#),
            (Some(RequestId::Number(3)), Some(true))
        );
        assert_eq!(start(r#"{"params":{"text":"xxxx"#), (None, None));
        assert_eq!(start(r#"{"id":[1,2,3"#), (None, None));
        assert_eq!(start("not json"), (None, None));
    }

    // Only what names a method is a request to answer: a broken reply (no method, a
    // misspelled result) shares its id with nothing of ours to answer.
    #[test]
    fn only_a_message_that_names_a_method_is_a_request_to_answer() {
        let id = |s: &str| Message::peek_id(s.as_bytes());
        let n = RequestId::Number;
        assert_eq!(id(r#"{"id":5,"method":"roots/list"}"#), Some((n(5), true)));
        assert_eq!(id(r#"{"jsonrpc":"2.0","id":3}"#), Some((n(3), false)));
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","id":3,"reslt":{}}"#),
            Some((n(3), false))
        );
        assert_eq!(id(r#"{"id":3,"method":null}"#), Some((n(3), false)));
        assert_eq!(id(r#"{"method":"x"}"#), None);
        assert_eq!(id(r#"[{"id":3,"method":"x"}]"#), None);
    }

    #[test]
    fn a_head_is_read_without_building_an_odd_id_or_the_bodies() {
        let id = |s: &str| Message::peek_head(s.as_bytes());
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","id":5,"result":{"x":[1,2,3]}}"#),
            Some((Some(RequestId::Number(5)), true))
        );
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","id":"a","error":{"code":1,"message":"m"}}"#),
            Some((Some(RequestId::String("a".into())), true))
        );
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","id":7,"result":null}"#),
            Some((Some(RequestId::Number(7)), true)),
            "a null result is a result"
        );
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","id":"a","method":"m","params":{"big":[0,0,0]}}"#),
            Some((Some(RequestId::String("a".into())), false))
        );
        let huge = format!(
            r#"{{"jsonrpc":"2.0","id":[{}0],"method":"m"}}"#,
            "0,".repeat(100_000)
        );
        assert_eq!(id(&huge), Some((None, false)), "an array id is skipped");
        let long = format!(r#"{{"id":"{}","method":"m"}}"#, "x".repeat(300));
        assert_eq!(id(&long), Some((None, false)), "a long id is not kept");
        assert_eq!(id(r#"{"id":1.5,"method":"m"}"#), Some((None, false)));
        assert_eq!(id("not json"), None);
        assert_eq!(id("[7, null, {}]"), None, "a batch is no reply to 7");
        assert_eq!(id(r#" [{"jsonrpc":"2.0","id":7,"result":1}]"#), None);
    }
    use serde_json::json;

    #[test]
    fn a_bad_id_or_error_object_is_named_in_the_error_not_echoed() {
        let huge = "x".repeat(1 << 20);
        for line in [
            format!(r#"{{"jsonrpc":"2.0","id":["{huge}"],"method":"m"}}"#),
            format!(r#"{{"jsonrpc":"2.0","id":1,"error":{{"code":"{huge}","message":"m"}}}}"#),
            // A line that is one string: serde quotes it whole.
            format!(r#""{huge}""#),
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":{{"{huge}":1}}}}"#),
            // A string id of a megabyte, which an answer would echo.
            format!(r#"{{"jsonrpc":"2.0","id":"{huge}","method":"ping"}}"#),
        ] {
            let e = Message::parse(line.as_bytes())
                .expect_err("malformed")
                .to_string();
            assert!(
                e.len() < 400,
                "the error quotes the peer: {} bytes",
                e.len()
            );
        }
    }

    #[test]
    fn a_line_is_utf_8_throughout_or_refused() {
        // Bad UTF-8 in a value the parse skips (an unknown key's) is refused too.
        let mut line = br#"{"jsonrpc":"2.0","id":1,"result":{},"_x":""#.to_vec();
        line.extend_from_slice(&[0xff]);
        line.extend_from_slice(br#""}"#);
        assert!(matches!(
            Message::parse(&line),
            Err(ProtocolError::InvalidJson(e)) if e.contains("UTF-8")
        ));
        // `jsonrpc` is read borrowed, or owned when it has an escape.
        for line in [
            br#"{"jsonrpc":"2.0","id":4,"result":{}}"#.as_slice(),
            br#"{"jsonrpc":"2\u002e0","id":4,"result":{}}"#,
        ] {
            assert!(matches!(
                Message::parse(line),
                Ok(Message::Response(Response {
                    id: Some(RequestId::Number(4)),
                    outcome: Ok(_)
                }))
            ));
        }
    }

    #[test]
    fn a_request_is_written_as_serde_writes_it() {
        let env = super::super::meta::MetaEnvelope::new(
            super::super::meta::MODERN,
            json!({"roots": {}}),
            json!({"name": "t", "version": "1"}),
        );
        let ids = [
            RequestId::Number(0),
            RequestId::Number(-42),
            RequestId::Number(i64::MAX),
            RequestId::String("a\"b\\c\u{1}é".into()),
        ];
        let params = [
            None,
            Some(json!({"name": "x", "arguments": {"k\"": [1, "\n"]}})),
            Some(json!(["not", "an", "object"])),
        ];
        for id in &ids {
            for params in &params {
                for method in ["tools/call", "we\"ird\u{7f}"] {
                    let request = Request {
                        id: id.clone(),
                        method: method.into(),
                        params: params.clone(),
                    };
                    // Unstamped: the very bytes serde writes for the message.
                    let mut line = Vec::new();
                    Message::write_stamped_line((&request).into(), None, &mut line);
                    let mut derived = serde_json::to_vec(&WireOut::Request((&request).into()))
                        .expect("serializes");
                    derived.push(b'\n');
                    assert_eq!(line, derived);
                    // Stamped: the same message with the envelope merged in.
                    let stamp = Stamp {
                        envelope: &env,
                        capabilities: None,
                    };
                    let body = Message::stamped_json((&request).into(), Some(stamp));
                    let written: Value = serde_json::from_slice(&body).expect("JSON");
                    let stamped = serde_json::to_value(StampedParams {
                        params: params.as_ref(),
                        stamp,
                    })
                    .expect("serializes");
                    let id = serde_json::to_value(id).expect("id");
                    assert_eq!(
                        written,
                        json!({"jsonrpc": "2.0", "id": id, "method": method, "params": stamped})
                    );
                }
            }
        }
    }

    fn parse(v: &str) -> Result<Message, ProtocolError> {
        Message::parse(v.as_bytes())
    }

    #[test]
    fn requests_notifications_and_responses_parse_by_shape() {
        assert!(matches!(
            parse(r#"{"jsonrpc":"2.0","id":"a","method":"ping"}"#),
            Ok(Message::Request(Request {
                id: RequestId::String(_),
                ..
            }))
        ));
        assert!(matches!(
            parse(r#"{"jsonrpc":"2.0","method":"notifications/x","params":{}}"#),
            Ok(Message::Notification(_))
        ));
        let Ok(Message::Response(r)) = parse(r#"{"jsonrpc":"2.0","id":3,"result":null}"#) else {
            panic!("a null result is still a result");
        };
        assert_eq!(r.outcome, Ok(Value::Null));
        let Ok(Message::Response(r)) =
            parse(r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}"#)
        else {
            panic!("an error with a null id is a response");
        };
        assert_eq!(r.id, None);
    }

    #[test]
    fn result_and_error_together_is_malformed() {
        let e = parse(r#"{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":""}}"#);
        assert!(matches!(e, Err(ProtocolError::Malformed(_))));
    }

    #[test]
    fn batches_bad_json_and_bad_ids_are_rejected() {
        assert_eq!(
            parse(r#" [{"jsonrpc":"2.0","id":1,"result":{}}]"#),
            Err(ProtocolError::Batch)
        );
        assert!(matches!(parse("{nope"), Err(ProtocolError::InvalidJson(_))));
        assert!(matches!(parse("[nope"), Err(ProtocolError::InvalidJson(_))));
        for wrong_shape in [
            r#"{"jsonrpc":"2.0","method":1,"id":1}"#,
            r#""str""#,
            "42",
            "null",
        ] {
            assert!(
                matches!(parse(wrong_shape), Err(ProtocolError::Malformed(_))),
                "{wrong_shape}"
            );
        }
        assert!(matches!(
            parse(r#"{"jsonrpc":"2.0","id":1.5,"result":{}}"#),
            Err(ProtocolError::Malformed(_))
        ));
        assert!(matches!(
            parse(r#"{"jsonrpc":"1.0","id":1,"result":{}}"#),
            Err(ProtocolError::Malformed(_))
        ));
    }

    #[test]
    fn written_messages_parse_back_unchanged() {
        let msgs = [
            Message::Request(Request {
                id: RequestId::Number(7),
                method: "tools/call".into(),
                params: Some(json!({"name":"echo","arguments":{"text":"hi\nthere"}})),
            }),
            Message::Notification(Notification {
                method: "n".into(),
                params: None,
            }),
            Message::Response(Response {
                id: None,
                outcome: Err(RpcError::new(-32700, "bad")),
            }),
        ];
        for m in msgs {
            let mut line = Vec::new();
            m.write_line(&mut line);
            assert_eq!(
                line.iter().filter(|b| **b == b'\n').count(),
                1,
                "one line per message"
            );
            assert_eq!(Message::parse(&line), Ok(m));
        }
    }

    /// A reader routes by `peek` and parses later: a line `peek` calls a result must
    /// parse as that response or not at all (never as another message, nor for another
    /// id), and an ordinary successful response must take the fast path.
    #[test]
    fn peek_routes_only_what_parse_would_call_that_result() {
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":20,"result":{}{}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        let mut bad_utf8 = br#"{"jsonrpc":"2.0","id":21,"result":{"text":""#.to_vec();
        bad_utf8.extend_from_slice(&[0xff, 0xfe]);
        bad_utf8.extend_from_slice(br#""}}"#);
        let fast: [&[u8]; 7] = [
            br#"{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"hi"}]}}"#,
            br#"{"result":null,"id":"s1","jsonrpc":"2.0"}"#,
            br#"  {"jsonrpc":"2.0","id":4,"result":{},"method":null}"#,
            br#"{"jsonrpc":"2.0","id":-7,"result":{}}"#,
            br#"{"jsonrpc":"2.0","id":0,"result":1}"#,
            br#"{"jsonrpc":"2.0","id":999999999999999999,"result":{}}"#,
            br#"{"jsonrpc":"2.0","id":9223372036854775807,"result":{}}"#,
        ];
        let other: [&[u8]; 18] = [
            br#"{"jsonrpc":"2\u002e0","id":4,"result":{}}"#,
            br#"{"jsonrpc":"2.0","id":5,"error":{"code":-32601,"message":"no"}}"#,
            br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}"#,
            br#"{"jsonrpc":"2.0","id":6,"method":"ping"}"#,
            br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{}}"#,
            br#"{"jsonrpc":"2.0","id":null,"result":{}}"#,
            br#"{"jsonrpc":"2.0","result":{}}"#,
            br#"{"jsonrpc":"2.0","id":1.5,"result":{}}"#,
            br#"{"jsonrpc":"2.0","id":[1],"result":{}}"#,
            br#"{"jsonrpc":"1.0","id":7,"result":{}}"#,
            br#"{"id":7,"result":{}}"#,
            br#"[{"jsonrpc":"2.0","id":1,"result":{}}]"#,
            br#"["2.0",14,null,null,{},null]"#,
            b"not json at all",
            br#"{"jsonrpc":"2.0","id":01,"result":{}}"#,
            br#"{"jsonrpc":"2.0","id":-0,"result":{}}"#,
            br#"{"jsonrpc":"2.0","id":9223372036854775808,"result":{}}"#,
            br#"{"jsonrpc":2,"id":17,"result":{}}"#,
        ];
        let body_only: [&[u8]; 12] = [
            deep.as_bytes(),
            &bad_utf8,
            br#"{"jsonrpc":"2.0","id":22,"result":"\ud800"}"#,
            br#"{"jsonrpc":"2.0","id":23,"result":1e400}"#,
            // Begun as a response; what follows is for the full parse to refuse.
            br#"{"jsonrpc":"2.0","id":8,"result":{},"error":{"code":1,"message":""}}"#,
            br#"{"jsonrpc":"2.0","id":10,"result":{},"id":11}"#,
            br#"{"jsonrpc":"2.0","id":12,"result":{},"params":1,"params":2}"#,
            br#"{"jsonrpc":"2.0","id":13,"result":{},"result":{}}"#,
            br#"{"jsonrpc":"2.0","id":15,"result":{"#,
            br#"{"jsonrpc":"2.0","id":16,"result":{}} trailing"#,
            // In another key order, the scan routes them alike.
            br#"{"jsonrpc":"2.0","id":9,"method":"m","result":{}}"#,
            br#"{"id":24,"error":{"code":1,"message":""},"result":{},"jsonrpc":"2.0"}"#,
        ];
        for line in fast {
            let text = String::from_utf8_lossy(line);
            let Peeked::Result(id) = Message::peek(line) else {
                panic!("{text}: a successful response left to the full parse");
            };
            let Ok(Message::Response(r)) = Message::parse(line) else {
                panic!("{text}: does not parse as a response");
            };
            assert_eq!(r.id, Some(id), "{text}");
            assert!(r.outcome.is_ok(), "{text}");
        }
        for line in other {
            let text = String::from_utf8_lossy(line);
            assert_eq!(Message::peek(line), Peeked::Other, "{text}");
        }
        // The prefix's own bounds: 18 digits it reads, 19 it leaves to the scan.
        let prefixed = |id: &str| {
            peek_prefix(format!(r#"{{"jsonrpc":"2.0","id":{id},"result":1}}"#).as_bytes())
        };
        assert_eq!(prefixed("-7"), Some(RequestId::Number(-7)));
        assert_eq!(
            prefixed("999999999999999999"),
            Some(RequestId::Number(999_999_999_999_999_999))
        );
        for id in ["9223372036854775807", "-0", "01", "1.5", "\"1\"", ""] {
            assert_eq!(prefixed(id), None, "{id}");
        }
        // Routed by id, then refused by the full parse: the request fails at once.
        for line in body_only {
            let text = String::from_utf8_lossy(&line[..line.len().min(80)]).into_owned();
            assert!(matches!(Message::peek(line), Peeked::Result(_)), "{text}");
            assert!(Message::parse(line).is_err(), "{text}");
        }
    }
}
