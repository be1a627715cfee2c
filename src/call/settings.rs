//! The call path's own settings: rounds, deadlines, and the bounds that keep a hostile
//! server from growing the harness's memory.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::util::invalid::Invalid;

/// Bounds on what one server may make the harness hold.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Bytes of one server's list across all its pages (as JSON). 32 MiB holds a
    /// thousand tools with large schemas many times over; real servers list a few
    /// hundred kilobytes.
    pub max_list_bytes: usize,
    /// Items of one server's list across all its pages. The largest real servers list a
    /// few hundred tools; 20,000 leaves room for generated catalogs.
    pub max_list_items: usize,
    /// Pages of one list.
    pub max_list_pages: usize,
    /// Input requests in one `input_required` round. Each may reach a person; 16 is
    /// more than any real form needs.
    pub max_input_requests: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_list_bytes: 32 * 1024 * 1024,
            max_list_items: 20_000,
            max_list_pages: 1_000,
            max_input_requests: 16,
        }
    }
}

/// How calls run.
#[derive(Clone, Debug, PartialEq)]
pub struct CallConfig {
    /// Most `input_required` rounds of one logical call, failover included.
    pub round_cap: usize,
    /// Deadline of one input handler's answer.
    pub input_timeout: Duration,
    /// Deadline of one whole call (rounds and failover included), unless a call sets
    /// its own.
    pub call_timeout: Duration,
    /// How long `shutdown()` lets calls in flight finish before it cancels them.
    pub shutdown_grace: Duration,
    /// The share of calls that start a trace and are traced.
    pub trace_sample_ratio: f64,
    /// Bounds.
    pub limits: Limits,
}

impl Default for CallConfig {
    fn default() -> Self {
        CallConfig {
            round_cap: 10,
            input_timeout: Duration::from_secs(300),
            call_timeout: Duration::from_secs(600),
            shutdown_grace: Duration::from_secs(5),
            trace_sample_ratio: 1.0,
            limits: Limits::default(),
        }
    }
}

impl CallConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.round_cap == 0 {
            return Err(Invalid::new("round_cap", "must be at least 1"));
        }
        if self.call_timeout.is_zero() {
            return Err(Invalid::new("call_timeout", "must be more than zero"));
        }
        if self.input_timeout.is_zero() {
            return Err(Invalid::new("input_timeout", "must be more than zero"));
        }
        if !(0.0..=1.0).contains(&self.trace_sample_ratio) {
            return Err(Invalid::new(
                "trace_sample_ratio",
                "must be between 0 and 1",
            ));
        }
        let l = &self.limits;
        for (field, v) in [
            ("limits.max_list_bytes", l.max_list_bytes),
            ("limits.max_list_items", l.max_list_items),
            ("limits.max_list_pages", l.max_list_pages),
            ("limits.max_input_requests", l.max_input_requests),
        ] {
            if v == 0 {
                return Err(Invalid::new(field, "must be at least 1"));
            }
        }
        Ok(())
    }
}
