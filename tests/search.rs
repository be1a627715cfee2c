//! Tool search: `search_tools` ranks the caller's tools by relevance, never finds one
//! the caller may not call, and follows a server's changed list.

mod support;

use std::time::Duration;

use mcp_harness::permission::Grants;
use mcp_harness::registry::HarnessEvent;
use mcp_harness::{Caller, HarnessConfig};
use serde_json::json;
use support::*;

fn grants() -> Grants {
    serde_json::from_value(json!({
        "a": {"*": ["*"]},
        "b": {"alpha": ["echo", "env"]},
    }))
    .expect("grants")
}

#[tokio::test]
async fn search_ranks_the_callers_tools_and_never_one_it_may_not_call() {
    let h = start_ready(HarnessConfig {
        servers: vec![
            demo_server("alpha", &[]),
            demo_server("beta", &["--era", "legacy"]),
        ],
        permissions: grants(),
        ..HarnessConfig::default()
    })
    .await;
    let a = Caller::agent("a");
    let found = h
        .search_tools(&a, "sum of two integer numbers", 3)
        .await
        .expect("search");
    assert!(found[0].tool.name.as_ref() == "add", "{found:?}");
    assert!(found.len() <= 3 && found.windows(2).all(|w| w[0].score >= w[1].score));
    let found = h
        .search_tools(&a, "what environment variables does the process see", 1)
        .await
        .expect("search");
    assert_eq!(found[0].tool.name.as_ref(), "env", "{found:?}");

    // b may call alpha's echo and env only: nothing else is ever found.
    let b = Caller::agent("b");
    for query in [
        "adds two integers",
        "echo text",
        "environment",
        "crash the server",
    ] {
        let found = h.search_tools(&b, query, 10).await.expect("search");
        for m in &found {
            assert!(
                matches!(&*m.tool.qualified, "alpha__echo" | "alpha__env"),
                "{query}: {}",
                m.tool.qualified
            );
        }
    }
    assert!(
        h.search_tools(&b, "adds two integers", 10)
            .await
            .expect("search")
            .is_empty()
    );
    // An agent with no grants finds nothing; so does an empty or wordless query.
    assert!(
        h.search_tools(&Caller::agent("nobody"), "echo", 5)
            .await
            .expect("search")
            .is_empty()
    );
    assert!(
        h.search_tools(&a, "  ?! ", 5)
            .await
            .expect("search")
            .is_empty()
    );
    h.shutdown().await;
}

#[tokio::test]
async fn the_index_follows_a_servers_changed_list() {
    let h = start_ready(HarnessConfig {
        servers: vec![demo_server("alpha", &[])],
        permissions: grants(),
        ..HarnessConfig::default()
    })
    .await;
    let a = Caller::agent("a");
    let before = h.search_tools(&a, "grown", 5).await.expect("search");
    assert!(
        before.iter().all(|m| !m.tool.name.starts_with("grown_")),
        "{before:?}"
    );
    let mut events = h.subscribe();
    h.call_tool(&a, "alpha__grow", json!({}))
        .await
        .expect("grow");
    let heard = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Ok(HarnessEvent::ToolsChanged { .. }) = events.recv().await {
                return;
            }
        }
    })
    .await;
    assert!(heard.is_ok(), "ToolsChanged");
    let after = h.search_tools(&a, "grown", 5).await.expect("search");
    assert_eq!(
        after[0].tool.qualified.as_ref(),
        "alpha__grown_0",
        "{after:?}"
    );
    h.shutdown().await;
}
