//! One call, step by step (design.md, "One call"): admit and audit, authorize and route,
//! send, drive `input_required` rounds through the input handlers under the round cap,
//! fail over when that is safe, audit the outcome, answer.
//!
//! [`run`] is the whole path as one async fn; each step is a named fn below it. It runs
//! inside a [`actor::CallActor`], one per call.
//!
//! MRTR, as the spec says: each round's input requests go to the handler of their
//! method in parallel; answers come back under the same keys; the retry is the same
//! method with the original params plus `inputResponses` and `requestState` echoed as
//! received (never parsed; absent if the server sent none), under a new JSON-RPC id
//! (the connection numbers every request). Rounds that carry only `requestState` are
//! paced 50 ms doubling to 250 ms. The cap counts every round of the logical call,
//! failover included. A call that fails over starts its rounds afresh: `requestState`
//! belongs to the server that issued it.

pub mod actor;
pub mod handler;
mod listing;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};

use crate::audit::hash_context;
use crate::harness::HarnessError;
use crate::harness::core::Core;
use crate::protocol::{InputRequest, InputRequired, ResultType};
use crate::server::ServerError;
use handler::{InputMsg, InputRequestContext};
pub use listing::{ToolInfo, list, route};

/// Who is calling: the agent (required: anonymous callers are denied) and the
/// authorization context that keys `private` cache entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Caller {
    /// The agent's id; grants are keyed by it.
    pub agent_id: Option<String>,
    /// An opaque identity of the caller's credentials (for example a token's subject).
    pub auth_context: Option<String>,
}

impl Caller {
    /// A caller with an agent id and no auth context.
    pub fn agent(id: impl Into<String>) -> Caller {
        Caller {
            agent_id: Some(id.into()),
            auth_context: None,
        }
    }

    /// The same caller with an auth context.
    pub fn with_auth_context(mut self, ctx: impl Into<String>) -> Caller {
        self.auth_context = Some(ctx.into());
        self
    }
}

/// What a call asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallKind {
    /// `tools/call`.
    Tool,
    /// `prompts/get`.
    Prompt,
    /// `resources/read`.
    Resource,
}

impl CallKind {
    /// The list method that says who offers what.
    pub fn list_method(self) -> &'static str {
        match self {
            CallKind::Tool => "tools/list",
            CallKind::Prompt => "prompts/list",
            CallKind::Resource => "resources/list",
        }
    }

    /// The array in that list's result.
    pub fn list_key(self) -> &'static str {
        match self {
            CallKind::Tool => "tools",
            CallKind::Prompt => "prompts",
            CallKind::Resource => "resources",
        }
    }

    /// The field that names an item.
    pub fn item_key(self) -> &'static str {
        match self {
            CallKind::Resource => "uri",
            _ => "name",
        }
    }

    /// The server capability that says it has such items.
    pub fn capability(self) -> &'static str {
        self.list_key()
    }

    fn method(self) -> &'static str {
        match self {
            CallKind::Tool => "tools/call",
            CallKind::Prompt => "prompts/get",
            CallKind::Resource => "resources/read",
        }
    }

    fn params(self, item: &str, args: &Value) -> Map<String, Value> {
        let mut p = Map::new();
        match self {
            CallKind::Tool => {
                p.insert("name".into(), json!(item));
                p.insert("arguments".into(), args.clone());
            }
            CallKind::Prompt => {
                p.insert("name".into(), json!(item));
                p.insert("arguments".into(), args.clone());
            }
            CallKind::Resource => {
                p.insert("uri".into(), json!(item));
            }
        }
        p
    }
}

/// One server a call may go to, in order.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// Server id.
    pub server: String,
    /// The item's name on that server.
    pub item: String,
    /// The request may be re-sent elsewhere even if it reached this server (the tool
    /// is marked idempotent or read-only by a server whose annotations are trusted).
    pub retry_safe: bool,
}

/// What the audit trail says of one call.
struct CallRecord {
    call_id: u64,
    /// How many servers the call could have gone to.
    candidates: usize,
    hops: Vec<Value>,
    rounds: Vec<Value>,
    server: Option<String>,
}

/// Counts a call as in flight until dropped (also when its actor is killed mid-call).
struct InFlight(Arc<std::sync::atomic::AtomicUsize>);

impl InFlight {
    fn enter(count: &Arc<std::sync::atomic::AtomicUsize>) -> InFlight {
        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        InFlight(count.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Runs one call end to end. Exactly one `started` and one `finished` audit record.
pub async fn run(
    core: Arc<Core>,
    caller: Caller,
    kind: CallKind,
    name: String,
    args: Value,
) -> Result<Value, HarnessError> {
    let started = Instant::now();
    let call_id = core
        .next_call
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let _inflight = InFlight::enter(&core.inflight);
    let span = tracing::info_span!("call", call_id, agent = ?caller.agent_id, name = %name);
    core.services.audit_sink.record(json!({
        "event": "started", "call_id": call_id, "time_ms": unix_ms(),
        "agent": caller.agent_id, "auth": hash_context(caller.auth_context.as_deref()),
        "kind": format!("{kind:?}").to_lowercase(), "name": name,
        "arguments": core.settings.audit.redact(&args),
    }));
    let mut record = CallRecord {
        call_id,
        candidates: 0,
        hops: Vec::new(),
        rounds: Vec::new(),
        server: None,
    };
    let outcome = tracing::Instrument::instrument(
        async {
            let candidates = authorize_and_route(&core, &caller, kind, &name).await?;
            record.candidates = candidates.len();
            drive(&core, &caller, kind, &candidates, &args, &mut record).await
        },
        span,
    )
    .await;
    finish(&core, record, &outcome, started.elapsed());
    outcome
}

async fn authorize_and_route(
    core: &Arc<Core>,
    caller: &Caller,
    kind: CallKind,
    name: &str,
) -> Result<Vec<Candidate>, HarnessError> {
    if caller.agent_id.is_none() {
        return Err(HarnessError::Denied {
            agent: None,
            server: None,
            tool: name.to_string(),
        });
    }
    route(core, caller, kind, name).await
}

/// Sends the call to each candidate in turn, driving its rounds.
async fn drive(
    core: &Arc<Core>,
    caller: &Caller,
    kind: CallKind,
    candidates: &[Candidate],
    args: &Value,
    record: &mut CallRecord,
) -> Result<Value, HarnessError> {
    let capabilities = core.capabilities();
    let mut rounds = 0usize;
    let mut last_error = None;
    for (i, candidate) in candidates.iter().enumerate() {
        record.server = Some(candidate.server.clone());
        let mut params = kind.params(&candidate.item, args);
        let mut state_only_rounds = 0u32;
        let error = loop {
            let sent = core
                .send(
                    &candidate.server,
                    kind.method(),
                    Some(Value::Object(params.clone())),
                    None,
                    Some(capabilities.clone()),
                )
                .await;
            let result = match sent {
                Ok(result) => result,
                Err(e) => break e,
            };
            let protocol = |e: crate::protocol::ProtocolError| ServerError::Protocol {
                server: candidate.server.clone(),
                source: e,
            };
            match ResultType::of(&result).map_err(protocol)? {
                ResultType::Complete => return Ok(result),
                ResultType::InputRequired => {}
            }
            rounds += 1;
            if rounds > core.settings.round_cap {
                return Err(HarnessError::RoundCap {
                    cap: core.settings.round_cap,
                    server: candidate.server.clone(),
                });
            }
            let input = InputRequired::from_value(&result).map_err(protocol)?;
            let methods: Vec<&str> = input
                .input_requests
                .values()
                .map(|r| r.method.as_str())
                .collect();
            record
                .rounds
                .push(json!({"server": candidate.server, "methods": methods}));
            // The retry: original params, this round's answers, the state as received.
            params = kind.params(&candidate.item, args);
            if input.input_requests.is_empty() {
                let pause = Duration::from_millis((50u64 << state_only_rounds.min(3)).min(250));
                state_only_rounds += 1;
                tokio::time::sleep(pause).await;
            } else {
                state_only_rounds = 0;
                let answers = gather(core, caller, &candidate.server, input.input_requests).await?;
                params.insert("inputResponses".into(), Value::Object(answers));
            }
            if let Some(state) = input.request_state {
                params.insert("requestState".into(), Value::String(state));
            }
        };
        if let ServerError::MissingCapability { server, required } = error {
            return Err(HarnessError::MissingCapability { server, required });
        }
        let more = i + 1 < candidates.len();
        let safe = error.never_sent()
            || (candidate.retry_safe
                && matches!(
                    error,
                    ServerError::TransportClosed { .. }
                        | ServerError::Unavailable { .. }
                        | ServerError::Transport { .. }
                ));
        if more && safe {
            tracing::info!(server = %candidate.server, error = %error, "failing over to the next server");
            record
                .hops
                .push(json!({"server": candidate.server, "error": error.to_string()}));
            last_error = Some(error);
            continue;
        }
        return Err(error.into());
    }
    Err(last_error
        .map(HarnessError::from)
        .unwrap_or_else(|| HarnessError::NoRoute {
            tool: String::new(),
        }))
}

/// Answers one round's input requests in parallel, under the same keys.
async fn gather(
    core: &Arc<Core>,
    caller: &Caller,
    server: &str,
    requests: BTreeMap<String, InputRequest>,
) -> Result<Map<String, Value>, HarnessError> {
    let mut pending = tokio::task::JoinSet::new();
    for (key, request) in requests {
        let handler = core.hooks.handlers.read().get(&request.method).cloned();
        let Some(handler) = handler else {
            return Err(HarnessError::NoInputHandler {
                server: server.to_string(),
                method: request.method,
            });
        };
        let context = InputRequestContext {
            server: server.to_string(),
            method: request.method,
            params: request.params,
            agent_id: caller.agent_id.clone(),
            key: key.clone(),
        };
        let limit = core.settings.input_timeout + Duration::from_secs(1);
        pending.spawn(async move {
            let method = context.method.clone();
            let answer = handler
                .call(|port| InputMsg::Answer(context, port), Some(limit))
                .await;
            (key, method, answer)
        });
    }
    let mut answers = Map::new();
    while let Some(joined) = pending.join_next().await {
        let Ok((key, method, answer)) = joined else {
            // A lost answer would make the retry incomplete; the spec wants every one.
            let reason = "an input handler task failed".to_string();
            return Err(HarnessError::InputFailed {
                server: server.to_string(),
                method: "unknown".into(),
                reason,
            });
        };
        let failed = |reason: String| HarnessError::InputFailed {
            server: server.to_string(),
            method: method.clone(),
            reason,
        };
        let value = match answer {
            Ok(ractor::rpc::CallResult::Success(Ok(v))) => v,
            Ok(ractor::rpc::CallResult::Success(Err(e))) => return Err(failed(e.to_string())),
            Ok(ractor::rpc::CallResult::Timeout) => {
                return Err(failed("the handler did not answer in time".into()));
            }
            _ => return Err(failed("the handler is unavailable".into())),
        };
        if method == "elicitation/create"
            && let Some(action @ ("decline" | "cancel")) =
                value.get("action").and_then(Value::as_str)
        {
            return Err(HarnessError::InputDeclined {
                server: server.to_string(),
                method,
                action: action.to_string(),
            });
        }
        answers.insert(key, value);
    }
    Ok(answers)
}

fn finish(
    core: &Core,
    record: CallRecord,
    outcome: &Result<Value, HarnessError>,
    latency: Duration,
) {
    let (result, code) = match outcome {
        Ok(v) if v.get("isError").and_then(Value::as_bool) == Some(true) => ("tool_error", None),
        Ok(_) => ("ok", None),
        Err(e) => ("error", Some(e.code())),
    };
    core.services.audit_sink.record(json!({
        "event": "finished", "call_id": record.call_id, "time_ms": unix_ms(),
        "server": record.server, "candidates": record.candidates, "hops": record.hops, "rounds": record.rounds,
        "outcome": result, "error": code,
        "message": outcome.as_ref().err().map(|e| e.to_string()),
        "latency_us": latency.as_micros() as u64,
    }));
}
