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

/// Characters a reader does not see but that act on what is around them, or carry
/// what a model reads and a person does not: bidirectional formatting (reorders what
/// follows), zero-width and other format characters (hide or join text), the line and
/// paragraph separators (which JSON leaves as they are and some line readers split on),
/// and Unicode's default-ignorable code points: variation selectors, fillers, and the
/// tag characters that spell ASCII invisibly ("ASCII smuggling").
pub fn hidden(c: char) -> bool {
    matches!(c,
        '\u{00ad}' | '\u{034f}' | '\u{0600}'..='\u{0605}' | '\u{061c}' | '\u{06dd}'
        | '\u{070f}' | '\u{08e2}' | '\u{115f}' | '\u{1160}' | '\u{17b4}' | '\u{17b5}'
        | '\u{180b}'..='\u{180f}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}'
        | '\u{2060}'..='\u{206f}' | '\u{3164}' | '\u{fe00}'..='\u{fe0f}' | '\u{feff}'
        | '\u{ffa0}' | '\u{fff0}'..='\u{fffb}' | '\u{110bd}' | '\u{110cd}'
        | '\u{13430}'..='\u{1343f}' | '\u{1bca0}'..='\u{1bca3}' | '\u{1d173}'..='\u{1d17a}'
        | '\u{e0000}'..='\u{e0fff}')
}

/// JSON text with every character JSON leaves as it is but a terminal or a line reader
/// acts on (DEL, the C1 controls, [`hidden`] ones) written as a `\uXXXX` escape: the
/// same JSON to a parser. Such characters can only be inside strings, where the escape
/// means the same. JSON that has none (the usual) is left untouched, found in one pass.
pub fn json_inert(json: &mut Vec<u8>) {
    // Every such character is DEL or not ASCII (its first byte 0xC2 or more), so ASCII
    // text is not looked at twice. No early exit and no table: the whole line is
    // checked in one vectorized pass (it is on a call's path, the audit's).
    let suspect = json
        .iter()
        .fold(false, |seen, &b| seen | (b == 0x7f) | (b >= 0xc2));
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
            // Past U+FFFF, JSON escapes a character as its UTF-16 surrogate pair.
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
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
        assert_eq!(one_line("a\u{e0041}b", 100), "a\\u{e0041}b");
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
        // Tag characters spelling "hi" past U+FFFF: escaped as surrogate pairs.
        let smuggled = serde_json::json!({"d": "ok\u{e0068}\u{e0069}\u{fe0f}\u{ad}"});
        let mut smuggled_text = serde_json::to_vec(&smuggled).expect("json");
        json_inert(&mut smuggled_text);
        let smuggled_shown = String::from_utf8(smuggled_text.clone()).expect("utf-8");
        assert_eq!(
            smuggled_shown,
            r#"{"d":"ok\udb40\udc68\udb40\udc69\ufe0f\u00ad"}"#
        );
        let back: serde_json::Value = serde_json::from_slice(&smuggled_text).expect("still JSON");
        assert_eq!(back, smuggled);
    }
}
