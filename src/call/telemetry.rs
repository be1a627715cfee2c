//! The call's spans as the OpenTelemetry semantic conventions for MCP and GenAI name
//! them: one span per call (`{mcp.method.name} {target}`, internal), a child for
//! routing, one client span per attempt on a server (the MCP client span: protocol
//! version, transport, the GenAI tool or prompt name), one per `input_required` round
//! and one per input handler. Failovers are `tracing` events inside them, which become
//! span events (a server's restart is a short span of the server actor's own). The spans are ordinary `tracing` spans: exported only when
//! an OpenTelemetry layer is installed. Names and targets come from callers and servers:
//! a target is cut short in a span name, and a resource's uri is never in one.

use std::borrow::Cow;

use serde_json::Value;

use super::caller::CallKind;
use super::error::CallError;
use crate::server::{ServerError, ServerRef};
use crate::transport::TransportSpec;
use crate::util::trace_context::{call_span, span_name};

/// The span name of a call or attempt on `name`.
pub(super) fn name(kind: CallKind, name: &str) -> String {
    span_name(kind.method(), kind != CallKind::Resource, name)
}

/// The longest tool, prompt or input key recorded on a span (characters).
const ATTRIBUTE_MAX: usize = 128;

/// A name as a span attribute, cut short (a caller or a server may send megabytes of
/// one, and every exported span would carry it), its control and invisible format
/// characters shown as U+FFFD (a log line may reach a terminal). Written only if the
/// span records it.
pub(super) struct Cut<'a>(pub(super) &'a str);

impl std::fmt::Display for Cut<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write;
        let mut chars = self.0.chars();
        for c in chars.by_ref().take(ATTRIBUTE_MAX) {
            let shown = crate::util::trace_context::shown_as_is(c);
            f.write_char(if shown { c } else { '\u{FFFD}' })?;
        }
        if chars.next().is_some() {
            f.write_char('…')?;
        }
        Ok(())
    }
}

/// The call's target as a span attribute: a tool's or a prompt's name, cut short;
/// none for a resource, whose uri may hold secrets.
pub(super) fn target(kind: CallKind, name: &str) -> Option<tracing::field::DisplayValue<Cut<'_>>> {
    (kind != CallKind::Resource).then(|| tracing::field::display(Cut(name)))
}

/// `network.transport`: `pipe` for stdio servers, `tcp` for HTTP ones.
pub(super) fn transport(server: &ServerRef) -> &'static str {
    match server.config().transport {
        TransportSpec::Stdio(_) => "pipe",
        TransportSpec::Http(_) => "tcp",
    }
}

/// The span of one attempt of a call on one server.
pub(super) fn attempt_span(
    kind: CallKind,
    item: &str,
    server: &ServerRef,
    traced: bool,
) -> tracing::Span {
    let method = kind.method();
    let (tool, prompt) = match kind {
        CallKind::Tool => (Some(Cut(item)), None),
        CallKind::Prompt => (None, Some(Cut(item))),
        CallKind::Resource => (None, None),
    };
    call_span!(
        traced: traced,
        "attempt",
        otel.name = %name(kind, item),
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        mcp.method.name = method,
        mcp.protocol.version = server.protocol_version(),
        gen_ai.operation.name = tool.as_ref().map(|_| "execute_tool"),
        gen_ai.tool.name = tool.map(tracing::field::display),
        gen_ai.prompt.name = prompt.map(tracing::field::display),
        network.transport = transport(server),
        mcp_harness.server.id = server.id(),
        jsonrpc.request.id = tracing::field::Empty,
        error.type = tracing::field::Empty,
        rpc.response.status_code = tracing::field::Empty,
    )
}

/// `error.type` of a server's failure: a JSON-RPC error's code, else the kind.
pub(super) fn server_error_type(e: &ServerError) -> Cow<'static, str> {
    match e {
        ServerError::Rpc { error, .. } => Cow::Owned(error.code.to_string()),
        other => Cow::Borrowed(other.code()),
    }
}

/// `error.type` of a call's failure on its metric: as on its span, but a JSON-RPC code
/// outside those the spec names is `_OTHER` (a metric's series must stay few).
pub(super) fn metric_error_type(e: &CallError) -> &'static str {
    use crate::protocol::error as rpc;
    match e {
        CallError::Server(ServerError::Rpc { error, .. }) => match error.code {
            rpc::PARSE_ERROR => "-32700",
            rpc::INVALID_REQUEST => "-32600",
            rpc::METHOD_NOT_FOUND => "-32601",
            rpc::INVALID_PARAMS => "-32602",
            rpc::INTERNAL_ERROR => "-32603",
            rpc::RESOURCE_NOT_FOUND => "-32002",
            rpc::HEADER_MISMATCH => "-32020",
            rpc::MISSING_CLIENT_CAPABILITY => "-32021",
            rpc::UNSUPPORTED_PROTOCOL_VERSION => "-32022",
            _ => "_OTHER",
        },
        other => other.code(),
    }
}

/// `error.type` of a call's failure.
pub(super) fn error_type(e: &CallError) -> Cow<'static, str> {
    match e {
        CallError::Server(s) => server_error_type(s),
        other => Cow::Borrowed(other.code()),
    }
}

/// Whether a result is a tool's own error (`isError: true`).
/// Whether `span` records and `result` is a tool error: a span that records nothing
/// is not worth the lookup (two per call).
pub(super) fn tool_error(span: &tracing::Span, result: &Value) -> bool {
    !span.is_disabled() && result.get("isError") == Some(&Value::Bool(true))
}

/// Marks `span` as failed with `error.type`.
pub(crate) fn failed(span: &tracing::Span, error_type: &str) {
    span.record("error.type", error_type);
    if error_type.parse::<i64>().is_ok() {
        span.record("rpc.response.status_code", error_type);
    }
    span.record("otel.status_code", "ERROR");
}

#[cfg(test)]
mod tests {
    use super::*;

    // Cut at its most, control characters shown as U+FFFD.
    #[test]
    fn an_attribute_is_cut_and_shows_no_control_character() {
        assert_eq!(Cut("echo").to_string(), "echo");
        assert_eq!(Cut("a\u{1b}[31mb\r").to_string(), "a\u{FFFD}[31mb\u{FFFD}");
        assert_eq!(Cut("a\u{202e}b").to_string(), "a\u{FFFD}b");
        let long = "é".repeat(ATTRIBUTE_MAX + 1);
        let cut = format!("{}…", "é".repeat(ATTRIBUTE_MAX));
        assert_eq!(Cut(&long).to_string(), cut);
    }
}
