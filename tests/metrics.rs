//! Metrics: the snapshot an embedder reads (`HarnessHandle::metrics`), and the same as
//! Prometheus text, parsed back: durations by server, method and outcome, rounds,
//! restarts and state per server, cache hits per layer, the audit backlog.

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use mcp_harness::{Caller, FixedAnswers, Harness, HarnessConfig, ServerState};
use serde_json::json;
use support::*;

/// `name{labels}` → value, for every sample line; and the `# TYPE` of each family.
pub fn parse_prometheus(text: &str) -> (HashMap<String, f64>, HashMap<String, String>) {
    let mut samples = HashMap::new();
    let mut types = HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split(' ');
            let (name, kind) = (parts.next().expect("name"), parts.next().expect("kind"));
            types.insert(name.to_string(), kind.to_string());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("a sample line");
        let value: f64 = value.parse().expect("a number");
        assert!(
            samples.insert(series.to_string(), value).is_none(),
            "{series} twice"
        );
    }
    (samples, types)
}

#[tokio::test]
async fn the_snapshot_counts_calls_rounds_restarts_and_cache_and_prometheus_says_the_same() {
    let mut server = demo_server("s", &[]);
    server.restart = mcp_harness::RestartConfig::default();
    let config = HarnessConfig {
        servers: vec![server],
        permissions: grant_everything(&["a"]),
        ..HarnessConfig::default()
    };
    let h = Harness::builder(config)
        .input_handler(
            "elicitation/create",
            Arc::new(FixedAnswers::new(
                json!({"action": "accept", "content": {"approved": true}}),
            )),
        )
        .spawn()
        .await
        .expect("spawn");
    wait_state(&h, "s", ServerState::Ready).await;
    let a = Caller::agent("a");
    for _ in 0..3 {
        h.call_tool(&a, "s__echo", json!({"text": "x"}))
            .await
            .expect("echo");
    }
    h.call_tool(&a, "s__confirm", json!({"message": "ok?"}))
        .await
        .expect("confirm");
    h.list_tools(&a).await.expect("list");
    h.list_tools(&a).await.expect("list");
    // Two kinds of error on one server: a deadline, and the server gone.
    let late = h
        .call(
            &a,
            mcp_harness::CallKind::Tool,
            "s__slow",
            json!({"ms": 2000}),
            mcp_harness::CallOptions {
                timeout: Some(Duration::from_millis(100)),
                ..Default::default()
            },
        )
        .await;
    assert!(late.is_err());
    let crashed = h.call_tool(&a, "s__crash", json!({})).await;
    assert!(crashed.is_err());
    assert!(
        eventually(Duration::from_secs(10), || h
            .metrics()
            .servers
            .iter()
            .any(|s| s.restarts >= 1))
        .await,
        "the crash counted as a restart"
    );

    let m = h.metrics();
    assert_eq!(m.calls_with("ok"), 4, "{:?}", m.calls);
    assert_eq!(m.calls_with("error"), 2);
    assert_eq!(m.input_rounds, 1);
    assert_eq!(m.in_flight, 0);
    let ok = m
        .calls
        .iter()
        .find(|s| &*s.server == "s" && s.outcome == "ok")
        .expect("ok series");
    assert_eq!((ok.method, ok.count), ("tools/call", 4));
    assert_eq!(ok.buckets.iter().sum::<u64>(), 4);
    assert!(ok.sum > 0.0 && ok.p50().is_some());
    let failed = m
        .calls
        .iter()
        .find(|s| s.outcome == "error")
        .expect("error");
    assert!(failed.error_type.is_some());
    assert!(m.cache.l1.hits >= 1, "the second listing came from memory");

    let (samples, types) = parse_prometheus(&m.prometheus());
    assert_eq!(types["mcp_client_operation_duration_seconds"], "histogram");
    assert_eq!(types["mcp_harness_calls_total"], "counter");
    assert_eq!(types["mcp_harness_server_state"], "gauge");
    let labels = r#"mcp_harness_server_id="s",mcp_method_name="tools/call",outcome="ok""#;
    assert_eq!(
        samples[&format!("mcp_client_operation_duration_seconds_count{{{labels}}}")],
        4.0
    );
    assert_eq!(
        samples[&format!("mcp_client_operation_duration_seconds_bucket{{{labels},le=\"+Inf\"}}")],
        4.0
    );
    let buckets: Vec<f64> = mcp_harness::call::BUCKETS
        .iter()
        .map(|b| {
            samples[&format!("mcp_client_operation_duration_seconds_bucket{{{labels},le=\"{b}\"}}")]
        })
        .collect();
    assert!(
        buckets.windows(2).all(|w| w[0] <= w[1]),
        "cumulative: {buckets:?}"
    );
    assert_eq!(
        samples[&format!("mcp_harness_calls_total{{{labels}}}")],
        4.0
    );
    assert_eq!(samples["mcp_harness_input_rounds_total"], 1.0);
    assert!(samples[r#"mcp_harness_server_restarts_total{mcp_harness_server_id="s"}"#] >= 1.0);
    let states: f64 = ["starting", "ready", "restarting", "failed", "stopped"]
        .iter()
        .map(|st| {
            samples
                [&format!("mcp_harness_server_state{{mcp_harness_server_id=\"s\",state=\"{st}\"}}")]
        })
        .sum();
    assert_eq!(states, 1.0, "one state at a time");
    assert!(samples[r#"mcp_harness_cache_hits_total{layer="memory"}"#] >= 1.0);
    assert_eq!(samples["mcp_harness_audit_backlog"], 0.0);
    // A call that reaches no server is counted without a server label.
    let unknown = h.call_tool(&a, "nowhere__x", json!({})).await;
    assert!(unknown.is_err());
    let (samples, _) = parse_prometheus(&h.metrics().prometheus());
    let unrouted: Vec<&String> = samples
        .keys()
        .filter(|k| k.starts_with("mcp_harness_calls_total") && !k.contains("server_id"))
        .collect();
    assert_eq!(unrouted.len(), 1, "{unrouted:?}");
    assert!(unrouted[0].contains(r#"outcome="error""#), "{unrouted:?}");
    h.shutdown().await;
}

// A metric's `error.type` is the span's: a JSON-RPC error's code, `tool_error` for a
// result with isError. Before, every server error was `rpc_error` and a tool error had
// none.
#[tokio::test]
async fn a_calls_error_type_on_the_metric_is_the_code_or_tool_error() {
    let h = start_ready(HarnessConfig {
        servers: vec![demo_server("s", &[])],
        permissions: grant_everything(&["a"]),
        ..HarnessConfig::default()
    })
    .await;
    let a = Caller::agent("a");
    let r = h
        .call_tool(&a, "s__add", json!({"a": "x"}))
        .await
        .expect("a tool error is a result");
    assert_eq!(r["isError"], true);
    let missing = h
        .call(
            &a,
            mcp_harness::CallKind::Resource,
            "demo://no-such-thing",
            json!({}),
            mcp_harness::CallOptions::default(),
        )
        .await;
    assert!(missing.is_err());
    let m = h.metrics();
    let error_type = |method: &str| {
        m.calls
            .iter()
            .find(|s| s.method == method && s.outcome != "ok")
            .and_then(|s| s.error_type)
    };
    assert_eq!(
        error_type("tools/call"),
        Some("tool_error"),
        "{:?}",
        m.calls
    );
    assert_eq!(
        error_type("resources/read"),
        Some("-32602"),
        "{:?}",
        m.calls
    );
    h.shutdown().await;
}
