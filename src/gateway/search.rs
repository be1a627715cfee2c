//! Search exposure (`tool_exposure = "search"`): instead of every tool definition, a
//! client's `tools/list` holds three meta-tools: search the caller's tools in plain
//! words, describe one, call one. A client's context then carries three definitions
//! instead of hundreds, and fetches a schema only for the tool it is about to call.
//!
//! Names found are the names the gateway serves (its `prefix` setting), and a tool found
//! may also be called directly by that name. Grants hold as everywhere: search and
//! describe see only the caller's listing, and `call_tool` is an ordinary call.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::util::text::one_line;

/// What `tools/list` serves.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ToolExposure {
    /// Every tool the caller may call, with its whole definition.
    #[default]
    Full,
    /// The three meta-tools only.
    Search,
}

/// Finds tools by what they do.
pub const SEARCH_TOOLS: &str = "search_tools";
/// One tool's whole definition.
pub const DESCRIBE_TOOL: &str = "describe_tool";
/// Calls a tool by the name a search gave.
pub const CALL_TOOL: &str = "call_tool";

/// Results a search returns unless asked for fewer or more.
const DEFAULT_K: u64 = 5;
/// The most results one search returns.
const MAX_K: u64 = 25;
/// Characters of a description shown per result.
const SUMMARY_CHARS: usize = 300;

/// The meta-tools' definitions.
pub fn meta_tools() -> Vec<Value> {
    vec![
        json!({
            "name": SEARCH_TOOLS,
            "title": "Search tools",
            "description": "Find the tools that can do something, described in plain words. Returns the best matches' names and descriptions; call describe_tool for a tool's parameters, then call_tool to run it.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "What the tool should do, in plain words"},
                    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_K, "description": "How many tools to return (default 5)"}
                },
                "required": ["query"]
            },
            "annotations": {"readOnlyHint": true, "openWorldHint": false}
        }),
        json!({
            "name": DESCRIBE_TOOL,
            "title": "Describe a tool",
            "description": "The whole definition of one tool (its inputSchema and all), by the name search_tools returned.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "The tool's name"}
                },
                "required": ["name"]
            },
            "annotations": {"readOnlyHint": true, "openWorldHint": false}
        }),
        json!({
            "name": CALL_TOOL,
            "title": "Call a tool",
            "description": "Calls one tool by the name search_tools returned, with its arguments, and returns its result.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "The tool's name"},
                    "arguments": {"type": "object", "description": "The tool's arguments, as its inputSchema says"}
                },
                "required": ["name"]
            }
        }),
    ]
}

/// A meta-tool's arguments that will not do: the tool's error, in its result, which a
/// model reads and corrects (as the 2025-11-25 revision asks of input errors), not the
/// protocol's.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadArguments(String);

impl BadArguments {
    /// The tool's result that says so.
    pub fn result(&self) -> Value {
        json!({
            "content": [{"type": "text", "text": self.0}],
            "isError": true,
        })
    }
}

fn invalid(message: &str) -> BadArguments {
    BadArguments(message.to_string())
}

/// A search's query and how many results, from `search_tools`' arguments.
pub fn search_args(arguments: &Value) -> Result<(String, usize), BadArguments> {
    let query = arguments
        .get("query")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("search_tools: arguments.query (a string) is required"))?;
    let k = match arguments.get("limit") {
        None | Some(Value::Null) => DEFAULT_K,
        Some(v) => v
            .as_u64()
            .filter(|k| (1..=MAX_K).contains(k))
            .ok_or_else(|| invalid("search_tools: arguments.limit must be 1 to 25"))?,
    };
    Ok((query.to_string(), usize::try_from(k).unwrap_or(5)))
}

/// The name argument of `describe_tool` and `call_tool`.
pub fn name_arg<'a>(tool: &str, arguments: &'a Value) -> Result<&'a str, BadArguments> {
    arguments
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| BadArguments(format!("{tool}: arguments.name (a string) is required")))
}

/// `call_tool`'s params as the `tools/call` of the tool it names: the round fields
/// (`requestState`, `inputResponses`, `_meta`) kept as they came.
pub fn unwrap_call(params: &Value) -> Result<Value, BadArguments> {
    let arguments = params
        .get("arguments")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let name = name_arg(CALL_TOOL, &arguments)?;
    let inner = match arguments.get("arguments") {
        None | Some(Value::Null) => json!({}),
        Some(v @ Value::Object(_)) => v.clone(),
        Some(_) => return Err(invalid("call_tool: arguments.arguments must be an object")),
    };
    let mut out = params.clone();
    if let Some(map) = out.as_object_mut() {
        map.insert("name".into(), json!(name));
        map.insert("arguments".into(), inner);
    }
    Ok(out)
}

/// One search's result: a line per tool for a model to read, and the same as
/// `structuredContent`; `unsearched` servers (not answering, or their list refused) are
/// counted in both, so that a model does not take "no match" for "no such tool".
pub fn search_result(found: &[(String, &Value)], unsearched: usize) -> Value {
    let tools: Vec<Value> = found
        .iter()
        .map(|(name, def)| {
            let description = def.get("description").and_then(Value::as_str).unwrap_or("");
            let mut entry = json!({
                "name": name,
                "description": one_line(description, SUMMARY_CHARS),
            });
            if let Some(title) = def.get("title").and_then(Value::as_str) {
                entry["title"] = json!(one_line(title, 100));
            }
            entry
        })
        .collect();
    let mut text = if tools.is_empty() {
        "No tool matches. Try other words.".to_string()
    } else {
        tools
            .iter()
            .map(|t| {
                format!(
                    "{}: {}",
                    t["name"].as_str().unwrap_or(""),
                    t["description"].as_str().unwrap_or("")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let mut structured = json!({"tools": tools});
    if unsearched > 0 {
        // Servers are not named: with `prefix = "never"` a client is not told them.
        text.push_str(&format!(
            "\n({unsearched} of your servers could not be searched now: a tool of theirs may match. Search again later.)"
        ));
        structured["unsearchedServers"] = json!(unsearched);
    }
    json!({
        "content": [{"type": "text", "text": text}],
        "structuredContent": structured,
        "isError": false,
    })
}

/// `describe_tool`'s result: the definition under its served name.
pub fn describe_result(name: &str, definition: Option<&Value>) -> Value {
    match definition {
        Some(def) => {
            let mut def = def.clone();
            if let Some(map) = def.as_object_mut() {
                map.insert("name".into(), json!(name));
            }
            json!({
                "content": [{"type": "text", "text": def.to_string()}],
                "structuredContent": def,
                "isError": false,
            })
        }
        None => json!({
            "content": [{"type": "text", "text": format!("No tool named {}. Use search_tools to find one.", one_line(name, 64))}],
            "isError": true,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_tool_unwraps_and_keeps_round_fields() {
        let params = json!({
            "name": CALL_TOOL,
            "arguments": {"name": "fs__read", "arguments": {"path": "/x"}},
            "requestState": "sealed",
            "_meta": {"k": 1}
        });
        let inner = unwrap_call(&params).unwrap();
        assert_eq!(inner["name"], "fs__read");
        assert_eq!(inner["arguments"], json!({"path": "/x"}));
        assert_eq!(inner["requestState"], "sealed");
        assert_eq!(inner["_meta"], json!({"k": 1}));
        let bad = json!({"name": CALL_TOOL, "arguments": {"name": "t", "arguments": 3}});
        assert!(unwrap_call(&bad).is_err());
        assert!(unwrap_call(&json!({"name": CALL_TOOL, "arguments": {}})).is_err());
    }

    #[test]
    fn search_args_are_checked() {
        assert_eq!(search_args(&json!({"query": "q"})).unwrap().1, 5);
        assert_eq!(
            search_args(&json!({"query": "q", "limit": 9})).unwrap().1,
            9
        );
        assert!(search_args(&json!({"query": "q", "limit": 0})).is_err());
        assert!(search_args(&json!({"query": "q", "limit": 26})).is_err());
        let missing = search_args(&json!({"limit": 2})).unwrap_err().result();
        assert_eq!(missing["isError"], true);
        assert!(
            missing["content"][0]["text"]
                .as_str()
                .is_some_and(|t| t.contains("arguments.query"))
        );
    }

    #[test]
    fn a_search_that_missed_servers_says_how_many() {
        let def = json!({"description": "Reads a file"});
        let found = [("fs__read".to_string(), &def)];
        let whole = search_result(&found, 0);
        assert!(
            whole["structuredContent"]
                .get("unsearchedServers")
                .is_none()
        );
        let part = search_result(&found, 2);
        assert_eq!(part["structuredContent"]["unsearchedServers"], 2);
        let text = part["content"][0]["text"].as_str().unwrap_or_default();
        assert!(
            text.starts_with("fs__read: Reads a file\n(2 of your servers"),
            "{text}"
        );
    }
}
