//! Sign-in for remote servers, end to end over loopback HTTPS with a CA made here: an
//! authorization server of our own (`mcp-harness demo-auth-server`, approving without a
//! person as the user the `X-Demo-User` header names) and the demo server as the
//! protected MCP server (`--oauth-issuer`), each recording what it received. The
//! harness signs in through `HeadlessAuthorizer`, which requests the authorization URL
//! itself, as an automated run would.

mod support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use mcp_harness::registry::HarnessEvent;
use mcp_harness::transport::TransportError;
use mcp_harness::transport::auth::{
    AuthError, AuthFailure, AuthStep, HeadlessAuthorizer, OAuthConfig,
};
use mcp_harness::{
    CallError, CallKind, CallOptions, Caller, Harness, HarnessConfig, HarnessHandle, ServerConfig,
    ServerError, ServerState, TransportSpec,
};
use serde_json::{Value, json};
use support::*;

const SECRET: &str = "demo-signing-secret";

/// An authorization server, a protected MCP server, and what each recorded.
struct World {
    ca: TestCa,
    auth: HttpServer,
    mcp: HttpServer,
    auth_record: PathBuf,
    mcp_record: PathBuf,
}

impl World {
    /// A world whose pre-registered client's tokens live `ttl_s` seconds, and whose
    /// refreshes are answered `delay_ms` late (their refresh token rotated at once).
    async fn refreshing(ttl_s: u64, delay_ms: u64) -> World {
        let (ttl, delay) = (ttl_s.to_string(), delay_ms.to_string());
        World::new(
            &[
                "--client",
                "pre",
                "--token-ttl",
                &ttl,
                "--refresh-delay-ms",
                &delay,
            ],
            &[],
        )
        .await
    }

    async fn new(auth_args: &[&str], mcp_args: &[&str]) -> World {
        // Tests run in parallel in one process: a CA directory of its own each.
        static WORLDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = WORLDS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let ca = TestCa::new(&format!("oauth-{n}"));
        let (cert, key) = ca.leaf("loopback", &["127.0.0.1", "localhost"]);
        let (auth_record, mcp_record) = (temp_file("as-record"), temp_file("rs-record"));
        let (c, k, ar) = (
            cert.to_string_lossy().to_string(),
            key.to_string_lossy().to_string(),
            auth_record.to_string_lossy().to_string(),
        );
        let ca_pem = ca.ca_pem.to_string_lossy().to_string();
        let mut args = vec![
            "demo-auth-server",
            "--tls-cert",
            &c,
            "--tls-key",
            &k,
            "--secret",
            SECRET,
            "--record",
            &ar,
            "--ca-file",
            &ca_pem,
        ];
        args.extend_from_slice(auth_args);
        let auth = HttpServer::start(&harness_exe(), &args).await;
        let rr = mcp_record.to_string_lossy().to_string();
        let mut args = vec![
            "web",
            "--oauth-issuer",
            &auth.url,
            "--oauth-secret",
            SECRET,
            "--record",
            &rr,
        ];
        args.extend_from_slice(mcp_args);
        let mcp = HttpServer::demo_tls(&args, &cert, &key).await;
        World {
            ca,
            auth,
            mcp,
            auth_record,
            mcp_record,
        }
    }

    fn server(&self, auth: OAuthConfig) -> ServerConfig {
        self.server_named("web", auth)
    }

    /// [`registered`], pinned to this world's authorization server (as a client secret
    /// must be).
    fn confidential(&self, pre: &str) -> OAuthConfig {
        OAuthConfig {
            issuer: Some(self.auth.url.clone()),
            ..registered(pre)
        }
    }

    /// The protected server as `id` (several ids may name it).
    fn server_named(&self, id: &str, auth: OAuthConfig) -> ServerConfig {
        let mut s = ServerConfig::http(id, &self.mcp.url);
        if let TransportSpec::Http(h) = &mut s.transport {
            h.ca_file = Some(self.ca.ca_pem.clone());
            h.auth = auth;
        }
        s
    }

    fn authorizer(&self) -> Arc<HeadlessAuthorizer> {
        Arc::new(
            HeadlessAuthorizer::new(Some(&self.ca.ca_pem))
                .expect("authorizer")
                .with_identity_header("x-demo-user"),
        )
    }

    async fn harness(&self, auth: OAuthConfig) -> HarnessHandle {
        self.harness_with(vec![self.server(auth)]).await
    }

    /// A harness of the protected server signing in with `auth`, keeping its tokens in
    /// `store`.
    async fn storing(
        &self,
        auth: OAuthConfig,
        store: Arc<dyn mcp_harness::transport::auth::TokenStore>,
    ) -> HarnessHandle {
        self.builder(vec![self.server(auth)])
            .token_store(store)
            .spawn()
            .await
            .expect("spawn")
    }

    async fn harness_with(&self, servers: Vec<ServerConfig>) -> HarnessHandle {
        self.builder(servers).spawn().await.expect("spawn")
    }

    /// A harness of `servers`, agent a granted all, signing in with the headless
    /// authorizer.
    fn builder(&self, servers: Vec<ServerConfig>) -> mcp_harness::HarnessBuilder {
        let config = HarnessConfig {
            servers,
            permissions: grant_everything(&["a"]),
            ..HarnessConfig::default()
        };
        Harness::builder(config).authorizer(self.authorizer())
    }

    /// How many refreshes the authorization server was asked for.
    fn refreshes(&self) -> usize {
        self.at("token")
            .iter()
            .filter(|t| t["grant_type"] == "refresh_token")
            .count()
    }

    /// The authorization server's records of `endpoint` (`authorize`, `token`, …).
    /// The event streams the server was asked for (GETs; the metadata's name a path).
    fn event_streams(&self) -> Vec<Value> {
        recorded(&self.mcp_record)
            .into_iter()
            .filter(|r| r["method"] == "GET" && r.get("path").is_none())
            .collect()
    }

    fn at(&self, endpoint: &str) -> Vec<Value> {
        recorded(&self.auth_record)
            .into_iter()
            .filter(|r| r["endpoint"] == endpoint)
            .collect()
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.auth_record);
        let _ = std::fs::remove_file(&self.mcp_record);
    }
}

fn as_user(who: &str) -> Caller {
    Caller::agent("a").with_auth_context(who)
}

/// The subject the protected server saw, from `whoami`.
async fn subject(h: &HarnessHandle, caller: &Caller) -> Result<String, CallError> {
    let r = h.call_tool(caller, "web__whoami", json!({})).await?;
    Ok(r["structuredContent"]["headers"]["x-demo-subject"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

/// The sign-in error inside a call's error, if that is what it is.
fn auth_error(e: &CallError) -> Option<&AuthError> {
    match e {
        CallError::Server(ServerError::Transport {
            source: TransportError::Auth(a),
            ..
        }) => Some(a),
        _ => None,
    }
}

/// Whether a call ended at its deadline (the call's, or its request's).
fn timed_out(e: &CallError) -> bool {
    matches!(
        e,
        CallError::DeadlineExceeded(_)
            | CallError::Server(ServerError::Transport {
                source: TransportError::Timeout(_),
                ..
            })
    )
}

async fn ready(h: &HarnessHandle) {
    assert!(
        wait_state(h, "web", ServerState::Ready).await,
        "{:?}",
        h.server_status("web").and_then(|s| s.last_error)
    );
}

/// A first process signs in as the harness itself (`demo-user`) and stops: one
/// authorization in all.
async fn signs_in_and_stops(w: &World, first: HarnessHandle) {
    serves_and_stops(first).await;
    assert_eq!(w.at("authorize").len(), 1);
}

/// Once ready, `h` serves agent a as the demo user, and stops.
async fn serves_and_stops(h: HarnessHandle) {
    ready(&h).await;
    assert_eq!(
        subject(&h, &Caller::agent("a")).await.expect("call"),
        "demo-user"
    );
    h.shutdown().await;
}

fn registered(pre: &str) -> OAuthConfig {
    let (id, secret) = pre
        .split_once(':')
        .map_or((pre, None), |(i, s)| (i, Some(s)));
    OAuthConfig {
        client_id: Some(id.into()),
        client_secret: secret.map(String::from),
        ..OAuthConfig::default()
    }
}

// An authorization server that is a web app answers the well-known places it does not
// serve with its HTML page or a redirect to its login page, not 404: those are no
// metadata, and discovery goes on to the next place. Before, it stopped at the first.
#[tokio::test]
async fn discovery_goes_past_a_web_apps_pages_and_redirects_to_the_metadata() {
    for catch_all in ["html", "redirect"] {
        let w = World::new(
            &[
                "--client",
                "pre",
                "--metadata-at",
                "openid-appended",
                "--issuer-path",
                "/tenant1",
                "--catch-all",
                catch_all,
            ],
            &[],
        )
        .await;
        let h = w.harness(registered("pre")).await;
        ready(&h).await;
        assert_eq!(
            subject(&h, &Caller::agent("a")).await.expect("call"),
            "demo-user",
            "{catch_all}"
        );
        h.shutdown().await;
    }
}

#[tokio::test]
async fn each_discovery_variant_leads_to_a_token_and_the_server_checks_pkce_state_and_resource() {
    for (prm, metadata_at, issuer_path) in [
        ("header", "oauth", ""),
        ("path", "openid", "/tenant1"),
        ("root", "openid-appended", "/tenant1"),
    ] {
        let w = World::new(
            &[
                "--client",
                "pre",
                "--metadata-at",
                metadata_at,
                "--issuer-path",
                issuer_path,
            ],
            &["--oauth-prm", prm],
        )
        .await;
        let h = w.harness(registered("pre")).await;
        ready(&h).await;
        assert_eq!(
            subject(&h, &as_user("alice")).await.expect("call"),
            "alice",
            "{prm} {metadata_at}"
        );
        let authorize = w.at("authorize");
        assert_eq!(authorize.len(), 2, "the harness's own sign-in and alice's");
        for a in &authorize {
            assert_eq!(a["resource"], w.mcp.url.as_str(), "{a}");
            assert_eq!(a["code_challenge_method"], "S256");
            assert_eq!(a["state"], true);
        }
        for t in w.at("token") {
            assert_eq!(t["resource"], w.mcp.url.as_str(), "{t}");
            assert_eq!(t["code_verifier"], true);
        }
        h.shutdown().await;
    }
}

// The challenge may name resource metadata on another origin (RFC 9728 lets it): it is
// read there, and its `resource`, this server's URL, is what counts. Before, any other
// origin was refused and the sign-in never began.
#[tokio::test]
async fn resource_metadata_on_another_origin_is_read_and_its_resource_checked() {
    let w = World::new(
        &["--client", "pre"],
        &["--oauth-prm", "header", "--oauth-prm-host", "localhost"],
    )
    .await;
    let h = w.harness(registered("pre")).await;
    ready(&h).await;
    assert_eq!(subject(&h, &as_user("alice")).await.expect("call"), "alice");
    let asked = recorded(&w.mcp_record)
        .into_iter()
        .filter(|r| r["method"] == "GET" && r["path"].is_string())
        .any(|r| {
            r["headers"]["host"]
                .as_str()
                .is_some_and(|h| h.starts_with("localhost:"))
        });
    assert!(asked, "the metadata was read on the other origin");
    h.shutdown().await;
}

#[tokio::test]
async fn a_pre_registered_client_a_metadata_document_and_registration_each_sign_in() {
    // Pre-registered, confidential.
    let w = World::new(&["--client", "pre:s3cret"], &[]).await;
    let h = w.harness(w.confidential("pre:s3cret")).await;
    ready(&h).await;
    assert!(w.at("authorize").iter().all(|a| a["client_id"] == "pre"));
    assert!(
        w.at("token")
            .iter()
            .all(|t| t["client_auth"] == "client_secret_basic")
    );
    h.shutdown().await;
    drop(w);

    // A Client ID Metadata Document, hosted by the authorization server for the test.
    let doc = temp_file("cimd");
    let w = World::new(&["--cimd", "--host-document", &doc.to_string_lossy()], &[]).await;
    let url = format!("{}/client-metadata.json", w.auth.url);
    std::fs::write(
        &doc,
        json!({"client_id": url, "client_name": "mcp-harness tests",
               "redirect_uris": ["http://127.0.0.1:1/callback"], "token_endpoint_auth_method": "none"})
        .to_string(),
    )
    .expect("doc");
    let h = w
        .harness(OAuthConfig {
            client_metadata_url: Some(url.clone()),
            ..OAuthConfig::default()
        })
        .await;
    ready(&h).await;
    assert!(
        w.at("authorize")
            .iter()
            .all(|a| a["client_id"] == url.as_str())
    );
    assert!(w.at("token").iter().all(|t| t["client_auth"] == "none"));
    h.shutdown().await;
    drop(w);
    let _ = std::fs::remove_file(doc);

    // Dynamic Client Registration, the fallback.
    let w = World::new(&["--registration"], &[]).await;
    let h = w.harness(OAuthConfig::default()).await;
    ready(&h).await;
    let reg = w.at("register");
    assert_eq!(reg.len(), 1);
    assert_eq!(reg[0]["application_type"], "native");
    assert!(w.at("authorize").iter().all(|a| {
        a["client_id"]
            .as_str()
            .is_some_and(|c| c.starts_with("dyn-"))
    }));
    h.shutdown().await;

    // Nothing to identify with.
    let w = World::new(&[], &[]).await;
    let h = w.harness(OAuthConfig::default()).await;
    assert!(wait_state(&h, "web", ServerState::Failed).await);
    let why = h
        .server_status("web")
        .and_then(|s| s.last_error)
        .unwrap_or_default();
    assert!(why.contains("no client identity"), "{why}");
    h.shutdown().await;
}

#[tokio::test]
async fn one_registration_serves_every_server_and_connection_and_outlives_a_cancelled_call() {
    // Registrations are answered 1.5 s late, their client already made; `echo` needs
    // a scope the first sign-in did not ask for (a step-up, a registration of its own).
    let w = World::new(
        &["--registration", "--register-delay-ms", "1500"],
        &["--oauth-tool-scope", "echo=mcp:write"],
    )
    .await;
    let servers = vec![
        w.server(OAuthConfig::default()),
        w.server_named("web2", OAuthConfig::default()),
    ];
    let h = w.harness_with(servers).await;
    ready(&h).await;
    assert!(wait_state(&h, "web2", ServerState::Ready).await);
    // Two servers on one authorization server, signing in at once: one client.
    assert_eq!(w.at("register").len(), 1, "{:?}", w.at("register"));
    let a = Caller::agent("a");
    // The step-up's call is cancelled while its registration's reply is on its way,
    // the authorization server's client made already.
    let call = tokio::spawn({
        let (h, a) = (h.clone(), a.clone());
        async move { h.call_tool(&a, "web__echo", json!({"text": "x"})).await }
    });
    assert!(
        eventually(Duration::from_secs(10), || w.at("register").len() == 2).await,
        "the step-up registers a client for its scopes"
    );
    call.abort();
    assert!(call.await.is_err_and(|e| e.is_cancelled()));
    tokio::time::sleep(Duration::from_millis(1500)).await; // its reply lands (deliberate)
    // The client it made is the one the next step-up uses, on this server or another,
    // and after a restart (a new connection).
    let echo = |server: &str| format!("{server}__echo");
    h.call_tool(&a, &echo("web"), json!({"text": "x"}))
        .await
        .expect("stepped up");
    h.restart_server("web2").await.expect("restart");
    assert!(wait_state(&h, "web2", ServerState::Ready).await);
    h.call_tool(&as_user("alice"), &echo("web2"), json!({"text": "x"}))
        .await
        .expect("alice signed in and stepped up");
    assert_eq!(w.at("register").len(), 2, "{:?}", w.at("register"));
    let ids: std::collections::BTreeSet<_> = w
        .at("authorize")
        .iter()
        .filter_map(|a| a["client_id"].as_str().map(String::from))
        .collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    h.shutdown().await;
}

#[tokio::test]
async fn two_calls_refused_for_scope_at_once_step_up_once() {
    // `echo` needs a scope the first sign-in did not ask for; a step-up registers a new
    // client, which takes 500 ms.
    let w = World::new(
        &["--registration", "--register-delay-ms", "500"],
        &["--oauth-tool-scope", "echo=mcp:write"],
    )
    .await;
    let h = w.harness(OAuthConfig::default()).await;
    ready(&h).await;
    let a = Caller::agent("a");
    let echo = |text: &'static str| {
        let (h, a) = (h.clone(), a.clone());
        async move { h.call_tool(&a, "web__echo", json!({ "text": text })).await }
    };
    let (first, second) = tokio::join!(echo("one"), echo("two"));
    first.expect("first");
    second.expect("second");
    // The second waited for the first's step-up and took its token.
    assert_eq!(
        w.at("authorize").len(),
        2,
        "the first sign-in and one step-up: {:?}",
        w.at("authorize")
    );
    h.shutdown().await;
}

#[tokio::test]
async fn a_call_waits_for_a_sign_in_until_its_deadline_and_the_sign_in_goes_on_without_it() {
    // Registrations take 4 s, so a sign-in with a new client does; `echo` needs a
    // scope the first sign-in did not ask for (a step-up, a registration of its own).
    let w = World::new(
        &["--registration", "--register-delay-ms", "4000"],
        &["--oauth-tool-scope", "echo=mcp:write"],
    )
    .await;
    // The handshake waits for its sign-in whole, registration included.
    let h = w.harness(OAuthConfig::default()).await;
    ready(&h).await;
    let a = Caller::agent("a");
    let options = CallOptions {
        timeout: Some(Duration::from_millis(800)),
        ..CallOptions::default()
    };
    let started = std::time::Instant::now();
    let waited = h
        .call(
            &a,
            CallKind::Tool,
            "web__echo",
            json!({"text": "x"}),
            options,
        )
        .await;
    let took = started.elapsed();
    let Err(e) = waited else {
        panic!("answered before the step-up's sign-in could end: {waited:?}")
    };
    assert!(timed_out(&e), "{e:?}");
    assert!(
        took < Duration::from_millis(3500),
        "held past its deadline: {took:?}"
    );
    assert_eq!(
        h.server_status("web").map(|s| s.state),
        Some(ServerState::Ready)
    );
    // The sign-in went on: once it lands, the call is answered with no new one.
    assert!(
        eventually(Duration::from_secs(10), || w.at("token").len() == 2).await,
        "the step-up's code is exchanged: {:?}",
        w.at("token")
    );
    h.call_tool(&a, "web__echo", json!({"text": "x"}))
        .await
        .expect("stepped up");
    assert_eq!(
        w.at("authorize").len(),
        2,
        "the first sign-in and the step-up"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn the_time_a_request_waits_for_a_sign_in_counts_against_its_retry() {
    // The step-up's registration takes 1.5 s of the call's 2.5 s; the retry then finds
    // a slow tool: it gets what is left, not a deadline of its own.
    let w = World::new(
        &["--registration", "--register-delay-ms", "1500"],
        &["--oauth-tool-scope", "slow=mcp:write"],
    )
    .await;
    let h = w.harness(OAuthConfig::default()).await;
    ready(&h).await;
    let options = CallOptions {
        timeout: Some(Duration::from_millis(2500)),
        ..CallOptions::default()
    };
    let started = std::time::Instant::now();
    let e = h
        .call(
            &Caller::agent("a"),
            CallKind::Tool,
            "web__slow",
            json!({"ms": 10_000, "text": "late"}),
            options,
        )
        .await
        .expect_err("past its deadline");
    let took = started.elapsed();
    assert!(timed_out(&e), "{e:?}");
    assert_eq!(w.at("authorize").len(), 2, "the step-up signed in");
    assert!(took < Duration::from_millis(3400), "{took:?}");
    h.shutdown().await;
}

#[tokio::test]
async fn the_token_endpoint_sees_the_authentication_method_its_metadata_allows() {
    for (methods, client, expected) in [
        ("client_secret_basic", "pre:s3cret", "client_secret_basic"),
        ("client_secret_post", "pre:s3cret", "client_secret_post"),
        ("none", "pre", "none"),
    ] {
        let w = World::new(&["--client", client, "--auth-methods", methods], &[]).await;
        let h = w.harness(w.confidential(client)).await;
        ready(&h).await;
        let tokens = w.at("token");
        assert!(!tokens.is_empty());
        assert!(
            tokens.iter().all(|t| t["client_auth"] == expected),
            "{methods}: {tokens:?}"
        );
        h.shutdown().await;
    }
}

#[tokio::test]
async fn iss_on_the_redirect_back_is_checked_as_rfc_9207_says() {
    for (iss, works) in [
        ("sent", true),
        ("none", true),
        ("missing", false),
        ("wrong", false),
        // Another's, then the issuer's: which one a parser reads is not to be guessed.
        ("twice", false),
    ] {
        let w = World::new(&["--client", "pre", "--iss", iss], &[]).await;
        let h = w.harness(registered("pre")).await;
        if works {
            ready(&h).await;
            assert_eq!(w.at("token").len(), 1, "{iss}");
        } else {
            assert!(wait_state(&h, "web", ServerState::Failed).await, "{iss}");
            let why = h
                .server_status("web")
                .and_then(|s| s.last_error)
                .unwrap_or_default();
            assert!(why.contains("rejected the redirect back"), "{iss}: {why}");
            assert!(w.at("token").is_empty(), "{iss}: the code was never sent");
        }
        h.shutdown().await;
    }
}

#[tokio::test]
async fn metadata_that_lies_is_refused_before_any_authorization() {
    for (auth_args, mcp_args, expect) in [
        (
            &["--client", "pre", "--wrong-issuer"][..],
            &[][..],
            "issuer mismatch",
        ),
        (&["--client", "pre", "--no-pkce"][..], &[][..], "PKCE"),
        (
            &["--client", "pre", "--authorize-query", "state=known"][..],
            &[][..],
            "names `state`",
        ),
        (
            &["--client", "pre"][..],
            &["--oauth-resource", "https://127.0.0.1:1/elsewhere"][..],
            "not this server",
        ),
    ] {
        let w = World::new(auth_args, mcp_args).await;
        let h = w.harness(registered("pre")).await;
        assert!(wait_state(&h, "web", ServerState::Failed).await);
        let why = h
            .server_status("web")
            .and_then(|s| s.last_error)
            .unwrap_or_default();
        assert!(why.contains(expect), "{expect}: {why}");
        assert!(
            w.at("authorize").is_empty(),
            "{expect}: nobody was sent to sign in"
        );
        h.shutdown().await;
    }
}

#[tokio::test]
async fn scopes_come_from_the_challenge_else_the_metadata_and_a_step_up_asks_for_their_union() {
    // From the challenge (mcp:read), plus offline_access, which the server offers.
    let w = World::new(
        &["--client", "pre"],
        &["--oauth-tool-scope", "echo=mcp:write"],
    )
    .await;
    let h = w.harness(registered("pre")).await;
    ready(&h).await;
    assert_eq!(w.at("authorize")[0]["scope"], "mcp:read offline_access");
    // `echo` needs mcp:write: a 403, then a sign-in asking for both.
    let r = h
        .call_tool(&Caller::agent("a"), "web__echo", json!({"text": "up"}))
        .await
        .expect("stepped up");
    assert_eq!(text(&r), "up");
    let authorize = w.at("authorize");
    assert_eq!(authorize.len(), 2);
    let scopes: Vec<&str> = authorize[1]["scope"]
        .as_str()
        .unwrap_or("")
        .split(' ')
        .collect();
    assert!(
        scopes.contains(&"mcp:read") && scopes.contains(&"mcp:write"),
        "{scopes:?}"
    );
    h.shutdown().await;
    drop(w);

    // Without a scope in the challenge: the resource's scopes_supported.
    let w = World::new(&["--client", "pre"], &["--oauth-no-scope-hint"]).await;
    let h = w.harness(registered("pre")).await;
    ready(&h).await;
    assert_eq!(
        w.at("authorize")[0]["scope"],
        "mcp:read mcp:write offline_access"
    );
    h.shutdown().await;
    drop(w);

    // A scope the server never grants: the step-up gives up after its bound.
    let w = World::new(
        &["--client", "pre", "--deny-scope", "mcp:write"],
        &["--oauth-tool-scope", "echo=mcp:write"],
    )
    .await;
    let h = w.harness(registered("pre")).await;
    ready(&h).await;
    let e = h
        .call_tool(&Caller::agent("a"), "web__echo", json!({"text": "x"}))
        .await
        .expect_err("denied");
    let a = auth_error(&e).unwrap_or_else(|| panic!("{e:?}"));
    assert_eq!(a.step, AuthStep::StepUp);
    assert!(
        matches!(a.failure, AuthFailure::ScopeRetriesExhausted(2)),
        "{a}"
    );
    assert_eq!(
        w.at("authorize").len(),
        1 + 2,
        "the first sign-in and two step-ups"
    );
    // The next request's step-up would ask the same of it: the server's refusal stands,
    // no sign-in (before, two more each request).
    let e = h
        .call_tool(&Caller::agent("a"), "web__echo", json!({"text": "x"}))
        .await
        .expect_err("denied");
    assert!(
        matches!(
            &e,
            CallError::Server(ServerError::Transport {
                source: TransportError::Unauthorized { status: 403, .. },
                ..
            })
        ),
        "{e:?}"
    );
    assert_eq!(w.at("authorize").len(), 3, "no sign-in for a repeat");
    h.shutdown().await;
}

// A step-up the person declines is not asked again at the next call, and the scope
// it asked for is not asked for again either by a later sign-in: before, that sign-in
// asked for it, was refused, and the user could not sign in at all until a restart.
#[tokio::test]
async fn a_declined_step_up_is_not_asked_again_nor_carried_into_the_next_sign_in() {
    // Tokens live 3 s and are never refreshed (a full sign-in each time); `echo` needs
    // `mcp:write`, and an authorization that asks for it is declined.
    let w = World::new(
        &[
            "--client",
            "pre",
            "--deny-asking",
            "mcp:write",
            "--token-ttl",
            "3",
            "--refuse-refresh",
            "nonstandard",
        ],
        &["--oauth-tool-scope", "echo=mcp:write"],
    )
    .await;
    let h = w.harness(registered("pre")).await;
    ready(&h).await;
    let alice = as_user("alice");
    assert_eq!(subject(&h, &alice).await.expect("signed in"), "alice");
    // Sign-ins that ask for the scope declined (a token refreshed meanwhile, refused,
    // signs in again too: those are not counted).
    let step_ups = || {
        w.at("authorize")
            .iter()
            .filter(|a| {
                a["scope"]
                    .as_str()
                    .is_some_and(|s| s.split(' ').any(|s| s == "mcp:write"))
            })
            .count()
    };
    let echo = || h.call_tool(&alice, "web__echo", json!({"text": "x"}));
    let e = echo().await.expect_err("declined");
    let a = auth_error(&e).unwrap_or_else(|| panic!("{e:?}"));
    assert!(
        matches!(&a.failure, AuthFailure::Refused { error, .. } if error == "access_denied"),
        "{a}"
    );
    assert_eq!(step_ups(), 1, "the step-up asked");
    // The next call's refusal stands: no second prompt.
    echo().await.expect_err("still lacking the scope");
    assert_eq!(step_ups(), 1, "not asked again");
    // Once the token expires, alice signs in again for what she had.
    let signed_in = w.at("authorize").len();
    tokio::time::sleep(Duration::from_millis(3500)).await; // past its expiry (deliberate)
    assert_eq!(subject(&h, &alice).await.expect("signed in again"), "alice");
    let asked = w.at("authorize");
    assert!(asked.len() > signed_in, "signed in again");
    assert_eq!(step_ups(), 1, "without the scope declined");
    let last = asked.last().expect("a sign-in");
    assert!(
        last["scope"]
            .as_str()
            .is_some_and(|s| !s.split(' ').any(|s| s == "mcp:write")),
        "{last}"
    );
    h.shutdown().await;
}

// A server that holds each try for most of the request's deadline and refuses it: the
// tries share the one deadline (they had one each: two step-ups made three deadlines).
#[tokio::test]
async fn tries_that_a_server_holds_and_refuses_share_one_deadline() {
    let w = World::new(
        &["--client", "pre", "--deny-scope", "mcp:write"],
        &[
            "--oauth-tool-scope",
            "echo=mcp:write",
            "--oauth-refusal-delay-ms",
            "1500",
        ],
    )
    .await;
    let mut server = w.server(registered("pre"));
    server.timeout = Duration::from_secs(4);
    let h = w.harness_with(vec![server]).await;
    ready(&h).await;
    // Two tries of 1.5 s leave 1 s for the third, which the server holds for 1.5 s.
    let e = h
        .call_tool(&Caller::agent("a"), "web__echo", json!({"text": "x"}))
        .await
        .expect_err("refused");
    assert!(
        matches!(
            &e,
            CallError::Server(ServerError::Transport { source: TransportError::Timeout(t), .. })
                if *t == Duration::from_secs(4)
        ),
        "the deadline ends it before the step-ups run out: {e:?}"
    );
    assert_eq!(
        w.at("authorize").len(),
        1 + 2,
        "the first sign-in and a step-up after each of the two refused tries"
    );
    h.shutdown().await;
}

// A standalone event stream refused with a 401 (the server dropped its tokens) renews
// the token and is opened again, as a request's refusal is: before, one 401 gave the
// stream up for the rest of the session.
#[tokio::test]
async fn a_standalone_stream_refused_with_a_401_renews_the_token_and_opens_again() {
    let w = World::new(
        &["--client", "pre"],
        &["--era", "legacy", "--oauth-refuse-gets", "1"],
    )
    .await;
    let h = w.harness(registered("pre")).await;
    ready(&h).await;
    let gets = || w.event_streams();
    assert!(
        eventually(Duration::from_secs(20), || gets().len() >= 2).await,
        "opened again: {:?}",
        gets()
    );
    let gets = gets();
    assert_eq!(gets[0]["refused"], 401, "{gets:?}");
    assert!(gets[1].get("refused").is_none(), "{gets:?}");
    assert!(w.refreshes() >= 1, "renewed by a refresh");
    assert_eq!(w.at("authorize").len(), 1, "no new sign-in");
    h.shutdown().await;
}

// A subscription refused with a 401 (the server dropped its tokens) is sent again
// under a new id once the token is renewed, and the server tags its notifications with
// that id: they still reach the subscription. Before, they were dropped as naming no
// open subscription, and a tool added upstream went unseen until the list's TTL.
#[tokio::test]
async fn a_subscription_sent_again_after_a_401_still_hears_its_notifications() {
    let w = World::new(&["--client", "pre"], &["--oauth-refuse-listens", "1"]).await;
    let h = w.harness(registered("pre")).await;
    ready(&h).await;
    h.list_tools(&Caller::agent("a")).await.expect("list");
    let listens = || {
        recorded(&w.mcp_record)
            .into_iter()
            .filter(|r| {
                r["method"] == "subscriptions/listen"
                    || r["headers"]["mcp-method"] == "subscriptions/listen"
            })
            .collect::<Vec<_>>()
    };
    assert!(
        eventually(Duration::from_secs(20), || listens().len() >= 2).await,
        "sent again: {:?}",
        listens()
    );
    let listens = listens();
    assert_eq!(listens[0]["refused"], 401, "{listens:?}");
    assert_eq!(listens[1]["method"], "subscriptions/listen", "{listens:?}");
    let mut events = h.subscribe();
    h.call_tool(&Caller::agent("a"), "web__grow", json!({}))
        .await
        .expect("grow");
    let heard = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match events.recv().await {
                Ok(HarnessEvent::ToolsChanged { server, .. }) if &*server == "web" => return true,
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => return false,
            }
        }
    })
    .await;
    assert_eq!(heard, Ok(true), "the change reached the subscription");
    let names = h.list_tools(&Caller::agent("a")).await.expect("list");
    assert!(names.iter().any(|t| &*t.name == "grown_0"), "{names:?}");
    h.shutdown().await;
}

// A legacy session's standalone event stream is opened again long after the last
// request (the server ended it): with a token renewed first, not with none. Before,
// the reopening after the token expired went without one, was refused, and the stream
// was given up for good (the server's notifications lost).
#[tokio::test]
async fn the_standalone_stream_is_opened_again_with_a_renewed_token() {
    let w = World::new(
        &["--client", "pre", "--token-ttl", "2"],
        &["--era", "legacy", "--close-get-streams"],
    )
    .await;
    let h = w.harness(registered("pre")).await;
    ready(&h).await;
    // Ended at once each time, the stream is opened again 0.25, 0.5, 1, 2 s later...:
    // the fourth opening comes after the first token expired.
    let gets = || w.event_streams();
    let started = std::time::Instant::now();
    while gets().len() < 5 && started.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let gets = gets();
    assert!(gets.len() >= 5, "{gets:?}");
    assert!(
        gets.iter().all(|g| g.get("refused").is_none()),
        "every opening carried a valid token: {gets:?}"
    );
    let refreshes = w
        .at("token")
        .into_iter()
        .filter(|t| t["grant_type"] == "refresh_token")
        .count();
    assert!(refreshes >= 1, "renewed by refreshing");
    assert_eq!(w.at("authorize").len(), 1, "no new sign-in");
    h.shutdown().await;
}

#[tokio::test]
async fn tokens_are_refreshed_before_expiry_once_for_many_requests_and_rotated() {
    // Tokens live 31 s and are refreshed 30 s before they expire: after a second, every
    // request wants a fresh one.
    let w = World::new(&["--client", "pre", "--token-ttl", "31"], &[]).await;
    let h = w.harness(registered("pre")).await;
    ready(&h).await;
    tokio::time::sleep(Duration::from_millis(1200)).await; // into the refresh window (deliberate)
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let h = h.clone();
        set.spawn(async move { subject(&h, &Caller::agent("a")).await });
    }
    while let Some(r) = set.join_next().await {
        assert_eq!(r.expect("join").expect("call"), "demo-user");
    }
    let refreshes: Vec<Value> = w
        .at("token")
        .into_iter()
        .filter(|t| t["grant_type"] == "refresh_token")
        .collect();
    assert_eq!(
        refreshes.len(),
        1,
        "one refresh in flight for the token: {refreshes:?}"
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    subject(&h, &Caller::agent("a")).await.expect("call");
    let refreshes: Vec<Value> = w
        .at("token")
        .into_iter()
        .filter(|t| t["grant_type"] == "refresh_token")
        .collect();
    assert_eq!(refreshes.len(), 2);
    assert_ne!(
        refreshes[0]["refresh_token"], refreshes[1]["refresh_token"],
        "rotated"
    );
    assert_eq!(w.at("authorize").len(), 1, "no new sign-in");
    h.shutdown().await;
}

// The authorization server forgot the client (a registration deleted or expired) and
// refuses its refresh with `invalid_client`: the token and the registration are
// forgotten and a sign-in registers anew. Before, every request failed before it was
// sent, the dead token kept on disk for the next start too.
#[tokio::test]
async fn a_client_the_authorization_server_forgot_registers_and_signs_in_again() {
    let w = World::new(
        &[
            "--registration",
            "--token-ttl",
            "31",
            "--refuse-refresh",
            "forget-client",
        ],
        &[],
    )
    .await;
    let h = w.harness(OAuthConfig::default()).await;
    ready(&h).await;
    tokio::time::sleep(Duration::from_millis(1200)).await; // into the refresh window (deliberate)
    assert_eq!(
        subject(&h, &Caller::agent("a")).await.expect("call"),
        "demo-user"
    );
    assert_eq!(w.refreshes(), 1);
    assert_eq!(w.at("register").len(), 2, "registered anew");
    assert_eq!(w.at("authorize").len(), 2, "signed in again");
    h.shutdown().await;
}

// A code exchange refused with `invalid_client` (the authorization server restarted and
// lost its registrations): the next sign-in registers anew. Before, the registration
// was kept, and every sign-in until a restart of the harness failed with it.
#[tokio::test]
async fn a_client_unknown_at_the_code_exchange_registers_anew_at_the_next_sign_in() {
    let w = World::new(&["--registration", "--forget-client-at-exchange"], &[]).await;
    let h = w.harness(OAuthConfig::default()).await;
    // The refusal is no outage: the server is given up until someone acts.
    assert!(wait_state(&h, "web", ServerState::Failed).await);
    let why = h.server_status("web").and_then(|s| s.last_error);
    assert!(
        why.as_deref().is_some_and(|w| w.contains("invalid_client")),
        "{why:?}"
    );
    h.restart_server("web").await.expect("restart");
    ready(&h).await;
    assert_eq!(
        subject(&h, &Caller::agent("a")).await.expect("call"),
        "demo-user"
    );
    assert_eq!(w.at("register").len(), 2, "registered anew");
    assert_eq!(w.at("authorize").len(), 2, "signed in again");
    h.shutdown().await;
}

// A token issued with `expires_in: 0` (which some servers send for "does not expire")
// is used until refused. Before, it read as expired at once: never sent, and renewed at
// every request.
#[tokio::test]
async fn a_token_issued_with_expires_in_zero_is_used_not_renewed_at_every_request() {
    let w = World::new(&["--client", "pre", "--expires-in-zero"], &[]).await;
    let h = w.harness(registered("pre")).await;
    ready(&h).await;
    let before = w.at("token").len();
    for _ in 0..5 {
        assert_eq!(
            subject(&h, &Caller::agent("a")).await.expect("call"),
            "demo-user"
        );
    }
    assert_eq!(w.at("token").len(), before, "no token request for 5 calls");
    h.shutdown().await;
}

// A refresh ahead of expiry that fails for now (the authorization server down, 503)
// leaves a token that still works in use; before, the request failed with the
// refresh's error. One refused for good, even with a code of the server's own in a 200
// (GitHub's `bad_refresh_token`), forgets the token and signs in again; before, only
// four codes did, and every request failed once the token expired.
#[tokio::test]
async fn a_refresh_ahead_that_fails_for_now_keeps_the_token_and_one_refused_signs_in_again() {
    for (refusal, sign_ins) in [("unavailable", 1), ("nonstandard", 2)] {
        let w = World::new(
            &[
                "--client",
                "pre",
                "--token-ttl",
                "31",
                "--refuse-refresh",
                refusal,
            ],
            &[],
        )
        .await;
        let h = w.harness(registered("pre")).await;
        ready(&h).await;
        tokio::time::sleep(Duration::from_millis(1200)).await; // into the refresh window (deliberate)
        assert_eq!(
            subject(&h, &Caller::agent("a")).await.expect("call"),
            "demo-user"
        );
        assert!(w.refreshes() >= 1, "{refusal}");
        assert_eq!(w.at("authorize").len(), sign_ins, "{refusal}");
        h.shutdown().await;
    }
}

// A reconnect whose token refresh finds the authorization server down (503) is tried
// again with backoff, and the server is ready once it is back. Before, any sign-in
// failure gave the server up for good, as if its credentials were refused.
#[tokio::test]
async fn a_reconnect_while_the_authorization_server_is_down_heals_once_it_is_back() {
    let down = temp_file("as-down");
    let down_arg = down.to_string_lossy().to_string();
    let w = World::new(
        &[
            "--client",
            "pre",
            "--token-ttl",
            "2",
            "--refresh-unavailable-while",
            &down_arg,
        ],
        &[],
    )
    .await;
    let h = w.harness(registered("pre")).await;
    ready(&h).await;
    std::fs::write(&down, "").expect("down");
    tokio::time::sleep(Duration::from_millis(2500)).await; // the token expires (deliberate)
    let refreshes = w.refreshes();
    h.restart_server("web").await.expect("restart");
    assert!(
        eventually(Duration::from_secs(20), || w.refreshes() > refreshes).await,
        "the reconnect asks for a refresh"
    );
    let _ = std::fs::remove_file(&down);
    ready(&h).await;
    assert_eq!(
        subject(&h, &Caller::agent("a")).await.expect("call"),
        "demo-user"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn a_refresh_under_way_is_finished_and_kept_when_its_call_is_cancelled() {
    // Tokens live 34 s (refreshed 30 s before expiry); a refresh rotates the refresh
    // token at once and is answered 1.5 s later (its token is then due 5.5 s after it
    // was asked for: the calls below are done well before).
    let w = World::refreshing(34, 1500).await;
    let h = w.harness(registered("pre")).await;
    ready(&h).await;
    tokio::time::sleep(Duration::from_millis(4200)).await; // into the refresh window (deliberate)
    let call = tokio::spawn({
        let h = h.clone();
        async move { subject(&h, &Caller::agent("a")).await }
    });
    assert!(
        eventually(Duration::from_secs(10), || w.refreshes() == 1).await,
        "the call refreshes its token"
    );
    // Cancelled while the authorization server's reply is on its way: the refresh
    // token it sent is spent already.
    call.abort();
    assert!(call.await.is_err_and(|e| e.is_cancelled()));
    // Until the reply lands, the token (still good) is sent as it is.
    assert_eq!(
        subject(&h, &Caller::agent("a")).await.expect("call"),
        "demo-user"
    );
    tokio::time::sleep(Duration::from_millis(2000)).await; // the reply lands (deliberate)
    // The rotated token was kept: no second refresh with the spent refresh token, no
    // second sign-in.
    assert_eq!(
        subject(&h, &Caller::agent("a")).await.expect("call"),
        "demo-user"
    );
    assert_eq!(w.refreshes(), 1);
    assert_eq!(w.at("authorize").len(), 1, "no new sign-in");
    h.shutdown().await;
}

/// A harness whose caller alice signed in with a token now expired, whose refreshes
/// are answered `refresh_delay_ms` late. Tokens live 2 s longer than that delay (the
/// server counts whole seconds, so a refreshed token stays good for at least a second
/// after it lands, also on a loaded machine).
async fn alice_token_expired(refresh_delay_ms: u64) -> (World, HarnessHandle, Caller) {
    let ttl = refresh_delay_ms.div_ceil(1000) + 2;
    let w = World::refreshing(ttl, refresh_delay_ms).await;
    let h = w.harness(registered("pre")).await;
    ready(&h).await;
    let alice = as_user("alice");
    assert_eq!(subject(&h, &alice).await.expect("signed in"), "alice");
    tokio::time::sleep(Duration::from_millis(ttl * 1000 + 200)).await; // past its expiry (deliberate)
    (w, h, alice)
}

#[tokio::test]
async fn a_request_whose_token_expired_while_another_renews_it_times_out_and_the_server_stays_ready()
 {
    // Tokens live 4 s (so each request refreshes first; the server counts whole
    // seconds, so a token stays good for at least a second after a refresh lands: the
    // lifetime must stay 2 s above the delay); refreshes are answered 2 s late. Alice's token is hers alone (the harness's own
    // requests use another).
    let (w, h, alice) = alice_token_expired(2000).await;
    let before = w.refreshes();
    let renewing = tokio::spawn({
        let (h, alice) = (h.clone(), alice.clone());
        async move { subject(&h, &alice).await }
    });
    assert!(
        eventually(Duration::from_secs(10), || w.refreshes() > before).await,
        "the first call refreshes the expired token"
    );
    // The second waits for that refresh until its own deadline, and ends as a timeout:
    // not a failed sign-in, which would mark the server failed.
    let options = CallOptions {
        timeout: Some(Duration::from_millis(500)),
        ..CallOptions::default()
    };
    let waited = h
        .call(&alice, CallKind::Tool, "web__whoami", json!({}), options)
        .await;
    let Err(e) = waited else {
        panic!("answered with an expired token, or before the refresh: {waited:?}")
    };
    assert!(auth_error(&e).is_none(), "{e:?}");
    assert!(timed_out(&e), "{e:?}");
    assert_eq!(
        h.server_status("web").map(|s| s.state),
        Some(ServerState::Ready)
    );
    assert_eq!(renewing.await.expect("join").expect("refreshed"), "alice");
    assert_eq!(subject(&h, &alice).await.expect("call"), "alice");
    assert_eq!(w.at("authorize").len(), 2, "the harness's own and alice's");
    h.shutdown().await;
}

#[tokio::test]
async fn a_refresh_slower_than_the_request_ends_the_request_at_its_deadline_and_is_kept() {
    // Tokens live 5 s; refreshes are answered 3 s late.
    let (w, h, alice) = alice_token_expired(3000).await;
    let before = w.refreshes();
    let options = CallOptions {
        timeout: Some(Duration::from_millis(800)),
        ..CallOptions::default()
    };
    let started = std::time::Instant::now();
    let waited = h
        .call(&alice, CallKind::Tool, "web__whoami", json!({}), options)
        .await;
    let took = started.elapsed();
    let Err(e) = waited else {
        panic!("answered before the refresh came back: {waited:?}")
    };
    assert!(timed_out(&e), "{e:?}");
    // Its deadline, not the refresh's 3 s.
    assert!(took < Duration::from_millis(2500), "{took:?}");
    assert_eq!(w.refreshes(), before + 1, "the refresh was sent");
    // The refresh went on and its token was kept: the next call goes on from it
    // (refreshing again, as a 5 s token always is due), with no new sign-in.
    let signed_in = w.at("authorize").len();
    assert_eq!(subject(&h, &alice).await.expect("call"), "alice");
    assert_eq!(w.at("authorize").len(), signed_in, "no new sign-in");
    h.shutdown().await;
}

#[tokio::test]
async fn a_slow_refresh_ahead_of_expiry_does_not_hold_back_a_token_that_still_works() {
    // Tokens live 20 s, so one is due for refresh a second after it is issued and
    // good for 19 s more; refreshes are answered 3 s late.
    let w = World::refreshing(20, 3000).await;
    let h = w.harness(registered("pre")).await;
    ready(&h).await;
    let alice = as_user("alice");
    assert_eq!(subject(&h, &alice).await.expect("signed in"), "alice");
    tokio::time::sleep(Duration::from_millis(1500)).await; // due, not expired (deliberate)
    let before = w.refreshes();
    // The call starts the refresh, and goes with the token it has once half its time
    // is spent: answered, not a timeout at the refresh's 3 s.
    let options = CallOptions {
        timeout: Some(Duration::from_millis(2000)),
        ..CallOptions::default()
    };
    let answered = h
        .call(&alice, CallKind::Tool, "web__whoami", json!({}), options)
        .await;
    assert!(answered.is_ok(), "{answered:?}");
    assert!(
        eventually(Duration::from_secs(10), || w.refreshes() > before).await,
        "the refresh was sent"
    );
    // It lands and is kept: later calls need no sign-in.
    let signed_in = w.at("authorize").len();
    tokio::time::sleep(Duration::from_millis(3500)).await; // the refresh lands (deliberate)
    assert_eq!(subject(&h, &alice).await.expect("call"), "alice");
    assert_eq!(w.at("authorize").len(), signed_in, "no new sign-in");
    h.shutdown().await;
}

#[tokio::test]
async fn a_logout_during_a_refresh_is_not_undone_by_its_reply() {
    // Tokens live 5 s; refreshes are answered 3 s late. Alice signs in, her token
    // expires, a call refreshes it, and she is logged out (another process's `logout`)
    // while that refresh is under way.
    use mcp_harness::transport::auth::{MemoryTokenStore, TokenStore};
    let w = World::refreshing(5, 3000).await;
    let store = Arc::new(MemoryTokenStore::default());
    let h = w.storing(registered("pre"), store.clone()).await;
    ready(&h).await;
    let alice = as_user("alice");
    assert_eq!(subject(&h, &alice).await.expect("signed in"), "alice");
    tokio::time::sleep(Duration::from_millis(5200)).await; // past its expiry (deliberate)
    let (before, signed_in) = (w.refreshes(), w.at("authorize").len());
    let call = tokio::spawn({
        let (h, alice) = (h.clone(), alice.clone());
        async move { subject(&h, &alice).await }
    });
    assert!(
        eventually(Duration::from_secs(10), || w.refreshes() > before).await,
        "the call refreshes the expired token"
    );
    store.remove_server("web").expect("logout");
    // The refresh's token is dropped: the call signs alice in again.
    assert_eq!(call.await.expect("join").expect("call"), "alice");
    assert_eq!(
        w.at("authorize").len(),
        signed_in + 1,
        "signed in again after the logout, not answered with the refresh's token"
    );
    h.shutdown().await;
}

// A token kept from another authorization server than the pinned `issuer` is not sent
// (kept before the pin, or by another config sharing the store): the pin was checked
// only at a refresh, and a token that needs none went on being sent.
#[tokio::test]
async fn a_kept_token_of_another_issuer_than_the_pinned_one_is_not_sent() {
    use mcp_harness::transport::auth::MemoryTokenStore;
    let w = World::new(&["--client", "pre"], &[]).await;
    let store = Arc::new(MemoryTokenStore::default());
    let h = w.storing(registered("pre"), store.clone()).await;
    ready(&h).await;
    assert_eq!(
        subject(&h, &Caller::agent("a")).await.expect("call"),
        "demo-user"
    );
    h.shutdown().await;
    let sent = || -> Vec<String> {
        recorded(&w.mcp_record)
            .iter()
            .filter_map(|r| r["headers"]["authorization"].as_str().map(String::from))
            .collect()
    };
    let kept = sent();
    assert!(!kept.is_empty());
    let pinned = OAuthConfig {
        issuer: Some("https://pinned.example".into()),
        ..registered("pre")
    };
    let h = w.storing(pinned, store).await;
    // Its sign-in with the pinned issuer fails (the server names another).
    let refused = subject(&h, &Caller::agent("a")).await;
    assert!(refused.is_err(), "{refused:?}");
    let after = sent();
    assert!(
        after[kept.len()..].iter().all(|a| !kept.contains(a)),
        "the kept token went to the server"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn a_server_that_refuses_every_fresh_token_costs_one_renewal_not_one_per_request() {
    // Alice's tokens are refused by the server, however fresh; the harness's own are not.
    let w = World::new(&["--client", "pre"], &["--oauth-refuse-subject", "alice"]).await;
    let h = w.harness(registered("pre")).await;
    ready(&h).await;
    let alice = as_user("alice");
    let sign_ins = w.at("authorize").len();
    for n in 0..4 {
        let refused = subject(&h, &alice).await;
        assert!(refused.is_err(), "call {n}: {refused:?}");
    }
    // The first call signed alice in (and its retry was refused); the next ones were
    // refused without a refresh or a sign-in each.
    assert_eq!(
        w.at("authorize").len(),
        sign_ins + 1,
        "one sign-in for alice"
    );
    assert_eq!(w.refreshes(), 0, "no refresh per request");
    // Others are served meanwhile.
    assert_eq!(subject(&h, &as_user("bob")).await.expect("bob"), "bob");
    h.shutdown().await;
}

#[tokio::test]
async fn a_refresh_after_a_restart_asks_for_the_resource_the_grant_was_for() {
    // The server's metadata names its origin as the resource, not its URL; tokens live
    // 20 s, so a request refreshes first (30 s ahead of expiry) once the token has
    // been held a second.
    use mcp_harness::transport::auth::MemoryTokenStore;
    let w = World::new(
        &["--client", "pre", "--token-ttl", "20"],
        &["--oauth-resource-root"],
    )
    .await;
    let resource = w.mcp.url.trim_end_matches("mcp").to_string();
    let store = Arc::new(MemoryTokenStore::default());
    let spawn = || {
        w.builder(vec![w.server(registered("pre"))])
            .token_store(store.clone())
            .spawn()
    };
    signs_in_and_stops(&w, spawn().await.expect("spawn")).await;
    tokio::time::sleep(Duration::from_millis(1100)).await; // its first second (deliberate)
    // A new process: the token is read from the store, due, and refreshed before
    // anything else would have discovered the metadata.
    let before = w.refreshes();
    serves_and_stops(spawn().await.expect("spawn")).await;
    assert!(w.refreshes() > before, "refreshed");
    for t in w.at("token") {
        assert_eq!(t["resource"], resource.as_str(), "{t}");
    }
    assert_eq!(w.at("authorize").len(), 1, "no second sign-in");
}

#[tokio::test]
async fn an_expired_token_without_a_refresh_token_is_renewed_by_signing_in_again() {
    // No `offline_access` offered, so no refresh token; tokens live 3 s.
    let w = World::new(
        &[
            "--client",
            "pre",
            "--token-ttl",
            "3",
            "--scopes",
            "mcp:read,mcp:write",
        ],
        &[],
    )
    .await;
    let h = w.harness(registered("pre")).await;
    ready(&h).await;
    let a = Caller::agent("a");
    assert_eq!(subject(&h, &a).await.expect("call"), "demo-user");
    tokio::time::sleep(Duration::from_millis(3500)).await; // past its expiry (deliberate)
    // The expired token is not sent again: the refusal of a request without it signs in
    // anew (it had been taken for a token renewed meanwhile, and every request refused
    // until a restart).
    assert_eq!(subject(&h, &a).await.expect("signed in again"), "demo-user");
    assert_eq!(subject(&h, &a).await.expect("call"), "demo-user");
    assert!(w.at("authorize").len() >= 2, "a second sign-in");
    assert!(
        w.at("token")
            .iter()
            .all(|t| t["grant_type"] != "refresh_token"),
        "nothing to refresh with"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn client_credentials_sign_in_without_a_person() {
    let w = World::new(&["--client", "machine:s3cret"], &[]).await;
    let config = HarnessConfig {
        servers: vec![w.server(OAuthConfig {
            grant: mcp_harness::transport::auth::GrantKind::ClientCredentials,
            ..w.confidential("machine:s3cret")
        })],
        permissions: grant_everything(&["a"]),
        ..HarnessConfig::default()
    };
    // No authorizer at all.
    let h = Harness::spawn(config).await.expect("spawn");
    ready(&h).await;
    assert_eq!(
        subject(&h, &Caller::agent("a")).await.expect("call"),
        "machine"
    );
    assert!(w.at("authorize").is_empty());
    assert!(w.at("token").iter().all(|t| t["grant_type"] == "client_credentials" && t["resource"] == w.mcp.url.as_str()));
    h.shutdown().await;
}

// A client secret is the client's at one authorization server: pinned with `issuer`,
// it goes to no other, whatever the protected server names.
#[tokio::test]
async fn a_client_secret_pinned_to_its_issuer_goes_to_no_other() {
    let w = World::new(&["--client", "machine:s3cret"], &[]).await;
    let pinned = |issuer: &str| OAuthConfig {
        grant: mcp_harness::transport::auth::GrantKind::ClientCredentials,
        issuer: Some(issuer.into()),
        ..registered("machine:s3cret")
    };
    let h = w.harness(pinned("https://idp.elsewhere.test")).await;
    assert!(wait_state(&h, "web", ServerState::Failed).await);
    let why = h
        .server_status("web")
        .and_then(|s| s.last_error)
        .unwrap_or_default();
    assert!(why.contains("configured issuer"), "{why}");
    assert!(w.at("token").is_empty(), "the secret was never sent");
    h.shutdown().await;
    // Not pinned at all: the config is refused, the secret never sent.
    let e = Harness::builder(HarnessConfig {
        servers: vec![w.server(OAuthConfig {
            grant: mcp_harness::transport::auth::GrantKind::ClientCredentials,
            ..registered("machine:s3cret")
        })],
        ..HarnessConfig::default()
    })
    .spawn()
    .await
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(e.contains("transport.auth.issuer"), "{e}");
    assert!(w.at("token").is_empty(), "the secret was never sent");

    let h = w.harness(pinned(&w.auth.url)).await;
    ready(&h).await;
    assert_eq!(
        subject(&h, &Caller::agent("a")).await.expect("call"),
        "machine"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn two_agents_signed_in_as_two_users_never_share_a_token() {
    let w = World::new(&["--client", "pre"], &[]).await;
    let h = w.harness(registered("pre")).await;
    ready(&h).await;
    let (alice, bob) = (as_user("alice"), as_user("bob"));
    assert_eq!(subject(&h, &alice).await.expect("alice"), "alice");
    assert_eq!(subject(&h, &bob).await.expect("bob"), "bob");
    assert_eq!(subject(&h, &alice).await.expect("alice again"), "alice");
    assert_eq!(
        w.at("authorize").len(),
        3,
        "the harness's own, alice's and bob's"
    );
    let tokens: std::collections::HashSet<String> = recorded(&w.mcp_record)
        .iter()
        .filter(|r| r["method"] == "tools/call")
        .filter_map(|r| r["headers"]["authorization"].as_str().map(String::from))
        .collect();
    assert_eq!(tokens.len(), 2, "one token each");
    h.shutdown().await;
}

#[tokio::test]
async fn a_token_never_reaches_another_host_or_the_authorization_server() {
    let w = World::new(&["--client", "pre"], &[]).await;
    let other_record = temp_file("other-host");
    let (cert, key) = w.ca.leaf("other", &["127.0.0.1"]);
    let other = HttpServer::demo_tls(
        &["other", "--record", &other_record.to_string_lossy()],
        &cert,
        &key,
    )
    .await;
    let mut plain = ServerConfig::http("other", &other.url);
    if let TransportSpec::Http(h) = &mut plain.transport {
        h.ca_file = Some(w.ca.ca_pem.clone());
    }
    let h = w
        .harness_with(vec![w.server(registered("pre")), plain])
        .await;
    ready(&h).await;
    assert!(
        wait_state(&h, "other", ServerState::Ready).await,
        "{:?}",
        h.server_status("other").and_then(|s| s.last_error)
    );
    subject(&h, &as_user("alice")).await.expect("web");
    h.call_tool(&as_user("alice"), "other__echo", json!({"text": "x"}))
        .await
        .expect("other");
    h.list_tools(&as_user("alice")).await.expect("list");
    h.shutdown().await;
    let leaked: Vec<Value> = recorded(&other_record)
        .into_iter()
        .filter(|r| !r["headers"]["authorization"].is_null())
        .collect();
    assert!(leaked.is_empty(), "another host got a token: {leaked:?}");
    assert!(
        recorded(&w.auth_record).iter().all(|r| r["bearer"] != true),
        "the authorization server got a bearer token"
    );
    let _ = std::fs::remove_file(other_record);
}

#[tokio::test]
async fn without_an_authorizer_a_sign_in_that_needs_a_person_says_what_to_do() {
    let w = World::new(&["--client", "pre"], &[]).await;
    let config = HarnessConfig {
        servers: vec![w.server(registered("pre"))],
        permissions: grant_everything(&["a"]),
        ..HarnessConfig::default()
    };
    let h = Harness::spawn(config).await.expect("spawn");
    assert!(wait_state(&h, "web", ServerState::Failed).await);
    let why = h
        .server_status("web")
        .and_then(|s| s.last_error)
        .unwrap_or_default();
    assert!(why.contains("mcp-harness login web"), "{why}");
    assert_eq!(
        h.server_status("web").map(|s| s.restarts),
        Some(0),
        "no retry loop"
    );
    h.shutdown().await;
}

/// The subject a `call …__whoami --json` run says the server saw (the run succeeded).
fn cli_subject(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_slice(&out.stdout).expect("json");
    result["structuredContent"]["headers"]["x-demo-subject"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn the_command_line_signs_in_with_a_confidential_client_pinned_to_its_issuer() {
    let w = World::new(&["--client", "pre:s3cret"], &[]).await;
    let dir = temp_file("cli-secret");
    std::fs::create_dir_all(&dir).expect("dir");
    let tokens = dir.join("tokens").to_string_lossy().to_string();
    let ca = w.ca.ca_pem.to_string_lossy().to_string();
    let run = |extra: &[&str]| {
        std::process::Command::new(harness_exe())
            .args(["call", "http1__whoami", "--json", "--http", &w.mcp.url])
            .args([
                "--ca-file",
                &ca,
                "--tokens",
                &tokens,
                "--sign-in",
                "headless",
            ])
            .args(extra)
            .env("RUST_LOG", "error")
            .output()
            .expect("run the CLI")
    };
    let secret = ["--client-id", "pre", "--client-secret", "s3cret"];
    // A secret without its client would be dropped in silence.
    let out = run(&["--client-secret", "s3cret", "--issuer", &w.auth.url]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--client-id"), "{stderr}");
    // Without the issuer the secret could go to whichever one the server names.
    let out = run(&secret);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("issuer"), "{stderr}");
    assert!(!stderr.contains("s3cret"), "{stderr}");
    assert!(w.at("authorize").is_empty());
    let out = run(&[&secret[..], &["--issuer", &w.auth.url]].concat());
    assert_eq!(cli_subject(&out), "demo-user");
    // The token request authenticated the client with its secret.
    assert!(
        w.at("token")
            .iter()
            .all(|t| t["client_auth"] == "client_secret_basic"),
        "{:?}",
        w.at("token")
    );
    // The secret from a file, kept out of the command line: refused while others can
    // read it, used once they cannot (the token kept above is forgotten first).
    let _ = std::fs::remove_dir_all(dir.join("tokens"));
    let file = dir.join("secret");
    std::fs::write(&file, "s3cret\n").expect("write");
    let from_file = |w: &World| {
        let file = file.to_string_lossy().to_string();
        let args = ["--client-id", "pre", "--client-secret-file", &file];
        run(&[&args[..], &["--issuer", &w.auth.url]].concat())
    };
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let out = from_file(&w);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("readable by others"), "{stderr}");
    let tokens_asked = w.at("token").len();
    write_private(&file, "s3cret\n");
    let out = from_file(&w);
    assert_eq!(cli_subject(&out), "demo-user");
    let asked = w.at("token");
    assert!(asked.len() > tokens_asked, "signed in again: {asked:?}");
    assert!(
        asked
            .iter()
            .all(|t| t["client_auth"] == "client_secret_basic"),
        "{asked:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn the_command_line_logs_in_ahead_reuses_the_token_and_logs_out() {
    let w = World::new(&["--client", "pre"], &[]).await;
    let dir = temp_file("cli-oauth");
    std::fs::create_dir_all(&dir).expect("dir");
    let config = dir.join("harness.toml");
    std::fs::write(
        &config,
        format!(
            "[[servers]]\nid = \"web\"\ntransport = {{ type = \"http\", url = \"{}\", ca_file = \"{}\", auth = {{ client_id = \"pre\" }} }}\n\n[permissions.local]\n\"*\" = [\"*\"]\n",
            w.mcp.url,
            w.ca.ca_pem.display()
        ),
    )
    .expect("config");
    let tokens = dir.join("tokens");
    let run = |args: &[&str], sign_in: &str| {
        let mut cmd = std::process::Command::new(harness_exe());
        cmd.args(args)
            .args([
                "--config",
                &config.to_string_lossy(),
                "--tokens",
                &tokens.to_string_lossy(),
            ])
            .args(["--sign-in", sign_in])
            .env("RUST_LOG", "error");
        cmd.output().expect("run the CLI")
    };
    // `login` waits for the sign-in, however short `--wait` (a person gets 5 minutes).
    let out = run(&["login", "web", "--wait", "1ms"], "headless");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("signed in to web"));
    assert_eq!(w.at("authorize").len(), 1);
    // A later run uses the kept token: no new sign-in, and no person needed.
    let out = run(&["call", "web__whoami", "--json"], "print");
    assert_eq!(cli_subject(&out), "demo-user");
    assert_eq!(w.at("authorize").len(), 1, "the token was reused");
    let out = run(&["logout", "web"], "print");
    assert!(String::from_utf8_lossy(&out.stderr).contains("1 token(s) forgotten"));
    // A name that is no server and has no tokens is a mistake, not a logout.
    let out = run(&["logout", "wbe"], "print");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no server named"));
    // Signed out, with nobody at a terminal: an error that says what to do.
    let out = run(&["call", "web__whoami"], "print");
    assert_eq!(out.status.code(), Some(3));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("mcp-harness login web"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_kept_token_survives_a_restart_and_is_refreshed_not_signed_in_again() {
    // Tokens are kept in the cache directory (the default store when there is one): the
    // cache layer's loader once took their folder for a server's and deleted them at
    // every start. The server is reached by name (`localhost`) and its authorization
    // server by address, both internal. Tokens live 31 s and are refreshed 30 s before
    // they expire.
    let w = World::new(&["--client", "pre", "--token-ttl", "31"], &[]).await;
    let url = w.mcp.url.replace("127.0.0.1", "localhost");
    assert_ne!(url, w.mcp.url, "the server is reached by name");
    let dir = temp_file("kept-token-dir").with_extension("d");
    let harness = || {
        let mut server = ServerConfig::http("web", &url);
        if let TransportSpec::Http(h) = &mut server.transport {
            h.ca_file = Some(w.ca.ca_pem.clone());
            h.auth = registered("pre");
        }
        let mut config = HarnessConfig {
            servers: vec![server],
            permissions: grant_everything(&["a"]),
            ..HarnessConfig::default()
        };
        // Tokens are kept in the cache directory (its `__tokens`).
        config.cache.dir = Some(dir.clone());
        Harness::builder(config).authorizer(w.authorizer()).spawn()
    };
    signs_in_and_stops(&w, harness().await.expect("spawn")).await;
    // Counted from here: on a loaded machine the first process may have refreshed too.
    let refreshed = || {
        w.at("token")
            .into_iter()
            .filter(|t| t["grant_type"] == "refresh_token")
            .count()
    };
    let before = refreshed();
    tokio::time::sleep(Duration::from_millis(1200)).await; // into the refresh window (deliberate)
    // A new process: its first request refreshes the kept token, which reaches the
    // server first to learn where it is, then the token endpoint.
    let second = harness().await.expect("spawn");
    ready(&second).await;
    assert_eq!(
        subject(&second, &Caller::agent("a")).await.expect("call"),
        "demo-user"
    );
    second.shutdown().await;
    assert_eq!(refreshed() - before, 1, "the kept token was refreshed");
    assert_eq!(w.at("authorize").len(), 1, "no second sign-in");
    let _ = std::fs::remove_dir_all(dir);
}

/// A store another process writes to between this one's reads: each read first takes
/// the next token of `appearing` (what the other process stored meanwhile), if any.
struct SharedWithAnother {
    kept: mcp_harness::transport::auth::MemoryTokenStore,
    /// The key of the last token kept (the harness's own sign-in to `web`).
    key: parking_lot::Mutex<Option<mcp_harness::transport::auth::TokenKey>>,
    appearing: parking_lot::Mutex<std::collections::VecDeque<mcp_harness::transport::auth::Token>>,
}

impl mcp_harness::transport::auth::TokenStore for SharedWithAnother {
    fn get(
        &self,
        key: &mcp_harness::transport::auth::TokenKey,
    ) -> Result<Option<mcp_harness::transport::auth::Token>, String> {
        if let Some(next) = self.appearing.lock().pop_front() {
            self.kept.put(key, &next)?;
        }
        self.kept.get(key)
    }
    fn put(
        &self,
        key: &mcp_harness::transport::auth::TokenKey,
        token: &mcp_harness::transport::auth::Token,
    ) -> Result<(), String> {
        *self.key.lock() = Some(key.clone());
        self.kept.put(key, token)
    }
    fn remove(&self, key: &mcp_harness::transport::auth::TokenKey) -> Result<(), String> {
        self.kept.remove(key)
    }
    fn remove_server(&self, server: &str) -> Result<usize, String> {
        self.kept.remove_server(server)
    }
}

#[tokio::test]
async fn a_token_another_process_stored_is_tried_once_and_if_refused_too_the_request_refreshes() {
    // The race a shared store allows: this process's token is refused, and by then
    // another process has stored a token of its own, which is taken and tried; the
    // server refuses that one too (revoked), so the same request refreshes instead of
    // failing. The store plays the other process: it hands out the next token on each
    // read.
    use mcp_harness::transport::auth::{MemoryTokenStore, TokenStore};
    let w = World::new(&["--client", "pre"], &[]).await;
    let store = Arc::new(SharedWithAnother {
        kept: MemoryTokenStore::default(),
        key: parking_lot::Mutex::new(None),
        appearing: parking_lot::Mutex::new(Default::default()),
    });
    let spawn = || {
        w.builder(vec![w.server(registered("pre"))])
            .token_store(store.clone())
            .spawn()
    };
    // A first process signs in: one token, with a refresh token that still works.
    signs_in_and_stops(&w, spawn().await.expect("spawn")).await;
    let key = store.key.lock().clone().expect("a token was kept");
    let signed_in = store.kept.get(&key).expect("read").expect("kept");
    // Revoked on the server (it no longer takes them), not yet known to be here.
    let revoked = |access: &str| mcp_harness::transport::auth::Token {
        access_token: access.into(),
        expires_at_ms: Some(u64::MAX / 2),
        ..signed_in.clone()
    };
    store.kept.put(&key, &revoked("revoked-here")).expect("put");
    store.appearing.lock().extend([
        // Taken by the first read: this process's own token.
        revoked("revoked-here"),
        // Stored by "another process" while the first try was out.
        revoked("revoked-there"),
    ]);
    let before = w.refreshes();
    serves_and_stops(spawn().await.expect("spawn")).await;
    // The server saw this process's token, then the other's, each refused once.
    let refused: Vec<String> = recorded(&w.mcp_record)
        .into_iter()
        .filter(|r| r["refused"] == 401)
        .filter_map(|r| r["headers"]["authorization"].as_str().map(String::from))
        .collect();
    assert_eq!(
        refused,
        ["Bearer revoked-here", "Bearer revoked-there"],
        "each held token tried once, in order"
    );
    assert_eq!(w.refreshes() - before, 1, "then one refresh");
    assert_eq!(w.at("authorize").len(), 1, "and no second sign-in");
}

#[tokio::test]
async fn a_broken_event_stream_is_resumed_with_the_token_of_the_user_whose_call_it_is() {
    // A legacy server (event streams resume with a GET): alice's call's stream breaks
    // before its answer, and the GET that resumes it carries alice's token, not the
    // harness's own.
    let w = World::new(&["--client", "pre"], &["--era", "legacy"]).await;
    let h = w.harness(registered("pre")).await;
    ready(&h).await;
    let alice = as_user("alice");
    assert_eq!(subject(&h, &alice).await.expect("alice"), "alice");
    let r = h
        .call_tool(&alice, "web__broken_stream", json!({}))
        .await
        .expect("resumed");
    assert_eq!(r["content"][0]["text"], "resumed", "{r}");
    let (alices, resumed) = alices_token_and(&w, |r| {
        r["method"] == "GET" && r["headers"]["last-event-id"].is_string()
    });
    assert_eq!(resumed, [alices], "resumed as alice");
    h.shutdown().await;
}

/// The token alice's call carried, as the protected server recorded it, and the tokens
/// of the requests `of` picks among its records.
fn alices_token_and(w: &World, of: impl Fn(&Value) -> bool) -> (String, Vec<String>) {
    let records = recorded(&w.mcp_record);
    let token_of = |r: &Value| r["headers"]["authorization"].as_str().map(String::from);
    let alices = records
        .iter()
        .filter(|r| r["method"] == "tools/call" && r["headers"]["x-demo-subject"] == "alice")
        .find_map(token_of)
        .expect("alice's call");
    let others = records
        .iter()
        .filter(|r| of(r))
        .filter_map(token_of)
        .collect();
    (alices, others)
}

// A legacy server's question on alice's call's stream is answered with alice's token,
// not the harness's own (a server that checks who answers would refuse it, and the
// call would wait for an answer that never came).
#[tokio::test]
async fn a_question_on_a_users_call_is_answered_with_that_users_token() {
    let w = World::new(&["--client", "pre"], &["--era", "legacy"]).await;
    let accept = mcp_harness::call::input::FixedAnswers::new(
        json!({"action": "accept", "content": {"confirm": true}}),
    );
    let h = w
        .builder(vec![w.server(registered("pre"))])
        .input_handler("elicitation/create", Arc::new(accept))
        .spawn()
        .await
        .expect("spawn");
    ready(&h).await;
    let alice = as_user("alice");
    assert_eq!(subject(&h, &alice).await.expect("alice"), "alice");
    h.call_tool(&alice, "web__confirm", json!({}))
        .await
        .expect("answered");
    let (alices, answers) = alices_token_and(&w, |r| r.get("answer").is_some());
    assert_eq!(answers, [alices], "answered as alice");
    h.shutdown().await;
}

/// A store that reads nothing and cannot write (a full disk, a directory the process
/// may not write).
struct Unwritable;

impl mcp_harness::transport::auth::TokenStore for Unwritable {
    fn get(
        &self,
        _: &mcp_harness::transport::auth::TokenKey,
    ) -> Result<Option<mcp_harness::transport::auth::Token>, String> {
        Ok(None)
    }
    fn put(
        &self,
        _: &mcp_harness::transport::auth::TokenKey,
        _: &mcp_harness::transport::auth::Token,
    ) -> Result<(), String> {
        Err("No space left on device".into())
    }
    fn remove(&self, _: &mcp_harness::transport::auth::TokenKey) -> Result<(), String> {
        Ok(())
    }
    fn remove_server(&self, _: &str) -> Result<usize, String> {
        Ok(0)
    }
}

/// A store that cannot write, and still holds an old token whose refresh token is
/// spent (the last one it could take before its disk filled).
struct StaleAndUnwritable {
    stale: mcp_harness::transport::auth::Token,
}

impl mcp_harness::transport::auth::TokenStore for StaleAndUnwritable {
    fn get(
        &self,
        _: &mcp_harness::transport::auth::TokenKey,
    ) -> Result<Option<mcp_harness::transport::auth::Token>, String> {
        Ok(Some(self.stale.clone()))
    }
    fn put(
        &self,
        _: &mcp_harness::transport::auth::TokenKey,
        _: &mcp_harness::transport::auth::Token,
    ) -> Result<(), String> {
        Err("No space left on device".into())
    }
    fn remove(&self, _: &mcp_harness::transport::auth::TokenKey) -> Result<(), String> {
        Err("Read-only file system".into())
    }
    fn remove_server(&self, _: &str) -> Result<usize, String> {
        Err("Read-only file system".into())
    }
}

// Tokens the store cannot take are refreshed from the one held here, never from the
// older one the store still has (its refresh token spent): one sign-in, however many
// refreshes follow.
#[tokio::test]
async fn a_token_held_in_memory_is_refreshed_from_itself_not_from_the_stores_older_one() {
    use mcp_harness::transport::auth::{ClientAuth, ClientIdentity, Token};
    // Tokens live 20 s: a request refreshes first (30 s ahead of expiry) once the token
    // has been held a second.
    let w = World::new(&["--client", "pre", "--token-ttl", "20"], &[]).await;
    let stale = Token {
        access_token: "stale".into(),
        refresh_token: Some("spent".into()),
        expires_at_ms: Some(1),
        issued_at_ms: None,
        scopes: vec![],
        issuer: w.auth.url.clone(),
        token_endpoint: format!("{}/token", w.auth.url),
        client: ClientIdentity {
            client_id: "pre".into(),
            client_secret: None,
            auth: ClientAuth::None,
        },
        resource: None,
    };
    let h = w
        .storing(registered("pre"), Arc::new(StaleAndUnwritable { stale }))
        .await;
    ready(&h).await;
    tokio::time::sleep(Duration::from_millis(1100)).await; // its first second (deliberate)
    let before = w.refreshes();
    for _ in 0..3 {
        assert_eq!(
            subject(&h, &Caller::agent("a")).await.expect("call"),
            "demo-user"
        );
    }
    // Refreshed (a request whose renewal another has under way uses the token still
    // valid, so on a loaded machine there may be fewer refreshes than calls).
    assert!(w.refreshes() > before, "refreshed");
    assert_eq!(
        w.at("authorize").len(),
        1,
        "one sign-in, its tokens refreshed"
    );
    h.shutdown().await;
}

// A token the store cannot take is still used: the code that got it is spent, and a
// person would otherwise sign in for nothing (and a rotated refresh token be lost).
#[tokio::test]
async fn a_token_the_store_cannot_keep_is_held_in_memory() {
    let w = World::new(&["--client", "pre"], &[]).await;
    let h = w.storing(registered("pre"), Arc::new(Unwritable)).await;
    ready(&h).await;
    for _ in 0..2 {
        assert_eq!(
            subject(&h, &Caller::agent("a")).await.expect("call"),
            "demo-user"
        );
    }
    assert_eq!(w.at("authorize").len(), 1, "one sign-in, its token used");
    h.shutdown().await;
}

// Metadata answered 429 (rate-limited) or 408 is asked for again later: the server is
// restarted with backoff, not given up as one with no metadata (which no retry heals).
#[tokio::test]
async fn rate_limited_metadata_is_asked_again_not_given_up() {
    let url = http_service(|path, _, _| {
        if path.starts_with("/.well-known/") {
            (429, b"slow down".to_vec())
        } else {
            (401, Vec::new())
        }
    })
    .await;
    let mut server = ServerConfig::http("limited", &url);
    server.restart.min_delay = Duration::from_millis(100);
    server.restart.max_delay = Duration::from_millis(200);
    if let TransportSpec::Http(h) = &mut server.transport {
        h.auth = registered("pre");
    }
    let h = Harness::spawn(HarnessConfig {
        servers: vec![server],
        permissions: grant_everything(&["a"]),
        ..HarnessConfig::default()
    })
    .await
    .expect("spawn");
    assert!(
        eventually(Duration::from_secs(20), || h
            .server_status("limited")
            .is_some_and(|s| s.restarts >= 2))
        .await,
        "restarted, not given up: {:?}",
        h.server_status("limited")
    );
    let status = h.server_status("limited").expect("status");
    assert_ne!(status.state, ServerState::Failed, "{status:?}");
    assert!(
        status
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("429")),
        "{status:?}"
    );
    h.shutdown().await;
}
