//! Config files: TOML in this crate's own shape, or the `mcpServers` JSON people keep
//! for Claude Desktop, Cursor and `.mcp.json` (or VS Code's `servers`), and servers named
//! on a command line.
//!
//! TOML is read strictly: an unknown key, a key written twice or a bad value is an
//! error naming the key and the file (so is this crate's config written as JSON).
//! `${VAR}` in any string value is replaced by the environment variable (an
//! unset one is an error), in the forms other clients write too: `${VAR:-default}`
//! (Claude Code), `${env:VAR}`, `${userHome}` and `${workspaceFolder}` (VS Code,
//! Cursor). `mcpServers` files are read leniently, since the same file serves other
//! clients: keys this crate does not use are ignored with a warning, a name that is not
//! a valid server id is mapped to one (the mapping is reported), of a key written twice
//! the last is used with a warning (as `JSON.parse` does for the others), and a server
//! that needs VS Code's prompted `${input:…}` is imported disabled, with a warning.
//!
//! A variable often holds a secret (a token in a header), so the errors about a file
//! quote its `${…}` as written where they would quote the value it put in.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{ConfigError, HarnessConfig};
use crate::server::{ServerConfig, id_from_name};
use crate::transport::{HttpSpec, StdioSpec, TransportSpec};

/// A config read from a file, with what the reading decided.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct Loaded {
    /// The configuration.
    pub config: HarnessConfig,
    /// The caller a command line acts as (`agent` in the file), if it names one.
    pub agent: Option<String>,
    /// `mcpServers` names that were not valid server ids, and the ids they became.
    pub renamed: Vec<(String, String)>,
    /// Whether it was an `mcpServers` file (which grants nothing: its servers are meant
    /// for whoever runs it).
    pub imported: bool,
    /// The `[gateway]` table, as written (read by `gateway::GatewayConfig`).
    pub gateway: Option<Value>,
    /// The `[telemetry]` table, as written (read by the command line's exporter).
    pub telemetry: Option<Value>,
    /// The values the environment put in, to keep out of errors about the tables read
    /// later (`gateway`, `telemetry`): see [`Substituted::redact`].
    pub substituted: Substituted,
}

/// The values `${…}` took from the environment, each with its `${…}` as written.
/// (`Debug` shows only the latter.)
#[derive(Clone, Default)]
pub struct Substituted(Vec<(String, String)>);

impl std::fmt::Debug for Substituted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(_, w)| w))
            .finish()
    }
}

impl Substituted {
    /// Below this length a value is put back only where quoted whole (`"v"`, `` `v` ``,
    /// as serde's errors quote), not wherever its text happens to occur: a value this
    /// short is no secret, and the error would lose its words.
    const BARE: usize = 4;

    /// `text` (an error about the config) with each value that came from the
    /// environment replaced by its `${…}` as written: quoted whole, or anywhere (as
    /// written, escaped as `{:?}` escapes it, or trimmed) when it is [`Self::BARE`]
    /// characters or more.
    pub fn redact(&self, text: &str) -> String {
        let mut text = text.to_string();
        for (value, written) in &self.0 {
            let quoted = format!("{value:?}");
            text = text
                .replace(&quoted, &format!("{written:?}"))
                .replace(&format!("`{value}`"), &format!("`{written}`"));
            let escaped = &quoted[1..quoted.len() - 1];
            for form in [value.as_str(), escaped, value.trim()] {
                if form.chars().count() >= Self::BARE {
                    text = text.replace(form, written);
                }
            }
        }
        text
    }

    /// `error` with what a variable put in redacted: its reason, and the server and
    /// field it names (an id written as `${VAR}`).
    fn error(&self, mut error: ConfigError) -> ConfigError {
        error.reason = self.redact(&error.reason);
        error.field = self.redact(&error.field);
        error.server = error.server.map(|s| self.redact(&s));
        error
    }

    fn note(&mut self, value: &str, written: String) {
        if !value.is_empty() && !self.0.iter().any(|(v, _)| v == value) {
            self.0.push((value.to_string(), written));
            // The longest first, so that a value inside another is not put back into it.
            self.0.sort_by_key(|(v, _)| std::cmp::Reverse(v.len()));
        }
    }
}

/// What [`substitute`] met: the ids of the `${input:…}` prompts, left as written, and
/// the values it took from the environment.
#[derive(Default)]
struct Met {
    prompts: Vec<String>,
    substituted: Substituted,
}

/// The value of one `${…}` (its text between the braces), and whether the environment
/// gave it; `None` for VS Code's `${input:ID}`, a prompt no one here can answer.
fn variable(inner: &str, file: &Path) -> Result<Option<(String, bool)>, ConfigError> {
    let unset = |name: &str| {
        ConfigError::new(
            format!("${{{inner}}}"),
            format!("environment variable {name} is not set"),
        )
        .in_file(file)
    };
    if inner.starts_with("input:") {
        return Ok(None);
    }
    // Set but not UTF-8: said, not read as unset (its default taken in silence).
    let not_text = |name: &str| {
        ConfigError::new(
            format!("${{{inner}}}"),
            format!("environment variable {name} is set but is not UTF-8 text"),
        )
        .in_file(file)
    };
    if let Some((name, default)) = inner.split_once(":-") {
        let name = name.strip_prefix("env:").unwrap_or(name);
        return match std::env::var(name) {
            Ok(value) if !value.is_empty() => Ok(Some((value, true))),
            Ok(_) | Err(std::env::VarError::NotPresent) => Ok(Some((default.to_string(), false))),
            Err(std::env::VarError::NotUnicode(_)) => Err(not_text(name)),
        };
    }
    match inner {
        "userHome" => std::env::var("HOME")
            .ok()
            .filter(|h| h.starts_with('/'))
            .map(|h| Some((h, false)))
            .ok_or_else(|| unset("HOME")),
        "workspaceFolder" => Ok(Some((
            workspace(file).to_string_lossy().into_owned(),
            false,
        ))),
        "pathSeparator" | "/" => Ok(Some(("/".into(), false))),
        _ => {
            let name = inner.strip_prefix("env:").unwrap_or(inner);
            match std::env::var(name) {
                Ok(v) => Ok(Some((v, true))),
                Err(std::env::VarError::NotPresent) => Err(unset(name)),
                Err(std::env::VarError::NotUnicode(_)) => Err(not_text(name)),
            }
        }
    }
}

/// The project a client's config file belongs to: the directory that holds it, or
/// that directory's parent for a client's own (`.vscode/mcp.json`, `.cursor/mcp.json`).
fn workspace(file: &Path) -> std::path::PathBuf {
    let dir = file.parent().unwrap_or(Path::new(""));
    let dir = match dir.file_name().and_then(|n| n.to_str()) {
        Some(".vscode" | ".cursor") => dir.parent().unwrap_or(Path::new("")),
        _ => dir,
    };
    if dir.is_absolute() {
        return dir.to_path_buf();
    }
    match std::env::current_dir() {
        Ok(cwd) => cwd.join(dir),
        Err(_) => dir.to_path_buf(),
    }
}

/// Replaces each `${…}` in every string of `v`, noting what it met in `met`.
fn substitute(v: &mut Value, file: &Path, met: &mut Met) -> Result<(), ConfigError> {
    match v {
        Value::String(s) => {
            let mut out = String::new();
            let mut rest = s.as_str();
            while let Some(start) = rest.find("${") {
                let Some(len) = rest[start..].find('}') else {
                    break;
                };
                let inner = &rest[start + 2..start + len];
                out.push_str(&rest[..start]);
                match variable(inner, file)? {
                    Some((value, from_env)) => {
                        if from_env {
                            met.substituted.note(&value, format!("${{{inner}}}"));
                        }
                        out.push_str(&value);
                    }
                    None => {
                        met.prompts.push(inner["input:".len()..].to_string());
                        out.push_str(&rest[start..=start + len]);
                    }
                }
                rest = &rest[start + len + 1..];
            }
            out.push_str(rest);
            *s = out;
        }
        Value::Array(items) => items
            .iter_mut()
            .try_for_each(|i| substitute(i, file, met))?,
        Value::Object(map) => map
            .values_mut()
            .try_for_each(|i| substitute(i, file, met))?,
        _ => {}
    }
    Ok(())
}

/// Reads a config file: TOML (`.toml`), or JSON: `mcpServers`, VS Code's `servers`
/// object, or this crate's own config as JSON. The result is validated.
pub fn load(path: &Path) -> Result<Loaded, ConfigError> {
    parse(&read(path)?, path)
}

/// A config file's text, up to [`MAX_FILE_BYTES`]: [`load`] without [`parse`], for a
/// caller that parses it more than once (a FIFO can be read only once).
pub fn read(path: &Path) -> Result<String, ConfigError> {
    let file = std::fs::File::open(path).map_err(|e| unreadable(path, e))?;
    read_open(path, file, Reading::Start)
}

/// Why a file is read, for the checks [`read_open`] makes and the words it says them in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reading {
    /// A config file at start.
    Start,
    /// A config file reloaded.
    Reload,
    /// A file of keys (a JWKS).
    Keys,
}

/// What a refusal or a warning of [`read_open`] says of a file.
struct Words {
    /// What whoever else may write it decides.
    stake: &'static str,
    /// The warning that others may write it.
    warning: &'static str,
    /// What is not done with it.
    refused: &'static str,
    /// What else the operator may do.
    or_else: &'static str,
}

impl Reading {
    fn words(self) -> Words {
        match self {
            Reading::Start | Reading::Reload => Words {
                stake: "whoever wrote it would decide what runs",
                warning: "the config file may be written by others, who would decide what it runs",
                refused: "not reloaded",
                or_else: ", or restart to apply it",
            },
            Reading::Keys => Words {
                stake: "whoever wrote a key there would choose whose tokens are taken",
                warning: "the JWKS file may be written by others, who would choose whose tokens are taken",
                refused: "not read",
                or_else: "",
            },
        }
    }
}

/// [`read`], of a regular file only: anything else (a FIFO put in the file's place,
/// a device) is an error at once, never waited on. For a reload, which must not hold
/// a thread waiting for a writer.
pub fn read_regular(path: &Path) -> Result<String, ConfigError> {
    read_checked(path, Reading::Reload)
}

/// A file of keys that decide whose bearer tokens are taken (a JWKS): read as
/// [`read_regular`] reads a reloaded config, at start too, with its own words.
pub fn read_keys(path: &Path) -> Result<String, ConfigError> {
    read_checked(path, Reading::Keys)
}

fn read_checked(path: &Path, reading: Reading) -> Result<String, ConfigError> {
    use std::os::unix::fs::OpenOptionsExt;
    // Non-blocking: opening a FIFO for reading would wait for a writer.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| unreadable(path, e))?;
    match file.metadata() {
        Ok(m) if m.is_file() => read_open(path, file, reading),
        Ok(_) => Err(ConfigError::new("(file)", "is not a regular file").in_file(path)),
        Err(e) => Err(unreadable(path, e)),
    }
}

/// The target of the warning that a config file others may write was read: said once
/// per path in a process (a program that reads its config twice, once early, shows this
/// one from its first read, and the others from its second).
pub const ACCESS_WARNINGS: &str = "mcp_harness::config::access";

/// True the first time `path` is asked about in this process.
fn warned_once(path: &Path) -> bool {
    static WARNED: std::sync::OnceLock<parking_lot::Mutex<std::collections::HashSet<PathBuf>>> =
        std::sync::OnceLock::new();
    WARNED
        .get_or_init(Default::default)
        .lock()
        .insert(path.to_path_buf())
}

fn unreadable(path: &Path, e: std::io::Error) -> ConfigError {
    ConfigError::new("(file)", format!("cannot read it: {e}")).in_file(path)
}

/// Reads an open config file. It says what runs (a stdio server's command) and who may
/// call what, so whoever else may write it is warned of, once per path: anyone (`o+w`),
/// or its owner when that is another user than this one or root. Such a file is read
/// at start (WSL's Windows drives and some shared folders show every file as 0777, and
/// a file bind-mounted from the host keeps the host's owner), but one anyone may write
/// or replace (in a directory anyone may write, not sticky) is not reloaded (`reload`:
/// `serve` would apply another's edit within seconds). A file its group may write is
/// the group's to edit, as its owner made it.
fn read_open(path: &Path, file: std::fs::File, reading: Reading) -> Result<String, ConfigError> {
    use std::io::Read;
    let reload = reading != Reading::Start;
    let Words {
        stake,
        warning,
        refused,
        or_else,
    } = reading.words();
    use std::os::unix::fs::MetadataExt;
    if let Ok(meta) = file.metadata()
        && meta.is_file()
    {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        let anyone = meta.mode() & 0o002 != 0;
        if anyone && reload {
            let why = format!(
                "is writable by anyone (mode {:o}): {refused}, as {stake}; chmod o-w it{or_else}",
                meta.mode() & 0o777
            );
            return Err(ConfigError::new("(file)", why).in_file(path));
        }
        // So may anyone who may replace it: in a directory every user may write and
        // that is not sticky, anyone may rename a file of theirs over it, or, higher
        // up, a directory of theirs over the one that holds it.
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let open_dir = reload
            .then(|| std::fs::canonicalize(dir).ok())
            .flatten()
            .and_then(|dir| {
                dir.ancestors().find_map(|d| {
                    let mode = std::fs::metadata(d).ok()?.mode();
                    (mode & 0o002 != 0 && mode & 0o1000 == 0).then(|| (d.to_path_buf(), mode))
                })
            });
        if let Some((d, mode)) = open_dir {
            let why = format!(
                "is under a directory anyone may write that is not sticky ({}, mode {:o}): {refused}, as anyone could put another file in its place; chmod o-w or +t that directory{or_else}",
                d.display(),
                mode & 0o7777
            );
            return Err(ConfigError::new("(file)", why).in_file(path));
        }
        let other = meta.uid() != me && meta.uid() != 0;
        if (anyone || other) && warned_once(path) {
            tracing::warn!(target: ACCESS_WARNINGS, path = %path.display(), uid = meta.uid(), mode = %format!("{:o}", meta.mode() & 0o777), "{warning}");
        }
    }
    let mut text = String::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| unreadable(path, e))?;
    if text.len() as u64 > MAX_FILE_BYTES {
        let why = format!("is larger than {} MiB", MAX_FILE_BYTES >> 20);
        return Err(ConfigError::new("(file)", why).in_file(path));
    }
    Ok(text)
}

/// The largest config file read: a path to `/dev/zero` or a runaway generator would
/// grow memory without end, and one of millions of small values takes some 50 times
/// its size as parsed trees (TOML's and JSON's). A config of a thousand servers is
/// well under 1 MiB.
const MAX_FILE_BYTES: u64 = 4 << 20;

/// Top-level keys that only a harness config holds. Keys another client may keep
/// for itself beside `mcpServers` (Gemini CLI's `telemetry`, a generic `cache`,
/// `limits` or `agent`) are left out: such a file is imported, its other keys ignored.
const HARNESS_KEYS: [&str; 11] = [
    "permissions",
    "audit",
    "gateway",
    "agents",
    "sampling",
    "client_info",
    "round_cap",
    "input_timeout",
    "call_timeout",
    "shutdown_grace",
    "trace_sample_ratio",
];

/// Keys other clients keep beside `mcpServers` that are one edit from a harness key.
const OTHER_CLIENTS_KEYS: [&str; 4] = ["agent", "cache", "limits", "telemetry"];

/// Whether `key` is `harness_key` misspelled: the same but for case, `-` for `_`, or
/// one letter added, left out or changed, or two neighbours swapped (and not another
/// client's key).
fn near_miss(key: &str, harness_key: &str) -> bool {
    if key == harness_key || OTHER_CLIENTS_KEYS.contains(&key) || key.len() > 64 {
        return false;
    }
    let fold = |s: &str| -> Vec<char> {
        s.chars()
            .map(|c| {
                if c == '-' {
                    '_'
                } else {
                    c.to_ascii_lowercase()
                }
            })
            .collect()
    };
    let (a, b) = (fold(key), fold(harness_key));
    if a == b {
        return true;
    }
    let (short, long) = if a.len() <= b.len() {
        (&a, &b)
    } else {
        (&b, &a)
    };
    match long.len() - short.len() {
        0 => {
            let differ: Vec<usize> = (0..a.len()).filter(|&i| a[i] != b[i]).collect();
            // One letter changed, or two neighbours swapped (`permsisions`).
            match differ[..] {
                [_] => true,
                [i, j] => j == i + 1 && a[i] == b[j] && a[j] == b[i],
                _ => false,
            }
        }
        1 => {
            let cut = short
                .iter()
                .zip(long.iter())
                .take_while(|(x, y)| x == y)
                .count();
            short[cut..] == long[cut + 1..]
        }
        _ => false,
    }
}

/// The key path of the first float in `value` that is nan or infinite, if any.
fn non_finite(value: &toml::Value, at: &str) -> Option<String> {
    let within = |key: String, v: &toml::Value| non_finite(v, &key);
    match value {
        toml::Value::Float(f) if !f.is_finite() => Some(at.to_string()),
        toml::Value::Table(t) => t.iter().find_map(|(k, v)| {
            within(
                if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                },
                v,
            )
        }),
        toml::Value::Array(a) => a
            .iter()
            .enumerate()
            .find_map(|(i, v)| within(format!("{at}[{i}]"), v)),
        _ => None,
    }
}

/// [`load`] on text already read (`path` names it in errors and picks the format).
pub fn parse(text: &str, path: &Path) -> Result<Loaded, ConfigError> {
    let is_toml = path.extension().is_some_and(|e| e == "toml");
    // TOML refuses a key written twice itself.
    let (mut value, twice): (Value, _) = if is_toml {
        let value: toml::Value = toml::from_str(text).map_err(|e: toml::de::Error| {
            // Not the error's own text, which quotes the line (a key may be on it).
            let at = e.span().map_or(String::new(), |span| {
                let before = text.get(..span.start).unwrap_or(text);
                let line = before.matches('\n').count() + 1;
                let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                format!("line {line}, column {column}: ")
            });
            let mut message = crate::util::text::one_line(e.message(), 300);
            // The one span worth naming: a key written twice (a key, never a value).
            if message == "duplicate key"
                && let Some(key) = e.span().and_then(|span| text.get(span))
            {
                message = format!("{message} {}", crate::util::text::one_line(key, 100));
            }
            ConfigError::new("(syntax)", format!("{at}{message}")).in_file(path)
        })?;
        // JSON has no nan or inf: converted, they would be null, and a setting so
        // written would read as not set (`audit.path = nan`: no audit trail).
        if let Some(key) = non_finite(&value, "") {
            let key = crate::util::text::one_line(&key, 200);
            return Err(ConfigError::new(key, "is not a finite number").in_file(path));
        }
        let value = serde_json::to_value(value).map_err(|e| {
            ConfigError::new("(syntax)", crate::util::text::one_line(&e.to_string(), 300))
                .in_file(path)
        })?;
        (value, Vec::new())
    } else {
        // As other clients read it: VS Code's `mcp.json` is JSON with comments and
        // trailing commas, and an editor on Windows may save a byte order mark. Both
        // become spaces in place (a comment's line breaks kept), so that errors name
        // the line and column as written.
        let written = text.strip_prefix('\u{feff}').unwrap_or(text);
        let invalid = |e: &dyn std::fmt::Display| {
            ConfigError::new("(syntax)", format!("invalid JSON: {e}")).in_file(path)
        };
        let mut text = written.to_string();
        if json_strip_comments::strip(&mut text).is_err() {
            return Err(invalid(&stray_slash(written)));
        }
        let mut bytes = text.into_bytes();
        for (kept, was) in bytes.iter_mut().zip(written.bytes()) {
            // A literal line break stands in no valid JSON string: only a comment's.
            if matches!(was, b'\n' | b'\r') {
                *kept = was;
            }
        }
        let text = String::from_utf8(bytes).map_err(|e| invalid(&e))?;
        super::json::read(&text).map_err(|e| invalid(&e))?
    };
    let servers_key = if value.get("mcpServers").is_some() {
        Some("mcpServers")
    } else {
        value
            .get("servers")
            .filter(|s| s.is_object())
            .map(|_| "servers")
    };
    if let Some(servers_key) = servers_key.filter(|_| is_toml) {
        // No other client writes `mcpServers` in TOML: here it is a harness config
        // written wrong (`[servers.x]` for `[[servers]]`), whose other settings the
        // import would drop.
        return Err(ConfigError::new(
            servers_key,
            "a TOML config is read strictly: write each server as [[servers]] (mcpServers, or a servers table, is imported from another client's JSON file)",
        )
        .in_file(path));
    }
    if servers_key == Some("mcpServers") && value.get("servers").is_some() {
        // Both: which list the writer meant is not known, and the other would be
        // dropped without a word.
        return Err(ConfigError::new(
            "servers",
            "beside mcpServers: a file is either another client's (mcpServers, or VS Code's servers) or the harness's own ([[servers]]); keep one list",
        )
        .in_file(path));
    }
    if let Some(servers_key) = servers_key {
        // Another client's file holds servers only (and settings of its own); one that
        // also holds the harness's settings is not imported, which would drop them
        // (grants, audit, the gateway's tokens) without a word.
        if let Some(key) = HARNESS_KEYS.into_iter().find(|k| value.get(*k).is_some()) {
            return Err(ConfigError::new(
                key,
                "a file with mcpServers (or a servers table) is imported as another client's, and holds no harness settings: write the servers as [[servers]] in a harness config, or move the settings out",
            )
            .in_file(path));
        }
        // A harness setting misspelled (`permission`, `Permissions`) would be ignored,
        // and the import then grants every server to the caller: refused too.
        let misspelled = value.as_object().and_then(|o| {
            o.keys().find_map(|k| {
                HARNESS_KEYS
                    .into_iter()
                    .find(|h| near_miss(k, h))
                    .map(|h| (k.clone(), h))
            })
        });
        if let Some((key, meant)) = misspelled {
            return Err(ConfigError::new(
                crate::util::text::one_line(&key, 64),
                format!("looks like the harness setting {meant:?} misspelled; a file with mcpServers is imported as another client's and would ignore it (granting every server): spell it {meant:?} in a harness config, or remove it"),
            )
            .in_file(path));
        }
        // Read as the other clients that share the file read it: the last one wins.
        if !twice.is_empty() {
            tracing::warn!(file = %path.display(), keys = ?twice, "keys written twice; the last of each is used");
        }
        // Each server's values on their own: one that needs a prompt is left off, and
        // the keys of other clients' own settings are not read.
        let mut prompted = std::collections::HashMap::new();
        let mut met = Met::default();
        if let Some(Value::Object(servers)) = value.get_mut(servers_key) {
            // A disabled server's values are not needed to run the others: one whose
            // variable is not set (a token only it uses) is left out, as its client
            // would not look at it either, not the whole file refused.
            let mut unset = Vec::new();
            for (name, entry) in servers.iter_mut() {
                match substitute(entry, path, &mut met) {
                    Ok(()) => {}
                    Err(e) if is_disabled(entry) => {
                        tracing::warn!(file = %path.display(), server = ?name, variable = %e.field, "a disabled server whose values could not be read (a variable not set, a prompt) is left out");
                        unset.push(name.clone());
                    }
                    Err(mut e) => {
                        e.server = Some(name.clone());
                        return Err(e);
                    }
                }
                if !met.prompts.is_empty() {
                    prompted.insert(name.clone(), std::mem::take(&mut met.prompts));
                }
            }
            for name in unset {
                servers.remove(&name);
            }
        }
        let substituted = met.substituted;
        let (config, renamed) = import_mcp_servers(&value[servers_key], path, &prompted)
            .map_err(|e| substituted.error(e))?;
        config
            .validate()
            .map_err(|e| substituted.error(e.in_file(path)))?;
        return Ok(Loaded {
            config,
            agent: None,
            renamed,
            imported: true,
            gateway: None,
            telemetry: None,
            substituted,
        });
    }
    if let Some(key) = twice.first() {
        return Err(ConfigError::new(key.as_str(), "is written twice").in_file(path));
    }
    let mut met = Met::default();
    substitute(&mut value, path, &mut met)?;
    let Met {
        prompts,
        substituted,
    } = met;
    if let Some(id) = prompts.first() {
        return Err(ConfigError::new(
            format!("${{input:{id}}}"),
            "a prompt for input (VS Code's `inputs`) cannot be answered here: use ${VAR} or ${env:VAR}",
        )
        .in_file(path));
    }
    anchor_paths(&mut value, path)?;
    let agent = match value.as_object_mut().and_then(|m| m.remove("agent")) {
        None => None,
        Some(Value::String(agent)) => Some(agent),
        // Read as no agent, the command line would act as another (`local`).
        Some(_) => return Err(ConfigError::new("agent", "must be a string").in_file(path)),
    };
    // The gateway reads its own table (it is the layer above this one).
    let gateway = value.as_object_mut().and_then(|m| m.remove("gateway"));
    let telemetry = value.as_object_mut().and_then(|m| m.remove("telemetry"));
    // Both names given, the old one would win silently whenever the new one holds its
    // default (which `validate` cannot tell from one not written).
    if let Some(Value::Array(servers)) = value.get("servers")
        && let Some(i) = servers.iter().position(|s| {
            s.get("max_retries").is_some() && s.pointer("/restart/max_restarts").is_some()
        })
    {
        return Err(ConfigError::new(
            format!("servers[{i}].max_retries"),
            "is the old name of restart.max_restarts; set only one of them",
        )
        .in_file(path));
    }
    // A value of the wrong type inside `[[servers]]` names its server, as a check's
    // error does, not only its place in the list.
    let ids: Vec<Option<String>> = match value.get("servers") {
        Some(Value::Array(servers)) => servers
            .iter()
            .map(|s| s.get("id").and_then(Value::as_str).map(String::from))
            .collect(),
        _ => Vec::new(),
    };
    let config: HarnessConfig = serde_path_to_error::deserialize(value).map_err(|e| {
        let at = e.path().to_string();
        let server = (at.strip_prefix("servers["))
            .and_then(|rest| rest.split_once(']'))
            .and_then(|(i, _)| i.parse::<usize>().ok())
            .and_then(|i| ids.get(i).cloned().flatten());
        let field = if at == "." { "(value)".into() } else { at };
        let mut e = ConfigError::new(field, e.inner().to_string()).in_file(path);
        e.server = server;
        substituted.error(e)
    })?;
    config
        .validate()
        .and_then(|()| config.validate_builtin_inputs())
        .map_err(|e| substituted.error(e.in_file(path)))?;
    Ok(Loaded {
        config,
        agent,
        renamed: Vec::new(),
        imported: false,
        gateway,
        telemetry,
        substituted,
    })
}

/// The settings of this crate's own format that are paths (`*` for each item of an
/// array or table).
const PATH_SETTINGS: [&[&str]; 10] = [
    &["audit", "path"],
    &["cache", "dir"],
    &["cache", "shared", "key_file"],
    &["servers", "*", "transport", "cwd"],
    &["servers", "*", "transport", "ca_file"],
    &["sampling", "ca_file"],
    &["gateway", "keys_file"],
    &["gateway", "jwt", "jwks_file"],
    &["gateway", "jwt", "ca_file"],
    &["telemetry", "ca_file"],
];

/// Makes each path setting absolute: `~/` is the home directory, and a relative path
/// is taken from the directory of the config file, as written in it, not from
/// wherever the harness happens to be started (a service's working directory is `/`).
/// A file that is no regular file (`--config <(…)`, a FIFO), or one named through
/// `/dev` or `/proc` (`--config /dev/stdin < h.toml`, a regular file there), has no
/// directory of its own: its relative paths are the working directory's.
fn anchor_paths(value: &mut Value, file: &Path) -> Result<(), ConfigError> {
    let base = if is_own_file(file) {
        let dir = file.parent().unwrap_or(Path::new(""));
        if dir.is_absolute() {
            Some(dir.to_path_buf())
        } else {
            std::env::current_dir().ok().map(|cwd| cwd.join(dir))
        }
    } else {
        None
    };
    for setting in PATH_SETTINGS {
        let mut found = Vec::new();
        paths_at(value, setting, String::new(), &mut found);
        for (at, slot) in found {
            let Value::String(written) = slot else {
                continue;
            };
            match anchored(written, base.as_deref()) {
                Ok(Some(path)) => *written = path.to_string_lossy().into_owned(),
                Ok(None) => {}
                Err(why) => return Err(ConfigError::new(at, why).in_file(file)),
            }
        }
    }
    Ok(())
}

/// Whether `file` is a file of its own, whose directory its relative paths are taken
/// from: not a descriptor (`/dev/stdin`, `<(…)`), which resolves to wherever its data
/// came from.
fn is_own_file(file: &Path) -> bool {
    let descriptor = file.starts_with("/dev") || file.starts_with("/proc");
    !descriptor && std::fs::metadata(file).is_ok_and(|m| m.is_file())
}

/// A path as written in a config file, anchored: `~/…` under HOME, a relative one
/// under `base` (none: left as it is); `None` when it is anchored already.
fn anchored(written: &str, base: Option<&Path>) -> Result<Option<PathBuf>, &'static str> {
    if let Some(rest) = written.strip_prefix("~/") {
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .filter(|h| h.is_absolute())
            .ok_or("starts with ~/ but HOME is not set to an absolute path")?;
        return Ok(Some(home.join(rest)));
    }
    if Path::new(written).is_relative() && !written.is_empty() {
        return Ok(base.map(|b| b.join(written)));
    }
    Ok(None)
}

/// The values at `setting` under `value`, each with its key path.
fn paths_at<'v>(
    value: &'v mut Value,
    setting: &[&str],
    at: String,
    found: &mut Vec<(String, &'v mut Value)>,
) {
    let Some((first, rest)) = setting.split_first() else {
        found.push((at, value));
        return;
    };
    let join = |key: &str| {
        if at.is_empty() {
            key.to_string()
        } else {
            format!("{at}.{key}")
        }
    };
    match (*first, value) {
        ("*", Value::Array(items)) => {
            for (i, item) in items.iter_mut().enumerate() {
                paths_at(item, rest, format!("{at}[{i}]"), found);
            }
        }
        ("*", Value::Object(map)) => {
            for (key, item) in map.iter_mut() {
                let key = join(key);
                paths_at(item, rest, key, found);
            }
        }
        (key, Value::Object(map)) => {
            if let Some(item) = map.get_mut(key) {
                paths_at(item, rest, join(key), found);
            }
        }
        _ => {}
    }
}

const MCP_SERVERS_KEYS: &[&str] = &[
    "command",
    "args",
    "env",
    "cwd",
    "url",
    "httpUrl",
    "serverUrl",
    "type",
    "headers",
    "disabled",
];

/// Where the `/` that begins no comment is in `text`, which the comment stripper
/// refused: the shortest prefix it refuses ends just after it (whether a prefix is
/// refused grows with its length), found by halving.
fn stray_slash(text: &str) -> String {
    let refused = |len: usize| {
        let mut prefix = text.as_bytes()[..len].to_vec();
        json_strip_comments::strip_slice(&mut prefix).is_err()
    };
    let (mut fits, mut fails) = (0, text.len());
    while fails - fits > 1 {
        let mid = fits + (fails - fits) / 2;
        if refused(mid) {
            fails = mid;
        } else {
            fits = mid;
        }
    }
    // The stripper refuses at the byte after the `/`.
    let before = &text.as_bytes()[..fails.saturating_sub(2)];
    let line = before.iter().filter(|b| **b == b'\n').count() + 1;
    let column = before.iter().rev().take_while(|b| **b != b'\n').count() + 1;
    format!("a `/` that begins no comment at line {line} column {column}")
}

/// Whether an `mcpServers` entry says `"disabled": true`.
fn is_disabled(entry: &Value) -> bool {
    entry.get("disabled") == Some(&Value::Bool(true))
}

/// `servers` as the harness's servers; those in `prompted` (by name, with the ids of the
/// prompts they need) are disabled. A disabled server whose settings this program
/// cannot take (an `sse` one, a value of the wrong type, one that is not valid) is
/// left out with a warning: the others run as they do in the file's own client.
fn import_mcp_servers(
    servers: &Value,
    path: &Path,
    prompted: &std::collections::HashMap<String, Vec<String>>,
) -> Result<(HarnessConfig, Vec<(String, String)>), ConfigError> {
    let bad = |field: String, reason: &str| ConfigError::new(field, reason).in_file(path);
    let Some(servers) = servers.as_object() else {
        return Err(bad("mcpServers".into(), "must be an object"));
    };
    let mut config = HarnessConfig::default();
    let mut renamed = Vec::new();
    // Names that are ids already keep them; the others take theirs around them.
    let kept: std::collections::HashSet<&str> = servers
        .keys()
        .map(String::as_str)
        .filter(|name| id_from_name(name) == *name)
        .collect();
    // How many names map to each id: a name that is not an id takes that id only when
    // it is the one name that maps to it, else one from its own name's hash. An id
    // then never passes from one such name to another as names are added or removed
    // (grants, tokens and tool names follow ids); at most it stops naming any.
    let mut sharing: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for name in servers.keys() {
        *sharing.entry(id_from_name(name)).or_default() += 1;
    }
    let mut taken: std::collections::HashSet<String> = std::collections::HashSet::new();
    // The next suffix to try per id, should a hash's be taken: linear time for many.
    let mut next: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    for (name, entry) in servers {
        let transport = match transport_of(name, entry, path) {
            Ok(transport) => transport,
            Err(e) if is_disabled(entry) => {
                tracing::warn!(file = %path.display(), server = ?name, field = %e.field, reason = %e.reason, "a disabled server this program cannot take is left out");
                continue;
            }
            Err(e) => return Err(e),
        };
        let Some(entry) = entry.as_object() else {
            return Err(bad(format!("mcpServers.{name}"), "must be an object"));
        };
        let at = |key: &str| format!("mcpServers.{name}.{key}");
        // Keys of the other transport are dropped: said, as a header or variable one
        // counts on would be missing.
        let other: &[&str] = match &transport {
            TransportSpec::Stdio(_) => &["headers", "url", "httpUrl", "serverUrl"],
            TransportSpec::Http(_) => &["env", "cwd", "command", "args"],
        };
        for key in entry.keys() {
            if !MCP_SERVERS_KEYS.contains(&key.as_str()) {
                // The file's own text, quoted and escaped (it reaches a terminal).
                tracing::warn!(file = %path.display(), server = ?name, key = ?key, "ignoring a key this program does not use");
            } else if other.contains(&key.as_str()) {
                tracing::warn!(file = %path.display(), server = ?name, key = ?key, "ignoring a key of the other transport");
            }
        }
        let base = id_from_name(name);
        let mut id = base.clone();
        if id != *name {
            if sharing.get(&base).copied().unwrap_or(0) > 1 {
                // Seven hex digits: within the room `id_from_name` leaves.
                let hash = crate::util::hash::sha256_hex(name.as_bytes());
                id = format!("{base}-{}", &hash[..7]);
            }
            let n = next.entry(base.clone()).or_insert(2);
            while kept.contains(id.as_str()) || taken.contains(&id) {
                id = format!("{base}-{n}");
                *n += 1;
            }
            renamed.push((name.clone(), id.clone()));
        }
        taken.insert(id.clone());
        let disabled = match entry.get("disabled") {
            None | Some(Value::Null) => false,
            // A server meant to be off is never started for a value misread.
            Some(d) => d
                .as_bool()
                .ok_or_else(|| bad(at("disabled"), "must be true or false"))?,
        };
        let mut server = ServerConfig::new(id.clone(), transport);
        server.name = Some(name.clone());
        server.enabled = !disabled && !prompted.contains_key(name);
        let invalid = || server.validate().err();
        let kept = if let Some(inputs) = prompted.get(name) {
            // Its values as written may not even be valid (a URL that is all prompt):
            // such a server is left out rather than failing the file.
            let kept = invalid().is_none();
            tracing::warn!(file = %path.display(), server = ?name, ?inputs, kept, "this server needs input a client prompts for (${{input:…}}), which this program cannot ask for; it is left disabled, or out when its values are not valid as written (give the value through an environment variable: ${{env:NAME}})");
            kept
        } else if disabled && let Some(e) = invalid() {
            tracing::warn!(file = %path.display(), server = ?name, field = %e.field, reason = %e.reason, "a disabled server whose settings are not valid is left out");
            false
        } else {
            true
        };
        if !kept {
            // Not imported: no id taken, no rename to report.
            taken.remove(&id);
            if renamed.last().is_some_and(|(n, _)| n == name) {
                renamed.pop();
            }
            continue;
        }
        config.servers.push(server);
    }
    Ok((config, renamed))
}

/// The transport an `mcpServers` entry names, its fields checked.
fn transport_of(name: &str, entry: &Value, path: &Path) -> Result<TransportSpec, ConfigError> {
    let bad = |field: String, reason: &str| ConfigError::new(field, reason).in_file(path);
    let at = |key: &str| format!("mcpServers.{name}.{key}");
    let Some(entry) = entry.as_object() else {
        return Err(bad(format!("mcpServers.{name}"), "must be an object"));
    };
    let strings = |key: &str| -> Result<BTreeMap<String, String>, ConfigError> {
        match entry.get(key) {
            None => Ok(BTreeMap::new()),
            Some(v) => serde_json::from_value(v.clone())
                .map_err(|_| bad(at(key), "must map names to strings")),
        }
    };
    let kind = match entry.get("type") {
        None | Some(Value::Null) => "",
        Some(Value::String(kind)) => kind.as_str(),
        Some(_) => return Err(bad(at("type"), "must be a string")),
    };
    let remote = ["http", "streamable-http", "streamableHttp", "sse"].contains(&kind);
    if !(kind.is_empty() || kind == "stdio" || remote) {
        // Clients name their kinds their own ways: the keys decide, as for none.
        tracing::warn!(file = %path.display(), server = ?name, kind = ?kind, "an unknown `type`; going by `command` or `url`");
    }
    if kind == "stdio" && entry.get("command").is_none() {
        return Err(bad(at("type"), "is stdio, and there is no `command`"));
    }
    // Gemini CLI names a Streamable HTTP endpoint `httpUrl`, Windsurf `serverUrl`.
    let url_key = ["httpUrl", "url", "serverUrl"]
        .into_iter()
        .find(|k| entry.get(*k).is_some())
        .unwrap_or("url");
    if remote && entry.get(url_key).is_none() {
        return Err(bad(at("type"), "is a remote kind, and there is no `url`"));
    }
    Ok(match (entry.get("command"), entry.get(url_key)) {
        (Some(command), _) if !remote => {
            TransportSpec::Stdio(StdioSpec {
                command: command
                    .as_str()
                    .ok_or_else(|| bad(at("command"), "must be a string"))?
                    .to_string(),
                args: match entry.get("args") {
                    None => Vec::new(),
                    Some(a) => serde_json::from_value(a.clone())
                        .map_err(|_| bad(at("args"), "must be a list of strings"))?,
                },
                env: strings("env")?,
                cwd: match entry.get("cwd") {
                    // Some clients write an empty one for "no working directory".
                    None | Some(Value::Null) => None,
                    Some(Value::String(cwd)) if cwd.is_empty() => None,
                    // `~/…` under HOME, a relative one under the file's project (a
                    // service's working directory is no one's project).
                    Some(Value::String(cwd)) => {
                        let base = is_own_file(path).then(|| workspace(path));
                        match anchored(cwd, base.as_deref()) {
                            Ok(anchored) => Some(anchored.unwrap_or_else(|| cwd.into())),
                            // As written: that server alone fails to start, as it
                            // would in the client the file is for.
                            Err(why) => {
                                tracing::warn!(file = %path.display(), server = ?name, why, "cwd left as written");
                                Some(cwd.into())
                            }
                        }
                    }
                    Some(_) => return Err(bad(at("cwd"), "must be a string")),
                },
                inherit_env: false,
            })
        }
        (_, Some(url)) => {
            if kind == "sse" {
                return Err(bad(
                    at("type"),
                    "the HTTP+SSE transport (2024-11-05) is not supported; use a Streamable HTTP endpoint",
                ));
            }
            TransportSpec::Http(HttpSpec {
                url: url
                    .as_str()
                    .ok_or_else(|| bad(at(url_key), "must be a string"))?
                    .to_string(),
                headers: strings("headers")?,
                ..HttpSpec::default()
            })
        }
        _ => {
            return Err(bad(
                format!("mcpServers.{name}"),
                "needs `command` (stdio) or `url` (HTTP)",
            ));
        }
    })
}

/// Grants `agent` every tool of the servers `ids` names, without replacing a grant the
/// config already has for the agent on one of them.
pub fn grant_all(config: &mut HarnessConfig, agent: &str, ids: &[String]) {
    let grants = config.permissions.entry(agent.to_string()).or_default();
    for id in ids {
        grants.entry(id.clone()).or_insert_with(|| vec!["*".into()]);
    }
}

/// Whether a word of `line` starts with `#` outside quotes (as a shell reads it).
fn starts_comment(line: &str) -> bool {
    let (mut single, mut double, mut escaped, mut word_start) = (false, false, false, true);
    for c in line.chars() {
        let was_escaped = escaped;
        if escaped {
            escaped = false;
        } else if single {
            single = c != '\'';
        } else if c == '\\' {
            escaped = true;
        } else if double {
            double = c != '"';
        } else if c == '\'' {
            single = true;
        } else if c == '"' {
            double = true;
        } else if c == '#' && word_start {
            return true;
        }
        // Words end at what shlex splits on, unquoted and unescaped.
        word_start =
            !was_escaped && !single && !double && !escaped && matches!(c, ' ' | '\t' | '\n');
    }
    false
}

/// Adds servers named on a command line (`--stdio 'COMMAND ARGS…'`, `--http URL`) to
/// `config` as `stdio1…`, `http1…` (skipping ids the config uses), and returns their ids.
pub fn add_ad_hoc(
    config: &mut HarnessConfig,
    stdio: &[String],
    http: &[String],
) -> Result<Vec<String>, ConfigError> {
    let mut ids: Vec<String> = Vec::new();
    let fresh = |prefix: &str, config: &HarnessConfig, ids: &[String]| {
        (1..)
            .map(|n| format!("{prefix}{n}"))
            .find(|id| !config.servers.iter().any(|s| &s.id == id) && !ids.contains(id))
            .unwrap_or_default()
    };
    let mut added = Vec::new();
    for line in stdio {
        // Quoted as a shell would: a path with a space is one argument. A shell reads a
        // word that starts with `#` as a comment to the end of the line, which would
        // drop arguments without a word.
        if starts_comment(line) {
            return Err(ConfigError::new(
                "--stdio",
                "has a word that starts with `#`, which a shell reads as a comment: quote it",
            ));
        }
        let Some(words) = shlex::split(line) else {
            return Err(ConfigError::new(
                "--stdio",
                "has an unbalanced quote or a trailing backslash",
            ));
        };
        let mut words = words.into_iter();
        let Some(command) = words.next() else {
            return Err(ConfigError::new("--stdio", "needs a command"));
        };
        let id = fresh("stdio", config, &ids);
        ids.push(id.clone());
        added.push(ServerConfig::stdio(id, command, words.collect::<Vec<_>>()));
    }
    for url in http {
        let id = fresh("http", config, &ids);
        ids.push(id.clone());
        added.push(ServerConfig::http(id, url.clone()));
    }
    for s in &added {
        s.validate().map_err(|e| ConfigError {
            file: None,
            server: Some(s.id.clone()),
            field: e.field,
            reason: e.reason,
        })?;
    }
    config.servers.extend(added);
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Both the old and the new name of the restart limit: refused, whatever value the
    // new one holds. Before, `max_retries` won silently over a `max_restarts` at its
    // default.
    #[test]
    fn max_retries_beside_max_restarts_is_refused_even_at_the_default() {
        let server = "[[servers]]\nid = \"s\"\ntransport = { type = \"stdio\", command = \"x\" }\nmax_retries = 3\n";
        let path = Path::new("h.toml");
        for restart in [
            "restart = { max_restarts = 10 }\n",
            "restart = { max_restarts = 4 }\n",
        ] {
            let e = parse(&format!("{server}{restart}"), path).expect_err("both names");
            assert!(e.to_string().contains("set only one"), "{e}");
        }
        let loaded = parse(server, path).expect("the old name alone");
        assert_eq!(loaded.config.servers[0].max_restarts(), 3);
    }

    #[test]
    fn a_config_anyone_may_write_is_refused_and_errors_quote_no_line() {
        use std::os::unix::fs::PermissionsExt;
        let dir = crate::util::scratch::Scratch::new("config-mode");
        std::fs::create_dir_all(&*dir).expect("mkdir");
        let path = dir.join("h.toml");
        std::fs::write(&path, "round_cap = 3\n").expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        assert_eq!(load(&path).expect("loads").config.round_cap, 3);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        // Read at start (with a warning), never reloaded.
        assert_eq!(load(&path).expect("read at start").config.round_cap, 3);
        let e = read_regular(&path).expect_err("anyone may write it");
        assert!(e.to_string().contains("writable by anyone"), "{e}");
        // Nor one anyone may put another file in the place of.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        std::fs::set_permissions(&*dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        assert_eq!(load(&path).expect("read at start").config.round_cap, 3);
        let e = read_regular(&path).expect_err("anyone may replace it");
        assert!(e.to_string().contains("not sticky"), "{e}");
        std::fs::set_permissions(&*dir, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        assert!(
            read_regular(&path).is_ok(),
            "sticky: only its owner may replace it"
        );
        // Nor one under a directory anyone may replace.
        let below = dir.join("below");
        std::fs::create_dir_all(&below).expect("mkdir");
        let deeper = below.join("h.toml");
        std::fs::write(&deeper, "round_cap = 3\n").expect("write");
        std::fs::set_permissions(&*dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let e = read_regular(&deeper).expect_err("a directory above may be replaced");
        assert!(e.to_string().contains("not sticky"), "{e}");
        std::fs::set_permissions(&*dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        assert!(read_regular(&deeper).is_ok(), "{}", below.display());
        // A syntax error says where, not what the line holds (a key may be on it).
        let e = parse(
            "[servers.x]\nheaders = { Authorization = \"Bearer sekrit",
            Path::new("h.toml"),
        )
        .expect_err("unterminated");
        assert!(!e.to_string().contains("sekrit"), "{e}");
        assert!(e.to_string().contains("line 2"), "{e}");
        // nan and inf are no numbers a setting can take: refused, not read as unset.
        for text in ["round_cap = nan", "[audit]\npath = inf"] {
            let e = parse(text, Path::new("h.toml")).expect_err(text);
            assert!(e.to_string().contains("not a finite number"), "{e}");
        }
    }

    #[test]
    fn relative_paths_are_the_config_files_and_home_is_expanded() {
        let dir = crate::util::scratch::Scratch::new("config-paths");
        std::fs::create_dir_all(&*dir).expect("mkdir");
        let path = dir.join("h.toml");
        let text = "[audit]\npath = \"logs/audit.jsonl\"\n[cache]\ndir = \"~/cache\"\n\
            [[servers]]\nid = \"s\"\ntransport = { type = \"stdio\", command = \"srv\", cwd = \"/abs\" }\n\
            [[servers]]\nid = \"h\"\ntransport = { type = \"http\", url = \"https://h.example/mcp\", ca_file = \"ca.pem\" }\n\
            [gateway]\nkeys_file = \"keys\"\njwt = { issuer = \"https://i\", audience = \"a\", jwks_file = \"../jwks.json\" }\n";
        std::fs::write(&path, text).expect("write");
        let loaded = load(&path).expect("loads");
        let c = &loaded.config;
        assert_eq!(
            c.audit.path.as_deref(),
            Some(&*dir.join("logs/audit.jsonl"))
        );
        if let Some(home) = std::env::var_os("HOME").filter(|h| Path::new(h).is_absolute()) {
            assert_eq!(c.cache.dir, Some(Path::new(&home).join("cache")));
        }
        let TransportSpec::Stdio(stdio) = &c.servers[0].transport else {
            panic!("stdio");
        };
        assert_eq!(
            stdio.cwd.as_deref(),
            Some(Path::new("/abs")),
            "absolute: as written"
        );
        let TransportSpec::Http(http) = &c.servers[1].transport else {
            panic!("http");
        };
        assert_eq!(http.ca_file.as_deref(), Some(&*dir.join("ca.pem")));
        let gateway = loaded.gateway.expect("gateway table");
        assert_eq!(
            gateway["keys_file"],
            dir.join("keys").to_string_lossy().as_ref()
        );
        assert_eq!(
            gateway["jwt"]["jwks_file"],
            dir.join("../jwks.json").to_string_lossy().as_ref()
        );
        // Text that is no file of its own (a FIFO, `<(…)`, `/dev/stdin` even when it is
        // a regular file): the working directory's.
        let loaded =
            parse(r#"{"audit": {"path": "a.jsonl"}}"#, Path::new("/dev/fd/63")).expect("parses");
        assert_eq!(
            loaded.config.audit.path.as_deref(),
            Some(Path::new("a.jsonl"))
        );
    }

    #[test]
    fn mcp_servers_names_become_valid_ids_and_the_mapping_is_reported() {
        let text = r#"{"mcpServers": {"my files": {"command": "srv"}, "bank_": {"url": "http://127.0.0.1:1/mcp"}}}"#;
        let loaded = parse(text, Path::new("mcp.json")).expect("valid");
        let ids: Vec<&str> = loaded
            .config
            .servers
            .iter()
            .map(|s| s.id.as_str())
            .collect();
        assert_eq!(ids, ["bank", "my_files"]);
        assert_eq!(loaded.renamed.len(), 2);
    }

    // An imported relative `cwd` is the file's project's (the folder that holds it, or
    // the one above `.cursor/`), and `~/` is HOME: not the harness's own working
    // directory, which under a service manager is `/`.
    #[test]
    fn an_imported_cwd_is_anchored_to_the_files_project() {
        let dir = crate::util::scratch::Scratch::new("import-cwd");
        let cursor = dir.join(".cursor");
        std::fs::create_dir_all(&cursor).expect("mkdir");
        let text = r#"{"mcpServers": {"a": {"command": "x", "cwd": "srv"},
            "b": {"command": "x", "cwd": "/abs"}, "c": {"command": "x", "cwd": "~/h"}}}"#;
        for (file, project) in [
            (dir.join(".mcp.json"), dir.to_path_buf()),
            (cursor.join("mcp.json"), dir.to_path_buf()),
        ] {
            std::fs::write(&file, text).expect("write");
            let loaded = load(&file).expect("loads");
            let cwd = |id: &str| {
                loaded
                    .config
                    .servers
                    .iter()
                    .find(|s| s.id == id)
                    .and_then(|s| match &s.transport {
                        TransportSpec::Stdio(st) => st.cwd.clone(),
                        TransportSpec::Http(_) => None,
                    })
            };
            assert_eq!(cwd("a"), Some(project.join("srv")), "{}", file.display());
            assert_eq!(cwd("b"), Some(PathBuf::from("/abs")));
            if let Some(home) = std::env::var_os("HOME").filter(|h| Path::new(h).is_absolute()) {
                assert_eq!(cwd("c"), Some(PathBuf::from(home).join("h")));
            }
        }
    }

    // A `type` the other keys contradict is refused, not read as the other transport;
    // one this program does not know goes by the keys.
    #[test]
    fn a_type_the_keys_contradict_is_refused() {
        for (entry, field) in [
            (
                r#"{"type": "stdio", "url": "http://x/"}"#,
                "mcpServers.s.type",
            ),
            (r#"{"type": "http", "command": "x"}"#, "mcpServers.s.type"),
            (
                r#"{"type": "streamable-http", "command": "x"}"#,
                "mcpServers.s.type",
            ),
            (r#"{"type": 7, "command": "x"}"#, "mcpServers.s.type"),
        ] {
            let text = format!(r#"{{"mcpServers": {{"s": {entry}}}}}"#);
            let e = parse(&text, Path::new("mcp.json")).expect_err(entry);
            assert_eq!(e.field, field, "{entry}: {e}");
        }
        for (entry, http) in [
            (r#"{"type": "local", "command": "x"}"#, false),
            (r#"{"type": "remote", "url": "http://x/"}"#, true),
            (
                r#"{"type": "http", "url": "http://x/", "command": "x"}"#,
                true,
            ),
            (r#"{"url": "http://x/", "env": {"A": "b"}}"#, true),
        ] {
            let text = format!(r#"{{"mcpServers": {{"s": {entry}}}}}"#);
            let loaded = parse(&text, Path::new("mcp.json")).expect(entry);
            let is_http = matches!(loaded.config.servers[0].transport, TransportSpec::Http(_));
            assert_eq!(is_http, http, "{entry}");
        }
        // Gemini CLI's `httpUrl` (its `url` is its HTTP+SSE one) and Windsurf's
        // `serverUrl` name a Streamable HTTP endpoint.
        for entry in [
            r#"{"httpUrl": "http://x/mcp"}"#,
            r#"{"serverUrl": "http://x/mcp"}"#,
            r#"{"httpUrl": "http://x/mcp", "url": "http://x/sse"}"#,
        ] {
            let text = format!(r#"{{"mcpServers": {{"s": {entry}}}}}"#);
            let loaded = parse(&text, Path::new("mcp.json")).expect(entry);
            let TransportSpec::Http(h) = &loaded.config.servers[0].transport else {
                panic!("{entry}: http")
            };
            assert_eq!(h.url, "http://x/mcp", "{entry}");
        }
        let e = parse(
            r#"{"mcpServers": {"s": {"httpUrl": 7}}}"#,
            Path::new("mcp.json"),
        )
        .expect_err("not a string");
        assert_eq!(e.field, "mcpServers.s.httpUrl");
    }

    #[test]
    fn a_name_that_is_an_id_keeps_it_and_odd_values_of_known_keys_are_refused() {
        // Sorted, "a b" comes first; it must not take the id the server "a_b" has.
        let text = r#"{"mcpServers": {"a b": {"command": "x"}, "a_b": {"command": "y"}, "a-b?": {"command": "z"}, "a b!": {"command": "w"}}}"#;
        let loaded = parse(text, Path::new("mcp.json")).expect("valid");
        let id_of = |name: &str| {
            loaded
                .config
                .servers
                .iter()
                .find(|s| s.name.as_deref() == Some(name))
                .map(|s| s.id.clone())
                .expect("imported")
        };
        assert_eq!(id_of("a_b"), "a_b");
        // Of its own name's hash, whatever other names map to `a_b`.
        let hashed = |name: &str| {
            let hash = crate::util::hash::sha256_hex(name.as_bytes());
            format!("a_b-{}", &hash[..7])
        };
        assert_eq!(id_of("a b"), hashed("a b"));
        assert_eq!(id_of("a b!"), hashed("a b!"));
        // Without the server `a_b`, neither takes its id (the one that sorts first did).
        let fewer = r#"{"mcpServers": {"a b!": {"command": "w"}, "a b": {"command": "x"}}}"#;
        let fewer = parse(fewer, Path::new("mcp.json")).expect("valid");
        let ids: Vec<&str> = fewer.config.servers.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, [hashed("a b"), hashed("a b!")]);
        // The one name that maps to an id takes it.
        let alone = parse(
            r#"{"mcpServers": {"a b": {"command": "x"}}}"#,
            Path::new("m.json"),
        );
        assert_eq!(alone.expect("valid").config.servers[0].id, "a_b");
        // Many names that map to one id load at once, not in quadratic time.
        let many: serde_json::Map<String, Value> = (0..5000u32)
            .filter_map(|i| char::from_u32(0x4e00 + i))
            .map(|c| (format!("a{c}"), serde_json::json!({"command": "x"})))
            .collect();
        let text = serde_json::json!({"mcpServers": many}).to_string();
        let loaded = parse(&text, Path::new("mcp.json")).expect("valid");
        assert_eq!(loaded.config.servers.len(), 5000);
        for (field, entry) in [
            (
                "mcpServers.s.disabled",
                r#"{"command": "x", "disabled": "true"}"#,
            ),
            ("mcpServers.s.cwd", r#"{"command": "x", "cwd": 5}"#),
        ] {
            let text = format!(r#"{{"mcpServers": {{"s": {entry}}}}}"#);
            let e = parse(&text, Path::new("mcp.json")).expect_err(field);
            assert_eq!(e.field, field, "{e}");
        }
    }

    #[test]
    fn ad_hoc_grants_never_replace_or_widen_a_files_grants() {
        let text = r#"
            [[servers]]
            id = "stdio1"
            transport = { type = "stdio", command = "srv" }
            [permissions.local]
            stdio1 = ["echo"]
        "#;
        let mut loaded = parse(text, Path::new("h.toml")).expect("valid");
        let ids = add_ad_hoc(&mut loaded.config, &["other --flag".into()], &[]).expect("ok");
        assert_eq!(ids, ["stdio2"], "skips the id the file uses");
        grant_all(&mut loaded.config, "local", &ids);
        let grants = &loaded.config.permissions["local"];
        assert_eq!(
            grants["stdio1"],
            vec!["echo".to_string()],
            "file grant kept as written"
        );
        assert_eq!(grants["stdio2"], vec!["*".to_string()]);
    }

    #[test]
    fn an_ad_hoc_command_line_is_split_as_a_shell_would() {
        let mut config = HarnessConfig::default();
        let line = r#"npx -y @x/fs "/home/me/My Docs" it\'s"#;
        add_ad_hoc(&mut config, &[line.into()], &[]).expect("ok");
        let TransportSpec::Stdio(s) = &config.servers[0].transport else {
            panic!("stdio")
        };
        assert_eq!(s.command, "npx");
        assert_eq!(s.args, ["-y", "@x/fs", "/home/me/My Docs", "it's"]);
        // Quoted, or inside a word, `#` is text.
        let mut config = HarnessConfig::default();
        let line = r##"srv '#a' "#b" \#c d#e f\ #g"##;
        add_ad_hoc(&mut config, &[line.into()], &[]).expect("ok");
        let TransportSpec::Stdio(s) = &config.servers[0].transport else {
            panic!("stdio")
        };
        assert_eq!(s.args, ["#a", "#b", "#c", "d#e", "f #g"]);
        for bad in [
            r#"srv "open"#,
            "srv \\",
            "  ",
            "slack --channel #general",
            "#srv",
        ] {
            let e = add_ad_hoc(&mut config, &[bad.into()], &[]).expect_err(bad);
            assert_eq!(e.field, "--stdio", "{bad}");
        }
    }

    #[test]
    fn a_file_with_mcp_servers_and_harness_settings_is_refused_not_imported() {
        for text in [
            r#"{"mcpServers": {"s": {"command": "cat"}}, "permissions": {"a": {"s": ["echo"]}}}"#,
            r#"{"servers": {"s": {"command": "cat"}}, "audit": {"path": "/tmp/a.jsonl"}}"#,
            r#"{"mcpServers": {"s": {"command": "cat"}}, "gateway": {"prefix": "never"}}"#,
        ] {
            let e = parse(text, Path::new("h.json")).expect_err("mixed");
            assert!(e.reason.contains("imported"), "{e}");
            assert!(
                ["permissions", "audit", "gateway"].contains(&e.field.as_str()),
                "{e}"
            );
        }
        // Two lists of servers: one would be dropped without a word.
        for text in [
            r#"{"mcpServers": {"s": {"command": "cat"}}, "servers": {"t": {"command": "cat"}}}"#,
            r#"{"mcpServers": {"s": {"command": "cat"}}, "servers": [{"id": "t"}]}"#,
        ] {
            let e = parse(text, Path::new("h.json")).expect_err("two lists");
            assert_eq!(e.field, "servers", "{e}");
        }
        // A harness setting misspelled would be ignored, and every server granted.
        for (key, text) in [
            (
                "permission",
                r#"{"mcpServers": {"s": {"command": "cat"}}, "permission": {}}"#,
            ),
            (
                "Permissions",
                r#"{"mcpServers": {"s": {"command": "cat"}}, "Permissions": {}}"#,
            ),
            (
                "audt",
                r#"{"mcpServers": {"s": {"command": "cat"}}, "audt": {}}"#,
            ),
            (
                "call-timeout",
                r#"{"mcpServers": {"s": {"command": "cat"}}, "call-timeout": "1s"}"#,
            ),
            (
                "permissons",
                r#"{"mcpServers": {"s": {"command": "cat"}}, "permissons": {"a": {"s": ["x"]}}}"#,
            ),
            (
                "permsisions",
                r#"{"mcpServers": {"s": {"command": "cat"}}, "permsisions": {}}"#,
            ),
        ] {
            let e = parse(text, Path::new("m.json")).expect_err(key);
            assert_eq!(e.field, key, "{e}");
            assert!(e.reason.contains("misspelled"), "{e}");
        }
        // Another client's own settings beside its servers are no harness's: imported.
        for text in [
            r#"{"mcpServers": {"s": {"command": "cat"}}, "globalShortcut": "x", "inputs": []}"#,
            // Gemini CLI keeps its telemetry settings beside its servers.
            r#"{"mcpServers": {"s": {"command": "cat"}}, "telemetry": {"enabled": true}}"#,
            // One edit from `agents`, but another client's own.
            r#"{"mcpServers": {"s": {"command": "cat"}}, "agent": "x"}"#,
        ] {
            let loaded = parse(text, Path::new("m.json")).expect("another client's file");
            assert!(loaded.imported);
        }
    }

    #[test]
    fn each_harness_key_is_a_setting_of_the_harness() {
        let defaults = serde_json::to_value(HarnessConfig::default()).expect("serializes");
        for key in HARNESS_KEYS {
            assert!(key == "gateway" || defaults.get(key).is_some(), "{key}");
        }
        // A setting added later is a harness key unless it says why not here.
        let shared_with_other_clients = ["servers", "cache", "limits"];
        for key in defaults.as_object().expect("a table").keys() {
            assert!(
                HARNESS_KEYS.contains(&key.as_str())
                    || shared_with_other_clients.contains(&key.as_str()),
                "{key}: a harness key, or one another client may use too?"
            );
        }
    }

    #[test]
    fn other_clients_forms_of_variables_are_read_and_a_prompted_server_is_left_off() {
        let path = std::env::var("PATH").expect("PATH is set in tests");
        let home = std::env::var("HOME").unwrap_or_default();
        let json = r#"{"inputs": [{"id": "key", "type": "promptString", "password": true}],
            "servers": {
                "forms": {"command": "${env:PATH}", "args": ["${MCP_HARNESS_SURELY_UNSET:-fallback}", "${PATH:-x}", "${env:PATH:-x}", "${workspaceFolder}${/}src"]},
                "asks": {"url": "https://example.test/mcp", "headers": {"Authorization": "Bearer ${input:key}"}},
                "asks where": {"url": "${input:server_url}"},
                "plain": {"command": "cat", "args": ["$HOME", "${input:never"]}
            }}"#;
        let loaded = parse(json, Path::new("/work/proj/.vscode/mcp.json")).expect("imported");
        let server = |id: &str| {
            loaded
                .config
                .servers
                .iter()
                .find(|s| s.id == id)
                .expect("server")
        };
        let TransportSpec::Stdio(forms) = &server("forms").transport else {
            panic!("stdio")
        };
        assert_eq!(forms.command, path);
        let want = vec![
            "fallback".to_string(),
            path.clone(),
            path.clone(),
            "/work/proj/src".into(),
        ];
        assert_eq!(forms.args, want);
        // `${userHome}` is HOME, when that is an absolute path.
        if home.starts_with('/') {
            let loaded = parse(
                r#"{"mcpServers": {"h": {"command": "${userHome}/bin/x"}}}"#,
                Path::new("m.json"),
            )
            .expect("imported");
            let TransportSpec::Stdio(h) = &loaded.config.servers[0].transport else {
                panic!("stdio")
            };
            assert_eq!(h.command, format!("{home}/bin/x"));
        }
        assert!(server("forms").enabled);
        // Nothing here can prompt a person: that server is imported, off.
        assert!(!server("asks").enabled);
        // One whose URL is all prompt is not even valid as written: left out.
        assert!(loaded.config.servers.iter().all(|s| s.id != "asks_where"));
        assert!(loaded.renamed.is_empty(), "{:?}", loaded.renamed);
        let TransportSpec::Stdio(plain) = &server("plain").transport else {
            panic!("stdio")
        };
        assert_eq!(plain.args, ["$HOME", "${input:never"], "not variables");
        assert!(server("plain").enabled);
        assert_eq!(
            super::workspace(Path::new("/p/.cursor/mcp.json")),
            Path::new("/p")
        );
        assert_eq!(super::workspace(Path::new("/p/.mcp.json")), Path::new("/p"));

        // Unset, in either form, is an error naming it; a harness config cannot prompt.
        let e = parse(
            r#"{"mcpServers": {"s": {"command": "${env:MCP_HARNESS_SURELY_UNSET}"}}}"#,
            Path::new("m.json"),
        )
        .expect_err("unset");
        assert_eq!(e.field, "${env:MCP_HARNESS_SURELY_UNSET}");
        assert_eq!(e.server.as_deref(), Some("s"), "the server that needs it");
        assert!(
            e.reason.contains("MCP_HARNESS_SURELY_UNSET is not set"),
            "{e}"
        );
        // A disabled server is not needed to run the others: one whose variable is not
        // set, one of a transport not supported, or one not valid is left out, not the
        // whole file refused; one that is valid is imported, off.
        let loaded = parse(
            r#"{"mcpServers": {
                "on": {"command": "cat"},
                "unset": {"command": "${MCP_HARNESS_SURELY_UNSET}", "disabled": true},
                "old": {"type": "sse", "url": "https://x.example/sse", "disabled": true},
                "bad": {"url": "https://x.example/mcp", "headers": {"X-Key": "a\nb"}, "disabled": true},
                "typed": {"command": 7, "disabled": true},
                "off": {"command": "cat", "disabled": true}
            }}"#,
            Path::new("m.json"),
        )
        .expect("imported");
        let ids: Vec<(&str, bool)> = loaded
            .config
            .servers
            .iter()
            .map(|s| (s.id.as_str(), s.enabled))
            .collect();
        assert_eq!(ids, [("off", false), ("on", true)]);
        // Enabled, each is still an error.
        for entry in [
            r#"{"command": "${MCP_HARNESS_SURELY_UNSET}", "disabled": false}"#,
            r#"{"type": "sse", "url": "https://x.example/sse"}"#,
            r#"{"url": "https://x.example/mcp", "headers": {"X-Key": "a\nb"}}"#,
        ] {
            let file = format!(r#"{{"mcpServers": {{"s": {entry}}}}}"#);
            parse(&file, Path::new("m.json")).expect_err(entry);
        }
        let e = parse(
            "[[servers]]\nid = \"x\"\ntransport = { type = \"stdio\", command = \"${input:cmd}\" }\n",
            Path::new("h.toml"),
        )
        .expect_err("a prompt");
        assert_eq!(e.field, "${input:cmd}");
    }

    // VS Code's mcp.json is JSONC, and an editor may save a byte order mark: read as
    // their clients read them; a syntax error still names its line.
    #[test]
    fn comments_trailing_commas_and_a_byte_order_mark_are_read_as_other_clients_read_them() {
        let text = "\u{feff}{\n  // the servers\n  \"servers\": {\n    \"a\": {\"command\": \"cat\", \"args\": [\"# not a comment\", \"// nor this\",],}, /* off */\n  },\n}\n";
        let loaded = parse(text, Path::new("/p/.vscode/mcp.json")).expect("imported");
        let TransportSpec::Stdio(a) = &loaded.config.servers[0].transport else {
            panic!("stdio")
        };
        assert_eq!(a.args, ["# not a comment", "// nor this"]);
        let e = parse(
            "{\n  // fine\n  \"mcpServers\": {\n  \"a\": nope\n}}",
            Path::new("m.json"),
        )
        .expect_err("syntax");
        assert!(e.reason.contains("line 4"), "{e}");
        // After a comment of several lines too; and a stray `/` is placed.
        let e = parse(
            "{\n/* one\ntwo\nthree */\n\"mcpServers\": nope}",
            Path::new("m.json"),
        )
        .expect_err("syntax");
        assert!(e.reason.contains("line 5"), "{e}");
        let e =
            parse("// mine\n{\n  / \"mcpServers\": {}}", Path::new("m.json")).expect_err("stray");
        assert!(e.reason.contains("line 3 column 3"), "{e}");
    }

    #[test]
    fn values_from_the_environment_are_put_back_as_written() {
        let mut s = Substituted::default();
        s.note("abc", "${SHORT}".into());
        s.note("a-long\"secret", "${env:LONG}".into());
        s.note("", "${EMPTY}".into());
        s.note(" toke\n", "${PADDED}".into());
        let text = r#"invalid type: string "abc", expected u32; unknown variant `abc`; cabc; "a-long\"secret"; a-long"secret; "Bearer a-long\"secret"; 'toke'"#;
        assert_eq!(
            s.redact(text),
            r#"invalid type: string "${SHORT}", expected u32; unknown variant `${SHORT}`; cabc; "${env:LONG}"; ${env:LONG}; "Bearer ${env:LONG}"; '${PADDED}'"#
        );
    }

    #[test]
    fn a_toml_file_with_mcp_servers_or_a_servers_table_is_refused_not_imported() {
        for (text, key) in [
            (
                "agent = \"planner\"\n[mcpServers.files]\ncommand = \"srv\"\n",
                "mcpServers",
            ),
            ("[servers.files]\ncommand = \"srv\"\n", "servers"),
        ] {
            let e = parse(text, Path::new("h.toml")).expect_err(text);
            assert_eq!(e.field, key, "{e}");
            assert!(e.reason.contains("[[servers]]"), "{e}");
        }
        // In JSON, another client's file: imported.
        let json = r#"{"mcpServers": {"files": {"command": "srv"}}}"#;
        assert!(parse(json, Path::new("mcp.json")).is_ok_and(|l| l.imported));
    }

    #[test]
    fn an_empty_cache_dir_is_an_error_not_the_working_directory() {
        let e = parse("[cache]\ndir = \"\"\n", Path::new("h.toml")).expect_err("empty");
        assert!(e.field.contains("dir"), "{e}");
        assert!(e.reason.contains("empty"), "{e}");
    }

    #[test]
    fn a_key_written_twice_is_an_error_in_a_harness_config_and_the_last_in_mcp_servers() {
        let e = parse(
            r#"{"call_timeout": "5s", "servers": [], "call_timeout": "6s"}"#,
            Path::new("h.json"),
        )
        .expect_err("twice");
        assert_eq!(e.field, "call_timeout", "{e}");
        assert!(e.reason.contains("twice"), "{e}");
        let e = parse(
            "call_timeout = \"5s\"\ncall_timeout = \"6s\"\n",
            Path::new("h.toml"),
        )
        .expect_err("twice in TOML");
        assert!(e.reason.contains("call_timeout"), "{e}");
        let loaded = parse(
            r#"{"mcpServers": {"s": {"command": "first"}, "s": {"command": "second"}}}"#,
            Path::new("m.json"),
        )
        .expect("the last wins");
        let [server] = &loaded.config.servers[..] else {
            panic!("one server: {:?}", loaded.config.servers);
        };
        assert!(
            matches!(&server.transport, TransportSpec::Stdio(s) if s.command == "second"),
            "{server:?}"
        );
    }

    #[test]
    fn a_file_without_end_is_refused() {
        let e = load(Path::new("/dev/zero")).expect_err("endless");
        assert!(e.reason.contains("larger than"), "{e}");
    }

    #[test]
    fn an_agent_that_is_not_a_string_is_an_error() {
        for agent in ["5", "[\"planner\"]"] {
            let e = parse(&format!("agent = {agent}\n"), Path::new("h.toml")).expect_err(agent);
            assert_eq!(e.field, "agent", "{e}");
        }
        let loaded = parse("agent = \"planner\"\n", Path::new("h.toml")).expect("a string");
        assert_eq!(loaded.agent.as_deref(), Some("planner"));
    }

    #[test]
    fn errors_name_the_file_and_the_key() {
        let e = parse(
            "[[servers]]\nid = \"x\"\ntimout = \"5s\"\n",
            Path::new("h.toml"),
        )
        .expect_err("typo");
        assert!(e.to_string().contains("h.toml"), "{e}");
        assert_eq!(e.field, "servers[0].timout", "{e}");
        assert!(e.reason.contains("timout"), "{e}");
        let e = parse(
            "call_timeout = true\n[[servers]]\nid = \"x\"\ntransport = { type = \"stdio\", command = \"cat\" }\n",
            Path::new("h.toml"),
        )
        .expect_err("a duration of the wrong type");
        assert_eq!(e.field, "call_timeout", "{e}");
        // Inside `[[servers]]`, the server is named too, as a check's error names it.
        let e = parse(
            "[[servers]]\nid = \"a\"\ntransport = { type = \"stdio\", command = \"cat\" }\n[[servers]]\nid = \"b\"\ntimeout = true\ntransport = { type = \"stdio\", command = \"cat\" }\n",
            Path::new("h.toml"),
        )
        .expect_err("a duration of the wrong type");
        assert_eq!(e.field, "servers[1].timeout", "{e}");
        assert_eq!(e.server.as_deref(), Some("b"), "{e}");
        let e = parse(
            r#"{"mcpServers": {"s": {"url": "http://x/", "type": "sse"}}}"#,
            Path::new("m.json"),
        )
        .expect_err("sse");
        assert_eq!(e.field, "mcpServers.s.type");
    }
}
