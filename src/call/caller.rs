//! Who calls, and what a call asks for.

use std::sync::Arc;

use serde_json::{Map, Value, json};

/// Who is calling: the agent (required: anonymous callers are denied) and the
/// authorization context that keys `private` cache entries. Shared strings: a call
/// keeps a copy of its caller, which costs two reference counts, not two allocations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Caller {
    /// The agent's id; grants are keyed by it.
    pub agent_id: Option<Arc<str>>,
    /// An opaque identity of the caller's credentials (for example a token's subject).
    pub auth_context: Option<Arc<str>>,
}

impl Caller {
    /// A caller with an agent id and no auth context.
    pub fn agent(id: impl AsRef<str>) -> Caller {
        Caller {
            agent_id: Some(id.as_ref().into()),
            auth_context: None,
        }
    }

    /// The same caller with an auth context.
    pub fn with_auth_context(mut self, ctx: impl AsRef<str>) -> Caller {
        self.auth_context = Some(ctx.as_ref().into());
        self
    }
}

/// What a call asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CallKind {
    /// `tools/call`.
    Tool,
    /// `prompts/get`.
    Prompt,
    /// `resources/read`.
    Resource,
}

impl CallKind {
    /// `tool`, `prompt` or `resource`, as records name it.
    pub fn as_str(self) -> &'static str {
        match self {
            CallKind::Tool => "tool",
            CallKind::Prompt => "prompt",
            CallKind::Resource => "resource",
        }
    }

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

    /// The method that calls an item.
    pub fn method(self) -> &'static str {
        match self {
            CallKind::Tool => "tools/call",
            CallKind::Prompt => "prompts/get",
            CallKind::Resource => "resources/read",
        }
    }

    /// The params of a call with `args` (a resource read has none: they are dropped),
    /// its item not named yet ([`CallKind::set_item`]).
    pub(crate) fn params(self, args: Value) -> Map<String, Value> {
        let mut p = Map::new();
        match self {
            CallKind::Tool | CallKind::Prompt => {
                p.insert("arguments".into(), args);
            }
            CallKind::Resource => {}
        }
        p
    }

    /// Writes `item` (a tool or prompt name, or a uri) into a call's `params`.
    pub(crate) fn set_item(self, params: &mut Map<String, Value>, item: &str) {
        params.insert(self.item_key().into(), json!(item));
    }
}
