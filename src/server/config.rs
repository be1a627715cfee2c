//! One server's settings: how to reach it, how to supervise it, how calls may use it.
//! Plain data with serde, so that embedders build it in code and operators write it in
//! files; [`ServerConfig::validate`] says what cannot work before anything starts.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::restart::RestartConfig;
use crate::transport::{EraPreference, TransportSpec};
use crate::util::duration;
use crate::util::invalid::Invalid;

/// The separator of qualified names: `server__tool`. Server ids may not contain it.
pub const SEPARATOR: &str = "__";

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
    pub transport: TransportSpec,
    /// Disabled servers are known but not started.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Higher goes first when several servers offer the same tool.
    #[serde(default)]
    pub priority: i32,
    /// Default deadline of one request to this server.
    #[serde(default = "default_timeout", with = "duration")]
    pub timeout: Duration,
    /// Labels that grants and listings can select on.
    #[serde(default)]
    pub tags: Vec<String>,
    /// When and how fast to restart it, and how often before it is `failed`.
    #[serde(default)]
    pub restart: RestartConfig,
    /// Which protocol era to speak (`auto` probes).
    #[serde(default)]
    pub era: EraPreference,
    /// Requests held while the server (re)starts; more fail with `Overloaded`.
    #[serde(default = "default_queue")]
    pub queue_capacity: usize,
    /// Requests in flight to this server at once, queued ones included; more fail
    /// with `Overloaded`.
    #[serde(default = "default_in_flight")]
    pub max_in_flight: usize,
    /// Believe this server's `idempotentHint` / `readOnlyHint`: such calls may be
    /// re-sent to another server even when they may have reached this one.
    #[serde(default)]
    pub trust_annotations: bool,
    /// Answer a legacy server's `elicitation/create` and `sampling/createMessage` even
    /// when none of our calls to it is in flight (refused by default: a server must not
    /// ask a person or spend model tokens on its own initiative).
    #[serde(default)]
    pub allow_unsolicited_input: bool,
    /// The old name of `restart.max_restarts`, still read from config files.
    #[serde(default, rename = "max_retries", skip_serializing)]
    pub(crate) legacy_max_retries: Option<u32>,
}

fn yes() -> bool {
    true
}
fn default_timeout() -> Duration {
    Duration::from_secs(60)
}
fn default_queue() -> usize {
    256
}
fn default_in_flight() -> usize {
    256
}

impl ServerConfig {
    /// A server with every setting at its default.
    pub fn new(id: impl Into<String>, transport: TransportSpec) -> ServerConfig {
        ServerConfig {
            id: id.into(),
            name: None,
            transport,
            enabled: true,
            priority: 0,
            timeout: default_timeout(),
            tags: Vec::new(),
            restart: RestartConfig::default(),
            era: EraPreference::Auto,
            queue_capacity: default_queue(),
            max_in_flight: default_in_flight(),
            trust_annotations: false,
            allow_unsolicited_input: false,
            legacy_max_retries: None,
        }
    }

    /// A stdio server with every other setting at its default.
    pub fn stdio<I, S>(id: impl Into<String>, command: impl Into<String>, args: I) -> ServerConfig
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ServerConfig::new(id, TransportSpec::stdio(command, args))
    }

    /// An HTTP server with every other setting at its default.
    pub fn http(id: impl Into<String>, url: impl Into<String>) -> ServerConfig {
        ServerConfig::new(id, TransportSpec::http(url))
    }

    /// Restarts allowed within `restart.within` before the server is `failed`
    /// (`max_retries` in older config files).
    pub fn max_restarts(&self) -> u32 {
        self.legacy_max_retries.unwrap_or(self.restart.max_restarts)
    }

    /// What the server is: a digest of its command, working directory and arguments,
    /// or of its URL. State bound to the server that issued it is bound to this: a
    /// reload that points the id at another server changes it; one that changes only
    /// how it is reached (headers, environment, a CA file: a key rotated) does not, nor
    /// do two gateway processes that reach one server each their own way.
    pub fn identity(&self) -> String {
        // Each part with its length, so that none can move into another.
        let mut text = String::new();
        let mut part = |p: &str| {
            text.push_str(&p.len().to_string());
            text.push(':');
            text.push_str(p);
        };
        match &self.transport {
            TransportSpec::Stdio(s) => {
                part("stdio");
                part(&s.command);
                // Where it runs decides what runs (`node dist/index.js`).
                part(
                    &s.cwd
                        .as_ref()
                        .map(|c| c.to_string_lossy())
                        .unwrap_or_default(),
                );
                for a in &s.args {
                    part(a);
                }
            }
            TransportSpec::Http(h) => {
                part("http");
                part(h.url.as_str());
            }
        }
        let mut digest = crate::util::hash::sha256_hex(text.as_bytes());
        digest.truncate(32);
        digest
    }

    /// Checks everything that can be checked before the server starts.
    pub fn validate(&self) -> Result<(), Invalid> {
        check_id(&self.id)?;
        self.transport.validate()?;
        if self.timeout.is_zero() {
            return Err(Invalid::new("timeout", "must be more than zero"));
        }
        if self.max_in_flight == 0 {
            return Err(Invalid::new("max_in_flight", "must be at least 1"));
        }
        if self.legacy_max_retries.is_some()
            && self.restart.max_restarts != RestartConfig::default().max_restarts
        {
            return Err(Invalid::new(
                "max_retries",
                "is the old name of restart.max_restarts; set only one of them",
            ));
        }
        self.restart.validate().map_err(|e| e.under("restart"))
    }
}

/// Server ids: letters, digits, `-`, `_`, `.`; no `__` (it separates server and tool in
/// qualified names) and no `_` at either end (`a_` + `_b` would read as `a__b`).
pub fn check_id(id: &str) -> Result<(), Invalid> {
    let bad = |why: &str| Err(Invalid::new("id", format!("{id:?} {why}")));
    if id.is_empty() || id == "." || id == ".." {
        return bad("is not a server id");
    }
    if id.len() > MAX_ID_LEN {
        let shown = crate::util::text::one_line(id, 40);
        return Err(Invalid::new(
            "id",
            format!("{shown:?} is longer than {MAX_ID_LEN} characters"),
        ));
    }
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
    {
        return bad("must use only letters, digits, '-', '_' and '.'");
    }
    if id.contains(SEPARATOR) {
        return bad("must not contain \"__\", which separates server and tool in qualified names");
    }
    if id.starts_with('_') || id.ends_with('_') {
        return bad("must not start or end with '_' (it would run into the \"__\" separator)");
    }
    Ok(())
}

/// The longest server id: it names a directory of the disk cache (file names stop at
/// 255 bytes) and begins every qualified name.
pub const MAX_ID_LEN: usize = 128;

/// A valid server id made from any name (an `mcpServers` key): characters outside
/// the allowed set become `_`, runs of `_` shrink to one, `_` at either end goes, and
/// a long one is cut to leave room for a `-N` suffix under [`MAX_ID_LEN`].
pub fn id_from_name(name: &str) -> String {
    let mapped: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut id = String::with_capacity(mapped.len());
    for c in mapped.chars() {
        if c == '_' && id.ends_with('_') {
            continue;
        }
        id.push(c);
    }
    // All ASCII by now: cut anywhere.
    id.truncate(MAX_ID_LEN - 8);
    let id = id.trim_matches('_').to_string();
    if check_id(&id).is_ok() {
        id
    } else {
        "server".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_id_is_refused_and_a_long_name_cut() {
        assert!(check_id(&"a".repeat(MAX_ID_LEN)).is_ok());
        assert!(check_id(&"a".repeat(MAX_ID_LEN + 1)).is_err());
        let id = id_from_name(&"long name ".repeat(100));
        assert!(id.len() <= MAX_ID_LEN - 8 && check_id(&id).is_ok(), "{id}");
        assert!(!id.ends_with('_'), "{id}");
    }

    #[test]
    fn ids_that_would_blur_the_separator_are_refused() {
        for bad in ["", "a__b", "_a", "a_", "a b", "..", "ä"] {
            assert!(check_id(bad).is_err(), "{bad:?}");
        }
        for good in ["a", "a_b", "a-b.c", "A1"] {
            assert!(check_id(good).is_ok(), "{good:?}");
        }
        assert_eq!(id_from_name("my server"), "my_server");
        assert_eq!(id_from_name("__x__y__"), "x_y");
        assert_eq!(id_from_name("bank_"), "bank");
        assert_eq!(id_from_name("@@@"), "server");
    }

    #[test]
    fn a_server_config_reads_with_defaults_and_rejects_unknown_keys() {
        let json = r#"{"id":"files","transport":{"type":"stdio","command":"srv"},"timeout":"5s"}"#;
        let c: ServerConfig = serde_json::from_str(json).expect("valid");
        assert_eq!(c.timeout, Duration::from_secs(5));
        assert!(c.enabled);
        assert_eq!(c.max_restarts(), 10);
        let typo = r#"{"id":"files","transport":{"type":"stdio","command":"srv"},"timout":"5s"}"#;
        let e = serde_json::from_str::<ServerConfig>(typo).expect_err("typo");
        assert!(e.to_string().contains("timout"), "{e}");
    }

    #[test]
    fn the_old_max_retries_key_is_still_read() {
        let json = r#"{"id":"s","transport":{"type":"stdio","command":"srv"},"max_retries":9}"#;
        let c: ServerConfig = serde_json::from_str(json).expect("valid");
        assert_eq!(c.max_restarts(), 9);
        c.validate().expect("valid");
    }

    #[test]
    fn restart_settings_are_validated_not_clamped() {
        let mut c = ServerConfig::stdio("s", "srv", Vec::<String>::new());
        c.restart.min_delay = Duration::from_secs(10);
        c.restart.max_delay = Duration::from_secs(1);
        let e = c.validate().expect_err("min > max");
        assert_eq!(e.field, "restart.min_delay");
        c.restart = RestartConfig {
            within: Duration::ZERO,
            ..RestartConfig::default()
        };
        assert_eq!(
            c.validate().expect_err("zero window").field,
            "restart.within"
        );
    }
}
