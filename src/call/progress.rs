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

/// One live token: the server it was given to, where its updates go, the caller's token.
type Route = (String, ProgressSender, Value);

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
    /// A token for one call on `server`, routed to `to` as `caller_token`.
    pub(crate) fn register(
        self: &Arc<Self>,
        server: &str,
        to: ProgressSender,
        caller_token: Value,
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
        routes.insert(token.clone(), (server.to_string(), to, caller_token));
        drop(routes);
        ProgressToken {
            router: self.clone(),
            token,
        }
    }

    /// `server`'s `notifications/progress`: to its call's caller, with the caller's
    /// token; dropped when the token is not one this server was given, or the caller
    /// is slow (progress is advisory).
    pub(crate) fn deliver(&self, server: &str, params: Option<&Value>) {
        let Some(params) = params else { return };
        let Some(token) = params.get("progressToken").and_then(Value::as_str) else {
            return;
        };
        let Some((to, caller_token)) = self
            .routes
            .lock()
            .get(token)
            .filter(|(owner, _, _)| owner == server)
            .map(|(_, to, t)| (to.clone(), t.clone()))
        else {
            return;
        };
        let mut params = params.clone();
        params["progressToken"] = caller_token;
        let _ = to.try_send(params);
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
        let token = router.register("s", tx, json!("mine"));
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
        drop(token);
        assert!(
            router.routes.lock().is_empty(),
            "the route ends with its call"
        );
    }
}
