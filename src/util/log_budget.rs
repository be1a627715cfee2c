//! A count of events logged at first and then at each power of two: a peer that
//! repeats something we log (a server flooding us with lines, requests or stray
//! replies) cannot flood the log with it.

use std::sync::atomic::{AtomicU64, Ordering};

/// See the module docs.
#[derive(Debug, Default)]
pub struct LogBudget(AtomicU64);

impl LogBudget {
    /// A budget with nothing counted, for a `static` at a log site.
    pub const fn new() -> LogBudget {
        LogBudget(AtomicU64::new(0))
    }

    /// Counts one; the count when this one is to be logged (the first 10, then each
    /// power of two).
    pub fn log(&self) -> Option<u64> {
        let n = self.0.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        (n <= 10 || n.is_power_of_two()).then_some(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_logged_a_few_times_not_once_an_event() {
        let budget = LogBudget::default();
        let logged = (0..1_000_000).filter(|_| budget.log().is_some()).count();
        // The first ten, then 16, 32, … 2^19.
        assert_eq!(logged, 10 + 16);
    }
}
