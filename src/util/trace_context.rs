//! W3C Trace Context for requests to servers: the `traceparent` (and `tracestate`) of
//! the current `tracing` span, as OpenTelemetry sees it through `tracing-opentelemetry`,
//! written into a request's `params._meta` (which the 2026-07-28 revision allows and
//! legacy servers ignore), so that a server that traces continues the caller's trace.
//! Without an OpenTelemetry layer installed the harness makes no trace context of its
//! own, and writes only what a gateway's client sent ([`passed_on`]): the cost is a
//! lookup on the current span, a few on the attached OpenTelemetry context and one on
//! the call's parent; an untraced call also attaches, to its future, the context its
//! requests pass on ([`call_context`]).
//!
//! Head sampling is decided here too, once per call ([`HeadSampler`]): a call that is
//! not traced makes its spans on the [`UNTRACED`] target, which [`export_filter`] keeps
//! from the OpenTelemetry layer, so it builds no OpenTelemetry span at all (log layers
//! still see those spans). Deciding at the root is what makes an unsampled call cost
//! nearly nothing: a sampler inside the SDK decides only after the spans are built.

use std::sync::atomic::{AtomicU64, Ordering};

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use serde_json::Value;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The `_meta` key of the W3C `traceparent`.
pub const TRACEPARENT: &str = "traceparent";
/// The `_meta` key of the W3C `tracestate`.
pub const TRACESTATE: &str = "tracestate";

/// The `tracing` layer that turns the harness's spans into OpenTelemetry spans of
/// `tracer`, as the binary installs it (an embedder may add it to its own subscriber):
/// [`export_filter`], and none of the per-span extras (source location, thread, busy
/// and idle times) that would cost every call without saying more about it.
pub fn layer<S, T>(tracer: T) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    T: opentelemetry::trace::Tracer + Send + Sync + 'static,
    T::Span: Send + Sync,
{
    use tracing_subscriber::Layer;
    tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        .with_context_activation(false)
        .with_filter(export_filter())
}

/// The target of the spans that last as long as a server or a connection: log context,
/// not traces (a span is exported when it ends, and each poll of the connection's tasks
/// would pay for it).
pub const CONNECTION_SPANS: &str = "mcp_harness::connection";

/// The target of the spans of calls that are not traced (see [`HeadSampler`]).
pub const UNTRACED: &str = "mcp_harness::untraced";

/// Which calls are traced: a call under a span that carries a trace context follows
/// that trace's sampled flag (parent-based), a call under an untraced call's span (when
/// a log layer keeps those spans) is untraced, and a call that starts a trace is traced
/// at `ratio`. Work that decided above the call (a gateway's request) tells it instead.
#[derive(Debug)]
pub struct HeadSampler {
    ratio: f64,
    /// Counts the decisions; each is a hash of the count, so that kept calls follow no
    /// period a workload could fall into step with.
    roots: AtomicU64,
    /// Keys the hash of a client's trace id ([`HeadSampler::for_trace`]) with this
    /// process's random keys: a client cannot pick ids that are always kept.
    trace_keys: std::collections::hash_map::RandomState,
}

impl HeadSampler {
    /// Traces `ratio` (0 to 1; outside, the nearer bound) of the traces started here.
    pub fn new(ratio: f64) -> HeadSampler {
        let ratio = if ratio.is_nan() {
            1.0
        } else {
            ratio.clamp(0.0, 1.0)
        };
        HeadSampler {
            ratio,
            // A random start: two processes do not keep the same calls.
            roots: AtomicU64::new(getrandom::u64().unwrap_or(0)),
            trace_keys: std::collections::hash_map::RandomState::new(),
        }
    }

    /// The share of new traces that are traced.
    pub fn ratio(&self) -> f64 {
        self.ratio
    }

    /// Whether a new trace (no parent context) is traced.
    pub fn root(&self) -> bool {
        if self.ratio >= 1.0 {
            return true;
        }
        if self.ratio <= 0.0 {
            return false;
        }
        let n = self.roots.fetch_add(1, Ordering::Relaxed);
        // SplitMix64's finalizer: a count spread over all 64 bits (a statistical
        // decision, not a secret: no cryptography is needed or wanted here).
        let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        ((z >> 11) as f64 / (1u64 << 53) as f64) < self.ratio
    }

    /// Whether a client's trace, whose sampled flag is not followed, is traced: decided
    /// by its id at `ratio`, so that every request of one trace gets the same answer
    /// in this process (a trace is kept whole or not at all), and by a keyed hash of
    /// it, so that a client cannot choose ids that are always kept.
    pub fn for_trace(&self, trace_id: opentelemetry::trace::TraceId) -> bool {
        use std::hash::BuildHasher;
        if self.ratio >= 1.0 {
            return true;
        }
        if self.ratio <= 0.0 {
            return false;
        }
        let z = self.trace_keys.hash_one(trace_id.to_bytes());
        ((z >> 11) as f64 / (1u64 << 53) as f64) < self.ratio
    }

    /// Whether work under the trace context `cx` is traced: as its trace, else (no
    /// valid span in it) at the ratio.
    pub fn in_context(&self, cx: &opentelemetry::Context) -> bool {
        let span = cx.span();
        let sc = span.span_context();
        match sc.is_valid() {
            true => sc.is_sampled(),
            false => self.root(),
        }
    }

    /// Whether work that is a child of `parent` is traced: as `parent`'s trace, else as
    /// that of an OpenTelemetry context attached to the work (what its requests would
    /// pass on, see [`passed_on`]), else at the ratio.
    pub fn under(&self, parent: &tracing::Span) -> bool {
        if parent.metadata().is_some_and(|m| m.target() == UNTRACED) {
            return false;
        }
        let cx = parent.context();
        let span = cx.span();
        let sc = span.span_context();
        if sc.is_valid() {
            return sc.is_sampled();
        }
        // Inside an untraced call's future (its spans disabled, so not `parent`), and
        // under no span of a trace of its own (an input handler's, say).
        if opentelemetry::Context::map_current(|cx| {
            matches!(cx.get::<Passes>(), Some(Passes::Fixed(_)))
        }) {
            return false;
        }
        let attached = opentelemetry::Context::map_current(|cx| {
            let span = cx.span();
            let sc = span.span_context();
            sc.is_valid().then(|| sc.is_sampled())
        });
        attached.unwrap_or_else(|| self.root())
    }
}

/// An INFO span of the call path, on the [`UNTRACED`] target when `$traced` is false.
/// A call's children are told its decision rather than reading it from the current
/// span: unless a log layer keeps the untraced target, an untraced span is disabled, and
/// a disabled span is never current.
macro_rules! call_span {
    (traced: $traced:expr, $($rest:tt)+) => {
        if $traced {
            ::tracing::info_span!($($rest)+)
        } else {
            ::tracing::info_span!(target: $crate::util::trace_context::UNTRACED, $($rest)+)
        }
    };
}
pub(crate) use call_span;

/// What of the harness's `tracing` output an OpenTelemetry layer should take: its
/// spans and events at INFO and above, except untraced calls' spans, the spans that last
/// as long as a connection, the audit records (every call's two, which the audit trail
/// keeps already and which would double the cost of a traced call) and servers' stderr
/// (text a server chooses, in bulk). An embedder adds its own targets to it (`.with_target("my_app", …)`), so
/// that its spans are the parents of the harness's.
pub fn export_filter() -> tracing_subscriber::filter::Targets {
    use tracing_subscriber::filter::LevelFilter;
    tracing_subscriber::filter::Targets::new()
        .with_target("mcp_harness", tracing::Level::INFO)
        .with_target("mcp_harness::audit", LevelFilter::OFF)
        .with_target(UNTRACED, LevelFilter::OFF)
        .with_target(CONNECTION_SPANS, LevelFilter::OFF)
        .with_target("mcp_harness::server_stderr", LevelFilter::OFF)
}

/// The longest target kept in a span name (names come from callers and servers).
const NAME_TARGET_MAX: usize = 96;

/// A span name by the conventions, `{method} {target}`, or `{method}` alone when the
/// target is not to be named (a resource's uri may hold secrets) or there is none; the
/// target is cut to [`NAME_TARGET_MAX`] characters, its control and invisible format
/// characters ([`crate::util::text::hidden`]) shown as U+FFFD (it comes from a client
/// or a server, and a span name may reach a terminal, where a right-to-left override
/// would reorder the line).
pub fn span_name(method: &str, named: bool, target: &str) -> String {
    if !named || target.is_empty() {
        return method.to_string();
    }
    let mut name = String::with_capacity(method.len() + 1 + target.len().min(4 * NAME_TARGET_MAX));
    name.push_str(method);
    name.push(' ');
    let mut chars = target.chars();
    for c in chars.by_ref().take(NAME_TARGET_MAX) {
        name.push(if shown_as_is(c) { c } else { '\u{FFFD}' });
    }
    if chars.next().is_some() {
        name.push('…');
    }
    name
}

/// Whether a character of a name from outside is shown as it is in a span name or
/// attribute: not a control character, nor one that changes how a line reads.
pub(crate) fn shown_as_is(c: char) -> bool {
    !c.is_control() && !crate::util::text::hidden(c)
}

/// What an untraced call fixed at its start ([`call_context`]); else the current
/// span's context, if it is a valid (sampled or not) OpenTelemetry span; else the
/// OpenTelemetry context attached to the work being polled (a traced call passing its
/// client's on with no span of its own, see [`passed_on`]; an embedder's own).
fn current() -> Option<SpanContext> {
    let fixed = opentelemetry::Context::map_current(|cx| match cx.get::<Passes>() {
        Some(Passes::Fixed(sc)) => Some(sc.clone()),
        _ => None,
    });
    if let Some(fixed) = fixed {
        return fixed;
    }
    let cx = tracing::Span::current().context();
    let span = cx.span();
    let sc = span.span_context();
    if sc.is_valid() {
        return Some(sc.clone());
    }
    opentelemetry::Context::map_current(|cx| {
        let span = cx.span();
        let sc = span.span_context();
        sc.is_valid().then(|| sc.clone())
    })
}

/// What the requests of a call pass on of its client's trace context where no span of
/// the harness's carries one (the call not traced, or no OpenTelemetry layer at all):
/// the client's own span as their parent, marked not sampled when the call is not
/// traced, so that a server that traces neither starts a trace of its own for them nor
/// keeps one this process decided not to keep. Attach it to the call's future with
/// `opentelemetry::context::FutureExt`; a traced call's own spans come first.
pub fn passed_on(remote: &SpanContext, traced: bool) -> opentelemetry::Context {
    let flags = remote.trace_flags();
    let flags = if traced {
        flags
    } else {
        flags.with_sampled(false)
    };
    let passed = SpanContext::new(
        remote.trace_id(),
        remote.span_id(),
        flags,
        true,
        remote.trace_state().clone(),
    );
    opentelemetry::Context::new().with_remote_span_context(passed)
}

/// What the requests made inside a call's future pass on, set on the OpenTelemetry
/// context attached to it ([`call_context`]).
#[derive(Clone, Debug)]
enum Passes {
    /// The call is traced: the span current when a request is sent (its own spans).
    Spans,
    /// The call is not traced: the context it came under, marked not sampled, fixed at
    /// its start. Its own spans carry none, and the span current when a request is
    /// sent is whatever its poller entered, which may belong to another trace.
    Fixed(Option<SpanContext>),
}

/// The valid span context of `cx`, if any.
fn valid(cx: &opentelemetry::Context) -> Option<SpanContext> {
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid().then(|| sc.clone())
}

/// The OpenTelemetry context to attach to a call's future (with
/// `opentelemetry::context::FutureExt`), made when the call starts, once `traced` is
/// decided; `None` when the call's requests need nothing of it.
///
/// An untraced call's requests pass on the context it came under, marked not sampled:
/// `trace_parent` when it was given one (a gateway's client's, or none at all), else
/// `parent`'s, else that of the untraced call it runs inside, else the attached one.
/// A traced call inside an untraced one (an embedder that says so) gets its own spans
/// back. A traced call elsewhere needs nothing: its spans, or the attached context.
pub(crate) fn call_context(
    traced: bool,
    parent: &tracing::Span,
    trace_parent: Option<&opentelemetry::Context>,
) -> Option<opentelemetry::Context> {
    let current = opentelemetry::Context::current();
    let within = current.get::<Passes>();
    if traced {
        return within.map(|_| current.with_value(Passes::Spans));
    }
    let came_under = match trace_parent {
        Some(cx) => valid(cx),
        None => valid(&parent.context())
            .or_else(|| match within {
                Some(Passes::Fixed(sc)) => sc.clone(),
                _ => None,
            })
            .or_else(|| valid(&current)),
    };
    let fixed = came_under.map(|sc| {
        SpanContext::new(
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().with_sampled(false),
            true,
            sc.trace_state().clone(),
        )
    });
    Some(current.with_value(Passes::Fixed(fixed)))
}

/// `00-TRACEID-SPANID-FLAGS`.
fn traceparent(sc: &SpanContext) -> String {
    format!(
        "00-{}-{}-{:02x}",
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags().to_u8()
    )
}

/// `params` with the current trace context in `_meta` (replacing what the caller put
/// there: this request is a child of the current span), as a copy; `None` when there is
/// no trace context, and the params go as they are (the call path's, untraced and with
/// no client's context to pass on, are never copied).
pub fn with_context(params: Option<&Value>) -> Option<Value> {
    let sc = current()?;
    let mut params = params.cloned();
    inject(&mut params, &sc);
    params
}

/// Writes `sc` into `params._meta`; leaves params that cannot carry `_meta` alone.
fn inject(params: &mut Option<Value>, sc: &SpanContext) {
    let params = params.get_or_insert_with(|| Value::Object(Default::default()));
    let Some(map) = params.as_object_mut() else {
        return;
    };
    let meta = map
        .entry("_meta")
        .or_insert_with(|| Value::Object(Default::default()));
    let Some(meta) = meta.as_object_mut() else {
        return;
    };
    meta.insert(TRACEPARENT.into(), Value::String(traceparent(sc)));
    let state = sc.trace_state().header();
    if state.is_empty() {
        meta.remove(TRACESTATE);
    } else {
        meta.insert(TRACESTATE.into(), Value::String(state));
    }
}

/// The remote span context a request's `params._meta` names, if its `traceparent` is
/// well formed (non-zero ids, lower-case hex; version 00 exactly 55 characters, a later
/// version read by its first 55, as W3C Trace Context asks, `ff` never); a malformed
/// one is ignored.
pub fn extract(params: Option<&Value>) -> Option<SpanContext> {
    let meta = params?.get("_meta")?;
    let text = meta.get(TRACEPARENT)?.as_str()?;
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let version = text.get(..2)?;
    let known = match version {
        "00" => text.len() == 55,
        "ff" => false,
        // What a later version adds follows a dash after the fields of version 00.
        _ => hex(version, 2) && (text.len() == 55 || text.as_bytes().get(55) == Some(&b'-')),
    };
    if !known {
        return None;
    }
    let parts: Vec<&str> = text.get(..55)?.split('-').collect();
    let [_, trace, span, flags] = parts[..] else {
        return None;
    };
    if !hex(trace, 32) || !hex(span, 16) || !hex(flags, 2) {
        return None;
    }
    let trace_id = TraceId::from_hex(trace).ok()?;
    let span_id = SpanId::from_hex(span).ok()?;
    // Only the sampled bit is defined; the others are not passed on (W3C: zeroed).
    let flags = u8::from_str_radix(flags, 16).ok()? & 0x01;
    let state = meta
        .get(TRACESTATE)
        .and_then(Value::as_str)
        .filter(|s| s.len() <= 512 && w3c_tracestate(s))
        .and_then(|s| s.parse::<TraceState>().ok())
        .unwrap_or_default();
    let sc = SpanContext::new(trace_id, span_id, TraceFlags::new(flags), true, state);
    sc.is_valid().then_some(sc)
}

/// Whether `text` is a `tracestate` as W3C Trace Context (Level 2) writes it: at most
/// 32 list members (empty ones counted), each `key=value` around optional spaces and
/// tabs, keys unique, of 1 to 256 of `a-z 0-9 _ - * / @` beginning with a letter or
/// digit, values of 1 to 256 printable characters other than `,` and `=`, not ending in
/// a space. OpenTelemetry's parser takes more (a tab inside a value, a key twice, an
/// empty value) and cuts past 32 members silently, which a stricter vendor downstream
/// would drop the header for: one that is not is dropped here, whole.
fn w3c_tracestate(text: &str) -> bool {
    let key_ok = |key: &str| {
        let b = key.as_bytes();
        let key_char =
            |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || b"_-*/@".contains(c);
        b.first()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
            && b.len() <= 256
            && b.iter().all(key_char)
    };
    let value_ok = |v: &str| {
        !v.is_empty()
            && v.len() <= 256
            && !v.ends_with(' ')
            && v.bytes()
                .all(|b| (0x20..=0x7e).contains(&b) && b != b',' && b != b'=')
    };
    if text.split(',').count() > 32 {
        return false;
    }
    let mut keys = std::collections::HashSet::new();
    for member in text.split(',') {
        let member = member.trim_matches([' ', '\t']);
        if member.is_empty() {
            continue;
        }
        let Some((key, value)) = member.split_once('=') else {
            return false;
        };
        if !key_ok(key) || !value_ok(value) || !keys.insert(key) {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // A tracestate W3C would not write is dropped whole (OpenTelemetry's parser took a
    // tab inside a value, a key twice, an empty value); one it would is passed on.
    #[test]
    fn a_tracestate_is_held_to_the_w3c_grammar() {
        for good in [
            "vendor=abc",
            "a=1, b=2 ,\tc=x y",
            "tenant1@sys=v",
            "k=a/b+c",
            // Level 2's keys: a digit first, `@` anywhere.
            "1k=v",
            "foo@bar@baz=1",
            "33@nr=x",
            "",
        ] {
            assert!(w3c_tracestate(good), "{good:?}");
        }
        for bad in [
            "a=x\ty", "a=1,a=2", "b=", "k==v", "A=1", "_k=v", "novalue", "=v",
        ] {
            assert!(!w3c_tracestate(bad), "{bad:?}");
        }
        let many: Vec<String> = (0..33).map(|i| format!("k{i}=v")).collect();
        assert!(!w3c_tracestate(&many.join(",")));
        // Empty members count: OpenTelemetry would cut the last one silently.
        assert!(!w3c_tracestate(&format!("a=1{}b=2", ",".repeat(32))));
    }

    // `{method} {target}`, cut; the method alone for a target not named, or none.
    #[test]
    fn a_span_is_named_by_its_method_and_target_cut_to_a_length() {
        assert_eq!(
            span_name("tools/call", true, "s__echo"),
            "tools/call s__echo"
        );
        assert_eq!(
            span_name("resources/read", false, "file:///x"),
            "resources/read"
        );
        assert_eq!(span_name("tools/call", true, ""), "tools/call");
        let escaped = span_name("tools/call", true, "a\u{1b}[2Jb\nc");
        assert_eq!(
            span_name("tools/call", true, "x\u{202e}y\u{2028}z"),
            "tools/call x\u{FFFD}y\u{FFFD}z"
        );
        assert_eq!(escaped, "tools/call a\u{FFFD}[2Jb\u{FFFD}c");
        let long = "x".repeat(NAME_TARGET_MAX + 5);
        let cut = format!("tools/call {}…", "x".repeat(NAME_TARGET_MAX));
        assert_eq!(span_name("tools/call", true, &long), cut);
    }

    // A client's trace is kept whole or not at all, at about the ratio over traces.
    #[test]
    fn a_client_trace_gets_one_decision_for_all_its_requests() {
        let sampler = HeadSampler::new(0.5);
        let ids: Vec<opentelemetry::trace::TraceId> = (1..=2000u128)
            .map(|n| {
                opentelemetry::trace::TraceId::from_bytes((n * 0x9e37_79b9_7f4a_7c15).to_be_bytes())
            })
            .collect();
        let kept = ids.iter().filter(|id| sampler.for_trace(**id)).count();
        assert!((800..1200).contains(&kept), "{kept} of 2000 kept at 0.5");
        for id in &ids[..50] {
            let first = sampler.for_trace(*id);
            assert!((0..20).all(|_| sampler.for_trace(*id) == first));
        }
        assert!(ids.iter().all(|id| HeadSampler::new(1.0).for_trace(*id)));
        assert!(!ids.iter().any(|id| HeadSampler::new(0.0).for_trace(*id)));
    }

    #[test]
    fn a_well_formed_traceparent_is_read_and_anything_else_ignored() {
        let p = |tp: &str| json!({"_meta": {"traceparent": tp, "tracestate": "a=1"}});
        let sc = extract(Some(&p(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )))
        .expect("valid");
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert!(sc.is_remote() && sc.is_sampled());
        assert_eq!(sc.trace_state().header(), "a=1");
        // A later version is read by the fields of version 00, whatever follows them.
        for later in [
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next",
        ] {
            let sc = extract(Some(&p(later))).expect(later);
            assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7", "{later}");
        }
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "\u{1b}[31m",
        ] {
            assert!(extract(Some(&p(bad))).is_none(), "{bad}");
        }
    }

    #[test]
    fn new_traces_are_kept_at_the_ratio() {
        for ratio in [0.0, 0.1, 0.25, 1.0] {
            let sampler = HeadSampler::new(ratio);
            let decisions: Vec<bool> = (0..100_000).map(|_| sampler.root()).collect();
            let kept = decisions.iter().filter(|d| **d).count() as f64 / 1e5;
            assert!((kept - ratio).abs() < 0.01, "{ratio}: {kept}");
            if ratio > 0.0 && ratio < 1.0 {
                // No period: the tenth call of a loop of ten is not always the kept one.
                let every_tenth = decisions.iter().step_by(10).filter(|d| **d).count();
                assert!(every_tenth > 0 && every_tenth < 10_000, "{ratio}");
            }
        }
        assert_eq!(HeadSampler::new(f64::NAN).ratio(), 1.0);
        assert_eq!(HeadSampler::new(7.0).ratio(), 1.0);
    }

    #[test]
    fn without_a_trace_context_nothing_is_written() {
        assert_eq!(with_context(Some(&json!({"name": "echo"}))), None);
        assert_eq!(with_context(None), None);
    }

    // An untraced call passes its client's context on, not sampled, with its state.
    #[test]
    fn an_untraced_call_passes_its_clients_context_on_unsampled() {
        let client = json!({"_meta": {
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "tracestate": "a=1",
        }});
        let remote = extract(Some(&client)).expect("valid");
        let sent = {
            let _attached = passed_on(&remote, false).attach();
            with_context(Some(&json!({"name": "echo"}))).expect("passed on")
        };
        assert_eq!(
            sent["_meta"]["traceparent"],
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
        );
        assert_eq!(sent["_meta"]["tracestate"], "a=1");
        assert_eq!(sent["name"], "echo");
        // Traced, with no span of its own to carry it (no OpenTelemetry layer here):
        // the client's, as it came.
        let _attached = passed_on(&remote, true).attach();
        let sent = with_context(None).expect("passed on");
        assert_eq!(
            sent["_meta"]["traceparent"],
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
    }

    // A call under an attached context (no span of its own) is sampled as that context
    // says, whatever the ratio: what it decides and what it passes on agree.
    #[test]
    fn a_call_under_an_attached_context_follows_its_flag() {
        let sampled = extract(Some(&json!({"_meta": {
            "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        }})))
        .expect("valid");
        let none = HeadSampler::new(0.0);
        let all = HeadSampler::new(1.0);
        {
            let _attached = passed_on(&sampled, true).attach();
            assert!(none.under(&tracing::Span::none()));
        }
        {
            let _attached = passed_on(&sampled, false).attach();
            assert!(!all.under(&tracing::Span::none()));
        }
        assert!(
            !none.under(&tracing::Span::none()),
            "nothing attached: the ratio"
        );
    }
}
