//! What the servers offer: each server's list (tools, prompts or resources), page by
//! page from the cache when fresh, else fetched, walked by one loop ([`list_server`])
//! under the configured bounds, and filtered by what the caller may use.
//!
//! Bounds: past `limits.max_list_bytes` or `limits.max_list_items` across a list's pages
//! the listing of that server ends with [`CallError::ListTooLarge`] and nothing of it is
//! cached; the server's calls by qualified name still work. A list is cached whole or
//! not at all: its pages are stored together once the walk ends. A cached cursor the
//! server rejects drops that list's cached pages, and the list is read again from the
//! first page, once.
//!
//! Layers: memory and disk first ([`crate::registry::cache::ListCache::get`], without
//! leaving the task), then the shared layer for servers it shares (bounded by its own
//! timeout), then the server. A page from the shared layer is kept in memory and on
//! disk like a fetched one; only pages fetched from the server are written back to it.
//!
//! Refresh ahead: a list served from the cache with less than `cache.refresh_ahead`
//! (at most a tenth of its ttl) of freshness left is listed again in the background (once at a time per list and
//! scope), so a hot list is replaced before it expires and no caller waits on it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::caller::{Caller, ListKind};
use super::catalog::ToolInfo;
use super::context::CallContext;
use super::error::{CallError, Unreachable};
use super::flights::{Follower, Joined, Leader};
use super::input::HandlerSet;
use super::listed::{ListFlight, Listed};
use crate::protocol::{CacheScope, Cutoff, Pager, ProtocolError, ResultType, RpcErrorKind};
use crate::registry::cache::{CacheKey, Hit, ListOf, Page, json_size};
use crate::server::{ServerError, ServerRef, ServerState};
use crate::transport::TransportError;

/// What a caller may use, and the servers that could not be listed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Listing {
    /// Sorted by qualified name.
    pub items: Vec<ToolInfo>,
    /// Servers the caller may use that could not be listed now, with why.
    pub unreachable: Vec<(Unreachable, Option<CallError>)>,
    /// The least freshness left of the pages it was built from (zero: fetched and not
    /// cacheable).
    pub fresh_for: Duration,
    /// Every page it was built from was `public`, and no item nor server was left out
    /// for the caller's grants: anyone may be served the same list.
    pub public: bool,
}

fn page_items(kind: ListKind, page: &Value) -> usize {
    page.get(kind.key())
        .and_then(Value::as_array)
        .map_or(0, Vec::len)
}

/// Why a list page cannot be read as one, if it cannot: not an object, no array of
/// items, or a cursor that is not a string. Such a page would read as an empty list, or
/// as the list's end, and be cached so; rmcp and the TypeScript SDK refuse it too.
fn malformed_page(list_key: &str, page: &Value) -> Option<String> {
    let Some(map) = page.as_object() else {
        return Some("answered something other than an object".into());
    };
    if !map.get(list_key).is_some_and(Value::is_array) {
        return Some(format!("answered no `{list_key}` array"));
    }
    match map.get("nextCursor") {
        None | Some(Value::Null | Value::String(_)) => None,
        Some(_) => Some("answered a `nextCursor` that is not a string".into()),
    }
}

/// How one walk of a list ended, short of a list.
enum Walk {
    Done(Listed),
    /// A continuation page was asked for with a cursor from the cache, and refused.
    RejectedCursor(ServerError),
    /// A continuation page of a shared server's list missed the caches after a page
    /// from them: its cursor may be another process's server's, never to be sent to
    /// this one's. The list is read again from its first page, past the caches.
    Restart,
    Failed(CallError),
    /// Another walk is fetching the same list: its outcome is this one's.
    Join(Follower<Result<Listed, CallError>>),
}

/// A walk's flight, when it leads one: given the walk's outcome when it ends.
type Lead = Option<Leader<ListFlight, Result<Listed, CallError>>>;

/// A walk begun by a listing's look at the list's first page (`list_all` looks, to
/// walk a fresh one-page list without a task): the walk goes on from what it saw, so
/// that one page wanted is one lookup counted. Its epoch, number and handlers are
/// taken before the look, as a walk's own are before its first page: an invalidation
/// after the look is one the walk is dropped for.
pub(crate) struct FirstLook {
    begun: Begun,
    page: Option<Hit>,
}

/// What a walk holds from its start: the server's cache epoch, the walk's number and
/// the handlers it asks and keys pages with.
struct Begun {
    handlers: Arc<HandlerSet>,
    epoch: u64,
    walk: u64,
}

impl Begun {
    /// Taken now: the epoch before the handlers, which a registration changes before
    /// it moves the epoch.
    fn now(ctx: &CallContext, server: &str) -> Begun {
        let epoch = ctx.registry.cache.walk_epoch(server);
        let walk = ctx.registry.walk_begins();
        Begun {
            handlers: ctx.inputs.snapshot(),
            epoch,
            walk,
        }
    }
}

/// Where a walk starts.
enum Start {
    /// Nothing looked up yet.
    Anew,
    /// From a listing's look at the first page.
    Looked(FirstLook),
    /// Again, after a walk whose look at the first page was counted (its leader gave
    /// up): that page is looked up again uncounted.
    Again,
}

/// Every page of one server's list (see the module docs).
pub(crate) async fn list_server(
    ctx: &Arc<CallContext>,
    server: &ServerRef,
    kind: ListKind,
    auth_context: Option<&str>,
    timeout: Duration,
    mut first: Option<FirstLook>,
) -> Result<Listed, CallError> {
    let mut use_cache = true;
    let mut again = false;
    // A lead kept across a rejected cursor: its followers wait for the walk again.
    let mut carried: Lead = None;
    let began = Instant::now();
    // The caller's deadline is sooner than the server's own: a failure once it has
    // passed (a page's timeout, a request expired in a restarting server's queue) is
    // no news of the server for those waiting on this walk, who may have more time.
    let cut_short = timeout < server.config().timeout;
    loop {
        let start = match first.take() {
            Some(look) => Start::Looked(look),
            None if again => Start::Again,
            None => Start::Anew,
        };
        again = true;
        let (walked, lead) = walk(ctx, server, kind, auth_context, timeout, use_cache, start).await;
        let lead = lead.or(carried.take());
        let outcome = match walked {
            Walk::Join(follower) => match follower.outcome().await {
                Some(outcome) => return outcome,
                // Its caller gave up (a deadline, a disconnect) before it ended.
                None => continue,
            },
            Walk::Done(listed) => {
                refresh_if_due(ctx, &listed, kind, auth_context);
                Ok(listed)
            }
            Walk::Failed(e) => Err(e),
            Walk::RejectedCursor(_) if use_cache => {
                tracing::warn!(server = %server.id(), "server rejected a cached cursor; listing again from the first page");
                // Dropped before the list is read again (past the caches, which then
                // get the new pages). Only this process's: a shared server's cached
                // cursor is never sent (see `Walk::Restart`), so the others' lists are
                // not the one refused.
                ctx.registry_ref
                    .invalidate_list(&ctx.registry.cache, server.id(), kind.method());
                use_cache = false;
                carried = lead;
                continue;
            }
            Walk::RejectedCursor(e) => Err(e.into()),
            Walk::Restart => {
                tracing::debug!(server = %server.id(), "a page of a shared list missed the caches after a cached one; listing again from the first page");
                use_cache = false;
                carried = lead;
                continue;
            }
        };
        // After the walk cached what it fetched: who comes next reads the cache.
        // Dropped unpublished, it has its followers walk again.
        let out_of_time = outcome.is_err() && cut_short && began.elapsed() >= timeout;
        if let Some(lead) = lead.filter(|_| !out_of_time) {
            lead.publish(outcome.clone());
        }
        return outcome;
    }
}

/// Lists again in the background a list served from the cache close to its expiry,
/// each page within the server's own timeout (not what was left of the call that
/// found it due: a call with 5 ms left would have failed the refresh, holding its mark).
fn refresh_if_due(
    ctx: &Arc<CallContext>,
    listed: &Listed,
    kind: ListKind,
    auth_context: Option<&str>,
) {
    if !listed.from_cache
        || listed.refresh_window.is_zero()
        || listed.fresh_for > listed.refresh_window
    {
        return;
    }
    let scope = if listed.public {
        "public".to_string()
    } else {
        ctx.registry
            .cache
            .scope_key(CacheScope::Private, auth_context)
            .map(|s| s.to_string())
            .unwrap_or_default()
    };
    let key = format!("{}\n{}\n{scope}", listed.server.id(), kind.method());
    let Some(guard) = Refreshing::begin(ctx, key) else {
        return; // already under way
    };
    let (server, auth) = (listed.server.clone(), auth_context.map(String::from));
    let timeout = server.config().timeout;
    // Among processes sharing a public list, one reads it again; the others find the
    // new pages in the shared layer when theirs expire.
    let claim = listed
        .public
        .then(|| server.protocol_version())
        .flatten()
        .map(|version| {
            let what = format!(
                "{}\n{}\n{}\n{version}\n{}",
                server.id(),
                server.fingerprint(),
                ctx.inputs.snapshot().client_tag(),
                kind.method()
            );
            (what, listed.refresh_window)
        });
    tokio::spawn(async move {
        let ctx = guard.0.clone();
        if let (Some(shared), Some((what, hold))) = (&ctx.registry.shared, claim)
            && shared.shares(server.id())
            && !shared.claim_refresh(&what, hold).await
        {
            // Another process refreshes it: not asked again here for the window.
            tokio::time::sleep(hold).await;
            return;
        }
        tracing::debug!(server = %server.id(), method = kind.method(), "refreshing a list ahead of its expiry");
        // Bounded as a call is: a server paging for ever does not hold the mark.
        let walked = walk(
            &ctx,
            &server,
            kind,
            auth.as_deref(),
            timeout,
            false,
            Start::Anew,
        );
        match within_call_timeout(&ctx, walked).await {
            Some((Walk::Failed(e), _)) => {
                tracing::debug!(server = %server.id(), error = %e, "refresh ahead failed; the list expires as usual");
            }
            None => {
                tracing::debug!(server = %server.id(), "refresh ahead took longer than call_timeout; the list expires as usual");
            }
            Some(_) => {}
        }
        drop(guard);
    });
}

/// A list being read again in the background; the mark goes when this is dropped,
/// however the read ends.
struct Refreshing(Arc<CallContext>, String);

impl Refreshing {
    fn begin(ctx: &Arc<CallContext>, key: String) -> Option<Refreshing> {
        ctx.refreshing
            .lock()
            .insert(key.clone())
            .then(|| Refreshing(ctx.clone(), key))
    }
}

impl Drop for Refreshing {
    fn drop(&mut self) {
        self.0.refreshing.lock().remove(&self.1);
    }
}

/// Reads a server's tool list again, past the cache (it changed): the new pages are
/// cached and compared with the last ones, which announces `ToolsChanged`.
pub(crate) async fn refetch_tools(ctx: &Arc<CallContext>, server: &str) {
    let Some(server) = ctx.servers.get(server) else {
        return;
    };
    if !offers(&server, ListKind::Tools) {
        return;
    }
    let key = format!("changed\n{}", server.id());
    let again = format!("again\n{}", server.id());
    // One read at a time per server: a change that comes during one has it read once
    // more when done (it may have read the list before the change).
    let mut reading = {
        let mut refreshing = ctx.refreshing.lock();
        if !refreshing.insert(key.clone()) {
            refreshing.insert(again);
            return;
        }
        Refreshing(ctx.clone(), key.clone())
    };
    let timeout = server.config().timeout;
    loop {
        let walked = walk(
            ctx,
            &server,
            ListKind::Tools,
            None,
            timeout,
            false,
            Start::Anew,
        );
        match within_call_timeout(ctx, walked).await {
            Some((Walk::Failed(e), _)) => {
                tracing::debug!(server = %server.id(), error = %e, "could not read a changed tool list");
            }
            None => {
                tracing::debug!(server = %server.id(), "reading a changed tool list took longer than call_timeout");
            }
            Some(_) => {}
        }
        // Under the lock that a change during the read takes too: it is read, or it
        // finds no read under way and begins its own.
        let mut refreshing = ctx.refreshing.lock();
        if !refreshing.remove(&again) {
            refreshing.remove(&key);
            // Released here, under the lock: the guard (there for a read cut short)
            // must not remove a read begun after this one.
            reading.1.clear();
            return;
        }
    }
}

/// `walk` given up (its requests cancelled) after `call_timeout`: `None`.
async fn within_call_timeout<T>(ctx: &CallContext, walk: impl Future<Output = T>) -> Option<T> {
    let until =
        crate::util::duration::after(tokio::time::Instant::now(), ctx.settings.call_timeout);
    tokio::time::timeout_at(until, walk).await.ok()
}

/// One walk of one list: the pages read so far, what of them to cache, the bounds.
struct Walker<'a> {
    ctx: &'a CallContext,
    server: &'a ServerRef,
    kind: ListKind,
    auth_context: Option<&'a str>,
    timeout: Duration,
    use_cache: bool,
    /// The handlers when the walk started: every page is asked, and keyed, with their
    /// capabilities.
    handlers: Arc<HandlerSet>,
    /// What a listing's look saw of the first page, which the walk starts from.
    first: Option<Option<Hit>>,
    /// The first page's lookup was counted by an earlier walk ([`Start::Again`]).
    first_counted: bool,
    /// The server's cache epoch when the walk started.
    epoch: u64,
    /// The walk's number ([`crate::registry::Registry::walk_begins`]).
    walk: u64,
    /// Its place among the server's walks that fetch, once it fetches.
    fetching: Option<tokio::sync::OwnedSemaphorePermit>,
    /// The flight it leads, when it fetches a first page that others may want too.
    lead: Lead,
    pages: Vec<Arc<Value>>,
    /// Pages to keep in memory and on disk: fetched, or read from the shared layer.
    fetched: Vec<Page>,
    /// Pages fetched from the server, for the shared layer.
    to_share: Vec<Page>,
    /// The shared layer missed once in this walk (it is not asked again).
    l3_missed: bool,
    /// The last page read from a cache was public: it may have come from Redis (a
    /// private one never does), its cursor another process's server's.
    last_hit_public: bool,
    /// The server's generation in the shared layer, asked once per walk before the
    /// first fetch (pages are stored with it), and whether it was asked.
    l3_generation: Option<u64>,
    l3_asked: bool,
    /// Some page came from the shared layer (the list is compared for changes then).
    from_shared: bool,
    /// No page came from a cache (memory, disk or the shared layer).
    from_fetch_only: bool,
    from_cache: bool,
    cacheable: bool,
    /// Whether this process may keep the list in its own layers: not a shared server's
    /// before it can hear its peers' changes (`SharedCache::keeps`); Redis may have
    /// it all the same (its pages carry their generation).
    keep_here: bool,
    bytes: usize,
    items: usize,
    fresh_for: Duration,
    public: bool,
    /// The first page's scope: every page of a list has it (the spec), and a list
    /// whose pages disagree is not kept (a page called public after a private first
    /// one would be served to every auth context by its cursor).
    first_scope: Option<CacheScope>,
    refresh_window: Duration,
}

impl<'a> Walker<'a> {
    fn saw(&mut self, remaining: Duration, scope: CacheScope) {
        self.fresh_for = self.fresh_for.min(remaining);
        self.public &= scope == CacheScope::Public;
        if *self.first_scope.get_or_insert(scope) != scope {
            self.cacheable = false;
        }
    }

    /// A page from the cache: its freshness, and when its list is due for a refresh.
    fn saw_cached(&mut self, hit: &Hit) {
        self.from_fetch_only = false;
        self.last_hit_public = matches!(hit.scope, CacheScope::Public);
        self.saw(hit.remaining, hit.scope);
        let ahead = self.ctx.registry.cache.config().refresh_ahead;
        self.refresh_window = self.refresh_window.min(ahead.min(hit.ttl / 10));
    }

    fn list(&self) -> ListOf<'_> {
        ListOf {
            server: self.server.id(),
            fingerprint: self.server.fingerprint(),
            client: self.handlers.client_tag(),
            method: self.kind.method(),
            server_ref: Some(self.server),
        }
    }

    /// Waits for one of the server's places for walks that read beyond memory; a page
    /// another walk cached meanwhile is that page instead (and the place is let go).
    async fn take_walk_place(&mut self, cursor: Option<&str>) -> Option<(Arc<Value>, usize, bool)> {
        self.fetching = self.server.fetching_walk().await;
        let hit = self
            .use_cache
            .then(|| {
                self.ctx
                    .registry
                    .cache
                    .get_again(self.list(), cursor, self.auth_context)
            })
            .flatten()?;
        self.fetching = None;
        self.saw_cached(&hit);
        Some((hit.value, hit.bytes, true))
    }

    /// The page at `cursor`: from the cache when fresh, else fetched. `cursor_cached`
    /// says the cursor came from a cached page (a refusal then drops the list).
    async fn page(
        &mut self,
        cursor: Option<&str>,
        cursor_cached: bool,
    ) -> Result<(Arc<Value>, usize, bool), Walk> {
        let cache = &self.ctx.registry.cache;
        let seen = match (cursor, self.first.take()) {
            (None, Some(seen)) => seen,
            _ if !self.use_cache => None,
            (None, None) if self.first_counted => {
                cache.get_again(self.list(), cursor, self.auth_context)
            }
            _ => cache.get(self.list(), cursor, self.auth_context),
        };
        if self.use_cache
            && let Some(hit) = seen
        {
            self.saw_cached(&hit);
            return Ok((hit.value, hit.bytes, true));
        }
        if self.use_cache && cursor.is_none() && self.lead.is_none() {
            let flight = ListFlight {
                server: Arc::as_ptr(&self.server.0) as usize,
                epoch: self.epoch,
                method: self.kind.method(),
                client: self.handlers.client_tag().to_string(),
                auth: self.auth_context.map(String::from),
            };
            match self.ctx.list_flights.join(flight) {
                Joined::Follow(follower) => return Err(Walk::Join(follower)),
                Joined::Lead(lead) => self.lead = Some(lead),
            }
        }
        // Reading the shared layer builds a copy of the page too: it takes one of the
        // server's places for walks, as a fetch does (many identities' walks of a large
        // public list would each hold one, all at once).
        let shared_here = self
            .ctx
            .registry
            .shared
            .as_ref()
            .is_some_and(|s| s.shares(self.server.id()));
        if self.use_cache
            && shared_here
            && self.fetching.is_none()
            && let Some(hit) = self.take_walk_place(cursor).await
        {
            return Ok(hit);
        }
        if self.use_cache
            && let Some((key, hit, version)) = self.shared_get(cursor).await
        {
            self.saw_cached(&hit);
            self.fetched.push(Page {
                key,
                ttl: hit.remaining,
                received_unix_ms: crate::registry::cache::now_ms(),
                value: hit.value.clone(),
                bytes: hit.bytes,
                version: Some(version),
            });
            return Ok((hit.value, hit.bytes, true));
        }
        if self.fetching.is_none()
            && let Some(hit) = self.take_walk_place(cursor).await
        {
            return Ok(hit);
        }
        // A cursor read from the shared layer (or from memory, which keeps what it
        // read) is another process's server's: the list is read anew instead.
        if cursor_cached && shared_here && self.last_hit_public {
            return Err(Walk::Restart);
        }
        if self.server.state() == ServerState::Restarting {
            // Its request would wait in the restart queue, perhaps for good (a server
            // that crashes on start), and hold up every listing and bare-name call
            // with it: one whose first page was cached but a later one was not, too.
            return Err(Walk::Failed(
                ServerError::Restarting {
                    server: self.server.id().to_string(),
                    reason: self
                        .server
                        .status()
                        .last_error
                        .unwrap_or_else(|| "restarting".into()),
                }
                .into(),
            ));
        }
        self.from_cache = false;
        // From here on the walk reads the server alone: a later page cached by another
        // walk may be of another version of the list than this page begins (a server
        // that changed it without a word), and its cursor would stitch the two.
        self.use_cache = false;
        if !self.l3_asked
            && let Some(shared) = &self.ctx.registry.shared
            && shared.shares(self.server.id())
        {
            // Before the fetch: a change after it must make these pages stale.
            self.l3_generation = shared.generation(self.server.id()).await;
            self.l3_asked = true;
        }
        let params = cursor.map(|c| json!({"cursor": c}));
        let sent = self
            .server
            .request(
                self.kind.method(),
                params.as_ref(),
                Some(self.timeout),
                Some(self.handlers.capabilities()),
                self.auth_context,
            )
            .await;
        let page = match sent {
            Ok(page) => page,
            Err(e @ ServerError::Rpc { .. }) if cursor_cached && rejects_cursor(&e) => {
                return Err(Walk::RejectedCursor(e));
            }
            Err(ServerError::Rpc { error, .. })
                if self.kind == ListKind::ResourceTemplates
                    && cursor.is_none()
                    && error.kind() == RpcErrorKind::MethodNotFound =>
            {
                // Resources and no templates (servers of SDKs without the method): an
                // empty list, asked again next time (nothing says for how long).
                self.saw(Duration::ZERO, CacheScope::Public);
                self.cacheable = false;
                let page = json!({ ListKind::ResourceTemplates.key(): [] });
                return Ok((Arc::new(page), 0, false));
            }
            Err(e) => return Err(Walk::Failed(e.into())),
        };
        // Only prompts/get, resources/read and tools/call may ask for input: a list
        // result that does is the server's error, and nothing of it is kept.
        match ResultType::of(&page) {
            Ok(ResultType::Complete) => {}
            Ok(ResultType::InputRequired) => {
                return Err(self.protocol(ProtocolError::InvalidResult(format!(
                    "{} answered input_required, which only calls may",
                    self.kind.method()
                ))));
            }
            Err(e) => return Err(self.protocol(e)),
        }
        if let Some(why) = malformed_page(self.kind.key(), &page) {
            return Err(self.protocol(ProtocolError::InvalidResult(format!(
                "{} {why}",
                self.kind.method()
            ))));
        }
        let received_unix_ms = crate::registry::cache::now_ms();
        let size = json_size(&page);
        let page = Arc::new(page);
        let scope = crate::protocol::CacheHints::of(&page).scope;
        // `cache.default_ttl` is for legacy servers, which cannot send hints. A modern
        // one must send them; one that does not is held to ttl 0, as the spec says,
        // unless a subscription on its connection announces this list's changes now
        // (acknowledged: a capability that says so, with no subscription that works,
        // would keep the list with nothing to drop it). Not known which (no connection
        // now): not kept.
        let default_ttl_fits = || {
            self.server.connection().is_some_and(|c| {
                c.era() == crate::transport::Era::Legacy || c.announces(self.kind.capability())
            })
        };
        let key = match page.get("ttlMs").is_some() || default_ttl_fits() {
            true => cache.key_for(self.list(), cursor, self.auth_context, &page),
            false => None,
        };
        match key {
            Some((key, ttl)) => {
                self.saw(ttl, scope);
                let page = Page {
                    key,
                    ttl,
                    received_unix_ms,
                    value: page.clone(),
                    bytes: size,
                    version: self.server.protocol_version(),
                };
                if self.ctx.registry.shared.is_some() {
                    self.to_share.push(page.clone());
                }
                self.fetched.push(page);
            }
            None => {
                self.saw(Duration::ZERO, scope);
                self.cacheable = false;
            }
        }
        Ok((page, size, false))
    }

    /// The page at `cursor` from the shared layer, if it shares this server. Its Redis
    /// key names the protocol version negotiated besides the key's fields (only the
    /// shared layer: memory and disk may be read before the server has connected).
    /// Also the version it was read in.
    async fn shared_get(&mut self, cursor: Option<&str>) -> Option<(CacheKey, Hit, String)> {
        let shared = self.ctx.registry.shared.as_ref()?;
        if !shared.shares(self.server.id()) {
            return None;
        }
        if self.l3_missed {
            // One miss (a first page: a later one's miss restarts the walk, see
            // `Walk::Restart`) and the rest of the walk asks the server.
            return None;
        }
        let protocol = self.server.protocol_version()?;
        let key = CacheKey {
            server: self.server.id().into(),
            fingerprint: self.server.fingerprint().into(),
            client: self.handlers.client_tag().into(),
            method: self.kind.method().into(),
            param: cursor.map(String::from),
            scope: "public".into(),
        };
        let read = shared.get(&key, &protocol).await;
        if !self.l3_asked {
            (self.l3_generation, self.l3_asked) = (read.generation, true);
        } else if read.generation != self.l3_generation {
            // The list changed during this walk: its pages must not be mixed.
            self.l3_missed = true;
            return None;
        }
        let Some(mut hit) = read.hit else {
            self.l3_missed = true;
            return None;
        };
        self.from_shared = true;
        // What another process stored is held to this one's ceiling too.
        let max = self.ctx.registry.cache.config().max_ttl;
        hit.remaining = hit.remaining.min(max);
        hit.ttl = hit.ttl.min(max);
        Some((key, hit, protocol))
    }

    fn protocol(&self, source: ProtocolError) -> Walk {
        Walk::Failed(CallError::Server(ServerError::Protocol {
            server: self.server.id().to_string(),
            source,
        }))
    }

    /// Counts a page against the bounds.
    fn account(&mut self, page: &Value, size: usize) -> Result<(), Walk> {
        let limits = &self.ctx.settings.limits;
        self.bytes += size;
        self.items += page_items(self.kind, page);
        let too_large = |what, limit| {
            Err(Walk::Failed(CallError::ListTooLarge {
                server: self.server.id().to_string(),
                what,
                limit,
            }))
        };
        if self.bytes > limits.max_list_bytes {
            return too_large("bytes", limits.max_list_bytes);
        }
        if self.items > limits.max_list_items {
            return too_large("items", limits.max_list_items);
        }
        Ok(())
    }

    /// The list, whole: what was fetched goes to the cache together, and a fetched tool
    /// list to the change detector.
    fn finish(self) -> Listed {
        let registry = &self.ctx.registry;
        if self.cacheable && !self.fetched.is_empty() {
            if self.keep_here {
                registry.cache.put_memory(&self.fetched, self.epoch);
            }
            if let Some(shared) = &registry.shared
                && !self.to_share.is_empty()
                // All of it fetched now: with a page from a cache among them, the rest
                // would reach Redis without it (a list is shared whole or not at all).
                && self.from_fetch_only
                && registry.cache.epoch(self.server.id()) == self.epoch
                && let Some(protocol) = self.server.protocol_version()
                // Every page sent under that version: a server that restarted during
                // the walk and spoke another has pages of two shapes.
                && self
                    .to_share
                    .iter()
                    .all(|p| p.version.as_deref() == Some(protocol.as_str()))
                && let Some(generation) = self.l3_generation
            {
                shared.put(&self.to_share, &protocol, generation);
            }
            if self.keep_here && registry.cache.config().dir.is_some() {
                self.ctx.registry_ref.put(self.fetched, self.epoch);
            }
        }
        if (!self.from_cache || self.from_shared) && self.kind == ListKind::Tools {
            let scope = self
                .pages
                .first()
                .map(|p| crate::protocol::CacheHints::of(p).scope)
                .and_then(|s| registry.cache.scope_key(s, self.auth_context))
                .map_or_else(|| "uncached".into(), |s| s.to_string());
            registry.tools_listed(
                self.server.id(),
                scope,
                &self.pages,
                (self.epoch, self.walk),
            );
        }
        // The server said its lists changed while this one was read: it is handed out
        // (its caller asked before the change), but as fresh for no time, or a gateway's
        // client told of the change before this answer came would keep it.
        let overtaken = registry.cache.epoch(self.server.id()) != self.epoch;
        Listed {
            server: self.server.clone(),
            pages: self.pages,
            from_cache: self.from_cache,
            // A list not kept (cut off at the page cap, its pages of mixed scopes) is
            // not fresh for anyone else either: a gateway's client would keep it.
            fresh_for: if self.cacheable && !overtaken {
                self.fresh_for
            } else {
                Duration::ZERO
            },
            public: self.public && !overtaken,
            refresh_window: self.refresh_window,
        }
    }
}

/// One walk of a list, and the flight it led, if it fetched a first page that others
/// may want too (see [`list_server`]).
async fn walk(
    ctx: &Arc<CallContext>,
    server: &ServerRef,
    kind: ListKind,
    auth_context: Option<&str>,
    timeout: Duration,
    use_cache: bool,
    start: Start,
) -> (Walk, Lead) {
    let first_counted = matches!(start, Start::Again);
    let (
        Begun {
            handlers,
            epoch,
            walk,
        },
        first,
    ) = match start {
        Start::Looked(look) => (look.begun, Some(look.page)),
        Start::Anew | Start::Again => (Begun::now(ctx, server.id()), None),
    };
    let mut walker = Walker {
        ctx,
        server,
        kind,
        auth_context,
        timeout,
        use_cache,
        handlers,
        first,
        first_counted,
        epoch,
        walk,
        fetching: None,
        lead: None,
        pages: Vec::new(),
        fetched: Vec::new(),
        to_share: Vec::new(),
        l3_missed: false,
        last_hit_public: false,
        l3_generation: None,
        l3_asked: false,
        from_shared: false,
        from_fetch_only: true,
        from_cache: true,
        cacheable: true,
        keep_here: ctx
            .registry
            .shared
            .as_ref()
            .is_none_or(|s| s.keeps(server.id())),
        bytes: 0,
        items: 0,
        fresh_for: Duration::MAX,
        public: true,
        first_scope: None,
        refresh_window: Duration::MAX,
    };
    let mut pager = Pager::new(ctx.settings.limits.max_list_pages);
    let (mut cursor, mut cursor_cached) = (None::<String>, false);
    loop {
        let (page, size, cached) = match walker.page(cursor.as_deref(), cursor_cached).await {
            Ok(p) => p,
            Err(end) => return (end, walker.lead.take()),
        };
        if let Err(end) = walker.account(&page, size) {
            return (end, walker.lead.take());
        }
        let next = pager.next(&page);
        walker.pages.push(page);
        match next {
            Some(c) => (cursor, cursor_cached) = (Some(c), cached),
            None => break,
        }
    }
    if let Some(cutoff) = pager.cutoff() {
        tracing::warn!(server = %server.id(), ?cutoff, "list cut off");
        // Kept only whole: a list past the page cap is served this once. (One that
        // came back to a cursor it gave before has given every page it has.)
        if matches!(cutoff, Cutoff::TooManyPages(_)) {
            walker.cacheable = false;
        }
    }
    let lead = walker.lead.take();
    (Walk::Done(walker.finish()), lead)
}

/// Whether a server's error for a cached cursor may be the cursor's: the spec's
/// -32602, or what servers answer for one their restart forgot (an internal error,
/// "not found"). Not a method it lacks, nor a refusal of the request's shape or
/// version, which reading from the first page would meet again.
fn rejects_cursor(error: &ServerError) -> bool {
    match error {
        ServerError::Rpc { error, .. } => match error.kind() {
            RpcErrorKind::InvalidParams => true,
            RpcErrorKind::Other => matches!(
                error.code,
                crate::protocol::error::INTERNAL_ERROR | crate::protocol::error::RESOURCE_NOT_FOUND
            ),
            _ => false,
        },
        _ => false,
    }
}

/// Whether a server is worth listing for `kind`: routable, and (once connected) says it
/// has such items.
pub(crate) fn offers(server: &ServerRef, kind: ListKind) -> bool {
    server.state().routable() && has(server, kind)
}

/// Whether `server` offers items of `kind`, as far as is known: it has not said it
/// offers none.
fn has(server: &ServerRef, kind: ListKind) -> bool {
    server.offers().is_none_or(|o| match kind {
        ListKind::Tools => o.tools,
        ListKind::Prompts => o.prompts,
        ListKind::Resources | ListKind::ResourceTemplates => o.resources,
    })
}

/// Whether `server` may offer items of `kind` (running or not): enabled in the config,
/// and, if it has said what it offers, offering them. One that may not is not named
/// among the servers a listing could not ask.
pub(crate) fn may_offer(server: &ServerRef, kind: ListKind) -> bool {
    server.config().enabled && has(server, kind)
}

/// When a listing of several servers gives up on all of them: at `until`, reported as
/// a timeout of `total`.
#[derive(Clone, Copy)]
struct GiveUp {
    until: tokio::time::Instant,
    total: Duration,
}

/// [`list_server`], given up (its requests cancelled) as `give_up` says.
async fn list_within(
    ctx: &Arc<CallContext>,
    server: &ServerRef,
    kind: ListKind,
    auth_context: Option<&str>,
    timeout: Duration,
    give_up: GiveUp,
    first: FirstLook,
) -> Result<Listed, CallError> {
    let walked = list_server(ctx, server, kind, auth_context, timeout, Some(first));
    match tokio::time::timeout_at(give_up.until, walked).await {
        Ok(listed) => listed,
        Err(_) => Err(CallError::Server(ServerError::Transport {
            server: server.id().to_string(),
            source: TransportError::Timeout(give_up.total),
        })),
    }
}

/// The lists of `servers` that offer `kind`, in their order: from the cache without
/// leaving this task when all are fresh, else the misses fetched in parallel. Servers
/// that cannot be listed are returned apart, with why.
pub(crate) async fn list_all(
    ctx: &Arc<CallContext>,
    caller: &Caller,
    kind: ListKind,
    servers: Vec<ServerRef>,
    deadline: Option<Instant>,
) -> (Vec<Listed>, Vec<(Unreachable, Option<CallError>)>) {
    let mut lists = Vec::new();
    let mut unreachable = Vec::new();
    let mut set = tokio::task::JoinSet::new();
    let mut spawned = Vec::new();
    let mut done = Vec::new();
    // One bound on each server's whole walk, not only on each page: a server that answers
    // every page just in time with a new cursor would otherwise hold a listing (and every
    // bare-name call waiting on it) for `max_list_pages` timeouts. A call's own deadline,
    // else `call_timeout`.
    let total = match deadline {
        Some(d) => d.saturating_duration_since(Instant::now()),
        None => ctx.settings.call_timeout,
    };
    let give_up = GiveUp {
        until: crate::util::duration::after(tokio::time::Instant::now(), total),
        total,
    };
    for (i, server) in servers.into_iter().enumerate() {
        if !server.state().routable() {
            if !may_offer(&server, kind) {
                continue;
            }
            let status = server.status();
            unreachable.push((
                Unreachable {
                    server: server.id().to_string(),
                    state: status.state,
                    reason: status.last_error.unwrap_or_else(|| "not running".into()),
                },
                None,
            ));
            continue;
        }
        if !offers(&server, kind) {
            continue;
        }
        // A call's listing is bounded by the call's deadline too.
        let timeout = match deadline {
            Some(d) => server
                .config()
                .timeout
                .min(d.saturating_duration_since(Instant::now())),
            None => server.config().timeout,
        };
        let auth = caller.auth_context.clone();
        // The walk begins here (see `FirstLook`).
        let begun = Begun::now(ctx, server.id());
        let first = ctx.registry.cache.get(
            ListOf {
                server: server.id(),
                fingerprint: server.fingerprint(),
                client: begun.handlers.client_tag(),
                method: kind.method(),
                server_ref: Some(&server),
            },
            None,
            auth.as_deref(),
        );
        let first_cached = first.is_some();
        // A list of one page, fresh: the whole walk is a cache read. One with more
        // pages may find a later one expired (each page has its ttl) and ask the server:
        // in a task, so that the servers after it are not held up.
        let whole_cached = first
            .as_ref()
            .is_some_and(|hit| hit.value.get("nextCursor").is_none());
        let first = FirstLook { begun, page: first };
        if !first_cached && server.state() == ServerState::Restarting {
            // Its list would wait in the restart queue, perhaps for good (a server that
            // crashes on start): left out until it is back. Qualified calls still queue.
            unreachable.push((
                Unreachable {
                    server: server.id().to_string(),
                    state: ServerState::Restarting,
                    reason: server
                        .status()
                        .last_error
                        .unwrap_or_else(|| "restarting".into()),
                },
                None,
            ));
            continue;
        }
        if whole_cached {
            // Fresh in the cache: walked here, without a task or a round trip.
            let listed =
                list_within(ctx, &server, kind, auth.as_deref(), timeout, give_up, first).await;
            done.push((i, server, listed));
            continue;
        }
        let ctx2 = ctx.clone();
        let listing = server.clone();
        let task = set.spawn(async move {
            let listed = list_within(
                &ctx2,
                &server,
                kind,
                auth.as_deref(),
                timeout,
                give_up,
                first,
            )
            .await;
            (i, server, listed)
        });
        spawned.push((task.id(), listing));
    }
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(item) => done.push(item),
            // A listing that panicked still counts its server as not listed: left out,
            // a bare name would read as offered by no server at all.
            Err(e) => {
                if let Some((_, server)) = spawned.iter().find(|(id, _)| *id == e.id()) {
                    tracing::error!(server = %server.id(), error = %e, "a listing task failed");
                    unreachable.push((
                        Unreachable {
                            server: server.id().to_string(),
                            state: server.state(),
                            reason: "its listing failed".into(),
                        },
                        None,
                    ));
                }
            }
        }
    }
    done.sort_by_key(|(i, _, _)| *i);
    for (_, server, listed) in done {
        match listed {
            Ok(l) => lists.push(l),
            Err(e) => {
                tracing::warn!(server = %server.id(), error = %e, "could not list");
                let status = server.status();
                unreachable.push((
                    Unreachable {
                        server: server.id().to_string(),
                        state: status.state,
                        reason: e.to_string(),
                    },
                    Some(e),
                ));
            }
        }
    }
    (lists, unreachable)
}

/// What `caller` may use of `kind`, optionally only on servers tagged `tag`, sorted by
/// qualified name. Only servers on which the caller holds some grant are asked.
pub(crate) async fn list(
    ctx: &Arc<CallContext>,
    caller: &Caller,
    kind: ListKind,
    tag: Option<&str>,
) -> Result<Listing, CallError> {
    let agent = caller.agent_id.as_deref();
    if agent.is_none() {
        return Err(CallError::Denied {
            agent: None,
            server: None,
            tool: "*".into(),
        });
    }
    let tagged: Vec<ServerRef> = ctx
        .servers
        .all()
        .into_iter()
        .filter(|s| tag.is_none_or(|t| s.config().tags.iter().any(|x| x == t)))
        .collect();
    let offered = tagged.len();
    let servers: Vec<ServerRef> = tagged
        .into_iter()
        .filter(|s| ctx.allows_any(agent, s))
        .collect();
    // A server left out for the caller's grants makes the list the caller's own, as an
    // item left out does.
    let whole = servers.len() == offered;
    let (lists, unreachable) = list_all(ctx, caller, kind, servers, None).await;
    let mut out = Vec::new();
    let (mut fresh_for, mut public) = (Duration::MAX, whole);
    for listed in lists {
        let items = ctx.catalog.items(kind, listed.server.id(), &listed.pages);
        let config = listed.server.config();
        let policy = ctx.policy.read();
        let grant = policy.on_server(agent, &config.id, &config.tags);
        let before = out.len();
        // A template stands for URIs no grant can name in advance: it is listed to
        // those who may read anything of its server.
        let templates = kind == ListKind::ResourceTemplates;
        out.extend(
            items
                .iter()
                .filter(|t| {
                    if templates {
                        grant.every()
                    } else {
                        grant.allows(&t.name)
                    }
                })
                .map(|t| ToolInfo {
                    from_cache: listed.from_cache,
                    ..t.clone()
                }),
        );
        fresh_for = fresh_for.min(listed.fresh_for);
        public &= listed.public && out.len() - before == items.len();
    }
    out.sort_by(|a, b| a.qualified.cmp(&b.qualified));
    Ok(Listing {
        items: out,
        unreachable,
        fresh_for: if fresh_for == Duration::MAX {
            Duration::ZERO
        } else {
            fresh_for
        },
        public,
    })
}
