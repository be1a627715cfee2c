//! Interoperability with servers built on the official Rust SDK (rmcp 3.11), over stdio
//! and Streamable HTTP, in both eras.

mod support;

use mcp_harness::transport::{ConnectOptions, Connection, Era, EraPreference, TransportSpec};
use serde_json::{Value, json};
use support::*;

async fn exercise(conn: &Connection) {
    let list = conn.request("tools/list", None).await.expect("tools/list");
    let names: Vec<&str> = list["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(
        names.contains(&"echo") && names.contains(&"add"),
        "{names:?}"
    );
    let r = conn
        .request("tools/call", call("echo", json!({"text": "hi rmcp"})))
        .await
        .expect("echo");
    assert_eq!(text(&r), "hi rmcp");
    let r = conn
        .request("tools/call", call("add", json!({"a": 20, "b": 22})))
        .await
        .expect("add");
    assert_eq!(text(&r), "42");
}

async fn whoami(conn: &Connection) -> Value {
    let r = conn
        .request("tools/call", call("whoami", json!({})))
        .await
        .expect("whoami");
    serde_json::from_str(text(&r)).expect("json")
}

#[tokio::test]
async fn rmcp_over_stdio_is_modern_by_discovery() {
    let spec = TransportSpec::stdio(rmcp_exe(), ["stdio"]);
    let (conn, _events) = Connection::connect("rmcp", spec, options())
        .await
        .expect("connect");
    assert_eq!(conn.era(), Era::Modern);
    assert_eq!(
        conn.profile().server_info().expect("serverInfo")["name"],
        "rmcp-interop"
    );
    exercise(&conn).await;
    let me = whoami(&conn).await;
    assert_eq!(me["protocolVersion"], "2026-07-28");
    assert_eq!(me["perRequestMeta"], true, "rmcp saw our _meta envelope");
    assert_eq!(me["clientInfo"]["name"], "mcp-harness");
    let pid = conn.pid().expect("pid");
    conn.shutdown().await;
    assert!(group_members(pid).is_empty());
}

#[tokio::test]
async fn rmcp_over_stdio_in_the_legacy_era() {
    let spec = TransportSpec::stdio(rmcp_exe(), ["stdio"]);
    let opts = ConnectOptions {
        era: EraPreference::Legacy,
        ..options()
    };
    let (conn, _events) = Connection::connect("rmcp", spec, opts)
        .await
        .expect("connect");
    assert_eq!(conn.era(), Era::Legacy);
    assert_eq!(conn.protocol_version(), "2025-11-25");
    exercise(&conn).await;
    assert_eq!(whoami(&conn).await["perRequestMeta"], false);
    conn.shutdown().await;
}

#[tokio::test]
async fn rmcp_over_http_is_modern_by_discovery() {
    for args in [&["http"][..], &["http", "--json"][..]] {
        let server = HttpServer::start(&rmcp_exe(), args).await;
        let (conn, _events) = Connection::connect("rmcp", server.spec(), options())
            .await
            .expect("connect");
        assert_eq!(conn.era(), Era::Modern, "{args:?}");
        exercise(&conn).await;
        assert_eq!(whoami(&conn).await["perRequestMeta"], true);
        conn.shutdown().await;
    }
}

#[tokio::test]
async fn rmcp_over_http_in_the_legacy_era_keeps_its_session() {
    let server = HttpServer::start(&rmcp_exe(), &["http"]).await;
    let opts = ConnectOptions {
        era: EraPreference::Legacy,
        ..options()
    };
    let (conn, _events) = Connection::connect("rmcp", server.spec(), opts)
        .await
        .expect("connect");
    assert_eq!(conn.era(), Era::Legacy);
    exercise(&conn).await;
    conn.shutdown().await;
}
