//! `tools`, `call` and `status`: start the harness on the configured servers, wait for
//! them to settle (with progress on a terminal), do one thing, shut down cleanly.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mcp_harness::config::file::{self, Loaded};
use mcp_harness::util::duration;
use mcp_harness::{CallError, Caller, Harness, HarnessHandle, ServerError, ServerState};
use serde_json::{Value, json};

use crate::elicit::CliElicitation;
use crate::terminal::{self, line, sanitize};

/// Where the servers come from (shared by `tools`, `call`, `status`).
#[derive(Clone, Debug, clap::Args)]
pub struct ServerArgs {
    /// A config file: TOML, or the `mcpServers` JSON of Claude Desktop, Cursor,
    /// VS Code or `.mcp.json`.
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// A stdio server to run, as one string: 'COMMAND ARGS…' (repeatable). `serve
    /// --stdio` alone serves one client on stdin/stdout.
    #[arg(
        long = "stdio",
        value_name = "COMMAND",
        num_args = 0..=1,
        default_missing_value = ""
    )]
    pub stdio: Vec<String>,
    /// A Streamable HTTP server's URL (repeatable).
    #[arg(long = "http", value_name = "URL")]
    pub http: Vec<String>,
    /// A PEM bundle of CA certificates to trust for the `--http` servers (on top of the
    /// platform's roots and SSL_CERT_FILE).
    #[arg(long = "ca-file", value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// The agent to act as (default: the config's `agent`, else "local").
    #[arg(long)]
    pub agent: Option<String>,
    /// How long to wait for servers to start before going on without them.
    #[arg(long, default_value = "30s", value_parser = duration::parse)]
    pub wait: Duration,
    /// A pre-registered OAuth client id for the `--http` servers.
    #[arg(long = "client-id", value_name = "ID")]
    pub client_id: Option<String>,
    /// Its secret, for a confidential client (with `--issuer`). Any local user can read
    /// a command line: `--client-secret-file` keeps it out of one.
    #[arg(long = "client-secret", value_name = "SECRET")]
    pub client_secret: Option<String>,
    /// A file holding its secret (this user's, unreadable by others, as `serve`'s keys
    /// file).
    #[arg(
        long = "client-secret-file",
        value_name = "FILE",
        conflicts_with = "client_secret"
    )]
    pub client_secret_file: Option<PathBuf>,
    /// The authorization server (its issuer URL) the `--http` servers sign in with;
    /// any other they name is refused. Required with `--client-secret`: the secret goes
    /// to no other.
    #[arg(long, value_name = "URL")]
    pub issuer: Option<String>,
    /// Where a person signs in when a server asks.
    #[arg(long = "sign-in", value_enum, default_value = "print")]
    pub sign_in: crate::sign_in::SignInMode,
    /// Where tokens are kept (default: the config's cache.dir/__tokens, else
    /// ~/.cache/mcp-harness/tokens): a directory of this user's, not a link to one.
    #[arg(long, value_name = "DIR")]
    pub tokens: Option<PathBuf>,
}

/// Exit codes.
pub const OK: u8 = 0;
pub const TOOL_ERROR: u8 = 1;
pub const USAGE: u8 = 2;
pub const NO_SERVER: u8 = 3;
/// Audit records could not be written (the reason was printed).
pub const AUDIT_LOST: u8 = 4;

/// The exit code once the harness has stopped: `outcome`, unless audit records were
/// lost, which is said and exits [`AUDIT_LOST`].
pub fn audited(outcome: u8, health: &mcp_harness::audit::AuditHealth) -> u8 {
    // A call still running when the shutdown gave up has no final record.
    let lost = health.backlog as u64 + health.unwritten + health.unfinished as u64;
    if lost == 0 {
        return outcome;
    }
    errln!(
        "mcp-harness: {lost} audit record(s) could not be written: {}",
        crate::terminal::line(health.last_error.as_deref().unwrap_or("unknown error"))
    );
    AUDIT_LOST
}

/// An error in what the user wrote: exit 2.
#[derive(Debug, thiserror::Error)]
#[error("{0:#}")]
pub struct UsageError(pub anyhow::Error);

/// `--from URL` (a gateway's address): an http or https URL, else a usage error naming
/// the flag (not a request that fails the same way every second).
pub fn from_url(url: &str) -> Result<url::Url, UsageError> {
    match url::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.has_host() => Ok(u),
        _ => Err(UsageError(anyhow::anyhow!(
            "--from must be an http or https URL, not {:?}",
            line(url)
        ))),
    }
}

/// Refuses `--from` `url` for a command that sends a bearer token (`what`) over plain
/// http to another machine: whoever is on the way would read it.
pub fn token_may_go_to(url: &url::Url, what: &str) -> Result<(), UsageError> {
    if url.scheme() == "http" && !mcp_harness::transport::auth::is_loopback(url) {
        return Err(UsageError(anyhow::anyhow!(
            "{what} goes over https, or over http to this machine only; --from is {:?}",
            line(url.as_str())
        )));
    }
    Ok(())
}

/// A config ready to run, with the caller the commands act as.
pub struct Setup {
    pub loaded: Loaded,
    pub agent: String,
}

/// The config file's text as read before the command ran (for the exporters), kept
/// for the command: a file that can be read once (a FIFO, `--config <(…)`) cannot be
/// read again. It is parsed again, once logging is set up, for its warnings. A reload
/// reads the file anew.
type FirstRead = Option<(PathBuf, Result<String, mcp_harness::ConfigError>)>;
static FIRST_READ: std::sync::Mutex<FirstRead> = std::sync::Mutex::new(None);

/// Reads the config file at `path` before the command runs, keeping its text for the
/// command's [`load`].
pub fn read_first(path: &Path) -> Result<Loaded, mcp_harness::ConfigError> {
    let text = file::read(path);
    let parsed = text
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|t| file::parse(t, path));
    *FIRST_READ.lock().unwrap_or_else(|e| e.into_inner()) = Some((path.to_path_buf(), text));
    parsed
}

/// The text the command's config was parsed from, when it came from [`read_first`]:
/// what a reload compares the file with (an edit made while the servers started is
/// then a change, not the baseline).
static LOADED_TEXT: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// What [`read_first`] read of `path` (once), parsed; else the file read now.
fn read(path: &Path) -> Result<Loaded, mcp_harness::ConfigError> {
    let first = FIRST_READ.lock().unwrap_or_else(|e| e.into_inner()).take();
    match first {
        Some((read, text)) if read == path => {
            let text = text?;
            *LOADED_TEXT.lock().unwrap_or_else(|e| e.into_inner()) = Some(text.clone());
            file::parse(&text, path)
        }
        _ => file::load(path),
    }
}

/// The text the running config was parsed from, if it was read before the command ran.
pub fn loaded_text() -> Option<String> {
    LOADED_TEXT
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

pub fn load(args: &ServerArgs) -> Result<Setup, UsageError> {
    load_with(args, None)
}

/// [`load`] for what starts no server (`logout`): a config that names none is taken.
pub fn load_serverless(args: &ServerArgs) -> Result<Setup, UsageError> {
    load_checked(args, None, false)
}

/// [`load`], with the config file's `text` when it was read already (a reload's, read
/// without waiting: reading it again could meet a FIFO put in its place since).
pub fn load_with(args: &ServerArgs, text: Option<&str>) -> Result<Setup, UsageError> {
    load_checked(args, text, true)
}

/// [`load_with`]; with `need_servers`, a config that names no server is an error.
fn load_checked(
    args: &ServerArgs,
    text: Option<&str>,
    need_servers: bool,
) -> Result<Setup, UsageError> {
    let usage = |e: mcp_harness::ConfigError| UsageError(e.into());
    let mut loaded = match (&args.config, text) {
        (Some(path), Some(text)) => file::parse(text, path).map_err(usage)?,
        (Some(path), None) => read(path).map_err(usage)?,
        (None, _) => Loaded::default(),
    };
    // Read at start for the exporters; a mistake in it is the file's error.
    crate::telemetry::TelemetryConfig::from_value(loaded.telemetry.as_ref()).map_err(|e| {
        UsageError(anyhow::anyhow!(
            "{}: {}",
            args.config
                .as_deref()
                .unwrap_or(std::path::Path::new("-"))
                .display(),
            loaded.substituted.redact(&format!("{e:#}"))
        ))
    })?;
    // An OTEL_* variable that is set wins over the file, as for the exporters.
    if let Some(ratio) = crate::telemetry::sample_ratio() {
        loaded.config.trace_sample_ratio = ratio;
    }
    for (name, id) in &loaded.renamed {
        errln!(
            "mcp-harness: server {:?} is named {id:?} here (ids use letters, digits, '-', '_', '.')",
            line(name)
        );
    }
    let agent = args
        .agent
        .clone()
        .or_else(|| loaded.agent.clone())
        .unwrap_or_else(|| "local".into());
    if loaded.imported {
        // An mcpServers file names servers for whoever runs it; it holds no grants.
        let ids: Vec<String> = loaded.config.servers.iter().map(|s| s.id.clone()).collect();
        file::grant_all(&mut loaded.config, &agent, &ids);
    }
    // Servers named on the command line are granted to the caller, and nothing else:
    // a config file's own grants are never widened or replaced.
    if args.stdio.iter().any(String::is_empty) {
        return Err(UsageError(anyhow::anyhow!(
            "--stdio needs a COMMAND (only `serve --stdio` takes none)"
        )));
    }
    let client_secret = match (&args.client_secret, &args.client_secret_file) {
        (Some(secret), _) => Some(secret.clone()),
        (None, Some(path)) => {
            let bytes = mcp_harness::util::secret::read_secret_file(path, 1)
                .map_err(|e| UsageError(anyhow::anyhow!("--client-secret-file {e}")))?;
            let secret = String::from_utf8(bytes).map_err(|_| {
                UsageError(anyhow::anyhow!(
                    "--client-secret-file {}: not UTF-8 text",
                    path.display()
                ))
            })?;
            Some(secret)
        }
        (None, None) => None,
    };
    if client_secret.is_some() && args.client_id.is_none() {
        // It would be dropped in silence: a secret belongs to a client id.
        return Err(UsageError(anyhow::anyhow!(
            "a client secret needs --client-id, the client it is the secret of"
        )));
    }
    // Likewise: they apply to the `--http` servers of the command line only.
    let for_http = [
        ("--client-id", args.client_id.is_some()),
        ("--client-secret(-file)", client_secret.is_some()),
        ("--issuer", args.issuer.is_some()),
        ("--ca-file", args.ca_file.is_some()),
    ];
    if args.http.is_empty()
        && let Some((flag, _)) = for_http.iter().find(|(_, given)| *given)
    {
        return Err(UsageError(anyhow::anyhow!(
            "{flag} applies to the --http servers of the command line, and none is given (a config file's servers take it in the file)"
        )));
    }
    let ad_hoc = file::add_ad_hoc(&mut loaded.config, &args.stdio, &args.http).map_err(usage)?;
    for server in &mut loaded.config.servers {
        if ad_hoc.contains(&server.id)
            && let mcp_harness::TransportSpec::Http(http) = &mut server.transport
        {
            if let Some(ca) = &args.ca_file {
                http.ca_file = Some(ca.clone());
            }
            if let Some(id) = &args.client_id {
                http.auth.client_id = Some(id.clone());
                http.auth.client_secret = client_secret.clone();
            }
            if let Some(issuer) = &args.issuer {
                http.auth.issuer = Some(issuer.clone());
            }
        }
    }
    file::grant_all(&mut loaded.config, &agent, &ad_hoc);
    if need_servers && loaded.config.servers.is_empty() {
        return Err(UsageError(anyhow::anyhow!(
            "no servers: pass --config FILE, --stdio 'COMMAND ARGS', or --http URL"
        )));
    }
    Ok(Setup { loaded, agent })
}

/// Starts the harness, with the command line's elicitation handler declared from the
/// start (legacy servers take capabilities at `initialize`); [`settle`] waits for its
/// servers.
pub async fn start(
    setup: &Setup,
    args: &ServerArgs,
    answers: Option<Value>,
    login: bool,
) -> anyhow::Result<HarnessHandle> {
    let store = match login {
        true => Some(crate::sign_in::file_store(setup, args.tokens.as_ref())?),
        false => crate::sign_in::store(setup, args.tokens.as_ref()),
    };
    let mut builder = Harness::builder(setup.loaded.config.clone())
        .input_handler("elicitation/create", Arc::new(CliElicitation { answers }))
        // Sampling (when `[sampling]` is configured) asks on the terminal for the
        // agents whose policy is `approve`.
        .approver(Arc::new(crate::elicit::CliApprover));
    if let Some(store) = store {
        builder = builder.token_store(store);
    }
    if let Some(authorizer) = crate::sign_in::authorizer(args.sign_in, setup, login)? {
        builder = builder.authorizer(authorizer);
    }
    let harness = builder.spawn().await.map_err(not_started)?;
    crate::telemetry::export_metrics(&harness);
    Ok(harness)
}

/// How long `login` waits for its server's sign-in whatever `--wait` says: a person has
/// 5 minutes, the authorization server's calls their own limits on top.
const LOGIN_WAIT: Duration = Duration::from_secs(330);

/// Restarts after which a server still restarting counts as settled: it is failing
/// again and again (its restart limit gives it a minute or more to come back, which a
/// command need not wait for).
const SETTLED_AFTER_RESTARTS: u32 = 5;

/// Until every server has settled (ready, failed, stopped, or restarting for the
/// [`SETTLED_AFTER_RESTARTS`]th time), or `wait` has passed, showing progress on a
/// terminal. `login`: until its server's first try has ended (restarting counts), for
/// at least [`LOGIN_WAIT`] (its sign-in is a person's, and a restart after a failed one
/// would ask again).
pub async fn settle(harness: &HarnessHandle, wait: Duration, login: bool) {
    let progress = std::io::stderr().is_terminal();
    let deadline = Instant::now() + if login { wait.max(LOGIN_WAIT) } else { wait };
    loop {
        let status = harness.status();
        let settled = status
            .iter()
            .filter(|s| match s.state {
                ServerState::Starting => false,
                ServerState::Restarting => login || s.restarts >= SETTLED_AFTER_RESTARTS,
                _ => true,
            })
            .count();
        if progress {
            // Never a panic on a terminal gone (hung up): the progress is only shown.
            let _ = write!(
                std::io::stderr(),
                "\rstarting servers: {settled}/{} settled",
                status.len()
            );
        }
        if settled == status.len() || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if progress {
        let _ = write!(std::io::stderr(), "\r\x1b[2K");
    }
}

/// `--wait` passed: servers still starting are left out (stopped, all at once: each
/// may take its grace), so that nothing after waits on them.
pub async fn go_on_without_unsettled(harness: &HarnessHandle, wait: Duration) {
    let removals = harness
        .status()
        .into_iter()
        .filter(|s| s.state == ServerState::Starting)
        .map(|s| {
            errln!(
                "mcp-harness: server {} not ready within --wait {wait:?}; going on without it",
                line(&s.id)
            );
            async move {
                let _ = harness.remove_server(&s.id).await;
            }
        });
    futures_util::future::join_all(removals).await;
}

/// Prints one line per server the caller may use that could not be listed and has not
/// failed ([`report_failed`] names those); true if there was one.
fn report_unlisted(listing: &mcp_harness::call::Listing) -> bool {
    let mut any = false;
    for (unreachable, _) in &listing.unreachable {
        if unreachable.state != ServerState::Failed {
            any = true;
            errln!(
                "mcp-harness: could not list {}",
                line(&unreachable.to_string())
            );
        }
    }
    any
}

/// Prints one line per enabled server that failed to start; true if there was one.
fn report_failed(harness: &HarnessHandle) -> bool {
    let mut any = false;
    for s in harness.status() {
        if s.state == ServerState::Failed {
            any = true;
            let why = s.last_error.as_deref().map(line).unwrap_or_default();
            errln!("mcp-harness: server {} failed: {why}", s.id);
        }
    }
    any
}

pub async fn tools(
    harness: &HarnessHandle,
    agent: &str,
    tag: Option<&str>,
    json_out: bool,
) -> anyhow::Result<u8> {
    let caller = Caller::agent(agent);
    let listing = match harness
        .listing(&caller, mcp_harness::CallKind::Tool, tag)
        .await
    {
        Ok(l) => l,
        Err(e) => return Ok(report(harness, &e)),
    };
    let tools = &listing.items;
    if json_out {
        let out: Vec<Value> = tools
            .iter()
            .map(|t| json!({"qualified": t.qualified, "name": t.name, "server": t.server, "inputSchema": t.definition["inputSchema"]}))
            .collect();
        outln!(
            "{}",
            terminal::json_text(&serde_json::to_string_pretty(&out)?)
        );
    } else {
        let eras: std::collections::HashMap<String, &'static str> = harness
            .status()
            .into_iter()
            .map(|s| (s.id.clone(), s.era.map(|e| e.as_str()).unwrap_or("-")))
            .collect();
        for t in tools {
            let era = eras.get(&*t.server).copied().unwrap_or("-");
            let cached = if t.from_cache { ", cached" } else { "" };
            let description = described(&t.definition);
            outln!(
                "{:<32} ({}, {era}{cached})  {description}",
                line(&t.qualified),
                t.server
            );
        }
    }
    report_unlisted(&listing);
    let failed = report_failed(harness);
    if tools.is_empty() && !failed {
        errln!(
            "no tools: no server is ready, or agent {agent:?} is granted none (see `mcp-harness status`)"
        );
    }
    Ok(if failed { NO_SERVER } else { OK })
}

pub async fn search(
    harness: &HarnessHandle,
    agent: &str,
    query: &str,
    limit: usize,
    json_out: bool,
) -> anyhow::Result<u8> {
    let caller = Caller::agent(agent);
    let listing = match harness
        .listing(&caller, mcp_harness::CallKind::Tool, None)
        .await
    {
        Ok(l) => l,
        Err(e) => return Ok(report(harness, &e)),
    };
    let unlisted = report_unlisted(&listing);
    let found = match harness.search_listed(listing.items, query, limit).await {
        Ok(found) => found,
        Err(e) => return Ok(report(harness, &e)),
    };
    if json_out {
        let out: Vec<Value> = found
            .iter()
            .map(|m| json!({"qualified": m.tool.qualified, "server": m.tool.server, "score": m.score, "definition": *m.tool.definition}))
            .collect();
        outln!(
            "{}",
            terminal::json_text(&serde_json::to_string_pretty(&out)?)
        );
    } else {
        for m in &found {
            let description = described(&m.tool.definition);
            outln!(
                "{:<40} {:>6.2}  {description}",
                line(&m.tool.qualified),
                m.score
            );
        }
    }
    let failed = report_failed(harness);
    if found.is_empty() && !failed {
        errln!("no tool of agent {agent:?} matches {:?}", line(query));
    }
    // What was found is not all there is: a server that could not be listed may hold
    // a better match.
    Ok(if failed || unlisted { NO_SERVER } else { OK })
}

pub async fn call(
    harness: &HarnessHandle,
    agent: &str,
    tool: &str,
    args: Value,
    json_out: bool,
) -> anyhow::Result<u8> {
    let result = match harness.call_tool(&Caller::agent(agent), tool, args).await {
        Ok(r) => r,
        Err(e) => return Ok(report(harness, &e)),
    };
    if json_out {
        outln!(
            "{}",
            terminal::json_text(&serde_json::to_string_pretty(&result)?)
        );
    } else {
        print_content(&result);
    }
    Ok(if result["isError"] == true {
        TOOL_ERROR
    } else {
        OK
    })
}

/// Why the harness did not start: a config it refuses is a usage error (exit 2);
/// anything else is not (1).
pub fn not_started(e: mcp_harness::HarnessError) -> anyhow::Error {
    match e {
        e @ mcp_harness::HarnessError::Config(_) => UsageError(e.into()).into(),
        e => e.into(),
    }
}

/// Parses a JSON object given on the command line (a tool's arguments, `--answers`):
/// anything else is a usage error, not answers that match nothing (which would accept a
/// form with its defaults) or arguments a server cannot take.
pub fn json_arg(name: &str, text: Option<&str>) -> Result<Option<Value>, UsageError> {
    let Some(a) = text else {
        return Ok(None);
    };
    match serde_json::from_str::<Value>(a) {
        Ok(v) if v.is_object() => Ok(Some(v)),
        Ok(_) => Err(UsageError(anyhow::anyhow!("{name} must be a JSON object"))),
        Err(e) => Err(UsageError(anyhow::anyhow!("{name} is not JSON: {e}"))),
    }
}

fn print_content(result: &Value) {
    let Some(blocks) = result["content"].as_array() else {
        outln!("{}", sanitize(&result.to_string(), false));
        return;
    };
    for b in blocks {
        match b["type"].as_str() {
            Some("text") => outln!("{}", sanitize(b["text"].as_str().unwrap_or(""), true)),
            Some(other) => outln!("[{} content: use --json to see it]", line(other)),
            None => outln!("{}", sanitize(&b.to_string(), false)),
        }
    }
    if let Some(s) = result.get("structuredContent") {
        outln!("{}", sanitize(&s.to_string(), false));
    }
}

/// Prints a failed call in one or two lines and picks its exit code.
fn report(harness: &HarnessHandle, e: &CallError) -> u8 {
    errln!("mcp-harness: {}", line(&e.to_string()));
    let (hint, code) = match e {
        CallError::Denied { .. } => (
            "grant the agent this tool under [permissions], or pick another with --agent",
            NO_SERVER,
        ),
        CallError::NoRoute { unreachable, .. } if unreachable.is_empty() => (
            "run `mcp-harness tools` to see what the servers offer",
            NO_SERVER,
        ),
        CallError::NoRoute { .. }
        | CallError::Server(
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
        CallError::InputDeclined { .. } => (
            "pass --answers '{...}' to answer without a terminal: fields by name ('{}' accepts a form's defaults), and \"!url\": \"accept\" to consent to a URL request",
            TOOL_ERROR,
        ),
        _ => ("", TOOL_ERROR),
    };
    if !hint.is_empty() {
        errln!("  {hint}");
    }
    if code == NO_SERVER {
        report_failed(harness);
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
                    "id": s.id, "state": s.state.as_str(), "era": s.era.map(|e| e.as_str()), "protocolVersion": s.protocol_version,
                    "restarts": s.restarts, "pid": s.pid, "lastError": s.last_error,
                    "uptimeMs": s.uptime().map(|u| u.as_millis() as u64),
                    "instructions": s.profile.as_ref().and_then(|p| p.instructions()),
                })
            })
            .collect();
        outln!(
            "{}",
            terminal::json_text(&serde_json::to_string_pretty(&out)?)
        );
    } else {
        for s in &status {
            outln!(
                "{:<16} {:<10} era={:<6} version={:<10} restarts={} pid={} {}",
                s.id,
                s.state.as_str(),
                s.era.map(|e| e.as_str()).unwrap_or("-"),
                s.protocol_version
                    .as_deref()
                    .map(line)
                    .unwrap_or_else(|| "-".into()),
                s.restarts,
                s.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
                s.last_error
                    .as_deref()
                    .map(|e| format!("last error: {}", line(e)))
                    .unwrap_or_default()
            );
        }
    }
    Ok(if status.iter().any(|s| s.state == ServerState::Ready) {
        OK
    } else {
        NO_SERVER
    })
}

/// Characters of a tool's description `tools` and `search` show on its line: a server
/// writes descriptions of any length (`--json` gives them whole).
const DESCRIPTION_SHOWN: usize = 300;

/// A tool's description on its line, cut at [`DESCRIPTION_SHOWN`].
fn described(definition: &Value) -> String {
    terminal::line_cut(
        definition["description"].as_str().unwrap_or(""),
        DESCRIPTION_SHOWN,
    )
}
