//! JSON-RPC error objects and the MCP error codes the harness acts on.
//!
//! [`RpcError`] is the wire object, kept whole (a gateway passes `data` along);
//! [`RpcError::kind`] is the typed view: -32020 header mismatch, -32021 missing client
//! capability (`data.requiredCapabilities`), -32022 unsupported protocol version
//! (`data.supported`, `data.requested`), -32602 invalid params, -32601 method not found.
//! Spec: section E.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// -32700: the peer could not parse what it received.
pub const PARSE_ERROR: i64 = -32700;
/// -32600: not a valid request object.
pub const INVALID_REQUEST: i64 = -32600;
/// -32601: unknown method (HTTP 404 on modern servers).
pub const METHOD_NOT_FOUND: i64 = -32601;
/// -32602: bad parameters, including a malformed `_meta`; also "resource not found".
pub const INVALID_PARAMS: i64 = -32602;
/// -32603: internal error.
pub const INTERNAL_ERROR: i64 = -32603;
/// -32002: `resources/read` of a URI the server does not have.
pub const RESOURCE_NOT_FOUND: i64 = -32002;
/// -32020 `HeaderMismatch`: HTTP headers missing or different from the body.
pub const HEADER_MISMATCH: i64 = -32020;
/// -32021 `MissingRequiredClientCapability`.
pub const MISSING_CLIENT_CAPABILITY: i64 = -32021;
/// -32022 `UnsupportedProtocolVersion`.
pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;

/// A JSON-RPC error object as it travels on the wire (kept whole; shown on one line,
/// bounded and escaped: the peer's message reaches logs and terminals).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("{} ({code}): {}", label_of(self.code), crate::util::text::one_line(&self.message, 500))]
pub struct RpcError {
    /// The numeric code.
    pub code: i64,
    /// The peer's message, for people.
    pub message: String,
    /// Structured detail, passed along untouched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

/// The typed meaning of an [`RpcError`]'s code and data.
#[derive(Clone, Debug, PartialEq)]
pub enum RpcErrorKind {
    /// -32020: fix the request's headers; no fallback to legacy.
    HeaderMismatch,
    /// -32021: the server needs capabilities the client did not declare. A configuration
    /// error: retrying the same request cannot succeed.
    MissingClientCapability {
        /// `data.requiredCapabilities`, a `ClientCapabilities`-shaped object.
        required: Value,
    },
    /// -32022: the server does not speak the requested version.
    UnsupportedProtocolVersion {
        /// `data.supported`.
        supported: Vec<String>,
        /// `data.requested`.
        requested: String,
    },
    /// -32602.
    InvalidParams,
    /// -32601.
    MethodNotFound,
    /// Any other code, including -32001..-32004 from pre-release servers, which carry no
    /// meaning here.
    Other,
}

/// What an error's code is called, from the code alone: shown without reading (or
/// copying) what the peer put in `data`.
fn label_of(code: i64) -> &'static str {
    match code {
        HEADER_MISMATCH => "header mismatch",
        MISSING_CLIENT_CAPABILITY => "missing client capability",
        UNSUPPORTED_PROTOCOL_VERSION => "unsupported protocol version",
        INVALID_PARAMS => "invalid params",
        METHOD_NOT_FOUND => "method not found",
        _ => "server error",
    }
}

/// Whether `value` serializes to at most `limit` bytes, found without writing more.
fn serializes_within(value: &Value, limit: usize) -> bool {
    struct Capped(usize);
    impl std::io::Write for Capped {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 = self
                .0
                .checked_sub(buf.len())
                .ok_or(std::io::ErrorKind::WriteZero)?;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    serde_json::to_writer(Capped(limit), value).is_ok()
}

/// Capabilities a server says it needs kept in an error's kind.
const SHOWN_ENTRIES: usize = 32;

/// `requiredCapabilities` as errors carry it on (to agents, logs, the audit trail):
/// at most [`SHOWN_ENTRIES`] capabilities, names cut, a value over 512 bytes as `{}`.
fn capabilities_shown(required: &Value) -> Value {
    let Some(map) = required.as_object() else {
        return Value::Null;
    };
    let shown = map.iter().take(SHOWN_ENTRIES).map(|(name, value)| {
        let small = serializes_within(value, 512);
        let value = if small {
            value.clone()
        } else {
            Value::Object(Default::default())
        };
        (crate::util::text::one_line(name, 64), value)
    });
    Value::Object(shown.collect())
}

/// The most versions [`RpcError::kind`] reads of a -32022's `data.supported`.
const SUPPORTED_SHOWN: usize = 64;
/// The longest string read there for a version (versions are dates).
const VERSION_BYTES: usize = 32;

impl RpcError {
    /// An error with no `data`.
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }

    /// The same error with `data` set.
    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }

    /// The typed view of this error. A -32021 or -32022 whose `data` lacks its required
    /// fields still maps to its kind, with the missing parts empty.
    pub fn kind(&self) -> RpcErrorKind {
        let data = self.data.as_ref();
        match self.code {
            HEADER_MISMATCH => RpcErrorKind::HeaderMismatch,
            MISSING_CLIENT_CAPABILITY => RpcErrorKind::MissingClientCapability {
                required: data
                    .and_then(|d| d.get("requiredCapabilities"))
                    .map_or(Value::Null, capabilities_shown),
            },
            UNSUPPORTED_PROTOCOL_VERSION => RpcErrorKind::UnsupportedProtocolVersion {
                supported: data
                    .and_then(|d| d.get("supported"))
                    .and_then(Value::as_array)
                    .map(|a| {
                        // A version is a date: a peer's list of millions is not copied
                        // at each look, nor a long string, which is no version (left
                        // out before the first few are taken, as the full list's
                        // versions would be read).
                        a.iter()
                            .filter_map(Value::as_str)
                            .filter(|v| v.len() <= VERSION_BYTES)
                            .take(SUPPORTED_SHOWN)
                            .map(String::from)
                            .collect()
                    })
                    .unwrap_or_default(),
                requested: data
                    .and_then(|d| d.get("requested"))
                    .and_then(Value::as_str)
                    .filter(|v| v.len() <= VERSION_BYTES)
                    .unwrap_or_default()
                    .to_string(),
            },
            INVALID_PARAMS => RpcErrorKind::InvalidParams,
            METHOD_NOT_FOUND => RpcErrorKind::MethodNotFound,
            _ => RpcErrorKind::Other,
        }
    }

    /// True for the errors only a modern (2026-07-28) server sends: -32020, -32021, and a
    /// -32022 that names its supported versions. Era detection treats only these as
    /// evidence of a modern server.
    pub fn is_modern(&self) -> bool {
        // Read where it is: a peer's long list is not copied to be asked this.
        match self.code {
            HEADER_MISMATCH | MISSING_CLIENT_CAPABILITY => true,
            UNSUPPORTED_PROTOCOL_VERSION => self
                .data
                .as_ref()
                .and_then(|d| d.get("supported"))
                .and_then(Value::as_array)
                .is_some_and(|a| a.iter().any(Value::is_string)),
            _ => false,
        }
    }
}

/// A message that is not valid JSON-RPC, or a result that breaks the MCP schema.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// Not JSON at all.
    #[error("invalid JSON: {0}")]
    InvalidJson(String),
    /// A JSON array: batches are not part of MCP.
    #[error("JSON-RPC batches are not supported by MCP")]
    Batch,
    /// JSON, but not a JSON-RPC 2.0 message.
    #[error("malformed JSON-RPC message: {0}")]
    Malformed(String),
    /// A `resultType` this client does not know; the spec says to treat it as invalid.
    #[error("unknown resultType {0:?}")]
    UnknownResultType(String),
    /// A result that lacks what its method requires.
    #[error("invalid result: {0}")]
    InvalidResult(String),
}

impl ProtocolError {
    /// The JSON-RPC code to answer a peer's message that failed so: -32700 for what is
    /// not JSON, -32600 for JSON that is not a JSON-RPC message (a batch among them).
    pub fn code(&self) -> i64 {
        match self {
            ProtocolError::InvalidJson(_) => PARSE_ERROR,
            _ => INVALID_REQUEST,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_huge_data_is_not_copied_to_show_the_error_or_to_tell_its_era() {
        let many: Vec<Value> = (0..100_000)
            .map(|i| Value::String(format!("v{i}")))
            .collect();
        let e = RpcError::new(UNSUPPORTED_PROTOCOL_VERSION, "no")
            .with_data(serde_json::json!({"supported": many, "requested": "x"}));
        assert!(
            e.to_string()
                .starts_with("unsupported protocol version (-32022)")
        );
        assert!(e.is_modern());
        // Its kind, looked at on every error, reads a few: the first of them, as sent.
        let RpcErrorKind::UnsupportedProtocolVersion { supported, .. } = e.kind() else {
            panic!("kind");
        };
        assert_eq!(supported.len(), SUPPORTED_SHOWN);
        assert_eq!(supported[0], "v0");
        let long = RpcError::new(UNSUPPORTED_PROTOCOL_VERSION, "no").with_data(
            json!({"supported": ["x".repeat(1 << 20), "2026-07-28"], "requested": "y".repeat(1 << 20)}),
        );
        assert_eq!(
            long.kind(),
            RpcErrorKind::UnsupportedProtocolVersion {
                supported: vec!["2026-07-28".into()],
                requested: String::new(),
            }
        );
        // Long strings do not take the places of the versions after them.
        let mut padded: Vec<Value> = (0..100).map(|_| json!("z".repeat(100))).collect();
        padded.push(json!("2026-07-28"));
        let padded = RpcError::new(UNSUPPORTED_PROTOCOL_VERSION, "no")
            .with_data(json!({"supported": padded}));
        let RpcErrorKind::UnsupportedProtocolVersion { supported, .. } = padded.kind() else {
            panic!("kind");
        };
        assert_eq!(supported, ["2026-07-28"]);
        let big = serde_json::json!({"x": "y".repeat(10_000)});
        assert!(!serializes_within(&big, 512));
        assert!(serializes_within(&serde_json::json!({"x": 1}), 512));
    }

    #[test]
    fn what_a_server_says_it_needs_is_bounded() {
        let many: serde_json::Map<String, Value> = (0..1000)
            .map(|i| {
                (
                    format!("cap{i}{}", "n".repeat(1000)),
                    json!({"x": "y".repeat(10_000)}),
                )
            })
            .collect();
        let e = RpcError::new(MISSING_CLIENT_CAPABILITY, "needs")
            .with_data(json!({"requiredCapabilities": many}));
        let RpcErrorKind::MissingClientCapability { required } = e.kind() else {
            panic!("kind");
        };
        assert!(
            required.to_string().len() < 8 * 1024,
            "{}",
            required.to_string().len()
        );
        let e = RpcError::new(MISSING_CLIENT_CAPABILITY, "needs")
            .with_data(json!({"requiredCapabilities": {"sampling": {}}}));
        assert_eq!(
            e.kind(),
            RpcErrorKind::MissingClientCapability {
                required: json!({"sampling": {}})
            }
        );
    }

    #[test]
    fn a_peers_message_is_shown_on_one_bounded_line_and_kept_whole() {
        let message = format!(
            "x\n2026-01-01T00:00:00Z ERROR forged\u{1b}[2J{}",
            "y".repeat(10_000)
        );
        let e = RpcError::new(INTERNAL_ERROR, message.clone());
        let shown = e.to_string();
        assert!(
            !shown.contains('\n') && !shown.contains('\u{1b}'),
            "{shown}"
        );
        assert!(shown.chars().count() < 600, "{}", shown.len());
        // On the wire it is passed along as the peer sent it.
        assert_eq!(e.message, message);
    }

    #[test]
    fn modern_error_codes_have_typed_data() {
        let e = RpcError::new(-32022, "no")
            .with_data(json!({"supported":["2026-07-28"],"requested":"2099-01-01"}));
        assert_eq!(
            e.kind(),
            RpcErrorKind::UnsupportedProtocolVersion {
                supported: vec!["2026-07-28".into()],
                requested: "2099-01-01".into()
            }
        );
        assert!(e.is_modern());
        let e = RpcError::new(-32021, "cap")
            .with_data(json!({"requiredCapabilities":{"elicitation":{}}}));
        assert_eq!(
            e.kind(),
            RpcErrorKind::MissingClientCapability {
                required: json!({"elicitation":{}})
            }
        );
        assert!(e.to_string().contains("missing client capability"));
    }

    #[test]
    fn legacy_errors_are_not_evidence_of_a_modern_server() {
        for code in [-32601, -32602, -32600, -32004, -32001] {
            assert!(!RpcError::new(code, "x").is_modern(), "code {code}");
        }
        // A -32022 without a supported list tells us nothing we can act on.
        assert!(!RpcError::new(-32022, "x").is_modern());
    }
}
