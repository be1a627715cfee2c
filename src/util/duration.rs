//! Durations as people write them in config files: `"250ms"`, `"30s"`, `"5m"`, `"1h"`,
//! or a bare number of seconds. Used with `#[serde(with = "duration")]`.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

/// Parses `"250ms"`, `"30s"`, `"1.5s"`, `"5m"`, `"1h"`, or a bare number of seconds.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (try \"30s\" or \"500ms\")"))?;
    let secs = match unit.trim() {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?} (use ms, s, m or h)"
            ));
        }
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{text:?}: {e}"))
}

/// Writes a duration as milliseconds with the `ms` unit.
pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{}ms", d.as_millis()))
}

/// Reads a duration string or a number of seconds.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Text(String),
        Seconds(f64),
    }
    match Raw::deserialize(d)? {
        Raw::Text(t) => parse(&t).map_err(serde::de::Error::custom),
        Raw::Seconds(s) => Duration::try_from_secs_f64(s).map_err(serde::de::Error::custom),
    }
}

/// The same for `Option<Duration>` fields (`#[serde(with = "duration::option")]`).
pub mod option {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes `Some` as [`super::serialize`] does, `None` as null.
    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => super::serialize(d, s),
            None => s.serialize_none(),
        }
    }

    /// Reads a duration, or null.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        #[derive(Deserialize)]
        struct Wrapped(#[serde(deserialize_with = "super::deserialize")] Duration);
        Ok(Option::<Wrapped>::deserialize(d)?.map(|w| w.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units_or_seconds() {
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("3"), Ok(Duration::from_secs(3)));
        assert!(parse("3 fortnights").is_err());
        assert!(parse("soon").is_err());
    }
}
