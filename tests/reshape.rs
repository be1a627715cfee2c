//! What the reshaped core promises beyond the first wave: every actor supervised (the
//! service actors rebuilt when they die, losing nothing), and calls cancellable with one
//! deadline each.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mcp_harness::audit::AuditConfig;
use mcp_harness::{
    ApprovalQueue, CallError, CallKind, CallOptions, Caller, CancelToken, FixedAnswers, Harness,
    HarnessConfig, Service,
};
use serde_json::json;
use support::*;

fn config(audit: &std::path::Path) -> HarnessConfig {
    HarnessConfig {
        servers: vec![
            demo_server("s", &[]),
            demo_server("t", &["--era", "legacy"]),
        ],
        permissions: grant_everything(&["a"]),
        audit: AuditConfig {
            path: Some(audit.to_path_buf()),
            flush_every: Duration::from_millis(20),
            ..AuditConfig::default()
        },
        ..HarnessConfig::default()
    }
}

// A grant or revoke waiting in the permission actor's mailbox when it is killed is
// delivered to the rebuilt actor: it succeeds, where it failed as if the harness had
// shut down (and was not applied).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_asked_while_the_permission_actor_dies_are_applied() {
    let audit = temp_file("grants-kill-audit");
    let h = start_ready(config(&audit)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut askers = tokio::task::JoinSet::new();
    for n in 0..4 {
        let (h, stop) = (h.clone(), stop.clone());
        askers.spawn(async move {
            let agent = format!("g{n}");
            let mut asked = 0u64;
            while !stop.load(Ordering::SeqCst) {
                h.grant(&agent, "s", &["echo"])
                    .await
                    .unwrap_or_else(|e| panic!("grant {asked}: {e}"));
                h.revoke(&agent, Some("s"))
                    .await
                    .unwrap_or_else(|e| panic!("revoke {asked}: {e}"));
                asked += 1;
            }
            asked
        });
    }
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let old = h.service_actor(Service::Permission).await.expect("running");
        old.kill();
        let rebuilt = async {
            while h
                .service_actor(Service::Permission)
                .await
                .is_none_or(|new| new.get_id() == old.get_id())
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), rebuilt)
            .await
            .expect("rebuilt");
    }
    stop.store(true, Ordering::SeqCst);
    while let Some(asked) = askers.join_next().await {
        assert!(asked.expect("no ask failed") > 0);
    }
    // Each agent's last ask, a revoke, is in force; a grant after it too.
    for n in 0..4 {
        let agent = Caller::agent(format!("g{n}"));
        let denied = h.call_tool(&agent, "s__echo", json!({"text": "x"})).await;
        assert!(
            matches!(denied, Err(CallError::Denied { .. })),
            "{denied:?}"
        );
    }
    h.grant("g0", "s", &["echo"]).await.expect("grant");
    h.call_tool(&Caller::agent("g0"), "s__echo", json!({"text": "x"}))
        .await
        .expect("granted");
    h.shutdown().await;
    let _ = std::fs::remove_file(audit);
}

// The audit actor killed while the harness shuts down is not rebuilt; what it would
// have written is written all the same before `shutdown()` returns: the cancelled call's
// records are on disk and the backlog is empty (it was reported as unwritten, and the
// records came later, when the last handle went).
#[tokio::test]
async fn the_audit_actor_killed_during_shutdown_loses_nothing_before_it_returns() {
    let audit = temp_file("audit-killed-at-shutdown");
    let queue = ApprovalQueue::new(Duration::from_secs(600));
    let mut cfg = config(&audit);
    cfg.shutdown_grace = Duration::from_secs(1);
    cfg.audit.flush_every = Duration::from_secs(60);
    let h = start_ready_with(
        Harness::builder(cfg).input_handler("elicitation/create", Arc::new(queue.clone())),
    )
    .await;
    let call = {
        let h = h.clone();
        tokio::spawn(async move {
            h.call_tool(&Caller::agent("a"), "s__confirm", json!({}))
                .await
        })
    };
    assert!(eventually(Duration::from_secs(10), || !queue.pending().is_empty()).await);
    let writer = h.service_actor(Service::Audit).await.expect("running");
    let stopping = {
        let h = h.clone();
        tokio::spawn(async move { h.shutdown().await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    writer.kill();
    let health = stopping.await.expect("shutdown");
    assert_eq!(health.backlog, 0, "{health:?}");
    let records = audit_records(&audit);
    let events: Vec<&str> = records.iter().filter_map(|r| r["event"].as_str()).collect();
    assert_eq!(events, ["started", "finished"], "{records:?}");
    assert!(call.await.expect("call").is_err());
    let _ = std::fs::remove_file(audit);
}

#[tokio::test]
async fn each_service_actor_killed_mid_traffic_is_rebuilt_and_the_audit_count_stays_exact() {
    let audit = temp_file("services-audit");
    let h = start_ready_with(Harness::builder(config(&audit)).input_handler(
        "elicitation/create",
        Arc::new(FixedAnswers::new(
            json!({"action": "accept", "content": {"approved": true}}),
        )),
    ))
    .await;
    let stop = Arc::new(AtomicBool::new(false));
    let (made, ok) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut traffic = tokio::task::JoinSet::new();
    for n in 0..4 {
        let (h, stop, made, ok) = (h.clone(), stop.clone(), made.clone(), ok.clone());
        traffic.spawn(async move {
            let tools = ["s__echo", "t__echo", "echo", "s__confirm"];
            while !stop.load(Ordering::SeqCst) {
                made.fetch_add(1, Ordering::SeqCst);
                let tool = tools[n % tools.len()];
                if h.call_tool(&Caller::agent("a"), tool, json!({"text": "x"}))
                    .await
                    .is_ok()
                {
                    ok.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
    }
    for service in [
        Service::Audit,
        Service::Permission,
        Service::Registry,
        Service::InputHandlers,
        Service::Calls,
    ] {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let before = ok.load(Ordering::SeqCst);
        let old = h.service_actor(service).await.expect("running");
        old.kill();
        let rebuilt = async {
            loop {
                if let Some(new) = h.service_actor(service).await
                    && new.get_id() != old.get_id()
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), rebuilt)
            .await
            .unwrap_or_else(|_| panic!("{service:?} rebuilt"));
        assert!(
            eventually(Duration::from_secs(5), || ok.load(Ordering::SeqCst)
                > before + 20)
            .await,
            "calls keep working after {service:?} was killed"
        );
    }
    // What the rebuilt actors own still works: grants, handlers, the cache's writer.
    h.grant("late", "s", &["echo"])
        .await
        .expect("permission actor rebuilt");
    h.call_tool(&Caller::agent("late"), "s__echo", json!({"text": "y"}))
        .await
        .expect("the new grant applies");
    h.register_input_handler(
        "elicitation/create",
        Arc::new(FixedAnswers::new(
            json!({"action": "accept", "content": {"approved": false}}),
        )),
    )
    .await
    .expect("input handlers' owner rebuilt");
    stop.store(true, Ordering::SeqCst);
    while traffic.join_next().await.is_some() {}
    let calls = made.load(Ordering::SeqCst) + 1;
    h.shutdown().await;
    let records = audit_records(&audit);
    let started = records.iter().filter(|r| r["event"] == "started").count() as u64;
    let finished = records.iter().filter(|r| r["event"] == "finished").count() as u64;
    assert_eq!(
        (started, finished),
        (calls, calls),
        "one started and one finished per call"
    );
    let mut ids: Vec<u64> = records
        .iter()
        .filter(|r| r["event"] == "finished")
        .filter_map(|r| r["call_id"].as_u64())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len() as u64, calls, "no call finished twice");
}

// The calls actor killed again soon after its rebuild is rebuilt at once all the same:
// a pause left every call made meanwhile on a dead worker's token, each failing
// `worker_died` at once, and a caller in a loop used up its calls on them (the chaos
// soak's ok rate fell to 0.55).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_calls_actor_killed_twice_in_a_row_is_never_left_down() {
    let audit = temp_file("calls-twice-audit");
    let h = start_ready(config(&audit)).await;
    for round in 0..3 {
        let old = h.service_actor(Service::Calls).await.expect("running");
        old.kill();
        // Each answer is the old actor until the root hears of its death, and the
        // rebuilt one from then on: never none, which is what a paused service answers.
        loop {
            let now = h
                .service_actor(Service::Calls)
                .await
                .unwrap_or_else(|| panic!("kill {round}: the calls actor was left down"));
            if now.get_id() != old.get_id() {
                break;
            }
            tokio::task::yield_now().await;
        }
        h.call_tool(&Caller::agent("a"), "s__echo", json!({"text": "x"}))
            .await
            .unwrap_or_else(|e| panic!("a call after kill {round}: {e}"));
    }
    h.shutdown().await;
}

// A caller retrying in a loop a call that fails at once does not hold its thread for
// good: on a runtime of one thread, a timer set beside the loop fires while it runs.
// (In the chaos soak, callers retrying calls on a dead worker's token held both threads
// for 300 ms, and with them the timer of the rebuild that would have ended it.)
#[tokio::test(flavor = "current_thread")]
async fn a_caller_looping_on_calls_that_fail_at_once_lets_the_runtime_run() {
    let audit = temp_file("fail-loop-audit");
    let h = start_ready(config(&audit)).await;
    h.shutdown().await;
    let fired = Arc::new(AtomicBool::new(false));
    let timer = fired.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(5)).await;
        timer.store(true, Ordering::SeqCst);
    });
    let mut calls = 0u64;
    while !fired.load(Ordering::SeqCst) {
        assert!(calls < 1_000_000, "the timer never fired in {calls} calls");
        let e = h
            .call_tool(&Caller::agent("a"), "s__echo", json!({"text": "x"}))
            .await
            .expect_err("shut down");
        assert_eq!(e.code(), "shut_down");
        calls += 1;
    }
}

// A call whose token was cancelled before it began is recorded, never routed or sent:
// its first poll reached the server before the token was looked at, and a tool could
// run for a call that answered `Cancelled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_cancelled_before_it_begins_is_recorded_and_never_sent() {
    let audit = temp_file("pre-cancel-audit");
    let (stdio_record, http_record) = (temp_file("pre-cancel-s"), temp_file("pre-cancel-h"));
    let web = HttpServer::demo(&["--record", &http_record.to_string_lossy()]).await;
    let mut cfg = config(&audit);
    cfg.servers = vec![
        demo_server("s", &["--record", &stdio_record.to_string_lossy()]),
        mcp_harness::ServerConfig::new("h", web.spec()),
    ];
    let h = start_ready(cfg).await;
    let token = CancelToken::new();
    token.cancel();
    for _ in 0..25 {
        for tool in ["s__add", "h__add"] {
            let options = CallOptions {
                cancel: Some(token.clone()),
                ..CallOptions::default()
            };
            let args = json!({"a": 1, "b": 2});
            let outcome = h
                .call(&Caller::agent("a"), CallKind::Tool, tool, args, options)
                .await;
            assert!(matches!(outcome, Err(CallError::Cancelled)), "{outcome:?}");
        }
    }
    // A call after them on each: a server that has it would have had the others (stdin
    // is read in order; an HTTP request is recorded as it arrives, and this one comes
    // later).
    for tool in ["s__echo", "h__echo"] {
        h.call_tool(&Caller::agent("a"), tool, json!({"text": "after"}))
            .await
            .expect("echo");
    }
    tokio::time::sleep(Duration::from_millis(200)).await; // for a stray request (deliberate)
    for record in [&stdio_record, &http_record] {
        assert_eq!(
            calls_recorded(record, "add"),
            0,
            "a cancelled call was sent"
        );
        assert_eq!(calls_recorded(record, "echo"), 1);
    }
    h.shutdown().await;
    let records = audit_records(&audit);
    let cancelled = records
        .iter()
        .filter(|r| r["event"] == "finished" && r["outcome"] == "cancelled")
        .count();
    let started = records.iter().filter(|r| r["event"] == "started").count();
    assert_eq!((started, cancelled), (52, 50), "both records of each call");
}

// A delegated call that continues a round must name the server whose round it is: its
// requestState and answers would otherwise go wherever routing sends the call. And a
// round count handed in by the caller does not overflow.
#[tokio::test]
async fn a_continued_round_names_its_server_and_its_count_saturates() {
    let audit = temp_file("delegated-audit");
    let h = start_ready(config(&audit)).await;
    let continuation = |server: Option<&str>, rounds: usize| mcp_harness::Delegation {
        capabilities: json!({"elicitation": {}}),
        request_state: Some("state".into()),
        rounds,
        server: server.map(String::from),
        ..Default::default()
    };
    let unpinned = h
        .call_delegated(
            &Caller::agent("a"),
            CallKind::Tool,
            "s__confirm",
            json!({"message": "ok?"}),
            Some(continuation(None, 0)),
            CallOptions::default(),
        )
        .await;
    assert!(
        matches!(unpinned, Err(CallError::RoundWithoutServer)),
        "{unpinned:?}"
    );
    let capped = h
        .call_delegated(
            &Caller::agent("a"),
            CallKind::Tool,
            "s__confirm",
            json!({"message": "ok?"}),
            Some(continuation(Some("s"), usize::MAX)),
            CallOptions::default(),
        )
        .await;
    assert!(
        matches!(capped, Err(CallError::RoundCap { .. })),
        "{capped:?}"
    );
    h.shutdown().await;
}

// A round's continuation names what its server was (`Answer::server_identity`): once a
// reload has put another server under the id, the continuation goes nowhere instead of
// taking the first server's state and answers to the second. Before, only the id was
// checked.
#[tokio::test]
async fn a_continued_round_goes_only_to_the_server_that_asked() {
    let audit = temp_file("identity-audit");
    let h = start_ready(config(&audit)).await;
    let caps = json!({"elicitation": {"form": {}}});
    let first = h
        .call_delegated(
            &Caller::agent("a"),
            CallKind::Tool,
            "s__confirm",
            json!({"message": "ok?"}),
            Some(mcp_harness::Delegation {
                capabilities: caps.clone(),
                ..Default::default()
            }),
            CallOptions::default(),
        )
        .await
        .expect("a round");
    assert!(first.input_required, "{:?}", first.result);
    let identity = first
        .server_identity
        .clone()
        .expect("named when input_required");
    let continuation = |identity: &str| mcp_harness::Delegation {
        capabilities: caps.clone(),
        input_responses: Some(
            json!({"confirm": {"action": "accept", "content": {"approved": true}}})
                .as_object()
                .cloned()
                .unwrap_or_default(),
        ),
        request_state: first.result["requestState"].as_str().map(String::from),
        rounds: first.rounds,
        server: Some("s".into()),
        server_identity: Some(identity.to_string()),
        ..Default::default()
    };
    let answer = |identity: &str| {
        h.call_delegated(
            &Caller::agent("a"),
            CallKind::Tool,
            "s__confirm",
            json!({"message": "ok?"}),
            Some(continuation(identity)),
            CallOptions::default(),
        )
    };
    // The same server: answered.
    let done = answer(&identity).await.expect("answered");
    assert!(!done.input_required, "{:?}", done.result);
    // Another under its id: no route.
    h.replace_server(demo_server("s", &["--ttl-ms", "1000"]))
        .await
        .expect("replaced");
    let moved = answer(&identity).await;
    assert!(matches!(moved, Err(CallError::NoRoute { .. })), "{moved:?}");
    h.shutdown().await;
}

#[tokio::test]
async fn dropping_a_calls_future_cancels_it_on_the_server_and_records_it_as_cancelled() {
    let audit = temp_file("drop-cancel-audit");
    let record = temp_file("drop-cancel-record");
    let mut cfg = config(&audit);
    cfg.servers = vec![demo_server("s", &["--record", &record.to_string_lossy()])];
    let h = start_ready(cfg).await;
    // Driven until the server has the request (recorded on arrival), then dropped.
    let mut call = Box::pin(h.call_tool(&Caller::agent("a"), "s__hang", json!({})));
    let arrived = || calls_recorded(&record, "hang") == 1;
    let reached = tokio::select! {
        r = &mut call => Err(r),
        seen = eventually(Duration::from_secs(10), arrived) => Ok(seen),
    };
    assert!(
        matches!(reached, Ok(true)),
        "the call was still running when its future was dropped: {reached:?}"
    );
    drop(call);
    assert!(
        eventually(Duration::from_secs(5), || recorded(&record)
            .iter()
            .any(|r| r["notification"] == "notifications/cancelled"))
        .await,
        "the server was told"
    );
    h.shutdown().await;
    let records = audit_records(&audit);
    let finished: Vec<_> = records
        .iter()
        .filter(|r| r["event"] == "finished")
        .collect();
    assert_eq!(finished.len(), 1);
    assert_eq!(finished[0]["outcome"], "cancelled");
}

#[tokio::test]
async fn cancelling_a_call_through_its_token_withdraws_its_pending_input_request() {
    let audit = temp_file("token-cancel-audit");
    let queue = ApprovalQueue::new(Duration::from_secs(600));
    let h = start_ready_with(
        Harness::builder(config(&audit))
            .input_handler("elicitation/create", Arc::new(queue.clone())),
    )
    .await;
    let token = CancelToken::new();
    let options = CallOptions {
        cancel: Some(token.clone()),
        ..CallOptions::default()
    };
    let call = tokio::spawn(h.call(
        &Caller::agent("a"),
        CallKind::Tool,
        "s__confirm",
        json!({}),
        options,
    ));
    assert!(eventually(Duration::from_secs(10), || !queue.pending().is_empty()).await);
    token.cancel();
    assert_eq!(call.await.expect("task"), Err(CallError::Cancelled));
    assert!(
        eventually(Duration::from_secs(5), || queue.pending().is_empty()).await,
        "the approval request left the queue"
    );
    h.shutdown().await;
    let records = audit_records(&audit);
    assert!(
        records
            .iter()
            .any(|r| r["event"] == "finished" && r["outcome"] == "cancelled")
    );
}

#[tokio::test]
async fn one_deadline_bounds_all_of_a_calls_rounds() {
    let audit = temp_file("deadline-audit");
    let mut cfg = config(&audit);
    cfg.round_cap = 10_000;
    cfg.call_timeout = Duration::from_millis(800);
    let h = start_ready(cfg).await;
    let started = Instant::now();
    let r = h
        .call_tool(&Caller::agent("a"), "s__forever", json!({}))
        .await;
    assert_eq!(
        r,
        Err(CallError::DeadlineExceeded(Duration::from_millis(800)))
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // A call's own deadline overrides the config's.
    let options = CallOptions {
        timeout: Some(Duration::from_millis(300)),
        ..CallOptions::default()
    };
    let r = h
        .call(
            &Caller::agent("a"),
            CallKind::Tool,
            "s__forever",
            json!({}),
            options,
        )
        .await;
    assert_eq!(
        r,
        Err(CallError::DeadlineExceeded(Duration::from_millis(300)))
    );
    h.shutdown().await;
}

/// Records whose each question was.
struct Recording(parking_lot::Mutex<Vec<mcp_harness::InputRequestContext>>);

impl mcp_harness::InputHandler for Recording {
    fn capability(&self) -> serde_json::Value {
        json!({})
    }
    fn answer(
        &self,
        request: mcp_harness::InputRequestContext,
    ) -> mcp_harness::call::input::InputFuture {
        self.0.lock().push(request);
        Box::pin(async { Ok(json!({"action": "accept", "content": {"approved": true}})) })
    }
}

// A call that waits in the server's queue through a restart does not know which era
// the next connection speaks: if legacy, the server's questions during the call are
// that call's, with its agent (a modern connection's would be refused, so only there
// the call is not noted).
#[tokio::test]
async fn a_call_that_waits_through_a_restart_onto_a_legacy_connection_owns_its_questions() {
    let marker = temp_file("era-flip");
    let _ = std::fs::remove_file(&marker);
    // Modern the first time, legacy after.
    let script = r#"if [ -e "$0" ]; then exec "$1" demo-server s --era legacy; else : > "$0"; exec "$1" demo-server s; fi"#;
    let mut server = mcp_harness::ServerConfig::stdio(
        "s",
        "sh",
        vec![
            "-c".to_string(),
            script.to_string(),
            marker.display().to_string(),
            harness_exe(),
        ],
    );
    server.restart = mcp_harness::RestartConfig {
        min_delay: Duration::from_millis(500),
        max_delay: Duration::from_millis(500),
        ..mcp_harness::RestartConfig::default()
    };
    let config = HarnessConfig {
        servers: vec![server],
        permissions: grant_everything(&["a"]),
        ..HarnessConfig::default()
    };
    let recording = Arc::new(Recording(parking_lot::Mutex::default()));
    let h = start_ready_with(
        Harness::builder(config).input_handler("elicitation/create", recording.clone()),
    )
    .await;
    let status = h.server_status("s").expect("status");
    assert_eq!(status.protocol_version.as_deref(), Some("2026-07-28"));
    kill_and_see_it_go(&h).await;
    let result = h
        .call_tool(
            &Caller::agent("a"),
            "s__confirm",
            json!({"message": "Ship it?"}),
        )
        .await
        .expect("the call waits for the restart and completes");
    assert_eq!(text(&result), "approved: true");
    let status = h.server_status("s").expect("status");
    assert_ne!(status.protocol_version.as_deref(), Some("2026-07-28"));
    let asked = recording.0.lock().clone();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(asked[0].agent_id.as_deref(), Some("a"));
    assert!(asked[0].call_id.is_some(), "the one call on the server");
    assert!(!asked[0].shared);
    h.shutdown().await;
    let _ = std::fs::remove_file(&marker);
}

/// A legacy demo server that records what reaches it and comes back `delay` after it dies.
fn recorded_legacy_server(record: &std::path::Path, delay: Duration) -> HarnessConfig {
    let mut server = demo_server(
        "s",
        &["--era", "legacy", "--record", &record.display().to_string()],
    );
    server.restart = mcp_harness::RestartConfig {
        min_delay: delay,
        max_delay: delay,
        ..mcp_harness::RestartConfig::default()
    };
    HarnessConfig {
        servers: vec![server],
        permissions: grant_everything(&["a", "b"]),
        ..HarnessConfig::default()
    }
}

/// Kills server `s` and waits until the harness has seen it go.
async fn kill_and_see_it_go(h: &mcp_harness::HarnessHandle) {
    let pid = h.server_status("s").and_then(|s| s.pid).expect("pid");
    sigkill(pid);
    assert!(
        eventually(Duration::from_secs(10), || {
            h.server_status("s")
                .is_some_and(|s| s.state != mcp_harness::ServerState::Ready)
        })
        .await,
        "the harness saw the server go"
    );
}

/// A call of `agent` to server `s`'s `slow` tool that lasts, spawned, once its request
/// has reached the server (as its `--record` file shows).
async fn slow_call_on_the_server(
    h: &mcp_harness::HarnessHandle,
    agent: &str,
    record: &std::path::PathBuf,
) -> tokio::task::JoinHandle<Result<serde_json::Value, CallError>> {
    let call = tokio::spawn(h.call_tool(
        &Caller::agent(agent),
        "s__slow",
        json!({"ms": 30_000, "text": agent}),
    ));
    assert!(
        eventually(Duration::from_secs(10), || calls_recorded(record, "slow")
            == 1)
        .await,
        "the request reached the server"
    );
    call
}

// A call cancelled while its request waits in the server's queue for a restart is
// not sent to the new process: run for nobody, it would reach a legacy connection
// unnoted, and the server's questions during it would be taken for another call's.
#[tokio::test]
async fn a_call_cancelled_while_it_waits_for_a_restart_is_never_sent() {
    let record = temp_file("queued-cancel");
    let h = start_ready(recorded_legacy_server(&record, Duration::from_millis(1500))).await;
    kill_and_see_it_go(&h).await;
    let waiting = h.call_tool(&Caller::agent("a"), "s__echo", json!({"text": "abandoned"}));
    assert!(
        tokio::time::timeout(Duration::from_millis(300), waiting)
            .await
            .is_err(),
        "the call waits for the restart"
    );
    assert!(wait_state(&h, "s", mcp_harness::ServerState::Ready).await);
    // A call after it goes through the same connection: once it is answered, anything
    // queued before it would have reached the server.
    let after = h
        .call_tool(&Caller::agent("a"), "s__echo", json!({"text": "after"}))
        .await
        .expect("the server is back");
    assert_eq!(text(&after), "after");
    let sent: Vec<_> = recorded(&record)
        .into_iter()
        .filter(|r| r["method"] == "tools/call")
        .map(|r| r["params"]["arguments"]["text"].clone())
        .collect();
    assert_eq!(sent, vec![json!("after")]);
    h.shutdown().await;
}

// A request released from the queue runs in a task of the server's: when its caller
// goes, the request is cancelled on the server, as one sent straight from the caller.
#[tokio::test]
async fn a_call_released_from_the_queue_is_cancelled_on_the_server_when_dropped() {
    let record = temp_file("released-cancel");
    let h = start_ready(recorded_legacy_server(&record, Duration::from_millis(500))).await;
    kill_and_see_it_go(&h).await;
    let call = slow_call_on_the_server(&h, "a", &record).await;
    call.abort();
    let id = recorded(&record)
        .into_iter()
        .find(|r| r["method"] == "tools/call")
        .map(|r| r["id"].clone())
        .expect("the request's id");
    assert!(
        eventually(Duration::from_secs(10), || {
            recorded(&record).iter().any(|r| {
                r["notification"] == "notifications/cancelled" && r["params"]["requestId"] == id
            })
        })
        .await,
        "the server was told: {:?}",
        recorded(&record)
    );
    h.shutdown().await;
}

// A legacy server's question names no request: it is taken for the one call on the
// server. A request of no call on it at the same time (an embedder's own, a listing)
// may be the one asking, so the question is then nobody's, not that call's agent's.
#[tokio::test]
async fn a_question_while_a_request_of_no_call_is_on_the_server_is_no_agents() {
    let record = temp_file("unowned-question");
    let config = recorded_legacy_server(&record, Duration::from_secs(30));
    let recording = Arc::new(Recording(parking_lot::Mutex::default()));
    let h = start_ready_with(
        Harness::builder(config).input_handler("elicitation/create", recording.clone()),
    )
    .await;
    let other = slow_call_on_the_server(&h, "b", &record).await;
    let own = h
        .request(
            "s",
            "tools/call",
            Some(json!({"name": "confirm", "arguments": {"message": "Ship it?"}})),
        )
        .await
        .expect("the embedder's own request");
    assert_eq!(text(&own), "approved: true");
    let asked = recording.0.lock().clone();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(asked[0].agent_id, None, "not agent b's question");
    assert_eq!(asked[0].call_id, None);
    assert!(asked[0].shared);
    other.abort();
    h.shutdown().await;
}

// Durations near `Duration::MAX` (an embedder's "no deadline") are taken as ten years,
// not added to a clock where they would overflow.
#[tokio::test]
async fn a_call_with_the_longest_deadline_there_is_runs() {
    let mut server = demo_server("s", &[]);
    server.timeout = Duration::MAX;
    let h = start_ready(HarnessConfig {
        servers: vec![server],
        permissions: grant_everything(&["a"]),
        call_timeout: Duration::MAX,
        ..HarnessConfig::default()
    })
    .await;
    let options = CallOptions {
        timeout: Some(Duration::MAX),
        ..CallOptions::default()
    };
    let result = h
        .call(
            &Caller::agent("a"),
            CallKind::Tool,
            "s__echo",
            json!({"text": "hi"}),
            options,
        )
        .await
        .expect("the call runs");
    assert_eq!(text(&result), "hi");
    let schema = h.get_tool_schema(&Caller::agent("a"), "s__echo").await;
    assert!(schema.is_ok(), "{schema:?}");
    h.shutdown().await;
}
