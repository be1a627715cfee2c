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

    /// A table's value that does not deserialize, named by its path in the table (the
    /// table itself when it is no table at all).
    pub fn in_table<E: fmt::Display>(table: &str, error: serde_path_to_error::Error<E>) -> Invalid {
        let path = error.path().to_string();
        let field = if path == "." {
            table.to_string()
        } else {
            format!("{table}.{path}")
        };
        Invalid::new(field, error.into_inner().to_string())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Table {
        size: u32,
    }

    #[test]
    fn a_table_error_is_named_by_its_path_or_by_the_table() {
        let read = |v: serde_json::Value| {
            serde_path_to_error::deserialize::<_, Table>(v)
                .map(|_| ())
                .map_err(|e| Invalid::in_table("t", e))
        };
        let wrong = read(serde_json::json!({"size": "big"})).expect_err("a string");
        assert_eq!(wrong.field, "t.size");
        let unknown = read(serde_json::json!({"size": 1, "colour": 2})).expect_err("unknown");
        assert_eq!(unknown.field, "t.colour", "{unknown}");
        let not_a_table = read(serde_json::json!(5)).expect_err("a number");
        assert_eq!(not_a_table.field, "t", "{not_a_table}");
    }
}
