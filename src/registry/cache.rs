//! The schema cache: list results (and `resources/read`) kept by the servers' own
//! `ttlMs` / `cacheScope` hints, in memory (L1) and on disk (L2, survives a restart).
//!
//! Key: server, method, the param that changes the result (`cursor`, `uri`), and scope:
//! `public`, or `private` plus a hash of the caller's auth context. A `private` result
//! with no context is used once and never stored; a `public` one is shared by everyone.
//! Freshness: the result's `ttlMs` when it has one (negative: 0), else the configured
//! default (legacy servers send no hints). Results of `input_required` and of MRTR
//! retries are never offered to the cache.
//!
//! Reads take a read lock on L1 (and on a miss, L2's in-memory index): they never wait
//! on an actor. Writes come from the `RegistryActor`, which serializes them and does
//! the disk I/O. L2 is one JSON file per entry under `DIR/SERVER/`, written to a temp
//! file and renamed, so a crash never leaves half an entry.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::protocol::{CacheHints, CacheScope};

/// Where a cached value is looked up.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CacheKey {
    /// Server id.
    pub server: String,
    /// The method, for example `tools/list`.
    pub method: String,
    /// The param that changes the result: a cursor (`""` is a cursor too) or a uri.
    pub param: Option<String>,
    /// `public`, or `private:<sha256 of the auth context>`.
    pub scope: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Entry {
    key: CacheKey,
    /// Shared, so that a hit costs a reference count, not a copy of the list.
    value: Arc<Value>,
    expires_unix_ms: u64,
    bytes: usize,
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
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
}

/// Hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(64);
    for b in Sha256::digest(bytes) {
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 15)] as char);
    }
    out
}

/// The scope part of a key: `public`, or `private:<hash of the context>`.
fn scope_key(scope: CacheScope, auth_context: Option<&str>) -> Option<String> {
    match (scope, auth_context) {
        (CacheScope::Public, _) => Some("public".into()),
        (CacheScope::Private, Some(ctx)) => Some(format!("private:{}", sha256_hex(ctx.as_bytes()))),
        (CacheScope::Private, None) => None,
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The cache; see the module docs.
pub struct SchemaCache {
    default_ttl: Duration,
    dir: Option<PathBuf>,
    l1: RwLock<HashMap<CacheKey, Entry>>,
    l2: RwLock<HashMap<CacheKey, Entry>>,
    l1_counts: Counters,
    l2_counts: Counters,
    /// Bumped on every invalidation of a server; a write from an older fetch is dropped.
    generations: RwLock<HashMap<String, u64>>,
}

impl SchemaCache {
    /// A cache with `default_ttl` for results without `ttlMs`, and an L2 directory (loaded
    /// now; entries that expired while the harness was down are skipped).
    pub fn new(default_ttl: Duration, dir: Option<PathBuf>) -> SchemaCache {
        let l2 = dir.as_deref().map(load_dir).unwrap_or_default();
        SchemaCache {
            default_ttl,
            dir,
            l1: RwLock::new(HashMap::new()),
            l2: RwLock::new(l2),
            l1_counts: Counters::default(),
            l2_counts: Counters::default(),
            generations: RwLock::new(HashMap::new()),
        }
    }

    /// The current invalidation generation of `server`.
    pub fn generation(&self, server: &str) -> u64 {
        self.generations.read().get(server).copied().unwrap_or(0)
    }

    /// A fresh cached result for this request as `auth_context` may see it: a `public`
    /// entry, or a `private` one of the same context.
    pub fn get(
        &self,
        server: &str,
        method: &str,
        param: Option<&str>,
        auth_context: Option<&str>,
    ) -> Option<Arc<Value>> {
        self.get_at(now_ms(), server, method, param, auth_context)
    }

    /// [`SchemaCache::get`] at a given time (unix milliseconds).
    pub fn get_at(
        &self,
        now: u64,
        server: &str,
        method: &str,
        param: Option<&str>,
        auth_context: Option<&str>,
    ) -> Option<Arc<Value>> {
        let keys: Vec<CacheKey> = [CacheScope::Public, CacheScope::Private]
            .into_iter()
            .filter_map(|s| scope_key(s, auth_context))
            .map(|scope| CacheKey {
                server: server.into(),
                method: method.into(),
                param: param.map(String::from),
                scope,
            })
            .collect();
        let fresh = |e: &Entry| e.expires_unix_ms > now;
        {
            let l1 = self.l1.read();
            if let Some(e) = keys.iter().filter_map(|k| l1.get(k)).find(|e| fresh(e)) {
                self.l1_counts.hits.fetch_add(1, Ordering::Relaxed);
                return Some(e.value.clone());
            }
        }
        self.l1_counts.misses.fetch_add(1, Ordering::Relaxed);
        // Without a disk layer there is nothing more to ask.
        self.dir.as_ref()?;
        let generation = self.generation(server);
        let found = {
            let l2 = self.l2.read();
            keys.iter()
                .filter_map(|k| l2.get(k))
                .find(|e| fresh(e))
                .cloned()
        };
        match found {
            Some(e) => {
                self.l2_counts.hits.fetch_add(1, Ordering::Relaxed);
                let value = e.value.clone();
                // Promoted only if no invalidation came between the read and now: the
                // L1 write lock is held while the generation is checked.
                let mut l1 = self.l1.write();
                if self.generation(server) == generation {
                    l1.insert(e.key.clone(), e);
                }
                Some(value)
            }
            None => {
                self.l2_counts.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Whether a result from this request would be stored, and under which key.
    pub fn key_for(
        &self,
        server: &str,
        method: &str,
        param: Option<&str>,
        auth_context: Option<&str>,
        result: &Value,
    ) -> Option<(CacheKey, Duration)> {
        let hints = CacheHints::of(result);
        let ttl = if result.get("ttlMs").is_some() {
            hints.ttl
        } else {
            self.default_ttl
        };
        if ttl.is_zero() {
            return None;
        }
        let scope = scope_key(hints.scope, auth_context)?;
        Some((
            CacheKey {
                server: server.into(),
                method: method.into(),
                param: param.map(String::from),
                scope,
            },
            ttl,
        ))
    }

    /// Stores a result fetched at `generation` (writer: the registry actor).
    pub(crate) fn put(&self, key: CacheKey, ttl: Duration, value: Value, generation: u64) {
        self.put_at(now_ms(), key, ttl, value, generation)
    }

    /// [`SchemaCache::put`] at a given time (unix milliseconds).
    pub(crate) fn put_at(
        &self,
        now: u64,
        key: CacheKey,
        ttl: Duration,
        value: Value,
        generation: u64,
    ) {
        if self.generation(&key.server) != generation {
            return; // invalidated while it was being fetched
        }
        let bytes = serde_json::to_vec(&value).map(|v| v.len()).unwrap_or(0);
        let entry = Entry {
            key: key.clone(),
            value: Arc::new(value),
            expires_unix_ms: now.saturating_add(ttl.as_millis() as u64),
            bytes,
        };
        if let Some(dir) = &self.dir {
            if let Err(e) = write_entry(dir, &entry) {
                tracing::warn!(server = %key.server, error = %e, "could not write the disk cache");
            }
            self.l2.write().insert(key.clone(), entry.clone());
        }
        self.l1.write().insert(key, entry);
    }

    /// Drops every entry of `server` from both layers (list_changed, removal).
    pub(crate) fn invalidate(&self, server: &str) {
        *self
            .generations
            .write()
            .entry(server.to_string())
            .or_default() += 1;
        self.l1.write().retain(|k, _| k.server != server);
        self.l2.write().retain(|k, _| k.server != server);
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir.join(server));
        }
    }

    /// Entry counts, sizes, hits and misses per layer.
    pub fn stats(&self) -> CacheStats {
        let layer = |map: &RwLock<HashMap<CacheKey, Entry>>, c: &Counters| {
            let m = map.read();
            LayerStats {
                entries: m.len(),
                bytes: m.values().map(|e| e.bytes).sum(),
                hits: c.hits.load(Ordering::Relaxed),
                misses: c.misses.load(Ordering::Relaxed),
            }
        };
        CacheStats {
            l1: layer(&self.l1, &self.l1_counts),
            l2: if self.dir.is_some() {
                layer(&self.l2, &self.l2_counts)
            } else {
                LayerStats::default()
            },
        }
    }
}

fn entry_path(dir: &Path, key: &CacheKey) -> PathBuf {
    let name = sha256_hex(serde_json::to_string(key).unwrap_or_default().as_bytes());
    dir.join(&key.server).join(format!("{name}.json"))
}

fn write_entry(dir: &Path, entry: &Entry) -> std::io::Result<()> {
    let path = entry_path(dir, &entry.key);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(entry)?)?;
    std::fs::rename(tmp, path)
}

fn load_dir(dir: &Path) -> HashMap<CacheKey, Entry> {
    let now = now_ms();
    let mut entries = HashMap::new();
    let Ok(servers) = std::fs::read_dir(dir) else {
        return entries;
    };
    for server in servers.flatten() {
        let Ok(files) = std::fs::read_dir(server.path()) else {
            continue;
        };
        for file in files.flatten() {
            let path = file.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            match std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<Entry>(&b).ok())
            {
                Some(e) if e.expires_unix_ms > now => {
                    entries.insert(e.key.clone(), e);
                }
                // Expired or unreadable: not worth keeping.
                _ => {
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn put(cache: &SchemaCache, ctx: Option<&str>, result: Value) -> bool {
        match cache.key_for("s", "tools/list", None, ctx, &result) {
            Some((key, ttl)) => {
                cache.put(key, ttl, result, cache.generation("s"));
                true
            }
            None => false,
        }
    }

    #[test]
    fn private_entries_stay_within_their_auth_context() {
        let cache = SchemaCache::new(Duration::from_secs(60), None);
        assert!(put(
            &cache,
            Some("alice"),
            json!({"tools": ["a"], "ttlMs": 60000, "cacheScope": "private"})
        ));
        assert!(cache.get("s", "tools/list", None, Some("alice")).is_some());
        assert!(cache.get("s", "tools/list", None, Some("bob")).is_none());
        assert!(cache.get("s", "tools/list", None, None).is_none());
    }

    #[test]
    fn private_results_without_a_context_are_not_stored_and_public_ones_are_shared() {
        let cache = SchemaCache::new(Duration::from_secs(60), None);
        assert!(!put(&cache, None, json!({"tools": [], "ttlMs": 60000})));
        assert!(put(
            &cache,
            None,
            json!({"tools": [], "ttlMs": 60000, "cacheScope": "public"})
        ));
        assert!(cache.get("s", "tools/list", None, Some("anyone")).is_some());
        assert!(cache.get("s", "tools/list", None, None).is_some());
    }

    #[test]
    fn ttl_comes_from_the_server_else_the_default_and_zero_is_not_stored() {
        let cache = SchemaCache::new(Duration::from_secs(60), None);
        assert!(!put(
            &cache,
            None,
            json!({"ttlMs": 0, "cacheScope": "public"})
        ));
        assert!(!put(
            &cache,
            None,
            json!({"ttlMs": -5, "cacheScope": "public"})
        ));
        let (_, ttl) = cache
            .key_for("s", "m", None, Some("c"), &json!({}))
            .expect("default ttl applies");
        assert_eq!(ttl, Duration::from_secs(60));
    }

    #[test]
    fn invalidation_drops_entries_and_late_writes_of_older_fetches() {
        let cache = SchemaCache::new(Duration::from_secs(60), None);
        let result = json!({"ttlMs": 60000, "cacheScope": "public"});
        let (key, ttl) = cache
            .key_for("s", "tools/list", None, None, &result)
            .expect("cacheable");
        let generation = cache.generation("s");
        cache.invalidate("s");
        cache.put(key, ttl, result, generation);
        assert!(cache.get("s", "tools/list", None, None).is_none());
    }

    #[test]
    fn the_disk_layer_survives_a_new_cache() {
        let dir =
            std::env::temp_dir().join(format!("mcp-harness-cache-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        {
            let cache = SchemaCache::new(Duration::from_secs(60), Some(dir.clone()));
            assert!(put(
                &cache,
                None,
                json!({"tools": ["x"], "ttlMs": 60000, "cacheScope": "public"})
            ));
        }
        let cache = SchemaCache::new(Duration::from_secs(60), Some(dir.clone()));
        assert_eq!(
            cache.get("s", "tools/list", None, None).expect("from disk")["tools"][0],
            "x"
        );
        let stats = cache.stats();
        assert_eq!((stats.l1.misses, stats.l2.hits), (1, 1));
        let _ = std::fs::remove_dir_all(&dir);
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        #[derive(Clone, Debug)]
        enum Op {
            Put {
                ctx: Option<u8>,
                public: bool,
                ttl_s: u8,
                id: u32,
            },
            Get {
                ctx: Option<u8>,
            },
            Wait {
                ms: u16,
            },
            Invalidate,
        }

        fn op() -> impl Strategy<Value = Op> {
            let ctx = proptest::option::of(0u8..3);
            prop_oneof![
                (ctx.clone(), any::<bool>(), 0u8..4, any::<u32>()).prop_map(
                    |(ctx, public, ttl_s, id)| Op::Put {
                        ctx,
                        public,
                        ttl_s,
                        id
                    }
                ),
                ctx.prop_map(|ctx| Op::Get { ctx }),
                (0u16..3000).prop_map(|ms| Op::Wait { ms }),
                Just(Op::Invalidate),
            ]
        }

        proptest! {
            /// A private entry is never served to another auth context, an expired entry
            /// is never served as fresh, and an invalidated one is never served at all.
            #[test]
            fn isolation_and_freshness_hold_for_any_sequence(ops in proptest::collection::vec(op(), 1..60)) {
                let cache = SchemaCache::new(Duration::from_secs(60), None);
                let mut now = 1_000_000u64;
                // What was put: id -> (scope ctx (None = public), expires, epoch).
                let mut puts: HashMap<u32, (Option<Option<u8>>, u64, u32)> = HashMap::new();
                let mut epoch = 0u32;
                for op in ops {
                    match op {
                        Op::Put { ctx, public, ttl_s, id } => {
                            let result = json!({"id": id, "ttlMs": u64::from(ttl_s) * 1000, "cacheScope": if public { "public" } else { "private" }});
                            let context = ctx.map(|c| format!("ctx{c}"));
                            if let Some((key, ttl)) = cache.key_for("s", "tools/list", None, context.as_deref(), &result) {
                                cache.put_at(now, key, ttl, result, cache.generation("s"));
                                let scope = if public { None } else { Some(ctx) };
                                puts.insert(id, (scope, now + u64::from(ttl_s) * 1000, epoch));
                            }
                        }
                        Op::Get { ctx } => {
                            let context = ctx.map(|c| format!("ctx{c}"));
                            if let Some(v) = cache.get_at(now, "s", "tools/list", None, context.as_deref()) {
                                let id = v["id"].as_u64().unwrap_or_default() as u32;
                                let (scope, expires, put_epoch) = puts[&id];
                                if let Some(owner) = scope {
                                    prop_assert!(owner.is_some() && owner == ctx, "private entry of {owner:?} served to {ctx:?}");
                                }
                                prop_assert!(now < expires, "expired entry served");
                                prop_assert_eq!(put_epoch, epoch, "invalidated entry served");
                            }
                        }
                        Op::Wait { ms } => now += u64::from(ms),
                        Op::Invalidate => {
                            cache.invalidate("s");
                            epoch += 1;
                        }
                    }
                }
            }
        }
    }
}
