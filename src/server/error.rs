//! Errors of one supervised server, as callers see them: the transport's errors with
//! the server's id added, and the states of the supervisor (restarting, failed,
//! stopped, overloaded).

use serde_json::Value;

use crate::protocol::{ProtocolError, RpcError, RpcErrorKind};
use crate::transport::{RequestError, TransportError};

/// A request to one supervised server failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The connection ended while the request was in flight (process exit, broken
    /// link); the server is being restarted per its policy.
    #[error("server {server}: connection closed: {source}")]
    TransportClosed {
        /// Server id.
        server: String,
        /// What the transport saw.
        source: TransportError,
    },
    /// Any other transport failure (timeout, HTTP status, refused, too large).
    #[error("server {server}: {source}")]
    Transport {
        /// Server id.
        server: String,
        /// What the transport saw.
        source: TransportError,
    },
    /// The server is restarting and did not become ready before the request's deadline.
    #[error("server {server} is restarting ({reason}); not ready before the deadline")]
    Restarting {
        /// Server id.
        server: String,
        /// Why it is restarting.
        reason: String,
    },
    /// The server is past its restart limit (or cannot work with this client) and is
    /// not being restarted; `restart_server` or `add_server` brings it back.
    #[error("server {server} has failed: {reason}")]
    Failed {
        /// Server id.
        server: String,
        /// Why.
        reason: String,
    },
    /// The server was stopped (temporary or transient policy, removal, shutdown).
    #[error("server {server} is stopped")]
    Stopped {
        /// Server id.
        server: String,
    },
    /// Too many requests are in flight to the server, or wait for it to come back.
    #[error("server {server} is overloaded: {capacity} requests are already in flight or waiting")]
    Overloaded {
        /// Server id.
        server: String,
        /// The queue's capacity.
        capacity: usize,
    },
    /// The server's actor went away before it sent the request (it is being rebuilt):
    /// the request never left the harness. A request it had sent and then lost is
    /// [`ServerError::TransportClosed`] instead.
    #[error("server {server} is unavailable: its actor stopped")]
    Unavailable {
        /// Server id.
        server: String,
    },
    /// A request that waited for its server was withdrawn before it went out: its
    /// caller no longer wanted it sent (a grant revoked meanwhile).
    #[error("server {server}: the request was withdrawn before it was sent")]
    Withdrawn {
        /// Server id.
        server: String,
    },
    /// The server needs client capabilities this client did not declare (-32021): a
    /// configuration problem, not worth retrying.
    #[error("server {server} requires client capabilities {required}")]
    MissingCapability {
        /// Server id.
        server: String,
        /// `data.requiredCapabilities`.
        required: Value,
    },
    /// The server answered with a JSON-RPC error.
    #[error("server {server} answered {error}")]
    Rpc {
        /// Server id.
        server: String,
        /// The error as sent.
        error: RpcError,
    },
    /// The server's answer broke the protocol.
    #[error("server {server}: {source}")]
    Protocol {
        /// Server id.
        server: String,
        /// What was wrong.
        source: ProtocolError,
    },
}

impl ServerError {
    /// Adds the server's id to a connection-level error.
    pub fn from_request(server: &str, error: RequestError) -> ServerError {
        let server = server.to_string();
        match error {
            RequestError::Transport(source @ TransportError::Closed { .. }) => {
                ServerError::TransportClosed { server, source }
            }
            RequestError::Transport(source) => ServerError::Transport { server, source },
            RequestError::Rpc(error) => match error.kind() {
                RpcErrorKind::MissingClientCapability { required } => {
                    ServerError::MissingCapability { server, required }
                }
                _ => ServerError::Rpc { server, error },
            },
            RequestError::Protocol(source) => ServerError::Protocol { server, source },
        }
    }

    /// True when the request provably never reached the server: safe to send elsewhere.
    pub fn never_sent(&self) -> bool {
        match self {
            ServerError::Transport { source, .. } => source.never_sent(),
            ServerError::Restarting { .. }
            | ServerError::Failed { .. }
            | ServerError::Stopped { .. }
            | ServerError::Overloaded { .. }
            | ServerError::Unavailable { .. }
            | ServerError::Withdrawn { .. } => true,
            _ => false,
        }
    }

    /// A short stable name for audit records and metrics.
    pub fn code(&self) -> &'static str {
        match self {
            ServerError::TransportClosed { .. } => "transport_closed",
            ServerError::Transport { .. } => "transport",
            ServerError::Restarting { .. } => "restarting",
            ServerError::Failed { .. } => "server_failed",
            ServerError::Stopped { .. } => "server_stopped",
            ServerError::Overloaded { .. } => "overloaded",
            ServerError::Unavailable { .. } => "unavailable",
            ServerError::Withdrawn { .. } => "withdrawn",
            ServerError::MissingCapability { .. } => "missing_capability",
            ServerError::Rpc { .. } => "rpc_error",
            ServerError::Protocol { .. } => "protocol",
        }
    }

    /// The id of the server the error is about.
    pub fn server(&self) -> &str {
        match self {
            ServerError::TransportClosed { server, .. }
            | ServerError::Transport { server, .. }
            | ServerError::Restarting { server, .. }
            | ServerError::Failed { server, .. }
            | ServerError::Stopped { server }
            | ServerError::Overloaded { server, .. }
            | ServerError::Unavailable { server }
            | ServerError::Withdrawn { server }
            | ServerError::MissingCapability { server, .. }
            | ServerError::Rpc { server, .. }
            | ServerError::Protocol { server, .. } => server,
        }
    }
}
