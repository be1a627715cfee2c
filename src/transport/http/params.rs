//! The `Mcp-Param-*` headers of one HTTP connection: which tool arguments must be
//! mirrored into headers (their schemas carry `x-mcp-header`), learned from the
//! connection's own `tools/list` pages, and the tools dropped because their
//! annotations are invalid (spec section F).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::RwLock;
use reqwest::header::{HeaderName, HeaderValue};
use serde_json::Value;

use super::headers::{ParamHeader, param_headers, param_value};
use crate::protocol::RequestRef;

/// What one connection knows of its server's `x-mcp-header` annotations.
#[derive(Default)]
pub(super) struct ParamTable {
    /// Whether a `tools/list` was read on this connection (the harness's cache may have
    /// served every listing, so a `tools/call` may be the first thing it sends).
    listed: AtomicBool,
    table: RwLock<HashMap<String, Vec<ParamHeader>>>,
}

impl ParamTable {
    /// Whether `request` is a `tools/call` that needs the table read first.
    pub(super) fn needs_learning(&self, request: RequestRef<'_>) -> bool {
        request.method == "tools/call" && !self.listed.load(Ordering::Relaxed)
    }

    /// Marks the table as read (even when reading it failed: a call must not relist on
    /// every attempt; a -32020 relists on purpose).
    pub(super) fn mark_listed(&self) {
        self.listed.store(true, Ordering::Relaxed);
    }

    /// The `Mcp-Param-*` headers for `request`, from the tool's annotations.
    pub(super) fn headers(&self, request: RequestRef<'_>) -> Vec<(HeaderName, HeaderValue)> {
        if request.method != "tools/call" {
            return Vec::new();
        }
        let Some(params) = request.params else {
            return Vec::new();
        };
        let Some(name) = params.get("name").and_then(Value::as_str) else {
            return Vec::new();
        };
        let table = self.table.read();
        let Some(annotations) = table.get(name) else {
            return Vec::new();
        };
        let arguments = params.get("arguments").unwrap_or(&Value::Null);
        annotations
            .iter()
            .filter_map(|h| {
                let value = param_value(arguments, &h.path)?;
                Some((
                    HeaderName::from_bytes(format!("mcp-param-{}", h.name).as_bytes()).ok()?,
                    HeaderValue::from_str(&value).ok()?,
                ))
            })
            .collect()
    }

    /// Reads one `tools/list` page: remembers each tool's annotations and drops the tools
    /// whose annotations are invalid, with a warning. A `first` page (no cursor) starts
    /// the table afresh, so that it holds one listing's tools, not every name the
    /// server ever listed.
    pub(super) fn absorb(&self, server: &str, page: &mut Value, first: bool) {
        self.mark_listed();
        let mut table = self.table.write();
        if first {
            table.clear();
        }
        let Some(tools) = page.get_mut("tools").and_then(Value::as_array_mut) else {
            return;
        };
        tools.retain(|tool| {
            let name = tool.get("name").and_then(Value::as_str).unwrap_or_default();
            let schema = tool.get("inputSchema").unwrap_or(&Value::Null);
            match param_headers(schema) {
                Ok(found) => {
                    if found.is_empty() {
                        table.remove(name);
                    } else {
                        table.insert(name.to_string(), found);
                    }
                    true
                }
                Err(reason) => {
                    tracing::warn!(server, tool = %name.escape_debug(), %reason, "dropping tool with invalid x-mcp-header");
                    table.remove(name);
                    false
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn tool(name: &str) -> Value {
        json!({"name": name, "inputSchema": {"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"}}}})
    }

    #[test]
    fn a_listing_from_its_first_page_replaces_what_the_table_held() {
        let table = ParamTable::default();
        table.absorb("s", &mut json!({"tools": [tool("a"), tool("b")]}), true);
        table.absorb("s", &mut json!({"tools": [tool("c")]}), false);
        assert_eq!(table.table.read().len(), 3, "later pages add");
        // A server listing new names every time leaves one listing's worth.
        for round in 0..100 {
            let page = json!({"tools": [tool(&format!("t{round}"))]});
            table.absorb("s", &mut page.clone(), true);
        }
        assert_eq!(table.table.read().keys().collect::<Vec<_>>(), ["t99"]);
    }
}
