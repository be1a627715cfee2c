//! `status --watch`: a table of servers (state, era, restarts, calls, errors, p50)
//! redrawn every second, from the harness this command started, or with `--from URL`
//! from a running gateway's `/metrics`. On a terminal the table is redrawn in place;
//! elsewhere each refresh is printed after the last. Ctrl-C ends it.

use std::collections::BTreeMap;
use std::io::IsTerminal;

use std::time::Duration;
use tokio::io::AsyncWriteExt;

use mcp_harness::call::{BUCKETS, quantile};
use mcp_harness::{HarnessHandle, Metrics};

use crate::terminal::line;

/// One server's line.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Row {
    pub state: String,
    pub era: String,
    pub restarts: u64,
    pub calls: u64,
    pub errors: u64,
    /// Calls per bucket of [`BUCKETS`] (not cumulative), then above the last.
    pub buckets: Vec<u64>,
}

impl Row {
    fn add_buckets(&mut self, buckets: &[u64]) {
        if self.buckets.len() < buckets.len() {
            self.buckets.resize(buckets.len(), 0);
        }
        for (into, n) in self.buckets.iter_mut().zip(buckets) {
            // A scraped endpoint's numbers: never trusted not to overflow.
            *into = into.saturating_add(*n);
        }
    }
}

/// Outcomes counted as errors: the harness or the server failed the call.
fn is_error(outcome: &str) -> bool {
    outcome == "error"
}

/// The rows of a harness's own snapshot, by server id.
pub fn rows(metrics: &Metrics) -> BTreeMap<String, Row> {
    let mut rows: BTreeMap<String, Row> = metrics
        .servers
        .iter()
        .map(|s| {
            let row = Row {
                state: s.state.as_str().into(),
                era: s.era.unwrap_or("-").into(),
                restarts: u64::from(s.restarts),
                ..Row::default()
            };
            (s.id.clone(), row)
        })
        .collect();
    for series in &metrics.calls {
        if let Some(row) = rows.get_mut(&*series.server) {
            row.calls += series.count;
            if is_error(series.outcome) {
                row.errors += series.count;
            }
            row.add_buckets(&series.buckets);
        }
    }
    rows
}

/// A sample's labels: `name{k="v",…} value`, the values unescaped.
fn sample(text: &str) -> Option<(&str, BTreeMap<String, String>, f64)> {
    let (series, value) = text.rsplit_once(' ')?;
    let value: f64 = value.parse().ok()?;
    let Some((name, rest)) = series.split_once('{') else {
        return Some((series, BTreeMap::new(), value));
    };
    let body = rest.strip_suffix('}')?;
    let mut labels = BTreeMap::new();
    let mut chars = body.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            break;
        }
        if chars.next() != Some('"') {
            return None;
        }
        let mut value = String::new();
        loop {
            match chars.next()? {
                '\\' => match chars.next()? {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                '"' => break,
                c => value.push(c),
            }
        }
        labels.insert(key.trim_start_matches(',').to_string(), value);
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    Some((name, labels, value))
}

/// The rows of a gateway's `/metrics` text.
pub fn rows_from_prometheus(text: &str) -> BTreeMap<String, Row> {
    let mut rows: BTreeMap<String, Row> = BTreeMap::new();
    // Cumulative bucket counts per series, to turn back into counts per bucket.
    let mut cumulative: BTreeMap<(String, String), Vec<(f64, u64)>> = BTreeMap::new();
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, labels, value)) = sample(l) else {
            continue;
        };
        let Some(id) = labels.get("mcp_harness_server_id").cloned() else {
            continue;
        };
        let row = rows.entry(id.clone()).or_default();
        match name {
            "mcp_harness_server_state" if value == 1.0 => {
                row.state = labels.get("state").cloned().unwrap_or_default();
            }
            "mcp_harness_server_info" => {
                row.era = labels.get("era").cloned().unwrap_or_default();
            }
            "mcp_harness_server_restarts_total" => row.restarts = value as u64,
            "mcp_harness_calls_total" => {
                row.calls = row.calls.saturating_add(value as u64);
                if labels.get("outcome").is_some_and(|o| is_error(o)) {
                    row.errors = row.errors.saturating_add(value as u64);
                }
            }
            "mcp_client_operation_duration_seconds_bucket" => {
                let le = match labels.get("le").map(String::as_str) {
                    Some("+Inf") => f64::INFINITY,
                    Some(b) => b.parse().unwrap_or(f64::INFINITY),
                    None => continue,
                };
                let series: Vec<String> = labels
                    .iter()
                    .filter(|(k, _)| *k != "le")
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                cumulative
                    .entry((id, series.join(",")))
                    .or_default()
                    .push((le, value as u64));
            }
            _ => {}
        }
    }
    for ((id, _), mut points) in cumulative {
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut last = 0;
        let mut per_bucket = vec![0u64; BUCKETS.len() + 1];
        for (le, c) in points {
            let at = BUCKETS
                .iter()
                .position(|b| (b - le).abs() <= b * 1e-9)
                .unwrap_or(BUCKETS.len());
            per_bucket[at] = per_bucket[at].saturating_add(c.saturating_sub(last));
            last = last.max(c);
        }
        if let Some(row) = rows.get_mut(&id) {
            row.add_buckets(&per_bucket);
        }
    }
    rows
}

fn p50(row: &Row) -> String {
    let count = row.buckets.iter().fold(0u64, |a, n| a.saturating_add(*n));
    match quantile(&row.buckets, count, 0.5) {
        None => "-".into(),
        Some(d) if d.as_secs_f64() > BUCKETS[BUCKETS.len() - 1] => "> 300 s".into(),
        Some(d) if d < Duration::from_millis(1) => format!("≤ {} µs", d.as_micros()),
        // In µs first: the 2.5 ms bound is not a whole millisecond.
        Some(d) if d < Duration::from_secs(1) => {
            format!("≤ {} ms", d.as_micros() as f64 / 1000.0)
        }
        Some(d) => format!("≤ {} s", d.as_secs_f64()),
    }
}

/// `text` as one cell exactly `width` columns wide on a terminal: escaped ([`line`]),
/// cut with `…`, and padded, by display width (a `--from` endpoint's labels are its
/// own, of any length and script: wide and zero-width characters included).
fn cell(text: &str, width: usize) -> String {
    use unicode_width::UnicodeWidthChar;
    let text = line(text);
    let columns = |c: char| c.width().unwrap_or(0);
    // Characters of no width (combining marks) count too: at most four a column.
    let most_chars = 4 * width;
    let whole: usize = text.chars().map(columns).sum();
    let (mut out, mut used) = (String::new(), 0);
    if whole <= width && text.chars().count() <= most_chars {
        out.push_str(&text);
        used = whole;
    } else {
        for (taken, c) in text.chars().enumerate() {
            if used + columns(c) > width.saturating_sub(1) || taken + 1 >= most_chars {
                break;
            }
            used += columns(c);
            out.push(c);
        }
        out.push('…');
        used += 1;
    }
    out.extend(std::iter::repeat_n(' ', width.saturating_sub(used)));
    out
}

/// The most servers the table shows: a `/metrics` endpoint (`--from`) may name any
/// number, and the table is drawn again every second.
const MOST_ROWS: usize = 500;

/// The table, a header and one line per server ([`MOST_ROWS`] at most, then a line
/// that says how many more there are).
pub fn render(rows: &BTreeMap<String, Row>) -> String {
    let mut out = format!(
        "{:<24} {:<10} {:<7} {:>8} {:>8} {:>7} {:>10}\n",
        "SERVER", "STATE", "ERA", "RESTARTS", "CALLS", "ERRORS", "P50"
    );
    if rows.len() > MOST_ROWS {
        out.push_str(&format!(
            "(the first {MOST_ROWS} of {} servers)\n",
            rows.len()
        ));
    }
    for (id, r) in rows.iter().take(MOST_ROWS) {
        out.push_str(&format!(
            "{} {} {} {:>8} {:>8} {:>7} {:>10}\n",
            cell(id, 24),
            cell(&r.state, 10),
            cell(&r.era, 7),
            r.restarts,
            r.calls,
            r.errors,
            p50(r)
        ));
    }
    out
}

/// Where the figures come from.
pub enum Source<'a> {
    Own(&'a HarnessHandle),
    Gateway(String),
}

/// Redraws the table every second until `stop` (Ctrl-C or SIGTERM, which its caller
/// catches).
pub async fn watch(
    source: Source<'_>,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<u8> {
    let terminal = std::io::stdout().is_terminal();
    let http = match &source {
        Source::Gateway(url) => {
            // reqwest is built without a TLS provider of its own; the binary sets ring,
            // the provider the harness uses.
            let _ = rustls::crypto::ring::default_provider().install_default();
            Some(
                url::Url::parse(url)
                    .map_or_else(
                        |_| reqwest::Client::builder(),
                        |u| mcp_harness::transport::client_builder(&u),
                    )
                    .timeout(Duration::from_secs(5))
                    .redirect(reqwest::redirect::Policy::none())
                    .build()?,
            )
        }
        Source::Own(_) => None,
    };
    // For a gateway with `[gateway] metrics_tokens`; an environment variable, as a
    // flag is visible to other users.
    let token = std::env::var("MCP_HARNESS_METRICS_TOKEN").ok();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    // After a slow scrape or a write that waited, one redraw, not the missed ones at once.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut interrupted = std::pin::pin!(stop);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = &mut interrupted => return Ok(crate::commands::OK),
        }
        let scraped = async {
            match &source {
                Source::Own(h) => render(&rows(&h.metrics())),
                Source::Gateway(url) => match http.as_ref().map(|c| {
                    let get = c.get(url);
                    match &token {
                        Some(t) => get.bearer_auth(t.trim()),
                        None => get,
                    }
                    .send()
                }) {
                    None => String::new(),
                    Some(sent) => match sent.await {
                        Ok(r) if r.status().is_success() => {
                            match text_capped(r, MAX_SCRAPE).await {
                                Ok(text) => render(&rows_from_prometheus(&text)),
                                Err(e) => format!("{}: {}\n", line(url), line(&e.to_string())),
                            }
                        }
                        Ok(r) => format!("{}: HTTP {}\n", line(url), r.status().as_u16()),
                        Err(e) => format!("{}: {}\n", line(url), line(&e.to_string())),
                    },
                },
            }
        };
        // A scrape of a slow gateway (up to its 5 s) does not hold Ctrl-C up.
        let table = tokio::select! {
            table = scraped => table,
            _ = &mut interrupted => return Ok(crate::commands::OK),
        };
        let shown = if terminal {
            // Home and clear, then the table: a redraw in place.
            format!("\x1b[H\x1b[2J{table}")
        } else {
            format!("{table}\n")
        };
        // Written off this task, and given up at Ctrl-C: a reader that does not read
        // (a pipe left full, a terminal paused) would otherwise hold the signal too.
        let write = async {
            let mut out = tokio::io::stdout();
            out.write_all(shown.as_bytes()).await?;
            out.flush().await
        };
        let written = tokio::select! {
            written = write => written,
            _ = &mut interrupted => return Ok(crate::commands::OK),
        };
        match written {
            // Its reader went away (`| head`): as good as Ctrl-C.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                return Ok(crate::commands::OK);
            }
            other => other?,
        }
    }
}

/// The most of a `/metrics` answer read (a gateway's is a few KiB per server).
const MAX_SCRAPE: usize = 16 << 20;

/// A response's body as text, refused past `cap` bytes (an endpoint that streams
/// without end is not read into memory).
pub async fn text_capped(mut response: reqwest::Response, cap: usize) -> anyhow::Result<String> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > cap {
            anyhow::bail!("the answer is larger than {cap} bytes");
        }
        body.extend_from_slice(&chunk);
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_that_would_overflow_saturate() {
        let text = r#"mcp_harness_calls_total{mcp_harness_server_id="a",outcome="ok"} 1e30
mcp_harness_calls_total{mcp_harness_server_id="a",outcome="error"} 1e30
mcp_harness_calls_total{mcp_harness_server_id="a",outcome="error"} 1e30
mcp_client_operation_duration_seconds_bucket{mcp_harness_server_id="a",outcome="ok",le="0.0001"} 1e30
mcp_client_operation_duration_seconds_bucket{mcp_harness_server_id="a",outcome="error",le="0.0001"} 1e30
mcp_client_operation_duration_seconds_bucket{mcp_harness_server_id="a",outcome="ok",le="+Inf"} 1e30
"#;
        let rows = rows_from_prometheus(text);
        let row = &rows["a"];
        assert_eq!(row.calls, u64::MAX);
        assert_eq!(row.errors, u64::MAX);
        assert_eq!(p50(row), "≤ 100 µs");
    }

    #[test]
    fn the_median_is_shown_as_its_buckets_bound() {
        let at = |i: usize| {
            let mut buckets = vec![0; BUCKETS.len() + 1];
            buckets[i] = 3;
            p50(&Row {
                state: String::new(),
                era: String::new(),
                restarts: 0,
                calls: 3,
                errors: 0,
                buckets,
            })
        };
        assert_eq!(at(1), "≤ 250 µs");
        assert_eq!(at(4), "≤ 2.5 ms");
        assert_eq!(at(6), "≤ 10 ms");
        assert_eq!(at(13), "≤ 2 s");
    }

    #[test]
    fn prometheus_text_becomes_rows() {
        let text = r#"# TYPE x gauge
mcp_harness_server_state{mcp_harness_server_id="a\"b",state="ready"} 1
mcp_harness_server_state{mcp_harness_server_id="a\"b",state="failed"} 0
mcp_harness_server_info{mcp_harness_server_id="a\"b",era="legacy"} 1
mcp_harness_server_restarts_total{mcp_harness_server_id="a\"b"} 2
mcp_harness_calls_total{mcp_harness_server_id="a\"b",mcp_method_name="tools/call",outcome="ok"} 3
mcp_harness_calls_total{mcp_harness_server_id="a\"b",mcp_method_name="tools/call",outcome="error"} 1
mcp_client_operation_duration_seconds_bucket{mcp_harness_server_id="a\"b",outcome="ok",le="0.0001"} 0
mcp_client_operation_duration_seconds_bucket{mcp_harness_server_id="a\"b",outcome="ok",le="0.00025"} 3
mcp_client_operation_duration_seconds_bucket{mcp_harness_server_id="a\"b",outcome="ok",le="+Inf"} 3
"#;
        let rows = rows_from_prometheus(text);
        let r = &rows["a\"b"];
        assert_eq!((r.state.as_str(), r.era.as_str()), ("ready", "legacy"));
        assert_eq!((r.restarts, r.calls, r.errors), (2, 4, 1));
        assert_eq!(p50(r), "≤ 250 µs");
        let table = render(&rows);
        assert!(table.starts_with("SERVER"));
        assert!(table.contains("ready") && table.contains("legacy"));
        // An endpoint's labels of any length stay within their columns.
        use unicode_width::UnicodeWidthStr;
        for (id, era) in [
            ("s".repeat(100_000), "é".repeat(1000)),
            ("日本".repeat(50), "e\u{301}".repeat(20)),
            ("日本語".into(), "x".into()),
            (format!("x{}", "\u{301}".repeat(100_000)), "x".into()),
        ] {
            let long = format!(
                "mcp_harness_server_info{{mcp_harness_server_id=\"{id}\",era=\"{era}\"}} 1\n"
            );
            let table = render(&rows_from_prometheus(&long));
            let widths: Vec<usize> = table.lines().map(UnicodeWidthStr::width).collect();
            assert!(
                widths.iter().all(|w| *w == widths[0]),
                "{widths:?}\n{table}"
            );
            assert!(table.len() < 2_000, "{} bytes", table.len());
        }
        // An endpoint naming many servers gets a table of the first few hundred.
        let many: String = (0..20_000)
            .map(|n| {
                format!("mcp_harness_server_info{{mcp_harness_server_id=\"s{n}\",era=\"x\"}} 1\n")
            })
            .collect();
        let table = render(&rows_from_prometheus(&many));
        assert_eq!(table.lines().count(), MOST_ROWS + 2, "{table}");
        assert!(table.contains("(the first 500 of 20000 servers)"));
    }
}
