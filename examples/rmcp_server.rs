//! MCP server built with the official Rust SDK (`rmcp` 3.11.0), for interop tests and benchmarks
//! of mcp-harness against the official SDK. `rmcp_server stdio` serves MCP on stdin/stdout;
//! `rmcp_server http [--json]` prints `listening http://127.0.0.1:PORT/mcp` and serves Streamable
//! HTTP until killed or stdin reaches EOF (`--json`: per-request POSTs get JSON, not SSE).
//! Tools: `echo`, `add`, `whoami`, and `grow`, which adds the tool `extra` and tells every
//! `subscriptions/listen` subscription that the tool list changed. Logs (`RUST_LOG`, default `error`) go to stderr only.

use std::{convert::Infallible, io::Write, sync::Arc, time::Duration};

use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::{Request, Response, StatusCode, body::Bytes, body::Incoming};
use hyper_util::rt::TokioIo;
use rmcp::{
    RoleServer, ServerHandler, ServiceExt,
    handler::server::{router::tool::ToolRouter, wrapper::Parameters},
    model::{Implementation, ServerCapabilities, ServerConfig, SubscriptionFilter},
    schemars::JsonSchema,
    service::{RequestContext, SubscriptionContext, SubscriptionSink},
    tool, tool_handler, tool_router,
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    },
};
use serde::Deserialize;
use tokio::io::AsyncReadExt;

#[derive(Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct EchoArgs {
    /// Text to return unchanged.
    text: String,
}

#[derive(Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct AddArgs {
    a: i64,
    b: i64,
}

#[derive(Clone)]
struct Interop {
    /// What `tools/list` shows: every tool but `extra` until `grow` is called.
    tool_router: Arc<parking_lot::RwLock<ToolRouter<Self>>>,
    /// Open `subscriptions/listen` subscriptions.
    listeners: Arc<parking_lot::Mutex<Vec<SubscriptionSink>>>,
}

#[tool_router]
impl Interop {
    fn new() -> Self {
        let mut router = Self::tool_router();
        router.remove_route("extra");
        Self {
            tool_router: Arc::new(parking_lot::RwLock::new(router)),
            listeners: Arc::default(),
        }
    }

    fn router(&self) -> ToolRouter<Self> {
        self.tool_router.read().clone()
    }

    #[tool(description = "Add the tool `extra` and announce the change to subscribers")]
    async fn grow(&self) -> String {
        *self.tool_router.write() = Self::tool_router();
        let sinks: Vec<SubscriptionSink> = self.listeners.lock().clone();
        let mut told = 0;
        let mut closed = Vec::new();
        for sink in &sinks {
            if sink.notify_tool_list_changed().await.is_ok() {
                told += 1;
            } else {
                closed.push(sink.id().clone());
            }
        }
        // Subscriptions that ended are forgotten.
        self.listeners.lock().retain(|s| !closed.contains(s.id()));
        format!("extra added; {told} subscriptions told")
    }

    #[tool(description = "A tool that appears only after `grow`")]
    fn extra(&self) -> String {
        "extra".into()
    }

    #[tool(description = "Return the given text unchanged")]
    fn echo(&self, Parameters(EchoArgs { text }): Parameters<EchoArgs>) -> String {
        text
    }

    #[tool(description = "Add two 64-bit integers")]
    fn add(&self, Parameters(AddArgs { a, b }): Parameters<AddArgs>) -> Result<String, String> {
        // An `Err` becomes a tool result with `isError: true`.
        a.checked_add(b)
            .map(|sum| sum.to_string())
            .ok_or_else(|| "overflow".to_string())
    }

    #[tool(description = "Report the protocol version and client info of this request")]
    fn whoami(&self, ctx: RequestContext<RoleServer>) -> String {
        serde_json::json!({
            "protocolVersion": ctx.protocol_version().map(|v| v.to_string()),
            "perRequestMeta": ctx.meta.protocol_version().is_some(),
            "clientInfo": ctx.client_info(),
        })
        .to_string()
    }
}

#[tool_handler(router = self.router())]
impl ServerHandler for Interop {
    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        Some(requested.clone())
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), rmcp::ErrorData> {
        self.listeners.lock().push(context.sink().clone());
        context.cancelled().await;
        Ok(())
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new(
            "rmcp-interop",
            env!("CARGO_PKG_VERSION"),
        ))
        .with_instructions("rmcp interop test server")
    }
}

// Unused when benches/harness.rs includes this file for `run`.
#[allow(dead_code)]
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    run(std::env::args().skip(1).collect()).await
}

/// Serves as `args` say: `stdio`, or `http [--json]`.
pub async fn run(args: Vec<String>) -> anyhow::Result<()> {
    match args.first().map(String::as_str) {
        // `stdio_pipes` is rmcp's stdio transport on non-blocking pipes (falls back to `stdio()`).
        Some("stdio") => {
            Interop::new()
                .serve(rmcp::transport::stdio_pipes())
                .await?
                .waiting()
                .await?;
            Ok(())
        }
        Some("http") => serve_http(args.iter().any(|a| a == "--json")).await,
        _ => anyhow::bail!("usage: rmcp_server stdio | rmcp_server http [--json]"),
    }
}

async fn serve_http(json_response: bool) -> anyhow::Result<()> {
    // Legacy session mode (rmcp's default) serves both eras on one endpoint, classifying each
    // POST: `initialize` opens a session (Mcp-Session-Id, required on later legacy requests);
    // `server/discover` and requests whose `_meta` has protocolVersion + clientCapabilities (or
    // name >= 2026-07-28) are served statelessly. `false` would make `initialize` stateless too
    // (no session id, GET stream or DELETE), hiding the legacy behaviour we want to test.
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(true)
        .with_json_response(json_response);
    let server = Interop::new();
    let service: StreamableHttpService<Interop, LocalSessionManager> = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening http://{addr}/mcp")?;
        out.flush()?;
    }

    tokio::select! {
        _ = accept_loop(listener, service) => {}
        _ = stdin_eof() => tracing::info!("stdin closed; shutting down"),
    }
    Ok(())
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    service: StreamableHttpService<Interop, LocalSessionManager>,
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await; // e.g. EMFILE: back off, retry
            continue;
        };
        let service = service.clone();
        tokio::spawn(async move {
            // The inherent `handle` avoids needing tower / hyper-util's `service` feature.
            let hyper_service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let service = service.clone();
                async move {
                    let response = if req.uri().path() == "/mcp" {
                        service.handle(req).await
                    } else {
                        not_found()
                    };
                    Ok::<_, Infallible>(response)
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), hyper_service);
            if let Err(error) = conn.await {
                tracing::debug!(%error, "connection ended with error");
            }
        });
    }
}

fn not_found() -> Response<BoxBody<Bytes, Infallible>> {
    let mut response = Response::new(Full::new(Bytes::from_static(b"Not Found")).boxed());
    *response.status_mut() = StatusCode::NOT_FOUND;
    response
}

/// Resolves when stdin reaches EOF; after a read error (e.g. no stdin) it never resolves.
async fn stdin_eof() {
    let (mut stdin, mut buf) = (tokio::io::stdin(), [0u8; 256]);
    while let Ok(n) = stdin.read(&mut buf).await {
        if n == 0 {
            return;
        }
    }
    std::future::pending::<()>().await
}
