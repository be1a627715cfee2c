//! The chaos soak: agents make calls (MRTR ones included) across servers of both
//! transports and both eras while a seeded fault injector SIGKILLs server processes,
//! kills server actors, freezes servers, slows them, makes them write garbage, and
//! removes and re-adds them. Then it checks: no call hung, every call has exactly one
//! `started` and one `finished` audit record, no server process survives, file
//! descriptors and memory came back, and every server serves again.
//!
//! Short by default (CI). The long run: `MCP_HARNESS_SOAK=long cargo test --release
//! --test chaos -- --nocapture` (100,000 calls, at least 1,000 faults). The seed:
//! `MCP_HARNESS_SOAK_SEED=N` replays a run's fault schedule.

mod support;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcp_harness::audit::AuditConfig;
use mcp_harness::{
    Caller, FixedAnswers, Harness, HarnessConfig, HarnessHandle, RestartConfig, ServerConfig,
    ServerState,
};
use parking_lot::Mutex;
use serde_json::json;
use support::*;

/// xorshift64*: a seeded, dependency-free generator for the fault schedule.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

fn rss_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn stdio_server(id: &str, priority: i32, extra: &[&str]) -> ServerConfig {
    let mut args = vec!["demo-server".to_string(), id.to_string()];
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut c = ServerConfig::stdio(id, harness_exe(), args);
    c.priority = priority;
    c.timeout = Duration::from_secs(2);
    c.restart.max_restarts = 100_000;
    c.restart = RestartConfig {
        min_delay: Duration::from_millis(20),
        max_delay: Duration::from_millis(300),
        ..RestartConfig::default()
    };
    c
}

#[derive(Default)]
struct Tally {
    latencies_us: Vec<u64>,
    outcomes: BTreeMap<String, u64>,
    hangs: u64,
}

#[test]
fn chaos_soak() {
    let long = std::env::var("MCP_HARNESS_SOAK").as_deref() == Ok("long");
    let seed = std::env::var("MCP_HARNESS_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        });
    let (agents, calls_per_agent, fault_gap_ms) = if long {
        (8u64, 12_500u64, 20u64)
    } else {
        (4, 1_500, 60)
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(soak(seed, agents, calls_per_agent, fault_gap_ms, long));
}

async fn soak(seed: u64, agents: u64, calls_per_agent: u64, fault_gap_ms: u64, long: bool) {
    let http = HttpServer::demo(&["h1"]).await;
    let (fd_base, rss_base) = (fds(), rss_kb());
    let audit = temp_file("chaos-audit");
    let mut m1 = stdio_server("m1", 3, &[]);
    m1.trust_annotations = true;
    let servers = vec![
        m1,
        stdio_server("m2", 2, &[]),
        stdio_server("l1", 1, &["--era", "legacy"]),
        {
            let mut h = ServerConfig::http("h1", &http.url);
            h.timeout = Duration::from_secs(2);
            h.restart.max_restarts = 100_000;
            h.restart = RestartConfig {
                min_delay: Duration::from_millis(20),
                max_delay: Duration::from_millis(300),
                ..RestartConfig::default()
            };
            h
        },
    ];
    let mut config = HarnessConfig {
        servers: servers.clone(),
        ..HarnessConfig::default()
    };
    config
        .permissions
        .entry("agent".into())
        .or_default()
        .insert("*".into(), vec!["*".into()]);
    config.audit = AuditConfig {
        path: Some(audit.clone()),
        batch: 256,
        ..AuditConfig::default()
    };
    let h = Harness::spawn(config).await.expect("spawn");
    let answers = FixedAnswers::from_fn(
        |r| json!({"action": "accept", "content": {"approved": true, "answer": r.key}}),
    );
    h.register_input_handler("elicitation/create", Arc::new(answers))
        .await
        .expect("handler");
    for s in &servers {
        assert!(
            eventually(Duration::from_secs(30), || h
                .server_status(&s.id)
                .is_some_and(|x| x.state == ServerState::Ready))
            .await
        );
    }
    let pids = Arc::new(Mutex::new(HashSet::<u32>::new()));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let started = Instant::now();

    let mut workers = Vec::new();
    for agent in 0..agents {
        let (h, tally) = (h.clone(), tally.clone());
        let mut rng = Rng(seed ^ (agent + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        workers.push(tokio::spawn(async move {
            let caller = Caller::agent("agent").with_auth_context(format!("ctx-{}", agent % 2));
            for _ in 0..calls_per_agent {
                let (tool, args) = match rng.below(100) {
                    0..=54 => ("echo".to_string(), json!({"text": "hi"})),
                    55..=69 => (
                        ["m1__echo", "m2__echo", "l1__echo", "h1__echo"][rng.below(4) as usize]
                            .to_string(),
                        json!({"text": "q"}),
                    ),
                    70..=79 => ("rounds".to_string(), json!({"n": 2})),
                    80..=94 => ("server_name".to_string(), json!({})),
                    _ => ("slow".to_string(), json!({"ms": 5 + rng.below(40)})),
                };
                let t = Instant::now();
                let outcome = tokio::time::timeout(
                    Duration::from_secs(60),
                    h.call_tool(&caller, &tool, args),
                )
                .await;
                let mut tally = tally.lock();
                tally.latencies_us.push(t.elapsed().as_micros() as u64);
                let kind = match outcome {
                    Err(_) => {
                        tally.hangs += 1;
                        "HANG".to_string()
                    }
                    Ok(Ok(_)) => "ok".to_string(),
                    Ok(Err(e)) => e.code().to_string(),
                };
                *tally.outcomes.entry(kind).or_default() += 1;
            }
        }));
    }

    // The fault injector.
    let mut rng = Rng(seed);
    let mut faults: BTreeMap<&str, u64> = BTreeMap::new();
    let stdio_ids = ["m1", "m2", "l1"];
    let all_ids = ["m1", "m2", "l1", "h1"];
    while workers.iter().any(|w| !w.is_finished()) {
        tokio::time::sleep(Duration::from_millis(
            fault_gap_ms / 2 + rng.below(fault_gap_ms),
        ))
        .await;
        for s in h.status() {
            if let Some(p) = s.pid {
                pids.lock().insert(p);
            }
        }
        let target = stdio_ids[rng.below(3) as usize];
        let any = all_ids[rng.below(4) as usize];
        let kind = match rng.below(100) {
            0..=29 => {
                if let Some(pid) = h.server_status(target).and_then(|s| s.pid) {
                    sigkill(pid);
                }
                "sigkill"
            }
            30..=44 => {
                if let Some(actor) = h.server_actor(target) {
                    actor.kill();
                }
                "actor_kill"
            }
            45..=59 => {
                let ms = 100 + rng.below(700);
                background(&h, any, "freeze", json!({"ms": ms}));
                "freeze"
            }
            60..=69 => {
                background(&h, any, "slow", json!({"ms": 300 + rng.below(700)}));
                "slow"
            }
            70..=79 => {
                background(&h, target, "garbage", json!({}));
                "garbage"
            }
            80..=89 => {
                let config = servers
                    .iter()
                    .find(|s| s.id == target)
                    .cloned()
                    .expect("config");
                let _ = h.remove_server(target).await;
                let _ = h.add_server(config).await;
                "remove_readd"
            }
            _ => {
                let _ = h.restart_server(any).await;
                "restart"
            }
        };
        *faults.entry(kind).or_default() += 1;
    }
    for w in workers {
        w.await.expect("agent");
    }
    let calls_made = agents * calls_per_agent;
    let soak_time = started.elapsed();

    // After the faults: every server ready again (or failed with a reason), and serving.
    for s in &servers {
        let settled = eventually(Duration::from_secs(30), || {
            h.server_status(&s.id).is_some_and(|x| {
                x.state == ServerState::Ready
                    || (x.state == ServerState::Failed && x.last_error.is_some())
            })
        })
        .await;
        assert!(settled, "{} settles: {:?}", s.id, h.server_status(&s.id));
    }
    let check = Caller::agent("agent");
    let mut check_calls = 0;
    for s in &servers {
        if h.server_status(&s.id)
            .is_some_and(|x| x.state == ServerState::Ready)
        {
            let mut result = h
                .call_tool(&check, &format!("{}__echo", s.id), json!({"text": "after"}))
                .await;
            check_calls += 1;
            // A freeze scheduled at the very end may still be running.
            if result.is_err() {
                tokio::time::sleep(Duration::from_millis(1000)).await;
                result = h
                    .call_tool(&check, &format!("{}__echo", s.id), json!({"text": "after"}))
                    .await;
                check_calls += 1;
            }
            assert_eq!(
                text(&result.expect("serves after the faults")),
                "after",
                "{}",
                s.id
            );
        }
    }
    for s in h.status() {
        if let Some(p) = s.pid {
            pids.lock().insert(p);
        }
    }
    let status = h.status();
    let restarts: u32 = status.iter().map(|s| s.restarts).sum();
    let rebuilds: u32 = status.iter().map(|s| s.actor_rebuilds).sum();
    h.shutdown().await;
    drop(h);
    drop(http);

    // Zero leaks.
    let pids: Vec<u32> = pids.lock().iter().copied().collect();
    for p in &pids {
        assert!(
            eventually(Duration::from_secs(10), || group_members(*p).is_empty()).await,
            "process group {p} survived"
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (fd_after, rss_after) = (fds(), rss_kb());
    assert!(
        fd_after <= fd_base + 4,
        "file descriptors: {fd_base} before, {fd_after} after"
    );

    // Zero lost audit records.
    let records = recorded(&audit);
    let count = |event: &str| records.iter().filter(|r| r["event"] == event).count() as u64;
    let total = calls_made + check_calls;
    assert_eq!(
        (count("started"), count("finished")),
        (total, total),
        "one started and one finished record per call"
    );
    let mut started_ids: Vec<u64> = records
        .iter()
        .filter(|r| r["event"] == "started")
        .filter_map(|r| r["call_id"].as_u64())
        .collect();
    let mut finished_ids: Vec<u64> = records
        .iter()
        .filter(|r| r["event"] == "finished")
        .filter_map(|r| r["call_id"].as_u64())
        .collect();
    started_ids.sort_unstable();
    finished_ids.sort_unstable();
    assert_eq!(started_ids, finished_ids);
    // A call that never reached a server was offered to every other candidate before it
    // failed: never-sent errors end a call only once no server is left to try.
    let never_sent = [
        "server_failed",
        "server_stopped",
        "overloaded",
        "restarting",
    ];
    for r in records.iter().filter(|r| r["event"] == "finished") {
        if r["error"].as_str().is_some_and(|e| never_sent.contains(&e)) {
            let tried = r["hops"].as_array().map_or(0, Vec::len) + 1;
            assert_eq!(
                Some(tried as u64),
                r["candidates"].as_u64(),
                "a never-sent call skipped a candidate: {r}"
            );
        }
    }
    let failovers = records
        .iter()
        .filter(|r| {
            r["event"] == "finished"
                && r["outcome"] == "ok"
                && r["hops"].as_array().is_some_and(|h| !h.is_empty())
        })
        .count();
    let _ = std::fs::remove_file(&audit);

    let tally = tally.lock();
    assert_eq!(tally.hangs, 0, "no call may hang");
    let mut lat = tally.latencies_us.clone();
    lat.sort_unstable();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or(0)
    };
    let fault_total: u64 = faults.values().sum();
    println!(
        "SOAK mode={} seed={seed} calls={total} ok={} errors={:?} faults={fault_total} {:?} restarts={restarts} actor_rebuilds={rebuilds} failovers_served={failovers} p50={}us p99={}us hangs=0 lost_audit=0 leaked_processes=0 fd_delta={} rss_delta_kb={} elapsed={:.1}s",
        if long { "long" } else { "short" },
        tally.outcomes.get("ok").copied().unwrap_or(0),
        tally
            .outcomes
            .iter()
            .filter(|(k, _)| *k != "ok")
            .collect::<BTreeMap<_, _>>(),
        faults,
        pct(0.5),
        pct(0.99),
        fd_after as i64 - fd_base as i64,
        rss_after as i64 - rss_base as i64,
        soak_time.as_secs_f64()
    );
    if long {
        assert!(
            total >= 100_000 && fault_total >= 1_000,
            "the long soak is at least 100,000 calls and 1,000 faults"
        );
    }
    // Memory: the harness is gone; what stays is the allocator's slack, bounded.
    assert!(
        rss_after <= rss_base + 200 * 1024,
        "resident memory grew from {rss_base} kB to {rss_after} kB"
    );
}

/// A raw request in the background (a fault: it freezes, slows or garbles a server).
fn background(h: &HarnessHandle, server: &str, tool: &str, args: serde_json::Value) {
    let (h, server, tool) = (h.clone(), server.to_string(), tool.to_string());
    tokio::spawn(async move {
        let params = json!({"name": tool, "arguments": args});
        let _ = h
            .request_with_timeout(
                &server,
                "tools/call",
                Some(params),
                Some(Duration::from_secs(2)),
            )
            .await;
    });
}
