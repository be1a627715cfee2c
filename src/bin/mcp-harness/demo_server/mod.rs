//! `mcp-harness demo-server`: an MCP server that ships inside the binary, for the demo,
//! the tests and the benchmarks.
//!
//! It speaks either era (or both), over stdio or Streamable HTTP on loopback, and has
//! fault knobs: tools that hang, answer slowly, write garbage or oversized lines, crash,
//! ask for input forever or need a client capability; flags that crash it on start or
//! after N calls, make it ignore SIGTERM, or start a grandchild process. In modern mode
//! it checks what a 2026-07-28 server must check (the `_meta` envelope, the protocol
//! version, the HTTP headers), so a client that passes against it sends them right.
//! `--record FILE` appends every request it receives (with HTTP headers) as JSON lines.

mod core;
mod http;
mod stdio;
mod tools;

use std::path::PathBuf;

pub use core::{DemoServer, ServeEra};

/// What `--on-discover` makes a legacy server do with `server/discover`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OnDiscover {
    /// Answer with a JSON-RPC error (-32601), as legacy TypeScript servers do.
    Error,
    /// Never answer.
    Ignore,
    /// Exit the process, as old rmcp servers do.
    Exit,
    /// Answer with a JSON-RPC error, then exit (servers that take nothing before
    /// `initialize`).
    ErrorThenExit,
}

/// Where `--oauth-issuer` servers keep their protected resource metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PrmAt {
    /// At the path-inserted well-known URL, named in the challenge.
    Header,
    /// At the path-inserted well-known URL, not named.
    Path,
    /// At the root well-known URL only, not named.
    Root,
}

/// Command-line options of `mcp-harness demo-server`.
#[derive(Clone, Debug, clap::Args)]
pub struct DemoServerArgs {
    /// The server's name in `serverInfo` and in its tool descriptions.
    #[arg(default_value = "demo")]
    pub name: String,
    /// Which era to speak.
    #[arg(long, value_enum, default_value = "modern")]
    pub era: ServeEra,
    /// Serve Streamable HTTP on this loopback address (port 0 picks one) instead of
    /// stdio; the first line on stdout is `listening URL`.
    #[arg(long)]
    pub http: Option<String>,
    /// Modern versions this server supports (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "2026-07-28")]
    pub versions: Vec<String>,
    /// What a legacy server does with `server/discover`.
    #[arg(long, value_enum, default_value = "error")]
    pub on_discover: OnDiscover,
    /// `ttlMs` on list results and discover.
    #[arg(long, default_value_t = 60_000)]
    pub ttl_ms: i64,
    /// `cacheScope` on list results and discover (`public` or `private`).
    #[arg(long, default_value = "public")]
    pub cache_scope: String,
    /// Serve this many extra generated tools (`gen_0` …) besides the built-in ones.
    #[arg(long, default_value_t = 0)]
    pub extra_tools: usize,
    /// Serve the tools of this file (a `tools/list` result, `{"tools": [...]}`) instead
    /// of the built-in ones; they can be listed, not called (the search benchmark's
    /// catalog of real servers' tools).
    #[arg(long)]
    pub tools_file: Option<std::path::PathBuf>,
    /// Add a tool whose description is this many MiB (a hostile server: its listing
    /// is past any sane bound).
    #[arg(long)]
    pub huge_schema: Option<usize>,
    /// Tools per `tools/list` page (0: one page).
    #[arg(long, default_value_t = 0)]
    pub page_size: usize,
    /// Serve N `tools/call` requests, then exit(1) on the next one without answering.
    #[arg(long)]
    pub crash_after: Option<u64>,
    /// Exit(1) at once, before reading anything.
    #[arg(long)]
    pub crash_on_start: bool,
    /// Ignore SIGTERM and stdin EOF (only SIGKILL stops it).
    #[arg(long)]
    pub ignore_sigterm: bool,
    /// Start a grandchild process (`sleep`) in the same process group.
    #[arg(long)]
    pub spawn_child: bool,
    /// On HTTP, answer every request with an event stream instead of JSON.
    #[arg(long)]
    pub sse: bool,
    /// Append every request received (method, params, HTTP headers) to this file.
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// A hostile list: every `tools/list` page carries a tool this many MiB large and a
    /// fresh `nextCursor`, forever.
    #[arg(long)]
    pub huge_pages: Option<usize>,
    /// Cursors name this epoch; a cursor of another epoch is refused (-32602), as after
    /// a server restart that changed its cursor format.
    #[arg(long, default_value_t = 0)]
    pub cursor_epoch: u64,
    /// Cursors name this process (its pid) as their epoch: a restarted server refuses
    /// the cursors its predecessor handed out.
    #[arg(long)]
    pub cursor_epoch_per_process: bool,
    /// The error code a refused cursor is answered with (the spec says -32602; some
    /// servers answer an internal error).
    #[arg(long, default_value_t = -32602, allow_hyphen_values = true)]
    pub cursor_refusal_code: i64,
    /// Do not say that the tool list changes (`listChanged`): the client then holds no
    /// subscription, and a restart's new one does not read the lists again.
    #[arg(long)]
    pub no_list_changed: bool,
    /// Modern results carry no cache hints (`ttlMs`, `cacheScope`), which the spec says
    /// they must.
    #[arg(long)]
    pub no_hints: bool,
    /// Every other `tools/list` answer has one more tool (`alt`): a list that looks
    /// different to each of two callers who list in turn.
    #[arg(long)]
    pub alternate_tools: bool,
    /// `ttlMs` per `tools/list` page, by page index (the last repeats).
    #[arg(long, value_delimiter = ',')]
    pub page_ttls: Vec<i64>,
    /// `cacheScope` per `tools/list` page, by page index (the last repeats): a server
    /// whose pages disagree, as the spec says they must not.
    #[arg(long, value_delimiter = ',')]
    pub page_scopes: Vec<String>,
    /// Wait this long before answering `tools/list` and `resources/list` (the tool list
    /// as it was when asked).
    #[arg(long, default_value_t = 0)]
    pub list_delay_ms: u64,
    /// Wait this long before answering every legacy HTTP `initialize` after the first
    /// (a session renewal that takes its time).
    #[arg(long, default_value_t = 0)]
    pub renewal_delay_ms: u64,
    /// Wait this long before accepting `notifications/initialized` once a legacy HTTP
    /// session has been renewed (a renewal stalled after its `initialize`).
    #[arg(long, default_value_t = 0)]
    pub initialized_delay_ms: u64,
    /// Answer every legacy HTTP `initialize` after the first with an event stream that
    /// names its new session and then never sends the result (a renewal whose reply
    /// stalls after its headers).
    #[arg(long)]
    pub renewal_reply_stalls: bool,
    /// Answer a legacy `initialize` with this protocol version, whatever was asked (one
    /// the client may not speak).
    #[arg(long)]
    pub legacy_version: Option<String>,
    /// HTTP legacy only: answer every `initialize` after the first with this protocol
    /// version (a server upgraded behind its address: a session renewed there is not
    /// the session it was).
    #[arg(long)]
    pub renewal_version: Option<String>,
    /// HTTP legacy only: answer every `initialize` after the first with a JSON-RPC
    /// error of this code (-32602: a server that no longer speaks the version; -32603:
    /// one that keeps failing).
    #[arg(long, allow_hyphen_values = true)]
    pub refuse_renewal_code: Option<i64>,
    /// Refuse every legacy HTTP `initialize` with an error, and name a session in the
    /// refusal's headers all the same (a server that begins a session it then refuses).
    #[arg(long)]
    pub refuse_initialize_with_session: bool,
    /// Serve `demo://echo/TEXT` (its text), a resource no list names, from the template
    /// `demo://echo/{text}` it lists.
    #[arg(long)]
    pub resource_template: bool,
    /// Answer `resources/templates/list` with "method not found", as servers of SDKs
    /// without the method do.
    #[arg(long)]
    pub no_templates_method: bool,
    /// List this resource template too, without serving what it makes (a server whose
    /// list says more than it has).
    #[arg(long)]
    pub list_template: Vec<String>,
    /// List a resource of this URI too, read as a line naming it (a hostile server's
    /// list: `other__x`, which reads as another server's qualified name).
    #[arg(long)]
    pub list_resource: Vec<String>,
    /// Before answering a legacy `initialize`, ping the client and wait for its answer
    /// (the protocol lets a server ping before `initialized`). Over HTTP the reply is an
    /// event stream, and the answer must come in the session its headers name.
    #[arg(long)]
    pub ping_before_initialize: bool,
    /// HTTP legacy only: end the session on the first `tools/call` it gets, answered 404
    /// as an expired session's (the client begins another and sends the call again).
    #[arg(long)]
    pub expire_on_first_call: bool,
    /// End each legacy GET event stream as soon as it opens (an empty 200 stream).
    #[arg(long)]
    pub close_get_streams: bool,
    /// Answer the first this many legacy GET event streams 503 (a server or proxy
    /// restarting).
    #[arg(long, default_value_t = 0)]
    pub fail_gets: u64,
    /// Never answer a legacy GET for an event stream (its headers never come).
    #[arg(long)]
    pub hang_gets: bool,
    /// Hold each POSTed answer to this server's own requests this long before taking it
    /// (legacy HTTP: a server slow to read what a client sends back).
    #[arg(long, default_value_t = 0)]
    pub hold_answers_ms: u64,
    /// Before answering the first `server/discover`, send this many
    /// `notifications/message` (a server that talks before its handshake is done).
    #[arg(long, default_value_t = 0)]
    pub notify_at_discover: u64,
    /// The size of the data of each of `--notify-at-discover`'s notifications.
    #[arg(long, default_value_t = 16)]
    pub notification_bytes: usize,
    /// Answer the first request with -32022 naming the very version it asked for (some
    /// servers reject a stateless client's first request whatever it says).
    #[arg(long)]
    pub reject_first_request: bool,
    /// `grow` ends every subscription after telling it of the change, with
    /// `notifications/cancelled` naming its listen request and no final result (how one
    /// spec page has a server end a subscription).
    #[arg(long)]
    pub cancel_listens: bool,
    /// Refuse `subscriptions/listen` (method not found) while saying that the tool list
    /// changes (`listChanged`): a server whose changes no subscription announces.
    #[arg(long)]
    pub refuse_listen: bool,
    /// HTTP only: answer this many `subscriptions/listen` requests after the first with
    /// 503 (a server restarting behind a proxy while its client listens again).
    #[arg(long, default_value_t = 0)]
    pub unavailable_listens: u64,
    /// HTTP only: hold this many `subscriptions/listen` requests after those (and the
    /// first) unanswered (a server that takes a subscription and never acknowledges it).
    #[arg(long, default_value_t = 0)]
    pub silent_listens: u64,
    /// List `confirm` and `rounds` only to clients that declared elicitation (legacy:
    /// at `initialize`), as many legacy servers do.
    #[arg(long)]
    pub tools_need_elicitation: bool,
    /// Also list a tool with this exact name (it answers with the server's name; its
    /// `query` argument is bound to `Mcp-Param-Query`).
    #[arg(long)]
    pub tool_alias: Vec<String>,
    /// Annotate the tool of this name `idempotentHint: true` (a client that trusts
    /// annotations may then send its call to another server after a failure).
    #[arg(long)]
    pub idempotent: Vec<String>,
    /// HTTP only: answer every POST with this status.
    #[arg(long)]
    pub status_all: Option<u16>,
    /// HTTP only: answer every POST with 200 and this `Content-Type` (a server that
    /// answers in a type no client reads).
    #[arg(long)]
    pub content_type_all: Option<String>,
    /// HTTP only: answer every POST with a 307 redirect to this URL.
    #[arg(long)]
    pub redirect_to: Option<String>,
    /// HTTP only: serve HTTPS with this PEM certificate chain (and `--tls-key`).
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// HTTP only: the PEM private key for `--tls-cert`.
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// stdio only: stop reading stdin after this many messages (the process lives on).
    #[arg(long)]
    pub stop_reading_after: Option<u64>,
    /// stdio only: with `--stop-reading-after`, read again after this many milliseconds
    /// (a server that stalls, then catches up).
    #[arg(long)]
    pub resume_reading_after_ms: Option<u64>,
    /// Append this process's pid to this file at startup, before anything else (a
    /// test's census of the processes it caused; the path doubles as a marker in the
    /// command line).
    #[arg(long)]
    pub census: Option<PathBuf>,
    /// Answer `server/discover` with this JSON-RPC error code (-32020, -32021, …).
    #[arg(long, allow_hyphen_values = true)]
    pub discover_error: Option<i64>,
    /// HTTP only: answer `server/discover` (and only it) with this HTTP status.
    #[arg(long)]
    pub discover_status: Option<u16>,
    /// HTTP only: answer `server/discover` with an HTML page (not JSON-RPC).
    #[arg(long)]
    pub discover_html: bool,
    /// After this many requests (`server/discover` not counted), stop supporting the
    /// first of `--versions`: requests naming it get -32022 with the rest.
    #[arg(long)]
    pub retire_version_after: Option<u64>,
    /// Answer `tools/list` with `input_required` (which only calls may send), with
    /// cache hints as if it were cacheable.
    #[arg(long)]
    pub list_input_required: bool,
    /// Answer `tools/list` with a page of the wrong shape: `tools-object` (`tools` an
    /// object, not an array) or `cursor-number` (`nextCursor` a number).
    #[arg(long, value_parser = ["tools-object", "cursor-number"])]
    pub malformed_list: Option<String>,
    /// HTTP only: require bearer tokens from this authorization server (its issuer
    /// URL), checked with `--oauth-secret` (see `demo-auth-server`).
    #[arg(long)]
    pub oauth_issuer: Option<String>,
    /// The secret the authorization server signs its tokens with.
    #[arg(long, default_value = "")]
    pub oauth_secret: String,
    /// The scope every request needs.
    #[arg(long, default_value = "mcp:read")]
    pub oauth_scope: String,
    /// `TOOL=SCOPE`: a tool that also needs this scope (a 403 `insufficient_scope`).
    #[arg(long)]
    pub oauth_tool_scope: Vec<String>,
    /// Hold each `--oauth-tool-scope` refusal this long before sending it (a server
    /// that spends a client's deadline on every try).
    #[arg(long)]
    pub oauth_refusal_delay_ms: Option<u64>,
    /// Where the protected resource metadata is found.
    #[arg(long, value_enum, default_value = "header")]
    pub oauth_prm: PrmAt,
    /// The `resource` the metadata names (default: this server's URL).
    #[arg(long)]
    pub oauth_resource: Option<String>,
    /// The metadata names this server's origin (`https://host:port/`) as its `resource`,
    /// a prefix of its URL.
    #[arg(long)]
    pub oauth_resource_root: bool,
    /// The challenge names the metadata under this host name instead of the server's
    /// own (`localhost` for `127.0.0.1`: another origin), and the metadata names the
    /// server's own URL as its `resource` whatever host it was asked by.
    #[arg(long)]
    pub oauth_prm_host: Option<String>,
    /// Leave `scope` out of the challenge.
    #[arg(long)]
    pub oauth_no_scope_hint: bool,
    /// Refuse (401) every token of this subject, however fresh (a server that will not
    /// take what its authorization server issues).
    #[arg(long)]
    pub oauth_refuse_subject: Option<String>,
    /// Refuse (401) the first this many GET event streams that carry a valid token.
    #[arg(long, default_value_t = 0)]
    pub oauth_refuse_gets: u64,
    /// Refuse (401) the first this many `subscriptions/listen` requests that carry a
    /// valid token.
    #[arg(long, default_value_t = 0)]
    pub oauth_refuse_listens: u64,
    /// After this many calls of `region_echo`, its argument goes in `Mcp-Param-Zone`
    /// instead of `Mcp-Param-Region` (a server whose annotations changed).
    #[arg(long)]
    pub rename_param_header_after: Option<u64>,
}

/// Runs the server until stdin closes (stdio) or the process is stopped (HTTP).
pub async fn run(args: DemoServerArgs) -> anyhow::Result<()> {
    if let Some(path) = &args.census {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        writeln!(file, "{}", std::process::id())?;
    }
    if args.crash_on_start {
        eprintln!("demo-server {}: crashing on start as asked", args.name);
        std::process::exit(1);
    }
    if args.ignore_sigterm {
        // Keep a SIGTERM listener alive so the default action (exit) never runs.
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::spawn(async move { while term.recv().await.is_some() {} });
    }
    if args.spawn_child {
        // Inherits our process group; detached from our stdio so it holds no pipes.
        std::process::Command::new("sleep")
            .arg("3600")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?;
    }
    let mut args = args;
    if args.cursor_epoch_per_process {
        args.cursor_epoch = u64::from(std::process::id());
    }
    let server = DemoServer::new(args.clone())?;
    match &args.http {
        Some(addr) => http::serve(server, addr).await,
        None => stdio::serve(server, args.ignore_sigterm).await,
    }
}
