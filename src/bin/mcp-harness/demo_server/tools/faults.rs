//! Tools that misbehave on purpose: hang, garbage, oversize lines, crashes, broken
//! framing, rogue requests, escape sequences, and the HTTP-only faults.

use std::time::Duration;

use mcp_harness::protocol::Request;
use serde_json::{Value, json};

use super::{arg, i, text, tool};
use crate::demo_server::core::{Action, Ctx, DemoServer};

fn plain(name: &str, description: &str) -> Value {
    tool(name, description, json!({}), &[])
}

pub fn tools() -> Vec<Value> {
    vec![
        tool(
            "rogue_request",
            "Sends a request (method, params; default roots/list) to the client, even in modern mode",
            json!({"method": {"type": "string"}, "params": {"type": "object"}}),
            &[],
        ),
        plain("batch", "Answers with a JSON-RPC batch (an array)"),
        tool(
            "orphan_stdout",
            "Exits, leaving a child that holds stdout open (in a process group of its own: out of reach of the group's kill; for `seconds`)",
            json!({"own_group": {"type": "boolean"}, "hold_stdin": {"type": "boolean", "description": "the child holds stdin too, unread"}, "seconds": i("how long the child lives (default 3600)")}),
            &[],
        ),
        plain("wrong_id", "Answers with an id that was never sent"),
        plain("duplicate", "Answers twice"),
        plain(
            "null_id_error",
            "Answers with an error whose id is null (a server that could not read the request's id)",
        ),
        tool(
            "both",
            "Answers with result and error together",
            json!({"bad_error": {"type": "boolean", "description": "instead, an error alone whose code is not an integer"}}),
            &[],
        ),
        plain(
            "deep_result",
            "Answers with a result nested deeper than a JSON parser allows",
        ),
        plain("partial_eof", "Writes half a line, then exits"),
        plain(
            "empty_input_required",
            "input_required with neither inputRequests nor requestState",
        ),
        tool(
            "task_result",
            "Answers with resultType task (not negotiated), or the type given",
            json!({"type": {"type": "string"}}),
            &[],
        ),
        tool(
            "freeze",
            "Stops answering anything for ms milliseconds",
            json!({"ms": i("how long")}),
            &[],
        ),
        plain("hang", "Never answers"),
        tool(
            "garbage",
            "Answers with bytes that are not JSON-RPC (then, with then_answer, a real answer)",
            json!({"then_answer": {"type": "boolean"}}),
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
        plain("close_stdout", "Closes stdout and keeps running"),
        plain(
            "ansi",
            "Answers text full of terminal escape sequences \u{1b}[31m(and so is this)\u{1b}[0m",
        ),
        tool(
            "http_status",
            "HTTP only: answers with this status",
            json!({"status": i("status")}),
            &["status"],
        ),
        plain("wrong_content_type", "HTTP only: answers text/html"),
        tool(
            "redirect",
            "HTTP only: answers 307 to this URL",
            json!({"to": {"type": "string"}}),
            &["to"],
        ),
        plain(
            "endless_stream",
            "HTTP only: an event stream that never ends",
        ),
        plain(
            "expire_session",
            "HTTP legacy only: forgets the session after answering",
        ),
        tool(
            "broken_stream",
            "HTTP legacy only: ends its event stream before the answer, which a GET with Last-Event-ID then gets (with exit: the process exits first; with polls: that many GETs first get an event and the stream's end)",
            json!({"exit": {"type": "boolean"}, "polls": {"type": "integer"}}),
            &[],
        ),
    ]
}

pub async fn call(server: &DemoServer, name: &str, request: &Request, ctx: &Ctx) -> Option<Action> {
    let raw = |s: &str| Some(Action::RawLine(s.into()));
    Some(match name {
        "hang" => Action::NoReply,
        "garbage" if arg(request, "then_answer").and_then(Value::as_bool) == Some(true) => {
            return raw(r#"this is {not json
{"jsonrpc":"2.0","id":{id},"result":{"content":[{"type":"text","text":"answered after garbage"}]}}"#);
        }
        "garbage" => Action::Garbage,
        "oversize" => Action::Oversize(
            arg(request, "bytes")
                .and_then(Value::as_u64)
                .unwrap_or(1 << 20)
                // Past the harness's bound, yet within what this process can hold.
                .min(256 << 20) as usize,
        ),
        "crash" => Action::Exit(arg(request, "code").and_then(Value::as_i64).unwrap_or(3) as i32),
        "close_stdout" => Action::CloseStdout,
        "http_status" => Action::HttpStatus(
            arg(request, "status")
                .and_then(Value::as_u64)
                .unwrap_or(500) as u16,
        ),
        "wrong_content_type" => Action::WrongContentType,
        "redirect" => Action::Redirect(
            arg(request, "to")
                .and_then(Value::as_str)
                .unwrap_or("http://127.0.0.1:9/")
                .to_string(),
        ),
        "endless_stream" => Action::EndlessStream,
        "broken_stream" => Action::BrokenStream {
            then_exit: arg(request, "exit").and_then(Value::as_bool) == Some(true),
            polls: arg(request, "polls")
                .and_then(Value::as_u64)
                .unwrap_or(0)
                .min(100) as u32,
        },
        "expire_session" => Action::ExpireSession,
        "orphan_stdout" => {
            // A descendant keeps our stdout open while we exit: no EOF for the client.
            use std::os::unix::process::CommandExt;
            let seconds = arg(request, "seconds")
                .and_then(Value::as_u64)
                .unwrap_or(3600);
            let mut child = std::process::Command::new("sleep");
            child.arg(seconds.to_string());
            if arg(request, "hold_stdin").and_then(Value::as_bool) != Some(true) {
                child.stdin(std::process::Stdio::null());
            }
            if arg(request, "own_group").and_then(Value::as_bool) == Some(true) {
                child.process_group(0);
            }
            let child = child.spawn();
            Action::Exit(if child.is_ok() { 0 } else { 1 })
        }
        "batch" => return raw(r#"[{"jsonrpc":"2.0","id":{id},"result":{"content":[]}}]"#),
        "wrong_id" => return raw(r#"{"jsonrpc":"2.0","id":987654321,"result":{"content":[]}}"#),
        "null_id_error" => {
            return raw(
                r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"could not read the request"}}"#,
            );
        }
        "duplicate" => {
            return raw(
                r#"{"jsonrpc":"2.0","id":{id},"result":{"content":[{"type":"text","text":"once"}]}}
{"jsonrpc":"2.0","id":{id},"result":{"content":[{"type":"text","text":"twice"}]}}"#,
            );
        }
        // The error first: the client's reader finds the id by its scan, not by the
        // prefix a response begins with (`deep_result` takes that path).
        "both" if arg(request, "bad_error").and_then(Value::as_bool) == Some(true) => {
            return raw(r#"{"jsonrpc":"2.0","id":{id},"error":{"code":"E1","message":"bad"}}"#);
        }
        "both" => {
            return raw(
                r#"{"jsonrpc":"2.0","error":{"code":1,"message":"both"},"id":{id},"result":{}}"#,
            );
        }
        "deep_result" => {
            let deep = format!(
                r#"{{"jsonrpc":"2.0","id":{{id}},"result":{}{}}}"#,
                "[".repeat(200),
                "]".repeat(200)
            );
            return raw(&deep);
        }
        "partial_eof" => Action::RawThenExit(r#"{"jsonrpc":"2.0","id":{id},"res"#.into()),
        "empty_input_required" => Action::Reply(Ok(json!({"resultType": "input_required"}))),
        "task_result" => {
            let kind = arg(request, "type").cloned().unwrap_or(json!("task"));
            Action::Reply(Ok(json!({"resultType": kind, "taskId": "t1"})))
        }
        "freeze" => {
            let ms = arg(request, "ms").and_then(Value::as_u64).unwrap_or(1000);
            *server.frozen_until.lock() =
                Some(std::time::Instant::now() + Duration::from_millis(ms));
            Action::Reply(Ok(text(format!("frozen for {ms} ms"))))
        }
        "ansi" => Action::Reply(Ok(text(
            "\u{1b}[2J\u{1b}[Hcleared your screen\u{1b}]0;pwned\u{7} and \u{1b}[31mred\u{1b}[0m\r\u{8}",
        ))),
        "rogue_request" => {
            // A modern server must not send requests; this one does, to test clients.
            // A legacy server may: this is how tests send `ping`, `sampling/…`, `roots/…`.
            let method = arg(request, "method")
                .and_then(Value::as_str)
                .unwrap_or("roots/list")
                .to_string();
            let params = arg(request, "params").cloned().unwrap_or(json!({}));
            Action::Reply(Ok(match ctx.peer.request(&method, params).await {
                Ok(answer) => json!({
                    "content": [{"type": "text", "text": "client answered"}],
                    "structuredContent": {"answer": answer},
                    "isError": false,
                }),
                Err(e) => text(format!("client refused: {}", e.code)),
            }))
        }
        _ => return None,
    })
}
