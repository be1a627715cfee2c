//! The `mcp-harness` command-line program.
//!
//! `main` parses arguments, sets up logging (`RUST_LOG`, on stderr), runs the command and
//! turns its outcome into an exit code: 0 success, 1 a tool error (`isError`) or a failed
//! call, 2 a usage or configuration error, 3 no server could serve the call, 4 audit
//! records left unwritten, and 128 + the signal for one that ended it (129 SIGHUP, 130
//! SIGINT, 131 SIGQUIT, 143 SIGTERM; the README has the whole list). A signal shuts the
//! harness down gracefully (no server process is left).

/// `println!` that does not panic once stdout is gone (`mcp-harness tools | head`):
/// what is left is dropped, and the command ends as it would (its servers stopped,
/// its audit records written). Any other failure (a full disk) is remembered, and the
/// program then exits 1 ([`output_failed`]).
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        // An audit trail on stdout is written whole between two of these.
        let _alone = mcp_harness::audit::own_output(mcp_harness::audit::OwnStream::Stdout);
        $crate::wrote(writeln!(std::io::stdout(), $($arg)*));
    }};
}

/// `eprintln!` that does not panic once stderr is gone (`… 2>&1 | head`).
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _alone = mcp_harness::audit::own_output(mcp_harness::audit::OwnStream::Stderr);
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// Stderr for one log event, written whole between an audit trail's batches there
/// ([`mcp_harness::audit::own_output`]).
struct LogWriter {
    _alone: parking_lot::ReentrantMutexGuard<'static, ()>,
    stderr: std::io::Stderr,
}

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.stderr.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.stderr.flush()
    }
}

fn log_writer() -> LogWriter {
    LogWriter {
        _alone: mcp_harness::audit::own_output(mcp_harness::audit::OwnStream::Stderr),
        stderr: std::io::stderr(),
    }
}

/// Whether writing the command's output failed other than by its reader going away.
static OUTPUT_FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Notes how a write of the command's output went (see [`outln!`]).
fn wrote(result: std::io::Result<()>) {
    if let Err(e) = result
        && e.kind() != std::io::ErrorKind::BrokenPipe
    {
        OUTPUT_FAILED.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Whether the command's output could not all be written (see [`outln!`]).
fn output_failed() -> bool {
    OUTPUT_FAILED.load(std::sync::atomic::Ordering::Relaxed)
}

mod approvals;
mod commands;
mod demo;
mod demo_auth;
mod demo_server;
mod demo_token;
mod elicit;
mod loopback;
mod serve;
mod sign_in;
mod signals;
mod telemetry;
mod terminal;
mod watch;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use commands::{ServerArgs, USAGE, UsageError};

/// Allocation-heavy paths (a gateway call's JSON in and out, freed on another worker
/// than the one that built it) run faster on mimalloc than on glibc's arenas.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Run many MCP servers at once, supervised: list their tools, call them, watch them.
#[derive(Parser)]
#[command(name = "mcp-harness", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the tools the agent may call: qualified name, server, era, whether cached.
    Tools {
        #[command(flatten)]
        servers: ServerArgs,
        /// Only servers with this tag.
        #[arg(long)]
        tag: Option<String>,
        /// Print each tool's qualified name, bare name, server and inputSchema as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Find the tools the agent may call that do something, described in plain words
    /// (BM25 over names, descriptions and parameters), best first.
    Search {
        #[command(flatten)]
        servers: ServerArgs,
        /// What the tool should do.
        query: String,
        /// How many tools to show (1 or more).
        #[arg(short = 'k', long, default_value_t = 5, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
        limit: usize,
        /// Print each match's qualified name, server, score and definition as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Call one tool, by qualified name (`server__tool`) or bare name, and print its result.
    Call {
        #[command(flatten)]
        servers: ServerArgs,
        /// The tool.
        tool: String,
        /// Its arguments, as a JSON object.
        args: Option<String>,
        /// Answers to elicitation, as JSON keyed by input-request key or by field name;
        /// omitted fields take the schema's defaults ('{}' accepts all defaults).
        /// Without it, a terminal shows a form and anything else declines.
        #[arg(long)]
        answers: Option<String>,
        /// Print the whole result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show each server's state, era, protocol version, restarts, pid and last error.
    Status {
        #[command(flatten)]
        servers: ServerArgs,
        /// As JSON (not with --watch).
        #[arg(long, conflicts_with = "watch")]
        json: bool,
        /// A live table (state, era, restarts, calls, errors, p50) redrawn every
        /// second, until Ctrl-C.
        #[arg(long)]
        watch: bool,
        /// With --watch: read a running gateway's metrics (`serve --metrics`) at this
        /// URL instead of starting the servers (http://ADDR/metrics), with the bearer
        /// token in MCP_HARNESS_METRICS_TOKEN if there is one.
        #[arg(long, value_name = "URL", requires = "watch", conflicts_with_all = ["config", "stdio", "http", "agent", "ca_file", "wait", "client_id", "client_secret", "client_secret_file", "issuer", "sign_in", "tokens"])]
        from: Option<String>,
    },
    /// The requests waiting for a person in a running gateway (`serve --admin`): list
    /// them, or `accept ID` / `decline ID`.
    Approvals(approvals::ApprovalsArgs),
    /// Sign in to a server ahead of time (it must be one that asks for sign-in).
    Login {
        #[command(flatten)]
        servers: ServerArgs,
        /// The server's id.
        server: String,
    },
    /// Forget a server's tokens.
    Logout {
        #[command(flatten)]
        servers: ServerArgs,
        /// The server's id.
        server: String,
    },
    /// Serve every tool the harness governs as one MCP server: Streamable HTTP at
    /// http://ADDR/mcp (`--listen`), or one client on stdin/stdout (`--stdio` alone).
    Serve(Box<serve::ServeArgs>),
    /// Walk through what the harness does, against MCP servers that ship inside this
    /// binary (stdio and loopback HTTP, both protocol eras). Needs no network.
    Demo,
    /// Act as a demo MCP server (for the demo, the tests and the benchmarks).
    DemoServer(Box<demo_server::DemoServerArgs>),
    /// Act as a demo OAuth authorization server that approves without a person (for
    /// the sign-in tests).
    DemoAuthServer(Box<demo_auth::DemoAuthArgs>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The demo is a walk-through: its crashes and restarts are the point, and their log
    // lines would break it up; RUST_LOG still shows them when asked for.
    let default_filter = match cli.command {
        Command::Demo => "off",
        _ => "warn",
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            errln!("mcp-harness: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    // The exporter's batch processor runs on the runtime.
    let entered = runtime.enter();
    // The test servers of this binary inherit their parent's OTEL_* and export
    // nothing; a bad OTEL_* setting costs the export, not the command.
    let serves_tests = matches!(
        cli.command,
        Command::DemoServer(_) | Command::DemoAuthServer(_)
    );
    let (provider, telemetry, substituted) = if serves_tests {
        (None, None, Default::default())
    } else {
        // The `[telemetry]` table, read before the command runs (its errors are the
        // command's to report).
        // Logged to stderr as the command's would be: what it warns of (a file others
        // may write) is said once per path, and would be said to no one otherwise. Its
        // other warnings are the command's own read's to say (said here too, each came
        // twice).
        let early = {
            use tracing_subscriber::Layer;
            use tracing_subscriber::filter::FilterExt;
            use tracing_subscriber::layer::SubscriberExt;
            let only_access = tracing_subscriber::filter::Targets::new().with_target(
                mcp_harness::config::file::ACCESS_WARNINGS,
                tracing::Level::TRACE,
            );
            tracing_subscriber::registry().with(
                tracing_subscriber::fmt::layer()
                    .with_writer(log_writer)
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                    .with_filter(
                        tracing_subscriber::EnvFilter::try_from_default_env()
                            .unwrap_or_else(|_| default_filter.into())
                            .and(only_access),
                    ),
            )
        };
        let loaded = config_path(&cli.command).and_then(|p| {
            tracing::subscriber::with_default(early, || commands::read_first(p).ok())
        });
        // Its errors may quote what a `${VAR}` put in (an endpoint with a key in it).
        let substituted = loaded
            .as_ref()
            .map(|l| l.substituted.clone())
            .unwrap_or_default();
        let config = loaded
            .and_then(|l| telemetry::TelemetryConfig::from_value(l.telemetry.as_ref()).ok())
            .unwrap_or_default();
        let shown =
            |e: &anyhow::Error| terminal::sanitize(&substituted.redact(&format!("{e:#}")), true);
        let provider = match telemetry::tracer(&config) {
            // `always_off` keeps no trace, not even a caller's: nothing is exported.
            Ok(_) if telemetry::traces_off() => None,
            Ok(p) => p,
            Err(e) => {
                errln!("mcp-harness: traces are not exported: {}", shown(&e));
                None
            }
        };
        if let Err(e) = telemetry::meter(&config) {
            errln!("mcp-harness: metrics are not exported: {}", shown(&e));
        }
        (provider, Some(()), substituted)
    };
    {
        use tracing_subscriber::Layer;
        use tracing_subscriber::filter::FilterExt;
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::util::SubscriberInitExt;
        let logs = tracing_subscriber::fmt::layer()
            .with_writer(log_writer)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| default_filter.into())
                    .and(telemetry::sdk_log_filter()),
            );
        tracing_subscriber::registry()
            .with(logs)
            .with(provider.as_ref().map(telemetry::layer))
            .init();
    }
    drop(entered);
    let outcome = runtime.block_on(run(cli.command));
    if (telemetry.is_some() || provider.is_some()) && !signals::stopped_at_once() {
        runtime.block_on(flush_at_exit(telemetry.is_some(), provider));
    }
    // A blocking thread still stuck (an audit write to a pipe no one reads) is left
    // behind, not waited for: the harness has reported what it could not write, and the
    // exit code must get out.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match outcome {
        Ok(0) if output_failed() => {
            errln!("mcp-harness: the output could not be written");
            ExitCode::from(1)
        }
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            // A config file's names and values are in it: printed without escapes, and
            // without what a `${VAR}` put in (a key in a setting the harness refused).
            errln!(
                "mcp-harness: {}",
                terminal::sanitize(&substituted.redact(&format!("{e:#}")), true)
            );
            let usage = e.downcast_ref::<UsageError>().is_some();
            ExitCode::from(if usage { USAGE } else { 1 })
        }
    }
}

/// Sends the last metrics and every span ended so far, for at most
/// [`telemetry::exit_flush_limit`], and not past a signal: the exit (and the end of
/// servers left to the runtime's drop) waits no longer for a slow collector.
async fn flush_at_exit(
    metrics: bool,
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
) {
    // The SDK's shutdown blocks its thread until its exports end.
    let flushed = tokio::task::spawn_blocking(move || {
        if metrics {
            telemetry::shutdown_metrics();
        }
        if let Some(provider) = provider
            && let Err(e) = provider.shutdown()
        {
            errln!(
                "mcp-harness: exporting traces: {}",
                terminal::sanitize(&e.to_string(), true)
            );
        }
    });
    let limit = telemetry::exit_flush_limit();
    if limit.is_zero() {
        // No exporter was made: nothing to wait for.
        let _ = flushed.await;
        return;
    }
    let mut stop = signals::Stop::install_for_exit();
    tokio::select! {
        biased;
        _ = flushed => {}
        () = tokio::time::sleep(limit) => {
            errln!("mcp-harness: telemetry not all exported: the collector took longer than the export timeout");
        }
        _ = stop.recv() => {}
    }
}

/// The config file a command reads, if any.
fn config_path(command: &Command) -> Option<&std::path::Path> {
    let servers = match command {
        Command::Tools { servers, .. }
        | Command::Search { servers, .. }
        | Command::Call { servers, .. }
        | Command::Status { servers, .. }
        | Command::Login { servers, .. }
        | Command::Logout { servers, .. } => servers,
        Command::Serve(args) => &args.servers,
        Command::Demo
        | Command::DemoServer(_)
        | Command::DemoAuthServer(_)
        | Command::Approvals(_) => return None,
    };
    servers.config.as_deref()
}

async fn run(command: Command) -> anyhow::Result<u8> {
    let (servers, action) = match command {
        Command::Demo => {
            // Interrupted, the demo's future is dropped: its servers are stopped and its
            // directory removed as their handles go.
            let mut stop = signals::Stop::install();
            return tokio::select! {
                done = demo::run() => done.map(|()| commands::OK),
                code = stop.recv() => {
                    errln!("\nmcp-harness: interrupted; stopping the demo");
                    Ok(code)
                }
            };
        }
        Command::DemoServer(args) => return demo_server::run(*args).await.map(|()| 0),
        Command::DemoAuthServer(args) => return demo_auth::run(*args).await.map(|()| 0),
        Command::Serve(args) => return serve::run(*args).await,
        Command::Approvals(args) => return approvals::run(args).await,
        Command::Tools { servers, tag, json } => (servers, Action::Tools { tag, json }),
        Command::Search {
            servers,
            query,
            limit,
            json,
        } => (servers, Action::Search { query, limit, json }),
        Command::Call {
            servers,
            tool,
            args,
            answers,
            json,
        } => (
            servers,
            Action::Call {
                tool,
                args,
                answers,
                json,
            },
        ),
        Command::Status {
            from: Some(url), ..
        } => {
            let from = commands::from_url(&url)?;
            if std::env::var_os("MCP_HARNESS_METRICS_TOKEN").is_some() {
                commands::token_may_go_to(&from, "MCP_HARNESS_METRICS_TOKEN")?;
            }
            // Ctrl-C (or SIGTERM) is how a watch ends.
            let mut stop = signals::Stop::install();
            let stopped = async move {
                stop.recv().await;
            };
            return watch::watch(watch::Source::Gateway(url), stopped).await;
        }
        Command::Status {
            servers,
            json,
            watch,
            from: None,
        } => (servers, Action::Status { json, watch }),
        Command::Login { servers, server } => (servers, Action::Login { server }),
        Command::Logout { servers, server } => {
            // Signing out starts no server: a config that names none, or no longer this
            // one, still leads to its tokens; one that does not load here (a variable
            // unset in this shell) does not stand in the way of `--tokens DIR`.
            let setup = match commands::load_serverless(&servers) {
                Ok(setup) => setup,
                Err(_) if servers.tokens.is_some() => commands::Setup {
                    loaded: Default::default(),
                    agent: String::new(),
                },
                Err(e) => return Err(e.into()),
            };
            let store = sign_in::file_store(&setup, servers.tokens.as_ref())?;
            let known = setup.loaded.config.servers.iter().any(|s| s.id == server);
            return sign_in::logout(store.as_ref(), &server, known);
        }
    };
    let mut setup = commands::load(&servers)?;
    if let Action::Login { server } = &action {
        // Only the server signed in to is started, and no sampling handler (whose API key
        // has nothing to do with signing in, and may not be in this environment).
        setup.loaded.config.servers.retain(|s| &s.id == server);
        setup.loaded.config.sampling = None;
        if setup.loaded.config.servers.is_empty() {
            return Err(UsageError(anyhow::anyhow!(
                "no server named {:?}",
                terminal::line(server)
            ))
            .into());
        }
    }
    let (answers, args) = match &action {
        Action::Call { answers, args, .. } => (
            commands::json_arg("--answers", answers.as_deref())?,
            commands::json_arg("ARGS_JSON", args.as_deref())?,
        ),
        _ => (None, None),
    };
    let login = matches!(action, Action::Login { .. });
    let watching = matches!(action, Action::Status { watch: true, .. });
    // Ctrl-C (or SIGTERM) is how a watch ends; anything else it interrupts.
    let stopped_with = |code: u8| {
        if watching {
            return commands::OK;
        }
        errln!("\nmcp-harness: interrupted; stopping servers");
        code
    };
    let mut stop = signals::Stop::install();
    // A start held up (a CA bundle or cache on a mount that hangs) hears a signal too:
    // what it started is killed as the runtime goes.
    let harness = tokio::select! {
        started = commands::start(&setup, &servers, answers, login) => started?,
        code = stop.recv() => return Ok(stopped_with(code)),
    };
    let leaves_out = !matches!(action, Action::Status { .. } | Action::Login { .. });
    // Startup, and the stop of servers still starting after --wait (each may take its
    // grace), both hear a signal.
    let starting = async {
        commands::settle(&harness, servers.wait, login).await;
        if leaves_out {
            commands::go_on_without_unsettled(&harness, servers.wait).await;
        }
    };
    let stopped = tokio::select! {
        () = starting => None,
        code = stop.recv() => Some(code),
    };
    if let Some(code) = stopped {
        let code = stopped_with(code);
        return Ok(match shut_down(&harness, &mut stop).await {
            Ok(health) => commands::audited(code, &health),
            Err(again) => again,
        });
    }
    let agent = setup.agent.clone();
    let work = async {
        match &action {
            Action::Tools { tag, json } => {
                commands::tools(&harness, &agent, tag.as_deref(), *json).await
            }
            Action::Search { query, limit, json } => {
                commands::search(&harness, &agent, query, *limit, *json).await
            }
            Action::Call { tool, json, .. } => {
                let args = args.clone().unwrap_or_else(|| serde_json::json!({}));
                commands::call(&harness, &agent, tool, args, *json).await
            }
            // The signal that ends it is taken below, with the others.
            Action::Status { watch: true, .. } => {
                watch::watch(watch::Source::Own(&harness), std::future::pending()).await
            }
            Action::Status { json, .. } => commands::status(&harness, *json),
            Action::Login { server } => sign_in::login(&harness, server).await,
        }
    };
    let (outcome, signalled) = tokio::select! {
        r = work => (r, false),
        code = stop.recv() => (Ok(stopped_with(code)), true),
    };
    // A signal while the metrics go out (a collector slow to answer, for up to its
    // export timeout) stops the flush: the first counts as the first (the servers still
    // stop gracefully, the audit is still checked), a second ends the program at once.
    let outcome = tokio::select! {
        () = telemetry::flush_metrics() => outcome,
        code = stop.recv() => {
            if signalled {
                signals::stopping_at_once();
                return Ok(code);
            }
            Ok(stopped_with(code))
        }
    };
    match shut_down(&harness, &mut stop).await {
        Ok(health) => outcome.map(|code| commands::audited(code, &health)),
        Err(again) => Ok(again),
    }
}

/// Shuts the harness down gracefully; a signal meanwhile (the second, when one began
/// it) ends the program at once, with that signal's code: the servers are killed as
/// their handles go with the runtime.
async fn shut_down(
    harness: &mcp_harness::HarnessHandle,
    stop: &mut signals::Stop,
) -> Result<mcp_harness::audit::AuditHealth, u8> {
    tokio::select! {
        health = harness.shutdown() => Ok(health),
        again = stop.recv() => {
            signals::stopping_at_once();
            Err(again)
        }
    }
}

enum Action {
    Login {
        server: String,
    },
    Tools {
        tag: Option<String>,
        json: bool,
    },
    Search {
        query: String,
        limit: usize,
        json: bool,
    },
    Call {
        tool: String,
        args: Option<String>,
        answers: Option<String>,
        json: bool,
    },
    Status {
        json: bool,
        watch: bool,
    },
}

#[cfg(test)]
mod tests {
    /// clap checks a command line's definition only when it is built, in debug builds:
    /// a conflict named wrong would panic the first time that command runs.
    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
