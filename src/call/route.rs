//! Where a call goes: the ordered servers it may be sent to.
//!
//! A qualified name (`server__tool`, any name with the separator) names its server and
//! nothing else. A bare name is looked up only on servers where the caller holds some
//! grant (an ungranted agent calling an unknown name sends nothing to any server), and
//! goes to those that offer it and allow it, ready ones first, then by priority, then
//! config order. A name the caller may not call is denied without naming a server the
//! caller did not name itself.

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;

use super::caller::{CallKind, Caller, ListKind};
use super::catalog::{item_name, items};
use super::context::CallContext;
use super::error::{CallError, Unreachable};
use super::listing::list_all;
use crate::registry::names::{RouteView, order, split_qualified};
use crate::server::{ServerRef, ServerState};

/// One server a call may go to, in order.
#[derive(Clone)]
pub(crate) struct Candidate<'a> {
    pub(crate) server: ServerRef,
    /// The item's name on that server, borrowed from the name the call was asked by
    /// (the part after the separator, for a qualified name).
    pub(crate) item: &'a str,
    /// The request may be re-sent elsewhere even if it reached this server (the tool is
    /// marked idempotent or read-only by a server whose annotations are trusted).
    pub(crate) retry_safe: bool,
    /// Asked though no list names the item (a resource URI a template serves, say):
    /// its "no such resource" answer moves the read on to the next.
    pub(crate) guessed: bool,
}

fn retry_safe(server: &ServerRef, item: Option<&Value>) -> bool {
    let hint = |h: &str| {
        item.and_then(|i| i.get("annotations"))
            .and_then(|a| a.get(h))
            .and_then(Value::as_bool)
            == Some(true)
    };
    server.config().trust_annotations && (hint("idempotentHint") || hint("readOnlyHint"))
}

/// The servers a call may go to, in order: a qualified name's one server without a
/// `Vec` (the common call allocates nothing to be routed).
pub(crate) enum Candidates<'a> {
    One(Candidate<'a>),
    Many(Vec<Candidate<'a>>),
}

impl<'a> Candidates<'a> {
    /// Keeps the candidates `keep` says yes to, in order.
    pub(crate) fn retain(&mut self, keep: impl Fn(&Candidate<'a>) -> bool) {
        match self {
            Candidates::One(c) if !keep(c) => *self = Candidates::Many(Vec::new()),
            Candidates::One(_) => {}
            Candidates::Many(v) => v.retain(keep),
        }
    }
}

impl<'a> std::ops::Deref for Candidates<'a> {
    type Target = [Candidate<'a>];

    fn deref(&self) -> &[Candidate<'a>] {
        match self {
            Candidates::One(c) => std::slice::from_ref(c),
            Candidates::Many(v) => v,
        }
    }
}

fn denied(agent: Option<&str>, server: Option<&str>, tool: &str) -> CallError {
    CallError::Denied {
        agent: agent.map(String::from),
        server: server.map(String::from),
        tool: tool.to_string(),
    }
}

/// A name of `kind` split as `server__item` when routing reads it so: any name with a
/// separator, but a resource's only when its first separator comes before any `:` (a
/// URI's scheme holds no `_`, so a URI with a scheme never reads so; one a server lists
/// that would is named qualified by its server, see [`resource_name`]). Taken for a
/// URI, a qualified name was asked of every server with resources in turn (a secret in
/// it too), and found on none.
pub(crate) fn split_for(kind: CallKind, name: &str) -> Option<(&str, &str)> {
    split_qualified(name).filter(|(server, _)| kind != CallKind::Resource || !server.contains(':'))
}

/// What a listing names resource (or template) `uri` of `server` by: the URI itself,
/// or, when routing would read it as another server's qualified name (`bank__x`, with
/// no scheme), `server__uri`, so that a read of it goes to the server that listed it.
pub(crate) fn resource_name<'a>(server: &str, uri: &'a str) -> std::borrow::Cow<'a, str> {
    match split_for(CallKind::Resource, uri) {
        Some(_) => std::borrow::Cow::Owned(format!("{server}__{uri}")),
        None => std::borrow::Cow::Borrowed(uri),
    }
}

/// The servers a call to `name` may go to, in order; a denial or no route is an error.
pub(crate) async fn route<'a>(
    ctx: &Arc<CallContext>,
    caller: &Caller,
    kind: CallKind,
    name: &'a str,
    deadline: Instant,
) -> Result<Candidates<'a>, CallError> {
    let agent = caller.agent_id.as_deref();
    if agent.is_none() {
        return Err(denied(None, None, name));
    }
    match split_for(kind, name) {
        Some((server, item)) => route_qualified(ctx, agent, server, item),
        // Boxed: listing every server is a large future, and a qualified name (the
        // common call) should not carry its size.
        None => Box::pin(route_bare(ctx, caller, kind, name, deadline))
            .await
            .map(Candidates::Many),
    }
}

/// Resource `uri` on `server` alone (a delegated round that continues there), if the
/// caller may read it there. Refused as an unqualified read is: the caller named no
/// server, and a URI is no `server__item`.
pub(crate) fn resource_on<'a>(
    ctx: &CallContext,
    caller: &Caller,
    server: &str,
    uri: &'a str,
) -> Result<Candidates<'a>, CallError> {
    let agent = caller.agent_id.as_deref();
    if agent.is_none() {
        return Err(denied(None, None, uri));
    }
    // Named qualified by its server (as a listing names it, or as the caller named the
    // first round): the URI is what follows.
    let uri = match split_for(CallKind::Resource, uri) {
        Some((on, rest)) if on == server => rest,
        _ => uri,
    };
    match ctx.servers.get(server) {
        Some(server) if ctx.allows(agent, &server, uri) => Ok(Candidates::One(Candidate {
            server,
            item: uri,
            retry_safe: false,
            guessed: false,
        })),
        Some(_) => Err(denied(agent, None, uri)),
        None => Err(CallError::NoRoute {
            tool: uri.to_string(),
            unreachable: Vec::new(),
        }),
    }
}

/// `server__tool`: that server, if the caller may use that tool on it.
fn route_qualified<'a>(
    ctx: &CallContext,
    agent: Option<&str>,
    server_id: &str,
    item: &'a str,
) -> Result<Candidates<'a>, CallError> {
    let Some(server) = ctx.servers.get(server_id) else {
        // An agent that could not use such a server is denied as for one that exists:
        // which ids exist is not for it to find out by trying.
        if !ctx.policy.read().allows_any(agent, server_id, &[]) {
            return Err(denied(agent, Some(server_id), item));
        }
        return Err(CallError::NoRoute {
            tool: format!("{server_id}__{item}"),
            unreachable: Vec::new(),
        });
    };
    if !ctx.allows(agent, &server, item) {
        return Err(denied(agent, Some(server_id), item));
    }
    Ok(Candidates::One(Candidate {
        server,
        item,
        retry_safe: false,
        guessed: false,
    }))
}

/// A bare name: the servers the caller may use that offer it and allow it, in order.
async fn route_bare<'a>(
    ctx: &Arc<CallContext>,
    caller: &Caller,
    kind: CallKind,
    name: &'a str,
    deadline: Instant,
) -> Result<Vec<Candidate<'a>>, CallError> {
    let agent = caller.agent_id.as_deref();
    // Only the servers where the caller may use this very name: whether it is denied
    // then follows from the grants alone, not from which servers offer it (a name no
    // grant allows, offered or not, is denied alike: what ungranted tools exist is not
    // for the caller to find out by trying), and no other server is listed for it.
    let granted: Vec<ServerRef> = ctx
        .servers
        .all()
        .into_iter()
        .filter(|s| ctx.allows(agent, s, name))
        .collect();
    if granted.is_empty() {
        // Nothing is asked of any server for a name the agent may use on none.
        return Err(denied(agent, None, name));
    }
    let list = kind.list();
    let (lists, unreachable) = list_all(ctx, caller, list, granted.clone(), Some(deadline)).await;
    let mut offering: Vec<(ServerRef, Option<Value>)> = lists
        .iter()
        .filter_map(|l| {
            items(list, &l.pages)
                .find(|i| item_name(list, i) == Some(name))
                .map(|i| (l.server.clone(), Some(i.clone())))
        })
        .collect();
    // A uri no list names (a template's, say): the servers with resources are asked in
    // order, those whose templates make it first, each "no such resource" moving on to
    // the next. Not while one that may have
    // resources could not be listed: the uri may be its (a secret in it), and another's
    // answer would pass for its own. (A server disabled in the config is out of it; one
    // stopped after a crash is not.)
    let unlisted = unreachable.iter().any(|(u, _)| {
        granted.iter().any(|s| {
            s.id() == u.server
                && s.config().enabled
                && s.offers().is_none_or(|offers| offers.resources)
        })
    });
    let guessed = offering.is_empty() && kind == CallKind::Resource && !unlisted;
    if guessed {
        offering = granted
            .iter()
            .filter(|s| super::listing::offers(s, list))
            .map(|s| (s.clone(), None))
            .collect();
    }
    // Every server here allows the name (a grant taken away while they were listed is
    // checked again before each is asked).
    let allowed: Vec<&(ServerRef, Option<Value>)> = offering.iter().collect();
    if allowed.is_empty() {
        return Err(CallError::NoRoute {
            tool: name.to_string(),
            unreachable: unreachable
                .into_iter()
                .map(|(u, _)| u)
                .collect::<Vec<Unreachable>>(),
        });
    }
    let mut ordered = in_order(&granted, &allowed, name, guessed);
    if guessed && ordered.len() > 1 {
        // Only put first, not the others left out: a server may serve URIs it lists no
        // template of (a file server, any path), and one whose templates could not be
        // listed may be the URI's. First among those of its rank (readiness and
        // priority) alone: a template is the server's own claim, which any server may
        // make of every URI of a scheme (`https://{+rest}`); the operator's priority
        // says whom a URI (a secret in it) goes to first.
        let ranks: Vec<(bool, i32)> = ordered
            .iter()
            .map(|c| {
                (
                    c.server.state() == ServerState::Ready,
                    c.server.config().priority,
                )
            })
            .collect();
        let templated = of_templates(ctx, caller, name, &ordered, deadline).await;
        let mut run = 0;
        let mut keyed = Vec::with_capacity(ordered.len());
        for (k, c) in ordered.into_iter().enumerate() {
            if k > 0 && ranks[k] != ranks[k - 1] {
                run += 1;
            }
            let unlisted = !templated.iter().any(|t| t == c.server.id());
            keyed.push((run, unlisted, c));
        }
        // Stable: in config order within each.
        keyed.sort_by_key(|(run, unlisted, _)| (*run, *unlisted));
        ordered = keyed.into_iter().map(|(_, _, c)| c).collect();
    }
    // Listing took time (a quarter of the deadline for templates): a grant taken away
    // meanwhile holds for the first server too (the others are checked before each).
    ordered.retain(|c| ctx.allows(agent, &c.server, name));
    if ordered.is_empty() {
        return Err(denied(agent, None, name));
    }
    Ok(ordered)
}

/// Work spent at most matching a URI against the servers' templates, in byte steps
/// (see [`crate::protocol::uri_template::matches`]): a hostile list of long templates
/// costs this much and no more, and the read is then asked of the servers in order.
const TEMPLATE_BUDGET: usize = 1 << 22;

/// The ids of the servers among `candidates` that list a resource template `uri` could
/// be an expansion of (none: no such template, or not decided within the budget). The
/// lists are read within a quarter of the time left: the read itself keeps the rest.
async fn of_templates(
    ctx: &Arc<CallContext>,
    caller: &Caller,
    uri: &str,
    candidates: &[Candidate<'_>],
    deadline: Instant,
) -> Vec<String> {
    let servers = candidates.iter().map(|c| c.server.clone()).collect();
    let now = Instant::now();
    let until = now + deadline.saturating_duration_since(now) / 4;
    let (lists, _) = list_all(
        ctx,
        caller,
        ListKind::ResourceTemplates,
        servers,
        Some(until),
    )
    .await;
    let mut budget = TEMPLATE_BUDGET;
    let mut matched = Vec::new();
    for l in &lists {
        for template in items(ListKind::ResourceTemplates, &l.pages)
            .filter_map(|i| item_name(ListKind::ResourceTemplates, i))
            .filter(|t| crate::protocol::uri_template::names_its_scheme(t))
        {
            match crate::protocol::uri_template::matches(template, uri, &mut budget) {
                Some(true) => {
                    matched.push(l.server.id().to_string());
                    break;
                }
                Some(false) => {}
                // Spent: what matched so far still goes first.
                None => return matched,
            }
        }
    }
    matched
}

/// The allowed servers as candidates: ready first, then priority, then config order.
fn in_order<'a>(
    granted: &[ServerRef],
    allowed: &[&(ServerRef, Option<Value>)],
    name: &'a str,
    guessed: bool,
) -> Vec<Candidate<'a>> {
    let views: Vec<RouteView> = allowed
        .iter()
        .map(|(s, _)| RouteView {
            server: s.id().to_string(),
            priority: s.config().priority,
            order: granted
                .iter()
                .position(|g| g.id() == s.id())
                .unwrap_or(usize::MAX),
            ready: s.state() == ServerState::Ready,
        })
        .collect();
    order(views)
        .into_iter()
        .filter_map(|v| allowed.iter().find(|(s, _)| s.id() == v.server))
        .map(|(s, item)| Candidate {
            server: s.clone(),
            item: name,
            retry_safe: retry_safe(s, item.as_ref()),
            guessed,
        })
        .collect()
}
