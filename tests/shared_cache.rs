//! The shared cache layer (L3) against a real Redis server started by each test on a
//! free loopback port: lists shared between processes, only public ones of allow-listed
//! servers, invalidation heard across processes, and Redis down, killed, restarted or
//! full of garbage never failing a call.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcp_harness::registry::cache::shared::SharedConfig;
use mcp_harness::{Caller, HarnessConfig, HarnessHandle, ServerConfig};
use serde_json::{Value, json};
use support::*;

fn a() -> Caller {
    Caller::agent("a")
}

fn count(record: &Path, method: &str) -> usize {
    recorded(&record.to_path_buf())
        .iter()
        .filter(|r| r["method"] == method)
        .count()
}

/// The shared layer for tests: a generous command bound, so a loaded machine does not
/// count a slow answer as Redis being down (the bound itself is not what is tested).
fn shared(url: String, servers: &[&str]) -> SharedConfig {
    SharedConfig {
        timeout: Duration::from_secs(1),
        ..SharedConfig::new(url, servers.iter().map(|s| s.to_string()).collect())
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

/// A shared secret in a file of its own (mode `mode`), for `cache.shared.key_file`.
fn key_file(tag: &str, secret: &str, mode: u32) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = temp_file(tag).with_extension("key");
    std::fs::write(&path, format!("{secret}\n")).expect("write key");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    path
}

/// What another process does to `server`'s shared lists when they change: its
/// generation moves on.
async fn move_generation(redis: &Redis, server: &str) {
    let mut c = redis.connection().await.expect("connect");
    let _: u64 = redis::cmd("INCR")
        .arg(format!("mcp-harness:gen:{server}"))
        .query_async(&mut c)
        .await
        .expect("INCR");
}

/// Page `n` of a `tools/list` of `server`, padded with `pad` bytes, fresh for a minute.
fn page(server: &str, n: usize, pad: usize) -> mcp_harness::registry::cache::Page {
    let value = json!({"tools": [], "nextCursor": format!("c{n}"), "pad": "x".repeat(pad)});
    mcp_harness::registry::cache::Page {
        key: mcp_harness::registry::cache::CacheKey {
            server: server.into(),
            fingerprint: "f".into(),
            client: String::new(),
            method: "tools/list".into(),
            param: (n > 0).then(|| format!("c{}", n - 1)),
            scope: "public".into(),
        },
        ttl: Duration::from_secs(60),
        received_unix_ms: unix_ms(),
        bytes: value.to_string().len(),
        value: Arc::new(value),
        version: None,
    }
}

/// A first process: lists once under `config` (its pages go to Redis), and ends.
async fn lists_once(config: HarnessConfig) {
    let first = start_ready(config).await;
    first.list_tools(&a()).await.expect("list");
    first.shutdown().await;
}

/// `CONFIG SET key value` on the test's Redis.
async fn config_set(c: &mut redis::aio::MultiplexedConnection, key: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(key)
        .arg(value)
        .query_async(c)
        .await
        .unwrap_or_else(|e| panic!("CONFIG SET {key}: {e}"));
}

/// The keys of the pages Redis holds.
async fn page_keys(redis: &Redis) -> Vec<String> {
    let keys = redis.keys().await;
    keys.into_iter().filter(|k| k.contains(":list:")).collect()
}

fn config(servers: Vec<ServerConfig>, shared: SharedConfig) -> HarnessConfig {
    let mut c = HarnessConfig {
        servers,
        permissions: grant_everything(&["a", "local"]),
        ..HarnessConfig::default()
    };
    c.cache.shared = Some(shared);
    c
}

/// A TOML config for the CLI: one stdio demo server recording to `record`, shared.
fn cli_config(tag: &str, record: &Path, redis: &str) -> PathBuf {
    let path = temp_file(tag).with_extension("toml");
    let toml = format!(
        "[[servers]]\nid = \"pub\"\ntransport = {{ type = \"stdio\", command = {:?}, args = [\"demo-server\", \"pub\", \"--record\", {:?}] }}\n[cache.shared]\nurl = {redis:?}\nservers = [\"pub\"]\ntimeout = \"1s\"\n[permissions.local]\n\"*\" = [\"*\"]\n",
        harness_exe(),
        record.to_string_lossy(),
    );
    std::fs::write(&path, toml).expect("write config");
    path
}

fn cli_tools(config: &Path) -> Vec<Value> {
    let out = std::process::Command::new(harness_exe())
        .args(["tools", "--json", "--config"])
        .arg(config)
        .output()
        .expect("run mcp-harness tools");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON tool list")
}

#[tokio::test]
async fn a_second_process_with_an_empty_disk_serves_the_first_ones_public_lists_without_asking() {
    let redis = Redis::start().await;
    let record = temp_file("l3-cold");
    let config = cli_config("l3-cold", &record, &redis.url());
    let first = cli_tools(&config);
    assert!(!first.is_empty());
    assert_eq!(count(&record, "tools/list"), 1, "process A listed once");
    let keys = redis.keys().await;
    assert!(
        keys.iter().any(|k| k.starts_with("mcp-harness:list:pub:")),
        "A's public list is in Redis: {keys:?}"
    );
    // Process B: no disk layer, nothing in memory; the list comes from Redis.
    let second = cli_tools(&config);
    assert_eq!(second, first, "the same tools");
    assert_eq!(
        count(&record, "tools/list"),
        1,
        "process B sent no tools/list to the server"
    );
    let _ = std::fs::remove_file(record);
    let _ = std::fs::remove_file(config);
}

#[tokio::test]
async fn private_entries_and_servers_not_allow_listed_never_reach_redis() {
    let redis = Redis::start().await;
    let shared = shared(redis.url(), &["pub", "priv"]);
    let h = start_ready(config(
        vec![
            demo_server("pub", &[]),
            demo_server("priv", &["--cache-scope", "private"]),
            demo_server("other", &[]),
        ],
        shared,
    ))
    .await;
    let caller = Caller {
        agent_id: Some("a".into()),
        auth_context: Some("alice".into()),
    };
    let tools = h.list_tools(&caller).await.expect("list");
    for server in ["pub", "priv", "other"] {
        assert!(
            tools.iter().any(|t| &*t.server == server),
            "{server} listed"
        );
    }
    // Every list is cached here (the private one under alice's context)...
    assert_eq!(h.cache_stats().l1.entries, 3);
    h.shutdown().await; // waits for the background writes
    // ...and only the public list of an allow-listed server is in Redis.
    // (Besides pages there are the generations of the shared servers asked about.)
    let all = redis.keys().await;
    assert!(
        all.iter()
            .all(|k| !k.contains("other") && !k.starts_with("mcp-harness:list:priv:")),
        "{all:?}"
    );
    let keys: Vec<&String> = all.iter().filter(|k| k.contains(":list:")).collect();
    assert!(!keys.is_empty());
    assert!(
        keys.iter().all(|k| k.starts_with("mcp-harness:list:pub:")),
        "{keys:?}"
    );
    let mut c = redis.connection().await.expect("connect");
    for key in keys {
        let body: String = redis::cmd("GET")
            .arg(key)
            .query_async(&mut c)
            .await
            .expect("GET");
        assert!(!body.contains("private"), "{body}");
        let pttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut c)
            .await
            .expect("PTTL");
        assert!(
            pttl > 0 && pttl <= 60_000,
            "the page's ttlMs (60 s) became the expiry: {pttl}"
        );
    }
}

/// One demo server over HTTP, reached by two harnesses (two processes' worth of state:
/// each has its own caches, connection and subscription).
async fn two_harnesses(redis: &Redis, server: &HttpServer) -> (HarnessHandle, HarnessHandle) {
    let spec = ServerConfig::new("web", server.spec());
    let shared = shared(redis.url(), &["web"]);
    let a = start_ready(config(vec![spec.clone()], shared.clone())).await;
    let b = start_ready(config(vec![spec], shared)).await;
    (a, b)
}

#[tokio::test]
async fn a_list_change_seen_by_one_process_is_dropped_by_the_other_within_two_seconds() {
    let redis = Redis::start().await;
    let server = HttpServer::demo(&["web"]).await;
    let (ha, hb) = two_harnesses(&redis, &server).await;
    let before = ha.list_tools(&a()).await.expect("A lists").len();
    // A's write to Redis is in the background.
    assert!(eventually(Duration::from_secs(5), || ha.cache_stats().l3.writes >= 1).await);
    assert_eq!(hb.list_tools(&a()).await.expect("B lists").len(), before);
    assert_eq!(hb.cache_stats().l3.hits, 1, "B's list came from Redis");
    // A's call makes the server add a tool and say so on its subscriptions (B holds one
    // too, and may read the new list from Redis once A wrote it); what is checked here
    // is that A's invalidation reaches B over Redis.
    ha.call_tool(&a(), "web__grow", json!({}))
        .await
        .expect("grow");
    let started = Instant::now();
    // The bound: B drops its entries within 2 s of A hearing of the change.
    assert!(
        eventually(Duration::from_secs(2), || hb.cache_stats().l3.received >= 1).await,
        "B heard of the change: {:?}",
        hb.cache_stats()
    );
    let heard_in = started.elapsed();
    let after = hb.list_tools(&a()).await.expect("B lists again");
    assert_eq!(
        after.len(),
        before + 1,
        "B sees the new tool ({heard_in:?})"
    );
    ha.shutdown().await;
    hb.shutdown().await;
}

#[tokio::test]
async fn redis_killed_and_restarted_mid_traffic_fails_no_call_and_caching_resumes() {
    let mut redis = Redis::start().await;
    let record = temp_file("l3-kill");
    let rec = record.to_string_lossy().into_owned();
    let shared = shared(redis.url(), &["s"]);
    let h = start_ready(config(
        vec![demo_server("s", &["--record", &rec, "--ttl-ms", "300"])],
        shared,
    ))
    .await;
    let traffic = {
        let h = h.clone();
        tokio::spawn(async move {
            let mut failures = Vec::new();
            let mut calls = 0;
            let until = Instant::now() + Duration::from_secs(3);
            while Instant::now() < until {
                if let Err(e) = h.list_tools(&a()).await {
                    failures.push(e.to_string());
                }
                if let Err(e) = h.call_tool(&a(), "s__echo", json!({"text": "x"})).await {
                    failures.push(e.to_string());
                }
                calls += 2;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (calls, failures)
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(h.cache_stats().l3.writes >= 1, "{:?}", h.cache_stats());
    redis.kill();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let down = h.cache_stats().l3;
    assert!(down.errors >= 1, "{down:?}");
    redis.restart().await;
    let (calls, failures) = traffic.await.expect("traffic");
    assert!(
        failures.is_empty(),
        "{} of {calls} failed: {failures:?}",
        failures.len()
    );
    // Caching resumes: the (short-lived) list is written to the new, empty Redis.
    assert!(
        eventually(Duration::from_secs(40), || h.cache_stats().l3.available).await,
        "{:?}",
        h.cache_stats()
    );
    let mut back = false;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !back && Instant::now() < deadline {
        h.list_tools(&a()).await.expect("list");
        back = redis.keys().await.iter().any(|k| k.contains(":list:"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(back, "the list is in Redis again: {:?}", h.cache_stats());
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
}

#[tokio::test]
async fn a_redis_that_is_down_from_the_start_costs_nothing_but_its_counters() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port(); // closed again: nothing listens there
    let shared = shared(format!("redis://127.0.0.1:{port}"), &["s"]);
    let h = start_ready(config(vec![demo_server("s", &[])], shared)).await;
    for _ in 0..3 {
        assert!(!h.list_tools(&a()).await.expect("list").is_empty());
        h.call_tool(&a(), "s__echo", json!({"text": "x"}))
            .await
            .expect("call");
    }
    let stats = h.cache_stats();
    assert!(stats.l3.errors >= 1 && stats.l3.hits == 0, "{stats:?}");
    assert!(stats.l1.hits >= 2, "memory serves as usual: {stats:?}");
    h.shutdown().await;
}

#[tokio::test]
async fn garbage_and_entries_for_another_key_in_redis_are_refused_and_the_server_asked() {
    let redis = Redis::start().await;
    let record = temp_file("l3-garbage");
    let rec = record.to_string_lossy().into_owned();
    let server = || demo_server("s", &["--record", &rec]);
    let shared = shared(redis.url(), &["s"]);
    let first = start_ready(config(vec![server()], shared.clone())).await;
    let tools = first.list_tools(&a()).await.expect("list");
    first.shutdown().await;
    let keys = page_keys(&redis).await;
    assert_eq!(keys.len(), 1, "{keys:?}");
    let mut c = redis.connection().await.expect("connect");
    let generation: u64 = redis::cmd("GET")
        .arg("mcp-harness:gen:s")
        .query_async(&mut c)
        .await
        .expect("the server's generation");
    // In the current generation, so that only the key check can refuse it.
    let poisoned = |page: Value| {
        json!({"generation": generation, "expires_ms": unix_ms() + 600_000, "server": "s",
               "fingerprint": "another", "protocol": "2026-07-28", "method": "tools/list",
               "cursor": null, "page": page})
        .to_string()
    };
    let evil = json!({"resultType": "complete", "cacheScope": "public", "ttlMs": 60000,
                      "tools": [{"name": "evil", "inputSchema": {"type": "object"}}]});
    for body in ["\u{0}\u{1}not json".to_string(), poisoned(evil)] {
        let _: () = redis::cmd("SET")
            .arg(&keys[0])
            .arg(&body)
            .arg("KEEPTTL")
            .query_async(&mut c)
            .await
            .expect("SET");
        let h = start_ready(config(vec![server()], shared.clone())).await;
        let listed = h.list_tools(&a()).await.expect("list");
        assert_eq!(
            listed,
            tools
                .iter()
                .map(|t| mcp_harness::ToolInfo {
                    from_cache: false,
                    ..t.clone()
                })
                .collect::<Vec<_>>()
        );
        assert!(listed.iter().all(|t| &*t.name != "evil"));
        assert_eq!(h.cache_stats().l3.rejected, 1, "{:?}", h.cache_stats());
        h.shutdown().await;
    }
    assert_eq!(
        count(&record, "tools/list"),
        3,
        "each refused entry cost one listing"
    );
    let _ = std::fs::remove_file(record);
}

// A key holding what this layer never wrote there (a list where a page goes, a
// generation that is no integer) spoils that key alone. Before, Redis's refusal read as
// Redis being down and turned the whole layer off, and an invalidation of a server whose
// generation was no integer was retried for ever.
#[tokio::test]
async fn a_key_of_the_wrong_kind_in_redis_spoils_only_itself() {
    let redis = Redis::start().await;
    let shared = shared(redis.url(), &["s", "t"]);
    let servers = || vec![demo_server("s", &[]), demo_server("t", &[])];
    let first = start_ready(config(servers(), shared.clone())).await;
    first.list_tools(&a()).await.expect("list");
    first.shutdown().await;
    let keys = page_keys(&redis).await;
    let page = keys
        .iter()
        .find(|k| k.contains(":list:s:"))
        .expect("s's page");
    let mut c = redis.connection().await.expect("connect");
    let _: () = redis::cmd("DEL")
        .arg(page)
        .query_async(&mut c)
        .await
        .expect("DEL");
    let _: () = redis::cmd("RPUSH")
        .arg(page)
        .arg("x")
        .query_async(&mut c)
        .await
        .expect("RPUSH");
    let h = start_ready(config(servers(), shared.clone())).await;
    h.list_tools(&a()).await.expect("list");
    let stats = h.cache_stats().l3;
    assert_eq!(stats.errors, 0, "{stats:?}");
    assert!(stats.available, "{stats:?}");
    assert!(stats.hits >= 1, "t's page came from Redis: {stats:?}");
    assert!(stats.rejected >= 1, "{stats:?}");
    // The next invalidation of s puts a generation in place of one that is no integer,
    // and of one near overflow (a floor there would leave INCR no room), a random one
    // far below it.
    let generation = after_invalidation(&h, &mut c, "not a number", 1).await;
    assert!(generation.parse::<u64>().is_ok(), "{generation}");
    let near_overflow = (i64::MAX - 1000).to_string();
    let generation = after_invalidation(&h, &mut c, &near_overflow, 2).await;
    assert!(
        generation.parse::<u64>().is_ok_and(|g| g <= 1 << 62),
        "{generation}"
    );
    h.shutdown().await;
}

/// s's generation after it was set to `value` and `h` invalidated s's lists (its
/// `published`th invalidation).
async fn after_invalidation(
    h: &HarnessHandle,
    c: &mut redis::aio::MultiplexedConnection,
    value: &str,
    published: u64,
) -> String {
    let _: () = redis::cmd("SET")
        .arg("mcp-harness:gen:s")
        .arg(value)
        .query_async(c)
        .await
        .expect("SET");
    h.call_tool(&a(), "s__grow", json!({})).await.expect("grow");
    assert!(
        eventually(Duration::from_secs(10), || h.cache_stats().l3.published
            == published)
        .await,
        "{:?}",
        h.cache_stats()
    );
    redis::cmd("GET")
        .arg("mcp-harness:gen:s")
        .query_async(c)
        .await
        .expect("GET")
}

/// What Redis has sent its clients so far (`INFO stats`).
async fn redis_output_bytes(c: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(c)
        .await
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("total_net_output_bytes:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("total_net_output_bytes")
}

#[tokio::test]
async fn a_generation_key_grown_huge_in_redis_is_refused_without_being_read_whole() {
    let redis = Redis::start().await;
    let record = temp_file("l3-huge-generation");
    let rec = record.to_string_lossy().into_owned();
    let mut c = redis.connection().await.expect("connect");
    let huge = "7".repeat(8 << 20);
    let _: () = redis::cmd("SET")
        .arg("mcp-harness:gen:s")
        .arg(&huge)
        .query_async(&mut c)
        .await
        .expect("SET");
    let before = redis_output_bytes(&mut c).await;
    let h = start_ready(config(
        vec![demo_server("s", &["--record", &rec])],
        shared(redis.url(), &["s"]),
    ))
    .await;
    assert!(!h.list_tools(&a()).await.expect("list").is_empty());
    assert!(!h.list_tools(&a()).await.expect("list").is_empty());
    let stats = h.cache_stats().l3;
    assert!(stats.rejected >= 1, "{stats:?}");
    h.shutdown().await;
    let sent = redis_output_bytes(&mut c).await - before;
    assert!(
        sent < 1 << 20,
        "Redis sent {sent} bytes: the generation was read whole"
    );
    let _ = std::fs::remove_file(record);
}

#[tokio::test]
async fn a_list_in_use_is_read_again_before_it_expires_by_one_of_the_processes_sharing_it() {
    let redis = Redis::start().await;
    let record = temp_file("l3-refresh");
    let rec = record.to_string_lossy().into_owned();
    // Fresh for 10 s; refreshed when used in its last tenth (1 s).
    let server = || demo_server("s", &["--record", &rec, "--ttl-ms", "10000"]);
    let h = start_ready(config(vec![server()], shared(redis.url(), &["s"]))).await;
    h.list_tools(&a()).await.expect("list");
    let listed = tokio::time::Instant::now();
    assert!(eventually(Duration::from_secs(5), || h.cache_stats().l3.writes >= 1).await);
    // A second process sharing the list (its own server process, the same record).
    let h2 = start_ready(config(vec![server()], shared(redis.url(), &["s"]))).await;
    let all_cached = async |h: &HarnessHandle| {
        h.list_tools(&a())
            .await
            .expect("list")
            .iter()
            .all(|t| t.from_cache)
    };
    assert!(all_cached(&h2).await, "from Redis");
    tokio::time::sleep(Duration::from_millis(1000)).await; // well before the window (deliberate)
    assert!(all_cached(&h).await && all_cached(&h2).await);
    assert_eq!(count(&record, "tools/list"), 1, "not due yet");
    // Into the window, 9.0 to 10 s after the list was read (deliberate).
    tokio::time::sleep_until(listed + Duration::from_millis(9400)).await;
    assert!(all_cached(&h).await && all_cached(&h2).await);
    assert!(
        eventually(Duration::from_secs(5), || count(&record, "tools/list") == 2).await,
        "read again in the background"
    );
    tokio::time::sleep(Duration::from_millis(300)).await; // the other claim would show (deliberate)
    assert_eq!(
        count(&record, "tools/list"),
        2,
        "by one of the two processes"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await; // past the first expiry (deliberate)
    assert!(
        all_cached(&h).await && all_cached(&h2).await,
        "the refreshed list serves both past the old one's expiry"
    );
    assert_eq!(count(&record, "tools/list"), 2);
    h.shutdown().await;
    h2.shutdown().await;
    let _ = std::fs::remove_file(record);
}

#[tokio::test]
async fn a_page_stored_before_its_servers_generation_moved_is_never_served() {
    let redis = Redis::start().await;
    let record = temp_file("l3-generation");
    let rec = record.to_string_lossy().into_owned();
    let server = || demo_server("s", &["--record", &rec]);
    let shared = shared(redis.url(), &["s"]);
    lists_once(config(vec![server()], shared.clone())).await;
    // Another process saw the list change: the generation moves on, the page stays.
    move_generation(&redis, "s").await;
    let second = start_ready(config(vec![server()], shared.clone())).await;
    second.list_tools(&a()).await.expect("list");
    assert_eq!(second.cache_stats().l3.hits, 0, "the old page is not used");
    assert_eq!(
        count(&record, "tools/list"),
        2,
        "the server was asked again"
    );
    second.shutdown().await;
    // What the second one fetched was stored in the new generation, and serves.
    let third = start_ready(config(vec![server()], shared)).await;
    third.list_tools(&a()).await.expect("list");
    assert_eq!(third.cache_stats().l3.hits, 1);
    assert_eq!(count(&record, "tools/list"), 2);
    third.shutdown().await;
    let _ = std::fs::remove_file(record);
}

// A Redis that refuses writes (full, under its default `noeviction`) still serves the
// pages it holds: a lookup writes nothing unless the server has no generation yet.
// Before, each lookup's `SET NX` failed with OOM, and the layer was taken for down.
#[tokio::test]
async fn a_full_redis_that_refuses_writes_still_serves_its_pages() {
    let redis = Redis::start().await;
    let record = temp_file("l3-full");
    let rec = record.to_string_lossy().into_owned();
    let server = || demo_server("s", &["--record", &rec]);
    let shared = shared(redis.url(), &["s"]);
    lists_once(config(vec![server()], shared.clone())).await;
    let mut c = redis.connection().await.expect("connect");
    config_set(&mut c, "maxmemory-policy", "noeviction").await;
    config_set(&mut c, "maxmemory", "1").await;
    let refused: redis::RedisResult<()> = redis::cmd("SET")
        .arg("probe")
        .arg("x")
        .query_async(&mut c)
        .await;
    assert!(refused.is_err(), "Redis refuses writes now");
    let second = start_ready(config(vec![server()], shared.clone())).await;
    second.list_tools(&a()).await.expect("list");
    let stats = second.cache_stats();
    assert_eq!(stats.l3.hits, 1, "{stats:?}");
    assert_eq!(
        count(&record, "tools/list"),
        1,
        "the server was not asked again"
    );
    second.shutdown().await;
    // Nor do its refused writes take the layer for down: a refresh claim, an
    // invalidation (retried in the background), and the reads go on.
    let both = SharedConfig {
        servers: vec!["s".into(), "t".into()],
        ..shared.clone()
    };
    let layer = mcp_harness::registry::cache::shared::SharedCache::new(both, None).expect("layer");
    // Lists it cannot write: after three failures in a row, none is made into writes.
    let generation = layer.generation("s").await.expect("generation");
    for n in 1..=3 {
        layer.put(&[page("s", 0, 10)], "2026-07-28", generation);
        assert!(
            eventually(Duration::from_secs(10), || layer.stats().errors >= n).await,
            "{:?}",
            layer.stats()
        );
    }
    let dropped = layer.stats().dropped_writes;
    layer.put(&[page("s", 0, 10)], "2026-07-28", generation);
    assert_eq!(
        layer.stats().dropped_writes,
        dropped + 1,
        "{:?}",
        layer.stats()
    );
    assert!(layer.claim_refresh("a list", Duration::from_secs(5)).await);
    layer.invalidate("t").await;
    let stats = layer.stats();
    assert!(stats.available && stats.errors >= 5, "{stats:?}");
    assert!(layer.generation("s").await.is_some(), "{:?}", layer.stats());
    config_set(&mut c, "maxmemory", "0").await;
    let _ = std::fs::remove_file(record);
}

#[tokio::test]
async fn a_shared_servers_lists_on_disk_are_not_served_after_a_restart_it_may_have_missed_an_invalidation_in()
 {
    let redis = Redis::start().await;
    let (shared_record, own_record) = (temp_file("l3-disk-s"), temp_file("l3-disk-p"));
    let (rs, rp) = (
        shared_record.to_string_lossy().into_owned(),
        own_record.to_string_lossy().into_owned(),
    );
    let servers = || {
        vec![
            demo_server("s", &["--record", &rs]),
            demo_server("p", &["--record", &rp]),
        ]
    };
    let dir = temp_file("l3-disk-dir");
    let with_disk = || {
        let mut c = config(servers(), shared(redis.url(), &["s"]));
        c.cache.dir = Some(dir.clone());
        c
    };
    let first = start_ready(with_disk()).await;
    first.list_tools(&a()).await.expect("list");
    first.shutdown().await;
    // While it is down, another process drops the shared server's lists (its
    // generation moves on; the word it publishes reaches only those listening).
    move_generation(&redis, "s").await;
    let second = start_ready(with_disk()).await;
    second.list_tools(&a()).await.expect("list");
    assert_eq!(
        count(&shared_record, "tools/list"),
        2,
        "the shared server was asked again, not read from the files of before"
    );
    assert_eq!(
        count(&own_record, "tools/list"),
        1,
        "a server not shared is still read from the disk"
    );
    second.shutdown().await;
    let _ = std::fs::remove_file(shared_record);
    let _ = std::fs::remove_file(own_record);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn an_invalidation_made_while_redis_is_down_reaches_it_once_it_is_back() {
    let mut redis = Redis::start().await;
    let h = start_ready(config(
        vec![demo_server("s", &[])],
        shared(redis.url(), &["s"]),
    ))
    .await;
    h.list_tools(&a()).await.expect("list");
    redis.kill();
    // The server adds a tool and says so on its subscription: an invalidation.
    let mut events = h.subscribe();
    h.call_tool(&a(), "s__grow", json!({})).await.expect("grow");
    let heard = tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(e) = events.recv().await {
            if matches!(e, mcp_harness::registry::HarnessEvent::ToolsChanged { .. }) {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(
        heard,
        Ok(true),
        "the change was handled here with Redis down"
    );
    assert_eq!(h.cache_stats().l3.published, 0);
    redis.restart().await;
    let mut moved = false;
    for _ in 0..300 {
        let mut c = redis.connection().await.expect("connect");
        let generation: Option<u64> = redis::cmd("GET")
            .arg("mcp-harness:gen:s")
            .query_async(&mut c)
            .await
            .expect("GET");
        if generation.is_some() {
            moved = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        moved,
        "the invalidation was retried until Redis took it: {:?}",
        h.cache_stats()
    );
    assert!(
        eventually(Duration::from_secs(5), || h.cache_stats().l3.published == 1).await,
        "{:?}",
        h.cache_stats()
    );
    h.shutdown().await;
}

#[tokio::test]
async fn with_a_key_file_only_pages_signed_with_the_deployments_key_are_used() {
    let redis = Redis::start().await;
    let record = temp_file("l3-keyed");
    let rec = record.to_string_lossy().into_owned();
    let server = || demo_server("s", &["--record", &rec]);
    let secret = "k1-0123456789abcdef0123456789abcdef";
    let k1 = key_file("l3-k1", secret, 0o600);
    let k2 = key_file("l3-k2", "k2-0123456789abcdef0123456789abcdef", 0o600);
    let keyed = |file: &Path| SharedConfig {
        key_file: Some(file.to_path_buf()),
        ..shared(redis.url(), &["s"])
    };
    let lists = || count(&record, "tools/list");
    // A lists and writes its page, signed; B, with the same key, is served from it.
    let first = start_ready(config(vec![server()], keyed(&k1))).await;
    let tools = first.list_tools(&a()).await.expect("list");
    first.shutdown().await;
    let keys = page_keys(&redis).await;
    assert_eq!(keys.len(), 1, "{keys:?}");
    let mut c = redis.connection().await.expect("connect");
    let entry: Vec<u8> = redis::cmd("GET")
        .arg(&keys[0])
        .query_async(&mut c)
        .await
        .expect("GET");
    assert!(entry.starts_with(b"mac1:"), "signed");
    let second = start_ready(config(vec![server()], keyed(&k1))).await;
    let listed = second.list_tools(&a()).await.expect("list");
    assert_eq!(listed.len(), tools.len());
    assert_eq!(second.cache_stats().l3.hits, 1);
    assert_eq!(lists(), 1, "B did not ask the server");
    second.shutdown().await;
    // A process with another key neither reads A's page (it looks under keys of its
    // own: nothing is even refused) nor feeds it.
    let other = start_ready(config(vec![server()], keyed(&k2))).await;
    other.list_tools(&a()).await.expect("list");
    let stats = other.cache_stats().l3;
    assert_eq!((stats.hits, stats.rejected), (0, 0), "{stats:?}");
    assert_eq!(lists(), 2);
    other.shutdown().await;
    let both = page_keys(&redis).await;
    assert_eq!(both.len(), 2);
    // The configuration's fingerprint (a digest of its headers and environment, so of
    // any secret in them) is held under each deployment's key, not as it is.
    let mut tags = Vec::new();
    for key in &both {
        let entry: Vec<u8> = redis::cmd("GET")
            .arg(key)
            .query_async(&mut c)
            .await
            .expect("GET");
        let body = entry.splitn(2, |b| *b == b'\n').nth(1).expect("a body");
        let stored: Value = serde_json::from_slice(body).expect("json");
        tags.push(stored["fingerprint"].as_str().map(String::from));
    }
    assert!(tags.iter().all(Option::is_some), "{tags:?}");
    assert_ne!(tags[0], tags[1], "one server, two keys: two tags");

    // Someone who can write to Redis but holds no key changes the page (a tool added,
    // the tag kept): refused, and the server asked.
    let (head, body) = entry.split_at(b"mac1:".len() + 64 + 1);
    let original: Value = serde_json::from_slice(body).expect("the body is the stored page");
    let mut forged = original.clone();
    forged["page"]["tools"]
        .as_array_mut()
        .expect("tools")
        .push(json!({"name": "evil", "inputSchema": {"type": "object"}}));
    let set = |value: Vec<u8>| {
        let mut c = c.clone();
        let key = keys[0].clone();
        async move {
            let _: () = redis::cmd("SET")
                .arg(&key)
                .arg(value)
                .arg("PX")
                .arg(600_000)
                .query_async(&mut c)
                .await
                .expect("SET");
        }
    };
    set([head, &serde_json::to_vec(&forged).expect("json")[..]].concat()).await;
    let h = start_ready(config(vec![server()], keyed(&k1))).await;
    let listed = h.list_tools(&a()).await.expect("list");
    assert!(listed.iter().all(|t| &*t.name != "evil"));
    assert_eq!(h.cache_stats().l3.rejected, 1, "{:?}", h.cache_stats());
    assert_eq!(lists(), 3);
    h.shutdown().await;

    // A page signed with the key (as this test can: over the Redis key and the body)
    // but past the expiry it was written with is not used, though Redis's expiry was
    // pushed out; a fresh one is.
    let sign = |stored: &Value| {
        let body = serde_json::to_vec(stored).expect("json");
        let signed = [keys[0].as_bytes(), b"\n", &body[..]].concat();
        let tag = mcp_harness::util::hash::hmac_sha256_hex(secret.as_bytes(), &signed);
        [b"mac1:", tag.as_bytes(), b"\n", &body[..]].concat()
    };
    assert_eq!(sign(&original), entry, "the test signs as the harness does");
    let mut stale = original.clone();
    stale["expires_ms"] = json!(unix_ms() - 1_000);
    set(sign(&stale)).await;
    let h = start_ready(config(vec![server()], keyed(&k1))).await;
    h.list_tools(&a()).await.expect("list");
    assert_eq!(h.cache_stats().l3.hits, 0, "{:?}", h.cache_stats());
    assert_eq!(lists(), 4);
    h.shutdown().await;
    let mut fresh = original;
    fresh["expires_ms"] = json!(unix_ms() + 600_000);
    set(sign(&fresh)).await;
    let h = start_ready(config(vec![server()], keyed(&k1))).await;
    h.list_tools(&a()).await.expect("list");
    assert_eq!(h.cache_stats().l3.hits, 1, "{:?}", h.cache_stats());
    assert_eq!(lists(), 4);
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
}

#[tokio::test]
async fn a_key_file_others_can_read_stops_the_harness_from_starting() {
    let redis = Redis::start().await;
    let file = key_file("l3-open", "0123456789abcdef0123456789abcdef", 0o644);
    let shared = SharedConfig {
        key_file: Some(file.clone()),
        ..shared(redis.url(), &["s"])
    };
    let error = mcp_harness::Harness::spawn(config(vec![demo_server("s", &[])], shared))
        .await
        .err()
        .expect("refused");
    let text = error.to_string();
    assert!(
        text.contains("cache.shared.key_file") && text.contains("readable by others"),
        "{text}"
    );
    let _ = std::fs::remove_file(file);
}

#[tokio::test]
async fn a_generation_set_back_in_redis_after_an_invalidation_is_moved_past_not_used() {
    let redis = Redis::start().await;
    let record = temp_file("l3-rollback");
    let rec = record.to_string_lossy().into_owned();
    let server = || demo_server("s", &["--record", &rec]);
    let k = key_file("l3-rollback", "rb-0123456789abcdef0123456789abcdef", 0o600);
    let keyed = SharedConfig {
        key_file: Some(k),
        ..shared(redis.url(), &["s"])
    };
    let gen_key = "mcp-harness:gen:s";
    let mut c = redis.connection().await.expect("connect");
    let generation = async |c: &mut redis::aio::MultiplexedConnection| -> u64 {
        redis::cmd("GET")
            .arg(gen_key)
            .query_async(c)
            .await
            .expect("GET")
    };
    // A page is stored in generation G, and a second process is served from it.
    let first = start_ready(config(vec![server()], keyed.clone())).await;
    first.list_tools(&a()).await.expect("list");
    first.shutdown().await;
    let old = generation(&mut c).await;
    let seen = start_ready(config(vec![server()], keyed.clone())).await;
    seen.list_tools(&a()).await.expect("list");
    assert_eq!(seen.cache_stats().l3.hits, 1);
    // A peer sees the server's lists change: INCR, then its message, as `invalidate`
    // sends them. The second process hears it and drops its own copies.
    let _: (u64, u64) = redis::pipe()
        .cmd("INCR")
        .arg(gen_key)
        .cmd("PUBLISH")
        .arg("mcp-harness:changed")
        .arg(json!({"origin": "a-peer", "server": "s"}).to_string())
        .query_async(&mut c)
        .await
        .expect("INCR and PUBLISH");
    let heard = Instant::now() + Duration::from_secs(10);
    while seen.cache_stats().invalidations == 0 && Instant::now() < heard {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(seen.cache_stats().l3.received, 1);
    assert_eq!(seen.cache_stats().l1.entries, 0, "its own copies dropped");
    // Someone who can write to Redis sets the generation back at once, so that the
    // signed page of G, genuine but replaced, would match again.
    let _: () = redis::cmd("SET")
        .arg(gen_key)
        .arg(old)
        .query_async(&mut c)
        .await
        .expect("SET");
    // The process that heard of the change uses nothing at or below G (the server is
    // asked), and moves the generation past it.
    let asked = count(&record, "tools/list");
    seen.list_tools(&a()).await.expect("list");
    assert_eq!(seen.cache_stats().l3.hits, 1, "{:?}", seen.cache_stats());
    assert!(
        seen.cache_stats().l3.rejected >= 1,
        "{:?}",
        seen.cache_stats()
    );
    assert_eq!(count(&record, "tools/list"), asked + 1);
    assert!(generation(&mut c).await > old + 1);
    seen.shutdown().await;
    // So no process uses the page of G any more.
    let asked = count(&record, "tools/list");
    let later = start_ready(config(vec![server()], keyed)).await;
    later.list_tools(&a()).await.expect("list");
    assert_eq!(later.cache_stats().l3.hits, 0);
    assert_eq!(count(&record, "tools/list"), asked + 1);
    later.shutdown().await;
    let _ = std::fs::remove_file(record);
}

// With a disk layer, the highest generation a process saw outlives it (kept in the
// cache directory): a process started after the server's lists changed refuses the old
// signed page replayed under its old generation, as a process running then would.
#[tokio::test]
async fn a_generation_set_back_while_no_process_ran_is_refused_by_one_started_on_the_same_disk() {
    let redis = Redis::start().await;
    let record = temp_file("l3-floors");
    let rec = record.to_string_lossy().into_owned();
    let server = || demo_server("s", &["--record", &rec]);
    let k = key_file("l3-floors", "fl-0123456789abcdef0123456789abcdef", 0o600);
    let keyed = SharedConfig {
        key_file: Some(k),
        ..shared(redis.url(), &["s"])
    };
    let dir = temp_file("l3-floors-dir");
    let with_disk = || {
        let mut c = config(vec![server()], keyed.clone());
        c.cache.dir = Some(dir.clone());
        c
    };
    let gen_key = "mcp-harness:gen:s";
    let mut c = redis.connection().await.expect("connect");
    // A page is stored in generation G; someone who can read Redis keeps a copy.
    let first = start_ready(with_disk()).await;
    first.list_tools(&a()).await.expect("list");
    first.shutdown().await;
    let old: u64 = redis::cmd("GET")
        .arg(gen_key)
        .query_async(&mut c)
        .await
        .expect("GET");
    let pages = page_keys(&redis).await;
    assert_eq!(pages.len(), 1, "{pages:?}");
    let copy: Vec<u8> = redis::cmd("GET")
        .arg(&pages[0])
        .query_async(&mut c)
        .await
        .expect("GET page");
    // The server's lists change while no process runs (its generation moves on); the
    // next process reads them in the new generation.
    move_generation(&redis, "s").await;
    let second = start_ready(with_disk()).await;
    second.list_tools(&a()).await.expect("list");
    assert_eq!(second.cache_stats().l3.hits, 0);
    second.shutdown().await;
    // While none runs, the old page and its generation are put back.
    let _: () = redis::pipe()
        .cmd("SET")
        .arg(gen_key)
        .arg(old)
        .ignore()
        .cmd("SET")
        .arg(&pages[0])
        .arg(copy)
        .arg("PX")
        .arg(60_000)
        .ignore()
        .query_async(&mut c)
        .await
        .expect("SET");
    // A process started on the same disk asks the server, and moves Redis past it.
    let asked = count(&record, "tools/list");
    let third = start_ready(with_disk()).await;
    third.list_tools(&a()).await.expect("list");
    let stats = third.cache_stats();
    assert_eq!(stats.l3.hits, 0, "{stats:?}");
    assert!(stats.l3.rejected >= 1, "{stats:?}");
    assert_eq!(count(&record, "tools/list"), asked + 1);
    let now: u64 = redis::cmd("GET")
        .arg(gen_key)
        .query_async(&mut c)
        .await
        .expect("GET");
    assert!(now > old + 1, "{now} against {old}");
    third.shutdown().await;
    let _ = std::fs::remove_file(record);
    let _ = std::fs::remove_dir_all(dir);
}

/// A page's cursor is the server's to choose and is stored beside the page: a page that
/// with its key is longer than a lookup reads is not written (it could never be read
/// back, and every listing would pay a miss, a long read and a refusal); and a list is
/// shared whole or not at all, so neither is the page before it.
#[tokio::test]
async fn a_page_keyed_by_a_long_cursor_is_not_written_where_it_cannot_be_read() {
    use mcp_harness::registry::cache::shared::SharedCache;
    use mcp_harness::registry::cache::{CacheKey, Page, json_size};
    let redis = Redis::start().await;
    let layer = SharedCache::new(
        SharedConfig {
            max_entry_bytes: 1024,
            ..shared(redis.url(), &["s"])
        },
        None,
    )
    .expect("layer");
    let generation = layer.generation("s").await.expect("Redis is up");
    let value = Arc::new(json!({"tools": [], "cacheScope": "public", "ttlMs": 60000}));
    let key = |cursor: String| CacheKey {
        server: "s".into(),
        fingerprint: "f".into(),
        client: "c".into(),
        method: "tools/list".into(),
        param: Some(cursor),
        scope: "public".into(),
    };
    let page = |cursor: String| Page {
        key: key(cursor),
        ttl: Duration::from_secs(60),
        received_unix_ms: unix_ms(),
        bytes: json_size(&value),
        value: value.clone(),
        version: None,
    };
    // 6 KiB of control characters escape to six times that.
    let long = "\u{1}".repeat(6 << 10);
    layer.put(
        &[page("c1".into()), page(long.clone())],
        "2026-07-28",
        generation,
    );
    layer.drain(Duration::from_secs(5)).await;
    for cursor in ["c1".to_string(), long] {
        assert!(layer.get(&key(cursor), "2026-07-28").await.hit.is_none());
    }
    let stats = layer.stats();
    assert_eq!((stats.writes, stats.dropped_writes), (0, 2), "{stats:?}");
    assert!(page_keys(&redis).await.is_empty());
    // Alone, the first page is shared.
    layer.put(&[page("c1".into())], "2026-07-28", generation);
    layer.drain(Duration::from_secs(5)).await;
    assert!(
        layer
            .get(&key("c1".into()), "2026-07-28")
            .await
            .hit
            .is_some()
    );
    let stats = layer.stats();
    assert_eq!(
        stats.rejected, 0,
        "nothing read back was refused: {stats:?}"
    );
    assert_eq!((stats.writes, stats.dropped_writes), (1, 2), "{stats:?}");
    assert_eq!(page_keys(&redis).await.len(), 1);
}

// `ListsChanged` is announced once the old lists are gone, also when telling other
// processes takes long (a Redis that accepts and never answers): whoever lists again on
// hearing it reads the new list, not the cache's.
#[tokio::test]
async fn a_list_read_on_hearing_lists_changed_is_the_new_one_while_redis_is_slow() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = silent.local_addr().expect("addr").port();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket);
        }
    });
    let shared = shared(format!("redis://127.0.0.1:{port}"), &["s"]);
    let h = start_ready(config(vec![demo_server("s", &["--era", "legacy"])], shared)).await;
    // Legacy lists are private: kept in memory under the caller's auth context.
    let caller = a().with_auth_context("ctx");
    let names = |tools: &[mcp_harness::ToolInfo]| -> Vec<String> {
        tools.iter().map(|t| t.qualified.to_string()).collect()
    };
    let before = names(&h.list_tools(&caller).await.expect("list"));
    assert!(!before.iter().any(|n| n == "s__grown_0"), "{before:?}");
    // Served from memory from now on, once the first subscription (which this Redis
    // never answers) has timed out: before, nothing is kept.
    let kept = async {
        while h.cache_stats().l1.hits == 0 {
            h.list_tools(&caller).await.expect("list");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), kept)
        .await
        .unwrap_or_else(|_| panic!("never kept: {:?}", h.cache_stats()));
    let mut events = h.subscribe();
    h.call_tool(&caller, "s__grow", json!({}))
        .await
        .expect("grow");
    loop {
        let event = tokio::time::timeout(Duration::from_secs(30), events.recv())
            .await
            .expect("in time")
            .expect("event");
        if matches!(event, mcp_harness::registry::HarnessEvent::ListsChanged { ref server, .. } if server == "s")
        {
            break;
        }
    }
    let after = names(&h.list_tools(&caller).await.expect("list"));
    assert!(after.iter().any(|n| n == "s__grown_0"), "{after:?}");
    h.shutdown().await;
    held.abort();
}

// A Redis that ends each subscription as soon as it is made (`CLIENT KILL TYPE pubsub`
// every 20 ms here) has it made again after ever longer waits: 100 ms doubling. Before,
// each subscription made started the waits afresh: one every 100-200 ms, each dropping
// every shared server's local entries.
#[tokio::test]
async fn a_subscription_ended_as_soon_as_it_is_made_is_made_again_ever_more_rarely() {
    let redis = Redis::start().await;
    let h = start_ready(config(
        vec![demo_server("s", &[])],
        shared(redis.url(), &["s"]),
    ))
    .await;
    let mut c = redis.connection().await.expect("redis");
    let mut killed = 0u64;
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let n: u64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("pubsub")
            .query_async(&mut c)
            .await
            .expect("client kill");
        killed += n;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Waits of 100, 200, 400, 800 and 1600 ms at least: six subscriptions in 3 s at
    // most (jitter only lengthens them).
    assert!(killed >= 1, "it subscribed");
    assert!(killed <= 7, "subscribed {killed} times in 3 s");
    h.list_tools(&a()).await.expect("lists served meanwhile");
    h.shutdown().await;
}

// A process whose first subscription comes late (Redis down at its start) may have
// missed invalidations while it cached lists from the servers: once subscribed, it reads
// them again.
#[tokio::test]
async fn lists_cached_before_a_late_first_subscription_are_read_again() {
    let mut redis = Redis::start().await;
    redis.kill();
    let record = temp_file("l3-late-subscribe");
    let rec = record.to_string_lossy().into_owned();
    let h = start_ready(config(
        vec![demo_server("s", &["--record", &rec])],
        shared(redis.url(), &["s"]),
    ))
    .await;
    h.list_tools(&a()).await.expect("list");
    h.list_tools(&a()).await.expect("list");
    assert_eq!(count(&record, "tools/list"), 1, "the second from memory");
    redis.restart().await;
    let read_again = async {
        loop {
            h.list_tools(&a()).await.expect("list");
            if count(&record, "tools/list") >= 2 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(40), read_again)
        .await
        .unwrap_or_else(|_| panic!("not read again: {:?}", h.cache_stats()));
    h.shutdown().await;
    let _ = std::fs::remove_file(record);
}

// Until its first subscription is made (or could not be), a process keeps no shared
// server's list: a change a peer publishes meanwhile would go unheard, and a
// subscription made late but on its first try drops nothing. Before, a list read then
// was served from memory up to its ttl after the change.
#[tokio::test]
async fn no_shared_list_is_kept_before_the_first_subscription_is_settled() {
    let redis = Redis::start().await;
    // Every command to Redis, the subscription too, goes 2.5 s late: the first
    // subscription is settled when it times out, 2 s after the harness is made.
    let relay = Relay::start_delayed(redis.port, Duration::from_millis(2500)).await;
    let record = temp_file("l3-unsettled");
    let rec = record.to_string_lossy().into_owned();
    let mut layer = shared(format!("redis://127.0.0.1:{}", relay.port), &["s"]);
    layer.timeout = Duration::from_millis(50);
    let made = std::time::Instant::now();
    let h = start_ready(config(vec![demo_server("s", &["--record", &rec])], layer)).await;
    h.list_tools(&a()).await.expect("list");
    h.list_tools(&a()).await.expect("list");
    // Only if both listings were within the 2 s (a loaded machine may take longer to
    // start the server): then each was read from the server.
    if made.elapsed() < Duration::from_millis(1900) {
        assert_eq!(
            count(&record, "tools/list"),
            2,
            "read from the server each time while the subscription is on its way"
        );
    } else {
        eprintln!("the server took too long to start to check the first 2 s");
    }
    // Settled (made, or timed out at 2 s): lists are kept again.
    tokio::time::sleep(Duration::from_millis(2500)).await; // the first subscription's end (deliberate)
    h.list_tools(&a()).await.expect("list");
    let kept = count(&record, "tools/list");
    h.list_tools(&a()).await.expect("list");
    assert_eq!(count(&record, "tools/list"), kept, "the last from memory");
    h.shutdown().await;
    drop(relay);
    let _ = std::fs::remove_file(record);
}

/// A TCP relay to `port` on loopback whose connections can be made silent: after
/// [`Relay::silence`], the connections open then neither forward nor close (as packets
/// dropped by a failover's old address); new ones relay.
struct Relay {
    port: u16,
    silenced: Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(target: u16) -> Relay {
        Relay::start_paced(target, Duration::ZERO).await
    }

    /// A relay that pauses `pause` after each piece (up to 16 KiB) it forwards to
    /// Redis: a slow link, on which a large write takes its time.
    async fn start_paced(target: u16, pause: Duration) -> Relay {
        Relay::start_with(target, Duration::ZERO, pause).await
    }

    /// A relay that holds each piece `delay` before forwarding it to Redis: a link
    /// on which every command, a subscription too, is answered late.
    async fn start_delayed(target: u16, delay: Duration) -> Relay {
        Relay::start_with(target, delay, Duration::ZERO).await
    }

    async fn start_with(target: u16, delay: Duration, pause: Duration) -> Relay {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let silenced = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let era = silenced.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else {
                    continue;
                };
                let born = era.load(Ordering::SeqCst);
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(relay(cr, sw, era.clone(), born, (delay, pause)));
                tokio::spawn(relay(sr, cw, era.clone(), born, Default::default()));
            }
        });
        Relay {
            port,
            silenced,
            task,
        }
    }

    fn silence(&self) {
        self.silenced
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Copies `from` to `to` until either ends, or holds both open forwarding nothing once
/// `era` moved past `born`; each piece held `delay` before it goes and `pause` after.
async fn relay(
    mut from: impl tokio::io::AsyncRead + Unpin,
    mut to: impl tokio::io::AsyncWrite + Unpin,
    era: Arc<std::sync::atomic::AtomicU64>,
    born: u64,
    (delay, pause): (Duration, Duration),
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if era.load(std::sync::atomic::Ordering::SeqCst) != born {
            let _held = (from, to);
            return std::future::pending().await;
        }
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
}

// A large list written to Redis over a slow link does not hold up the lookups of other
// servers (each bounded), nor take the layer for down: writes have a connection of
// their own. Before, the lookups queued behind the write on one socket and timed out,
// and the layer backed off every read.
#[tokio::test]
async fn a_large_write_over_a_slow_link_holds_up_no_lookup() {
    use mcp_harness::registry::cache::Page;
    use mcp_harness::registry::cache::shared::SharedCache;
    let redis = Redis::start().await;
    // About 4 MB/s towards Redis.
    let relay = Relay::start_paced(redis.port, Duration::from_millis(4)).await;
    // Lookups bounded at 100 ms; writes get a second.
    let config = SharedConfig {
        timeout: Duration::from_millis(100),
        ..shared(format!("redis://127.0.0.1:{}", relay.port), &["s", "t"])
    };
    let layer = SharedCache::new(config, None).expect("layer");
    let generation = layer.generation("s").await.expect("a generation");
    assert!(layer.generation("t").await.is_some());
    // One page of 900 KiB, about a quarter second on this link (a 4 ms pause per 16
    // KiB): well within the write's second, well past a lookup's 100 ms.
    let pages: Vec<Page> = vec![page("s", 0, 900 << 10)];
    layer.put(&pages, "2026-07-28", generation);
    // Meanwhile t's lookups go through, each within its bound.
    tokio::time::sleep(Duration::from_millis(20)).await;
    for _ in 0..5 {
        assert!(
            layer.generation("t").await.is_some(),
            "a lookup was held up: {:?}",
            layer.stats()
        );
    }
    let stats = layer.stats();
    assert!(stats.available && stats.errors == 0, "{stats:?}");
    assert!(
        eventually(Duration::from_secs(30), || layer.stats().writes == 1).await,
        "{:?}",
        layer.stats()
    );
}

// `shutdown()` waits for a list's write to Redis under way within the write's own
// bound (a second at least), not only four lookups' (400 ms here): a process that
// lists and exits at once leaves the list to the others over a slow link too.
#[tokio::test]
async fn shutdown_waits_for_a_write_to_redis_under_way() {
    let redis = Redis::start().await;
    // A 40 ms pause per 16 KiB towards Redis: the list of 1,200 tools (some 210 KB)
    // takes about half a second to write, half its bound.
    let relay = Relay::start_paced(redis.port, Duration::from_millis(40)).await;
    let layer = SharedConfig {
        timeout: Duration::from_millis(100),
        ..shared(format!("redis://127.0.0.1:{}", relay.port), &["s"])
    };
    // Over HTTP: nothing to stop before the caches are written (a process takes its
    // time).
    let server = HttpServer::demo(&["s", "--extra-tools", "1200"]).await;
    let spec = ServerConfig::new("s", server.spec());
    let h = start_ready(config(vec![spec], layer)).await;
    let started = Instant::now();
    h.list_tools(&a()).await.expect("list");
    h.shutdown().await;
    let took = started.elapsed();
    assert_eq!(
        page_keys(&redis).await.len(),
        1,
        "written before shutdown returned ({took:?}): {:?}",
        h.cache_stats()
    );
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// A connection to Redis that goes silent (neither answers nor closes) is opened again
// after a few commands time out on it: the manager reconnects only on an error, and a
// command cut off by the layer's own bound is none, so it kept the dead connection.
#[tokio::test]
async fn a_redis_connection_gone_silent_is_opened_again() {
    use mcp_harness::registry::cache::shared::SharedCache;
    let redis = Redis::start().await;
    let relay = Relay::start(redis.port).await;
    let layer = SharedCache::new(
        shared(format!("redis://127.0.0.1:{}", relay.port), &["s"]),
        None,
    )
    .expect("layer");
    assert!(layer.generation("s").await.is_some(), "through the relay");
    relay.silence();
    assert!(
        layer.generation("s").await.is_none(),
        "the connection is silent"
    );
    let back = async {
        while layer.generation("s").await.is_none() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), back)
        .await
        .unwrap_or_else(|_| panic!("never reconnected: {:?}", layer.stats()));
}

/// A server `s` whose tool list takes several pages, fresh for `ttls` (ms, per page;
/// the last repeats), started with `extra` flags too.
fn paged(ttls: &str, extra: &[&str]) -> ServerConfig {
    let mut args = vec![
        "--extra-tools",
        "30",
        "--page-size",
        "20",
        "--page-ttls",
        ttls,
    ];
    args.extend_from_slice(extra);
    demo_server("s", &args)
}

// A process whose Redis user may read and write keys but not subscribe (Redis 7's
// default for new ACL users is no channels) never hears its peers' changes: it reads
// shared lists from Redis each time, where the generation is checked, instead of
// keeping them in memory until their ttl. Before, a failed subscription counted as
// settled, and a peer's change went unseen for the list's whole ttl.
#[tokio::test]
async fn a_process_that_cannot_subscribe_reads_shared_lists_from_redis_each_time() {
    let redis = Redis::start().await;
    let mut c = redis.connection().await.expect("connect");
    let _: () = redis::cmd("ACL")
        .arg(
            &[
                "SETUSER",
                "keysonly",
                "on",
                ">pw",
                "~*",
                "+@all",
                "resetchannels",
            ][..],
        )
        .query_async(&mut c)
        .await
        .expect("ACL SETUSER");
    let url = format!("redis://keysonly:pw@127.0.0.1:{}", redis.port);
    let server = demo_server("s", &["--ttl-ms", "600000", "--no-list-changed"]);
    let h = start_ready(config(vec![server], shared(url, &["s"]))).await;
    let grown = |tools: &[mcp_harness::ToolInfo]| tools.iter().any(|t| t.name.ends_with("grown_0"));
    assert!(!grown(&h.list_tools(&a()).await.expect("list")));
    // The server's list changes without a word to this process; a peer's invalidation
    // moves the shared generation.
    h.call_tool(&a(), "s__grow", json!({})).await.expect("grow");
    move_generation(&redis, "s").await;
    assert!(
        grown(&h.list_tools(&a()).await.expect("list")),
        "a list kept in memory past a peer's change: {:?}",
        h.cache_stats()
    );
    h.shutdown().await;
    // Its own change (the server says its list changed) moves the generation, and its
    // message, which this user may not publish, is not retried for ever: the server's
    // lists are shared again. Before, the invalidation stayed unsent, and this process
    // neither read nor wrote them in Redis again.
    let server = demo_server("s", &["--ttl-ms", "600000"]);
    let url = format!("redis://keysonly:pw@127.0.0.1:{}", redis.port);
    let h = start_ready(config(vec![server], shared(url, &["s"]))).await;
    h.list_tools(&a()).await.expect("list");
    let written = |h: &HarnessHandle| h.cache_stats().l3.writes;
    assert!(eventually(Duration::from_secs(10), || written(&h) >= 1).await);
    let before = written(&h);
    h.call_tool(&a(), "s__grow", json!({})).await.expect("grow");
    let shared_again = async {
        loop {
            let tools = h.list_tools(&a()).await.expect("list");
            if grown(&tools) && written(&h) > before {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), shared_again)
        .await
        .unwrap_or_else(|_| panic!("not shared again: {:?}", h.cache_stats()));
    h.shutdown().await;
}

// A shared list whose first page is still fresh in memory and whose later pages
// expired is read again from its first page, not continued with the cached cursor
// (another process's server's, when the page came from Redis), and shared again
// whole: never in part, the fetched pages without the page whose cursor leads to them.
#[tokio::test]
async fn a_shared_list_whose_later_pages_expired_is_read_again_whole() {
    let redis = Redis::start().await;
    let h = start_ready(config(
        vec![paged("600000,300", &[])],
        shared(redis.url(), &["s"]),
    ))
    .await;
    let first = h.list_tools(&a()).await.expect("list").len();
    let written = |h: &HarnessHandle| h.cache_stats().l3.writes;
    assert!(
        eventually(Duration::from_secs(10), || written(&h) >= 3).await,
        "the whole list is shared: {:?}",
        h.cache_stats()
    );
    let before = written(&h);
    tokio::time::sleep(Duration::from_millis(400)).await; // the later pages expire (deliberate)
    assert_eq!(h.list_tools(&a()).await.expect("list").len(), first);
    assert!(
        eventually(Duration::from_secs(10), || written(&h) >= before + 3).await,
        "read again whole and shared whole: {:?}",
        h.cache_stats()
    );
    h.shutdown().await;
}

// Another process's first page read from Redis, its later pages expired there: the
// cursor on that page is its server's, and this process's server (its cursors its
// own, refusing others' with an error that says nothing of cursors) is never sent it.
// Before, the walk sent it and failed.
#[tokio::test]
async fn another_processs_cursor_is_never_sent_to_this_processs_server() {
    let redis = Redis::start().await;
    let server = || {
        paged(
            "600000,300",
            &["--cursor-epoch-per-process", "--cursor-refusal-code=-32001"],
        )
    };
    let first = start_ready(config(vec![server()], shared(redis.url(), &["s"]))).await;
    let listed = first.list_tools(&a()).await.expect("list").len();
    assert!(
        eventually(Duration::from_secs(10), || first.cache_stats().l3.writes
            >= 3)
        .await,
        "the whole list is shared: {:?}",
        first.cache_stats()
    );
    tokio::time::sleep(Duration::from_millis(400)).await; // the later pages expire (deliberate)
    let second = start_ready(config(vec![server()], shared(redis.url(), &["s"]))).await;
    let tools = second
        .list_tools(&a())
        .await
        .expect("listed past the foreign cursor");
    assert_eq!(tools.len(), listed);
    assert!(
        second.cache_stats().l3.hits >= 1,
        "{:?}",
        second.cache_stats()
    );
    second.shutdown().await;
    first.shutdown().await;
}

/// Another process sharing the cache directory holds the floors' lock (stopped, or
/// stuck on a disk) while this one's floors rose: shutdown gives up on the floors after
/// a bound, and every audit record is written first, whatever the lock.
#[tokio::test]
async fn shutdown_writes_the_audit_trail_and_does_not_wait_for_a_floors_lock_held_elsewhere() {
    use std::os::fd::AsRawFd;
    let redis = Redis::start().await;
    let k = key_file("l3-held", "hd-0123456789abcdef0123456789abcdef", 0o600);
    let dir = temp_file("l3-held-dir");
    let audit = temp_file("l3-held-audit");
    let mut c = config(
        vec![demo_server("s", &[])],
        SharedConfig {
            key_file: Some(k),
            ..shared(redis.url(), &["s"])
        },
    );
    c.cache.dir = Some(dir.clone());
    c.audit.path = Some(audit.clone());
    let h = start_ready(c).await;
    h.list_tools(&a()).await.expect("list");
    // The generation seen is kept on disk, which makes the floors' lock file.
    let lock = eventually(Duration::from_secs(10), || {
        std::fs::read_dir(&dir).is_ok_and(|d| {
            d.flatten().any(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with("__shared-floors-") && name.ends_with(".lock")
            })
        })
    })
    .await;
    assert!(lock, "the floors were kept");
    let lock = std::fs::read_dir(&dir)
        .expect("dir")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with(".lock"))
        .expect("lock file");
    let held = std::fs::File::open(&lock).expect("open lock");
    // SAFETY: flock on a descriptor this test owns.
    assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX) }, 0);
    // The server's lists change while another process moves the generation on: this
    // one's floor rises when it reads it, and the floors' writer waits for the lock.
    move_generation(&redis, "s").await;
    h.call_tool(&a(), "s__grow", json!({})).await.expect("grow");
    let mut grown = false;
    for _ in 0..200 {
        let tools = h.list_tools(&a()).await.expect("list");
        if tools.iter().any(|t| t.name.ends_with("grown_0")) {
            grown = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(grown, "the change was read");
    for i in 0..20 {
        h.call_tool(&a(), "s__echo", json!({"text": format!("{i}")}))
            .await
            .expect("echo");
    }
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(60), h.shutdown())
        .await
        .expect("shutdown returned while the lock is held");
    let took = started.elapsed();
    let records = audit_records(&audit);
    let finished = records.iter().filter(|r| r["event"] == "finished").count();
    assert_eq!(finished, 21, "every call's record written ({took:?})");
    drop(held);
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_file(audit);
}
