//! `mcp-harness demo`: one harness against the demo servers that ship in this binary
//! (two over stdio, one on loopback HTTP, both eras), walking through discovery, a
//! cached listing, priority routing, an `input_required` elicitation, a permission
//! denial, a crash and its supervised restart, and the audit trail. One function per
//! step.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use mcp_harness::audit::AuditConfig;
use mcp_harness::registry::cache::CacheConfig;
use mcp_harness::{
    Caller, FixedAnswers, Harness, HarnessConfig, HarnessHandle, RestartConfig, ServerConfig,
    ServerState,
};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

use crate::terminal::line;

fn step(title: &str) {
    outln!("\n== {title}");
}

/// A result's first text, as the terminal may show it (a server wrote it).
fn first_text(result: &Value) -> String {
    line(result["content"][0]["text"].as_str().unwrap_or(""))
}

/// Starts `mcp-harness demo-server ARGS --http 127.0.0.1:0` and returns it with its URL.
async fn http_server(exe: &str, args: &[&str]) -> anyhow::Result<(tokio::process::Child, String)> {
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
        .context("the demo server did not say where it listens")?;
    Ok((child, url.to_string()))
}

async fn wait_for(h: &HarnessHandle, id: &str, state: ServerState) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if h.server_status(id).is_some_and(|s| s.state == state) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("server {id} did not become {}", state.as_str())
}

fn config(exe: &str, url: &str, work: &Path) -> HarnessConfig {
    let stdio = |id: &str, extra: &[&str]| {
        let mut args = vec!["demo-server".to_string(), id.to_string()];
        args.extend(extra.iter().map(|s| s.to_string()));
        ServerConfig::stdio(id, exe, args)
    };
    let mut alpha = stdio("alpha", &[]);
    alpha.priority = 10;
    alpha.restart = RestartConfig {
        min_delay: Duration::from_millis(300),
        ..RestartConfig::default()
    };
    let mut beta = stdio("beta", &["--era", "legacy"]);
    beta.priority = 5;
    let gamma = ServerConfig::http("gamma", url);
    let mut config = HarnessConfig {
        servers: vec![alpha, beta, gamma],
        ..HarnessConfig::default()
    };
    config
        .permissions
        .entry("demo-agent".into())
        .or_default()
        .insert("*".into(), vec!["*".into()]);
    config
        .permissions
        .entry("intern".into())
        .or_default()
        .insert("beta".into(), vec!["echo".into()]);
    config.cache = CacheConfig {
        dir: Some(work.join("cache")),
        ..CacheConfig::default()
    };
    config.audit = AuditConfig {
        path: Some(work.join("audit.jsonl")),
        ..AuditConfig::default()
    };
    config
}

/// The elicitation handler, given at start: legacy servers learn it at `initialize`.
fn approver() -> Arc<FixedAnswers> {
    Arc::new(FixedAnswers::from_fn(|req| {
        outln!(
            "  [handler] {} asks \"{}\" (key \"{}\"); the demo approves",
            req.server,
            line(req.params["message"].as_str().unwrap_or("")),
            line(&req.key)
        );
        json!({"action": "accept", "content": {"approved": true, "answer": "yes"}})
    }))
}

/// The demo's cache and audit directory, removed when the demo ends, also on an error.
struct WorkDir(std::path::PathBuf);

impl std::ops::Deref for WorkDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl WorkDir {
    /// A new directory of this user's alone (0700) under the temporary directory; never
    /// one that exists already, which another user could have made, with the audit
    /// file a link to one of this user's files.
    fn create() -> anyhow::Result<WorkDir> {
        use std::os::unix::fs::DirBuilderExt;
        let base = std::env::temp_dir();
        for n in 0..1000 {
            let path = base.join(format!("mcp-harness-demo-{}-{n}", std::process::id()));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(WorkDir(path)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e).context("creating the demo's directory"),
            }
        }
        anyhow::bail!(
            "no free name for the demo's directory in {}",
            base.display()
        )
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub async fn run() -> anyhow::Result<()> {
    let exe = std::env::current_exe()
        .context("locating this binary")?
        .to_string_lossy()
        .to_string();
    let work = WorkDir::create()?;
    let (mut http_child, url) = http_server(&exe, &["gamma"]).await?;

    step("1. Start: one supervised actor per server; discover, or initialize for legacy servers");
    let mut harness_config = config(&exe, &url, &work);
    if let Some(ratio) = crate::telemetry::sample_ratio() {
        harness_config.trace_sample_ratio = ratio;
    }
    let harness = Harness::builder(harness_config)
        .input_handler("elicitation/create", approver())
        .spawn()
        .await?;
    start(&harness).await?;
    let agent = Caller::agent("demo-agent").with_auth_context("demo-session");
    step(
        "2. List tools: fetched once, then served from the cache (by the servers' ttlMs and cacheScope)",
    );
    list(&harness, &agent).await?;
    step("3. A bare tool name is routed by priority: alpha (10) before beta (5) and gamma (0)");
    route(&harness, &agent).await?;
    step(
        "4. Elicitation: modern input_required rounds, and a legacy server's request, same handler",
    );
    elicit(&harness, &agent).await?;
    step("5. Permissions: default deny, per agent, per server, per tool");
    permissions(&harness).await?;
    step("6. A crash: the call fails fast, the supervisor restarts alpha after its backoff");
    crash(&harness, &agent).await?;
    step("7. Shut down: every server stopped, every audit record written");
    let pids: Vec<u32> = harness.status().iter().filter_map(|s| s.pid).collect();
    harness.shutdown().await;
    drop(http_child.stdin.take());
    let _ = tokio::time::timeout(Duration::from_secs(5), http_child.wait()).await;
    for pid in &pids {
        if Path::new(&format!("/proc/{pid}")).exists() {
            bail!("server process {pid} is still alive after shutdown");
        }
    }
    let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
    outln!("  server processes {}: all gone", pids.join(", "));
    audit(&work.join("audit.jsonl"))?;
    outln!("\nDone.");
    Ok(())
}

async fn start(harness: &HarnessHandle) -> anyhow::Result<()> {
    for id in ["alpha", "beta", "gamma"] {
        wait_for(harness, id, ServerState::Ready).await?;
    }
    for s in harness.status() {
        outln!(
            "  {:<6} {} era={} version={} pid={}  instructions: \"{}\"",
            s.id,
            s.state.as_str(),
            s.era.map(|e| e.as_str()).unwrap_or("-"),
            s.protocol_version.clone().unwrap_or_default(),
            s.pid.map_or("- (HTTP)".to_string(), |p| p.to_string()),
            line(
                s.profile
                    .as_ref()
                    .and_then(|p| p.instructions())
                    .unwrap_or("")
            )
        );
    }
    Ok(())
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

async fn list(harness: &HarnessHandle, agent: &Caller) -> anyhow::Result<()> {
    let t = Instant::now();
    let tools = harness.list_tools(agent).await?;
    outln!(
        "  {} tools from 3 servers in {} (fetched)",
        tools.len(),
        ms(t.elapsed())
    );
    // The cache's writer stores what was fetched; a moment later it serves it.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let t = Instant::now();
    let again = harness.list_tools(agent).await?;
    let cached = again.iter().filter(|t| t.from_cache).count();
    outln!(
        "  {} tools in {} ({cached} from the cache)",
        again.len(),
        ms(t.elapsed())
    );
    for tool in again.iter().filter(|t| &*t.name == "echo") {
        outln!("    {:<14} on {}", line(&tool.qualified), tool.server);
    }
    let stats = harness.cache_stats();
    outln!(
        "  cache: {} entries, {} bytes, {} hits, {} misses",
        stats.l1.entries,
        stats.l1.bytes,
        stats.l1.hits,
        stats.l1.misses
    );
    Ok(())
}

async fn route(harness: &HarnessHandle, agent: &Caller) -> anyhow::Result<()> {
    let r = harness.call_tool(agent, "server_name", json!({})).await?;
    outln!("  server_name -> served by {}", first_text(&r));
    let r = harness
        .call_tool(agent, "gamma__echo", json!({"text": "over loopback HTTP"}))
        .await?;
    outln!("  gamma__echo -> \"{}\"", first_text(&r));
    Ok(())
}

async fn elicit(harness: &HarnessHandle, agent: &Caller) -> anyhow::Result<()> {
    let r = harness
        .call_tool(
            agent,
            "alpha__confirm",
            json!({"message": "Deploy to production?"}),
        )
        .await?;
    outln!("  alpha__confirm -> \"{}\"", first_text(&r));
    let r = harness
        .call_tool(agent, "alpha__rounds", json!({"n": 3}))
        .await?;
    outln!("  alpha__rounds (3 rounds) -> \"{}\"", first_text(&r));
    let r = harness
        .call_tool(
            agent,
            "beta__confirm",
            json!({"message": "Clear the cache?"}),
        )
        .await?;
    outln!("  beta__confirm (legacy) -> \"{}\"", first_text(&r));
    Ok(())
}

async fn permissions(harness: &HarnessHandle) -> anyhow::Result<()> {
    let intern = Caller::agent("intern");
    let r = harness
        .call_tool(&intern, "beta__echo", json!({"text": "allowed"}))
        .await?;
    outln!("  intern beta__echo -> \"{}\"", first_text(&r));
    match harness
        .call_tool(&intern, "alpha__add", json!({"a": 1, "b": 2}))
        .await
    {
        Err(e) => outln!("  intern alpha__add -> {}", line(&e.to_string())),
        Ok(_) => bail!("the intern should have been denied"),
    }
    match harness
        .call_tool(&Caller::default(), "echo", json!({}))
        .await
    {
        Err(e) => outln!("  anonymous echo   -> {}", line(&e.to_string())),
        Ok(_) => bail!("an anonymous caller should have been denied"),
    }
    Ok(())
}

async fn crash(harness: &HarnessHandle, agent: &Caller) -> anyhow::Result<()> {
    let old_pid = harness
        .server_status("alpha")
        .and_then(|s| s.pid)
        .unwrap_or_default();
    let t = Instant::now();
    match harness.call_tool(agent, "alpha__crash", json!({})).await {
        Err(e) => outln!(
            "  alpha__crash -> {} (after {})",
            line(&e.to_string()),
            ms(t.elapsed())
        ),
        Ok(_) => bail!("the crash tool should not answer"),
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let r = harness.call_tool(agent, "server_name", json!({})).await?;
    let state = harness
        .server_status("alpha")
        .map_or("unknown", |s| s.state.as_str());
    outln!(
        "  meanwhile, server_name -> {} (alpha is {state})",
        first_text(&r)
    );
    wait_for(harness, "alpha", ServerState::Ready).await?;
    let s = harness.server_status("alpha").context("alpha")?;
    outln!(
        "  alpha is {} again: restarts={}, pid {old_pid} -> {}, last error: {}",
        s.state.as_str(),
        s.restarts,
        s.pid.unwrap_or_default(),
        line(&s.last_error.unwrap_or_default())
    );
    let r = harness.call_tool(agent, "server_name", json!({})).await?;
    outln!("  server_name -> {}", first_text(&r));
    Ok(())
}

fn audit(path: &Path) -> anyhow::Result<()> {
    let audit = std::fs::read_to_string(path).context("reading the audit trail")?;
    let records: Vec<Value> = audit
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let finished: Vec<&Value> = records
        .iter()
        .filter(|r| r["event"] == "finished")
        .collect();
    outln!(
        "  audit: {} records ({} started, {} finished) in {}",
        records.len(),
        records.len() - finished.len(),
        finished.len(),
        path.display()
    );
    for r in finished.iter().take(12) {
        outln!(
            "    call {:>2} {:<10} server={:<6} rounds={} hops={} {}",
            r["call_id"],
            r["outcome"].as_str().unwrap_or(""),
            r["server"].as_str().unwrap_or("-"),
            r["rounds"].as_array().map_or(0, Vec::len),
            r["hops"].as_array().map_or(0, Vec::len),
            line(r["error"].as_str().unwrap_or(""))
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_work_directory_is_new_and_this_users_alone() {
        use std::os::unix::fs::PermissionsExt;
        let one = WorkDir::create().expect("one");
        let two = WorkDir::create().expect("two");
        assert_ne!(one.0, two.0, "never a directory that exists already");
        let mode = std::fs::metadata(&one.0)
            .expect("made")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        let path = one.0.clone();
        drop(one);
        assert!(!path.exists(), "removed when the demo ends");
    }
}
