//! Discovery and routing: every server's tools (or prompts, or resources), read from
//! the cache or fetched page by page, filtered by what the caller may use, and the
//! ordered candidates of one call.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{Value, json};

use super::{CallKind, Caller, Candidate};
use crate::harness::HarnessError;
use crate::harness::core::{Core, ServerView};
use crate::registry::RegistryMsg;
use crate::registry::route::{order, qualify, split_qualified};
use crate::server::ServerError;

/// Most pages read of one list: a server that keeps handing out cursors is cut off.
const MAX_PAGES: usize = 1000;

/// One tool (or prompt, or resource) as a caller sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolInfo {
    /// `server__name`: unique across servers.
    pub qualified: String,
    /// The name on its server (the uri for resources).
    pub name: String,
    /// Server id.
    pub server: String,
    /// The item exactly as the server sent it (`inputSchema`, annotations, …).
    pub definition: Value,
    /// Whether the list came from the cache.
    pub from_cache: bool,
}

/// The pages of one server's list, if every page is fresh in the cache.
fn cached_pages(
    core: &Core,
    server: &str,
    kind: CallKind,
    auth_context: Option<&str>,
) -> Option<Vec<Arc<Value>>> {
    let mut pages = Vec::new();
    let mut cursor: Option<String> = None;
    let mut seen = HashSet::new();
    for _ in 0..MAX_PAGES {
        let page = core
            .cache
            .get(server, kind.list_method(), cursor.as_deref(), auth_context)?;
        let next = next_cursor(&page, cursor.as_deref());
        pages.push(page);
        match next {
            Some(c) if seen.insert(c.clone()) => cursor = Some(c),
            _ => return Some(pages),
        }
    }
    Some(pages)
}

/// The page's `nextCursor` (an empty string is still a cursor), unless it repeats.
fn next_cursor(page: &Value, current: Option<&str>) -> Option<String> {
    match page.get("nextCursor") {
        Some(Value::String(next)) if Some(next.as_str()) != current => Some(next.clone()),
        Some(Value::String(_)) => {
            tracing::warn!("server repeated its cursor; list cut off");
            None
        }
        _ => None,
    }
}

/// Every page of one server's list, following `nextCursor`; each page from the cache
/// when fresh, else fetched and offered to it. `true` when all came from the cache.
async fn list_server(
    core: &Core,
    server: &str,
    kind: CallKind,
    auth_context: Option<&str>,
) -> Result<(Vec<Arc<Value>>, bool), ServerError> {
    let method = kind.list_method();
    let generation = core.cache.generation(server);
    let mut pages = Vec::new();
    let mut from_cache = true;
    let mut cursor: Option<String> = None;
    // A cursor seen before ends the list: a server that cycles is cut off.
    let mut seen = HashSet::new();
    for _ in 0..MAX_PAGES {
        let page = match core
            .cache
            .get(server, method, cursor.as_deref(), auth_context)
        {
            Some(page) => page,
            None => {
                from_cache = false;
                let params = cursor.as_ref().map(|c| json!({"cursor": c}));
                let page = core
                    .send(server, method, params, None, Some(core.capabilities()))
                    .await?;
                if let Some((key, ttl)) =
                    core.cache
                        .key_for(server, method, cursor.as_deref(), auth_context, &page)
                {
                    let put = RegistryMsg::Put {
                        key,
                        ttl,
                        value: page.clone(),
                        generation,
                    };
                    let _ = core.services.registry.send_message(put);
                }
                Arc::new(page)
            }
        };
        let next = next_cursor(&page, cursor.as_deref());
        pages.push(page);
        match next {
            Some(c) if seen.insert(c.clone()) => cursor = Some(c),
            _ => break,
        }
    }
    if kind == CallKind::Tool && !from_cache {
        let tools = items(kind, &pages).cloned().collect();
        let _ = core
            .services
            .registry
            .send_message(RegistryMsg::ToolsListed {
                server: server.to_string(),
                tools,
            });
    }
    Ok((pages, from_cache))
}

/// The items of a list's pages.
fn items(kind: CallKind, pages: &[Arc<Value>]) -> impl Iterator<Item = &Value> {
    pages.iter().flat_map(move |p| {
        p.get(kind.list_key())
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
    })
}

/// One server's list, as read for a call or a listing.
struct Listed {
    view: ServerView,
    pages: Vec<Arc<Value>>,
    from_cache: bool,
}

/// The lists of every routable server that offers `kind`, in config order: from the
/// cache without leaving this task when all are fresh, else the misses fetched in
/// parallel. Servers that fail to list are left out (with a warning).
async fn list_all(
    core: &Arc<Core>,
    caller: &Caller,
    kind: CallKind,
    servers: &[ServerView],
) -> Vec<Listed> {
    let ctx = caller.auth_context.as_deref();
    let mut lists = Vec::new();
    let mut set = tokio::task::JoinSet::new();
    for (i, view) in servers.iter().enumerate() {
        if !view.routable() || !view.offers(kind.capability()) {
            continue;
        }
        if let Some(pages) = cached_pages(core, &view.id, kind, ctx) {
            lists.push((
                i,
                Listed {
                    view: view.clone(),
                    pages,
                    from_cache: true,
                },
            ));
            continue;
        }
        let (core, view, ctx) = (core.clone(), view.clone(), caller.auth_context.clone());
        set.spawn(async move {
            let listed = list_server(&core, &view.id, kind, ctx.as_deref()).await;
            (i, view, listed)
        });
    }
    while let Some(joined) = set.join_next().await {
        let Ok((i, view, listed)) = joined else {
            continue;
        };
        match listed {
            Ok((pages, from_cache)) => lists.push((
                i,
                Listed {
                    view,
                    pages,
                    from_cache,
                },
            )),
            Err(e) => tracing::warn!(server = %view.id, error = %e, "could not list"),
        }
    }
    lists.sort_by_key(|(i, _)| *i);
    lists.into_iter().map(|(_, l)| l).collect()
}

fn item_name(kind: CallKind, item: &Value) -> Option<&str> {
    item.get(kind.item_key()).and_then(Value::as_str)
}

/// What `caller` may use of `kind`, optionally only on servers tagged `tag`, sorted by
/// qualified name.
pub async fn list(
    core: &Arc<Core>,
    caller: &Caller,
    kind: CallKind,
    tag: Option<&str>,
) -> Result<Vec<ToolInfo>, HarnessError> {
    let agent = caller.agent_id.as_deref();
    if agent.is_none() {
        return Err(HarnessError::Denied {
            agent: None,
            server: None,
            tool: "*".into(),
        });
    }
    let servers: Vec<ServerView> = core
        .servers()
        .into_iter()
        .filter(|s| tag.is_none_or(|t| s.tags.iter().any(|x| x == t)))
        .filter(|s| core.policy.read().allows_any(agent, &s.id, &s.tags))
        .collect();
    let mut out = Vec::new();
    for listed in list_all(core, caller, kind, &servers).await {
        let (view, from_cache) = (&listed.view, listed.from_cache);
        let policy = core.policy.read();
        for item in items(kind, &listed.pages) {
            let Some(name) = item_name(kind, item) else {
                continue;
            };
            if policy.allows(agent, &view.id, &view.tags, name) {
                out.push(ToolInfo {
                    qualified: qualify(&view.id, name),
                    name: name.to_string(),
                    server: view.id.clone(),
                    definition: item.clone(),
                    from_cache,
                });
            }
        }
    }
    out.sort_by(|a, b| a.qualified.cmp(&b.qualified));
    Ok(out)
}

fn retry_safe(view: &ServerView, item: Option<&Value>) -> bool {
    let hint = |h: &str| {
        item.and_then(|i| i.get("annotations"))
            .and_then(|a| a.get(h))
            .and_then(Value::as_bool)
            == Some(true)
    };
    view.trust_annotations && (hint("idempotentHint") || hint("readOnlyHint"))
}

/// The servers a call to `name` may go to, in order; a denial or no route is an error.
pub async fn route(
    core: &Arc<Core>,
    caller: &Caller,
    kind: CallKind,
    name: &str,
) -> Result<Vec<Candidate>, HarnessError> {
    let agent = caller.agent_id.as_deref();
    let servers = core.servers();
    let denied = |server: &str, tool: &str| HarnessError::Denied {
        agent: agent.map(String::from),
        server: Some(server.to_string()),
        tool: tool.to_string(),
    };
    if kind != CallKind::Resource
        && let Some((server, item)) = split_qualified(name)
        && let Some(view) = servers.iter().find(|s| s.id == server)
    {
        if !core.policy.read().allows(agent, &view.id, &view.tags, item) {
            return Err(denied(server, item));
        }
        return Ok(vec![Candidate {
            server: server.to_string(),
            item: item.to_string(),
            retry_safe: false,
        }]);
    }
    let lists = list_all(core, caller, kind, &servers).await;
    let offering: Vec<(&ServerView, Option<&Value>)> = lists
        .iter()
        .filter_map(|l| {
            items(kind, &l.pages)
                .find(|i| item_name(kind, i) == Some(name))
                .map(|i| (&l.view, Some(i)))
        })
        .collect();
    let offering = if offering.is_empty() && kind == CallKind::Resource {
        // A uri no list names (a template, say): ask the routable servers in order.
        servers
            .iter()
            .filter(|s| s.routable())
            .map(|s| (s, None))
            .collect()
    } else {
        offering
    };
    let policy = core.policy.read();
    let allowed: Vec<_> = offering
        .iter()
        .filter(|(v, _)| policy.allows(agent, &v.id, &v.tags, name))
        .collect();
    if allowed.is_empty() {
        return Err(match offering.first() {
            Some((v, _)) => denied(&v.id, name),
            None => HarnessError::NoRoute {
                tool: name.to_string(),
            },
        });
    }
    let ordered = order(allowed.iter().map(|(v, _)| v.route.clone()).collect());
    Ok(ordered
        .into_iter()
        .filter_map(|r| allowed.iter().find(|(v, _)| v.id == r.server))
        .map(|(v, item)| Candidate {
            server: v.id.clone(),
            item: name.to_string(),
            retry_safe: retry_safe(v, *item),
        })
        .collect())
}
