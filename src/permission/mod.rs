//! Who may call what: grants from agent to server (or `tag:NAME`, or `*`) to tools
//! (exact names or `*`). Default deny; a caller without an agent id is denied.
//!
//! [`Policy`] is plain data, tested without actors. [`PermissionActor`] owns changes at
//! run time; every check reads the shared snapshot it publishes, so authorization never
//! waits on a mailbox. The snapshot lives outside the actor: a rebuilt actor keeps every
//! grant.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::util::slot::ActorSlot;

/// Grants: agent id → selector (server id, `tag:NAME` or `*`) → tool names (or `*`).
pub type Grants = BTreeMap<String, BTreeMap<String, Vec<String>>>;

/// The permission policy.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Policy {
    grants: Grants,
}

/// Refuses grants that would silently match nothing: a tool name with `*` in it (only
/// `*` alone takes in many: `read_*` is not a pattern), an empty tool name, and a
/// selector that is no server id (`files*`, `files `, `tags:web`, `TAG:web`), no
/// `tag:NAME` (`tag:`) and not `*`. Refuses too a qualified name (`files__read`) under
/// `*` or a tag: it would not grant `files`' `read` but any server's tool of that very
/// name, which a hostile server may list.
pub fn validate(grants: &Grants) -> Result<(), crate::util::invalid::Invalid> {
    use crate::util::invalid::Invalid;
    for (agent, selectors) in grants {
        // `*` reads as "every agent" (as `[agents."*"]` does), but would grant only an
        // agent of that very name, which a gateway's principal may be; an empty or
        // padded id names no agent a caller is.
        if agent == "*" || agent.is_empty() || agent.trim() != agent {
            return Err(Invalid::new(
                format!("permissions.{agent:?}"),
                "an agent id: each agent is granted by its own id (no * for every agent, \
                 nor an empty or padded one)",
            ));
        }
        for (selector, tools) in selectors {
            let field = || format!("permissions.{agent}.{selector}");
            // A tag may hold anything (tags are not checked); only an empty one names none.
            let tag_ok = |t: &str| !t.is_empty();
            let valid = selector == "*"
                || selector
                    .strip_prefix("tag:")
                    .map_or_else(|| crate::server::check_id(selector).is_ok(), tag_ok);
            if !valid {
                return Err(Invalid::new(
                    field(),
                    "a selector is a server id, tag:NAME or *",
                ));
            }
            for tool in tools {
                if tool.is_empty() {
                    return Err(Invalid::new(field(), "an empty tool name"));
                }
                let many = selector == "*" || selector.starts_with("tag:");
                if many
                    && let Some((server, _)) = tool.split_once(crate::server::SEPARATOR)
                    && crate::server::check_id(server).is_ok()
                {
                    return Err(Invalid::new(
                        field(),
                        format!(
                            "{tool:?} is a qualified name: grant it under its server \
                             ({server} = [\"…\"]); under {selector} it names any server's \
                             tool of that very name"
                        ),
                    ));
                }
                if tool != "*" && tool.contains('*') {
                    return Err(Invalid::new(
                        field(),
                        format!(
                            "{tool:?}: tools are named exactly, or * for all of them (no patterns)"
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Whether a grant's selector (`*`, a server id, or `tag:NAME`) picks this server.
fn selects(selector: &str, server: &str, tags: &[String]) -> bool {
    selector == "*"
        || selector == server
        || selector
            .strip_prefix("tag:")
            .is_some_and(|t| tags.iter().any(|x| x == t))
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

    fn tools_on<'a>(
        &'a self,
        agent: Option<&str>,
        server: &'a str,
        tags: &'a [String],
    ) -> impl Iterator<Item = &'a Vec<String>> + 'a {
        agent
            .and_then(|a| self.grants.get(a))
            .into_iter()
            .flatten()
            .filter(move |(selector, _)| selects(selector, server, tags))
            .map(|(_, tools)| tools)
    }

    /// Whether `agent` may use `tool` on server `server` (which has `tags`).
    pub fn allows(&self, agent: Option<&str>, server: &str, tags: &[String], tool: &str) -> bool {
        self.tools_on(agent, server, tags)
            .any(|tools| names(tools, tool))
    }

    /// What `agent` may use on server `server`, worked out once to filter a whole list
    /// of its tools (asking [`Policy::allows`] per tool walked the grants each time).
    pub fn on_server<'a>(
        &'a self,
        agent: Option<&str>,
        server: &'a str,
        tags: &'a [String],
    ) -> ServerGrant<'a> {
        let lists: Vec<&[String]> = self
            .tools_on(agent, server, tags)
            .map(Vec::as_slice)
            .collect();
        ServerGrant {
            every: lists.iter().any(|l| l.iter().any(|t| t == "*")),
            lists,
        }
    }

    /// Whether `agent` may use anything at all on `server`.
    pub fn allows_any(&self, agent: Option<&str>, server: &str, tags: &[String]) -> bool {
        self.tools_on(agent, server, tags)
            .any(|tools| !tools.is_empty())
    }
}

/// Whether a grant's tool names (or `*`) take in `tool`.
fn names(tools: &[String], tool: &str) -> bool {
    tools.iter().any(|t| t == "*" || t == tool)
}

/// One agent's grants on one server ([`Policy::on_server`]).
pub struct ServerGrant<'a> {
    every: bool,
    lists: Vec<&'a [String]>,
}

impl ServerGrant<'_> {
    /// Whether the grant takes in `tool`, as [`Policy::allows`] says.
    pub fn allows(&self, tool: &str) -> bool {
        self.every || self.lists.iter().any(|tools| names(tools, tool))
    }

    /// Whether the grant takes in everything on the server (`*`).
    pub fn every(&self) -> bool {
        self.every
    }
}

/// Messages of the permission actor: changes at run time.
pub(crate) enum PermissionMsg {
    /// Adds tools to `agent`'s grant on `selector`.
    Grant {
        /// Agent id.
        agent: String,
        /// Server id, `tag:NAME` or `*`.
        selector: String,
        /// Tool names or `*`.
        tools: Vec<String>,
        /// Whether the agent's grants changed.
        reply: RpcReplyPort<bool>,
    },
    /// Removes `agent`'s grant on `selector` (every grant of the agent when `None`).
    Revoke {
        /// Agent id.
        agent: String,
        /// The selector, or all.
        selector: Option<String>,
        /// Whether the agent's grants changed.
        reply: RpcReplyPort<bool>,
    },
    /// Replaces every grant (a reloaded config); answers the agents whose grants changed.
    Replace(Grants, RpcReplyPort<Vec<String>>),
}

/// The agents whose grants differ between `old` and `new` (an agent with no grants
/// and one absent are alike).
fn changed_agents(old: &Grants, new: &Grants) -> Vec<String> {
    fn of<'g>(g: &'g Grants, a: &str) -> Option<&'g BTreeMap<String, Vec<String>>> {
        g.get(a).filter(|s| !s.is_empty())
    }
    old.keys()
        .chain(new.keys().filter(|a| !old.contains_key(*a)))
        .filter(|a| of(old, a) != of(new, a))
        .cloned()
        .collect()
}

/// The shared snapshot every check reads.
pub(crate) type SharedPolicy = Arc<RwLock<Policy>>;

/// Owns the policy's changes; see the module docs.
pub(crate) struct PermissionActor;

impl Actor for PermissionActor {
    type Msg = PermissionMsg;
    type State = SharedPolicy;
    type Arguments = SharedPolicy;

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
                let grants = p.grants.entry(agent).or_default();
                let mut changed = !grants.contains_key(&selector);
                let entry = grants.entry(selector).or_default();
                for t in tools {
                    if !entry.contains(&t) {
                        entry.push(t);
                        changed = true;
                    }
                }
                drop(p);
                let _ = reply.send(changed);
            }
            PermissionMsg::Revoke {
                agent,
                selector,
                reply,
            } => {
                let mut p = policy.write();
                let changed = match selector {
                    Some(s) => p
                        .grants
                        .get_mut(&agent)
                        .is_some_and(|g| g.remove(&s).is_some()),
                    None => p.grants.remove(&agent).is_some_and(|g| !g.is_empty()),
                };
                drop(p);
                let _ = reply.send(changed);
            }
            PermissionMsg::Replace(grants, reply) => {
                let mut p = policy.write();
                let changed = changed_agents(&p.grants, &grants);
                p.grants = grants;
                drop(p);
                let _ = reply.send(changed);
            }
        }
        Ok(())
    }
}

/// A typed handle on the permission actor (its address changes when it is rebuilt).
#[derive(Clone, Default)]
pub(crate) struct PermissionRef(pub(crate) ActorSlot<PermissionMsg>);

/// The permission actor could not be reached (the harness is shutting down).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the permission actor is not running")]
pub(crate) struct PermissionUnavailable;

const ASK_LIMIT: Duration = Duration::from_secs(10);

impl PermissionRef {
    /// Adds `tools` to `agent`'s grant on `selector`; whether that changed its grants.
    pub async fn grant(
        &self,
        agent: &str,
        selector: &str,
        tools: Vec<String>,
    ) -> Result<bool, PermissionUnavailable> {
        self.0
            .ask(
                |reply| PermissionMsg::Grant {
                    agent: agent.to_string(),
                    selector: selector.to_string(),
                    tools: tools.clone(),
                    reply,
                },
                ASK_LIMIT,
            )
            .await
            .ok_or(PermissionUnavailable)
    }

    /// Removes `agent`'s grant on `selector` (all of them when `None`); whether that
    /// changed its grants.
    pub async fn revoke(
        &self,
        agent: &str,
        selector: Option<&str>,
    ) -> Result<bool, PermissionUnavailable> {
        self.0
            .ask(
                |reply| PermissionMsg::Revoke {
                    agent: agent.to_string(),
                    selector: selector.map(String::from),
                    reply,
                },
                ASK_LIMIT,
            )
            .await
            .ok_or(PermissionUnavailable)
    }

    /// Replaces every grant; the agents whose grants changed.
    pub async fn replace(&self, grants: Grants) -> Result<Vec<String>, PermissionUnavailable> {
        self.0
            .ask(
                |reply| PermissionMsg::Replace(grants.clone(), reply),
                ASK_LIMIT,
            )
            .await
            .ok_or(PermissionUnavailable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_whose_grants_a_replacement_changes_are_named() {
        let grants = |entries: &[(&str, &str, &[&str])]| {
            let mut g = Grants::new();
            for (agent, selector, tools) in entries {
                g.entry(agent.to_string()).or_default().insert(
                    selector.to_string(),
                    tools.iter().map(|t| t.to_string()).collect(),
                );
            }
            g
        };
        let old = grants(&[
            ("a", "*", &["*"]),
            ("b", "alpha", &["echo"]),
            ("c", "x", &["y"]),
        ]);
        let mut new = grants(&[
            ("a", "*", &["*"]),
            ("b", "alpha", &["echo", "add"]),
            ("d", "x", &["y"]),
        ]);
        assert_eq!(changed_agents(&old, &new), ["b", "c", "d"]);
        // An agent left with no grants is as one absent.
        new.insert("e".into(), BTreeMap::new());
        assert_eq!(changed_agents(&old, &new), ["b", "c", "d"]);
        assert!(changed_agents(&old, &old).is_empty());
    }

    #[test]
    fn grants_that_would_match_nothing_are_refused() {
        let grant = |selector: &str, tool: &str| {
            let mut g = Grants::new();
            g.entry("a".into())
                .or_default()
                .insert(selector.into(), vec![tool.into()]);
            g
        };
        assert!(validate(&grant("files", "read")).is_ok());
        assert!(validate(&grant("tag:fs", "*")).is_ok());
        assert!(validate(&grant("*", "*")).is_ok());
        // A server's own tool named so (a gateway's, say) is granted under its server;
        // a name no server id begins may go under any selector.
        assert!(validate(&grant("gw", "files__read")).is_ok());
        assert!(validate(&grant("*", "__read")).is_ok());
        for (selector, tool) in [
            ("files", "read_*"),
            ("files", ""),
            ("tag:", "read"),
            ("", "x"),
            // Typos that could never select a server.
            ("files*", "read"),
            ("files ", "read"),
            ("tags:web", "read"),
            ("TAG:web", "read"),
            ("a__b", "read"),
            // A qualified name under many servers: any server may list a tool so named.
            ("*", "files__read"),
            ("tag:fs", "files__read"),
        ] {
            let e = validate(&grant(selector, tool)).expect_err(tool);
            assert_eq!(e.field, format!("permissions.a.{selector}"));
        }
        // `*` for "every agent" would grant only an agent named so.
        for agent in ["*", "", " a", "a\n"] {
            let mut g = Grants::new();
            g.entry(agent.into())
                .or_default()
                .insert("files".into(), vec!["read".into()]);
            let e = validate(&g).expect_err(agent);
            assert_eq!(e.field, format!("permissions.{agent:?}"));
        }
    }

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
        assert!(p.allows_any(Some("planner"), "files", none));
        assert!(!p.allows_any(Some("planner"), "web", none));
    }

    #[test]
    fn default_deny_and_anonymous_callers_are_denied() {
        let p = policy();
        assert!(!p.allows(Some("stranger"), "files", &[], "read"));
        assert!(!p.allows(None, "files", &[], "read"));
        assert!(!p.allows_any(None, "files", &[]));
    }

    /// A list is filtered by `on_server`, a call by `allows`: they must agree.
    #[test]
    fn a_servers_grant_says_what_allows_says() {
        let p = policy();
        let tags: [&[String]; 3] = [&[], &["search".into()], &["other".into()]];
        for agent in [Some("planner"), Some("root"), Some("stranger"), None] {
            for server in ["files", "web", "x"] {
                for tags in tags {
                    let grant = p.on_server(agent, server, tags);
                    for tool in ["read", "write", "anything", "*"] {
                        assert_eq!(
                            grant.allows(tool),
                            p.allows(agent, server, tags, tool),
                            "{agent:?} {server} {tags:?} {tool}"
                        );
                    }
                }
            }
        }
    }
}
