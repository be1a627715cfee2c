//! Talking MCP to one server: the stdio and Streamable HTTP transports, and the
//! [`Connection`] that detects the server's era and stamps every request.
//!
//! Layers, bottom up: [`stdio`] and [`http`] move JSON-RPC messages and match replies
//! to requests; [`Transport`] is the one enum over them; [`Connection`] probes with
//! `server/discover`, falls back to the legacy `initialize` handshake, adds the `_meta`
//! envelope, and hands server-to-client traffic to the layer above as
//! [`ServerEvent`]s. No actors here: the server actors own connections.
//!
//! Spec: sections A (envelope), F (HTTP), G (stdio) and H (eras) of
//! `../shared/spec/mcp-2026-07-28.md`.

pub mod auth;
mod connection;
pub mod error;
mod exit;
pub mod http;
mod inbound;
mod spec;
pub mod stdio;
pub(crate) mod tls;
pub use tls::{TlsConfigError, ca_file_pem, tls_client_config};

/// A reqwest client builder for requests to `url`. One on this machine is reached
/// directly, never through `HTTP_PROXY`, `HTTPS_PROXY` or `ALL_PROXY` (as Go's client
/// does): plain `http` may carry tokens, keys and prompts to loopback only because they
/// stay on this machine, and a proxy would carry them in clear to its own (and, asked
/// for `localhost`, reach a server there instead).
pub fn client_builder(url: &url::Url) -> reqwest::ClientBuilder {
    let builder = reqwest::Client::builder();
    match auth::is_loopback(url) {
        true => builder.no_proxy(),
        false => builder,
    }
}

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

pub use connection::{
    AskedDuring, ConnectOptions, Connection, Era, EraPreference, RequestOptions, ServerEvent,
    ServerProfile, ServerRequest,
};
pub use error::{ConnectError, RequestError, SpawnFailure, TlsFailure, TransportError};
pub use exit::ExitStatus;
pub use inbound::ProgressHook;
pub use spec::{HttpSpec, StdioSpec, TransportSpec};

use crate::protocol::{Notification, RequestId, RequestRef, RpcError, Stamp};
use http::HttpTransport;
use inbound::{Ids, InboundSink};
use stdio::StdioTransport;

/// The end of a stdio server's process, for whoever must not start another beside it.
#[derive(Clone, Debug)]
pub struct ProcessExit(tokio::sync::watch::Receiver<Option<ExitStatus>>);

impl ProcessExit {
    /// One that ends when `exit` is set (or its sender dropped), for tests.
    #[cfg(test)]
    pub(crate) fn new(exit: tokio::sync::watch::Receiver<Option<ExitStatus>>) -> ProcessExit {
        ProcessExit(exit)
    }

    /// Whether the process is gone: its leader reaped, and what was left of its group
    /// killed.
    pub fn is_gone(&self) -> bool {
        self.0.borrow().is_some() || self.0.has_changed().is_err()
    }

    /// Returns once the process is gone.
    pub async fn gone(mut self) {
        let _ = self.0.wait_for(Option::is_some).await;
    }
}

/// Called with each stdio server process a connection spawns, before its handshake.
#[derive(Clone)]
pub struct SpawnHook(pub Arc<dyn Fn(ProcessExit) + Send + Sync>);

impl std::fmt::Debug for SpawnHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SpawnHook")
    }
}

/// One live transport.
pub(crate) enum Transport {
    Stdio(StdioTransport),
    Http(Arc<HttpTransport>),
}

impl Transport {
    /// Opens the transport `spec` names; what the server sends on its own goes to
    /// `inbound`.
    async fn open(
        server: &str,
        spec: &TransportSpec,
        ids: Ids,
        inbound: InboundSink,
        options: &ConnectOptions,
    ) -> Result<Transport, TransportError> {
        Ok(match spec {
            TransportSpec::Stdio(s) => Transport::Stdio(
                StdioTransport::spawn(
                    server,
                    s,
                    options.max_message_bytes,
                    inbound,
                    options.spawned.clone(),
                )
                .await?,
            ),
            TransportSpec::Http(h) => Transport::Http(
                HttpTransport::new(
                    server,
                    h,
                    options.max_message_bytes,
                    ids,
                    inbound,
                    &options.sign_in,
                    options.request_timeout,
                )
                .await?,
            ),
        })
    }

    /// The id the request in flight as `id` was made with: HTTP sends a request again
    /// under a new id (after a sign-in, a renewed session), which the server then names.
    fn made_as(&self, id: &RequestId) -> RequestId {
        match self {
            Transport::Stdio(_) => id.clone(),
            Transport::Http(t) => t.made_as(id),
        }
    }

    /// The server ended the request in flight as `id` itself: dropping it sends no
    /// cancellation (stdio; over HTTP dropping only closes its stream).
    fn ended_by_server(&self, id: &RequestId) {
        if let Transport::Stdio(t) = self {
            t.ended_by_server(id);
        }
    }

    /// Whether this is an HTTP transport.
    fn is_http(&self) -> bool {
        matches!(self, Transport::Http(_))
    }

    /// Sends `request` (with `stamp`'s envelope in its `_meta`, if any) as `identity`
    /// (HTTP sign-in; stdio has none) and waits up to `timeout` for its answer; `sent`
    /// is set to each new id it goes out under when sent again (HTTP only).
    async fn request(
        &self,
        request: RequestRef<'_>,
        stamp: Option<Stamp<'_>>,
        timeout: Duration,
        identity: Option<&str>,
        sent: &mut RequestId,
    ) -> Result<Result<Value, RpcError>, TransportError> {
        match self {
            Transport::Stdio(t) => t.request(request, stamp, timeout).await,
            // Boxed: the HTTP exchange's future is ten times a pipe's, and every future
            // above this one (the call's, as an embedder spawns it) would carry its size.
            Transport::Http(t) => {
                Box::pin(t.request(request, stamp, timeout, identity, sent)).await
            }
        }
    }

    async fn notify(
        &self,
        notification: Notification,
        timeout: Duration,
    ) -> Result<(), TransportError> {
        match self {
            Transport::Stdio(t) => t.notify(notification),
            Transport::Http(t) => t.notify(notification, timeout).await,
        }
    }

    /// Answers a server's request, as `identity` (whose request's stream carried it).
    async fn respond(
        &self,
        id: RequestId,
        outcome: Result<Value, RpcError>,
        timeout: Duration,
        identity: Option<&str>,
    ) -> Result<(), TransportError> {
        match self {
            Transport::Stdio(t) => t.respond(id, outcome),
            Transport::Http(t) => t.respond(id, outcome, timeout, identity).await,
        }
    }

    /// After a legacy `initialize`: HTTP keeps the session to renew it and opens the
    /// standalone GET stream; stdio has nothing to keep.
    /// After a legacy `initialize` reply, before `initialized`: HTTP sends the version
    /// the server chose on every request from then on.
    fn set_session_version(&self, version: &str) {
        if let Transport::Http(t) = self {
            t.set_session_version(version);
        }
    }

    fn begin_legacy_session(&self, version: &str, init: Value) {
        if let Transport::Http(t) = self {
            t.begin_legacy_session(version, init);
        }
    }

    fn signed_in(&self, identity: Option<&str>) -> bool {
        match self {
            Transport::Http(t) => t.signed_in(identity),
            Transport::Stdio(_) => false,
        }
    }

    async fn sign_in(&self, identity: Option<&str>) -> Result<(), TransportError> {
        match self {
            Transport::Http(t) => t.sign_in(identity).await,
            Transport::Stdio(_) => Err(TransportError::InvalidConfig(
                "a stdio server has no sign-in".into(),
            )),
        }
    }

    fn sign_out(&self) -> Result<usize, TransportError> {
        match self {
            Transport::Http(t) => t.sign_out(),
            Transport::Stdio(_) => Ok(0),
        }
    }

    fn pid(&self) -> Option<u32> {
        match self {
            Transport::Stdio(t) => Some(t.pid()),
            Transport::Http(_) => None,
        }
    }

    fn process_exit(&self) -> Option<ProcessExit> {
        match self {
            Transport::Stdio(t) => Some(ProcessExit(t.exit_watch())),
            Transport::Http(_) => None,
        }
    }

    /// Whether a stdio transport has ended (HTTP has no standing link).
    fn is_closed(&self) -> bool {
        match self {
            Transport::Stdio(t) => t.is_closed(),
            Transport::Http(_) => false,
        }
    }

    fn kill(&self) {
        if let Transport::Stdio(t) = self {
            t.kill();
        }
    }

    /// Lines a stdio server has written (none kept for HTTP).
    fn heard(&self) -> Option<u64> {
        match self {
            Transport::Stdio(t) => Some(t.heard()),
            Transport::Http(_) => None,
        }
    }

    /// Stops the background work that holds the transport (the legacy GET stream), and
    /// marks it closed, so that a session renewal still under way ends the session it
    /// began instead of installing it for nobody.
    fn detach(&self) {
        if let Transport::Http(t) = self {
            t.detach();
        }
    }

    async fn shutdown(&self, grace: Duration) {
        match self {
            Transport::Stdio(t) => t.shutdown(grace).await,
            Transport::Http(t) => t.shutdown(grace).await,
        }
    }
}
