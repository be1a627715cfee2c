//! The stdio transport: one server process, newline-delimited JSON-RPC on its pipes.
//!
//! Ownership: the transport owns the process group ([`process`]); a writer task owns
//! stdin, a reader task owns stdout, a logger task owns stderr. Many requests share the
//! pipe and are matched by id in a pending map. The writer drains everything queued and
//! flushes once, so a burst of requests costs one syscall.
//!
//! Lifecycle and failure: the reader ends the transport on EOF, on a read error, or on a
//! line longer than the limit (the only way to keep memory bounded without losing track
//! of which request the line belonged to). Ending fails every pending request at once
//! with that [`TransportError`] and reports it on the inbound channel. A line that is
//! not JSON-RPC is logged and skipped: servers that print stray text to stdout are
//! common, and the request it might have answered still ends at its deadline.
//! A request whose deadline passes, or whose future is dropped, is removed and a
//! `notifications/cancelled` goes to the server.
//!
//! Spec: section G (stdio) of `../shared/spec/mcp-2026-07-28.md`.

mod process;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::{mpsc, oneshot};

use super::Inbound;
use super::error::TransportError;
use crate::protocol::{Message, Notification, Request, RequestId, Response, RpcError};
use process::ProcessGroup;

/// What a stdio server is: a command, its arguments, environment and directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StdioSpec {
    /// The program to run (looked up in `PATH`).
    pub command: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Variables added to the harness's own environment.
    pub env: BTreeMap<String, String>,
    /// Working directory; the harness's own when `None`.
    pub cwd: Option<PathBuf>,
}

type Reply = Result<Value, RpcError>;
type Waiter = oneshot::Sender<Result<Reply, TransportError>>;

/// State the reader and the callers share.
struct Shared {
    server: String,
    pending: Mutex<HashMap<RequestId, Waiter>>,
    /// Set once, when the transport ends; later requests fail with it.
    closed: Mutex<Option<TransportError>>,
    /// The process group, and whether it may still be signalled (see [`Shared::sweep`]).
    pgid: u32,
    armed: Arc<AtomicBool>,
}

impl Shared {
    /// Kills what is left of the group once its leader has been reaped, then never
    /// again: after that its id may belong to someone else.
    fn sweep(&self) {
        if self.armed.swap(false, Ordering::SeqCst) {
            process::kill_group(self.pgid);
        }
    }
    fn close(&self, error: TransportError) {
        let mut closed = self.closed.lock();
        if closed.is_some() {
            return;
        }
        *closed = Some(error.clone());
        drop(closed);
        let waiters: Vec<Waiter> = self.pending.lock().drain().map(|(_, w)| w).collect();
        for w in waiters {
            let _ = w.send(Err(error.clone()));
        }
    }
}

enum WriterCmd {
    Line(Vec<u8>),
    Close,
}

/// A connected stdio server.
pub struct StdioTransport {
    shared: Arc<Shared>,
    writer: mpsc::UnboundedSender<WriterCmd>,
    group: tokio::sync::Mutex<ProcessGroup>,
    pid: u32,
}

impl StdioTransport {
    /// Spawns the server and starts its reader, writer and stderr tasks. Incoming
    /// requests and notifications, and the transport's end, go to `inbound`.
    pub(crate) fn spawn(
        server: &str,
        spec: &StdioSpec,
        max_line: usize,
        inbound: mpsc::Sender<Inbound>,
    ) -> Result<StdioTransport, TransportError> {
        let spawned = ProcessGroup::spawn(&spec.command, &spec.args, &spec.env, spec.cwd.as_ref())?;
        let pid = spawned.group.pid();
        let shared = Arc::new(Shared {
            server: server.to_string(),
            pending: Mutex::new(HashMap::new()),
            closed: Mutex::new(None),
            pgid: pid,
            armed: spawned.group.armed(),
        });
        let (writer, rx) = mpsc::unbounded_channel();
        let span = tracing::info_span!("stdio", server = %server, pid);
        tokio::spawn(tracing::Instrument::instrument(
            write_loop(spawned.stdin, rx),
            span.clone(),
        ));
        tokio::spawn(tracing::Instrument::instrument(
            read_loop(
                shared.clone(),
                spawned.stdout,
                max_line,
                inbound,
                spawned.group.exit_watch(),
            ),
            span.clone(),
        ));
        tokio::spawn(tracing::Instrument::instrument(
            log_stderr(server.to_string(), spawned.stderr),
            span,
        ));
        tokio::spawn(watch_leader(shared.clone(), spawned.group.exit_watch()));
        tracing::debug!(server, pid, command = %spec.command, "spawned stdio server");
        Ok(StdioTransport {
            shared,
            writer,
            group: tokio::sync::Mutex::new(spawned.group),
            pid,
        })
    }

    /// The server process's pid (and process group id).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the transport has ended.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.lock().is_some()
    }

    /// Sends a request and waits up to `timeout` for its response.
    ///
    /// # Cancel safety
    /// Dropping the future removes the request and tells the server it was cancelled.
    pub(crate) async fn request(
        &self,
        request: &Request,
        timeout: Duration,
    ) -> Result<Reply, TransportError> {
        let (tx, rx) = oneshot::channel();
        let id = request.id.clone();
        {
            // Checked under the pending lock, so `close` cannot miss this waiter.
            let closed = self.shared.closed.lock();
            if let Some(e) = closed.as_ref() {
                return Err(TransportError::NotSent(e.to_string()));
            }
            self.shared.pending.lock().insert(id.clone(), tx);
        }
        let mut in_flight = InFlight {
            transport: self,
            id: Some(id),
        };
        let mut line = Vec::with_capacity(256);
        Message::write_request_line(request, &mut line);
        if self.writer.send(WriterCmd::Line(line)).is_err() {
            in_flight.id = None;
            return Err(TransportError::NotSent("stdin is closed".into()));
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(reply)) => {
                in_flight.id = None;
                reply
            }
            Ok(Err(_)) => {
                in_flight.id = None;
                Err(self.closed_error())
            }
            Err(_) => {
                in_flight.cancel("timeout");
                Err(TransportError::Timeout(timeout))
            }
        }
    }

    /// Sends a notification.
    pub(crate) fn notify(&self, notification: Notification) -> Result<(), TransportError> {
        self.send_message(Message::Notification(notification))
    }

    /// Answers a request the server sent (legacy era only).
    pub(crate) fn respond(&self, id: RequestId, outcome: Reply) -> Result<(), TransportError> {
        self.send_message(Message::Response(Response {
            id: Some(id),
            outcome,
        }))
    }

    fn send_message(&self, message: Message) -> Result<(), TransportError> {
        if let Some(e) = self.shared.closed.lock().as_ref() {
            return Err(TransportError::NotSent(e.to_string()));
        }
        let mut line = Vec::with_capacity(128);
        message.write_line(&mut line);
        self.writer
            .send(WriterCmd::Line(line))
            .map_err(|_| TransportError::NotSent("stdin is closed".into()))
    }

    fn closed_error(&self) -> TransportError {
        self.shared
            .closed
            .lock()
            .clone()
            .unwrap_or(TransportError::Closed { exit: None })
    }

    /// Stops the server: close stdin, wait `grace`, SIGTERM the group, wait `grace`,
    /// SIGKILL, reap. Pending requests fail with [`TransportError::Closed`].
    pub(crate) async fn shutdown(&self, grace: Duration) {
        let _ = self.writer.send(WriterCmd::Close);
        let exit = self.group.lock().await.terminate(grace).await;
        self.shared.close(TransportError::Closed { exit });
    }

    /// SIGKILLs the server's process group now (fault injection, forced stop).
    pub fn kill(&self) {
        if self.shared.armed.load(Ordering::SeqCst) {
            process::kill_group(self.pid);
        }
    }
}

/// A request between being written and being answered; dropping it cancels it.
struct InFlight<'a> {
    transport: &'a StdioTransport,
    id: Option<RequestId>,
}

impl InFlight<'_> {
    fn cancel(&mut self, reason: &str) {
        let Some(id) = self.id.take() else { return };
        if self.transport.shared.pending.lock().remove(&id).is_some() {
            let _ = self.transport.notify(Notification {
                method: "notifications/cancelled".into(),
                params: Some(json!({ "requestId": id, "reason": reason })),
            });
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.cancel("cancelled by the client");
    }
}

async fn write_loop(mut stdin: ChildStdin, mut rx: mpsc::UnboundedReceiver<WriterCmd>) {
    let mut buf = Vec::with_capacity(8192);
    'outer: while let Some(cmd) = rx.recv().await {
        let mut close = false;
        match cmd {
            WriterCmd::Line(line) => buf.extend_from_slice(&line),
            WriterCmd::Close => close = true,
        }
        // Take whatever else is queued so the burst goes out in one write.
        while !close && buf.len() < 1 << 20 {
            match rx.try_recv() {
                Ok(WriterCmd::Line(line)) => buf.extend_from_slice(&line),
                Ok(WriterCmd::Close) => close = true,
                Err(_) => break,
            }
        }
        if !buf.is_empty() {
            if let Err(e) = stdin.write_all(&buf).await {
                tracing::debug!(error = %e, "stdin write failed; the reader will report the end");
                break 'outer;
            }
            if stdin.flush().await.is_err() {
                break 'outer;
            }
            buf.clear();
        }
        if close {
            break;
        }
    }
    // Dropping stdin closes the pipe: the server sees EOF.
}

/// Reads one line into `line` (without the newline). `Ok(false)` at EOF with nothing
/// read. A line longer than `max` is an error, and no more than `max` bytes are held.
async fn read_line_bounded<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    line: &mut Vec<u8>,
    max: usize,
) -> Result<bool, TransportError> {
    line.clear();
    loop {
        let available = reader
            .fill_buf()
            .await
            .map_err(|e| TransportError::Closed {
                exit: Some(format!("read failed: {e}")),
            })?;
        if available.is_empty() {
            // EOF: a partial last line is not a message.
            return Ok(false);
        }
        match available.iter().position(|b| *b == b'\n') {
            Some(n) => {
                if line.len() + n > max {
                    return Err(TransportError::LineTooLong { limit: max });
                }
                line.extend_from_slice(&available[..n]);
                reader.consume(n + 1);
                return Ok(true);
            }
            None => {
                let n = available.len();
                if line.len() + n > max {
                    return Err(TransportError::LineTooLong { limit: max });
                }
                line.extend_from_slice(available);
                reader.consume(n);
            }
        }
    }
}

async fn read_loop(
    shared: Arc<Shared>,
    stdout: ChildStdout,
    max_line: usize,
    inbound: mpsc::Sender<Inbound>,
    mut exit: tokio::sync::watch::Receiver<Option<String>>,
) {
    let mut reader = BufReader::with_capacity(64 * 1024, stdout);
    let mut line = Vec::with_capacity(4096);
    let end = loop {
        match read_line_bounded(&mut reader, &mut line, max_line).await {
            Ok(true) => {}
            Ok(false) => {
                // EOF usually means the process is exiting: requests in flight fail
                // after a moment that lets the error say how it ended. The restart
                // policy reads the status too (a clean exit is not a crash), so it gets
                // a little longer; not much, as a server that closed stdout but lives on
                // is restarted after this.
                let _ = tokio::time::timeout(
                    Duration::from_millis(100),
                    exit.wait_for(Option::is_some),
                )
                .await;
                shared.close(TransportError::Closed {
                    exit: exit.borrow().clone(),
                });
                let _ = tokio::time::timeout(
                    Duration::from_millis(200),
                    exit.wait_for(Option::is_some),
                )
                .await;
                let status = exit.borrow().clone();
                if status.is_some() {
                    // The leader is reaped: take any descendants with it, while the id is ours.
                    shared.sweep();
                }
                break TransportError::Closed { exit: status };
            }
            Err(e) => break e,
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match Message::parse(&line) {
            Ok(Message::Response(response)) => route_response(&shared, response),
            Ok(Message::Request(request)) => {
                if inbound.send(Inbound::Request(request)).await.is_err() {
                    tracing::debug!("inbound request dropped: nobody listens");
                }
            }
            Ok(Message::Notification(n)) => {
                // Never wait on a full channel here: replies behind it would stall (nobody
                // drains it during the handshake).
                if inbound.try_send(Inbound::Notification(n)).is_err() {
                    tracing::debug!(server = %shared.server, "server notification dropped: channel full");
                }
            }
            Err(e) => {
                let sample = String::from_utf8_lossy(&line[..line.len().min(200)]).into_owned();
                tracing::warn!(server = %shared.server, error = %e, line = %sample, "skipping a line that is not JSON-RPC");
            }
        }
    };
    tracing::debug!(server = %shared.server, reason = %end, "stdio transport ended");
    shared.close(end.clone());
    let _ = inbound.send(Inbound::Closed(end)).await;
}

fn route_response(shared: &Shared, response: Response) {
    let Some(id) = response.id else {
        if let Err(e) = response.outcome {
            tracing::warn!(server = %shared.server, error = %e, "server sent an error about an unparseable request");
        }
        return;
    };
    let waiter = shared.pending.lock().remove(&id);
    match waiter {
        Some(w) => {
            let _ = w.send(Ok(response.outcome));
        }
        // A late answer to a cancelled request, a duplicate, or an id never sent.
        None => tracing::warn!(server = %shared.server, %id, "response with an unknown id ignored"),
    }
}

async fn log_stderr(server: String, stderr: tokio::process::ChildStderr) {
    let mut reader = BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        match read_line_bounded(&mut reader, &mut line, 64 * 1024).await {
            Ok(true) => {
                tracing::info!(target: "mcp_harness::server_stderr", server = %server, "{}", String::from_utf8_lossy(&line));
            }
            Ok(false) => return,
            Err(TransportError::LineTooLong { .. }) => {
                // Skip the rest of an overlong stderr line; stderr is only logged.
                if !skip_line(&mut reader).await {
                    return;
                }
                tracing::info!(target: "mcp_harness::server_stderr", server = %server, "(overlong stderr line skipped)");
            }
            Err(_) => return,
        }
    }
}

/// Ends the transport when the server's leader process has exited but stdout stays open
/// (a descendant inherited it): no EOF would ever come. The rest of the group is
/// killed, which also ends the descendant and so the reader.
async fn watch_leader(shared: Arc<Shared>, mut exit: tokio::sync::watch::Receiver<Option<String>>) {
    if exit.wait_for(Option::is_some).await.is_err() {
        return;
    }
    // Replies written just before the exit are still read in this time.
    tokio::time::sleep(Duration::from_millis(500)).await;
    if shared.closed.lock().is_none() {
        let status = exit.borrow().clone().unwrap_or_default();
        tracing::warn!(server = %shared.server, %status, "server exited but its stdout is still open; killing its process group");
        shared.sweep();
        shared.close(TransportError::Closed {
            exit: Some(format!("{status}; stdout held open by a descendant")),
        });
    }
}

/// Discards the rest of a line without holding it; false at EOF or on an error.
async fn skip_line<R: AsyncRead + Unpin>(reader: &mut BufReader<R>) -> bool {
    loop {
        let Ok(available) = reader.fill_buf().await else {
            return false;
        };
        if available.is_empty() {
            return false;
        }
        match available.iter().position(|b| *b == b'\n') {
            Some(n) => {
                reader.consume(n + 1);
                return true;
            }
            None => {
                let n = available.len();
                reader.consume(n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bounded_reader_splits_lines_and_rejects_long_ones() {
        let data: &[u8] = b"{\"a\":1}\n\nabcdefghij\nxyz";
        let mut r = BufReader::with_capacity(4, data);
        let mut line = Vec::new();
        assert_eq!(read_line_bounded(&mut r, &mut line, 8).await, Ok(true));
        assert_eq!(line, b"{\"a\":1}");
        assert_eq!(read_line_bounded(&mut r, &mut line, 8).await, Ok(true));
        assert!(line.is_empty());
        assert_eq!(
            read_line_bounded(&mut r, &mut line, 8).await,
            Err(TransportError::LineTooLong { limit: 8 })
        );
        assert!(line.len() <= 8, "never holds more than the limit");
    }

    #[tokio::test]
    async fn a_partial_line_at_eof_is_not_a_message() {
        let data: &[u8] = b"{\"jsonrpc\":";
        let mut r = BufReader::new(data);
        let mut line = Vec::new();
        assert_eq!(read_line_bounded(&mut r, &mut line, 1024).await, Ok(false));
    }
}
