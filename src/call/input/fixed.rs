//! [`FixedAnswers`]: the same answer to every request (or one computed per request),
//! for tests and scripts. It never accepts a URL-mode elicitation on its own: sending a
//! person to a URL needs their consent, which a fixed answer cannot give.

use std::sync::Arc;

use serde_json::{Value, json};

use super::{InputFuture, InputHandler, InputRequestContext, elicitation_mode};

/// Always gives the same answer (a closure may shape it per request).
pub struct FixedAnswers {
    answer: Arc<dyn Fn(&InputRequestContext) -> Value + Send + Sync>,
    capability: Value,
    accept_url_mode: bool,
}

impl FixedAnswers {
    /// Answers every request with `value`.
    pub fn new(value: Value) -> FixedAnswers {
        Self::from_fn(move |_| value.clone())
    }

    /// Answers every request with what `f` returns for it.
    pub fn from_fn(
        f: impl Fn(&InputRequestContext) -> Value + Send + Sync + 'static,
    ) -> FixedAnswers {
        FixedAnswers {
            answer: Arc::new(f),
            capability: json!({"form": {}}),
            accept_url_mode: false,
        }
    }

    /// Declares this capability object instead of `{"form": {}}`.
    pub fn with_capability(mut self, capability: Value) -> FixedAnswers {
        self.capability = capability;
        self
    }

    /// Lets the answer stand for URL-mode elicitation too (declined otherwise). Only for
    /// tests that stand in for a person who consented.
    pub fn accepting_url_mode(mut self) -> FixedAnswers {
        self.accept_url_mode = true;
        self
    }
}

impl InputHandler for FixedAnswers {
    fn capability(&self) -> Value {
        self.capability.clone()
    }

    fn answer(&self, request: InputRequestContext) -> InputFuture {
        let declined = request.method == "elicitation/create"
            && match elicitation_mode(&request.params) {
                Some("url") => !self.accept_url_mode,
                Some(_) => false,
                None => true,
            };
        let value = if declined {
            json!({"action": "decline"})
        } else {
            (self.answer)(&request)
        };
        Box::pin(async move { Ok(value) })
    }
}
