//! A stdio server that answers nothing is restarted, not left `ready`: a request that
//! timed out while the server wrote not one line (a deadlock, a process stopped) is
//! followed by a probe (`ping`, or a modern server's `server/discover`), and a server
//! silent through that too is killed, so that its supervisor restarts it with its
//! backoff. A server slow at one tool still answers the probe, and is left alone; one
//! that reads one request at a time has its timeout again (ten seconds at least) to
//! finish the call its caller gave up on, and is not killed while a request given a
//! longer deadline than its timeout (an embedder's own) may still wait on it. (An HTTP
//! server has no process to restart: its calls time out.)

use std::sync::Arc;
use std::time::Duration;

use crate::transport::{Connection, Era, RequestError, TransportError};

/// The least time a server that answered nothing for a request's whole timeout has to
/// answer the probe (its timeout, if longer).
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Ends the watch when dropped (its connection ended or was replaced).
pub(super) type Watch = crate::util::AbortOnDrop;

/// Watches `conn` (a stdio one; `None` over HTTP) of server `id`, whose requests time
/// out after `timeout`.
pub(super) fn watch(id: &str, conn: &Arc<Connection>, timeout: Duration) -> Option<Watch> {
    conn.heard()?;
    let wait = PROBE_TIMEOUT.max(timeout);
    let (id, conn) = (id.to_string(), conn.clone());
    let task = tokio::spawn(async move {
        loop {
            conn.timed_out_silently().await;
            if conn.is_closed() {
                return;
            }
            let before = conn.heard();
            let probe = match conn.era() {
                Era::Legacy => "ping",
                Era::Modern => "server/discover",
            };
            let answered = conn.request_with_timeout(probe, None, wait).await;
            let silent = matches!(
                answered,
                Err(RequestError::Transport(TransportError::Timeout(_)))
            ) && conn.heard() == before;
            // Not while a request given longer than the server's timeout may still
            // wait (an embedder's own deadline): the server may be at work on it.
            if silent && !conn.is_closed() && !conn.waits_long() {
                tracing::warn!(server = %id, probe, "the server wrote nothing while a request waited out its timeout, nor answered a probe within {wait:?}: killing it to restart it");
                conn.kill();
                return;
            }
        }
    });
    Some(crate::util::AbortOnDrop(task.abort_handle()))
}
