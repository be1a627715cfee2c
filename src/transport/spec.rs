//! How to reach one server: the transport layer's own settings, as embedders build them
//! and config files write them (`{ type = "stdio", command, … }` or
//! `{ type = "http", url, … }`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::util::hash::Fingerprint;
use crate::util::invalid::Invalid;

/// How to reach one server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum TransportSpec {
    /// A child process speaking newline-delimited JSON-RPC on stdin/stdout.
    Stdio(StdioSpec),
    /// A Streamable HTTP endpoint.
    Http(HttpSpec),
}

/// What a stdio server is: a command, its arguments, environment and directory.
/// (`Debug` shows the environment's names only: its values are often keys.)
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StdioSpec {
    /// The program to run (looked up in `PATH`).
    pub command: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Variables set for it, on top of the minimal environment (or of the harness's
    /// whole environment with `inherit_env`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory; the harness's own when `None`.
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// Pass the harness's whole environment (secrets included) instead of the minimal
    /// one: `PATH`, `HOME`, `USER`, `LANG`, `LC_*`, `TERM`, `TMPDIR`, `SHELL`.
    #[serde(default)]
    pub inherit_env: bool,
}

/// Headers the HTTP transport sets on each request from what it sends (lower case):
/// a configured one would contradict it. (`Content-Type` and `Accept`, which configs
/// written for other clients often carry, are set to what MCP needs, the configured
/// ones ignored with a warning.)
const RESERVED_HEADERS: &[&str] = &[
    "content-length",
    "mcp-protocol-version",
    "mcp-session-id",
    "mcp-method",
    "mcp-name",
    "last-event-id",
];

/// Configured headers the transport replaces with what MCP needs (lower case).
pub(crate) const REPLACED_HEADERS: &[&str] = &["content-type", "accept"];

/// What an HTTP server is: its MCP endpoint, fixed headers, and whom to trust.
/// (`Debug` shows the headers' names only, and the URL without credentials or query.)
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSpec {
    /// The single MCP endpoint (`http://` or `https://`).
    pub url: String,
    /// Headers sent on every request (for example an API key).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// A PEM bundle of extra CA certificates to trust for this server, on top of the
    /// platform's roots (and `SSL_CERT_FILE`); its authorization server too.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// How to sign in when the server asks (a 401); empty: discovery and registration.
    #[serde(default)]
    pub auth: crate::transport::auth::OAuthConfig,
}

impl std::fmt::Debug for StdioSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StdioSpec")
            .field("command", &self.command)
            .field("args", &self.args)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("cwd", &self.cwd)
            .field("inherit_env", &self.inherit_env)
            .finish()
    }
}

impl std::fmt::Debug for HttpSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let url = match url::Url::parse(&self.url) {
            Ok(url) => crate::util::text::url_shown(&url),
            Err(_) => "(not a URL)".into(),
        };
        f.debug_struct("HttpSpec")
            .field("url", &url)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("ca_file", &self.ca_file)
            .field("auth", &self.auth)
            .finish()
    }
}

impl TransportSpec {
    /// A stdio server with no extra environment, in the harness's directory.
    pub fn stdio<I, S>(command: impl Into<String>, args: I) -> TransportSpec
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        TransportSpec::Stdio(StdioSpec {
            command: command.into(),
            args: args.into_iter().map(Into::into).collect(),
            ..StdioSpec::default()
        })
    }

    /// An HTTP server with no extra headers.
    pub fn http(url: impl Into<String>) -> TransportSpec {
        TransportSpec::Http(HttpSpec {
            url: url.into(),
            ..HttpSpec::default()
        })
    }

    /// Whether this is an HTTP transport.
    pub fn is_http(&self) -> bool {
        matches!(self, TransportSpec::Http(_))
    }

    /// Checks what can be checked before connecting: a command, a URL that parses with
    /// an `http` or `https` scheme, header names and values HTTP can carry.
    pub fn validate(&self) -> Result<(), Invalid> {
        match self {
            TransportSpec::Stdio(s) => {
                if s.command.trim().is_empty() {
                    return Err(Invalid::new("transport.command", "must not be empty"));
                }
                // What the process is given cannot hold a NUL byte, and an environment
                // name with `=` would name another variable than written.
                let nul = |v: &str| v.contains('\0');
                if nul(&s.command) {
                    return Err(Invalid::new("transport.command", "holds a NUL byte"));
                }
                if let Some(i) = s.args.iter().position(|a| nul(a)) {
                    return Err(Invalid::new(
                        format!("transport.args[{i}]"),
                        "holds a NUL byte",
                    ));
                }
                if s.env
                    .keys()
                    .any(|k| k.is_empty() || k.contains('=') || nul(k))
                {
                    return Err(Invalid::new(
                        "transport.env",
                        "a variable's name is empty, or holds `=` or a NUL byte",
                    ));
                }
                if let Some(k) = s.env.iter().find_map(|(k, v)| nul(v).then_some(k)) {
                    return Err(Invalid::new(
                        format!("transport.env.{k}"),
                        "holds a NUL byte",
                    ));
                }
                if let Some(cwd) = &s.cwd {
                    let text = cwd.to_string_lossy();
                    if text.is_empty() || nul(&text) {
                        return Err(Invalid::new(
                            "transport.cwd",
                            "must be a directory's path, not empty, with no NUL byte",
                        ));
                    }
                }
                Ok(())
            }
            TransportSpec::Http(h) => {
                // The URL is not quoted back: `${VAR}` may have put a key in its query or
                // credentials, and errors reach terminals and logs.
                let url = reqwest::Url::parse(&h.url)
                    .map_err(|e| Invalid::new("transport.url", format!("is not a URL: {e}")))?;
                if !matches!(url.scheme(), "http" | "https") {
                    // Not quoted either: `${CREDS}` holding `user:password@host` parses
                    // with the user as its scheme.
                    return Err(Invalid::new(
                        "transport.url",
                        "the scheme must be http or https",
                    ));
                }
                if h.auth.client_secret.as_ref().is_some_and(|s| !s.is_empty())
                    && h.auth.issuer.is_none()
                {
                    // Else the secret would go to whichever authorization server the
                    // server names.
                    return Err(Invalid::new(
                        "transport.auth.issuer",
                        "must be set with a client_secret: the secret goes to no authorization server but this one",
                    ));
                }
                // Found out now, not at a sign-in hours later (or never, for a metadata
                // document an authorization server does not take).
                if let Some(issuer) = &h.auth.issuer {
                    let bad = |why: &str| Invalid::new("transport.auth.issuer", why);
                    let url = url::Url::parse(issuer)
                        .map_err(|_| bad("is not a URL (an authorization server's issuer)"))?;
                    let loopback_http =
                        url.scheme() == "http" && crate::transport::auth::is_loopback(&url);
                    if !(url.scheme() == "https" || loopback_http)
                        || url.query().is_some()
                        || url.fragment().is_some()
                    {
                        return Err(bad(
                            "must be an https URL (http to this machine only) without a query or fragment (RFC 8414)",
                        ));
                    }
                }
                if let Some(doc) = &h.auth.client_metadata_url {
                    let bad = |why: &str| Invalid::new("transport.auth.client_metadata_url", why);
                    let url = url::Url::parse(doc).map_err(|_| bad("is not a URL"))?;
                    if url.scheme() != "https" || url.path() == "/" || url.fragment().is_some() {
                        return Err(bad("must be an https URL with a path and no fragment"));
                    }
                }
                let mut seen = std::collections::HashSet::new();
                for (name, value) in &h.headers {
                    let field = || format!("transport.headers.{name}");
                    let parsed = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                        .map_err(|_| Invalid::new(field(), "is not a valid header name"))?;
                    // Names are case-insensitive: of two spellings only one would go.
                    if !seen.insert(parsed.clone()) {
                        return Err(Invalid::new(
                            field(),
                            "is given twice (header names ignore case)",
                        ));
                    }
                    // Set by the transport on each request: a configured one would be
                    // replaced without a word (or contradict the body).
                    let lower = parsed.as_str();
                    if RESERVED_HEADERS.contains(&lower) || lower.starts_with("mcp-param-") {
                        return Err(Invalid::new(
                            field(),
                            "is set by the transport itself and cannot be configured",
                        ));
                    }
                    reqwest::header::HeaderValue::from_str(value).map_err(|_| {
                        Invalid::new(
                            format!("transport.headers.{name}"),
                            "the value holds characters a header cannot carry",
                        )
                    })?;
                }
                Ok(())
            }
        }
    }

    /// A digest of everything that decides what this server is and what it lists: the
    /// transport, the URL or the command and its arguments, its environment variables
    /// and headers, and for HTTP how it is signed in to and the CA it is trusted by.
    /// Cache keys carry it, so a server changed under the same id never serves its old
    /// entries.
    pub fn fingerprint(&self) -> String {
        let mut f = Fingerprint::default();
        match self {
            TransportSpec::Stdio(s) => {
                // Counted, so that parts cannot move between the lists and read the same.
                f = f
                    .part(b"stdio")
                    .part(s.command.as_bytes())
                    .part(&(s.args.len() as u64).to_be_bytes());
                for a in &s.args {
                    f = f.part(a.as_bytes());
                }
                f = f.part(b"env").part(&(s.env.len() as u64).to_be_bytes());
                for (k, v) in &s.env {
                    f = f.part(k.as_bytes()).part(v.as_bytes());
                }
                let cwd = s.cwd.as_ref().map(|c| c.to_string_lossy().into_owned());
                f = f
                    .part(cwd.unwrap_or_default().as_bytes())
                    .part(&[u8::from(s.inherit_env)]);
            }
            TransportSpec::Http(h) => {
                f = f
                    .part(b"http")
                    .part(h.url.as_bytes())
                    .part(b"headers")
                    .part(&(h.headers.len() as u64).to_be_bytes());
                for (k, v) in &h.headers {
                    f = f.part(k.to_ascii_lowercase().as_bytes()).part(v.as_bytes());
                }
                // Who the server is signed in to as decides what it lists (the token's
                // scopes, its client); the CA decides which server is trusted.
                let a = &h.auth;
                let opt = |o: &Option<String>| o.clone().unwrap_or_default();
                let ca = h.ca_file.as_ref().map(|c| c.to_string_lossy().into_owned());
                f = f
                    .part(b"auth")
                    .part(opt(&a.client_id).as_bytes())
                    .part(opt(&a.client_secret).as_bytes())
                    .part(opt(&a.issuer).as_bytes())
                    .part(opt(&a.client_metadata_url).as_bytes())
                    .part(format!("{:?}", a.grant).as_bytes())
                    .part(&(a.scopes.len() as u64).to_be_bytes());
                for scope in &a.scopes {
                    f = f.part(scope.as_bytes());
                }
                f = f.part(ca.unwrap_or_default().as_bytes());
            }
        }
        f.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_no_header_or_environment_values_and_no_url_credentials() {
        let http = TransportSpec::Http(HttpSpec {
            url: "https://user:pw-s3cr3t@example.test/mcp?key=q-s3cr3t".into(),
            headers: [("Authorization".to_string(), "Bearer h-s3cr3t".to_string())].into(),
            ..HttpSpec::default()
        });
        let stdio = TransportSpec::Stdio(StdioSpec {
            command: "srv".into(),
            env: [("API_KEY".to_string(), "e-s3cr3t".to_string())].into(),
            ..StdioSpec::default()
        });
        let shown = format!("{http:?} {stdio:?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        for name in ["Authorization", "API_KEY", "example.test/mcp"] {
            assert!(shown.contains(name), "{shown}");
        }
    }

    #[test]
    fn config_files_write_transports_by_type_and_typos_are_errors() {
        let s: TransportSpec =
            serde_json::from_str(r#"{"type":"stdio","command":"srv","args":["-v"]}"#)
                .expect("stdio");
        assert_eq!(s, TransportSpec::stdio("srv", ["-v"]));
        let h: TransportSpec =
            serde_json::from_str(r#"{"type":"http","url":"https://x/mcp","ca_file":"/ca.pem"}"#)
                .expect("http");
        assert!(h.is_http());
        assert!(
            serde_json::from_str::<TransportSpec>(r#"{"type":"stdio","comand":"srv"}"#).is_err()
        );
    }

    // The sign-in settings are checked when the config is read: before, an empty
    // issuer passed, and a metadata document's URL was looked at only at a sign-in
    // whose authorization server took such documents.
    #[test]
    fn sign_in_urls_are_checked_when_the_config_is_read() {
        let with = |issuer: Option<&str>, doc: Option<&str>| {
            let mut spec = HttpSpec {
                url: "https://example.test/mcp".into(),
                ..HttpSpec::default()
            };
            spec.auth.issuer = issuer.map(String::from);
            spec.auth.client_metadata_url = doc.map(String::from);
            TransportSpec::Http(spec).validate()
        };
        assert!(
            with(
                Some("https://as.example.test"),
                Some("https://me.example/client.json")
            )
            .is_ok()
        );
        assert!(with(Some("http://127.0.0.1:9000/realm"), None).is_ok());
        for (issuer, doc, field) in [
            (Some(""), None, "transport.auth.issuer"),
            (
                Some("http://as.example.test"),
                None,
                "transport.auth.issuer",
            ),
            (
                Some("https://as.example.test?x=1"),
                None,
                "transport.auth.issuer",
            ),
            (
                None,
                Some("http://me.example/client.json"),
                "transport.auth.client_metadata_url",
            ),
            (
                None,
                Some("https://me.example/"),
                "transport.auth.client_metadata_url",
            ),
            (
                None,
                Some("https://me.example/c#f"),
                "transport.auth.client_metadata_url",
            ),
        ] {
            let e = with(issuer, doc).expect_err("refused");
            assert_eq!(e.field, field, "{issuer:?} {doc:?}");
        }
    }

    #[test]
    fn bad_urls_and_headers_are_config_errors_naming_the_field() {
        let bad = TransportSpec::http("not a url")
            .validate()
            .expect_err("bad url");
        assert_eq!(bad.field, "transport.url");
        let ftp = TransportSpec::http("ftp://x/")
            .validate()
            .expect_err("scheme");
        assert!(ftp.reason.contains("http or https"));
        // What an environment variable put in the URL is not said back.
        for url in ["ftp://u:hunter2@x/?k=hunter2", "htp//x/?k=hunter2 y"] {
            let e = TransportSpec::http(url).validate().expect_err(url);
            assert!(!e.to_string().contains("hunter2"), "{e}");
        }
        let mut spec = HttpSpec {
            url: "http://127.0.0.1/mcp".into(),
            ..HttpSpec::default()
        };
        spec.headers.insert("X-Key".into(), "line\nbreak".into());
        let e = TransportSpec::Http(spec.clone())
            .validate()
            .expect_err("header");
        assert_eq!(e.field, "transport.headers.X-Key");
        // Two spellings of one name, or a header the transport sets itself: only one
        // (or none) of what is configured would be sent.
        let with = |headers: &[(&str, &str)]| {
            let spec = HttpSpec {
                headers: headers
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..spec.clone()
            };
            TransportSpec::Http(spec).validate()
        };
        assert!(with(&[("Authorization", "Bearer A"), ("X-Api-Key", "k")]).is_ok());
        let twice = with(&[("Authorization", "Bearer A"), ("authorization", "Bearer B")]);
        assert!(twice.expect_err("twice").reason.contains("twice"));
        for reserved in ["Content-Length", "MCP-Protocol-Version", "Mcp-Param-Region"] {
            let e = with(&[(reserved, "x")]).expect_err(reserved);
            assert_eq!(e.field, format!("transport.headers.{reserved}"));
        }
        // Those it replaces with what MCP needs, and `Host` (sent as configured).
        assert!(with(&[("Accept", "*/*"), ("Content-Type", "application/json")]).is_ok());
        assert!(with(&[("Host", "mcp.internal")]).is_ok());
    }

    #[test]
    fn what_a_process_cannot_be_given_is_a_config_error_naming_the_field() {
        let with = |edit: fn(&mut StdioSpec)| {
            let mut spec = StdioSpec {
                command: "srv".into(),
                ..StdioSpec::default()
            };
            edit(&mut spec);
            TransportSpec::Stdio(spec).validate().map_err(|e| e.field)
        };
        assert_eq!(with(|_| {}), Ok(()));
        assert_eq!(
            with(|s| s.args = vec!["ok".into(), "a\0b".into()]),
            Err("transport.args[1]".into())
        );
        for name in ["", "A=B", "A\0"] {
            let e = TransportSpec::Stdio(StdioSpec {
                command: "srv".into(),
                env: [(name.to_string(), "v".to_string())].into(),
                ..StdioSpec::default()
            })
            .validate()
            .map_err(|e| e.field);
            assert_eq!(e, Err("transport.env".into()), "{name:?}");
        }
        assert_eq!(
            with(|s| s.env = [("K".to_string(), "v\0".to_string())].into()),
            Err("transport.env.K".into())
        );
        assert_eq!(
            with(|s| s.cwd = Some("".into())),
            Err("transport.cwd".into())
        );
        assert_eq!(
            with(|s| s.command = "srv\0".into()),
            Err("transport.command".into())
        );
    }

    #[test]
    fn the_fingerprint_changes_with_what_makes_the_server() {
        let a = TransportSpec::stdio("srv", ["a"]).fingerprint();
        assert_eq!(a, TransportSpec::stdio("srv", ["a"]).fingerprint());
        assert_ne!(a, TransportSpec::stdio("srv", ["b"]).fingerprint());
        let mut with_env = StdioSpec {
            command: "srv".into(),
            args: vec!["a".into()],
            ..StdioSpec::default()
        };
        with_env.env.insert("TOKEN".into(), "one".into());
        let one = TransportSpec::Stdio(with_env.clone()).fingerprint();
        with_env.env.insert("TOKEN".into(), "two".into());
        assert_ne!(one, TransportSpec::Stdio(with_env).fingerprint());
        // Arguments cannot pass for the environment.
        let mut moved = StdioSpec {
            command: "srv".into(),
            args: vec!["env".into(), "K".into()],
            ..StdioSpec::default()
        };
        moved.env.insert("V".into(), "x".into());
        let mut other = StdioSpec {
            command: "srv".into(),
            ..StdioSpec::default()
        };
        other.env.insert("K".into(), "env".into());
        other.env.insert("V".into(), "x".into());
        assert_ne!(
            TransportSpec::Stdio(moved).fingerprint(),
            TransportSpec::Stdio(other).fingerprint()
        );
        // How an HTTP server is signed in to, and which CA is trusted for it.
        let http = || HttpSpec {
            url: "https://mcp.example/mcp".into(),
            ..HttpSpec::default()
        };
        let plain = TransportSpec::Http(http()).fingerprint();
        let mut scoped = http();
        scoped.auth.scopes = vec!["admin".into()];
        let mut pinned = http();
        pinned.ca_file = Some("ca.pem".into());
        for changed in [scoped, pinned] {
            assert_ne!(plain, TransportSpec::Http(changed).fingerprint());
        }
    }
}
