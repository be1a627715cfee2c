//! [`RootsHandler`]: `roots/list` answered from config, per agent (`[agents.NAME]
//! roots`; `"*"`'s for agents not named, and for a legacy server's request that is no
//! one agent's: asked outside calls, as servers do at start and after
//! `notifications/roots/list_changed`, or naming no call while several agents' calls
//! are on it).

use serde_json::{Value, json};

use super::sampling::{SharedAgents, roots_of};
use super::{InputFuture, InputHandler, InputRequestContext};

/// See the module docs.
pub struct RootsHandler {
    agents: SharedAgents,
}

impl RootsHandler {
    /// Roots read from `agents` at each request (replaced on reload).
    pub fn new(agents: SharedAgents) -> RootsHandler {
        RootsHandler { agents }
    }
}

/// Checks that every agent's roots are `file://` URIs, as the protocol has them.
pub fn validate_roots(
    agents: &std::collections::BTreeMap<String, super::AgentConfig>,
) -> Result<(), crate::util::invalid::Invalid> {
    for (name, agent) in agents {
        let not_a_file = agent
            .roots
            .iter()
            .flatten()
            .position(|r| !r.starts_with("file://"));
        if let Some(i) = not_a_file {
            return Err(crate::util::invalid::Invalid::new(
                format!("agents.{name}.roots[{i}]"),
                "must be a file:// URI",
            ));
        }
    }
    Ok(())
}

/// A root's display name: the last segment of its path.
fn name_of(uri: &str) -> Option<String> {
    let path = uri.strip_prefix("file://")?;
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty())
        .map(String::from)
}

impl InputHandler for RootsHandler {
    fn capability(&self) -> Value {
        // Legacy servers are told when the configured roots change.
        json!({"listChanged": true})
    }

    fn answer(&self, request: InputRequestContext) -> InputFuture {
        let roots: Vec<Value> = {
            roots_of(&self.agents.read(), request.agent_id.as_deref())
                .into_iter()
                .map(|uri| match name_of(&uri) {
                    Some(name) => json!({"uri": uri, "name": name}),
                    None => json!({"uri": uri}),
                })
                .collect()
        };
        Box::pin(async move { Ok(json!({ "roots": roots })) })
    }
}
