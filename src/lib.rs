//! mcp-harness: a runtime for using many Model Context Protocol servers at once, as a
//! supervised tree of actors.
//!
//! Spawn a harness on a config, grant agents what they may use, list and call tools,
//! shut down. Every server runs under its own supervised actor (restarted with backoff,
//! its process never left behind); calls are authorized, routed by priority with
//! failover, driven through `input_required` rounds, and audited.
//!
//! ```no_run
//! # async fn run() -> Result<(), mcp_harness::HarnessError> {
//! use mcp_harness::{Caller, Harness, HarnessConfig, ServerConfig};
//! use serde_json::json;
//!
//! let mut config = HarnessConfig::default();
//! config.servers.push(ServerConfig::stdio("files", "mcp-server-files", ["/srv"]));
//! let harness = Harness::spawn(config).await?;
//! harness.grant("planner", "files", &["read_file"]).await?;
//!
//! let planner = Caller::agent("planner");
//! for tool in harness.list_tools(&planner).await? {
//!     println!("{}: {}", tool.qualified, tool.definition["description"]);
//! }
//! let result = harness
//!     .call_tool(&planner, "files__read_file", json!({"path": "/srv/a.txt"}))
//!     .await?;
//! harness.shutdown().await; // every server stopped, every audit record written
//! # Ok(()) }
//! ```
//!
//! Layers, top down (each uses only the ones below it): [`gateway`] (the harness served
//! as one MCP server), [`harness`] (the tree and the handle), [`config`] (every layer's settings together, and config files), [`call`]
//! (one call, step by step; input handlers), [`registry`] (the list cache, names),
//! [`permission`], [`audit`], [`server`] (a supervised actor per server), [`transport`]
//! (stdio and Streamable HTTP, era detection), [`protocol`] (the wire types). [`util`]
//! holds leaves anyone may use.
//!
//! Unix only: servers run in process groups, stopped with signals.

#[cfg(not(unix))]
compile_error!("mcp-harness runs stdio servers in Unix process groups and supports Unix only");

pub mod audit;
pub mod call;
pub mod config;
pub mod gateway;
pub mod harness;
pub mod permission;
pub mod protocol;
pub mod registry;
pub mod server;
pub mod transport;
pub mod util;

pub use call::input::{ApprovalQueue, FixedAnswers, InputHandler, InputRequestContext};
pub use call::{
    Answer, CallError, CallKind, Caller, CancelToken, Delegation, ListKind, ServerQuestion,
    ToolInfo, ToolMatch,
};
pub use config::{ConfigError, HarnessConfig};
pub use harness::{
    CallOptions, Harness, HarnessBuilder, HarnessError, HarnessHandle, Metrics, ServerMetrics,
    Service,
};
pub use server::{
    RestartConfig, RestartPolicy, ServerConfig, ServerError, ServerState, ServerStatus,
};
pub use transport::TransportSpec;
