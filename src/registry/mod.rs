//! The registry: what the servers offer, cached by their hints, and where a call goes.
//!
//! Reads never queue behind this actor: lists are read from the shared
//! [`cache::SchemaCache`] and fetched by the caller's own task on a miss. The
//! [`RegistryActor`] is the cache's one writer (stores, invalidations on
//! `list_changed`, purges of removed servers) and tracks each server's tool-schema hash
//! (SHA-256 of canonical JSON), emitting [`HarnessEvent::ToolsChanged`] when it changes.
//! [`route`] orders the candidates of a call.

pub mod cache;
pub mod route;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::Value;
use tokio::sync::broadcast;

use cache::{CacheKey, SchemaCache, sha256_hex};

/// Something an embedder may want to hear about.
#[derive(Clone, Debug, PartialEq)]
pub enum HarnessEvent {
    /// A server's tool schemas changed (the hash of its full tool list differs from the
    /// last one seen).
    ToolsChanged {
        /// Server id.
        server: String,
        /// The new hash.
        hash: String,
    },
}

/// Messages of the registry actor.
pub enum RegistryMsg {
    /// Store a fetched result (dropped when the server was invalidated since
    /// `generation`).
    Put {
        /// Where.
        key: CacheKey,
        /// For how long.
        ttl: Duration,
        /// The result.
        value: Value,
        /// The server's cache generation when the fetch started.
        generation: u64,
    },
    /// Drop a server's entries (`list_changed`, removal).
    Invalidate(String),
    /// A server's full tool list was read; compare its hash with the last one.
    ToolsListed {
        /// Server id.
        server: String,
        /// The tools, in the server's order.
        tools: Vec<Value>,
    },
    /// Answers when every earlier message is handled (and so written to disk).
    Flush(RpcReplyPort<()>),
}

/// What the registry actor holds.
pub struct RegistryState {
    cache: Arc<SchemaCache>,
    hashes: HashMap<String, String>,
    events: broadcast::Sender<HarnessEvent>,
}

/// The cache's writer; see the module docs.
pub struct RegistryActor;

/// What the registry actor starts with.
pub struct RegistryArgs {
    /// The shared cache.
    pub cache: Arc<SchemaCache>,
    /// Where events go.
    pub events: broadcast::Sender<HarnessEvent>,
}

impl Actor for RegistryActor {
    type Msg = RegistryMsg;
    type State = RegistryState;
    type Arguments = RegistryArgs;

    async fn pre_start(
        &self,
        _: ActorRef<RegistryMsg>,
        args: RegistryArgs,
    ) -> Result<RegistryState, ActorProcessingErr> {
        Ok(RegistryState {
            cache: args.cache,
            hashes: HashMap::new(),
            events: args.events,
        })
    }

    async fn handle(
        &self,
        _: ActorRef<RegistryMsg>,
        msg: RegistryMsg,
        state: &mut RegistryState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            RegistryMsg::Put {
                key,
                ttl,
                value,
                generation,
            } => state.cache.put(key, ttl, value, generation),
            RegistryMsg::Invalidate(server) => {
                tracing::info!(server = %server, "server lists changed; cache entries dropped");
                state.cache.invalidate(&server);
            }
            RegistryMsg::ToolsListed { server, tools } => {
                let hash = sha256_hex(canonical_json(&Value::Array(tools)).as_bytes());
                let previous = state.hashes.insert(server.clone(), hash.clone());
                if previous.as_ref().is_some_and(|p| *p != hash) {
                    tracing::info!(server = %server, %hash, "tool schemas changed");
                    let _ = state
                        .events
                        .send(HarnessEvent::ToolsChanged { server, hash });
                }
            }
            RegistryMsg::Flush(reply) => {
                let _ = reply.send(());
            }
        }
        Ok(())
    }
}

/// JSON with object keys sorted at every depth: the same schema always hashes the same.
pub fn canonical_json(v: &Value) -> String {
    fn sorted(v: &Value) -> Value {
        match v {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                let mut out = serde_json::Map::new();
                for k in keys {
                    out.insert(k.clone(), sorted(&map[k]));
                }
                Value::Object(out)
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    sorted(v).to_string()
}
