//! The legacy handshake (`initialize`, then `notifications/initialized`), and the
//! envelope and version choice both eras start from.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::options::ConnectOptions;
use crate::protocol::meta::{LEGACY_2025_11_25, LEGACY_VERSIONS};
use crate::protocol::views::InitializeResult;
use crate::protocol::{MetaEnvelope, Notification, Request};
use crate::transport::Transport;
use crate::transport::error::ConnectError;
use crate::transport::inbound::{Ids, Inbound, Queued};

/// The `_meta` envelope for `version` with the options' capabilities and identity.
pub(super) fn envelope(options: &ConnectOptions, version: &str) -> MetaEnvelope {
    MetaEnvelope::new(
        version,
        options.capabilities.clone(),
        serde_json::to_value(&options.client_info).unwrap_or(Value::Null),
    )
}

/// The first of our preferred versions the server supports.
pub(super) fn pick_version(preferred: &[String], supported: &[String]) -> Option<String> {
    preferred.iter().find(|v| supported.contains(v)).cloned()
}

/// Runs the legacy handshake: `initialize` with our capabilities, its reply checked,
/// `notifications/initialized`.
pub(super) async fn initialize(
    transport: &Transport,
    ids: &Ids,
    options: &ConnectOptions,
) -> Result<InitializeResult, ConnectError> {
    let params = json!({
        "protocolVersion": LEGACY_2025_11_25,
        "capabilities": options.capabilities,
        "clientInfo": options.client_info,
    });
    let request = Request {
        id: ids.next(),
        method: "initialize".into(),
        params: Some(params.clone()),
    };
    let result = match transport
        .request(
            (&request).into(),
            None,
            options.request_timeout,
            None,
            &mut request.id.clone(),
        )
        .await?
    {
        Ok(result) => InitializeResult::from_value(&result)?,
        Err(error) => {
            return Err(ConnectError::Refused {
                method: "initialize",
                error,
            });
        }
    };
    if !LEGACY_VERSIONS.contains(&result.protocol_version.as_str()) {
        return Err(ConnectError::UnsupportedLegacyVersion(
            crate::util::text::one_line(&result.protocol_version, 40),
        ));
    }
    let initialized = Notification {
        method: "notifications/initialized".into(),
        params: None,
    };
    transport.set_session_version(&result.protocol_version);
    transport
        .notify(initialized, options.request_timeout)
        .await?;
    transport.begin_legacy_session(&result.protocol_version, params);
    Ok(result)
}

/// Answers to pings during a handshake being sent at once.
const PING_ANSWERS: usize = 4;

/// Runs `handshake` while answering the server's pings. A legacy server may ping before
/// `initialized` (the one request the protocol lets it send then) and wait for the
/// answer before it replies to `initialize`; unanswered until the dispatcher starts, it
/// would hang the handshake to its timeout. Everything else the server sends meanwhile
/// is held, in order, for the dispatcher: at most `limit` messages, past which the rest
/// are dropped (a request told the client is busy), while pings are still answered: a
/// server that talks a lot before pinging is not left waiting for its answer.
pub(super) async fn answering_pings<T>(
    transport: &std::sync::Arc<Transport>,
    inbound: &mut mpsc::Receiver<Queued>,
    held: &mut Vec<Queued>,
    limit: usize,
    timeout: Duration,
    handshake: impl Future<Output = T>,
) -> T {
    let mut handshake = std::pin::pin!(handshake);
    let answers = std::sync::Arc::new(tokio::sync::Semaphore::new(PING_ANSWERS));
    // Refusals apart: a flood of them must not take the places of the pings' answers.
    let refusals = std::sync::Arc::new(tokio::sync::Semaphore::new(PING_ANSWERS));
    loop {
        tokio::select! {
            biased;
            done = &mut handshake => return done,
            Some(queued) = inbound.recv() => {
                let (id, answer, identity, places) = match queued.message {
                    Inbound::Request(ping, via) if ping.method == "ping" => {
                        (ping.id, Ok(json!({})), via.identity, &answers)
                    }
                    _ if held.len() < limit => {
                        held.push(queued);
                        continue;
                    }
                    Inbound::Request(request, via) => (
                        request.id,
                        Err(crate::transport::inbound::busy()),
                        via.identity,
                        &refusals,
                    ),
                    _ => continue,
                };
                // On a task of its own: an answer an HTTP server is slow to take must
                // not stop the handshake reading its reply meanwhile. A few at once at
                // most; a flood's others go unanswered.
                let Ok(permit) = places.clone().try_acquire_owned() else {
                    continue;
                };
                let transport = std::sync::Arc::downgrade(transport);
                tokio::spawn(async move {
                    if let Some(t) = transport.upgrade() {
                        let _ = t.respond(id, answer, timeout, identity.as_deref()).await;
                    }
                    drop(permit);
                });
            }
        }
    }
}
