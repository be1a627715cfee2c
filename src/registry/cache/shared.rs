//! The shared layer (L3): lists kept on Redis, so that several harness processes
//! (gateways behind one address, workers of one agent system) ask a server once between
//! them, and hear from each other when a server's lists change.
//!
//! Safety rules, because a shared public cache is a poisoning target: only `public`
//! pages are written, and only for the servers `cache.shared.servers` names; the key
//! holds the server's configuration fingerprint and negotiated protocol version, so a
//! process with another configuration of the same id never reads them; a page read back
//! is used only if it names the same server, fingerprint, version, method and cursor,
//! is `public`, complete, and within `max_entry_bytes`. Its remaining Redis expiry (set
//! from the page's TTL) is its freshness, never past the expiry written in the page.
//!
//! Authentication: with `key_file` (a secret the deployment's processes share), every
//! page is written as `mac1:<HMAC-SHA256 of its Redis key and body>\n<body>` and read
//! back only if the tag verifies (so a page cannot be copied under another key), so a party that can write to Redis but holds no key cannot put a page
//! in front of the harness, nor keep an old one fresh (the expiry is in the body).
//! Keys are namespaced by a digest of the secret: processes with another key, or none,
//! never read each other's pages. Generations and invalidations are not authenticated:
//! whoever can write to Redis can still make the processes ask their servers again.
//!
//! Redis is never in a call's way for long: every command is bounded by `timeout`, and
//! after a failure the layer is skipped for a backoff (`backon`, exponential with
//! jitter, up to 30 s) before it is tried again; the first failure is logged, and the
//! recovery. Writes go in the background through one writer task, which sends what is
//! queued in transactions (`MULTI`/`EXEC`) of whole lists, so that Redis never holds
//! part of one; at most [`MAX_QUEUED_WRITES`] pages wait (more are dropped and
//! counted). A page is written only if a lookup can read it back whole: its key
//! (a server's cursor among it) and envelope count against `max_entry_bytes` plus 4 KiB.
//!
//! An invalidation message longer than 4 KiB is ignored, but only after the Redis client
//! has read it (redis-rs sets no limit): what bounds it is Redis's own
//! `client-output-buffer-limit pubsub`.
//!
//! Invalidation: each shared server has a generation in Redis (`PREFIX:gen:SERVER`),
//! read with every lookup and stored with every page; a page of another generation is
//! not used. A process that drops a shared server's entries increments it and publishes
//! `{origin, server, generation}` on the channel (two round trips: the message names the
//! generation the increment made), before it drops its own; every
//! other process drops that server's entries in memory and on disk. A page fetched
//! before an invalidation carries the old generation, so it is never served after it,
//! whenever it is written. An invalidation that fails is retried with backoff, and until
//! it goes through the server's shared entries are neither read nor written here. A
//! process whose subscription broke (it pings it every 15 s) drops every shared server's
//! local entries when it subscribes again, since it may have missed a change.
//!
//! Rollback: a process keeps the highest generation it has seen of each server, and
//! moves Redis past it when it finds a lower one (a restore, a lost key, or a writer
//! replaying old signed pages under their old generation). With a disk layer, those
//! floors are kept in its directory too (`__shared-floors-DIGEST.json`, the digest of
//! the Redis URL, prefix and key), so a process started after an invalidation refuses
//! a generation set back below it as one running then does.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use futures_util::StreamExt;
use parking_lot::Mutex;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::mpsc;

use super::{CacheKey, Hit, Page, json_size};
use crate::protocol::{CacheHints, CacheScope, ResultType};
use crate::util::duration;
use crate::util::hash::{hmac_sha256_hex, hmac_sha256_verify, sha256_hex};
use crate::util::invalid::Invalid;

/// The most of a generation key read: an integer is at most 20 digits, and a longer
/// value (anyone who can write to Redis can set one of 512 MB) is cut here and refused,
/// not read whole by every lookup.
const GENERATION_READ: usize = 32;

/// Pages waiting to be written to Redis; past it a write is dropped (and counted).
pub const MAX_QUEUED_WRITES: usize = 4096;

/// What an entry may hold beyond its page: its key (the cursor among it), envelope and tag.
const ENVELOPE_BYTES: usize = 4096;

/// Bytes of the pages waiting to be written; past it a write is dropped (and counted).
pub const MAX_QUEUED_BYTES: u64 = 64 << 20;

/// The layout of stored entries, part of every key's digest: processes of another
/// layout (a rolling upgrade) never read each other's pages.
const SCHEMA: u32 = 4;

/// How an authenticated entry begins: then 64 hex digits of its body's tag, a newline,
/// the body.
const MAC_PREFIX: &[u8] = b"mac1:";

/// The shortest shared secret accepted, in bytes.
const MIN_KEY_BYTES: usize = 32;

/// Lists taken from the queue at once.
const WRITE_BATCH: usize = 256;

/// Bytes sent in one transaction at most (a list longer than that goes alone).
const PIPELINE_BYTES: usize = 256 << 10;

/// How long a subscription must last for the next to be made after the shortest wait.
const SUBSCRIPTION_STEADY: Duration = Duration::from_secs(2);

/// How often the invalidation subscription is pinged.
const SUBSCRIPTION_PING: Duration = Duration::from_secs(15);

/// One page to write: key, body, expiry in milliseconds.
type PageWrite = (String, Vec<u8>, u64);

/// The pages of one list, written together or not at all.
type Write = Vec<PageWrite>;

/// The longest the layer is skipped after failures.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Settings of the shared layer: `cache.shared = { url = "redis://…", servers = […] }`.
/// Its `Debug` hides the URL's password (an embedder may log `?config`).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedConfig {
    /// `redis://[user:password@]host:port[/db]` or `redis+unix:///path`.
    pub url: String,
    /// The servers whose public lists are shared; no other server's entry is written
    /// or read.
    pub servers: Vec<String>,
    /// The bound on one Redis command (a slower Redis is treated as down).
    #[serde(with = "duration", default = "default_timeout")]
    pub timeout: Duration,
    /// The largest page written or used.
    #[serde(default = "default_max_entry_bytes")]
    pub max_entry_bytes: usize,
    /// Prefix of keys and of the invalidation channel, so deployments can share a Redis.
    #[serde(default = "default_prefix")]
    pub prefix: String,
    /// A file holding a secret of 32 bytes or more that the deployment's processes
    /// share: pages are written with an HMAC-SHA256 under it and used only if it
    /// verifies (see the module docs). Without it, pages are not authenticated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
}

impl std::fmt::Debug for SharedConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedConfig")
            .field("url", &redacted(&self.url))
            .field("servers", &self.servers)
            .field("timeout", &self.timeout)
            .field("max_entry_bytes", &self.max_entry_bytes)
            .field("prefix", &self.prefix)
            .field("key_file", &self.key_file)
            .finish()
    }
}

/// `url` without its password, for logs, errors and the floors file's name: the user
/// part, and the `pass` or `password` query parameter (a `redis+unix` URL's).
fn redacted(url: &str) -> String {
    // The query's passwords first (`pass`, `password`: a `redis+unix` URL's), wherever
    // they are: a value may hold an `@`, which would pass for the user part's.
    let mut hidden = String::with_capacity(url.len());
    let mut rest = url;
    while let Some(at) = rest.find(['?', '&']) {
        hidden.push_str(&rest[..=at]);
        rest = &rest[at + 1..];
        let key = ["password=", "pass="]
            .into_iter()
            .find(|k| rest.starts_with(k));
        if let Some(key) = key {
            hidden.push_str(key);
            hidden.push_str("[redacted]");
            rest = &rest[rest.find('&').unwrap_or(rest.len())..];
        }
    }
    hidden.push_str(rest);
    // Then the user part, up to its last `@`: a password may hold a `?` or `/` that no
    // URL may (the refusal of such a URL quotes it).
    match (hidden.find("://"), hidden.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://[redacted]@{}", &hidden[..scheme], &hidden[at + 1..])
        }
        _ => hidden,
    }
}

/// An entry as written under `redis_key`: the body, behind its tag when pages are
/// authenticated. The tag covers the key too, so that a page cannot be copied to
/// another key (another deployment's `prefix` sharing the secret).
fn seal_entry(key: Option<&[u8]>, redis_key: &str, body: Vec<u8>) -> Vec<u8> {
    let Some(key) = key else {
        return body;
    };
    let tag = hmac_sha256_hex(key, &signed(redis_key, &body));
    let mut entry = Vec::with_capacity(MAC_PREFIX.len() + tag.len() + 1 + body.len());
    entry.extend_from_slice(MAC_PREFIX);
    entry.extend_from_slice(tag.as_bytes());
    entry.push(b'\n');
    entry.extend_from_slice(&body);
    entry
}

/// The body of an entry read back from `redis_key`, if its tag verifies (when pages are
/// authenticated).
fn open_entry<'a>(key: Option<&[u8]>, redis_key: &str, entry: &'a [u8]) -> Option<&'a [u8]> {
    let Some(key) = key else {
        return Some(entry);
    };
    let rest = entry.strip_prefix(MAC_PREFIX)?;
    let (tag, body) = (rest.get(..64)?, rest.get(64..)?);
    let body = body.strip_prefix(b"\n")?;
    hmac_sha256_verify(key, &signed(redis_key, body), tag).then_some(body)
}

/// A generation as Redis writes an integer (so that INCR works on it): digits, no sign,
/// no leading zero, at most `i64::MAX`.
fn canonical_generation(text: &[u8]) -> Option<u64> {
    let digits = !text.is_empty() && text.iter().all(u8::is_ascii_digit);
    if !digits || (text.len() > 1 && text[0] == b'0') {
        return None;
    }
    let n: i64 = std::str::from_utf8(text).ok()?.parse().ok()?;
    u64::try_from(n).ok()
}

/// What a tag is over: the Redis key, a newline, the body.
fn signed(redis_key: &str, body: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(redis_key.len() + 1 + body.len());
    message.extend_from_slice(redis_key.as_bytes());
    message.push(b'\n');
    message.extend_from_slice(body);
    message
}

/// Now, in unix milliseconds (0 before 1970).
fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Why a command failed.
enum RunFailure {
    /// Redis refused it for what a key holds (another type, no integer, an INCR that
    /// would overflow).
    BadValue,
    /// Redis did not answer, or failed.
    Unavailable,
}

/// Whether `e` is Redis's answer about the value a key holds, not about Redis.
fn about_a_keys_value(e: &redis::RedisError) -> bool {
    let about = |code: &str, detail: Option<&str>| match code {
        "WRONGTYPE" => true,
        "ERR" => detail.is_some_and(|d| d.contains("not an integer") || d.contains("overflow")),
        _ => false,
    };
    // A pipeline's error is its commands' errors.
    if let Some(errors) = e.clone().into_server_errors() {
        return !errors.is_empty() && errors.iter().all(|(_, s)| about(s.code(), s.details()));
    }
    match e.code() {
        Some(code) => about(code, e.detail()),
        None => e.kind() == redis::ErrorKind::UnexpectedReturnType,
    }
}

/// Whether `e` is Redis refusing to write (full under `noeviction`, a read-only
/// replica): it is up, and reads go on; a write's failure (an invalidation, a refresh
/// claim) is its own.
fn refuses_writes(e: &redis::RedisError) -> bool {
    let refusal = |code: &str| matches!(code, "OOM" | "READONLY" | "NOREPLICAS" | "MISCONF");
    if let Some(errors) = e.clone().into_server_errors() {
        return !errors.is_empty() && errors.iter().all(|(_, s)| refusal(s.code()));
    }
    e.code().is_some_and(refusal)
}

/// A connection to Redis, opened at its first use. The manager reconnects by itself
/// after an error; our own bound (`timeout`) and backoff sit above it, so its own
/// retries are few and quick.
fn connection_manager(client: &redis::Client) -> redis::RedisResult<ConnectionManager> {
    let config = ConnectionManagerConfig::new()
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(100))
        .set_connection_timeout(Some(Duration::from_secs(1)))
        // No bound of its own: every command is bounded by `run`/`run_within`, and
        // writes get a longer one than reads.
        .set_response_timeout(None);
    ConnectionManager::new_lazy_with_config(client.clone(), config)
}

/// Connects `conn` now, off any call's path, so that the first lookup does not pay for
/// it (a lookup's bound, 50 ms, may be shorter than a connect, over TLS say).
fn warm(mut conn: ConnectionManager) {
    tokio::spawn(async move {
        let _ = tokio::time::timeout(
            Duration::from_secs(2),
            redis::cmd("PING").query_async::<()>(&mut conn),
        )
        .await;
    });
}

/// Commands timed out in a row after which the connection is opened again: a command
/// cut off by our bound is no error to the manager, so a connection that went silent
/// (a failover whose old address drops packets) would be kept until the kernel gives
/// up on it, a quarter of an hour later.
const RECONNECT_AFTER_TIMEOUTS: u32 = 3;

/// A server's entries kept out of use while its change is on its way to Redis
/// ([`SharedCache::hold`]).
pub(crate) struct ChangeHold {
    layer: Arc<SharedCache>,
    server: String,
}

impl Drop for ChangeHold {
    fn drop(&mut self) {
        let mut changing = self.layer.changing.lock();
        if let Some(n) = changing.get_mut(&self.server) {
            *n -= 1;
            if *n == 0 {
                changing.remove(&self.server);
            }
        }
    }
}

/// A random starting generation (62 bits: well below [`CEILING`]).
fn random_generation() -> u64 {
    let mut bytes = [0u8; 8];
    // Without randomness the start is 0, as for a server never seen.
    let _ = getrandom::fill(&mut bytes);
    u64::from_le_bytes(bytes) >> 2
}

/// The highest generation used. One above it counts as no integer (and an
/// invalidation starts afresh from a random one): a floor near `i64::MAX` would leave
/// INCR no room, and a Redis writer who set it there would stop invalidation for good.
const CEILING: u64 = i64::MAX as u64 - (1 << 32);

/// The least time between two warnings of an entry refused (each is counted).
const GARBAGE_WARNING_GAP: Duration = Duration::from_secs(60);

fn default_timeout() -> Duration {
    Duration::from_millis(50)
}

fn default_max_entry_bytes() -> usize {
    1 << 20
}

fn default_prefix() -> String {
    "mcp-harness".into()
}

/// The longest `timeout` allowed.
const MAX_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest `max_entry_bytes` allowed.
const MAX_ENTRY_BYTES: usize = 64 << 20;

impl SharedConfig {
    /// Shared layer settings for `url` and `servers`, the rest by default.
    pub fn new(url: impl Into<String>, servers: Vec<String>) -> SharedConfig {
        SharedConfig {
            url: url.into(),
            servers,
            timeout: default_timeout(),
            max_entry_bytes: default_max_entry_bytes(),
            prefix: default_prefix(),
            key_file: None,
        }
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<(), Invalid> {
        if !(self.url.starts_with("redis://") || self.url.starts_with("redis+unix://")) {
            return Err(Invalid::new(
                "url",
                format!(
                    "{:?} is not a redis:// or redis+unix:// URL (TLS to Redis is not supported: keep it on loopback or a private network)",
                    redacted(&self.url)
                ),
            ));
        }
        redis::Client::open(self.url.as_str())
            .map_err(|e| Invalid::new("url", format!("{:?}: {e}", redacted(&self.url))))?;
        // Every listing may wait on one command: a bound past a server's own round trip
        // would make a Redis that drops packets fail calls, not be skipped.
        if self.timeout.is_zero() || self.timeout > MAX_TIMEOUT {
            return Err(Invalid::new(
                "timeout",
                "must be more than zero and at most 5s",
            ));
        }
        // As the disk layer reads a file; past it a read's range would be refused by
        // Redis, and every page with it.
        if self.max_entry_bytes == 0 || self.max_entry_bytes > MAX_ENTRY_BYTES {
            return Err(Invalid::new(
                "max_entry_bytes",
                "must be more than zero and at most 64 MiB",
            ));
        }
        // Each is a server id, and names a folder of the disk layer.
        for id in &self.servers {
            crate::server::check_id(id).map_err(|e| Invalid::new("servers", e.reason))?;
        }
        if self.prefix.is_empty() || self.prefix.contains(['*', '?', '[', ']', '\\']) {
            return Err(Invalid::new(
                "prefix",
                "must be non-empty, without glob characters",
            ));
        }
        Ok(())
    }

    fn channel(&self) -> String {
        format!("{}:changed", self.prefix)
    }
}

/// Counters of the shared layer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SharedStats {
    /// Lookups answered.
    pub hits: u64,
    /// Lookups not answered (absent, expired, refused, or Redis unavailable).
    pub misses: u64,
    /// Pages written.
    pub writes: u64,
    /// Writes dropped: too large, or too many in flight.
    pub dropped_writes: u64,
    /// Entries read back and refused (garbage, another key's page, not public, too large).
    pub rejected: u64,
    /// Redis commands that failed or timed out.
    pub errors: u64,
    /// Invalidations published.
    pub published: u64,
    /// Invalidations heard from other processes.
    pub received: u64,
    /// Whether the layer is being used now (false: skipped after a failure).
    pub available: bool,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    writes: AtomicU64,
    dropped_writes: AtomicU64,
    rejected: AtomicU64,
    errors: AtomicU64,
    published: AtomicU64,
    received: AtomicU64,
}

/// When Redis failed, when to try it again.
struct Health {
    skip_until: Option<Instant>,
    backoff: ExponentialBackoff,
}

fn backoff() -> ExponentialBackoff {
    ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(MAX_BACKOFF)
        .with_jitter()
        .without_max_times()
        .build()
}

/// What an invalidation message says.
#[derive(Serialize, Deserialize)]
struct Changed {
    origin: String,
    server: String,
    /// The generation the server was moved to (absent from earlier versions' messages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    generation: Option<u64>,
}

/// What a process knew of a server before a read of its generation.
#[derive(Clone, Copy)]
struct Seen {
    highest: Option<u64>,
    heard: u64,
}

/// Background writes failed in a row after which writes are off for [`WRITES_OFF`]: a
/// Redis that keeps refusing them (full, read-only) is not sent every list fetched,
/// each serialized and signed first.
const WRITES_FAILED: u32 = 3;
const WRITES_OFF: Duration = Duration::from_secs(30);

/// How far past the highest generation seen a heard one is taken: a message is not
/// authenticated, so one naming a generation further on is taken as one step.
const HEARD_STEP: u64 = 1 << 20;

/// What is stored under a key: the page and what it was stored for, checked on read.
#[derive(Serialize, Deserialize)]
struct Stored {
    /// The server's generation when the page was fetched.
    generation: u64,
    /// When the page stops being fresh (unix milliseconds), whatever Redis's expiry says.
    expires_ms: u64,
    server: String,
    fingerprint: String,
    client: String,
    protocol: String,
    method: String,
    cursor: Option<String>,
    page: Value,
}

/// The shared layer; see the module docs.
pub struct SharedCache {
    config: SharedConfig,
    /// The shared secret pages are authenticated with (`key_file`), if any.
    key: Option<Vec<u8>>,
    /// Part of every page's key: a digest of the secret, or `none`.
    key_id: String,
    client: redis::Client,
    conn: Mutex<ConnectionManager>,
    /// The background writes' own connection: a large write does not hold up the
    /// lookups queued behind it on one socket (each bounded at 50 ms), nor does its
    /// time count against the layer's health.
    write_conn: Mutex<ConnectionManager>,
    /// Background writes failed in a row; past [`WRITES_FAILED`], no list is made into
    /// writes (serialized, signed, queued) until [`WRITES_OFF`] has passed.
    write_failures: std::sync::atomic::AtomicU32,
    writes_off_until: Mutex<Option<Instant>>,
    /// Commands timed out in a row ([`RECONNECT_AFTER_TIMEOUTS`]).
    timeouts: std::sync::atomic::AtomicU32,
    /// This process, so that it ignores its own invalidations.
    origin: String,
    health: Mutex<Health>,
    counts: Counters,
    /// When an entry refused was last logged: at most one a minute, so that a later
    /// refusal (a bad MAC, a forged message) is logged too, not only the first.
    warned_garbage: Mutex<Option<Instant>>,
    writes: mpsc::Sender<Write>,
    /// Pages queued or being written (for [`SharedCache::drain`]), and their bytes.
    pending: AtomicU64,
    pending_bytes: AtomicU64,
    listener: Mutex<Option<tokio::task::AbortHandle>>,
    /// Servers whose invalidation has not reached Redis yet (being retried), with how
    /// many were asked for since: one asked for while a retry's INCR may already be on
    /// its way is sent again after it.
    unsent: Mutex<std::collections::HashMap<String, u64>>,
    /// Servers whose lists changed here and whose invalidation has not reached Redis
    /// yet ([`SharedCache::hold`]), with how many such holds: this process dropped its
    /// own copies at once, and a walk meanwhile would read the list of before back from
    /// Redis.
    changing: Mutex<std::collections::HashMap<String, usize>>,
    /// The highest generation seen of each shared server (the configured ones: bounded).
    /// Redis going back below it (a restore, a lost key, or a writer replaying old
    /// signed pages under their old generation) is moved past it, so no page of before
    /// is used.
    highest: Mutex<std::collections::HashMap<String, u64>>,
    /// Invalidations heard of each shared server: a read under way when one is heard
    /// is a plain miss (it may hold the generation of before), whether or not the
    /// message said which generation came.
    heard: Mutex<std::collections::HashMap<String, u64>>,
    /// Where `highest` is kept across restarts, if there is a disk layer.
    floors: Option<Floors>,
    /// The first subscription was made, or could not be. Before, a peer's change may
    /// go unheard with nothing to make up for it (a subscription made late but on its
    /// first try drops nothing), so no shared server's list is kept here meanwhile
    /// ([`SharedCache::keeps`]); one that could not be made drops what was kept once a
    /// later one is.
    settled: AtomicBool,
    /// Redis refused the last subscription (a user allowed keys but no channels): peers'
    /// changes go unheard for as long as it does, and no subscription made later
    /// would drop what was kept meanwhile, so shared lists are read from Redis, which
    /// checks the generation, not kept here. (A Redis down or slow refuses nothing: what
    /// is kept then is dropped once a subscription is made.)
    subscription_refused: AtomicBool,
    /// Said that invalidations cannot be published (`NOPERM`): said once.
    publish_refused_said: AtomicBool,
}

/// The file that keeps [`SharedCache::highest`] across restarts (see the module docs).
struct Floors {
    path: PathBuf,
    /// `highest` rose since it was last written.
    dirty: AtomicBool,
    /// Wakes the task that writes it (one wake-up waits at most: a burst of rises is
    /// one write); the task ends when this drops, with the layer.
    changed: mpsc::Sender<()>,
    /// One write at a time, each of what `highest` holds then.
    writing: Mutex<()>,
}

/// The largest floors file read: a generation per configured server fits many times.
const MAX_FLOORS_FILE: u64 = 1 << 20;

impl Floors {
    /// The floors kept for the deployment of `config` and `key_id` in `dir` (a
    /// password in the URL is not part of the name: changing it keeps the file), with
    /// the receiver of its wake-ups, for [`keep_floors`]. A crashed writer's temporary
    /// files are removed. Blocking I/O, small.
    fn new(
        dir: &std::path::Path,
        config: &SharedConfig,
        key_id: &str,
    ) -> (Floors, mpsc::Receiver<()>) {
        let digest = sha256_hex(
            format!("{}\n{}\n{key_id}", redacted(&config.url), config.prefix).as_bytes(),
        );
        let name = format!("__shared-floors-{}", &digest[..16]);
        super::disk::remove_stale_tmp(dir, &format!("{name}."));
        let (changed, wake) = mpsc::channel(1);
        let floors = Floors {
            path: dir.join(format!("{name}.json")),
            dirty: AtomicBool::new(false),
            changed,
            writing: Mutex::new(()),
        };
        (floors, wake)
    }

    /// What the file holds (nothing if it is not there); an error if it is there but
    /// cannot be read whole (too large, not a plain file, out of descriptors): then it
    /// is neither used nor written over. One that holds no map of generations (cut short
    /// by a crash) is an error too, unless `aside`, said under the floors' lock (another
    /// process may be writing a good one in its place): then it is moved aside
    /// (`.corrupt-MS`), said in the log, and kept afresh; its floors are lost either
    /// way, and left in place it would stop them being kept.
    fn read(&self, aside: bool) -> std::io::Result<std::collections::HashMap<String, u64>> {
        match std::fs::symlink_metadata(&self.path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Default::default()),
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        let bytes = super::disk::read_plain_within(&self.path, MAX_FLOORS_FILE)
            .ok_or_else(|| std::io::Error::other("not a plain file of at most 1 MiB"))?;
        let mut floors: std::collections::HashMap<String, u64> = match serde_json::from_slice(
            &bytes,
        ) {
            Ok(floors) => floors,
            Err(e) if !aside => {
                return Err(std::io::Error::other(format!(
                    "not a map of generations: {e}"
                )));
            }
            Err(e) => {
                // Not through `display()`, which would change a name that is no UTF-8.
                let mut to = self.path.clone().into_os_string();
                to.push(format!(".corrupt-{}", super::now_ms()));
                let to = std::path::PathBuf::from(to);
                std::fs::rename(&self.path, &to).map_err(|moving| {
                    std::io::Error::other(format!(
                        "not a map of generations ({e}), and not moved aside: {moving}"
                    ))
                })?;
                tracing::error!(path = %self.path.display(), aside = %to.display(), error = %e, "the shared cache's generation floors file holds no map of generations; moved aside, the floors start afresh (pages from before a lost rise may be taken once)");
                Default::default()
            }
        };
        floors.retain(|_, g| *g <= CEILING);
        Ok(floors)
    }

    /// The floors of `servers` kept in the file.
    fn load(&self, servers: &[String]) -> std::collections::HashMap<String, u64> {
        let mut floors = self.read(false).unwrap_or_else(|e| {
            tracing::warn!(path = %self.path.display(), error = %e, "the shared cache's generation floors cannot be read");
            Default::default()
        });
        floors.retain(|server, _| servers.contains(server));
        floors
    }

    /// Writes `highest`, if it rose since the last write, with what the file holds
    /// (also for servers only another process sharing the directory has), keeping the
    /// higher of each; under a lock (`flock`) that processes sharing the directory
    /// take too, so none writes over another's rise. Blocking I/O.
    fn write(&self, layer: &SharedCache) {
        // Bounded: a process sharing the directory that holds the lock and is stopped
        // (or stuck on a disk) would hold this thread, and shutdown behind it, for ever.
        let deadline = Instant::now() + FLOORS_LOCK_WAIT;
        let Some(_one) = self.writing.try_lock_until(deadline) else {
            tracing::warn!(path = %self.path.display(), "the shared cache's generation floors were not kept on disk: a write of them is stuck");
            return;
        };
        if !self.dirty.swap(false, Ordering::SeqCst) {
            return;
        }
        let lock = self.path.with_extension("lock");
        let kept = super::disk::locked_until(&lock, deadline).and_then(|_lock| {
            let mut floors = self.read(true)?;
            for (server, g) in layer.highest.lock().iter() {
                let kept = floors.entry(server.clone()).or_insert(*g);
                *kept = (*kept).max(*g);
            }
            super::disk::write_durable(&self.path, &serde_json::to_vec(&floors)?)
        });
        if let Err(e) = kept {
            // Tried again at the next rise, and at shutdown: a rise never written would
            // let a restarted process take pages from before it.
            self.dirty.store(true, Ordering::SeqCst);
            tracing::warn!(path = %self.path.display(), error = %e, "the shared cache's generation floors could not be kept on disk");
        }
    }
}

/// How long a write of the floors waits for their lock before it gives up (they stay
/// to be written at the next rise, or at shutdown).
const FLOORS_LOCK_WAIT: Duration = Duration::from_secs(5);

/// Writes the floors file whenever they rose; ends with the layer.
async fn keep_floors(layer: std::sync::Weak<SharedCache>, mut wake: mpsc::Receiver<()>) {
    while wake.recv().await.is_some() {
        let Some(strong) = layer.upgrade() else {
            return;
        };
        strong.write_floors().await;
    }
}

/// What one lookup learned: the page, if usable, and the server's generation (known
/// when Redis answered), which a page fetched next must be stored with.
#[derive(Clone, Debug, Default)]
pub struct SharedRead {
    /// The page.
    pub hit: Option<Hit>,
    /// The server's generation.
    pub generation: Option<u64>,
}

/// Why the shared layer could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("cache.shared: {0}")]
pub struct SharedError(pub Invalid);

impl SharedCache {
    /// The layer for `config`; nothing is connected yet (a Redis that is down at start
    /// only means the layer is skipped until it is up). With `disk` (the disk layer's
    /// directory), the highest generations seen are kept there across restarts. Call
    /// within a tokio runtime.
    pub fn new(
        config: SharedConfig,
        disk: Option<&std::path::Path>,
    ) -> Result<Arc<SharedCache>, SharedError> {
        config.validate().map_err(SharedError)?;
        let key = match &config.key_file {
            Some(path) => Some(
                crate::util::secret::read_secret_file(path, MIN_KEY_BYTES)
                    .map_err(|e| SharedError(Invalid::new("key_file", e)))?,
            ),
            None => {
                tracing::warn!(url = %redacted(&config.url), "cache.shared.key_file is not set: pages in Redis are not authenticated, and whoever can write to this Redis can put tool definitions in front of this process, and whoever can read it can test guesses of the secrets in a server's config against its fingerprint");
                None
            }
        };
        let key_id = key.as_deref().map_or_else(
            || "none".to_string(),
            |k| hmac_sha256_hex(k, b"mcp-harness shared cache key id")[..16].to_string(),
        );
        let client = redis::Client::open(config.url.as_str())
            .map_err(|e| SharedError(Invalid::new("url", e.to_string())))?;
        let conn = connection_manager(&client)
            .map_err(|e| SharedError(Invalid::new("url", e.to_string())))?;
        let write_conn = connection_manager(&client)
            .map_err(|e| SharedError(Invalid::new("url", e.to_string())))?;
        let (writes, queue) = mpsc::channel(MAX_QUEUED_WRITES);
        let mut origin = [0u8; 16];
        getrandom::fill(&mut origin).map_err(|e| {
            SharedError(Invalid::new(
                "url",
                format!("no randomness for an origin id: {e}"),
            ))
        })?;
        let (floors, wake) = disk.map(|dir| Floors::new(dir, &config, &key_id)).unzip();
        let highest = floors
            .as_ref()
            .map(|f| f.load(&config.servers))
            .unwrap_or_default();
        let shared = Arc::new(SharedCache {
            origin: origin.iter().map(|b| format!("{b:02x}")).collect(),
            config,
            key,
            key_id,
            client,
            conn: Mutex::new(conn),
            write_conn: Mutex::new(write_conn),
            write_failures: std::sync::atomic::AtomicU32::new(0),
            writes_off_until: Mutex::new(None),
            timeouts: std::sync::atomic::AtomicU32::new(0),
            health: Mutex::new(Health {
                skip_until: None,
                backoff: backoff(),
            }),
            counts: Counters::default(),
            warned_garbage: Mutex::new(None),
            writes,
            pending: AtomicU64::new(0),
            pending_bytes: AtomicU64::new(0),
            listener: Mutex::new(None),
            unsent: Mutex::default(),
            changing: Mutex::default(),
            highest: Mutex::new(highest),
            heard: Mutex::default(),
            floors,
            settled: AtomicBool::new(false),
            subscription_refused: AtomicBool::new(false),
            publish_refused_said: AtomicBool::new(false),
        });
        tokio::spawn(write_queue(Arc::downgrade(&shared), queue));
        if let Some(wake) = wake {
            tokio::spawn(keep_floors(Arc::downgrade(&shared), wake));
        }
        warm(shared.conn.lock().clone());
        Ok(shared)
    }

    /// The settings.
    pub fn config(&self) -> &SharedConfig {
        &self.config
    }

    /// Whether `server`'s public lists are shared.
    pub fn shares(&self, server: &str) -> bool {
        self.config.servers.iter().any(|s| s == server)
    }

    /// Whether this process may keep `server`'s lists in its own layers now: a server
    /// not shared always; a shared one once the first subscription is settled, unless
    /// Redis refused it.
    pub fn keeps(&self, server: &str) -> bool {
        !self.shares(server)
            || (self.settled.load(Ordering::Acquire)
                && !self.subscription_refused.load(Ordering::Acquire))
    }

    /// Whether `server`'s entries may be read or written now (no invalidation of it is
    /// still on its way to Redis).
    fn in_use(&self, server: &str) -> bool {
        self.shares(server)
            && !self.unsent.lock().contains_key(server)
            && !self.changing.lock().contains_key(server)
    }

    /// Keeps `server`'s entries from being read or written until the hold is dropped:
    /// taken when its lists change, before this process drops its own copies, and
    /// dropped once [`SharedCache::invalidate`] has moved the generation (or left it to
    /// its retries, which hold the server in turn). `None` for a server not shared.
    pub(crate) fn hold(self: &Arc<Self>, server: &str) -> Option<ChangeHold> {
        if !self.shares(server) {
            return None;
        }
        *self.changing.lock().entry(server.to_string()).or_insert(0) += 1;
        Some(ChangeHold {
            layer: self.clone(),
            server: server.to_string(),
        })
    }

    fn generation_key(&self, server: &str) -> String {
        format!("{}:gen:{server}", self.config.prefix)
    }

    /// The fingerprint as an entry holds it: with a key, its HMAC, so that a reader of
    /// Redis cannot test guesses of the secrets it digests (headers, environment)
    /// against it (the entry's Redis key hides it under the key too).
    fn fingerprint_tag(&self, fingerprint: &str) -> String {
        match self.key.as_deref() {
            Some(k) => hmac_sha256_hex(k, fingerprint.as_bytes()),
            None => fingerprint.to_string(),
        }
    }

    /// The Redis key of a page (public scope only) under `protocol`, the version
    /// negotiated (the key's `client` names the capabilities it was asked with).
    pub fn redis_key(&self, key: &CacheKey, protocol: &str) -> String {
        let digest = sha256_hex(
            serde_json::json!([
                SCHEMA,
                self.key_id,
                key.fingerprint,
                key.client,
                protocol,
                key.method,
                key.param
            ])
            .to_string()
            .as_bytes(),
        );
        format!("{}:list:{}:{digest}", self.config.prefix, key.server)
    }

    /// The most of an entry a lookup reads: the page's limit, and its key, envelope
    /// and tag (a page written longer than this is not written at all).
    fn entry_limit(&self) -> usize {
        self.config.max_entry_bytes.saturating_add(ENVELOPE_BYTES)
    }

    fn usable(&self) -> bool {
        self.health
            .lock()
            .skip_until
            .is_none_or(|t| Instant::now() >= t)
    }

    fn worked(&self) {
        let mut health = self.health.lock();
        if health.skip_until.take().is_some() {
            tracing::info!(url = %redacted(&self.config.url), "shared cache reachable again");
            health.backoff = backoff();
        }
    }

    fn failed(&self, what: &str, error: &str) {
        self.counts.errors.fetch_add(1, Ordering::Relaxed);
        let mut health = self.health.lock();
        let now = Instant::now();
        // The commands in flight when Redis went fail together: one step of the
        // backoff for them all, not one each (eight would make 100 ms 25 s).
        if health.skip_until.is_some_and(|t| now < t) {
            return;
        }
        // Jitter is added past the cap: the wait is held to it.
        let wait = health
            .backoff
            .next()
            .unwrap_or(MAX_BACKOFF)
            .min(MAX_BACKOFF);
        if health.skip_until.is_none() {
            tracing::warn!(url = %redacted(&self.config.url), what, error, "shared cache unavailable; serving from memory and disk");
        }
        health.skip_until = Some(now + wait);
    }

    fn reject(&self, key: &str, why: &str) {
        self.counts.rejected.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let due = {
            let mut last = self.warned_garbage.lock();
            let due =
                last.is_none_or(|at| now.saturating_duration_since(at) >= GARBAGE_WARNING_GAP);
            if due {
                *last = Some(now);
            }
            due
        };
        if due {
            tracing::warn!(key, why, "refused an entry read from the shared cache");
        }
    }

    /// Runs one command (or pipeline) within the bound.
    async fn run<T: redis::FromRedisValue>(
        &self,
        what: &str,
        work: impl AsyncFnOnce(ConnectionManager) -> redis::RedisResult<T>,
    ) -> Option<T> {
        self.run_within(self.config.timeout, what, work).await
    }

    /// [`SharedCache::run`] within `bound`.
    async fn run_within<T: redis::FromRedisValue>(
        &self,
        bound: Duration,
        what: &str,
        work: impl AsyncFnOnce(ConnectionManager) -> redis::RedisResult<T>,
    ) -> Option<T> {
        self.try_run(bound, what, work).await.ok()
    }

    /// [`SharedCache::run_within`], saying why it failed.
    async fn try_run<T: redis::FromRedisValue>(
        &self,
        bound: Duration,
        what: &str,
        work: impl AsyncFnOnce(ConnectionManager) -> redis::RedisResult<T>,
    ) -> Result<T, RunFailure> {
        let conn = self.conn.lock().clone();
        let outcome = tokio::time::timeout(bound, work(conn)).await;
        if outcome.is_ok() {
            self.timeouts.store(0, Ordering::Relaxed);
        }
        match outcome {
            Ok(Ok(v)) => {
                self.worked();
                Ok(v)
            }
            // Redis answered: it is up, and one key holds what this layer never wrote
            // there. Refused for that key alone; backing the whole layer off would let
            // anyone who can write one key turn it off.
            Ok(Err(e)) if about_a_keys_value(&e) => {
                self.worked();
                self.reject(what, &e.to_string());
                Err(RunFailure::BadValue)
            }
            // Up, but not writing: counted, and the reads go on.
            Ok(Err(e)) if refuses_writes(&e) => {
                self.counts.errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(url = %redacted(&self.config.url), what, error = %e, "shared cache refused a write");
                Err(RunFailure::Unavailable)
            }
            Ok(Err(e)) => {
                self.failed(what, &e.to_string());
                Err(RunFailure::Unavailable)
            }
            Err(_) => {
                self.failed(what, "timed out");
                if self.timeouts.fetch_add(1, Ordering::Relaxed) + 1 >= RECONNECT_AFTER_TIMEOUTS {
                    self.timeouts.store(0, Ordering::Relaxed);
                    // Commands still waiting on the old connection keep it until they end.
                    if let Ok(fresh) = connection_manager(&self.client) {
                        tracing::debug!(url = %redacted(&self.config.url), "shared cache connection silent; opening a new one");
                        *self.conn.lock() = fresh.clone();
                        warm(fresh);
                    }
                }
                Err(RunFailure::Unavailable)
            }
        }
    }

    /// Runs a background write on its own connection within `bound`. Its failure is
    /// counted, not taken for the layer's (a lookup that fails says so itself); a
    /// write that times out opens a new connection, as the reads' does after a few.
    async fn run_write(
        &self,
        bound: Duration,
        work: impl AsyncFnOnce(ConnectionManager) -> redis::RedisResult<()>,
    ) -> Option<()> {
        let conn = self.write_conn.lock().clone();
        let outcome = tokio::time::timeout(bound, work(conn)).await;
        if let Ok(Ok(())) = outcome {
            self.write_failures.store(0, Ordering::Relaxed);
            return Some(());
        }
        self.counts.errors.fetch_add(1, Ordering::Relaxed);
        match outcome {
            Ok(Err(e)) => {
                tracing::debug!(url = %redacted(&self.config.url), error = %e, "shared cache write failed");
            }
            _ => {
                tracing::debug!(url = %redacted(&self.config.url), "shared cache write timed out; opening a new connection for writes");
                if let Ok(fresh) = connection_manager(&self.client) {
                    *self.write_conn.lock() = fresh;
                }
            }
        }
        if self.write_failures.fetch_add(1, Ordering::Relaxed) + 1 >= WRITES_FAILED {
            self.write_failures.store(0, Ordering::Relaxed);
            *self.writes_off_until.lock() = Some(Instant::now() + WRITES_OFF);
            tracing::info!(url = %redacted(&self.config.url), "shared cache writes failing; none made for {WRITES_OFF:?}");
        }
        None
    }

    /// Whether writes are off for now (they kept failing).
    fn writes_off(&self) -> bool {
        let mut off = self.writes_off_until.lock();
        match *off {
            Some(until) if Instant::now() < until => true,
            Some(_) => {
                *off = None;
                false
            }
            None => false,
        }
    }

    /// A fresh page for `key` (public scope) under `protocol`, if another process (or
    /// this one) stored it in the server's current generation; and that generation.
    pub async fn get(&self, key: &CacheKey, protocol: &str) -> SharedRead {
        let read = self.lookup(key, protocol).await;
        let counter = if read.hit.is_some() {
            &self.counts.hits
        } else {
            &self.counts.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        read
    }

    /// The current generation of `server` (for a list fetched without a lookup first).
    pub async fn generation(&self, server: &str) -> Option<u64> {
        if !self.in_use(server) || !self.usable() {
            return None;
        }
        let key = self.generation_key(server);
        let seen = self.before_read(server);
        let generation: redis::Value = self
            .run("read", async |mut conn| {
                redis::cmd("GETRANGE")
                    .arg(&key)
                    .arg(0)
                    .arg(GENERATION_READ - 1)
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        let generation = self.seeded(&key, generation).await?;
        self.checked_generation(server, &key, &generation, seen)
            .await
    }

    /// A generation as read, or, when the server has none yet, a random one set for it
    /// (not 0: should Redis lose the key, by eviction or an old snapshot, pages of
    /// before are not matched by chance) and read again. Only then is anything written:
    /// a Redis that refuses writes (full under `noeviction`, a replica) still serves
    /// every read.
    async fn seeded(&self, key: &str, read: redis::Value) -> Option<redis::Value> {
        let missing = match &read {
            redis::Value::Nil => true,
            redis::Value::BulkString(b) => b.is_empty(),
            _ => false,
        };
        if !missing {
            return Some(read);
        }
        let seed = random_generation();
        let (_, generation): (redis::Value, redis::Value) = self
            .run("read", async |mut conn| {
                redis::pipe()
                    .cmd("SET")
                    .arg(key)
                    .arg(seed)
                    .arg("NX")
                    .cmd("GETRANGE")
                    .arg(key)
                    .arg(0)
                    .arg(GENERATION_READ - 1)
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        Some(generation)
    }

    /// The highest generation of `server` seen so far.
    #[cfg(test)]
    fn highest_seen(&self, server: &str) -> Option<u64> {
        self.highest.lock().get(server).copied()
    }

    /// What this process knows of `server` before a read of it: the highest generation
    /// seen, and how many invalidations of it it has heard (lock order: `highest`,
    /// then `heard`).
    fn before_read(&self, server: &str) -> Seen {
        let highest = self.highest.lock();
        let heard = self.heard.lock().get(server).copied().unwrap_or(0);
        Seen {
            highest: highest.get(server).copied(),
            heard,
        }
    }

    /// A server's generation as Redis holds it, if usable: not below the highest this
    /// process has seen, which Redis is moved past instead (and this lookup misses).
    /// `seen` is what was known before the read was sent: a generation at or past the
    /// highest then that is below the highest now was overtaken while the read was on
    /// its way (an invalidation of this process's, or one heard), and is a plain miss;
    /// so is any read under way when an invalidation was heard.
    async fn checked_generation(
        &self,
        server: &str,
        key: &str,
        value: &redis::Value,
        seen: Seen,
    ) -> Option<u64> {
        let generation = self.decode_generation(key, value)?;
        let step = {
            let mut highest = self.highest.lock();
            // Checked under `highest`'s lock, which an invalidation heard takes to count.
            if self.heard.lock().get(server).copied().unwrap_or(0) != seen.heard {
                return None;
            }
            let seen = seen.highest;
            let (top, rose) = match highest.entry(server.to_string()) {
                std::collections::hash_map::Entry::Occupied(e) => (e.into_mut(), false),
                std::collections::hash_map::Entry::Vacant(e) => (e.insert(generation), true),
            };
            if generation >= *top {
                let rose = rose || generation > *top;
                *top = generation;
                drop(highest);
                if rose {
                    self.floors_rose();
                }
                return Some(generation);
            }
            if seen.is_none_or(|seen| generation >= seen) {
                return None;
            }
            // Past the highest seen, within what INCR can still add to.
            let ahead = top.saturating_add(1).min(i64::MAX as u64);
            *top = ahead;
            ahead - generation
        };
        self.floors_rose();
        self.reject(key, "a generation older than one seen; moved past it");
        // INCRBY only adds: another process's INCR meanwhile is not undone.
        let _: Option<i64> = self
            .run("read", async |mut conn| {
                redis::cmd("INCRBY")
                    .arg(key)
                    .arg(step)
                    .query_async(&mut conn)
                    .await
            })
            .await;
        None
    }

    /// A peer moved `server` to `generation` (its INCR comes before its message):
    /// nothing below it is accepted any more. A message of an earlier version names
    /// none: nothing at or below the highest seen before is accepted then. A message is
    /// not authenticated: one step at most ([`HEARD_STEP`]) is taken past the highest
    /// seen, and none for a server not read yet (its reads after the message see the
    /// INCR).
    fn heard_invalidation(&self, server: &str, generation: Option<u64>) {
        {
            // Under `highest`'s lock, as a read's check of the count is: a read cannot
            // find the count unchanged and then take the generation of before.
            let mut highest = self.highest.lock();
            {
                let mut heard = self.heard.lock();
                let count = heard.entry(server.to_string()).or_insert(0);
                *count = count.wrapping_add(1);
            }
            let Some(top) = highest.get_mut(server) else {
                return;
            };
            let next = match generation {
                Some(g) if g > *top && g - *top <= HEARD_STEP => g,
                // Read already (the read came between the INCR and its message).
                Some(g) if g <= *top => return,
                _ => top.saturating_add(1),
            };
            *top = next.min(i64::MAX as u64);
        }
        self.floors_rose();
    }

    /// `highest` rose: the floors file is written again soon.
    fn floors_rose(&self) {
        if let Some(floors) = &self.floors {
            floors.dirty.store(true, Ordering::SeqCst);
            let _ = floors.changed.try_send(());
        }
    }

    /// A generation as Redis holds it: an integer (as text); anything else is refused
    /// for this server only.
    fn decode_generation(&self, key: &str, value: &redis::Value) -> Option<u64> {
        let parsed = match value {
            redis::Value::Int(n) => u64::try_from(*n).ok(),
            redis::Value::BulkString(bytes) => canonical_generation(bytes),
            _ => None,
        }
        .filter(|g| *g <= CEILING);
        if parsed.is_none() {
            self.reject(
                key,
                "a generation that is not an integer, or too near overflow",
            );
        }
        parsed
    }

    async fn lookup(&self, key: &CacheKey, protocol: &str) -> SharedRead {
        if key.scope != "public" || !self.in_use(&key.server) || !self.usable() {
            return SharedRead::default();
        }
        let redis_key = self.redis_key(key, protocol);
        // Read no more than an entry may hold: a longer value is cut, and refused.
        let limit = self.entry_limit();
        let gen_key = self.generation_key(&key.server);
        let seen = self.before_read(&key.server);
        let Some((generation, bytes, pttl)) = self
            .run("read", async |mut conn| {
                redis::pipe()
                    .cmd("GETRANGE")
                    .arg(&gen_key)
                    .arg(0)
                    .arg(GENERATION_READ - 1)
                    .cmd("GETRANGE")
                    .arg(&redis_key)
                    .arg(0)
                    .arg(limit)
                    .cmd("PTTL")
                    .arg(&redis_key)
                    .query_async::<(redis::Value, Vec<u8>, i64)>(&mut conn)
                    .await
            })
            .await
        else {
            return SharedRead::default();
        };
        let Some(generation) = self.seeded(&gen_key, generation).await else {
            return SharedRead::default();
        };
        let Some(generation) = self
            .checked_generation(&key.server, &gen_key, &generation, seen)
            .await
        else {
            return SharedRead::default();
        };
        SharedRead {
            hit: self.check(key, protocol, generation, &redis_key, &bytes, pttl, limit),
            generation: Some(generation),
        }
    }

    /// The page in `bytes`, if it is one this lookup may use.
    #[allow(clippy::too_many_arguments)]
    fn check(
        &self,
        key: &CacheKey,
        protocol: &str,
        generation: u64,
        redis_key: &str,
        bytes: &[u8],
        pttl: i64,
        limit: usize,
    ) -> Option<Hit> {
        if bytes.is_empty() || pttl <= 0 {
            return None;
        }
        if bytes.len() > limit {
            self.reject(redis_key, "larger than max_entry_bytes");
            return None;
        }
        let Some(body) = open_entry(self.key.as_deref(), redis_key, bytes) else {
            self.reject(redis_key, "not signed with this deployment's key");
            return None;
        };
        let stored: Stored = match serde_json::from_slice(body) {
            Ok(s) => s,
            Err(e) => {
                self.reject(redis_key, &format!("not an entry: {e}"));
                return None;
            }
        };
        if stored.generation != generation {
            return None; // from before the server's lists last changed
        }
        let same = stored.server == key.server
            && stored.fingerprint == self.fingerprint_tag(&key.fingerprint)
            && stored.client == key.client
            && stored.protocol == protocol
            && stored.method == key.method
            && stored.cursor == key.param;
        if !same {
            self.reject(redis_key, "stored for another key");
            return None;
        }
        if CacheHints::of(&stored.page).scope != CacheScope::Public
            || !matches!(ResultType::of(&stored.page), Ok(ResultType::Complete))
        {
            self.reject(redis_key, "not a public, complete page");
            return None;
        }
        let size = json_size(&stored.page);
        if size > self.config.max_entry_bytes {
            self.reject(redis_key, "larger than max_entry_bytes");
            return None;
        }
        // Redis's expiry may have been moved; the page's own is the bound.
        // Past it: a plain miss (a reader's clock ahead of the writer's looks the same).
        let left = stored.expires_ms.saturating_sub(unix_ms());
        if left == 0 {
            return None;
        }
        let remaining = Duration::from_millis(pttl.unsigned_abs().min(left));
        Some(Hit {
            value: Arc::new(stored.page),
            bytes: size,
            remaining,
            ttl: remaining,
            scope: CacheScope::Public,
        })
    }

    /// Writes the pages of one list, fetched in `generation`, in the background (see
    /// the module docs): all of them, or none. A list shared in part would send
    /// another process, with page one from here, to its own server with this server's
    /// cursor; and a private page is never shared.
    pub fn put(&self, pages: &[Page], protocol: &str, generation: u64) {
        if !self.usable() || pages.is_empty() {
            return;
        }
        if self.writes_off() {
            self.counts
                .dropped_writes
                .fetch_add(pages.len() as u64, Ordering::Relaxed);
            return;
        }
        let refuse = |why: &str| {
            tracing::debug!(server = %pages[0].key.server, method = %pages[0].key.method, why, "list not shared");
            self.counts
                .dropped_writes
                .fetch_add(pages.len() as u64, Ordering::Relaxed);
        };
        if pages
            .iter()
            .any(|p| p.key.scope != "public" || !self.in_use(&p.key.server))
        {
            return;
        }
        // Refused before it is serialized and signed (up to `max_list_bytes`) when its
        // pages alone would not fit what waits.
        let estimate: u64 = pages.iter().map(|p| p.bytes as u64).sum();
        if self.pending_bytes.load(Ordering::Relaxed) + estimate > MAX_QUEUED_BYTES {
            return refuse("the write queue is full");
        }
        let now = unix_ms();
        let mut writes = Vec::with_capacity(pages.len());
        for page in pages {
            // A cursor is the server's to choose, and written beside the page: with a
            // long one the entry outgrows what a lookup reads (checked exactly below).
            let cursor = page.key.param.as_ref().map_or(0, String::len);
            if page.bytes > self.config.max_entry_bytes
                || page.bytes.saturating_add(cursor) > self.entry_limit()
            {
                return refuse("a page past max_entry_bytes");
            }
            // Fresh for what is left of its ttl since it arrived.
            let expires = page
                .received_unix_ms
                .saturating_add(page.ttl.as_millis().min(u128::from(u64::MAX)) as u64);
            let ms = expires.saturating_sub(now);
            if ms == 0 {
                return refuse("a page expired already");
            }
            let stored = serde_json::json!({
                "generation": generation,
                "expires_ms": expires,
                "server": page.key.server,
                "fingerprint": self.fingerprint_tag(&page.key.fingerprint),
                "client": page.key.client,
                "protocol": protocol,
                "method": page.key.method,
                "cursor": page.key.param,
                "page": &*page.value,
            });
            let redis_key = self.redis_key(&page.key, protocol);
            let Ok(body) = serde_json::to_vec(&stored) else {
                return refuse("a page that does not serialize");
            };
            let body = seal_entry(self.key.as_deref(), &redis_key, body);
            // Written, it could never be read back (a lookup reads `entry_limit` bytes).
            if body.len() > self.entry_limit() {
                return refuse("a page too long with its key");
            }
            writes.push((redis_key, body, ms));
        }
        // Queued, the whole list counts against the queue's bounds.
        let size: u64 = writes.iter().map(|(_, body, _)| body.len() as u64).sum();
        let pages = writes.len() as u64;
        // Taken, then checked: puts at once cannot each see room for one and all go.
        let bytes_before = self.pending_bytes.fetch_add(size, Ordering::SeqCst);
        let pages_before = self.pending.fetch_add(pages, Ordering::SeqCst);
        if bytes_before + size > MAX_QUEUED_BYTES || pages_before + pages > MAX_QUEUED_WRITES as u64
        {
            self.pending.fetch_sub(pages, Ordering::SeqCst);
            self.pending_bytes.fetch_sub(size, Ordering::SeqCst);
            return refuse("the write queue is full");
        }
        if self.writes.try_send(writes).is_err() {
            self.pending.fetch_sub(pages, Ordering::SeqCst);
            self.pending_bytes.fetch_sub(size, Ordering::SeqCst);
            refuse("the write queue is full");
        }
    }

    /// Writes what was taken from the queue, in pipelines of at most
    /// [`PIPELINE_BYTES`] (a failed one is dropped: it is only a cache).
    async fn write_batch(&self, batch: &[Write]) {
        let bytes = |list: &Write| list.iter().map(|(_, body, _)| body.len()).sum::<usize>();
        let mut start = 0;
        while start < batch.len() {
            let mut end = start;
            let mut total = 0;
            while end < batch.len()
                && (end == start || total + bytes(&batch[end]) <= PIPELINE_BYTES)
            {
                total += bytes(&batch[end]);
                end += 1;
            }
            self.write_lists(&batch[start..end]).await;
            start = end;
        }
    }

    /// The bound on one background write: they are off every caller's path, so a
    /// slower bound than reads'.
    pub(crate) fn write_bound(&self) -> Duration {
        self.config.timeout.max(Duration::from_secs(1))
    }

    /// Writes whole lists in one transaction: should it time out or fail, none of them
    /// is in Redis, rather than some of a list's pages.
    async fn write_lists(&self, lists: &[Write]) {
        let bound = self.write_bound();
        let done: Option<()> = self
            .run_write(bound, async |mut conn| {
                let mut pipe = redis::pipe();
                pipe.atomic();
                for (key, body, ms) in lists.iter().flatten() {
                    pipe.cmd("SET")
                        .arg(key)
                        .arg(body)
                        .arg("PX")
                        .arg(*ms)
                        .ignore();
                }
                pipe.query_async(&mut conn).await
            })
            .await;
        let pages = lists.iter().map(Vec::len).sum::<usize>() as u64;
        if done.is_some() {
            self.counts.writes.fetch_add(pages, Ordering::Relaxed);
        }
        let bytes: u64 = lists
            .iter()
            .flatten()
            .map(|(_, body, _)| body.len() as u64)
            .sum();
        self.pending_bytes.fetch_sub(bytes, Ordering::SeqCst);
        self.pending.fetch_sub(pages, Ordering::SeqCst);
    }

    /// Moves `server` to a new generation in Redis (every page stored so far is no
    /// longer used, by any process) and tells the other processes to drop their copies
    /// (`INCR`, then `PUBLISH` naming the new generation). Does nothing for a server that is not shared. If Redis cannot
    /// be reached, the server's shared entries are left alone here and the invalidation
    /// is retried in the background until it goes through.
    pub async fn invalidate(self: &Arc<Self>, server: &str) {
        if !self.shares(server) {
            return;
        }
        // One being retried is sent once more after it goes through: its INCR may be
        // on its way already, and pages stored after it would stay.
        if let Some(asked) = self.unsent.lock().get_mut(server) {
            *asked += 1;
            return;
        }
        if self.send_invalidation(server).await {
            return;
        }
        {
            let mut unsent = self.unsent.lock();
            if let Some(asked) = unsent.get_mut(server) {
                *asked += 1;
                return; // being retried
            }
            unsent.insert(server.to_string(), 0);
        }
        // Should this process stop before a retry lands, the floor it keeps on disk is
        // past what Redis holds: its next start refuses the pages of before and moves
        // Redis past them.
        if let Some(top) = self.highest.lock().get_mut(server) {
            *top = top.saturating_add(1).min(i64::MAX as u64);
        }
        self.floors_rose();
        let (this, server) = (Arc::downgrade(self), server.to_string());
        tokio::spawn(async move {
            let mut waits = backoff();
            loop {
                tokio::time::sleep(waits.next().unwrap_or(MAX_BACKOFF)).await;
                let Some(layer) = this.upgrade() else { return };
                let asked = layer.unsent.lock().get(&server).copied().unwrap_or(0);
                if layer.send_invalidation(&server).await {
                    let mut unsent = layer.unsent.lock();
                    if unsent.get(&server) == Some(&asked) {
                        unsent.remove(&server);
                        return;
                    }
                    // Asked for again meanwhile: once more, soon.
                    waits = backoff();
                }
            }
        });
    }

    async fn send_invalidation(&self, server: &str) -> bool {
        let (channel, gen_key) = (self.config.channel(), self.generation_key(server));
        // Not skipped while the layer backs off: a lost invalidation leaves other
        // processes stale, so it is always tried, within the bound.
        let sent: Result<i64, _> = self
            .try_run(self.config.timeout, "invalidate", async |mut conn| {
                redis::cmd("INCR")
                    .arg(&gen_key)
                    .query_async(&mut conn)
                    .await
            })
            .await;
        let generation = match sent {
            Ok(generation) if u64::try_from(generation).is_ok_and(|g| g <= CEILING) => generation,
            // No integer there, or one INCR cannot add to (or past the ceiling): a new
            // random generation takes its place (no page was stored under it), else the
            // invalidation would be retried for ever and the server's pages never shared
            // again.
            Ok(_) | Err(RunFailure::BadValue) => {
                let fresh = random_generation();
                let set: Option<()> = self
                    .run("invalidate", async |mut conn| {
                        redis::cmd("SET")
                            .arg(&gen_key)
                            .arg(fresh)
                            .query_async(&mut conn)
                            .await
                    })
                    .await;
                if set.is_none() {
                    return false;
                }
                i64::try_from(fresh).unwrap_or(i64::MAX)
            }
            Err(RunFailure::Unavailable) => return false,
        };
        // The message names the generation: a peer that read it already (a read between
        // the INCR and the message) does not take the message for one step more, and
        // refuse that very generation as a rollback when it reads it next.
        let message = serde_json::to_string(&Changed {
            origin: self.origin.clone(),
            server: server.to_string(),
            generation: u64::try_from(generation).ok(),
        })
        .unwrap_or_default();
        // `Some(None)`: refused for want of rights (a user allowed keys but no channels).
        let published: Option<Option<i64>> = self
            .run("invalidate", async |mut conn| {
                match redis::cmd("PUBLISH")
                    .arg(&channel)
                    .arg(&message)
                    .query_async::<i64>(&mut conn)
                    .await
                {
                    Ok(heard) => Ok(Some(heard)),
                    Err(e) if e.code() == Some("NOPERM") => Ok(None),
                    Err(e) => Err(e),
                }
            })
            .await;
        match published {
            // Tried again: one more INCR costs nothing, a lost message leaves peers stale.
            None => return false,
            // The generation moved, which every lookup reads: as sent as it can be (a
            // peer under this user can subscribe no more than this process can publish,
            // and one retry after another would move the generation every 30 s).
            Some(None) => {
                if !self.publish_refused_said.swap(true, Ordering::Relaxed) {
                    tracing::warn!(url = %redacted(&self.config.url), "the shared cache's invalidations cannot be published (NOPERM): peers learn of changes from the generation at their next lookup, and lists kept in their memory are not dropped");
                }
            }
            Some(Some(_)) => {
                self.counts.published.fetch_add(1, Ordering::Relaxed);
            }
        }
        // What this process moved it to is the least it accepts from now on.
        if let Ok(generation) = u64::try_from(generation) {
            let mut highest = self.highest.lock();
            let top = highest.entry(server.to_string()).or_insert(0);
            *top = (*top).max(generation);
            drop(highest);
            self.floors_rose();
        }
        true
    }

    /// The Redis key of a refresh claim on `what` (which holds the fingerprint): with
    /// a key, its HMAC, as [`SharedCache::fingerprint_tag`] (a reader of Redis could
    /// otherwise test guesses of the secrets the fingerprint digests), which also keeps
    /// the claims of processes under another key apart.
    fn refresh_key(&self, what: &str) -> String {
        let tag = match self.key.as_deref() {
            Some(k) => hmac_sha256_hex(k, what.as_bytes()),
            None => sha256_hex(what.as_bytes()),
        };
        format!("{}:refresh:{tag}", self.config.prefix)
    }

    /// Claims the refresh of one list for `hold` among the processes sharing it (`SET
    /// NX PX`): true when this process should read it again (claimed, or Redis did not
    /// say), false when another one is doing it.
    pub async fn claim_refresh(&self, what: &str, hold: Duration) -> bool {
        if !self.usable() {
            return true;
        }
        let key = self.refresh_key(what);
        let ms = hold.as_millis().clamp(1, u128::from(u64::MAX)) as u64;
        let claimed: Option<Option<String>> = self
            .run("claim", async |mut conn| {
                redis::cmd("SET")
                    .arg(&key)
                    .arg(&self.origin)
                    .arg("NX")
                    .arg("PX")
                    .arg(ms)
                    .query_async(&mut conn)
                    .await
            })
            .await;
        !matches!(claimed, Some(None))
    }

    /// Listens for other processes' invalidations until the layer is dropped: `changed`
    /// is called with a server id for each one heard, and with every shared server
    /// after the subscription was re-established, or made late (changes may have been
    /// missed).
    pub fn listen(self: &Arc<Self>, changed: impl Fn(&str) + Send + Sync + 'static) {
        let client = self.client.clone();
        let channel = self.config.channel();
        let origin = self.origin.clone();
        let servers = self.config.servers.clone();
        let this = Arc::downgrade(self);
        let task = tokio::spawn(async move {
            let mut waits = backoff();
            // Whether a change may have gone unheard when the next subscription is made:
            // once one was made (it can only end) or could not be made (lists were
            // cached meanwhile, from the servers themselves).
            let mut may_have_missed = false;
            // A subscription refused or unanswered is said once until one is made (a
            // user without channel rights is refused every time).
            let mut said = false;
            loop {
                let connected = tokio::time::timeout(Duration::from_secs(2), async {
                    let mut pubsub = client.get_async_pubsub().await?;
                    pubsub.subscribe(&channel).await?;
                    Ok::<_, redis::RedisError>(pubsub)
                })
                .await;
                if let Some(this) = this.upgrade() {
                    // Refused: Redis answered the subscription with an error. A timeout
                    // or a connection lost says nothing of that: as it was.
                    let refused = match &connected {
                        Ok(Ok(_)) => false,
                        Ok(Err(e)) if e.code().is_some() => true,
                        _ => this.subscription_refused.load(Ordering::Acquire),
                    };
                    let was = this.subscription_refused.swap(refused, Ordering::AcqRel);
                    this.settled.store(true, Ordering::Release);
                    // Refused now: what was kept while a subscription was up (or while
                    // Redis could not be reached) is read from Redis from now on.
                    if refused && !was {
                        servers.iter().for_each(|s| changed(s));
                    }
                }
                match connected {
                    Ok(Ok(pubsub)) => {
                        said = false;
                        if may_have_missed {
                            tracing::info!(
                                "shared cache subscription (re-)established; shared lists are read again"
                            );
                            servers.iter().for_each(|s| changed(s));
                        }
                        may_have_missed = true;
                        let up = Instant::now();
                        let (mut sink, mut messages) = pubsub.split();
                        let mut ping = tokio::time::interval(SUBSCRIPTION_PING);
                        ping.tick().await;
                        loop {
                            let msg = tokio::select! {
                                msg = messages.next() => match msg {
                                    Some(msg) => msg,
                                    None => break,
                                },
                                _ = ping.tick() => {
                                    let pong = tokio::time::timeout(
                                        Duration::from_secs(2),
                                        sink.ping::<redis::Value>(),
                                    )
                                    .await;
                                    if !matches!(pong, Ok(Ok(_))) {
                                        break; // half open: subscribe again
                                    }
                                    continue;
                                }
                            };
                            let Some(this) = this.upgrade() else { return };
                            let heard: Option<Changed> = (msg.get_payload_bytes().len() <= 4096)
                                .then(|| serde_json::from_slice(msg.get_payload_bytes()).ok())
                                .flatten();
                            match heard {
                                Some(c) if c.origin == origin => {}
                                Some(c) if this.shares(&c.server) => {
                                    this.counts.received.fetch_add(1, Ordering::Relaxed);
                                    this.heard_invalidation(&c.server, c.generation);
                                    tracing::debug!(server = %c.server, "a peer dropped a shared server's lists");
                                    changed(&c.server);
                                }
                                Some(_) => {}
                                None => {
                                    this.reject(&channel, "an invalidation message that is not one")
                                }
                            }
                        }
                        tracing::debug!("shared cache subscription ended");
                        // Only a subscription that lasted starts the waits afresh: one
                        // Redis ends as soon as it is made (its pub/sub output limit, a
                        // `CLIENT KILL` in a loop) would otherwise be made again every
                        // 100 ms, each time dropping every shared server's entries.
                        if up.elapsed() >= SUBSCRIPTION_STEADY {
                            waits = backoff();
                        }
                    }
                    Ok(Err(e)) => {
                        may_have_missed = true;
                        if !std::mem::replace(&mut said, true) {
                            match e.code() {
                                Some(_) => {
                                    tracing::warn!(error = %e, "shared cache subscription refused: peers' changes go unheard, and shared lists are read from Redis each time until one is made")
                                }
                                None => {
                                    tracing::warn!(error = %e, "shared cache subscription failed: peers' changes go unheard until one is made, which drops what is kept meanwhile")
                                }
                            }
                        } else {
                            tracing::debug!(error = %e, "shared cache subscription failed");
                        }
                    }
                    Err(_) => {
                        may_have_missed = true;
                        if !std::mem::replace(&mut said, true) {
                            tracing::warn!(
                                "shared cache subscription timed out: peers' changes go unheard until one is made, which drops what is kept meanwhile"
                            );
                        } else {
                            tracing::debug!("shared cache subscription timed out");
                        }
                    }
                }
                if this.strong_count() == 0 {
                    return;
                }
                tokio::time::sleep(waits.next().unwrap_or(MAX_BACKOFF)).await;
            }
        });
        if let Some(old) = self.listener.lock().replace(task.abort_handle()) {
            old.abort();
        }
    }

    /// The counters.
    pub fn stats(&self) -> SharedStats {
        let c = &self.counts;
        SharedStats {
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            writes: c.writes.load(Ordering::Relaxed),
            dropped_writes: c.dropped_writes.load(Ordering::Relaxed),
            rejected: c.rejected.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            published: c.published.load(Ordering::Relaxed),
            received: c.received.load(Ordering::Relaxed),
            available: self.usable(),
        }
    }

    /// Waits (up to `limit`) for the background writes under way: a process that
    /// exits right after listing still leaves its lists to the others.
    pub async fn drain(&self, limit: Duration) {
        let until = crate::util::duration::after(Instant::now(), limit);
        while self.pending.load(Ordering::SeqCst) > 0 && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Writes the generation floors now, if they rose since the last write (the
    /// harness's shutdown, before [`Self::close`]).
    pub async fn write_floors(self: &Arc<Self>) {
        if self.floors.is_none() {
            return;
        }
        let this = self.clone();
        let _ = tokio::task::spawn_blocking(move || {
            if let Some(floors) = &this.floors {
                floors.write(&this);
            }
        })
        .await;
    }

    /// Stops listening (the harness is shutting down).
    pub fn close(&self) {
        let unsent = self.unsent.lock();
        if !unsent.is_empty() {
            let servers: Vec<&String> = unsent.keys().collect();
            tracing::warn!(
                ?servers,
                "shutting down with invalidations Redis never took"
            );
        }
        drop(unsent);
        if let Some(task) = self.listener.lock().take() {
            task.abort();
        }
    }
}

/// The writer: takes what is queued, up to a batch, and writes it as one pipeline;
/// ends with the layer.
async fn write_queue(layer: std::sync::Weak<SharedCache>, mut queue: mpsc::Receiver<Write>) {
    let mut batch = Vec::with_capacity(WRITE_BATCH);
    while queue.recv_many(&mut batch, WRITE_BATCH).await > 0 {
        let Some(layer) = layer.upgrade() else { return };
        layer.write_batch(&batch).await;
        batch.clear();
    }
}

impl Drop for SharedCache {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Past these, a Redis that drops packets would fail calls instead of being skipped,
    // and a page's read range would be refused by Redis (no page ever shared).
    #[test]
    fn a_timeout_or_entry_bound_past_what_works_is_refused() {
        let config = |timeout, max_entry_bytes| SharedConfig {
            timeout,
            max_entry_bytes,
            ..SharedConfig::new("redis://127.0.0.1:9", vec![])
        };
        assert!(config(Duration::from_secs(5), 64 << 20).validate().is_ok());
        for (timeout, max) in [
            (Duration::from_secs(3600), 1 << 20),
            (Duration::from_millis(50), i64::MAX as usize),
            (Duration::from_millis(50), (64 << 20) + 1),
        ] {
            assert!(
                config(timeout, max).validate().is_err(),
                "{timeout:?} {max}"
            );
        }
    }

    // Each names a server, and a folder of the disk layer that a change heard on the
    // channel empties: not a path out of the cache directory.
    #[test]
    fn a_shared_server_that_is_no_server_id_is_refused() {
        let config = |id: &str| SharedConfig::new("redis://127.0.0.1:9", vec![id.to_string()]);
        assert!(config("files").validate().is_ok());
        for bad in ["../elsewhere", "", "..", "a/b", "a__b"] {
            let refused = config(bad).validate().expect_err(bad);
            assert_eq!(refused.field, "servers", "{bad}");
        }
    }

    #[tokio::test]
    async fn a_refresh_claim_is_keyed_under_the_key_when_there_is_one() {
        let what = "s\nfingerprint\nversion\ntools/list";
        let unkeyed = SharedCache::new(SharedConfig::new("redis://127.0.0.1:9", vec![]), None)
            .expect("layer (connects lazily)");
        assert_eq!(
            unkeyed.refresh_key(what),
            format!("mcp-harness:refresh:{}", sha256_hex(what.as_bytes()))
        );
        let keyed = |secret: &str| {
            let dir = crate::util::scratch::Scratch::new("refresh-claim");
            std::fs::create_dir_all(&*dir).expect("dir");
            let path = dir.join("key");
            std::fs::write(&path, secret).expect("write");
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
            let mut config = SharedConfig::new("redis://127.0.0.1:9", vec![]);
            config.key_file = Some(path);
            SharedCache::new(config, None)
                .expect("layer")
                .refresh_key(what)
        };
        let (one, two) = (keyed(&"a".repeat(32)), keyed(&"b".repeat(32)));
        assert!(!one.contains(&sha256_hex(what.as_bytes())), "{one}");
        assert_ne!(one, two, "another key claims apart");
    }

    #[test]
    fn a_url_is_shown_without_its_password_wherever_it_is() {
        assert_eq!(
            redacted("redis://user:s3cret@10.0.0.1:6379/0"),
            "redis://[redacted]@10.0.0.1:6379/0"
        );
        assert_eq!(
            redacted("redis+unix:///run/redis.sock?db=1&pass=s3cret"),
            "redis+unix:///run/redis.sock?db=1&pass=[redacted]"
        );
        assert_eq!(
            redacted("redis+unix:///run/redis.sock?password=s3cret"),
            "redis+unix:///run/redis.sock?password=[redacted]"
        );
        assert_eq!(redacted("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        // Nor in the settings' `Debug`, which an embedder may log.
        let config = SharedConfig {
            url: "redis://user:s3cret@10.0.0.1:6379/0".into(),
            servers: vec!["a".into()],
            timeout: default_timeout(),
            max_entry_bytes: default_max_entry_bytes(),
            prefix: default_prefix(),
            key_file: None,
        };
        let shown = format!("{config:?}");
        assert!(
            !shown.contains("s3cret") && shown.contains("10.0.0.1"),
            "{shown}"
        );
        // A password no URL may hold is hidden too (the URL's refusal quotes it).
        // Nor does an `@` in a query's password pass for the user part's.
        assert_eq!(
            redacted("redis+unix:///run/redis.sock?pass=se@cret"),
            "redis+unix:///run/redis.sock?pass=[redacted]"
        );
        assert_eq!(
            redacted("redis://:p@ss@h:6379/0?db=1&password=a@b"),
            "redis://[redacted]@h:6379/0?db=1&password=[redacted]"
        );
        for url in ["redis://:pa?ss@h:6379", "redis://:p/a#s@h:6379/0"] {
            let shown = redacted(url);
            assert!(!shown.contains("pa") && !shown.contains("s@"), "{shown}");
            assert!(shown.starts_with("redis://[redacted]@h:6379"), "{shown}");
        }
    }

    /// A layer for `s` on an address nothing listens on (it connects lazily).
    fn unconnected() -> Arc<SharedCache> {
        let config = SharedConfig::new("redis://127.0.0.1:9", vec!["s".to_string()]);
        SharedCache::new(config, None).expect("layer (connects lazily)")
    }

    // A generation overtaken while its read was on its way (this process heard of an
    // invalidation meanwhile) is a plain miss; one below what was seen before the read
    // is a rollback, refused and moved past.
    // Commands in flight when Redis goes fail together: the layer is skipped for one
    // step of the backoff, not one step per command (eight made 100 ms 25 s).
    #[tokio::test]
    async fn commands_failing_together_take_one_step_of_the_backoff() {
        let layer = unconnected();
        for _ in 0..8 {
            layer.failed("read", "refused");
        }
        let skipped = layer
            .health
            .lock()
            .skip_until
            .map(|t| t.saturating_duration_since(Instant::now()));
        // The first step: 100 ms and its jitter (at most as much again).
        assert!(
            skipped.is_some_and(|d| d <= Duration::from_millis(200)),
            "{skipped:?}"
        );
    }

    #[tokio::test]
    async fn a_generation_overtaken_in_flight_is_a_miss_not_a_rollback() {
        let layer = unconnected();
        layer.highest.lock().insert("s".into(), 40);
        let seen = layer.before_read("s");
        layer.heard_invalidation("s", Some(41));
        let read = redis::Value::Int(40);
        let checked = layer.checked_generation("s", "k", &read, seen).await;
        assert_eq!(checked, None);
        assert_eq!(layer.stats().rejected, 0, "no rollback");
        let older = redis::Value::Int(39);
        let seen = Seen {
            highest: seen.highest,
            heard: 1,
        };
        let checked = layer.checked_generation("s", "k", &older, seen).await;
        assert_eq!(checked, None);
        assert_eq!(layer.stats().rejected, 1, "a rollback");
    }

    // A peer's message naming a generation this process read already (its read came
    // between the peer's INCR and the message) moves nothing: the next read of that
    // generation is a hit, not a rollback. Before, each message was one step more, and
    // that read was refused and Redis moved past the pages just written.
    #[tokio::test]
    async fn a_heard_generation_read_already_is_not_taken_for_one_more() {
        let layer = unconnected();
        layer.highest.lock().insert("s".into(), 10);
        let seen = layer.before_read("s");
        let read = redis::Value::Int(11);
        assert_eq!(
            layer.checked_generation("s", "k", &read, seen).await,
            Some(11)
        );
        layer.heard_invalidation("s", Some(11));
        let seen = layer.before_read("s");
        assert_eq!(
            layer.checked_generation("s", "k", &read, seen).await,
            Some(11)
        );
        assert_eq!(layer.stats().rejected, 0, "no rollback");
        // One further on is taken; one past the step, or none named (an earlier
        // version's message), is one step; a server not read yet takes none.
        layer.heard_invalidation("s", Some(15));
        assert_eq!(layer.highest_seen("s"), Some(15));
        layer.heard_invalidation("s", Some(15 + HEARD_STEP + 1));
        assert_eq!(layer.highest_seen("s"), Some(16));
        layer.heard_invalidation("s", None);
        assert_eq!(layer.highest_seen("s"), Some(17));
        layer.heard_invalidation("t", Some(5));
        assert_eq!(layer.highest_seen("t"), None);
        // A read under way when an invalidation of a server not read yet was heard may
        // hold the generation of before: a plain miss, and nothing is taken from it.
        let seen = layer.before_read("u");
        layer.heard_invalidation("u", Some(7));
        let read = redis::Value::Int(6);
        assert_eq!(layer.checked_generation("u", "k", &read, seen).await, None);
        assert_eq!(layer.highest_seen("u"), None);
        let seen = layer.before_read("u");
        let read = redis::Value::Int(7);
        assert_eq!(
            layer.checked_generation("u", "k", &read, seen).await,
            Some(7)
        );
        assert_eq!(layer.stats().rejected, 0);
    }

    // A change held (taken before this process drops its copies) keeps the server's
    // entries from being read or written until every hold is gone.
    #[tokio::test]
    async fn a_server_whose_change_is_held_is_not_read_or_written() {
        let layer = unconnected();
        assert!(layer.hold("other").is_none(), "not shared");
        assert!(layer.in_use("s"));
        let first = layer.hold("s").expect("shared");
        let second = layer.hold("s").expect("shared");
        assert!(!layer.in_use("s"));
        drop(first);
        assert!(!layer.in_use("s"), "one hold is left");
        drop(second);
        assert!(layer.in_use("s"));
    }

    // A floors file that holds no map is moved aside in a directory whose name is no
    // UTF-8 too (a name made through `display()` named no directory there).
    #[tokio::test]
    async fn a_corrupt_floors_file_is_moved_aside_under_a_name_that_is_no_utf8() {
        use std::os::unix::ffi::OsStrExt;
        let scratch = crate::util::scratch::Scratch::new("shared-floors-bytes");
        let dir = scratch.join(std::ffi::OsStr::from_bytes(b"d\xff"));
        std::fs::create_dir_all(&dir).expect("dir");
        let config = SharedConfig::new("redis://127.0.0.1:1".to_string(), vec!["s".to_string()]);
        let layer = SharedCache::new(config.clone(), Some(&dir)).expect("layer");
        let path = layer.floors.as_ref().expect("floors").path.clone();
        std::fs::write(&path, "not json").expect("write");
        let layer = SharedCache::new(config, Some(&dir)).expect("layer");
        layer.highest.lock().insert("s".into(), 15);
        layer.floors_rose();
        layer.write_floors().await;
        let kept: std::collections::HashMap<String, u64> =
            serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("JSON");
        assert_eq!(kept.get("s"), Some(&15));
        let aside = std::fs::read_dir(&dir)
            .expect("dir")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains(".corrupt-"))
            .count();
        assert_eq!(aside, 1);
    }

    #[tokio::test]
    async fn floors_on_disk_are_read_for_the_servers_shared_and_merged_upward() {
        use std::collections::HashMap;
        let dir = crate::util::scratch::Scratch::new("shared-floors");
        std::fs::create_dir_all(&dir).expect("dir");
        let config = SharedConfig::new("redis://127.0.0.1:1".to_string(), vec!["s".to_string()]);
        let layer = |config: &SharedConfig| {
            SharedCache::new(config.clone(), Some(&dir)).expect("layer (connects lazily)")
        };
        let first = layer(&config);
        let path = first
            .floors
            .as_ref()
            .expect("with a disk layer")
            .path
            .clone();
        // Another process sharing the directory keeps floors for s and for t.
        std::fs::write(&path, r#"{"s": 10, "t": 7}"#).expect("write");
        let second = layer(&config);
        assert_eq!(*second.highest.lock(), HashMap::from([("s".into(), 10)]));
        // This one rises for s: the higher of each is kept, t's too.
        second.highest.lock().insert("s".into(), 12);
        second.floors_rose();
        second.write_floors().await;
        let kept: HashMap<String, u64> =
            serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("JSON");
        assert_eq!(kept, HashMap::from([("s".into(), 12), ("t".into(), 7)]));
        // Another deployment (prefix) keeps its own file; garbage is not read.
        let other = layer(&SharedConfig {
            prefix: "other".into(),
            ..config.clone()
        });
        assert!(other.highest.lock().is_empty());
        // Garbage (a file cut short by a crash) is not used, and is moved aside (under
        // the lock, at the next write) so that the floors are kept again.
        std::fs::write(&path, "not json").expect("write");
        let cut = layer(&config);
        assert!(cut.highest.lock().is_empty());
        assert_eq!(
            std::fs::read(&path).expect("there"),
            b"not json",
            "not at start"
        );
        cut.highest.lock().insert("s".into(), 15);
        cut.floors_rose();
        cut.write_floors().await;
        let aside: Vec<_> = std::fs::read_dir(&*dir)
            .expect("dir")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains(".corrupt-"))
            .map(|e| e.path())
            .collect();
        assert_eq!(aside.len(), 1, "{aside:?}");
        assert_eq!(std::fs::read(&aside[0]).expect("kept"), b"not json");
        let kept: HashMap<String, u64> =
            serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("JSON");
        assert_eq!(kept, HashMap::from([("s".into(), 15)]));
        // A floor near overflow is not taken (it would leave INCR no room).
        std::fs::write(&path, format!(r#"{{"s": {}}}"#, i64::MAX)).expect("write");
        assert!(layer(&config).highest.lock().is_empty());
        // A file that cannot be read whole is neither used nor written over.
        std::fs::write(&path, vec![b' '; (MAX_FLOORS_FILE + 1) as usize]).expect("write");
        let third = layer(&config);
        assert!(third.highest.lock().is_empty());
        third.highest.lock().insert("s".into(), 20);
        third.floors_rose();
        third.write_floors().await;
        assert_eq!(
            std::fs::metadata(&path).expect("there").len(),
            MAX_FLOORS_FILE + 1
        );
        // A write that failed is tried again at the next (the shutdown's).
        std::fs::write(&path, r#"{"s": 10}"#).expect("write");
        let lock = path.with_extension("lock");
        let _ = std::fs::remove_file(&lock);
        std::fs::create_dir(&lock).expect("a directory where the lock goes");
        let fourth = layer(&config);
        fourth.highest.lock().insert("s".into(), 30);
        fourth.floors_rose();
        fourth.write_floors().await;
        std::fs::remove_dir(&lock).expect("rmdir");
        fourth.write_floors().await;
        let kept: HashMap<String, u64> =
            serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("JSON");
        assert_eq!(kept, HashMap::from([("s".into(), 30)]));
        drop(first);
    }

    // An invalidation that cannot reach Redis raises the floor kept on disk: a process
    // stopped before its retry lands refuses, at its next start, the generation it
    // could not move past.
    #[tokio::test]
    async fn an_invalidation_redis_did_not_get_raises_the_floor_kept_on_disk() {
        use std::collections::HashMap;
        let dir = crate::util::scratch::Scratch::new("shared-floors-unsent");
        std::fs::create_dir_all(&dir).expect("dir");
        let config = SharedConfig {
            timeout: Duration::from_millis(200),
            ..SharedConfig::new("redis://127.0.0.1:1", vec!["s".to_string()])
        };
        let layer = SharedCache::new(config, Some(&dir)).expect("layer (connects lazily)");
        layer.highest.lock().insert("s".into(), 40);
        layer.invalidate("s").await;
        assert!(!layer.in_use("s"), "retried in the background");
        layer.write_floors().await;
        let path = layer
            .floors
            .as_ref()
            .expect("with a disk layer")
            .path
            .clone();
        let kept: HashMap<String, u64> =
            serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("JSON");
        assert_eq!(kept, HashMap::from([("s".into(), 41)]));
    }

    // Another process holding the floors' lock (a lock of its own on the same file, as
    // `flock` counts them) holds this one's write until it lets go.
    #[tokio::test]
    async fn a_floors_write_waits_for_the_lock_another_holder_has() {
        use std::collections::HashMap;
        let dir = crate::util::scratch::Scratch::new("shared-floors-lock");
        std::fs::create_dir_all(&dir).expect("dir");
        let config = SharedConfig::new("redis://127.0.0.1:1".to_string(), vec!["s".to_string()]);
        let layer = SharedCache::new(config, Some(&dir)).expect("layer (connects lazily)");
        let path = layer
            .floors
            .as_ref()
            .expect("with a disk layer")
            .path
            .clone();
        let other = crate::util::lock::open(&path.with_extension("lock")).expect("open");
        assert!(crate::util::lock::exclusive(&other, false).expect("lock"));
        layer.highest.lock().insert("s".into(), 5);
        layer.floors_rose();
        let writing = tokio::spawn({
            let layer = layer.clone();
            async move { layer.write_floors().await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!path.exists(), "written while another held the lock");
        drop(other);
        tokio::time::timeout(Duration::from_secs(10), writing)
            .await
            .expect("written once the lock is free")
            .expect("join");
        let kept: HashMap<String, u64> =
            serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("JSON");
        assert_eq!(kept, HashMap::from([("s".into(), 5)]));
    }

    #[test]
    fn generations_are_read_only_as_redis_writes_integers() {
        assert_eq!(canonical_generation(b"0"), Some(0));
        assert_eq!(canonical_generation(b"42"), Some(42));
        assert_eq!(
            canonical_generation(b"9223372036854775807"),
            Some(i64::MAX as u64)
        );
        for odd in [
            &b""[..],
            b"00001",
            b"+1",
            b"-1",
            b" 1",
            b"1.0",
            b"9223372036854775808",
            b"18446744073709551615",
            b"abc",
        ] {
            assert_eq!(canonical_generation(odd), None, "{odd:?}");
        }
    }

    #[test]
    fn an_entry_opens_only_under_its_key_and_redis_key_and_odd_ones_never_panic() {
        let (key, other) = (b"k".repeat(32), b"o".repeat(32));
        let entry = seal_entry(Some(&key), "p:list:s:1", b"{\"a\":1}".to_vec());
        assert!(entry.starts_with(b"mac1:"));
        assert_eq!(
            open_entry(Some(&key), "p:list:s:1", &entry),
            Some(&b"{\"a\":1}"[..])
        );
        assert_eq!(open_entry(Some(&other), "p:list:s:1", &entry), None);
        assert_eq!(open_entry(Some(&key), "q:list:s:1", &entry), None, "moved");
        let mut changed = entry.clone();
        *changed.last_mut().expect("body") = b'}';
        changed.push(b' ');
        assert_eq!(open_entry(Some(&key), "p:list:s:1", &changed), None);
        // Unsigned, cut short, without the newline, a bad or uppercase tag.
        let tag = &entry[5..69];
        let odd: Vec<Vec<u8>> = vec![
            b"{\"a\":1}".to_vec(),
            b"mac1:".to_vec(),
            b"mac1".to_vec(),
            Vec::new(),
            entry[..40].to_vec(),
            entry[..69].to_vec(),
            [b"mac1:", tag, b"{\"a\":1}"].concat(),
            [
                b"mac1:",
                tag.to_ascii_uppercase().as_slice(),
                b"\n{\"a\":1}",
            ]
            .concat(),
            [b"mac1:", &[b'z'; 64][..], b"\n{\"a\":1}"].concat(),
            [b"mac1:", &tag[..63], b"\n\n{\"a\":1}"].concat(),
        ];
        for bytes in &odd {
            assert_eq!(
                open_entry(Some(&key), "p:list:s:1", bytes),
                None,
                "{bytes:?}"
            );
        }
        // Without a key, entries are the bodies as they are.
        let plain = seal_entry(None, "p:list:s:1", b"{}".to_vec());
        assert_eq!(plain, b"{}");
        assert_eq!(open_entry(None, "p:list:s:1", &plain), Some(&b"{}"[..]));
    }
}
