//! Sign-in from the command line: where a person signs in (`--sign-in`), where tokens
//! are kept (`--tokens`, else the cache directory), `login` and `logout`.

use std::path::PathBuf;
use std::sync::Arc;

use mcp_harness::transport::auth::{
    Authorizer, FileTokenStore, HeadlessAuthorizer, LoopbackAuthorizer, TokenStore,
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

/// The token directory: `--tokens`, else `cache.dir/__tokens`, else the user's cache.
pub fn token_dir(setup: &Setup, given: Option<&PathBuf>) -> PathBuf {
    if let Some(dir) = given {
        return dir.clone();
    }
    if let Some(cache) = &setup.loaded.config.cache.dir {
        return mcp_harness::registry::cache::token_dir(cache);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("mcp-harness").join("tokens")
}

/// The token store the commands use.
pub fn store(setup: &Setup, given: Option<&PathBuf>) -> Arc<dyn TokenStore> {
    Arc::new(FileTokenStore::new(token_dir(setup, given)))
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
        eprintln!(
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
            eprintln!("mcp-harness: signed in to {}", line(server));
            Ok(OK)
        }
        ServerState::Ready => {
            eprintln!(
                "mcp-harness: {} did not ask anyone to sign in",
                line(server)
            );
            Ok(OK)
        }
        _ => {
            let why = status.last_error.as_deref().map(line).unwrap_or_default();
            eprintln!("mcp-harness: could not sign in to {}: {why}", line(server));
            Ok(NO_SERVER)
        }
    }
}

/// `logout SERVER`: forgets its tokens.
pub fn logout(store: &dyn TokenStore, server: &str) -> anyhow::Result<u8> {
    let n = store.remove_server(server).map_err(anyhow::Error::msg)?;
    eprintln!(
        "mcp-harness: signed out of {} ({n} token(s) forgotten)",
        line(server)
    );
    Ok(OK)
}
