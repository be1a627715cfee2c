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

    /// The list that says who offers what.
    pub fn list(self) -> ListKind {
        match self {
            CallKind::Tool => ListKind::Tools,
            CallKind::Prompt => ListKind::Prompts,
            CallKind::Resource => ListKind::Resources,
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

/// A list the servers keep of what they offer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ListKind {
    /// `tools/list`.
    Tools,
    /// `prompts/list`.
    Prompts,
    /// `resources/list`.
    Resources,
    /// `resources/templates/list`: RFC 6570 templates of the URIs a server reads
    /// without listing each one (`file:///{path}`).
    ResourceTemplates,
}

impl ListKind {
    /// The list's method.
    pub fn method(self) -> &'static str {
        match self {
            ListKind::Tools => "tools/list",
            ListKind::Prompts => "prompts/list",
            ListKind::Resources => "resources/list",
            ListKind::ResourceTemplates => "resources/templates/list",
        }
    }

    /// The array in its result.
    pub fn key(self) -> &'static str {
        match self {
            ListKind::Tools => "tools",
            ListKind::Prompts => "prompts",
            ListKind::Resources => "resources",
            ListKind::ResourceTemplates => "resourceTemplates",
        }
    }

    /// The server capability that says it has such items (templates are a part of
    /// `resources`).
    pub fn capability(self) -> &'static str {
        match self {
            ListKind::Tools => "tools",
            ListKind::Prompts => "prompts",
            ListKind::Resources | ListKind::ResourceTemplates => "resources",
        }
    }

    /// The field that names an item.
    pub fn item_key(self) -> &'static str {
        match self {
            ListKind::Tools | ListKind::Prompts => "name",
            ListKind::Resources => "uri",
            ListKind::ResourceTemplates => "uriTemplate",
        }
    }
}

impl From<CallKind> for ListKind {
    fn from(kind: CallKind) -> ListKind {
        kind.list()
    }
}
