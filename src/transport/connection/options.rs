//! What a connection is opened with, and what it learns and hands up: the options, the
//! era, the server's profile, and the server's own traffic as [`ServerEvent`]s.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::protocol::meta::MODERN;
use crate::protocol::views::InitializeResult;
use crate::protocol::{DiscoverResult, Implementation, Notification, RpcError};
use crate::transport::error::TransportError;

/// Which era to speak with a server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EraPreference {
    /// Probe with `server/discover`, fall back to `initialize` (the default).
    #[default]
    Auto,
    /// Modern only: a server that does not answer discover is an error.
    Modern,
    /// Skip the probe and run the legacy handshake.
    Legacy,
}

/// The era a connected server speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Era {
    /// 2026-07-28 or later: stateless, `_meta` on every request, MRTR.
    Modern,
    /// 2025-06-18 or 2025-11-25: `initialize` handshake, server-to-client requests.
    Legacy,
}

impl Era {
    /// `modern` or `legacy`.
    pub fn as_str(self) -> &'static str {
        match self {
            Era::Modern => "modern",
            Era::Legacy => "legacy",
        }
    }
}

/// What the server said about itself when it connected.
#[derive(Clone, Debug, PartialEq)]
pub enum ServerProfile {
    /// The `server/discover` result, and the version chosen from it.
    Modern {
        /// The version every request now names.
        version: String,
        /// The discover result.
        discover: DiscoverResult,
    },
    /// The `initialize` result.
    Legacy(InitializeResult),
}

impl ServerProfile {
    /// The protocol version in use.
    pub fn protocol_version(&self) -> &str {
        match self {
            ServerProfile::Modern { version, .. } => version,
            ServerProfile::Legacy(init) => &init.protocol_version,
        }
    }

    /// The server's capabilities object.
    pub fn capabilities(&self) -> &Value {
        match self {
            ServerProfile::Modern { discover, .. } => &discover.capabilities,
            ServerProfile::Legacy(init) => &init.capabilities,
        }
    }

    /// The server's instructions for the model, if any.
    pub fn instructions(&self) -> Option<&str> {
        match self {
            ServerProfile::Modern { discover, .. } => discover.instructions.as_deref(),
            ServerProfile::Legacy(init) => init.instructions.as_deref(),
        }
    }

    /// The server's self-reported identity.
    pub fn server_info(&self) -> Option<&Value> {
        match self {
            ServerProfile::Modern { discover, .. } => discover.server_info.as_ref(),
            ServerProfile::Legacy(init) => init.server_info.as_ref(),
        }
    }

    /// The era.
    pub fn era(&self) -> Era {
        match self {
            ServerProfile::Modern { .. } => Era::Modern,
            ServerProfile::Legacy(_) => Era::Legacy,
        }
    }
}

/// How to connect, and what to tell the server about ourselves.
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    /// Sent as `clientInfo`.
    pub client_info: Implementation,
    /// The client capabilities to declare (`{}` for none); built by the layer above
    /// from the input handlers it has.
    pub capabilities: Value,
    /// Modern versions to offer, most preferred first.
    pub preferred_versions: Vec<String>,
    /// Which era to speak.
    pub era: EraPreference,
    /// How long to wait for the discover probe before assuming legacy.
    pub probe_timeout: Duration,
    /// Default deadline of one request.
    pub request_timeout: Duration,
    /// Largest stdio line or HTTP reply accepted.
    pub max_message_bytes: usize,
    /// How long a stdio server gets after stdin EOF, and again after SIGTERM.
    pub shutdown_grace: Duration,
    /// Capacity of the [`ServerEvent`] channel (0 counts as 1).
    pub event_capacity: usize,
    /// Sign-in for HTTP servers that ask for it: who signs in, where tokens live.
    pub sign_in: crate::transport::auth::SignInContext,
    /// Where `notifications/progress` go, in order with the replies (without it they
    /// are [`ServerEvent::Notification`]s like the rest).
    pub progress: Option<crate::transport::inbound::ProgressHook>,
    /// Told of each stdio server process spawned, before its handshake (whoever must
    /// not start another beside it waits for its end).
    pub spawned: Option<crate::transport::SpawnHook>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            client_info: Implementation::harness(),
            capabilities: json!({}),
            preferred_versions: vec![MODERN.to_string()],
            era: EraPreference::Auto,
            probe_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
            max_message_bytes: 16 * 1024 * 1024,
            shutdown_grace: Duration::from_secs(3),
            event_capacity: 256,
            sign_in: crate::transport::auth::SignInContext::default(),
            progress: None,
            spawned: None,
        }
    }
}

/// Traffic from the server that is not a reply to our requests.
#[derive(Debug)]
pub enum ServerEvent {
    /// A legacy server asks the client something; answer with [`ServerRequest::respond`].
    Request(ServerRequest),
    /// A notification (`notifications/tools/list_changed`, progress, log messages).
    Notification(Notification),
    /// The transport ended; the connection is dead.
    Closed(TransportError),
}

/// A request from a legacy server, waiting for the client's answer.
#[derive(Debug)]
pub struct ServerRequest {
    /// For example `elicitation/create`.
    pub method: String,
    /// The request's params, as sent.
    pub params: Value,
    /// Whether the server may ask for input outside calls (`allow_unsolicited_input`):
    /// else an `elicitation/create` or `sampling/createMessage` that no call on the
    /// server is running for by the time it is handled is refused.
    pub outside_calls_allowed: bool,
    /// Which of our requests it came during, as far as the transport shows.
    pub during: AskedDuring,
    /// When the connection stops waiting for the answer (the server's `timeout` after
    /// the request came) and tells the server the client did not answer.
    pub answer_by: std::time::Instant,
    pub(super) reply: oneshot::Sender<Result<Value, RpcError>>,
}

/// Which of our requests a legacy server's request came during. Over legacy HTTP it
/// comes on the event stream of the request it is asked for; stdio, and a session's
/// own stream, name none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AskedDuring {
    /// It names none: it may be any request's in flight.
    Unknown,
    /// One in flight, made for `owner` (what the request was sent with; `None`: no one).
    Request {
        /// See [`RequestOptions::owner`].
        owner: Option<u64>,
    },
    /// One that has ended since: no one waits for the answer.
    Ended,
}

/// How one request goes, beside its method, params and deadline.
#[derive(Clone, Copy, Debug, Default)]
pub struct RequestOptions<'a> {
    /// The client capabilities it declares (modern servers), when not the
    /// connection's own.
    pub capabilities: Option<&'a Value>,
    /// Whose credentials it goes with (an auth context; `None`: the connection's own).
    pub identity: Option<&'a str>,
    /// Whom it is made for, a number of the caller's choosing: a legacy server's
    /// request that comes during it says so ([`AskedDuring::Request`]).
    pub owner: Option<u64>,
}

impl ServerRequest {
    /// Sends the answer back to the server. Dropping the request unanswered sends an
    /// internal error instead.
    pub fn respond(self, outcome: Result<Value, RpcError>) {
        let _ = self.reply.send(outcome);
    }

    /// Resolves when the answer is no longer awaited (the server was told the client
    /// did not answer in time, or the connection ended): the work on it can stop.
    pub async fn abandoned(&mut self) {
        self.reply.closed().await;
    }
}
