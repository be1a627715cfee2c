//! `subscriptions/listen` upstream: for 2026-07-28 servers that announce list changes,
//! the harness holds a subscription open on each connection (stdio: on the pipe; HTTP:
//! the long-lived POST), and a tool added upstream appears without waiting for the
//! TTL (60 s here) and without anyone listing: the change is read at once and
//! announced as `ToolsChanged`.

mod support;

use std::time::Duration;

use mcp_harness::registry::HarnessEvent;
use mcp_harness::{Caller, HarnessConfig, HarnessHandle, ServerConfig};
use serde_json::json;
use support::*;

fn a() -> Caller {
    Caller::agent("a")
}

fn config(server: ServerConfig) -> HarnessConfig {
    HarnessConfig {
        servers: vec![server],
        permissions: grant_everything(&["a"]),
        ..HarnessConfig::default()
    }
}

/// The bare names of the tools `h` lists.
async fn tool_names(h: &HarnessHandle) -> Vec<String> {
    h.list_tools(&a())
        .await
        .expect("list")
        .iter()
        .map(|t| t.name.to_string())
        .collect()
}

/// Waits (up to 10 s) for `ToolsChanged` of `server` on `events`.
async fn hear_tools_changed(
    events: &mut tokio::sync::broadcast::Receiver<HarnessEvent>,
    server: &str,
) {
    let heard = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match events.recv().await {
                Ok(HarnessEvent::ToolsChanged { server: s, .. }) if s == server => return true,
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => return false,
            }
        }
    })
    .await;
    assert_eq!(heard, Ok(true), "ToolsChanged for {server}");
}

/// Calls `grow` on `server` and waits for its `ToolsChanged` (nobody lists meanwhile;
/// the server's list must have been read once, to have something to differ from);
/// returns the tool list after it.
async fn grow_and_hear(h: &HarnessHandle, server: &str, cached: bool) -> Vec<String> {
    let mut events = h.subscribe();
    h.call_tool(&a(), &format!("{server}__grow"), json!({}))
        .await
        .expect("grow");
    hear_tools_changed(&mut events, server).await;
    let tools = h.list_tools(&a()).await.expect("list");
    // The demo server's lists are public, so the list read on the change is cached;
    // rmcp's carry no hints (private: not cached without an auth context).
    assert!(
        tools.iter().all(|t| t.from_cache == cached),
        "the changed list was read already"
    );
    tools.iter().map(|t| t.name.to_string()).collect()
}

/// Waits until `record` shows `n` `subscriptions/listen` requests.
async fn listens(record: &std::path::PathBuf, n: usize) -> bool {
    eventually(Duration::from_secs(10), || {
        recorded(record)
            .iter()
            .filter(|r| r["method"] == "subscriptions/listen")
            .count()
            >= n
    })
    .await
}

#[tokio::test]
async fn a_tool_added_to_a_modern_stdio_demo_server_appears_without_waiting_for_the_ttl() {
    let record = temp_file("listen-stdio");
    let rec = record.to_string_lossy().into_owned();
    let h = start_ready(config(demo_server("s", &["--record", &rec]))).await;
    let before = h.list_tools(&a()).await.expect("list").len();
    assert!(listens(&record, 1).await, "the harness subscribed");
    let listen = recorded(&record)
        .into_iter()
        .find(|r| r["method"] == "subscriptions/listen")
        .expect("listen");
    assert_eq!(
        listen["params"]["notifications"],
        json!({"toolsListChanged": true, "promptsListChanged": false, "resourcesListChanged": false}),
        "only what the server announces is asked for"
    );
    let names = grow_and_hear(&h, "s", true).await;
    assert_eq!(names.len(), before + 1);
    assert!(names.iter().any(|n| n == "grown_0"), "{names:?}");
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
}

#[tokio::test]
async fn a_tool_added_to_a_modern_http_demo_server_appears_over_the_long_lived_post() {
    let record = temp_file("listen-http");
    let rec = record.to_string_lossy().into_owned();
    let server = HttpServer::demo(&["web", "--record", &rec]).await;
    let h = start_ready(config(ServerConfig::new("web", server.spec()))).await;
    h.list_tools(&a()).await.expect("list");
    assert!(listens(&record, 1).await, "the harness subscribed");
    let names = grow_and_hear(&h, "web", true).await;
    assert!(names.iter().any(|n| n == "grown_0"), "{names:?}");
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
}

// A subscription the server ends is opened again; a server that cannot take it then
// (503: restarting behind its proxy), or holds it unacknowledged past the 10 s the
// acknowledgment has, is asked again, with backoff. Before, one failed re-open ended
// the listening for the connection's life.
#[tokio::test]
async fn a_subscription_that_cannot_be_opened_again_at_once_is_tried_again() {
    for (flag, status) in [
        ("--unavailable-listens", json!(503)),
        ("--silent-listens", json!("held")),
    ] {
        let record = temp_file("listen-reopen");
        let rec = record.to_string_lossy().into_owned();
        let server =
            HttpServer::demo(&["web", "--record", &rec, "--cancel-listens", flag, "1"]).await;
        let h = start_ready(config(ServerConfig::new("web", server.spec()))).await;
        h.list_tools(&a()).await.expect("list");
        assert!(listens(&record, 1).await, "the harness subscribed");
        let names = grow_and_hear(&h, "web", true).await;
        assert!(names.iter().any(|n| n == "grown_0"), "{names:?}");
        // Ended by the server, failed once, then open again.
        let again = eventually(Duration::from_secs(30), || {
            let lines = recorded(&record);
            let listens = lines
                .iter()
                .filter(|r| r["method"] == "subscriptions/listen");
            listens.clone().count() >= 3 && listens.filter(|r| r["status"] == status).count() == 1
        })
        .await;
        assert!(again, "{flag}: listened again after the failed re-open");
        let names = grow_and_hear(&h, "web", true).await;
        assert!(names.iter().any(|n| n == "grown_1"), "{flag}: {names:?}");
        h.shutdown().await;
        let _ = std::fs::remove_file(record);
    }
}

#[tokio::test]
async fn a_tool_added_to_an_rmcp_server_appears_without_waiting_for_the_ttl() {
    let mut server = ServerConfig::stdio("rm", rmcp_exe(), ["stdio"]);
    server.restart.min_delay = Duration::from_secs(30);
    let h = start_ready(config(server)).await;
    let before = tool_names(&h).await;
    assert!(!before.iter().any(|n| n == "extra"), "{before:?}");
    // rmcp acknowledges before its handler keeps the subscription's sink: wait until
    // the server has a subscriber to tell.
    let mut events = h.subscribe();
    let mut told = false;
    for _ in 0..100 {
        let out = h
            .call_tool(&a(), "rm__grow", json!({}))
            .await
            .expect("grow");
        if text(&out).ends_with("; 1 subscriptions told") {
            told = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(told, "the server has the harness's subscription");
    hear_tools_changed(&mut events, "rm").await;
    let names = tool_names(&h).await;
    assert!(names.iter().any(|n| n == "extra"), "{names:?}");
    h.shutdown().await;
}

#[tokio::test]
async fn a_subscription_the_server_ends_with_a_cancellation_is_opened_again() {
    let record = temp_file("listen-cancelled");
    let rec = record.to_string_lossy().into_owned();
    let h = start_ready(config(demo_server(
        "s",
        &["--record", &rec, "--cancel-listens"],
    )))
    .await;
    h.list_tools(&a()).await.expect("list");
    assert!(listens(&record, 1).await, "the harness subscribed");
    // The change is heard, then the server ends the subscription without a result.
    let names = grow_and_hear(&h, "s", true).await;
    assert!(names.iter().any(|n| n == "grown_0"), "{names:?}");
    assert!(
        listens(&record, 2).await,
        "the harness listened again after the server's cancellation"
    );
    // The subscription the server ended is not cancelled back (the new one is opened
    // a second later, so a cancellation would have been written by now).
    let first = recorded(&record)
        .into_iter()
        .find(|r| r["method"] == "subscriptions/listen")
        .map(|r| r["id"].clone())
        .expect("the first listen");
    let back: Vec<_> = recorded(&record)
        .into_iter()
        .filter(|r| {
            r["notification"] == "notifications/cancelled" && r["params"]["requestId"] == first
        })
        .collect();
    assert!(back.is_empty(), "cancelled back: {back:?}");
    // And the new subscription hears the next change.
    let names = grow_and_hear(&h, "s", true).await;
    assert!(names.iter().any(|n| n == "grown_1"), "{names:?}");
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
}

#[tokio::test]
async fn after_a_restart_the_subscription_is_opened_again_and_the_lists_read_again() {
    let record = temp_file("listen-restart");
    let rec = record.to_string_lossy().into_owned();
    let h = start_ready(config(demo_server("s", &["--record", &rec]))).await;
    h.list_tools(&a()).await.expect("list");
    assert!(listens(&record, 1).await);
    let lists_before = recorded(&record)
        .iter()
        .filter(|r| r["method"] == "tools/list")
        .count();
    h.restart_server("s").await.expect("restart");
    assert!(wait_state(&h, "s", mcp_harness::ServerState::Ready).await);
    assert!(
        listens(&record, 2).await,
        "subscribed again on the new process"
    );
    // Nothing is replayed: the list is read again once the new subscription is up.
    assert!(
        eventually(Duration::from_secs(10), || {
            recorded(&record)
                .iter()
                .filter(|r| r["method"] == "tools/list")
                .count()
                > lists_before
        })
        .await
    );
    let names = grow_and_hear(&h, "s", true).await;
    assert!(names.iter().any(|n| n == "grown_0"), "{names:?}");
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
}

/// How many `tools/list` requests `record` shows.
fn tool_lists(record: &std::path::PathBuf) -> usize {
    recorded(record)
        .iter()
        .filter(|r| r["method"] == "tools/list")
        .count()
}

// A server actor that died is replaced, and its server with it: the new actor's first
// subscription is opened again (nothing is replayed), so the lists are read again.
// Before, it counted as the server's very first one and the cache kept the old lists.
#[tokio::test]
async fn after_the_servers_actor_is_rebuilt_the_lists_are_read_again() {
    let record = temp_file("listen-rebuilt");
    let rec = record.to_string_lossy().into_owned();
    let mut server = demo_server("s", &["--record", &rec]);
    // The rebuild is a restart, held to the backoff.
    server.restart.min_delay = Duration::from_millis(100);
    let h = start_ready(config(server)).await;
    h.list_tools(&a()).await.expect("list");
    assert!(listens(&record, 1).await);
    let lists_before = tool_lists(&record);
    let old = h.server_actor("s").expect("actor");
    old.kill();
    assert!(
        eventually(Duration::from_secs(20), || h
            .server_actor("s")
            .is_some_and(|a| a.get_id() != old.get_id()))
        .await,
        "a new actor replaces the killed one"
    );
    assert!(wait_state(&h, "s", mcp_harness::ServerState::Ready).await);
    assert!(listens(&record, 2).await, "subscribed on the new process");
    assert!(
        eventually(Duration::from_secs(10), || tool_lists(&record)
            > lists_before)
        .await,
        "the lists are read again"
    );
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
}

// A legacy server that comes back from a restart is a new process whose change
// notifications while it was down reached nobody: its lists are read again, not kept
// until the default TTL.
#[tokio::test]
async fn a_legacy_server_back_from_a_restart_has_its_lists_read_again() {
    let record = temp_file("legacy-restart");
    let rec = record.to_string_lossy().into_owned();
    let h = start_ready(config(demo_server(
        "s",
        &["--era", "legacy", "--record", &rec],
    )))
    .await;
    // Legacy lists are private: kept under the caller's auth context.
    let caller = a().with_auth_context("ctx");
    h.list_tools(&caller).await.expect("list");
    h.list_tools(&caller).await.expect("list");
    let lists_before = tool_lists(&record);
    assert_eq!(lists_before, 1, "the second from the cache");
    let mut events = h.subscribe();
    h.restart_server("s").await.expect("restart");
    assert!(wait_state(&h, "s", mcp_harness::ServerState::Ready).await);
    let heard = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match events.recv().await {
                Ok(HarnessEvent::ListsChanged { server, tools, .. }) if server == "s" => {
                    return tools;
                }
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => return false,
            }
        }
    })
    .await;
    assert_eq!(heard, Ok(true), "ListsChanged for s");
    h.list_tools(&caller).await.expect("list");
    assert!(tool_lists(&record) > lists_before, "read again");
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
}
