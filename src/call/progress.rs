//! Progress of calls whose caller asked for it: each such call's requests carry a
//! `progressToken` of the harness's own (random, 128 bits), and that server's
//! `notifications/progress` for it reach the caller's channel. A token a server invents
//! or guesses, or one another server names, reaches nobody.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::mpsc;

/// Progress updates of one call: the notification's params, the token the caller gave
/// in place of the harness's.
pub type ProgressSender = mpsc::Sender<Value>;

/// The longest `message` an update carries on, in bytes (cut on a character).
pub(crate) const MESSAGE_BYTES: usize = 4096;

/// The last `progress` a call's servers gave: one for all its attempts (a request
/// sent again, another server after a failover), as its caller sees one stream of
/// updates under one token.
pub(crate) type ProgressLast = Arc<Mutex<Option<f64>>>;

/// One live token.
struct Route {
    /// The server it was given to.
    server: String,
    /// Where its updates go.
    to: ProgressSender,
    /// The caller's token, put in place of the harness's.
    caller_token: Value,
    /// The last `progress` its call's servers gave (each must be greater).
    last: ProgressLast,
}

/// The longest token routed: ours are 32 hex digits, lengthened by one `x` per
/// collision.
const MAX_TOKEN: usize = 64;

/// Live progress tokens, by token.
#[derive(Default)]
pub(crate) struct ProgressRouter {
    routes: Mutex<HashMap<String, Route>>,
}

/// A call's token while it lives.
pub(crate) struct ProgressToken {
    router: Arc<ProgressRouter>,
    pub(crate) token: String,
}

impl Drop for ProgressToken {
    fn drop(&mut self) {
        self.router.routes.lock().remove(&self.token);
    }
}

impl ProgressRouter {
    /// A token for one call on `server`, routed to `to` as `caller_token`, its updates
    /// greater than `last` (the call's, shared by its attempts).
    pub(crate) fn register(
        self: &Arc<Self>,
        server: &str,
        to: ProgressSender,
        caller_token: Value,
        last: ProgressLast,
    ) -> ProgressToken {
        let mut raw = [0u8; 16];
        // Should the OS fail us the token is still unique (a repeat is extended below);
        // only guessing it gets easier.
        let _ = getrandom::fill(&mut raw);
        let mut token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let mut routes = self.routes.lock();
        while routes.contains_key(&token) {
            token.push('x');
        }
        let route = Route {
            server: server.to_string(),
            to,
            caller_token,
            last,
        };
        routes.insert(token.clone(), route);
        drop(routes);
        ProgressToken {
            router: self.clone(),
            token,
        }
    }

    /// `server`'s `notifications/progress`: to its call's caller, with the caller's
    /// token; dropped when the token is not one this server was given, or the caller
    /// is slow (progress is advisory). Only the spec's fields go on (`progress`,
    /// `total`, `message` cut to [`MESSAGE_BYTES`]), built anew: what a server adds
    /// beside them, however large, is neither copied nor queued. An update whose
    /// `progress` is no number, or not greater than the last one, is dropped: the spec
    /// says it increases, and a client downstream may rely on it.
    pub(crate) fn deliver(&self, server: &str, params: Option<&Value>) {
        let Some(params) = params else { return };
        // Ours are 32 hex digits (and an `x` per collision): a longer one is no route,
        // and is not hashed under the lock every server's reader takes.
        let Some(token) =
            (params.get("progressToken").and_then(Value::as_str)).filter(|t| t.len() <= MAX_TOKEN)
        else {
            return;
        };
        let (Some(progress), Some(value)) = (
            params.get("progress").and_then(Value::as_f64),
            params.get("progress"),
        ) else {
            return;
        };
        let mut routes = self.routes.lock();
        let Some(route) = routes.get_mut(token).filter(|r| r.server == server) else {
            return;
        };
        {
            let mut last = route.last.lock();
            if last.is_some_and(|last| progress <= last) {
                return;
            }
            *last = Some(progress);
        }
        if route.to.capacity() == 0 {
            return;
        }
        let mut update = serde_json::Map::new();
        update.insert("progressToken".into(), route.caller_token.clone());
        update.insert("progress".into(), value.clone());
        if let Some(total) = params.get("total").filter(|t| t.is_number()) {
            update.insert("total".into(), total.clone());
        }
        if let Some(message) = params.get("message").and_then(Value::as_str) {
            let mut end = message.len().min(MESSAGE_BYTES);
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            update.insert("message".into(), Value::from(&message[..end]));
        }
        let to = route.to.clone();
        drop(routes);
        let _ = to.try_send(Value::Object(update));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn updates_reach_only_their_call_from_the_server_given_the_token() {
        let router = Arc::new(ProgressRouter::default());
        let (tx, mut rx) = mpsc::channel(8);
        let last = ProgressLast::default();
        let token = router.register("s", tx.clone(), json!("mine"), last.clone());
        assert_eq!(token.token.len(), 32, "128 random bits");
        router.deliver(
            "other",
            Some(&json!({"progressToken": token.token, "progress": 1})),
        );
        router.deliver(
            "s",
            Some(&json!({"progressToken": "guessed", "progress": 2})),
        );
        router.deliver(
            "s",
            Some(&json!({"progressToken": token.token, "progress": 3})),
        );
        let got = rx.try_recv().expect("one update");
        assert_eq!(
            (got["progressToken"].clone(), got["progress"].clone()),
            (json!("mine"), json!(3))
        );
        assert!(rx.try_recv().is_err(), "nothing else got through");
        // Not greater, or no number: dropped. Fields beside the spec's are not copied,
        // and a long message is cut on a character.
        for progress in [json!(3), json!(2.5), json!("lots"), Value::Null] {
            let update = json!({"progressToken": token.token, "progress": progress});
            router.deliver("s", Some(&update));
        }
        assert!(rx.try_recv().is_err(), "none of them got through");
        let long = format!("a{}", "é".repeat(MESSAGE_BYTES));
        let update = json!({"progressToken": token.token, "progress": 3.5, "total": 9,
            "message": long, "_meta": {"x": "y"}, "junk": vec![0; 1000]});
        router.deliver("s", Some(&update));
        let got = rx.try_recv().expect("a greater one");
        let message = got["message"].as_str().unwrap_or_default();
        assert_eq!(message.len(), MESSAGE_BYTES - 1, "cut on a character");
        let mut got = got;
        got["message"] = json!("cut");
        assert_eq!(
            got,
            json!({"progressToken": "mine", "progress": 3.5, "total": 9, "message": "cut"})
        );
        // Another attempt of the same call (a failover): its updates go on from the
        // last one the caller saw, not from the start.
        let again = router.register("t", tx, json!("mine"), last);
        for progress in [1.0, 3.5, 4.0] {
            let update = json!({"progressToken": again.token, "progress": progress});
            router.deliver("t", Some(&update));
        }
        let got = rx.try_recv().expect("a greater one");
        assert_eq!(got["progress"], json!(4.0));
        assert!(rx.try_recv().is_err(), "none before it");
        drop(again);
        drop(token);
        assert!(
            router.routes.lock().is_empty(),
            "the route ends with its call"
        );
    }
}
