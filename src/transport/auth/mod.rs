//! Sign-in for remote servers: the client side of MCP authorization (2026-07-28),
//! OAuth 2.1 as that spec profiles it, written against the RFCs (no OAuth crate: the
//! MCP-specific parts are most of it, and owning the HTTP lets every request be bounded,
//! never redirected, and never carry a token where it should not).
//!
//! On a 401 the server's `WWW-Authenticate` leads to its protected resource metadata and
//! to its authorization server ([`discovery`]). The client identity is, in the spec's
//! order, a pre-registered one, a Client ID Metadata Document, or Dynamic Client
//! Registration. The grant is the authorization code with PKCE (S256), `state`, the
//! `resource` parameter on both legs and the `iss` check on the way back (RFC 9207), or
//! client credentials for unattended use. Tokens are refreshed before they expire, one
//! refresh in flight per token, rotated as the server rotates them; a 403
//! `insufficient_scope` asks again with the union of scopes, a bounded number of times.
//!
//! Tokens belong to (server, resource, auth context): two callers signed in as two
//! people never share one. A token only ever goes to the server's own endpoint (the
//! transport sends it; redirects are not followed), never to discovery, registration or
//! token requests, never into a log or an audit record.

pub mod authorizer;
mod challenge;
mod discovery;
mod error;
mod resolve;
pub mod store;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use url::Url;

pub use authorizer::{
    AuthorizationSession, AuthorizeFuture, Authorizer, HeadlessAuthorizer, LoopbackAuthorizer,
    ShowUrl, SignInRequest,
};
pub use challenge::Challenge;
pub use discovery::is_loopback;
pub use error::{AuthError, AuthFailure, AuthStep};
pub use store::{
    ClientAuth, ClientIdentity, FileTokenStore, MemoryTokenStore, RenewalLock, Token, TokenKey,
    TokenStore,
};

use discovery::{Discovered, ResourceMetadata, ServerMetadata};
use store::now_ms;

/// Largest metadata, registration or token reply read.
const MAX_REPLY: usize = 1 << 20;
/// Refresh this long before a token expires.
const REFRESH_MARGIN: Duration = Duration::from_secs(30);
/// How long a renewal after a refusal waits for another process's refresh of the same
/// token: what the holder may take under the lock (reaching the server first when it
/// has not yet, then the token request, each cut off at 30 s), and a little. Giving up
/// sooner would send the same refresh token twice, and an authorization server that
/// detects reuse revokes them all.
const RENEWAL_LOCK_WAIT: Duration = Duration::from_secs(65);
/// How often a request waiting for another process's refresh looks again.
const RENEWAL_LOCK_POLL: Duration = Duration::from_millis(25);

/// What a refresh may do once other processes' refreshes are ruled out (by the
/// store's lock, [`TokenStore::try_lock_renewal`]).
enum Across {
    /// Refresh, holding this (none where the store has no lock across processes).
    Locked(Option<Box<dyn Send + Sync>>),
    /// Another process refreshes it: the token is still good, send it as it is.
    SendAsIs,
}
/// Step-ups (403 `insufficient_scope`) per request before giving up.
pub const MAX_STEP_UPS: usize = 2;
/// The scope that asks for a refresh token, when the authorization server offers it.
const OFFLINE_ACCESS: &str = "offline_access";

/// The TLS client configuration sign-in uses: the platform's roots plus `ca_file` (for
/// tools that talk to the same servers, such as a test authorization server fetching
/// client metadata documents).
pub fn client_tls(ca_file: Option<&std::path::Path>) -> Result<rustls::ClientConfig, String> {
    crate::transport::tls::client_config(ca_file)
}

/// Which grant a server's sign-in uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GrantKind {
    /// A person signs in (authorization code with PKCE).
    #[default]
    AuthorizationCode,
    /// Machine to machine, with a pre-registered client id and secret.
    ClientCredentials,
}

/// How one server's sign-in is set up. Everything is optional: with nothing set, a
/// server that answers 401 is signed in to through discovery and registration.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OAuthConfig {
    /// A pre-registered client id (used first when set).
    pub client_id: Option<String>,
    /// Its secret, for a confidential client.
    pub client_secret: Option<String>,
    /// The authorization server (its issuer URL) to sign in with, when the server names
    /// several or may not be trusted to name the right one: sign-in refuses any other.
    /// Required with a `client_secret`: the secret goes to no issuer but this one.
    pub issuer: Option<String>,
    /// The HTTPS URL of a Client ID Metadata Document you host (used as the client id
    /// when the authorization server supports such documents).
    pub client_metadata_url: Option<String>,
    /// The grant.
    pub grant: GrantKind,
    /// Scopes to ask for on top of what the server's challenge or metadata names.
    pub scopes: Vec<String>,
}

impl std::fmt::Debug for OAuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthConfig")
            .field("client_id", &self.client_id)
            .field(
                "client_secret",
                &self.client_secret.as_ref().map(|_| "[redacted]"),
            )
            .field("issuer", &self.issuer)
            .field("client_metadata_url", &self.client_metadata_url)
            .field("grant", &self.grant)
            .field("scopes", &self.scopes)
            .finish()
    }
}

/// What every server's sign-in shares: where people sign in, where tokens are kept, how
/// long a sign-in may take, the name registration gives the client.
#[derive(Clone)]
pub struct SignInContext {
    /// Where a person signs in (`None`: a sign-in that needs one fails with
    /// [`AuthFailure::NeedsPerson`]).
    pub authorizer: Option<Arc<dyn Authorizer>>,
    /// Where tokens are kept.
    pub store: Arc<dyn TokenStore>,
    /// The longest one sign-in may take, person included.
    pub timeout: Duration,
    /// `client_name` in registrations.
    pub client_name: String,
    /// The locks on renewing each token, shared by the clones of this context (a
    /// harness's every connection): a server's connections (an old one's refresh still
    /// under way, a new one) each have their own sign-in state, and renew a token one
    /// at a time through these.
    pub renewals: RenewalLocks,
    /// The clients Dynamic Client Registration made, shared the same way: each server
    /// and connection that signs in through one authorization server uses the client
    /// registered first, instead of registering one more.
    pub registrations: Registrations,
    /// The tokens held in memory, shared the same way: a server's new connection uses
    /// the token its old one held, also one the store could not take.
    pub held: HeldTokens,
}

/// The tokens a harness holds in memory, by key; see [`SignInContext::held`]. A token
/// the store took is believed while the store still holds it, which is read again at
/// most once per [`STORE_RECHECK`]: a `logout` from the command line, or another
/// process forgetting a refused token, is followed within that.
#[derive(Clone, Default)]
pub struct HeldTokens(Arc<Mutex<HashMap<TokenKey, Held>>>);

#[derive(Clone)]
struct Held {
    token: Token,
    /// When the store was last seen holding it (or it was written there).
    checked: Instant,
    /// Set when the store could not take `token`: the access token the store still
    /// held then, if it could be read (older, its refresh token perhaps spent). A
    /// token in the store is taken over this one only when it is not that one and
    /// expires later (another process signed in or refreshed since). Until a write
    /// succeeds or the token is forgotten.
    unstored: Option<Option<String>>,
}

/// The most tokens held in memory. Past it, those the store holds are let go (read
/// again when next used); if every one is held only here, one is let go (its person
/// signs in again).
const HELD_MAX: usize = 4096;

impl HeldTokens {
    fn get(&self, key: &TokenKey) -> Option<Held> {
        self.0.lock().get(key).cloned()
    }

    fn insert(&self, key: TokenKey, held: Held) {
        Self::insert_locked(&mut self.0.lock(), key, held);
    }

    fn insert_locked(map: &mut HashMap<TokenKey, Held>, key: TokenKey, held: Held) {
        if map.len() >= HELD_MAX && !map.contains_key(&key) {
            map.retain(|_, h| h.unstored.is_some());
            if map.len() >= HELD_MAX
                && let Some(k) = map.keys().next().cloned()
            {
                map.remove(&k);
            }
        }
        map.insert(key, held);
    }

    fn remove(&self, key: &TokenKey) {
        self.0.lock().remove(key);
    }

    /// Holds `held` for `key` if the token held there is still `seen` (none: nothing
    /// held) — another connection may have kept a newer one since it was read — and
    /// returns the token held after.
    fn replace_if(&self, key: TokenKey, seen: Option<&str>, held: Held) -> Token {
        // Checked and replaced under one lock: a token kept between the two (a refresh
        // landing) would be overwritten with the older one.
        let mut map = self.0.lock();
        match map.get(&key) {
            Some(now) if Some(now.token.access_token.as_str()) != seen => now.token.clone(),
            None if seen.is_some() => {
                // Forgotten meanwhile (a sign-out): not brought back.
                held.token
            }
            _ => {
                let token = held.token.clone();
                Self::insert_locked(&mut map, key, held);
                token
            }
        }
    }

    /// Notes that the store was asked about `key`'s token `seen` (and could not say).
    fn checked(&self, key: &TokenKey, seen: &str) {
        if let Some(h) = self.0.lock().get_mut(key)
            && h.token.access_token == seen
        {
            h.checked = Instant::now();
        }
    }

    /// Removes `key`'s token if it is still `access_token` and the store took it
    /// (another request may have kept a new one meanwhile).
    fn remove_if_still(&self, key: &TokenKey, access_token: &str) {
        let mut map = self.0.lock();
        if map
            .get(key)
            .is_some_and(|h| h.unstored.is_none() && h.token.access_token == access_token)
        {
            map.remove(key);
        }
    }

    fn remove_server(&self, server: &str) {
        self.0.lock().retain(|k, _| k.server != server);
    }
}

/// One lock per token (server, resource, auth context) that its renewals in a harness
/// take; see [`SignInContext::renewals`].
#[derive(Clone, Default)]
pub struct RenewalLocks(Arc<Mutex<HashMap<TokenKey, Arc<tokio::sync::Mutex<()>>>>>);

impl RenewalLocks {
    fn lock_for(&self, key: TokenKey) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.0.lock();
        if locks.len() >= MISSING_MEMO {
            // Locks nobody holds or waits on are made again when next needed.
            locks.retain(|_, lock| Arc::strong_count(lock) > 1);
        }
        locks.entry(key).or_default().clone()
    }
}

/// The clients registered (RFC 7591) in a harness; see
/// [`SignInContext::registrations`].
#[derive(Clone, Default)]
pub struct Registrations(Arc<Mutex<RegistrationsInner>>);

#[derive(Default)]
struct RegistrationsInner {
    slots: HashMap<RegistrationKey, RegistrationSlot>,
    /// Clients their authorization servers no longer know (issuer, client id), newest
    /// last: a slot still holding one registers again when next used. Kept here, not
    /// only cleared from the slots, because a slot in use when it was forgotten cannot
    /// be cleared then. By issuer, so that one authorization server's word touches
    /// only its own clients.
    forgotten: std::collections::VecDeque<(String, String)>,
}

/// What one registration is for: the authorization server, where it sends the person
/// back, and the scopes the client asked for (a server may hold a client to them).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct RegistrationKey {
    issuer: String,
    redirect_uri: Option<String>,
    scopes: Vec<String>,
}

impl RegistrationKey {
    fn new(issuer: &str, redirect_uri: Option<&str>, scopes: &[String]) -> RegistrationKey {
        let mut scopes = scopes.to_vec();
        scopes.sort();
        scopes.dedup();
        RegistrationKey {
            issuer: issuer.to_string(),
            redirect_uri: redirect_uri.map(loopback_any_port),
            scopes,
        }
    }
}

/// A loopback redirect URI without its port: RFC 8252 section 7.3 has the authorization
/// server accept any port on one, and a loopback authorizer listens on a new port each
/// sign-in, so that one registration serves them all.
fn loopback_any_port(uri: &str) -> String {
    let Ok(mut u) = Url::parse(uri) else {
        return uri.to_string();
    };
    let loopback = match u.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        _ => false,
    };
    if u.scheme() == "http" && loopback && u.set_port(None).is_ok() {
        u.to_string()
    } else {
        uri.to_string()
    }
}

/// One registration: made once, by whoever takes the lock first.
type RegistrationSlot = Arc<tokio::sync::Mutex<Option<ClientIdentity>>>;

impl Registrations {
    fn slot(&self, key: RegistrationKey) -> RegistrationSlot {
        let slots = &mut self.0.lock().slots;
        if slots.len() >= MISSING_MEMO {
            // A flood of issuers (a hostile server's metadata) keeps only what is in use.
            slots.retain(|_, slot| Arc::strong_count(slot) > 1);
        }
        slots.entry(key).or_default().clone()
    }

    /// Forgets the registration of `client_id` at `issuer` (which no longer knows
    /// it), so that the next sign-in registers again, also one that holds its slot at
    /// this moment.
    fn forget(&self, issuer: &str, client_id: &str) {
        let mut inner = self.0.lock();
        let is = |(i, c): &(String, String)| i == issuer && c == client_id;
        if inner.forgotten.iter().any(is) {
            return;
        }
        if inner.forgotten.len() >= MISSING_MEMO {
            inner.forgotten.pop_front();
        }
        inner
            .forgotten
            .push_back((issuer.to_string(), client_id.to_string()));
    }

    /// The client of `issuer` in `made` (a slot's, locked by the caller), unless it
    /// was forgotten: then the slot is emptied, to be registered again.
    fn current(&self, issuer: &str, made: &mut Option<ClientIdentity>) -> Option<ClientIdentity> {
        let client = made.as_ref()?;
        let is = |(i, c): &(String, String)| i == issuer && *c == client.client_id;
        if self.0.lock().forgotten.iter().any(is) {
            *made = None;
            return None;
        }
        Some(client.clone())
    }

    /// Keeps `client`, newly registered at `issuer`, in `made`: an authorization
    /// server that hands out a forgotten id again knows it again.
    fn keep(&self, issuer: &str, made: &mut Option<ClientIdentity>, client: ClientIdentity) {
        self.0
            .lock()
            .forgotten
            .retain(|(i, c)| !(i == issuer && *c == client.client_id));
        *made = Some(client);
    }
}

impl Default for SignInContext {
    fn default() -> Self {
        SignInContext {
            authorizer: None,
            store: Arc::new(MemoryTokenStore::default()),
            timeout: Duration::from_secs(300),
            client_name: "mcp-harness".into(),
            renewals: RenewalLocks::default(),
            registrations: Registrations::default(),
            held: HeldTokens::default(),
        }
    }
}

impl std::fmt::Debug for SignInContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignInContext")
            .field("authorizer", &self.authorizer.is_some())
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// What [`SignIn::on_refused`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// Another token was held already (renewed by another request, or stored by
    /// another process): the request is retried with it.
    Held,
    /// The token was refreshed, or signed in for again.
    Renewed,
    /// The refusal stands: the token refused was renewed here after a refusal moments
    /// ago (within [`REFUSED_AGAIN_WINDOW`]), so the server will not take what its
    /// authorization server issues and renewing again would only repeat that; or the
    /// server is on plain HTTP beyond loopback, where no token goes.
    Refused,
}

/// Whether `stored` may be taken over `held` for an auth context whose newest token
/// the store could not take: it is not the store's older one (`stale`, when known), and
/// it expires later than the one held (a token the store held all along does not).
fn newer_than(stored: &Token, stale: Option<&str>, held: Option<&Token>) -> bool {
    let later = match held.and_then(|h| h.expires_at_ms) {
        Some(held_at) => stored.expires_at_ms.is_some_and(|at| at > held_at),
        None => held.is_none(),
    };
    Some(stored.access_token.as_str()) != stale && later
}

/// How long a token renewed after a refusal is not renewed again when it is refused
/// in turn: a server that refuses every token costs a renewal (perhaps a person's
/// sign-in) per auth context this often, not per request.
const REFUSED_AGAIN_WINDOW: Duration = Duration::from_secs(60);

/// Scopes an authorization server did not grant a step-up, and when.
type Denied = (Vec<String>, Instant);

/// A refusal [`SignIn::on_refused`] renews on a task of its own.
struct Refusal {
    challenge: Challenge,
    /// The token refused, if one was sent.
    refused: Option<String>,
    step_up: bool,
    /// Whether refreshing may help (it was not tried on this token moments ago).
    refresh: bool,
    /// The scopes asked for before this refusal added the challenge's.
    asked_before: Vec<String>,
}

/// One server's sign-in state: discovery, client identity, tokens per auth context.
pub(crate) struct SignIn {
    server: String,
    url: Url,
    /// `url` as text, the resource its tokens are kept for (made once: it is part of
    /// the key every request looks its token up by).
    resource: String,
    config: OAuthConfig,
    ctx: SignInContext,
    http: reqwest::Client,
    /// `http` without a proxy, for URLs on this machine (see
    /// [`crate::transport::client_builder`]); [`SignIn::client`] picks.
    direct: reqwest::Client,
    /// Checks the names `http` resolves; `None` for a server on an internal address.
    resolver: Option<Arc<resolve::SignInResolver>>,
    discovered: tokio::sync::Mutex<Option<Discovered>>,
    /// The access token this process last renewed, by auth context: a request refused
    /// again after trying a held token takes it (another request renewed meanwhile)
    /// rather than renewing once more.
    renewed: Mutex<HashMap<Option<String>, String>>,
    /// The access token last renewed because the server refused one, by auth context,
    /// and when (see [`Renewal::Refused`]); forgotten once the server takes it
    /// ([`SignIn::accepted`]).
    renewed_on_refusal: Mutex<HashMap<Option<String>, (String, Instant)>>,
    /// The scopes a step-up asked for that the authorization server did not grant, by
    /// auth context, and when: a step-up for no more than those is not asked again for
    /// [`REFUSED_AGAIN_WINDOW`] (each would be a sign-in, perhaps a person's).
    step_up_denied: Mutex<HashMap<Option<String>, Denied>>,
    /// Whether `renewed_on_refusal` holds any (a request's success looks at it only
    /// then: no lock per request).
    noted_on_refusal: std::sync::atomic::AtomicBool,
    /// This sign-in, for a token request to hold while it runs on a task of its own.
    this: std::sync::Weak<SignIn>,
    /// Auth contexts the store had no token for, and when it was read: it is read again
    /// for them at most once per [`STORE_RECHECK`] (or at once on a refusal), not twice
    /// per request to a server that needs no token.
    missing: Mutex<HashMap<Option<String>, Instant>>,
    /// Whether a store that could not be read (a token file refused: planted, a link,
    /// open to others) was warned of: once, then at debug, as it is read per request.
    store_warned: std::sync::atomic::AtomicBool,
    /// Whether a store that could not be written was warned of (once, then at debug).
    store_write_warned: std::sync::atomic::AtomicBool,
    /// Refusals of tokens renewed moments ago: each is logged at first, then at each
    /// power of two (they come once per request).
    refused_fresh: crate::util::log_budget::LogBudget,
    /// When the server was last reached to learn whether it is on an internal network
    /// before a token request: behind a proxy it is never learnt, and each token
    /// request would reach the server first (waiting out its timeout if it is down).
    probed_at: Mutex<Option<Instant>>,
    /// Scopes asked for so far per auth context (a step-up asks for their union).
    asked: Mutex<HashMap<Option<String>, Vec<String>>>,
    /// When the authorization server (or the person) last refused a sign-in, by auth
    /// context: another is not begun for [`REFUSED_AGAIN_WINDOW`] (each request would
    /// open a new prompt).
    sign_in_refused: Mutex<HashMap<Option<String>, Instant>>,
    /// The server is on plain HTTP beyond loopback: no token is signed in for, nor
    /// one kept (by an earlier version) sent or refreshed, as it would go in clear.
    in_clear: bool,
}

fn random_b64(bytes: usize) -> Result<String, String> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).map_err(|e| e.to_string())?;
    Ok(URL_SAFE_NO_PAD.encode(buf))
}

/// The S256 code challenge of a verifier (RFC 7636 section 4.2).
fn code_challenge(verifier: &str) -> String {
    URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

/// The most scopes asked for one identity: a server that names new ones in every
/// refusal gets no more (a real server's scopes are a handful).
const MAX_SCOPES: usize = 64;

/// The longest scope kept.
const MAX_SCOPE_BYTES: usize = 256;

/// How long the store's "no token" for an auth context is believed: a token another
/// process stores (the command line's `login`) is used this soon, or at the server's
/// first refusal.
const STORE_RECHECK: Duration = Duration::from_secs(1);

/// Auth contexts each per-context memo keeps (no token in the store, the scopes asked,
/// the token renewed here, the renewal locks); a flood of new ones only empties it.
const MISSING_MEMO: usize = 1024;

fn union(into: &mut Vec<String>, more: impl IntoIterator<Item = String>) {
    for s in more {
        if !into.contains(&s) {
            into.push(s);
        }
    }
}

/// Whether a scope a server named is a scope-token (RFC 6749 section 3.3) of a sane
/// length.
fn scope_token(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_SCOPE_BYTES
        && s.bytes()
            .all(|b| b == 0x21 || (0x23..=0x5b).contains(&b) || (0x5d..=0x7e).contains(&b))
}

/// Adds to the scopes kept for one identity those of the refusal now answered,
/// well-formed ones only, in order; past [`MAX_SCOPES`] the oldest go, never the newest
/// (a server that names new ones in every refusal cannot grow it).
fn remember(kept: &mut Vec<String>, newest: Vec<String>) {
    let newest: Vec<String> = newest
        .into_iter()
        .filter(|s| scope_token(s))
        .take(MAX_SCOPES)
        .collect();
    union(kept, newest.iter().cloned());
    let mut excess = kept.len().saturating_sub(MAX_SCOPES);
    if excess > 0 {
        tracing::warn!("a server named more scopes than are kept; the oldest are left out");
        kept.retain(|s| {
            let drop = excess > 0 && !newest.contains(s);
            excess -= usize::from(drop);
            !drop
        });
    }
}

/// The scopes a token reply says were granted (else those asked): well-formed and
/// capped as a challenge's are, since the token, scopes and all, is copied per request.
fn granted(scope: Option<&str>, asked: &[String]) -> Vec<String> {
    match scope {
        Some(s) => s
            .split_whitespace()
            .filter(|s| scope_token(s))
            .take(MAX_SCOPES)
            .map(String::from)
            .collect(),
        None => asked.to_vec(),
    }
}

fn form(pairs: &[(&str, &str)]) -> String {
    url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

/// A request that failed before any reply: refused by the sign-in resolver (a name
/// that resolves to an internal address) or a network failure.
fn send_failure(e: reqwest::Error) -> AuthFailure {
    if let Some(refused) = resolve::refusal(&e) {
        tracing::warn!(host = %refused.host, address = %refused.address, "sign-in request to an internal address refused");
        return AuthFailure::BadUrl {
            url: e
                .url()
                .map(|u| crate::util::text::one_line(&crate::util::text::url_shown(u), 200))
                .unwrap_or_default(),
            why: refused.to_string(),
        };
    }
    AuthFailure::Network(crate::util::text::http_failure(e))
}

/// Reads a bounded reply body.
async fn read_bounded(mut response: reqwest::Response) -> Result<Vec<u8>, AuthFailure> {
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| AuthFailure::Network(crate::util::text::http_failure(e)))?
    {
        if body.len() + chunk.len() > MAX_REPLY {
            return Err(AuthFailure::Invalid(format!(
                "reply larger than {MAX_REPLY} bytes"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The error codes of RFC 6749 (5.2, 4.1.2.1), RFC 7591 (3.2.2) and RFC 8707 (2) that
/// say no: read as the refusal they are whatever the status they came with.
const OAUTH_REFUSALS: &[&str] = &[
    "invalid_request",
    "invalid_client",
    "invalid_grant",
    "unauthorized_client",
    "unsupported_grant_type",
    "invalid_scope",
    "access_denied",
    "unsupported_response_type",
    "invalid_redirect_uri",
    "invalid_client_metadata",
    "invalid_software_statement",
    "unapproved_software_statement",
    "invalid_target",
];

/// OAuth error codes that say "not now" rather than "no": a refresh refused with one
/// is tried again, the token kept.
const PASSING_ERRORS: &[&str] = &[
    "temporarily_unavailable",
    "server_error",
    "slow_down",
    "authorization_pending",
];

/// The OAuth error of a failed token or registration reply, else the HTTP status.
fn oauth_error(status: u16, body: &[u8]) -> AuthFailure {
    let unavailable = status >= 500 || status == 408 || status == 429;
    match serde_json::from_slice::<Value>(body) {
        // An overloaded or failing server's JSON error page (`{"error": "Service
        // Unavailable"}`) is its status, which is retried, not a refusal to sign in
        // again after.
        Ok(v)
            if unavailable
                && v.get("error")
                    .and_then(Value::as_str)
                    .is_some_and(|e| !OAUTH_REFUSALS.contains(&e)) =>
        {
            AuthFailure::Http {
                status,
                body: crate::util::text::one_line(&String::from_utf8_lossy(body), 200),
            }
        }
        Ok(v) if v.get("error").and_then(Value::as_str).is_some() => AuthFailure::Refused {
            // The peer's text: cut short and escaped (it reaches status, audit and
            // terminals); the codes RFC 6749 names pass as they are.
            error: crate::util::text::one_line(v["error"].as_str().unwrap_or_default(), 100),
            description: v
                .get("error_description")
                .and_then(Value::as_str)
                .map(|d| crate::util::text::one_line(d, 200)),
        },
        // A JSON reply without an OAuth error may hold tokens (a token endpoint's reply
        // of another 2xx): described, never quoted. An error page is quoted, cut short.
        Ok(_) => AuthFailure::Http {
            status,
            body: "a JSON reply that names no OAuth error".into(),
        },
        Err(_) => AuthFailure::Http {
            status,
            body: crate::util::text::one_line(&String::from_utf8_lossy(body), 200),
        },
    }
}

/// Whether an issued access token can be sent as `Authorization: Bearer …`: one a header
/// cannot carry would be stored, then never sent (each refusal signing in again).
fn sendable_token(token: &str) -> Result<(), AuthFailure> {
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(AuthFailure::Invalid(
            "access_token is empty or holds characters a header cannot carry".into(),
        ));
    }
    Ok(())
}

/// The longest access or refresh token kept. A JWT with many claims runs to a few
/// kilobytes; one of a megabyte (the reply's bound) would be held per auth context,
/// copied into every request, and make its stored file too large to read back.
const MAX_TOKEN_BYTES: usize = 64 * 1024;

/// The longest `client_id` or `client_secret` a registration may give.
const MAX_CLIENT_BYTES: usize = 4 * 1024;

/// Refuses a registration whose client is past [`MAX_CLIENT_BYTES`].
fn client_sizes(id: &str, secret: Option<&str>) -> Result<(), AuthFailure> {
    if id.len() > MAX_CLIENT_BYTES || secret.is_some_and(|s| s.len() > MAX_CLIENT_BYTES) {
        return Err(AuthFailure::Invalid(format!(
            "client_id or client_secret is longer than {} KiB",
            MAX_CLIENT_BYTES / 1024
        )));
    }
    Ok(())
}

/// Refuses a token reply whose tokens are past [`MAX_TOKEN_BYTES`].
fn token_sizes(access: &str, refresh: Option<&str>) -> Result<(), AuthFailure> {
    for (name, token) in [("access_token", Some(access)), ("refresh_token", refresh)] {
        if token.is_some_and(|t| t.len() > MAX_TOKEN_BYTES) {
            return Err(AuthFailure::Invalid(format!(
                "{name} is longer than {} KiB",
                MAX_TOKEN_BYTES / 1024
            )));
        }
    }
    Ok(())
}

/// One token request: what is sent, and what the new token records about its issue
/// besides the reply.
struct Exchange {
    step: AuthStep,
    endpoint: String,
    client: ClientIdentity,
    /// The form's parameters, less the client's authentication.
    params: Vec<(&'static str, String)>,
    issuer: String,
    /// The scopes asked for (a reply without `scope` granted these).
    asked: Vec<String>,
    /// A refresh token to keep when the reply has none.
    previous_refresh: Option<String>,
}

/// This harness's hold on renewing one token (from [`SignIn::lock_for`]). A token
/// request under way takes it along onto a task of its own and hands it back
/// ([`SignIn::exchange`]): a caller that goes away meanwhile does not let another
/// renewal start before that request's token is kept.
type Renewing = Option<tokio::sync::OwnedMutexGuard<()>>;

impl Exchange {
    /// A grant's token request at `d`'s token endpoint (no refresh token to carry over).
    fn grant(
        step: AuthStep,
        d: &Discovered,
        client: ClientIdentity,
        params: Vec<(&'static str, String)>,
        asked: Vec<String>,
    ) -> Exchange {
        Exchange {
            step,
            endpoint: d.server.token_endpoint.clone(),
            client,
            params,
            issuer: d.server.issuer.clone(),
            asked,
            previous_refresh: None,
        }
    }
}

/// A token endpoint's answer.
#[derive(Deserialize)]
struct TokenReply {
    access_token: String,
    #[serde(default)]
    token_type: Option<String>,
    #[serde(default, deserialize_with = "seconds")]
    expires_in: Option<u64>,
    refresh_token: Option<String>,
    scope: Option<String>,
}

/// `expires_in` as servers send it: a number, as RFC 6749 has it, or a string of
/// digits (some do), or a fraction (cut to whole seconds).
fn seconds<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Ok(match Option::<Value>::deserialize(d)? {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.is_finite() && *f >= 0.0)
                .map(|f| f as u64)
        }),
        Some(Value::String(s)) => s.trim().parse().ok(),
        Some(_) => None,
    })
}

/// A token endpoint's 200 that is not a token reply: an error some servers send with
/// 200, or a body whose shape is named but never quoted (it may hold the very tokens).
fn not_a_token_reply(body: &[u8], e: &serde_json::Error) -> AuthFailure {
    match serde_json::from_slice::<Value>(body) {
        Ok(v) if v.get("error").and_then(Value::as_str).is_some() => oauth_error(200, body),
        _ => AuthFailure::Invalid(format!(
            "the token endpoint's reply is not a token reply ({:?} error at line {}, column {})",
            e.classify(),
            e.line(),
            e.column()
        )),
    }
}

impl SignIn {
    /// The sign-in of server `server` at `url` (its MCP endpoint).
    pub(crate) fn new(
        server: &str,
        url: &Url,
        config: OAuthConfig,
        ctx: SignInContext,
        tls: rustls::ClientConfig,
    ) -> Result<Arc<SignIn>, String> {
        // As a config's check says, held here too for a spec built in code (a
        // `Connection::connect` checks no config): else the secret would go to whichever
        // authorization server the server names.
        if config.client_secret.as_ref().is_some_and(|s| !s.is_empty()) && config.issuer.is_none() {
            return Err(
                "a client_secret needs an issuer: the secret goes to no authorization server but that one"
                    .into(),
            );
        }
        // Names the server's sign-in reaches are checked as resolved (literal addresses
        // are checked before any request, by `checked_url`).
        let resolver = resolve::SignInResolver::for_server(url).map(Arc::new);
        let build = |http: reqwest::ClientBuilder| {
            let mut http = http
                .redirect(reqwest::redirect::Policy::none())
                .tls_backend_preconfigured(tls.clone())
                .timeout(Duration::from_secs(30));
            if let Some(r) = &resolver {
                http = http.dns_resolver(Arc::new(resolve::SharedResolver(r.clone())));
            }
            http.build().map_err(|e| e.to_string())
        };
        let http = build(reqwest::Client::builder())?;
        let direct = build(reqwest::Client::builder().no_proxy())?;
        Ok(Arc::new_cyclic(|this| SignIn {
            this: this.clone(),
            server: server.to_string(),
            url: url.clone(),
            resource: url.to_string(),
            config,
            ctx,
            http,
            direct,
            resolver,
            discovered: tokio::sync::Mutex::new(None),
            renewed: Mutex::default(),
            renewed_on_refusal: Mutex::default(),
            step_up_denied: Mutex::default(),
            sign_in_refused: Mutex::default(),
            noted_on_refusal: std::sync::atomic::AtomicBool::new(false),
            missing: Mutex::default(),
            store_warned: std::sync::atomic::AtomicBool::new(false),
            store_write_warned: std::sync::atomic::AtomicBool::new(false),
            refused_fresh: Default::default(),
            probed_at: Mutex::default(),
            asked: Mutex::default(),
            in_clear: url.scheme() != "https" && !discovery::is_loopback(url),
        }))
    }

    /// The client for a request to `url`: none through a proxy to this machine.
    fn client(&self, url: &str) -> &reqwest::Client {
        match Url::parse(url).is_ok_and(|u| discovery::is_loopback(&u)) {
            true => &self.direct,
            false => &self.http,
        }
    }

    /// Sends `request` (a registration, a token request) and reads its answer's body,
    /// at most as much as [`read_bounded`] reads; a status other than 2xx is the
    /// server's OAuth error (RFC 6749 says 200 for a token; some send 201).
    async fn posted(
        &self,
        step: AuthStep,
        request: reqwest::RequestBuilder,
    ) -> Result<Vec<u8>, AuthError> {
        let response = self
            .send(request)
            .await
            .map_err(|e| self.err(step, send_failure(e)))?;
        let status = response.status().as_u16();
        let body = read_bounded(response)
            .await
            .map_err(|f| self.err(step, f))?;
        if !(200..300).contains(&status) {
            return Err(self.err(step, oauth_error(status, &body)));
        }
        Ok(body)
    }

    /// Sends a sign-in request; whether it was answered tells the resolver where the
    /// server is (see [`resolve`]).
    async fn send(&self, request: reqwest::RequestBuilder) -> reqwest::Result<reqwest::Response> {
        let sent = request.send().await;
        if let Some(r) = &self.resolver {
            match &sent {
                Ok(response) => r.sent(response.url(), true),
                Err(e) => {
                    if let Some(url) = e.url() {
                        r.sent(url, false);
                    }
                }
            }
        }
        sent
    }

    fn err(&self, step: AuthStep, failure: AuthFailure) -> AuthError {
        AuthError {
            server: self.server.clone(),
            step,
            failure,
            refused: None,
        }
    }

    fn key(&self, identity: Option<&str>) -> TokenKey {
        TokenKey {
            server: self.server.clone(),
            resource: self.resource.clone(),
            identity: identity.map(String::from),
        }
    }

    /// The lock on renewing `identity`'s token, one in this harness whichever
    /// connection renews it.
    fn lock_for(&self, identity: Option<&str>) -> Arc<tokio::sync::Mutex<()>> {
        self.ctx.renewals.lock_for(self.key(identity))
    }

    /// The token held for `identity`, from memory or the store (see `missing`). One
    /// the store took is read there again at most once per [`STORE_RECHECK`]
    /// ([`HeldTokens`]).
    fn held(&self, identity: Option<&str>) -> Option<Token> {
        // A token of another authorization server than the pinned one is not sent
        // (kept from before the pin, or by another config sharing the store): the
        // server's refusal then signs in with the pinned one. It was checked only at
        // a refresh, and a token without an expiry is never refreshed.
        self.held_any(identity).filter(|t| self.pinned(t))
    }

    /// Whether `token` was issued by the pinned issuer, if one is set.
    fn pinned(&self, token: &Token) -> bool {
        self.config
            .issuer
            .as_ref()
            .is_none_or(|wanted| *wanted == token.issuer)
    }

    fn held_any(&self, identity: Option<&str>) -> Option<Token> {
        if self.in_clear {
            return None;
        }
        if let Some(h) = self.ctx.held.get(&self.key(identity)) {
            if h.unstored.is_some() || h.checked.elapsed() < STORE_RECHECK {
                return Some(h.token);
            }
            return self.read_store(identity);
        }
        let who = identity.map(String::from);
        if self
            .missing
            .lock()
            .get(&who)
            .is_some_and(|read| read.elapsed() < STORE_RECHECK)
        {
            return None;
        }
        self.read_store(identity)
    }

    /// Whether a token is held in memory for `identity` (none after a sign-out).
    fn holds(&self, identity: Option<&str>) -> bool {
        self.ctx.held.get(&self.key(identity)).is_some()
    }

    /// `identity`'s token as the store has it now (another process may have signed in,
    /// or refreshed and rotated it), held from then on. A store without one is believed
    /// for [`STORE_RECHECK`], and a token held here that the store took is let go with
    /// it (signed out, or forgotten by another process after a refusal). A store that
    /// cannot be read leaves what is held as it is, and is asked again next time. A
    /// token of another issuer than the pinned one is none (see [`Self::held`]).
    fn read_store(&self, identity: Option<&str>) -> Option<Token> {
        self.read_store_any(identity).filter(|t| self.pinned(t))
    }

    fn read_store_any(&self, identity: Option<&str>) -> Option<Token> {
        if self.in_clear {
            return None;
        }
        let who = identity.map(String::from);
        let key = self.key(identity);
        let held = self.ctx.held.get(&key);
        let read = self.ctx.store.get(&key);
        if let Some(Held {
            token,
            unstored: Some(stale),
            ..
        }) = &held
        {
            match &read {
                // Another process's, newer: taken, as any other read.
                Ok(Some(stored)) if newer_than(stored, stale.as_deref(), Some(token)) => {}
                // The older one, or none: the one held here is the newest.
                _ => return Some(token.clone()),
            }
        }
        let seen = held.as_ref().map(|h| h.token.access_token.as_str());
        match read {
            Ok(Some(stored)) => {
                self.missing.lock().remove(&who);
                let fresh = Held {
                    token: stored,
                    checked: Instant::now(),
                    unstored: None,
                };
                Some(self.ctx.held.replace_if(key, seen, fresh))
            }
            Ok(None) => {
                if let Some(h) = &held {
                    self.ctx.held.remove_if_still(&key, &h.token.access_token);
                }
                let mut missing = self.missing.lock();
                if missing.len() >= MISSING_MEMO {
                    missing.clear();
                }
                missing.insert(who, Instant::now());
                None
            }
            Err(e) => {
                if self
                    .store_warned
                    .swap(true, std::sync::atomic::Ordering::Relaxed)
                {
                    tracing::debug!(server = %self.server, error = %e, "token store unreadable");
                } else {
                    tracing::warn!(server = %self.server, error = %e, "token store unreadable; signing in without it");
                }
                let h = held?;
                self.ctx.held.checked(&key, &h.token.access_token);
                Some(h.token)
            }
        }
    }

    fn keep(&self, identity: Option<&str>, token: Token) {
        // Stored before it is used: a rotated refresh token replaces the old one for good.
        // A store that cannot take it (a full disk, a directory it may not write) still
        // leaves it held here: the code or refresh token that got it is spent, and
        // dropping it would make a person sign in again for nothing.
        let who = identity.map(String::from);
        let key = self.key(identity);
        let stored = self.ctx.store.put(&key, &token);
        // What the store still holds instead: left there if its refresh token may still
        // work (a person signs in less often with it than without it), removed when this
        // one's replaced it (rotated: presenting it again may revoke them all).
        let mut unstored = None;
        if let Err(e) = &stored {
            if self
                .store_write_warned
                .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                tracing::debug!(server = %self.server, error = %e, "token store unwritable");
            } else {
                tracing::warn!(server = %self.server, error = %e, "token store unwritable; the token is held in memory only");
            }
            let old = self.ctx.store.get(&key).ok().flatten();
            let rotated = old.as_ref().is_some_and(|old| {
                old.refresh_token.is_some()
                    && token.refresh_token.is_some()
                    && old.refresh_token != token.refresh_token
            });
            if rotated {
                let _ = self.ctx.store.remove(&key);
            }
            unstored = Some(old.map(|t| t.access_token));
        }
        self.missing.lock().remove(&who);
        {
            let mut renewed = self.renewed.lock();
            if renewed.len() >= MISSING_MEMO {
                // Forgotten, a renewal here is at worst repeated once.
                renewed.clear();
            }
            renewed.insert(who, token.access_token.clone());
        }
        self.ctx.held.insert(
            key,
            Held {
                token,
                checked: Instant::now(),
                unstored,
            },
        );
    }

    /// Forgets `refused` unless the store now holds another token (another process
    /// signed in or refreshed meanwhile), which is then held instead.
    fn forget_if_still(&self, identity: Option<&str>, refused: &Token) {
        let key = self.key(identity);
        // The store's older token (from before a write failed) is no other.
        let marked = self.ctx.held.get(&key).and_then(|h| h.unstored);
        match self.ctx.store.get(&key) {
            Ok(Some(theirs))
                if theirs.access_token != refused.access_token
                    && marked.as_ref().is_none_or(|stale| {
                        newer_than(&theirs, stale.as_deref(), Some(refused))
                    }) =>
            {
                self.ctx.held.insert(
                    key,
                    Held {
                        token: theirs,
                        checked: Instant::now(),
                        unstored: None,
                    },
                );
            }
            _ => self.forget(identity),
        }
    }

    fn forget(&self, identity: Option<&str>) {
        let who = identity.map(String::from);
        let key = self.key(identity);
        self.ctx.held.remove(&key);
        self.renewed.lock().remove(&who);
        self.missing.lock().remove(&who);
        let _ = self.ctx.store.remove(&key);
    }

    /// The token held for `identity` now, as it is (no refresh).
    pub(crate) fn current(&self, identity: Option<&str>) -> Option<String> {
        self.held(identity).map(|t| t.access_token)
    }

    /// The token to send for `identity` now: the one held, unless it has expired. An
    /// expired token is not sent, so that the refusal that follows is of no token and
    /// renews it ([`Self::bearer`] says `None` for it too).
    pub(crate) fn sendable(&self, identity: Option<&str>) -> Option<String> {
        self.held(identity)
            .filter(|t| !t.expires_within(Duration::ZERO))
            .map(|t| t.access_token)
    }

    /// The error after too many step-ups.
    pub(crate) fn scope_exhausted(&self, attempts: usize) -> AuthError {
        self.err(
            AuthStep::StepUp,
            AuthFailure::ScopeRetriesExhausted(attempts),
        )
    }

    /// The bearer token to send for `identity`, refreshed first when it is about to
    /// expire; `None` when not signed in (the server's 401 then starts a sign-in). While
    /// another request renews it (a refresh, or a person signing in), a token not yet
    /// expired is sent as it is, and an expired one waits for the renewal until `until`
    /// (then [`AuthFailure::Timeout`]). A refresh this request starts is cut off
    /// neither by its deadline nor by its caller going away ([`Self::exchange`]); a
    /// token not yet expired waits for it at most half the time left to `until`.
    pub(crate) async fn bearer(
        &self,
        identity: Option<&str>,
        until: tokio::time::Instant,
    ) -> Result<Option<String>, AuthError> {
        let Some(token) = self.held(identity) else {
            return Ok(None);
        };
        if !token.refresh_due(REFRESH_MARGIN) {
            return Ok(Some(token.access_token));
        }
        let lock = self.lock_for(identity);
        let mut renewing = match lock.clone().try_lock_owned() {
            Ok(one) => Some(one),
            Err(_) if !token.expires_within(Duration::ZERO) => {
                return Ok(Some(token.access_token));
            }
            Err(_) => {
                let waited = until.saturating_duration_since(tokio::time::Instant::now());
                match tokio::time::timeout_at(until, lock.lock_owned()).await {
                    Ok(one) => Some(one),
                    Err(_) => {
                        return Err(self.err(AuthStep::Refresh, AuthFailure::Timeout(waited)));
                    }
                }
            }
        };
        // Another request may have renewed it while this one waited; another process
        // may have too (and rotated the refresh token): the store is read before a
        // refresh, which then uses the newest refresh token.
        let token = match self.held(identity) {
            Some(t) if !t.refresh_due(REFRESH_MARGIN) => return Ok(Some(t.access_token)),
            Some(t) if t.access_token != token.access_token => t,
            _ => match self.read_store(identity) {
                Some(t) if !t.refresh_due(REFRESH_MARGIN) => return Ok(Some(t.access_token)),
                Some(t) => t,
                // Signed out meanwhile (`logout`): renewing would store it back.
                None => return Ok(None),
            },
        };
        let renewal = self.renew_quietly(identity, &token, Some(until), &mut renewing);
        let renewed = match token.expires_at_ms {
            // A token that still works is not held back for its refresh past half of
            // the request's time, nor past its expiry: it goes, and the refresh (on its
            // own task once sent, with the lock) lands for the next request.
            Some(at) if !token.expires_within(Duration::ZERO) => {
                let now = tokio::time::Instant::now();
                let valid = Duration::from_millis(at.saturating_sub(now_ms()));
                let wait = (until.saturating_duration_since(now) / 2).min(valid);
                match tokio::time::timeout(wait, renewal).await {
                    Ok(renewed) => renewed,
                    Err(_) => {
                        tracing::debug!(server = %self.server, "a refresh ahead of expiry is slow; the token is sent as it is meanwhile");
                        return Ok(Some(token.access_token));
                    }
                }
            }
            _ => renewal.await,
        };
        match renewed {
            Ok(Some(t)) => Ok(Some(t.access_token)),
            // Not renewable without a person: a token still valid goes as it is (what
            // the request sends is what this returns, for a refusal to name), an
            // expired or forgotten one not at all (the 401 comes).
            Ok(None) => Ok(self.sendable(identity)),
            // A refresh ahead of expiry that failed (the authorization server down, slow,
            // or erring) leaves a token that still works: it goes, and the next request
            // in the window tries again.
            Err(e) if !token.expires_within(Duration::ZERO) => {
                tracing::warn!(server = %self.server, error = %e, "refreshing a token ahead of its expiry failed; it is sent as it is");
                Ok(Some(token.access_token))
            }
            Err(e) => Err(e),
        }
    }

    /// Takes the store's lock across processes for refreshing `identity`'s token,
    /// polling while another process holds it; see [`SignIn::renew_quietly`] for how
    /// long. A store with no such lock, or one whose lock file is refused, is refreshed
    /// without it (as before there was one).
    async fn lock_across(
        &self,
        identity: Option<&str>,
        token: &Token,
        until: Option<tokio::time::Instant>,
    ) -> Result<Across, AuthError> {
        let started = tokio::time::Instant::now();
        let limit = until.unwrap_or(started + RENEWAL_LOCK_WAIT);
        let key = self.key(identity);
        loop {
            match self.ctx.store.try_lock_renewal(&key) {
                Ok(RenewalLock::Held(guard)) => return Ok(Across::Locked(Some(guard))),
                Ok(RenewalLock::None) => return Ok(Across::Locked(None)),
                Err(e) => {
                    tracing::debug!(server = %self.server, error = %e, "no lock across processes for this refresh");
                    return Ok(Across::Locked(None));
                }
                Ok(RenewalLock::Busy) => {}
            }
            if until.is_some() && !token.expires_within(Duration::ZERO) {
                return Ok(Across::SendAsIs);
            }
            let now = tokio::time::Instant::now();
            if now >= limit {
                if until.is_some() {
                    return Err(self.err(
                        AuthStep::Refresh,
                        AuthFailure::Timeout(now.saturating_duration_since(started)),
                    ));
                }
                tracing::warn!(server = %self.server, "another process held the token's refresh lock too long; refreshing without it");
                return Ok(Across::Locked(None));
            }
            tokio::time::sleep(RENEWAL_LOCK_POLL.min(limit - now)).await;
        }
    }

    /// Whether a kept token may be refreshed where it was issued: by the pinned issuer
    /// (if one is set) and at a token endpoint today's URL rules accept (a token kept
    /// before a rule was added, or before the pin, is held to it too).
    fn still_trusted(&self, token: &Token) -> bool {
        self.config
            .issuer
            .as_ref()
            .is_none_or(|wanted| *wanted == token.issuer)
            && discovery::checked_url(&token.token_endpoint, &self.url).is_ok()
    }

    /// A refresh, or a new client-credentials token: what needs no person. A request
    /// that may send `token` as it is (`until`: its deadline) does so while another
    /// process refreshes it, if it has not expired; else it waits for that refresh
    /// until its deadline. A renewal after a refusal waits for it at most
    /// [`RENEWAL_LOCK_WAIT`].
    async fn renew_quietly(
        &self,
        identity: Option<&str>,
        token: &Token,
        until: Option<tokio::time::Instant>,
        renewing: &mut Renewing,
    ) -> Result<Option<Token>, AuthError> {
        if self.config.grant == GrantKind::ClientCredentials {
            return self
                .client_credentials(identity, None, renewing)
                .await
                .map(Some);
        }
        let Some(refresh) = token.refresh_token.clone() else {
            return Ok(None);
        };
        if !self.still_trusted(token) {
            tracing::info!(server = %self.server, "a kept token's authorization server is not one sign-in would use now; signing in again");
            // That token alone: a newer one another process stored is its own to judge.
            self.forget_if_still(identity, token);
            return Ok(None);
        }
        // One refresh at a time across the processes that share the store (a refresh
        // rotates the refresh token: of two at once, one fails); once the lock is
        // taken, the store is read again for what another process renewed meanwhile.
        let across = match self.lock_across(identity, token, until).await? {
            Across::Locked(guard) => guard,
            Across::SendAsIs => return Ok(Some(token.clone())),
        };
        let (token, refresh) = match self.read_store(identity) {
            Some(t) if t.access_token != token.access_token && !t.refresh_due(REFRESH_MARGIN) => {
                return Ok(Some(t));
            }
            Some(t)
                if t.refresh_token.is_some()
                    && t.refresh_token != token.refresh_token
                    && self.still_trusted(&t) =>
            {
                let refresh = t.refresh_token.clone().unwrap_or(refresh);
                (t, refresh)
            }
            Some(_) => (token.clone(), refresh),
            // Signed out meanwhile (`logout`): refreshing would store it back.
            None if !self.holds(identity) => return Ok(None),
            None => (token.clone(), refresh),
        };
        match self
            .refresh(identity, &token, &refresh, renewing, across)
            .await
        {
            Ok(t) => Ok(Some(t)),
            Err(e) => match &e.failure {
                // Signed out meanwhile: nothing to renew without a person.
                AuthFailure::SignedOut => Ok(None),
                // The client itself is unknown now (a registration deleted or expired, a
                // client revoked): its tokens and its registration are of no more use, and
                // a sign-in registers anew (RFC 6749 5.2).
                AuthFailure::Refused { error, .. } if error == "invalid_client" => {
                    tracing::warn!(server = %self.server, "the authorization server no longer knows this client; signing in again");
                    self.forget_if_still(identity, &token);
                    self.ctx
                        .registrations
                        .forget(&token.issuer, &token.client.client_id);
                    Ok(None)
                }
                // Any other refusal of the grant (`invalid_grant`: the refresh token is
                // dead; `invalid_target`, `unauthorized_client`, `invalid_scope`, or a
                // code of the server's own, GitHub's 200 `bad_refresh_token`): the same
                // refresh would be refused again, so the token is forgotten and a full
                // sign-in comes next. Kept, it failed every request once expired, and on
                // disk across restarts. Only a passing state is not a refusal.
                AuthFailure::Refused { error, .. } if !PASSING_ERRORS.contains(&error.as_str()) => {
                    tracing::info!(server = %self.server, error = %error, "refresh refused; signing in again");
                    self.forget_if_still(identity, &token);
                    Ok(None)
                }
                _ => Err(e),
            },
        }
    }

    /// After the server refused `refused` (a 401, or a 403 `insufficient_scope` when
    /// `step_up`): renews the token, signing in again when refreshing cannot help. With
    /// `take_held`, another token held now (renewed by another request, or stored by
    /// another process) is taken instead of renewing ([`Renewal::Held`]); a caller
    /// whose retry with that one is refused again asks without it.
    ///
    /// # Cancel safety
    /// The renewal runs on a task of its own once this has the token's lock: dropping
    /// this future (a caller's deadline) leaves it to finish within its own limits.
    pub(crate) async fn on_refused(
        &self,
        identity: Option<&str>,
        challenge: &Challenge,
        refused: Option<&str>,
        step_up: bool,
        take_held: bool,
    ) -> Result<Renewal, AuthError> {
        if self.in_clear {
            // No token goes to it (see `in_clear`): its refusal stands as it is.
            return Ok(Renewal::Refused);
        }
        let renewing = Some(self.lock_for(identity).lock_owned().await);
        let mut current = self.held(identity);
        // Another process may have signed in, or refreshed the token refused here (and
        // rotated its refresh token): the store is read again before anything is renewed.
        if current
            .as_ref()
            .is_none_or(|t| Some(t.access_token.as_str()) == refused)
        {
            // None when signed out meanwhile (`logout`): the refused token is not renewed.
            current = self.read_store(identity);
        }
        // Whether a token has every scope the challenge names (a step-up asks for them).
        let asked = challenge.scopes();
        let covers = |t: &Token| asked.iter().all(|s| t.scopes.iter().any(|have| have == s));
        // An expired token is no other token: it was not sent (`sendable`), and taking
        // it again would refuse every request until a restart. For a step-up, another
        // request's step-up that already has the scope asked for is as good.
        // (A challenge that names no scope tells nothing of the kind.)
        if let Some(t) = &current
            && (!step_up || (!asked.is_empty() && covers(t)))
            && Some(t.access_token.as_str()) != refused
            && !t.expires_within(Duration::ZERO)
        {
            if take_held {
                return Ok(Renewal::Held); // renewed meanwhile, here or elsewhere
            }
            // Renewed here by another request since this one's was sent: as good as
            // renewing (a second refresh would rotate it away from that request).
            let who = identity.map(String::from);
            if self.renewed.lock().get(&who) == Some(&t.access_token) {
                return Ok(Renewal::Renewed);
            }
        }
        // A step-up that asks for scope the token lacks is a new question, not a repeat.
        let nothing_new = !step_up || current.as_ref().is_some_and(covers);
        // Refused again: a token this process renewed after a refusal.
        let again = refused.and_then(|refused| {
            self.renewed_on_refusal
                .lock()
                .get(&identity.map(String::from))
                .filter(|(t, _)| t == refused)
                .map(|(_, at)| at.elapsed())
        });
        if nothing_new && again.is_some_and(|ago| ago < REFUSED_AGAIN_WINDOW) {
            if let Some(refused) = self.refused_fresh.log() {
                tracing::warn!(server = %self.server, refused, "the server refused a token renewed for it moments ago; not renewing again for a minute");
            }
            return Ok(Renewal::Refused);
        }
        // Refused again past that minute, never having served: refreshing where the
        // token came from gave one the server will not take (it moved to another
        // authorization server, or takes no token of that grant): not refreshed yet
        // again, but signed in anew, from a fresh discovery. (Before, it was refreshed
        // once a minute for ever.) One that served since its renewal is no longer noted
        // ([`SignIn::accepted`]): a later refusal (the server restarted) refreshes it.
        let refresh = again.is_none();
        if let Some(rm) = challenge.get("resource_metadata") {
            let mut d = self.discovered.lock().await;
            // A different metadata URL than the one discovery used means look again.
            let same = |d: &Discovered| Url::parse(rm).is_ok_and(|u| u == d.from);
            if d.as_ref().is_some_and(|d| !same(d)) {
                *d = None;
            }
        }
        if !refresh {
            *self.discovered.lock().await = None;
        }
        // What was asked before this refusal: a step-up refused puts it back.
        let before = {
            let mut asked = self.asked.lock();
            if asked.len() >= MISSING_MEMO && !asked.contains_key(&identity.map(String::from)) {
                // Forgotten, scopes come from the next challenge and the metadata again.
                asked.clear();
            }
            let entry = asked.entry(identity.map(String::from)).or_default();
            let before = entry.clone();
            let mut newest = challenge.scopes();
            if step_up && let Some(t) = &current {
                union(&mut newest, t.scopes.clone());
            }
            remember(entry, newest);
            before
        };
        let renewal = Refusal {
            challenge: challenge.clone(),
            refused: refused.map(String::from),
            step_up,
            refresh,
            asked_before: before,
        };
        // The renewal holds the lock on its own task: a request that stops waiting for
        // it (its deadline, a cancelled call) must not cut off a person's sign-in half
        // way, which the next request would have to begin again.
        let Some(this) = self.this.upgrade() else {
            // Not reached: `&self` is borrowed from a live `Arc`.
            return self
                .renew_refused(identity, renewal, current, renewing)
                .await;
        };
        let who = identity.map(String::from);
        let work = async move {
            this.renew_refused(who.as_deref(), renewal, current, renewing)
                .await
        };
        self.detached(AuthStep::Authorization, work).await?
    }

    /// [`Self::on_refused`]'s renewal, `renewing` held: the token `current` refreshed
    /// (unless this is a step-up, or `refresh` is false), else new client credentials
    /// or a sign-in. The token it yields is noted (see [`Renewal::Refused`]). A sign-in
    /// the authorization server or the person refuses is not begun again for
    /// [`REFUSED_AGAIN_WINDOW`], and a step-up refused leaves the scopes asked for as
    /// they were (a later sign-in would ask for what was refused, and be refused).
    async fn renew_refused(
        &self,
        identity: Option<&str>,
        renewal: Refusal,
        current: Option<Token>,
        mut renewing: Renewing,
    ) -> Result<Renewal, AuthError> {
        let Refusal {
            ref challenge,
            ref refused,
            step_up,
            refresh,
            asked_before,
        } = renewal;
        let refused = refused.as_deref();
        if !step_up
            && refresh
            && let Some(t) = &current
            && let Some(renewed) = self.renew_quietly(identity, t, None, &mut renewing).await?
            && Some(renewed.access_token.as_str()) != refused
        {
            // Refreshed.
        } else if self.config.grant == GrantKind::ClientCredentials {
            let step = if step_up {
                AuthStep::StepUp
            } else {
                AuthStep::ClientCredentials
            };
            let granted = self
                .client_credentials(identity, Some(challenge), &mut renewing)
                .await
                .map_err(|e| AuthError { step, ..e });
            self.note_sign_in(identity, challenge, step_up, asked_before, granted)?;
        } else {
            let who = identity.map(String::from);
            if !step_up
                && let Some(at) = self.sign_in_refused.lock().get(&who)
                && at.elapsed() < REFUSED_AGAIN_WINDOW
            {
                if let Some(refused) = self.refused_fresh.log() {
                    tracing::warn!(server = %self.server, refused, "a sign-in was refused moments ago; not asking again for a minute");
                }
                return Ok(Renewal::Refused);
            }
            let granted = self.authorize(identity, challenge, &mut renewing).await;
            self.note_sign_in(identity, challenge, step_up, asked_before, granted)?;
        }
        if let Some(t) = self.held(identity) {
            let asked = challenge.scopes();
            let lacking: Vec<String> = asked
                .into_iter()
                .filter(|s| !t.scopes.contains(s))
                .collect();
            if step_up && !lacking.is_empty() {
                let mut denied = self.step_up_denied.lock();
                if denied.len() >= MISSING_MEMO {
                    denied.clear();
                }
                denied.insert(identity.map(String::from), (lacking, Instant::now()));
            }
            let mut noted = self.renewed_on_refusal.lock();
            if noted.len() >= MISSING_MEMO {
                noted.clear();
            }
            noted.insert(identity.map(String::from), (t.access_token, Instant::now()));
            self.noted_on_refusal
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(Renewal::Renewed)
    }

    /// Notes how a sign-in or a step-up for `challenge` ended: refused, it is not begun
    /// again for a while (a step-up for the same scopes, or any sign-in), and a step-up
    /// puts back the scopes asked for before it (`asked_before`).
    fn note_sign_in<T>(
        &self,
        identity: Option<&str>,
        challenge: &Challenge,
        step_up: bool,
        asked_before: Vec<String>,
        outcome: Result<T, AuthError>,
    ) -> Result<T, AuthError> {
        let who = identity.map(String::from);
        // A "no" that the same sign-in would meet again (the person's `access_denied`,
        // an `invalid_scope`, a registration or a grant the server will not make): not
        // a "not now" (`temporarily_unavailable`), nor one after which signing in again
        // at once is what helps (a code that expired while the person took their time,
        // a registered client the server forgot, registered anew next time).
        let refused = |e: &AuthError| match &e.failure {
            AuthFailure::Refused { error, .. } => {
                !e.transient()
                    && error != "invalid_grant"
                    && !(error == "invalid_client" && self.config.client_id.is_none())
            }
            _ => false,
        };
        match &outcome {
            Err(e) if refused(e) && step_up => {
                let held = self.held(identity);
                let lacking: Vec<String> = challenge
                    .scopes()
                    .into_iter()
                    .filter(|s| held.as_ref().is_none_or(|t| !t.scopes.contains(s)))
                    .collect();
                let mut denied = self.step_up_denied.lock();
                if denied.len() >= MISSING_MEMO {
                    denied.clear();
                }
                denied.insert(who.clone(), (lacking, Instant::now()));
                drop(denied);
                self.put_back_asked(&who, asked_before);
            }
            Err(e) if refused(e) => {
                let mut refused = self.sign_in_refused.lock();
                if refused.len() >= MISSING_MEMO {
                    refused.clear();
                }
                refused.insert(who, Instant::now());
            }
            // A step-up that ended otherwise (timed out, no person, the network) did
            // not get its scopes either: a later sign-in does not ask for them.
            Err(_) if step_up => self.put_back_asked(&who, asked_before),
            Err(_) => {}
            Ok(_) => {
                self.sign_in_refused.lock().remove(&who);
            }
        }
        outcome
    }

    /// The scopes asked for by `who` as they were before a step-up that failed.
    fn put_back_asked(&self, who: &Option<String>, before: Vec<String>) {
        if let Some(entry) = self.asked.lock().get_mut(who) {
            *entry = before;
        }
    }

    /// Whether the server may be reached again to learn where it is (at most once a
    /// minute: through a proxy the answer never comes), noting that it is.
    fn probe_due(&self) -> bool {
        let mut at = self.probed_at.lock();
        if at.is_some_and(|at| at.elapsed() < REFUSED_AGAIN_WINDOW) {
            return false;
        }
        *at = Some(Instant::now());
        true
    }

    /// Whether a step-up for `challenge`'s scopes would ask only for scopes the
    /// authorization server did not grant `identity` moments ago (within
    /// [`REFUSED_AGAIN_WINDOW`]): the same answer again, at the cost of a sign-in
    /// (perhaps a person's), so a request's step-up is not tried then.
    pub(crate) fn step_up_denied(&self, identity: Option<&str>, challenge: &Challenge) -> bool {
        let asked = challenge.scopes();
        if asked.is_empty() {
            return false;
        }
        let held = self.held(identity);
        let denied = self.step_up_denied.lock();
        let Some((scopes, at)) = denied.get(&identity.map(String::from)) else {
            return false;
        };
        // What the held token lacks of the challenge: none lacking, the held token (a
        // newer one than the request sent, perhaps) answers it, and is retried.
        let lacking: Vec<&String> = asked
            .iter()
            .filter(|s| held.as_ref().is_none_or(|t| !t.scopes.contains(s)))
            .collect();
        let repeat = at.elapsed() < REFUSED_AGAIN_WINDOW
            && !lacking.is_empty()
            && lacking.iter().all(|s| scopes.contains(s));
        if repeat && let Some(refused) = self.refused_fresh.log() {
            tracing::warn!(server = %self.server, refused, scopes = ?asked, "the authorization server did not grant these scopes moments ago; not asking again for a minute");
        }
        repeat
    }

    /// The server took `sent` (a request carrying it was answered): a token renewed
    /// after a refusal has served, and a later refusal of it is a new one, renewed as
    /// any (not taken for a server that refuses every token of that grant).
    pub(crate) fn accepted(&self, identity: Option<&str>, sent: Option<&str>) {
        use std::sync::atomic::Ordering;
        let Some(sent) = sent else {
            return;
        };
        if !self.noted_on_refusal.load(Ordering::Relaxed) {
            return;
        }
        let mut noted = self.renewed_on_refusal.lock();
        let who = identity.map(String::from);
        if noted.get(&who).is_some_and(|(t, _)| t == sent) {
            noted.remove(&who);
        }
        if noted.is_empty() {
            self.noted_on_refusal.store(false, Ordering::SeqCst);
        }
    }

    /// Signs `identity` in now (the command line's `login`), whatever is held.
    pub(crate) async fn sign_in(&self, identity: Option<&str>) -> Result<(), AuthError> {
        let mut renewing = Some(self.lock_for(identity).lock_owned().await);
        let challenge = self.probe_challenge().await;
        if self.config.grant == GrantKind::ClientCredentials {
            return self
                .client_credentials(identity, Some(&challenge), &mut renewing)
                .await
                .map(|_| ());
        }
        self.authorize(identity, &challenge, &mut renewing)
            .await
            .map(|_| ())
    }

    /// Forgets every token of this server (the command line's `logout`).
    pub(crate) fn sign_out(&self) -> Result<usize, AuthError> {
        self.ctx.held.remove_server(&self.server);
        self.renewed.lock().clear();
        self.renewed_on_refusal.lock().clear();
        self.step_up_denied.lock().clear();
        self.sign_in_refused.lock().clear();
        self.asked.lock().clear();
        self.missing.lock().clear();
        self.ctx
            .store
            .remove_server(&self.server)
            .map_err(|e| self.err(AuthStep::Token, AuthFailure::Store(e)))
    }

    /// The server's challenge to an unauthenticated request (for `login` before any
    /// request was refused); empty when it has none.
    async fn probe_challenge(&self) -> Challenge {
        let probe = self
            .send(
                self.client(self.url.as_str())
                    .post(self.url.clone())
                    .header("content-type", "application/json")
                    .header("accept", "application/json, text/event-stream")
                    .body(r#"{"jsonrpc":"2.0","id":0,"method":"ping"}"#),
            )
            .await;
        match probe {
            Ok(r) => Challenge::bearer(
                r.headers()
                    .get_all(reqwest::header::WWW_AUTHENTICATE)
                    .iter()
                    .filter_map(|v| v.to_str().ok()),
            )
            .unwrap_or_default(),
            Err(_) => Challenge::default(),
        }
    }

    /// GETs metadata: `Some` on a 2xx JSON object, `None` when it is not there (a 4xx, a
    /// redirect, a page that is no JSON object: a login page, a single-page app's
    /// catch-all), an error else.
    async fn get_json(&self, url: &Url, step: AuthStep) -> Result<Option<Value>, AuthError> {
        let response = self
            .send(
                self.client(url.as_str())
                    .get(url.clone())
                    .header("accept", "application/json"),
            )
            .await
            .map_err(|e| self.err(step, send_failure(e)))?;
        let status = response.status().as_u16();
        // Not there; but one that is slow or rate-limited (408, 429) is asked again
        // later (an error that heals), not taken for a server without metadata.
        // Redirects are not followed (metadata is read where it is named).
        if (300..400).contains(&status)
            || ((400..500).contains(&status) && status != 408 && status != 429)
        {
            return Ok(None);
        }
        let body = read_bounded(response)
            .await
            .map_err(|f| self.err(step, f))?;
        if !(200..300).contains(&status) {
            return Err(self.err(step, oauth_error(status, &body)));
        }
        match serde_json::from_slice::<Value>(&body) {
            Ok(v) if v.is_object() => Ok(Some(v)),
            _ => {
                // Shown without credentials or query: the server's URL may carry a key.
                let url = crate::util::text::url_shown(url);
                tracing::debug!(server = %self.server, %url, "no metadata there (the reply is no JSON object)");
                Ok(None)
            }
        }
    }

    /// The first of `urls` that has a JSON document, and where. An error stops the
    /// search: one that heals (a place down or busy) is tried again from the first
    /// place later, so that a fallback found meanwhile is not kept for good.
    async fn first_json<'u>(
        &self,
        urls: &'u [Url],
        step: AuthStep,
    ) -> Result<Option<(Value, &'u Url)>, AuthError> {
        for url in urls {
            if let Some(v) = self.get_json(url, step).await? {
                return Ok(Some((v, url)));
            }
        }
        Ok(None)
    }

    /// Discovery (see [`discovery`]), cached for the process's life.
    async fn discover(&self, challenge: &Challenge) -> Result<Discovered, AuthError> {
        let mut cached = self.discovered.lock().await;
        if let Some(d) = cached.as_ref() {
            return Ok(d.clone());
        }
        let step = AuthStep::ResourceMetadata;
        let urls = discovery::resource_metadata_urls(&self.url, challenge.get("resource_metadata"))
            .map_err(|f| self.err(step, f))?;
        let Some((v, from)) = self.first_json(&urls, step).await? else {
            return Err(self.err(
                step,
                AuthFailure::NotFound {
                    tried: urls.iter().map(crate::util::text::url_shown).collect(),
                },
            ));
        };
        let resource: ResourceMetadata = discovery::parse(v).map_err(|f| self.err(step, f))?;
        if !discovery::resource_matches(&resource.resource, &self.url) {
            return Err(self.err(
                step,
                AuthFailure::ResourceMismatch {
                    expected: crate::util::text::url_shown(&self.url),
                    found: crate::util::text::one_line(&resource.resource, 200),
                },
            ));
        }
        let issuer = match &self.config.issuer {
            Some(wanted) => resource.authorization_servers.iter().find(|s| *s == wanted),
            None => resource.authorization_servers.first(),
        };
        let Some(issuer) = issuer.cloned() else {
            let why = match &self.config.issuer {
                Some(wanted) => format!(
                    "the configured issuer {} is not among the server's authorization_servers",
                    crate::util::text::one_line(wanted, 200)
                ),
                None => "no authorization_servers".into(),
            };
            return Err(self.err(step, AuthFailure::Invalid(why)));
        };
        let step = AuthStep::ServerMetadata;
        let urls =
            discovery::server_metadata_urls(&issuer, &self.url).map_err(|f| self.err(step, f))?;
        let mut server = None;
        if let Some((v, _)) = self.first_json(&urls, step).await? {
            let m: ServerMetadata = discovery::parse(v).map_err(|f| self.err(step, f))?;
            // The metadata must be the issuer's own (RFC 8414 section 3.3).
            if m.issuer != issuer {
                return Err(self.err(
                    step,
                    AuthFailure::IssuerMismatch {
                        expected: crate::util::text::one_line(&issuer, 200),
                        found: crate::util::text::one_line(&m.issuer, 200),
                    },
                ));
            }
            server = Some(m);
        }
        let Some(server) = server else {
            return Err(self.err(
                step,
                AuthFailure::NotFound {
                    tried: urls.iter().map(crate::util::text::url_shown).collect(),
                },
            ));
        };
        for endpoint in [
            Some(&server.token_endpoint),
            server.authorization_endpoint.as_ref(),
            server.registration_endpoint.as_ref(),
        ]
        .into_iter()
        .flatten()
        {
            discovery::checked_url(endpoint, &self.url).map_err(|f| self.err(step, f))?;
        }
        let d = Discovered {
            resource,
            server,
            from: from.clone(),
        };
        *cached = Some(d.clone());
        Ok(d)
    }

    /// The scopes to ask for: what was asked before (a step-up adds), else the
    /// challenge's, else the resource's `scopes_supported`; the configured ones; and
    /// `offline_access` for a person's sign-in when the authorization server offers it.
    fn scopes(&self, identity: Option<&str>, challenge: &Challenge, d: &Discovered) -> Vec<String> {
        let mut scopes = self
            .asked
            .lock()
            .get(&identity.map(String::from))
            .cloned()
            .unwrap_or_default();
        if scopes.is_empty() {
            remember(&mut scopes, challenge.scopes());
        }
        if scopes.is_empty() {
            remember(&mut scopes, d.resource.scopes_supported.clone());
        }
        union(&mut scopes, self.config.scopes.clone());
        if self.config.grant == GrantKind::AuthorizationCode
            && !scopes.is_empty()
            && d.server
                .scopes_supported
                .iter()
                .any(|s| s == OFFLINE_ACCESS)
        {
            union(&mut scopes, [OFFLINE_ACCESS.to_string()]);
        }
        scopes
    }

    /// The token endpoint authentication for a client with (or without) a secret, as the
    /// metadata allows (RFC 8414: absent means `client_secret_basic`).
    fn auth_method(d: &Discovered, has_secret: bool, preferred: Option<ClientAuth>) -> ClientAuth {
        let listed = d.server.token_endpoint_auth_methods_supported.as_ref();
        let allows = |m: &str| listed.is_none_or(|l| l.iter().any(|x| x == m));
        let name = |a: ClientAuth| match a {
            ClientAuth::ClientSecretBasic => "client_secret_basic",
            ClientAuth::ClientSecretPost => "client_secret_post",
            ClientAuth::None => "none",
        };
        // What a registration says its client uses, unless the metadata lists others
        // (with no list, RFC 8414's default is only a default: the registration knows).
        if let Some(p) = preferred
            && (has_secret || p == ClientAuth::None)
            && allows(name(p))
        {
            return p;
        }
        match (has_secret, listed) {
            (true, None) => ClientAuth::ClientSecretBasic,
            (false, None) => ClientAuth::None,
            (true, Some(_)) if allows("client_secret_basic") => ClientAuth::ClientSecretBasic,
            (true, Some(_)) if allows("client_secret_post") => ClientAuth::ClientSecretPost,
            (true, Some(_)) => ClientAuth::ClientSecretPost,
            (false, Some(_)) => ClientAuth::None,
        }
    }

    /// The client identity, in the spec's order: pre-registered, a metadata document,
    /// then registration with `redirect_uri`.
    async fn client_identity(
        &self,
        d: &Discovered,
        redirect_uri: Option<&str>,
        scopes: &[String],
    ) -> Result<ClientIdentity, AuthError> {
        if let Some(id) = &self.config.client_id {
            let secret = self.config.client_secret.clone().filter(|s| !s.is_empty());
            let auth = Self::auth_method(d, secret.is_some(), None);
            return Ok(ClientIdentity {
                client_id: id.clone(),
                client_secret: secret,
                auth,
            });
        }
        if let Some(doc) = &self.config.client_metadata_url
            && d.server.client_id_metadata_document_supported
        {
            let url = Url::parse(doc).map_err(|e| {
                self.err(
                    AuthStep::Registration,
                    AuthFailure::BadUrl {
                        url: doc.clone(),
                        why: e.to_string(),
                    },
                )
            })?;
            if url.scheme() != "https" || url.path() == "/" || url.fragment().is_some() {
                return Err(self.err(
                    AuthStep::Registration,
                    AuthFailure::BadUrl {
                        url: doc.clone(),
                        why: "a client metadata document URL is https with a path and no fragment"
                            .into(),
                    },
                ));
            }
            return Ok(ClientIdentity {
                client_id: doc.clone(),
                client_secret: None,
                auth: ClientAuth::None,
            });
        }
        let Some(endpoint) = d.server.registration_endpoint.clone() else {
            return Err(self.err(AuthStep::Registration, AuthFailure::NoClientIdentity));
        };
        let key = RegistrationKey::new(&d.server.issuer, redirect_uri, scopes);
        let slot = self.ctx.registrations.slot(key);
        let Some(this) = self.this.upgrade() else {
            // Not reached: `&self` is borrowed from a live `Arc`.
            let mut made = slot.lock().await;
            return self
                .registered(&mut made, &endpoint, d, redirect_uri, scopes)
                .await;
        };
        // The registration runs on a task of its own that holds its slot until the
        // client is kept: once sent, the authorization server has made a client that a
        // caller going away (a cancelled call) would leave unknown here, and whoever
        // waits on the slot meanwhile takes the same client.
        let (d, redirect_uri, scopes) =
            (d.clone(), redirect_uri.map(String::from), scopes.to_vec());
        let work = async move {
            let mut made = slot.lock().await;
            this.registered(&mut made, &endpoint, &d, redirect_uri.as_deref(), &scopes)
                .await
        };
        self.detached(AuthStep::Registration, work).await?
    }

    /// The client in `made`, registered at `endpoint` (RFC 7591) and kept there first
    /// if there is none yet.
    async fn registered(
        &self,
        made: &mut Option<ClientIdentity>,
        endpoint: &str,
        d: &Discovered,
        redirect_uri: Option<&str>,
        scopes: &[String],
    ) -> Result<ClientIdentity, AuthError> {
        if let Some(client) = self.ctx.registrations.current(&d.server.issuer, made) {
            return Ok(client);
        }
        let mut request = json!({
            "client_name": self.ctx.client_name,
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
            "application_type": "native",
        });
        if let Some(uri) = redirect_uri {
            request["redirect_uris"] = json!([uri]);
        }
        if !scopes.is_empty() {
            request["scope"] = json!(scopes.join(" "));
        }
        let step = AuthStep::Registration;
        let request = self
            .client(endpoint)
            .post(endpoint)
            .header("content-type", "application/json")
            .header("accept", "application/json")
            .body(request.to_string());
        let body = self.posted(step, request).await?;
        let v: Value = serde_json::from_slice(&body)
            .map_err(|e| self.err(step, AuthFailure::Invalid(e.to_string())))?;
        let Some(client_id) = v.get("client_id").and_then(Value::as_str) else {
            return Err(self.err(step, AuthFailure::Invalid("no client_id".into())));
        };
        // Kept with every token, and sent with every token request.
        client_sizes(client_id, v.get("client_secret").and_then(Value::as_str))
            .map_err(|f| self.err(step, f))?;
        let secret = v
            .get("client_secret")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(String::from);
        let preferred = match v.get("token_endpoint_auth_method").and_then(Value::as_str) {
            Some("client_secret_basic") => Some(ClientAuth::ClientSecretBasic),
            Some("client_secret_post") => Some(ClientAuth::ClientSecretPost),
            Some("none") => Some(ClientAuth::None),
            _ => None,
        };
        let auth = Self::auth_method(d, secret.is_some(), preferred);
        let client = ClientIdentity {
            client_id: client_id.to_string(),
            client_secret: secret,
            auth,
        };
        self.ctx
            .registrations
            .keep(&d.server.issuer, made, client.clone());
        Ok(client)
    }

    /// Sends `ex` and keeps the token it brings for `identity`, on a task of its own
    /// that holds `renewing` (handed back after) and `across` until the token is kept.
    /// Once sent, a token request may have spent a code or rotated a refresh token, and
    /// its reply is then the only copy of what replaces them: a caller that goes away
    /// (a cancelled call) must not cut it off.
    async fn exchange(
        &self,
        identity: Option<&str>,
        ex: Exchange,
        renewing: &mut Renewing,
        across: Option<Box<dyn Send + Sync>>,
    ) -> Result<Token, AuthError> {
        let step = ex.step;
        let Some(this) = self.this.upgrade() else {
            // Not reached: `&self` is borrowed from a live `Arc`.
            return self.exchange_here(identity, &ex).await;
        };
        let (who, held) = (identity.map(String::from), renewing.take());
        let work = async move {
            let kept = this.exchange_here(who.as_deref(), &ex).await;
            drop(across);
            (kept, held)
        };
        let (kept, held) = self.detached(step, work).await?;
        *renewing = held;
        kept
    }

    /// `work`'s output, run on a task of its own that a caller going away does not cut
    /// off (see [`Self::exchange`]). A panic in it is the caller's, as it would have been
    /// inline, not a failed sign-in (which a restart could not heal).
    async fn detached<O: Send + 'static>(
        &self,
        step: AuthStep,
        work: impl std::future::Future<Output = O> + Send + 'static,
    ) -> Result<O, AuthError> {
        match tokio::spawn(tracing::Instrument::in_current_span(work)).await {
            Ok(out) => Ok(out),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(self.err(
                step,
                AuthFailure::Invalid("stopped with the runtime".into()),
            )),
        }
    }

    /// [`Self::exchange`]'s work: the request, then the token kept.
    async fn exchange_here(
        &self,
        identity: Option<&str>,
        ex: &Exchange,
    ) -> Result<Token, AuthError> {
        let token = self.token_request(ex).await?;
        // A refresh of a token signed out while it ran (`logout`) is not stored back.
        // The store has no token for it then, where it held the one refreshed (unless
        // it could not take that one).
        let key = self.key(identity);
        if ex.step == AuthStep::Refresh
            && self.ctx.held.get(&key).is_none_or(|h| h.unstored.is_none())
            && matches!(self.ctx.store.get(&key), Ok(None))
        {
            self.ctx.held.remove(&key);
            return Err(self.err(AuthStep::Refresh, AuthFailure::SignedOut));
        }
        self.keep(identity, token.clone());
        Ok(token)
    }

    /// POSTs a token request with the client's authentication; the reply as a token.
    async fn token_request(&self, ex: &Exchange) -> Result<Token, AuthError> {
        let Exchange {
            step,
            ref endpoint,
            ref client,
            ref params,
            ref issuer,
            ref asked,
            ref previous_refresh,
        } = *ex;
        let mut params: Vec<(&str, &str)> = params.iter().map(|(k, v)| (*k, v.as_str())).collect();
        if self.resolver.as_ref().is_some_and(|r| r.server_unknown()) && self.probe_due() {
            // A kept token refreshed before sign-in has reached the server: reach it
            // first, so that whether it is on an internal network is known.
            self.probe_challenge().await;
        }
        let mut request = self
            .client(endpoint)
            .post(endpoint.as_str())
            .header("content-type", "application/x-www-form-urlencoded")
            .header("accept", "application/json");
        match (client.auth, &client.client_secret) {
            (ClientAuth::ClientSecretBasic, Some(secret)) => {
                // RFC 6749 section 2.3.1: each form-encoded, then joined.
                let enc = |s: &str| {
                    url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>()
                };
                let basic = STANDARD.encode(format!("{}:{}", enc(&client.client_id), enc(secret)));
                request = request.header("authorization", format!("Basic {basic}"));
            }
            (ClientAuth::ClientSecretPost, Some(secret)) => {
                params.push(("client_id", &client.client_id));
                params.push(("client_secret", secret));
            }
            _ => params.push(("client_id", &client.client_id)),
        }
        let body = self.posted(step, request.body(form(&params))).await?;
        let reply: TokenReply = serde_json::from_slice(&body)
            .map_err(|e| self.err(step, not_a_token_reply(&body, &e)))?;
        if reply
            .token_type
            .as_deref()
            .is_some_and(|t| !t.eq_ignore_ascii_case("bearer"))
        {
            return Err(self.err(
                step,
                AuthFailure::Invalid("token_type is not Bearer".into()),
            ));
        }
        sendable_token(&reply.access_token).map_err(|f| self.err(step, f))?;
        token_sizes(&reply.access_token, reply.refresh_token.as_deref())
            .map_err(|f| self.err(step, f))?;
        let now = now_ms();
        Ok(Token {
            access_token: reply.access_token,
            refresh_token: reply.refresh_token.or_else(|| previous_refresh.clone()),
            // `expires_in: 0` says nothing a token can be used by (some servers send it
            // for "does not expire"): read as no lifetime given, the token is used until
            // refused, and renewed at most once a minute after. Read as expired at once,
            // it was never sent, and every request renewed it.
            expires_at_ms: reply
                .expires_in
                .filter(|s| *s > 0)
                .map(|s| now.saturating_add(s.saturating_mul(1000))),
            issued_at_ms: Some(now),
            scopes: granted(reply.scope.as_deref(), asked),
            issuer: issuer.clone(),
            token_endpoint: endpoint.clone(),
            client: client.clone(),
            resource: params
                .iter()
                .find(|(k, _)| *k == "resource")
                .map(|(_, v)| v.to_string()),
        })
    }

    async fn refresh(
        &self,
        identity: Option<&str>,
        token: &Token,
        refresh: &str,
        renewing: &mut Renewing,
        across: Option<Box<dyn Send + Sync>>,
    ) -> Result<Token, AuthError> {
        let params = vec![
            ("grant_type", "refresh_token".to_string()),
            ("refresh_token", refresh.to_string()),
            (
                "resource",
                match &token.resource {
                    Some(r) => r.clone(),
                    None => self.resource_param().await,
                },
            ),
        ];
        let ex = Exchange {
            step: AuthStep::Refresh,
            endpoint: token.token_endpoint.clone(),
            client: token.client.clone(),
            params,
            issuer: token.issuer.clone(),
            asked: token.scopes.clone(),
            previous_refresh: Some(refresh.to_string()),
        };
        let renewed = self.exchange(identity, ex, renewing, across).await?;
        tracing::debug!(server = %self.server, "token refreshed");
        Ok(renewed)
    }

    /// The `resource` parameter of a refresh of a token that does not name its own:
    /// the resource metadata's `resource`, if discovered, else this URL without
    /// credentials, query or fragment (what the authorization server is told must not
    /// carry what the URL hides).
    async fn resource_param(&self) -> String {
        match self.discovered.lock().await.as_ref() {
            Some(d) => d.resource.resource.clone(),
            None => crate::util::text::url_shown(&self.url),
        }
    }

    async fn client_credentials(
        &self,
        identity: Option<&str>,
        challenge: Option<&Challenge>,
        renewing: &mut Renewing,
    ) -> Result<Token, AuthError> {
        let step = AuthStep::ClientCredentials;
        let empty = Challenge::default();
        let challenge = challenge.unwrap_or(&empty);
        let d = self.discover(challenge).await?;
        let Some(id) = self.config.client_id.clone() else {
            return Err(self.err(step, AuthFailure::NoClientIdentity));
        };
        let secret = self.config.client_secret.clone().filter(|s| !s.is_empty());
        let client = ClientIdentity {
            client_id: id,
            auth: Self::auth_method(&d, secret.is_some(), None),
            client_secret: secret,
        };
        let scopes = self.scopes(identity, challenge, &d);
        let mut params = vec![
            ("grant_type", "client_credentials".to_string()),
            ("resource", d.resource.resource.clone()),
        ];
        if !scopes.is_empty() {
            params.push(("scope", scopes.join(" ")));
        }
        let ex = Exchange::grant(step, &d, client, params, scopes);
        self.exchange(identity, ex, renewing, None).await
    }

    /// The authorization code grant with a person (see the module docs).
    /// A person's sign-in, all of it (discovery, registration, the person, the token)
    /// within the context's `timeout`.
    async fn authorize(
        &self,
        identity: Option<&str>,
        challenge: &Challenge,
        renewing: &mut Renewing,
    ) -> Result<Token, AuthError> {
        let timeout = self.ctx.timeout;
        tokio::time::timeout(timeout, self.authorize_now(identity, challenge, renewing))
            .await
            .unwrap_or_else(|_| {
                Err(self.err(AuthStep::Authorization, AuthFailure::Timeout(timeout)))
            })
    }

    async fn authorize_now(
        &self,
        identity: Option<&str>,
        challenge: &Challenge,
        renewing: &mut Renewing,
    ) -> Result<Token, AuthError> {
        let step = AuthStep::Authorization;
        let d = self.discover(challenge).await?;
        discovery::check_for_code_grant(&d.server)
            .map_err(|f| self.err(AuthStep::ServerMetadata, f))?;
        let Some(authorizer) = self.ctx.authorizer.clone() else {
            return Err(self.err(step, AuthFailure::NeedsPerson(self.server.clone())));
        };
        let scopes = self.scopes(identity, challenge, &d);
        let request = SignInRequest {
            server: self.server.clone(),
            identity: identity.map(String::from),
            issuer: d.server.issuer.clone(),
            scopes: scopes.clone(),
            clients: Some((self.http.clone(), self.direct.clone())),
        };
        let session = authorizer
            .start(&request)
            .await
            .map_err(|e| self.err(step, AuthFailure::Authorizer(e)))?;
        let redirect_uri = session.redirect_uri();
        let client = self
            .client_identity(&d, Some(&redirect_uri), &scopes)
            .await?;
        let random = |n| random_b64(n).map_err(|e| self.err(step, AuthFailure::Authorizer(e)));
        let (verifier, state) = (random(32)?, random(32)?);
        let Some(endpoint) = d.server.authorization_endpoint.as_deref() else {
            return Err(self.err(
                AuthStep::ServerMetadata,
                AuthFailure::Unsupported("no authorization_endpoint".into()),
            ));
        };
        let mut url = Url::parse(endpoint).map_err(|e| {
            self.err(
                step,
                AuthFailure::BadUrl {
                    url: crate::util::text::one_line(endpoint, 200),
                    why: e.to_string(),
                },
            )
        })?;
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("response_type", "code")
                .append_pair("client_id", &client.client_id)
                .append_pair("redirect_uri", &redirect_uri)
                .append_pair("code_challenge", &code_challenge(&verifier))
                .append_pair("code_challenge_method", "S256")
                .append_pair("state", &state)
                .append_pair("resource", &d.resource.resource);
            if !scopes.is_empty() {
                q.append_pair("scope", &scopes.join(" "));
            }
        }
        let back = session
            .finish(url.to_string())
            .await
            .map_err(|e| self.err(step, AuthFailure::Authorizer(e)))?;
        let client_id = client.client_id.clone();
        let code = self.check_redirect(&back, &state, &d).map_err(|f| {
            self.forget_if_unknown(&d, &client_id, &f);
            self.err(step, f)
        })?;
        let params = vec![
            ("grant_type", "authorization_code".to_string()),
            ("code", code),
            ("redirect_uri", redirect_uri),
            ("code_verifier", verifier),
            ("resource", d.resource.resource.clone()),
        ];
        let ex = Exchange::grant(AuthStep::Token, &d, client, params, scopes);
        let token = self
            .exchange(identity, ex, renewing, None)
            .await
            .inspect_err(|e| self.forget_if_unknown(&d, &client_id, &e.failure))?;
        tracing::info!(server = %self.server, identity = ?identity, "signed in");
        Ok(token)
    }

    /// After a sign-in refused with `invalid_client` (the authorization server lost
    /// its registrations in a restart, or let the client expire): its registration is
    /// forgotten, so that the next sign-in registers anew instead of failing with it
    /// until the harness restarts. (A configured client is no registration: untouched.)
    fn forget_if_unknown(&self, d: &Discovered, client_id: &str, failure: &AuthFailure) {
        if matches!(failure, AuthFailure::Refused { error, .. } if error == "invalid_client") {
            tracing::warn!(server = %self.server, "the authorization server does not know this client; the next sign-in registers anew");
            self.ctx.registrations.forget(&d.server.issuer, client_id);
        }
    }

    /// The redirect back: its `state` must be ours and its `iss` (RFC 9207) right
    /// before anything else in it is read; then the code, or the refusal.
    fn check_redirect(
        &self,
        back: &str,
        state: &str,
        d: &Discovered,
    ) -> Result<String, AuthFailure> {
        let url = Url::parse(back).map_err(|e| AuthFailure::BadRedirect(e.to_string()))?;
        let q: HashMap<String, String> = url.query_pairs().into_owned().collect();
        let states = url.query_pairs().filter(|(k, _)| k == "state").count();
        if states != 1 || q.get("state").map(String::as_str) != Some(state) {
            return Err(AuthFailure::BadRedirect(
                "its state is not this sign-in's".into(),
            ));
        }
        // Each read once: of two, the map keeps the last, which the checks below
        // would not have been made on in a parser that took the first.
        for key in ["code", "iss", "error"] {
            if url.query_pairs().filter(|(k, _)| k == key).count() > 1 {
                return Err(AuthFailure::BadRedirect(format!("it names {key} twice")));
            }
        }
        match (
            q.get("iss"),
            d.server.authorization_response_iss_parameter_supported,
        ) {
            (Some(iss), _) if iss != &d.server.issuer => {
                return Err(AuthFailure::BadRedirect(format!(
                    "iss {} is not the issuer {}",
                    crate::util::text::one_line(iss, 200),
                    crate::util::text::one_line(&d.server.issuer, 200)
                )));
            }
            (None, true) => {
                return Err(AuthFailure::BadRedirect(
                    "no iss, which this authorization server promises".into(),
                ));
            }
            _ => {}
        }
        if let Some(error) = q.get("error") {
            return Err(AuthFailure::Refused {
                error: crate::util::text::one_line(error, 100),
                description: q
                    .get("error_description")
                    .map(|s| crate::util::text::one_line(s, 200)),
            });
        }
        q.get("code")
            .cloned()
            .ok_or_else(|| AuthFailure::BadRedirect("no code".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn token(issuer: &str, endpoint: &str) -> Token {
        Token {
            access_token: "a".into(),
            refresh_token: Some("r".into()),
            expires_at_ms: None,
            issued_at_ms: None,
            scopes: Vec::new(),
            issuer: issuer.into(),
            token_endpoint: endpoint.into(),
            client: ClientIdentity {
                client_id: "c".into(),
                client_secret: None,
                auth: ClientAuth::None,
            },
            resource: None,
        }
    }

    /// A registration forgotten while a sign-in holds its slot (reading the old client
    /// as it is refused) is not handed out again once that sign-in lets go.
    #[tokio::test]
    async fn a_registration_forgotten_while_its_slot_is_held_is_made_again() {
        let registrations = Registrations::default();
        let slot = registrations.slot(RegistrationKey::new("https://as", None, &[]));
        let client = |id: &str| ClientIdentity {
            client_id: id.into(),
            client_secret: None,
            auth: ClientAuth::None,
        };
        let mut made = slot.lock().await;
        registrations.keep("https://as", &mut made, client("old"));
        registrations.forget("https://as", "old");
        drop(made);
        let mut made = slot.lock().await;
        assert!(registrations.current("https://as", &mut made).is_none());
        assert!(made.is_none(), "the slot is emptied, to register again");
        // An authorization server that hands the same id out again is believed.
        registrations.keep("https://as", &mut made, client("old"));
        assert_eq!(
            registrations
                .current("https://as", &mut made)
                .map(|c| c.client_id),
            Some("old".to_string())
        );
        // Another authorization server's word on the same id touches nothing here,
        // nor does the forgetting of another client.
        registrations.forget("https://other-as", "old");
        assert!(registrations.current("https://as", &mut made).is_some());
        registrations.keep("https://as", &mut made, client("other"));
        registrations.forget("https://as", "old");
        assert!(registrations.current("https://as", &mut made).is_some());
    }

    /// A store that counts its reads (another process may write into `inner`).
    #[derive(Default)]
    struct Counting {
        inner: MemoryTokenStore,
        reads: AtomicUsize,
    }

    impl TokenStore for Counting {
        fn get(&self, key: &TokenKey) -> Result<Option<Token>, String> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            self.inner.get(key)
        }
        fn put(&self, key: &TokenKey, token: &Token) -> Result<(), String> {
            self.inner.put(key, token)
        }
        fn remove(&self, key: &TokenKey) -> Result<(), String> {
            self.inner.remove(key)
        }
        fn remove_server(&self, server: &str) -> Result<usize, String> {
            self.inner.remove_server(server)
        }
    }

    /// A deadline no test reaches.
    fn soon() -> tokio::time::Instant {
        tokio::time::Instant::now() + Duration::from_secs(30)
    }

    /// A sign-in for a server on loopback, over a store that counts its reads.
    fn counted() -> (Arc<SignIn>, Arc<Counting>) {
        let url = Url::parse("http://127.0.0.1:9/mcp").expect("url");
        let store = Arc::new(Counting::default());
        let ctx = SignInContext {
            store: store.clone(),
            ..SignInContext::default()
        };
        let tls = client_tls(None).expect("tls");
        let sign_in = SignIn::new("s", &url, OAuthConfig::default(), ctx, tls).expect("sign-in");
        (sign_in, store)
    }

    #[test]
    fn tokens_and_clients_past_their_bounds_are_refused() {
        let long = "a".repeat(MAX_TOKEN_BYTES + 1);
        assert!(token_sizes("at", None).is_ok());
        assert!(token_sizes(&"a".repeat(MAX_TOKEN_BYTES), Some("rt")).is_ok());
        for (access, refresh) in [(long.as_str(), None), ("at", Some(long.as_str()))] {
            let e = token_sizes(access, refresh).expect_err("too long");
            assert!(e.to_string().contains("KiB"), "{e}");
        }
        let long = "c".repeat(MAX_CLIENT_BYTES + 1);
        assert!(client_sizes("id", Some("secret")).is_ok());
        assert!(client_sizes(&long, None).is_err());
        assert!(client_sizes("id", Some(&long)).is_err());
    }

    #[test]
    fn a_server_without_a_token_does_not_read_the_store_on_every_request() {
        let (sign_in, store) = counted();
        for _ in 0..100 {
            assert_eq!(sign_in.current(None), None);
        }
        // The file store was read twice per request before (every HTTP request asks).
        assert_eq!(store.reads.load(Ordering::SeqCst), 1);
        // Another process signs in (`mcp-harness login`): read again (as a refusal does),
        // the token is used from then on without reading the store.
        store
            .inner
            .put(
                &sign_in.key(None),
                &token("https://idp.example", "https://idp.example/t"),
            )
            .expect("put");
        let fresh = sign_in.read_store(None).map(|t| t.access_token);
        assert_eq!(fresh.as_deref(), Some("a"));
        assert_eq!(sign_in.current(None).as_deref(), Some("a"));
        assert_eq!(store.reads.load(Ordering::SeqCst), 2);
        // Other auth contexts each cost one read, and a flood of them stays bounded.
        for i in 0..(MISSING_MEMO + 10) {
            assert_eq!(sign_in.current(Some(&format!("user-{i}"))), None);
        }
        assert!(sign_in.missing.lock().len() <= MISSING_MEMO);
        assert_eq!(store.reads.load(Ordering::SeqCst), 2 + MISSING_MEMO + 10);
    }

    #[tokio::test]
    async fn a_token_due_for_refresh_is_taken_from_the_store_when_another_process_renewed_it() {
        let (sign_in, store) = counted();
        // Held here, within the refresh margin of its expiry.
        let mut ours = token("https://idp.example", "https://idp.example/t");
        ours.expires_at_ms = Some(now_ms() + 1_000);
        sign_in.keep(None, ours.clone());
        // Another process refreshed it (rotating the refresh token) and stored the result.
        let mut theirs = ours.clone();
        theirs.access_token = "b".into();
        theirs.refresh_token = Some("r2".into());
        theirs.expires_at_ms = Some(now_ms() + 3_600_000);
        store.inner.put(&sign_in.key(None), &theirs).expect("put");
        // Its token is used: no refresh (which would need the network, and would spend
        // the old refresh token that the authorization server has rotated away).
        let bearer = sign_in.bearer(None, soon()).await.expect("bearer");
        assert_eq!(bearer.as_deref(), Some("b"));
        assert_eq!(sign_in.current(None).as_deref(), Some("b"));
    }

    #[tokio::test]
    async fn a_refusal_reads_the_store_again_for_what_another_process_signed_in() {
        let (sign_in, store) = counted();
        assert_eq!(sign_in.current(None), None);
        // `mcp-harness login` in another process, within the second "none" is believed.
        let key = sign_in.key(None);
        let mut theirs = token("https://idp.example", "https://idp.example/t");
        store.inner.put(&key, &theirs).expect("put");
        // The request went without a token and was refused: the token is found, and no
        // sign-in (which would need the network) is started.
        let taken = sign_in
            .on_refused(None, &Challenge::default(), None, false, true)
            .await
            .expect("the kept token is used");
        assert_eq!(taken, Renewal::Held);
        assert_eq!(sign_in.current(None).as_deref(), Some("a"));
        // The other process refreshes it (rotating the refresh token); this one's "a" is
        // refused: the store's is taken, not a refresh with the old refresh token.
        theirs.access_token = "b".into();
        theirs.refresh_token = Some("r2".into());
        store.inner.put(&key, &theirs).expect("put");
        let taken = sign_in
            .on_refused(None, &Challenge::default(), Some("a"), false, true)
            .await
            .expect("the store's token is used");
        assert_eq!(taken, Renewal::Held);
        assert_eq!(sign_in.current(None).as_deref(), Some("b"));
        // Refused too: asked again without taking what is held, it is renewed (here
        // that means signing in, which fails: no server listens and nobody can sign in).
        let renewed = sign_in
            .on_refused(None, &Challenge::default(), Some("b"), false, false)
            .await;
        assert!(renewed.is_err(), "{renewed:?}");
    }

    #[test]
    fn per_context_memos_stay_bounded_under_a_flood_of_auth_contexts() {
        let (sign_in, _) = counted();
        let held = sign_in.lock_for(Some("held"));
        for i in 0..(3 * MISSING_MEMO) {
            let who = format!("user-{i}");
            drop(sign_in.lock_for(Some(&who)));
            sign_in.keep(
                Some(&who),
                token("https://idp.example", "https://idp.example/t"),
            );
        }
        assert!(sign_in.ctx.renewals.0.lock().len() <= MISSING_MEMO + 1);
        assert!(sign_in.renewed.lock().len() <= MISSING_MEMO);
        // A lock someone holds is never dropped from under them.
        assert!(Arc::ptr_eq(&held, &sign_in.lock_for(Some("held"))));
    }

    #[test]
    fn a_token_reply_is_read_as_servers_send_it_and_never_quoted_when_it_cannot_be() {
        let reply = |expires: Value| {
            serde_json::from_value::<TokenReply>(
                json!({"access_token": "at-SECRET", "token_type": "Bearer", "expires_in": expires}),
            )
            .map(|r| r.expires_in)
        };
        assert_eq!(reply(json!(3599)).expect("a number"), Some(3599));
        assert_eq!(
            reply(json!("3599")).expect("a string of digits"),
            Some(3599)
        );
        assert_eq!(reply(json!(3599.7)).expect("a fraction"), Some(3599));
        assert_eq!(reply(json!(-5)).expect("read"), None);
        assert_eq!(reply(json!([1])).expect("read"), None);
        // A 200 whose shape is wrong is named, not quoted: the body holds the tokens.
        let body = br#"{"access_token": ["at-SECRET"], "refresh_token": "rt-SECRET"}"#;
        let e = serde_json::from_slice::<TokenReply>(body)
            .err()
            .expect("not a token reply");
        let failure = not_a_token_reply(body, &e).to_string();
        assert!(!failure.contains("SECRET"), "{failure}");
        assert!(failure.contains("not a token reply"), "{failure}");
        // An error sent with 200 is still read as one.
        let body = br#"{"error": "invalid_grant"}"#;
        let e = serde_json::from_slice::<TokenReply>(body)
            .err()
            .expect("an error");
        assert!(matches!(
            not_a_token_reply(body, &e),
            AuthFailure::Refused { .. }
        ));
        // A JSON reply of another status that names no error (a token endpoint's 201
        // with the tokens, a 500 echoing the request) is described; an error page is
        // quoted.
        let body = br#"{"access_token": "at-SECRET", "refresh_token": "rt-SECRET"}"#;
        let failure = oauth_error(500, body).to_string();
        assert!(!failure.contains("SECRET"), "{failure}");
        assert!(failure.contains("500"), "{failure}");
        let failure = oauth_error(502, b"<html>Bad Gateway</html>").to_string();
        assert!(failure.contains("Bad Gateway"), "{failure}");
    }

    #[test]
    fn an_access_token_a_header_cannot_carry_is_refused() {
        for bad in ["", "abc\ndef", "a b", "t\u{7f}", "tök"] {
            assert!(sendable_token(bad).is_err(), "{bad:?}");
        }
        assert!(sendable_token("eyJhbGciOi.J9-_~+/x==").is_ok());
    }

    #[test]
    fn an_outage_with_a_json_error_page_is_retried_and_a_refusal_is_not() {
        let err = |status, body: &[u8]| AuthError {
            server: "s".into(),
            step: AuthStep::Refresh,
            failure: oauth_error(status, body),
            refused: None,
        };
        for (status, body) in [
            (503, &br#"{"status":503,"error":"Service Unavailable"}"#[..]),
            (429, br#"{"error":"too_many_requests"}"#),
            (503, br#"{"error":"temporarily_unavailable"}"#),
        ] {
            let e = err(status, body);
            assert!(e.transient() && !e.needs_login(), "{e}");
        }
        // RFC 6749's refusals stay refusals, even sent with a 5xx.
        let e = err(500, br#"{"error":"invalid_grant"}"#);
        assert!(!e.transient() && e.needs_login(), "{e}");
        let e = err(400, br#"{"error":"Service Unavailable"}"#);
        assert!(!e.transient(), "{e}");
    }

    #[test]
    fn an_authorization_servers_error_code_is_bounded_and_escaped() {
        let body = serde_json::to_vec(&json!({
            "error": format!("\u{1b}]0;owned\u{7}{}", "x".repeat(1 << 20)),
            "error_description": "\u{202e}reversed",
        }))
        .expect("json");
        let AuthFailure::Refused { error, description } = oauth_error(400, &body) else {
            panic!("a refusal");
        };
        assert!(error.len() < 300, "{} bytes", error.len());
        assert!(
            !error.contains('\u{1b}') && !error.contains('\u{7}'),
            "{error:?}"
        );
        assert!(!description.unwrap_or_default().contains('\u{202e}'));
        let AuthFailure::Refused { error, .. } = oauth_error(400, br#"{"error":"invalid_grant"}"#)
        else {
            panic!("a refusal");
        };
        assert_eq!(error, "invalid_grant");
    }

    #[tokio::test]
    async fn a_request_refused_again_takes_what_another_request_renewed_meanwhile() {
        let (sign_in, store) = counted();
        // Another process's token, taken after a first refusal and refused too.
        let mut theirs = token("https://idp.example", "https://idp.example/t");
        theirs.access_token = "b".into();
        store.inner.put(&sign_in.key(None), &theirs).expect("put");
        assert_eq!(
            sign_in.read_store(None).map(|t| t.access_token).as_deref(),
            Some("b")
        );
        // Another request of this process, refused "b" first, renewed to "c".
        let mut ours = theirs.clone();
        ours.access_token = "c".into();
        sign_in.keep(None, ours);
        // This request's second refusal ("b" again) takes "c": no second refresh (here
        // it would need the network, and fail: nothing listens).
        let taken = sign_in
            .on_refused(None, &Challenge::default(), Some("b"), false, false)
            .await
            .expect("what was renewed here is taken");
        assert_eq!(taken, Renewal::Renewed);
        assert_eq!(sign_in.current(None).as_deref(), Some("c"));
        // A token another process stored is still not taken a second time.
        let mut stored = theirs.clone();
        stored.access_token = "d".into();
        store.inner.put(&sign_in.key(None), &stored).expect("put");
        let renewed = sign_in
            .on_refused(None, &Challenge::default(), Some("c"), false, false)
            .await;
        assert!(renewed.is_err(), "{renewed:?}");
    }

    // A spec built in code is held to what a config's check holds it to: a secret with
    // no issuer would go to whichever authorization server the server names.
    #[test]
    fn a_client_secret_without_an_issuer_is_refused_however_the_spec_was_made() {
        let url = Url::parse("https://mcp.example.com/mcp").expect("url");
        let config = |issuer: Option<&str>| OAuthConfig {
            client_id: Some("id".into()),
            client_secret: Some("secret".into()),
            issuer: issuer.map(String::from),
            ..OAuthConfig::default()
        };
        let tls = client_tls(None).expect("tls");
        let refused = SignIn::new(
            "s",
            &url,
            config(None),
            SignInContext::default(),
            tls.clone(),
        );
        assert!(refused.is_err_and(|e| e.contains("issuer")));
        let pinned = config(Some("https://idp.example"));
        assert!(SignIn::new("s", &url, pinned, SignInContext::default(), tls).is_ok());
    }

    #[test]
    fn a_kept_token_is_refreshed_only_where_sign_in_would_go_now() {
        let url = Url::parse("https://mcp.example.com/mcp").expect("url");
        let config = OAuthConfig {
            issuer: Some("https://idp.example".into()),
            ..OAuthConfig::default()
        };
        let tls = client_tls(None).expect("tls");
        let sign_in =
            SignIn::new("s", &url, config, SignInContext::default(), tls).expect("sign-in");
        assert!(sign_in.still_trusted(&token("https://idp.example", "https://idp.example/token")));
        assert!(
            !sign_in.still_trusted(&token("https://evil.example", "https://evil.example/token"))
        );
        assert!(!sign_in.still_trusted(&token("https://idp.example", "https://10.0.0.1/token")));
    }

    #[test]
    fn a_registration_serves_a_loopback_redirect_on_any_port_and_other_uris_exactly() {
        let key = |uri: &str, scopes: &[&str]| {
            let scopes: Vec<String> = scopes.iter().map(|s| s.to_string()).collect();
            RegistrationKey::new("https://as.example", Some(uri), &scopes)
        };
        let one = key("http://127.0.0.1:4711/callback", &["b", "a"]);
        assert_eq!(one, key("http://127.0.0.1:5000/callback", &["a", "b", "a"]));
        assert_eq!(key("http://[::1]:1/cb", &[]), key("http://[::1]:2/cb", &[]));
        assert_ne!(one, key("http://127.0.0.1:4711/other", &["a", "b"]));
        assert_ne!(one, key("http://127.0.0.1:4711/callback", &["a"]));
        // Not loopback, or not plain HTTP: the port is the client's to keep.
        assert_ne!(
            key("https://app.example:1/cb", &[]),
            key("https://app.example:2/cb", &[])
        );
        assert_ne!(
            key("http://localhost:1/cb", &[]),
            key("http://localhost:2/cb", &[])
        );
        assert_ne!(
            key("https://127.0.0.1:1/cb", &[]),
            key("https://127.0.0.1:2/cb", &[])
        );
    }

    #[test]
    fn scopes_a_server_names_are_kept_bounded_and_well_formed() {
        let mut asked = vec!["read".to_string()];
        let named = [
            "write",
            "read",
            "bad scope",
            "quote\"d",
            "",
            &"x".repeat(300),
        ];
        remember(&mut asked, named.map(String::from).to_vec());
        assert_eq!(asked, ["read", "write"]);
        remember(&mut asked, (0..10_000).map(|i| format!("s{i}")).collect());
        assert_eq!(asked.len(), MAX_SCOPES);
        // The newest refusal's scope is always kept; the oldest go.
        remember(&mut asked, vec!["admin".into()]);
        assert_eq!(asked.last().map(String::as_str), Some("admin"));
        assert_eq!(asked.len(), MAX_SCOPES);
        assert!(!asked.contains(&"read".to_string()));
    }

    #[test]
    fn a_token_replys_scopes_are_well_formed_and_bounded() {
        let huge: String = (0..250_000).map(|i| format!("s{i} ")).collect();
        let scopes = granted(Some(&huge), &[]);
        assert_eq!(scopes.len(), MAX_SCOPES);
        assert_eq!(
            granted(Some("read \"bad\" write"), &[]),
            ["read".to_string(), "write".to_string()]
        );
        assert_eq!(granted(None, &["asked".into()]), ["asked".to_string()]);
    }

    #[tokio::test]
    async fn an_expired_token_is_not_sent_and_its_refusal_renews_it() {
        let (sign_in, _) = counted();
        // Signed in here, without a refresh token, and expired since.
        let mut ours = token("https://idp.example", "https://idp.example/t");
        ours.refresh_token = None;
        ours.expires_at_ms = Some(now_ms() - 1_000);
        sign_in.keep(None, ours);
        assert_eq!(sign_in.bearer(None, soon()).await.expect("bearer"), None);
        assert_eq!(sign_in.sendable(None), None, "an expired token is not sent");
        assert_eq!(
            sign_in.current(None).as_deref(),
            Some("a"),
            "but still held"
        );
        // Its refusal is of no token: not answered by taking the expired token again
        // (which would refuse every request until a restart), but by signing in, which
        // fails here (nothing listens, nobody can sign in).
        for take_held in [true, false] {
            let renewed = sign_in
                .on_refused(None, &Challenge::default(), None, false, take_held)
                .await;
            assert!(renewed.is_err(), "{renewed:?}");
        }
    }

    #[tokio::test]
    async fn a_token_renewed_on_a_refusal_and_refused_again_later_is_not_refreshed_again() {
        let (sign_in, _) = counted();
        // Refreshable where it came from (nothing listens there).
        let renewed = token("https://idp.example", "https://127.0.0.1:9/token");
        sign_in.keep(None, renewed.clone());
        // The server refused it within the last minute: refused as it is, not renewed.
        sign_in
            .renewed_on_refusal
            .lock()
            .insert(None, (renewed.access_token.clone(), Instant::now()));
        let again = sign_in
            .on_refused(None, &Challenge::default(), Some("a"), false, false)
            .await;
        assert!(matches!(again, Ok(Renewal::Refused)), "{again:?}");
        // Past the minute: not refreshed there once more (for ever, once a minute), but
        // signed in anew from a fresh discovery (which fails here: nothing listens).
        let Some(long_ago) =
            Instant::now().checked_sub(REFUSED_AGAIN_WINDOW + Duration::from_secs(1))
        else {
            return;
        };
        sign_in
            .renewed_on_refusal
            .lock()
            .insert(None, (renewed.access_token.clone(), long_ago));
        let e = sign_in
            .on_refused(None, &Challenge::default(), Some("a"), false, false)
            .await
            .expect_err("nobody can sign in here");
        assert_ne!(e.step, AuthStep::Refresh, "{e}");
        // Renewed on a refusal, then taken by the server (it served), and refused later
        // (the server restarted): refreshed as any token is.
        sign_in.keep(None, renewed.clone());
        sign_in
            .renewed_on_refusal
            .lock()
            .insert(None, (renewed.access_token.clone(), long_ago));
        sign_in
            .noted_on_refusal
            .store(true, std::sync::atomic::Ordering::SeqCst);
        sign_in.accepted(None, Some("another token"));
        assert!(
            !sign_in.renewed_on_refusal.lock().is_empty(),
            "not that one"
        );
        sign_in.accepted(None, Some("a"));
        assert!(sign_in.renewed_on_refusal.lock().is_empty());
        let e = sign_in
            .on_refused(None, &Challenge::default(), Some("a"), false, false)
            .await
            .expect_err("nothing listens");
        assert_eq!(e.step, AuthStep::Refresh, "{e}");
    }

    // The server is reached to learn where it is at most once a minute: through a
    // proxy the answer never comes, and each token request reached it first.
    #[test]
    fn the_server_is_probed_for_where_it_is_at_most_once_a_minute() {
        let (sign_in, _) = counted();
        assert!(sign_in.probe_due());
        assert!(!sign_in.probe_due());
        let Some(long_ago) =
            Instant::now().checked_sub(REFUSED_AGAIN_WINDOW + Duration::from_secs(1))
        else {
            return;
        };
        *sign_in.probed_at.lock() = Some(long_ago);
        assert!(sign_in.probe_due());
    }

    // A registration's method is what its client uses when the metadata lists none
    // (RFC 8414's `client_secret_basic` is only the default); a listed one must be in
    // the list, and a secret method needs a secret.
    #[test]
    fn a_registered_method_is_used_unless_the_metadata_lists_others() {
        let with = |methods: Option<&[&str]>| Discovered {
            resource: serde_json::from_value(json!({"resource": "https://mcp.example/mcp"}))
                .expect("resource"),
            server: serde_json::from_value(json!({
                "issuer": "https://idp.example",
                "token_endpoint": "https://idp.example/token",
                "token_endpoint_auth_methods_supported": methods,
            }))
            .expect("metadata"),
            from: Url::parse("https://mcp.example/.well-known/oauth-protected-resource")
                .expect("url"),
        };
        let (post, basic) = (ClientAuth::ClientSecretPost, ClientAuth::ClientSecretBasic);
        assert_eq!(SignIn::auth_method(&with(None), true, Some(post)), post);
        assert_eq!(SignIn::auth_method(&with(None), true, None), basic);
        assert_eq!(
            SignIn::auth_method(&with(Some(&["client_secret_basic"])), true, Some(post)),
            basic
        );
        assert_eq!(
            SignIn::auth_method(
                &with(Some(&["client_secret_post", "none"])),
                true,
                Some(post)
            ),
            post
        );
        assert_eq!(
            SignIn::auth_method(&with(None), false, Some(post)),
            ClientAuth::None
        );
    }

    // A sign-in refused (the person declined) is not begun again for a minute: the next
    // refusal stands without a prompt. A step-up refused is noted as one, and leaves
    // the scopes asked for as they were.
    #[tokio::test]
    async fn a_refused_sign_in_is_not_begun_again_at_once_and_a_refused_step_up_asks_no_more() {
        let (sign_in, _) = counted();
        let asking = |scope: &str| Challenge {
            params: [("scope".to_string(), scope.to_string())].into(),
        };
        let declined = || -> Result<(), AuthError> {
            Err(sign_in.err(
                AuthStep::Authorization,
                AuthFailure::Refused {
                    error: "access_denied".into(),
                    description: None,
                },
            ))
        };
        let challenge = asking("read");
        assert!(
            sign_in
                .note_sign_in(None, &challenge, false, Vec::new(), declined())
                .is_err()
        );
        let renewal = sign_in
            .on_refused(None, &challenge, None, false, false)
            .await;
        assert_eq!(renewal.map_err(|e| e.failure), Ok(Renewal::Refused));
        // Another auth context's sign-in is its own.
        let other = sign_in
            .on_refused(Some("bob"), &challenge, None, false, false)
            .await;
        assert!(other.is_err(), "{other:?}");

        let mut held = token("https://idp.example", "https://idp.example/t");
        held.scopes = vec!["read".into()];
        sign_in.keep(None, held);
        sign_in
            .asked
            .lock()
            .insert(None, vec!["read".into(), "admin".into()]);
        let step_up = asking("admin");
        assert!(
            sign_in
                .note_sign_in(None, &step_up, true, vec!["read".into()], declined())
                .is_err()
        );
        assert!(sign_in.step_up_denied(None, &step_up));
        assert_eq!(
            sign_in.asked.lock().get(&None),
            Some(&vec!["read".to_string()])
        );
        // A sign-in granted clears the refusal.
        assert!(
            sign_in
                .note_sign_in(None, &challenge, false, Vec::new(), Ok(()))
                .is_ok()
        );
        assert!(sign_in.sign_in_refused.lock().is_empty());
        // A refusal after which signing in again helps (an expired code, a registered
        // client the server forgot) is not held: the next sign-in is begun at once.
        let at_token = |error: &str| -> Result<(), AuthError> {
            Err(sign_in.err(
                AuthStep::Token,
                AuthFailure::Refused {
                    error: error.into(),
                    description: None,
                },
            ))
        };
        for passing in ["invalid_client", "invalid_grant", "temporarily_unavailable"] {
            let _ = sign_in.note_sign_in(None, &challenge, false, Vec::new(), at_token(passing));
            assert!(sign_in.sign_in_refused.lock().is_empty(), "{passing}");
        }
        // One the same sign-in would meet again is, wherever it came.
        let _ = sign_in.note_sign_in(
            None,
            &challenge,
            false,
            Vec::new(),
            at_token("unauthorized_client"),
        );
        assert!(!sign_in.sign_in_refused.lock().is_empty());
        sign_in.sign_in_refused.lock().clear();
        // A step-up that failed otherwise (a person who never came) puts back its
        // scopes too, and is no refusal.
        sign_in.step_up_denied.lock().clear();
        sign_in
            .asked
            .lock()
            .insert(None, vec!["read".into(), "admin".into()]);
        let timed_out = Err::<(), _>(sign_in.err(
            AuthStep::Authorization,
            AuthFailure::Timeout(Duration::from_secs(300)),
        ));
        let _ = sign_in.note_sign_in(None, &step_up, true, vec!["read".into()], timed_out);
        assert_eq!(
            sign_in.asked.lock().get(&None),
            Some(&vec!["read".to_string()])
        );
        assert!(!sign_in.step_up_denied(None, &step_up));
    }

    // Scopes a step-up was not granted are not asked for again for a minute; a
    // challenge the held token answers is no repeat, whatever the memo holds.
    #[test]
    fn a_step_up_is_a_repeat_only_for_scopes_denied_and_still_lacking() {
        let (sign_in, _) = counted();
        let mut held = token("https://idp.example", "https://idp.example/t");
        held.scopes = vec!["read".into()];
        sign_in.keep(None, held);
        sign_in
            .step_up_denied
            .lock()
            .insert(None, (vec!["admin".into()], Instant::now()));
        let asking = |scope: &str| Challenge {
            params: [("scope".to_string(), scope.to_string())].into(),
        };
        assert!(sign_in.step_up_denied(None, &asking("admin")));
        assert!(sign_in.step_up_denied(None, &asking("read admin")));
        assert!(
            !sign_in.step_up_denied(None, &asking("read")),
            "held answers it"
        );
        assert!(
            !sign_in.step_up_denied(None, &asking("write")),
            "not asked yet"
        );
        assert!(!sign_in.step_up_denied(Some("other"), &asking("admin")));
    }

    #[tokio::test]
    async fn a_token_in_its_last_seconds_without_a_refresh_token_is_what_bearer_sends() {
        let (sign_in, _) = counted();
        let mut ours = token("https://idp.example", "https://idp.example/t");
        ours.refresh_token = None;
        ours.expires_at_ms = Some(now_ms() + 10_000); // within the refresh margin
        sign_in.keep(None, ours);
        // What the request sends (`sendable`) is what it says it sent (`bearer`): a
        // refusal then names this token, and renews it instead of taking it again.
        assert_eq!(
            sign_in
                .bearer(None, soon())
                .await
                .expect("bearer")
                .as_deref(),
            Some("a")
        );
        assert_eq!(sign_in.sendable(None).as_deref(), Some("a"));
    }

    #[tokio::test]
    async fn a_request_waits_for_another_ones_renewal_only_when_its_token_has_expired() {
        let (sign_in, _) = counted();
        // Another request is renewing (a person may be signing in: minutes).
        let lock = sign_in.lock_for(None);
        let _renewing = lock.lock().await;
        // A token due for refresh but still good is sent as it is, without waiting.
        let mut ours = token("https://idp.example", "https://idp.example/t");
        ours.expires_at_ms = Some(now_ms() + 10_000);
        sign_in.keep(None, ours.clone());
        let now = tokio::time::Instant::now();
        let sent = sign_in.bearer(None, now).await.expect("bearer");
        assert_eq!(sent.as_deref(), Some("a"));
        // An expired one waits for the renewal, until the request's deadline only.
        ours.expires_at_ms = Some(now_ms() - 1_000);
        sign_in.keep(None, ours);
        let until = tokio::time::Instant::now() + Duration::from_millis(200);
        let waited = tokio::time::timeout(Duration::from_secs(10), sign_in.bearer(None, until))
            .await
            .expect("held past its deadline");
        let failure = waited.map_err(|e| e.failure);
        assert!(
            matches!(failure, Err(AuthFailure::Timeout(_))),
            "{failure:?}"
        );
    }

    /// A store whose writes fail while `full` (a full disk), and can be written by
    /// "another process" (`inner`) all the same.
    #[derive(Default)]
    struct FullDisk {
        inner: MemoryTokenStore,
        full: std::sync::atomic::AtomicBool,
        /// Reads fail too (no file descriptor left, say).
        unreadable: std::sync::atomic::AtomicBool,
    }

    impl TokenStore for FullDisk {
        fn get(&self, key: &TokenKey) -> Result<Option<Token>, String> {
            if self.unreadable.load(std::sync::atomic::Ordering::SeqCst) {
                return Err("Too many open files".into());
            }
            self.inner.get(key)
        }
        fn put(&self, key: &TokenKey, token: &Token) -> Result<(), String> {
            if self.full.load(std::sync::atomic::Ordering::SeqCst) {
                return Err("No space left on device".into());
            }
            self.inner.put(key, token)
        }
        fn remove(&self, key: &TokenKey) -> Result<(), String> {
            self.inner.remove(key)
        }
        fn remove_server(&self, server: &str) -> Result<usize, String> {
            self.inner.remove_server(server)
        }
    }

    /// A store whose writes can be made to fail, and what a sign-in over it needs.
    fn on_a_full_disk() -> (Arc<FullDisk>, Url, SignInContext, rustls::ClientConfig) {
        let store = Arc::new(FullDisk::default());
        let url = Url::parse("https://mcp.example.com/mcp").expect("url");
        let ctx = SignInContext {
            store: store.clone(),
            ..SignInContext::default()
        };
        (store, url, ctx, client_tls(None).expect("tls"))
    }

    #[test]
    fn a_token_the_store_could_not_take_is_kept_over_the_stores_older_one_but_not_over_a_newer() {
        let (store, url, ctx, tls) = on_a_full_disk();
        let sign_in = SignIn::new("s", &url, OAuthConfig::default(), ctx, tls).expect("sign-in");
        // Each issued later than the one before, and so expiring later.
        let named = |access: &str, at: u64| {
            let mut t = token("https://idp.example", "https://idp.example/t");
            t.access_token = access.into();
            t.expires_at_ms = Some(now_ms() + at);
            t
        };
        let key = sign_in.key(None);
        store
            .inner
            .put(&key, &named("old", 1_000_000))
            .expect("put");
        store.full.store(true, std::sync::atomic::Ordering::SeqCst);
        sign_in.keep(None, named("new", 2_000_000));
        assert_eq!(
            sign_in.read_store(None).map(|t| t.access_token).as_deref(),
            Some("new")
        );
        assert_eq!(
            store
                .get(&key)
                .expect("get")
                .map(|t| t.access_token)
                .as_deref(),
            Some("old"),
            "left in the store"
        );
        // Another process signs in and stores its token: taken.
        store
            .inner
            .put(&key, &named("theirs", 3_000_000))
            .expect("put");
        assert_eq!(
            sign_in.read_store(None).map(|t| t.access_token).as_deref(),
            Some("theirs")
        );
        assert_eq!(sign_in.current(None).as_deref(), Some("theirs"));
        // The store could not even be read when the write failed: what it then shows
        // is taken only if it expires later than the one held.
        store
            .inner
            .put(&key, &named("older", 1_000_000))
            .expect("put");
        store
            .unreadable
            .store(true, std::sync::atomic::Ordering::SeqCst);
        sign_in.keep(None, named("newest", 4_000_000));
        store
            .unreadable
            .store(false, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            sign_in.read_store(None).map(|t| t.access_token).as_deref(),
            Some("newest")
        );
    }

    #[tokio::test]
    async fn a_logout_from_another_process_is_followed_and_nothing_is_stored_back() {
        let (sign_in, store) = counted();
        let key = sign_in.key(None);
        let mut ours = token("https://idp.example", "https://idp.example/t");
        ours.expires_at_ms = Some(now_ms() + 3_600_000);
        sign_in.keep(None, ours.clone());
        assert_eq!(sign_in.current(None).as_deref(), Some("a"));
        // `mcp-harness logout s` from another process.
        store.inner.remove_server("s").expect("logout");
        // Believed for a moment, then the store is read again and it goes.
        tokio::time::sleep(STORE_RECHECK + Duration::from_millis(100)).await;
        assert_eq!(sign_in.bearer(None, soon()).await.expect("bearer"), None);
        assert_eq!(sign_in.current(None), None);
        assert!(!sign_in.holds(None));
        // One due for refresh, signed out moments ago: not refreshed (which would
        // store it back), nor sent.
        ours.expires_at_ms = Some(now_ms() + 30_000);
        sign_in.keep(None, ours);
        store.inner.remove_server("s").expect("logout");
        assert_eq!(sign_in.bearer(None, soon()).await.expect("bearer"), None);
        assert_eq!(store.inner.get(&key).expect("get"), None, "stored back");
    }

    #[test]
    fn a_new_connection_holds_the_token_the_store_could_not_take() {
        let (store, url, ctx, tls) = on_a_full_disk();
        let conn = || {
            SignIn::new("s", &url, OAuthConfig::default(), ctx.clone(), tls.clone())
                .expect("sign-in")
        };
        let old_conn = conn();
        let mut old = token("https://idp.example", "https://idp.example/t");
        old.access_token = "old".into();
        store.inner.put(&old_conn.key(None), &old).expect("put");
        store.full.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut new = token("https://idp.example", "https://idp.example/t");
        new.access_token = "new".into();
        new.expires_at_ms = old.expires_at_ms.map(|at| at + 1_000);
        old_conn.keep(None, new);
        drop(old_conn);
        // The server reconnects: its new connection uses the newest token.
        assert_eq!(conn().current(None).as_deref(), Some("new"));
    }

    #[test]
    fn a_store_read_never_replaces_a_token_kept_since_it_began() {
        let held = HeldTokens::default();
        let key = TokenKey {
            server: "s".into(),
            resource: "https://mcp.example.com/mcp".into(),
            identity: None,
        };
        let named = |access: &str, unstored: bool| {
            let mut token = token("https://idp.example", "https://idp.example/t");
            token.access_token = access.into();
            Held {
                token,
                checked: Instant::now(),
                unstored: unstored.then_some(None),
            }
        };
        // Read T1 from the store while another connection kept T2 (held only here).
        held.insert(key.clone(), named("t2", true));
        let now = held.replace_if(key.clone(), Some("t1"), named("t1", false));
        assert_eq!(now.access_token, "t2");
        assert_eq!(
            held.get(&key).map(|h| h.token.access_token).as_deref(),
            Some("t2")
        );
        // Nothing held when the read began, T2 since: T2 stays too.
        let now = held.replace_if(key.clone(), None, named("t1", false));
        assert_eq!(now.access_token, "t2");
        // Still the one seen: replaced.
        let now = held.replace_if(key.clone(), Some("t2"), named("t3", false));
        assert_eq!(now.access_token, "t3");
        // Forgotten since (a sign-out): not brought back.
        held.remove(&key);
        held.replace_if(key.clone(), Some("t3"), named("t3", false));
        assert!(held.get(&key).is_none());
    }

    #[test]
    fn tokens_held_in_memory_stay_bounded_and_those_only_here_go_last() {
        let held = HeldTokens::default();
        let key = |i: usize| TokenKey {
            server: "s".into(),
            resource: "https://mcp.example.com/mcp".into(),
            identity: Some(format!("user-{i}")),
        };
        let entry = |unstored: bool| Held {
            token: token("https://idp.example", "https://idp.example/t"),
            checked: Instant::now(),
            unstored: unstored.then_some(None),
        };
        held.insert(key(0), entry(true));
        for i in 1..(HELD_MAX + 10) {
            held.insert(key(i), entry(false));
        }
        assert!(held.0.lock().len() <= HELD_MAX);
        assert!(held.get(&key(0)).is_some(), "held only here, kept");
        for i in 0..(HELD_MAX + 10) {
            held.insert(key(i), entry(true));
        }
        assert!(held.0.lock().len() <= HELD_MAX);
    }

    #[tokio::test]
    async fn no_token_is_sent_to_a_server_on_plain_http_beyond_loopback() {
        let store = Arc::new(MemoryTokenStore::default());
        for (url, sent) in [
            ("http://mcp.example.com/mcp", false),
            ("http://127.0.0.1:9/mcp", true),
            ("https://mcp.example.com/mcp", true),
        ] {
            let url = Url::parse(url).expect("url");
            let ctx = SignInContext {
                store: store.clone(),
                ..SignInContext::default()
            };
            let tls = client_tls(None).expect("tls");
            let sign_in =
                SignIn::new("s", &url, OAuthConfig::default(), ctx, tls).expect("sign-in");
            // Kept by an earlier version (or by the store of another process).
            let mut kept = token("https://idp.example", "https://idp.example/t");
            kept.expires_at_ms = Some(u64::MAX / 2);
            store.put(&sign_in.key(None), &kept).expect("put");
            assert_eq!(sign_in.sendable(None).is_some(), sent, "{url}");
            if !sent {
                // Nor is one refreshed or signed in for when it refuses a request.
                let renewal = sign_in
                    .on_refused(None, &Challenge::default(), None, false, true)
                    .await;
                assert!(matches!(renewal, Ok(Renewal::Refused)), "{url}");
            }
        }
    }

    /// A sign-in over a file store in a directory of its own, and a second store on the
    /// same directory: another process's view of it.
    fn over_files(name: &str) -> (Arc<SignIn>, FileTokenStore, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!(
            "mcp-harness-renewal-{name}-{}-{}",
            std::process::id(),
            now_ms()
        ));
        let url = Url::parse("http://127.0.0.1:9/mcp").expect("url");
        let ctx = SignInContext {
            store: Arc::new(FileTokenStore::new(&dir)),
            ..SignInContext::default()
        };
        let tls = client_tls(None).expect("tls");
        let sign_in = SignIn::new("s", &url, OAuthConfig::default(), ctx, tls).expect("sign-in");
        (sign_in, FileTokenStore::new(&dir), dir)
    }

    #[tokio::test]
    async fn a_refresh_waits_for_another_processs_and_takes_the_token_it_stored() {
        let (sign_in, other, dir) = over_files("wait");
        // Another process is refreshing it.
        let RenewalLock::Held(held) = other.try_lock_renewal(&sign_in.key(None)).expect("lock")
        else {
            panic!("the first lock is taken")
        };
        assert!(matches!(
            sign_in.ctx.store.try_lock_renewal(&sign_in.key(None)),
            Ok(RenewalLock::Busy)
        ));
        waits_for_a_refresh_elsewhere(&sign_in, &other, held).await;
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn a_refresh_waits_for_another_connections_whatever_the_store() {
        // Two connections of one server (an old one's refresh still under way, a new
        // one), each with its own sign-in, over a store with no lock of its own.
        let url = Url::parse("http://127.0.0.1:9/mcp").expect("url");
        let ctx = SignInContext::default();
        let tls = client_tls(None).expect("tls");
        let new = |ctx: &SignInContext| {
            SignIn::new("s", &url, OAuthConfig::default(), ctx.clone(), tls.clone())
                .expect("sign-in")
        };
        let (old_conn, new_conn) = (new(&ctx), new(&ctx));
        let held = old_conn
            .lock_for(None)
            .try_lock_owned()
            .expect("the old connection refreshes");
        waits_for_a_refresh_elsewhere(&new_conn, ctx.store.as_ref(), Box::new(held)).await;
    }

    /// `sign_in` due for a refresh while another process or connection refreshes it
    /// (holding `held`) and stores what it gets in `other`.
    async fn waits_for_a_refresh_elsewhere(
        sign_in: &SignIn,
        other: &dyn TokenStore,
        held: Box<dyn Send + Sync>,
    ) {
        let key = sign_in.key(None);
        let mut ours = token("https://idp.example", "https://idp.example/t");
        ours.expires_at_ms = Some(now_ms() + 10_000);
        sign_in.keep(None, ours.clone());
        // Due for refresh but still good: sent as it is, no refresh of our own (which
        // would need the network, and would spend the refresh token it rotates).
        let sent = sign_in.bearer(None, soon()).await.expect("bearer");
        assert_eq!(sent.as_deref(), Some("a"));
        // Expired: waits for that refresh, until its deadline only.
        ours.expires_at_ms = Some(now_ms() - 1_000);
        sign_in.keep(None, ours);
        let until = tokio::time::Instant::now() + Duration::from_millis(200);
        let waited = sign_in.bearer(None, until).await.map_err(|e| e.failure);
        assert!(matches!(waited, Err(AuthFailure::Timeout(_))), "{waited:?}");
        // The other stores what it got and lets go: that token is taken.
        let waiting = sign_in.bearer(None, soon());
        let finishing = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let mut theirs = token("https://idp.example", "https://idp.example/t");
            theirs.access_token = "b".into();
            theirs.refresh_token = Some("r2".into());
            theirs.expires_at_ms = Some(now_ms() + 3_600_000);
            other.put(&key, &theirs).expect("put");
            drop(held);
        };
        let (sent, ()) = tokio::join!(waiting, finishing);
        assert_eq!(sent.expect("bearer").as_deref(), Some("b"));
    }

    #[test]
    fn the_renewal_lock_is_one_holders_and_its_file_is_checked_like_a_tokens() {
        use std::os::unix::fs::PermissionsExt;
        let (sign_in, other, dir) = over_files("lock");
        let key = sign_in.key(None);
        let first = other.try_lock_renewal(&key).expect("lock");
        assert!(matches!(first, RenewalLock::Held(_)));
        assert!(matches!(
            sign_in.ctx.store.try_lock_renewal(&key),
            Ok(RenewalLock::Busy)
        ));
        drop(first);
        assert!(matches!(
            sign_in.ctx.store.try_lock_renewal(&key),
            Ok(RenewalLock::Held(_))
        ));
        // A lock file others may write is not used.
        let lock = std::fs::read_dir(&dir)
            .expect("dir")
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "lock"))
            .expect("a lock file");
        std::fs::set_permissions(&lock, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        assert!(other.try_lock_renewal(&key).is_err());
        // One process alone: nothing to lock across processes.
        assert!(matches!(
            MemoryTokenStore::default().try_lock_renewal(&key),
            Ok(RenewalLock::None)
        ));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn the_pkce_challenge_is_rfc_7636s() {
        assert_eq!(
            code_challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
    }

    #[test]
    fn verifiers_and_states_are_43_url_safe_characters() {
        let v = random_b64(32).expect("random");
        assert_eq!(v.len(), 43);
        assert!(
            v.bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
        );
        assert_ne!(v, random_b64(32).expect("random"));
    }
}
