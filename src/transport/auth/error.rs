//! Sign-in failures, each naming the server and the step, so that a person can act.

/// The step of a sign-in that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthStep {
    /// Reading the server's protected resource metadata (RFC 9728).
    ResourceMetadata,
    /// Reading the authorization server's metadata (RFC 8414 / OpenID discovery).
    ServerMetadata,
    /// Getting a client identity (pre-registered, metadata document, or registration).
    Registration,
    /// The person's authorization (the redirect back).
    Authorization,
    /// Exchanging the code for tokens.
    Token,
    /// Refreshing a token.
    Refresh,
    /// The client-credentials grant.
    ClientCredentials,
    /// Asking for more scope after a 403.
    StepUp,
}

impl AuthStep {
    fn as_str(self) -> &'static str {
        match self {
            AuthStep::ResourceMetadata => "reading the protected resource metadata",
            AuthStep::ServerMetadata => "reading the authorization server metadata",
            AuthStep::Registration => "getting a client identity",
            AuthStep::Authorization => "the authorization",
            AuthStep::Token => "the token request",
            AuthStep::Refresh => "refreshing the token",
            AuthStep::ClientCredentials => "the client-credentials grant",
            AuthStep::StepUp => "asking for more scope",
        }
    }
}

impl std::fmt::Display for AuthStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What went wrong.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthFailure {
    /// No metadata at any of the places the spec names.
    #[error("no metadata found (tried {tried:?})")]
    NotFound {
        /// The URLs tried, in order.
        tried: Vec<String>,
    },
    /// The metadata's `issuer` is not the one it was looked up for.
    #[error("issuer mismatch: expected {expected:?}, the metadata says {found:?}")]
    IssuerMismatch {
        /// The issuer the metadata was fetched for.
        expected: String,
        /// What it says.
        found: String,
    },
    /// The protected resource metadata names another resource than this server.
    #[error("the metadata is for resource {found:?}, not this server ({expected:?})")]
    ResourceMismatch {
        /// This server's URL.
        expected: String,
        /// The `resource` it names.
        found: String,
    },
    /// The authorization server does not offer what MCP requires (PKCE S256, `code`).
    #[error("unsupported authorization server: {0}")]
    Unsupported(String),
    /// A URL that must not be used (not HTTPS, another origin, malformed).
    #[error("refused URL {url:?}: {why}")]
    BadUrl {
        /// The URL.
        url: String,
        /// Why.
        why: String,
    },
    /// The authorization server said no (an OAuth `error` code).
    #[error("refused: {error}{}", description.as_deref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Refused {
        /// The OAuth `error` code (`invalid_grant`, `access_denied`, …).
        error: String,
        /// Its `error_description`.
        description: Option<String>,
    },
    /// The redirect back is not the one this sign-in started (`state`), or its `iss` is
    /// missing or wrong (RFC 9207): it is not acted on.
    #[error("rejected the redirect back: {0}")]
    BadRedirect(String),
    /// No way to get a client identity: nothing configured, no metadata document
    /// support, no registration endpoint.
    #[error(
        "no client identity: configure client_id, or client_metadata_url, or use an authorization server that supports registration"
    )]
    NoClientIdentity,
    /// The sign-in needs a person and nobody was asked (no authorizer).
    #[error(
        "sign-in needed and no authorizer is set: run `mcp-harness login {0}`, or give the harness an Authorizer"
    )]
    NeedsPerson(String),
    /// A step-up asked for more scope more times than allowed.
    #[error("still insufficient scope after {0} attempts")]
    ScopeRetriesExhausted(usize),
    /// The person (or the authorizer) did not finish in time.
    #[error("not finished within {0:?}")]
    Timeout(std::time::Duration),
    /// An HTTP status where success was expected.
    #[error("HTTP {status}: {body}")]
    Http {
        /// The status.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// The request could not be made.
    #[error("network: {0}")]
    Network(String),
    /// A reply that does not say what it must.
    #[error("invalid reply: {0}")]
    Invalid(String),
    /// The token store failed.
    #[error("token store: {0}")]
    Store(String),
    /// The authorizer failed.
    #[error("authorizer: {0}")]
    Authorizer(String),
    /// Signed out (`logout`) while a refresh was under way: the token it got is
    /// dropped, not stored back.
    #[error("signed out while the token was refreshed")]
    SignedOut,
}

/// A sign-in failure: which server, which step, what.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{}signing in to server {server} failed at {step}: {failure}", refused.map(|s| format!("HTTP {s}, and ")).unwrap_or_default())]
pub struct AuthError {
    /// The server.
    pub server: String,
    /// The step.
    pub step: AuthStep,
    /// What.
    pub failure: AuthFailure,
    /// The HTTP status that started the sign-in (401 or 403), if a refusal did.
    pub refused: Option<u16>,
}

impl AuthError {
    /// Whether the server has no protected resource metadata at all.
    pub fn is_not_found(&self) -> bool {
        self.step == AuthStep::ResourceMetadata
            && matches!(self.failure, AuthFailure::NotFound { .. })
    }

    /// Whether trying again later may succeed with nothing changed: the authorization
    /// server could not be reached, was overloaded or failed (a 5xx, 408 or 429, or
    /// the OAuth error `temporarily_unavailable` or `server_error`), or the token store
    /// could not be read or written. A server's reconnect that fails
    /// so is restarted with backoff, not given up.
    pub fn transient(&self) -> bool {
        match &self.failure {
            AuthFailure::Network(_) | AuthFailure::Store(_) => true,
            // RFC 6749's codes for a server that is down or failed, not one that said no.
            AuthFailure::Refused { error, .. } => {
                error == "temporarily_unavailable" || error == "server_error"
            }
            AuthFailure::Http { status, .. } => *status >= 500 || *status == 408 || *status == 429,
            _ => false,
        }
    }

    /// Whether signing in again from the start could help (the CLI then says to run
    /// `mcp-harness login SERVER`).
    pub fn needs_login(&self) -> bool {
        matches!(
            self.failure,
            AuthFailure::NeedsPerson(_)
                | AuthFailure::SignedOut
                | AuthFailure::Refused { .. }
                | AuthFailure::BadRedirect(_)
                | AuthFailure::Timeout(_)
        )
    }
}
