//! What a list holds, as callers see it: [`ToolInfo`]s built once per list and shared
//! while the cache hands out the same pages.

use std::sync::Arc;

use serde_json::Value;

use super::caller::CallKind;
use crate::registry::names::qualify;

/// The items of a list's pages.
pub(crate) fn items(kind: CallKind, pages: &[Arc<Value>]) -> impl Iterator<Item = &Value> {
    pages.iter().flat_map(move |p| {
        p.get(kind.list_key())
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
    })
}

pub(crate) fn item_name(kind: CallKind, item: &Value) -> Option<&str> {
    item.get(kind.item_key()).and_then(Value::as_str)
}

/// One tool (or prompt, or resource) as a caller sees it. Shared, not copied: a
/// listing from the cache hands out the same definitions every time.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolInfo {
    /// `server__name`: unique across servers.
    pub qualified: Arc<str>,
    /// The name on its server (the uri for resources).
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
/// context; a removed server's are forgotten with it.
#[derive(Default)]
pub(crate) struct Catalog {
    lists: parking_lot::Mutex<std::collections::HashMap<(String, CallKind), Vec<Built>>>,
}

/// One list's items, and the pages they were built from (held, so that a page's
/// address is never reused while it is compared).
struct Built {
    pages: Vec<Arc<Value>>,
    items: Arc<[ToolInfo]>,
}

/// Variants kept per (server, kind).
const CATALOG_VARIANTS: usize = 4;

impl Catalog {
    /// The items of server `id`'s list `pages`, from the memo when those pages are the
    /// ones built last.
    pub(crate) fn items(&self, kind: CallKind, id: &str, pages: &[Arc<Value>]) -> Arc<[ToolInfo]> {
        let same = |b: &Built| {
            b.pages.len() == pages.len()
                && b.pages.iter().zip(pages).all(|(a, b)| Arc::ptr_eq(a, b))
        };
        let key = (id.to_string(), kind);
        if let Some(built) = self
            .lists
            .lock()
            .get(&key)
            .and_then(|v| v.iter().find(|b| same(b)))
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
        let items: Arc<[ToolInfo]> = built.into();
        let mut lists = self.lists.lock();
        let variants = lists.entry(key).or_default();
        variants.retain(|b| !same(b));
        variants.insert(
            0,
            Built {
                pages: pages.to_vec(),
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
