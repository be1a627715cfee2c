//! The stdio transport and era detection against real server processes.

mod support;

use std::time::Duration;

use mcp_harness::protocol::meta::{KEY_CLIENT_CAPABILITIES, KEY_CLIENT_INFO, KEY_PROTOCOL_VERSION};
use mcp_harness::protocol::{ResultType, RpcErrorKind};
use mcp_harness::transport::{
    ConnectError, ConnectOptions, Connection, Era, EraPreference, RequestError, ServerEvent,
    SpawnFailure, TransportError, TransportSpec,
};
use serde_json::json;
use support::*;

#[tokio::test]
async fn a_modern_server_is_discovered_listed_and_called() {
    let (conn, _events) = Connection::connect("alpha", demo_stdio(&["alpha"]), options())
        .await
        .expect("connect");
    assert_eq!(conn.era(), Era::Modern);
    assert_eq!(conn.protocol_version(), "2026-07-28");
    assert!(
        conn.profile()
            .instructions()
            .is_some_and(|i| i.contains("alpha"))
    );
    assert_eq!(
        conn.profile().server_info().expect("server info")["name"],
        "alpha"
    );
    let list = conn.request("tools/list", None).await.expect("tools/list");
    assert!(
        list["tools"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["name"] == "echo"))
    );
    assert_eq!(list["ttlMs"], 60000);
    let r = conn
        .request("tools/call", call("add", json!({"a": 2, "b": 40})))
        .await
        .expect("call");
    assert_eq!(text(&r), "42");
    assert_eq!(ResultType::of(&r), Ok(ResultType::Complete));
    conn.shutdown().await;
}

#[tokio::test]
async fn legacy_servers_that_error_ignore_or_exit_on_discover_fall_back_to_initialize() {
    // `error-then-exit`: a server that takes nothing before `initialize` refuses the
    // probe, then exits; the handshake finds it gone and respawns it once.
    for behaviour in ["error", "ignore", "exit", "error-then-exit"] {
        let spec = demo_stdio(&["beta", "--era", "legacy", "--on-discover", behaviour]);
        let opts = ConnectOptions {
            probe_timeout: Duration::from_millis(400),
            ..options()
        };
        let (conn, _events) = Connection::connect("beta", spec, opts)
            .await
            .expect(behaviour);
        assert_eq!(conn.era(), Era::Legacy, "{behaviour}");
        assert_eq!(conn.protocol_version(), "2025-11-25");
        let r = conn
            .request("tools/call", call("echo", json!({"text": behaviour})))
            .await
            .expect("call");
        assert_eq!(text(&r), behaviour);
        let pid = conn.pid().expect("pid");
        conn.shutdown().await;
        assert!(
            group_members(pid).is_empty(),
            "{behaviour}: process group {pid} survived shutdown"
        );
    }
}

// A modern server slower to start than the probe waits (heavy imports, a JVM) reads
// `server/discover` late, and refuses the `initialize` after it naming its versions:
// probed again, it connects as modern. Before, the start failed, and every restart
// (a new process, as slow) failed the same way.
#[tokio::test]
async fn a_modern_server_slower_to_start_than_the_probe_connects_as_modern() {
    let script = format!("sleep 1; exec '{}' demo-server alpha", harness_exe());
    let spec = TransportSpec::stdio("sh", ["-c", script.as_str()]);
    let opts = ConnectOptions {
        probe_timeout: Duration::from_millis(300),
        ..options()
    };
    let (conn, _events) = Connection::connect("alpha", spec, opts)
        .await
        .expect("connects once it runs");
    assert_eq!(conn.era(), Era::Modern);
    let r = conn
        .request("tools/call", call("add", json!({"a": 2, "b": 40})))
        .await
        .expect("call");
    assert_eq!(text(&r), "42");
    conn.shutdown().await;
}

// One that named only modern versions, then exits while it is probed again (after
// asking for the version again), is not started anew to be sent `initialize`: it said
// it is no legacy server.
#[tokio::test]
async fn a_modern_server_that_exits_while_probed_again_is_not_started_anew() {
    let starts = temp_file("reprobe-starts");
    let refuse = r#"printf '{"jsonrpc":"2.0","id":%s,"error":{"code":-32022,"message":"unsupported","data":{"supported":["2026-07-28"],"requested":"2025-11-25"}}}\n' "$id""#;
    let script = format!(
        "echo start >> '{}'; sleep 0.6; read -r l; {READ_ID}; {refuse}; {READ_ID}; {refuse}; exit 0",
        starts.display()
    );
    let spec = TransportSpec::stdio("sh", ["-c", script.as_str()]);
    let opts = ConnectOptions {
        probe_timeout: Duration::from_millis(300),
        ..options()
    };
    let e = Connection::connect("gone", spec, opts)
        .await
        .expect_err("it exited");
    let started = std::fs::read_to_string(&starts)
        .expect("started")
        .lines()
        .count();
    assert_eq!(started, 1, "started once: {e}");
    let _ = std::fs::remove_file(starts);
}

// A legacy server that never answers `server/discover` hears nothing else before
// `initialize` (its handshake allows only that): the probe's timeout sends no
// `notifications/cancelled`.
#[tokio::test]
async fn a_probe_given_up_is_not_followed_by_a_cancellation_before_initialize() {
    let record = temp_file("probe-quiet");
    let rec = record.to_string_lossy().to_string();
    let spec = demo_stdio(&[
        "beta",
        "--era",
        "legacy",
        "--on-discover",
        "ignore",
        "--record",
        &rec,
    ]);
    let opts = ConnectOptions {
        probe_timeout: Duration::from_millis(300),
        ..options()
    };
    let (conn, _events) = Connection::connect("beta", spec, opts)
        .await
        .expect("connect");
    assert_eq!(conn.era(), Era::Legacy);
    conn.shutdown().await;
    let lines = recorded(&record);
    let seen: Vec<&str> = lines
        .iter()
        .filter_map(|l| l["method"].as_str().or(l["notification"].as_str()))
        .collect();
    let initialize = seen
        .iter()
        .position(|m| *m == "initialize")
        .expect("initialize");
    assert_eq!(&seen[..initialize], ["server/discover"], "{seen:?}");
}

// A legacy `initialize` that times out is not followed by `notifications/cancelled`:
// clients must not cancel it (the legacy revisions' cancellation page).
#[tokio::test]
async fn an_initialize_that_times_out_is_not_cancelled() {
    let heard = temp_file("initialize-heard");
    // Takes every line and answers none.
    let script = format!("cat > '{}'", heard.display());
    let spec = TransportSpec::stdio("sh", ["-c", script.as_str()]);
    let opts = ConnectOptions {
        probe_timeout: Duration::from_millis(300),
        request_timeout: Duration::from_millis(500),
        ..options()
    };
    let failed = Connection::connect("mute", spec, opts)
        .await
        .expect_err("never answered");
    assert!(
        matches!(failed, ConnectError::Transport(TransportError::Timeout(_))),
        "{failed}"
    );
    let lines = std::fs::read_to_string(&heard).expect("heard");
    assert!(lines.contains("\"initialize\""), "{lines}");
    assert!(!lines.contains("notifications/cancelled"), "{lines}");
    let _ = std::fs::remove_file(heard);
}

#[tokio::test]
async fn unsupported_version_is_renegotiated_from_the_servers_list() {
    let opts = ConnectOptions {
        preferred_versions: vec!["2099-01-01".into(), "2026-07-28".into()],
        ..options()
    };
    let (conn, _events) = Connection::connect("alpha", demo_stdio(&["alpha"]), opts)
        .await
        .expect("connect");
    assert_eq!(conn.era(), Era::Modern);
    assert_eq!(conn.protocol_version(), "2026-07-28");
    conn.request("tools/list", None)
        .await
        .expect("the renegotiated version works");
    conn.shutdown().await;
}

#[tokio::test]
async fn a_modern_server_with_no_common_version_is_an_error_not_a_fallback() {
    let err = Connection::connect(
        "future",
        demo_stdio(&["future", "--versions", "2099-01-01"]),
        options(),
    )
    .await
    .expect_err("no common version");
    match err {
        ConnectError::NoCommonVersion { server, .. } => {
            assert_eq!(server, vec!["2099-01-01".to_string()])
        }
        other => panic!("expected NoCommonVersion, got {other}"),
    }
    // A server's list is quoted in part: it is the server's, of any length (here 50
    // names, which are no versions of ours, and one modern version we do not speak;
    // strings too long to be versions are not read at all).
    let mut many: Vec<String> = (0..50).map(|i| format!("2099-01-{i:02}-odd")).collect();
    many.push("x".repeat(2_000));
    many.push("2099-12-31".into());
    let err = Connection::connect(
        "future",
        demo_stdio(&["future", "--versions", &many.join(",")]),
        options(),
    )
    .await
    .expect_err("no common version");
    let ConnectError::NoCommonVersion { server, .. } = &err else {
        panic!("expected NoCommonVersion, got {err}");
    };
    assert_eq!(server.len(), 11, "ten, and how many more");
    assert_eq!(server[10], "… 41 more");
    assert!(
        err.to_string().len() < 1_000,
        "{} bytes",
        err.to_string().len()
    );
}

// A start that fails on the probe (no common version) stops the server as any stop
// does, its stdin closed first: killed outright, a wrapper (`docker run`, here a shell)
// never got to clean up after it.
#[tokio::test]
async fn a_server_refused_at_the_probe_is_stopped_not_killed() {
    let mark = temp_file("probe-refused-mark");
    let _ = std::fs::remove_file(&mark);
    let script = format!(
        "\"$0\" demo-server future --versions 2099-01-01; touch '{}'",
        mark.display()
    );
    let spec = TransportSpec::stdio("sh", ["-c".to_string(), script, harness_exe()]);
    let err = Connection::connect("future", spec, options())
        .await
        .expect_err("no common version");
    assert!(matches!(err, ConnectError::NoCommonVersion { .. }), "{err}");
    assert!(
        eventually(Duration::from_secs(5), || mark.exists()).await,
        "the wrapper cleaned up after its server"
    );
    let _ = std::fs::remove_file(&mark);
}

#[tokio::test]
async fn a_server_shown_modern_that_then_goes_silent_is_an_error_not_a_fallback() {
    // Its -32022 names our version (modern); it reads nothing after it.
    let opts = options();
    let probe_timeout = opts.probe_timeout;
    let err = Connection::connect(
        "silent",
        demo_stdio(&[
            "silent",
            "--reject-first-request",
            "--stop-reading-after",
            "1",
        ]),
        opts,
    )
    .await
    .expect_err("no answer to the second probe");
    // Not the legacy handshake's deadline: `initialize` was never sent.
    assert!(
        matches!(err, ConnectError::Transport(TransportError::Timeout(d)) if d == probe_timeout),
        "{err}"
    );
}

#[tokio::test]
async fn a_modern_only_preference_refuses_a_legacy_server() {
    let opts = ConnectOptions {
        era: EraPreference::Modern,
        ..options()
    };
    let err = Connection::connect("beta", demo_stdio(&["beta", "--era", "legacy"]), opts)
        .await
        .expect_err("legacy");
    assert!(matches!(err, ConnectError::NotModern(_)), "{err}");
}

// A server configured as modern that crashes on the probe, or answers it with an error
// that says nothing of the era (a backend not ready), failed its start for good (not a
// modern server): a crash is a crash, and it is started again with backoff.
#[tokio::test]
async fn a_modern_servers_crash_or_passing_error_on_the_probe_heals() {
    let opts = || ConnectOptions {
        era: EraPreference::Modern,
        ..options()
    };
    let sh = |script: &str| TransportSpec::stdio("sh", ["-c", script]);
    let crashed = Connection::connect("m", sh("read line; exit 3"), opts())
        .await
        .expect_err("crashed");
    assert!(!crashed.cannot_heal(), "{crashed}");
    assert!(
        matches!(
            crashed,
            ConnectError::Transport(TransportError::Closed { .. })
        ),
        "{crashed}"
    );
    // Answers the probe's id with an internal error, then stays.
    let not_ready = r#"read line; id=$(printf %s "$line" | sed 's/.*"id":\([0-9]*\).*/\1/'); printf '{"jsonrpc":"2.0","id":%s,"error":{"code":-32603,"message":"backend not ready"}}\n' "$id"; sleep 5"#;
    let erred = Connection::connect("m", sh(not_ready), opts())
        .await
        .expect_err("not ready");
    assert!(!erred.cannot_heal(), "{erred}");
    assert!(
        matches!(&erred, ConnectError::Refused { error, .. } if error.code == -32603),
        "{erred}"
    );
    // A method it does not know is what a legacy server says: refused for good.
    let unknown = not_ready.replace("-32603", "-32601");
    let legacy = Connection::connect("m", sh(&unknown), opts())
        .await
        .expect_err("legacy");
    assert!(matches!(legacy, ConnectError::NotModern(_)), "{legacy}");
}

#[tokio::test]
async fn every_modern_request_carries_the_full_meta_envelope() {
    let record = temp_file("meta");
    let rec = record.to_string_lossy().to_string();
    let (conn, _events) =
        Connection::connect("alpha", demo_stdio(&["alpha", "--record", &rec]), options())
            .await
            .expect("connect");
    conn.request("tools/list", None).await.expect("list");
    conn.request("tools/call", call("echo", json!({"text": "x"})))
        .await
        .expect("call");
    conn.request(
        "prompts/get",
        Some(json!({"name": "greet", "arguments": {"who": "y"}})),
    )
    .await
    .expect("prompt");
    conn.request("resources/read", Some(json!({"uri": "demo://readme"})))
        .await
        .expect("read");
    conn.shutdown().await;
    let requests = recorded(&record);
    assert_eq!(requests.len(), 5, "discover + 4 requests: {requests:?}");
    for r in &requests {
        let meta = &r["params"]["_meta"];
        assert_eq!(meta[KEY_PROTOCOL_VERSION], "2026-07-28", "{r}");
        assert!(
            meta[KEY_CLIENT_CAPABILITIES]["elicitation"].is_object(),
            "{r}"
        );
        assert_eq!(meta[KEY_CLIENT_INFO]["name"], "mcp-harness", "{r}");
    }
    let _ = std::fs::remove_file(record);
}

#[tokio::test]
async fn a_legacy_elicitation_request_is_answered_and_the_call_completes() {
    let (conn, mut events) =
        Connection::connect("beta", demo_stdio(&["beta", "--era", "legacy"]), options())
            .await
            .expect("connect");
    let answerer = tokio::spawn(async move {
        let Some(ServerEvent::Request(req)) = events.recv().await else {
            panic!("expected a server request")
        };
        assert_eq!(req.method, "elicitation/create");
        assert_eq!(req.params["message"], "Ship it?");
        req.respond(Ok(
            json!({"action": "accept", "content": {"approved": true}}),
        ));
    });
    let r = conn
        .request(
            "tools/call",
            call("confirm", json!({"message": "Ship it?"})),
        )
        .await
        .expect("call");
    assert_eq!(text(&r), "approved: true");
    answerer.await.expect("answerer");
    conn.shutdown().await;
}

#[tokio::test]
async fn legacy_list_changed_reaches_the_layer_above() {
    let (conn, mut events) =
        Connection::connect("beta", demo_stdio(&["beta", "--era", "legacy"]), options())
            .await
            .expect("connect");
    conn.request("tools/call", call("notify_changed", json!({})))
        .await
        .expect("call");
    let event = tokio::time::timeout(Duration::from_secs(10), events.recv())
        .await
        .expect("in time");
    assert!(
        matches!(event, Some(ServerEvent::Notification(n)) if n.method == "notifications/tools/list_changed")
    );
    conn.shutdown().await;
}

// What a server sends before its handshake is done waits for it, in a queue bounded in
// bytes (8 MiB), not only in messages (256): 200 notifications of 100 KiB, 20 MiB in
// all, do not all wait. Before, every one did (up to 256 of up to 16 MiB each, parsed).
#[tokio::test]
async fn what_a_server_sends_during_the_handshake_waits_within_a_byte_budget() {
    let (conn, mut events) = Connection::connect(
        "talker",
        demo_stdio(&[
            "talker",
            "--notify-at-discover",
            "200",
            "--notification-bytes",
            "102400",
        ]),
        // 20 MiB go out before the probe's answer: on a loaded machine that takes
        // longer than the 1.5 s the other tests give a probe.
        ConnectOptions {
            probe_timeout: Duration::from_secs(20),
            ..options()
        },
    )
    .await
    .expect("connect");
    let mut arrived = 0;
    while let Ok(Some(ServerEvent::Notification(n))) =
        tokio::time::timeout(Duration::from_secs(2), events.recv()).await
    {
        assert_eq!(n.method, "notifications/message");
        arrived += 1;
    }
    assert!(
        (1..100).contains(&arrived),
        "{arrived} of 200 notifications waited for the handshake"
    );
    // The connection works on.
    conn.request("tools/call", call("echo", json!({"text": "hi"})))
        .await
        .expect("call");
    conn.shutdown().await;
}

// A legacy server may ping before `initialized` and wait for the answer before it
// replies to `initialize`. Before, the ping went unanswered until the handshake was
// done, which it never was: the connection failed at its timeout. What else it sent
// meanwhile (here three log messages, at the probe) still arrives, after the handshake.
// After a flood (2,000 messages) what came is held only so far, and past that dropped,
// but the ping is still answered; before, it found the queue full and waited there.
#[tokio::test]
async fn a_legacy_server_that_pings_before_answering_initialize_is_answered() {
    for flood in [3, 2000] {
        let n = flood.to_string();
        let spec = demo_stdio(&[
            "pinger",
            "--era",
            "legacy",
            "--ping-before-initialize",
            "--notify-at-discover",
            &n,
        ]);
        let opts = ConnectOptions {
            request_timeout: Duration::from_secs(5),
            ..options()
        };
        let (conn, mut events) = Connection::connect("pinger", spec, opts)
            .await
            .expect("connect");
        assert_eq!(conn.era(), Era::Legacy);
        for _ in 0..3 {
            let event = tokio::time::timeout(Duration::from_secs(10), events.recv()).await;
            assert!(
                matches!(event, Ok(Some(ServerEvent::Notification(ref n))) if n.method == "notifications/message"),
                "{event:?}"
            );
        }
        let r = conn
            .request("tools/call", call("add", json!({"a": 2, "b": 40})))
            .await
            .expect("call");
        assert_eq!(text(&r), "42");
        conn.shutdown().await;
    }
}

#[tokio::test]
async fn a_modern_mrtr_round_keeps_keys_and_echoes_request_state_exactly() {
    let (conn, _events) = Connection::connect("alpha", demo_stdio(&["alpha"]), options())
        .await
        .expect("connect");
    let params = json!({"name": "confirm", "arguments": {"message": "ok?"}});
    let first = conn
        .request("tools/call", Some(params.clone()))
        .await
        .expect("first");
    assert_eq!(ResultType::of(&first), Ok(ResultType::InputRequired));
    let input = mcp_harness::protocol::InputRequired::from_value(&first).expect("input required");
    assert!(input.input_requests.contains_key("confirm"));
    let mut retry = params;
    retry["inputResponses"] =
        json!({"confirm": {"action": "accept", "content": {"approved": true}}});
    retry["requestState"] = json!(input.request_state.expect("state"));
    let done = conn
        .request("tools/call", Some(retry))
        .await
        .expect("retry");
    assert_eq!(
        text(&done),
        "approved: true",
        "the server checks the state byte for byte"
    );
    conn.shutdown().await;
}

#[tokio::test]
async fn a_missing_client_capability_is_a_typed_error_with_the_required_capabilities() {
    let opts = ConnectOptions {
        capabilities: json!({}),
        ..options()
    };
    let (conn, _events) = Connection::connect("alpha", demo_stdio(&["alpha"]), opts)
        .await
        .expect("connect");
    let err = conn
        .request("tools/call", call("confirm", json!({})))
        .await
        .expect_err("-32021");
    let RequestError::Rpc(e) = err else {
        panic!("expected an rpc error, got {err}")
    };
    assert_eq!(
        e.kind(),
        RpcErrorKind::MissingClientCapability {
            required: json!({"elicitation": {}})
        }
    );
    conn.shutdown().await;
}

#[tokio::test]
async fn input_required_forever_keeps_answering_input_required() {
    let (conn, _events) = Connection::connect("alpha", demo_stdio(&["alpha"]), options())
        .await
        .expect("connect");
    for _ in 0..3 {
        let r = conn
            .request("tools/call", call("forever", json!({})))
            .await
            .expect("call");
        assert_eq!(ResultType::of(&r), Ok(ResultType::InputRequired));
    }
    conn.shutdown().await;
}

#[tokio::test]
async fn a_modern_server_sending_a_request_is_refused_and_the_connection_stays() {
    let (conn, _events) = Connection::connect("alpha", demo_stdio(&["alpha"]), options())
        .await
        .expect("connect");
    let r = conn
        .request("tools/call", call("rogue_request", json!({})))
        .await
        .expect("call");
    assert_eq!(text(&r), "client refused: -32600");
    let r = conn
        .request("tools/call", call("echo", json!({"text": "still up"})))
        .await
        .expect("after");
    assert_eq!(text(&r), "still up");
    conn.shutdown().await;
}

#[tokio::test]
async fn a_hung_request_times_out_is_cancelled_and_the_connection_keeps_serving() {
    let record = temp_file("cancel");
    let rec = record.to_string_lossy().to_string();
    let spec = demo_stdio(&["alpha", "--record", &rec]);
    let (conn, _events) = Connection::connect("alpha", spec, options())
        .await
        .expect("connect");
    let err = conn
        .request_with_timeout(
            "tools/call",
            call("hang", json!({})),
            Duration::from_millis(200),
        )
        .await
        .expect_err("hang");
    assert_eq!(
        err,
        RequestError::Transport(TransportError::Timeout(Duration::from_millis(200)))
    );
    let r = conn
        .request(
            "tools/call",
            call("slow", json!({"ms": 50, "text": "still here"})),
        )
        .await
        .expect("after");
    assert_eq!(text(&r), "still here");
    conn.shutdown().await;
    let lines = recorded(&record);
    let hang_id = lines
        .iter()
        .find(|l| l["params"]["name"] == "hang")
        .expect("hang recorded")["id"]
        .clone();
    assert!(
        lines
            .iter()
            .any(|l| l["notification"] == "notifications/cancelled"
                && l["params"]["requestId"] == hang_id),
        "the server was told the request was cancelled: {lines:?}"
    );
    let _ = std::fs::remove_file(record);
}

#[tokio::test]
async fn a_garbage_line_is_skipped_and_its_request_ends_at_its_deadline() {
    let (conn, _events) = Connection::connect("alpha", demo_stdio(&["alpha"]), options())
        .await
        .expect("connect");
    let err = conn
        .request_with_timeout(
            "tools/call",
            call("garbage", json!({})),
            Duration::from_millis(300),
        )
        .await
        .expect_err("garbage");
    assert!(
        matches!(err, RequestError::Transport(TransportError::Timeout(_))),
        "{err}"
    );
    let r = conn
        .request("tools/call", call("echo", json!({"text": "fine"})))
        .await
        .expect("after garbage");
    assert_eq!(text(&r), "fine");
    conn.shutdown().await;
}

#[tokio::test]
async fn a_line_past_the_limit_closes_the_transport_with_a_typed_error() {
    let opts = ConnectOptions {
        max_message_bytes: 64 * 1024,
        ..options()
    };
    let (conn, mut events) = Connection::connect("alpha", demo_stdio(&["alpha"]), opts)
        .await
        .expect("connect");
    let err = conn
        .request("tools/call", call("oversize", json!({"bytes": 200_000})))
        .await
        .expect_err("too long");
    assert_eq!(
        err,
        RequestError::Transport(TransportError::LineTooLong { limit: 64 * 1024 })
    );
    let closed = tokio::time::timeout(Duration::from_secs(10), events.recv())
        .await
        .expect("in time");
    assert!(matches!(
        closed,
        Some(ServerEvent::Closed(TransportError::LineTooLong { .. }))
    ));
    let after = conn.request("tools/list", None).await.expect_err("closed");
    assert!(
        matches!(after, RequestError::Transport(TransportError::NotSent(_))),
        "{after}"
    );
    let pid = conn.pid().expect("pid");
    conn.shutdown().await;
    assert!(group_members(pid).is_empty());
}

#[tokio::test]
async fn a_crash_fails_every_request_in_flight_at_once() {
    let record = temp_file("crash-in-flight");
    let rec = record.to_string_lossy().to_string();
    let (conn, _events) =
        Connection::connect("alpha", demo_stdio(&["alpha", "--record", &rec]), options())
            .await
            .expect("connect");
    let conn = std::sync::Arc::new(conn);
    // Requests whose own deadline is minutes away.
    let hung: Vec<_> = (0..5)
        .map(|_| {
            let c = conn.clone();
            tokio::spawn(async move {
                c.request_with_timeout(
                    "tools/call",
                    call("hang", json!({})),
                    Duration::from_secs(300),
                )
                .await
            })
        })
        .collect();
    // All 5 written and in flight (one not written yet would fail as never sent).
    let hangs = || calls_recorded(&record, "hang");
    assert!(
        eventually(Duration::from_secs(10), || hangs() == 5).await,
        "the 5 hang requests reached the server"
    );
    let started = std::time::Instant::now();
    let crash = conn
        .request("tools/call", call("crash", json!({})))
        .await
        .expect_err("crash");
    assert!(
        matches!(
            &crash,
            RequestError::Transport(TransportError::Closed {
                exit: Some(mcp_harness::transport::ExitStatus::Code(3)),
                ..
            })
        ),
        "{crash}"
    );
    for h in hung {
        let r = tokio::time::timeout(Duration::from_secs(20), h)
            .await
            .expect("no hang")
            .expect("join");
        assert!(
            matches!(
                r,
                Err(RequestError::Transport(TransportError::Closed { .. }))
            ),
            "{r:?}"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "failed fast, not at the 300 s deadline"
    );
    conn.shutdown().await;
    let _ = std::fs::remove_file(record);
}

// A server slow to read at shutdown, its stdin queue full: it still gets its EOF once
// there is room, and exits by itself within the grace (no SIGTERM). Before, the EOF was
// dropped when the queue was full, and the server was killed at the grace's end.
#[tokio::test]
async fn shutdown_delivers_the_eof_to_a_server_slow_to_read() {
    let (conn, _events) = Connection::connect(
        "slow",
        demo_stdio(&[
            "slow",
            "--stop-reading-after",
            "1",
            "--resume-reading-after-ms",
            "1500",
        ]),
        ConnectOptions {
            shutdown_grace: Duration::from_secs(15),
            ..options()
        },
    )
    .await
    .expect("connect (the probe is read)");
    let conn = std::sync::Arc::new(conn);
    // A pipe's, a write batch's and the queue's worth of lines, and more waiting.
    let calls: Vec<_> = (0..1600)
        .map(|i| {
            let c = conn.clone();
            tokio::spawn(async move {
                c.request_with_timeout(
                    "tools/call",
                    call("echo", json!({"text": format!("{i:0>300}")})),
                    Duration::from_secs(60),
                )
                .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    conn.shutdown().await;
    let after = conn
        .request("tools/call", call("echo", json!({"text": "late"})))
        .await
        .expect_err("shut down");
    // Its exit, not the SIGTERM at the grace's end.
    assert!(
        matches!(
            &after,
            RequestError::Transport(TransportError::NotSent(why)) if why.ends_with("(exit status 0)")
        ),
        "the server exits by itself at EOF: {after}"
    );
    for c in calls {
        let _ = c.await;
    }
}

#[tokio::test]
async fn a_server_that_exits_after_n_calls_fails_the_next_call() {
    let (conn, _events) = Connection::connect(
        "alpha",
        demo_stdio(&["alpha", "--crash-after", "2"]),
        options(),
    )
    .await
    .expect("connect");
    for _ in 0..2 {
        conn.request("tools/call", call("echo", json!({"text": "ok"})))
            .await
            .expect("served");
    }
    let err = conn
        .request("tools/call", call("echo", json!({"text": "no"})))
        .await
        .expect_err("exits");
    assert!(
        matches!(err, RequestError::Transport(TransportError::Closed { .. })),
        "{err}"
    );
    conn.shutdown().await;
}

#[tokio::test]
async fn a_server_that_closes_stdout_but_keeps_running_is_closed_and_killed() {
    let (conn, _events) = Connection::connect("alpha", demo_stdio(&["alpha"]), options())
        .await
        .expect("connect");
    let pid = conn.pid().expect("pid");
    let err = conn
        .request("tools/call", call("close_stdout", json!({})))
        .await
        .expect_err("closed");
    assert!(
        matches!(err, RequestError::Transport(TransportError::Closed { .. })),
        "{err}"
    );
    assert!(alive(pid), "the process itself is still running");
    conn.shutdown().await;
    assert!(group_members(pid).is_empty(), "shutdown stopped it");
}

#[tokio::test]
async fn shutdown_escalates_to_sigkill_and_takes_grandchildren_with_it() {
    let spec = demo_stdio(&["alpha", "--ignore-sigterm", "--spawn-child"]);
    let (conn, _events) = Connection::connect("alpha", spec, options())
        .await
        .expect("connect");
    let pid = conn.pid().expect("pid");
    assert!(
        eventually(Duration::from_secs(10), || group_members(pid).len() >= 2).await,
        "server and its child run"
    );
    conn.shutdown().await;
    assert!(
        eventually(Duration::from_secs(5), || group_members(pid).is_empty()).await,
        "group {pid} survived"
    );
}

#[tokio::test]
async fn dropping_a_connection_kills_its_process_group() {
    let spec = demo_stdio(&["alpha", "--ignore-sigterm", "--spawn-child"]);
    let (conn, _events) = Connection::connect("alpha", spec, options())
        .await
        .expect("connect");
    let pid = conn.pid().expect("pid");
    assert!(eventually(Duration::from_secs(10), || group_members(pid).len() >= 2).await);
    drop(conn);
    assert!(
        eventually(Duration::from_secs(5), || group_members(pid).is_empty()).await,
        "group {pid} survived the drop"
    );
}

#[tokio::test]
async fn a_command_that_does_not_exist_is_a_spawn_error() {
    let spec = mcp_harness::transport::TransportSpec::stdio(
        "/nonexistent/mcp-server",
        Vec::<String>::new(),
    );
    let err = Connection::connect("ghost", spec, options())
        .await
        .expect_err("spawn");
    assert!(
        matches!(
            err,
            ConnectError::Transport(TransportError::Spawn {
                kind: SpawnFailure::NotFound,
                ..
            })
        ),
        "{err}"
    );
}

// A working directory that is missing (a volume not mounted yet) fails as chdir's
// ENOENT: not the command's absence, which no restart heals.
#[tokio::test]
async fn a_missing_working_directory_is_not_a_missing_command() {
    let mut spec = demo_stdio(&["s"]);
    let TransportSpec::Stdio(stdio) = &mut spec else {
        panic!("stdio")
    };
    stdio.cwd = Some("/nonexistent/mcp-workdir".into());
    let err = Connection::connect("s", spec, options())
        .await
        .expect_err("spawn");
    let ConnectError::Transport(TransportError::Spawn { kind, reason, .. }) = &err else {
        panic!("{err}")
    };
    assert_eq!(*kind, SpawnFailure::Other, "{err}");
    assert!(reason.contains("/nonexistent/mcp-workdir"), "{reason}");
}

// A descendant that left the server's process group and holds its stdin unread (and its
// stderr open) kept the transport's writer stuck in a write, and its stderr reader
// waiting, after the transport was gone: until the descendant exited, with their pipes.
// Now both end with the transport.
#[tokio::test]
async fn a_descendant_holding_stdin_does_not_keep_the_transports_tasks_alive() {
    let metrics = tokio::runtime::Handle::current().metrics();
    let before = metrics.num_alive_tasks();
    // The server reads server/discover and the orphan call, then nothing more.
    let spec = demo_stdio(&["alpha", "--stop-reading-after", "2"]);
    let opts = ConnectOptions {
        request_timeout: Duration::from_secs(3),
        ..options()
    };
    let (conn, events) = Connection::connect("alpha", spec, opts)
        .await
        .expect("connect");
    // It exits, leaving a child in a group of its own that holds stdin for 15 s; more
    // than the pipe takes is written meanwhile, which no one reads.
    let orphan = conn.request(
        "tools/call",
        call(
            "orphan_stdout",
            json!({"own_group": true, "hold_stdin": true, "seconds": 15}),
        ),
    );
    let big = conn.request(
        "tools/call",
        call("echo", json!({"text": "x".repeat(1 << 20)})),
    );
    let (orphaned, big) = tokio::join!(orphan, big);
    assert!(orphaned.is_err() && big.is_err(), "the server is gone");
    drop(events);
    drop(conn);
    assert!(
        eventually(Duration::from_secs(10), || metrics.num_alive_tasks()
            <= before)
        .await,
        "{} tasks alive, {before} before",
        metrics.num_alive_tasks()
    );
}

/// The shell's words that read a line into `$l` and its numeric id into `$id`.
const READ_ID: &str = r#"read -r l; id=$(printf %s "$l" | sed 's/.*"id":\([0-9]*\).*/\1/')"#;

/// What a legacy server in `sh` writes to answer `initialize` (its id in `$id`).
const INITIALIZE_ANSWER: &str = r#"printf '{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"x","version":"1"}}}\n' "$id""#;

/// What it writes to answer the request of `$id` with an empty tool result.
const EMPTY_RESULT: &str = r#"printf '{"jsonrpc":"2.0","id":%s,"result":{"content":[]}}\n' "$id""#;

/// A legacy server in `sh`: it answers `initialize`, takes `initialized`, reads the
/// next request (`$l`, its id `$id`), then runs `then`; connected, its requests given
/// `request_timeout`.
async fn scripted_legacy(
    then: &str,
    request_timeout: Duration,
) -> (Connection, tokio::sync::mpsc::Receiver<ServerEvent>) {
    let script = format!("{READ_ID}; {INITIALIZE_ANSWER}; read -r l; {READ_ID}; {then}");
    let spec = TransportSpec::stdio("sh", ["-c", script.as_str()]);
    let opts = ConnectOptions {
        era: EraPreference::Legacy,
        request_timeout,
        ..options()
    };
    Connection::connect("scripted", spec, opts)
        .await
        .expect("connect")
}

/// The one line a scripted server wrote to `heard`, as JSON.
fn heard_reply(heard: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(heard).expect("heard");
    serde_json::from_str(text.trim()).expect("a JSON-RPC reply")
}

// A legacy server's request that is not valid JSON-RPC (no `jsonrpc` here) but whose id
// can be read is answered under that id with an error, as JSON-RPC asks: a server
// waiting on it (here before it answers our call) is not left waiting until our
// deadline. Before, the line was only logged.
#[tokio::test]
async fn a_servers_malformed_request_is_answered_under_its_id() {
    let heard = temp_file("malformed-request");
    let then = format!(
        r#"printf '{{"id":77,"method":"roots/list"}}\n'; read -r r; printf '%s\n' "$r" > '{}'; {EMPTY_RESULT}; sleep 5"#,
        heard.display()
    );
    let (conn, _events) = scripted_legacy(&then, Duration::from_secs(10)).await;
    let r = conn
        .request("tools/call", call("x", json!({})))
        .await
        .expect("answered once its own request was");
    assert_eq!(r["content"], json!([]));
    let reply = heard_reply(&heard);
    assert_eq!(reply["id"], 77, "{reply}");
    assert_eq!(reply["error"]["code"], -32600, "{reply}");
    conn.shutdown().await;
    let _ = std::fs::remove_file(heard);
}

// A server's request under an id still being answered is refused at once (JSON-RPC ids
// are unique among requests in progress): taken, it replaced the first, which could no
// longer be cancelled nor withdrawn when the connection ended.
#[tokio::test]
async fn a_servers_request_under_an_id_in_progress_is_refused() {
    let heard = temp_file("duplicate-request");
    let ask = r#"{"jsonrpc":"2.0","id":1,"method":"elicitation/create","params":{"message":"m","requestedSchema":{"type":"object","properties":{}}}}"#;
    let then = format!(
        r#"printf '%s\n%s\n' '{ask}' '{ask}'; read -r r; printf '%s\n' "$r" > '{}'; {EMPTY_RESULT}; sleep 5"#,
        heard.display()
    );
    // The questions are taken and never answered.
    let (conn, _events) = scripted_legacy(&then, Duration::from_secs(3)).await;
    conn.request("tools/call", call("x", json!({})))
        .await
        .expect("answered");
    let reply = heard_reply(&heard);
    assert_eq!(reply["id"], 1, "{reply}");
    assert_eq!(
        reply["error"]["code"], -32600,
        "the second refused at once: {reply}"
    );
    conn.shutdown().await;
    let _ = std::fs::remove_file(heard);
}

// A legacy server that says more than the channel holds (8 MiB) before its handshake's
// reply, then pings and waits: the ping is answered `{}`, not refused as busy (a server
// may take a failed ping for a dead client).
#[tokio::test]
async fn a_ping_after_much_said_before_the_handshake_is_answered() {
    let heard = temp_file("ping-after-flood");
    // One notification of 12 MiB: taken whole (none waits before it), and past what is
    // held for the dispatcher (awk's own: no sprintf of that size in mawk).
    let flood = r#"awk 'BEGIN{s="xxx"; while(length(s)<9000000) s=s s; print "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"info\",\"data\":\"" s "\"}}"}'"#;
    let script = format!(
        r#"{READ_ID}; {flood}; printf '{{"jsonrpc":"2.0","id":99,"method":"ping"}}\n'; read -r r; printf '%s\n' "$r" > '{}'; {INITIALIZE_ANSWER}; sleep 5"#,
        heard.display()
    );
    let spec = TransportSpec::stdio("sh", ["-c", script.as_str()]);
    let opts = ConnectOptions {
        era: EraPreference::Legacy,
        request_timeout: Duration::from_secs(10),
        ..options()
    };
    let (conn, _events) = Connection::connect("talkative", spec, opts)
        .await
        .expect("connect");
    let reply = heard_reply(&heard);
    assert_eq!(reply["id"], 99, "{reply}");
    assert_eq!(reply["result"], json!({}), "{reply}");
    conn.shutdown().await;
    let _ = std::fs::remove_file(heard);
}

// A broken reply (no method, a misspelled result) names our request: that request fails
// at once on it, not at its deadline, and the server hears nothing under that id (its
// own requests have ids of their own). Before, it was answered as a request.
#[tokio::test]
async fn a_broken_reply_fails_its_request_at_once_and_is_not_answered() {
    let heard = temp_file("broken-reply");
    let then = format!(
        r#"printf '{{"jsonrpc":"2.0","id":%s,"reslt":{{}}}}\n' "$id"; cat > '{}'"#,
        heard.display()
    );
    let (conn, _events) = scripted_legacy(&then, Duration::from_secs(60)).await;
    let failed = tokio::time::timeout(
        Duration::from_secs(20),
        conn.request("tools/call", call("x", json!({}))),
    )
    .await
    .expect("failed on the broken reply, not at the deadline")
    .expect_err("a broken reply");
    assert!(
        matches!(failed, RequestError::Transport(TransportError::Protocol(_))),
        "{failed}"
    );
    conn.shutdown().await;
    let said = std::fs::read_to_string(&heard).unwrap_or_default();
    assert!(!said.contains("\"error\""), "answered: {said}");
    let _ = std::fs::remove_file(heard);
}
