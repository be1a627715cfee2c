//! `AuditActor`: drains the [`AuditSink`] into the file in batches, on a timer and when
//! a batch is full, off the async threads. Its state is the sink: rebuilt after a
//! crash, it drains the same buffer, so no accepted record is lost.

use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};

use super::msg::AuditMsg;
use super::sink::AuditSink;
use crate::util::slot::ActorSlot;

/// Writes the audit trail; see the module docs.
pub struct AuditActor;

/// Drains the sink once, on a blocking thread.
async fn drain(sink: &AuditSink) {
    let shared = sink.shared.clone();
    if tokio::task::spawn_blocking(move || shared.write_pending())
        .await
        .is_err()
    {
        tracing::error!("the audit writer task failed");
    }
}

impl Actor for AuditActor {
    type Msg = AuditMsg;
    type State = AuditSink;
    type Arguments = AuditSink;

    async fn pre_start(
        &self,
        myself: ActorRef<AuditMsg>,
        sink: AuditSink,
    ) -> Result<AuditSink, ActorProcessingErr> {
        // The file opened now: one that cannot be fails the trail before the first
        // call (`fail_closed` refuses it), not after the first batch. Waited for at most
        // as long as a write counts as stalled: an open stuck in a mount holds neither
        // the harness's start nor a rebuild of this actor longer (it counts as a stalled
        // write, and the probe never waits for a write under way).
        let shared = sink.shared.clone();
        let probe = tokio::task::spawn_blocking(move || shared.probe());
        match tokio::time::timeout(super::sink::STALLED_WRITE, probe).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => tracing::error!("the audit writer task failed"),
            Err(_) => tracing::warn!("opening the audit file has not returned; going on"),
        }
        // One timer at a time, armed again after each drain: a writer stuck in a write
        // does not collect a tick per interval in its mailbox.
        myself.send_after(next_drain(&sink), || AuditMsg::Timer);
        Ok(sink)
    }

    async fn handle(
        &self,
        myself: ActorRef<AuditMsg>,
        msg: AuditMsg,
        sink: &mut AuditSink,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            AuditMsg::Flush(reply) => {
                // Asked for (shutdown): what was written reaches the disk, not only the
                // page cache, before the harness says it is done.
                sink.write_now().await;
                let _ = reply.send(());
            }
            AuditMsg::Tick => drain(sink).await,
            AuditMsg::Timer => {
                drain(sink).await;
                myself.send_after(next_drain(sink), || AuditMsg::Timer);
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _: ActorRef<AuditMsg>,
        sink: &mut AuditSink,
    ) -> Result<(), ActorProcessingErr> {
        drain(sink).await;
        Ok(())
    }
}

/// How soon a failing trail is tried again, at most.
const RETRY_WHILE_FAILING: std::time::Duration = std::time::Duration::from_secs(1);

/// When the next timed drain comes: after `flush_every`, or within a second while the
/// trail fails (under `fail_closed` no call comes to fill a batch and wake the writer,
/// and a long `flush_every` refused calls that long after the fault healed).
fn next_drain(sink: &AuditSink) -> std::time::Duration {
    let every = sink.config().flush_every;
    match sink.health().last_error {
        Some(_) => every.min(RETRY_WHILE_FAILING),
        None => every,
    }
}

/// A typed handle on the audit actor (its address changes when it is rebuilt).
#[derive(Clone, Default)]
pub struct AuditRef(pub(crate) ActorSlot<AuditMsg>);

impl AuditRef {
    /// Writes everything accepted so far; returns when it is written (or failed).
    /// False when no actor answered (killed and not rebuilt, as during shutdown).
    pub async fn flush(&self) -> bool {
        self.0
            .ask(AuditMsg::Flush, Duration::from_secs(30))
            .await
            .is_some()
    }
}
