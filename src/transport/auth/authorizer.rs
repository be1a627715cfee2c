//! Where a person signs in. An [`Authorizer`] starts a session that says where the
//! authorization server must send the person back (`redirect_uri`), then is handed the
//! authorization URL and returns the redirect it received. Built in: a loopback listener
//! for desktops and the command line ([`LoopbackAuthorizer`], RFC 8252: `127.0.0.1`, a
//! port of the moment), and [`HeadlessAuthorizer`] for automated tests against an
//! authorization server that approves without a person.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A boxed future, for the object-safe traits below.
pub type AuthorizeFuture<T> = Pin<Box<dyn Future<Output = Result<T, String>> + Send>>;

/// Who is signing in, to which server.
#[derive(Clone, Debug)]
pub struct SignInRequest {
    /// The server's id.
    pub server: String,
    /// The caller's auth context (`None`: the harness's own sign-in).
    pub identity: Option<String>,
    /// The authorization server.
    pub issuer: String,
    /// The scopes asked for.
    pub scopes: Vec<String>,
    /// The server's sign-in clients (through a proxy, and direct for this machine):
    /// its TLS roots, and its resolver, which refuses a name that resolves only to
    /// internal addresses for a public server. An authorizer that fetches the
    /// authorization URL itself ([`HeadlessAuthorizer`]) goes through them, not its own
    /// (the URL is the authorization server's to choose, and that server the MCP
    /// server's).
    pub(crate) clients: Option<(reqwest::Client, reqwest::Client)>,
}

impl SignInRequest {
    /// A request of `server`'s sign-in with `issuer`, for `identity`, asking `scopes`
    /// (for an embedder's own tests of its authorizer).
    pub fn new(
        server: &str,
        identity: Option<&str>,
        issuer: &str,
        scopes: Vec<String>,
    ) -> SignInRequest {
        SignInRequest {
            server: server.to_string(),
            identity: identity.map(String::from),
            issuer: issuer.to_string(),
            scopes,
            clients: None,
        }
    }
}

/// Gets a person's authorization. Implement it to show the URL where your users are
/// (a chat message, a web page) and to receive the redirect back.
pub trait Authorizer: Send + Sync + 'static {
    /// Starts one sign-in (a loopback authorizer binds its port here).
    fn start(&self, request: &SignInRequest) -> AuthorizeFuture<Box<dyn AuthorizationSession>>;
}

/// One sign-in in progress.
pub trait AuthorizationSession: Send {
    /// Where the authorization server sends the person back; registered with the client.
    fn redirect_uri(&self) -> String;
    /// Shows `authorization_url` to the person and returns the full redirect URL (with
    /// its `code`, `state`, `iss` or `error`) once they are sent back.
    fn finish(self: Box<Self>, authorization_url: String) -> AuthorizeFuture<String>;
}

/// Shows the authorization URL: the command line prints it (escaped) on stderr.
pub type ShowUrl = Arc<dyn Fn(&SignInRequest, &str) + Send + Sync>;

/// A one-shot HTTP listener on `127.0.0.1` at a port of the moment.
pub struct LoopbackAuthorizer {
    show: ShowUrl,
    open_browser: bool,
}

impl LoopbackAuthorizer {
    /// Shows each URL with `show`; opens a browser on it too when `open_browser`.
    pub fn new(show: ShowUrl, open_browser: bool) -> LoopbackAuthorizer {
        LoopbackAuthorizer { show, open_browser }
    }
}

struct LoopbackSession {
    listener: tokio::net::TcpListener,
    port: u16,
    request: SignInRequest,
    show: ShowUrl,
    open_browser: bool,
}

impl Authorizer for LoopbackAuthorizer {
    fn start(&self, request: &SignInRequest) -> AuthorizeFuture<Box<dyn AuthorizationSession>> {
        let (show, open_browser, request) = (self.show.clone(), self.open_browser, request.clone());
        Box::pin(async move {
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
                .await
                .map_err(|e| format!("cannot listen on 127.0.0.1: {e}"))?;
            let port = listener.local_addr().map_err(|e| e.to_string())?.port();
            Ok(Box::new(LoopbackSession {
                listener,
                port,
                request,
                show,
                open_browser,
            }) as Box<dyn AuthorizationSession>)
        })
    }
}

/// The path the loopback listener answers.
const CALLBACK: &str = "/callback";

impl AuthorizationSession for LoopbackSession {
    fn redirect_uri(&self) -> String {
        format!("http://127.0.0.1:{}{CALLBACK}", self.port)
    }

    fn finish(self: Box<Self>, authorization_url: String) -> AuthorizeFuture<String> {
        Box::pin(async move {
            // Only the redirect of this sign-in ends it: the callback path exactly, with
            // this sign-in's `state`. Anything else on loopback (another local process,
            // a web page probing ports) is answered and ignored, and is read beside the
            // others, so that a connection that sends nothing holds nobody up; past
            // [`MAX_READING`] of them, the oldest is closed, so that a browser's redirect
            // is read even while others hold connections open.
            let state = url::Url::parse(&authorization_url)
                .ok()
                .and_then(|u| {
                    u.query_pairs()
                        .find(|(k, _)| k == "state")
                        .map(|(_, v)| v.into_owned())
                })
                .ok_or("the authorization URL has no state")?;
            (self.show)(&self.request, &authorization_url);
            if self.open_browser {
                open_in_browser(&authorization_url);
            }
            let state: Arc<str> = state.into();
            let mut reading = tokio::task::JoinSet::new();
            let mut oldest_first = std::collections::VecDeque::new();
            let port = self.port;
            let back = |target: String| format!("http://127.0.0.1:{port}{target}");
            loop {
                tokio::select! {
                    accepted = self.listener.accept() => {
                        // A failed accept (out of descriptors, a connection reset before
                        // it was taken) ends that connection, not the person's sign-in.
                        let stream = match accepted {
                            Ok((stream, _)) => stream,
                            Err(e) => {
                                tracing::debug!(error = %e, "accepting on the sign-in listener failed");
                                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                                continue;
                            }
                        };
                        // Those done count no more (the select may not have joined
                        // them yet).
                        while let Some(read) = reading.try_join_next() {
                            if let Ok(Some(target)) = read {
                                return Ok(back(target));
                            }
                        }
                        oldest_first.retain(|r: &tokio::task::AbortHandle| !r.is_finished());
                        if oldest_first.len() >= MAX_READING
                            && let Some(oldest) = oldest_first.pop_front()
                        {
                            oldest.abort();
                        }
                        oldest_first.push_back(reading.spawn(callback(stream, state.clone())));
                    }
                    Some(read) = reading.join_next() => {
                        if let Ok(Some(target)) = read {
                            return Ok(back(target));
                        }
                    }
                }
            }
        })
    }
}

/// Connections to the loopback listener read at once (past it, the oldest is closed).
const MAX_READING: usize = 16;

/// Reads one request to the loopback listener and answers it; its target when it is
/// this sign-in's redirect back (`GET /callback?…state=STATE…`).
async fn callback(mut stream: tokio::net::TcpStream, state: Arc<str>) -> Option<String> {
    let target = read_request_target(&mut stream).await?;
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    // Its one `state` (a second, whichever came first, is not this sign-in's redirect).
    let mut states = url::form_urlencoded::parse(query.as_bytes()).filter(|(k, _)| k == "state");
    let ours = path == CALLBACK
        && states.next().is_some_and(|(_, v)| *v == *state)
        && states.next().is_none();
    if !ours {
        let reply = "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
        let _ = stream.write_all(reply.as_bytes()).await;
        return None;
    }
    // The page is written on a task of its own: this one ends with the target at once,
    // so that closing the oldest connection for a new one cannot lose a redirect it had
    // read and was still answering.
    // Not "signed in": the code is yet to be exchanged, and the redirect checked.
    let refused = url::form_urlencoded::parse(query.as_bytes()).any(|(k, _)| k == "error");
    let page = match refused {
        true => {
            "<!doctype html><title>Sign-in not completed</title><p>Access was not granted. Go back to mcp-harness, which says why.</p>"
        }
        false => {
            "<!doctype html><title>Sign-in received</title><p>You can close this tab: mcp-harness goes on from here and says whether sign-in succeeded.</p>"
        }
    };
    let reply = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/html; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{page}",
        page.len()
    );
    tokio::spawn(async move {
        let write = stream.write_all(reply.as_bytes());
        let _ = tokio::time::timeout(Duration::from_secs(10), write).await;
    });
    Some(target)
}

/// The target of a `GET` request line, read within a bound (8 KiB, 10 s).
async fn read_request_target(stream: &mut tokio::net::TcpStream) -> Option<String> {
    let mut buf = Vec::with_capacity(1024);
    let read = async {
        let mut chunk = [0u8; 1024];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 8192 {
            let n = stream.read(&mut chunk).await.ok()?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        Some(())
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .ok()??;
    let line = String::from_utf8_lossy(&buf);
    let mut parts = line.lines().next()?.split_whitespace();
    (parts.next()? == "GET").then(|| parts.next().map(String::from))?
}

/// Opens `url` with the desktop's opener, without a shell (the URL is an argument).
fn open_in_browser(url: &str) {
    let opener = if cfg!(target_os = "macos") {
        "open"
    } else {
        "xdg-open"
    };
    let _ = open_with(opener, url);
}

/// Runs `opener url` and lets it go: tokio reaps it once it exits (a `std` child
/// dropped unwaited stays a zombie for the process's life, one per sign-in). Whether
/// it started.
fn open_with(opener: &str, url: &str) -> bool {
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        return false;
    }
    match tokio::process::Command::new(opener)
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
    {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(error = %e, "could not open a browser; open the URL yourself");
            false
        }
    }
}

/// For automated runs against an authorization server that approves without a person:
/// requests the authorization URL itself and takes the redirect it answers with (which
/// must go back to its `redirect_uri`).
pub struct HeadlessAuthorizer {
    client: reqwest::Client,
    /// `client` without a proxy, for an authorization server on this machine.
    direct: reqwest::Client,
    redirect_uri: String,
    identity_header: Option<String>,
}

impl HeadlessAuthorizer {
    /// Trusts the platform's roots plus `ca_file`; `redirect_uri` is never contacted.
    pub fn new(ca_file: Option<&std::path::Path>) -> Result<HeadlessAuthorizer, String> {
        let tls = crate::transport::tls::client_config(ca_file)?;
        let build = |builder: reqwest::ClientBuilder| {
            builder
                .redirect(reqwest::redirect::Policy::none())
                .tls_backend_preconfigured(tls.clone())
                .timeout(Duration::from_secs(30))
                .build()
                .map_err(|e| e.to_string())
        };
        Ok(HeadlessAuthorizer {
            client: build(reqwest::Client::builder())?,
            direct: build(reqwest::Client::builder().no_proxy())?,
            redirect_uri: "http://127.0.0.1:1/callback".into(),
            identity_header: None,
        })
    }

    /// Sends the caller's auth context in this header, for a test authorization server
    /// that approves as the user it names.
    pub fn with_identity_header(mut self, name: &str) -> HeadlessAuthorizer {
        self.identity_header = Some(name.to_string());
        self
    }
}

struct HeadlessSession {
    client: reqwest::Client,
    direct: reqwest::Client,
    redirect_uri: String,
    identity: Option<(String, String)>,
}

impl Authorizer for HeadlessAuthorizer {
    fn start(&self, request: &SignInRequest) -> AuthorizeFuture<Box<dyn AuthorizationSession>> {
        let identity = self.identity_header.clone().zip(request.identity.clone());
        // The server's own clients when the harness hands them (its roots and resolver).
        let (client, direct) =
            (request.clients.clone()).unwrap_or_else(|| (self.client.clone(), self.direct.clone()));
        let session = HeadlessSession {
            client,
            direct,
            redirect_uri: self.redirect_uri.clone(),
            identity,
        };
        Box::pin(async move { Ok(Box::new(session) as Box<dyn AuthorizationSession>) })
    }
}

impl AuthorizationSession for HeadlessSession {
    fn redirect_uri(&self) -> String {
        self.redirect_uri.clone()
    }

    fn finish(self: Box<Self>, authorization_url: String) -> AuthorizeFuture<String> {
        Box::pin(async move {
            let loopback = url::Url::parse(&authorization_url)
                .is_ok_and(|u| crate::transport::auth::is_loopback(&u));
            let client = if loopback { &self.direct } else { &self.client };
            let mut get = client.get(&authorization_url);
            if let Some((name, value)) = &self.identity {
                get = get.header(name.as_str(), value.as_str());
            }
            let response = get.send().await.map_err(crate::util::text::http_failure)?;
            let status = response.status();
            let location = response
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .map(String::from);
            // Back means to the redirect URI itself, not to any URL that begins with
            // its text (`…/callback.evil.example`, `…/callbackx`).
            let back = |l: &str| {
                let (Ok(to), Ok(ours)) = (url::Url::parse(l), url::Url::parse(&self.redirect_uri))
                else {
                    return false;
                };
                to.origin() == ours.origin() && to.path() == ours.path()
            };
            match location {
                Some(l) if status.is_redirection() && back(&l) => Ok(l),
                Some(l) if status.is_redirection() => Err(format!(
                    "the authorization server redirected elsewhere ({}), not back",
                    crate::util::text::one_line(&l, 200)
                )),
                _ => Err(format!(
                    "the authorization server answered {status} instead of redirecting back: it wants a person"
                )),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends `request` to the listener at `port` and returns the status line it answers.
    async fn ask(port: u16, request: &str) -> String {
        let answer = ask_whole(port, request).await;
        answer.lines().next().unwrap_or_default().to_string()
    }

    /// Sends `request` to the listener at `port` and returns all it answers.
    async fn ask_whole(port: u16, request: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        stream.write_all(request.as_bytes()).await.expect("request");
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer).await;
        String::from_utf8_lossy(&answer).into_owned()
    }

    // The page a person sees never says they signed in: the code is yet to be
    // exchanged, and a refusal says it was not granted.
    #[tokio::test]
    async fn the_page_shown_says_what_came_back_not_that_sign_in_succeeded() {
        for (query, shown) in [
            ("code=c-1&state=s-1", "Sign-in received"),
            ("error=access_denied&state=s-1", "Sign-in not completed"),
        ] {
            let (port, finished) = listening().await;
            let page = ask_whole(port, &format!("GET /callback?{query} HTTP/1.1\r\n\r\n")).await;
            assert!(
                page.contains(shown) && !page.contains("Signed in"),
                "{page}"
            );
            let _ = finished.await;
        }
    }

    // The headless authorizer takes a redirect to its redirect URI only, not to one
    // that merely begins with its text; another is named cut short and escaped.
    #[tokio::test]
    async fn a_headless_sign_in_takes_only_a_redirect_back_to_its_own_uri() {
        let long = format!("http://127.0.0.1:1/elsewhere?{}", "\u{1b}x".repeat(10_000));
        for (location, back) in [
            (
                "http://127.0.0.1:1/callback?code=c&state=s".to_string(),
                true,
            ),
            ("http://127.0.0.1:1/callbackx?code=c".to_string(), false),
            ("http://127.0.0.1:12/callback?code=c".to_string(), false),
            (long, false),
        ] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let port = listener.local_addr().expect("addr").port();
            let answer = format!(
                "HTTP/1.1 302 Found\r\nLocation: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                location.replace('\u{1b}', "%1B")
            );
            let server = tokio::spawn(async move {
                let (mut socket, _) = listener.accept().await.expect("accept");
                let mut request = [0u8; 4096];
                let _ = socket.read(&mut request).await;
                socket.write_all(answer.as_bytes()).await.expect("answer");
            });
            let authorizer = HeadlessAuthorizer::new(None).expect("authorizer");
            let request = SignInRequest::new("s", None, "http://127.0.0.1", Vec::new());
            let session = authorizer.start(&request).await.expect("start");
            let finished = session
                .finish(format!("http://127.0.0.1:{port}/authorize"))
                .await;
            assert_eq!(finished.is_ok(), back, "{location:.80}: {finished:?}");
            if let Err(e) = finished {
                assert!(e.len() < 400, "{} bytes", e.len());
            }
            let _ = server.await;
        }
    }

    /// A loopback sign-in listening for its redirect back (state `s-1`): its port, and
    /// the task that ends with the redirect's target.
    async fn listening() -> (u16, tokio::task::JoinHandle<Result<String, String>>) {
        let authorizer = LoopbackAuthorizer::new(Arc::new(|_: &SignInRequest, _: &str| {}), false);
        let request = SignInRequest::new("s", None, "https://as.example", Vec::new());
        let session = authorizer.start(&request).await.expect("listen");
        let port: u16 = session
            .redirect_uri()
            .trim_start_matches("http://127.0.0.1:")
            .trim_end_matches(CALLBACK)
            .parse()
            .expect("port");
        let finished = tokio::spawn(
            session.finish("https://as.example/authorize?client_id=c&state=s-1".into()),
        );
        (port, finished)
    }

    #[tokio::test]
    async fn only_this_sign_ins_redirect_ends_it_and_a_silent_connection_holds_nobody_up() {
        let (port, finished) = listening().await;
        // A connection that sends nothing, kept open throughout.
        let _silent = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        for other in [
            "GET /callbackX?code=x&state=s-1 HTTP/1.1\r\n\r\n",
            "GET /callback?code=x&state=s-2 HTTP/1.1\r\n\r\n",
            "GET /callback?code=x HTTP/1.1\r\n\r\n",
            // Its state beside another: not this sign-in's redirect, whichever is first.
            "GET /callback?code=x&state=s-2&state=s-1 HTTP/1.1\r\n\r\n",
            "GET /callback?code=x&state=s-1&state=s-2 HTTP/1.1\r\n\r\n",
        ] {
            assert!(ask(port, other).await.contains("404"), "{other}");
        }
        // Not a GET: closed unanswered.
        let post = "POST /callback?code=x&state=s-1 HTTP/1.1\r\n\r\n";
        assert_eq!(ask(port, post).await, "");
        assert!(!finished.is_finished(), "nothing else ends the sign-in");
        // More silent connections than are read at once: the oldest are closed, and
        // the redirect is still read.
        let mut silent = Vec::new();
        for _ in 0..MAX_READING + 4 {
            silent.push(
                tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .expect("connect"),
            );
        }
        let ok = ask(port, "GET /callback?code=c-1&state=s-1 HTTP/1.1\r\n\r\n").await;
        assert!(ok.contains("200"), "{ok}");
        // Well within the 10 s a silent connection is given to send its request.
        let back = tokio::time::timeout(Duration::from_secs(5), finished)
            .await
            .expect("held up by the silent connection")
            .expect("join")
            .expect("the redirect back");
        assert_eq!(
            back,
            format!("http://127.0.0.1:{port}/callback?code=c-1&state=s-1")
        );
    }

    /// Children of this process in state `Z` whose name is `name`.
    fn zombies(name: &str) -> usize {
        let me = std::process::id().to_string();
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return 0;
        };
        dir.filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("stat")).ok())
            .filter(|stat| {
                // `pid (comm) state ppid …`; comm may hold spaces, so split after it.
                let Some((comm, rest)) =
                    stat.split_once(" (").and_then(|(_, r)| r.rsplit_once(") "))
                else {
                    return false;
                };
                let mut fields = rest.split(' ');
                comm == name && fields.next() == Some("Z") && fields.next() == Some(me.as_str())
            })
            .count()
    }

    #[tokio::test]
    async fn the_browser_opener_is_reaped_once_it_exits() {
        // A name of its own for `true`, so its zombies are told from any other child's.
        let dir = crate::util::scratch::Scratch::new("opener");
        std::fs::create_dir_all(&dir).expect("dir");
        let name = format!("opener{}", std::process::id() % 100_000);
        let opener = dir.join(&name);
        std::os::unix::fs::symlink("/bin/true", &opener).expect("link");
        for _ in 0..3 {
            let started = open_with(&opener.to_string_lossy(), "https://as.example/authorize");
            assert!(started, "the opener started");
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        // Each exits at once; none is left a zombie for long.
        tokio::time::sleep(Duration::from_millis(300)).await;
        while zombies(&name) > 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(zombies(&name), 0, "reaped");
    }
}
