//! Who may call what: grants from agent to server (or `tag:NAME`, or `*`) to tools
//! (exact names or `*`). Default deny; a caller without an agent id is denied.
//!
//! [`Policy`] is plain data, tested without actors. [`PermissionActor`] owns changes at
//! run time; every check reads the shared snapshot it publishes, so authorization never
//! waits on a mailbox.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::RwLock;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

/// Grants: agent id → selector (server id, `tag:NAME` or `*`) → tool names (or `*`).
pub type Grants = BTreeMap<String, BTreeMap<String, Vec<String>>>;

/// The permission policy.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Policy {
    grants: Grants,
}

impl Policy {
    /// A policy from grants.
    pub fn new(grants: Grants) -> Policy {
        Policy { grants }
    }

    /// The grants.
    pub fn grants(&self) -> &Grants {
        &self.grants
    }

    /// Whether `agent` may use `tool` on server `server` (which has `tags`).
    pub fn allows(&self, agent: Option<&str>, server: &str, tags: &[String], tool: &str) -> bool {
        let Some(by_selector) = agent.and_then(|a| self.grants.get(a)) else {
            return false;
        };
        by_selector.iter().any(|(selector, tools)| {
            let selected = selector == "*"
                || selector == server
                || selector
                    .strip_prefix("tag:")
                    .is_some_and(|t| tags.iter().any(|x| x == t));
            selected && tools.iter().any(|t| t == "*" || t == tool)
        })
    }

    /// Whether `agent` may use anything at all on `server`.
    pub fn allows_any(&self, agent: Option<&str>, server: &str, tags: &[String]) -> bool {
        let Some(by_selector) = agent.and_then(|a| self.grants.get(a)) else {
            return false;
        };
        by_selector.iter().any(|(selector, tools)| {
            (selector == "*"
                || selector == server
                || selector
                    .strip_prefix("tag:")
                    .is_some_and(|t| tags.iter().any(|x| x == t)))
                && !tools.is_empty()
        })
    }
}

/// Messages of the permission actor: changes at run time.
pub enum PermissionMsg {
    /// Adds tools to `agent`'s grant on `selector`.
    Grant {
        /// Agent id.
        agent: String,
        /// Server id, `tag:NAME` or `*`.
        selector: String,
        /// Tool names or `*`.
        tools: Vec<String>,
        /// Acknowledgement.
        reply: RpcReplyPort<()>,
    },
    /// Removes `agent`'s grant on `selector` (every grant of the agent when `None`).
    Revoke {
        /// Agent id.
        agent: String,
        /// The selector, or all.
        selector: Option<String>,
        /// Acknowledgement.
        reply: RpcReplyPort<()>,
    },
}

/// Owns the policy's changes; see the module docs.
pub struct PermissionActor;

impl Actor for PermissionActor {
    type Msg = PermissionMsg;
    type State = Arc<RwLock<Policy>>;
    type Arguments = Arc<RwLock<Policy>>;

    async fn pre_start(
        &self,
        _: ActorRef<PermissionMsg>,
        policy: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(policy)
    }

    async fn handle(
        &self,
        _: ActorRef<PermissionMsg>,
        msg: PermissionMsg,
        policy: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            PermissionMsg::Grant {
                agent,
                selector,
                tools,
                reply,
            } => {
                let mut p = policy.write();
                let entry = p
                    .grants
                    .entry(agent)
                    .or_default()
                    .entry(selector)
                    .or_default();
                for t in tools {
                    if !entry.contains(&t) {
                        entry.push(t);
                    }
                }
                drop(p);
                let _ = reply.send(());
            }
            PermissionMsg::Revoke {
                agent,
                selector,
                reply,
            } => {
                let mut p = policy.write();
                match selector {
                    Some(s) => {
                        if let Some(g) = p.grants.get_mut(&agent) {
                            g.remove(&s);
                        }
                    }
                    None => {
                        p.grants.remove(&agent);
                    }
                }
                drop(p);
                let _ = reply.send(());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        let mut g = Grants::new();
        g.entry("planner".into())
            .or_default()
            .insert("files".into(), vec!["read".into()]);
        g.entry("planner".into())
            .or_default()
            .insert("tag:search".into(), vec!["*".into()]);
        g.entry("root".into())
            .or_default()
            .insert("*".into(), vec!["*".into()]);
        Policy::new(g)
    }

    #[test]
    fn grants_match_exact_tools_wildcards_and_tags() {
        let p = policy();
        let none: &[String] = &[];
        assert!(p.allows(Some("planner"), "files", none, "read"));
        assert!(!p.allows(Some("planner"), "files", none, "write"));
        assert!(p.allows(Some("planner"), "web", &["search".into()], "anything"));
        assert!(!p.allows(Some("planner"), "web", &["other".into()], "anything"));
        assert!(p.allows(Some("root"), "x", none, "y"));
    }

    #[test]
    fn default_deny_and_anonymous_callers_are_denied() {
        let p = policy();
        assert!(!p.allows(Some("stranger"), "files", &[], "read"));
        assert!(!p.allows(None, "files", &[], "read"));
        assert!(!p.allows_any(None, "files", &[]));
    }
}
