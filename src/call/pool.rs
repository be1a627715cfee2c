//! Where calls run: a [`CallSupervisor`] below the root owns a pool of long-lived
//! [`CallWorker`] actors, and every call belongs to one of them. A call runs in its
//! caller's own task (no actor is spawned per call, no message or task switch is added
//! to the call path: the profile showed each hop costing about a tenth of the
//! throughput), under its worker's cancellation token.
//!
//! Lifecycle: a worker that dies takes its calls with it: its token is cancelled as its
//! state drops, each of its calls ends at once with [`CallError::WorkerDied`], and each
//! call's record says `cancelled`; the supervisor rebuilds the worker with a new token. Shutting down cancels every
//! worker's token and waits until no call is left in flight (every record written).
//!
//! Cancellation: dropping the future of a call, or cancelling its [`CancelToken`], ends
//! the call: the server gets `notifications/cancelled` for the request in flight (stdio)
//! or sees its stream closed (HTTP), a pending input request is withdrawn, and the audit
//! says `cancelled`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio_util::sync::DropGuard;

pub use tokio_util::sync::CancellationToken as CancelToken;

use super::CallRequest;
use super::context::CallContext;
use super::error::CallError;
use crate::util::slot::ActorSlot;

/// Workers in the pool: calls spread over a few tokens, so that cancelling one worker's
/// calls (it died) leaves the rest running.
const WORKERS: usize = 4;

/// A call worker's state: the guard that cancels its calls when it drops.
pub(crate) struct WorkerState {
    _calls: DropGuard,
}

/// Owns the calls given its token; see the module docs. It handles no messages: its
/// life is what bounds its calls'.
pub(crate) struct CallWorker;

impl Actor for CallWorker {
    type Msg = ();
    type State = WorkerState;
    type Arguments = CancelToken;

    async fn pre_start(
        &self,
        _: ActorRef<()>,
        token: CancelToken,
    ) -> Result<WorkerState, ActorProcessingErr> {
        Ok(WorkerState {
            _calls: token.drop_guard(),
        })
    }
}

/// Messages of the call supervisor.
pub(crate) enum CallSupervisorMsg {
    /// Cancel every call; answer when none is left in flight.
    Shutdown(RpcReplyPort<()>),
}

/// One worker as calls see it.
#[derive(Clone)]
struct Worker {
    actor: ActorRef<()>,
    token: CancelToken,
}

/// Why a call is refused before it begins.
#[derive(Clone, Copy, Debug)]
enum Refusal {
    /// Its `CancelToken` was cancelled already.
    Cancelled,
    /// Every worker's token was: they died, or the harness is closing.
    WorkerGone,
}

/// The workers, as calls pick them.
#[derive(Clone)]
pub(crate) struct CallPool {
    workers: Arc<RwLock<Vec<Worker>>>,
    next: Arc<AtomicUsize>,
    /// Set once shutdown begins: a cancelled worker then means the harness is going.
    closing: Arc<AtomicBool>,
    ctx: Arc<CallContext>,
    pub(crate) supervisor: ActorSlot<CallSupervisorMsg>,
}

impl CallPool {
    /// A pool for the calls of `ctx`.
    pub(crate) fn new(ctx: Arc<CallContext>) -> CallPool {
        CallPool {
            workers: Arc::default(),
            next: Arc::default(),
            closing: Arc::default(),
            ctx,
            supervisor: ActorSlot::default(),
        }
    }

    /// Runs one call under a worker's token; see the module docs for cancellation.
    pub(crate) async fn run(
        &self,
        request: CallRequest,
        cancel: Option<CancelToken>,
    ) -> Result<super::Answer, CallError> {
        // A call that fails at once (a worker just died, the harness is closing) never
        // waits: a caller retrying it in a loop held its thread for good, and with it the
        // timers and actors that would end the failure. Spending tokio's cooperative
        // budget makes such a loop yield now and then.
        tokio::task::consume_budget().await;
        // Refused at once while shutting down (not counted: they would hold its wait).
        if self.closing.load(Ordering::SeqCst) {
            return Err(CallError::ShutDown);
        }
        // Then counted in flight before `closing` is read again (both SeqCst): a
        // shutdown that set it meanwhile either waits for this call or is seen by it,
        // never records written after the trail was flushed.
        let entered = self.ctx.enter();
        let (worker, live) = {
            let workers = self.workers.read();
            if workers.is_empty() || self.closing.load(Ordering::SeqCst) {
                return Err(CallError::ShutDown);
            }
            // A dead worker's token stays until the supervisor replaces it: a live one
            // is taken instead, while there is one.
            let n = workers.len();
            let first = self.next.fetch_add(1, Ordering::Relaxed);
            let live = (0..n)
                .map(|k| &workers[first.wrapping_add(k) % n].token)
                .find(|t| !t.is_cancelled());
            match live {
                Some(token) => (token.clone(), true),
                None => (workers[first % n].token.clone(), false),
            }
        };
        // A call cancelled, or whose worker is gone, before it begins is recorded but
        // never routed or sent: it would reach the server in its first poll, before the
        // select below looks at the tokens.
        let refused = if cancel.as_ref().is_some_and(CancelToken::is_cancelled) {
            Some(Refusal::Cancelled)
        } else if !live {
            Some(Refusal::WorkerGone)
        } else {
            None
        };
        // Boxed: the call's future (2.9 KB) would otherwise be inlined into this one and
        // into every future that awaits a call (3.9 KB at the top), and copied whole each
        // time one of them moves (spawned, boxed, awaited): `memmove` was 8.6 % of the
        // bench process's samples, 6.6 % with the box.
        if let Some(refusal) = refused {
            super::refuse(&self.ctx, &request, entered)?;
            return Err(self.refusal(refusal));
        }
        let call = Box::pin(super::run(&self.ctx, request, entered));
        let cancelled = async {
            match &cancel {
                Some(token) => token.cancelled().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            // The call first: its first poll writes its `started` record, so that a call
            // whose worker is already gone still has both records (its drop writes
            // `finished`).
            biased;
            outcome = call => outcome,
            // The call's future drops here: its request is cancelled on the server and
            // its record says `cancelled`.
            _ = worker.cancelled() => Err(self.worker_gone()),
            _ = cancelled => Err(CallError::Cancelled),
        }
    }

    /// What a call refused before it began ends with.
    fn refusal(&self, refusal: Refusal) -> CallError {
        match refusal {
            Refusal::Cancelled => CallError::Cancelled,
            Refusal::WorkerGone => self.worker_gone(),
        }
    }

    /// Why a call's worker is gone: the harness is shutting down, or it died.
    fn worker_gone(&self) -> CallError {
        if self.closing.load(Ordering::SeqCst) {
            CallError::ShutDown
        } else {
            CallError::WorkerDied
        }
    }

    /// Whether the harness is closing: no new call is admitted.
    pub(crate) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    /// Admits no new call (each ends with [`CallError::ShutDown`]); calls in flight go on.
    pub(crate) fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
    }

    /// Cancels every call; returns when none is left in flight.
    pub(crate) async fn shutdown(&self) {
        self.close();
        self.supervisor
            .ask(CallSupervisorMsg::Shutdown, Duration::from_secs(30))
            .await;
    }
}

/// Owns the call workers and rebuilds any that dies.
pub(crate) struct CallSupervisor;

impl Actor for CallSupervisor {
    type Msg = CallSupervisorMsg;
    type State = CallPool;
    type Arguments = CallPool;

    async fn pre_start(
        &self,
        myself: ActorRef<CallSupervisorMsg>,
        pool: CallPool,
    ) -> Result<CallPool, ActorProcessingErr> {
        let mut workers = Vec::with_capacity(WORKERS);
        for _ in 0..WORKERS {
            workers.push(spawn_worker(&myself).await?);
        }
        *pool.workers.write() = workers;
        Ok(pool)
    }

    async fn handle(
        &self,
        _: ActorRef<CallSupervisorMsg>,
        msg: CallSupervisorMsg,
        pool: &mut CallPool,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            CallSupervisorMsg::Shutdown(reply) => {
                for w in pool.workers.read().iter() {
                    w.token.cancel();
                }
                let ctx = pool.ctx.clone();
                tokio::spawn(async move {
                    let deadline = Instant::now() + Duration::from_secs(20);
                    while ctx.in_flight() > 0 && Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    let _ = reply.send(());
                });
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<CallSupervisorMsg>,
        event: SupervisionEvent,
        pool: &mut CallPool,
    ) -> Result<(), ActorProcessingErr> {
        // Overrides ractor's default, which would stop every worker with one.
        let cell = match &event {
            SupervisionEvent::ActorFailed(cell, _)
            | SupervisionEvent::ActorTerminated(cell, _, _) => cell,
            _ => return Ok(()),
        };
        let position = pool
            .workers
            .read()
            .iter()
            .position(|w| w.actor.get_id() == cell.get_id());
        if let Some(i) = position {
            tracing::warn!("a call worker died; its calls were cancelled; rebuilding it");
            let w = spawn_worker(&myself).await?;
            pool.workers.write()[i] = w;
        }
        Ok(())
    }
}

async fn spawn_worker(
    supervisor: &ActorRef<CallSupervisorMsg>,
) -> Result<Worker, ActorProcessingErr> {
    let token = CancelToken::new();
    let (actor, _) =
        Actor::spawn_linked(None, CallWorker, token.clone(), supervisor.get_cell()).await?;
    Ok(Worker { actor, token })
}
