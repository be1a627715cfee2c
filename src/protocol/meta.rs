//! Protocol versions and the per-request `_meta` envelope (spec section A).
//!
//! Revision 2026-07-28 is stateless: every request carries the protocol version, the
//! client's capabilities for that request, and the client's identity in
//! `params._meta`. The harness puts the envelope on every request it sends, to servers
//! of both eras (legacy servers ignore keys they do not know).

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// The modern protocol revision.
pub const MODERN: &str = "2026-07-28";
/// The newest legacy revision (handshake era).
pub const LEGACY_2025_11_25: &str = "2025-11-25";
/// The oldest legacy revision the harness speaks.
pub const LEGACY_2025_06_18: &str = "2025-06-18";
/// Legacy revisions the harness accepts from `initialize`, newest first.
pub const LEGACY_VERSIONS: &[&str] = &[LEGACY_2025_11_25, LEGACY_2025_06_18];

/// `_meta` key: the protocol version of this one request.
pub const KEY_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
/// `_meta` key: the client capabilities that apply to this one request.
pub const KEY_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
/// `_meta` key: the client's self-reported identity.
pub const KEY_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
/// Result `_meta` key: the server's self-reported identity.
pub const KEY_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

/// True when `version` is a modern revision: a date `YYYY-MM-DD` of 2026-07-28 or later
/// (such dates compare as text). Anything else a server names (`latest`, `3`,
/// `2026-07-28-draft`) is none.
pub fn is_modern_version(version: &str) -> bool {
    let b = version.as_bytes();
    let dated = b.len() == 10
        && b.iter().enumerate().all(|(i, c)| {
            if i == 4 || i == 7 {
                *c == b'-'
            } else {
                c.is_ascii_digit()
            }
        });
    dated && version >= MODERN
}

/// An MCP `Implementation`: a name and a version, plus optional display fields.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Implementation {
    /// Program name.
    pub name: String,
    /// Program version.
    pub version: String,
    /// Optional fields (`title`, `description`, `websiteUrl`, `icons`), kept as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Implementation {
    /// An implementation with just a name and a version.
    pub fn new(name: impl Into<String>, version: impl Into<String>) -> Self {
        Implementation {
            name: name.into(),
            version: version.into(),
            extra: Map::new(),
        }
    }

    /// This crate, as it introduces itself to servers by default.
    pub fn harness() -> Self {
        Implementation::new("mcp-harness", env!("CARGO_PKG_VERSION"))
    }
}

/// The envelope stamped into `params._meta` of every request. Immutable once made: its
/// JSON is rendered once, and a request whose `_meta` holds nothing else gets that text
/// as is (serializing the three keys and the client's identity was most of the cost of
/// writing a request).
#[derive(Clone, Debug)]
pub struct MetaEnvelope {
    protocol_version: String,
    client_capabilities: Value,
    client_info: Value,
    /// The three keys as one JSON object. Serializing our own values cannot fail; were
    /// it `None`, each request would write them itself.
    rendered: Option<Box<RawValue>>,
    /// The same text before and after the capabilities, for a request that declares
    /// others (a gateway's call declares its downstream client's).
    around: Option<(Box<str>, Box<str>)>,
}

impl PartialEq for MetaEnvelope {
    fn eq(&self, other: &MetaEnvelope) -> bool {
        (
            &self.protocol_version,
            &self.client_capabilities,
            &self.client_info,
        ) == (
            &other.protocol_version,
            &other.client_capabilities,
            &other.client_info,
        )
    }
}

impl MetaEnvelope {
    /// An envelope naming `protocol_version` (`io.modelcontextprotocol/protocolVersion`,
    /// and on HTTP `MCP-Protocol-Version`), declaring `client_capabilities` (`{}`
    /// declares none) and introducing the client as `client_info` (an
    /// [`Implementation`] as JSON).
    pub fn new(
        protocol_version: impl Into<String>,
        client_capabilities: Value,
        client_info: Value,
    ) -> MetaEnvelope {
        let mut envelope = MetaEnvelope {
            protocol_version: protocol_version.into(),
            client_capabilities,
            client_info,
            rendered: None,
            around: None,
        };
        // Rendered by the path that writes it when there is no rendering, so that both
        // write the same bytes, keys in the same order.
        let rendered = serde_json::value::to_raw_value(&StampedMeta {
            existing: None,
            stamp: Stamp {
                envelope: &envelope,
                capabilities: None,
            },
        })
        .ok();
        envelope.rendered = rendered;
        fn json(v: &impl Serialize) -> Option<String> {
            serde_json::to_string(v).ok()
        }
        envelope.around = (|| {
            let head = format!(
                "{{{}:{},{}:",
                json(&KEY_PROTOCOL_VERSION)?,
                json(&envelope.protocol_version)?,
                json(&KEY_CLIENT_CAPABILITIES)?,
            );
            let tail = format!(
                ",{}:{}}}",
                json(&KEY_CLIENT_INFO)?,
                json(&envelope.client_info)?
            );
            Some((head.into(), tail.into()))
        })();
        envelope
    }

    /// The same envelope naming `version` instead.
    pub fn with_protocol_version(&self, version: impl Into<String>) -> MetaEnvelope {
        MetaEnvelope::new(
            version,
            self.client_capabilities.clone(),
            self.client_info.clone(),
        )
    }

    /// The protocol version it names.
    pub fn protocol_version(&self) -> &str {
        &self.protocol_version
    }

    /// The client capabilities it declares.
    pub fn client_capabilities(&self) -> &Value {
        &self.client_capabilities
    }

    /// The client's identity it carries.
    pub fn client_info(&self) -> &Value {
        &self.client_info
    }

    /// Returns `params` (created as `{}` when absent) with the envelope's keys in its
    /// `_meta`. Other `_meta` keys the caller set (a `progressToken`, trace context) stay.
    pub fn stamp(&self, params: Option<Value>) -> Value {
        self.stamp_with(params, None)
    }

    /// [`MetaEnvelope::stamp`], declaring `capabilities` for this request instead of the
    /// envelope's own (capabilities are per request in 2026-07-28).
    pub fn stamp_with(&self, params: Option<Value>, capabilities: Option<&Value>) -> Value {
        let mut params = match params {
            Some(Value::Object(map)) => map,
            // Params that are not an object cannot carry `_meta`; MCP params always are.
            Some(other) => return other,
            None => Map::new(),
        };
        let meta = params
            .entry("_meta")
            .or_insert_with(|| Value::Object(Map::new()));
        if !meta.is_object() {
            *meta = Value::Object(Map::new());
        }
        if let Value::Object(meta) = meta {
            meta.insert(
                KEY_PROTOCOL_VERSION.into(),
                Value::String(self.protocol_version.clone()),
            );
            let capabilities = capabilities.unwrap_or(&self.client_capabilities);
            meta.insert(KEY_CLIENT_CAPABILITIES.into(), capabilities.clone());
            meta.insert(KEY_CLIENT_INFO.into(), self.client_info.clone());
        }
        Value::Object(params)
    }
}

/// One request's envelope, by reference: written into `params._meta` while the request
/// is serialized ([`super::Message::write_stamped_line`]), so that neither the params
/// nor the envelope is copied per request.
#[derive(Clone, Copy, Debug)]
pub struct Stamp<'a> {
    /// The connection's envelope.
    pub envelope: &'a MetaEnvelope,
    /// This request's capabilities, when not the envelope's own.
    pub capabilities: Option<&'a Value>,
}

impl<'a> Stamp<'a> {
    /// The protocol version the request names.
    pub fn version(&self) -> &str {
        &self.envelope.protocol_version
    }

    /// The `_meta` a request with `existing` in its own gets, as text rendered once,
    /// when that is all there is to it (nothing else in its `_meta`): the whole
    /// envelope for the envelope's own capabilities (the call path names its
    /// capabilities on every request; they are most often the envelope's own, a cheap
    /// comparison of a few keys), or the text around other capabilities.
    pub(crate) fn text(&self, existing: Option<&Map<String, Value>>) -> Option<MetaText<'a>> {
        let e = self.envelope;
        if !existing.is_none_or(|m| m.is_empty()) {
            return None;
        }
        let capabilities = match self.capabilities {
            Some(c) if *c != e.client_capabilities => c,
            _ => return e.rendered.as_deref().map(MetaText::Whole),
        };
        let (head, tail) = e.around.as_ref()?;
        Some(MetaText::Around {
            head,
            capabilities,
            tail,
        })
    }

    /// [`Stamp::text`], when it is the whole envelope.
    pub(crate) fn rendered(&self, existing: Option<&Map<String, Value>>) -> Option<&'a RawValue> {
        match self.text(existing)? {
            MetaText::Whole(rendered) => Some(rendered),
            MetaText::Around { .. } => None,
        }
    }
}

/// A request's `_meta` from text rendered once; see [`Stamp::text`].
pub(crate) enum MetaText<'a> {
    /// The envelope, whole.
    Whole(&'a RawValue),
    /// The envelope with other capabilities.
    Around {
        head: &'a str,
        capabilities: &'a Value,
        tail: &'a str,
    },
}

impl MetaText<'_> {
    /// Appends the `_meta` object. Serializing a `Value` into a `Vec` cannot fail.
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        match self {
            MetaText::Whole(rendered) => out.extend_from_slice(rendered.get().as_bytes()),
            MetaText::Around {
                head,
                capabilities,
                tail,
            } => {
                out.extend_from_slice(head.as_bytes());
                let _ = serde_json::to_writer(&mut *out, capabilities);
                out.extend_from_slice(tail.as_bytes());
            }
        }
    }
}

/// `params` with the stamp's `_meta` keys merged in, as serialization writes it.
pub(crate) struct StampedParams<'a> {
    pub(crate) params: Option<&'a Value>,
    pub(crate) stamp: Stamp<'a>,
}

impl Serialize for StampedParams<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let object = match self.params {
            None => None,
            Some(Value::Object(map)) => Some(map),
            // Params that are not an object cannot carry `_meta`; MCP params always are.
            Some(other) => return other.serialize(s),
        };
        let mut map = s.serialize_map(None)?;
        for (k, v) in object.into_iter().flatten() {
            if k != "_meta" {
                map.serialize_entry(k, v)?;
            }
        }
        let existing = object
            .and_then(|o| o.get("_meta"))
            .and_then(Value::as_object);
        map.serialize_entry(
            "_meta",
            &StampedMeta {
                existing,
                stamp: self.stamp,
            },
        )?;
        map.end()
    }
}

struct StampedMeta<'a> {
    existing: Option<&'a Map<String, Value>>,
    stamp: Stamp<'a>,
}

impl Serialize for StampedMeta<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let ours = [
            KEY_PROTOCOL_VERSION,
            KEY_CLIENT_CAPABILITIES,
            KEY_CLIENT_INFO,
        ];
        let e = self.stamp.envelope;
        if let Some(rendered) = self.stamp.rendered(self.existing) {
            return rendered.serialize(s);
        }
        let mut map = s.serialize_map(None)?;
        for (k, v) in self.existing.into_iter().flatten() {
            if !ours.contains(&k.as_str()) {
                map.serialize_entry(k, v)?;
            }
        }
        map.serialize_entry(KEY_PROTOCOL_VERSION, &e.protocol_version)?;
        map.serialize_entry(
            KEY_CLIENT_CAPABILITIES,
            self.stamp.capabilities.unwrap_or(&e.client_capabilities),
        )?;
        map.serialize_entry(KEY_CLIENT_INFO, &e.client_info)?;
        map.end()
    }
}

/// The protocol version a request's `_meta` names, if any.
pub fn requested_version(params: Option<&Value>) -> Option<&str> {
    params?.get("_meta")?.get(KEY_PROTOCOL_VERSION)?.as_str()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn stamping_keeps_the_callers_params_and_meta_keys() {
        let env = MetaEnvelope::new(
            MODERN,
            json!({"elicitation":{}}),
            serde_json::to_value(Implementation::new("t", "1")).unwrap_or_default(),
        );
        let p = env.stamp(Some(json!({"name":"x","_meta":{"progressToken":5}})));
        assert_eq!(p["name"], "x");
        assert_eq!(p["_meta"]["progressToken"], 5);
        assert_eq!(p["_meta"][KEY_PROTOCOL_VERSION], MODERN);
        assert_eq!(
            p["_meta"][KEY_CLIENT_CAPABILITIES],
            json!({"elicitation":{}})
        );
        assert_eq!(p["_meta"][KEY_CLIENT_INFO]["name"], "t");
        assert_eq!(requested_version(Some(&p)), Some(MODERN));
        // A request with no params still gets `params._meta`.
        assert!(env.stamp(None)["_meta"].is_object());
    }

    #[test]
    fn a_stamped_request_serializes_like_a_stamped_value() {
        let env = MetaEnvelope::new(
            MODERN,
            json!({"elicitation":{}}),
            json!({"name": "t", "version": "1"}),
        );
        let params = json!({"name":"x","_meta":{"progressToken":5, KEY_PROTOCOL_VERSION: "old"}});
        let caps = json!({"roots": {}});
        let stamp = Stamp {
            envelope: &env,
            capabilities: Some(&caps),
        };
        let written = serde_json::to_value(StampedParams {
            params: Some(&params),
            stamp,
        })
        .expect("serializes");
        assert_eq!(written, env.stamp_with(Some(params), Some(&caps)));
        let none = serde_json::to_value(StampedParams {
            params: None,
            stamp,
        })
        .expect("none");
        assert_eq!(none["_meta"][KEY_PROTOCOL_VERSION], MODERN);
    }

    #[test]
    fn the_envelope_rendered_once_writes_what_stamping_does() {
        let env = MetaEnvelope::new(MODERN, json!({}), json!({"name": "t", "version": "1"}));
        let own = json!({});
        for stamp in [
            Stamp {
                envelope: &env,
                capabilities: None,
            },
            Stamp {
                envelope: &env,
                capabilities: Some(&own),
            },
        ] {
            // No other `_meta` key: the rendered text; an empty `_meta` counts as none.
            for params in [
                json!({"name": "x", "arguments": {"a": [1]}}),
                json!({"_meta": {}}),
            ] {
                let request = super::super::Request {
                    id: super::super::RequestId::Number(7),
                    method: "tools/call".into(),
                    params: Some(params.clone()),
                };
                let mut line = Vec::new();
                super::super::Message::write_stamped_line(
                    (&request).into(),
                    Some(stamp),
                    &mut line,
                );
                let written: Value = serde_json::from_slice(&line).expect("one JSON line");
                assert_eq!(written["params"], env.stamp(Some(params)));
            }
        }
        // The same bytes as the path that writes the keys one by one.
        let mut unrendered = env.clone();
        unrendered.rendered = None;
        unrendered.around = None;
        let other = json!({"roots": {"listChanged": true}, "x\"": [1]});
        for (params, capabilities) in [
            (json!({"name": "x"}), None),
            (json!({"name": "x"}), Some(&other)),
            (json!({}), Some(&other)),
            (json!({"_meta": {}, "a\"b": [1]}), Some(&other)),
            (json!({"_meta": {"progressToken": 1}}), Some(&other)),
            (json!({}), None),
            (
                json!({"_meta": {}, "a\"b": [1, {"c": null}], "name": "x\n"}),
                None,
            ),
            (json!({"_meta": 5, "name": "x"}), None),
            (json!({"_meta": 5, "name": "x"}), Some(&other)),
        ] {
            let request = super::super::Request {
                id: super::super::RequestId::Number(1),
                method: "tools/call".into(),
                params: Some(params),
            };
            let line = |envelope: &MetaEnvelope| {
                let mut line = Vec::new();
                let stamp = Stamp {
                    envelope,
                    capabilities,
                };
                super::super::Message::write_stamped_line(
                    (&request).into(),
                    Some(stamp),
                    &mut line,
                );
                line
            };
            assert_eq!(line(&env), line(&unrendered), "{capabilities:?}");
        }
        // A `_meta` holding only our keys (a stale version), or other capabilities: the
        // request's own values are replaced or kept as stamping does.
        let caps = json!({"roots": {}});
        for (params, capabilities) in [
            (json!({"_meta": {KEY_PROTOCOL_VERSION: "old"}}), None),
            (json!({"name": "x"}), Some(&caps)),
        ] {
            let written = serde_json::to_value(StampedParams {
                params: Some(&params),
                stamp: Stamp {
                    envelope: &env,
                    capabilities,
                },
            })
            .expect("serializes");
            assert_eq!(written, env.stamp_with(Some(params), capabilities));
        }
        let renamed = env.with_protocol_version(LEGACY_2025_11_25);
        assert_eq!(renamed.protocol_version(), LEGACY_2025_11_25);
        let written = serde_json::to_value(StampedParams {
            params: None,
            stamp: Stamp {
                envelope: &renamed,
                capabilities: None,
            },
        })
        .expect("serializes");
        assert_eq!(written["_meta"][KEY_PROTOCOL_VERSION], LEGACY_2025_11_25);
        assert_eq!(written["_meta"][KEY_CLIENT_INFO]["name"], "t");
    }

    #[test]
    fn versions_compare_by_date() {
        assert!(is_modern_version(MODERN));
        assert!(is_modern_version("2027-01-01"));
        assert!(!is_modern_version(LEGACY_2025_11_25));
        for junk in [
            "latest",
            "3",
            "9",
            "2026-07-28-draft",
            "2027-1-01",
            "20270-01-01",
            "",
        ] {
            assert!(!is_modern_version(junk), "{junk}");
        }
    }
}
