//! `subscriptions/listen` on a modern connection: the request is held open, and the
//! notifications the server tags with its id (`_meta["io.modelcontextprotocol/
//! subscriptionId"]`) go to the listener that opened it, not to the connection's event
//! channel. On HTTP they arrive on the request's own event stream, on stdio on the pipe
//! beside everything else; the dispatcher routes both by the tag.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::{Connection, Era};
use crate::protocol::{Notification, Request, RequestId, Stamp};
use crate::transport::error::{RequestError, TransportError};

/// The `_meta` key that ties a notification to its subscription.
const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

/// How long a listen request may stay open: as long as the connection lives.
const HELD_OPEN: Duration = Duration::from_secs(365 * 24 * 3600);

/// The open subscriptions of one connection, by request id.
#[derive(Clone, Default)]
pub(super) struct Subscriptions(Arc<Mutex<HashMap<String, Listener>>>);

/// One open subscription: where its notifications go, and how the server ends it.
struct Listener {
    sink: mpsc::Sender<Notification>,
    /// Takes the params of the server's `notifications/cancelled` for the listen id.
    ended: Option<oneshot::Sender<Value>>,
}

fn key(id: &Value) -> String {
    id.to_string()
}

/// The key of the subscription `id` names: its own, or, when no subscription is open
/// under it, the one of the request it is a new id of (`made_as`: an HTTP listen sent
/// again after a sign-in, whose notifications name the id it went out under last).
fn find(
    open: &HashMap<String, Listener>,
    id: &Value,
    made_as: impl Fn(&RequestId) -> RequestId,
) -> Option<String> {
    let own = key(id);
    if open.contains_key(&own) {
        return Some(own);
    }
    let sent = match id {
        Value::Number(n) => RequestId::Number(n.as_i64()?),
        Value::String(s) => RequestId::String(s.clone()),
        _ => return None,
    };
    let made = match made_as(&sent) {
        RequestId::Number(n) => key(&Value::from(n)),
        RequestId::String(s) => key(&Value::from(s)),
    };
    open.contains_key(&made).then_some(made)
}

impl Subscriptions {
    /// Hands `n` to its subscription if it carries a subscription id (`made_as` tells
    /// which request a new id was sent again for); `Err(n)` when it carries none (the
    /// connection's event channel takes it).
    pub(super) fn route(
        &self,
        n: Notification,
        made_as: impl Fn(&RequestId) -> RequestId,
    ) -> Result<(), Notification> {
        let Some(id) = n
            .params
            .as_ref()
            .and_then(|p| p.get("_meta"))
            .and_then(|m| m.get(SUBSCRIPTION_ID))
        else {
            return Err(n);
        };
        let sink = {
            let open = self.0.lock();
            find(&open, id, made_as).and_then(|k| open.get(&k).map(|l| l.sink.clone()))
        };
        match sink {
            // Full: the listener has changes pending already, and one more says nothing new.
            Some(sink) => {
                let _ = sink.try_send(n);
            }
            None => {
                tracing::debug!(method = %crate::util::text::one_line(&n.method, 100), "notification for a subscription not open; dropped")
            }
        }
        Ok(())
    }

    /// The server ended a subscription with `notifications/cancelled` naming its listen
    /// request (one spec page has it so, another has a final result: both end it).
    /// False when `params` names no open subscription (`made_as` as for
    /// [`Subscriptions::route`]).
    pub(super) fn end(
        &self,
        params: Option<&Value>,
        made_as: impl Fn(&RequestId) -> RequestId,
    ) -> bool {
        let Some(id) = params.and_then(|p| p.get("requestId")) else {
            return false;
        };
        let mut open = self.0.lock();
        let Some(listener) = find(&open, id, made_as).and_then(|k| open.get_mut(&k)) else {
            return false;
        };
        if let Some(ended) = listener.ended.take() {
            let _ = ended.send(params.cloned().unwrap_or(Value::Null));
        }
        true
    }
}

/// Removes a subscription when its request ends, however it ends.
struct Registered<'a>(&'a Subscriptions, String);

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.0.0.lock().remove(&self.1);
    }
}

impl Connection {
    /// Opens `subscriptions/listen` with `notifications` (the filter) and holds it open:
    /// every notification of the subscription goes to `sink`, the acknowledgment first
    /// (if the server keeps the rules). Returns when the server ends it (`Ok` with its
    /// final result, or with the params of the `notifications/cancelled` it sent for
    /// the listen request instead) or the connection fails. Dropping the future ends
    /// the subscription (HTTP: the stream is closed; stdio: `notifications/cancelled`).
    pub async fn listen(
        &self,
        notifications: Value,
        sink: mpsc::Sender<Notification>,
    ) -> Result<Value, RequestError> {
        if self.era() != Era::Modern {
            return Err(RequestError::Transport(TransportError::NotSent(
                "subscriptions/listen is a 2026-07-28 request".into(),
            )));
        }
        let id = self.ids.next();
        let id_value = match &id {
            RequestId::Number(n) => Value::from(*n),
            RequestId::String(s) => Value::from(s.clone()),
        };
        let (ended, ended_by_server) = oneshot::channel();
        let _registered = {
            let k = key(&id_value);
            let listener = Listener {
                sink,
                ended: Some(ended),
            };
            self.subscriptions.0.lock().insert(k.clone(), listener);
            Registered(&self.subscriptions, k)
        };
        let request = Request {
            id,
            method: "subscriptions/listen".into(),
            params: Some(serde_json::json!({ "notifications": notifications })),
        };
        let envelope = self.envelope.read().clone();
        let stamp = Stamp {
            envelope: &envelope,
            capabilities: None,
        };
        // Sent again under a new id (HTTP, after a sign-in), it is still found by the
        // id it was made with: the dispatcher asks the transport.
        let mut sent = request.id.clone();
        let answer =
            self.transport
                .request((&request).into(), Some(stamp), HELD_OPEN, None, &mut sent);
        tokio::pin!(answer);
        let answer = tokio::select! {
            // First: once the server ended it, whatever else is ready.
            biased;
            Ok(cancelled) = ended_by_server => {
                // Forgotten before `answer` drops, so it is not cancelled back.
                self.transport.ended_by_server(&request.id);
                return Ok(cancelled);
            }
            answer = &mut answer => answer,
        };
        match answer {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(error)) => Err(RequestError::Rpc(error)),
            Err(e) => Err(RequestError::Transport(e)),
        }
    }
}
