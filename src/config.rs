//! What the harness runs: [`HarnessConfig`] and [`ServerConfig`], plain structs with
//! serde so that embedders build them in code and operators write them in files.
//!
//! Durations are written as strings with a unit (`"500ms"`, `"30s"`, `"5m"`) or as a
//! number of seconds. Unknown keys are rejected, so a typo is an error, not a default.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::audit::AuditConfig;
use crate::permission::Grants;
use crate::protocol::Implementation;
use crate::server::RestartConfig;
use crate::transport::{EraPreference, HttpSpec, StdioSpec, TransportSpec};

/// The whole harness: its servers and how it introduces itself.
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
    /// The schema cache.
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
        }
    }
}

fn default_round_cap() -> usize {
    10
}
fn default_input_timeout() -> Duration {
    Duration::from_secs(300)
}

/// The schema cache's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Directory of the disk layer (L2); memory only when `None`.
    pub dir: Option<PathBuf>,
    /// Freshness of results that carry no `ttlMs` (legacy servers).
    #[serde(with = "duration")]
    pub default_ttl: Duration,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            dir: None,
            default_ttl: Duration::from_secs(300),
        }
    }
}

/// How to reach a server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum TransportConfig {
    /// A child process on stdin/stdout.
    Stdio {
        /// Program to run.
        command: String,
        /// Its arguments.
        #[serde(default)]
        args: Vec<String>,
        /// Extra environment variables.
        #[serde(default)]
        env: BTreeMap<String, String>,
        /// Working directory.
        #[serde(default)]
        cwd: Option<PathBuf>,
    },
    /// A Streamable HTTP endpoint.
    Http {
        /// The MCP endpoint URL.
        url: String,
        /// Headers sent on every request (for example `Authorization`).
        #[serde(default)]
        headers: BTreeMap<String, String>,
    },
}

impl TransportConfig {
    /// The transport layer's view of this config.
    pub fn to_spec(&self) -> TransportSpec {
        match self.clone() {
            TransportConfig::Stdio {
                command,
                args,
                env,
                cwd,
            } => TransportSpec::Stdio(StdioSpec {
                command,
                args,
                env,
                cwd,
            }),
            TransportConfig::Http { url, headers } => {
                TransportSpec::Http(HttpSpec { url, headers })
            }
        }
    }
}

/// One MCP server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Unique id: the prefix of qualified tool names and the key of every API call.
    pub id: String,
    /// A display name; the id when absent.
    #[serde(default)]
    pub name: Option<String>,
    /// How to reach it.
    pub transport: TransportConfig,
    /// Disabled servers are known but not started.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Higher goes first when several servers offer the same tool.
    #[serde(default)]
    pub priority: i32,
    /// Default deadline of one request to this server.
    #[serde(default = "default_timeout", with = "duration")]
    pub timeout: Duration,
    /// Restarts allowed within `restart.within` before the server is marked `failed`.
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    /// Labels that grants and listings can select on.
    #[serde(default)]
    pub tags: Vec<String>,
    /// When and how fast to restart it.
    #[serde(default)]
    pub restart: RestartConfig,
    /// Which protocol era to speak (`auto` probes).
    #[serde(default)]
    pub era: EraPreference,
    /// Requests held while the server (re)starts; more fail with `Overloaded`.
    #[serde(default = "default_queue")]
    pub queue_capacity: usize,
    /// Believe this server's `idempotentHint` / `readOnlyHint`: such calls may be
    /// re-sent to another server even when they may have reached this one.
    #[serde(default)]
    pub trust_annotations: bool,
}

fn yes() -> bool {
    true
}
fn default_timeout() -> Duration {
    Duration::from_secs(60)
}
fn default_max_retries() -> u32 {
    5
}
fn default_queue() -> usize {
    256
}

impl ServerConfig {
    /// A server with every setting at its default.
    pub fn new(id: impl Into<String>, transport: TransportConfig) -> ServerConfig {
        ServerConfig {
            id: id.into(),
            name: None,
            transport,
            enabled: true,
            priority: 0,
            timeout: default_timeout(),
            max_retries: default_max_retries(),
            tags: Vec::new(),
            restart: RestartConfig::default(),
            era: EraPreference::Auto,
            queue_capacity: default_queue(),
            trust_annotations: false,
        }
    }

    /// A stdio server with every other setting at its default.
    pub fn stdio<I, S>(id: impl Into<String>, command: impl Into<String>, args: I) -> ServerConfig
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let transport = TransportConfig::Stdio {
            command: command.into(),
            args: args.into_iter().map(Into::into).collect(),
            env: BTreeMap::new(),
            cwd: None,
        };
        ServerConfig::new(id, transport)
    }

    /// An HTTP server with every other setting at its default.
    pub fn http(id: impl Into<String>, url: impl Into<String>) -> ServerConfig {
        ServerConfig::new(
            id,
            TransportConfig::Http {
                url: url.into(),
                headers: BTreeMap::new(),
            },
        )
    }
}

/// Durations as `"250ms"`, `"30s"`, `"5m"`, `"1h"`, or a number of seconds.
pub mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Parses `"250ms"`, `"30s"`, `"1.5s"`, `"5m"`, `"1h"`, or a bare number of seconds.
    pub fn parse(text: &str) -> Result<Duration, String> {
        let text = text.trim();
        let split = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let n: f64 = number
            .parse()
            .map_err(|_| format!("{text:?} is not a duration (try \"30s\" or \"500ms\")"))?;
        let secs = match unit.trim() {
            "ms" => n / 1000.0,
            "" | "s" => n,
            "m" => n * 60.0,
            "h" => n * 3600.0,
            other => {
                return Err(format!(
                    "unknown unit {other:?} in {text:?} (use ms, s, m or h)"
                ));
            }
        };
        Duration::try_from_secs_f64(secs).map_err(|e| format!("{text:?}: {e}"))
    }

    /// Writes a duration as milliseconds with the `ms` unit.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{}ms", d.as_millis()))
    }

    /// Reads a duration string or a number of seconds.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Seconds(f64),
        }
        match Raw::deserialize(d)? {
            Raw::Text(t) => parse(&t).map_err(serde::de::Error::custom),
            Raw::Seconds(s) => Duration::try_from_secs_f64(s).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units_or_seconds() {
        assert_eq!(duration::parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(duration::parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(duration::parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(duration::parse("3"), Ok(Duration::from_secs(3)));
        assert!(duration::parse("3 fortnights").is_err());
        assert!(duration::parse("soon").is_err());
    }

    #[test]
    fn a_server_config_reads_with_defaults_and_rejects_unknown_keys() {
        let json = r#"{"id":"files","transport":{"type":"stdio","command":"srv"},"timeout":"5s"}"#;
        let c: ServerConfig = serde_json::from_str(json).expect("valid");
        assert_eq!(c.timeout, Duration::from_secs(5));
        assert!(c.enabled);
        assert_eq!(c.max_retries, 5);
        let typo = r#"{"id":"files","transport":{"type":"stdio","command":"srv"},"timout":"5s"}"#;
        let e = serde_json::from_str::<ServerConfig>(typo).expect_err("typo");
        assert!(e.to_string().contains("timout"), "{e}");
    }
}
