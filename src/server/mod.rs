//! One supervised actor per MCP server, and the one way into it.
//!
//! [`ServersSupervisor`] owns a [`actor::ServerActor`] per server; each has a stable
//! address for the server's whole life and supervises a
//! [`connection_actor::ConnectionActor`] per connection attempt. Callers reach a server
//! through its [`ServerRef`] (found in the [`Directory`]), whose `request()` hides
//! whether the request runs on the live connection or waits for a restart. The restart
//! policy ([`restart`]) and the request queue ([`queue`]) are plain data that take
//! `now`, tested without actors. What a server needs from the layers above (input
//! handlers, list changes) comes through the [`ClientSide`] trait.

pub(crate) mod actor;
mod client;
mod config;
pub(crate) mod connection_actor;
mod directory;
pub mod error;
mod listen;
mod liveness;
mod msg;
mod queue;
pub mod restart;
mod server_ref;
mod status;
mod supervisor;

pub use actor::{ServerActor, ServerArgs};
pub use client::{ClientSide, ListsChanged};
pub use config::{SEPARATOR, ServerConfig, check_id, id_from_name};
pub use directory::Directory;
pub use error::ServerError;
pub use msg::ServerMsg;
pub(crate) use queue::StillWanted;
pub use restart::{RestartConfig, RestartPolicy};
pub(crate) use server_ref::OutgoingRef;
pub use server_ref::{Offers, ServerRef};
pub use status::{ServerState, ServerStatus};
pub use supervisor::ServersError;
#[cfg(test)]
pub(crate) use supervisor::ServersMsg;
pub(crate) use supervisor::{ServersArgs, ServersRef, ServersSupervisor};
