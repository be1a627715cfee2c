//! `HarnessSupervisor`: the root of the harness's actor tree. It starts one
//! `ServerActor` per enabled server, rebuilds a server actor from its spec when the
//! actor itself dies (killed, or a panic), and never stops because a child did.
//!
//! The server table it keeps is shared with every [`super::HarnessHandle`]: lookups
//! read it without going through this actor's mailbox; only this actor writes it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use ractor::{
    Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent,
};

use std::sync::OnceLock;

use serde_json::Value;
use tokio::sync::broadcast;

use super::core::Services;
use super::error::HarnessError;
use crate::audit::{AuditConfig, AuditMsg};
use crate::call::handler::{InputHandler, InputHandlerActor, InputHandlerArgs, capability_name};
use crate::config::ServerConfig;
use crate::permission::{PermissionActor, Policy};
use crate::registry::cache::SchemaCache;
use crate::registry::{HarnessEvent, RegistryActor, RegistryArgs, RegistryMsg};
use crate::server::{LiveSlot, ServerHooks};
use crate::server::{ServerActor, ServerArgs, ServerMsg, ServerSpec, ServerState, ServerStatus};
use crate::transport::ConnectOptions;

/// One server as the harness knows it.
#[derive(Clone)]
pub struct ServerEntry {
    /// The server's current actor.
    pub actor: ActorRef<ServerMsg>,
    /// Its status, written by the actor.
    pub status: Arc<RwLock<ServerStatus>>,
    /// What it was built from.
    pub spec: ServerSpec,
    /// Its ready connection, if any (see [`LiveSlot`]).
    pub live: LiveSlot,
}

/// The servers, by id, in config order.
#[derive(Default)]
pub struct ServerTable {
    pub(crate) entries: HashMap<String, ServerEntry>,
    pub(crate) order: Vec<String>,
    /// Server id by actor id: every call actor's exit is a supervision event, so the
    /// lookup must not scan the table.
    by_actor: HashMap<ActorId, String>,
}

impl ServerTable {
    /// The entries in config order.
    pub fn in_order(&self) -> impl Iterator<Item = &ServerEntry> {
        self.order.iter().filter_map(|id| self.entries.get(id))
    }

    fn id_of(&self, cell: &ActorCell) -> Option<String> {
        self.by_actor.get(&cell.get_id()).cloned()
    }
}

/// Messages of the harness supervisor.
pub enum HarnessMsg {
    /// Start a new server.
    AddServer(Box<ServerConfig>, RpcReplyPort<Result<(), HarnessError>>),
    /// Stop a server gracefully and forget it.
    RemoveServer(String, RpcReplyPort<Result<(), HarnessError>>),
    /// Restart a server now, forgetting its restart history.
    RestartServer(String, RpcReplyPort<Result<(), HarnessError>>),
    /// Start an input handler for `method` and declare its capability.
    RegisterHandler(
        String,
        Arc<dyn InputHandler>,
        RpcReplyPort<Result<(), HarnessError>>,
    ),
    /// Stop every server gracefully, flush the audit trail and the cache, then stop.
    Shutdown(RpcReplyPort<()>),
}

/// What the supervisor is started with.
pub struct SupervisorArgs {
    pub(crate) servers: Vec<ServerConfig>,
    pub(crate) options: ConnectOptions,
    pub(crate) table: Arc<RwLock<ServerTable>>,
    pub(crate) hooks: ServerHooks,
    pub(crate) cache: Arc<SchemaCache>,
    pub(crate) policy: Arc<RwLock<Policy>>,
    pub(crate) audit: AuditConfig,
    pub(crate) input_timeout: Duration,
    pub(crate) events: broadcast::Sender<HarnessEvent>,
    /// Filled in `pre_start` with the service actors.
    pub(crate) services: Arc<OnceLock<Services>>,
    /// Calls in flight (shutdown waits for them before the last audit flush).
    pub(crate) inflight: Arc<std::sync::atomic::AtomicUsize>,
}

/// The supervisor's state.
pub struct SupervisorState {
    options: ConnectOptions,
    table: Arc<RwLock<ServerTable>>,
    hooks: ServerHooks,
    services: Services,
    input_timeout: Duration,
    /// Registered handlers by method, and the capability each declares.
    handlers: HashMap<String, Arc<dyn InputHandler>>,
    inflight: Arc<std::sync::atomic::AtomicUsize>,
    shutting_down: bool,
}

/// The root actor; see the module docs.
pub struct HarnessSupervisor;

impl Actor for HarnessSupervisor {
    type Msg = HarnessMsg;
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<HarnessMsg>,
        args: SupervisorArgs,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        let cell = myself.get_cell();
        let registry_args = RegistryArgs {
            cache: args.cache,
            events: args.events,
        };
        let (registry, _) =
            Actor::spawn_linked(None, RegistryActor, registry_args, cell.clone()).await?;
        let (permissions, _) =
            Actor::spawn_linked(None, PermissionActor, args.policy, cell.clone()).await?;
        let (audit, audit_sink) = crate::audit::spawn(args.audit, cell).await?;
        let services = Services {
            registry: registry.clone(),
            permissions,
            audit,
            audit_sink,
        };
        let _ = args.hooks.registry.set(registry);
        let _ = args.services.set(services.clone());
        let mut state = SupervisorState {
            options: args.options,
            table: args.table,
            hooks: args.hooks,
            services,
            input_timeout: args.input_timeout,
            handlers: HashMap::new(),
            inflight: args.inflight,
            shutting_down: false,
        };
        for config in args.servers {
            state.add(&myself, config).await?;
        }
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<HarnessMsg>,
        msg: HarnessMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            HarnessMsg::AddServer(config, reply) => {
                let _ = reply.send(state.add(&myself, *config).await);
            }
            HarnessMsg::RemoveServer(id, reply) => {
                let _ = reply.send(state.remove(&id).await);
            }
            HarnessMsg::RestartServer(id, reply) => {
                let actor = state.table.read().entries.get(&id).map(|e| e.actor.clone());
                let result = match actor {
                    Some(actor) => actor
                        .call(ServerMsg::Restart, Some(Duration::from_secs(30)))
                        .await
                        .map(|_| ())
                        .map_err(|e| HarnessError::Spawn(e.to_string())),
                    None => Err(HarnessError::UnknownServer(id)),
                };
                let _ = reply.send(result);
            }
            HarnessMsg::RegisterHandler(method, handler, reply) => {
                let _ = reply.send(state.register(&myself, method, handler).await);
            }
            HarnessMsg::Shutdown(reply) => {
                state.shutdown().await;
                let _ = reply.send(());
                myself.stop(None);
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<HarnessMsg>,
        event: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        // Overrides ractor's default, which would stop the whole harness with one server.
        let cell = match &event {
            SupervisionEvent::ActorFailed(cell, _)
            | SupervisionEvent::ActorTerminated(cell, _, _) => cell,
            _ => return Ok(()),
        };
        if state.shutting_down {
            return Ok(());
        }
        let Some(id) = state.table.read().id_of(cell) else {
            return Ok(());
        };
        tracing::warn!(server = %id, ?event, "server actor died; rebuilding it from its config");
        state.rebuild(&myself, &id).await;
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<HarnessMsg>,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        state.shutdown().await;
        Ok(())
    }
}

impl SupervisorState {
    async fn spawn_server(
        &self,
        myself: &ActorRef<HarnessMsg>,
        spec: ServerSpec,
        status: Arc<RwLock<ServerStatus>>,
        live: LiveSlot,
    ) -> Result<ActorRef<ServerMsg>, HarnessError> {
        // A rebuilt actor starts with nothing published.
        *live.write() = None;
        let args = ServerArgs { spec, status, live };
        Actor::spawn_linked(None, ServerActor, args, myself.get_cell())
            .await
            .map(|(actor, _)| actor)
            .map_err(|e| HarnessError::Spawn(e.to_string()))
    }

    async fn add(
        &mut self,
        myself: &ActorRef<HarnessMsg>,
        config: ServerConfig,
    ) -> Result<(), HarnessError> {
        super::validate_server(&config)?;
        if self.table.read().entries.contains_key(&config.id) {
            return Err(HarnessError::DuplicateServer(config.id));
        }
        let id = config.id.clone();
        let spec = ServerSpec {
            config,
            options: self.options.clone(),
            hooks: self.hooks.clone(),
        };
        let status = Arc::new(RwLock::new(ServerStatus::starting(&id)));
        let live = LiveSlot::default();
        let actor = self
            .spawn_server(myself, spec.clone(), status.clone(), live.clone())
            .await?;
        let mut table = self.table.write();
        table.order.push(id.clone());
        table.by_actor.insert(actor.get_id(), id.clone());
        table.entries.insert(
            id,
            ServerEntry {
                actor,
                status,
                spec,
                live,
            },
        );
        Ok(())
    }

    async fn rebuild(&mut self, myself: &ActorRef<HarnessMsg>, id: &str) {
        let Some(entry) = self.table.read().entries.get(id).cloned() else {
            return;
        };
        // Every listed server keeps a live actor: a dead one could not even be restarted.
        {
            let mut s = entry.status.write();
            s.actor_rebuilds += 1;
            s.state = ServerState::Starting;
        }
        match self
            .spawn_server(
                myself,
                entry.spec.clone(),
                entry.status.clone(),
                entry.live.clone(),
            )
            .await
        {
            Ok(actor) => {
                let mut table = self.table.write();
                let old = table
                    .entries
                    .get_mut(id)
                    .map(|e| std::mem::replace(&mut e.actor, actor.clone()));
                if let Some(old) = old {
                    table.by_actor.remove(&old.get_id());
                    table.by_actor.insert(actor.get_id(), id.to_string());
                }
            }
            Err(e) => {
                tracing::error!(server = %id, error = %e, "could not rebuild the server actor");
                let mut s = entry.status.write();
                s.state = ServerState::Failed;
                s.last_error = Some(e.to_string());
            }
        }
    }

    async fn remove(&mut self, id: &str) -> Result<(), HarnessError> {
        let entry = {
            let mut table = self.table.write();
            table.order.retain(|o| o != id);
            let entry = table.entries.remove(id);
            if let Some(e) = &entry {
                table.by_actor.remove(&e.actor.get_id());
            }
            entry
        };
        let entry = entry.ok_or_else(|| HarnessError::UnknownServer(id.to_string()))?;
        stop_server(&entry).await;
        let _ = self
            .services
            .registry
            .send_message(RegistryMsg::Invalidate(id.to_string()));
        Ok(())
    }

    async fn shutdown(&mut self) {
        if self.shutting_down {
            return;
        }
        self.shutting_down = true;
        let entries: Vec<ServerEntry> = self.table.read().in_order().cloned().collect();
        // Concurrently: one server slow to die must not hold the others up.
        let mut stops = tokio::task::JoinSet::new();
        for entry in entries.into_iter().rev() {
            stops.spawn(async move { stop_server(&entry).await });
        }
        while stops.join_next().await.is_some() {}
        // Calls still running end quickly now (their servers are gone); wait for their
        // `finished` records before the last flush.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while self.inflight.load(std::sync::atomic::Ordering::SeqCst) > 0
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Everything already sent is now handled: records written, cache entries stored.
        let _ = self
            .services
            .registry
            .call(RegistryMsg::Flush, Some(Duration::from_secs(30)))
            .await;
        let _ = self
            .services
            .audit
            .call(AuditMsg::Flush, Some(Duration::from_secs(30)))
            .await;
    }

    async fn register(
        &mut self,
        myself: &ActorRef<HarnessMsg>,
        method: String,
        handler: Arc<dyn InputHandler>,
    ) -> Result<(), HarnessError> {
        let Some(capability) = capability_name(&method) else {
            return Err(HarnessError::Config(format!(
                "no input method {method:?}; use elicitation/create, sampling/createMessage or roots/list"
            )));
        };
        let args = InputHandlerArgs {
            handler: handler.clone(),
            timeout: self.input_timeout,
        };
        let (actor, _) = Actor::spawn_linked(None, InputHandlerActor, args, myself.get_cell())
            .await
            .map_err(|e| HarnessError::Spawn(e.to_string()))?;
        if let Some(old) = self.hooks.handlers.write().insert(method.clone(), actor) {
            old.stop(None);
        }
        self.handlers.insert(method, handler.clone());
        let mut caps = serde_json::Map::new();
        for (m, h) in &self.handlers {
            if let Some(name) = capability_name(m) {
                caps.insert(name.to_string(), h.capability());
            }
        }
        tracing::info!(capability, "input handler registered");
        *self.hooks.capabilities.write() = Value::Object(caps);
        Ok(())
    }
}

async fn stop_server(entry: &ServerEntry) {
    let limit = entry.spec.options.shutdown_grace * 2 + Duration::from_secs(15);
    let _ = entry.actor.call(ServerMsg::Shutdown, Some(limit)).await;
    entry.actor.kill();
}
