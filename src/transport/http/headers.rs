//! The request headers of Streamable HTTP that mirror the body (spec section F):
//! `Mcp-Name`, and `Mcp-Param-*` for tool arguments whose schema carries
//! `x-mcp-header`, with the base64 sentinel for values a header cannot carry as-is.
//!
//! A tool whose `x-mcp-header` annotations are invalid must be dropped from the client's
//! tool list: [`param_headers`] says which annotations a schema has, or why it is invalid.

use base64::Engine;
use serde_json::Value;

use crate::util::text::one_line;

/// Most `x-mcp-header` annotations one tool may have: each is a header on every call,
/// and each holds its path (a server's schema must not multiply into memory).
pub const MAX_PARAM_HEADERS: usize = 64;
/// Longest path to an annotated argument, in bytes of its property names.
pub const MAX_PARAM_PATH_BYTES: usize = 1024;
/// Longest header name suffix (`Mcp-Param-` followed by it), in bytes.
pub const MAX_PARAM_NAME_BYTES: usize = 256;

/// One `x-mcp-header` annotation: the header's name suffix and the argument's path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamHeader {
    /// The suffix after `Mcp-Param-`.
    pub name: String,
    /// Property names from the root of `arguments` to the value.
    pub path: Vec<String>,
}

/// Reads the `x-mcp-header` annotations of a tool's `inputSchema`, or says why they are
/// invalid: an empty or non-token name, a duplicate (ignoring case), a non-primitive or
/// `number` type, an annotation not reachable through `properties` alone, more than
/// [`MAX_PARAM_HEADERS`], or a path longer than [`MAX_PARAM_PATH_BYTES`].
pub fn param_headers(schema: &Value) -> Result<Vec<ParamHeader>, String> {
    let mut found = Vec::new();
    walk(schema, &mut Vec::new(), true, &mut found)?;
    let mut seen = std::collections::HashSet::new();
    for h in &found {
        if !seen.insert(h.name.to_ascii_lowercase()) {
            return Err(format!(
                "x-mcp-header {:?} is declared twice",
                one_line(&h.name, 64)
            ));
        }
    }
    Ok(found)
}

fn walk(
    node: &Value,
    path: &mut Vec<String>,
    reachable: bool,
    found: &mut Vec<ParamHeader>,
) -> Result<(), String> {
    match node {
        Value::Object(map) => {
            if let Some(name) = map.get("x-mcp-header") {
                if !reachable || path.is_empty() {
                    return Err(format!(
                        "an x-mcp-header {} deep is not reachable through properties alone",
                        path.len()
                    ));
                }
                let name = name.as_str().ok_or("x-mcp-header must be a string")?;
                if name.is_empty()
                    || name.len() > MAX_PARAM_NAME_BYTES
                    || !name.bytes().all(is_token_byte)
                {
                    return Err(format!(
                        "x-mcp-header {:?} is not a valid header name",
                        one_line(name, 64)
                    ));
                }
                match map.get("type").and_then(Value::as_str) {
                    Some("string" | "integer" | "boolean") => {}
                    other => {
                        return Err(format!(
                            "x-mcp-header {:?} on a property of type {:?}",
                            one_line(name, 64),
                            other.map(|t| one_line(t, 32))
                        ));
                    }
                }
                if found.len() == MAX_PARAM_HEADERS {
                    return Err(format!(
                        "more than {MAX_PARAM_HEADERS} x-mcp-header annotations"
                    ));
                }
                if path.iter().map(String::len).sum::<usize>() > MAX_PARAM_PATH_BYTES {
                    return Err(format!(
                        "x-mcp-header {:?} is more than {MAX_PARAM_PATH_BYTES} bytes of property names deep",
                        one_line(name, 64)
                    ));
                }
                found.push(ParamHeader {
                    name: name.to_string(),
                    path: path.clone(),
                });
            }
            for (key, value) in map {
                if key == "properties" {
                    if let Value::Object(props) = value {
                        for (prop, schema) in props {
                            path.push(prop.clone());
                            walk(schema, path, reachable, found)?;
                            path.pop();
                        }
                    }
                } else if key != "x-mcp-header" {
                    walk(value, path, false, found)?;
                }
            }
            Ok(())
        }
        Value::Array(items) => items.iter().try_for_each(|v| walk(v, path, false, found)),
        _ => Ok(()),
    }
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The header value for one argument, or `None` when it is absent, `null`, or not a
/// string, integer or boolean.
pub fn param_value(arguments: &Value, path: &[String]) -> Option<String> {
    let mut v = arguments;
    for p in path {
        v = v.get(p)?;
    }
    match v {
        Value::String(s) => Some(encode_value(s)),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) if n.is_i64() || n.is_u64() => Some(n.to_string()),
        _ => None,
    }
}

/// A value as a header can carry it: as-is when safe, else `=?base64?…?=`.
pub fn encode_value(s: &str) -> String {
    let unsafe_value = !s.is_ascii()
        || s.bytes().any(|b| b.is_ascii_control())
        || s.starts_with(char::is_whitespace)
        || s.ends_with(char::is_whitespace)
        || (s.starts_with("=?base64?") && s.ends_with("?="));
    if unsafe_value {
        format!(
            "=?base64?{}?=",
            base64::engine::general_purpose::STANDARD.encode(s.as_bytes())
        )
    } else {
        s.to_string()
    }
}

/// The `Mcp-Name` value for a request: `params.name` for `tools/call` and
/// `prompts/get`, `params.uri` for `resources/read`.
pub fn mcp_name(method: &str, params: Option<&Value>) -> Option<String> {
    let key = match method {
        "tools/call" | "prompts/get" => "name",
        "resources/read" => "uri",
        _ => return None,
    };
    params?.get(key)?.as_str().map(encode_value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn annotations_are_found_through_nested_properties() {
        let schema = json!({"type":"object","properties":{
            "region":{"type":"string","x-mcp-header":"Region"},
            "opts":{"type":"object","properties":{"dry":{"type":"boolean","x-mcp-header":"Dry-Run"}}}
        }});
        let hs = param_headers(&schema).expect("valid");
        assert_eq!(hs.len(), 2);
        let args = json!({"region":"eu-west-1","opts":{"dry":true}});
        let by_name = |n: &str| hs.iter().find(|h| h.name == n).expect("present");
        assert_eq!(
            param_value(&args, &by_name("Region").path).as_deref(),
            Some("eu-west-1")
        );
        assert_eq!(
            param_value(&args, &by_name("Dry-Run").path).as_deref(),
            Some("true")
        );
        assert_eq!(
            param_value(&json!({"region":null}), &by_name("Region").path),
            None
        );
    }

    #[test]
    fn invalid_annotations_are_rejected() {
        let bad = [
            json!({"properties":{"a":{"type":"number","x-mcp-header":"A"}}}),
            json!({"properties":{"a":{"type":"string","x-mcp-header":""}}}),
            json!({"properties":{"a":{"type":"string","x-mcp-header":"A B"}}}),
            json!({"properties":{"a":{"type":"string","x-mcp-header":"X"},"b":{"type":"string","x-mcp-header":"x"}}}),
            json!({"properties":{"a":{"type":"array","items":{"type":"string","x-mcp-header":"A"}}}}),
            json!({"properties":{"a":{"anyOf":[{"type":"string","x-mcp-header":"A"}]}}}),
        ];
        for schema in bad {
            assert!(param_headers(&schema).is_err(), "{schema}");
        }
    }

    #[test]
    fn a_schema_cannot_multiply_into_memory() {
        let annotated = |n: usize| {
            let props: serde_json::Map<String, Value> = (0..n)
                .map(|i| {
                    (
                        format!("p{i}"),
                        json!({"type":"string","x-mcp-header":format!("H{i}")}),
                    )
                })
                .collect();
            json!({"type":"object","properties":props})
        };
        assert_eq!(
            param_headers(&annotated(MAX_PARAM_HEADERS)).map(|h| h.len()),
            Ok(MAX_PARAM_HEADERS)
        );
        assert!(param_headers(&annotated(MAX_PARAM_HEADERS + 1)).is_err());
        // Each annotation holds its path: under one long property name, a few bytes of
        // schema per annotation would be that name's length in memory per annotation.
        let long = "n".repeat(MAX_PARAM_PATH_BYTES);
        let deep = json!({"properties":{long.clone():{"type":"object","properties":{
            "a":{"type":"string","x-mcp-header":"A"}}}}});
        let refused = param_headers(&deep).expect_err("too deep");
        assert!(refused.len() < 200, "the error is bounded too: {refused}");
        let just = json!({"properties":{long:{"type":"string","x-mcp-header":"A"}}});
        assert!(param_headers(&just).is_ok());
    }

    #[test]
    fn unsafe_values_use_the_base64_sentinel() {
        assert_eq!(encode_value("plain"), "plain");
        assert_eq!(encode_value("héllo"), "=?base64?aMOpbGxv?=");
        assert_eq!(
            encode_value(" lead"),
            format!(
                "=?base64?{}?=",
                base64::engine::general_purpose::STANDARD.encode(" lead")
            )
        );
        assert!(encode_value("=?base64?abc?=").starts_with("=?base64?PT9i"));
        assert!(encode_value("a\nb").starts_with("=?base64?"));
    }
}
