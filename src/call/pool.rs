//! Where calls run: a [`CallSupervisor`] below the root, owning a pool of long-lived
//! [`CallWorker`] actors (the design's "factory of call workers"). A call goes to a
//! worker with one message and runs as a task the worker owns: no actor is spawned per
//! call, and no call's end is a supervision event for anyone.
//!
//! Lifecycle: a worker that dies takes its calls with it (their tasks are aborted, and
//! each call's record says `cancelled`); the supervisor rebuilds it. Shutting down
//! aborts the calls still running and waits until their records are written.
//!
//! Cancellation: dropping the future of a call, or cancelling its [`CancelToken`], ends
//! the call: the server gets `notifications/cancelled` for the request in flight (stdio)
//! or sees its stream closed (HTTP), a pending input request is withdrawn, and the audit
//! says `cancelled`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::RwLock;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinSet;

pub use tokio_util::sync::CancellationToken as CancelToken;

use super::CallRequest;
use super::context::CallContext;
use super::error::CallError;
use crate::util::slot::ActorSlot;

/// Workers in the pool: a few per core is enough, as each runs many calls at once.
const WORKERS: usize = 4;

/// One call handed to a worker.
pub struct CallJob {
    ctx: Arc<CallContext>,
    request: CallRequest,
    reply: oneshot::Sender<Result<Value, CallError>>,
    /// Resolves (with an error) when the caller goes away.
    caller_gone: oneshot::Receiver<()>,
}

impl CallJob {
    async fn run(self) {
        let CallJob {
            ctx,
            request,
            reply,
            caller_gone,
        } = self;
        tokio::select! {
            outcome = super::run(&ctx, request) => {
                let _ = reply.send(outcome);
            }
            // The call's future drops here: its request is cancelled on the server and
            // its record says `cancelled`.
            _ = caller_gone => {}
        }
    }
}

/// Messages of a call worker.
pub enum CallWorkerMsg {
    /// Run one call.
    Run(Box<CallJob>),
    /// Abort every call and answer when their records are written.
    Stop(RpcReplyPort<()>),
}

/// A long-lived call worker; see the module docs.
pub struct CallWorker;

impl Actor for CallWorker {
    type Msg = CallWorkerMsg;
    type State = JoinSet<()>;
    type Arguments = ();

    async fn pre_start(
        &self,
        _: ActorRef<CallWorkerMsg>,
        _: (),
    ) -> Result<JoinSet<()>, ActorProcessingErr> {
        Ok(JoinSet::new())
    }

    async fn handle(
        &self,
        _: ActorRef<CallWorkerMsg>,
        msg: CallWorkerMsg,
        calls: &mut JoinSet<()>,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            CallWorkerMsg::Run(job) => {
                // Reap the calls that ended, so the set holds only running ones.
                while calls.try_join_next().is_some() {}
                calls.spawn(job.run());
            }
            CallWorkerMsg::Stop(reply) => {
                calls.abort_all();
                while calls.join_next().await.is_some() {}
                let _ = reply.send(());
            }
        }
        Ok(())
    }
}

/// Messages of the call supervisor.
pub enum CallSupervisorMsg {
    /// Abort the calls still running on every worker; answer when their records are
    /// written.
    Shutdown(RpcReplyPort<()>),
}

/// The workers, as callers pick them.
#[derive(Clone, Default)]
pub struct CallPool {
    workers: Arc<RwLock<Vec<ActorRef<CallWorkerMsg>>>>,
    next: Arc<AtomicUsize>,
    pub(crate) supervisor: ActorSlot<CallSupervisorMsg>,
}

impl CallPool {
    /// Runs one call on a worker; see the module docs for cancellation.
    pub(crate) async fn run(
        &self,
        ctx: Arc<CallContext>,
        request: CallRequest,
        cancel: Option<CancelToken>,
    ) -> Result<Value, CallError> {
        let (reply, answer) = oneshot::channel();
        let (_here, caller_gone) = oneshot::channel::<()>();
        let job = Box::new(CallJob {
            ctx,
            request,
            reply,
            caller_gone,
        });
        let worker = {
            let workers = self.workers.read();
            if workers.is_empty() {
                return Err(CallError::ShutDown);
            }
            let i = self.next.fetch_add(1, Ordering::Relaxed) % workers.len();
            workers[i].clone()
        };
        worker
            .send_message(CallWorkerMsg::Run(job))
            .map_err(|_| CallError::ShutDown)?;
        let outcome = match cancel {
            Some(token) => tokio::select! {
                r = answer => r,
                _ = token.cancelled() => return Err(CallError::Cancelled),
            },
            None => answer.await,
        };
        // The worker died with the call (it is being rebuilt), or the harness stopped.
        outcome.unwrap_or(Err(CallError::ShutDown))
    }

    /// Aborts the calls still running; returns when their records are written.
    pub(crate) async fn shutdown(&self) {
        self.supervisor
            .ask(CallSupervisorMsg::Shutdown, Duration::from_secs(30))
            .await;
    }
}

/// Owns the call workers and rebuilds any that dies.
pub struct CallSupervisor;

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
            let (w, _) = Actor::spawn_linked(None, CallWorker, (), myself.get_cell()).await?;
            workers.push(w);
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
                let workers = pool.workers.read().clone();
                tokio::spawn(async move {
                    for w in workers {
                        let _ = w
                            .call(CallWorkerMsg::Stop, Some(Duration::from_secs(20)))
                            .await;
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
            .position(|w| w.get_id() == cell.get_id());
        if let Some(i) = position {
            tracing::warn!("a call worker died; its calls were cancelled; rebuilding it");
            let (w, _) = Actor::spawn_linked(None, CallWorker, (), myself.get_cell()).await?;
            pool.workers.write()[i] = w;
        }
        Ok(())
    }
}
