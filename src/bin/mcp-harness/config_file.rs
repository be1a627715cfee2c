//! Where the command-line program's servers come from: a TOML config file, the
//! `mcpServers` JSON people keep for Claude Desktop, Cursor and `.mcp.json` (or VS Code's
//! `servers`), or servers named on the command line.
//!
//! TOML is read strictly: an unknown key or a bad value is an error naming the key and
//! the file. `${VAR}` in any string value is replaced by the environment variable (an
//! unset one is an error). `mcpServers` files are read leniently, since the same file
//! serves other clients: keys this program does not use are ignored with a warning.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, bail};
use mcp_harness::{HarnessConfig, ServerConfig, TransportConfig};
use serde_json::Value;

/// A config ready to run, with the caller the commands act as.
pub struct Loaded {
    pub config: HarnessConfig,
    pub agent: String,
}

/// Replaces `${VAR}` in every string of `v`.
fn substitute(v: &mut Value, file: &Path) -> anyhow::Result<()> {
    match v {
        Value::String(s) => {
            let mut out = String::new();
            let mut rest = s.as_str();
            while let Some(start) = rest.find("${") {
                let Some(len) = rest[start..].find('}') else {
                    break;
                };
                let name = &rest[start + 2..start + len];
                let value = std::env::var(name).with_context(|| {
                    format!(
                        "{}: environment variable {name} is not set (referenced as ${{{name}}})",
                        file.display()
                    )
                })?;
                out.push_str(&rest[..start]);
                out.push_str(&value);
                rest = &rest[start + len + 1..];
            }
            out.push_str(rest);
            *s = out;
        }
        Value::Array(items) => items.iter_mut().try_for_each(|i| substitute(i, file))?,
        Value::Object(map) => map.values_mut().try_for_each(|i| substitute(i, file))?,
        _ => {}
    }
    Ok(())
}

/// Reads a config file: TOML (`.toml`), or JSON: `mcpServers`, VS Code's `servers`
/// object, or this program's own config as JSON.
pub fn load(path: &Path, agent: Option<String>) -> anyhow::Result<Loaded> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    let is_toml = path.extension().is_some_and(|e| e == "toml");
    let mut value: Value = if is_toml {
        toml::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}: {}", path.display(), e.to_string().trim()))?
    } else {
        serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}: invalid JSON: {e}", path.display()))?
    };
    substitute(&mut value, path)?;
    let servers_object = value
        .get("mcpServers")
        .or_else(|| value.get("servers").filter(|s| s.is_object()));
    if let Some(servers) = servers_object {
        let agent = agent.unwrap_or_else(|| "local".into());
        let config = import_mcp_servers(servers, path, &agent)?;
        return Ok(Loaded { config, agent });
    }
    let file_agent = value
        .as_object_mut()
        .and_then(|m| m.remove("agent"))
        .and_then(|a| a.as_str().map(String::from));
    let config: HarnessConfig =
        serde_json::from_value(value).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let agent = agent.or(file_agent).unwrap_or_else(|| "local".into());
    Ok(Loaded { config, agent })
}

/// Grants `agent` every tool of every server (ad hoc and imported servers).
pub fn grant_all(config: &mut HarnessConfig, agent: &str) {
    let grants = config.permissions.entry(agent.to_string()).or_default();
    for s in &config.servers {
        grants.insert(s.id.clone(), vec!["*".into()]);
    }
}

fn import_mcp_servers(servers: &Value, path: &Path, agent: &str) -> anyhow::Result<HarnessConfig> {
    let Some(servers) = servers.as_object() else {
        bail!("{}: mcpServers must be an object", path.display())
    };
    let mut config = HarnessConfig::default();
    for (name, entry) in servers {
        let at = |key: &str| format!("{}: mcpServers.{name}.{key}", path.display());
        let Some(entry) = entry.as_object() else {
            bail!("{}: mcpServers.{name} must be an object", path.display())
        };
        let strings = |key: &str| -> anyhow::Result<BTreeMap<String, String>> {
            match entry.get(key) {
                None => Ok(BTreeMap::new()),
                Some(v) => serde_json::from_value(v.clone())
                    .with_context(|| format!("{} must map names to strings", at(key))),
            }
        };
        let kind = entry.get("type").and_then(Value::as_str).unwrap_or("");
        let transport = match (entry.get("command"), entry.get("url")) {
            (Some(command), _) if kind.is_empty() || kind == "stdio" => TransportConfig::Stdio {
                command: command
                    .as_str()
                    .with_context(|| format!("{} must be a string", at("command")))?
                    .to_string(),
                args: match entry.get("args") {
                    None => Vec::new(),
                    Some(a) => serde_json::from_value(a.clone())
                        .with_context(|| format!("{} must be a list of strings", at("args")))?,
                },
                env: strings("env")?,
                cwd: entry.get("cwd").and_then(Value::as_str).map(Into::into),
            },
            (_, Some(url)) => {
                if kind == "sse" {
                    bail!(
                        "{}: the HTTP+SSE transport (2024-11-05) is not supported; use a Streamable HTTP endpoint",
                        at("type")
                    );
                }
                TransportConfig::Http {
                    url: url
                        .as_str()
                        .with_context(|| format!("{} must be a string", at("url")))?
                        .to_string(),
                    headers: strings("headers")?,
                }
            }
            _ => bail!(
                "{}: needs `command` (stdio) or `url` (HTTP)",
                path.display().to_string() + ": mcpServers." + name
            ),
        };
        for key in entry.keys() {
            if ![
                "command", "args", "env", "cwd", "url", "type", "headers", "disabled",
            ]
            .contains(&key.as_str())
            {
                tracing::warn!(file = %path.display(), server = %name, key = %key, "ignoring a key this program does not use");
            }
        }
        let id: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect::<String>()
            .replace("__", "_");
        let mut server = ServerConfig::new(id, transport);
        server.name = Some(name.clone());
        server.enabled = !entry
            .get("disabled")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        config.servers.push(server);
    }
    grant_all(&mut config, agent);
    Ok(config)
}

/// Grants `agent` everything on the ad hoc servers (`stdioN`, `httpN`) added next to a
/// config file; the file's own permissions apply as written.
pub fn grant_all_ad_hoc(config: &mut HarnessConfig, agent: &str) {
    let grants = config.permissions.entry(agent.to_string()).or_default();
    for s in &config.servers {
        let ad_hoc =
            s.id.strip_prefix("stdio")
                .or_else(|| s.id.strip_prefix("http"))
                .is_some_and(|n| n.parse::<u32>().is_ok());
        if ad_hoc && s.name.is_none() {
            grants.insert(s.id.clone(), vec!["*".into()]);
        }
    }
}

/// Servers named on the command line: `--stdio 'COMMAND ARGS…'` and `--http URL`.
pub fn ad_hoc(stdio: &[String], http: &[String], agent: &str) -> anyhow::Result<HarnessConfig> {
    let mut config = HarnessConfig::default();
    for (i, line) in stdio.iter().enumerate() {
        let mut words = line.split_whitespace().map(String::from);
        let Some(command) = words.next() else {
            bail!("--stdio needs a command")
        };
        let id = format!("stdio{}", i + 1);
        config
            .servers
            .push(ServerConfig::stdio(id, command, words.collect::<Vec<_>>()));
    }
    for (i, url) in http.iter().enumerate() {
        config
            .servers
            .push(ServerConfig::http(format!("http{}", i + 1), url.clone()));
    }
    grant_all(&mut config, agent);
    Ok(config)
}
