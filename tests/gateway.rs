//! Gateway mode (`mcp-harness serve`): real gateway processes fronting demo servers of
//! both eras, reached by a raw JSON-RPC client over loopback HTTP (for the error paths
//! and the sealed state), by rmcp 3.11's client in both eras over HTTP and stdio, and
//! by this crate's own client.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use mcp_harness::util::hash::sha256_hex;
use rmcp::service::ClientLifecycleMode;
use rmcp::service::ClientServiceExt;
use serde_json::{Value, json};
use support::*;

const MODERN: &str = "2026-07-28";

/// A unique tag for this test's servers, so that a census finds exactly its processes.
fn tag() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "gw{}x{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A config: `alpha` (modern) and `beta` (legacy) demo servers; agent `a` may use
/// everything, `b` only `alpha`'s `echo`; tokens `tok-a`, `tok-a2` (agent `a` in auth
/// context `other`) and `tok-b`.
struct Setup {
    tag: String,
    config: PathBuf,
    keys: PathBuf,
    audit: PathBuf,
}

fn keys_text(ids: &[(&str, &str)]) -> String {
    ids.iter()
        .map(|(id, key)| format!("{id}:{key}\n"))
        .collect()
}

/// A fixed key per name, so that several gateways can share or not share keys.
fn key(name: &str) -> String {
    use base64::Engine;
    let bytes = sha256_hex(name.as_bytes());
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&bytes.as_bytes()[..32])
}

impl Setup {
    fn new(gateway_extra: &str, keys: &[(&str, &str)]) -> Setup {
        let tag = tag();
        let config = temp_file(&format!("{tag}.toml")).with_extension("toml");
        let keys_path = temp_file(&format!("{tag}-keys"));
        let audit = temp_file(&format!("{tag}-audit"));
        write_private(&keys_path, &keys_text(keys));
        let exe = harness_exe();
        let text = format!(
            r#"
[[servers]]
id = "alpha"
priority = 2
transport = {{ type = "stdio", command = "{exe}", args = ["demo-server", "alpha{tag}"] }}

[[servers]]
id = "beta"
transport = {{ type = "stdio", command = "{exe}", args = ["demo-server", "beta{tag}", "--era", "legacy"] }}

[permissions.a]
"*" = ["*"]

[permissions.b]
alpha = ["echo"]

[audit]
path = "{audit}"
flush_every = "10ms"

[gateway]
keys_file = "{keys}"
tokens = [
  {{ sha256 = "{a}", agent = "a" }},
  {{ sha256 = "{a2}", agent = "a", auth_context = "other" }},
  {{ sha256 = "{b}", agent = "b" }},
]
{gateway_extra}
"#,
            audit = audit.display(),
            keys = keys_path.display(),
            a = sha256_hex(b"tok-a"),
            a2 = sha256_hex(b"tok-a2"),
            b = sha256_hex(b"tok-b"),
        );
        std::fs::write(&config, text).expect("config");
        Setup {
            tag,
            config,
            keys: keys_path,
            audit,
        }
    }

    fn with_keys(&self, keys: &[(&str, &str)]) -> PathBuf {
        let text = std::fs::read_to_string(&self.config)
            .expect("config")
            .replace(&self.keys.display().to_string(), &{
                let p = temp_file(&format!("{}-keys2", self.tag));
                write_private(&p, &keys_text(keys));
                p.display().to_string()
            });
        let path = temp_file(&format!("{}-2.toml", self.tag)).with_extension("toml");
        std::fs::write(&path, text).expect("config");
        path
    }

    async fn start(&self) -> Gateway {
        Gateway::start(&self.config).await
    }

    /// (started, finished) records in the audit file.
    fn audit_counts(&self) -> (usize, usize) {
        let text = std::fs::read_to_string(&self.audit).unwrap_or_default();
        let count = |e: &str| {
            text.lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .filter(|r| r["event"] == e)
                .count()
        };
        (count("started"), count("finished"))
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        for p in [&self.config, &self.keys, &self.audit] {
            let _ = std::fs::remove_file(p);
        }
    }
}

struct Gateway {
    server: HttpServer,
    http: reqwest::Client,
}

impl Gateway {
    async fn start(config: &Path) -> Gateway {
        let config = config.display().to_string();
        let server = HttpServer::start(
            &harness_exe(),
            &["serve", "--config", &config, "--listen", "127.0.0.1:0"],
        )
        .await;
        Gateway {
            server,
            http: http_client(),
        }
    }

    fn url(&self) -> &str {
        &self.server.url
    }

    /// `host:port` of its listener.
    fn authority(&self) -> String {
        self.url()
            .trim_start_matches("http://")
            .split('/')
            .next()
            .expect("host:port")
            .to_string()
    }

    /// A legacy session's GET event stream, as `token`.
    async fn get_stream(&self, token: &str, sid: &str) -> reqwest::Response {
        self.http
            .get(self.url())
            .bearer_auth(token)
            .header("accept", "text/event-stream")
            .header("mcp-session-id", sid)
            .send()
            .await
            .expect("get")
    }

    /// Replaces its config file with `text` (whole, by a rename) and sends SIGHUP.
    fn reload_with(&self, setup: &Setup, text: &str) {
        let tmp = setup.config.with_extension("tmp");
        std::fs::write(&tmp, text).expect("write");
        std::fs::rename(&tmp, &setup.config).expect("rename");
        let pid = self.server.child.id().expect("pid");
        let _ = std::process::Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status();
    }

    /// A POST with the headers a 2026-07-28 client sends (`headers` added or replacing).
    async fn post(
        &self,
        token: Option<&str>,
        body: &Value,
        headers: &[(&str, &str)],
    ) -> (u16, Value, reqwest::header::HeaderMap) {
        let mut req = self
            .http
            .post(self.url())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        let method = body["method"].as_str().unwrap_or("");
        let mut all: Vec<(String, String)> = vec![
            ("mcp-protocol-version".into(), MODERN.into()),
            ("mcp-method".into(), method.into()),
        ];
        let named = match method {
            "resources/read" => body["params"]["uri"].as_str(),
            "tools/call" | "prompts/get" => body["params"]["name"].as_str(),
            _ => None,
        };
        if let Some(name) = named {
            all.push(("mcp-name".into(), name.into()));
        }
        for (k, v) in headers {
            all.retain(|(n, _)| n != k);
            all.push((k.to_string(), v.to_string()));
        }
        for (k, v) in all {
            if !v.is_empty() {
                req = req.header(k, v);
            }
        }
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.body(body.to_string()).send().await.expect("send");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.text().await.expect("body");
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, value, headers)
    }

    /// A POST as `token` with the headers a 2026-07-28 client sends for `method` on
    /// `name`, to add to (a header added again comes twice).
    fn modern_post(&self, token: &str, method: &str, name: &str) -> reqwest::RequestBuilder {
        self.http
            .post(self.url())
            .bearer_auth(token)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", MODERN)
            .header("mcp-method", method)
            .header("mcp-name", name)
    }

    /// A 2026-07-28 request as `token`; the whole JSON-RPC response.
    async fn modern(&self, token: &str, method: &str, params: Value) -> (u16, Value) {
        let (status, body, _) = self.post(Some(token), &request(method, params), &[]).await;
        (status, body)
    }

    /// SIGTERM, and the exit status once it has stopped.
    async fn stop(mut self) -> std::process::ExitStatus {
        let pid = self.server.child.id().expect("pid");
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        tokio::time::timeout(Duration::from_secs(20), self.server.child.wait())
            .await
            .expect("the gateway stops within 20 s of SIGTERM")
            .expect("wait")
    }
}

/// A plain HTTP client (reqwest is built without a default TLS provider).
fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

fn request(method: &str, mut params: Value) -> Value {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
    });
    json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
}

fn names(list: &Value) -> Vec<String> {
    names_in(&list["result"]["tools"])
}

/// The `name` of each item of a JSON array.
fn names_in(items: &Value) -> Vec<String> {
    items
        .as_array()
        .map(|t| {
            t.iter()
                .filter_map(|t| t["name"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn result_text(response: &Value) -> &str {
    text(&response["result"])
}

#[tokio::test]
async fn modern_clients_see_one_server_with_both_eras_behind_it_and_only_their_grants() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let (status, discover) = gw.modern("tok-a", "server/discover", json!({})).await;
    assert_eq!(status, 200);
    let d = &discover["result"];
    assert_eq!(d["resultType"], "complete");
    assert!(
        d["supportedVersions"]
            .as_array()
            .expect("versions")
            .contains(&json!(MODERN))
    );
    assert!(d["ttlMs"].is_u64() && d["cacheScope"] == "public", "{d}");
    assert_eq!(
        d["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "mcp-harness-gateway"
    );

    let (_, list) = gw.modern("tok-a", "tools/list", json!({})).await;
    let a = names(&list);
    assert!(
        a.contains(&"alpha__echo".into()) && a.contains(&"beta__echo".into()),
        "{a:?}"
    );
    // Two agents are served: no list is public, and the hints are the upstream's.
    assert_eq!(list["result"]["cacheScope"], "private");
    assert!(list["result"]["ttlMs"].is_u64());
    let (_, list) = gw.modern("tok-b", "tools/list", json!({})).await;
    assert_eq!(names(&list), ["alpha__echo"]);

    for tool in ["alpha__echo", "beta__echo"] {
        let (status, r) = gw
            .modern(
                "tok-a",
                "tools/call",
                json!({"name": tool, "arguments": {"text": "hi"}}),
            )
            .await;
        assert_eq!((status, result_text(&r)), (200, "hi"), "{tool}: {r}");
        assert_eq!(r["result"]["resultType"], "complete");
    }
    // What b may not call looks like a tool that does not exist, and reaches no server.
    let (status, r) = gw
        .modern(
            "tok-b",
            "tools/call",
            json!({"name": "beta__echo", "arguments": {"text": "x"}}),
        )
        .await;
    assert_eq!(
        (status, r["error"]["code"].as_i64()),
        (200, Some(-32602)),
        "{r}"
    );

    let status = gw.stop().await;
    assert!(status.success(), "{status:?}");
    let (started, finished) = setup.audit_counts();
    assert_eq!(
        (started, finished),
        (3, 3),
        "every call has both records after shutdown"
    );
    assert!(
        processes_with(&setup.tag).is_empty(),
        "no server process survives the gateway"
    );
}

// A modern client's capabilities go on to the servers only as far as the gateway
// answers for them: an extension it does not serve (tasks, whose results it cannot
// poll) is not offered upstream in the client's name.
#[tokio::test]
async fn a_modern_clients_capabilities_go_upstream_only_as_far_as_the_gateway_serves_them() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let mut call = request(
        "tools/call",
        json!({"name": "alpha__whoami", "arguments": {}}),
    );
    call["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] = json!({
        "elicitation": {"form": {}},
        "extensions": {"io.modelcontextprotocol/tasks": {}},
        "experimental": {"anything": {"big": "x".repeat(10_000)}},
    });
    let (status, body, _) = gw.post(Some("tok-a"), &call, &[]).await;
    assert_eq!(status, 200, "{body}");
    let sent =
        &body["result"]["structuredContent"]["meta"]["io.modelcontextprotocol/clientCapabilities"];
    assert!(sent["elicitation"].is_object(), "{sent}");
    assert!(sent.get("extensions").is_none(), "{sent}");
    assert!(sent.get("experimental").is_none(), "{sent}");
    gw.stop().await;
}

#[tokio::test]
async fn identity_envelope_and_headers_are_checked_with_the_spec_codes() {
    let setup = Setup::new("max_body_bytes = 65536", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let list = request("tools/list", json!({}));
    let (status, _, headers) = gw.post(None, &list, &[]).await;
    assert_eq!(status, 401);
    assert!(headers.get("www-authenticate").is_some());
    assert_eq!(gw.post(Some("wrong"), &list, &[]).await.0, 401);
    // DNS rebinding: a foreign Origin, or a Host that is not the gateway.
    let (status, _, _) = gw
        .post(Some("tok-a"), &list, &[("origin", "https://evil.example")])
        .await;
    assert_eq!(status, 403);
    assert_eq!(
        gw.post(Some("tok-a"), &list, &[("host", "evil.example")])
            .await
            .0,
        403
    );

    let code = |v: &Value| v["error"]["code"].as_i64();
    let bare = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}});
    let (status, r, _) = gw.post(Some("tok-a"), &bare, &[]).await;
    assert_eq!(
        (status, code(&r)),
        (400, Some(-32602)),
        "missing _meta: {r}"
    );
    let (status, r, _) = gw
        .post(
            Some("tok-a"),
            &list,
            &[("mcp-protocol-version", "2025-11-25")],
        )
        .await;
    assert_eq!((status, code(&r)), (400, Some(-32020)), "{r}");
    let (status, r, _) = gw
        .post(Some("tok-a"), &list, &[("mcp-method", "tools/call")])
        .await;
    assert_eq!((status, code(&r)), (400, Some(-32020)), "{r}");
    let call = request(
        "tools/call",
        json!({"name": "alpha__echo", "arguments": {"text": "x"}}),
    );
    let (status, r, _) = gw
        .post(Some("tok-a"), &call, &[("mcp-name", "alpha__add")])
        .await;
    assert_eq!((status, code(&r)), (400, Some(-32020)), "{r}");
    // A version quoted back, and a long one not sent back whole (a refusal is outside
    // every budget).
    for version in ["2099-01-01".to_string(), "9".repeat(50_000)] {
        let mut future = list.clone();
        future["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!(version);
        let (status, r, _) = gw
            .post(
                Some("tok-a"),
                &future,
                &[("mcp-protocol-version", "2099-01-01")],
            )
            .await;
        assert_eq!((status, code(&r)), (400, Some(-32022)), "{r}");
        assert!(r.to_string().len() < 1024, "{r}");
        if version.len() < 40 {
            assert_eq!(r["error"]["data"]["requested"], version);
        }
    }
    let (status, r) = gw.modern("tok-a", "no/such", json!({})).await;
    assert_eq!((status, code(&r)), (404, Some(-32601)), "{r}");
    let (status, r) = gw
        .modern("tok-a", "tools/list", json!({"cursor": "garbage"}))
        .await;
    assert_eq!((status, code(&r)), (200, Some(-32602)), "{r}");
    let big = request(
        "tools/call",
        json!({"name": "alpha__echo", "arguments": {"text": "x".repeat(100_000)}}),
    );
    assert_eq!(gw.post(Some("tok-a"), &big, &[]).await.0, 413);
    let get = gw
        .http
        .get(gw.url())
        .bearer_auth("tok-a")
        .send()
        .await
        .expect("get");
    assert_eq!(
        get.status().as_u16(),
        405,
        "no GET stream without a legacy session"
    );
    assert_eq!(
        get.headers()["allow"],
        "POST, GET, DELETE",
        "what is allowed is said"
    );
    // Media types ignore case and parameters; a longer type is another type.
    let list = request("tools/list", json!({}));
    let with = |content_type: &str, accept: &str| {
        gw.http
            .post(gw.url())
            .bearer_auth("tok-a")
            .header("content-type", content_type.to_string())
            .header("accept", accept.to_string())
            .header("mcp-protocol-version", MODERN)
            .header("mcp-method", "tools/list")
            .body(list.to_string())
            .send()
    };
    for (content_type, accept, want) in [
        (
            "Application/JSON; charset=utf-8",
            "Text/Event-Stream, application/json",
            200,
        ),
        ("application/json", "application/*;q=0.9, text/*", 200),
        (
            "application/jsonl",
            "application/json, text/event-stream",
            415,
        ),
        (
            "application/json",
            "application/json-seq, text/event-stream",
            406,
        ),
        (
            "application/json",
            "application/json, text/event-stream;q=0",
            406,
        ),
        (
            "application/json",
            "application/json, text/event-stream;q=0, */*",
            406,
        ),
        ("application/json", "*/*", 200),
    ] {
        let r = with(content_type, accept).await.expect("post");
        assert_eq!(r.status().as_u16(), want, "{content_type} / {accept}");
    }
    // A tools/list whose header `name` comes twice, `first` then `second`.
    let sent_twice = |name: &'static str, first: &'static str, second: &'static str| {
        let mut req = gw
            .http
            .post(gw.url())
            .bearer_auth("tok-a")
            .header("content-type", "application/json");
        if name != "accept" {
            req = req.header("accept", "application/json, text/event-stream");
        }
        req.header(name, first)
            .header(name, second)
            .header("mcp-protocol-version", MODERN)
            .header("mcp-method", "tools/list")
            .body(list.to_string())
            .send()
    };
    // An Accept list on two lines is one list (RFC 9110 5.3).
    let two_lines = sent_twice("accept", "application/json", "text/event-stream")
        .await
        .expect("post");
    assert_eq!(two_lines.status().as_u16(), 200);
    // Two Authorization headers: which is the caller's is not known; nor which of two
    // sessions a proxy in front routes on.
    for (name, first, second) in [
        ("authorization", "Bearer tok-a", "Bearer tok-b"),
        ("mcp-session-id", "one", "two"),
    ] {
        let twice = sent_twice(name, first, second).await.expect("post");
        assert_eq!(twice.status().as_u16(), 400, "{name}");
        let said = twice.text().await.expect("text");
        assert!(said.to_lowercase().contains(name), "{name}: {said}");
    }
    gw.stop().await;
}

/// Starts `confirm` on `gw`: the `input_required` result.
async fn start_confirm(gw: &Gateway, token: &str, message: &str) -> Value {
    let (status, r) = gw
        .modern(
            token,
            "tools/call",
            json!({"name": "alpha__confirm", "arguments": {"message": message}}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["result"]["resultType"], "input_required", "{r}");
    r["result"].clone()
}

async fn finish_confirm(gw: &Gateway, token: &str, message: &str, state: &Value) -> (u16, Value) {
    let params = json!({
        "name": "alpha__confirm",
        "arguments": {"message": message},
        "inputResponses": {"confirm": {"action": "accept", "content": {"approved": true}}},
        "requestState": state,
    });
    gw.modern(token, "tools/call", params).await
}

#[tokio::test]
async fn input_rounds_go_down_sealed_and_state_tampered_expired_or_from_another_principal_or_request_is_refused()
 {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let round = start_confirm(&gw, "tok-a", "ship?").await;
    assert!(
        round["inputRequests"]["confirm"]["method"] == "elicitation/create",
        "{round}"
    );
    let state = round["requestState"].as_str().expect("state").to_string();
    assert!(state.starts_with("v1.k1."), "{state}");
    assert!(
        !state.contains("confirm-v1"),
        "the upstream state is not readable"
    );

    let refused = |r: &Value| r["error"]["code"] == -32602;
    let mut tampered = state.clone().into_bytes();
    let i = tampered.len() - 5;
    tampered[i] = if tampered[i] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).expect("ascii");
    let (_, r) = finish_confirm(&gw, "tok-a", "ship?", &json!(tampered)).await;
    assert!(refused(&r), "tampered: {r}");
    let (_, r) = finish_confirm(&gw, "tok-a2", "ship?", &json!(state)).await;
    assert!(
        refused(&r),
        "another principal (same agent, other auth context): {r}"
    );
    let (_, r) = finish_confirm(&gw, "tok-b", "ship?", &json!(state)).await;
    assert!(refused(&r), "another agent: {r}");
    let (_, r) = finish_confirm(&gw, "tok-a", "other args", &json!(state)).await;
    assert!(refused(&r), "other arguments: {r}");
    let (_, r) = finish_confirm(&gw, "tok-a", "ship?", &json!("v1.k9.AAAA")).await;
    assert!(refused(&r), "unknown key: {r}");
    let (status, r) = finish_confirm(&gw, "tok-a", "ship?", &json!(state)).await;
    assert_eq!((status, result_text(&r)), (200, "approved: true"), "{r}");
    gw.stop().await;

    // Expiry: a gateway whose states live 300 ms (time is what is tested here).
    let short = Setup::new("state_ttl = \"300ms\"", &[("k1", &key("k1"))]);
    let gw = short.start().await;
    let round = start_confirm(&gw, "tok-a", "later?").await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (_, r) = finish_confirm(&gw, "tok-a", "later?", &round["requestState"]).await;
    // One message for every refusal: a stolen state teaches its holder nothing.
    assert!(
        refused(&r) && r["error"]["message"] == "invalid requestState",
        "{r}"
    );
    gw.stop().await;
}

// A round's state belongs to the server that issued it: a reload that puts another
// server under the same id (here its command changes) ends the round, rather than
// hand the first server's state, and the answers gathered, to the second.
#[tokio::test]
async fn a_rounds_state_is_refused_once_a_reload_puts_another_server_under_its_id() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let first = start_confirm(&gw, "tok-a", "Ship it?").await;
    let state = first["requestState"].clone();
    assert!(state.is_string(), "{first}");
    // Answered before any reload: taken (the same server).
    let (_, done) = finish_confirm(&gw, "tok-a", "Ship it?", &state).await;
    assert_eq!(done["result"]["resultType"], "complete", "{done}");
    let second = start_confirm(&gw, "tok-a", "Ship it?").await;
    let state = second["requestState"].clone();
    let original = std::fs::read_to_string(&setup.config).expect("config");
    let changed = original.replacen(
        &format!("\"alpha{}\"]", setup.tag),
        &format!("\"alpha{}\", \"--ttl-ms\", \"1000\"]", setup.tag),
        1,
    );
    assert_ne!(changed, original);
    gw.reload_with(&setup, &changed);
    let mut refused = Value::Null;
    for _ in 0..200 {
        let (_, r) = finish_confirm(&gw, "tok-a", "Ship it?", &state).await;
        // (An unknown tool while the new server starts: asked again.)
        if r["error"]["message"] == "invalid requestState" || r["result"].is_object() {
            refused = r;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        refused["error"]["message"], "invalid requestState",
        "{refused}"
    );
    gw.stop().await;
}

// A parked round's state from a gateway version before states named their parked
// round apart (`upstream = "parked:ID"` alone) is refused: sent on to the legacy
// server, which ignores it, it would have run the call again.
#[tokio::test]
async fn a_parked_rounds_state_of_the_old_form_is_refused_not_run_again() {
    use mcp_harness::gateway::seal::{RoundState, Sealer, params_digest};
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let params = json!({"name": "beta__confirm", "arguments": {"message": "again?"}});
    let sealer =
        Sealer::from_text(&format!("k1:{}\n", key("k1")), Duration::from_secs(600)).expect("keys");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    let old = RoundState {
        server: "beta".into(),
        upstream: Some("parked:0123456789abcdef0123456789abcdef".into()),
        parked: None,
        agent: "a".into(),
        context: None,
        method: "tools/call".into(),
        digest: params_digest(&params),
        issued_ms: now,
        expires_ms: now + 60_000,
        rounds: 1,
        version: 0,
        target: None,
    };
    let mut retry = params.clone();
    retry["inputResponses"] =
        json!({"elicitation": {"action": "accept", "content": {"approved": true}}});
    retry["requestState"] = json!(sealer.seal(&old).expect("sealed"));
    let (status, r) = gw.modern("tok-a", "tools/call", retry).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert_eq!(r["error"]["message"], "invalid requestState", "{r}");
    gw.stop().await;
}

// A server's state too large to come back sealed (the gateway opens none past 256 KiB)
// is refused when it comes, before the client asks its user for answers that could
// never be delivered.
#[tokio::test]
async fn a_servers_state_too_large_to_carry_is_an_error_not_a_round() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    // `confirm` puts its message in its state.
    let message = "x".repeat(300 * 1024);
    let (status, r) = gw
        .modern(
            "tok-a",
            "tools/call",
            json!({"name": "alpha__confirm", "arguments": {"message": message}}),
        )
        .await;
    assert_eq!(status, 200);
    let error = r["error"]["message"].as_str().unwrap_or_default();
    assert!(error.contains("too large"), "{}", &r.to_string()[..200]);
    gw.stop().await;
}

/// A call to beta's `confirm` asking `message`: a legacy server's question, parked as
/// an input round for tok-a.
async fn park_a_legacy_question(gw: &Gateway, message: &str) {
    let (status, r) = gw
        .modern(
            "tok-a",
            "tools/call",
            json!({"name": "beta__confirm", "arguments": {"message": message}}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["result"]["resultType"], "input_required", "{r}");
}

/// The first `finished` record of `setup`'s audit trail.
fn finished_record(setup: &Setup) -> Option<Value> {
    audit_records(&setup.audit)
        .into_iter()
        .find(|r| r["event"] == "finished")
}

#[tokio::test]
async fn a_legacy_servers_question_parked_past_its_time_is_withdrawn_with_no_further_request() {
    let setup = Setup::new("state_ttl = \"300ms\"", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    park_a_legacy_question(&gw, "later?").await;
    // Nothing else is asked of the gateway: the round's expiry alone ends its call
    // upstream, and the call's record is written.
    let finished = || finished_record(&setup);
    assert!(
        eventually(Duration::from_secs(10), || finished().is_some()).await,
        "the parked call was never ended"
    );
    assert_ne!(finished().expect("record")["outcome"], "ok");
    gw.stop().await;
}

// A reload that drops a (leaked) key ends, at the next sweep, the rounds parked under
// states it sealed: the gateway refuses those states now, and the rounds kept their
// places and their calls upstream until their expiry (ten minutes by default).
#[tokio::test]
async fn a_reload_that_drops_a_key_ends_the_rounds_it_sealed() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    park_a_legacy_question(&gw, "leaked?").await;
    let finished = || finished_record(&setup);
    // Both made before the first reload rewrites the config `with_keys` reads.
    let read =
        |keys: &[(&str, &str)]| std::fs::read_to_string(setup.with_keys(keys)).expect("config");
    let (both, dropped) = (
        read(&[("k2", &key("k2")), ("k1", &key("k1"))]),
        read(&[("k2", &key("k2"))]),
    );
    // Rotated in: k1 still opens, and the round stays.
    gw.reload_with(&setup, &both);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(finished().is_none(), "a key still held keeps its rounds");
    gw.reload_with(&setup, &dropped);
    assert!(
        eventually(Duration::from_secs(10), || finished().is_some()).await,
        "the round sealed with the dropped key was never ended"
    );
    assert_ne!(finished().expect("record")["outcome"], "ok");
    gw.stop().await;
}

#[tokio::test]
async fn a_round_started_on_one_gateway_finishes_on_another_and_keys_rotate() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let (one, two) = (setup.start().await, setup.start().await);
    let round = start_confirm(&one, "tok-a", "across?").await;
    let (_, r) = finish_confirm(&two, "tok-a", "across?", &round["requestState"]).await;
    assert_eq!(result_text(&r), "approved: true", "{r}");
    one.stop().await;
    two.stop().await;

    // A new key seals; the old one still opens until it is dropped.
    let started = setup.start().await;
    let round = start_confirm(&started, "tok-a", "rotate?").await;
    started.stop().await;
    let rotated = Gateway::start(&setup.with_keys(&[("k2", &key("k2")), ("k1", &key("k1"))])).await;
    let (_, r) = finish_confirm(&rotated, "tok-a", "rotate?", &round["requestState"]).await;
    assert_eq!(result_text(&r), "approved: true", "{r}");
    let next = start_confirm(&rotated, "tok-a", "rotate?").await;
    assert!(
        next["requestState"]
            .as_str()
            .is_some_and(|s| s.starts_with("v1.k2."))
    );
    rotated.stop().await;
    let dropped = Gateway::start(&setup.with_keys(&[("k2", &key("k2"))])).await;
    let (_, r) = finish_confirm(&dropped, "tok-a", "rotate?", &round["requestState"]).await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    dropped.stop().await;
}

// A round is sealed with the keys in force when it is sealed, not those of when its
// request came: a reload that dropped a (leaked) key while the call ran leaves no
// state sealed with it, which this gateway would refuse once answered. Before, the
// call's upstream round was sealed with the dropped key.
#[tokio::test]
async fn a_round_is_sealed_with_the_keys_in_force_when_it_is_sealed() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let params = json!({"name": "alpha__confirm",
        "arguments": {"message": "later?", "ask_after_ms": 3000}});
    let slow = gw.modern("tok-a", "tools/call", params);
    let reload = async {
        // The slow call has come in before the reload (a later one would seal with
        // k2 anyway).
        tokio::time::sleep(Duration::from_millis(500)).await;
        let text = std::fs::read_to_string(setup.with_keys(&[("k2", &key("k2"))])).expect("config");
        gw.reload_with(&setup, &text);
        for _ in 0..100 {
            let round = start_confirm(&gw, "tok-a", "now?").await;
            if round["requestState"]
                .as_str()
                .is_some_and(|s| s.starts_with("v1.k2."))
            {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    };
    let ((status, round), reloaded) = tokio::join!(slow, reload);
    assert!(reloaded, "k2 seals");
    assert_eq!(status, 200, "{round}");
    let state = &round["result"]["requestState"];
    assert!(
        state.as_str().is_some_and(|s| s.starts_with("v1.k2.")),
        "{round}"
    );
    let params = json!({
        "name": "alpha__confirm",
        "arguments": {"message": "later?", "ask_after_ms": 3000},
        "inputResponses": {"confirm": {"action": "accept", "content": {"approved": true}}},
        "requestState": state,
    });
    let (_, r) = gw.modern("tok-a", "tools/call", params).await;
    assert_eq!(result_text(&r), "approved: true", "{r}");
    gw.stop().await;
}

/// An rmcp client that accepts every elicitation, approving.
#[derive(Clone)]
struct Approver {
    asked: Arc<AtomicU32>,
}

impl rmcp::ClientHandler for Approver {
    async fn create_elicitation(
        &self,
        _request: rmcp::model::ElicitRequestParams,
        _context: rmcp::service::RequestContext<rmcp::RoleClient>,
    ) -> Result<rmcp::model::ElicitResult, rmcp::ErrorData> {
        self.asked.fetch_add(1, Ordering::Relaxed);
        Ok(
            rmcp::model::ElicitResult::new(rmcp::model::ElicitationAction::Accept)
                .with_content(json!({"approved": true})),
        )
    }

    fn get_info(&self) -> rmcp::model::ClientConfig {
        let caps = serde_json::from_value(json!({"elicitation": {"form": {}}})).expect("caps");
        rmcp::model::ClientConfig::new(caps, rmcp::model::Implementation::new("rmcp-test", "1"))
    }
}

fn modes() -> [(&'static str, ClientLifecycleMode); 2] {
    [
        (
            "modern",
            ClientLifecycleMode::Discover {
                preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
            },
        ),
        ("legacy", ClientLifecycleMode::Initialize),
    ]
}

/// Lists, calls a tool on each upstream era, and calls `confirm` (an upstream input
/// round, answered by the client: as MRTR for a modern client, as an elicitation request
/// on its session for a legacy one).
async fn exercise_rmcp<S>(
    client: &rmcp::service::RunningService<rmcp::RoleClient, S>,
    asked: &AtomicU32,
    what: &str,
) where
    S: rmcp::Service<rmcp::RoleClient>,
{
    let tools = client.list_all_tools().await.expect("list");
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert!(
        names.contains(&"alpha__echo") && names.contains(&"beta__add"),
        "{what}: {names:?}"
    );
    for tool in ["alpha__echo", "beta__echo"] {
        let r = client
            .call_tool(
                rmcp::model::CallToolRequestParams::new(tool).with_arguments(
                    json!({"text": "via rmcp"})
                        .as_object()
                        .cloned()
                        .expect("obj"),
                ),
            )
            .await
            .expect("call");
        let v = serde_json::to_value(&r).expect("json");
        assert_eq!(text(&v), "via rmcp", "{what} {tool}: {v}");
    }
    // A modern server's input_required round, and a legacy server's own elicitation
    // during the call: either way the client is asked once, in its own era.
    for tool in ["alpha__confirm", "beta__confirm"] {
        let before = asked.load(Ordering::Relaxed);
        let r = client
            .call_tool(
                rmcp::model::CallToolRequestParams::new(tool)
                    .with_arguments(json!({"message": "ok?"}).as_object().cloned().expect("obj")),
            )
            .await
            .unwrap_or_else(|e| panic!("{what} {tool}: {e:?}"));
        let v = serde_json::to_value(&r).expect("json");
        assert_eq!(text(&v), "approved: true", "{what} {tool}: {v}");
        assert_eq!(
            asked.load(Ordering::Relaxed),
            before + 1,
            "{what} {tool}: the client was asked once"
        );
    }
}

// A legacy server's questions during one call are held to round_cap when the
// gateway's legacy client answers them, as when a handler does: past it each is refused
// without reaching the client (a person asked again and again until the deadline).
#[tokio::test]
async fn a_legacy_servers_questions_to_a_legacy_client_stop_at_the_round_cap() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let asked = Arc::new(AtomicU32::new(0));
    let transport = rmcp::transport::StreamableHttpClientTransport::with_client(
        http_client(),
        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
            gw.url().to_string(),
        )
        .auth_header("tok-a"),
    );
    let client = Approver {
        asked: asked.clone(),
    }
    .serve_with_lifecycle(transport, ClientLifecycleMode::Initialize)
    .await
    .expect("rmcp over HTTP");
    let call = |n: u64| {
        rmcp::model::CallToolRequestParams::new("beta__rounds")
            .with_arguments(json!({"n": n}).as_object().cloned().expect("obj"))
    };
    client.call_tool(call(10)).await.expect("ten answered");
    assert_eq!(asked.load(Ordering::Relaxed), 10);
    asked.store(0, Ordering::Relaxed);
    let refused = client.call_tool(call(12)).await;
    let said = match &refused {
        Ok(r) => serde_json::to_string(r).unwrap_or_default(),
        Err(e) => e.to_string(),
    };
    assert!(said.contains("round_cap"), "{said}");
    assert_eq!(
        asked.load(Ordering::Relaxed),
        10,
        "the eleventh reached no one"
    );
    client.cancel().await.expect("close");
    gw.stop().await;
}

/// A legacy client whose user rejects every elicitation (MCP's -1).
struct Rejecter;

impl rmcp::ClientHandler for Rejecter {
    async fn create_elicitation(
        &self,
        _request: rmcp::model::ElicitRequestParams,
        _context: rmcp::service::RequestContext<rmcp::RoleClient>,
    ) -> Result<rmcp::model::ElicitResult, rmcp::ErrorData> {
        Err(rmcp::ErrorData::new(
            rmcp::model::ErrorCode(-1),
            "the user rejected it",
            None,
        ))
    }

    fn get_info(&self) -> rmcp::model::ClientConfig {
        Approver {
            asked: Arc::default(),
        }
        .get_info()
    }
}

// A legacy server's question that the client's user rejected is audited as denied,
// not as a failure of the client.
#[tokio::test]
async fn a_question_the_clients_user_rejected_is_audited_as_denied() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let transport = rmcp::transport::StreamableHttpClientTransport::with_client(
        http_client(),
        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
            gw.url().to_string(),
        )
        .auth_header("tok-a"),
    );
    let client = Rejecter
        .serve_with_lifecycle(transport, ClientLifecycleMode::Initialize)
        .await
        .expect("rmcp over HTTP");
    let confirm = rmcp::model::CallToolRequestParams::new("beta__confirm")
        .with_arguments(json!({"message": "ok?"}).as_object().cloned().expect("obj"));
    let _ = client.call_tool(confirm).await;
    client.cancel().await.expect("close");
    assert!(gw.stop().await.success());
    let finished: Vec<Value> = audit_records(&setup.audit)
        .into_iter()
        .filter(|r| r["event"] == "finished" && r["server"] == "beta")
        .collect();
    assert_eq!(finished.len(), 1, "{:?}", audit_records(&setup.audit));
    assert_eq!(
        finished[0]["questions"][0]["outcome"], "denied",
        "{finished:?}"
    );
}

#[tokio::test]
async fn rmcp_clients_of_both_eras_over_http_and_stdio() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    for (era, mode) in modes() {
        let asked = Arc::new(AtomicU32::new(0));
        let transport = rmcp::transport::StreamableHttpClientTransport::with_client(
            http_client(),
            rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
                gw.url().to_string(),
            )
            .auth_header("tok-a"),
        );
        let client = Approver {
            asked: asked.clone(),
        }
        .serve_with_lifecycle(transport, mode)
        .await
        .expect("rmcp over HTTP");
        exercise_rmcp(&client, &asked, &format!("{era} over HTTP")).await;
        client.cancel().await.expect("close");
    }
    gw.stop().await;

    for (era, mode) in modes() {
        let asked = Arc::new(AtomicU32::new(0));
        let mut cmd = tokio::process::Command::new(harness_exe());
        cmd.args(["serve", "--stdio", "--agent", "a", "--config"])
            .arg(&setup.config);
        let client = Approver {
            asked: asked.clone(),
        }
        .serve_with_lifecycle(
            rmcp::transport::TokioChildProcess::new(cmd).expect("spawn"),
            mode,
        )
        .await
        .expect("rmcp over stdio");
        exercise_rmcp(&client, &asked, &format!("{era} over stdio")).await;
        client.cancel().await.expect("close");
    }
    assert!(
        eventually(Duration::from_secs(10), || processes_with(&setup.tag)
            .is_empty())
        .await,
        "the stdio gateways and their servers are gone once their clients close"
    );
}

// With bare names, a round goes on on the server that issued its state, whatever the
// name routes to now, and its `Mcp-Param-*` headers are checked against that server's
// tool: here a server of higher priority, added by a reload between the rounds, binds
// the argument to another header than the round's server does.
#[tokio::test]
async fn a_rounds_param_headers_are_checked_against_the_server_it_goes_on_on() {
    let setup = Setup::new("prefix = \"never\"", &[("k1", &key("k1"))]);
    let exe = harness_exe();
    let original = std::fs::read_to_string(&setup.config).expect("config");
    let (_, rest) = original
        .split_once("[permissions.a]")
        .expect("the permissions");
    let server = |id: &str, priority: u32, args: &str| {
        format!(
            "[[servers]]\nid = \"{id}\"\npriority = {priority}\ntransport = {{ type = \"stdio\", command = \"{exe}\", args = [\"demo-server\", \"{id}{tag}\"{args}] }}\n\n",
            tag = setup.tag
        )
    };
    // `zone` binds `region` to Mcp-Param-Zone, `region` to Mcp-Param-Region.
    let zone = server("zone", 1, ", \"--rename-param-header-after\", \"0\"");
    std::fs::write(&setup.config, format!("{zone}[permissions.a]{rest}")).expect("config");
    let gw = setup.start().await;
    let args = json!({"region": "eu", "ask": true});
    let call = |extra: Value| {
        let mut params = json!({"name": "region_echo", "arguments": args.clone()});
        if let (Some(p), Value::Object(extra)) = (params.as_object_mut(), extra) {
            p.extend(extra);
        }
        request("tools/call", params)
    };
    let zone_header = [("mcp-param-zone", "eu")];
    let (status, asked, _) = gw.post(Some("tok-a"), &call(json!({})), &zone_header).await;
    assert_eq!(status, 200, "{asked}");
    assert_eq!(asked["result"]["resultType"], "input_required", "{asked}");
    let state = asked["result"]["requestState"].clone();
    // `region`, of higher priority, now serves the bare name.
    let region = server("region", 5, "");
    gw.reload_with(&setup, &format!("{zone}{region}[permissions.a]{rest}"));
    let name_call = request(
        "tools/call",
        json!({"name": "server_name", "arguments": {}}),
    );
    let mut routed = String::new();
    for _ in 0..100 {
        let (_, r, _) = gw.post(Some("tok-a"), &name_call, &[]).await;
        routed = r["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or("")
            .into();
        if routed.starts_with("region") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        routed.starts_with("region"),
        "the reload took effect: {routed}"
    );
    let resume = call(json!({
        "requestState": state,
        "inputResponses": {"go": {"action": "accept", "content": {}}},
    }));
    let (status, done, _) = gw.post(Some("tok-a"), &resume, &zone_header).await;
    // Checked against `zone`'s tool (`region`'s would want Mcp-Param-Region: -32020).
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["result"]["resultType"], "complete", "{done}");
    assert_eq!(done["result"]["isError"], false, "{done}");
    gw.stop().await;
}

#[tokio::test]
async fn bare_names_route_by_priority_and_serve_each_name_once() {
    let setup = Setup::new("prefix = \"never\"", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let (_, list) = gw.modern("tok-a", "tools/list", json!({})).await;
    let served = names(&list);
    assert_eq!(
        served.iter().filter(|n| *n == "server_name").count(),
        1,
        "{served:?}"
    );
    let (_, r) = gw
        .modern(
            "tok-a",
            "tools/call",
            json!({"name": "server_name", "arguments": {}}),
        )
        .await;
    assert_eq!(
        result_text(&r),
        format!("alpha{}", setup.tag),
        "alpha has the higher priority: {r}"
    );
    gw.stop().await;
}

// A FIFO put in the config file's place is not read by the reload (it would wait for a
// writer, holding the reloader, and a runtime thread, for good): a regular file put back
// later is reloaded as usual.
#[tokio::test]
async fn a_fifo_in_the_configs_place_is_passed_over_and_a_file_put_back_is_reloaded() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let (_, list) = gw.modern("tok-b", "tools/list", json!({})).await;
    assert_eq!(names(&list), ["alpha__echo"]);
    let original = std::fs::read_to_string(&setup.config).expect("config");
    std::fs::remove_file(&setup.config).expect("remove");
    let c = std::ffi::CString::new(setup.config.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let pid = gw.server.child.id().expect("pid").to_string();
    let _ = std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status();
    // The watcher's tick and the signal both come to the FIFO (deliberate).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let changed = original.replace(
        "alpha = [\"echo\"]",
        "alpha = [\"echo\"]\nbeta = [\"echo\"]",
    );
    std::fs::remove_file(&setup.config).expect("remove the FIFO");
    gw.reload_with(&setup, &changed);
    let mut seen = Vec::new();
    for _ in 0..200 {
        // Bounded: a runtime thread held by a read that waits makes requests wait too.
        let listed = tokio::time::timeout(
            Duration::from_secs(5),
            gw.modern("tok-b", "tools/list", json!({})),
        )
        .await;
        let (_, list) = listed.expect("answered in time");
        seen = names(&list);
        if seen.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(seen, ["alpha__echo", "beta__echo"]);
    gw.stop().await;
}

#[tokio::test]
async fn a_config_change_is_applied_without_a_restart_and_a_bad_one_is_refused() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let (_, list) = gw.modern("tok-b", "tools/list", json!({})).await;
    assert_eq!(names(&list), ["alpha__echo"]);
    let original = std::fs::read_to_string(&setup.config).expect("config");
    // b gets beta's echo; a new server joins (one slow to stop: only SIGKILL ends it); a
    // new token is accepted.
    let gamma = format!(
        "[[servers]]\nid = \"gamma\"\ntransport = {{ type = \"stdio\", command = \"{}\", args = [\"demo-server\", \"gamma{}\", \"--ignore-sigterm\"] }}\n",
        harness_exe(),
        setup.tag
    );
    let changed = original
        .replace(
            "alpha = [\"echo\"]",
            "alpha = [\"echo\"]\nbeta = [\"echo\"]\ngamma = [\"add\"]",
        )
        .replace(
            "tokens = [",
            &format!(
                "tokens = [\n  {{ sha256 = \"{}\", agent = \"b\" }},",
                sha256_hex(b"tok-new")
            ),
        )
        + &gamma;
    // b holds a subscription: it hears of the server it may now use.
    let (mut sub, mut heard) = subscribed(&gw, "tok-b", "b-sub").await;
    gw.reload_with(&setup, &changed);
    assert!(
        read_until(&mut sub, &mut heard, "notifications/tools/list_changed").await,
        "a server added by a reload is announced: {heard}"
    );
    let mut seen = Vec::new();
    for _ in 0..200 {
        let (_, list) = gw.modern("tok-new", "tools/list", json!({})).await;
        seen = names(&list);
        if seen.len() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(seen, ["alpha__echo", "beta__echo", "gamma__add"]);

    // A config that does not parse changes nothing.
    gw.reload_with(&setup, "this is [not toml");
    tokio::time::sleep(Duration::from_millis(300)).await; // the reload attempt (deliberate)
    let (status, list) = gw.modern("tok-new", "tools/list", json!({})).await;
    assert_eq!((status, names(&list).len()), (200, 3), "{list}");

    // Back to the original: the new token is refused at once, while gamma, slow to
    // stop, still runs; then gamma is stopped and forgotten.
    gw.reload_with(&setup, &original);
    let gamma_runs = || !processes_with(&format!("gamma{}", setup.tag)).is_empty();
    let mut status = 0;
    for _ in 0..200 {
        status = gw
            .post(Some("tok-new"), &request("tools/list", json!({})), &[])
            .await
            .0;
        if status == 401 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status, 401, "the removed token is refused");
    assert!(
        gamma_runs(),
        "the token was refused before a server slow to stop had stopped"
    );
    assert!(
        eventually(Duration::from_secs(30), || !gamma_runs()).await,
        "a removed server's process is gone"
    );
    gw.stop().await;
}

// A reload that changes only an agent's grants (no server added or removed) tells that
// agent's clients their list changed: before, nobody was told, and the list they held
// (private, kept up to its ttl) hid a tool granted, or listed one taken away.
#[tokio::test]
async fn a_reload_that_changes_an_agents_grants_tells_its_clients() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let (_, list) = gw.modern("tok-b", "tools/list", json!({})).await;
    assert_eq!(names(&list), ["alpha__echo"]);
    let original = std::fs::read_to_string(&setup.config).expect("config");
    let changed = original.replace(
        "[permissions.b]\nalpha = [\"echo\"]",
        "[permissions.b]\nalpha = [\"echo\"]\nbeta = [\"echo\"]",
    );
    assert_ne!(changed, original);
    let (mut sub, mut heard) = subscribed(&gw, "tok-b", "b-sub").await;
    gw.reload_with(&setup, &changed);
    assert!(
        read_until(&mut sub, &mut heard, "notifications/tools/list_changed").await,
        "a grant added by a reload is announced: {heard}"
    );
    let (_, list) = gw.modern("tok-b", "tools/list", json!({})).await;
    assert_eq!(names(&list), ["alpha__echo", "beta__echo"]);
    // Taken away again: told again.
    let mut heard = String::new();
    gw.reload_with(&setup, &original);
    assert!(
        read_until(&mut sub, &mut heard, "notifications/tools/list_changed").await,
        "a grant taken away by a reload is announced: {heard}"
    );
    let (_, list) = gw.modern("tok-b", "tools/list", json!({})).await;
    assert_eq!(names(&list), ["alpha__echo"]);
    gw.stop().await;
}

// A reload that changes how tools are served (their names: `prefix`) tells every
// client to list again, though no server's list changed. Before, nobody was told, and
// a client calling a name of the old list got "unknown tool".
#[tokio::test]
async fn a_reload_that_changes_how_tools_are_named_tells_the_clients() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let (_, list) = gw.modern("tok-b", "tools/list", json!({})).await;
    assert_eq!(names(&list), ["alpha__echo"]);
    let original = std::fs::read_to_string(&setup.config).expect("config");
    let changed = format!("{original}prefix = \"never\"\n");
    let (mut sub, mut heard) = subscribed(&gw, "tok-b", "b-sub").await;
    gw.reload_with(&setup, &changed);
    assert!(
        read_until(&mut sub, &mut heard, "notifications/tools/list_changed").await,
        "a change of names is announced: {heard}"
    );
    let (_, list) = gw.modern("tok-b", "tools/list", json!({})).await;
    assert_eq!(names(&list), ["echo"]);
    gw.stop().await;
}

/// Sends `request` on a connection of its own and reads until the gateway closes it;
/// the response, or `None` if it kept the connection open for `limit`.
async fn until_closed(url: &str, request: &str, limit: Duration) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .expect("host:port")
        .to_string();
    let mut stream = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    stream
        .write_all(request.replace("HOST", &addr).as_bytes())
        .await
        .expect("write");
    let mut got = Vec::new();
    tokio::time::timeout(limit, stream.read_to_end(&mut got))
        .await
        .ok()?
        .ok()?;
    Some(String::from_utf8_lossy(&got).into_owned())
}

/// 127.0.0.2 is a loopback address of its own on Linux: a peer apart from 127.0.0.1.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_peer_holding_idle_connections_to_the_admin_listener_keeps_no_other_peer_out() {
    use mcp_harness::gateway::{TokenHash, Tokens, admin::serve};
    let queue = mcp_harness::ApprovalQueue::new(Duration::from_secs(60));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let tokens: Tokens = Arc::new(|| {
        vec![TokenHash {
            sha256: sha256_hex(b"adm"),
        }]
    });
    let server = tokio::spawn(serve(queue, tokens, listener, std::future::pending()));
    // More connections than the listener serves at once, from one peer, sending nothing.
    let mut idle = Vec::new();
    for _ in 0..100 {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind("127.0.0.2:0".parse().expect("addr"))
            .expect("bind 127.0.0.2");
        idle.push(socket.connect(addr).await.expect("connect"));
    }
    let url = format!("http://{addr}/approvals");
    // Answered at once, and the connection closed after its one request.
    let listed = until_closed(
        &url,
        "GET /approvals HTTP/1.1\r\nHost: HOST\r\nAuthorization: Bearer adm\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert!(
        listed
            .as_deref()
            .is_some_and(|r| r.starts_with("HTTP/1.1 200") && r.contains("pending")),
        "{listed:?}"
    );
    let refused = until_closed(
        &url,
        "GET /approvals HTTP/1.1\r\nHost: HOST\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert!(
        refused
            .as_deref()
            .is_some_and(|r| r.starts_with("HTTP/1.1 401")),
        "{refused:?}"
    );
    // The idle peer's connections past its share were closed unread.
    let mut closed = 0;
    for stream in &mut idle {
        use tokio::io::AsyncReadExt;
        let mut byte = [0u8; 1];
        if let Ok(Ok(0)) =
            tokio::time::timeout(Duration::from_millis(20), stream.read(&mut byte)).await
        {
            closed += 1;
        }
    }
    assert!(closed >= 100 - 8, "{closed} of 100 closed");
    server.abort();
}

// A peer that opens connections to /mcp and sends nothing holds max_connections_per_peer
// of them; the rest are closed at once, and another peer is served. Before, it could hold
// all 1,024, each for the header timeout, and new clients waited in the backlog.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_peer_holding_idle_connections_to_the_mcp_listener_holds_only_its_share() {
    let setup = Setup::new("max_connections_per_peer = 4", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let addr: std::net::SocketAddr = gw.authority().parse().expect("addr");
    let mut idle = Vec::new();
    for _ in 0..20 {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind("127.0.0.2:0".parse().expect("addr"))
            .expect("bind 127.0.0.2");
        idle.push(socket.connect(addr).await.expect("connect"));
    }
    let (status, r) = gw.modern("tok-a", "tools/list", json!({})).await;
    assert_eq!(status, 200, "{r}");
    let mut closed = 0;
    for stream in &mut idle {
        use tokio::io::AsyncReadExt;
        let mut byte = [0u8; 1];
        if let Ok(Ok(0)) =
            tokio::time::timeout(Duration::from_millis(200), stream.read(&mut byte)).await
        {
            closed += 1;
        }
    }
    assert_eq!(closed, 20 - 4, "the peer keeps its four");
    gw.stop().await;
}

// Out of file descriptors, every accept fails at once while the connection waits in the
// backlog: the listener pauses between tries instead of spinning (which its log's count
// of failures shows), and serves again once descriptors are free.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn out_of_descriptors_the_listener_pauses_and_then_serves_again() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let log = temp_file(&format!("{}-stderr", setup.tag));
    let config = setup.config.display().to_string();
    let server = HttpServer::start_with(
        &harness_exe(),
        &["serve", "--config", &config, "--listen", "127.0.0.1:0"],
        &[("RUST_LOG", "warn")],
        std::fs::File::create(&log).expect("log").into(),
    )
    .await;
    let gw = Gateway {
        server,
        http: http_client(),
    };
    // Both servers running first: their pipes are open before the limit.
    let (status, r) = gw.modern("tok-a", "tools/list", json!({})).await;
    assert_eq!(status, 200, "{r}");
    let pid = gw.server.child.id().expect("pid");
    let open: Vec<libc::rlim_t> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fds")
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
        .collect();
    // New descriptors take the lowest free numbers below the limit: below one of as
    // many as are open, there are as many free as are open above it.
    let cap = open.len() as libc::rlim_t;
    let free_below = open.iter().filter(|fd| **fd >= cap).count();
    let limit = |soft: Option<libc::rlim_t>| {
        let mut old = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: plain values in, `old` out; the target is our own child.
        let rc = unsafe {
            libc::prlimit(
                pid as libc::pid_t,
                libc::RLIMIT_NOFILE,
                std::ptr::null(),
                &mut old,
            )
        };
        assert_eq!(rc, 0, "read the limit");
        if let Some(soft) = soft {
            let new = libc::rlimit {
                rlim_cur: soft,
                rlim_max: old.rlim_max,
            };
            // SAFETY: as above.
            let rc = unsafe {
                libc::prlimit(
                    pid as libc::pid_t,
                    libc::RLIMIT_NOFILE,
                    &new,
                    std::ptr::null_mut(),
                )
            };
            assert_eq!(rc, 0, "set the limit");
        }
        old.rlim_cur
    };
    let before = limit(Some(cap));
    let mut held = Vec::new();
    // More than the free numbers below the limit can take.
    for _ in 0..free_below + 8 {
        held.push(
            tokio::net::TcpStream::connect(gw.authority())
                .await
                .expect("connect"),
        );
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    drop(held);
    limit(Some(before));
    let (status, r) = gw.modern("tok-a", "tools/list", json!({})).await;
    assert_eq!(status, 200, "served again: {r}");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let failures: Vec<u64> = text
        .lines()
        .filter(|l| l.contains("accept failed"))
        .filter_map(|l| {
            l.split("failed=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect();
    let Some(most) = failures.iter().copied().max() else {
        panic!("no accept failed: {text}");
    };
    // About ten tries a second with the pause; without it, a try every few microseconds.
    assert!(
        most < 64,
        "{most} failed accepts in 1.5 s: a spinning listener"
    );
    gw.stop().await;
    let _ = std::fs::remove_file(&log);
}

/// The server's question was refused as the client does not support it (-32602).
fn assert_unsupported(r: &Value) {
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("does not support")),
        "{r}"
    );
}

// A legacy server's elicitation during the call of a client that declared none is
// answered that the client does not support it, not with a decline the user never
// made (the input handlers' answer outside calls).
#[tokio::test]
async fn a_legacy_servers_question_to_a_client_without_elicitation_is_refused_not_declined() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let mut call = request(
        "tools/call",
        json!({"name": "beta__confirm", "arguments": {"message": "Pay?"}}),
    );
    call["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] = json!({});
    let (_, r, _) = gw.post(Some("tok-a"), &call, &[]).await;
    assert_unsupported(&r);
    gw.stop().await;
}

// The same for a 2025-11-25 client whose session declared no elicitation: the legacy
// server hears that the client does not support it.
#[tokio::test]
async fn a_legacy_servers_question_to_a_legacy_client_without_elicitation_is_refused() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let sid = legacy_session(&gw).await;
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "beta__confirm", "arguments": {"message": "Pay?"}}});
    let (_, r, _) = legacy_post(&gw, Some(&sid), call).await;
    assert_unsupported(&r);
    gw.stop().await;
}

// A missing client capability is a 400, whatever progressToken the request carries: one
// the gateway does not take (null, a fraction, an object) made the answer an event
// stream, and the error went out as 200.
#[tokio::test]
async fn a_progress_token_the_gateway_does_not_take_leaves_the_status_of_an_error_as_it_is() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    for token in [
        None,
        Some(json!(null)),
        Some(json!(1.5)),
        Some(json!({"a": 1})),
        Some(json!("p1")),
    ] {
        let mut call = request(
            "tools/call",
            json!({"name": "alpha__confirm", "arguments": {"message": "Pay?"}}),
        );
        // No elicitation declared: the tool needs it.
        call["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] = json!({});
        if let Some(token) = &token {
            call["params"]["_meta"]["progressToken"] = token.clone();
        }
        let (status, r, _) = gw.post(Some("tok-a"), &call, &[]).await;
        assert_eq!(
            (status, r["error"]["code"].as_i64()),
            (400, Some(-32021)),
            "{token:?}: {r}"
        );
    }
    gw.stop().await;
}

type StdioLines = tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>;

/// `serve --stdio` as agent `a` on `setup`'s config: the process, its input, and its
/// output line by line.
fn stdio_gateway(
    setup: &Setup,
) -> (
    tokio::process::Child,
    tokio::process::ChildStdin,
    StdioLines,
) {
    stdio_gateway_as(setup, "a")
}

/// `serve --stdio` for `setup`, its session acting as `agent`.
fn stdio_gateway_as(
    setup: &Setup,
    agent: &str,
) -> (
    tokio::process::Child,
    tokio::process::ChildStdin,
    StdioLines,
) {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(harness_exe())
        .args(["serve", "--stdio", "--agent", agent, "--config"])
        .arg(&setup.config)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn serve --stdio");
    let stdin = child.stdin.take().expect("stdin");
    let lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    (child, stdin, lines)
}

/// Writes one message to `serve --stdio`, as a line.
async fn send_line(stdin: &mut tokio::process::ChildStdin, message: &Value) {
    use tokio::io::AsyncWriteExt;
    stdin
        .write_all(format!("{message}\n").as_bytes())
        .await
        .expect("write");
}

/// The next message `serve --stdio` writes, within 20 s.
async fn next_message(lines: &mut StdioLines) -> Value {
    let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("a message in time")
        .expect("read")
        .expect("a line");
    serde_json::from_str::<Value>(&line).expect("JSON")
}

// A stdio session's parked rounds are its own: once its input ends nobody can resume
// them, and their calls end with it rather than hold the harness's shutdown for its
// whole grace (a minute here).
#[tokio::test]
async fn a_stdio_sessions_parked_rounds_end_with_it() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let text = std::fs::read_to_string(&setup.config).expect("config");
    std::fs::write(&setup.config, format!("shutdown_grace = \"60s\"\n{text}")).expect("config");
    let (mut child, mut stdin, mut lines) = stdio_gateway(&setup);
    let call = request(
        "tools/call",
        json!({"name": "beta__confirm", "arguments": {"message": "ok?"}}),
    );
    send_line(&mut stdin, &call).await;
    let parked = next_message(&mut lines).await;
    assert_eq!(parked["result"]["resultType"], "input_required", "{parked}");
    drop(stdin);
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("ended without waiting out the grace for the parked call")
        .expect("wait");
    assert!(status.success(), "{status}");
    let (started, finished) = setup.audit_counts();
    assert_eq!(
        (started, finished),
        (1, 1),
        "the parked call is recorded as ended"
    );
}

// Stdin a pipe and stdout a file (`… | serve --stdio > out.jsonl`): a pause in the input
// is no end of it. (Stdin made a reactor pipe alone is non-blocking for the blocking
// reader, which took the pause for an error and ended the session.)
#[tokio::test]
async fn a_stdio_session_piped_in_and_written_to_a_file_waits_out_a_pause() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let out = temp_file(&format!("{}-out.jsonl", setup.tag));
    let mut child = tokio::process::Command::new(harness_exe())
        .args(["serve", "--stdio", "--agent", "a", "--config"])
        .arg(&setup.config)
        .stdin(std::process::Stdio::piped())
        .stdout(std::fs::File::create(&out).expect("out file"))
        .kill_on_drop(true)
        .spawn()
        .expect("spawn serve --stdio");
    let mut stdin = child.stdin.take().expect("stdin");
    let answered = |n: usize| {
        let out = out.clone();
        async move {
            for _ in 0..400 {
                let text = std::fs::read_to_string(&out).unwrap_or_default();
                if text.lines().count() >= n {
                    return text;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("fewer than {n} answers in 20 s");
        }
    };
    send_line(&mut stdin, &request("tools/list", json!({}))).await;
    answered(1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        child.try_wait().expect("wait").is_none(),
        "ended at the pause"
    );
    send_line(&mut stdin, &request("tools/list", json!({}))).await;
    let text = answered(2).await;
    for line in text.lines() {
        let answer: Value = serde_json::from_str(line).expect("JSON");
        assert!(!names(&answer).is_empty(), "{answer}");
    }
    drop(stdin);
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("ends with its input")
        .expect("wait");
    assert!(status.success(), "{status}");
    let _ = std::fs::remove_file(out);
}

// A config edited while the gateway's servers start is applied once it serves: the
// baseline a reload compares with is the text it runs, not the file as it was when the
// watch began (an operator revoking a token then would have seen it keep working).
#[tokio::test]
async fn a_config_edited_while_the_servers_start_is_applied_once_it_serves() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let text = std::fs::read_to_string(&setup.config).expect("config");
    // A server three seconds slow to start holds the listener back that long.
    let slow = format!(
        "[[servers]]\nid = \"slow\"\ntransport = {{ type = \"stdio\", command = \"sh\", args = [\"-c\", \"sleep 3; exec {} demo-server slow\"] }}\n",
        harness_exe()
    );
    std::fs::write(&setup.config, format!("{slow}{text}")).expect("config");
    let revoked: String = format!("{slow}{text}")
        .lines()
        .filter(|l| !l.contains("agent = \"b\""))
        .map(|l| format!("{l}\n"))
        .collect();
    let config = setup.config.clone();
    let edit = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1000)).await;
        std::fs::write(&config, revoked).expect("edit");
    });
    let gw = setup.start().await;
    edit.await.expect("edited");
    let mut refused = false;
    for _ in 0..100 {
        let (status, _) = gw.modern("tok-b", "tools/list", json!({})).await;
        if status == 401 {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        refused,
        "the token revoked while the servers started is refused"
    );
    gw.stop().await;
}

// A config file written in place is read once it holds still: a half that parses
// (here without the beta server) and lasts less than a second is not applied. Before,
// beta was removed at the tick that read the half and added again at the next one.
#[tokio::test]
async fn a_config_half_written_in_place_is_not_applied() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    // Beta's table last, beta recording what it is sent: the file up to its table is a
    // whole config, without beta.
    let record = temp_file("half-written");
    let text = std::fs::read_to_string(&setup.config).expect("config");
    let beta_at = text
        .find("[[servers]]\nid = \"beta\"")
        .expect("beta's table");
    let beta_end = beta_at + text[beta_at..].find("\n\n").expect("its end");
    let beta = text[beta_at..beta_end].replace(
        "\"--era\", \"legacy\"",
        &format!(
            "\"--era\", \"legacy\", \"--record\", {:?}",
            record.to_string_lossy()
        ),
    );
    let whole = format!("{}{}\n\n{beta}\n", &text[..beta_at], &text[beta_end + 2..]);
    std::fs::write(&setup.config, &whole).expect("config");
    let beta_at = whole
        .find("[[servers]]\nid = \"beta\"")
        .expect("beta's table");
    let gw = setup.start().await;
    let started = || {
        recorded(&record)
            .iter()
            .filter(|r| r["method"] == "initialize")
            .count()
    };
    assert!(eventually(Duration::from_secs(10), || started() == 1).await);
    // The first part of the file, up to beta's table, for 600 ms (held still for
    // less than the 900 ms a change must), then the whole file again for 1.15 s; four
    // times, so that ticks read a half whatever their phase.
    for _ in 0..4 {
        std::fs::write(&setup.config, &whole[..beta_at]).expect("half");
        tokio::time::sleep(Duration::from_millis(600)).await;
        std::fs::write(&setup.config, &whole).expect("whole");
        tokio::time::sleep(Duration::from_millis(1150)).await;
    }
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(started(), 1, "beta was removed and started again");
    gw.stop().await;
    let _ = std::fs::remove_file(record);
}

/// `serve --stdio` of `config`, its pipes taken, logging warnings to its stderr.
fn serve_stdio_logging(config: &std::path::Path) -> tokio::process::Child {
    tokio::process::Command::new(harness_exe())
        .args(["serve", "--stdio", "--config"])
        .arg(config)
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn serve --stdio")
}

/// What `err` says until `done` holds of it, or `limit` has passed.
async fn said_until(
    err: &mut tokio::process::ChildStderr,
    limit: Duration,
    done: impl Fn(&str) -> bool,
) -> String {
    use tokio::io::AsyncReadExt;
    let mut said = String::new();
    let mut chunk = [0u8; 4096];
    let deadline = std::time::Instant::now() + limit;
    while !done(&said) && std::time::Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_millis(200), err.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => said.push_str(&String::from_utf8_lossy(&chunk[..n])),
            Ok(_) => break,
            Err(_) => {}
        }
    }
    said
}

// A config file anyone may write is served with a warning, once, and not reloaded; it
// is not taken for a change to refuse when nothing changed (it was, after a second).
#[tokio::test]
async fn a_config_anyone_may_write_is_warned_of_once_and_no_reload_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    std::fs::set_permissions(&setup.config, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let mut child = serve_stdio_logging(&setup.config);
    let mut stdin = child.stdin.take().expect("stdin");
    let mut err = child.stderr.take().expect("stderr");
    let mut lines = {
        use tokio::io::AsyncBufReadExt;
        tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines()
    };
    send_line(&mut stdin, &request("tools/list", json!({}))).await;
    let listed = next_message(&mut lines).await;
    assert!(listed["result"].is_object(), "served: {listed}");
    // Three of the watcher's ticks, past the second a change is held still for.
    let said = said_until(&mut err, Duration::from_secs(3), |_| false).await;
    assert_eq!(
        said.matches("may be written by others").count(),
        1,
        "{said}"
    );
    assert!(!said.contains("not reloaded"), "{said}");
    drop(stdin);
    let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
}

// The agent a `serve --stdio` session acts as is taken at start: a reload that changes
// the config's `agent` names it in the warning of settings kept until a restart.
#[tokio::test]
async fn a_reload_that_changes_a_stdio_sessions_agent_says_it_is_kept() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let text = std::fs::read_to_string(&setup.config).expect("config");
    std::fs::write(&setup.config, format!("agent = \"a\"\n{text}")).expect("config");
    let mut child = serve_stdio_logging(&setup.config);
    let stdin = child.stdin.take().expect("stdin");
    let mut err = child.stderr.take().expect("stderr");
    // Served: it answers a listing.
    let mut lines = {
        use tokio::io::AsyncBufReadExt;
        tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines()
    };
    let mut stdin = stdin;
    {
        let list = request("tools/list", json!({}));
        send_line(&mut stdin, &list).await;
    }
    let listed = next_message(&mut lines).await;
    assert!(!names(&listed).is_empty(), "{listed}");
    let tmp = setup.config.with_extension("tmp");
    std::fs::write(&tmp, format!("agent = \"b\"\n{text}")).expect("write");
    std::fs::rename(&tmp, &setup.config).expect("rename");
    let pid = child.id().expect("pid");
    let _ = std::process::Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status();
    let said = said_until(&mut err, Duration::from_secs(20), |s| {
        s.contains("read at start only")
    })
    .await;
    let warning = said
        .lines()
        .find(|l| l.contains("read at start only"))
        .unwrap_or_default();
    assert!(warning.contains("agent"), "{said}");
    drop(stdin);
    let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
}

// A stdio session's principal needs no token (a pipe is its own credential): its
// parked rounds last while it does. Before, the sweep kept only principals a token
// named, and dropped the round within a second.
#[tokio::test]
async fn a_stdio_session_without_a_token_keeps_its_parked_rounds() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let text = std::fs::read_to_string(&setup.config).expect("config");
    // Agent c is granted beta and named by no token.
    std::fs::write(
        &setup.config,
        format!("{text}\n[permissions.c]\nbeta = [\"*\"]\n"),
    )
    .expect("config");
    let (mut child, mut stdin, mut lines) = stdio_gateway_as(&setup, "c");
    let params = json!({"name": "beta__confirm", "arguments": {"message": "ok?"}});
    let call = request("tools/call", params.clone());
    send_line(&mut stdin, &call).await;
    let parked = next_message(&mut lines).await;
    assert_eq!(parked["result"]["resultType"], "input_required", "{parked}");
    // Past two sweeps.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut again = params;
    again["requestState"] = parked["result"]["requestState"].clone();
    again["inputResponses"] =
        json!({"elicitation": {"action": "accept", "content": {"approved": true}}});
    let answer = request("tools/call", again);
    send_line(&mut stdin, &answer).await;
    let done = next_message(&mut lines).await;
    assert_eq!(result_text(&done), "approved: true", "{done}");
    drop(stdin);
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("ended")
        .expect("wait");
    assert!(status.success(), "{status}");
}

// A line on the pipe is a request body, held to max_body_bytes as an HTTP body is: one
// longer is read past unkept and answered with an error, and the session goes on.
// Before, lines up to 16 MiB were taken whatever the setting.
#[tokio::test]
async fn a_stdio_line_longer_than_max_body_bytes_is_refused_and_the_session_goes_on() {
    use tokio::io::AsyncWriteExt;
    let setup = Setup::new("max_body_bytes = 65536", &[("k1", &key("k1"))]);
    let (mut child, mut stdin, mut lines) = stdio_gateway(&setup);
    let mut next = async || next_message(&mut lines).await;
    let mut long = request(
        "tools/call",
        json!({"name": "alpha__echo", "arguments": {"text": "x".repeat(100 << 10)}}),
    );
    long["id"] = json!(7);
    let mut short = request(
        "tools/call",
        json!({"name": "alpha__echo", "arguments": {"text": "hi"}}),
    );
    short["id"] = json!(8);
    stdin
        .write_all(format!("{long}\n{short}\n").as_bytes())
        .await
        .expect("write");
    let refused = next().await;
    assert_eq!(refused["id"], 7, "{refused}");
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
    let answered = next().await;
    assert_eq!(answered["id"], 8, "{answered}");
    assert!(answered["result"].is_object(), "{answered}");
    drop(stdin);
    let _ = child.wait().await;
}

/// Resident memory of process `pid`, in KiB.
fn rss_of(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

// A client that sends only subscriptions the gateway refuses, reading every answer,
// holds the session's memory flat: each refused subscription's task is let go. Before,
// finished subscription tasks were collected only after a line of another kind, and
// each held its whole future.
#[tokio::test]
async fn refused_subscriptions_alone_do_not_grow_a_stdio_sessions_memory() {
    use tokio::io::AsyncWriteExt;
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let (mut child, stdin, mut lines) = stdio_gateway(&setup);
    let pid = child.id().expect("pid");
    // No client capabilities in the envelope: refused at once.
    let line = |id: u64| {
        format!(
            "{}\n",
            json!({"jsonrpc": "2.0", "id": id, "method": "subscriptions/listen",
                   "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": MODERN}}})
        )
    };
    // In batches, each answered before the next: no queue holds any of them when the
    // memory is read.
    let mut stdin = stdin;
    let mut rss = Vec::new();
    for batch in 0..60u64 {
        let lines_out: String = (batch * 1000..(batch + 1) * 1000).map(line).collect();
        stdin.write_all(lines_out.as_bytes()).await.expect("write");
        for _ in 0..1000 {
            let answer = next_message(&mut lines).await;
            assert!(answer["error"].is_object(), "{answer}");
        }
        if (batch + 1) % 20 == 0 {
            rss.push(rss_of(pid));
        }
    }
    // Past the first third (the allocator's and the runtime's own growth), flat.
    let grew = rss[2].saturating_sub(rss[0]);
    assert!(
        grew < 16 << 10,
        "grew {grew} KiB over 40,000 refused subscriptions: {rss:?}"
    );
    drop(stdin);
    let _ = child.wait().await;
}

// A shortened name the gateway no longer knows (after a reload) whose own server cannot
// be listed is refused, not routed to a server whose tool took that very name to pass
// for it. Before, the hostile tool answered the call.
#[tokio::test]
async fn a_shortened_name_of_a_server_that_cannot_be_listed_never_reaches_a_look_alike() {
    let setup = Setup::new("prefix = \"never\"", &[("k1", &key("k1"))]);
    let short = format!("send_email_{}", &sha256_hex(b"send email")[..16]);
    let text = std::fs::read_to_string(&setup.config).expect("config");
    let alpha = format!("\"alpha{}\"]", setup.tag);
    let beta = format!("\"beta{}\", \"--era\", \"legacy\"]", setup.tag);
    let text = text
        .replace(
            &alpha,
            &format!("\"alpha{}\", \"--tool-alias\", \"send email\"]", setup.tag),
        )
        .replace(
            &beta,
            &format!(
                "\"beta{}\", \"--era\", \"legacy\", \"--tool-alias\", \"{short}\"]",
                setup.tag
            ),
        );
    std::fs::write(&setup.config, &text).expect("config");
    let (mut child, mut stdin, mut lines) = stdio_gateway(&setup);
    send_line(&mut stdin, &request("tools/list", json!({}))).await;
    let listed = next_message(&mut lines).await;
    assert!(
        names(&listed).contains(&short),
        "alpha's tool served shortened: {listed}"
    );
    // A reload: alpha's command is gone (it cannot start, so cannot be listed), and the
    // shortened names are learned afresh.
    let tmp = setup.config.with_extension("tmp");
    std::fs::write(
        &tmp,
        text.replacen(&harness_exe(), "/nonexistent/mcp-server", 1),
    )
    .expect("write");
    std::fs::rename(&tmp, &setup.config).expect("rename");
    let pid = child.id().expect("pid");
    let _ = std::process::Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status();
    let mut id = 10;
    let gone = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            id += 1;
            let mut list = request("tools/list", json!({}));
            list["id"] = json!(id);
            send_line(&mut stdin, &list).await;
            let listed = next_message(&mut lines).await;
            if !names(&listed).contains(&short) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(gone.is_ok(), "the reload took alpha's tool away");
    // At once (alpha may be out of the harness, removed to be added again, its old
    // process stopping) and once it is back, failed: never the look-alike.
    for (n, pause) in [(1000, 0), (1001, 2000)] {
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let mut call = request("tools/call", json!({"name": short, "arguments": {}}));
        call["id"] = json!(n);
        send_line(&mut stdin, &call).await;
        let answer = next_message(&mut lines).await;
        assert!(
            answer["error"].is_object() && !answer.to_string().contains("beta"),
            "the look-alike answered: {answer}"
        );
    }
    drop(stdin);
    let _ = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
}

// An answer to the gateway's question that is longer than max_body_bytes fails that
// question at once: the call ends with an error now, not when input_timeout (a minute
// here) runs out, and nothing is sent back under the question's id.
#[tokio::test]
async fn a_stdio_answer_longer_than_max_body_bytes_fails_its_question_at_once() {
    use tokio::io::AsyncWriteExt;
    let setup = Setup::new(
        "max_body_bytes = 65536\ninput_timeout = \"60s\"",
        &[("k1", &key("k1"))],
    );
    let (mut child, mut stdin, mut lines) = stdio_gateway(&setup);
    let mut next = async || next_message(&mut lines).await;
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {"elicitation": {}},
        "clientInfo": {"name": "raw", "version": "1"}}});
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "alpha__confirm", "arguments": {"message": "Pay?"}}});
    stdin
        .write_all(format!("{init}\n{call}\n").as_bytes())
        .await
        .expect("write");
    assert_eq!(next().await["id"], 1);
    let question = next().await;
    assert_eq!(question["method"], "elicitation/create", "{question}");
    let answer = json!({"jsonrpc": "2.0", "id": question["id"], "result": {
        "action": "accept", "content": {"note": "y".repeat(100 << 10)}}});
    send_line(&mut stdin, &answer).await;
    let ended = next().await;
    assert_eq!(ended["id"], 2, "{ended}");
    assert!(ended["error"].is_object(), "{ended}");
    drop(stdin);
    let _ = child.wait().await;
}

// A legacy client asked a legacy server's question that the server stops waiting for:
// the call goes on without the client's answer (input_timeout, a minute here), the
// question is withdrawn, and the result comes. The server gives the question up
// (`notifications/cancelled`), or its call ends with the question still open (its
// result 300 ms behind it; before, that result waited for the client's answer or
// input_timeout, since the call was not watched while the client was asked).
#[tokio::test]
async fn a_question_its_server_no_longer_waits_for_holds_a_legacy_clients_call_no_longer() {
    use tokio::io::AsyncWriteExt;
    let setup = Setup::new("input_timeout = \"60s\"", &[("k1", &key("k1"))]);
    let (mut child, mut stdin, mut lines) = stdio_gateway(&setup);
    let mut next = async || next_message(&mut lines).await;
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {"elicitation": {}},
        "clientInfo": {"name": "raw", "version": "1"}}});
    stdin
        .write_all(format!("{init}\n").as_bytes())
        .await
        .expect("write");
    assert_eq!(next().await["id"], 1);
    let cases = [
        (
            "beta__confirm",
            json!({"give_up_ms": 500}),
            "gave up asking",
        ),
        ("beta__ask_then_return", json!({"ms": 300}), "asked"),
    ];
    for (id, (tool, arguments, said)) in (2..).zip(cases) {
        let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments}});
        stdin
            .write_all(format!("{call}\n").as_bytes())
            .await
            .expect("write");
        let question = next().await;
        assert_eq!(
            question["method"], "elicitation/create",
            "{tool}: {question}"
        );
        // Not answered: the client is told, and the call ends.
        let withdrawn = next().await;
        assert_eq!(
            withdrawn["method"], "notifications/cancelled",
            "{tool}: {withdrawn}"
        );
        assert_eq!(
            withdrawn["params"]["requestId"], question["id"],
            "{tool}: {withdrawn}"
        );
        let ended = next().await;
        assert_eq!(ended["id"], id, "{tool}: {ended}");
        assert_eq!(
            ended["result"]["content"][0]["text"], said,
            "{tool}: {ended}"
        );
    }
    drop(stdin);
    let _ = child.wait().await;
}

// A browser page at an allowed origin can call the gateway: its preflight is answered
// (no credentials needed), and each answer names the origin and the headers a script
// may read. Before, OPTIONS got 405 and no answer carried CORS headers, so a browser
// blocked every call whatever allowed_origins said.
#[tokio::test]
async fn a_browser_at_an_allowed_origin_passes_cors_and_another_origin_does_not() {
    let setup = Setup::new(
        "allowed_origins = [\"https://app.example\"]",
        &[("k1", &key("k1"))],
    );
    let gw = setup.start().await;
    let preflight = |origin: &'static str| {
        gw.http
            .request(reqwest::Method::OPTIONS, gw.url())
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "Authorization, Content-Type, MCP-Protocol-Version, Mcp-Param-Region, X-Other",
            )
            .send()
    };
    let r = preflight("https://app.example").await.expect("preflight");
    assert_eq!(r.status().as_u16(), 204);
    let h = r.headers();
    assert_eq!(h["access-control-allow-origin"], "https://app.example");
    let methods = h["access-control-allow-methods"].to_str().expect("text");
    assert!(
        methods.contains("POST") && methods.contains("DELETE"),
        "{methods}"
    );
    let allowed = h["access-control-allow-headers"].to_str().expect("text");
    assert_eq!(
        allowed,
        "authorization, content-type, mcp-protocol-version, mcp-param-region"
    );
    let r = preflight("https://evil.example").await.expect("preflight");
    assert_eq!(r.status().as_u16(), 403);
    // The call itself, and a refusal, carry the origin for the script to read them.
    let (status, _, headers) = gw
        .post(
            Some("tok-a"),
            &request("tools/list", json!({})),
            &[("origin", "https://app.example")],
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        headers["access-control-allow-origin"],
        "https://app.example"
    );
    let exposed = headers["access-control-expose-headers"]
        .to_str()
        .expect("text");
    assert!(exposed.contains("mcp-session-id"), "{exposed}");
    let (status, _, headers) = gw
        .post(
            None,
            &request("tools/list", json!({})),
            &[("origin", "https://app.example")],
        )
        .await;
    assert_eq!(status, 401);
    assert_eq!(
        headers["access-control-allow-origin"],
        "https://app.example"
    );
    assert!(
        headers["access-control-expose-headers"]
            .to_str()
            .expect("text")
            .contains("www-authenticate")
    );
    // No Origin (not a browser): nothing of CORS.
    let (_, _, headers) = gw
        .post(Some("tok-a"), &request("tools/list", json!({})), &[])
        .await;
    assert!(headers.get("access-control-allow-origin").is_none());
    gw.stop().await;
}

#[tokio::test]
async fn a_principals_large_requests_in_flight_are_held_to_a_byte_budget() {
    // Bodies up to 256 KiB: a principal's large ones (over 64 KiB) come to 1 MiB at most.
    let setup = Setup::new("max_body_bytes = 262144", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let big = "x".repeat(240 * 1024);
    let call = |tool: &str, ms: u64, n: u64| {
        let mut r = request(
            "tools/call",
            json!({"name": tool, "arguments": {"ms": ms, "text": big}}),
        );
        r["id"] = json!(100 + n);
        r
    };
    // Five slow ones at once, about 246 KB each: four fit, the fifth to come is refused.
    let bodies: Vec<Value> = (0..5).map(|n| call("alpha__slow", 6000, n)).collect();
    let held = async {
        let (r0, r1, r2, r3, r4) = tokio::join!(
            gw.post(Some("tok-a"), &bodies[0], &[]),
            gw.post(Some("tok-a"), &bodies[1], &[]),
            gw.post(Some("tok-a"), &bodies[2], &[]),
            gw.post(Some("tok-a"), &bodies[3], &[]),
            gw.post(Some("tok-a"), &bodies[4], &[]),
        );
        [r0, r1, r2, r3, r4]
    };
    let meanwhile = async {
        tokio::time::sleep(Duration::from_millis(1000)).await; // while they run (deliberate)
        let small = gw
            .modern(
                "tok-a",
                "tools/call",
                json!({"name": "alpha__echo", "arguments": {"text": "small"}}),
            )
            .await;
        let other = gw
            .post(Some("tok-b"), &call("alpha__echo", 0, 10), &[])
            .await;
        (small, other)
    };
    let (held, (small, other)) = tokio::join!(held, meanwhile);
    // Statuses and errors only in the messages: the answers echo 240 KiB.
    let statuses: Vec<u16> = held.iter().map(|r| r.0).collect();
    let refused: Vec<_> = held.iter().filter(|r| r.0 == 503).collect();
    assert_eq!(refused.len(), 1, "{statuses:?}");
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        4,
        "{statuses:?}"
    );
    assert_eq!(
        refused[0].1["error"]["code"], -32000,
        "{}",
        refused[0].1["error"]
    );
    assert_eq!(refused[0].2["retry-after"], "1");
    // Small bodies take none of it, and another principal has its own.
    assert_eq!(result_text(&small.1), "small", "{}", small.1);
    assert_eq!(
        other.0, 200,
        "another principal is not held back: {}",
        other.1["error"]
    );
    // Their bytes are free again.
    let again = gw
        .post(Some("tok-a"), &call("alpha__echo", 0, 11), &[])
        .await;
    assert_eq!(again.0, 200, "{}", again.1["error"]);
    gw.stop().await;
}

/// A POST to `addr` as `token` that declares a body of 250,000 bytes, sends `sent` more
/// after its first few, and waits: a connection holding that much of a body.
async fn stalled_post(addr: &str, token: &str, sent: usize) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMCP-Protocol-Version: {MODERN}\r\nMcp-Method: tools/list\r\nContent-Length: 250000\r\n\r\n{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\",\"params\":{{\"x\":\""
    );
    stream.write_all(head.as_bytes()).await.expect("write");
    stream
        .write_all("x".repeat(sent).as_bytes())
        .await
        .expect("write");
    stream
}

#[tokio::test]
async fn large_bodies_are_charged_to_their_principals_budget_as_they_arrive() {
    // Bodies up to 256 KiB: a principal's large ones in flight come to 1 MiB at most.
    let setup = Setup::new("max_body_bytes = 262144", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let addr = gw.authority();
    // Requests that declare 250,000 bytes and send `sent` of them, then wait.
    let stalled = |sent: usize| stalled_post(&addr, "tok-a", sent);
    let call = |n: u64| {
        let mut r = request(
            "tools/call",
            json!({"name": "alpha__echo", "arguments": {"text": "y".repeat(100 * 1024)}}),
        );
        r["id"] = json!(n);
        r
    };
    let served_soon = |first: u64| {
        let gw = &gw;
        let call = &call;
        async move {
            let mut status = 0;
            for n in 0..100 {
                status = gw.post(Some("tok-a"), &call(first + n), &[]).await.0;
                if status == 200 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            status
        }
    };
    // Four that trickle hold only what they sent: a whole large request is served.
    let mut trickling = Vec::new();
    for _ in 0..4 {
        trickling.push(stalled(100).await);
    }
    let served = gw.post(Some("tok-a"), &call(1), &[]).await;
    assert_eq!(served.0, 200, "a trickle blocked the budget");
    drop(trickling);
    // Four that sent all but 100 bytes hold nearly all of it: a fifth large body
    // (100 KiB) is refused, with an answer (its body read and dropped), not a reset.
    // Before, bodies were read whole before they counted: each connection could hold
    // max_body_bytes. Should the fifth come before the gateway has read the four (it
    // would then take their room), they start again.
    let mut refused = (0, Value::Null, reqwest::header::HeaderMap::new());
    let mut held = Vec::new();
    for n in 0..20 {
        held.clear();
        for _ in 0..4 {
            held.push(stalled(250_000 - 100).await);
        }
        tokio::time::sleep(Duration::from_millis(200)).await; // their bytes read (deliberate)
        refused = gw.post(Some("tok-a"), &call(200 + n), &[]).await;
        if refused.0 == 503 {
            break;
        }
    }
    assert_eq!(refused.0, 503, "{}", refused.1["error"]);
    assert_eq!(refused.2["retry-after"], "1");
    // Another principal has its own budget; a small request takes none of it.
    assert_eq!(gw.post(Some("tok-b"), &call(2), &[]).await.0, 200);
    let (status, small) = gw
        .modern(
            "tok-a",
            "tools/call",
            json!({"name": "alpha__echo", "arguments": {"text": "small"}}),
        )
        .await;
    assert_eq!((status, result_text(&small)), (200, "small"), "{small}");
    // Their clients gone, their bytes are free.
    drop(held);
    assert_eq!(served_soon(300).await, 200);
    gw.stop().await;
}

// Every principal's large bodies together are bounded too: with a JWT issuer each
// subject is a principal, and each one's budget alone would let many of them hold
// without bound.
#[tokio::test]
async fn every_principals_large_bodies_together_are_bounded() {
    let (signing, jwk) = es256_key("k1");
    let jwks = temp_file("jwks-all");
    std::fs::write(&jwks, json!({"keys": [jwk]}).to_string()).expect("jwks");
    // Bodies up to 256 KiB: 1 MiB of large ones per principal, 4 MiB in all.
    let setup = Setup::new(
        &format!(
            "max_body_bytes = 262144\njwt = {{ issuer = \"{JWT_ISS}\", audience = \"{JWT_AUD}\", jwks_file = \"{}\", context_claim = \"email\" }}\n\n[permissions.c]\nalpha = [\"echo\"]",
            jwks.display()
        ),
        &[("k1", &key("k1"))],
    );
    let gw = setup.start().await;
    let addr = gw.authority();
    let now = unix_now();
    let token = |user: usize| {
        jwt(
            &signing,
            "k1",
            json!({"iss": JWT_ISS, "aud": JWT_AUD, "sub": "c", "exp": now + 600,
                "email": format!("user{user}@idp.test")}),
        )
    };
    // A request as `user` that declares 250,000 bytes, sends all but 100, and waits.
    let stalled = |user: usize| {
        let (addr, token) = (addr.clone(), token(user));
        async move { stalled_post(&addr, &token, 250_000 - 100).await }
    };
    let call = request(
        "tools/call",
        json!({"name": "alpha__echo", "arguments": {"text": "y".repeat(100 * 1024)}}),
    );
    // Four users hold their whole budgets: a fifth user's large body is refused, though
    // its own budget is untouched. Should it come before the gateway has read the
    // others (it would take their room), they start again.
    let mut refused = (0, Value::Null, reqwest::header::HeaderMap::new());
    let mut held = Vec::new();
    for _ in 0..20 {
        held.clear();
        for user in 0..4 {
            for _ in 0..4 {
                held.push(stalled(user).await);
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await; // their bytes read (deliberate)
        refused = gw.post(Some(&token(4)), &call, &[]).await;
        if refused.0 == 503 {
            break;
        }
    }
    assert_eq!(refused.0, 503, "{}", refused.1["error"]);
    let said = refused.1["error"]["message"].as_str().unwrap_or_default();
    assert!(said.contains("every agent's 4194304"), "{said}");
    // A small request takes none of it.
    let (status, small) = gw
        .modern(
            &token(4),
            "tools/call",
            json!({"name": "alpha__echo", "arguments": {"text": "small"}}),
        )
        .await;
    assert_eq!((status, result_text(&small)), (200, "small"), "{small}");
    // Their clients gone, their bytes are free.
    drop(held);
    let mut status = 0;
    for _ in 0..100 {
        status = gw.post(Some(&token(4)), &call, &[]).await.0;
        if status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status, 200);
    gw.stop().await;
    let _ = std::fs::remove_file(jwks);
}

#[tokio::test]
async fn a_legacy_clients_large_answers_are_not_kept_out_by_its_large_calls_waiting_for_them() {
    // Bodies up to 256 KiB: a principal's large ones in flight come to 1 MiB at most.
    let setup = Setup::new("max_body_bytes = 262144", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {"sampling": {}},
        "clientInfo": {"name": "raw", "version": "1"}}});
    let (status, r, sid) = legacy_post(&gw, None, init).await;
    assert_eq!(status, 200, "{r}");
    let sid = sid.expect("a session id");
    let post = |body: Value| {
        gw.http
            .post(gw.url())
            .bearer_auth("tok-a")
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .header("mcp-session-id", &sid)
            .body(body.to_string())
            .send()
    };
    // Four calls of about 246 KB each: the principal's budget is theirs until they end,
    // and each waits for its client's model (a question on its own stream).
    let text = "x".repeat(240 * 1024);
    let mut calls = Vec::new();
    for n in 0..4 {
        let call = json!({"jsonrpc": "2.0", "id": 10 + n, "method": "tools/call",
            "params": {"name": "alpha__summarize", "arguments": {"text": text}}});
        calls.push(tokio::spawn(post(call)));
    }
    let mut streams = Vec::new();
    for call in calls {
        let resp = call.await.expect("join").expect("post");
        assert_eq!(resp.status().as_u16(), 200);
        streams.push(resp);
    }
    // Each question answered with 100 KiB: the answers have a budget of their own.
    let said = "y".repeat(100 * 1024);
    for stream in &mut streams {
        let mut seen = String::new();
        assert!(
            read_until(stream, &mut seen, "sampling/createMessage").await,
            "{}",
            seen.chars().take(300).collect::<String>()
        );
        // The question's event is long (it quotes the text): read to its end.
        let at = seen.find("sampling/createMessage").expect("found");
        while !seen[at..].contains("\n\n") {
            let chunk = tokio::time::timeout(Duration::from_secs(20), stream.chunk())
                .await
                .expect("in time")
                .expect("read")
                .expect("more");
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
        let question: Value = seen
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|m| m["method"] == "sampling/createMessage")
            .expect("the question");
        let answer = json!({"jsonrpc": "2.0", "id": question["id"], "result": {
            "role": "assistant", "content": {"type": "text", "text": said},
            "model": "m", "stopReason": "endTurn"}});
        let answered = post(answer).await.expect("post");
        assert_eq!(answered.status().as_u16(), 202, "the answer was refused");
    }
    for stream in &mut streams {
        let mut seen = String::new();
        assert!(
            read_until(stream, &mut seen, "summary: yyyy").await,
            "{}",
            seen.chars().take(300).collect::<String>()
        );
    }
    gw.stop().await;
}

// A legacy client's call is held to call_timeout across its rounds and the questions
// it is asked. Before, each round began a deadline of its own and each question waited
// input_timeout whatever was left: a minute here, against the call's 1.5 s.
#[tokio::test]
async fn a_legacy_clients_call_ends_at_its_deadline_while_its_question_waits() {
    let setup = Setup::new("input_timeout = \"60s\"", &[("k1", &key("k1"))]);
    let text = std::fs::read_to_string(&setup.config).expect("config");
    std::fs::write(&setup.config, format!("call_timeout = \"1500ms\"\n{text}")).expect("config");
    let gw = setup.start().await;
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {"elicitation": {}},
        "clientInfo": {"name": "raw", "version": "1"}}});
    let (status, r, sid) = legacy_post(&gw, None, init).await;
    assert_eq!(status, 200, "{r}");
    let sid = sid.expect("a session id");
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "alpha__confirm", "arguments": {"message": "Pay?"}}});
    let started = std::time::Instant::now();
    let mut resp = gw
        .http
        .post(gw.url())
        .bearer_auth("tok-a")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .header("mcp-session-id", &sid)
        .body(call.to_string())
        .send()
        .await
        .expect("post");
    let mut seen = String::new();
    assert!(
        read_until(&mut resp, &mut seen, "elicitation/create").await,
        "{seen}"
    );
    // Never answered: the call's answer comes at its deadline.
    assert!(read_until(&mut resp, &mut seen, "\"id\":2").await, "{seen}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    let answer: Value = seen
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|m| m["id"] == 2)
        .expect("the call's answer");
    assert!(answer["error"].is_object(), "{answer}");
    gw.stop().await;
}

#[tokio::test]
async fn what_is_not_json_is_a_parse_error_and_json_that_is_not_json_rpc_an_invalid_request() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    for (body, code) in [
        ("{not json", -32700),
        (r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#, -32600),
        (r#"{"id":1,"method":"ping"}"#, -32600),
        // A 2026-07-28 client never POSTs a response: nothing here asked it.
        (r#"{"jsonrpc":"2.0","id":1,"result":{}}"#, -32600),
    ] {
        let resp = gw
            .modern_post("tok-a", "ping", "")
            .body(body)
            .send()
            .await
            .expect("post");
        assert_eq!(resp.status(), 400, "{body}");
        let r: Value = resp.json().await.expect("a JSON-RPC error");
        assert_eq!(r["error"]["code"], code, "{body}: {r}");
    }
    gw.stop().await;
}

#[tokio::test]
async fn a_client_refused_before_it_is_identified_does_not_keep_its_connection() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let url = gw.server.url.clone();
    for (request, status) in [
        ("GET /nowhere HTTP/1.1\r\nHost: HOST\r\n\r\n", "404"),
        (
            "POST /mcp HTTP/1.1\r\nHost: HOST\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
            "401",
        ),
        (
            "GET /mcp HTTP/1.1\r\nHost: HOST\r\nOrigin: http://evil.example\r\n\r\n",
            "403",
        ),
        // A preflight from the host's own origin needs no credentials: repeated, it
        // held a connection slot for good.
        (
            "OPTIONS /mcp HTTP/1.1\r\nHost: HOST\r\nOrigin: http://HOST\r\nAccess-Control-Request-Method: POST\r\n\r\n",
            "204",
        ),
    ] {
        // Kept alive, the connection would stay until the 10 s header timeout.
        let got = until_closed(&url, request, Duration::from_secs(5))
            .await
            .unwrap_or_else(|| panic!("kept open after a {status}"));
        assert!(got.starts_with(&format!("HTTP/1.1 {status}")), "{got}");
    }
    gw.stop().await;
}

/// A minute-long call of alpha's (id 1), and a quick one (id 2).
fn slow_and_quick() -> (Value, Value) {
    let slow = request(
        "tools/call",
        json!({"name": "alpha__slow", "arguments": {"ms": 60_000, "text": "late"}}),
    );
    let mut quick = request(
        "tools/call",
        json!({"name": "alpha__echo", "arguments": {"text": "now"}}),
    );
    quick["id"] = json!(2);
    (slow, quick)
}

// A reload's new `max_in_flight_per_principal` holds for a principal that never stops
// being busy: before, its limiter kept the old size for as long as it held any call.
#[tokio::test]
async fn a_lower_limit_reloaded_holds_for_a_principal_that_stays_busy() {
    let setup = Setup::new("max_in_flight_per_principal = 8", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let (slow, quick) = slow_and_quick();
    let rest = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let text = std::fs::read_to_string(&setup.config)
            .expect("config")
            .replace(
                "max_in_flight_per_principal = 8",
                "max_in_flight_per_principal = 1",
            );
        gw.reload_with(&setup, &text);
        for _ in 0..400 {
            let (_, r, _) = gw.post(Some("tok-a"), &quick, &[]).await;
            if r["error"]["code"] == -32000 {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        false
    };
    let refused = tokio::select! {
        r = gw.post(Some("tok-a"), &slow, &[]) => panic!("the slow call ended: {:?}", r.1),
        refused = rest => refused,
    };
    assert!(refused, "the call past the new limit was admitted");
    gw.stop().await;
}

#[tokio::test]
async fn a_principal_past_its_limit_is_refused_at_once_and_a_cancel_reaches_the_upstream_call() {
    let setup = Setup::new("max_in_flight_per_principal = 1", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let (slow, quick) = slow_and_quick();
    let started = std::time::Instant::now();
    let first = async {
        // Until it holds the slot (a quick call may hold it for a moment).
        loop {
            let r = gw.post(Some("tok-a"), &slow, &[]).await;
            if r.1["error"]["code"] != -32000 {
                break r;
            }
        }
    };
    let rest = async {
        // The second call is refused while the first holds a's one slot.
        let mut refused = false;
        for _ in 0..1200 {
            let (_, r, _) = gw.post(Some("tok-a"), &quick, &[]).await;
            if r["error"]["code"] == -32000 {
                refused = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        // Another principal is not limited by a's calls.
        let (_, other, _) = gw.post(Some("tok-b"), &quick, &[]).await;
        // A modern client cancels by closing the request's stream, not with a
        // notification (which, without a session, is taken and ignored: any client of
        // the same principal could name another's request id).
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}});
        let (status, _, _) = gw.post(Some("tok-a"), &cancel, &[]).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (_, still, _) = gw.post(Some("tok-a"), &quick, &[]).await;
        (refused, other, status, still)
    };
    let mut first = Box::pin(first);
    let (refused, other, cancel_status, still) = tokio::select! {
        r = &mut first => panic!("the slow call ended: {r:?}"),
        r = rest => r,
    };
    assert!(refused, "the second call of a was refused");
    assert_eq!(result_text(&other), "now", "{other}");
    assert_eq!(cancel_status, 202);
    assert_eq!(
        still["error"]["code"], -32000,
        "a notification did not cancel the call: {still}"
    );
    // The client goes away: the call is cancelled upstream and the slot freed.
    drop(first);
    let mut freed = None;
    for _ in 0..400 {
        let (_, r, _) = gw.post(Some("tok-a"), &quick, &[]).await;
        if r["error"]["code"] != -32000 {
            freed = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let freed = freed.expect("the slot is freed once the client went away");
    assert_eq!(result_text(&freed), "now", "{freed}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "it did not wait for the tool"
    );
    gw.stop().await;
    let text = std::fs::read_to_string(&setup.audit).unwrap_or_default();
    assert!(
        text.lines()
            .any(|l| l.contains("\"finished\"") && l.contains("cancelled")),
        "the cancelled call is audited as cancelled"
    );
}

/// A raw legacy POST on `session` (none: `initialize`); status, body, session header.
async fn legacy_post(
    gw: &Gateway,
    session: Option<&str>,
    body: Value,
) -> (u16, Value, Option<String>) {
    legacy_post_with(gw, session, body, &[]).await
}

/// [`legacy_post`] with `extra` headers too (each appended: a name may come twice).
async fn legacy_post_with(
    gw: &Gateway,
    session: Option<&str>,
    body: Value,
    extra: &[(&str, &str)],
) -> (u16, Value, Option<String>) {
    let mut req = gw
        .http
        .post(gw.url())
        .bearer_auth("tok-a")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25");
    if let Some(s) = session {
        req = req.header("mcp-session-id", s);
    }
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    let resp = req.body(body.to_string()).send().await.expect("send");
    let status = resp.status().as_u16();
    let sid = resp
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let text = resp.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::Null),
        sid,
    )
}

/// A legacy POST of `body` as `token`, naming `version` and session `sid`.
async fn legacy_post_as(
    gw: &Gateway,
    token: &str,
    version: &str,
    sid: &str,
    body: &Value,
) -> reqwest::Response {
    gw.http
        .post(gw.url())
        .bearer_auth(token)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", version)
        .header("mcp-session-id", sid)
        .body(body.to_string())
        .send()
        .await
        .expect("send")
}

async fn legacy_session(gw: &Gateway) -> String {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}});
    let (status, r, sid) = legacy_post(gw, None, init).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["result"]["protocolVersion"], "2025-11-25");
    assert_eq!(r["result"]["capabilities"]["tools"]["listChanged"], true);
    sid.expect("a session id")
}

/// A legacy session begun with `token`: its id.
async fn legacy_session_as(gw: &Gateway, token: &str) -> String {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}});
    let resp = gw
        .http
        .post(gw.url())
        .bearer_auth(token)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .body(init.to_string())
        .send()
        .await
        .expect("initialize");
    assert_eq!(resp.status(), 200);
    resp.headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(String::from)
        .expect("a session id")
}

/// DELETE of a legacy session as `token`: the status.
async fn delete_session(gw: &Gateway, token: &str, sid: &str) -> u16 {
    gw.http
        .delete(gw.url())
        .bearer_auth(token)
        .header("mcp-session-id", sid)
        .send()
        .await
        .expect("delete")
        .status()
        .as_u16()
}

// A shortened tool name this gateway process has not listed yet (another replica
// served it, or it restarted) has its Mcp-Param headers checked all the same: a header
// that contradicts the body is refused, not let through to a call that succeeds.
#[tokio::test]
async fn param_headers_of_a_shortened_name_not_listed_here_yet_are_checked() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let long = "a".repeat(60);
    let text = std::fs::read_to_string(&setup.config).expect("config");
    let text = text.replacen("id = \"alpha\"", &format!("id = \"{long}\""), 1);
    std::fs::write(&setup.config, text).expect("config");
    let first = setup.start().await;
    let (_, listed) = first.modern("tok-a", "tools/list", json!({})).await;
    // Both servers have it, so it is served qualified: too long, so shortened.
    let served = listed["result"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .find(|t| {
            t["name"]
                .as_str()
                .is_some_and(|n| n.starts_with(&long[..20]))
                && t["description"]
                    .as_str()
                    .is_some_and(|d| d.contains("Mcp-Param-Region"))
        })
        .and_then(|t| t["name"].as_str())
        .expect("the long server's region_echo served")
        .to_string();
    assert_eq!(served.len(), 64, "{served}");
    assert!(!served.contains("region_echo"), "{served}");
    assert!(first.stop().await.success());
    // Another process, which has listed nothing yet.
    let gw = setup.start().await;
    let params = json!({"name": served, "arguments": {"region": "eu"}});
    let (status, body, _) = gw
        .post(
            Some("tok-a"),
            &request("tools/call", params.clone()),
            &[("mcp-param-region", "us")],
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], -32020, "{body}");
    let (status, body, _) = gw
        .post(
            Some("tok-a"),
            &request("tools/call", params),
            &[("mcp-param-region", "eu")],
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(body["result"].is_object(), "{body}");
    assert!(gw.stop().await.success());
}

// A name shortened for its characters, not its length (`get issue` has a space), is
// shorter than 64: a gateway process that has not served it (another replica did, or
// a reload forgot it) learns it back as it does a long one. Before, it was routed as
// written, to no tool or to one a server named so.
#[tokio::test]
async fn a_short_shortened_name_is_learned_back_by_a_process_that_never_served_it() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let text = std::fs::read_to_string(&setup.config).expect("config");
    let text = text.replacen(
        &format!("\"alpha{}\"]", setup.tag),
        &format!("\"alpha{}\", \"--tool-alias\", \"get issue\"]", setup.tag),
        1,
    );
    std::fs::write(&setup.config, text).expect("config");
    let first = setup.start().await;
    let (_, listed) = first.modern("tok-a", "tools/list", json!({})).await;
    let served = names(&listed)
        .into_iter()
        .find(|n| n.starts_with("alpha__get_issue_"))
        .expect("served shortened");
    assert!(served.len() < 64, "{served}");
    assert!(first.stop().await.success());
    let gw = setup.start().await;
    let (status, r) = gw
        .modern(
            "tok-a",
            "tools/call",
            json!({"name": served, "arguments": {}}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert!(r["result"].is_object(), "{r}");
    assert!(gw.stop().await.success());
}

// A notification or an answer that names a session that is gone (or another
// principal's) gets 404, as a request does, so that the client starts a new one;
// before, it was taken (202) and dropped.
#[tokio::test]
async fn notifications_and_answers_on_an_unknown_session_get_404() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let sid = legacy_session(&gw).await;
    let cancelled = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 5}});
    let answer = json!({"jsonrpc": "2.0", "id": "gw-1", "result": {"action": "decline"}});
    for body in [&cancelled, &answer] {
        let (status, _, _) = legacy_post(&gw, Some(&sid), body.clone()).await;
        assert_eq!(status, 202, "{body}");
        let (status, _, _) = legacy_post(&gw, Some("no-such-session"), body.clone()).await;
        assert_eq!(status, 404, "{body}");
    }
    // tok-a's session is not tok-b's.
    let others = legacy_post_as(&gw, "tok-b", "2025-11-25", &sid, &cancelled).await;
    assert_eq!(others.status().as_u16(), 404);
    // A 2026-07-28 client has no session: a stray session header of its is ignored.
    let modern = gw
        .http
        .post(gw.url())
        .bearer_auth("tok-a")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", MODERN)
        .header("mcp-method", "notifications/cancelled")
        .header("mcp-session-id", "no-such-session")
        .body(cancelled.to_string())
        .send()
        .await
        .expect("send");
    assert_eq!(modern.status().as_u16(), 202);
    assert!(gw.stop().await.success());
}

// A legacy client's `notifications/cancelled` on its session cancels the request it
// names upstream, and that request is not answered (its stream ends empty), as both
// eras' cancellation pages ask.
#[tokio::test]
async fn a_legacy_sessions_cancelled_request_is_cancelled_upstream_and_not_answered() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let sid = legacy_session(&gw).await;
    let slow = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "alpha__slow", "arguments": {"ms": 60_000, "text": "z"}}});
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 7}});
    let started = std::time::Instant::now();
    let call = legacy_post_as(&gw, "tok-a", "2025-11-25", &sid, &slow);
    let cancelling = async {
        // Kept if it comes before the request: either order cancels it.
        tokio::time::sleep(Duration::from_millis(300)).await;
        legacy_post(&gw, Some(&sid), cancel.clone()).await.0
    };
    let (resp, cancel_status) = tokio::join!(call, cancelling);
    assert_eq!(cancel_status, 202);
    assert_eq!(resp.status().as_u16(), 200);
    let body = resp.text().await.expect("body");
    assert!(
        !body.contains("\"id\":7") && !body.contains("\"id\": 7"),
        "a cancelled request is not answered: {body}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "it did not wait for the tool"
    );
    // A request the session's end cancels is answered: its client asked nothing.
    let mut slow = slow.clone();
    slow["id"] = json!(8);
    let call = legacy_post_as(&gw, "tok-a", "2025-11-25", &sid, &slow);
    let ending = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        delete_session(&gw, "tok-a", &sid).await
    };
    let (resp, deleted) = tokio::join!(call, ending);
    assert_eq!(deleted, 200);
    let body = resp.text().await.expect("body");
    let answered: Value = serde_json::from_str(&body).expect("a JSON answer");
    assert_eq!(answered["id"], 8, "{body}");
    assert!(answered["error"].is_object(), "{body}");
    gw.stop().await;
    let text = std::fs::read_to_string(&setup.audit).unwrap_or_default();
    assert!(
        text.lines()
            .any(|l| l.contains("\"finished\"") && l.contains("cancelled")),
        "the call is cancelled upstream: {text}"
    );
}

#[tokio::test]
async fn legacy_sessions_end_on_delete_and_after_their_idle_time() {
    let setup = Setup::new("session_idle = \"400ms\"", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}});
    let sid = legacy_session(&gw).await;
    let (status, r, _) = legacy_post(&gw, Some(&sid), list.clone()).await;
    assert_eq!(status, 200);
    assert!(
        r["result"]["tools"]
            .as_array()
            .is_some_and(|t| !t.is_empty()),
        "{r}"
    );
    assert!(
        r["result"].get("resultType").is_none(),
        "legacy results carry no resultType"
    );
    // A version header other than the session's, or one not spoken, is refused (400).
    for version in ["2025-06-18", "1999-01-01"] {
        let refused = legacy_post_as(&gw, "tok-a", version, &sid, &list).await;
        assert_eq!(refused.status().as_u16(), 400, "{version}");
    }
    assert_eq!(delete_session(&gw, "tok-a", &sid).await, 200);
    assert_eq!(legacy_post(&gw, Some(&sid), list.clone()).await.0, 404);
    // Another principal cannot use or end a session it does not own.
    let other = legacy_session(&gw).await;
    assert_eq!(delete_session(&gw, "tok-b", &other).await, 404);
    // Idle past session_idle: forgotten (time is what is tested here).
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(legacy_post(&gw, Some(&other), list).await.0, 404);
    gw.stop().await;
}

#[tokio::test]
async fn list_hints_are_the_least_upstream_freshness_and_public_only_for_one_agent_unfiltered() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    // One modern server whose lists are public for two minutes, and one agent.
    let text = std::fs::read_to_string(&setup.config).expect("config");
    let beta = text.find("[[servers]]\nid = \"beta\"").expect("beta");
    let perms = text.find("[permissions.a]").expect("permissions");
    let text = format!("{}{}", &text[..beta], &text[perms..]).replace(
        &format!("\"alpha{}\"]", setup.tag),
        &format!(
            "\"alpha{}\", \"--cache-scope\", \"public\", \"--ttl-ms\", \"120000\"]",
            setup.tag
        ),
    );
    let one_agent = text
        .lines()
        .filter(|l| !l.contains("agent = \"b\"") && !l.contains("auth_context = \"other\""))
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&setup.config, &one_agent).expect("config");
    let gw = setup.start().await;
    let (_, list) = gw.modern("tok-a", "tools/list", json!({})).await;
    let ttl = list["result"]["ttlMs"].as_u64().expect("ttlMs");
    assert!(
        ttl > 60_000 && ttl <= 120_000,
        "the upstream's freshness: {ttl}"
    );
    assert_eq!(list["result"]["cacheScope"], "public", "{}", list["result"]);
    gw.stop().await;

    // The same server, an agent that may see part of it: private.
    let filtered = one_agent.replace(
        "[permissions.a]\n\"*\" = [\"*\"]",
        "[permissions.a]\nalpha = [\"echo\"]",
    );
    std::fs::write(&setup.config, filtered).expect("config");
    let gw = setup.start().await;
    let (_, list) = gw.modern("tok-a", "tools/list", json!({})).await;
    assert_eq!(names(&list), ["alpha__echo"]);
    assert_eq!(list["result"]["cacheScope"], "private");
    gw.stop().await;
}

/// An ES256 key made here: (PKCS#8 for signing, its JWK).
fn es256_key(kid: &str) -> (Vec<u8>, Value) {
    use base64::Engine;
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
    let rng = ring::rand::SystemRandom::new();
    let doc = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("key");
    let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, doc.as_ref(), &rng)
        .expect("pair");
    let point = pair.public_key().as_ref(); // 0x04 ‖ x ‖ y
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let jwk = json!({"kty": "EC", "crv": "P-256", "kid": kid, "alg": "ES256", "use": "sig",
        "x": b64(&point[1..33]), "y": b64(&point[33..65])});
    (doc.as_ref().to_vec(), jwk)
}

/// The issuer and audience of the JWTs the tests' gateways accept.
const JWT_ISS: &str = "https://idp.test";
const JWT_AUD: &str = "https://gw.test/mcp";

/// A gateway setup that accepts JWTs of [`JWT_ISS`] for [`JWT_AUD`] (`jwt_extra` added
/// to its `jwt` table), agent c granted alpha's echo: the setup, the issuer's signing
/// key (PKCS#8, kid `k1`) and its JWKS file.
fn jwt_issuer(jwt_extra: &str) -> (Setup, Vec<u8>, std::path::PathBuf) {
    let (signing, jwk) = es256_key("k1");
    let jwks = temp_file("jwks");
    // Beside it, a key of an algorithm the gateway does not read: left out, not taken
    // for a broken set.
    let unread = json!({"kty": "EC", "crv": "P-521", "alg": "ES512", "kid": "k521",
        "use": "sig", "x": "AA", "y": "AA"});
    std::fs::write(&jwks, json!({"keys": [unread, jwk]}).to_string()).expect("jwks");
    let setup = Setup::new(
        &format!(
            "jwt = {{ issuer = \"{JWT_ISS}\", audience = \"{JWT_AUD}\", jwks_file = \"{}\"{jwt_extra} }}\n\n[permissions.c]\nalpha = [\"echo\"]",
            jwks.display()
        ),
        &[("k1", &key("k1"))],
    );
    (setup, signing, jwks)
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

fn jwt(pkcs8: &[u8], kid: &str, claims: Value) -> String {
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    header.kid = Some(kid.into());
    jsonwebtoken::encode(
        &header,
        &claims,
        &jsonwebtoken::EncodingKey::from_ec_der(pkcs8),
    )
    .expect("sign")
}

// A kid an issuer gives to both its signing key and an encryption key names the key of
// the token's algorithm, and a token without a kid takes the one key of its algorithm:
// before, the first key of the kid was taken (the encryption key: every token refused),
// and a kid-less token was taken only when the set held one key of any kind.
#[tokio::test]
async fn a_jwt_names_the_key_of_its_algorithm_beside_an_encryption_key() {
    let (signing, jwk) = es256_key("k1");
    let jwks = temp_file("jwks-enc");
    let enc = json!({"kty": "RSA", "kid": "k1", "use": "enc", "alg": "RSA-OAEP",
        "n": "sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw",
        "e": "AQAB"});
    // The encryption key first: taken by its kid alone, it refused every token.
    std::fs::write(&jwks, json!({"keys": [enc, jwk]}).to_string()).expect("jwks");
    let setup = Setup::new(
        &format!(
            "jwt = {{ issuer = \"{JWT_ISS}\", audience = \"{JWT_AUD}\", jwks_file = \"{}\" }}\n\n[permissions.c]\nalpha = [\"echo\"]",
            jwks.display()
        ),
        &[("k1", &key("k1"))],
    );
    let gw = setup.start().await;
    let claims = json!({"iss": JWT_ISS, "aud": JWT_AUD, "sub": "c", "exp": unix_now() + 300});
    let (status, r) = gw
        .modern(
            &jwt(&signing, "k1", claims.clone()),
            "tools/list",
            json!({}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    let kidless = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256),
        &claims,
        &jsonwebtoken::EncodingKey::from_ec_der(&signing),
    )
    .expect("sign");
    let (status, r) = gw.modern(&kidless, "tools/list", json!({})).await;
    assert_eq!(status, 200, "{r}");
    gw.stop().await;
    let _ = std::fs::remove_file(jwks);
}

#[tokio::test]
async fn jwts_of_the_configured_issuer_name_the_agent_and_every_other_token_is_refused() {
    const ISS: &str = JWT_ISS;
    const AUD: &str = JWT_AUD;
    let (other_key, _) = es256_key("k1");
    let (setup, signing, jwks) = jwt_issuer(", scopes = [\"mcp\"], context_claim = \"email\"");
    let gw = setup.start().await;
    let now = unix_now();
    let claims = |iss: &str, aud: &str, sub: &str, exp: u64| json!({"iss": iss, "aud": aud, "sub": sub, "exp": exp, "email": format!("{sub}@idp.test"), "scope": "openid mcp"});
    let good = jwt(&signing, "k1", claims(ISS, AUD, "c", now + 300));
    let (status, list) = gw.modern(&good, "tools/list", json!({})).await;
    assert_eq!(status, 200, "{list}");
    // The scope asked for, as `scp` too; a token without it is forbidden (403, the
    // challenge naming the scope to ask for), however valid otherwise.
    let mut scp = claims(ISS, AUD, "c", now + 300);
    scp.as_object_mut().map(|c| c.remove("scope"));
    scp["scp"] = json!(["mcp"]);
    let (status, _) = gw
        .modern(&jwt(&signing, "k1", scp.clone()), "tools/list", json!({}))
        .await;
    assert_eq!(status, 200, "scp");
    scp["scp"] = json!(["openid"]);
    let narrow = jwt(&signing, "k1", scp);
    let (status, _, headers) = gw
        .post(Some(&narrow), &request("tools/list", json!({})), &[])
        .await;
    assert_eq!(status, 403);
    let challenge = headers
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert!(
        challenge.contains("error=\"insufficient_scope\"") && challenge.contains("scope=\"mcp\""),
        "{challenge}"
    );
    assert_eq!(
        names(&list),
        ["alpha__echo"],
        "the JWT's sub is agent c, with c's grants"
    );
    assert_eq!(
        list["result"]["cacheScope"], "private",
        "an issuer vouches for many agents"
    );
    // A not-before already past (or within the leeway) lets it in.
    for nbf in [
        json!(now - 60),
        json!(now + 10),
        json!((now - 60) as f64 + 0.5),
    ] {
        let mut c = claims(ISS, AUD, "c", now + 300);
        c["nbf"] = nbf.clone();
        let (status, _) = gw
            .modern(&jwt(&signing, "k1", c), "tools/list", json!({}))
            .await;
        assert_eq!(status, 200, "nbf {nbf}");
    }

    let tampered = {
        let mut t = good.clone().into_bytes();
        let i = t.len() - 3;
        t[i] = if t[i] == b'A' { b'B' } else { b'A' };
        String::from_utf8(t).expect("ascii")
    };
    let hs256 = {
        // Algorithm confusion: HMAC with the public key as the secret. Every token
        // refused here names agent c, whom a good token would be let in as.
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        header.kid = Some("k1".into());
        let secret = std::fs::read(&jwks).expect("jwks");
        jsonwebtoken::encode(
            &header,
            &claims(ISS, AUD, "c", now + 300),
            &jsonwebtoken::EncodingKey::from_secret(&secret),
        )
        .expect("sign")
    };
    let unsigned = |header: Value, claims: Value| {
        use base64::Engine;
        let b64 =
            |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        format!("{}.{}.", b64(&header), b64(&claims))
    };
    let rs256_header = {
        use base64::Engine;
        let h = json!({"alg": "RS256", "kid": "k1", "typ": "JWT"});
        let parts: Vec<&str> = good.split('.').collect();
        format!(
            "{}.{}.{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(h.to_string()),
            parts[1],
            parts[2]
        )
    };
    for (what, token) in [
        (
            "alg none",
            unsigned(
                json!({"alg": "none", "kid": "k1"}),
                claims(ISS, AUD, "c", now + 300),
            ),
        ),
        ("RS256 claimed for an EC key", rs256_header),
        (
            "no exp",
            jwt(
                &signing,
                "k1",
                json!({"iss": ISS, "aud": AUD, "sub": "c", "email": "c@idp.test"}),
            ),
        ),
        (
            // It would be served with the gateway's own upstream sign-in.
            "no context claim",
            jwt(
                &signing,
                "k1",
                json!({"iss": ISS, "aud": AUD, "sub": "c", "exp": now + 300}),
            ),
        ),
        (
            "not yet valid",
            jwt(
                &signing,
                "k1",
                json!({"iss": ISS, "aud": AUD, "sub": "c", "email": "c@idp.test", "exp": now + 600, "nbf": now + 300}),
            ),
        ),
        (
            // The JWT library checks an `nbf` only when it reads as a u64.
            "nbf not a number",
            jwt(
                &signing,
                "k1",
                json!({"iss": ISS, "aud": AUD, "sub": "c", "email": "c@idp.test", "exp": now + 600, "nbf": (now + 300).to_string()}),
            ),
        ),
        (
            "nbf past 2^64",
            jwt(
                &signing,
                "k1",
                json!({"iss": ISS, "aud": AUD, "sub": "c", "email": "c@idp.test", "exp": now + 600, "nbf": 1e20}),
            ),
        ),
        (
            "nbf negative",
            jwt(
                &signing,
                "k1",
                json!({"iss": ISS, "aud": AUD, "sub": "c", "email": "c@idp.test", "exp": now + 600, "nbf": -1}),
            ),
        ),
        (
            "wrong audience",
            jwt(
                &signing,
                "k1",
                claims(ISS, "https://other.test/mcp", "c", now + 300),
            ),
        ),
        (
            "wrong issuer",
            jwt(
                &signing,
                "k1",
                claims("https://evil.test", AUD, "c", now + 300),
            ),
        ),
        (
            "expired",
            jwt(&signing, "k1", claims(ISS, AUD, "c", now - 120)),
        ),
        (
            "unknown kid",
            jwt(&signing, "k9", claims(ISS, AUD, "c", now + 300)),
        ),
        (
            "another key under the same kid",
            jwt(&other_key, "k1", claims(ISS, AUD, "c", now + 300)),
        ),
        ("tampered", tampered),
        ("HS256 with the public key", hs256),
        (
            // Agent a's grants, settings and approvals are a static token's.
            "the agent of a static token",
            jwt(&signing, "k1", claims(ISS, AUD, "a", now + 300)),
        ),
        (
            // It would write a line of its own into the gateway's log.
            "an agent on two lines",
            jwt(
                &signing,
                "k1",
                claims(ISS, AUD, "c\nINFO agent a approved", now + 300),
            ),
        ),
        (
            "an agent of 300 bytes",
            jwt(
                &signing,
                "k1",
                claims(ISS, AUD, &"c".repeat(300), now + 300),
            ),
        ),
        (
            "an agent that reads as another",
            jwt(&signing, "k1", claims(ISS, AUD, "c\u{200b}", now + 300)),
        ),
    ] {
        let (status, body, headers) = gw
            .post(Some(&token), &request("tools/list", json!({})), &[])
            .await;
        assert_eq!(status, 401, "{what}: {body}");
        let challenge = headers
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        assert_eq!(
            challenge,
            "Bearer resource_metadata=\"https://gw.test/.well-known/oauth-protected-resource/mcp\", scope=\"mcp\", error=\"invalid_token\"",
            "{what}"
        );
    }
    // Without a token, where to get one, and no error (RFC 6750 §3.1).
    let (status, _, headers) = gw.post(None, &request("tools/list", json!({})), &[]).await;
    assert_eq!(status, 401);
    assert_eq!(
        headers
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok()),
        Some(
            "Bearer resource_metadata=\"https://gw.test/.well-known/oauth-protected-resource/mcp\", scope=\"mcp\""
        )
    );
    // A Bearer header without a token is a bad request; another scheme's credentials
    // are no bearer token at all.
    let challenge = "Bearer resource_metadata=\"https://gw.test/.well-known/oauth-protected-resource/mcp\", scope=\"mcp\"";
    for (sent, error) in [
        ("Bearer ", ", error=\"invalid_request\""),
        ("Basic dG9rLWE=", ""),
    ] {
        let (status, _, headers) = gw
            .post(
                None,
                &request("tools/list", json!({})),
                &[("authorization", sent)],
            )
            .await;
        assert_eq!(status, 401, "{sent}");
        assert_eq!(
            headers
                .get("www-authenticate")
                .and_then(|v| v.to_str().ok()),
            Some(format!("{challenge}{error}").as_str()),
            "{sent}"
        );
    }
    let prm: Value = gw
        .http
        .get(
            gw.url()
                .replace("/mcp", "/.well-known/oauth-protected-resource/mcp"),
        )
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(prm["resource"], AUD);
    assert_eq!(prm["authorization_servers"], json!([ISS]));
    assert_eq!(prm["scopes_supported"], json!(["mcp"]));
    // Public: the connection that asked is closed after it, as a refused one is.
    let asked = "GET /.well-known/oauth-protected-resource/mcp HTTP/1.1\r\nHost: HOST\r\n\r\n";
    let got = until_closed(gw.url(), asked, Duration::from_secs(5))
        .await
        .expect("closed after the metadata");
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    gw.stop().await;
    let _ = std::fs::remove_file(jwks);
}

/// Serves `body` as JSON to every GET on a loopback port until the task is aborted;
/// the port, and how many requests it answered.
async fn json_served(
    body: String,
) -> (
    u16,
    Arc<std::sync::atomic::AtomicUsize>,
    tokio::task::JoinHandle<()>,
) {
    json_served_from(Arc::new(std::sync::Mutex::new(body))).await
}

/// [`json_served`], the body what `body` holds at each request.
/// A gateway setup that takes JWTs of [`JWT_ISS`] for [`JWT_AUD`] with the keys of the
/// JWKS served on `port` (agent c granted alpha's echo).
fn jwks_url_setup(port: u16) -> Setup {
    Setup::new(
        &format!(
            "jwt = {{ issuer = \"{JWT_ISS}\", audience = \"{JWT_AUD}\", jwks_url = \"http://127.0.0.1:{port}/jwks\" }}\n\n[permissions.c]\nalpha = [\"echo\"]"
        ),
        &[("k1", &key("k1"))],
    )
}

/// Sends `token` (of a key the gateway does not hold) and waits until the JWKS has
/// been read again because of it.
async fn jwks_read_again(gw: &Gateway, hits: &std::sync::atomic::AtomicUsize, token: &str) {
    let before = hits.load(std::sync::atomic::Ordering::SeqCst);
    let _ = gw.modern(token, "tools/list", json!({})).await;
    assert!(
        eventually(Duration::from_secs(10), || {
            hits.load(std::sync::atomic::Ordering::SeqCst) > before
        })
        .await,
        "the JWKS was read again"
    );
}

async fn json_served_from(
    body: Arc<std::sync::Mutex<String>>,
) -> (
    u16,
    Arc<std::sync::atomic::AtomicUsize>,
    tokio::task::JoinHandle<()>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = hits.clone();
    let task = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match socket.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let body = body.lock().map(|b| b.clone()).unwrap_or_default();
            let reply = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(reply.as_bytes()).await;
        }
    });
    (port, hits, task)
}

// A JWKS read from a URL: JWTs it signs are taken; a reload that leaves the `jwt`
// settings as they were keeps its keys, and so succeeds while the issuer is down.
#[tokio::test]
async fn a_jwks_url_is_read_and_a_reload_does_not_need_it_again() {
    let (signing, jwk) = es256_key("k1");
    let (port, hits, jwks_server) = json_served(json!({"keys": [jwk]}).to_string()).await;
    let setup = jwks_url_setup(port);
    let gw = setup.start().await;
    assert_eq!(
        hits.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "read at start"
    );
    let token = jwt(
        &signing,
        "k1",
        json!({"iss": JWT_ISS, "aud": JWT_AUD, "sub": "c", "exp": unix_now() + 300}),
    );
    let (status, list) = gw.modern(&token, "tools/list", json!({})).await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(names(&list), ["alpha__echo"]);
    // The issuer goes down; a reload that grants c more still applies.
    jwks_server.abort();
    let _ = jwks_server.await;
    let text = std::fs::read_to_string(&setup.config)
        .expect("config")
        .replace(
            "[permissions.c]\nalpha = [\"echo\"]",
            "[permissions.c]\nalpha = [\"echo\"]\nbeta = [\"echo\"]",
        );
    gw.reload_with(&setup, &text);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (status, list) = gw.modern(&token, "tools/list", json!({})).await;
        assert_eq!(status, 200, "{list}");
        if names(&list).len() == 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the reload was not applied: {list}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gw.stop().await;
}

// The issuer takes a (leaked) key out of its JWKS: once the gateway reads the URL again
// (here for a token of a key it does not know), a subscription opened with a JWT that
// key signed ends at its next keep-alive, without waiting for a reload. Before, it ran
// on to the token's expiry.
#[tokio::test]
async fn a_subscription_ends_when_the_issuer_takes_its_key_out_of_the_jwks() {
    let (old, old_jwk) = es256_key("k1");
    let (new, new_jwk) = es256_key("k2");
    let body = Arc::new(std::sync::Mutex::new(
        json!({"keys": [old_jwk]}).to_string(),
    ));
    let (port, hits, _jwks_server) = json_served_from(body.clone()).await;
    let setup = jwks_url_setup(port);
    let gw = setup.start().await;
    let claims = json!({"iss": JWT_ISS, "aud": JWT_AUD, "sub": "c", "exp": unix_now() + 3600});
    let (mut sub, mut heard) = subscribed(&gw, &jwt(&old, "k1", claims.clone()), "leaked").await;
    *body.lock().expect("body") = json!({"keys": [new_jwk]}).to_string();
    // A token of the new key: unknown, so the JWKS is read again.
    jwks_read_again(&gw, &hits, &jwt(&new, "k2", claims)).await;
    assert!(
        read_until(&mut sub, &mut heard, "\"resultType\":\"complete\"").await,
        "the subscription of the key taken out ended: {heard}"
    );
    gw.stop().await;
}

// A JWKS read again that holds no keys (an issuer's error served as `{"keys":[]}`) is
// kept as a failed read is: before, it refused every token and ended every stream
// opened with one.
#[tokio::test]
async fn an_empty_jwks_read_again_keeps_the_keys_held() {
    let (signing, jwk) = es256_key("k1");
    let body = Arc::new(std::sync::Mutex::new(json!({"keys": [jwk]}).to_string()));
    let (port, hits, _jwks_server) = json_served_from(body.clone()).await;
    let setup = jwks_url_setup(port);
    let gw = setup.start().await;
    let claims = json!({"iss": JWT_ISS, "aud": JWT_AUD, "sub": "c", "exp": unix_now() + 3600});
    let token = jwt(&signing, "k1", claims.clone());
    let (mut sub, mut heard) = subscribed(&gw, &token, "kept").await;
    *body.lock().expect("body") = json!({"keys": []}).to_string();
    // A token of an unknown key has the JWKS read again.
    let (other, _) = es256_key("k9");
    jwks_read_again(&gw, &hits, &jwt(&other, "k9", claims)).await;
    tokio::time::sleep(Duration::from_millis(200)).await; // its keys put in place, if at all
    let (status, _) = gw.modern(&token, "tools/list", json!({})).await;
    assert_eq!(status, 200, "the key held is kept");
    assert!(
        !read_until(&mut sub, &mut heard, "\"resultType\":\"complete\"").await,
        "the subscription goes on: {heard}"
    );
    // Open still: an ended stream gives its end at once.
    assert!(
        tokio::time::timeout(Duration::from_millis(200), sub.chunk())
            .await
            .is_err(),
        "the subscription goes on: {heard}"
    );
    gw.stop().await;
}

#[tokio::test]
async fn streams_opened_with_a_jwt_end_when_it_expires() {
    const ISS: &str = JWT_ISS;
    const AUD: &str = JWT_AUD;
    let (setup, signing, jwks) = jwt_issuer("");
    let gw = setup.start().await;
    let now = unix_now();
    let token = |exp: u64| {
        jwt(
            &signing,
            "k1",
            json!({"iss": ISS, "aud": AUD, "sub": "c", "exp": exp}),
        )
    };
    // Still accepted: within the 30 s of clock skew allowed past `exp`, about 10 s left.
    let expiring = token(now - 20);
    let lasting = token(now + 600);

    let (mut short, mut heard) = subscribed(&gw, &expiring, "short").await;
    let (mut long, mut long_heard) = subscribed(&gw, &lasting, "long").await;
    // A legacy session's GET stream, opened with the expiring token.
    let sid = legacy_session_as(&gw, &expiring).await;
    let mut get = gw.get_stream(&expiring, &sid).await;
    assert_eq!(get.status(), 200);

    assert!(
        read_until(&mut short, &mut heard, "\"resultType\":\"complete\"").await,
        "the subscription ends with its token: {heard}"
    );
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(_)) = get.chunk().await {}
    })
    .await;
    assert!(ended.is_ok(), "the GET stream ends with its token");
    // The subscription of a token still in force goes on.
    assert!(
        !tokio::time::timeout(
            Duration::from_secs(1),
            read_until(&mut long, &mut long_heard, "\"resultType\":\"complete\"")
        )
        .await
        .unwrap_or(false),
        "{long_heard}"
    );
    // And the expired token is refused from now on.
    let (status, _, _) = gw
        .post(Some(&expiring), &request("tools/list", json!({})), &[])
        .await;
    assert_eq!(status, 401);
    drop(long);
    gw.stop().await;
    let _ = std::fs::remove_file(jwks);
}

/// Opens a `subscriptions/listen` as `token` with id `id`: the streaming response.
async fn open_listen(
    gw: &Gateway,
    token: &str,
    id: Value,
    notifications: Value,
) -> reqwest::Response {
    let mut listen = request(
        "subscriptions/listen",
        json!({"notifications": notifications}),
    );
    listen["id"] = id;
    gw.http
        .post(gw.url())
        .bearer_auth(token)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", MODERN)
        .header("mcp-method", "subscriptions/listen")
        .body(listen.to_string())
        .send()
        .await
        .expect("listen")
}

/// `token`'s subscription to tool list changes as `id`, read up to its acknowledgement;
/// the stream and what was read of it.
async fn subscribed(gw: &Gateway, token: &str, id: &str) -> (reqwest::Response, String) {
    let mut sub = open_listen(gw, token, json!(id), json!({"toolsListChanged": true})).await;
    let mut heard = String::new();
    assert!(
        read_until(&mut sub, &mut heard, "acknowledged").await,
        "{heard}"
    );
    (sub, heard)
}

/// Reads an event stream until `want` appears in it (or 20 s pass); what it read.
async fn read_until(resp: &mut reqwest::Response, seen: &mut String, want: &str) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !seen.contains(want) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match tokio::time::timeout(left, resp.chunk()).await {
            Ok(Ok(Some(chunk))) => seen.push_str(&String::from_utf8_lossy(&chunk)),
            _ => return false,
        }
    }
    true
}

// A subscription's id is kept and written on every frame for as long as its stream is
// open, past the request's body budget: one longer than 256 bytes is refused at once,
// one of 256 is taken.
#[tokio::test]
async fn a_subscription_with_a_huge_id_is_refused() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let huge = "i".repeat(1 << 20);
    let refused = open_listen(&gw, "tok-a", json!(huge), json!({"toolsListChanged": true})).await;
    assert_eq!(refused.status(), 400);
    let body: Value = refused.json().await.expect("a JSON-RPC error");
    assert_eq!(body["error"]["code"], -32600, "{}", body["error"]);
    let longest = "i".repeat(256);
    let (sub, heard) = subscribed(&gw, "tok-a", &longest).await;
    assert!(heard.contains(&longest));
    drop(sub);
    gw.stop().await;
}

// Prompt and resource list changes reach the subscriptions that asked for them, each
// under its own method; one that asked for tool changes alone hears neither. Before,
// only tool changes were honoured.
#[tokio::test]
async fn prompt_and_resource_list_changes_reach_the_subscriptions_that_asked() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let asked = json!({"toolsListChanged": true, "promptsListChanged": true,
        "resourcesListChanged": true, "elsewhere": true});
    let mut all = open_listen(&gw, "tok-a", json!("all"), asked).await;
    let mut heard = String::new();
    assert!(
        read_until(&mut all, &mut heard, "acknowledged").await,
        "{heard}"
    );
    assert!(
        heard.contains(r#""notifications":{"promptsListChanged":true,"resourcesListChanged":true,"toolsListChanged":true}"#),
        "every list honoured, nothing else: {heard}"
    );
    let (mut tools, mut tools_heard) = subscribed(&gw, "tok-a", "tools").await;
    let notify = |list: &str| json!({"name": "beta__notify_changed", "arguments": {"list": list}});
    for list in ["prompts", "resources"] {
        let (status, r) = gw.modern("tok-a", "tools/call", notify(list)).await;
        assert_eq!(status, 200, "{r}");
        let method = format!("notifications/{list}/list_changed");
        assert!(
            read_until(&mut all, &mut heard, &method).await,
            "{list}: {heard}"
        );
    }
    // The tools-only subscription hears the next tool change, and nothing before it.
    gw.modern("tok-a", "tools/call", notify("tools")).await;
    assert!(
        read_until(
            &mut tools,
            &mut tools_heard,
            "notifications/tools/list_changed"
        )
        .await,
        "{tools_heard}"
    );
    assert!(
        !tools_heard.contains("prompts/list_changed")
            && !tools_heard.contains("resources/list_changed"),
        "{tools_heard}"
    );
    // Declared so, to both eras.
    let (_, discover) = gw.modern("tok-a", "server/discover", json!({})).await;
    let caps = &discover["result"]["capabilities"];
    assert_eq!(caps["prompts"]["listChanged"], true, "{discover}");
    assert_eq!(caps["resources"]["listChanged"], true, "{discover}");
    gw.stop().await;
}

#[tokio::test]
async fn a_subscription_is_acknowledged_tagged_told_of_tool_changes_and_ended_at_shutdown() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    // alpha's tool list changes on every fetch, and is never cached.
    let text = std::fs::read_to_string(&setup.config)
        .expect("config")
        .replace(
            &format!("\"alpha{}\"]", setup.tag),
            &format!(
                "\"alpha{}\", \"--alternate-tools\", \"--ttl-ms\", \"0\"]",
                setup.tag
            ),
        );
    std::fs::write(&setup.config, text).expect("config");
    let gw = setup.start().await;
    let mut resp = open_listen(
        &gw,
        "tok-a",
        json!("sub-1"),
        json!({"toolsListChanged": true, "promptsListChanged": true}),
    )
    .await;
    assert_eq!(resp.status().as_u16(), 200);
    let mut seen = String::new();
    assert!(
        read_until(&mut resp, &mut seen, "acknowledged").await,
        "{seen}"
    );
    let ack: Value = serde_json::from_str(
        seen.lines()
            .find_map(|l| l.strip_prefix("data: "))
            .expect("a data line"),
    )
    .expect("json");
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    assert_eq!(
        ack["params"]["notifications"],
        json!({"toolsListChanged": true, "promptsListChanged": true}),
        "what is honoured"
    );
    assert_eq!(
        ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        "sub-1"
    );
    // Two listings: the second finds other tools, which the subscription hears of.
    for _ in 0..3 {
        gw.modern("tok-a", "tools/list", json!({})).await;
    }
    assert!(
        read_until(&mut resp, &mut seen, "notifications/tools/list_changed").await,
        "{seen}"
    );
    let change: Value = serde_json::from_str(
        seen.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .find(|l| l.contains("list_changed"))
            .expect("a change"),
    )
    .expect("json");
    assert_eq!(
        change["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        "sub-1"
    );
    // An id that would ride on every frame for hours is refused.
    let long = open_listen(
        &gw,
        "tok-a",
        json!("x".repeat(257)),
        json!({"toolsListChanged": true}),
    )
    .await;
    assert_eq!(long.status().as_u16(), 400);
    let body: Value = long.json().await.expect("json");
    assert_eq!(body["error"]["code"], -32600, "{body}");
    let stopping = tokio::spawn(gw.stop());
    assert!(
        read_until(&mut resp, &mut seen, "\"resultType\":\"complete\"").await,
        "the final result: {seen}"
    );
    assert!(stopping.await.expect("stop").success());
}

#[tokio::test]
async fn an_argument_annotated_x_mcp_header_must_come_in_its_mcp_param_header() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let call = request(
        "tools/call",
        json!({"name": "alpha__region_echo", "arguments": {"region": "eu"}}),
    );
    let (status, r, _) = gw.post(Some("tok-a"), &call, &[]).await;
    assert_eq!(
        (status, r["error"]["code"].as_i64()),
        (400, Some(-32020)),
        "{r}"
    );
    let (status, r, _) = gw
        .post(Some("tok-a"), &call, &[("mcp-param-region", "us")])
        .await;
    assert_eq!(
        (status, r["error"]["code"].as_i64()),
        (400, Some(-32020)),
        "a different value: {r}"
    );
    let (status, r, _) = gw
        .post(Some("tok-a"), &call, &[("mcp-param-region", "eu")])
        .await;
    assert_eq!(status, 200, "{r}");
    assert!(r["result"].is_object(), "{r}");
    gw.stop().await;
}

#[tokio::test]
async fn mirror_headers_come_once_and_a_legacy_request_that_sends_them_is_held_to_them() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let echo = request(
        "tools/call",
        json!({"name": "alpha__echo", "arguments": {"text": "x"}}),
    );
    // Two Mcp-Name headers, the first the body's: refused (something in front may read
    // the other).
    let resp = gw
        .modern_post("tok-a", "tools/call", "alpha__echo")
        .header("mcp-name", "alpha__region_echo")
        .body(echo.to_string())
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status().as_u16(), 400);
    let r: Value = serde_json::from_str(&resp.text().await.expect("body")).expect("json");
    assert_eq!(r["error"]["code"], -32020, "{r}");
    // A legacy request: no mirror headers needed, but those it sends must be true.
    let sid = legacy_session(&gw).await;
    let region = |r: &str| {
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "alpha__region_echo", "arguments": {"region": r}}})
    };
    let cases: [(&[(&str, &str)], u16); 6] = [
        (&[], 200),
        (&[("mcp-name", "alpha__region_echo")], 200),
        (&[("mcp-name", "alpha__echo")], 400),
        (&[("mcp-method", "tools/list")], 400),
        (&[("mcp-param-region", "us")], 400),
        (&[("mcp-param-region", "eu")], 200),
    ];
    for (headers, want) in cases {
        let (status, r, _) = legacy_post_with(&gw, Some(&sid), region("eu"), headers).await;
        assert_eq!(status, want, "{headers:?}: {r}");
        if want == 400 {
            assert_eq!(r["error"]["code"], -32020, "{headers:?}: {r}");
        }
    }
    // A modern notification's too (and it has no arguments to mirror).
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 99}});
    for headers in [
        [("mcp-method", "tools/call")],
        [("mcp-name", "alpha__echo")],
        [("mcp-param-region", "eu")],
    ] {
        let (status, _, _) = gw.post(Some("tok-a"), &cancel, &headers).await;
        assert_eq!(status, 400, "{headers:?}");
    }
    let (status, _, _) = gw.post(Some("tok-a"), &cancel, &[]).await;
    assert_eq!(status, 202);
    gw.stop().await;
}

#[tokio::test]
async fn progress_reaches_the_client_under_its_own_token_before_the_result() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    for tool in ["alpha__progress", "beta__progress"] {
        let mut call = request(
            "tools/call",
            json!({"name": tool, "arguments": {"steps": 3}}),
        );
        call["params"]["_meta"]["progressToken"] = json!("mine-7");
        let resp = gw
            .modern_post("tok-a", "tools/call", tool)
            .body(call.to_string())
            .send()
            .await
            .expect("call");
        // An event stream a proxy must not buffer.
        assert_eq!(resp.headers()["x-accel-buffering"], "no");
        assert_eq!(resp.headers()["cache-control"], "no-cache");
        let body = resp.text().await.expect("body");
        let messages: Vec<Value> = body
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let progress: Vec<&Value> = messages
            .iter()
            .filter(|m| m["method"] == "notifications/progress")
            .collect();
        assert_eq!(progress.len(), 3, "{tool}: {body}");
        assert!(
            progress
                .iter()
                .all(|p| p["params"]["progressToken"] == "mine-7"),
            "{body}"
        );
        assert_eq!(
            progress
                .iter()
                .map(|p| p["params"]["progress"].as_u64())
                .collect::<Vec<_>>(),
            [Some(1), Some(2), Some(3)]
        );
        let last = messages.last().expect("a result");
        assert_eq!(
            text(&last["result"]),
            "3 steps done",
            "the result comes last: {body}"
        );
    }
    // Without a token, a plain JSON answer.
    let (status, r) = gw
        .modern(
            "tok-a",
            "tools/call",
            json!({"name": "alpha__progress", "arguments": {"steps": 2}}),
        )
        .await;
    assert_eq!((status, result_text(&r)), (200, "2 steps done"));
    gw.stop().await;
}

#[tokio::test]
async fn anonymous_callers_act_as_the_named_agent_but_a_bad_authorization_header_is_refused() {
    let setup = Setup::new("anonymous_agent = \"b\"", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let list = request("tools/list", json!({}));
    let (status, r, _) = gw.post(None, &list, &[]).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(names(&r), ["alpha__echo"], "anonymous is agent b");
    for bad in ["Basic dG9rLWE=", "Bearer", "tok-a"] {
        let (status, _, _) = gw.post(None, &list, &[("authorization", bad)]).await;
        assert_eq!(status, 401, "{bad:?} is refused, never anonymous");
    }
    // 2026-07-28 has no ping: an unknown method, 404.
    let (status, r) = gw.modern("tok-a", "ping", json!({})).await;
    assert_eq!((status, r["error"]["code"].as_i64()), (404, Some(-32601)));
    gw.stop().await;
}

// A list's cursor names the list it was cut from: once the list changes (a server
// joins), or on another method's list, it is refused and the client lists from the
// start, rather than be handed pages of two lists stitched (items skipped or repeated).
#[tokio::test]
async fn a_list_cursor_is_refused_once_the_list_changed_or_on_another_list() {
    let setup = Setup::new("page_size = 3", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let (_, first) = gw.modern("tok-a", "tools/list", json!({})).await;
    let cursor = first["result"]["nextCursor"]
        .as_str()
        .expect("more than a page")
        .to_string();
    let (_, next) = gw
        .modern("tok-a", "tools/list", json!({"cursor": cursor}))
        .await;
    assert!(next["result"]["tools"].is_array(), "{next}");
    let (_, other) = gw
        .modern("tok-a", "prompts/list", json!({"cursor": cursor}))
        .await;
    assert_eq!(other["error"]["code"], -32602, "{other}");
    let gamma = format!(
        "[[servers]]\nid = \"gamma\"\ntransport = {{ type = \"stdio\", command = \"{}\", args = [\"demo-server\", \"gamma{}\"] }}\n",
        harness_exe(),
        setup.tag
    );
    let original = std::fs::read_to_string(&setup.config).expect("config");
    gw.reload_with(&setup, &(original + &gamma));
    let mut joined = false;
    for _ in 0..200 {
        let mut all = Vec::new();
        let mut at: Option<String> = None;
        loop {
            let params = at.as_ref().map_or(json!({}), |c| json!({"cursor": c}));
            let (_, page) = gw.modern("tok-a", "tools/list", params).await;
            all.extend(names(&page));
            match page["result"]["nextCursor"].as_str() {
                Some(c) => at = Some(c.to_string()),
                None => break,
            }
        }
        if all.iter().any(|n| n.starts_with("gamma__")) {
            joined = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(joined, "gamma joined the list");
    let (_, stale) = gw
        .modern("tok-a", "tools/list", json!({"cursor": cursor}))
        .await;
    assert_eq!(stale["error"]["code"], -32602, "{stale}");
    gw.stop().await;
}

#[tokio::test]
async fn prompts_resources_and_paged_lists_are_served_with_the_callers_grants() {
    let setup = Setup::new("page_size = 3", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let params = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        let (_, list) = gw.modern("tok-a", "tools/list", params).await;
        let page = names(&list);
        assert!(page.len() <= 3, "{list}");
        all.extend(page);
        pages += 1;
        match list["result"]["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert!(pages > 2, "pages of 3: {pages}");
    let (_, whole) = gw.modern("tok-a", "tools/list", json!({})).await;
    let mut sorted = all.clone();
    sorted.dedup();
    assert_eq!(sorted.len(), all.len(), "no tool twice across pages");
    assert!(all.contains(&"alpha__echo".to_string()) && all.contains(&"beta__echo".to_string()));
    assert_eq!(whole["result"]["nextCursor"].as_str().map(|_| ()), Some(()));

    let (_, prompts) = gw.modern("tok-a", "prompts/list", json!({})).await;
    let prompt = prompts["result"]["prompts"][0]["name"]
        .as_str()
        .expect("a prompt")
        .to_string();
    assert!(
        prompt.contains("__"),
        "prompts are named like tools: {prompt}"
    );
    let (status, got) = gw
        .modern(
            "tok-a",
            "prompts/get",
            json!({"name": prompt, "arguments": {}}),
        )
        .await;
    assert_eq!(status, 200, "{got}");
    assert!(got["result"]["messages"].is_array(), "{got}");
    let (_, resources) = gw.modern("tok-a", "resources/list", json!({})).await;
    assert!(
        resources["result"]["resources"]
            .as_array()
            .is_some_and(|r| r.iter().any(|r| r["uri"] == "demo://readme")),
        "{resources}"
    );
    let (_, read) = gw
        .modern("tok-a", "resources/read", json!({"uri": "demo://readme"}))
        .await;
    assert!(
        read["result"]["contents"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("mcp-harness")),
        "{read}"
    );
    // The server says public, but a and b are granted different things: private.
    assert!(
        read["result"]["ttlMs"].is_u64() && read["result"]["cacheScope"] == "private",
        "hints on every read: {read}"
    );
    // b may use only alpha's echo: nothing of the prompts or resources.
    let (_, none) = gw.modern("tok-b", "prompts/list", json!({})).await;
    assert_eq!(none["result"]["prompts"], json!([]), "{none}");
    gw.stop().await;
}

// A resource URI that reads as another server's qualified name (`beta__x`, listed by
// alpha) is served qualified by the server that listed it, and read there: served as
// it was, its read went to beta.
#[tokio::test]
async fn a_uri_that_reads_as_another_servers_name_is_served_qualified() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let record = temp_file("uri-as-name");
    let text = std::fs::read_to_string(&setup.config)
        .expect("config")
        .replacen(
            &format!("\"alpha{}\"]", setup.tag),
            &format!(
                "\"alpha{}\", \"--list-resource\", \"beta__x\", \"--record\", {:?}]",
                setup.tag,
                record.display().to_string()
            ),
            1,
        );
    std::fs::write(&setup.config, text).expect("config");
    let gw = setup.start().await;
    let (_, list) = gw.modern("tok-a", "resources/list", json!({})).await;
    let uris: Vec<&Value> = (list["result"]["resources"].as_array())
        .expect("resources")
        .iter()
        .map(|r| &r["uri"])
        .collect();
    assert!(uris.contains(&&json!("alpha__beta__x")), "{list}");
    assert!(!uris.contains(&&json!("beta__x")), "{list}");
    // Read on alpha, and named in the result as its listing names it.
    let (_, read) = gw
        .modern("tok-a", "resources/read", json!({"uri": "alpha__beta__x"}))
        .await;
    assert_eq!(
        read["result"]["contents"][0]["uri"], "alpha__beta__x",
        "{read}"
    );
    assert_eq!(
        read["result"]["contents"][0]["text"], "listed beta__x",
        "{read}"
    );
    let reads: Vec<Value> = recorded(&record)
        .into_iter()
        .filter(|r| r["method"] == "resources/read")
        .map(|r| r["params"]["uri"].clone())
        .collect();
    assert_eq!(reads, [json!("beta__x")], "read on alpha, by its URI");
    gw.stop().await;
}

// The servers' resource templates are served (each by its own uriTemplate, with
// hints) to a principal that may read anything of the server, and a URI one makes is
// read through; a server that has no templates lists none.
#[tokio::test]
async fn resource_templates_are_served_and_read_through() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let text = std::fs::read_to_string(&setup.config)
        .expect("config")
        .replacen(
            &format!("\"alpha{}\"]", setup.tag),
            &format!("\"alpha{}\", \"--resource-template\"]", setup.tag),
            1,
        );
    std::fs::write(&setup.config, text).expect("config");
    let gw = setup.start().await;
    let (status, list) = gw
        .modern("tok-a", "resources/templates/list", json!({}))
        .await;
    assert_eq!(status, 200, "{list}");
    let templates = list["result"]["resourceTemplates"]
        .as_array()
        .expect("templates");
    let uris: Vec<&Value> = templates.iter().map(|t| &t["uriTemplate"]).collect();
    assert_eq!(uris, [&json!("demo://echo/{text}")], "{list}");
    assert_eq!(templates[0]["name"], "echo", "as the server lists it");
    assert!(list["result"]["ttlMs"].is_u64(), "{list}");
    let (_, read) = gw
        .modern("tok-a", "resources/read", json!({"uri": "demo://echo/hi"}))
        .await;
    assert_eq!(read["result"]["contents"][0]["text"], "hi", "{read}");
    // b may use only alpha's echo: no template.
    let (_, none) = gw
        .modern("tok-b", "resources/templates/list", json!({}))
        .await;
    assert_eq!(none["result"]["resourceTemplates"], json!([]), "{none}");
    gw.stop().await;
}

#[tokio::test]
async fn a_round_may_be_sent_again_by_its_principal_and_sessions_and_subscriptions_are_capped() {
    // A session quiet for a tenth of session_idle (3 s) may make room.
    let setup = Setup::new("session_idle = \"30s\"", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    // The same state twice (a client retry after a lost answer) is served twice.
    let round = start_confirm(&gw, "tok-a", "twice?").await;
    for _ in 0..2 {
        let (_, r) = finish_confirm(&gw, "tok-a", "twice?", &round["requestState"]).await;
        assert_eq!(result_text(&r), "approved: true", "{r}");
    }
    // 64 legacy sessions per principal. At the cap, a new one takes the place of the
    // principal's least recently used one quiet for a while (clients that exit
    // without a DELETE do not lock it out until theirs expire); when all of them are
    // busy (a stream open), the next initialize gets 503.
    let mut sids = Vec::new();
    for _ in 0..64 {
        sids.push(legacy_session(&gw).await);
    }
    tokio::time::sleep(Duration::from_millis(3200)).await; // quiet for 3 s (deliberate)
    let newest = legacy_session(&gw).await;
    let ping = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let (gone, _, _) = legacy_post(&gw, Some(&sids[0]), ping.clone()).await;
    assert_eq!(gone, 404, "the oldest quiet session made room");
    let (kept, _, _) = legacy_post(&gw, Some(&sids[1]), ping).await;
    assert_eq!(kept, 200, "only one went");
    let mut gets = Vec::new();
    for sid in sids[1..].iter().chain([&newest]) {
        gets.push(get_stream(&gw, sid).await);
    }
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}});
    assert_eq!(legacy_post(&gw, None, init).await.0, 503);
    drop(gets);
    // 16 subscriptions per principal; the next is refused, and one closed frees a slot.
    let mut streams = Vec::new();
    for i in 0..16 {
        let mut s = open_listen(&gw, "tok-b", json!(i), json!({"toolsListChanged": true})).await;
        let mut seen = String::new();
        assert!(read_until(&mut s, &mut seen, "acknowledged").await);
        streams.push(s);
    }
    let refused: Value = open_listen(&gw, "tok-b", json!(99), json!({"toolsListChanged": true}))
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(refused["error"]["code"], -32000, "{refused}");
    drop(streams.pop());
    let mut freed = false;
    for _ in 0..100 {
        let resp = open_listen(&gw, "tok-b", json!(100), json!({"toolsListChanged": true})).await;
        if resp
            .headers()
            .get("content-type")
            .is_some_and(|c| c.to_str().is_ok_and(|c| c.starts_with("text/event-stream")))
        {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(freed, "a closed subscription frees its slot");
    drop(streams);
    gw.stop().await;
}

#[tokio::test]
async fn a_legacy_session_outlives_its_idle_time_while_a_call_runs_or_its_stream_is_open() {
    let setup = Setup::new("session_idle = \"1s\"", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}});
    // A call longer than the idle time is not cut off by it, and the idle time counts
    // from its end (sweeps every 500 ms here).
    let sid = legacy_session(&gw).await;
    let slow = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "alpha__slow", "arguments": {"ms": 2500, "text": "done"}}});
    let (status, r, _) = legacy_post(&gw, Some(&sid), slow).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(result_text(&r), "done", "{r}");
    tokio::time::sleep(Duration::from_millis(600)).await; // past a sweep (deliberate)
    assert_eq!(legacy_post(&gw, Some(&sid), list.clone()).await.0, 200);
    // A client listening on its GET stream is still there (time is what is tested).
    let mut stream = gw.get_stream("tok-a", &sid).await;
    assert_eq!(stream.status().as_u16(), 200);
    // Anything but its end may come on it (a list change, a keep-alive).
    let ended = tokio::time::timeout(Duration::from_millis(2500), async {
        while let Ok(Some(_)) = stream.chunk().await {}
    })
    .await;
    assert!(ended.is_err(), "the stream of a listening client ended");
    assert_eq!(legacy_post(&gw, Some(&sid), list).await.0, 200);
    gw.stop().await;
}

#[tokio::test]
async fn a_subscription_and_a_legacy_session_end_when_a_reload_revokes_their_tokens() {
    ended_by_a_reload(false).await;
}

// The same when each token is replaced by another for the same agent (rotated after a
// leak): the principal is still admitted, by the new token, and what the old one opened
// ends. Before, it stayed open for as long as its client read it.
#[tokio::test]
async fn a_subscription_and_a_legacy_session_end_when_a_reload_replaces_their_tokens() {
    ended_by_a_reload(true).await;
}

/// Opens a legacy session with its event stream (tok-a) and a subscription (tok-b), then
/// reloads with both tokens removed, or (`rotate`) replaced by new ones for the same
/// agents: both end.
async fn ended_by_a_reload(rotate: bool) {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let sid = legacy_session(&gw).await; // tok-a's
    let mut get = gw.get_stream("tok-a", &sid).await;
    assert_eq!(get.status().as_u16(), 200);
    let (mut sub, mut heard) = subscribed(&gw, "tok-b", "b-sub").await;
    let original = std::fs::read_to_string(&setup.config).expect("config");
    let line = |token: &[u8], agent: &str| {
        format!(
            "  {{ sha256 = \"{}\", agent = \"{agent}\" }},\n",
            sha256_hex(token)
        )
    };
    let (a_token, b_token) = (line(b"tok-a", "a"), line(b"tok-b", "b"));
    assert!(original.contains(&a_token) && original.contains(&b_token));
    let (a_new, b_new) = match rotate {
        true => (line(b"tok-a-new", "a"), line(b"tok-b-new", "b")),
        false => (String::new(), String::new()),
    };
    gw.reload_with(
        &setup,
        &original.replace(&a_token, &a_new).replace(&b_token, &b_new),
    );
    // Its final result comes, and the stream ends, with no change to announce.
    assert!(
        read_until(&mut sub, &mut heard, "\"complete\"").await,
        "{heard}"
    );
    // The session of the token revoked ends, and its event stream with it.
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(Some(_)) = get.chunk().await {}
    })
    .await;
    assert!(ended.is_ok(), "the revoked token's session stayed");
    if rotate {
        let (status, _) = gw.modern("tok-a-new", "tools/list", json!({})).await;
        assert_eq!(status, 200, "the new token is taken");
    }
    gw.stop().await;
}

// A reload that takes the key a JWT was signed with out of the JWKS ends what was
// opened with that JWT (a subscription, a legacy session and its event stream), as it
// refuses a request with it. Before, they ran on to the token's expiry: a leaked key's
// forged token may name one ten years away.
#[tokio::test]
async fn a_reload_that_removes_a_jwts_key_ends_what_the_jwt_opened() {
    let (setup, signing, jwks) = jwt_issuer("");
    let gw = setup.start().await;
    let claims = json!({"iss": JWT_ISS, "aud": JWT_AUD, "sub": "c", "exp": unix_now() + 3600});
    let token = jwt(&signing, "k1", claims);
    let (mut sub, mut heard) = subscribed(&gw, &token, "c-sub").await;
    let sid = legacy_session_as(&gw, &token).await;
    let mut get = gw.get_stream(&token, &sid).await;
    assert_eq!(get.status().as_u16(), 200);
    // The issuer's keys now: another one only.
    let (_, other) = es256_key("k2");
    std::fs::write(&jwks, json!({"keys": [other]}).to_string()).expect("jwks");
    let config = std::fs::read_to_string(&setup.config).expect("config");
    gw.reload_with(&setup, &config);
    assert!(
        read_until(&mut sub, &mut heard, "\"complete\"").await,
        "the subscription ends: {heard}"
    );
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(_)) = get.chunk().await {}
    })
    .await;
    assert!(ended.is_ok(), "the session opened with the JWT stayed");
    let (status, _) = gw.modern(&token, "tools/list", json!({})).await;
    assert_eq!(status, 401, "as a request with it is refused");
    gw.stop().await;
}

// A principal's parked calls hold their params parsed for minutes: they come to at
// most 2 × max_body_bytes (as JSON), apart from the calls-in-flight budget, so that
// answering a parked round (which sends the same arguments again) is never kept out.
// Past it, the principal's own round that expires first makes room for its new one (a
// client whose person declined stops retrying: it is not locked out until they expire).
#[tokio::test]
async fn parked_calls_hold_their_params_within_a_budget_of_their_own() {
    let setup = Setup::new("max_body_bytes = 1048576", &[("k1", &key("k1"))]);
    let exe = harness_exe();
    let text = std::fs::read_to_string(&setup.config).expect("config");
    let more: String = ["gamma", "delta", "epsilon"]
        .iter()
        .map(|id| {
            format!(
                "[[servers]]\nid = \"{id}\"\ntransport = {{ type = \"stdio\", command = \"{exe}\", args = [\"demo-server\", \"{id}\", \"--era\", \"legacy\"] }}\n\n"
            )
        })
        .collect();
    let text = text.replacen("[permissions.a]", &format!("{more}[permissions.a]"), 1);
    std::fs::write(&setup.config, text).expect("config");
    let gw = setup.start().await;
    let pad = "x".repeat(900 << 10);
    let call = |server: &str| json!({"name": format!("{server}__confirm"), "arguments": {"message": "ok?", "pad": pad}});
    let mut states = Vec::new();
    for server in ["beta", "gamma"] {
        let (status, r) = gw.modern("tok-a", "tools/call", call(server)).await;
        assert_eq!(status, 200, "{server}");
        assert_eq!(r["result"]["resultType"], "input_required", "{server}");
        states.push(r["result"]["requestState"].clone());
    }
    let (_, third) = gw.modern("tok-a", "tools/call", call("delta")).await;
    assert_eq!(third["result"]["resultType"], "input_required", "{third}");
    states.push(third["result"]["requestState"].clone());
    // Another principal's round is its own.
    let (_, other) = gw.modern("tok-a2", "tools/call", call("epsilon")).await;
    assert_eq!(other["result"]["resultType"], "input_required", "{other}");
    let answered = |server: &str, state: &Value| {
        let mut again = call(server);
        again["requestState"] = state.clone();
        again["inputResponses"] =
            json!({"elicitation": {"action": "accept", "content": {"approved": true}}});
        again
    };
    // The first round made room: its answer takes nothing up.
    let (_, gone) = gw
        .modern("tok-a", "tools/call", answered("beta", &states[0]))
        .await;
    assert!(gone.get("error").is_some(), "{gone}");
    // The others are answered, their arguments sent again.
    for (server, state) in ["gamma", "delta"].into_iter().zip(&states[1..]) {
        let (status, done) = gw
            .modern("tok-a", "tools/call", answered(server, state))
            .await;
        assert_eq!(status, 200, "{server}");
        assert_eq!(result_text(&done), "approved: true", "{server}");
    }
    assert!(gw.stop().await.success());
}

/// tok-a's call of the legacy server's `confirm`, parked as an input round: its params
/// and the gateway's answer (200, `input_required`).
async fn parked_confirm(gw: &Gateway) -> (Value, Value) {
    let params = json!({"name": "beta__confirm", "arguments": {"message": "ship?"}});
    let (status, r) = gw.modern("tok-a", "tools/call", params.clone()).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["result"]["resultType"], "input_required", "{r}");
    (params, r)
}

// A reload that takes a principal's grant to a tool away ends its parked input rounds
// on that tool: the answer to one is refused, and the tool's call does not complete.
#[tokio::test]
async fn a_parked_round_on_a_tool_whose_grant_a_reload_took_away_is_not_resumed() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let (params, r) = parked_confirm(&gw).await;
    let original = std::fs::read_to_string(&setup.config).expect("config");
    let everything = "[permissions.a]\n\"*\" = [\"*\"]";
    assert!(original.contains(everything));
    gw.reload_with(
        &setup,
        &original.replace(everything, "[permissions.a]\nalpha = [\"*\"]"),
    );
    let mut narrowed = false;
    for _ in 0..100 {
        let (_, listed) = gw.modern("tok-a", "tools/list", json!({})).await;
        if listed["result"]["tools"].as_array().is_some_and(|tools| {
            !tools.is_empty() && !tools.iter().any(|t| t["name"] == "beta__confirm")
        }) {
            narrowed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(narrowed, "the reload took beta away from a");
    let mut again = params.clone();
    again["requestState"] = r["result"]["requestState"].clone();
    again["inputResponses"] =
        json!({"elicitation": {"action": "accept", "content": {"approved": true}}});
    let (_, refused) = gw.modern("tok-a", "tools/call", again).await;
    assert!(refused["error"].is_object(), "{refused}");
    assert!(gw.stop().await.success());
}

#[tokio::test]
async fn a_principals_legacy_event_streams_are_capped_kept_alive_and_freed_with_their_session() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let get = |sid: String| {
        let gw = &gw;
        async move { gw.get_stream("tok-a", &sid).await }
    };
    // 64 streams per principal (four on each of 16 sessions); the next gets 503.
    let mut sessions = Vec::new();
    let mut streams = Vec::new();
    for _ in 0..16 {
        let sid = legacy_session(&gw).await;
        for _ in 0..4 {
            let s = get(sid.clone()).await;
            assert_eq!(s.status().as_u16(), 200);
            streams.push(s);
        }
        sessions.push(sid);
    }
    let spare = legacy_session(&gw).await;
    assert_eq!(get(spare.clone()).await.status().as_u16(), 503);
    // At the cap, a session that is gone is still 404 (the client initializes again),
    // and a client reconnecting on a session with four replaces the oldest.
    assert_eq!(get("no-such-session".into()).await.status().as_u16(), 404);
    let again = get(sessions[1].clone()).await;
    assert_eq!(again.status().as_u16(), 200);
    streams.push(again);
    // A session that ends takes its streams' places with it.
    assert_eq!(delete_session(&gw, "tok-a", &sessions[0]).await, 200);
    let mut freed = None;
    for _ in 0..100 {
        let s = get(spare.clone()).await;
        if s.status().as_u16() == 200 {
            freed = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut open = freed.expect("an ended session's streams free their places");
    // An idle stream is written to now and then (a client that vanished is noticed).
    let mut seen = String::new();
    assert!(
        read_until(&mut open, &mut seen, ": keep-alive").await,
        "{seen}"
    );
    drop(streams);
    gw.stop().await;
}

#[test]
fn serve_makes_keys_and_refuses_to_start_without_any() {
    let out = std::process::Command::new(harness_exe())
        .args(["serve", "--new-key"])
        .output()
        .expect("run");
    assert!(out.status.success());
    let line = String::from_utf8(out.stdout).expect("utf-8");
    let (kid, made) = line.trim().split_once(':').expect("KID:KEY");
    assert!(!kid.is_empty() && made.len() == 43, "{line}");
    // Named by when it was made, not by the process id (1 in every container).
    let secs: u64 = kid
        .strip_prefix('k')
        .and_then(|t| t.split_once('-'))
        .and_then(|(secs, _micros)| secs.parse().ok())
        .expect("k and the time it was made");
    assert!(secs.abs_diff(unix_now()) < 600, "{kid}");
    // One client on stdin/stdout, or HTTP: not both.
    let out = std::process::Command::new(harness_exe())
        .args(["serve", "--stdio", "--listen", "127.0.0.1:0", "--dev-keys"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("pick one"));
    // A config with no keys, no MCP_HARNESS_GATEWAY_KEYS and no --dev-keys: exit 2, named.
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let text = std::fs::read_to_string(&setup.config).expect("config");
    let without: String = text
        .lines()
        .filter(|l| !l.starts_with("keys_file"))
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&setup.config, without).expect("config");
    let out = std::process::Command::new(harness_exe())
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&setup.config)
        .env_remove("MCP_HARNESS_GATEWAY_KEYS")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no sealing keys") && err.contains("--new-key"),
        "{err}"
    );
}

#[tokio::test]
async fn two_gateways_share_the_shared_cache_layer_and_the_sealing_keys() {
    let redis = Redis::start().await;
    let tag = tag();
    let record = temp_file(&format!("{tag}-rec"));
    let keys = temp_file(&format!("{tag}-keys"));
    write_private(&keys, &keys_text(&[("k1", &key("k1"))]));
    let config = temp_file(&format!("{tag}.toml")).with_extension("toml");
    let text = format!(
        r#"
[[servers]]
id = "alpha"
transport = {{ type = "stdio", command = "{exe}", args = ["demo-server", "alpha{tag}", "--record", "{record}"] }}

[permissions.a]
"*" = ["*"]

[cache.shared]
url = "{url}"
servers = ["alpha"]
timeout = "1s"

[gateway]
keys_file = "{keys}"
tokens = [{{ sha256 = "{a}", agent = "a" }}]
"#,
        exe = harness_exe(),
        record = record.display(),
        url = redis.url(),
        keys = keys.display(),
        a = sha256_hex(b"tok-a"),
    );
    std::fs::write(&config, text).expect("config");
    let lists = || {
        recorded(&record)
            .iter()
            .filter(|r| r["method"] == "tools/list")
            .count()
    };
    let one = Gateway::start(&config).await;
    let (status, first) = one.modern("tok-a", "tools/list", json!({})).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(lists(), 1);
    let mut shared = false;
    for _ in 0..250 {
        shared = redis
            .keys()
            .await
            .iter()
            .any(|k| k.starts_with("mcp-harness:list:alpha:"));
        if shared {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(shared, "gateway one's list is in Redis");
    // Gateway two has its own server process, its own memory, no disk layer.
    let two = Gateway::start(&config).await;
    let (status, second) = two.modern("tok-a", "tools/list", json!({})).await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(names(&second), names(&first));
    assert_eq!(lists(), 1, "gateway two asked no server for its list");
    // And a round started on one finishes on the other.
    let round = start_confirm(&one, "tok-a", "shared?").await;
    let (_, r) = finish_confirm(&two, "tok-a", "shared?", &round["requestState"]).await;
    assert_eq!(result_text(&r), "approved: true", "{r}");
    one.stop().await;
    two.stop().await;
    for p in [&record, &keys, &config] {
        let _ = std::fs::remove_file(p);
    }
}

/// A meta-tool's structured result: the names a search found.
fn found_names(r: &Value) -> Vec<String> {
    names_in(&r["result"]["structuredContent"]["tools"])
}

// The gateway's own meta-tools declare no `x-mcp-header`: an upstream tool of the same
// name that does (`search_tools` bound to `Mcp-Param-Query`) does not hold them to its
// headers. Before, every search without that header was refused -32020.
#[tokio::test]
async fn the_gateways_meta_tools_are_not_held_to_an_upstream_tools_headers() {
    let setup = Setup::new(r#"tool_exposure = "search""#, &[("k1", &key("k1"))]);
    let text = std::fs::read_to_string(&setup.config).expect("config");
    let text = text.replacen(
        &format!("\"alpha{}\"]", setup.tag),
        &format!(
            "\"alpha{}\", \"--tool-alias\", \"search_tools\", \"--tool-alias\", \"describe_tool\"]",
            setup.tag
        ),
        1,
    );
    std::fs::write(&setup.config, text).expect("config");
    let gw = setup.start().await;
    for (tool, arguments) in [
        ("search_tools", json!({"query": "echoes text back"})),
        (
            "describe_tool",
            json!({"name": "alpha__echo", "query": "x"}),
        ),
    ] {
        let (status, r) = gw
            .modern(
                "tok-a",
                "tools/call",
                json!({"name": tool, "arguments": arguments}),
            )
            .await;
        assert_eq!(status, 200, "{tool}: {r}");
        assert!(r["result"].is_object(), "{tool}: {r}");
    }
    assert!(gw.stop().await.success());
}

// With bare names (`prefix = "never"`), a search finds only what the listing serves: a
// tool two servers offer is served once, by the name `tools/list` gives it. Before, the
// other server's was found too, under its qualified name, unshortened (here past 64
// characters).
#[tokio::test]
async fn a_search_over_bare_names_finds_only_served_names() {
    let setup = Setup::new(
        "prefix = \"never\"\ntool_exposure = \"search\"",
        &[("k1", &key("k1"))],
    );
    let long = format!("answer_with_the_servers_name_{}", "x".repeat(45));
    let text = std::fs::read_to_string(&setup.config).expect("config");
    let text = text
        .replacen(
            &format!("\"alpha{}\"]", setup.tag),
            &format!("\"alpha{}\", \"--tool-alias\", \"{long}\"]", setup.tag),
            1,
        )
        .replacen(
            "\"--era\", \"legacy\"]",
            &format!("\"--era\", \"legacy\", \"--tool-alias\", \"{long}\"]"),
            1,
        );
    std::fs::write(&setup.config, text).expect("config");
    let gw = setup.start().await;
    let search = json!({"name": "search_tools", "arguments": {"query": "answers with this server's name", "limit": 10}});
    let (_, r) = gw.modern("tok-a", "tools/call", search).await;
    let found = found_names(&r);
    assert!(!found.is_empty(), "{r}");
    for name in &found {
        assert!(
            name.len() <= 64
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b)),
            "{name}: {r}"
        );
    }
    assert_eq!(
        found
            .iter()
            .filter(|n| n.starts_with("answer_with"))
            .count(),
        1,
        "served once: {found:?}"
    );
    assert!(gw.stop().await.success());
}

#[tokio::test]
async fn search_exposure_serves_three_meta_tools_that_find_describe_and_call_within_the_grants() {
    let setup = Setup::new(r#"tool_exposure = "search""#, &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let (_, list) = gw.modern("tok-a", "tools/list", json!({})).await;
    assert_eq!(names(&list), ["search_tools", "describe_tool", "call_tool"]);
    assert_eq!(list["result"]["cacheScope"], "public");

    let search =
        |query: &str| json!({"name": "search_tools", "arguments": {"query": query, "limit": 3}});
    let (_, r) = gw
        .modern("tok-a", "tools/call", search("adds two integers"))
        .await;
    let found = found_names(&r);
    assert!(found[0].ends_with("__add"), "{r}");
    assert!(
        found.len() <= 3 && result_text(&r).contains("Adds two integers"),
        "{r}"
    );
    // b may call alpha's echo only.
    let (_, r) = gw
        .modern("tok-b", "tools/call", search("adds two integers"))
        .await;
    assert!(found_names(&r).is_empty(), "{r}");
    let (_, r) = gw
        .modern("tok-b", "tools/call", search("echoes text back"))
        .await;
    assert_eq!(found_names(&r), ["alpha__echo"], "{r}");
    let (_, r) = gw
        .modern(
            "tok-a",
            "tools/call",
            json!({"name": "search_tools", "arguments": {"limit": 3}}),
        )
        .await;
    // A model's mistake in a meta-tool's arguments is the tool's error, for it to read.
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(result_text(&r).contains("arguments.query"), "{r}");

    let describe = |name: &str| json!({"name": "describe_tool", "arguments": {"name": name}});
    let (_, r) = gw
        .modern("tok-a", "tools/call", describe("alpha__add"))
        .await;
    let def = &r["result"]["structuredContent"];
    assert_eq!(def["name"], "alpha__add", "{r}");
    assert_eq!(def["inputSchema"]["required"], json!(["a", "b"]), "{r}");
    let (_, r) = gw
        .modern("tok-b", "tools/call", describe("alpha__add"))
        .await;
    assert_eq!(r["result"]["isError"], true, "{r}");

    let call = |name: &str, arguments: Value| json!({"name": "call_tool", "arguments": {"name": name, "arguments": arguments}});
    let (_, r) = gw
        .modern(
            "tok-a",
            "tools/call",
            call("beta__echo", json!({"text": "via search"})),
        )
        .await;
    assert_eq!(result_text(&r), "via search", "{r}");
    let (_, r) = gw
        .modern(
            "tok-b",
            "tools/call",
            call("beta__echo", json!({"text": "x"})),
        )
        .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    // A tool found may also be called by its own name.
    let (_, r) = gw
        .modern(
            "tok-a",
            "tools/call",
            json!({"name": "alpha__echo", "arguments": {"text": "direct"}}),
        )
        .await;
    assert_eq!(result_text(&r), "direct", "{r}");

    // Mcp-Param headers sent with call_tool are the inner tool's, and held to it.
    let region = call("alpha__region_echo", json!({"region": "eu"}));
    let body = request("tools/call", region.clone());
    let (status, r, _) = gw
        .post(Some("tok-a"), &body, &[("mcp-param-region", "us")])
        .await;
    assert_eq!(
        (status, r["error"]["code"].as_i64()),
        (400, Some(-32020)),
        "{r}"
    );
    let (status, r, _) = gw
        .post(Some("tok-a"), &body, &[("mcp-param-region", "eu")])
        .await;
    assert_eq!(status, 200, "{r}");
    // call_tool declares none: a client that sends none is not held to them.
    let (_, r) = gw.modern("tok-a", "tools/call", region).await;
    assert!(r["result"].is_object(), "{r}");

    // An input round through call_tool: the sealed state is bound to the inner call.
    let confirm = call("alpha__confirm", json!({"message": "ok?"}));
    let (_, r) = gw.modern("tok-a", "tools/call", confirm.clone()).await;
    assert_eq!(r["result"]["resultType"], "input_required", "{r}");
    let mut again = confirm.clone();
    again["requestState"] = r["result"]["requestState"].clone();
    again["inputResponses"] =
        json!({"confirm": {"action": "accept", "content": {"approved": true}}});
    let (_, done) = gw.modern("tok-a", "tools/call", again.clone()).await;
    assert_eq!(done["result"]["resultType"], "complete", "{done}");
    // The same state on another inner call is refused.
    again["arguments"]["arguments"]["message"] = json!("something else");
    let (_, refused) = gw.modern("tok-a", "tools/call", again).await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    assert!(gw.stop().await.success());
}

/// The first line of `status --watch --from URL` (with `token` in
/// `MCP_HARNESS_METRICS_TOKEN`) that shows server beta or a refusal.
async fn watched_row(url: String, token: Option<&'static str>) -> Option<String> {
    tokio::task::spawn_blocking(move || {
        use std::io::{BufRead, BufReader};
        let mut command = std::process::Command::new(harness_exe());
        command.args(["status", "--watch", "--from", &url]);
        if let Some(token) = token {
            command.env("MCP_HARNESS_METRICS_TOKEN", token);
        }
        let mut child = command
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn");
        let out = child.stdout.take().expect("stdout");
        let row = BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .find(|l| l.starts_with("beta ") || l.contains("HTTP 401"));
        let _ = child.kill();
        let _ = child.wait();
        row
    })
    .await
    .expect("join")
}

/// `serve` with `--metrics` on a free loopback port: the gateway, the port, and
/// `127.0.0.1:PORT`.
async fn with_metrics(setup: &Setup) -> (Gateway, u16, String) {
    let port = free_port();
    let metrics_addr = format!("127.0.0.1:{port}");
    let config = setup.config.display().to_string();
    let server = HttpServer::start(
        &harness_exe(),
        &[
            "serve",
            "--config",
            &config,
            "--listen",
            "127.0.0.1:0",
            "--metrics",
            &metrics_addr,
        ],
    )
    .await;
    let gw = Gateway {
        server,
        http: http_client(),
    };
    (gw, port, metrics_addr)
}

#[tokio::test]
async fn metrics_are_served_as_prometheus_text_on_their_own_listener() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let (gw, port, metrics_addr) = with_metrics(&setup).await;
    for text in ["one", "two"] {
        let (_, r) = gw
            .modern(
                "tok-a",
                "tools/call",
                json!({"name": "beta__echo", "arguments": {"text": text}}),
            )
            .await;
        assert_eq!(result_text(&r), text);
    }
    let resp = gw
        .http
        .get(format!("http://{metrics_addr}/metrics"))
        .send()
        .await
        .expect("scrape");
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .is_ok_and(|c| c.starts_with("text/plain; version=0.0.4")),
        "{:?}",
        resp.headers()
    );
    let text = resp.text().await.expect("body");
    let value = |series: &str| -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    };
    let ok = r#"{mcp_harness_server_id="beta",mcp_method_name="tools/call",outcome="ok"}"#;
    assert_eq!(
        value(&format!("mcp_harness_calls_total{ok}")),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        value(&format!("mcp_client_operation_duration_seconds_count{ok}")),
        Some(2.0)
    );
    for id in ["alpha", "beta"] {
        assert_eq!(
            value(&format!(
                "mcp_harness_server_state{{mcp_harness_server_id=\"{id}\",state=\"ready\"}}"
            )),
            Some(1.0),
            "{text}"
        );
    }
    assert!(text.contains("# TYPE mcp_client_operation_duration_seconds histogram"));
    assert!(value("mcp_harness_audit_backlog").is_some());
    // Nothing else is served there, and the MCP listener does not serve metrics.
    let other = gw
        .http
        .get(format!("http://{metrics_addr}/mcp"))
        .send()
        .await
        .expect("get");
    assert_eq!(other.status(), 404);
    // A page that rebinds its own name to this address (DNS rebinding) reads nothing;
    // a scraper by address or by `localhost` does.
    for (host, status) in [
        ("evil.example", 403),
        (&format!("evil.example:{port}") as &str, 403),
        (&format!("localhost:{port}"), 200),
        (&format!("[::1]:{port}"), 200),
        (&format!("[fe80::1%25eth0]:{port}"), 200),
        (&format!("127.0.0.1%25x:{port}"), 403),
        (&format!("LocalHost:{port}"), 200),
    ] {
        let resp = gw
            .http
            .get(format!("http://{metrics_addr}/metrics"))
            .header("host", host)
            .send()
            .await
            .expect("scrape");
        assert_eq!(resp.status(), status, "Host: {host}");
    }

    // `status --watch --from` shows the gateway's servers from those metrics.
    let url = format!("http://{metrics_addr}/metrics");
    let watched = watched_row(url, None).await.expect("a row for beta");
    let cells: Vec<&str> = watched.split_whitespace().collect();
    // SERVER STATE ERA RESTARTS CALLS ERRORS P50…
    assert_eq!(
        &cells[..6],
        ["beta", "ready", "legacy", "0", "2", "0"],
        "{watched}"
    );
    assert!(gw.stop().await.success());
}

// `serve` warns at start when `/metrics` listens beyond loopback and asks for no
// token; with `metrics_tokens`, or on loopback, it does not.
#[tokio::test]
async fn metrics_served_beyond_loopback_without_a_token_are_warned_of() {
    let with_token = scrape_me();
    for (extra, metrics_on, warned) in [
        ("", "0.0.0.0:0", true),
        (with_token.as_str(), "0.0.0.0:0", false),
        ("", "127.0.0.1:0", false),
    ] {
        let setup = Setup::new(extra, &[("k1", &key("k1"))]);
        let (mut child, mut lines) = serve_with_metrics_on(&setup, metrics_on);
        let mut before = Vec::new();
        // Until the metrics listener says where it is (the warning comes before).
        let read = tokio::time::timeout(Duration::from_secs(30), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if line.starts_with("metrics http://") {
                    return true;
                }
                before.push(line);
            }
            false
        })
        .await;
        assert_eq!(read.ok(), Some(true), "{metrics_on}: {before:?}");
        let warning = before
            .iter()
            .any(|l| l.contains("/metrics asks for no token"));
        assert_eq!(warning, warned, "{extra:?} on {metrics_on}: {before:?}");
        let _ = child.kill().await;
    }
}

/// `serve` of `setup` with `--metrics` on `addr`, and the lines of its stderr.
fn serve_with_metrics_on(
    setup: &Setup,
    addr: &str,
) -> (
    tokio::process::Child,
    tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStderr>>,
) {
    use tokio::io::AsyncBufReadExt;
    let config = setup.config.display().to_string();
    let mut child = tokio::process::Command::new(harness_exe())
        .args(["serve", "--config", &config, "--listen", "127.0.0.1:0"])
        .args(["--metrics", addr])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn serve");
    let stderr = child.stderr.take().expect("stderr");
    (child, tokio::io::BufReader::new(stderr).lines())
}

/// `[gateway]`'s `metrics_tokens` line naming the token `scrape-me`.
fn scrape_me() -> String {
    format!(
        "metrics_tokens = [{{ sha256 = \"{}\" }}]",
        sha256_hex(b"scrape-me")
    )
}

// A reload that takes every metrics token away from a listener beyond loopback is
// warned of, once, when the listener first serves without one.
#[tokio::test]
async fn a_reload_that_empties_the_metrics_tokens_is_warned_of_once() {
    let with_token = scrape_me();
    let setup = Setup::new(&with_token, &[("k1", &key("k1"))]);
    let (mut child, mut lines) = serve_with_metrics_on(&setup, "0.0.0.0:0");
    let port = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(line)) = lines.next_line().await {
            assert!(!line.contains("/metrics asks for no token"), "{line}");
            if let Some(at) = line.strip_prefix("metrics http://") {
                return at
                    .trim_end_matches("/metrics")
                    .rsplit(':')
                    .next()
                    .map(String::from);
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
    .expect("the metrics listener's address");
    // The rest of stderr, read as it comes.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let url = format!("http://127.0.0.1:{port}/metrics");
    let http = http_client();
    let scrape = || async {
        http.get(&url)
            .send()
            .await
            .map(|r| r.status().as_u16())
            .unwrap_or(0)
    };
    assert_eq!(
        scrape().await,
        401,
        "a token is asked for before the reload"
    );
    let text = std::fs::read_to_string(&setup.config)
        .expect("config")
        .replace(&with_token, "");
    let tmp = setup.config.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, &setup.config).expect("rename");
    let pid = child.id().expect("pid").to_string();
    let _ = std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while scrape().await != 200 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the reload takes the token away"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let warned = |line: &str| line.contains("/metrics asks for no token any more");
    let first = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(line) = rx.recv().await {
            if warned(&line) {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(first.ok(), Some(true), "warned of at the first open scrape");
    // Served open again: not said again.
    assert_eq!(scrape().await, 200);
    tokio::time::sleep(Duration::from_millis(500)).await;
    while let Ok(line) = rx.try_recv() {
        assert!(!warned(&line), "warned of once: {line}");
    }
    let _ = child.kill().await;
}

// With `metrics_tokens`, a scrape needs one of them; the text follows the calls
// (rendered at most once a second, never held longer).
#[tokio::test]
async fn metrics_tokens_are_asked_of_scrapers() {
    let extra = scrape_me();
    let setup = Setup::new(&extra, &[("k1", &key("k1"))]);
    let (gw, _, metrics_addr) = with_metrics(&setup).await;
    let url = format!("http://{metrics_addr}/metrics");
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("Basic c2NyYXBlLW1l"),
        Some("scrape-me"),
    ] {
        let mut get = gw.http.get(&url);
        if let Some(auth) = auth {
            get = get.header("authorization", auth);
        }
        let resp = get.send().await.expect("scrape");
        assert_eq!(resp.status(), 401, "{auth:?}");
        assert_eq!(resp.headers()["www-authenticate"], "Bearer");
        let body = resp.text().await.expect("body");
        assert!(!body.contains("mcp_harness"), "nothing told: {body}");
    }
    // The scheme's name is read without regard to case (RFC 7235), as on `/mcp`.
    let resp = gw
        .http
        .get(&url)
        .header("authorization", "bearer scrape-me")
        .send()
        .await
        .expect("scrape");
    assert_eq!(resp.status(), 200);
    let calls = |text: &str| -> Option<f64> {
        let series = r#"mcp_harness_calls_total{mcp_harness_server_id="beta",mcp_method_name="tools/call",outcome="ok"} "#;
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.parse().ok())
    };
    let scrape = || async {
        let resp = gw
            .http
            .get(&url)
            .bearer_auth("scrape-me")
            .send()
            .await
            .expect("scrape");
        assert_eq!(resp.status(), 200);
        resp.text().await.expect("body")
    };
    let (_, r) = gw
        .modern(
            "tok-a",
            "tools/call",
            json!({"name": "beta__echo", "arguments": {"text": "one"}}),
        )
        .await;
    assert_eq!(result_text(&r), "one");
    let mut seen = None;
    for _ in 0..100 {
        seen = calls(&scrape().await);
        if seen == Some(1.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(seen, Some(1.0));
    let (_, r) = gw
        .modern(
            "tok-a",
            "tools/call",
            json!({"name": "beta__echo", "arguments": {"text": "two"}}),
        )
        .await;
    assert_eq!(result_text(&r), "two");
    for _ in 0..100 {
        seen = calls(&scrape().await);
        if seen == Some(2.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(seen, Some(2.0), "a later scrape sees the later call");

    // `status --watch --from` sends the token it is given.
    let watched = watched_row(url, Some("scrape-me")).await.expect("a line");
    assert!(watched.starts_with("beta "), "{watched}");
    assert!(gw.stop().await.success());
}

#[tokio::test]
async fn a_legacy_servers_elicitation_is_a_modern_clients_input_round() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let (params, r) = parked_confirm(&gw).await;
    let result = &r["result"];
    let ask = &result["inputRequests"]["elicitation"];
    assert_eq!(ask["method"], "elicitation/create", "{r}");
    assert_eq!(ask["params"]["message"], "ship?", "{r}");
    let mut again = params.clone();
    again["requestState"] = result["requestState"].clone();
    again["inputResponses"] =
        json!({"elicitation": {"action": "accept", "content": {"approved": true}}});
    let (_, done) = gw.modern("tok-a", "tools/call", again.clone()).await;
    assert_eq!(result_text(&done), "approved: true", "{done}");
    // The round is over: its state cannot be used again. Each retry (an answer lost on
    // the way) is told the call went on with the answer, never that it was cancelled
    // (which invites running the tool again): a refused retry took nothing up.
    for _ in 0..2 {
        let (_, replay) = gw.modern("tok-a", "tools/call", again.clone()).await;
        assert_eq!(replay["error"]["code"], -32602, "{replay}");
        let message = replay["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("already answered"), "{replay}");
    }
    assert!(gw.stop().await.success());
}

#[tokio::test]
async fn a_legacy_servers_questions_one_after_another_are_rounds_until_the_answer() {
    // The call parks at the first question and stays on its own task after that: each
    // later question parks it again, and the last answer finishes it.
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let params = json!({"name": "beta__rounds", "arguments": {"n": 3}});
    let (status, mut r) = gw.modern("tok-a", "tools/call", params.clone()).await;
    assert_eq!(status, 200, "{r}");
    for answer in ["one", "two", "three"] {
        let result = &r["result"];
        assert_eq!(result["resultType"], "input_required", "{r}");
        let mut again = params.clone();
        again["requestState"] = result["requestState"].clone();
        again["inputResponses"] =
            json!({"elicitation": {"action": "accept", "content": {"answer": answer}}});
        let (status, next) = tokio::time::timeout(
            Duration::from_secs(20),
            gw.modern("tok-a", "tools/call", again),
        )
        .await
        .expect("each round answers");
        assert_eq!(status, 200, "{next}");
        r = next;
    }
    assert_eq!(result_text(&r), "answers: one,two,three", "{r}");
    assert!(gw.stop().await.success());
}

// Long-lived streams have a budget of their own (`max_streams`), every principal's
// together: clients that hold them open without reading cannot take every connection
// from those that make requests, and a stream closed gives its place back.
#[tokio::test]
async fn long_lived_streams_stay_within_their_budget_and_requests_still_get_through() {
    let setup = Setup::new("max_streams = 2", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let first = open_listen(&gw, "tok-a", json!("s1"), json!({"toolsListChanged": true})).await;
    let second = open_listen(&gw, "tok-b", json!("s2"), json!({"toolsListChanged": true})).await;
    assert_eq!(
        (first.status().as_u16(), second.status().as_u16()),
        (200, 200)
    );
    let mut third = open_listen(&gw, "tok-a", json!("s3"), json!({"toolsListChanged": true})).await;
    assert_eq!(third.status().as_u16(), 503);
    let mut body = String::new();
    while let Ok(Some(chunk)) = third.chunk().await {
        body.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(body.contains("too many streams"), "{body}");
    // Requests are not streams: they go through.
    let (status, list) = gw.modern("tok-a", "tools/list", json!({})).await;
    assert_eq!(status, 200, "{list}");
    drop(first);
    let mut again = None;
    for _ in 0..100 {
        let r = open_listen(&gw, "tok-a", json!("s4"), json!({"toolsListChanged": true})).await;
        if r.status().as_u16() == 200 {
            again = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(again.is_some(), "a closed stream gives its place back");
    drop((second, again));
    gw.stop().await;
}

// A few principals, each within its own caps, cannot keep the others from every stream:
// once `max_streams` are open, a newcomer takes the oldest stream of the principal
// holding the most, as long as that one holds at least two more. A GET stream so taken
// ends; a subscription ends with its final result.
#[tokio::test]
async fn a_full_stream_budget_is_shared_between_principals() {
    let setup = Setup::new("max_streams = 3", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let sid = legacy_session(&gw).await;
    let mut get = get_stream(&gw, &sid).await;
    let (mut first, _) = subscribed(&gw, "tok-a", "a1").await;
    let (_second, _) = subscribed(&gw, "tok-a", "a2").await;
    // Full, all a's: b takes the place of a's oldest stream, the GET stream, which ends.
    let (_b, _) = subscribed(&gw, "tok-b", "b1").await;
    assert!(
        ends(&mut get).await,
        "the GET stream whose place was taken ends"
    );
    // a holds two, b one: nobody gives b another.
    let more = open_listen(&gw, "tok-b", json!("b2"), json!({"toolsListChanged": true})).await;
    assert_eq!(more.status().as_u16(), 503);
    // Another principal (a's other auth context) takes a's older subscription, which
    // ends with its final result.
    let (_other, _) = subscribed(&gw, "tok-a2", "o1").await;
    let mut heard = String::new();
    assert!(
        read_until(&mut first, &mut heard, "\"complete\"").await,
        "{heard}"
    );
    assert!(
        first.chunk().await.ok().flatten().is_none(),
        "and then ends"
    );
    // One each now: a is refused too.
    let more = open_listen(&gw, "tok-a", json!("a3"), json!({"toolsListChanged": true})).await;
    assert_eq!(more.status().as_u16(), 503);
    gw.stop().await;
}

/// A GET stream of tok-a's legacy session `sid`.
async fn get_stream(gw: &Gateway, sid: &str) -> reqwest::Response {
    let get = gw
        .http
        .get(gw.url())
        .bearer_auth("tok-a")
        .header("accept", "text/event-stream")
        .header("mcp-session-id", sid)
        .send()
        .await
        .expect("get");
    assert_eq!(get.status().as_u16(), 200);
    get
}

/// Whether `stream` ends cleanly within 20 s, whatever comes on it first.
async fn ends(stream: &mut reqwest::Response) -> bool {
    let end = async {
        loop {
            match stream.chunk().await {
                Ok(Some(_)) => continue,
                Ok(None) => return true,
                Err(_) => return false,
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), end)
        .await
        .unwrap_or(false)
}

// A GET stream that replaces one of its session's (the fifth) takes the replaced
// stream's place: it takes none from another principal, even from one holding more.
#[tokio::test]
async fn a_stream_that_replaces_its_sessions_oldest_takes_that_ones_place() {
    let setup = Setup::new("max_streams = 10", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let mut b = Vec::new();
    for n in 0..6 {
        b.push(subscribed(&gw, "tok-b", &format!("b{n}")).await.0);
    }
    let sid = legacy_session(&gw).await;
    let mut gets = Vec::new();
    for _ in 0..4 {
        gets.push(get_stream(&gw, &sid).await);
    }
    // Full (b six, a four): a's fifth on the session replaces its first, which ends.
    let _fifth = get_stream(&gw, &sid).await;
    assert!(ends(&mut gets[0]).await, "the replaced stream ends");
    // b's oldest subscription goes on: nothing comes on it (no final result).
    let mut heard = String::new();
    let quiet = tokio::time::timeout(Duration::from_secs(1), b[0].chunk()).await;
    if let Ok(Ok(Some(chunk))) = &quiet {
        heard.push_str(&String::from_utf8_lossy(chunk));
    }
    assert!(quiet.is_err(), "b's oldest subscription was ended: {heard}");
    gw.stop().await;
}

// A client that sends requests and never reads what comes back is cut off once the
// gateway's writes have made no progress for `write_timeout`: it does not hold its
// connection (and the calls on it) for as long as TCP acknowledges. Others are served.
#[tokio::test]
async fn a_connection_that_never_reads_is_closed_after_the_write_timeout() {
    use tokio::io::AsyncWriteExt;
    let setup = Setup::new(r#"write_timeout = "1s""#, &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let authority = gw.authority();
    // Small buffers on the client's side, so that the gateway's writes stall soon.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("rcvbuf");
    socket.set_send_buffer_size(4096).expect("sndbuf");
    let stream = socket
        .connect(authority.parse().expect("address"))
        .await
        .expect("connect");
    let (_unread, mut write) = stream.into_split();
    // Pipelined calls whose answers (1 MB each) are far more than the kernel buffers.
    let body = request(
        "tools/call",
        json!({"name": "alpha__echo", "arguments": {"text": "x".repeat(1 << 20)}}),
    )
    .to_string();
    let one = format!(
        "POST /mcp HTTP/1.1\r\nhost: {authority}\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream\r\nmcp-protocol-version: {MODERN}\r\n\
         mcp-method: tools/call\r\nmcp-name: alpha__echo\r\nauthorization: Bearer tok-a\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    // The writes block once the gateway stops reading; they end when it closes.
    let writer = tokio::spawn(async move {
        for _ in 0..64 {
            write.write_all(one.as_bytes()).await?;
        }
        Ok::<_, std::io::Error>(())
    });
    let (status, list) = gw.modern("tok-b", "tools/list", json!({})).await;
    assert_eq!(status, 200, "others are served: {list}");
    let ended = tokio::time::timeout(Duration::from_secs(60), writer)
        .await
        .expect("the gateway closes a connection that does not read within a minute")
        .expect("writer task");
    assert!(
        ended.is_err(),
        "the connection was closed under the client's writes, not served to the end"
    );
    let (status, list) = gw.modern("tok-a", "tools/list", json!({})).await;
    assert_eq!(status, 200, "{list}");
    gw.stop().await;
}

// A stdio client that stops reading while a server floods progress: the gateway keeps
// at most 4 MiB of notifications for it and drops the rest (the queue grew without
// bound), and the call's answer still arrives once the client reads again.
#[tokio::test]
async fn a_stdio_client_that_stops_reading_loses_progress_past_4_mib_not_its_answer() {
    // 3,000 updates of 4 KiB, paced so that the harness's own progress path (which
    // drops what its caller cannot take at once) keeps up: 12 MiB, three times the budget.
    const STEPS: u64 = 3_000;
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let (mut child, mut stdin, mut lines) = stdio_gateway(&setup);
    let mut call = request(
        "tools/call",
        json!({"name": "alpha__progress", "arguments": {"steps": STEPS, "message_bytes": 4096, "pause_every": 8}}),
    );
    call["params"]["_meta"]["progressToken"] = json!("flood");
    send_line(&mut stdin, &call).await;
    // Not read until the call is over (its `finished` record is written).
    assert!(
        eventually(Duration::from_secs(120), || setup.audit_counts().1 >= 1).await,
        "the call finishes while its client is not reading"
    );
    let (mut progress, mut bytes, mut answer) = (0u64, 0usize, None);
    while answer.is_none() {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the answer comes")
            .expect("read")
            .expect("a line before the end");
        let message: Value = serde_json::from_str(&line).expect("JSON");
        if message["method"] == "notifications/progress" {
            assert_eq!(message["params"]["progressToken"], "flood", "{message}");
            progress += 1;
            bytes += line.len() + 1;
        } else {
            answer = Some(message);
        }
    }
    let answer = answer.unwrap_or_default();
    assert_eq!(
        result_text(&answer),
        format!("{STEPS} steps done"),
        "{answer}"
    );
    assert!(progress > 0, "notifications up to the budget go out");
    // 4 MiB queued, plus what the pipe and the writer's one burst (1 MiB) held.
    assert!(
        progress < STEPS && bytes < 6 << 20,
        "{progress} notifications, {bytes} bytes: past 4 MiB unread they are dropped"
    );
    drop(stdin);
    let _ = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
}

// A stdio client that stops reading past 16 MiB of answers, then closes its input
// and waits for the gateway to exit: the gateway sees the input end while it waits for
// the client to read, and exits after its write timeout. Before, it waited for room
// alone, and ran until a signal.
#[tokio::test]
async fn a_stdio_client_that_closes_its_input_while_its_answers_wait_unread_is_let_go() {
    const CALLS: u64 = 17;
    let setup = Setup::new("write_timeout = \"1s\"", &[("k1", &key("k1"))]);
    let (mut child, mut stdin, _lines) = stdio_gateway(&setup);
    // 17 answers of a KiB less than 1 MiB: the 17th line is read with 16 unread
    // answers (under 16 MiB even with nothing taken by the pipe yet, as on a loaded
    // machine), and the answers then wait past it; one more line is read after them,
    // and the gateway waits for room before the next.
    let text = "x".repeat((1 << 20) - 1024);
    for id in 1..=CALLS {
        let mut call = request(
            "tools/call",
            json!({"name": "alpha__echo", "arguments": {"text": text}}),
        );
        call["id"] = json!(id);
        send_line(&mut stdin, &call).await;
    }
    assert!(
        eventually(Duration::from_secs(120), || setup.audit_counts().1
            >= CALLS as usize)
        .await,
        "the calls finish while their client is not reading"
    );
    // Their answers queued after their records.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut list = request("tools/list", json!({}));
    list["id"] = json!("last");
    send_line(&mut stdin, &list).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(stdin);
    let exited = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
    assert!(
        exited.is_ok(),
        "the gateway still runs, its client's input closed"
    );
}

// A stdio client that closes its output (its reader gone) while its calls run: the
// first answer the gateway cannot write ends the session, and the calls still in
// flight are cancelled (audited so), as a closed HTTP connection's are; the process
// exits, its input still open. Before, the gateway read on and ran what came.
#[tokio::test]
async fn a_stdio_client_that_closes_its_output_has_its_calls_cancelled() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let (mut child, mut stdin, lines) = stdio_gateway(&setup);
    for (id, ms) in [(1, 300), (2, 60_000)] {
        let mut call = request(
            "tools/call",
            json!({"name": "alpha__slow", "arguments": {"text": "t", "ms": ms}}),
        );
        call["id"] = json!(id);
        send_line(&mut stdin, &call).await;
    }
    assert!(
        eventually(Duration::from_secs(30), || setup.audit_counts().0 >= 2).await,
        "both calls run"
    );
    drop(lines);
    // One more answer to write, whether or not the first was written before the
    // output closed (a pipe holds it).
    let mut list = request("tools/list", json!({}));
    list["id"] = json!(3);
    {
        use tokio::io::AsyncWriteExt;
        // The gateway may have ended already: its input is then closed too.
        let _ = stdin.write_all(format!("{list}\n").as_bytes()).await;
    }
    let exited = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
    assert!(
        exited.is_ok(),
        "the gateway still runs, its client's output closed"
    );
    let text = std::fs::read_to_string(&setup.audit).unwrap_or_default();
    assert!(
        text.lines()
            .any(|l| l.contains("\"finished\"") && l.contains("cancelled")),
        "the call in flight is audited as cancelled: {text}"
    );
    drop(stdin);
}

// A tool list change that comes while a stdio client is not reading (past 4 MiB
// queued for it) is owed, not dropped like progress: once the client reads, its
// subscription hears of it. Before, its list stayed stale until the next change.
#[tokio::test]
async fn a_list_change_while_a_stdio_client_is_not_reading_reaches_it_once_it_reads() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let (mut child, mut stdin, mut lines) = stdio_gateway(&setup);
    let mut listen = request(
        "subscriptions/listen",
        json!({"notifications": {"toolsListChanged": true}}),
    );
    listen["id"] = json!("sub");
    send_line(&mut stdin, &listen).await;
    let ack = next_message(&mut lines).await;
    assert!(ack.to_string().contains("acknowledged"), "{ack}");
    // 12 MiB of progress, not read: past 4 MiB queued, notifications are dropped.
    let mut flood = request(
        "tools/call",
        json!({"name": "alpha__progress", "arguments": {"steps": 3000, "message_bytes": 4096, "pause_every": 8}}),
    );
    flood["id"] = json!(2);
    flood["params"]["_meta"]["progressToken"] = json!("flood");
    send_line(&mut stdin, &flood).await;
    assert!(
        eventually(Duration::from_secs(120), || setup.audit_counts().1 >= 1).await,
        "the flood ends while its client is not reading"
    );
    // The list changes now.
    let mut grow = request(
        "tools/call",
        json!({"name": "alpha__grow", "arguments": {}}),
    );
    grow["id"] = json!(3);
    send_line(&mut stdin, &grow).await;
    assert!(
        eventually(Duration::from_secs(30), || setup.audit_counts().1 >= 2).await,
        "grow ran"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Read on: the change comes, after the answers.
    let heard = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let message = next_message(&mut lines).await;
            if message["method"] == "notifications/tools/list_changed" {
                return message;
            }
        }
    })
    .await
    .expect("the change reaches the client once it reads");
    assert_eq!(
        heard["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "sub",
        "{heard}"
    );
    drop(stdin);
    let _ = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
}

// A stdio client's cancellation of a request that has not reached an upstream call yet
// (a listing that waits on a slow server) ends it at once: its principal's place is
// free for the next request, not held until the listing finishes.
#[tokio::test]
async fn a_stdio_clients_cancel_frees_its_place_before_any_upstream_call() {
    let setup = Setup::new("max_in_flight_per_principal = 1", &[("k1", &key("k1"))]);
    let text = std::fs::read_to_string(&setup.config).expect("config");
    let slow = text.replacen(
        &format!("\"alpha{}\"]", setup.tag),
        &format!("\"alpha{}\", \"--list-delay-ms\", \"60000\"]", setup.tag),
        1,
    );
    assert_ne!(slow, text);
    std::fs::write(&setup.config, slow).expect("config");
    let (mut child, mut stdin, mut lines) = stdio_gateway(&setup);
    let list = request("tools/list", json!({}));
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 1, "reason": "no longer needed"}});
    let mut call = request(
        "tools/call",
        json!({"name": "beta__echo", "arguments": {"text": "now"}}),
    );
    call["id"] = json!(2);
    let started = std::time::Instant::now();
    for message in [&list, &cancel] {
        send_line(&mut stdin, message).await;
    }
    // Once the cancellation is taken the place is free; until then the call may be
    // refused as over the limit, and is asked again.
    let answer = loop {
        send_line(&mut stdin, &call).await;
        let answer = loop {
            let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
                .await
                .expect("an answer")
                .expect("read")
                .expect("a line");
            let message: Value = serde_json::from_str(&line).expect("JSON");
            // A cancelled request is not answered.
            assert_ne!(message["id"], 1, "{message}");
            if message["id"] == 2 {
                break message;
            }
        };
        if answer["error"]["code"] != -32000 || started.elapsed() > Duration::from_secs(20) {
            break answer;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(result_text(&answer), "now", "{answer}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "held until the listing ended"
    );
    // Nor later, up to the session's end.
    drop(stdin);
    while let Ok(Ok(Some(line))) =
        tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await
    {
        let message: Value = serde_json::from_str(&line).expect("JSON");
        assert_ne!(message["id"], 1, "{message}");
    }
    let _ = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
}

// A stdio client that closes its input and then reads its last answers slowly, but
// steadily, gets them all: the session's end waits while the gateway writes, a piece at
// a time. Before, a burst of over a megabyte had to be written whole within
// `write_timeout`, and the session ended part-way through it.
#[tokio::test]
async fn a_stdio_client_reading_its_last_answers_slowly_gets_them_all() {
    use tokio::io::AsyncReadExt;
    let setup = Setup::new("write_timeout = \"1s\"", &[("k1", &key("k1"))]);
    let (mut child, mut stdin, lines) = stdio_gateway(&setup);
    // Read in pieces of its own size, not by lines.
    let mut stdout = lines.into_inner();
    let text = "x".repeat(600 * 1024);
    for id in 1..=3 {
        let mut call = request(
            "tools/call",
            json!({"name": "alpha__echo", "arguments": {"text": text}}),
        );
        call["id"] = json!(id);
        send_line(&mut stdin, &call).await;
    }
    drop(stdin);
    // Until every call is answered (its record written), nothing is read.
    assert!(
        eventually(Duration::from_secs(60), || setup.audit_counts().1 >= 3).await,
        "the calls finish"
    );
    // Then 64 KiB every 300 ms: about 1.8 MB in some 9 s, each piece well within the
    // second, the whole far past it.
    let mut got = Vec::new();
    let mut piece = vec![0u8; 64 << 10];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(30), stdout.read(&mut piece))
            .await
            .expect("read")
            .expect("read");
        if n == 0 {
            break;
        }
        got.extend_from_slice(&piece[..n]);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let answered = got
        .split(|b| *b == b'\n')
        .filter_map(|l| serde_json::from_slice::<Value>(l).ok())
        .filter(|m| m["result"].is_object())
        .count();
    assert_eq!(answered, 3, "{} bytes read", got.len());
    let _ = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
}

// At shutdown a legacy session's call in flight is given the grace, as every other
// call: it finishes and its answer is written.
#[tokio::test]
async fn a_legacy_sessions_call_finishes_within_the_grace_at_shutdown() {
    let setup = Setup::new("", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    let sid = legacy_session(&gw).await;
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "beta__slow", "arguments": {"ms": 4000, "text": "done"}}});
    let running = {
        let (http, url, sid) = (gw.http.clone(), gw.url().to_string(), sid.clone());
        tokio::spawn(async move {
            let resp = http
                .post(url)
                .bearer_auth("tok-a")
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("mcp-protocol-version", "2025-11-25")
                .header("mcp-session-id", sid)
                .body(call.to_string())
                .send()
                .await
                .expect("send");
            resp.text().await.unwrap_or_default()
        })
    };
    // Under way on the server (4 s, within the 5 s grace), then SIGTERM.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let stopping = tokio::spawn(gw.stop());
    let answer = running.await.expect("join");
    assert!(answer.contains("\"text\":\"done\""), "{answer}");
    assert!(stopping.await.expect("stop").success());
}

// A large result is charged to its principal until its client has taken it: a client
// that does not read (or reads a few bytes at a time, which the write timeout never
// ends) held a result per connection, outside every budget, and made more. Past its
// budget (4 × max_body_bytes) the principal's new requests are 503 until it reads;
// another principal is not held back.
#[tokio::test]
async fn large_results_not_read_hold_back_their_principal_alone() {
    // An 8 MiB result, more than loopback's buffers take.
    let call = request(
        "tools/call",
        json!({"name": "alpha__echo", "arguments": {"text": "x".repeat(1024), "times": 8192}}),
    );
    large_result_not_read_holds_back(call, "alpha__echo", "application/json").await;
}

// The same of a result that ends an event stream (progress came before it).
#[tokio::test]
async fn large_results_at_the_end_of_an_event_stream_are_held_to_the_budget_too() {
    let mut call = request(
        "tools/call",
        json!({"name": "alpha__progress", "arguments": {"steps": 1, "answer_bytes": 8 << 20}}),
    );
    call["params"]["_meta"]["progressToken"] = json!("p");
    large_result_not_read_holds_back(call, "alpha__progress", "text/event-stream").await;
}

async fn large_result_not_read_holds_back(call: Value, tool: &str, answered_as: &str) {
    use tokio::io::AsyncWriteExt;
    let setup = Setup::new("max_body_bytes = 65536", &[("k1", &key("k1"))]);
    let gw = setup.start().await;
    // Read, it comes as `answered_as`, whole.
    let (status, said, headers) = gw.post(Some("tok-a"), &call, &[]).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], answered_as);
    assert!(said.to_string().len() > 8 << 20);
    let addr = gw
        .url()
        .trim_start_matches("http://")
        .split('/')
        .next()
        .expect("host:port")
        .to_string();
    // Asked for and never read.
    let body = call.to_string();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer tok-a\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMCP-Protocol-Version: {MODERN}\r\nMcp-Method: tools/call\r\nMcp-Name: {tool}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut unread = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    unread
        .write_all(format!("{head}{body}").as_bytes())
        .await
        .expect("write");
    let list = request("tools/list", json!({}));
    // An id of any length would make a large answer of every refusal.
    let mut long_id = list.clone();
    long_id["id"] = json!("i".repeat(2000));
    let (status, said, _) = gw.post(Some("tok-a"), &long_id, &[]).await;
    assert_eq!((status, &said["id"]), (400, &Value::Null), "{said}");
    let status_of = |token: &'static str| {
        let (gw, list) = (&gw, &list);
        async move { gw.post(Some(token), list, &[]).await.0 }
    };
    // Whether tok-a's requests come to be answered `want` within ten seconds.
    let comes_to = |want: u16| async move {
        for _ in 0..200 {
            if status_of("tok-a").await == want {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    };
    assert!(
        comes_to(503).await,
        "the principal with a result unread is held back"
    );
    let (status, said, headers) = gw.post(Some("tok-a"), &list, &[]).await;
    assert_eq!(status, 503);
    assert!(
        said["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("not yet read")),
        "{said}"
    );
    assert_eq!(
        headers.get("retry-after").and_then(|v| v.to_str().ok()),
        Some("1")
    );
    assert_eq!(status_of("tok-b").await, 200, "another principal is not");
    // Gone unread: the charge goes with it.
    drop(unread);
    assert!(
        comes_to(200).await,
        "served again once the result was dropped"
    );
    gw.stop().await;
}

// A bare name served `conditional`ly (one server offered it in the caller's listing) is
// called on that server: when another the caller may use offers it too (a grant added
// by a reload, a server that could not be listed then), the call is refused, to be
// listed again, not routed by priority to the other one.
#[tokio::test]
async fn a_conditional_bare_name_goes_to_the_server_it_was_served_for_or_nowhere() {
    let setup = Setup::new("prefix = \"conditional\"", &[("k1", &key("k1"))]);
    let text = std::fs::read_to_string(&setup.config).expect("config");
    let beta_only = text.replacen(
        "[permissions.b]\nalpha = [\"echo\"]",
        "[permissions.b]\nbeta = [\"server_name\"]",
        1,
    );
    assert_ne!(beta_only, text);
    std::fs::write(&setup.config, &beta_only).expect("config");
    let gw = setup.start().await;
    let (_, listed) = gw.modern("tok-b", "tools/list", json!({})).await;
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .map(|t| t.iter().filter_map(|t| t["name"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(names, ["server_name"], "{listed}");
    let call = || {
        gw.modern(
            "tok-b",
            "tools/call",
            json!({"name": "server_name", "arguments": {}}),
        )
    };
    let (_, r) = call().await;
    assert_eq!(
        r["result"]["content"][0]["text"],
        format!("beta{}", setup.tag),
        "{r}"
    );
    // Alpha (of higher priority) now offers it to b too.
    let both = beta_only.replacen(
        "beta = [\"server_name\"]",
        "beta = [\"server_name\"]\nalpha = [\"server_name\"]",
        1,
    );
    gw.reload_with(&setup, &both);
    let mut refused = Value::Null;
    for _ in 0..200 {
        let (_, r) = call().await;
        let text = r["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default();
        assert!(!text.starts_with("alpha"), "routed to another server: {r}");
        if r.get("error").is_some() {
            refused = r;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("list again")),
        "{refused}"
    );
    // Listed again, each is named by its server.
    let (_, listed) = gw.modern("tok-b", "tools/list", json!({})).await;
    let mut names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .map(|t| t.iter().filter_map(|t| t["name"].as_str()).collect())
        .unwrap_or_default();
    names.sort();
    assert_eq!(names, ["alpha__server_name", "beta__server_name"]);
    gw.stop().await;
}
