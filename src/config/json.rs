//! JSON config text read as its other readers read it (of a key written twice in one
//! object the last wins, as in JavaScript's `JSON.parse`), with each such key reported:
//! `serde_json` alone keeps the last without a word, so a server written twice under
//! one name would silently be one server.

use std::cell::RefCell;
use std::fmt;

use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Duplicate keys reported at most; past this, one more is only counted.
const REPORTED: usize = 16;

/// `text` as a [`Value`], and the paths of the keys it writes more than once
/// (`mcpServers.files`, `servers[0].id`), in the order met, at most [`REPORTED`] and
/// then `…` once.
pub(super) fn read(text: &str) -> Result<(Value, Vec<String>), serde_json::Error> {
    let twice = RefCell::new(Vec::new());
    let mut de = serde_json::Deserializer::from_str(text);
    let value = Reader {
        at: At::Root,
        twice: &twice,
    }
    .deserialize(&mut de)?;
    de.end()?;
    Ok((value, twice.into_inner()))
}

/// Where a value is, written out only for a key met twice: built for every value, a
/// path would cost its length again for each (a long key over a long list).
enum At<'a> {
    Root,
    Key(&'a At<'a>, &'a str),
    Index(&'a At<'a>, usize),
}

impl At<'_> {
    /// The path as errors write it (`mcpServers.files`, `servers[0].id`), cut to
    /// [`PATH_SHOWN`] characters.
    fn shown(&self) -> String {
        let mut steps = Vec::new();
        let mut at = self;
        loop {
            match at {
                At::Root => break,
                At::Key(parent, key) => {
                    steps.push(format!(".{}", crate::util::text::one_line(key, PATH_SHOWN)));
                    at = parent;
                }
                At::Index(parent, i) => {
                    steps.push(format!("[{i}]"));
                    at = parent;
                }
            }
        }
        let path: String = steps.into_iter().rev().collect();
        let path = path.strip_prefix('.').unwrap_or(&path);
        crate::util::text::one_line(path, PATH_SHOWN)
    }
}

/// The characters of a path shown.
const PATH_SHOWN: usize = 200;

/// Reads one value, `at` its place.
struct Reader<'a> {
    at: At<'a>,
    twice: &'a RefCell<Vec<String>>,
}

impl<'de> DeserializeSeed<'de> for Reader<'_> {
    type Value = Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Reader<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        // JSON text has no NaN or infinity, so this is never null.
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        loop {
            let reader = Reader {
                at: At::Index(&self.at, items.len()),
                twice: self.twice,
            };
            let Some(item) = seq.next_element_seed(reader)? else {
                break;
            };
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let reader = Reader {
                at: At::Key(&self.at, &key),
                twice: self.twice,
            };
            let value = map.next_value_seed(reader)?;
            if object.contains_key(&key) {
                let mut twice = self.twice.borrow_mut();
                match twice.len() {
                    n if n < REPORTED => twice.push(At::Key(&self.at, &key).shown()),
                    REPORTED => twice.push("…".into()),
                    _ => {}
                }
            }
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn the_last_of_a_key_written_twice_wins_and_each_is_reported() {
        let (v, twice) = super::read(
            r#"{"a": 1, "s": {"x": {"k": 1}, "x": {"k": 2}}, "l": [{"id": 1, "id": 2}], "a": [1.5, true, null, "t"]}"#,
        )
        .expect("valid JSON");
        assert_eq!(
            v,
            json!({"a": [1.5, true, null, "t"], "s": {"x": {"k": 2}}, "l": [{"id": 2}]})
        );
        assert_eq!(twice, ["s.x", "l[0].id", "a"]);
        let many: Vec<String> = (0..40).map(|_| r#""k": 0"#.to_string()).collect();
        let (_, twice) = super::read(&format!("{{{}}}", many.join(","))).expect("valid JSON");
        assert_eq!(twice.len(), super::REPORTED + 1);
        assert!(super::read(r#"{"a": 1} x"#).is_err(), "trailing text");
        assert!(
            super::read(&"[".repeat(10_000)).is_err(),
            "nesting is bounded"
        );
        // Paths are written out for a key met twice only, and cut.
        let key = "k".repeat(1 << 20);
        let list = vec!["0"; 1 << 20].join(",");
        let text = format!(r#"{{"{key}": [{list}], "{key}": 1}}"#);
        let (_, twice) = super::read(&text).expect("valid JSON");
        assert!(twice.len() == 1 && twice[0].chars().count() <= super::PATH_SHOWN + 1);
    }
}
