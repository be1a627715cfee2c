//! The MCP wire protocol as the harness reads and writes it.
//!
//! JSON-RPC 2.0 framing ([`jsonrpc`]), the per-request `_meta` envelope and protocol
//! versions ([`meta`]), the error codes of revision 2026-07-28 ([`error`]), and typed
//! views of the few result fields the harness itself acts on ([`views`]): `resultType`,
//! `server/discover`, cache hints and `input_required` results; and whether a URI is
//! of a resource template (`uri_template`).
//!
//! Payloads the harness only passes along (tool arguments, results, schemas) stay
//! [`serde_json::Value`]: a gateway must not drop fields it does not know.
//!
//! Spec: `../shared/spec/mcp-2026-07-28.md`, sections A to E.

pub mod error;
pub mod jsonrpc;
pub mod meta;
pub mod pagination;
pub(crate) mod uri_template;
pub mod views;

pub use error::{ProtocolError, RpcError, RpcErrorKind};
pub use jsonrpc::{Message, Notification, Peeked, Request, RequestId, RequestRef, Response};
pub use meta::{Implementation, MetaEnvelope, Stamp};
pub use pagination::{Cutoff, Pager};
pub use views::{CacheHints, CacheScope, DiscoverResult, InputRequest, InputRequired, ResultType};
