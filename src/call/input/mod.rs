//! Input handlers: how the harness answers what servers ask of the client
//! (`elicitation/create`, `sampling/createMessage`, `roots/list`), whether the question
//! comes as an MRTR input request (modern) or a server-to-client request (legacy).
//!
//! An [`InputHandler`] is registered per method with [`InputHandlers`], their one owner,
//! which derives the `clientCapabilities` the harness declares from them and tells the
//! servers when they change. Answering ([`InputHandlers::answer`]) runs the handler in a
//! task of its own under a deadline: a handler that panics, hangs or fails ends in a
//! typed error, and dropping the answer (the call was cancelled) aborts it.
//!
//! Built in: [`FixedAnswers`] (the same answer every time, for tests and scripts) and
//! [`ApprovalQueue`] (requests wait until another task, agent or person answers).

mod approval;
mod fixed;
mod handlers;
mod roots;
mod sampling;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde_json::{Value, json};

pub use approval::{ApprovalQueue, PendingInput};
pub use fixed::FixedAnswers;
pub(crate) use handlers::{HandlerSet, InputHandlers, InputHandlersActor, InputHandlersArgs};
pub use roots::{RootsHandler, validate_roots};
pub use sampling::{
    APPROVAL_META, AgentConfig, Provider, REVIEW_CHARS, REVIEW_MESSAGES, ReviewText,
    SamplingConfig, SamplingHandler, SamplingPolicy, SamplingReview, SharedAgents, review,
    roots_of, sampling_policy,
};

/// The boxed future an [`InputHandler`] returns.
pub type InputFuture = Pin<Box<dyn Future<Output = Result<Value, InputError>> + Send>>;

/// One question from a server. Not to be built field by field outside the crate (it
/// gains fields): an embedder testing a handler starts from [`InputRequestContext::new`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct InputRequestContext {
    /// The server asking.
    pub server: String,
    /// The method, for example `elicitation/create`.
    pub method: String,
    /// The request's params, as sent.
    pub params: Value,
    /// The agent whose call caused it: the caller of an MRTR round; for a legacy
    /// server's request, the caller of the call whose request's event stream carried
    /// it (legacy HTTP), else the agent of the calls on that server when it came, if
    /// they are all one agent's (none outside calls).
    pub agent_id: Option<String>,
    /// The MRTR key (empty for legacy requests).
    pub key: String,
    /// The harness's id of the call it came in (for a legacy server's request, the
    /// call whose request's stream carried it, else the one call on that server when
    /// it came, if there was one only).
    pub call_id: Option<u64>,
    /// When that call ends at the latest (its deadline): what it spends (its sampling
    /// budget) is kept until then.
    pub call_deadline: Option<std::time::Instant>,
    /// A legacy server's request that names no call (stdio, a legacy session's own
    /// stream) and came while calls of several agents were on it, or one that came
    /// during a request of no call (an embedder's own `HarnessHandle::request`): no one
    /// agent's settings apply (sampling is refused, roots are `"*"`'s).
    pub shared: bool,
    /// When the harness stops waiting for this answer (`input_timeout`, or sooner the
    /// call's deadline or round's limit); set as the handler is asked.
    pub answer_by: Option<std::time::Instant>,
}

impl InputRequestContext {
    /// A question of `method` from `server` outside any call, with no deadline; the
    /// other fields are public to set.
    pub fn new(
        server: impl Into<String>,
        method: impl Into<String>,
        params: Value,
    ) -> InputRequestContext {
        InputRequestContext {
            server: server.into(),
            method: method.into(),
            params,
            agent_id: None,
            key: String::new(),
            call_id: None,
            call_deadline: None,
            shared: false,
            answer_by: None,
        }
    }
}

/// Why a handler refused to answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Denial {
    /// The agent's settings do not allow it.
    #[error("agent {agent} may not use it")]
    NotAllowed {
        /// The agent (`(none)` for a request that names none).
        agent: String,
    },
    /// A person (or the approver) did not approve it.
    #[error("it was not approved")]
    NotApproved,
    /// The call's budget would be exceeded.
    #[error(
        "the call's budget of {budget} tokens would be exceeded ({spent} spent, {asked} asked)"
    )]
    BudgetExceeded {
        /// The budget.
        budget: u64,
        /// Spent so far.
        spent: u64,
        /// Asked by this request.
        asked: u64,
    },
    /// The server's budget for this minute would be exceeded (all its sampling,
    /// whatever the call).
    #[error(
        "server {server}'s budget of {budget} tokens a minute would be exceeded ({spent} spent, {asked} asked)"
    )]
    ServerBudgetExceeded {
        /// The server asking.
        server: String,
        /// The budget.
        budget: u64,
        /// Spent in this minute so far.
        spent: u64,
        /// Asked by this request.
        asked: u64,
    },
    /// The agent's budget for this minute would be exceeded (its calls' sampling on
    /// every server).
    #[error(
        "agent {agent}'s budget of {budget} tokens a minute would be exceeded ({spent} spent, {asked} asked)"
    )]
    AgentBudgetExceeded {
        /// The agent (`(none)` for requests that name none).
        agent: String,
        /// The budget.
        budget: u64,
        /// Spent in this minute so far.
        spent: u64,
        /// Asked by this request.
        asked: u64,
    },
    /// The budget of all sampling for this minute would be exceeded.
    #[error(
        "the budget of {budget} tokens a minute for all sampling would be exceeded ({spent} spent, {asked} asked)"
    )]
    TotalBudgetExceeded {
        /// The budget.
        budget: u64,
        /// Spent in this minute so far.
        spent: u64,
        /// Asked by this request.
        asked: u64,
    },
}

impl Denial {
    /// Why, as the agent whose call it ended is told when it is no operator (a gateway's
    /// client): its own call's and agent's spending, but no one else's (a server's
    /// budget and the total count other agents' sampling).
    pub fn as_told_to_the_agent(&self) -> String {
        match self {
            Denial::ServerBudgetExceeded { .. } | Denial::TotalBudgetExceeded { .. } => {
                self.as_told_to_the_server()
            }
            _ => self.to_string(),
        }
    }

    /// Why, as the server that asked is told: no agent's name and no spending but its
    /// own call's (the other budgets count other servers' and agents' sampling).
    pub fn as_told_to_the_server(&self) -> String {
        match self {
            Denial::NotAllowed { .. } => "the agent may not use it".into(),
            Denial::NotApproved => "it was not approved".into(),
            Denial::BudgetExceeded { .. } => self.to_string(),
            Denial::ServerBudgetExceeded { budget, .. } => {
                format!("this server's budget of {budget} tokens a minute would be exceeded")
            }
            Denial::AgentBudgetExceeded { .. } => {
                "the agent's budget of tokens a minute would be exceeded".into()
            }
            Denial::TotalBudgetExceeded { .. } => {
                "the budget of tokens a minute for all sampling would be exceeded".into()
            }
        }
    }
}

/// A handler could not answer.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum InputError {
    /// No answer within the deadline.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The handler failed.
    #[error("{0}")]
    Failed(String),
    /// No handler is registered for the method.
    #[error("no handler is registered for {0}")]
    NoHandler(String),
    /// The handler refused: policy, approval or budget.
    #[error("refused: {0}")]
    Denied(Denial),
}

/// Answers one kind of input request.
pub trait InputHandler: Send + Sync + 'static {
    /// What this handler adds to `clientCapabilities` under its method's capability
    /// (for elicitation: `{"form": {}}`, `{"url": {}}` or both).
    fn capability(&self) -> Value {
        json!({})
    }

    /// Answers one request: the bare result (for elicitation `{action, content}`).
    fn answer(&self, request: InputRequestContext) -> InputFuture;
}

/// The methods input handlers answer.
pub const INPUT_METHODS: &[&str] = &["elicitation/create", "sampling/createMessage", "roots/list"];

/// The capability name a method needs.
pub fn capability_name(method: &str) -> Option<&'static str> {
    match method {
        "elicitation/create" => Some("elicitation"),
        "sampling/createMessage" => Some("sampling"),
        "roots/list" => Some("roots"),
        _ => None,
    }
}

/// The elicitation mode a request asks for: `form` when it names none, `url`, or `None`
/// for any other (a mode this client does not know is refused, not taken for `form`).
pub fn elicitation_mode(params: &Value) -> Option<&'static str> {
    match params.get("mode") {
        None | Some(Value::Null) => Some("form"),
        Some(mode) => match mode.as_str() {
            Some("form") => Some("form"),
            Some("url") => Some("url"),
            _ => None,
        },
    }
}

/// The URL of a URL-mode elicitation, if it is one a person can be shown: a web page
/// judged by its host, `https` (`http` on this machine only), with no credentials in
/// it, of at most 2048 bytes. A server's `javascript:`, `file:` or
/// `https://bank.example@evil.example/` is none.
pub fn usable_elicitation_url(params: &Value) -> Option<url::Url> {
    let raw = params.get("url")?.as_str()?;
    // The text is what reaches the client, which may read it otherwise than the parser
    // here does: controls, spaces and tabs (which a parser strips or drops) and
    // backslashes (which it takes for slashes) are refused, not normalized away; and so
    // are invisible and bidi characters anywhere (an override that turns a path around),
    // and a host beyond ASCII (look-alike letters, which the parser encodes but a
    // client shows as written: an international host comes as `xn--`).
    // Written `scheme://authority` to the letter: the parser also reads a host after
    // `https:` with one slash, none or three, which a check of the text after `://`
    // would not see.
    let authority = raw
        .split_once("://")
        .filter(|(scheme, rest)| {
            (scheme.eq_ignore_ascii_case("https") || scheme.eq_ignore_ascii_case("http"))
                && !rest.starts_with('/')
        })
        .map(|(_, rest)| rest.split(['/', '?', '#']).next().unwrap_or(""))?;
    if raw.len() > 2048
        || raw.bytes().any(|b| b <= b' ' || b == b'\\' || b == 0x7f)
        || raw
            .chars()
            .any(|c| c.is_control() || crate::util::text::hidden(c))
        || !authority.is_ascii()
    {
        return None;
    }
    url::Url::parse(raw).ok().filter(|u| {
        let local = matches!(u.host_str(), Some("localhost" | "127.0.0.1" | "[::1]"));
        u.username().is_empty()
            && u.password().is_none()
            && (u.scheme() == "https" || (u.scheme() == "http" && local))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_url_mode_url_is_a_web_page_without_credentials() {
        for good in [
            "https://auth.example/authorize?x=1",
            "http://127.0.0.1:8080/cb",
            "http://localhost/x",
            // A path beyond ASCII is shown as it is meant.
            "https://de.wikipedia.org/wiki/Stra\u{df}e",
        ] {
            assert!(
                usable_elicitation_url(&json!({"url": good})).is_some(),
                "{good}"
            );
        }
        for odd in [
            "\u{1}https://a.example/",
            " https://a.example/",
            "https://a.exa\tmple/",
            "https://a.example\\@b.example/",
            // Look-alike letters, and a bidi override (both encoded by the parser).
            "https://\u{430}pple.com/login",
            "https://evil.example/\u{202e}moc.knab",
            "https://a.example/x\u{200b}y",
            // A host the parser reads however many slashes come after the scheme.
            "https:\u{430}pple.com/login",
            "https:/\u{430}pple.com/login",
            "https:///\u{430}pple.com/login",
        ] {
            assert!(
                usable_elicitation_url(&json!({"url": odd})).is_none(),
                "{odd:?}"
            );
        }
        let long = format!("https://a.example/{}", "x".repeat(2048));
        for bad in [
            "javascript:alert(1)",
            "file:///etc/passwd",
            "https://bank.example@evil.example/",
            "https://user:pw@host.example/",
            "http://evil.example/",
            "not a url",
            long.as_str(),
        ] {
            assert!(
                usable_elicitation_url(&json!({"url": bad})).is_none(),
                "{bad}"
            );
        }
        assert!(usable_elicitation_url(&json!({})).is_none());
        assert!(usable_elicitation_url(&json!({"url": 5})).is_none());
    }

    #[test]
    fn an_elicitation_mode_other_than_form_or_url_is_none_not_form() {
        assert_eq!(elicitation_mode(&json!({})), Some("form"));
        assert_eq!(elicitation_mode(&json!({"mode": null})), Some("form"));
        assert_eq!(elicitation_mode(&json!({"mode": "form"})), Some("form"));
        assert_eq!(elicitation_mode(&json!({"mode": "url"})), Some("url"));
        for other in [json!("URL"), json!("forms"), json!(1), json!({"x": 1})] {
            assert_eq!(elicitation_mode(&json!({"mode": other})), None, "{other}");
        }
    }
}
