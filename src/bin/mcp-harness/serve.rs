//! `serve`: the harness as one MCP server, over Streamable HTTP (`--listen`) or for one
//! client on stdin/stdout (`--stdio`).

use std::time::{Duration, Instant};

use mcp_harness::gateway::{self, Gateway, GatewayConfig, Principal, Sealer};
use mcp_harness::{Harness, ServerState};

use crate::commands::{self, ServerArgs, UsageError};

/// What `serve` takes.
#[derive(Clone, Debug, clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub servers: ServerArgs,
    /// Serve Streamable HTTP at http://ADDR/mcp (default 127.0.0.1:8800).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Seal requestState with a key made now (development only: rounds do not survive
    /// a restart, and no other gateway process can continue them).
    #[arg(long)]
    pub dev_keys: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics (a listener of its own, without
    /// authentication: bind it where only scrapers reach).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// Serve the requests waiting for a person (sampling approvals) at
    /// http://ADDR/approvals, to holders of `[gateway] admin_tokens`
    /// (`mcp-harness approvals` is its client).
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<String>,
    /// Print a new sealing key line (`KID:BASE64URL`) and exit.
    #[arg(long)]
    pub new_key: bool,
}

/// Declares elicitation to legacy servers (so that they ask during calls, which the
/// gateway routes to the caller's client) and declines what comes outside a call.
struct DeclineOutsideCalls;

impl mcp_harness::InputHandler for DeclineOutsideCalls {
    fn capability(&self) -> serde_json::Value {
        serde_json::json!({"form": {}, "url": {}})
    }

    fn answer(&self, _: mcp_harness::InputRequestContext) -> mcp_harness::call::input::InputFuture {
        Box::pin(async { Ok(serde_json::json!({"action": "decline"})) })
    }
}

pub async fn run(args: ServeArgs) -> anyhow::Result<u8> {
    if args.new_key {
        // Named by when it was made, to the microsecond: ids must differ across the
        // keys in force, and a process id does not (every container's first is 1).
        let made = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let kid = format!("k{}-{:06}", made.as_secs(), made.subsec_micros());
        // Written or failed loudly: a key lost to a full disk must not look made.
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        writeln!(out, "{kid}:{}", gateway::seal::new_key()?)?;
        out.flush()?;
        return Ok(commands::OK);
    }
    if std::process::id() == 1 {
        // Descendants of a server killed with its group are reparented to PID 1, and
        // only an init reaps what it did not start: each would stay a zombie.
        tracing::warn!(
            "running as PID 1: the orphaned descendants of servers are not reaped; run under an init (`docker run --init`, tini)"
        );
    }
    let usage = |e: gateway::GatewayError| UsageError(e.into());
    // `--stdio` without a command: serve one client on stdin/stdout, as the `--agent`.
    let mut servers = args.servers.clone();
    let pipe = servers.stdio.iter().any(String::is_empty);
    if pipe && args.listen.is_some() {
        return Err(UsageError(anyhow::anyhow!(
            "--listen serves HTTP and a bare --stdio serves one client on stdin/stdout: pick one"
        ))
        .into());
    }
    servers.stdio.retain(|c| !c.is_empty());
    let setup = commands::load(&servers)?;
    if pipe && is_stdout(setup.loaded.config.audit.path.as_deref()) {
        return Err(UsageError(anyhow::anyhow!(
            "audit.path is (or is the same file as) this process's stdout, which a bare --stdio serves the client on: its records would run into the messages"
        ))
        .into());
    }
    let config = GatewayConfig::from_value(setup.loaded.gateway.clone())
        .map_err(|e| usage(redacted(e, &setup.loaded)))?;
    let sealer = if args.dev_keys {
        tracing::warn!("sealing with a key made now (--dev-keys): development only");
        Sealer::ephemeral(config.state_ttl).map_err(usage)?
    } else {
        config.sealer().map_err(usage)?
    };
    // Said before any server starts, not after they have settled.
    if args.admin.is_some() && config.admin_tokens.is_empty() {
        return Err(UsageError(anyhow::anyhow!(
            "--admin needs [gateway] admin_tokens (the SHA-256 of each admin token)"
        ))
        .into());
    }
    // The downstream clients answer their calls' input: a legacy server's elicitation
    // during a call goes to the caller's client; outside calls it is declined.
    let mut builder = Harness::builder(setup.loaded.config.clone()).input_handler(
        "elicitation/create",
        std::sync::Arc::new(DeclineOutsideCalls),
    );
    if let Some(store) = crate::sign_in::store(&setup, servers.tokens.as_ref()) {
        builder = builder.token_store(store);
    }
    if let Some(authorizer) = crate::sign_in::authorizer(servers.sign_in, &setup, false)? {
        builder = builder.authorizer(authorizer);
    }
    // Caught from before any server starts, so that a signal while they start stops
    // them too (a stdio server is in a process group of its own).
    let mut stop = crate::signals::Stop::install_serving();
    // A start held up (a CA bundle or cache on a mount that hangs) hears a signal too:
    // what it started is killed as the runtime goes.
    let harness = tokio::select! {
        spawned = builder.spawn() => spawned.map_err(commands::not_started)?,
        code = stop.recv() => return Ok(code),
    };
    tokio::select! {
        () = settle(&harness, servers.wait) => {}
        _ = stop.recv() => {
            return Ok(tokio::select! {
                health = harness.shutdown() => commands::audited(commands::OK, &health),
                code = stop.recv() => {
                    crate::signals::stopping_at_once();
                    code
                }
            });
        }
    }
    // One task takes the signals: the first stops gracefully (calls in flight finish
    // within shutdown_grace), a second at once (the servers' process groups are killed
    // as the runtime drops their handles).
    let (first_tx, first_rx) = tokio::sync::oneshot::channel::<()>();
    let (again_tx, mut again_rx) = tokio::sync::oneshot::channel::<u8>();
    let hangup = stop.take_hangup();
    tokio::spawn(async move {
        stop.recv().await;
        // Taken whether or not a stop has begun otherwise (a stdio client's input
        // ended, and serve shuts down gracefully): the first signal never kills.
        let _ = first_tx.send(());
        let code = stop.recv().await;
        let _ = again_tx.send(code);
    });
    let stopping = async move {
        let _ = first_rx.await;
    };
    // What fails once the servers run (a port taken, a listener refused) stops them
    // gracefully, their audit records written, before it is said.
    let on_error = harness.clone();
    let served = async move {
        crate::telemetry::export_metrics(&harness);
        // The side listeners read the tokens in force (a reload replaces them) from the
        // gateway, made below; `--metrics` takes the ones read at start until then.
        let current: std::sync::Arc<std::sync::OnceLock<Gateway>> = std::sync::Arc::default();
        let metrics = match &args.metrics {
            Some(addr) => {
                let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
                    UsageError(anyhow::anyhow!("cannot listen on {addr} for metrics: {e}"))
                })?;
                let local = listener.local_addr()?;
                if !local.ip().to_canonical().is_loopback() && config.metrics_tokens.is_empty() {
                    // What it tells (server ids, states, error counts, audit records
                    // lost) is then for the operator's network only.
                    tracing::warn!(address = %local, "/metrics asks for no token (gateway.metrics_tokens) and is served beyond this machine");
                }
                {
                    use std::io::Write;
                    // On stderr: stdout is the MCP pipe with --stdio.
                    let mut err = std::io::stderr().lock();
                    writeln!(err, "metrics http://{}/metrics", listener.local_addr()?)?;
                    err.flush()?;
                }
                let (served, at_start, current) = (
                    harness.clone(),
                    config.metrics_tokens.clone(),
                    current.clone(),
                );
                // A reload that takes every token away opens a listener served beyond
                // this machine: said once each time it happens.
                let beyond_loopback = !local.ip().to_canonical().is_loopback();
                let open_told = std::sync::atomic::AtomicBool::new(at_start.is_empty());
                let tokens: gateway::Tokens = std::sync::Arc::new(move || {
                    let tokens = match current.get() {
                        Some(g) => g.config().metrics_tokens.clone(),
                        None => at_start.clone(),
                    };
                    let open = tokens.is_empty();
                    let was = open_told.swap(open, std::sync::atomic::Ordering::Relaxed);
                    if open && !was && beyond_loopback {
                        tracing::warn!(address = %local, "/metrics asks for no token any more (gateway.metrics_tokens is empty since a reload) and is served beyond this machine");
                    }
                    tokens
                });
                Some(tokio::spawn(gateway::metrics::serve(
                    served,
                    listener,
                    config.allowed_hosts.clone(),
                    tokens,
                    std::future::pending(),
                )))
            }
            None => None,
        };
        let admin = match &args.admin {
            Some(addr) => {
                let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
                    UsageError(anyhow::anyhow!("cannot listen on {addr} for admin: {e}"))
                })?;
                {
                    use std::io::Write;
                    let mut err = std::io::stderr().lock();
                    writeln!(err, "admin http://{}/approvals", listener.local_addr()?)?;
                    err.flush()?;
                }
                let queue = harness.approvals();
                let current = current.clone();
                // None until the gateway is made: nobody is let in meanwhile.
                let tokens: gateway::Tokens = std::sync::Arc::new(move || {
                    current
                        .get()
                        .map(|g: &Gateway| g.config().admin_tokens.clone())
                        .unwrap_or_default()
                });
                Some(tokio::spawn(async move {
                    gateway::admin::serve(queue, tokens, listener, std::future::pending()).await
                }))
            }
            None => None,
        };
        let dev_sealer = args.dev_keys.then(|| sealer.clone());
        let gateway = Gateway::new(harness.clone(), &setup.loaded.config, config, sealer)
            .await
            .map_err(usage)?;
        let _ = current.set(gateway.clone());
        let reloader = tokio::spawn(reload_on_change(
            gateway.clone(),
            servers.clone(),
            hangup,
            dev_sealer,
            AtStart {
                telemetry: setup.loaded.telemetry.clone(),
                metrics: args.metrics.is_some(),
                http: !pipe,
                stdio_agent: pipe.then(|| setup.agent.clone()),
            },
        ));
        if pipe {
            let principal = Principal {
                agent: setup.agent.as_str().into(),
                context: None,
            };
            // Pipes are read and written through the reactor; anything else (a file, a
            // terminal) through tokio's blocking stdin/stdout. The session runs on a worker
            // thread, not on the thread that blocks on the runtime: the tasks it spawns per
            // request then start on its own worker instead of waking another one.
            // Both or neither: making one a reactor pipe sets O_NONBLOCK on it, and
            // tokio's blocking stdin or stdout on it then reads a pause as an error.
            let pipes = match is_fifo(0) && is_fifo(1) {
                true => pipe_in().zip(pipe_out()),
                false => None,
            };
            if pipes.is_none() {
                // One made a reactor pipe before the other failed is blocking again.
                blocking(0);
                blocking(1);
            }
            let session = match pipes {
                Some((input, output)) => tokio::spawn(gateway::stdio::serve(
                    gateway, principal, input, output, stopping,
                )),
                None => tokio::spawn(gateway::stdio::serve(
                    gateway,
                    principal,
                    tokio::io::stdin(),
                    tokio::io::stdout(),
                    stopping,
                )),
            };
            if let Err(e) = session.await
                && e.is_panic()
            {
                // As if the session had run on this thread: the panic ends the command.
                std::panic::resume_unwind(e.into_panic());
            }
            reloader.abort();
            for task in [metrics, admin].into_iter().flatten() {
                task.abort();
            }
            crate::telemetry::flush_metrics().await;
            let health = harness.shutdown().await;
            return Ok(commands::audited(commands::OK, &health));
        }
        let addr = args.listen.as_deref().unwrap_or("127.0.0.1:8800");
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| UsageError(anyhow::anyhow!("cannot listen on {addr}: {e}")))?;
        {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            writeln!(out, "listening http://{}/mcp", listener.local_addr()?)?;
            out.flush()?;
        }
        let stop = async {
            stopping.await;
            // The last metrics go out while the harness still runs.
            crate::telemetry::flush_metrics().await;
        };
        gateway::http::serve(gateway, listener, stop).await?;
        reloader.abort();
        for task in [metrics, admin].into_iter().flatten() {
            task.abort();
        }
        // `http::serve` has shut the harness down, its audit trail flushed.
        Ok::<u8, anyhow::Error>(commands::audited(commands::OK, &harness.audit_health()))
    };
    tokio::select! {
        served = served => match served {
            Ok(code) => Ok(code),
            Err(e) => {
                // A signal meanwhile still ends it at once.
                let health = tokio::select! {
                    health = on_error.shutdown() => health,
                    Ok(code) = &mut again_rx => {
                        crate::signals::stopping_at_once();
                        return Ok(code);
                    }
                };
                let code = commands::audited(commands::OK, &health);
                if code != commands::OK {
                    errln!("mcp-harness: {}", crate::terminal::sanitize(&format!("{e:#}"), true));
                    return Ok(code);
                }
                Err(e)
            }
        },
        Ok(code) = &mut again_rx => {
            crate::signals::stopping_at_once();
            Ok(code)
        }
    }
}

/// How long a changed config file must read the same before polling applies it (a
/// tick is a second; a little less, so that the next tick finds it held still).
const HELD_STILL: Duration = Duration::from_millis(900);

/// Reloads on SIGHUP, and when the config file's content changes (read every second):
/// a config that does not load is refused with its error, and the running one kept. A
/// config that is no regular file (a FIFO, `<(…)`) was read once, and is not reloaded:
/// reading it again would wait for a writer.
async fn reload_on_change(
    gateway: Gateway,
    servers: ServerArgs,
    hangup: Option<tokio::signal::unix::Signal>,
    dev_sealer: Option<Sealer>,
    at_start: AtStart,
) {
    let path = servers.config.as_deref();
    let reloadable = path.is_none_or(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file()));
    if !reloadable {
        tracing::info!("the config is not a regular file: it is not reloaded");
    }
    // Never waits: what is read is a regular file's text, else why not (a FIFO put in
    // the file's place since, a file gone); the reload parses that same text.
    let read = || match (reloadable, path) {
        (true, Some(path)) => {
            Some(mcp_harness::config::file::read_regular(path).map_err(|e| e.to_string()))
        }
        _ => None,
    };
    // The text running, not the file as it is now: an edit made while the servers
    // started is a change to apply.
    // But a file that reads as an error now (one anyone may write, which is read at
    // start and never reloaded) is an error from the start, not a change to refuse.
    let mut seen = match (crate::commands::loaded_text(), read()) {
        (_, now @ Some(Err(_))) => now,
        (Some(text), _) if reloadable && path.is_some() => Some(Ok(text)),
        (_, now) => now,
    };
    // Caught since `serve` began (one that came while its servers started is applied
    // now, once).
    let mut hangup = match hangup {
        Some(s) => Some(s),
        None => {
            tracing::warn!("no SIGHUP handler; reloading on file changes only");
            None
        }
    };
    // A change seen by polling, and since when the file has read so: it is applied once
    // that is a second, however late the ticks come.
    let mut changing: Option<(_, Instant)> = None;
    // Said once per change that keeps the file changing (an autosave every second).
    let mut said_changing = false;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    // Ticks missed while a reload ran come one at a time, not in a burst.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let signalled = tokio::select! {
            _ = tick.tick() => false,
            Some(()) = async {
                match hangup.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            } => true,
        };
        let now = read();
        if !signalled && now == seen {
            changing = None;
            said_changing = false;
            continue;
        }
        // A change seen by polling is applied once the file has read the same for a
        // second: one written in place (`>`, an editor that does not rename) could be
        // read half-written, and a half that parses would remove servers or grants.
        // SIGHUP applies the file as it is.
        if !signalled {
            match &changing {
                Some((text, since)) if *text == now && since.elapsed() >= HELD_STILL => {}
                Some((text, _)) if *text == now => continue,
                Some(_) => {
                    if !said_changing {
                        tracing::info!(
                            "the config file is still changing; it is applied once it has not for a second (SIGHUP applies it now)"
                        );
                        said_changing = true;
                    }
                    changing = Some((now, Instant::now()));
                    continue;
                }
                None => {
                    changing = Some((now, Instant::now()));
                    continue;
                }
            }
        }
        changing = None;
        said_changing = false;
        if !reloadable {
            tracing::warn!("the config is not a regular file: not reloaded");
            continue;
        }
        seen = now.clone();
        let text = match now {
            // Said once, when it changes: the same error is not logged every second.
            Some(Err(why)) => {
                tracing::error!(error = %why, "configuration not reloaded; the running one is kept");
                continue;
            }
            Some(Ok(text)) => Some(text),
            None => None,
        };
        let reloaded = reload(
            &gateway,
            &servers,
            dev_sealer.as_ref(),
            &at_start,
            text.as_deref(),
        )
        .await;
        if let Ok(r) = &reloaded
            && !r.needs_restart.is_empty()
        {
            tracing::warn!(settings = ?r.needs_restart, "these settings changed but are read at start only; the running ones stay until a restart");
        }
        match reloaded {
            Ok(r) if r.failed.is_empty() => tracing::info!(
                added = ?r.added,
                removed = ?r.removed,
                restarted = ?r.restarted,
                "configuration reloaded"
            ),
            Ok(r) => tracing::error!(
                added = ?r.added,
                removed = ?r.removed,
                restarted = ?r.restarted,
                failed = ?r.failed,
                "configuration reloaded (grants, tokens and keys in force), but some servers' changes failed"
            ),
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "configuration refused; the running one is kept")
            }
        }
    }
}

/// What the process took at start that a reload compares with: a change of the
/// `[telemetry]` table is named, not applied; settings of a listener (the metrics one,
/// the HTTP one) are named only when it runs.
struct AtStart {
    telemetry: Option<serde_json::Value>,
    metrics: bool,
    http: bool,
    /// The agent a `--stdio` session acts as: taken at start, like a listener's settings.
    stdio_agent: Option<String>,
}

async fn reload(
    gateway: &Gateway,
    servers: &ServerArgs,
    dev_sealer: Option<&Sealer>,
    at_start: &AtStart,
    text: Option<&str>,
) -> anyhow::Result<gateway::Reloaded> {
    let setup = commands::load_with(servers, text)?;
    let telemetry_changed = setup.loaded.telemetry != at_start.telemetry;
    let config = GatewayConfig::from_value(setup.loaded.gateway.clone())
        .map_err(|e| redacted(e, &setup.loaded))?;
    let sealer = match dev_sealer {
        Some(s) => s.clone(),
        None => config.sealer()?,
    };
    let mut reloaded = gateway.reload(&setup.loaded.config, config, sealer).await?;
    reloaded.needs_restart.retain(|name| {
        (at_start.metrics || *name != gateway::METRICS_ALLOWED_HOSTS)
            && (at_start.http || *name != gateway::HTTP_WRITE_TIMEOUT)
    });
    if telemetry_changed {
        reloaded.needs_restart.push("telemetry");
    }
    if at_start
        .stdio_agent
        .as_ref()
        .is_some_and(|a| *a != setup.agent)
    {
        reloaded.needs_restart.push("agent");
    }
    Ok(reloaded)
}

/// Whether `path` names this process's stdout, by name or as the file it is.
fn is_stdout(path: Option<&std::path::Path>) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(path) = path else {
        return false;
    };
    let same =
        |a: &std::fs::Metadata, b: &std::fs::Metadata| (a.dev(), a.ino()) == (b.dev(), b.ino());
    matches!(
        path.to_str(),
        Some("/dev/stdout" | "/dev/fd/1" | "/proc/self/fd/1")
    ) || std::fs::metadata(path)
        .ok()
        .zip(std::fs::metadata("/proc/self/fd/1").ok())
        .is_some_and(|(a, b)| same(&a, &b))
}

/// Whether descriptor `fd` (0 or 1) is a pipe or FIFO.
fn is_fifo(fd: i32) -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::fs::FileTypeExt;
    let owned = match fd {
        0 => std::io::stdin().as_fd().try_clone_to_owned(),
        _ => std::io::stdout().as_fd().try_clone_to_owned(),
    };
    owned
        .and_then(|fd| std::fs::File::from(fd).metadata())
        .is_ok_and(|m| m.file_type().is_fifo())
}

/// Clears O_NONBLOCK on descriptor `fd`.
fn blocking(fd: i32) {
    // SAFETY: fcntl on a descriptor this process holds open for its life (0 or 1), with
    // no pointers; a failure leaves it as it was.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 && flags & libc::O_NONBLOCK != 0 {
            libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
}

/// Stdin as a non-blocking pipe, if it is one.
fn pipe_in() -> Option<tokio::net::unix::pipe::Receiver> {
    use std::os::fd::AsFd;
    let fd = std::io::stdin().as_fd().try_clone_to_owned().ok()?;
    tokio::net::unix::pipe::Receiver::from_file(std::fs::File::from(fd)).ok()
}

/// Stdout as a non-blocking pipe, if it is one.
fn pipe_out() -> Option<tokio::net::unix::pipe::Sender> {
    use std::os::fd::AsFd;
    let fd = std::io::stdout().as_fd().try_clone_to_owned().ok()?;
    tokio::net::unix::pipe::Sender::from_file(std::fs::File::from(fd)).ok()
}

/// Until the servers settle or `wait` passes: the first clients then see every server
/// that could start (the rest join as they come up).
async fn settle(harness: &mcp_harness::HarnessHandle, wait: Duration) {
    let deadline = tokio::time::Instant::now() + wait;
    while tokio::time::Instant::now() < deadline
        && harness
            .status()
            .iter()
            .any(|s| matches!(s.state, ServerState::Starting))
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A `[gateway]` table's error without the values `${…}` put in it.
fn redacted(
    e: gateway::GatewayError,
    loaded: &mcp_harness::config::file::Loaded,
) -> gateway::GatewayError {
    match e {
        gateway::GatewayError::Config(text) => {
            gateway::GatewayError::Config(loaded.substituted.redact(&text))
        }
        other => other,
    }
}
