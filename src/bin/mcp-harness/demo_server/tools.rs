//! The demo server's tools, prompts and resources, including its fault knobs.

use std::time::Duration;

use mcp_harness::protocol::error::{INVALID_PARAMS, MISSING_CLIENT_CAPABILITY};
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
    "endless_stream",
    "broken_stream",
];

fn tool(name: &str, description: &str, properties: Value, required: &[&str]) -> Value {
    json!({"name": name, "description": description,
           "inputSchema": {"type": "object", "properties": properties, "required": required}})
}

fn annotated(mut tool: Value, annotations: Value) -> Value {
    tool["annotations"] = annotations;
    tool
}

/// Every tool, in a deterministic order.
pub fn catalog(args: &DemoServerArgs) -> Vec<Value> {
    let s = |d: &str| json!({"type": "string", "description": d});
    let i = |d: &str| json!({"type": "integer", "description": d});
    let mut tools = vec![
        tool(
            "echo",
            &format!("Echoes text back ({})", args.name),
            json!({"text": s("text to echo")}),
            &["text"],
        ),
        tool(
            "add",
            "Adds two integers",
            json!({"a": i("first"), "b": i("second")}),
            &["a", "b"],
        ),
        annotated(
            tool(
                "slow",
                "Echoes text after a delay (read-only)",
                json!({"ms": i("delay in milliseconds"), "text": s("text")}),
                &["ms"],
            ),
            json!({"readOnlyHint": true}),
        ),
        annotated(
            tool(
                "server_name",
                "Returns this server's name (read-only)",
                json!({}),
                &[],
            ),
            json!({"readOnlyHint": true, "idempotentHint": true}),
        ),
        tool(
            "rogue_request",
            "Sends a request to the client, even in modern mode",
            json!({}),
            &[],
        ),
        tool(
            "grow",
            "Adds a tool to this server's list and sends list_changed (legacy)",
            json!({}),
            &[],
        ),
        tool(
            "batch",
            "Answers with a JSON-RPC batch (an array)",
            json!({}),
            &[],
        ),
        tool(
            "orphan_stdout",
            "Exits, leaving a child that holds stdout open",
            json!({}),
            &[],
        ),
        tool(
            "wrong_id",
            "Answers with an id that was never sent",
            json!({}),
            &[],
        ),
        tool("duplicate", "Answers twice", json!({}), &[]),
        tool(
            "both",
            "Answers with result and error together",
            json!({}),
            &[],
        ),
        tool(
            "partial_eof",
            "Writes half a line, then exits",
            json!({}),
            &[],
        ),
        tool(
            "empty_input_required",
            "input_required with neither inputRequests nor requestState",
            json!({}),
            &[],
        ),
        tool(
            "task_result",
            "Answers with resultType task (not negotiated)",
            json!({}),
            &[],
        ),
        tool(
            "freeze",
            "Stops answering anything for ms milliseconds",
            json!({"ms": i("how long")}),
            &[],
        ),
        tool("hang", "Never answers", json!({}), &[]),
        tool(
            "garbage",
            "Answers with bytes that are not JSON-RPC",
            json!({}),
            &[],
        ),
        tool(
            "oversize",
            "Answers with one huge line",
            json!({"bytes": i("size of the line")}),
            &["bytes"],
        ),
        tool(
            "crash",
            "Exits the server process without answering",
            json!({"code": i("exit status (default 3)")}),
            &[],
        ),
        tool(
            "close_stdout",
            "Closes stdout and keeps running",
            json!({}),
            &[],
        ),
        tool(
            "confirm",
            "Asks the user to approve (elicitation)",
            json!({"message": s("what to approve")}),
            &[],
        ),
        tool(
            "rounds",
            "Asks N questions, one round each",
            json!({"n": i("number of rounds")}),
            &["n"],
        ),
        tool("forever", "Asks for input forever", json!({}), &[]),
        tool(
            "notify_changed",
            "Sends tools/list_changed (legacy)",
            json!({}),
            &[],
        ),
        tool(
            "progress",
            "Sends progress notifications, then answers",
            json!({"steps": i("how many")}),
            &[],
        ),
        tool(
            "whoami",
            "Returns the request's _meta and HTTP headers",
            json!({}),
            &[],
        ),
        tool(
            "region_echo",
            "Echoes the Mcp-Param-Region header it received",
            json!({"region": {"type": "string", "x-mcp-header": "Region"}}),
            &["region"],
        ),
        tool(
            "bad_header",
            "Has an invalid x-mcp-header annotation (HTTP clients drop it)",
            json!({"n": {"type": "number", "x-mcp-header": "N"}}),
            &[],
        ),
        tool(
            "http_status",
            "HTTP only: answers with this status",
            json!({"status": i("status")}),
            &["status"],
        ),
        tool(
            "wrong_content_type",
            "HTTP only: answers text/html",
            json!({}),
            &[],
        ),
        tool(
            "endless_stream",
            "HTTP only: an event stream that never ends",
            json!({}),
            &[],
        ),
        tool(
            "expire_session",
            "HTTP legacy only: forgets the session after answering",
            json!({}),
            &[],
        ),
    ];
    for n in 0..args.extra_tools {
        tools.push(tool(
            &format!("gen_{n}"),
            "A generated tool that echoes",
            json!({"text": s("text")}),
            &[],
        ));
    }
    tools
}

fn text(t: impl Into<String>) -> Value {
    json!({"content": [{"type": "text", "text": t.into()}], "isError": false})
}

fn arg<'a>(request: &'a Request, name: &str) -> Option<&'a Value> {
    request.params.as_ref()?.get("arguments")?.get(name)
}

fn params_field<'a>(request: &'a Request, name: &str) -> Option<&'a Value> {
    request.params.as_ref()?.get(name)
}

fn need_elicitation(ctx: &Ctx, request: &Request) -> Result<(), RpcError> {
    if ctx.legacy
        || ctx
            .capabilities(request)
            .is_some_and(|c| c.get("elicitation").is_some())
    {
        return Ok(());
    }
    Err(
        RpcError::new(MISSING_CLIENT_CAPABILITY, "this tool needs elicitation")
            .with_data(json!({"requiredCapabilities": {"elicitation": {}}})),
    )
}

fn form(message: &str, properties: Value, required: &[&str]) -> Value {
    json!({"method": "elicitation/create", "params": {"mode": "form", "message": message,
        "requestedSchema": {"type": "object", "properties": properties, "required": required}}})
}

/// Runs one `tools/call`.
pub async fn call(server: &DemoServer, request: &Request, ctx: &Ctx) -> Action {
    let name = params_field(request, "name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let reply = |r: Result<Value, RpcError>| Action::Reply(r);
    match name {
        "echo" | "slow" => {
            if let Some(ms) = arg(request, "ms").and_then(Value::as_u64) {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            reply(Ok(text(
                arg(request, "text").and_then(Value::as_str).unwrap_or(""),
            )))
        }
        "add" => match (
            arg(request, "a").and_then(Value::as_i64),
            arg(request, "b").and_then(Value::as_i64),
        ) {
            (Some(a), Some(b)) => reply(Ok(text(a.saturating_add(b).to_string()))),
            _ => reply(Ok(
                json!({"content": [{"type": "text", "text": "a and b must be integers"}], "isError": true}),
            )),
        },
        "hang" => Action::NoReply,
        "garbage" => Action::Garbage,
        "oversize" => Action::Oversize(
            arg(request, "bytes")
                .and_then(Value::as_u64)
                .unwrap_or(1 << 20) as usize,
        ),
        "crash" => Action::Exit(arg(request, "code").and_then(Value::as_i64).unwrap_or(3) as i32),
        "close_stdout" => Action::CloseStdout,
        "confirm" => confirm(request, ctx).await,
        "rounds" => rounds(request, ctx).await,
        "forever" if !ctx.legacy => reply(Ok(
            json!({"resultType": "input_required", "requestState": "forever"}),
        )),
        "notify_changed" => {
            ctx.broadcast
                .as_ref()
                .unwrap_or(&ctx.peer)
                .notify("notifications/tools/list_changed", json!({}));
            reply(Ok(text("sent tools/list_changed")))
        }
        "progress" => {
            let token = params_field(request, "_meta")
                .and_then(|m| m.get("progressToken"))
                .cloned();
            let steps = arg(request, "steps").and_then(Value::as_u64).unwrap_or(3);
            if let Some(token) = token {
                for step in 1..=steps {
                    ctx.peer.notify(
                        "notifications/progress",
                        json!({"progressToken": token, "progress": step, "total": steps}),
                    );
                }
            }
            reply(Ok(text(format!("{steps} steps done"))))
        }
        "whoami" => {
            let info = json!({"meta": params_field(request, "_meta"), "headers": ctx.headers});
            reply(Ok(
                json!({"content": [{"type": "text", "text": info.to_string()}], "structuredContent": info, "isError": false}),
            ))
        }
        "region_echo" => reply(Ok(text(
            ctx.headers
                .get("mcp-param-region")
                .cloned()
                .unwrap_or_default(),
        ))),
        "http_status" => Action::HttpStatus(
            arg(request, "status")
                .and_then(Value::as_u64)
                .unwrap_or(500) as u16,
        ),
        "wrong_content_type" => Action::WrongContentType,
        "endless_stream" => Action::EndlessStream,
        "broken_stream" => Action::BrokenStream,
        "orphan_stdout" => {
            // A descendant keeps our stdout open while we exit: no EOF for the client.
            let child = std::process::Command::new("sleep")
                .arg("3600")
                .stdin(std::process::Stdio::null())
                .spawn();
            Action::Exit(if child.is_ok() { 0 } else { 1 })
        }
        "server_name" => reply(Ok(text(server.args.name.clone()))),
        "batch" => {
            Action::RawLine(r#"[{"jsonrpc":"2.0","id":{id},"result":{"content":[]}}]"#.into())
        }
        "wrong_id" => {
            Action::RawLine(r#"{"jsonrpc":"2.0","id":987654321,"result":{"content":[]}}"#.into())
        }
        "duplicate" => Action::RawLine(
            r#"{"jsonrpc":"2.0","id":{id},"result":{"content":[{"type":"text","text":"once"}]}}
{"jsonrpc":"2.0","id":{id},"result":{"content":[{"type":"text","text":"twice"}]}}"#
                .into(),
        ),
        "both" => Action::RawLine(
            r#"{"jsonrpc":"2.0","id":{id},"result":{},"error":{"code":1,"message":"both"}}"#.into(),
        ),
        "partial_eof" => Action::RawThenExit(r#"{"jsonrpc":"2.0","id":{id},"res"#.into()),
        "empty_input_required" => reply(Ok(json!({"resultType": "input_required"}))),
        "task_result" => reply(Ok(json!({"resultType": "task", "taskId": "t1"}))),
        "freeze" => {
            let ms = arg(request, "ms").and_then(Value::as_u64).unwrap_or(1000);
            *server.frozen_until.lock() =
                Some(std::time::Instant::now() + Duration::from_millis(ms));
            reply(Ok(text(format!("frozen for {ms} ms"))))
        }
        "grow" => {
            let n = server
                .grown
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
                + 1;
            ctx.peer
                .notify("notifications/tools/list_changed", json!({}));
            reply(Ok(text(format!("{n} tools added"))))
        }
        "rogue_request" => {
            // A modern server must not send requests; this one does, to test clients.
            let verdict = match ctx.peer.request("roots/list", json!({})).await {
                Ok(_) => "client answered".to_string(),
                Err(e) => format!("client refused: {}", e.code),
            };
            reply(Ok(text(verdict)))
        }
        "expire_session" => Action::ExpireSession,
        n if n.starts_with("gen_")
            && n[4..]
                .parse::<usize>()
                .is_ok_and(|i| i < server.args.extra_tools) =>
        {
            reply(Ok(text(
                arg(request, "text").and_then(Value::as_str).unwrap_or(n),
            )))
        }
        other => reply(Err(RpcError::new(
            INVALID_PARAMS,
            format!("unknown tool {other:?}"),
        ))),
    }
}

/// The state `confirm` hands out; it has quotes, backslashes and non-ASCII so that an
/// echo that is not exact shows.
fn confirm_state(message: &str) -> String {
    format!("confirm-v1|{message}|ünïcode \"quoted\" \\slash")
}

async fn confirm(request: &Request, ctx: &Ctx) -> Action {
    if let Err(e) = need_elicitation(ctx, request) {
        return Action::Reply(Err(e));
    }
    let message = arg(request, "message")
        .and_then(Value::as_str)
        .unwrap_or("Proceed?")
        .to_string();
    let schema =
        json!({"approved": {"type": "boolean", "default": false}, "note": {"type": "string"}});
    let answer = if ctx.legacy {
        let params = form(&message, schema, &["approved"])["params"].clone();
        match ctx.peer.request("elicitation/create", params).await {
            Ok(answer) => answer,
            Err(e) => return Action::Reply(Err(e)),
        }
    } else {
        let responses = params_field(request, "inputResponses");
        let Some(answer) = responses.and_then(|r| r.get("confirm")) else {
            return Action::Reply(Ok(json!({"resultType": "input_required",
                "inputRequests": {"confirm": form(&message, schema, &["approved"])},
                "requestState": confirm_state(&message)})));
        };
        let state = params_field(request, "requestState").and_then(Value::as_str);
        if state != Some(confirm_state(&message).as_str()) {
            return Action::Reply(Err(RpcError::new(
                INVALID_PARAMS,
                "requestState was not echoed exactly",
            )));
        }
        answer.clone()
    };
    let verdict = match answer.get("action").and_then(Value::as_str) {
        Some("accept") => {
            let approved = answer
                .get("content")
                .and_then(|c| c.get("approved"))
                .and_then(Value::as_bool)
                .unwrap_or(false);
            format!("approved: {approved}")
        }
        Some(other) => format!("not approved ({other})"),
        None => "not approved (no answer)".into(),
    };
    Action::Reply(Ok(text(verdict)))
}

async fn rounds(request: &Request, ctx: &Ctx) -> Action {
    if let Err(e) = need_elicitation(ctx, request) {
        return Action::Reply(Err(e));
    }
    let n = arg(request, "n")
        .and_then(Value::as_u64)
        .unwrap_or(1)
        .clamp(1, 50);
    let question = |k: u64| {
        form(
            &format!("Question {}", k + 1),
            json!({"answer": {"type": "string"}}),
            &["answer"],
        )
    };
    let pick = |v: &Value| {
        v.get("content")
            .and_then(|c| c.get("answer"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let mut answers: Vec<String> = Vec::new();
    if ctx.legacy {
        for k in 0..n {
            match ctx
                .peer
                .request("elicitation/create", question(k)["params"].clone())
                .await
            {
                Ok(a) => answers.push(pick(&a)),
                Err(e) => return Action::Reply(Err(e)),
            }
        }
    } else {
        // State: "rounds|<k>|<answers so far, \u{1f}-separated>"; opaque to the client.
        let state = params_field(request, "requestState").and_then(Value::as_str);
        let mut k = 0;
        if let Some(state) = state {
            let mut parts = state.splitn(3, '|');
            let (Some("rounds"), Some(done), rest) = (parts.next(), parts.next(), parts.next())
            else {
                return Action::Reply(Err(RpcError::new(INVALID_PARAMS, "bad requestState")));
            };
            k = done.parse().unwrap_or(0);
            answers = rest
                .filter(|r| !r.is_empty())
                .map(|r| r.split('\u{1f}').map(String::from).collect())
                .unwrap_or_default();
            let key = format!("q{k}");
            // Without an answer the same question is asked again.
            if let Some(a) = params_field(request, "inputResponses").and_then(|r| r.get(&key)) {
                answers.push(pick(a));
                k += 1;
            }
        }
        if k < n {
            let key = format!("q{k}");
            return Action::Reply(Ok(json!({"resultType": "input_required",
                "inputRequests": {key: question(k)},
                "requestState": format!("rounds|{k}|{}", answers.join("\u{1f}"))})));
        }
    }
    Action::Reply(Ok(text(format!("answers: {}", answers.join(",")))))
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

pub fn read_resource(request: &Request) -> Result<Value, RpcError> {
    match params_field(request, "uri").and_then(Value::as_str) {
        Some("demo://readme") => Ok(json!({"contents": [
            {"uri": "demo://readme", "mimeType": "text/plain", "text": "This server ships with mcp-harness."}]})),
        Some(other) => Err(RpcError::new(
            INVALID_PARAMS,
            format!("resource not found: {other}"),
        )),
        None => Err(RpcError::new(INVALID_PARAMS, "uri required")),
    }
}
