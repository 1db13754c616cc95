//! The scanner: sample lines and rated lines read with serde_json, borrowing their text, and
//! the readers of single JSON tokens.
//!
//! Strings are borrowed, so a string with an escape fails to read and the line is declined
//! (the Python path decides it). Fields whose JSON type the Rust code checks itself are kept
//! as raw tokens.

use std::collections::HashSet;
use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<&'de RawValue>, D::Error> {
    // A field given as JSON null stays distinguishable from a field left out.
    <&RawValue>::deserialize(deserializer).map(Some)
}

/// A sample line (contract 1, `UsageSample`'s fields): unknown and repeated fields fail.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sample<'a> {
    pub event_id: &'a str,
    pub kind: &'a str,
    pub cluster: &'a str,
    pub node: &'a str,
    pub tenant: &'a str,
    pub namespace: &'a str,
    pub pod: &'a str,
    pub pod_uid: &'a str,
    #[serde(borrow)]
    pub window_start: &'a RawValue,
    #[serde(borrow)]
    pub window_end: &'a RawValue,
    #[serde(borrow)]
    pub quantity: &'a RawValue,
    #[serde(default, deserialize_with = "present")]
    pub gpu_model: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "present")]
    pub mig_profile: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "present")]
    pub capacity_type: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "present")]
    pub priority: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "present")]
    pub utilization: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "present")]
    pub memory_used_bytes: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "present")]
    pub power_watts: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "present")]
    pub energy_joules: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "present")]
    pub labels: Option<&'a RawValue>,
}

pub fn sample(line: &[u8]) -> Option<Sample<'_>> {
    serde_json::from_slice(line).ok()
}

/// A labels object of unescaped strings, in order; a repeated key fails.
pub struct Labels<'a>(pub Vec<(&'a str, &'a str)>);

impl<'de: 'a, 'a> Deserialize<'de> for Labels<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct LabelsVisitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for LabelsVisitor<'a> {
            type Value = Labels<'a>;
            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str("an object of strings")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
                let mut pairs: Vec<(&'a str, &'a str)> = Vec::new();
                let mut keys: HashSet<&'a str> = HashSet::new();
                while let Some((key, value)) = map.next_entry::<&'de str, &'de str>()? {
                    if !keys.insert(key) {
                        return Err(serde::de::Error::custom("repeated label"));
                    }
                    pairs.push((key, value));
                }
                Ok(Labels(pairs))
            }
        }
        deserializer.deserialize_map(LabelsVisitor(std::marker::PhantomData))
    }
}

/// The labels of a sample: none when the field is absent.
pub fn labels(token: Option<&RawValue>) -> Option<Labels<'_>> {
    match token {
        None => Some(Labels(Vec::new())),
        Some(raw) => serde_json::from_str(raw.get()).ok(),
    }
}

/// A rated line as the quota agent reads it (streams/quota_decode.py `_usage`): the fields it
/// uses, each with the JSON type the rating agent writes; any other field is skipped.
#[derive(Deserialize)]
pub struct RatedLine<'a> {
    pub event_id: &'a str,
    pub namespace: &'a str,
    pub pod: &'a str,
    pub pod_uid: &'a str,
    pub kind: &'a str,
    pub tenant: &'a str,
    pub window_start: &'a str,
    pub window_end: &'a str,
    pub quantity: &'a str,
    pub unit_seconds: &'a str,
    pub list_cost: &'a str,
    #[serde(default, deserialize_with = "present")]
    pub capacity_type: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "present")]
    pub priority: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "present")]
    pub gpu_model: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "present")]
    pub source_partition: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "present")]
    pub source_offset: Option<&'a RawValue>,
}

pub fn rated_line(line: &[u8]) -> Option<RatedLine<'_>> {
    serde_json::from_slice(line).ok()
}

pub fn token(value: Option<&RawValue>) -> Option<&str> {
    value.map(RawValue::get)
}

/// Absent, or given as JSON null.
pub fn is_null(value: Option<&RawValue>) -> bool {
    value.is_none_or(|value| value.get() == "null")
}

/// The text of a JSON string token without escapes (its quotes removed).
pub fn plain_string(token: &str) -> Option<&str> {
    let text = token.strip_prefix('"')?.strip_suffix('"')?;
    (!text.contains(['"', '\\'])).then_some(text)
}

/// `0` or digits without a leading zero.
fn plain_integer(text: &str) -> bool {
    let bytes = text.as_bytes();
    !bytes.is_empty() && bytes.iter().all(u8::is_ascii_digit) && (bytes[0] != b'0' || bytes.len() == 1)
}

/// A JSON integer token (any sign) within i64.
pub fn integer(token: &str) -> Option<i64> {
    let digits = token.strip_prefix('-').unwrap_or(token);
    if !plain_integer(digits) {
        return None;
    }
    token.parse::<i64>().ok()
}

/// A JSON integer token within i64, or `default` where the field is absent.
pub fn integer_or(value: Option<&RawValue>, default: i64) -> Option<i64> {
    value.map_or(Some(default), |value| integer(value.get()))
}

/// A decimal as its text, when the JSON token is a plain non-negative decimal string or
/// integer whose text `str(Decimal(text))` gives back unchanged, below 10^digits.
pub fn decimal_text(token: &str, digits: usize) -> Option<&str> {
    let text = if token.len() >= 2 && token.starts_with('"') && token.ends_with('"') {
        &token[1..token.len() - 1]
    } else {
        token
    };
    let (whole, fraction) = match text.split_once('.') {
        Some((whole, fraction)) => (whole, Some(fraction)),
        None => (text, None),
    };
    if !plain_integer(whole) || whole.len() > digits {
        return None;
    }
    if let Some(fraction) = fraction {
        // Only a string may carry a fraction: a JSON number with one is a float.
        if fraction.is_empty() || !fraction.bytes().all(|b| b.is_ascii_digit()) || !token.starts_with('"') {
            return None;
        }
    }
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: &str = r#"{"event_id":"e","kind":"gpu","cluster":"c","node":"n","tenant":"t","namespace":"ns","pod":"p","pod_uid":"u","window_start":"2026-11-03T00:00:00Z","window_end":"2026-11-03T00:00:15Z","quantity":"1"}"#;

    /// PLAIN with `extra` put in front of its first field.
    fn with(extra: &str) -> String {
        format!("{{{extra},{}", &PLAIN[1..])
    }

    #[test]
    fn sample_lines() {
        let cases: [(&str, String, bool); 11] = [
            ("plain", PLAIN.to_owned(), true),
            (
                "optional fields",
                with(r#""gpu_model":null,"priority":5,"labels":{"a":"b"}"#),
                true,
            ),
            (
                "non-ASCII",
                with(r#""utilization":"0.5","power_watts":1"#).replace("\"p\"", "\"pöd\""),
                true,
            ),
            ("unknown field", with(r#""colour":"blue""#), false),
            ("repeated field", with(r#""pod":"other""#), false),
            ("escaped string", PLAIN.replace("\"p\"", r#""p\"d""#), false),
            ("escaped unicode", PLAIN.replace("\"p\"", r#""p\u00e9""#), false),
            ("missing field", PLAIN.replace(r#","quantity":"1""#, ""), false),
            ("string field as a number", PLAIN.replace("\"c\"", "1"), false),
            ("an array", "[1, 2]".to_owned(), false),
            ("not JSON", "{not json".to_owned(), false),
        ];
        for (name, line, accepted) in cases {
            assert_eq!(sample(line.as_bytes()).is_some(), accepted, "case {name:?}");
        }
        let read = sample(PLAIN.as_bytes()).expect("plain");
        assert_eq!(
            (read.event_id, read.pod, read.quantity.get()),
            ("e", "p", "\"1\"")
        );
        assert!(read.gpu_model.is_none());
        let null = with(r#""gpu_model":null"#);
        let read = sample(null.as_bytes()).expect("null model");
        assert_eq!(token(read.gpu_model), Some("null"));
        assert!(is_null(read.gpu_model) && is_null(read.mig_profile));
    }

    #[test]
    fn sample_labels() {
        type Pairs = Vec<(&'static str, &'static str)>;
        let cases: [(&str, Option<&str>, Option<Pairs>); 7] = [
            ("absent", None, Some(vec![])),
            ("empty", Some("{}"), Some(vec![])),
            (
                "in order",
                Some(r#"{"b":"1","a":"2"}"#),
                Some(vec![("b", "1"), ("a", "2")]),
            ),
            ("repeated", Some(r#"{"a":"1","a":"2"}"#), None),
            ("not a string", Some(r#"{"a":1}"#), None),
            ("escaped", Some(r#"{"a":"b\\c"}"#), None),
            ("null", Some("null"), None),
        ];
        for (name, text, expected) in cases {
            let raw = text.map(|text| serde_json::from_str::<&RawValue>(text).expect("JSON"));
            assert_eq!(labels(raw).map(|labels| labels.0), expected, "case {name:?}");
        }
    }

    #[test]
    fn rated_lines() {
        let line = r#"{"event_id":"e","namespace":"ns","pod":"p","pod_uid":"u","kind":"gpu","tenant":"t","window_start":"a","window_end":"b","quantity":"1","unit_seconds":"15","list_cost":"0.1","rate_card":"r","source_offset":7}"#;
        let read = rated_line(line.as_bytes()).expect("rated line");
        assert_eq!((read.event_id, read.list_cost), ("e", "0.1"));
        assert_eq!(integer_or(read.source_offset, -1), Some(7));
        assert_eq!(integer_or(read.source_partition, -1), Some(-1));
        assert!(read.gpu_model.is_none());
        let model = line.replace(r#""kind":"gpu","#, r#""kind":"gpu","gpu_model":"H100-SXM-80GB","#);
        let read = rated_line(model.as_bytes()).expect("rated line with a model");
        assert_eq!(token(read.gpu_model), Some(r#""H100-SXM-80GB""#));
        let cases: [(&str, String); 3] = [
            ("missing field", line.replace(r#""list_cost":"0.1","#, "")),
            (
                "decimal as a number",
                line.replace(r#""quantity":"1""#, r#""quantity":1"#),
            ),
            ("escaped string", line.replace(r#""pod":"p""#, r#""pod":"p\n""#)),
        ];
        for (name, line) in cases {
            assert!(rated_line(line.as_bytes()).is_none(), "case {name:?}");
        }
    }

    #[test]
    fn strings() {
        let cases: [(&str, &str, Option<&str>); 5] = [
            ("plain", "\"spot\"", Some("spot")),
            ("empty", "\"\"", Some("")),
            ("not a string", "5", None),
            ("null", "null", None),
            ("escaped", r#""a\"b""#, None),
        ];
        for (name, token, expected) in cases {
            assert_eq!(plain_string(token), expected, "case {name:?}");
        }
    }

    #[test]
    fn integers() {
        let cases: [(&str, &str, Option<i64>); 9] = [
            ("zero", "0", Some(0)),
            ("negative", "-12", Some(-12)),
            ("largest", "9223372036854775807", Some(i64::MAX)),
            ("beyond i64", "9223372036854775808", None),
            ("leading zero", "012", None),
            ("plus sign", "+1", None),
            ("float", "1.0", None),
            ("exponent", "1e3", None),
            ("string", "\"1\"", None),
        ];
        for (name, token, expected) in cases {
            assert_eq!(integer(token), expected, "case {name:?}");
        }
    }

    #[test]
    fn decimal_texts() {
        let cases: [(&str, &str, Option<&str>); 15] = [
            ("integer", "12", Some("12")),
            ("string", "\"0.5\"", Some("0.5")),
            ("zero", "0", Some("0")),
            ("zero with places", "\"0.000\"", Some("0.000")),
            ("largest below 10^3", "\"999.99\"", Some("999.99")),
            ("at 10^3", "1000", None),
            ("float number", "0.5", None),
            ("leading zero", "\"00.5\"", None),
            ("leading point", "\".5\"", None),
            ("trailing point", "\"5.\"", None),
            ("exponent", "\"1e3\"", None),
            ("negative", "\"-1\"", None),
            ("negative zero", "-0", None),
            ("spaces", "\" 1\"", None),
            ("empty", "\"\"", None),
        ];
        for (name, token, expected) in cases {
            assert_eq!(decimal_text(token, 3), expected, "case {name:?}");
        }
    }
}
