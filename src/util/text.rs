//! Text from outside the process, made fit for an error message: one line, bounded,
//! with control and bidirectional-formatting characters escaped (an authorization
//! server's `error_description` is as hostile as anything a server sends).

/// What an HTTP client error says, with its causes, and without its URL: a server's
/// URL may carry a key in its query (`?api_key=${KEY}`), and this text reaches status,
/// logs and terminals.
pub(crate) fn http_failure(error: reqwest::Error) -> String {
    let error = error.without_url();
    let mut text = error.to_string();
    let mut next = std::error::Error::source(&error);
    while let Some(e) = next {
        let said = e.to_string();
        if !said.is_empty() && !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        next = e.source();
    }
    text
}

/// A URL as errors and other parties may be shown it: without credentials, query or
/// fragment, which may hold a key (`?api_key=${KEY}`).
pub fn url_shown(url: &url::Url) -> String {
    let mut shown = url.clone();
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.set_query(None);
    shown.set_fragment(None);
    shown.to_string()
}

/// `text` as one line of at most `max` characters (then `…`), with control and
/// bidirectional-formatting characters escaped.
pub fn one_line(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max + 8));
    for (i, c) in text.chars().enumerate() {
        if i == max {
            out.push('…');
            break;
        }
        let formatting = matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if c.is_control() || formatting {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_controls_and_bounds_the_length() {
        assert_eq!(one_line("a\u{1b}[2Jb\nc", 100), "a\\u{1b}[2Jb\\nc");
        assert_eq!(one_line("\u{202e}x", 100), "\\u{202e}x");
        assert_eq!(one_line("abcdef", 3), "abc…");
    }
}
