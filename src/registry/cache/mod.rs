//! The list cache: what servers list (`tools/list`, `prompts/list`,
//! `resources/list`, page by page), kept by the servers' own `ttlMs` / `cacheScope`
//! hints, in memory (L1) and on disk (L2, [`disk`], survives a restart).
//!
//! Key: server, the fingerprint of its configuration (a server changed under the same
//! id never serves its old entries), what it was told of its client (capabilities and
//! protocol versions offered: it may list by them), method, the cursor (`""` is a cursor too), and
//! scope: `public`, or `private` plus a hash of the caller's auth context. A `private`
//! result with no context is used once and never stored; a `public` one is shared by
//! everyone. Freshness: the result's `ttlMs` when it has one (negative: 0), else the
//! configured default (legacy servers send no hints: with no scope either, their lists
//! are private, kept per auth context), never more than `max_ttl`.
//! `input_required` results and MRTR retries are never offered to the cache, and calls'
//! results (`resources/read` included) are not cached at all.
//!
//! Reads take a read lock on L1 (and on a miss, L2's index; a page found there is
//! promoted under L1's write lock): they never wait on an actor. Writes come from the `RegistryActor`; a page is held once, behind an `Arc`,
//! by the caller that fetched it, L1, L2's index and the change hash alike.

mod disk;
pub mod shared;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::protocol::{CacheHints, CacheScope};
use crate::util::duration;
use crate::util::hash::hmac_sha256_hex;
use crate::util::invalid::Invalid;

/// The list cache's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Directory of the disk layer (L2); memory only when `None`.
    pub dir: Option<PathBuf>,
    /// Freshness of results that carry no `ttlMs` (legacy servers).
    #[serde(with = "duration")]
    pub default_ttl: Duration,
    /// The longest any entry stays fresh, whatever a server says.
    #[serde(with = "duration")]
    pub max_ttl: Duration,
    /// The shared layer (L3) on Redis; none when `None`.
    pub shared: Option<shared::SharedConfig>,
    /// Re-list in the background a list used within its last `refresh_ahead` of
    /// freshness (and its last tenth), so a hot list never makes a caller wait; zero
    /// turns it off.
    #[serde(with = "duration")]
    pub refresh_ahead: Duration,
    /// Bytes of pages each layer (memory, disk) holds at most, each counted with its
    /// key and 256 bytes for the entry itself; past it the expired go first, then those
    /// that expire soonest. Servers choose their cursors, scopes and freshness, and
    /// callers their auth contexts: without a bound, a cache grows with them.
    pub max_bytes: usize,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            dir: None,
            default_ttl: Duration::from_secs(300),
            max_ttl: Duration::from_secs(24 * 3600),
            shared: None,
            refresh_ahead: Duration::from_secs(10),
            max_bytes: 256 << 20,
        }
    }
}

impl CacheConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), Invalid> {
        // (`dir = "${MCP_CACHE_DIR:-}"` with the variable unset: the working directory,
        // `/` for a service, would hold the tokens.)
        if self.dir.as_ref().is_some_and(|d| d.as_os_str().is_empty()) {
            return Err(Invalid::new(
                "dir",
                "is empty (leave it out for no disk cache)",
            ));
        }
        if self.max_ttl.is_zero() {
            return Err(Invalid::new("max_ttl", "must be more than zero"));
        }
        // As a config file's durations are held (a config built in code skips that
        // parse): past it, a Redis expiry or a clock addition overflows.
        for (field, d) in [
            ("default_ttl", self.default_ttl),
            ("max_ttl", self.max_ttl),
            ("refresh_ahead", self.refresh_ahead),
        ] {
            if d > crate::util::duration::LONGEST {
                return Err(Invalid::new(
                    field,
                    "is longer than ten years, the longest taken",
                ));
            }
        }
        if self.max_bytes == 0 {
            return Err(Invalid::new("max_bytes", "must be more than zero"));
        }
        if let Some(shared) = &self.shared {
            shared.validate().map_err(|e| e.under("shared"))?;
        }
        Ok(())
    }
}

/// Why a cache could not be made: a setting out of range (a zero budget would empty
/// the disk layer's directory; a duration past ten years overflows an expiry).
#[derive(Debug, thiserror::Error)]
#[error("cache: {0}")]
pub struct CacheError(pub Invalid);

/// Where a cached page is looked up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheKey {
    /// Server id.
    pub server: String,
    /// The server's configuration fingerprint.
    pub fingerprint: String,
    /// What the server was told of its client: a digest of the client capabilities
    /// and protocol versions offered. A list asked with other capabilities may hold
    /// other tools. (Empty in files written before it was kept, whose names it leaves
    /// as they were: they load, no lookup finds them, and they expire.)
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub client: String,
    /// The method, for example `tools/list`.
    pub method: String,
    /// The cursor of the page (`""` is a cursor too); `None` for the first page.
    pub param: Option<String>,
    /// `public`, or `private:` and the keyed hash of the auth context.
    pub scope: String,
}

impl std::hash::Hash for CacheKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // As a `KeyRef` hashes, so that a lookup by reference finds it.
        self.key_ref().hash(state);
    }
}

/// A key's fields by reference: a lookup builds no strings (building two keys of five
/// strings each was a third of a cached listing's cost).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct KeyRef<'a> {
    server: &'a str,
    fingerprint: &'a str,
    client: &'a str,
    method: &'a str,
    param: Option<&'a str>,
    scope: &'a str,
}

/// What a map of [`CacheKey`]s can be asked with: an owned key, or a [`KeyRef`].
trait AsKeyRef {
    fn key_ref(&self) -> KeyRef<'_>;
}

impl AsKeyRef for CacheKey {
    fn key_ref(&self) -> KeyRef<'_> {
        KeyRef {
            server: &self.server,
            fingerprint: &self.fingerprint,
            client: &self.client,
            method: &self.method,
            param: self.param.as_deref(),
            scope: &self.scope,
        }
    }
}

impl AsKeyRef for KeyRef<'_> {
    fn key_ref(&self) -> KeyRef<'_> {
        *self
    }
}

impl<'a> std::borrow::Borrow<dyn AsKeyRef + 'a> for CacheKey {
    fn borrow(&self) -> &(dyn AsKeyRef + 'a) {
        self
    }
}

impl std::hash::Hash for dyn AsKeyRef + '_ {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key_ref().hash(state);
    }
}

impl PartialEq for dyn AsKeyRef + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.key_ref() == other.key_ref()
    }
}

impl Eq for dyn AsKeyRef + '_ {}

/// Auth contexts whose `private:` scope is remembered; past this the memo starts over.
const PRIVATE_SCOPES_MAX: usize = 1024;

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Entry {
    key: CacheKey,
    /// Shared, so that a hit costs a reference count, not a copy of the list.
    value: Arc<Value>,
    expires_unix_ms: u64,
    /// The freshness it was stored with (0 in files written before it was kept).
    #[serde(default)]
    ttl_ms: u64,
    /// The protocol version the server spoke when it sent it ([`Page::version`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    version: Option<String>,
    bytes: usize,
    /// What its value holds in memory ([`held_size`]); worked out when it is made or
    /// loaded, never read from a file.
    #[serde(skip)]
    held: usize,
}

impl Entry {
    /// What it counts against a layer's budget.
    fn cost(&self) -> usize {
        self.bytes
            .max(self.held)
            .saturating_add(key_cost(&self.key))
    }
}

/// What an entry costs a layer's budget beyond its page: its key's strings, plus the
/// map's slot and the entry's own fields, so that many tiny pages (a server's cursors,
/// callers' auth contexts) cannot hold memory many times the budget.
const ENTRY_OVERHEAD: usize = 256;

fn key_cost(key: &CacheKey) -> usize {
    [
        key.server.len(),
        key.fingerprint.len(),
        key.client.len(),
        key.method.len(),
        key.param.as_ref().map_or(0, String::len),
        key.scope.len(),
        ENTRY_OVERHEAD,
    ]
    .into_iter()
    .fold(0usize, usize::saturating_add)
}

/// One layer's entries and what they cost together, kept as they change so that a
/// write that fits needs no walk over the layer; and how many each server has, so that
/// dropping a server's entries when it has none costs no walk either (a flood of
/// invalidations from Redis would hold the layer's lock walking it for each).
#[derive(Default)]
struct Layer {
    entries: HashMap<CacheKey, Entry>,
    cost: usize,
    per_server: HashMap<String, usize>,
}

impl Layer {
    fn new(entries: HashMap<CacheKey, Entry>) -> Layer {
        let cost = entries
            .values()
            .map(Entry::cost)
            .fold(0usize, usize::saturating_add);
        let mut per_server = HashMap::new();
        for key in entries.keys() {
            *per_server.entry(key.server.clone()).or_insert(0) += 1;
        }
        Layer {
            entries,
            cost,
            per_server,
        }
    }

    fn insert(&mut self, key: CacheKey, entry: Entry) {
        self.cost = self.cost.saturating_add(entry.cost());
        let server = key.server.clone();
        match self.entries.insert(key, entry) {
            Some(old) => self.cost = self.cost.saturating_sub(old.cost()),
            None => *self.per_server.entry(server).or_insert(0) += 1,
        }
    }

    fn remove(&mut self, key: &CacheKey) -> Option<Entry> {
        let old = self.entries.remove(key)?;
        self.cost = self.cost.saturating_sub(old.cost());
        self.gone(&key.server, 1);
        Some(old)
    }

    fn retain(&mut self, mut keep: impl FnMut(&CacheKey, &Entry) -> bool) {
        let mut cost = self.cost;
        let mut gone: HashMap<String, usize> = HashMap::new();
        self.entries.retain(|k, e| {
            let kept = keep(k, e);
            if !kept {
                cost = cost.saturating_sub(e.cost());
                *gone.entry(k.server.clone()).or_insert(0) += 1;
            }
            kept
        });
        self.cost = cost;
        for (server, n) in gone {
            self.gone(&server, n);
        }
    }

    /// Whether `server` has any entry here.
    fn holds(&self, server: &str) -> bool {
        self.per_server.contains_key(server)
    }

    fn gone(&mut self, server: &str, n: usize) {
        if let Some(count) = self.per_server.get_mut(server) {
            *count = count.saturating_sub(n);
            if *count == 0 {
                self.per_server.remove(server);
            }
        }
    }
}

/// A page to store, as the fetcher read it.
#[derive(Clone, Debug)]
pub struct Page {
    /// Where.
    pub key: CacheKey,
    /// For how long.
    pub ttl: Duration,
    /// When it arrived (unix milliseconds): its freshness counts from then, not from
    /// when a layer stores it (a long walk, or a disk write queued behind others,
    /// would serve it past its `ttlMs`).
    pub received_unix_ms: u64,
    /// The page.
    pub value: Arc<Value>,
    /// Its size as JSON.
    pub bytes: usize,
    /// The protocol version the server spoke when it sent it (`None`: not known): a
    /// later run serves it from the disk only to a server that speaks it still (or has
    /// not connected yet), since a list's shape follows the version.
    pub version: Option<String>,
}

/// A fresh cached page.
#[derive(Clone, Debug)]
pub struct Hit {
    /// The page.
    pub value: Arc<Value>,
    /// Its size as JSON.
    pub bytes: usize,
    /// How long it stays fresh.
    pub remaining: Duration,
    /// The freshness it was stored with.
    pub ttl: Duration,
    /// Its scope.
    pub scope: CacheScope,
}

/// Counters of one cache layer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LayerStats {
    /// Entries held.
    pub entries: usize,
    /// Bytes of the entries' JSON.
    pub bytes: usize,
    /// Lookups answered by this layer.
    pub hits: u64,
    /// Lookups this layer could not answer.
    pub misses: u64,
}

/// Counters of the whole cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CacheStats {
    /// Memory.
    pub l1: LayerStats,
    /// Disk (all zero when no directory is configured).
    pub l2: LayerStats,
    /// Redis (all zero when no shared layer is configured).
    pub l3: shared::SharedStats,
    /// Times a server's entries were dropped (list changes, removals, rejected cursors).
    pub invalidations: u64,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
}

/// The name of the key private scopes are hashed under, kept in the cache directory.
/// Names there that are not servers' start with `__`, which no server id may (a server
/// named like them would share their place).
const SCOPE_KEY_FILE: &str = "__scope.key";

/// Where sign-in tokens are kept in a cache directory (the harness's and the command
/// line's default store); see [`SCOPE_KEY_FILE`] for the name.
pub const TOKENS_DIR: &str = "__tokens";

/// The token directory under `cache_dir` ([`TOKENS_DIR`]); `None` when the disk layer
/// would refuse that directory (not this user's, or writable by users outside its
/// group: another user could move or replace the token folder in it). Tokens an
/// earlier release kept in `tokens` there are moved to it first, if that folder holds
/// token files and nothing else: not cache entries (a server named `tokens`), not
/// another program's folder of that name (a `cache.dir` of `~/.cache`).
pub fn token_dir(cache_dir: &Path) -> Option<PathBuf> {
    if !disk::prepare(cache_dir) {
        return None;
    }
    let dir = cache_dir.join(TOKENS_DIR);
    let old = cache_dir.join("tokens");
    let a_real_dir = std::fs::symlink_metadata(&old).is_ok_and(|m| m.is_dir());
    if a_real_dir && std::fs::symlink_metadata(&dir).is_err() {
        // A token's file, its lock, or a write of it under way: 32 hex digits, then
        // `.json`, `.lock` or `.tmp…` (what the file store names them).
        let token_file = |name: &str| {
            name.get(..32)
                .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
                && name.get(32..).is_some_and(|rest| {
                    [".json", ".lock", ".tmp"]
                        .iter()
                        .any(|e| rest.starts_with(e))
                })
        };
        let only_tokens = std::fs::read_dir(&old).map(|files| {
            let names: Vec<String> = files
                .flatten()
                .map(|f| f.file_name().to_string_lossy().into_owned())
                .collect();
            names.iter().any(|n| n.ends_with(".json"))
                && names.iter().all(|n| token_file(n) && !disk::ours(n))
        });
        if let Ok(true) = only_tokens {
            match std::fs::rename(&old, &dir) {
                Ok(()) => {
                    tracing::info!(from = %old.display(), to = %dir.display(), "sign-in tokens moved")
                }
                Err(e) => {
                    tracing::warn!(from = %old.display(), error = %e, "sign-in tokens not moved")
                }
            }
        }
    }
    Some(dir)
}

/// Now, in unix milliseconds (0 before 1970).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What a lookup asks of the server it is for.
pub trait Speaks: Sync {
    /// The protocol version it speaks: its ready connection's, else its last one's (a
    /// server restarting); `None` before it first connected.
    fn protocol_version(&self) -> Option<String>;
}

impl Speaks for crate::server::ServerRef {
    fn protocol_version(&self) -> Option<String> {
        self.last_protocol_version()
    }
}

/// What one server's list request is keyed by, before the cursor and scope.
#[derive(Clone, Copy)]
pub struct ListOf<'a> {
    /// Server id.
    pub server: &'a str,
    /// Its configuration fingerprint.
    pub fingerprint: &'a str,
    /// What it is told of its client ([`CacheKey::client`]).
    pub client: &'a str,
    /// The list method.
    pub method: &'a str,
    /// The server, when known: a page from the disk (another run's, perhaps) is served
    /// only if it was read in the version the server speaks now, and is kept in memory
    /// only once that is known (the server connected).
    pub server_ref: Option<&'a dyn Speaks>,
}

impl std::fmt::Debug for ListOf<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListOf")
            .field("server", &self.server)
            .field("fingerprint", &self.fingerprint)
            .field("client", &self.client)
            .field("method", &self.method)
            .field("server_ref", &self.server_ref.is_some())
            .finish()
    }
}

/// Invalidation epochs: each server's last (0 for one never invalidated).
#[derive(Default)]
struct Epochs {
    by_server: HashMap<String, u64>,
    /// The last epoch given out: every new one is greater than all before, so an
    /// entry let go and made again never comes back to an old value.
    last: u64,
    /// Removed servers whose epochs are still held, the latest [`RETIRED_KEPT`].
    retired: std::collections::VecDeque<String>,
}

/// Removed servers whose epochs are held: long enough for any fetch begun before a
/// removal to end (each is bounded by `call_timeout`), so the map follows the servers
/// there are, not every id ever seen.
const RETIRED_KEPT: usize = 1024;

/// The cache; see the module docs.
pub struct ListCache {
    config: CacheConfig,
    l1: RwLock<Layer>,
    l2: RwLock<Layer>,
    l1_counts: Counters,
    l2_counts: Counters,
    invalidations: AtomicU64,
    /// Moved on every invalidation of a server; a write from an older fetch is dropped.
    epochs: RwLock<Epochs>,
    /// Auth context → its `private:` scope: a hash on every lookup was another third
    /// of a cached listing's cost.
    private_scopes: RwLock<HashMap<String, Arc<str>>>,
    /// The key a private scope is an HMAC under: kept in the cache directory (so a
    /// restarted process finds its private entries), per process without one. Whoever
    /// reads the files cannot test a guessed auth context against them.
    scope_key: Vec<u8>,
}

impl ListCache {
    /// A cache with these settings, checked first ([`CacheConfig::validate`]); the disk
    /// layer is loaded now (blocking I/O: call it off the async threads), skipping
    /// entries that expired while the harness was down.
    pub fn new(config: CacheConfig) -> Result<ListCache, CacheError> {
        config.validate().map_err(CacheError)?;
        let mut config = config;
        if let Some(dir) = &config.dir
            && !disk::prepare(dir)
        {
            // Logged by `prepare`; memory alone serves.
            config.dir = None;
        }
        // A shared server's lists may have been invalidated by another process while
        // this one was down, and that word went to those listening: they are read from
        // the shared layer or the server again, not from files that missed it.
        let shared = |server: &str| {
            config
                .shared
                .as_ref()
                .is_some_and(|s| s.servers.iter().any(|x| x == server))
        };
        let mut l2 = Layer::new(
            config
                .dir
                .as_deref()
                .map(|d| disk::load(d, config.max_ttl, config.max_bytes, shared))
                .unwrap_or_default(),
        );
        // Loading kept to the budget by the files' sizes; what the entries cost once
        // read is held to it too.
        if let Some(dir) = &config.dir {
            let mut dropped = Vec::new();
            Self::make_room(&mut l2, now_ms(), &[], config.max_bytes, &mut dropped);
            for key in dropped {
                disk::remove(dir, &key);
            }
        }
        let scope_key = match &config.dir {
            Some(dir) => {
                crate::util::secret::local_key(&dir.join(SCOPE_KEY_FILE), "cache scope key")
            }
            None => crate::util::secret::random_key(),
        };
        Ok(ListCache {
            scope_key,
            config,
            l1: RwLock::new(Layer::default()),
            l2: RwLock::new(l2),
            l1_counts: Counters::default(),
            l2_counts: Counters::default(),
            invalidations: AtomicU64::new(0),
            epochs: RwLock::new(Epochs::default()),
            private_scopes: RwLock::new(HashMap::new()),
        })
    }

    /// The settings.
    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    /// The current invalidation epoch (bumped by every invalidation) of `server`.
    pub fn epoch(&self, server: &str) -> u64 {
        self.epochs
            .read()
            .by_server
            .get(server)
            .copied()
            .unwrap_or(0)
    }

    /// The epoch a walk of `server`'s lists begins at, given out now if it has none:
    /// every walk holds one given out once (never 0), so an entry let go later
    /// ([`ListCache::retire`]) can come back to none a walk in flight holds.
    pub fn walk_epoch(&self, server: &str) -> u64 {
        if let Some(e) = self.epochs.read().by_server.get(server) {
            return *e;
        }
        let mut epochs = self.epochs.write();
        match epochs.by_server.get(server) {
            Some(e) => *e,
            None => Self::bump_in(&mut epochs, server),
        }
    }

    /// The scope part of a key: `public`, or `private:` and the keyed hash of the
    /// context; `None` for a private result without a context (never stored).
    pub fn scope_key(&self, scope: CacheScope, auth_context: Option<&str>) -> Option<Arc<str>> {
        match (scope, auth_context) {
            (CacheScope::Public, _) => Some("public".into()),
            (CacheScope::Private, Some(ctx)) => Some(self.private_scope(ctx)),
            (CacheScope::Private, None) => None,
        }
    }

    /// The `private:` scope of a context, remembered.
    fn private_scope(&self, auth_context: &str) -> Arc<str> {
        if let Some(scope) = self.private_scopes.read().get(auth_context) {
            return scope.clone();
        }
        let scope: Arc<str> = format!(
            "private:{}",
            hmac_sha256_hex(&self.scope_key, auth_context.as_bytes())
        )
        .into();
        let mut memo = self.private_scopes.write();
        if memo.len() >= PRIVATE_SCOPES_MAX {
            memo.clear();
        }
        memo.insert(auth_context.to_string(), scope.clone());
        scope
    }

    /// A fresh cached page for this request as `auth_context` may see it: a `public`
    /// entry, or a `private` one of the same context. Counted in the layers' hits and
    /// misses: look a page up this way once per page a listing wants.
    pub fn get(
        &self,
        list: ListOf<'_>,
        cursor: Option<&str>,
        auth_context: Option<&str>,
    ) -> Option<Hit> {
        self.get_at(now_ms(), list, cursor, auth_context)
    }

    /// [`ListCache::get`] for a page already looked up and missed, looked at again
    /// after a wait (another walk may have stored it meanwhile): not counted again.
    pub fn get_again(
        &self,
        list: ListOf<'_>,
        cursor: Option<&str>,
        auth_context: Option<&str>,
    ) -> Option<Hit> {
        self.lookup(now_ms(), list, cursor, auth_context, false)
    }

    /// [`ListCache::get`] at a given time (unix milliseconds).
    pub fn get_at(
        &self,
        now: u64,
        list: ListOf<'_>,
        cursor: Option<&str>,
        auth_context: Option<&str>,
    ) -> Option<Hit> {
        self.lookup(now, list, cursor, auth_context, true)
    }

    fn lookup(
        &self,
        now: u64,
        list: ListOf<'_>,
        cursor: Option<&str>,
        auth_context: Option<&str>,
        counted: bool,
    ) -> Option<Hit> {
        let count = |counter: &AtomicU64| {
            if counted {
                counter.fetch_add(1, Ordering::Relaxed);
            }
        };
        let private = auth_context.map(|c| self.private_scope(c));
        let key = |scope| KeyRef {
            server: list.server,
            fingerprint: list.fingerprint,
            client: list.client,
            method: list.method,
            param: cursor,
            scope,
        };
        let keys = [Some(key("public")), private.as_deref().map(key)];
        let keys = keys.iter().flatten().map(|k| k as &dyn AsKeyRef);
        // Fresh for at most its ttl from now: more left means the clock went back since
        // it was stored (NTP, a restored VM), and it is read again rather than kept
        // past its ttl by that much.
        // (A ttl of 0, from a file of an older version, is not known: not held to it.)
        let fresh = |e: &Entry| {
            e.expires_unix_ms > now
                && (e.ttl_ms == 0 || e.expires_unix_ms.saturating_sub(now) <= e.ttl_ms)
        };
        let hit = |e: &Entry| Hit {
            value: e.value.clone(),
            bytes: e.bytes,
            remaining: Duration::from_millis(e.expires_unix_ms.saturating_sub(now)),
            ttl: Duration::from_millis(e.ttl_ms),
            scope: if e.key.scope == "public" {
                CacheScope::Public
            } else {
                CacheScope::Private
            },
        };
        {
            let l1 = self.l1.read();
            if let Some(e) = keys
                .clone()
                .filter_map(|k| l1.entries.get(k))
                .find(|e| fresh(e))
            {
                count(&self.l1_counts.hits);
                return Some(hit(e));
            }
        }
        count(&self.l1_counts.misses);
        // Without a disk layer there is nothing more to ask.
        self.config.dir.as_ref()?;
        let epoch = self.epoch(list.server);
        // Memory holds only pages of this run's connections (a restart drops them);
        // the disk's may be of a server since upgraded.
        let speaks = list.server_ref.and_then(|s| s.protocol_version());
        let same_version = |e: &Entry| match (&e.version, &speaks) {
            (Some(then), Some(now)) => then == now,
            _ => true,
        };
        let found = {
            let l2 = self.l2.read();
            keys.filter_map(|k| l2.entries.get(k))
                .find(|e| fresh(e) && same_version(e))
                .cloned()
        };
        match found {
            Some(e) => {
                count(&self.l2_counts.hits);
                let found = hit(&e);
                // Promoted only if no invalidation came between the read and now (the
                // L1 write lock is held while the epoch is checked), and once its
                // version is known to be the server's.
                let known = speaks.is_some() || e.version.is_none();
                let mut l1 = self.l1.write();
                if known
                    && self.epoch(list.server) == epoch
                    && Self::make_room(
                        &mut l1,
                        now,
                        std::slice::from_ref(&e),
                        self.config.max_bytes,
                        &mut Vec::new(),
                    )
                {
                    l1.insert(e.key.clone(), e);
                }
                Some(found)
            }
            None => {
                count(&self.l2_counts.misses);
                None
            }
        }
    }

    /// Whether a page from this request would be stored, and under which key and TTL.
    pub fn key_for(
        &self,
        list: ListOf<'_>,
        cursor: Option<&str>,
        auth_context: Option<&str>,
        result: &Value,
    ) -> Option<(CacheKey, Duration)> {
        let hints = CacheHints::of(result);
        let ttl = if result.get("ttlMs").is_some() {
            hints.ttl
        } else {
            self.config.default_ttl
        };
        let ttl = ttl.min(self.config.max_ttl);
        if ttl.is_zero() {
            return None;
        }
        let scope = self.scope_key(hints.scope, auth_context)?.to_string();
        Some((
            CacheKey {
                server: list.server.into(),
                fingerprint: list.fingerprint.into(),
                client: list.client.into(),
                method: list.method.into(),
                param: cursor.map(String::from),
                scope,
            },
            ttl,
        ))
    }

    /// Stores the pages of one list fetched at `epoch`, in memory and on disk (the
    /// harness writes the two layers apart: [`ListCache::put_memory`], `put_disk`).
    #[cfg(test)]
    pub(crate) fn put(&self, pages: Vec<Page>, epoch: u64) {
        self.put_at(now_ms(), pages, epoch)
    }

    /// [`ListCache::put`] at a given time (unix milliseconds).
    #[cfg(test)]
    pub(crate) fn put_at(&self, now: u64, mut pages: Vec<Page>, epoch: u64) {
        for page in &mut pages {
            page.received_unix_ms = now;
        }
        self.put_memory_at(now, &pages, epoch);
        self.put_disk_at(now, pages, epoch);
    }

    /// Stores the pages of one list fetched at `epoch` in memory, at once: the listing
    /// that fetched them returns after they are in, so the next one is served from
    /// here. Cheap; the disk goes through the registry actor ([`ListCache::put_disk`]).
    pub(crate) fn put_memory(&self, pages: &[Page], epoch: u64) {
        self.put_memory_at(now_ms(), pages, epoch)
    }

    fn entry(page: &Page, max_ttl: Duration) -> Entry {
        let ttl = page.ttl.min(max_ttl);
        Entry {
            key: page.key.clone(),
            value: page.value.clone(),
            expires_unix_ms: page.received_unix_ms.saturating_add(ttl.as_millis() as u64),
            ttl_ms: ttl.as_millis() as u64,
            version: page.version.clone(),
            bytes: page.bytes,
            held: held_size(&page.value),
        }
    }

    /// Makes room in `layer` for `pages` within `max_bytes` (each entry counted with
    /// its key, [`key_cost`]; expired entries, never served, stay until room is needed
    /// or the next start): when they do not fit, drops the expired entries, then
    /// those that expire soonest, never the pages' own keys (they are replaced), down to
    /// a quarter below the budget where it can, so that the next writes fit without a
    /// walk. `false`, and nothing dropped, when the pages alone are past the budget: a
    /// list is cached whole or not at all. The keys dropped go to `dropped`, for the
    /// disk.
    fn make_room(
        layer: &mut Layer,
        now: u64,
        pages: &[Entry],
        max_bytes: usize,
        dropped: &mut Vec<CacheKey>,
    ) -> bool {
        let incoming = pages
            .iter()
            .map(Entry::cost)
            .fold(0usize, usize::saturating_add);
        if incoming > max_bytes {
            return false;
        }
        let replaced = |layer: &Layer| {
            pages
                .iter()
                .filter_map(|p| layer.entries.get(&p.key))
                .map(Entry::cost)
                .fold(0usize, usize::saturating_add)
        };
        let after = |layer: &Layer| {
            layer
                .cost
                .saturating_sub(replaced(layer))
                .saturating_add(incoming)
        };
        if after(layer) <= max_bytes {
            return true;
        }
        let goal = max_bytes - (max_bytes / 4).min(max_bytes - incoming);
        // A set: a list may have a thousand pages and a layer many thousand entries.
        let own: std::collections::HashSet<&CacheKey> = pages.iter().map(|p| &p.key).collect();
        layer.retain(|k, e| {
            let keep = e.expires_unix_ms > now;
            if !keep {
                dropped.push(k.clone());
            }
            keep
        });
        if after(layer) <= goal {
            return true;
        }
        // Borrowed, not copied: only the keys dropped are (a layer's keys may hold
        // as many bytes as its budget, under the lock every lookup takes).
        let mut left = after(layer);
        let mut by_expiry: Vec<(u64, &CacheKey, usize)> = layer
            .entries
            .iter()
            .filter(|(k, _)| !own.contains(k))
            .map(|(k, e)| (e.expires_unix_ms, k, e.cost()))
            .collect();
        by_expiry.sort_unstable_by_key(|(expires, ..)| *expires);
        let mut doomed = Vec::new();
        for (_, key, cost) in by_expiry {
            if left <= goal {
                break;
            }
            left = left.saturating_sub(cost);
            doomed.push(key.clone());
        }
        for key in doomed {
            if layer.remove(&key).is_some() {
                dropped.push(key);
            }
        }
        true
    }

    /// A list's entries without the pages expired already (a `ttlMs` shorter than the
    /// walk): stored, they would be served to nobody, and push out live entries to
    /// make room. The others are stored as ever: a later page's shorter life is its own.
    fn live(entries: Vec<Entry>, now: u64) -> Vec<Entry> {
        entries
            .into_iter()
            .filter(|e| e.expires_unix_ms > now)
            .collect()
    }

    fn put_memory_at(&self, now: u64, pages: &[Page], epoch: u64) {
        // Made before the lock is taken: what a page holds is worked out walking it.
        let entries: Vec<Entry> = pages
            .iter()
            .map(|p| Self::entry(p, self.config.max_ttl))
            .collect();
        let entries = Self::live(entries, now);
        if entries.is_empty() {
            return;
        }
        // The epoch is read under the layer's lock: an invalidation bumps the epoch and
        // then takes this lock to drop entries, so a stale list either sees the new
        // epoch here or is dropped right after.
        let mut l1 = self.l1.write();
        if pages.iter().any(|p| self.epoch(&p.key.server) != epoch) {
            return; // invalidated while it was being fetched
        }
        if !Self::make_room(
            &mut l1,
            now,
            &entries,
            self.config.max_bytes,
            &mut Vec::new(),
        ) {
            return;
        }
        for entry in entries {
            l1.insert(entry.key.clone(), entry);
        }
    }

    /// The disk layer's part of [`ListCache::put`] (writer: the registry actor, on a
    /// blocking thread: this writes files).
    pub(crate) fn put_disk(&self, pages: Vec<Page>, epoch: u64) {
        self.put_disk_at(now_ms(), pages, epoch)
    }

    fn put_disk_at(&self, now: u64, pages: Vec<Page>, epoch: u64) {
        let Some(dir) = &self.config.dir else {
            return;
        };
        // The index is changed under its lock and the files are written after: readers
        // on async threads take that lock, and a slow disk must not hold them.
        // Made before the lock is taken: what a page holds is worked out walking it.
        let entries: Vec<Entry> = pages
            .iter()
            .map(|p| Self::entry(p, self.config.max_ttl))
            .collect();
        let entries = Self::live(entries, now);
        if entries.is_empty() {
            return;
        }
        let (dropped, written) = {
            let mut l2 = self.l2.write();
            if pages.iter().any(|p| self.epoch(&p.key.server) != epoch) {
                return;
            }
            let mut dropped = Vec::new();
            let fits = Self::make_room(&mut l2, now, &entries, self.config.max_bytes, &mut dropped);
            let mut written = Vec::new();
            if fits {
                for entry in entries {
                    written.push(entry.clone());
                    l2.insert(entry.key.clone(), entry);
                }
            }
            (dropped, written)
        };
        for key in &dropped {
            disk::remove(dir, key);
        }
        for entry in &written {
            if let Err(e) = disk::write(dir, entry) {
                tracing::warn!(server = %entry.key.server, error = %e, "could not write the disk cache");
            }
        }
        // An invalidation while they were written (the registry actor runs one write or
        // invalidation at a time, but a write of an actor since rebuilt may still run)
        // must not leave them for the next start.
        if written.iter().any(|e| self.epoch(&e.key.server) != epoch) {
            for entry in &written {
                disk::remove(dir, &entry.key);
            }
        }
    }

    /// A new epoch for `server`: a fetch that started before it stores nothing.
    fn bump(&self, server: &str) {
        Self::bump_in(&mut self.epochs.write(), server);
    }

    fn bump_in(epochs: &mut Epochs, server: &str) -> u64 {
        epochs.last += 1;
        let next = epochs.last;
        match epochs.by_server.get_mut(server) {
            Some(e) => *e = next,
            None => {
                epochs.by_server.insert(server.to_string(), next);
            }
        }
        next
    }

    /// A removed server's epoch moves on (no fetch begun before stores anything, for
    /// it or another server under its id later) and is held among the latest
    /// [`RETIRED_KEPT`] removed; the oldest is let go (ids come and go: the map is not
    /// to grow with every one ever seen). One let go reads as 0, which no walk holds
    /// ([`ListCache::walk_epoch`]). Other servers' epochs do not move. (A server added
    /// again under a removed id is let go in its turn all the same: what its walks then
    /// in flight fetched is not stored, once.)
    pub(crate) fn retire(&self, server: &str) {
        let mut epochs = self.epochs.write();
        Self::bump_in(&mut epochs, server);
        // Removed again: counted from this removal.
        if let Some(i) = epochs.retired.iter().position(|r| r == server) {
            epochs.retired.remove(i);
        }
        epochs.retired.push_back(server.to_string());
        if epochs.retired.len() > RETIRED_KEPT
            && let Some(oldest) = epochs.retired.pop_front()
        {
            epochs.by_server.remove(&oldest);
        }
    }

    /// Drops every entry of `server` from both layers (list_changed, removal).
    pub(crate) fn invalidate(&self, server: &str) {
        self.forget_in_memory(server);
        if let Some(dir) = &self.config.dir {
            disk::remove_server(dir, server);
        }
        // Counted once done: whoever sees the count sees the entries gone.
        self.invalidations.fetch_add(1, Ordering::Relaxed);
    }

    /// Stops serving `server`'s entries at once: memory and the disk index are emptied
    /// (the files stay for [`ListCache::invalidate`], which the registry's writer runs
    /// in turn, behind the disk writes queued before it). Cheap, and needs no actor: a
    /// changed list is not served while the writer is busy.
    pub(crate) fn forget_in_memory(&self, server: &str) {
        self.bump(server);
        // The disk index first, then memory with a second bump under its lock: a reader
        // that read the first new epoch and found the disk index not yet emptied
        // promotes under that lock, so before memory is emptied (and is emptied with
        // it) or after this bump (and finds the epoch moved on).
        let mut l2 = self.l2.write();
        if l2.holds(server) {
            l2.retain(|k, _| k.server != server);
        }
        drop(l2);
        let mut l1 = self.l1.write();
        if l1.holds(server) {
            l1.retain(|k, _| k.server != server);
        }
        self.bump(server);
        drop(l1);
    }

    /// Drops the pages of one list of `server` (every scope): its cursor was rejected.
    #[cfg(test)]
    pub(crate) fn invalidate_list(&self, server: &str, method: &str) {
        let known = self.forget_list_in_memory(server, method);
        self.remove_list_files(server, method, &known);
    }

    /// Drops the pages of one list of `server` (every scope) from memory and the disk
    /// index, now; returns the keys the index knew of the server, each with whether it
    /// was dropped, for [`ListCache::remove_list_files`].
    pub(crate) fn forget_list_in_memory(
        &self,
        server: &str,
        method: &str,
    ) -> Vec<(CacheKey, bool)> {
        self.bump(server);
        let dropped = |k: &CacheKey| k.server == server && k.method == method;
        let known: Vec<(CacheKey, bool)> = {
            let mut l2 = self.l2.write();
            let known = (l2.entries.keys())
                .filter(|k| k.server == server)
                .map(|k| (k.clone(), dropped(k)))
                .collect();
            l2.retain(|k, _| !dropped(k));
            known
        };
        let mut l1 = self.l1.write();
        l1.retain(|k, _| !dropped(k));
        self.bump(server); // as in `invalidate`
        drop(l1);
        self.invalidations.fetch_add(1, Ordering::Relaxed);
        known
    }

    /// Removes the files of one list of `server` that [`ListCache::forget_list_in_memory`]
    /// dropped (`known`), and those of it the index did not know.
    pub(crate) fn remove_list_files(&self, server: &str, method: &str, known: &[(CacheKey, bool)]) {
        if let Some(dir) = &self.config.dir {
            disk::remove_where(dir, server, known, |k| {
                k.server == server && k.method == method
            });
        }
    }

    /// Entry counts, sizes, hits and misses per layer.
    pub fn stats(&self) -> CacheStats {
        let layer = |layer: &RwLock<Layer>, c: &Counters| {
            let m = layer.read();
            LayerStats {
                entries: m.entries.len(),
                bytes: m.entries.values().map(|e| e.bytes).sum(),
                hits: c.hits.load(Ordering::Relaxed),
                misses: c.misses.load(Ordering::Relaxed),
            }
        };
        CacheStats {
            l1: layer(&self.l1, &self.l1_counts),
            l2: if self.config.dir.is_some() {
                layer(&self.l2, &self.l2_counts)
            } else {
                LayerStats::default()
            },
            l3: shared::SharedStats::default(),
            invalidations: self.invalidations.load(Ordering::Relaxed),
        }
    }
}

/// What `value` holds in memory, estimated: each node of the tree, each string's
/// bytes, and each object member's key and slot. Its JSON text can be far less (an
/// array of small numbers takes 2 bytes an element as text, 32 in memory), and a budget
/// counted in text alone would hold many times itself.
pub(crate) fn held_size(value: &Value) -> usize {
    const NODE: usize = std::mem::size_of::<Value>();
    // A member's key (its `String`) and its share of the map's node.
    const MEMBER: usize = std::mem::size_of::<String>() + 16;
    // Depth is bounded: serde_json parses at most 128 levels.
    fn inside(v: &Value) -> usize {
        match v {
            // Capacities: an array grows by doubling, and up to half of it is spare.
            Value::String(s) => s.capacity(),
            Value::Array(items) => {
                (items.capacity() - items.len()) * NODE
                    + items.iter().map(|i| NODE + inside(i)).sum::<usize>()
            }
            Value::Object(members) => members
                .iter()
                .map(|(k, v)| MEMBER + k.len() + NODE + inside(v))
                .sum(),
            _ => 0,
        }
    }
    NODE + inside(value)
}

/// The size of `value` as compact JSON, counted without building the string.
pub fn json_size(value: &Value) -> usize {
    json_size_within(value, usize::MAX).unwrap_or(usize::MAX)
}

/// [`json_size`], if it is at most `max`: the count stops past it (a value of any
/// size is not walked whole to learn it is too large).
pub fn json_size_within(value: &Value, max: usize) -> Option<usize> {
    struct Count {
        n: usize,
        max: usize,
    }
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.n = self.n.saturating_add(buf.len());
            if self.n > self.max {
                return Err(std::io::Error::other("past the most counted"));
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count { n: 0, max };
    serde_json::to_writer(&mut count, value).ok()?;
    Some(count.n)
}

#[cfg(test)]
mod tests;
