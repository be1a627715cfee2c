//! The harness as embedders use it: [`Harness::spawn`] (or [`Harness::builder`], or
//! [`Harness::spawn_linked`] under the embedder's own supervisor) starts the actor tree
//! and returns a [`HarnessHandle`].
//!
//! Lifecycle: [`HarnessHandle::shutdown`] stops every server gracefully, ends the calls
//! still running (their records say `cancelled`), writes every audit record and cache
//! entry, and returns when no server process is left. Dropping the last handle kills
//! the tree, and with it every server's process group (synchronously, through each
//! connection's kill guard); records already accepted are still written. When the
//! harness is spawned under an embedder's supervisor, stopping that supervisor stops
//! the harness the same way.

mod error;
mod metrics;
mod supervisor;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorCell, ActorRef};
use serde_json::Value;
use tokio::sync::broadcast;

pub use error::HarnessError;
pub use metrics::{Metrics, ServerMetrics};
use supervisor::HarnessMsg;
use supervisor::HarnessSupervisor;
pub use supervisor::Service;

use crate::audit::{AuditHealth, AuditRef, AuditSink};
use crate::call::input::{
    ApprovalQueue, InputHandler, InputHandlers, InputHandlersArgs, RootsHandler, SamplingHandler,
    SharedAgents,
};
use crate::call::{
    Answer, CallContext, CallError, CallKind, CallPool, CallRequest, Caller, CancelToken,
    Delegation, HarnessClient, ListKind, Listing, SearchIndex, ToolInfo, ToolMatch,
};
use crate::config::HarnessConfig;
use crate::permission::{PermissionRef, Policy};
use crate::protocol::Implementation;
use crate::registry::cache::shared::SharedCache;
use crate::registry::cache::{CacheStats, ListCache};
use crate::registry::{HarnessEvent, Registry, RegistryRef};
use crate::server::{Directory, ServerConfig, ServerError, ServerStatus, ServersArgs, ServersRef};
use crate::transport::ConnectOptions;
use crate::transport::auth::{
    Authorizer, FileTokenStore, MemoryTokenStore, SignInContext, TokenStore,
};
use supervisor::Services;

/// How long [`HarnessHandle::request`] waits before asking again a server whose actor
/// is being rebuilt.
const UNAVAILABLE_PAUSE: Duration = Duration::from_millis(20);

/// Starts harnesses.
pub struct Harness;

/// A harness about to start: its config, and input handlers known before any server
/// connects (legacy servers learn the client's capabilities at `initialize` only, and
/// many list some tools only to clients that declared elicitation, sampling or roots).
pub struct HarnessBuilder {
    config: HarnessConfig,
    handlers: Vec<(String, Arc<dyn InputHandler>)>,
    authorizer: Option<Arc<dyn Authorizer>>,
    tokens: Option<Arc<dyn TokenStore>>,
    approver: Option<Arc<dyn InputHandler>>,
}

impl HarnessBuilder {
    /// Answers `method` (`elicitation/create`, `sampling/createMessage`, `roots/list`)
    /// with `handler` from the start.
    pub fn input_handler(mut self, method: &str, handler: Arc<dyn InputHandler>) -> Self {
        self.handlers.push((method.to_string(), handler));
        self
    }

    /// Where people sign in to servers that ask for it (see [`crate::transport::auth`]).
    /// Without one, a sign-in that needs a person fails, naming `mcp-harness login`.
    pub fn authorizer(mut self, authorizer: Arc<dyn Authorizer>) -> Self {
        self.authorizer = Some(authorizer);
        self
    }

    /// Who approves the sampling requests of agents whose policy is `approve` (answers
    /// `{"action": "accept"}` to approve); the default is the harness's own queue,
    /// [`HarnessHandle::approvals`], which a person answers from `mcp-harness approvals`.
    pub fn approver(mut self, approver: Arc<dyn InputHandler>) -> Self {
        self.approver = Some(approver);
        self
    }

    /// Where tokens are kept; the default is files under `cache.dir/__tokens` when a cache
    /// directory is set, else memory.
    pub fn token_store(mut self, store: Arc<dyn TokenStore>) -> Self {
        self.tokens = Some(store);
        self
    }

    /// Starts the harness as a root actor tree.
    pub async fn spawn(self) -> Result<HarnessHandle, HarnessError> {
        Harness::start(self, None).await
    }

    /// Starts the harness as a child of `supervisor`.
    pub async fn spawn_linked(self, supervisor: ActorCell) -> Result<HarnessHandle, HarnessError> {
        Harness::start(self, Some(supervisor)).await
    }
}

/// How one call runs, beyond its name and arguments.
#[derive(Clone, Debug, Default)]
pub struct CallOptions {
    /// The call's deadline (rounds and failover included) instead of `call_timeout`.
    pub timeout: Option<Duration>,
    /// Cancels the call when cancelled (so does dropping the call's future).
    pub cancel: Option<CancelToken>,
    /// Whether the call's spans are exported (a decision made above the call, as a
    /// gateway makes it for its request). `None`: the calling span's trace decides (its
    /// sampled flag), or `trace_sample_ratio` when the call starts a trace. With
    /// `Some(false)` under a span that is exported, the server is sent that span's trace
    /// context marked not sampled (the call's own spans are not there to replace it).
    pub traced: Option<bool>,
    /// The trace context the call's span goes on under, in place of the calling span
    /// (which it then neither holds open nor takes its sampling from): for a call that
    /// outlives the span it was asked in (a gateway's request whose call is held for the
    /// client's answer).
    pub trace_parent: Option<opentelemetry::Context>,
}

impl Harness {
    /// A harness to start with `config`.
    pub fn builder(config: HarnessConfig) -> HarnessBuilder {
        HarnessBuilder {
            config,
            handlers: Vec::new(),
            authorizer: None,
            tokens: None,
            approver: None,
        }
    }

    /// Starts the harness as a root actor tree.
    pub async fn spawn(config: HarnessConfig) -> Result<HarnessHandle, HarnessError> {
        Self::builder(config).spawn().await
    }

    /// Starts the harness as a child of `supervisor`: when the embedder stops its actor,
    /// the harness and every server process below it stop too.
    pub async fn spawn_linked(
        config: HarnessConfig,
        supervisor: ActorCell,
    ) -> Result<HarnessHandle, HarnessError> {
        Self::builder(config).spawn_linked(supervisor).await
    }

    async fn start(
        builder: HarnessBuilder,
        parent: Option<ActorCell>,
    ) -> Result<HarnessHandle, HarnessError> {
        let HarnessBuilder {
            config,
            mut handlers,
            authorizer,
            tokens,
            approver,
        } = builder;
        config.validate()?;
        // The built-in handlers the config asks for, unless the embedder brought its own.
        let agents: SharedAgents = Arc::new(parking_lot::RwLock::new(config.agents.clone()));
        let approvals = ApprovalQueue::new(config.input_timeout);
        let approver = approver.unwrap_or_else(|| Arc::new(approvals.clone()));
        let has = |handlers: &[(String, Arc<dyn InputHandler>)], m: &str| {
            handlers.iter().any(|(k, _)| k == m)
        };
        let sampling = config
            .sampling
            .clone()
            .filter(|_| !has(&handlers, "sampling/createMessage"))
            .map(|sampling| (sampling, agents.clone(), approver));
        let warm_tls = config
            .servers
            .iter()
            .any(|s| matches!(s.transport, crate::transport::TransportSpec::Http(_)));
        // Blocking I/O (files, a key from the environment, the platform's CA roots),
        // kept off the async threads and bounded: a hung mount fails the start.
        let sampling = within(START_READS_WAIT, move || read_inputs(sampling, warm_tls))
            .await?
            .ok_or_else(|| {
                not_read("the sampling provider's CA bundle, the platform's CA roots")
            })??;
        if let Some(handler) = sampling {
            handlers.push(("sampling/createMessage".into(), Arc::new(handler)));
        }
        let (cache, shared, token_dir) =
            start_caches(config.cache.clone(), tokens.is_none()).await?;
        if config.agents.values().any(|a| a.roots.is_some()) && !has(&handlers, "roots/list") {
            crate::call::input::validate_roots(&config.agents).map_err(|e| {
                HarnessError::Config(crate::config::ConfigError::new(e.field, e.reason))
            })?;
            handlers.push((
                "roots/list".into(),
                Arc::new(RootsHandler::new(agents.clone())),
            ));
        }
        let store: Arc<dyn TokenStore> = match (tokens, token_dir) {
            (Some(store), _) => store,
            (None, Some(dir)) => Arc::new(FileTokenStore::new(dir)),
            (None, None) => Arc::new(MemoryTokenStore::default()),
        };
        let options = ConnectOptions {
            client_info: config
                .client_info
                .clone()
                .unwrap_or_else(Implementation::harness),
            sign_in: SignInContext {
                authorizer,
                store,
                ..SignInContext::default()
            },
            ..ConnectOptions::default()
        };
        let inputs = InputHandlers::new(handlers, config.input_timeout).map_err(|e| {
            HarnessError::Config(crate::config::ConfigError::new(e.field, e.reason))
        })?;
        let (events, _) = broadcast::channel(256);
        let registry = Arc::new(Registry::new(Arc::new(cache), shared.clone(), events));
        let registry_ref = RegistryRef::default();
        if let Some(shared) = &shared {
            let (peers, cache) = (registry_ref.clone(), registry.cache.clone());
            // One mark per shared server (only those are heard), so this stays small.
            let queued: parking_lot::Mutex<
                std::collections::HashMap<String, Arc<std::sync::atomic::AtomicU64>>,
            > = parking_lot::Mutex::default();
            shared.listen(move |server| {
                let mark = queued.lock().entry(server.to_string()).or_default().clone();
                // Not served from here on, whatever the registry's writer is busy with:
                // forgotten at each change (a walk since the last may have stored what
                // this one makes stale), the writer's message coalesced to one a second.
                cache.forget_in_memory(server);
                peers.peer_changed(server, &mark);
            });
        }
        let audit = AuditRef::default();
        let audit_sink = AuditSink::open(config.audit.clone(), audit.0.clone()).await;
        let policy = Arc::new(parking_lot::RwLock::new(Policy::new(
            config.permissions.clone(),
        )));
        let directory = Directory::default();
        let servers = ServersRef::new(config.shutdown_grace);
        let ctx = Arc::new(CallContext::new(
            directory.clone(),
            policy.clone(),
            registry.clone(),
            registry_ref.clone(),
            audit_sink.clone(),
            inputs.clone(),
            config.call_config(),
        ));
        let client = Arc::new(HarnessClient {
            inputs: inputs.clone(),
            registry: registry_ref.clone(),
            events: registry.clone(),
            progress: ctx.progress.clone(),
            ctx: Arc::downgrade(&ctx),
        });
        let services = Services {
            audit_sink,
            audit,
            policy,
            permission: PermissionRef::default(),
            registry,
            registry_ref,
            inputs: InputHandlersArgs {
                handlers: inputs,
                servers: servers.clone(),
            },
            servers_args: ServersArgs {
                directory: directory.clone(),
                client,
                options,
            },
            servers,
            calls: CallPool::new(ctx.clone()),
            ctx,
        };
        let spawned = match parent {
            Some(parent) => {
                Actor::spawn_linked(None, HarnessSupervisor, services.clone(), parent).await
            }
            None => Actor::spawn(None, HarnessSupervisor, services.clone()).await,
        };
        let (supervisor, _) = spawned.map_err(|e| HarnessError::Spawn(e.to_string()))?;
        let handle = HarnessHandle {
            inner: Arc::new(Inner {
                supervisor,
                services,
                directory,
                search: SearchIndex::default(),
                agents,
                approvals,
            }),
        };
        for server in config.servers {
            handle.add_server(server).await?;
        }
        Ok(handle)
    }
}

/// The sampling settings and what the built-in handler answers with.
type SamplingParts = (
    crate::call::input::SamplingConfig,
    SharedAgents,
    Arc<dyn InputHandler>,
);

/// The built-in sampling handler (the provider's key and CA bundle are read); with
/// `warm_tls`, the platform's CA roots too, which the first HTTPS server would
/// otherwise read on an async thread. Blocking.
fn read_inputs(
    sampling: Option<SamplingParts>,
    warm_tls: bool,
) -> Result<Option<SamplingHandler>, HarnessError> {
    let sampling = match sampling {
        Some((config, agents, approver)) => Some(
            SamplingHandler::new(config, agents, Some(approver)).map_err(|e| {
                HarnessError::Config(crate::config::ConfigError::new(
                    format!("sampling.{}", e.field),
                    e.reason,
                ))
            })?,
        ),
        None => None,
    };
    if warm_tls {
        crate::transport::tls::warm_platform_roots();
    }
    Ok(sampling)
}

/// What a start reads of its caches: the list cache, its shared layer, and the folder
/// of the sign-in tokens kept beside them (none without a cache directory).
type Caches = (
    ListCache,
    Option<Arc<SharedCache>>,
    Option<std::path::PathBuf>,
);

/// The list cache and its shared layer: the disk layer's files, the shared layer's key
/// and generation floors, the tokens' folder (moved to its new name if need be).
/// Blocking; run on the runtime's blocking pool (the shared layer spawns its tasks).
fn read_caches(
    cache: crate::registry::cache::CacheConfig,
    tokens: bool,
) -> Result<Caches, HarnessError> {
    #[cfg(test)]
    if let Some(hang) = tests::hung(&cache) {
        std::thread::sleep(hang);
    }
    let invalid = |field: String, reason: String| {
        HarnessError::Config(crate::config::ConfigError::new(field, reason))
    };
    let shared_config = cache.shared.clone();
    let cache =
        ListCache::new(cache).map_err(|e| invalid(format!("cache.{}", e.0.field), e.0.reason))?;
    // Only when the tokens are kept there (finding it may move an older folder), and
    // only in a directory the disk layer took (its `dir` is gone when it refused it).
    let tokens = (cache.config().dir.as_deref())
        .filter(|_| tokens)
        .and_then(crate::registry::cache::token_dir);
    let shared = match shared_config {
        Some(shared) => Some(
            SharedCache::new(shared, cache.config().dir.as_deref())
                .map_err(|e| invalid(format!("cache.shared.{}", e.0.field), e.0.reason))?,
        ),
        None => None,
    };
    Ok((cache, shared, tokens))
}

/// [`read_caches`] within the bound; a cache directory not read in time (a hung or
/// very slow mount) leaves everything kept there off, logged, rather than failing the
/// start: lists are then read from the servers, and sign-in tokens kept in memory.
/// What is read without it (the shared layer's key) must be read in time.
async fn start_caches(
    cache: crate::registry::cache::CacheConfig,
    tokens: bool,
) -> Result<Caches, HarnessError> {
    let wait = cache_wait(&cache);
    let with_disk = cache.clone();
    if let Some(read) = within(wait, move || read_caches(with_disk, tokens)).await? {
        return read;
    }
    let Some(dir) = &cache.dir else {
        return Err(not_read("the shared cache's key file"));
    };
    tracing::error!(dir = %dir.display(), ?wait, "the cache directory was not read in time (a hung or slow mount?); starting without the disk layer, the shared layer's generation floors and the sign-in tokens kept there (they are kept in memory)");
    let without = crate::registry::cache::CacheConfig { dir: None, ..cache };
    within(wait, move || read_caches(without, tokens))
        .await?
        .ok_or_else(|| not_read("the shared cache's key file"))?
}

/// How long a start waits for its caches' files ([`START_READS_WAIT`]; tests set their own).
fn cache_wait(cache: &crate::registry::cache::CacheConfig) -> Duration {
    #[cfg(test)]
    if let Some(wait) = tests::hung_wait(cache) {
        return wait;
    }
    let _ = cache;
    START_READS_WAIT
}

/// How long a start waits for each thing it reads from disk and the environment.
const START_READS_WAIT: Duration = Duration::from_secs(30);

/// The error of a start whose reading of `what` did not end within [`START_READS_WAIT`].
fn not_read(what: &str) -> HarnessError {
    HarnessError::Spawn(format!(
        "reading {what} did not end within {START_READS_WAIT:?}: is a mount hung?"
    ))
}

/// `read` on the blocking pool, for at most `wait`: `None` past it (`read` goes on
/// alone, its thread held, and what it returns is dropped; a runtime dropped meanwhile
/// waits for that thread unless shut down with a timeout).
async fn within<T: Send + 'static>(
    wait: Duration,
    read: impl FnOnce() -> T + Send + 'static,
) -> Result<Option<T>, HarnessError> {
    match tokio::time::timeout(wait, tokio::task::spawn_blocking(read)).await {
        Ok(Ok(read)) => Ok(Some(read)),
        Ok(Err(e)) => Err(HarnessError::Spawn(format!(
            "reading the files a start needs: {e}"
        ))),
        Err(_) => Ok(None),
    }
}

struct Inner {
    supervisor: ActorRef<HarnessMsg>,
    services: Services,
    directory: Directory,
    search: SearchIndex,
    /// The agents' input settings (sampling policy, roots), replaced on reload.
    agents: SharedAgents,
    /// Requests waiting for a person (the default approver).
    approvals: ApprovalQueue,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Killing the root kills every actor below it; each connection's kill guard then
        // SIGKILLs its process group synchronously, and each call still running records
        // `cancelled` as its task is aborted.
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
    fn ctx(&self) -> &Arc<CallContext> {
        &self.inner.services.ctx
    }

    /// Which calls are traced (a gateway decides its requests' traces with it).
    pub(crate) fn sampler(&self) -> &crate::util::trace_context::HeadSampler {
        &self.ctx().sampler
    }

    /// A call's deadline when it names none (a gateway holds a request's rounds to it).
    pub(crate) fn call_timeout(&self) -> Duration {
        self.ctx().settings.call_timeout
    }

    /// Calls a tool by qualified (`server__tool`) or bare name: authorized, routed by
    /// priority with fallback, `input_required` rounds driven, audited. The future holds
    /// no handle: it does not keep the harness alive, and it can be spawned as it is.
    ///
    /// # Cancel safety
    /// Dropping the future cancels the call (see [`CallOptions::cancel`]).
    pub fn call_tool(
        &self,
        caller: &Caller,
        name: &str,
        args: Value,
    ) -> impl Future<Output = Result<Value, CallError>> + Send + use<> {
        self.call(caller, CallKind::Tool, name, args, CallOptions::default())
    }

    /// Gets a prompt (same path as [`HarnessHandle::call_tool`]).
    pub fn get_prompt(
        &self,
        caller: &Caller,
        name: &str,
        args: Value,
    ) -> impl Future<Output = Result<Value, CallError>> + Send + use<> {
        self.call(caller, CallKind::Prompt, name, args, CallOptions::default())
    }

    /// Reads a resource by uri, from the servers that list it.
    pub fn read_resource(
        &self,
        caller: &Caller,
        uri: &str,
    ) -> impl Future<Output = Result<Value, CallError>> + Send + use<> {
        let options = CallOptions::default();
        self.call(caller, CallKind::Resource, uri, Value::Null, options)
    }

    /// Any call, with its own deadline or cancellation.
    pub fn call(
        &self,
        caller: &Caller,
        kind: CallKind,
        name: &str,
        args: Value,
        options: CallOptions,
    ) -> impl Future<Output = Result<Value, CallError>> + Send + use<> {
        let (pool, request) = self.call_request(caller, kind, name, args, None, &options);
        // The call's future is made inside this one, not before it and moved in: an
        // unstarted future kept beside its own await would double the size of this one.
        async move { pool.run(request, options.cancel).await.map(|a| a.result) }
    }

    /// A call whose `input_required` rounds the caller answers itself (`delegated`:
    /// what it can answer, and the previous round's answers): it ends at the server's
    /// first `input_required` ([`Answer::input_required`]), and the caller continues with
    /// another call on [`Answer::server`] carrying the answers and the server's
    /// `requestState`. Everything else is as [`HarnessHandle::call`]; without
    /// `delegated`, the rounds go to the input handlers.
    pub fn call_delegated(
        &self,
        caller: &Caller,
        kind: CallKind,
        name: &str,
        args: Value,
        delegated: Option<Delegation>,
        options: CallOptions,
    ) -> impl Future<Output = Result<Answer, CallError>> + Send + use<> {
        let (pool, request) = self.call_request(caller, kind, name, args, delegated, &options);
        async move { pool.run(request, options.cancel).await }
    }

    /// A call as the pool runs it, made where it is asked (the span current then is
    /// its parent).
    fn call_request(
        &self,
        caller: &Caller,
        kind: CallKind,
        name: &str,
        args: Value,
        delegated: Option<Delegation>,
        options: &CallOptions,
    ) -> (CallPool, CallRequest) {
        // Only a call whose caller asked for progress pays for it.
        let progress_last = (delegated.as_ref())
            .and_then(|d| d.progress.as_ref())
            .map(|_| Default::default());
        let request = CallRequest {
            caller: caller.clone(),
            kind,
            name: name.to_string(),
            args,
            timeout: options.timeout,
            delegated,
            parent: match options.trace_parent {
                Some(_) => tracing::Span::none(),
                None => tracing::Span::current(),
            },
            trace_parent: options.trace_parent.clone(),
            traced: options.traced,
            progress_last,
        };
        (self.inner.services.calls.clone(), request)
    }

    /// The tools `caller` may call, each with its qualified name, bare name, server and
    /// definition, sorted by qualified name. Servers that cannot be listed now are left
    /// out; [`HarnessHandle::listing`] says which and why.
    pub async fn list_tools(&self, caller: &Caller) -> Result<Vec<ToolInfo>, CallError> {
        Ok(self.listing(caller, CallKind::Tool, None).await?.items)
    }

    /// [`HarnessHandle::list_tools`], only on servers tagged `tag`.
    pub async fn list_tools_tagged(
        &self,
        caller: &Caller,
        tag: &str,
    ) -> Result<Vec<ToolInfo>, CallError> {
        Ok(self.listing(caller, CallKind::Tool, Some(tag)).await?.items)
    }

    /// The prompts `caller` may get.
    pub async fn list_prompts(&self, caller: &Caller) -> Result<Vec<ToolInfo>, CallError> {
        Ok(self.listing(caller, CallKind::Prompt, None).await?.items)
    }

    /// The resources `caller` may read (by uri, which is their name).
    pub async fn list_resources(&self, caller: &Caller) -> Result<Vec<ToolInfo>, CallError> {
        Ok(self.listing(caller, ListKind::Resources, None).await?.items)
    }

    /// The resource templates (RFC 6570, by `uriTemplate`, which is their name) of the
    /// servers where `caller` may read any resource: a template stands for URIs no grant
    /// names in advance. A read of a URI no list names is asked first of the servers
    /// whose templates make it, then of the other servers with resources, in order.
    pub async fn list_resource_templates(
        &self,
        caller: &Caller,
    ) -> Result<Vec<ToolInfo>, CallError> {
        Ok(self
            .listing(caller, ListKind::ResourceTemplates, None)
            .await?
            .items)
    }

    /// What `caller` may use of `kind` (optionally on servers tagged `tag`), and the
    /// servers it may use that could not be listed, with why.
    pub async fn listing(
        &self,
        caller: &Caller,
        kind: impl Into<ListKind>,
        tag: Option<&str>,
    ) -> Result<Listing, CallError> {
        crate::call::list(self.ctx(), caller, kind.into(), tag).await
    }

    /// The `k` tools `caller` may call that are most relevant to `query` (plain words),
    /// best first: BM25 over each tool's server, name, title, description and
    /// parameters. Searches the caller's own listing, so a tool its grants do not allow
    /// is never found, and a server's changed list is searched as changed.
    /// The listing is bounded as [`HarnessHandle::list_tools`] is (a server that does
    /// not answer in time is left out), the search as [`HarnessHandle::search_listed`].
    pub async fn search_tools(
        &self,
        caller: &Caller,
        query: &str,
        k: usize,
    ) -> Result<Vec<ToolMatch>, CallError> {
        let tools = self.list_tools(caller).await?;
        self.search_listed(tools, query, k).await
    }

    /// [`HarnessHandle::search_tools`] over tools the caller has listed already (a
    /// [`HarnessHandle::listing`]'s items, which also say what could not be listed),
    /// within `call_timeout`: a search may wait for its index to be built behind
    /// others' ([`CallError::DeadlineExceeded`]; the build goes on, for the next).
    pub async fn search_listed(
        &self,
        tools: Vec<ToolInfo>,
        query: &str,
        k: usize,
    ) -> Result<Vec<ToolMatch>, CallError> {
        let timeout = self.ctx().settings.call_timeout;
        let until = crate::util::duration::after(tokio::time::Instant::now(), timeout);
        let search = self.inner.search.search_until(tools, query, k, until);
        search.await.ok_or(CallError::DeadlineExceeded(timeout))
    }

    /// One tool's definition (`inputSchema` and all), by qualified or bare name; a bare
    /// name gives the one the call would be routed to.
    pub async fn get_tool_schema(
        &self,
        caller: &Caller,
        name: &str,
    ) -> Result<ToolInfo, CallError> {
        let deadline = crate::util::duration::after(
            std::time::Instant::now(),
            self.ctx().settings.call_timeout,
        );
        let candidates =
            crate::call::route(self.ctx(), caller, CallKind::Tool, name, deadline).await?;
        let tools = self.list_tools(caller).await?;
        candidates
            .iter()
            .find_map(|c| {
                tools
                    .iter()
                    .find(|t| *t.server == *c.server.id() && *t.name == *c.item)
                    .cloned()
            })
            .ok_or_else(|| CallError::NoRoute {
                tool: name.to_string(),
                unreachable: Vec::new(),
            })
    }

    /// Registers the handler of an input method (`elicitation/create`,
    /// `sampling/createMessage`, `roots/list`); the harness then declares its capability,
    /// and connected legacy servers reconnect to learn it (calls in flight finish on
    /// the old connection); modern servers' lists, which may depend on it, are read
    /// again. Prefer [`HarnessBuilder::input_handler`] for handlers known
    /// at start.
    pub async fn register_input_handler(
        &self,
        method: &str,
        handler: Arc<dyn InputHandler>,
    ) -> Result<(), HarnessError> {
        self.inner
            .services
            .inputs
            .handlers
            .register(method, handler)
            .await
            .map_err(|e| HarnessError::Config(crate::config::ConfigError::new(e.field, e.reason)))
    }

    /// Grants `agent` the `tools` (or `*`) on `selector` (server id, `tag:NAME`, `*`).
    /// A grant that would match nothing (`read_*`, an empty name) is refused.
    pub async fn grant(
        &self,
        agent: &str,
        selector: &str,
        tools: &[&str],
    ) -> Result<(), HarnessError> {
        let tools: Vec<String> = tools.iter().map(|t| t.to_string()).collect();
        let mut one = crate::permission::Grants::new();
        one.entry(agent.into())
            .or_default()
            .insert(selector.into(), tools.clone());
        checked_grants(&one)?;
        let changed = self
            .inner
            .services
            .permission
            .grant(agent, selector, tools)
            .await
            .map_err(|_| self.unanswered("the grant"))?;
        self.grants_changed(changed.then(|| agent.to_string()).into_iter().collect());
        Ok(())
    }

    /// Announces that `agents`' grants changed (when any did): clients told of lists
    /// (a gateway's) list again.
    fn grants_changed(&self, agents: Vec<String>) {
        if !agents.is_empty() {
            self.inner
                .services
                .registry
                .announce(HarnessEvent::GrantsChanged { agents });
        }
    }

    /// Revokes `agent`'s grant on `selector` (all of them when `None`). Calls in flight
    /// stop at their next round or failover hop.
    pub async fn revoke(&self, agent: &str, selector: Option<&str>) -> Result<(), HarnessError> {
        let changed = self
            .inner
            .services
            .permission
            .revoke(agent, selector)
            .await
            .map_err(|_| self.unanswered("the revocation"))?;
        self.grants_changed(changed.then(|| agent.to_string()).into_iter().collect());
        Ok(())
    }

    /// Replaces every grant at once (a reloaded config). Calls in flight stop at their
    /// next round or hop if they lost their grant. Grants that would match nothing are
    /// refused, and the running ones kept.
    pub async fn replace_grants(
        &self,
        grants: crate::permission::Grants,
    ) -> Result<(), HarnessError> {
        checked_grants(&grants)?;
        let changed = self
            .inner
            .services
            .permission
            .replace(grants)
            .await
            .map_err(|_| self.unanswered("the new grants"))?;
        self.grants_changed(changed);
        Ok(())
    }

    /// The most `input_required` rounds one call may have (`round_cap`).
    pub fn round_cap(&self) -> usize {
        self.ctx().settings.round_cap
    }

    /// The requests waiting for a person: sampling requests of agents whose policy is
    /// `approve` (unless the builder set another approver). Answer one with
    /// `{"action": "accept"}` to approve it, or decline it.
    pub fn approvals(&self) -> ApprovalQueue {
        self.inner.approvals.clone()
    }

    /// Replaces every agent's input settings (a reloaded config). When the roots
    /// changed, connected legacy servers are sent `notifications/roots/list_changed`
    /// (modern servers ask for roots in each call's rounds, so they see the change).
    pub async fn replace_agents(
        &self,
        agents: std::collections::BTreeMap<String, crate::call::input::AgentConfig>,
    ) {
        let roots_changed = {
            let mut current = self.inner.agents.write();
            let roots =
                |m: &std::collections::BTreeMap<String, crate::call::input::AgentConfig>| {
                    m.iter()
                        .map(|(k, a)| (k.clone(), a.roots.clone()))
                        .collect::<Vec<_>>()
                };
            let changed = roots(&current) != roots(&agents);
            *current = agents;
            changed
        };
        if !roots_changed {
            return;
        }
        // All at once, one server slow to take it must not hold up the others; and only
        // to those told at `initialize` that roots changes are announced.
        let told = |c: &crate::transport::Connection| {
            c.era() == crate::transport::Era::Legacy
                && c.declared()
                    .get("roots")
                    .and_then(|r| r.get("listChanged"))
                    .and_then(serde_json::Value::as_bool)
                    == Some(true)
        };
        let sent = self.inner.directory.all().into_iter().filter_map(|server| {
            let conn = server.connection().filter(|c| told(c))?;
            Some(async move {
                if let Err(e) = conn.notify("notifications/roots/list_changed", None).await {
                    tracing::debug!(server = server.id(), error = %e, "roots list_changed not sent");
                }
            })
        });
        futures_util::future::join_all(sent).await;
    }

    /// Entries, bytes, hits and misses of the list cache, per layer.
    pub fn cache_stats(&self) -> CacheStats {
        self.inner.services.registry.stats()
    }

    /// The audit trail's state: writable, backlog, records it could not keep, calls
    /// whose final record is still to come.
    pub fn audit_health(&self) -> AuditHealth {
        let sink = &self.inner.services.audit_sink;
        AuditHealth {
            // No trail, no record to miss.
            unfinished: match sink.is_recording() {
                true => self.ctx().in_flight(),
                false => 0,
            },
            ..sink.health()
        }
    }

    /// Events such as [`HarnessEvent::ToolsChanged`].
    pub fn subscribe(&self) -> broadcast::Receiver<HarnessEvent> {
        self.inner.services.registry.subscribe()
    }

    /// Starts a new server.
    pub async fn add_server(&self, config: ServerConfig) -> Result<(), HarnessError> {
        validated(&config)?;
        let id = config.id.clone();
        // Counted from before it can answer; not if it was not added after all (a late
        // call of a removed server of that id brings no series back).
        self.ctx().metrics.track(&id);
        // Announced (`ServerAdded`), and counted again, by the servers' supervisor when
        // the add takes effect: also one answered `Busy` that takes effect later.
        let added = self.inner.services.servers.add(config).await;
        added.map_err(|e| {
            // Not added (yet): if it is later, it is counted again then.
            let directory = &self.inner.directory;
            self.ctx()
                .metrics
                .forget_unless(&id, || directory.contains(&id));
            self.servers_error(e, "the new server")
        })
    }

    /// Stops a server gracefully and forgets it (and its cache entries, memory and disk).
    pub async fn remove_server(&self, id: &str) -> Result<(), HarnessError> {
        // On a task of its own: a caller that gives up waiting (a dropped future) does
        // not leave the server stopped and its lists, series and removal unannounced.
        let (this, id) = (self.clone(), id.to_string());
        let removal = tokio::spawn(async move {
            (this.inner.services.servers.remove(&id).await)
                .map_err(|e| this.servers_error(e, "the removal"))?;
            this.forget_server(&id).await;
            Ok(())
        });
        removal.await.unwrap_or(Err(HarnessError::ShutDown))
    }

    /// Forgets a server gone from the directory: its cache entries, lists and series,
    /// announced as removed. One of its id added meanwhile (by another task) is not
    /// announced removed: its lists, dropped with the old one's, are announced changed.
    async fn forget_server(&self, id: &str) {
        self.inner.services.registry_ref.remove(id).await;
        self.ctx().catalog.forget(id);
        let directory = &self.inner.directory;
        self.ctx()
            .metrics
            .forget_unless(id, || directory.contains(id));
        let event = match directory.contains(id) {
            true => HarnessEvent::ListsChanged {
                server: id.to_string(),
                tools: true,
                prompts: true,
                resources: true,
            },
            false => HarnessEvent::ServerRemoved {
                server: id.to_string(),
            },
        };
        self.inner.services.registry.announce(event);
    }

    /// Restarts a server with a new config (its id the same), in its place: calls
    /// meanwhile wait for the new one, as during a restart; those in flight on the old
    /// one end. The new one starts once the old one has stopped, its lists read afresh
    /// (announced as changed). Returns when the old one has stopped.
    pub async fn replace_server(&self, config: ServerConfig) -> Result<(), HarnessError> {
        validated(&config)?;
        let id = config.id.clone();
        let replaced = self.inner.services.servers.replace(config).await;
        // The new one could not be started: the server is gone, as if removed.
        if matches!(replaced, Err(crate::server::ServersError::Spawn { .. }))
            && !self.inner.directory.contains(&id)
        {
            self.forget_server(&id).await;
        }
        replaced.map_err(|e| self.servers_error(e, "the replacement"))
    }

    /// Restarts a server now, forgetting its restart history; brings a `failed` (or
    /// disabled) server back.
    pub async fn restart_server(&self, id: &str) -> Result<(), HarnessError> {
        (self.inner.services.servers.restart(id).await)
            .map_err(|e| self.servers_error(e, "the restart"))
    }

    /// What an ask nobody answered means: the harness is shut down (or shutting down),
    /// or, while it runs, a part of it is busy or being rebuilt ([`HarnessError::Busy`]).
    fn unanswered(&self, what: &str) -> HarnessError {
        let running = ractor::ACTIVE_STATES.contains(&self.inner.supervisor.get_status());
        if running && !self.inner.services.calls.is_closing() {
            HarnessError::Busy(what.to_string())
        } else {
            HarnessError::ShutDown
        }
    }

    /// `e` as the handle's error, an unanswered ask told apart by [`Self::unanswered`].
    fn servers_error(&self, e: crate::server::ServersError, what: &str) -> HarnessError {
        match e {
            crate::server::ServersError::Gone => self.unanswered(what),
            e => e.into(),
        }
    }

    /// A snapshot of every server's status (with its discover or `initialize` profile),
    /// in config order. Reads shared state: never waits on an actor.
    pub fn status(&self) -> Vec<ServerStatus> {
        self.inner
            .directory
            .all()
            .iter()
            .map(|s| s.status())
            .collect()
    }

    /// The config server `id` runs with now.
    pub(crate) fn server_config(&self, id: &str) -> Option<ServerConfig> {
        (self.inner.directory.get(id)).map(|s| s.config().clone())
    }

    /// What server `id` is now ([`ServerConfig::identity`]).
    pub(crate) fn server_identity(&self, id: &str) -> Option<String> {
        (self.inner.directory.get(id)).map(|s| s.identity().to_string())
    }

    /// One server's status.
    pub fn server_status(&self, id: &str) -> Option<ServerStatus> {
        self.inner.directory.get(id).map(|s| s.status())
    }

    /// Whether server `id` may offer items of `kind`: enabled in the config, and, if it
    /// has said what it offers, offering them.
    pub(crate) fn may_offer(&self, id: &str, kind: ListKind) -> bool {
        (self.inner.directory.get(id)).is_some_and(|s| crate::call::may_offer(&s, kind))
    }

    /// The server's current actor (for fault injection and direct messages). After the
    /// actor is rebuilt, this returns the new one.
    pub fn server_actor(&self, id: &str) -> Option<ActorCell> {
        self.inner
            .directory
            .get(id)
            .and_then(|s| s.actor())
            .map(|a| a.get_cell())
    }

    /// Whether `agent` holds some grant on server `id` (whether it sees anything of it).
    pub fn may_use(&self, agent: &str, id: &str) -> bool {
        self.ctx()
            .servers
            .get(id)
            .is_some_and(|s| self.ctx().allows_any(Some(agent), &s))
    }

    /// Whether `agent` may call `item` (a tool's or prompt's name, a resource's URI) on
    /// server `id`, per the grants now.
    pub fn may_call(&self, agent: &str, id: &str, item: &str) -> bool {
        self.ctx()
            .servers
            .get(id)
            .is_some_and(|s| self.ctx().allows(Some(agent), &s, item))
    }

    /// Whether server `id` holds a token for `identity` (an auth context; `None`: the
    /// harness's own sign-in).
    pub fn signed_in(&self, id: &str, identity: Option<&str>) -> bool {
        self.inner
            .directory
            .get(id)
            .is_some_and(|s| s.signed_in(identity))
    }

    /// Signs `identity` in to server `id` now, through the authorizer (a user signing
    /// in ahead of their first call). The server must be connected.
    pub async fn sign_in(&self, id: &str, identity: Option<&str>) -> Result<(), HarnessError> {
        let server = self
            .inner
            .directory
            .get(id)
            .ok_or_else(|| HarnessError::UnknownServer(id.to_string()))?;
        let conn = server.connection().ok_or_else(|| {
            HarnessError::Call(CallError::Server(crate::server::ServerError::Unavailable {
                server: id.to_string(),
            }))
        })?;
        conn.sign_in(identity).await.map_err(|e| {
            HarnessError::Call(CallError::Server(crate::server::ServerError::from_request(
                id,
                crate::transport::RequestError::Transport(e),
            )))
        })
    }

    /// The current actor of one of the harness's services (for fault injection).
    pub async fn service_actor(&self, service: Service) -> Option<ActorCell> {
        ractor::call!(self.inner.supervisor, HarnessMsg::Child, service)
            .ok()
            .flatten()
    }

    /// The harness's root actor (to link or monitor it from the embedder's tree).
    pub fn supervisor(&self) -> ActorCell {
        self.inner.supervisor.get_cell()
    }

    /// Sends one raw request to one server (the `_meta` envelope is added) and returns
    /// its result. Waits while the server (re)starts or its actor is rebuilt, up to the
    /// server's `timeout`. No
    /// authorization, routing, rounds or audit: this is the operator's tool. The
    /// handshake's methods (`initialize`, `server/discover`) are refused
    /// ([`HarnessError::ConnectionsOwn`]): the connection sends them itself.
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
        // The handshake's own: sent raw it would begin a session nobody ends, and be
        // given a handshake's time (a sign-in's) rather than this deadline.
        if matches!(method, "initialize" | "server/discover") {
            return Err(HarnessError::ConnectionsOwn(method.to_string()));
        }
        let Some(server) = self.inner.directory.get(server) else {
            return Err(HarnessError::UnknownServer(server.to_string()));
        };
        let handlers = self.ctx().inputs.snapshot();
        let limit = timeout.unwrap_or(server.config().timeout);
        let deadline = crate::util::duration::after(tokio::time::Instant::now(), limit);
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let answer = server
                .request(
                    method,
                    params.as_ref(),
                    Some(left),
                    Some(handlers.capabilities()),
                    None,
                )
                .await;
            match answer {
                // Its actor is being rebuilt (or the server was just added): waited for
                // as a restart is. A call fails over at once instead.
                Err(ServerError::Unavailable { .. }) if left > UNAVAILABLE_PAUSE => {
                    tokio::time::sleep(UNAVAILABLE_PAUSE).await;
                }
                answer => return Ok(answer?),
            }
        }
    }

    /// Stops every server gracefully (stdin EOF, SIGTERM, SIGKILL, reap), ends the calls
    /// still running (recorded as `cancelled`), writes every audit record and cache
    /// entry, then stops the harness; returns when no server process is left, with the
    /// audit trail's health then: a `backlog` or `unwritten` above zero is records that
    /// could not be written (logged as an error too). Called again (or from another
    /// task) while one is under way, it returns when that one is done.
    pub async fn shutdown(&self) -> AuditHealth {
        // Calls in flight get `shutdown_grace`, and then servers (up to twice their
        // grace each, at once), cache and audit trail their own bounded times.
        let limit = self
            .ctx()
            .settings
            .shutdown_grace
            .saturating_mul(3)
            .saturating_add(Duration::from_secs(240));
        let reached = self
            .inner
            .supervisor
            .call(HarnessMsg::Shutdown, Some(limit))
            .await;
        // Not sent (the root is gone), or taken and dropped unanswered (the root died
        // with it in its mailbox): nobody else flushes. (A timeout is the flush still
        // under way.)
        let gone = matches!(reached, Err(_) | Ok(ractor::rpc::CallResult::SenderError));
        if gone {
            // The root is gone (an embedder's supervisor stopped it, and every actor
            // below with it): no call is admitted, and what the audit actor would have
            // flushed is written here, within a few seconds.
            let services = &self.inner.services;
            services.calls.close();
            services.close_slots();
            // The calls' tasks end as their actors went: their final records come
            // within moments, and are written with the rest.
            let deadline = std::time::Instant::now() + Duration::from_secs(2);
            while self.ctx().in_flight() > 0 && std::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            // Their actors killed, each server's process is killed as its actor's state
            // drops, in its own time: waited for (a few seconds at most), so that this
            // returns, as it says, when no server process is left.
            (services.servers)
                .shutdown(&services.servers_args.directory, false)
                .await;
            tokio::select! {
                biased;
                _ = tokio::time::timeout(Duration::from_secs(5), services.audit_sink.write_now()) => {}
                () = services.audit_sink.stalled() => {}
            }
        }
        let health = self.audit_health();
        if health.backlog > 0 || health.unwritten > 0 || health.unfinished > 0 {
            tracing::error!(
                backlog = health.backlog,
                unwritten = health.unwritten,
                unfinished = health.unfinished,
                error = health.last_error.as_deref().unwrap_or("-"),
                "audit records not written at shutdown"
            );
        }
        health
    }
}

/// Refuses grants that would match nothing, as a config that held them is refused.
/// `config`, unless it is wrong.
fn validated(config: &ServerConfig) -> Result<(), HarnessError> {
    config.validate().map_err(|e| {
        HarnessError::Config(crate::config::ConfigError {
            file: None,
            server: Some(config.id.clone()),
            field: e.field,
            reason: e.reason,
        })
    })
}

fn checked_grants(grants: &crate::permission::Grants) -> Result<(), HarnessError> {
    crate::permission::validate(grants)
        .map_err(|e| HarnessError::Config(crate::config::ConfigError::new(e.field, e.reason)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::ServerMsg;

    /// A cache directory whose start read hangs (for how long), and the bound its
    /// start gives it.
    static HUNG: parking_lot::Mutex<Option<(std::path::PathBuf, Duration, Duration)>> =
        parking_lot::Mutex::new(None);

    pub(super) fn hung(cache: &crate::registry::cache::CacheConfig) -> Option<Duration> {
        let hung = HUNG.lock();
        let (dir, hang, _) = hung.as_ref()?;
        (cache.dir.as_ref() == Some(dir)).then_some(*hang)
    }

    pub(super) fn hung_wait(cache: &crate::registry::cache::CacheConfig) -> Option<Duration> {
        let hung = HUNG.lock();
        let (dir, _, wait) = hung.as_ref()?;
        (cache.dir.as_ref() == Some(dir)).then_some(*wait)
    }

    /// A cache directory whose reading hangs past its bound: the harness starts all the
    /// same, its disk layer off, and its sign-in tokens in memory.
    #[tokio::test]
    async fn a_cache_directory_that_hangs_leaves_the_disk_layer_off() {
        // Under /proc: the read that goes on after the test cannot create it.
        let dir = std::path::PathBuf::from(format!(
            "/proc/self/mcp-harness-hung-{}",
            std::process::id()
        ));
        *HUNG.lock() = Some((
            dir.clone(),
            Duration::from_secs(3),
            Duration::from_millis(200),
        ));
        let mut config = HarnessConfig::default();
        config.cache.dir = Some(dir.clone());
        let started = tokio::time::timeout(Duration::from_secs(2), Harness::spawn(config)).await;
        *HUNG.lock() = None;
        let h = started
            .expect("not held by the hung read")
            .expect("started");
        assert_eq!(h.inner.services.registry.cache.config().dir, None);
        h.shutdown().await;
    }

    /// A start's read that hangs (a hung mount) is given up once its bound is past,
    /// while the read is still held.
    #[tokio::test]
    async fn a_start_read_that_hangs_is_given_up_in_its_bound() {
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (done_tx, done) = std::sync::mpsc::channel::<()>();
        let read = within(Duration::from_millis(100), move || {
            let _ = held.recv();
            let _ = done_tx.send(());
        })
        .await;
        assert_eq!(read, Ok(None));
        assert!(done.try_recv().is_err(), "the read was not still held");
        let _ = release.send(());
        // A read in its bound is returned as it is.
        let ok = within(Duration::from_secs(30), || 7).await;
        assert_eq!(ok, Ok(Some(7)));
        assert!(
            not_read("the key")
                .to_string()
                .contains("reading the key did not end within 30s")
        );
    }

    /// An ask nobody answered while the harness runs is `Busy` (worth asking again),
    /// not `ShutDown`; once it is shut down, `ShutDown`.
    #[tokio::test]
    async fn an_unanswered_ask_is_busy_while_the_harness_runs() {
        let h = Harness::spawn(HarnessConfig::default())
            .await
            .expect("spawn");
        assert!(
            matches!(h.unanswered("the grant"), HarnessError::Busy(w) if w == "the grant"),
            "running"
        );
        assert!(matches!(
            h.servers_error(crate::server::ServersError::Gone, "the restart"),
            HarnessError::Busy(_)
        ));
        assert!(matches!(
            h.servers_error(
                crate::server::ServersError::Unknown("x".into()),
                "the restart"
            ),
            HarnessError::UnknownServer(_)
        ));
        h.shutdown().await;
        assert_eq!(h.unanswered("the grant"), HarnessError::ShutDown);
        // End to end, at once: no rebuild is waited for (the slots wait 5 s for one).
        let within = Duration::from_secs(4);
        let grant = tokio::time::timeout(within, h.grant("a", "*", &["*"])).await;
        assert_eq!(grant, Ok(Err(HarnessError::ShutDown)));
        let restart = tokio::time::timeout(within, h.restart_server("x")).await;
        assert_eq!(restart, Ok(Err(HarnessError::ShutDown)));
    }

    /// An add that takes effect after its asker gave up waiting (answered `Busy`) is
    /// announced then, and the calls of its server, removed before, counted again.
    #[tokio::test]
    async fn an_add_taking_effect_after_its_asker_gave_up_is_announced_and_counted() {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}/mcp", silent.local_addr().expect("addr"));
        let h = Harness::spawn(HarnessConfig::default())
            .await
            .expect("spawn");
        let mut events = h.subscribe();
        // A server of this id was removed: its calls are no longer counted.
        h.ctx().metrics.forget_unless("late", || false);
        let (port, asker) = ractor::concurrency::oneshot();
        drop(asker);
        let add = crate::server::ServersMsg::Add(
            Box::new(ServerConfig::http("late", &url)),
            u64::MAX,
            port.into(),
        );
        assert!(h.inner.services.servers.0.send(add));
        let announced = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match events.recv().await {
                    Ok(HarnessEvent::ServerAdded { server }) => return server,
                    Ok(_) => {}
                    Err(e) => panic!("events: {e}"),
                }
            }
        })
        .await
        .expect("announced");
        assert_eq!(announced, "late");
        let call = ("tools/call", "ok", None);
        let took = Duration::from_millis(1);
        (h.ctx().metrics).finished(Some("late"), call, took, |_| true, || (None, None));
        let (series, _) = h.ctx().metrics.snapshot();
        assert!(series.iter().any(|s| &*s.server == "late"), "{series:?}");
        h.shutdown().await;
    }

    /// A rebuilt servers supervisor starts no connection beside the process of the one
    /// before it until that process is gone.
    #[tokio::test]
    async fn a_rebuilt_server_waits_for_the_dead_actors_process_to_be_gone() {
        // Takes connections and never answers: the connection stays in its handshake.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}/mcp", silent.local_addr().expect("addr"));
        let h = Harness::spawn(HarnessConfig {
            servers: vec![ServerConfig::http("s", &url)],
            ..HarnessConfig::default()
        })
        .await
        .expect("spawn");
        let server = h.inner.directory.get("s").expect("listed");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while server.attempts() == 0 {
            assert!(std::time::Instant::now() < deadline, "never connected");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // As if a stdio process of its had connected, and is not gone yet.
        let (exit, ends) = tokio::sync::watch::channel(None);
        server.spawned(crate::transport::ProcessExit::new(ends));
        let old = h.server_actor("s").expect("actor");
        h.service_actor(Service::Servers)
            .await
            .expect("running")
            .kill();
        while h
            .server_actor("s")
            .is_none_or(|a| a.get_id() == old.get_id())
        {
            assert!(std::time::Instant::now() < deadline, "not rebuilt");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(server.attempts(), 1, "started beside the old process");
        // Nor does a restart asked meanwhile start one.
        h.restart_server("s").await.expect("restart");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            server.attempts(),
            1,
            "a restart started one beside the old process"
        );
        let _ = exit.send(Some(crate::transport::ExitStatus::Signal(9)));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while server.attempts() < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "not started once it was gone"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        h.shutdown().await;
    }

    /// A process is known from its spawn, before its handshake: one whose supervisor
    /// dies while it starts is waited for too, and it is killed with its actor.
    #[tokio::test]
    async fn a_process_still_starting_is_known_to_the_actor_rebuilt_after_it() {
        // Never answers its handshake.
        let h = Harness::spawn(HarnessConfig {
            servers: vec![ServerConfig::stdio("s", "sh", ["-c", "sleep 30"])],
            ..HarnessConfig::default()
        })
        .await
        .expect("spawn");
        let server = h.inner.directory.get("s").expect("listed");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let first = loop {
            if let Some(p) = server.live_processes().pop() {
                break p;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "not known while it starts"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert!(!first.is_gone());
        assert_eq!(
            h.server_status("s").map(|s| s.state),
            Some(crate::server::ServerState::Starting)
        );
        h.service_actor(Service::Servers)
            .await
            .expect("running")
            .kill();
        let gone = tokio::time::timeout(Duration::from_secs(10), first.gone()).await;
        assert!(gone.is_ok(), "killed with its actor");
        h.shutdown().await;
    }

    /// A panic in a server actor (a bug, not a kill) reaches its supervisor as a failure,
    /// and the actor is rebuilt in place. Only a unit test can make the actor panic.
    #[tokio::test]
    async fn a_panicking_server_actor_is_rebuilt() {
        let config = HarnessConfig {
            // Nobody listens there: the actor lives, restarting, without a process.
            servers: vec![ServerConfig::http("s", "http://127.0.0.1:9/mcp")],
            ..HarnessConfig::default()
        };
        let h = Harness::spawn(config).await.expect("spawn");
        let old = h.server_actor("s").expect("actor");
        old.send_message::<ServerMsg>(ServerMsg::Panic)
            .expect("delivered");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let new = loop {
            if let Some(a) = h.server_actor("s")
                && a.get_id() != old.get_id()
            {
                break a;
            }
            assert!(std::time::Instant::now() < deadline, "not rebuilt");
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(h.server_status("s").map(|s| s.actor_rebuilds), Some(1));
        // The new actor answers.
        h.restart_server("s")
            .await
            .expect("the rebuilt actor handles messages");
        assert_eq!(h.server_actor("s").map(|a| a.get_id()), Some(new.get_id()));
        h.shutdown().await;
    }

    /// The servers' supervisor killed again and again, each time soon after its rebuild,
    /// is rebuilt each time (after pauses that grow: `supervisor::tests` has their
    /// lengths) and then answers.
    #[tokio::test]
    async fn the_servers_supervisor_that_keeps_dying_is_rebuilt_each_time() {
        let h = Harness::spawn(HarnessConfig::default())
            .await
            .expect("spawn");
        for _ in 0..6 {
            let old = h.service_actor(Service::Servers).await.expect("running");
            old.kill();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                if h.service_actor(Service::Servers)
                    .await
                    .is_some_and(|a| a.get_id() != old.get_id())
                {
                    break;
                }
                assert!(std::time::Instant::now() < deadline, "not rebuilt");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        // The last one rebuilt answers.
        let unknown = h.restart_server("nope").await;
        assert!(
            matches!(&unknown, Err(e) if e.to_string().contains("no server named")),
            "{unknown:?}"
        );
        h.shutdown().await;
    }
}
