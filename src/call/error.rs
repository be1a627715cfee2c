//! Errors of the call path: what agents see. One place ([`CallError::code`]) names each
//! for audit records and metrics.

use std::time::Duration;

use serde_json::Value;

use crate::audit::AuditUnavailable;
use crate::server::{ServerError, ServerState};

/// A server a call could not use, and why (so that an error never says "no server
/// offers X" when the server that would is down).
#[derive(Clone, Debug, PartialEq)]
pub struct Unreachable {
    /// Server id.
    pub server: String,
    /// Its state.
    pub state: ServerState,
    /// Why it could not be asked (its last error, or why listing it failed).
    pub reason: String,
}

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}: {})",
            self.server,
            self.state.as_str(),
            self.reason
        )
    }
}

/// "no server offers X", unless a server that might is down: then that is what it says.
fn no_route(tool: &str, list: &[Unreachable]) -> String {
    if list.is_empty() {
        return format!("no server offers {tool:?}");
    }
    let names: Vec<String> = list.iter().map(ToString::to_string).collect();
    format!(
        "{tool:?} cannot be served now; servers that could not be asked: {}",
        names.join(", ")
    )
}

/// A call failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The caller may not use this tool (or, with no agent id, anything).
    #[error("denied: agent {} may not call {tool:?}{}", agent.as_deref().unwrap_or("(anonymous)"), server.as_ref().map(|s| format!(" on server {s:?}")).unwrap_or_default())]
    Denied {
        /// The caller's agent id.
        agent: Option<String>,
        /// The server, when the caller named it.
        server: Option<String>,
        /// The tool (prompt, uri).
        tool: String,
    },
    /// No routable server the caller may use offers this tool.
    #[error("{}", no_route(tool, unreachable))]
    NoRoute {
        /// The name asked for.
        tool: String,
        /// Servers that might offer it but could not be asked.
        unreachable: Vec<Unreachable>,
    },
    /// A server's list is past a configured bound; nothing of it was cached.
    #[error("server {server}'s list is larger than {limit} {what}; listing stopped")]
    ListTooLarge {
        /// Server id.
        server: String,
        /// `bytes` or `items`.
        what: &'static str,
        /// The bound.
        limit: usize,
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
    /// The server's input requests break the rules (too many, or a method or mode the
    /// harness did not declare); no handler saw them.
    #[error("server {server} sent input requests that were refused: {reason}")]
    InputRejected {
        /// Server id.
        server: String,
        /// What was wrong.
        reason: String,
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
    /// An input handler refused the server's request: the agent may not, a person did
    /// not approve, or the call's budget ran out.
    #[error("{method} from server {server} was refused: {reason}")]
    InputDenied {
        /// Server id.
        server: String,
        /// The input method.
        method: String,
        /// Why.
        reason: super::input::Denial,
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
    /// The call's own deadline passed (rounds and failover included).
    #[error("the call did not finish within {0:?}")]
    DeadlineExceeded(Duration),
    /// The call was cancelled by its caller.
    #[error("the call was cancelled")]
    Cancelled,
    /// The audit trail cannot be written, and the config says to fail closed.
    #[error(transparent)]
    AuditUnavailable(#[from] AuditUnavailable),
    /// The request failed at the server.
    #[error(transparent)]
    Server(#[from] ServerError),
    /// The call worker that owned the call died (it was killed, or panicked); the
    /// call was cancelled with it. The worker is rebuilt: a new call may succeed.
    #[error("the call's worker died and the call was cancelled with it")]
    WorkerDied,
    /// The harness has been shut down.
    #[error("the harness is shut down")]
    ShutDown,
    /// A delegated call carries a round's answers or `requestState` but names no
    /// server: they belong to the server that asked, and routing could take them to
    /// another.
    #[error(
        "a continued round names no server; its answers and requestState belong to the server that asked"
    )]
    RoundWithoutServer,
}

impl CallError {
    /// A short stable name for audit records and metrics.
    pub fn code(&self) -> &'static str {
        match self {
            CallError::Denied { .. } => "denied",
            CallError::NoRoute { .. } => "no_route",
            CallError::ListTooLarge { .. } => "list_too_large",
            CallError::RoundCap { .. } => "round_cap",
            CallError::MissingCapability { .. } => "missing_capability",
            CallError::InputRejected { .. } => "input_rejected",
            CallError::InputDeclined { .. } => "input_declined",
            CallError::InputFailed { .. } => "input_failed",
            CallError::InputDenied { .. } => "input_denied",
            CallError::DeadlineExceeded(_) => "deadline",
            CallError::Cancelled => "cancelled",
            CallError::AuditUnavailable(_) => "audit_unavailable",
            CallError::WorkerDied => "worker_died",
            CallError::ShutDown => "shut_down",
            CallError::RoundWithoutServer => "round_without_server",
            CallError::Server(e) => e.code(),
        }
    }
}
