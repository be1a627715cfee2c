//! The gateway for one client over a pipe (newline-delimited JSON-RPC), for clients that
//! spawn their servers. The principal is fixed when it starts. Requests with the
//! 2026-07-28 envelope are served statelessly; after an `initialize` the rest is the
//! legacy session, whose client the gateway can ask things in the middle of a call.
//! Requests run concurrently; `notifications/cancelled` cancels one; at end of input
//! the calls in flight finish, then it returns.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use super::{
    Client, ClientPeer, Gateway, InFlight, LegacyClient, Owed, PeerFuture, Principal, Questions,
    id_key,
};
use crate::call::CancelToken;
use crate::protocol::meta::KEY_PROTOCOL_VERSION;
use crate::protocol::{Message, Notification, Request, RequestId, Response, RpcError};
use crate::server::ListsChanged;

/// Longest line read, whatever `max_body_bytes` says; a longer one is skipped unread.
const MAX_LINE: usize = 16 << 20;

type Pending = Arc<Questions>;

/// Bytes of large lines (past [`super::http::LARGE_BODY`]) whose messages are held
/// (parsed, JSON takes many times its size), as the HTTP listener holds a principal's
/// large bodies: a line that would pass the budget is answered with an error unparsed,
/// unless nothing large is held. The client's answers to the gateway's questions are
/// not held (each is handed to its question as it is read), so large calls waiting for
/// large answers never keep those answers out.
#[derive(Clone, Default)]
struct LargeLines {
    held: Arc<parking_lot::Mutex<usize>>,
}

/// One large line's share of its budget; given back when dropped.
struct LargeLine {
    held: Arc<parking_lot::Mutex<usize>>,
    bytes: usize,
}

impl LargeLines {
    /// A share for a line of `bytes`, if it fits in `budget` (or nothing large is held).
    fn take(&self, bytes: usize, budget: usize) -> Option<LargeLine> {
        let mut held = self.held.lock();
        if *held > 0 && held.saturating_add(bytes) > budget {
            return None;
        }
        *held = held.saturating_add(bytes);
        Some(LargeLine {
            held: self.held.clone(),
            bytes,
        })
    }
}

impl Drop for LargeLine {
    fn drop(&mut self) {
        let mut held = self.held.lock();
        *held = held.saturating_sub(self.bytes);
    }
}

/// Reads past the rest of a line, holding none of it: true at its end, false at the
/// end of input.
async fn skip_line(reader: &mut (impl tokio::io::AsyncBufRead + Unpin)) -> std::io::Result<bool> {
    use tokio::io::AsyncBufReadExt;
    loop {
        let buf = reader.fill_buf().await?;
        if buf.is_empty() {
            return Ok(false);
        }
        match buf.iter().position(|b| *b == b'\n') {
            Some(at) => {
                reader.consume(at + 1);
                return Ok(true);
            }
            None => {
                let n = buf.len();
                reader.consume(n);
            }
        }
    }
}

struct Pipe {
    out: mpsc::UnboundedSender<Vec<u8>>,
    /// Bytes queued for the writer and not taken yet: a client that stops reading
    /// stops getting notifications past [`MAX_QUEUED_NOTICES`] (one large answer being
    /// written to a client that reads drops none).
    queued: Arc<AtomicUsize>,
    /// Bytes queued and not written yet: past [`MAX_QUEUED_ANSWERS`] nothing more is
    /// read from the client (each line read may queue an answer, an error at least)
    /// until it reads.
    unwritten: Arc<AtomicUsize>,
    /// Told each time the writer has written what it took.
    drained: Arc<tokio::sync::Notify>,
    pending: Pending,
    next: AtomicU64,
    /// Calls whose answers are not queued yet (subscriptions not counted): while
    /// another is running, the writer waits a moment for its answer to join the burst.
    answering: Arc<AtomicUsize>,
}

/// How many bytes may wait for a client that is not reading before notifications to it
/// are dropped.
const MAX_QUEUED_NOTICES: usize = 4 << 20;

/// How many bytes may wait for a client that is not reading before its input is no
/// longer read (the calls in flight still answer, into the queue).
const MAX_QUEUED_ANSWERS: usize = 16 << 20;

/// Queues `message` for the client's writer, counted as queued and unwritten; false
/// when the writer is gone (the output closed).
fn queue_line(
    out: &mpsc::UnboundedSender<Vec<u8>>,
    queued: &AtomicUsize,
    unwritten: &AtomicUsize,
    message: &Message,
) -> bool {
    let mut line = Vec::new();
    message.write_line(&mut line);
    let len = line.len();
    // Counted before it is sent: the writer may take it at once.
    queued.fetch_add(len, Ordering::Relaxed);
    unwritten.fetch_add(len, Ordering::Relaxed);
    if out.send(line).is_err() {
        // Nothing waits.
        queued.fetch_sub(len, Ordering::Relaxed);
        unwritten.fetch_sub(len, Ordering::Relaxed);
        return false;
    }
    true
}

impl Pipe {
    /// Queues `message` for the client; false when the writer is gone (the output
    /// closed).
    fn send(&self, message: &Message) -> bool {
        queue_line(&self.out, &self.queued, &self.unwritten, message)
    }

    /// [`Pipe::send`], owned: for what is sent after the request that made it.
    fn sender(&self) -> impl Fn(&Message) -> bool + Send + 'static {
        let (out, queued, unwritten) = (
            self.out.clone(),
            self.queued.clone(),
            self.unwritten.clone(),
        );
        move |message| queue_line(&out, &queued, &unwritten, message)
    }

    /// Returns once the client has read enough of what is queued for more input to be
    /// taken (at once when little waits, or the writer is gone).
    async fn room(&self) {
        loop {
            // Made before the check, so a drain in between still wakes it.
            let drained = self.drained.notified();
            if self.unwritten.load(Ordering::Relaxed) <= MAX_QUEUED_ANSWERS || self.out.is_closed()
            {
                return;
            }
            drained.await;
        }
    }

    /// A notification, dropped when the client has not read what is already queued.
    fn notify(&self, notification: Notification) {
        self.notify_message(&Message::Notification(notification));
    }

    /// [`Pipe::notify`] for a notification already made; false when it was dropped
    /// (a list change is then owed: [`super::OWED_RETRY`]).
    fn notify_message(&self, message: &Message) -> bool {
        if self.queued.load(Ordering::Relaxed) > MAX_QUEUED_NOTICES {
            tracing::debug!("stdio client not reading; notification dropped");
            return false;
        }
        self.send(message);
        true
    }
}

/// The writer's end of the queue: when the writer ends (the output closed), the queue
/// is closed first and then whoever waits for room is woken, so that it sees it closed.
struct WriterEnd {
    rx: mpsc::UnboundedReceiver<Vec<u8>>,
    told: Arc<tokio::sync::Notify>,
}

impl Drop for WriterEnd {
    fn drop(&mut self) {
        self.rx.close();
        self.told.notify_waiters();
    }
}

/// Counts one call in [`Pipe::answering`] until it drops (its answer is about to be
/// queued, or its task ended without one).
struct Answering(Arc<AtomicUsize>);

impl Answering {
    fn new(count: &Arc<AtomicUsize>) -> Answering {
        count.fetch_add(1, Ordering::Relaxed);
        Answering(count.clone())
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ClientPeer for Pipe {
    fn request(&self, method: &str, params: Value) -> PeerFuture {
        let id = RequestId::String(format!("g-{}", self.next.fetch_add(1, Ordering::Relaxed)));
        let later = self.sender();
        self.pending.ask(
            id,
            method,
            params,
            |m| self.send(m),
            move |m| {
                later(m);
            },
        )
    }
}

/// The most written to the client before the writer says it made progress.
const WRITE_PIECE: usize = 64 << 10;

/// Serves one client on `input`/`output` as `principal` until the input ends or
/// `shutdown` resolves. Either way nothing more is read, the questions put to the client
/// fail, and the calls in flight finish (a shutdown also shuts the harness down, which
/// lets them finish within its grace) and are answered before it returns.
pub async fn serve(
    gateway: Gateway,
    principal: Principal,
    input: impl AsyncRead + Unpin,
    mut output: impl AsyncWrite + Unpin + Send + 'static,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut stopping = false;
    let open = gateway.local_session(&principal);
    let session_id = open.id();
    let (out_tx, out_rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let answering = Arc::new(AtomicUsize::new(0));
    let running = answering.clone();
    let queued = Arc::new(AtomicUsize::new(0));
    let taken = queued.clone();
    let unwritten = Arc::new(AtomicUsize::new(0));
    let written = unwritten.clone();
    let drained = Arc::new(tokio::sync::Notify::new());
    let told = drained.clone();
    let progress = drained.clone();
    let writer = tokio::spawn(async move {
        // Whoever waits for room hears that the writer is gone, whatever ends it.
        let mut out = WriterEnd {
            rx: out_rx,
            told: told.clone(),
        };
        // One write and one flush per burst: answers that are ready together go together.
        // With no other call running there is no burst to wait for, and the wait would
        // cost the answer a pass through the I/O driver and a wake-up of another worker.
        let mut buf = Vec::new();
        while let Some(line) = out.rx.recv().await {
            buf.extend_from_slice(&line);
            if running.load(Ordering::Relaxed) > 0 {
                crate::util::gather_burst().await;
            }
            while buf.len() < (1 << 20)
                && let Ok(more) = out.rx.try_recv()
            {
                buf.extend_from_slice(&more);
            }
            taken.fetch_sub(buf.len(), Ordering::Relaxed);
            // A piece at a time, each told: a client that reads slowly is seen to read
            // (the session's end waits on that), not only when a whole burst is in.
            for piece in buf.chunks(WRITE_PIECE) {
                if output.write_all(piece).await.is_err() {
                    return;
                }
                // A client that does not read holds this count up, and its input unread.
                written.fetch_sub(piece.len(), Ordering::Relaxed);
                told.notify_waiters();
            }
            if output.flush().await.is_err() {
                return;
            }
            buf.clear();
        }
    });
    let pipe = Arc::new(Pipe {
        out: out_tx,
        queued,
        unwritten,
        drained,
        pending: Pending::default(),
        next: AtomicU64::new(1),
        answering,
    });
    let session: Arc<Mutex<Option<LegacyClient>>> = Arc::default();
    let notifier = tokio::spawn(notify_changes(
        gateway.clone(),
        principal.clone(),
        Arc::downgrade(&pipe),
        session.clone(),
    ));
    // An embedder may drop this future before it ends (a `select!`, a timeout): the
    // writer (perhaps stuck writing to a client that does not read) and the notifier
    // (which holds the gateway) go with it, as do the session's parked rounds (with
    // `open`) and the calls in `tasks` (a `JoinSet` aborts its tasks when dropped).
    let _writer_ends = crate::util::AbortOnDrop(writer.abort_handle());
    let _notifier_ends = crate::util::AbortOnDrop(notifier.abort_handle());
    let calls: Arc<Mutex<InFlight<RequestId>>> = Arc::default();
    let listens = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // Cancelled when input ends: subscriptions send their final result.
    let closing = CancelToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    let mut reader = BufReader::new(input);
    let mut line = Vec::new();
    let large_calls = LargeLines::default();
    // The client closed its end of the output (a write failed): nobody hears an answer.
    let mut output_gone = false;
    loop {
        line.clear();
        // One long line's room is not kept for the session's life.
        line.shrink_to(64 << 10);
        // At the top, so that no way round the loop skips it (a refused listen's does).
        while tasks.try_join_next().is_some() {}
        // While the client does not read, its input may still end: a client that closes
        // its stdin and waits for the gateway to exit is let go (after the session's
        // write timeout), not held until a signal. Input that is there stays unread.
        let room = pipe.room();
        tokio::pin!(room);
        let mut input_ends = true;
        let ended = loop {
            tokio::select! {
                () = &mut room => break false,
                () = &mut shutdown => {
                    stopping = true;
                    break true;
                }
                begun = reader.fill_buf(), if input_ends => match begun {
                    Ok(b) if !b.is_empty() => input_ends = false,
                    _ => break true,
                },
            }
        };
        if ended {
            break;
        }
        if pipe.out.is_closed() {
            output_gone = true;
            break;
        }
        // Until the next line begins: a reload meanwhile applies to it.
        let begun = tokio::select! {
            begun = reader.fill_buf() => begun.map(|b| !b.is_empty()),
            () = &mut shutdown => {
                stopping = true;
                break;
            }
            () = pipe.out.closed() => {
                output_gone = true;
                break;
            }
        };
        if !matches!(begun, Ok(true)) {
            break;
        }
        // A line is a request body: held to max_body_bytes as the HTTP listener holds
        // one (read for each, as a reload may change it).
        let max_body = gateway.config().max_body_bytes;
        let longest = max_body.min(MAX_LINE);
        let budget = max_body.saturating_mul(super::http::LARGE_BODY_BUDGET);
        let mut limited = (&mut reader).take(longest as u64 + 1);
        let read = tokio::select! {
            read = limited.read_until(b'\n', &mut line) => read,
            () = &mut shutdown => {
                stopping = true;
                break;
            }
        };
        match read {
            Ok(0) | Err(_) => break,
            Ok(_) if line.len() > longest && line.last() != Some(&b'\n') => {
                // The rest is read past, not kept; the client hears why.
                let skipped = tokio::select! {
                    skipped = skip_line(&mut reader) => skipped,
                    () = &mut shutdown => {
                        stopping = true;
                        break;
                    }
                };
                let too_long = RpcError::new(
                    crate::protocol::error::INVALID_REQUEST,
                    format!(
                        "a message longer than {longest} bytes (max_body_bytes, at most 16 MiB)"
                    ),
                );
                match Message::peek_start(&line) {
                    // An answer to one of the gateway's questions: the question fails
                    // now, rather than wait out its time.
                    (Some(id), Some(true)) => pipe.pending.answer(&id, Err(too_long)),
                    (id, _) => {
                        pipe.send(&Message::Response(Response {
                            id,
                            outcome: Err(too_long),
                        }));
                    }
                }
                if !matches!(skipped, Ok(true)) {
                    break;
                }
                continue;
            }
            Ok(_) => {}
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        // Held with what it parses to, until its call ends.
        let large = match line.len() > super::http::LARGE_BODY {
            true => {
                let (id, reply) = Message::peek_head(&line).unwrap_or((None, false));
                if reply {
                    // An answer is handed to its question in this pass, and let go.
                    None
                } else if let Some(share) = large_calls.take(line.len(), budget) {
                    Some(share)
                } else {
                    pipe.send(&Message::Response(Response {
                        id,
                        outcome: Err(RpcError::new(
                            -32000,
                            format!(
                                "too many large requests in flight (their lines at most {budget} bytes together); try again"
                            ),
                        )),
                    }));
                    continue;
                }
            }
            false => None,
        };
        let message = match Message::parse(&line) {
            Ok(m) => m,
            Err(e) => {
                let refused = RpcError::new(e.code(), e.to_string());
                match Message::peek_id(&line) {
                    // A request whose id can be read hears under it.
                    Some((id, true)) => {
                        pipe.send(&Message::Response(Response {
                            id: Some(id),
                            outcome: Err(refused),
                        }));
                    }
                    // A malformed answer (no method: a misspelled result, say) to one
                    // of the gateway's questions fails it now, rather than leave it to
                    // wait out its time; a reply is not answered.
                    Some((id, false)) => pipe.pending.answer(&id, Err(refused)),
                    // No id to answer under: JSON-RPC's null.
                    None => {
                        pipe.send(&Message::Response(Response {
                            id: None,
                            outcome: Err(refused),
                        }));
                    }
                }
                continue;
            }
        };
        match message {
            Message::Response(r) => {
                if let Some(id) = r.id.as_ref() {
                    pipe.pending.answer(id, r.outcome);
                }
            }
            Message::Notification(n) => cancel(&calls, &n),
            Message::Request(request) if request.method == "initialize" => {
                let outcome =
                    gateway
                        .initialize(request.params.as_ref())
                        .map(|(result, client)| {
                            *session.lock() = Some(client);
                            result
                        });
                pipe.send(&Message::Response(Response {
                    id: Some(request.id),
                    outcome,
                }));
            }
            Message::Request(request) => {
                let modern = request
                    .params
                    .as_ref()
                    .and_then(|p| p.get("_meta"))
                    .and_then(|m| m.get(KEY_PROTOCOL_VERSION))
                    .is_some();
                let legacy = if modern { None } else { session.lock().clone() };
                let token = CancelToken::new();
                let ticket = calls
                    .lock()
                    .insert(id_key(&request.id), token.clone(), token.clone());
                if modern && request.method == "subscriptions/listen" {
                    let open = listens.fetch_add(1, Ordering::SeqCst);
                    let envelope = Gateway::check_envelope(&request).and_then(|_| {
                        if open >= super::http::MAX_LISTENS_PER_PRINCIPAL {
                            Err(RpcError::new(-32000, "too many subscriptions open"))
                        } else {
                            Ok(())
                        }
                    });
                    let listens = listens.clone();
                    let (gateway, principal, pipe, calls, closing) = (
                        gateway.clone(),
                        principal.clone(),
                        pipe.clone(),
                        calls.clone(),
                        closing.clone(),
                    );
                    tasks.spawn(async move {
                        let _large = large;
                        match envelope {
                            Ok(_) => {
                                listen(&gateway, &principal, &pipe, &request, token, closing).await
                            }
                            Err(e) => {
                                pipe.send(&Message::Response(Response {
                                    id: Some(request.id.clone()),
                                    outcome: Err(e),
                                }));
                            }
                        }
                        calls.lock().remove(&id_key(&request.id), ticket);
                        listens.fetch_sub(1, Ordering::SeqCst);
                    });
                    continue;
                }
                let (gateway, principal, pipe, calls) = (
                    gateway.clone(),
                    principal.clone(),
                    pipe.clone(),
                    calls.clone(),
                );
                let answering = Answering::new(&pipe.answering);
                // Boxed: the task then holds a pointer, not the ~8 KB future that tokio
                // would copy into its cell and again when it finishes.
                tasks.spawn(Box::pin(async move {
                    let _large = large;
                    let client = match &legacy {
                        Some(c) => Client::Legacy {
                            client: c,
                            peer: Some(pipe.as_ref()),
                        },
                        None => Client::Modern {
                            session: Some(session_id),
                        },
                    };
                    let (progress, forwarder) = match super::wants_progress(&request) {
                        true => {
                            let (tx, mut rx) = tokio::sync::mpsc::channel::<Value>(32);
                            let pipe = pipe.clone();
                            let forwarder = tokio::spawn(async move {
                                while let Some(p) = rx.recv().await {
                                    pipe.notify(Notification {
                                        method: "notifications/progress".into(),
                                        params: Some(p),
                                    });
                                }
                            });
                            (Some(tx), Some(forwarder))
                        }
                        false => (None, None),
                    };
                    let id = request.id.clone();
                    let given_up = token.clone();
                    let outcome = gateway
                        .handle(&principal, request, client, token, progress)
                        .await;
                    // The call is over, so its progress sender is gone: what it sent
                    // goes out before the result.
                    if let Some(f) = forwarder {
                        let _ = f.await;
                    }
                    calls.lock().remove(&id_key(&id), ticket);
                    drop(answering);
                    // A request its client cancelled is not answered, as both eras'
                    // cancellation pages ask of a receiver.
                    if !given_up.is_cancelled() {
                        pipe.send(&Message::Response(Response {
                            id: Some(id),
                            outcome,
                        }));
                    }
                }));
            }
        }
    }
    // Input ended: questions to the client fail at once (nobody can answer them),
    // subscriptions end, and the calls in flight finish and answer (their client may
    // still read). With the output gone they are cancelled, as a closed HTTP
    // connection's are: their effects would reach nobody.
    if output_gone {
        tracing::warn!(
            "the client closed its output; the session ends and its calls are cancelled"
        );
        calls.lock().cancel_all();
    }
    pipe.pending.clear();
    closing.cancel();
    // Its parked rounds were this session's alone, and nobody can resume them now:
    // their calls end here rather than hold the harness's shutdown for its grace (and
    // again below, for a call that parked while the others finished).
    gateway.drop_parked_of(&open);
    let drain = async { while tasks.join_next().await.is_some() {} };
    let mut drain = std::pin::pin!(drain);
    if !stopping {
        // A shutdown asked for while the calls finish (a SIGTERM after the input
        // ended) is heard too: it does not wait for them for ever.
        tokio::select! {
            () = &mut drain => {}
            () = &mut shutdown => stopping = true,
        }
    }
    if stopping {
        let drained = async {
            drain.await;
            gateway.drop_parked_of(&open);
        };
        tokio::join!(drained, gateway.harness().shutdown());
    } else {
        gateway.drop_parked_of(&open);
    }
    notifier.abort();
    drop(pipe);
    // A client that stops reading its last answers does not hold the end of the session
    // (and a SIGTERM's shutdown) for ever: as an HTTP connection, once nothing has been
    // written for `write_timeout` (a client that reads slowly gets them all).
    let quiet = gateway
        .config()
        .write_timeout
        .clamp(Duration::from_millis(1), crate::util::duration::LONGEST);
    let mut writer = writer;
    loop {
        let wrote = progress.notified();
        tokio::select! {
            _ = &mut writer => break,
            waited = tokio::time::timeout(quiet, wrote) => {
                if waited.is_err() {
                    tracing::warn!("the client stopped reading its last answers; ending the session");
                    writer.abort();
                    let _ = writer.await;
                    break;
                }
            }
        }
    }
}

/// One `subscriptions/listen` on the pipe: acknowledged, then the tool list changes of
/// servers the principal may use, tagged with its id, until the client cancels it or
/// the input ends; then its final result.
async fn listen(
    gateway: &Gateway,
    principal: &Principal,
    pipe: &Pipe,
    request: &Request,
    cancelled: CancelToken,
    closing: CancelToken,
) {
    let accepted = Gateway::listen_accepts(request.params.as_ref());
    let lists = Gateway::listen_lists(&accepted);
    let mut events = gateway.harness().subscribe();
    let mut views = gateway.views();
    pipe.send(&Gateway::listen_ack(&request.id, accepted));
    let mut owed = Owed::default();
    let notify = |method: &str| pipe.notify_message(&Gateway::listen_changed(&request.id, method));
    loop {
        let changed = tokio::select! {
            event = events.recv() => match &event {
                Ok(e) => gateway.changes(principal, e).intersect(lists),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => lists,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            },
            Ok(()) = views.changed() => Gateway::VIEW_CHANGED.intersect(lists),
            owed_now = owed.due() => owed_now,
            // The client ended it: nothing more is sent for it.
            () = cancelled.cancelled() => return,
            () = closing.cancelled() => break,
        };
        owed.send(changed, notify);
    }
    pipe.send(&Gateway::listen_end(&request.id));
}

/// `notifications/*/list_changed` to a legacy client when the harness reports a change
/// of its lists (2026-07-28 clients hold no session to notify).
async fn notify_changes(
    gateway: Gateway,
    principal: Principal,
    pipe: std::sync::Weak<Pipe>,
    session: Arc<Mutex<Option<LegacyClient>>>,
) {
    let mut events = gateway.harness().subscribe();
    let mut views = gateway.views();
    let mut owed = Owed::default();
    loop {
        let changed = tokio::select! {
            event = events.recv() => match event {
                Ok(e) => gateway.changes(&principal, &e),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => ListsChanged::ALL,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            },
            Ok(()) = views.changed() => Gateway::VIEW_CHANGED,
            // The pipe is not held meanwhile: the session's end is not held up by it.
            owed_now = owed.due() => owed_now,
        };
        let Some(pipe) = pipe.upgrade() else { return };
        if changed.any() && session.lock().is_some() {
            owed.send(changed, |method| {
                pipe.notify_message(&Message::Notification(Notification {
                    method: method.into(),
                    params: None,
                }))
            });
        }
    }
}

fn cancel(calls: &Mutex<InFlight<RequestId>>, n: &Notification) {
    if n.method != "notifications/cancelled" {
        return;
    }
    let id = n
        .params
        .as_ref()
        .and_then(|p| p.get("requestId"))
        .and_then(|v| serde_json::from_value::<RequestId>(v.clone()).ok());
    if let Some(id) = id {
        calls.lock().cancel(&id_key(&id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;

    /// A session over in-memory pipes of `pipe` bytes each, on a harness with no
    /// servers; the client's ends, the session, and the harness.
    async fn session(
        pipe: usize,
        write_timeout: Duration,
    ) -> (
        tokio::io::DuplexStream,
        tokio::io::DuplexStream,
        tokio::task::JoinHandle<()>,
        crate::HarnessHandle,
    ) {
        let gateway_config = super::super::GatewayConfig {
            write_timeout,
            ..Default::default()
        };
        session_with(pipe, gateway_config).await
    }

    /// A gateway with these settings on a harness with no servers, and agent `a`.
    async fn gateway_with(
        gateway_config: super::super::GatewayConfig,
    ) -> (Gateway, Principal, crate::HarnessHandle) {
        let config = crate::HarnessConfig::default();
        let harness = crate::Harness::spawn(config.clone())
            .await
            .expect("harness");
        let sealer =
            super::super::seal::Sealer::ephemeral(Duration::from_secs(60)).expect("sealer");
        let gateway = Gateway::new(harness.clone(), &config, gateway_config, sealer)
            .await
            .expect("gateway");
        let principal = Principal {
            agent: "a".into(),
            context: None,
        };
        (gateway, principal, harness)
    }

    /// [`session`] with these gateway settings.
    async fn session_with(
        pipe: usize,
        gateway_config: super::super::GatewayConfig,
    ) -> (
        tokio::io::DuplexStream,
        tokio::io::DuplexStream,
        tokio::task::JoinHandle<()>,
        crate::HarnessHandle,
    ) {
        let (gateway, principal, harness) = gateway_with(gateway_config).await;
        let (client_in, gateway_in) = tokio::io::duplex(pipe);
        let (gateway_out, client_out) = tokio::io::duplex(pipe);
        let served = tokio::spawn(serve(
            gateway,
            principal,
            gateway_in,
            gateway_out,
            std::future::pending(),
        ));
        (client_in, client_out, served, harness)
    }

    // A session whose future an embedder drops (a timeout) leaves nothing behind: not
    // its writer, stuck writing to a client that does not read, nor its notifier, which
    // held the gateway. Before, both lived on.
    #[tokio::test]
    async fn a_session_whose_future_is_dropped_leaves_no_task_holding_the_gateway() {
        let (gateway, principal, harness) = gateway_with(Default::default()).await;
        let weak = Arc::downgrade(&gateway.inner);
        let (mut client_in, gateway_in) = tokio::io::duplex(64);
        let (gateway_out, _client_out) = tokio::io::duplex(64);
        // Answers the client never reads: the writer blocks on the full pipe.
        let feeding = tokio::spawn(async move {
            let _ = client_in.write_all(&bad_lines()[..20_000]).await;
            client_in
        });
        let served = serve(
            gateway,
            principal,
            gateway_in,
            gateway_out,
            std::future::pending(),
        );
        assert!(
            tokio::time::timeout(Duration::from_millis(300), served)
                .await
                .is_err(),
            "the session is still on"
        );
        let gone = async {
            while weak.upgrade().is_some() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        assert!(
            tokio::time::timeout(Duration::from_secs(5), gone)
                .await
                .is_ok(),
            "a task of the dropped session still holds the gateway"
        );
        feeding.abort();
        harness.shutdown().await;
    }

    /// Each line is a parse error, answered with about 100 bytes: 600k lines would
    /// queue some 60 MB for a client that reads none of it.
    fn bad_lines() -> Vec<u8> {
        b"[\n".repeat(600_000)
    }

    /// Writes `lines` 4 KiB at a time until a write waits 2 s: how much was taken, and
    /// whether it stalled.
    async fn write_until_stalled(to: &mut tokio::io::DuplexStream, lines: &[u8]) -> (usize, bool) {
        let mut taken = 0;
        while taken < lines.len() {
            let chunk = &lines[taken..(taken + 4096).min(lines.len())];
            match tokio::time::timeout(Duration::from_secs(2), to.write_all(chunk)).await {
                Ok(written) => {
                    written.expect("write");
                    taken += chunk.len();
                }
                Err(_) => return (taken, true),
            }
        }
        (taken, false)
    }

    #[tokio::test]
    async fn a_client_that_does_not_read_its_answers_is_not_read_from_either() {
        let (mut client_in, mut client_out, served, harness) =
            session(64 << 10, Duration::from_secs(30)).await;
        let lines = bad_lines();
        let (taken, stalled) = write_until_stalled(&mut client_in, &lines).await;
        assert!(
            stalled,
            "the gateway kept reading from a client that reads nothing"
        );
        // About 16 MiB of answers (some 160k lines, 320 KB) and the pipes' buffers.
        assert!(taken < lines.len() / 2, "{taken} bytes taken");
        // Once the client reads, the rest of its input is taken and answered.
        let reader = tokio::spawn(async move {
            let mut answers = 0usize;
            let mut buf = vec![0u8; 1 << 20];
            loop {
                match tokio::io::AsyncReadExt::read(&mut client_out, &mut buf).await {
                    Ok(0) | Err(_) => return answers,
                    Ok(n) => answers += buf[..n].iter().filter(|b| **b == b'\n').count(),
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(120), client_in.write_all(&lines))
            .await
            .expect("the rest is read once the client reads")
            .expect("write");
        drop(client_in);
        tokio::time::timeout(Duration::from_secs(120), served)
            .await
            .expect("the session ends with its input")
            .expect("serve");
        let answers = reader.await.expect("reader");
        // All of the second write's lines, and what the first got in.
        assert!(answers >= 600_000, "{answers} answers");
        harness.shutdown().await;
    }

    /// A 2026-07-28 request line with id `id`, padded with `pad` bytes of params.
    fn modern_line(id: u64, method: &str, mut params: Value, pad: usize) -> Vec<u8> {
        params["_meta"] = serde_json::json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
        });
        params["pad"] = Value::String("x".repeat(pad));
        let mut line =
            serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
                .to_string()
                .into_bytes();
        line.push(b'\n');
        line
    }

    /// Reads answers from `out` until one has id `id`.
    async fn answer_to(out: &mut tokio::io::BufReader<tokio::io::DuplexStream>, id: u64) -> Value {
        next_where(out, |v| v["id"] == id).await
    }

    /// Reads messages from `out` until one is `wanted`.
    async fn next_where(
        out: &mut tokio::io::BufReader<tokio::io::DuplexStream>,
        wanted: impl Fn(&Value) -> bool,
    ) -> Value {
        use tokio::io::AsyncBufReadExt;
        let mut line = String::new();
        loop {
            line.clear();
            let read = tokio::time::timeout(Duration::from_secs(20), out.read_line(&mut line))
                .await
                .expect("an answer in time")
                .expect("read");
            assert!(read > 0, "the session ended");
            let v: Value = serde_json::from_str(&line).expect("JSON");
            if wanted(&v) {
                return v;
            }
        }
    }

    #[tokio::test]
    async fn a_reloaded_max_body_bytes_holds_the_next_line_of_a_running_session() {
        let config = crate::HarnessConfig::default();
        let harness = crate::Harness::spawn(config.clone())
            .await
            .expect("harness");
        let small = super::super::GatewayConfig {
            max_body_bytes: 1024,
            ..Default::default()
        };
        let sealer =
            || super::super::seal::Sealer::ephemeral(Duration::from_secs(60)).expect("sealer");
        let gateway = Gateway::new(harness.clone(), &config, small, sealer())
            .await
            .expect("gateway");
        let principal = Principal {
            agent: "a".into(),
            context: None,
        };
        let (mut client_in, gateway_in) = tokio::io::duplex(1 << 16);
        let (gateway_out, client_out) = tokio::io::duplex(1 << 16);
        let served = tokio::spawn(serve(
            gateway.clone(),
            principal,
            gateway_in,
            gateway_out,
            std::future::pending(),
        ));
        let mut out = tokio::io::BufReader::new(client_out);
        let line = modern_line(1, "tools/list", serde_json::json!({}), 2000);
        client_in.write_all(&line).await.expect("write");
        let refused = answer_to(&mut out, 1).await;
        assert!(
            refused["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("longer than 1024")),
            "{refused}"
        );
        let large = super::super::GatewayConfig {
            max_body_bytes: 1 << 20,
            ..Default::default()
        };
        gateway
            .reload(&config, large, sealer())
            .await
            .expect("reloaded");
        let line = modern_line(2, "tools/list", serde_json::json!({}), 2000);
        client_in.write_all(&line).await.expect("write");
        let listed = answer_to(&mut out, 2).await;
        assert!(listed["result"]["tools"].is_array(), "{listed}");
        drop(client_in);
        served.await.expect("session ends");
        harness.shutdown().await;
    }

    #[tokio::test]
    async fn large_lines_held_come_to_a_budget_past_which_they_are_answered_unparsed() {
        // Lines up to 256 KiB: those over 64 KiB held at once come to 1 MiB at most.
        let config = super::super::GatewayConfig {
            max_body_bytes: 256 << 10,
            ..Default::default()
        };
        let (mut client_in, client_out, served, harness) = session_with(1 << 20, config).await;
        let mut out = tokio::io::BufReader::new(client_out);
        let listen = serde_json::json!({"notifications": {"toolsListChanged": true}});
        // Four subscriptions of about 250 KB each stay open, holding what they parsed.
        for id in 1..=4 {
            let line = modern_line(id, "subscriptions/listen", listen.clone(), 250_000);
            client_in.write_all(&line).await.expect("write");
        }
        for _ in 0..4 {
            next_where(&mut out, |v| {
                v["method"] == "notifications/subscriptions/acknowledged"
            })
            .await;
        }
        // A fifth large line is answered with an error, by its id, without being parsed.
        let call = serde_json::json!({"name": "nope", "arguments": {}});
        client_in
            .write_all(&modern_line(9, "tools/call", call.clone(), 200_000))
            .await
            .expect("write");
        let refused = answer_to(&mut out, 9).await;
        let message = refused["error"]["message"].as_str().unwrap_or("");
        assert!(message.contains("too many large requests"), "{refused}");
        // A small one is served as ever.
        client_in
            .write_all(&modern_line(10, "tools/call", call.clone(), 0))
            .await
            .expect("write");
        assert!(
            answer_to(&mut out, 10).await["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.contains("too many large"))
        );
        // One subscription ends: its share is free, and the large call is read.
        let cancel = b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{\"requestId\":1}}\n";
        client_in.write_all(cancel).await.expect("write");
        let mut served_now = Value::Null;
        for id in 11..60 {
            client_in
                .write_all(&modern_line(id, "tools/call", call.clone(), 200_000))
                .await
                .expect("write");
            served_now = answer_to(&mut out, id).await;
            if !served_now.to_string().contains("too many large requests") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            served_now["error"]["message"], "unknown tool",
            "{served_now}"
        );
        drop(client_in);
        let _ = tokio::time::timeout(Duration::from_secs(30), served).await;
        harness.shutdown().await;
    }

    #[tokio::test]
    async fn a_client_that_closes_its_output_while_answers_wait_ends_its_session() {
        let (mut client_in, client_out, served, harness) =
            session(64 << 10, Duration::from_secs(30)).await;
        let lines = bad_lines();
        let (_, stalled) = write_until_stalled(&mut client_in, &lines).await;
        assert!(stalled, "waiting for the client to read");
        // The client closes its end of the output: the writer fails, and what waits
        // for room hears it. Nobody can hear an answer: the session ends, its input
        // open and unread. Before, the rest of its input was read and run.
        drop(client_out);
        tokio::time::timeout(Duration::from_secs(60), served)
            .await
            .expect("the session ends with its output")
            .expect("serve");
        drop(client_in);
        harness.shutdown().await;
    }

    // A message that does not parse is answered under its id when the id can be read
    // (JSON-RPC's null only when it cannot): its client is not left waiting.
    #[tokio::test]
    async fn a_malformed_request_is_answered_under_its_id() {
        use tokio::io::AsyncBufReadExt;
        let (mut client_in, client_out, served, harness) =
            session(64 << 10, Duration::from_secs(30)).await;
        client_in
            .write_all(b"{\"id\":7,\"method\":\"tools/call\"}\n{\"jsonrpc\":\"2.0\",\"id\":\n")
            .await
            .expect("write");
        let mut lines = tokio::io::BufReader::new(client_out).lines();
        let mut ids = Vec::new();
        for _ in 0..2 {
            let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
                .await
                .expect("answered")
                .expect("read")
                .expect("a line");
            let answer: Value = serde_json::from_str(&line).expect("JSON");
            assert!(answer.get("error").is_some(), "{answer}");
            ids.push(answer["id"].clone());
        }
        assert_eq!(ids, [serde_json::json!(7), Value::Null]);
        drop(client_in);
        let _ = tokio::time::timeout(Duration::from_secs(30), served).await;
        harness.shutdown().await;
    }

    // The output closed while the gateway waits for the next line: the session ends
    // then, not at the next line, and a call in flight is cancelled.
    #[tokio::test]
    async fn a_client_that_closes_its_output_between_lines_ends_its_session() {
        let (mut client_in, client_out, served, harness) =
            session(64 << 10, Duration::from_secs(30)).await;
        client_in.write_all(b"[\n").await.expect("write");
        drop(client_out);
        tokio::time::timeout(Duration::from_secs(60), served)
            .await
            .expect("the session ends once an answer cannot be written")
            .expect("serve");
        drop(client_in);
        harness.shutdown().await;
    }

    #[tokio::test]
    async fn the_session_ends_within_the_write_timeout_when_its_last_answers_are_not_read() {
        // Pipes of 64 bytes: one answer does not fit, and the client reads nothing.
        let (mut client_in, _client_out, served, harness) =
            session(64, Duration::from_millis(500)).await;
        client_in.write_all(b"[\n").await.expect("write");
        drop(client_in);
        tokio::time::timeout(Duration::from_secs(30), served)
            .await
            .expect("the session ended though its answer was never read")
            .expect("serve");
        harness.shutdown().await;
    }
}
