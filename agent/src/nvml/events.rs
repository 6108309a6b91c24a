//! NVML events: Xid critical errors and ECC double-bit errors, registered once and
//! polled by the sampling thread at the end of every tick (`nvmlEventSetWait` with a
//! zero timeout), so they are reported in that tick. No thread waits on the set: a
//! waiting thread woke every second to notice shutdown, and each wake-up cost more than a
//! poll per tick; an event is seen at most one interval after it happened, as when a
//! thread forwarded it to the next tick.

use gpufleet_core::{Event, EventKind, UnixMs};
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::event::EventData;
use nvml_wrapper::{Device, EventSet, Nvml};
use tracing::{debug, info, warn};

/// Most events taken from the set in one tick (the rest wait for the next tick).
const MAX_EVENTS_PER_TICK: usize = 64;

/// The registered event set and its polling state.
pub(super) struct Events<'n> {
    set: EventSet<'n>,
    /// Whether a failed poll was logged at warn (further ones go to debug).
    warned: bool,
}

impl<'n> Events<'n> {
    /// Registers every GPU that supports them; `None` when none does.
    pub(super) fn register(nvml: &'n Nvml, gpus: u32) -> Option<Self> {
        register_events(nvml, gpus).map(|set| Self { set, warned: false })
    }

    /// The events pending now, in the order NVML gives them, timed at consecutive
    /// milliseconds ending at `now_ms` (NVML gives an event no time; the collector keeps
    /// one event per node, time, GPU, kind and code, so two Xid 13s of one GPU in one tick
    /// must not share a time). `uuid_of` names the GPU of an event's device handle without
    /// asking it (the GPU may be lost by now).
    pub(super) fn poll(
        &mut self,
        now_ms: UnixMs,
        uuid_of: impl Fn(&Device<'n>) -> Option<String>,
    ) -> Vec<Event> {
        let mut events = Vec::new();
        while events.len() < MAX_EVENTS_PER_TICK {
            match self.set.wait(0) {
                Ok(data) => {
                    let event = event_from(&data, uuid_of(&data.device), now_ms);
                    debug!(gpu = %event.gpu_uuid, kind = event.kind.as_str(), code = ?event.code, "NVML event");
                    events.push(event);
                }
                Err(NvmlError::Timeout) => break,
                Err(e) => {
                    if self.warned {
                        debug!(error = %e, "polling NVML events failed");
                    } else {
                        self.warned = true;
                        warn!(error = %e, "polling NVML events failed; trying again next tick (further failures logged at debug)");
                    }
                    break;
                }
            }
        }
        let last = events.len() as i64 - 1;
        for (i, e) in events.iter_mut().enumerate() {
            e.time_ms = now_ms - (last - i as i64);
        }
        events
    }
}

/// An event set with every GPU that supports Xid / double-bit ECC events registered;
/// `None` when no GPU does. (nvml-wrapper frees the set when a registration fails, so a
/// GPU that refuses is left out and the set is built again without it.)
fn register_events(nvml: &Nvml, gpus: u32) -> Option<EventSet<'_>> {
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

/// The domain event for what an event set delivered; `uuid` is its GPU's when known,
/// else the device is asked (and the event is node-level if it cannot answer).
pub(super) fn event_from(data: &EventData<'_>, uuid: Option<String>, now_ms: UnixMs) -> Event {
    let gpu_uuid = uuid.unwrap_or_else(|| data.device.uuid().unwrap_or_default());
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

/// Whether two devices are the same NVML handle.
#[allow(unsafe_code)]
pub(super) fn same_handle(a: &Device<'_>, b: &Device<'_>) -> bool {
    // SAFETY: `handle` only returns the raw handle (nvml-wrapper marks it unsafe so that no
    // second owner of it is built); here it is compared, never used.
    unsafe { a.handle() == b.handle() }
}
