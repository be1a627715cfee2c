//! The harness's logs: a span per server (id, era, pid) around its events, restart and
//! failure events with their delay and reason, a server's stderr under its own target,
//! a span per call, and an event per audit record. One test sets the global subscriber
//! (a process has one); the other sets its thread's own, on a single-threaded runtime.

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mcp_harness::{Caller, Harness, HarnessConfig, RestartConfig, ServerConfig, ServerState};
use serde_json::json;
use support::*;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn server_events_carry_a_span_with_id_era_and_pid() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("mcp_harness=info")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::set_global_default(subscriber)
        .expect("the only subscriber of this test binary");

    let mut crashy = ServerConfig::stdio(
        "crashy",
        harness_exe(),
        ["demo-server", "crashy", "--crash-on-start"],
    );
    crashy.restart = RestartConfig {
        min_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(10),
        max_restarts: 1,
        ..RestartConfig::default()
    };
    // Its last stderr line has no newline: it says why it exited.
    let mut tail = ServerConfig::stdio("tail", "sh", ["-c", "printf 'fatal: boom' >&2; exit 1"]);
    tail.restart = crashy.restart.clone();
    let mut config = HarnessConfig {
        servers: vec![
            tail,
            ServerConfig::stdio("alpha", harness_exe(), ["demo-server", "alpha"]),
            ServerConfig::stdio(
                "broken",
                harness_exe(),
                ["demo-server", "broken", "--list-input-required"],
            ),
            crashy,
        ],
        ..HarnessConfig::default()
    };
    config
        .permissions
        .entry("a".into())
        .or_default()
        .insert("*".into(), vec!["*".into()]);
    let h = Harness::spawn(config).await.expect("spawn");
    assert!(
        eventually(Duration::from_secs(30), || h
            .server_status("alpha")
            .is_some_and(|s| s.state == ServerState::Ready))
        .await
    );
    assert!(
        eventually(Duration::from_secs(30), || h
            .server_status("crashy")
            .is_some_and(|s| s.state == ServerState::Failed))
        .await
    );
    assert!(
        eventually(Duration::from_secs(30), || h
            .server_status("tail")
            .is_some_and(|s| s.state == ServerState::Failed))
        .await
    );
    let pid = h.server_status("alpha").and_then(|s| s.pid).expect("pid");
    h.call_tool(&Caller::agent("a"), "alpha__echo", json!({"text": "x"}))
        .await
        .expect("call");
    // A bare name lists every server; `broken`'s list fails inside the call's span.
    h.call_tool(&Caller::agent("a"), "echo", json!({"text": "x"}))
        .await
        .expect("call");
    h.shutdown().await;

    let logs = String::from_utf8(captured.0.lock().expect("lock").clone()).expect("utf-8");
    let ready = logs
        .lines()
        .find(|l| l.contains("server ready") && l.contains("server=alpha"))
        .expect("a ready event");
    assert!(ready.contains("server{id=alpha"), "{ready}");
    let stopped = logs
        .lines()
        .find(|l| l.contains("server stopped") && l.contains("id=alpha"))
        .expect("a stopped event");
    assert!(
        stopped.contains(&format!("pid={pid}")) && stopped.contains("era=\"modern\"")
            || stopped.contains("era=modern"),
        "{stopped}"
    );
    assert!(
        logs.lines()
            .any(|l| l.contains("mcp_harness::audit") && l.contains("\"event\":\"finished\"")),
        "{logs}"
    );
    // Crashy's (tail restarts and fails too).
    let line = |needle: &str| {
        logs.lines()
            .find(|l| l.contains(needle) && !l.contains("server=tail"))
            .unwrap_or_else(|| panic!("no {needle:?} event in {logs}"))
            .to_string()
    };
    let restart = line("restarting after backoff");
    assert!(
        restart.contains("server{id=crashy") && restart.contains("delay="),
        "{restart}"
    );
    let failed = line("server failed; not restarting");
    assert!(failed.contains("reason="), "{failed}");
    let stderr = line("crashing on start as asked");
    assert!(
        stderr.contains("mcp_harness::server_stderr") && stderr.contains("server=crashy"),
        "{stderr}"
    );
    let last = logs
        .lines()
        .find(|l| l.contains("fatal: boom"))
        .unwrap_or_else(|| panic!("tail's last stderr line in {logs}"));
    assert!(
        last.contains("mcp_harness::server_stderr") && last.contains("server=tail"),
        "{last}"
    );
    let in_call = line("could not list");
    assert!(in_call.contains("call{call_id="), "{in_call}");
}

// An untraced call passes on the context it was made under, marked not sampled: not
// the span its future happens to be polled in (an embedder's other work, of another
// trace), which its own disabled spans do not hide. A traced call's requests carry its
// own attempt's context, in the trace it was made under.
#[cfg(feature = "otlp")]
#[tokio::test(flavor = "current_thread")]
async fn an_untraced_call_passes_on_the_context_it_was_made_under() {
    use mcp_harness::{CallKind, CallOptions};
    use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
    use tracing::Instrument;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;

    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
    let otel = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("test"))
        .with_filter(
            mcp_harness::util::trace_context::export_filter()
                .with_target("tracing_spans", tracing::Level::INFO),
        );
    let _default = tracing::subscriber::set_default(tracing_subscriber::registry().with(otel));

    let record = temp_file("traced-untraced");
    let mut config = HarnessConfig {
        servers: vec![ServerConfig::stdio(
            "s",
            harness_exe(),
            ["demo-server", "s", "--record", &record.to_string_lossy()],
        )],
        ..HarnessConfig::default()
    };
    config
        .permissions
        .entry("a".into())
        .or_default()
        .insert("*".into(), vec!["*".into()]);
    let h = Harness::spawn(config).await.expect("spawn");
    let caller = Caller::agent("a");
    let made_under = tracing::info_span!(target: "tracing_spans", "made under");
    let poller = tracing::info_span!(target: "tracing_spans", "poller");
    let (under, polled) = (
        made_under.context().span().span_context().clone(),
        poller.context().span().span_context().clone(),
    );
    assert!(under.is_sampled() && polled.is_sampled());
    assert_ne!(under.trace_id(), polled.trace_id());
    let sent = |text: &str| {
        recorded(&record)
            .into_iter()
            .find(|r| r["method"] == "tools/call" && r["params"]["arguments"]["text"] == text)
            .map(|r| r["params"]["_meta"]["traceparent"].clone())
            .unwrap_or_else(|| panic!("the call {text} was recorded"))
    };

    for (text, traced) in [("untraced", Some(false)), ("traced", None)] {
        let options = CallOptions {
            traced,
            ..CallOptions::default()
        };
        let call = made_under.in_scope(|| {
            h.call(
                &caller,
                CallKind::Tool,
                "s__echo",
                json!({"text": text}),
                options,
            )
        });
        call.instrument(poller.clone()).await.expect("call");
    }
    h.shutdown().await;

    assert_eq!(
        sent("untraced"),
        format!("00-{}-{}-00", under.trace_id(), under.span_id()),
        "the span it was made under, marked not sampled"
    );
    let traced = sent("traced");
    let traced = traced.as_str().expect("a traceparent");
    assert!(
        traced.starts_with(&format!("00-{}-", under.trace_id())) && traced.ends_with("-01"),
        "{traced}"
    );
    assert!(
        !traced.contains(&under.span_id().to_string()),
        "its own attempt's: {traced}"
    );
    let _ = std::fs::remove_file(record);
}
