//! One test per README promise that had none: each asserts what the README says, so
//! that it fails when the promise breaks. Real processes throughout (the demo server,
//! with `--record` to see what a server actually received).

mod support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use mcp_harness::audit::AuditConfig;
use mcp_harness::registry::cache::CacheConfig;
use mcp_harness::{
    ApprovalQueue, CallError, CallKind, Caller, FixedAnswers, Harness, HarnessConfig, InputHandler,
    InputRequestContext, RestartConfig, RestartPolicy, ServerConfig, ServerState,
};
use serde_json::{Value, json};
use support::*;

fn a() -> Caller {
    Caller::agent("a").with_auth_context("ctx")
}

fn config(servers: Vec<ServerConfig>) -> HarnessConfig {
    HarnessConfig {
        servers,
        permissions: grant_everything(&["a"]),
        ..HarnessConfig::default()
    }
}

fn with_record(id: &str, record: &Path, extra: &[&str]) -> ServerConfig {
    let record = record.to_string_lossy().into_owned();
    let mut args = vec!["--record", record.as_str()];
    args.extend_from_slice(extra);
    demo_server(id, &args)
}

/// The `tools/call`s (their params) a server recorded.
fn calls_in(record: &std::path::PathBuf) -> Vec<Value> {
    recorded(record)
        .into_iter()
        .filter(|r| r["method"] == "tools/call")
        .map(|r| r["params"].clone())
        .collect()
}

fn count(record: &std::path::PathBuf, method: &str) -> usize {
    recorded(record)
        .iter()
        .filter(|r| r["method"] == method)
        .count()
}

/// Whether nothing is left of `pid`, not even a zombie.
fn gone(pid: u32) -> bool {
    proc_stat(pid).is_none()
}

fn accept_all() -> Arc<FixedAnswers> {
    Arc::new(FixedAnswers::new(
        json!({"action": "accept", "content": {"approved": true, "x": "y"}}),
    ))
}

// --- Processes -------------------------------------------------------------------

#[tokio::test]
async fn a_stopped_server_is_reaped_on_removal_actor_kill_and_shutdown_not_left_a_zombie() {
    let h = start_ready(config(vec![
        demo_server("s", &[]),
        demo_server("t", &[]),
        demo_server("u", &[]),
    ]))
    .await;
    let pid = |id: &str| h.server_status(id).and_then(|s| s.pid).expect("pid");
    let (s, t, u) = (pid("s"), pid("t"), pid("u"));
    h.remove_server("s").await.expect("remove");
    assert!(
        eventually(Duration::from_secs(10), || gone(s)).await,
        "removed: {s} not reaped"
    );
    h.server_actor("t").expect("actor").kill();
    assert!(
        eventually(Duration::from_secs(10), || gone(t)).await,
        "actor killed: {t} not reaped"
    );
    h.shutdown().await;
    assert!(
        gone(u),
        "shutdown returned with {u} still in the process table"
    );
}

#[tokio::test]
async fn killing_the_connection_actor_kills_the_process_and_the_server_comes_back() {
    let mut s = demo_server("s", &["--ignore-sigterm", "--spawn-child"]);
    s.restart.min_delay = Duration::from_millis(50);
    s.restart.max_delay = Duration::from_millis(50);
    let h = start_ready(config(vec![s])).await;
    let before = h.server_status("s").expect("status");
    let pid = before.pid.expect("pid");
    assert!(
        group_members(pid).len() >= 2,
        "the server and its grandchild"
    );
    let actor = h.server_actor("s").expect("server actor");
    let children = actor.get_children();
    assert_eq!(
        children.len(),
        1,
        "one connection actor below the server actor"
    );
    children[0].kill();
    // The server ignores SIGTERM: only the harness's SIGKILL of the group ends it.
    assert!(
        eventually(Duration::from_secs(10), || group_members(pid).is_empty()).await,
        "the old process group survived its connection actor"
    );
    assert!(
        eventually(Duration::from_secs(10), || h
            .server_status("s")
            .is_some_and(
                |st| st.state == ServerState::Ready && st.pid.is_some_and(|p| p != pid)
            ))
        .await
    );
    let after = h.server_status("s").expect("status");
    assert_eq!(
        after.actor_rebuilds, before.actor_rebuilds,
        "the server actor itself lived"
    );
    assert_eq!(after.restarts, before.restarts + 1);
    let r = h
        .call_tool(&a(), "s__echo", json!({"text": "back"}))
        .await
        .expect("serves");
    assert_eq!(text(&r), "back");
    h.shutdown().await;
}

#[tokio::test]
async fn restart_server_brings_a_failed_server_back() {
    let dir = temp_file("failed-dir");
    std::fs::create_dir_all(&dir).expect("dir");
    let link = dir.join("server");
    let mut late = ServerConfig::stdio(
        "late",
        link.to_string_lossy().into_owned(),
        ["demo-server", "late"],
    );
    late.restart = RestartConfig {
        min_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(10),
        max_restarts: 1,
        ..RestartConfig::default()
    };
    let h = Harness::spawn(config(vec![late])).await.expect("spawn");
    assert!(wait_state(&h, "late", ServerState::Failed).await);
    std::os::unix::fs::symlink(harness_exe(), &link).expect("symlink");
    h.restart_server("late").await.expect("restart");
    assert!(
        wait_state(&h, "late", ServerState::Ready).await,
        "{:?}",
        h.server_status("late")
    );
    let r = h
        .call_tool(&a(), "late__echo", json!({"text": "up"}))
        .await
        .expect("serves");
    assert_eq!(text(&r), "up");
    h.shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn restarts_back_off_exponentially_in_the_running_actor() {
    let mut s = demo_server("s", &["--crash-on-start"]);
    s.restart = RestartConfig {
        min_delay: Duration::from_millis(200),
        max_delay: Duration::from_millis(800),
        max_restarts: 4,
        within: Duration::from_secs(600),
        ..RestartConfig::default()
    };
    let started = Instant::now();
    let h = Harness::spawn(config(vec![s])).await.expect("spawn");
    assert!(wait_state(&h, "s", ServerState::Failed).await);
    // Four delays of at least 200, 400, 800 and 800 ms (jitter only adds).
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(2200),
        "gave up after {took:?}"
    );
    assert_eq!(h.server_status("s").map(|st| st.restarts), Some(4));
    h.shutdown().await;
}

#[tokio::test]
async fn a_healthy_period_resets_the_backoff_in_the_running_actor() {
    // Each crash comes after a healthy period, so every restart waits the first delay;
    // without the reset the fourth would wait 8 x 300 ms.
    let run = |healthy_after: Duration| async move {
        let mut s = demo_server("s", &[]);
        s.restart = RestartConfig {
            min_delay: Duration::from_millis(300),
            max_delay: Duration::from_secs(10),
            healthy_after,
            max_restarts: 100,
            ..RestartConfig::default()
        };
        let h = start_ready(config(vec![s])).await;
        let mut last = Duration::ZERO;
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_millis(400)).await; // a healthy period (deliberate)
            let pid = h.server_status("s").and_then(|st| st.pid).expect("pid");
            let t = Instant::now();
            let _ = h.call_tool(&a(), "s__crash", json!({})).await;
            assert!(
                eventually(Duration::from_secs(30), || h
                    .server_status("s")
                    .is_some_and(|st| {
                        st.state == ServerState::Ready && st.pid.is_some_and(|p| p != pid)
                    }))
                .await
            );
            last = t.elapsed();
        }
        h.shutdown().await;
        last
    };
    let with_reset = run(Duration::from_millis(200)).await;
    let without = run(Duration::from_secs(60)).await;
    assert!(
        without >= Duration::from_millis(2400),
        "without a reset the 4th restart waits 2.4 s or more: {without:?}"
    );
    assert!(
        with_reset < without / 2,
        "after healthy periods the 4th restart waits the first delay: {with_reset:?} vs {without:?}"
    );
}

// --- Routing and failover ----------------------------------------------------------

#[tokio::test]
async fn a_bare_name_skips_a_stopped_server_without_a_hop() {
    let audit = temp_file("skip-audit");
    let mut first = demo_server("first", &[]);
    first.priority = 10;
    first.restart.policy = RestartPolicy::Temporary;
    let mut cfg = config(vec![first, demo_server("second", &[])]);
    cfg.audit = AuditConfig {
        path: Some(audit.clone()),
        ..AuditConfig::default()
    };
    let h = start_ready(cfg).await;
    let _ = h.call_tool(&a(), "first__crash", json!({})).await;
    assert!(wait_state(&h, "first", ServerState::Stopped).await);
    let r = h
        .call_tool(&a(), "server_name", json!({}))
        .await
        .expect("served");
    assert_eq!(text(&r), "second");
    h.shutdown().await;
    let finished: Vec<Value> = audit_records(&audit)
        .into_iter()
        .filter(|r| r["event"] == "finished" && r["outcome"] == "ok")
        .collect();
    let last = finished.last().expect("the bare call's record");
    assert_eq!(last["server"], "second");
    assert_eq!(last["hops"], json!([]), "a stopped server is not a hop");
    let _ = std::fs::remove_file(audit);
}

#[tokio::test]
async fn a_call_that_never_reached_a_server_fails_over_and_succeeds_with_the_hop_in_the_audit() {
    let audit = temp_file("hop-audit");
    let record = temp_file("hop-record");
    let mut first = with_record("first", &record, &[]);
    first.priority = 10;
    first.max_in_flight = 1;
    let mut cfg = config(vec![first, demo_server("second", &[])]);
    cfg.audit = AuditConfig {
        path: Some(audit.clone()),
        ..AuditConfig::default()
    };
    let h = start_ready(cfg).await;
    // The lists come from the cache from now on, so the first server is a candidate.
    h.list_tools(&a()).await.expect("list");
    let busy = {
        let h = h.clone();
        tokio::spawn(async move { h.call_tool(&a(), "first__slow", json!({"ms": 1500})).await })
    };
    assert!(
        eventually(Duration::from_secs(10), || calls_in(&record)
            .iter()
            .any(|c| c["name"] == "slow"))
        .await
    );
    let r = h
        .call_tool(&a(), "server_name", json!({}))
        .await
        .expect("failed over");
    assert_eq!(text(&r), "second");
    busy.await.expect("join").expect("the slow call");
    h.shutdown().await;
    assert!(
        !calls_in(&record).iter().any(|c| c["name"] == "server_name"),
        "the first server never got it"
    );
    let record_of = audit_records(&audit)
        .into_iter()
        .find(|r| r["event"] == "finished" && r["server"] == "second")
        .expect("finished on second");
    assert_eq!(record_of["outcome"], "ok");
    assert_eq!(record_of["hops"][0]["server"], "first");
    assert!(
        record_of["hops"][0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("in flight")
                || e.contains("overloaded")
                || e.contains("capacity")),
        "{record_of}"
    );
    let _ = std::fs::remove_file(audit);
    let _ = std::fs::remove_file(record);
}

#[tokio::test]
async fn a_call_queued_at_a_server_whose_actor_dies_fails_over_though_its_tool_is_not_retry_safe() {
    let audit = temp_file("unavailable-audit");
    let record = temp_file("unavailable-record");
    let mut first = with_record("first", &record, &[]);
    first.priority = 10;
    first.restart.min_delay = Duration::from_secs(30);
    first.restart.max_delay = Duration::from_secs(30);
    let mut second = demo_server("second", &[]);
    second.restart.min_delay = Duration::from_millis(1500);
    second.restart.max_delay = Duration::from_millis(1500);
    let mut cfg = config(vec![first, second]);
    cfg.audit = AuditConfig {
        path: Some(audit.clone()),
        ..AuditConfig::default()
    };
    let h = start_ready(cfg).await;
    // The lists come from the cache from now on, so both stay candidates while down.
    h.list_tools(&a()).await.expect("list");
    for server in ["first", "second"] {
        let _ = h
            .call_tool(&a(), &format!("{server}__crash"), json!({}))
            .await;
        assert!(wait_state(&h, server, ServerState::Restarting).await);
    }
    let before = calls_in(&record).len();
    // `server_name` is not retry-safe (annotations are not trusted by default): only a
    // request that never left the harness may go to another server.
    let call = {
        let h = h.clone();
        tokio::spawn(async move { h.call_tool(&a(), "server_name", json!({})).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    h.server_actor("first").expect("first's actor").kill();
    let r = call.await.expect("join").expect("failed over");
    assert_eq!(text(&r), "second");
    h.shutdown().await;
    assert_eq!(
        calls_in(&record).len(),
        before,
        "the first server never got it"
    );
    let record_of = audit_records(&audit)
        .into_iter()
        .find(|r| r["event"] == "finished" && r["server"] == "second" && r["outcome"] == "ok")
        .expect("served by second");
    assert_eq!(record_of["hops"][0]["server"], "first");
    assert!(
        record_of["hops"][0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("unavailable")),
        "{record_of}"
    );
    let _ = std::fs::remove_file(audit);
    let _ = std::fs::remove_file(record);
}

// --- Input rounds ------------------------------------------------------------------

/// Answers only once `n` requests wait at once: a sequential caller never gets past it.
struct Together {
    barrier: Arc<tokio::sync::Barrier>,
}

impl InputHandler for Together {
    fn answer(&self, _request: InputRequestContext) -> mcp_harness::call::input::InputFuture {
        let barrier = self.barrier.clone();
        Box::pin(async move {
            match tokio::time::timeout(Duration::from_secs(10), barrier.wait()).await {
                Ok(_) => Ok(json!({"action": "accept", "content": {"x": "y"}})),
                Err(_) => Err(mcp_harness::call::input::InputError::Failed(
                    "answered one at a time".into(),
                )),
            }
        })
    }
}

#[tokio::test]
async fn the_input_requests_of_one_round_are_answered_in_parallel() {
    let together = Arc::new(Together {
        barrier: Arc::new(tokio::sync::Barrier::new(4)),
    });
    let h = start_ready_with(
        Harness::builder(config(vec![demo_server("s", &[])]))
            .input_handler("elicitation/create", together),
    )
    .await;
    let r = h
        .call_tool(&a(), "s__many_inputs", json!({"n": 4}))
        .await
        .expect("all four answered together");
    assert_eq!(text(&r), "got 4 answers");
    h.shutdown().await;
}

#[tokio::test]
async fn a_retry_carries_no_request_state_when_the_server_sent_none() {
    let record = temp_file("no-state");
    let h = start_ready_with(
        Harness::builder(config(vec![with_record("s", &record, &[])]))
            .input_handler("elicitation/create", accept_all()),
    )
    .await;
    h.call_tool(&a(), "s__many_inputs", json!({"n": 1}))
        .await
        .expect("answered");
    h.shutdown().await;
    let calls = calls_in(&record);
    assert_eq!(calls.len(), 2);
    assert!(calls[1].get("inputResponses").is_some());
    assert!(
        calls[1].get("requestState").is_none(),
        "state invented: {}",
        calls[1]
    );
    let _ = std::fs::remove_file(record);
}

#[tokio::test]
async fn state_only_rounds_are_paced_from_50_ms_doubling_to_250_ms() {
    let record = temp_file("pacing");
    let mut cfg = config(vec![with_record("s", &record, &[])]);
    cfg.round_cap = 4;
    let h = start_ready(cfg).await;
    let t = Instant::now();
    let e = h
        .call_tool(&a(), "s__forever", json!({}))
        .await
        .expect_err("capped");
    let took = t.elapsed();
    assert!(matches!(e, CallError::RoundCap { cap: 4, .. }), "{e:?}");
    // Four pauses before the four retries: 50 + 100 + 200 + 250 ms.
    assert!(took >= Duration::from_millis(600), "not paced: {took:?}");
    assert_eq!(calls_in(&record).len(), 5);
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
}

#[tokio::test]
async fn the_round_cap_counts_across_failover_and_the_next_server_starts_without_state() {
    for (cap, succeeds) in [(3, false), (10, true)] {
        let (ra, rb) = (temp_file("cap-a"), temp_file("cap-b"));
        let mut first = with_record("first", &ra, &[]);
        first.priority = 10;
        first.restart.policy = RestartPolicy::Temporary;
        let second = with_record("second", &rb, &[]);
        let mut cfg = config(vec![first, second]);
        cfg.round_cap = cap;
        let queue = ApprovalQueue::new(Duration::from_secs(60));
        let h = start_ready_with(
            Harness::builder(cfg).input_handler("elicitation/create", Arc::new(queue.clone())),
        )
        .await;
        let call = {
            let h = h.clone();
            tokio::spawn(async move { h.call_tool(&a(), "rounds", json!({"n": 3})).await })
        };
        // First server, round one: its question waits; the server dies meanwhile.
        let pending = queue.next_pending().await;
        assert_eq!(pending[0].request.server, "first");
        let pid = h.server_status("first").and_then(|s| s.pid).expect("pid");
        sigkill(pid);
        assert!(wait_state(&h, "first", ServerState::Stopped).await);
        let answer = json!({"action": "accept", "content": {"answer": "a0"}});
        queue.answer(pending[0].id, answer.clone());
        // The retry cannot reach the first server: the call goes to the second, afresh.
        for _ in 0..3 {
            let Ok(next) =
                tokio::time::timeout(Duration::from_secs(10), queue.next_pending()).await
            else {
                break;
            };
            for p in next {
                assert_eq!(p.request.server, "second");
                queue.answer(p.id, answer.clone());
            }
        }
        let outcome = call.await.expect("join");
        let b_calls = calls_in(&rb);
        assert!(
            b_calls[0].get("requestState").is_none() && b_calls[0].get("inputResponses").is_none(),
            "the second server got the first one's state: {}",
            b_calls[0]
        );
        if succeeds {
            outcome.expect("within the cap");
            assert_eq!(b_calls.len(), 4, "three rounds and the final retry");
        } else {
            // One round on the first server and two on the second reach the cap of 3.
            let e = outcome.expect_err("capped");
            assert!(
                matches!(&e, CallError::RoundCap { cap: 3, server } if server == "second"),
                "{e:?}"
            );
        }
        h.shutdown().await;
        let _ = std::fs::remove_file(ra);
        let _ = std::fs::remove_file(rb);
    }
}

#[tokio::test]
async fn a_cancelled_elicitation_ends_the_call_as_declined_with_cancel() {
    let record = temp_file("cancel");
    let h = start_ready_with(
        Harness::builder(config(vec![with_record("s", &record, &[])])).input_handler(
            "elicitation/create",
            Arc::new(FixedAnswers::new(json!({"action": "cancel"}))),
        ),
    )
    .await;
    let e = h
        .call_tool(&a(), "s__confirm", json!({"message": "ok?"}))
        .await
        .expect_err("cancelled");
    assert!(
        matches!(&e, CallError::InputDeclined { action, .. } if action == "cancel"),
        "{e:?}"
    );
    assert_eq!(calls_in(&record).len(), 1, "no retry after a cancel");
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
}

/// A handler that fails.
struct Failing;

impl InputHandler for Failing {
    fn answer(&self, _request: InputRequestContext) -> mcp_harness::call::input::InputFuture {
        Box::pin(async {
            Err(mcp_harness::call::input::InputError::Failed(
                "broken".into(),
            ))
        })
    }
}

/// A handler that never answers.
struct Silent;

impl InputHandler for Silent {
    fn answer(&self, _request: InputRequestContext) -> mcp_harness::call::input::InputFuture {
        Box::pin(std::future::pending())
    }
}

#[tokio::test]
async fn a_failing_or_silent_handler_and_an_approval_queue_timeout_end_the_call_with_input_failed()
{
    let queue = ApprovalQueue::new(Duration::from_millis(300));
    let handlers: Vec<(&str, Arc<dyn InputHandler>)> = vec![
        ("failing", Arc::new(Failing)),
        ("silent", Arc::new(Silent)),
        ("approval queue", Arc::new(queue.clone())),
    ];
    for (what, handler) in handlers {
        let record = temp_file("input-failed");
        let mut cfg = config(vec![with_record("s", &record, &[])]);
        cfg.input_timeout = Duration::from_millis(400);
        let h =
            start_ready_with(Harness::builder(cfg).input_handler("elicitation/create", handler))
                .await;
        let t = Instant::now();
        let e = h
            .call_tool(&a(), "s__confirm", json!({"message": "?"}))
            .await
            .expect_err("no answer");
        assert!(
            matches!(&e, CallError::InputFailed { method, .. } if method == "elicitation/create"),
            "{what}: {e:?}"
        );
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{what}: took {:?}",
            t.elapsed()
        );
        assert_eq!(
            calls_in(&record).len(),
            1,
            "{what}: no retry without an answer"
        );
        h.shutdown().await;
        let _ = std::fs::remove_file(record);
    }
    assert!(
        queue.pending().is_empty(),
        "a timed-out question is withdrawn"
    );
}

#[tokio::test]
async fn legacy_sampling_and_roots_requests_reach_their_handlers_and_ping_is_answered() {
    let sampled = Arc::new(AtomicUsize::new(0));
    struct Counting(Arc<AtomicUsize>, Value);
    impl InputHandler for Counting {
        fn answer(&self, request: InputRequestContext) -> mcp_harness::call::input::InputFuture {
            self.0.fetch_add(1, Ordering::SeqCst);
            let answer = self.1.clone();
            let seen = request.params.clone();
            Box::pin(async move {
                let mut a = answer;
                a["seen"] = seen;
                Ok(a)
            })
        }
    }
    let sampling =
        json!({"role": "assistant", "content": {"type": "text", "text": "sampled"}, "model": "m"});
    let roots = json!({"roots": [{"uri": "file:///work", "name": "work"}]});
    let roots_count = Arc::new(AtomicUsize::new(0));
    let h = start_ready_with(
        Harness::builder(config(vec![demo_server("leg", &["--era", "legacy"])]))
            .input_handler(
                "sampling/createMessage",
                Arc::new(Counting(sampled.clone(), sampling.clone())),
            )
            .input_handler(
                "roots/list",
                Arc::new(Counting(roots_count.clone(), roots.clone())),
            ),
    )
    .await;
    let ask = |method: &str, params: Value| {
        let h = h.clone();
        let method = method.to_string();
        async move {
            h.call_tool(
                &a(),
                "leg__rogue_request",
                json!({"method": method, "params": params}),
            )
            .await
            .expect("answered")
        }
    };
    let messages = json!({"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}], "maxTokens": 5});
    let r = ask("sampling/createMessage", messages.clone()).await;
    assert_eq!(text(&r), "client answered");
    assert_eq!(
        r["structuredContent"]["answer"]["content"]["text"],
        "sampled"
    );
    assert_eq!(
        r["structuredContent"]["answer"]["seen"]["messages"],
        messages["messages"]
    );
    assert_eq!(sampled.load(Ordering::SeqCst), 1);
    let r = ask("roots/list", json!({})).await;
    assert_eq!(r["structuredContent"]["answer"]["roots"], roots["roots"]);
    assert_eq!(roots_count.load(Ordering::SeqCst), 1);
    let r = ask("ping", json!({})).await;
    assert_eq!(text(&r), "client answered");
    assert_eq!(r["structuredContent"]["answer"], json!({}));
    h.shutdown().await;
}

// --- The cache ---------------------------------------------------------------------

#[tokio::test]
async fn prompts_and_resources_are_listed_and_cached_like_tools() {
    let record = temp_file("prompts");
    let h = start_ready(config(vec![with_record("s", &record, &[])])).await;
    let first = h.list_prompts(&a()).await.expect("prompts");
    assert!(
        first
            .iter()
            .any(|p| &*p.qualified == "s__greet" && !p.from_cache)
    );
    let again = h.list_prompts(&a()).await.expect("prompts");
    assert!(again.iter().all(|p| p.from_cache));
    let resources = h
        .listing(&a(), CallKind::Resource, None)
        .await
        .expect("resources");
    assert!(resources.items.iter().any(|r| &*r.name == "demo://readme"));
    h.listing(&a(), CallKind::Resource, None)
        .await
        .expect("resources");
    assert_eq!(count(&record, "prompts/list"), 1);
    assert_eq!(count(&record, "resources/list"), 1);
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
}

#[tokio::test]
async fn each_page_is_cached_by_its_cursor_and_expires_by_its_own_ttl() {
    let record = temp_file("pages");
    // 20 tools a page; the first page is fresh for 10 minutes, the others for 1 s (long
    // enough that a loaded machine still counts them before they expire).
    let s = with_record(
        "s",
        &record,
        &[
            "--extra-tools",
            "30",
            "--page-size",
            "20",
            "--page-ttls",
            "600000,1000",
        ],
    );
    let h = start_ready(config(vec![s])).await;
    let all = h.list_tools(&a()).await.expect("list");
    let pages = count(&record, "tools/list");
    assert!(pages >= 4, "{} tools in {pages} pages", all.len());
    assert_eq!(h.cache_stats().l1.entries, pages, "one entry per page");
    tokio::time::sleep(Duration::from_millis(1100)).await; // past the short TTLs (deliberate)
    let again = h.list_tools(&a()).await.expect("list");
    assert_eq!(again.len(), all.len());
    let lists: Vec<Value> = recorded(&record)
        .into_iter()
        .filter(|r| r["method"] == "tools/list")
        .skip(pages)
        .collect();
    assert_eq!(lists.len(), pages - 1, "the first page came from the cache");
    assert!(
        lists.iter().all(|r| r["params"]["cursor"].is_string()),
        "only pages after the first were asked again: {lists:?}"
    );
    assert_eq!(lists[0]["params"]["cursor"], "e0-page-20");
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
}

#[tokio::test]
async fn a_list_is_fetched_again_when_its_ttl_has_passed() {
    let record = temp_file("expiry");
    let h = start_ready(config(vec![with_record(
        "s",
        &record,
        &["--ttl-ms", "200"],
    )]))
    .await;
    assert!(
        h.list_tools(&a())
            .await
            .expect("list")
            .iter()
            .all(|t| !t.from_cache)
    );
    assert!(
        h.list_tools(&a())
            .await
            .expect("list")
            .iter()
            .all(|t| t.from_cache)
    );
    assert_eq!(count(&record, "tools/list"), 1);
    tokio::time::sleep(Duration::from_millis(300)).await; // past the TTL (deliberate)
    assert!(
        h.list_tools(&a())
            .await
            .expect("list")
            .iter()
            .all(|t| !t.from_cache)
    );
    assert_eq!(count(&record, "tools/list"), 2);
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
}

// `cache.refresh_ahead`: a list used in the last tenth of its freshness is read again in
// the background, so that the caller after its expiry is served from the cache. The
// read is bounded by the server's own timeout, not by what was left of the call that
// found it due (a call with 150 ms left cut a 600 ms read short, and the list expired).
#[tokio::test]
async fn a_list_used_close_to_its_expiry_is_read_again_ahead_of_the_next_caller() {
    let record = temp_file("refresh-ahead");
    let h = start_ready(config(vec![with_record(
        "s",
        &record,
        &["--ttl-ms", "20000", "--list-delay-ms", "600"],
    )]))
    .await;
    h.list_tools(&a()).await.expect("list");
    assert_eq!(count(&record, "tools/list"), 1);
    // Within the last 2 s of the 20 s, with room either side for a slow machine
    // (deliberate: the window is in time).
    tokio::time::sleep(Duration::from_millis(18_800)).await;
    let short = mcp_harness::CallOptions {
        timeout: Some(Duration::from_millis(150)),
        ..mcp_harness::CallOptions::default()
    };
    h.call(&a(), CallKind::Tool, "echo", json!({"text": "x"}), short)
        .await
        .expect("a call served from the cache");
    // Past the first list's expiry, and the refresh's 600 ms.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let tools = h.list_tools(&a()).await.expect("list");
    assert!(tools.iter().all(|t| t.from_cache), "refreshed ahead");
    assert_eq!(
        count(&record, "tools/list"),
        2,
        "one read ahead, none after"
    );
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
}

// A list answered with `input_required` (only calls may), or a page of the wrong shape
// (its items not an array, its cursor not a string), is the server's error: before, a
// page of the wrong shape read as an empty list, or as the list's end, and was cached
// so for `default_ttl`.
#[tokio::test]
async fn a_list_that_is_no_list_is_refused_and_never_cached() {
    for bad in [
        &["--list-input-required"][..],
        &["--malformed-list", "tools-object"],
        &["--malformed-list", "cursor-number"],
    ] {
        let record = temp_file("no-list");
        let h = start_ready(config(vec![with_record("s", &record, bad)])).await;
        for _ in 0..2 {
            let listing = h
                .listing(&a(), CallKind::Tool, None)
                .await
                .expect("listing");
            assert!(listing.items.is_empty(), "{bad:?}");
            let (unreachable, error) = &listing.unreachable[0];
            assert_eq!(unreachable.server, "s");
            assert!(
                matches!(
                    error,
                    Some(CallError::Server(mcp_harness::ServerError::Protocol { .. }))
                ),
                "{bad:?}: {error:?}"
            );
        }
        assert_eq!(count(&record, "tools/list"), 2, "{bad:?}: asked again");
        assert_eq!(h.cache_stats().l1.entries, 0, "{bad:?}");
        h.shutdown().await;
        let _ = std::fs::remove_file(record);
    }
}

// Announced means a subscription acknowledged that announces its changes: a server
// that says its list changes (`listChanged`) but refuses the subscription has nothing
// that would drop a kept list (before, it was kept for `default_ttl` all the same).
#[tokio::test]
async fn a_modern_list_without_hints_is_cached_only_when_its_changes_are_announced() {
    for (announced, refused, kept) in [
        (false, false, false),
        (true, true, false),
        (true, false, true),
    ] {
        let record = temp_file("no-hints");
        let mut args = vec!["--no-hints"];
        if !announced {
            args.push("--no-list-changed");
        }
        if refused {
            args.push("--refuse-listen");
        }
        let h = start_ready(config(vec![with_record("s", &record, &args)])).await;
        if announced {
            // Until the subscription was asked for.
            assert!(
                eventually(Duration::from_secs(10), || count(
                    &record,
                    "subscriptions/listen"
                ) > 0)
                .await
            );
        }
        // A private list (no scope said) is kept for a caller with a context. Listed
        // five times, a moment apart (an acknowledgment takes a moment to come): a list
        // kept is read fewer times, one not kept every time.
        let caller = a().with_auth_context("ctx");
        for _ in 0..5 {
            let tools = h.list_tools(&caller).await.expect("list");
            assert!(!tools.is_empty());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let reads = count(&record, "tools/list");
        assert_eq!(
            reads < 5,
            kept,
            "announced: {announced}, refused: {refused}: {reads} reads"
        );
        h.shutdown().await;
        let _ = std::fs::remove_file(record);
    }
}

// Many callers listing a server at once do not each fetch its list: the first fetches,
// and the others, wanting the same list, wait for it and share what it read, a list or
// an error (a server whose list fails is not asked once per caller).
#[tokio::test]
async fn many_callers_listing_at_once_share_one_fetch_and_its_outcome() {
    for (name, extra, lists) in [
        ("stampede", &[][..], true),
        (
            "stampede-malformed",
            &["--malformed-list", "tools-object"][..],
            false,
        ),
    ] {
        let record = temp_file(name);
        let mut args = vec!["--list-delay-ms", "300"];
        args.extend_from_slice(extra);
        let h = start_ready(config(vec![with_record("s", &record, &args)])).await;
        let listings: Vec<_> = (0..24)
            .map(|_| {
                let h = h.clone();
                tokio::spawn(async move { h.list_tools(&a()).await })
            })
            .collect();
        for listing in listings {
            let tools = listing.await.expect("task").expect("list");
            assert_eq!(!tools.is_empty(), lists, "{name}");
        }
        let fetched = count(&record, "tools/list");
        assert_eq!(fetched, 1, "{name}: {fetched} fetches for 24 listings");
        h.shutdown().await;
        let _ = std::fs::remove_file(record);
    }
}

// A listing begun after a change notice does not share a fetch begun before it: that
// fetch may read the list as it was, and whoever lists again on hearing the notice
// must read the new one.
#[tokio::test]
async fn a_listing_after_a_change_notice_does_not_take_a_fetch_begun_before_it() {
    let record = temp_file("flight-epoch");
    let h = start_ready(config(vec![with_record(
        "s",
        &record,
        &["--era", "legacy", "--list-delay-ms", "1500"],
    )]))
    .await;
    let mut events = h.subscribe();
    let before = {
        let h = h.clone();
        tokio::spawn(async move { h.list_tools(&a()).await })
    };
    while count(&record, "tools/list") < 1 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The server's list changes while that fetch waits, and it says so.
    h.call_tool(&a(), "s__grow", json!({})).await.expect("grow");
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Ok(mcp_harness::registry::HarnessEvent::ListsChanged { tools: true, .. }) =
                events.recv().await
            {
                break;
            }
        }
    })
    .await
    .expect("the notice was heard");
    let after = h.list_tools(&a()).await.expect("list");
    assert!(
        after.iter().any(|t| &*t.qualified == "s__grown_0"),
        "listed after the notice: {:?}",
        after.iter().map(|t| &*t.qualified).collect::<Vec<_>>()
    );
    let before = before.await.expect("task").expect("list");
    assert!(!before.is_empty());
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
}

#[tokio::test]
async fn remove_server_purges_its_cache_in_memory_and_on_disk() {
    let record = temp_file("purge");
    let dir = temp_file("purge-cache");
    let mut cfg = config(vec![with_record("s", &record, &[])]);
    cfg.cache = CacheConfig {
        dir: Some(dir.clone()),
        ..CacheConfig::default()
    };
    let h = start_ready(cfg.clone()).await;
    h.list_tools(&a()).await.expect("list");
    assert!(
        eventually(Duration::from_secs(5), || {
            let st = h.cache_stats();
            st.l1.entries == 1 && st.l2.entries == 1
        })
        .await,
        "{:?}",
        h.cache_stats()
    );
    let files = || {
        std::fs::read_dir(&dir)
            .map(|d| d.flatten().count())
            .unwrap_or(0)
    };
    assert!(files() > 0);
    h.remove_server("s").await.expect("remove");
    let st = h.cache_stats();
    assert_eq!((st.l1.entries, st.l2.entries), (0, 0), "{st:?}");
    assert!(
        eventually(Duration::from_secs(5), || std::fs::read_dir(&dir).map_or(
            true,
            |d| d
                .flatten()
                .all(|e| std::fs::read_dir(e.path()).map_or(true, |mut f| f.next().is_none()))
        ))
        .await,
        "nothing of s is left on disk"
    );
    h.add_server(cfg.servers[0].clone()).await.expect("add");
    assert!(wait_state(&h, "s", ServerState::Ready).await);
    assert!(
        h.list_tools(&a())
            .await
            .expect("list")
            .iter()
            .all(|t| !t.from_cache)
    );
    assert_eq!(count(&record, "tools/list"), 2);
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
    let _ = std::fs::remove_dir_all(dir);
}

// --- The audit trail and shutdown ---------------------------------------------------

#[tokio::test]
async fn shutdown_lets_calls_in_flight_finish_on_their_servers() {
    let record = temp_file("grace");
    let audit = temp_file("grace-audit");
    let mut cfg = config(vec![with_record("s", &record, &[])]);
    cfg.audit = AuditConfig {
        path: Some(audit.clone()),
        ..AuditConfig::default()
    };
    let h = start_ready(cfg).await;
    let call = {
        let h = h.clone();
        tokio::spawn(async move {
            h.call_tool(&a(), "s__slow", json!({"ms": 500, "text": "done"}))
                .await
        })
    };
    assert!(eventually(Duration::from_secs(10), || !calls_in(&record).is_empty()).await);
    h.shutdown().await;
    let r = call
        .await
        .expect("join")
        .expect("finished before the servers stopped");
    assert_eq!(text(&r), "done");
    let finished: Vec<Value> = audit_records(&audit)
        .into_iter()
        .filter(|r| r["event"] == "finished")
        .collect();
    assert_eq!(finished.len(), 1);
    assert_eq!(finished[0]["outcome"], "ok");
    let e = h
        .call_tool(&a(), "s__echo", json!({}))
        .await
        .expect_err("shut down");
    assert!(matches!(e, CallError::ShutDown), "{e:?}");
    let _ = std::fs::remove_file(record);
    let _ = std::fs::remove_file(audit);
}

#[tokio::test]
async fn audit_records_are_written_when_a_batch_fills_or_when_flush_every_passes() {
    for (batch, flush_every, expect_before_shutdown) in [
        (1000, Duration::from_millis(100), true),
        (2, Duration::from_secs(3600), true),
        (1000, Duration::from_secs(3600), false),
    ] {
        let audit = temp_file("batching");
        let mut cfg = config(vec![demo_server("s", &[])]);
        cfg.audit = AuditConfig {
            path: Some(audit.clone()),
            batch,
            flush_every,
            ..AuditConfig::default()
        };
        let h = start_ready(cfg).await;
        h.call_tool(&a(), "s__echo", json!({"text": "x"}))
            .await
            .expect("call");
        let written = eventually(Duration::from_secs(2), || audit_records(&audit).len() == 2).await;
        assert_eq!(
            written, expect_before_shutdown,
            "batch {batch}, flush_every {flush_every:?}"
        );
        h.shutdown().await;
        assert_eq!(audit_records(&audit).len(), 2, "all written at shutdown");
        let _ = std::fs::remove_file(audit);
    }
}

// --- Connecting and the wire ---------------------------------------------------------

mod wire {
    use super::*;
    use mcp_harness::transport::{ConnectError, Connection, Era};

    #[tokio::test]
    async fn a_modern_error_at_discover_fails_the_connection_without_trying_initialize() {
        for code in ["-32020", "-32021"] {
            let record = temp_file("probe-error");
            let r = record.to_string_lossy().into_owned();
            let spec = demo_stdio(&[
                "p",
                "--era",
                "dual",
                "--discover-error",
                code,
                "--record",
                &r,
            ]);
            let Err(e) = Connection::connect("p", spec, options()).await else {
                panic!("{code}: connected");
            };
            assert!(
                matches!(&e, ConnectError::Refused { method: "server/discover", error } if error.code.to_string() == code),
                "{code}: {e}"
            );
            assert_eq!(
                count(&record, "initialize"),
                0,
                "{code}: fell back to legacy"
            );
            let _ = std::fs::remove_file(record);
        }
    }

    #[tokio::test]
    async fn a_401_at_discover_is_an_error_not_a_legacy_server() {
        let record = temp_file("probe-401");
        let r = record.to_string_lossy().into_owned();
        let server = HttpServer::demo(&[
            "p",
            "--era",
            "dual",
            "--discover-status",
            "401",
            "--record",
            &r,
        ])
        .await;
        let Err(e) = Connection::connect("p", server.spec(), options()).await else {
            panic!("connected despite the 401");
        };
        assert!(e.to_string().contains("401"), "{e}");
        assert_eq!(
            count(&record, "initialize"),
            0,
            "fell back to legacy on a 401"
        );
        let _ = std::fs::remove_file(record);
    }

    #[tokio::test]
    async fn a_reply_to_discover_that_is_not_json_rpc_means_a_legacy_server() {
        let server = HttpServer::demo(&["p", "--era", "dual", "--discover-html"]).await;
        let (conn, _events) = Connection::connect("p", server.spec(), options())
            .await
            .expect("connect");
        assert_eq!(conn.era(), Era::Legacy);
        conn.request("tools/list", None).await.expect("serves");
        conn.shutdown().await;
    }

    #[tokio::test]
    async fn a_version_retired_mid_session_is_renegotiated_and_the_request_retried_once() {
        let record = temp_file("retire");
        let r = record.to_string_lossy().into_owned();
        let spec = demo_stdio(&[
            "p",
            "--versions",
            "2099-01-01,2026-07-28",
            "--retire-version-after",
            "2",
            "--record",
            &r,
        ]);
        let opts = mcp_harness::transport::ConnectOptions {
            preferred_versions: vec!["2099-01-01".into(), "2026-07-28".into()],
            ..options()
        };
        let (conn, _events) = Connection::connect("p", spec, opts).await.expect("connect");
        assert_eq!(conn.protocol_version(), "2099-01-01");
        for _ in 0..3 {
            let r = conn
                .request("tools/call", call("echo", json!({"text": "v"})))
                .await
                .expect("served, renegotiated when refused");
            assert_eq!(text(&r), "v");
        }
        assert_eq!(conn.protocol_version(), "2026-07-28");
        let versions: Vec<String> = recorded(&record)
            .iter()
            .filter(|r| r["method"] == "tools/call")
            .map(|r| {
                r["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"]
                    .as_str()
                    .unwrap_or("")
                    .to_string()
            })
            .collect();
        assert_eq!(
            versions,
            ["2099-01-01", "2099-01-01", "2099-01-01", "2026-07-28"],
            "the refused request retried once with the new version"
        );
        conn.shutdown().await;
        let _ = std::fs::remove_file(record);
    }

    #[tokio::test]
    async fn param_headers_are_read_again_after_a_header_mismatch() {
        let record = temp_file("rename-header");
        let r = record.to_string_lossy().into_owned();
        let server =
            HttpServer::demo(&["p", "--rename-param-header-after", "1", "--record", &r]).await;
        let h = start_ready(config(vec![ServerConfig::http("web", &server.url)])).await;
        for _ in 0..2 {
            let r = h
                .call_tool(&a(), "web__region_echo", json!({"region": "eu"}))
                .await
                .expect("served");
            assert_eq!(text(&r), "eu");
        }
        h.shutdown().await;
        let calls: Vec<Value> = recorded(&record)
            .into_iter()
            .filter(|r| r["method"] == "tools/call")
            .collect();
        let last = calls.last().expect("calls");
        assert_eq!(last["headers"]["mcp-param-zone"], "eu", "{last}");
        assert!(last["headers"].get("mcp-param-region").is_none(), "{last}");
        assert!(
            calls.len() >= 3,
            "the mismatched request, then the retry after re-reading: {calls:?}"
        );
        let _ = std::fs::remove_file(record);
    }

    #[tokio::test]
    async fn many_requests_in_flight_on_one_pipe_each_get_their_own_answer() {
        let (conn, _events) = Connection::connect("p", demo_stdio(&["p"]), options())
            .await
            .expect("connect");
        let conn = Arc::new(conn);
        let mut set = tokio::task::JoinSet::new();
        for n in 0..50u64 {
            let conn = conn.clone();
            set.spawn(async move {
                let r = conn
                    .request(
                        "tools/call",
                        call("slow", json!({"ms": 50 - n, "text": n.to_string()})),
                    )
                    .await
                    .expect("answered");
                (n, text(&r).to_string())
            });
        }
        while let Some(joined) = set.join_next().await {
            let (n, got) = joined.expect("join");
            assert_eq!(got, n.to_string());
        }
        conn.shutdown().await;
    }

    /// The oracle the other tests lean on ("it answered, so the headers were right"):
    /// the demo server refuses requests whose envelope or headers are wrong.
    #[tokio::test]
    async fn the_demo_server_refuses_a_wrong_envelope_or_wrong_headers() {
        let server = HttpServer::demo(&["p"]).await;
        let client = reqwest_client();
        let meta = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "0"},
        });
        let body = |meta: Value| {
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                   "params": {"name": "echo", "arguments": {"text": "x"}, "_meta": meta}})
            .to_string()
        };
        let post = |method_header: &'static str, body: String| {
            client
                .post(&server.url)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("mcp-protocol-version", "2026-07-28")
                .header("mcp-method", method_header)
                .header("mcp-name", "echo")
                .body(body)
                .send()
        };
        let ok: Value = post("tools/call", body(meta.clone()))
            .await
            .expect("post")
            .json()
            .await
            .expect("json");
        assert_eq!(ok["result"]["content"][0]["text"], "x", "{ok}");
        let wrong_header: Value = post("tools/list", body(meta.clone()))
            .await
            .expect("post")
            .json()
            .await
            .expect("json");
        assert_eq!(wrong_header["error"]["code"], -32020, "{wrong_header}");
        let no_envelope: Value = post("tools/call", body(json!({})))
            .await
            .expect("post")
            .json()
            .await
            .expect("json");
        assert_eq!(no_envelope["error"]["code"], -32602, "{no_envelope}");
    }

    fn reqwest_client() -> reqwest::Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        reqwest::Client::builder().build().expect("client")
    }
}
