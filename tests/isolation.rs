//! Authorization as a property: for random sequences of callers and tools through a
//! real harness and a real server, a denied caller never reaches the server, and an
//! allowed one always does. (Cache isolation and freshness are a property test next to
//! the cache, in `src/registry/cache.rs`.)

mod support;

use std::time::Duration;

use mcp_harness::{CallError, Caller, Harness, HarnessConfig, ServerConfig, ServerState};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::json;
use support::*;

const TOOLS: [&str; 3] = ["echo", "add", "server_name"];

/// The policy under test, written as a model: a → everything; b → echo on s;
/// c → server_name on servers tagged core; anyone else, and anonymous callers, nothing.
fn model_allows(agent: Option<&str>, tool: &str) -> bool {
    match agent {
        Some("a") => true,
        Some("b") => tool == "echo",
        Some("c") => tool == "server_name",
        _ => false,
    }
}

#[test]
fn a_denied_caller_never_reaches_a_server() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let record = temp_file("isolation");
    let mut server = ServerConfig::stdio(
        "s",
        harness_exe(),
        ["demo-server", "s", "--record", &record.to_string_lossy()],
    );
    server.tags = vec!["core".into()];
    let mut config = HarnessConfig {
        servers: vec![server],
        ..HarnessConfig::default()
    };
    config
        .permissions
        .entry("a".into())
        .or_default()
        .insert("*".into(), vec!["*".into()]);
    config
        .permissions
        .entry("b".into())
        .or_default()
        .insert("s".into(), vec!["echo".into()]);
    config
        .permissions
        .entry("c".into())
        .or_default()
        .insert("tag:core".into(), vec!["server_name".into()]);
    let h = rt.block_on(async {
        let h = Harness::spawn(config).await.expect("spawn");
        assert!(
            eventually(Duration::from_secs(30), || h
                .server_status("s")
                .is_some_and(|s| s.state == ServerState::Ready))
            .await
        );
        h
    });
    let calls_seen = || {
        recorded(&record)
            .iter()
            .filter(|r| r["method"] == "tools/call")
            .count()
    };
    let agent = prop_oneof![
        Just(Some("a")),
        Just(Some("b")),
        Just(Some("c")),
        Just(Some("z")),
        Just(None)
    ];
    let call = (
        agent,
        0usize..3,
        any::<bool>(),
        proptest::option::of("[a-z]{1,8}"),
    );
    let mut runner = TestRunner::new(Config {
        cases: 32,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&proptest::collection::vec(call, 1..6), |calls| {
            rt.block_on(async {
                for (agent, tool, qualified, ctx) in calls {
                    let tool = TOOLS[tool];
                    let caller = Caller {
                        agent_id: agent.map(String::from),
                        auth_context: ctx,
                    };
                    let name = if qualified {
                        format!("s__{tool}")
                    } else {
                        tool.to_string()
                    };
                    let before = calls_seen();
                    let result = h
                        .call_tool(&caller, &name, json!({"text": "t", "a": 1, "b": 2}))
                        .await;
                    let after = calls_seen();
                    if model_allows(agent, tool) {
                        prop_assert!(result.is_ok(), "{agent:?} {name}: {result:?}");
                        prop_assert_eq!(after, before + 1);
                    } else {
                        prop_assert!(
                            matches!(result, Err(CallError::Denied { .. })),
                            "{agent:?} {name}: {result:?}"
                        );
                        prop_assert_eq!(after, before, "a denied call reached the server");
                    }
                }
                Ok(())
            })
        })
        .expect("property holds");
    rt.block_on(h.shutdown());
    let _ = std::fs::remove_file(record);
}
