//! Errors of the transport layer and of one connection to one server.
//!
//! [`TransportError`] says what happened to the bytes; [`RequestError`] adds the
//! server's own answer (a JSON-RPC error, or a result that breaks the schema);
//! [`ConnectError`] covers era detection and the handshake. "Never sent"
//! ([`TransportError::never_sent`]) stays apart from "sent, no answer": only the first
//! is safe to re-send elsewhere. [`TransportError::cannot_heal`] says which failures no
//! restart can fix (a missing command, a bad certificate, a refused credential).

use std::time::Duration;

use super::exit::ExitStatus;
use crate::protocol::{ProtocolError, RpcError};

/// Why a server process could not be started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SpawnFailure {
    /// The command is not on `PATH` (or the path does not exist).
    NotFound,
    /// The command exists but is not executable by us.
    PermissionDenied,
    /// Anything else (out of processes, a bad working directory, …).
    Other,
}

/// What failed in a TLS connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TlsFailure {
    /// The certificate chain does not lead to a trusted root.
    UntrustedCertificate,
    /// The certificate is not valid for the server's host name.
    NameMismatch,
    /// The certificate has expired or is not valid yet.
    Expired,
    /// Any other handshake failure (protocol versions, ciphers, a bad message).
    Handshake,
}

impl TlsFailure {
    /// Words for people.
    pub fn as_str(self) -> &'static str {
        match self {
            TlsFailure::UntrustedCertificate => "certificate not trusted",
            TlsFailure::NameMismatch => "certificate does not match the host name",
            TlsFailure::Expired => "certificate expired or not yet valid",
            TlsFailure::Handshake => "TLS handshake failed",
        }
    }
}

/// What went wrong moving messages to or from one server.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The server process could not be started.
    #[error("could not start `{command}`: {reason}")]
    Spawn {
        /// The command as configured.
        command: String,
        /// What kind of failure.
        kind: SpawnFailure,
        /// The operating system's reason.
        reason: String,
    },
    /// The connection ended (process exit, stdout closed, stream broken); requests in
    /// flight on it get this at once.
    #[error("transport closed{}{}", exit.map(|e| format!(" ({e})")).unwrap_or_default(), detail.as_ref().map(|d| format!(": {d}")).unwrap_or_default())]
    Closed {
        /// How the process ended, when it did.
        exit: Option<ExitStatus>,
        /// More about how it ended (a read error, stdout held open by a descendant).
        detail: Option<String>,
    },
    /// The request was not written: the connection was already closed or refused.
    /// Safe to send elsewhere.
    #[error("request not sent: {0}")]
    NotSent(String),
    /// No answer within the request's deadline; the request was cancelled.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The server wrote a line longer than the configured limit.
    #[error("server wrote a line longer than {limit} bytes")]
    LineTooLong {
        /// The configured limit.
        limit: usize,
    },
    /// An HTTP reply larger than the configured limit.
    #[error("HTTP reply larger than {limit} bytes")]
    ResponseTooLarge {
        /// The configured limit.
        limit: usize,
    },
    /// HTTP 401 or 403: credentials are missing or not accepted.
    #[error("not authorized by the server (HTTP {status})")]
    Unauthorized {
        /// 401 or 403.
        status: u16,
        /// Its `WWW-Authenticate: Bearer` challenge, if it sent one.
        challenge: Option<crate::transport::auth::Challenge>,
    },
    /// Signing in failed (which server, which step, why).
    #[error(transparent)]
    Auth(#[from] crate::transport::auth::AuthError),
    /// The server answered with a redirect, which the harness never follows: the
    /// request's arguments and credentials would go wherever it points.
    #[error("the server redirected (HTTP {status}) to {location:?}; redirects are not followed")]
    Redirect {
        /// The 3xx status.
        status: u16,
        /// The `Location` header, as sent (possibly empty).
        location: String,
    },
    /// TLS could not be established.
    #[error("TLS: {}: {detail}", kind.as_str())]
    Tls {
        /// What failed.
        kind: TlsFailure,
        /// The TLS library's words.
        detail: String,
    },
    /// Any other HTTP status the request could not succeed with.
    #[error("HTTP {status}: {body}")]
    HttpStatus {
        /// The status code.
        status: u16,
        /// The start of the body, for the operator.
        body: String,
    },
    /// A legacy HTTP session the server no longer knows (404 with a session id).
    #[error("the server ended the HTTP session")]
    SessionExpired,
    /// A legacy HTTP session expired and the server would not begin it again as it was
    /// (it chose another version or refused the one asked for, refused the harness's
    /// sign-in, or began no session), or failed three renewals in a row: the
    /// connection is over, and the server's restart
    /// policy decides what follows (most often, connected anew).
    #[error("the HTTP session expired and the server would not begin it again: {0}")]
    SessionRefused(String),
    /// A network failure after the request may have been sent.
    #[error("network error: {0}")]
    Network(String),
    /// An HTTP reply that is neither JSON nor an event stream.
    #[error("unexpected content type {0:?}")]
    UnexpectedContentType(String),
    /// An SSE reply that ended before its response arrived.
    #[error("event stream ended before the response")]
    StreamEnded,
    /// The transport's configuration cannot work (a URL or header that does not parse);
    /// normally caught when the config is read.
    #[error("invalid transport configuration: {0}")]
    InvalidConfig(String),
    /// A message that breaks JSON-RPC or MCP, where the request needed it.
    #[error("protocol violation: {0}")]
    Protocol(#[from] ProtocolError),
}

impl TransportError {
    /// True when the connection this came from can serve no more requests although
    /// its server may be there: refused (an HTTP server that is down), or a legacy
    /// session that could not be begun again. Reported to the server's actor, whose
    /// restart policy then decides. (A stdio connection's end is seen by its reader.)
    pub fn ends_connection(&self) -> bool {
        matches!(
            self,
            TransportError::NotSent(_) | TransportError::SessionRefused(_)
        )
    }

    /// True when the request provably never reached the server.
    pub fn never_sent(&self) -> bool {
        matches!(
            self,
            TransportError::NotSent(_)
                // Its request was answered 404 on the old session, unread.
                | TransportError::SessionRefused(_)
                | TransportError::Spawn { .. }
                | TransportError::Tls { .. }
                | TransportError::InvalidConfig(_)
        )
    }

    /// True for failures that retrying cannot fix: the command is missing or not
    /// executable, the config is invalid, the certificate is refused, the credentials
    /// are refused (a sign-in that failed for want of its authorization server or
    /// token store, [`AuthError::transient`](crate::transport::auth::AuthError::transient),
    /// may heal).
    pub fn cannot_heal(&self) -> bool {
        match self {
            TransportError::Spawn { kind, .. } => *kind != SpawnFailure::Other,
            TransportError::Auth(e) => !e.transient(),
            TransportError::Tls { .. }
            | TransportError::InvalidConfig(_)
            | TransportError::Unauthorized { .. } => true,
            _ => false,
        }
    }
}

/// One request to a connected server, failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// The bytes did not make it, or no answer came.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The server answered with a JSON-RPC error.
    #[error("server error {0}")]
    Rpc(RpcError),
    /// The server answered with a result that breaks the schema.
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
}

/// Connecting to a server (spawn, era detection, handshake) failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The transport failed before the server could be identified.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// A modern server that speaks none of the versions this client offers.
    #[error("no common protocol version: server supports {server:?}, client offers {client:?}")]
    NoCommonVersion {
        /// `supportedVersions` (or -32022 `data.supported`).
        server: Vec<String>,
        /// The client's preferred versions.
        client: Vec<String>,
    },
    /// The server refused the probe with a modern error (-32020 or -32021), or refused
    /// the legacy `initialize`.
    #[error("server refused {method}: {error}")]
    Refused {
        /// `server/discover` or `initialize`.
        method: &'static str,
        /// The server's error.
        error: RpcError,
    },
    /// The server was configured as modern but did not answer `server/discover` as one.
    #[error("not a modern MCP server: {0}")]
    NotModern(String),
    /// A legacy server chose a version this client does not speak.
    #[error("legacy server chose unsupported protocol version {0:?}")]
    UnsupportedLegacyVersion(String),
    /// The discover or initialize result broke the schema.
    #[error("invalid handshake result: {0}")]
    Protocol(#[from] ProtocolError),
}

impl ConnectError {
    /// True when connecting again cannot succeed without a change of configuration.
    pub fn cannot_heal(&self) -> bool {
        match self {
            ConnectError::Transport(e) => e.cannot_heal(),
            ConnectError::NoCommonVersion { .. }
            | ConnectError::NotModern(_)
            | ConnectError::UnsupportedLegacyVersion(_) => true,
            // A modern server refusing `initialize` was taken for a legacy one: its
            // probe went unanswered in time (a slow start) or failed (a blip), and a
            // restart probes afresh. Refusing `server/discover` so is for good.
            ConnectError::Refused { method, error } => {
                *method == "server/discover" && error.is_modern()
            }
            ConnectError::Protocol(_) => false,
        }
    }
}

/// The TLS failure somewhere in `error`'s source chain, if there is one. rustls errors
/// arrive wrapped in `io::Error`s, whose `source()` skips what they wrap: descend through
/// `get_ref()` instead.
pub(crate) fn tls_failure(error: &(dyn std::error::Error + 'static)) -> Option<TransportError> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = next {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(classify(tls));
        }
        next = match e.downcast_ref::<std::io::Error>() {
            Some(io) => io
                .get_ref()
                .map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    None
}

fn classify(error: &rustls::Error) -> TransportError {
    use rustls::CertificateError as C;
    let kind = match error {
        rustls::Error::InvalidCertificate(c) => match c {
            C::UnknownIssuer | C::BadSignature | C::UnknownRevocationStatus => {
                TlsFailure::UntrustedCertificate
            }
            C::NotValidForName | C::NotValidForNameContext { .. } => TlsFailure::NameMismatch,
            C::Expired
            | C::ExpiredContext { .. }
            | C::NotValidYet
            | C::NotValidYetContext { .. } => TlsFailure::Expired,
            _ => TlsFailure::UntrustedCertificate,
        },
        _ => TlsFailure::Handshake,
    };
    TransportError::Tls {
        kind,
        // The certificate's names are in it as the server sent them.
        detail: crate::util::text::one_line(&error.to_string(), 300),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A TLS error names what the server's certificate holds: on one line, escaped and
    // cut short, whatever the certificate put there.
    #[test]
    fn a_tls_errors_detail_is_one_escaped_bounded_line() {
        let hostile = format!("bad\n\u{1b}[2J\u{202e}{}", "n".repeat(10_000));
        let TransportError::Tls { kind, detail } = classify(&rustls::Error::General(hostile))
        else {
            panic!("a TLS error");
        };
        assert_eq!(kind, TlsFailure::Handshake);
        assert!(
            !detail.contains('\n') && !detail.contains('\u{1b}'),
            "{detail:.100}"
        );
        assert!(!detail.contains('\u{202e}'), "{detail:.100}");
        // 300 characters of the text, each escape at most ten.
        assert!(detail.len() < 3_100, "{} bytes", detail.len());
        assert!(detail.ends_with('…'), "cut short");
    }
}
