//! `RatedReader`: the quota agent's reader of rated records (streams/quota_decode.py).

use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};

use crate::cache::{BoundedCache, PyStrings};
use crate::json;
use crate::validate::{self, CAPACITY_TYPES, KINDS};

/// `read(record)` gives (source partition, source offset, Usage) per line, or None when any
/// line is not plainly what the rating agent writes (the caller then reads the record with
/// RatedLine, which decides).
#[pyclass(module = "gpumeter_native")]
pub struct RatedReader {
    moment: Py<PyAny>,
    number: Py<PyAny>,
    usage: Py<PyAny>,
    moments: BoundedCache<String, Py<PyAny>>,
    numbers: BoundedCache<String, Py<PyAny>>,
    strings: PyStrings,
}

/// `make(text)` through `cache`; a None from `make` (a text it refuses) is not kept.
fn cached<'py>(
    py: Python<'py>,
    cache: &mut BoundedCache<String, Py<PyAny>>,
    make: &Py<PyAny>,
    text: &str,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    if let Some(found) = cache.get(text) {
        return Ok(Some(found.bind(py).clone()));
    }
    let made = make.bind(py).call1((text,))?;
    if made.is_none() {
        return Ok(None);
    }
    cache.insert(text.to_owned(), made.clone().unbind());
    Ok(Some(made))
}

impl RatedReader {
    fn read_line<'py>(&mut self, py: Python<'py>, line: &[u8]) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let Some(rated) = json::rated_line(line) else {
            return Ok(None);
        };
        let capacity_type = match rated.capacity_type {
            None => "on-demand",
            Some(raw) => match json::plain_string(raw.get()).filter(|text| CAPACITY_TYPES.contains(text)) {
                Some(text) => text,
                None => return Ok(None),
            },
        };
        // RatedLine's `str | None`: JSON null or absent is None, a string is the model.
        let gpu_model = if json::is_null(rated.gpu_model) {
            None
        } else {
            match json::token(rated.gpu_model).and_then(json::plain_string) {
                Some(text) => Some(text),
                None => return Ok(None),
            }
        };
        let (Some(priority), Some(partition), Some(offset)) = (
            json::integer_or(rated.priority, 0),
            json::integer_or(rated.source_partition, -1),
            json::integer_or(rated.source_offset, -1),
        ) else {
            return Ok(None);
        };
        if rated.event_id.is_empty() || !KINDS.contains(&rated.kind) || !validate::tenant_ok(rated.tenant) {
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
        // Usage.trusted's parameters, in its order.
        let arguments = PyTuple::new(
            py,
            [
                PyString::new(py, rated.event_id).into_any(),
                self.strings.get(py, rated.tenant),
                self.strings.get(py, rated.kind),
                self.strings.get(py, rated.namespace),
                self.strings.get(py, rated.pod),
                self.strings.get(py, rated.pod_uid),
                start,
                end,
                quantity,
                unit_seconds,
                list_cost,
                self.strings.get(py, capacity_type),
                priority.into_pyobject(py)?.into_any(),
                match gpu_model {
                    Some(model) => self.strings.get(py, model),
                    None => py.None().into_bound(py),
                },
            ],
        )?;
        let usage = self.usage.bind(py).call1(arguments)?;
        Ok(Some(PyTuple::new(
            py,
            [
                partition.into_pyobject(py)?.into_any(),
                offset.into_pyobject(py)?.into_any(),
                usage,
            ],
        )?))
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
            moments: BoundedCache::default(),
            numbers: BoundedCache::default(),
            strings: PyStrings::default(),
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
