//! gpumeter's native paths (the `gpumeter_native` extension): the rating agent's per-sample
//! path (rate.rs, used by streams/native_rating.py) and the quota agent's reader of rated
//! records (rated_reader.rs, used by streams/quota_decode.py); the kube extender's NodeNames
//! answers (extender.rs, used by scheduler_hooks/extender/wire_kube.py). The Python paths are the
//! definition: these accept a subset of what they accept, and never other values.

mod cache;
mod extender;
mod json;
mod pieces;
mod rate;
mod rated_reader;
mod row;
mod validate;

use pyo3::prelude::*;

#[pymodule]
fn gpumeter_native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<rate::NativeRater>()?;
    module.add_class::<rated_reader::RatedReader>()?;
    module.add_class::<extender::NodeNames>()?;
    module.add_class::<extender::FitPieces>()?;
    module.add_function(wrap_pyfunction!(extender::read_node_names, module)?)?;
    module.add_function(wrap_pyfunction!(extender::py_priorities, module)?)?;
    // The contract-1 limits the checks implement (validate.rs): held equal to Python's by
    // tests/unit/streams/test_native_limits.py.
    module.add("MAX_SAMPLE_BYTES", validate::MAX_SAMPLE_BYTES)?;
    module.add("EVENT_ID_MAX_CHARS", validate::EVENT_ID_MAX_CHARS)?;
    module.add("NAME_MAX_CHARS", validate::NAME_MAX_CHARS)?;
    module.add("NAME_PATTERN", validate::NAME_PATTERN)?;
    module.add("TENANT_PATTERN", validate::TENANT_PATTERN)?;
    module.add("PRIORITY_MIN", validate::PRIORITY_MIN)?;
    module.add("PRIORITY_MAX", validate::PRIORITY_MAX)?;
    module.add("UTILIZATION_DIGITS", validate::UTILIZATION_DIGITS)?;
    module.add("TELEMETRY_DIGITS", validate::TELEMETRY_DIGITS)?;
    module.add("KINDS", validate::KINDS)?;
    module.add("CAPACITY_TYPES", validate::CAPACITY_TYPES)?;
    Ok(())
}
