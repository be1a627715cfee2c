//! The servers of one harness, by id and in config order: a shared snapshot that calls
//! read without a mailbox. Only the servers' supervisor writes it.

use std::sync::Arc;

use parking_lot::RwLock;

use super::server_ref::ServerRef;

#[derive(Default)]
struct Table {
    by_id: foldhash::HashMap<String, ServerRef>,
    order: Vec<String>,
    /// Removed and still stopping: no longer routed to, and a shutdown waits for them.
    stopping: Vec<ServerRef>,
}

/// The servers; cheap to clone (every clone sees the same table).
#[derive(Clone, Default)]
pub struct Directory(Arc<RwLock<Table>>);

impl Directory {
    /// One server by id.
    pub fn get(&self, id: &str) -> Option<ServerRef> {
        self.0.read().by_id.get(id).cloned()
    }

    /// Whether a server has this id.
    pub fn contains(&self, id: &str) -> bool {
        self.0.read().by_id.contains_key(id)
    }

    /// Every server, in config order.
    pub fn all(&self) -> Vec<ServerRef> {
        let t = self.0.read();
        t.order
            .iter()
            .filter_map(|id| t.by_id.get(id).cloned())
            .collect()
    }

    pub(super) fn insert(&self, server: ServerRef) -> bool {
        let mut t = self.0.write();
        let id = server.id().to_string();
        if t.by_id.contains_key(&id) {
            return false;
        }
        t.order.push(id.clone());
        t.by_id.insert(id, server);
        true
    }

    /// Takes a server out; it is counted as stopping until [`Directory::stopped`].
    pub(super) fn remove(&self, id: &str) -> Option<ServerRef> {
        let mut t = self.0.write();
        t.order.retain(|o| o != id);
        let server = t.by_id.remove(id)?;
        t.stopping.push(server.clone());
        Some(server)
    }

    /// Puts `server` in the place of the one of its id, which is counted as stopping
    /// until [`Directory::stopped`]; `None` (and nothing changed) when there is none.
    pub(super) fn replace(&self, server: ServerRef) -> Option<ServerRef> {
        let mut t = self.0.write();
        let old = t.by_id.insert(server.id().to_string(), server.clone());
        match old {
            Some(old) => {
                t.stopping.push(old.clone());
                Some(old)
            }
            None => {
                t.by_id.remove(server.id());
                None
            }
        }
    }

    /// Takes out a server that never started (its actor could not be spawned): there
    /// is nothing of it to stop.
    pub(super) fn discard(&self, id: &str) {
        let mut t = self.0.write();
        t.order.retain(|o| o != id);
        t.by_id.remove(id);
    }

    /// A removed server has stopped.
    pub(super) fn stopped(&self, server: &ServerRef) {
        self.0
            .write()
            .stopping
            .retain(|s| !Arc::ptr_eq(&s.0, &server.0));
        server.gone().cancel();
    }

    /// The servers removed and still stopping.
    pub(super) fn stopping(&self) -> Vec<ServerRef> {
        self.0.read().stopping.clone()
    }
}
