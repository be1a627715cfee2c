//! What a call through mcp-harness costs, side by side with a raw client and rmcp's own
//! client on the same servers, in one run. `cargo bench` prints one `BENCH name value
//! unit` line per figure at the end (see BENCHMARKS.md for what each means).
//!
//! Servers: an rmcp 3.11 echo server (this binary re-executed with `MCP_BENCH_ROLE`,
//! running `examples/rmcp_server.rs`) and the demo server of the `mcp-harness` binary.
//! Clients: `raw` (one writer task, one reader task, ids matched in a map: the floor of
//! pipes plus JSON), `rmcp` (rmcp's client, modern lifecycle), `harness`
//! (`HarnessHandle::call_tool` with the permission check, routing, an audit file and the
//! cache). Every client gets a server process of its own; every figure is the median of
//! several samples, printed with the lowest and highest sample. `MCP_BENCH_QUICK=1`
//! shortens every measurement; `MCP_BENCH_SAMPLE` (0 to 1) sets the share of calls the
//! telemetry section's sampled child traces (one in ten by default).

#[path = "../examples/rmcp_server.rs"]
mod rmcp_server;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mcp_harness::audit::AuditConfig;
use mcp_harness::registry::cache::CacheConfig;
use mcp_harness::registry::cache::CacheKey;
use mcp_harness::registry::cache::shared::{SharedCache, SharedConfig};
use mcp_harness::{Caller, Harness, HarnessConfig, HarnessHandle, ServerConfig, ServerState};
use parking_lot::Mutex;

use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RoleClient, RunningService};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};

type Call = Pin<Box<dyn Future<Output = bool> + Send>>;

/// The bench process's allocator: the system's (glibc's), as an embedder that sets none
/// runs, unless `MCP_BENCH_ALLOC=mimalloc` asks for the one the `mcp-harness` binary (and
/// so the demo server and `serve`) runs on. The clients compared share it.
struct BenchAlloc;

/// 0: not yet read, 1: the system's, 2: mimalloc. Read once, at the first allocation
/// (the process's first thread, before any other exists), and fixed from then on, so
/// that every block is freed by the allocator that gave it.
static ALLOC_CHOICE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

impl BenchAlloc {
    fn system() -> bool {
        let mut choice = ALLOC_CHOICE.load(Ordering::Relaxed);
        if choice == 0 {
            // getenv, not std::env: it must not allocate.
            // SAFETY: a NUL-terminated name; the value is read before any thread can
            // change the environment.
            let value = unsafe { libc::getenv(c"MCP_BENCH_ALLOC".as_ptr()) };
            // SAFETY: getenv's result is NULL or a NUL-terminated string.
            let mimalloc = !value.is_null()
                && unsafe { std::ffi::CStr::from_ptr(value) }.to_bytes() == b"mimalloc";
            choice = if mimalloc { 2 } else { 1 };
            ALLOC_CHOICE.store(choice, Ordering::Relaxed);
        }
        choice == 1
    }
}

// SAFETY: each call goes to one allocator, the same one for the process's whole life.
unsafe impl std::alloc::GlobalAlloc for BenchAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        if BenchAlloc::system() {
            unsafe { std::alloc::System.alloc(layout) }
        } else {
            unsafe { mimalloc::MiMalloc.alloc(layout) }
        }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        if BenchAlloc::system() {
            unsafe { std::alloc::System.dealloc(ptr, layout) }
        } else {
            unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
        }
    }
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        if BenchAlloc::system() {
            unsafe { std::alloc::System.alloc_zeroed(layout) }
        } else {
            unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
        }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, size: usize) -> *mut u8 {
        if BenchAlloc::system() {
            unsafe { std::alloc::System.realloc(ptr, layout, size) }
        } else {
            unsafe { mimalloc::MiMalloc.realloc(ptr, layout, size) }
        }
    }
}

#[global_allocator]
static ALLOCATOR: BenchAlloc = BenchAlloc;

/// One way of calling `echo`.
#[derive(Clone)]
enum Client {
    Raw(Arc<RawStdio>),
    /// Raw stdio to a gateway: `s__echo`.
    RawGateway(Arc<RawStdio>),
    /// Raw HTTP: the URL, and the tool and bearer token (a gateway's) if any.
    RawHttp(
        reqwest::Client,
        String,
        Option<(&'static str, &'static str)>,
    ),
    Rmcp(Arc<RunningService<RoleClient, ()>>),
    Harness(HarnessHandle, Caller, &'static str),
}

const META: &str = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"raw","version":"0"}}"#;

fn echo_request(id: u64) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"hi"}},{META}}}}}"#
    )
}

fn gateway_echo_request(id: u64) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"s__echo","arguments":{{"text":"hi"}},{META}}}}}"#
    )
}

fn tools_list_request(id: u64) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/list","params":{{{META}}}}}"#)
}

/// The reqwest client every HTTP client here uses, rmcp's included: pooled
/// connections with `TCP_NODELAY`, as the harness builds its own.
fn tuned_reqwest() -> reqwest::Client {
    reqwest::Client::builder()
        .tcp_nodelay(true)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("reqwest client")
}

impl Client {
    fn call(&self) -> Call {
        match self.clone() {
            Client::Raw(raw) => Box::pin(async move { raw.call().await }),
            Client::RawGateway(raw) => {
                Box::pin(async move { raw.send(gateway_echo_request).await })
            }
            Client::RawHttp(client, url, gateway) => Box::pin(async move {
                static ID: AtomicU64 = AtomicU64::new(1);
                let id = ID.fetch_add(1, Ordering::Relaxed);
                let (body, tool) = match gateway {
                    Some((tool, _)) => (gateway_echo_request(id), tool),
                    None => (echo_request(id), "echo"),
                };
                let mut request = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .header("accept", "application/json, text/event-stream")
                    .header("mcp-protocol-version", "2026-07-28")
                    .header("mcp-method", "tools/call")
                    .header("mcp-name", tool);
                if let Some((_, token)) = gateway {
                    request = request.bearer_auth(token);
                }
                let response = request.body(body).send().await;
                match response {
                    Ok(r) => r
                        .bytes()
                        .await
                        .is_ok_and(|b| b.windows(6).any(|w| w == b"result")),
                    Err(_) => false,
                }
            }),
            Client::Rmcp(service) => Box::pin(async move {
                let mut args = serde_json::Map::new();
                args.insert("text".into(), json!("hi"));
                let params = rmcp::model::CallToolRequestParams::new("echo").with_arguments(args);
                service.peer().call_tool(params).await.is_ok()
            }),
            // Named as `server__tool`, as the other clients name their one server: a bare
            // name is routed from the servers' tool lists, which rmcp's server marks
            // `ttlMs: 0` (re-list on every call); see `bare_name` for that cost.
            Client::Harness(h, caller, tool) => Box::pin(async move {
                h.call_tool(&caller, tool, json!({"text": "hi"}))
                    .await
                    .is_ok()
            }),
        }
    }
}

/// The floor: one writer task, one reader task, ids in a map.
struct RawStdio {
    tx: mpsc::UnboundedSender<Vec<u8>>,
    pending: Arc<Mutex<HashMap<u64, oneshot::Sender<()>>>>,
    next: AtomicU64,
    _child: tokio::process::Child,
}

impl RawStdio {
    fn spawn(mut cmd: tokio::process::Command) -> Arc<RawStdio> {
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn server");
        let mut stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
        tokio::spawn(async move {
            let mut buf = Vec::new();
            while let Some(line) = rx.recv().await {
                buf.extend_from_slice(&line);
                while let Ok(more) = rx.try_recv() {
                    buf.extend_from_slice(&more);
                }
                if stdin.write_all(&buf).await.is_err() || stdin.flush().await.is_err() {
                    return;
                }
                buf.clear();
            }
        });
        let pending: Arc<Mutex<HashMap<u64, oneshot::Sender<()>>>> = Arc::default();
        let p = pending.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                if let Some(id) = v["id"].as_u64()
                    && let Some(tx) = p.lock().remove(&id)
                {
                    let _ = tx.send(());
                }
            }
        });
        Arc::new(RawStdio {
            tx,
            pending,
            next: AtomicU64::new(1),
            _child: child,
        })
    }

    async fn call(&self) -> bool {
        self.send(echo_request).await
    }

    /// The server process's id.
    fn pid(&self) -> Option<u32> {
        self._child.id()
    }

    /// One request built by `request` from its id, and its answer.
    async fn send(&self, request: fn(u64) -> String) -> bool {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().insert(id, tx);
        let mut line = request(id).into_bytes();
        line.push(b'\n');
        if self.tx.send(line).is_err() {
            return false;
        }
        rx.await.is_ok()
    }
}

/// One figure: the median of its samples, and the lowest and highest sample.
struct Figure {
    name: String,
    value: f64,
    low: f64,
    high: f64,
    unit: &'static str,
    /// In the order they were taken.
    samples: Vec<f64>,
    /// Which `…_rounds` call took them: figures of the same one pair up round by round.
    rounds: Option<usize>,
}

struct Bench {
    lines: Vec<Figure>,
    quick: bool,
    /// `…_rounds` calls so far.
    round_sets: usize,
}

impl Bench {
    /// A figure measured once.
    fn record(&mut self, name: impl Into<String>, value: f64, unit: &'static str) {
        self.record_samples(name, vec![value], unit);
    }

    /// A figure from several samples: their median, with the spread.
    fn record_samples(
        &mut self,
        name: impl Into<String>,
        mut samples: Vec<f64>,
        unit: &'static str,
    ) {
        let name = name.into();
        let taken = samples.clone();
        samples.sort_by(f64::total_cmp);
        let (low, high) = (samples[0], samples[samples.len() - 1]);
        let value = samples[samples.len() / 2];
        if samples.len() > 1 {
            eprintln!("  {name:<44} {value:>12.2} {unit:<8} [{low:.2} … {high:.2}]");
        } else {
            eprintln!("  {name:<44} {value:>12.2} {unit}");
        }
        self.lines.push(Figure {
            name,
            value,
            low,
            high,
            unit,
            samples: taken,
            rounds: None,
        });
    }

    fn next_round_set(&mut self) -> usize {
        self.round_sets += 1;
        self.round_sets
    }

    /// Marks the last figure as taken in the rounds of `set`.
    fn mark_rounds(&mut self, set: usize) {
        if let Some(f) = self.lines.last_mut() {
            f.rounds = Some(set);
        }
    }

    /// `f(a, b)` of two figures, sample by sample when they were measured in the same
    /// rounds (the median of the rounds' values, with their spread), else of their
    /// medians.
    fn combine(
        &mut self,
        name: String,
        a: &str,
        b: &str,
        f: fn(f64, f64) -> f64,
        unit: &'static str,
    ) {
        let find = |n: &str| self.lines.iter().find(|x| x.name == n);
        let (Some(x), Some(y)) = (find(a), find(b)) else {
            return;
        };
        let paired = x.rounds.is_some() && x.rounds == y.rounds;
        let set = if paired { x.rounds } else { None };
        let rounds: Vec<f64> = if paired {
            x.samples
                .iter()
                .zip(&y.samples)
                .map(|(a, b)| f(*a, *b))
                .collect()
        } else {
            vec![f(x.value, y.value)]
        };
        // A round that failed (a rate of 0) leaves out that round, not the figure.
        let rounds: Vec<f64> = rounds.into_iter().filter(|v| v.is_finite()).collect();
        if !rounds.is_empty() {
            self.record_samples(name, rounds, unit);
            // Its rounds are its inputs': it pairs with their other figures in turn.
            if let Some(set) = set {
                self.mark_rounds(set);
            }
        }
    }

    fn get(&self, name: &str) -> f64 {
        self.lines
            .iter()
            .find(|f| f.name == name)
            .map_or(f64::NAN, |f| f.value)
    }

    /// Samples per figure.
    fn samples(&self) -> usize {
        if self.quick { 3 } else { 7 }
    }

    /// One throughput sample's length.
    fn duration(&self) -> Duration {
        if self.quick {
            Duration::from_millis(200)
        } else {
            Duration::from_millis(700)
        }
    }

    /// Sequential calls, p50 and p99 latency in microseconds, of several clients in
    /// rounds (one client or more): each round takes one sample of each, in
    /// an order rotated from round to round, so that the machine's drift (which moves
    /// figures by 10–30 % within minutes here) falls on all of them alike, and a ratio
    /// can be taken within each round ([`Bench::combine`]).
    async fn latency_rounds(&mut self, clients: &[(&str, &Client)]) {
        let n = if self.quick { 200 } else { 1000 };
        for (_, client) in clients {
            for _ in 0..n / 5 {
                client.call().await;
            }
        }
        let (mut p50, mut p99) = (
            vec![Vec::new(); clients.len()],
            vec![Vec::new(); clients.len()],
        );
        for round in 0..self.samples() {
            for j in 0..clients.len() {
                let i = (round + j) % clients.len();
                let (name, client) = clients[i];
                let mut samples = Vec::with_capacity(n);
                for _ in 0..n {
                    let t = Instant::now();
                    assert!(client.call().await, "{name}: a call failed");
                    samples.push(t.elapsed().as_secs_f64() * 1e6);
                }
                samples.sort_by(f64::total_cmp);
                p50[i].push(samples[n / 2]);
                p99[i].push(samples[n * 99 / 100]);
            }
        }
        let set = self.next_round_set();
        for (((name, _), p50), p99) in clients.iter().zip(p50).zip(p99) {
            self.record_samples(format!("{name}_p50"), p50, "us");
            self.mark_rounds(set);
            self.record_samples(format!("{name}_p99"), p99, "us");
            self.mark_rounds(set);
        }
    }

    /// Calls per second with `inflight` callers looping, of several clients in rounds
    /// as [`Bench::latency_rounds`] takes them.
    async fn rate_rounds(&mut self, clients: &[(&str, &Client)], inflight: usize) {
        let mut rates = vec![Vec::new(); clients.len()];
        for round in 0..self.samples() {
            for j in 0..clients.len() {
                let i = (round + j) % clients.len();
                rates[i].push(rate(clients[i].1, inflight, self.duration()).await);
            }
        }
        let set = self.next_round_set();
        for ((name, _), rates) in clients.iter().zip(rates) {
            self.record_samples(format!("{name}_c{inflight}"), rates, "calls/s");
            self.mark_rounds(set);
        }
    }

    /// Microseconds per `op`, one mean of `n` sequential runs per sample.
    async fn per_op<F, Fut>(&mut self, name: &str, n: usize, mut op: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = ()>,
    {
        for _ in 0..n / 5 {
            op().await;
        }
        let mut samples = Vec::new();
        for _ in 0..self.samples() {
            let t = Instant::now();
            for _ in 0..n {
                op().await;
            }
            samples.push(t.elapsed().as_secs_f64() * 1e6 / n as f64);
        }
        self.record_samples(name, samples, "us");
    }

    /// Latency and throughput at 1, 16 and 64 in flight of several clients, in rounds.
    async fn all_rounds(&mut self, clients: &[(&str, &Client)]) {
        self.latency_rounds(clients).await;
        for c in [1, 16, 64] {
            self.rate_rounds(clients, c).await;
        }
    }
}

/// Calls per second of `inflight` callers looping on `client` for `duration`.
async fn rate(client: &Client, inflight: usize, duration: Duration) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + duration;
    let mut tasks = Vec::new();
    for _ in 0..inflight {
        let (client, done) = (client.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                if client.call().await {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let start = Instant::now();
    for t in tasks {
        let _ = t.await;
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64().max(1e-9)
}

fn harness_bin() -> String {
    env!("CARGO_BIN_EXE_mcp-harness").to_string()
}

fn self_cmd(role: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(std::env::current_exe().expect("bench exe"));
    cmd.env("MCP_BENCH_ROLE", role);
    cmd
}

fn demo_cmd(args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(harness_bin());
    cmd.arg("demo-server").args(args);
    cmd
}

/// This process's scratch directory for audit files, caches, records and configs.
fn scratch() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("mcp-harness-bench-{}", std::process::id()))
}

fn temp(tag: &str) -> std::path::PathBuf {
    let dir = scratch();
    let _ = std::fs::create_dir_all(&dir);
    dir.join(tag)
}

/// Removes the scratch directories of bench processes that are gone (a run stopped
/// with Ctrl-C leaves its own behind).
fn sweep_stale_scratch() {
    if !std::path::Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix("mcp-harness-bench-"))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid
            && !std::path::Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Removes the scratch directory when the process's `main` returns: a full run writes
/// gigabytes of audit records.
struct RemoveScratch;

impl Drop for RemoveScratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(scratch());
    }
}

fn config(server: ServerConfig, audit: bool) -> HarnessConfig {
    let mut c = HarnessConfig {
        servers: vec![server],
        ..HarnessConfig::default()
    };
    c.permissions
        .entry("bench".into())
        .or_default()
        .insert("*".into(), vec!["*".into()]);
    c.cache = CacheConfig {
        dir: Some(temp("cache")),
        ..CacheConfig::default()
    };
    if audit {
        c.audit = AuditConfig {
            path: Some(temp("audit.jsonl")),
            ..AuditConfig::default()
        };
    }
    c
}

async fn ready(h: &HarnessHandle) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if h.status().iter().all(|s| s.state == ServerState::Ready) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "servers not ready: {:?}",
        h.status()
            .iter()
            .map(|s| (s.id.clone(), s.state))
            .collect::<Vec<_>>()
    );
}

async fn harness_client(server: ServerConfig, audit: bool) -> (HarnessHandle, Client) {
    let h = Harness::spawn(config(server, audit))
        .await
        .expect("harness");
    ready(&h).await;
    let caller = Caller::agent("bench").with_auth_context("bench");
    (h.clone(), Client::Harness(h, caller, "s__echo"))
}

async fn http_server(mut cmd: tokio::process::Command) -> (tokio::process::Child, String) {
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("spawn HTTP server");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .await
        .expect("read");
    (
        child,
        line.trim().trim_start_matches("listening ").to_string(),
    )
}

fn rss_kb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0.0)
}

fn count_lines(path: &std::path::Path, needle: &str) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .count()
}

async fn stdio_section(b: &mut Bench) {
    eprintln!("stdio, echo:");
    for (server, cmd) in [
        ("rmcp", self_cmd as fn(&str) -> tokio::process::Command),
        ("demo", |_: &str| demo_cmd(&["bench"])),
    ] {
        // All three alive at once (idle servers cost nothing), measured in rounds.
        let raw = Client::Raw(RawStdio::spawn(cmd("stdio")));
        let rmcp = ().serve_with_lifecycle(
            rmcp::transport::TokioChildProcess::new(cmd("stdio")).expect("child"),
            ClientLifecycleMode::Discover {
                preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
            },
        );
        let rmcp = Client::Rmcp(Arc::new(rmcp.await.expect("rmcp client")));
        let config = if server == "rmcp" {
            rmcp_stdio_config()
        } else {
            stdio_config(&cmd("stdio"))
        };
        let (h, client) = harness_client(config, true).await;
        let names = ["raw", "rmcp", "harness"].map(|c| format!("stdio_{server}_{c}"));
        b.all_rounds(&[(&names[0], &raw), (&names[1], &rmcp), (&names[2], &client)])
            .await;
        h.shutdown().await;
    }
}

async fn http_section(b: &mut Bench) {
    eprintln!("Streamable HTTP on loopback, echo:");
    let rmcp_cmd = || {
        let mut cmd = self_cmd("http");
        cmd.arg("--json");
        cmd
    };
    let demo = || demo_cmd(&["bench", "--http", "127.0.0.1:0"]);
    for (server, cmd) in [
        ("rmcp", &rmcp_cmd as &dyn Fn() -> tokio::process::Command),
        ("demo", &demo),
    ] {
        // Each client on a server of its own, all alive at once, measured in rounds.
        let (raw_child, url) = http_server(cmd()).await;
        let raw = Client::RawHttp(tuned_reqwest(), url.clone(), None);

        // rmcp's client on the same tuned reqwest client, allowed as many requests in
        // flight as the others (its default is 16).
        let (rmcp_child, url) = http_server(cmd()).await;
        let transport = rmcp::transport::StreamableHttpClientTransport::with_client(
            tuned_reqwest(),
            rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
                url.clone(),
            )
            .max_concurrent_requests(64),
        );
        let modern = ClientLifecycleMode::Discover {
            preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
        };
        let rmcp = Client::Rmcp(Arc::new(
            ().serve_with_lifecycle(transport, modern)
                .await
                .expect("rmcp HTTP client"),
        ));

        let (child, url) = http_server(cmd()).await;
        let (h, client) = harness_client(ServerConfig::http("s", &url), true).await;
        let names = ["raw", "rmcp", "harness"].map(|c| format!("http_{server}_{c}"));
        b.all_rounds(&[(&names[0], &raw), (&names[1], &rmcp), (&names[2], &client)])
            .await;
        h.shutdown().await;
        drop(rmcp);
        drop((child, rmcp_child, raw_child));
    }
}

/// A stdio server as the harness starts it, from the command the raw client runs.
fn stdio_config(command: &tokio::process::Command) -> ServerConfig {
    let std = command.as_std();
    let program = std.get_program().to_string_lossy().to_string();
    let args: Vec<String> = std
        .get_args()
        .map(|a| a.to_string_lossy().to_string())
        .collect();
    ServerConfig::stdio("s", program, args)
}

/// rmcp's echo server on stdio as the harness starts it.
fn rmcp_stdio_config() -> ServerConfig {
    let mut config = stdio_config(&self_cmd("stdio"));
    if let mcp_harness::TransportSpec::Stdio(s) = &mut config.transport {
        // The harness passes its servers a minimal environment: the allocator choice
        // goes along by name, so that all three clients' servers run on the same one.
        let mut env = vec![("MCP_BENCH_ROLE".to_string(), "stdio".to_string())];
        if let Ok(alloc) = std::env::var("MCP_BENCH_ALLOC") {
            env.push(("MCP_BENCH_ALLOC".to_string(), alloc));
        }
        s.env = env.into_iter().collect();
    }
    config
}

/// The stdio demo server as the harness starts it.
fn demo_config() -> ServerConfig {
    ServerConfig::stdio("s", harness_bin(), ["demo-server", "bench"])
}

async fn further_section(b: &mut Bench) {
    eprintln!("cache, names, restart, audit (stdio demo server):");
    let n = if b.quick { 200 } else { 2000 };
    // The floor of a listing: one tools/list round trip from the raw client.
    let raw = RawStdio::spawn(demo_cmd(&["bench"]));
    b.per_op("tools_list_round_trip_raw", n / 4, || async {
        assert!(raw.send(tools_list_request).await);
    })
    .await;
    drop(raw);

    let (h, client) = harness_client(demo_config(), true).await;
    let caller = Caller::agent("bench").with_auth_context("bench");
    let listed = h.list_tools(&caller).await.expect("list").len();
    b.record("cache_hit_list_tools_size", listed as f64, "tools");
    b.per_op("cache_hit_list_tools", n, || async {
        h.list_tools(&caller).await.expect("cached list");
    })
    .await;
    b.per_op("tools_list_round_trip_harness", n / 4, || async {
        h.request("s", "tools/list", None)
            .await
            .expect("round trip");
    })
    .await;
    let hit = b.get("cache_hit_list_tools");
    let (raw_trip, trip) = (
        b.get("tools_list_round_trip_raw"),
        b.get("tools_list_round_trip_harness"),
    );
    b.record("cache_hit_vs_raw_round_trip", raw_trip / hit, "ratio");
    b.record("cache_hit_vs_harness_round_trip", trip / hit, "ratio");

    // A bare name is routed from the tool lists (the demo server's say ttlMs 60 s).
    let bare = Client::Harness(h.clone(), caller.clone(), "echo");
    b.latency_rounds(&[
        ("bare_name_demo_harness", &bare),
        ("qualified_name_demo_harness", &client),
    ])
    .await;

    // SIGKILL to the first successful call, the backoff's first delay beside it.
    let mut recovery = Vec::new();
    for _ in 0..if b.quick { 2 } else { 5 } {
        let pid = h.server_status("s").and_then(|s| s.pid).expect("pid");
        let t = Instant::now();
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
        while !client.call().await || h.server_status("s").and_then(|s| s.pid) == Some(pid) {}
        recovery.push(t.elapsed().as_secs_f64() * 1e3);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    b.record_samples("sigkill_to_first_success", recovery, "ms");
    b.record(
        "restart_backoff_first_delay",
        mcp_harness::RestartConfig::default()
            .min_delay
            .as_secs_f64()
            * 1e3,
        "ms",
    );
    h.shutdown().await;
    let (on, on_client) = harness_client(demo_config(), true).await;
    let (off, off_client) = harness_client(demo_config(), false).await;
    b.rate_rounds(&[("audit_on", &on_client), ("audit_off", &off_client)], 16)
        .await;
    on.shutdown().await;
    off.shutdown().await;
    b.combine(
        "audit_on_vs_off".into(),
        "audit_on_c16",
        "audit_off_c16",
        |a, b| a / b,
        "ratio",
    );
}

/// Discovery and memory, in a process of its own (`MCP_BENCH_ROLE=discovery`), so that
/// the memory figures start from a fresh heap.
async fn discovery_section(b: &mut Bench) {
    let servers = if b.quick { 20 } else { 200 };
    eprintln!("discovery of {servers} stdio servers (a fresh process):");
    let record = temp("discovery.jsonl");
    let cache = temp("discovery-cache");
    let _ = std::fs::remove_dir_all(&cache);
    let mut config = HarnessConfig::default();
    for i in 0..servers {
        let id = format!("s{i}");
        config.servers.push(ServerConfig::stdio(
            &id,
            harness_bin(),
            ["demo-server", &id, "--record", &record.to_string_lossy()],
        ));
    }
    config
        .permissions
        .entry("bench".into())
        .or_default()
        .insert("*".into(), vec!["*".into()]);
    config.cache = CacheConfig {
        dir: Some(cache.clone()),
        ..CacheConfig::default()
    };
    let caller = Caller::agent("bench").with_auth_context("bench");
    let rss_before = rss_kb();
    let t = Instant::now();
    let h = Harness::spawn(config.clone()).await.expect("harness");
    ready(&h).await;
    let tools = h.list_tools(&caller).await.expect("cold list");
    let cold = t.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rss_after = rss_kb();
    b.record(
        format!("cold_discovery_{servers}_servers_wall"),
        cold.as_secs_f64() * 1e3,
        "ms",
    );
    b.record("cold_discovery_tools", tools.len() as f64, "tools");
    b.record(
        "cold_discovery_tools_list_requests",
        count_lines(&record, "\"tools/list\"") as f64,
        "requests",
    );
    b.record("fresh_process_rss_before_harness", rss_before, "kB");
    b.record("harness_rss_with_servers", rss_after, "kB");
    b.record(
        "harness_memory_per_idle_server",
        (rss_after - rss_before) / servers as f64,
        "kB",
    );
    h.shutdown().await;
    drop(h);
    let before = count_lines(&record, "\"tools/list\"");
    let t = Instant::now();
    let h = Harness::spawn(config.clone()).await.expect("harness");
    ready(&h).await;
    let warm_tools = h.list_tools(&caller).await.expect("warm list");
    let warm = t.elapsed();
    b.record(
        format!("warm_start_{servers}_servers_wall"),
        warm.as_secs_f64() * 1e3,
        "ms",
    );
    b.record(
        "warm_start_tools_list_requests",
        (count_lines(&record, "\"tools/list\"") - before) as f64,
        "requests",
    );
    assert_eq!(warm_tools.len(), tools.len());
    h.shutdown().await;
    shared_layer(b, &config, &record, &caller, servers, tools.len()).await;
    let _ = std::fs::remove_file(record);
    let _ = std::fs::remove_dir_all(cache);
}

/// A Redis server on a free loopback port for the shared layer figures; killed on drop.
struct BenchRedis(std::process::Child, String);

impl BenchRedis {
    async fn start() -> Option<BenchRedis> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .ok()?
            .port();
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
            .ok()?;
        let redis = BenchRedis(child, format!("redis://127.0.0.1:{port}"));
        for _ in 0..500 {
            if let Ok(mut c) = redis.connection().await
                && redis::cmd("PING")
                    .query_async::<String>(&mut c)
                    .await
                    .is_ok()
            {
                return Some(redis);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    async fn connection(&self) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        redis::Client::open(self.1.as_str())?
            .get_multiplexed_async_connection()
            .await
    }
}

impl Drop for BenchRedis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The shared layer (L3): a second harness with an empty disk and empty memory, over
/// the same servers, once a first one has filled Redis; and one L3 hit against one
/// `tools/list` round trip.
async fn shared_layer(
    b: &mut Bench,
    config: &HarnessConfig,
    record: &std::path::Path,
    caller: &Caller,
    servers: usize,
    tools: usize,
) {
    let Some(redis) = BenchRedis::start().await else {
        eprintln!("redis-server not found: no shared layer figures");
        return;
    };
    let mut config = config.clone();
    config.cache = CacheConfig {
        dir: None,
        shared: Some(SharedConfig::new(
            redis.1.clone(),
            (0..servers).map(|i| format!("s{i}")).collect(),
        )),
        ..CacheConfig::default()
    };
    let first = Harness::spawn(config.clone()).await.expect("harness");
    ready(&first).await;
    first.list_tools(caller).await.expect("list");
    first.shutdown().await; // waits for its writes to Redis
    let before = count_lines(record, "\"tools/list\"");
    let t = Instant::now();
    let h = Harness::spawn(config).await.expect("harness");
    ready(&h).await;
    let listed = h.list_tools(caller).await.expect("L3 list");
    let wall = t.elapsed();
    assert_eq!(listed.len(), tools);
    b.record(
        format!("l3_start_{servers}_servers_wall"),
        wall.as_secs_f64() * 1e3,
        "ms",
    );
    b.record(
        "l3_start_tools_list_requests",
        (count_lines(record, "\"tools/list\"") - before) as f64,
        "requests",
    );
    b.record(
        "l3_start_vs_disk_warm_start",
        b.get(&format!("l3_start_{servers}_servers_wall"))
            / b.get(&format!("warm_start_{servers}_servers_wall")),
        "ratio",
    );
    // One entry as stored, to look it up directly.
    let mut c = redis.connection().await.expect("redis");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("mcp-harness:list:s0:*")
        .query_async(&mut c)
        .await
        .expect("KEYS");
    let stored: Value = redis::cmd("GET")
        .arg(keys.first().expect("the first harness wrote s0's list"))
        .query_async::<String>(&mut c)
        .await
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .expect("an entry");
    let key = CacheKey {
        server: "s0".into(),
        fingerprint: stored["fingerprint"].as_str().unwrap_or("").into(),
        client: stored["client"].as_str().unwrap_or("").into(),
        method: "tools/list".into(),
        param: None,
        scope: "public".into(),
    };
    let protocol = stored["protocol"].as_str().unwrap_or("").to_string();
    let shared = SharedCache::new(SharedConfig::new(redis.1.clone(), vec!["s0".into()]), None)
        .expect("shared layer");
    let n = if b.quick { 200 } else { 2000 };
    b.per_op("l3_hit_tools_list", n, || async {
        assert!(shared.get(&key, &protocol).await.hit.is_some());
    })
    .await;
    b.per_op("l3_tools_list_round_trip_harness", n / 4, || async {
        h.request("s0", "tools/list", None)
            .await
            .expect("round trip");
    })
    .await;
    b.record(
        "l3_hit_vs_harness_round_trip",
        b.get("l3_tools_list_round_trip_harness") / b.get("l3_hit_tools_list"),
        "ratio",
    );
    h.shutdown().await;
}

/// Runs the discovery section in a child process and takes its figures.
fn discovery_in_child(b: &mut Bench) {
    in_child(b, "discovery");
}

/// Runs the section `role` in a child process (a fresh heap, its own global subscriber)
/// and takes its figures.
fn in_child(b: &mut Bench, role: &str) {
    let out = std::process::Command::new(std::env::current_exe().expect("bench exe"))
        .env("MCP_BENCH_ROLE", role)
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("discovery process");
    assert!(out.status.success(), "{role} process failed");
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let mut f = line.split_whitespace();
        if f.next() != Some("BENCH") {
            continue;
        }
        let (Some(name), Some(value), Some(unit)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let unit: &'static str = match unit {
            "ms" => "ms",
            "kB" => "kB",
            "tools" => "tools",
            "us" => "us",
            "ratio" => "ratio",
            "calls/s" => "calls/s",
            _ => "requests",
        };
        b.lines.push(Figure {
            name: name.to_string(),
            value: value.parse().unwrap_or(f64::NAN),
            low: f64::NAN,
            high: f64::NAN,
            unit,
            samples: Vec::new(),
            rounds: None,
        });
    }
}

/// 16 calls in flight on the stdio demo server through the harness, with spans (every
/// one, or one trace in `sample`) and metrics (every second) exported over OTLP/HTTP to
/// a local receiver (`on`), or with no OpenTelemetry layer and no meter.
async fn telemetry_role(b: &mut Bench, on: bool, sample: f64) {
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::layer::SubscriberExt;
    let provider = if on {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        // A receiver that takes every export and answers 200 (what a collector costs
        // is not the harness's).
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let service = hyper::service::service_fn(
                    |req: hyper::Request<hyper::body::Incoming>| async move {
                        use http_body_util::BodyExt;
                        let _ = req.into_body().collect().await;
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(
                            http_body_util::Full::new(bytes::Bytes::new()),
                        ))
                    },
                );
                tokio::spawn(async move {
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await;
                });
            }
        });
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(format!("http://{addr}/v1/traces"));
        use opentelemetry_otlp::WithExportConfig;
        let exporter = exporter.build().expect("exporter");
        let processor = opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor::builder(
            exporter,
            opentelemetry_sdk::runtime::Tokio,
        )
        .build();
        // As the binary does: the harness decides at the root (`trace_sample_ratio`).
        let sampler = opentelemetry_sdk::trace::Sampler::ParentBased(Box::new(
            opentelemetry_sdk::trace::Sampler::AlwaysOn,
        ));
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(sampler)
            .build();
        let layer = mcp_harness::util::trace_context::layer(provider.tracer("bench"));
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
            .expect("subscriber");
        let metrics = opentelemetry_otlp::MetricExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(format!("http://{addr}/v1/metrics"))
            .build()
            .expect("metric exporter");
        let reader = opentelemetry_sdk::metrics::periodic_reader_with_async_runtime::PeriodicReader::builder(
            metrics,
            opentelemetry_sdk::runtime::Tokio,
        )
        .with_interval(Duration::from_secs(1))
        .build();
        let meters = opentelemetry_sdk::metrics::SdkMeterProvider::builder()
            .with_reader(reader)
            .build();
        Some((provider, meters))
    } else {
        None
    };
    let mut config = config(demo_config(), false);
    config.trace_sample_ratio = sample;
    let h = Harness::spawn(config).await.expect("harness");
    ready(&h).await;
    let client = Client::Harness(
        h.clone(),
        Caller::agent("bench").with_auth_context("bench"),
        "s__echo",
    );
    if let Some((_, meters)) = &provider {
        use opentelemetry::metrics::MeterProvider as _;
        h.export_metrics(&meters.meter("bench"));
    }
    let name = match (on, sample < 1.0) {
        (false, _) => "otel_off",
        (true, false) => "otel_on",
        (true, true) => "otel_sampled",
    };
    // The rate, and this process's CPU per call (the harness; when on, the exporter and
    // the receiver above, a task of this process): steadier than the rate on a shared
    // machine.
    let (mut rates, mut cpu) = (Vec::new(), Vec::new());
    for _ in 0..b.samples() {
        let before = cpu_us();
        let r = rate(&client, 16, b.duration()).await;
        cpu.push((cpu_us() - before) / (r * b.duration().as_secs_f64()).max(1.0));
        rates.push(r);
    }
    b.record_samples(format!("{name}_c16"), rates, "calls/s");
    b.record_samples(format!("{name}_cpu_per_call"), cpu, "us");
    h.shutdown().await;
    if let Some((provider, meters)) = provider {
        let _ = provider.shutdown();
        let _ = meters.shutdown();
    }
}

/// Single-flight latency and 64 in flight on a current-thread runtime (embedders
/// choose), raw and harness, on the stdio demo server.
fn current_thread_section(b: &mut Bench) {
    eprintln!("current-thread runtime, stdio demo server:");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut inner = Bench {
        lines: Vec::new(),
        quick: b.quick,
        // Its sets apart from the outer bench's, whose lines it joins.
        round_sets: b.round_sets + 1000,
    };
    rt.block_on(async {
        let raw = Client::Raw(RawStdio::spawn(demo_cmd(&["bench"])));
        let (h, client) = harness_client(demo_config(), true).await;
        let clients = [
            ("ct_stdio_demo_raw", &raw),
            ("ct_stdio_demo_harness", &client),
        ];
        inner.latency_rounds(&clients).await;
        inner.rate_rounds(&clients, 64).await;
        h.shutdown().await;
    });
    b.lines.extend(inner.lines);
}

/// The ratios and differences the targets name, round by round where both figures
/// were measured in the same rounds ([`Bench::combine`]).
fn ratios(b: &mut Bench) {
    let ratio = |a: f64, b: f64| a / b;
    for transport in ["stdio", "http"] {
        for server in ["rmcp", "demo"] {
            for (what, base) in [
                ("p50", "raw"),
                ("p50", "rmcp"),
                ("c64", "raw"),
                ("c64", "rmcp"),
            ] {
                b.combine(
                    format!("{transport}_{server}_{what}_harness_vs_{base}"),
                    &format!("{transport}_{server}_harness_{what}"),
                    &format!("{transport}_{server}_{base}_{what}"),
                    ratio,
                    "ratio",
                );
            }
        }
    }
    for what in ["p50", "c64"] {
        b.combine(
            format!("ct_stdio_demo_{what}_harness_vs_raw"),
            &format!("ct_stdio_demo_harness_{what}"),
            &format!("ct_stdio_demo_raw_{what}"),
            ratio,
            "ratio",
        );
    }
    for transport in ["stdio", "http"] {
        let figure = |client: &str, what: &str| format!("gw_{transport}_{client}_{what}");
        let overhead = format!("gw_{transport}_p50_overhead");
        b.combine(
            overhead.clone(),
            &figure("gateway", "p50"),
            &figure("direct", "p50"),
            |a, b| a - b,
            "us",
        );
        b.combine(
            format!("gw_{transport}_p50_overhead_beyond_hop"),
            &overhead,
            &figure("hop", "p50"),
            |a, b| a - b,
            "us",
        );
        b.combine(
            format!("gw_{transport}_c64_gateway_vs_direct"),
            &figure("gateway", "c64"),
            &figure("direct", "c64"),
            ratio,
            "ratio",
        );
    }
}

/// The bench gateway's token.
const GATEWAY_TOKEN: &str = "bench-token";

/// A gateway config fronting one server `s` (transport given as TOML), with grants, a
/// token, sealing keys and the audit file on.
fn gateway_config(transport: &str, tag: &str) -> std::path::PathBuf {
    let keys = temp(&format!("gw-{tag}.keys"));
    let key = mcp_harness::gateway::seal::new_key().expect("key");
    std::fs::write(&keys, format!("k1:{key}\n")).expect("keys");
    std::fs::set_permissions(
        &keys,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600),
    )
    .expect("chmod");
    let path = temp(&format!("gw-{tag}.toml"));
    let text = format!(
        r#"
[[servers]]
id = "s"
transport = {transport}

[permissions.bench]
"*" = ["*"]

[audit]
path = "{audit}"

[gateway]
keys_file = "{keys}"
tokens = [{{ sha256 = "{hash}", agent = "bench" }}]
"#,
        audit = temp(&format!("gw-{tag}-audit.jsonl")).display(),
        keys = keys.display(),
        hash = mcp_harness::util::hash::sha256_hex(GATEWAY_TOKEN.as_bytes()),
    );
    std::fs::write(&path, text).expect("gateway config");
    path
}

/// The raw client on `serve --stdio` in front of the demo server over stdio.
fn stdio_gateway() -> Client {
    let config = gateway_config(
        &format!(
            r#"{{ type = "stdio", command = "{}", args = ["demo-server", "bench"] }}"#,
            harness_bin()
        ),
        "stdio",
    );
    let mut cmd = tokio::process::Command::new(harness_bin());
    cmd.args(["serve", "--stdio", "--agent", "bench", "--config"])
        .arg(&config);
    Client::RawGateway(RawStdio::spawn(cmd))
}

/// `serve --listen` on loopback in front of the HTTP server at `url`, and its URL.
async fn http_gateway_for(url: &str) -> (tokio::process::Child, String) {
    let config = gateway_config(&format!(r#"{{ type = "http", url = "{url}" }}"#), "http");
    let mut cmd = tokio::process::Command::new(harness_bin());
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config);
    http_server(cmd).await
}

/// client → gateway → server against client → server: the raw clients, the demo server,
/// over stdio (`serve --stdio`) and Streamable HTTP (`serve --listen`).
async fn gateway_section(b: &mut Bench) {
    eprintln!("gateway, echo (raw client direct, and through `mcp-harness serve`):");
    let direct = Client::Raw(RawStdio::spawn(demo_cmd(&["bench"])));
    let gateway = stdio_gateway();
    // The floor of one more process on the path: `cat` echoes each request line, which
    // the raw client takes for its answer (same id). Its round trip is two wake-ups of
    // processes on other cores, which a gateway adds whatever it does.
    let hop = Client::Raw(RawStdio::spawn(tokio::process::Command::new("cat")));
    b.latency_rounds(&[
        ("gw_stdio_direct", &direct),
        ("gw_stdio_gateway", &gateway),
        ("gw_stdio_hop", &hop),
    ])
    .await;
    drop(hop);
    for c in [1, 16, 64] {
        b.rate_rounds(
            &[("gw_stdio_direct", &direct), ("gw_stdio_gateway", &gateway)],
            c,
        )
        .await;
    }
    drop((direct, gateway));

    let (upstream, url) = http_server(demo_cmd(&["bench", "--http", "127.0.0.1:0"])).await;
    let direct = Client::RawHttp(tuned_reqwest(), url.clone(), None);
    let (gateway_child, gateway_url) = http_gateway_for(&url).await;
    let gateway = Client::RawHttp(
        tuned_reqwest(),
        gateway_url,
        Some(("s__echo", GATEWAY_TOKEN)),
    );
    b.all_rounds(&[("gw_http_direct", &direct), ("gw_http_gateway", &gateway)])
        .await;
    drop(gateway_child);
    drop(upstream);
}

/// This process's CPU time (user + system), in microseconds.
fn cpu_us() -> f64 {
    // SAFETY: getrusage writes into the struct we pass and nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is always valid.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let us = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    us(usage.ru_utime) + us(usage.ru_stime)
}

/// A process's CPU time (user + system) from `/proc`, in microseconds (counted in clock
/// ticks: 10 ms at USER_HZ = 100).
fn process_cpu_us(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces): utime and stime are the
    // 12th and 13th.
    let rest = stat.rsplit_once(')')?.1;
    let mut fields = rest.split_whitespace().skip(11);
    let ticks: f64 = fields.next()?.parse::<f64>().ok()? + fields.next()?.parse::<f64>().ok()?;
    // SAFETY: sysconf reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some(ticks * 1e6 / hz)
}

/// `MCP_BENCH_ONLY=profile`: calls at 64 in flight on the demo server for
/// `MCP_BENCH_SECONDS` (default 10), for a profiler to watch, with the client's CPU time
/// per call. `MCP_BENCH_CLIENT=raw` profiles the raw client instead of the harness,
/// `MCP_BENCH_CLIENT=gateway` the raw client through `serve --stdio` (profile the
/// `serve` process; its CPU per call is `profile_serve_cpu_per_call`);
/// `MCP_BENCH_AUDIT=off` runs the harness without an audit log, to see what it costs;
/// `MCP_BENCH_PROFILE=list` profiles cached `list_tools` instead of calls;
/// `MCP_BENCH_TRANSPORT=http` puts the demo server on Streamable HTTP (the raw client,
/// the harness, or the raw client through `serve --listen`); `MCP_BENCH_SERVER=rmcp`
/// puts rmcp's echo server on stdio in its place (the raw client or the harness).
async fn profile_section() {
    let seconds: u64 = std::env::var("MCP_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let which = std::env::var("MCP_BENCH_CLIENT").unwrap_or_default();
    // `MCP_BENCH_SERVER=rmcp`: rmcp's echo server on stdio instead of the demo server.
    let rmcp = std::env::var("MCP_BENCH_SERVER").is_ok_and(|s| s == "rmcp");
    let http = if std::env::var("MCP_BENCH_TRANSPORT").is_ok_and(|t| t == "http") {
        Some(http_server(demo_cmd(&["bench", "--http", "127.0.0.1:0"])).await)
    } else {
        None
    };
    // `serve --listen` in front of the HTTP demo server, for `MCP_BENCH_CLIENT=gateway`.
    let mut http_gateway = None;
    let (h, client) = if let Some((_, url)) = &http {
        if which == "raw" {
            (None, Client::RawHttp(tuned_reqwest(), url.clone(), None))
        } else if which == "gateway" {
            let (child, gateway_url) = http_gateway_for(url).await;
            http_gateway = Some(child);
            let token = Some(("s__echo", GATEWAY_TOKEN));
            (None, Client::RawHttp(tuned_reqwest(), gateway_url, token))
        } else {
            let (h, client) = harness_client(ServerConfig::http("s", url), true).await;
            (Some(h), client)
        }
    } else if which == "raw" {
        let server = if rmcp {
            self_cmd("stdio")
        } else {
            demo_cmd(&["bench"])
        };
        (None, Client::Raw(RawStdio::spawn(server)))
    } else if which == "gateway" {
        (None, stdio_gateway())
    } else {
        let audit = std::env::var("MCP_BENCH_AUDIT")
            .ok()
            .is_none_or(|a| a != "off");
        let config = if rmcp {
            rmcp_stdio_config()
        } else {
            demo_config()
        };
        let (h, client) = harness_client(config, audit).await;
        (Some(h), client)
    };
    let mut b = Bench {
        lines: Vec::new(),
        quick: false,
        round_sets: 0,
    };
    let start = Instant::now();
    if let (Some(h), true) = (
        &h,
        std::env::var("MCP_BENCH_PROFILE").is_ok_and(|p| p == "list"),
    ) {
        // Cached listings instead of calls.
        let caller = Caller::agent("bench").with_auth_context("bench");
        h.list_tools(&caller).await.expect("list");
        let mut n = 0u64;
        let cpu = cpu_us();
        while start.elapsed() < Duration::from_secs(seconds) {
            h.list_tools(&caller).await.expect("cached list");
            n += 1;
        }
        b.record("profile_cached_list_cpu", (cpu_us() - cpu) / n as f64, "us");
    }
    // Through the gateway, `serve`'s own CPU too.
    let serve = match (&client, &http_gateway) {
        (Client::RawGateway(raw), _) => raw.pid(),
        (_, Some(child)) => child.id(),
        _ => None,
    };
    // The server's own CPU per call: the demo server behind the raw client or the harness.
    let server = match (&client, &h, &http) {
        (_, _, Some((child, _))) => child.id(),
        (Client::Raw(raw), _, _) => raw.pid(),
        (_, Some(h), _) => h.status().iter().find_map(|s| s.pid),
        _ => None,
    };
    // `MCP_BENCH_IN_FLIGHT` calls at once (64 unless set; the figure keeps its name).
    let in_flight: usize = std::env::var("MCP_BENCH_IN_FLIGHT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64);
    while start.elapsed() < Duration::from_secs(seconds) {
        let cpu = cpu_us();
        let serve_cpu = serve.and_then(process_cpu_us);
        let server_cpu = server.and_then(process_cpu_us);
        let rate = rate(&client, in_flight, b.duration()).await;
        b.record("profile_c64", rate, "calls/s");
        let calls = rate * b.duration().as_secs_f64();
        b.record(
            "profile_client_cpu_per_call",
            (cpu_us() - cpu) / calls.max(1.0),
            "us",
        );
        if let (Some(before), Some(after)) = (server_cpu, server.and_then(process_cpu_us)) {
            b.record(
                "profile_server_cpu_per_call",
                (after - before) / calls.max(1.0),
                "us",
            );
        }
        if let (Some(before), Some(after)) = (serve_cpu, serve.and_then(process_cpu_us)) {
            b.record(
                "profile_serve_cpu_per_call",
                (after - before) / calls.max(1.0),
                "us",
            );
        }
    }
    if let Some(h) = h {
        h.shutdown().await;
    }
}

fn main() {
    sweep_stale_scratch();
    let _scratch = RemoveScratch;
    // reqwest is built without a default TLS provider (the harness configures its own);
    // the bench's own HTTP clients use ring, as the harness does.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let quick = std::env::var("MCP_BENCH_QUICK").is_ok_and(|v| v == "1");
    let mut b = Bench {
        lines: Vec::new(),
        quick,
        round_sets: 0,
    };
    if let Ok(role) = std::env::var("MCP_BENCH_ROLE") {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        if role == "discovery" {
            rt.block_on(discovery_section(&mut b));
            print_lines(&b);
            return;
        }
        if let Some(on) = role.strip_prefix("telemetry-") {
            // `sampled`: one trace in ten, as OTEL_TRACES_SAMPLER=parentbased_traceidratio
            // with OTEL_TRACES_SAMPLER_ARG=0.1 asks of the binary.
            // MCP_BENCH_SAMPLE overrides the sampled share (0: the layer and the meter
            // installed, no call traced), to tell their fixed cost from the kept calls';
            // a full run's sampled children take it too. A bad value stops the bench
            // rather than mislabel a figure.
            let ratio = match std::env::var("MCP_BENCH_SAMPLE") {
                Ok(r) => r
                    .parse::<f64>()
                    .ok()
                    .filter(|r| (0.0..=1.0).contains(r))
                    .expect("MCP_BENCH_SAMPLE: a share from 0 to 1"),
                Err(_) => 0.1,
            };
            let (on, sample) = match on {
                "on" => (true, 1.0),
                "sampled" => (true, ratio),
                _ => (false, 1.0),
            };
            rt.block_on(telemetry_role(&mut b, on, sample));
            print_lines(&b);
            return;
        }
        // A server process for the benchmark: rmcp's echo server.
        let mut args = vec![role];
        args.extend(std::env::args().skip(1).filter(|a| a.starts_with("--json")));
        if let Err(e) = rt.block_on(rmcp_server::run(args)) {
            eprintln!("rmcp bench server: {e:#}");
        }
        return;
    }
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    // MCP_BENCH_ONLY=stdio|http|further|gateway|current|discovery|telemetry runs one section;
    // MCP_BENCH_ONLY=profile runs the profiling loop (not part of a full run).
    let only = std::env::var("MCP_BENCH_ONLY").ok();
    let run = |section: &str| only.as_deref().is_none_or(|o| o == section);
    if only.as_deref() == Some("profile") {
        rt.block_on(profile_section());
        return;
    }
    rt.block_on(async {
        if run("stdio") {
            stdio_section(&mut b).await;
        }
        if run("http") {
            http_section(&mut b).await;
        }
        if run("further") {
            further_section(&mut b).await;
        }
        if run("gateway") {
            gateway_section(&mut b).await;
        }
    });
    if run("current") {
        current_thread_section(&mut b);
    }
    if run("discovery") {
        discovery_in_child(&mut b);
    }
    if run("telemetry") {
        eprintln!("tracing export on against off, 16 in flight (child processes):");
        // The three in turn, several rounds, each ratio against the `off` of its own
        // round: on a shared machine the speed drifts over a minute.
        let mut rates: [Vec<f64>; 3] = Default::default();
        let mut cpu: [Vec<f64>; 3] = Default::default();
        let mut ratios: [Vec<f64>; 2] = Default::default();
        for _ in 0..if b.quick { 1 } else { 5 } {
            let mut round = [0.0; 3];
            for (i, (role, name)) in [
                ("telemetry-off", "otel_off_c16"),
                ("telemetry-on", "otel_on_c16"),
                ("telemetry-sampled", "otel_sampled_c16"),
            ]
            .into_iter()
            .enumerate()
            {
                let mut child = Bench {
                    lines: Vec::new(),
                    quick: b.quick,
                    round_sets: 0,
                };
                in_child(&mut child, role);
                round[i] = child.get(name);
                rates[i].push(round[i]);
                let per_call = name.replace("_c16", "_cpu_per_call");
                cpu[i].push(child.get(&per_call));
            }
            ratios[0].push(round[1] / round[0]);
            ratios[1].push(round[2] / round[0]);
        }
        let [off, on, sampled] = rates;
        b.record_samples("otel_off_c16", off, "calls/s");
        b.record_samples("otel_on_c16", on, "calls/s");
        b.record_samples("otel_sampled_c16", sampled, "calls/s");
        let [off, on, sampled] = cpu;
        b.record_samples("otel_off_cpu_per_call", off, "us");
        b.record_samples("otel_on_cpu_per_call", on, "us");
        b.record_samples("otel_sampled_cpu_per_call", sampled, "us");
        let [on, sampled] = ratios;
        b.record_samples("otel_on_vs_off_c16", on, "ratio");
        b.record_samples("otel_sampled_vs_off_c16", sampled, "ratio");
    }
    ratios(&mut b);
    print_lines(&b);
}

/// `BENCH name median unit [lowest highest]`, one line per figure.
fn print_lines(b: &Bench) {
    println!();
    for f in &b.lines {
        if f.low.is_finite() && f.low != f.high {
            println!(
                "BENCH {} {:.3} {} [{:.3} {:.3}]",
                f.name, f.value, f.unit, f.low, f.high
            );
        } else {
            println!("BENCH {} {:.3} {}", f.name, f.value, f.unit);
        }
    }
}
