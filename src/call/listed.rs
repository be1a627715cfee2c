//! One server's list as a walk read it, and the fetches of lists under way that walks
//! wanting the same list join: what both the call context (which holds the fetches)
//! and the listing (which makes them) name.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::error::CallError;
use super::flights::Flights;
use crate::server::ServerRef;

/// One server's list, as read for a call or a listing.
#[derive(Clone)]
pub(crate) struct Listed {
    pub(crate) server: ServerRef,
    pub(crate) pages: Vec<Arc<Value>>,
    pub(crate) from_cache: bool,
    /// The least freshness left of its pages.
    pub(crate) fresh_for: Duration,
    /// Every page was `public`.
    pub(crate) public: bool,
    /// Due for a refresh ahead once `fresh_for` is this short or shorter.
    pub(crate) refresh_window: Duration,
}

/// What a walk that fetches its first page reads: walks that agree on it read the
/// same list, and share one fetch ([`ListFlights`]).
#[derive(Clone, Hash, PartialEq, Eq)]
pub(crate) struct ListFlight {
    /// The server's place in memory: unique while a walk of it holds it, and a server
    /// added again under its id is another.
    pub(crate) server: usize,
    /// The server's cache epoch when the walk began: a walk begun after a change
    /// notice must not take a list fetched before it.
    pub(crate) epoch: u64,
    pub(crate) method: &'static str,
    pub(crate) client: String,
    pub(crate) auth: Option<String>,
}

/// The walks of lists fetching their first page now, which those that want the same
/// list join.
pub(crate) type ListFlights = Flights<ListFlight, Result<Listed, CallError>>;
