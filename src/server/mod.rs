//! One supervised actor per MCP server.
//!
//! [`ServerActor`] has a stable address for the server's whole life and supervises a
//! [`connection_actor::ConnectionActor`] per connection attempt. The restart policy
//! ([`restart`]) is plain data that takes `now`, tested without actors. Callers see
//! [`ServerError`] and [`ServerStatus`].

pub mod actor;
pub mod connection_actor;
pub mod error;
pub mod hooks;
pub mod restart;
pub mod status;

pub use actor::{LiveConnection, LiveSlot, ServerActor, ServerArgs, ServerMsg, ServerSpec};
pub use error::ServerError;
pub use hooks::ServerHooks;
pub use restart::{RestartConfig, RestartPolicy};
pub use status::{ServerState, ServerStatus};
