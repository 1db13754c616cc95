//! The rating agent's per-sample path for the plain samples a fleet sends: one JSON line in,
//! one rated_usage row (values and rated JSON line) out.
//!
//! It decides nothing the Python path has not decided: everything that depends on the card,
//! the window or the quantity (the validity of the window and quantity, the card in force,
//! the rate, the exact unit-seconds and list cost, their JSON text) comes from a callback
//! into Python (`streams/native_rating.py`), which rates a prototype sample of that
//! combination with the Python code and is asked once per combination. What it checks itself
//! are the per-sample fields, by the rules of contract 1 as `UsageSample` states them.
//! Anything it does not plainly accept (escapes in strings, JSON floats, unknown or repeated
//! fields, a combination Python refused, ...) is declined: `None`, and the caller gives the
//! line to the Python path, which accepts or rejects it with the reason.

use std::collections::{HashMap, HashSet};
use std::fmt;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

/// Lines longer than this go to the Python path (which refuses them as `too_large`).
const MAX_SAMPLE_BYTES: usize = 64 * 1024;
/// Bound on each cache: cleared when full (a fleet repeats a few thousand texts per window).
const CACHE_LIMIT: usize = 65_536;
/// `UTILIZATION_LIMIT` (10^12) and `TELEMETRY_LIMIT` (10^32) as digits before the point.
const UTILIZATION_DIGITS: usize = 12;
const TELEMETRY_DIGITS: usize = 32;

fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<&'de RawValue>, D::Error> {
    // A field given as JSON null stays distinguishable from a field left out.
    <&RawValue>::deserialize(deserializer).map(Some)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Sample<'a> {
    event_id: &'a str,
    kind: &'a str,
    cluster: &'a str,
    node: &'a str,
    tenant: &'a str,
    namespace: &'a str,
    pod: &'a str,
    pod_uid: &'a str,
    #[serde(borrow)]
    window_start: &'a RawValue,
    #[serde(borrow)]
    window_end: &'a RawValue,
    #[serde(borrow)]
    quantity: &'a RawValue,
    #[serde(default, deserialize_with = "present")]
    gpu_model: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "present")]
    mig_profile: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "present")]
    capacity_type: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "present")]
    priority: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "present")]
    utilization: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "present")]
    memory_used_bytes: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "present")]
    power_watts: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "present")]
    energy_joules: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "present")]
    labels: Option<&'a RawValue>,
}

/// A labels object of unescaped strings, in order; a repeated key fails (declined).
struct Labels<'a>(Vec<(&'a str, &'a str)>);

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

/// What Python worked out for one window (its two timestamp tokens).
struct Window {
    /// `"window_start":..,"window_end":..,"period":..` of the rated line, as orjson writes them.
    part: Vec<u8>,
    /// period, window_start, window_end.
    values: Vec<Py<PyAny>>,
    /// The card in force and the exact length: with the kind, selector and quantity, the key
    /// of a rating.
    card: i64,
    seconds: String,
}

/// What Python worked out for one (card, window length, kind, selector, quantity).
struct Rating {
    /// `"quantity":..` through `"capacity_type":..` of the rated line.
    rating_part: Vec<u8>,
    /// `"rate_card":..` through `"list_cost":..`.
    price_part: Vec<u8>,
    /// quantity, unit_seconds, gpu_model, mig_profile, capacity_type, rate_card, currency,
    /// unit_price, capacity_multiplier, list_cost.
    values: Vec<Py<PyAny>>,
}

/// EventId: 1 to 128 characters.
fn event_id_ok(text: &str) -> bool {
    !text.is_empty() && (text.len() <= 128 || text.chars().count() <= 128)
}

/// NonEmpty: 1 to 253 characters, at least one not whitespace (the pattern `\S`).
fn non_empty_ok(text: &str) -> bool {
    !text.is_empty()
        && (text.len() <= 253 || text.chars().count() <= 253)
        && text.chars().any(|c| !c.is_whitespace())
}

/// TENANT_PATTERN: `^[a-z0-9][a-z0-9-]{0,62}$`.
fn tenant_ok(text: &str) -> bool {
    let bytes = text.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}

/// `0` or digits without a leading zero.
fn plain_integer(text: &str) -> bool {
    let bytes = text.as_bytes();
    !bytes.is_empty() && bytes.iter().all(u8::is_ascii_digit) && (bytes[0] != b'0' || bytes.len() == 1)
}

/// A telemetry value as its decimal text, when the JSON token is a plain non-negative decimal
/// string or integer whose text `str(Decimal(text))` gives back unchanged, below 10^digits.
fn decimal_text(raw: &str, digits: usize) -> Option<&str> {
    let text = if raw.len() >= 2 && raw.starts_with('"') && raw.ends_with('"') {
        &raw[1..raw.len() - 1]
    } else {
        raw
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
        if fraction.is_empty() || !fraction.bytes().all(|b| b.is_ascii_digit()) || !raw.starts_with('"') {
            return None;
        }
    }
    Some(text)
}

/// A pod priority: a JSON integer within Int32.
fn priority_of(raw: &str) -> Option<i32> {
    let digits = raw.strip_prefix('-').unwrap_or(raw);
    if !plain_integer(digits) || digits.len() > 10 {
        return None;
    }
    raw.parse::<i64>().ok().and_then(|value| i32::try_from(value).ok())
}

fn raw<'a>(value: Option<&'a RawValue>) -> Option<&'a str> {
    value.map(RawValue::get)
}

/// One cache key of several JSON tokens (a token holds no raw control character: these
/// separate them and mark an absent one).
fn key_of(parts: &[Option<&str>]) -> Vec<u8> {
    let mut key = Vec::with_capacity(160);
    for part in parts {
        match part {
            Some(text) => key.extend_from_slice(text.as_bytes()),
            None => key.push(1),
        }
        key.push(0);
    }
    key
}

fn is_null(raw: Option<&RawValue>) -> bool {
    raw.map_or(true, |value| value.get() == "null")
}

#[pyclass(module = "gpumeter_native")]
struct NativeRater {
    window: Py<PyAny>,
    rating: Py<PyAny>,
    decimal: Py<PyAny>,
    windows: HashMap<Vec<u8>, Option<Window>>,
    ratings: HashMap<Vec<u8>, Option<Rating>>,
    strings: HashMap<String, Py<PyString>>,
    decimals: HashMap<String, Py<PyAny>>,
    last_window: Vec<u8>,
    last_rating: Vec<u8>,
}

impl NativeRater {
    fn string<'py>(&mut self, py: Python<'py>, text: &str) -> Bound<'py, PyAny> {
        if let Some(found) = self.strings.get(text) {
            return found.bind(py).clone().into_any();
        }
        if self.strings.len() >= CACHE_LIMIT {
            self.strings.clear();
        }
        let made = PyString::new(py, text);
        self.strings.insert(text.to_owned(), made.clone().unbind());
        made.into_any()
    }

    fn decimal<'py>(&mut self, py: Python<'py>, text: &str, cached: bool) -> PyResult<Bound<'py, PyAny>> {
        if cached {
            if let Some(found) = self.decimals.get(text) {
                return Ok(found.bind(py).clone());
            }
        }
        let made = self.decimal.bind(py).call1((text,))?;
        if cached {
            if self.decimals.len() >= CACHE_LIMIT {
                self.decimals.clear();
            }
            self.decimals.insert(text.to_owned(), made.clone().unbind());
        }
        Ok(made)
    }

    fn window_for(&mut self, py: Python<'_>, sample: &Sample<'_>) -> PyResult<bool> {
        let key = key_of(&[Some(sample.window_start.get()), Some(sample.window_end.get())]);
        if !self.windows.contains_key(&key) {
            let answer = self.window.bind(py).call1((sample.window_start.get(), sample.window_end.get()))?;
            let window = if answer.is_none() {
                None
            } else {
                let (part, values, card, seconds): (Vec<u8>, Vec<Py<PyAny>>, i64, String) = answer.extract()?;
                if values.len() != 3 {
                    return Err(pyo3::exceptions::PyValueError::new_err("a window has 3 values"));
                }
                Some(Window { part, values, card, seconds })
            };
            if self.windows.len() >= CACHE_LIMIT {
                self.windows.clear();
            }
            self.windows.insert(key.clone(), window);
        }
        self.last_window = key;
        Ok(self.windows.get(&self.last_window).is_some_and(Option::is_some))
    }

    fn rating_for(&mut self, py: Python<'_>, sample: &Sample<'_>, card: i64, seconds: &str) -> PyResult<bool> {
        let card_text = card.to_string();
        let key = key_of(&[
            Some(&card_text),
            Some(seconds),
            Some(sample.kind),
            Some(sample.quantity.get()),
            raw(sample.gpu_model),
            raw(sample.mig_profile),
            raw(sample.capacity_type),
        ]);
        if !self.ratings.contains_key(&key) {
            let arguments = (
                sample.window_start.get(),
                sample.window_end.get(),
                sample.kind,
                sample.quantity.get(),
                raw(sample.gpu_model),
                raw(sample.mig_profile),
                raw(sample.capacity_type),
            );
            let answer = self.rating.bind(py).call1(arguments)?;
            let rating = if answer.is_none() {
                None
            } else {
                let (rating_part, price_part, values): (Vec<u8>, Vec<u8>, Vec<Py<PyAny>>) = answer.extract()?;
                if values.len() != 10 {
                    return Err(pyo3::exceptions::PyValueError::new_err("a rating has 10 values"));
                }
                Some(Rating { rating_part, price_part, values })
            };
            if self.ratings.len() >= CACHE_LIMIT {
                self.ratings.clear();
            }
            self.ratings.insert(key.clone(), rating);
        }
        self.last_rating = key;
        Ok(self.ratings.get(&self.last_rating).is_some_and(Option::is_some))
    }

    fn rate_line<'py>(&mut self, py: Python<'py>, line: &[u8], partition: i64, offset: i64)
        -> PyResult<Option<Bound<'py, PyTuple>>> {
        if line.len() > MAX_SAMPLE_BYTES {
            return Ok(None);
        }
        let Ok(sample) = serde_json::from_slice::<Sample>(line) else {
            return Ok(None);
        };
        if !event_id_ok(sample.event_id)
            || !tenant_ok(sample.tenant)
            || ![sample.cluster, sample.node, sample.namespace, sample.pod, sample.pod_uid]
                .iter()
                .all(|text| non_empty_ok(text))
        {
            return Ok(None);
        }
        let priority = match sample.priority {
            None => 0,
            Some(raw) => match priority_of(raw.get()) {
                Some(value) => value,
                None => return Ok(None),
            },
        };
        let mut telemetry: [Option<&str>; 4] = [None; 4];
        let fields = [sample.utilization, sample.memory_used_bytes, sample.power_watts, sample.energy_joules];
        for (index, field) in fields.iter().enumerate() {
            if is_null(*field) {
                continue;
            }
            let digits = if index == 0 { UTILIZATION_DIGITS } else { TELEMETRY_DIGITS };
            match decimal_text(field.map_or("", RawValue::get), digits) {
                Some(text) => telemetry[index] = Some(text),
                None => return Ok(None),
            }
        }
        let labels = match sample.labels {
            None => Labels(Vec::new()),
            Some(raw) => match serde_json::from_str::<Labels>(raw.get()) {
                Ok(labels) => labels,
                Err(_) => return Ok(None),
            },
        };
        if !self.window_for(py, &sample)? {
            return Ok(None);
        }
        let (card, seconds) = match self.windows.get(&self.last_window) {
            Some(Some(window)) => (window.card, window.seconds.clone()),
            _ => return Ok(None),
        };
        if !self.rating_for(py, &sample, card, &seconds)? {
            return Ok(None);
        }
        let (Some(Some(window)), Some(Some(rating))) =
            (self.windows.get(&self.last_window), self.ratings.get(&self.last_rating))
        else {
            return Ok(None);
        };
        let mut values: Vec<Bound<'py, PyAny>> = window.values.iter().map(|value| value.bind(py).clone()).collect();
        values.extend(rating.values.iter().map(|value| value.bind(py).clone()));
        let window_part = window.part.clone();
        let rating_part = rating.rating_part.clone();
        let price_part = rating.price_part.clone();

        // The rated line, as encode_rated writes it (orjson over RatedUsage's fields, in order).
        // Strings read without escapes need none (no quote, backslash or control character).
        let mut out: Vec<u8> = Vec::with_capacity(line.len() + 256);
        let text_field = |out: &mut Vec<u8>, first: bool, name: &str, value: &str| {
            if !first {
                out.push(b',');
            }
            out.push(b'"');
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b"\":\"");
            out.extend_from_slice(value.as_bytes());
            out.push(b'"');
        };
        out.push(b'{');
        text_field(&mut out, true, "event_id", sample.event_id);
        text_field(&mut out, false, "kind", sample.kind);
        text_field(&mut out, false, "cluster", sample.cluster);
        text_field(&mut out, false, "node", sample.node);
        text_field(&mut out, false, "tenant", sample.tenant);
        text_field(&mut out, false, "namespace", sample.namespace);
        text_field(&mut out, false, "pod", sample.pod);
        text_field(&mut out, false, "pod_uid", sample.pod_uid);
        out.push(b',');
        out.extend_from_slice(&window_part);
        out.push(b',');
        out.extend_from_slice(&rating_part);
        out.extend_from_slice(format!(",\"priority\":{priority},").as_bytes());
        out.extend_from_slice(&price_part);
        for (name, value) in [("utilization", telemetry[0]), ("energy_joules", telemetry[3])] {
            match value {
                Some(text) => text_field(&mut out, false, name, text),
                None => out.extend_from_slice(format!(",\"{name}\":null").as_bytes()),
            }
        }
        out.extend_from_slice(b",\"labels\":{");
        for (index, (key, value)) in labels.0.iter().enumerate() {
            text_field(&mut out, index == 0, key, value);
        }
        out.extend_from_slice(format!("}},\"source_partition\":{partition},\"source_offset\":{offset}}}").as_bytes());

        let label_dict = PyDict::new(py);
        for (key, value) in &labels.0 {
            label_dict.set_item(self.string(py, key), PyString::new(py, value))?;
        }
        let none = py.None().into_bound(py);
        let utilization = match telemetry[0] {
            Some(text) => self.decimal(py, text, true)?,
            None => none.clone(),
        };
        let energy = match telemetry[3] {
            Some(text) => self.decimal(py, text, false)?,
            None => none.clone(),
        };
        // rated_usage's insert columns, in order, and the line (streams/sink.py rated_row).
        let row: Vec<Bound<'py, PyAny>> = vec![
            PyString::new(py, sample.event_id).into_any(),
            self.string(py, sample.tenant),
            values[0].clone(), // period
            self.string(py, sample.kind),
            self.string(py, sample.cluster),
            self.string(py, sample.node),
            self.string(py, sample.namespace),
            self.string(py, sample.pod),
            self.string(py, sample.pod_uid),
            values[1].clone(), // window_start
            values[2].clone(), // window_end
            values[3].clone(), // quantity
            values[4].clone(), // unit_seconds
            values[5].clone(), // gpu_model
            values[6].clone(), // mig_profile
            values[7].clone(), // capacity_type
            priority.into_pyobject(py)?.into_any(),
            values[8].clone(),  // rate_card
            values[9].clone(),  // currency
            values[10].clone(), // unit_price
            values[11].clone(), // capacity_multiplier
            values[12].clone(), // list_cost
            utilization,
            energy,
            label_dict.into_any(),
            partition.into_pyobject(py)?.into_any(),
            offset.into_pyobject(py)?.into_any(),
            PyBytes::new(py, &out).into_any(),
        ];
        Ok(Some(PyTuple::new(py, row)?))
    }
}

#[pymethods]
impl NativeRater {
    /// ``window(window_start, window_end)`` returns None or ``(part, values, card, seconds)``;
    /// ``rating(window_start, window_end, kind, quantity, gpu_model, mig_profile,
    /// capacity_type)`` None or ``(rating_part, price_part, values)`` (JSON tokens, None where
    /// a field is absent: streams/native_rating.py); ``decimal`` is ``decimal.Decimal``.
    #[new]
    fn new(window: Py<PyAny>, rating: Py<PyAny>, decimal: Py<PyAny>) -> Self {
        NativeRater {
            window,
            rating,
            decimal,
            windows: HashMap::new(),
            ratings: HashMap::new(),
            last_window: Vec::new(),
            last_rating: Vec::new(),
            strings: HashMap::new(),
            decimals: HashMap::new(),
        }
    }

    /// One row (a tuple: rated_usage's insert columns, then the rated line) or None per line.
    fn rate_lines<'py>(&mut self, py: Python<'py>, lines: &Bound<'py, PyList>, partition: i64, offset: i64)
        -> PyResult<Bound<'py, PyList>> {
        let results = PyList::empty(py);
        for item in lines.iter() {
            let line = item.downcast::<PyBytes>()?;
            match self.rate_line(py, line.as_bytes(), partition, offset)? {
                Some(row) => results.append(row)?,
                None => results.append(py.None())?,
            }
        }
        Ok(results)
    }

    /// Forget every window and rating (new rate cards).
    fn clear(&mut self) {
        self.windows.clear();
        self.ratings.clear();
    }
}

/// A rated line as the quota agent reads it (streams/quota_decode.py `_usage`): the fields it
/// uses, each with the JSON type the rating agent writes; any other field is skipped.
#[derive(Deserialize)]
struct RatedLine<'a> {
    event_id: &'a str,
    namespace: &'a str,
    pod: &'a str,
    pod_uid: &'a str,
    kind: &'a str,
    tenant: &'a str,
    window_start: &'a str,
    window_end: &'a str,
    quantity: &'a str,
    unit_seconds: &'a str,
    list_cost: &'a str,
    #[serde(default, deserialize_with = "present")]
    capacity_type: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "present")]
    priority: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "present")]
    source_partition: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "present")]
    source_offset: Option<&'a RawValue>,
}

/// A JSON integer token (any sign) within i64, or the default where the field is absent.
fn integer_or(raw: Option<&RawValue>, default: i64) -> Option<i64> {
    match raw {
        None => Some(default),
        Some(value) => {
            let text = value.get();
            let digits = text.strip_prefix('-').unwrap_or(text);
            if !plain_integer(digits) {
                return None;
            }
            text.parse::<i64>().ok()
        }
    }
}

const KINDS: [&str; 4] = ["gpu", "cpu", "memory", "storage"];
const CAPACITY_TYPES: [&str; 3] = ["on-demand", "spot", "reserved"];

/// The quota agent's reader of rated records: `read(record)` gives (source partition, source
/// offset, Usage) per line, or None when any line is not plainly what the rating agent writes
/// (the caller then reads the record with RatedLine, which decides).
#[pyclass(module = "gpumeter_native")]
struct RatedReader {
    moment: Py<PyAny>,
    number: Py<PyAny>,
    usage: Py<PyAny>,
    moments: HashMap<String, Py<PyAny>>,
    numbers: HashMap<String, Py<PyAny>>,
    strings: HashMap<String, Py<PyString>>,
}

fn cached<'py>(py: Python<'py>, cache: &mut HashMap<String, Py<PyAny>>, make: &Py<PyAny>, text: &str)
    -> PyResult<Option<Bound<'py, PyAny>>> {
    if let Some(found) = cache.get(text) {
        return Ok(Some(found.bind(py).clone()));
    }
    let made = make.bind(py).call1((text,))?;
    if made.is_none() {
        return Ok(None);
    }
    if cache.len() >= CACHE_LIMIT {
        cache.clear();
    }
    cache.insert(text.to_owned(), made.clone().unbind());
    Ok(Some(made))
}

impl RatedReader {
    fn string<'py>(&mut self, py: Python<'py>, text: &str) -> Bound<'py, PyAny> {
        if let Some(found) = self.strings.get(text) {
            return found.bind(py).clone().into_any();
        }
        if self.strings.len() >= CACHE_LIMIT {
            self.strings.clear();
        }
        let made = PyString::new(py, text);
        self.strings.insert(text.to_owned(), made.clone().unbind());
        made.into_any()
    }

    fn read_line<'py>(&mut self, py: Python<'py>, line: &[u8]) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let Ok(rated) = serde_json::from_slice::<RatedLine>(line) else {
            return Ok(None);
        };
        let capacity_type = match rated.capacity_type {
            None => "on-demand",
            Some(raw) => {
                let token = raw.get();
                let text = token.strip_prefix('"').and_then(|rest| rest.strip_suffix('"')).unwrap_or("");
                match CAPACITY_TYPES.iter().find(|name| **name == text) {
                    Some(name) => name,
                    None => return Ok(None),
                }
            }
        };
        let (Some(priority), Some(partition), Some(offset)) = (
            integer_or(rated.priority, 0),
            integer_or(rated.source_partition, -1),
            integer_or(rated.source_offset, -1),
        ) else {
            return Ok(None);
        };
        if rated.event_id.is_empty() || !KINDS.contains(&rated.kind) || !tenant_ok(rated.tenant) {
            return Ok(None);
        }
        let (Some(start), Some(end)) = (
            cached(py, &mut self.moments, &self.moment, rated.window_start)?,
            cached(py, &mut self.moments, &self.moment, rated.window_end)?,
        ) else {
            return Ok(None);
        };
        if !start.lt(&end)? {
            return Ok(None);
        }
        let (Some(quantity), Some(unit_seconds), Some(list_cost)) = (
            cached(py, &mut self.numbers, &self.number, rated.quantity)?,
            cached(py, &mut self.numbers, &self.number, rated.unit_seconds)?,
            cached(py, &mut self.numbers, &self.number, rated.list_cost)?,
        ) else {
            return Ok(None);
        };
        let arguments = PyTuple::new(py, [
            PyString::new(py, rated.event_id).into_any(),
            self.string(py, rated.tenant),
            self.string(py, rated.kind),
            self.string(py, rated.namespace),
            self.string(py, rated.pod),
            self.string(py, rated.pod_uid),
            start,
            end,
            quantity,
            unit_seconds,
            list_cost,
            self.string(py, capacity_type),
            priority.into_pyobject(py)?.into_any(),
        ])?;
        let usage = self.usage.bind(py).call1(arguments)?;
        Ok(Some(PyTuple::new(py, [
            partition.into_pyobject(py)?.into_any(),
            offset.into_pyobject(py)?.into_any(),
            usage,
        ])?))
    }
}

#[pymethods]
impl RatedReader {
    /// ``moment(text)``: the UTC datetime pydantic reads from a timestamp text, or None;
    /// ``number(text)``: the Decimal of a finite non-negative decimal text, or None;
    /// ``usage``: ``Usage.trusted``.
    #[new]
    fn new(moment: Py<PyAny>, number: Py<PyAny>, usage: Py<PyAny>) -> Self {
        RatedReader {
            moment,
            number,
            usage,
            moments: HashMap::new(),
            numbers: HashMap::new(),
            strings: HashMap::new(),
        }
    }

    fn read<'py>(&mut self, py: Python<'py>, record: &[u8]) -> PyResult<Option<Bound<'py, PyList>>> {
        let results = PyList::empty(py);
        // gpumeter/core/records.py split: lines of the record, blank ones skipped.
        for line in record.split(|byte| *byte == b'\n') {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match self.read_line(py, line)? {
                Some(located) => results.append(located)?,
                None => return Ok(None),
            }
        }
        Ok(Some(results))
    }
}

#[pymodule]
fn gpumeter_native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<NativeRater>()?;
    module.add_class::<RatedReader>()?;
    Ok(())
}
