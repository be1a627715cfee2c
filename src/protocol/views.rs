//! Typed views of the result fields the harness itself reads.
//!
//! Each view is read from a raw result [`Value`] and never replaces it: the caller keeps
//! the whole result to pass along. Decoding is lenient where the spec says so (missing
//! `resultType` = `complete`, missing or negative `ttlMs` = 0, missing `cacheScope` =
//! `private`) and strict where it says so (an unknown `resultType` is invalid; an
//! `input_required` result needs `inputRequests` or `requestState`).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use super::error::ProtocolError;
use super::meta::KEY_SERVER_INFO;
use crate::util::text::one_line;

/// What kind of result a server returned (spec section D).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResultType {
    /// An ordinary, final result.
    Complete,
    /// An interim MRTR result: answer its input requests and retry.
    InputRequired,
}

impl ResultType {
    /// Reads `resultType`: absent means `complete` (legacy servers never send it).
    pub fn of(result: &Value) -> Result<ResultType, ProtocolError> {
        match result.get("resultType") {
            None => Ok(ResultType::Complete),
            Some(Value::String(s)) if s == "complete" => Ok(ResultType::Complete),
            Some(Value::String(s)) if s == "input_required" => Ok(ResultType::InputRequired),
            Some(Value::String(s)) => Err(ProtocolError::UnknownResultType(one_line(s, 100))),
            // Named, not copied: the value is the server's, of any size.
            Some(other) => Err(ProtocolError::UnknownResultType(format!(
                "not a string but {}",
                match other {
                    Value::Null => "null",
                    Value::Bool(_) => "a boolean",
                    Value::Number(_) => "a number",
                    Value::Array(_) => "an array",
                    _ => "an object",
                }
            ))),
        }
    }
}

/// Who may reuse a cached result (spec section C).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CacheScope {
    /// Not user-specific: anyone may be served it.
    Public,
    /// Reusable only within the same authorization context.
    Private,
}

/// A result's freshness hints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheHints {
    /// How long the result stays fresh; zero means re-fetch whenever needed.
    pub ttl: Duration,
    /// Who may reuse it.
    pub scope: CacheScope,
}

impl CacheHints {
    /// Reads `ttlMs` (absent, negative or not a number: 0) and `cacheScope` (absent,
    /// empty or unknown: `private`, the only safe default).
    pub fn of(result: &Value) -> CacheHints {
        let ttl_ms = result.get("ttlMs").and_then(Value::as_f64).unwrap_or(0.0);
        let ttl = if ttl_ms.is_finite() && ttl_ms > 0.0 {
            Duration::from_millis(ttl_ms.min(u64::MAX as f64) as u64)
        } else {
            Duration::ZERO
        };
        let scope = match result.get("cacheScope").and_then(Value::as_str) {
            Some("public") => CacheScope::Public,
            _ => CacheScope::Private,
        };
        CacheHints { ttl, scope }
    }
}

/// A `server/discover` result (spec section B).
#[derive(Clone, Debug, PartialEq)]
pub struct DiscoverResult {
    /// Versions the server speaks; may include legacy ones on a dual-era server.
    pub supported_versions: Vec<String>,
    /// `ServerCapabilities`, as sent.
    pub capabilities: Value,
    /// Guidance for the model, if any.
    pub instructions: Option<String>,
    /// `_meta["io.modelcontextprotocol/serverInfo"]`, self-reported.
    pub server_info: Option<Value>,
    /// How long this profile may be cached, and by whom.
    pub hints: CacheHints,
}

impl DiscoverResult {
    /// Reads a discover result; it must at least list its supported versions.
    pub fn from_value(result: &Value) -> Result<DiscoverResult, ProtocolError> {
        if ResultType::of(result)? != ResultType::Complete {
            return Err(ProtocolError::InvalidResult(
                "server/discover must be complete".into(),
            ));
        }
        let supported_versions = result
            .get("supportedVersions")
            .and_then(Value::as_array)
            .ok_or_else(|| {
                ProtocolError::InvalidResult("server/discover without supportedVersions".into())
            })?
            .iter()
            .filter_map(|v| v.as_str().map(String::from))
            .collect();
        Ok(DiscoverResult {
            supported_versions,
            capabilities: result.get("capabilities").cloned().unwrap_or(Value::Null),
            instructions: result
                .get("instructions")
                .and_then(Value::as_str)
                .map(String::from),
            server_info: result
                .get("_meta")
                .and_then(|m| m.get(KEY_SERVER_INFO))
                .cloned(),
            hints: CacheHints::of(result),
        })
    }
}

/// A legacy `initialize` result.
#[derive(Clone, Debug, PartialEq)]
pub struct InitializeResult {
    /// The version the server chose.
    pub protocol_version: String,
    /// `ServerCapabilities`, as sent.
    pub capabilities: Value,
    /// `serverInfo` (top-level in the legacy era).
    pub server_info: Option<Value>,
    /// Guidance for the model, if any.
    pub instructions: Option<String>,
}

impl InitializeResult {
    /// Reads an `initialize` result; it must name a protocol version.
    pub fn from_value(result: &Value) -> Result<InitializeResult, ProtocolError> {
        let protocol_version = result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                ProtocolError::InvalidResult("initialize without protocolVersion".into())
            })?
            .to_string();
        Ok(InitializeResult {
            protocol_version,
            capabilities: result.get("capabilities").cloned().unwrap_or(Value::Null),
            server_info: result.get("serverInfo").cloned(),
            instructions: result
                .get("instructions")
                .and_then(Value::as_str)
                .map(String::from),
        })
    }
}

/// One entry of `inputRequests`: a method and its params, with no id.
#[derive(Clone, Debug, PartialEq)]
pub struct InputRequest {
    /// `elicitation/create`, `sampling/createMessage` or `roots/list`.
    pub method: String,
    /// The request's params, passed to the handler as sent.
    pub params: Value,
}

/// An `input_required` result (spec section D).
#[derive(Clone, Debug, PartialEq)]
pub struct InputRequired {
    /// Server-chosen keys to input requests; answers go back under the same keys.
    pub input_requests: BTreeMap<String, InputRequest>,
    /// Opaque state to echo exactly on the retry; never parsed.
    pub request_state: Option<String>,
}

impl InputRequired {
    /// Reads an `input_required` result. It must carry `inputRequests` or
    /// `requestState` (or both); anything else is a protocol violation.
    pub fn from_value(result: &Value) -> Result<InputRequired, ProtocolError> {
        let mut input_requests = BTreeMap::new();
        match result.get("inputRequests") {
            None | Some(Value::Null) => {}
            Some(Value::Object(map)) => {
                for (key, req) in map {
                    let method = req.get("method").and_then(Value::as_str).ok_or_else(|| {
                        ProtocolError::InvalidResult(format!(
                            "input request {:?} has no method",
                            one_line(key, 100)
                        ))
                    })?;
                    input_requests.insert(
                        key.clone(),
                        InputRequest {
                            method: method.to_string(),
                            params: req.get("params").cloned().unwrap_or(Value::Null),
                        },
                    );
                }
            }
            Some(_) => {
                return Err(ProtocolError::InvalidResult(
                    "inputRequests must be an object".into(),
                ));
            }
        }
        let request_state = match result.get("requestState") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => {
                return Err(ProtocolError::InvalidResult(
                    "requestState must be a string".into(),
                ));
            }
        };
        if input_requests.is_empty() && request_state.is_none() {
            return Err(ProtocolError::InvalidResult(
                "input_required with neither inputRequests nor requestState".into(),
            ));
        }
        Ok(InputRequired {
            input_requests,
            request_state,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn missing_result_type_is_complete_and_unknown_is_invalid() {
        assert_eq!(ResultType::of(&json!({})), Ok(ResultType::Complete));
        assert_eq!(
            ResultType::of(&json!({"resultType":"input_required"})),
            Ok(ResultType::InputRequired)
        );
        assert!(ResultType::of(&json!({"resultType":"task"})).is_err());
        assert!(ResultType::of(&json!({"resultType":3})).is_err());
        // A value of another type is named, not copied into the error.
        let huge = json!({"resultType": vec!["x".repeat(1000); 1000]});
        let said = ResultType::of(&huge).expect_err("not a string").to_string();
        assert!(said.contains("an array") && said.len() < 200, "{said}");
    }

    #[test]
    fn cache_hints_default_to_zero_and_private() {
        let h = CacheHints::of(&json!({}));
        assert_eq!((h.ttl, h.scope), (Duration::ZERO, CacheScope::Private));
        let h = CacheHints::of(&json!({"ttlMs": -5, "cacheScope": ""}));
        assert_eq!((h.ttl, h.scope), (Duration::ZERO, CacheScope::Private));
        let h = CacheHints::of(&json!({"ttlMs": 1500, "cacheScope": "public"}));
        assert_eq!(
            (h.ttl, h.scope),
            (Duration::from_millis(1500), CacheScope::Public)
        );
    }

    #[test]
    fn discover_reads_server_info_from_meta() {
        let d = DiscoverResult::from_value(&json!({
            "resultType":"complete","supportedVersions":["2026-07-28","2025-11-25"],
            "capabilities":{"tools":{}},"ttlMs":60000,"cacheScope":"public",
            "_meta":{"io.modelcontextprotocol/serverInfo":{"name":"s","version":"1"}}
        }))
        .expect("valid discover result");
        assert_eq!(d.supported_versions.len(), 2);
        assert_eq!(d.server_info.expect("server info")["name"], "s");
        assert!(DiscoverResult::from_value(&json!({"capabilities":{}})).is_err());
    }

    #[test]
    fn input_required_needs_requests_or_state_and_keeps_state_opaque() {
        let r = InputRequired::from_value(&json!({
            "resultType":"input_required",
            "inputRequests":{"k1":{"method":"elicitation/create","params":{"message":"?"}}},
            "requestState":"  {\"not\":\"parsed\"} "
        }))
        .expect("valid");
        assert_eq!(r.input_requests["k1"].method, "elicitation/create");
        assert_eq!(r.request_state.as_deref(), Some("  {\"not\":\"parsed\"} "));
        assert!(InputRequired::from_value(&json!({"resultType":"input_required"})).is_err());
        assert!(InputRequired::from_value(&json!({"requestState":"only state"})).is_ok());
    }
}
