//! Built-in input handlers: sampling through a model provider (a fake one of the test's
//! own over loopback, in both API shapes, checking what it receives) behind a modern
//! server's `input_required` round and a legacy server's request; the agent's policy,
//! the call's budget and a person's approval; roots from config, per agent, with
//! `roots/list_changed` sent to legacy servers when they change.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mcp_harness::call::input::{AgentConfig, Denial, SamplingConfig, SamplingPolicy};
use mcp_harness::util::hash::sha256_hex;
use mcp_harness::{CallError, Caller, HarnessConfig, HarnessHandle};
use serde_json::{Value, json};
use support::*;

/// What the provider received: (path, headers, body).
type Seen = Arc<Mutex<Vec<(String, BTreeMap<String, String>, Value)>>>;

/// A provider on a loopback port answering both API shapes.
async fn provider() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let got = seen.clone();
    let url = http_service(move |path, headers, body| {
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let model = body["model"].clone();
        got.lock().expect("lock").push((path.clone(), headers, body));
        let (status, answer) = match path.as_str() {
            // A refusal comes in place of the content; a filter stops the text.
            "/chat/completions" if model == "refuser" => (200, json!({
                "id": "c2", "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "refusal": "not that"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
            })),
            "/chat/completions" if model == "filtered" => (200, json!({
                "id": "c3", "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "part"}, "finish_reason": "content_filter"}],
                "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
            })),
            "/chat/completions" => (200, json!({
                "id": "c1", "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "short"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
            })),
            "/v1/messages" => (200, json!({
                "id": "m1", "type": "message", "role": "assistant", "model": model,
                "content": [{"type": "text", "text": "brief"}],
                "stop_reason": "max_tokens",
                "usage": {"input_tokens": 12, "output_tokens": 3}
            })),
            _ => (404, json!({"error": {"message": "no such path"}})),
        };
        (status, answer.to_string().into_bytes())
    })
    .await;
    (url, seen)
}

fn sampling(provider: &str, base_url: &str, key_env: &str) -> SamplingConfig {
    serde_json::from_value(json!({
        "provider": provider,
        "base_url": base_url,
        "model": "default-model",
        "api_key_env": key_env,
        "max_tokens": 40,
        // Room for an image (reserved at 1,600 tokens) and some text.
        "call_budget_tokens": 4000,
        "models": {"gpt-4o": "gpt-4o-mini", "claude": "claude-small", "refuse": "refuser", "filter": "filtered"},
    }))
    .expect("sampling config")
}

fn agents() -> BTreeMap<String, AgentConfig> {
    serde_json::from_value(json!({
        "a": {"sampling": "allow", "roots": ["file:///srv/a"]},
        "b": {"sampling": "deny"},
        "c": {"sampling": "approve"},
        "*": {"roots": ["file:///srv/shared"]},
    }))
    .expect("agents")
}

async fn harness(sampling: Option<SamplingConfig>, extra: &[&str]) -> HarnessHandle {
    let mut legacy_args = vec!["--era", "legacy"];
    legacy_args.extend(extra);
    start_ready(HarnessConfig {
        servers: vec![demo_server("m", extra), demo_server("l", &legacy_args)],
        permissions: grant_everything(&["a", "b", "c", "d"]),
        sampling,
        agents: agents(),
        ..HarnessConfig::default()
    })
    .await
}

fn set_key(var: &str, value: &str) {
    // SAFETY: each test names a variable of its own, set before anything reads it.
    unsafe { std::env::set_var(var, value) };
}

#[tokio::test]
async fn openai_shape_serves_a_modern_round_and_anthropic_shape_a_legacy_request() {
    let (url, seen) = provider().await;
    set_key("MCP_HARNESS_TEST_OPENAI_KEY", "sk-test-1");
    let h = harness(
        Some(sampling("openai", &url, "MCP_HARNESS_TEST_OPENAI_KEY")),
        &[],
    )
    .await;
    let a = Caller::agent("a");
    let r = h
        .call_tool(
            &a,
            "m__summarize",
            json!({"text": "a long story", "max_tokens": 500, "hint": "gpt-4o-2024"}),
        )
        .await
        .expect("modern summarize");
    assert_eq!(
        text(&r),
        "summary: short (role assistant, model gpt-4o-mini, stop endTurn)"
    );
    let (path, headers, body) = seen.lock().expect("lock")[0].clone();
    assert_eq!(path, "/chat/completions");
    assert_eq!(headers["authorization"], "Bearer sk-test-1");
    assert_eq!(body["model"], "gpt-4o-mini", "the hint picked the model");
    assert_eq!(body["max_tokens"], 40, "500 asked, held to the ceiling");
    assert_eq!(body["temperature"], 0.2);
    assert_eq!(body["stop"], json!(["END"]));
    let messages = body["messages"].as_array().expect("messages");
    assert_eq!(
        messages[0],
        json!({"role": "system", "content": "Be brief."})
    );
    assert_eq!(messages[1]["content"][0]["text"], "Summarize: a long story");
    assert_eq!(messages[2]["role"], "assistant");
    assert_eq!(
        messages[3]["content"][1],
        json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}})
    );
    // A refusal, or a filter, is told as it is, not as a turn that ended.
    for (hint, told) in [
        (
            "refuse",
            "summary: not that (role assistant, model refuser, stop refusal)",
        ),
        (
            "filter",
            "summary: part (role assistant, model filtered, stop content_filter)",
        ),
    ] {
        let r = h
            .call_tool(&a, "m__summarize", json!({"text": "t", "hint": hint}))
            .await
            .expect("summarize");
        assert_eq!(text(&r), told);
    }
    h.shutdown().await;

    let (url, seen) = provider().await;
    set_key("MCP_HARNESS_TEST_ANTHROPIC_KEY", "sk-ant-2");
    let h = harness(
        Some(sampling(
            "anthropic",
            &url,
            "MCP_HARNESS_TEST_ANTHROPIC_KEY",
        )),
        &[],
    )
    .await;
    let r = h
        .call_tool(&a, "l__summarize", json!({"text": "legacy story"}))
        .await
        .expect("legacy summarize");
    assert_eq!(
        text(&r),
        "summary: brief (role assistant, model claude-small, stop maxTokens)"
    );
    let (path, headers, body) = seen.lock().expect("lock")[0].clone();
    assert_eq!(path, "/v1/messages");
    assert_eq!(headers["x-api-key"], "sk-ant-2");
    assert_eq!(headers["anthropic-version"], "2023-06-01");
    assert_eq!(body["system"], "Be brief.");
    assert_eq!(body["max_tokens"], 40);
    assert_eq!(body["stop_sequences"], json!(["END"]));
    assert_eq!(
        body["messages"][2]["content"][1],
        json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGVsbG8="}})
    );
    h.shutdown().await;
}

// An embedder's own request is no agent's: a legacy server's sampling during it is
// refused even where `"*"` allows sampling, and no provider is paid.
#[tokio::test]
async fn sampling_during_an_embedders_own_request_is_refused_whatever_the_default_says() {
    let (url, seen) = provider().await;
    set_key("MCP_HARNESS_TEST_KEY_OWN", "k-own");
    let h = start_ready(HarnessConfig {
        servers: vec![demo_server("l", &["--era", "legacy"])],
        permissions: grant_everything(&["a"]),
        sampling: Some(sampling("openai", &url, "MCP_HARNESS_TEST_KEY_OWN")),
        agents: serde_json::from_value(json!({"*": {"sampling": "allow"}})).expect("agents"),
        ..HarnessConfig::default()
    })
    .await;
    let params = json!({"name": "summarize", "arguments": {"text": "own"}});
    let answer = h.request("l", "tools/call", Some(params)).await;
    let shown = format!("{answer:?}");
    assert!(!shown.contains("summary: short"), "{shown}");
    assert!(seen.lock().expect("lock").is_empty(), "{shown}");
    // The same server, during an agent's call, is served under `"*"`.
    let r = h
        .call_tool(&Caller::agent("a"), "l__summarize", json!({"text": "call"}))
        .await
        .expect("summarize during a call");
    assert!(text(&r).starts_with("summary: short"), "{r}");
    assert_eq!(seen.lock().expect("lock").len(), 1);
    h.shutdown().await;
}

#[tokio::test]
async fn policy_budget_and_approval_end_the_call_with_typed_errors() {
    let (url, seen) = provider().await;
    set_key("MCP_HARNESS_TEST_KEY_3", "k3");
    let mut config = sampling("openai", &url, "MCP_HARNESS_TEST_KEY_3");
    config.max_tokens = 1000;
    // The summarize prompt carries an image, reserved at 1,600 tokens.
    config.call_budget_tokens = 2400;
    let h = harness(Some(config), &[]).await;
    let denied = |r: Result<Value, CallError>| match r {
        Err(CallError::InputDenied { reason, method, .. }) => {
            assert_eq!(method, "sampling/createMessage");
            reason
        }
        other => panic!("not denied: {other:?}"),
    };
    // b may not sample at all; d (not named) falls to "*", which does not allow it.
    for agent in ["b", "d"] {
        let reason = denied(
            h.call_tool(&Caller::agent(agent), "m__summarize", json!({"text": "x"}))
                .await,
        );
        assert_eq!(
            reason,
            Denial::NotAllowed {
                agent: agent.into()
            }
        );
    }
    // A legacy server asking is refused in words that name no agent.
    let r = h
        .call_tool(&Caller::agent("b"), "l__summarize", json!({"text": "x"}))
        .await
        .expect("the server's own result");
    let told = text(&r);
    assert!(
        told.contains("refused: -1")
            && told.contains("may not use it")
            && !told.contains("agent b"),
        "{told}"
    );
    // 1000 tokens asked (and the prompt), 2400 in the call's budget.
    let reason = denied(
        h.call_tool(
            &Caller::agent("a"),
            "m__summarize",
            json!({"text": "x", "max_tokens": 1000}),
        )
        .await,
    );
    assert!(
        matches!(reason, Denial::BudgetExceeded { budget: 2400, spent: 0, asked } if asked > 2400),
        "{reason:?}"
    );
    // Within the budget it is served.
    let ok = h
        .call_tool(
            &Caller::agent("a"),
            "m__summarize",
            json!({"text": "x", "max_tokens": 20}),
        )
        .await;
    assert!(ok.is_ok(), "{ok:?}");
    assert_eq!(
        seen.lock().expect("lock").len(),
        1,
        "only the served request reached the provider"
    );

    // c needs a person: the request waits in the queue until answered.
    let queue = h.approvals();
    let c = Caller::agent("c");
    let call = tokio::spawn({
        let h = h.clone();
        let c = c.clone();
        async move {
            h.call_tool(&c, "m__summarize", json!({"text": "x", "max_tokens": 10}))
                .await
        }
    });
    let pending = tokio::time::timeout(Duration::from_secs(10), queue.next_pending())
        .await
        .expect("a request waits");
    assert_eq!(pending[0].request.method, "sampling/createMessage");
    assert_eq!(pending[0].request.agent_id.as_deref(), Some("c"));
    assert!(queue.decline(pending[0].id));
    assert_eq!(denied(call.await.expect("join")), Denial::NotApproved);
    // A legacy server's request during c's call is c's: it waits for a person too, and
    // once approved it is served.
    let call = tokio::spawn({
        let h = h.clone();
        async move {
            h.call_tool(&c, "l__summarize", json!({"text": "x", "max_tokens": 10}))
                .await
        }
    });
    let pending = tokio::time::timeout(Duration::from_secs(10), queue.next_pending())
        .await
        .expect("the legacy request waits");
    assert_eq!(pending[0].request.agent_id.as_deref(), Some("c"));
    // The approver is told what will be sent: the model its hints pick, the tokens
    // capped, and what is reserved (the server's own word on it is not taken).
    let plan = &pending[0].request.params["_meta"][mcp_harness::call::input::APPROVAL_META];
    assert_eq!(plan["model"], "claude-small", "{plan}");
    assert_eq!(plan["maxTokens"], 10, "{plan}");
    assert!(
        plan["reservedTokens"].as_u64().is_some_and(|r| r > 10),
        "{plan}"
    );
    assert!(queue.answer(pending[0].id, json!({"action": "accept"})));
    let r = call.await.expect("join").expect("served");
    assert_eq!(
        text(&r),
        "summary: short (role assistant, model claude-small, stop endTurn)"
    );
    assert!(queue.pending().is_empty());
    h.shutdown().await;
}

/// A harness whose agent `c` (sampling `approve`) has called `m__summarize`, its
/// sampling request waiting for a person: the harness, what the provider saw, the
/// queue, the call, and what waits.
async fn awaiting_approval(
    key_env: &str,
) -> (
    HarnessHandle,
    Seen,
    mcp_harness::ApprovalQueue,
    tokio::task::JoinHandle<Result<Value, CallError>>,
    Vec<mcp_harness::call::input::PendingInput>,
) {
    let (url, seen) = provider().await;
    set_key(key_env, "sk-test-revoked");
    let h = harness(Some(sampling("openai", &url, key_env)), &[]).await;
    let queue = h.approvals();
    let call = tokio::spawn({
        let h = h.clone();
        async move {
            h.call_tool(
                &Caller::agent("c"),
                "m__summarize",
                json!({"text": "x", "max_tokens": 10}),
            )
            .await
        }
    });
    let pending = tokio::time::timeout(Duration::from_secs(10), queue.next_pending())
        .await
        .expect("a request waits");
    (h, seen, queue, call, pending)
}

// A person approves a request minutes later, after a reload took the agent's
// sampling away: the provider is not paid for it.
#[tokio::test]
async fn an_approval_after_the_agents_sampling_was_taken_away_pays_no_provider() {
    let (h, seen, queue, call, pending) = awaiting_approval("MCP_HARNESS_TEST_REVOKED_KEY").await;
    let mut revoked = agents();
    revoked.insert(
        "c".into(),
        serde_json::from_value(json!({"sampling": "deny"})).expect("agent"),
    );
    h.replace_agents(revoked).await;
    assert!(queue.answer(pending[0].id, json!({"action": "accept"})));
    let r = call.await.expect("join");
    assert!(
        matches!(
            &r,
            Err(CallError::InputDenied {
                reason: Denial::NotAllowed { .. },
                ..
            })
        ),
        "refused as the policy says now: {r:?}"
    );
    assert!(
        seen.lock().expect("lock").is_empty(),
        "the provider was not asked"
    );
    h.shutdown().await;
}

// The agent's grant revoked while a person decides: the question is withdrawn and no
// provider is paid for, whatever the person answers after.
#[tokio::test]
async fn a_grant_revoked_while_an_approval_waits_withdraws_it_and_pays_no_provider() {
    let (h, seen, queue, call, pending) =
        awaiting_approval("MCP_HARNESS_TEST_REVOKED_GRANT_KEY").await;
    h.revoke("c", None).await.expect("revoke");
    let r = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("the call ends without waiting for the person")
        .expect("join");
    assert!(matches!(&r, Err(CallError::Denied { .. })), "{r:?}");
    assert!(
        !queue.answer(pending[0].id, json!({"action": "accept"})),
        "the question was withdrawn"
    );
    assert!(
        seen.lock().expect("lock").is_empty(),
        "the provider was not asked"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn roots_are_served_per_agent_and_legacy_servers_hear_when_they_change() {
    let record = temp_file("roots-legacy");
    let record_arg = record.display().to_string();
    let h = harness(None, &["--record", &record_arg]).await;
    let roots = |agent: &str, tool: &str| {
        let h = h.clone();
        let (agent, tool) = (agent.to_string(), tool.to_string());
        async move {
            let r = h
                .call_tool(&Caller::agent(agent), &tool, json!({}))
                .await
                .expect("list_roots");
            text(&r).to_string()
        }
    };
    assert_eq!(roots("a", "m__list_roots").await, "roots: file:///srv/a");
    assert_eq!(
        roots("b", "m__list_roots").await,
        "roots: file:///srv/shared"
    );
    // A legacy server's request during a's call is a's.
    assert_eq!(roots("a", "l__list_roots").await, "roots: file:///srv/a");
    assert_eq!(
        roots("b", "l__list_roots").await,
        "roots: file:///srv/shared"
    );

    let mut next = agents();
    next.get_mut("*").expect("*").roots = Some(vec!["file:///srv/new".into()]);
    h.replace_agents(next).await;
    assert!(
        eventually(Duration::from_secs(10), || recorded(&record)
            .iter()
            .any(|r| r["notification"] == "notifications/roots/list_changed"))
        .await,
        "the legacy server was told"
    );
    assert_eq!(roots("b", "l__list_roots").await, "roots: file:///srv/new");
    // Nothing changed: nothing is sent.
    let before = recorded(&record).len();
    let same = {
        let mut s = agents();
        s.get_mut("*").expect("*").roots = Some(vec!["file:///srv/new".into()]);
        s.get_mut("a").expect("a").sampling = Some(SamplingPolicy::Deny);
        s
    };
    h.replace_agents(same).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        recorded(&record)
            .iter()
            .skip(before)
            .filter(|r| r["notification"] == "notifications/roots/list_changed")
            .count(),
        0
    );
    h.shutdown().await;
}

// Roots a reload adds to a harness that started with none are not announced: its
// legacy server was not told at `initialize` that this client lists roots. Before,
// the notification went out all the same.
#[tokio::test]
async fn roots_added_later_are_not_announced_to_a_server_never_told_of_roots() {
    let record = temp_file("roots-undeclared");
    let record_arg = record.display().to_string();
    let h = start_ready(HarnessConfig {
        servers: vec![demo_server(
            "l",
            &["--era", "legacy", "--record", &record_arg],
        )],
        permissions: grant_everything(&["a"]),
        ..HarnessConfig::default()
    })
    .await;
    h.replace_agents(agents()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let told = recorded(&record)
        .iter()
        .filter(|r| r["notification"] == "notifications/roots/list_changed")
        .count();
    assert_eq!(told, 0);
    h.shutdown().await;
}

/// `mcp-harness approvals ARGS…` with the admin token in the environment.
async fn approvals(args: &[&str], token: &str) -> std::process::Output {
    let (args, token): (Vec<String>, String) = (
        args.iter().map(|a| a.to_string()).collect(),
        token.to_string(),
    );
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(harness_exe())
            .arg("approvals")
            .args(&args)
            .env("MCP_HARNESS_ADMIN_TOKEN", token)
            .output()
            .expect("run approvals")
    })
    .await
    .expect("join")
}

#[tokio::test]
async fn a_gateway_holds_approvals_that_a_person_answers_with_the_approvals_command() {
    let (url, seen) = provider().await;
    let exe = harness_exe();
    let config = temp_file("approvals-gw").with_extension("toml");
    std::fs::write(
        &config,
        format!(
            r#"
[[servers]]
id = "l"
transport = {{ type = "stdio", command = "{exe}", args = ["demo-server", "l", "--era", "legacy"] }}

[permissions.a]
"*" = ["*"]

[sampling]
provider = "openai"
base_url = "{url}"
model = "local-model"

[agents.a]
sampling = "approve"

[gateway]
anonymous_agent = "a"
admin_tokens = [ {{ sha256 = "{hash}" }} ]
"#,
            hash = sha256_hex(b"admin-secret"),
        ),
    )
    .expect("config");
    let admin = format!("127.0.0.1:{}", free_port());
    let config_arg = config.display().to_string();
    let gw = HttpServer::start(
        &exe,
        &[
            "serve",
            "--config",
            &config_arg,
            "--listen",
            "127.0.0.1:0",
            "--dev-keys",
            "--admin",
            &admin,
        ],
    )
    .await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "l__summarize", "arguments": {"text": "gateway story", "max_tokens": 5},
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
        }
    }});
    let call = tokio::spawn({
        let (http, url) = (http.clone(), gw.url.clone());
        async move {
            let resp = http
                .post(url)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("mcp-protocol-version", "2026-07-28")
                .header("mcp-method", "tools/call")
                .header("mcp-name", "l__summarize")
                .body(body.to_string())
                .send()
                .await
                .expect("post");
            let text = resp.text().await.expect("body");
            serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text))
        }
    });
    let from = format!("http://{admin}");
    // No token, no queue.
    let bare = http
        .get(format!("{from}/approvals"))
        .send()
        .await
        .expect("get");
    assert_eq!(bare.status(), 401);
    // The request waits for a person: listed by the approvals command.
    let mut listed = String::new();
    for _ in 0..100 {
        let out = approvals(&["--from", &from], "admin-secret").await;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        listed = String::from_utf8_lossy(&out.stdout).into_owned();
        if !listed.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        listed.contains("sampling/createMessage") && listed.contains("agent=a"),
        "{listed}"
    );
    assert!(listed.contains("Summarize: gateway story"), "{listed}");
    // What the model would read, beyond the first message: the system prompt and the
    // later messages.
    assert!(
        listed.contains("system: Be brief.")
            && listed.contains("user: And this picture: [image image/png]"),
        "{listed}"
    );
    let id = listed.split_whitespace().next().expect("an id").to_string();
    // A body over the bound is too large; one broken off (a chunk cut short and the
    // connection closed) is a bad request, not a size.
    let big = http
        .post(format!("{from}/approvals/{id}"))
        .bearer_auth("admin-secret")
        .body(vec![b' '; (1 << 20) + 1])
        .send()
        .await
        .expect("post");
    assert_eq!(big.status(), 413);
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut raw = tokio::net::TcpStream::connect(&admin)
            .await
            .expect("connect");
        let head = format!(
            "POST /approvals/{id} HTTP/1.1\r\nHost: {admin}\r\nAuthorization: Bearer admin-secret\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
        );
        raw.write_all(head.as_bytes()).await.expect("write");
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), raw.read_to_end(&mut answer)).await;
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
    }
    // A wrong token is refused; the right one answers.
    let refused = approvals(&["--from", &from, "accept", &id], "wrong").await;
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert!(
        seen.lock().expect("lock").is_empty(),
        "nothing sampled before approval"
    );
    let out = approvals(&["--from", &from, "accept", &id], "admin-secret").await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer = tokio::time::timeout(Duration::from_secs(20), call)
        .await
        .expect("the call finished")
        .expect("join");
    assert_eq!(
        answer["result"]["content"][0]["text"],
        "summary: short (role assistant, model local-model, stop endTurn)",
        "{answer}"
    );
    assert_eq!(seen.lock().expect("lock").len(), 1);
    // Answered requests are gone.
    let again = approvals(&["--from", &from, "accept", &id], "admin-secret").await;
    assert_eq!(again.status.code(), Some(2));
    let _ = std::fs::remove_file(config);
}

// With a proxy in the environment, as on a corporate host: the provider and the server
// on loopback are reached directly, the API key and the prompt never sent to the proxy.
#[tokio::test]
async fn the_command_lines_call_uses_the_configured_handlers() {
    let (url, seen) = provider().await;
    let exe = harness_exe();
    let remote = HttpServer::demo(&["h"]).await;
    let remote = &remote.url;
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("proxy");
    let proxy_url = format!("http://{}", proxy.local_addr().expect("addr"));
    let proxied = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = proxied.clone();
    tokio::spawn(async move {
        while proxy.accept().await.is_ok() {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    let config = temp_file("sampling-cli").with_extension("toml");
    std::fs::write(
        &config,
        format!(
            r#"
agent = "planner"

[[servers]]
id = "m"
transport = {{ type = "stdio", command = "{exe}", args = ["demo-server", "m"] }}

[[servers]]
id = "h"
transport = {{ type = "http", url = "{remote}" }}

[permissions.planner]
"*" = ["*"]

[sampling]
provider = "anthropic"
base_url = "{url}"
model = "cli-model"
max_tokens = 7
api_key_env = "MCP_TEST_CLI_SAMPLING_KEY"

[agents.planner]
sampling = "allow"
roots = ["file:///srv/planner"]
"#
        ),
    )
    .expect("config");
    let run = |tool: &'static str, args: &'static str| {
        let config = config.clone();
        let proxy_url = proxy_url.clone();
        tokio::task::spawn_blocking(move || {
            let mut command = std::process::Command::new(harness_exe());
            for var in [
                "HTTP_PROXY",
                "http_proxy",
                "HTTPS_PROXY",
                "https_proxy",
                "ALL_PROXY",
            ] {
                command.env(var, &proxy_url);
            }
            command
                .env_remove("NO_PROXY")
                .env_remove("no_proxy")
                .env("MCP_TEST_CLI_SAMPLING_KEY", "cli-key")
                .args(["call", "--config"])
                .arg(&config)
                .args([tool, args])
                .output()
                .expect("run")
        })
    };
    let out = run("m__summarize", r#"{"text": "cli story"}"#)
        .await
        .expect("join");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "summary: brief (role assistant, model cli-model, stop maxTokens)"
    );
    assert_eq!(seen.lock().expect("lock")[0].2["max_tokens"], 7);
    assert_eq!(
        seen.lock().expect("lock")[0]
            .1
            .get("x-api-key")
            .map(String::as_str),
        Some("cli-key")
    );
    let out = run("m__list_roots", "{}").await.expect("join");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "roots: file:///srv/planner"
    );
    let out = run("h__echo", r#"{"text": "direct"}"#).await.expect("join");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "direct");
    assert_eq!(proxied.load(std::sync::atomic::Ordering::SeqCst), 0);
    let _ = std::fs::remove_file(config);
}
