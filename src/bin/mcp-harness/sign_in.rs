//! Sign-in from the command line: where a person signs in (`--sign-in`), where tokens
//! are kept (`--tokens`, else the cache directory), `login` and `logout`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

use mcp_harness::transport::auth::{
    Authorizer, FileTokenStore, HeadlessAuthorizer, LoopbackAuthorizer, MemoryTokenStore,
    TokenStore,
};
use mcp_harness::{HarnessHandle, ServerState, TransportSpec};

use crate::commands::{NO_SERVER, OK, Setup, UsageError};
use crate::terminal::line;

/// Where a person signs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SignInMode {
    /// Print the URL on stderr and wait for the browser to come back to a loopback
    /// listener (only on a terminal; elsewhere, run `login` first).
    Print,
    /// The same, and open the URL in a browser.
    Browser,
    /// Request the URL without a person: for authorization servers that approve
    /// automated clients (tests).
    Headless,
}

/// The token directory: `--tokens`, else `cache.dir/__tokens`, else the user's cache;
/// `None` when there is no user's cache to use, or a `cache.dir` the disk layer refuses
/// (a shared one, such as the temporary directory, would let another local user block
/// or redirect the files).
pub fn token_dir(setup: &Setup, given: Option<&PathBuf>) -> Option<PathBuf> {
    if let Some(dir) = given {
        return Some(dir.clone());
    }
    if let Some(cache) = &setup.loaded.config.cache.dir {
        return mcp_harness::registry::cache::token_dir(cache);
    }
    user_cache(std::env::var_os("XDG_CACHE_HOME"), std::env::var_os("HOME"))
        .map(|base| base.join("mcp-harness").join("tokens"))
}

/// The user's cache directory: `XDG_CACHE_HOME`, else `HOME/.cache`. Empty and relative
/// values are ignored (the XDG spec says so; a relative one would follow the working
/// directory).
fn user_cache(xdg: Option<OsString>, home: Option<OsString>) -> Option<PathBuf> {
    let absolute = |v: Option<OsString>| v.map(PathBuf::from).filter(|p| p.is_absolute());
    absolute(xdg).or_else(|| absolute(home).map(|h| h.join(".cache")))
}

/// The token store the commands use: files in [`token_dir`], or, with none, memory (the
/// next process signs in again). `None` for the cache directory's (no `--tokens`): the
/// harness finds it as it reads that directory, within its bound, and keeps tokens in
/// memory when a hung mount keeps it from it.
pub fn store(setup: &Setup, given: Option<&PathBuf>) -> Option<Arc<dyn TokenStore>> {
    if given.is_none() && setup.loaded.config.cache.dir.is_some() {
        return None;
    }
    Some(match token_dir(setup, given) {
        Some(dir) => Arc::new(FileTokenStore::new(dir)),
        None => {
            // Only HTTP servers sign in.
            let remote = setup
                .loaded
                .config
                .servers
                .iter()
                .any(|s| matches!(s.transport, TransportSpec::Http(_)));
            if remote {
                errln!(
                    "mcp-harness: neither HOME nor XDG_CACHE_HOME is set to an absolute path: sign-in tokens are kept in memory only (pass --tokens DIR to keep them)"
                );
            }
            Arc::new(MemoryTokenStore::default())
        }
    })
}

/// The token files, for `login` and `logout`, whose work they are.
pub fn file_store(setup: &Setup, given: Option<&PathBuf>) -> anyhow::Result<Arc<dyn TokenStore>> {
    match token_dir(setup, given) {
        Some(dir) => Ok(Arc::new(FileTokenStore::new(dir))),
        None => Err(UsageError(anyhow::anyhow!(
            "no directory to keep tokens in: cache.dir is not this user's or others may write it, or HOME and XDG_CACHE_HOME are not absolute paths; pass --tokens DIR"
        ))
        .into()),
    }
}

/// The authorizer for `mode`; `None` when nobody could answer (print mode off a
/// terminal, unless `forced` as for `login`).
pub fn authorizer(
    mode: SignInMode,
    setup: &Setup,
    forced: bool,
) -> anyhow::Result<Option<Arc<dyn Authorizer>>> {
    use std::io::IsTerminal;
    let show: mcp_harness::transport::auth::ShowUrl = Arc::new(|request, url| {
        let who = request
            .identity
            .as_deref()
            .map(|i| format!(" as {}", line(i)))
            .unwrap_or_default();
        errln!(
            "mcp-harness: sign in to {}{who} at:\n  {}",
            line(&request.server),
            line(url)
        );
    });
    Ok(match mode {
        SignInMode::Print if forced || std::io::stderr().is_terminal() => {
            Some(Arc::new(LoopbackAuthorizer::new(show, false)))
        }
        SignInMode::Print => None,
        SignInMode::Browser => Some(Arc::new(LoopbackAuthorizer::new(show, true))),
        SignInMode::Headless => {
            // The authorization server is trusted as the servers are.
            let ca = setup
                .loaded
                .config
                .servers
                .iter()
                .find_map(|s| match &s.transport {
                    TransportSpec::Http(h) => h.ca_file.clone(),
                    _ => None,
                });
            Some(Arc::new(
                HeadlessAuthorizer::new(ca.as_deref()).map_err(anyhow::Error::msg)?,
            ))
        }
    })
}

/// `login SERVER`: connects to it, which signs in when it asks; says what happened.
pub async fn login(harness: &HarnessHandle, server: &str) -> anyhow::Result<u8> {
    let status = harness
        .server_status(server)
        .ok_or_else(|| UsageError(anyhow::anyhow!("no server named {:?}", line(server))))?;
    match status.state {
        ServerState::Ready if harness.signed_in(server, None) => {
            errln!("mcp-harness: signed in to {}", line(server));
            Ok(OK)
        }
        ServerState::Ready => {
            errln!(
                "mcp-harness: {} did not ask anyone to sign in",
                line(server)
            );
            Ok(OK)
        }
        _ => {
            let why = status.last_error.as_deref().map(line).unwrap_or_default();
            errln!("mcp-harness: could not sign in to {}: {why}", line(server));
            Ok(NO_SERVER)
        }
    }
}

/// `logout SERVER`: forgets its tokens. A server no longer configured may still have
/// some; a name that is neither is a usage error (a typo would otherwise look done).
pub fn logout(store: &dyn TokenStore, server: &str, known: bool) -> anyhow::Result<u8> {
    let n = store.remove_server(server).map_err(anyhow::Error::msg)?;
    if n == 0 && !known {
        return Err(UsageError(anyhow::anyhow!(
            "no server named {:?}, and no tokens kept for one",
            line(server)
        ))
        .into());
    }
    errln!(
        "mcp-harness: signed out of {} ({n} token(s) forgotten)",
        line(server)
    );
    Ok(OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_go_under_an_absolute_user_cache_or_nowhere_shared() {
        let os = |s: &str| Some(OsString::from(s));
        assert_eq!(user_cache(os("/x"), os("/h")), Some(PathBuf::from("/x")));
        assert_eq!(user_cache(None, os("/h")), Some(PathBuf::from("/h/.cache")));
        // Empty or relative values follow no one's directory; there is no shared fallback.
        assert_eq!(
            user_cache(os(""), os("/h")),
            Some(PathBuf::from("/h/.cache"))
        );
        assert_eq!(user_cache(os("rel"), os("")), None);
        assert_eq!(user_cache(None, os("home")), None);
        assert_eq!(user_cache(None, None), None);
    }
}
