//! Tools that work: echo, arithmetic, identity, environment, list changes, progress.

use std::sync::atomic::Ordering;
use std::time::Duration;

use mcp_harness::protocol::Request;
use serde_json::{Value, json};

use super::{DemoServerArgs, annotated, arg, i, params_field, s, text, tool};
use crate::demo_server::core::{Action, Ctx, DemoServer};

/// The most notifications one flooding call sends: a flood, not a process out of memory.
const MOST_MESSAGES: u64 = 1_000_000;

pub fn tools(args: &DemoServerArgs) -> Vec<Value> {
    vec![
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
            "grow",
            "Adds a tool to this server's list and sends list_changed",
            json!({}),
            &[],
        ),
        tool(
            "notify_changed",
            "Sends tools/list_changed (legacy), or another list's",
            json!({"list": s("tools (the default), prompts or resources")}),
            &[],
        ),
        tool(
            "notify_flood",
            "Sends tools/list_changed n times at once (legacy)",
            json!({"n": i("how many")}),
            &["n"],
        ),
        tool(
            "progress",
            "Sends progress notifications, then answers",
            json!({"steps": i("how many"), "message_bytes": i("a message this long on each"), "pause_every": i("a 1 ms pause after this many")}),
            &[],
        ),
        tool(
            "whoami",
            "Returns the request's _meta and HTTP headers",
            json!({}),
            &[],
        ),
        tool(
            "env",
            "Returns this process's environment variables",
            json!({}),
            &[],
        ),
        tool(
            "cwd",
            "Returns this process's working directory",
            json!({}),
            &[],
        ),
        tool(
            "region_echo",
            "Echoes the Mcp-Param-Region header it received (asking first, with \"ask\": true)",
            json!({"region": {"type": "string", "x-mcp-header": "Region"}}),
            &["region"],
        ),
        tool(
            "bad_header",
            "Has an invalid x-mcp-header annotation (HTTP clients drop it)",
            json!({"n": {"type": "number", "x-mcp-header": "N"}}),
            &[],
        ),
    ]
}

pub async fn call(server: &DemoServer, name: &str, request: &Request, ctx: &Ctx) -> Option<Action> {
    let reply = |r| Some(Action::Reply(Ok(r)));
    match name {
        "echo" | "slow" => {
            if let Some(ms) = arg(request, "ms").and_then(Value::as_u64) {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            let said = arg(request, "text").and_then(Value::as_str).unwrap_or("");
            // Not in the schema: a large result from a small request, for tests.
            match arg(request, "times").and_then(Value::as_u64) {
                Some(n) if !said.is_empty() => {
                    // At most 8 MiB: within a message's 16 MiB once written as JSON
                    // (for text that needs no escapes).
                    let n = n.min((8 << 20) / said.len() as u64) as usize;
                    reply(text(said.repeat(n)))
                }
                _ => reply(text(said)),
            }
        }
        "add" => match (
            arg(request, "a").and_then(Value::as_i64),
            arg(request, "b").and_then(Value::as_i64),
        ) {
            (Some(a), Some(b)) => reply(text(a.saturating_add(b).to_string())),
            _ => reply(
                json!({"content": [{"type": "text", "text": "a and b must be integers"}], "isError": true}),
            ),
        },
        "server_name" => reply(text(server.args.name.clone())),
        n if server.args.tool_alias.iter().any(|a| a == n) => reply(text(server.args.name.clone())),
        "grow" => {
            let n = server.grown.fetch_add(1, Ordering::SeqCst) + 1;
            // Modern servers announce changes on subscriptions only.
            if ctx.legacy {
                ctx.peer
                    .notify("notifications/tools/list_changed", json!({}));
            } else {
                server.tools_changed();
            }
            reply(text(format!("{n} tools added")))
        }
        "notify_changed" => {
            let list = match arg(request, "list").and_then(Value::as_str) {
                Some("prompts") => "prompts",
                Some("resources") => "resources",
                _ => "tools",
            };
            ctx.broadcast
                .as_ref()
                .unwrap_or(&ctx.peer)
                .notify(&format!("notifications/{list}/list_changed"), json!({}));
            reply(text(format!("sent {list}/list_changed")))
        }
        "notify_flood" => {
            let n = arg(request, "n")
                .and_then(Value::as_u64)
                .unwrap_or(100)
                .min(MOST_MESSAGES);
            let peer = ctx.broadcast.as_ref().unwrap_or(&ctx.peer);
            for _ in 0..n {
                peer.notify("notifications/tools/list_changed", json!({}));
            }
            reply(text(format!("sent {n} list_changed")))
        }
        "progress" => {
            let token = params_field(request, "_meta")
                .and_then(|m| m.get("progressToken"))
                .cloned();
            let steps = arg(request, "steps")
                .and_then(Value::as_u64)
                .unwrap_or(3)
                .min(MOST_MESSAGES);
            // A `message` of this many bytes on each update, and a millisecond's pause
            // after every `pause_every` updates: a flood a client can keep up with.
            let message = arg(request, "message_bytes")
                .and_then(Value::as_u64)
                .map(|n| "m".repeat(n.min(1 << 20) as usize));
            let pause_every = arg(request, "pause_every").and_then(Value::as_u64);
            if let Some(token) = token {
                for step in 1..=steps {
                    let mut update =
                        json!({"progressToken": token, "progress": step, "total": steps});
                    if let Some(m) = &message {
                        update["message"] = json!(m);
                    }
                    ctx.peer.notify("notifications/progress", update);
                    if pause_every.is_some_and(|every| every > 0 && step % every == 0) {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            }
            // Not in the schema: a large answer after the updates, for tests.
            match arg(request, "answer_bytes").and_then(Value::as_u64) {
                Some(n) => reply(text("a".repeat(n.min(8 << 20) as usize))),
                None => reply(text(format!("{steps} steps done"))),
            }
        }
        "whoami" => {
            let info = json!({"meta": params_field(request, "_meta"), "headers": ctx.headers});
            reply(
                json!({"content": [{"type": "text", "text": info.to_string()}], "structuredContent": info, "isError": false}),
            )
        }
        "env" => {
            let vars: serde_json::Map<String, Value> =
                std::env::vars().map(|(k, v)| (k, json!(v))).collect();
            reply(
                json!({"content": [{"type": "text", "text": "environment"}], "structuredContent": vars, "isError": false}),
            )
        }
        "cwd" => reply(text(
            std::env::current_dir()
                .map(|d| d.display().to_string())
                .unwrap_or_default(),
        )),
        "region_echo" => {
            // With `"ask": true` a 2026-07-28 call asks once (`input_required`) first: a
            // round that goes on on this server.
            let asks = arg(request, "ask").and_then(Value::as_bool) == Some(true);
            if asks && !ctx.legacy && params_field(request, "requestState").is_none() {
                let question = json!({"method": "elicitation/create", "params": {"mode": "form",
                    "message": "Go on?", "requestedSchema": {"type": "object", "properties": {}}}});
                return reply(json!({"resultType": "input_required",
                    "inputRequests": {"go": question}, "requestState": "region"}));
            }
            // Which header carried it depends on the annotation in force when the call
            // was checked; report whichever came.
            server
                .region_calls
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let got = ctx
                .headers
                .get("mcp-param-region")
                .or_else(|| ctx.headers.get("mcp-param-zone"));
            reply(text(got.cloned().unwrap_or_default()))
        }
        n if n.starts_with("gen_")
            && n[4..]
                .parse::<usize>()
                .is_ok_and(|i| i < server.args.extra_tools) =>
        {
            reply(text(
                arg(request, "text").and_then(Value::as_str).unwrap_or(n),
            ))
        }
        _ => None,
    }
}
