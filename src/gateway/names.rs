//! The names the gateway serves: `server__tool` by default, bare names when asked, and
//! always at most 64 characters of `[A-Za-z0-9_.-]`. A name that would not fit is
//! shortened stably: its first 47 characters (others replaced by `_`), `_`, and the
//! first 16 hex digits of the SHA-256 of the full name. Shortened names are remembered
//! so that calls find their way back (a gateway that has not listed for the caller yet
//! lists first). A bare name with the `__` separator is always served qualified: bare,
//! it would name another server.

use std::collections::HashMap;

use parking_lot::Mutex;
use serde::Deserialize;

use crate::call::ToolInfo;
use crate::util::hash::sha256_hex;

/// Longest name served.
pub const MAX_NAME: usize = 64;
/// Shortened names remembered per server (past it that server's are forgotten before a
/// listing's go in, and learned again on each caller's next list; one listing may hold
/// more). Per server: one that lists ever new long names forgets only its own.
const MAX_RENAMED: usize = 65_536;

/// Whether served names carry their server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Prefix {
    /// `server__tool` always.
    #[default]
    Always,
    /// The bare name when no other server the caller sees offers it, else `server__tool`.
    Conditional,
    /// Bare names; a name several servers offer is served once and routed by priority
    /// with failover, as the library routes bare names.
    Never,
}

/// Served names and the way back.
#[derive(Debug, Default)]
pub struct Names {
    prefix: Prefix,
    renamed: Mutex<Renamed>,
}

/// Shortened names and what they stand for, with the server each came from, and how
/// many each server has.
#[derive(Clone, Debug, Default)]
struct Renamed {
    by_short: HashMap<String, (std::sync::Arc<str>, String)>,
    per_server: HashMap<std::sync::Arc<str>, usize>,
}

impl Renamed {
    fn insert(
        &mut self,
        short: String,
        server: &std::sync::Arc<str>,
        name: &str,
    ) -> Option<String> {
        let old = self
            .by_short
            .insert(short, (server.clone(), name.to_string()));
        if let Some((was, _)) = &old {
            self.count(was, -1);
        }
        self.count(server, 1);
        old.map(|(_, name)| name)
    }

    fn count(&mut self, server: &std::sync::Arc<str>, by: isize) {
        let n = self.per_server.entry(server.clone()).or_default();
        *n = n.saturating_add_signed(by);
        if *n == 0 {
            self.per_server.remove(server);
        }
    }

    /// Forgets `server`'s names.
    fn forget(&mut self, server: &str) {
        self.by_short.retain(|_, (s, _)| &**s != server);
        self.per_server.remove(server);
    }
}

/// Whether `name` is served as it is: short, of safe characters, and not of a
/// shortened name's shape (a tool named so is shortened too, so that a served name of
/// that shape is always one the gateway made, and never shadows a long one).
fn fits(name: &str) -> bool {
    !looks_shortened(name)
        && !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// `name` made to fit (unchanged when it does).
pub fn shorten(name: &str) -> String {
    if fits(name) {
        return name.to_string();
    }
    let clean: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(MAX_NAME - 17)
        .collect();
    format!("{clean}_{}", &sha256_hex(name.as_bytes())[..16])
}

/// Whether `served` has the shape of a shortened name: `_` and 16 lowercase hex digits
/// at its end, at most [`MAX_NAME`] long (a short name with a space or a `/` is
/// shortened to fewer than 64 characters).
pub fn looks_shortened(served: &str) -> bool {
    let b = served.as_bytes();
    let n = b.len();
    (17..=MAX_NAME).contains(&n)
        && b[n - 17] == b'_'
        && b[n - 16..]
            .iter()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

/// A bare name served as it is: not when it holds the separator (bare, it would be
/// read as `server__tool` and go to another server), nor when it is one of the
/// gateway's own tools under `tool_exposure = "search"` (a call by it would reach the
/// gateway's, whatever the listing showed).
fn bare_ok(name: &str) -> bool {
    use super::search::{CALL_TOOL, DESCRIBE_TOOL, SEARCH_TOOLS};
    let separator = crate::server::SEPARATOR;
    !name.contains(separator)
        // Nor when shortening makes one (`bank: transfer` is `bank__transfer_…`).
        && (fits(name) || !shorten(name).contains(separator))
        && ![SEARCH_TOOLS, DESCRIBE_TOOL, CALL_TOOL].contains(&name)
}

impl Names {
    /// Names served with `prefix`.
    pub fn new(prefix: Prefix) -> Names {
        Names {
            prefix,
            renamed: Mutex::default(),
        }
    }

    /// Names served with `prefix`, knowing what `before` served when it is the same
    /// (shortening is a function of the name: what it learned still holds). A reload
    /// then does not forget a shortened name while its server is restarted or gone,
    /// when no listing could learn it again: a call by it would otherwise be routed as
    /// a bare name, to a server whose tool took that very name.
    pub fn carried(prefix: Prefix, before: Option<&Names>) -> Names {
        let renamed = before
            .filter(|b| b.prefix == prefix)
            .map(|b| b.renamed.lock().clone())
            .unwrap_or_default();
        Names {
            prefix,
            renamed: Mutex::new(renamed),
        }
    }

    /// The items to serve and the name of each, from a caller's listing of every server
    /// it may use. `priority` orders the servers offering a bare name (first serves
    /// it), for `Prefix::Never`.
    pub fn expose<'a>(
        &self,
        items: &'a [ToolInfo],
        priority: impl Fn(&str) -> usize,
    ) -> Vec<(String, &'a ToolInfo)> {
        self.expose_of(items, true, priority)
    }

    /// [`Names::expose`] of a listing that is `whole` or not: one that left out a
    /// server the caller may use (it could not be listed) serves no `conditional` name
    /// bare, as the server left out may offer it too.
    pub fn expose_of<'a>(
        &self,
        items: &'a [ToolInfo],
        whole: bool,
        priority: impl Fn(&str) -> usize,
    ) -> Vec<(String, &'a ToolInfo)> {
        let mut count: HashMap<&str, usize> = HashMap::new();
        for item in items {
            *count.entry(&item.name).or_default() += 1;
        }
        let mut out: Vec<(String, &ToolInfo)> = match self.prefix {
            Prefix::Always => items.iter().map(|i| (i.qualified.to_string(), i)).collect(),
            Prefix::Conditional => items
                .iter()
                .map(|i| {
                    let name = if whole && count[&*i.name] == 1 && bare_ok(&i.name) {
                        i.name.to_string()
                    } else {
                        i.qualified.to_string()
                    };
                    (name, i)
                })
                .collect(),
            Prefix::Never => {
                let mut best: HashMap<&str, &ToolInfo> = HashMap::new();
                let mut out = Vec::new();
                for item in items {
                    if !bare_ok(&item.name) {
                        out.push((item.qualified.to_string(), item));
                        continue;
                    }
                    best.entry(&item.name)
                        .and_modify(|b| {
                            if priority(&item.server) < priority(&b.server) {
                                *b = item;
                            }
                        })
                        .or_insert(item);
                }
                out.extend(best.into_iter().map(|(n, i)| (n.to_string(), i)));
                out.sort_by(|a, b| a.0.cmp(&b.0));
                out
            }
        };
        // Hashed outside the lock; the table is emptied (when full) before this listing's
        // names go in, never halfway through them.
        let shorts: Vec<Option<String>> = out
            .iter()
            .map(|(name, _)| Some(shorten(name)).filter(|short| short != name))
            .collect();
        let mut renamed = self.renamed.lock();
        let mut adding: HashMap<&str, usize> = HashMap::new();
        for ((_, item), short) in out.iter().zip(&shorts) {
            if let Some(short) = short
                && !renamed.by_short.contains_key(short.as_str())
            {
                *adding.entry(&item.server).or_default() += 1;
            }
        }
        for (server, adding) in adding {
            let has = renamed.per_server.get(server).copied().unwrap_or(0);
            if has.saturating_add(adding) > MAX_RENAMED {
                renamed.forget(server);
            }
        }
        for ((name, item), short) in out.iter_mut().zip(shorts) {
            if let Some(short) = short {
                if let Some(other) = renamed.insert(short.clone(), &item.server, name)
                    && other != *name
                {
                    tracing::warn!(served = %short, first = %other.escape_debug(), now = %name.escape_debug(), "two names shorten alike; the latest wins");
                }
                tracing::debug!(server = %item.server, name = %name.escape_debug(), served = %short, "name shortened");
                *name = short;
            }
        }
        out
    }

    /// The harness name of a served name.
    pub fn resolve(&self, served: &str) -> String {
        self.renamed
            .lock()
            .by_short
            .get(served)
            .map(|(_, name)| name.clone())
            .unwrap_or_else(|| served.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Arc;

    fn tool(server: &str, name: &str) -> ToolInfo {
        ToolInfo {
            qualified: format!("{server}__{name}").into(),
            name: name.into(),
            server: server.into(),
            definition: Arc::new(json!({"name": name})),
            from_cache: false,
        }
    }

    #[test]
    fn prefixes_and_shortening() {
        let items = vec![tool("a", "echo"), tool("b", "echo"), tool("b", "add")];
        let served = |p: Prefix| -> Vec<String> {
            Names::new(p)
                .expose(&items, |s| usize::from(s != "b"))
                .into_iter()
                .map(|(n, i)| format!("{n}->{}", i.qualified))
                .collect()
        };
        assert_eq!(
            served(Prefix::Always),
            ["a__echo->a__echo", "b__echo->b__echo", "b__add->b__add"]
        );
        assert_eq!(
            served(Prefix::Conditional),
            ["a__echo->a__echo", "b__echo->b__echo", "add->b__add"]
        );
        // `b` comes first by priority, so it serves `echo`.
        assert_eq!(served(Prefix::Never), ["add->b__add", "echo->b__echo"]);
        // A tool named like another server's is never served bare, nor one whose
        // shortened name would be (`: ` becomes `__`).
        for hostile in ["victim__drop", "bank: transfer"] {
            for p in [Prefix::Conditional, Prefix::Never] {
                let (name, _) = Names::new(p)
                    .expose(&[tool("evil", hostile)], |_| 0)
                    .remove(0);
                assert!(name.starts_with("evil__"), "{p:?}: {name}");
            }
        }
        assert!(looks_shortened(&shorten(&"y".repeat(70))));
        assert!(!looks_shortened("a__b"));
        // A short name made to fit is of the shape too (learned back after a reload),
        // and a tool named so upstream is shortened, not served as that name.
        let short_made = shorten("get issue");
        assert!(short_made.len() < MAX_NAME && looks_shortened(&short_made));
        assert_ne!(shorten(&short_made), short_made);
        // A tool named so upstream is served renamed; its own name, called, is not a
        // name the gateway made (learning it from a listing finds no other).
        let names = Names::new(Prefix::Never);
        let (served, _) = names
            .expose(&[tool("s", "report_2024010112345678")], |_| 0)
            .remove(0);
        assert_ne!(served, "report_2024010112345678");
        assert_eq!(names.resolve(&served), "report_2024010112345678");
        assert_eq!(
            names.resolve("report_2024010112345678"),
            "report_2024010112345678"
        );
        assert!(!looks_shortened("get_issue_0123456789ABCDEF"));
        assert!(!looks_shortened("get_issue-0123456789abcdef"));

        let long = "x".repeat(80);
        let short = shorten(&long);
        assert_eq!(short.len(), MAX_NAME);
        assert_eq!(short, shorten(&long), "stable");
        assert_eq!(
            shorten("has space/ü"),
            format!(
                "has_space___{}",
                &sha256_hex("has space/ü".as_bytes())[..16]
            )
        );
        // A tool named as another server's long name is shortened is shortened itself:
        // the two are served under two names, each leading to its own tool, whoever
        // lists first (the table is shared by every caller).
        for p in [Prefix::Always, Prefix::Conditional, Prefix::Never] {
            let names = Names::new(p);
            let both = vec![tool("v", &long), tool("e", &short)];
            let served: Vec<(String, String)> = names
                .expose(&both, |_| 0)
                .into_iter()
                .map(|(n, i)| (n, i.qualified.to_string()))
                .collect();
            assert_eq!(served.len(), 2, "{served:?}");
            assert_ne!(served[0].0, served[1].0, "{served:?}");
            // Callers that see one server only, listing after.
            names.expose(&both[..1], |_| 0);
            names.expose(&both[1..], |_| 0);
            for (name, qualified) in &served {
                let resolved = names.resolve(name);
                let bare = qualified.split_once("__").map_or("", |(_, b)| b);
                assert!(
                    resolved == *qualified || resolved == bare,
                    "{p:?}: {name} -> {resolved}, not {qualified}"
                );
            }
        }
        // Nor is an upstream tool served as one of the gateway's own.
        let meta = vec![tool("up", "call_tool"), tool("up", "search_tools")];
        for p in [Prefix::Conditional, Prefix::Never] {
            let served: Vec<String> = Names::new(p)
                .expose(&meta, |_| 0)
                .into_iter()
                .map(|(n, _)| n)
                .collect();
            assert!(served.iter().all(|n| n.starts_with("up__")), "{served:?}");
        }
        let names = Names::new(Prefix::Always);
        let items = vec![tool("srv", &long)];
        let (served, _) = names.expose(&items, |_| 0).remove(0);
        assert!(served.len() <= MAX_NAME);
        assert_eq!(names.resolve(&served), format!("srv__{long}"));
        assert_eq!(names.resolve("srv__other"), "srv__other");
    }

    // A server that lists ever new long names past the table's bound forgets its own
    // shortened names, not another server's (a call by one of those found its way back
    // no more, until its caller listed again).
    #[test]
    fn a_server_flooding_long_names_forgets_only_its_own() {
        let names = Names::new(Prefix::Always);
        let long = "x".repeat(80);
        let (kept, _) = names.expose(&[tool("quiet", &long)], |_| 0).remove(0);
        let flood: Vec<ToolInfo> = (0..=MAX_RENAMED)
            .map(|i| tool("loud", &format!("{long}{i}")))
            .collect();
        names.expose(&flood[..MAX_RENAMED], |_| 0);
        // Past the bound: the flooding server's table is emptied, then filled again.
        let served = names.expose(&flood[MAX_RENAMED..], |_| 0).remove(0).0;
        assert_eq!(names.resolve(&kept), format!("quiet__{long}"));
        assert_eq!(names.resolve(&served), format!("loud__{long}{MAX_RENAMED}"));
        let first = shorten(&flood[0].qualified);
        assert_eq!(
            names.resolve(&first),
            first,
            "the flooding server's own forgotten"
        );
        let renamed = names.renamed.lock();
        assert_eq!(renamed.per_server.get("quiet"), Some(&1));
        assert_eq!(renamed.per_server.get("loud"), Some(&1));
    }
}
