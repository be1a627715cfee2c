//! OpenTelemetry export for the command line: the harness's spans and metrics over
//! OTLP, HTTP/protobuf by default or gRPC, when the standard `OTEL_*` variables or the
//! config file's `[telemetry]` table name an endpoint. Off otherwise, and off when
//! `OTEL_SDK_DISABLED=true`; `OTEL_TRACES_EXPORTER=none` / `OTEL_METRICS_EXPORTER=none`
//! (or `traces = false` / `metrics = false`) turn one signal off. An `OTEL_*` variable
//! that is set wins over the table. The exporters are the `opentelemetry-otlp` crate's;
//! they read the headers and timeout variables themselves.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::Context;
use mcp_harness::util::invalid::Invalid;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::metrics::periodic_reader_with_async_runtime::PeriodicReader;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use serde::Deserialize;

/// The `[telemetry]` table of a config file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The collector's base URL (`OTEL_EXPORTER_OTLP_ENDPOINT`): `http://host:4318` for
    /// HTTP, `http://host:4317` for gRPC.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// `http/protobuf` (default) or `grpc` (`OTEL_EXPORTER_OTLP_PROTOCOL`).
    #[serde(default)]
    pub protocol: Option<String>,
    /// `service.name` (`OTEL_SERVICE_NAME`; default `mcp-harness`).
    #[serde(default)]
    pub service_name: Option<String>,
    /// Export spans (default true when an endpoint is set).
    #[serde(default)]
    pub traces: Option<bool>,
    /// Export metrics (default true when an endpoint is set).
    #[serde(default)]
    pub metrics: Option<bool>,
    /// A PEM bundle of CAs trusted for an `https` endpoint besides the platform's roots
    /// (`OTEL_EXPORTER_OTLP_CERTIFICATE`).
    #[serde(default)]
    pub ca_file: Option<std::path::PathBuf>,
    /// How often metrics are sent (`OTEL_METRIC_EXPORT_INTERVAL`; default 60 s).
    #[serde(default, with = "mcp_harness::util::duration::option")]
    pub metrics_interval: Option<Duration>,
}

impl TelemetryConfig {
    /// Reads the table (absent: all defaults).
    pub fn from_value(value: Option<&serde_json::Value>) -> anyhow::Result<TelemetryConfig> {
        match value {
            None => Ok(TelemetryConfig::default()),
            Some(v) => serde_path_to_error::deserialize(v.clone())
                .map_err(|e| Invalid::in_table("telemetry", e).into()),
        }
    }
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// What `OTEL_{SIGNAL}_EXPORTER` asks for: on (`otlp` among its names), off (`none`),
/// or nothing (unset, or only exporters this program does not have: said, and left to
/// the table).
fn exporter_asked(upper: &str) -> Option<bool> {
    let name = format!("OTEL_{upper}_EXPORTER");
    let value = var(&name)?;
    let names: Vec<String> = value
        .split(',')
        .map(|n| n.trim().to_ascii_lowercase())
        .collect();
    if names.iter().any(|n| n == "otlp") {
        return Some(true);
    }
    if names.iter().all(|n| n == "none") {
        return Some(false);
    }
    errln!(
        "mcp-harness: {name}={} names no exporter this program has (otlp or none); ignored",
        crate::terminal::line_cut(&value, 100)
    );
    None
}

/// One signal's exporter settings, the environment first.
struct Signal {
    /// Set only from the table: the exporter reads the variables itself.
    endpoint: Option<String>,
    protocol: String,
    /// The CAs trusted besides the platform's.
    ca_file: Option<std::path::PathBuf>,
    /// Whether the endpoint (the variable's or the table's) is `https`.
    https: bool,
    /// That endpoint, when it parses: one on this machine is sent to through no proxy.
    url: Option<url::Url>,
    /// How long one export may take (`OTEL_EXPORTER_OTLP_[SIGNAL_]TIMEOUT`, in ms;
    /// 10 s by default, as the specification says).
    timeout: Duration,
}

impl Signal {
    /// An HTTP client trusting the platform's roots and `ca_file`, as the harness's own.
    fn http_client(&self) -> anyhow::Result<reqwest::Client> {
        let tls = mcp_harness::transport::tls_client_config(self.ca_file.as_deref())
            .map_err(|e| anyhow::anyhow!(e))?;
        // The exporter applies the timeout variable only to a client it builds itself:
        // without one here, a collector that never answers would hold each export
        // (and the exit that flushes them) for the SDK's own limit.
        self.url
            .as_ref()
            .map_or_else(
                reqwest::Client::builder,
                mcp_harness::transport::client_builder,
            )
            .tls_backend_preconfigured(tls)
            .timeout(self.timeout)
            // A 3xx is a failed export: followed, it would carry the batch and the
            // `OTEL_EXPORTER_OTLP_HEADERS` (an API key, which reqwest strips only under
            // the names it knows) to another host, perhaps in clear.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .context("OTLP HTTP client")
    }

    /// TLS for a gRPC endpoint: the platform's roots and `ca_file`.
    fn grpc_tls(
        &self,
    ) -> anyhow::Result<opentelemetry_otlp::tonic_types::transport::ClientTlsConfig> {
        use opentelemetry_otlp::tonic_types::transport::{Certificate, ClientTlsConfig};
        let mut tls = ClientTlsConfig::new().with_native_roots();
        if let Some(path) = &self.ca_file {
            // Read as an HTTPS server's ca_file is (a regular file, at most 16 MiB, PEM
            // certificates in it), as the HTTP exporter's is: a FIFO or /dev/zero would
            // hang or fill memory at start, and a DER file fail every export unsaid.
            let pem =
                mcp_harness::transport::ca_file_pem(path).map_err(|e| anyhow::anyhow!("{e}"))?;
            tls = tls.ca_certificate(Certificate::from_pem(pem));
        }
        Ok(tls)
    }
}

fn signal(config: &TelemetryConfig, name: &str, enabled: Option<bool>) -> Option<Signal> {
    let upper = name.to_ascii_uppercase();
    // A variable that is set wins over the table, either way.
    let asked = exporter_asked(&upper);
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || asked == Some(false)
        || (enabled == Some(false) && asked != Some(true))
    {
        return None;
    }
    let from_env = var("OTEL_EXPORTER_OTLP_ENDPOINT").is_some()
        || var(&format!("OTEL_EXPORTER_OTLP_{upper}_ENDPOINT")).is_some();
    let protocol = var(&format!("OTEL_EXPORTER_OTLP_{upper}_PROTOCOL"))
        .or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .or_else(|| config.protocol.clone())
        .unwrap_or_else(|| "http/protobuf".into());
    let endpoint = match (&config.endpoint, from_env) {
        (_, true) => None,
        (Some(base), false) => Some(match protocol.as_str() {
            // As the variable does: the signal's path is added for HTTP.
            "http/protobuf" => format!("{}/v1/{name}", base.trim_end_matches('/')),
            _ => base.clone(),
        }),
        (None, false) => return None,
    };
    let named = var(&format!("OTEL_EXPORTER_OTLP_{upper}_ENDPOINT"))
        .or_else(|| var("OTEL_EXPORTER_OTLP_ENDPOINT"))
        .or_else(|| config.endpoint.clone());
    let https = named
        .as_deref()
        .is_some_and(|e| e.trim_start().to_ascii_lowercase().starts_with("https://"));
    let url = named.and_then(|e| url::Url::parse(e.trim()).ok());
    // Headers (an API key, as collectors take) in clear to another machine: said, not
    // refused (collectors inside a cluster are often plain http).
    let headers = var(&format!("OTEL_EXPORTER_OTLP_{upper}_HEADERS"))
        .or_else(|| var("OTEL_EXPORTER_OTLP_HEADERS"))
        .is_some_and(|h| !h.trim().is_empty());
    if headers
        && let Some(url) = &url
        && url.scheme() == "http"
        && !mcp_harness::transport::auth::is_loopback(url)
    {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            errln!("mcp-harness: the OTLP headers (an API key?) go in clear over http to another machine; an https endpoint keeps them private");
        });
    }
    let ca_file = var(&format!("OTEL_EXPORTER_OTLP_{upper}_CERTIFICATE"))
        .or_else(|| var("OTEL_EXPORTER_OTLP_CERTIFICATE"))
        .map(std::path::PathBuf::from)
        .or_else(|| config.ca_file.clone());
    let timeout = export_timeout(
        var(&format!("OTEL_EXPORTER_OTLP_{upper}_TIMEOUT"))
            .or_else(|| var("OTEL_EXPORTER_OTLP_TIMEOUT")),
    );
    EXIT_FLUSH_MS.fetch_max(
        u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        std::sync::atomic::Ordering::Relaxed,
    );
    Some(Signal {
        endpoint,
        protocol,
        ca_file,
        https,
        url,
        timeout,
    })
}

/// An export's time limit from the variable (ms): 10 s if unset, not a number or zero.
fn export_timeout(variable: Option<String>) -> Duration {
    variable
        .and_then(|ms| ms.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map_or(Duration::from_secs(10), Duration::from_millis)
}

fn resource(config: &TelemetryConfig) -> opentelemetry_sdk::Resource {
    let mut resource = opentelemetry_sdk::Resource::builder();
    let named = var("OTEL_SERVICE_NAME").is_some()
        || var("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| {
            a.split(',')
                .any(|kv| kv.trim_start().starts_with("service.name="))
        });
    if !named {
        resource = resource.with_service_name(
            config
                .service_name
                .clone()
                .unwrap_or_else(|| "mcp-harness".into()),
        );
    }
    resource.build()
}

/// The share of new traces kept that `OTEL_TRACES_SAMPLER` (with `OTEL_TRACES_SAMPLER_ARG`)
/// asks for, when it is set and understood. The harness decides at each trace's root
/// (its `trace_sample_ratio`) and the SDK's sampler behind it is parent-based always-on,
/// so that a call that is not kept builds no span; `traceidratio` is read as its
/// parent-based form (a call under a caller's trace follows it), and `always_off` turns
/// trace export off ([`traces_off`]). An unknown sampler, or a ratio that is not a number from 0 to 1, is reported and
/// ignored: the file's ratio stays.
pub fn sample_ratio() -> Option<f64> {
    let sampler = var("OTEL_TRACES_SAMPLER")?;
    match sampler.trim() {
        "always_on" | "parentbased_always_on" => Some(1.0),
        "always_off" | "parentbased_always_off" => Some(0.0),
        "traceidratio" | "parentbased_traceidratio" => {
            match var("OTEL_TRACES_SAMPLER_ARG").map(|a| a.trim().parse::<f64>()) {
                None => Some(1.0),
                Some(Ok(r)) if (0.0..=1.0).contains(&r) => Some(r),
                Some(_) => {
                    warn_once("OTEL_TRACES_SAMPLER_ARG is not a ratio from 0 to 1; ignored");
                    None
                }
            }
        }
        other => {
            warn_once(&format!(
                "OTEL_TRACES_SAMPLER={:?} is not supported (always_on, always_off, traceidratio and their parentbased_ forms); ignored",
                mcp_harness::util::text::one_line(other, 64)
            ));
            None
        }
    }
}

/// Whether `OTEL_TRACES_SAMPLER=always_off` asks for no trace at all (its parent-based
/// form, and a ratio of 0, still follow a caller's sampled trace).
pub fn traces_off() -> bool {
    var("OTEL_TRACES_SAMPLER").is_some_and(|s| s.trim() == "always_off")
}

/// Says `what` on stderr the first time only (the variables are read at start and at
/// each reload).
fn warn_once(what: &str) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| errln!("mcp-harness: {what}"));
}

fn unsupported(protocol: &str) -> anyhow::Error {
    anyhow::anyhow!("OTLP protocol {protocol:?} is not supported (grpc or http/protobuf)")
}

/// The OTLP exporter of `$kind` (`SpanExporter`, `MetricExporter`) signal `$s` asks
/// for: one macro, as the two builders share their methods but not a type.
macro_rules! otlp_exporter {
    ($kind:ident, $s:expr, $what:literal) => {{
        let s = &$s;
        match s.protocol.as_str() {
            "grpc" => {
                use opentelemetry_otlp::WithTonicConfig;
                let mut b = opentelemetry_otlp::$kind::builder()
                    .with_tonic()
                    // The harness's reading of the timeout variables, not the SDK's own
                    // (which takes `0` for no time at all: every export failed at once).
                    .with_timeout(s.timeout);
                if s.https {
                    b = b.with_tls_config(s.grpc_tls()?);
                }
                if let Some(e) = s.endpoint.clone() {
                    b = b.with_endpoint(e);
                }
                b.build()
                    .context(concat!("OTLP/gRPC ", $what, " exporter"))?
            }
            "http/protobuf" => {
                use opentelemetry_otlp::WithHttpConfig;
                let mut b = opentelemetry_otlp::$kind::builder()
                    .with_http()
                    .with_http_client(s.http_client()?)
                    .with_protocol(Protocol::HttpBinary)
                    .with_timeout(s.timeout);
                if let Some(e) = s.endpoint.clone() {
                    b = b.with_endpoint(e);
                }
                b.build()
                    .context(concat!("OTLP/HTTP ", $what, " exporter"))?
            }
            other => return Err(unsupported(other)),
        }
    }};
}

/// The tracer provider the settings ask for, if any. Call within the runtime: the
/// batch processor runs on it.
pub fn tracer(config: &TelemetryConfig) -> anyhow::Result<Option<SdkTracerProvider>> {
    let Some(s) = signal(config, "traces", config.traces) else {
        return Ok(None);
    };
    let exporter = otlp_exporter!(SpanExporter, s, "span");
    let processor =
        BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).build();
    Ok(Some(
        SdkTracerProvider::builder()
            .with_span_processor(processor)
            // The harness decides at the root (see `sample_ratio`).
            .with_sampler(opentelemetry_sdk::trace::Sampler::ParentBased(Box::new(
                opentelemetry_sdk::trace::Sampler::AlwaysOn,
            )))
            .with_resource(resource(config))
            .build(),
    ))
}

/// The meter provider the settings ask for, if any (call within the runtime), kept for
/// [`export_metrics`] and [`shutdown_metrics`].
pub fn meter(config: &TelemetryConfig) -> anyhow::Result<()> {
    let Some(s) = signal(config, "metrics", config.metrics) else {
        return Ok(());
    };
    let exporter = otlp_exporter!(MetricExporter, s, "metric");
    let interval = export_interval(var("OTEL_METRIC_EXPORT_INTERVAL"), config.metrics_interval);
    let reader = PeriodicReader::builder(exporter, opentelemetry_sdk::runtime::Tokio)
        .with_interval(interval)
        .build();
    let provider = SdkMeterProvider::builder()
        .with_reader(reader)
        .with_resource(resource(config))
        .build();
    let _ = METERS.set(provider);
    Ok(())
}

/// How often metrics are exported: `OTEL_METRIC_EXPORT_INTERVAL` (ms), else the
/// config's, else 60 s; never zero. The SDK reads the variable itself too and takes 0
/// as it is (exports without a pause between them), but ignores a zero given to
/// `with_interval`: the non-zero one given is what it uses.
fn export_interval(variable: Option<String>, configured: Option<Duration>) -> Duration {
    variable
        .and_then(|ms| ms.parse::<u64>().ok())
        .map(Duration::from_millis)
        .filter(|d| !d.is_zero())
        .or(configured.filter(|d| !d.is_zero()))
        .unwrap_or(Duration::from_secs(60))
}

static METERS: OnceLock<SdkMeterProvider> = OnceLock::new();

/// Exports `harness`'s metrics through the meter provider, when there is one.
pub fn export_metrics(harness: &mcp_harness::HarnessHandle) {
    if let Some(p) = METERS.get() {
        harness.export_metrics(&p.meter("mcp-harness"));
    }
}

/// Sends the metrics now, while the harness they observe still runs (call before its
/// shutdown: once it is gone, its instruments report nothing).
pub async fn flush_metrics() {
    if let Some(p) = METERS.get() {
        // The flush waits for the export; off the async threads.
        let flushed = tokio::task::spawn_blocking(|| p.force_flush()).await;
        if let Ok(Err(e)) = flushed {
            errln!(
                "mcp-harness: exporting metrics: {}",
                crate::terminal::sanitize(&e.to_string(), true)
            );
        }
    }
}

/// The longest export time of the signals exported (ms): what the flush at exit may
/// take, all batches together.
static EXIT_FLUSH_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How long the exit waits for the last spans and metrics to go out: one export's time
/// limit, whatever number of batches remains (the SDK's shutdown sends them one after
/// another, each within the limit, and a collector that takes them slowly would hold
/// the exit, and the servers' end, for minutes).
pub fn exit_flush_limit() -> Duration {
    Duration::from_millis(EXIT_FLUSH_MS.load(std::sync::atomic::Ordering::Relaxed))
}

/// Sends the last metrics and stops the meter provider.
pub fn shutdown_metrics() {
    if let Some(p) = METERS.get()
        && let Err(e) = p.shutdown()
    {
        errln!(
            "mcp-harness: exporting metrics: {}",
            crate::terminal::sanitize(&e.to_string(), true)
        );
    }
}

/// The `tracing` layer that turns the harness's spans into OpenTelemetry spans.
pub fn layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    mcp_harness::util::trace_context::layer(provider.tracer("mcp-harness"))
}

/// The log's filter of the OpenTelemetry SDK's own events ([`sdk_log_budget`]), asked
/// at each of those alone: every other callsite is passed once and for all, and the
/// filter sets no level of its own (the log's stays the environment filter's).
pub fn sdk_log_filter<S>() -> impl tracing_subscriber::layer::Filter<S> {
    use tracing::subscriber::Interest;
    tracing_subscriber::filter::dynamic_filter_fn(|m, _| sdk_log_budget(m))
        .with_max_level_hint(tracing_subscriber::filter::LevelFilter::TRACE)
        .with_callsite_filter(|m| {
            if m.is_event() && m.target().starts_with("opentelemetry") {
                Interest::sometimes()
            } else {
                Interest::always()
            }
        })
}

/// Whether an event may be logged: each of the OpenTelemetry SDK's own (a failed
/// export, one per batch of spans while a collector refuses them) at most once a
/// second; anything else always.
pub fn sdk_log_budget(metadata: &tracing::Metadata<'_>) -> bool {
    static LAST: std::sync::LazyLock<
        parking_lot::Mutex<std::collections::HashMap<tracing::callsite::Identifier, Instant>>,
    > = std::sync::LazyLock::new(Default::default);
    if !metadata.is_event() || !metadata.target().starts_with("opentelemetry") {
        return true;
    }
    // Its debug events name the endpoint's whole URL (an `api_key` in its query) and
    // quote the collector's answers, which may echo the exporter's headers.
    if *metadata.level() > tracing::Level::INFO {
        return false;
    }
    let now = Instant::now();
    // One entry per place in the SDK that logs: a few dozen at most.
    let mut last = LAST.lock();
    match last.get(&metadata.callsite()) {
        Some(at) if now.duration_since(*at) < Duration::from_secs(1) => false,
        _ => {
            last.insert(metadata.callsite(), now);
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{export_interval, export_timeout};
    use std::time::Duration;

    #[test]
    fn an_export_takes_at_most_the_timeout_variable_else_ten_seconds() {
        assert_eq!(export_timeout(None), Duration::from_secs(10));
        assert_eq!(
            export_timeout(Some("250".into())),
            Duration::from_millis(250)
        );
        assert_eq!(export_timeout(Some("0".into())), Duration::from_secs(10));
        assert_eq!(export_timeout(Some("soon".into())), Duration::from_secs(10));
    }

    // The SDK's own events are logged once a second each at most, and never below
    // `info`: its debug events name the endpoint's URL and quote the collector.
    #[test]
    fn the_sdks_own_events_below_info_are_never_logged() {
        use std::sync::Arc;
        use tracing_subscriber::Layer;
        use tracing_subscriber::layer::SubscriberExt;
        let out = Arc::new(parking_lot::Mutex::new(Vec::<u8>::new()));
        let writer = {
            let out = out.clone();
            move || Shared(out.clone())
        };
        let layer = tracing_subscriber::fmt::layer()
            .with_writer(writer)
            .with_ansi(false)
            .with_filter(super::sdk_log_filter());
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            tracing::debug!(target: "opentelemetry_otlp", url = "http://c/?api_key=SECRET", "HttpClient.NetworkError");
            tracing::trace!(target: "opentelemetry_sdk", body = "SECRET", "trace");
            for _ in 0..2 {
                tracing::warn!(target: "opentelemetry_sdk", "export failed");
            }
        });
        let text = String::from_utf8_lossy(&out.lock()).into_owned();
        assert!(!text.contains("SECRET"), "{text}");
        assert_eq!(
            text.matches("export failed").count(),
            1,
            "once a second: {text}"
        );
    }

    /// A log writer into a shared buffer.
    struct Shared(std::sync::Arc<parking_lot::Mutex<Vec<u8>>>);

    impl std::io::Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    // Zero, from the variable or the config, is no interval: the SDK would export
    // without a pause.
    #[test]
    fn the_metric_export_interval_is_never_zero() {
        let s = Duration::from_secs;
        assert_eq!(export_interval(Some("0".into()), None), s(60));
        assert_eq!(export_interval(Some("0".into()), Some(s(5))), s(5));
        assert_eq!(export_interval(None, Some(s(0))), s(60));
        assert_eq!(
            export_interval(Some("2500".into()), Some(s(5))),
            Duration::from_millis(2500)
        );
        assert_eq!(export_interval(Some("soon".into()), None), s(60));
    }
}
