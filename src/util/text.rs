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

/// Characters a reader does not see but that act on what is around them: bidirectional
/// formatting (reorders what follows), zero-width ones (hide or join text), and the
/// line and paragraph separators (which JSON leaves as they are and some line readers
/// split on).
pub fn hidden(c: char) -> bool {
    matches!(c,
        '\u{061c}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}'
        | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
}

/// JSON text with every character JSON leaves as it is but a terminal or a line reader
/// acts on (DEL, the C1 controls, [`hidden`] ones) written as a `\uXXXX` escape: the
/// same JSON to a parser. Such characters can only be inside strings, where the escape
/// means the same. JSON that has none (the usual) is left untouched, found in one pass.
pub fn json_inert(json: &mut Vec<u8>) {
    // Every such character is DEL or starts with one of four lead bytes in UTF-8 (C1
    // and U+0085: C2; U+061C: D8; U+200B to U+206x: E2; U+FEFF: EF), so most text that
    // is not ASCII (accents, CJK) is not looked at twice. No early exit: the whole line
    // is checked in one vectorized pass (it is on a call's path).
    let suspect = json.iter().fold(false, |seen, &b| {
        seen | (b == 0x7f) | (b == 0xc2) | (b == 0xd8) | (b == 0xe2) | (b == 0xef)
    });
    if !suspect {
        return;
    }
    let Ok(text) = std::str::from_utf8(json) else {
        return;
    };
    let acts = |c: char| c.is_control() && c != '\n' || hidden(c);
    if !text.chars().any(acts) {
        return;
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if acts(c) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    // Into the same buffer: the caller's is kept for the next line.
    json.clear();
    json.extend_from_slice(out.as_bytes());
}

/// `text` as one line of at most `max` characters (then `…`), with control and
/// [`hidden`] characters escaped.
pub fn one_line(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max + 8));
    for (i, c) in text.chars().enumerate() {
        if i == max {
            out.push('…');
            break;
        }
        if c.is_control() || hidden(c) {
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
        assert_eq!(one_line("a\u{2028}b\u{200b}", 100), "a\\u{2028}b\\u{200b}");
    }

    #[test]
    fn json_made_inert_parses_the_same() {
        let value = serde_json::json!({"k\u{2028}": "x\u{9b}31m\u{202e}\u{85}\u{7f}é日"});
        let mut text = serde_json::to_vec(&value).expect("json");
        json_inert(&mut text);
        let shown = String::from_utf8(text.clone()).expect("utf-8");
        assert!(
            shown.is_ascii() || !shown.chars().any(|c| c.is_control() || hidden(c)),
            "{shown}"
        );
        assert!(
            shown.contains("\\u2028") && shown.contains("\\u009b"),
            "{shown}"
        );
        assert!(shown.contains("é日"), "{shown}");
        let back: serde_json::Value = serde_json::from_slice(&text).expect("still JSON");
        assert_eq!(back, value);
        let mut plain = br#"{"a":"b"}"#.to_vec();
        json_inert(&mut plain);
        assert_eq!(plain, br#"{"a":"b"}"#);
    }
}
