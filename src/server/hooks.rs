//! What a server actor needs from the rest of the harness: the capabilities to
//! declare, the input handlers that answer legacy server-to-client requests, and the
//! registry to tell when a server's lists change. Shared, read-mostly, and free of
//! references back to the server table (no reference cycles).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;
use ractor::ActorRef;
use serde_json::{Value, json};

use crate::call::handler::InputMsg;
use crate::registry::RegistryMsg;

/// Shared hooks; cheap to clone.
#[derive(Clone)]
pub struct ServerHooks {
    /// `clientCapabilities`, derived from the registered input handlers.
    pub capabilities: Arc<RwLock<Value>>,
    /// The input handler actor of each method.
    pub handlers: Arc<RwLock<HashMap<String, ActorRef<InputMsg>>>>,
    /// The registry, once started.
    pub registry: Arc<OnceLock<ActorRef<RegistryMsg>>>,
}

impl Default for ServerHooks {
    fn default() -> Self {
        ServerHooks {
            capabilities: Arc::new(RwLock::new(json!({}))),
            handlers: Arc::new(RwLock::new(HashMap::new())),
            registry: Arc::new(OnceLock::new()),
        }
    }
}

impl std::fmt::Debug for ServerHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerHooks")
            .field("capabilities", &*self.capabilities.read())
            .finish()
    }
}
