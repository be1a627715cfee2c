//! Tools that ask the client for input: MRTR rounds (modern) and server-to-client
//! requests (legacy), well-formed and not.

use std::time::Duration;

use mcp_harness::protocol::error::{INVALID_PARAMS, MISSING_CLIENT_CAPABILITY};
use mcp_harness::protocol::{Request, RpcError};
use serde_json::{Value, json};

use super::{arg, i, params_field, s, text, tool};
use crate::demo_server::core::{Action, Ctx, DemoServer};

/// The tools that ask; those that need elicitation only when `elicitation` (the client
/// declared it, or the server does not care).
pub fn tools(elicitation: bool) -> Vec<Value> {
    let mut tools = vec![
        tool("forever", "Asks for input forever", json!({}), &[]),
        tool(
            "many_inputs",
            "Asks n input requests in one round (method, elicitation mode)",
            json!({"n": i("how many"), "method": s("input method"), "mode": s("form, empty (a form with no fields) or url"), "key_bytes": i("each key padded to this length")}),
            &["n"],
        ),
        tool(
            "ask_many",
            "Legacy: asks n elicitation requests at once during the call",
            json!({"n": i("how many"), "mode": s("elicitation mode (default form)"), "malformed": {"type": "boolean", "description": "each question without its jsonrpc member; the reply names the error codes"}}),
            &["n"],
        ),
        tool(
            "ask_later",
            "Legacy: answers now, then asks for elicitation ms later, outside any call",
            json!({"ms": i("delay")}),
            &[],
        ),
        tool(
            "ask_then_return",
            "Legacy: asks for elicitation and returns at once (or ms later), its result right behind the question",
            json!({"ms": i("delay before returning")}),
            &[],
        ),
        tool(
            "summarize",
            "Asks the client's model to summarize text (sampling), in either era",
            json!({"text": s("what to summarize"), "max_tokens": i("maxTokens asked"), "hint": s("a model hint")}),
            &["text"],
        ),
        tool(
            "list_roots",
            "Asks the client for its roots (roots/list), in either era",
            json!({}),
            &[],
        ),
        tool(
            "last_ask",
            "What the client answered to ask_later",
            json!({}),
            &[],
        ),
    ];
    if elicitation {
        tools.insert(
            0,
            tool(
                "confirm",
                "Asks the user to approve (elicitation)",
                json!({"message": s("what to approve"), "give_up_ms": i("legacy: give the question up (notifications/cancelled) after this long"), "then_ms": i("and answer the call this much later"), "ask_after_ms": i("modern: ask only this much later")}),
                &[],
            ),
        );
        tools.insert(
            1,
            tool(
                "rounds",
                "Asks N questions, one round each",
                json!({"n": i("number of rounds")}),
                &["n"],
            ),
        );
    }
    tools
}

pub async fn call(server: &DemoServer, name: &str, request: &Request, ctx: &Ctx) -> Option<Action> {
    Some(match name {
        "confirm" => confirm(request, ctx).await,
        "rounds" => rounds(request, ctx).await,
        "forever" if !ctx.legacy => Action::Reply(Ok(
            json!({"resultType": "input_required", "requestState": "forever"}),
        )),
        "many_inputs" => many_inputs(request, ctx),
        "summarize" => summarize(request, ctx).await,
        "list_roots" => list_roots(request, ctx).await,
        "ask_many" => ask_many(request, ctx).await,
        "ask_later" => {
            let ms = arg(request, "ms").and_then(Value::as_u64).unwrap_or(200);
            let peer = ctx.peer.clone();
            let last = server.last_ask.clone();
            let record = server.recorder();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                let params =
                    form("Unprompted?", json!({"ok": {"type": "boolean"}}), &[])["params"].clone();
                let outcome = match peer.request("elicitation/create", params).await {
                    Ok(v) => format!("answered {}", v["action"].as_str().unwrap_or("?")),
                    Err(e) => format!("refused {}", e.code),
                };
                record(json!({"event": "ask_later answered", "outcome": outcome}));
                *last.lock() = Some(outcome);
            });
            Action::Reply(Ok(text("will ask later")))
        }
        "ask_then_return" => {
            let params = form("Quick?", json!({"ok": {"type": "boolean"}}), &[])["params"].clone();
            let answer = ctx.peer.send_request("elicitation/create", params);
            let record = server.recorder();
            tokio::spawn(async move {
                let outcome = match answer.await {
                    Ok(v) => format!("answered {}", v["action"].as_str().unwrap_or("?")),
                    Err(e) => format!("refused {}", e.code),
                };
                record(json!({"event": "ask_then_return answered", "outcome": outcome}));
            });
            if let Some(ms) = arg(request, "ms").and_then(Value::as_u64) {
                tokio::time::sleep(Duration::from_millis(ms.min(60_000))).await;
            }
            Action::Reply(Ok(text("asked")))
        }
        "last_ask" => Action::Reply(Ok(text(
            server
                .last_ask
                .lock()
                .clone()
                .unwrap_or_else(|| "nothing yet".into()),
        ))),
        _ => return None,
    })
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

/// One round of `n` input requests; the retry completes with how many answers came.
fn many_inputs(request: &Request, ctx: &Ctx) -> Action {
    if ctx.legacy {
        return Action::Reply(Err(RpcError::new(INVALID_PARAMS, "modern only")));
    }
    if let Some(answers) = params_field(request, "inputResponses").and_then(Value::as_object) {
        return Action::Reply(Ok(text(format!("got {} answers", answers.len()))));
    }
    let n = arg(request, "n")
        .and_then(Value::as_u64)
        .unwrap_or(1)
        .min(1000);
    let method = arg(request, "method")
        .and_then(Value::as_str)
        .unwrap_or("elicitation/create");
    let mode = arg(request, "mode")
        .and_then(Value::as_str)
        .unwrap_or("form");
    let params = match (method, mode) {
        ("elicitation/create", "url") => {
            // `url`: a page of the caller's choosing (a bad one, in tests).
            let url = arg(request, "url")
                .and_then(Value::as_str)
                .unwrap_or("https://example.com/sign-in");
            json!({"mode": "url", "message": "Sign in", "url": url})
        }
        ("elicitation/create", "empty") => {
            // A confirmation: a form with no fields.
            form("Delete everything?", json!({}), &[])["params"].clone()
        }
        ("elicitation/create", _) => {
            form("Which?", json!({"x": {"type": "string"}}), &[])["params"].clone()
        }
        ("sampling/createMessage", _) => {
            json!({"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}], "maxTokens": 10})
        }
        _ => json!({}),
    };
    let pad = arg(request, "key_bytes")
        .and_then(Value::as_u64)
        .unwrap_or(0)
        .min(1 << 24) as usize;
    let requests: serde_json::Map<String, Value> = (0..n)
        .map(|k| {
            let mut key = format!("k{k}");
            key.extend(std::iter::repeat_n('x', pad.saturating_sub(key.len())));
            (key, json!({"method": method, "params": params}))
        })
        .collect();
    Action::Reply(Ok(
        json!({"resultType": "input_required", "inputRequests": requests}),
    ))
}

/// Legacy: `n` elicitation requests at once; says how many were answered or refused.
async fn ask_many(request: &Request, ctx: &Ctx) -> Action {
    let n = arg(request, "n")
        .and_then(Value::as_u64)
        .unwrap_or(1)
        .min(100);
    // Another mode than form stands for one the client may not know.
    let mode = arg(request, "mode")
        .and_then(Value::as_str)
        .unwrap_or("form");
    let malformed = arg(request, "malformed")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut asks = tokio::task::JoinSet::new();
    for k in 0..n {
        let peer = ctx.peer.clone();
        let mut params = form(
            &format!("Question {k}"),
            json!({"x": {"type": "string"}}),
            &[],
        )["params"]
            .clone();
        params["mode"] = json!(mode);
        asks.spawn(async move {
            match malformed {
                true => peer.request_malformed("elicitation/create", params).await,
                false => peer.request("elicitation/create", params).await,
            }
        });
    }
    let (mut answered, mut refused, mut codes) = (0, 0, Vec::new());
    while let Some(r) = asks.join_next().await {
        match r {
            Ok(Ok(_)) => answered += 1,
            Ok(Err(e)) => {
                refused += 1;
                codes.push(e.code);
            }
            Err(_) => refused += 1,
        }
    }
    let mut said = format!("answered {answered} refused {refused}");
    if malformed {
        said.push_str(&format!(" codes {codes:?}"));
    }
    Action::Reply(Ok(text(said)))
}

/// One input request of `method` with `params`: asked on the session (legacy), or as
/// an `input_required` round keyed `key` (modern); the answer once there is one.
async fn ask_client(
    request: &Request,
    ctx: &Ctx,
    key: &str,
    method: &str,
    params: Value,
) -> Result<Value, Action> {
    if ctx.legacy {
        return ctx
            .peer
            .request(method, params)
            .await
            .map_err(|e| Action::Reply(Ok(json!({"content": [{"type": "text", "text": format!("refused: {} {}", e.code, e.message)}], "isError": true}))));
    }
    match params_field(request, "inputResponses").and_then(|r| r.get(key)) {
        Some(answer) => Ok(answer.clone()),
        None => Err(Action::Reply(Ok(json!({"resultType": "input_required",
            "inputRequests": {key: {"method": method, "params": params}},
            "requestState": format!("{key}-v1")})))),
    }
}

async fn summarize(request: &Request, ctx: &Ctx) -> Action {
    let text_arg = arg(request, "text").and_then(Value::as_str).unwrap_or("");
    let max_tokens = arg(request, "max_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(50);
    let hint = arg(request, "hint")
        .and_then(Value::as_str)
        .unwrap_or("claude-3-5-sonnet");
    let params = json!({
        "messages": [
            {"role": "user", "content": {"type": "text", "text": format!("Summarize: {text_arg}")}},
            {"role": "assistant", "content": {"type": "text", "text": "Sure."}},
            {"role": "user", "content": [
                {"type": "text", "text": "And this picture:"},
                {"type": "image", "data": "aGVsbG8=", "mimeType": "image/png"}
            ]}
        ],
        "systemPrompt": "Be brief.",
        "maxTokens": max_tokens,
        "temperature": 0.2,
        "stopSequences": ["END"],
        "modelPreferences": {"hints": [{"name": hint}], "intelligencePriority": 0.5},
    });
    let answer = match ask_client(request, ctx, "summary", "sampling/createMessage", params).await {
        Ok(a) => a,
        Err(action) => return action,
    };
    let said = answer
        .pointer("/content/text")
        .and_then(Value::as_str)
        .unwrap_or("");
    Action::Reply(Ok(text(format!(
        "summary: {said} (role {}, model {}, stop {})",
        answer["role"].as_str().unwrap_or("?"),
        answer["model"].as_str().unwrap_or("?"),
        answer["stopReason"].as_str().unwrap_or("?")
    ))))
}

async fn list_roots(request: &Request, ctx: &Ctx) -> Action {
    let answer = match ask_client(request, ctx, "roots", "roots/list", json!({})).await {
        Ok(a) => a,
        Err(action) => return action,
    };
    let uris: Vec<&str> = answer["roots"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["uri"].as_str())
        .collect();
    Action::Reply(Ok(text(format!("roots: {}", uris.join(" ")))))
}

/// The state `confirm` hands out; it has quotes, backslashes and non-ASCII so that an
/// echo that is not exact shows, and starts as a gateway's own marks might (`parked:`),
/// so that a gateway that reads a server's state as its own shows too.
fn confirm_state(message: &str) -> String {
    format!("parked:confirm-v1|{message}|ünïcode \"quoted\" \\slash")
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
        let asked = match arg(request, "give_up_ms").and_then(Value::as_u64) {
            Some(ms) => {
                let after = Duration::from_millis(ms);
                match ctx
                    .peer
                    .request_or_give_up("elicitation/create", params, after)
                    .await
                {
                    Some(answer) => answer,
                    None => {
                        let then = arg(request, "then_ms").and_then(Value::as_u64).unwrap_or(0);
                        tokio::time::sleep(Duration::from_millis(then)).await;
                        return Action::Reply(Ok(text("gave up asking")));
                    }
                }
            }
            None => ctx.peer.request("elicitation/create", params).await,
        };
        match asked {
            Ok(answer) => answer,
            Err(e) => return Action::Reply(Err(e)),
        }
    } else {
        let responses = params_field(request, "inputResponses");
        let Some(answer) = responses.and_then(|r| r.get("confirm")) else {
            if let Some(ms) = arg(request, "ask_after_ms").and_then(Value::as_u64) {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
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
