//! What every call needs, shared by the handle and the call actors: the server table,
//! the policy snapshot, the cache, the service actors, and the call settings. Reads
//! here never go through a mailbox.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use parking_lot::RwLock;
use ractor::ActorRef;
use serde_json::Value;
use tokio::sync::broadcast;

use super::supervisor::ServerTable;
use crate::audit::{AuditConfig, AuditMsg, AuditSink};
use crate::permission::{PermissionMsg, Policy};
use crate::registry::cache::SchemaCache;
use crate::registry::route::RouteView;
use crate::registry::{HarnessEvent, RegistryMsg};
use crate::server::actor::run_request;
use crate::server::{ServerError, ServerHooks, ServerMsg, ServerState};
use crate::transport::TransportError;

/// Settings of the call path.
#[derive(Clone, Debug)]
pub struct CallSettings {
    /// Most `input_required` rounds of one logical call, failover included.
    pub round_cap: usize,
    /// Deadline of one input handler's answer.
    pub input_timeout: Duration,
    /// Audit settings (redaction).
    pub audit: AuditConfig,
}

/// The harness's service actors.
#[derive(Clone)]
pub struct Services {
    pub(crate) registry: ActorRef<RegistryMsg>,
    pub(crate) permissions: ActorRef<PermissionMsg>,
    pub(crate) audit: ActorRef<AuditMsg>,
    pub(crate) audit_sink: AuditSink,
}

/// One server as routing and listing see it.
#[derive(Clone, Debug)]
pub struct ServerView {
    pub(crate) id: String,
    pub(crate) tags: Vec<String>,
    pub(crate) route: RouteView,
    pub(crate) state: ServerState,

    pub(crate) trust_annotations: bool,
    /// Whether its profile lists tools, prompts, resources (unknown while starting).
    pub(crate) offered: Option<[bool; 3]>,
}

impl ServerView {
    /// Whether calls may be routed to it at all (not `failed`, not `stopped`).
    pub fn routable(&self) -> bool {
        !matches!(self.state, ServerState::Failed | ServerState::Stopped)
    }

    /// Whether it offers this kind of list (a known profile without the capability
    /// means no; an unknown profile, while starting, means ask).
    pub fn offers(&self, capability: &str) -> bool {
        let known = |i: usize| self.offered.is_none_or(|o| o[i]);
        match capability {
            "tools" => known(0),
            "prompts" => known(1),
            "resources" => known(2),
            _ => true,
        }
    }
}

/// Shared state of one harness.
pub struct Core {
    pub(crate) table: Arc<RwLock<ServerTable>>,
    pub(crate) policy: Arc<RwLock<Policy>>,
    pub(crate) cache: Arc<SchemaCache>,
    pub(crate) hooks: ServerHooks,
    pub(crate) services: Services,
    pub(crate) settings: CallSettings,
    pub(crate) next_call: AtomicU64,
    /// Calls between their `started` and `finished` records.
    pub(crate) inflight: Arc<std::sync::atomic::AtomicUsize>,
    pub(crate) events: broadcast::Sender<HarnessEvent>,
}

impl Core {
    /// The servers in config order.
    pub fn servers(&self) -> Vec<ServerView> {
        let table = self.table.read();
        table
            .in_order()
            .enumerate()
            .map(|(order, e)| {
                let status = e.status.read();
                let c = &e.spec.config;
                ServerView {
                    id: c.id.clone(),
                    tags: c.tags.clone(),
                    route: RouteView {
                        server: c.id.clone(),
                        priority: c.priority,
                        order,
                        ready: status.state == ServerState::Ready,
                    },
                    state: status.state,

                    trust_annotations: c.trust_annotations,
                    offered: status.profile.as_ref().map(|p| {
                        let c = p.capabilities();
                        [
                            c.get("tools").is_some(),
                            c.get("prompts").is_some(),
                            c.get("resources").is_some(),
                        ]
                    }),
                }
            })
            .collect()
    }

    /// One request to one server, through its actor, with this request's capabilities.
    pub async fn send(
        &self,
        server: &str,
        method: &str,
        params: Option<Value>,
        timeout: Option<Duration>,
        capabilities: Option<Value>,
    ) -> Result<Value, ServerError> {
        let (actor, configured, live) = {
            let table = self.table.read();
            let Some(entry) = table.entries.get(server) else {
                return Err(ServerError::Stopped {
                    server: server.to_string(),
                });
            };
            (
                entry.actor.clone(),
                entry.spec.config.timeout,
                entry.live.read().clone(),
            )
        };
        // Ready and open: straight to the connection, no mailbox hop. A connection that
        // has just ended goes through the actor, which holds the request for the restart.
        if let Some(live) = live.filter(|l| !l.conn.is_closed()) {
            let timeout = timeout.unwrap_or(configured);
            return run_request(
                &live,
                &actor,
                method,
                params,
                timeout,
                capabilities.as_ref(),
            )
            .await;
        }
        let (tx, rx) = ractor::concurrency::oneshot();
        let message = ServerMsg::Request {
            method: method.to_string(),
            params,
            timeout,
            capabilities,
            reply: tx.into(),
        };
        let unavailable = || ServerError::Unavailable {
            server: server.to_string(),
        };
        actor.send_message(message).map_err(|_| unavailable())?;
        // The server answers by its deadline; the margin only guards against a wedged actor.
        let limit = timeout
            .unwrap_or(configured)
            .saturating_add(Duration::from_secs(5));
        match tokio::time::timeout(limit, rx).await {
            Ok(Ok(result)) => result,
            // The actor died holding the request (it is being rebuilt).
            Ok(Err(_)) => Err(unavailable()),
            Err(_) => Err(ServerError::Transport {
                server: server.to_string(),
                source: TransportError::Timeout(limit),
            }),
        }
    }

    /// The capabilities the registered handlers declare.
    pub fn capabilities(&self) -> Value {
        self.hooks.capabilities.read().clone()
    }
}
