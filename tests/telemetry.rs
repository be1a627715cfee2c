//! OpenTelemetry export from the command line, received by an OTLP collector of the
//! test's own over loopback (HTTP/protobuf with hyper, gRPC with tonic, the messages
//! decoded with `opentelemetry-proto`): span names and attributes by the MCP semantic
//! conventions, their parentage, and the caller's trace context in the `_meta` of the
//! request the server received.

mod support;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::metrics::v1::{Metric, metric};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::Value;
use support::*;

/// What the collector received: every span, and every resource's `service.name`.
#[derive(Clone, Default)]
struct Received(
    Arc<Mutex<(Vec<Span>, Vec<String>)>>,
    Arc<Mutex<Vec<Metric>>>,
);

impl Received {
    fn take(&self, request: ExportTraceServiceRequest) {
        let mut got = self.0.lock().expect("lock");
        for resource in request.resource_spans {
            if let Some(r) = &resource.resource {
                got.1.extend(
                    r.attributes
                        .iter()
                        .filter(|kv| kv.key == "service.name")
                        .filter_map(|kv| text(kv.value.as_ref()?.value.as_ref()?)),
                );
            }
            for scope in resource.scope_spans {
                got.0.extend(scope.spans);
            }
        }
    }

    fn take_metrics(&self, request: ExportMetricsServiceRequest) {
        let mut got = self.1.lock().expect("lock");
        for resource in request.resource_metrics {
            for scope in resource.scope_metrics {
                got.extend(scope.metrics);
            }
        }
    }

    fn metrics(&self) -> Vec<Metric> {
        self.1.lock().expect("lock").clone()
    }

    /// Whether a span named `name` arrives within 10 s.
    async fn arrives(&self, name: &str) -> bool {
        eventually(Duration::from_secs(10), || {
            !named(&self.spans(), name).is_empty()
        })
        .await
    }

    fn spans(&self) -> Vec<Span> {
        self.0.lock().expect("lock").0.clone()
    }

    fn services(&self) -> Vec<String> {
        self.0.lock().expect("lock").1.clone()
    }
}

fn text(v: &any_value::Value) -> Option<String> {
    match v {
        any_value::Value::StringValue(s) => Some(s.clone()),
        any_value::Value::IntValue(i) => Some(i.to_string()),
        any_value::Value::BoolValue(b) => Some(b.to_string()),
        _ => None,
    }
}

fn attr(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| text(kv.value.as_ref()?.value.as_ref()?))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An OTLP/HTTP collector (`POST /v1/traces` and `/v1/metrics`, protobuf) on a
/// loopback port.
async fn http_collector() -> (String, Received) {
    let received = Received::default();
    let got = received.clone();
    let url = http_service(move |path, _, body| {
        let status = match path.as_str() {
            "/v1/traces" => match ExportTraceServiceRequest::decode(body) {
                Ok(request) => {
                    got.take(request);
                    200
                }
                Err(_) => 400,
            },
            "/v1/metrics" => match ExportMetricsServiceRequest::decode(body) {
                Ok(request) => {
                    got.take_metrics(request);
                    200
                }
                Err(_) => 400,
            },
            _ => 400,
        };
        (
            status,
            ExportTraceServiceResponse::default().encode_to_vec(),
        )
    })
    .await;
    (url, received)
}

struct Collector(Received);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.take(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// An OTLP/gRPC collector (the generated `TraceService`, over HTTP/2) on a loopback port.
async fn grpc_collector() -> (String, Received) {
    grpc_collector_on(None).await
}

/// The same over TLS (ALPN h2) with this certificate.
fn tls_acceptor(cert: &Path, key: &Path) -> tokio_rustls::TlsAcceptor {
    use rustls_pki_types::pem::PemObject;
    let certs: Vec<rustls_pki_types::CertificateDer<'static>> =
        rustls_pki_types::CertificateDer::pem_file_iter(cert)
            .expect("cert")
            .collect::<Result<_, _>>()
            .expect("certs");
    let key = rustls_pki_types::PrivateKeyDer::from_pem_file(key).expect("key");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("server config");
    config.alpn_protocols = vec![b"h2".to_vec()];
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

async fn grpc_collector_on(tls: Option<tokio_rustls::TlsAcceptor>) -> (String, Received) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let scheme = if tls.is_some() { "https" } else { "http" };
    let port = listener.local_addr().expect("addr").port();
    let url = match tls {
        Some(_) => format!("{scheme}://localhost:{port}"),
        None => format!("{scheme}://127.0.0.1:{port}"),
    };
    let received = Received::default();
    let service = TraceServiceServer::new(Collector(received.clone()));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = hyper_util::service::TowerToHyperService::new(service.clone());
            let tls = tls.clone();
            tokio::spawn(async move {
                let builder = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                );
                match tls {
                    Some(acceptor) => {
                        let Ok(stream) = acceptor.accept(stream).await else {
                            return;
                        };
                        let io = hyper_util::rt::TokioIo::new(stream);
                        let _ = builder.http2_only().serve_connection(io, service).await;
                    }
                    None => {
                        let io = hyper_util::rt::TokioIo::new(stream);
                        let _ = builder.http2_only().serve_connection(io, service).await;
                    }
                }
            });
        }
    });
    (url, received)
}

/// A config with one stdio demo server `s` recording its requests to `record`.
fn config(tag: &str, record: &Path) -> PathBuf {
    let path = temp_file(tag).with_extension("toml");
    let toml = format!(
        "[[servers]]\nid = \"s\"\ntransport = {{ type = \"stdio\", command = {:?}, args = [\"demo-server\", \"s\", \"--record\", {:?}] }}\n[permissions.local]\n\"*\" = [\"*\"]\n",
        harness_exe(),
        record.to_string_lossy(),
    );
    std::fs::write(&path, toml).expect("write config");
    path
}

/// `mcp-harness call --config CONFIG TOOL {}` exporting to `endpoint` over `protocol`.
async fn traced_call(config: &Path, tool: &str, endpoint: &str, protocol: &str) -> bool {
    traced_call_with(config, tool, endpoint, protocol, None).await
}

/// [`traced_call`] with `OTEL_EXPORTER_OTLP_TIMEOUT` set to `timeout_ms`.
async fn traced_call_with(
    config: &Path,
    tool: &str,
    endpoint: &str,
    protocol: &str,
    timeout_ms: Option<&str>,
) -> bool {
    let config = config.to_path_buf();
    let (tool, endpoint, protocol) = (tool.to_string(), endpoint.to_string(), protocol.to_string());
    let timeout_ms = timeout_ms.map(String::from);
    tokio::task::spawn_blocking(move || {
        let mut command = std::process::Command::new(harness_exe());
        match timeout_ms {
            Some(ms) => command.env("OTEL_EXPORTER_OTLP_TIMEOUT", ms),
            None => command.env_remove("OTEL_EXPORTER_OTLP_TIMEOUT"),
        };
        command
            .args(["call", "--config"])
            .arg(&config)
            .args([tool.as_str(), r#"{"text": "traced"}"#])
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
            .env("OTEL_EXPORTER_OTLP_PROTOCOL", &protocol)
            .env("OTEL_SERVICE_NAME", "mcp-harness-test")
            .env_remove("OTEL_SDK_DISABLED")
            .env_remove("OTEL_TRACES_SAMPLER")
            .env_remove("OTEL_TRACES_SAMPLER_ARG")
            .output()
            .expect("run mcp-harness call")
            .status
            .success()
    })
    .await
    .expect("join")
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

#[tokio::test]
async fn a_call_is_one_span_with_route_and_attempt_children_and_its_context_reaches_the_server() {
    let (endpoint, received) = http_collector().await;
    let record = temp_file("otel-http");
    let config = config("otel-http", &record);
    assert!(traced_call(&config, "s__echo", &endpoint, "http/protobuf").await);
    assert!(
        received.arrives("tools/call s__echo").await,
        "the call's span arrived: {:?}",
        received.spans().iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    let spans = received.spans();
    let call = named(&spans, "tools/call s__echo")[0];
    assert_eq!(call.kind, 1, "internal");
    assert_eq!(attr(call, "mcp.method.name").as_deref(), Some("tools/call"));
    assert_eq!(
        attr(call, "agent").as_deref(),
        Some("local"),
        "the agent, as text"
    );
    // The tool's execution is the attempt's (counted once, on the client span).
    assert!(attr(call, "gen_ai.operation.name").is_none());
    assert!(attr(call, "error.type").is_none());
    let route = named(&spans, "route s__echo");
    assert_eq!(route.len(), 1);
    assert_eq!(
        route[0].parent_span_id, call.span_id,
        "routing is a child of the call"
    );
    let attempts = named(&spans, "tools/call echo");
    assert_eq!(attempts.len(), 1, "one attempt on one server");
    let attempt = attempts[0];
    assert_eq!(attempt.kind, 3, "client");
    assert_eq!(attempt.parent_span_id, call.span_id);
    assert_eq!(attempt.trace_id, call.trace_id);
    assert_eq!(attr(attempt, "network.transport").as_deref(), Some("pipe"));
    assert_eq!(
        attr(attempt, "mcp.protocol.version").as_deref(),
        Some("2026-07-28")
    );
    assert_eq!(attr(attempt, "gen_ai.tool.name").as_deref(), Some("echo"));
    assert_eq!(
        attr(attempt, "gen_ai.operation.name").as_deref(),
        Some("execute_tool")
    );
    assert_eq!(attr(attempt, "mcp_harness.server.id").as_deref(), Some("s"));
    assert!(received.services().iter().any(|s| s == "mcp-harness-test"));
    // The server received the attempt's context: same trace, the attempt as parent.
    let calls: Vec<Value> = recorded(&record)
        .into_iter()
        .filter(|r| r["method"] == "tools/call")
        .collect();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0]["params"]["_meta"]["traceparent"].as_str(),
        Some(format!("00-{}-{}-01", hex(&attempt.trace_id), hex(&attempt.span_id)).as_str()),
        "{}",
        calls[0]
    );
    // And the attempt names the JSON-RPC request it sent, as a string (the conventions'
    // type for `jsonrpc.request.id`).
    let id = attempt
        .attributes
        .iter()
        .find(|kv| kv.key == "jsonrpc.request.id")
        .and_then(|kv| kv.value.as_ref()?.value.clone());
    assert_eq!(
        id,
        calls[0]["id"]
            .as_i64()
            .map(|i| any_value::Value::StringValue(i.to_string()))
    );
    let _ = std::fs::remove_file(record);
    let _ = std::fs::remove_file(config);
}

// A call sent again under a new id (its legacy session expired at the call: 404, a new
// session, the call again) names once the id the server answered. Before, the attempt
// named the first id only, which the server never answered.
#[tokio::test]
async fn a_call_sent_again_under_a_new_id_names_the_id_it_was_answered_under() {
    let (endpoint, received) = http_collector().await;
    let record = temp_file("otel-resent");
    let rec = record.to_string_lossy().into_owned();
    let server = HttpServer::demo(&[
        "s",
        "--era",
        "legacy",
        "--expire-on-first-call",
        "--record",
        &rec,
    ])
    .await;
    let config = temp_file("otel-resent").with_extension("toml");
    let toml = format!(
        "[[servers]]\nid = \"s\"\ntransport = {{ type = \"http\", url = {:?} }}\n[permissions.local]\n\"*\" = [\"*\"]\n",
        server.url,
    );
    std::fs::write(&config, toml).expect("write config");
    assert!(traced_call(&config, "s__echo", &endpoint, "http/protobuf").await);
    assert!(
        received.arrives("tools/call s__echo").await,
        "the call's span arrived"
    );
    let spans = received.spans();
    let attempts = named(&spans, "tools/call echo");
    assert_eq!(attempts.len(), 1, "one attempt");
    let ids: Vec<_> = attempts[0]
        .attributes
        .iter()
        .filter(|kv| kv.key == "jsonrpc.request.id")
        .filter_map(|kv| kv.value.as_ref()?.value.clone())
        .collect();
    let calls: Vec<Value> = recorded(&record)
        .into_iter()
        .filter(|r| r["method"] == "tools/call")
        .collect();
    assert_eq!(calls.len(), 2, "refused once, then answered: {calls:?}");
    assert_eq!(calls[0]["status"], 404, "{calls:?}");
    assert_ne!(calls[0]["id"], calls[1]["id"], "sent again under a new id");
    let answered = calls[1]["id"].as_i64().expect("a number id");
    assert_eq!(
        ids,
        vec![any_value::Value::StringValue(answered.to_string())],
        "the id answered, once"
    );
    let _ = std::fs::remove_file(record);
    let _ = std::fs::remove_file(config);
}

#[tokio::test]
async fn a_long_tool_name_is_cut_short_in_every_attribute_of_the_calls_span() {
    let (endpoint, received) = http_collector().await;
    let record = temp_file("otel-long");
    let config = config("otel-long", &record);
    // A caller may name anything (a gateway's client sends megabytes as easily): no
    // tool has this name, and the call's span still records what was asked.
    let long = format!("s__{}", "z".repeat(20_000));
    assert!(!traced_call(&config, &long, &endpoint, "http/protobuf").await);
    let prefix = format!("tools/call s__{}", "z".repeat(50));
    let arrived = eventually(Duration::from_secs(20), || {
        received.spans().iter().any(|s| s.name.starts_with(&prefix))
    })
    .await;
    assert!(
        arrived,
        "{:?}",
        received
            .spans()
            .iter()
            .map(|s| s.name.len())
            .collect::<Vec<_>>()
    );
    let spans = received.spans();
    let call = spans
        .iter()
        .find(|s| s.name.starts_with(&prefix))
        .expect("the call's span");
    assert!(
        call.name.chars().count() < 200,
        "{} characters",
        call.name.len()
    );
    let name = attr(call, "name").expect("the name asked");
    assert!(name.starts_with("s__zzz"), "{name}");
    assert!(name.chars().count() <= 129, "{} characters", name.len());
    let _ = std::fs::remove_file(record);
    let _ = std::fs::remove_file(config);
}

#[tokio::test]
async fn over_grpc_a_failed_call_carries_its_error_type_on_the_call_and_the_attempt() {
    let (endpoint, received) = grpc_collector().await;
    let record = temp_file("otel-grpc");
    let config = config("otel-grpc", &record);
    // `crash` makes the server exit before it answers: the call fails.
    assert!(!traced_call(&config, "s__crash", &endpoint, "grpc").await);
    assert!(
        received.arrives("tools/call s__crash").await,
        "the call's span arrived over gRPC: {:?}",
        received.spans().iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    let spans = received.spans();
    let call = named(&spans, "tools/call s__crash")[0];
    let attempt = named(&spans, "tools/call crash")[0];
    assert_eq!(attempt.parent_span_id, call.span_id);
    let error = attr(call, "error.type").expect("error.type on the call");
    assert_eq!(attr(attempt, "error.type").as_deref(), Some(error.as_str()));
    assert_eq!(
        call.status.as_ref().map(|s| s.code),
        Some(2),
        "status ERROR"
    );
    // The server's exit is a span of its own, as it happens (not an event of a span
    // that lasts as long as the server), with the reason on its event.
    assert!(
        received.arrives("restart s").await,
        "{:?}",
        received.spans().iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    let spans = received.spans();
    let restart = named(&spans, "restart s")[0];
    assert_eq!(attr(restart, "mcp_harness.server.id").as_deref(), Some("s"));
    assert!(!restart.events.is_empty(), "the restart's reason");
    let _ = std::fs::remove_file(record);
    let _ = std::fs::remove_file(config);
}

// `OTEL_EXPORTER_OTLP_TIMEOUT=0` is read as the harness reads it (not a number of ms
// above zero: the default 10 s), and the exporter is given that reading rather than
// reading the variable again itself (as no time at all): the spans still arrive.
#[tokio::test]
async fn a_zero_export_timeout_still_exports_over_grpc() {
    let (endpoint, received) = grpc_collector().await;
    let record = temp_file("otel-zero");
    let config = config("otel-zero", &record);
    assert!(traced_call_with(&config, "s__echo", &endpoint, "grpc", Some("0")).await);
    assert!(
        received.arrives("tools/call s__echo").await,
        "{:?}",
        received.spans().iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    let _ = std::fs::remove_file(record);
    let _ = std::fs::remove_file(config);
}

/// A collector's address that answers every request `307` to `to`'s, counting them.
async fn redirecting_to(to: &str) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (count, to) = (hits.clone(), to.to_string());
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut head = vec![0u8; 64 << 10];
            let _ = stream.read(&mut head).await;
            let reply = format!(
                "HTTP/1.1 307 Temporary Redirect\r\nlocation: {to}/v1/traces\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            );
            let _ = stream.write_all(reply.as_bytes()).await;
        }
    });
    (url, hits)
}

// A collector's redirect is a failed export, not followed: it would carry the batch and
// the exporter's headers (an API key, under a name reqwest does not know to strip) to
// another host.
#[tokio::test]
async fn a_collectors_redirect_is_not_followed() {
    let (elsewhere, received) = http_collector().await;
    let (endpoint, hits) = redirecting_to(&elsewhere).await;
    let record = temp_file("otel-redirect");
    let config = config("otel-redirect", &record);
    assert!(traced_call(&config, "s__echo", &endpoint, "http/protobuf").await);
    assert!(
        hits.load(std::sync::atomic::Ordering::SeqCst) >= 1,
        "exported"
    );
    assert!(received.spans().is_empty(), "followed to another host");
    let _ = std::fs::remove_file(record);
    let _ = std::fs::remove_file(config);
}

#[tokio::test]
async fn without_otel_variables_nothing_is_exported_and_no_trace_context_is_sent() {
    let record = temp_file("otel-off");
    let config = config("otel-off", &record);
    let out = std::process::Command::new(harness_exe())
        .args(["call", "--config"])
        .arg(&config)
        .args(["s__echo", r#"{"text": "untraced"}"#])
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .output()
        .expect("run");
    assert!(out.status.success());
    let calls: Vec<Value> = recorded(&record)
        .into_iter()
        .filter(|r| r["method"] == "tools/call")
        .collect();
    assert_eq!(calls.len(), 1);
    assert!(
        calls[0]["params"]["_meta"].get("traceparent").is_none(),
        "{}",
        calls[0]
    );
    let _ = std::fs::remove_file(record);
    let _ = std::fs::remove_file(config);
}

// `OTEL_TRACES_EXPORTER` set wins over the table's `traces` either way, as every other
// variable does; an exporter this program does not have is said, and left to the table.
#[tokio::test]
async fn the_exporter_variable_wins_over_the_tables_switch() {
    let (endpoint, received) = http_collector().await;
    let record = temp_file("otel-switch");
    let config = config("otel-switch", &record);
    let mut toml = std::fs::read_to_string(&config).expect("config");
    toml.push_str("[telemetry]\ntraces = false\n");
    std::fs::write(&config, toml).expect("config");
    // Off the test's runtime, which serves the collector meanwhile.
    let run = |exporter: &str| {
        let (config, endpoint, exporter) = (config.clone(), endpoint.clone(), exporter.to_string());
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(harness_exe())
                .args(["call", "--config"])
                .arg(&config)
                .args(["s__echo", r#"{"text": "switched"}"#])
                .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
                .env("OTEL_TRACES_EXPORTER", exporter)
                .env_remove("OTEL_SDK_DISABLED")
                .env_remove("OTEL_TRACES_SAMPLER")
                .output()
                .expect("run")
        })
    };
    let traced = |n: usize| {
        let calls: Vec<Value> = recorded(&record)
            .into_iter()
            .filter(|r| r["method"] == "tools/call")
            .collect();
        calls[n]["params"]["_meta"].get("traceparent").is_some()
    };
    // The table says off, the variable on: on.
    let out = run("otlp").await.expect("join");
    assert!(out.status.success());
    assert!(traced(0), "the variable's otlp exported");
    let exported = eventually(Duration::from_secs(10), || !received.spans().is_empty()).await;
    assert!(exported, "spans reached the collector");
    // An exporter this program does not have: said, and the table's off holds.
    let out = run("zipkin").await.expect("join");
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("OTEL_TRACES_EXPORTER=zipkin"), "{err}");
    assert!(!traced(1), "the table's traces = false");
    let _ = std::fs::remove_file(record);
    let _ = std::fs::remove_file(config);
}

/// A gateway exporting to `endpoint` that keeps `ratio` of new traces, with
/// `gateway_extra` in its `[gateway]` table; its config file.
async fn gateway_keeping(
    tag: &str,
    record: &Path,
    (endpoint, ratio): (&str, &str),
    gateway_extra: &str,
) -> (HttpServer, PathBuf) {
    let config = config(tag, record);
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", ratio),
        ("OTEL_METRIC_EXPORT_INTERVAL", "200"),
    ];
    (serve(&config, gateway_extra, &env, None).await, config)
}

/// `mcp-harness serve --dev-keys` of `config` on a loopback port, with a `[gateway]`
/// table (anonymous agent `local`, and `gateway_extra`) added to it, `env` set, and its
/// log to `log` when given.
async fn serve(
    config: &Path,
    gateway_extra: &str,
    env: &[(&str, &str)],
    log: Option<&Path>,
) -> HttpServer {
    let mut toml = std::fs::read_to_string(config).expect("config");
    toml.push_str(&format!(
        "[gateway]\nanonymous_agent = \"local\"\n{gateway_extra}\n"
    ));
    std::fs::write(config, toml).expect("config");
    let config_path = config.to_string_lossy().into_owned();
    let stderr = log.map_or_else(std::process::Stdio::inherit, |log| {
        std::fs::File::create(log).expect("log").into()
    });
    HttpServer::start_with(
        &harness_exe(),
        &[
            "serve",
            "--dev-keys",
            "--listen",
            "127.0.0.1:0",
            "--config",
            &config_path,
        ],
        env,
        stderr,
    )
    .await
}

/// Calls `s__echo` with `text` through the gateway at `url`, with `traceparent` in its
/// `_meta` if given.
async fn call_with_trace_context(url: &str, text: &str, traceparent: Option<String>) {
    let echo = serde_json::json!({"text": text});
    call_tool_traced(url, "s__echo", echo, traceparent).await;
}

/// Calls `name` with `arguments` through the gateway at `url`, with `traceparent`.
async fn call_tool_traced(url: &str, name: &str, arguments: Value, traceparent: Option<String>) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut meta = serde_json::json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
    });
    if let Some(tp) = traceparent {
        meta["traceparent"] = tp.into();
    }
    let params = serde_json::json!({"name": name, "arguments": arguments, "_meta": meta});
    let response = post_tools_call(url, name, params).await;
    assert_eq!(response.status().as_u16(), 200);
}

/// POSTs a modern `tools/call` of `name` with `params` to the gateway at `url`.
async fn post_tools_call(url: &str, name: &str, params: Value) -> reqwest::Response {
    let body =
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params});
    reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", name)
        .body(body.to_string())
        .send()
        .await
        .expect("send")
}

/// Ends `gateway` as an operator would (SIGTERM), waiting for it to flush and exit.
async fn stop_gateway(gateway: &mut HttpServer) {
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &gateway.child.id().expect("pid").to_string()])
        .status();
    let _ = tokio::time::timeout(Duration::from_secs(20), gateway.child.wait()).await;
}

/// The values of `name`'s data points whose attributes include all of `with`, in the
/// order they arrived.
fn sum_points(metrics: &[Metric], name: &str, with: &[(&str, &str)]) -> Vec<i64> {
    use opentelemetry_proto::tonic::metrics::v1::number_data_point;
    let has =
        |p: &opentelemetry_proto::tonic::metrics::v1::NumberDataPoint, key: &str, value: &str| {
            p.attributes.iter().any(|kv| {
                kv.key == key
                    && kv
                        .value
                        .as_ref()
                        .and_then(|v| text(v.value.as_ref()?))
                        .as_deref()
                        == Some(value)
            })
        };
    metrics
        .iter()
        .filter(|m| m.name == name)
        .filter_map(|m| match &m.data {
            Some(metric::Data::Sum(sum)) => Some(sum.data_points.clone()),
            _ => None,
        })
        .flatten()
        .filter(|p| with.iter().all(|(key, value)| has(p, key, value)))
        .filter_map(|p| match p.value? {
            number_data_point::Value::AsInt(i) => Some(i),
            number_data_point::Value::AsDouble(_) => None,
        })
        .collect()
}

// A reload that changes a server removes it and adds it again under its id: its
// exported call count goes on from where it was. Before, it started again from zero,
// which a cumulative counter must not do (and the SDK's delta temporality subtracted
// in u64).
#[tokio::test]
async fn a_servers_call_count_goes_on_across_a_reload_that_changes_it() {
    let (endpoint, received) = http_collector().await;
    let record = temp_file("otel-reload");
    let (mut gateway, config) = gateway_keeping("otel-reload", &record, (&endpoint, "0"), "").await;
    let calls = || {
        sum_points(
            &received.metrics(),
            "mcp_harness.calls",
            &[
                ("mcp_harness.server.id", "s"),
                ("mcp_harness.outcome", "ok"),
                ("mcp.method.name", "tools/call"),
            ],
        )
    };
    for text in ["one", "two", "three"] {
        call_with_trace_context(&gateway.url, text, None).await;
    }
    assert!(
        eventually(Duration::from_secs(20), || calls().last() == Some(&3)).await,
        "three calls exported: {:?}",
        calls()
    );
    // The server's arguments change: it is removed and added again.
    let toml = std::fs::read_to_string(&config).expect("config");
    let changed = toml.replacen("\"--record\"", "\"--page-size\", \"50\", \"--record\"", 1);
    assert_ne!(changed, toml);
    std::fs::write(&config, changed).expect("config");
    let _ = std::process::Command::new("kill")
        .args(["-HUP", &gateway.child.id().expect("pid").to_string()])
        .status();
    // Until the new server answers, calls may fail; one that succeeds is counted.
    let served = async {
        loop {
            let n = calls().len();
            call_with_trace_context(&gateway.url, "after", None).await;
            if eventually(Duration::from_secs(3), || calls().len() > n).await
                && calls().last().is_some_and(|c| *c != 3)
            {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(30), served).await;
    stop_gateway(&mut gateway).await;
    let points = calls();
    assert!(
        points.windows(2).all(|w| w[0] <= w[1]) && points.last().is_some_and(|c| *c > 3),
        "never back, and on past three: {points:?}"
    );
    let _ = std::fs::remove_file(record);
    let _ = std::fs::remove_file(config);
}

// A resource no list names is asked of each server whose template makes it in turn;
// the first (its list says more than it has) says it has no such resource, quoting the
// URI in its message, and the read fails over. No span,
// attribute or event carries the URI (it may hold a secret), the failover's included:
// before, that event carried the server's message.
#[tokio::test]
async fn a_failover_on_a_resource_read_puts_its_uri_in_no_span() {
    let (endpoint, received) = http_collector().await;
    let record = temp_file("otel-uri");
    let config = config("otel-uri", &record);
    // A second server that serves the template, after the first in config order, which
    // lists it too.
    let mut toml = std::fs::read_to_string(&config).expect("config").replacen(
        r#""s", "--record""#,
        r#""s", "--list-template", "demo://echo/{text}", "--record""#,
        1,
    );
    assert!(toml.contains("--list-template"), "{toml}");
    let second = format!(
        "[[servers]]\nid = \"t\"\ntransport = {{ type = \"stdio\", command = {:?}, args = [\"demo-server\", \"t\", \"--resource-template\"] }}\n",
        harness_exe()
    );
    toml.insert_str(
        toml.find("[permissions.local]").expect("permissions"),
        &second,
    );
    std::fs::write(&config, toml).expect("config");
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", "1"),
    ];
    let mut gateway = serve(&config, "", &env, None).await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let uri = "demo://echo/secret-token-8f3a";
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {
    "uri": uri, "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
    }}});
    let response = reqwest::Client::new()
        .post(&gateway.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "resources/read")
        .header("mcp-name", uri)
        .body(body.to_string())
        .send()
        .await
        .expect("send");
    let answer: Value = response.json().await.expect("json");
    assert_eq!(
        answer["result"]["contents"][0]["text"], "secret-token-8f3a",
        "served by the second server: {answer}"
    );
    stop_gateway(&mut gateway).await;
    assert!(
        eventually(Duration::from_secs(10), || received
            .spans()
            .iter()
            .any(|s| s.events.iter().any(|e| e.name.contains("failing over"))))
        .await,
        "the failover's event is exported: {:?}",
        received.spans().iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    for span in received.spans() {
        let everything = format!("{span:?}");
        assert!(!everything.contains("secret-token"), "{everything}");
    }
    let _ = std::fs::remove_file(record);
    let _ = std::fs::remove_file(config);
}

#[tokio::test]
async fn the_gateway_continues_a_downstream_clients_trace_through_the_call_to_the_server() {
    let (endpoint, received) = http_collector().await;
    let record = temp_file("otel-gw");
    // No new trace is kept (ratio 0), but a client's sampled trace is: the decision is
    // parent-based, made once at the gateway and handed to the call.
    let (mut gateway, config) = gateway_keeping("otel-gw", &record, (&endpoint, "0"), "").await;
    let (trace, parent) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let unsampled = "5bf92f3577b34da6a3ce929d0e0e4737";
    // The client's sampled trace, its unsampled one, and no trace context at all.
    for (text, traceparent) in [
        ("traced", Some(format!("00-{trace}-{parent}-01"))),
        ("unsampled", Some(format!("00-{unsampled}-{parent}-00"))),
        ("new", None),
    ] {
        call_with_trace_context(&gateway.url, text, traceparent).await;
    }
    // A tool's own error, in a trace of its own: the server span says so.
    let failing = "6bf92f3577b34da6a3ce929d0e0e4738";
    let bad_add = serde_json::json!({"a": "x", "b": 1});
    let sampled = Some(format!("00-{failing}-{parent}-01"));
    call_tool_traced(&gateway.url, "s__add", bad_add, sampled).await;
    stop_gateway(&mut gateway).await;
    let failed_server = || {
        received
            .spans()
            .into_iter()
            .find(|s| hex(&s.trace_id) == failing && s.kind == 2)
    };
    assert!(
        eventually(Duration::from_secs(10), || failed_server().is_some()).await,
        "the failing call's server span"
    );
    let failed = failed_server().expect("exported");
    assert_eq!(attr(&failed, "error.type").as_deref(), Some("tool_error"));
    assert_eq!(
        failed.status.as_ref().map(|s| s.code),
        Some(2),
        "status ERROR"
    );
    let ours = |s: &&Span| hex(&s.trace_id) == trace;
    assert!(
        eventually(Duration::from_secs(10), || received
            .spans()
            .iter()
            .filter(ours)
            .count()
            >= 3)
        .await,
        "{:?}",
        received.spans().iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    let spans: Vec<Span> = received.spans().into_iter().filter(|s| ours(&s)).collect();
    let server = spans
        .iter()
        .find(|s| s.kind == 2)
        .expect("the gateway's server span, in the client's trace");
    assert_eq!(
        hex(&server.parent_span_id),
        parent,
        "a child of the client's span"
    );
    let call = spans
        .iter()
        .find(|s| s.name == "tools/call s__echo" && s.kind == 1)
        .expect("the call span");
    assert_eq!(call.parent_span_id, server.span_id);
    let attempt = spans
        .iter()
        .find(|s| s.name == "tools/call echo")
        .expect("the attempt span");
    assert_eq!(attempt.parent_span_id, call.span_id);
    // The gateway flushed its spans before it exited: the two calls not kept built none.
    let attempts = received
        .spans()
        .into_iter()
        .filter(|s| s.name == "tools/call echo")
        .count();
    assert_eq!(attempts, 1, "only the sampled call's attempt was exported");
    assert!(
        received
            .spans()
            .iter()
            .filter(|s| s.name == "tools/call s__echo" || s.name.starts_with("route"))
            .all(|s| ours(&s) || hex(&s.trace_id) == failing),
        "no gateway, call or route span of the calls not kept"
    );
    let sent: Vec<Value> = recorded(&record)
        .into_iter()
        .filter(|r| r["method"] == "tools/call")
        .collect();
    assert_eq!(sent.len(), 4);
    assert_eq!(
        sent[0]["params"]["_meta"]["traceparent"].as_str(),
        Some(format!("00-{trace}-{}-01", hex(&attempt.span_id)).as_str())
    );
    // The client's unsampled trace is passed on as it came, from the client's span: the
    // server keeps none of it either. A request that came with none goes with none.
    assert_eq!(
        sent[1]["params"]["_meta"]["traceparent"].as_str(),
        Some(format!("00-{unsampled}-{parent}-00").as_str())
    );
    assert!(
        sent[2]["params"]["_meta"].get("traceparent").is_none(),
        "{}",
        sent[2]
    );
    let _ = std::fs::remove_file(record);
    let _ = std::fs::remove_file(config);
}

/// A modern client's `tools/call` of `name` with `extra` params (a round's state and
/// answers) through the gateway at `url`, in the client's trace `traceparent`: the
/// JSON-RPC response.
async fn modern_call(url: &str, name: &str, extra: Value, traceparent: String) -> Value {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let meta = serde_json::json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
        "traceparent": traceparent,
    });
    let mut params = serde_json::json!({"name": name, "arguments": {"n": 2}, "_meta": meta});
    if let (Some(p), Value::Object(extra)) = (params.as_object_mut(), extra) {
        p.extend(extra);
    }
    let response = post_tools_call(url, name, params).await;
    let text = response.text().await.expect("body");
    // A JSON body, or an event stream whose last message is the response.
    let json = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .next_back()
        .unwrap_or(&text);
    serde_json::from_str(json.trim()).expect("a JSON-RPC response")
}

// Each request of a parked call (a legacy server's question, held by the gateway) is a
// server span of its own, in its client's trace: the first, answered `input_required`,
// ends with that answer, and the call's span under it does not hold it open; the one
// that resumes the call says how it ended, here the gateway's own refusal past the
// round cap, after the call went on. A request refused before it is routed has its span.
#[tokio::test]
async fn each_request_of_a_parked_call_is_a_server_span_that_ends_with_it() {
    let (endpoint, received) = http_collector().await;
    let record = temp_file("otel-gw-park");
    let config = temp_file("otel-gw-park").with_extension("toml");
    let toml = format!(
        "round_cap = 1\n[[servers]]\nid = \"s\"\ntransport = {{ type = \"stdio\", command = {:?}, args = [\"demo-server\", \"s\", \"--era\", \"legacy\", \"--record\", {:?}] }}\n[permissions.local]\n\"*\" = [\"*\"]\n",
        harness_exe(),
        record.to_string_lossy(),
    );
    std::fs::write(&config, toml).expect("write config");
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", "0"),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    let mut gateway = serve(&config, "", &env, None).await;
    let parent = "00f067aa0ba902b7";
    let (first, second) = (
        "7bf92f3577b34da6a3ce929d0e0e4739",
        "8bf92f3577b34da6a3ce929d0e0e4730",
    );
    let asked = modern_call(
        &gateway.url,
        "s__rounds",
        serde_json::json!({}),
        format!("00-{first}-{parent}-01"),
    )
    .await;
    let result = &asked["result"];
    assert_eq!(result["resultType"], "input_required", "{asked}");
    let server_span_of = |trace: &str| {
        received
            .spans()
            .into_iter()
            .find(|s| hex(&s.trace_id) == trace && s.kind == 2)
    };
    // Exported while the call waits for its answer: the span ended with its request.
    assert!(
        eventually(Duration::from_secs(10), || server_span_of(first).is_some()).await,
        "the first request's span, before the call ends"
    );
    let resume = serde_json::json!({
        "requestState": result["requestState"],
        "inputResponses": {"elicitation": {"action": "accept", "content": {"answer": "one"}}},
    });
    let refused = modern_call(
        &gateway.url,
        "s__rounds",
        resume,
        format!("00-{second}-{parent}-01"),
    )
    .await;
    let code = refused["error"]["code"]
        .as_i64()
        .expect("refused past the cap");
    // A request refused before its call is routed (it names no tool) has its span too.
    let unknown = "9bf92f3577b34da6a3ce929d0e0e4731";
    let traceparent = format!("00-{unknown}-{parent}-01");
    let nameless = serde_json::json!({"name": null});
    let none = modern_call(&gateway.url, "s__rounds", nameless, traceparent).await;
    let unknown_code = none["error"]["code"].as_i64().expect("refused: no name");
    stop_gateway(&mut gateway).await;
    let refused_span = server_span_of(unknown).expect("the refused request's span");
    assert_eq!(refused_span.name, "tools/call");
    let error_type = attr(&refused_span, "error.type");
    assert_eq!(error_type, Some(unknown_code.to_string()));
    let asking = server_span_of(first).expect("exported");
    assert_eq!(
        attr(&asking, "error.type"),
        None,
        "input_required is no error"
    );
    assert_eq!(hex(&asking.parent_span_id), parent);
    let resuming = server_span_of(second).expect("the resuming request's own span");
    assert_eq!(hex(&resuming.parent_span_id), parent);
    assert_eq!(attr(&resuming, "error.type"), Some(code.to_string()));
    assert_eq!(resuming.status.as_ref().map(|s| s.code), Some(2));
    assert!(asking.end_time_unix_nano <= resuming.start_time_unix_nano);
    // The call went on under the first request's span.
    let call = received
        .spans()
        .into_iter()
        .find(|s| hex(&s.trace_id) == first && s.name == "tools/call s__rounds" && s.kind == 1)
        .expect("the call's span, in the first request's trace");
    assert_eq!(call.parent_span_id, asking.span_id);
    let _ = std::fs::remove_file(record);
    let _ = std::fs::remove_file(config);
}

// Every call request has its server span, refused or not: one the listener refuses (a
// bad envelope, a header that disagrees with the body), one past its principal's
// requests in flight, and search mode's meta-tools, `call_tool`'s named by the tool it
// calls.
#[tokio::test]
async fn a_call_request_refused_before_it_runs_has_its_span_and_so_do_the_meta_tools() {
    let (endpoint, received) = http_collector().await;
    let record = temp_file("otel-gw-refused");
    let config = config("otel-gw-refused", &record);
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    let extra = "tool_exposure = \"search\"\nmax_in_flight_per_principal = 1";
    let mut gateway = serve(&config, extra, &env, None).await;
    let parent = "00f067aa0ba902b7";
    let trace = |n: u8| format!("7bf92f3577b34da6a3ce929d0e0e47{n:02x}");
    let context = |n: u8| format!("00-{}-{parent}-01", trace(n));
    let search = serde_json::json!({"arguments": {"query": "echo text back"}});
    let found = modern_call(&gateway.url, "search_tools", search, context(1)).await;
    assert!(found["result"].is_object(), "{found}");
    // The envelope without the client's capabilities.
    let bare = serde_json::json!({"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "traceparent": context(2),
    }});
    let no_envelope = modern_call(&gateway.url, "search_tools", bare, context(2)).await;
    let envelope_code = no_envelope["error"]["code"].as_i64().expect("refused");
    // A header naming another tool than the body does.
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "describe_tool", "arguments": {"name": "s__echo"},
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "traceparent": context(3),
        },
    }});
    // Its code, for a modern tools/call POSTed with these Mcp-Name headers.
    let refusal = |body: Value, names: &'static [&'static str]| {
        let mut post = reqwest::Client::new()
            .post(&gateway.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call");
        for name in names {
            post = post.header("mcp-name", *name);
        }
        async move {
            let answer: Value = post
                .body(body.to_string())
                .send()
                .await
                .expect("send")
                .json()
                .await
                .expect("a JSON-RPC response");
            answer["error"]["code"].as_i64().expect("refused")
        }
    };
    let mismatch_code = refusal(body.clone(), &["search_tools"]).await;
    // A mirror header sent twice.
    let mut twice = body;
    twice["params"]["name"] = "search_tools".into();
    twice["params"]["_meta"]["traceparent"] = context(7).into();
    let repeated_code = refusal(twice, &["search_tools", "search_tools"]).await;
    // A legacy request on a session the gateway does not know.
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "search_tools", "arguments": {"query": "echo"},
        "_meta": {"traceparent": context(6)},
    }});
    let unknown = reqwest::Client::new()
        .post(&gateway.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", "no-such-session")
        .body(body.to_string())
        .send()
        .await
        .expect("send");
    assert_eq!(unknown.status(), reqwest::StatusCode::NOT_FOUND);
    // The principal's one place held by a call that never ends; the next is refused.
    let url = gateway.url.clone();
    let hang = serde_json::json!({"arguments": {"name": "s__hang"}});
    let hung = context(4);
    let held = tokio::spawn(async move { modern_call(&url, "call_tool", hang, hung).await });
    assert!(
        eventually(Duration::from_secs(10), || recorded(&record)
            .iter()
            .any(|r| r["params"]["name"] == "hang"))
        .await,
        "the hanging call reached the server"
    );
    let echo = serde_json::json!({"arguments": {"name": "s__echo", "arguments": {"text": "x"}}});
    let busy = modern_call(&gateway.url, "call_tool", echo, context(5)).await;
    let busy_code = busy["error"]["code"].as_i64().expect("past the cap");
    stop_gateway(&mut gateway).await;
    held.abort();
    let span = |n: u8| {
        received
            .spans()
            .into_iter()
            .find(|s| hex(&s.trace_id) == trace(n) && s.kind == 2)
            .unwrap_or_else(|| panic!("request {n}'s server span"))
    };
    let searched = span(1);
    assert_eq!(searched.name, "tools/call search_tools");
    assert_eq!(attr(&searched, "error.type"), None);
    assert_eq!(hex(&searched.parent_span_id), parent);
    for (n, name, code) in [
        (2, "tools/call search_tools", envelope_code),
        (3, "tools/call describe_tool", mismatch_code),
        (5, "tools/call s__echo", busy_code),
        (6, "tools/call search_tools", -32600),
        (7, "tools/call search_tools", repeated_code),
    ] {
        let refused = span(n);
        assert_eq!(refused.name, name);
        assert_eq!(
            attr(&refused, "error.type"),
            Some(code.to_string()),
            "{name}"
        );
        assert_eq!(refused.status.as_ref().map(|s| s.code), Some(2), "{name}");
    }
    let _ = std::fs::remove_file(record);
    let _ = std::fs::remove_file(config);
}

// With export off a gateway makes no trace context of its own, and passes its client's
// on as it came: the server continues the client's trace.
#[tokio::test]
async fn without_export_a_gateway_passes_its_clients_trace_context_on_as_it_came() {
    let record = temp_file("otel-gw-off");
    let config = config("otel-gw-off", &record);
    let mut gateway = serve(&config, "", &[], None).await;
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    call_with_trace_context(&gateway.url, "sampled", Some(traceparent.into())).await;
    call_with_trace_context(&gateway.url, "none", None).await;
    stop_gateway(&mut gateway).await;
    let sent: Vec<Value> = recorded(&record)
        .into_iter()
        .filter(|r| r["method"] == "tools/call")
        .map(|r| r["params"]["_meta"]["traceparent"].clone())
        .collect();
    assert_eq!(sent, [Value::from(traceparent), Value::Null]);
    let _ = std::fs::remove_file(record);
    let _ = std::fs::remove_file(config);
}

// With `follow_client_sampling = false`, the ratio decides whatever the client's flag
// says: at 0 a client that marks its request sampled is not traced (no span; the server
// is passed the client's context marked not sampled); at 1 one that marks it unsampled
// is, in its own trace.
#[tokio::test]
async fn a_gateway_that_does_not_follow_clients_sampling_keeps_their_calls_at_its_ratio() {
    let (trace, parent) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    for (ratio, flag) in [("0", "01"), ("1", "00")] {
        let (endpoint, received) = http_collector().await;
        let record = temp_file(&format!("otel-gw-ratio{ratio}"));
        let (mut gateway, config) = gateway_keeping(
            &format!("otel-gw-ratio{ratio}"),
            &record,
            (&endpoint, ratio),
            "follow_client_sampling = false",
        )
        .await;
        let traceparent = format!("00-{trace}-{parent}-{flag}");
        call_with_trace_context(&gateway.url, "text", Some(traceparent)).await;
        stop_gateway(&mut gateway).await;
        let sent: Vec<Value> = recorded(&record)
            .into_iter()
            .filter(|r| r["method"] == "tools/call")
            .collect();
        assert_eq!(sent.len(), 1);
        let sent = sent[0]["params"]["_meta"]["traceparent"].as_str();
        let spans = || {
            received
                .spans()
                .into_iter()
                .filter(|s| s.name.starts_with("tools/call"))
                .collect::<Vec<_>>()
        };
        if ratio == "0" {
            let unsampled = format!("00-{trace}-{parent}-00");
            assert_eq!(sent, Some(unsampled.as_str()));
            assert!(spans().is_empty());
        } else {
            let sent = sent.expect("a trace context for the server");
            assert!(sent.starts_with(&format!("00-{trace}-")), "{sent}");
            assert!(sent.ends_with("-01"), "{sent}");
            assert!(
                eventually(Duration::from_secs(10), || !spans().is_empty()).await,
                "the call's spans are exported"
            );
            assert!(spans().iter().all(|s| hex(&s.trace_id) == trace));
        }
        let _ = std::fs::remove_file(record);
        let _ = std::fs::remove_file(config);
    }
}

// With `follow_client_sampling = false` and a ratio between 0 and 1, the requests of one
// client trace get one decision: all traced or none. Before, each request was decided
// apart, and a trace was kept in pieces.
#[tokio::test]
async fn a_client_trace_not_followed_is_kept_whole_or_not_at_all() {
    let (endpoint, _received) = http_collector().await;
    let record = temp_file("otel-gw-whole");
    let (mut gateway, config) = gateway_keeping(
        "otel-gw-whole",
        &record,
        (&endpoint, "0.5"),
        "follow_client_sampling = false",
    )
    .await;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    for n in 0..20u32 {
        let traceparent = format!("00-{trace}-{:016x}-01", n + 1);
        call_with_trace_context(&gateway.url, "text", Some(traceparent)).await;
    }
    stop_gateway(&mut gateway).await;
    // Sampled as passed on: the request's own span's context, or the client's marked
    // not sampled.
    let sent: Vec<bool> = recorded(&record)
        .into_iter()
        .filter(|r| r["method"] == "tools/call")
        .map(|r| {
            let sent = r["params"]["_meta"]["traceparent"].as_str();
            sent.expect("a trace context").ends_with("-01")
        })
        .collect();
    assert_eq!(sent.len(), 20);
    let traced = sent.iter().filter(|t| **t).count();
    assert!(traced == 0 || traced == 20, "{traced} of 20 traced");
    let _ = std::fs::remove_file(record);
    let _ = std::fs::remove_file(config);
}

// A collector that refuses what a running gateway sends: the failed export is logged
// while it runs, at most once a second. Before, the SDK's own warnings compiled to
// nothing, and spans lost between a gateway's start and its exit went unsaid.
#[tokio::test]
async fn a_failed_export_while_the_gateway_runs_is_logged() {
    let refusing = http_service(|_, _, _| (500, b"no".to_vec())).await;
    let record = temp_file("otel-refused");
    let log = temp_file("otel-refused-log");
    let config = config("otel-refused", &record);
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", refusing.as_str()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ("RUST_LOG", "warn"),
        ("OTEL_METRICS_EXPORTER", "none"),
    ];
    let mut gateway = serve(&config, "", &env, Some(&log)).await;
    call_with_trace_context(&gateway.url, "refused", None).await;
    // The SDK's own lines (its targets `opentelemetry_sdk`, `opentelemetry-otlp`).
    let errors = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(" opentelemetry"))
            .count()
    };
    let logged = eventually(Duration::from_secs(15), || errors() > 0).await;
    // A batch refused every tenth of a second for two seconds: each line the SDK logs
    // (two or three of them) at most once a second, not each time.
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(2) {
        call_with_trace_context(&gateway.url, "refused", None).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop_gateway(&mut gateway).await;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(logged, "{text}");
    assert!(errors() <= 12, "{text}");
    for p in [&record, &log, &config] {
        let _ = std::fs::remove_file(p);
    }
}

#[tokio::test]
async fn the_telemetry_table_alone_exports_spans_and_metrics_by_the_conventions() {
    let (endpoint, received) = http_collector().await;
    let record = temp_file("otel-table");
    let config = config("otel-table", &record);
    let mut toml = std::fs::read_to_string(&config).expect("config");
    toml.push_str(&format!(
        "[telemetry]\nendpoint = {endpoint:?}\nservice_name = \"from-the-table\"\nmetrics_interval = \"1h\"\n"
    ));
    std::fs::write(&config, toml).expect("config");
    let command = config.clone();
    // Off the test's thread: the collector runs on it.
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(harness_exe())
            .args(["call", "--config"])
            .arg(&command)
            .args(["s__echo", r#"{"text": "measured"}"#])
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
            .env_remove("OTEL_SERVICE_NAME")
            .output()
            .expect("run")
    })
    .await
    .expect("join");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The interval is an hour: what arrived was sent at exit.
    assert!(
        eventually(Duration::from_secs(10), || received
            .metrics()
            .iter()
            .any(|m| m.name == "mcp.client.operation.duration"))
        .await,
        "metrics arrived: {:?}",
        received
            .metrics()
            .iter()
            .map(|m| &m.name)
            .collect::<Vec<_>>()
    );
    let metrics = received.metrics();
    let duration = metrics
        .iter()
        .find(|m| m.name == "mcp.client.operation.duration")
        .expect("duration");
    assert_eq!(duration.unit, "s");
    let Some(metric::Data::Histogram(h)) = &duration.data else {
        panic!("a histogram: {duration:?}");
    };
    let point = &h.data_points[0];
    assert_eq!(point.count, 1);
    assert_eq!(
        point.explicit_bounds,
        mcp_harness::call::BUCKETS.to_vec(),
        "the harness's buckets"
    );
    let attr = |key: &str| {
        point
            .attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| text(kv.value.as_ref()?.value.as_ref()?))
    };
    assert_eq!(attr("mcp.method.name").as_deref(), Some("tools/call"));
    assert_eq!(attr("mcp_harness.server.id").as_deref(), Some("s"));
    assert_eq!(attr("mcp_harness.outcome").as_deref(), Some("ok"));
    // The conventions' attributes of the server called, as on the call's span.
    assert_eq!(attr("network.transport").as_deref(), Some("pipe"));
    assert_eq!(attr("mcp.protocol.version").as_deref(), Some("2026-07-28"));
    for name in [
        "mcp_harness.calls",
        "mcp_harness.server.restarts",
        "mcp_harness.server.state",
        "mcp_harness.cache.hits",
        "mcp_harness.audit.backlog",
        "mcp_harness.audit.unwritten",
        "mcp_harness.input_rounds",
        "mcp_harness.calls.in_flight",
        "mcp_harness.server.queued",
        "mcp_harness.server.info",
    ] {
        assert!(metrics.iter().any(|m| m.name == name), "{name}");
    }
    // Traces went to the same endpoint, named by the table.
    assert!(received.arrives("tools/call s__echo").await);
    assert!(received.services().iter().any(|s| s == "from-the-table"));
    let _ = std::fs::remove_file(record);
    let _ = std::fs::remove_file(config);
}

#[tokio::test]
async fn grpc_over_tls_trusts_the_ca_named_by_otel_exporter_otlp_certificate() {
    let ca = TestCa::new("otel-tls");
    let (cert, key) = ca.leaf("collector", &["localhost"]);
    let (endpoint, received) = grpc_collector_on(Some(tls_acceptor(&cert, &key))).await;
    let record = temp_file("otel-tls");
    let config = config("otel-tls", &record);
    let run = |ca_var: Option<&'static str>| {
        let (config, endpoint, ca_pem) = (config.clone(), endpoint.clone(), ca.ca_pem.clone());
        // Off the test's thread: the collector runs on it.
        tokio::task::spawn_blocking(move || {
            let mut cmd = std::process::Command::new(harness_exe());
            cmd.args(["call", "--config"])
                .arg(&config)
                .args(["s__echo", r#"{"text": "over tls"}"#])
                .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
                .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
                .env("OTEL_METRICS_EXPORTER", "none");
            cmd.env_remove("OTEL_EXPORTER_OTLP_CERTIFICATE")
                .env_remove("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE");
            if let Some(var) = ca_var {
                cmd.env(var, &ca_pem);
            }
            cmd.output().expect("run")
        })
    };
    // Without the CA the collector is not trusted: the call works, nothing arrives.
    assert!(run(None).await.expect("join").status.success());
    assert!(received.spans().is_empty());
    // The variable of the traces alone, then the one of every signal.
    for var in [
        "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_CERTIFICATE",
    ] {
        let before = received.spans().len();
        assert!(run(Some(var)).await.expect("join").status.success());
        let arrived = eventually(Duration::from_secs(10), || received.spans().len() > before).await;
        assert!(arrived, "spans arrived over TLS trusting the CA of {var}");
    }
    let _ = std::fs::remove_file(record);
    let _ = std::fs::remove_file(config);
}

// A gRPC exporter's CA file is read as an HTTPS server's is: one without a PEM
// certificate (a DER file, say) is reported at start, where before it was taken
// without a word and every export failed; the call goes on without export.
#[tokio::test]
async fn a_grpc_ca_file_without_a_certificate_is_reported() {
    let record = temp_file("otel-bad-ca");
    let config = config("otel-bad-ca", &record);
    let ca = temp_file("otel-bad-ca-pem");
    std::fs::write(&ca, "not a certificate\n").expect("write");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(harness_exe())
            .args(["call", "--config"])
            .arg(&config)
            .args(["s__echo", r#"{"text": "x"}"#])
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", "https://127.0.0.1:9")
            .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
            .env("OTEL_METRICS_EXPORTER", "none")
            .env("OTEL_EXPORTER_OTLP_CERTIFICATE", &ca)
            .output()
            .expect("run")
    })
    .await
    .expect("join");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("holds no PEM certificate"), "{stderr}");
    assert!(out.status.success(), "{stderr}");
    let _ = std::fs::remove_file(record);
}

// OTLP headers (an API key) that would go in clear to another machine are said on
// stderr; over https, or http to this machine, nothing is said.
#[tokio::test]
async fn otlp_headers_in_clear_to_another_machine_are_said() {
    let record = temp_file("otel-clear");
    let config = config("otel-clear", &record);
    let run = |endpoint: &'static str| {
        let config = config.clone();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(harness_exe())
                .args(["call", "--config"])
                .arg(&config)
                .args(["s__echo", r#"{"text": "x"}"#])
                .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
                .env("OTEL_EXPORTER_OTLP_HEADERS", "api-key=secret")
                .env("OTEL_EXPORTER_OTLP_TIMEOUT", "200")
                .env("OTEL_METRICS_EXPORTER", "none")
                .output()
                .expect("run")
        })
    };
    // TEST-NET-1: another machine, which never answers.
    let out = run("http://192.0.2.1:4318").await.expect("join");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("in clear"), "{stderr}");
    assert!(!stderr.contains("secret"), "{stderr}");
    let out = run("http://127.0.0.1:9").await.expect("join");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("in clear"), "{stderr}");
    let _ = std::fs::remove_file(record);
}

/// A collector that takes connections and never answers: its endpoint.
fn silent_collector() -> String {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let endpoint = format!("http://{}", silent.local_addr().expect("addr"));
    std::thread::spawn(move || {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept() {
            held.push(socket);
        }
    });
    endpoint
}

// A collector that takes connections and never answers holds the command's exit up to
// `OTEL_EXPORTER_OTLP_TIMEOUT` per export, not without end (the exporter's own HTTP
// client is built with that timeout).
#[tokio::test]
async fn a_collector_that_never_answers_holds_the_exit_only_as_long_as_the_timeout() {
    let endpoint = silent_collector();
    let record = temp_file("otel-silent");
    let config = config("otel-silent", &record);
    let started = std::time::Instant::now();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(harness_exe())
            .args(["call", "--config"])
            .arg(&config)
            .args(["s__echo", r#"{"text": "traced"}"#])
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
            .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
            .env("OTEL_EXPORTER_OTLP_TIMEOUT", "500")
            .env_remove("OTEL_SDK_DISABLED")
            .env_remove("OTEL_TRACES_SAMPLER")
            .env_remove("OTEL_TRACES_SAMPLER_ARG")
            .output()
            .expect("run mcp-harness call")
    })
    .await
    .expect("join");
    let took = started.elapsed();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("traced"));
    // The call itself takes well under a second; each export gives up after 0.5 s (the
    // default would be 10 s each).
    assert!(took < Duration::from_secs(9), "exited after {took:?}");
    let _ = std::fs::remove_file(record);
}

/// `mcp-harness call` of `config`'s `s__echo`, exporting to a collector that never
/// answers with a minute's export timeout, run until its result is printed.
async fn called_with_a_silent_collector(config: &Path) -> tokio::process::Child {
    use tokio::io::AsyncBufReadExt;
    let endpoint = silent_collector();
    let mut child = tokio::process::Command::new(harness_exe())
        .args(["call", "--config"])
        .arg(config)
        .args(["s__echo", r#"{"text": "traced"}"#])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        .env("OTEL_EXPORTER_OTLP_TIMEOUT", "60000")
        .env_remove("OTEL_SDK_DISABLED")
        .env_remove("OTEL_TRACES_SAMPLER")
        .env_remove("OTEL_TRACES_SAMPLER_ARG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("run mcp-harness call");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut printed = String::new();
    while let Ok(Ok(Some(line))) =
        tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await
    {
        printed.push_str(&line);
        if printed.contains("traced") {
            break;
        }
    }
    assert!(printed.contains("traced"), "{printed}");
    child
}

// A second signal ends the command at once, also with an exporter to flush: the flush
// at exit is not waited for (it held the exit for the export timeout, or a third
// signal, with the servers still running).
#[tokio::test]
async fn a_second_signal_while_the_servers_stop_waits_for_no_export() {
    let record = temp_file("otel-silent-twice");
    let config = config("otel-silent-twice", &record);
    // A server that stops only at SIGKILL, after the stop's grace: the second signal
    // comes while it is being stopped.
    let text = std::fs::read_to_string(&config).expect("config");
    let text = text.replacen("\"--record\"", "\"--ignore-sigterm\", \"--record\"", 1);
    std::fs::write(&config, format!("shutdown_grace = \"30s\"\n{text}")).expect("config");
    let mut child = called_with_a_silent_collector(&config).await;
    let pid = child.id().expect("running") as i32;
    for _ in 0..2 {
        // SAFETY: kill has no preconditions; pid is this test's own child, not reaped.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
    let status = status.expect("ended by the second signal").expect("wait");
    assert_eq!(status.code(), Some(143), "stopped by SIGTERM: {status}");
    let _ = std::fs::remove_file(record);
    let _ = std::fs::remove_file(config);
}

// The flush at exit gives way to a signal: with a collector that never answers and a
// long export timeout, SIGTERM while the last spans wait ends the command (the SDK's
// shutdown held the exit, every signal ignored, for each batch's timeout).
#[tokio::test]
async fn a_signal_ends_the_flush_at_exit() {
    let record = temp_file("otel-silent-signal");
    let config = config("otel-silent-signal", &record);
    let mut child = called_with_a_silent_collector(&config).await;
    // The result is out: the metrics go out, then the servers stop, then the last spans
    // go out. A signal a second, as a person pressing Ctrl-C again would: the first
    // ends the metrics' flush, the next the flush at exit, each long before 60 s.
    let pid = child.id().expect("running") as i32;
    let started = std::time::Instant::now();
    let status = loop {
        // SAFETY: kill has no preconditions; pid is this test's own child, not reaped.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        if let Ok(status) = tokio::time::timeout(Duration::from_secs(1), child.wait()).await {
            break status.expect("wait");
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the flushes did not give way to signals"
        );
    };
    assert_eq!(status.code(), Some(143), "stopped by SIGTERM: {status}");
    let _ = std::fs::remove_file(record);
    let _ = std::fs::remove_file(config);
}
