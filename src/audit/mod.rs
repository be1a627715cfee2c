//! The audit trail: one `started` record when a call is admitted or denied, one
//! `finished` record with its outcome, as JSON Lines in a file.
//!
//! Calls append records to an [`AuditSink`]; the [`AuditActor`] drains it and writes
//! in batches (every [`AuditConfig::batch`] records, and on a timer), and always before
//! it answers `Flush`, which `shutdown()` sends, and when it is dropped. A write that fails keeps the records buffered
//! for the next attempt. Every record is also a `tracing` event (target
//! `mcp_harness::audit`). Arguments are recorded per [`Redaction`]; auth contexts are
//! recorded as a SHA-256 prefix, never in clear.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::config::duration;
use crate::registry::cache::sha256_hex;

/// How much of a call's arguments the audit trail keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Redaction {
    /// No arguments.
    None,
    /// Argument names only (the default).
    #[default]
    Keys,
    /// Arguments in full, except the keys in `redact_keys`.
    Full,
}

/// Audit settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// The JSON Lines file; no file (tracing events only) when `None`.
    pub path: Option<PathBuf>,
    /// How arguments are recorded.
    pub redaction: Redaction,
    /// Argument keys whose values are always replaced by `"[redacted]"`, at any depth.
    pub redact_keys: Vec<String>,
    /// Records per write.
    pub batch: usize,
    /// Longest a record waits in the buffer.
    #[serde(with = "duration")]
    pub flush_every: Duration,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            path: None,
            redaction: Redaction::Keys,
            redact_keys: vec![
                "password".into(),
                "token".into(),
                "secret".into(),
                "api_key".into(),
                "authorization".into(),
            ],
            batch: 64,
            flush_every: Duration::from_millis(200),
        }
    }
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
            Redaction::Full => self.scrub(args),
        }
    }

    fn scrub(&self, v: &Value) -> Value {
        match v {
            Value::Object(map) => {
                let mut out = Map::new();
                for (k, v) in map {
                    let hidden = self.redact_keys.iter().any(|r| r.eq_ignore_ascii_case(k));
                    out.insert(
                        k.clone(),
                        if hidden {
                            json!("[redacted]")
                        } else {
                            self.scrub(v)
                        },
                    );
                }
                Value::Object(out)
            }
            Value::Array(items) => Value::Array(items.iter().map(|i| self.scrub(i)).collect()),
            other => other.clone(),
        }
    }
}

/// A hashed auth context, as records carry it.
pub fn hash_context(ctx: Option<&str>) -> Option<String> {
    ctx.map(|c| sha256_hex(c.as_bytes())[..16].to_string())
}

/// Messages of the audit actor.
pub enum AuditMsg {
    /// Write everything buffered; answer when it is on disk.
    Flush(RpcReplyPort<()>),
    /// A batch is full, or the timer fired: write what is buffered.
    Tick,
}

/// Records waiting for the audit actor.
type Pending = Arc<Mutex<Vec<Value>>>;

/// Where calls put their records: a buffer shared with the audit actor, which drains it.
/// Recording never waits on the actor, and wakes it only when a batch is full (the
/// actor's timer takes the rest), so the audit trail costs the call path no task switch.
#[derive(Clone)]
pub struct AuditSink {
    pending: Pending,
    batch: usize,
    actor: ActorRef<AuditMsg>,
}

impl AuditSink {
    /// Appends one record (a JSON object with at least `event` and `call_id`).
    pub fn record(&self, record: Value) {
        tracing::info!(target: "mcp_harness::audit", record = %record, "audit");
        let full = {
            let mut pending = self.pending.lock();
            pending.push(record);
            pending.len() >= self.batch
        };
        if full {
            let _ = self.actor.send_message(AuditMsg::Tick);
        }
    }
}

/// Starts the audit actor under `supervisor` and returns it with its sink.
pub async fn spawn(
    config: AuditConfig,
    supervisor: ractor::ActorCell,
) -> Result<(ActorRef<AuditMsg>, AuditSink), ractor::SpawnErr> {
    let pending = Pending::default();
    let batch = config.batch.max(1);
    let (actor, _) =
        Actor::spawn_linked(None, AuditActor, (config, pending.clone()), supervisor).await?;
    Ok((
        actor.clone(),
        AuditSink {
            pending,
            batch,
            actor,
        },
    ))
}

/// The audit actor's state.
pub struct AuditState {
    file: Option<std::fs::File>,
    pending: Pending,
    buffer: Vec<Value>,
}

impl AuditState {
    fn write(&mut self) {
        self.buffer.append(&mut self.pending.lock());
        if self.buffer.is_empty() {
            return;
        }
        let Some(file) = self.file.as_mut() else {
            self.buffer.clear();
            return;
        };
        let mut bytes = Vec::with_capacity(self.buffer.len() * 256);
        for r in &self.buffer {
            let _ = serde_json::to_writer(&mut bytes, r);
            bytes.push(b'\n');
        }
        match file.write_all(&bytes).and_then(|_| file.flush()) {
            Ok(()) => self.buffer.clear(),
            // Kept for the next attempt: an audit record is never dropped on purpose.
            Err(e) => {
                tracing::error!(error = %e, records = self.buffer.len(), "audit write failed; will retry")
            }
        }
    }
}

impl Drop for AuditState {
    fn drop(&mut self) {
        // The actor may be killed (the harness's last handle dropped) without post_stop:
        // what is buffered is still written.
        self.write();
    }
}

/// Writes the audit trail; see the module docs.
pub struct AuditActor;

impl Actor for AuditActor {
    type Msg = AuditMsg;
    type State = AuditState;
    type Arguments = (AuditConfig, Pending);

    async fn pre_start(
        &self,
        myself: ActorRef<AuditMsg>,
        (config, pending): (AuditConfig, Pending),
    ) -> Result<AuditState, ActorProcessingErr> {
        let file = match &config.path {
            Some(path) => {
                if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                    std::fs::create_dir_all(parent)?;
                }
                Some(
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(path)?,
                )
            }
            None => None,
        };
        myself.send_interval(config.flush_every, || AuditMsg::Tick);
        Ok(AuditState {
            file,
            pending,
            buffer: Vec::new(),
        })
    }

    async fn handle(
        &self,
        _: ActorRef<AuditMsg>,
        msg: AuditMsg,
        state: &mut AuditState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            AuditMsg::Flush(reply) => {
                state.write();
                let _ = reply.send(());
            }
            AuditMsg::Tick => state.write(),
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _: ActorRef<AuditMsg>,
        state: &mut AuditState,
    ) -> Result<(), ActorProcessingErr> {
        state.write();
        Ok(())
    }
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
        assert_eq!(full["nested"]["token"], "[redacted]");
        assert_eq!(full["nested"]["ok"], 1);
        c.redaction = Redaction::Keys;
        assert_eq!(c.redact(&args), json!(["Password", "nested", "path"]));
        c.redaction = Redaction::None;
        assert_eq!(c.redact(&args), Value::Null);
        assert_eq!(hash_context(Some("x")).map(|h| h.len()), Some(16));
    }
}
