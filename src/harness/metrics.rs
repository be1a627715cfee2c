//! The harness's metrics in one snapshot ([`Metrics`]): call durations and outcomes,
//! `input_required` rounds, each server's state and restarts, cache hits and misses per
//! layer, the audit backlog. Read it with [`HarnessHandle::metrics`], as Prometheus
//! text with [`Metrics::prometheus`] (the gateway's `/metrics`), or exported through an
//! OpenTelemetry meter with [`HarnessHandle::export_metrics`].
//!
//! Names follow the OpenTelemetry conventions for MCP where they have one
//! (`mcp.client.operation.duration`, in seconds, with `mcp.method.name` and
//! `error.type`); the rest are `mcp_harness.*`. Prometheus names are the OpenTelemetry
//! names with `.` as `_` and the unit or `_total` appended, as the OpenTelemetry to
//! Prometheus mapping does; so are the conventions' attributes as labels, while the
//! harness's own are short there (`outcome`, `state`, `layer`, `era`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Weak};

use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;

use super::{HarnessHandle, Inner};
use crate::audit::AuditHealth;
use crate::call::{BUCKETS, CallSeries};
use crate::registry::cache::CacheStats;
use crate::server::ServerState;

/// One server's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerMetrics {
    /// Server id.
    pub id: String,
    /// Its state now.
    pub state: ServerState,
    /// The era of its current (or last) connection: `modern` or `legacy`.
    pub era: Option<&'static str>,
    /// Connection restarts so far.
    pub restarts: u32,
    /// Requests waiting for it to be ready.
    pub queued: usize,
}

/// Everything the harness counts, at one moment.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// Call durations by server, method and outcome.
    pub calls: Vec<CallSeries>,
    /// `input_required` rounds driven so far (all calls).
    pub input_rounds: u64,
    /// Calls running now.
    pub in_flight: usize,
    /// Each server, in config order.
    pub servers: Vec<ServerMetrics>,
    /// The list cache, per layer.
    pub cache: CacheStats,
    /// The audit trail.
    pub audit: AuditHealth,
}

const STATES: [ServerState; 5] = [
    ServerState::Starting,
    ServerState::Ready,
    ServerState::Restarting,
    ServerState::Failed,
    ServerState::Stopped,
];

/// The server label of a call series, with a comma after it; none for calls that
/// reached no server.
fn server_label(server: &str) -> String {
    match server {
        "" => String::new(),
        id => format!("mcp_harness_server_id=\"{}\",", label(id)),
    }
}

/// A Prometheus label value: `\`, `"` and line breaks escaped, as the text format says.
fn label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

impl Metrics {
    /// Calls that ended with `outcome`, over every server and method.
    pub fn calls_with(&self, outcome: &str) -> u64 {
        self.calls
            .iter()
            .filter(|s| s.outcome == outcome)
            .map(|s| s.count)
            .sum()
    }

    /// Calls by server, method and outcome (the duration series also split by error).
    pub fn calls_by_outcome(&self) -> BTreeMap<(Arc<str>, &'static str, &'static str), u64> {
        let mut out = BTreeMap::new();
        for s in &self.calls {
            *out.entry((s.server.clone(), s.method, s.outcome))
                .or_default() += s.count;
        }
        out
    }

    /// The Prometheus text exposition format (version 0.0.4).
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        let family = |out: &mut String, name: &str, kind: &str, help: &str| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
        };
        family(
            &mut out,
            "mcp_client_operation_duration_seconds",
            "histogram",
            "Duration of MCP calls as the harness saw them, admission to answer.",
        );
        for s in &self.calls {
            let labels = format!(
                "{}mcp_method_name=\"{}\",outcome=\"{}\"{}",
                server_label(&s.server),
                s.method,
                s.outcome,
                s.error_type
                    .map(|e| format!(",error_type=\"{}\"", label(e)))
                    .unwrap_or_default()
            );
            let mut cumulative = 0;
            for (i, bound) in BUCKETS.iter().enumerate() {
                cumulative += s.buckets.get(i).copied().unwrap_or(0);
                let _ = writeln!(
                    out,
                    "mcp_client_operation_duration_seconds_bucket{{{labels},le=\"{bound}\"}} {cumulative}"
                );
            }
            let _ = writeln!(
                out,
                "mcp_client_operation_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}",
                s.count
            );
            let _ = writeln!(
                out,
                "mcp_client_operation_duration_seconds_sum{{{labels}}} {}",
                s.sum
            );
            let _ = writeln!(
                out,
                "mcp_client_operation_duration_seconds_count{{{labels}}} {}",
                s.count
            );
        }
        family(
            &mut out,
            "mcp_harness_calls_total",
            "counter",
            "Calls by server, method and outcome (ok, tool_error, input_required, cancelled, error).",
        );
        for ((server, method, outcome), count) in self.calls_by_outcome() {
            let _ = writeln!(
                out,
                "mcp_harness_calls_total{{{}mcp_method_name=\"{method}\",outcome=\"{outcome}\"}} {count}",
                server_label(&server),
            );
        }
        family(
            &mut out,
            "mcp_harness_input_rounds_total",
            "counter",
            "input_required rounds driven.",
        );
        let _ = writeln!(out, "mcp_harness_input_rounds_total {}", self.input_rounds);
        family(
            &mut out,
            "mcp_harness_calls_in_flight",
            "gauge",
            "Calls running now.",
        );
        let _ = writeln!(out, "mcp_harness_calls_in_flight {}", self.in_flight);
        family(
            &mut out,
            "mcp_harness_server_restarts_total",
            "counter",
            "Connection restarts per server.",
        );
        for s in &self.servers {
            let _ = writeln!(
                out,
                "mcp_harness_server_restarts_total{{mcp_harness_server_id=\"{}\"}} {}",
                label(&s.id),
                s.restarts
            );
        }
        family(
            &mut out,
            "mcp_harness_server_state",
            "gauge",
            "1 for each server's current state, 0 for the others.",
        );
        for s in &self.servers {
            for state in STATES {
                let _ = writeln!(
                    out,
                    "mcp_harness_server_state{{mcp_harness_server_id=\"{}\",state=\"{}\"}} {}",
                    label(&s.id),
                    state.as_str(),
                    u8::from(s.state == state)
                );
            }
        }
        family(
            &mut out,
            "mcp_harness_server_info",
            "gauge",
            "1 per server, with the era of its connection.",
        );
        for s in &self.servers {
            let _ = writeln!(
                out,
                "mcp_harness_server_info{{mcp_harness_server_id=\"{}\",era=\"{}\"}} 1",
                label(&s.id),
                s.era.unwrap_or("none")
            );
        }
        family(
            &mut out,
            "mcp_harness_server_queued",
            "gauge",
            "Requests waiting for a server to be ready.",
        );
        for s in &self.servers {
            let _ = writeln!(
                out,
                "mcp_harness_server_queued{{mcp_harness_server_id=\"{}\"}} {}",
                label(&s.id),
                s.queued
            );
        }
        for (name, help, pick) in [
            (
                "mcp_harness_cache_hits_total",
                "List cache lookups answered, per layer.",
                true,
            ),
            (
                "mcp_harness_cache_misses_total",
                "List cache lookups not answered, per layer.",
                false,
            ),
        ] {
            family(&mut out, name, "counter", help);
            for (layer, value) in self.cache_layers(pick) {
                let _ = writeln!(out, "{name}{{layer=\"{layer}\"}} {value}");
            }
        }
        family(
            &mut out,
            "mcp_harness_audit_backlog",
            "gauge",
            "Audit records accepted and not yet written.",
        );
        let _ = writeln!(out, "mcp_harness_audit_backlog {}", self.audit.backlog);
        family(
            &mut out,
            "mcp_harness_audit_unwritten_total",
            "counter",
            "Audit records that could not be kept.",
        );
        let _ = writeln!(
            out,
            "mcp_harness_audit_unwritten_total {}",
            self.audit.unwritten
        );
        out
    }

    /// Hits (`true`) or misses per cache layer: memory, disk, shared.
    fn cache_layers(&self, hits: bool) -> [(&'static str, u64); 3] {
        let c = &self.cache;
        if hits {
            [
                ("memory", c.l1.hits),
                ("disk", c.l2.hits),
                ("shared", c.l3.hits),
            ]
        } else {
            [
                ("memory", c.l1.misses),
                ("disk", c.l2.misses),
                ("shared", c.l3.misses),
            ]
        }
    }
}

impl HarnessHandle {
    /// Everything the harness counts, now. Reads shared state: never waits on an actor.
    pub fn metrics(&self) -> Metrics {
        let (calls, input_rounds) = self.ctx().metrics.snapshot();
        Metrics {
            calls,
            input_rounds,
            in_flight: self.ctx().in_flight(),
            servers: self
                .status()
                .into_iter()
                .map(|s| ServerMetrics {
                    id: s.id,
                    state: s.state,
                    era: s.era.map(|e| e.as_str()),
                    restarts: s.restarts,
                    queued: s.queued,
                })
                .collect(),
            cache: self.cache_stats(),
            audit: self.audit_health(),
        }
    }

    /// Exports the metrics through `meter` (an OpenTelemetry meter of the embedder's
    /// provider, or the command line's OTLP one): `mcp.client.operation.duration` is
    /// recorded as each call ends; the rest are observed from [`HarnessHandle::metrics`]
    /// at each collection. The instruments hold the harness weakly: they report nothing
    /// once it is gone. Call once per harness.
    pub fn export_metrics(&self, meter: &Meter) {
        let histogram = meter
            .f64_histogram("mcp.client.operation.duration")
            .with_unit("s")
            .with_description("Duration of MCP calls as the harness saw them")
            .with_boundaries(BUCKETS.to_vec())
            .build();
        self.ctx().metrics.export(histogram);
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        let snapshot = move || {
            weak.upgrade()
                .map(|inner| HarnessHandle { inner }.metrics())
        };
        let observe = snapshot.clone();
        let calls = Monotonic::default();
        meter
            .u64_observable_counter("mcp_harness.calls")
            .with_description("Calls by server, method and outcome")
            .with_callback(move |o| {
                let Some(m) = observe() else {
                    return;
                };
                let mut calls = calls.round();
                for ((server, method, outcome), count) in m.calls_by_outcome() {
                    let key = format!("{server}\0{method}\0{outcome}");
                    let count = calls.value(key, count, || {
                        let mut attributes = vec![
                            KeyValue::new("mcp.method.name", method),
                            KeyValue::new("mcp_harness.outcome", outcome),
                        ];
                        if !server.is_empty() {
                            attributes
                                .push(KeyValue::new("mcp_harness.server.id", server.to_string()));
                        }
                        attributes
                    });
                    o.observe(count.0, count.1);
                }
                calls.finish(|value, attributes| o.observe(value, attributes));
            })
            .build();
        let observe = snapshot.clone();
        let restarts = Monotonic::default();
        meter
            .u64_observable_counter("mcp_harness.server.restarts")
            .with_description("Connection restarts per server")
            .with_callback(move |o| {
                let Some(m) = observe() else {
                    return;
                };
                let mut restarts = restarts.round();
                for s in m.servers {
                    let id = s.id.clone();
                    let count = restarts.value(s.id, u64::from(s.restarts), || {
                        vec![KeyValue::new("mcp_harness.server.id", id)]
                    });
                    o.observe(count.0, count.1);
                }
                restarts.finish(|value, attributes| o.observe(value, attributes));
            })
            .build();
        let observe = snapshot.clone();
        meter
            .i64_observable_gauge("mcp_harness.server.state")
            .with_description("1 for each server's current state, 0 for the others")
            .with_callback(move |o| {
                for s in observe().map(|m| m.servers).unwrap_or_default() {
                    for state in STATES {
                        o.observe(
                            i64::from(s.state == state),
                            &[
                                KeyValue::new("mcp_harness.server.id", s.id.clone()),
                                KeyValue::new("mcp_harness.server.state", state.as_str()),
                            ],
                        );
                    }
                }
            })
            .build();
        for (name, hits) in [
            ("mcp_harness.cache.hits", true),
            ("mcp_harness.cache.misses", false),
        ] {
            let observe = snapshot.clone();
            meter
                .u64_observable_counter(name)
                .with_description("List cache lookups per layer")
                .with_callback(move |o| {
                    if let Some(m) = observe() {
                        for (layer, value) in m.cache_layers(hits) {
                            o.observe(value, &[KeyValue::new("mcp_harness.cache.layer", layer)]);
                        }
                    }
                })
                .build();
        }
        // One value each, of no attributes: counters, then gauges. Each `/metrics`
        // family is here too: a deployment that exports only over OTLP alerts on lost
        // audit records and on requests piling up as well.
        type Read = fn(&Metrics) -> u64;
        let counters: [(&'static str, &'static str, Read); 2] = [
            (
                "mcp_harness.input_rounds",
                "input_required rounds driven",
                |m| m.input_rounds,
            ),
            (
                "mcp_harness.audit.unwritten",
                "Audit records that could not be kept",
                |m| m.audit.unwritten,
            ),
        ];
        for (name, description, read) in counters {
            let observe = snapshot.clone();
            meter
                .u64_observable_counter(name)
                .with_description(description)
                .with_callback(move |o| {
                    if let Some(m) = observe() {
                        o.observe(read(&m), &[]);
                    }
                })
                .build();
        }
        let gauges: [(&'static str, &'static str, Read); 2] = [
            (
                "mcp_harness.audit.backlog",
                "Audit records accepted and not yet written",
                |m| m.audit.backlog as u64,
            ),
            ("mcp_harness.calls.in_flight", "Calls in flight", |m| {
                m.in_flight as u64
            }),
        ];
        for (name, description, read) in gauges {
            let observe = snapshot.clone();
            meter
                .u64_observable_gauge(name)
                .with_description(description)
                .with_callback(move |o| {
                    if let Some(m) = observe() {
                        o.observe(read(&m), &[]);
                    }
                })
                .build();
        }
        let observe = snapshot.clone();
        meter
            .u64_observable_gauge("mcp_harness.server.queued")
            .with_description("Requests waiting for a server to be ready")
            .with_callback(move |o| {
                for s in observe().map(|m| m.servers).unwrap_or_default() {
                    let id = KeyValue::new("mcp_harness.server.id", s.id);
                    o.observe(s.queued as u64, &[id]);
                }
            })
            .build();
        let observe = snapshot;
        meter
            .u64_observable_gauge("mcp_harness.server.info")
            .with_description("1 per server, with the era of its connection")
            .with_callback(move |o| {
                for s in observe().map(|m| m.servers).unwrap_or_default() {
                    let attributes = [
                        KeyValue::new("mcp_harness.server.id", s.id),
                        KeyValue::new("mcp_harness.server.era", s.era.unwrap_or("none")),
                    ];
                    o.observe(1, &attributes);
                }
            })
            .build();
    }
}

/// An observable counter's series kept from going back. A server removed and added
/// again under its id (a reload that changed it) counts its calls and restarts from
/// zero; a cumulative counter must not show that, and the SDK's delta temporality
/// subtracts the last value reported from the new one. A drop is taken as a reset: what
/// was counted before it is carried into what follows. A series missing from one
/// collection (the server between its removal and its return) is still observed, at
/// its last value: the SDK forgets what it last reported of a series not observed, and
/// would report the carried count again as new.
#[derive(Default)]
struct Monotonic(parking_lot::Mutex<MonotonicState>);

#[derive(Default)]
struct MonotonicState {
    series: std::collections::HashMap<String, Series>,
    round: u64,
}

/// One series: the last value seen, what is carried, the round it was last seen in,
/// and its attributes.
struct Series {
    last: u64,
    carried: u64,
    seen: u64,
    attributes: Vec<KeyValue>,
}

/// Series kept past which those not seen in the latest collection are let go (an
/// embedder that adds and removes servers by the thousand).
const MONOTONIC_KEPT: usize = 16_384;

/// One collection's look at a [`Monotonic`].
struct MonotonicRound<'a>(parking_lot::MutexGuard<'a, MonotonicState>);

impl Monotonic {
    fn round(&self) -> MonotonicRound<'_> {
        let mut state = self.0.lock();
        state.round += 1;
        MonotonicRound(state)
    }
}

impl MonotonicRound<'_> {
    /// `raw` for series `key` (its attributes made by `attributes` the first time), as
    /// a count that never goes back.
    fn value(
        &mut self,
        key: String,
        raw: u64,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) -> (u64, &[KeyValue]) {
        let round = self.0.round;
        let series = self.0.series.entry(key).or_insert_with(|| Series {
            last: 0,
            carried: 0,
            seen: round,
            attributes: attributes(),
        });
        if raw < series.last {
            series.carried = series.carried.saturating_add(series.last);
        }
        series.last = raw;
        series.seen = round;
        (series.carried.saturating_add(raw), &series.attributes)
    }

    /// Observes the series not seen this round at their last value; past the bound,
    /// lets them go instead.
    fn finish(mut self, mut observe: impl FnMut(u64, &[KeyValue])) {
        let round = self.0.round;
        if self.0.series.len() > MONOTONIC_KEPT {
            self.0.series.retain(|_, s| s.seen == round);
            return;
        }
        for s in self.0.series.values().filter(|s| s.seen != round) {
            observe(s.carried.saturating_add(s.last), &s.attributes);
        }
    }
}

#[cfg(test)]
mod monotonic_tests {
    use super::*;

    fn once(counter: &Monotonic, key: &str, raw: u64) -> (u64, Vec<u64>) {
        let mut round = counter.round();
        let (value, _) = round.value(key.into(), raw, Vec::new);
        let mut unseen = Vec::new();
        round.finish(|v, _| unseen.push(v));
        (value, unseen)
    }

    // A series that starts again from zero (its server removed and added back) goes on
    // from where it was; one missing from a collection is observed at its last value;
    // past the bound, those not seen are let go.
    #[test]
    fn a_series_that_starts_again_from_zero_goes_on_from_where_it_was() {
        let counter = Monotonic::default();
        let seen: Vec<u64> = [3, 5, 1, 2, 0, 4]
            .into_iter()
            .map(|raw| once(&counter, "s", raw).0)
            .collect();
        assert_eq!(seen, [3, 5, 6, 7, 7, 11]);
        // Another series alone this round: `s` is observed as it was.
        assert_eq!(once(&counter, "t", 1), (1, vec![11]));
        for i in 0..=MONOTONIC_KEPT {
            once(&counter, &format!("k{i}"), 1);
        }
        assert_eq!(once(&counter, "s", 1).0, 1, "let go past the bound");
    }
}
