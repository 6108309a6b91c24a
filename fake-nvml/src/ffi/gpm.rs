//! GPM (GPU Performance Monitoring): the support query, sample handles, samples of the
//! whole GPU or of one GPU instance, and metrics between two samples. The handles are
//! numbers cast to pointers, never dereferenced (see [`crate::gpm::Samples`]).

use super::{
    INVALID_ARGUMENT, NOT_SUPPORTED, SUCCESS, VERSION_MISMATCH, code, dev, get, put, with,
};
use crate::function::Function;
use crate::gpm::SupportQuery;
use nvml_wrapper_sys::bindings::*;
use std::ffi::c_uint;
use std::ptr::null_mut;

/// The metric info the fake answers: none (null names, as nvml-wrapper allows).
const NO_INFO: nvmlGpmMetric_t__bindgen_ty_1 = nvmlGpmMetric_t__bindgen_ty_1 {
    shortName: null_mut(),
    longName: null_mut(),
    unit: null_mut(),
};

/// `isSupportedDevice` 1 for a GPU with GPM (unless its scenario's `support_query` says
/// otherwise), 0 without; VERSION_MISMATCH for a version other than 1, or whatever the
/// version with `support_query` `version_mismatch`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmQueryDeviceSupport(
    device: nvmlDevice_t,
    support: *mut nvmlGpmSupport_t,
) -> nvmlReturn_t {
    dev(device, Function::nvmlGpmQueryDeviceSupport, |s, i| {
        let given = get(support)?;
        let query = s.gpm_support(i);
        if query == Some(SupportQuery::VersionMismatch) || given.version != NVML_GPM_SUPPORT_VERSION
        {
            return Err(VERSION_MISMATCH);
        }
        put(
            support,
            nvmlGpmSupport_t {
                version: given.version,
                isSupportedDevice: c_uint::from(query == Some(SupportQuery::Answer)),
            },
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleAlloc(sample: *mut nvmlGpmSample_t) -> nvmlReturn_t {
    code(with(|s| {
        s.system_call(Function::nvmlGpmSampleAlloc);
        // Checked before allocating: a handle the caller never got would stay live.
        if sample.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        put(sample, s.gpm_alloc() as nvmlGpmSample_t)
    }))
}

/// INVALID_ARGUMENT for a handle not given out, or already freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleFree(sample: nvmlGpmSample_t) -> nvmlReturn_t {
    code(with(|s| {
        s.system_call(Function::nvmlGpmSampleFree);
        s.gpm_free(sample as usize)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleGet(
    device: nvmlDevice_t,
    sample: nvmlGpmSample_t,
) -> nvmlReturn_t {
    dev(device, Function::nvmlGpmSampleGet, |s, i| {
        s.gpm_sample(i, None, sample as usize)
    })
}

/// A sample of the GPU instance `gpu_instance_id` of `device` (the GPU's handle, not a
/// MIG device's).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmMigSampleGet(
    device: nvmlDevice_t,
    gpu_instance_id: c_uint,
    sample: nvmlGpmSample_t,
) -> nvmlReturn_t {
    dev(device, Function::nvmlGpmMigSampleGet, |s, i| {
        s.gpm_sample(i, Some(gpu_instance_id), sample as usize)
    })
}

/// Each requested metric over the two samples: SUCCESS with the scenario's value at the
/// second sample, or NOT_SUPPORTED (value 0) for a metric the scenario does not name. The
/// call itself answers VERSION_MISMATCH for a version other than 1 and INVALID_ARGUMENT
/// for more than `NVML_GPM_METRIC_MAX` metrics or samples that make no window (see
/// [`crate::gpm::Samples::window`]).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmMetricsGet(request: *mut nvmlGpmMetricsGet_t) -> nvmlReturn_t {
    code(with(|s| {
        s.system_call(Function::nvmlGpmMetricsGet);
        let mut req = get(request)?;
        if req.version != NVML_GPM_METRICS_GET_VERSION {
            return Err(VERSION_MISMATCH);
        }
        if req.numMetrics > nvmlGpmMetricId_t_NVML_GPM_METRIC_MAX {
            return Err(INVALID_ARGUMENT);
        }
        let at = s.gpm_window(req.sample1 as usize, req.sample2 as usize)?;
        let asked = req.numMetrics as usize;
        for m in req.metrics.iter_mut().take(asked) {
            let value = s.gpm_value(&at, m.metricId);
            m.nvmlReturn = if value.is_some() {
                SUCCESS
            } else {
                NOT_SUPPORTED
            };
            m.value = value.unwrap_or(0.0);
            m.metricInfo = NO_INFO;
        }
        put(request, req)
    }))
}
