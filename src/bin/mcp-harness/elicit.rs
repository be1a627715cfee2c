//! How `mcp-harness call` answers elicitation: from `--answers`, from a form on the
//! terminal, or (neither) by declining. URL-mode requests show the full URL and ask for
//! consent; the program never opens a URL itself.

use std::io::{BufRead, IsTerminal, Write};

use mcp_harness::call::input::{
    InputError, InputFuture, REVIEW_CHARS, REVIEW_MESSAGES, ReviewText, SamplingReview, review,
};
use mcp_harness::{InputHandler, InputRequestContext};
use serde_json::{Map, Value, json};

use crate::terminal::{line, line_cut};

/// The command line's elicitation handler.
pub struct CliElicitation {
    /// `--answers`: keyed by input-request key or by field name.
    pub answers: Option<Value>,
}

impl InputHandler for CliElicitation {
    fn capability(&self) -> Value {
        json!({"form": {}, "url": {}})
    }

    fn answer(&self, request: InputRequestContext) -> InputFuture {
        let answers = self.answers.clone();
        Box::pin(async move {
            let interactive = answers.is_none() && on_a_terminal();
            let asker = interactive.then(Asker::default);
            let _withdraw = asker.as_ref().map(Asker::withdrawn_on_drop);
            tokio::task::spawn_blocking(move || {
                let _one_at_a_time = prompt_lock();
                decide(&request, answers.as_ref(), asker.as_ref())
            })
            .await
            .map_err(|e| InputError::Failed(e.to_string()))
        })
    }
}

/// One question on the terminal at a time: answers typed go to the prompt on screen
/// (a round's requests are answered concurrently).
fn prompt_lock() -> std::sync::MutexGuard<'static, ()> {
    static PROMPT: std::sync::Mutex<()> = std::sync::Mutex::new(());
    PROMPT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A line typed on the terminal (`None`: the end of input), and when it was read.
type Typed = (std::time::Instant, Option<String>);

/// Lines typed on the terminal, read by one thread of their own for the process's life.
/// A read on the blocking pool could not be given up: a question withdrawn (its call
/// cancelled, past its deadline, or the program interrupted) would hold its thread, the
/// prompt, and the runtime's shutdown until the next Enter.
struct TypedLines {
    /// Asks the reader for one line: it reads only when a question wants one, so a
    /// line typed for the shell once the questions are over stays the shell's.
    want: std::sync::mpsc::SyncSender<()>,
    /// A line is asked for and not yet given (one read at a time, and none more: a
    /// question withdrawn during a read leaves that read to the next question).
    reading: std::sync::Arc<std::sync::atomic::AtomicBool>,
    lines: std::sync::mpsc::Receiver<Typed>,
}

impl TypedLines {
    /// Asks for a line, unless a read is under way already.
    fn want(&self) {
        if !self.reading.swap(true, std::sync::atomic::Ordering::SeqCst) {
            let _ = self.want.try_send(());
        }
    }
}

fn typed_lines() -> &'static std::sync::Mutex<TypedLines> {
    static LINES: std::sync::OnceLock<std::sync::Mutex<TypedLines>> = std::sync::OnceLock::new();
    LINES.get_or_init(|| {
        let (want, wanted) = std::sync::mpsc::sync_channel::<()>(1);
        // One line held at most: a question withdrawn while its line was read leaves
        // it for the next, which decides whether it answers it.
        let (tx, lines) = std::sync::mpsc::sync_channel(1);
        let reading = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let done = reading.clone();
        let reader = std::thread::Builder::new()
            .name("stdin-lines".into())
            .spawn(move || {
                while wanted.recv().is_ok() {
                    let mut line = String::new();
                    let read = std::io::stdin().lock().read_line(&mut line);
                    // Ctrl-D (a read of nothing) ends the question it answers, not the
                    // terminal: the next question reads again. An error ends it.
                    let failed = read.is_err();
                    let typed = (
                        std::time::Instant::now(),
                        matches!(read, Ok(n) if n > 0).then_some(line),
                    );
                    done.store(false, std::sync::atomic::Ordering::SeqCst);
                    if tx.send(typed).is_err() || failed {
                        return;
                    }
                }
            });
        if let Err(e) = reader {
            errln!("mcp-harness: cannot read the terminal: {e}");
        }
        std::sync::Mutex::new(TypedLines {
            want,
            reading,
            lines,
        })
    })
}

/// Asks on the terminal until its question is withdrawn.
#[derive(Clone, Default)]
struct Asker {
    withdrawn: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// Withdraws an [`Asker`]'s question when dropped (with the future that waits for it).
struct Withdraw(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for Withdraw {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Asker {
    fn withdrawn_on_drop(&self) -> Withdraw {
        Withdraw(self.withdrawn.clone())
    }

    fn withdrawn(&self) -> bool {
        self.withdrawn.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Shows `prompt` and waits for a line; `None` at the end of input or once the
    /// question is withdrawn. A line typed after a question was withdrawn and before
    /// this one was shown was meant for that one: it is dropped, never taken as the
    /// answer to a question its typist has not seen.
    fn ask(&self, prompt: &str) -> Option<String> {
        self.ask_line(prompt, false)
    }

    /// A yes or no to `prompt` (`y` or `yes`, any case, is yes); `None` at the end of
    /// input or once withdrawn. Only a line typed once it is shown answers it: a `y`
    /// typed ahead (pasted after a form's answers) never consents unseen.
    fn consent(&self, prompt: &str) -> Option<bool> {
        // What the terminal holds unread was typed before this was asked (a paste runs
        // ahead of the questions): gone, so that it cannot be read as typed after.
        // SAFETY: tcflush on stdin, a terminal here (a person is asked only when it is).
        unsafe { libc::tcflush(libc::STDIN_FILENO, libc::TCIFLUSH) };
        let line = self.ask_line(prompt, true)?;
        let line = line.trim();
        Some(line.eq_ignore_ascii_case("y") || line.eq_ignore_ascii_case("yes"))
    }

    fn ask_line(&self, prompt: &str, consent: bool) -> Option<String> {
        static WITHDRAWN: std::sync::Mutex<Option<std::time::Instant>> =
            std::sync::Mutex::new(None);
        if self.withdrawn() {
            return None;
        }
        let _ = write!(std::io::stderr(), "{prompt}");
        let _ = std::io::stderr().flush();
        let shown = std::time::Instant::now();
        // Only the first question after a withdrawal drops lines: later ones take what
        // is typed ahead for them.
        let last_withdrawn = WITHDRAWN.lock().unwrap_or_else(|p| p.into_inner()).take();
        let lines = typed_lines()
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        lines.want();
        loop {
            match lines
                .lines
                .recv_timeout(std::time::Duration::from_millis(100))
            {
                Ok((at, Some(_))) if !answers_it(at, shown, last_withdrawn, consent) => {
                    lines.want();
                }
                Ok((_, line)) => return line,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) if self.withdrawn() => {
                    // A line half typed for it is not finished as the next one's
                    // answer (another server's, maybe).
                    // SAFETY: tcflush on stdin, a terminal here (as in `consent`).
                    unsafe { libc::tcflush(libc::STDIN_FILENO, libc::TCIFLUSH) };
                    *WITHDRAWN.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(std::time::Instant::now());
                    errln!("\n(the question was withdrawn)");
                    return None;
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return None,
            }
        }
    }
}

/// Whether a line read at `at` answers a question shown at `shown`: not one typed
/// between a withdrawn question and this one (it was meant for that one), and for a
/// yes or no, not one typed before it was shown.
fn answers_it(
    at: std::time::Instant,
    shown: std::time::Instant,
    last_withdrawn: Option<std::time::Instant>,
    consent: bool,
) -> bool {
    let ahead = at < shown;
    !(ahead && (consent || last_withdrawn.is_some_and(|w| at > w)))
}

/// Characters of one message or system prompt shown.
const SHOWN_CHARS: usize = 500;

/// The most characters of a field's name an error names (the name is the server's, of
/// any length; its title and options are cut by [`shown`]).
const FIELD_NAME_SHOWN: usize = 100;

/// Text for the terminal on one line, cut at [`SHOWN_CHARS`] with how much was cut,
/// and how much was never shown (hidden characters), said after the cut.
fn shown(text: &str) -> String {
    let (one, unseen) = crate::terminal::sanitize_counted(text, false);
    let total = one.chars().count();
    let mut out: String = one.chars().take(SHOWN_CHARS).collect();
    if total > SHOWN_CHARS {
        out.push_str(&format!(" …(+{} more characters)", total - SHOWN_CHARS));
    }
    out.push_str(&crate::terminal::unseen_note(unseen));
    out
}

/// What a person approves of a sampling request, a line each: the plan the harness
/// noted, the instructions the model would follow (the system prompt and the first
/// messages), each cut visibly, and how many messages are not shown.
pub fn sampling_shown(review: &SamplingReview) -> Vec<String> {
    let mut out = Vec::new();
    // What the harness will send (the model, the capped tokens), when it says.
    if let Some(model) = &review.model {
        out.push(format!(
            "model: {}, up to {} tokens ({} reserved from the budgets)",
            line(model),
            review.max_tokens.unwrap_or(0),
            review.reserved_tokens.unwrap_or(0)
        ));
    }
    if let Some(system) = &review.system {
        out.push(format!("system: {}", reviewed(system)));
    }
    let shown = review.messages.iter().take(REVIEW_MESSAGES);
    for m in shown.clone() {
        out.push(format!(
            "{}: {}",
            line(m.role.as_deref().unwrap_or("?")),
            reviewed(m)
        ));
    }
    let more = review.message_count.saturating_sub(shown.count());
    if more > 0 {
        out.push(format!("(+{more} more messages)"));
    }
    out
}

/// A reviewed text for the terminal, with how many of its characters are not shown,
/// and how many it hid (controls, escapes).
fn reviewed(t: &ReviewText) -> String {
    let (one, unseen) = crate::terminal::sanitize_counted(&t.text, false);
    let taken: String = t.text.chars().take(REVIEW_CHARS).collect();
    let mut out: String = one.chars().take(REVIEW_CHARS).collect();
    let cut = t.chars.saturating_sub(taken.chars().count());
    if cut > 0 {
        out.push_str(&format!(" …(+{cut} more characters)"));
    }
    out.push_str(&crate::terminal::unseen_note(unseen));
    out
}

/// Approves sampling requests on the terminal (the command line's approver): shows who
/// asks, for how many tokens, and the first message, and asks y/N. Without a terminal
/// it declines.
pub struct CliApprover;

impl InputHandler for CliApprover {
    fn answer(&self, request: InputRequestContext) -> InputFuture {
        Box::pin(async move {
            let interactive = on_a_terminal();
            let asker = Asker::default();
            let _withdraw = asker.withdrawn_on_drop();
            tokio::task::spawn_blocking(move || {
                let _one_at_a_time = prompt_lock();
                if !interactive {
                    errln!("mcp-harness: sampling declined: approval needs a terminal");
                    return json!({"action": "decline"});
                }
                if asker.withdrawn() {
                    return json!({"action": "cancel"});
                }
                let p = &request.params;
                let messages = p["messages"].as_array().map_or(0, Vec::len);
                // Without a number of its own, the request gets the configured most.
                let capped =
                    p["_meta"][mcp_harness::call::input::APPROVAL_META]["maxTokens"].as_u64();
                let tokens = match capped.or_else(|| p["maxTokens"].as_u64()) {
                    Some(n) => format!("up to {n} tokens"),
                    None => "the configured most tokens".to_string(),
                };
                errln!(
                    "server {} asks the model for {tokens}, {messages} message(s):",
                    line(&request.server),
                );
                for shown in sampling_shown(&review(p)) {
                    errln!("  {shown}");
                }
                // The last line before the answer is the harness's own: what the server
                // wrote above it may be made to look like anything.
                let prompt = format!("server {}, {tokens}: allow? [y/N] ", line(&request.server));
                match asker.consent(&prompt) {
                    Some(true) => json!({"action": "accept"}),
                    _ => json!({"action": "decline"}),
                }
            })
            .await
            .map_err(|e| InputError::Failed(e.to_string()))
        })
    }
}

/// What a URL's host is when it is not out on the internet: a page on this machine or
/// on a private network, which a remote server may name to have a person's browser
/// act on a service there (a local admin page) on its behalf.
fn where_it_is(url: &url::Url) -> &'static str {
    use std::net::{IpAddr, Ipv4Addr};
    let ip = match url.host() {
        Some(url::Host::Domain(d)) => {
            let d = d.trim_end_matches('.').to_ascii_lowercase();
            return match d == "localhost" || d.ends_with(".localhost") {
                true => ", this machine",
                false => "",
            };
        }
        Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip),
        // An IPv4 address written as IPv6 (`[::ffff:127.0.0.1]`) is that address.
        Some(url::Host::Ipv6(ip)) => ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4),
        None => return "",
    };
    // 100.64.0.0/10: carrier-grade NAT, and overlay networks (Tailscale) in it.
    let shared = |v4: &Ipv4Addr| v4.octets()[0] == 100 && (v4.octets()[1] & 0xc0) == 64;
    match ip {
        // `0.0.0.0` and `::` reach this machine in browsers that route them.
        ip if ip.is_loopback() || ip.is_unspecified() => ", this machine",
        IpAddr::V4(v4) if v4.is_private() || v4.is_link_local() || shared(&v4) => {
            ", a private network"
        }
        IpAddr::V6(v6)
            if (v6.segments()[0] & 0xfe00) == 0xfc00 || (v6.segments()[0] & 0xffc0) == 0xfe80 =>
        {
            ", a private network"
        }
        _ => "",
    }
}

fn decline(why: &str) -> Value {
    errln!("mcp-harness: elicitation declined: {why}");
    json!({"action": "decline"})
}

/// The answer to one form or URL request: from `answers`, else asked through `asker`
/// (a terminal), else declined.
fn decide(request: &InputRequestContext, answers: Option<&Value>, asker: Option<&Asker>) -> Value {
    if asker.is_some_and(Asker::withdrawn) {
        return json!({"action": "cancel"});
    }
    // `--answers` are the call's: not for a server that asks outside it (one allowed
    // unsolicited input), which could name a field as the call's server does and
    // be handed what was meant for that one (a token, say).
    if answers.is_some() && request.call_id.is_none() {
        errln!(
            "Server {} asks outside the call; declined (--answers are the call's)",
            line(&request.server)
        );
        return decline("--answers answer the call's own questions, and this one came outside it");
    }
    let p = &request.params;
    if p["mode"] == "url" {
        return url_mode(request, answers, asker);
    }
    let schema = &p["requestedSchema"];
    let empty = Map::new();
    let form = Form {
        props: schema["properties"].as_object().unwrap_or(&empty),
        required: schema["required"]
            .as_array()
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default(),
    };
    match (answers, asker) {
        (Some(answers), _) => form.answer_from(request, answers),
        (None, Some(asker)) => form.ask(request, asker),
        (None, None) => {
            decline("stdin is not a terminal; pass --answers '{...}' (or '{}' for the defaults)")
        }
    }
}

/// The `--answers` name that consents to a URL-mode request: `"!url": "accept"`, at the
/// top (every such request of the call) or in the object of one request's key.
const URL_CONSENT: &str = "!url";

/// The `--answers` name that consents to a form without fields (a confirmation, such
/// as "Delete everything?"): `"!confirm": "accept"`, at the top or in the object of one
/// request's key. Answers for fields say nothing of a question that has none.
const CONFIRM_CONSENT: &str = "!confirm";

/// Whether `answers` say `"accept"` under `name`, for `request`: at the top, or in the
/// object of its key (a name no form field has: the key is the server's to choose).
fn consents(answers: &Value, request: &InputRequestContext, name: &str) -> bool {
    [answers.get(&request.key), Some(answers)]
        .into_iter()
        .flatten()
        .any(|scope| scope.get(name).and_then(Value::as_str) == Some("accept"))
}

/// A URL-mode request: shown in full (without anything that could disguise it), never
/// opened, accepted only with consent.
fn url_mode(
    request: &InputRequestContext,
    answers: Option<&Value>,
    asker: Option<&Asker>,
) -> Value {
    let p = &request.params;
    let message = crate::terminal::line_cut(p["message"].as_str().unwrap_or(""), 500);
    // Only a web page a person can judge by its host (the harness refuses others before
    // they reach a handler; checked again here, as this one shows it).
    let parsed =
        mcp_harness::call::input::usable_elicitation_url(p).filter(|u| u.as_str().len() <= 2048);
    let Some(parsed) = parsed else {
        return decline(
            "the URL is not an https URL of at most 2048 characters without credentials",
        );
    };
    let host = format!(
        "{}{}",
        line(parsed.host_str().unwrap_or("")),
        where_it_is(&parsed)
    );
    errln!(
        "Server {} asks you to open this URL yourself (host {host}):\n  {}\n  ({message})",
        line(&request.server),
        line(parsed.as_str()),
    );
    let consent = match answers {
        // Under a name no form field has: `{"KEY": "accept"}` would also be the answer
        // to a field KEY, and the key is the server's to choose.
        Some(a) => consents(a, request, URL_CONSENT),
        None => asker
            .and_then(|asker| {
                // The harness's own line last: the server's message is above it.
                let server = line(&request.server);
                asker.consent(&format!(
                    "server {server}, host {host}: done, and do you consent? [y/N] "
                ))
            })
            .unwrap_or(false),
    };
    if consent {
        json!({"action": "accept"})
    } else {
        decline("no consent to the URL")
    }
}

/// A form-mode request's fields.
struct Form<'a> {
    props: &'a Map<String, Value>,
    required: Vec<&'a str>,
}

impl Form<'_> {
    /// `--answers`: keyed by input-request key or by field name; defaults fill the rest.
    fn answer_from(&self, request: &InputRequestContext, answers: &Value) -> Value {
        if self.props.is_empty() {
            // Said on stderr, as the terminal would show it: what was confirmed, or not.
            let message = line_cut(request.params["message"].as_str().unwrap_or(""), 500);
            errln!(
                "Server {} asks you to confirm: {message}",
                line(&request.server)
            );
            return match consents(answers, request, CONFIRM_CONSENT) {
                true => json!({"action": "accept", "content": {}}),
                false => decline(
                    "a confirmation is accepted only with \"!confirm\": \"accept\" in --answers",
                ),
            };
        }
        let source = answers
            .get(&request.key)
            .filter(|v| v.is_object())
            .unwrap_or(answers);
        let mut content = Map::new();
        for (field, def) in self.props {
            if let Some(given) = source.get(field)
                && let Err(why) = check(def, given)
            {
                return decline(&format!(
                    "--answers has no valid value for field {:?}: {}",
                    line_cut(field, FIELD_NAME_SHOWN),
                    shown(&why)
                ));
            }
            match source.get(field).or_else(|| def.get("default")) {
                Some(v) => {
                    content.insert(field.clone(), v.clone());
                }
                None if self.required.contains(&field.as_str()) => {
                    return decline(&format!(
                        "--answers has no value for required field {:?}",
                        line_cut(field, FIELD_NAME_SHOWN)
                    ));
                }
                None => {}
            }
        }
        json!({"action": "accept", "content": content})
    }

    /// On a terminal: one prompt per field; a form without fields (a confirmation) is
    /// accepted only by a yes.
    fn ask(&self, request: &InputRequestContext, asker: &Asker) -> Value {
        let message = shown(request.params["message"].as_str().unwrap_or(""));
        errln!("\nServer {} asks: {message}", line(&request.server));
        if self.props.is_empty() {
            let prompt = format!("server {}: accept? [y/N] ", line(&request.server));
            return match asker.consent(&prompt) {
                Some(true) => json!({"action": "accept", "content": {}}),
                Some(false) => json!({"action": "decline"}),
                None => json!({"action": "cancel"}),
            };
        }
        errln!("(press Enter for the default; type !decline or !cancel to refuse)");
        let mut content = Map::new();
        for (field, def) in self.props {
            match self.ask_field(field, def, asker) {
                Ok(Some(v)) => {
                    content.insert(field.clone(), v);
                }
                Ok(None) => {}
                Err(refusal) => return refusal,
            }
        }
        json!({"action": "accept", "content": content})
    }

    /// One field, asked until it gets a valid value (`Ok(None)`: left out); `Err` is
    /// the refusal to send.
    fn ask_field(&self, field: &str, def: &Value, asker: &Asker) -> Result<Option<Value>, Value> {
        let kind = def["type"].as_str().unwrap_or("string");
        // What a server writes is shown cut short: a schema of any size prints a prompt
        // a terminal shows whole.
        let options = choices(def)
            .map(|e| format!(" {}", shown(&Value::Array(e).to_string())))
            .unwrap_or_default();
        let default = def
            .get("default")
            .map(|d| format!(" [{}]", shown(&d.to_string())))
            .unwrap_or_default();
        let title = shown(
            def["title"]
                .as_str()
                .or(def["description"].as_str())
                .unwrap_or(field),
        );
        let required = self.required.contains(&field);
        let star = if required { "*" } else { "" };
        let kind_shown = match kind {
            "array" => "several, separated by commas".to_string(),
            other => shown(other),
        };
        loop {
            let prompt = format!("  {title}{star} ({kind_shown}{options}){default}: ");
            let Some(typed) = asker.ask(&prompt) else {
                return Err(json!({"action": "cancel"}));
            };
            match typed.trim() {
                "!decline" => return Err(json!({"action": "decline"})),
                "!cancel" => return Err(json!({"action": "cancel"})),
                "" if def.get("default").is_some() => return Ok(def.get("default").cloned()),
                "" if required => errln!("  {} is required", line_cut(field, FIELD_NAME_SHOWN)),
                "" => return Ok(None),
                typed => match parse(kind, def, typed) {
                    Ok(v) => return Ok(Some(v)),
                    Err(e) => errln!("  {}", shown(&e)),
                },
            }
        }
    }
}

/// The values a field may take, when the schema lists them: `enum`, or the `const`s of
/// a titled `oneOf`/`anyOf` (for a multi-select, its `items`' own).
fn choices(def: &Value) -> Option<Vec<Value>> {
    let of = |def: &Value| {
        if let Some(e) = def["enum"].as_array() {
            return Some(e.clone());
        }
        ["oneOf", "anyOf"].iter().find_map(|k| {
            def[*k]
                .as_array()
                .map(|a| a.iter().filter_map(|o| o.get("const").cloned()).collect())
        })
    };
    match def["type"].as_str() {
        Some("array") => of(&def["items"]),
        _ => of(def),
    }
}

/// A typed answer as the field's type: a boolean from yes/no, a finite number, a
/// multi-select from values separated by commas; then [`check`]ed.
fn parse(kind: &str, def: &Value, text: &str) -> Result<Value, String> {
    let value = match kind {
        "boolean" => match text.to_ascii_lowercase().as_str() {
            "y" | "yes" | "true" => json!(true),
            "n" | "no" | "false" => json!(false),
            _ => return Err("answer yes or no".into()),
        },
        "integer" => json!(text.parse::<i64>().map_err(|_| "a whole number, please")?),
        "number" => {
            let n = text
                .parse::<f64>()
                .ok()
                .filter(|n| n.is_finite())
                .ok_or("a number, please")?;
            json!(n)
        }
        "array" => Value::Array(
            text.split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(|t| json!(t))
                .collect(),
        ),
        _ => json!(text),
    };
    check(def, &value)?;
    // A listed number goes back as the schema lists it (a typed 2 is read as 2.0).
    if let Some(listed) =
        choices(def).and_then(|options| options.into_iter().find(|o| same_value(o, &value)))
    {
        return Ok(listed);
    }
    Ok(value)
}

/// Whether two values are the same, numbers by value: whole numbers exactly, others
/// as floats (a typed `2` is read as 2.0).
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => x == y,
            _ => match (x.as_u64(), y.as_u64()) {
                (Some(x), Some(y)) => x == y,
                _ => x.as_f64() == y.as_f64(),
            },
        },
        _ => a == b,
    }
}

/// Whether `value` is what the field's schema asks for (its type, listed values,
/// length and range): typed and `--answers` values alike; the server checks again.
fn check(def: &Value, value: &Value) -> Result<(), String> {
    let kind = def["type"].as_str().unwrap_or("string");
    let typed = match kind {
        "boolean" => value.is_boolean(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "array" => value
            .as_array()
            .is_some_and(|a| a.iter().all(Value::is_string)),
        _ => value.is_string(),
    };
    if !typed {
        return Err(format!("a value of type {kind} is asked for"));
    }
    if let Some(options) = choices(def) {
        let listed = |v: &Value| options.iter().any(|o| same_value(o, v));
        let all_listed = match value.as_array() {
            Some(items) if kind == "array" => items.iter().all(listed),
            _ => listed(value),
        };
        if !all_listed {
            return Err(format!("one of {}", Value::Array(options)));
        }
    }
    let bound = |key: &str| def[key].as_f64();
    let (count, least, most) = match value {
        Value::String(s) => (s.chars().count() as f64, "minLength", "maxLength"),
        Value::Array(a) => (a.len() as f64, "minItems", "maxItems"),
        Value::Number(n) => (n.as_f64().unwrap_or(0.0), "minimum", "maximum"),
        _ => return Ok(()),
    };
    if let Some(min) = bound(least)
        && count < min
    {
        return Err(format!("at least {min} ({least})"));
    }
    if let Some(max) = bound(most)
        && count > max
    {
        return Err(format!("at most {max} ({most})"));
    }
    Ok(())
}

/// Whether a person can be asked: the answer comes from stdin and the question goes to
/// stderr, so both must be the terminal (`call … 2>log` shows no question, and would
/// wait out the input timeout for an answer nobody knows is asked), and this process
/// must be in its foreground: a background job (`call … &`) that read it, or flushed
/// its input, would be stopped by the terminal (SIGTTIN, SIGTTOU), its deadline with it.
fn on_a_terminal() -> bool {
    std::io::stdin().is_terminal() && std::io::stderr().is_terminal() && in_the_foreground()
}

/// Whether this process's group is the foreground one of the terminal on stdin.
fn in_the_foreground() -> bool {
    // SAFETY: tcgetpgrp and getpgrp take no pointers; a descriptor that is no terminal
    // makes tcgetpgrp fail (-1), which is no group.
    unsafe { libc::tcgetpgrp(0) == libc::getpgrp() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_on_this_machine_or_a_private_network_is_said_to_be_one() {
        for (url, said) in [
            ("http://localhost./x", ", this machine"),
            ("http://app.localhost/x", ", this machine"),
            ("http://0.0.0.0:8080/", ", this machine"),
            ("http://[::ffff:127.0.0.1]/", ", this machine"),
            ("http://[::1]/", ", this machine"),
            ("https://[::ffff:192.168.1.1]/", ", a private network"),
            ("https://100.100.1.1/", ", a private network"),
            ("https://[fd00::1]/", ", a private network"),
            ("https://169.254.1.1/", ", a private network"),
            ("https://100.128.0.1/", ""),
            ("https://example.com/", ""),
            ("https://8.8.8.8/", ""),
        ] {
            let parsed = url::Url::parse(url).expect("url");
            assert_eq!(where_it_is(&parsed), said, "{url}");
        }
    }

    // The lines a person reads say how much is not shown, the same from the request
    // (the terminal) as from its review sent as JSON (the approvals command).
    #[test]
    fn a_sampling_request_is_shown_with_what_is_cut_counted() {
        let mut messages =
            vec![json!({"role": "user", "content": {"type": "text", "text": "x".repeat(40_000)}})];
        messages.extend((0..99).map(
            |i| json!({"role": "assistant", "content": {"type": "text", "text": format!("m{i}")}}),
        ));
        let params = json!({"messages": messages, "systemPrompt": "Be brief."});
        let lines = sampling_shown(&review(&params));
        assert_eq!(lines[0], "system: Be brief.");
        assert!(
            lines[1].ends_with(" …(+39500 more characters)"),
            "{}",
            lines[1]
        );
        assert_eq!(
            lines.last().map(String::as_str),
            Some("(+92 more messages)")
        );
        let sent = serde_json::to_value(review(&params)).expect("json");
        let received: SamplingReview = serde_json::from_value(sent).expect("review");
        assert_eq!(sampling_shown(&received), lines);
    }

    #[test]
    fn a_yes_or_no_is_answered_only_by_a_line_typed_once_it_is_shown() {
        let t0 = std::time::Instant::now();
        let at = |ms| t0 + std::time::Duration::from_millis(ms);
        let shown = at(100);
        // A form field takes what was typed ahead for it; a yes or no does not.
        assert!(answers_it(at(50), shown, None, false));
        assert!(!answers_it(at(50), shown, None, true));
        assert!(answers_it(at(150), shown, None, true));
        // After a withdrawal, a line typed between it and this question was meant for
        // the withdrawn one, whatever this one asks; one typed before it is this one's.
        assert!(!answers_it(at(50), shown, Some(at(20)), false));
        assert!(answers_it(at(10), shown, Some(at(20)), false));
        assert!(answers_it(at(150), shown, Some(at(20)), true));
    }

    #[test]
    fn answers_consent_to_a_url_only_by_their_own_name() {
        let url = |key: &str| {
            let params = json!({"mode": "url", "message": "sign in", "url": "https://a.example/x", "elicitationId": "e"});
            let mut asked = InputRequestContext::new("s", "elicitation/create", params);
            asked.key = key.into();
            asked.call_id = Some(1);
            asked
        };
        let action =
            |key: &str, answers: Value| decide(&url(key), Some(&answers), None)["action"].clone();
        // A field's answer under the same name as the server's key is no consent.
        assert_eq!(action("decision", json!({"decision": "accept"})), "decline");
        assert_eq!(action("k", json!({"!url": "accept"})), "accept");
        assert_eq!(action("k", json!({"k": {"!url": "accept"}})), "accept");
        assert_eq!(action("k", json!({"other": {"!url": "accept"}})), "decline");
    }

    /// A form asked during the call (call 1).
    fn request(schema: Value) -> InputRequestContext {
        let params = json!({"message": "?", "requestedSchema": schema});
        let mut asked = InputRequestContext::new("s", "elicitation/create", params);
        asked.key = "k".into();
        asked.call_id = Some(1);
        asked
    }

    #[test]
    fn answers_fill_by_field_or_key_and_defaults_fill_the_rest() {
        let schema = json!({"properties": {"a": {"type": "boolean", "default": false}, "b": {"type": "string"}}, "required": ["b"]});
        // Not for a server asking outside the call: it could name the call's fields.
        let mut outside = request(schema.clone());
        outside.call_id = None;
        let declined = decide(&outside, Some(&json!({"b": "secret"})), None);
        assert_eq!(declined["action"], "decline", "{declined}");
        assert!(!declined.to_string().contains("secret"));
        let by_field = decide(&request(schema.clone()), Some(&json!({"b": "x"})), None);
        assert_eq!(
            by_field,
            json!({"action": "accept", "content": {"a": false, "b": "x"}})
        );
        let by_key = decide(
            &request(schema.clone()),
            Some(&json!({"k": {"b": "y", "a": true}})),
            None,
        );
        assert_eq!(by_key["content"], json!({"a": true, "b": "y"}));
        assert_eq!(
            decide(&request(schema.clone()), Some(&json!({})), None)["action"],
            "decline",
            "b is required"
        );
        assert_eq!(
            decide(&request(schema), None, None)["action"],
            "decline",
            "no terminal, no answers"
        );
    }

    #[test]
    fn answers_are_held_to_the_fields_schema() {
        let number = json!({"type": "number", "minimum": 1, "maximum": 10});
        assert_eq!(parse("number", &number, "2.5"), Ok(json!(2.5)));
        for bad in ["nan", "inf", "0.5", "11"] {
            assert!(parse("number", &number, bad).is_err(), "{bad}");
        }
        let titled =
            json!({"type": "string", "oneOf": [{"const": "a", "title": "A"}, {"const": "b"}]});
        assert!(parse("string", &titled, "b").is_ok());
        assert!(parse("string", &titled, "c").is_err());
        let several = json!({"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2});
        assert_eq!(parse("array", &several, "x, y"), Ok(json!(["x", "y"])));
        assert!(parse("array", &several, "x, z").is_err());
        assert!(parse("array", &several, "x,y,x").is_err(), "maxItems");
        let short = json!({"type": "string", "maxLength": 3});
        assert!(parse("string", &short, "abcd").is_err());
        // Listed numbers are compared by value: a typed 2 is read as 2.0.
        let listed = json!({"type": "number", "enum": [1, 2, 3]});
        assert_eq!(parse("number", &listed, "2"), Ok(json!(2)));
        assert!(parse("number", &listed, "4").is_err());
        // --answers: a value of another type, or unlisted, is declined.
        let schema = json!({"properties": {"n": number, "s": titled}});
        for answers in [
            json!({"n": "2"}),
            json!({"n": 2, "s": "c"}),
            json!({"n": f64::MAX}),
        ] {
            assert_eq!(
                decide(&request(schema.clone()), Some(&answers), None)["action"],
                "decline",
                "{answers}"
            );
        }
        assert_eq!(
            decide(&request(schema), Some(&json!({"n": 3, "s": "a"})), None),
            json!({"action": "accept", "content": {"n": 3, "s": "a"}})
        );
    }
}
