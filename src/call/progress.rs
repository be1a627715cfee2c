//! Progress of calls whose caller asked for it: each such call's requests carry a
//! `progressToken` of the harness's own (`hp-N`, unique in the harness), and the servers'
//! `notifications/progress` for it reach the caller's channel. Tokens a server invents
//! reach nobody.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::mpsc;

/// Progress updates of one call: the notification's params, the token the caller gave
/// in place of the harness's.
pub type ProgressSender = mpsc::Sender<Value>;

/// Live progress tokens, by token.
#[derive(Default)]
pub(crate) struct ProgressRouter {
    next: AtomicU64,
    routes: Mutex<HashMap<String, (ProgressSender, Value)>>,
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
    /// A token for one call, routed to `to` as `caller_token`.
    pub(crate) fn register(
        self: &Arc<Self>,
        to: ProgressSender,
        caller_token: Value,
    ) -> ProgressToken {
        let token = format!("hp-{}", self.next.fetch_add(1, Ordering::Relaxed));
        self.routes.lock().insert(token.clone(), (to, caller_token));
        ProgressToken {
            router: self.clone(),
            token,
        }
    }

    /// A server's `notifications/progress`: to its call's caller, with the caller's
    /// token; dropped when the caller is slow (progress is advisory) or unknown.
    pub(crate) fn deliver(&self, params: Option<&Value>) {
        let Some(params) = params else { return };
        let Some(token) = params.get("progressToken").and_then(Value::as_str) else {
            return;
        };
        let Some((to, caller_token)) = self.routes.lock().get(token).cloned() else {
            return;
        };
        let mut params = params.clone();
        params["progressToken"] = caller_token;
        let _ = to.try_send(params);
    }
}
