//! OpenTelemetry export for the command line: when the standard `OTEL_*` variables ask
//! for it (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), the
//! harness's spans go over OTLP, HTTP/protobuf by default or gRPC
//! (`OTEL_EXPORTER_OTLP_PROTOCOL` / `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`), named
//! `OTEL_SERVICE_NAME` (default `mcp-harness`). Off otherwise, and off when
//! `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`. The exporter is the
//! `opentelemetry-otlp` crate's; it reads the endpoint, headers and timeout variables
//! itself.

use anyhow::{Context, bail};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Whether the environment asks for trace export.
fn wanted() -> bool {
    let disabled = var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let none = var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"));
    let endpoint = var("OTEL_EXPORTER_OTLP_ENDPOINT").is_some()
        || var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some();
    endpoint && !disabled && !none
}

/// The tracer provider the environment asks for, if any. Call within the runtime: the
/// batch processor runs on it.
pub fn provider() -> anyhow::Result<Option<SdkTracerProvider>> {
    if !wanted() {
        return Ok(None);
    }
    let protocol = var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .unwrap_or_else(|| "http/protobuf".into());
    let exporter = match protocol.as_str() {
        "grpc" => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build()
            .context("OTLP/gRPC exporter")?,
        "http/protobuf" => {
            // The exporter builds its own reqwest client, which (built without a TLS
            // provider of its own, as in the library) needs the process default: ring,
            // the provider the harness's own clients use. The binary may set it.
            let _ = rustls::crypto::ring::default_provider().install_default();
            opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .build()
                .context("OTLP/HTTP exporter")?
        }
        other => {
            bail!("OTEL_EXPORTER_OTLP_PROTOCOL={other:?} is not supported (grpc or http/protobuf)")
        }
    };
    let mut resource = opentelemetry_sdk::Resource::builder();
    let named = var("OTEL_SERVICE_NAME").is_some()
        || var("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| {
            a.split(',')
                .any(|kv| kv.trim_start().starts_with("service.name="))
        });
    if !named {
        resource = resource.with_service_name("mcp-harness");
    }
    let processor =
        BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).build();
    Ok(Some(
        SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(resource.build())
            .build(),
    ))
}

/// The `tracing` layer that turns the harness's spans into OpenTelemetry spans.
pub fn layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    mcp_harness::util::trace_context::layer(provider.tracer("mcp-harness"))
}
