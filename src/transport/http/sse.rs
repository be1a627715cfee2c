//! An incremental, bounded parser for `text/event-stream` (the WHATWG framing):
//! `data:` lines joined by `\n`, `id:` kept for `Last-Event-ID`, `retry:` kept for the
//! reconnect delay, comment lines (`:` keep-alives) ignored, a blank line dispatches.
//!
//! Linear in the bytes fed however they are chunked: the scan for the end of a line
//! resumes where the last chunk left off. The server's `retry` is kept within
//! [`MIN_RETRY`]..[`MAX_RETRY`]: `retry: 0` must not make a reconnect loop spin.

use std::time::Duration;

/// The shortest reconnect delay honoured, whatever the server asks.
pub const MIN_RETRY: Duration = Duration::from_millis(250);
/// The longest reconnect delay honoured.
pub const MAX_RETRY: Duration = Duration::from_secs(60);

/// One dispatched event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The event's `data`, lines joined by `\n`.
    pub data: String,
    /// The `event:` type, if any (`message` when absent).
    pub event: Option<String>,
}

/// Feeds bytes in, takes events out.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
    /// How far into `buf` we know there is no line end.
    scanned: usize,
    data: String,
    has_data: bool,
    event: Option<String>,
    /// The id of the last event dispatched, sent back as `Last-Event-ID` when resuming.
    pub last_event_id: Option<std::sync::Arc<str>>,
    /// The last `id:` seen; it becomes `last_event_id` when its event is dispatched
    /// (WHATWG), so that an event broken off is asked for again, not skipped. Shared,
    /// not copied, at each blank line.
    id_buffer: Option<std::sync::Arc<str>>,
    /// Events with data given out, over every stream fed.
    pub dispatched: u64,
    /// The last `retry:` seen, kept within [`MIN_RETRY`]..[`MAX_RETRY`].
    pub retry: Option<Duration>,
    /// The last line ended with a `\r` at the end of a chunk: a `\n` that starts the
    /// next one belongs to it.
    skip_lf: bool,
    /// Nothing of this stream read yet: a byte order mark may lead it.
    started: bool,
}

/// The longest event id kept (longer ones are ignored): it is sent back as a header,
/// and a server's id of megabytes would be sent with every resume.
const MAX_ID_BYTES: usize = 1024;

/// The room a parser keeps between events; a larger event's is given back.
const KEPT_BUFFER: usize = 64 << 10;

impl SseParser {
    /// Begins another response's stream: what was left of an event the last one broke
    /// off in (or one that grew past the limit) is dropped; the last event id and
    /// `retry` are kept, for resuming.
    pub fn new_stream(&mut self) {
        self.buf.clear();
        self.buf.shrink_to(KEPT_BUFFER);
        self.scanned = 0;
        self.data.clear();
        self.data.shrink_to(KEPT_BUFFER);
        self.has_data = false;
        self.event = None;
        self.id_buffer = self.last_event_id.clone();
        self.skip_lf = false;
        self.started = false;
    }

    /// Appends `chunk` and returns the events it completed, and an error when the
    /// event after them grows past `max` bytes: those before it still count (the
    /// awaited response may be one of them).
    pub fn feed(&mut self, chunk: &[u8], max: usize) -> (Vec<Event>, Result<(), usize>) {
        let mut chunk = chunk;
        if self.skip_lf && !chunk.is_empty() {
            self.skip_lf = false;
            if chunk[0] == b'\n' {
                chunk = &chunk[1..];
            }
        }
        self.buf.extend_from_slice(chunk);
        if !self.started {
            // The stream may start with a byte order mark, which is not the first
            // field's name (WHATWG: one leading U+FEFF is dropped).
            const BOM: &[u8] = b"\xEF\xBB\xBF";
            if self.buf.len() < BOM.len() && BOM.starts_with(&self.buf) {
                return (Vec::new(), Ok(()));
            }
            if self.buf.starts_with(BOM) {
                self.buf.drain(..BOM.len());
            }
            self.started = true;
        }
        let mut events = Vec::new();
        // `start`: where the current line begins; `from`: where to look for its end.
        let mut start = 0;
        let mut from = self.scanned;
        loop {
            let Some(pos) = self.buf[from..]
                .iter()
                .position(|b| *b == b'\n' || *b == b'\r')
            else {
                from = self.buf.len();
                break;
            };
            let end = from + pos;
            // A \r\n pair ends one line, not two. A \r that ends the chunk ends its line
            // now (a stream of bare \r endings dispatches each event as it comes); a \n
            // that starts the next chunk is its pair.
            let mut next = end + 1;
            if self.buf[end] == b'\r' {
                if next == self.buf.len() {
                    self.skip_lf = true;
                } else if self.buf[next] == b'\n' {
                    next += 1;
                }
            }
            let line = String::from_utf8_lossy(&self.buf[start..end]).into_owned();
            start = next;
            from = next;
            if let Some(e) = self.line(&line) {
                events.push(e);
            }
            // An event past the limit is one whether it came in one chunk or many.
            if self.data.len() > max {
                return (events, Err(max));
            }
        }
        self.buf.drain(..start);
        // One large event's room is not kept for the stream's life.
        if self.buf.len() < KEPT_BUFFER {
            self.buf.shrink_to(KEPT_BUFFER);
        }
        self.scanned = from - start;
        if self.buf.len() + self.data.len() > max {
            return (events, Err(max));
        }
        (events, Ok(()))
    }

    fn line(&mut self, line: &str) -> Option<Event> {
        if line.is_empty() {
            self.last_event_id.clone_from(&self.id_buffer);
            if !self.has_data {
                self.event = None;
                return None;
            }
            self.has_data = false;
            self.dispatched += 1;
            return Some(Event {
                data: std::mem::take(&mut self.data),
                event: self.event.take(),
            });
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.event = Some(value.to_string()),
            // An empty id resets it (nothing to resume from); one a header cannot carry
            // is not kept (a resume would fail to be sent).
            "id" if value.is_empty() => self.id_buffer = None,
            "id" if value.len() <= MAX_ID_BYTES
                && value
                    .bytes()
                    .all(|b| b == b'\t' || (0x20..0x7f).contains(&b)) =>
            {
                self.id_buffer = Some(value.into());
            }
            "retry" => {
                if let Ok(ms) = value.parse::<u64>() {
                    self.retry = Some(Duration::from_millis(ms).clamp(MIN_RETRY, MAX_RETRY));
                }
            }
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The events of a chunk that fits.
    fn fits((events, fit): (Vec<Event>, Result<(), usize>)) -> Vec<Event> {
        assert_eq!(fit, Ok(()), "fits");
        events
    }

    #[test]
    fn the_events_before_one_past_the_limit_still_count() {
        let mut p = SseParser::default();
        let mut chunk = b"data: {\"id\":1}\n\ndata: ".to_vec();
        chunk.extend_from_slice(&[b'x'; 64]);
        let (events, fit) = p.feed(&chunk, 32);
        assert_eq!(fit, Err(32));
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].data, "{\"id\":1}");
    }

    #[test]
    fn one_large_event_does_not_keep_its_room() {
        let mut p = SseParser::default();
        let big = format!("data: {}\n\n", "x".repeat(4 << 20));
        let events = fits(p.feed(big.as_bytes(), 16 << 20));
        assert_eq!(events.len(), 1);
        assert!(p.buf.capacity() <= KEPT_BUFFER, "{}", p.buf.capacity());
        // An event broken off half way, then another stream.
        fits(p.feed(&big.as_bytes()[..big.len() / 2], 16 << 20));
        p.new_stream();
        assert!(p.buf.capacity() <= KEPT_BUFFER, "{}", p.buf.capacity());
        assert!(p.data.capacity() <= KEPT_BUFFER, "{}", p.data.capacity());
    }

    #[test]
    fn a_new_stream_drops_what_the_last_one_broke_off_and_resumes_before_it() {
        let mut p = SseParser::default();
        let out = fits(p.feed(b"id: 3\ndata: {}\n\n", 1024));
        assert_eq!(out.len(), 1);
        let out = fits(p.feed(b"id: 4\nretry: 900\ndata: {\"jsonrpc\":\"2.0\",\n", 1024));
        assert!(out.is_empty());
        // Event 4 never arrived whole: resumed after 3, it is sent again.
        assert_eq!(p.last_event_id.as_deref(), Some("3"));
        p.new_stream();
        let out = fits(p.feed(b"data: {\"x\":1}\n\n", 1024));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].data, "{\"x\":1}");
        assert_eq!(
            p.last_event_id.as_deref(),
            Some("3"),
            "an event without an id keeps it"
        );
        // An id-only event moves it (WHATWG dispatches the id even without data).
        assert!(fits(p.feed(b"id: 5\n\n", 1024)).is_empty());
        assert_eq!(p.last_event_id.as_deref(), Some("5"));
        assert_eq!(p.retry, Some(Duration::from_millis(900)));
        // An event past the limit is not carried into the next stream either.
        assert!(p.feed(&[b'd'; 64], 32).1.is_err());
        p.new_stream();
        let out = fits(p.feed(b"data: y\n\n", 32));
        assert_eq!(out[0].data, "y");
    }

    #[test]
    fn events_split_across_chunks_with_comments_ids_and_crlf() {
        let mut p = SseParser::default();
        let mut out = fits(p.feed(
            b": keep-alive\r\nid: 7\r\nretry: 1500\r\ndata: {\"a\":",
            1024,
        ));
        assert!(out.is_empty());
        out = fits(p.feed(b"1}\r\n\r\ndata: x\ndata: y\n\n", 1024));
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].data, "{\"a\":1}");
        assert_eq!(out[1].data, "x\ny");
        assert_eq!(p.last_event_id.as_deref(), Some("7"));
        assert_eq!(p.retry, Some(Duration::from_millis(1500)));
    }

    #[test]
    fn retry_zero_is_floored_so_a_reconnect_loop_cannot_spin() {
        let mut p = SseParser::default();
        fits(p.feed(b"retry: 0\n\n", 1024));
        assert_eq!(p.retry, Some(MIN_RETRY));
        fits(p.feed(b"retry: 99999999999\n\n", 1024));
        assert_eq!(p.retry, Some(MAX_RETRY));
    }

    #[test]
    fn one_long_line_fed_a_byte_at_a_time_is_scanned_once() {
        // 200 KiB in 1-byte chunks: a parser that rescans its buffer on every chunk
        // does ~2e10 byte comparisons here and never finishes in time.
        let mut p = SseParser::default();
        let n = 200 * 1024;
        let started = std::time::Instant::now();
        fits(p.feed(b"data: ", 1 << 20));
        for _ in 0..n {
            assert!(fits(p.feed(b"x", 1 << 20)).is_empty());
        }
        let events = fits(p.feed(b"\n\n", 1 << 20));
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].data.len(), n);
        // Not a timing assertion of speed, only of complexity: linear takes
        // milliseconds, quadratic takes minutes.
        assert!(started.elapsed() < std::time::Duration::from_secs(20));
    }

    #[test]
    fn bare_cr_endings_dispatch_at_once_and_a_bom_is_dropped() {
        let mut p = SseParser::default();
        let out = fits(p.feed(b"\xEF\xBB", 1024));
        assert!(out.is_empty());
        let out = fits(p.feed(b"\xBFid: 3\rdata: {\"id\":1}\r\r", 1024));
        assert_eq!(out.len(), 1, "dispatched without waiting for more bytes");
        assert_eq!(out[0].data, "{\"id\":1}");
        assert_eq!(p.last_event_id.as_deref(), Some("3"));
        // An empty id resets it; one a header cannot carry is not kept.
        fits(p.feed(b"id: 4\x01\n\n", 1024));
        assert_eq!(p.last_event_id.as_deref(), Some("3"));
        fits(p.feed("id: \u{e9}vt-1\n\n".as_bytes(), 1024));
        assert_eq!(p.last_event_id.as_deref(), Some("3"));
        // Nor one longer than a header should carry at each resume.
        let long = format!("id: {}\n\n", "a".repeat(MAX_ID_BYTES + 1));
        fits(p.feed(long.as_bytes(), 1 << 20));
        assert_eq!(p.last_event_id.as_deref(), Some("3"));
        let kept = format!("id: {}\n\n", "a".repeat(MAX_ID_BYTES));
        fits(p.feed(kept.as_bytes(), 1 << 20));
        assert_eq!(p.last_event_id.as_deref().map(str::len), Some(MAX_ID_BYTES));
        // Each blank line after it shares the id, not a copy of it.
        fits(p.feed(b"\n\n\n", 1024));
        assert!(matches!(
            (&p.last_event_id, &p.id_buffer),
            (Some(a), Some(b)) if std::sync::Arc::ptr_eq(a, b)
        ));
        fits(p.feed(b"id:\n\n", 1024));
        assert_eq!(p.last_event_id, None);
    }

    #[test]
    fn crlf_split_across_chunks_is_one_line_end() {
        let mut p = SseParser::default();
        assert!(fits(p.feed(b"data: a\r", 1024)).is_empty());
        let out = fits(p.feed(b"\n\r\n", 1024));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].data, "a");
    }

    #[test]
    fn an_event_past_the_limit_is_an_error() {
        let mut p = SseParser::default();
        assert!(p.feed(&[b'x'; 100], 50).1.is_err());
        // Whole within one chunk, too: not dispatched, and those before it are.
        let mut p = SseParser::default();
        let whole = format!("data: a\n\ndata: {}\n\n", "x".repeat(100));
        let (events, fit) = p.feed(whole.as_bytes(), 50);
        assert_eq!((events.len(), fit), (1, Err(50)));
        assert_eq!(events[0].data, "a");
        let mut p = SseParser::default();
        assert!(
            p.feed(b"data: 0123456789\ndata: 0123456789\n", 15)
                .1
                .is_err()
        );
    }
}
