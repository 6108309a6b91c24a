//! The NVML event thread: Xid critical errors and ECC double-bit errors, waited on
//! with a timeout and forwarded to the sampler.

use super::EVENT_WAIT;
use gpufleet_core::{Event, EventKind, UnixMs};
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::event::EventData;
use nvml_wrapper::{EventSet, Nvml};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use tracing::{debug, info, warn};

/// The event thread: registers every GPU that supports them for Xid and ECC double-bit
/// events, then waits on the set (with a timeout, to notice `stop`) and forwards what
/// arrives to the sampler.
pub(super) fn watch_events(nvml: &Nvml, gpus: u32, tx: &mpsc::Sender<Event>, stop: &AtomicBool) {
    let Some(set) = register_events(nvml, gpus) else {
        return;
    };
    let mut warned = false;
    while !stop.load(Ordering::Relaxed) {
        let timeout_ms = u32::try_from(EVENT_WAIT.as_millis()).unwrap_or(u32::MAX);
        match set.wait(timeout_ms) {
            Ok(data) => {
                let event = event_from(&data, gpufleet_core::config::now_ms());
                debug!(gpu = %event.gpu_uuid, kind = event.kind.as_str(), code = ?event.code, "NVML event");
                if tx.send(event).is_err() {
                    return;
                }
            }
            Err(NvmlError::Timeout) => {}
            Err(e) => {
                if !warned {
                    warned = true;
                    warn!(error = %e, "waiting for NVML events failed; retrying (further failures logged at debug)");
                } else {
                    debug!(error = %e, "waiting for NVML events failed");
                }
                std::thread::sleep(EVENT_WAIT);
            }
        }
    }
}

/// An event set with every GPU that supports Xid / double-bit ECC events registered;
/// `None` when no GPU does. (nvml-wrapper frees the set when a registration fails, so a
/// GPU that refuses is left out and the set is built again without it.)
pub(super) fn register_events(nvml: &Nvml, gpus: u32) -> Option<EventSet<'_>> {
    let wanted = EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR;
    let mut refused: Vec<u32> = Vec::new();
    'build: loop {
        let mut set = match nvml.create_event_set() {
            Ok(s) => s,
            Err(e) => {
                info!(error = %e, "NVML events are not available; Xid and ECC events will not be reported");
                return None;
            }
        };
        let mut registered = 0;
        for index in (0..gpus).filter(|i| !refused.contains(i)) {
            let Ok(device) = nvml.device_by_index(index) else {
                continue;
            };
            let types = match device.supported_event_types() {
                Ok(t) => t & wanted,
                Err(_) => continue,
            };
            if types.is_empty() {
                continue;
            }
            match device.register_events(types, set) {
                Ok(s) => {
                    set = s;
                    registered += 1;
                }
                Err(e) => {
                    warn!(gpu = index, error = %e.error, "cannot register for NVML events; this GPU's Xid and ECC events will not be reported");
                    refused.push(index);
                    continue 'build;
                }
            }
        }
        if registered == 0 {
            info!("no GPU supports Xid / ECC events");
            return None;
        }
        return Some(set);
    }
}

/// The domain event for what an event set delivered.
pub(super) fn event_from(data: &EventData<'_>, now_ms: UnixMs) -> Event {
    let gpu_uuid = data.device.uuid().unwrap_or_default();
    let (kind, code, detail) = if data.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
        let code = match data.event_data {
            Some(XidError::Value(v)) => Some(v),
            _ => None,
        };
        let detail = code.map_or_else(
            || "Xid critical error (unknown code)".to_owned(),
            |c| format!("Xid {c}"),
        );
        (EventKind::Xid, code, detail)
    } else if data.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
        (
            EventKind::EccDoubleBit,
            None,
            "ECC double-bit (uncorrectable) memory error".to_owned(),
        )
    } else {
        (
            EventKind::EccSingleBit,
            None,
            format!("NVML event {:#x}", data.event_type.bits()),
        )
    };
    Event {
        time_ms: now_ms,
        gpu_uuid,
        kind,
        code,
        detail,
    }
}
