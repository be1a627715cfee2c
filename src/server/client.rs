//! What a server needs from the client side of the harness, as a narrow interface the
//! layer above implements: the capabilities to declare, answers to what a legacy
//! server asks (`elicitation/create`, `sampling/createMessage`, `roots/list`), and a
//! place to say that a server's lists changed. The server layer knows nothing else of
//! the layers above it.

use serde_json::Value;

use crate::transport::ServerRequest;

/// Which of a server's lists changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListsChanged {
    /// `notifications/tools/list_changed`.
    pub tools: bool,
    /// `notifications/prompts/list_changed`.
    pub prompts: bool,
    /// `notifications/resources/list_changed`.
    pub resources: bool,
}

impl ListsChanged {
    /// Every list.
    pub const ALL: ListsChanged = ListsChanged {
        tools: true,
        prompts: true,
        resources: true,
    };

    /// Marks the list a `notifications/*/list_changed` method names; false for any
    /// other method.
    pub fn mark(&mut self, method: &str) -> bool {
        match method {
            "notifications/tools/list_changed" => self.tools = true,
            "notifications/prompts/list_changed" => self.prompts = true,
            "notifications/resources/list_changed" => self.resources = true,
            _ => return false,
        }
        true
    }

    /// Whether `method` is a `notifications/*/list_changed` this marks.
    pub fn concerns(method: &str) -> bool {
        ListsChanged::default().mark(method)
    }

    /// Whether any list changed.
    pub fn any(&self) -> bool {
        self.tools || self.prompts || self.resources
    }

    /// The lists marked in either.
    pub fn union(self, other: ListsChanged) -> ListsChanged {
        ListsChanged {
            tools: self.tools || other.tools,
            prompts: self.prompts || other.prompts,
            resources: self.resources || other.resources,
        }
    }

    /// The lists marked in both.
    pub fn intersect(self, other: ListsChanged) -> ListsChanged {
        ListsChanged {
            tools: self.tools && other.tools,
            prompts: self.prompts && other.prompts,
            resources: self.resources && other.resources,
        }
    }

    /// The `notifications/*/list_changed` methods of the lists marked, tools first.
    pub fn methods(self) -> impl Iterator<Item = &'static str> {
        [
            (self.tools, "notifications/tools/list_changed"),
            (self.prompts, "notifications/prompts/list_changed"),
            (self.resources, "notifications/resources/list_changed"),
        ]
        .into_iter()
        .filter_map(|(marked, method)| marked.then_some(method))
    }

    /// The lists marked in `self` and not in `other`.
    pub fn without(self, other: ListsChanged) -> ListsChanged {
        ListsChanged {
            tools: self.tools && !other.tools,
            prompts: self.prompts && !other.prompts,
            resources: self.resources && !other.resources,
        }
    }
}

/// The client side, as servers see it.
pub trait ClientSide: Send + Sync + 'static {
    /// `clientCapabilities` to declare (at a legacy `initialize`, and on modern
    /// requests that name none of their own).
    fn capabilities(&self) -> Value;

    /// Answers a legacy server's request; may take as long as a person does, so it
    /// must not block: answer through `request.respond` from a task of its own.
    fn answer(&self, server: &str, request: ServerRequest);

    /// A server said its lists changed (coalesced: at most once per server per tick).
    fn lists_changed(&self, server: &str, changed: ListsChanged);

    /// A server's `notifications/progress` (its params), for the call that asked.
    fn progress(&self, server: &str, params: Option<&Value>);

    /// A server was added (by an add, not a restart or a replacement): it is in the
    /// directory and its actor started, not yet connected. Told once, when the add
    /// takes effect: also when whoever asked for it gave up waiting, and by the
    /// supervisor rebuilt after one that died in the add.
    fn added(&self, server: &str);
}
