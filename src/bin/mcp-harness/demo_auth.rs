//! `mcp-harness demo-auth-server`: an OAuth 2.1 authorization server for the demo and
//! the sign-in tests, on loopback (HTTPS with `--tls-cert`/`--tls-key`). It approves
//! without a person (as the user named by the `X-Demo-User` header, else `demo-user`),
//! and checks what a strict server checks: a known client and redirect URI, PKCE S256,
//! `state`, the same `resource` on both legs, the client's authentication method, codes
//! and refresh tokens used once (refresh tokens rotate). Knobs make it misbehave the
//! ways clients must notice: metadata at another well-known location, a wrong issuer,
//! no PKCE advertised, `iss` missing or wrong, scopes it will not grant, refreshes
//! answered late. `--record FILE` appends one JSON line per request (secrets as hashes).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::{Method, StatusCode};
use parking_lot::Mutex;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::demo_token::{self, Claims};
use crate::loopback::{self, HttpResponse, full};

/// Where the metadata is served (the spec's discovery variants).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MetadataAt {
    /// `/.well-known/oauth-authorization-server{path}`.
    Oauth,
    /// `/.well-known/openid-configuration{path}`.
    Openid,
    /// `{path}/.well-known/openid-configuration`.
    OpenidAppended,
}

/// What `--catch-all` answers other paths with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CatchAll {
    /// 200 with an HTML page.
    Html,
    /// 302 to a login page.
    Redirect,
}

/// How a refresh is refused, with `--refuse-refresh`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RefuseRefresh {
    /// The client that asks is forgotten first (a registration deleted or expired):
    /// `invalid_client`.
    ForgetClient,
    /// 503: the authorization server is down for a while.
    Unavailable,
    /// 200 with an error code of the server's own (`bad_refresh_token`, as GitHub).
    Nonstandard,
}

/// What `iss` the redirect back carries, and whether the metadata promises it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Iss {
    /// Promised and sent.
    Sent,
    /// Promised and missing.
    Missing,
    /// Promised, and another issuer's.
    Wrong,
    /// Not promised, not sent.
    None,
    /// Promised, and sent twice: another's, then the issuer's.
    Twice,
}

/// Command-line options of `mcp-harness demo-auth-server`.
#[derive(Clone, Debug, clap::Args)]
pub struct DemoAuthArgs {
    /// Listen on this loopback address; the first line on stdout is `listening URL`.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub http: String,
    /// Serve HTTPS with this PEM certificate chain (and `--tls-key`).
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key for `--tls-cert`.
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// The secret the demo server checks tokens with.
    #[arg(long)]
    pub secret: String,
    /// The issuer's path (`/tenant1`), after the origin.
    #[arg(long, default_value = "")]
    pub issuer_path: String,
    /// Where the metadata is served.
    #[arg(long, value_enum, default_value = "oauth")]
    pub metadata_at: MetadataAt,
    /// The metadata names another issuer (a client must refuse it).
    #[arg(long)]
    pub wrong_issuer: bool,
    /// Leave `code_challenge_methods_supported` out (a client must refuse).
    #[arg(long)]
    pub no_pkce: bool,
    /// A query the metadata's `authorization_endpoint` carries (`state=x`: a client
    /// must refuse it, as it sends its own).
    #[arg(long)]
    pub authorize_query: Option<String>,
    /// The `iss` of the redirect back.
    #[arg(long, value_enum, default_value = "sent")]
    pub iss: Iss,
    /// `token_endpoint_auth_methods_supported` (comma-separated); the method a client
    /// uses must be one of them.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "client_secret_basic,client_secret_post,none"
    )]
    pub auth_methods: Vec<String>,
    /// A pre-registered client, `ID` (public) or `ID:SECRET` (repeatable).
    #[arg(long)]
    pub client: Vec<String>,
    /// Offer Dynamic Client Registration at `/register`.
    #[arg(long)]
    pub registration: bool,
    /// Accept Client ID Metadata Documents (fetched over HTTPS, trusting `--ca-file`).
    #[arg(long)]
    pub cimd: bool,
    /// CA certificates for fetching metadata documents.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// `scopes_supported` (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "mcp:read,mcp:write,offline_access"
    )]
    pub scopes: Vec<String>,
    /// Scopes it never grants (a step-up for them fails).
    #[arg(long, value_delimiter = ',')]
    pub deny_scope: Vec<String>,
    /// Access tokens live this many seconds.
    #[arg(long, default_value_t = 3600)]
    pub token_ttl: u64,
    /// Say `expires_in: 0` in token replies, as some servers do for tokens that do not
    /// expire (the tokens live `token_ttl` all the same).
    #[arg(long)]
    pub expires_in_zero: bool,
    /// Answer a refresh this many milliseconds late, its refresh token already
    /// rotated (a slow authorization server, or a reply still on its way).
    #[arg(long, default_value_t = 0)]
    pub refresh_delay_ms: u64,
    /// Refuse every refresh, as this says.
    #[arg(long, value_enum)]
    pub refuse_refresh: Option<RefuseRefresh>,
    /// The first code exchange finds its client forgotten (the server restarted and
    /// lost its registrations): `invalid_client`.
    #[arg(long)]
    pub forget_client_at_exchange: bool,
    /// Answer refreshes 503 while this file exists (down for as long as a test says).
    #[arg(long)]
    pub refresh_unavailable_while: Option<PathBuf>,
    /// Answer a registration this many milliseconds late, its client already made.
    #[arg(long, default_value_t = 0)]
    pub register_delay_ms: u64,
    /// Answer GETs of every other path as a web app's catch-all would (instead of 404).
    #[arg(long, value_enum)]
    pub catch_all: Option<CatchAll>,
    /// Refuse every authorization (`access_denied`).
    #[arg(long)]
    pub deny: bool,
    /// Refuse an authorization that asks for this scope (`access_denied`: a person
    /// declining a step-up), repeatable.
    #[arg(long)]
    pub deny_asking: Vec<String>,
    /// Append every request to this file, one JSON line each.
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// Serve this file at `ISSUER/client-metadata.json` (a client's metadata document,
    /// hosted here for the tests).
    #[arg(long)]
    pub host_document: Option<PathBuf>,
}

struct Client {
    secret: Option<String>,
    redirect_uris: Vec<String>,
}

/// The most codes, refresh tokens or clients kept at once: a client that never
/// redeems, refreshes or comes back cannot grow this process without bound.
const MOST_KEPT: usize = 10_000;

/// How long a code can be redeemed (RFC 6749 section 4.1.2 advises at most 10 minutes).
const CODE_LIFETIME: Duration = Duration::from_secs(600);

/// The largest client metadata document read, and how long its fetch may take.
const MOST_DOCUMENT_BYTES: usize = 64 * 1024;
const DOCUMENT_TIMEOUT: Duration = Duration::from_secs(10);

struct Grant {
    /// When it was made: a code expires, and the oldest refresh token goes first.
    issued: Instant,
    client_id: String,
    redirect_uri: String,
    challenge: String,
    resource: String,
    scope: String,
    user: String,
}

struct State {
    args: DemoAuthArgs,
    issuer: String,
    clients: Mutex<HashMap<String, Client>>,
    codes: Mutex<HashMap<String, Grant>>,
    refresh: Mutex<HashMap<String, Grant>>,
    next: AtomicU64,
    /// `--forget-client-at-exchange` has been done.
    forgot_at_exchange: std::sync::atomic::AtomicBool,
    record: Option<Mutex<std::fs::File>>,
    fetch: reqwest::Client,
}

/// Keeps `grant` under `key` in `kept`: expired codes go first, then, past
/// [`MOST_KEPT`], the oldest grant.
fn keep(
    kept: &Mutex<HashMap<String, Grant>>,
    key: String,
    grant: Grant,
    lifetime: Option<Duration>,
) {
    let mut kept = kept.lock();
    if let Some(lifetime) = lifetime {
        kept.retain(|_, g| g.issued.elapsed() < lifetime);
    }
    if kept.len() >= MOST_KEPT
        && let Some(oldest) = kept
            .iter()
            .min_by_key(|(_, g)| g.issued)
            .map(|(k, _)| k.clone())
    {
        kept.remove(&oldest);
    }
    kept.insert(key, grant);
}

fn hash(s: &str) -> String {
    let digest = Sha256::digest(s.as_bytes());
    digest[..6].iter().map(|b| format!("{b:02x}")).collect()
}

impl State {
    fn record(&self, line: Value) {
        use std::io::Write;
        if let Some(f) = &self.record {
            let mut bytes = line.to_string().into_bytes();
            bytes.push(b'\n');
            let _ = f.lock().write_all(&bytes);
        }
    }

    fn fresh(&self) -> String {
        let mut buf = [0u8; 18];
        let _ = getrandom::fill(&mut buf);
        format!(
            "{}{}",
            self.next.fetch_add(1, Ordering::SeqCst),
            URL_SAFE_NO_PAD.encode(buf)
        )
    }
}

/// Runs the authorization server until stdin closes.
pub async fn run(args: DemoAuthArgs) -> anyhow::Result<()> {
    let tls = loopback::tls_acceptor(args.tls_cert.as_deref(), args.tls_key.as_deref())?;
    let (listener, base) =
        loopback::bind(&args.http, tls.is_some(), &args.issuer_path, false).await?;
    let mut clients = HashMap::new();
    for c in &args.client {
        let (id, secret) = match c.split_once(':') {
            Some((id, secret)) => (id.to_string(), Some(secret.to_string())),
            None => (c.clone(), None),
        };
        clients.insert(
            id,
            Client {
                secret,
                redirect_uris: Vec::new(),
            },
        );
    }
    let fetch_tls = mcp_harness::transport::auth::client_tls(args.ca_file.as_deref())
        .map_err(anyhow::Error::msg)?;
    let fetch = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .tls_backend_preconfigured(fetch_tls)
        .build()?;
    let record = match &args.record {
        Some(p) => Some(Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)?,
        )),
        None => None,
    };
    let state = Arc::new(State {
        issuer: format!("{base}{}", args.issuer_path),
        args,
        clients: Mutex::new(clients),
        codes: Mutex::default(),
        refresh: Mutex::default(),
        next: AtomicU64::new(1),
        forgot_at_exchange: std::sync::atomic::AtomicBool::new(false),
        record,
        fetch,
    });
    loopback::serve(listener, tls, move |req| handle(state.clone(), req)).await
}

fn json_reply(status: StatusCode, v: Value) -> HttpResponse {
    full(status, "application/json", v.to_string())
}

fn oauth_error(status: StatusCode, error: &str, description: &str) -> HttpResponse {
    json_reply(
        status,
        json!({"error": error, "error_description": description}),
    )
}

fn redirect(to: String) -> HttpResponse {
    let mut r = full(StatusCode::FOUND, "", "");
    if let Ok(v) = to.parse() {
        r.headers_mut().insert(hyper::header::LOCATION, v);
    }
    r
}

async fn handle(state: Arc<State>, req: hyper::Request<Incoming>) -> HttpResponse {
    let path = req.uri().path().to_string();
    let query: HashMap<String, String> = req
        .uri()
        .query()
        .map(|q| {
            url::form_urlencoded::parse(q.as_bytes())
                .into_owned()
                .collect()
        })
        .unwrap_or_default();
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(String::from)
    };
    let (authorization, user) = (header("authorization"), header("x-demo-user"));
    let method = req.method().clone();
    // Bounded as it is read: a check after reading it whole would come too late.
    let body = match Limited::new(req.into_body(), 1 << 20).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<LengthLimitError>() => {
            return full(StatusCode::PAYLOAD_TOO_LARGE, "", "");
        }
        Err(_) => return full(StatusCode::BAD_REQUEST, "", ""),
    };
    state.record(json!({
        "method": method.as_str(),
        "path": path,
        // A bearer token arriving here would be a client leaking it.
        "bearer": authorization.as_deref().is_some_and(|a| a.to_ascii_lowercase().starts_with("bearer ")),
    }));
    let ip = state.args.issuer_path.clone();
    let metadata_path = match state.args.metadata_at {
        MetadataAt::Oauth => format!("/.well-known/oauth-authorization-server{ip}"),
        MetadataAt::Openid => format!("/.well-known/openid-configuration{ip}"),
        MetadataAt::OpenidAppended => format!("{ip}/.well-known/openid-configuration"),
    };
    let at = |endpoint: &str| path == format!("{ip}/{endpoint}");
    match method {
        Method::GET if path == metadata_path => metadata(&state),
        Method::GET if at("authorize") => authorize(&state, &query, user.as_deref()).await,
        Method::GET if at("client-metadata.json") => match &state.args.host_document {
            Some(doc) => match std::fs::read(doc) {
                Ok(bytes) => full(StatusCode::OK, "application/json", bytes),
                Err(_) => full(StatusCode::NOT_FOUND, "", ""),
            },
            None => full(StatusCode::NOT_FOUND, "", ""),
        },
        Method::POST if at("token") => {
            let form: HashMap<String, String> =
                url::form_urlencoded::parse(&body).into_owned().collect();
            let reply = token(&state, &form, authorization.as_deref());
            if form.get("grant_type").is_some_and(|g| g == "refresh_token") {
                let delay = Duration::from_millis(state.args.refresh_delay_ms);
                tokio::time::sleep(delay).await;
            }
            reply
        }
        Method::POST if at("register") && state.args.registration => {
            let reply = register(&state, &body);
            let delay = Duration::from_millis(state.args.register_delay_ms);
            tokio::time::sleep(delay).await;
            reply
        }
        // A web app's catch-all: every other page is its HTML, or a redirect to its
        // login page.
        Method::GET if state.args.catch_all == Some(CatchAll::Html) => full(
            StatusCode::OK,
            "text/html",
            "<!doctype html><title>app</title>",
        ),
        Method::GET if state.args.catch_all == Some(CatchAll::Redirect) => {
            let mut r = full(StatusCode::FOUND, "", "");
            if let Ok(v) = "/login".parse() {
                r.headers_mut().insert(hyper::header::LOCATION, v);
            }
            r
        }
        _ => full(StatusCode::NOT_FOUND, "", ""),
    }
}

fn metadata(state: &State) -> HttpResponse {
    let a = &state.args;
    let issuer = if a.wrong_issuer {
        "https://honest.example".to_string()
    } else {
        state.issuer.clone()
    };
    let mut m = json!({
        "issuer": issuer,
        "authorization_endpoint": match &a.authorize_query {
            Some(q) => format!("{}/authorize?{q}", state.issuer),
            None => format!("{}/authorize", state.issuer),
        },
        "token_endpoint": format!("{}/token", state.issuer),
        "response_types_supported": ["code"],
        "grant_types_supported": ["authorization_code", "refresh_token", "client_credentials"],
        "scopes_supported": a.scopes,
        "token_endpoint_auth_methods_supported": a.auth_methods,
        "client_id_metadata_document_supported": a.cimd,
        "authorization_response_iss_parameter_supported": matches!(a.iss, Iss::Sent | Iss::Missing | Iss::Wrong | Iss::Twice),
    });
    if !a.no_pkce {
        m["code_challenge_methods_supported"] = json!(["S256"]);
    }
    if a.registration {
        m["registration_endpoint"] = json!(format!("{}/register", state.issuer));
    }
    json_reply(StatusCode::OK, m)
}

/// The redirect URIs a client may use: registered ones, any loopback one for a
/// pre-registered client (RFC 8252), or those its metadata document lists.
async fn client_redirects(state: &State, client_id: &str) -> Option<Vec<String>> {
    if let Some(c) = state.clients.lock().get(client_id) {
        return Some(c.redirect_uris.clone());
    }
    if !(state.args.cimd && client_id.starts_with("https://")) {
        return None;
    }
    let mut response = state
        .fetch
        .get(client_id)
        .timeout(DOCUMENT_TIMEOUT)
        .send()
        .await
        .ok()?;
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await.ok()? {
        if bytes.len() + chunk.len() > MOST_DOCUMENT_BYTES {
            return None;
        }
        bytes.extend_from_slice(&chunk);
    }
    let doc: Value = serde_json::from_slice(&bytes).ok()?;
    state.record(json!({"event": "fetched client metadata document", "client_id": client_id}));
    if doc["client_id"] != client_id {
        return None;
    }
    let uris: Vec<String> = doc["redirect_uris"]
        .as_array()?
        .iter()
        .filter_map(|u| u.as_str().map(String::from))
        .collect();
    let mut clients = state.clients.lock();
    // Past the bound it is fetched again each time instead of kept.
    if clients.len() < MOST_KEPT {
        clients.insert(
            client_id.to_string(),
            Client {
                secret: None,
                redirect_uris: uris.clone(),
            },
        );
    }
    drop(clients);
    Some(uris)
}

/// A plain `http://127.0.0.1` redirect URI's path and query, which must match a
/// registered one's (RFC 8252 lets the port vary); `None` for any other URI. Parsed, not
/// read by prefix: `http://127.0.0.1:80@evil.example/` names the host `evil.example`.
fn loopback_redirect(uri: &str) -> Option<String> {
    let u = url::Url::parse(uri).ok()?;
    let plain = u.scheme() == "http"
        && u.host_str() == Some("127.0.0.1")
        && u.username().is_empty()
        && u.password().is_none()
        && u.fragment().is_none();
    plain.then(|| format!("{}?{}", u.path(), u.query().unwrap_or_default()))
}

/// Whether `redirect_uri` is one that a client with the `allowed` URIs may use:
/// registered ones match exactly, or as loopback ones on any port; a client with none
/// registered (pre-registered) may use any loopback one.
fn redirect_allowed(allowed: &[String], redirect_uri: &str) -> bool {
    let asked = loopback_redirect(redirect_uri);
    if allowed.is_empty() {
        return asked.is_some();
    }
    allowed
        .iter()
        .any(|u| u == redirect_uri || (asked.is_some() && loopback_redirect(u) == asked))
}

async fn authorize(state: &State, q: &HashMap<String, String>, user: Option<&str>) -> HttpResponse {
    let get = |k: &str| q.get(k).cloned().unwrap_or_default();
    let (client_id, redirect_uri) = (get("client_id"), get("redirect_uri"));
    state.record(json!({
        "endpoint": "authorize",
        "client_id": client_id,
        "redirect_uri": redirect_uri,
        "resource": get("resource"),
        "scope": get("scope"),
        "code_challenge_method": get("code_challenge_method"),
        "state": !get("state").is_empty(),
    }));
    let Some(allowed) = client_redirects(state, &client_id).await else {
        return oauth_error(StatusCode::BAD_REQUEST, "invalid_client", "unknown client");
    };
    if !redirect_allowed(&allowed, &redirect_uri) {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "redirect_uri not registered",
        );
    }
    if get("response_type") != "code"
        || get("code_challenge_method") != "S256"
        || get("code_challenge").is_empty()
        || get("state").is_empty()
        || get("resource").is_empty()
    {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "code, S256 PKCE, state and resource are required",
        );
    }
    let iss = match state.args.iss {
        Iss::Sent | Iss::Twice => Some(state.issuer.clone()),
        Iss::Wrong => Some(format!("{}/", state.issuer)),
        Iss::Missing | Iss::None => None,
    };
    let mut back = match url::Url::parse(&redirect_uri) {
        Ok(u) => u,
        Err(_) => {
            return oauth_error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "bad redirect_uri",
            );
        }
    };
    {
        let mut pairs = back.query_pairs_mut();
        let declined = get("scope")
            .split_whitespace()
            .any(|s| state.args.deny_asking.iter().any(|d| d == s));
        if state.args.deny || declined {
            pairs.append_pair("error", "access_denied");
        } else {
            let code = state.fresh();
            let asked = get("scope");
            let granted: Vec<&str> = asked
                .split_whitespace()
                .filter(|s| !state.args.deny_scope.iter().any(|d| d == s))
                .collect();
            keep(
                &state.codes,
                code.clone(),
                Grant {
                    issued: Instant::now(),
                    client_id: client_id.clone(),
                    redirect_uri: redirect_uri.clone(),
                    challenge: get("code_challenge"),
                    resource: get("resource"),
                    scope: granted.join(" "),
                    user: user.unwrap_or("demo-user").to_string(),
                },
                Some(CODE_LIFETIME),
            );
            pairs.append_pair("code", &code);
        }
        pairs.append_pair("state", &get("state"));
        if matches!(state.args.iss, Iss::Twice) {
            pairs.append_pair("iss", &format!("{}/", state.issuer));
        }
        if let Some(iss) = &iss {
            pairs.append_pair("iss", iss);
        }
    }
    redirect(back.to_string())
}

/// Which client authenticated, and how; why not, when it did not.
fn client_auth(
    state: &State,
    form: &HashMap<String, String>,
    authorization: Option<&str>,
) -> Result<(String, &'static str), String> {
    let invalid = |why: &str| Err(why.to_string());
    let (id, secret, method) =
        if let Some(basic) = authorization.and_then(|a| a.strip_prefix("Basic ")) {
            let decoded = STANDARD
                .decode(basic)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .unwrap_or_default();
            let Some((id, secret)) = decoded.split_once(':') else {
                return invalid("malformed Basic credentials");
            };
            let dec = |s: &str| {
                url::form_urlencoded::parse(format!("x={s}").as_bytes())
                    .next()
                    .map(|(_, v)| v.into_owned())
                    .unwrap_or_default()
            };
            (dec(id), Some(dec(secret)), "client_secret_basic")
        } else if let Some(secret) = form.get("client_secret") {
            (
                form.get("client_id").cloned().unwrap_or_default(),
                Some(secret.clone()),
                "client_secret_post",
            )
        } else {
            (
                form.get("client_id").cloned().unwrap_or_default(),
                None,
                "none",
            )
        };
    if !state.args.auth_methods.iter().any(|m| m == method) {
        return invalid(&format!("{method} is not an allowed authentication method"));
    }
    let clients = state.clients.lock();
    let Some(client) = clients.get(&id) else {
        return invalid("unknown client");
    };
    if client.secret != secret {
        return invalid("wrong client credentials");
    }
    Ok((id, method))
}

fn mint(state: &State, grant: &Grant, with_refresh: bool) -> HttpResponse {
    let claims = Claims {
        sub: grant.user.clone(),
        aud: grant.resource.clone(),
        iss: state.issuer.clone(),
        scope: grant.scope.clone(),
        exp: demo_token::now() + state.args.token_ttl,
        jti: state.fresh(),
    };
    let mut reply = json!({
        "access_token": demo_token::issue(&state.args.secret, &claims),
        "token_type": "Bearer",
        "expires_in": if state.args.expires_in_zero { 0 } else { state.args.token_ttl },
        "scope": grant.scope,
    });
    if with_refresh {
        let refresh = state.fresh();
        keep(
            &state.refresh,
            refresh.clone(),
            Grant {
                issued: Instant::now(),
                client_id: grant.client_id.clone(),
                redirect_uri: grant.redirect_uri.clone(),
                challenge: String::new(),
                resource: grant.resource.clone(),
                scope: grant.scope.clone(),
                user: grant.user.clone(),
            },
            None,
        );
        reply["refresh_token"] = json!(refresh);
    }
    json_reply(StatusCode::OK, reply)
}

fn token(
    state: &State,
    form: &HashMap<String, String>,
    authorization: Option<&str>,
) -> HttpResponse {
    let get = |k: &str| form.get(k).cloned().unwrap_or_default();
    let grant_type = get("grant_type");
    let auth = client_auth(state, form, authorization);
    state.record(json!({
        "endpoint": "token",
        "grant_type": grant_type,
        "client_auth": auth.as_ref().map(|(_, m)| *m).unwrap_or("refused"),
        "resource": get("resource"),
        "scope": get("scope"),
        "code_verifier": !get("code_verifier").is_empty(),
        "refresh_token": form.get("refresh_token").map(|r| hash(r)),
    }));
    if grant_type == "refresh_token"
        && state
            .args
            .refresh_unavailable_while
            .as_ref()
            .is_some_and(|f| f.exists())
    {
        return oauth_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "temporarily_unavailable",
            "down",
        );
    }
    if grant_type == "refresh_token" {
        match state.args.refuse_refresh {
            Some(RefuseRefresh::ForgetClient) => {
                if let Ok((id, _)) = &auth {
                    state.clients.lock().remove(id);
                }
                return oauth_error(StatusCode::UNAUTHORIZED, "invalid_client", "unknown client");
            }
            Some(RefuseRefresh::Unavailable) => {
                return oauth_error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "temporarily_unavailable",
                    "down",
                );
            }
            Some(RefuseRefresh::Nonstandard) => {
                return oauth_error(StatusCode::OK, "bad_refresh_token", "expired");
            }
            None => {}
        }
    }
    let (client_id, _) = match auth {
        Ok(a) => a,
        Err(why) => return oauth_error(StatusCode::UNAUTHORIZED, "invalid_client", &why),
    };
    let bad_grant = |why: &str| oauth_error(StatusCode::BAD_REQUEST, "invalid_grant", why);
    match grant_type.as_str() {
        "authorization_code"
            if state.args.forget_client_at_exchange
                && !state.forgot_at_exchange.swap(true, Ordering::SeqCst) =>
        {
            state.clients.lock().remove(&client_id);
            oauth_error(StatusCode::UNAUTHORIZED, "invalid_client", "unknown client")
        }
        "authorization_code" => {
            let Some(grant) = state.codes.lock().remove(&get("code")) else {
                return bad_grant("unknown or used code");
            };
            if grant.issued.elapsed() >= CODE_LIFETIME {
                return bad_grant("expired code");
            }
            let verifier = get("code_verifier");
            let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
            if challenge != grant.challenge {
                return bad_grant("PKCE verification failed");
            }
            if grant.client_id != client_id || grant.redirect_uri != get("redirect_uri") {
                return bad_grant("client or redirect_uri differ from the authorization");
            }
            if grant.resource != get("resource") {
                return oauth_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_target",
                    "resource differs from the authorization",
                );
            }
            let offline = grant
                .scope
                .split_whitespace()
                .any(|s| s == "offline_access");
            mint(state, &grant, offline)
        }
        "refresh_token" => {
            // Used once: rotated on every refresh.
            let Some(grant) = state.refresh.lock().remove(&get("refresh_token")) else {
                return bad_grant("unknown or used refresh token");
            };
            if grant.client_id != client_id || grant.resource != get("resource") {
                return bad_grant("client or resource differ");
            }
            mint(state, &grant, true)
        }
        "client_credentials" => {
            let scope: Vec<String> = get("scope")
                .split_whitespace()
                .filter(|s| !state.args.deny_scope.iter().any(|d| d == s))
                .map(String::from)
                .collect();
            let grant = Grant {
                issued: Instant::now(),
                client_id: client_id.clone(),
                redirect_uri: String::new(),
                challenge: String::new(),
                resource: get("resource"),
                scope: scope.join(" "),
                user: client_id,
            };
            mint(state, &grant, false)
        }
        _ => oauth_error(
            StatusCode::BAD_REQUEST,
            "unsupported_grant_type",
            "unsupported grant",
        ),
    }
}

fn register(state: &State, body: &[u8]) -> HttpResponse {
    let Ok(request) = serde_json::from_slice::<Value>(body) else {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_client_metadata",
            "not JSON",
        );
    };
    let uris: Vec<String> = request["redirect_uris"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|u| u.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let method = request["token_endpoint_auth_method"]
        .as_str()
        .unwrap_or("client_secret_basic");
    state.record(json!({
        "endpoint": "register",
        "redirect_uris": uris,
        "application_type": request["application_type"],
        "scope": request["scope"],
        "token_endpoint_auth_method": method,
    }));
    if uris.is_empty() {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_redirect_uri",
            "redirect_uris required",
        );
    }
    if state.clients.lock().len() >= MOST_KEPT {
        return oauth_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "temporarily_unavailable",
            "too many clients registered",
        );
    }
    let id = format!("dyn-{}", state.fresh());
    let secret = (method != "none").then(|| state.fresh());
    state.clients.lock().insert(
        id.clone(),
        Client {
            secret: secret.clone(),
            redirect_uris: uris.clone(),
        },
    );
    let mut reply =
        json!({"client_id": id, "redirect_uris": uris, "token_endpoint_auth_method": method});
    if let Some(s) = secret {
        reply["client_secret"] = json!(s);
        reply["client_secret_expires_at"] = json!(0);
    }
    json_reply(StatusCode::CREATED, reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redirect_uri_is_loopback_only_when_its_host_is() {
        let registered = vec!["http://127.0.0.1:5555/callback".to_string()];
        assert!(redirect_allowed(
            &registered,
            "http://127.0.0.1:5555/callback"
        ));
        assert!(redirect_allowed(
            &registered,
            "http://127.0.0.1:6000/callback"
        ));
        assert!(!redirect_allowed(
            &registered,
            "http://127.0.0.1:6000/other"
        ));
        assert!(!redirect_allowed(
            &registered,
            "http://127.0.0.1:6000/callback?x=1"
        ));
        for hostile in [
            "http://127.0.0.1:80@evil.example/callback",
            "http://127.0.0.1@evil.example/callback",
            "http://127.0.0.1.evil.example/callback",
            "https://127.0.0.1:6000/callback",
            "http://127.0.0.1:6000/callback#frag",
        ] {
            assert!(!redirect_allowed(&registered, hostile), "{hostile}");
            assert!(!redirect_allowed(&[], hostile), "{hostile}");
        }
        assert!(redirect_allowed(&[], "http://127.0.0.1:7000/anything"));
        let web = vec!["https://app.example/cb".to_string()];
        assert!(redirect_allowed(&web, "https://app.example/cb"));
        assert!(!redirect_allowed(&web, "http://127.0.0.1:7000/cb"));
    }
}
