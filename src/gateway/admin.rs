//! The admin endpoint (`serve --admin ADDR`, or [`serve`] by an embedder over its own
//! harness's queue): the input requests waiting for a person, and their answers, over
//! HTTP with a bearer token of `[gateway] admin_tokens` (held as SHA-256, as MCP tokens
//! are). `mcp-harness approvals` is its client.
//!
//! - `GET /approvals`: `{"pending": [{id, server, method, agent, params}]}`, oldest first.
//! - `POST /approvals/ID` with the answer as the body (`{"action": "accept"}` approves a
//!   sampling request; an elicitation takes `{action, content}`): 200, or 404 when the
//!   request is no longer waiting.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};

use super::Tokens;
use crate::call::input::ApprovalQueue;

/// Largest answer body read.
const MAX_BODY: usize = 1 << 20;
/// How long an answer's body may take to arrive.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);

fn reply(status: StatusCode, body: Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

async fn answer(
    queue: &ApprovalQueue,
    tokens: &Tokens,
    req: Request<hyper::body::Incoming>,
) -> Response<Full<Bytes>> {
    if !super::side::bearer_allowed(req.headers(), &tokens()) {
        let mut r = reply(
            StatusCode::UNAUTHORIZED,
            json!({"error": "an admin bearer token is required"}),
        );
        r.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            hyper::header::HeaderValue::from_static("Bearer"),
        );
        return r;
    }
    let path = req.uri().path().to_string();
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/approvals") => {
            let pending: Vec<Value> = queue
                .pending()
                .into_iter()
                .map(|p| {
                    json!({
                        "id": p.id,
                        "server": p.request.server,
                        "method": p.request.method,
                        "agent": p.request.agent_id,
                        "params": for_review(&p.request.params),
                    })
                })
                .collect();
            reply(StatusCode::OK, json!({ "pending": pending }))
        }
        (Method::POST, p) if p.starts_with("/approvals/") => {
            let Some(id) = p["/approvals/".len()..].parse::<u64>().ok() else {
                return reply(StatusCode::NOT_FOUND, json!({"error": "no such request"}));
            };
            let read = Limited::new(req.into_body(), MAX_BODY).collect();
            let body = match tokio::time::timeout(BODY_TIMEOUT, read).await {
                Ok(Ok(b)) => b.to_bytes(),
                Ok(Err(_)) => {
                    return reply(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        json!({"error": "body too large"}),
                    );
                }
                Err(_) => {
                    return reply(
                        StatusCode::REQUEST_TIMEOUT,
                        json!({"error": "the body did not arrive in time"}),
                    );
                }
            };
            let Ok(answer @ Value::Object(_)) = serde_json::from_slice::<Value>(&body) else {
                return reply(
                    StatusCode::BAD_REQUEST,
                    json!({"error": "the answer must be a JSON object"}),
                );
            };
            if queue.answer(id, answer) {
                reply(StatusCode::OK, json!({"answered": id}))
            } else {
                reply(
                    StatusCode::NOT_FOUND,
                    json!({"error": "no such request waiting"}),
                )
            }
        }
        _ => reply(StatusCode::NOT_FOUND, json!({"error": "not found"})),
    }
}

/// Serves `queue` on `listener` to holders of the `tokens` in force at each request,
/// until `shutdown` resolves.
pub async fn serve(
    queue: ApprovalQueue,
    tokens: Tokens,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()>,
) {
    super::side::serve("admin", listener, shutdown, move |req| {
        let (queue, tokens) = (queue.clone(), tokens.clone());
        async move { answer(&queue, &tokens, req).await }
    })
    .await;
}

/// The most of one text shown for review (a sampling message, a system prompt).
const REVIEW_TEXT: usize = 16 << 10;

/// A request's params as `GET /approvals` shows them: the data of images and audio
/// left out (their type and size stay), texts (messages, a system prompt, an
/// elicitation's message) cut at [`REVIEW_TEXT`] bytes with their length, and a larger
/// requested schema by its size, so that a few large requests cannot make the list too
/// large to read.
fn for_review(params: &Value) -> Value {
    fn cut(text: &str) -> Value {
        if text.len() <= REVIEW_TEXT {
            return Value::String(text.to_string());
        }
        let mut end = REVIEW_TEXT;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        Value::String(format!("{}… [{} bytes in all]", &text[..end], text.len()))
    }
    fn block(b: &Value) -> Value {
        let mut b = b.clone();
        if let Some(o) = b.as_object_mut() {
            if let Some(data) = o.get("data").and_then(Value::as_str).map(str::len) {
                o.remove("data");
                o.insert("dataBytes".into(), data.into());
            }
            if let Some(text) = o.get("text").and_then(Value::as_str) {
                let shown = cut(text);
                o.insert("text".into(), shown);
            }
        }
        b
    }
    let mut params = params.clone();
    if let Some(o) = params.as_object_mut() {
        // A sampling request's system prompt, an elicitation's message.
        for key in ["systemPrompt", "message"] {
            if let Some(text) = o.get(key).and_then(Value::as_str) {
                let shown = cut(text);
                o.insert(key.into(), shown);
            }
        }
        // An elicitation's form, by its size past the limit.
        let schema = o.get("requestedSchema").map(|s| s.to_string().len());
        if let Some(bytes) = schema.filter(|b| *b > REVIEW_TEXT) {
            o.insert(
                "requestedSchema".into(),
                json!({"omitted": format!("a schema of {bytes} bytes")}),
            );
        }
    }
    if let Some(messages) = params.get_mut("messages").and_then(Value::as_array_mut) {
        // Only objects are touched: indexing anything else to write would panic.
        for m in messages.iter_mut().filter_map(Value::as_object_mut) {
            let content = match m.get("content") {
                Some(Value::Array(blocks)) => Value::Array(blocks.iter().map(block).collect()),
                Some(one) => block(one),
                None => continue,
            };
            m.insert("content".into(), content);
        }
    }
    params
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_for_review_shows_media_by_size_and_long_texts_cut() {
        let long = "é".repeat(REVIEW_TEXT);
        let params = json!({
            "systemPrompt": long,
            "maxTokens": 100,
            "messages": [
                {"role": "user", "content": {"type": "image", "mimeType": "image/png", "data": "AAAA"}},
                {"role": "user", "content": [{"type": "text", "text": "short"}, {"type": "audio", "mimeType": "audio/wav", "data": "BBBBBB"}]},
                "not a message",
                {"role": "user"},
            ],
        });
        let shown = for_review(&params);
        assert_eq!(
            shown["messages"][0]["content"],
            json!({"type": "image", "mimeType": "image/png", "dataBytes": 4})
        );
        assert_eq!(shown["messages"][1]["content"][0]["text"], "short");
        assert_eq!(shown["messages"][1]["content"][1]["dataBytes"], 6);
        let system = shown["systemPrompt"].as_str().expect("text");
        assert!(system.len() < REVIEW_TEXT + 40, "{}", system.len());
        assert!(
            system.ends_with(&format!("[{} bytes in all]", long.len())),
            "{system}"
        );
        assert_eq!(shown["maxTokens"], 100);
        // What is not a message is left as it is.
        assert_eq!(shown["messages"][2], "not a message");
        assert_eq!(shown["messages"][3], json!({"role": "user"}));
        // An elicitation's message is cut too, and a large form shown by its size.
        let elicitation = json!({
            "message": "m".repeat(REVIEW_TEXT + 1),
            "requestedSchema": {"type": "object", "description": "d".repeat(REVIEW_TEXT)},
        });
        let shown = for_review(&elicitation);
        assert!(
            shown["message"]
                .as_str()
                .is_some_and(|m| m.ends_with("bytes in all]"))
        );
        assert!(shown["requestedSchema"]["omitted"].is_string(), "{shown}");
        let small = json!({"message": "ok?", "requestedSchema": {"type": "object"}});
        assert_eq!(for_review(&small), small);
        // Params of any shape come back without a panic.
        for odd in [
            json!(null),
            json!("x"),
            json!({"messages": 7, "systemPrompt": 1}),
        ] {
            assert_eq!(for_review(&odd), odd);
        }
    }
}
