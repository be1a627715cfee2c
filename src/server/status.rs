//! What a server looks like from outside: its state, era, restarts, last error, pid.
//! The server actor writes it; readers take a snapshot without touching the actor's
//! mailbox.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::transport::{Era, ServerProfile};

/// The lifecycle state of a supervised server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ServerState {
    /// Connecting for the first time (spawn, probe, handshake).
    Starting,
    /// Connected; requests go straight through.
    Ready,
    /// The connection ended; waiting out the backoff or reconnecting.
    Restarting,
    /// Past its restart limit, or unable to work with this client; not restarted.
    Failed,
    /// Stopped by policy, removal or shutdown.
    Stopped,
}

impl ServerState {
    /// The state's name, as status output and records show it.
    pub fn as_str(self) -> &'static str {
        match self {
            ServerState::Starting => "starting",
            ServerState::Ready => "ready",
            ServerState::Restarting => "restarting",
            ServerState::Failed => "failed",
            ServerState::Stopped => "stopped",
        }
    }

    /// Whether calls may be routed to it at all (not `failed`, not `stopped`).
    pub fn routable(self) -> bool {
        !matches!(self, ServerState::Failed | ServerState::Stopped)
    }
}

/// A snapshot of one server's status.
#[derive(Clone, Debug)]
pub struct ServerStatus {
    /// Server id.
    pub id: String,
    /// Lifecycle state.
    pub state: ServerState,
    /// The era of the current (or last) connection.
    pub era: Option<Era>,
    /// The protocol version in use.
    pub protocol_version: Option<String>,
    /// Restarts after a failure so far: of its connection, or of the server when its
    /// actor died while it ran (the connection died with it). A restart asked for
    /// (`restart_server`, a reload that changed its settings) is not one.
    pub restarts: u32,
    /// Times the server's actor itself was rebuilt by the supervisor (after its own
    /// death, or the supervisor's).
    pub actor_rebuilds: u32,
    /// The last error that ended a connection or failed the server.
    pub last_error: Option<String>,
    /// The stdio server's pid (and process group), while connected.
    pub pid: Option<u32>,
    /// Requests waiting for the server to be ready (at most `queue_capacity`).
    pub queued: usize,
    /// When the current connection became ready.
    pub ready_at: Option<Instant>,
    /// What the server said about itself (discover result or `initialize` result),
    /// shared: a snapshot does not copy what may be megabytes of a server's words.
    pub profile: Option<std::sync::Arc<ServerProfile>>,
}

impl ServerStatus {
    /// A server that has not connected yet.
    pub fn starting(id: &str) -> ServerStatus {
        ServerStatus {
            id: id.to_string(),
            state: ServerState::Starting,
            era: None,
            protocol_version: None,
            restarts: 0,
            actor_rebuilds: 0,
            last_error: None,
            pid: None,
            queued: 0,
            ready_at: None,
            profile: None,
        }
    }

    /// How long the current connection has been ready.
    pub fn uptime(&self) -> Option<Duration> {
        match self.state {
            ServerState::Ready => self.ready_at.map(|t| t.elapsed()),
            _ => None,
        }
    }
}
