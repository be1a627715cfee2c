//! One `input_required` round: its input requests checked before any handler sees
//! them, then answered in parallel under the same keys.
//!
//! The checks: no more than `limits.max_input_requests` in one round; each method one
//! the harness declared for this request, and an elicitation only in a mode it declared
//! (`url` needs `url`; a bare `elicitation: {}` means form only); sampling with tools
//! only if `sampling.tools` was declared, and (in a round) with context
//! (`includeContext` other than `none`) only if `sampling.context` was. A server that breaks them ends the call with
//! [`CallError::InputRejected`].

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Map, Value};

use super::caller::Caller;
use super::error::CallError;
use super::input::{
    HandlerSet, InputError, InputHandlers, InputRequestContext, capability_name, elicitation_mode,
};
use crate::protocol::InputRequest;

/// Refuses a round of more than `max` input requests.
fn at_most(server: &str, count: usize, max: usize) -> Result<(), CallError> {
    if count > max {
        return Err(CallError::InputRejected {
            server: server.to_string(),
            reason: format!("{count} input requests in one round; at most {max} are answered"),
        });
    }
    Ok(())
}

/// [`at_most`] on an `input_required` result before it is read: reading copies each
/// request, and a server can send hundreds of thousands in one message.
pub(crate) fn counted(server: &str, result: &Value, max: usize) -> Result<(), CallError> {
    let count = result
        .get("inputRequests")
        .and_then(Value::as_object)
        .map_or(0, |requests| requests.len());
    at_most(server, count, max)
}

/// The longest key of an input request: a name (`github_login`), copied into every
/// context, queue entry and answer, and not counted in what a queue holds.
pub(crate) const MAX_KEY_BYTES: usize = 1024;

/// Checks one round's input requests against what was declared (see the module docs).
pub(crate) fn check(
    server: &str,
    requests: &BTreeMap<String, InputRequest>,
    declared: &Value,
    max: usize,
) -> Result<(), CallError> {
    let reject = |reason: String| CallError::InputRejected {
        server: server.to_string(),
        reason,
    };
    at_most(server, requests.len(), max)?;
    for (key, request) in requests {
        if key.len() > MAX_KEY_BYTES {
            return Err(reject(format!(
                "an input request's key is {} bytes long (at most {MAX_KEY_BYTES})",
                key.len()
            )));
        }
        declares(&request.method, &request.params, declared)
            .and_then(|()| declares_context(&request.method, &request.params, declared))
            .map_err(|why| {
                let key = crate::util::text::one_line(key, 100);
                reject(format!("input request \"{key}\" {why}"))
            })?;
    }
    Ok(())
}

/// A round's sampling with context (`includeContext` other than `none`) needs
/// `sampling.context` declared, as 2026-07-28 says. Not held against a legacy server's
/// own request: versions before it had no such capability, and no handler acts on the
/// context anyway.
fn declares_context(method: &str, params: &Value, declared: &Value) -> Result<(), String> {
    if method == "sampling/createMessage"
        && params
            .get("includeContext")
            .is_some_and(|c| c != "none" && !c.is_null())
        && declared
            .get("sampling")
            .and_then(|s| s.get("context"))
            .is_none()
    {
        return Err(
            "asks for sampling with context (includeContext), which this client did not declare"
                .into(),
        );
    }
    Ok(())
}

/// Whether a request for input (`method`, `params`) is one the client `declared` it can
/// answer; why not otherwise ("is for …", "needs …"). Rounds and a legacy server's own
/// requests are held to it alike.
pub(crate) fn declares(method: &str, params: &Value, declared: &Value) -> Result<(), String> {
    let Some(capability) = capability_name(method) else {
        // The server's words, cut and escaped: they reach the agent and the audit trail.
        let method = crate::util::text::one_line(method, 100);
        return Err(format!("is for \"{method}\", which is not an input method"));
    };
    let Some(declared) = declared.get(capability) else {
        return Err(format!(
            "needs {capability}, which this client did not declare"
        ));
    };
    if capability == "elicitation" {
        let Some(mode) = elicitation_mode(params) else {
            return Err("is an elicitation of a mode that is neither form nor url".into());
        };
        let modes = declared.as_object().filter(|m| !m.is_empty());
        let allowed = match modes {
            Some(m) => m.contains_key(mode),
            None => mode == "form",
        };
        if !allowed {
            return Err(format!(
                "is a {mode}-mode elicitation, which this client did not declare"
            ));
        }
        // Whoever answers (a handler, a gateway's client, a person) is never handed a
        // `javascript:` or credential-laden URL from a server.
        if mode == "url" && super::input::usable_elicitation_url(params).is_none() {
            return Err("is a url-mode elicitation whose url is not an https URL of at most 2048 bytes without credentials".into());
        }
    }
    if capability == "sampling"
        && (params.get("tools").is_some() || params.get("toolChoice").is_some())
        && declared.get("tools").is_none()
    {
        return Err("asks for sampling with tools, which this client did not declare".into());
    }
    Ok(())
}

/// Answers one round's input requests in parallel, under the same keys. A declined or
/// cancelled elicitation ends the call; so does any handler that fails.
pub(crate) async fn gather(
    inputs: &InputHandlers,
    set: &HandlerSet,
    caller: &Caller,
    server: &str,
    requests: BTreeMap<String, InputRequest>,
    (limit, deadline, call_id, traced): (Duration, Option<Duration>, u64, bool),
    call_deadline: std::time::Instant,
) -> Result<Map<String, Value>, CallError> {
    let mut pending = Vec::with_capacity(requests.len());
    for (key, request) in requests {
        let context = InputRequestContext {
            server: server.to_string(),
            method: request.method,
            params: request.params,
            agent_id: caller.agent_id.as_deref().map(String::from),
            key,
            call_id: Some(call_id),
            call_deadline: Some(call_deadline),
            shared: false,
            answer_by: None,
        };
        pending.push(context);
    }
    // Each answer runs in a task of its own (InputHandlers::answer); polling them together
    // here lets them run in parallel. The first answer that ends the call ends the round
    // too: dropping the others aborts them (an approval still queued is withdrawn).
    let answers =
        pending.into_iter().map(|context| {
            let method = context.method.clone();
            let key = context.key.clone();
            let span = crate::util::trace_context::call_span!(
                traced: traced,
                "input",
                otel.name = %method,
                mcp.method.name = %method,
                mcp_harness.input.key = %super::telemetry::Cut(&key),
            );
            let answer = tracing::Instrument::instrument(inputs.answer(set, context, limit), span);
            async move {
                settle(server, method, answer.await, (limit, deadline)).map(|value| (key, value))
            }
        });
    Ok(try_join_all(answers).await?.into_iter().collect())
}

/// One answer as the round takes it: its value, or the error that ends the call.
/// `limit`: what the handler was given; `deadline`: the call's, when that limit was
/// what it left (a handler cut off at the limit then ends the call as past its
/// deadline; one that gave up sooner on its own, its provider timing out, say, failed).
fn settle(
    server: &str,
    method: String,
    answer: Result<Value, InputError>,
    (limit, deadline): (Duration, Option<Duration>),
) -> Result<Value, CallError> {
    let value = match answer {
        Ok(v) => v,
        Err(InputError::Timeout(after)) if deadline.is_some() && after >= limit => {
            return Err(CallError::DeadlineExceeded(deadline.unwrap_or(after)));
        }
        // Cannot happen through `check` (what is declared is what the same set
        // answers); refused the same way if it ever does.
        Err(InputError::NoHandler(method)) => {
            return Err(CallError::InputRejected {
                server: server.to_string(),
                reason: format!("no handler answers {method}"),
            });
        }
        Err(InputError::Denied(reason)) => {
            return Err(CallError::InputDenied {
                server: server.to_string(),
                method,
                reason,
            });
        }
        Err(e) => {
            return Err(CallError::InputFailed {
                server: server.to_string(),
                method,
                reason: e.to_string(),
            });
        }
    };
    if method == "elicitation/create"
        && let Some(action @ ("decline" | "cancel")) = value.get("action").and_then(Value::as_str)
    {
        return Err(CallError::InputDeclined {
            server: server.to_string(),
            method,
            action: action.to_string(),
        });
    }
    Ok(value)
}

/// Polls every future together; their values in their order, or the first error to
/// come (the others are dropped with it).
async fn try_join_all<T, E, F: std::future::Future<Output = Result<T, E>>>(
    futures: impl Iterator<Item = F>,
) -> Result<Vec<T>, E> {
    let mut futures: Vec<_> = futures.map(|f| Some(Box::pin(f))).collect();
    let mut out: Vec<Option<T>> = (0..futures.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, slot) in futures.iter_mut().enumerate() {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(Ok(v)) => {
                        out[i] = Some(v);
                        *slot = None;
                    }
                    std::task::Poll::Ready(Err(e)) => return std::task::Poll::Ready(Err(e)),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(Ok(()))
        }
    })
    .await?;
    Ok(out.into_iter().flatten().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_handler_cut_off_by_the_calls_deadline_ends_the_call_as_past_it_and_one_giving_up_sooner_failed()
     {
        let (limit, total) = (Duration::from_secs(200), Duration::from_secs(600));
        let settled = |after, deadline| {
            settle(
                "s",
                "sampling/createMessage".into(),
                Err(InputError::Timeout(after)),
                (limit, deadline),
            )
        };
        assert!(matches!(
            settled(limit, Some(total)),
            Err(CallError::DeadlineExceeded(t)) if t == total
        ));
        // Its provider timed out after 30 s, with 170 s of the call left.
        assert!(matches!(
            settled(Duration::from_secs(30), Some(total)),
            Err(CallError::InputFailed { .. })
        ));
        // The handlers' own limit, not the call's.
        assert!(matches!(
            settled(limit, None),
            Err(CallError::InputFailed { .. })
        ));
    }

    fn requests(items: &[(&str, &str, Value)]) -> BTreeMap<String, InputRequest> {
        items
            .iter()
            .map(|(k, m, p)| {
                (
                    k.to_string(),
                    InputRequest {
                        method: m.to_string(),
                        params: p.clone(),
                    },
                )
            })
            .collect()
    }

    #[test]
    fn a_servers_key_and_method_are_quoted_cut_and_escaped() {
        let long = format!("\u{1b}[2J{}", "k".repeat(100_000));
        let bad = requests(&[(&long, &long, json!({}))]);
        let Err(CallError::InputRejected { reason, .. }) = check("s", &bad, &json!({}), 16) else {
            panic!("rejected");
        };
        assert!(reason.len() < 400 && !reason.contains('\u{1b}'), "{reason}");
    }

    #[test]
    fn undeclared_methods_and_modes_are_rejected_before_any_handler() {
        let form_only = json!({"elicitation": {}});
        let ok = requests(&[("a", "elicitation/create", json!({"message": "?"}))]);
        assert!(check("s", &ok, &form_only, 16).is_ok());
        let url = requests(&[(
            "a",
            "elicitation/create",
            json!({"mode": "url", "url": "https://x"}),
        )]);
        assert!(matches!(
            check("s", &url, &form_only, 16),
            Err(CallError::InputRejected { .. })
        ));
        assert!(check("s", &url, &json!({"elicitation": {"url": {}}}), 16).is_ok());
        assert!(check("s", &url, &json!({"elicitation": {"form": {}}}), 16).is_err());
        // A mode neither form nor url is not taken for form.
        let unknown = requests(&[(
            "a",
            "elicitation/create",
            json!({"mode": "URL", "url": "https://x"}),
        )]);
        assert!(check("s", &unknown, &form_only, 16).is_err());
        let both = json!({"elicitation": {"form": {}, "url": {}}});
        assert!(check("s", &unknown, &both, 16).is_err());
        let sampling = requests(&[("a", "sampling/createMessage", json!({"messages": []}))]);
        assert!(
            check("s", &sampling, &form_only, 16).is_err(),
            "sampling not declared"
        );
        let with_tools = requests(&[("a", "sampling/createMessage", json!({"tools": []}))]);
        assert!(check("s", &with_tools, &json!({"sampling": {}}), 16).is_err());
        assert!(check("s", &with_tools, &json!({"sampling": {"tools": {}}}), 16).is_ok());
        // Context other than none needs sampling.context.
        for (context, declared, ok) in [
            (json!("thisServer"), json!({"sampling": {}}), false),
            (
                json!("allServers"),
                json!({"sampling": {"tools": {}}}),
                false,
            ),
            (
                json!("allServers"),
                json!({"sampling": {"context": {}}}),
                true,
            ),
            (json!("none"), json!({"sampling": {}}), true),
        ] {
            let asks = requests(&[(
                "a",
                "sampling/createMessage",
                json!({"messages": [], "includeContext": context}),
            )]);
            assert_eq!(
                check("s", &asks, &declared, 16).is_ok(),
                ok,
                "{context} {declared}"
            );
        }
        let bogus = requests(&[("a", "tools/call", json!({}))]);
        assert!(check("s", &bogus, &json!({"elicitation": {}}), 16).is_err());
    }

    #[test]
    fn a_round_with_too_many_input_requests_is_rejected() {
        let many: Vec<(String, &str, Value)> = (0..17)
            .map(|i| (format!("k{i}"), "elicitation/create", json!({})))
            .collect();
        let many: Vec<(&str, &str, Value)> = many
            .iter()
            .map(|(k, m, p)| (k.as_str(), *m, p.clone()))
            .collect();
        let e = check("s", &requests(&many), &json!({"elicitation": {}}), 16).expect_err("17 > 16");
        assert!(e.to_string().contains("17 input requests"), "{e}");
    }
}
