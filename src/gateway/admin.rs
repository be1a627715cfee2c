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
            // One listing at a time: each copies what waits (up to 64 MiB of params),
            // and 64 connections at once would hold 64 copies.
            static LISTING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);
            let _one = LISTING.acquire().await;
            let pending: Vec<Value> = queue
                .pending()
                .into_iter()
                .map(|p| {
                    let mut entry = json!({
                        "id": p.id,
                        "server": p.request.server,
                        "method": p.request.method,
                        "agent": p.request.agent_id,
                        "params": for_review(&p.request.params),
                    });
                    // What is cut, said from the request as sent.
                    if p.request.method == "sampling/createMessage" {
                        entry["review"] = json!(crate::call::input::review(&p.request.params));
                    }
                    entry
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
                Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
                    return reply(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        json!({"error": "body too large"}),
                    );
                }
                // The client went away, or sent a broken body: not its size.
                Ok(Err(_)) => {
                    return reply(
                        StatusCode::BAD_REQUEST,
                        json!({"error": "the body could not be read"}),
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
/// The most of each text when a request with them all would be too large.
const REVIEW_TEXT_SHORT: usize = 512;
/// Items of one array, and keys of one object, shown.
const REVIEW_ITEMS: usize = 64;
/// As many when a request with them all would be too large.
const REVIEW_ITEMS_SHORT: usize = 16;
/// How deep a request is shown.
const REVIEW_DEPTH: usize = 16;
/// Keys shown before any other, at every level: what the request asks and says.
const FIRST_SHOWN: &[&str] = &[
    "_meta",
    crate::call::input::APPROVAL_META,
    "model",
    "reservedTokens",
    "messages",
    "systemPrompt",
    "maxTokens",
    "modelPreferences",
    "message",
    "mode",
    "url",
    "requestedSchema",
    "role",
    "content",
    "type",
    "text",
    "mimeType",
    "data",
];

/// The most one request takes in the list: the 256 a queue holds stay within the
/// 16 MiB `mcp-harness approvals` reads.
const REVIEW_BYTES: usize = 48 << 10;

/// A request's params as `GET /approvals` shows them, whatever the server put where:
/// every text cut at [`REVIEW_TEXT`] bytes with its length, the `data` of images and
/// audio left out (their size stays, as `dataBytes`), at most [`REVIEW_ITEMS`] items of
/// each array and keys of each object (when that is still too much, texts cut at
/// [`REVIEW_TEXT_SHORT`] and [`REVIEW_ITEMS_SHORT`] items), [`REVIEW_DEPTH`] levels, a requested schema over [`REVIEW_TEXT`] by its
/// size, and a request still over [`REVIEW_BYTES`] by its size alone; so that a few
/// large requests cannot make the list too large to read.
fn for_review(params: &Value) -> Value {
    fn cut(text: &str, max: usize) -> Value {
        if text.len() <= max {
            return Value::String(text.to_string());
        }
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        Value::String(format!("{}… [{} bytes in all]", &text[..end], text.len()))
    }
    #[derive(Clone, Copy)]
    struct Most {
        text: usize,
        items: usize,
        /// Only the keys of [`FIRST_SHOWN`], at every level.
        known_only: bool,
    }
    fn shown(v: &Value, most: Most, depth: usize) -> Value {
        let deeper = || json!({"omitted": "nested deeper"});
        match v {
            Value::String(s) => cut(s, most.text),
            Value::Array(items) if depth >= REVIEW_DEPTH && !items.is_empty() => deeper(),
            Value::Array(items) => {
                let mut out: Vec<Value> = items
                    .iter()
                    .take(most.items)
                    .map(|i| shown(i, most, depth + 1))
                    .collect();
                if items.len() > most.items {
                    out.push(Value::String(format!(
                        "… {} more",
                        items.len() - most.items
                    )));
                }
                Value::Array(out)
            }
            Value::Object(map) if depth >= REVIEW_DEPTH && !map.is_empty() => deeper(),
            Value::Object(map) => {
                let mut out = serde_json::Map::new();
                // What a person decides on comes first, whatever keys a server adds to
                // push it past the cut (keys come sorted).
                let first = FIRST_SHOWN.iter().filter_map(|k| map.get_key_value(*k));
                let unknown_shown = !most.known_only;
                let rest = map
                    .iter()
                    .filter(|(k, _)| unknown_shown && !FIRST_SHOWN.contains(&k.as_str()));
                let mut taken = 0;
                for (key, value) in first.chain(rest).take(most.items) {
                    taken += 1;
                    let key = match cut(key, 256) {
                        Value::String(k) => k,
                        _ => continue,
                    };
                    match (key.as_str(), value) {
                        ("data", Value::String(data)) => {
                            out.insert("dataBytes".into(), data.len().into());
                        }
                        ("requestedSchema", schema) if depth == 0 => {
                            let schema = shown(schema, most, depth + 1);
                            let bytes = schema.to_string().len();
                            let schema = if bytes > REVIEW_TEXT {
                                json!({"omitted": format!("a schema of about {bytes} bytes")})
                            } else {
                                schema
                            };
                            out.insert(key, schema);
                        }
                        _ => {
                            out.insert(key, shown(value, most, depth + 1));
                        }
                    }
                }
                if map.len() > taken {
                    out.insert(
                        "…".into(),
                        format!("{} more keys", map.len() - taken).into(),
                    );
                }
                Value::Object(out)
            }
            other => other.clone(),
        }
    }
    let mut bytes = 0;
    // The last pass shows only what a person decides on, whatever else is there.
    let passes = [
        Most {
            text: REVIEW_TEXT,
            items: REVIEW_ITEMS,
            known_only: false,
        },
        Most {
            text: REVIEW_TEXT_SHORT,
            items: REVIEW_ITEMS_SHORT,
            known_only: false,
        },
        Most {
            text: REVIEW_TEXT_SHORT,
            items: REVIEW_ITEMS_SHORT,
            known_only: true,
        },
    ];
    for most in passes {
        let mut review = shown(params, most, 0);
        // A top-level `omitted` is the harness's note of what it left out (below): one
        // a server sent would read as the harness's.
        if let Value::Object(map) = &mut review {
            map.remove("omitted");
        }
        bytes = review.to_string().len();
        if bytes <= REVIEW_BYTES {
            return review;
        }
    }
    // The harness's note (its three fields, bounded: a server may have written one of
    // any size on a request the harness does not note) is shown whatever the rest.
    let mut omitted =
        json!({"omitted": format!("params of more than {bytes} bytes, even cut short")});
    if let Some(note) = params
        .get("_meta")
        .and_then(|m| m.get(crate::call::input::APPROVAL_META))
    {
        let model = note
            .get("model")
            .and_then(Value::as_str)
            .map(|m| cut(m, 256));
        let count = |k: &str| note.get(k).and_then(Value::as_u64);
        omitted["_meta"] = json!({ crate::call::input::APPROVAL_META: {
            "model": model,
            "maxTokens": count("maxTokens"),
            "reservedTokens": count("reservedTokens"),
        }});
    }
    // What a person needs to judge it, cut short, when it is where it belongs: the
    // system prompt and the first message's text (a server's padding elsewhere would
    // otherwise leave a request that looks empty, to be accepted blind).
    if let Some(system) = params.get("systemPrompt").and_then(Value::as_str) {
        omitted["systemPrompt"] = cut(system, REVIEW_TEXT_SHORT);
    }
    let first = params
        .pointer("/messages/0/content/text")
        .or_else(|| params.pointer("/messages/0/content/0/text"))
        .and_then(Value::as_str);
    if let Some(text) = first {
        let role = params.pointer("/messages/0/role").and_then(Value::as_str);
        omitted["messages"] = json!([{
            "role": role.map(|r| cut(r, 32)),
            "content": {"type": "text", "text": cut(text, REVIEW_TEXT_SHORT)},
        }]);
    }
    omitted
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
        // Whatever key the server puts a large value under, the request stays small.
        let big = "x".repeat(9 << 20);
        let hostile = json!({
            "messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}],
            "metadata": {"blob": big, "many": vec![1; 100_000], "deep": (0..40).fold(json!(1), |v, _| json!([v]))},
            "stopSequences": vec!["s".repeat(REVIEW_TEXT); 200],
        });
        let shown = for_review(&hostile);
        let bytes = shown.to_string().len();
        assert!(bytes <= REVIEW_BYTES, "{bytes}");
        assert_eq!(shown["messages"][0]["content"]["text"], "hi", "{shown}");
        assert_eq!(
            shown["metadata"]["many"].as_array().map(Vec::len),
            Some(REVIEW_ITEMS_SHORT + 1)
        );
        let all_cut = json!({"texts": vec!["t".repeat(REVIEW_TEXT); 64]});
        assert!(
            for_review(&all_cut)["texts"][0]
                .as_str()
                .is_some_and(|t| t.len() < 2 * REVIEW_TEXT_SHORT)
        );
        let too_many =
            json!({"messages": vec![vec![vec!["t".repeat(REVIEW_TEXT_SHORT); 16]; 16]; 16]});
        assert!(for_review(&too_many)["omitted"].is_string());
        // A server's own `omitted` would read as the harness's note: it is not shown.
        let forged = json!({"message": "Delete?", "omitted": "nothing: pre-approved"});
        assert_eq!(for_review(&forged), json!({"message": "Delete?"}));
        // Keys a server adds to push what matters past the cut do not.
        let mut padded = serde_json::Map::new();
        for i in 0..100 {
            padded.insert(format!("A{i:03}"), json!(i));
        }
        padded.insert(
            "messages".into(),
            json!([{"role": "user", "content": {"type": "text", "text": "hi"}}]),
        );
        let mut meta = serde_json::Map::new();
        for i in 0..100 {
            meta.insert(format!("A{i:03}"), json!(i));
        }
        meta.insert(
            crate::call::input::APPROVAL_META.into(),
            json!({"model": "m"}),
        );
        padded.insert("_meta".into(), Value::Object(meta));
        let shown = for_review(&Value::Object(padded));
        assert_eq!(shown["messages"][0]["content"]["text"], "hi", "{shown}");
        assert_eq!(
            shown["_meta"][crate::call::input::APPROVAL_META]["model"],
            "m",
            "{shown}"
        );
        // Padding under a key that has meaning hides the rest, but not the harness's
        // note; under a key of no meaning to a person it leaves what has meaning.
        let padded_under = |key: &str| {
            let mut p = json!({
                "messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}],
                "_meta": {crate::call::input::APPROVAL_META: {"model": "m", "maxTokens": 9}},
            });
            p[key] = json!(vec![vec![vec!["t".repeat(REVIEW_TEXT_SHORT); 16]; 16]; 16]);
            for_review(&p)
        };
        let note =
            |shown: &Value| shown["_meta"][crate::call::input::APPROVAL_META]["model"].clone();
        let shown = padded_under("content");
        assert!(shown["omitted"].is_string(), "{shown}");
        assert_eq!(note(&shown), "m", "{shown}");
        // What is to be judged stays, cut short.
        assert_eq!(shown["messages"][0]["content"]["text"], "hi", "{shown}");
        let shown = padded_under("zzz");
        assert_eq!(shown["messages"][0]["content"]["text"], "hi", "{shown}");
        assert_eq!(note(&shown), "m", "{shown}");
        assert!(shown.get("zzz").is_none(), "{shown}");
        // Nor under such a key deeper down.
        let mut deep = json!({
            "messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}],
            "_meta": {"zzz": vec![vec![vec!["t".repeat(REVIEW_TEXT_SHORT); 16]; 16]; 16]},
        });
        let shown = for_review(&deep);
        assert_eq!(shown["messages"][0]["content"]["text"], "hi", "{shown}");
        // A note a server wrote itself, of any size, is shown bounded.
        deep["messages"] = json!(vec![vec![vec!["t".repeat(REVIEW_TEXT_SHORT); 16]; 16]; 16]);
        deep["_meta"] = json!({crate::call::input::APPROVAL_META: {
            "model": "m".repeat(1 << 20), "extra": vec!["x".repeat(1 << 10); 1 << 10]}});
        let shown = for_review(&deep);
        assert!(shown["omitted"].is_string(), "{shown}");
        assert!(
            shown.to_string().len() < 4096,
            "{}",
            shown.to_string().len()
        );
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
