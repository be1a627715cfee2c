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

/// The most tools whose annotations one connection keeps (real servers list dozens).
const MAX_ANNOTATED_TOOLS: usize = 10_000;
/// The most bytes of tool names, header names and paths it keeps: each tool's own
/// bounds (64 annotations of up to 1 KiB paths) would let 10,000 tools hold 700 MB.
const MAX_ANNOTATED_BYTES: usize = 8 << 20;

/// The annotations kept, by tool name, and their size in bytes.
#[derive(Default)]
struct Annotated {
    tools: HashMap<String, Vec<ParamHeader>>,
    bytes: usize,
}

impl Annotated {
    /// What an entry holds in memory: its strings, and each `String`'s and `Vec`'s own
    /// bytes besides.
    fn size(name: &str, headers: &[ParamHeader]) -> usize {
        const OWN: usize = std::mem::size_of::<String>();
        headers.iter().fold(name.len() + 2 * OWN, |n, h| {
            n + h.name.len() + 2 * OWN + h.path.iter().map(|p| p.len() + OWN).sum::<usize>()
        })
    }

    fn insert(&mut self, name: &str, headers: Vec<ParamHeader>) {
        self.remove(name);
        self.bytes += Self::size(name, &headers);
        self.tools.insert(name.to_string(), headers);
    }

    fn remove(&mut self, name: &str) {
        if let Some(old) = self.tools.remove(name) {
            self.bytes = self.bytes.saturating_sub(Self::size(name, &old));
        }
    }
}

/// What one connection knows of its server's `x-mcp-header` annotations.
#[derive(Default)]
pub(super) struct ParamTable {
    /// Whether a `tools/list` was read on this connection (the harness's cache may have
    /// served every listing, so a `tools/call` may be the first thing it sends).
    listed: AtomicBool,
    table: RwLock<Annotated>,
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
        let Some(annotations) = table.tools.get(name) else {
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
    /// whose annotations are invalid, with a warning. The table holds at most
    /// [`MAX_ANNOTATED_TOOLS`] names and [`MAX_ANNOTATED_BYTES`]: a server listing new
    /// names all the time, or long ones, has it start afresh (its calls then relearn on
    /// -32020) instead of growing it forever.
    pub(super) fn absorb(&self, server: &str, page: &mut Value) {
        self.mark_listed();
        let Some(tools) = page.get_mut("tools").and_then(Value::as_array_mut) else {
            return;
        };
        let learned: Vec<Result<Vec<ParamHeader>, String>> = tools
            .iter()
            .map(|tool| param_headers(tool.get("inputSchema").unwrap_or(&Value::Null)))
            .collect();
        let name_of = |tool: &Value| -> String {
            tool.get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let page_bytes: usize = tools
            .iter()
            .zip(&learned)
            .filter_map(|(tool, found)| {
                let found = found.as_ref().ok().filter(|f| !f.is_empty())?;
                Some(Annotated::size(&name_of(tool), found))
            })
            .sum();
        let mut table = self.table.write();
        // What the page replaces (a page listed again) is freed by it.
        let named: std::collections::HashSet<String> = tools.iter().map(name_of).collect();
        let (replaced, replaced_bytes) = named
            .iter()
            .filter_map(|name| table.tools.get(name).map(|h| Annotated::size(name, h)))
            .fold((0, 0), |(n, b), size| (n + 1, b + size));
        // What the page adds: its annotated tools (the others take no room).
        let annotated: std::collections::HashSet<String> = tools
            .iter()
            .zip(&learned)
            .filter(|(_, found)| found.as_ref().is_ok_and(|f| !f.is_empty()))
            .map(|(tool, _)| name_of(tool))
            .collect();
        // Checked for the page as a whole, before any of it is kept: a walk's earlier
        // tools are not lost half way through a page.
        if table.tools.len() - replaced + annotated.len() > MAX_ANNOTATED_TOOLS
            || table.bytes.saturating_sub(replaced_bytes) + page_bytes > MAX_ANNOTATED_BYTES
        {
            tracing::warn!(
                server,
                "more annotated tools than are kept; the table starts afresh"
            );
            *table = Annotated::default();
        }
        let mut full = false;
        let mut learned = learned.into_iter();
        tools.retain(|tool| {
            let name = name_of(tool);
            match learned.next() {
                Some(Ok(found)) if found.is_empty() => table.remove(&name),
                Some(Ok(found)) => {
                    // A page larger than the whole table: the rest is not learned (its
                    // calls go without their headers, and a -32020 says so).
                    table.remove(&name);
                    if table.bytes + Annotated::size(&name, &found) > MAX_ANNOTATED_BYTES {
                        full = true;
                    } else {
                        table.insert(&name, found);
                    }
                }
                Some(Err(reason)) => {
                    // One per tool of every page listed: budgeted, the name cut.
                    static DROPPED: crate::util::log_budget::LogBudget =
                        crate::util::log_budget::LogBudget::new();
                    if let Some(dropped) = DROPPED.log() {
                        tracing::warn!(server, tool = %crate::util::text::one_line(&name, 100), %reason, dropped, "dropping tool with invalid x-mcp-header");
                    }
                    table.remove(&name);
                    return false;
                }
                None => {}
            }
            true
        });
        if full {
            tracing::warn!(
                server,
                "a tools/list page holds more annotations than are kept; the rest are not"
            );
        }
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
    fn the_table_is_bounded_in_bytes_too() {
        // 64 annotations a tool, each under a parent of 1,000 bytes: ~70 KB kept per
        // tool from ~4 KB of schema.
        let parent = "p".repeat(1000);
        let heavy_as = |name: &str, header: &str| {
            let children: serde_json::Map<String, Value> = (0..64)
                .map(|i| {
                    (
                        format!("c{i}"),
                        json!({"type": "string", "x-mcp-header": format!("{header}{i}")}),
                    )
                })
                .collect();
            json!({"name": name, "inputSchema": {"type": "object", "properties": {
                parent.clone(): {"type": "object", "properties": children}}}})
        };
        let heavy = |name: &str| heavy_as(name, "H");
        let table = ParamTable::default();
        for page in 0..30 {
            let tools: Vec<Value> = (0..10).map(|i| heavy(&format!("t{page}-{i}"))).collect();
            table.absorb("s", &mut json!({ "tools": tools }));
            let kept = table.table.read();
            // A page is kept whole: the table starts afresh before it, not half way.
            for i in 0..10 {
                assert!(kept.tools.contains_key(&format!("t{page}-{i}")));
            }
            let counted: usize = kept
                .tools
                .iter()
                .map(|(name, h)| Annotated::size(name, h))
                .sum();
            assert_eq!(kept.bytes, counted);
            assert!(kept.bytes <= MAX_ANNOTATED_BYTES, "{} bytes", kept.bytes);
        }
        // A tool listed again replaces its own entry: a table too full for one more new
        // tool neither starts afresh for it nor keeps its old annotations.
        let table = ParamTable::default();
        let mut n = 0;
        loop {
            table.absorb("s", &mut json!({ "tools": [heavy(&format!("r{n}"))] }));
            let bytes = table.table.read().bytes;
            if bytes + bytes / (n + 1) > MAX_ANNOTATED_BYTES {
                break;
            }
            n += 1;
        }
        let before = table.table.read().tools.len();
        // Listed again with its annotations renamed: the new ones replace the old.
        table.absorb(
            "s",
            &mut json!({ "tools": [heavy_as(&format!("r{n}"), "G")] }),
        );
        let kept = table.table.read();
        assert_eq!(kept.tools.len(), before, "kept whole");
        assert_eq!(kept.tools[&format!("r{n}")][0].name, "G0", "learned anew");
        drop(kept);
        // A header name past its bound makes the tool invalid: it is dropped.
        let long = json!({"name": "long", "inputSchema": {"type": "object", "properties": {
            "x": {"type": "string", "x-mcp-header": "N".repeat(300)}}}});
        let mut page = json!({ "tools": [long, tool("ok")] });
        table.absorb("s", &mut page);
        assert_eq!(page["tools"].as_array().map(Vec::len), Some(1));
    }

    #[test]
    fn the_table_keeps_every_page_and_never_grows_past_its_bound() {
        let table = ParamTable::default();
        table.absorb("s", &mut json!({"tools": [tool("a"), tool("b")]}));
        table.absorb("s", &mut json!({"tools": [tool("c")]}));
        assert_eq!(table.table.read().tools.len(), 3, "later pages add");
        // A server listing new names every time.
        for round in 0..MAX_ANNOTATED_TOOLS / 100 + 5 {
            let tools: Vec<Value> = (0..100).map(|i| tool(&format!("t{round}-{i}"))).collect();
            table.absorb("s", &mut json!({ "tools": tools }));
            assert!(table.table.read().tools.len() <= MAX_ANNOTATED_TOOLS);
        }
    }

    #[test]
    fn tools_without_annotations_take_no_room() {
        let table = ParamTable::default();
        let annotated: Vec<Value> = (0..MAX_ANNOTATED_TOOLS - 100)
            .map(|i| tool(&format!("a{i}")))
            .collect();
        table.absorb("s", &mut json!({ "tools": annotated }));
        // A last page of many plain tools: the annotated ones are kept.
        let plain: Vec<Value> = (0..2000)
            .map(|i| json!({"name": format!("p{i}"), "inputSchema": {"type": "object"}}))
            .collect();
        table.absorb("s", &mut json!({ "tools": plain }));
        assert_eq!(table.table.read().tools.len(), MAX_ANNOTATED_TOOLS - 100);
    }
}
