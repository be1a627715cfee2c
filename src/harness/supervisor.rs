//! `HarnessSupervisor`: the root of the harness's actor tree. It starts the service
//! actors (audit, permission, registry, input handlers), the servers' supervisor and
//! the call supervisor, and rebuilds any of them that dies from the arguments it keeps;
//! their state lives outside them (the audit sink, the policy snapshot, the registry,
//! the handler set, the server directory, the call pool), so a rebuilt one loses
//! nothing. It never stops because a child did, and never waits on a child inside
//! `handle`: shutting down runs in a task that answers when everything is written.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{
    Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent,
};

use crate::audit::{AuditActor, AuditRef, AuditSink};
use crate::call::input::{InputHandlersActor, InputHandlersArgs};
use crate::call::{CallContext, CallPool, CallSupervisor};
use crate::permission::{PermissionActor, PermissionRef, SharedPolicy};
use crate::registry::{Registry, RegistryActor, RegistryRef};
use crate::server::{ServersArgs, ServersRef, ServersSupervisor};

/// The children of the root.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Service {
    /// `AuditActor`.
    Audit,
    /// `PermissionActor`.
    Permission,
    /// `RegistryActor`.
    Registry,
    /// `InputHandlersActor`.
    InputHandlers,
    /// `ServersSupervisor`, and every server below it.
    Servers,
    /// `CallSupervisor`, and the call workers below it.
    Calls,
}

impl Service {
    /// Every child, in start order.
    pub const ALL: [Service; 6] = [
        Service::Audit,
        Service::Permission,
        Service::Registry,
        Service::InputHandlers,
        Service::Servers,
        Service::Calls,
    ];
}

/// What the root keeps to start (and rebuild) its children.
#[derive(Clone)]
pub(crate) struct Services {
    pub(crate) audit_sink: AuditSink,
    pub(crate) audit: AuditRef,
    pub(crate) policy: SharedPolicy,
    pub(crate) permission: PermissionRef,
    pub(crate) registry: Arc<Registry>,
    pub(crate) registry_ref: RegistryRef,
    pub(crate) inputs: InputHandlersArgs,
    pub(crate) servers_args: ServersArgs,
    pub(crate) servers: ServersRef,
    pub(crate) calls: CallPool,
    pub(crate) ctx: Arc<CallContext>,
}

impl Services {
    /// Says that no service is rebuilt again (the root is stopping): an ask of one
    /// that is gone then ends at once instead of waiting out a rebuild.
    pub(crate) fn close_slots(&self) {
        self.audit.0.close();
        self.permission.0.close();
        self.registry_ref.0.close();
        self.inputs.handlers.actor.close();
        self.servers.0.close();
        self.calls.supervisor.close();
    }
}

/// Messages of the root.
pub(crate) enum HarnessMsg {
    /// Stop every server gracefully, end the calls still running, write every record
    /// and cache entry, then stop.
    Shutdown(RpcReplyPort<()>),
    /// The current actor of one child (for fault injection).
    Child(Service, RpcReplyPort<Option<ActorCell>>),
    /// Rebuild a service that died, after its pause (or whose rebuild failed).
    Rebuild(Service),
}

/// A service that dies again within this of its rebuild, past its free deaths in a row,
/// is rebuilt after a pause, which doubles with each such death from [`FIRST_PAUSE`] up
/// to [`LONGEST_PAUSE`]: one that keeps dying does not spin.
const DIED_SOON: Duration = Duration::from_secs(1);
const FIRST_PAUSE: Duration = Duration::from_millis(20);
const LONGEST_PAUSE: Duration = Duration::from_secs(1);

/// Deaths in a row, each soon after the rebuild before, rebuilt at once all the same:
/// none for the servers' supervisor (each rebuild respawns every server process), a
/// few for the others, which cost a few actors each, while calls fail fast meanwhile (a
/// call takes a dead worker's token and ends `worker_died` at once): a pause there is a
/// burst of failures, not rest, and only a service dying in a loop earns one.
fn free_deaths(service: Service) -> u32 {
    match service {
        Service::Servers => 0,
        _ => 8,
    }
}

/// Each service's deaths in a row soon after its rebuild, and when it was last rebuilt.
#[derive(Default)]
struct Streaks(HashMap<Service, (u32, Option<Instant>)>);

impl Streaks {
    /// How long to wait before rebuilding `service`, which died at `now`.
    fn pause(&mut self, service: Service, now: Instant) -> Duration {
        let (streak, rebuilt_at) = self.0.entry(service).or_insert((0, None));
        let soon = rebuilt_at.is_some_and(|at| now.saturating_duration_since(at) < DIED_SOON);
        *streak = if soon { streak.saturating_add(1) } else { 0 };
        match streak.saturating_sub(free_deaths(service)) {
            0 => Duration::ZERO,
            n => FIRST_PAUSE
                .saturating_mul(1 << (n - 1).min(16))
                .min(LONGEST_PAUSE),
        }
    }

    /// `service` was rebuilt at `at`.
    fn rebuilt(&mut self, service: Service, at: Instant) {
        self.0.entry(service).or_insert((0, None)).1 = Some(at);
    }
}

/// The root's state.
pub(crate) struct SupervisorState {
    services: Services,
    children: HashMap<ActorId, Service>,
    current: HashMap<Service, ActorCell>,
    /// Once a shutdown is under way: the callers of later ones, answered when it is done.
    shutting_down: Option<Arc<parking_lot::Mutex<Vec<RpcReplyPort<()>>>>>,
    /// Each service's deaths in a row soon after its rebuild.
    streaks: Streaks,
}

/// The root actor; see the module docs.
pub(crate) struct HarnessSupervisor;

impl SupervisorState {
    /// Rebuilds `service` unless a shutdown began or it runs already; a rebuild that
    /// fails is tried again after the longest pause.
    async fn rebuild(&mut self, myself: &ActorRef<HarnessMsg>, service: Service) {
        if self.shutting_down.is_some() || self.children.values().any(|s| *s == service) {
            return;
        }
        match self.spawn(myself, service).await {
            Ok(()) => {
                self.streaks.rebuilt(service, Instant::now());
            }
            Err(e) => {
                tracing::error!(?service, error = %e, "could not rebuild a harness service; trying again");
                myself.send_after(LONGEST_PAUSE, move || HarnessMsg::Rebuild(service));
            }
        }
    }

    async fn spawn(
        &mut self,
        myself: &ActorRef<HarnessMsg>,
        service: Service,
    ) -> Result<(), ActorProcessingErr> {
        let s = &self.services;
        let cell = myself.get_cell();
        let child: ActorCell = match service {
            Service::Audit => {
                let (a, _) =
                    Actor::spawn_linked(None, AuditActor, s.audit_sink.clone(), cell).await?;
                s.audit.0.set(a.clone());
                a.get_cell()
            }
            Service::Permission => {
                let (a, _) =
                    Actor::spawn_linked(None, PermissionActor, s.policy.clone(), cell).await?;
                s.permission.0.set(a.clone());
                a.get_cell()
            }
            Service::Registry => {
                let (a, _) =
                    Actor::spawn_linked(None, RegistryActor, s.registry.clone(), cell).await?;
                s.registry_ref.0.set(a.clone());
                a.get_cell()
            }
            Service::InputHandlers => {
                let (a, _) =
                    Actor::spawn_linked(None, InputHandlersActor, s.inputs.clone(), cell).await?;
                s.inputs.handlers.actor.set(a.clone());
                a.get_cell()
            }
            Service::Servers => {
                let (a, _) =
                    Actor::spawn_linked(None, ServersSupervisor, s.servers_args.clone(), cell)
                        .await?;
                s.servers.0.set(a.clone());
                a.get_cell()
            }
            Service::Calls => {
                let (a, _) =
                    Actor::spawn_linked(None, CallSupervisor, s.calls.clone(), cell).await?;
                s.calls.supervisor.set(a.clone());
                a.get_cell()
            }
        };
        self.children.insert(child.get_id(), service);
        self.current.insert(service, child);
        Ok(())
    }
}

impl Actor for HarnessSupervisor {
    type Msg = HarnessMsg;
    type State = SupervisorState;
    type Arguments = Services;

    async fn pre_start(
        &self,
        myself: ActorRef<HarnessMsg>,
        services: Services,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        let mut state = SupervisorState {
            services,
            children: HashMap::new(),
            current: HashMap::new(),
            shutting_down: None,
            streaks: Streaks::default(),
        };
        for service in Service::ALL {
            state.spawn(&myself, service).await?;
        }
        Ok(state)
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<HarnessMsg>,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        // Stopped by an embedder's supervisor, not by `shutdown()`: nothing rebuilds.
        // (Killed, it does not get here: `shutdown()` closes them then.)
        state.services.close_slots();
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<HarnessMsg>,
        msg: HarnessMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            HarnessMsg::Shutdown(reply) => {
                if let Some(later) = &state.shutting_down {
                    // The first one is under way: this one returns with it, when no
                    // server process is left (those who would ask after it are
                    // answered when the actor stops, dropping their ports).
                    later.lock().push(reply);
                    return Ok(());
                }
                // A service waiting out its pause is rebuilt now: every step of the
                // shutdown asks one, and would wait for it in vain. Not the servers'
                // supervisor: rebuilt, it would start every server only to stop it.
                for service in Service::ALL {
                    if service != Service::Servers {
                        state.rebuild(&myself, service).await;
                    }
                }
                let servers_running = state.children.values().any(|s| *s == Service::Servers);
                let later = Arc::new(parking_lot::Mutex::new(Vec::new()));
                state.shutting_down = Some(later.clone());
                let services = state.services.clone();
                tokio::spawn(async move {
                    // Done even if the shutdown panics.
                    let _later = AnswerLater(later, myself);
                    shut_down(&services, servers_running).await;
                    let _ = reply.send(());
                });
            }
            HarnessMsg::Child(service, reply) => {
                // None while it waits to be rebuilt: its last actor is gone.
                let running = state.children.values().any(|s| *s == service);
                let _ = reply.send(
                    running
                        .then(|| state.current.get(&service).cloned())
                        .flatten(),
                );
            }
            HarnessMsg::Rebuild(service) => state.rebuild(&myself, service).await,
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<HarnessMsg>,
        event: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        // Overrides ractor's default, which would stop the whole harness with one child.
        let cell = match &event {
            SupervisionEvent::ActorFailed(cell, _)
            | SupervisionEvent::ActorTerminated(cell, _, _) => cell,
            _ => return Ok(()),
        };
        let Some(service) = state.children.remove(&cell.get_id()) else {
            return Ok(());
        };
        if state.shutting_down.is_some() {
            return Ok(());
        }
        let pause = state.streaks.pause(service, Instant::now());
        tracing::warn!(?service, ?pause, "a harness service died; rebuilding it");
        if pause.is_zero() {
            state.rebuild(&myself, service).await;
        } else {
            myself.send_after(pause, move || HarnessMsg::Rebuild(service));
        }
        Ok(())
    }
}

/// When the first shutdown is done, or has panicked: answers the callers of later ones,
/// and stops the supervisor (those who ask after it are answered by their ports,
/// dropped with it).
struct AnswerLater(
    Arc<parking_lot::Mutex<Vec<RpcReplyPort<()>>>>,
    ActorRef<HarnessMsg>,
);

impl Drop for AnswerLater {
    fn drop(&mut self) {
        for reply in self.0.lock().drain(..) {
            let _ = reply.send(());
        }
        self.1.stop(None);
    }
}

/// The graceful stop: no new calls; the ones in flight get `shutdown_grace` to finish
/// on live servers, then the rest are cancelled; only then do the servers stop, and
/// every record and cache entry is written.
async fn shut_down(services: &Services, servers_running: bool) {
    services.calls.close();
    let deadline =
        crate::util::duration::after(Instant::now(), services.ctx.settings.shutdown_grace);
    while services.ctx.in_flight() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    services.calls.shutdown().await;
    (services.servers)
        .shutdown(&services.servers_args.directory, servers_running)
        .await;
    // Every call has ended: its records are written before the caches, whose writes
    // may wait on another process's lock or on Redis.
    flush_audit(services).await;
    services.registry_ref.flush().await;
    if let Some(shared) = &services.registry.shared {
        // One write under way and the next, each within its own bound (before: four
        // lookups' bound, 200 ms, shorter than one write's second).
        shared.drain(shared.write_bound() * 2).await;
        // Bounded by itself: a lock another process holds is waited for a few seconds.
        shared.write_floors().await;
        shared.close();
    }
    // The services stop with the root, right after: not to be rebuilt.
    services.close_slots();
}

/// Writes every accepted audit record before `shutdown()` returns, or reports what
/// could not be.
async fn flush_audit(services: &Services) {
    // A write stuck (a pipe no one reads), one under way or the flush's own, would hold
    // the flush for its whole limit (30 s, past a container's usual grace): it gets a
    // few seconds to return, and then what waits behind it is reported unwritten.
    let flushed = tokio::select! {
        biased;
        flushed = services.audit.flush() => flushed,
        () = services.audit_sink.stalled() => {
            tracing::error!(
                "an audit write has not returned; the records behind it are reported unwritten"
            );
            return;
        }
    };
    if !flushed {
        // Its actor died meanwhile, and is not rebuilt while the harness stops: what
        // it would have written is written here, before `shutdown()` returns, and
        // synced. A write under way (the dead actor's, on its blocking thread) is waited
        // for first; one stuck holds this one too, so what waits behind it is reported
        // unwritten. A sync that hangs is given up after a while, its thread left.
        let ended = async {
            while services.audit_sink.writing() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::select! {
            biased;
            () = ended => {}
            () = services.audit_sink.stalled() => {
                tracing::error!(
                    "an audit write has not returned; the records behind it are reported unwritten"
                );
                return;
            }
        }
        let limit = Duration::from_secs(5);
        let _ = tokio::time::timeout(limit, services.audit_sink.write_now()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pauses before each rebuild of `service` dying `deaths` times, each `gap`
    /// after the rebuild before.
    fn pauses(service: Service, deaths: usize, gap: Duration) -> Vec<Duration> {
        let mut streaks = Streaks::default();
        let mut now = Instant::now();
        (0..deaths)
            .map(|_| {
                let pause = streaks.pause(service, now);
                now += pause;
                streaks.rebuilt(service, now);
                now += gap;
                pause
            })
            .collect()
    }

    #[test]
    fn the_servers_supervisor_dying_soon_after_each_rebuild_waits_longer_each_time() {
        let ms = Duration::from_millis;
        assert_eq!(
            pauses(Service::Servers, 9, ms(5)),
            [0, 20, 40, 80, 160, 320, 640, 1000, 1000].map(ms)
        );
        // Deaths a while apart are each rebuilt at once.
        assert!(
            pauses(Service::Servers, 5, DIED_SOON)
                .iter()
                .all(Duration::is_zero)
        );
    }

    #[test]
    fn the_other_services_pause_only_once_they_die_in_a_loop() {
        let ms = Duration::from_millis;
        let calls = pauses(Service::Calls, 12, ms(5));
        assert!(calls[..9].iter().all(Duration::is_zero), "{calls:?}");
        assert_eq!(calls[9..], [20, 40, 80].map(ms));
    }
}
