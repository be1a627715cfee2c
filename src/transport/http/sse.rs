//! An incremental, bounded parser for `text/event-stream` (the WHATWG framing):
//! `data:` lines joined by `\n`, `id:` kept for `Last-Event-ID`, `retry:` kept for the
//! reconnect delay, comment lines (`:` keep-alives) ignored, a blank line dispatches.

use std::time::Duration;

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
    data: String,
    has_data: bool,
    event: Option<String>,
    /// The last `id:` seen, sent back as `Last-Event-ID` when resuming.
    pub last_event_id: Option<String>,
    /// The last `retry:` seen.
    pub retry: Option<Duration>,
}

impl SseParser {
    /// Appends `chunk` and returns the events it completed. Errors when one event grows
    /// past `max` bytes.
    pub fn feed(&mut self, chunk: &[u8], max: usize) -> Result<Vec<Event>, usize> {
        self.buf.extend_from_slice(chunk);
        let mut events = Vec::new();
        let mut start = 0;
        while let Some(pos) = self.buf[start..]
            .iter()
            .position(|b| *b == b'\n' || *b == b'\r')
        {
            let end = start + pos;
            let line = String::from_utf8_lossy(&self.buf[start..end]).into_owned();
            // A \r\n pair ends one line, not two.
            let mut next = end + 1;
            if self.buf[end] == b'\r' {
                if next == self.buf.len() {
                    break; // wait: the \n may come in the next chunk
                }
                if self.buf[next] == b'\n' {
                    next += 1;
                }
            }
            start = next;
            if let Some(e) = self.line(&line) {
                events.push(e);
            }
        }
        self.buf.drain(..start);
        if self.buf.len() + self.data.len() > max {
            return Err(max);
        }
        Ok(events)
    }

    fn line(&mut self, line: &str) -> Option<Event> {
        if line.is_empty() {
            if !self.has_data {
                self.event = None;
                return None;
            }
            self.has_data = false;
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
            "id" if !value.contains('\0') => self.last_event_id = Some(value.to_string()),
            "retry" => {
                if let Ok(ms) = value.parse::<u64>() {
                    self.retry = Some(Duration::from_millis(ms));
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

    #[test]
    fn events_split_across_chunks_with_comments_ids_and_crlf() {
        let mut p = SseParser::default();
        let mut out = p
            .feed(
                b": keep-alive\r\nid: 7\r\nretry: 1500\r\ndata: {\"a\":",
                1024,
            )
            .expect("fits");
        assert!(out.is_empty());
        out = p
            .feed(b"1}\r\n\r\ndata: x\ndata: y\n\n", 1024)
            .expect("fits");
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].data, "{\"a\":1}");
        assert_eq!(out[1].data, "x\ny");
        assert_eq!(p.last_event_id.as_deref(), Some("7"));
        assert_eq!(p.retry, Some(Duration::from_millis(1500)));
    }

    #[test]
    fn an_event_past_the_limit_is_an_error() {
        let mut p = SseParser::default();
        assert!(p.feed(&[b'x'; 100], 50).is_err());
        let mut p = SseParser::default();
        assert!(p.feed(b"data: 0123456789\ndata: 0123456789\n", 15).is_err());
    }
}
