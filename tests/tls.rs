//! HTTPS to remote servers: real TLS over loopback with a CA made in the test. A server
//! signed by a configured `ca_file` (or `--ca-file`, or `SSL_CERT_FILE`) is reached; an
//! untrusted certificate or one for another name fails the server at once with a typed
//! error that says which.

mod support;

use std::process::Command;
use std::time::Duration;

use mcp_harness::transport::{TlsFailure, TransportError};
use mcp_harness::{Caller, Harness, HarnessConfig, ServerConfig, ServerState, TransportSpec};
use serde_json::json;
use support::*;

fn https(id: &str, url: &str, ca: Option<&std::path::Path>) -> ServerConfig {
    let mut c = ServerConfig::http(id, url);
    if let TransportSpec::Http(h) = &mut c.transport {
        h.ca_file = ca.map(Into::into);
    }
    c
}

fn config(servers: Vec<ServerConfig>) -> HarnessConfig {
    HarnessConfig {
        servers,
        permissions: grant_everything(&["a"]),
        ..HarnessConfig::default()
    }
}

#[tokio::test]
async fn item_14_an_https_server_signed_by_the_configured_ca_file_is_reached() {
    let ca = TestCa::new("trusted");
    let (cert, key) = ca.leaf("server", &["127.0.0.1", "localhost"]);
    let server = HttpServer::demo_tls(&["secure"], &cert, &key).await;
    assert!(server.url.starts_with("https://"));
    let h = start_ready(config(vec![https("secure", &server.url, Some(&ca.ca_pem))])).await;
    let r = h
        .call_tool(
            &Caller::agent("a"),
            "secure__echo",
            json!({"text": "over TLS"}),
        )
        .await
        .expect("call");
    assert_eq!(text(&r), "over TLS");
    h.shutdown().await;
}

/// The TLS error a server failed with.
async fn tls_failure(url: &str, ca: Option<&std::path::Path>) -> (TlsFailure, ServerState, u32) {
    let h = Harness::spawn(config(vec![https("s", url, ca)]))
        .await
        .expect("spawn");
    assert!(
        eventually(Duration::from_secs(5), || h
            .server_status("s")
            .is_some_and(|s| s.state == ServerState::Failed))
        .await,
        "failed at once: {:?}",
        h.server_status("s")
    );
    let status = h.server_status("s").expect("status");
    let err = h
        .request("s", "tools/list", None)
        .await
        .expect_err("failed");
    h.shutdown().await;
    let reason = status.last_error.unwrap_or_default();
    let kind = if reason.contains("not trusted") {
        TlsFailure::UntrustedCertificate
    } else if reason.contains("host name") {
        TlsFailure::NameMismatch
    } else {
        panic!("not a typed TLS failure: {reason} / {err}")
    };
    (kind, status.state, status.restarts)
}

#[tokio::test]
async fn item_14_an_untrusted_certificate_fails_the_server_at_once_naming_the_cause() {
    let ca = TestCa::new("untrusted");
    let (cert, key) = ca.leaf("server", &["127.0.0.1"]);
    let server = HttpServer::demo_tls(&["secure"], &cert, &key).await;
    let (kind, state, restarts) = tls_failure(&server.url, None).await;
    assert_eq!(
        (kind, state, restarts),
        (TlsFailure::UntrustedCertificate, ServerState::Failed, 0)
    );
}

#[tokio::test]
async fn item_14_a_certificate_for_another_name_is_a_name_mismatch() {
    let ca = TestCa::new("mismatch");
    let (cert, key) = ca.leaf("server", &["example.com"]);
    let server = HttpServer::demo_tls(&["secure"], &cert, &key).await;
    let (kind, _, restarts) = tls_failure(&server.url, Some(&ca.ca_pem)).await;
    assert_eq!((kind, restarts), (TlsFailure::NameMismatch, 0));
}

#[tokio::test]
async fn item_14_a_tls_error_on_a_request_is_typed() {
    // The transport's own error, not just the status text.
    let ca = TestCa::new("typed");
    let (cert, key) = ca.leaf("server", &["127.0.0.1"]);
    let server = HttpServer::demo_tls(&["secure"], &cert, &key).await;
    let conn = mcp_harness::transport::Connection::connect(
        "s",
        TransportSpec::http(&server.url),
        options(),
    )
    .await;
    match conn {
        Err(mcp_harness::transport::ConnectError::Transport(TransportError::Tls {
            kind, ..
        })) => {
            assert_eq!(kind, TlsFailure::UntrustedCertificate)
        }
        other => panic!("expected a TLS error, got {:?}", other.map(|_| ())),
    }
}

fn cli(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut c = Command::new(harness_exe());
    c.args(args).env("RUST_LOG", "error");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run the CLI")
}

#[tokio::test]
async fn item_14_the_cli_trusts_a_ca_file_for_ad_hoc_servers_or_ssl_cert_file() {
    let ca = TestCa::new("cli");
    let (cert, key) = ca.leaf("server", &["127.0.0.1"]);
    let server = HttpServer::demo_tls(&["secure"], &cert, &key).await;
    let ca_path = ca.ca_pem.to_string_lossy().to_string();
    let with_flag = cli(
        &[
            "call",
            "--http",
            &server.url,
            "--ca-file",
            &ca_path,
            "echo",
            r#"{"text":"hi"}"#,
        ],
        &[],
    );
    assert!(
        with_flag.status.success(),
        "{}",
        String::from_utf8_lossy(&with_flag.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&with_flag.stdout).trim(), "hi");
    let with_env = cli(
        &["call", "--http", &server.url, "echo", r#"{"text":"env"}"#],
        &[("SSL_CERT_FILE", &ca_path)],
    );
    assert!(
        with_env.status.success(),
        "{}",
        String::from_utf8_lossy(&with_env.stderr)
    );
    let untrusted = cli(
        &["call", "--http", &server.url, "echo", r#"{"text":"x"}"#],
        &[],
    );
    assert_eq!(untrusted.status.code(), Some(3));
    let err = String::from_utf8_lossy(&untrusted.stderr);
    assert!(
        err.contains("http1 failed") && err.contains("not trusted"),
        "{err}"
    );
}
