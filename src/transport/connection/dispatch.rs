//! The server's own traffic: answers `ping`, refuses requests from modern servers, and
//! hands the rest up as [`ServerEvent`]s without ever blocking on the layer above. It
//! starts once the handshake is done; a legacy server's pings during the handshake are
//! answered by the handshake ([`super::handshake::answering_pings`]).
//!
//! Legacy server requests are bounded: at most `max_server_requests` wait for an answer
//! at once (more are refused with a JSON-RPC error), and `elicitation/create` or
//! `sampling/createMessage` arriving while none of our calls is in flight on this
//! connection is refused unless the options allow it: a server must not ask a person
//! or spend model tokens on its own initiative. `roots/list` and `ping` are always
//! answered. Answers are sent on tasks of their own (at most [`MAX_REPLIES`] of the
//! dispatcher's at once; past that one waits up to [`REPLY_WAIT`] for room, then is
//! dropped and counted, as are the next ones at once until there is room): a server
//! slow to take them (an HTTP POST each) holds up its other traffic that long at most,
//! and a burst to a server that takes them at once is answered whole.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::Weak;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::options::{AskedDuring, Era, ServerEvent, ServerRequest};
use crate::protocol::error::{INTERNAL_ERROR, INVALID_REQUEST};
use crate::protocol::{Request, RpcError};
use crate::transport::Transport;
use crate::transport::inbound::{Inbound, Queued, Via};

/// Answers to pings and refusals being sent at once.
pub(super) const MAX_REPLIES: usize = 16;
/// How long an answer waits for room among them before it is dropped.
const REPLY_WAIT: Duration = Duration::from_millis(100);

/// A notification larger than this (as text) goes on to the events only when none
/// waits there unread (see `Dispatch::on_inbound`).
const EVENT_LARGE: usize = 16 << 10;

/// The server's requests being answered, by id: a ticket (which of them, should an id
/// come twice) and what cancels it.
pub(super) type BeingAnswered = Arc<
    parking_lot::Mutex<
        std::collections::HashMap<
            crate::protocol::RequestId,
            (u64, tokio_util::sync::CancellationToken),
        >,
    >,
>;

/// Our requests in flight on a legacy HTTP connection, by id, with whom each is for
/// ([`super::RequestOptions::owner`]).
pub(super) type Owners =
    Arc<parking_lot::Mutex<std::collections::HashMap<crate::protocol::RequestId, Option<u64>>>>;

/// Tickets of [`BeingAnswered`] entries.
static TICKETS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// What the dispatcher of one connection works with.
pub(super) struct Dispatch {
    pub(super) server: String,
    pub(super) transport: Weak<Transport>,
    pub(super) events: mpsc::Sender<ServerEvent>,
    pub(super) era: Era,
    pub(super) timeout: Duration,
    /// Our calls in flight on this connection (`tools/call`, `prompts/get`,
    /// `resources/read`).
    pub(super) calls_in_flight: Arc<AtomicUsize>,
    pub(super) answering: Arc<Semaphore>,
    /// The server's requests being answered (as many as `answering` lets in), each with
    /// what a `notifications/cancelled` of it cancels.
    pub(super) being_answered: BeingAnswered,
    /// Pings answered and requests refused whose answers are being sent.
    pub(super) replying: Arc<Semaphore>,
    /// Whether the last answer found no room within [`REPLY_WAIT`]: the next ones are
    /// dropped without waiting until there is room again.
    pub(super) congested: std::sync::atomic::AtomicBool,
    pub(super) allow_unsolicited_input: bool,
    pub(super) subscriptions: super::listen::Subscriptions,
    pub(super) owners: Owners,
    /// Server requests refused: each is logged at first, then at each power of two.
    pub(super) refused: crate::util::log_budget::LogBudget,
}

impl Drop for Dispatch {
    /// The connection is over: nobody will take an answer to the server's requests
    /// still being answered, so whoever answers them is told now (an approval leaves
    /// the queue) rather than at the request's timeout.
    fn drop(&mut self) {
        for (_, (_, token)) in self.being_answered.lock().drain() {
            token.cancel();
        }
    }
}

impl Dispatch {
    /// Handles `held` (what came during the handshake), then the channel, until the
    /// transport ends.
    pub(super) async fn run(self, held: Vec<Queued>, mut inbound: mpsc::Receiver<Queued>) {
        for queued in held {
            if self.on_inbound(queued).await.is_break() {
                return;
            }
        }
        while let Some(queued) = inbound.recv().await {
            if self.on_inbound(queued).await.is_break() {
                return;
            }
        }
    }

    async fn on_inbound(&self, queued: Queued) -> ControlFlow<()> {
        // Its bytes count against the channel's until it is handled.
        let Queued { message, charge } = queued;
        match message {
            Inbound::Request(request, via) => self.on_request(request, via).await,
            Inbound::Notification(n) => {
                let made_as = |id: &crate::protocol::RequestId| {
                    self.transport
                        .upgrade()
                        .map_or_else(|| id.clone(), |t| t.made_as(id))
                };
                if n.method == "notifications/cancelled"
                    && (self.cancelled(n.params.as_ref())
                        || self.subscriptions.end(n.params.as_ref(), made_as))
                {
                    return ControlFlow::Continue(());
                }
                let Err(n) = self.subscriptions.route(n, made_as) else {
                    return ControlFlow::Continue(());
                };
                // Its charge ends here, and the event channel holds 256 whatever their
                // size: a large one waits there only alone, so that an embedder slow to
                // read its events holds [`EVENT_LARGE`] bytes of text at most per event
                // but one (the harness reads them at once).
                if charge.bytes() > EVENT_LARGE
                    && self.events.capacity() < self.events.max_capacity()
                {
                    tracing::debug!(
                        server = %self.server,
                        bytes = charge.bytes(),
                        "large server notification dropped: events wait unread"
                    );
                    return ControlFlow::Continue(());
                }
                if self.events.try_send(ServerEvent::Notification(n)).is_err() {
                    tracing::debug!(
                        server = %self.server,
                        "server notification dropped: event channel full or closed"
                    );
                }
            }
            Inbound::Closed(error) => {
                let _ = self.events.send(ServerEvent::Closed(error)).await;
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    }

    /// The server gave up one of its requests (`notifications/cancelled`): whoever
    /// answers it stops (an approval leaves the queue), and no answer is sent, as the
    /// spec asks. False when it names none being answered.
    fn cancelled(&self, params: Option<&Value>) -> bool {
        let Some(id) = params
            .and_then(|p| p.get("requestId"))
            .and_then(|id| serde_json::from_value::<crate::protocol::RequestId>(id.clone()).ok())
        else {
            return false;
        };
        match self.being_answered.lock().remove(&id) {
            Some((_, token)) => {
                token.cancel();
                true
            }
            None => false,
        }
    }

    /// Logs a refusal of the server's request `named` (cut and escaped), unless the
    /// server has been refused so often that this one is only counted.
    fn refused_warn(&self, named: &str, why: &str) {
        if let Some(refused) = self.refused.log() {
            tracing::warn!(server = %self.server, method = %named, refused, "{why}");
        }
    }

    async fn refuse(&self, id: crate::protocol::RequestId, error: RpcError, as_: Option<Arc<str>>) {
        self.reply(id, Err(error), as_).await;
    }

    /// Sends an answer on a task of its own, once fewer than [`MAX_REPLIES`] are being
    /// sent; after [`REPLY_WAIT`] without room it is dropped (the server is not taking
    /// them, and waiting longer would stall what else it sends), and so is every
    /// answer after it until one of those being sent is done.
    async fn reply(
        &self,
        id: crate::protocol::RequestId,
        outcome: Result<Value, RpcError>,
        as_: Option<Arc<str>>,
    ) {
        let permit = match self.replying.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) if self.congested.load(Ordering::Relaxed) => None,
            Err(_) => {
                let room = self.replying.clone().acquire_owned();
                tokio::time::timeout(REPLY_WAIT, room)
                    .await
                    .ok()
                    .and_then(Result::ok)
            }
        };
        self.congested.store(permit.is_none(), Ordering::Relaxed);
        let Some(permit) = permit else {
            self.refused_warn(
                "(answer)",
                "answers to this server's pings and refused requests are not being taken; one dropped",
            );
            return;
        };
        let weak = self.transport.clone();
        let timeout = self.timeout;
        tokio::spawn(async move {
            if let Some(t) = weak.upgrade() {
                let _ = t.respond(id, outcome, timeout, as_.as_deref()).await;
            }
            drop(permit);
        });
    }

    /// Which of our requests the server's request came during: the one whose stream
    /// carried it, if that one is still in flight.
    fn during(&self, via: Option<&crate::protocol::RequestId>) -> AskedDuring {
        let Some(id) = via else {
            return AskedDuring::Unknown;
        };
        match self.owners.lock().get(id) {
            Some(&owner) => AskedDuring::Request { owner },
            None => AskedDuring::Ended,
        }
    }

    /// Handles a server's request, answered as the one whose stream carried it.
    async fn on_request(&self, request: Request, via: Via) {
        let Request { id, method, params } = request;
        let during = self.during(via.during.as_ref());
        let as_ = via.identity;
        // The server's own words, for logs and for the refusals sent back to it.
        let named = crate::util::text::one_line(&method, 100);
        if self.era == Era::Modern {
            // Over HTTP a 2026-07-28 client never POSTs a response (the spec's
            // requests all carry a method): the request is dropped, unanswered.
            if self.transport.upgrade().is_some_and(|t| t.is_http()) {
                return self.refused_warn(
                    &named,
                    "modern server sent a request; dropped (2026-07-28 servers must not)",
                );
            }
            self.refused_warn(
                &named,
                "modern server sent a request; refused (2026-07-28 servers must not)",
            );
            let error = RpcError::new(
                INVALID_REQUEST,
                "servers must not send requests in protocol 2026-07-28",
            );
            return self.refuse(id, error, as_).await;
        }
        if method == "ping" {
            return self.reply(id, Ok(json!({})), as_).await;
        }
        let asks_a_person_or_a_model = matches!(
            method.as_str(),
            "elicitation/create" | "sampling/createMessage"
        );
        if asks_a_person_or_a_model
            && !self.allow_unsolicited_input
            && self.calls_in_flight.load(Ordering::SeqCst) == 0
        {
            self.refused_warn(&named, "server asked for input outside any call; refused");
            let error = RpcError::new(
                INVALID_REQUEST,
                format!("{named} is only answered during a call this client made"),
            );
            return self.refuse(id, error, as_).await;
        }
        // An id used again while its first is being answered: refused (JSON-RPC ids
        // are unique among a sender's requests in progress). Taken, the first could no
        // longer be cancelled, nor withdrawn when the connection ends.
        if self.being_answered.lock().contains_key(&id) {
            self.refused_warn(
                &named,
                "a request under an id still being answered; refused",
            );
            let error = RpcError::new(
                INVALID_REQUEST,
                "a request with this id is already in progress",
            );
            return self.refuse(id, error, as_).await;
        }
        let Ok(permit) = self.answering.clone().try_acquire_owned() else {
            self.refused_warn(
                &named,
                "too many server requests waiting for answers; refused",
            );
            let error = RpcError::new(INTERNAL_ERROR, "too many requests in progress; try later");
            return self.refuse(id, error, as_).await;
        };
        let (reply, answer) = oneshot::channel();
        let given_up = tokio_util::sync::CancellationToken::new();
        let event = ServerEvent::Request(ServerRequest {
            method: method.clone(),
            params: params.unwrap_or(Value::Null),
            outside_calls_allowed: self.allow_unsolicited_input,
            during,
            answer_by: crate::util::duration::after(std::time::Instant::now(), self.timeout),
            reply,
        });
        if self.events.try_send(event).is_err() {
            self.refused_warn(&named, "no capacity to handle a server request; refused");
            // Not "method not found": the client has the method, and the server
            // should not stop asking for good.
            let error = RpcError::new(INTERNAL_ERROR, format!("client cannot handle {named} now"));
            return self.refuse(id, error, as_).await;
        }
        let weak = self.transport.clone();
        let timeout = self.timeout;
        // The entry is this request's alone: a later one under its id (once this one
        // is answered) takes the place, and this one's end does not remove it.
        let ticket = TICKETS.fetch_add(1, Ordering::Relaxed);
        self.being_answered
            .lock()
            .insert(id.clone(), (ticket, given_up.clone()));
        let being_answered = self.being_answered.clone();
        let server = self.server.clone();
        tokio::spawn(async move {
            let outcome = tokio::select! {
                outcome = tokio::time::timeout(timeout, answer) => match outcome {
                    Ok(Ok(outcome)) => Some(outcome),
                    _ => Some(Err(RpcError::new(INTERNAL_ERROR, "the client did not answer"))),
                },
                // Dropping `answer` tells whoever answers that nobody waits.
                () = given_up.cancelled() => None,
            };
            {
                let mut answered = being_answered.lock();
                if answered.get(&id).is_some_and(|(t, _)| *t == ticket) {
                    answered.remove(&id);
                }
            }
            // Held until the answer is sent: over HTTP that is a POST the server may
            // keep open, and answers sent at once stay as few as those being made.
            if let Some(outcome) = outcome
                && let Some(t) = weak.upgrade()
                && let Err(e) = t.respond(id, outcome, timeout, as_.as_deref()).await
            {
                // A server that stops reading (or whose answers' POSTs fail) and keeps
                // asking would have one line per request.
                static UNSENT: crate::util::log_budget::LogBudget =
                    crate::util::log_budget::LogBudget::new();
                if let Some(unsent) = UNSENT.log() {
                    tracing::warn!(server = %server, error = %e, unsent, "an answer to the server's request could not be sent");
                }
            }
            drop(permit);
        });
    }
}
