//! How `mcp-harness call` answers elicitation: from `--answers`, from a form on the
//! terminal, or (neither) by declining. URL-mode requests show the full URL and ask for
//! consent; the program never opens a URL itself.

use std::io::{BufRead, IsTerminal, Write};

use mcp_harness::call::input::{InputError, InputFuture};
use mcp_harness::{InputHandler, InputRequestContext};
use serde_json::{Map, Value, json};

use crate::terminal::line;

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
            let interactive = answers.is_none() && std::io::stdin().is_terminal();
            tokio::task::spawn_blocking(move || {
                let _one_at_a_time = prompt_lock();
                decide(&request, answers.as_ref(), interactive)
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

/// Messages of a sampling request shown in full (up to [`SHOWN_CHARS`] each).
const SHOWN_MESSAGES: usize = 8;
/// Characters of one message or system prompt shown.
const SHOWN_CHARS: usize = 500;

/// Text for the terminal on one line, cut at [`SHOWN_CHARS`] with how much was cut.
fn shown(text: &str) -> String {
    let one = line(text);
    let total = one.chars().count();
    let mut out: String = one.chars().take(SHOWN_CHARS).collect();
    if total > SHOWN_CHARS {
        out.push_str(&format!(" …(+{} more characters)", total - SHOWN_CHARS));
    }
    out
}

/// What a person approves of a sampling request, a line each: the instructions the
/// model would follow, that is the system prompt and every message (up to
/// [`SHOWN_MESSAGES`]), each cut visibly.
pub fn sampling_shown(params: &Value) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(system) = params["systemPrompt"].as_str().filter(|s| !s.is_empty()) {
        out.push(format!("system: {}", shown(system)));
    }
    let messages = params["messages"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    // Every block of a message: text in full (cut visibly), other kinds by their type,
    // so that no block hides behind the first.
    let block = |b: &Value| match b["type"].as_str() {
        Some("text") => b["text"].as_str().unwrap_or("").to_string(),
        Some(kind) => format!("[{kind} {}]", b["mimeType"].as_str().unwrap_or("")),
        None => "[?]".to_string(),
    };
    for m in messages.iter().take(SHOWN_MESSAGES) {
        let text = match &m["content"] {
            Value::Array(blocks) => blocks.iter().map(block).collect::<Vec<_>>().join(" "),
            one => block(one),
        };
        out.push(format!(
            "{}: {}",
            line(m["role"].as_str().unwrap_or("?")),
            shown(&text)
        ));
    }
    if messages.len() > SHOWN_MESSAGES {
        out.push(format!(
            "(+{} more messages)",
            messages.len() - SHOWN_MESSAGES
        ));
    }
    out
}

/// Approves sampling requests on the terminal (the command line's approver): shows who
/// asks, for how many tokens, and the first message, and asks y/N. Without a terminal
/// it declines.
pub struct CliApprover;

impl InputHandler for CliApprover {
    fn answer(&self, request: InputRequestContext) -> InputFuture {
        Box::pin(async move {
            let interactive = std::io::stdin().is_terminal();
            tokio::task::spawn_blocking(move || {
                let _one_at_a_time = prompt_lock();
                if !interactive {
                    eprintln!("mcp-harness: sampling declined: approval needs a terminal");
                    return json!({"action": "decline"});
                }
                let p = &request.params;
                let messages = p["messages"].as_array().map_or(0, Vec::len);
                eprintln!(
                    "server {} asks the model for up to {} tokens, {} message(s):",
                    line(&request.server),
                    p["maxTokens"].as_u64().unwrap_or(0),
                    messages,
                );
                for shown in sampling_shown(p) {
                    eprintln!("  {shown}");
                }
                match ask("allow? [y/N] ").as_deref().map(str::trim) {
                    Some("y" | "Y" | "yes") => json!({"action": "accept"}),
                    _ => json!({"action": "decline"}),
                }
            })
            .await
            .map_err(|e| InputError::Failed(e.to_string()))
        })
    }
}

fn decline(why: &str) -> Value {
    eprintln!("mcp-harness: elicitation declined: {why}");
    json!({"action": "decline"})
}

fn decide(request: &InputRequestContext, answers: Option<&Value>, interactive: bool) -> Value {
    let p = &request.params;
    if p["mode"] == "url" {
        return url_mode(request, answers, interactive);
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
    match answers {
        Some(answers) => form.answer_from(request, answers),
        None if interactive => form.ask(request),
        None => {
            decline("stdin is not a terminal; pass --answers '{...}' (or '{}' for the defaults)")
        }
    }
}

/// A URL-mode request: shown in full (without anything that could disguise it), never
/// opened, accepted only with consent.
fn url_mode(request: &InputRequestContext, answers: Option<&Value>, interactive: bool) -> Value {
    let p = &request.params;
    let message: String = line(p["message"].as_str().unwrap_or(""))
        .chars()
        .take(500)
        .collect();
    let raw = p["url"].as_str().unwrap_or("");
    // Only a web page a person can judge by its host: https (http on this machine
    // only), no credentials in it, of a length a terminal shows whole.
    let parsed = url::Url::parse(raw).ok().filter(|u| {
        let local = matches!(u.host_str(), Some("localhost" | "127.0.0.1" | "[::1]"));
        u.as_str().len() <= 2048
            && u.username().is_empty()
            && u.password().is_none()
            && (u.scheme() == "https" || (u.scheme() == "http" && local))
    });
    let Some(parsed) = parsed else {
        return decline(
            "the URL is not an https URL of at most 2048 characters without credentials",
        );
    };
    eprintln!(
        "Server {} asks you to open this URL yourself (host {}):\n  {}\n  ({message})",
        line(&request.server),
        line(parsed.host_str().unwrap_or("")),
        line(parsed.as_str()),
    );
    let consent = match answers {
        Some(a) => a.get(&request.key).and_then(Value::as_str) == Some("accept"),
        None if interactive => ask("Done, and do you consent? [y/N] ")
            .is_some_and(|l| l.trim().eq_ignore_ascii_case("y")),
        None => false,
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
        let source = answers
            .get(&request.key)
            .filter(|v| v.is_object())
            .unwrap_or(answers);
        let mut content = Map::new();
        for (field, def) in self.props {
            match source.get(field).or_else(|| def.get("default")) {
                Some(v) => {
                    content.insert(field.clone(), v.clone());
                }
                None if self.required.contains(&field.as_str()) => {
                    return decline(&format!(
                        "--answers has no value for required field {:?}",
                        line(field)
                    ));
                }
                None => {}
            }
        }
        json!({"action": "accept", "content": content})
    }

    /// On a terminal: one prompt per field.
    fn ask(&self, request: &InputRequestContext) -> Value {
        let message = line(request.params["message"].as_str().unwrap_or(""));
        eprintln!("\nServer {} asks: {message}", request.server);
        eprintln!("(press Enter for the default; type !decline or !cancel to refuse)");
        let mut content = Map::new();
        for (field, def) in self.props {
            match self.ask_field(field, def) {
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
    fn ask_field(&self, field: &str, def: &Value) -> Result<Option<Value>, Value> {
        let kind = def["type"].as_str().unwrap_or("string");
        let options = def["enum"]
            .as_array()
            .map(|e| format!(" {}", line(&Value::Array(e.clone()).to_string())))
            .unwrap_or_default();
        let default = def
            .get("default")
            .map(|d| format!(" [{}]", line(&d.to_string())))
            .unwrap_or_default();
        let title = line(
            def["title"]
                .as_str()
                .or(def["description"].as_str())
                .unwrap_or(field),
        );
        let required = self.required.contains(&field);
        let star = if required { "*" } else { "" };
        loop {
            let prompt = format!("  {title}{star} ({}{options}){default}: ", line(kind));
            let Some(typed) = ask(&prompt) else {
                return Err(json!({"action": "cancel"}));
            };
            match typed.trim() {
                "!decline" => return Err(json!({"action": "decline"})),
                "!cancel" => return Err(json!({"action": "cancel"})),
                "" if def.get("default").is_some() => return Ok(def.get("default").cloned()),
                "" if required => eprintln!("  {} is required", line(field)),
                "" => return Ok(None),
                typed => match parse(kind, def, typed) {
                    Ok(v) => return Ok(Some(v)),
                    Err(e) => eprintln!("  {}", line(&e)),
                },
            }
        }
    }
}

fn ask(prompt: &str) -> Option<String> {
    eprint!("{prompt}");
    let _ = std::io::stderr().flush();
    let mut line = String::new();
    match std::io::stdin().lock().read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(line),
    }
}

fn parse(kind: &str, def: &Value, text: &str) -> Result<Value, String> {
    let value = match kind {
        "boolean" => match text.to_ascii_lowercase().as_str() {
            "y" | "yes" | "true" => json!(true),
            "n" | "no" | "false" => json!(false),
            _ => return Err("answer yes or no".into()),
        },
        "integer" => json!(text.parse::<i64>().map_err(|_| "a whole number, please")?),
        "number" => json!(text.parse::<f64>().map_err(|_| "a number, please")?),
        _ => json!(text),
    };
    if let Some(options) = def["enum"].as_array()
        && !options.contains(&value)
    {
        return Err(format!("one of {}", Value::Array(options.clone())));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(schema: Value) -> InputRequestContext {
        InputRequestContext {
            server: "s".into(),
            method: "elicitation/create".into(),
            params: json!({"message": "?", "requestedSchema": schema}),
            agent_id: None,
            call_id: None,
            shared: false,
            key: "k".into(),
        }
    }

    #[test]
    fn answers_fill_by_field_or_key_and_defaults_fill_the_rest() {
        let schema = json!({"properties": {"a": {"type": "boolean", "default": false}, "b": {"type": "string"}}, "required": ["b"]});
        let by_field = decide(&request(schema.clone()), Some(&json!({"b": "x"})), false);
        assert_eq!(
            by_field,
            json!({"action": "accept", "content": {"a": false, "b": "x"}})
        );
        let by_key = decide(
            &request(schema.clone()),
            Some(&json!({"k": {"b": "y", "a": true}})),
            false,
        );
        assert_eq!(by_key["content"], json!({"a": true, "b": "y"}));
        assert_eq!(
            decide(&request(schema.clone()), Some(&json!({})), false)["action"],
            "decline",
            "b is required"
        );
        assert_eq!(
            decide(&request(schema), None, false)["action"],
            "decline",
            "no terminal, no answers"
        );
    }
}
