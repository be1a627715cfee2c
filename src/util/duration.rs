//! Durations as people write them in config files: `"250ms"`, `"30s"`, `"5m"`, `"1h"`,
//! or a bare number of seconds. Used with `#[serde(with = "duration")]`.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

/// The longest duration the harness takes (ten years): a config refuses a longer one,
/// and a longer one given through the API counts as this. A deadline that far off is
/// never reached, and `Instant` arithmetic with it cannot overflow (a duration near
/// `Duration::MAX` panics when added to an `Instant`).
pub const LONGEST: Duration = Duration::from_secs(10 * 365 * 86_400);

/// `now + d`, with `d` at most [`LONGEST`] (for std's `Instant` and tokio's).
pub fn after<I: std::ops::Add<Duration, Output = I>>(now: I, d: Duration) -> I {
    now + d.min(LONGEST)
}

/// A duration read from a config, refused when longer than [`LONGEST`].
fn bounded(secs: f64) -> Result<Duration, String> {
    let d = Duration::try_from_secs_f64(secs).map_err(|e| format!("is not a duration: {e}"))?;
    if d > LONGEST {
        return Err("is longer than ten years, the longest taken".into());
    }
    Ok(d)
}

/// Parses `"250ms"`, `"30s"`, `"1.5s"`, `"5m"`, `"1h"`, or a bare number of seconds.
/// Errors do not quote the text: a `${VAR}` may have put a secret there, and the
/// caller names the field.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: f64 = number
        .parse()
        .map_err(|_| "is not a duration (try \"30s\" or \"500ms\")".to_string())?;
    let secs = match unit.trim() {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err("has an unknown unit (use ms, s, m or h)".into()),
    };
    bounded(secs)
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
        Raw::Seconds(s) => bounded(s).map_err(serde::de::Error::custom),
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
        // What a variable put in is not quoted back, not even in part.
        for text in ["3f9a1c-secret", " s3cr3t\n", "9e999999h"] {
            let e = parse(text).expect_err(text);
            assert!(
                !e.contains("f9a1c") && !e.contains("s3cr3t") && !e.contains("9e9"),
                "{e}"
            );
        }
    }

    #[test]
    fn durations_past_ten_years_are_refused_and_deadlines_never_overflow() {
        assert_eq!(parse("87600h"), Ok(LONGEST));
        let long = parse("5000000000000000h").expect_err("longer than ten years");
        assert!(long.contains("ten years"), "{long}");
        #[derive(Deserialize, Debug)]
        struct Config {
            #[serde(with = "super")]
            #[allow(dead_code)]
            timeout: Duration,
        }
        let config: Result<Config, _> = serde_json::from_str(r#"{"timeout": 1e18}"#);
        assert!(config.is_err());
        let now = std::time::Instant::now();
        assert_eq!(after(now, Duration::MAX), now + LONGEST);
        assert_eq!(
            after(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
    }
}
