//! `mcp-harness approvals`: the input requests a running gateway (or an embedded
//! harness serving `gateway::admin`) holds for a person, and their answers.

use std::time::Duration;

use anyhow::{Context, bail};
use mcp_harness::call::input::SamplingReview;
use serde_json::{Value, json};

use crate::commands::UsageError;
use crate::terminal::line;

/// What to do.
#[derive(Clone, Debug, clap::Subcommand)]
pub enum ApprovalAction {
    /// Approve request ID (a sampling request: the model is called).
    Accept { id: u64 },
    /// Decline request ID (the server is told it was refused).
    Decline { id: u64 },
}

#[derive(Clone, Debug, clap::Args)]
pub struct ApprovalsArgs {
    /// The admin endpoint: http://ADDR (as `serve --admin ADDR` printed).
    #[arg(long, value_name = "URL")]
    pub from: String,
    /// The admin token (else MCP_HARNESS_ADMIN_TOKEN; a flag is visible to other
    /// users in the process list, the variable is not).
    #[arg(long)]
    pub token: Option<String>,
    /// Print the pending requests as JSON (when listing them).
    #[arg(long)]
    pub json: bool,
    #[command(subcommand)]
    pub action: Option<ApprovalAction>,
}

/// A request in one line: its first text.
fn summary(params: &Value) -> String {
    let text = params
        .pointer("/messages/0/content/text")
        .or_else(|| params.pointer("/messages/0/content/0/text"))
        .or_else(|| params.get("message"))
        .and_then(Value::as_str)
        .unwrap_or("");
    // Whole up to 80 characters, else 79 and `…`; the note of what is hidden after.
    let (one, unseen) = crate::terminal::sanitize_counted(text, false);
    let mut s = if one.chars().count() > 80 {
        one.chars().take(79).collect::<String>() + "…"
    } else {
        one
    };
    s.push_str(&crate::terminal::unseen_note(unseen));
    // Too large to show whole even cut short: said, never a line that looks like the
    // whole request (it may be accepted blind otherwise).
    if let Some(omitted) = params.get("omitted").and_then(Value::as_str) {
        let said = crate::terminal::line_cut(omitted, 200);
        s.push_str(&format!(" [the rest not shown: {said}]"));
    }
    s
}

pub async fn run(args: ApprovalsArgs) -> anyhow::Result<u8> {
    if args.json && args.action.is_some() {
        return Err(crate::commands::UsageError(anyhow::anyhow!(
            "--json is for listing what waits, not with accept or decline"
        ))
        .into());
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let from = crate::commands::from_url(&args.from)?;
    let http = mcp_harness::transport::client_builder(&from)
        .timeout(Duration::from_secs(10))
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let base = args
        .from
        .trim_end_matches('/')
        .trim_end_matches("/approvals");
    let token = match args
        .token
        .clone()
        .or_else(|| std::env::var("MCP_HARNESS_ADMIN_TOKEN").ok())
    {
        Some(t) if !t.trim().is_empty() => t,
        _ => {
            return Err(UsageError(anyhow::anyhow!(
                "an admin token is needed: --token or MCP_HARNESS_ADMIN_TOKEN"
            ))
            .into());
        }
    };
    crate::commands::token_may_go_to(&from, "the admin token")?;
    let auth = format!("Bearer {}", token.trim());
    match args.action {
        None => {
            let resp = http
                .get(format!("{base}/approvals"))
                .header("authorization", &auth)
                .send()
                .await
                .with_context(|| format!("cannot reach {}", line(base)))?;
            if resp.status() == 401 {
                return Err(UsageError(anyhow::anyhow!("the admin token was refused")).into());
            }
            if !resp.status().is_success() {
                bail!("{}: HTTP {}", line(base), resp.status().as_u16());
            }
            // The queue is bounded at the gateway; a larger answer is not its.
            let text = crate::watch::text_capped(resp, 16 << 20).await?;
            let body: Value = serde_json::from_str(&text).context("the answer is not JSON")?;
            let pending = body["pending"].as_array().cloned().unwrap_or_default();
            if args.json {
                outln!(
                    "{}",
                    crate::terminal::json_text(&serde_json::to_string_pretty(&pending)?)
                );
            } else if pending.is_empty() {
                errln!("nothing is waiting");
            } else {
                for p in &pending {
                    outln!(
                        "{:<6} {:<16} {:<24} agent={:<12} {}",
                        line(&p["id"].to_string()),
                        line(p["server"].as_str().unwrap_or("-")),
                        line(p["method"].as_str().unwrap_or("-")),
                        line(p["agent"].as_str().unwrap_or("-")),
                        summary(&p["params"])
                    );
                    // What accepting it lets the model read, as the terminal approver
                    // shows it: not only the first message's first words.
                    // The gateway's review of the request as sent (its params above are
                    // cut for the listing, and would miscount what was cut).
                    if p["method"] == "sampling/createMessage" {
                        match serde_json::from_value::<SamplingReview>(p["review"].clone()) {
                            Ok(review) => {
                                for shown in crate::elicit::sampling_shown(&review) {
                                    outln!("       {shown}");
                                }
                            }
                            // A gateway of an earlier version sends none.
                            Err(_) => outln!("       (no review of the request came with it)"),
                        }
                    }
                }
            }
            Ok(crate::commands::OK)
        }
        Some(action) => {
            let (id, answer) = match action {
                ApprovalAction::Accept { id } => (id, json!({"action": "accept"})),
                ApprovalAction::Decline { id } => (id, json!({"action": "decline"})),
            };
            let resp = http
                .post(format!("{base}/approvals/{id}"))
                .header("authorization", &auth)
                .header("content-type", "application/json")
                .body(answer.to_string())
                .send()
                .await
                .with_context(|| format!("cannot reach {}", line(base)))?;
            match resp.status().as_u16() {
                200 => {
                    errln!("request {id} answered");
                    Ok(crate::commands::OK)
                }
                401 => Err(UsageError(anyhow::anyhow!("the admin token was refused")).into()),
                404 => Err(UsageError(anyhow::anyhow!("request {id} is not waiting")).into()),
                other => bail!("{}: HTTP {other}", line(base)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A request whose params the gateway could not show, even cut short, is said to be
    // hidden, not listed as a blank line.
    #[test]
    fn a_request_too_large_to_show_says_so() {
        let shown = summary(&serde_json::json!({
            "omitted": "params of more than 70000 bytes, even cut short",
            "_meta": {},
        }));
        assert!(
            shown.contains("not shown") && shown.contains("70000"),
            "{shown}"
        );
        let first = summary(&serde_json::json!({
            "omitted": "params of more than 70000 bytes, even cut short",
            "messages": [{"role": "user", "content": {"type": "text", "text": "Summarize"}}],
        }));
        assert!(
            first.starts_with("Summarize [the rest not shown"),
            "{first}"
        );
        let plain = summary(&serde_json::json!({"message": "Delete?"}));
        assert_eq!(plain, "Delete?");
    }
}
