//! MIG devices: found once per GPU, and which process runs in which each tick.

use super::NO_INSTANCE_ID;
use super::device::{DeviceState, MigDevice};
use super::lists::{ProcessList, running_processes};
use super::mapping::mig_profile;
use gpufleet_core::MigInstance;
use gpufleet_uplink::cost::CallTimer;
use nvml_wrapper::Device;
use nvml_wrapper::error::NvmlError;
use std::collections::HashMap;
use std::time::Instant;
use tracing::{debug, info, warn};

/// The MIG devices of a GPU with MIG enabled (none otherwise).
pub(super) fn discover_migs<'n>(device: &Device<'n>, index: u32) -> Vec<MigDevice<'n>> {
    if !device.mig_mode().is_ok_and(|m| m.current == 1) {
        return Vec::new();
    }
    let max = match device.mig_device_count() {
        Ok(n) => n,
        Err(e) => {
            warn!(gpu = index, error = %e, "MIG is enabled but its devices cannot be counted");
            return Vec::new();
        }
    };
    let mut migs = Vec::new();
    for k in 0..max {
        let mig = match device.mig_device_by_index(k) {
            Ok(m) => m,
            // An empty slot.
            Err(NvmlError::NotFound) => continue,
            Err(e) => {
                debug!(gpu = index, mig = k, error = %e, "cannot open MIG device");
                continue;
            }
        };
        let Ok(uuid) = mig.uuid() else { continue };
        let ids = mig.running_compute_processes().ok().and_then(|ps| {
            ps.iter()
                .find_map(|p| Some((p.gpu_instance_id?, p.compute_instance_id?)))
        });
        let info = MigInstance {
            uuid,
            gpu_instance_id: ids.map_or(NO_INSTANCE_ID, |i| i.0),
            compute_instance_id: ids.map_or(NO_INSTANCE_ID, |i| i.1),
            profile: mig.name().ok().as_deref().and_then(mig_profile),
            memory_total_bytes: mig.memory_info().ok().map(|m| m.total),
        };
        migs.push(MigDevice { device: mig, info });
    }
    info!(gpu = index, mig_devices = migs.len(), "MIG enabled");
    migs
}

/// pid → MIG device UUID for the processes in a GPU's MIG devices (one compute process
/// list per MIG device and tick). A MIG device whose GPU instance id was not known when it
/// was found (no process ran in it) learns it from the first process listed in it (GPM
/// samples an instance by that id).
pub(super) fn mig_processes(
    dev: &mut DeviceState<'_>,
    timer: &mut CallTimer,
) -> HashMap<u32, String> {
    let mut by_pid = HashMap::new();
    if dev.lost {
        return by_pid;
    }
    for mig in &mut dev.migs {
        let start = Instant::now();
        let listed = running_processes(&mig.device, ProcessList::Compute, &mut 0);
        timer.record(dev.index, "mig.running_compute_processes", start.elapsed());
        match listed {
            Ok(procs) => {
                if mig.info.gpu_instance_id == NO_INSTANCE_ID
                    && let Some(id) = procs.iter().find_map(|p| p.gpu_instance_id)
                {
                    mig.info.gpu_instance_id = id;
                }
                for p in procs {
                    by_pid.insert(p.pid, mig.info.uuid.clone());
                }
            }
            Err(e) => {
                debug!(gpu = dev.index, mig = %mig.info.uuid, error = %e, "MIG process list failed")
            }
        }
    }
    by_pid
}
