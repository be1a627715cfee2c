//! The hostile-server corpus: one test per bad behaviour. Each ends in a typed error,
//! never a panic or a hang, and the harness keeps serving afterwards.

mod support;

use std::time::Duration;

use mcp_harness::protocol::ProtocolError;
use mcp_harness::transport::TransportError;
use mcp_harness::{
    CallError, CallKind, Caller, Harness, HarnessConfig, HarnessHandle, RestartConfig,
    ServerConfig, ServerError, ServerState,
};
use serde_json::{Value, json};
use support::*;

fn demo(id: &str, args: &[&str]) -> ServerConfig {
    let mut all = vec!["demo-server".to_string(), id.to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    let mut c = ServerConfig::stdio(id, harness_exe(), all);
    c.timeout = Duration::from_millis(800);
    c.restart = RestartConfig {
        min_delay: Duration::from_millis(20),
        max_delay: Duration::from_millis(100),
        ..RestartConfig::default()
    };
    c.restart.max_restarts = 50;
    c
}

async fn harness(servers: Vec<ServerConfig>) -> HarnessHandle {
    let mut config = HarnessConfig {
        servers,
        ..HarnessConfig::default()
    };
    config
        .permissions
        .entry("a".into())
        .or_default()
        .insert("*".into(), vec!["*".into()]);
    config.round_cap = 5;
    let h = Harness::spawn(config).await.expect("spawn");
    let ids: Vec<String> = h.status().iter().map(|s| s.id.clone()).collect();
    for id in &ids {
        assert!(ready(&h, id).await, "{id} ready");
    }
    h
}

/// Whether a call ended with its server's transport: closed under it, or timed out.
fn closed_or_timed_out(e: &CallError) -> bool {
    matches!(
        transport(e),
        TransportError::Closed { .. } | TransportError::Timeout(_)
    )
}

async fn ready(h: &HarnessHandle, id: &str) -> bool {
    eventually(Duration::from_secs(30), || {
        h.server_status(id)
            .is_some_and(|s| s.state == ServerState::Ready)
    })
    .await
}

async fn call(h: &HarnessHandle, tool: &str) -> Result<Value, CallError> {
    h.call_tool(&Caller::agent("a"), tool, json!({})).await
}

/// The harness still serves `server`: its echo answers (after a restart if needed).
async fn still_serving(h: &HarnessHandle, server: &str) {
    assert!(ready(h, server).await, "{server} is ready again");
    let r = h
        .call_tool(
            &Caller::agent("a"),
            &format!("{server}__echo"),
            json!({"text": "alive"}),
        )
        .await;
    assert_eq!(text(&r.expect("echo after the fault")), "alive");
}

/// Whether `server` runs another process than `pid` within `limit`.
async fn restarted_within(h: &HarnessHandle, server: &str, pid: u32, limit: Duration) -> bool {
    eventually(limit, || {
        h.server_status(server)
            .and_then(|s| s.pid)
            .is_some_and(|p| p != pid)
    })
    .await
}

fn transport(e: &CallError) -> &TransportError {
    match e {
        CallError::Server(
            ServerError::Transport { source, .. } | ServerError::TransportClosed { source, .. },
        ) => source,
        other => panic!("expected a transport error, got {other}"),
    }
}

#[tokio::test]
async fn invalid_json_is_skipped_and_its_call_times_out() {
    let h = harness(vec![demo("s", &[])]).await;
    let e = call(&h, "s__garbage").await.expect_err("garbage");
    assert!(matches!(transport(&e), TransportError::Timeout(_)), "{e}");
    still_serving(&h, "s").await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_batch_array_is_rejected_and_its_call_times_out() {
    let h = harness(vec![demo("s", &[])]).await;
    let e = call(&h, "s__batch").await.expect_err("batch");
    assert!(matches!(transport(&e), TransportError::Timeout(_)), "{e}");
    still_serving(&h, "s").await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_reply_with_an_unknown_id_is_ignored() {
    let h = harness(vec![demo("s", &[])]).await;
    let e = call(&h, "s__wrong_id").await.expect_err("unknown id");
    assert!(matches!(transport(&e), TransportError::Timeout(_)), "{e}");
    still_serving(&h, "s").await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_duplicate_reply_is_used_once() {
    let h = harness(vec![demo("s", &[])]).await;
    let r = call(&h, "s__duplicate")
        .await
        .expect("the first reply counts");
    assert_eq!(text(&r), "once");
    still_serving(&h, "s").await;
    h.shutdown().await;
}

#[tokio::test]
async fn result_and_error_together_fails_the_call_at_once() {
    let h = harness(vec![demo("s", &[])]).await;
    let e = call(&h, "s__both").await.expect_err("malformed");
    // The line names the call's id (found by the scan: the error comes first): a
    // protocol error now, not the call's deadline.
    assert!(matches!(transport(&e), TransportError::Protocol(_)), "{e}");
    still_serving(&h, "s").await;
    h.shutdown().await;
}

/// An error reply of the wrong shape (its code a string) names the call's id: the call
/// fails at once with a protocol error, not at its deadline.
#[tokio::test]
async fn an_error_reply_that_does_not_parse_fails_its_call_at_once() {
    let h = harness(vec![demo("s", &[])]).await;
    let e = h
        .call_tool(&Caller::agent("a"), "s__both", json!({"bad_error": true}))
        .await
        .expect_err("malformed");
    // A protocol error, not the timeout a skipped line ends in.
    assert!(matches!(transport(&e), TransportError::Protocol(_)), "{e}");
    still_serving(&h, "s").await;
    h.shutdown().await;
}

/// The line answers the call by its id, but its result does not parse (nesting past
/// the parser's limit): the call fails at once with a protocol error, not at its deadline.
#[tokio::test]
async fn a_reply_whose_result_does_not_parse_fails_its_call_at_once() {
    let h = harness(vec![demo("s", &[])]).await;
    let e = call(&h, "s__deep_result").await.expect_err("too deep");
    // A protocol error, not the timeout a skipped line ends in.
    assert!(matches!(transport(&e), TransportError::Protocol(_)), "{e}");
    still_serving(&h, "s").await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_line_past_the_size_limit_ends_the_connection_and_the_server_restarts() {
    // Writing 17 MiB takes a debug-built server a while on a loaded machine: the limit,
    // not the deadline, is what must end this call.
    let mut s = demo("s", &[]);
    s.timeout = Duration::from_secs(30);
    let h = harness(vec![s]).await;
    let e = h
        .call_tool(
            &Caller::agent("a"),
            "s__oversize",
            json!({"bytes": 17 * 1024 * 1024}),
        )
        .await
        .expect_err("too long");
    assert!(
        matches!(transport(&e), TransportError::LineTooLong { .. }),
        "{e}"
    );
    still_serving(&h, "s").await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_partial_line_then_eof_is_a_closed_transport() {
    let h = harness(vec![demo("s", &[])]).await;
    let e = call(&h, "s__partial_eof").await.expect_err("eof");
    assert!(
        matches!(transport(&e), TransportError::Closed { .. }),
        "{e}"
    );
    still_serving(&h, "s").await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_modern_server_sending_a_request_is_refused() {
    let h = harness(vec![demo("s", &[])]).await;
    let r = call(&h, "s__rogue_request")
        .await
        .expect("the tool reports the refusal");
    assert_eq!(text(&r), "client refused: -32600");
    still_serving(&h, "s").await;
    h.shutdown().await;
}

// Over HTTP, a 2026-07-28 server's request is dropped, never answered: a client of that
// version POSTs no response. Before, the harness POSTed its refusal (with its token, as
// a message the server could not take for a request).
#[tokio::test]
async fn a_modern_http_servers_request_is_dropped_not_answered() {
    let record = temp_file("modern-http-request");
    let r = record.to_string_lossy().into_owned();
    // Every answer an event stream, on which the tool's request goes.
    let server = HttpServer::demo(&["s", "--sse", "--record", &r]).await;
    let h = harness(vec![ServerConfig::new("s", server.spec())]).await;
    let options = mcp_harness::CallOptions {
        timeout: Some(Duration::from_secs(1)),
        ..Default::default()
    };
    let caller = Caller::agent("a");
    let called = h.call(
        &caller,
        CallKind::Tool,
        "s__rogue_request",
        json!({}),
        options,
    );
    let e = called.await.expect_err("unanswered, its tool waits");
    assert!(
        matches!(e, CallError::DeadlineExceeded(_)) || closed_or_timed_out(&e),
        "{e}"
    );
    let seen = recorded(&record);
    assert!(seen.iter().any(|r| r["method"] == "tools/call"), "{seen:?}");
    assert!(!seen.iter().any(|r| r.get("answer").is_some()), "{seen:?}");
    still_serving(&h, "s").await;
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
}

#[tokio::test]
async fn input_required_forever_stops_at_the_round_cap() {
    let h = harness(vec![demo("s", &[])]).await;
    let e = call(&h, "s__forever").await.expect_err("cap");
    assert!(matches!(e, CallError::RoundCap { cap: 5, .. }), "{e}");
    still_serving(&h, "s").await;
    h.shutdown().await;
}

#[tokio::test]
async fn input_required_with_neither_requests_nor_state_is_a_protocol_error() {
    let h = harness(vec![demo("s", &[])]).await;
    let e = call(&h, "s__empty_input_required")
        .await
        .expect_err("invalid");
    assert!(
        matches!(
            e,
            CallError::Server(ServerError::Protocol {
                source: ProtocolError::InvalidResult(_),
                ..
            })
        ),
        "{e}"
    );
    still_serving(&h, "s").await;
    h.shutdown().await;
}

#[tokio::test]
async fn an_unknown_result_type_is_invalid() {
    let h = harness(vec![demo("s", &[])]).await;
    let e = call(&h, "s__task_result")
        .await
        .expect_err("unknown resultType");
    assert!(
        matches!(&e, CallError::Server(ServerError::Protocol { source: ProtocolError::UnknownResultType(t), .. }) if t == "task"),
        "{e}"
    );
    still_serving(&h, "s").await;
    h.shutdown().await;
}

#[tokio::test]
async fn ten_thousand_tools_are_listed_and_a_50_mib_schema_is_refused_without_losing_the_others() {
    let h = harness(vec![
        demo("many", &["--extra-tools", "10000", "--page-size", "1000"]),
        demo("huge", &["--huge-schema", "50"]),
        demo("s", &[]),
    ])
    .await;
    let tools = h
        .list_tools(&Caller::agent("a").with_auth_context("x"))
        .await
        .expect("list");
    assert!(
        tools.iter().filter(|t| &*t.server == "many").count() > 10_000,
        "all pages followed"
    );
    assert!(
        tools.iter().all(|t| &*t.server != "huge"),
        "the huge list was refused (line too long), not loaded"
    );
    assert!(tools.iter().any(|t| &*t.server == "s"));
    still_serving(&h, "s").await;
    h.shutdown().await;
}

#[tokio::test]
async fn an_event_stream_that_never_ends_times_out() {
    let server = HttpServer::demo(&["web"]).await;
    let mut web = ServerConfig::http("web", &server.url);
    web.timeout = Duration::from_millis(500);
    let h = harness(vec![web]).await;
    let e = call(&h, "web__endless_stream").await.expect_err("endless");
    assert!(matches!(transport(&e), TransportError::Timeout(_)), "{e}");
    still_serving(&h, "web").await;
    h.shutdown().await;
}

#[tokio::test]
async fn an_http_reply_with_the_wrong_content_type_is_rejected() {
    let server = HttpServer::demo(&["web"]).await;
    let h = harness(vec![ServerConfig::http("web", &server.url)]).await;
    let e = call(&h, "web__wrong_content_type").await.expect_err("html");
    assert!(
        matches!(transport(&e), TransportError::UnexpectedContentType(t) if t.starts_with("text/html")),
        "{e}"
    );
    still_serving(&h, "web").await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_server_that_closes_stdout_but_keeps_running_is_replaced() {
    let h = harness(vec![demo("s", &[])]).await;
    let pid = h.server_status("s").and_then(|s| s.pid).expect("pid");
    let e = call(&h, "s__close_stdout").await.expect_err("closed");
    assert!(
        matches!(transport(&e), TransportError::Closed { .. }),
        "{e}"
    );
    still_serving(&h, "s").await;
    assert!(
        eventually(Duration::from_secs(10), || group_members(pid).is_empty()).await,
        "the old process was killed"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn a_server_that_ignores_sigterm_is_killed_at_shutdown() {
    let mut stubborn = demo("s", &["--ignore-sigterm"]);
    stubborn.timeout = Duration::from_secs(5);
    let h = harness(vec![stubborn]).await;
    let pid = h.server_status("s").and_then(|s| s.pid).expect("pid");
    h.shutdown().await;
    assert!(
        group_members(pid).is_empty(),
        "SIGKILL after SIGTERM was ignored"
    );
}

// A shutdown while a server is being removed (and takes its grace to stop) returns
// when that one has stopped too. Before, it counted only the servers still listed,
// returned at once, and the removed one was killed as its actor went, without its grace.
#[tokio::test]
async fn a_shutdown_during_a_removal_waits_for_the_removed_server() {
    let mut stubborn = demo("s", &["--ignore-sigterm"]);
    stubborn.timeout = Duration::from_secs(5);
    let h = harness(vec![stubborn, demo("t", &[])]).await;
    let pid = h.server_status("s").and_then(|s| s.pid).expect("pid");
    let removal = tokio::spawn({
        let h = h.clone();
        async move { h.remove_server("s").await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!group_members(pid).is_empty(), "still stopping");
    h.shutdown().await;
    assert!(
        group_members(pid).is_empty(),
        "shutdown returned while the removed server was still stopping"
    );
    let _ = removal.await;
}

// A server added while one of its id is still stopping (its removal given up on, or
// another task's) connects once the old one has stopped, as a replacement does: both
// may need one resource (a port, a lock file). Before, the new one started beside it.
#[tokio::test]
async fn a_server_added_while_one_of_its_id_stops_starts_once_it_has() {
    let mut stubborn = demo("s", &["--ignore-sigterm"]);
    stubborn.timeout = Duration::from_secs(5);
    let h = harness(vec![stubborn]).await;
    let old = h.server_status("s").and_then(|s| s.pid).expect("pid");
    let mut events = h.subscribe();
    let removal = tokio::spawn({
        let h = h.clone();
        async move { h.remove_server("s").await }
    });
    // The removal is under way (the stubborn server takes its grace), and given up on.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!group_members(old).is_empty(), "still stopping");
    removal.abort();
    h.add_server(demo("s", &[])).await.expect("added");
    let ready = || {
        h.server_status("s")
            .is_some_and(|s| s.state == ServerState::Ready && s.pid.is_some_and(|p| p != old))
    };
    assert!(
        eventually(Duration::from_secs(30), ready).await,
        "the new one started"
    );
    assert!(
        group_members(old).is_empty(),
        "the new server started beside the old one"
    );
    // The removal given up on still ends: the old one's lists dropped, which the new
    // one's are announced changed for, not as a server removed.
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match events.recv().await {
                Ok(mcp_harness::registry::HarnessEvent::ListsChanged { server, tools, .. })
                    if server == "s" =>
                {
                    return Ok(tools);
                }
                Ok(mcp_harness::registry::HarnessEvent::ServerRemoved { server }) => {
                    return Err(server);
                }
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(e) => panic!("events: {e}"),
            }
        }
    })
    .await;
    assert_eq!(
        ended,
        Ok(Ok(true)),
        "the removal ended, the lists announced changed"
    );
    assert!(
        h.server_status("s")
            .is_some_and(|s| s.state == ServerState::Ready)
    );
    h.shutdown().await;
}

// A second shutdown (another task's) returns when the first is done, no server process
// left; and a server added meanwhile is refused, not started after the servers to stop
// were counted. Before, the second returned at once, and the added server outlived the
// shutdown.
#[tokio::test]
async fn a_second_shutdown_waits_for_the_first_and_no_server_is_added_meanwhile() {
    let mut stubborn = demo("s", &["--ignore-sigterm"]);
    stubborn.timeout = Duration::from_secs(5);
    let h = harness(vec![stubborn]).await;
    let pid = h.server_status("s").and_then(|s| s.pid).expect("pid");
    let first = tokio::spawn({
        let h = h.clone();
        async move { h.shutdown().await }
    });
    // The stubborn server takes its grace to stop: the first shutdown is under way.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let added = h.add_server(demo("t", &[])).await;
    assert!(added.is_err(), "a server added during shutdown: {added:?}");
    h.shutdown().await;
    assert!(
        group_members(pid).is_empty(),
        "the second shutdown returned before the server was stopped"
    );
    assert!(
        first.is_finished() || eventually(Duration::from_secs(5), || first.is_finished()).await
    );
}

#[tokio::test]
async fn a_frozen_server_times_out_calls_and_then_recovers() {
    let h = harness(vec![demo("s", &[])]).await;
    h.call_tool(&Caller::agent("a"), "s__freeze", json!({"ms": 1500}))
        .await
        .expect("freeze");
    let e = call(&h, "s__echo").await.expect_err("frozen");
    assert!(matches!(transport(&e), TransportError::Timeout(_)), "{e}");
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let pid = h.server_status("s").and_then(|s| s.pid);
    still_serving(&h, "s").await;
    assert_eq!(
        h.server_status("s").and_then(|s| s.pid),
        pid,
        "not restarted"
    );
    h.shutdown().await;
}

// A server that writes nothing while a request waits out its timeout, nor answers
// the probe after it, is killed and restarted: before, it stayed `ready` for good,
// every call to it waiting out its timeout. The frozen one above answers the probe in
// time and keeps its process; so does one slow at a tool (`hang`), which still answers.
#[tokio::test]
async fn a_server_that_answers_nothing_not_even_a_probe_is_restarted() {
    let h = harness(vec![demo("s", &[])]).await;
    let pid = h.server_status("s").and_then(|s| s.pid).expect("pid");
    let e = call(&h, "s__hang").await.expect_err("never answered");
    assert!(matches!(transport(&e), TransportError::Timeout(_)), "{e}");
    h.call_tool(&Caller::agent("a"), "s__freeze", json!({"ms": 600_000}))
        .await
        .expect("freeze");
    let e = call(&h, "s__echo").await.expect_err("frozen");
    assert!(matches!(transport(&e), TransportError::Timeout(_)), "{e}");
    // The probe's 10 s, then the restart.
    assert!(
        restarted_within(&h, "s", pid, Duration::from_secs(30)).await,
        "restarted: {:?}",
        h.server_status("s")
    );
    assert!(group_members(pid).is_empty(), "the frozen process is gone");
    still_serving(&h, "s").await;
    h.shutdown().await;
}

// Not while a request given a longer deadline than the server's timeout (an
// embedder's own) may still wait on it: the server may be at work on that one.
#[tokio::test]
async fn a_silent_server_is_not_restarted_while_a_longer_request_waits_on_it() {
    let h = harness(vec![demo("s", &[])]).await;
    let pid = h.server_status("s").and_then(|s| s.pid).expect("pid");
    h.call_tool(&Caller::agent("a"), "s__freeze", json!({"ms": 600_000}))
        .await
        .expect("freeze");
    let long = {
        let h = h.clone();
        let params = json!({"name": "echo", "arguments": {"text": "long"}});
        tokio::spawn(async move {
            h.request_with_timeout(
                "s",
                "tools/call",
                Some(params),
                Some(Duration::from_secs(60)),
            )
            .await
        })
    };
    let e = call(&h, "s__echo").await.expect_err("frozen");
    assert!(matches!(transport(&e), TransportError::Timeout(_)), "{e}");
    // Past the probe's 10 s: still the same process.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(h.server_status("s").and_then(|s| s.pid), Some(pid));
    assert!(!long.is_finished(), "the long request still waits");
    long.abort();
    h.shutdown().await;
}

#[tokio::test]
async fn a_server_that_exits_while_a_child_out_of_its_group_holds_its_stdout_is_restarted() {
    let h = harness(vec![demo("s", &[])]).await;
    let pid = h.server_status("s").and_then(|s| s.pid).expect("pid");
    // The child is out of reach of the group's kill, and lives on for a while.
    let e = h
        .call_tool(
            &Caller::agent("a"),
            "s__orphan_stdout",
            json!({"own_group": true, "seconds": 20}),
        )
        .await
        .expect_err("exited");
    assert!(closed_or_timed_out(&e), "{e}");
    // No EOF will come while the child lives: the server is restarted all the same.
    assert!(
        restarted_within(&h, "s", pid, Duration::from_secs(10)).await,
        "restarted: {:?}",
        h.server_status("s")
    );
    still_serving(&h, "s").await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_server_that_no_longer_reads_its_stdin_but_lives_on_is_restarted() {
    // `cat` is the only reader of the harness's pipe and feeds the demo server; once the
    // demo server has crashed, `cat` dies at its next line, and the leader (`sh`, then
    // `sleep`) lives on with stdout open: no EOF, no exit, a stdin nobody reads.
    let script = "exec 3<&0 </dev/null; cat <&3 3<&- | \"$0\" demo-server s 3<&- & \
                  exec 3<&-; wait; exec sleep 20";
    let mut server = demo("s", &[]);
    server.transport = mcp_harness::TransportSpec::Stdio(mcp_harness::transport::StdioSpec {
        command: "sh".into(),
        args: vec!["-c".into(), script.into(), harness_exe()],
        ..Default::default()
    });
    let h = harness(vec![server]).await;
    let pid = h.server_status("s").and_then(|s| s.pid).expect("pid");
    assert!(call(&h, "s__crash").await.is_err());
    let restarted = || {
        h.server_status("s")
            .and_then(|s| s.pid)
            .is_some_and(|p| p != pid)
    };
    let started = std::time::Instant::now();
    while !restarted() && started.elapsed() < Duration::from_secs(15) {
        let _ = call(&h, "s__echo").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(restarted(), "restarted: {:?}", h.server_status("s"));
    still_serving(&h, "s").await;
    h.shutdown().await;
}

#[tokio::test]
async fn a_server_that_exits_while_a_child_holds_its_stdout_is_noticed_and_its_group_killed() {
    let h = harness(vec![demo("s", &[])]).await;
    let pid = h.server_status("s").and_then(|s| s.pid).expect("pid");
    let e = call(&h, "s__orphan_stdout").await.expect_err("exited");
    assert!(closed_or_timed_out(&e), "{e}");
    assert!(
        eventually(Duration::from_secs(10), || group_members(pid).is_empty()).await,
        "the child holding stdout was killed"
    );
    still_serving(&h, "s").await;
    h.shutdown().await;
}

// A legacy HTTP server's event stream breaks after the call was delivered, and the GET
// that would resume it finds the server gone: the call may have run there, so it is
// not sent to another server offering the same tool (it would run twice).
#[tokio::test]
async fn a_stream_lost_after_delivery_does_not_fail_over() {
    let (first_record, second_record) = (temp_file("first"), temp_file("second"));
    let first = HttpServer::demo(&[
        "first",
        "--era",
        "legacy",
        "--record",
        &first_record.to_string_lossy(),
    ])
    .await;
    let second = HttpServer::demo(&[
        "second",
        "--era",
        "legacy",
        "--record",
        &second_record.to_string_lossy(),
    ])
    .await;
    let mut preferred = ServerConfig::http("first", &first.url);
    preferred.priority = 2;
    let h = harness(vec![preferred, ServerConfig::http("second", &second.url)]).await;
    let e = h
        .call_tool(&Caller::agent("a"), "broken_stream", json!({"exit": true}))
        .await
        .expect_err("the stream could not be resumed");
    let ran = |record: &std::path::PathBuf| {
        recorded(record)
            .iter()
            .filter(|r| r["method"] == "tools/call")
            .count()
    };
    assert_eq!(ran(&first_record), 1, "it ran on the first: {e}");
    assert_eq!(
        ran(&second_record),
        0,
        "and was not sent to the second: {e}"
    );
    h.shutdown().await;
}
