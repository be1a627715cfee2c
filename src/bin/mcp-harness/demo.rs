//! `mcp-harness demo`: a readable walk through one harness process talking to the demo
//! servers that ship in this binary, over stdio and loopback HTTP, in both eras.

use std::time::Duration;

use anyhow::{Context, bail};
use mcp_harness::transport::{ConnectOptions, Connection, ServerEvent, TransportSpec};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

fn step(title: &str) {
    println!("\n== {title}");
}

fn first_text(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// Starts `mcp-harness demo-server ARGS --http 127.0.0.1:0` and returns it with its URL.
async fn http_server(args: &[&str]) -> anyhow::Result<(tokio::process::Child, String)> {
    let exe = std::env::current_exe().context("locating this binary")?;
    let mut child = tokio::process::Command::new(exe)
        .arg("demo-server")
        .args(args)
        .args(["--http", "127.0.0.1:0"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting the HTTP demo server")?;
    let stdout = child.stdout.take().context("demo server stdout")?;
    let mut line = String::new();
    tokio::io::BufReader::new(stdout)
        .read_line(&mut line)
        .await?;
    let url = line
        .trim()
        .strip_prefix("listening ")
        .context("demo server did not say where it listens")?;
    Ok((child, url.to_string()))
}

pub async fn run() -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("locating this binary")?;
    let exe = exe.to_string_lossy().to_string();
    let options = ConnectOptions {
        capabilities: json!({"elicitation": {"form": {}}}),
        request_timeout: Duration::from_secs(10),
        probe_timeout: Duration::from_secs(2),
        ..ConnectOptions::default()
    };

    step("1. Connect: probe with server/discover, fall back to initialize for legacy servers");
    let (alpha, _alpha_events) = Connection::connect(
        "alpha",
        TransportSpec::stdio(&exe, ["demo-server", "alpha"]),
        options.clone(),
    )
    .await?;
    let (beta, mut beta_events) = Connection::connect(
        "beta",
        TransportSpec::stdio(
            &exe,
            [
                "demo-server",
                "beta",
                "--era",
                "legacy",
                "--on-discover",
                "exit",
            ],
        ),
        options.clone(),
    )
    .await?;
    let (mut http_child, url) = http_server(&["gamma"]).await?;
    let (gamma, _gamma_events) =
        Connection::connect("gamma", TransportSpec::http(&url), options.clone()).await?;
    for c in [&alpha, &beta, &gamma] {
        println!(
            "  {:<6} era={:?} version={} pid={} instructions={:?}",
            c.server(),
            c.era(),
            c.protocol_version(),
            c.pid().map_or("-".to_string(), |p| p.to_string()),
            c.profile().instructions().unwrap_or("")
        );
    }

    step("2. List tools on each server");
    for c in [&alpha, &beta, &gamma] {
        let list = c.request("tools/list", None).await?;
        let names: Vec<&str> = list["tools"]
            .as_array()
            .map(|t| t.iter().filter_map(|t| t["name"].as_str()).collect())
            .unwrap_or_default();
        println!(
            "  {:<6} {} tools (ttlMs={}, cacheScope={}): {}",
            c.server(),
            names.len(),
            list["ttlMs"],
            list["cacheScope"],
            names[..4.min(names.len())].join(", ")
        );
    }

    step("3. Call a tool on each (stdio modern, stdio legacy, HTTP modern)");
    for c in [&alpha, &beta, &gamma] {
        let r = c.request("tools/call", Some(json!({"name": "echo", "arguments": {"text": format!("hello from {}", c.server())}}))).await?;
        println!("  {:<6} echo -> {:?}", c.server(), first_text(&r));
    }

    step("4. Elicitation, modern style: input_required, answer, retry with requestState");
    let params = json!({"name": "confirm", "arguments": {"message": "Deploy to prod?"}});
    let first = alpha.request("tools/call", Some(params.clone())).await?;
    println!(
        "  alpha answered resultType={} asking {:?}",
        first["resultType"], first["inputRequests"]["confirm"]["params"]["message"]
    );
    let mut retry = params.clone();
    retry["inputResponses"] =
        json!({"confirm": {"action": "accept", "content": {"approved": true}}});
    retry["requestState"] = first["requestState"].clone();
    let done = alpha.request("tools/call", Some(retry)).await?;
    println!("  retry -> {:?}", first_text(&done));

    step("5. Elicitation, legacy style: the server sends elicitation/create to the client");
    let answerer = tokio::spawn(async move {
        while let Some(event) = beta_events.recv().await {
            if let ServerEvent::Request(req) = event {
                println!(
                    "  beta asks {} {:?}; the demo accepts",
                    req.method, req.params["message"]
                );
                req.respond(Ok(
                    json!({"action": "accept", "content": {"approved": true}}),
                ));
            }
        }
    });
    let r = beta
        .request(
            "tools/call",
            Some(json!({"name": "confirm", "arguments": {"message": "Delete the cache?"}})),
        )
        .await?;
    println!("  beta confirm -> {:?}", first_text(&r));

    step("6. Faults become typed errors, never hangs");
    let e = alpha
        .request_with_timeout(
            "tools/call",
            Some(json!({"name": "hang", "arguments": {}})),
            Duration::from_millis(300),
        )
        .await;
    println!(
        "  alpha hang    -> {}",
        e.err().map(|e| e.to_string()).unwrap_or_default()
    );
    let e = alpha
        .request(
            "tools/call",
            Some(json!({"name": "crash", "arguments": {}})),
        )
        .await;
    println!(
        "  alpha crash   -> {}",
        e.err().map(|e| e.to_string()).unwrap_or_default()
    );
    let e = gamma
        .request(
            "tools/call",
            Some(json!({"name": "http_status", "arguments": {"status": 503}})),
        )
        .await;
    println!(
        "  gamma 503     -> {}",
        e.err().map(|e| e.to_string()).unwrap_or_default()
    );

    step("7. Shut down: close stdin, SIGTERM, SIGKILL the process group, reap");
    let pids: Vec<u32> = [&alpha, &beta].iter().filter_map(|c| c.pid()).collect();
    for c in [&alpha, &beta, &gamma] {
        c.shutdown().await;
    }
    answerer.abort();
    drop(http_child.stdin.take());
    let _ = tokio::time::timeout(Duration::from_secs(5), http_child.wait()).await;
    for pid in pids {
        // SAFETY-free check: /proc tells whether the process still exists.
        let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
        if alive {
            bail!("server process {pid} is still alive after shutdown");
        }
        println!("  pid {pid}: gone");
    }
    println!("\nDone.");
    Ok(())
}
