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
        let mut child = tokio::process::Command::new(program)
            .args(args)
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

/// Whether `pid` is a live (not zombie) process.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Live processes whose process group is `pgid`.
pub fn group_members(pgid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in dir.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // fields: state ppid pgrp ...
        if fields.len() > 2 && fields[0] != "Z" && fields[2].parse::<u32>().ok() == Some(pgid) {
            found.push(pid);
        }
    }
    found
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

/// A fresh file path under the system temp directory, for `--record`.
pub fn temp_file(tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!(
        "mcp-harness-test-{}-{tag}-{n}.jsonl",
        std::process::id()
    ))
}

/// The requests a `--record` file holds.
pub fn recorded(path: &PathBuf) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// SIGKILLs one process (a server's, as fault injection).
pub fn sigkill(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success() || !alive(pid), "kill -KILL {pid} failed");
}
