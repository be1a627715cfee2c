//! Single flight: callers that want what is being fetched for another wait for that
//! fetch and share its outcome, success or error, instead of fetching it again. (A
//! hundred bare-name calls at once on a server whose list is not cached read it once.)

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tokio::sync::watch;

/// The fetches under way, by what they fetch.
pub(crate) struct Flights<K, T> {
    map: Arc<Mutex<HashMap<K, Flight<T>>>>,
    next: AtomicU64,
}

struct Flight<T> {
    /// Tells a leader's own entry from a later leader's of the same key.
    id: u64,
    outcome: watch::Receiver<Option<T>>,
}

/// What [`Flights::join`] makes of a caller: the one that fetches, or one that waits.
pub(crate) enum Joined<K: Hash + Eq, T> {
    Lead(Leader<K, T>),
    Follow(Follower<T>),
}

/// The caller that fetches. Its flight ends when it is dropped: its followers get what
/// it published, or, if it published nothing (its caller gave up), fetch again.
pub(crate) struct Leader<K: Hash + Eq, T> {
    map: Arc<Mutex<HashMap<K, Flight<T>>>>,
    key: Option<K>,
    id: u64,
    outcome: watch::Sender<Option<T>>,
}

/// A caller waiting for a leader.
pub(crate) struct Follower<T>(watch::Receiver<Option<T>>);

impl<K, T> Default for Flights<K, T> {
    fn default() -> Self {
        Flights {
            map: Arc::default(),
            next: AtomicU64::new(0),
        }
    }
}

impl<K: Hash + Eq + Clone, T: Clone> Flights<K, T> {
    /// Follows the fetch of `key` under way, or leads a new one.
    pub(crate) fn join(&self, key: K) -> Joined<K, T> {
        let mut map = self.map.lock();
        if let Some(flight) = map.get(&key) {
            return Joined::Follow(Follower(flight.outcome.clone()));
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = watch::channel(None);
        map.insert(key.clone(), Flight { id, outcome: rx });
        Joined::Lead(Leader {
            map: self.map.clone(),
            key: Some(key),
            id,
            outcome: tx,
        })
    }

    /// Fetches under way (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().len()
    }
}

impl<K: Hash + Eq, T> Leader<K, T> {
    /// Gives the outcome to every follower, and ends the flight: who comes next fetches
    /// (or finds what this fetch cached).
    pub(crate) fn publish(self, outcome: T) {
        self.outcome.send_replace(Some(outcome));
    }
}

impl<K: Hash + Eq, T> Drop for Leader<K, T> {
    fn drop(&mut self) {
        let mut map = self.map.lock();
        if let Some(key) = self.key.take()
            && map.get(&key).is_some_and(|f| f.id == self.id)
        {
            map.remove(&key);
        }
    }
}

impl<T: Clone> Follower<T> {
    /// The leader's outcome; `None` if it ended without one.
    pub(crate) async fn outcome(mut self) -> Option<T> {
        self.0
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|v| v.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn followers_share_the_leaders_outcome_and_the_next_caller_leads_anew() {
        let flights: Flights<&str, u32> = Flights::default();
        let Joined::Lead(leader) = flights.join("k") else {
            panic!("the first leads");
        };
        let Joined::Follow(a) = flights.join("k") else {
            panic!("the second follows");
        };
        let Joined::Lead(other) = flights.join("other") else {
            panic!("another key leads its own");
        };
        let waiting = tokio::spawn(a.outcome());
        leader.publish(7);
        assert_eq!(waiting.await.expect("task"), Some(7));
        assert_eq!(flights.len(), 1, "the flight ended with its publication");
        assert!(matches!(flights.join("k"), Joined::Lead(_)));
        drop(other);
        assert_eq!(flights.len(), 0);
    }

    #[tokio::test]
    async fn a_leader_that_gives_up_leaves_its_followers_to_fetch() {
        let flights: Flights<&str, u32> = Flights::default();
        let Joined::Lead(leader) = flights.join("k") else {
            panic!("leads");
        };
        let Joined::Follow(f) = flights.join("k") else {
            panic!("follows");
        };
        drop(leader);
        assert_eq!(f.outcome().await, None);
        let Joined::Lead(_again) = flights.join("k") else {
            panic!("the next one leads");
        };
        // A follower that joins the new flight after an old leader's drop is its.
        let Joined::Follow(late) = flights.join("k") else {
            panic!("follows");
        };
        drop(late);
    }
}
