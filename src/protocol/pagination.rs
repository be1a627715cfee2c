//! Following `nextCursor` through a paginated list (spec: pagination): a missing
//! `nextCursor` ends the list, an empty string is still a cursor, and a cursor seen
//! before, or more pages than the cap, ends it too, so a server that cycles or never
//! stops is cut off. Every list the harness walks walks with a [`Pager`].

use std::collections::HashSet;
use std::hash::BuildHasher;

use serde_json::Value;

/// Why a list walk stopped early.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cutoff {
    /// The server handed out a cursor it had handed out before.
    Cycle,
    /// More pages than the cap.
    TooManyPages(usize),
}

/// Walks the pages of one list.
#[derive(Debug)]
pub struct Pager {
    /// The cursors seen, by their hashes under this walk's random keys: a cursor may be
    /// as large as a page (16 MiB), and a walk of many pages must not keep them all.
    seen: HashSet<u64>,
    keys: std::collections::hash_map::RandomState,
    pages: usize,
    max_pages: usize,
    cutoff: Option<Cutoff>,
}

impl Pager {
    /// A walk of at most `max_pages` pages.
    pub fn new(max_pages: usize) -> Pager {
        Pager {
            seen: HashSet::new(),
            keys: std::collections::hash_map::RandomState::new(),
            pages: 0,
            max_pages,
            cutoff: None,
        }
    }

    /// The cursor of the page after `page`, or `None` when the list ends here.
    pub fn next(&mut self, page: &Value) -> Option<String> {
        self.pages += 1;
        let next = page.get("nextCursor").and_then(Value::as_str)?;
        if self.pages >= self.max_pages {
            self.cutoff = Some(Cutoff::TooManyPages(self.max_pages));
            return None;
        }
        if !self.seen.insert(self.keys.hash_one(next)) {
            self.cutoff = Some(Cutoff::Cycle);
            return None;
        }
        Some(next.to_string())
    }

    /// Pages walked so far.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// Why the walk stopped before the server's end, if it did.
    pub fn cutoff(&self) -> Option<&Cutoff> {
        self.cutoff.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cursors_are_followed_until_the_end_a_cycle_or_the_cap() {
        let mut p = Pager::new(10);
        assert_eq!(
            p.next(&json!({"nextCursor": ""})),
            Some(String::new()),
            "empty is a cursor"
        );
        assert_eq!(p.next(&json!({"nextCursor": "a"})), Some("a".into()));
        assert_eq!(p.next(&json!({"nextCursor": "a"})), None);
        assert_eq!(p.cutoff(), Some(&Cutoff::Cycle));
        let mut p = Pager::new(2);
        assert!(p.next(&json!({"nextCursor": "1"})).is_some());
        assert!(p.next(&json!({"nextCursor": "2"})).is_none());
        assert_eq!(p.cutoff(), Some(&Cutoff::TooManyPages(2)));
        let mut p = Pager::new(2);
        assert!(p.next(&json!({})).is_none());
        assert_eq!(p.cutoff(), None);
    }
}
