//! [`SamplingHandler`]: `sampling/createMessage` served by calling a model provider on
//! the server's behalf, an OpenAI-compatible Chat Completions endpoint or the Anthropic
//! Messages API, under the policy of the agent whose call caused the request
//! ([`AgentConfig::sampling`]: deny, allow, or ask a person first), a token budget
//! per call, and one per server for each minute.
//!
//! Mapped: messages (text and image content), `systemPrompt`, `maxTokens` (held to the
//! configured ceiling), `stopSequences`, `temperature`, and `modelPreferences.hints`
//! (matched against the configured `models` table, else the default model). Answered:
//! `role`, `content`, `model`, `stopReason`. Tool use inside sampling is refused: a
//! model choosing tools on a server's behalf would run them outside any agent's grants.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Denial, InputError, InputFuture, InputHandler, InputRequestContext};
use crate::util::duration;
use crate::util::invalid::Invalid;

/// Which API shape the provider speaks.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    /// `POST {base_url}/chat/completions` (OpenAI and the many servers that copy it).
    Openai,
    /// `POST {base_url}/v1/messages` (Anthropic's Messages API).
    Anthropic,
}

/// The `[sampling]` table: the model provider and what one call may spend.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplingConfig {
    /// The API shape.
    pub provider: Provider,
    /// The API's base URL (default `https://api.openai.com/v1` or
    /// `https://api.anthropic.com`); a local model server's works.
    #[serde(default)]
    pub base_url: Option<String>,
    /// The model used unless a hint maps to another.
    pub model: String,
    /// The environment variable holding the API key (none: no key is sent).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// The most tokens one request may ask for; a larger `maxTokens` is held to it.
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u64,
    /// Tokens (prompt and completion, as the provider counts them) the sampling of one
    /// call may spend; a legacy server's requests, which name no call, share one
    /// budget per server per minute.
    #[serde(default = "default_call_budget")]
    pub call_budget_tokens: u64,
    /// Tokens all the sampling of one server may spend in a 60-second window (from
    /// its first request), whatever the call: a server that asks on every call spends
    /// at most this much a window. Unset: 65,536, or `call_budget_tokens` if larger.
    #[serde(default)]
    pub server_budget_tokens_per_minute: Option<u64>,
    /// Tokens one agent's calls may spend on sampling in a 60-second window, on every
    /// server (requests that name no agent share one such budget). Unset: no cap
    /// beyond the calls' and the servers'.
    #[serde(default)]
    pub agent_budget_tokens_per_minute: Option<u64>,
    /// Tokens all sampling may spend in a 60-second window. Unset: no such cap.
    #[serde(default)]
    pub budget_tokens_per_minute: Option<u64>,
    /// `modelPreferences` hints to model names: a hint that contains a key (or is
    /// contained in it), case-insensitively, picks that model.
    #[serde(default)]
    pub models: BTreeMap<String, String>,
    /// How long one provider request may take.
    #[serde(default = "default_timeout", with = "duration")]
    pub timeout: Duration,
    /// What one image in a request is reserved at before the provider says what it
    /// cost: the most the models used charge for one. 1,600 fits Claude and GPT-4o;
    /// some bill far more (GPT-4o mini counts a large image at up to 48,169 tokens), and
    /// a request whose images cost more than reserved passes its budgets by that much.
    #[serde(default = "default_image_tokens")]
    pub image_tokens: u64,
    /// CAs trusted for the provider besides the platform's roots (PEM).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
}

fn default_max_tokens() -> u64 {
    1024
}
fn default_call_budget() -> u64 {
    16_384
}
/// The server budget when none is set: no less than one call's.
const DEFAULT_SERVER_BUDGET: u64 = 65_536;
fn default_timeout() -> Duration {
    Duration::from_secs(60)
}
fn default_image_tokens() -> u64 {
    1_600
}

/// Whether an agent's servers may sample.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SamplingPolicy {
    /// Refused (the default).
    #[default]
    Deny,
    /// Served.
    Allow,
    /// Served once a person approves each request (the approver: the harness's
    /// approval queue, or the command line's terminal).
    Approve,
}

/// One agent's input settings: the `[agents.NAME]` table (`"*"` for every agent not
/// named, and for legacy servers' requests, which name no agent).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// Whether its servers may sample (unset: as `"*"` says, else deny).
    #[serde(default)]
    pub sampling: Option<SamplingPolicy>,
    /// The roots `roots/list` answers, `file://` URIs (unset: `"*"`'s, else none).
    #[serde(default)]
    pub roots: Option<Vec<String>>,
}

/// The sampling policy of `agent` (or of requests that name none): its own, else
/// `"*"`'s, else deny.
pub fn sampling_policy(
    agents: &BTreeMap<String, AgentConfig>,
    agent: Option<&str>,
) -> SamplingPolicy {
    agent
        .and_then(|a| agents.get(a))
        .and_then(|c| c.sampling)
        .or_else(|| agents.get("*").and_then(|c| c.sampling))
        .unwrap_or_default()
}

/// The roots of `agent` (or of requests that name none): its own, else `"*"`'s.
pub fn roots_of(agents: &BTreeMap<String, AgentConfig>, agent: Option<&str>) -> Vec<String> {
    agent
        .and_then(|a| agents.get(a))
        .and_then(|c| c.roots.clone())
        .or_else(|| agents.get("*").and_then(|c| c.roots.clone()))
        .unwrap_or_default()
}

/// The agents' settings, shared with the roots handler and replaced on reload.
pub type SharedAgents = Arc<parking_lot::RwLock<BTreeMap<String, AgentConfig>>>;

/// Largest provider response read.
const MAX_RESPONSE: usize = 4 << 20;
/// Budgets remembered at most (calls long over are forgotten first).
const MAX_BUDGETS: usize = 10_000;
/// How long a legacy server's budget lasts before it starts again.
const LEGACY_WINDOW: Duration = Duration::from_secs(60);

/// See the module docs. Cheap to clone.
#[derive(Clone)]
pub struct SamplingHandler(Arc<Sampler>);

struct Sampler {
    config: SamplingConfig,
    agents: SharedAgents,
    approver: Option<Arc<dyn InputHandler>>,
    http: reqwest::Client,
    key: Option<String>,
    /// Tokens spent per call (or per legacy server, or per server's minute).
    spent: parking_lot::Mutex<HashMap<String, Budget>>,
}

/// One budget's spending.
#[derive(Debug)]
struct Budget {
    /// Tokens spent in this window, reservations still open included.
    spent: u64,
    /// When this window started.
    start: Instant,
    /// When it was last drawn on.
    used: Instant,
    /// Tokens reserved and not settled yet (a person still to approve, a provider still
    /// to answer): carried into the next window, whose budget they draw on then.
    open: u64,
    /// Which entry this is: a reservation settles only with the entry it was taken
    /// from, not with one begun anew after it was forgotten.
    id: u64,
    /// A call's budget is kept until its call's deadline: let go while the call runs,
    /// the call would start afresh and could spend its budget again.
    keep_until: Option<Instant>,
}

/// Ids of [`Budget`] entries.
static BUDGET_IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Key prefixes of the budgets that last a minute: a server's, an agent's, everyone's.
const SERVER_MINUTE: &str = "minute:";
const AGENT_MINUTE: &str = "minute-agent:";
const ALL_MINUTE: &str = "minute-all";

/// What a budget's key names (see [`Sampler::budgets_of`]).
#[derive(Clone, Copy)]
enum BudgetOf<'k> {
    /// A call's, or a legacy server's requests of no call (`server:`, by the minute).
    Call,
    Server(&'k str),
    Agent(&'k str),
    All,
}

impl<'k> BudgetOf<'k> {
    fn of(key: &'k str) -> BudgetOf<'k> {
        if let Some(server) = key.strip_prefix(SERVER_MINUTE) {
            BudgetOf::Server(server)
        } else if let Some(agent) = key.strip_prefix(AGENT_MINUTE) {
            BudgetOf::Agent(agent)
        } else if key == ALL_MINUTE {
            BudgetOf::All
        } else {
            BudgetOf::Call
        }
    }

    fn size(self, config: &SamplingConfig) -> u64 {
        match self {
            BudgetOf::Call => config.call_budget_tokens,
            BudgetOf::Server(_) => config.server_budget(),
            BudgetOf::Agent(_) => config.agent_budget_tokens_per_minute.unwrap_or(u64::MAX),
            BudgetOf::All => config.budget_tokens_per_minute.unwrap_or(u64::MAX),
        }
    }

    fn denial(self, budget: u64, spent: u64, asked: u64) -> Denial {
        match self {
            BudgetOf::Call => Denial::BudgetExceeded {
                budget,
                spent,
                asked,
            },
            BudgetOf::Server(server) => Denial::ServerBudgetExceeded {
                server: server.to_string(),
                budget,
                spent,
                asked,
            },
            BudgetOf::Agent(agent) => Denial::AgentBudgetExceeded {
                agent: if agent.is_empty() { "(none)" } else { agent }.to_string(),
                budget,
                spent,
                asked,
            },
            BudgetOf::All => Denial::TotalBudgetExceeded {
                budget,
                spent,
                asked,
            },
        }
    }
}

impl SamplingConfig {
    /// The tokens one server's sampling may spend in a window (see
    /// [`Self::server_budget_tokens_per_minute`]).
    pub fn server_budget(&self) -> u64 {
        self.server_budget_tokens_per_minute
            .unwrap_or(DEFAULT_SERVER_BUDGET.max(self.call_budget_tokens))
    }

    /// Checks the settings as written, when a file is read. The API key is not read
    /// here: a command that starts no handler (`logout`) needs no key in its environment.
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.max_tokens == 0 {
            return Err(Invalid::new("max_tokens", "must be at least 1"));
        }
        for (field, budget) in [
            (
                "server_budget_tokens_per_minute",
                self.server_budget_tokens_per_minute,
            ),
            (
                "agent_budget_tokens_per_minute",
                self.agent_budget_tokens_per_minute,
            ),
            ("budget_tokens_per_minute", self.budget_tokens_per_minute),
        ] {
            if budget.is_some_and(|b| b < self.max_tokens) {
                return Err(Invalid::new(
                    field,
                    "must be at least max_tokens (else no request could be served)",
                ));
            }
        }
        if self.call_budget_tokens == 0 {
            return Err(Invalid::new("call_budget_tokens", "must be at least 1"));
        }
        if self.timeout.is_zero() {
            // Every provider request would time out before it is sent.
            return Err(Invalid::new("timeout", "must be more than zero"));
        }
        if self.image_tokens == 0 {
            // Images would be free to the budgets until the provider says.
            return Err(Invalid::new("image_tokens", "must be at least 1"));
        }
        // A variable's name, not its value: `"${OPENAI_API_KEY}"` here would put the key
        // itself in the name, and a "not set" error would print it.
        if let Some(var) = &self.api_key_env
            && !is_variable_name(var)
        {
            return Err(Invalid::new(
                "api_key_env",
                "must be the name of an environment variable (letters, digits and _), not its value",
            ));
        }
        let parsed = url::Url::parse(&base_url(self))
            .map_err(|e| Invalid::new("base_url", format!("is not a URL: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(Invalid::new("base_url", "must be http or https"));
        }
        // The endpoint's path is appended to the base's: a fragment would hide it, and
        // credentials in the URL would go out unlike the key (put them in api_key_env).
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(Invalid::new(
                "base_url",
                "must not hold credentials (name the key's variable in api_key_env)",
            ));
        }
        if parsed.fragment().is_some() {
            return Err(Invalid::new("base_url", "must not have a fragment (#…)"));
        }
        // The key goes with the first request, before any answer could say to use
        // HTTPS: in clear only to this machine.
        // A query may hold a key too (`?api_key=${KEY}`).
        if parsed.scheme() == "http"
            && (self.api_key_env.is_some() || parsed.query().is_some())
            && !crate::transport::auth::is_loopback(&parsed)
        {
            return Err(Invalid::new(
                "base_url",
                "must be https to send an API key (or a query) beyond this machine (http is for a local model server)",
            ));
        }
        Ok(())
    }

    /// The API key, read from its variable now, when one is named (checked to be a
    /// variable's name: an error quotes it).
    fn api_key(&self) -> Result<Option<String>, Invalid> {
        let Some(var) = &self.api_key_env else {
            return Ok(None);
        };
        let key = std::env::var(var)
            .map_err(|_| Invalid::new("api_key_env", format!("the variable {var} is not set")))?;
        // Found out here, not as every request failing at send time.
        reqwest::header::HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| {
            Invalid::new(
                "api_key_env",
                format!("the variable {var} holds characters a header cannot carry"),
            )
        })?;
        Ok(Some(key))
    }
}

/// Whether `name` could name an environment variable (`[A-Za-z_][A-Za-z0-9_]*`).
fn is_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl SamplingHandler {
    /// A handler for `config`, reading the API key from its variable now; `approver`
    /// answers the requests of agents whose policy is `approve`.
    pub fn new(
        config: SamplingConfig,
        agents: SharedAgents,
        approver: Option<Arc<dyn InputHandler>>,
    ) -> Result<SamplingHandler, Invalid> {
        config.validate()?;
        let key = config.api_key()?;
        let tls = crate::transport::tls::client_config(config.ca_file.as_deref())
            .map_err(|e| Invalid::new("ca_file", e))?;
        // Checked to parse by `validate`.
        let url = url::Url::parse(&base_url(&config))
            .map_err(|e| Invalid::new("base_url", format!("is not a URL: {e}")))?;
        let http = crate::transport::client_builder(&url)
            .tls_backend_preconfigured(tls)
            // The provider is the operator's; its redirects are not followed anyway.
            .redirect(reqwest::redirect::Policy::none())
            .timeout(config.timeout)
            .build()
            .map_err(|e| Invalid::new("(client)", e.to_string()))?;
        Ok(SamplingHandler(Arc::new(Sampler {
            config,
            agents,
            approver,
            http,
            key,
            spent: parking_lot::Mutex::default(),
        })))
    }
}

/// When a person's approval stops being waited for, for an answer due by `answer_by`:
/// early enough that the provider then has its `timeout`, or half the time there is if
/// that is less (else an approval in the last second would leave the provider a second,
/// and its request, cut off, would be charged in full).
fn approve_by(answer_by: Option<Instant>, timeout: Duration) -> Option<Instant> {
    let answer_by = answer_by?;
    let left = answer_by.saturating_duration_since(Instant::now());
    answer_by.checked_sub(timeout.min(left / 2))
}

/// A reservation, settled when dropped: given back (`charged` 0) until the provider
/// is asked, charged in full from then on (the provider may bill a request whose
/// answer is lost: failed, cut short, or dropped with its handler). Either way it is
/// no longer open, so it is not carried into the budgets' next windows.
struct Reservation<'a> {
    sampler: &'a Sampler,
    /// The budgets reserved from (see [`Sampler::budgets_of`]) and their ids.
    budgets: Vec<(String, u64)>,
    asked: u64,
    /// What it is settled at if dropped.
    charged: u64,
}

impl Reservation<'_> {
    /// Settles it at what the provider says was used.
    fn settle(mut self, used: u64) {
        self.charged = used;
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        for (key, id) in &self.budgets {
            self.sampler.settle(key, *id, self.asked, self.charged);
        }
    }
}

impl Sampler {
    /// The budget a request draws on.
    fn budget_key(request: &InputRequestContext) -> String {
        match request.call_id {
            Some(id) => format!("call:{id}"),
            None => format!("server:{}", request.server),
        }
    }

    /// Every budget a request draws on: its call's (or its legacy server's minute),
    /// its server's minute, and, when set, its agent's minute and everyone's.
    fn budgets_of(&self, request: &InputRequestContext) -> Vec<String> {
        let mut keys = vec![Self::budget_key(request), Self::server_key(&request.server)];
        if self.config.agent_budget_tokens_per_minute.is_some() {
            keys.push(format!(
                "{AGENT_MINUTE}{}",
                request.agent_id.as_deref().unwrap_or("")
            ));
        }
        if self.config.budget_tokens_per_minute.is_some() {
            keys.push(ALL_MINUTE.to_string());
        }
        keys
    }

    /// The key of the budget all of `server`'s sampling draws on in a minute.
    fn server_key(server: &str) -> String {
        format!("{SERVER_MINUTE}{server}")
    }

    /// Reserves `asked` tokens of each of `keys`, or of none and says why not; the
    /// ids of the budgets, in order.
    fn reserve_all(&self, keys: &[String], asked: u64) -> Result<Vec<u64>, Denial> {
        let mut ids = Vec::with_capacity(keys.len());
        for key in keys {
            match self.reserve(key, asked) {
                Ok(id) => ids.push(id),
                Err(denial) => {
                    for (key, id) in keys.iter().zip(&ids) {
                        self.settle(key, *id, asked, 0);
                    }
                    return Err(denial);
                }
            }
        }
        Ok(ids)
    }

    /// Keeps the call budget `key` at least until `until` (its call's deadline).
    fn keep_for_call(&self, key: &str, until: Instant) {
        if !key.starts_with("call:") {
            return;
        }
        if let Some(b) = self.spent.lock().get_mut(key) {
            b.keep_until = Some(b.keep_until.map_or(until, |t| t.max(until)));
        }
    }

    /// Reserves `asked` tokens of the budget `key`, or says why not; the id of the
    /// budget it was taken from.
    fn reserve(&self, key: &str, asked: u64) -> Result<u64, Denial> {
        let of = BudgetOf::of(key);
        let windowed = key.starts_with("server:") || !matches!(of, BudgetOf::Call);
        let budget = of.size(&self.config);
        let mut spent = self.spent.lock();
        let now = Instant::now();
        if spent.len() >= MAX_BUDGETS {
            // Calls idle this long are over (a running call's entry is used again);
            // if that is not enough, the least recently used go too, down to half, so
            // that the next clean-up is as far away (never a scan on every request).
            // A budget with tokens still reserved is kept: they settle with it.
            let running = |b: &Budget| b.keep_until.is_some_and(|t| t > now);
            spent.retain(|k, b| {
                k == key
                    || b.open > 0
                    || running(b)
                    || now.duration_since(b.used) < Duration::from_secs(600)
            });
            // Running calls' budgets are kept by the first cut; if too many run for
            // it to bring the map under three quarters, a second cut takes them too,
            // least recently used first (a deadline may be hours away): the map stays
            // bounded, and the next clean-up a quarter of it away.
            for (keep_running, above) in [(true, MAX_BUDGETS / 2), (false, MAX_BUDGETS * 3 / 4)] {
                if spent.len() <= above {
                    break;
                }
                let mut last_used: Vec<Instant> = spent.values().map(|b| b.used).collect();
                let cut = spent.len() - MAX_BUDGETS / 2;
                let (_, oldest_kept, _) = last_used.select_nth_unstable(cut);
                let oldest_kept = *oldest_kept;
                // The budget asked of now is kept, whatever its age, and so are the
                // open windows (per server, per agent, of requests no call made): else
                // a server's calls could push its own window's spending out.
                spent.retain(|k, b| {
                    k == key
                        || b.open > 0
                        || (keep_running && running(b))
                        || b.used >= oldest_kept
                        || ((k.starts_with("minute") || k.starts_with("server:"))
                            && now.duration_since(b.start) < LEGACY_WINDOW)
                });
            }
        }
        let entry = spent.entry(key.to_string()).or_insert_with(|| Budget {
            spent: 0,
            start: now,
            used: now,
            open: 0,
            id: BUDGET_IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            keep_until: None,
        });
        if windowed && now.duration_since(entry.start) >= LEGACY_WINDOW {
            // A new window: what is still reserved draws on it, else a server could
            // reserve a full budget each minute while its requests wait for a person.
            entry.spent = entry.open;
            entry.start = now;
        }
        entry.used = now;
        if entry.spent.saturating_add(asked) > budget {
            return Err(of.denial(budget, entry.spent, asked));
        }
        entry.spent = entry.spent.saturating_add(asked);
        entry.open = entry.open.saturating_add(asked);
        Ok(entry.id)
    }

    /// Replaces the reservation with what the provider says was used, in the window
    /// now (a reservation still open is carried into each new window); a budget
    /// forgotten and begun anew since owes it nothing.
    fn settle(&self, key: &str, id: u64, reserved: u64, used: u64) {
        if let Some(entry) = self.spent.lock().get_mut(key)
            && entry.id == id
        {
            entry.open = entry.open.saturating_sub(reserved);
            entry.spent = entry.spent.saturating_sub(reserved).saturating_add(used);
        }
    }

    /// The model a request's hints pick.
    fn model(&self, params: &Value) -> String {
        let hints = params
            .pointer("/modelPreferences/hints")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|h| h.get("name").and_then(Value::as_str));
        // An empty hint names nothing (it is contained in every key). Of the keys a hint
        // matches, the closest: the key itself, else the longest key in the hint
        // ("claude-3-5-haiku" is "haiku" before "claude"), else the shortest key that
        // holds the hint.
        for hint in hints.filter(|h| !h.trim().is_empty()) {
            let hint = hint.to_lowercase();
            let best = self
                .config
                .models
                .iter()
                .filter_map(|(key, model)| {
                    let key = key.to_lowercase();
                    let rank = if key.is_empty() {
                        return None;
                    } else if key == hint {
                        (2, 0)
                    } else if hint.contains(&key) {
                        (1, key.len())
                    } else if key.contains(&hint) {
                        (0, usize::MAX - key.len())
                    } else {
                        return None;
                    };
                    Some((rank, model))
                })
                // The first of equals, in the table's order.
                .fold(
                    None,
                    |best: Option<((u8, usize), &String)>, (rank, model)| match best {
                        Some((r, _)) if r >= rank => best,
                        _ => Some((rank, model)),
                    },
                );
            if let Some((_, model)) = best {
                return model.clone();
            }
        }
        self.config.model.clone()
    }

    async fn serve(&self, request: InputRequestContext) -> Result<Value, InputError> {
        let agent = match (&request.agent_id, request.shared) {
            (_, true) => "(no one agent)".to_string(),
            (Some(a), false) => a.clone(),
            (None, false) => "(none)".to_string(),
        };
        // A request several agents' calls may have caused is none of theirs to allow.
        let policy = match request.shared {
            true => SamplingPolicy::Deny,
            false => sampling_policy(&self.agents.read(), request.agent_id.as_deref()),
        };
        if policy == SamplingPolicy::Deny {
            return Err(InputError::Denied(Denial::NotAllowed { agent }));
        }
        let params = &request.params;
        if params.get("tools").is_some() || params.get("toolChoice").is_some() {
            return Err(InputError::Failed(
                "sampling with tools is not supported by this client".into(),
            ));
        }
        // What cannot be sent is said plainly (it is the server's request, not the
        // provider's failure).
        let messages = messages_of(params, self.config.provider).map_err(InputError::Failed)?;
        check_extras(params, self.config.provider).map_err(InputError::Failed)?;
        let max_tokens = params
            .get("maxTokens")
            .and_then(Value::as_u64)
            .unwrap_or(self.config.max_tokens)
            .clamp(1, self.config.max_tokens);
        // The prompt counts too, estimated on the high side before the provider says:
        // several requests of one round are reserved before any is settled.
        let prompt = prompt_tokens(&messages, self.config.image_tokens).saturating_add(
            params
                .get("systemPrompt")
                .and_then(Value::as_str)
                .map_or(0, text_tokens),
        );
        let asked = max_tokens.saturating_add(prompt);
        let keys = self.budgets_of(&request);
        let ids = self.reserve_all(&keys, asked).map_err(InputError::Denied)?;
        if let Some(until) = request.call_deadline {
            self.keep_for_call(&Self::budget_key(&request), until);
        }
        // A person is asked last: a request the checks above refuse waits for nobody.
        // What they do not approve is given back to the budget, also when nobody answers
        // in time or the request is withdrawn (this future is then dropped).
        let mut reservation = Reservation {
            sampler: self,
            budgets: keys.into_iter().zip(ids).collect(),
            asked,
            charged: 0,
        };
        let model = self.model(params);
        if policy == SamplingPolicy::Approve {
            let approved = match &self.approver {
                Some(approver) => {
                    let by = approve_by(request.answer_by, self.config.timeout);
                    let mut ask = for_approval(&request, &model, max_tokens, asked);
                    // What the approver shows as due is when the wait for it ends.
                    ask.answer_by = by.or(ask.answer_by);
                    let asking = approver.answer(ask);
                    let asked_at = Instant::now();
                    let answer = match by {
                        // Not answered in time: a timeout of the approval (`InputFailed`
                        // for the call, which had time left, kept for the provider).
                        Some(by) => tokio::time::timeout_at(by.into(), asking)
                            .await
                            .map_err(|_| InputError::Timeout(asked_at.elapsed()))
                            .and_then(|a| a),
                        None => asking.await,
                    };
                    answer.map(|a| a.get("action").and_then(Value::as_str) == Some("accept"))
                }
                None => Ok(false),
            };
            if !matches!(approved, Ok(true)) {
                approved?;
                return Err(InputError::Denied(Denial::NotApproved));
            }
            // A person may answer minutes later, after a reload took the agent's
            // sampling away: what the policy says now is what pays the provider.
            let now = sampling_policy(&self.agents.read(), request.agent_id.as_deref());
            if now == SamplingPolicy::Deny {
                return Err(InputError::Denied(Denial::NotAllowed { agent }));
            }
        }
        reservation.charged = asked;
        let outcome = match self.config.provider {
            Provider::Openai => self.openai(params, &messages, &model, max_tokens).await,
            Provider::Anthropic => self.anthropic(params, &messages, &model, max_tokens).await,
        };
        match outcome {
            Ok((result, used)) => {
                reservation.settle(charge(used, asked, &result));
                Ok(result)
            }
            Err(e) => {
                // Charged what was reserved: the provider may have billed a request
                // whose answer was lost (a timeout, a reply cut short), and a failing
                // provider is not asked again and again within one budget.
                // The detail may name the provider's address: the log has it, the
                // server and the downstream client do not.
                tracing::warn!(server = %request.server, error = %e, "sampling failed");
                Err(InputError::Failed("the model provider failed".into()))
            }
        }
    }

    async fn post(
        &self,
        url: url::Url,
        body: Value,
        headers: &[(&str, &str)],
    ) -> Result<Value, String> {
        let mut req = self
            .http
            .post(url)
            .header("content-type", "application/json")
            .body(body.to_string());
        for (k, v) in headers {
            // Checked to fit in a header when read; a key is never indexed by HTTP/2's
            // header compression, nor shown by a `Debug`.
            let mut value = reqwest::header::HeaderValue::from_str(v)
                .map_err(|_| format!("provider: header {k} is not one"))?;
            value.set_sensitive(true);
            req = req.header(*k, value);
        }
        let mut resp = req
            .send()
            .await
            .map_err(|e| format!("provider: {}", crate::util::text::http_failure(e)))?;
        let status = resp.status();
        let mut bytes = Vec::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| format!("provider: {}", crate::util::text::http_failure(e)))?
        {
            if bytes.len() + chunk.len() > MAX_RESPONSE {
                return Err(format!(
                    "provider: response larger than {MAX_RESPONSE} bytes"
                ));
            }
            bytes.extend_from_slice(&chunk);
        }
        let value: Value = serde_json::from_slice(&bytes)
            .map_err(|e| format!("provider: HTTP {}: not JSON: {e}", status.as_u16()))?;
        if !status.is_success() {
            let message = value
                .pointer("/error/message")
                .and_then(Value::as_str)
                .unwrap_or("");
            // A compatible server may quote the key it refused: the log never has it.
            let message = match &self.key {
                Some(key) if !key.is_empty() => message.replace(key.as_str(), "[key]"),
                _ => message.to_string(),
            };
            return Err(format!(
                "provider: HTTP {}: {}",
                status.as_u16(),
                crate::util::text::one_line(&message, 200)
            ));
        }
        Ok(value)
    }

    async fn openai(
        &self,
        params: &Value,
        asked: &[Message],
        model: &str,
        max_tokens: u64,
    ) -> Result<(Value, Option<u64>), String> {
        let mut messages = Vec::new();
        if let Some(system) = params.get("systemPrompt").and_then(Value::as_str) {
            messages.push(json!({"role": "system", "content": system}));
        }
        messages.extend(wire(asked, |data, mime| {
            json!({"type": "image_url", "image_url": {"url": format!("data:{mime};base64,{data}")}})
        }));
        let mut body = json!({"model": model, "messages": messages, "max_tokens": max_tokens});
        extras(params, &mut body, "stop");
        let url = endpoint(&self.config, &["chat", "completions"])?;
        let auth = self.key.as_ref().map(|k| format!("Bearer {k}"));
        let headers: Vec<(&str, &str)> =
            auth.iter().map(|a| ("authorization", a.as_str())).collect();
        let answer = self.post(url, body, &headers).await?;
        let choice = answer
            .pointer("/choices/0")
            .ok_or("provider: no choices in the answer")?;
        // A refusal comes as its own text, in place of the content.
        let refusal = choice.pointer("/message/refusal").and_then(Value::as_str);
        let (text, reason) = match (
            choice.pointer("/message/content").and_then(Value::as_str),
            refusal,
        ) {
            (Some(text), _) => (text, choice.get("finish_reason").and_then(Value::as_str)),
            (None, Some(refusal)) => (refusal, Some("refusal")),
            (None, None) => return Err("provider: the answer has no text".into()),
        };
        let stop = stop_reason(reason, &[("stop", "endTurn"), ("length", "maxTokens")]);
        let used = answer
            .pointer("/usage/total_tokens")
            .and_then(Value::as_u64);
        Ok((
            result(
                text,
                answer.get("model").and_then(Value::as_str).unwrap_or(model),
                &stop,
            ),
            used,
        ))
    }

    async fn anthropic(
        &self,
        params: &Value,
        asked: &[Message],
        model: &str,
        max_tokens: u64,
    ) -> Result<(Value, Option<u64>), String> {
        let messages = wire(
            asked,
            |data, mime| json!({"type": "image", "source": {"type": "base64", "media_type": mime, "data": data}}),
        );
        let mut body = json!({"model": model, "messages": messages, "max_tokens": max_tokens});
        if let Some(system) = params.get("systemPrompt").and_then(Value::as_str) {
            body["system"] = json!(system);
        }
        extras(params, &mut body, "stop_sequences");
        let url = endpoint(&self.config, &["v1", "messages"])?;
        let mut headers = vec![("anthropic-version", "2023-06-01")];
        if let Some(k) = &self.key {
            headers.push(("x-api-key", k.as_str()));
        }
        let answer = self.post(url, body, &headers).await?;
        let text: String = answer
            .get("content")
            .and_then(Value::as_array)
            .ok_or("provider: the answer has no content")?
            .iter()
            .filter(|c| c.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|c| c.get("text").and_then(Value::as_str))
            .collect();
        let stop = stop_reason(
            answer.get("stop_reason").and_then(Value::as_str),
            &[
                ("end_turn", "endTurn"),
                ("max_tokens", "maxTokens"),
                ("stop_sequence", "stopSequence"),
            ],
        );
        let used = match (
            answer
                .pointer("/usage/input_tokens")
                .and_then(Value::as_u64),
            answer
                .pointer("/usage/output_tokens")
                .and_then(Value::as_u64),
        ) {
            (Some(i), Some(o)) => Some(i.saturating_add(o)),
            _ => None,
        };
        Ok((
            result(
                &text,
                answer.get("model").and_then(Value::as_str).unwrap_or(model),
                &stop,
            ),
            used,
        ))
    }
}

impl InputHandler for SamplingHandler {
    fn answer(&self, request: InputRequestContext) -> InputFuture {
        let sampler = self.0.clone();
        Box::pin(async move { sampler.serve(request).await })
    }
}

/// The provider's stop reason in MCP's words: those it has (`known`, the provider's
/// name and MCP's), else the provider's own, cut short (MCP's `stopReason` is open: a
/// refusal or a content filter is not told as a turn that ended), else `endTurn`.
fn stop_reason(reason: Option<&str>, known: &[(&str, &'static str)]) -> String {
    let Some(reason) = reason.filter(|r| !r.is_empty()) else {
        return "endTurn".into();
    };
    match known.iter().find(|(theirs, _)| *theirs == reason) {
        Some((_, ours)) => (*ours).into(),
        None => crate::util::text::one_line(reason, 64),
    }
}

/// What the provider answered, as `CreateMessageResult`.
fn result(text: &str, model: &str, stop: &str) -> Value {
    json!({
        "role": "assistant",
        "content": {"type": "text", "text": text},
        "model": model,
        "stopReason": stop,
    })
}

/// The provider's endpoint: `path` after the base URL's own path, its query kept.
fn endpoint(config: &SamplingConfig, path: &[&str]) -> Result<url::Url, String> {
    // Checked to parse by `validate`, and to be http(s), which can have a path.
    let mut url = url::Url::parse(&base_url(config)).map_err(|e| format!("base_url: {e}"))?;
    url.path_segments_mut()
        .map_err(|()| "base_url cannot have a path".to_string())?
        .pop_if_empty()
        .extend(path);
    Ok(url)
}

fn base_url(config: &SamplingConfig) -> String {
    config.base_url.clone().unwrap_or_else(|| {
        match config.provider {
            Provider::Openai => "https://api.openai.com/v1",
            Provider::Anthropic => "https://api.anthropic.com",
        }
        .to_string()
    })
}

/// The `_meta` key under which an approver is told what the harness will do with a
/// sampling request: the model, the `maxTokens` it sends (capped), and the tokens
/// reserved from the budgets. Set by the harness whatever the server put there.
pub const APPROVAL_META: &str = "mcp-harness/sampling";

/// Messages of a sampling request a [`SamplingReview`] holds.
pub const REVIEW_MESSAGES: usize = 8;
/// Characters of each text a [`SamplingReview`] holds.
pub const REVIEW_CHARS: usize = 500;

/// What a person approves of a sampling request, as every approver shows it (the
/// terminal's, `mcp-harness approvals` through the admin endpoint): the plan the
/// harness noted, the instructions the model would follow (the system prompt and the
/// first [`REVIEW_MESSAGES`] messages, each text cut at [`REVIEW_CHARS`] with its
/// whole length), and how many messages there are. Worked out from the request as
/// sent, so that what is cut is said truly, whatever a listing cut after it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SamplingReview {
    /// The model the harness will ask, if it said.
    pub model: Option<String>,
    /// The `maxTokens` it will send (capped).
    pub max_tokens: Option<u64>,
    /// The tokens reserved from the budgets.
    pub reserved_tokens: Option<u64>,
    /// The system prompt, if any.
    pub system: Option<ReviewText>,
    /// The first messages.
    pub messages: Vec<ReviewText>,
    /// How many messages the request has.
    pub message_count: usize,
}

/// A text of a request under review: its start, and how long it is.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReviewText {
    /// Whose it is (a message's role), if anyone's.
    pub role: Option<String>,
    /// Its first [`REVIEW_CHARS`] characters.
    pub text: String,
    /// Its length in characters.
    pub chars: usize,
}

impl ReviewText {
    fn of(role: Option<&str>, text: &str) -> ReviewText {
        ReviewText {
            role: role.map(|r| r.chars().take(32).collect()),
            text: text.chars().take(REVIEW_CHARS).collect(),
            chars: text.chars().count(),
        }
    }
}

/// The review of a sampling request's params (see [`SamplingReview`]). Every block
/// of a message counts: text in full, other kinds by their type, so that no block
/// hides behind the first.
pub fn review(params: &Value) -> SamplingReview {
    let plan = &params["_meta"][APPROVAL_META];
    let block = |b: &Value| match b["type"].as_str() {
        Some("text") => b["text"].as_str().unwrap_or("").to_string(),
        Some(kind) => format!("[{kind} {}]", b["mimeType"].as_str().unwrap_or("")),
        None => "[?]".to_string(),
    };
    let messages = params["messages"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    SamplingReview {
        model: plan["model"]
            .as_str()
            .map(|m| m.chars().take(256).collect()),
        max_tokens: plan["maxTokens"].as_u64(),
        reserved_tokens: plan["reservedTokens"].as_u64(),
        system: params["systemPrompt"]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(|s| ReviewText::of(None, s)),
        messages: messages
            .iter()
            .take(REVIEW_MESSAGES)
            .map(|m| {
                let text = match &m["content"] {
                    Value::Array(blocks) => blocks.iter().map(block).collect::<Vec<_>>().join(" "),
                    one => block(one),
                };
                ReviewText::of(Some(m["role"].as_str().unwrap_or("?")), &text)
            })
            .collect(),
        message_count: messages.len(),
    }
}

/// The request as an approver sees it: the server's params, with [`APPROVAL_META`]
/// in their `_meta`.
fn for_approval(
    request: &InputRequestContext,
    model: &str,
    max_tokens: u64,
    reserved: u64,
) -> InputRequestContext {
    let mut request = request.clone();
    if let Some(params) = request.params.as_object_mut() {
        let meta = params
            .entry("_meta")
            .or_insert_with(|| Value::Object(Default::default()));
        if !meta.is_object() {
            *meta = Value::Object(Default::default());
        }
        if let Some(meta) = meta.as_object_mut() {
            meta.insert(
                APPROVAL_META.into(),
                json!({"model": model, "maxTokens": max_tokens, "reservedTokens": reserved}),
            );
        }
    }
    request
}

/// `temperature` and `stopSequences`, checked against what `provider` takes: a
/// request it would refuse is the server's to hear of, not a provider failure that
/// costs its budgets.
fn check_extras(params: &Value, provider: Provider) -> Result<(), String> {
    let (hottest, most_stops) = match provider {
        Provider::Openai => (2.0, 4),
        Provider::Anthropic => (1.0, 16),
    };
    match params.get("temperature") {
        None | Some(Value::Null) => {}
        Some(t) => match t.as_f64() {
            Some(t) if (0.0..=hottest).contains(&t) => {}
            _ => return Err(format!("temperature must be a number from 0 to {hottest}")),
        },
    }
    match params.get("stopSequences") {
        None | Some(Value::Null) => {}
        Some(Value::Array(stop))
            if stop.len() <= most_stops
                && stop
                    .iter()
                    .all(|s| s.as_str().is_some_and(|s| !s.is_empty())) => {}
        Some(_) => {
            return Err(format!(
                "stopSequences must be at most {most_stops} non-empty strings"
            ));
        }
    }
    Ok(())
}

/// `temperature` and `stopSequences` (under the provider's name), when given; checked
/// by [`check_extras`].
fn extras(params: &Value, body: &mut Value, stop_key: &str) {
    if let Some(t) = params.get("temperature").and_then(Value::as_f64) {
        body["temperature"] = json!(t);
    }
    if let Some(stop) = params.get("stopSequences").and_then(Value::as_array)
        && !stop.is_empty()
    {
        let stop: Vec<&str> = stop.iter().filter_map(Value::as_str).collect();
        body[stop_key] = json!(stop);
    }
}

/// The image types both providers take.
const IMAGE_TYPES: &[&str] = &["image/png", "image/jpeg", "image/gif", "image/webp"];

/// The largest image data (its base64 text) `provider` takes: past it, or not base64,
/// the provider refuses, and that refusal would be charged. Anthropic counts 5 MiB of
/// the base64 text; OpenAI takes images of up to 20 MB (counted here on the text too,
/// to be safe either way).
fn max_image_base64(provider: Provider) -> usize {
    match provider {
        Provider::Anthropic => 5 << 20,
        Provider::Openai => 20_000_000,
    }
}

/// An image's `data`, if a provider would take it: standard base64 (padded or not), of
/// at most `max` bytes.
fn image_data(data: String, max: usize) -> Result<String, String> {
    if data.len() > max {
        return Err(format!(
            "image content over {max} bytes of base64 is not supported by this client's provider"
        ));
    }
    let body = data.trim_end_matches('=');
    let padding = data.len() - body.len();
    let base64 = !body.is_empty()
        && body.len() % 4 != 1
        && padding <= 2
        && (padding == 0 || data.len().is_multiple_of(4))
        && body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/');
    if !base64 {
        return Err("image content whose data is not base64".into());
    }
    Ok(data)
}

/// One content part of a sampling message.
enum Part {
    Text(String),
    Image { data: String, mime: String },
}

/// What a served request costs its budgets: what the provider says it used, unless it
/// says nothing or less than any request costs (a prompt of a token at least, and the
/// text sent back at eight bytes a token, fewer than any tokenizer makes of it): then
/// all that was reserved. A compatible server that reports 0, as some do for a cached
/// prompt, would otherwise leave every budget unbound.
fn charge(used: Option<u64>, asked: u64, result: &Value) -> u64 {
    let received = result
        .pointer("/content/text")
        .and_then(Value::as_str)
        .map_or(0, |t| t.len() as u64 / 8);
    match used {
        Some(used) if used > received => used,
        _ => asked,
    }
}

/// A high estimate of `text`'s tokens, not a bound: four ASCII bytes a token (English
/// runs about that; code and digits run denser), any other character a token of its
/// own (scripts and symbols that tokenizers split finely).
fn text_tokens(text: &str) -> u64 {
    let ascii = text.bytes().filter(u8::is_ascii).count() as u64;
    let other = text.chars().filter(|c| !c.is_ascii()).count() as u64;
    (ascii / 4).saturating_add(other).saturating_add(1)
}

/// The prompt's reservation: its text as [`text_tokens`] counts it, each image at
/// `image_tokens` (providers charge by an image's pixels, not its bytes), and a few
/// tokens a message for its framing.
fn prompt_tokens(messages: &[Message], image_tokens: u64) -> u64 {
    messages
        .iter()
        .flat_map(|m| m.content.iter())
        .map(|part| match part {
            Part::Text(t) => text_tokens(t),
            Part::Image { .. } => image_tokens,
        })
        .fold(4 * messages.len() as u64, u64::saturating_add)
}

struct Message {
    role: &'static str,
    content: Vec<Part>,
}

/// Messages in a provider's shape: role and content parts, images as `image` says.
fn wire(messages: &[Message], image: impl Fn(&str, &str) -> Value) -> Vec<Value> {
    messages
        .iter()
        .map(|m| {
            let parts: Vec<Value> = m
                .content
                .iter()
                .map(|c| match c {
                    Part::Text(t) => json!({"type": "text", "text": t}),
                    Part::Image { data, mime } => image(data, mime),
                })
                .collect();
            json!({"role": m.role, "content": parts})
        })
        .collect()
}

/// The request's messages; content may be one block or a list of them.
fn messages_of(params: &Value, provider: Provider) -> Result<Vec<Message>, String> {
    let messages = params
        .get("messages")
        .and_then(Value::as_array)
        .filter(|m| !m.is_empty())
        .ok_or("sampling request without messages")?;
    let mut out = Vec::new();
    for m in messages {
        let role = match m.get("role").and_then(Value::as_str) {
            Some("user") => "user",
            Some("assistant") => "assistant",
            other => {
                let role = crate::util::text::one_line(other.unwrap_or("(none)"), 40);
                return Err(format!("sampling message with role \"{role}\""));
            }
        };
        let blocks: Vec<&Value> = match m.get("content") {
            Some(Value::Array(list)) if !list.is_empty() => list.iter().collect(),
            Some(v @ Value::Object(_)) => vec![v],
            _ => return Err("sampling message without content".into()),
        };
        let mut content = Vec::new();
        for b in blocks {
            let field = |k: &str| b.get(k).and_then(Value::as_str).map(String::from);
            match b.get("type").and_then(Value::as_str) {
                // Providers refuse an empty text block: said here, as the server's.
                Some("text") => match field("text").filter(|t| !t.is_empty()) {
                    Some(text) => content.push(Part::Text(text)),
                    None => return Err("text content without text".into()),
                },
                // Both providers take images from the user only, in these types.
                Some("image") if role == "assistant" => {
                    return Err("image content in an assistant message is not supported".into());
                }
                Some("image") => {
                    let mime = field("mimeType").ok_or("image content without mimeType")?;
                    if !IMAGE_TYPES.contains(&mime.as_str()) {
                        let mime = crate::util::text::one_line(&mime, 40);
                        return Err(format!(
                            "image content of type \"{mime}\" is not supported ({} are)",
                            IMAGE_TYPES.join(", ")
                        ));
                    }
                    content.push(Part::Image {
                        data: image_data(
                            field("data").ok_or("image content without data")?,
                            max_image_base64(provider),
                        )?,
                        mime,
                    });
                }
                other => {
                    let kind = crate::util::text::one_line(other.unwrap_or("(none)"), 40);
                    return Err(format!(
                        "sampling content of type \"{kind}\" is not supported (text and image are)"
                    ));
                }
            }
        }
        out.push(Message { role, content });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request of 100 messages, the first of 40,000 characters, the second with an
    /// image after its text.
    fn long_request() -> Value {
        let mut messages =
            vec![json!({"role": "user", "content": {"type": "text", "text": "x".repeat(40_000)}})];
        messages.push(json!({"role": "user", "content": [
            {"type": "text", "text": "see"},
            {"type": "image", "mimeType": "image/png", "data": "AA"},
        ]}));
        messages.extend((0..98).map(
            |i| json!({"role": "assistant", "content": {"type": "text", "text": format!("m{i}")}}),
        ));
        json!({
            "messages": messages,
            "systemPrompt": "Be brief.",
            "_meta": {APPROVAL_META: {"model": "m", "maxTokens": 9, "reservedTokens": 12}},
        })
    }

    // A review says truly how much it leaves out, whatever a listing cuts after it.
    #[test]
    fn a_review_says_how_long_each_text_is_and_how_many_messages_there_are() {
        let r = review(&long_request());
        assert_eq!(r.message_count, 100);
        assert_eq!(r.messages.len(), REVIEW_MESSAGES);
        assert_eq!(r.messages[0].chars, 40_000);
        assert_eq!(r.messages[0].text.chars().count(), REVIEW_CHARS);
        assert_eq!(r.messages[1].text, "see [image image/png]");
        assert_eq!(r.messages[1].role.as_deref(), Some("user"));
        assert_eq!(
            r.system.as_ref().map(|s| s.text.as_str()),
            Some("Be brief.")
        );
        assert_eq!(
            (r.model.as_deref(), r.max_tokens, r.reserved_tokens),
            (Some("m"), Some(9), Some(12))
        );
    }

    #[test]
    fn a_servers_role_and_content_type_are_quoted_cut_and_escaped() {
        let long = format!("\u{1b}[2J{}", "k".repeat(100_000));
        let role = json!({"messages": [{"role": long, "content": {"type": "text", "text": "x"}}]});
        let kind = json!({"messages": [{"role": "user", "content": {"type": long}}]});
        for params in [role, kind] {
            let Err(e) = messages_of(&params, Provider::Anthropic) else {
                panic!("taken");
            };
            assert!(e.len() < 200 && !e.contains('\u{1b}'), "{e}");
        }
    }

    /// A provider on loopback where nothing listens, with these limits.
    fn local(
        model: &str,
        max_tokens: u64,
        call_budget_tokens: u64,
        models: BTreeMap<String, String>,
    ) -> SamplingConfig {
        SamplingConfig {
            provider: Provider::Openai,
            base_url: Some("http://127.0.0.1:9".into()),
            model: model.into(),
            api_key_env: None,
            max_tokens,
            call_budget_tokens,
            server_budget_tokens_per_minute: None,
            agent_budget_tokens_per_minute: None,
            budget_tokens_per_minute: None,
            models,
            timeout: Duration::from_secs(1),
            ca_file: None,
            image_tokens: default_image_tokens(),
        }
    }

    /// Says no to every request, counting them.
    struct Declining(std::sync::atomic::AtomicUsize);

    impl InputHandler for Declining {
        fn answer(&self, _: InputRequestContext) -> crate::call::input::InputFuture {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async { Ok(serde_json::json!({"action": "decline"})) })
        }
    }

    /// Agents of whom only `agent` may sample, once a person approves.
    fn approving(agent: &str) -> SharedAgents {
        let agents = SharedAgents::default();
        agents.write().insert(
            agent.into(),
            AgentConfig {
                sampling: Some(SamplingPolicy::Approve),
                roots: None,
            },
        );
        agents
    }

    #[tokio::test]
    async fn a_person_is_asked_only_what_the_checks_let_through_and_a_refusal_costs_nothing() {
        let config = local("m", 100, 200, BTreeMap::new());
        let agents = approving("a");
        let person = Arc::new(Declining(Default::default()));
        let handler = SamplingHandler::new(config, agents, Some(person.clone())).expect("handler");
        // The call's deadline: its budget is kept until then.
        let ends = Instant::now() + Duration::from_secs(3600);
        let request = |params: Value| InputRequestContext {
            server: "s".into(),
            method: "sampling/createMessage".into(),
            params,
            agent_id: Some("a".into()),
            key: "k".into(),
            call_id: Some(7),
            call_deadline: Some(ends),
            shared: false,
            answer_by: None,
        };
        let asked = || person.0.load(std::sync::atomic::Ordering::SeqCst);
        let hello =
            serde_json::json!([{"role": "user", "content": {"type": "text", "text": "hi"}}]);
        // With tools, and over the budget: refused without asking anyone.
        let tools = handler
            .0
            .serve(request(serde_json::json!({"messages": hello, "tools": []})))
            .await;
        assert!(tools.is_err());
        let huge = "word ".repeat(2_000);
        let over = handler
            .0
            .serve(request(serde_json::json!({"messages": [{"role": "user", "content": {"type": "text", "text": huge}}]})))
            .await;
        assert!(
            matches!(over, Err(InputError::Denied(Denial::BudgetExceeded { .. }))),
            "{over:?}"
        );
        assert_eq!(asked(), 0, "nobody was asked what the checks refuse");
        // Asked, and declined: refused, and the reservation given back.
        for _ in 0..3 {
            let declined = handler
                .0
                .serve(request(serde_json::json!({"messages": hello})))
                .await;
            assert!(
                matches!(declined, Err(InputError::Denied(Denial::NotApproved))),
                "{declined:?}"
            );
        }
        assert_eq!(asked(), 3);
        assert_eq!(
            handler.0.spent.lock().get("call:7").map(|e| e.spent),
            Some(0)
        );
        assert_eq!(
            handler
                .0
                .spent
                .lock()
                .get("call:7")
                .and_then(|e| e.keep_until),
            Some(ends),
            "kept until its call's deadline"
        );
        let minute = handler
            .0
            .spent
            .lock()
            .get(&Sampler::server_key("s"))
            .map(|e| e.spent);
        assert_eq!(minute, Some(0), "the server's minute got it back too");
        // Nobody answers in time (or the request is withdrawn): the future is dropped
        // while the person is asked, and the reservation is given back all the same.
        let config = local("m", 100, 200, BTreeMap::new());
        let agents = approving("a");
        let handler =
            SamplingHandler::new(config, agents, Some(Arc::new(Silent))).expect("handler");
        for _ in 0..3 {
            let waited = tokio::time::timeout(
                Duration::from_millis(20),
                handler
                    .0
                    .serve(request(serde_json::json!({"messages": hello}))),
            )
            .await;
            assert!(waited.is_err(), "nobody answered");
        }
        assert_eq!(
            handler.0.spent.lock().get("call:7").map(|e| e.spent),
            Some(0)
        );
    }

    /// A person who does not answer is waited for only as long as leaves the provider
    /// its time (here its whole 1 s timeout) before the answer is due, the approver is
    /// told that earlier time, and the reservation is given back.
    #[tokio::test]
    async fn a_person_is_waited_for_only_while_the_provider_still_has_its_time() {
        let config = local("m", 100, 200, BTreeMap::new());
        let person = Arc::new(SilentTold(parking_lot::Mutex::default()));
        let handler =
            SamplingHandler::new(config, approving("a"), Some(person.clone())).expect("handler");
        let hello =
            serde_json::json!([{"role": "user", "content": {"type": "text", "text": "hi"}}]);
        let request = InputRequestContext {
            server: "s".into(),
            method: "sampling/createMessage".into(),
            params: serde_json::json!({"messages": hello}),
            agent_id: Some("a".into()),
            key: "k".into(),
            call_id: Some(9),
            call_deadline: None,
            shared: false,
            answer_by: Some(Instant::now() + Duration::from_secs(4)),
        };
        let due = request.answer_by;
        let asked = Instant::now();
        let served = tokio::time::timeout(Duration::from_secs(10), handler.0.serve(request)).await;
        let waited = asked.elapsed();
        assert!(
            matches!(served, Ok(Err(InputError::Timeout(_)))),
            "the wait for a person ended: {served:?}"
        );
        // Until the provider's 1 s is all that is left, not till it was due.
        assert!(
            waited >= Duration::from_millis(2900) && waited < Duration::from_secs(4),
            "{waited:?}"
        );
        let told = *person.0.lock();
        assert_eq!(
            told,
            due.map(|d| d - Duration::from_secs(1)),
            "the approver is told when its wait ends"
        );
        assert_eq!(
            handler.0.spent.lock().get("call:9").map(|e| e.spent),
            Some(0),
            "given back"
        );
        assert!(approve_by(None, Duration::from_secs(1)).is_none());
        let due = Instant::now() + Duration::from_secs(100);
        let by = approve_by(Some(due), Duration::from_secs(10)).expect("a time");
        assert_eq!(
            due - by,
            Duration::from_secs(10),
            "the provider's full timeout"
        );
        let due = Instant::now() + Duration::from_secs(2);
        let by = approve_by(Some(due), Duration::from_secs(10)).expect("a time");
        assert!(
            due - by <= Duration::from_secs(1) && due - by > Duration::from_millis(900),
            "half the time left: {:?}",
            due - by
        );
    }

    /// Never answers; keeps when it was told its answer is due.
    struct SilentTold(parking_lot::Mutex<Option<Instant>>);

    impl InputHandler for SilentTold {
        fn answer(&self, request: InputRequestContext) -> crate::call::input::InputFuture {
            *self.0.lock() = request.answer_by;
            Box::pin(std::future::pending())
        }
    }

    /// Never answers.
    struct Silent;

    impl InputHandler for Silent {
        fn answer(&self, _: InputRequestContext) -> crate::call::input::InputFuture {
            Box::pin(std::future::pending())
        }
    }

    #[test]
    fn a_count_below_what_any_request_costs_is_charged_as_reserved() {
        let reply =
            json!({"role": "assistant", "content": {"type": "text", "text": "word ".repeat(400)}});
        // 2,000 bytes: no honest count is 250 tokens or fewer.
        assert_eq!(charge(Some(0), 900, &reply), 900, "0 is no count");
        assert_eq!(charge(Some(250), 900, &reply), 900);
        assert_eq!(charge(Some(520), 900, &reply), 520, "an honest count");
        assert_eq!(charge(Some(5_000), 900, &reply), 5_000);
        assert_eq!(charge(None, 900, &reply), 900);
        assert_eq!(
            charge(Some(0), 900, &json!({})),
            900,
            "a request costs a token"
        );
        assert_eq!(charge(Some(12), 900, &json!({})), 12);
        // Text of other scripts is charged as counted, not as the high estimate has it.
        let russian = json!({"content": {"type": "text", "text": "слово ".repeat(300)}});
        assert_eq!(charge(Some(700), 900, &russian), 700);
    }

    #[test]
    fn an_empty_hint_picks_no_model() {
        let config = local(
            "default",
            10,
            100,
            BTreeMap::from([("opus".into(), "costly".into())]),
        );
        let handler = SamplingHandler::new(config, SharedAgents::default(), None).expect("handler");
        let hints = |names: &[&str]| serde_json::json!({"modelPreferences": {"hints": names.iter().map(|n| serde_json::json!({"name": n})).collect::<Vec<_>>()}});
        assert_eq!(handler.0.model(&hints(&["", " "])), "default");
        assert_eq!(handler.0.model(&hints(&["", "claude-opus-4"])), "costly");
    }

    // Of the keys a hint matches, the closest, whatever the table's order.
    #[test]
    fn a_hint_picks_the_closest_key_not_the_first() {
        let config = local(
            "default",
            10,
            100,
            BTreeMap::from([
                ("claude".into(), "sonnet".into()),
                ("claude-3".into(), "three".into()),
                ("haiku".into(), "small".into()),
                ("claude-3-5-haiku".into(), "exact".into()),
                ("gpt-4o-mini".into(), "mini".into()),
                ("gpt-4o-mini-long".into(), "long".into()),
            ]),
        );
        let handler = SamplingHandler::new(config, SharedAgents::default(), None).expect("handler");
        let hints = |names: &[&str]| serde_json::json!({"modelPreferences": {"hints": names.iter().map(|n| serde_json::json!({"name": n})).collect::<Vec<_>>()}});
        let model = |names: &[&str]| handler.0.model(&hints(names));
        assert_eq!(model(&["claude-3-5-haiku"]), "exact");
        assert_eq!(
            model(&["claude-3-opus"]),
            "three",
            "the longest key in the hint"
        );
        assert_eq!(model(&["haiku-4"]), "small");
        assert_eq!(model(&["Claude-Sonnet"]), "sonnet");
        // A hint inside keys: the shortest key holding it.
        assert_eq!(model(&["4o-mi"]), "mini");
        assert_eq!(
            model(&["mistral", "claude"]),
            "sonnet",
            "the first hint that matches"
        );
    }

    // What a provider would refuse is said to the server before anything is reserved
    // or sent: a schema mistake is not a provider failure that costs budgets.
    #[test]
    fn what_a_provider_would_refuse_is_the_servers_error() {
        let one = |content: Value| json!({"messages": [{"role": "user", "content": content}]});
        for (params, says) in [
            (one(json!({"type": "text"})), "without text"),
            (one(json!({"type": "text", "text": ""})), "without text"),
            (one(json!([])), "without content"),
            (
                one(json!({"type": "image", "mimeType": "image/tiff", "data": "AA"})),
                "image/tiff",
            ),
            (
                json!({"messages": [{"role": "assistant", "content": {"type": "image", "mimeType": "image/png", "data": "AA"}}]}),
                "assistant",
            ),
            // What a provider refuses, and would be charged for: no messages, an image
            // that is no base64, or one past its limit.
            (json!({"messages": []}), "without messages"),
            (
                one(json!({"type": "image", "mimeType": "image/png", "data": "not base64!"})),
                "not base64",
            ),
            (
                one(json!({"type": "image", "mimeType": "image/png", "data": "A"})),
                "not base64",
            ),
            (
                one(
                    json!({"type": "image", "mimeType": "image/png", "data": "A".repeat((5 << 20) + 4)}),
                ),
                "over 5242880 bytes",
            ),
        ] {
            let Err(e) = messages_of(&params, Provider::Anthropic) else {
                panic!("taken: {params}");
            };
            assert!(e.contains(says), "{e}");
        }
        for data in ["AA", "AAA=", "aGk+/w=="] {
            let image = one(json!({"type": "image", "mimeType": "image/webp", "data": data}));
            assert!(messages_of(&image, Provider::Anthropic).is_ok(), "{data}");
        }
        // Each provider's own limit: 5 MiB of base64 for Anthropic, 20 MB for OpenAI.
        let image = |n: usize| {
            one(json!({"type": "image", "mimeType": "image/png", "data": "A".repeat(n)}))
        };
        assert!(messages_of(&image(5 << 20), Provider::Anthropic).is_ok());
        assert!(messages_of(&image((5 << 20) + 4), Provider::Openai).is_ok());
        assert!(messages_of(&image(20_000_004), Provider::Openai).is_err());
        let extras = |v: Value, p: Provider| check_extras(&v, p);
        assert!(extras(json!({"temperature": 1.5}), Provider::Openai).is_ok());
        assert!(extras(json!({"temperature": 1.5}), Provider::Anthropic).is_err());
        assert!(extras(json!({"temperature": -0.1}), Provider::Openai).is_err());
        assert!(extras(json!({"temperature": "hot"}), Provider::Openai).is_err());
        let stops = |n: usize| json!({"stopSequences": vec!["END"; n]});
        assert!(extras(stops(4), Provider::Openai).is_ok());
        assert!(extras(stops(5), Provider::Openai).is_err());
        assert!(extras(stops(16), Provider::Anthropic).is_ok());
        assert!(extras(stops(17), Provider::Anthropic).is_err());
        assert!(extras(json!({"stopSequences": ["END", 7]}), Provider::Anthropic).is_err());
        assert!(extras(json!({"stopSequences": [""]}), Provider::Anthropic).is_err());
    }

    // A provider's own stop reason is passed on, cut short and on one line, unless MCP
    // has a word for it.
    #[test]
    fn a_stop_reason_without_mcps_word_for_it_is_the_providers() {
        let known = [("end_turn", "endTurn"), ("max_tokens", "maxTokens")];
        assert_eq!(stop_reason(Some("max_tokens"), &known), "maxTokens");
        assert_eq!(stop_reason(None, &known), "endTurn");
        assert_eq!(stop_reason(Some(""), &known), "endTurn");
        assert_eq!(stop_reason(Some("refusal"), &known), "refusal");
        let long = format!("\u{1b}[2J{}", "r".repeat(500));
        let told = stop_reason(Some(&long), &known);
        assert!(
            told.chars().count() < 80 && !told.contains('\u{1b}'),
            "{told}"
        );
    }

    // The endpoint follows the base URL's path and keeps its query (a deployment's API
    // version); credentials and fragments in it are refused, and a query goes in
    // clear only to this machine.
    #[test]
    fn the_endpoint_is_built_on_the_base_urls_path_and_query() {
        let at = |url: &str| SamplingConfig {
            base_url: Some(url.into()),
            ..local("m", 10, 100, BTreeMap::new())
        };
        let url = endpoint(
            &at("https://h.example/v1/?api-version=2"),
            &["chat", "completions"],
        )
        .expect("endpoint");
        assert_eq!(
            url.as_str(),
            "https://h.example/v1/chat/completions?api-version=2"
        );
        let url = endpoint(&at("https://h.example"), &["v1", "messages"]).expect("endpoint");
        assert_eq!(url.as_str(), "https://h.example/v1/messages");
        for bad in [
            "https://user:secret@h.example/v1",
            "https://token@h.example/v1",
            "https://h.example/v1#frag",
            "http://gpu-box.lan:8000/v1?key=abc",
        ] {
            let e = at(bad).validate().expect_err(bad);
            assert!(
                !e.to_string().contains("secret") && !e.to_string().contains("abc"),
                "{e}"
            );
        }
        assert!(at("http://127.0.0.1:8000/v1?key=abc").validate().is_ok());
    }

    #[test]
    fn all_of_a_servers_calls_share_its_budget_for_the_minute() {
        let mut config = local("m", 10, 100, BTreeMap::new());
        config.server_budget_tokens_per_minute = Some(150);
        let handler = SamplingHandler::new(config, SharedAgents::default(), None).expect("handler");
        let sampler = &handler.0;
        let both = |call: &str, server: &str| [call.to_string(), Sampler::server_key(server)];
        sampler
            .reserve_all(&both("call:1", "s"), 60)
            .expect("within both");
        sampler
            .reserve_all(&both("call:2", "s"), 60)
            .expect("within both");
        // A third call, within its own budget, is past the server's minute.
        let refused = sampler.reserve_all(&both("call:3", "s"), 60);
        assert_eq!(
            refused,
            Err(Denial::ServerBudgetExceeded {
                server: "s".into(),
                budget: 150,
                spent: 120,
                asked: 60
            })
        );
        // Its call's reservation was given back; another server's minute is its own.
        assert_eq!(sampler.spent.lock().get("call:3").map(|e| e.spent), Some(0));
        sampler
            .reserve_all(&both("call:4", "t"), 60)
            .expect("another server");
        // Unset, it is never less than one call's budget; set, never less than one
        // request's ceiling.
        let mut config = local("m", 10, 100_000, BTreeMap::new());
        assert_eq!(config.server_budget(), 100_000);
        config.call_budget_tokens = 100;
        assert_eq!(config.server_budget(), 65_536);
        config.server_budget_tokens_per_minute = Some(5);
        assert!(config.validate().is_err());
    }

    #[test]
    fn an_unlimited_budget_spent_to_its_end_stays_spent_rather_than_wraps() {
        let config = local("m", 10, u64::MAX, BTreeMap::new());
        let handler = SamplingHandler::new(config, SharedAgents::default(), None).expect("handler");
        let sampler = &handler.0;
        let budget = sampler.reserve("call:1", 10).expect("reserved");
        // A provider that says it used nearly everything ("unlimited" is u64::MAX).
        sampler.settle("call:1", budget, 10, u64::MAX - 1);
        sampler.reserve("call:1", 10).expect("within u64::MAX");
        let spent = sampler.spent.lock().get("call:1").map(|e| e.spent);
        assert_eq!(spent, Some(u64::MAX), "not wrapped to a fresh budget");
    }

    #[test]
    fn an_api_key_goes_in_clear_only_to_this_machine() {
        let keyed = |url: &str| SamplingConfig {
            base_url: Some(url.into()),
            api_key_env: Some("SOME_KEY".into()),
            ..local("m", 10, 100, BTreeMap::new())
        };
        assert!(keyed("http://127.0.0.1:8000/v1").validate().is_ok());
        assert!(keyed("http://localhost:8000/v1").validate().is_ok());
        assert!(keyed("https://api.openai.com/v1").validate().is_ok());
        let e = keyed("http://api.openai.com/v1")
            .validate()
            .expect_err("in clear");
        assert!(e.to_string().contains("https"), "{e}");
        // Without a key, a model server elsewhere on the network may be plain HTTP.
        let keyless = SamplingConfig {
            api_key_env: None,
            ..keyed("http://gpu-box.lan:8000/v1")
        };
        assert!(keyless.validate().is_ok());
        // The key's value written where its variable's name goes: refused, not quoted.
        let e = SamplingConfig {
            api_key_env: Some("sk-live-abc123".into()),
            ..keyed("https://api.openai.com/v1")
        }
        .validate()
        .expect_err("a value");
        assert!(!e.to_string().contains("sk-live"), "{e}");
        assert!(keyed("https://api.openai.com/v1").validate().is_ok());
    }

    #[test]
    fn a_zero_timeout_or_free_images_are_refused() {
        let e = SamplingConfig {
            timeout: Duration::ZERO,
            ..local("m", 10, 100, BTreeMap::new())
        }
        .validate()
        .expect_err("zero");
        assert_eq!(e.field, "timeout", "{e}");
        let e = SamplingConfig {
            image_tokens: 0,
            ..local("m", 10, 100, BTreeMap::new())
        }
        .validate()
        .expect_err("zero");
        assert_eq!(e.field, "image_tokens", "{e}");
    }

    // Running calls' budgets are kept when the map is cut, but not past a bound: with
    // every budget a running call's (deadlines hours away), the map is cut all the
    // same, and the next clean-up is a quarter of it away.
    #[test]
    fn a_map_of_running_calls_budgets_stays_bounded() {
        let config = local("m", 10, 100, BTreeMap::new());
        let handler = SamplingHandler::new(config, SharedAgents::default(), None).expect("handler");
        let sampler = &handler.0;
        let later = Instant::now() + Duration::from_secs(3600);
        for id in 0..MAX_BUDGETS {
            let key = format!("call:{id}");
            let budget = sampler.reserve(&key, 1).expect("within budget");
            sampler.settle(&key, budget, 1, 1);
            sampler.keep_for_call(&key, later);
        }
        sampler.reserve("call:next", 1).expect("within budget");
        let kept = sampler.spent.lock().len();
        assert!(kept <= MAX_BUDGETS / 2 + 1, "{kept}");
    }

    #[test]
    fn a_full_budget_map_forgets_the_least_recently_used_half_never_the_budget_asked_of() {
        let config = local("m", 10, 100, BTreeMap::new());
        let handler = SamplingHandler::new(config, SharedAgents::default(), None).expect("handler");
        let sampler = &handler.0;
        // The oldest call has spent most of its budget, and a server some of its minute.
        sampler.reserve("call:0", 90).expect("first reservation");
        sampler
            .reserve("minute:s", 50)
            .expect("the server's minute");
        // A call still running (its deadline ahead), whose last sampling settled long
        // before the cut.
        let running = sampler.reserve("call:running", 30).expect("reserved");
        sampler.settle("call:running", running, 30, 30);
        sampler.keep_for_call("call:running", Instant::now() + Duration::from_secs(3600));
        // Calls that were served: nothing of theirs is still reserved.
        for id in 1..MAX_BUDGETS - 2 {
            let key = format!("call:{id}");
            let budget = sampler.reserve(&key, 1).expect("within budget");
            sampler.settle(&key, budget, 1, 1);
        }
        assert_eq!(sampler.spent.lock().len(), MAX_BUDGETS);
        // The map is full: the next reservation, of the least recently used budget,
        // cuts it to half, and that budget keeps its count.
        let refused = sampler.reserve("call:0", 20);
        assert!(
            matches!(refused, Err(Denial::BudgetExceeded { spent: 90, .. })),
            "{refused:?}"
        );
        let spent = sampler.spent.lock();
        assert!(spent.len() <= MAX_BUDGETS / 2 + 3, "{}", spent.len());
        assert!(spent.contains_key("call:0"), "the budget asked of is kept");
        assert_eq!(
            spent.get("minute:s").map(|e| e.spent),
            Some(50),
            "a server's open window is kept"
        );
        assert!(!spent.contains_key("call:1"), "the least recently used go");
        assert_eq!(
            spent.get("call:running").map(|e| e.spent),
            Some(30),
            "a running call keeps what it spent"
        );

        let newest = format!("call:{}", MAX_BUDGETS - 3);
        assert_eq!(
            spent.get(&newest).map(|e| e.spent),
            Some(1),
            "the newest stay"
        );
        drop(spent);
        // A budget with tokens still reserved is kept however old: they settle with it.
        let open = sampler.reserve("call:open", 5).expect("reserved");
        for id in 0..MAX_BUDGETS {
            let key = format!("later:{id}");
            let budget = sampler.reserve(&key, 1).expect("within budget");
            sampler.settle(&key, budget, 1, 1);
        }
        let spent = sampler.spent.lock();
        assert_eq!(
            spent.get("call:open").map(|e| (e.open, e.id)),
            Some((5, open))
        );
    }

    #[test]
    fn an_approver_is_told_the_harness_s_plan_whatever_the_server_wrote_there() {
        let ask = |params: Value| InputRequestContext::new("s", "sampling/createMessage", params);
        let plan = json!({"model": "m1", "maxTokens": 40, "reservedTokens": 90});
        for params in [
            json!({"maxTokens": 9999, "_meta": {APPROVAL_META: {"model": "cheap"}, "other": 1}}),
            json!({"maxTokens": 9999, "_meta": "not an object"}),
            json!({"maxTokens": 9999}),
        ] {
            let shown = for_approval(&ask(params.clone()), "m1", 40, 90);
            assert_eq!(shown.params["_meta"][APPROVAL_META], plan, "{params}");
            // The rest is the server's, as sent.
            assert_eq!(shown.params["maxTokens"], 9999);
        }
        let kept = for_approval(&ask(json!({"_meta": {"other": 1}})), "m1", 40, 90);
        assert_eq!(kept.params["_meta"]["other"], 1);
        // Params that are no object are left as they are.
        assert_eq!(for_approval(&ask(json!(7)), "m1", 40, 90).params, json!(7));
    }

    #[test]
    fn an_agents_minute_spans_its_servers_and_everyones_spans_the_agents() {
        let mut config = local("m", 10, 100, BTreeMap::new());
        config.agent_budget_tokens_per_minute = Some(150);
        config.budget_tokens_per_minute = Some(200);
        let handler = SamplingHandler::new(config, SharedAgents::default(), None).expect("handler");
        let sampler = &handler.0;
        let ask = |call: u64, server: &str, agent: Option<&str>| InputRequestContext {
            server: server.into(),
            method: "sampling/createMessage".into(),
            params: json!({}),
            agent_id: agent.map(String::from),
            key: String::new(),
            call_id: Some(call),
            call_deadline: None,
            shared: false,
            answer_by: None,
        };
        let reserve = |call, server, agent| {
            let keys = sampler.budgets_of(&ask(call, server, agent));
            sampler.reserve_all(&keys, 60)
        };
        reserve(1, "s", Some("a")).expect("a's first");
        reserve(2, "t", Some("a")).expect("a's second, on another server");
        // A third of a's, within its call's and its server's budgets, is past a's minute.
        assert_eq!(
            reserve(3, "u", Some("a")),
            Err(Denial::AgentBudgetExceeded {
                agent: "a".into(),
                budget: 150,
                spent: 120,
                asked: 60
            })
        );
        // Refused, it holds nothing: not its call's, its server's or everyone's.
        let spent = |key: &str| sampler.spent.lock().get(key).map(|e| e.spent);
        assert_eq!(spent("call:3"), Some(0));
        assert_eq!(spent(&Sampler::server_key("u")), Some(0));
        assert_eq!(spent(ALL_MINUTE), Some(120));
        // Requests of no agent share one budget; everyone's minute holds them all.
        reserve(4, "s", None).expect("no agent's first");
        assert_eq!(
            reserve(5, "v", Some("b")),
            Err(Denial::TotalBudgetExceeded {
                budget: 200,
                spent: 180,
                asked: 60
            })
        );
        assert_eq!(spent(AGENT_MINUTE), Some(60));
        // Unset, neither is drawn on; set, neither may be below max_tokens.
        let plain = SamplingHandler::new(
            local("m", 10, 100, BTreeMap::new()),
            SharedAgents::default(),
            None,
        )
        .expect("handler");
        assert_eq!(plain.0.budgets_of(&ask(1, "s", Some("a"))).len(), 2);
        let mut config = local("m", 10, 100, BTreeMap::new());
        config.agent_budget_tokens_per_minute = Some(5);
        assert!(config.validate().is_err());
        let mut config = local("m", 10, 100, BTreeMap::new());
        config.budget_tokens_per_minute = Some(5);
        assert!(config.validate().is_err());
    }

    #[test]
    fn a_reservation_still_open_draws_on_the_next_window() {
        let config = local("m", 10, 100, BTreeMap::new());
        let handler = SamplingHandler::new(config, SharedAgents::default(), None).expect("handler");
        let sampler = &handler.0;
        let pass_a_window = || {
            let mut spent = sampler.spent.lock();
            let entry = spent.get_mut("server:s").expect("entry");
            entry.start = entry
                .start
                .checked_sub(LEGACY_WINDOW)
                .expect("a clock past one window");
        };
        let first = sampler.reserve("server:s", 60).expect("reserved");
        sampler.reserve("server:s", 10).expect("reserved");
        sampler.settle("server:s", first, 10, 10);
        // The legacy server's minute passes while a person is asked about the first: a
        // new window, on which the 60 still reserved draw (the 10 settled do not).
        pass_a_window();
        let refused = sampler.reserve("server:s", 50);
        assert!(
            matches!(refused, Err(Denial::BudgetExceeded { spent: 60, .. })),
            "{refused:?}"
        );
        let second = sampler
            .reserve("server:s", 30)
            .expect("within the new window");
        // The first is declined: its reservation is given back to the window now.
        sampler.settle("server:s", first, 60, 0);
        assert_eq!(
            sampler.spent.lock().get("server:s").map(|e| e.spent),
            Some(30)
        );
        sampler.settle("server:s", second, 30, 25);
        assert_eq!(
            sampler.spent.lock().get("server:s").map(|e| e.spent),
            Some(25)
        );
        // Settled, nothing is carried into the next window.
        pass_a_window();
        let whole = sampler
            .reserve("server:s", 100)
            .expect("a whole new window");
        sampler.settle("server:s", whole, 100, 25);
        // A request whose provider failed (or whose handler was dropped once the
        // provider was asked) is charged what it reserved, and is no longer open: the
        // next window does not carry it.
        let id = sampler.reserve("server:s", 70).expect("reserved");
        drop(Reservation {
            sampler,
            budgets: vec![("server:s".into(), id)],
            asked: 70,
            charged: 70,
        });
        let after = sampler
            .spent
            .lock()
            .get("server:s")
            .map(|e| (e.spent, e.open));
        assert_eq!(after, Some((95, 0)));
        pass_a_window();
        sampler.reserve("server:s", 100).expect("nothing carried");
        // A budget forgotten and begun anew owes an old reservation nothing.
        sampler.spent.lock().clear();
        sampler.reserve("server:s", 40).expect("reserved");
        sampler.settle("server:s", first, 60, 0);
        assert_eq!(
            sampler.spent.lock().get("server:s").map(|e| e.spent),
            Some(40)
        );
    }

    #[test]
    fn a_prompt_is_reserved_at_its_text_and_each_image_at_image_tokens() {
        // A tiny image file of large pixel size costs what its pixels do: reserved at
        // what the configuration says an image costs, whatever its bytes.
        let images = Message {
            role: "user",
            content: (0..100)
                .map(|_| Part::Image {
                    data: "UklGRg==".into(),
                    mime: "image/webp".into(),
                })
                .collect(),
        };
        let images = [images];
        assert!(prompt_tokens(&images, 1_600) >= 100 * 1_600);
        assert!(prompt_tokens(&images, 48_169) >= 100 * 48_169);
        // English at about four bytes a token; other scripts a token a character.
        let english = "word ".repeat(400);
        assert!((500..=510).contains(&text_tokens(&english)));
        assert!(text_tokens(&"漢".repeat(1000)) >= 1000);
        let text = Message {
            role: "user",
            content: vec![Part::Text(english)],
        };
        assert!(prompt_tokens(&[text], 1_600) > 500);
    }
}
