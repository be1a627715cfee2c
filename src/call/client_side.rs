//! The harness as its servers see it: the [`ClientSide`] the server layer asks for
//! capabilities, for answers to a legacy server's requests (through the same
//! [`InputHandlers`] as MRTR rounds), and to drop a server's cached lists when they
//! change.

use serde_json::Value;

use super::input::{InputError, InputHandlers, InputRequestContext};
use crate::protocol::RpcError;
use crate::protocol::error::{INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND};
use crate::registry::RegistryRef;
use crate::server::{ClientSide, ListsChanged};
use crate::transport::{AskedDuring, ServerRequest};

/// See the module docs.
pub(crate) struct HarnessClient {
    pub(crate) inputs: InputHandlers,
    pub(crate) registry: RegistryRef,
    /// Where change events are announced.
    pub(crate) events: std::sync::Arc<crate::registry::Registry>,
    pub(crate) progress: std::sync::Arc<super::ProgressRouter>,
    /// For reading a changed tool list again (weak: the context holds the servers,
    /// which hold this).
    pub(crate) ctx: std::sync::Weak<super::CallContext>,
}

impl HarnessClient {
    /// Counts a server's question against its call's `round_cap`; past it, the
    /// refusal to answer it with.
    fn past_round_cap(&self, server: &str, during: AskedDuring) -> Option<RpcError> {
        let ctx = self.ctx.upgrade()?;
        if ctx.count_question(server, during) {
            return None;
        }
        tracing::warn!(
            server,
            cap = ctx.settings.round_cap,
            "server asked for input more often than round_cap during its call; refused"
        );
        Some(RpcError::new(
            INVALID_REQUEST,
            format!(
                "more than {} questions during this call, or during another of this agent's on this server (round_cap)",
                ctx.settings.round_cap
            ),
        ))
    }
}

/// Where how a server's question ends is noted: the calls it came during (the one its
/// stream names, or those on the server when it came), in their audit records.
struct Noted(
    Vec<(std::sync::Arc<super::context::Questions>, usize)>,
    /// The server and method of a question noted in no call's record (asked outside
    /// calls, `allow_unsolicited_input`): its end is logged instead.
    Option<(String, String)>,
);

impl Noted {
    /// Notes the question asked in each call's record.
    fn asked(
        calls: Vec<std::sync::Arc<super::context::Questions>>,
        cap: usize,
        server: &str,
        method: &str,
    ) -> Noted {
        let outside = calls
            .is_empty()
            .then(|| (server.to_string(), method.to_string()));
        let noted = calls
            .into_iter()
            .filter_map(|q| q.asked(cap, server, method).map(|place| (q, place)))
            .collect();
        Noted(noted, outside)
    }

    fn end(&self, outcome: &'static str) {
        if let Some((server, method)) = &self.1 {
            // No call's audit record has it: a person or a model may have been asked,
            // and paid for, all the same.
            tracing::info!(server = %server, method = %method, outcome, "a server's request outside any call ended");
        }
        for (questions, place) in &self.0 {
            questions.ended(*place, outcome);
        }
    }
}

/// The refusal of a question asked during calls whose grants are all revoked.
fn revoked(
    ctx: &super::CallContext,
    server: &str,
    grants: &[(Option<std::sync::Arc<str>>, std::sync::Arc<str>)],
) -> Option<RpcError> {
    if ctx.still_granted(server, grants) {
        return None;
    }
    tracing::info!(
        server,
        "a server asked for input during a call whose grant was revoked; refused"
    );
    Some(RpcError::new(
        -1,
        "refused: the call it was asked during is no longer allowed",
    ))
}

/// Ends, with the refusal, once the grants of the calls a question came during are
/// all revoked (checked as a round's are); never for a question of no call.
fn while_granted(
    ctx: std::sync::Weak<super::CallContext>,
    server: &str,
    grants: Vec<(Option<std::sync::Arc<str>>, std::sync::Arc<str>)>,
) -> impl std::future::Future<Output = RpcError> + Send + 'static {
    let server = server.to_string();
    async move {
        if grants.is_empty() {
            return std::future::pending().await;
        }
        loop {
            tokio::time::sleep(super::GRANT_RECHECK).await;
            let Some(ctx) = ctx.upgrade() else {
                return std::future::pending().await;
            };
            if let Some(refused) = revoked(&ctx, &server, &grants) {
                return refused;
            }
        }
    }
}

impl ClientSide for HarnessClient {
    fn capabilities(&self) -> Value {
        self.inputs.snapshot().capabilities().clone()
    }

    fn answer(&self, server: &str, request: ServerRequest) {
        let Some(ctx) = self.ctx.upgrade() else {
            request.respond(Err(RpcError::new(
                INTERNAL_ERROR,
                "the client is shutting down",
            )));
            return;
        };
        // Whose the request is: the call it came during, or (stdio and a legacy
        // session's own stream name none) the calls on that server now, each told how
        // it ends.
        let during = request.during;
        let whose = ctx.on(server, during);
        let asks = matches!(
            request.method.as_str(),
            "elicitation/create" | "sampling/createMessage"
        );
        let noted = match asks {
            true => Noted::asked(
                whose.asked.clone(),
                ctx.settings.round_cap,
                server,
                &request.method,
            ),
            false => Noted(Vec::new(), None),
        };
        // An elicitation during a delegated call is its caller's to answer.
        let asker = match request.method.as_str() {
            "elicitation/create" => whose.questions.clone(),
            _ => None,
        };
        if let Some(asks) = asker {
            // Held to what the caller declared, as its rounds are: no mode it does not
            // know, and never a URL no one should open.
            if let Err(why) =
                super::rounds::declares(&request.method, &request.params, &asks.declared)
            {
                request.respond(Err(RpcError::new(
                    INVALID_PARAMS,
                    format!("the client does not support the request, which {why}"),
                )));
                noted.end("refused");
                return;
            }
            let asker = asks.to;
            // A question the caller's client answers counts as one a handler would.
            if let Some(refused) = self.past_round_cap(server, during) {
                request.respond(Err(refused));
                noted.end("past_round_cap");
                return;
            }
            if let Some(refused) = revoked(&ctx, server, &whose.grants) {
                request.respond(Err(refused));
                noted.end("refused");
                return;
            }
            let (reply, answer) = tokio::sync::oneshot::channel();
            let question = super::ServerQuestion {
                server: server.to_string(),
                method: request.method.clone(),
                params: request.params.clone(),
                reply,
            };
            let mut request = request;
            let revoking = while_granted(self.ctx.clone(), server, whose.grants);
            let ended = whose.ended;
            tokio::spawn(async move {
                let asked = async {
                    match asker.send(question).await {
                        Ok(()) => answer.await.unwrap_or_else(|_| {
                            Err(RpcError::new(
                                INTERNAL_ERROR,
                                "the call ended before it was answered",
                            ))
                        }),
                        Err(_) => Err(RpcError::new(INTERNAL_ERROR, "the call ended")),
                    }
                };
                // Once the server was told the client did not answer, nobody waits.
                tokio::select! {
                    outcome = asked => {
                        noted.end(match &outcome {
                            Ok(value) => answered_as(value),
                            // The client's "the user rejected it" (MCP's -1).
                            Err(e) if e.code == USER_REJECTED => "denied",
                            Err(_) => "failed",
                        });
                        request.respond(outcome);
                    }
                    () = request.abandoned() => noted.end("withdrawn"),
                    // The caller's question is dropped with this task: its reply port
                    // closes, which tells the caller it is gone.
                    () = all_ended(&ended) => {
                        request.respond(Err(call_gone()));
                        noted.end("withdrawn");
                    }
                    refused = revoking => {
                        request.respond(Err(refused));
                        noted.end("refused");
                    }
                }
            });
            return;
        }
        // Held to what this client declared, as a round's requests are: a mode it does
        // not know is not handed to a handler as a form. (A capability not declared at
        // all finds no handler below.) The handlers checked are the ones that answer.
        let set = self.inputs.snapshot();
        let declared = set.capabilities();
        if super::input::capability_name(&request.method).is_some_and(|c| declared.get(c).is_some())
            && let Err(why) = super::rounds::declares(&request.method, &request.params, declared)
        {
            request.respond(Err(RpcError::new(
                INVALID_PARAMS,
                format!("the request {why}"),
            )));
            noted.end("refused");
            return;
        }
        // The connection let it through during a call, which may have ended since (its
        // result came right behind it): with no call on the server now it would be no
        // one's, and answered as if outside calls were allowed.
        if asks && !request.outside_calls_allowed && !whose.during_call {
            tracing::warn!(server, method = %crate::util::text::one_line(&request.method, 100), "server asked for input after its call ended; refused");
            let error = RpcError::new(
                INVALID_REQUEST,
                "input is only answered during a call this client made",
            );
            request.respond(Err(error));
            return;
        }
        if asks && let Some(refused) = self.past_round_cap(server, during) {
            request.respond(Err(refused));
            noted.end("past_round_cap");
            return;
        }
        // No person is shown, nor model paid for, the question of a call whose grant
        // is gone.
        if asks && let Some(refused) = revoked(&ctx, server, &whose.grants) {
            request.respond(Err(refused));
            noted.end("refused");
            return;
        }
        let context = InputRequestContext {
            server: server.to_string(),
            method: request.method.clone(),
            params: request.params.clone(),
            agent_id: whose.agent,
            key: String::new(),
            call_id: whose.call,
            call_deadline: whose.call_deadline,
            shared: whose.shared,
            answer_by: None,
        };
        let ended = whose.ended;
        let inputs = self.inputs.clone();
        let answer_by = request.answer_by;
        let revoking = while_granted(
            self.ctx.clone(),
            server,
            if asks { whose.grants } else { Vec::new() },
        );
        let mut request = request;
        let server = server.to_string();
        tokio::spawn(async move {
            // Once the server was told the client did not answer, or the calls the
            // question came during all ended (cancelled, past their deadline), or
            // their grants were revoked, the handler stops (an approval leaves the
            // queue, a provider request is not made).
            // Due when the connection stops waiting for it, if sooner than the
            // handlers' timeout: an approval given or a model paid for after that
            // reaches no one.
            let limit = inputs
                .timeout()
                .min(answer_by.saturating_duration_since(std::time::Instant::now()));
            let answered = tokio::select! {
                a = inputs.answer(&set, context, limit) => a,
                () = request.abandoned() => {
                    noted.end("withdrawn");
                    return;
                }
                () = all_ended(&ended) => {
                    request.respond(Err(call_gone()));
                    noted.end("withdrawn");
                    return;
                }
                refused = revoking => {
                    request.respond(Err(refused));
                    noted.end("refused");
                    return;
                }
            };
            let outcome = match answered {
                Ok(value) => {
                    noted.end(answered_as(&value));
                    Ok(value)
                }
                Err(InputError::NoHandler(method)) => {
                    noted.end("failed");
                    Err(RpcError::new(
                        METHOD_NOT_FOUND,
                        format!("no handler for {method} in this client"),
                    ))
                }
                // As clients answer a request the user rejected (-1). The server hears
                // no agent's name nor others' spending; the log has the whole reason.
                Err(InputError::Denied(d)) => {
                    tracing::info!(server = %server, reason = %d, "a server's request was refused");
                    noted.end("denied");
                    Err(RpcError::new(
                        -1,
                        format!("refused: {}", d.as_told_to_the_server()),
                    ))
                }
                Err(e) => {
                    noted.end("failed");
                    Err(RpcError::new(INTERNAL_ERROR, e.to_string()))
                }
            };
            request.respond(outcome);
        });
    }

    fn progress(&self, server: &str, params: Option<&Value>) {
        self.progress.deliver(server, params);
    }

    fn added(&self, server: &str) {
        // Counted again (it may have been removed before): it is in the directory now,
        // so a removal of the one before it that forgets its series after this sees it.
        if let Some(ctx) = self.ctx.upgrade() {
            ctx.metrics.track(server);
        }
        self.events
            .announce(crate::registry::HarnessEvent::ServerAdded {
                server: server.to_string(),
            });
    }

    fn lists_changed(&self, server: &str, changed: ListsChanged) {
        tracing::debug!(server, ?changed, "server lists changed");
        let (server, registry, events) = (
            server.to_string(),
            self.registry.clone(),
            self.events.clone(),
        );
        let ctx = self.ctx.clone();
        // Not served from here on, whatever the registry's writer is busy with; it then
        // drops the files and tells the other processes. Nor read back from the shared
        // layer until it has moved the server's generation there.
        let hold = events.shared.as_ref().and_then(|s| s.hold(&server));
        events.cache.forget_in_memory(&server);
        tokio::spawn(async move {
            // The other processes first, held back by nothing of this one's (a disk
            // write that hangs held the generation back for good); the hold goes once
            // the generation has moved (or its retries hold the server in turn).
            if let Some(shared) = &events.shared
                && hold.is_some()
            {
                shared.invalidate(&server).await;
            }
            drop(hold);
            // Announced once the old lists are gone: whoever lists again on hearing it
            // reads the new ones, not the cache's.
            if !registry.invalidate(&server).await {
                tracing::warn!(server = %server, "the cache did not drop a changed server's lists in time");
            }
            events.announce(crate::registry::HarnessEvent::ListsChanged {
                server: server.clone(),
                tools: changed.tools,
                prompts: changed.prompts,
                resources: changed.resources,
            });
            // Read again now, so the change is seen (ToolsChanged) without a caller.
            if changed.tools
                && let Some(ctx) = ctx.upgrade()
            {
                super::listing::refetch_tools(&ctx, &server).await;
            }
        });
    }
}

/// The error code clients answer a request the user rejected with (MCP's sampling
/// and elicitation pages).
const USER_REJECTED: i64 = -1;

/// Ends once every call a question came during has ended (cancelled, past its
/// deadline); never for a question that came during none.
async fn all_ended(ended: &[tokio_util::sync::CancellationToken]) {
    if ended.is_empty() {
        return std::future::pending().await;
    }
    for one in ended {
        one.cancelled().await;
    }
}

/// The answer to a question whose calls all ended before it was answered.
fn call_gone() -> RpcError {
    RpcError::new(
        INTERNAL_ERROR,
        "the call or request this was asked during has ended",
    )
}

/// How an answered question ended, for the audit: an elicitation declined or cancelled
/// by the person is not one answered (the call goes on, and the record is the only
/// trace of the "no").
fn answered_as(value: &Value) -> &'static str {
    match value.get("action").and_then(Value::as_str) {
        Some("decline") => "declined",
        Some("cancel") => "cancelled",
        _ => "answered",
    }
}
