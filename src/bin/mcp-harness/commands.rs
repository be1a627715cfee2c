//! `tools`, `call` and `status`: start the harness on the configured servers, wait for
//! them to settle (with progress on a terminal), do one thing, shut down cleanly.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use mcp_harness::config::duration;
use mcp_harness::{Caller, Harness, HarnessError, HarnessHandle, ServerError, ServerState};
use serde_json::{Value, json};

use crate::config_file::{self, Loaded};
use crate::elicit::CliElicitation;

/// Where the servers come from (shared by `tools`, `call`, `status`).
#[derive(Clone, Debug, clap::Args)]
pub struct ServerArgs {
    /// A config file: TOML, or the `mcpServers` JSON of Claude Desktop, Cursor,
    /// VS Code or `.mcp.json`.
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// A stdio server to run, as one string: 'COMMAND ARGS…' (repeatable).
    #[arg(long = "stdio", value_name = "COMMAND")]
    pub stdio: Vec<String>,
    /// A Streamable HTTP server's URL (repeatable).
    #[arg(long = "http", value_name = "URL")]
    pub http: Vec<String>,
    /// The agent to act as (default: the config's `agent`, else "local").
    #[arg(long)]
    pub agent: Option<String>,
    /// How long to wait for servers to start before going on without them.
    #[arg(long, default_value = "30s", value_parser = duration::parse)]
    pub wait: Duration,
}

/// Exit codes.
pub const OK: u8 = 0;
pub const TOOL_ERROR: u8 = 1;
pub const USAGE: u8 = 2;
pub const NO_SERVER: u8 = 3;

/// An error in what the user wrote: exit 2.
#[derive(Debug, thiserror::Error)]
#[error("{0:#}")]
pub struct UsageError(pub anyhow::Error);

pub fn load(args: &ServerArgs) -> Result<Loaded, UsageError> {
    let loaded = match &args.config {
        Some(path) => {
            let mut loaded = config_file::load(path, args.agent.clone()).map_err(UsageError)?;
            let extra =
                config_file::ad_hoc(&args.stdio, &args.http, &loaded.agent).map_err(UsageError)?;
            loaded.config.servers.extend(extra.servers);
            config_file::grant_all_ad_hoc(&mut loaded.config, &loaded.agent);
            loaded
        }
        None => {
            let agent = args.agent.clone().unwrap_or_else(|| "local".into());
            let config =
                config_file::ad_hoc(&args.stdio, &args.http, &agent).map_err(UsageError)?;
            Loaded { config, agent }
        }
    };
    if loaded.config.servers.is_empty() {
        return Err(UsageError(anyhow::anyhow!(
            "no servers: pass --config FILE, --stdio 'COMMAND ARGS', or --http URL"
        )));
    }
    Ok(loaded)
}

/// Starts the harness and waits until every server is ready, failed or stopped (or
/// `wait` passes), showing progress on a terminal.
pub async fn start(loaded: &Loaded, wait: Duration) -> anyhow::Result<HarnessHandle> {
    let harness = Harness::spawn(loaded.config.clone())
        .await
        .map_err(|e| UsageError(e.into()))?;
    let progress = std::io::stderr().is_terminal();
    let deadline = Instant::now() + wait;
    loop {
        let status = harness.status();
        let settled = status
            .iter()
            .filter(|s| !matches!(s.state, ServerState::Starting | ServerState::Restarting))
            .count();
        if progress {
            eprint!("\rstarting servers: {settled}/{} settled", status.len());
        }
        if settled == status.len() || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if progress {
        eprint!("\r\x1b[2K");
    }
    Ok(harness)
}

pub async fn tools(
    harness: &HarnessHandle,
    agent: &str,
    tag: Option<&str>,
    json_out: bool,
) -> anyhow::Result<u8> {
    let caller = Caller::agent(agent);
    let tools = match tag {
        Some(t) => harness.list_tools_tagged(&caller, t).await,
        None => harness.list_tools(&caller).await,
    };
    let tools = match tools {
        Ok(t) => t,
        Err(e) => return Ok(report(&e)),
    };
    if json_out {
        let out: Vec<Value> = tools
            .iter()
            .map(|t| json!({"qualified": t.qualified, "name": t.name, "server": t.server, "inputSchema": t.definition["inputSchema"]}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(OK);
    }
    let eras: std::collections::HashMap<String, String> = harness
        .status()
        .into_iter()
        .map(|s| {
            (
                s.id.clone(),
                s.era
                    .map(|e| format!("{e:?}").to_lowercase())
                    .unwrap_or_else(|| "-".into()),
            )
        })
        .collect();
    for t in &tools {
        let era = eras.get(&t.server).map(String::as_str).unwrap_or("-");
        let cached = if t.from_cache { ", cached" } else { "" };
        let description = t.definition["description"].as_str().unwrap_or("");
        println!(
            "{:<32} ({}, {era}{cached})  {description}",
            t.qualified, t.server
        );
    }
    if tools.is_empty() {
        eprintln!(
            "no tools: no server is ready, or agent {agent:?} is granted none (see `mcp-harness status`)"
        );
    }
    Ok(OK)
}

pub async fn call(
    harness: &HarnessHandle,
    agent: &str,
    tool: &str,
    args: Option<&str>,
    answers: Option<&str>,
    json_out: bool,
) -> anyhow::Result<u8> {
    let args: Value = match args {
        Some(a) => serde_json::from_str(a)
            .map_err(|e| UsageError(anyhow::anyhow!("ARGS_JSON is not JSON: {e}")))?,
        None => json!({}),
    };
    let answers: Option<Value> = match answers {
        Some(a) => Some(
            serde_json::from_str(a)
                .map_err(|e| UsageError(anyhow::anyhow!("--answers is not JSON: {e}")))?,
        ),
        None => None,
    };
    harness
        .register_input_handler("elicitation/create", Arc::new(CliElicitation { answers }))
        .await
        .context("registering the elicitation handler")?;
    let result = match harness.call_tool(&Caller::agent(agent), tool, args).await {
        Ok(r) => r,
        Err(e) => return Ok(report(&e)),
    };
    if json_out {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        print_content(&result);
    }
    Ok(if result["isError"] == true {
        TOOL_ERROR
    } else {
        OK
    })
}

fn print_content(result: &Value) {
    let Some(blocks) = result["content"].as_array() else {
        println!("{result}");
        return;
    };
    for b in blocks {
        match b["type"].as_str() {
            Some("text") => println!("{}", b["text"].as_str().unwrap_or("")),
            Some(other) => println!("[{other} content: use --json to see it]"),
            None => println!("{b}"),
        }
    }
    if let Some(s) = result.get("structuredContent") {
        println!("{s}");
    }
}

/// Prints a failed call in one or two lines and picks its exit code.
fn report(e: &HarnessError) -> u8 {
    eprintln!("mcp-harness: {e}");
    let (hint, code) = match e {
        HarnessError::Denied { .. } => (
            "grant the agent this tool under [permissions], or pick another with --agent",
            NO_SERVER,
        ),
        HarnessError::NoRoute { .. } => (
            "run `mcp-harness tools` to see what the servers offer",
            NO_SERVER,
        ),
        HarnessError::Server(
            ServerError::Failed { .. }
            | ServerError::Stopped { .. }
            | ServerError::Unavailable { .. }
            | ServerError::Restarting { .. }
            | ServerError::TransportClosed { .. }
            | ServerError::Transport { .. }
            | ServerError::Overloaded { .. },
        ) => (
            "run `mcp-harness status` to see why the server is not serving",
            NO_SERVER,
        ),
        HarnessError::InputDeclined { .. } => (
            "pass --answers '{...}' (or '{}' to accept the defaults) to answer without a terminal",
            TOOL_ERROR,
        ),
        _ => ("", TOOL_ERROR),
    };
    if !hint.is_empty() {
        eprintln!("  {hint}");
    }
    code
}

pub fn status(harness: &HarnessHandle, json_out: bool) -> anyhow::Result<u8> {
    let status = harness.status();
    if json_out {
        let out: Vec<Value> = status
            .iter()
            .map(|s| {
                json!({
                    "id": s.id, "state": s.state, "era": s.era, "protocolVersion": s.protocol_version,
                    "restarts": s.restarts, "pid": s.pid, "lastError": s.last_error,
                    "uptimeMs": s.uptime().map(|u| u.as_millis() as u64),
                    "instructions": s.profile.as_ref().and_then(|p| p.instructions()),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(OK);
    }
    for s in &status {
        println!(
            "{:<16} {:<10} era={:<6} version={:<10} restarts={} pid={} {}",
            s.id,
            format!("{:?}", s.state).to_lowercase(),
            s.era
                .map(|e| format!("{e:?}").to_lowercase())
                .unwrap_or_else(|| "-".into()),
            s.protocol_version.as_deref().unwrap_or("-"),
            s.restarts,
            s.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
            s.last_error
                .as_deref()
                .map(|e| format!("last error: {e}"))
                .unwrap_or_default()
        );
    }
    Ok(if status.iter().any(|s| s.state == ServerState::Ready) {
        OK
    } else {
        NO_SERVER
    })
}
