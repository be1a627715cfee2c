//! What the harness runs: [`HarnessConfig`], the aggregate of each layer's own settings
//! (servers, grants, cache, audit, calls), plain structs with serde so that embedders
//! build them in code and operators write them in files ([`file`]: TOML, or the
//! `mcpServers` JSON people already keep).
//!
//! Durations are written as strings with a unit (`"500ms"`, `"30s"`, `"5m"`) or as a
//! number of seconds. Unknown keys are rejected, so a typo is an error, not a default.
//! [`HarnessConfig::validate`] checks everything before anything starts, and its
//! [`ConfigError`] names the file, the server and the field.

pub mod file;
mod json;

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::audit::AuditConfig;
use crate::call::input::{AgentConfig, SamplingConfig};
use crate::call::{CallConfig, Limits};
use crate::permission::Grants;
use crate::protocol::Implementation;
use crate::registry::cache::CacheConfig;
use crate::server::ServerConfig;
use crate::util::duration;
use crate::util::invalid::Invalid;

/// A configuration that cannot work: where, and what is wrong.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
// The field and the reason may hold a name from the file (an `mcpServers` key, a
// header's name, an unknown key serde quotes): shown on one line, so that a name with
// a newline in it cannot forge a log line.
#[error("{}{}{}: {}", file.as_ref().map(|f| format!("{}: ", f.display())).unwrap_or_default(), server.as_ref().map(|s| format!("server {s:?}: ")).unwrap_or_default(), crate::util::text::one_line(field, 300), crate::util::text::one_line(reason, 2000))]
pub struct ConfigError {
    /// The file it was read from, if any.
    pub file: Option<PathBuf>,
    /// The server whose settings are wrong, if it is one server's.
    pub server: Option<String>,
    /// The field, as written in a config file.
    pub field: String,
    /// What is wrong and, where it helps, how to fix it.
    pub reason: String,
}

impl ConfigError {
    /// An error about `field` (no file, no server).
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
        ConfigError {
            file: None,
            server: None,
            field: field.into(),
            reason: reason.into(),
        }
    }

    fn from_invalid(server: Option<&str>, invalid: Invalid) -> ConfigError {
        ConfigError {
            file: None,
            server: server.map(String::from),
            field: invalid.field,
            reason: invalid.reason,
        }
    }

    /// The same error, read from `file`.
    pub fn in_file(mut self, file: impl Into<PathBuf>) -> ConfigError {
        self.file = Some(file.into());
        self
    }
}

/// The whole harness: its servers, who may use them, and how calls run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HarnessConfig {
    /// The servers, in config order (the tie-breaker of routing).
    #[serde(default)]
    pub servers: Vec<ServerConfig>,
    /// `clientInfo` sent to servers; this crate's name and version when absent.
    #[serde(default)]
    pub client_info: Option<Implementation>,
    /// Grants: agent id → server id, `tag:NAME` or `*` → tool names or `*`.
    #[serde(default)]
    pub permissions: Grants,
    /// The list cache.
    #[serde(default)]
    pub cache: CacheConfig,
    /// The audit trail.
    #[serde(default)]
    pub audit: AuditConfig,
    /// Most `input_required` rounds of one call (failover included).
    #[serde(default = "default_round_cap")]
    pub round_cap: usize,
    /// Deadline of one input handler's answer.
    #[serde(default = "default_input_timeout", with = "duration")]
    pub input_timeout: Duration,
    /// Deadline of one whole call, rounds and failover included.
    #[serde(default = "default_call_timeout", with = "duration")]
    pub call_timeout: Duration,
    /// How long `shutdown()` lets calls in flight finish before it cancels them.
    #[serde(default = "default_shutdown_grace", with = "duration")]
    pub shutdown_grace: Duration,
    /// The share of calls that start a trace and are traced (0 to 1; default 1). Calls
    /// under a caller's trace follow its sampled flag.
    #[serde(default = "default_trace_sample_ratio")]
    pub trace_sample_ratio: f64,
    /// Bounds on what one server may make the harness hold.
    #[serde(default)]
    pub limits: Limits,
    /// The model provider that serves servers' `sampling/createMessage`.
    #[serde(default)]
    pub sampling: Option<SamplingConfig>,
    /// Per agent (`"*"`: every other, and legacy servers' requests): whether its
    /// servers may sample, and the roots `roots/list` answers.
    #[serde(default)]
    pub agents: BTreeMap<String, AgentConfig>,
}

impl Default for HarnessConfig {
    fn default() -> Self {
        HarnessConfig {
            servers: Vec::new(),
            client_info: None,
            permissions: Grants::new(),
            cache: CacheConfig::default(),
            audit: AuditConfig::default(),
            round_cap: default_round_cap(),
            input_timeout: default_input_timeout(),
            call_timeout: default_call_timeout(),
            shutdown_grace: default_shutdown_grace(),
            trace_sample_ratio: default_trace_sample_ratio(),
            limits: Limits::default(),
            sampling: None,
            agents: BTreeMap::new(),
        }
    }
}

fn default_round_cap() -> usize {
    CallConfig::default().round_cap
}
fn default_input_timeout() -> Duration {
    CallConfig::default().input_timeout
}
fn default_call_timeout() -> Duration {
    CallConfig::default().call_timeout
}
fn default_shutdown_grace() -> Duration {
    CallConfig::default().shutdown_grace
}
fn default_trace_sample_ratio() -> f64 {
    CallConfig::default().trace_sample_ratio
}

impl HarnessConfig {
    /// The call path's settings.
    pub fn call_config(&self) -> CallConfig {
        CallConfig {
            round_cap: self.round_cap,
            input_timeout: self.input_timeout,
            call_timeout: self.call_timeout,
            shutdown_grace: self.shutdown_grace,
            trace_sample_ratio: self.trace_sample_ratio,
            limits: self.limits.clone(),
        }
    }

    /// Checks everything that can be checked before anything starts.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut seen = HashSet::new();
        for server in &self.servers {
            server
                .validate()
                .map_err(|e| ConfigError::from_invalid(Some(&server.id), e))?;
            if !seen.insert(server.id.as_str()) {
                return Err(ConfigError {
                    file: None,
                    server: Some(server.id.clone()),
                    field: "id".into(),
                    reason: "another server has the same id".into(),
                });
            }
        }
        self.call_config()
            .validate()
            .map_err(|e| ConfigError::from_invalid(None, e))?;
        crate::permission::validate(&self.permissions)
            .map_err(|e| ConfigError::from_invalid(None, e))?;
        self.cache
            .validate()
            .map_err(|e| ConfigError::from_invalid(None, e.under("cache")))?;
        self.audit
            .validate()
            .map_err(|e| ConfigError::from_invalid(None, e.under("audit")))?;
        Ok(())
    }

    /// Checks the settings of the built-in input handlers, `[sampling]` and the agents'
    /// roots. Not part of [`Self::validate`]: an embedder's own handler takes the place
    /// of a built-in one, and `Harness::spawn` checks those it builds. A config file
    /// (which has no handlers of its own) is checked when it is read.
    pub fn validate_builtin_inputs(&self) -> Result<(), ConfigError> {
        if let Some(sampling) = &self.sampling {
            sampling
                .validate()
                .map_err(|e| ConfigError::from_invalid(None, e.under("sampling")))?;
        }
        crate::call::input::validate_roots(&self.agents)
            .map_err(|e| ConfigError::from_invalid(None, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A name from the file with a newline in it stays on the error's one line.
    #[test]
    fn a_field_is_shown_on_one_line() {
        let e = ConfigError::new("mcpServers.a\nERROR forged", "is wrong");
        assert_eq!(e.to_string(), "mcpServers.a\\nERROR forged: is wrong");
    }

    // Found when the file is read, naming it, not when the harness spawns.
    #[test]
    fn sampling_settings_and_roots_are_checked_with_the_rest() {
        let path = std::path::Path::new("h.toml");
        let server =
            "[[servers]]\nid = \"x\"\ntransport = { type = \"stdio\", command = \"cat\" }\n";
        for (table, field) in [
            (
                "[sampling]\nprovider = \"openai\"\nmodel = \"m\"\nmax_tokens = 0\n",
                "sampling.max_tokens",
            ),
            (
                "[sampling]\nprovider = \"openai\"\nmodel = \"m\"\nbase_url = \"ftp://x\"\n",
                "sampling.base_url",
            ),
            (
                "[agents.a]\nroots = [\"file:///srv\", \"https://x\"]\n",
                "agents.a.roots[1]",
            ),
        ] {
            let e = file::parse(&format!("{server}{table}"), path).expect_err(field);
            assert_eq!(e.field, field, "{e}");
            assert!(e.to_string().contains("h.toml"), "{e}");
        }
        // The key's variable is read by the handler that uses it, not by every command
        // that reads the file (`logout` has no use for it).
        let unset = "[sampling]\nprovider = \"openai\"\nmodel = \"m\"\napi_key_env = \"MCP_HARNESS_SURELY_UNSET\"\n";
        let loaded = file::parse(&format!("{server}{unset}"), path).expect("parses");
        let sampling = loaded.config.sampling.expect("sampling");
        let e = crate::call::input::SamplingHandler::new(sampling, Default::default(), None)
            .err()
            .expect("no key");
        assert_eq!(e.field, "api_key_env", "{e}");
        // An embedder's own handlers take the built-in ones' place: their settings are
        // no part of the config's own validation.
        let config = HarnessConfig {
            agents: [(
                "a".to_string(),
                crate::call::input::AgentConfig {
                    sampling: None,
                    roots: Some(vec!["https://x".into()]),
                },
            )]
            .into(),
            ..HarnessConfig::default()
        };
        assert!(config.validate().is_ok());
        assert!(config.validate_builtin_inputs().is_err());
    }

    #[test]
    fn audit_flushes_and_batches_out_of_range_are_refused() {
        for (field, audit) in [
            (
                "audit.flush_every",
                crate::audit::AuditConfig {
                    flush_every: Duration::ZERO,
                    ..Default::default()
                },
            ),
            (
                "audit.flush_every",
                crate::audit::AuditConfig {
                    flush_every: Duration::from_nanos(1),
                    ..Default::default()
                },
            ),
            (
                "audit.flush_every",
                crate::audit::AuditConfig {
                    flush_every: Duration::from_secs(7200),
                    ..Default::default()
                },
            ),
            (
                "audit.batch",
                crate::audit::AuditConfig {
                    batch: 0,
                    ..Default::default()
                },
            ),
            (
                "audit.path",
                crate::audit::AuditConfig {
                    path: Some(std::path::PathBuf::new()),
                    ..Default::default()
                },
            ),
        ] {
            let config = HarnessConfig {
                audit,
                ..HarnessConfig::default()
            };
            let e = config.validate().expect_err(field);
            assert_eq!(e.field, field, "{e}");
        }
        assert!(HarnessConfig::default().validate().is_ok());
    }

    #[test]
    fn cache_durations_built_in_code_are_held_to_ten_years() {
        let mut config = HarnessConfig::default();
        config.cache.max_ttl = Duration::MAX;
        let e = config.validate().expect_err("past ten years");
        assert_eq!(e.field, "cache.max_ttl", "{e}");
        config.cache.max_ttl = crate::util::duration::LONGEST;
        assert!(config.validate().is_ok());
    }

    #[test]
    fn a_trace_sample_ratio_outside_zero_to_one_is_refused() {
        for bad in [-0.1, 1.5, f64::NAN] {
            let config = HarnessConfig {
                trace_sample_ratio: bad,
                ..HarnessConfig::default()
            };
            let e = config.validate().expect_err("out of range");
            assert_eq!(e.field, "trace_sample_ratio");
        }
        let config = HarnessConfig {
            trace_sample_ratio: 0.25,
            ..HarnessConfig::default()
        };
        assert!(config.validate().is_ok());
    }

    #[test]
    fn errors_name_the_server_and_the_field() {
        let mut config = HarnessConfig::default();
        let mut s = ServerConfig::stdio("files", "srv", Vec::<String>::new());
        s.restart.within = Duration::ZERO;
        config.servers.push(s);
        let e = config.validate().expect_err("zero window");
        assert_eq!(e.server.as_deref(), Some("files"));
        assert_eq!(e.field, "restart.within");
        assert!(
            e.to_string().contains("server \"files\": restart.within"),
            "{e}"
        );
        let mut config = HarnessConfig::default();
        config
            .servers
            .push(ServerConfig::http("web", "::not a url"));
        let e = config.validate().expect_err("bad url");
        assert_eq!(e.field, "transport.url");
        let config = HarnessConfig {
            round_cap: 0,
            ..HarnessConfig::default()
        };
        assert_eq!(config.validate().expect_err("cap").field, "round_cap");
    }
}
