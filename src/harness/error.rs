//! Errors of running a harness (starting it, changing its servers and grants). What a
//! call fails with is a [`CallError`], which converts into this with `?`.

use crate::call::CallError;
use crate::config::ConfigError;
use crate::server::{ServerError, ServersError};

/// Starting or managing the harness failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    /// The configuration cannot work; the error says where and what to fix.
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    /// No server has this id.
    #[error("no server named {0:?}")]
    UnknownServer(String),
    /// A server with this id exists already.
    #[error("a server named {0:?} exists already")]
    DuplicateServer(String),
    /// The harness's actors could not be started.
    #[error("could not start the harness: {0}")]
    Spawn(String),
    /// The harness has been shut down.
    #[error("the harness is shut down")]
    ShutDown,
    /// A part of the running harness did not answer in time (busy, or being rebuilt
    /// after it died): what was asked may still take effect. Worth asking again.
    #[error(
        "the harness did not answer {0} in time (busy, or a part of it being rebuilt); it may still take effect: try again"
    )]
    Busy(String),
    /// A raw request of a method the connection itself sends (its handshake): the
    /// harness does it for every connection, and `status()` holds what it answered.
    #[error("{0} is sent by the connection itself; its answer is in the server's status")]
    ConnectionsOwn(String),
    /// A call failed.
    #[error(transparent)]
    Call(#[from] CallError),
}

impl From<ServersError> for HarnessError {
    fn from(e: ServersError) -> HarnessError {
        match e {
            ServersError::Duplicate(id) => HarnessError::DuplicateServer(id),
            ServersError::Unknown(id) => HarnessError::UnknownServer(id),
            ServersError::Spawn { server, reason } => {
                HarnessError::Spawn(format!("server {server:?}: {reason}"))
            }
            ServersError::Gone => HarnessError::ShutDown,
            ServersError::Server(e) => HarnessError::Call(CallError::Server(e)),
        }
    }
}

impl From<ServerError> for HarnessError {
    fn from(e: ServerError) -> HarnessError {
        HarnessError::Call(CallError::Server(e))
    }
}
