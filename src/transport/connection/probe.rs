//! Era detection (spec section H): probe with `server/discover` and read the answer.
//!
//! A discover result sharing a version with us means modern; one listing a legacy
//! version and no modern one of ours means legacy, and one listing only modern versions
//! we do not speak is no common version. A -32022 naming one of our versions means
//! modern, probed again at that version; a -32022 naming the version we just sent is
//! retried once (some servers reject the first request of a stateless client whatever
//! it says), and only a second one means no common version. After a -32022, a transport
//! failure is an error (the server is modern: no falling back). -32020 and -32021 mean
//! modern and are errors. Anything else (another error, no answer in time, a 4xx, a
//! reply that is not JSON-RPC) means legacy; one that answered with an error is
//! [`Probe::Refused`], since it may exit after it (the handshake then respawns it). A
//! stdio server that dies on the probe is reported as [`Probe::Exited`]: it is
//! respawned for the handshake. For a server configured as modern, only what a legacy
//! server says (a method or request it does not know, a legacy version) fails for
//! good; a crash, another error or a 408 / 429 fails the start, which is tried again.

use std::time::Duration;

use serde_json::Value;

use super::handshake::{envelope, pick_version};
use super::options::ConnectOptions;
use crate::protocol::meta::is_modern_version;
use crate::protocol::{DiscoverResult, Request, RpcError, RpcErrorKind};
use crate::transport::Transport;
use crate::transport::error::{ConnectError, TransportError};
use crate::transport::inbound::Ids;

/// What the probe found.
pub(super) enum Probe {
    Modern {
        version: String,
        discover: DiscoverResult,
    },
    Legacy(String),
    /// No answer to the probe in time: legacy (many legacy servers ignore what they do
    /// not know), or a modern server slow to start.
    Silent(Duration),
    /// Legacy: the probe was answered with an error. A server that takes nothing
    /// before `initialize` may exit after it: a handshake that finds it gone respawns it.
    /// The error, when it says nothing of the era (not a method or request refused as
    /// unknown: an internal error, a server's own code), for a server configured as
    /// modern, which is then started again rather than given up.
    Refused(String, Option<RpcError>),
    /// The stdio process died on the probe: respawn, then `initialize` (or, for a
    /// server configured as modern, a crash like any other: started again).
    Exited(TransportError),
}

/// Where one probe round leads.
enum Next {
    Done(Probe),
    Again(String),
}

pub(super) async fn probe(
    transport: &Transport,
    ids: &Ids,
    options: &ConnectOptions,
) -> Result<Probe, ConnectError> {
    let Some(mut version) = options.preferred_versions.first().cloned() else {
        return Ok(Probe::Legacy("no modern version offered".into()));
    };
    let mut tried: Vec<String> = Vec::new();
    loop {
        let params = envelope(options, &version).stamp(None);
        let request = Request {
            id: ids.next(),
            method: "server/discover".into(),
            params: Some(params),
        };
        let answer = transport
            .request(
                (&request).into(),
                None,
                options.probe_timeout,
                None,
                &mut request.id.clone(),
            )
            .await;
        let next = match answer {
            Ok(Ok(result)) => Next::Done(discovered(&result, options)?),
            Ok(Err(error)) => rejected(error, &version, &tried, options)?,
            // A -32022 showed the server modern: no answer now is a failure, not a
            // legacy server (spec section H: do not fall back).
            Err(e) if !tried.is_empty() => return Err(ConnectError::Transport(e)),
            Err(e) => Next::Done(failed(e, transport.is_http())?),
        };
        match next {
            Next::Done(probe) => return Ok(probe),
            Next::Again(v) => {
                tried.push(version);
                version = v;
            }
        }
    }
}

/// Whether a discover result listing `versions` leaves no handshake: it lists only
/// modern ones. One that lists a legacy version beside modern ones we do not speak
/// takes `initialize` (spec section H, the Python SDK's rule).
fn only_modern(versions: &[String]) -> bool {
    !versions.is_empty() && versions.iter().all(|v| is_modern_version(v))
}

/// A discover result: modern at a common version, or legacy if it lists a legacy
/// version.
fn discovered(result: &Value, options: &ConnectOptions) -> Result<Probe, ConnectError> {
    let discover = match DiscoverResult::from_value(result) {
        Ok(d) => d,
        Err(e) => return Ok(Probe::Legacy(format!("discover result unreadable: {e}"))),
    };
    match pick_version(&options.preferred_versions, &discover.supported_versions) {
        Some(version) => Ok(Probe::Modern { version, discover }),
        None if only_modern(&discover.supported_versions) => Err(ConnectError::NoCommonVersion {
            server: quoted_versions(&discover.supported_versions),
            client: options.preferred_versions.clone(),
        }),
        None => Ok(Probe::Legacy(
            "discover lists no modern version of ours, and a legacy one".into(),
        )),
    }
}

/// A JSON-RPC error to the probe.
fn rejected(
    error: RpcError,
    sent: &str,
    tried: &[String],
    options: &ConnectOptions,
) -> Result<Next, ConnectError> {
    match error.kind() {
        RpcErrorKind::UnsupportedProtocolVersion { supported, .. } if !supported.is_empty() => {
            let repeated = tried.iter().any(|t| t == sent);
            if supported.iter().any(|v| v == sent) && !repeated {
                // It names the version we sent: one more try, under a new id.
                return Ok(Next::Again(sent.to_string()));
            }
            let next = options
                .preferred_versions
                .iter()
                .find(|v| supported.contains(v) && !tried.contains(v) && v.as_str() != sent);
            match next {
                Some(v) => Ok(Next::Again(v.clone())),
                // Spec section H: a -32022 means modern, and there is no falling back.
                None if supported.iter().any(|v| is_modern_version(v)) => {
                    Err(ConnectError::NoCommonVersion {
                        server: quoted_versions(&supported),
                        client: options.preferred_versions.clone(),
                    })
                }
                None => Ok(Next::Done(Probe::Refused(
                    "server supports only legacy versions".into(),
                    None,
                ))),
            }
        }
        _ if error.is_modern() => Err(ConnectError::Refused {
            method: "server/discover",
            error,
        }),
        _ => {
            let reason = format!("discover answered with {error}");
            // A method or request it does not know: what a legacy server says.
            let legacy = matches!(
                error.kind(),
                RpcErrorKind::MethodNotFound | RpcErrorKind::InvalidParams
            ) || error.code == crate::protocol::error::INVALID_REQUEST;
            Ok(Next::Done(Probe::Refused(
                reason,
                (!legacy).then_some(error),
            )))
        }
    }
}

/// A server's list of versions as an error quotes it: the first 10, each cut short
/// (the list is the server's, of any length).
fn quoted_versions(list: &[String]) -> Vec<String> {
    let mut quoted: Vec<String> = list
        .iter()
        .take(10)
        .map(|v| crate::util::text::one_line(v, 40))
        .collect();
    if list.len() > 10 {
        quoted.push(format!("… {} more", list.len() - 10));
    }
    quoted
}

/// A transport failure on the probe: legacy, an exit (stdio), or an error.
fn failed(error: TransportError, is_http: bool) -> Result<Probe, ConnectError> {
    match error {
        TransportError::Timeout(waited) => Ok(Probe::Silent(waited)),
        e @ (TransportError::Closed { .. } | TransportError::NotSent(_)) if !is_http => {
            Ok(Probe::Exited(e))
        }
        // 408 and 429 are "not now", not "not here": the start fails, and is tried again.
        TransportError::HttpStatus { status, .. }
            if (400..500).contains(&status) && status != 408 && status != 429 =>
        {
            Ok(Probe::Legacy(format!("discover answered HTTP {status}")))
        }
        TransportError::Protocol(e) => Ok(Probe::Legacy(format!("discover reply unreadable: {e}"))),
        TransportError::UnexpectedContentType(t) => Ok(Probe::Legacy(format!(
            "discover answered with content type {t:?}"
        ))),
        e => Err(ConnectError::Transport(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_discover_result_with_a_legacy_version_and_no_modern_one_of_ours_is_legacy() {
        let options = ConnectOptions::default();
        let result = |versions: &[&str]| serde_json::json!({"supportedVersions": versions, "capabilities": {}});
        let dual = discovered(&result(&["2099-01-01", "2025-11-25"]), &options);
        assert!(matches!(dual, Ok(Probe::Legacy(_))), "a dual-era server");
        let future = discovered(&result(&["2099-01-01"]), &options);
        assert!(
            matches!(future, Err(ConnectError::NoCommonVersion { .. })),
            "a modern-only server"
        );
        let ours = discovered(&result(&["2099-01-01", "2026-07-28"]), &options);
        assert!(matches!(ours, Ok(Probe::Modern { version, .. }) if version == "2026-07-28"));
    }
}
