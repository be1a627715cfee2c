//! What a list holds, as callers see it: [`ToolInfo`]s built once per list and shared
//! while the cache hands out the same pages.

use std::sync::{Arc, Weak};

use serde_json::Value;

use super::caller::ListKind;
use crate::registry::names::qualify;

/// The items of a list's pages.
pub(crate) fn items(kind: ListKind, pages: &[Arc<Value>]) -> impl Iterator<Item = &Value> {
    pages.iter().flat_map(move |p| {
        p.get(kind.key())
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
    })
}

pub(crate) fn item_name(kind: ListKind, item: &Value) -> Option<&str> {
    item.get(kind.item_key()).and_then(Value::as_str)
}

/// One tool (or prompt, resource or resource template) as a caller sees it. Shared, not copied: a
/// listing from the cache hands out the same definitions every time.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolInfo {
    /// `server__name`: unique across servers.
    pub qualified: Arc<str>,
    /// The name on its server (the uri for resources, the uri template for templates).
    /// Call a tool by `qualified`: a name that holds `__`, passed bare, is read as
    /// `server__tool` and names another server's tool. So is a URI whose first `__`
    /// comes before any `:` (one with no scheme): read such a resource by `qualified`.
    pub name: Arc<str>,
    /// Server id.
    pub server: Arc<str>,
    /// The item exactly as the server sent it (`inputSchema`, annotations, …).
    pub definition: Arc<Value>,
    /// Whether the list came from the cache.
    pub from_cache: bool,
}

/// The items of the lists read last, built once per list and reused while the cache
/// hands out the same pages (a listing from the cache then copies reference counts,
/// not definitions). A few variants per (server, kind), for lists private to a
/// context; a removed server's are forgotten with it, and a list whose pages no one
/// holds any more (the cache dropped them) at the next build, so that what is kept
/// here follows the cache's budget instead of keeping evicted lists alive.
#[derive(Default)]
pub(crate) struct Catalog {
    lists: parking_lot::Mutex<std::collections::HashMap<(String, ListKind), Vec<Built>>>,
}

/// One list's items, and the pages they were built from. Weak: they do not keep a
/// page alive, but its allocation stays, so its address is never reused while it is
/// compared.
struct Built {
    pages: Vec<Weak<Value>>,
    items: Arc<[ToolInfo]>,
}

impl Built {
    fn is_of(&self, pages: &[Arc<Value>]) -> bool {
        self.pages.len() == pages.len()
            && self
                .pages
                .iter()
                .zip(pages)
                .all(|(a, b)| std::ptr::eq(a.as_ptr(), Arc::as_ptr(b)))
    }

    /// Whether a page it was built from is gone: it can never be asked for again.
    fn is_stale(&self) -> bool {
        self.pages.iter().any(|p| p.strong_count() == 0)
    }
}

/// Variants kept per (server, kind).
const CATALOG_VARIANTS: usize = 4;

impl Catalog {
    /// The items of server `id`'s list `pages`, from the memo when those pages are the
    /// ones built last.
    pub(crate) fn items(&self, kind: ListKind, id: &str, pages: &[Arc<Value>]) -> Arc<[ToolInfo]> {
        let key = (id.to_string(), kind);
        if let Some(built) = self
            .lists
            .lock()
            .get(&key)
            .and_then(|v| v.iter().find(|b| b.is_of(pages)))
        {
            return built.items.clone();
        }
        let server: Arc<str> = id.into();
        let mut built: Vec<ToolInfo> = items(kind, pages)
            .filter_map(|item| {
                let name = item_name(kind, item)?;
                Some(ToolInfo {
                    qualified: qualify(id, name).into(),
                    name: name.into(),
                    server: server.clone(),
                    definition: Arc::new(item.clone()),
                    from_cache: false,
                })
            })
            .collect();
        // Sorted here, so that a listing's sort only merges runs.
        built.sort_by(|a, b| a.qualified.cmp(&b.qualified));
        // A name listed twice (a server's own slip, or an item that moved across pages
        // while they were read) is served once, as the first: routing takes that one,
        // and many model APIs refuse a tool list that names a tool twice. The sort is
        // stable, so the first listed is the first of its run.
        let listed = built.len();
        built.dedup_by(|later, first| later.qualified == first.qualified);
        if built.len() < listed {
            tracing::warn!(server = id, dropped = listed - built.len(), kind = ?kind, "a server listed names more than once; each is served once, as first listed");
        }
        let items: Arc<[ToolInfo]> = built.into();
        let mut lists = self.lists.lock();
        // A build follows a cache miss, when the cache may have let pages go: the
        // moment to let go of what was built from them.
        lists.retain(|_, variants| {
            variants.retain(|b| !b.is_stale());
            !variants.is_empty()
        });
        let variants = lists.entry(key).or_default();
        variants.retain(|b| !b.is_of(pages));
        variants.insert(
            0,
            Built {
                pages: pages.iter().map(Arc::downgrade).collect(),
                items: items.clone(),
            },
        );
        variants.truncate(CATALOG_VARIANTS);
        items
    }

    /// Forgets a server's lists.
    pub(crate) fn forget(&self, server: &str) {
        self.lists.lock().retain(|(id, _), _| id != server);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(names: &[&str]) -> Arc<Value> {
        let tools: Vec<Value> = names
            .iter()
            .map(|n| serde_json::json!({"name": n}))
            .collect();
        Arc::new(serde_json::json!({ "tools": tools }))
    }

    fn kept(catalog: &Catalog) -> usize {
        catalog.lists.lock().values().map(Vec::len).sum()
    }

    // A name listed twice, on one page or across two, is served once: the first.
    #[test]
    fn a_name_listed_twice_is_served_once_as_first_listed() {
        let catalog = Catalog::default();
        let pages = vec![
            Arc::new(serde_json::json!({"tools": [
                {"name": "b"}, {"name": "a", "description": "first"}, {"name": "b"},
            ]})),
            Arc::new(serde_json::json!({"tools": [{"name": "a", "description": "second"}]})),
        ];
        let items = catalog.items(ListKind::Tools, "s", &pages);
        let names: Vec<&str> = items.iter().map(|t| &*t.qualified).collect();
        assert_eq!(names, ["s__a", "s__b"]);
        assert_eq!(items[0].definition["description"], "first");
    }

    // The catalog holds no page the cache let go, and drops what it built from one.
    #[test]
    fn a_list_the_cache_let_go_is_not_kept_alive_here() {
        let catalog = Catalog::default();
        let pages = vec![page(&["a", "b"])];
        let first = catalog.items(ListKind::Tools, "s", &pages);
        assert_eq!(first.len(), 2);
        let again = catalog.items(ListKind::Tools, "s", &pages);
        assert!(Arc::ptr_eq(&first, &again), "the same pages: built once");
        let weak = Arc::downgrade(&pages[0]);
        drop(pages);
        assert_eq!(weak.strong_count(), 0, "the catalog does not hold the page");
        let other = vec![page(&["c"])];
        catalog.items(ListKind::Tools, "t", &other);
        assert_eq!(
            kept(&catalog),
            1,
            "the list built from the dropped page is gone"
        );
        // A page made in its place is built anew, never taken for the old one.
        let fresh = vec![page(&["x"])];
        let built = catalog.items(ListKind::Tools, "s", &fresh);
        assert_eq!(&*built[0].name, "x");
    }
}
