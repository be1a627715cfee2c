//! How tools are named across servers, and in which order a call's candidates go.
//!
//! A qualified name (`server__tool`) names its server: a name containing `__` is always
//! read as qualified, split at the first separator, so a hostile server listing a tool
//! named `bank__transfer` cannot catch a call meant for server `bank`. A bare name goes
//! to every server that offers it: ready servers before starting or restarting ones (a
//! call should not wait out a backoff when another server can serve it now), then
//! highest priority, then config order. Plain functions, tested without actors.

use crate::server::SEPARATOR;

/// Splits `server__tool` at the first separator; `None` for a bare name.
pub fn split_qualified(name: &str) -> Option<(&str, &str)> {
    // A plain byte scan: `split_once` sets up a general substring search, which cost
    // more than the rest of routing a qualified name (every call does this).
    let sep = SEPARATOR.as_bytes();
    let at = name.as_bytes().windows(sep.len()).position(|w| w == sep)?;
    Some((name.get(..at)?, name.get(at + sep.len()..)?))
}

/// `server__tool`.
pub fn qualify(server: &str, tool: &str) -> String {
    format!("{server}{SEPARATOR}{tool}")
}

/// What routing needs to know of one candidate server.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteView {
    /// Server id.
    pub server: String,
    /// Higher first.
    pub priority: i32,
    /// Position in the config.
    pub order: usize,
    /// Whether it is ready now.
    pub ready: bool,
}

/// Orders candidates: ready first, then by priority (high first), then config order.
pub fn order(mut candidates: Vec<RouteView>) -> Vec<RouteView> {
    candidates.sort_by(|a, b| {
        b.ready
            .cmp(&a.ready)
            .then(b.priority.cmp(&a.priority))
            .then(a.order.cmp(&b.order))
    });
    candidates
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(server: &str, priority: i32, order: usize, ready: bool) -> RouteView {
        RouteView {
            server: server.into(),
            priority,
            order,
            ready,
        }
    }

    #[test]
    fn a_name_with_the_separator_is_always_qualified_at_the_first_one() {
        assert_eq!(split_qualified("files__read"), Some(("files", "read")));
        assert_eq!(
            split_qualified("files__read__all"),
            Some(("files", "read__all"))
        );
        assert_eq!(split_qualified("read"), None);
        // Never a bare name, even with an empty side: no server is named "".
        assert_eq!(split_qualified("__read"), Some(("", "read")));
        assert_eq!(split_qualified("é__ü_x"), Some(("é", "ü_x")));
        assert_eq!(split_qualified("a_b_"), None);
        assert_eq!(split_qualified("_"), None);
        assert_eq!(qualify("a", "b"), "a__b");
    }

    #[test]
    fn ready_then_priority_then_config_order() {
        let got = order(vec![
            view("c", 1, 2, true),
            view("a", 1, 0, true),
            view("hi", 9, 3, false),
            view("b", 5, 1, true),
        ]);
        let names: Vec<&str> = got.iter().map(|v| v.server.as_str()).collect();
        assert_eq!(names, ["b", "a", "c", "hi"]);
    }
}
