//! Errors of the harness API.

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
