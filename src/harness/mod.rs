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

mod error;
mod supervisor;

use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use ractor::{Actor, ActorCell, ActorRef};
use serde_json::Value;

pub use error::HarnessError;
pub use supervisor::{HarnessMsg, HarnessSupervisor, ServerEntry, ServerTable};

use crate::config::{HarnessConfig, ServerConfig};
use crate::protocol::Implementation;
use crate::server::{ServerError, ServerMsg, ServerStatus};
use crate::transport::ConnectOptions;
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
        let options = ConnectOptions {
            client_info: config
                .client_info
                .clone()
                .unwrap_or_else(Implementation::harness),
            ..ConnectOptions::default()
        };
        let table = Arc::new(RwLock::new(ServerTable::default()));
        let args = SupervisorArgs {
            servers: config.servers,
            options,
            table: table.clone(),
        };
        let spawned = match parent {
            Some(parent) => Actor::spawn_linked(None, HarnessSupervisor, args, parent).await,
            None => Actor::spawn(None, HarnessSupervisor, args).await,
        };
        let (supervisor, _) = spawned.map_err(|e| HarnessError::Spawn(e.to_string()))?;
        Ok(HarnessHandle {
            inner: Arc::new(Inner { supervisor, table }),
        })
    }
}

/// Checks what the harness relies on in a server's config.
pub(crate) fn validate_server(config: &ServerConfig) -> Result<(), HarnessError> {
    let id = &config.id;
    if id.is_empty()
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
    table: Arc<RwLock<ServerTable>>,
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

    /// Starts a new server.
    pub async fn add_server(&self, config: ServerConfig) -> Result<(), HarnessError> {
        self.ask(
            |r| HarnessMsg::AddServer(Box::new(config), r),
            Duration::from_secs(60),
        )
        .await?
    }

    /// Stops a server gracefully and forgets it.
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

    /// A snapshot of every server's status, in config order. Reads shared state: never
    /// waits on an actor.
    pub fn status(&self) -> Vec<ServerStatus> {
        self.inner
            .table
            .read()
            .in_order()
            .map(|e| e.status.read().clone())
            .collect()
    }

    /// One server's status.
    pub fn server_status(&self, id: &str) -> Option<ServerStatus> {
        self.inner
            .table
            .read()
            .entries
            .get(id)
            .map(|e| e.status.read().clone())
    }

    /// The server's current actor (for fault injection and direct messages). After the
    /// actor is rebuilt, this returns the new one.
    pub fn server_actor(&self, id: &str) -> Option<ActorRef<ServerMsg>> {
        self.inner
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
        let (actor, configured) = {
            let table = self.inner.table.read();
            let entry = table
                .entries
                .get(server)
                .ok_or_else(|| HarnessError::UnknownServer(server.to_string()))?;
            (entry.actor.clone(), entry.spec.config.timeout)
        };
        let (tx, rx) = ractor::concurrency::oneshot();
        let message = ServerMsg::Request {
            method: method.to_string(),
            params,
            timeout,
            reply: tx.into(),
        };
        let unavailable = || {
            HarnessError::Server(ServerError::Unavailable {
                server: server.to_string(),
            })
        };
        actor.send_message(message).map_err(|_| unavailable())?;
        // The server answers by its deadline; the margin only guards against a wedged actor.
        let limit = timeout.unwrap_or(configured) + Duration::from_secs(5);
        match tokio::time::timeout(limit, rx).await {
            Ok(Ok(result)) => result.map_err(HarnessError::Server),
            // The actor died holding the request (it is being rebuilt).
            Ok(Err(_)) => Err(unavailable()),
            Err(_) => Err(HarnessError::Server(ServerError::Transport {
                server: server.to_string(),
                source: crate::transport::TransportError::Timeout(limit),
            })),
        }
    }

    /// Stops every server gracefully (stdin EOF, SIGTERM, SIGKILL, reap), then the
    /// harness; returns when no server process is left.
    pub async fn shutdown(&self) {
        let _ = self
            .ask(HarnessMsg::Shutdown, Duration::from_secs(120))
            .await;
    }
}
