//! Calls through the whole harness: authorization, routing and fallback, the schema
//! cache, MRTR rounds through input handlers, and the audit trail, on real servers.

mod support;

use std::sync::Arc;
use std::time::Duration;

use mcp_harness::audit::{AuditConfig, Redaction};
use mcp_harness::registry::cache::CacheConfig;
use mcp_harness::{
    ApprovalQueue, CallError, CallKind, Caller, FixedAnswers, Harness, HarnessConfig,
    HarnessHandle, ListKind, RestartConfig, ServerConfig, ServerError, ServerState,
};
use serde_json::{Value, json};
use support::*;

fn demo(id: &str, args: &[&str]) -> ServerConfig {
    let mut all = vec!["demo-server".to_string(), id.to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    let mut c = ServerConfig::stdio(id, harness_exe(), all);
    c.restart = RestartConfig {
        min_delay: Duration::from_secs(30),
        max_delay: Duration::from_secs(30),
        ..RestartConfig::default()
    };
    c
}

fn everyone(agents: &[&str]) -> mcp_harness::permission::Grants {
    agents
        .iter()
        .map(|a| {
            (
                a.to_string(),
                [("*".to_string(), vec!["*".to_string()])].into(),
            )
        })
        .collect()
}

async fn harness(config: HarnessConfig) -> HarnessHandle {
    let h = Harness::spawn(config).await.expect("spawn");
    let ids: Vec<String> = h.status().iter().map(|s| s.id.clone()).collect();
    for id in ids {
        assert!(
            eventually(Duration::from_secs(30), || h
                .server_status(&id)
                .is_some_and(|s| s.state == ServerState::Ready))
            .await,
            "{id} ready"
        );
    }
    h
}

fn config(servers: Vec<ServerConfig>, agents: &[&str]) -> HarnessConfig {
    HarnessConfig {
        servers,
        permissions: everyone(agents),
        ..HarnessConfig::default()
    }
}

/// `config` with its list cache kept on disk in `dir` too.
fn on_disk(mut config: HarnessConfig, dir: &std::path::Path) -> HarnessConfig {
    config.cache = CacheConfig {
        dir: Some(dir.to_path_buf()),
        ..CacheConfig::default()
    };
    config
}

fn tool_calls(record: &std::path::PathBuf, method: &str) -> usize {
    recorded(record)
        .iter()
        .filter(|r| r["method"] == method)
        .count()
}

fn accept_all() -> Arc<FixedAnswers> {
    Arc::new(FixedAnswers::from_fn(
        |req| json!({"action": "accept", "content": {"approved": true, "answer": format!("a-{}", req.key)}}),
    ))
}

#[tokio::test]
async fn the_same_tool_on_two_servers_routes_by_priority_and_falls_back_when_the_first_dies() {
    let record = temp_file("trusted-primary");
    let mut primary = demo("primary", &["--record", &record.to_string_lossy()]);
    primary.priority = 10;
    primary.trust_annotations = true;
    let backup = demo("backup", &[]);
    let h = harness(config(vec![backup, primary], &["a"])).await;
    let a = Caller::agent("a");
    let r = h
        .call_tool(&a, "server_name", json!({}))
        .await
        .expect("call");
    assert_eq!(
        text(&r),
        "primary",
        "higher priority first, whatever the config order"
    );
    let r = h
        .call_tool(&a, "backup__server_name", json!({}))
        .await
        .expect("qualified");
    assert_eq!(text(&r), "backup");

    // A read-only call in flight on a trusted server whose process dies is re-sent.
    let slow = {
        let (h, a) = (h.clone(), a.clone());
        tokio::spawn(async move {
            h.call_tool(&a, "slow", json!({"ms": 2000, "text": "done"}))
                .await
        })
    };
    // In flight: primary has it (a call not sent yet would fail over as never-sent,
    // which is not the re-send this checks).
    let slows = || calls_recorded(&record, "slow");
    assert!(
        eventually(Duration::from_secs(10), || slows() == 1).await,
        "slow reached primary"
    );
    let pid = h.server_status("primary").and_then(|s| s.pid).expect("pid");
    sigkill(pid);
    let r = tokio::time::timeout(Duration::from_secs(20), slow)
        .await
        .expect("no hang")
        .expect("join");
    assert_eq!(text(&r.expect("failed over")), "done");

    // With the first server down (restarting for 30 s), calls go to the other at once.
    assert!(
        eventually(Duration::from_secs(10), || h
            .server_status("primary")
            .is_some_and(|s| s.state == ServerState::Restarting))
        .await
    );
    let started = std::time::Instant::now();
    let r = h
        .call_tool(&a, "server_name", json!({}))
        .await
        .expect("fallback");
    assert_eq!(text(&r), "backup");
    assert!(started.elapsed() < Duration::from_secs(10));
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
}

#[tokio::test]
async fn a_call_that_may_have_reached_an_untrusted_server_is_not_resent() {
    let record = temp_file("untrusted-primary");
    let mut primary = demo("primary", &["--record", &record.to_string_lossy()]);
    primary.priority = 10;
    let h = harness(config(vec![primary, demo("backup", &[])], &["a"])).await;
    let a = Caller::agent("a");
    let slow = {
        let (h, a) = (h.clone(), a.clone());
        tokio::spawn(async move { h.call_tool(&a, "slow", json!({"ms": 2000})).await })
    };
    // In flight: primary has it (one not sent yet would fail over to backup).
    let slows = || calls_recorded(&record, "slow");
    assert!(
        eventually(Duration::from_secs(10), || slows() == 1).await,
        "slow reached primary"
    );
    let pid = h.server_status("primary").and_then(|s| s.pid).expect("pid");
    sigkill(pid);
    let r = tokio::time::timeout(Duration::from_secs(20), slow)
        .await
        .expect("no hang")
        .expect("join");
    assert!(
        matches!(
            r,
            Err(CallError::Server(ServerError::TransportClosed { .. }))
        ),
        "{r:?}"
    );
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
}

#[tokio::test]
async fn private_lists_stay_within_an_auth_context_and_public_lists_are_shared() {
    let (rec_private, rec_public) = (temp_file("private"), temp_file("public"));
    let private = demo(
        "priv",
        &[
            "--cache-scope",
            "private",
            "--record",
            &rec_private.to_string_lossy(),
        ],
    );
    let public = demo(
        "pub",
        &[
            "--cache-scope",
            "public",
            "--record",
            &rec_public.to_string_lossy(),
        ],
    );
    let h = harness(config(vec![private, public], &["a", "b"])).await;
    let alice = Caller::agent("a").with_auth_context("alice-token");
    let bob = Caller::agent("b").with_auth_context("bob-token");
    let first = h.list_tools(&alice).await.expect("list");
    assert!(first.iter().all(|t| !t.from_cache));
    assert!(eventually(Duration::from_secs(5), || h.cache_stats().l1.entries == 2).await);
    let again = h.list_tools(&alice).await.expect("list");
    assert!(
        again.iter().all(|t| t.from_cache),
        "alice is served from the cache"
    );
    let for_bob = h.list_tools(&bob).await.expect("list");
    assert!(
        for_bob
            .iter()
            .filter(|t| &*t.server == "priv")
            .all(|t| !t.from_cache),
        "alice's private list is not bob's"
    );
    assert!(
        for_bob
            .iter()
            .filter(|t| &*t.server == "pub")
            .all(|t| t.from_cache),
        "a public list is shared"
    );
    assert_eq!(tool_calls(&rec_private, "tools/list"), 2);
    assert_eq!(tool_calls(&rec_public, "tools/list"), 1);
    // A private list with no auth context is used once and not stored.
    let anonymous_ctx = Caller::agent("a");
    h.list_tools(&anonymous_ctx).await.expect("list");
    h.list_tools(&anonymous_ctx).await.expect("list");
    assert_eq!(tool_calls(&rec_private, "tools/list"), 4);
    let stats = h.cache_stats();
    assert!(stats.l1.hits >= 2 && stats.l1.bytes > 0, "{stats:?}");
    h.shutdown().await;
}

#[tokio::test]
async fn a_warm_start_from_the_disk_cache_sends_no_tools_list() {
    let dir = scratch_dir().join("warm");
    let _ = std::fs::remove_dir_all(&dir);
    let record = temp_file("warm");
    let server = demo("alpha", &["--record", &record.to_string_lossy()]);
    let cfg = on_disk(config(vec![server], &["a"]), &dir);
    let a = Caller::agent("a");

    let h = harness(cfg.clone()).await;
    let cold = h.list_tools(&a).await.expect("cold");
    assert!(!cold.is_empty() && cold.iter().all(|t| !t.from_cache));
    h.shutdown().await;
    assert_eq!(tool_calls(&record, "tools/list"), 1);

    let h = harness(cfg).await;
    let warm = h.list_tools(&a).await.expect("warm");
    assert_eq!(warm.len(), cold.len());
    assert!(warm.iter().all(|t| t.from_cache));
    assert_eq!(
        tool_calls(&record, "tools/list"),
        1,
        "no tools/list to a server whose entries are fresh"
    );
    assert_eq!(h.cache_stats().l2.hits, 1);
    h.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn each_page_a_listing_wants_is_one_lookup_counted() {
    let dir = scratch_dir().join("counted");
    let _ = std::fs::remove_dir_all(&dir);
    // Three pages, so that the walk's later pages are counted as the first is.
    let server = demo("s", &["--page-size", "20"]);
    let cfg = on_disk(config(vec![server], &["a"]), &dir);
    let a = Caller::agent("a");
    let h = harness(cfg.clone()).await;
    h.list_tools(&a).await.expect("cold");
    let pages = h.cache_stats().l1.entries as u64;
    assert!(pages >= 2, "{:?}", h.cache_stats());
    // Missed once: a walk that fetched a page reads the rest from the server (its
    // pages must be of one version of the list).
    let cold = h.cache_stats();
    assert_eq!((cold.l1.hits, cold.l1.misses), (0, 1), "{cold:?}");
    assert_eq!((cold.l2.hits, cold.l2.misses), (0, 1), "{cold:?}");
    h.list_tools(&a).await.expect("warm");
    let warm = h.cache_stats();
    assert_eq!((warm.l1.hits, warm.l1.misses), (pages, 1), "{warm:?}");
    assert_eq!(warm.l2.misses, 1, "memory served them: {warm:?}");
    h.shutdown().await;

    // Another run: each page found on disk once, and then in memory.
    let h = harness(cfg).await;
    h.list_tools(&a).await.expect("from disk");
    let st = h.cache_stats();
    assert_eq!((st.l1.hits, st.l1.misses), (0, pages), "{st:?}");
    assert_eq!((st.l2.hits, st.l2.misses), (pages, 0), "{st:?}");
    h.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A demo server `id` recording to `record`, started with `flags` and then what `file`
/// holds at each start (its config the same, as a server upgraded in place).
fn demo_reading_flag(
    id: &str,
    record: &std::path::Path,
    flags: &str,
    file: &std::path::Path,
) -> ServerConfig {
    let script = format!(
        "exec \"$0\" demo-server {id} --record '{}' {flags} \"$(cat '{}')\"",
        record.display(),
        file.display()
    );
    let mut server = demo(id, &[]);
    server.transport =
        mcp_harness::TransportSpec::stdio("sh", ["-c".to_string(), script, harness_exe()]);
    server
}

// A server that speaks another protocol version after an upgrade between two runs (here
// a legacy server answering `initialize` with the version a file names, its config the
// same) has its list read again, not served from the disk the run before wrote; one
// that speaks the same version still has it served from there.
#[tokio::test]
async fn a_disk_list_is_not_served_to_a_server_that_speaks_another_version_since() {
    let dir = scratch_dir().join("version-disk");
    let _ = std::fs::remove_dir_all(&dir);
    let record = temp_file("version-disk");
    let version = temp_file("version-disk-speaks");
    let flags = "--era legacy --legacy-version";
    let server = demo_reading_flag("alpha", &record, flags, &version);
    let mut cfg = config(vec![server], &["a"]);
    cfg.cache = CacheConfig {
        dir: Some(dir.clone()),
        default_ttl: Duration::from_secs(600),
        ..CacheConfig::default()
    };
    // A legacy server's lists are private: kept for one auth context.
    let a = Caller::agent("a").with_auth_context("ctx");
    let run = |speaks: &'static str| {
        std::fs::write(&version, speaks).expect("version file");
        let cfg = cfg.clone();
        let a = a.clone();
        async move {
            let h = harness(cfg).await;
            let tools = h.list_tools(&a).await.expect("list");
            assert!(!tools.is_empty());
            h.shutdown().await;
        }
    };
    run("2025-06-18").await;
    assert_eq!(tool_calls(&record, "tools/list"), 1);
    run("2025-11-25").await;
    assert_eq!(
        tool_calls(&record, "tools/list"),
        2,
        "read again in the new version"
    );
    run("2025-11-25").await;
    assert_eq!(tool_calls(&record, "tools/list"), 2, "served from the disk");
    let _ = std::fs::remove_dir_all(&dir);
}

// A server that comes back from a restart speaking another version (here a legacy
// server upgraded to a modern one that does not announce list changes, so that no
// subscription reads its lists again) has its lists read again: those of the old
// version are of another shape.
#[tokio::test]
async fn a_server_back_in_another_version_has_its_lists_read_again() {
    let record = temp_file("era-change");
    let era = temp_file("era-change-era");
    std::fs::write(&era, "legacy").expect("era file");
    let server = demo_reading_flag("alpha", &record, "--no-list-changed --era", &era);
    let mut cfg = config(vec![server], &["a"]);
    cfg.cache = CacheConfig {
        default_ttl: Duration::from_secs(600),
        ..CacheConfig::default()
    };
    // A legacy server's lists are private: kept for one auth context.
    let a = Caller::agent("a").with_auth_context("ctx");
    let h = harness(cfg).await;
    assert!(!h.list_tools(&a).await.expect("list").is_empty());
    assert!(!h.list_tools(&a).await.expect("list").is_empty());
    assert_eq!(tool_calls(&record, "tools/list"), 1, "cached");
    std::fs::write(&era, "modern").expect("era file");
    h.restart_server("alpha").await.expect("restart");
    assert!(
        eventually(Duration::from_secs(30), || h
            .server_status("alpha")
            .is_some_and(|s| s.state == ServerState::Ready
                && s.era == Some(mcp_harness::transport::Era::Modern)))
        .await,
        "back, modern"
    );
    // The old lists are dropped in the background once it is back.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while tool_calls(&record, "tools/list") < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the old version's list is still served"
        );
        let _ = h.list_tools(&a).await.expect("list");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    h.shutdown().await;
}

/// Whether `a`'s listing holds `confirm` (the demo's `--tools-need-elicitation` lists it
/// only to a client that can answer it).
async fn lists_confirm(h: &HarnessHandle, a: &Caller) -> bool {
    let tools = h.list_tools(a).await.expect("list");
    tools.iter().any(|t| &*t.name == "confirm")
}

/// Waits up to 10 s for `a`'s listing to hold `confirm` (a cache invalidation runs in
/// the background: a listing right after it may come first).
async fn until_confirm_is_listed(h: &HarnessHandle, a: &Caller) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !lists_confirm(h, a).await {
        assert!(
            std::time::Instant::now() < deadline,
            "the old list, without the tools that ask, is still served"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// A list is kept under what the server was told of its client: a harness started again
// with another handler does not serve from the disk what was listed without it (nor the
// other way round), while one started as before still does.
#[tokio::test]
async fn a_restart_with_other_handlers_does_not_serve_the_disk_list_asked_without_them() {
    let dir = scratch_dir().join("caps-disk");
    let _ = std::fs::remove_dir_all(&dir);
    let record = temp_file("caps-disk");
    let server = demo(
        "alpha",
        &[
            "--tools-need-elicitation",
            "--record",
            &record.to_string_lossy(),
        ],
    );
    let mut cfg = config(vec![server], &["a"]);
    cfg.cache = CacheConfig {
        dir: Some(dir.clone()),
        ..CacheConfig::default()
    };
    let a = Caller::agent("a");
    let with_handler = || {
        Harness::builder(cfg.clone())
            .input_handler("elicitation/create", accept_all())
            .spawn()
    };

    let h = harness(cfg.clone()).await;
    assert!(!lists_confirm(&h, &a).await);
    h.shutdown().await;
    let h = with_handler().await.expect("spawn");
    assert!(lists_confirm(&h, &a).await, "asked again with the handler");
    h.shutdown().await;
    assert_eq!(tool_calls(&record, "tools/list"), 2);

    // Both lists are on the disk now, each under its own client.
    let h = harness(cfg.clone()).await;
    assert!(!lists_confirm(&h, &a).await);
    h.shutdown().await;
    let h = with_handler().await.expect("spawn");
    assert!(lists_confirm(&h, &a).await);
    h.shutdown().await;
    assert_eq!(
        tool_calls(&record, "tools/list"),
        2,
        "both served from the disk"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// A modern server takes the client's capabilities with each request, and may list by
// them: a handler registered at run time drops what it listed before (that list was
// served from the cache, without the tools that ask, until its ttl ran out).
#[tokio::test]
async fn a_handler_registered_at_run_time_is_seen_in_a_modern_servers_next_listing() {
    let cfg = config(vec![demo("alpha", &["--tools-need-elicitation"])], &["a"]);
    let h = harness(cfg).await;
    let a = Caller::agent("a");
    assert!(!lists_confirm(&h, &a).await);
    assert!(
        h.list_tools(&a)
            .await
            .expect("list")
            .iter()
            .all(|t| t.from_cache),
        "the second listing is the cache's"
    );
    h.register_input_handler("elicitation/create", accept_all())
        .await
        .expect("register");
    until_confirm_is_listed(&h, &a).await;
    h.shutdown().await;
}

// The handshake's methods are the connection's own: a raw one is refused, and the
// server never sees it (a raw `initialize` would begin a session nobody ends).
#[tokio::test]
async fn a_raw_request_of_a_handshake_method_is_refused() {
    let record = temp_file("raw-handshake");
    let rec = record.to_string_lossy().into_owned();
    let h = harness(config(
        vec![demo("alpha", &["--era", "legacy", "--record", &rec])],
        &["a"],
    ))
    .await;
    let before = recorded(&record).len();
    for method in ["initialize", "server/discover"] {
        let e = h
            .request("alpha", method, Some(json!({})))
            .await
            .expect_err(method);
        assert_eq!(
            e,
            mcp_harness::HarnessError::ConnectionsOwn(method.into()),
            "{method}"
        );
    }
    assert_eq!(recorded(&record).len(), before, "nothing sent");
    h.request("alpha", "tools/list", None)
        .await
        .expect("others go");
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
}

// A legacy server's reconnection with new capabilities that fails (its new process
// exits at once, twice) is tried again, and the server comes to declare them. Before, one
// failure left it declared the old ones until some later change or crash: here it
// never listed the tools that ask.
#[tokio::test]
async fn a_failed_handover_to_new_capabilities_is_tried_again() {
    let starts = temp_file("handover-starts");
    let script = format!(
        "n=$(cat {f} 2>/dev/null || echo 0); echo $((n+1)) > {f}; case $n in 1|2) exit 3;; esac; \
         exec {exe} demo-server alpha --era legacy --tools-need-elicitation",
        f = starts.display(),
        exe = harness_exe(),
    );
    let mut alpha = demo("alpha", &[]);
    alpha.transport = ServerConfig::stdio("alpha", "sh", vec!["-c".to_string(), script]).transport;
    let h = harness(config(vec![alpha], &["a"])).await;
    let a = Caller::agent("a");
    assert!(!lists_confirm(&h, &a).await);
    h.register_input_handler("elicitation/create", accept_all())
        .await
        .expect("register");
    until_confirm_is_listed(&h, &a).await;
    let started = std::fs::read_to_string(&starts).expect("starts");
    // The first try starts it twice (a process that exits at once is started again
    // to be asked the legacy way), the second once.
    assert_eq!(
        started.trim(),
        "4",
        "a handover that failed, then one that worked"
    );
    h.shutdown().await;
}

// The same while the server is down: it declares them at its next connection, and is
// not listed again then (it announces no list changes), so its cached list is dropped
// when the handler comes.
#[tokio::test]
async fn a_handler_registered_while_a_modern_server_restarts_is_seen_once_it_is_back() {
    let mut alpha = demo("alpha", &["--tools-need-elicitation", "--no-list-changed"]);
    alpha.restart.min_delay = Duration::from_secs(1);
    alpha.restart.max_delay = Duration::from_secs(1);
    let h = harness(config(vec![alpha], &["a"])).await;
    let a = Caller::agent("a");
    assert!(!lists_confirm(&h, &a).await);
    let _ = h
        .request("alpha", "tools/call", call("crash", json!({"code": 3})))
        .await;
    assert!(
        eventually(Duration::from_secs(10), || h
            .server_status("alpha")
            .is_some_and(|s| s.state == ServerState::Restarting))
        .await
    );
    h.register_input_handler("elicitation/create", accept_all())
        .await
        .expect("register");
    assert!(
        eventually(Duration::from_secs(20), || h
            .server_status("alpha")
            .is_some_and(|s| s.state == ServerState::Ready))
        .await
    );
    until_confirm_is_listed(&h, &a).await;
    h.shutdown().await;
}

#[tokio::test]
async fn an_mrtr_tool_completes_after_three_rounds_with_keys_and_state_kept() {
    let record = temp_file("rounds");
    let audit = temp_file("rounds-audit");
    let mut cfg = config(
        vec![demo("alpha", &["--record", &record.to_string_lossy()])],
        &["a"],
    );
    cfg.audit = AuditConfig {
        path: Some(audit.clone()),
        ..AuditConfig::default()
    };
    let h = harness(cfg).await;
    h.register_input_handler("elicitation/create", accept_all())
        .await
        .expect("register");
    let a = Caller::agent("a");
    let r = h
        .call_tool(&a, "rounds", json!({"n": 3}))
        .await
        .expect("rounds");
    assert_eq!(
        text(&r),
        "answers: a-q0,a-q1,a-q2",
        "each answer went back under its key"
    );
    // confirm checks its requestState byte for byte.
    let r = h
        .call_tool(&a, "confirm", json!({"message": "Ship?"}))
        .await
        .expect("confirm");
    assert_eq!(text(&r), "approved: true");
    h.shutdown().await;
    let calls: Vec<Value> = recorded(&record)
        .into_iter()
        .filter(|r| r["method"] == "tools/call")
        .collect();
    assert_eq!(calls.len(), 6, "3 rounds + 1 and 1 round + 1");
    let ids: std::collections::HashSet<String> =
        calls.iter().map(|c| c["id"].to_string()).collect();
    assert_eq!(ids.len(), 6, "every retry has a new JSON-RPC id");
    assert!(calls[1]["params"]["inputResponses"]["q0"].is_object());
    assert_eq!(
        calls[1]["params"]["arguments"],
        json!({"n": 3}),
        "the original params on every retry"
    );
    assert!(
        calls[0]["params"].get("requestState").is_none(),
        "no state invented"
    );
    let finished: Vec<Value> = recorded(&audit)
        .into_iter()
        .filter(|r| r["event"] == "finished")
        .collect();
    assert_eq!(finished[0]["rounds"].as_array().map(Vec::len), Some(3));
    assert_eq!(
        finished[0]["rounds"][0]["methods"],
        json!(["elicitation/create"])
    );
}

#[tokio::test]
async fn a_server_asking_for_input_forever_is_stopped_at_the_cap() {
    let record = temp_file("forever");
    let mut cfg = config(
        vec![demo("alpha", &["--record", &record.to_string_lossy()])],
        &["a"],
    );
    cfg.round_cap = 4;
    let h = harness(cfg).await;
    let err = h
        .call_tool(&Caller::agent("a"), "forever", json!({}))
        .await
        .expect_err("cap");
    assert!(matches!(err, CallError::RoundCap { cap: 4, .. }), "{err}");
    h.shutdown().await;
    assert_eq!(
        tool_calls(&record, "tools/call"),
        5,
        "the first request and four retries"
    );
}

#[tokio::test]
async fn a_missing_capability_is_reported_with_what_is_required_and_not_retried() {
    let record = temp_file("cap");
    let h = harness(config(
        vec![demo("alpha", &["--record", &record.to_string_lossy()])],
        &["a"],
    ))
    .await;
    let err = h
        .call_tool(&Caller::agent("a"), "confirm", json!({}))
        .await
        .expect_err("-32021");
    match &err {
        CallError::MissingCapability { required, .. } => {
            assert_eq!(required, &json!({"elicitation": {}}))
        }
        other => panic!("expected MissingCapability, got {other}"),
    }
    h.shutdown().await;
    assert_eq!(tool_calls(&record, "tools/call"), 1);
}

/// The demo server `alpha`, its elicitations waiting in an approval queue.
async fn asking_a_queue() -> (HarnessHandle, ApprovalQueue) {
    let h = harness(config(vec![demo("alpha", &[])], &["a"])).await;
    let queue = ApprovalQueue::new(Duration::from_secs(120));
    h.register_input_handler("elicitation/create", Arc::new(queue.clone()))
        .await
        .expect("register");
    (h, queue)
}

#[tokio::test]
async fn a_call_whose_deadline_passes_while_a_person_is_asked_ends_as_past_its_deadline() {
    let (h, _queue) = asking_a_queue().await;
    let options = mcp_harness::CallOptions {
        timeout: Some(Duration::from_millis(700)),
        ..mcp_harness::CallOptions::default()
    };
    // Nobody answers: the handler is cut off where the call's deadline is.
    let e = h
        .call(
            &Caller::agent("a"),
            mcp_harness::CallKind::Tool,
            "confirm",
            json!({"message": "Pay?"}),
            options,
        )
        .await
        .expect_err("past its deadline");
    assert!(matches!(e, CallError::DeadlineExceeded(_)), "{e:?}");
    assert_eq!(e.code(), "deadline");
    h.shutdown().await;
}

#[tokio::test]
async fn an_answer_that_ends_the_call_ends_its_round_and_withdraws_the_questions_left() {
    let (h, queue) = asking_a_queue().await;
    let a = Caller::agent("a");
    let call = {
        let (h, a) = (h.clone(), a.clone());
        tokio::spawn(async move { h.call_tool(&a, "many_inputs", json!({"n": 2})).await })
    };
    assert!(
        eventually(Duration::from_secs(10), || queue.pending().len() == 2).await,
        "both questions asked"
    );
    let first = queue.pending()[0].id;
    assert!(queue.answer(first, json!({"action": "decline"})));
    // Not held until the other question is answered or times out.
    let err = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("the call ends with the declined answer")
        .expect("join")
        .expect_err("declined");
    assert!(
        matches!(&err, CallError::InputDeclined { action, .. } if action == "decline"),
        "{err}"
    );
    assert!(
        eventually(Duration::from_secs(5), || queue.pending().is_empty()).await,
        "the question left is withdrawn: {:?}",
        queue.pending()
    );
    h.shutdown().await;
}

#[tokio::test]
async fn a_declined_elicitation_ends_the_call_and_an_approval_queue_can_answer() {
    let (h, queue) = asking_a_queue().await;
    let a = Caller::agent("a");
    let call = {
        let (h, a) = (h.clone(), a.clone());
        tokio::spawn(async move { h.call_tool(&a, "confirm", json!({"message": "Pay?"})).await })
    };
    let pending = tokio::time::timeout(Duration::from_secs(10), queue.next_pending())
        .await
        .expect("asked");
    assert_eq!(pending[0].request.params["message"], "Pay?");
    assert_eq!(pending[0].request.agent_id.as_deref(), Some("a"));
    assert!(queue.answer(pending[0].id, json!({"action": "decline"})));
    let err = call.await.expect("join").expect_err("declined");
    assert!(
        matches!(&err, CallError::InputDeclined { action, .. } if action == "decline"),
        "{err}"
    );
    h.shutdown().await;
}

// A legacy server's own questions during a call are in the call's `finished` record,
// each with how it ended; one asked while the call's grant is revoked is withdrawn
// (the person no longer asked) and refused, as a round's is. Before, the record said
// nothing of them and the question stayed asked.
#[tokio::test]
async fn a_legacy_servers_questions_are_audited_and_withdrawn_when_the_grant_goes() {
    let audit = temp_file("legacy-questions.jsonl");
    let mut cfg = config(vec![demo("leg", &["--era", "legacy"])], &["a"]);
    cfg.audit = AuditConfig {
        path: Some(audit.clone()),
        ..AuditConfig::default()
    };
    let h = harness(cfg).await;
    let queue = ApprovalQueue::new(Duration::from_secs(120));
    h.register_input_handler("elicitation/create", Arc::new(queue.clone()))
        .await
        .expect("register");
    let a = Caller::agent("a");
    let confirm = |h: &HarnessHandle| {
        let (h, a) = (h.clone(), a.clone());
        tokio::spawn(async move { h.call_tool(&a, "confirm", json!({"message": "Pay?"})).await })
    };
    let asked = || async {
        tokio::time::timeout(Duration::from_secs(30), queue.next_pending())
            .await
            .expect("asked")
    };
    let call = confirm(&h);
    let pending = asked().await;
    assert!(queue.answer(
        pending[0].id,
        json!({"action": "accept", "content": {"approved": true}})
    ));
    let r = call.await.expect("join").expect("answered");
    assert_eq!(text(&r), "approved: true");
    // Declined by the person: the server's call goes on, and the record says
    // declined (the only trace of the "no"), not answered.
    let call = confirm(&h);
    let pending = asked().await;
    assert!(queue.answer(pending[0].id, json!({"action": "decline"})));
    call.await.expect("join").expect("the call goes on");

    let call = confirm(&h);
    asked().await;
    h.revoke("a", None).await.expect("revoke");
    assert!(
        eventually(Duration::from_secs(10), || queue.pending().is_empty()).await,
        "the question is withdrawn"
    );
    // The demo server passes the refusal on as its call's error.
    let ended = call.await.expect("join");
    assert!(
        matches!(&ended, Err(CallError::Server(ServerError::Rpc { error, .. })) if error.code == -1),
        "{ended:?}"
    );
    // A question still waiting when its call ends (past its deadline) is recorded too.
    h.grant("a", "*", &["*"]).await.expect("grant");
    let options = mcp_harness::CallOptions {
        timeout: Some(Duration::from_secs(3)),
        ..Default::default()
    };
    let late = {
        let (h, a) = (h.clone(), a.clone());
        tokio::spawn(async move {
            let message = json!({"message": "Late?"});
            h.call(&a, CallKind::Tool, "confirm", message, options)
                .await
        })
    };
    asked().await;
    let late = late.await.expect("join");
    assert!(late.is_err(), "{late:?}");
    h.shutdown().await;
    let finished: Vec<Value> = audit_records(&audit)
        .into_iter()
        .filter(|r| r["event"] == "finished")
        .collect();
    assert_eq!(finished.len(), 4, "{finished:?}");
    let question = |r: &Value| {
        (
            r["questions"][0]["method"].clone(),
            r["questions"][0]["outcome"].clone(),
        )
    };
    assert_eq!(
        question(&finished[0]),
        (json!("elicitation/create"), json!("answered"))
    );
    assert_eq!(
        question(&finished[1]),
        (json!("elicitation/create"), json!("declined"))
    );
    assert_eq!(
        question(&finished[2]),
        (json!("elicitation/create"), json!("refused"))
    );
    // Withdrawn as its call ended, or still open when the record was written.
    let (method, outcome) = question(&finished[3]);
    assert_eq!(method, "elicitation/create");
    assert!(
        outcome == "withdrawn" || outcome == "unanswered",
        "{outcome}"
    );
    assert_eq!(finished[0]["questions"][0]["server"], "leg");
}

#[tokio::test]
async fn legacy_server_requests_go_to_the_same_handlers() {
    let h = Harness::spawn(config(vec![], &["a"])).await.expect("spawn");
    h.register_input_handler("elicitation/create", accept_all())
        .await
        .expect("register");
    h.add_server(demo("beta", &["--era", "legacy"]))
        .await
        .expect("add");
    assert!(
        eventually(Duration::from_secs(30), || h
            .server_status("beta")
            .is_some_and(|s| s.state == ServerState::Ready))
        .await
    );
    let r = h
        .call_tool(&Caller::agent("a"), "confirm", json!({"message": "ok?"}))
        .await
        .expect("legacy elicitation");
    assert_eq!(text(&r), "approved: true");
    let r = h
        .call_tool(&Caller::agent("a"), "rounds", json!({"n": 2}))
        .await
        .expect("legacy rounds");
    assert_eq!(text(&r), "answers: a-,a-");
    h.shutdown().await;
}

/// A legacy demo server whose every start waits a second before the process reads
/// anything (`more`: further arguments, quoted for `sh`).
fn slow_legacy(id: &str, more: &str) -> ServerConfig {
    let script = format!(
        "sleep 1; exec '{}' demo-server {id} --era legacy {more}",
        harness_exe()
    );
    ServerConfig::stdio(id, "sh", ["-c".to_string(), script])
}

#[tokio::test]
async fn a_handler_registered_while_a_legacy_server_connects_is_declared_to_it() {
    let record = temp_file("capabilities-record");
    // Its handshake is under way when the handler is registered.
    let record_arg = format!("--record '{}'", record.display());
    let server = slow_legacy("slow", &record_arg);
    let h = Harness::spawn(config(vec![server], &["a"]))
        .await
        .expect("spawn");
    h.register_input_handler("elicitation/create", accept_all())
        .await
        .expect("register");
    let initialized = || -> Vec<Value> {
        std::fs::read_to_string(&record)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|r| r["method"] == "initialize")
            .map(|r| r["params"]["capabilities"].clone())
            .collect()
    };
    // It connected with what was declared when its connect started, and is then
    // connected again with the handler's capability (it was kept without it until its
    // next crash).
    assert!(
        eventually(Duration::from_secs(30), || initialized()
            .last()
            .is_some_and(|c| c.get("elicitation").is_some()))
        .await,
        "{:?}",
        initialized()
    );
    let r = h
        .call_tool(&Caller::agent("a"), "confirm", json!({"message": "ok?"}))
        .await
        .expect("legacy elicitation");
    assert_eq!(text(&r), "approved: true");
    h.shutdown().await;
}

#[tokio::test]
async fn a_legacy_server_that_dies_during_a_handover_restarts_and_serves_the_calls_that_waited() {
    // The handover that a new handler starts is under way when the server is killed.
    let mut server = slow_legacy("dying", "");
    server.restart.min_delay = Duration::from_millis(100);
    let h = start_ready(config(vec![server], &["a"])).await;
    let pid = h.server_status("dying").and_then(|s| s.pid).expect("pid");
    h.register_input_handler("elicitation/create", accept_all())
        .await
        .expect("register");
    // SAFETY: kill sends a signal; the pid is our own child's.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    assert!(
        eventually(Duration::from_secs(10), || h
            .server_status("dying")
            .is_some_and(|s| s.state == ServerState::Restarting))
        .await
    );
    // Waits in the queue for the restart, and is served by it (it had waited to its
    // deadline: the handover, up, was taken for a ready server and the queue forgotten).
    let r = h
        .call_tool(&Caller::agent("a"), "dying__echo", json!({"text": "after"}))
        .await
        .expect("served after the restart");
    assert_eq!(text(&r), "after");
    let status = h.server_status("dying").expect("status");
    assert_eq!(status.state, ServerState::Ready);
    assert!(status.ready_at.is_some(), "its uptime is counted");
    assert_ne!(status.pid, Some(pid));
    h.shutdown().await;
}

// A handover (a new handler's capability declared to a legacy server) starts a new
// process: its uptime counts from then, not from the process it replaced.
#[tokio::test]
async fn a_handover_counts_the_new_connections_uptime_from_its_start() {
    let h = start_ready(config(vec![demo("leg", &["--era", "legacy"])], &["a"])).await;
    let before = h.server_status("leg").expect("status");
    let (pid, ready_at) = (before.pid, before.ready_at.expect("ready"));
    h.register_input_handler("elicitation/create", accept_all())
        .await
        .expect("register");
    assert!(
        eventually(Duration::from_secs(20), || h
            .server_status("leg")
            .is_some_and(|s| s.state == ServerState::Ready && s.pid != pid))
        .await,
        "handed over to a new process"
    );
    let after = h.server_status("leg").expect("status");
    assert!(
        after.ready_at.is_some_and(|t| t > ready_at),
        "{:?} after {ready_at:?}",
        after.ready_at
    );
    h.shutdown().await;
}

// Calls running all through handovers (each new handler's capability declared to a
// legacy server by a new process) all succeed: the new connection is published before
// the old one drains, and the drain waits for requests that read the old one just
// before. Before, a request could meet the old connection already shut.
#[tokio::test]
async fn calls_running_through_handovers_all_succeed() {
    let h = start_ready(config(vec![demo("leg", &["--era", "legacy"])], &["a"])).await;
    let running = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let loops: Vec<_> = (0..32)
        .map(|i| {
            let (h, running) = (h.clone(), running.clone());
            tokio::spawn(async move {
                let mut failures = Vec::new();
                while running.load(std::sync::atomic::Ordering::SeqCst) {
                    if let Err(e) = h
                        .call_tool(&Caller::agent("a"), "leg__echo", json!({"text": i}))
                        .await
                    {
                        failures.push(e.to_string());
                    }
                }
                failures
            })
        })
        .collect();
    for method in ["elicitation/create", "sampling/createMessage", "roots/list"] {
        let pid = h.server_status("leg").and_then(|s| s.pid);
        h.register_input_handler(method, accept_all())
            .await
            .expect("register");
        assert!(
            eventually(Duration::from_secs(20), || h
                .server_status("leg")
                .is_some_and(|s| s.state == ServerState::Ready && s.pid != pid))
            .await,
            "handed over to a new process for {method}"
        );
    }
    // The last old connection drains meanwhile.
    tokio::time::sleep(Duration::from_millis(1000)).await; // (deliberate)
    running.store(false, std::sync::atomic::Ordering::SeqCst);
    let mut failures = Vec::new();
    for l in loops {
        failures.extend(l.await.expect("join"));
    }
    assert!(
        failures.is_empty(),
        "{} failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    h.shutdown().await;
}

#[tokio::test]
async fn legacy_list_changed_invalidates_the_cache() {
    let record = temp_file("changed");
    let h = harness(config(
        vec![demo(
            "beta",
            &["--era", "legacy", "--record", &record.to_string_lossy()],
        )],
        &["a"],
    ))
    .await;
    let a = Caller::agent("a").with_auth_context("ctx");
    h.list_tools(&a).await.expect("list");
    assert!(
        eventually(Duration::from_secs(5), || h.cache_stats().l1.entries == 1).await,
        "legacy lists use the default ttl"
    );
    assert!(
        h.list_tools(&a)
            .await
            .expect("list")
            .iter()
            .all(|t| t.from_cache)
    );
    h.call_tool(&a, "notify_changed", json!({}))
        .await
        .expect("notify");
    assert!(
        eventually(Duration::from_secs(5), || h.cache_stats().l1.entries == 0).await,
        "list_changed dropped the entry"
    );
    assert!(
        h.list_tools(&a)
            .await
            .expect("list")
            .iter()
            .all(|t| !t.from_cache)
    );
    // Three reads: the first, the harness's own on the change (so it can announce
    // ToolsChanged; without a context, a private list is not kept), and this caller's.
    assert!(
        eventually(Duration::from_secs(5), || tool_calls(&record, "tools/list")
            == 3)
        .await,
        "{}",
        tool_calls(&record, "tools/list")
    );
    h.shutdown().await;
}

#[tokio::test]
async fn anonymous_and_ungranted_callers_are_denied_audited_and_never_reach_a_server() {
    let record = temp_file("denied");
    let audit = temp_file("denied-audit");
    let mut grants = everyone(&[]);
    grants.insert(
        "reader".into(),
        [("alpha".to_string(), vec!["echo".to_string()])].into(),
    );
    let mut cfg = HarnessConfig {
        servers: vec![demo("alpha", &["--record", &record.to_string_lossy()])],
        permissions: grants,
        ..HarnessConfig::default()
    };
    cfg.audit = AuditConfig {
        path: Some(audit.clone()),
        ..AuditConfig::default()
    };
    let h = harness(cfg).await;
    let anonymous = Caller::default();
    let err = h
        .call_tool(&anonymous, "echo", json!({"text": "x"}))
        .await
        .expect_err("anonymous");
    assert!(
        matches!(&err, CallError::Denied { agent: None, .. }),
        "{err}"
    );
    let err = h
        .call_tool(&Caller::agent("stranger"), "alpha__echo", json!({}))
        .await
        .expect_err("stranger");
    assert!(
        matches!(&err, CallError::Denied { agent: Some(a), server: Some(s), tool } if a == "stranger" && s == "alpha" && tool == "echo"),
        "{err}"
    );
    let reader = Caller::agent("reader");
    let err = h
        .call_tool(&reader, "add", json!({"a": 1, "b": 2}))
        .await
        .expect_err("not granted");
    assert!(matches!(&err, CallError::Denied { .. }), "{err}");
    assert_eq!(
        text(
            &h.call_tool(&reader, "echo", json!({"text": "ok"}))
                .await
                .expect("granted")
        ),
        "ok"
    );
    let visible = h.list_tools(&reader).await.expect("list");
    assert_eq!(
        visible.iter().map(|t| &*t.qualified).collect::<Vec<_>>(),
        ["alpha__echo"]
    );
    // Grants change at run time; one that would match nothing is refused, as in a config.
    let err = h
        .grant("stranger", "alpha", &["ad*"])
        .await
        .expect_err("no patterns");
    assert!(err.to_string().contains("no patterns"), "{err}");
    h.grant("stranger", "alpha", &["add"]).await.expect("grant");
    assert_eq!(
        text(
            &h.call_tool(&Caller::agent("stranger"), "add", json!({"a": 1, "b": 2}))
                .await
                .expect("now granted")
        ),
        "3"
    );
    h.revoke("stranger", None).await.expect("revoke");
    assert!(
        h.call_tool(&Caller::agent("stranger"), "add", json!({"a": 1, "b": 2}))
            .await
            .is_err()
    );
    h.shutdown().await;
    let calls: Vec<Value> = recorded(&record)
        .into_iter()
        .filter(|r| r["method"] == "tools/call")
        .collect();
    assert_eq!(calls.len(), 2, "denied calls never reach the server");
    let denied = recorded(&audit)
        .into_iter()
        .filter(|r| r["error"] == "denied")
        .count();
    assert_eq!(denied, 4);
}

#[tokio::test]
async fn n_calls_leave_exactly_n_started_and_n_finished_records() {
    let audit = temp_file("audit");
    let mut cfg = config(vec![demo("alpha", &[])], &["a"]);
    cfg.audit = AuditConfig {
        path: Some(audit.clone()),
        redaction: Redaction::Full,
        ..AuditConfig::default()
    };
    let h = harness(cfg).await;
    let a = Caller::agent("a").with_auth_context("secret-context");
    let mut tasks = Vec::new();
    for n in 0..30 {
        let (h, a) = (h.clone(), a.clone());
        tasks.push(tokio::spawn(async move {
            match n % 3 {
                0 => {
                    h.call_tool(&a, "echo", json!({"text": "x", "password": "hunter2"}))
                        .await
                }
                1 => h.call_tool(&a, "no_such_tool", json!({})).await,
                _ => h.call_tool(&Caller::default(), "echo", json!({})).await,
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    h.shutdown().await;
    let records = recorded(&audit);
    let started: Vec<&Value> = records.iter().filter(|r| r["event"] == "started").collect();
    let finished: Vec<&Value> = records
        .iter()
        .filter(|r| r["event"] == "finished")
        .collect();
    assert_eq!((started.len(), finished.len()), (30, 30));
    let mut a: Vec<u64> = started
        .iter()
        .filter_map(|r| r["call_id"].as_u64())
        .collect();
    let mut b: Vec<u64> = finished
        .iter()
        .filter_map(|r| r["call_id"].as_u64())
        .collect();
    a.sort();
    b.sort();
    assert_eq!(a, b, "every started call finished");
    assert!(
        finished
            .iter()
            .any(|r| r["outcome"] == "ok" && r["server"] == "alpha")
    );
    assert!(finished.iter().any(|r| r["error"] == "no_route"));
    let text_all = std::fs::read_to_string(&audit).expect("audit");
    assert!(
        !text_all.contains("hunter2") && !text_all.contains("secret-context"),
        "redacted and hashed"
    );
}

#[tokio::test]
async fn tools_are_listed_qualified_in_order_filtered_by_tag_and_prompts_and_resources_route() {
    let mut alpha = demo("alpha", &[]);
    alpha.tags = vec!["core".into()];
    let beta = demo("beta", &["--era", "legacy"]);
    let h = harness(config(vec![alpha, beta], &["a"])).await;
    let a = Caller::agent("a");
    let all = h.list_tools(&a).await.expect("list");
    let names: Vec<&str> = all.iter().map(|t| &*t.qualified).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "deterministic order");
    assert!(names.contains(&"alpha__echo") && names.contains(&"beta__echo"));
    let core = h.list_tools_tagged(&a, "core").await.expect("tagged");
    assert!(!core.is_empty() && core.iter().all(|t| &*t.server == "alpha"));
    let schema = h.get_tool_schema(&a, "beta__add").await.expect("schema");
    assert_eq!(
        schema.definition["inputSchema"]["required"],
        json!(["a", "b"])
    );
    let p = h
        .get_prompt(&a, "greet", json!({"who": "Ada"}))
        .await
        .expect("prompt");
    assert!(
        p["messages"][0]["content"]["text"]
            .as_str()
            .is_some_and(|t| t.contains("Ada"))
    );
    let r = h
        .read_resource(&a, "demo://readme")
        .await
        .expect("resource");
    assert!(
        r["contents"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("mcp-harness"))
    );
    let status = h.status();
    assert!(
        status
            .iter()
            .all(|s| s.profile.as_ref().and_then(|p| p.instructions()).is_some())
    );
    h.shutdown().await;
}

// A resource URI no list names (a template's) is asked of each server with resources
// in turn until one serves it; before, the first server's "not found" ended the read.
// While a server could not be listed, none is asked: the URI may be that server's (a
// secret in it), and another's answer would pass for it. Before, the next server
// ranked was asked, and its answer returned as the resource.
#[tokio::test]
async fn an_unlisted_resource_is_asked_of_each_server_but_not_while_one_is_unlisted() {
    let mut first = demo("first", &[]);
    first.priority = 10;
    let second = demo("second", &["--resource-template"]);
    let h = harness(config(vec![first, second], &["a"])).await;
    let a = Caller::agent("a");
    let r = h
        .read_resource(&a, "demo://echo/hello")
        .await
        .expect("the second server serves it");
    assert_eq!(r["contents"][0]["text"], "hello");
    h.shutdown().await;

    // The URI may be the slow server's, whose list does not come in time.
    let mut slow = demo("slow", &["--list-delay-ms", "5000"]);
    slow.timeout = Duration::from_millis(300);
    let quick = demo("quick", &["--resource-template"]);
    let h = harness(config(vec![quick, slow], &["a"])).await;
    let e = h
        .read_resource(&a, "demo://echo/token")
        .await
        .expect_err("not guessed");
    assert!(
        matches!(&e, CallError::NoRoute { unreachable, .. } if unreachable.iter().any(|u| u.server == "slow")),
        "{e}"
    );
    h.shutdown().await;

    // A server stopped on purpose does not hold the others' resources back.
    let mut off = demo("off", &[]);
    off.enabled = false;
    let quick = demo("quick", &["--resource-template"]);
    let h = Harness::spawn(config(vec![off, quick], &["a"]))
        .await
        .expect("spawn");
    let ready = || {
        h.server_status("quick")
            .is_some_and(|s| s.state == ServerState::Ready)
    };
    assert!(eventually(Duration::from_secs(30), ready).await);
    let r = h.read_resource(&a, "demo://echo/hi").await.expect("served");
    assert_eq!(r["contents"][0]["text"], "hi");
    h.shutdown().await;
}

// Resource templates are listed (by their own uriTemplate) to those who may read
// anything of their server, and a URI no list names is asked first of the servers
// whose templates make it: before, it was asked of every server with resources in
// rank order, the first seeing a URI (a secret in it, maybe) that was never its. A URI
// no template makes is still asked of each in turn.
#[tokio::test]
async fn a_uri_a_template_makes_is_read_first_where_the_template_is() {
    let record = temp_file("templates-first");
    // Of one priority: a template orders servers within their rank alone.
    let first = demo("first", &["--record", &record.to_string_lossy()]);
    let second = demo("second", &["--resource-template"]);
    let third = demo("third", &["--no-templates-method"]);
    let mut cfg = config(vec![first, second, third], &["a"]);
    cfg.permissions
        .entry("some".into())
        .or_default()
        .insert("second".into(), vec!["demo://readme".into()]);
    let h = harness(cfg).await;
    let a = Caller::agent("a");
    let templates = h.list_resource_templates(&a).await.expect("templates");
    let listed: Vec<(&str, &str)> = templates.iter().map(|t| (&*t.server, &*t.name)).collect();
    assert_eq!(listed, [("second", "demo://echo/{text}")]);
    assert_eq!(templates[0].definition["name"], "echo");
    // A server without the method has no templates; it is not one that failed.
    let listing = h
        .listing(&a, ListKind::ResourceTemplates, None)
        .await
        .expect("listing");
    assert!(listing.unreachable.is_empty(), "{:?}", listing.unreachable);
    let reads = || tool_calls(&record, "resources/read");
    let r = h
        .read_resource(&a, "demo://echo/hello")
        .await
        .expect("read where the template is, first");
    assert_eq!(r["contents"][0]["text"], "hello");
    assert_eq!(reads(), 0, "the first server never saw the URI");
    let e = h.read_resource(&a, "demo://nowhere/x").await;
    assert!(e.is_err(), "no server has it: {e:?}");
    assert_eq!(reads(), 1, "a URI no template makes is asked of each");
    // Listed resources are the caller's; templates only with the whole server.
    let resources = h.list_resources(&a).await.expect("resources");
    assert!(resources.iter().any(|r| &*r.name == "demo://readme"));
    let some = Caller::agent("some");
    assert!(
        h.list_resource_templates(&some)
            .await
            .expect("none")
            .is_empty()
    );
    let resources = h.list_resources(&some).await.expect("resources");
    assert_eq!(resources.len(), 1, "{resources:?}");
    h.shutdown().await;
}

// A server's list cannot steer reads: a URI it lists that reads as another server's
// qualified name (`bank__x`) is named qualified by it (`evil__bank__x`), and read on
// it; and a URI it lists where the caller may not read it there does not keep the read
// from the servers where the caller may (before, the read was denied).
#[tokio::test]
async fn a_servers_list_neither_steers_a_read_elsewhere_nor_blocks_it() {
    let (bank_record, evil_record) = (temp_file("bank"), temp_file("evil"));
    let bank = demo("bank", &["--record", &bank_record.to_string_lossy()]);
    let evil = demo(
        "evil",
        &[
            "--record",
            &evil_record.to_string_lossy(),
            "--list-resource",
            "bank__x",
            "--list-resource",
            "demo://echo/hi",
        ],
    );
    let files = demo("files", &["--resource-template"]);
    let mut cfg = config(vec![bank, evil, files], &["a"]);
    cfg.permissions.entry("b".into()).or_default().extend([
        ("files".to_string(), vec!["*".to_string()]),
        ("evil".to_string(), vec!["demo://readme".to_string()]),
    ]);
    let h = harness(cfg).await;
    let a = Caller::agent("a");
    let listed = h.list_resources(&a).await.expect("resources");
    let odd = listed
        .iter()
        .find(|r| &*r.name == "bank__x")
        .expect("listed");
    assert_eq!((&*odd.server, &*odd.qualified), ("evil", "evil__bank__x"));
    let read = h
        .read_resource(&a, &odd.qualified)
        .await
        .expect("read on evil");
    assert_eq!(read["contents"][0]["text"], "listed bank__x");
    let reads = |record| {
        recorded(record)
            .into_iter()
            .filter(|r| r["method"] == "resources/read")
            .map(|r| r["params"]["uri"].clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(reads(&evil_record), [json!("bank__x")]);
    assert!(reads(&bank_record).is_empty(), "bank never saw the read");
    // b may read anything on files, and only the readme on evil, which lists the URI.
    let b = Caller::agent("b");
    let read = h
        .read_resource(&b, "demo://echo/hi")
        .await
        .expect("read on files");
    assert_eq!(read["contents"][0]["text"], "hi");
    h.shutdown().await;
}

// A list read while its server said its lists changed is handed out as fresh for no
// time (its caller asked before the change), not for its ttl: a gateway's client told
// of the change before the list came would keep the old one.
#[tokio::test]
async fn a_list_overtaken_by_a_change_while_read_is_fresh_for_no_time() {
    let record = temp_file("overtaken");
    let s = demo(
        "s",
        &[
            "--era",
            "legacy",
            "--list-delay-ms",
            "1500",
            "--record",
            &record.to_string_lossy(),
        ],
    );
    let h = harness(config(vec![s], &["a"])).await;
    // A legacy server's list is private: kept for a caller with a context.
    let a = Caller::agent("a").with_auth_context("ctx");
    let lists = tool_calls(&record, "tools/list");
    let listing = {
        let h = h.clone();
        let a = a.clone();
        tokio::spawn(async move { h.listing(&a, ListKind::Tools, None).await })
    };
    // Changed once the server has the list's request (it answers 1.5 s later).
    assert!(
        eventually(Duration::from_secs(10), || tool_calls(
            &record,
            "tools/list"
        ) > lists)
        .await
    );
    h.call_tool(&a, "s__grow", json!({})).await.expect("grow");
    let listing = listing.await.expect("task").expect("listing");
    assert!(!listing.items.is_empty());
    assert_eq!(listing.fresh_for, Duration::ZERO, "overtaken");
    // Read again once the change is taken in (changes are coalesced): fresh for its
    // time.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let again = h.listing(&a, ListKind::Tools, None).await.expect("listing");
    assert!(again.fresh_for > Duration::ZERO);
    assert!(
        again.items.iter().any(|t| t.name.starts_with("grown")),
        "{:?}",
        again.items.iter().map(|t| &*t.name).collect::<Vec<_>>()
    );
    h.shutdown().await;
}

// Whether a bare name is denied follows from the grants alone: a tool the caller may
// not use is denied whether or not a server offers it, and no server is listed for it
// (before, one offered was denied and one not offered had no route: which ungranted
// tools exist could be found out by trying).
#[tokio::test]
async fn a_bare_name_no_grant_allows_is_denied_whether_offered_or_not() {
    let record = temp_file("oracle");
    let s = demo("s", &["--record", &record.to_string_lossy()]);
    let mut cfg = config(vec![s], &[]);
    cfg.permissions
        .entry("a".into())
        .or_default()
        .insert("s".into(), vec!["echo".into()]);
    let h = harness(cfg).await;
    let a = Caller::agent("a");
    let lists = || tool_calls(&record, "tools/list");
    let before = lists();
    for name in ["add", "no_such_tool"] {
        let e = h.call_tool(&a, name, json!({})).await.expect_err(name);
        assert!(matches!(e, CallError::Denied { .. }), "{name}: {e:?}");
    }
    assert_eq!(lists(), before, "nothing was listed for them");
    h.call_tool(&a, "echo", json!({"text": "x"}))
        .await
        .expect("the granted one, bare");
    h.shutdown().await;
}

// A template is a server's own claim: it does not put the server before one the
// operator ranked higher, and one that names no scheme (`{+u}`, every URI) orders
// nothing. A listing's `server__uri` is read on that server alone, not taken for a URI
// no list names and asked of every server in turn.
#[tokio::test]
async fn a_template_claiming_every_uri_goes_before_no_one_and_a_qualified_uri_is_read_where_it_names()
 {
    let a = Caller::agent("a");
    let record = temp_file("claims-every-uri");
    let claims = |templates: &[&str]| {
        let mut args = vec!["--record".to_string(), record.to_string_lossy().to_string()];
        for t in templates {
            args.extend(["--list-template".to_string(), t.to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        demo("evil", &args)
    };
    let reads = || tool_calls(&record, "resources/read");
    // Served by `docs`, which lists no template of it.
    let uri = "demo://echo/secret";

    let mut docs = demo("docs", &["--resource-template", "--no-templates-method"]);
    docs.priority = 10;
    let h = harness(config(vec![claims(&["demo://{+u}"]), docs], &["a"])).await;
    let r = h.read_resource(&a, uri).await.expect("read");
    assert_eq!(r["contents"][0]["text"], "secret");
    assert_eq!(reads(), 0, "the higher priority asked first");
    h.shutdown().await;

    let docs = demo("docs", &["--resource-template", "--no-templates-method"]);
    let h = harness(config(vec![docs, claims(&["{+u}"])], &["a"])).await;
    let r = h.read_resource(&a, uri).await.expect("read");
    assert_eq!(r["contents"][0]["text"], "secret");
    assert_eq!(reads(), 0, "a template of no scheme orders nothing");
    let listed = h.list_resources(&a).await.expect("resources");
    let readme = listed
        .iter()
        .find(|r| &*r.server == "docs" && &*r.name == "demo://readme")
        .expect("listed");
    assert_eq!(&*readme.qualified, "docs__demo://readme");
    let r = h
        .read_resource(&a, &readme.qualified)
        .await
        .expect("read where it names");
    assert_eq!(r["contents"][0]["uri"], "demo://readme");
    let e = h.read_resource(&a, "nowhere__demo://readme").await;
    assert!(matches!(e, Err(CallError::NoRoute { .. })), "{e:?}");
    assert_eq!(reads(), 0, "neither asked of the other server");
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
}

// A resource URI's credentials (its userinfo, a query's signature) reach no audit
// record, whether its read fails or not:
// not the started record's name, nor the failover hops' errors (a server's "not found"
// quotes the URI), nor the finished record's message.
#[tokio::test]
async fn a_resource_uris_credentials_reach_no_audit_record() {
    let audit = temp_file("uri-credentials-audit");
    let mut cfg = config(vec![demo("first", &[]), demo("second", &[])], &["a"]);
    cfg.audit = AuditConfig {
        path: Some(audit.clone()),
        flush_every: Duration::from_millis(20),
        ..AuditConfig::default()
    };
    let h = harness(cfg).await;
    let uri = "https://user:sekrit-tok@example.invalid/x?X-Amz-Signature=sig-sekrit&page=2";
    let e = h.read_resource(&Caller::agent("a"), uri).await;
    assert!(e.is_err(), "no server has it: {e:?}");
    h.shutdown().await;
    let text = std::fs::read_to_string(&audit).expect("audit");
    assert!(text.contains("\"hops\":[{"), "both servers asked: {text}");
    assert!(
        text.contains("https://[redacted]@example.invalid/x?X-Amz-Signature=[redacted]&page=2"),
        "{text}"
    );
    assert!(!text.contains("sekrit"), "{text}");
}

// An agent learns nothing of which server ids exist from what it cannot use: a server
// it holds no grant on is denied alike, there or not. Before, a missing one was "no
// route" and an existing one "denied".
#[tokio::test]
async fn a_server_an_agent_cannot_use_is_denied_whether_it_exists_or_not() {
    let mut cfg = config(vec![demo("alpha", &[]), demo("beta", &[])], &["all"]);
    cfg.permissions
        .entry("some".into())
        .or_default()
        .insert("alpha".into(), vec!["*".into()]);
    let h = harness(cfg).await;
    let some = Caller::agent("some");
    for name in ["beta__echo", "gamma__echo"] {
        let e = h.call_tool(&some, name, json!({"text": "x"})).await;
        assert!(matches!(e, Err(CallError::Denied { .. })), "{name}: {e:?}");
    }
    let e = h
        .call_tool(&Caller::agent("all"), "gamma__echo", json!({"text": "x"}))
        .await;
    assert!(matches!(e, Err(CallError::NoRoute { .. })), "{e:?}");
    h.shutdown().await;
}

/// Agent a's call of the bare name `echo` with half a second to run, on a task: its
/// listing leads the walk of a slow server's list and runs out of time.
fn hurried_echo(h: &HarnessHandle) -> tokio::task::JoinHandle<Result<Value, CallError>> {
    let h = h.clone();
    tokio::spawn(async move {
        let options = mcp_harness::CallOptions {
            timeout: Some(Duration::from_millis(500)),
            ..Default::default()
        };
        let a = Caller::agent("a");
        h.call(&a, CallKind::Tool, "echo", json!({"text": "x"}), options)
            .await
    })
}

// A list fetched for a caller whose deadline is near is shared with callers who join
// it, but its running out of that caller's time is not: they fetch it again within
// their own deadline. Before, a listing with minutes left left the server out, told
// it had not answered within the first caller's half second.
#[tokio::test]
async fn a_listing_joined_is_not_failed_by_the_first_callers_deadline() {
    let h = harness(config(
        vec![demo("slow", &["--list-delay-ms", "1500"])],
        &["a"],
    ))
    .await;
    let hurried = hurried_echo(&h);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let listing = h
        .listing(&Caller::agent("a"), CallKind::Tool, None)
        .await
        .expect("listed");
    assert!(listing.unreachable.is_empty(), "{:?}", listing.unreachable);
    let names: Vec<&str> = listing.items.iter().map(|t| &*t.qualified).collect();
    assert!(names.contains(&"slow__echo"), "{names:?}");
    let hurried = hurried.await.expect("join");
    assert!(hurried.is_err(), "its half second ran out: {hurried:?}");
    h.shutdown().await;
}

// A listing that joined a walk whose caller ran out of time walks again, and looks its
// first page up again uncounted: its own look, before it joined, was the one counted.
#[tokio::test]
async fn a_listing_walked_again_after_its_leader_gave_up_counts_its_look_once() {
    let record = temp_file("walked-again");
    let r = record.to_string_lossy().into_owned();
    let slow = demo("slow", &["--list-delay-ms", "1500", "--record", &r]);
    let h = harness(config(vec![slow], &["a"])).await;
    let hurried = hurried_echo(&h);
    // Once the hurried call's walk asks the server: the listing joins it.
    assert!(
        eventually(Duration::from_secs(10), || tool_calls(
            &record,
            "tools/list"
        ) >= 1)
        .await
    );
    let listing = h
        .listing(&Caller::agent("a"), CallKind::Tool, None)
        .await
        .expect("listed");
    assert!(!listing.items.is_empty());
    assert!(hurried.await.expect("join").is_err(), "its time ran out");
    // Two looks, one each: the hurried call's, and the listing's before it joined.
    let st = h.cache_stats();
    assert_eq!((st.l1.hits, st.l1.misses), (0, 2), "{st:?}");
    h.listing(&Caller::agent("a"), CallKind::Tool, None)
        .await
        .expect("listed again");
    assert_eq!(h.cache_stats().l1.hits, 1, "the walk again cached it");
    assert_eq!(
        tool_calls(&record, "tools/list"),
        2,
        "the walk, then the walk again"
    );
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
}

// A name no server offers is "no route", with no server named as one that could not be
// asked when the only ones not asked are disabled, or have said they offer no tools.
// Before, they were named, as if the name might be served once they were back.
#[tokio::test]
async fn a_disabled_server_is_not_named_among_those_a_bare_name_could_not_ask() {
    let mut off = demo("off", &[]);
    off.enabled = false;
    let h = harness(config(vec![demo("alpha", &[])], &["a"])).await;
    h.add_server(off).await.expect("added");
    let e = h
        .call_tool(&Caller::agent("a"), "no_such_tool", json!({}))
        .await;
    assert!(
        matches!(&e, Err(CallError::NoRoute { unreachable, .. }) if unreachable.is_empty()),
        "{e:?}"
    );
    h.shutdown().await;
}

// A change that comes while a changed list is being read has the list read once more,
// so that the change is heard of (ToolsChanged) with no caller listing: the read under
// way may have been answered before it.
#[tokio::test]
async fn a_tool_list_change_during_its_reread_has_it_read_once_more() {
    let record = temp_file("reread");
    let rec = record.to_string_lossy().into_owned();
    let h = harness(config(
        vec![demo(
            "beta",
            &[
                "--era",
                "legacy",
                "--list-delay-ms",
                "2000",
                "--record",
                &rec,
            ],
        )],
        &["a"],
    ))
    .await;
    let a = Caller::agent("a");
    h.list_tools(&a).await.expect("list");
    let mut events = h.subscribe();
    // The first change has the list read again; the second comes during that read,
    // whose answer the server made when asked (it holds it back 2 s).
    h.call_tool(&a, "beta__grow", json!({}))
        .await
        .expect("grow");
    assert!(
        eventually(Duration::from_secs(10), || tool_calls(
            &record,
            "tools/list"
        ) == 2)
        .await,
        "the list is read again"
    );
    h.call_tool(&a, "beta__grow", json!({}))
        .await
        .expect("grow");
    use mcp_harness::registry::HarnessEvent;
    // The read under way began before the second change dropped the lists: its
    // answer is old news, not compared; the read once more is, and announced.
    assert!(
        eventually(Duration::from_secs(10), || tool_calls(
            &record,
            "tools/list"
        ) == 3)
        .await,
        "read once more"
    );
    let mut heard = 0;
    let mut until = tokio::time::Instant::now() + Duration::from_secs(15);
    while let Ok(Ok(event)) = tokio::time::timeout_at(until, events.recv()).await {
        if matches!(event, HarnessEvent::ToolsChanged { .. }) {
            heard += 1;
            // Old news would come within the 2 s the server holds each answer.
            until = tokio::time::Instant::now() + Duration::from_secs(3);
        }
    }
    assert_eq!(heard, 1, "the change heard of once, with no one listing");
    let tools = h.list_tools(&a).await.expect("list");
    assert!(
        tools.iter().any(|t| t.name.as_ref() == "grown_1"),
        "{tools:?}"
    );
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
}

#[tokio::test]
async fn a_changed_tool_list_emits_a_schema_change_event() {
    let h = harness(config(vec![demo("beta", &["--era", "legacy"])], &["a"])).await;
    let mut events = h.subscribe();
    let a = Caller::agent("a").with_auth_context("ctx");
    let before = h.list_tools(&a).await.expect("list").len();
    h.call_tool(&a, "grow", json!({})).await.expect("grow");
    assert!(eventually(Duration::from_secs(5), || h.cache_stats().l1.entries == 0).await);
    let after = h.list_tools(&a).await.expect("list");
    assert_eq!(after.len(), before + 1);
    // First the server's own list_changed, then the changed schemas the listing found.
    use mcp_harness::registry::HarnessEvent;
    let mut seen = Vec::new();
    while !seen
        .iter()
        .any(|e| matches!(e, HarnessEvent::ToolsChanged { server, .. } if server == "beta"))
    {
        let event = tokio::time::timeout(Duration::from_secs(5), events.recv())
            .await
            .expect("in time")
            .expect("event");
        seen.push(event);
    }
    assert!(
        matches!(&seen[0], HarnessEvent::ListsChanged { server, tools: true, .. } if server == "beta"),
        "{seen:?}"
    );
    h.shutdown().await;
}

// To route a bare name, a server whose first page is cached but whose next has expired
// is read in a task of its own, beside the others': the servers after it are not
// listed only once it is done (each here takes 2 s; in turn they would pass the
// call's deadline).
#[tokio::test]
async fn a_slow_server_with_a_stale_later_page_does_not_hold_up_the_others_listings() {
    let slow = demo(
        "slow",
        &[
            "--page-size",
            "40",
            "--page-ttls",
            "600000,1",
            "--list-delay-ms",
            "2000",
        ],
    );
    // Never cached: listed on every route, 2 s each time.
    let quick = demo(
        "quick",
        &[
            "--tool-alias",
            "only_quick",
            "--ttl-ms",
            "0",
            "--list-delay-ms",
            "2000",
        ],
    );
    let h = start_ready(config(vec![slow, quick], &["a"])).await;
    let a = Caller::agent("a");
    // Both lists cached; the slow one's second page expires at once.
    let listed = h.list_tools(&a).await.expect("list");
    let slow = listed.iter().filter(|t| &*t.server == "slow").count();
    assert!((41..=80).contains(&slow), "two pages: {slow}");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let options = mcp_harness::CallOptions {
        timeout: Some(Duration::from_millis(3200)),
        ..Default::default()
    };
    let r = h
        .call(
            &a,
            mcp_harness::CallKind::Tool,
            "only_quick",
            json!({}),
            options,
        )
        .await
        .expect("routed to quick within the deadline");
    assert_eq!(text(&r), "quick");
    h.shutdown().await;
}

// A restarting server whose first page is still fresh in the cache but a later one is
// not is left out of a listing too: its later page waited in the restart queue (here
// the 30 s until it was back) and held up every listing, and the bare-name calls of the
// agents granted it for part of their time, the tool on another server.
#[tokio::test]
async fn a_restarting_server_with_a_stale_later_page_does_not_hold_up_bare_calls() {
    let flaky = demo("flaky", &["--page-size", "40", "--page-ttls", "600000,1"]);
    let quick = demo("quick", &["--tool-alias", "only_quick"]);
    let h = start_ready(config(vec![flaky, quick], &["a"])).await;
    let a = Caller::agent("a");
    let listed = h.list_tools(&a).await.expect("list");
    assert!(listed.iter().filter(|t| &*t.server == "flaky").count() > 40);
    tokio::time::sleep(Duration::from_millis(20)).await;
    // Down, and back only in 30 s.
    let pid = h.server_status("flaky").and_then(|s| s.pid).expect("pid");
    sigkill(pid);
    assert!(
        eventually(Duration::from_secs(10), || h
            .server_status("flaky")
            .is_some_and(|s| s.state == ServerState::Restarting))
        .await
    );
    let options = mcp_harness::CallOptions {
        timeout: Some(Duration::from_secs(3)),
        ..Default::default()
    };
    let r = h
        .call(&a, CallKind::Tool, "only_quick", json!({}), options)
        .await
        .expect("routed to quick within the deadline");
    assert_eq!(text(&r), "quick");
    // And a listing names the server it could not ask at once.
    let listing = h.listing(&a, ListKind::Tools, None).await.expect("listing");
    assert!(
        listing
            .unreachable
            .iter()
            .any(|(u, _)| u.server == "flaky" && u.state == ServerState::Restarting),
        "{:?}",
        listing.unreachable
    );
    h.shutdown().await;
}

// A delegated resource read that continues on its server (a round's answers going back
// to it) is routed there alone: another granted server that cannot be listed now does
// not leave a URI no list names unrouted, as it does a fresh read's.
#[tokio::test]
async fn a_resource_reads_round_goes_back_to_its_server_whatever_the_others() {
    let slow = demo("slow", &["--list-delay-ms", "10000"]);
    let template = demo("tmpl", &["--resource-template"]);
    let h = start_ready(config(vec![slow, template], &["a"])).await;
    let a = Caller::agent("a");
    let options = mcp_harness::CallOptions {
        timeout: Some(Duration::from_secs(2)),
        ..Default::default()
    };
    // Routed by listing: not while `slow`, which may have resources, cannot be listed
    // (the listing takes the call's time).
    let fresh = h
        .call(
            &a,
            mcp_harness::CallKind::Resource,
            "demo://echo/x",
            json!({}),
            options.clone(),
        )
        .await;
    assert!(
        matches!(
            fresh,
            Err(CallError::NoRoute { .. } | CallError::DeadlineExceeded(_))
        ),
        "{fresh:?}"
    );
    let continued = h
        .call_delegated(
            &a,
            mcp_harness::CallKind::Resource,
            "demo://echo/x",
            json!({}),
            Some(mcp_harness::Delegation {
                capabilities: json!({}),
                server: Some("tmpl".into()),
                ..Default::default()
            }),
            options,
        )
        .await
        .expect("read on its server");
    assert_eq!(continued.result["contents"][0]["text"], "x");
    h.shutdown().await;
}
