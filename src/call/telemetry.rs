//! The call's spans as the OpenTelemetry semantic conventions for MCP and GenAI name
//! them: one span per call (`{mcp.method.name} {target}`), a child for routing, one per
//! attempt on a server (a client span with the server's protocol version and transport),
//! one per `input_required` round and one per input handler. Failovers and restarts are
//! `tracing` events inside them, which become span events. The spans are ordinary
//! `tracing` spans: exported only when an OpenTelemetry layer is installed.

use super::caller::CallKind;
use crate::server::ServerRef;
use crate::transport::TransportSpec;

/// `gen_ai.operation.name`: `execute_tool` for tool calls (the GenAI conventions name
/// no operation for prompts and resources; the MCP method says what they are).
pub(super) fn operation(kind: CallKind) -> Option<&'static str> {
    (kind == CallKind::Tool).then_some("execute_tool")
}

/// `gen_ai.tool.name`, for tool calls.
pub(super) fn tool_name(kind: CallKind, name: &str) -> Option<&str> {
    (kind == CallKind::Tool).then_some(name)
}

/// `network.transport`: `pipe` for stdio servers, `tcp` for HTTP ones.
fn transport(server: &ServerRef) -> &'static str {
    match server.config().transport {
        TransportSpec::Stdio(_) => "pipe",
        TransportSpec::Http(_) => "tcp",
    }
}

/// The span of one attempt of a call on one server.
pub(super) fn attempt_span(kind: CallKind, item: &str, server: &ServerRef) -> tracing::Span {
    let method = kind.method();
    tracing::info_span!(
        "attempt",
        otel.name = %format!("{method} {item}"),
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        mcp.method.name = method,
        mcp.protocol.version = server.protocol_version(),
        gen_ai.operation.name = operation(kind),
        gen_ai.tool.name = tool_name(kind, item),
        network.transport = transport(server),
        mcp_harness.server.id = server.id(),
        error.type = tracing::field::Empty,
    )
}

/// Marks `span` as failed with `error.type`.
pub(super) fn failed(span: &tracing::Span, code: &'static str) {
    span.record("error.type", code);
    span.record("otel.status_code", "ERROR");
}
