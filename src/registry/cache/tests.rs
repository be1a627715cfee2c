use super::*;
use serde_json::json;

const LIST: ListOf<'static> = ListOf {
    server: "s",
    fingerprint: "fp1",
    client: "c1",
    method: "tools/list",
    server_ref: None,
};

fn config(dir: Option<PathBuf>) -> CacheConfig {
    CacheConfig {
        dir,
        default_ttl: Duration::from_secs(60),
        ..CacheConfig::default()
    }
}

fn page(cache: &ListCache, list: ListOf<'_>, ctx: Option<&str>, result: Value) -> Option<Page> {
    page_at(cache, list, None, ctx, result)
}

/// The page `result` of `list` at `cursor`, as a fetch would store it.
fn page_at(
    cache: &ListCache,
    list: ListOf<'_>,
    cursor: Option<&str>,
    ctx: Option<&str>,
    result: Value,
) -> Option<Page> {
    let (key, ttl) = cache.key_for(list, cursor, ctx, &result)?;
    Some(Page {
        key,
        ttl,
        received_unix_ms: now_ms(),
        bytes: json_size(&result),
        value: Arc::new(result),
        version: None,
    })
}

fn put(cache: &ListCache, ctx: Option<&str>, result: Value) -> bool {
    match page(cache, LIST, ctx, result) {
        Some(p) => {
            cache.put(vec![p], cache.epoch("s"));
            true
        }
        None => false,
    }
}

fn temp_dir(tag: &str) -> crate::util::scratch::Scratch {
    crate::util::scratch::Scratch::new(&format!("cache-{tag}"))
}

#[test]
fn private_entries_stay_within_their_auth_context() {
    let cache = ListCache::new(config(None)).expect("valid");
    assert!(put(
        &cache,
        Some("alice"),
        json!({"tools": ["a"], "ttlMs": 60000, "cacheScope": "private"})
    ));
    assert!(cache.get(LIST, None, Some("alice")).is_some());
    assert!(cache.get(LIST, None, Some("bob")).is_none());
    assert!(cache.get(LIST, None, None).is_none());
    // Lookups go by reference and remember each context's scope: asked again, and past
    // the memo's bound (it starts over), each context still finds only its own entries.
    assert!(cache.get(LIST, None, Some("alice")).is_some());
    for i in 0..PRIVATE_SCOPES_MAX + 10 {
        assert!(cache.get(LIST, None, Some(&format!("other{i}"))).is_none());
    }
    assert!(cache.private_scopes.read().len() <= PRIVATE_SCOPES_MAX);
    assert!(cache.get(LIST, None, Some("alice")).is_some());
    assert!(cache.get(LIST, None, Some("other3")).is_none());
    // A cursor is part of the key: the first page's entry is not another page's.
    assert!(cache.get(LIST, Some(""), Some("alice")).is_none());
    // An owned key and its reference hash alike.
    let (key, _) = cache
        .key_for(
            LIST,
            Some("c"),
            Some("alice"),
            &json!({"cacheScope": "private"}),
        )
        .expect("stored");
    use std::hash::BuildHasher;
    let state = std::collections::hash_map::RandomState::new();
    let by_reference: &dyn AsKeyRef = &key.key_ref();
    assert_eq!(state.hash_one(&key), state.hash_one(by_reference));
}

#[test]
fn private_results_without_a_context_are_not_stored_and_public_ones_are_shared() {
    let cache = ListCache::new(config(None)).expect("valid");
    assert!(!put(&cache, None, json!({"tools": [], "ttlMs": 60000})));
    assert!(put(
        &cache,
        None,
        json!({"tools": [], "ttlMs": 60000, "cacheScope": "public"})
    ));
    assert!(cache.get(LIST, None, Some("anyone")).is_some());
    assert!(cache.get(LIST, None, None).is_some());
}

#[test]
fn ttl_comes_from_the_server_else_the_default_and_zero_is_not_stored() {
    let cache = ListCache::new(config(None)).expect("valid");
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
        .key_for(LIST, None, Some("c"), &json!({}))
        .expect("default ttl applies");
    assert_eq!(ttl, Duration::from_secs(60));
}

#[test]
fn a_servers_ttl_is_capped_at_max_ttl() {
    let cache = ListCache::new(CacheConfig {
        max_ttl: Duration::from_secs(3600),
        ..config(None)
    })
    .expect("valid");
    // A hostile server asks for a year.
    let (_, ttl) = cache
        .key_for(
            LIST,
            None,
            None,
            &json!({"ttlMs": 365u64 * 86_400_000, "cacheScope": "public"}),
        )
        .expect("cacheable");
    assert_eq!(ttl, Duration::from_secs(3600));
    let p = page(
        &cache,
        LIST,
        None,
        json!({"ttlMs": 1e15, "cacheScope": "public"}),
    )
    .expect("cacheable");
    let now = now_ms();
    cache.put_at(now, vec![p], 0);
    assert!(cache.get_at(now + 3_599_000, LIST, None, None).is_some());
    assert!(
        cache.get_at(now + 3_601_000, LIST, None, None).is_none(),
        "expired at the cap"
    );
}

#[test]
fn a_server_changed_under_the_same_id_never_serves_its_old_entries() {
    let cache = ListCache::new(config(None)).expect("valid");
    assert!(put(
        &cache,
        None,
        json!({"tools": ["old"], "ttlMs": 60000, "cacheScope": "public"})
    ));
    let changed = ListOf {
        fingerprint: "fp2",
        ..LIST
    };
    assert!(cache.get(changed, None, None).is_none());
    assert!(cache.get(LIST, None, None).is_some());
}

#[test]
fn invalidation_drops_entries_and_late_writes_of_older_fetches() {
    let cache = ListCache::new(config(None)).expect("valid");
    let p = page(
        &cache,
        LIST,
        None,
        json!({"ttlMs": 60000, "cacheScope": "public"}),
    )
    .expect("cacheable");
    let epoch = cache.epoch("s");
    cache.invalidate("s");
    cache.put(vec![p], epoch);
    assert!(cache.get(LIST, None, None).is_none());
}

// Ids come and go (an embedder adding servers per session): their epochs do not stay,
// a fetch begun before a server's removal stores nothing (under that id later too),
// and the other servers' fetches are not touched.
#[test]
fn a_removed_servers_epoch_is_let_go_and_its_fetches_in_flight_store_nothing() {
    let cache = ListCache::new(config(None)).expect("valid");
    let other = ListOf {
        server: "t",
        ..LIST
    };
    let page_of = |list| {
        page(
            &cache,
            list,
            None,
            json!({"ttlMs": 60000, "cacheScope": "public"}),
        )
        .expect("cacheable")
    };
    let (p, q) = (page_of(LIST), page_of(other));
    let begun = cache.walk_epoch("s");
    assert_ne!(begun, 0, "a walk holds an epoch given out");
    let other_begun = cache.walk_epoch("t");
    cache.retire("s");
    // "s" is back (another server under its id) before the old fetch stores.
    cache.put(vec![p.clone()], begun);
    assert!(cache.get(LIST, None, None).is_none(), "a fetch from before");
    cache.put(vec![q], other_begun);
    assert!(
        cache.get(other, None, None).is_some(),
        "another server's, stored"
    );
    // Many removals later, "s"'s epoch is let go: still no fetch from before stores.
    for i in 0..2 * RETIRED_KEPT {
        let id = format!("sess-{i}");
        cache.walk_epoch(&id);
        cache.retire(&id);
    }
    assert!(cache.epochs.read().by_server.len() <= RETIRED_KEPT + 1);
    cache.put(vec![p.clone()], begun);
    assert!(cache.get(LIST, None, None).is_none(), "a fetch from before");
    cache.put(vec![p], cache.walk_epoch("s"));
    assert!(cache.get(LIST, None, None).is_some(), "stored at its epoch");
}

#[test]
fn entries_forgotten_in_memory_are_not_served_from_memory_or_disk_before_the_files_go() {
    let dir = temp_dir("forget");
    let cache = ListCache::new(config(Some(dir.to_path_buf()))).expect("valid");
    assert!(put(
        &cache,
        None,
        json!({"tools": ["old"], "ttlMs": 60000, "cacheScope": "public"})
    ));
    let epoch = cache.epoch("s");
    cache.forget_in_memory("s");
    assert!(
        cache.get(LIST, None, None).is_none(),
        "neither layer serves it"
    );
    // A write of a list fetched before is late, as after a full invalidation.
    let p = page(
        &cache,
        LIST,
        None,
        json!({"tools": ["old"], "ttlMs": 60000, "cacheScope": "public"}),
    )
    .expect("cacheable");
    cache.put(vec![p], epoch);
    assert!(cache.get(LIST, None, None).is_none());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A cache with a disk layer, holding one public page of a 1 s ttl that arrived now
/// (`t`, returned), stored in memory `in_memory` ms later and on disk `on_disk` ms
/// later.
fn one_page_arrived_now(
    tag: &str,
    in_memory: u64,
    on_disk: u64,
) -> (crate::util::scratch::Scratch, ListCache, u64) {
    let dir = temp_dir(tag);
    let cache = ListCache::new(config(Some(dir.to_path_buf()))).expect("valid");
    let mut p = page(
        &cache,
        LIST,
        None,
        json!({"tools": ["x"], "ttlMs": 1000, "cacheScope": "public"}),
    )
    .expect("cacheable");
    let t = now_ms();
    p.received_unix_ms = t;
    let epoch = cache.epoch("s");
    cache.put_memory_at(t + in_memory, std::slice::from_ref(&p), epoch);
    cache.put_disk_at(t + on_disk, vec![p], epoch);
    (dir, cache, t)
}

// A page is fresh for its ttl from when it arrived: not from when the walk ended and
// memory took it, nor from when a disk write queued behind others stored it (memory's
// copy expiring would then have been served again from disk).
#[test]
fn a_page_is_fresh_for_its_ttl_from_when_it_arrived_in_every_layer() {
    let (_dir, cache, t) = one_page_arrived_now("arrived", 500, 5000);
    assert!(cache.get_at(t + 900, LIST, None, None).is_some());
    assert!(
        cache.get_at(t + 1100, LIST, None, None).is_none(),
        "served past its ttl: {:?}",
        cache.stats()
    );
}

// A page expired before it is stored (a `ttlMs` shorter than its walk) is stored in
// neither layer, and pushes out no live entry to make room. Before, it was stored
// dead, after dropping the entries that expired soonest.
#[test]
fn a_list_expired_before_it_is_stored_pushes_out_nothing() {
    let dir = temp_dir("expired-before");
    let live = json!({"tools": ["live"], "ttlMs": 60_000, "cacheScope": "public"});
    let cache = ListCache::new(CacheConfig {
        max_bytes: 2 * (json_size(&live) + 1024),
        ..config(Some(dir.to_path_buf()))
    })
    .expect("valid");
    let other = ListOf {
        server: "o",
        ..LIST
    };
    let kept = page(&cache, other, None, live).expect("cacheable");
    let t = now_ms();
    cache.put_memory_at(t, std::slice::from_ref(&kept), cache.epoch("o"));
    cache.put_disk_at(t, vec![kept], cache.epoch("o"));
    let mut dead = page(
        &cache,
        LIST,
        None,
        json!({"tools": ["x".repeat(1024)], "ttlMs": 1, "cacheScope": "public"}),
    )
    .expect("cacheable");
    dead.received_unix_ms = t;
    let epoch = cache.epoch("s");
    cache.put_memory_at(t + 5, std::slice::from_ref(&dead), epoch);
    cache.put_disk_at(t + 5, vec![dead], epoch);
    assert!(
        cache.get_at(t + 5, other, None, None).is_some(),
        "the live list stays"
    );
    assert_eq!(cache.stats().l1.entries, 1, "{:?}", cache.stats());
    assert_eq!(cache.stats().l2.entries, 1, "{:?}", cache.stats());
    // A list whose later page lives shorter than its walk keeps its first page, as
    // pages carry their own ttls: the later one is read again with the cached cursor.
    let first =
        json!({"tools": ["a"], "nextCursor": "c2", "ttlMs": 60_000, "cacheScope": "public"});
    let second = json!({"tools": ["b"], "ttlMs": 1, "cacheScope": "public"});
    let mut pages = vec![
        page(&cache, LIST, None, first).expect("cacheable"),
        page_at(&cache, LIST, Some("c2"), None, second).expect("cacheable"),
    ];
    for p in &mut pages {
        p.received_unix_ms = t;
    }
    cache.put_memory_at(t + 5, &pages, epoch);
    assert!(
        cache.get_at(t + 5, LIST, None, None).is_some(),
        "the first page is kept"
    );
    assert!(cache.get_at(t + 5, LIST, Some("c2"), None).is_none());
}

// A clock stepped back after a page was stored does not keep it past its ttl by the
// step: a page with more left than its ttl is read again.
#[test]
fn a_clock_stepped_back_does_not_stretch_a_pages_ttl() {
    let (_dir, cache, t) = one_page_arrived_now("stepped-back", 0, 0);
    assert!(cache.get_at(t + 500, LIST, None, None).is_some());
    assert!(
        cache.get_at(t - 60_000, LIST, None, None).is_none(),
        "a minute back, it would have been fresh for a minute more"
    );
}

#[test]
fn the_disk_layer_survives_a_new_cache() {
    let dir = temp_dir("survive");
    {
        let cache = ListCache::new(config(Some(dir.to_path_buf()))).expect("valid");
        assert!(put(
            &cache,
            None,
            json!({"tools": ["x"], "ttlMs": 60000, "cacheScope": "public"})
        ));
    }
    let cache = ListCache::new(config(Some(dir.to_path_buf()))).expect("valid");
    assert_eq!(
        cache.get(LIST, None, None).expect("from disk").value["tools"][0],
        "x"
    );
    let stats = cache.stats();
    assert_eq!((stats.l1.misses, stats.l2.hits), (1, 1));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A server speaking `0` (or not connected: `None`).
struct Speaking(Option<&'static str>);

impl Speaks for Speaking {
    fn protocol_version(&self) -> Option<String> {
        self.0.map(String::from)
    }
}

// Another run's page read in one protocol version is not served once the server speaks
// another (an upgrade between runs): before it has connected it is, from the disk, and
// kept in memory only once the version is known to be the same.
#[test]
fn a_disk_page_of_another_protocol_version_is_not_served_once_the_server_speaks_another() {
    static BEFORE: Speaking = Speaking(None);
    static OLDER: Speaking = Speaking(Some("2025-06-18"));
    static NEWER: Speaking = Speaking(Some("2025-11-25"));
    let speaking = |s: &'static Speaking| ListOf {
        server_ref: Some(s),
        ..LIST
    };
    let dir = temp_dir("version");
    {
        let cache = ListCache::new(config(Some(dir.to_path_buf()))).expect("valid");
        let result = json!({"tools": ["x"], "ttlMs": 60000, "cacheScope": "public"});
        let mut p = page(&cache, LIST, None, result).expect("cacheable");
        p.version = Some("2025-06-18".into());
        cache.put(vec![p], cache.epoch("s"));
    }
    let cache = ListCache::new(config(Some(dir.to_path_buf()))).expect("valid");
    assert!(
        cache.get(speaking(&NEWER), None, None).is_none(),
        "another version"
    );
    assert!(
        cache.get(speaking(&BEFORE), None, None).is_some(),
        "not connected yet"
    );
    assert_eq!(
        cache.stats().l1.entries,
        0,
        "not kept in memory while unknown"
    );
    assert!(cache.get(speaking(&NEWER), None, None).is_none());
    assert!(
        cache.get(speaking(&OLDER), None, None).is_some(),
        "the same version"
    );
    assert_eq!(cache.stats().l1.entries, 1, "kept in memory once known");
    let _ = std::fs::remove_dir_all(&dir);
}

// A refused list goes from memory at once, and its files when the registry's writer
// gets to them (a listing does not wait behind its queued disk writes); until then the
// files are not read back.
#[test]
fn a_refused_list_is_gone_from_memory_before_its_files_are_removed() {
    let dir = temp_dir("refused-now");
    let cache = ListCache::new(config(Some(dir.to_path_buf()))).expect("valid");
    let result = json!({"items": ["a"], "ttlMs": 60000, "cacheScope": "public"});
    let p = page(&cache, LIST, None, result).expect("cacheable");
    cache.put(vec![p], cache.epoch(LIST.server));
    let files = || {
        std::fs::read_dir(dir.join("s"))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    assert_eq!(files(), 1);
    let known = cache.forget_list_in_memory("s", "tools/list");
    assert!(cache.get(LIST, None, None).is_none(), "gone at once");
    assert_eq!(files(), 1, "its file waits for the writer");
    cache.remove_list_files("s", "tools/list", &known);
    assert_eq!(files(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_rejected_cursor_drops_only_that_list_of_that_server_from_disk() {
    let dir = temp_dir("reject");
    let lists = [
        LIST,
        ListOf {
            method: "prompts/list",
            ..LIST
        },
        ListOf {
            server: "t",
            ..LIST
        },
    ];
    {
        let cache = ListCache::new(config(Some(dir.to_path_buf()))).expect("valid");
        for list in lists {
            let result = json!({"items": [list.method], "ttlMs": 60000, "cacheScope": "public"});
            let p = page(&cache, list, None, result).expect("cacheable");
            cache.put(vec![p], cache.epoch(list.server));
        }
        // A file another process wrote (this one's index does not know it): read to
        // find its key.
        let other = ListCache::new(config(Some(dir.to_path_buf()))).expect("valid");
        let result = json!({"items": ["other"], "ttlMs": 60000, "cacheScope": "public"});
        let p = page_at(&other, LIST, Some("c2"), None, result).expect("cacheable");
        other.put(vec![p], other.epoch("s"));
        disk::FILES_READ.with(|n| n.set(0));
        cache.invalidate_list("s", "tools/list");
        // The files the index knows are removed unread (before, each of the server's
        // files was read at every refused cursor), the unknown one read once, other
        // servers' not at all.
        assert_eq!(disk::FILES_READ.with(|n| n.get()), 1);
    }
    assert_eq!(
        std::fs::read_dir(dir.join("s"))
            .map(|d| d.count())
            .unwrap_or(0),
        1,
        "only the prompts list's file is left of s"
    );
    let cache = ListCache::new(config(Some(dir.to_path_buf()))).expect("valid");
    let held: Vec<bool> = lists
        .iter()
        .map(|list| cache.get(*list, None, None).is_some())
        .collect();
    assert_eq!(held, [false, true, true]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn disk_files_are_private_and_used_only_under_the_hash_of_their_key() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_dir("trust");
    {
        let cache = ListCache::new(config(Some(dir.to_path_buf()))).expect("valid");
        assert!(put(
            &cache,
            None,
            json!({"tools": ["real"], "ttlMs": 60000, "cacheScope": "public"})
        ));
    }
    let mode =
        |p: &std::path::Path| std::fs::metadata(p).expect("exists").permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join("s")), 0o700);
    let files: Vec<PathBuf> = std::fs::read_dir(dir.join("s"))
        .expect("server dir")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(files.len(), 1);
    assert_eq!(mode(&files[0]), 0o600);
    // Someone plants an entry for another key under a name that is not its hash, and
    // one filed under the wrong server's directory.
    let mut planted: Value =
        serde_json::from_slice(&std::fs::read(&files[0]).expect("read")).expect("json");
    planted["value"]["tools"][0] = json!("planted");
    planted["key"]["param"] = json!("cursor-x");
    let planted_at = dir.join("s").join(format!("{}.json", "0".repeat(64)));
    std::fs::write(&planted_at, planted.to_string()).expect("plant");
    // Under a name the cache never makes: not its file, so neither read nor removed.
    std::fs::write(dir.join("s").join("0000.json"), planted.to_string()).expect("plant");
    std::fs::create_dir_all(dir.join("other")).expect("dir");
    std::fs::copy(
        &files[0],
        dir.join("other").join(files[0].file_name().expect("name")),
    )
    .expect("copy");
    let cache = ListCache::new(config(Some(dir.to_path_buf()))).expect("valid");
    assert_eq!(
        cache.stats().l2.entries,
        1,
        "only the genuine entry is loaded"
    );
    assert!(cache.get(LIST, Some("cursor-x"), None).is_none());
    assert!(!planted_at.exists(), "the planted file is removed");
    assert!(dir.join("s").join("0000.json").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn links_pipes_and_huge_files_in_the_disk_layer_are_skipped_not_followed_or_removed() {
    let dir = temp_dir("links");
    {
        let cache = ListCache::new(config(Some(dir.to_path_buf()))).expect("valid");
        assert!(put(
            &cache,
            None,
            json!({"tools": ["real"], "ttlMs": 60000, "cacheScope": "public"})
        ));
    }
    // Another server's directory is a link to files of the user's that are not cache
    // entries; a pipe and a file past the read bound sit beside the real entry.
    let elsewhere = temp_dir("links-target");
    std::fs::create_dir_all(&*elsewhere).expect("target");
    let precious = elsewhere.join("settings.json");
    std::fs::write(&precious, "{\"not\": \"an entry\"}").expect("write");
    std::os::unix::fs::symlink(&*elsewhere, dir.join("other")).expect("link");
    let fifo = dir.join("s").join("fifo.json");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let huge = dir.join("s").join("huge.json");
    std::fs::File::create(&huge)
        .and_then(|f| f.set_len(65 << 20))
        .expect("sparse file");
    let cache = ListCache::new(config(Some(dir.to_path_buf()))).expect("valid");
    assert_eq!(cache.stats().l2.entries, 1, "the real entry only");
    assert!(precious.exists(), "nothing behind the link is removed");
    assert!(fifo.exists(), "a pipe is skipped, never opened for long");
    assert!(
        huge.exists(),
        "a file too large to read is skipped, not removed"
    );
    // Invalidating the linked server leaves the link and what it points to.
    cache.invalidate("other");
    assert!(precious.exists() && dir.join("other").exists());
    // Invalidating s removes its entries only: another program's files and folders in
    // a folder of the same name stay, and so does the folder.
    let theirs = dir.join("s").join("models");
    std::fs::create_dir_all(&theirs).expect("their folder");
    std::fs::write(theirs.join("weights.bin"), "w").expect("their file");
    cache.invalidate("s");
    let left: Vec<String> = std::fs::read_dir(dir.join("s"))
        .expect("s stays")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!left.iter().any(|n| super::disk::ours(n)), "{left:?}");
    assert!(fifo.exists() && huge.exists() && theirs.join("weights.bin").exists());
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&*elsewhere);
}

#[test]
fn a_loaded_entry_is_held_to_max_ttl_and_its_real_size() {
    let dir = temp_dir("forged");
    {
        let cache = ListCache::new(config(Some(dir.to_path_buf()))).expect("valid");
        assert!(put(
            &cache,
            None,
            json!({"tools": ["real"], "ttlMs": 60000, "cacheScope": "public"})
        ));
    }
    let file = std::fs::read_dir(dir.join("s"))
        .expect("dir")
        .flatten()
        .map(|e| e.path())
        .next()
        .expect("entry");
    let mut forged: Value =
        serde_json::from_slice(&std::fs::read(&file).expect("read")).expect("json");
    // Fresh for ever, and for longer than its ttl: held to max_ttl both ways.
    forged["expires_unix_ms"] = json!(u64::MAX);
    forged["ttl_ms"] = json!(u64::MAX);
    forged["bytes"] = json!(0);
    std::fs::write(&file, forged.to_string()).expect("write");
    let cache = ListCache::new(CacheConfig {
        max_ttl: Duration::from_secs(120),
        ..config(Some(dir.to_path_buf()))
    })
    .expect("valid");
    let hit = cache.get(LIST, None, None).expect("loaded");
    assert!(
        hit.remaining <= Duration::from_secs(120),
        "{:?}",
        hit.remaining
    );
    assert!(hit.bytes > 0, "its size is counted, not read");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn many_tiny_pages_are_counted_with_their_keys_against_the_budget() {
    let cache = ListCache::new(CacheConfig {
        max_bytes: 64 * 1024,
        ..config(None)
    })
    .expect("valid");
    // A server that names a new cursor on every page, each page 38 bytes of JSON.
    for i in 0..10_000u64 {
        let result = json!({"ttlMs": 60000, "cacheScope": "public"});
        let page = page_at(&cache, LIST, Some(&format!("c{i}")), None, result);
        cache.put_memory(&[page.expect("stored")], cache.epoch("s"));
    }
    let stats = cache.stats();
    // Counted by their pages alone, some 1,700 of them would fit.
    assert!(
        stats.l1.entries * 256 <= 64 * 1024,
        "{} entries",
        stats.l1.entries
    );
    assert!(stats.l1.entries >= 100, "the budget is used: {stats:?}");
    assert!(cache.get(LIST, Some("c9999"), None).is_some());
}

#[test]
fn each_layer_stays_within_its_byte_budget_dropping_what_expires_first() {
    let dir = temp_dir("budget");
    let cache = ListCache::new(CacheConfig {
        max_bytes: 8192,
        ..config(Some(dir.to_path_buf()))
    })
    .expect("valid");
    // A server that names a new cursor on every listing, or a caller per auth context:
    // keys without end. Pages of about 500 bytes of JSON, the later ones fresher.
    let filler = "x".repeat(450);
    for i in 0..100u64 {
        let result = json!({"tools": [filler], "ttlMs": 60000 + i * 1000, "cacheScope": "public"});
        let page = page_at(&cache, LIST, Some(&format!("c{i}")), None, result);
        cache.put(vec![page.expect("stored")], cache.epoch("s"));
    }
    let stats = cache.stats();
    assert!(
        stats.l1.bytes <= 8192 && stats.l2.bytes <= 8192,
        "{stats:?}"
    );
    // Each entry counts what it holds in memory, its key and a fixed overhead (about
    // 1,100 bytes here); a write that finds no room drops a quarter of the budget's
    // worth at once.
    assert!(stats.l1.entries >= 3, "the budget is used: {stats:?}");
    // The soonest to expire went; the latest stayed, in memory and on disk.
    assert!(cache.get(LIST, Some("c0"), None).is_none());
    assert!(cache.get(LIST, Some("c99"), None).is_some());
    let files = std::fs::read_dir(dir.join("s")).expect("dir").count();
    assert_eq!(
        files, stats.l2.entries,
        "evicted entries' files are removed"
    );
    // A page stored again under its own key replaces itself: nothing else goes.
    let again = json!({"tools": [filler], "ttlMs": 60000 + 99 * 1000, "cacheScope": "public"});
    let (key, ttl) = cache
        .key_for(LIST, Some("c99"), None, &again)
        .expect("stored");
    cache.put(
        vec![Page {
            key,
            ttl,
            received_unix_ms: now_ms(),
            bytes: json_size(&again),
            value: Arc::new(again),
            version: None,
        }],
        cache.epoch("s"),
    );
    assert_eq!(cache.stats().l1.entries, stats.l1.entries);
    assert_eq!(cache.stats().l2.entries, stats.l2.entries);
    // A page larger than the whole budget is not kept, and takes nothing's place.
    let big = json!({"tools": ["y".repeat(9000)], "ttlMs": 600000, "cacheScope": "public"});
    assert!(put(&cache, None, big));
    assert!(cache.get(LIST, None, None).is_none());
    assert!(cache.get(LIST, Some("c99"), None).is_some());
    assert_eq!(cache.stats().l1.entries, stats.l1.entries);
    // A new process with a smaller budget lets the files past it go.
    drop(cache);
    let smaller = ListCache::new(CacheConfig {
        max_bytes: 2048,
        ..config(Some(dir.to_path_buf()))
    })
    .expect("valid");
    assert!(smaller.stats().l2.bytes <= 2048);
    let files = std::fs::read_dir(dir.join("s")).expect("dir").count();
    assert_eq!(files, smaller.stats().l2.entries);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_restart_reads_only_the_newest_files_that_fit_its_budget() {
    let dir = temp_dir("load-budget");
    let cache = ListCache::new(config(Some(dir.to_path_buf()))).expect("valid");
    let filler = "x".repeat(1000);
    for i in 0..100u64 {
        let result = json!({"tools": [filler], "ttlMs": 600000, "cacheScope": "public"});
        let page = page_at(&cache, LIST, Some(&format!("c{i}")), None, result);
        cache.put(vec![page.expect("stored")], cache.epoch("s"));
    }
    drop(cache);
    // The page at c{i} written i seconds after the first.
    let base = std::time::SystemTime::now() - Duration::from_secs(3600);
    for file in std::fs::read_dir(dir.join("s")).expect("dir").flatten() {
        let entry: Value =
            serde_json::from_slice(&std::fs::read(file.path()).expect("read")).expect("an entry");
        let Some(i) = entry["key"]["param"]
            .as_str()
            .and_then(|c| c.strip_prefix('c'))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        let f = std::fs::File::options()
            .write(true)
            .open(file.path())
            .expect("open");
        f.set_modified(base + Duration::from_secs(i))
            .expect("mtime");
    }
    super::disk::FILES_READ.with(|n| n.set(0));
    let smaller = ListCache::new(CacheConfig {
        max_bytes: 16 << 10,
        ..config(Some(dir.to_path_buf()))
    })
    .expect("valid");
    let read = super::disk::FILES_READ.with(|n| n.get());
    let stats = smaller.stats();
    // About 1.3 KB each with its key and overhead: a dozen fit, and no more are read.
    assert!(stats.l2.entries >= 8, "{stats:?}");
    assert!(read <= 16, "{read} of 100 files read for a 16 KiB budget");
    assert!(
        smaller.get(LIST, Some("c99"), None).is_some(),
        "the newest stays"
    );
    assert!(smaller.get(LIST, Some("c0"), None).is_none());
    let files = std::fs::read_dir(dir.join("s")).expect("dir").count();
    assert_eq!(
        files, stats.l2.entries,
        "the files past the budget are removed"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cache_built_in_code_refuses_what_the_config_file_would() {
    let dir = temp_dir("unchecked");
    {
        let cache = ListCache::new(config(Some(dir.to_path_buf()))).expect("valid");
        assert!(put(
            &cache,
            None,
            json!({"tools": [], "ttlMs": 60000, "cacheScope": "public"})
        ));
    }
    let past = crate::util::duration::LONGEST + Duration::from_secs(1);
    let refused = |c: CacheConfig| ListCache::new(c).err().map(|e| e.0.field);
    let with_dir = || config(Some(dir.to_path_buf()));
    // A zero budget would have emptied the directory (every file past it).
    let zero = refused(CacheConfig {
        max_bytes: 0,
        ..with_dir()
    });
    assert_eq!(zero.as_deref(), Some("max_bytes"));
    assert_eq!(std::fs::read_dir(dir.join("s")).expect("dir").count(), 1);
    for (field, c) in [
        (
            "max_ttl",
            CacheConfig {
                max_ttl: Duration::ZERO,
                ..with_dir()
            },
        ),
        (
            "max_ttl",
            CacheConfig {
                max_ttl: Duration::MAX,
                ..with_dir()
            },
        ),
        (
            "default_ttl",
            CacheConfig {
                default_ttl: past,
                ..with_dir()
            },
        ),
        (
            "refresh_ahead",
            CacheConfig {
                refresh_ahead: past,
                ..with_dir()
            },
        ),
    ] {
        assert_eq!(refused(c).as_deref(), Some(field));
    }
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
            /// Write as a fetch that started this many invalidations ago.
            stale_by: u8,
        },
        Get {
            ctx: Option<u8>,
        },
        Wait {
            ms: u16,
        },
        Invalidate,
        /// A new process reads the disk layer.
        Reload,
    }

    fn op() -> impl Strategy<Value = Op> {
        let ctx = proptest::option::of(0u8..3);
        prop_oneof![
            (ctx.clone(), any::<bool>(), 0u8..4, any::<u32>(), 0u8..2).prop_map(
                |(ctx, public, ttl_s, id, stale_by)| Op::Put {
                    ctx,
                    public,
                    ttl_s,
                    id,
                    stale_by
                }
            ),
            ctx.prop_map(|ctx| Op::Get { ctx }),
            (0u16..3000).prop_map(|ms| Op::Wait { ms }),
            Just(Op::Invalidate),
            Just(Op::Reload),
        ]
    }

    /// What the model expects to be served to one context.
    #[derive(Clone, Copy, Debug)]
    struct Stored {
        id: u32,
        /// `None`: public.
        owner: Option<u8>,
        expires: u64,
    }

    proptest! {
        /// Against a model of what was stored: a private entry is never served to
        /// another auth context, an expired or invalidated entry never at all, a write
        /// from a fetch older than the last invalidation is dropped, and (liveness) a
        /// fresh entry the caller may see is served, from memory or from disk after a
        /// reload.
        #[test]
        fn isolation_freshness_and_liveness_hold_for_any_sequence(ops in proptest::collection::vec(op(), 1..60)) {
            let dir = temp_dir(&format!("prop-{}", std::thread::current().name().unwrap_or("t").replace(':', "_")));
            // The model's clock starts a year ahead, so that the disk layer (which reads
            // the wall clock) keeps what the model keeps; a loaded entry is held to
            // max_ttl from the wall clock's now, so max_ttl (ten years) reaches past it.
            let far = CacheConfig {
                max_ttl: crate::util::duration::LONGEST,
                ..config(Some(dir.to_path_buf()))
            };
            let mut cache = ListCache::new(far.clone()).expect("valid");
            let mut now = now_ms() + 365 * 24 * 3600 * 1000;
            // The model: the last valid write per scope (public, or private per context).
            let mut public: Option<Stored> = None;
            let mut private: HashMap<u8, Stored> = HashMap::new();
            for op in ops {
                match op {
                    Op::Put { ctx, public: is_public, ttl_s, id, stale_by } => {
                        let result = json!({"id": id, "ttlMs": u64::from(ttl_s) * 1000, "cacheScope": if is_public { "public" } else { "private" }});
                        let context = ctx.map(|c| format!("ctx{c}"));
                        let epoch = cache.epoch("s").saturating_sub(u64::from(stale_by));
                        let stale = epoch != cache.epoch("s");
                        if let Some((key, ttl)) = cache.key_for(LIST, None, context.as_deref(), &result) {
                            let bytes = json_size(&result);
                            cache.put_at(now, vec![Page { key, ttl, received_unix_ms: now, bytes, value: Arc::new(result), version: None }], epoch);
                            if !stale {
                                let stored = Stored { id, owner: if is_public { None } else { ctx }, expires: now + u64::from(ttl_s) * 1000 };
                                match stored.owner {
                                    None => public = Some(stored),
                                    Some(c) => { private.insert(c, stored); }
                                }
                            }
                        }
                    }
                    Op::Get { ctx } => {
                        let context = ctx.map(|c| format!("ctx{c}"));
                        let served = cache.get_at(now, LIST, None, context.as_deref()).map(|h| h.value["id"].as_u64().unwrap_or_default() as u32);
                        let visible: Vec<Stored> = public.iter().copied()
                            .chain(ctx.and_then(|c| private.get(&c).copied()))
                            .filter(|s| now < s.expires)
                            .collect();
                        match served {
                            Some(id) => prop_assert!(visible.iter().any(|s| s.id == id), "served {id}, model allows {visible:?}"),
                            None => prop_assert!(visible.is_empty(), "nothing served, but {visible:?} is fresh and visible"),
                        }
                    }
                    Op::Wait { ms } => now += u64::from(ms),
                    Op::Invalidate => {
                        cache.invalidate("s");
                        public = None;
                        private.clear();
                    }
                    Op::Reload => {
                        // The disk layer judges freshness by the wall clock; the model's
                        // clock starts in the far future, so entries stay comparable.
                        drop(cache);
                        cache = ListCache::new(far.clone()).expect("valid");
                    }
                }
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

#[test]
fn private_scopes_are_keyed_hashes_whose_key_is_kept_with_the_directory() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_dir("scope-key");
    let ctx = "alice-session";
    let plain = crate::util::hash::sha256_hex(ctx.as_bytes());
    let first = ListCache::new(config(Some(dir.to_path_buf()))).expect("valid");
    assert!(put(
        &first,
        Some(ctx),
        json!({"tools": ["mine"], "ttlMs": 60000, "cacheScope": "private"})
    ));
    let scope = first
        .scope_key(CacheScope::Private, Some(ctx))
        .expect("a private scope");
    assert!(scope.starts_with("private:") && !scope.contains(&plain));
    // Whoever reads the files cannot test a guessed context: its plain digest is in none.
    for file in std::fs::read_dir(dir.join("s"))
        .expect("server dir")
        .flatten()
    {
        let text = std::fs::read_to_string(file.path()).expect("read");
        assert!(text.contains("private:") && !text.contains(&plain));
    }
    let key = dir.join(SCOPE_KEY_FILE);
    let mode = std::fs::metadata(&key).expect("kept").permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    drop(first);
    // A restarted process finds its private entry under the same key.
    let again = ListCache::new(config(Some(dir.to_path_buf()))).expect("valid");
    assert!(again.get(LIST, None, Some(ctx)).is_some());
    assert!(again.get(LIST, None, Some("bob")).is_none());
    assert_eq!(
        again.scope_key(CacheScope::Private, Some(ctx)),
        Some(scope.clone())
    );
    // Another directory (or none) has a key of its own.
    let elsewhere = temp_dir("scope-key-2");
    let other = ListCache::new(config(Some(elsewhere.to_path_buf()))).expect("valid");
    assert_ne!(
        other.scope_key(CacheScope::Private, Some(ctx)),
        Some(scope.clone())
    );
    let memory = ListCache::new(config(None)).expect("valid");
    assert_ne!(
        memory.scope_key(CacheScope::Private, Some(ctx)),
        Some(scope)
    );
    assert_eq!(
        memory.scope_key(CacheScope::Public, Some(ctx)).as_deref(),
        Some("public")
    );
    assert_eq!(memory.scope_key(CacheScope::Private, None), None);
}

// Tokens are not kept in a cache directory others may write (another user could move
// or replace the token folder in it), as the disk layer is not.
#[test]
fn no_token_folder_in_a_cache_directory_others_may_write() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_dir("open-to-all");
    std::fs::create_dir_all(&*dir).expect("dir");
    std::fs::set_permissions(&*dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    assert_eq!(token_dir(&dir), None);
    assert!(!dir.join(TOKENS_DIR).exists());
    std::fs::set_permissions(&*dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    assert_eq!(token_dir(&dir), Some(dir.join(TOKENS_DIR)));
}

#[test]
fn what_else_the_cache_directory_holds_is_left_alone() {
    let dir = temp_dir("neighbours");
    // Another program's folder named `tokens` (a cache.dir of ~/.cache): not moved.
    let theirs = temp_dir("neighbours-theirs");
    std::fs::create_dir_all(theirs.join("tokens")).expect("dir");
    std::fs::write(theirs.join("tokens").join("vocab.json"), "{}").expect("write");
    token_dir(&theirs).expect("a private directory");
    assert!(
        theirs.join("tokens").join("vocab.json").exists(),
        "left where it is"
    );
    assert!(!theirs.join(TOKENS_DIR).exists());
    // Where an earlier release kept tokens: moved to their own place once.
    let old = dir.join("tokens");
    std::fs::create_dir_all(&old).expect("dir");
    let name = format!("{}.json", "0123abcd".repeat(4));
    std::fs::write(old.join(&name), r#"{"key":{"server":"web"},"token":{}}"#).expect("write");
    std::fs::write(old.join(format!("{}.lock", "0123abcd".repeat(4))), "").expect("write");
    let tokens = token_dir(&dir).expect("a private directory");
    assert_eq!(tokens, dir.join(TOKENS_DIR));
    let token = tokens.join(&name);
    assert!(token.exists() && !old.exists(), "moved");
    assert_eq!(token_dir(&dir), Some(tokens), "and only once");
    let cache = ListCache::new(config(Some(dir.to_path_buf()))).expect("valid");
    assert!(put(
        &cache,
        None,
        json!({"tools": ["a"], "ttlMs": 60000, "cacheScope": "public"})
    ));
    drop(cache);
    // Something of someone else's in a server's folder, under a name the cache does not
    // make (a `--tokens` folder there, say).
    let foreign = dir.join("s").join("notes.json");
    std::fs::write(&foreign, "{}").expect("write");
    let again = ListCache::new(config(Some(dir.to_path_buf()))).expect("valid");
    assert_eq!(again.stats().l2.entries, 1);
    assert!(
        token.exists(),
        "a kept sign-in token is not a cache entry to remove"
    );
    assert!(foreign.exists(), "nor is a file the cache did not name");
    for (name, ours) in [
        (format!("{}.json", "a".repeat(64)), true),
        (format!("{}.123.tmp", "0".repeat(64)), true),
        (format!("{}.json", "A".repeat(64)), false),
        (format!("{}.json", "a".repeat(63)), false),
        (format!("{}.tmp", "a".repeat(64)), false),
        (format!("{}\u{e9}.json", "a".repeat(63)), false),
        ("notes.json".to_string(), false),
        (String::new(), false),
    ] {
        assert_eq!(disk::ours(&name), ours, "{name}");
    }
    // No server id can take these names.
    assert!(crate::server::check_id(TOKENS_DIR).is_err());
    assert!(crate::server::check_id(SCOPE_KEY_FILE).is_err());
}

// The budget counts what a page holds in memory, not its text alone: an array of small
// numbers is 2 bytes an element as JSON and 32 in memory, and a budget counted in text
// held many times itself.
#[test]
fn a_page_is_counted_at_what_it_holds_in_memory() {
    let numbers: Vec<u8> = vec![0; 100_000];
    let result = json!({"tools": [{"name": "a", "inputSchema": {"enum": numbers}}],
                        "ttlMs": 60000, "cacheScope": "public"});
    let text = json_size(&result);
    let held = held_size(&result);
    assert!(text < 250_000 && held > 3_000_000, "{text} {held}");
    let cache = ListCache::new(CacheConfig {
        max_bytes: 1 << 20,
        ..config(None)
    })
    .expect("valid");
    assert!(put(&cache, None, result));
    assert_eq!(cache.stats().l1.entries, 0, "past the budget: not cached");
    // Text is still counted where it is the larger (a page of long strings).
    let words = json!({"tools": ["x".repeat(4000)], "ttlMs": 60000, "cacheScope": "public"});
    assert!(held_size(&words) >= json_size(&words) - 10);
}

#[test]
fn a_size_is_counted_up_to_a_most_and_no_further() {
    let value = json!({"a": [1, 2, 3]});
    let size = value.to_string().len();
    assert_eq!(json_size(&value), size);
    assert_eq!(json_size_within(&value, size), Some(size));
    assert_eq!(json_size_within(&value, size - 1), None);
}

// A layer knows how many entries each server has as they come and go, so that dropping
// a server that has none walks nothing (a flood of invalidations from Redis walked the
// whole layer under its write lock for each one).
#[test]
fn a_layer_counts_each_servers_entries_as_they_come_and_go() {
    let cache = ListCache::new(config(None)).expect("valid");
    let of = |server: &'static str| ListOf { server, ..LIST };
    let entry = |server: &'static str, cursor: &str| {
        let public = json!({"tools": [], "ttlMs": 60000, "cacheScope": "public"});
        let p = page_at(&cache, of(server), Some(cursor), None, public).expect("cacheable");
        (p.key.clone(), ListCache::entry(&p, Duration::from_secs(60)))
    };
    let mut layer = Layer::default();
    for (server, cursor) in [("s", "1"), ("s", "2"), ("t", "1")] {
        let (k, e) = entry(server, cursor);
        layer.insert(k, e);
    }
    // Stored again under a key it has: no new entry.
    let (k, e) = entry("s", "1");
    layer.insert(k.clone(), e);
    assert_eq!(layer.per_server.get("s"), Some(&2));
    assert!(layer.remove(&k).is_some());
    assert!(layer.remove(&k).is_none());
    assert_eq!(layer.per_server.get("s"), Some(&1));
    layer.retain(|k, _| k.server != "s");
    assert!(!layer.holds("s") && layer.holds("t"));
    assert_eq!(
        Layer::new(layer.entries.clone()).per_server,
        layer.per_server
    );

    // Forgetting a server with nothing kept leaves the others' entries, as before.
    assert!(put(
        &cache,
        None,
        json!({"tools": [], "ttlMs": 60000, "cacheScope": "public"})
    ));
    cache.forget_in_memory("other");
    assert_eq!(cache.stats().l1.entries, 1);
    cache.forget_in_memory("s");
    assert_eq!(cache.stats().l1.entries, 0);
    assert!(!cache.l1.read().holds("s"));
}
