//! The demo server's tools, prompts and resources, including its fault knobs: one file
//! per group ([`basic`], [`faults`], [`input`]), each with its part of the catalog and
//! of `tools/call`.

mod basic;
mod faults;
mod input;

use mcp_harness::protocol::error::INVALID_PARAMS;
use mcp_harness::protocol::{Request, RpcError};
use serde_json::{Value, json};

use super::DemoServerArgs;
use super::core::{Action, Ctx, DemoServer};

/// Tools whose HTTP reply must be an event stream (they send messages before the result).
pub const STREAMING_TOOLS: &[&str] = &[
    "progress",
    "confirm",
    "rounds",
    "notify_changed",
    "notify_flood",
    "endless_stream",
    "broken_stream",
    "ask_many",
    "ask_then_return",
    "summarize",
    "list_roots",
];

/// A tool definition.
fn tool(name: &str, description: &str, properties: Value, required: &[&str]) -> Value {
    json!({"name": name, "description": description,
           "inputSchema": {"type": "object", "properties": properties, "required": required}})
}

fn annotated(mut tool: Value, annotations: Value) -> Value {
    tool["annotations"] = annotations;
    tool
}

fn s(description: &str) -> Value {
    json!({"type": "string", "description": description})
}

fn i(description: &str) -> Value {
    json!({"type": "integer", "description": description})
}

/// Every tool, in a deterministic order; `elicitation` says whether the client declared
/// it (with `--tools-need-elicitation`, the tools that ask are listed only then).
pub fn catalog(args: &DemoServerArgs, elicitation: bool) -> Vec<Value> {
    let mut tools = basic::tools(args);
    tools.extend(faults::tools());
    tools.extend(input::tools(!args.tools_need_elicitation || elicitation));
    for n in 0..args.extra_tools {
        tools.push(tool(
            &format!("gen_{n}"),
            "A generated tool that echoes",
            json!({"text": s("text")}),
            &[],
        ));
    }
    for alias in &args.tool_alias {
        tools.push(tool(
            alias,
            "Answers with this server's name",
            // A header-bound argument, as a tool of that name elsewhere may have.
            json!({"query": {"type": "string", "x-mcp-header": "Query"}}),
            &[],
        ));
    }
    // Marked for a client that may send them to another server after a failure.
    for t in &mut tools {
        if args
            .idempotent
            .iter()
            .any(|n| Some(n.as_str()) == t["name"].as_str())
        {
            t["annotations"] = json!({"idempotentHint": true});
        }
    }
    tools
}

pub(super) fn text(t: impl Into<String>) -> Value {
    json!({"content": [{"type": "text", "text": t.into()}], "isError": false})
}

pub(super) fn arg<'a>(request: &'a Request, name: &str) -> Option<&'a Value> {
    request.params.as_ref()?.get("arguments")?.get(name)
}

pub(super) fn params_field<'a>(request: &'a Request, name: &str) -> Option<&'a Value> {
    request.params.as_ref()?.get(name)
}

/// Runs one `tools/call`.
pub async fn call(server: &DemoServer, request: &Request, ctx: &Ctx) -> Action {
    let name = params_field(request, "name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if let Some(action) = basic::call(server, name, request, ctx).await {
        return action;
    }
    if let Some(action) = faults::call(server, name, request, ctx).await {
        return action;
    }
    if let Some(action) = input::call(server, name, request, ctx).await {
        return action;
    }
    Action::Reply(Err(RpcError::new(
        INVALID_PARAMS,
        format!("unknown tool {name:?}"),
    )))
}

pub fn get_prompt(request: &Request) -> Result<Value, RpcError> {
    let who = params_field(request, "arguments")
        .and_then(|a| a.get("who"))
        .and_then(Value::as_str)
        .unwrap_or("world");
    match params_field(request, "name").and_then(Value::as_str) {
        Some("greet") => Ok(json!({"description": "A greeting", "messages": [
            {"role": "user", "content": {"type": "text", "text": format!("Say hello to {who}.")}}]})),
        _ => Err(RpcError::new(INVALID_PARAMS, "unknown prompt")),
    }
}

/// The resource templates: `demo://echo/{text}` with `template`, and `listed` (served
/// or not).
pub fn resource_templates(template: bool, listed: &[String]) -> Value {
    let mut templates = Vec::new();
    if template {
        templates.push(json!({"uriTemplate": "demo://echo/{text}", "name": "echo",
            "description": "Its own text", "mimeType": "text/plain"}));
    }
    for (i, t) in listed.iter().enumerate() {
        templates.push(json!({"uriTemplate": t, "name": format!("listed-{i}")}));
    }
    json!({ "resourceTemplates": templates })
}

/// `demo://readme`, and with `template` any `demo://echo/TEXT` (a template's, not listed).
pub fn read_resource(request: &Request, template: bool) -> Result<Value, RpcError> {
    match params_field(request, "uri").and_then(Value::as_str) {
        Some("demo://readme") => Ok(json!({"contents": [
            {"uri": "demo://readme", "mimeType": "text/plain", "text": "This server ships with mcp-harness."}]})),
        Some(uri) if template && uri.starts_with("demo://echo/") => Ok(json!({"contents": [
            {"uri": uri, "mimeType": "text/plain", "text": &uri["demo://echo/".len()..]}]})),
        Some(other) => Err(RpcError::new(
            INVALID_PARAMS,
            format!("resource not found: {other}"),
        )),
        None => Err(RpcError::new(INVALID_PARAMS, "uri required")),
    }
}
