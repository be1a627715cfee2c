//! A modern server's change notifications: `subscriptions/listen` held open on each of
//! its connections for the lists it says change (`capabilities.*.listChanged`).
//!
//! The rules a listener keeps: the acknowledgment comes first (within
//! [`ACK_TIMEOUT`]), for the same subscription, and accepts only what was asked;
//! otherwise the subscription is closed and the server's lists stay fresh by their TTL
//! and refresh ahead. Notifications of lists it did not accept are ignored. Change
//! notifications go to the server actor as inbound events, where they are coalesced
//! like a legacy server's. A subscription the server ends is opened again after a
//! pause; one that ends with its connection is opened again on the next connection by
//! the actor, and the spec promises no replay, so every open after the first says all
//! its lists changed (they are read again).

use std::sync::Arc;
use std::time::Duration;

use ractor::ActorRef;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::client::ListsChanged;
use super::msg::{OnTheWay, ServerMsg};
use crate::protocol::Notification;
use crate::transport::{Connection, Era, RequestError, ServerEvent};

/// How long the server has to acknowledge a subscription.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(10);

/// The first pause before a subscription the server ended is opened again; it doubles
/// up to [`REOPEN_AT_MOST`] while subscriptions keep ending young (a proxy that cuts long
/// streams must not turn into a storm of re-reads).
const REOPEN_AFTER: Duration = Duration::from_secs(1);
const REOPEN_AT_MOST: Duration = Duration::from_secs(60);

/// Ends the listener when dropped (its connection attempt ended or was replaced).
pub(super) type Listener = crate::util::AbortOnDrop;

/// The lists `capabilities` says change and are announced.
fn announced(capabilities: &Value) -> ListsChanged {
    let says = |kind: &str| capabilities[kind]["listChanged"] == json!(true);
    ListsChanged {
        tools: says("tools"),
        prompts: says("prompts"),
        resources: says("resources"),
    }
}

fn filter(lists: ListsChanged) -> Value {
    json!({
        "toolsListChanged": lists.tools,
        "promptsListChanged": lists.prompts,
        "resourcesListChanged": lists.resources,
    })
}

/// What the acknowledgment accepted, if it is one and within what was asked.
fn accepted(ack: &Notification, asked: ListsChanged) -> Result<ListsChanged, String> {
    if ack.method != "notifications/subscriptions/acknowledged" {
        return Err(format!(
            "the first message was {}, not the acknowledgment",
            crate::util::text::one_line(&ack.method, 100)
        ));
    }
    let params = ack.params.clone().unwrap_or(Value::Null);
    let agreed = params.get("notifications").unwrap_or(&params);
    let yes = |k: &str| agreed.get(k) == Some(&json!(true));
    let got = ListsChanged {
        tools: yes("toolsListChanged"),
        prompts: yes("promptsListChanged"),
        resources: yes("resourcesListChanged"),
    };
    let beyond = (got.tools && !asked.tools)
        || (got.prompts && !asked.prompts)
        || (got.resources && !asked.resources);
    if beyond {
        return Err("the acknowledgment accepts notifications that were not asked for".into());
    }
    Ok(got)
}

/// Starts listening on `conn` for attempt `attempt`, if it is a modern connection whose
/// server announces list changes; `reopened` says an earlier connection listened
/// already (its lists are read again once this one is acknowledged).
pub(super) fn start(
    actor: ActorRef<ServerMsg>,
    attempt: u64,
    conn: Arc<Connection>,
    reopened: bool,
) -> Option<Listener> {
    if conn.era() != Era::Modern {
        return None;
    }
    let asked = announced(conn.profile().capabilities());
    if !asked.any() {
        return None;
    }
    let task = tokio::spawn(run(actor, attempt, conn, asked, reopened));
    Some(crate::util::AbortOnDrop(task.abort_handle()))
}

async fn run(
    actor: ActorRef<ServerMsg>,
    attempt: u64,
    conn: Arc<Connection>,
    asked: ListsChanged,
    mut reopened: bool,
) {
    let server = conn.server().to_string();
    let mut pause = REOPEN_AFTER;
    // One change of each list on its way to the actor at a time (its mailbox has no
    // bound): a stream of them marks the list once, as the server actor does.
    let on_the_way = OnTheWay::default();
    let tell = |method: &str| {
        let Some(queued) = on_the_way.take(method) else {
            return;
        };
        let n = Notification {
            method: method.into(),
            params: None,
        };
        let event = ServerEvent::Notification(n);
        let _ = actor.send_message(ServerMsg::Inbound {
            attempt,
            event,
            queued: Some(queued),
        });
    };
    // Every list of `lists` is read again.
    let tell_all = |lists: ListsChanged| {
        for (on, method) in [
            (lists.tools, "notifications/tools/list_changed"),
            (lists.prompts, "notifications/prompts/list_changed"),
            (lists.resources, "notifications/resources/list_changed"),
        ] {
            if on {
                tell(method);
            }
        }
    };
    loop {
        let (sink, mut notes) = mpsc::channel(16);
        let listen = conn.listen(filter(asked), sink);
        tokio::pin!(listen);
        let first = tokio::select! {
            n = notes.recv() => n,
            ended = &mut listen => {
                let outcome = crate::util::text::one_line(&format!("{ended:?}"), 300);
                // A server that listened before and cannot be reached now (restarting,
                // behind a proxy answering 503) is asked again, with backoff: only its
                // refusal, or a first listen that fails, leaves the lists to their TTL.
                let refused = matches!(ended, Err(RequestError::Rpc(_)));
                if reopened && !refused && !conn.is_closed() {
                    tracing::debug!(server, %outcome, "subscriptions/listen could not be opened again; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(REOPEN_AT_MOST);
                    continue;
                }
                tracing::warn!(server, %outcome, "subscriptions/listen ended before its acknowledgment; lists stay fresh by TTL");
                return;
            }
            _ = tokio::time::sleep(ACK_TIMEOUT) => None,
        };
        let got = match first.as_ref().map(|ack| accepted(ack, asked)) {
            Some(Ok(got)) => got,
            Some(Err(why)) => {
                tracing::warn!(server, %why, "subscriptions/listen refused; lists stay fresh by TTL");
                return;
            }
            // Opened again and held unanswered (a server restarting behind a proxy):
            // asked again, with backoff, as one that could not be opened.
            None if reopened && !conn.is_closed() => {
                tracing::debug!(
                    server,
                    "subscriptions/listen opened again was not acknowledged in time; trying again"
                );
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(REOPEN_AT_MOST);
                continue;
            }
            None => {
                tracing::warn!(
                    server,
                    "subscriptions/listen was not acknowledged in time; lists stay fresh by TTL"
                );
                return;
            }
        };
        if !got.any() {
            tracing::info!(
                server,
                "the server accepted none of the list changes asked for; lists stay fresh by TTL"
            );
            return;
        }
        tracing::debug!(server, ?got, "listening for list changes");
        // Lists without hints are kept while this subscription announces their changes:
        // said until it ends (or this task is dropped with its connection).
        conn.set_announced([got.tools, got.prompts, got.resources]);
        let announcing = Announcing(&conn);
        let opened = tokio::time::Instant::now();
        if reopened {
            // Nothing is replayed: what changed while nobody listened is read again.
            tell_all(got);
        }
        reopened = true;
        loop {
            tokio::select! {
                n = notes.recv() => {
                    let Some(n) = n else { break };
                    let mut one = ListsChanged::default();
                    let known = one.mark(&n.method);
                    let wanted = (one.tools && got.tools) || (one.prompts && got.prompts) || (one.resources && got.resources);
                    if known && wanted {
                        tell(&n.method);
                    } else {
                        let method = crate::util::text::one_line(&n.method, 100);
                        tracing::debug!(server, %method, "notification not subscribed to; ignored");
                    }
                }
                ended = &mut listen => {
                    let outcome = crate::util::text::one_line(&format!("{ended:?}"), 300);
                    tracing::debug!(server, %outcome, "subscriptions/listen ended");
                    break;
                }
            }
        }
        drop(announcing);
        // What was kept while it announced changes (lists without hints, for
        // `default_ttl`) is read again: nothing would drop it now, and a subscription
        // opened again may be refused.
        tell_all(got);
        if conn.is_closed() {
            return; // the actor listens again on the next connection
        }
        if opened.elapsed() > REOPEN_AT_MOST {
            pause = REOPEN_AFTER;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(REOPEN_AT_MOST);
    }
}

/// A connection's acknowledged subscription, said to announce nothing once dropped.
struct Announcing<'a>(&'a Connection);

impl Drop for Announcing<'_> {
    fn drop(&mut self) {
        self.0.set_announced([false; 3]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(method: &str, params: Value) -> Notification {
        Notification {
            method: method.into(),
            params: Some(params),
        }
    }

    const TOOLS: ListsChanged = ListsChanged {
        tools: true,
        prompts: false,
        resources: false,
    };

    #[test]
    fn the_acknowledgment_must_come_first_and_accept_only_what_was_asked() {
        let ack = |n: Value| {
            note(
                "notifications/subscriptions/acknowledged",
                json!({"notifications": n}),
            )
        };
        assert_eq!(
            accepted(&ack(json!({"toolsListChanged": true})), TOOLS),
            Ok(TOOLS)
        );
        assert_eq!(
            accepted(&ack(json!({"toolsListChanged": false})), TOOLS),
            Ok(ListsChanged::default()),
            "a server may accept less"
        );
        assert!(
            accepted(
                &ack(json!({"toolsListChanged": true, "promptsListChanged": true})),
                TOOLS
            )
            .is_err()
        );
        assert!(accepted(&note("notifications/tools/list_changed", json!({})), TOOLS).is_err());
    }

    #[test]
    fn only_lists_announced_as_changing_are_asked_for() {
        let caps = json!({"tools": {"listChanged": true}, "prompts": {}, "resources": {"listChanged": false}});
        assert_eq!(announced(&caps), TOOLS);
        assert!(!announced(&json!({"tools": {}})).any());
    }
}
