//! The Streamable HTTP transport and era detection against real servers on loopback.

mod support;

use std::time::Duration;

use mcp_harness::protocol::meta::KEY_PROTOCOL_VERSION;
use mcp_harness::transport::{
    ConnectError, ConnectOptions, Connection, Era, RequestError, ServerEvent, TransportError,
    TransportSpec,
};
use serde_json::{Value, json};
use support::*;

#[tokio::test]
async fn a_modern_http_server_gets_headers_that_match_every_body() {
    let record = temp_file("http-headers");
    let server = HttpServer::demo(&["gamma", "--record", &record.to_string_lossy()]).await;
    let (conn, _events) = Connection::connect("gamma", server.spec(), options())
        .await
        .expect("connect");
    assert_eq!(conn.era(), Era::Modern);
    let list = conn.request("tools/list", None).await.expect("list");
    let names: Vec<&str> = list["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"echo"));
    assert!(
        !names.contains(&"bad_header"),
        "a tool with an invalid x-mcp-header is dropped"
    );
    let r = conn
        .request("tools/call", call("echo", json!({"text": "über"})))
        .await
        .expect("call");
    assert_eq!(text(&r), "über");
    conn.request(
        "prompts/get",
        Some(json!({"name": "greet", "arguments": {}})),
    )
    .await
    .expect("prompt");
    conn.request("resources/read", Some(json!({"uri": "demo://readme"})))
        .await
        .expect("resource");
    conn.shutdown().await;
    // The server rejects a mismatch with -32020, so success above already says the
    // headers were right; the record shows them.
    let requests = recorded(&record);
    assert_eq!(requests.len(), 5);
    for r in &requests {
        let h = &r["headers"];
        assert_eq!(
            h["mcp-protocol-version"], r["params"]["_meta"][KEY_PROTOCOL_VERSION],
            "{r}"
        );
        assert_eq!(h["mcp-method"], r["method"], "{r}");
        assert!(
            h["accept"]
                .as_str()
                .is_some_and(|a| a.contains("application/json") && a.contains("text/event-stream"))
        );
    }
    let call = requests
        .iter()
        .find(|r| r["method"] == "tools/call")
        .expect("call recorded");
    assert_eq!(call["headers"]["mcp-name"], "echo");
    let read = requests
        .iter()
        .find(|r| r["method"] == "resources/read")
        .expect("read recorded");
    assert_eq!(read["headers"]["mcp-name"], "demo://readme");
    let _ = std::fs::remove_file(record);
}

#[tokio::test]
async fn x_mcp_header_arguments_are_mirrored_with_the_base64_sentinel_when_unsafe() {
    let server = HttpServer::demo(&["gamma"]).await;
    let (conn, _events) = Connection::connect("gamma", server.spec(), options())
        .await
        .expect("connect");
    conn.request("tools/list", None)
        .await
        .expect("list teaches the annotations");
    let r = conn
        .request(
            "tools/call",
            call("region_echo", json!({"region": "eu-west-1"})),
        )
        .await
        .expect("plain");
    assert_eq!(text(&r), "eu-west-1");
    let r = conn
        .request(
            "tools/call",
            call("region_echo", json!({"region": "zürich"})),
        )
        .await
        .expect("unsafe");
    assert_eq!(text(&r), "=?base64?esO8cmljaA==?=");
    conn.shutdown().await;
}

#[tokio::test]
async fn event_stream_replies_deliver_notifications_before_the_result() {
    let server = HttpServer::demo(&["gamma", "--sse"]).await;
    let (conn, mut events) = Connection::connect("gamma", server.spec(), options())
        .await
        .expect("connect");
    let params =
        json!({"name": "progress", "arguments": {"steps": 3}, "_meta": {"progressToken": "p1"}});
    let r = conn
        .request("tools/call", Some(params))
        .await
        .expect("call");
    assert_eq!(text(&r), "3 steps done");
    let mut progress = Vec::new();
    while let Ok(Some(ServerEvent::Notification(n))) =
        tokio::time::timeout(Duration::from_millis(500), events.recv()).await
    {
        progress.push(n.params.expect("params")["progress"].clone());
    }
    assert_eq!(progress, vec![json!(1), json!(2), json!(3)]);
    conn.shutdown().await;
}

/// An error whose id is null, on a request's own event stream, is that request's: a
/// server that could not read the id answers the only request the stream is for.
#[tokio::test]
async fn an_error_without_an_id_on_a_requests_own_stream_fails_it_at_once() {
    let server = HttpServer::demo(&["gamma", "--sse"]).await;
    let (conn, _events) = Connection::connect("gamma", server.spec(), options())
        .await
        .expect("connect");
    // Its deadline is 30 s: the error, not the deadline, ends the call.
    let e = conn
        .request("tools/call", call("null_id_error", json!({})))
        .await
        .expect_err("the server's error");
    match e {
        RequestError::Rpc(e) => assert_eq!(e.message, "could not read the request"),
        other => panic!("expected the server's error, got {other}"),
    }
    // The connection still serves.
    let r = conn
        .request("tools/call", call("echo", json!({"text": "after"})))
        .await
        .expect("call");
    assert_eq!(text(&r), "after");
    conn.shutdown().await;
}

/// How many requests of `method` (an HTTP method or a JSON-RPC one) the demo server
/// recorded in `record`.
fn requests_of(record: &std::path::Path, method: &str) -> usize {
    recorded(&record.to_path_buf())
        .iter()
        .filter(|r| r["method"] == method)
        .count()
}

/// A legacy `delta` demo server over HTTP with `extra` flags (and `--record RECORD`
/// when given), and a connection to it with `opts`.
async fn legacy_delta(
    extra: &[&str],
    record: Option<&std::path::Path>,
    opts: ConnectOptions,
) -> (
    HttpServer,
    Connection,
    tokio::sync::mpsc::Receiver<ServerEvent>,
) {
    let record = record.map(|r| r.to_string_lossy().to_string());
    let mut args = vec!["delta", "--era", "legacy"];
    args.extend_from_slice(extra);
    if let Some(r) = &record {
        args.extend(["--record", r.as_str()]);
    }
    let server = HttpServer::demo(&args).await;
    let (conn, events) = Connection::connect("delta", server.spec(), opts)
        .await
        .expect("connect");
    (server, conn, events)
}

#[tokio::test]
async fn a_legacy_http_session_is_kept_elicited_notified_renewed_and_deleted() {
    let record = temp_file("http-legacy");
    let (_server, conn, mut events) = legacy_delta(&[], Some(&record), options()).await;
    assert_eq!(conn.era(), Era::Legacy);
    // The standalone GET stream is opened after initialize.
    assert!(
        eventually(Duration::from_secs(10), || recorded(&record)
            .iter()
            .any(|r| r["method"] == "GET"))
        .await
    );
    let r = conn
        .request("tools/call", call("echo", json!({"text": "legacy"})))
        .await
        .expect("call");
    assert_eq!(text(&r), "legacy");

    // A server request on the POST's event stream; our answer is POSTed back.
    let call_fut = conn.request("tools/call", call("confirm", json!({"message": "Go?"})));
    let answer = async {
        loop {
            match events.recv().await {
                Some(ServerEvent::Request(req)) => {
                    assert_eq!(req.method, "elicitation/create");
                    req.respond(Ok(json!({"action": "decline"})));
                    return;
                }
                Some(_) => continue,
                None => panic!("events ended"),
            }
        }
    };
    let (r, ()) = tokio::join!(call_fut, answer);
    assert_eq!(text(&r.expect("confirm")), "not approved (decline)");

    // A notification on the standalone GET stream.
    conn.request("tools/call", call("notify_changed", json!({})))
        .await
        .expect("notify");
    let got = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(ServerEvent::Notification(n)) = events.recv().await
                && n.method == "notifications/tools/list_changed"
            {
                return;
            }
        }
    })
    .await;
    assert!(got.is_ok(), "list_changed arrived on the GET stream");

    // The server breaks the call's event stream before answering; the call resumes it
    // with a GET carrying Last-Event-ID after the server's retry delay.
    let r = conn
        .request("tools/call", call("broken_stream", json!({})))
        .await
        .expect("resumed");
    assert_eq!(text(&r), "resumed");

    // A server that closes its stream at will once it sent an event (2025-11-25): the
    // call polls with Last-Event-ID as long as each stream brings something. Before,
    // the fourth close in a call failed it, however much of its deadline was left.
    let r = conn
        .request("tools/call", call("broken_stream", json!({"polls": 3})))
        .await
        .expect("polled to its answer");
    assert_eq!(text(&r), "resumed");

    // The server forgets the session: the next request gets 404, and the connection
    // initializes again and retries.
    conn.request("tools/call", call("expire_session", json!({})))
        .await
        .expect("expire");
    let r = conn
        .request("tools/call", call("echo", json!({"text": "again"})))
        .await
        .expect("after re-initialize");
    assert_eq!(text(&r), "again");

    conn.shutdown().await;
    let requests = recorded(&record);
    let inits = requests
        .iter()
        .filter(|r| r["method"] == "initialize")
        .count();
    assert_eq!(inits, 2, "initialized twice");
    let session_of = |r: &Value| r["headers"]["mcp-session-id"].as_str().map(String::from);
    let calls: Vec<_> = requests
        .iter()
        .filter(|r| r["method"] == "tools/call")
        .collect();
    assert!(
        calls.iter().all(|r| session_of(r).is_some()),
        "every legacy call carries the session"
    );
    assert!(
        calls
            .iter()
            .all(|r| r["headers"]["mcp-protocol-version"] == "2025-11-25")
    );
    assert!(
        requests.iter().any(
            |r| r["method"] == "DELETE" && r["headers"]["mcp-protocol-version"] == "2025-11-25"
        ),
        "the session is deleted on shutdown, with the version every later request carries"
    );
    let _ = std::fs::remove_file(record);
}

/// A server's request that does not parse (here: no `jsonrpc`) but names a method and
/// an id, on a legacy call's event stream, is answered under that id at once: left
/// unanswered, the server would wait for it, and the call with it, until our deadline.
#[tokio::test]
async fn a_servers_malformed_request_on_an_event_stream_is_answered_under_its_id() {
    let (_server, conn, _events) = legacy_delta(&[], None, options()).await;
    let asked = call("ask_many", json!({"n": 2, "malformed": true}));
    let r = tokio::time::timeout(Duration::from_secs(10), conn.request("tools/call", asked))
        .await
        .expect("answered before the deadline")
        .expect("call");
    assert_eq!(text(&r), "answered 0 refused 2 codes [-32600, -32600]");
    conn.shutdown().await;
}

// A legacy session's request its caller stops waiting for (its deadline passed) is
// cancelled with `notifications/cancelled`, as the released revisions ask: there a
// closed stream is no cancellation. A modern server is sent none (the closed stream
// is its cancellation).
#[tokio::test]
async fn a_legacy_http_request_given_up_is_cancelled_on_the_server() {
    let record = temp_file("http-cancel");
    let (_server, conn, _events) = legacy_delta(&[], Some(&record), options()).await;
    let short = Duration::from_millis(300);
    let cut = conn
        .request_with_timeout("tools/call", call("slow", json!({"ms": 5000})), short)
        .await;
    assert!(
        matches!(
            &cut,
            Err(RequestError::Transport(TransportError::Timeout(_)))
        ),
        "{cut:?}"
    );
    let cancelled = |lines: &[Value]| {
        let call = lines.iter().find(|r| r["method"] == "tools/call")?;
        lines
            .iter()
            .find(|c| {
                c["notification"] == "notifications/cancelled"
                    && c["params"]["requestId"] == call["id"]
            })
            .cloned()
    };
    assert!(
        eventually(Duration::from_secs(5), || cancelled(&recorded(&record))
            .is_some())
        .await,
        "no notifications/cancelled for the call"
    );
    conn.shutdown().await;
    // Modern: none.
    let modern = temp_file("http-cancel-modern");
    let server = HttpServer::demo(&["gamma", "--record", &modern.to_string_lossy()]).await;
    let (conn, _events) = Connection::connect("gamma", server.spec(), options())
        .await
        .expect("connect");
    let cut = conn
        .request_with_timeout("tools/call", call("slow", json!({"ms": 2000})), short)
        .await;
    assert!(cut.is_err(), "{cut:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !recorded(&modern)
            .iter()
            .any(|r| r["notification"] == "notifications/cancelled"),
        "a modern server got notifications/cancelled"
    );
    conn.shutdown().await;
}

#[tokio::test]
async fn a_session_renewal_cut_off_by_its_request_finishes_and_the_session_serves() {
    // Renewing the session (every initialize after the first) takes 1.5 s.
    let record = temp_file("http-renewal");
    let (_server, conn, _events) =
        legacy_delta(&["--renewal-delay-ms", "1500"], Some(&record), options()).await;
    conn.request("tools/call", call("expire_session", json!({})))
        .await
        .expect("expire");
    // The next request finds the session gone and starts renewing it, and its own
    // deadline passes long before the server answers.
    let short = Duration::from_millis(300);
    let cut = conn
        .request_with_timeout("tools/call", call("echo", json!({"text": "cut"})), short)
        .await;
    assert!(
        matches!(&cut, Err(RequestError::Transport(TransportError::Timeout(t))) if *t == short),
        "{cut:?}"
    );
    // The renewal went on without it (past the request's deadline): the session
    // serves, and its event stream is open again. (Cut off with its request, the
    // renewal had left the connection with no session at all: every request refused
    // until a restart.)
    let r = conn
        .request("tools/call", call("echo", json!({"text": "again"})))
        .await
        .expect("after the renewal");
    assert_eq!(text(&r), "again");
    let requests = recorded(&record);
    let session_of = |r: &Value| r["headers"]["mcp-session-id"].as_str().map(String::from);
    let last = requests
        .iter()
        .rev()
        .find(|r| r["method"] == "tools/call")
        .and_then(session_of)
        .expect("the last call's session");
    assert!(
        eventually(Duration::from_secs(10), || recorded(&record).iter().any(
            |r| r["method"] == "GET" && session_of(r).as_deref() == Some(&last)
        ))
        .await,
        "the renewed session's event stream"
    );
    let inits: Vec<Value> = recorded(&record)
        .into_iter()
        .filter(|r| r["method"] == "initialize")
        .collect();
    assert_eq!(inits.len(), 2, "one renewal, run to its end: {inits:?}");
    assert!(
        inits.iter().all(|r| session_of(r).is_none()),
        "an initialize carries no session"
    );
    conn.shutdown().await;
    let _ = std::fs::remove_file(record);
}

#[tokio::test]
async fn a_session_renewal_that_runs_out_of_time_ends_the_session_it_began() {
    // A renewal may take as long as one request (3 s here). The server holds the
    // renewed session's `initialized` for 10 s, or never finishes the renewal's
    // `initialize` reply after its headers named the new session.
    for stall in [
        &["--initialized-delay-ms", "10000"][..],
        &["--renewal-reply-stalls"][..],
    ] {
        let record = temp_file("http-renewal-stalled");
        let opts = ConnectOptions {
            request_timeout: Duration::from_secs(3),
            ..options()
        };
        let (_server, conn, _events) = legacy_delta(stall, Some(&record), opts).await;
        conn.request("tools/call", call("expire_session", json!({})))
            .await
            .expect("expire");
        let failed = conn
            .request("tools/call", call("echo", json!({"text": "x"})))
            .await;
        assert!(failed.is_err(), "{stall:?}: {failed:?}");
        let session_of = |r: &Value| r["headers"]["mcp-session-id"].as_str().map(String::from);
        let first = recorded(&record)
            .iter()
            .find(|r| r["method"] == "tools/call")
            .and_then(session_of)
            .expect("the first session");
        let renewed = format!("{}-1", first.strip_suffix("-0").expect("the first is -0"));
        assert!(
            eventually(Duration::from_secs(10), || recorded(&record).iter().any(
                |r| r["method"] == "DELETE" && session_of(r).as_deref() == Some(&renewed)
            ))
            .await,
            "{stall:?}: the session the renewal began is ended, not left to the server: {:?}",
            recorded(&record)
        );
        conn.shutdown().await;
        let _ = std::fs::remove_file(record);
    }
}

#[tokio::test]
async fn a_legacy_handshake_that_fails_after_its_initialize_ends_the_session() {
    // The server answers `initialize` with a version this client does not speak.
    let record = temp_file("http-bad-version");
    let server = HttpServer::demo(&[
        "delta",
        "--era",
        "legacy",
        "--legacy-version",
        "2024-01-01",
        "--record",
        &record.to_string_lossy(),
    ])
    .await;
    let Err(failed) = Connection::connect("delta", server.spec(), options()).await else {
        panic!("a version this client does not speak");
    };
    assert!(
        matches!(failed, ConnectError::UnsupportedLegacyVersion(_)),
        "{failed}"
    );
    assert!(
        eventually(Duration::from_secs(10), || recorded(&record)
            .iter()
            .any(|r| r["method"] == "DELETE"))
        .await,
        "the session it began is ended: {:?}",
        recorded(&record)
    );
    let _ = std::fs::remove_file(record);
}

// A connect given up between `initialize` and `initialized` (its caller's deadline)
// ends the session its `initialize` began. Before, the transport was dropped holding
// it, and the server kept it until its own expiry: one per restart for a server that
// stalls `initialized`.
#[tokio::test]
async fn a_legacy_connect_given_up_after_its_initialize_ends_the_session() {
    let record = temp_file("http-connect-given-up");
    // `initialized` is held 10 s, from the second session on.
    let server = HttpServer::demo(&[
        "delta",
        "--era",
        "legacy",
        "--initialized-delay-ms",
        "10000",
        "--record",
        &record.to_string_lossy(),
    ])
    .await;
    let (first, _events) = Connection::connect("delta", server.spec(), options())
        .await
        .expect("the first session");
    first.shutdown().await;
    let connect = Connection::connect("delta", server.spec(), options());
    let given_up = tokio::time::timeout(Duration::from_secs(2), connect).await;
    assert!(given_up.is_err(), "held at `initialized`");
    let session_of = |r: &Value| r["headers"]["mcp-session-id"].as_str().map(String::from);
    let second = || {
        recorded(&record)
            .iter()
            .filter(|r| r["notification"] == "notifications/initialized")
            .filter_map(session_of)
            .nth(1)
    };
    assert!(
        eventually(Duration::from_secs(10), || second().is_some_and(|sid| {
            recorded(&record)
                .iter()
                .any(|r| r["method"] == "DELETE" && session_of(r).as_deref() == Some(&sid))
        }))
        .await,
        "the second session is ended: {:?}",
        recorded(&record)
    );
    let _ = std::fs::remove_file(record);
}

// A legacy server may ping before it replies to `initialize`, on that reply's event
// stream; the answer goes in the session the reply's headers named (a server that checks
// the id refused an answer without it, and the handshake waited to its timeout).
#[tokio::test]
async fn a_ping_during_a_legacy_http_handshake_is_answered_within_its_session() {
    let record = temp_file("http-ping-init");
    let server = HttpServer::demo(&[
        "delta",
        "--era",
        "legacy",
        "--sse",
        "--ping-before-initialize",
        "--record",
        &record.to_string_lossy(),
    ])
    .await;
    let opts = ConnectOptions {
        request_timeout: Duration::from_secs(5),
        ..options()
    };
    let (conn, _events) = Connection::connect("delta", server.spec(), opts)
        .await
        .expect("connect");
    assert_eq!(conn.era(), Era::Legacy);
    let r = conn
        .request("tools/call", call("add", json!({"a": 2, "b": 40})))
        .await
        .expect("call");
    assert_eq!(text(&r), "42");
    conn.shutdown().await;
    let _ = std::fs::remove_file(record);
}

// A server that pings on the reply to a renewal's `initialize`, and waits for the
// answer before it replies: the answer goes to the session being begun (the expired one
// would refuse it, and the renewal wait out its time). `initialized`, on either
// session, carries the version the server chose.
#[tokio::test]
async fn a_ping_during_a_session_renewal_is_answered_in_the_new_session() {
    let record = temp_file("http-renewal-ping");
    let opts = ConnectOptions {
        request_timeout: Duration::from_secs(5),
        ..options()
    };
    let (_server, conn, _events) =
        legacy_delta(&["--sse", "--ping-before-initialize"], Some(&record), opts).await;
    conn.request("tools/call", call("expire_session", json!({})))
        .await
        .expect("expire");
    let r = conn
        .request("tools/call", call("echo", json!({"text": "renewed"})))
        .await
        .expect("after the renewal");
    assert_eq!(text(&r), "renewed");
    let requests = recorded(&record);
    let inits = requests
        .iter()
        .filter(|r| r["method"] == "initialize")
        .count();
    assert_eq!(inits, 2, "one renewal");
    let initialized: Vec<&Value> = requests
        .iter()
        .filter(|r| r["notification"] == "notifications/initialized")
        .collect();
    assert!(!initialized.is_empty(), "{requests:?}");
    for n in initialized {
        assert!(
            n["headers"]["mcp-protocol-version"].is_string(),
            "initialized without the version: {n}"
        );
    }
    conn.shutdown().await;
    let _ = std::fs::remove_file(record);
}

#[tokio::test]
async fn a_refused_initialize_that_named_a_session_ends_it() {
    let record = temp_file("http-refused-init");
    let server = HttpServer::demo(&[
        "delta",
        "--era",
        "legacy",
        "--refuse-initialize-with-session",
        "--record",
        &record.to_string_lossy(),
    ])
    .await;
    let Err(failed) = Connection::connect("delta", server.spec(), options()).await else {
        panic!("every initialize is refused");
    };
    assert!(failed.to_string().contains("refused"), "{failed}");
    assert!(
        eventually(Duration::from_secs(10), || recorded(&record)
            .iter()
            .any(|r| r["method"] == "DELETE"))
        .await,
        "the session its refusal named is ended: {:?}",
        recorded(&record)
    );
    let _ = std::fs::remove_file(record);
}

// A server that answers the probe 429 (rate-limited) or 408 is not shown to be legacy:
// configured as modern, its start fails and is tried again; before, it was refused for
// good as not modern.
#[tokio::test]
async fn a_probe_answered_429_fails_the_start_healably() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let busy = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 << 10];
                let _ = socket.read(&mut buf).await;
                let _ = socket
                    .write_all(b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .await;
            });
        }
    });
    let opts = ConnectOptions {
        era: mcp_harness::transport::EraPreference::Modern,
        ..options()
    };
    let spec = TransportSpec::http(format!("http://127.0.0.1:{port}/mcp"));
    let failed = Connection::connect("busy", spec, opts)
        .await
        .expect_err("rate-limited");
    assert!(!failed.cannot_heal(), "{failed}");
    assert!(
        matches!(
            failed,
            ConnectError::Transport(TransportError::HttpStatus { status: 429, .. })
        ),
        "{failed}"
    );
    busy.abort();
}

#[tokio::test]
async fn a_failed_connection_says_why_without_the_key_in_its_url() {
    // A port nothing listens on (bound, then let go).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let spec = TransportSpec::http(format!("http://127.0.0.1:{port}/mcp?api_key=hunter2"));
    let Err(failed) = Connection::connect("keyed", spec, options()).await else {
        panic!("nothing listens there");
    };
    let text = failed.to_string();
    assert!(!text.contains("hunter2"), "{text}");
    assert!(
        text.to_lowercase().contains("refused"),
        "the cause is kept: {text}"
    );
}

#[tokio::test]
async fn a_standalone_stream_that_ends_at_once_is_reopened_less_and_less_often() {
    let record = temp_file("http-get-closes");
    let (_server, conn, _events) =
        legacy_delta(&["--close-get-streams"], Some(&record), options()).await;
    let gets = || requests_of(&record, "GET");
    assert!(
        eventually(Duration::from_secs(10), || gets() >= 2).await,
        "the stream is reopened"
    );
    // Waits of 0.5, 1, 2, 4 s…: a handful in 4 s, where every 250 ms would be 16.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let n = gets();
    assert!(n <= 7, "{n} GETs in about 4 s");
    conn.shutdown().await;
    let _ = std::fs::remove_file(record);
}

// A connection dropped without a shutdown (an embedder's `Connection` let go) ends its
// legacy session: before, it was left to the server's expiry, one per connection.
#[tokio::test]
async fn a_connection_dropped_without_a_shutdown_ends_its_session() {
    let record = temp_file("http-dropped");
    let (_server, conn, _events) = legacy_delta(&[], Some(&record), options()).await;
    drop(conn);
    assert!(
        eventually(Duration::from_secs(10), || recorded(&record)
            .iter()
            .any(|r| r["method"] == "DELETE"))
        .await,
        "the session is ended"
    );
    let _ = std::fs::remove_file(record);
}

// A standalone stream whose answer never comes (a server that takes the connection and
// says nothing) is given up at the request timeout and tried again; before, its task
// waited for good, and the session's notifications were lost without a word.
#[tokio::test]
async fn a_standalone_stream_never_answered_is_tried_again() {
    let record = temp_file("http-get-hangs");
    let opts = ConnectOptions {
        request_timeout: Duration::from_millis(500),
        ..options()
    };
    let (_server, conn, _events) = legacy_delta(&["--hang-gets"], Some(&record), opts).await;
    let gets = || requests_of(&record, "GET");
    assert!(
        eventually(Duration::from_secs(10), || gets() >= 2).await,
        "asked again: {} GETs",
        gets()
    );
    conn.shutdown().await;
    let _ = std::fs::remove_file(record);
}

// A standalone stream refused while the server (or a proxy) restarts is tried again;
// it stopped for good at the first 503, and notifications were lost for the session's
// life.
#[tokio::test]
async fn a_standalone_stream_refused_for_a_while_is_opened_again() {
    let record = temp_file("http-get-503");
    let (_server, conn, _events) =
        legacy_delta(&["--sse", "--fail-gets", "2"], Some(&record), options()).await;
    let gets = || requests_of(&record, "GET");
    assert!(
        eventually(Duration::from_secs(15), || gets() >= 3).await,
        "{} GETs",
        gets()
    );
    conn.shutdown().await;
    let _ = std::fs::remove_file(record);
}

#[tokio::test]
async fn a_server_slow_to_take_a_pings_answer_still_gets_its_notifications_through() {
    // The server holds each answer POSTed to it for 20 s.
    let (_server, conn, mut events) =
        legacy_delta(&["--sse", "--hold-answers-ms", "20000"], None, options()).await;
    let conn = std::sync::Arc::new(conn);
    // It pings us, 20 times; our answers are held there (past 16 at once, they are
    // dropped rather than waited for).
    let pinging: Vec<_> = (0..20)
        .map(|_| {
            let conn = conn.clone();
            tokio::spawn(async move {
                conn.request(
                    "tools/call",
                    call("rogue_request", json!({"method": "ping"})),
                )
                .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    conn.request("tools/call", call("notify_changed", json!({})))
        .await
        .expect("notify");
    // The notification comes after the pings: it is not queued behind their answers.
    let got = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match events.recv().await {
                Some(ServerEvent::Notification(n))
                    if n.method == "notifications/tools/list_changed" =>
                {
                    return;
                }
                Some(_) => {}
                None => std::future::pending().await,
            }
        }
    })
    .await;
    assert!(got.is_ok(), "list_changed waited for the pings' answers");
    for p in pinging {
        p.abort();
    }
    conn.shutdown().await;
}

#[tokio::test]
async fn a_legacy_http_server_that_rejects_discover_falls_back() {
    let server = HttpServer::demo(&["delta", "--era", "legacy", "--on-discover", "error"]).await;
    let (conn, _events) = Connection::connect("delta", server.spec(), options())
        .await
        .expect("connect");
    assert_eq!(conn.era(), Era::Legacy);
    conn.shutdown().await;
}

#[tokio::test]
async fn http_faults_are_typed_errors() {
    let server = HttpServer::demo(&["gamma"]).await;
    let opts = ConnectOptions {
        max_message_bytes: 64 * 1024,
        ..options()
    };
    let (conn, _events) = Connection::connect("gamma", server.spec(), opts)
        .await
        .expect("connect");
    let short = Duration::from_millis(400);
    let err = |r: Result<Value, RequestError>| match r {
        Err(RequestError::Transport(e)) => e,
        other => panic!("expected a transport error, got {other:?}"),
    };
    let status = |s: u16| call("http_status", json!({"status": s}));
    assert!(matches!(
        err(conn.request("tools/call", status(503)).await),
        TransportError::HttpStatus { status: 503, .. }
    ));
    // A 401 with no Bearer challenge from a server with no resource metadata does not
    // speak MCP authorization: the refusal itself is the error.
    assert!(matches!(
        err(conn.request("tools/call", status(401)).await),
        TransportError::Unauthorized { status: 401, .. }
    ));
    assert!(matches!(
        err(conn.request("tools/call", status(403)).await),
        TransportError::Unauthorized { status: 403, .. }
    ));
    assert!(matches!(
        err(conn
            .request("tools/call", call("wrong_content_type", json!({})))
            .await),
        TransportError::UnexpectedContentType(_)
    ));
    assert!(matches!(
        err(conn.request("tools/call", call("garbage", json!({}))).await),
        TransportError::Protocol(_)
    ));
    assert_eq!(
        err(conn
            .request("tools/call", call("oversize", json!({"bytes": 200_000})))
            .await),
        TransportError::ResponseTooLarge { limit: 64 * 1024 }
    );
    assert_eq!(
        err(conn
            .request_with_timeout("tools/call", call("hang", json!({})), short)
            .await),
        TransportError::Timeout(short)
    );
    assert_eq!(
        err(conn
            .request_with_timeout("tools/call", call("endless_stream", json!({})), short)
            .await),
        TransportError::Timeout(short)
    );
    // Still serving after all of that.
    assert_eq!(
        text(
            &conn
                .request("tools/call", call("echo", json!({"text": "ok"})))
                .await
                .expect("ok")
        ),
        "ok"
    );
    conn.shutdown().await;
}

#[tokio::test]
async fn a_server_that_is_gone_means_the_request_was_never_sent() {
    let mut server = HttpServer::demo(&["gamma"]).await;
    let (conn, _events) = Connection::connect("gamma", server.spec(), options())
        .await
        .expect("connect");
    server.child.kill().await.expect("kill");
    let e = conn.request("tools/list", None).await.expect_err("gone");
    let RequestError::Transport(e) = e else {
        panic!("{e}")
    };
    assert!(e.never_sent(), "{e}");
}

#[tokio::test]
async fn nobody_listening_at_connect_is_a_transport_error() {
    let err = Connection::connect(
        "nobody",
        TransportSpec::http("http://127.0.0.1:9/mcp"),
        options(),
    )
    .await
    .expect_err("refused");
    assert!(
        matches!(
            err,
            mcp_harness::transport::ConnectError::Transport(TransportError::NotSent(_))
        ),
        "{err}"
    );
}

#[tokio::test]
async fn param_headers_are_learned_even_when_the_caller_never_listed_tools() {
    let server = HttpServer::demo(&["gamma"]).await;
    let (conn, _events) = Connection::connect("gamma", server.spec(), options())
        .await
        .expect("connect");
    // No tools/list by the caller (a harness may have served it from its cache).
    let r = conn
        .request(
            "tools/call",
            call("region_echo", json!({"region": "ap-south-1"})),
        )
        .await
        .expect("call");
    assert_eq!(text(&r), "ap-south-1");
    conn.shutdown().await;
}
