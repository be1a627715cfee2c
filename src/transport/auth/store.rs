//! Where tokens live: a [`TokenStore`], in memory by default, or in files (`0600` in a
//! `0700` directory, one file per key, named by a hash of the key) under the cache
//! directory, so that a restarted harness or a later CLI run is still signed in.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::util::hash::sha256_hex;

/// Which token: one per server, resource and auth context. The issuer is in the
/// [`Token`]; a token is refreshed only by the issuer `auth.issuer` pins (if set) and at
/// a token endpoint sign-in would accept now, else it is forgotten and sign-in runs
/// again.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TokenKey {
    /// The server's id.
    pub server: String,
    /// The resource it was issued for (the server's URL, as its metadata names it).
    pub resource: String,
    /// The caller's auth context (`None`: the harness's own sign-in).
    pub identity: Option<String>,
}

/// How the client authenticates at the token endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientAuth {
    /// HTTP Basic with the id and secret.
    ClientSecretBasic,
    /// The id and secret in the form body.
    ClientSecretPost,
    /// A public client: the id in the body, no secret.
    None,
}

/// The client identity a token was obtained with (needed to refresh it).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientIdentity {
    /// `client_id` (for a metadata document, its URL).
    pub client_id: String,
    /// The secret, for a confidential client.
    pub client_secret: Option<String>,
    /// How it authenticates.
    pub auth: ClientAuth,
}

impl std::fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientIdentity")
            .field("client_id", &self.client_id)
            .field(
                "client_secret",
                &self.client_secret.as_ref().map(|_| "[redacted]"),
            )
            .field("auth", &self.auth)
            .finish()
    }
}

/// One signed-in session's tokens. Its `Debug` never shows a token.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Token {
    /// The bearer token.
    pub access_token: String,
    /// The refresh token, if one was issued (replaced when the server rotates it).
    pub refresh_token: Option<String>,
    /// When the access token expires (unix milliseconds), if the server said.
    pub expires_at_ms: Option<u64>,
    /// When it was issued (unix milliseconds; none in tokens kept by older versions):
    /// a short-lived token is not refreshed on every request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issued_at_ms: Option<u64>,
    /// The scopes granted (or, when the server did not say, requested).
    pub scopes: Vec<String>,
    /// The authorization server that issued it.
    pub issuer: String,
    /// Its token endpoint, for refreshing.
    pub token_endpoint: String,
    /// The client it was issued to.
    pub client: ClientIdentity,
    /// The `resource` the grant was for, asked for again when it is refreshed, so a
    /// process that restarts asks for the same without discovering it first (a token
    /// kept by an older version has none: the discovered resource, else the server's
    /// URL, is sent then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("access_token", &"[redacted]")
            .field(
                "refresh_token",
                &self.refresh_token.as_ref().map(|_| "[redacted]"),
            )
            .field("expires_at_ms", &self.expires_at_ms)
            .field("scopes", &self.scopes)
            .field("issuer", &self.issuer)
            .finish()
    }
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Token {
    /// Whether it is due for a refresh: it expires within `margin`, and has been held
    /// for a second at least (a token that lives `margin` or less would otherwise be
    /// refreshed at every request; so it is at most once a second).
    pub fn refresh_due(&self, margin: Duration) -> bool {
        let margin = match (self.issued_at_ms, self.expires_at_ms) {
            (Some(issued), Some(expires)) => {
                let life = Duration::from_millis(expires.saturating_sub(issued));
                margin.min(life.saturating_sub(Duration::from_secs(1)))
            }
            _ => margin,
        };
        self.expires_within(margin)
    }

    /// Whether it expires within `margin` (a token with no expiry never does).
    pub fn expires_within(&self, margin: Duration) -> bool {
        self.expires_at_ms
            .is_some_and(|at| at <= now_ms().saturating_add(margin.as_millis() as u64))
    }
}

/// Keeps tokens. Implementations must be safe to call from many tasks; a write returns
/// only once the token is kept (a rotated refresh token is stored before it is used).
pub trait TokenStore: Send + Sync + 'static {
    /// The token for `key`, if any.
    fn get(&self, key: &TokenKey) -> Result<Option<Token>, String>;
    /// Keeps `token` for `key`, replacing any.
    fn put(&self, key: &TokenKey, token: &Token) -> Result<(), String>;
    /// Forgets `key`'s token.
    fn remove(&self, key: &TokenKey) -> Result<(), String>;
    /// Forgets every token of `server` (sign-out).
    fn remove_server(&self, server: &str) -> Result<usize, String>;

    /// Tries, without waiting, to take the lock that keeps processes sharing this
    /// store from refreshing `key`'s token at the same time: a refresh rotates the
    /// refresh token, so of two at once one fails and its process signs in again.
    /// A store only one process uses has none ([`RenewalLock::None`]).
    fn try_lock_renewal(&self, key: &TokenKey) -> Result<RenewalLock, String> {
        let _ = key;
        Ok(RenewalLock::None)
    }
}

/// What [`TokenStore::try_lock_renewal`] found.
pub enum RenewalLock {
    /// Taken: other processes wait until it is dropped.
    Held(Box<dyn Send + Sync>),
    /// Another process holds it: try again shortly.
    Busy,
    /// The store has no lock across processes.
    None,
}

/// Tokens in memory: the default; gone when the process ends.
#[derive(Default)]
pub struct MemoryTokenStore {
    tokens: Mutex<HashMap<TokenKey, Token>>,
}

impl TokenStore for MemoryTokenStore {
    fn get(&self, key: &TokenKey) -> Result<Option<Token>, String> {
        Ok(self.tokens.lock().get(key).cloned())
    }
    fn put(&self, key: &TokenKey, token: &Token) -> Result<(), String> {
        self.tokens.lock().insert(key.clone(), token.clone());
        Ok(())
    }
    fn remove(&self, key: &TokenKey) -> Result<(), String> {
        self.tokens.lock().remove(key);
        Ok(())
    }
    fn remove_server(&self, server: &str) -> Result<usize, String> {
        let mut tokens = self.tokens.lock();
        let before = tokens.len();
        tokens.retain(|k, _| k.server != server);
        Ok(before - tokens.len())
    }
}

/// The largest token file read (a token, its refresh token and 64 scopes fit many
/// times over).
const MAX_TOKEN_FILE: u64 = 1 << 20;

/// Tokens in files under a directory (`0700`), one `0600` file per key; a file there
/// that is not this user's, `0600`, is refused, not used.
pub struct FileTokenStore {
    dir: PathBuf,
}

#[derive(Serialize, Deserialize)]
struct Stored {
    key: TokenKey,
    token: Token,
}

impl FileTokenStore {
    /// A store in `dir` (created `0700` when first written).
    pub fn new(dir: impl Into<PathBuf>) -> FileTokenStore {
        FileTokenStore { dir: dir.into() }
    }

    fn path(&self, key: &TokenKey) -> Result<PathBuf, String> {
        let name = serde_json::to_vec(key).map_err(|e| e.to_string())?;
        Ok(self.dir.join(format!("{}.json", &sha256_hex(&name)[..32])))
    }

    /// Makes the directory, or checks the one there: this user's, not a link (the mode
    /// is set through the opened directory, so a link swapped in for it never has its
    /// target's mode changed), and private.
    fn ensure_dir(&self) -> Result<(), String> {
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
        let failed = |e: std::io::Error| format!("{}: {e}", self.dir.display());
        crate::util::private_dirs(&self.dir).map_err(failed)?;
        let dir = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(&self.dir)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP | libc::ENOTDIR) => format!(
                    "{}: not a directory (a link is not followed)",
                    self.dir.display()
                ),
                _ => failed(e),
            })?;
        let meta = dir.metadata().map_err(failed)?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != me {
            return Err(format!(
                "{}: owned by uid {}, not this user",
                self.dir.display(),
                meta.uid()
            ));
        }
        if meta.mode() & 0o077 != 0 {
            dir.set_permissions(std::fs::Permissions::from_mode(0o700))
                .map_err(failed)?;
        }
        Ok(())
    }
}

impl TokenStore for FileTokenStore {
    fn get(&self, key: &TokenKey) -> Result<Option<Token>, String> {
        let path = self.path(key)?;
        // A file that is for another key is not ours to use.
        Ok(crate::util::blocking(|| read_checked(&path))?
            .filter(|s| &s.key == key)
            .map(|s| s.token))
    }

    fn put(&self, key: &TokenKey, token: &Token) -> Result<(), String> {
        // Synced before it is renamed: the disk may take a while.
        crate::util::blocking(|| self.write(key, token))
    }

    fn remove(&self, key: &TokenKey) -> Result<(), String> {
        let path = self.path(key)?;
        match crate::util::blocking(|| std::fs::remove_file(path)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.to_string()),
            _ => Ok(()),
        }
    }

    /// An advisory lock (`flock`) on a `.lock` file beside the token's, made `0600`
    /// and held to the same checks as a token file.
    fn try_lock_renewal(&self, key: &TokenKey) -> Result<RenewalLock, String> {
        crate::util::blocking(|| self.lock_renewal(key))
    }

    fn remove_server(&self, server: &str) -> Result<usize, String> {
        crate::util::blocking(|| self.remove_files_of(server))
    }
}

impl FileTokenStore {
    fn write(&self, key: &TokenKey, token: &Token) -> Result<(), String> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        self.ensure_dir()?;
        let path = self.path(key)?;
        let bytes = serde_json::to_vec(&Stored {
            key: key.clone(),
            token: token.clone(),
        })
        .map_err(|e| e.to_string())?;
        // Not written if it could not be read back: it would read as no token.
        if bytes.len() as u64 > MAX_TOKEN_FILE {
            return Err(format!(
                "a token file of {} bytes, over the {} KiB one is read up to",
                bytes.len(),
                MAX_TOKEN_FILE / 1024
            ));
        }
        // Written whole to a private temporary file, then renamed over the old one. The
        // file is new (`create_new`: no link followed) and its name this write's own:
        // two writes of one key at once, in one process or two, never share one.
        let mut unique = [0u8; 8];
        getrandom::fill(&mut unique).map_err(|e| e.to_string())?;
        let unique = u64::from_le_bytes(unique);
        let tmp = path.with_extension(format!("tmp{}.{unique:016x}", std::process::id()));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| format!("{}: {e}", tmp.display()))?;
        let written = file
            .write_all(&bytes)
            .and_then(|()| file.sync_all())
            .map_err(|e| format!("{}: {e}", tmp.display()))
            .and_then(|()| {
                std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))
            });
        if written.is_ok() {
            // The rename made durable too: lost in a power cut, the old file (a spent
            // refresh token, whose reuse an authorization server may answer by revoking
            // them all) would come back. The token is written either way: a filesystem
            // that cannot sync a directory is said once, not taken for a failed write.
            if let Err(e) = std::fs::File::open(&self.dir).and_then(|d| d.sync_all()) {
                static UNSYNCED: crate::util::log_budget::LogBudget =
                    crate::util::log_budget::LogBudget::new();
                if UNSYNCED.log().is_some_and(|n| n == 1) {
                    tracing::warn!(dir = %self.dir.display(), error = %e, "the token store's directory could not be synced; a token written may not survive a power cut");
                }
            }
        }
        if written.is_err() {
            // A half-written secret is not left behind (a full disk would add one per try).
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }

    fn lock_renewal(&self, key: &TokenKey) -> Result<RenewalLock, String> {
        self.ensure_dir()?;
        let path = self.path(key)?.with_extension("lock");
        let failed = |e: std::io::Error| format!("{}: {e}", path.display());
        let refused = |e: String| format!("{}: {e}", path.display());
        let file = crate::util::lock::open(&path).map_err(failed)?;
        crate::util::secret::checked_private(&file).map_err(refused)?;
        // Released when the file is closed: when the guard drops, or the process ends.
        match crate::util::lock::exclusive(&file, false).map_err(failed)? {
            true => Ok(RenewalLock::Held(Box::new(file))),
            false => Ok(RenewalLock::Busy),
        }
    }

    fn remove_files_of(&self, server: &str) -> Result<usize, String> {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return Ok(0);
        };
        let mut removed = 0;
        for entry in dir.flatten() {
            let path = entry.path();
            // Read as `get` reads: no link followed, no FIFO waited on, bounded.
            let ours = read_checked(&path)
                .ok()
                .flatten()
                .is_some_and(|s| s.key.server == server);
            if ours && std::fs::remove_file(&path).is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }
}

/// The token file at `path`, read only if it is one this user wrote as `put` does: in a
/// directory others can write (one made before us in /tmp, say), a planted token would
/// be sent, and refreshed at the endpoint it names. A link is not followed, a FIFO not
/// waited on, and at most [`MAX_TOKEN_FILE`] bytes are read. `None` when there is no
/// file or it does not parse.
fn read_checked(path: &std::path::Path) -> Result<Option<Stored>, String> {
    use std::io::Read;
    let Some((file, _)) =
        crate::util::secret::open_private(path).map_err(|e| format!("{}: {e}", path.display()))?
    else {
        return Ok(None);
    };
    let mut bytes = Vec::new();
    file.take(MAX_TOKEN_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // Cut short, it would parse as nothing: not "no token" (which drops the one held).
    if bytes.len() as u64 > MAX_TOKEN_FILE {
        return Err(format!(
            "{}: over {} KiB, not read",
            path.display(),
            MAX_TOKEN_FILE / 1024
        ));
    }
    Ok(serde_json::from_slice::<Stored>(&bytes).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_lived_token_is_due_only_after_its_first_second() {
        let now = now_ms();
        let aged = |life_ms: u64, held_ms: u64| Token {
            issued_at_ms: Some(now - held_ms),
            expires_at_ms: Some(now - held_ms + life_ms),
            ..token("a")
        };
        let margin = Duration::from_secs(30);
        // Ten seconds of life: not at once, after a second, and when it expires.
        assert!(!aged(10_000, 0).refresh_due(margin));
        assert!(!aged(10_000, 800).refresh_due(margin));
        assert!(aged(10_000, 1_200).refresh_due(margin));
        // An hour: 30 s ahead, as before.
        assert!(!aged(3_600_000, 3_500_000).refresh_due(margin));
        assert!(aged(3_600_000, 3_580_000).refresh_due(margin));
        // Kept by an older version (no issue time): 30 s ahead.
        let old = Token {
            issued_at_ms: None,
            ..aged(10_000, 0)
        };
        assert!(old.refresh_due(margin));
        // Expired is due whatever its life.
        assert!(aged(0, 0).refresh_due(margin));
    }

    fn token(access: &str) -> Token {
        Token {
            resource: None,
            access_token: access.into(),
            refresh_token: Some("r".into()),
            expires_at_ms: None,
            issued_at_ms: None,
            scopes: vec![],
            issuer: "https://as".into(),
            token_endpoint: "https://as/token".into(),
            client: ClientIdentity {
                client_id: "c".into(),
                client_secret: Some("s3cret".into()),
                auth: ClientAuth::ClientSecretBasic,
            },
        }
    }

    #[test]
    fn a_token_directory_that_is_a_link_is_refused_and_its_target_left_as_it_was() {
        use std::os::unix::fs::PermissionsExt;
        let dir = crate::util::scratch::Scratch::new("tokens-link");
        std::fs::create_dir_all(&*dir).expect("mkdir");
        let victim = dir.join("victim");
        std::fs::create_dir(&victim).expect("mkdir");
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let link = dir.join("tokens");
        std::os::unix::fs::symlink(&victim, &link).expect("link");
        let key = TokenKey {
            server: "s".into(),
            resource: "https://s/mcp".into(),
            identity: None,
        };
        let refused = FileTokenStore::new(&link).put(&key, &token("a"));
        assert!(refused.is_err_and(|e| e.contains("link")));
        let mode = std::fs::metadata(&victim)
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755, "the link's target keeps its mode");
        assert_eq!(std::fs::read_dir(&victim).expect("dir").count(), 0);
        // A directory of ours that others may read is made private.
        let open = dir.join("open");
        std::fs::create_dir(&open).expect("mkdir");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        FileTokenStore::new(&open)
            .put(&key, &token("a"))
            .expect("put");
        let mode = std::fs::metadata(&open).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn a_file_store_keeps_tokens_per_key_privately_and_forgets_a_server() {
        use std::os::unix::fs::PermissionsExt;
        let dir = crate::util::scratch::Scratch::new("tokens");
        let store = FileTokenStore::new(&*dir);
        let key = |server: &str, who: Option<&str>| TokenKey {
            server: server.into(),
            resource: "https://s/mcp".into(),
            identity: who.map(String::from),
        };
        store
            .put(&key("s", Some("alice")), &token("a"))
            .expect("put");
        store.put(&key("s", Some("bob")), &token("b")).expect("put");
        store.put(&key("t", None), &token("t")).expect("put");
        assert_eq!(
            store
                .get(&key("s", Some("alice")))
                .expect("get")
                .map(|t| t.access_token),
            Some("a".into())
        );
        assert_eq!(
            store
                .get(&key("s", Some("bob")))
                .expect("get")
                .map(|t| t.access_token),
            Some("b".into())
        );
        assert_eq!(store.get(&key("s", None)).expect("get"), None);
        let mode = std::fs::metadata(&dir).expect("dir").permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        for f in std::fs::read_dir(&dir).expect("dir").flatten() {
            assert_eq!(
                f.metadata().expect("meta").permissions().mode() & 0o777,
                0o600
            );
        }
        assert_eq!(store.remove_server("s").expect("remove"), 2);
        assert_eq!(store.get(&key("s", Some("alice"))).expect("get"), None);
        assert!(store.get(&key("t", None)).expect("get").is_some());
        let _ = std::fs::remove_dir_all(dir);
    }

    // A token file is never written larger than it is read back, and one larger (an
    // older version's, or grown by hand) is an error, not "no token".
    #[test]
    fn a_token_file_past_its_bound_is_neither_written_nor_read_as_none() {
        use std::io::Write;
        let dir = crate::util::scratch::Scratch::new("tokens-large");
        let store = FileTokenStore::new(&*dir);
        let key = TokenKey {
            server: "s".into(),
            resource: "https://s/mcp".into(),
            identity: None,
        };
        let mut large = token("a");
        large.issuer = format!(
            "https://idp.example/{}",
            "x".repeat(MAX_TOKEN_FILE as usize)
        );
        let e = store.put(&key, &large).expect_err("too large to read back");
        assert!(e.contains("KiB"), "{e}");
        assert_eq!(store.get(&key).expect("get"), None, "nothing written");
        store.put(&key, &token("a")).expect("put");
        let path = store.path(&key).expect("path");
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("open");
        file.write_all(&vec![b' '; MAX_TOKEN_FILE as usize])
            .expect("grow");
        let e = store.get(&key).expect_err("over its bound");
        assert!(e.contains("not read"), "{e}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_token_file_others_could_have_written_or_a_link_is_refused_not_used() {
        use std::os::unix::fs::PermissionsExt;
        let dir = crate::util::scratch::Scratch::new("tokens-planted");
        let store = FileTokenStore::new(&*dir);
        let key = TokenKey {
            server: "s".into(),
            resource: "https://s/mcp".into(),
            identity: None,
        };
        store.put(&key, &token("a")).expect("put");
        let path = store.path(&key).expect("path");
        // Group- or world-writable: someone else may have put it there.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let refused = store.get(&key);
        assert!(refused.is_err(), "{refused:?}");
        // A link to a token file, planted under the name this key's file takes.
        let elsewhere = dir.join("elsewhere.json");
        std::fs::rename(&path, &elsewhere).expect("move");
        std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o600))
            .expect("chmod");
        std::os::unix::fs::symlink(&elsewhere, &path).expect("link");
        let refused = store.get(&key);
        assert!(refused.is_err(), "{refused:?}");
        // `put` replaces the link with a file of its own and does not write through it.
        std::fs::remove_file(&path).expect("unlink");
        std::os::unix::fs::symlink(&elsewhere, &path).expect("link");
        store.put(&key, &token("b")).expect("put");
        assert!(!std::fs::symlink_metadata(&path).expect("meta").is_symlink());
        let kept: Stored = serde_json::from_slice(&std::fs::read(&elsewhere).expect("read"))
            .expect("the linked file as it was");
        assert_eq!(kept.token.access_token, "a");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn writes_of_one_key_at_once_never_mix() {
        let dir = crate::util::scratch::Scratch::new("tokens-racing");
        let store = std::sync::Arc::new(FileTokenStore::new(&*dir));
        let key = TokenKey {
            server: "s".into(),
            resource: "https://s/mcp".into(),
            identity: None,
        };
        let writers: Vec<_> = (0..8)
            .map(|i| {
                let (store, key) = (store.clone(), key.clone());
                std::thread::spawn(move || {
                    for j in 0..50 {
                        let mut t = token(&format!("w{i}-{j}"));
                        // Of different lengths, so that a mixed write would not parse.
                        t.scopes = vec!["s".repeat(i * 100 + j)];
                        store.put(&key, &t).expect("put");
                        store.get(&key).expect("get").expect("a whole token");
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().expect("writer");
        }
        let left: Vec<_> = std::fs::read_dir(&*dir)
            .expect("dir")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left.len(), 1, "no temporary file left: {left:?}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn debug_never_shows_a_token_or_a_secret() {
        let shown = format!("{:?}", token("very-secret-access"));
        assert!(
            !shown.contains("very-secret-access") && !shown.contains("s3cret"),
            "{shown}"
        );
    }
}
