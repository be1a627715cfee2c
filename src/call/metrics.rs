//! What calls did, counted where each call ends ([`super::record::CallRecord`]): the
//! duration histogram of the OpenTelemetry MCP conventions
//! (`mcp.client.operation.duration`, by server, method and outcome), and the
//! `input_required` rounds driven. Read as a [`CallSeries`] snapshot.

use foldhash::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry::KeyValue;

/// Upper bounds of the duration buckets, in seconds: the conventions' advice (10 ms to
/// 300 s), with six below 10 ms in front, since a local server answers in well under
/// that.
pub const BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
    10.0, 30.0, 60.0, 120.0, 300.0,
];

/// One series of the duration histogram.
#[derive(Clone, Debug, PartialEq)]
pub struct CallSeries {
    /// The server that answered (or was tried last); empty when none was reached (no
    /// server id is empty, so it is no server's).
    pub server: Arc<str>,
    /// `tools/call`, `prompts/get` or `resources/read`.
    pub method: &'static str,
    /// As the audit record says: `ok`, `tool_error`, `input_required`, `cancelled`,
    /// `error`.
    pub outcome: &'static str,
    /// The error code when the outcome is `error` or `cancelled` (`error.type`).
    pub error_type: Option<&'static str>,
    /// Calls counted in each bucket of [`BUCKETS`] (not cumulative), then above the last.
    pub buckets: Vec<u64>,
    /// Calls.
    pub count: u64,
    /// Their total duration, in seconds.
    pub sum: f64,
}

impl CallSeries {
    /// An estimate of the median duration from the buckets (the upper bound of the
    /// bucket holding the middle call), or `None` before any call.
    pub fn p50(&self) -> Option<Duration> {
        quantile(&self.buckets, self.count, 0.5)
    }
}

/// The `q` quantile of a histogram as the upper bound of its bucket.
pub fn quantile(buckets: &[u64], count: u64, q: f64) -> Option<Duration> {
    if count == 0 {
        return None;
    }
    let rank = ((count as f64) * q).ceil().max(1.0) as u64;
    let mut seen: u64 = 0;
    for (i, n) in buckets.iter().enumerate() {
        // Buckets may come from a scraped endpoint (`status --watch --from`).
        seen = seen.saturating_add(*n);
        if seen >= rank {
            let bound = BUCKETS.get(i).copied().unwrap_or(f64::INFINITY);
            return Some(Duration::from_secs_f64(bound.min(3600.0)));
        }
    }
    None
}

/// A series of one server: method, outcome, error type.
type Key = (&'static str, &'static str, Option<&'static str>);

#[derive(Default)]
struct Series {
    buckets: Vec<u64>,
    count: u64,
    sum: f64,
    /// The series' attributes on the exported histogram, built on its first call, and
    /// again at each call while its server's protocol version is not known (a call
    /// that ended as its connection went).
    attributes: Option<Arc<[KeyValue]>>,
    settled: bool,
    /// The `mcp.protocol.version` in `attributes`.
    version: Option<Arc<str>>,
}

/// The most removed servers [`CallMetrics`] remembers.
const REMOVED_KEPT: usize = 1024;

/// The calls' counters; one per harness.
#[derive(Default)]
pub(crate) struct CallMetrics {
    /// By server, then series: a server's map is found by `&str`, so a call allocates
    /// nothing once its series exists.
    series: parking_lot::Mutex<HashMap<Arc<str>, HashMap<Key, Series>>>,
    /// Servers removed (taken with `series`, after it), the latest [`REMOVED_KEPT`]: a
    /// call that ends after its server was removed does not bring the server's series
    /// back. Read only at a server's first call, so a short list searched in order.
    removed: parking_lot::Mutex<std::collections::VecDeque<Arc<str>>>,
    rounds: AtomicU64,
    /// The OpenTelemetry histogram each call is also recorded in, once exported.
    exported: std::sync::OnceLock<opentelemetry::metrics::Histogram<f64>>,
}

impl CallMetrics {
    /// Counts one finished call. `peer`: the server's `network.transport` and
    /// `mcp.protocol.version`, asked only when a series' exported attributes are made
    /// (at its first call once exported: a version read is an allocation);
    /// `version_is`: whether the server still speaks the version they name (asked at
    /// each exported call, without allocating: a server restarted or renegotiated to
    /// another version gets its series' attributes made again).
    pub(crate) fn finished(
        &self,
        server: Option<&str>,
        (method, outcome, error_type): (&'static str, &'static str, Option<&'static str>),
        took: Duration,
        version_is: impl FnOnce(&str) -> bool,
        peer: impl FnOnce() -> (Option<&'static str>, Option<String>),
    ) {
        let seconds = took.as_secs_f64();
        let bucket = BUCKETS
            .iter()
            .position(|b| seconds <= *b)
            .unwrap_or(BUCKETS.len());
        let server = server.unwrap_or("");
        let mut by_server = self.series.lock();
        // Servers are the configured ones, methods three and outcomes five: bounded.
        // Looked up once, and once more only for a server's first call.
        let series = match by_server.get_mut(server) {
            Some(series) => series,
            None if self.removed.lock().iter().any(|r| &**r == server) => return,
            None => by_server.entry(server.into()).or_default(),
        };
        let s = series.entry((method, outcome, error_type)).or_default();
        if s.buckets.is_empty() {
            s.buckets = vec![0; BUCKETS.len() + 1];
        }
        s.buckets[bucket] += 1;
        s.count += 1;
        s.sum += seconds;
        let Some(h) = self.exported.get() else {
            return;
        };
        if s.settled
            && let Some(v) = &s.version
            && !version_is(v)
        {
            s.settled = false;
        }
        if !s.settled {
            s.attributes = None;
        }
        let attributes = s
            .attributes
            .get_or_insert_with(|| {
                let mut a = vec![
                    KeyValue::new("mcp.method.name", method),
                    KeyValue::new("mcp_harness.outcome", outcome),
                ];
                if !server.is_empty() {
                    a.push(KeyValue::new("mcp_harness.server.id", server.to_string()));
                }
                if let Some(e) = error_type {
                    a.push(KeyValue::new("error.type", e));
                }
                let (transport, version) = peer();
                if let Some(t) = transport {
                    a.push(KeyValue::new("network.transport", t));
                }
                // No server (nothing reached one): nothing more to learn.
                s.settled = version.is_some() || server.is_empty();
                s.version = version.as_deref().map(Arc::from);
                if let Some(v) = version {
                    a.push(KeyValue::new("mcp.protocol.version", v));
                }
                a.into()
            })
            .clone();
        // Recorded outside our lock: the SDK's collection calls back into the snapshot,
        // which takes it.
        drop(by_server);
        h.record(seconds, &attributes);
    }

    /// Records every call from now on in `histogram` too (the first one given stays).
    pub(crate) fn export(&self, histogram: opentelemetry::metrics::Histogram<f64>) {
        let _ = self.exported.set(histogram);
    }

    /// Counts one `input_required` round.
    pub(crate) fn round(&self) {
        self.rounds.fetch_add(1, Ordering::Relaxed);
    }

    /// Forgets a removed (or not added) server's series, also those a call ending late
    /// would make, unless `back()` (asked under the lock that [`Self::track`] takes):
    /// a server of that id added again meanwhile keeps its series. An add tracks once
    /// its server is in the directory, so a removal that checks the directory here
    /// either sees it or forgets before that track.
    pub(crate) fn forget_unless(&self, server: &str, back: impl FnOnce() -> bool) {
        let mut by_server = self.series.lock();
        let mut removed = self.removed.lock();
        if back() {
            return;
        }
        by_server.remove(server);
        if removed.iter().any(|r| &**r == server) {
            return;
        }
        // An embedder that adds and removes servers by the thousand (one per task) keeps
        // only the latest: a late call of one removed long ago is long over.
        if removed.len() >= REMOVED_KEPT {
            removed.pop_front();
        }
        removed.push_back(server.into());
    }

    /// Counts `server`'s calls again (added, perhaps after it was removed).
    pub(crate) fn track(&self, server: &str) {
        self.removed.lock().retain(|r| &**r != server);
    }

    /// Every series, sorted, and the rounds so far.
    pub(crate) fn snapshot(&self) -> (Vec<CallSeries>, u64) {
        let mut out: Vec<CallSeries> = self
            .series
            .lock()
            .iter()
            .flat_map(|(server, series)| {
                series
                    .iter()
                    .map(move |((method, outcome, error_type), s)| CallSeries {
                        server: server.clone(),
                        method,
                        outcome,
                        error_type: *error_type,
                        buckets: s.buckets.clone(),
                        count: s.count,
                        sum: s.sum,
                    })
            })
            .collect();
        out.sort_by(|a, b| {
            (&a.server, a.method, a.outcome, a.error_type).cmp(&(
                &b.server,
                b.method,
                b.outcome,
                b.error_type,
            ))
        });
        (out, self.rounds.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_count_and_the_median_is_the_middle_bucket() {
        let m = CallMetrics::default();
        for ms in [0.05, 0.2, 0.2, 3.0, 400_000.0] {
            m.finished(
                Some("s"),
                ("tools/call", "ok", None),
                Duration::from_secs_f64(ms / 1000.0),
                |_| true,
                || (None, None),
            );
        }
        m.round();
        let (series, rounds) = m.snapshot();
        assert_eq!((series.len(), rounds), (1, 1));
        let s = &series[0];
        assert_eq!(s.count, 5);
        assert_eq!(s.buckets.iter().sum::<u64>(), 5);
        assert_eq!(s.buckets[0], 1, "50 µs is in the first bucket");
        assert_eq!(s.buckets[BUCKETS.len()], 1, "400 s is above the last");
        assert_eq!(s.p50(), Some(Duration::from_secs_f64(0.00025)));
        m.forget_unless("s", || false);
        assert!(m.snapshot().0.is_empty());
    }

    #[test]
    fn a_removed_servers_late_call_brings_no_series_back_until_it_is_added_again() {
        let m = CallMetrics::default();
        let took = Duration::from_millis(1);
        let call =
            |server: Option<&str>, key| m.finished(server, key, took, |_| true, || (None, None));
        call(Some("s"), ("tools/call", "ok", None));
        m.forget_unless("s", || false);
        call(Some("s"), ("tools/call", "error", Some("-32603")));
        assert!(m.snapshot().0.is_empty());
        m.track("s");
        call(Some("s"), ("tools/call", "ok", None));
        // A call that reached no server is under no server's id.
        call(None, ("tools/call", "error", Some("-32602")));
        let servers: Vec<String> = m
            .snapshot()
            .0
            .iter()
            .map(|s| s.server.to_string())
            .collect();
        assert_eq!(servers, ["", "s"]);
        // A removal that finds the server added again meanwhile forgets nothing.
        m.forget_unless("s", || true);
        call(Some("s"), ("tools/call", "ok", None));
        let ok = |m: &CallMetrics| {
            m.snapshot()
                .0
                .iter()
                .filter(|s| &*s.server == "s")
                .map(|s| s.count)
                .sum::<u64>()
        };
        assert_eq!(ok(&m), 2, "the call before and the one after");
    }

    // A series whose first call ended as its connection went (no version known) takes
    // the version at a later call, and once known is not asked again.
    #[test]
    fn a_series_learns_its_servers_version_later_and_again_when_it_changes() {
        let m = CallMetrics::default();
        m.export(
            opentelemetry::global::meter("test")
                .f64_histogram("d")
                .build(),
        );
        let took = Duration::from_millis(1);
        let series = ("tools/call", "error", Some("x"));
        let version = |m: &CallMetrics| {
            let by_server = m.series.lock();
            let s = &by_server["s"][&series];
            s.attributes
                .as_ref()
                .and_then(|a| {
                    a.iter()
                        .find(|kv| kv.key.as_str() == "mcp.protocol.version")
                })
                .map(|kv| kv.value.to_string())
        };
        m.finished(Some("s"), series, took, |_| true, || (Some("pipe"), None));
        assert_eq!(version(&m), None);
        m.finished(
            Some("s"),
            series,
            took,
            |_| true,
            || (Some("pipe"), Some("2026-07-28".into())),
        );
        assert_eq!(version(&m).as_deref(), Some("2026-07-28"));
        m.finished(Some("s"), series, took, |_| true, || panic!("asked again"));
        // The server now speaks another version (restarted, or renegotiated): made
        // again with it, and then settled again.
        m.finished(
            Some("s"),
            series,
            took,
            |v| v == "2025-11-25",
            || (Some("pipe"), Some("2025-11-25".into())),
        );
        assert_eq!(version(&m).as_deref(), Some("2025-11-25"));
        m.finished(
            Some("s"),
            series,
            took,
            |v| v == "2025-11-25",
            || panic!("asked again"),
        );
    }

    #[test]
    fn servers_removed_by_the_thousand_are_remembered_within_a_bound() {
        let m = CallMetrics::default();
        for i in 0..(REMOVED_KEPT * 3) {
            m.forget_unless(&format!("task-{i}"), || false);
        }
        assert_eq!(m.removed.lock().len(), REMOVED_KEPT);
        // The latest are remembered.
        let took = Duration::from_millis(1);
        m.finished(
            Some(&format!("task-{}", REMOVED_KEPT * 3 - 1)),
            ("tools/call", "ok", None),
            took,
            |_| true,
            || (None, None),
        );
        assert!(m.snapshot().0.is_empty());
    }
}
