//! The audit trail: one `started` record when a call is admitted or denied, one
//! `finished` record with its outcome, as JSON Lines in a file.
//!
//! Calls append records to an [`AuditSink`]; the [`AuditActor`] drains it and writes
//! in batches off the async threads (every [`AuditConfig::batch`] records, and on a
//! timer), and always before it answers a flush, which `shutdown()` sends. Records
//! accepted into the sink are never lost: a batch that fails to write stays buffered
//! and is written once the file can be written, never twice and never torn
//! ([`file`]); the sink writes what is left when the last holder drops it, so a harness
//! dropped without `shutdown()` keeps its records too. While the file cannot be
//! written, new calls fail closed ([`AuditFailure::FailClosed`], the default) or keep
//! serving with the unwritten records counted ([`AuditFailure::KeepServing`]).
//!
//! Every record is also a `tracing` event (target `mcp_harness::audit`). Arguments are
//! recorded per [`Redaction`]; auth contexts as an HMAC-SHA256 under a key kept beside
//! the audit file, never in clear and never as a plain digest anyone could test a guess
//! against.

mod actor;
mod file;
mod msg;
mod record;
mod sink;

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::util::duration;

pub(crate) use actor::{AuditActor, AuditRef};
pub use file::{OwnStream, own_output};
pub(crate) use record::{
    Finished, Hop, MAX_RECORDED_TEXT, Question, Redacted, Round, Started, cut,
};
pub(crate) use sink::AuditSink;
pub use sink::{AuditHealth, AuditUnavailable};

/// How much of a call's arguments the audit trail keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Redaction {
    /// No arguments.
    None,
    /// Argument names only (the default).
    #[default]
    Keys,
    /// Arguments in full, except values under keys that look secret.
    Full,
}

/// What the harness does while the audit file cannot be written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditFailure {
    /// New calls fail with a typed error until records can be written again (records
    /// already accepted are kept and written then).
    #[default]
    FailClosed,
    /// Calls go on; records past the buffer's bound are counted as unwritten.
    KeepServing,
}

/// Parts of argument names whose values are always redacted, whatever
/// [`AuditConfig::redact_keys`] adds.
pub const BUILTIN_REDACT_KEYS: [&str; 16] = [
    "token",
    "secret",
    "password",
    "key",
    "authorization",
    "cookie",
    "passwd",
    "credential",
    "bearer",
    "session",
    "jwt",
    // `auth`, `X-Auth`, `basicAuth` (and `author`, hidden too: better one name too many).
    "auth",
    "passphrase",
    "pwd",
    "private",
    "signature",
];

/// Audit settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// The JSON Lines file; no file (tracing events only) when `None`.
    pub path: Option<PathBuf>,
    /// How arguments are recorded.
    pub redaction: Redaction,
    /// Parts of argument names whose values are always replaced by `"[redacted]"`, at
    /// any depth, besides [`BUILTIN_REDACT_KEYS`] (which always apply: a list written
    /// for one more name must not unhide every token). Matching ignores case, `_`, `-`
    /// and camelCase: `apiKey`, `API_KEY` and `x-api-key` all contain `key`.
    pub redact_keys: Vec<String>,
    /// Records per write.
    pub batch: usize,
    /// Longest a record waits in the buffer.
    #[serde(with = "duration")]
    pub flush_every: Duration,
    /// What to do while the file cannot be written.
    pub on_failure: AuditFailure,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            path: None,
            redaction: Redaction::Keys,
            redact_keys: Vec::new(),
            batch: 256,
            flush_every: Duration::from_millis(200),
            on_failure: AuditFailure::FailClosed,
        }
    }
}

impl AuditConfig {
    /// Checks the settings: a `flush_every` of zero would never flush on time (and
    /// panics the timer), a nanosecond one floods the writer; a `batch` of zero never
    /// writes.
    pub fn validate(&self) -> Result<(), crate::util::invalid::Invalid> {
        use crate::util::invalid::Invalid;
        if !(Duration::from_millis(1)..=Duration::from_secs(3600)).contains(&self.flush_every) {
            return Err(Invalid::new("flush_every", "must be from 1 ms to 1 hour"));
        }
        if !(1..=1 << 16).contains(&self.batch) {
            return Err(Invalid::new("batch", "must be from 1 to 65536 records"));
        }
        // An empty path (`${AUDIT_PATH:-}` unset) would put the key in the working
        // directory and fail every write with an error that names no setting.
        if self
            .path
            .as_deref()
            .is_some_and(|p| p.as_os_str().is_empty())
        {
            return Err(Invalid::new("path", "must not be empty"));
        }
        // Matched folded (no `_` or `-`): one that folds to nothing is in every name,
        // and would hide every value with no word of why.
        if let Some(i) = self
            .redact_keys
            .iter()
            .position(|k| k.chars().all(|c| c == '_' || c == '-'))
        {
            return Err(Invalid::new(
                format!("redact_keys[{i}]"),
                "must hold a letter or digit (`_` and `-` are ignored in matching)",
            ));
        }
        Ok(())
    }
}

/// A key name folded for matching: lower case, no `_` or `-`.
fn fold(name: &str) -> String {
    name.chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect()
}

impl AuditConfig {
    /// The arguments as this config records them.
    pub fn redact(&self, args: &Value) -> Value {
        match self.redaction {
            Redaction::None => Value::Null,
            Redaction::Keys => match args {
                Value::Object(map) => {
                    Value::Array(map.keys().map(|k| Value::String(k.clone())).collect())
                }
                _ => Value::Null,
            },
            Redaction::Full => scrub(self, args),
        }
    }
}

fn scrub(config: &AuditConfig, v: &Value) -> Value {
    match v {
        Value::Object(map) => {
            let mut out = Map::new();
            // `{"name": "Authorization", "value": "Bearer …"}`: a header or variable
            // given as a pair hides its value as a key of that name would.
            // (`Name`/`Value`, `key`/`value` in any spelling, as AWS and others write.)
            let named_secret = map.iter().any(|(k, v)| {
                matches!(fold(k).as_str(), "name" | "key")
                    && v.as_str().is_some_and(|n| record::is_secret(config, n))
            });
            for (k, v) in map {
                let hidden = record::is_secret(config, k) || (named_secret && fold(k) == "value");
                out.insert(
                    k.clone(),
                    if hidden {
                        json!("[redacted]")
                    } else {
                        scrub(config, v)
                    },
                );
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(|i| scrub(config, i)).collect()),
        Value::String(text) => Value::String(
            record::cut(
                &without_url_secrets(config, text),
                record::MAX_RECORDED_TEXT,
            )
            .into_owned(),
        ),
        other => other.clone(),
    }
}

/// `text` with the credentials of any URL in it (`https://user:pass@host`) hidden: a
/// value under no secret name (or a resource's URI) may still carry them. The part
/// taken for the authority ends only at a `/` or a space, so that a password written
/// with a `#` or `?` in it is hidden too; when such a character comes before the `@`
/// (a query's `?email=a@b` as well), everything up to that end is hidden, not only the
/// part before the `@`, which would show a host that is none.
pub(crate) fn without_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let authority = tail
            .find(|c: char| c == '/' || c.is_whitespace())
            .unwrap_or(tail.len());
        match tail[..authority].rfind('@') {
            Some(user) if tail[..user].contains(['?', '#']) => {
                out.push_str("[redacted]");
                rest = &tail[authority..];
            }
            Some(user) => {
                out.push_str("[redacted]");
                rest = &tail[user..];
            }
            None => rest = tail,
        }
    }
    out.push_str(rest);
    out
}

/// Query parameters that carry a credential under a name no part of
/// [`BUILTIN_REDACT_KEYS`] is in: Azure's shared access signature (`sig`).
const URL_SECRET_NAMES: &[&str] = &["sig"];

/// `text` with the credentials of any URL in it hidden: its userinfo
/// ([`without_userinfo`]) and the values of the parameters whose names are secret, as
/// an argument's would be, in its query (`?access_token=…`, `X-Amz-Signature=…`, split
/// at `&` or `;`) and in its fragment, where OAuth's implicit flow puts a token
/// (`#access_token=…`, or `#/route?token=…`).
pub(crate) fn without_url_secrets(config: &AuditConfig, text: &str) -> String {
    let text = without_userinfo(text);
    if !text.contains(['?', '#']) {
        return text;
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>'))
            .unwrap_or(tail.len());
        // Prose around a URL: a comma or a bracket after it is not its value's.
        let end = tail[..end]
            .trim_end_matches(['.', ',', ';', ':', '!', ')', ']', '}'])
            .len();
        let (url, after) = tail.split_at(end);
        let (url, fragment) = url.split_at(url.find('#').unwrap_or(url.len()));
        match url.split_once('?') {
            Some((before, query)) => {
                out.push_str(before);
                out.push('?');
                push_params(config, query, &mut out);
            }
            None => out.push_str(url),
        }
        if let Some(fragment) = fragment.strip_prefix('#') {
            out.push('#');
            match fragment.split_once('?') {
                Some((route, query)) => {
                    out.push_str(route);
                    out.push('?');
                    push_params(config, query, &mut out);
                }
                None => push_params(config, fragment, &mut out),
            }
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// `params` (`name=value`, split at `&` or `;`) onto `out`, the values of those whose
/// names are secret as `[redacted]`.
fn push_params(config: &AuditConfig, params: &str, out: &mut String) {
    let mut rest = params;
    loop {
        let end = rest.find(['&', ';']).unwrap_or(rest.len());
        let (param, after) = rest.split_at(end);
        let name = param.split_once('=').map(|(name, _)| name);
        let secret = name.is_some_and(|name| {
            url::form_urlencoded::parse(name.as_bytes())
                .next()
                .is_some_and(|(name, _)| {
                    URL_SECRET_NAMES
                        .iter()
                        .any(|n| name.eq_ignore_ascii_case(n))
                        || record::is_secret(config, &name)
                })
        });
        match name {
            Some(name) if secret => {
                out.push_str(name);
                out.push_str("=[redacted]");
            }
            _ => out.push_str(param),
        }
        let mut after = after.chars();
        match after.next() {
            Some(separator) => {
                out.push(separator);
                rest = after.as_str();
            }
            None => return,
        }
    }
}

/// Asserts that `health` is of a failing trail whose error says `says`.
#[cfg(test)]
pub(crate) fn assert_failing(health: &AuditHealth, says: &str) {
    assert!(!health.writable, "{health:?}");
    assert!(
        health
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains(says)),
        "{health:?}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_levels() {
        let args =
            json!({"path": "/etc", "Password": "hunter2", "nested": {"token": "t", "ok": 1}});
        let mut c = AuditConfig {
            redaction: Redaction::Full,
            ..AuditConfig::default()
        };
        let full = c.redact(&args);
        assert_eq!(full["Password"], "[redacted]");
        let pairs = json!({"headers": [{"name": "Authorization", "value": "Bearer t"}, {"name": "Accept", "value": "*/*"}], "tags": [{"Key": "X-Api-Token", "Value": "v"}], "SESSION_ID": "s", "passwd": "p"});
        let scrubbed = c.redact(&pairs);
        assert_eq!(scrubbed["headers"][0]["value"], "[redacted]");
        assert_eq!(scrubbed["headers"][1]["value"], "*/*");
        assert_eq!(scrubbed["tags"][0]["Value"], "[redacted]");
        assert_eq!(scrubbed["SESSION_ID"], "[redacted]");
        assert_eq!(scrubbed["passwd"], "[redacted]");
        assert_eq!(full["nested"]["token"], "[redacted]");
        assert_eq!(full["nested"]["ok"], 1);
        c.redaction = Redaction::Keys;
        assert_eq!(c.redact(&args), json!(["Password", "nested", "path"]));
        c.redaction = Redaction::None;
        assert_eq!(c.redact(&args), Value::Null);
    }

    #[test]
    fn redaction_matches_any_spelling_of_a_secret_name() {
        let c = AuditConfig {
            redaction: Redaction::Full,
            ..AuditConfig::default()
        };
        let secret = [
            "apiKey",
            "API_KEY",
            "x-api-key",
            "accessToken",
            "ACCESS-TOKEN",
            "clientSecret",
            "db_password",
            "Authorization",
            "set-cookie",
            "SessionCookie",
            "auth",
            "X-Auth",
            "passphrase",
            "pwd",
            "private_pem",
            "signature",
        ];
        let mut args = json!({"path": "/ok", "count": 11, "url": "https://u:p@host/x?y=1",
            "note": "see ftp://anon@files and http://plain/x@y", "n": "a@b"});
        for (i, k) in secret.iter().enumerate() {
            args[*k] = json!(i);
        }
        let out = c.redact(&args);
        for k in secret {
            assert_eq!(out[k], "[redacted]", "{k}");
        }
        assert_eq!(out["path"], "/ok");
        assert_eq!(out["count"], 11);
        assert_eq!(out["url"], "https://[redacted]@host/x?y=1");
        assert_eq!(
            out["note"],
            "see ftp://[redacted]@files and http://plain/x@y"
        );
        assert_eq!(out["n"], "a@b");
        assert_eq!(
            without_userinfo("https://u:pa#ss@h/x and s3://k:s@b"),
            "https://[redacted]/x and s3://[redacted]@b"
        );
        assert_eq!(
            without_userinfo("https://api.example.com?email=bob@evil.com/x"),
            "https://[redacted]/x",
            "no host that is none"
        );
    }

    // A query's secret parameters are hidden as an argument of that name would be:
    // a presigned URL's signature, a token in the query.
    #[test]
    fn a_urls_secret_query_values_are_hidden() {
        let c = AuditConfig::default();
        assert_eq!(
            without_url_secrets(
                &c,
                "read https://b.s3.example/x?X-Amz-Credential=AK%2F1&X-Amz-Expires=60&X-Amz-Signature=abc#top failed"
            ),
            "read https://b.s3.example/x?X-Amz-Credential=[redacted]&X-Amz-Expires=60&X-Amz-Signature=[redacted]#top failed"
        );
        assert_eq!(
            without_url_secrets(&c, "\"https://u:p@h/?access%5Ftoken=t&page=2\""),
            "\"https://[redacted]@h/?access%5Ftoken=[redacted]&page=2\""
        );
        assert_eq!(
            without_url_secrets(&c, "https://h/x?q=1 and ?token=not-a-url"),
            "https://h/x?q=1 and ?token=not-a-url"
        );
        assert_eq!(
            without_url_secrets(&c, "(see https://a.blob.example/c?sv=1&sig=AbC%3D), then"),
            "(see https://a.blob.example/c?sv=1&sig=[redacted]), then"
        );
        // In the fragment too (OAuth's implicit flow), and after a `;`.
        assert_eq!(
            without_url_secrets(&c, "https://app/cb#access_token=eyJ&expires_in=3600"),
            "https://app/cb#access_token=[redacted]&expires_in=3600"
        );
        assert_eq!(
            without_url_secrets(&c, "https://app/#/cb?x=1&id_token=eyJ; https://h/d#part-2"),
            "https://app/#/cb?x=1&id_token=[redacted]; https://h/d#part-2"
        );
        assert_eq!(
            without_url_secrets(&c, "https://h/x?a=1;token=t&b=2#s"),
            "https://h/x?a=1;token=[redacted]&b=2#s"
        );
        let full = AuditConfig {
            redaction: Redaction::Full,
            ..AuditConfig::default()
        };
        let out = full.redact(&json!({"u": "https://h/x?api_key=k1"}));
        assert_eq!(out["u"], "https://h/x?api_key=[redacted]");
    }

    #[test]
    fn configured_keys_add_to_the_builtin_ones() {
        let c = AuditConfig {
            redaction: Redaction::Full,
            redact_keys: vec!["SSN".into()],
            ..AuditConfig::default()
        };
        let out = c.redact(&json!({"patient_ssn": "1", "api_token": "t", "name": "n"}));
        assert_eq!(out["patient_ssn"], "[redacted]");
        assert_eq!(out["api_token"], "[redacted]", "the built-in list went");
        assert_eq!(out["name"], "n");
        assert!(c.validate().is_ok());
        // One that folds to nothing would hide every value: refused, by its place.
        for nothing in ["_", "--", ""] {
            let c = AuditConfig {
                redact_keys: vec!["SSN".into(), nothing.into()],
                ..AuditConfig::default()
            };
            let e = c.validate().expect_err(nothing);
            assert_eq!(e.field, "redact_keys[1]", "{nothing:?}");
        }
    }
}
