//! The registry: what the servers list, cached by their hints, and what changed.
//!
//! Reads never queue behind this actor: lists are read from the shared
//! [`cache::ListCache`] and fetched by the caller's own task on a miss. The
//! [`RegistryActor`] is the cache's one writer (stores, invalidations on
//! `list_changed`, purges of removed servers), doing its disk I/O on blocking threads.
//! Each walk of a tool list records its hash per cache scope (SHA-256 of its tools'
//! canonical JSON, in any order) from its own task, and [`HarnessEvent::ToolsChanged`]
//! is announced when it changes. Everything it holds
//! lives in [`Registry`], outside the actor, so a rebuilt actor loses nothing.
//! [`names`] says how tools are named across servers and in which order candidates go.

pub mod cache;
pub mod names;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use parking_lot::Mutex;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::Value;
use tokio::sync::broadcast;

use crate::util::hash::sha256_hex;
use crate::util::slot::ActorSlot;
use cache::shared::SharedCache;

/// Schema hashes kept (one per server and scope); past it, one is let go for each new.
const MAX_SCHEMA_HASHES: usize = 4096;
/// The least time between two `ToolsChanged` of one server: a server whose list looks
/// different at every read (a rolling deploy behind one URL, a timestamp in a
/// description) would otherwise have every listing announce a change, and a gateway's
/// clients, told, list again: a storm. A change within it is announced at its end.
const TOOLS_CHANGED_GAP: Duration = Duration::from_secs(1);
use cache::{CacheStats, ListCache, Page};

/// Something an embedder may want to hear about.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum HarnessEvent {
    /// A server's tool schemas changed (the hash of its full tool list, in one cache
    /// scope, differs from the last one seen in that scope).
    ToolsChanged {
        /// Server id.
        server: String,
        /// The new hash.
        hash: String,
    },
    /// A server said some of its lists changed (`notifications/*/list_changed`);
    /// announced once the cache has dropped them, so a listing on hearing it reads
    /// them again (or after 30 s, logged, if the cache could not).
    ListsChanged {
        /// Server id.
        server: String,
        /// Its tool list.
        tools: bool,
        /// Its prompt list.
        prompts: bool,
        /// Its resource list.
        resources: bool,
    },
    /// A server joined the harness.
    ServerAdded {
        /// Server id.
        server: String,
    },
    /// A server left the harness.
    ServerRemoved {
        /// Server id.
        server: String,
    },
    /// Grants changed (`grant`, `revoke`, `replace_grants`): what these agents may
    /// list and call is not what it was.
    GrantsChanged {
        /// The agents whose grants changed.
        agents: Vec<String>,
    },
}

/// What the registry holds, shared by its actor (the writer) and every reader.
pub(crate) struct Registry {
    /// The list cache.
    pub cache: Arc<ListCache>,
    /// The shared layer (L3), when configured.
    pub shared: Option<Arc<SharedCache>>,
    /// The last tool-list hash per server and scope, with the walk that read it.
    hashes: Mutex<HashMap<(String, String), (u64, String)>>,
    /// Walks of tool lists begun, numbering them: a walk begun before one that already
    /// recorded its hash is older news.
    walks: std::sync::atomic::AtomicU64,
    /// Per server: its last `ToolsChanged`, and a newer hash held back until
    /// [`TOOLS_CHANGED_GAP`] has passed.
    announced: Mutex<HashMap<String, Announced>>,
    events: broadcast::Sender<HarnessEvent>,
}

impl Registry {
    /// A registry over `cache` (and `shared` behind it), announcing changes on `events`.
    pub fn new(
        cache: Arc<ListCache>,
        shared: Option<Arc<SharedCache>>,
        events: broadcast::Sender<HarnessEvent>,
    ) -> Registry {
        Registry {
            cache,
            shared,
            hashes: Mutex::new(HashMap::new()),
            walks: Default::default(),
            announced: Mutex::new(HashMap::new()),
            events,
        }
    }

    /// Subscribes to change events.
    pub fn subscribe(&self) -> broadcast::Receiver<HarnessEvent> {
        self.events.subscribe()
    }

    /// Counters of every layer.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            l3: self.shared.as_ref().map(|s| s.stats()).unwrap_or_default(),
            ..self.cache.stats()
        }
    }

    /// Tells subscribers of `event` (nobody listening is fine).
    pub fn announce(&self, event: HarnessEvent) {
        let _ = self.events.send(event);
    }

    /// The number of a tool-list walk beginning now.
    pub(crate) fn walk_begins(&self) -> u64 {
        self.walks
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// A full tool list of `server` was read in `scope` by walk `walk`, begun at the
    /// server's cache `epoch`: its hash is compared with the last one there, and a
    /// difference announced ([`HarnessEvent::ToolsChanged`]). Done by the walk's own
    /// task (nothing queues behind the cache's writer). Old news is dropped: a walk
    /// begun before the server's lists were dropped (its `list_changed`, a restart,
    /// its removal), or before a walk that recorded already.
    pub(crate) fn tools_listed(
        self: &Arc<Self>,
        server: &str,
        scope: String,
        pages: &[Arc<Value>],
        (epoch, walk): (u64, u64),
    ) {
        let hash = tools_hash(pages);
        let previous = {
            let mut hashes = self.hashes.lock();
            if self.cache.epoch(server) != epoch {
                return;
            }
            let key = (server.to_string(), scope);
            if hashes.get(&key).is_some_and(|(w, _)| *w > walk) {
                return;
            }
            if hashes.len() >= MAX_SCHEMA_HASHES
                && !hashes.contains_key(&key)
                && let Some(oldest) = oldest_private(&hashes)
            {
                // One per server and private scope: a flood of auth contexts lets the
                // oldest private one go per new one (its next listing has nothing to
                // differ from), never a server's public list's, which all share.
                hashes.remove(&oldest);
            }
            hashes.insert(key, (walk, hash.clone())).map(|(_, h)| h)
        };
        if previous.is_some_and(|p| p != hash) {
            self.tools_changed(server, hash);
        }
    }

    /// Announces `server`'s changed tool list, at most once per [`TOOLS_CHANGED_GAP`]:
    /// within it the hash is held, and announced (the newest held) at its end.
    fn tools_changed(self: &Arc<Self>, server: &str, hash: String) {
        let now = std::time::Instant::now();
        let mut announced = self.announced.lock();
        if let Some(a) = announced.get_mut(server)
            && now < a.at + TOOLS_CHANGED_GAP
        {
            if a.held.replace(hash).is_none() {
                let (due, timer) = (a.at + TOOLS_CHANGED_GAP, a.timer);
                let registry = Arc::downgrade(self);
                let server = server.to_string();
                tokio::spawn(async move {
                    tokio::time::sleep_until(due.into()).await;
                    if let Some(registry) = registry.upgrade() {
                        registry.release_held(&server, timer);
                    }
                });
            }
            return;
        }
        announced.insert(
            server.to_string(),
            Announced {
                at: now,
                held: None,
                timer: TIMERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            },
        );
        drop(announced);
        self.announce_tools_changed(server, hash);
    }

    /// Announces the hash held back for `server` by the timer `timer`, if it still is
    /// (not once the server was removed, or announced anew since). Even one equal to the
    /// last announced: a listing may have read another version meanwhile (in another
    /// scope, or served to a caller), whose readers must hear the list changed again.
    fn release_held(&self, server: &str, timer: u64) {
        let hash = {
            let mut announced = self.announced.lock();
            let Some(a) = announced.get_mut(server).filter(|a| a.timer == timer) else {
                return;
            };
            let Some(hash) = a.held.take() else {
                return;
            };
            a.at = std::time::Instant::now();
            hash
        };
        self.announce_tools_changed(server, hash);
    }

    fn announce_tools_changed(&self, server: &str, hash: String) {
        tracing::info!(server = %crate::util::text::one_line(server, 100), %hash, "tool schemas changed");
        let _ = self.events.send(HarnessEvent::ToolsChanged {
            server: server.to_string(),
            hash,
        });
    }

    fn forget(&self, server: &str) {
        self.hashes.lock().retain(|(s, _), _| s != server);
        self.announced.lock().remove(server);
    }
}

/// One server's last `ToolsChanged`.
struct Announced {
    /// When it went out.
    at: std::time::Instant,
    /// A newer hash, held until the gap after it has passed.
    held: Option<String>,
    /// The timer that releases what is held: a timer of an entry replaced since (the
    /// server removed and added again, or announced anew) releases nothing.
    timer: u64,
}

/// Numbers of [`Announced`] timers, unique in the process.
static TIMERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Messages of the registry actor.
pub(crate) enum RegistryMsg {
    /// Store the pages of one list (dropped when the server was invalidated since
    /// `epoch`).
    Put {
        /// The pages.
        pages: Vec<Page>,
        /// The server's cache epoch when the fetch started.
        epoch: u64,
        /// Counts it among the writes queued until it is dropped, handled or not.
        queued: QueuedPut,
    },
    /// Drop a server's entries (`list_changed`), then answer.
    Invalidate(String, RpcReplyPort<()>),
    /// Another process sharing L3 dropped a server's entries: drop ours, tell no one.
    /// The mark is when one was queued for the server (0: none), cleared when handled:
    /// a flood of invalidations heard from Redis queues one message per server (and
    /// one a second, should a queued one be lost with a dying actor).
    PeerChanged(String, Arc<std::sync::atomic::AtomicU64>),
    /// Remove the files of one list of a server in this process, dropped from memory
    /// already (its cursor was rejected: a shared server's cached cursor is never sent,
    /// so the others' lists are theirs).
    InvalidateList {
        /// Server id.
        server: String,
        /// The list method.
        method: String,
        /// The keys the disk index knew, each with whether it was dropped.
        known: Vec<(cache::CacheKey, bool)>,
    },
    /// Forget a removed server entirely (entries and hashes); answered once it is.
    Remove(String, RpcReplyPort<()>),
    /// Answers when every earlier message is handled (and so written to disk).
    Flush(RpcReplyPort<()>),
}

/// The cache's writer; see the module docs.
pub(crate) struct RegistryActor;

/// Runs `work` on a blocking thread (the cache writes files).
async fn blocking(registry: &Arc<Registry>, work: impl FnOnce(&Registry) + Send + 'static) {
    let registry = registry.clone();
    if tokio::task::spawn_blocking(move || work(&registry))
        .await
        .is_err()
    {
        tracing::error!("a cache write failed");
    }
}

impl Actor for RegistryActor {
    type Msg = RegistryMsg;
    type State = Arc<Registry>;
    type Arguments = Arc<Registry>;

    async fn pre_start(
        &self,
        _: ActorRef<RegistryMsg>,
        registry: Arc<Registry>,
    ) -> Result<Arc<Registry>, ActorProcessingErr> {
        Ok(registry)
    }

    async fn handle(
        &self,
        _: ActorRef<RegistryMsg>,
        msg: RegistryMsg,
        registry: &mut Arc<Registry>,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            RegistryMsg::Put {
                pages,
                epoch,
                queued,
            } => {
                blocking(registry, move |r| r.cache.put_disk(pages, epoch)).await;
                drop(queued);
            }
            RegistryMsg::Invalidate(server, reply) => {
                tracing::info!(server = %server, "server lists changed; cache entries dropped");
                blocking(registry, move |r| r.cache.invalidate(&server)).await;
                let _ = reply.send(());
            }
            RegistryMsg::PeerChanged(server, queued) => {
                // Cleared first: one heard while this runs queues another.
                queued.store(0, std::sync::atomic::Ordering::SeqCst);
                let id = server.clone();
                blocking(registry, move |r| r.cache.invalidate(&id)).await;
                registry.announce(HarnessEvent::ListsChanged {
                    server,
                    tools: true,
                    prompts: true,
                    resources: true,
                });
            }
            RegistryMsg::InvalidateList {
                server,
                method,
                known,
            } => {
                blocking(registry, move |r| {
                    r.cache.remove_list_files(&server, &method, &known)
                })
                .await;
            }
            RegistryMsg::Remove(server, reply) => {
                blocking(registry, move |r| {
                    r.cache.invalidate(&server);
                    r.cache.retire(&server);
                    r.forget(&server);
                })
                .await;
                let _ = reply.send(());
            }
            RegistryMsg::Flush(reply) => {
                let _ = reply.send(());
            }
        }
        Ok(())
    }
}

/// A typed handle on the registry actor (its address changes when it is rebuilt).
/// Writes are sent without waiting (one lost while the actor is rebuilt only costs a
/// cache miss), and so are the removals of a refused list's files (dropped from memory
/// already); a server's invalidation is asked, and waited for.
#[derive(Clone, Default)]
pub(crate) struct RegistryRef(
    pub(crate) ActorSlot<RegistryMsg>,
    Arc<AtomicUsize>,
    /// The bytes of the pages queued.
    Arc<AtomicUsize>,
);

/// How long an invalidation is waited for: behind the queued disk writes and the shared
/// layer's bounded tries.
const INVALIDATE_LIMIT: Duration = Duration::from_secs(30);

/// The most disk writes queued for the registry actor: a disk that stalls (a full or
/// hung mount) costs the disk layer those lists, not memory without bound.
const MAX_QUEUED_PUTS: usize = 256;

/// The most bytes of pages those writes hold: a list may be as large as
/// `max_list_bytes`, and 256 such lists far more than a disk layer's budget.
const MAX_QUEUED_PUT_BYTES: usize = 64 << 20;

/// One disk write counted as queued (it, and its bytes) until it is dropped.
pub(crate) struct QueuedPut(Arc<AtomicUsize>, Arc<AtomicUsize>, usize);

impl Drop for QueuedPut {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        self.1
            .fetch_sub(self.2, std::sync::atomic::Ordering::SeqCst);
    }
}

impl RegistryRef {
    /// Stores the pages of one list fetched at `epoch` on disk (memory is written by
    /// the listing itself, [`cache::ListCache::put_memory`]).
    /// Past [`MAX_QUEUED_PUTS`] waiting, or [`MAX_QUEUED_PUT_BYTES`] held in memory (a list alone
    /// larger than that is written when nothing else waits), the write is left out.
    pub fn put(&self, pages: Vec<Page>, epoch: u64) {
        use std::sync::atomic::Ordering;
        // Counted at what they hold in memory (an array of small numbers is many times
        // its text), as the memory layer counts them: a stalled disk holds them all.
        let bytes = pages
            .iter()
            .map(|p| p.bytes.max(cache::held_size(&p.value)))
            .fold(0usize, usize::saturating_add);
        let queued_before = self.2.fetch_add(bytes, Ordering::SeqCst);
        let over_bytes =
            queued_before > 0 && queued_before.saturating_add(bytes) > MAX_QUEUED_PUT_BYTES;
        if over_bytes || self.1.fetch_add(1, Ordering::SeqCst) >= MAX_QUEUED_PUTS {
            if !over_bytes {
                self.1.fetch_sub(1, Ordering::SeqCst);
            }
            self.2.fetch_sub(bytes, Ordering::SeqCst);
            tracing::debug!(
                "disk cache writes queued at their bound; this list is kept in memory only"
            );
            return;
        }
        let queued = QueuedPut(self.1.clone(), self.2.clone(), bytes);
        self.0.send(RegistryMsg::Put {
            pages,
            epoch,
            queued,
        });
    }

    /// Drops a server's entries here and on disk (the shared layer's generation is
    /// moved before, by the caller: not behind the disk writes queued here, which a
    /// stalled disk holds for good); returns when they are gone. Asked, not sent: one
    /// lost with a dying actor is asked again of the rebuilt one, as an invalidation
    /// lost would leave a changed list served until it expires. False when no actor
    /// answered in time.
    pub async fn invalidate(&self, server: &str) -> bool {
        self.0
            .ask(
                |reply| RegistryMsg::Invalidate(server.to_string(), reply),
                INVALIDATE_LIMIT,
            )
            .await
            .is_some()
    }

    /// Drops a server's entries because a peer said so (not published again), unless
    /// one is already queued: `queued` is the server's mark (see
    /// [`RegistryMsg::PeerChanged`]). Whether one was queued now.
    pub fn peer_changed(&self, server: &str, queued: &Arc<std::sync::atomic::AtomicU64>) -> bool {
        use std::sync::atomic::Ordering;
        // A monotonic clock of this process (a wall clock stepped back would hold the
        // mark longer); 0 means no mark, so it starts at 1.
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        let now = START
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_millis() as u64
            + 1;
        let mark = queued.load(Ordering::SeqCst);
        if mark != 0 && now.saturating_sub(mark) < 1000 {
            return false;
        }
        if queued
            .compare_exchange(mark, now, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return false;
        }
        if self
            .0
            .send(RegistryMsg::PeerChanged(server.to_string(), queued.clone()))
        {
            return true;
        }
        queued.store(0, Ordering::SeqCst);
        false
    }

    /// Drops one list of a server in this process: from memory now, its files in the
    /// writer's turn, before any written after (a listing that found its cursor
    /// rejected does not wait behind the queued disk writes, which a stalled disk holds
    /// for good). A message lost with a dying actor leaves the files, whose cursor a
    /// later run may find rejected in turn.
    pub fn invalidate_list(&self, cache: &cache::ListCache, server: &str, method: &str) {
        let known = cache.forget_list_in_memory(server, method);
        if cache.config().dir.is_some() {
            self.0.send(RegistryMsg::InvalidateList {
                server: server.to_string(),
                method: method.to_string(),
                known,
            });
        }
    }

    /// Forgets a removed server; returns when its entries are gone. Asked, not sent: a
    /// message sent while the actor is rebuilt is lost, and the removed server's
    /// entries would stay (an ask is put to the rebuilt actor).
    pub async fn remove(&self, server: &str) {
        self.0
            .ask(
                |reply| RegistryMsg::Remove(server.to_string(), reply),
                Duration::from_secs(30),
            )
            .await;
    }

    /// Returns when every earlier message is handled.
    pub async fn flush(&self) {
        self.0
            .ask(RegistryMsg::Flush, Duration::from_secs(30))
            .await;
    }
}

/// The entry to let go of a full table of tool-list hashes: the oldest of a private
/// scope (an auth context's), else the oldest.
fn oldest_private(hashes: &HashMap<(String, String), (u64, String)>) -> Option<(String, String)> {
    let shared = |scope: &str| scope == "public" || scope == "uncached";
    hashes
        .iter()
        .min_by_key(|((_, scope), (walk, _))| (shared(scope), *walk))
        .map(|(key, _)| key.clone())
}

/// The hash of a tool list: SHA-256 of each tool's canonical JSON, in sorted order and
/// each once. The order a server lists its tools in is not a change (a server listing
/// from a hash map, or from replicas, lists them in any order).
fn tools_hash(pages: &[Arc<Value>]) -> String {
    let mut tools: Vec<String> = pages
        .iter()
        .filter_map(|p| p.get("tools").and_then(Value::as_array))
        .flatten()
        .map(canonical_json)
        .collect();
    tools.sort_unstable();
    tools.dedup();
    let mut canonical = String::new();
    for t in &tools {
        canonical.push_str(t);
        canonical.push('\n');
    }
    sha256_hex(canonical.as_bytes())
}

/// JSON with object keys sorted at every depth: the same schema always hashes the same.
pub fn canonical_json(v: &Value) -> String {
    fn sorted(v: &Value) -> Value {
        match v {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                let mut out = serde_json::Map::new();
                for k in keys {
                    out.insert(k.clone(), sorted(&map[k]));
                }
                Value::Object(out)
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    sorted(v).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    /// Counts what reaches it and handles nothing else, each message only once let (a
    /// registry whose disk has stalled).
    struct Gate(Arc<tokio::sync::Semaphore>, Arc<AtomicUsize>);

    impl Gate {
        /// Counts every message as it comes (a registry busy elsewhere).
        fn open(count: Arc<AtomicUsize>) -> Gate {
            let all = tokio::sync::Semaphore::MAX_PERMITS;
            Gate(Arc::new(tokio::sync::Semaphore::new(all)), count)
        }
    }

    impl ractor::Actor for Gate {
        type Msg = RegistryMsg;
        type State = ();
        type Arguments = ();

        async fn pre_start(
            &self,
            _: ractor::ActorRef<Self::Msg>,
            _: (),
        ) -> Result<(), ractor::ActorProcessingErr> {
            Ok(())
        }

        async fn handle(
            &self,
            _: ractor::ActorRef<Self::Msg>,
            _: Self::Msg,
            _: &mut (),
        ) -> Result<(), ractor::ActorProcessingErr> {
            if let Ok(permit) = self.0.acquire().await {
                permit.forget();
            }
            self.1.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    /// A list of one page said to be `bytes` long.
    fn one_page(bytes: usize) -> Vec<Page> {
        vec![Page {
            key: cache::CacheKey {
                server: "s".into(),
                fingerprint: "f".into(),
                client: "c".into(),
                method: "tools/list".into(),
                param: None,
                scope: "public".into(),
            },
            ttl: Duration::from_secs(60),
            received_unix_ms: cache::now_ms(),
            value: Arc::new(serde_json::json!({"tools": []})),
            bytes,
            version: None,
        }]
    }

    // The queue is bounded by its pages' bytes too: lists as large as
    // `max_list_bytes` (32 MiB) would otherwise pin 256 of them. One list larger than
    // the bound is still written when nothing else waits.
    #[tokio::test]
    async fn disk_writes_queued_are_bounded_by_their_bytes() {
        let (gate, count) = (
            Arc::new(tokio::sync::Semaphore::new(0)),
            Arc::new(AtomicUsize::new(0)),
        );
        let (actor, handle) = ractor::Actor::spawn(None, Gate(gate.clone(), count.clone()), ())
            .await
            .expect("spawn");
        let registry = RegistryRef::default();
        registry.0.set(actor.clone());
        registry.put(one_page(MAX_QUEUED_PUT_BYTES + 1), 0);
        registry.put(one_page(40 << 20), 0);
        registry.put(one_page(12), 0);
        assert_eq!(
            registry.1.load(Ordering::SeqCst),
            1,
            "one alone past the bound"
        );
        gate.add_permits(usize::MAX >> 4);
        registry.flush().await;
        assert_eq!(
            registry.2.load(Ordering::SeqCst),
            0,
            "the bytes go with the writes"
        );
        // Counted at what a page holds in memory: 3 M small numbers are 6 MiB of text
        // and some 96 MiB parsed.
        gate.forget_permits(usize::MAX);
        registry.put(one_page(12), 0);
        let mut numbers = one_page(6 << 20);
        numbers[0].value = Arc::new(serde_json::json!({"tools": vec![0u8; 3 << 20]}));
        registry.put(numbers, 0);
        assert_eq!(registry.1.load(Ordering::SeqCst), 1, "held past the bound");
        gate.add_permits(usize::MAX >> 4);
        registry.flush().await;
        actor.stop(None);
        let _ = handle.await;
    }

    #[tokio::test]
    async fn disk_writes_queued_behind_a_stalled_disk_are_bounded() {
        let (gate, count) = (
            Arc::new(tokio::sync::Semaphore::new(0)),
            Arc::new(AtomicUsize::new(0)),
        );
        let (actor, handle) = ractor::Actor::spawn(None, Gate(gate.clone(), count.clone()), ())
            .await
            .expect("spawn");
        let registry = RegistryRef::default();
        registry.0.set(actor.clone());
        let page = || one_page(12);
        for _ in 0..1000 {
            registry.put(page(), 0);
        }
        assert_eq!(registry.1.load(Ordering::SeqCst), MAX_QUEUED_PUTS);
        gate.add_permits(usize::MAX >> 4);
        let drained = async {
            while count.load(Ordering::SeqCst) < MAX_QUEUED_PUTS {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), drained)
            .await
            .expect("the queued writes are handled");
        assert_eq!(count.load(Ordering::SeqCst), MAX_QUEUED_PUTS);
        assert_eq!(registry.1.load(Ordering::SeqCst), 0);
        // Room again once handled.
        registry.put(page(), 0);
        registry.flush().await;
        assert_eq!(count.load(Ordering::SeqCst), MAX_QUEUED_PUTS + 2);
        actor.stop(None);
        let _ = handle.await;
    }

    /// Pages of one tool list with these tools, in this order.
    fn tools(names: &[&str]) -> Vec<Arc<Value>> {
        let tools: Vec<Value> = names
            .iter()
            .map(|n| serde_json::json!({"name": n, "inputSchema": {"type": "object"}}))
            .collect();
        vec![Arc::new(serde_json::json!({ "tools": tools }))]
    }

    /// The `ToolsChanged` heard so far.
    fn heard(events: &mut broadcast::Receiver<HarnessEvent>) -> usize {
        std::iter::from_fn(|| events.try_recv().ok())
            .filter(|e| matches!(e, HarnessEvent::ToolsChanged { .. }))
            .count()
    }

    // A flood of private scopes (one per auth context) does not push a server's public
    // list's hash out: its next change would have had nothing to differ from, and gone
    // unannounced.
    #[tokio::test]
    async fn private_scopes_past_the_bound_leave_the_public_lists_hashes() {
        let cache = Arc::new(ListCache::new(cache::CacheConfig::default()).expect("cache"));
        let (tx, mut events) = broadcast::channel(64);
        let registry = Arc::new(Registry::new(cache.clone(), None, tx));
        let at = |server| (cache.walk_epoch(server), registry.walk_begins());
        registry.tools_listed("s", "public".into(), &tools(&["a"]), at("s"));
        for i in 0..MAX_SCHEMA_HASHES + 100 {
            registry.tools_listed("p", format!("ctx-{i}"), &tools(&["a"]), at("p"));
        }
        assert!(registry.hashes.lock().len() <= MAX_SCHEMA_HASHES);
        registry.tools_listed("s", "public".into(), &tools(&["b"]), at("s"));
        assert_eq!(heard(&mut events), 1);
        // The newest private ones stay: the oldest went first.
        let hashes = registry.hashes.lock();
        let newest = format!("ctx-{}", MAX_SCHEMA_HASHES + 99);
        assert!(hashes.contains_key(&("p".to_string(), newest)));
        assert!(!hashes.contains_key(&("p".to_string(), "ctx-0".to_string())));
    }

    #[tokio::test]
    async fn a_tool_list_change_is_announced_once_per_gap_and_old_news_is_not() {
        let cache = Arc::new(ListCache::new(cache::CacheConfig::default()).expect("cache"));
        let (tx, mut events) = broadcast::channel(64);
        let registry = Arc::new(Registry::new(cache.clone(), None, tx));
        let at = |walk| (cache.walk_epoch("s"), walk);
        let scope = || "public".to_string();
        registry.tools_listed(
            "s",
            scope(),
            &tools(&["a", "b"]),
            at(registry.walk_begins()),
        );
        // Listed in another order, or with a tool twice: not a change.
        registry.tools_listed(
            "s",
            scope(),
            &tools(&["b", "a", "a"]),
            at(registry.walk_begins()),
        );
        assert_eq!(heard(&mut events), 0);
        // A walk begun before the last recorded is old news, a change or not.
        let old = registry.walk_begins();
        registry.tools_listed(
            "s",
            scope(),
            &tools(&["a", "b"]),
            at(registry.walk_begins()),
        );
        registry.tools_listed("s", scope(), &tools(&["a"]), at(old));
        assert_eq!(heard(&mut events), 0);
        // So is one begun before the server's lists were dropped.
        let (epoch, walk) = at(registry.walk_begins());
        cache.invalidate("s");
        registry.tools_listed("s", scope(), &tools(&["a"]), (epoch, walk));
        assert_eq!(heard(&mut events), 0);
        // A change is announced at once; changes within the gap after it are held,
        // and the newest announced at its end.
        registry.tools_listed("s", scope(), &tools(&["c"]), at(registry.walk_begins()));
        assert_eq!(heard(&mut events), 1);
        for list in [["d"], ["c"], ["e"]] {
            registry.tools_listed("s", scope(), &tools(&list), at(registry.walk_begins()));
        }
        assert_eq!(heard(&mut events), 0);
        tokio::time::sleep(TOOLS_CHANGED_GAP + Duration::from_millis(200)).await;
        let last: Vec<HarnessEvent> = std::iter::from_fn(|| events.try_recv().ok()).collect();
        let expected = tools_hash(&tools(&["e"]));
        assert_eq!(
            last,
            vec![HarnessEvent::ToolsChanged {
                server: "s".into(),
                hash: expected
            }]
        );
        // A list that changed and changed back within the gap is announced again: the
        // version between may have been read.
        registry.tools_listed("s", scope(), &tools(&["x"]), at(registry.walk_begins()));
        registry.tools_listed("s", scope(), &tools(&["e"]), at(registry.walk_begins()));
        tokio::time::sleep(TOOLS_CHANGED_GAP + Duration::from_millis(200)).await;
        assert_eq!(heard(&mut events), 1, "changed back");
        // A removed server's held change is not announced.
        tokio::time::sleep(TOOLS_CHANGED_GAP).await;
        registry.tools_listed("s", scope(), &tools(&["f"]), at(registry.walk_begins()));
        registry.tools_listed("s", scope(), &tools(&["g"]), at(registry.walk_begins()));
        assert_eq!(heard(&mut events), 1);
        registry.forget("s");
        tokio::time::sleep(TOOLS_CHANGED_GAP * 2).await;
        assert_eq!(heard(&mut events), 0);
    }

    #[tokio::test]
    async fn a_flood_of_peer_invalidations_queues_one_per_server() {
        let count = Arc::new(AtomicUsize::new(0));
        let (actor, handle) = ractor::Actor::spawn(None, Gate::open(count.clone()), ())
            .await
            .expect("spawn");
        let registry = RegistryRef::default();
        registry.0.set(actor.clone());
        let (a, b) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let mut queued = 0;
        for _ in 0..10_000 {
            queued += usize::from(registry.peer_changed("a", &a));
            queued += usize::from(registry.peer_changed("b", &b));
        }
        assert_eq!(queued, 2, "said so once per server");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert_eq!(
            count.load(Ordering::SeqCst),
            2,
            "one per server while queued"
        );
        // No actor to take it: nothing stays marked.
        let none = RegistryRef::default();
        let c = Arc::new(AtomicU64::new(0));
        assert!(!none.peer_changed("c", &c));
        assert_eq!(c.load(Ordering::SeqCst), 0);
        actor.stop(None);
        let _ = handle.await;
    }
}
