//! Errors of the harness API: what agents see.

use serde_json::Value;

use crate::server::ServerError;

/// A harness call failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum HarnessError {
    /// No server has this id.
    #[error("no server named {0:?}")]
    UnknownServer(String),
    /// A server with this id exists already.
    #[error("a server named {0:?} exists already")]
    DuplicateServer(String),
    /// The configuration cannot work; the message says what to fix.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The caller may not use this tool (or, with no agent id, anything).
    #[error("denied: agent {} may not call {tool:?}{}", agent.as_deref().unwrap_or("(anonymous)"), server.as_ref().map(|s| format!(" on server {s:?}")).unwrap_or_default())]
    Denied {
        /// The caller's agent id.
        agent: Option<String>,
        /// The server, when one was chosen.
        server: Option<String>,
        /// The tool (prompt, uri).
        tool: String,
    },
    /// No routable server offers this tool.
    #[error("no server offers {tool:?}")]
    NoRoute {
        /// The name asked for.
        tool: String,
    },
    /// The server kept asking for input past the round cap.
    #[error("server {server} asked for input more than {cap} times; call stopped")]
    RoundCap {
        /// The cap.
        cap: usize,
        /// The last server.
        server: String,
    },
    /// The server needs client capabilities the harness does not declare (-32021):
    /// register an input handler for them.
    #[error(
        "server {server} needs client capabilities {required}; register input handlers for them"
    )]
    MissingCapability {
        /// Server id.
        server: String,
        /// `data.requiredCapabilities`.
        required: Value,
    },
    /// The user declined or cancelled an elicitation.
    #[error("{method} from server {server} was answered {action:?}; call stopped")]
    InputDeclined {
        /// Server id.
        server: String,
        /// The input method.
        method: String,
        /// `decline` or `cancel`.
        action: String,
    },
    /// An input handler failed or did not answer in time.
    #[error("the handler of {method} (for server {server}) failed: {reason}")]
    InputFailed {
        /// Server id.
        server: String,
        /// The input method.
        method: String,
        /// Why.
        reason: String,
    },
    /// The server asked for input no handler is registered for.
    #[error("server {server} asked for {method}, which no registered handler answers")]
    NoInputHandler {
        /// Server id.
        server: String,
        /// The input method.
        method: String,
    },
    /// The request failed at the server.
    #[error(transparent)]
    Server(#[from] ServerError),
    /// The harness's actors could not be started.
    #[error("could not start the harness: {0}")]
    Spawn(String),
    /// The harness has been shut down.
    #[error("the harness is shut down")]
    ShutDown,
}

impl HarnessError {
    /// A short stable name for audit records and metrics.
    pub fn code(&self) -> &'static str {
        match self {
            HarnessError::UnknownServer(_) => "unknown_server",
            HarnessError::DuplicateServer(_) => "duplicate_server",
            HarnessError::Config(_) => "config",
            HarnessError::Denied { .. } => "denied",
            HarnessError::NoRoute { .. } => "no_route",
            HarnessError::RoundCap { .. } => "round_cap",
            HarnessError::MissingCapability { .. } => "missing_capability",
            HarnessError::InputDeclined { .. } => "input_declined",
            HarnessError::InputFailed { .. } => "input_failed",
            HarnessError::NoInputHandler { .. } => "no_input_handler",
            HarnessError::Spawn(_) => "spawn",
            HarnessError::ShutDown => "shut_down",
            HarnessError::Server(e) => match e {
                ServerError::TransportClosed { .. } => "transport_closed",
                ServerError::Transport { .. } => "transport",
                ServerError::Restarting { .. } => "restarting",
                ServerError::Failed { .. } => "server_failed",
                ServerError::Stopped { .. } => "server_stopped",
                ServerError::Overloaded { .. } => "overloaded",
                ServerError::Unavailable { .. } => "unavailable",
                ServerError::MissingCapability { .. } => "missing_capability",
                ServerError::Rpc { .. } => "rpc_error",
                ServerError::Protocol { .. } => "protocol",
            },
        }
    }
}
