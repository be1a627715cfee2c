//! mcp-harness: a runtime for using many Model Context Protocol servers at once.
//!
//! This layer speaks MCP to one server at a time: [`protocol`] holds the wire types,
//! [`transport`] the stdio and Streamable HTTP transports, and
//! [`transport::Connection`] ties them together with era detection (a `server/discover`
//! probe, falling back to the legacy `initialize` handshake) and the per-request `_meta`
//! envelope.
//!
//! ```no_run
//! # async fn run() -> Result<(), mcp_harness::transport::ConnectError> {
//! use mcp_harness::transport::{Connection, ConnectOptions, TransportSpec};
//! let spec = TransportSpec::stdio("my-mcp-server", ["--flag"]);
//! let (conn, _inbound) = Connection::connect("files", spec, ConnectOptions::default()).await?;
//! let tools = conn.request("tools/list", None).await;
//! conn.shutdown().await;
//! # Ok(()) }
//! ```

pub mod audit;
pub mod call;
pub mod config;
pub mod harness;
pub mod permission;
pub mod protocol;
pub mod registry;
pub mod server;
pub mod transport;

pub use call::handler::{ApprovalQueue, FixedAnswers, InputHandler, InputRequestContext};
pub use call::{Caller, ToolInfo};
pub use config::{HarnessConfig, ServerConfig, TransportConfig};
pub use harness::{Harness, HarnessError, HarnessHandle};
pub use server::{RestartConfig, RestartPolicy, ServerError, ServerState, ServerStatus};
