//! The stdio transport: one server process, newline-delimited JSON-RPC on its pipes.
//!
//! Ownership: the transport owns the process group ([`process`]); a writer task owns
//! stdin, a reader task owns stdout, a logger task owns stderr. Many requests share the
//! pipe and are matched by id in a pending map. The writer drains everything queued and
//! flushes once, so a burst of requests costs one syscall. Its queue is bounded: a
//! server that stops reading its stdin makes requests wait, never grows our memory. A
//! request whose deadline passes while its line is still queued is withdrawn, never
//! written, and fails as never sent; one the writer took (at most a pipe's and a
//! batch's worth) fails as timed out and is cancelled.
//!
//! Lifecycle and failure: the reader ends the transport on EOF, on a read error, or on a
//! line longer than the limit (the only way to keep memory bounded without losing track
//! of which request the line belonged to). Ending fails every pending request at once
//! with that [`TransportError`] (one whose line the writer has not taken yet, as never
//! sent) and reports it on the inbound channel. A line that is
//! not JSON-RPC is logged and skipped: servers that print stray text to stdout are
//! common, and the request it might have answered still ends at its deadline. A line
//! whose routing fields answer a request with a result is handed to that request,
//! which parses it: one whose body does not parse (nesting too deep, a number out of
//! range) fails it at once with a protocol error.
//! A request whose deadline passes, or whose future is dropped, is removed and a
//! `notifications/cancelled` goes to the server.
//!
//! Spec: section G (stdio) of `../shared/spec/mcp-2026-07-28.md`.

mod framing;
mod process;
mod spawner;

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::{mpsc, oneshot, watch};

use super::error::TransportError;
use super::exit::ExitStatus;
use super::inbound::{Inbound, InboundSink, Via};
use super::spec::StdioSpec;
use crate::protocol::{
    Message, Notification, Peeked, ProtocolError, RequestId, RequestRef, Response, RpcError, Stamp,
};
use crate::util::log_budget::LogBudget;
use framing::{read_line_bounded, skip_line};
use process::{GroupHandle, ProcessGroup};

type Reply = Result<Value, RpcError>;
/// A request waiting for its answer, and where its line is: an answer while the line
/// is still queued (the server cannot have read it) is to no request sent.
struct Waiter {
    tx: oneshot::Sender<Result<Delivery, TransportError>>,
    ticket: Ticket,
}

/// A response as the reader hands it to its request.
enum Delivery {
    /// Parsed by the reader (errors, which are rare).
    Parsed(Reply),
    /// A successful response's line, routed by its id alone: the request parses it, so
    /// that the result is built and freed on one thread (built on the reader's and freed
    /// on the caller's, results made most of the allocator's lock contention; the line's
    /// one copy is all that still crosses).
    Line(Vec<u8>),
}

impl Delivery {
    fn into_reply(self) -> Result<Reply, TransportError> {
        match self {
            Delivery::Parsed(reply) => Ok(reply),
            Delivery::Line(line) => match Message::parse(&line)? {
                Message::Response(response) => Ok(response.outcome),
                // `peek` routes only what parses as a response or not at all.
                _ => Err(ProtocolError::Malformed("not a response".into()).into()),
            },
        }
    }
}

/// Messages the writer holds before requests wait for it to drain.
const WRITER_QUEUE: usize = 1024;

/// State the reader and the callers share.
struct Shared {
    server: String,
    pending: Mutex<foldhash::HashMap<RequestId, Waiter>>,
    /// Set once, when the transport ends; later requests fail with it.
    closed: Mutex<Option<TransportError>>,
    group: GroupHandle,
    /// Answers handed to their requests since the writer last looked: more than one
    /// means callers are waking together, each about to queue its next line.
    answered: AtomicUsize,
    /// Lines not acted on (not JSON-RPC, answers to no request, requests or lines
    /// dropped on a full queue).
    ignored: LogBudget,
    /// Messages to the server dropped on a full stdin queue: their own budget, so that a
    /// server's flood of stray lines does not hide that it is no longer read to (the
    /// cancellations and answers dropped are otherwise silent).
    stdin_full: LogBudget,
    /// Messages that found the queue full, for the writer's next write: a cancellation
    /// of a request a server stopped reading is what it most needs when it reads again.
    overflow: Mutex<Vec<u8>>,
    /// Stops the reader when the transport ends without the EOF that would stop it.
    stop_reader: Mutex<Option<oneshot::Sender<TransportError>>>,
    /// The writer, for the reader's own answers (weak: the transport's end closes it).
    writer: mpsc::WeakSender<WriterCmd>,
    /// Lines read from the server: whether it said anything at all while a request
    /// waited (see [`StdioTransport::heard`]).
    heard: std::sync::atomic::AtomicU64,
}

impl Shared {
    /// Ends the transport from outside the reader, which then reports the end (the
    /// connection's owner restarts the server on it): for a server whose stdout will
    /// never reach EOF, or that can no longer read its stdin.
    fn end(&self, error: TransportError) {
        if !self.close(error.clone()) {
            return; // ended already, by the reader itself or before
        }
        if let Some(stop) = self.stop_reader.lock().take() {
            let _ = stop.send(error);
        }
    }

    /// Fails every request in flight and every later one with `error`; `false` when
    /// the transport had ended already. A request whose line the writer has not taken
    /// yet is withdrawn, and fails as never sent: the writer, which goes on while the
    /// server reads, would have written it after its caller was told it failed (and
    /// it could not fail over).
    fn close(&self, error: TransportError) -> bool {
        let mut closed = self.closed.lock();
        if closed.is_some() {
            return false;
        }
        *closed = Some(error.clone());
        drop(closed);
        let waiters: Vec<Waiter> = self.pending.lock().drain().map(|(_, w)| w).collect();
        for w in waiters {
            let withdrawn = w
                .ticket
                .compare_exchange(QUEUED, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
            let _ = w.tx.send(Err(match withdrawn {
                true => TransportError::NotSent(error.to_string()),
                false => error.clone(),
            }));
        }
        true
    }
}

enum WriterCmd {
    /// A line, with its request's ticket (none for notifications and answers).
    Line(Vec<u8>, Option<Ticket>),
    Close,
}

/// Where a request's line is: whichever of the writer (taking it) and the request's
/// end (withdrawing it) comes first decides whether the server ever reads it.
type Ticket = Arc<AtomicU8>;
const QUEUED: u8 = 0;
const TAKEN: u8 = 1;
const WITHDRAWN: u8 = 2;

/// The most the writer takes from its queue into one write: lines it has taken can no
/// longer be withdrawn, so a server that stops reading holds at most this and its
/// pipe's worth of requests that time out (64 calls in flight are about 20 KB).
const WRITE_BATCH: usize = 64 << 10;

/// The most bytes of messages (cancellations, answers) kept for the writer when its
/// queue is full; past it they are dropped with a warning.
const OVERFLOW_MAX: usize = 256 << 10;

/// A connected stdio server.
pub(crate) struct StdioTransport {
    shared: Arc<Shared>,
    writer: mpsc::Sender<WriterCmd>,
    group: tokio::sync::Mutex<ProcessGroup>,
    /// The group's end ([`ProcessGroup::exit_watch`]), without its lock.
    exit: watch::Receiver<Option<ExitStatus>>,
    pid: u32,
    /// Ends the writer and the stderr reader when the transport is dropped.
    _gone: tokio_util::sync::DropGuard,
}

/// Runs `work` until it ends, or `grace` after `gone` is cancelled.
async fn until_gone(
    gone: tokio_util::sync::CancellationToken,
    grace: Duration,
    work: impl Future<Output = ()>,
) {
    let ended = async {
        gone.cancelled().await;
        if !grace.is_zero() {
            tokio::time::sleep(grace).await;
        }
    };
    tokio::select! {
        biased;
        () = work => {}
        () = ended => {}
    }
}

impl StdioTransport {
    /// Spawns the server and starts its reader, writer and stderr tasks. Incoming
    /// requests and notifications, and the transport's end, go to `inbound`.
    pub(crate) async fn spawn(
        server: &str,
        spec: &StdioSpec,
        max_line: usize,
        inbound: InboundSink,
        spawned_hook: Option<crate::transport::SpawnHook>,
    ) -> Result<StdioTransport, TransportError> {
        let spawned = ProcessGroup::spawn(spec, spawned_hook).await?;
        let pid = spawned.group.pid();
        let (stop_reader, reader_stopped) = oneshot::channel();
        let (writer, rx) = mpsc::channel(WRITER_QUEUE);
        let shared = Arc::new(Shared {
            server: server.to_string(),
            pending: Mutex::default(),
            closed: Mutex::new(None),
            group: spawned.group.handle(),
            answered: AtomicUsize::new(0),
            ignored: LogBudget::default(),
            stdin_full: LogBudget::default(),
            overflow: Mutex::default(),
            stop_reader: Mutex::new(Some(stop_reader)),
            writer: writer.downgrade(),
            heard: std::sync::atomic::AtomicU64::new(0),
        });
        let span = tracing::info_span!(target: crate::util::trace_context::CONNECTION_SPANS, "stdio", server = %server, pid);
        // A descendant that left the process group (`setsid`) can hold stdin and stderr
        // open, unread or silent, past the group's kill: the writer stuck in a write and
        // the stderr reader would outlive the transport, each with its pipe.
        let gone = tokio_util::sync::CancellationToken::new();
        let writing = write_loop(
            spawned.stdin,
            rx,
            shared.clone(),
            spawned.group.exit_watch(),
        );
        tokio::spawn(tracing::Instrument::instrument(
            until_gone(gone.clone(), Duration::ZERO, writing),
            span.clone(),
        ));
        tokio::spawn(tracing::Instrument::instrument(
            read_loop(
                shared.clone(),
                spawned.stdout,
                max_line,
                inbound,
                spawned.group.exit_watch(),
                reader_stopped,
            ),
            span.clone(),
        ));
        tokio::spawn(tracing::Instrument::instrument(
            // A moment more for the last lines of a server that has exited.
            until_gone(
                gone.clone(),
                Duration::from_secs(1),
                log_stderr(server.to_string(), spawned.stderr),
            ),
            span,
        ));
        tokio::spawn(watch_leader(shared.clone(), spawned.group.exit_watch()));
        tracing::debug!(server, pid, command = %spec.command, "spawned stdio server");
        Ok(StdioTransport {
            shared,
            writer,
            exit: spawned.group.exit_watch(),
            group: tokio::sync::Mutex::new(spawned.group),
            pid,
            _gone: gone.drop_guard(),
        })
    }

    /// The server process's pid (and process group id).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// How many lines the server has written: unchanged over a request's whole
    /// timeout, it said nothing at all meanwhile (a server wedged, not a slow tool).
    pub(crate) fn heard(&self) -> u64 {
        self.shared.heard.load(Ordering::Relaxed)
    }

    /// Set once the process is gone: its leader reaped, what was left of its group
    /// killed.
    pub(crate) fn exit_watch(&self) -> watch::Receiver<Option<ExitStatus>> {
        self.exit.clone()
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
        request: RequestRef<'_>,
        stamp: Option<Stamp<'_>>,
        timeout: Duration,
    ) -> Result<Reply, TransportError> {
        let (tx, mut rx) = oneshot::channel();
        let id = request.id.clone();
        let ticket = Ticket::default();
        {
            // Checked under the closed lock, so `close` cannot miss this waiter.
            let closed = self.shared.closed.lock();
            if let Some(e) = closed.as_ref() {
                return Err(TransportError::NotSent(e.to_string()));
            }
            let waiter = Waiter {
                tx,
                ticket: ticket.clone(),
            };
            self.shared.pending.lock().insert(id.clone(), waiter);
        }
        let mut in_flight = PendingRequest {
            transport: self,
            id: Some(id),
            written: false,
            ticket: Some(ticket.clone()),
            // The probe: a legacy server must hear nothing but `initialize` next; and
            // `initialize` itself, which clients must not cancel (the legacy
            // revisions' cancellation page).
            quiet: matches!(request.method, "server/discover" | "initialize"),
        };
        // A tool call with its envelope is about 300 bytes: one allocation, no regrowth.
        let mut line = Vec::with_capacity(512);
        Message::write_stamped_line(request, stamp, &mut line);
        let deadline = crate::util::duration::after(tokio::time::Instant::now(), timeout);
        // A free slot takes the line at once; only a full queue needs a timer.
        let queued = match self.writer.try_send(WriterCmd::Line(line, Some(ticket))) {
            Ok(()) => Ok(Ok(())),
            Err(mpsc::error::TrySendError::Closed(_)) => Ok(Err(())),
            // Boxed: the wait for room (a timer and the channel's own wait) would
            // otherwise more than double this future, and every call's above it.
            Err(mpsc::error::TrySendError::Full(cmd)) => {
                let room = Box::pin(tokio::time::timeout_at(deadline, self.writer.send(cmd)));
                tokio::select! {
                    sent = room => sent.map(|sent| sent.map_err(|_| ())),
                    // The transport ended (`close` fails this waiter) while the line
                    // waited for room: it was never queued.
                    _ = &mut rx => Ok(Err(())),
                }
            }
        };
        match queued {
            Ok(Ok(())) => in_flight.written = true,
            Ok(Err(())) => {
                in_flight.forget();
                let why = match self.shared.closed.lock().as_ref() {
                    Some(e) => e.to_string(),
                    None => "stdin is closed".into(),
                };
                return Err(TransportError::NotSent(why));
            }
            Err(_) => {
                in_flight.forget();
                return Err(TransportError::NotSent(format!(
                    "the server did not read its stdin within {timeout:?}"
                )));
            }
        }
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(delivery)) => {
                in_flight.id = None;
                delivery.and_then(Delivery::into_reply)
            }
            Ok(Err(_)) => {
                in_flight.id = None;
                Err(self.closed_error())
            }
            Err(_) if in_flight.withdraw() => {
                in_flight.forget();
                Err(TransportError::NotSent(format!(
                    "the server did not read its stdin within {timeout:?}"
                )))
            }
            Err(_) => {
                in_flight.cancel("timeout");
                Err(TransportError::Timeout(timeout))
            }
        }
    }

    /// Forgets the request in flight as `id` without a cancellation: the server ended it
    /// itself (its `notifications/cancelled` of a subscription), so telling it back is noise.
    pub(crate) fn ended_by_server(&self, id: &RequestId) {
        self.shared.pending.lock().remove(id);
    }

    /// Sends a notification. Never waits: when the writer's queue is full the
    /// notification is dropped with a warning (notifications carry no answer).
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
        match self.writer.try_send(WriterCmd::Line(line, None)) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(WriterCmd::Line(line, _))) => {
                {
                    let mut overflow = self.shared.overflow.lock();
                    if overflow.len() + line.len() > OVERFLOW_MAX {
                        drop(overflow);
                        if let Some(dropped) = self.shared.stdin_full.log() {
                            tracing::warn!(server = %self.shared.server, dropped, "stdin queue full; message dropped");
                        }
                        return Err(TransportError::NotSent(
                            "the server's stdin queue is full".into(),
                        ));
                    }
                    overflow.extend_from_slice(&line);
                }
                // The writer looks at the overflow after each command: a full queue has
                // commands for it, and a queue drained meanwhile takes this nudge.
                let _ = self.writer.try_send(WriterCmd::Line(Vec::new(), None));
                Ok(())
            }
            Err(_) => Err(TransportError::NotSent("stdin is closed".into())),
        }
    }

    fn closed_error(&self) -> TransportError {
        self.shared
            .closed
            .lock()
            .clone()
            .unwrap_or(TransportError::Closed {
                exit: None,
                detail: None,
            })
    }

    /// Stops the server: close stdin, wait `grace`, SIGTERM the group, wait `grace`,
    /// SIGKILL, reap. Pending requests fail with [`TransportError::Closed`] (those whose
    /// line was not written yet, as never sent).
    pub(crate) async fn shutdown(&self, grace: Duration) {
        // A full queue (a server slow to read) still gets its EOF once there is room,
        // while the group is given its grace.
        if let Err(mpsc::error::TrySendError::Full(close)) = self.writer.try_send(WriterCmd::Close)
        {
            let writer = self.writer.clone();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(grace, writer.send(close)).await;
            });
        }
        let exit = self.group.lock().await.terminate(grace).await;
        // The reader too, should a descendant that left the group hold stdout.
        self.shared
            .end(TransportError::Closed { exit, detail: None });
    }

    /// SIGKILLs the server's process group now (fault injection, forced stop).
    pub fn kill(&self) {
        self.shared.group.kill();
    }
}

/// A request between being queued and being answered; dropping it cancels it.
struct PendingRequest<'a> {
    transport: &'a StdioTransport,
    id: Option<RequestId>,
    /// Whether the line reached the writer's queue.
    written: bool,
    /// The line's ticket, to withdraw it while the writer has not taken it.
    ticket: Option<Ticket>,
    /// Never followed by `notifications/cancelled`.
    quiet: bool,
}

impl PendingRequest<'_> {
    /// Withdraws the line if the writer has not taken it: the server never reads it.
    fn withdraw(&mut self) -> bool {
        self.ticket.take().is_some_and(|t| {
            t.compare_exchange(QUEUED, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        })
    }

    /// Removes the request without telling the server (it never got it).
    fn forget(&mut self) {
        if let Some(id) = self.id.take() {
            self.transport.shared.pending.lock().remove(&id);
        }
    }

    fn cancel(&mut self, reason: &str) {
        let Some(id) = self.id.take() else { return };
        let removed = self.transport.shared.pending.lock().remove(&id).is_some();
        // Only a line the writer took is worth a cancellation.
        if removed && self.written && !self.withdraw() && !self.quiet {
            let _ = self.transport.notify(Notification {
                method: "notifications/cancelled".into(),
                params: Some(json!({ "requestId": id, "reason": reason })),
            });
        }
    }
}

impl Drop for PendingRequest<'_> {
    fn drop(&mut self) {
        self.cancel("cancelled by the client");
    }
}

/// The most a reader's or writer's buffer keeps between messages.
const KEPT_BUFFER: usize = 1 << 20;

/// Adds `line` to the writer's next write unless its request withdrew it.
fn take(buf: &mut Vec<u8>, line: &[u8], ticket: Option<Ticket>) {
    let taken = ticket.is_none_or(|t| {
        t.compare_exchange(QUEUED, TAKEN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    });
    if taken {
        buf.extend_from_slice(line);
    }
}

async fn write_loop(
    mut stdin: ChildStdin,
    mut rx: mpsc::Receiver<WriterCmd>,
    shared: Arc<Shared>,
    exit: watch::Receiver<Option<ExitStatus>>,
) {
    let mut buf = Vec::with_capacity(8192);
    while let Some(cmd) = rx.recv().await {
        let mut close = false;
        match cmd {
            WriterCmd::Line(line, ticket) => take(&mut buf, &line, ticket),
            WriterCmd::Close => close = true,
        }
        // A burst comes from answers delivered together, each waking a caller who
        // queues its next line. After one answer there is none to wait for, and the
        // wait would cost this line a pass through the I/O driver and, most times, a
        // wake-up of another worker (BENCHMARKS.md, item 18).
        if !close && shared.answered.swap(0, Ordering::Relaxed) > 1 {
            crate::util::gather_burst().await;
        }
        // Take whatever else is queued so the burst goes out in one write.
        while !close && buf.len() < WRITE_BATCH {
            match rx.try_recv() {
                Ok(WriterCmd::Line(line, ticket)) => take(&mut buf, &line, ticket),
                Ok(WriterCmd::Close) => close = true,
                Err(_) => break,
            }
        }
        {
            let mut overflow = shared.overflow.lock();
            if !overflow.is_empty() {
                buf.extend_from_slice(&overflow);
                *overflow = Vec::new();
            }
        }
        if !buf.is_empty() {
            let written = match stdin.write_all(&buf).await {
                Ok(()) => stdin.flush().await,
                Err(e) => Err(e),
            };
            if let Err(e) = written {
                tracing::debug!(error = %e, "stdin write failed");
                drop(rx); // later requests are not sent
                // A server that exits is reported by the reader at its EOF, with how it
                // ended (the restart policy reads it; the reader waits up to 300 ms for
                // it); one that closed its stdin and lives on would never be.
                tokio::time::sleep(Duration::from_secs(2)).await;
                // A leader that exited is the reader's (or `watch_leader`'s) to report.
                if exit.borrow().is_none() && shared.closed.lock().is_none() {
                    tracing::warn!(server = %shared.server, error = %e, "server no longer reads its stdin; ending its connection");
                    shared.end(TransportError::Closed {
                        exit: None,
                        detail: Some("the server closed its stdin".into()),
                    });
                }
                return;
            }
            buf.clear();
            // One large request's buffer is not kept for the connection's life.
            buf.shrink_to(KEPT_BUFFER);
        }
        if close {
            break;
        }
    }
    // Dropping stdin closes the pipe: the server sees EOF.
}

async fn read_loop(
    shared: Arc<Shared>,
    stdout: ChildStdout,
    max_line: usize,
    inbound: InboundSink,
    mut exit: watch::Receiver<Option<ExitStatus>>,
    stopped: oneshot::Receiver<TransportError>,
) {
    let mut reader = BufReader::with_capacity(64 * 1024, stdout);
    let mut line = Vec::with_capacity(4096);
    let reading = async {
        loop {
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
                        exit: *exit.borrow(),
                        detail: None,
                    });
                    let _ = tokio::time::timeout(
                        Duration::from_millis(200),
                        exit.wait_for(Option::is_some),
                    )
                    .await;
                    let status = *exit.borrow();
                    if status.is_some() {
                        // The leader is reaped: take any descendants with it, while the id is ours.
                        shared.group.sweep();
                    }
                    break TransportError::Closed {
                        exit: status,
                        detail: None,
                    };
                }
                Err(e) => break e,
            }
            shared.heard.fetch_add(1, Ordering::Relaxed);
            if line.iter().all(u8::is_ascii_whitespace) {
                // A long blank line's room is not kept either.
                line.clear();
                line.shrink_to(KEPT_BUFFER);
                continue;
            }
            match Message::peek(&line) {
                Peeked::Result(id) => deliver(&shared, id, Delivery::Line(line.to_vec())),
                Peeked::Other => on_message(&shared, &inbound, Message::parse(&line), &line),
            }
            // One large message's buffer is not kept for the connection's life (the
            // next read clears it anyway).
            line.clear();
            line.shrink_to(KEPT_BUFFER);
        }
    };
    let end = tokio::select! {
        biased;
        end = reading => end,
        Ok(end) = stopped => end,
    };
    // Stopped from outside: stdout is closed before the end is reported.
    drop(reader);
    tracing::debug!(server = %shared.server, reason = %end, "stdio transport ended");
    shared.close(end.clone());
    let _ = inbound.send(Inbound::Closed(end)).await;
}

/// A line that is not a successful response, parsed; `line` is for the log.
fn on_message(
    shared: &Shared,
    inbound: &InboundSink,
    message: Result<Message, ProtocolError>,
    line: &[u8],
) {
    match message {
        Ok(Message::Response(response)) => route_response(shared, response),
        Ok(Message::Request(request)) => {
            // Never wait on a full channel: replies behind it would stall. The server is
            // told at once instead (if the writer has room).
            if let Err(Inbound::Request(request, _)) =
                inbound.offer(Inbound::Request(request, Via::default()), line.len())
            {
                if let Some(ignored) = shared.ignored.log() {
                    tracing::warn!(server = %shared.server, ignored, "server request refused: channel full");
                }
                let mut answer = Vec::with_capacity(128);
                Message::Response(Response {
                    id: Some(request.id),
                    outcome: Err(crate::transport::inbound::busy()),
                })
                .write_line(&mut answer);
                if let Some(writer) = shared.writer.upgrade() {
                    let _ = writer.try_send(WriterCmd::Line(answer, None));
                }
            }
        }
        Ok(Message::Notification(n)) => {
            if inbound.offer(Inbound::Notification(n), line.len()).is_err() {
                tracing::debug!(server = %shared.server, "server notification dropped: channel full");
            }
        }
        Err(e) => {
            if let Some(ignored) = shared.ignored.log() {
                let sample = String::from_utf8_lossy(&line[..line.len().min(200)]).into_owned();
                tracing::warn!(server = %shared.server, error = %e, line = %sample.escape_debug(), ignored, "skipping a line that is not JSON-RPC");
            }
            match Message::peek_id(line) {
                // A request whose id can be read is answered under it (JSON-RPC asks
                // for an error): a server waiting on it does not hold the call it came
                // during until the deadline.
                Some((id, true)) => {
                    let mut answer = Vec::with_capacity(128);
                    Message::Response(Response {
                        id: Some(id),
                        outcome: Err(crate::protocol::RpcError::new(e.code(), e.to_string())),
                    })
                    .write_line(&mut answer);
                    if let Some(writer) = shared.writer.upgrade() {
                        let _ = writer.try_send(WriterCmd::Line(answer, None));
                    }
                }
                // Anything else with an id is a broken reply (an error of the wrong
                // shape, a misspelled result): the request of that id fails now, on its
                // own parse, instead of at its deadline.
                Some((id, false)) => deliver(shared, id, Delivery::Line(line.to_vec())),
                None => {}
            }
        }
    }
}

fn route_response(shared: &Shared, response: Response) {
    let Some(id) = response.id else {
        if let Err(e) = response.outcome
            && let Some(ignored) = shared.ignored.log()
        {
            let error = crate::util::text::one_line(&e.to_string(), 200);
            tracing::warn!(server = %shared.server, %error, ignored, "server sent an error about an unparseable request");
        }
        return;
    };
    deliver(shared, id, Delivery::Parsed(response.outcome));
}

fn deliver(shared: &Shared, id: RequestId, delivery: Delivery) {
    let waiter = {
        let mut pending = shared.pending.lock();
        match pending.remove(&id) {
            // Still queued: the server has not read it (its id guessed, or another's
            // answer under a wrong id), and it may yet be withdrawn or sent. Put back
            // (rare: one lookup for the answers that are theirs).
            Some(w) if w.ticket.load(Ordering::Acquire) == QUEUED => {
                pending.insert(id.clone(), w);
                None
            }
            w => w,
        }
    };
    match waiter {
        Some(w) => {
            shared.answered.fetch_add(1, Ordering::Relaxed);
            let _ = w.tx.send(Ok(delivery));
        }
        // A late answer to a cancelled request, a duplicate, an id never sent, or one
        // whose line the server has not been given yet.
        None => {
            if let Some(ignored) = shared.ignored.log() {
                let id = crate::util::text::one_line(&id.to_string(), 100);
                tracing::warn!(server = %shared.server, %id, ignored, "response with an unknown id ignored");
            }
        }
    }
}

/// Server stderr lines logged per second at most; past it they are counted, and the
/// count logged with the first line after that second (or at the end), so a flood
/// costs the log a line a second.
const STDERR_LINES_PER_SECOND: u32 = 100;

/// The longest stderr line logged (characters); the rest is cut.
const STDERR_LINE_LOGGED: usize = 2048;

async fn log_stderr(server: String, stderr: tokio::process::ChildStderr) {
    let mut reader = BufReader::new(stderr);
    let mut line = Vec::new();
    let (mut second, mut logged, mut dropped) = (tokio::time::Instant::now(), 0u32, 0u64);
    loop {
        let read = read_line_bounded(&mut reader, &mut line, 64 * 1024).await;
        let (text, last) = match read {
            Ok(true) => (Some(line.as_slice()), false),
            // The last line, without its newline: often the one that says why it
            // exited (`fatal: …` then exit).
            Ok(false) if !line.is_empty() => (Some(line.as_slice()), true),
            Ok(false) => break,
            Err(TransportError::LineTooLong { .. }) => {
                // Skip the rest of an overlong stderr line; stderr is only logged.
                if !skip_line(&mut reader).await {
                    break;
                }
                (None, false)
            }
            Err(_) => break,
        };
        if second.elapsed() >= Duration::from_secs(1) {
            if dropped > 0 {
                tracing::info!(target: "mcp_harness::server_stderr", server = %server, dropped, "stderr lines not logged (more than {STDERR_LINES_PER_SECOND} a second)");
            }
            (second, logged, dropped) = (tokio::time::Instant::now(), 0, 0);
        }
        if logged >= STDERR_LINES_PER_SECOND {
            dropped += 1;
        } else {
            logged += 1;
            match text {
                Some(text) => {
                    let text = crate::util::text::one_line(
                        &String::from_utf8_lossy(text),
                        STDERR_LINE_LOGGED,
                    );
                    tracing::info!(target: "mcp_harness::server_stderr", server = %server, "{text}");
                }
                None => {
                    tracing::info!(target: "mcp_harness::server_stderr", server = %server, "(overlong stderr line skipped)")
                }
            }
        }
        if last {
            break;
        }
    }
    if dropped > 0 {
        tracing::info!(target: "mcp_harness::server_stderr", server = %server, dropped, "stderr lines not logged (more than {STDERR_LINES_PER_SECOND} a second)");
    }
}

/// Ends the transport when the server's leader process has exited but stdout stays open
/// (a descendant inherited it): no EOF would ever come. The rest of the group is
/// killed, and the reader stopped (a descendant that left the group lives on).
async fn watch_leader(shared: Arc<Shared>, mut exit: watch::Receiver<Option<ExitStatus>>) {
    if exit.wait_for(Option::is_some).await.is_err() {
        return;
    }
    // Replies written just before the exit are still read in this time.
    tokio::time::sleep(Duration::from_millis(500)).await;
    if shared.closed.lock().is_none() {
        let status = *exit.borrow();
        tracing::warn!(server = %shared.server, status = ?status, "server exited but its stdout is still open; killing its process group");
        shared.group.sweep();
        // A descendant outside the group (its own session) keeps stdout open still:
        // the reader is stopped rather than left waiting for an EOF that never comes.
        shared.end(TransportError::Closed {
            exit: status,
            detail: Some("stdout held open by a descendant".into()),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A server that stops reading, then answers an id whose line is still queued (the
    // writer blocked on the full pipe): the answer is to no request it was sent, and
    // is ignored; the request is withdrawn at its deadline, never sent. Before, the
    // caller got that answer, and the line was written after it.
    #[tokio::test]
    async fn an_answer_to_a_request_whose_line_is_still_queued_is_ignored() {
        let answer = r#"{"jsonrpc":"2.0","id":40,"result":{"stolen":true}}"#;
        let spec = sh(format!("sleep 1; printf '%s\\n' '{answer}'; sleep 30"));
        let (tx, _rx) = mpsc::channel(16);
        let transport =
            StdioTransport::spawn("t", &spec, 1 << 20, InboundSink::new(tx, None), None)
                .await
                .expect("spawn");
        let outcomes = pings(&transport, 40, Duration::from_secs(3)).await;
        for (n, outcome) in outcomes {
            assert!(
                outcome.is_err(),
                "request {n} took an answer it was never sent: {outcome:?}"
            );
        }
        transport.shutdown(Duration::from_millis(100)).await;
    }

    fn sh(script: String) -> StdioSpec {
        StdioSpec {
            command: "sh".into(),
            args: vec!["-c".into(), script],
            env: Default::default(),
            cwd: None,
            inherit_env: false,
        }
    }

    /// `n` pings with 32 KiB params each on `transport`, at once; each one's id and
    /// outcome.
    async fn pings(
        transport: &StdioTransport,
        n: i64,
        timeout: Duration,
    ) -> Vec<(i64, Result<Reply, TransportError>)> {
        let params = serde_json::json!({"pad": "x".repeat(32 << 10)});
        let requests = (1..=n).map(|n| {
            let (transport, params) = (transport, &params);
            async move {
                let id = RequestId::Number(n);
                let request = RequestRef {
                    id: &id,
                    method: "ping",
                    params: Some(params),
                };
                (n, transport.request(request, None, timeout).await)
            }
        });
        futures_util::future::join_all(requests).await
    }

    // The transport ends (a line too long) while lines wait in the writer's queue for a
    // server that is not reading: those fail as never sent, and are never written when
    // it reads again. Before, every caller was told the line-too-long error (no
    // failover), and all of them were written and run.
    #[tokio::test]
    async fn requests_still_queued_when_the_transport_ends_are_never_sent() {
        let scratch = crate::util::scratch::Scratch::new("queued-at-end");
        std::fs::create_dir_all(&*scratch).expect("scratch");
        let record = scratch.join("stdin");
        let spec = sh(format!(
            "sleep 1; printf '%02048d\\n' 0; exec cat > '{}'",
            record.display()
        ));
        let (tx, _rx) = mpsc::channel(16);
        let transport = StdioTransport::spawn("t", &spec, 1024, InboundSink::new(tx, None), None)
            .await
            .expect("spawn");
        let outcomes = pings(&transport, 40, Duration::from_secs(10)).await;
        let never_sent: Vec<i64> = outcomes
            .iter()
            .filter(|(_, o)| matches!(o, Err(TransportError::NotSent(_))))
            .map(|(n, _)| *n)
            .collect();
        assert!(!never_sent.is_empty(), "{outcomes:?}");
        transport.shutdown(Duration::from_secs(2)).await;
        let written = std::fs::read_to_string(&record).unwrap_or_default();
        let ids: Vec<i64> = written
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|m| m["id"].as_i64())
            .collect();
        assert!(
            ids.iter().all(|id| !never_sent.contains(id)),
            "written though said never sent: {ids:?} / {never_sent:?}"
        );
    }

    // A request waiting for room in the full queue hears the transport end (the server
    // closed its stdout and stopped reading), and does not wait out its deadline.
    #[tokio::test]
    async fn a_request_waiting_for_room_hears_the_transport_end() {
        let spec = sh("sleep 1; exec 1>&-; exec sleep 300".into());
        let (tx, _rx) = mpsc::channel(16);
        let transport =
            StdioTransport::spawn("t", &spec, 1 << 20, InboundSink::new(tx, None), None)
                .await
                .expect("spawn");
        let all = pings(
            &transport,
            WRITER_QUEUE as i64 + 200,
            Duration::from_secs(120),
        );
        let outcomes = tokio::time::timeout(Duration::from_secs(60), all)
            .await
            .expect("every request ends with the transport, not at its deadline");
        assert!(outcomes.iter().all(|(_, o)| o.is_err()));
        transport.shutdown(Duration::from_millis(100)).await;
    }
}
