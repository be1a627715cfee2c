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

/// Drains the sink once, on a blocking thread; then syncs the file if `sync` and that
/// is due.
async fn drain(sink: &AuditSink, sync: bool) {
    let shared = sink.shared.clone();
    let written = tokio::task::spawn_blocking(move || {
        shared.write_pending();
        if sync {
            shared.sync_due();
        }
    });
    if written.await.is_err() {
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
        // A rebuilt actor's probe is not waited for: the root, which rebuilds it, would
        // wait with it (every other rebuild and its shutdown behind), and the trail's
        // state outlives the actor.
        if sink.first_start() {
            match tokio::time::timeout(super::sink::STALLED_WRITE, probe).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => tracing::error!("the audit writer task failed"),
                Err(_) => tracing::warn!("opening the audit file has not returned; going on"),
            }
        }
        // A full batch's wake-up may have died in the mailbox of the actor this one
        // replaces: drained now, not at the timer.
        if sink.woken() {
            let _ = myself.send_message(AuditMsg::Tick);
        }
        // One timer at a time, armed again after each drain: a writer stuck in a write
        // does not collect a tick per interval in its mailbox.
        myself.send_after(next_drain(&sink), || AuditMsg::Timer);
        // A sync armed by the actor this one replaces died with its mailbox.
        sink.sync_fired();
        arm_sync(&myself, &sink);
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
            // A full batch: written at once, and synced when a sync is due (at most
            // one a second: a flood of batches does not each wait for the disk).
            AuditMsg::Tick => {
                drain(sink, true).await;
                arm_sync(&myself, sink);
            }
            AuditMsg::Timer => {
                drain(sink, true).await;
                arm_sync(&myself, sink);
                myself.send_after(next_drain(sink), || AuditMsg::Timer);
            }
            AuditMsg::Sync => {
                sink.sync_fired();
                drain(sink, true).await;
                arm_sync(&myself, sink);
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _: ActorRef<AuditMsg>,
        sink: &mut AuditSink,
    ) -> Result<(), ActorProcessingErr> {
        drain(sink, false).await;
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

/// Arms one [`AuditMsg::Sync`] a second from now when written records wait for a sync
/// (a batch written a moment after the last sync is not synced with it) and none is
/// armed: the timer may be `flush_every` away, up to an hour, and a host that crashes
/// meanwhile loses what the README says is at most a second's records.
fn arm_sync(myself: &ActorRef<AuditMsg>, sink: &AuditSink) {
    if sink.unsynced() && sink.arm_sync() {
        myself.send_after(super::sink::SYNC_EVERY, || AuditMsg::Sync);
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::audit::AuditConfig;

    /// An audit actor over a sink of `config`, as the harness starts it.
    async fn started(
        config: AuditConfig,
    ) -> (AuditSink, ActorRef<AuditMsg>, tokio::task::JoinHandle<()>) {
        let slot = ActorSlot::default();
        let sink = AuditSink::new(config, slot.clone());
        let (actor, handle) = Actor::spawn(None, AuditActor, sink.clone())
            .await
            .expect("spawn");
        slot.set(actor.clone());
        (sink, actor, handle)
    }

    /// Waits up to ten seconds for `done`.
    async fn within_ten_seconds(done: impl Fn() -> bool) -> bool {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !done() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        done()
    }

    // What the timer writes is synced to the disk while the trail runs, not only at
    // shutdown: a disk that refuses it says so then.
    #[tokio::test]
    async fn what_was_written_is_synced_while_the_trail_runs() {
        let dir = crate::util::scratch::Scratch::new("synced");
        let path = dir.join("audit.jsonl");
        let (sink, actor, handle) = started(AuditConfig {
            path: Some(path.clone()),
            flush_every: Duration::from_millis(20),
            ..AuditConfig::default()
        })
        .await;
        sink.record(&serde_json::json!({"i": 1}));
        let synced = || {
            std::fs::read_to_string(&path).is_ok_and(|t| t.contains("\"i\":1"))
                && sink.shared.unsynced.load(Ordering::SeqCst) == 0
        };
        assert!(within_ten_seconds(synced).await, "written and synced");
        actor.stop(None);
        let _ = handle.await;
    }

    // A full batch written a moment after the last sync is synced a second later, not
    // at the timer an hour away.
    #[tokio::test]
    async fn a_batch_written_just_after_a_sync_is_synced_within_a_second_or_so() {
        let dir = crate::util::scratch::Scratch::new("batch-synced");
        let path = dir.join("audit.jsonl");
        let (sink, actor, handle) = started(AuditConfig {
            path: Some(path.clone()),
            flush_every: Duration::from_secs(3600),
            batch: 2,
            ..AuditConfig::default()
        })
        .await;
        let lines = || std::fs::read_to_string(&path).map_or(0, |t| t.lines().count());
        sink.record(&serde_json::json!({"i": 1}));
        sink.record(&serde_json::json!({"i": 2}));
        assert!(within_ten_seconds(|| lines() == 2).await, "the first batch");
        sink.record(&serde_json::json!({"i": 3}));
        sink.record(&serde_json::json!({"i": 4}));
        assert!(
            within_ten_seconds(|| lines() == 4).await,
            "the second batch"
        );
        assert!(
            within_ten_seconds(|| sink.shared.unsynced.load(Ordering::SeqCst) == 0).await,
            "the second batch synced"
        );
        actor.stop(None);
        let _ = handle.await;
    }
}
