//! `NativeRater`: the rating agent's per-sample path for the plain samples a fleet sends, one
//! JSON line in, one rated_usage row (values and rated JSON line) out.
//!
//! It decides nothing the Python path has not decided: everything that depends on the card,
//! the window or the quantity (the validity of the window and quantity, the card in force,
//! the rate, the exact unit-seconds and list cost, their JSON text) comes from a callback
//! into Python (`streams/native_rating.py`), which rates a prototype sample of that
//! combination with the Python code and is asked once per combination. What it checks itself
//! are the per-sample fields, by the rules of contract 1 (validate.rs). Anything it does not
//! plainly accept (escapes in strings, JSON floats, unknown or repeated fields, a combination
//! Python refused, ...) is declined: `None`, and the caller gives the line to the Python
//! path, which accepts or rejects it with the reason.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use crate::cache::{BoundedCache, PyStrings};
use crate::json::{self, Sample};
use crate::row::{RowLayout, SampleField, Source};
use crate::validate;

/// Values Python gives for some of the row's columns, by their place in `RowLayout`'s given
/// columns (None: a column this answer does not give).
type Given = Vec<Option<Py<PyAny>>>;

/// What Python worked out for one window (its two timestamp tokens).
struct Window {
    /// `"window_start":..,"window_end":..,"period":..` of the rated line, as orjson writes them.
    part: Vec<u8>,
    given: Given,
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
    given: Given,
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

/// The sample's fields contract 1 constrains, once checked.
struct Checked<'a> {
    priority: i32,
    utilization: Option<&'a str>,
    energy_joules: Option<&'a str>,
    labels: json::Labels<'a>,
}

fn checked<'a>(sample: &Sample<'a>) -> Option<Checked<'a>> {
    let names_ok = [
        sample.cluster,
        sample.node,
        sample.namespace,
        sample.pod,
        sample.pod_uid,
    ]
    .into_iter()
    .all(validate::name_ok);
    if !validate::event_id_ok(sample.event_id) || !validate::tenant_ok(sample.tenant) || !names_ok {
        return None;
    }
    let priority = match sample.priority {
        None => 0,
        Some(raw) => validate::priority(raw.get())?,
    };
    // Every telemetry field is checked; the rated line and row carry two of them.
    let mut telemetry = [None; 4];
    let fields = [
        (
            sample.utilization,
            validate::utilization as fn(&str) -> Option<&str>,
        ),
        (sample.memory_used_bytes, validate::telemetry),
        (sample.power_watts, validate::telemetry),
        (sample.energy_joules, validate::telemetry),
    ];
    for (place, (field, rule)) in fields.into_iter().enumerate() {
        if !json::is_null(field) {
            telemetry[place] = Some(rule(json::token(field)?)?);
        }
    }
    let labels = json::labels(sample.labels)?;
    Some(Checked {
        priority,
        utilization: telemetry[0],
        energy_joules: telemetry[3],
        labels,
    })
}

#[pyclass(module = "gpumeter_native")]
pub struct NativeRater {
    window: Py<PyAny>,
    rating: Py<PyAny>,
    decimal: Py<PyAny>,
    layout: RowLayout,
    windows: BoundedCache<Vec<u8>, Option<Arc<Window>>>,
    ratings: BoundedCache<Vec<u8>, Option<Arc<Rating>>>,
    strings: PyStrings,
    decimals: BoundedCache<String, Py<PyAny>>,
}

impl NativeRater {
    fn decimal<'py>(&mut self, py: Python<'py>, text: &str, cached: bool) -> PyResult<Bound<'py, PyAny>> {
        if !cached {
            return self.decimal.bind(py).call1((text,));
        }
        if let Some(found) = self.decimals.get(text) {
            return Ok(found.bind(py).clone());
        }
        let made = self.decimal.bind(py).call1((text,))?;
        self.decimals.insert(text.to_owned(), made.clone().unbind());
        Ok(made)
    }

    /// The given values of an answer from Python, a dict by column name.
    fn given(&self, values: &Bound<'_, PyDict>) -> PyResult<Given> {
        let mut given: Given = (0..self.layout.given_count()).map(|_| None).collect();
        for (name, value) in values.iter() {
            let name: String = name.extract()?;
            let place = self.layout.given_place(&name).ok_or_else(|| {
                PyValueError::new_err(format!("{name} is not an insert column given by Python"))
            })?;
            given[place] = Some(value.unbind());
        }
        Ok(given)
    }

    fn window_for(&mut self, py: Python<'_>, sample: &Sample<'_>) -> PyResult<Option<Arc<Window>>> {
        let (start, end) = (sample.window_start.get(), sample.window_end.get());
        let key = key_of(&[Some(start), Some(end)]);
        if let Some(known) = self.windows.get(&key) {
            return Ok(known.clone());
        }
        let answer = self.window.bind(py).call1((start, end))?;
        let window = if answer.is_none() {
            None
        } else {
            let (part, values, card, seconds): (Vec<u8>, Bound<'_, PyDict>, i64, String) =
                answer.extract()?;
            Some(Arc::new(Window {
                part,
                given: self.given(&values)?,
                card,
                seconds,
            }))
        };
        self.windows.insert(key, window.clone());
        Ok(window)
    }

    fn rating_for(
        &mut self,
        py: Python<'_>,
        sample: &Sample<'_>,
        window: &Window,
    ) -> PyResult<Option<Arc<Rating>>> {
        let card = window.card.to_string();
        let key = key_of(&[
            Some(&card),
            Some(&window.seconds),
            Some(sample.kind),
            Some(sample.quantity.get()),
            json::token(sample.gpu_model),
            json::token(sample.mig_profile),
            json::token(sample.capacity_type),
        ]);
        if let Some(known) = self.ratings.get(&key) {
            return Ok(known.clone());
        }
        let arguments = (
            sample.window_start.get(),
            sample.window_end.get(),
            sample.kind,
            sample.quantity.get(),
            json::token(sample.gpu_model),
            json::token(sample.mig_profile),
            json::token(sample.capacity_type),
        );
        let answer = self.rating.bind(py).call1(arguments)?;
        let rating = if answer.is_none() {
            None
        } else {
            let (rating_part, price_part, values): (Vec<u8>, Vec<u8>, Bound<'_, PyDict>) =
                answer.extract()?;
            Some(Arc::new(Rating {
                rating_part,
                price_part,
                given: self.given(&values)?,
            }))
        };
        self.ratings.insert(key, rating.clone());
        Ok(rating)
    }

    fn rate_line<'py>(
        &mut self,
        py: Python<'py>,
        line: &[u8],
        partition: i64,
        offset: i64,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        if line.len() > validate::MAX_SAMPLE_BYTES {
            return Ok(None);
        }
        let Some(sample) = json::sample(line) else {
            return Ok(None);
        };
        let Some(fields) = checked(&sample) else {
            return Ok(None);
        };
        let Some(window) = self.window_for(py, &sample)? else {
            return Ok(None);
        };
        let Some(rating) = self.rating_for(py, &sample, &window)? else {
            return Ok(None);
        };
        let line = rated_line(
            &sample,
            &fields,
            &window,
            &rating,
            partition,
            offset,
            line.len() + 256,
        );
        let mut row: Vec<Bound<'py, PyAny>> = Vec::with_capacity(self.layout.columns.len() + 1);
        for place in 0..self.layout.columns.len() {
            let source = self.layout.columns[place].1;
            let value = match source {
                Source::Sample(field) => self.sample_value(py, field, &sample, &fields, partition, offset)?,
                Source::Given(given) => match window.given[given].as_ref().or(rating.given[given].as_ref()) {
                    Some(value) => value.bind(py).clone(),
                    None => {
                        let name = &self.layout.columns[place].0;
                        return Err(PyValueError::new_err(format!(
                            "neither window nor rating gives {name}"
                        )));
                    }
                },
            };
            row.push(value);
        }
        // The rated line after the values, as `rated_row` carries it.
        row.push(PyBytes::new(py, &line).into_any());
        Ok(Some(PyTuple::new(py, row)?))
    }

    fn sample_value<'py>(
        &mut self,
        py: Python<'py>,
        field: SampleField,
        sample: &Sample<'_>,
        fields: &Checked<'_>,
        partition: i64,
        offset: i64,
    ) -> PyResult<Bound<'py, PyAny>> {
        Ok(match field {
            // Ids rarely repeat: not worth a cache entry.
            SampleField::EventId => PyString::new(py, sample.event_id).into_any(),
            SampleField::Tenant => self.strings.get(py, sample.tenant),
            SampleField::Kind => self.strings.get(py, sample.kind),
            SampleField::Cluster => self.strings.get(py, sample.cluster),
            SampleField::Node => self.strings.get(py, sample.node),
            SampleField::Namespace => self.strings.get(py, sample.namespace),
            SampleField::Pod => self.strings.get(py, sample.pod),
            SampleField::PodUid => self.strings.get(py, sample.pod_uid),
            SampleField::Priority => fields.priority.into_pyobject(py)?.into_any(),
            SampleField::Utilization => match fields.utilization {
                Some(text) => self.decimal(py, text, true)?,
                None => py.None().into_bound(py),
            },
            // A running counter: nearly every value is new.
            SampleField::EnergyJoules => match fields.energy_joules {
                Some(text) => self.decimal(py, text, false)?,
                None => py.None().into_bound(py),
            },
            SampleField::Labels => {
                let labels = PyDict::new(py);
                for (key, value) in &fields.labels.0 {
                    labels.set_item(self.strings.get(py, key), PyString::new(py, value))?;
                }
                labels.into_any()
            }
            SampleField::SourcePartition => partition.into_pyobject(py)?.into_any(),
            SampleField::SourceOffset => offset.into_pyobject(py)?.into_any(),
        })
    }
}

/// The rated line, as encode_rated writes it (orjson over RatedUsage's fields, in order).
/// Strings read without escapes need none (no quote, backslash or control character).
fn rated_line(
    sample: &Sample<'_>,
    fields: &Checked<'_>,
    window: &Window,
    rating: &Rating,
    partition: i64,
    offset: i64,
    capacity: usize,
) -> Vec<u8> {
    let mut out: Vec<u8> = Vec::with_capacity(capacity);
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
    out.extend_from_slice(&window.part);
    out.push(b',');
    out.extend_from_slice(&rating.rating_part);
    out.extend_from_slice(format!(",\"priority\":{},", fields.priority).as_bytes());
    out.extend_from_slice(&rating.price_part);
    for (name, value) in [
        ("utilization", fields.utilization),
        ("energy_joules", fields.energy_joules),
    ] {
        match value {
            Some(text) => text_field(&mut out, false, name, text),
            None => out.extend_from_slice(format!(",\"{name}\":null").as_bytes()),
        }
    }
    out.extend_from_slice(b",\"labels\":{");
    for (index, (key, value)) in fields.labels.0.iter().enumerate() {
        text_field(&mut out, index == 0, key, value);
    }
    out.extend_from_slice(
        format!("}},\"source_partition\":{partition},\"source_offset\":{offset}}}").as_bytes(),
    );
    out
}

#[pymethods]
impl NativeRater {
    /// ``window(window_start, window_end)`` returns None or ``(part, values, card, seconds)``;
    /// ``rating(window_start, window_end, kind, quantity, gpu_model, mig_profile,
    /// capacity_type)`` None or ``(rating_part, price_part, values)`` (JSON tokens, None where
    /// a field is absent: streams/native_rating.py), ``values`` a dict of insert column name
    /// to value; ``decimal`` is ``decimal.Decimal``; ``columns`` are rated_usage's insert
    /// columns, in the order of a row.
    #[new]
    fn new(window: Py<PyAny>, rating: Py<PyAny>, decimal: Py<PyAny>, columns: Vec<String>) -> PyResult<Self> {
        Ok(NativeRater {
            window,
            rating,
            decimal,
            layout: RowLayout::new(&columns).map_err(PyValueError::new_err)?,
            windows: BoundedCache::default(),
            ratings: BoundedCache::default(),
            strings: PyStrings::default(),
            decimals: BoundedCache::default(),
        })
    }

    /// One row (a tuple: rated_usage's insert columns, then the rated line) or None per line.
    fn rate_lines<'py>(
        &mut self,
        py: Python<'py>,
        lines: &Bound<'py, PyList>,
        partition: i64,
        offset: i64,
    ) -> PyResult<Bound<'py, PyList>> {
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
