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
    /// The scopes granted (or, when the server did not say, requested).
    pub scopes: Vec<String>,
    /// The authorization server that issued it.
    pub issuer: String,
    /// Its token endpoint, for refreshing.
    pub token_endpoint: String,
    /// The client it was issued to.
    pub client: ClientIdentity,
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

/// Tokens in files under a directory (`0700`), one `0600` file per key.
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

    fn ensure_dir(&self) -> Result<(), String> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(|e| format!("{}: {e}", self.dir.display()))?;
        std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("{}: {e}", self.dir.display()))
    }
}

impl TokenStore for FileTokenStore {
    fn get(&self, key: &TokenKey) -> Result<Option<Token>, String> {
        let path = self.path(key)?;
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        // A file that does not parse, or is for another key, is not ours to use.
        Ok(serde_json::from_slice::<Stored>(&bytes)
            .ok()
            .filter(|s| &s.key == key)
            .map(|s| s.token))
    }

    fn put(&self, key: &TokenKey, token: &Token) -> Result<(), String> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        self.ensure_dir()?;
        let path = self.path(key)?;
        let bytes = serde_json::to_vec(&Stored {
            key: key.clone(),
            token: token.clone(),
        })
        .map_err(|e| e.to_string())?;
        // Written whole to a private temporary file, then renamed over the old one.
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| format!("{}: {e}", tmp.display()))?;
        file.write_all(&bytes)
            .and_then(|()| file.sync_all())
            .map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))
    }

    fn remove(&self, key: &TokenKey) -> Result<(), String> {
        match std::fs::remove_file(self.path(key)?) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.to_string()),
            _ => Ok(()),
        }
    }

    fn remove_server(&self, server: &str) -> Result<usize, String> {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return Ok(0);
        };
        let mut removed = 0;
        for entry in dir.flatten() {
            let path = entry.path();
            let ours = std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<Stored>(&b).ok())
                .is_some_and(|s| s.key.server == server);
            if ours && std::fs::remove_file(&path).is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(access: &str) -> Token {
        Token {
            access_token: access.into(),
            refresh_token: Some("r".into()),
            expires_at_ms: None,
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

    #[test]
    fn debug_never_shows_a_token_or_a_secret() {
        let shown = format!("{:?}", token("very-secret-access"));
        assert!(
            !shown.contains("very-secret-access") && !shown.contains("s3cret"),
            "{shown}"
        );
    }
}
