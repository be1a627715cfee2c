//! The harness as embedders use it: [`Harness::spawn`] (or [`Harness::spawn_linked`]
//! under the embedder's own supervisor) starts the actor tree and returns a
//! [`HarnessHandle`].
//!
//! ```text
//! HarnessSupervisor            root; rebuilds server actors, never stops for a child
//! └── ServerActor × servers    stable address; restart policy; request queue; status
//!     └── ConnectionActor      the live stdio process or HTTP client; fails when it breaks
//! ```
//!
//! Lifecycle: [`HarnessHandle::shutdown`] stops every server gracefully and returns when
//! no server process is left. Dropping the last handle kills the tree, and with it every
//! server's process group (synchronously, through each connection's kill guard). When the
//! harness is spawned under an embedder's supervisor, stopping that supervisor stops the
//! harness the same way.

pub(crate) mod core;
mod error;
mod supervisor;

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::RwLock;
use ractor::{Actor, ActorCell, ActorRef};
use serde_json::Value;
use tokio::sync::broadcast;

pub use error::HarnessError;
pub use supervisor::{HarnessMsg, HarnessSupervisor, ServerEntry, ServerTable};

use crate::call::actor::{CallActor, CallArgs};
use crate::call::handler::InputHandler;
use crate::call::{CallKind, Caller, ToolInfo};
use crate::config::{HarnessConfig, ServerConfig};
use crate::permission::{PermissionMsg, Policy};
use crate::protocol::Implementation;
use crate::registry::HarnessEvent;
use crate::registry::cache::{CacheStats, SchemaCache};
use crate::server::{ServerHooks, ServerMsg, ServerStatus};
use crate::transport::ConnectOptions;
use core::{CallSettings, Core};
use supervisor::SupervisorArgs;

/// Starts harnesses.
pub struct Harness;

impl Harness {
    /// Starts the harness as a root actor tree.
    pub async fn spawn(config: HarnessConfig) -> Result<HarnessHandle, HarnessError> {
        Self::start(config, None).await
    }

    /// Starts the harness as a child of `supervisor`: when the embedder stops its actor,
    /// the harness and every server process below it stop too.
    pub async fn spawn_linked(
        config: HarnessConfig,
        supervisor: ActorCell,
    ) -> Result<HarnessHandle, HarnessError> {
        Self::start(config, Some(supervisor)).await
    }

    async fn start(
        config: HarnessConfig,
        parent: Option<ActorCell>,
    ) -> Result<HarnessHandle, HarnessError> {
        let mut seen = std::collections::HashSet::new();
        for server in &config.servers {
            validate_server(server)?;
            if !seen.insert(server.id.as_str()) {
                return Err(HarnessError::DuplicateServer(server.id.clone()));
            }
        }
        if config.round_cap == 0 {
            return Err(HarnessError::Config("round_cap must be at least 1".into()));
        }
        let options = ConnectOptions {
            client_info: config
                .client_info
                .clone()
                .unwrap_or_else(Implementation::harness),
            ..ConnectOptions::default()
        };
        let table = Arc::new(RwLock::new(ServerTable::default()));
        let hooks = ServerHooks::default();
        let cache = Arc::new(SchemaCache::new(
            config.cache.default_ttl,
            config.cache.dir.clone(),
        ));
        let policy = Arc::new(RwLock::new(Policy::new(config.permissions.clone())));
        let (events, _) = broadcast::channel(256);
        let services = Arc::new(OnceLock::new());
        let inflight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let args = SupervisorArgs {
            servers: config.servers,
            options,
            table: table.clone(),
            hooks: hooks.clone(),
            cache: cache.clone(),
            policy: policy.clone(),
            audit: config.audit.clone(),
            input_timeout: config.input_timeout,
            events: events.clone(),
            services: services.clone(),
            inflight: inflight.clone(),
        };
        let spawned = match parent {
            Some(parent) => Actor::spawn_linked(None, HarnessSupervisor, args, parent).await,
            None => Actor::spawn(None, HarnessSupervisor, args).await,
        };
        let (supervisor, _) = spawned.map_err(|e| HarnessError::Spawn(e.to_string()))?;
        let services = services
            .get()
            .cloned()
            .ok_or_else(|| HarnessError::Spawn("service actors did not start".into()))?;
        let core = Arc::new(Core {
            table,
            policy,
            cache,
            hooks,
            services,
            settings: CallSettings {
                round_cap: config.round_cap,
                input_timeout: config.input_timeout,
                audit: config.audit,
            },
            next_call: AtomicU64::new(1),
            inflight,
            events,
        });
        Ok(HarnessHandle {
            inner: Arc::new(Inner { supervisor, core }),
        })
    }
}

/// Checks what the harness relies on in a server's config.
pub(crate) fn validate_server(config: &ServerConfig) -> Result<(), HarnessError> {
    let id = &config.id;
    if id.is_empty()
        || id == "."
        || id == ".."
        || !id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
    {
        return Err(HarnessError::Config(format!(
            "server id {id:?} must be non-empty and use only letters, digits, '-', '_' and '.'"
        )));
    }
    if id.contains("__") {
        return Err(HarnessError::Config(format!(
            "server id {id:?} must not contain \"__\", which separates server and tool in qualified names"
        )));
    }
    if config.timeout.is_zero() {
        return Err(HarnessError::Config(format!(
            "server {id:?}: timeout must be more than zero"
        )));
    }
    Ok(())
}

struct Inner {
    supervisor: ActorRef<HarnessMsg>,
    core: Arc<Core>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Killing the root kills every actor below it; each connection's kill guard then
        // SIGKILLs its process group synchronously.
        self.supervisor.kill();
    }
}

/// The embedder's handle on a running harness. Cheap to clone; the harness lives while
/// any clone does (or until [`HarnessHandle::shutdown`]).
#[derive(Clone)]
pub struct HarnessHandle {
    inner: Arc<Inner>,
}

impl HarnessHandle {
    async fn ask<T: Send + 'static>(
        &self,
        build: impl FnOnce(ractor::RpcReplyPort<T>) -> HarnessMsg,
        limit: Duration,
    ) -> Result<T, HarnessError> {
        match self.inner.supervisor.call(build, Some(limit)).await {
            Ok(ractor::rpc::CallResult::Success(v)) => Ok(v),
            Ok(_) | Err(_) => Err(HarnessError::ShutDown),
        }
    }

    fn core(&self) -> &Arc<Core> {
        &self.inner.core
    }

    /// Calls a tool by qualified (`server__tool`) or bare name: authorized, routed by
    /// priority with fallback, `input_required` rounds driven, audited.
    pub async fn call_tool(
        &self,
        caller: &Caller,
        name: &str,
        args: Value,
    ) -> Result<Value, HarnessError> {
        self.call(caller, CallKind::Tool, name, args).await
    }

    /// Gets a prompt (same path as [`HarnessHandle::call_tool`]).
    pub async fn get_prompt(
        &self,
        caller: &Caller,
        name: &str,
        args: Value,
    ) -> Result<Value, HarnessError> {
        self.call(caller, CallKind::Prompt, name, args).await
    }

    /// Reads a resource by uri, from the servers that list it.
    pub async fn read_resource(&self, caller: &Caller, uri: &str) -> Result<Value, HarnessError> {
        self.call(caller, CallKind::Resource, uri, Value::Null)
            .await
    }

    async fn call(
        &self,
        caller: &Caller,
        kind: CallKind,
        name: &str,
        args: Value,
    ) -> Result<Value, HarnessError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let args = CallArgs {
            core: self.core().clone(),
            caller: caller.clone(),
            kind,
            name: name.to_string(),
            args,
            reply,
        };
        Actor::spawn_linked(None, CallActor, args, self.inner.supervisor.get_cell())
            .await
            .map_err(|_| HarnessError::ShutDown)?;
        answer.await.unwrap_or(Err(HarnessError::ShutDown))
    }

    /// The tools `caller` may call, each with its qualified name, bare name, server and
    /// definition, sorted by qualified name.
    pub async fn list_tools(&self, caller: &Caller) -> Result<Vec<ToolInfo>, HarnessError> {
        crate::call::list(self.core(), caller, CallKind::Tool, None).await
    }

    /// [`HarnessHandle::list_tools`], only on servers tagged `tag`.
    pub async fn list_tools_tagged(
        &self,
        caller: &Caller,
        tag: &str,
    ) -> Result<Vec<ToolInfo>, HarnessError> {
        crate::call::list(self.core(), caller, CallKind::Tool, Some(tag)).await
    }

    /// The prompts `caller` may get.
    pub async fn list_prompts(&self, caller: &Caller) -> Result<Vec<ToolInfo>, HarnessError> {
        crate::call::list(self.core(), caller, CallKind::Prompt, None).await
    }

    /// One tool's definition (`inputSchema` and all), by qualified or bare name; a bare
    /// name gives the one the call would be routed to.
    pub async fn get_tool_schema(
        &self,
        caller: &Caller,
        name: &str,
    ) -> Result<ToolInfo, HarnessError> {
        let candidates = crate::call::route(self.core(), caller, CallKind::Tool, name).await?;
        let tools = self.list_tools(caller).await?;
        candidates
            .iter()
            .find_map(|c| {
                tools
                    .iter()
                    .find(|t| t.server == c.server && t.name == c.item)
                    .cloned()
            })
            .ok_or_else(|| HarnessError::NoRoute {
                tool: name.to_string(),
            })
    }

    /// Registers the handler of an input method (`elicitation/create`,
    /// `sampling/createMessage`, `roots/list`); the harness then declares its capability.
    /// Legacy servers learn of it when they next connect.
    pub async fn register_input_handler(
        &self,
        method: &str,
        handler: Arc<dyn InputHandler>,
    ) -> Result<(), HarnessError> {
        let method = method.to_string();
        self.ask(
            |r| HarnessMsg::RegisterHandler(method, handler, r),
            Duration::from_secs(30),
        )
        .await?
    }

    /// Grants `agent` the `tools` (or `*`) on `selector` (server id, `tag:NAME`, `*`).
    pub async fn grant(
        &self,
        agent: &str,
        selector: &str,
        tools: &[&str],
    ) -> Result<(), HarnessError> {
        let (agent, selector) = (agent.to_string(), selector.to_string());
        let tools = tools.iter().map(|t| t.to_string()).collect();
        let msg = |reply| PermissionMsg::Grant {
            agent,
            selector,
            tools,
            reply,
        };
        self.core()
            .services
            .permissions
            .call(msg, Some(Duration::from_secs(10)))
            .await
            .map(|_| ())
            .map_err(|_| HarnessError::ShutDown)
    }

    /// Revokes `agent`'s grant on `selector` (all of them when `None`).
    pub async fn revoke(&self, agent: &str, selector: Option<&str>) -> Result<(), HarnessError> {
        let (agent, selector) = (agent.to_string(), selector.map(String::from));
        let msg = |reply| PermissionMsg::Revoke {
            agent,
            selector,
            reply,
        };
        self.core()
            .services
            .permissions
            .call(msg, Some(Duration::from_secs(10)))
            .await
            .map(|_| ())
            .map_err(|_| HarnessError::ShutDown)
    }

    /// Entries, bytes, hits and misses of the schema cache, per layer.
    pub fn cache_stats(&self) -> CacheStats {
        self.core().cache.stats()
    }

    /// Events such as [`HarnessEvent::ToolsChanged`].
    pub fn subscribe(&self) -> broadcast::Receiver<HarnessEvent> {
        self.core().events.subscribe()
    }

    /// Starts a new server.
    pub async fn add_server(&self, config: ServerConfig) -> Result<(), HarnessError> {
        self.ask(
            |r| HarnessMsg::AddServer(Box::new(config), r),
            Duration::from_secs(60),
        )
        .await?
    }

    /// Stops a server gracefully and forgets it (and its cache entries).
    pub async fn remove_server(&self, id: &str) -> Result<(), HarnessError> {
        let id = id.to_string();
        self.ask(
            |r| HarnessMsg::RemoveServer(id, r),
            Duration::from_secs(120),
        )
        .await?
    }

    /// Restarts a server now, forgetting its restart history; brings a `failed` (or
    /// disabled) server back.
    pub async fn restart_server(&self, id: &str) -> Result<(), HarnessError> {
        let id = id.to_string();
        self.ask(
            |r| HarnessMsg::RestartServer(id, r),
            Duration::from_secs(60),
        )
        .await?
    }

    /// A snapshot of every server's status (with its discover or `initialize` profile),
    /// in config order. Reads shared state: never waits on an actor.
    pub fn status(&self) -> Vec<ServerStatus> {
        self.core()
            .table
            .read()
            .in_order()
            .map(|e| e.status.read().clone())
            .collect()
    }

    /// One server's status.
    pub fn server_status(&self, id: &str) -> Option<ServerStatus> {
        self.core()
            .table
            .read()
            .entries
            .get(id)
            .map(|e| e.status.read().clone())
    }

    /// The server's current actor (for fault injection and direct messages). After the
    /// actor is rebuilt, this returns the new one.
    pub fn server_actor(&self, id: &str) -> Option<ActorRef<ServerMsg>> {
        self.core()
            .table
            .read()
            .entries
            .get(id)
            .map(|e| e.actor.clone())
    }

    /// The harness's root actor.
    pub fn supervisor(&self) -> ActorRef<HarnessMsg> {
        self.inner.supervisor.clone()
    }

    /// Sends one raw request to one server (the `_meta` envelope is added) and returns
    /// its result. Waits while the server (re)starts, up to the server's `timeout`.
    /// No authorization, routing, rounds or audit: this is the operator's tool.
    pub async fn request(
        &self,
        server: &str,
        method: &str,
        params: Option<Value>,
    ) -> Result<Value, HarnessError> {
        self.request_with_timeout(server, method, params, None)
            .await
    }

    /// [`HarnessHandle::request`] with a deadline other than the server's `timeout`.
    pub async fn request_with_timeout(
        &self,
        server: &str,
        method: &str,
        params: Option<Value>,
        timeout: Option<Duration>,
    ) -> Result<Value, HarnessError> {
        if !self.core().table.read().entries.contains_key(server) {
            return Err(HarnessError::UnknownServer(server.to_string()));
        }
        let caps = Some(self.core().capabilities());
        self.core()
            .send(server, method, params, timeout, caps)
            .await
            .map_err(HarnessError::Server)
    }

    /// Stops every server gracefully (stdin EOF, SIGTERM, SIGKILL, reap), writes every
    /// audit record and cache entry, then stops the harness; returns when no server
    /// process is left.
    pub async fn shutdown(&self) {
        let _ = self
            .ask(HarnessMsg::Shutdown, Duration::from_secs(120))
            .await;
    }
}
