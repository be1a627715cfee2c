//! The hardening issue, item by item: each test names its item, drives real server
//! processes, and fails on the first wave's code.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use mcp_harness::audit::{AuditConfig, AuditFailure};
use mcp_harness::call::input::{InputFuture, InputRequestContext};
use mcp_harness::registry::cache::CacheConfig;
use mcp_harness::transport::{
    ConnectOptions, Connection, Era, RequestError, ServerEvent, TransportError, TransportSpec,
};
use mcp_harness::{
    ApprovalQueue, CallError, Caller, FixedAnswers, Harness, HarnessConfig, HarnessHandle,
    InputHandler, RestartConfig, ServerConfig, ServerError, ServerState,
};
use serde_json::{Value, json};
use support::*;

fn config(servers: Vec<ServerConfig>) -> HarnessConfig {
    HarnessConfig {
        servers,
        permissions: grant_everything(&["a"]),
        ..HarnessConfig::default()
    }
}

fn a() -> Caller {
    Caller::agent("a")
}

/// Counts the requests it answers, answering each with `answer`.
struct Counting {
    seen: Arc<AtomicUsize>,
    answer: Value,
    capability: Value,
}

impl InputHandler for Counting {
    fn capability(&self) -> Value {
        self.capability.clone()
    }
    fn answer(&self, _: InputRequestContext) -> InputFuture {
        self.seen.fetch_add(1, Ordering::SeqCst);
        let v = self.answer.clone();
        Box::pin(async move { Ok(v) })
    }
}

fn counting(capability: Value) -> (Arc<Counting>, Arc<AtomicUsize>) {
    let seen = Arc::new(AtomicUsize::new(0));
    let handler = Counting {
        seen: seen.clone(),
        answer: json!({"action": "accept", "content": {"x": "y"}}),
        capability,
    };
    (Arc::new(handler), seen)
}

// 1. Bounded lists.
#[tokio::test]
async fn item_01_a_server_paging_huge_pages_forever_is_cut_off_and_memory_stays_bounded() {
    let h = start_ready(config(vec![demo_server("flood", &["--huge-pages", "4"])])).await;
    let before = rss_kb();
    let listing = h
        .listing(&a(), mcp_harness::CallKind::Tool, None)
        .await
        .expect("listing");
    let grown_mb = rss_kb().saturating_sub(before) / 1024;
    assert!(listing.items.is_empty());
    let (_, error) = listing.unreachable.first().expect("the server is reported");
    assert!(
        matches!(error, Some(CallError::ListTooLarge { what: "bytes", limit, .. }) if *limit == 32 * 1024 * 1024),
        "{error:?}"
    );
    // One listing held at most 32 MiB of pages plus the page that crossed the line (and
    // the allocator's slack); the first wave held up to 1,000 pages of 4 MiB each.
    assert!(grown_mb < 200, "memory grew by {grown_mb} MB");
    assert_eq!(h.cache_stats().l1.entries, 0, "nothing of it is cached");
    let echo = h
        .call_tool(&a(), "flood__echo", json!({"text": "still works"}))
        .await
        .expect("calls by qualified name still work");
    assert_eq!(text(&echo), "still works");
    h.shutdown().await;
}

// 1. Bounded lists: a list cut off at the page cap is served this once, and says it
// is fresh for no one (a gateway's client would keep it for the pages' ttl). Before,
// it carried the pages' freshness.
#[tokio::test]
async fn item_01_a_list_cut_off_at_the_page_cap_is_fresh_for_no_one() {
    let args = [
        "--extra-tools",
        "60",
        "--page-size",
        "20",
        "--page-ttls",
        "600000",
    ];
    let mut cfg = config(vec![demo_server("paged", &args)]);
    cfg.limits.max_list_pages = 1;
    let h = start_ready(cfg).await;
    let listing = h
        .listing(&a(), mcp_harness::CallKind::Tool, None)
        .await
        .expect("listing");
    assert!(listing.items.len() >= 20, "{}", listing.items.len());
    assert_eq!(listing.fresh_for, Duration::ZERO);
    h.shutdown().await;
    // Whole, it is fresh for its pages' ttl.
    let h = start_ready(config(vec![demo_server("paged", &args)])).await;
    let listing = h
        .listing(&a(), mcp_harness::CallKind::Tool, None)
        .await
        .expect("listing");
    assert!(
        listing.fresh_for > Duration::from_secs(60),
        "{:?}",
        listing.fresh_for
    );
    h.shutdown().await;
}

// A listing is public (anyone may be served it) only when nothing was left out for the
// caller's grants: a server it may not use counts, as a tool does. Before, an agent
// granted one of two public servers got a list said to be anyone's.
#[tokio::test]
async fn a_listing_without_a_server_the_caller_may_not_use_is_not_public() {
    let public = ["--page-ttls", "600000"];
    let mut cfg = config(vec![
        demo_server("one", &public),
        demo_server("two", &public),
    ]);
    cfg.permissions
        .entry("x".into())
        .or_default()
        .insert("one".into(), vec!["*".into()]);
    let h = start_ready(cfg).await;
    let listing = |who: &'static str| {
        let h = h.clone();
        async move {
            h.listing(&Caller::agent(who), mcp_harness::CallKind::Tool, None)
                .await
                .expect("listing")
        }
    };
    let everything = listing("a").await;
    assert!(everything.public, "every page public, nothing left out");
    let only_one = listing("x").await;
    assert!(!only_one.items.is_empty());
    assert!(!only_one.public, "server two was left out for x");
    h.shutdown().await;
}

// 1. Bounded lists: the item bound too.
#[tokio::test]
async fn item_01_a_list_past_max_list_items_ends_with_a_typed_error() {
    let mut cfg = config(vec![demo_server(
        "many",
        &["--extra-tools", "300", "--page-size", "50"],
    )]);
    cfg.limits.max_list_items = 100;
    let h = start_ready(cfg).await;
    let listing = h
        .listing(&a(), mcp_harness::CallKind::Tool, None)
        .await
        .expect("listing");
    assert!(
        matches!(
            listing.unreachable.first(),
            Some((
                _,
                Some(CallError::ListTooLarge {
                    what: "items",
                    limit: 100,
                    ..
                })
            ))
        ),
        "{:?}",
        listing.unreachable
    );
    h.shutdown().await;
}

// 2. No redirects.
#[tokio::test]
async fn item_02_a_redirect_is_never_followed_and_a_call_that_reached_the_server_is_not_failed_over()
 {
    let target_record = temp_file("redirect-target");
    let target = HttpServer::demo(&["target", "--record", &target_record.to_string_lossy()]).await;
    let redirector = HttpServer::demo(&["redir"]).await;
    let fallback_record = temp_file("redirect-fallback");
    let mut web = ServerConfig::http("web", &redirector.url);
    web.priority = 10;
    if let mcp_harness::TransportSpec::Http(spec) = &mut web.transport {
        spec.headers.insert("X-Api-Key".into(), "secret-key".into());
    }
    let fallback = demo_server("local", &["--record", &fallback_record.to_string_lossy()]);
    let h = start_ready(config(vec![web, fallback])).await;
    let err = h
        .call_tool(&a(), "redirect", json!({"to": target.url}))
        .await
        .expect_err("a redirect is an error");
    match &err {
        CallError::Server(ServerError::Transport {
            source: TransportError::Redirect { status, location },
            ..
        }) => {
            assert_eq!(*status, 307);
            assert_eq!(location, &target.url);
        }
        other => panic!("expected a typed redirect, got {other}"),
    }
    assert!(
        recorded(&target_record).is_empty(),
        "nothing followed the redirect: no arguments, no API key, no session id"
    );
    assert_eq!(
        recorded(&fallback_record)
            .iter()
            .filter(|r| r["method"] == "tools/call")
            .count(),
        0,
        "the request reached a server, so it was not re-sent to another"
    );
    h.shutdown().await;
}

// 3. A disk layer that trusts nothing (TTL cap, permissions and names: unit tests in
// registry/cache/tests.rs).
#[tokio::test]
async fn item_03_a_server_changed_under_the_same_id_never_serves_its_old_cache_entries() {
    let dir = scratch_dir().join("fp");
    let _ = std::fs::remove_dir_all(&dir);
    let record = temp_file("fp");
    let run = |args: Vec<String>| {
        let dir = dir.clone();
        let record = record.clone();
        async move {
            let before = recorded(&record).len();
            let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
            let rec = record.to_string_lossy().to_string();
            all.extend(["--record", &rec]);
            let mut cfg = config(vec![demo_server("s", &all)]);
            cfg.cache = CacheConfig {
                dir: Some(dir),
                ..CacheConfig::default()
            };
            let h = start_ready(cfg).await;
            let tools = h.list_tools(&a()).await.expect("list");
            h.shutdown().await;
            let fetched = recorded(&record)[before..]
                .iter()
                .filter(|r| r["method"] == "tools/list")
                .count();
            (tools, fetched)
        }
    };
    let (_, fetched) = run(vec![]).await;
    assert_eq!(fetched, 1);
    let (again, fetched) = run(vec![]).await;
    assert_eq!(fetched, 0, "the same server is served from disk");
    assert!(again.iter().all(|t| t.from_cache));
    let (changed, fetched) = run(vec!["--extra-tools".into(), "1".into()]).await;
    assert_eq!(fetched, 1, "a changed command is a different server");
    assert!(changed.iter().any(|t| &*t.name == "gen_0"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A ready harness of `paged`, a server whose tool list takes several pages, fresh
/// for `ttls` (ms, per page; the last repeats), started with `extra` flags too; and
/// the file it records its requests in.
async fn paged(tag: &str, ttls: &str, extra: &[&str]) -> (HarnessHandle, std::path::PathBuf) {
    let record = temp_file(tag);
    let rec = record.to_string_lossy().to_string();
    let mut args = vec![
        "--extra-tools",
        "30",
        "--page-size",
        "20",
        "--page-ttls",
        ttls,
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--record", &rec]);
    let h = start_ready(config(vec![demo_server("paged", &args)])).await;
    (h, record)
}

// 4. A walk that reads a page from the server reads the rest from it too: a later page
// cached by an earlier walk may be of another version of the list (a server that
// changed it without a word), and its cursor would stitch the two. Here the first page
// expires at once and the later ones stay fresh.
#[tokio::test]
async fn item_04_a_walk_that_fetches_a_page_does_not_take_the_later_ones_from_the_cache() {
    let (h, record) = paged("cursor-versions", "1,600000", &[]).await;
    let lists = || {
        recorded(&record)
            .iter()
            .filter(|r| r["method"] == "tools/list")
            .count()
    };
    let first = h.list_tools(&a()).await.expect("list");
    let pages = lists();
    assert!(pages >= 2, "several pages: {pages}");
    tokio::time::sleep(Duration::from_millis(20)).await; // the first page expires (deliberate)
    let second = h.list_tools(&a()).await.expect("list");
    assert_eq!(second.len(), first.len());
    assert_eq!(lists(), 2 * pages, "every page read again");
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
}

// 4. A rejected cursor.
#[tokio::test]
async fn item_04_a_rejected_cursor_drops_the_cached_pages_and_the_list_is_read_again_once() {
    rejected_cursor_is_read_again_from_page_one("-32602").await;
}

// 4. A cursor its restarted server forgot and refuses with an internal error, not the
// spec's -32602, is taken as refused too. Before, the server was unreachable for
// listings until the cached first page expired.
#[tokio::test]
async fn item_04_a_cursor_refused_with_an_internal_error_is_read_again_from_page_one() {
    rejected_cursor_is_read_again_from_page_one("-32603").await;
}

async fn rejected_cursor_is_read_again_from_page_one(code: &str) {
    let refusal = format!("--cursor-refusal-code={code}");
    // No subscription: reopened after the restart, it would drop the lists before any
    // cursor could be refused.
    let flags = ["--cursor-epoch-per-process", &refusal, "--no-list-changed"];
    let (h, record) = paged("cursor", "600000,1", &flags).await;
    let first = h.list_tools(&a()).await.expect("list");
    assert!(first.len() > 60, "several pages");
    let old_pid = h.server_status("paged").and_then(|s| s.pid);
    h.restart_server("paged").await.expect("restart");
    assert!(
        eventually(Duration::from_secs(20), || h
            .server_status("paged")
            .is_some_and(|s| s.state == ServerState::Ready && s.pid != old_pid))
        .await
    );
    tokio::time::sleep(Duration::from_millis(20)).await; // later pages (1 ms) expired
    let second = h.list_tools(&a()).await.expect("list");
    assert_eq!(
        second.len(),
        first.len(),
        "the server does not vanish: its list is read again from page 1"
    );
    let lists: Vec<Value> = recorded(&record)
        .into_iter()
        .filter(|r| r["method"] == "tools/list")
        .collect();
    // The last request with a cursor of the old process went to the new one (refused).
    let rejected = lists
        .iter()
        .rposition(|r| {
            r["params"]["cursor"]
                .as_str()
                .is_some_and(|c| c.starts_with(&format!("e{}-", old_pid.unwrap_or(0))))
        })
        .expect("a request with the old process's cursor");
    assert!(
        lists[rejected + 1..]
            .first()
            .is_some_and(|r| r["params"].get("cursor").is_none()),
        "then page 1 again: {:?}",
        &lists[rejected..]
    );
    h.shutdown().await;
}

// 5. Bounded queues: the stdio writer.
#[tokio::test]
async fn item_05_a_server_that_stops_reading_stdin_fails_requests_as_not_sent_without_growing_memory()
 {
    let (conn, _events) = Connection::connect(
        "deaf",
        demo_stdio(&["deaf", "--stop-reading-after", "1"]),
        options(),
    )
    .await
    .expect("connect (the probe is read)");
    let conn = Arc::new(conn);
    let started = Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..3000 {
        let conn = conn.clone();
        calls.spawn(async move {
            conn.request_with_timeout(
                "tools/call",
                call("echo", json!({"text": format!("{i:0>200}")})),
                Duration::from_secs(3),
            )
            .await
        });
    }
    let (mut not_sent, mut timed_out) = (0, 0);
    while let Some(r) = calls.join_next().await {
        match r.expect("task") {
            Err(RequestError::Transport(TransportError::NotSent(why))) => {
                assert!(why.contains("did not read its stdin"), "{why}");
                not_sent += 1;
            }
            Err(RequestError::Transport(TransportError::Timeout(_))) => timed_out += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    // Written (in the pipe, or in the writer's bounded queue) and unanswered: timeouts.
    // The rest never got into the queue: never sent. The first wave queued all 3,000.
    assert!(
        not_sent > 500 && timed_out < 2500,
        "past the writer's bound requests wait, then fail as never sent ({not_sent} not sent, {timed_out} timed out)"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    conn.shutdown().await;
}

// 5. Bounded queues: a `Connection`'s events. A notification over 16 KiB goes there
// only when no event waits unread: an embedder slow to read its events holds one such
// at most, not 256 of up to 16 MiB each (their charge against the inbound channel's
// 8 MiB ends when they are handed on).
#[tokio::test]
async fn item_05_large_notifications_do_not_pile_up_in_unread_events() {
    let (conn, mut events) = Connection::connect("loud", demo_stdio(&["loud"]), options())
        .await
        .expect("connect");
    let params = json!({
        "name": "progress",
        "arguments": {"steps": 40, "message_bytes": 100_000},
        "_meta": {"progressToken": "t"},
    });
    conn.request_with_timeout("tools/call", Some(params), Duration::from_secs(30))
        .await
        .expect("the call");
    let mut large = 0;
    while let Ok(event) = events.try_recv() {
        if let ServerEvent::Notification(n) = event
            && n.method == "notifications/progress"
        {
            large += 1;
        }
    }
    assert_eq!(
        large, 1,
        "the first, alone in the channel; the rest dropped"
    );
    conn.shutdown().await;
}

// 5. Bounded queues: a server that stalls, then reads again, gets no request whose
// caller was told it was never sent, and a cancellation for every one that timed out.
#[tokio::test]
async fn item_05_a_stalled_server_runs_no_request_withdrawn_and_hears_of_every_one_timed_out() {
    let record = temp_file("stalled");
    let (conn, _events) = Connection::connect(
        "stalled",
        demo_stdio(&[
            "stalled",
            "--stop-reading-after",
            "1",
            "--resume-reading-after-ms",
            "3000",
            "--record",
            &record.to_string_lossy(),
        ]),
        options(),
    )
    .await
    .expect("connect (the probe is read)");
    let conn = Arc::new(conn);
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..3000 {
        let conn = conn.clone();
        calls.spawn(async move {
            let r = conn
                .request_with_timeout(
                    "tools/call",
                    call("echo", json!({"text": format!("{i:0>200}")})),
                    Duration::from_secs(1),
                )
                .await;
            (format!("{i:0>200}"), r)
        });
    }
    let mut timed_out = std::collections::HashSet::new();
    let mut not_sent = 0;
    while let Some(r) = calls.join_next().await {
        match r.expect("task") {
            (_, Err(RequestError::Transport(TransportError::NotSent(_)))) => not_sent += 1,
            (text, Err(RequestError::Transport(TransportError::Timeout(_)))) => {
                timed_out.insert(text);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    // What was still queued at its deadline was withdrawn: only what the writer had
    // taken (a pipe's and a batch's worth, not its queue of 1024) timed out.
    assert!(
        !timed_out.is_empty() && timed_out.len() < 1024,
        "{} timed out, {not_sent} not sent",
        timed_out.len()
    );
    // The server reads again: it runs what timed out, and hears each one cancelled.
    let settled = eventually(Duration::from_secs(20), || {
        let lines = recorded(&record);
        let ran = lines.iter().filter(|r| r["method"] == "tools/call").count();
        let cancelled = lines
            .iter()
            .filter(|r| r["notification"] == "notifications/cancelled")
            .count();
        ran == timed_out.len() && cancelled == ran
    })
    .await;
    let lines = recorded(&record);
    for r in lines.iter().filter(|r| r["method"] == "tools/call") {
        let text = r["params"]["arguments"]["text"].as_str().unwrap_or("");
        assert!(
            timed_out.contains(text),
            "ran a request reported never sent"
        );
        let cancelled = lines.iter().any(|c| {
            c["notification"] == "notifications/cancelled" && c["params"]["requestId"] == r["id"]
        });
        assert!(cancelled, "no cancellation for request {}", r["id"]);
    }
    assert!(settled, "{} timed out", timed_out.len());
    conn.shutdown().await;
}

// 5. Bounded queues: the in-flight limit on the direct path.
#[tokio::test]
async fn item_05_past_max_in_flight_a_call_is_refused_as_overloaded() {
    let mut busy = demo_server("busy", &[]);
    busy.max_in_flight = 2;
    let h = start_ready(config(vec![busy])).await;
    let calls: Vec<_> = (0..3)
        .map(|_| {
            let h = h.clone();
            tokio::spawn(async move {
                h.call_tool(&a(), "busy__slow", json!({"ms": 800, "text": "x"}))
                    .await
            })
        })
        .collect();
    let mut overloaded = 0;
    for c in calls {
        if let Err(CallError::Server(ServerError::Overloaded { capacity: 2, .. })) =
            c.await.expect("task")
        {
            overloaded += 1;
        }
    }
    assert_eq!(overloaded, 1);
    h.shutdown().await;
}

// 5. Bounded queues: a flood of list_changed.
#[tokio::test]
async fn item_05_a_flood_of_list_changed_notifications_becomes_one_invalidation_per_tick() {
    let h = start_ready(config(vec![demo_server("noisy", &["--era", "legacy"])])).await;
    h.list_tools(&a()).await.expect("list");
    let before = h.cache_stats().invalidations;
    h.call_tool(&a(), "noisy__notify_flood", json!({"n": 500}))
        .await
        .expect("flood");
    let invalidations = || h.cache_stats().invalidations - before;
    assert!(
        eventually(Duration::from_secs(10), || invalidations() > 0).await,
        "the flood invalidated the cache"
    );
    // One coalescing tick (the server actor's is 100 ms) and a little: notifications
    // still coming in would show as more invalidations.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let dropped = invalidations();
    assert!(
        (1..=3).contains(&dropped),
        "500 notifications, {dropped} invalidations"
    );
    h.shutdown().await;
}

// 5. Bounded queues: a server that keeps announcing changes is heard less and less
// often, and at the tick again once it has been quiet.
#[tokio::test]
async fn item_05_a_server_that_keeps_announcing_changes_is_heard_less_and_less_often() {
    let h = start_ready(config(vec![demo_server("noisy", &["--era", "legacy"])])).await;
    h.list_tools(&a()).await.expect("list");
    let before = h.cache_stats().invalidations;
    let invalidations = || h.cache_stats().invalidations - before;
    // A change every 50 ms or so for 2 s: heard every 100 ms, that was 20 invalidations
    // (each a re-listing here, a message to every peer and every client).
    let storm = Instant::now();
    while storm.elapsed() < Duration::from_secs(2) {
        h.call_tool(&a(), "noisy__notify_flood", json!({"n": 1}))
            .await
            .expect("notify");
        tokio::time::sleep(Duration::from_millis(50)).await; // the storm's pace (deliberate)
    }
    let during = invalidations();
    assert!(
        (1..=8).contains(&during),
        "{during} invalidations in a storm of 2 s"
    );
    // Quiet (the last gap, at most 3.2 s here, and 2 s more): the next change is
    // heard at the tick again, not after a gap grown by the storm.
    tokio::time::sleep(Duration::from_millis(5500)).await; // the quiet (deliberate)
    let quiet = invalidations();
    h.call_tool(&a(), "noisy__notify_flood", json!({"n": 1}))
        .await
        .expect("notify");
    assert!(
        eventually(Duration::from_millis(1500), || invalidations() > quiet).await,
        "a change after a quiet spell is heard at once"
    );
    h.shutdown().await;
}

// 5. Bounded memory: a status snapshot shares what the server said about itself (its
// instructions may be megabytes), it does not copy it.
#[tokio::test]
async fn item_05_status_snapshots_share_the_servers_profile() {
    let h = start_ready(config(vec![demo_server("s", &[])])).await;
    let (a, b) = (h.server_status("s"), h.server_status("s"));
    let (a, b) = (
        a.and_then(|s| s.profile).expect("a profile"),
        b.and_then(|s| s.profile).expect("a profile"),
    );
    assert!(Arc::ptr_eq(&a, &b));
    h.shutdown().await;
}

/// A fresh directory `name` with a named pipe `audit.jsonl` in it.
fn fifo_in(name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = scratch_dir().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let fifo = dir.join("audit.jsonl");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    (dir, fifo)
}

// 5. Bounded queues: no blocking file I/O on the async threads.
#[test]
fn item_05_an_audit_file_that_blocks_on_open_never_stalls_calls() {
    let (dir, fifo) = fifo_in("fifo");
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let fifo2 = fifo.clone();
    std::thread::spawn(move || {
        // One thread runs the whole harness: a blocking open() on it would stall all.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let calls = rt.block_on(async {
            let mut cfg = config(vec![demo_server("s", &[])]);
            cfg.audit = AuditConfig {
                path: Some(fifo2),
                flush_every: Duration::from_millis(20),
                on_failure: AuditFailure::KeepServing,
                ..AuditConfig::default()
            };
            let h = start_ready(cfg).await;
            let mut ok = 0;
            for _ in 0..20 {
                if h.call_tool(&a(), "s__echo", json!({"text": "x"}))
                    .await
                    .is_ok()
                {
                    ok += 1;
                }
            }
            std::mem::forget(h); // the writer is still blocked; do not wait on it
            ok
        });
        let _ = done_tx.send(calls);
    });
    let calls = done_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("calls went on while the audit writer was blocked");
    assert_eq!(calls, 20);
    // Unblock the writer's open so its thread can end (a non-blocking reader never
    // waits for a writer that may not be opening yet).
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A harness whose audit file is a pipe in a fresh directory `name`, opened for reading
/// (not blocking) and not read yet, with arguments recorded in full, written every
/// `flush_every`.
async fn audit_to_an_unread_pipe(
    name: &str,
    on_failure: AuditFailure,
    flush_every: Duration,
) -> (std::path::PathBuf, std::fs::File, HarnessHandle) {
    let (dir, fifo) = fifo_in(name);
    use std::os::unix::fs::OpenOptionsExt;
    let reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .expect("open the reading end");
    let mut cfg = config(vec![demo_server("s", &[])]);
    cfg.audit = AuditConfig {
        path: Some(fifo),
        flush_every,
        on_failure,
        redaction: mcp_harness::audit::Redaction::Full,
        ..AuditConfig::default()
    };
    (dir, reader, start_ready(cfg).await)
}

const EVERY_20MS: Duration = Duration::from_millis(20);

/// 16 KiB of arguments a record: a pipe (64 KiB) fills within a few calls.
/// 16 KiB of arguments a record keeps whole (each string within the 4 KiB kept).
fn big_arguments() -> Value {
    let part = "x".repeat(4000);
    json!({"text": part, "b": part, "c": part, "d": part})
}

// A pipe that is read no more holds the audit writer inside a write that never
// returns (no error): after a few seconds that counts as failing, so `fail_closed`
// refuses calls (before, every call went on and the records piled up in memory), and
// once the pipe is read again the calls come back and every record is there.
#[tokio::test]
async fn an_audit_write_that_never_returns_counts_as_failing() {
    let (dir, reader, h) =
        audit_to_an_unread_pipe("stalled-fifo", AuditFailure::FailClosed, EVERY_20MS).await;
    let big = big_arguments();
    let mut made = 0;
    let refused = loop {
        match h.call_tool(&a(), "s__echo", big.clone()).await {
            Ok(_) => made += 1,
            Err(CallError::AuditUnavailable(e)) => break e,
            Err(e) => panic!("{e}"),
        }
        assert!(made < 2_000, "calls went on while the writer was stuck");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        refused.reason.contains("not returned"),
        "{}",
        refused.reason
    );
    assert!(!h.audit_health().writable);
    // Read again: the writer's write returns, and calls are let in again.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = stop.clone();
    let drained = std::thread::spawn(move || {
        use std::io::Read;
        let mut reader = reader;
        let mut all = Vec::new();
        let mut buf = [0u8; 65536];
        loop {
            match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => all.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if stopped.load(Ordering::SeqCst) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(_) => break,
            }
        }
        all
    });
    assert!(
        eventually(Duration::from_secs(20), || h.audit_health().writable).await,
        "{:?}",
        h.audit_health()
    );
    h.call_tool(&a(), "s__echo", json!({"text": "after"}))
        .await
        .expect("let in again");
    h.shutdown().await;
    stop.store(true, Ordering::SeqCst);
    let text = drained.join().expect("reader");
    let records = String::from_utf8_lossy(&text)
        .lines()
        .filter(|l| !l.is_empty())
        .count();
    // Each call that ran has its two records (the refused one none: there was no trail
    // to write them to), none lost.
    assert_eq!(records, 2 * (made + 1), "{made} calls");
    let _ = std::fs::remove_dir_all(&dir);
}

// Shutting down while an audit write is stuck (a pipe no one reads) takes a few
// seconds, not the flush's whole limit (30 s, past a container's usual grace): what
// waits behind the write is reported unwritten.
#[tokio::test]
async fn shutdown_with_an_audit_write_stuck_ends_within_seconds() {
    let (dir, reader, h) =
        audit_to_an_unread_pipe("stuck-at-shutdown", AuditFailure::KeepServing, EVERY_20MS).await;
    let big = big_arguments();
    // Until the pipe (64 KiB) is full and a write is stuck in it.
    let mut made = 0;
    while h.audit_health().writable {
        h.call_tool(&a(), "s__echo", big.clone())
            .await
            .expect("keep_serving lets calls in");
        made += 1;
        assert!(made < 2_000, "the writer never got stuck");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shuts_down_within_seconds_leaving_a_backlog(h, reader, dir).await;
}

/// Shuts `h` down, which must end within seconds with records left unwritten; then the
/// pipe is read (the stuck write's thread goes) and `dir` removed.
async fn shuts_down_within_seconds_leaving_a_backlog(
    h: HarnessHandle,
    reader: std::fs::File,
    dir: std::path::PathBuf,
) {
    let health = tokio::time::timeout(Duration::from_secs(20), h.shutdown())
        .await
        .expect("shutdown ends within seconds");
    assert!(health.backlog > 0, "{health:?}");
    drop(reader);
    let _ = std::fs::remove_dir_all(&dir);
}

// The same when the write that gets stuck is the shutdown's own flush: records held
// for an hourly flush, 160 KiB of them, more than the pipe takes. Before, shutdown
// waited out the flush's 30 s.
#[tokio::test]
async fn shutdown_whose_own_audit_flush_gets_stuck_ends_within_seconds() {
    let hourly = Duration::from_secs(3600);
    let (dir, reader, h) =
        audit_to_an_unread_pipe("stuck-in-flush", AuditFailure::KeepServing, hourly).await;
    for _ in 0..5 {
        h.call_tool(&a(), "s__echo", big_arguments())
            .await
            .expect("call");
    }
    let health = h.audit_health();
    assert!(health.writable && health.backlog == 10, "{health:?}");
    shuts_down_within_seconds_leaving_a_backlog(h, reader, dir).await;
}

/// The harness's warnings, as this thread's subscriber sees them: a test's runtime runs
/// on its thread (the harness's tasks too), so it sees only this test's harness.
fn warn_logs() -> (Logs, tracing::subscriber::DefaultGuard) {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("mcp_harness=warn")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    (logs, tracing::subscriber::set_default(subscriber))
}

/// A legacy demo server whose elicitations wait in an approval queue.
async fn legacy_asking_a_queue() -> (HarnessHandle, ApprovalQueue) {
    let queue = ApprovalQueue::new(Duration::from_secs(30));
    let h = start_ready_with(
        Harness::builder(config(vec![demo_server("leg", &["--era", "legacy"])]))
            .input_handler("elicitation/create", Arc::new(queue.clone())),
    )
    .await;
    (h, queue)
}

#[tokio::test]
async fn a_legacy_servers_question_is_withdrawn_when_the_call_it_came_in_is_cancelled() {
    let (h, queue) = legacy_asking_a_queue().await;
    let call = {
        let h = h.clone();
        tokio::spawn(async move { h.call_tool(&a(), "leg__confirm", json!({})).await })
    };
    assert!(
        eventually(Duration::from_secs(10), || queue.pending().len() == 1).await,
        "the server asks during the call"
    );
    call.abort();
    assert!(call.await.is_err_and(|e| e.is_cancelled()));
    // Not left for a person to approve until the server's answer times out.
    assert!(
        eventually(Duration::from_secs(5), || queue.pending().is_empty()).await,
        "the question is withdrawn with its call: {:?}",
        queue.pending()
    );
    h.shutdown().await;
}

// A legacy server that gives its question up (`notifications/cancelled`) has it
// withdrawn at once, not left for a person to approve until the input timeout.
#[tokio::test]
async fn a_question_the_server_gives_up_leaves_the_approval_queue() {
    let (h, queue) = legacy_asking_a_queue().await;
    let call = {
        let h = h.clone();
        tokio::spawn(async move {
            h.call_tool(
                &a(),
                "leg__confirm",
                json!({"give_up_ms": 500, "then_ms": 30_000}),
            )
            .await
        })
    };
    assert!(
        eventually(Duration::from_secs(10), || queue.pending().len() == 1).await,
        "the server asks"
    );
    // Gone while the call still runs: the server's word, not the call's end.
    assert!(
        eventually(Duration::from_secs(10), || queue.pending().is_empty()).await,
        "the question left the queue: {:?}",
        queue.pending()
    );
    assert!(!call.is_finished(), "the call still runs");
    call.abort();
    h.shutdown().await;
}

// With two calls on a legacy server, its question may be either's: it stays while
// one of them runs, and is withdrawn once both have ended.
#[tokio::test]
async fn a_legacy_servers_question_during_two_calls_is_withdrawn_when_both_have_ended() {
    let (h, queue) = legacy_asking_a_queue().await;
    let slow = {
        let h = h.clone();
        tokio::spawn(async move {
            h.call_tool(&a(), "leg__slow", json!({"ms": 60_000, "text": "z"}))
                .await
        })
    };
    // The slow call is on the server before the one that asks.
    assert!(
        eventually(Duration::from_secs(10), || h.metrics().in_flight == 1).await,
        "the slow call runs"
    );
    let asking = {
        let h = h.clone();
        tokio::spawn(async move { h.call_tool(&a(), "leg__confirm", json!({})).await })
    };
    assert!(
        eventually(Duration::from_secs(10), || queue.pending().len() == 1).await,
        "the server asks during the calls"
    );
    asking.abort();
    assert!(asking.await.is_err_and(|e| e.is_cancelled()));
    // Still one call on it that the question may be for.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(queue.pending().len(), 1);
    slow.abort();
    assert!(slow.await.is_err_and(|e| e.is_cancelled()));
    assert!(
        eventually(Duration::from_secs(5), || queue.pending().is_empty()).await,
        "the question is withdrawn once both calls ended: {:?}",
        queue.pending()
    );
    h.shutdown().await;
}

// 5. Bounded queues: a legacy server's requests.
#[tokio::test]
async fn item_05_a_legacy_servers_requests_past_the_concurrency_cap_are_refused() {
    // The refusals are seen in the harness's log.
    let (logs, _logging) = warn_logs();
    let refusals = || logs.count("too many server requests waiting for answers; refused");

    let (h, queue) = legacy_asking_a_queue().await;
    let call = {
        let h = h.clone();
        tokio::spawn(async move { h.call_tool(&a(), "leg__ask_many", json!({"n": 10})).await })
    };
    // All 10 dealt with before any is answered (an answer frees a slot): 4 waiting in
    // the queue, 6 refused.
    let dealt_with = || queue.pending().len() == 4 && refusals() == 6;
    assert!(
        eventually(Duration::from_secs(10), dealt_with).await,
        "{} pending, {} refused",
        queue.pending().len(),
        refusals()
    );
    for p in queue.pending() {
        queue.answer(p.id, json!({"action": "accept", "content": {"x": "y"}}));
    }
    let r = call.await.expect("task").expect("call");
    assert_eq!(text(&r), "answered 4 refused 6");
    h.shutdown().await;
}

// 5. An answer to a legacy HTTP server's request is a POST the server may hold open:
// the request's slot is kept until it is sent, so a server that takes answers slowly
// gets no more than four requests answered at once, and the rest refused. Before, the
// slot went back when the answer was made, and answers piled up without bound.
#[tokio::test]
async fn item_05_answers_a_legacy_http_server_holds_open_keep_their_requests_slot() {
    let server = HttpServer::demo(&["leg", "--era", "legacy", "--hold-answers-ms", "2000"]).await;
    let h = start_ready_with(
        Harness::builder(config(vec![ServerConfig::new("leg", server.spec())])).input_handler(
            "elicitation/create",
            Arc::new(FixedAnswers::new(
                json!({"action": "accept", "content": {"x": "y"}}),
            )),
        ),
    )
    .await;
    let r = h
        .call_tool(&a(), "leg__ask_many", json!({"n": 20}))
        .await
        .expect("call");
    assert_eq!(text(&r), "answered 4 refused 16");
    h.shutdown().await;
}

// 5. A flood of a server's requests refused is logged a few times, not once each.
#[tokio::test]
async fn item_05_a_flood_of_refused_server_requests_is_logged_a_few_times() {
    let (logs, _logging) = warn_logs();
    let refusals = || logs.count("too many server requests waiting for answers; refused");
    let (h, queue) = legacy_asking_a_queue().await;
    let call = {
        let h = h.clone();
        tokio::spawn(async move { h.call_tool(&a(), "leg__ask_many", json!({"n": 100})).await })
    };
    assert!(
        eventually(Duration::from_secs(10), || queue.pending().len() == 4).await,
        "four wait for answers"
    );
    for p in queue.pending() {
        queue.answer(p.id, json!({"action": "accept", "content": {"x": "y"}}));
    }
    let r = call.await.expect("task").expect("call");
    assert_eq!(text(&r), "answered 4 refused 96");
    // The first ten, then the 16th, 32nd and 64th.
    assert_eq!(refusals(), 13);
    h.shutdown().await;
}

// 5. A legacy server's own request is held to the capabilities the harness declared,
// as a round's is: an elicitation mode the harness does not know never reaches a
// handler (which would take it for a form and answer it).
#[tokio::test]
async fn item_05_a_legacy_servers_elicitation_of_an_unknown_mode_is_refused_unanswered() {
    let h = start_ready_with(
        Harness::builder(config(vec![demo_server("leg", &["--era", "legacy"])])).input_handler(
            "elicitation/create",
            Arc::new(FixedAnswers::new(
                json!({"action": "accept", "content": {"x": "y"}}),
            )),
        ),
    )
    .await;
    let asked = |mode: &'static str| {
        let h = h.clone();
        async move {
            let r = h
                .call_tool(&a(), "leg__ask_many", json!({"n": 2, "mode": mode}))
                .await
                .expect("call");
            text(&r).to_string()
        }
    };
    assert_eq!(asked("telepathy").await, "answered 0 refused 2");
    assert_eq!(asked("form").await, "answered 2 refused 0");
    h.shutdown().await;
}

// 5. A legacy server that keeps asking during one call is held to round_cap, as a
// modern server's rounds are: past it each question is refused without reaching a
// handler (a person, a model). Before, it could ask until the call's deadline.
#[tokio::test]
async fn item_05_a_legacy_server_asking_past_round_cap_during_a_call_is_refused() {
    let (handler, seen) = counting(json!({"form": {}}));
    let h = start_ready_with(
        Harness::builder(config(vec![demo_server("leg", &["--era", "legacy"])]))
            .input_handler("elicitation/create", handler),
    )
    .await;
    // Ten questions (the default cap) are answered.
    let r = h
        .call_tool(&a(), "leg__rounds", json!({"n": 10}))
        .await
        .expect("ten answered");
    assert_eq!(seen.load(Ordering::SeqCst), 10, "{r}");
    // The eleventh of a call is refused, and the server ends its call with that.
    seen.store(0, Ordering::SeqCst);
    let e = h
        .call_tool(&a(), "leg__rounds", json!({"n": 12}))
        .await
        .expect_err("refused past the cap");
    assert!(e.to_string().contains("round_cap"), "{e}");
    assert_eq!(seen.load(Ordering::SeqCst), 10);
    h.shutdown().await;
}

// A legacy server asking during a long call is held to round_cap even while the same
// agent's short calls come and go on it. Before, each new one had been asked nothing,
// and the least count among the calls on the server stayed under the cap for ever:
// the server could ask until the long call's deadline. When all the calls on the
// server are one agent's, the most asked of them now counts.
#[tokio::test]
async fn short_calls_beside_a_long_one_do_not_lift_a_legacy_servers_round_cap() {
    struct Slow(Arc<AtomicUsize>);
    impl InputHandler for Slow {
        fn capability(&self) -> Value {
            json!({"form": {}})
        }
        fn answer(&self, _: InputRequestContext) -> InputFuture {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok(json!({"action": "accept", "content": {"x": "y"}}))
            })
        }
    }
    let seen = Arc::new(AtomicUsize::new(0));
    let mut cfg = config(vec![demo_server("leg", &["--era", "legacy"])]);
    cfg.round_cap = 3;
    let h = start_ready_with(
        Harness::builder(cfg).input_handler("elicitation/create", Arc::new(Slow(seen.clone()))),
    )
    .await;
    // Short calls, one after another on two lanes: one is on the server at each
    // question, asked at most once.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let lanes: Vec<_> = (0..2)
        .map(|_| {
            let (h, done) = (h.clone(), done.clone());
            tokio::spawn(async move {
                while !done.load(Ordering::SeqCst) {
                    let _ = h
                        .call_tool(&a(), "leg__slow", json!({"ms": 100, "text": "x"}))
                        .await;
                }
            })
        })
        .collect();
    let e = h
        .call_tool(&a(), "leg__rounds", json!({"n": 6}))
        .await
        .expect_err("refused past the cap");
    assert!(e.to_string().contains("round_cap"), "{e}");
    assert_eq!(seen.load(Ordering::SeqCst), 3, "three answered, no more");
    done.store(true, Ordering::SeqCst);
    for lane in lanes {
        let _ = lane.await;
    }
    h.shutdown().await;
}

/// A harness with round_cap 3, questions to an approval queue, and a call of `rounds`
/// (3 of them) under way on a legacy server `first`, which may fail over (the tool is
/// marked idempotent by trusted servers) to `second` of `era`.
async fn failing_over_to(
    era: &str,
) -> (
    HarnessHandle,
    ApprovalQueue,
    tokio::task::JoinHandle<Result<Value, CallError>>,
) {
    let server = |id: &str, era: &str| {
        let mut s = demo_server(id, &["--era", era, "--idempotent", "rounds"]);
        s.trust_annotations = true;
        s
    };
    let mut first = server("first", "legacy");
    first.priority = 10;
    let mut cfg = config(vec![first, server("second", era)]);
    cfg.round_cap = 3;
    let queue = ApprovalQueue::new(Duration::from_secs(60));
    let h = start_ready_with(
        Harness::builder(cfg).input_handler("elicitation/create", Arc::new(queue.clone())),
    )
    .await;
    let call = {
        let h = h.clone();
        tokio::spawn(async move { h.call_tool(&a(), "rounds", json!({"n": 3})).await })
    };
    (h, queue, call)
}

// A call that fails over from one legacy server to another is held to one round_cap
// on both: the second server's questions count on from the first's. Before, each
// server it tried could ask round_cap more.
#[tokio::test]
async fn a_call_failing_over_between_legacy_servers_is_asked_round_cap_questions_in_all() {
    let (h, queue, call) = failing_over_to("legacy").await;
    let answer = json!({"action": "accept", "content": {"answer": "yes"}});
    let next = || async {
        let pending = tokio::time::timeout(Duration::from_secs(10), queue.next_pending())
            .await
            .expect("a question");
        assert_eq!(pending.len(), 1, "one question at a time");
        pending.into_iter().next().expect("one")
    };
    // The first server's first question is answered; it dies during its second.
    let q = next().await;
    assert_eq!(q.request.server, "first");
    queue.answer(q.id, answer.clone());
    let q = next().await;
    assert_eq!(q.request.server, "first");
    let pid = h.server_status("first").and_then(|s| s.pid).expect("pid");
    sigkill(pid);
    // Two asked: the second server may ask one more, and its next is refused.
    let from_second = || {
        let pending = queue.pending();
        pending.iter().all(|p| p.request.server == "second") && pending.len() == 1
    };
    assert!(
        eventually(Duration::from_secs(10), from_second).await,
        "{:?}",
        queue.pending()
    );
    queue.answer(queue.pending()[0].id, answer.clone());
    let e = call.await.expect("join").expect_err("past the cap");
    assert!(e.to_string().contains("round_cap"), "{e}");
    assert!(queue.pending().is_empty(), "{:?}", queue.pending());
    h.shutdown().await;
}

// The same when the call fails over from a legacy server to a modern one: the legacy
// server's questions and the modern one's rounds count against one round_cap. Before,
// they were counted apart, and the call could have twice the cap.
#[tokio::test]
async fn a_call_failing_over_from_a_legacy_to_a_modern_server_has_one_round_cap() {
    let (h, queue, call) = failing_over_to("modern").await;
    let answer = json!({"action": "accept", "content": {"answer": "yes"}});
    let next = |from: &'static str| {
        let queue = queue.clone();
        async move {
            let at = |p: &Vec<mcp_harness::call::input::PendingInput>| {
                p.iter().any(|q| q.request.server == from)
            };
            let found = eventually(Duration::from_secs(10), || at(&queue.pending())).await;
            assert!(found, "a question from {from}: {:?}", queue.pending());
            let pending = queue.pending();
            pending
                .into_iter()
                .find(|q| q.request.server == from)
                .expect("one")
        }
    };
    // The legacy server's first question is answered; it dies during its second.
    let q = next("first").await;
    queue.answer(q.id, answer.clone());
    let q = next("first").await;
    let pid = h.server_status("first").and_then(|s| s.pid).expect("pid");
    sigkill(pid);
    drop(q);
    // Two asked: the modern server has one round more, and its next is past the cap.
    let q = next("second").await;
    queue.answer(q.id, answer.clone());
    let ended = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("the call ends at the cap")
        .expect("join");
    let e = ended.expect_err("past the cap");
    assert!(matches!(e, CallError::RoundCap { .. }), "{e}");
    h.shutdown().await;
}

/// Log output, kept to be searched.
#[derive(Clone, Default)]
struct Logs(Arc<std::sync::Mutex<Vec<u8>>>);

impl Logs {
    /// How many lines contain `text`.
    fn count(&self, text: &str) -> usize {
        let bytes = self.0.lock().expect("logs");
        String::from_utf8_lossy(&bytes)
            .lines()
            .filter(|l| l.contains(text))
            .count()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("logs").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_server_flooding_its_stderr_costs_the_log_a_hundred_lines_a_second() {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("mcp_harness::server_stderr=info")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    // 20,000 lines at once, then one more a second and a half later (the count of those
    // not logged comes with the first line of a later second).
    let mut server = demo_server("s", &[]);
    server.transport = mcp_harness::TransportSpec::Stdio(mcp_harness::transport::StdioSpec {
        command: "sh".into(),
        args: vec![
            "-c".into(),
            "(seq 20000 | sed 's/^/flood-line /'; sleep 1.5; echo flood-line-last) >&2 & exec \"$0\" demo-server s"
                .into(),
            harness_exe(),
        ],
        ..Default::default()
    });
    let h = start_ready(config(vec![server])).await;
    let started = Instant::now();
    assert!(
        eventually(Duration::from_secs(10), || logs.count("flood-line-last")
            == 1)
        .await,
        "the last line is logged"
    );
    h.call_tool(&a(), "s__echo", json!({"text": "x"}))
        .await
        .expect("still serving");
    h.shutdown().await;
    let seconds = started.elapsed().as_secs() + 3; // the start's too, and a second begun
    let flooded = logs.count("flood-line");
    assert!(
        (100..=100 * seconds as usize).contains(&flooded),
        "{flooded} lines in about {seconds} s"
    );
    assert!(logs.count("stderr lines not logged") >= 1);
}

// 5. Bounded queues: input a server asks for outside any call.
#[tokio::test]
async fn item_05_elicitation_outside_any_call_is_refused_unless_the_config_allows_it() {
    for allow in [false, true] {
        let record = temp_file("unsolicited");
        let r = record.to_string_lossy().into_owned();
        let mut leg = demo_server("leg", &["--era", "legacy", "--record", &r]);
        leg.allow_unsolicited_input = allow;
        let h = start_ready_with(Harness::builder(config(vec![leg])).input_handler(
            "elicitation/create",
            Arc::new(FixedAnswers::new(
                json!({"action": "accept", "content": {}}),
            )),
        ))
        .await;
        h.call_tool(&a(), "leg__ask_later", json!({"ms": 100}))
            .await
            .expect("call");
        // No call may be in flight when the ask comes (it would count as the call's):
        // the server records how its ask was answered.
        let answered = || {
            recorded(&record)
                .into_iter()
                .find(|l| l["event"] == "ask_later answered")
                .map(|l| l["outcome"].as_str().unwrap_or_default().to_string())
        };
        assert!(eventually(Duration::from_secs(10), || answered().is_some()).await);
        let last = answered().unwrap_or_default();
        if allow {
            assert_eq!(last, "answered accept");
        } else {
            assert!(last.starts_with("refused"), "{last}");
        }
        h.shutdown().await;
        let _ = std::fs::remove_file(record);
    }
}

// A question a legacy server asked outside any call (it may) is withdrawn when the
// server goes: nobody could take its answer, so it must not wait for a person until the
// input timeout.
#[tokio::test]
async fn a_question_outside_calls_leaves_the_approval_queue_when_its_server_exits() {
    let queue = ApprovalQueue::new(Duration::from_secs(60));
    let mut leg = demo_server("leg", &["--era", "legacy"]);
    leg.allow_unsolicited_input = true;
    let h = start_ready_with(
        Harness::builder(config(vec![leg]))
            .input_handler("elicitation/create", Arc::new(queue.clone())),
    )
    .await;
    h.call_tool(&a(), "leg__ask_later", json!({"ms": 100}))
        .await
        .expect("call");
    assert!(
        eventually(Duration::from_secs(10), || queue.pending().len() == 1).await,
        "the server asks outside any call"
    );
    // The server exits; its question is nobody's to answer any more.
    let _ = h.call_tool(&a(), "leg__crash", json!({})).await;
    assert!(
        eventually(Duration::from_secs(10), || queue.pending().is_empty()).await,
        "the question left the queue with its server: {:?}",
        queue.pending()
    );
    h.shutdown().await;
}

/// Calls `leg__ask_then_return` `times` times as agent `a`: each asks a question right
/// before its result.
async fn ask_then_return(h: &HarnessHandle, times: usize) {
    for _ in 0..times {
        h.call_tool(&a(), "leg__ask_then_return", json!({}))
            .await
            .expect("call");
    }
}

/// How the demo server recorded those questions to end, in order.
fn ask_then_return_outcomes(record: &std::path::PathBuf) -> Vec<String> {
    recorded(record)
        .into_iter()
        .filter(|l| l["event"] == "ask_then_return answered")
        .map(|l| l["outcome"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Answers every request, keeping the agent each was asked for.
struct Attributing(Arc<parking_lot::Mutex<Vec<Option<String>>>>);

impl InputHandler for Attributing {
    fn answer(&self, request: InputRequestContext) -> InputFuture {
        self.0.lock().push(request.agent_id);
        Box::pin(async { Ok(json!({"action": "accept", "content": {}})) })
    }
}

// A question a legacy server sends right before its call's result (the call may be
// over by the time it is handled) is the call's or refused: never answered as no one's,
// as if the server were allowed to ask outside calls.
#[tokio::test]
async fn item_05_a_question_right_before_its_calls_result_is_never_answered_as_no_ones() {
    let record = temp_file("ask-then-return");
    let r = record.to_string_lossy().into_owned();
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let h = start_ready_with(
        Harness::builder(config(vec![demo_server(
            "leg",
            &["--era", "legacy", "--record", &r],
        )]))
        .input_handler("elicitation/create", Arc::new(Attributing(seen.clone()))),
    )
    .await;
    const CALLS: usize = 20;
    ask_then_return(&h, CALLS).await;
    let outcomes = || ask_then_return_outcomes(&record);
    assert!(eventually(Duration::from_secs(10), || outcomes().len() == CALLS).await);
    let agents = seen.lock().clone();
    assert!(
        agents.iter().all(|agent| agent.as_deref() == Some("a")),
        "{agents:?}"
    );
    assert!(
        outcomes()
            .iter()
            .all(|o| o.starts_with("refused") || o == "answered accept"),
        "{:?}",
        outcomes()
    );
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
}

/// Answers every request, keeping when each was due.
struct Due(Arc<parking_lot::Mutex<Vec<Option<std::time::Instant>>>>);

impl InputHandler for Due {
    fn answer(&self, request: InputRequestContext) -> InputFuture {
        self.0.lock().push(request.answer_by);
        Box::pin(async { Ok(json!({"action": "accept", "content": {"approved": true}})) })
    }
}

// A legacy server's question is due when the connection stops waiting for its answer
// (the server's timeout), not at the handlers' timeout: an approval given, or a model
// paid for, after that reached no one, and a person was shown a due time minutes away.
#[tokio::test]
async fn a_legacy_servers_question_is_due_when_its_connection_stops_waiting() {
    let due = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut leg = demo_server("leg", &["--era", "legacy"]);
    leg.timeout = Duration::from_secs(2);
    let h = start_ready_with(
        Harness::builder(config(vec![leg]))
            .input_handler("elicitation/create", Arc::new(Due(due.clone()))),
    )
    .await;
    h.call_tool(&a(), "leg__confirm", json!({}))
        .await
        .expect("answered");
    let due = due.lock().clone();
    assert_eq!(due.len(), 1);
    assert!(
        due[0].is_some_and(|at| at <= std::time::Instant::now() + Duration::from_secs(2)),
        "due at the server's timeout at the latest"
    );
    h.shutdown().await;
}

/// A question's message, and the agent, call and `shared` it was taken for.
type Taken = (String, Option<String>, Option<u64>, bool);

/// Answers once `together` requests have come (or after ten seconds), keeping what each
/// asked and whose it was taken for.
struct Gathering {
    seen: Arc<parking_lot::Mutex<Vec<Taken>>>,
    together: usize,
}

impl InputHandler for Gathering {
    fn answer(&self, request: InputRequestContext) -> InputFuture {
        let message = request.params["message"]
            .as_str()
            .unwrap_or("?")
            .to_string();
        let seen = self.seen.clone();
        seen.lock()
            .push((message, request.agent_id, request.call_id, request.shared));
        let together = self.together;
        Box::pin(async move {
            eventually(Duration::from_secs(10), || seen.lock().len() >= together).await;
            Ok(json!({"action": "accept", "content": {"approved": true}}))
        })
    }
}

/// A legacy demo server over HTTP, and a harness of agents `a` and `b` using it with
/// `handler` for its elicitations.
async fn legacy_http(args: &[&str], handler: Arc<dyn InputHandler>) -> (HttpServer, HarnessHandle) {
    let mut all = vec!["leg", "--era", "legacy"];
    all.extend_from_slice(args);
    let server = HttpServer::demo(&all).await;
    let config = HarnessConfig {
        servers: vec![ServerConfig::new("leg", server.spec())],
        permissions: grant_everything(&["a", "b"]),
        ..HarnessConfig::default()
    };
    let h = start_ready_with(Harness::builder(config).input_handler("elicitation/create", handler))
        .await;
    (server, h)
}

// Over legacy HTTP a server's question comes on the event stream of the request it is
// asked during: it is that call's, and its agent's, even while another agent's call is
// on the server (where a question that names no call is no one agent's).
#[tokio::test]
async fn a_legacy_http_question_is_the_call_whose_stream_carried_it() {
    let seen = Arc::default();
    let handler = Arc::new(Gathering {
        seen: Arc::clone(&seen),
        together: 2,
    });
    let (_server, h) = legacy_http(&[], handler).await;
    let ask = |agent: &'static str| {
        let h = h.clone();
        async move {
            let args = json!({"message": agent});
            h.call_tool(&Caller::agent(agent), "leg__confirm", args)
                .await
        }
    };
    let (from_a, from_b) = tokio::join!(ask("a"), ask("b"));
    assert_eq!(text(&from_a.expect("a's call")), "approved: true");
    assert_eq!(text(&from_b.expect("b's call")), "approved: true");
    let seen = seen.lock().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    for (message, agent, call, shared) in &seen {
        assert_eq!(agent.as_deref(), Some(message.as_str()), "{seen:?}");
        assert!(call.is_some() && !shared, "{seen:?}");
    }
    assert_ne!(seen[0].2, seen[1].2, "two calls");
    h.shutdown().await;
}

// A question a legacy HTTP server sends right before its call's result is that call's
// or refused: never taken for another agent's call still on the server.
#[tokio::test]
async fn a_legacy_http_question_right_before_its_result_is_never_another_calls() {
    let record = temp_file("http-ask-then-return");
    let r = record.to_string_lossy().into_owned();
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let handler = Arc::new(Attributing(seen.clone()));
    let (_server, h) = legacy_http(&["--record", &r], handler).await;
    let slow = {
        let h = h.clone();
        tokio::spawn(async move {
            let args = json!({"ms": 60_000});
            h.call_tool(&Caller::agent("b"), "leg__slow", args).await
        })
    };
    assert!(
        eventually(Duration::from_secs(10), || calls_recorded(&record, "slow")
            == 1)
        .await
    );
    // One that waits for its answer before its result, so that one at least is asked.
    h.call_tool(&a(), "leg__ask_then_return", json!({"ms": 500}))
        .await
        .expect("call");
    const CALLS: usize = 21;
    ask_then_return(&h, CALLS - 1).await;
    let answered = || ask_then_return_outcomes(&record).len();
    assert!(eventually(Duration::from_secs(10), || answered() == CALLS).await);
    let agents = seen.lock().clone();
    assert!(
        !agents.is_empty() && agents.iter().all(|agent| agent.as_deref() == Some("a")),
        "{agents:?}"
    );
    slow.abort();
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
}

/// A legacy HTTP demo server (`flags` added) that ends its session at the first call,
/// and a harness ready on it that restarts it after `restart_delay`.
async fn expiring_legacy_http(
    flags: &[&str],
    restart_delay: Duration,
) -> (HttpServer, HarnessHandle) {
    let mut args = vec!["leg", "--era", "legacy", "--expire-on-first-call"];
    args.extend_from_slice(flags);
    let server = HttpServer::demo(&args).await;
    let mut leg = ServerConfig::new("leg", server.spec());
    leg.restart = RestartConfig {
        min_delay: restart_delay,
        max_delay: restart_delay,
        ..RestartConfig::default()
    };
    let h = start_ready(config(vec![leg])).await;
    (server, h)
}

// A legacy HTTP server upgraded behind its address: its session expires, and the
// renewal's `initialize` chooses another version, so the session cannot go on as it
// was. The connection is over: the server is connected anew (and speaks the new
// version), not left ready on a connection whose every request fails.
#[tokio::test]
async fn a_session_the_server_will_not_renew_as_it_was_is_connected_anew() {
    let (_server, h) = expiring_legacy_http(
        &["--renewal-version", "2025-06-18"],
        Duration::from_millis(50),
    )
    .await;
    let first = h.server_status("leg").expect("leg");
    assert_eq!(first.protocol_version.as_deref(), Some("2025-11-25"));
    let echo = || h.call_tool(&a(), "leg__echo", json!({"text": "hi"}));
    let refused = echo().await.expect_err("its session could not be renewed");
    assert!(
        refused.to_string().contains("would not begin it again"),
        "{refused}"
    );
    assert!(
        eventually(Duration::from_secs(10), || h
            .server_status("leg")
            .is_some_and(|s| s.state == ServerState::Ready
                && s.protocol_version.as_deref() == Some("2025-06-18")))
        .await,
        "connected anew: {:?}",
        h.server_status("leg")
    );
    let answer = echo().await.expect("served on the new connection");
    assert_eq!(text(&answer), "hi");
    h.shutdown().await;
}

// A renewal whose `initialize` is answered with an error: one that refuses the version
// ends the connection at once; one that may pass (an internal error) is tried again at
// the next 404, and ends it only at the third in a row. Either way the server is not
// left ready on a connection whose every request fails.
#[tokio::test]
async fn a_renewal_refused_or_failing_in_a_row_ends_the_connection() {
    for (code, tries) in [("-32602", 1), ("-32603", 3)] {
        let (_server, h) =
            expiring_legacy_http(&["--refuse-renewal-code", code], Duration::from_secs(30)).await;
        let mut refused_at = None;
        for n in 1..=3 {
            let failed = h
                .call_tool(&a(), "leg__echo", json!({"text": "hi"}))
                .await
                .expect_err("its session is gone");
            if failed.to_string().contains("would not begin it again") {
                refused_at = Some(n);
                break;
            }
        }
        assert_eq!(refused_at, Some(tries), "{code}");
        assert!(
            eventually(Duration::from_secs(5), || h
                .server_status("leg")
                .is_some_and(|s| s.state != ServerState::Ready))
            .await,
            "{code}: not left ready"
        );
        h.shutdown().await;
    }
}

// A request sent again in a new session (its first POST found the session ended) goes
// under a new id: a question on its stream is still the call's.
#[tokio::test]
async fn a_legacy_http_question_during_a_request_sent_again_is_still_the_calls() {
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let handler = Arc::new(Attributing(seen.clone()));
    let (_server, h) = legacy_http(&["--expire-on-first-call"], handler).await;
    let args = json!({"message": "Again?"});
    let answer = h.call_tool(&a(), "leg__confirm", args).await;
    assert_eq!(text(&answer.expect("confirm")), "approved: false");
    assert_eq!(seen.lock().clone(), [Some("a".to_string())]);
    h.shutdown().await;
}

// A legacy server's question during a request of the embedder's own (no agent's call)
// is answered: it comes during a request, not outside one.
#[tokio::test]
async fn item_05_a_question_during_the_embedders_own_request_is_answered() {
    let leg = demo_server("leg", &["--era", "legacy"]);
    let h = start_ready_with(Harness::builder(config(vec![leg])).input_handler(
        "elicitation/create",
        Arc::new(FixedAnswers::new(
            json!({"action": "accept", "content": {"approved": true}}),
        )),
    ))
    .await;
    let params = json!({"name": "confirm", "arguments": {"message": "ok?"}});
    let result = h
        .request("leg", "tools/call", Some(params))
        .await
        .expect("the question was answered");
    assert!(result.to_string().contains("approved"), "{result}");
    h.shutdown().await;
}

/// A harness whose legacy server `leg` asks for elicitation in its `confirm` (the
/// handler is declared so that it asks), and a delegated call of it, spawned, whose
/// caller declares `capabilities` and takes its questions from the receiver.
async fn delegated_confirm(
    capabilities: Value,
) -> (
    HarnessHandle,
    tokio::task::JoinHandle<Result<mcp_harness::Answer, CallError>>,
    tokio::sync::mpsc::Receiver<mcp_harness::ServerQuestion>,
) {
    let leg = demo_server("leg", &["--era", "legacy"]);
    let declared = Arc::new(FixedAnswers::new(json!({"action": "decline"})));
    let h = start_ready_with(
        Harness::builder(config(vec![leg])).input_handler("elicitation/create", declared),
    )
    .await;
    let (questions, asked) = tokio::sync::mpsc::channel(4);
    let delegation = mcp_harness::Delegation {
        capabilities,
        questions: Some(questions),
        ..Default::default()
    };
    let call = tokio::spawn(h.call_delegated(
        &a(),
        mcp_harness::CallKind::Tool,
        "leg__confirm",
        json!({"message": "Go?"}),
        Some(delegation),
        mcp_harness::CallOptions::default(),
    ));
    (h, call, asked)
}

// A legacy server's question during a delegated call goes to the call's caller; when
// the call is dropped while the question is open, the question is withdrawn with it
// (the caller's reply port closes at once), not left open until the server's own
// timeout with an answer that would reach a call already gone.
#[tokio::test]
async fn a_delegated_callers_question_is_withdrawn_when_its_call_is_dropped() {
    let (h, call, mut asked) = delegated_confirm(json!({"elicitation": {}})).await;
    let mut question = tokio::time::timeout(Duration::from_secs(10), asked.recv())
        .await
        .expect("asked in time")
        .expect("a question for the caller");
    assert_eq!(question.method, "elicitation/create");
    call.abort();
    assert!(
        tokio::time::timeout(Duration::from_secs(5), question.reply.closed())
            .await
            .is_ok(),
        "the question is withdrawn with its call"
    );
    h.shutdown().await;
}

// A legacy server's question during a delegated call is held to what the caller
// declared, as its rounds are: a caller that declared no elicitation is not handed one
// (before, any elicitation went to it, a URL of any mode but "url" unchecked).
#[tokio::test]
async fn a_delegated_callers_question_is_held_to_what_it_declared() {
    let (h, call, mut asked) = delegated_confirm(json!({})).await;
    let outcome = tokio::time::timeout(Duration::from_secs(20), call)
        .await
        .expect("the call ends")
        .expect("joined");
    assert!(
        asked.try_recv().is_err(),
        "a question the caller cannot answer reached it"
    );
    // The server heard why: its tool fails with the refusal.
    let shown = format!("{outcome:?}");
    assert!(shown.contains("does not support"), "{shown}");
    h.shutdown().await;
}

// A question during the embedder's own request is withdrawn when that request ends
// (here dropped), as a call's is: it is not left queued for a person to approve.
#[tokio::test]
async fn item_05_a_question_during_the_embedders_own_request_is_withdrawn_with_it() {
    let (h, queue) = legacy_asking_a_queue().await;
    let request = {
        let h = h.clone();
        let params = json!({"name": "confirm", "arguments": {"message": "ok?"}});
        tokio::spawn(async move { h.request("leg", "tools/call", Some(params)).await })
    };
    assert!(
        eventually(Duration::from_secs(10), || queue.pending().len() == 1).await,
        "the server asks during the request"
    );
    request.abort();
    assert!(request.await.is_err_and(|e| e.is_cancelled()));
    assert!(
        eventually(Duration::from_secs(5), || queue.pending().is_empty()).await,
        "the question is withdrawn with its request: {:?}",
        queue.pending()
    );
    // The server is still of use, and a question during the next request is queued.
    let again = {
        let h = h.clone();
        let params = json!({"name": "confirm", "arguments": {"message": "ok?"}});
        tokio::spawn(async move { h.request("leg", "tools/call", Some(params)).await })
    };
    assert!(
        eventually(Duration::from_secs(10), || queue.pending().len() == 1).await,
        "the next request's question is queued"
    );
    for p in queue.pending() {
        queue.answer(
            p.id,
            json!({"action": "accept", "content": {"approved": true}}),
        );
    }
    let result = again.await.expect("joined").expect("answered");
    assert!(result.to_string().contains("approved"), "{result}");
    h.shutdown().await;
}

// 6. MRTR input requests checked before any handler runs.
#[tokio::test]
async fn item_06_more_than_sixteen_input_requests_in_a_round_never_reach_a_handler() {
    let (handler, seen) = counting(json!({"form": {}}));
    let h = start_ready_with(
        Harness::builder(config(vec![demo_server("m", &[])]))
            .input_handler("elicitation/create", handler),
    )
    .await;
    let err = h
        .call_tool(&a(), "m__many_inputs", json!({"n": 17}))
        .await
        .expect_err("17 is too many");
    assert!(matches!(err, CallError::InputRejected { .. }), "{err}");
    assert_eq!(seen.load(Ordering::SeqCst), 0, "no handler saw them");
    let ok = h
        .call_tool(&a(), "m__many_inputs", json!({"n": 16}))
        .await
        .expect("16 is fine");
    assert_eq!(text(&ok), "got 16 answers");
    assert_eq!(seen.load(Ordering::SeqCst), 16);
    // Keys are names: one of megabytes is refused, before any handler holds it.
    let err = h
        .call_tool(
            &a(),
            "m__many_inputs",
            json!({"n": 1, "key_bytes": 1 << 20}),
        )
        .await
        .expect_err("a key of 1 MiB");
    assert!(matches!(err, CallError::InputRejected { .. }), "{err}");
    assert!(err.to_string().contains("at most 1024"), "{err}");
    let ok = h
        .call_tool(&a(), "m__many_inputs", json!({"n": 1, "key_bytes": 1024}))
        .await
        .expect("a key of 1 KiB is fine");
    assert_eq!(text(&ok), "got 1 answers");
    assert_eq!(seen.load(Ordering::SeqCst), 17);
    h.shutdown().await;
}

// The round that ends the call is in its audit record, with the method it asked for.
#[tokio::test]
async fn item_06_undeclared_methods_and_modes_end_the_call_before_any_handler() {
    let (handler, seen) = counting(json!({"form": {}}));
    let audit = temp_file("refused-rounds-audit");
    let mut c = config(vec![demo_server("m", &[])]);
    c.audit.path = Some(audit.clone());
    let h =
        start_ready_with(Harness::builder(c).input_handler("elicitation/create", handler)).await;
    for args in [
        json!({"n": 1, "mode": "url"}),
        json!({"n": 1, "method": "sampling/createMessage"}),
        json!({"n": 1, "method": "roots/list"}),
    ] {
        let err = h
            .call_tool(&a(), "m__many_inputs", args.clone())
            .await
            .expect_err("undeclared");
        assert!(
            matches!(err, CallError::InputRejected { .. }),
            "{args}: {err}"
        );
    }
    // So are rounds refused before they are read: too many requests, or malformed.
    let many = h
        .call_tool(&a(), "m__many_inputs", json!({"n": 17}))
        .await
        .expect_err("too many");
    assert!(matches!(many, CallError::InputRejected { .. }), "{many}");
    let malformed = h
        .call_tool(&a(), "m__empty_input_required", json!({}))
        .await
        .expect_err("malformed");
    assert!(
        matches!(malformed, CallError::Server(ServerError::Protocol { .. })),
        "{malformed}"
    );
    assert_eq!(seen.load(Ordering::SeqCst), 0);
    let rounds_counted = h.metrics().input_rounds;
    h.shutdown().await;
    let methods: Vec<Value> = audit_records(&audit)
        .iter()
        .filter(|r| r["event"] == "finished")
        .map(|r| r["rounds"][0]["methods"].clone())
        .collect();
    assert_eq!(
        methods,
        [
            json!(["elicitation/create"]),
            json!(["sampling/createMessage"]),
            json!(["roots/list"]),
            json!(["(17 input requests, unread)"]),
            json!(["(malformed round)"]),
        ],
        "each refused round is recorded"
    );
    assert_eq!(rounds_counted, 5);
    let _ = std::fs::remove_file(audit);
}

// A URL-mode elicitation whose URL no one should open (another scheme, credentials,
// plain HTTP to another host) never reaches a handler that declared the mode.
#[tokio::test]
async fn item_06_a_url_mode_elicitation_with_a_url_no_one_should_open_reaches_no_handler() {
    let (handler, seen) = counting(json!({"form": {}, "url": {}}));
    let h = start_ready_with(
        Harness::builder(config(vec![demo_server("m", &[])]))
            .input_handler("elicitation/create", handler),
    )
    .await;
    for bad in [
        "javascript:fetch('//x/'+document.cookie)",
        "file:///etc/passwd",
        "https://bank.example@evil.example/",
        "http://evil.example/sign-in",
    ] {
        let err = h
            .call_tool(
                &a(),
                "m__many_inputs",
                json!({"n": 1, "mode": "url", "url": bad}),
            )
            .await
            .expect_err(bad);
        assert!(
            matches!(err, CallError::InputRejected { .. }),
            "{bad}: {err}"
        );
    }
    assert_eq!(seen.load(Ordering::SeqCst), 0);
    // A web page is handed on.
    let _ = h
        .call_tool(&a(), "m__many_inputs", json!({"n": 1, "mode": "url"}))
        .await;
    assert_eq!(seen.load(Ordering::SeqCst), 1);
    h.shutdown().await;
}

#[tokio::test]
async fn item_06_fixed_answers_never_accept_a_url_mode_elicitation_on_their_own() {
    for (handler, expected) in [
        (
            FixedAnswers::new(json!({"action": "accept"}))
                .with_capability(json!({"form": {}, "url": {}})),
            None,
        ),
        (
            FixedAnswers::new(json!({"action": "accept"}))
                .with_capability(json!({"form": {}, "url": {}}))
                .accepting_url_mode(),
            Some("got 1 answers"),
        ),
    ] {
        let h = start_ready_with(
            Harness::builder(config(vec![demo_server("m", &[])]))
                .input_handler("elicitation/create", Arc::new(handler)),
        )
        .await;
        let r = h
            .call_tool(&a(), "m__many_inputs", json!({"n": 1, "mode": "url"}))
            .await;
        match expected {
            None => assert!(
                matches!(&r, Err(CallError::InputDeclined { action, .. }) if action == "decline"),
                "{r:?}"
            ),
            Some(t) => assert_eq!(text(&r.expect("accepted")), t),
        }
        h.shutdown().await;
    }
}

// 7. Audit that survives disk errors (a torn write cut back and written once: the unit
// test in audit/file.rs).
#[tokio::test]
async fn item_07_an_unwritable_audit_file_fails_new_calls_closed_or_counts_when_told_to_keep_serving()
 {
    for mode in [AuditFailure::FailClosed, AuditFailure::KeepServing] {
        let dir = scratch_dir().join(format!("full-{mode:?}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("audit.jsonl");
        std::os::unix::fs::symlink("/dev/full", &path).expect("symlink");
        let mut cfg = config(vec![demo_server("s", &[])]);
        cfg.audit = AuditConfig {
            path: Some(path),
            flush_every: Duration::from_millis(20),
            on_failure: mode,
            ..AuditConfig::default()
        };
        let h = start_ready(cfg).await;
        h.call_tool(&a(), "s__echo", json!({"text": "x"}))
            .await
            .expect("admitted before the first write failed");
        assert!(eventually(Duration::from_secs(5), || !h.audit_health().writable).await);
        let next = h.call_tool(&a(), "s__echo", json!({"text": "y"})).await;
        match mode {
            AuditFailure::FailClosed => assert!(
                matches!(&next, Err(CallError::AuditUnavailable(e)) if e.reason.contains("space")),
                "{next:?}"
            ),
            AuditFailure::KeepServing => {
                next.expect("keeps serving");
                assert!(
                    h.audit_health().backlog >= 2,
                    "records are kept, not dropped"
                );
            }
        }
        h.shutdown().await;
        let _ = std::fs::remove_dir_all(&dir);
    }
}

// An audit file that cannot even be opened (here a directory at the path) fails the
// trail from the start: `fail_closed` refuses the first call, not the calls after the
// first batch (which had run on their servers by then). Once the path can be opened,
// the trail heals on the writer's next try, within a second while it fails, however
// long `flush_every` is (an hour here: it refused calls that long after the fault).
#[tokio::test]
async fn item_07_an_audit_file_that_cannot_be_opened_refuses_the_first_call_when_failing_closed() {
    let dir = scratch_dir().join("unopenable");
    let _ = std::fs::remove_dir_all(&dir);
    let path = dir.join("audit.jsonl");
    std::fs::create_dir_all(&path).expect("a directory where the file should be");
    let mut cfg = config(vec![demo_server("s", &[])]);
    cfg.audit = AuditConfig {
        path: Some(path.clone()),
        flush_every: Duration::from_secs(3600),
        ..AuditConfig::default()
    };
    let h = start_ready(cfg).await;
    assert!(!h.audit_health().writable, "{:?}", h.audit_health());
    let first = h.call_tool(&a(), "s__echo", json!({"text": "x"})).await;
    assert!(
        matches!(&first, Err(CallError::AuditUnavailable(_))),
        "{first:?}"
    );
    std::fs::remove_dir(&path).expect("the directory goes");
    assert!(eventually(Duration::from_secs(10), || h.audit_health().writable).await);
    h.call_tool(&a(), "s__echo", json!({"text": "y"}))
        .await
        .expect("admitted once the file opens");
    h.shutdown().await;
    let records = std::fs::read_to_string(&path).expect("audit");
    assert_eq!(records.lines().count(), 2, "{records}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn item_07_an_audit_file_rotated_or_removed_is_started_again_at_its_path() {
    let dir = scratch_dir().join("rotated");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("audit.jsonl");
    let mut cfg = config(vec![demo_server("s", &[])]);
    cfg.audit = AuditConfig {
        path: Some(path.clone()),
        flush_every: Duration::from_millis(20),
        redaction: mcp_harness::audit::Redaction::Full,
        ..AuditConfig::default()
    };
    let h = start_ready(cfg).await;
    let texts = |p: &std::path::PathBuf| -> Vec<String> {
        audit_records(p)
            .iter()
            .filter(|r| r["event"] == "started")
            .filter_map(|r| r["arguments"]["text"].as_str().map(String::from))
            .collect()
    };
    h.call_tool(&a(), "s__echo", json!({"text": "one"}))
        .await
        .expect("call");
    assert!(eventually(Duration::from_secs(5), || texts(&path) == ["one"]).await);
    // logrotate's default: renamed away, and a new file is the rotator's to leave
    // or the writer's to make.
    let rotated = dir.join("audit.jsonl.1");
    std::fs::rename(&path, &rotated).expect("rotate");
    h.call_tool(&a(), "s__echo", json!({"text": "two"}))
        .await
        .expect("call");
    assert!(
        eventually(Duration::from_secs(5), || texts(&path) == ["two"]).await,
        "the records after the rotation are at the path: {:?}",
        texts(&path)
    );
    assert_eq!(texts(&rotated), ["one"]);
    // Removed: the same.
    std::fs::remove_file(&path).expect("remove");
    h.call_tool(&a(), "s__echo", json!({"text": "three"}))
        .await
        .expect("call");
    h.shutdown().await;
    assert_eq!(texts(&path), ["three"]);
    // A pipe nobody reads fails to open, at once (it blocked the writer, and with it
    // every record and the refusal of calls).
    let fifo = dir.join("fifo.jsonl");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    let mut cfg = config(vec![demo_server("s", &[])]);
    cfg.audit = AuditConfig {
        path: Some(fifo),
        flush_every: Duration::from_millis(20),
        ..AuditConfig::default()
    };
    let h = start_ready(cfg).await;
    let _ = h.call_tool(&a(), "s__echo", json!({"text": "x"})).await;
    assert!(eventually(Duration::from_secs(5), || !h.audit_health().writable).await);
    let next = h.call_tool(&a(), "s__echo", json!({"text": "y"})).await;
    assert!(
        matches!(next, Err(CallError::AuditUnavailable(_))),
        "{next:?}"
    );
    h.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

fn finished_of(records: &[Value]) -> Vec<&Value> {
    records
        .iter()
        .filter(|r| r["event"] == "finished")
        .collect()
}

// A caller's text that JSON leaves as it is but a line reader splits on (U+2028) or a
// terminal acts on (C1 controls, bidirectional overrides) is escaped in the audit
// file: no forged line for a reader that splits on it.
#[tokio::test]
async fn the_audit_file_escapes_what_readers_and_terminals_act_on() {
    let audit = temp_file("inert-audit");
    let mut cfg = config(vec![demo_server("s", &[])]);
    cfg.audit = AuditConfig {
        path: Some(audit.clone()),
        redaction: mcp_harness::audit::Redaction::Full,
        ..AuditConfig::default()
    };
    let h = start_ready(cfg).await;
    let forged = "x\u{2028}{\"event\":\"finished\"}\u{9b}31m\u{202e}";
    let _ = h.call_tool(&a(), &format!("s__{forged}"), json!({})).await;
    h.call_tool(&a(), "s__echo", json!({"text": forged}))
        .await
        .expect("call");
    h.shutdown().await;
    let text = std::fs::read_to_string(&audit).expect("audit file");
    for hidden in ['\u{2028}', '\u{9b}', '\u{202e}'] {
        assert!(!text.contains(hidden), "{hidden:?} in {text}");
    }
    assert!(text.contains("\\u2028"), "{text}");
    let records = audit_records(&audit);
    assert_eq!(records.len(), 4, "{records:?}");
    assert!(
        records.iter().any(|r| r["arguments"]["text"] == forged),
        "the same text to a JSON reader: {records:?}"
    );
    let _ = std::fs::remove_file(audit);
}

#[tokio::test]
async fn a_servers_words_in_an_error_reach_the_caller_and_the_audit_trail_cut() {
    let audit = temp_file("long-words-audit");
    let mut cfg = config(vec![demo_server("s", &[])]);
    cfg.audit = AuditConfig {
        path: Some(audit.clone()),
        ..AuditConfig::default()
    };
    let h = start_ready(cfg).await;
    let long = "t".repeat(100_000);
    let e = h
        .call_tool(&a(), "s__task_result", json!({"type": long}))
        .await
        .expect_err("an unknown resultType");
    let said = e.to_string();
    assert!(
        said.contains("tttt") && said.len() < 1000,
        "{} bytes",
        said.len()
    );
    h.shutdown().await;
    let records = audit_records(&audit);
    let finished = finished_of(&records);
    assert_eq!(finished.len(), 1, "{records:?}");
    let message = finished[0]["message"].as_str().expect("a message");
    assert!(message.chars().count() <= 1001, "{} bytes", message.len());
    let _ = std::fs::remove_file(audit);
}

#[tokio::test]
async fn item_07_a_call_waiting_on_a_person_at_shutdown_is_recorded_as_cancelled_before_it_returns()
{
    let audit = temp_file("shutdown-audit");
    let queue = ApprovalQueue::new(Duration::from_secs(600));
    let mut cfg = config(vec![demo_server("s", &[])]);
    cfg.audit = AuditConfig {
        path: Some(audit.clone()),
        ..AuditConfig::default()
    };
    let h = start_ready_with(
        Harness::builder(cfg).input_handler("elicitation/create", Arc::new(queue.clone())),
    )
    .await;
    let call = {
        let h = h.clone();
        tokio::spawn(async move { h.call_tool(&a(), "s__confirm", json!({})).await })
    };
    assert!(eventually(Duration::from_secs(10), || !queue.pending().is_empty()).await);
    h.shutdown().await;
    let records = audit_records(&audit);
    let finished = finished_of(&records);
    assert_eq!(finished.len(), 1, "{records:?}");
    assert_eq!(finished[0]["outcome"], "cancelled");
    assert!(
        queue.pending().is_empty(),
        "the pending input request was withdrawn"
    );
    assert!(call.await.expect("task").is_err());
}

#[tokio::test]
async fn item_07_a_call_in_flight_when_the_last_handle_drops_still_gets_its_finished_record() {
    let audit = temp_file("drop-audit");
    let queue = ApprovalQueue::new(Duration::from_secs(600));
    let mut cfg = config(vec![demo_server("s", &[])]);
    cfg.audit = AuditConfig {
        path: Some(audit.clone()),
        ..AuditConfig::default()
    };
    let h = start_ready_with(
        Harness::builder(cfg).input_handler("elicitation/create", Arc::new(queue.clone())),
    )
    .await;
    // The call's future holds no handle: dropping `h` drops the last one.
    let call = tokio::spawn(h.call_tool(&a(), "s__confirm", json!({})));
    assert!(eventually(Duration::from_secs(10), || !queue.pending().is_empty()).await);
    drop(h);
    assert!(
        call.await.expect("task").is_err(),
        "the call ends with the harness"
    );
    assert!(
        eventually(Duration::from_secs(10), || {
            let records = audit_records(&audit);
            finished_of(&records)
                .first()
                .is_some_and(|r| r["outcome"] == "cancelled")
        })
        .await,
        "{:?}",
        audit_records(&audit)
    );
}

// 8. Revocation takes effect during a call.
#[tokio::test]
async fn item_08_a_grant_revoked_while_a_call_waits_for_input_stops_its_next_round() {
    let queue = ApprovalQueue::new(Duration::from_secs(60));
    let h = start_ready_with(
        Harness::builder(config(vec![demo_server("s", &[])]))
            .input_handler("elicitation/create", Arc::new(queue.clone())),
    )
    .await;
    h.grant("b", "s", &["confirm"]).await.expect("grant");
    let call = {
        let h = h.clone();
        tokio::spawn(async move {
            h.call_tool(&Caller::agent("b"), "s__confirm", json!({}))
                .await
        })
    };
    assert!(eventually(Duration::from_secs(10), || !queue.pending().is_empty()).await);
    h.revoke("b", None).await.expect("revoke");
    let id = queue.pending()[0].id;
    queue.answer(
        id,
        json!({"action": "accept", "content": {"approved": true}}),
    );
    let r = call.await.expect("task");
    assert!(matches!(r, Err(CallError::Denied { .. })), "{r:?}");
    h.shutdown().await;
}

#[tokio::test]
async fn item_08_a_grant_revoked_before_a_failover_hop_stops_the_hop() {
    let record = temp_file("hop-first");
    let mut first = demo_server("first", &["--record", &record.to_string_lossy()]);
    first.priority = 10;
    first.trust_annotations = true;
    first.timeout = Duration::from_secs(1);
    let second = demo_server("second", &[]);
    let audit = temp_file("hop-audit");
    let mut cfg = config(vec![first, second]);
    cfg.audit = AuditConfig {
        path: Some(audit.clone()),
        flush_every: Duration::from_millis(20),
        ..AuditConfig::default()
    };
    let h = start_ready(cfg).await;
    h.grant("b", "*", &["slow"]).await.expect("grant");
    // Both lists cached: routing needs nothing of the frozen server.
    h.list_tools(&Caller::agent("b")).await.expect("list");
    assert!(
        eventually(Duration::from_secs(10), || h.cache_stats().l1.entries == 2).await,
        "both lists cached"
    );
    h.call_tool(&a(), "first__freeze", json!({"ms": 3000}))
        .await
        .expect("freeze");
    let call = {
        let h = h.clone();
        tokio::spawn(async move {
            h.call_tool(&Caller::agent("b"), "slow", json!({"ms": 1, "text": "x"}))
                .await
        })
    };
    // Sent to the frozen first (recorded on arrival) under the old grants.
    let slows = || calls_recorded(&record, "slow");
    assert!(
        eventually(Duration::from_secs(10), || slows() == 1).await,
        "slow reached first"
    );
    h.revoke("b", Some("*")).await.expect("revoke");
    h.grant("b", "first", &["slow"]).await.expect("first only");
    let r = call.await.expect("task");
    assert!(
        matches!(&r, Err(CallError::Denied { server: Some(s), .. }) if s == "second"),
        "{r:?}"
    );
    h.shutdown().await;
    // Recorded where it was denied, the first server's failure among its hops.
    let records = audit_records(&audit);
    let of_b = records
        .iter()
        .find(|r| r["event"] == "started" && r["agent"] == "b")
        .map(|r| r["call_id"].clone())
        .expect("b's call started");
    let finished: Vec<&Value> = records
        .iter()
        .filter(|r| r["event"] == "finished" && r["call_id"] == of_b)
        .collect();
    assert_eq!(finished.len(), 1, "{finished:?}");
    assert_eq!(finished[0]["server"], "second", "{}", finished[0]);
    assert_eq!(finished[0]["error"], "denied", "{}", finished[0]);
    assert_eq!(finished[0]["hops"][0]["server"], "first", "{}", finished[0]);
    let _ = std::fs::remove_file(record);
    let _ = std::fs::remove_file(audit);
}

// 9. Unambiguous names (ids: unit tests in server/config.rs).
#[tokio::test]
async fn item_09_a_hostile_tool_named_after_server_bank_cannot_catch_a_call_meant_for_bank() {
    let h = start_ready(config(vec![
        demo_server("evil", &["--tool-alias", "bank__transfer"]),
        demo_server("bank", &["--tool-alias", "transfer"]),
    ]))
    .await;
    let r = h
        .call_tool(&a(), "bank__transfer", json!({}))
        .await
        .expect("bank's transfer");
    assert_eq!(text(&r), "bank");
    let tools = h.list_tools(&a()).await.expect("list");
    assert!(
        tools
            .iter()
            .any(|t| &*t.qualified == "evil__bank__transfer")
    );
    let r = h
        .call_tool(&a(), "evil__bank__transfer", json!({}))
        .await
        .expect("evil's, by its full name");
    assert_eq!(text(&r), "evil");
    h.shutdown().await;
}

// 10. Routing does not touch servers the caller may not use.
#[tokio::test]
async fn item_10_bare_names_are_looked_up_only_on_servers_the_caller_has_a_grant_on() {
    let (ra, rb) = (temp_file("route-a"), temp_file("route-b"));
    let mut cfg = config(vec![
        demo_server("a", &["--record", &ra.to_string_lossy()]),
        demo_server("b", &["--record", &rb.to_string_lossy()]),
    ]);
    cfg.permissions.insert(
        "x".into(),
        [("a".to_string(), vec!["echo".to_string()])].into(),
    );
    let h = start_ready(cfg).await;
    let lists = |p: &std::path::PathBuf| {
        recorded(p)
            .iter()
            .filter(|r| r["method"] == "tools/list")
            .count()
    };
    let err = h
        .call_tool(&Caller::agent("nobody"), "unknown", json!({}))
        .await
        .expect_err("nothing granted");
    assert!(
        matches!(err, CallError::Denied { server: None, .. }),
        "{err}"
    );
    assert_eq!((lists(&ra), lists(&rb)), (0, 0), "no server was asked");
    let err = h
        .call_tool(&Caller::agent("x"), "add", json!({"a": 1, "b": 2}))
        .await
        .expect_err("add is not granted");
    assert!(
        matches!(&err, CallError::Denied { server: None, .. }),
        "the denial names no server: {err}"
    );
    assert_eq!(lists(&rb), 0, "b, which x may not use, was never listed");
    h.shutdown().await;
}

// 11. Streams (retry floor and a linear SSE parser: unit tests in transport/http/sse.rs).
#[tokio::test]
async fn item_11_learning_mcp_param_annotations_stays_within_the_requests_one_deadline() {
    let server =
        HttpServer::demo(&["slowlist", "--page-size", "1", "--list-delay-ms", "200"]).await;
    let mut web = ServerConfig::http("web", &server.url);
    web.timeout = Duration::from_secs(1);
    let h = start_ready(config(vec![web])).await;
    let started = Instant::now();
    let r = h
        .call_tool(&a(), "web__region_echo", json!({"region": "eu"}))
        .await;
    assert!(r.is_err(), "the ~100 pages cannot be read in 1 s");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "one deadline for it all: {:?}",
        started.elapsed()
    );
    h.shutdown().await;
}

// 12. Tool-change hashes per cache scope (keyed audit hashes, redaction and terminal
// text: unit tests in audit/ and the binary; the minimal environment: tests/cli.rs).
#[tokio::test]
async fn item_12_private_lists_of_two_auth_contexts_fire_no_false_tools_changed() {
    let h = start_ready(config(vec![demo_server(
        "alt",
        &["--alternate-tools", "--cache-scope", "private"],
    )]))
    .await;
    let mut events = h.subscribe();
    let one = Caller::agent("a").with_auth_context("user-1");
    let two = Caller::agent("a").with_auth_context("user-2");
    let l1 = h.list_tools(&one).await.expect("list 1");
    let l2 = h.list_tools(&two).await.expect("list 2");
    assert_ne!(l1.len(), l2.len(), "the two contexts see different lists");
    h.list_tools(&one).await.expect("list 1 again");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        matches!(
            events.try_recv(),
            Err(tokio::sync::broadcast::error::TryRecvError::Empty)
        ),
        "no ToolsChanged: each context's list is compared with its own"
    );
    h.shutdown().await;
}

// 15. Capabilities before the handshake.
#[tokio::test]
async fn item_15_handlers_given_at_start_reach_a_legacy_server_at_initialize() {
    let leg = || demo_server("leg", &["--era", "legacy", "--tools-need-elicitation"]);
    let without = start_ready(config(vec![leg()])).await;
    let names: Vec<String> = without
        .list_tools(&a())
        .await
        .expect("list")
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert!(!names.contains(&"confirm".to_string()));
    without.shutdown().await;
    let with = start_ready_with(Harness::builder(config(vec![leg()])).input_handler(
        "elicitation/create",
        Arc::new(FixedAnswers::new(
            json!({"action": "accept", "content": {"approved": true}}),
        )),
    ))
    .await;
    let r = with
        .call_tool(&a(), "confirm", json!({}))
        .await
        .expect("listed and callable");
    assert_eq!(text(&r), "approved: true");
    with.shutdown().await;
}

#[tokio::test]
async fn item_15_a_handler_registered_later_reconnects_legacy_servers_without_failing_a_call() {
    let record = temp_file("reconnect-leg");
    let rec = record.to_string_lossy().to_string();
    let h = start_ready(config(vec![demo_server(
        "leg",
        &[
            "--era",
            "legacy",
            "--tools-need-elicitation",
            "--record",
            &rec,
        ],
    )]))
    .await;
    let pid = h.server_status("leg").and_then(|s| s.pid);
    assert!(
        h.list_tools(&a())
            .await
            .expect("list")
            .iter()
            .all(|t| &*t.name != "confirm")
    );
    let slow = {
        let h = h.clone();
        tokio::spawn(async move {
            h.call_tool(&a(), "leg__slow", json!({"ms": 1000, "text": "in flight"}))
                .await
        })
    };
    // In flight on the old connection before the handler makes a new one.
    let slows = || calls_recorded(&record, "slow");
    assert!(
        eventually(Duration::from_secs(10), || slows() == 1).await,
        "slow reached the legacy server"
    );
    h.register_input_handler(
        "elicitation/create",
        Arc::new(FixedAnswers::new(
            json!({"action": "accept", "content": {"approved": true}}),
        )),
    )
    .await
    .expect("register");
    assert_eq!(
        text(&slow.await.expect("task").expect("the call in flight")),
        "in flight"
    );
    assert!(
        eventually(Duration::from_secs(10), || h
            .server_status("leg")
            .is_some_and(|s| s.pid != pid && s.state == ServerState::Ready))
        .await,
        "a new connection"
    );
    let tools = h.list_tools(&a()).await.expect("list");
    assert!(
        tools.iter().any(|t| &*t.name == "confirm"),
        "the server now lists it"
    );
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
}

// A server's reply in a type no client reads: the error names the type, cut short (it
// reaches logs, statuses and callers).
#[tokio::test]
async fn item_02_a_reply_of_an_unexpected_content_type_is_named_cut_short() {
    let odd = format!("text/x-{}", "a".repeat(50_000));
    let web = HttpServer::demo(&["odd", "--content-type-all", &odd]).await;
    let spec = ServerConfig::http("odd", &web.url).transport;
    let Err(err) = Connection::connect("odd", spec, options()).await else {
        panic!("no client reads that type");
    };
    let said = err.to_string();
    assert!(said.contains("text/x-aaaa"), "{said}");
    assert!(said.len() < 1000, "{} bytes", said.len());
}

/// The demo server `slow` (with `args`), a second slow to start.
fn slow_demo(args: &str) -> TransportSpec {
    let line = format!("sleep 1; exec {} demo-server slow {args}", harness_exe());
    TransportSpec::stdio("sh", ["-c".to_string(), line])
}

// A modern server slower to start than the probe waits is taken for a legacy one, and
// refuses `initialize` as a modern server does: probed again, it connects as modern
// (`auto`); a configured-modern server's silent probe fails its start, which heals (a
// restart probes afresh). Before, both marked the server failed for good after one
// slow start.
#[tokio::test]
async fn a_modern_server_slower_than_the_probe_fails_its_start_healably() {
    use mcp_harness::transport::EraPreference;
    let slow = || slow_demo("");
    let quick_probe = |era| ConnectOptions {
        probe_timeout: Duration::from_millis(200),
        era,
        ..options()
    };
    let (conn, _events) = Connection::connect("slow", slow(), quick_probe(EraPreference::Auto))
        .await
        .expect("probed again once it refused initialize");
    assert_eq!(conn.era(), Era::Modern);
    conn.shutdown().await;
    let Err(err) = Connection::connect("slow", slow(), quick_probe(EraPreference::Modern)).await
    else {
        panic!("the probe cannot have been answered in time");
    };
    assert!(!err.cannot_heal(), "{err}");
    // Given the time, it is modern.
    let (conn, _events) = Connection::connect("slow", slow(), options())
        .await
        .expect("connects");
    assert_eq!(conn.era(), Era::Modern);
    conn.shutdown().await;
}

// A legacy server slower to start than the probe waits, which then reads the probe and
// exits (it takes nothing before `initialize`), is respawned for the handshake, as one
// that exits on the probe at once is. Before, the `initialize` behind the probe found
// it gone and the start failed, every time while its start stayed slow.
#[tokio::test]
async fn a_slow_legacy_server_that_exits_on_the_probe_is_respawned_for_the_handshake() {
    let slow = slow_demo("--era legacy --on-discover exit");
    let quick_probe = ConnectOptions {
        probe_timeout: Duration::from_millis(200),
        ..options()
    };
    let (conn, _events) = Connection::connect("slow", slow, quick_probe)
        .await
        .expect("connects, respawned");
    assert_eq!(conn.era(), Era::Legacy);
    conn.shutdown().await;
}

// 16. Renegotiation quirks.
#[tokio::test]
async fn item_16_a_first_request_refused_with_its_own_version_is_retried_once() {
    let (conn, _events) = Connection::connect(
        "quirky",
        demo_stdio(&["quirky", "--reject-first-request"]),
        options(),
    )
    .await
    .expect("connects: the -32022 named the version sent, so one retry");
    assert_eq!(conn.era(), Era::Modern);
    conn.shutdown().await;
}

// 17. Startup failures are immediate and named (the CLI: tests/cli.rs; TLS: tests/tls.rs).
#[tokio::test]
async fn item_17_a_missing_command_or_a_401_fails_the_server_at_once_with_its_cause() {
    let web = HttpServer::demo(&["locked", "--status-all", "401"]).await;
    let h = Harness::spawn(config(vec![
        ServerConfig::stdio("ghost", "/nonexistent/mcp-server", Vec::<String>::new()),
        ServerConfig::http("locked", &web.url),
        demo_server("fine", &[]),
    ]))
    .await
    .expect("spawn");
    for (id, cause) in [("ghost", "could not start"), ("locked", "HTTP 401")] {
        assert!(
            eventually(Duration::from_secs(5), || h
                .server_status(id)
                .is_some_and(|s| s.state == ServerState::Failed))
            .await,
            "{id} failed at once"
        );
        let s = h.server_status(id).expect("status");
        assert_eq!(s.restarts, 0, "{id}: no backoff loop");
        assert!(
            s.last_error.as_deref().is_some_and(|e| e.contains(cause)),
            "{id}: {:?}",
            s.last_error
        );
    }
    let err = h
        .call_tool(&a(), "ghost__echo", json!({}))
        .await
        .expect_err("failed");
    assert!(
        matches!(err, CallError::Server(ServerError::Failed { .. })),
        "{err}"
    );
    h.shutdown().await;
}

/// The pid of this process's child that runs `sleep marker`, once it is there.
async fn sleeping(marker: &str) -> u32 {
    let ours = || {
        own_children().into_iter().find(|pid| {
            alive(*pid)
                && std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| c.split(|b| *b == 0).any(|arg| arg == marker.as_bytes()))
        })
    };
    let mut pid = None;
    assert!(
        eventually(Duration::from_secs(10), || {
            pid = ours();
            pid.is_some()
        })
        .await,
        "the server was spawned"
    );
    pid.expect("pid")
}

#[tokio::test]
async fn a_server_stuck_in_its_handshake_does_not_hold_up_shutdown_and_leaves_no_process() {
    // A server that reads nothing and says nothing: its first request would wait out the
    // probe's 10 s, and shutdown used to wait with it.
    let marker = "4711.25"; // `sleep`'s argument, to find this test's process
    let config = HarnessConfig {
        servers: vec![ServerConfig::stdio("mute", "sleep", [marker])],
        ..HarnessConfig::default()
    };
    let h = Harness::spawn(config).await.expect("spawn");
    let pid = sleeping(marker).await;
    assert_eq!(
        h.server_status("mute").map(|s| s.state),
        Some(ServerState::Starting)
    );
    let started = Instant::now();
    h.shutdown().await;
    // Not a speed figure: the bound only tells "gave up the handshake" from "waited for
    // the probe to time out".
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "shutdown waited {:?} for a handshake",
        started.elapsed()
    );
    assert!(
        eventually(Duration::from_secs(5), || !alive(pid)).await,
        "the server's process is gone"
    );
}

#[tokio::test]
async fn a_restart_gives_up_a_handshake_under_way_and_its_process() {
    // The old attempt's process used to live on beside the new one until its probe
    // timed out (10 s).
    let marker = "4711.5";
    let config = HarnessConfig {
        servers: vec![ServerConfig::stdio("mute", "sleep", [marker])],
        ..HarnessConfig::default()
    };
    let h = Harness::spawn(config).await.expect("spawn");
    let first = sleeping(marker).await;
    h.restart_server("mute").await.expect("restart");
    assert!(
        eventually(Duration::from_secs(5), || !alive(first)).await,
        "the first attempt's process is gone"
    );
    let second = sleeping(marker).await;
    assert_ne!(first, second, "a new attempt runs");
    h.shutdown().await;
    assert!(eventually(Duration::from_secs(5), || !alive(second)).await);
}

#[tokio::test]
async fn a_server_that_pages_forever_just_in_time_does_not_hold_a_listing_or_a_call_past_the_deadline()
 {
    // Every page small, slow, and with a new cursor: the page, byte and cycle bounds never
    // trip, and each page comes within its own timeout. 1,000 pages of 100 ms used to
    // hold every listing, and every call by bare name, for 100 s.
    let mut c = config(vec![
        demo_server("slow", &["--huge-pages", "0", "--list-delay-ms", "100"]),
        demo_server("fine", &[]),
    ]);
    c.call_timeout = Duration::from_secs(2);
    let h = start_ready(c).await;
    let started = Instant::now();
    let listing = h
        .listing(&a(), mcp_harness::CallKind::Tool, None)
        .await
        .expect("listing");
    // Not a speed figure: 2 s of deadline against the 100 s the walk would take.
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert!(listing.items.iter().any(|t| &*t.server == "fine"));
    let (slow, error) = listing
        .unreachable
        .iter()
        .find(|(u, _)| u.server == "slow")
        .expect("the slow server is reported");
    assert!(
        matches!(
            error,
            Some(CallError::Server(ServerError::Transport {
                source: mcp_harness::transport::TransportError::Timeout(_),
                ..
            }))
        ),
        "{slow:?}: {error:?}"
    );
    // A call by bare name waits on the same listing: it ends by its deadline too.
    let started = Instant::now();
    let _ = h.call_tool(&a(), "echo", json!({"text": "x"})).await;
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    h.shutdown().await;
}

// A list whose pages disagree on their scope (a private first page, then pages called
// public) is not kept: a page called public would be served to every auth context by
// its cursor. Each listing reads it from the server again.
#[tokio::test]
async fn a_list_whose_pages_disagree_on_their_scope_is_not_cached() {
    let record = temp_file("scopes");
    let rec = record.to_string_lossy().to_string();
    let h = start_ready(config(vec![demo_server(
        "mixed",
        &[
            "--extra-tools",
            "30",
            "--page-size",
            "20",
            "--page-scopes",
            "private,public",
            "--record",
            &rec,
        ],
    )]))
    .await;
    let alice = a().with_auth_context("alice");
    let lists = || {
        recorded(&record)
            .iter()
            .filter(|r| r["method"] == "tools/list")
            .count()
    };
    let first = h.list_tools(&alice).await.expect("list");
    assert!(first.len() > 40, "several pages");
    let fetched = lists();
    let again = h.list_tools(&alice).await.expect("list");
    assert_eq!(again.len(), first.len());
    assert!(again.iter().all(|t| !t.from_cache), "not from the cache");
    assert!(lists() > fetched, "read from the server again");
    h.shutdown().await;
}

// A call in flight has no final record yet: the audit health says so, and the command
// line counts such calls, left running by a shutdown that gave up on them, with the
// records not written.
#[tokio::test]
async fn a_call_in_flight_is_unfinished_in_the_audit_health() {
    let audit = temp_file("unfinished-audit");
    let h = start_ready(HarnessConfig {
        servers: vec![demo_server("s", &[])],
        permissions: grant_everything(&["a"]),
        audit: AuditConfig {
            path: Some(audit.clone()),
            ..AuditConfig::default()
        },
        ..HarnessConfig::default()
    })
    .await;
    assert_eq!(h.audit_health().unfinished, 0);
    let call = {
        let h = h.clone();
        tokio::spawn(async move {
            h.call_tool(&a(), "s__slow", json!({"text": "t", "ms": 1500}))
                .await
        })
    };
    assert!(
        eventually(Duration::from_secs(10), || h.audit_health().unfinished == 1).await,
        "{:?}",
        h.audit_health()
    );
    call.await.expect("task").expect("call");
    assert_eq!(h.audit_health().unfinished, 0);
    let health = h.shutdown().await;
    assert_eq!(health.unfinished, 0, "{health:?}");
    let _ = std::fs::remove_file(&audit);
    // Without a trail there is no record to miss: a call in flight is not counted.
    let h = start_ready(HarnessConfig {
        servers: vec![demo_server("s", &[])],
        permissions: grant_everything(&["a"]),
        ..HarnessConfig::default()
    })
    .await;
    let call = {
        let h = h.clone();
        tokio::spawn(async move {
            h.call_tool(&a(), "s__slow", json!({"text": "t", "ms": 1500}))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(h.audit_health().unfinished, 0);
    call.await.expect("task").expect("call");
    h.shutdown().await;
}
