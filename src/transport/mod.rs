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

mod connection;
pub mod error;
pub mod http;
pub mod stdio;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use serde_json::Value;

pub use connection::{
    ConnectOptions, Connection, Era, EraPreference, ServerEvent, ServerProfile, ServerRequest,
};
pub use error::{ConnectError, RequestError, TransportError};
pub use http::{HttpSpec, HttpTransport};
pub use stdio::{StdioSpec, StdioTransport};

use crate::protocol::{Notification, Request, RequestId, RpcError};

/// How to reach one server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TransportSpec {
    /// A child process speaking newline-delimited JSON-RPC on stdin/stdout.
    Stdio(StdioSpec),
    /// A Streamable HTTP endpoint.
    Http(HttpSpec),
}

impl TransportSpec {
    /// A stdio server with no extra environment, in the harness's directory.
    pub fn stdio<I, S>(command: impl Into<String>, args: I) -> TransportSpec
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        TransportSpec::Stdio(StdioSpec {
            command: command.into(),
            args: args.into_iter().map(Into::into).collect(),
            env: BTreeMap::new(),
            cwd: None,
        })
    }

    /// An HTTP server with no extra headers.
    pub fn http(url: impl Into<String>) -> TransportSpec {
        TransportSpec::Http(HttpSpec {
            url: url.into(),
            headers: BTreeMap::new(),
        })
    }
}

/// What a transport receives that is not a reply to one of our requests.
#[derive(Debug)]
pub(crate) enum Inbound {
    Request(Request),
    Notification(Notification),
    Closed(TransportError),
}

/// One live transport.
pub(crate) enum Transport {
    Stdio(StdioTransport),
    Http(Arc<HttpTransport>),
}

impl Transport {
    async fn request(
        &self,
        request: &Request,
        extra: &[(HeaderName, HeaderValue)],
        timeout: Duration,
    ) -> Result<Result<Value, RpcError>, TransportError> {
        match self {
            Transport::Stdio(t) => t.request(request, timeout).await,
            Transport::Http(t) => t.request(request, extra, timeout).await,
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

    async fn respond(
        &self,
        id: RequestId,
        outcome: Result<Value, RpcError>,
        timeout: Duration,
    ) -> Result<(), TransportError> {
        match self {
            Transport::Stdio(t) => t.respond(id, outcome),
            Transport::Http(t) => t.respond(id, outcome, timeout).await,
        }
    }

    async fn shutdown(&self, grace: Duration) {
        match self {
            Transport::Stdio(t) => t.shutdown(grace).await,
            Transport::Http(t) => t.shutdown(grace).await,
        }
    }
}
