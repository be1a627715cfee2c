//! Gateway mode: the harness's governed aggregate served as one MCP server, so that an
//! agent in any language points its MCP client at one endpoint and gets every tool the
//! harness governs, authorized for its principal, cached, audited.
//!
//! [`Gateway`] is the protocol core, the same for every listener: it answers one
//! downstream request for a [`Principal`], in the client's era. Downstream 2026-07-28
//! clients are served statelessly (the `_meta` envelope checked on every request); an
//! upstream `input_required` round goes down as an `input_required` result whose
//! `requestState` is sealed ([`seal`]), so any gateway process holding the same keys can
//! take the next round. Legacy (2025-11-25 / 2025-06-18) clients get the handshake, and
//! an upstream round becomes server-to-client requests on their session ([`ClientPeer`]).
//! [`http`] serves Streamable HTTP at `/mcp`, [`stdio`] one client over a pipe.
//!
//! Layer: above [`crate::harness`], which it drives through [`HarnessHandle`] only.

pub mod admin;
mod fair;
pub mod http;
pub mod identity;
pub mod jwt;
pub mod metrics;
pub mod names;
mod parked;
pub mod seal;
pub mod search;
mod side;
pub mod stdio;

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use opentelemetry::context::FutureExt as _;
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tracing::Instrument;

use crate::call::{
    CallError, CallKind, Caller, CancelToken, Delegation, ListKind, ProgressSender, ToolInfo,
};
use crate::config::HarnessConfig;
use crate::harness::{CallOptions, HarnessHandle};
use crate::protocol::error::{
    INTERNAL_ERROR, INVALID_PARAMS, METHOD_NOT_FOUND, UNSUPPORTED_PROTOCOL_VERSION,
};
use crate::protocol::meta::{
    KEY_CLIENT_CAPABILITIES, KEY_PROTOCOL_VERSION, KEY_SERVER_INFO, LEGACY_VERSIONS, MODERN,
};
use crate::protocol::{InputRequired, Request, RpcError};
use crate::server::{ListsChanged, ServerError};
use crate::util::duration;
use crate::util::text::one_line;
use crate::util::trace_context::{HeadSampler, call_span};

pub use identity::{Admitted, Credential, Identity, IdentityError, Principal, TokenEntry};
pub use names::{Names, Prefix};
pub use seal::{RoundState, SealError, Sealer};
pub use search::ToolExposure;

/// A gateway's settings: the `[gateway]` table of a config file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// Whether served names carry their server.
    #[serde(default)]
    pub prefix: Prefix,
    /// Static bearer tokens, by hash.
    #[serde(default, deserialize_with = "by_hash")]
    pub tokens: Vec<TokenEntry>,
    /// The agent of requests without credentials (none: they get 401).
    #[serde(default)]
    pub anonymous_agent: Option<String>,
    /// Origins allowed besides the listener's own host (a browser's `Origin`).
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// Host names accepted in `Host` besides loopback names and the listen address (on
    /// the MCP listener and, read at start, on `--metrics`'s), compared without case.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Largest request body read.
    #[serde(default = "default_max_body")]
    pub max_body_bytes: usize,
    /// Requests of one principal in flight at once; past it they are refused.
    #[serde(default = "default_per_principal")]
    pub max_in_flight_per_principal: usize,
    /// Long-lived streams (legacy GET streams, `subscriptions/listen`) open at once,
    /// every principal's together; past it a new one is refused (503). Read at start.
    #[serde(default = "default_max_streams")]
    pub max_streams: usize,
    /// Connections one peer address may hold open on the MCP listener at once; one
    /// more is closed at once. Read at start.
    #[serde(default = "default_per_peer")]
    pub max_connections_per_peer: usize,
    /// How long a connection may go without taking any of what the gateway writes to
    /// it; past it the connection is closed (its calls cancelled). Read at start.
    #[serde(default = "default_write_timeout", with = "duration")]
    pub write_timeout: Duration,
    /// How long a sealed `requestState` stays valid.
    #[serde(default = "default_state_ttl", with = "duration")]
    pub state_ttl: Duration,
    /// The sealing keys (`KID:BASE64URL` lines, the first seals); else
    /// `MCP_HARNESS_GATEWAY_KEYS`.
    #[serde(default)]
    pub keys_file: Option<PathBuf>,
    /// Items per page of the lists served.
    #[serde(default = "default_page_size")]
    pub page_size: usize,
    /// A legacy session idle this long is forgotten (its next request gets 404).
    #[serde(default = "default_session_idle", with = "duration")]
    pub session_idle: Duration,
    /// Instructions served in `server/discover` and `initialize`.
    #[serde(default)]
    pub instructions: Option<String>,
    /// JWTs accepted as bearer tokens (besides `tokens`).
    #[serde(default)]
    pub jwt: Option<jwt::JwtConfig>,
    /// How long a legacy client may take to answer one question of the gateway's
    /// (an elicitation on its session) before the call fails.
    #[serde(default = "default_input_timeout", with = "duration")]
    pub input_timeout: Duration,
    /// What `tools/list` serves: every tool (`full`), or the search meta-tools.
    #[serde(default)]
    pub tool_exposure: ToolExposure,
    /// Bearer tokens (by SHA-256) of the admin endpoint (`serve --admin`).
    #[serde(default, deserialize_with = "by_hash")]
    pub admin_tokens: Vec<TokenHash>,
    /// Bearer tokens (by SHA-256) that `serve --metrics` asks of scrapers; none asks
    /// for no token (a listener for loopback or a trusted network).
    #[serde(default, deserialize_with = "by_hash")]
    pub metrics_tokens: Vec<TokenHash>,
    /// Whether a client's `traceparent` marked sampled has its request traced (W3C
    /// parent-based sampling, the default); `false` decides by `trace_sample_ratio`
    /// alone, so that clients cannot have every call traced (the client's trace is
    /// still continued when the ratio keeps one).
    #[serde(default = "default_true")]
    pub follow_client_sampling: bool,
}

fn default_true() -> bool {
    true
}

fn default_max_body() -> usize {
    4 << 20
}
fn default_per_principal() -> usize {
    64
}
/// Half the HTTP listener's 1,024 connections: clients that hold streams open and never
/// read cannot take them all from clients that make requests.
fn default_max_streams() -> usize {
    512
}
/// A quarter of the listener's 1,024 connections: a peer that opens connections and
/// sends nothing cannot hold them all, while the agents on one host (every local one
/// comes from loopback) still have room.
fn default_per_peer() -> usize {
    256
}
/// Long enough for a slow client on a congested link to take the next bytes, short
/// enough that one that stopped reading gives its connection back soon (TCP alone can
/// hold it forever while the client's stack acknowledges).
fn default_write_timeout() -> Duration {
    Duration::from_secs(30)
}
fn default_state_ttl() -> Duration {
    Duration::from_secs(600)
}
fn default_page_size() -> usize {
    500
}
fn default_session_idle() -> Duration {
    Duration::from_secs(1800)
}
fn default_input_timeout() -> Duration {
    Duration::from_secs(300)
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            prefix: Prefix::default(),
            tokens: Vec::new(),
            anonymous_agent: None,
            allowed_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            max_body_bytes: default_max_body(),
            max_in_flight_per_principal: default_per_principal(),
            max_streams: default_max_streams(),
            max_connections_per_peer: default_per_peer(),
            write_timeout: default_write_timeout(),
            state_ttl: default_state_ttl(),
            keys_file: None,
            page_size: default_page_size(),
            session_idle: default_session_idle(),
            instructions: None,
            input_timeout: default_input_timeout(),
            jwt: None,
            tool_exposure: ToolExposure::default(),
            admin_tokens: Vec::new(),
            metrics_tokens: Vec::new(),
            follow_client_sampling: true,
        }
    }
}

impl GatewayConfig {
    /// Reads the `[gateway]` table (absent: the defaults).
    pub fn from_value(value: Option<Value>) -> Result<GatewayConfig, GatewayError> {
        let config: GatewayConfig = match value {
            None => GatewayConfig::default(),
            Some(v) => serde_path_to_error::deserialize(v).map_err(|e| {
                GatewayError::Config(
                    crate::util::invalid::Invalid::in_table("gateway", e).to_string(),
                )
            })?,
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks the settings as [`GatewayConfig::from_value`] does: a gateway built from
    /// a config made in code is held to them too ([`Gateway::new`], [`Gateway::reload`]).
    pub fn validate(&self) -> Result<(), GatewayError> {
        let config = self;
        // Not quoted back: a token itself put there by mistake would be printed.
        for (list, tokens) in [
            ("admin_tokens", &config.admin_tokens),
            ("metrics_tokens", &config.metrics_tokens),
        ] {
            if let Some(bad) = tokens.iter().position(|t| !t.is_hex_sha256()) {
                return Err(GatewayError::Config(format!(
                    "gateway.{list}[{bad}].sha256 is not a hex SHA-256 (64 hex digits)"
                )));
            }
        }
        if config.page_size == 0
            || config.max_in_flight_per_principal == 0
            || config.max_connections_per_peer == 0
        {
            return Err(GatewayError::Config(
                "gateway: page_size, max_in_flight_per_principal and max_connections_per_peer must be at least 1".into(),
            ));
        }
        // A semaphore holds at most usize::MAX >> 3 permits; "unlimited" written as a
        // huge number would fail every principal's first request.
        if config.max_in_flight_per_principal > MAX_IN_FLIGHT_PER_PRINCIPAL {
            return Err(GatewayError::Config(format!(
                "gateway.max_in_flight_per_principal is at most {MAX_IN_FLIGHT_PER_PRINCIPAL}"
            )));
        }
        // Compared with the request's Host without its port: one written with a port, or
        // an IPv6 address without brackets, would never match.
        if let Some((i, bad)) = config.allowed_hosts.iter().enumerate().find(|(_, h)| {
            let bracketed = h.starts_with('[') && h.ends_with(']') && h.len() > 2;
            h.is_empty()
                || h.bytes()
                    .any(|b| b.is_ascii_whitespace() || b"/@?#".contains(&b))
                || (h.contains(':') && !bracketed)
        }) {
            return Err(GatewayError::Config(format!(
                "gateway.allowed_hosts[{i}] = {:?} is not a host name without a port ([::1] for an IPv6 address)",
                crate::util::text::one_line(bad, 100)
            )));
        }
        if config.write_timeout.is_zero() {
            // Every write that waits at all would close its connection.
            return Err(GatewayError::Config(
                "gateway.write_timeout must be more than zero".into(),
            ));
        }
        // A zero state_ttl expires every state before it comes back (no round could
        // finish), a zero session_idle forgets every legacy session before its second
        // request, a zero input_timeout fails every question to a client at once.
        for (field, d) in [
            ("state_ttl", config.state_ttl),
            ("session_idle", config.session_idle),
            ("input_timeout", config.input_timeout),
        ] {
            if d.is_zero() {
                return Err(GatewayError::Config(format!(
                    "gateway.{field} must be more than zero"
                )));
            }
        }
        Ok(())
    }

    /// The sealing keys: `keys_file`, else `MCP_HARNESS_GATEWAY_KEYS`; neither is an
    /// error (keys are never made up silently).
    pub fn sealer(&self) -> Result<Sealer, GatewayError> {
        if let Some(path) = &self.keys_file {
            // Whoever reads the keys can forge any principal's state: the file is held
            // to what any secret file is (this user's, not others' to read or change).
            let bytes =
                crate::util::secret::read_secret_file(path, 1).map_err(GatewayError::Keys)?;
            let text = String::from_utf8(bytes)
                .map_err(|_| GatewayError::Keys(format!("{}: not UTF-8 text", path.display())))?;
            return Sealer::from_text(&text, self.state_ttl);
        }
        match std::env::var("MCP_HARNESS_GATEWAY_KEYS") {
            Ok(text) => Sealer::from_text(&text, self.state_ttl),
            Err(_) => Err(GatewayError::Keys(
                "no sealing keys: set gateway.keys_file or MCP_HARNESS_GATEWAY_KEYS (make one with `mcp-harness serve --new-key`), or pass --dev-keys".into(),
            )),
        }
    }
}

/// What can go wrong setting a gateway up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatewayError {
    /// The `[gateway]` settings are wrong.
    #[error("{0}")]
    Config(String),
    /// The sealing keys are missing or wrong.
    #[error("sealing keys: {0}")]
    Keys(String),
    /// The listener could not be set up.
    #[error("listener: {0}")]
    Listen(#[from] std::io::Error),
}

/// The boxed future a [`ClientPeer`] returns.
pub type PeerFuture = Pin<Box<dyn Future<Output = Result<Value, RpcError>> + Send>>;

/// A legacy client's side of its session: the gateway sends it requests
/// (`elicitation/create`, `sampling/createMessage`, `roots/list`) and waits for answers.
pub trait ClientPeer: Send + Sync {
    /// Sends `method` with `params` to the client; its answer.
    fn request(&self, method: &str, params: Value) -> PeerFuture;
}

/// Questions at most awaiting one legacy client's answers at once.
pub(crate) const MAX_QUESTIONS: usize = 64;

/// The gateway's questions to one legacy client (its session's, or the pipe's) that
/// await answers, by request id.
#[derive(Default)]
pub(crate) struct Questions(Mutex<Asked>);

#[derive(Default)]
struct Asked {
    waiting:
        HashMap<crate::protocol::RequestId, tokio::sync::oneshot::Sender<Result<Value, RpcError>>>,
    /// Nobody will answer any more (the client went away): new questions fail at once.
    over: bool,
    /// Bodies being read as answers ([`Questions::reading_answer`]).
    reading: usize,
}

/// A body read as an answer to one of a client's questions, counted until dropped.
pub(crate) struct ReadingAnswer(Arc<Questions>);

impl Drop for ReadingAnswer {
    fn drop(&mut self) {
        let mut asked = self.0.0.lock();
        asked.reading = asked.reading.saturating_sub(1);
    }
}

impl Questions {
    /// Asks: `send` puts the request on the client's channel (false: it could not).
    /// The answer, or why there is none; the question is forgotten however the wait
    /// ends (answer, timeout, cancel). A question given up unanswered (the wait
    /// dropped, or past its time) is withdrawn: `withdraw` sends the client its
    /// `notifications/cancelled`, so that it stops asking a person.
    pub(crate) fn ask(
        self: &Arc<Self>,
        id: crate::protocol::RequestId,
        method: &str,
        params: Value,
        send: impl FnOnce(&crate::protocol::Message) -> bool,
        withdraw: impl FnOnce(&crate::protocol::Message) + Send + 'static,
    ) -> PeerFuture {
        let key = id_key(&id);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let admitted = {
            let mut asked = self.0.lock();
            !asked.over
                && asked.waiting.len() < MAX_QUESTIONS
                && asked.waiting.insert(key.clone(), tx).is_none()
        };
        let sent = admitted
            && send(&crate::protocol::Message::Request(Request {
                id: id.clone(),
                method: method.to_string(),
                params: Some(params),
            }));
        let forget = Forget {
            questions: self.clone(),
            key,
            withdraw: sent.then(|| {
                Box::new(move |()| {
                    withdraw(&crate::protocol::Message::Notification(
                        crate::protocol::Notification {
                            method: "notifications/cancelled".into(),
                            params: Some(json!({
                                "requestId": id,
                                "reason": "the question is no longer asked",
                            })),
                        },
                    ));
                }) as Box<dyn FnOnce(()) + Send>
            }),
        };
        Box::pin(async move {
            let _forget = forget;
            // Not the asker's request that was wrong: a failure of this side, which the
            // call it came in (or the server that asked) hears as such.
            if !sent {
                return Err(RpcError::new(
                    crate::protocol::error::INTERNAL_ERROR,
                    "the client cannot take more requests",
                ));
            }
            rx.await.unwrap_or_else(|_| {
                Err(RpcError::new(
                    crate::protocol::error::INTERNAL_ERROR,
                    "the client went away",
                ))
            })
        })
    }

    /// The client's answer to question `id`.
    pub(crate) fn answer(&self, id: &crate::protocol::RequestId, outcome: Result<Value, RpcError>) {
        if let Some(tx) = self.0.lock().waiting.remove(&id_key(id)) {
            let _ = tx.send(outcome);
        }
    }

    /// A body about to be read may be an answer: one per question waiting, so that a
    /// client with one question open cannot have its every body counted as an answer
    /// (the answers' budget is apart from the calls', and shared by all principals).
    pub(crate) fn reading_answer(self: &Arc<Self>) -> Option<ReadingAnswer> {
        let mut asked = self.0.lock();
        if asked.reading >= asked.waiting.len() {
            return None;
        }
        asked.reading += 1;
        Some(ReadingAnswer(self.clone()))
    }

    /// Nobody will answer: every wait ends at once, and so does every question asked
    /// after (a call still running may ask again).
    pub(crate) fn clear(&self) {
        let mut asked = self.0.lock();
        asked.over = true;
        asked.waiting.clear();
    }
}

struct Forget {
    questions: Arc<Questions>,
    key: crate::protocol::RequestId,
    /// Tells the client the question is withdrawn (one it was sent).
    withdraw: Option<Box<dyn FnOnce(()) + Send>>,
}

impl Drop for Forget {
    fn drop(&mut self) {
        // Still waiting: neither answered nor ended with the client.
        let unanswered = self.questions.0.lock().waiting.remove(&self.key).is_some();
        if unanswered && let Some(withdraw) = self.withdraw.take() {
            withdraw(());
        }
    }
}

/// A request id as a map key: the id itself (numbers and strings are different
/// variants, so they never collide), a copy that allocates nothing for a number.
pub(crate) fn id_key(id: &crate::protocol::RequestId) -> crate::protocol::RequestId {
    id.clone()
}

/// A legacy client, as its `initialize` said.
#[derive(Clone, Debug)]
pub struct LegacyClient {
    /// The version agreed.
    pub version: String,
    /// What it can answer.
    pub capabilities: Value,
}

/// The era and channel of one downstream request.
pub enum Client<'a> {
    /// 2026-07-28: everything is in the request. `session`: the `serve --stdio`
    /// session it came in on ([`LocalSession::id`]), whose rounds parked here end with
    /// it; `None` over HTTP, where any request of the principal may take them up.
    Modern {
        /// The local session, if any.
        session: Option<u64>,
    },
    /// A legacy session, and the way to ask its client things (none: it cannot be asked).
    Legacy {
        /// The session's client.
        client: &'a LegacyClient,
        /// Requests to the client.
        peer: Option<&'a dyn ClientPeer>,
    },
}

/// The gateway core: see the module docs.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

/// How often parked rounds are swept.
const PARKED_SWEEP: Duration = Duration::from_secs(1);

/// Drops, while the gateway lives, the parked rounds past their expiry and those of
/// principals the identity in force no longer admits (a reload revoked them, or
/// dropped the key that sealed their states): their
/// upstream calls are cancelled, and the servers' questions withdrawn, without waiting
/// for the next round to be parked or taken up.
async fn sweep_parked(
    inner: std::sync::Weak<Inner>,
    mut reloads: tokio::sync::watch::Receiver<u64>,
) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(PARKED_SWEEP) => {}
            Ok(()) = reloads.changed() => {}
        }
        let Some(inner) = inner.upgrade() else { return };
        let identity = inner.current.read().identity.clone();
        // A principal no longer admitted (a stdio session's is while it lasts), or a
        // grant taken away, ends its rounds.
        let local = inner.local.lock().clone();
        let sealer = inner.current.read().sealer.clone();
        // A key dropped (leaked) ends the rounds whose states it sealed: the gateway
        // refuses those states now.
        inner.parked.sweep(sealer.ttl(), |p, server, item, key| {
            (identity.admits(p) || local.contains_key(p))
                && inner.harness.may_call(&p.agent, server, item)
                && key.is_none_or(|k| sealer.holds(k))
        });
    }
}

/// One request's place among its principal's in flight. Released on drop, also when
/// the request's future is dropped half-way (its client went away): a principal with
/// nothing in flight keeps no count (JWTs name many).
struct InFlightSlot<'a> {
    inner: &'a Inner,
    principal: &'a Principal,
}

impl Drop for InFlightSlot<'_> {
    fn drop(&mut self) {
        let mut in_flight = self.inner.in_flight.lock();
        if let Some(count) = in_flight.get_mut(self.principal) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                in_flight.remove(self.principal);
            }
        }
    }
}

struct Inner {
    harness: HarnessHandle,
    /// What a reload replaces, swapped whole: a request sees one version of it.
    current: parking_lot::RwLock<Arc<Current>>,
    /// Each principal's requests in flight (none: not there), held to the limit in
    /// force when each comes: a reload's new limit holds for a principal that never
    /// stops being busy too.
    in_flight: Mutex<HashMap<Principal, usize>>,
    /// One reload at a time, and the config as the last one left it running (its
    /// servers as they run): what the next one compares with.
    reloading: tokio::sync::Mutex<HarnessConfig>,
    /// Whether the harness was started with roots, and so answers `roots/list`: roots
    /// given first by a reload are not served until a restart.
    roots_at_start: bool,
    /// The `[gateway]` table read at start: its settings that listeners took then stay
    /// until a restart, whatever reloads came since.
    at_start: Arc<GatewayConfig>,
    /// Legacy servers' elicitations waiting for a 2026-07-28 client's answer.
    parked: parked::ParkedRounds,
    /// The principals of the `serve --stdio` sessions open now, and how many of each: a
    /// pipe needs no token, so the identity in force does not name them, and their
    /// parked rounds are kept while their session lasts.
    local: Mutex<HashMap<Principal, usize>>,
    /// The next [`LocalSession`]'s id.
    sessions: std::sync::atomic::AtomicU64,
    /// Moves on at each reload applied (who is admitted may have changed).
    reloads: tokio::sync::watch::Sender<u64>,
    /// Moves on at a reload that changed how tools are served (`prefix`,
    /// `tool_exposure`): every client's tool list is another now, though no server's
    /// changed.
    views: tokio::sync::watch::Sender<u64>,
}

/// A `serve --stdio` session counted open ([`Gateway::local_session`]).
pub(crate) struct LocalSession {
    inner: Arc<Inner>,
    principal: Principal,
    id: u64,
}

impl LocalSession {
    /// Its id, unique in this process: the rounds its requests park are its own.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }
}

impl Drop for LocalSession {
    fn drop(&mut self) {
        // Nobody can resume its parked rounds once it is over, however it ended.
        self.inner.parked.drop_session(self.id);
        self.inner.parked.forget_session(self.id);
        let mut local = self.inner.local.lock();
        if let Some(n) = local.get_mut(&self.principal) {
            *n -= 1;
            if *n == 0 {
                local.remove(&self.principal);
            }
        }
    }
}

/// The settings in force.
struct Current {
    config: Arc<GatewayConfig>,
    identity: Arc<Identity>,
    sealer: Sealer,
    names: Names,
    /// Server id → routing order (priority, then config order), for bare names.
    order: HashMap<String, usize>,
}

impl Current {
    /// The settings of `config`; `before`, the ones they replace (on a reload).
    async fn new(
        harness_config: &HarnessConfig,
        config: GatewayConfig,
        sealer: Sealer,
        before: Option<&Current>,
    ) -> Result<Current, GatewayError> {
        config.validate()?;
        // A JWKS URL's keys, kept across a reload that leaves its settings as they
        // were: they are read again on their own, and a reload (of a server, say) does
        // not fail while the issuer is down. A file is read again: a reload is how its
        // keys change.
        let kept = before
            .and_then(|b| b.identity.jwt())
            .filter(|v| v.config().jwks_url.is_some() && Some(v.config()) == config.jwt.as_ref());
        let jwt = match &config.jwt {
            Some(_) if kept.is_some() => kept.cloned(),
            Some(j) => {
                let verifier = jwt::JwtVerifier::load(j.clone()).await?;
                verifier.refresh_in_background();
                Some(verifier)
            }
            None => None,
        };
        let identity = Identity::new(&config.tokens, config.anonymous_agent.as_deref(), jwt)
            .map_err(GatewayError::Config)?;
        let mut servers: Vec<(usize, &crate::server::ServerConfig)> =
            harness_config.servers.iter().enumerate().collect();
        servers.sort_by_key(|(i, s)| (std::cmp::Reverse(s.priority), *i));
        let order = servers
            .iter()
            .enumerate()
            .map(|(rank, (_, s))| (s.id.clone(), rank))
            .collect();
        Ok(Current {
            names: Names::carried(config.prefix, before.map(|b| &b.names)),
            identity: Arc::new(identity),
            sealer,
            order,
            config: Arc::new(config),
        })
    }
}

/// What a served name stands for ([`Gateway::resolve`]).
enum Resolved {
    /// The harness's name for it.
    Name(String),
    /// A shortened-shape name not served to this caller now, while these servers it may
    /// use could not be listed: it may be one of theirs.
    NotServed(Vec<crate::call::Unreachable>),
}

/// What a reload changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reloaded {
    /// Servers started.
    pub added: Vec<String>,
    /// Servers stopped and forgotten.
    pub removed: Vec<String>,
    /// Servers whose settings changed, restarted with the new ones.
    pub restarted: Vec<String>,
    /// Servers whose change failed, with why (the rest of the reload stands).
    pub failed: Vec<(String, String)>,
    /// Settings that changed but are read at start only (`call_timeout`, `audit`, …):
    /// the running ones stay until a restart.
    pub needs_restart: Vec<&'static str>,
}

/// A list of tokens by hash, each refused without being quoted back when it is written
/// as the token itself (a string: serde's own error would print it).
fn by_hash<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    use serde::de::Error;
    let as_it_is = |at: &str| {
        D::Error::custom(format!(
            "{at}a token written as it is: write {{ sha256 = \"…\" }}, its SHA-256 in hex (the value is not quoted back)"
        ))
    };
    let items = match <Value as serde::Deserialize>::deserialize(d)? {
        Value::Array(items) => items,
        Value::String(_) => return Err(as_it_is("")),
        _ => return Err(D::Error::custom("must be a list of { sha256 = \"…\" }")),
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            if item.is_string() {
                return Err(as_it_is(&format!("[{i}] is ")));
            }
            serde_path_to_error::deserialize(item).map_err(|e| {
                let path = e.path().to_string();
                let at = if path == "." {
                    String::new()
                } else {
                    format!(".{path}")
                };
                D::Error::custom(format!("[{i}]{at}: {}", e.into_inner()))
            })
        })
        .collect()
}

/// A bearer token of a side listener (`--admin`, `--metrics`), by hash: the config
/// never holds the token itself.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenHash {
    /// Hex SHA-256 of the token.
    pub sha256: String,
}

impl TokenHash {
    fn is_hex_sha256(&self) -> bool {
        self.sha256.len() == 64 && self.sha256.bytes().all(|b| b.is_ascii_hexdigit())
    }
}

/// The tokens a side listener takes, read at each request (a reload replaces them).
pub type Tokens = Arc<dyn Fn() -> Vec<TokenHash> + Send + Sync>;

/// The settings a reload does not apply that differ between `running` and `next` (and
/// between the gateway's settings `gateway` and `gateway_next`).
fn needs_restart(
    running: &HarnessConfig,
    next: &HarnessConfig,
    gateway: &GatewayConfig,
    gateway_next: &GatewayConfig,
    roots_at_start: bool,
) -> Vec<&'static str> {
    // Every field named: one added later must say here whether a reload applies it.
    let HarnessConfig {
        servers: _,
        permissions: _,
        agents: _,
        client_info,
        cache,
        audit,
        round_cap,
        input_timeout,
        call_timeout,
        shutdown_grace,
        trace_sample_ratio,
        limits,
        sampling,
    } = running;
    [
        ("client_info", *client_info == next.client_info),
        ("cache", *cache == next.cache),
        ("audit", *audit == next.audit),
        ("round_cap", *round_cap == next.round_cap),
        ("input_timeout", *input_timeout == next.input_timeout),
        ("call_timeout", *call_timeout == next.call_timeout),
        ("shutdown_grace", *shutdown_grace == next.shutdown_grace),
        (
            "trace_sample_ratio",
            *trace_sample_ratio == next.trace_sample_ratio,
        ),
        ("limits", *limits == next.limits),
        ("sampling", *sampling == next.sampling),
        (
            "gateway.max_streams",
            gateway.max_streams == gateway_next.max_streams,
        ),
        (
            "gateway.max_connections_per_peer",
            gateway.max_connections_per_peer == gateway_next.max_connections_per_peer,
        ),
        // `serve --stdio` reads it at the session's end, the HTTP listener at start.
        (
            HTTP_WRITE_TIMEOUT,
            gateway.write_timeout == gateway_next.write_timeout,
        ),
        // `roots/list` is answered, and `roots` declared, only by a harness started with
        // roots; later changes to them are applied.
        (
            "agents' roots (none were given at start)",
            roots_at_start || !has_roots(next),
        ),
        // The MCP listener takes the new ones; `--metrics`'s keeps those it started with.
        (
            METRICS_ALLOWED_HOSTS,
            gateway.allowed_hosts == gateway_next.allowed_hosts,
        ),
    ]
    .into_iter()
    .filter_map(|(name, same)| (!same).then_some(name))
    .collect()
}

/// How [`Reloaded::needs_restart`] names the `write_timeout` the HTTP listener took at
/// start (`serve --stdio` reads it at the session's end).
pub const HTTP_WRITE_TIMEOUT: &str = "gateway.write_timeout (HTTP listener)";

/// How [`Reloaded::needs_restart`] names the `allowed_hosts` the `--metrics` listener
/// took at start (the MCP listener takes new ones).
pub const METRICS_ALLOWED_HOSTS: &str = "gateway.allowed_hosts (for --metrics)";

fn has_roots(config: &HarnessConfig) -> bool {
    config.agents.values().any(|a| a.roots.is_some())
}

/// One server's part in a reload.
enum Change {
    Add,
    Remove,
    Restart(Box<crate::server::ServerConfig>),
}

/// What became of it.
enum Applied {
    Added(crate::server::ServerConfig),
    Removed,
    Restarted(crate::server::ServerConfig),
    /// Not applied; `gone` when the server no longer runs (stopped for a restart whose
    /// start failed).
    Failed {
        gone: bool,
        error: String,
    },
}

impl Change {
    /// Applies the change to `server` (its running config, or the new one to add).
    async fn apply(
        self,
        harness: HarnessHandle,
        server: crate::server::ServerConfig,
    ) -> (String, Applied) {
        let id = server.id.clone();
        let failed = |gone, e: crate::harness::HarnessError| Applied::Failed {
            gone,
            error: e.to_string(),
        };
        let applied = match self {
            Change::Add => match harness.add_server(server.clone()).await {
                Ok(_) => Applied::Added(server),
                Err(e) => match harness.server_config(&id) {
                    // An add not answered in time (this one, or one of an earlier
                    // reload, found now as a duplicate) took effect after all: what
                    // runs is what the next reload compares with.
                    Some(running) => {
                        tracing::warn!(server = %id, error = %e, "an add reported as failed took effect; counted as running");
                        Applied::Added(running)
                    }
                    None => failed(true, e),
                },
            },
            Change::Remove => match harness.remove_server(&id).await {
                Ok(_) => Applied::Removed,
                Err(e) => failed(false, e),
            },
            Change::Restart(new) => match harness.replace_server((*new).clone()).await {
                Ok(_) => Applied::Restarted(*new),
                // Its own id: not there any more (removed meanwhile), or not started.
                Err(e) => failed(harness.server_status(&id).is_none(), e),
            },
        };
        (id, applied)
    }
}

/// What a `subscriptions/listen` may ask for, as [`ListsChanged`] orders them.
const LISTEN_KEYS: [&str; 3] = [
    "toolsListChanged",
    "promptsListChanged",
    "resourcesListChanged",
];

/// The methods the gateway serves to 2026-07-28 clients (others are -32601 / 404;
/// legacy sessions also get `ping`).
pub const METHODS: &[&str] = &[
    "initialize",
    "server/discover",
    "tools/list",
    "tools/call",
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/read",
    "resources/templates/list",
    "subscriptions/listen",
];

/// The largest `max_in_flight_per_principal`.
const MAX_IN_FLIGHT_PER_PRINCIPAL: usize = 1 << 20;

/// Versions served downstream, preferred first.
pub const VERSIONS: &[&str] = &[MODERN, LEGACY_VERSIONS[0], LEGACY_VERSIONS[1]];

fn invalid(message: impl Into<String>) -> RpcError {
    RpcError::new(INVALID_PARAMS, message)
}

/// The client capabilities the gateway reads; a legacy session keeps only these (it
/// lives for `session_idle`, and its client may send megabytes of anything else).
const KEPT_CAPABILITIES: [&str; 3] = ["elicitation", "sampling", "roots"];

/// The most one kept capability may take, as JSON (a real one is a few dozen bytes),
/// and in values at every depth: parsed, `{"a0":0,"a1":0,…}` takes some twenty times
/// its text, kept by every session for `session_idle`.
const MAX_CAPABILITY_BYTES: usize = 4096;
const MAX_CAPABILITY_VALUES: usize = 64;

/// How many values `v` holds, itself and every one within, counting past `max` no
/// further.
fn values_within(v: &Value, max: usize) -> usize {
    let mut n = 1;
    let inner: Box<dyn Iterator<Item = &Value>> = match v {
        Value::Object(m) => Box::new(m.values()),
        Value::Array(a) => Box::new(a.iter()),
        _ => return n,
    };
    for child in inner {
        n += values_within(child, max.saturating_sub(n));
        if n > max {
            break;
        }
    }
    n
}

/// What a legacy session keeps of `initialize`'s `capabilities`.
fn kept_capabilities(asked: Option<&Value>) -> Result<Value, RpcError> {
    let mut kept = Map::new();
    let Some(Value::Object(asked)) = asked else {
        return Ok(Value::Object(kept));
    };
    for key in KEPT_CAPABILITIES {
        let Some(value) = asked.get(key) else {
            continue;
        };
        let size = serde_json::to_vec(value).map_or(usize::MAX, |v| v.len());
        if size > MAX_CAPABILITY_BYTES {
            return Err(invalid(format!(
                "capabilities.{key} is too large ({size} bytes; at most {MAX_CAPABILITY_BYTES})"
            )));
        }
        if values_within(value, MAX_CAPABILITY_VALUES) > MAX_CAPABILITY_VALUES {
            return Err(invalid(format!(
                "capabilities.{key} holds too many values (at most {MAX_CAPABILITY_VALUES})"
            )));
        }
        kept.insert(key.to_string(), value.clone());
    }
    Ok(Value::Object(kept))
}

impl Gateway {
    /// A gateway in front of `harness` (started from `harness_config`); reads the JWT
    /// issuer's keys when JWTs are configured.
    pub async fn new(
        harness: HarnessHandle,
        harness_config: &HarnessConfig,
        config: GatewayConfig,
        sealer: Sealer,
    ) -> Result<Gateway, GatewayError> {
        let at_start = Arc::new(config.clone());
        let current = Current::new(harness_config, config, sealer, None).await?;
        let gateway = Gateway {
            inner: Arc::new(Inner {
                harness,
                current: parking_lot::RwLock::new(Arc::new(current)),
                in_flight: Mutex::default(),
                reloading: tokio::sync::Mutex::new(harness_config.clone()),
                roots_at_start: has_roots(harness_config),
                at_start,
                parked: parked::ParkedRounds::default(),
                local: Mutex::new(HashMap::new()),
                sessions: std::sync::atomic::AtomicU64::new(0),
                reloads: tokio::sync::watch::Sender::new(0),
                views: tokio::sync::watch::Sender::new(0),
            }),
        };
        tokio::spawn(sweep_parked(
            Arc::downgrade(&gateway.inner),
            gateway.inner.reloads.subscribe(),
        ));
        Ok(gateway)
    }

    fn now(&self) -> Arc<Current> {
        self.inner.current.read().clone()
    }

    /// The settings in force.
    pub fn config(&self) -> Arc<GatewayConfig> {
        self.now().config.clone()
    }

    /// The harness's head sampler, and whether a client's sampled flag is followed.
    fn sampling(&self) -> (&HeadSampler, bool) {
        let follow = self.inner.current.read().config.follow_client_sampling;
        (self.inner.harness.sampler(), follow)
    }

    /// Who requests come from.
    pub fn identity(&self) -> Arc<Identity> {
        self.now().identity.clone()
    }

    /// Changes at each reload applied: a stream or session held for a principal checks
    /// then that the identity in force still admits it.
    pub(crate) fn reloads(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.reloads.subscribe()
    }

    /// Changes when a reload changes how tools are served (their names, or the search
    /// tools in their place): a client holding a tool list is to list again.
    pub(crate) fn views(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.views.subscribe()
    }

    /// What a change of [`Gateway::views`] tells a client.
    pub(crate) const VIEW_CHANGED: ListsChanged = ListsChanged {
        tools: true,
        prompts: false,
        resources: false,
    };

    /// Applies a new configuration without a restart. Everything is checked before
    /// anything changes, so a config that is wrong leaves the running one as it was.
    /// Then who may do what changes first: tokens, keys and gateway settings, then
    /// grants, then agents, one right after the other, so that a revoked token or a
    /// narrowed grant takes effect now, not once the servers that are slow to stop have
    /// stopped. Then
    /// servers are added, removed, or (when their settings changed) restarted with the
    /// new ones, side by side; one whose change fails is named in the report
    /// ([`Reloaded::failed`]) and the others' changes stand. Calls in flight on servers
    /// that stay go on; those on a removed or restarted server end with it.
    pub async fn reload(
        &self,
        harness_config: &HarnessConfig,
        config: GatewayConfig,
        sealer: Sealer,
    ) -> Result<Reloaded, GatewayError> {
        let mut applied = self.inner.reloading.lock().await;
        harness_config
            .validate()
            .map_err(|e| GatewayError::Config(e.to_string()))?;
        let mut report = Reloaded {
            needs_restart: needs_restart(
                &applied,
                harness_config,
                &self.inner.at_start,
                &config,
                self.inner.roots_at_start,
            ),
            ..Reloaded::default()
        };
        let before = self.now();
        let next = Current::new(harness_config, config, sealer, Some(&before)).await?;
        let served_otherwise = (next.config.prefix, next.config.tool_exposure)
            != (before.config.prefix, before.config.tool_exposure);
        let harness = &self.inner.harness;
        *self.inner.current.write() = Arc::new(next);
        // Streams and sessions of principals no longer admitted end now.
        self.inner.reloads.send_modify(|n| *n += 1);
        if served_otherwise {
            self.inner.views.send_modify(|n| *n += 1);
        }
        // Grants before additions too: who is told of a new server is decided by them.
        harness
            .replace_grants(harness_config.permissions.clone())
            .await
            .map_err(|e| GatewayError::Config(e.to_string()))?;
        applied.permissions = harness_config.permissions.clone();
        // Last of these: new roots are announced to legacy servers, all at once.
        harness.replace_agents(harness_config.agents.clone()).await;
        applied.agents = harness_config.agents.clone();

        let wanted = &harness_config.servers;
        let running = &mut applied.servers;
        let mut changes = tokio::task::JoinSet::new();
        let mut of_task = HashMap::new();
        let mut spawn = |change: Change, server: &crate::server::ServerConfig| {
            let task = changes.spawn(change.apply(harness.clone(), server.clone()));
            of_task.insert(task.id(), server.id.clone());
        };
        for old in running.iter() {
            match wanted.iter().find(|s| s.id == old.id) {
                None => spawn(Change::Remove, old),
                Some(new) if new != old => spawn(Change::Restart(Box::new(new.clone())), old),
                Some(_) => {}
            }
        }
        for new in wanted {
            if !running.iter().any(|s| s.id == new.id) {
                spawn(Change::Add, new);
            }
        }
        while let Some(done) = changes.join_next_with_id().await {
            let (id, outcome) = match done {
                Ok((_, done)) => done,
                Err(e) => {
                    // A change that panicked: what became of its server is unknown.
                    let id = of_task.get(&e.id()).cloned().unwrap_or_default();
                    report.failed.push((id, e.to_string()));
                    continue;
                }
            };
            match outcome {
                Applied::Removed => {
                    running.retain(|s| s.id != id);
                    report.removed.push(id);
                }
                Applied::Added(config) => {
                    running.push(config);
                    report.added.push(id);
                }
                Applied::Restarted(config) => {
                    // In its place, as in the harness's directory.
                    match running.iter_mut().find(|s| s.id == id) {
                        Some(s) => *s = config,
                        None => running.push(config),
                    }
                    report.restarted.push(id);
                }
                Applied::Failed { gone, error } => {
                    if gone {
                        running.retain(|s| s.id != id);
                    }
                    report.failed.push((id, error));
                }
            }
        }
        for list in [
            &mut report.added,
            &mut report.removed,
            &mut report.restarted,
        ] {
            list.sort();
        }
        report.failed.sort();
        Ok(report)
    }

    /// Drops the parked rounds and parks no more (shutdown): their upstream calls are
    /// cancelled, and a question asked later fails at once.
    pub(crate) fn drop_parked(&self) {
        self.inner.parked.close();
    }

    /// Counts a `serve --stdio` session of `principal` open until the guard drops: its
    /// parked rounds are not swept for want of a token naming it.
    pub(crate) fn local_session(&self, principal: &Principal) -> LocalSession {
        *self
            .inner
            .local
            .lock()
            .entry(principal.clone())
            .or_insert(0) += 1;
        LocalSession {
            inner: self.inner.clone(),
            principal: principal.clone(),
            id: self
                .inner
                .sessions
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// Drops the rounds `session`'s requests parked (as it ends: nobody else can resume
    /// them; other sessions, of its principal too, keep theirs).
    pub(crate) fn drop_parked_of(&self, session: &LocalSession) {
        self.inner.parked.drop_session(session.id);
    }

    /// The harness behind it.
    pub fn harness(&self) -> &HarnessHandle {
        &self.inner.harness
    }

    fn server_info() -> Value {
        json!({"name": "mcp-harness-gateway", "version": env!("CARGO_PKG_VERSION")})
    }

    /// What the gateway serves (the same in `server/discover` and `initialize`): tools,
    /// prompts and resources, each with change notifications.
    fn capabilities() -> Value {
        // List changes reach legacy sessions (their GET stream, or the pipe) and
        // 2026-07-28 clients holding subscriptions/listen.
        json!({
            "tools": {"listChanged": true},
            "prompts": {"listChanged": true},
            "resources": {"listChanged": true},
        })
    }

    /// What a `subscriptions/listen` asked for that the gateway honours (list changes:
    /// tools, prompts, resources), as its acknowledgement echoes it.
    pub fn listen_accepts(params: Option<&Value>) -> Value {
        let asked = params.and_then(|p| p.get("notifications"));
        let mut accepted = Map::new();
        for key in LISTEN_KEYS {
            if asked.and_then(|n| n.get(key)).and_then(Value::as_bool) == Some(true) {
                accepted.insert(key.into(), Value::Bool(true));
            }
        }
        Value::Object(accepted)
    }

    /// The lists an acknowledgement ([`Gateway::listen_accepts`]) took.
    pub fn listen_lists(accepted: &Value) -> ListsChanged {
        let has = |key: &str| accepted.get(key).is_some();
        ListsChanged {
            tools: has(LISTEN_KEYS[0]),
            prompts: has(LISTEN_KEYS[1]),
            resources: has(LISTEN_KEYS[2]),
        }
    }

    /// `_meta` naming subscription `id`.
    fn subscription_meta(id: &crate::protocol::RequestId) -> Value {
        json!({"io.modelcontextprotocol/subscriptionId": id})
    }

    /// The first message of a subscription.
    pub fn listen_ack(
        id: &crate::protocol::RequestId,
        accepted: Value,
    ) -> crate::protocol::Message {
        crate::protocol::Message::Notification(crate::protocol::Notification {
            method: "notifications/subscriptions/acknowledged".into(),
            params: Some(json!({"notifications": accepted, "_meta": Self::subscription_meta(id)})),
        })
    }

    /// A list change (`method`: `notifications/tools/list_changed`, …), on
    /// subscription `id`.
    pub fn listen_changed(
        id: &crate::protocol::RequestId,
        method: &str,
    ) -> crate::protocol::Message {
        crate::protocol::Message::Notification(crate::protocol::Notification {
            method: method.into(),
            params: Some(json!({"_meta": Self::subscription_meta(id)})),
        })
    }

    /// The result that ends subscription `id`.
    pub fn listen_end(id: &crate::protocol::RequestId) -> crate::protocol::Message {
        crate::protocol::Message::Response(crate::protocol::Response {
            id: Some(id.clone()),
            outcome: Ok(json!({"resultType": "complete", "_meta": Self::subscription_meta(id)})),
        })
    }

    /// Which of `principal`'s lists `event` changes (none when it may not use that
    /// server).
    pub fn changes(
        &self,
        principal: &Principal,
        event: &crate::registry::HarnessEvent,
    ) -> ListsChanged {
        use crate::registry::HarnessEvent as E;
        let may_use = |server: &str| self.inner.harness.may_use(&principal.agent, server);
        match event {
            E::ToolsChanged { server, .. } if may_use(server) => ListsChanged {
                tools: true,
                ..ListsChanged::default()
            },
            E::ServerAdded { server } if may_use(server) => ListsChanged::ALL,
            E::ListsChanged {
                server,
                tools,
                prompts,
                resources,
            } if may_use(server) => ListsChanged {
                tools: *tools,
                prompts: *prompts,
                resources: *resources,
            },
            // Gone, so its grants cannot be asked; the notice names no server.
            E::ServerRemoved { .. } => ListsChanged::ALL,
            E::GrantsChanged { agents } if agents.iter().any(|a| **a == *principal.agent) => {
                ListsChanged::ALL
            }
            _ => ListsChanged::default(),
        }
    }

    /// The answer to a legacy `initialize`, and the session's client.
    pub fn initialize(&self, params: Option<&Value>) -> Result<(Value, LegacyClient), RpcError> {
        let now = self.now();
        let asked = params
            .and_then(|p| p.get("protocolVersion"))
            .and_then(Value::as_str)
            .ok_or_else(|| invalid("initialize needs protocolVersion"))?;
        let version = if LEGACY_VERSIONS.contains(&asked) {
            asked
        } else {
            LEGACY_VERSIONS[0]
        };
        let capabilities = kept_capabilities(params.and_then(|p| p.get("capabilities")))?;
        let mut result = json!({
            "protocolVersion": version,
            "capabilities": Self::capabilities(),
            "serverInfo": Self::server_info(),
        });
        if let Some(i) = &now.config.instructions {
            result["instructions"] = json!(i);
        }
        Ok((
            result,
            LegacyClient {
                version: version.to_string(),
                capabilities,
            },
        ))
    }

    /// Checks a 2026-07-28 request's `_meta` envelope; the client's capabilities.
    pub fn check_envelope(request: &Request) -> Result<Value, RpcError> {
        let meta = request
            .params
            .as_ref()
            .and_then(|p| p.get("_meta"))
            .and_then(Value::as_object)
            .ok_or_else(|| invalid("params._meta is required"))?;
        let version = meta
            .get(KEY_PROTOCOL_VERSION)
            .and_then(Value::as_str)
            .ok_or_else(|| invalid(format!("_meta needs {KEY_PROTOCOL_VERSION}")))?;
        let capabilities = meta
            .get(KEY_CLIENT_CAPABILITIES)
            .filter(|c| c.is_object())
            .ok_or_else(|| invalid(format!("_meta needs {KEY_CLIENT_CAPABILITIES}")))?;
        if version != MODERN {
            // Cut as the message's is: a refusal is written whole, outside every budget.
            let requested = one_line(version, 40);
            return Err(RpcError::new(
                UNSUPPORTED_PROTOCOL_VERSION,
                format!("unsupported protocol version {requested}"),
            )
            .with_data(json!({"supported": [MODERN], "requested": requested})));
        }
        // Only what the gateway itself answers for goes on to the servers: an extension
        // it does not serve (tasks: a result it cannot poll) must not be offered in the
        // client's name, and the rest is bounded as a legacy session's is.
        kept_capabilities(Some(capabilities))
    }

    /// For a `tools/call` over HTTP: each argument whose schema names an `x-mcp-header`
    /// must be repeated in its `Mcp-Param-*` header (-32020 otherwise), as a 2026-07-28
    /// server checks. `header` reads a request header by its lower-case name. When the
    /// schema cannot be read (its server is restarting, say), a request that carries
    /// `Mcp-Param-*` headers (`sent`) is refused: something in front of the gateway may
    /// have acted on them; one that carries none goes on (nothing acted on it). A
    /// `call_tool` (tool search) that carries some is held to the tool it names, and a
    /// round's continuation to the tool of the server its state names.
    pub async fn check_param_headers(
        &self,
        principal: &Principal,
        request: &Request,
        header: impl Fn(&str) -> Option<String>,
        sent: bool,
    ) -> Result<(), RpcError> {
        if request.method != "tools/call" {
            return Ok(());
        }
        let Some(params) = request.params.as_ref() else {
            return Ok(());
        };
        let Some(mut served) = params.get("name").and_then(Value::as_str) else {
            return Ok(());
        };
        // Through `call_tool` (tool search), headers a client sent are the inner tool's:
        // checked against it (something in front may have acted on them). `call_tool`
        // itself declares none, so a client that sends none is not held to the inner's.
        let unwrapped;
        let mut params = params;
        let searching = self.now().config.tool_exposure == ToolExposure::Search;
        // The gateway's own tools declare no `x-mcp-header`: never held to an upstream
        // tool's schema that happens to share the name.
        if searching && [search::SEARCH_TOOLS, search::DESCRIBE_TOOL].contains(&served) {
            return Ok(());
        }
        if served == search::CALL_TOOL && searching {
            if !sent {
                return Ok(());
            }
            // A malformed `call_tool` is the call's error (invalid params), not the
            // headers'.
            let Ok(inner) = search::unwrap_call(params) else {
                return Ok(());
            };
            unwrapped = inner;
            params = &unwrapped;
            served = params
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default();
        }
        // Resolved as the call will be: a header check cannot be passed by a name this
        // process has not listed yet.
        let name = match self
            .resolve(principal, CallKind::Tool, served, false, params)
            .await?
        {
            Resolved::Name(name) => name,
            // The call's error, not the headers'.
            Resolved::NotServed(_) => return Ok(()),
        };
        // A modern round goes on on the server that issued its state, whatever a bare
        // name routes to now (`call_modern`): held to that server's tool. (A legacy
        // call takes no state: it goes where its name routes.)
        let modern = params
            .get("_meta")
            .is_some_and(|m| m.get(KEY_PROTOCOL_VERSION).is_some());
        let name = match params.get("requestState").and_then(Value::as_str) {
            Some(sealed) if modern => {
                let opened = self.now().sealer.open(
                    sealed,
                    &principal.agent,
                    principal.context.as_deref(),
                    &request.method,
                    || seal::params_digest(params),
                );
                match opened {
                    // Not a state of the server now under its id (a reload replaced
                    // it): the call refuses it, and that is the call's error.
                    Ok(state)
                        if state.target.is_some()
                            && state.target
                                != self.inner.harness.server_identity(&state.server) =>
                    {
                        return Ok(());
                    }
                    Ok(state) => on_server(CallKind::Tool, &name, &state.server),
                    // The call's error, not the headers'.
                    Err(_) => return Ok(()),
                }
            }
            _ => name,
        };
        let tool = match self
            .inner
            .harness
            .get_tool_schema(&Self::caller(principal), &name)
            .await
        {
            Ok(tool) => tool,
            // A tool the caller cannot reach is the call's error, not the headers'.
            Err(CallError::Denied { .. } | CallError::NoRoute { .. }) => return Ok(()),
            Err(_) if !sent => return Ok(()),
            Err(e) => {
                return Err(RpcError::new(
                    INTERNAL_ERROR,
                    format!(
                        "the tool's schema could not be read to check its Mcp-Param headers: {}",
                        one_line(&e.to_string(), 200)
                    ),
                ));
            }
        };
        let schema = tool
            .definition
            .get("inputSchema")
            .cloned()
            .unwrap_or_default();
        let Ok(declared) = crate::transport::http::headers::param_headers(&schema) else {
            return Ok(());
        };
        let arguments = params.get("arguments").cloned().unwrap_or(Value::Null);
        for h in declared {
            let expected = crate::transport::http::headers::param_value(&arguments, &h.path);
            let got = header(&format!("mcp-param-{}", h.name.to_ascii_lowercase()));
            if expected != got {
                return Err(RpcError::new(
                    crate::protocol::error::HEADER_MISMATCH,
                    format!("header mismatch: Mcp-Param-{}", one_line(&h.name, 64)),
                ));
            }
        }
        Ok(())
    }

    /// One of `principal`'s places in flight (at most `limit`), or the refusal.
    fn in_flight_slot<'a>(
        &'a self,
        principal: &'a Principal,
        limit: usize,
    ) -> Result<InFlightSlot<'a>, RpcError> {
        let mut in_flight = self.inner.in_flight.lock();
        // Looked up before it is inserted: the principal is copied only the first time.
        let held = in_flight.get(principal).copied().unwrap_or(0);
        if held >= limit {
            return Err(RpcError::new(
                -32000,
                format!(
                    "too many requests in flight for agent {} (at most {limit})",
                    principal.agent
                ),
            ));
        }
        match in_flight.get_mut(principal) {
            Some(count) => *count += 1,
            None => {
                in_flight.insert(principal.clone(), 1);
            }
        }
        Ok(InFlightSlot {
            inner: &self.inner,
            principal,
        })
    }

    /// Answers one request from `principal`. `cancel` cancels the upstream call (a
    /// downstream `notifications/cancelled`, or the connection gone).
    pub async fn handle(
        &self,
        principal: &Principal,
        request: Request,
        client: Client<'_>,
        cancel: CancelToken,
        progress: Option<ProgressSender>,
    ) -> Result<Value, RpcError> {
        let spanned = self.request_span(&request);
        self.handle_spanned(principal, request, client, (cancel, progress), spanned)
            .await
    }

    /// [`Gateway::handle`] of a request whose span (a call request's,
    /// [`Gateway::request_span`]) was made when it arrived: the listener's own checks
    /// ran in it. The span is entered while the request runs and marked with what it
    /// answers.
    pub(crate) async fn handle_spanned(
        &self,
        principal: &Principal,
        request: Request,
        client: Client<'_>,
        io: (CancelToken, Option<ProgressSender>),
        spanned: Option<RequestSpan>,
    ) -> Result<Value, RpcError> {
        let (span, trace) = match spanned {
            Some(RequestSpan { span, trace }) => (span, Some(trace)),
            None => (tracing::Span::none(), None),
        };
        let answered = self
            .handle_in_span(principal, request, client, io, trace)
            .instrument(span.clone())
            .await;
        mark_outcome(&span, answered.as_ref());
        answered
    }

    /// [`Gateway::handle`] within the request's span, if it has one.
    async fn handle_in_span(
        &self,
        principal: &Principal,
        request: Request,
        client: Client<'_>,
        (cancel, progress): (CancelToken, Option<ProgressSender>),
        trace: Option<RequestTrace>,
    ) -> Result<Value, RpcError> {
        let now = self.now();
        let capabilities = match &client {
            Client::Modern { .. } => Some(Self::check_envelope(&request)?),
            Client::Legacy { .. } => None,
        };
        let slot = self.in_flight_slot(principal, now.config.max_in_flight_per_principal)?;
        let session = match client {
            Client::Modern { session } => session,
            Client::Legacy { .. } => None,
        };
        let Request { method, params, .. } = request;
        let mut params = params.unwrap_or_else(|| json!({}));
        let searching = now.config.tool_exposure == ToolExposure::Search;
        let meta_tool = if searching && method == "tools/call" {
            params.get("name").and_then(Value::as_str).map(String::from)
        } else {
            None
        };
        // A cancellation ends the request wherever it is, not only once its upstream
        // call runs: a listing, or the learning of a shortened name, would otherwise
        // hold the principal's place until it finished (dropping the work cancels it).
        let stop = cancel.clone();
        let work = async {
            match (method.as_str(), meta_tool.as_deref()) {
                ("tools/list", _) if searching => Ok(json!({
                    "tools": search::meta_tools(),
                    // The same three tools for everyone, whatever the grants.
                    "ttlMs": 300_000,
                    "cacheScope": "public",
                })),
                ("tools/call", Some(search::SEARCH_TOOLS)) => self.search(principal, &params).await,
                ("tools/call", Some(search::DESCRIBE_TOOL)) => {
                    self.describe(principal, &params).await
                }
                ("tools/call", Some(search::CALL_TOOL)) => match search::unwrap_call(&params) {
                    Ok(inner) => {
                        params = inner;
                        let io = CallIo {
                            cancel,
                            progress,
                            session,
                        };
                        self.answer(
                            principal,
                            "tools/call",
                            &params,
                            (&client, capabilities),
                            io,
                            trace,
                        )
                        .await
                    }
                    Err(e) => Ok(e.result()),
                },
                (method, _) => {
                    let io = CallIo {
                        cancel,
                        progress,
                        session,
                    };
                    self.answer(
                        principal,
                        method,
                        &params,
                        (&client, capabilities),
                        io,
                        trace,
                    )
                    .await
                }
            }
        };
        let answer = tokio::select! {
            biased;
            answer = work => answer,
            () = stop.cancelled() => Err(to_rpc(&CallError::Cancelled)),
        };
        drop(slot);
        let mut result = answer?;
        match client {
            Client::Modern { .. } => {
                if let Some(map) = result.as_object_mut() {
                    map.entry("resultType").or_insert(json!("complete"));
                    // Hints go on a complete read only. A legacy server's resource
                    // has none: not to be reused. A server's `public` is not kept where
                    // agents' grants differ: a shared cache downstream would serve the
                    // read to one not granted it (lists follow the same rule).
                    if method == "resources/read" && map["resultType"] == "complete" {
                        map.entry("ttlMs").or_insert(json!(0));
                        let public = map.get("cacheScope").is_some_and(|s| s == "public")
                            && self.now().identity.agents() <= 1;
                        map.insert(
                            "cacheScope".into(),
                            json!(if public { "public" } else { "private" }),
                        );
                    }
                    let meta = map.entry("_meta").or_insert_with(|| json!({}));
                    if let Some(meta) = meta.as_object_mut() {
                        meta.insert(KEY_SERVER_INFO.into(), Self::server_info());
                    }
                }
            }
            Client::Legacy { .. } => {
                if let Some(map) = result.as_object_mut() {
                    // Legacy results have no resultType (rmcp removes it the same way).
                    map.remove("resultType");
                }
            }
        }
        Ok(result)
    }

    /// One request's answer, as `handle` dispatches it (the search meta-tools aside).
    /// `trace` is how a call request is traced (decided at its span).
    async fn answer(
        &self,
        principal: &Principal,
        method: &str,
        params: &Value,
        (client, capabilities): (&Client<'_>, Option<Value>),
        io: CallIo,
        trace: Option<RequestTrace>,
    ) -> Result<Value, RpcError> {
        match method {
            // 2026-07-28 removed ping; legacy sessions still have it.
            "ping" if matches!(client, Client::Legacy { .. }) => Ok(json!({})),
            "server/discover" => Ok(self.discover()),
            "tools/list" => self.list(principal, ListKind::Tools, params).await,
            "prompts/list" => self.list(principal, ListKind::Prompts, params).await,
            "resources/list" => self.list(principal, ListKind::Resources, params).await,
            "resources/templates/list" => {
                self.list(principal, ListKind::ResourceTemplates, params)
                    .await
            }
            "tools/call" | "prompts/get" | "resources/read" => {
                let kind = match method {
                    "tools/call" => CallKind::Tool,
                    "prompts/get" => CallKind::Prompt,
                    _ => CallKind::Resource,
                };
                let trace = trace.unwrap_or(RequestTrace::UNTRACED);
                match (client, capabilities) {
                    (Client::Modern { .. }, Some(caps)) => self
                        .call_modern(principal, kind, method, params, caps, io, trace)
                        .await
                        .map_err(|e| codes_of_the_era(e, crate::protocol::meta::MODERN)),
                    // Boxed: its future is several times a modern call's, and every
                    // request's future (spawned, and copied when it is) would carry its size.
                    (Client::Legacy { client, peer }, _) => {
                        let call =
                            self.call_legacy(principal, kind, params, client, *peer, io, trace);
                        Box::pin(call)
                            .await
                            .map_err(|e| codes_of_the_era(e, &client.version))
                    }
                    (Client::Modern { .. }, None) => Err(invalid("params._meta is required")),
                }
            }
            other => Err(RpcError::new(
                METHOD_NOT_FOUND,
                format!("method not found: {}", one_line(other, 80)),
            )),
        }
    }

    /// `search_tools`: the caller's tools most relevant to the query, by served name.
    async fn search(&self, principal: &Principal, params: &Value) -> Result<Value, RpcError> {
        let now = self.now();
        let (query, k) = match search::search_args(&params["arguments"]) {
            Ok(args) => args,
            Err(e) => return Ok(e.result()),
        };
        let listing = self.listing(principal, ListKind::Tools).await?;
        let served: HashMap<Arc<str>, String> = {
            let order = &now.order;
            now.names
                .expose(&listing.items, |s| {
                    order.get(s).copied().unwrap_or(usize::MAX)
                })
                .into_iter()
                .map(|(name, item)| (item.qualified.clone(), name))
                .collect()
        };
        // What the listing serves, and only that: with bare names a tool two servers
        // offer is served once (the other is reached by failover), and is found once.
        let unsearched = listing.unreachable.len();
        let mut items = listing.items;
        items.retain(|item| served.contains_key(&item.qualified));
        let found =
            (self.inner.harness.search_listed(items, &query, k).await).map_err(|e| to_rpc(&e))?;
        let found: Vec<(String, &Value)> = found
            .iter()
            .map(|m| {
                let name = served
                    .get(&m.tool.qualified)
                    .cloned()
                    .unwrap_or_else(|| m.tool.qualified.to_string());
                (name, &*m.tool.definition)
            })
            .collect();
        Ok(search::search_result(&found, unsearched))
    }

    /// `describe_tool`: one tool's definition, by the name a search gave.
    async fn describe(&self, principal: &Principal, params: &Value) -> Result<Value, RpcError> {
        let now = self.now();
        let name = match search::name_arg(search::DESCRIBE_TOOL, &params["arguments"]) {
            Ok(name) => name,
            Err(e) => return Ok(e.result()),
        };
        // A shortened name this process has not served (another gateway did, or a
        // reload forgot it) is learned, as a call's is; the request holds its place.
        let resolved = match self
            .resolve(principal, CallKind::Tool, name, true, &Value::Null)
            .await
        {
            Ok(Resolved::Name(name)) => Some(name),
            // Not a look-alike's definition under the name of another's tool.
            Ok(Resolved::NotServed(_)) => None,
            Err(_) => Some(now.names.resolve(name)),
        };
        // Boxed, as listings are: every request's future would carry its size.
        let tool = match resolved {
            Some(resolved) => Box::pin(
                self.inner
                    .harness
                    .get_tool_schema(&Self::caller(principal), &resolved),
            )
            .await
            .ok(),
            None => None,
        };
        Ok(search::describe_result(
            name,
            tool.as_ref().map(|t| &*t.definition),
        ))
    }

    fn discover(&self) -> Value {
        let now = self.now();
        let mut result = json!({
            "supportedVersions": VERSIONS,
            "capabilities": Self::capabilities(),
            // The same for everyone, and it changes only with the gateway's own config.
            "ttlMs": 300_000,
            "cacheScope": "public",
        });
        if let Some(i) = &now.config.instructions {
            result["instructions"] = json!(i);
        }
        result
    }

    fn caller(principal: &Principal) -> Caller {
        Caller {
            agent_id: Some(principal.agent.clone()),
            auth_context: principal.context.clone(),
        }
    }

    /// One page of the caller's aggregate, with honest hints: the least freshness left
    /// of the upstream pages, `public` only when they all were, nothing was filtered for
    /// the caller and the gateway serves one agent.
    async fn list(
        &self,
        principal: &Principal,
        kind: ListKind,
        params: &Value,
    ) -> Result<Value, RpcError> {
        let now = self.now();
        let cursor = match params.get("cursor") {
            None | Some(Value::Null) => None,
            Some(Value::String(c)) => {
                Some(parse_cursor(c).ok_or_else(|| invalid("invalid cursor"))?)
            }
            Some(_) => return Err(invalid("invalid cursor")),
        };
        let listing = self.listing(principal, kind).await?;
        let by_uri = matches!(kind, ListKind::Resources | ListKind::ResourceTemplates);
        let items: Vec<(String, &ToolInfo)> = if by_uri {
            // Resources are served by uri (templates by theirs), which is never renamed
            // but for one routing would read as another server's qualified name
            // (`bank__x`): named `server__uri` by the server that listed it.
            listing
                .items
                .iter()
                .map(|i| {
                    (
                        crate::call::resource_name(&i.server, &i.name).into_owned(),
                        i,
                    )
                })
                .collect()
        } else {
            let order = &now.order;
            let whole = self.unlisted(&listing, kind).is_empty();
            now.names.expose_of(&listing.items, whole, |s| {
                order.get(s).copied().unwrap_or(usize::MAX)
            })
        };
        // A page follows only from the list as it was: one that changed since (a
        // server added, a tool gone) would skip or repeat items if cut by offset, so
        // its cursor is refused and the client lists from the start.
        let version = listing_version(kind, &items);
        let offset = match cursor {
            None => 0,
            Some((offset, of)) if of == version && offset <= items.len() => offset,
            Some(_) => return Err(invalid("invalid cursor")),
        };
        let page_size = now.config.page_size;
        let end = offset.saturating_add(page_size).min(items.len());
        let key = kind.item_key();
        let served: Vec<Value> = items[offset..end]
            .iter()
            .map(|(name, item)| {
                let mut def = (*item.definition).clone();
                // A URI as the server sent it is left as it is.
                if (!by_uri || *name != *item.name)
                    && let Some(map) = def.as_object_mut()
                {
                    map.insert(key.into(), json!(name));
                }
                def
            })
            .collect();
        // A list missing a server is not worth keeping: it is fresh for no time.
        let complete = listing.unreachable.is_empty();
        let public = complete && listing.public && now.identity.agents() <= 1;
        let mut result = json!({
            kind.key(): served,
            "ttlMs": if complete {
                u64::try_from(listing.fresh_for.as_millis()).unwrap_or(u64::MAX)
            } else {
                0
            },
            "cacheScope": if public { "public" } else { "private" },
        });
        if end < items.len() {
            result["nextCursor"] = json!(make_cursor(end, &version));
        }
        Ok(result)
    }

    /// The name a call goes to in the harness, and its arguments.
    async fn target(
        &self,
        principal: &Principal,
        kind: CallKind,
        params: &Value,
    ) -> Result<(String, Value), RpcError> {
        let field = if kind == CallKind::Resource {
            "uri"
        } else {
            "name"
        };
        let name = params
            .get(field)
            .and_then(Value::as_str)
            .ok_or_else(|| invalid(format!("params.{field} is required")))?;
        let args = params
            .get("arguments")
            .cloned()
            .unwrap_or_else(|| json!({}));
        let name = if kind == CallKind::Resource {
            name.to_string()
        } else {
            match self.resolve(principal, kind, name, true, params).await? {
                Resolved::Name(name) => name,
                Resolved::NotServed(unreachable) => {
                    return Err(to_rpc(&CallError::NoRoute {
                        tool: name.to_string(),
                        unreachable,
                    }));
                }
            }
        };
        Ok((name, args))
    }

    /// The name a served (maybe shortened) tool or prompt name stands for. One this
    /// process has not served yet (another gateway served it, or this one restarted,
    /// or reloaded) is learned from the caller's list. A caller that does not hold one
    /// of its principal's places in flight (`held`) takes one to learn: names made up
    /// to look shortened cannot start listings without bound, nor past another
    /// principal's limit.
    async fn resolve(
        &self,
        principal: &Principal,
        kind: CallKind,
        served: &str,
        held: bool,
        params: &Value,
    ) -> Result<Resolved, RpcError> {
        let resolved = self.resolve_served(principal, kind, served, held).await?;
        // A round that goes on is held to the server that issued its state (which the
        // state names), whoever offers the name now.
        let continues = params.get("requestState").is_some_and(Value::is_string)
            && params
                .get("_meta")
                .is_some_and(|m| m.get(KEY_PROTOCOL_VERSION).is_some());
        match resolved {
            Resolved::Name(name)
                if self.now().config.prefix == Prefix::Conditional
                    && !continues
                    && !name.contains(crate::server::SEPARATOR) =>
            {
                self.only_server_of(principal, kind, name, held).await
            }
            other => Ok(other),
        }
    }

    /// A bare name served `conditional`ly stands for the tool of the one server that
    /// offered it in the caller's listing: called by that server's qualified name, so
    /// that it is not routed by priority to another that offers it now (one that could
    /// not be listed then, or that added it since). Two offering it now is refused, and
    /// so is any while a server the caller may use cannot be listed (it may be the one
    /// the client saw): the client lists again, and is served qualified names.
    async fn only_server_of(
        &self,
        principal: &Principal,
        kind: CallKind,
        name: String,
        held: bool,
    ) -> Result<Resolved, RpcError> {
        let now = self.now();
        let _slot = if held {
            None
        } else {
            Some(self.in_flight_slot(principal, now.config.max_in_flight_per_principal)?)
        };
        let listing = self.listing(principal, kind.list()).await?;
        let unreachable = self.unlisted(&listing, kind.list());
        let mut offering = listing.items.iter().filter(|i| *i.name == *name);
        match (offering.next(), offering.next()) {
            (Some(one), None) if unreachable.is_empty() => {
                Ok(Resolved::Name(one.qualified.to_string()))
            }
            (Some(_), Some(_)) => Err(invalid(format!(
                "{} is offered by more than one server now: list again for the names to call",
                one_line(&name, 100)
            ))),
            (None, _) if unreachable.is_empty() => Ok(Resolved::Name(name)),
            _ => Ok(Resolved::NotServed(unreachable)),
        }
    }

    /// The servers the caller may use that `listing` could not list and that could
    /// offer `kind`: enabled ones (a server disabled in the config serves nothing).
    fn unlisted(
        &self,
        listing: &crate::call::Listing,
        kind: ListKind,
    ) -> Vec<crate::call::Unreachable> {
        (listing.unreachable.iter())
            .map(|(u, _)| u)
            .filter(|u| self.inner.harness.may_offer(&u.server, kind))
            .cloned()
            .collect()
    }

    async fn resolve_served(
        &self,
        principal: &Principal,
        kind: CallKind,
        served: &str,
        held: bool,
    ) -> Result<Resolved, RpcError> {
        let now = self.now();
        match now.names.resolve(served) {
            same if same == served && names::looks_shortened(served) => {
                let _slot = if held {
                    None
                } else {
                    Some(self.in_flight_slot(principal, now.config.max_in_flight_per_principal)?)
                };
                // Another request may have learned it meanwhile.
                let resolved = now.names.resolve(served);
                if resolved != served {
                    return Ok(Resolved::Name(resolved));
                }
                let listing = self.listing(principal, kind.list()).await?;
                let order = &now.order;
                let unreachable = self.unlisted(&listing, kind.list());
                now.names
                    .expose_of(&listing.items, unreachable.is_empty(), |s| {
                        order.get(s).copied().unwrap_or(usize::MAX)
                    });
                // Still unknown, it is a tool's own name, called as its server names it,
                // unless a server the caller may use could not be listed: the name may
                // be that one's shortened name, and a server whose tool took this very
                // name (to pass for it) would answer in its place.
                match now.names.resolve(served) {
                    same if same == served && !unreachable.is_empty() => {
                        Ok(Resolved::NotServed(unreachable))
                    }
                    resolved => Ok(Resolved::Name(resolved)),
                }
            }
            resolved => Ok(Resolved::Name(resolved)),
        }
    }

    /// What `principal` may use of `kind`.
    async fn listing(
        &self,
        principal: &Principal,
        kind: ListKind,
    ) -> Result<crate::call::Listing, RpcError> {
        // Boxed: a call awaits a listing only to learn a shortened name, and would
        // otherwise carry the listing's future in its own.
        Box::pin(
            self.inner
                .harness
                .listing(&Self::caller(principal), kind, None),
        )
        .await
        .map_err(|e| to_rpc(&e))
    }

    /// One upstream step of a downstream call, as the harness runs it.
    async fn delegated(
        &self,
        principal: &Principal,
        kind: CallKind,
        name: &str,
        args: Value,
        delegation: Delegation,
        options: CallOptions,
    ) -> Result<crate::call::Answer, RpcError> {
        self.inner
            .harness
            .call_delegated(
                &Self::caller(principal),
                kind,
                name,
                args,
                Some(delegation),
                options,
            )
            .await
            .map_err(|e| to_rpc(&e))
    }

    /// A 2026-07-28 client's call: one upstream round at a time, the state sealed. A
    /// call that outlives its request (a parked round) goes on under the request's span
    /// by its context, not holding it open.
    #[allow(clippy::too_many_arguments)]
    async fn call_modern(
        &self,
        principal: &Principal,
        kind: CallKind,
        method: &str,
        params: &Value,
        capabilities: Value,
        io: CallIo,
        trace: RequestTrace,
    ) -> Result<Value, RpcError> {
        let CallIo {
            cancel,
            progress,
            session,
        } = io;
        let RequestTrace {
            traced,
            own,
            passed_on,
        } = trace;
        let now = self.now();
        let (mut name, args) = self.target(principal, kind, params).await?;
        // Only a state opened or sealed needs the digest, not every call.
        let digest_cell = std::sync::OnceLock::new();
        let digest = || {
            digest_cell
                .get_or_init(|| seal::params_digest(params))
                .clone()
        };
        let downstream_caps = capabilities.clone();
        let wants_progress = progress_of(params, progress);
        let mut delegation = Delegation {
            capabilities,
            ..Delegation::default()
        };
        // A legacy server's question this process holds, when the state names one.
        let mut parked_id = None;
        match params.get("requestState") {
            None | Some(Value::Null) => {
                if params.get("inputResponses").is_some() {
                    return Err(invalid("inputResponses without requestState"));
                }
            }
            Some(Value::String(sealed)) => {
                let state = now.sealer
                    .open(
                        sealed,
                        &principal.agent,
                        principal.context.as_deref(),
                        method,
                        digest,
                    )
                    .map_err(|e| {
                        // A client sends these as fast as it likes: budgeted.
                        static REFUSED: crate::util::log_budget::LogBudget =
                            crate::util::log_budget::LogBudget::new();
                        if let Some(count) = REFUSED.log() {
                            tracing::info!(agent = %principal.agent, error = %e, count, "requestState refused");
                        }
                        // One message whatever the reason: a stolen state teaches nothing.
                        invalid("invalid requestState")
                    })?;
                // The round continues on the server that issued it, whatever the name
                // routes to now; not on another a reload put under its id (the state,
                // perhaps with earlier answers in it, is the first one's).
                if state.target.is_some()
                    && state.target != self.inner.harness.server_identity(&state.server)
                {
                    static OTHER_SERVER: crate::util::log_budget::LogBudget =
                        crate::util::log_budget::LogBudget::new();
                    if let Some(count) = OTHER_SERVER.log() {
                        tracing::info!(agent = %principal.agent, server = %state.server, count, "requestState refused: its server is not the one that issued it");
                    }
                    if let Some(id) = &state.parked {
                        self.inner.parked.discard(id);
                    }
                    return Err(invalid("invalid requestState"));
                }
                name = on_server(kind, &name, &state.server);
                // A parked call goes on from where it waits, past the route's check of
                // the grants: checked here (a reload may have taken the grant away).
                if let Some(id) = &state.parked
                    && !self.inner.harness.may_call(
                        &principal.agent,
                        &state.server,
                        item_of(kind, &name),
                    )
                {
                    self.inner.parked.discard(id);
                    return Err(to_rpc(&CallError::NoRoute {
                        tool: name,
                        unreachable: Vec::new(),
                    }));
                }
                delegation.input_responses = match params.get("inputResponses") {
                    None | Some(Value::Null) => None,
                    Some(Value::Object(m)) => Some(m.clone()),
                    Some(_) => return Err(invalid("inputResponses must be an object")),
                };
                // A parked round's state from a gateway version before `parked` named
                // it: refused, rather than sent on to a legacy server that would ignore
                // it and run the call again.
                if state.version == 0
                    && state.parked.is_none()
                    && state
                        .upstream
                        .as_deref()
                        .is_some_and(|u| u.starts_with("parked:"))
                {
                    return Err(invalid("invalid requestState"));
                }
                delegation.request_state = state.upstream.filter(|_| state.parked.is_none());
                delegation.rounds = state.rounds;
                delegation.server = Some(state.server);
                delegation.server_identity = state.target;
                parked_id = state.parked;
            }
            Some(_) => return Err(invalid("requestState must be a string")),
        }
        let rounds_before = delegation.rounds;
        // The round this request takes up, once it has: should the request go before
        // its call answers or asks again (cancelled, its client gone, its future
        // dropped), a later answer to that round is told the call was cancelled. A
        // request refused the round (sent again after it was answered) took nothing up.
        let mut taken_up = None;
        let mut held = match parked_id {
            // A legacy server's elicitation answered: its call goes on.
            Some(id) => {
                let answer = delegation
                    .input_responses
                    .as_ref()
                    .and_then(|r| r.get(parked::KEY))
                    .cloned()
                    .ok_or_else(|| invalid("inputResponses.elicitation is required"))?;
                let held = self
                    .inner
                    .parked
                    .resume(&id, (principal, session), answer)?;
                taken_up = Some(self.inner.parked.taken_up(id));
                // The call's progress goes to this request now.
                *held.progress.lock() = wants_progress;
                held
            }
            None => {
                // Progress goes through a relay to whichever request waits on the call
                // (one that parks lets go of it, so that its answer is not held back).
                let slot: parked::ProgressSlot = Arc::new(Mutex::new(wants_progress));
                let first_token = slot.lock().as_ref().map(|(_, token)| token.clone());
                let mut relay_task = None;
                if let Some(token) = first_token {
                    let (tx, mut rx) = tokio::sync::mpsc::channel::<Value>(32);
                    let relay = slot.clone();
                    relay_task = Some(tokio::spawn(async move {
                        while let Some(mut update) = rx.recv().await {
                            let to = relay.lock().clone();
                            if let Some((to, token)) = to {
                                if let Some(m) = update.as_object_mut() {
                                    m.insert("progressToken".into(), token);
                                }
                                let _ = to.send(update).await;
                            }
                        }
                    }));
                    delegation.progress = Some((tx, token));
                }
                // Taken whatever the client declared: a question in a mode it did not
                // declare (or of a client that declared none) is answered that the
                // client does not support it, not left to the input handlers (which
                // would tell the server the user declined).
                let (tx, rx) = tokio::sync::mpsc::channel(4);
                delegation.questions = Some(tx);
                let rx = Some(rx);
                // The call may outlive this request (a parked round): its own token.
                let token = CancelToken::new();
                let (gw, who, target, ended) =
                    (self.clone(), principal.clone(), name.clone(), token.clone());
                // Under this request's span by its context, not a handle on it: the
                // span ends with the request, also when the call goes on (parked).
                let options = CallOptions {
                    timeout: None,
                    cancel: Some(ended),
                    traced: Some(traced),
                    // Always its own: even untraced, a handle on the request's span
                    // would keep it open for as long as the call is held.
                    // (Not exported: the client's context, for a filter that exports the
                    // call's spans and not the gateway's.)
                    trace_parent: Some(own.or_else(|| passed_on.clone()).unwrap_or_default()),
                };
                let call = parked::Call::inline(async move {
                    let call = gw.delegated(&who, kind, &target, args, delegation, options);
                    match passed_on {
                        Some(cx) => call.with_context(cx).await,
                        None => call.await,
                    }
                });
                parked::Held {
                    call,
                    questions: rx,
                    cancel: token,
                    progress: slot,
                    relay: relay_task,
                }
            }
        };
        let answer = loop {
            let waited = tokio::select! {
                w = parked::wait(held) => w,
                // Dropping the wait drops the call's hold: the call is cancelled.
                _ = cancel.cancelled() => return Err(to_rpc(&CallError::Cancelled)),
            };
            if let Some(t) = taken_up.as_mut() {
                t.settled();
            }
            let (h, question) = match waited {
                parked::Waited::Done(answer, h) => {
                    h.drain().await;
                    break answer?;
                }
                parked::Waited::Asked(h, question) => (h, question),
            };
            let mode = crate::call::input::elicitation_mode(&question.params);
            if !mode.is_some_and(|mode| elicits(&downstream_caps, mode)) {
                let _ = question.reply.send(Err(RpcError::new(
                    crate::protocol::error::INVALID_PARAMS,
                    format!(
                        "the client does not support {}-mode elicitation",
                        mode.unwrap_or("this")
                    ),
                )));
                held = h;
                continue;
            }
            let rounds = rounds_before + 1;
            let cap = self.inner.harness.round_cap();
            if rounds > cap {
                let _ = question
                    .reply
                    .send(Err(RpcError::new(INTERNAL_ERROR, "round cap")));
                return Err(to_rpc(&CallError::RoundCap {
                    cap,
                    server: question.server.clone(),
                }));
            }
            // The question's params go to the client, not also into the parked round.
            let mut question = question;
            let mut ask = serde_json::Map::new();
            ask.insert("method".into(), Value::String(question.method.clone()));
            ask.insert("params".into(), std::mem::take(&mut question.params));
            let ask = Value::Object(ask);
            let server = question.server.clone();
            // The keys and ttl in force now, not when the request came: a reload that
            // dropped a leaked key or cut the ttl meanwhile holds for this round too.
            let sealer = &self.now().sealer;
            let expires = duration::after(std::time::Instant::now(), sealer.ttl());
            *h.progress.lock() = None;
            let item = item_of(kind, &name).to_string();
            // What the parked call holds: its arguments and its name or URI (the same
            // on every round).
            let named = ["name", "uri"]
                .iter()
                .filter_map(|k| params.get(*k).and_then(Value::as_str))
                .map(str::len)
                .sum::<usize>();
            let size = (
                params
                    .get("arguments")
                    .map_or(0, crate::registry::cache::json_size)
                    .saturating_add(named),
                now.config.max_body_bytes.saturating_mul(PARKED_BODIES),
                now.config.max_body_bytes.saturating_mul(PARKED_BODIES_ALL),
            );
            let Some(id) =
                self.inner
                    .parked
                    .park((principal, session), item, size, h, question, expires)
            else {
                return Err(RpcError::new(
                    -32000,
                    "no input round can be held now (too many, or shutting down); try again",
                ));
            };
            // `upstream` keeps the mark earlier gateway versions read (they then refuse
            // the state rather than start the call again); this version reads `parked`
            // and never takes a server's state for its own.
            let round = Round {
                target: self.inner.harness.server_identity(&server),
                server,
                upstream: Some(format!("parked:{id}")),
                parked: Some(id.clone()),
                rounds,
            };
            let sealed = match seal_round(sealer, principal, (method, digest()), round) {
                Ok(sealed) => {
                    self.inner.parked.sealed_under(&id, sealer.sealing_key());
                    sealed
                }
                Err(e) => {
                    // Nobody could take it up: its place is given back at once.
                    self.inner.parked.discard(&id);
                    return Err(e);
                }
            };
            return Ok(json!({
                "resultType": "input_required",
                "inputRequests": {parked::KEY: ask},
                "requestState": sealed,
            }));
        };
        if !answer.input_required {
            return Ok(served_result(answer.result, &answer.server));
        }
        let mut result = answer.result;
        let upstream = result
            .get("requestState")
            .and_then(Value::as_str)
            .map(String::from);
        let round = Round {
            server: answer.server.to_string(),
            upstream,
            parked: None,
            rounds: answer.rounds,
            // The server that answered, not whichever has its id by now.
            target: answer.server_identity.as_deref().map(String::from),
        };
        let sealed = seal_round(&self.now().sealer, principal, (method, digest()), round)?;
        if let Some(map) = result.as_object_mut() {
            map.insert("requestState".into(), json!(sealed));
        }
        Ok(result)
    }

    /// A legacy client's call: upstream rounds become requests on its session, answered
    /// within the call.
    #[allow(clippy::too_many_arguments)]
    async fn call_legacy(
        &self,
        principal: &Principal,
        kind: CallKind,
        params: &Value,
        client: &LegacyClient,
        peer: Option<&dyn ClientPeer>,
        io: CallIo,
        trace: RequestTrace,
    ) -> Result<Value, RpcError> {
        let CallIo {
            cancel, progress, ..
        } = io;
        // One sampling decision for the request, however many upstream rounds it takes;
        // its calls are under its span, which lasts as long as they do.
        let RequestTrace {
            traced, passed_on, ..
        } = trace;
        let (mut name, args) = self.target(principal, kind, params).await?;
        let mut delegation = Delegation {
            progress: progress_of(params, progress),
            capabilities: if peer.is_some() {
                client.capabilities.clone()
            } else {
                json!({})
            },
            ..Delegation::default()
        };
        // A legacy server's own elicitation during the call is asked on the session.
        let (questions, mut asked) = tokio::sync::mpsc::channel::<crate::call::ServerQuestion>(4);
        // Taken whatever the client declared (see the modern path).
        delegation.questions = Some(questions);
        // One deadline for the request, its rounds and the client's answers together,
        // as a call made in the library has: each round began a call_timeout of its own.
        let call_timeout = self.inner.harness.call_timeout();
        let until = crate::util::duration::after(tokio::time::Instant::now(), call_timeout);
        let past_deadline = || to_rpc(&CallError::DeadlineExceeded(call_timeout));
        // A question to the client waits input_timeout, and no longer than the request.
        let answer_by = || {
            let limit = self.config().input_timeout;
            let at = crate::util::duration::after(tokio::time::Instant::now(), limit).min(until);
            (at, limit)
        };
        let outcome: Result<Value, RpcError> = async {
            loop {
                let answer = {
                    let left = until.saturating_duration_since(tokio::time::Instant::now());
                    if left.is_zero() {
                        return Err(past_deadline());
                    }
                    // Under the request's span, which lasts as long as its calls.
                    let options = CallOptions {
                        timeout: Some(left),
                        cancel: Some(cancel.clone()),
                        traced: Some(traced),
                        trace_parent: None,
                    };
                    let call = self
                        .delegated(
                            principal,
                            kind,
                            &name,
                            args.clone(),
                            delegation.clone(),
                            options,
                        );
                    // As at the other call site: a context attached only when the client
                    // sent one (an empty one would hide an embedder's).
                    let call = match passed_on.clone() {
                        Some(cx) => tokio_util::either::Either::Left(call.with_context(cx)),
                        None => tokio_util::either::Either::Right(call),
                    };
                    tokio::pin!(call);
                    loop {
                        tokio::select! {
                            answer = &mut call => break answer,
                            Some(q) = asked.recv() => {
                                let crate::call::ServerQuestion { method, params, reply: mut reply_to, .. } = q;
                                let mode = crate::call::input::elicitation_mode(&params);
                                let reply = match peer {
                                    Some(peer) if mode.is_some_and(|mode| elicits(&client.capabilities, mode)) => {
                                        let (at, _) = answer_by();
                                        let asked = tokio::time::timeout_at(at, peer.request(&method, params));
                                        tokio::select! {
                                            reply = asked => reply.unwrap_or_else(|_| {
                                                Err(RpcError::new(INTERNAL_ERROR, "the client did not answer in time"))
                                            }),
                                            _ = cancel.cancelled() => Err(RpcError::new(INTERNAL_ERROR, "cancelled")),
                                            // The server gave its question up: the client's
                                            // answer is no one's now, and the call goes on
                                            // without waiting for it.
                                            () = reply_to.closed() => continue,
                                            // The call ended with the question open (its
                                            // result came right behind it, or the server
                                            // went away): the question is withdrawn from the
                                            // client as it drops, and the answer goes now.
                                            answer = &mut call => break answer,
                                        }
                                    }
                                    _ => Err(RpcError::new(
                                        crate::protocol::error::INVALID_PARAMS,
                                        format!("the client does not support {}-mode elicitation", mode.unwrap_or("this")),
                                    )),
                                };
                                let _ = reply_to.send(reply);
                            }
                        }
                    }
                };
                let answer = answer?;
                if !answer.input_required {
                    return Ok(served_result(answer.result, &answer.server));
                }
                let Some(peer) = peer else {
                    return Err(RpcError::new(
                        INTERNAL_ERROR,
                        "the tool asked for input, and this session cannot be asked",
                    ));
                };
                let input = InputRequired::from_value(&answer.result)
                    .map_err(|e| RpcError::new(INTERNAL_ERROR, e.to_string()))?;
                // Asked all at once, as the library asks its handlers: a client may show
                // them together, and each waits only for its own answer.
                let asks = input.input_requests.into_iter().map(|(key, ask)| {
                    let (at, limit) = answer_by();
                    async move {
                        match tokio::time::timeout_at(at, peer.request(&ask.method, ask.params)).await {
                            Ok(reply) => reply.map(|reply| (key, reply)),
                            Err(_) if at >= until => Err(past_deadline()),
                            Err(_) => Err(RpcError::new(
                                INTERNAL_ERROR,
                                format!("the client did not answer {} within {limit:?}", ask.method),
                            )),
                        }
                    }
                });
                let answers: Map<String, Value> = tokio::select! {
                    replies = futures_util::future::try_join_all(asks) => replies?.into_iter().collect(),
                    _ = cancel.cancelled() => return Err(RpcError::new(INTERNAL_ERROR, "cancelled")),
                };
                name = on_server(kind, &name, &answer.server);
                delegation.input_responses = Some(answers);
                delegation.request_state = input.request_state;
                delegation.rounds = answer.rounds;
                delegation.server = Some(answer.server.to_string());
            }
        }
        .await;
        outcome
    }
}

/// The round a sealed state continues: the server whose round it is, its own state or
/// the question this gateway holds for it, and the rounds so far.
struct Round {
    server: String,
    upstream: Option<String>,
    parked: Option<String>,
    rounds: usize,
    /// What the server is (`HarnessHandle::server_identity`).
    target: Option<String>,
}

/// A round's state sealed for the downstream client: bound to the principal, the
/// method and a digest of its params, valid for the sealer's ttl. The sealer is the one
/// in force when the round is sealed (see its callers).
fn seal_round(
    sealer: &Sealer,
    principal: &Principal,
    (method, digest): (&str, String),
    round: Round,
) -> Result<String, RpcError> {
    let issued = seal::now_ms();
    let ttl = u64::try_from(sealer.ttl().as_millis()).unwrap_or(u64::MAX);
    let Round {
        server,
        upstream,
        parked,
        rounds,
        target,
    } = round;
    let state = RoundState {
        server,
        upstream,
        parked,
        agent: principal.agent.to_string(),
        context: principal.context.as_deref().map(String::from),
        method: method.to_string(),
        digest,
        issued_ms: issued,
        expires_ms: issued.saturating_add(ttl),
        rounds,
        version: seal::STATE_VERSION,
        target,
    };
    let sealed = sealer.seal(&state).map_err(|e| {
        tracing::error!(error = %e, "could not seal requestState");
        RpcError::new(INTERNAL_ERROR, "internal error")
    })?;
    // One this gateway would refuse when it comes back is not issued: the client
    // would ask its user for answers that can never be delivered.
    if sealed.len() > seal::MAX_SEALED {
        tracing::warn!(server = %state.server, bytes = sealed.len(), "an input round's state is too large to carry");
        return Err(RpcError::new(
            INTERNAL_ERROR,
            format!(
                "the server's input round state is too large for the gateway to carry (at most {} KiB sealed)",
                seal::MAX_SEALED / 1024
            ),
        ));
    }
    Ok(sealed)
}

/// Whether a client's capabilities take elicitation in `mode` (`elicitation: {}` is
/// form only, as the spec reads it).
fn elicits(capabilities: &Value, mode: &str) -> bool {
    match capabilities.get("elicitation") {
        Some(Value::Object(e)) if e.is_empty() => mode == "form",
        Some(e) => e.get(mode).is_some(),
        None => false,
    }
}

/// What ties one downstream call to its client: its cancellation, and where its
/// progress goes.
struct CallIo {
    cancel: CancelToken,
    progress: Option<ProgressSender>,
    /// The local session the request came in on ([`Client::Modern`]).
    session: Option<u64>,
}

/// How one downstream call request is traced: decided at its server span.
struct RequestTrace {
    /// Whether the call is traced.
    traced: bool,
    /// The request's span's context, when it is exported: the parent of a call that
    /// may outlive the request.
    own: Option<opentelemetry::Context>,
    /// The client's trace context, for the call to pass on where no span of its own
    /// carries one ([`crate::util::trace_context::passed_on`]).
    passed_on: Option<opentelemetry::Context>,
}

/// A call request's server span and how its call is traced, made when the request
/// arrives ([`Gateway::request_span`]).
pub(crate) struct RequestSpan {
    span: tracing::Span,
    trace: RequestTrace,
}

impl RequestSpan {
    /// The span, for the listener's checks to run in.
    pub(crate) fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// Marks the span with the listener's refusal of its request (the span ends when
    /// this is dropped).
    pub(crate) fn refuse(&self, e: &RpcError) {
        mark_outcome(&self.span, Err(e));
    }
}

impl RequestTrace {
    /// Not traced, and nothing to pass on.
    const UNTRACED: RequestTrace = RequestTrace {
        traced: false,
        own: None,
        passed_on: None,
    };
}

/// Whether a downstream request asks for progress (`_meta.progressToken`).
pub(crate) fn wants_progress(request: &Request) -> bool {
    request.params.as_ref().and_then(progress_token).is_some()
}

/// The request's `progressToken`, if it is one the gateway takes: an integer, or a
/// string of at most [`MAX_PROGRESS_TOKEN`] bytes.
fn progress_token(params: &Value) -> Option<&Value> {
    params
        .get("_meta")
        .and_then(|m| m.get("progressToken"))
        .filter(|t| match t {
            Value::String(s) => s.len() <= MAX_PROGRESS_TOKEN,
            _ => t.is_i64() || t.is_u64(),
        })
}

/// The server span of one downstream request: a child of the client's trace context
/// when its `_meta` carries a well-formed `traceparent`, so the client's trace goes on
/// through the gateway into the harness's call and on to the upstream server.
/// Whether it is traced is decided here, at the root (and handed to the call): the
/// client's sampled flag when it sent a trace context and `follow_client` holds, else
/// the harness's ratio. The third part, when the client sent a trace context, is what
/// the call passes on where no span of its own carries one (see
/// [`crate::util::trace_context::passed_on`]), to attach to the call's future.
fn downstream_span(
    (sampler, follow_client): (&HeadSampler, bool),
    kind: CallKind,
    name: &str,
    params: &Value,
) -> (tracing::Span, bool, Option<opentelemetry::Context>) {
    let remote = crate::util::trace_context::extract(Some(params));
    let traced = match &remote {
        Some(remote) if follow_client => remote.is_sampled(),
        Some(remote) => sampler.for_trace(remote.trace_id()),
        None => sampler.root(),
    };
    let span = call_span!(
        traced: traced,
        "gateway",
        otel.name = %crate::util::trace_context::span_name(kind.method(), kind != CallKind::Resource, name),
        otel.kind = "server",
        mcp.method.name = kind.method(),
        error.type = tracing::field::Empty,
        rpc.response.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    let passed_on = (remote.as_ref()).map(|r| crate::util::trace_context::passed_on(r, traced));
    if let (Some(mut remote), true, false) = (remote, traced, span.is_disabled()) {
        use opentelemetry::trace::TraceContextExt;
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        if !remote.is_sampled() {
            // Kept by the ratio against the client's flag: marked sampled, else the
            // SDK's parent-based sampler would drop what was decided to be traced.
            remote = opentelemetry::trace::SpanContext::new(
                remote.trace_id(),
                remote.span_id(),
                remote.trace_flags().with_sampled(true),
                true,
                remote.trace_state().clone(),
            );
        }
        let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
    }
    (span, traced, passed_on)
}

impl Gateway {
    /// The server span of a call request (named by what it asks for, as the client
    /// named it: in search mode, `call_tool`'s by the tool it calls), and how its call
    /// is traced; `None` for other requests.
    pub(crate) fn request_span(&self, request: &Request) -> Option<RequestSpan> {
        let kind = match request.method.as_str() {
            "tools/call" => CallKind::Tool,
            "prompts/get" => CallKind::Prompt,
            "resources/read" => CallKind::Resource,
            _ => return None,
        };
        let params = request.params.as_ref().unwrap_or(&Value::Null);
        let asked = match kind {
            CallKind::Resource => params.get("uri"),
            _ => match params.get("name") {
                Some(n)
                    if n == search::CALL_TOOL
                        && self.now().config.tool_exposure == ToolExposure::Search =>
                {
                    params.get("arguments").and_then(|a| a.get("name"))
                }
                name => name,
            },
        };
        let asked = asked.and_then(Value::as_str).unwrap_or("");
        let (span, traced, passed_on) = downstream_span(self.sampling(), kind, asked, params);
        // The span's context where it is exported (an OpenTelemetry layer, traced).
        let own = (traced && !span.is_disabled())
            .then(|| {
                use opentelemetry::trace::TraceContextExt;
                use tracing_opentelemetry::OpenTelemetrySpanExt;
                Some(span.context()).filter(|cx| cx.span().span_context().is_valid())
            })
            .flatten();
        let trace = RequestTrace {
            traced,
            own,
            passed_on,
        };
        Some(RequestSpan { span, trace })
    }
}

/// Marks the gateway's server span with how its request ended, as the conventions
/// ask of a server span: an error by its JSON-RPC code, a tool's own error as
/// `tool_error`.
fn mark_outcome(span: &tracing::Span, outcome: Result<&Value, &RpcError>) {
    if span.is_disabled() {
        return;
    }
    let error_type = match outcome {
        Err(e) => e.code.to_string(),
        Ok(result) if result.get("isError") == Some(&Value::Bool(true)) => "tool_error".into(),
        Ok(_) => return,
    };
    crate::call::mark_failed(span, &error_type);
}

/// Longest string `progressToken` a client gets progress for: the token goes out on
/// every update, and one of megabytes would be copied into each one queued.
const MAX_PROGRESS_TOKEN: usize = 256;

/// The caller's `progressToken` (a string of at most [`MAX_PROGRESS_TOKEN`] bytes, or
/// an integer), paired with where its progress goes, when both are there.
fn progress_of(params: &Value, to: Option<ProgressSender>) -> Option<(ProgressSender, Value)> {
    let token = progress_token(params)?;
    Some((to?, token.clone()))
}

/// The params a principal's parked calls may hold, in `max_body_bytes`: parked for
/// minutes, less than the four its calls in flight may.
const PARKED_BODIES: usize = 2;

/// How many request bodies' worth of arguments all principals' parked rounds may hold
/// together (each principal's first is held whatever its size, unless
/// this is reached).
const PARKED_BODIES_ALL: usize = 32;

/// A call's result as served: the resource URIs in it (a read's `contents`, a tool's
/// or a prompt's `resource_link` and embedded `resource` items) that routing would read
/// as another server's qualified name are named by the server that answered, as its
/// listing names them, so that a read of one goes back there.
fn served_result(mut result: Value, server: &str) -> Value {
    let fix = |uri: Option<&mut Value>| {
        if let Some(uri) = uri
            && let Some(text) = uri.as_str()
            && crate::call::split_for(CallKind::Resource, text).is_some()
        {
            *uri = Value::String(crate::call::resource_name(server, text).into_owned());
        }
    };
    let fix_item = |item: &mut Value| match item.get("type").and_then(Value::as_str) {
        Some("resource_link") => fix(item.get_mut("uri")),
        Some("resource") => fix(item.get_mut("resource").and_then(|r| r.get_mut("uri"))),
        _ => {}
    };
    if let Some(contents) = result.get_mut("contents").and_then(Value::as_array_mut) {
        contents.iter_mut().for_each(|c| fix(c.get_mut("uri")));
    }
    if let Some(content) = result.get_mut("content").and_then(Value::as_array_mut) {
        content.iter_mut().for_each(fix_item);
    }
    if let Some(messages) = result.get_mut("messages").and_then(Value::as_array_mut) {
        for m in messages {
            if let Some(content) = m.get_mut("content") {
                fix_item(content);
            }
        }
    }
    result
}

/// What a call of `name` (as routed: `server__item`, or a resource's URI, qualified or
/// not) is of on its server, as grants name it: a tool's or prompt's name, a resource's
/// URI, without the server that qualifies it.
fn item_of(kind: CallKind, name: &str) -> &str {
    crate::call::split_for(kind, name).map_or(name, |(_, item)| item)
}

/// `name` as a call pinned to `server` names it: qualified by that server (a resource
/// by its URI, unless routing would read that as another server's qualified name).
fn on_server(kind: CallKind, name: &str, server: &str) -> String {
    let item = item_of(kind, name);
    if kind == CallKind::Resource {
        return crate::call::resource_name(server, item).into_owned();
    }
    format!("{server}__{item}")
}

/// Requests in flight by key, for `notifications/cancelled`. Several may share a key
/// (two clients holding one token pick the same id): a cancel cancels them all, and each
/// request removes only its own entry. Each has two tokens: the client's (cancelled by
/// its `notifications/cancelled` only: such a request is not answered) and the call's
/// (cancelled by that, and by the end of the session, whose requests are answered).
pub(crate) struct InFlight<K> {
    next: u64,
    map: HashMap<K, Vec<(u64, CancelToken, CancelToken)>>,
    /// Cancellations of requests not (yet) in flight, kept a moment when they may have
    /// overtaken their request (see [`InFlight::cancel_or_keep`]): oldest first.
    early: std::collections::VecDeque<(K, Instant)>,
}

impl<K> Default for InFlight<K> {
    fn default() -> Self {
        InFlight {
            next: 0,
            map: HashMap::new(),
            early: std::collections::VecDeque::new(),
        }
    }
}

/// How many cancellations of requests not yet in flight a session keeps, and for how
/// long: enough for one that overtook its request on another HTTP connection, where
/// the request is at most a body's read and its `Mcp-Param` check behind.
const EARLY_CANCELS: usize = 64;
const EARLY_CANCEL_KEPT: Duration = http::REQUEST_LAG_MAX;

impl<K: std::hash::Hash + Eq> InFlight<K> {
    /// Adds a request; the ticket removes it. One whose cancellation came first (kept
    /// by [`InFlight::cancel_or_keep`]) is cancelled at once.
    pub(crate) fn insert(&mut self, key: K, by_client: CancelToken, call: CancelToken) -> u64 {
        if !self.early.is_empty() {
            self.early
                .retain(|(_, at)| at.elapsed() < EARLY_CANCEL_KEPT);
            if let Some(at) = self.early.iter().position(|(k, _)| *k == key) {
                self.early.remove(at);
                by_client.cancel();
                call.cancel();
            }
        }
        self.next += 1;
        self.map
            .entry(key)
            .or_default()
            .push((self.next, by_client, call));
        self.next
    }

    /// Removes the request of `ticket`.
    pub(crate) fn remove(&mut self, key: &K, ticket: u64) {
        if let Some(list) = self.map.get_mut(key) {
            list.retain(|(t, _, _)| *t != ticket);
            if list.is_empty() {
                self.map.remove(key);
            }
        }
    }

    /// Whether no request is in flight.
    pub(crate) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Cancels every request's call (the session ends; not the client's doing).
    pub(crate) fn cancel_all(&self) {
        for (_, _, call) in self.map.values().flatten() {
            call.cancel();
        }
    }

    /// Cancels every request under `key`, as its client asked.
    pub(crate) fn cancel(&self, key: &K) {
        for (_, by_client, call) in self.map.get(key).into_iter().flatten() {
            by_client.cancel();
            call.cancel();
        }
    }

    /// Cancels every request under `key`; with none, keeps the cancellation a moment
    /// for a request under `key` still on its way. Where requests arrive on several
    /// connections (HTTP), a client's cancellation can overtake the request it
    /// cancels; ids are not reused within a session, so a later request by that id is
    /// the one meant.
    pub(crate) fn cancel_or_keep(&mut self, key: K) {
        if self.map.contains_key(&key) {
            self.cancel(&key);
            return;
        }
        self.early
            .retain(|(_, at)| at.elapsed() < EARLY_CANCEL_KEPT);
        if self.early.len() == EARLY_CANCELS {
            self.early.pop_front();
        }
        self.early.push_back((key, Instant::now()));
    }
}

/// How often a list change dropped for a client that was not reading (a stream's queue
/// full) is tried again:
/// unlike progress, it is owed (the client's list stays stale without it), and one is
/// sent however many changes came meanwhile.
pub(crate) const OWED_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// List changes dropped for a client that was not reading, owed until they are
/// queued: tried again at a time fixed when the first was dropped, which other events
/// (of other servers, say) do not put off.
#[derive(Default)]
pub(crate) struct Owed(Option<tokio::time::Instant>, ListsChanged);

impl Owed {
    /// Sends a notice of each list in `changed` and of those owed (`send` says whether
    /// it was queued); those not sent are owed from now, if none was before.
    pub(crate) fn send(
        &mut self,
        changed: ListsChanged,
        mut send: impl FnMut(&'static str) -> bool,
    ) {
        let lists = self.1.union(changed);
        let mut unsent = ListsChanged::default();
        for method in lists.methods() {
            if !send(method) {
                unsent.mark(method);
            }
        }
        self.1 = unsent;
        self.0 = match unsent.any() {
            true => self
                .0
                .or_else(|| Some(tokio::time::Instant::now() + OWED_RETRY)),
            false => None,
        };
    }

    /// Takes what is owed once it is due to be tried again (the time is cleared, so
    /// that [`Owed::send`] sets the next); never returns when nothing is owed.
    pub(crate) async fn due(&mut self) -> ListsChanged {
        match self.0 {
            Some(at) => {
                tokio::time::sleep_until(at).await;
                self.0 = None;
                std::mem::take(&mut self.1)
            }
            None => std::future::pending().await,
        }
    }
}

/// A version of a listing as served (the method and the names in order): a cursor
/// names the one it was cut from.
fn listing_version(kind: ListKind, items: &[(String, &ToolInfo)]) -> String {
    let mut text = String::from(kind.method());
    for (name, _) in items {
        text.push('\n');
        text.push_str(name);
    }
    let mut digest = crate::util::hash::sha256_hex(text.as_bytes());
    digest.truncate(16);
    digest
}

fn make_cursor(offset: usize, version: &str) -> String {
    URL_SAFE_NO_PAD.encode(format!("g2:{offset}:{version}"))
}

/// The offset and the listing version a cursor names.
fn parse_cursor(cursor: &str) -> Option<(usize, String)> {
    if cursor.len() > 96 {
        return None;
    }
    let raw = URL_SAFE_NO_PAD.decode(cursor).ok()?;
    let text = std::str::from_utf8(&raw).ok()?;
    let (offset, version) = text.strip_prefix("g2:")?.split_once(':')?;
    Some((offset.parse().ok()?, version.to_string()))
}

/// An upstream error code as a client of `version` knows it: a 2026-07-28 client gets
/// -32602 for the retired "resource not found" (-32002), and -32042 ("URL elicitation
/// required", a 2025-11-25 code) goes only to 2025-11-25 clients; others get an internal
/// error for it, as for any other code of the reserved range.
fn codes_of_the_era(mut error: RpcError, version: &str) -> RpcError {
    match error.code {
        RESOURCE_NOT_FOUND_RETIRED if version == crate::protocol::meta::MODERN => {
            error.code = INVALID_PARAMS
        }
        URL_ELICITATION_REQUIRED if version != "2025-11-25" => {
            // As any other upstream error the client cannot be given as it is.
            error = RpcError::new(INTERNAL_ERROR, error.message)
                .with_data(json!({"code": "server_error"}));
        }
        _ => {}
    }
    error
}

/// "Resource not found" before 2026-07-28 (which answers -32602).
const RESOURCE_NOT_FOUND_RETIRED: i64 = -32002;
/// "URL elicitation required", in 2025-11-25 only.
const URL_ELICITATION_REQUIRED: i64 = -32042;

/// A harness error as the downstream client sees it: what names a tool it may not use
/// looks like an unknown tool (-32602, the same words whether the tool's server exists
/// or not: a caller cannot learn which servers are configured by asking for
/// `name__x`), a server's own JSON-RPC error passes through
/// (unless it is one of the gateway's own protocol codes, which mean nothing to the
/// client), everything else is an internal error with a one-line reason.
pub fn to_rpc(error: &CallError) -> RpcError {
    match error {
        CallError::Denied { .. } | CallError::NoRoute { .. } => invalid("unknown tool"),
        CallError::MissingCapability { required, .. } => RpcError::new(
            crate::protocol::error::MISSING_CLIENT_CAPABILITY,
            "missing required client capability",
        )
        .with_data(json!({"requiredCapabilities": required})),
        // -32042 too: whether the client knows it is for the era's mapping to say.
        CallError::Server(ServerError::Rpc { error, .. })
            if !(-32099..=-32020).contains(&error.code)
                || error.code == URL_ELICITATION_REQUIRED =>
        {
            RpcError {
                code: error.code,
                message: one_line(&error.message, 400),
                data: error.data.clone(),
            }
        }
        // Other agents' spending is no client's to see.
        CallError::InputDenied {
            server,
            method,
            reason,
        } => RpcError::new(
            INTERNAL_ERROR,
            one_line(
                &format!(
                    "{method} from server {server} was refused: {}",
                    reason.as_told_to_the_agent()
                ),
                400,
            ),
        )
        .with_data(json!({"code": error.code()})),
        other => RpcError::new(INTERNAL_ERROR, one_line(&other.to_string(), 400))
            .with_data(json!({"code": other.code()})),
    }
}

#[cfg(test)]
mod tests {
    // A client is told its own call's and agent's spending, not the others' that a
    // server's budget or the total counts.
    #[test]
    fn a_budget_refusal_shows_a_client_no_one_elses_spending() {
        use crate::call::input::Denial;
        let refused = |reason| {
            super::to_rpc(&crate::CallError::InputDenied {
                server: "s".into(),
                method: "sampling/createMessage".into(),
                reason,
            })
            .message
        };
        for reason in [
            Denial::ServerBudgetExceeded {
                server: "s".into(),
                budget: 1000,
                spent: 987_654,
                asked: 10,
            },
            Denial::TotalBudgetExceeded {
                budget: 1000,
                spent: 987_654,
                asked: 10,
            },
        ] {
            let message = refused(reason);
            assert!(
                !message.contains("987654") && !message.contains("987,654"),
                "{message}"
            );
            assert!(message.contains("budget"), "{message}");
        }
        let own = refused(Denial::BudgetExceeded {
            budget: 1000,
            spent: 987_654,
            asked: 10,
        });
        assert!(own.contains("987654"), "its own call's: {own}");
    }

    #[test]
    fn a_keys_file_others_can_read_or_that_is_no_file_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("mcp-harness-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("gateway.keys");
        let key = super::seal::new_key().expect("key");
        std::fs::write(&path, format!("k1:{key}\n")).expect("write");
        let config = super::GatewayConfig {
            keys_file: Some(path.clone()),
            ..super::GatewayConfig::default()
        };
        let chmod = |mode| {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod")
        };
        chmod(0o644);
        let refused = config
            .sealer()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(refused.contains("readable by others"), "{refused}");
        chmod(0o620);
        let refused = config
            .sealer()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(refused.contains("writable by its group"), "{refused}");
        chmod(0o600);
        assert!(config.sealer().is_ok(), "this user's alone");
        // A directory (or a FIFO) is refused at once, not read (or waited on).
        let not_a_file = super::GatewayConfig {
            keys_file: Some(dir.clone()),
            ..super::GatewayConfig::default()
        };
        let refused = not_a_file
            .sealer()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(refused.contains("not a regular file"), "{refused}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_progress_token_is_a_bounded_string_or_an_integer() {
        let (to, _rx) = tokio::sync::mpsc::channel(1);
        let token = |t: serde_json::Value| {
            let params = serde_json::json!({"_meta": {"progressToken": t}});
            super::progress_of(&params, Some(to.clone())).map(|(_, t)| t)
        };
        let longest = "t".repeat(super::MAX_PROGRESS_TOKEN);
        assert_eq!(token(longest.clone().into()), Some(longest.into()));
        assert_eq!(token(7.into()), Some(7.into()));
        // Ignored, not refused: the call runs, without progress.
        assert_eq!(
            token("t".repeat(super::MAX_PROGRESS_TOKEN + 1).into()),
            None
        );
        assert_eq!(token(1.5.into()), None);
        assert_eq!(token(serde_json::json!({"a": 1})), None);
    }

    // Retired codes do not reach the clients of the eras without them.
    #[test]
    fn an_upstream_code_goes_down_as_the_clients_era_knows_it() {
        use crate::protocol::RpcError;
        let upstream = |code| {
            super::to_rpc(&super::CallError::Server(super::ServerError::Rpc {
                server: "s".into(),
                error: RpcError::new(code, "said"),
            }))
        };
        let era = |code, version| super::codes_of_the_era(upstream(code), version).code;
        assert_eq!(era(-32002, "2026-07-28"), super::INVALID_PARAMS);
        assert_eq!(era(-32002, "2025-11-25"), -32002);
        assert_eq!(era(-32042, "2025-11-25"), -32042);
        assert_eq!(era(-32042, "2025-06-18"), super::INTERNAL_ERROR);
        assert_eq!(era(-32042, "2026-07-28"), super::INTERNAL_ERROR);
        // The rest of the reserved range is the gateway's own, never passed through.
        assert_eq!(era(-32021, "2025-11-25"), super::INTERNAL_ERROR);
        assert_eq!(era(-32000, "2026-07-28"), -32000);
    }

    #[test]
    fn a_tool_the_caller_may_not_use_names_no_server() {
        let denied = super::to_rpc(&super::CallError::Denied {
            agent: Some("a".into()),
            server: Some("payroll".into()),
            tool: "x".into(),
        });
        let missing = super::to_rpc(&super::CallError::NoRoute {
            tool: "nosuch__x".into(),
            unreachable: Vec::new(),
        });
        assert_eq!(denied.code, super::INVALID_PARAMS);
        assert_eq!(
            (denied.code, &denied.message),
            (missing.code, &missing.message)
        );
        assert!(!denied.message.contains("payroll"));
    }

    #[test]
    fn tokens_written_as_themselves_are_refused_unquoted_and_limits_are_bounded() {
        for list in ["tokens", "admin_tokens", "metrics_tokens"] {
            for written in [json!(["tok-sekrit"]), json!("tok-sekrit")] {
                let e = GatewayConfig::from_value(Some(json!({ list: written }))).expect_err(list);
                assert!(!e.to_string().contains("sekrit"), "{e}");
                assert!(e.to_string().contains("sha256"), "{e}");
            }
        }
        // A wrong field in an entry is named by its path.
        let e = GatewayConfig::from_value(Some(json!({"tokens": [{"sha256": "ab", "agent": 5}]})))
            .expect_err("agent");
        assert!(e.to_string().contains("[0].agent"), "{e}");
        let huge = json!({"max_in_flight_per_principal": usize::MAX});
        let e = GatewayConfig::from_value(Some(huge)).expect_err("too many");
        assert!(e.to_string().contains("at most"), "{e}");
    }

    #[test]
    fn a_legacy_session_keeps_only_the_capabilities_read_and_bounds_them() {
        let asked = json!({
            "elicitation": {"form": {}},
            "roots": {"listChanged": true},
            "experimental": {"junk": vec![0; 100_000]},
        });
        let kept = super::kept_capabilities(Some(&asked)).expect("kept");
        assert_eq!(
            kept,
            json!({"elicitation": {"form": {}}, "roots": {"listChanged": true}})
        );
        let huge = json!({"sampling": {"x": vec![[0; 8]; 1_000]}});
        let refused = super::kept_capabilities(Some(&huge)).expect_err("too large");
        assert_eq!(refused.code, super::INVALID_PARAMS);
        assert_eq!(super::kept_capabilities(None).expect("none"), json!({}));
        // Small as text, many values once parsed: refused too.
        let many: serde_json::Map<String, Value> =
            (0..200).map(|i| (format!("a{i}"), json!(0))).collect();
        let many = json!({ "roots": many });
        assert!(serde_json::to_vec(&many).expect("json").len() < super::MAX_CAPABILITY_BYTES);
        let refused = super::kept_capabilities(Some(&many)).expect_err("too many");
        assert!(
            refused.message.contains("too many values"),
            "{}",
            refused.message
        );
        let nested = json!({"elicitation": {"form": {}, "url": {}}, "sampling": {"tools": {}, "context": {}}});
        assert!(super::kept_capabilities(Some(&nested)).is_ok());
    }

    use super::*;

    #[tokio::test]
    async fn a_question_asked_after_the_client_went_away_fails_at_once() {
        let questions = Arc::new(Questions::default());
        let before = questions.ask(
            crate::protocol::RequestId::Number(1),
            "elicitation/create",
            json!({}),
            |_| true,
            |_| {},
        );
        // The input ended: nobody will answer.
        questions.clear();
        let mut sent = false;
        let after = questions.ask(
            crate::protocol::RequestId::Number(2),
            "elicitation/create",
            json!({}),
            |_| {
                sent = true;
                true
            },
            |_| {},
        );
        for (which, question) in [("before", before), ("after", after)] {
            let answer = tokio::time::timeout(Duration::from_secs(10), question)
                .await
                .unwrap_or_else(|_| panic!("the question asked {which} waited"));
            assert!(answer.is_err(), "{which}");
        }
        assert!(!sent, "nothing is put to a client that is gone");
    }

    // Resource URIs in a result that would route to another server are named by the
    // server that answered; others, and what is no resource, are left as they are.
    #[test]
    fn a_results_uris_that_read_as_another_servers_name_are_qualified() {
        let tool = json!({"content": [
            {"type": "resource_link", "uri": "bank__x", "name": "x"},
            {"type": "resource", "resource": {"uri": "bank__y", "text": "y"}},
            {"type": "resource_link", "uri": "file:///a__b"},
            {"type": "text", "text": "bank__z", "uri": "bank__z"},
        ]});
        let served = served_result(tool, "evil");
        assert_eq!(served["content"][0]["uri"], "evil__bank__x");
        assert_eq!(served["content"][1]["resource"]["uri"], "evil__bank__y");
        assert_eq!(served["content"][2]["uri"], "file:///a__b");
        assert_eq!(served["content"][3]["uri"], "bank__z", "no resource item");
        let prompt = json!({"messages": [{"role": "user", "content": {"type": "resource", "resource": {"uri": "bank__p"}}}]});
        let served = served_result(prompt, "evil");
        assert_eq!(
            served["messages"][0]["content"]["resource"]["uri"],
            "evil__bank__p"
        );
    }

    // Bodies are read as answers (charged to the answers' budget) one per question
    // waiting: a client with one question open does not have its every body counted so.
    #[tokio::test]
    async fn bodies_are_read_as_answers_one_per_question_waiting() {
        let questions = Arc::new(Questions::default());
        assert!(questions.reading_answer().is_none(), "no question");
        let _asked = questions.ask(
            crate::protocol::RequestId::Number(1),
            "elicitation/create",
            json!({}),
            |_| true,
            |_| {},
        );
        let first = questions.reading_answer();
        assert!(first.is_some());
        assert!(
            questions.reading_answer().is_none(),
            "one question, one answer"
        );
        drop(first);
        assert!(questions.reading_answer().is_some(), "read: room again");
    }

    /// A harness of `servers` where `agents` may use everything, and a gateway before it
    /// that lets each principal one request in flight.
    async fn one_at_a_time(
        servers: Vec<crate::ServerConfig>,
        agents: &[&str],
    ) -> (crate::HarnessHandle, Gateway) {
        let mut config = HarnessConfig {
            servers,
            ..HarnessConfig::default()
        };
        for agent in agents {
            config
                .permissions
                .entry((*agent).into())
                .or_default()
                .insert("*".into(), vec!["*".into()]);
        }
        let harness = crate::Harness::spawn(config.clone())
            .await
            .expect("harness");
        let sealer = Sealer::ephemeral(Duration::from_secs(60)).expect("sealer");
        let settings = GatewayConfig {
            max_in_flight_per_principal: 1,
            ..GatewayConfig::default()
        };
        let gateway = Gateway::new(harness.clone(), &config, settings, sealer)
            .await
            .expect("gateway");
        (harness, gateway)
    }

    // A config built in code is held to what a file's is: an "unlimited" in-flight
    // count failed every principal's first request in tokio's semaphore; a page size of
    // zero paged forever; a zero state_ttl issued states that could never come back.
    #[tokio::test]
    async fn a_gateway_config_built_in_code_is_checked_as_a_files_is() {
        let config = HarnessConfig::default();
        let harness = crate::Harness::spawn(config.clone())
            .await
            .expect("harness");
        let sealer = || Sealer::ephemeral(Duration::from_secs(60)).expect("sealer");
        let bad = [
            GatewayConfig {
                max_in_flight_per_principal: usize::MAX,
                ..GatewayConfig::default()
            },
            GatewayConfig {
                page_size: 0,
                ..GatewayConfig::default()
            },
            GatewayConfig {
                state_ttl: Duration::ZERO,
                ..GatewayConfig::default()
            },
        ];
        for settings in bad.clone() {
            let made = Gateway::new(harness.clone(), &config, settings, sealer()).await;
            assert!(matches!(made, Err(GatewayError::Config(_))));
        }
        let gateway = Gateway::new(harness.clone(), &config, GatewayConfig::default(), sealer())
            .await
            .expect("gateway");
        for settings in bad {
            let reloaded = gateway.reload(&config, settings, sealer()).await;
            assert!(matches!(reloaded, Err(GatewayError::Config(_))));
        }
        assert_eq!(
            gateway.config().page_size,
            GatewayConfig::default().page_size
        );
        harness.shutdown().await;
    }

    #[tokio::test]
    async fn a_refused_request_and_a_call_dropped_half_way_leave_no_limiter_behind() {
        // A server that never answers its handshake: a call to it waits in its queue.
        let servers = vec![crate::ServerConfig::stdio("s", "sleep", ["30"])];
        let (harness, gateway) = one_at_a_time(servers, &["a"]).await;
        let limiters = || gateway.inner.in_flight.lock().len();
        let principal = Principal {
            agent: "a".into(),
            context: None,
        };
        let request = |id| Request {
            id: crate::protocol::RequestId::Number(id),
            method: "tools/call".into(),
            params: Some(json!({
                "name": "s__echo",
                "arguments": {},
                "_meta": {
                    KEY_PROTOCOL_VERSION: MODERN,
                    KEY_CLIENT_CAPABILITIES: {},
                },
            })),
        };
        let call = {
            let (gateway, principal, request) = (gateway.clone(), principal.clone(), request(1));
            tokio::spawn(async move {
                let cancel = CancelToken::default();
                gateway
                    .handle(
                        &principal,
                        request,
                        Client::Modern { session: None },
                        cancel,
                        None,
                    )
                    .await
            })
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while limiters() == 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(limiters(), 1, "the call holds its principal's limiter");
        // A second request of the same principal is refused, and its refusal leaves the
        // limiter to the call that holds it.
        let refused = gateway
            .handle(
                &principal,
                request(2),
                Client::Modern { session: None },
                CancelToken::default(),
                None,
            )
            .await;
        let refused = refused.expect_err("one in flight at most");
        assert!(refused.message.contains("too many requests"), "{refused:?}");
        assert_eq!(limiters(), 1, "the refusal did not take the call's limiter");
        // Its client went away: the request's future is dropped where it waits.
        call.abort();
        let _ = call.await;
        assert_eq!(limiters(), 0, "nothing in flight, no limiter kept");
        harness.shutdown().await;
    }

    #[test]
    fn a_cancellation_that_overtakes_its_request_cancels_it_when_it_comes() {
        let mut calls = InFlight::<u64>::default();
        let running = CancelToken::new();
        let ticket = calls.insert(1, running.clone(), running.clone());
        calls.cancel_or_keep(1);
        assert!(running.is_cancelled(), "a request in flight is cancelled");
        calls.remove(&1, ticket);
        // Before its request: kept, and applied to it once, not to the next one.
        calls.cancel_or_keep(2);
        assert!(
            calls.is_empty(),
            "a kept cancellation is no request in flight"
        );
        let late = CancelToken::new();
        calls.insert(2, late.clone(), late.clone());
        assert!(late.is_cancelled(), "the request it overtook is cancelled");
        let other = CancelToken::new();
        calls.insert(3, other.clone(), other.clone());
        assert!(!other.is_cancelled(), "another id is not");
        // Bounded: the oldest go first.
        for id in 100..100 + EARLY_CANCELS as u64 + 1 {
            calls.cancel_or_keep(id);
        }
        let oldest = CancelToken::new();
        calls.insert(100, oldest.clone(), oldest.clone());
        assert!(!oldest.is_cancelled(), "the oldest was let go");
        let newest = CancelToken::new();
        calls.insert(100 + EARLY_CANCELS as u64, newest.clone(), newest.clone());
        assert!(newest.is_cancelled());
        assert!(calls.early.len() < EARLY_CANCELS);
        // As long as its request may lag behind (a slow body), and no longer.
        calls.early.clear();
        let lagging = Instant::now() - (EARLY_CANCEL_KEPT - Duration::from_secs(1));
        calls.early.push_back((6, lagging));
        let slow = CancelToken::new();
        calls.insert(6, slow.clone(), slow.clone());
        assert!(slow.is_cancelled(), "its body took long to come");
        calls.early.clear();
        calls
            .early
            .push_back((7, Instant::now() - EARLY_CANCEL_KEPT));
        let stale = CancelToken::new();
        calls.insert(7, stale.clone(), stale.clone());
        assert!(
            !stale.is_cancelled(),
            "a cancellation kept past its moment is let go"
        );
        assert!(calls.early.is_empty());
        // The session's end cancels the calls, not as their client: they are answered.
        let (by_client, call) = (CancelToken::new(), CancelToken::new());
        calls.insert(8, by_client.clone(), call.clone());
        calls.cancel_all();
        assert!(call.is_cancelled() && !by_client.is_cancelled());
    }

    #[tokio::test]
    async fn a_name_learned_for_a_header_check_takes_a_place_of_its_own_principal() {
        let (harness, gateway) = one_at_a_time(Vec::new(), &["a", "b"]).await;
        let who = |agent: &str| Principal {
            agent: agent.into(),
            context: None,
        };
        let (a, b) = (who("a"), who("b"));
        // Made up to look shortened: unknown here, so checking it means a listing.
        let made_up = format!("s__{}_0123456789abcdef", "x".repeat(44));
        assert!(names::looks_shortened(&made_up));
        let request = Request {
            id: crate::protocol::RequestId::Number(1),
            method: "tools/call".into(),
            params: Some(json!({
                "name": made_up,
                "arguments": {},
                "_meta": {
                    KEY_PROTOCOL_VERSION: MODERN,
                    KEY_CLIENT_CAPABILITIES: {},
                },
            })),
        };
        let check = |p: &Principal| {
            let (gateway, p, request) = (gateway.clone(), p.clone(), request.clone());
            async move {
                gateway
                    .check_param_headers(&p, &request, |_| None, true)
                    .await
            }
        };
        let held = gateway.in_flight_slot(&a, 1).expect("a's one place");
        let refused = check(&a).await.expect_err("a has no place to learn in");
        assert!(refused.message.contains("too many requests"), "{refused:?}");
        check(&b).await.expect("b learns in a place of its own");
        drop(held);
        check(&a).await.expect("a's place is free again");
        // A call learns in the place it holds: one at a time is enough.
        let answer = gateway
            .handle(
                &a,
                request.clone(),
                Client::Modern { session: None },
                CancelToken::default(),
                None,
            )
            .await;
        if let Err(e) = &answer {
            assert!(!e.message.contains("too many requests"), "{e:?}");
        }
        assert_eq!(gateway.inner.in_flight.lock().len(), 0, "no place kept");
        harness.shutdown().await;
    }

    #[test]
    fn allowed_hosts_are_host_names_without_ports() {
        for bad in [
            "gw.example:8443",
            "2001:db8::5",
            "",
            "gw.example/mcp",
            "[::1]:80",
        ] {
            let e =
                GatewayConfig::from_value(Some(json!({"allowed_hosts": [bad]}))).expect_err(bad);
            assert!(e.to_string().contains("allowed_hosts[0]"), "{bad}: {e}");
        }
        for good in ["gw.example", "10.0.0.5", "[2001:db8::5]"] {
            GatewayConfig::from_value(Some(json!({"allowed_hosts": [good]}))).expect(good);
        }
    }

    #[test]
    fn zero_durations_that_would_fail_every_round_or_write_are_refused() {
        for key in [
            "state_ttl",
            "write_timeout",
            "session_idle",
            "input_timeout",
        ] {
            let e = GatewayConfig::from_value(Some(json!({key: "0s"}))).expect_err(key);
            assert!(e.to_string().contains(&format!("gateway.{key}")), "{e}");
        }
    }

    #[test]
    fn a_gateway_setting_of_the_wrong_type_is_named_by_its_path() {
        let e = GatewayConfig::from_value(Some(json!({"max_streams": "many"})))
            .expect_err("not a number");
        assert!(e.to_string().contains("gateway.max_streams"), "{e}");
    }

    #[test]
    fn side_listener_tokens_must_be_hashes_and_are_not_quoted_back() {
        for list in ["admin_tokens", "metrics_tokens"] {
            let e = GatewayConfig::from_value(Some(json!({list: [{"sha256": "hunter2"}]})))
                .expect_err("not a hash");
            let shown = e.to_string();
            assert!(shown.contains(&format!("gateway.{list}[0].sha256")), "{e}");
            assert!(!shown.contains("hunter2"), "{e}");
        }
        let hash = crate::util::hash::sha256_hex(b"t");
        let ok = GatewayConfig::from_value(Some(json!({"metrics_tokens": [{"sha256": hash}]})))
            .expect("a hash");
        assert_eq!(ok.metrics_tokens.len(), 1);
    }

    #[test]
    fn a_reload_names_the_settings_it_does_not_apply() {
        let running = HarnessConfig::default();
        let mut next = running.clone();
        next.servers = vec![crate::ServerConfig::stdio("s", "cat", [""; 0])];
        next.permissions
            .entry("a".into())
            .or_default()
            .insert("*".into(), vec!["*".into()]);
        let gateway = GatewayConfig::default();
        let mut gateway_next = gateway.clone();
        gateway_next.page_size = 7;
        assert!(
            needs_restart(&running, &next, &gateway, &gateway_next, false).is_empty(),
            "all applied"
        );
        next.call_timeout = Duration::from_secs(1);
        next.audit.path = Some("/tmp/elsewhere.jsonl".into());
        gateway_next.max_streams = 1;
        assert_eq!(
            needs_restart(&running, &next, &gateway, &gateway_next, false),
            ["audit", "call_timeout", "gateway.max_streams"]
        );
        // Roots given first by a reload wait for a restart; changed ones do not.
        let mut next = running.clone();
        next.agents.entry("*".into()).or_default().roots = Some(vec!["file:///w".into()]);
        assert_eq!(
            needs_restart(&running, &next, &gateway, &gateway, false),
            ["agents' roots (none were given at start)"]
        );
        assert!(needs_restart(&running, &next, &gateway, &gateway, true).is_empty());
    }

    #[test]
    fn cursors_round_trip_and_garbage_is_refused() {
        assert_eq!(
            parse_cursor(&make_cursor(500, "0123456789abcdef")),
            Some((500, "0123456789abcdef".to_string()))
        );
        assert_eq!(parse_cursor("nope"), None);
        assert_eq!(parse_cursor(&"A".repeat(100)), None);
        assert_eq!(parse_cursor(&URL_SAFE_NO_PAD.encode("g2:-1:ab")), None);
        // The bare offsets of before name no listing.
        assert_eq!(parse_cursor(&URL_SAFE_NO_PAD.encode("g1:5")), None);
    }
}
