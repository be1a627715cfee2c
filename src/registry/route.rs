//! Where a call goes: a qualified name (`server__tool`) names its server; a bare name
//! goes to every server that offers it, highest priority first, then config order.
//! Servers that are ready go before servers that are starting or restarting (a call
//! should not wait out a backoff when another server can serve it now). Plain
//! functions, tested without actors.

/// The separator of qualified names: `server__tool`. Server ids may not contain it.
pub const SEPARATOR: &str = "__";

/// Splits `server__tool` at the first separator.
pub fn split_qualified(name: &str) -> Option<(&str, &str)> {
    name.split_once(SEPARATOR)
        .filter(|(s, t)| !s.is_empty() && !t.is_empty())
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
    fn qualified_names_split_at_the_first_separator() {
        assert_eq!(split_qualified("files__read"), Some(("files", "read")));
        assert_eq!(
            split_qualified("files__read__all"),
            Some(("files", "read__all"))
        );
        assert_eq!(split_qualified("read"), None);
        assert_eq!(split_qualified("__read"), None);
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
