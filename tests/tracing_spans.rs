//! The harness's logs: a span per server (id, era, pid) around its events, and an event
//! per audit record.

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mcp_harness::{Caller, Harness, HarnessConfig, ServerConfig, ServerState};
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

    let mut config = HarnessConfig {
        servers: vec![ServerConfig::stdio(
            "alpha",
            harness_exe(),
            ["demo-server", "alpha"],
        )],
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
    let pid = h.server_status("alpha").and_then(|s| s.pid).expect("pid");
    h.call_tool(&Caller::agent("a"), "alpha__echo", json!({"text": "x"}))
        .await
        .expect("call");
    h.shutdown().await;

    let logs = String::from_utf8(captured.0.lock().expect("lock").clone()).expect("utf-8");
    let ready = logs
        .lines()
        .find(|l| l.contains("server ready"))
        .expect("a ready event");
    assert!(ready.contains("server{id=alpha"), "{ready}");
    let stopped = logs
        .lines()
        .find(|l| l.contains("server stopped"))
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
}
