//! The current address of an actor that its supervisor rebuilds: holders keep the slot,
//! never a stale `ActorRef`. Asking while the actor is being rebuilt waits a moment for
//! the new one instead of failing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use ractor::{ActorRef, RpcReplyPort};

/// How long an ask waits for a rebuilt actor before giving up: a rebuild on a loaded
/// machine (a supervisor behind a busy mailbox) can take seconds, and an ask given up
/// reads as "the harness is shut down".
const REBUILD_WAIT: Duration = Duration::from_secs(5);

/// The current actor of one service; cheap to clone.
pub struct ActorSlot<M>(Arc<Slot<M>>);

struct Slot<M> {
    actor: RwLock<Option<ActorRef<M>>>,
    /// Set when no actor will be built again (its supervisor stopped): an ask of a
    /// dead actor then fails at once instead of waiting for a rebuild.
    closed: AtomicBool,
}

impl<M> Clone for ActorSlot<M> {
    fn clone(&self) -> Self {
        ActorSlot(self.0.clone())
    }
}

impl<M> Default for ActorSlot<M> {
    fn default() -> Self {
        ActorSlot(Arc::new(Slot {
            actor: RwLock::new(None),
            closed: AtomicBool::new(false),
        }))
    }
}

impl<M: Send + 'static> ActorSlot<M> {
    /// Publishes a (re)built actor.
    pub fn set(&self, actor: ActorRef<M>) {
        *self.0.actor.write() = Some(actor);
    }

    /// The current actor.
    pub fn get(&self) -> Option<ActorRef<M>> {
        self.0.actor.read().clone()
    }

    /// Says that no actor will be built again: asks of a dead one end at once.
    pub fn close(&self) {
        self.0.closed.store(true, Ordering::Release);
    }

    fn closed(&self) -> bool {
        self.0.closed.load(Ordering::Acquire)
    }

    /// Sends a message without waiting; false when no actor takes it.
    pub fn send(&self, message: M) -> bool {
        match self.get() {
            Some(a) => a.send_message(message).is_ok(),
            None => false,
        }
    }

    /// Asks the actor and waits up to `limit` for the answer; while the actor is dead
    /// and being rebuilt, waits for the new one. `None` when nobody answered.
    ///
    /// An actor killed with the message in its mailbox drops it unanswered: it is asked
    /// of the rebuilt actor (up to [`RETRIES`] times, within [`REBUILD_WAIT`] of the
    /// first failure). So a message may be handled twice (when its actor died after
    /// handling it and before answering): what is asked through a slot is safe to
    /// repeat (grants, flushes, registrations, a server's add, numbered by its request).
    /// A live actor that drops a request unanswered has answered. Once the slot is
    /// [closed](Self::close), a dead actor is not waited for.
    pub async fn ask<T: Send + 'static>(
        &self,
        build: impl Fn(RpcReplyPort<T>) -> M,
        limit: Duration,
    ) -> Option<T> {
        let mut failed: Option<Instant> = None;
        let mut retries = 0;
        loop {
            if let Some(actor) = self.get() {
                match actor.call(&build, Some(limit)).await {
                    Ok(ractor::rpc::CallResult::Success(v)) => return Some(v),
                    Ok(ractor::rpc::CallResult::Timeout) => return None,
                    Ok(ractor::rpc::CallResult::SenderError) => {
                        retries += 1;
                        if retries > RETRIES || self.closed() || !stopping(&actor).await {
                            return None;
                        }
                    }
                    // Dead: its supervisor is rebuilding it.
                    Err(_) => {}
                }
            }
            let since = *failed.get_or_insert_with(Instant::now);
            if self.closed() || since.elapsed() > REBUILD_WAIT {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// How many times a request dropped with a killed actor's mailbox is asked again (an
/// actor killed again and again before it answers, within [`REBUILD_WAIT`]).
const RETRIES: usize = 8;

/// Whether `actor` is stopping (killed, its mailbox dropped), as seen within a second
/// (its status can take that long to change on a loaded machine): a request it dropped
/// unanswered while it runs on was its answer.
async fn stopping<M>(actor: &ActorRef<M>) -> bool {
    let until = Instant::now() + Duration::from_secs(1);
    loop {
        if !ractor::ACTIVE_STATES.contains(&actor.get_status()) {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
