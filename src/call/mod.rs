//! One call, step by step (design.md, "One call"): admit and audit, authorize and route,
//! send, drive `input_required` rounds through the input handlers under the round cap,
//! fail over when that is safe, audit the outcome, answer.
//!
//! [`run`] is the whole path as one async fn; each step is a named fn below it, in
//! order. It runs in its caller's task, under a call worker's cancellation token
//! ([`pool`]).
//!
//! MRTR, as the spec says: each round's input requests are checked against what was
//! declared ([`rounds::check`]), then go to the handler of their method in parallel;
//! answers come back under the same keys; the retry is the same method with the original
//! params plus `inputResponses` and `requestState` echoed as received (never parsed;
//! absent if the server sent none), under a new JSON-RPC id (the connection numbers
//! every request). Rounds that carry only `requestState` are paced 50 ms doubling to
//! 250 ms. The cap counts every round of the logical call, failover included. A call
//! that fails over starts its rounds afresh: `requestState` belongs to the server that
//! issued it. A grant revoked while a call waits on input or fails over stops its next
//! round or hop. One deadline (`call_timeout`, or the call's own) bounds it all.

mod caller;
mod catalog;
mod client_side;
mod context;
mod error;
mod flights;
pub mod input;
mod listed;
mod listing;
mod metrics;
mod pool;
mod progress;
mod record;
mod rounds;
mod route;
mod search;
mod settings;
mod telemetry;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

pub use caller::{CallKind, Caller, ListKind};
pub use catalog::ToolInfo;
pub use error::{CallError, Unreachable};
pub use listing::Listing;
pub use metrics::{BUCKETS, CallSeries, quantile};
pub use pool::CancelToken;
pub(crate) use pool::{CallPool, CallSupervisor};
pub(crate) use progress::ProgressRouter;
pub use progress::ProgressSender;
pub(crate) use search::SearchIndex;
pub use search::ToolMatch;
pub use settings::{CallConfig, Limits};
pub(crate) use telemetry::failed as mark_failed;

pub(crate) use client_side::HarnessClient;
pub(crate) use context::CallContext;
use context::InFlight;
pub(crate) use listing::{list, may_offer};
pub(crate) use route::{resource_name, route, split_for};

use crate::protocol::{InputRequired, ProtocolError, ResultType};
use crate::server::{OutgoingRef, ServerError, StillWanted};
use crate::transport::TransportError;
use crate::util::trace_context::call_span;
use input::HandlerSet;
use record::CallRecord;
use route::Candidate;

/// One call as asked.
pub(crate) struct CallRequest {
    /// Who calls.
    pub caller: Caller,
    /// Tool, prompt or resource.
    pub kind: CallKind,
    /// The name (qualified or bare) or uri.
    pub name: String,
    /// The arguments (taken by [`run`] once its `started` record holds them).
    pub args: Value,
    /// The call's own deadline, instead of `call_timeout`.
    pub timeout: Option<Duration>,
    /// The caller answers the input rounds itself (a gateway's downstream client).
    pub delegated: Option<Delegation>,
    /// The caller's span when it asked: the call's span is its child wherever the call's
    /// future is polled (so an embedder's or a gateway's trace goes on through it).
    pub parent: tracing::Span,
    /// The trace context to go on under instead of `parent`'s (`CallOptions::trace_parent`).
    pub trace_parent: Option<opentelemetry::Context>,
    /// Whether the call's spans are exported, when the caller decided it.
    pub traced: Option<bool>,
    /// The last progress its servers gave, across its attempts (when its caller asked
    /// for progress).
    pub progress_last: Option<progress::ProgressLast>,
}

/// A call whose `input_required` rounds go back to the caller instead of the input
/// handlers: the first `input_required` result ends the call (as [`Answer::input_required`]),
/// and the caller continues it with another call carrying the answers.
#[derive(Clone, Debug, Default)]
pub struct Delegation {
    /// What the caller can answer: declared to a modern server in place of the
    /// handlers', and what a legacy server's own questions during the call are held to
    /// before they reach [`Delegation::questions`].
    pub capabilities: Value,
    /// The answers to the previous round, keyed as the server asked.
    pub input_responses: Option<Map<String, Value>>,
    /// The previous round's `requestState`, as that server issued it.
    pub request_state: Option<String>,
    /// Rounds the logical call has already had (the round cap counts them all).
    pub rounds: usize,
    /// The server whose round this continues: the call goes there or nowhere (a
    /// `requestState` belongs to the server that issued it). Required when the call
    /// continues a round ([`CallError::RoundWithoutServer`] otherwise).
    pub server: Option<String>,
    /// What that server must still be ([`Answer::server_identity`]): one of its id that
    /// is now another (a reload pointed the id elsewhere) is no route, as the round's
    /// state and answers are the first one's.
    pub server_identity: Option<String>,
    /// Where the servers' progress of this call goes, and the caller's token for it:
    /// each update's params with the spec's fields only, its `progress` increasing.
    pub progress: Option<(ProgressSender, Value)>,
    /// Where a legacy server's own `elicitation/create` requests during this call go,
    /// for the caller to answer (a gateway asks its downstream client), each held to
    /// [`Delegation::capabilities`] first (one it does not declare, a mode it does not
    /// name, is answered -32602 and never sent here); without it they go to the input
    /// handlers.
    pub questions: Option<tokio::sync::mpsc::Sender<ServerQuestion>>,
}

impl Delegation {
    /// Whether this continues a round (it carries answers or a `requestState`), which
    /// then belongs to [`Delegation::server`].
    pub fn continues(&self) -> bool {
        self.input_responses.is_some() || self.request_state.is_some()
    }
}

/// A legacy server's own request during a delegated call, for the caller to answer.
#[derive(Debug)]
pub struct ServerQuestion {
    /// The server asking.
    pub server: String,
    /// The method (`elicitation/create`).
    pub method: String,
    /// Its params, as sent.
    pub params: Value,
    /// Where the answer goes (an error is sent to the server as its error).
    pub reply: tokio::sync::oneshot::Sender<Result<Value, crate::protocol::RpcError>>,
}

/// How a call ended, short of an error: its result and the server that gave it.
#[derive(Clone, Debug)]
pub struct Answer {
    /// The server's result, as sent.
    pub result: Value,
    /// The server that served the call.
    pub server: Arc<str>,
    /// The result is `input_required` (only for delegated calls; others drive rounds).
    pub input_required: bool,
    /// Rounds the logical call has had, this one included.
    pub rounds: usize,
    /// What the server that answered is ([`crate::ServerConfig::identity`]), when the
    /// answer is `input_required`: a continuation that names it
    /// ([`Delegation::server_identity`]) goes to that very server, not to another a
    /// reload put under its id meanwhile.
    pub server_identity: Option<Arc<str>>,
}

/// The call's one deadline.
#[derive(Clone, Copy)]
struct Deadline {
    at: Instant,
    total: Duration,
}

impl Deadline {
    fn after(now: Instant, total: Duration) -> Deadline {
        Deadline {
            at: crate::util::duration::after(now, total),
            total,
        }
    }

    fn remaining(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }

    /// A request's timeout: the server's own, never past the call's deadline.
    fn for_request(&self, server_timeout: Duration) -> Result<Duration, CallError> {
        let left = self.remaining();
        if left.is_zero() {
            return Err(CallError::DeadlineExceeded(self.total));
        }
        Ok(server_timeout.min(left))
    }
}

/// Admits a call counted in flight (`in_flight`, [`CallContext::enter`]) and writes its
/// `started` record: the guard, which counts it until its `finished` one is written,
/// and its record.
fn begin<'a>(
    ctx: &CallContext,
    request: &CallRequest,
    in_flight: InFlight<'a>,
) -> Result<(InFlight<'a>, CallRecord), CallError> {
    ctx.audit.admit()?;
    let record = CallRecord::start(
        &ctx.audit,
        &ctx.metrics,
        ctx.next_call_id(),
        &request.caller,
        request.kind,
        &request.name,
        &request.args,
    );
    Ok((in_flight, record))
}

/// A call refused before it began (cancelled, or its worker gone): its two records, the
/// second `cancelled` (written as the unfinished record drops, as for a call dropped
/// half-way), and nothing routed or sent.
pub(crate) fn refuse(
    ctx: &CallContext,
    request: &CallRequest,
    in_flight: InFlight<'_>,
) -> Result<(), CallError> {
    let (_in_flight, record) = begin(ctx, request, in_flight)?;
    drop(record);
    Ok(())
}

/// Runs one call end to end. Exactly one `started` and one `finished` audit record,
/// whatever happens (a call dropped half-way records `cancelled`).
// An async block, not an async fn: a fn's arguments are moved into its body, and the
// request (320 bytes) sat in the call's future twice.
#[allow(clippy::manual_async_fn)]
pub(crate) fn run<'a>(
    ctx: &'a Arc<CallContext>,
    mut request: CallRequest,
    in_flight: InFlight<'a>,
) -> impl Future<Output = Result<Answer, CallError>> + Send + 'a {
    async move {
        let (_in_flight, mut record) = begin(ctx, &request, in_flight)?;
        let call_id = record.call_id();
        // From the record's start: one clock read for both.
        let total = request.timeout.unwrap_or(ctx.settings.call_timeout);
        let deadline = Deadline::after(record.started(), total);
        // Moved into the params the call sends, once: they are lent to each request and
        // changed in place between rounds; copied only for a request that carries trace
        // context or waits in a server's queue for its restart.
        let args = std::mem::take(&mut request.args);
        let method = request.kind.method();
        // Named and described by the OpenTelemetry conventions for MCP (exported when an
        // OpenTelemetry layer is installed; plain fields otherwise).
        let traced = request
            .traced
            .unwrap_or_else(|| match &request.trace_parent {
                Some(cx) => ctx.sampler.in_context(cx),
                None => ctx.sampler.under(&request.parent),
            });
        record.traced = traced;
        // Fixed now: an untraced call's spans carry no context, and the span current
        // when its requests are sent is its poller's.
        let passes = crate::util::trace_context::call_context(
            traced,
            &request.parent,
            request.trace_parent.as_ref(),
        );
        let span = call_span!(
            traced: traced,
            parent: &request.parent,
            "call",
            call_id,
            agent = request.caller.agent_id.as_deref(),
            name = telemetry::target(request.kind, &request.name),
            otel.name = %telemetry::name(request.kind, &request.name),
            otel.kind = "internal",
            otel.status_code = tracing::field::Empty,
            mcp.method.name = method,
            error.type = tracing::field::Empty,
        );
        if let Some(cx) = request.trace_parent.take()
            && !span.is_disabled()
        {
            use tracing_opentelemetry::OpenTelemetrySpanExt;
            let _ = span.set_parent(cx);
        }
        // No timer of its own: every wait below is bounded by what is left of the deadline.
        let work = async {
            let routing = call_span!(
                traced: traced,
                "route",
                otel.name = %crate::util::trace_context::span_name("route", request.kind != CallKind::Resource, &request.name),
            );
            let pinned = request.delegated.as_ref().and_then(|d| d.server.as_deref());
            if pinned.is_none()
                && request
                    .delegated
                    .as_ref()
                    .is_some_and(Delegation::continues)
            {
                return Err(CallError::RoundWithoutServer);
            }
            let candidates = match pinned {
                // A resource read's round goes back to its server, as a tool's does by its
                // qualified name: the others are neither listed again nor needed
                // reachable (one that is not would leave a URI no list names unrouted).
                Some(server) if request.kind == CallKind::Resource => {
                    let _routing = routing.enter();
                    route::resource_on(ctx, &request.caller, server, &request.name)?
                }
                _ => {
                    tracing::Instrument::instrument(
                        route(
                            ctx,
                            &request.caller,
                            request.kind,
                            &request.name,
                            deadline.at,
                        ),
                        routing,
                    )
                    .await?
                }
            };
            let mut candidates = candidates;
            if let Some(pinned) = request.delegated.as_ref().and_then(|d| d.server.as_deref()) {
                let identity = request
                    .delegated
                    .as_ref()
                    .and_then(|d| d.server_identity.as_deref());
                candidates.retain(|c| {
                    c.server.id() == pinned && identity.is_none_or(|i| **c.server.identity() == *i)
                });
                if candidates.is_empty() {
                    return Err(CallError::NoRoute {
                        tool: request.name.clone(),
                        unreachable: Vec::new(),
                    });
                }
            }
            record.candidates = candidates.len();
            Box::pin(drive(
                ctx,
                &request,
                args,
                &candidates,
                deadline,
                &mut record,
            ))
            .await
        };
        let work = tracing::Instrument::instrument(work, span.clone());
        let outcome = match passes {
            Some(cx) => opentelemetry::context::FutureExt::with_context(work, cx).await,
            None => work.await,
        };
        let outcome = match outcome {
            Err(e) if deadline.remaining().is_zero() && ran_out(&e) => {
                Err(CallError::DeadlineExceeded(deadline.total))
            }
            outcome => outcome,
        };
        match &outcome {
            Err(e) => telemetry::failed(&span, &telemetry::error_type(e)),
            Ok(answer) if telemetry::tool_error(&span, &answer.result) => {
                telemetry::failed(&span, "tool_error")
            }
            Ok(_) => {}
        }
        record.finish(&outcome);
        outcome
    }
}

/// What a call has asked its caller (or its handlers) for so far, on every server it
/// tried: each counts against `round_cap`, so that failing over does not start the
/// count again.
struct Asked {
    /// `input_required` rounds (a delegation's count comes from its caller).
    rounds: usize,
    /// Questions legacy servers asked during the call (modern servers ask none; made
    /// for every call, so that its record holds them however the call ends).
    questions: Arc<context::Questions>,
}

/// How one attempt on one server ended, short of a result.
enum Attempt {
    /// The call ends with this error.
    Final(CallError),
    /// The server failed; another may serve the call if that is safe.
    ServerFailed(ServerError),
}

impl From<CallError> for Attempt {
    fn from(e: CallError) -> Attempt {
        Attempt::Final(e)
    }
}

/// Sends the call to each candidate in turn, driving its rounds, failing over when
/// the request provably never reached the server or the tool is retry-safe; the
/// questions servers ask during it go in its record.
async fn drive(
    ctx: &Arc<CallContext>,
    request: &CallRequest,
    args: Value,
    candidates: &[Candidate<'_>],
    deadline: Deadline,
    record: &mut CallRecord,
) -> Result<Answer, CallError> {
    let rounds = request.delegated.as_ref().map_or(0, |d| d.rounds);
    let mut asked = Asked {
        rounds,
        questions: Arc::new(context::Questions::after(rounds)),
    };
    // Read when the record is written, however the call ends (dropped half-way too).
    record.questions(asked.questions.clone());
    let mut last_error = None;
    let mut params = request.kind.params(args);
    for (i, candidate) in candidates.iter().enumerate() {
        // Before the grant's check: a denial at this hop is recorded against this
        // server, not the one before.
        record.server = Some(candidate.server.clone());
        if i > 0 {
            still_allowed(ctx, request, candidate)?;
            // A server's rounds start afresh: state and answers belong to the server
            // before (the first server's params have none yet).
            clear_round(&mut params);
        }
        let span = telemetry::attempt_span(
            request.kind,
            candidate.item,
            &candidate.server,
            record.traced,
        );
        let tried = tracing::Instrument::instrument(
            attempt(
                ctx,
                request,
                candidate,
                &mut params,
                deadline,
                &mut asked,
                record,
            ),
            span.clone(),
        )
        .await;
        match &tried {
            Err(Attempt::Final(e)) => telemetry::failed(&span, &telemetry::error_type(e)),
            Err(Attempt::ServerFailed(e)) => {
                telemetry::failed(&span, &telemetry::server_error_type(e))
            }
            Ok((result, _)) if telemetry::tool_error(&span, result) => {
                telemetry::failed(&span, "tool_error")
            }
            Ok(_) => {}
        }
        let error = match tried {
            Ok((result, input_required)) => {
                return Ok(Answer {
                    result,
                    server: candidate.server.shared_id(),
                    server_identity: input_required.then(|| candidate.server.identity().clone()),
                    input_required,
                    rounds: asked.rounds,
                });
            }
            Err(Attempt::Final(e)) => return Err(e),
            Err(Attempt::ServerFailed(e)) => e,
        };
        if let ServerError::MissingCapability { server, required } = error {
            return Err(CallError::MissingCapability { server, required });
        }
        if let ServerError::Withdrawn { .. } = error {
            // Its grant was revoked while it waited for the server: said as a refusal.
            still_allowed(ctx, request, candidate)?;
        }
        // A continued round never moves: its state and answers are that server's.
        let continued = request
            .delegated
            .as_ref()
            .is_some_and(Delegation::continues);
        let more = i + 1 < candidates.len() && !continued;
        let safe = error.never_sent()
            || (candidate.retry_safe
                && matches!(
                    error,
                    ServerError::TransportClosed { .. } | ServerError::Transport { .. }
                ))
            || (candidate.guessed && says_not_here(&error));
        // With no time left there is no next server to try.
        if more && safe && !deadline.remaining().is_zero() {
            // The error's type, not its text: a server's message may quote what was
            // asked (a resource's URI, which no span carries); the audit record has it.
            tracing::info!(server = %candidate.server.id(), error.type = %telemetry::server_error_type(&error), "failing over to the next server");
            record.hop(candidate.server.id(), error.to_string());
            last_error = Some(error);
            continue;
        }
        return Err(error.into());
    }
    Err(last_error
        .map(CallError::from)
        .unwrap_or_else(|| CallError::NoRoute {
            tool: request.name.clone(),
            unreachable: Vec::new(),
        }))
}

/// Whether a server asked for a resource no list named answered that it has no such
/// resource (or none at all). Anything else, a timeout say, is its answer: the read
/// ends there rather than take the URI to yet another server.
fn says_not_here(error: &ServerError) -> bool {
    use crate::protocol::error::{INVALID_PARAMS, METHOD_NOT_FOUND, RESOURCE_NOT_FOUND};
    matches!(error, ServerError::Rpc { error, .. }
        if matches!(error.code, RESOURCE_NOT_FOUND | INVALID_PARAMS | METHOD_NOT_FOUND))
}

/// Whether `e`, with the call's deadline past, is that deadline running out in one of
/// the steps it bounds: a request's timeout, a wait for a restarting server, a listing
/// to route by that some server did not answer (a handler cut off is told apart where
/// its round is gathered). A server's answer or a person's is the call's outcome,
/// however late; so is a tool that no server offers.
fn ran_out(e: &CallError) -> bool {
    match e {
        // `NotSent`: a stdio server that did not read its stdin before the deadline.
        CallError::Server(
            ServerError::Transport {
                source: TransportError::Timeout(_) | TransportError::NotSent(_),
                ..
            }
            | ServerError::Restarting { .. },
        ) => true,
        CallError::NoRoute { unreachable, .. } => !unreachable.is_empty(),
        _ => false,
    }
}

/// How often a call waiting for its round's answers checks that its grant still holds.
pub(crate) const GRANT_RECHECK: Duration = Duration::from_millis(250);

/// A grant revoked while the call waited (on input, or before a hop) stops it here.
fn still_allowed(
    ctx: &CallContext,
    request: &CallRequest,
    candidate: &Candidate<'_>,
) -> Result<(), CallError> {
    let agent = request.caller.agent_id.as_deref();
    if ctx.allows(agent, &candidate.server, candidate.item) {
        return Ok(());
    }
    Err(CallError::Denied {
        agent: agent.map(String::from),
        server: Some(candidate.server.id().to_string()),
        tool: candidate.item.to_string(),
    })
}

/// The call on one server: send, and answer `input_required` rounds until complete
/// (or, delegated, until the first round, which goes back to the caller: `true`).
/// `params` are the call's (its arguments; `drive` has taken out the round of any
/// server before): made this server's here (its name for the item), then changed in
/// place for each round.
async fn attempt(
    ctx: &Arc<CallContext>,
    request: &CallRequest,
    candidate: &Candidate<'_>,
    params: &mut Map<String, Value>,
    deadline: Deadline,
    asked: &mut Asked,
    record: &mut CallRecord,
) -> Result<(Value, bool), Attempt> {
    let server = &candidate.server;
    let handlers = ctx.inputs.snapshot();
    // A legacy server's own requests while this call's request is on it are this
    // call's; the server notes the call only then (a modern connection refuses them).
    let call_id = record.call_id();
    let Asked { rounds, questions } = asked;
    let asks = request.delegated.as_ref().and_then(|d| {
        Some(context::CallerAsks {
            to: d.questions.clone()?,
            declared: Arc::new(d.capabilities.clone()),
        })
    });
    let note = || {
        ctx.on_server(
            server.id(),
            (call_id, deadline.at),
            request.caller.agent_id.clone(),
            candidate.item,
            asks.clone(),
            questions.clone(),
        )
    };
    request.kind.set_item(params, candidate.item);
    // The call's progress token, for every request of it (a retry is the same call).
    let progress = request
        .delegated
        .as_ref()
        .and_then(|d| d.progress.clone())
        .map(|(to, token)| {
            let last = request.progress_last.clone().unwrap_or_default();
            ctx.progress.register(server.id(), to, token, last)
        });
    let with_token = |params: &mut Map<String, Value>| {
        if let Some(p) = &progress {
            let meta = params
                .entry("_meta")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(meta) = meta.as_object_mut() {
                meta.insert("progressToken".into(), Value::String(p.token.clone()));
            }
        }
    };
    with_token(params);
    let capabilities = match &request.delegated {
        Some(d) => {
            if let Some(answers) = &d.input_responses {
                params.insert(INPUT_RESPONSES.into(), Value::Object(answers.clone()));
            }
            if let Some(state) = &d.request_state {
                params.insert(REQUEST_STATE.into(), Value::String(state.clone()));
            }
            &d.capabilities
        }
        None => handlers.capabilities(),
    };
    // A request that must wait for its server (restarting) asks, before it goes out,
    // whether the call may still use it: a grant revoked meanwhile withdraws it.
    let still_wanted = || -> StillWanted {
        let (ctx, server) = (ctx.clone(), server.clone());
        let (agent, item) = (request.caller.agent_id.clone(), candidate.item.to_string());
        Arc::new(move || ctx.allows(agent.as_deref(), &server, &item))
    };
    let mut state_only_rounds = 0u32;
    loop {
        let timeout = deadline.for_request(server.config().timeout)?;
        // Lent whole to the request and taken back for the next round: nothing may
        // return between the two.
        let sent = Value::Object(std::mem::take(params));
        // Boxed, as `run` boxes the rest of the call's future: each box stays under
        // 1 KiB (glibc's per-thread cache); one box of the whole took its slow path.
        let outgoing = OutgoingRef {
            method: request.kind.method(),
            params: Some(&sent),
            timeout: Some(timeout),
            capabilities: Some(capabilities),
            identity: request.caller.auth_context.as_deref(),
            owner: Some(call_id),
            still_wanted: Some(&still_wanted),
        };
        let result = Box::pin(server.request_noting(outgoing, note)).await;
        if let Value::Object(map) = sent {
            *params = map;
        }
        let result = result.map_err(Attempt::ServerFailed)?;
        match ResultType::of(&result).map_err(|e| protocol(server.id(), e))? {
            ResultType::Complete => return Ok((result, false)),
            ResultType::InputRequired => {}
        }
        // Saturating: a delegation's count comes from the caller. With the questions
        // legacy servers asked before it failed over here: one cap for the call.
        *rounds = rounds.saturating_add(1);
        questions.set_rounds(*rounds);
        if rounds.saturating_add(questions.asked_so_far()) > ctx.settings.round_cap {
            return Err(CallError::RoundCap {
                cap: ctx.settings.round_cap,
                server: server.id().to_string(),
            }
            .into());
        }
        if request.delegated.is_some() {
            let max = ctx.settings.limits.max_input_requests;
            let input = recorded_round(record, server.id(), &result, max)?;
            rounds::check(
                server.id(),
                &input.input_requests,
                capabilities,
                ctx.settings.limits.max_input_requests,
            )?;
            return Ok((result, true));
        }
        let round = Round {
            ctx,
            request,
            candidate,
            handlers: &handlers,
            deadline,
        };
        let span = call_span!(
            traced: record.traced,
            "round",
            otel.name = %format!("input_required {}", server.id()),
            mcp_harness.round = *rounds,
        );
        // Boxed: the rounds are the rare path, and their future would double this one.
        Box::pin(tracing::Instrument::instrument(
            round.answer(result, params, &mut state_only_rounds, record),
            span,
        ))
        .await?;
    }
}

/// The answers a round adds to the call's params.
const INPUT_RESPONSES: &str = "inputResponses";
/// The state a round adds to the call's params.
const REQUEST_STATE: &str = "requestState";

/// Takes the last round's answers and state out of the call's params.
fn clear_round(params: &mut Map<String, Value>) {
    params.remove(INPUT_RESPONSES);
    params.remove(REQUEST_STATE);
}

/// The round `result` asks for, recorded before it is checked (a round refused is in
/// the audit trail and the rounds counted too): one with too many requests, or not
/// readable, by what it is.
fn recorded_round(
    record: &mut CallRecord,
    server: &str,
    result: &Value,
    max: usize,
) -> Result<InputRequired, Attempt> {
    if let Err(e) = rounds::counted(server, result, max) {
        let many = result
            .get("inputRequests")
            .and_then(Value::as_object)
            .map_or(0, |r| r.len());
        record.round(server, vec![format!("({many} input requests, unread)")]);
        return Err(e.into());
    }
    match InputRequired::from_value(result) {
        Ok(input) => {
            let methods = input
                .input_requests
                .values()
                .map(|r| r.method.clone())
                .collect();
            record.round(server, methods);
            Ok(input)
        }
        Err(e) => {
            record.round(server, vec!["(malformed round)".into()]);
            Err(protocol(server, e))
        }
    }
}

fn protocol(server: &str, e: ProtocolError) -> Attempt {
    Attempt::Final(CallError::Server(ServerError::Protocol {
        server: server.to_string(),
        source: e,
    }))
}

/// One `input_required` round on one server.
struct Round<'a> {
    ctx: &'a Arc<CallContext>,
    request: &'a CallRequest,
    candidate: &'a Candidate<'a>,
    handlers: &'a HandlerSet,
    deadline: Deadline,
}

impl Round<'_> {
    /// Checks the round's input requests, answers them (or paces a state-only round),
    /// and makes `params` the retry's: the original ones, this round's answers, the
    /// state as received. `result` is taken: what the round needs is read out of it, and
    /// the rest (a server's padding of megabytes) is freed before anyone is asked, not
    /// held while a person decides.
    async fn answer(
        &self,
        result: Value,
        params: &mut Map<String, Value>,
        state_only_rounds: &mut u32,
        record: &mut CallRecord,
    ) -> Result<(), Attempt> {
        let id = self.candidate.server.id();
        let limits = &self.ctx.settings.limits;
        let input = recorded_round(record, id, &result, limits.max_input_requests)?;
        drop(result);
        rounds::check(
            id,
            &input.input_requests,
            self.handlers.capabilities(),
            limits.max_input_requests,
        )?;
        clear_round(params);
        if input.input_requests.is_empty() {
            let pause = Duration::from_millis((50u64 << (*state_only_rounds).min(3)).min(250));
            *state_only_rounds += 1;
            tokio::time::sleep(pause.min(self.deadline.remaining())).await;
        } else {
            *state_only_rounds = 0;
            // Checked before anyone is asked too: a person is not shown, nor a model
            // paid for, the question of a call whose grant is gone.
            still_allowed(self.ctx, self.request, self.candidate)?;
            let limit = self
                .ctx
                .settings
                .input_timeout
                .min(self.deadline.remaining());
            // A handler cut off where the call's deadline is ends the call as past it.
            let deadline = (limit < self.ctx.settings.input_timeout).then_some(self.deadline.total);
            let gathered = rounds::gather(
                &self.ctx.inputs,
                self.handlers,
                &self.request.caller,
                id,
                input.input_requests,
                (limit, deadline, record.call_id(), record.traced),
                self.deadline.at,
            );
            // And while they are: a grant revoked while a person decides (minutes,
            // perhaps) withdraws the questions, and no model is paid for after.
            let (ctx, request, candidate) = (self.ctx, self.request, self.candidate);
            let revoked = async move {
                loop {
                    tokio::time::sleep(GRANT_RECHECK).await;
                    if let Err(e) = still_allowed(ctx, request, candidate) {
                        return e;
                    }
                }
            };
            let answers = tokio::select! {
                biased;
                answers = gathered => answers?,
                denied = revoked => return Err(denied.into()),
            };
            params.insert(INPUT_RESPONSES.into(), Value::Object(answers));
        }
        still_allowed(self.ctx, self.request, self.candidate)?;
        if let Some(state) = input.request_state {
            params.insert(REQUEST_STATE.into(), Value::String(state));
        }
        Ok(())
    }
}
