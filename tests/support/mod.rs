//! Shared by the integration tests: real server processes (the demo server in this
//! crate's binary, and an rmcp 3.11 server built as an example), and checks that no
//! process of a test survives it.

#![allow(dead_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use mcp_harness::transport::{ConnectOptions, TransportSpec};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

/// The `mcp-harness` binary built for this test run.
pub fn harness_exe() -> String {
    env!("CARGO_BIN_EXE_mcp-harness").to_string()
}

/// The rmcp interop server (`examples/rmcp_server.rs`); `cargo test` builds examples.
pub fn rmcp_exe() -> String {
    let mut dir = std::env::current_exe().expect("test binary path");
    dir.pop(); // deps/
    dir.pop(); // debug/
    let exe: PathBuf = dir.join("examples").join("rmcp_server");
    assert!(
        exe.exists(),
        "{} is missing: run the tests with `cargo test`, which builds examples",
        exe.display()
    );
    exe.to_string_lossy().into_owned()
}

/// A stdio demo server with these extra arguments.
pub fn demo_stdio(args: &[&str]) -> TransportSpec {
    let mut all = vec!["demo-server"];
    all.extend_from_slice(args);
    TransportSpec::stdio(harness_exe(), all)
}

/// Options for tests: elicitation declared, short probe, generous request deadline.
pub fn options() -> ConnectOptions {
    ConnectOptions {
        capabilities: json!({"elicitation": {"form": {}}}),
        probe_timeout: Duration::from_millis(1500),
        request_timeout: Duration::from_secs(30),
        shutdown_grace: Duration::from_millis(500),
        ..ConnectOptions::default()
    }
}

/// An HTTP server process on loopback; killed (with its group) when dropped.
pub struct HttpServer {
    pub child: tokio::process::Child,
    pub url: String,
}

impl HttpServer {
    /// Starts `program args…` which prints `listening URL` as its first line.
    pub async fn start(program: &str, args: &[&str]) -> HttpServer {
        HttpServer::start_with_env(program, args, &[]).await
    }

    /// [`HttpServer::start`] with these environment variables set.
    pub async fn start_with_env(program: &str, args: &[&str], env: &[(&str, &str)]) -> HttpServer {
        HttpServer::start_with(program, args, env, std::process::Stdio::inherit()).await
    }

    /// [`HttpServer::start_with_env`] with its stderr (its log) sent to `stderr`.
    pub async fn start_with(
        program: &str,
        args: &[&str],
        env: &[(&str, &str)],
        stderr: std::process::Stdio,
    ) -> HttpServer {
        let mut child = tokio::process::Command::new(program)
            .args(args)
            .envs(env.iter().copied())
            .stderr(stderr)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn HTTP server");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        tokio::time::timeout(
            Duration::from_secs(20),
            tokio::io::BufReader::new(stdout).read_line(&mut line),
        )
        .await
        .expect("server announces its address in time")
        .expect("read");
        let url = line
            .trim()
            .strip_prefix("listening ")
            .expect("listening line")
            .to_string();
        HttpServer { child, url }
    }

    /// A demo server over HTTP.
    pub async fn demo(args: &[&str]) -> HttpServer {
        let mut all = vec!["demo-server"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--http", "127.0.0.1:0"]);
        HttpServer::start(&harness_exe(), &all).await
    }

    pub fn spec(&self) -> TransportSpec {
        TransportSpec::http(&self.url)
    }
}

/// A process's state letter, parent and process group, from `/proc/PID/stat`.
pub fn proc_stat(pid: u32) -> Option<(char, u32, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((state, ppid, pgrp))
}

/// Whether `pid` is still there for this test to worry about: running, or a zombie
/// this process never reaped (its parent is us). A zombie of another parent is that
/// parent's to reap.
pub fn alive(pid: u32) -> bool {
    proc_stat(pid).is_some_and(|(state, ppid, _)| state != 'Z' || ppid == std::process::id())
}

/// Processes whose process group is `pgid`, as [`alive`] counts them.
pub fn group_members(pgid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| proc_stat(*pid).is_some_and(|(_, _, pgrp)| pgrp == pgid) && alive(*pid))
        .collect()
}

/// Live processes whose command line mentions `needle`.
pub fn processes_with(needle: &str) -> Vec<u32> {
    // No /proc would make every "nothing left" check pass unchecked.
    let dir = std::fs::read_dir("/proc").expect("/proc");
    dir.flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle))
                && alive(*pid)
        })
        .collect()
}

/// Children of this process, zombies included.
pub fn own_children() -> Vec<u32> {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| proc_stat(*pid).is_some_and(|(_, ppid, _)| ppid == me))
        .collect()
}

/// Polls `check` until it holds or `limit` passes; returns whether it held.
pub async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    check()
}

/// The text of a tool result's first content block.
pub fn text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or("")
}

/// `tools/call` params.
pub fn call(name: &str, arguments: Value) -> Option<Value> {
    Some(json!({"name": name, "arguments": arguments}))
}

/// This test process's scratch directory: made on first use, removed when the process
/// exits. Directories left by processes that were killed are swept on the way in, so
/// a run never leaves audit files, keys or records behind in the system temp dir.
pub fn scratch_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let root = std::env::temp_dir();
        sweep_stale(&root);
        let dir = root.join(format!("{SCRATCH_PREFIX}{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("make the scratch directory");
        extern "C" fn remove_scratch() {
            if let Some(dir) = DIR.get() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
        // SAFETY: the handler cannot unwind (remove_dir_all returns its error) and reads
        // only the OnceLock already set here; an exec'd child does not inherit it.
        unsafe { libc::atexit(remove_scratch) };
        dir
    })
    .clone()
}

/// The name of a test process's scratch directory, before its pid.
const SCRATCH_PREFIX: &str = "mcp-harness-test-";

/// Removes scratch directories whose process is gone. Only where `/proc` shows this
/// process: without it every directory would look abandoned.
fn sweep_stale(root: &std::path::Path) {
    if !std::path::Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(SCRATCH_PREFIX))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A fresh file path in this process's scratch directory, for `--record`, audit files
/// and configs.
pub fn temp_file(tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    scratch_dir().join(format!("{tag}-{n}.jsonl"))
}

/// Sends `signal` (`-HUP`, `-INT`, …) to the process `pid` with kill(1), and checks it
/// was sent.
pub fn send_signal(signal: &str, pid: &str) {
    let sent = std::process::Command::new("kill")
        .args([signal, pid])
        .status()
        .expect("kill");
    assert!(sent.success(), "kill {signal} {pid}");
}

/// Writes `text` to `path` readable by this user only, as a key file must be.
pub fn write_private(path: &std::path::Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
}

/// The requests a `--record` file holds.
pub fn recorded(path: &PathBuf) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// How many `tools/call`s of `tool` a `--record` file holds. The demo server records a
/// request when it arrives, before handling it: a count of n means n such calls
/// reached the server (and those not answered yet are in flight).
pub fn calls_recorded(path: &PathBuf, tool: &str) -> usize {
    recorded(path)
        .iter()
        .filter(|r| r["method"] == "tools/call" && r["params"]["name"] == tool)
        .count()
}

/// SIGKILLs one process (a server's, as fault injection).
pub fn sigkill(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success() || !alive(pid), "kill -KILL {pid} failed");
}

/// A stdio demo server named `id` with extra flags, restarted only after a long backoff
/// (so that a test sees one connection unless it restarts the server itself).
pub fn demo_server(id: &str, args: &[&str]) -> mcp_harness::ServerConfig {
    let mut all = vec!["demo-server".to_string(), id.to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    let mut c = mcp_harness::ServerConfig::stdio(id, harness_exe(), all);
    c.restart = mcp_harness::RestartConfig {
        min_delay: Duration::from_secs(30),
        max_delay: Duration::from_secs(30),
        ..mcp_harness::RestartConfig::default()
    };
    c
}

/// Grants every agent named everything.
pub fn grant_everything(agents: &[&str]) -> mcp_harness::permission::Grants {
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

/// Waits until server `id` is in `state` (up to 30 s).
pub async fn wait_state(
    h: &mcp_harness::HarnessHandle,
    id: &str,
    state: mcp_harness::ServerState,
) -> bool {
    eventually(Duration::from_secs(30), || {
        h.server_status(id).is_some_and(|s| s.state == state)
    })
    .await
}

/// Starts a harness and waits until every enabled server is ready.
pub async fn start_ready(config: mcp_harness::HarnessConfig) -> mcp_harness::HarnessHandle {
    start_ready_with(mcp_harness::Harness::builder(config)).await
}

/// [`start_ready`] from a builder (with input handlers given at start).
pub async fn start_ready_with(
    builder: mcp_harness::harness::HarnessBuilder,
) -> mcp_harness::HarnessHandle {
    let h = builder.spawn().await.expect("spawn");
    let ids: Vec<String> = h.status().iter().map(|s| s.id.clone()).collect();
    for id in ids {
        assert!(
            wait_state(&h, &id, mcp_harness::ServerState::Ready).await,
            "{id} ready: {:?}",
            h.server_status(&id).and_then(|s| s.last_error)
        );
    }
    h
}

/// This process's resident memory, in KiB.
pub fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The audit records in `path`.
pub fn audit_records(path: &PathBuf) -> Vec<Value> {
    recorded(path)
}

/// A certificate authority made for one test, and certificates it signs, as PEM files.
pub struct TestCa {
    pub dir: PathBuf,
    pub ca_pem: PathBuf,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl TestCa {
    /// A new CA; its files go under a fresh temporary directory.
    pub fn new(tag: &str) -> TestCa {
        let dir = scratch_dir().join(format!("ca-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("ca dir");
        let key = rcgen::KeyPair::generate().expect("ca key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            format!("mcp-harness test CA {tag}"),
        );
        let cert = params.self_signed(&key).expect("ca cert");
        let ca_pem = dir.join("ca.pem");
        std::fs::write(&ca_pem, cert.pem()).expect("write ca");
        TestCa {
            dir,
            ca_pem,
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// A server certificate for `names` (DNS names or IP addresses): (cert, key) paths.
    pub fn leaf(&self, name: &str, names: &[&str]) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().expect("leaf key");
        let params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("params");
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        let (cert_path, key_path) = (
            self.dir.join(format!("{name}.pem")),
            self.dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert_path, cert.pem()).expect("write cert");
        std::fs::write(&key_path, key.serialize_pem()).expect("write key");
        (cert_path, key_path)
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl HttpServer {
    /// A demo server over HTTPS with this certificate and key.
    pub async fn demo_tls(
        args: &[&str],
        cert: &std::path::Path,
        key: &std::path::Path,
    ) -> HttpServer {
        let (cert, key) = (
            cert.to_string_lossy().to_string(),
            key.to_string_lossy().to_string(),
        );
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--tls-cert", &cert, "--tls-key", &key]);
        HttpServer::demo(&all).await
    }
}

/// A real Redis server on a free loopback port, for the shared cache tests; killed when
/// dropped. The binary is `redis-server` on PATH (Debian: `apt-get install
/// redis-server`; `.ci/run` installs it), or `MCP_HARNESS_REDIS_SERVER`.
pub struct Redis {
    child: Option<std::process::Child>,
    pub port: u16,
}

impl Redis {
    /// Starts one and waits until it answers.
    pub async fn start() -> Redis {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut redis = Redis { child: None, port };
        redis.restart().await;
        redis
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills it (SIGKILL: no goodbye to its clients).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, empty.
    pub async fn restart(&mut self) {
        self.kill();
        let exe =
            std::env::var("MCP_HARNESS_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let child = std::process::Command::new(&exe)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{exe}: {e}: the shared cache tests need a Redis server (Debian: apt-get install redis-server; .ci/run installs it)"));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(mut c) = self.connection().await
                && redis::cmd("PING")
                    .query_async::<String>(&mut c)
                    .await
                    .is_ok()
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer on port {}",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A connection of the test's own.
    pub async fn connection(&self) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        redis::Client::open(self.url())?
            .get_multiplexed_async_connection()
            .await
    }

    /// Every key it holds.
    pub async fn keys(&self) -> Vec<String> {
        let mut c = self.connection().await.expect("connect to the test Redis");
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut c)
            .await
            .expect("KEYS");
        keys.sort();
        keys
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A loopback port free now (for a listener the code under test binds itself).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port()
}

/// A plain HTTP/1.1 server of the test's own on a loopback port, each request answered
/// by `answer` from its path, headers and body: a model provider, a collector. Returns
/// its `http://ADDR`.
pub async fn http_service<F>(answer: F) -> String
where
    F: Fn(String, std::collections::BTreeMap<String, String>, bytes::Bytes) -> (u16, Vec<u8>)
        + Clone
        + Send
        + Sync
        + 'static,
{
    use http_body_util::BodyExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let answer = answer.clone();
            let service =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let answer = answer.clone();
                    async move {
                        let path = req.uri().path().to_string();
                        let headers = req
                            .headers()
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
                            .collect();
                        let body = req
                            .into_body()
                            .collect()
                            .await
                            .map(|b| b.to_bytes())
                            .unwrap_or_default();
                        let (status, reply) = answer(path, headers, body);
                        let mut response = hyper::Response::new(http_body_util::Full::new(
                            bytes::Bytes::from(reply),
                        ));
                        *response.status_mut() =
                            hyper::StatusCode::from_u16(status).expect("status");
                        Ok::<_, std::convert::Infallible>(response)
                    }
                });
            tokio::spawn(async move {
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await;
            });
        }
    });
    url
}
