//! A setting that cannot work: which field, and what is wrong with it. Each layer's
//! `validate` returns these; the config layer adds the file and the server.

use std::fmt;

/// One invalid setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    /// The field, as written in a config file (`transport.url`, `restart.min_delay`).
    pub field: String,
    /// What is wrong and, where it helps, how to fix it.
    pub reason: String,
}

impl Invalid {
    /// An invalid `field`.
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Invalid {
        Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// The same problem, one level down (`restart` + `min_delay` → `restart.min_delay`).
    pub fn under(mut self, parent: &str) -> Invalid {
        self.field = format!("{parent}.{}", self.field);
        self
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

impl std::error::Error for Invalid {}
