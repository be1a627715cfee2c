//! The demo server over stdio: one JSON-RPC message per line.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use mcp_harness::protocol::error::PARSE_ERROR;
use mcp_harness::protocol::{Message, RequestId, Response, RpcError};
use parking_lot::Mutex;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use super::core::{Action, Ctx, DemoServer, Out, Peer, ServeEra};

pub async fn serve(server: Arc<DemoServer>, ignore_eof: bool) -> anyhow::Result<()> {
    let (tx, rx) = mpsc::unbounded_channel::<Out>();
    let writer = tokio::spawn(write_loop(rx));
    let pending = Arc::new(Mutex::new(HashMap::new()));
    let peer = Peer::new(tx.clone(), pending.clone());
    let legacy = Arc::new(AtomicBool::new(false));
    let mut stdin = BufReader::new(tokio::io::stdin());
    let mut line = Vec::new();
    let mut read = 0u64;
    loop {
        if server.args.stop_reading_after == Some(read) {
            // A server that stops reading its stdin but lives on, or stalls a while.
            match server.args.resume_reading_after_ms {
                Some(ms) => tokio::time::sleep(std::time::Duration::from_millis(ms)).await,
                None => std::future::pending::<()>().await,
            }
        }
        read += 1;
        line.clear();
        if stdin.read_until(b'\n', &mut line).await? == 0 {
            break;
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match Message::parse(&line) {
            Ok(Message::Request(request)) => {
                if request.method == "initialize" && server.args.era != ServeEra::Modern {
                    legacy.store(true, Ordering::SeqCst);
                }
                let ctx = Ctx {
                    peer: peer.clone(),
                    legacy: legacy.load(Ordering::SeqCst),
                    headers: BTreeMap::new(),
                    broadcast: None,
                };
                server.log(&request, &ctx);
                let (server, tx) = (server.clone(), tx.clone());
                tokio::spawn(async move {
                    let id = request.id.clone();
                    let action = server.handle(request, ctx).await;
                    perform(action, id, &tx);
                });
            }
            Ok(Message::Response(Response {
                id: Some(id),
                outcome,
            })) => Peer::deliver(&pending, &id, outcome),
            Ok(Message::Notification(n)) => {
                if n.method == "notifications/cancelled"
                    && let Some(id) = n.params.as_ref().and_then(|p| p.get("requestId"))
                    && let Ok(id) = serde_json::from_value::<RequestId>(id.clone())
                {
                    server.unlisten(&id);
                }
                server.record(json!({"notification": n.method, "params": n.params}));
            }
            Ok(Message::Response(_)) => {}
            Err(e) => {
                let error = RpcError::new(PARSE_ERROR, e.to_string());
                let _ = tx.send(Out::Message(Message::Response(Response {
                    id: None,
                    outcome: Err(error),
                })));
            }
        }
    }
    if ignore_eof {
        std::future::pending::<()>().await;
    }
    drop(tx);
    drop(peer);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), writer).await;
    std::process::exit(0);
}

fn perform(action: Action, id: RequestId, tx: &mpsc::UnboundedSender<Out>) {
    let respond = |outcome| {
        let _ = tx.send(Out::Message(Message::Response(Response {
            id: Some(id.clone()),
            outcome,
        })));
    };
    match action {
        Action::Reply(outcome) => respond(outcome),
        Action::ExpireSession => respond(Ok(json!({"content": [], "isError": false}))),
        Action::NoReply => {}
        Action::RawLine(text) => {
            let mut bytes = text
                .replace("{id}", &serde_json::to_string(&id).unwrap_or_default())
                .into_bytes();
            bytes.push(b'\n');
            let _ = tx.send(Out::Raw(bytes));
        }
        Action::RawThenExit(text) => {
            use std::io::Write;
            // Straight to fd 1, flushed, so the partial line is out before the exit.
            let text = text.replace("{id}", &serde_json::to_string(&id).unwrap_or_default());
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(text.as_bytes());
            let _ = out.flush();
            std::process::exit(1);
        }
        Action::Garbage => {
            let _ = tx.send(Out::Raw(b"this is {not json\n".to_vec()));
        }
        Action::Oversize(bytes) => {
            let reply = json!({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": "x".repeat(bytes)}]}});
            let mut line = reply.to_string().into_bytes();
            line.push(b'\n');
            let _ = tx.send(Out::Raw(line));
        }
        Action::Exit(code) => std::process::exit(code),
        Action::CloseStdout => {
            let _ = tx.send(Out::CloseStdout);
        }
        Action::HttpStatus(_)
        | Action::Redirect(_)
        | Action::WrongContentType
        | Action::EndlessStream
        | Action::BrokenStream { .. } => {
            respond(Err(RpcError::new(-32000, "this fault exists only on HTTP")));
        }
    }
}

async fn write_loop(mut rx: mpsc::UnboundedReceiver<Out>) {
    let mut stdout = tokio::io::stdout();
    let mut buf = Vec::new();
    while let Some(out) = rx.recv().await {
        let mut next = Some(out);
        while let Some(out) = next.take() {
            match out {
                Out::Message(m) => m.write_line(&mut buf),
                Out::Raw(bytes) => buf.extend_from_slice(&bytes),
                Out::CloseStdout => {
                    let _ = stdout.write_all(&buf).await;
                    let _ = stdout.flush().await;
                    // SAFETY: closes our own fd 1 so the client sees EOF while this
                    // process keeps running (the fault under test); nothing writes to it
                    // afterwards because this loop ends here.
                    unsafe {
                        libc::close(1);
                    }
                    std::future::pending::<()>().await;
                }
            }
            next = rx.try_recv().ok();
        }
        if stdout.write_all(&buf).await.is_err() || stdout.flush().await.is_err() {
            return;
        }
        buf.clear();
    }
}
