//! The fake machine's state between calls: the scenario, call counts, read counters,
//! event sets. Safe code; `ffi` only converts pointers.
//!
//! The bookkeeping of a per-tick call is array slots indexed by [`Function`] and
//! [`Reading`] (no string compares, no hashing, no allocation once warm; only the NVLink
//! error counters, a health read, keep a map): a real driver has none of it, and the
//! fake's cost is charged to every monitor measured against it.
//!
//! A cost model's cost is the other way round: meant to be charged. A per-device call
//! notes what it owes ([`State::device_call`], [`State::field_asked`]) and [`with_owed`]
//! hands it to the caller, who pays it once the lock is released.

use crate::cost::CallCost;
use crate::cost::Costs;
use crate::function::Function;
use crate::gpm::{Filled, Gpm, Samples, SupportQuery};
use crate::scenario::{EventKind, Gpu, Process, Scenario, Value};
use crate::unsupported::Unsupported;
use nvml_wrapper_sys::bindings::{
    nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST as GPU_IS_LOST,
    nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT as INVALID_ARGUMENT,
    nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED as NOT_SUPPORTED,
    nvmlReturn_enum_NVML_ERROR_UNINITIALIZED as UNINITIALIZED,
};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

impl Scenario {
    /// Checks what `nvmlInit_v2` checks beyond the JSON's shape (the cost model's preset
    /// and keys; each GPU's `gpm`: its metric names, `mig_metrics` keys, `support_query`
    /// and `fail_with`): the reason it would refuse this scenario.
    pub fn validate(&self) -> Result<(), String> {
        Costs::new(self.cost_model.as_deref(), &self.costs)?;
        for (i, g) in self.gpus.iter().enumerate() {
            Gpm::of(i, g)?;
        }
        Ok(())
    }
}

/// The one fake machine of this copy of the library; `None` until `nvmlInit_v2`.
static STATE: Mutex<Option<State>> = Mutex::new(None);

/// MIG device handles are `MIG_HANDLES + gpu * 256 + k` (GPU handles are `index + 1`).
pub const MIG_HANDLES: usize = 0x10_0000;

pub use crate::function::NvmlResult;

/// Signalled when a device call makes an event pending (event waits block on it).
static EVENT_PENDING: Condvar = Condvar::new();

/// Locks the state (a panic elsewhere cannot poison the fake for good).
pub fn lock() -> MutexGuard<'static, Option<State>> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Releases the state until an event may be pending or `timeout` has passed.
pub fn wait_for_event(
    guard: MutexGuard<'static, Option<State>>,
    timeout: Duration,
) -> MutexGuard<'static, Option<State>> {
    match EVENT_PENDING.wait_timeout(guard, timeout) {
        Ok((g, _)) => g,
        Err(e) => e.into_inner().0,
    }
}

/// Runs `f` on the initialised state, or answers `NVML_ERROR_UNINITIALIZED`; with the
/// answer, what the call owes under the cost model (taken before the lock is released:
/// the caller pays it after, so that calls on several threads overlap as on a driver).
pub fn with_owed<R>(f: impl FnOnce(&mut State) -> NvmlResult<R>) -> (NvmlResult<R>, CallCost) {
    match lock().as_mut() {
        Some(s) => {
            let r = f(s);
            (r, s.take_owed())
        }
        None => (Err(UNINITIALIZED), CallCost::FREE),
    }
}

/// The wall clock in µs since the Unix epoch (0 before it).
pub fn wall_clock_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// An event set: what was registered on it, per GPU.
#[derive(Debug, Default)]
pub struct EventSet {
    /// (GPU index, event type mask).
    pub registered: Vec<(usize, u64)>,
}

/// A delivered or pending event, as the C struct wants it.
#[derive(Debug, Clone, Copy)]
pub struct Delivery {
    pub gpu: usize,
    pub event_type: u64,
    pub data: u64,
}

/// A per-GPU read counter: the index into one of the GPU's [`Value`]s (or a call number).
#[derive(Debug, Clone, Copy)]
pub enum Reading {
    UtilGpu,
    UtilMem,
    MemUsed,
    Power,
    Energy,
    Pstate,
    ThrottleReasons,
    TempGpu,
    Fan,
    ClockGraphics,
    ClockSm,
    ClockMem,
    PcieTx,
    PcieRx,
    EccCorrected,
    EccUncorrected,
    EccCorrectedAggregate,
    EccUncorrectedAggregate,
    EncoderUtil,
    DecoderUtil,
    /// Field `NVML_FI_DEV_POWER_INSTANT` (its own count, apart from `Power`).
    FieldPowerInstant,
    /// Field `NVML_FI_DEV_POWER_AVERAGE` (reads `power_mw` with its own count).
    FieldPowerAverage,
    FieldTempMem,
    /// `nvmlDeviceGetFieldValues` calls that asked an NVLink throughput field.
    FieldNvlink,
    RemappedCorrectable,
    RemappedUncorrectable,
    RemappedPending,
    RemappedFailed,
    RetiredSbe,
    RetiredDbe,
    RetiredPending,
    PcieReplay,
    /// Calls of `nvmlDeviceGetComputeRunningProcesses_v3`.
    ComputeProcesses,
    /// Calls of `nvmlDeviceGetGraphicsRunningProcesses_v3`. Keep last: it sizes
    /// [`Reading::COUNT`].
    GraphicsProcesses,
}

impl Reading {
    /// How many read counters a GPU has.
    const COUNT: usize = Reading::GraphicsProcesses as usize + 1;
}

/// Field-value entries asked of one GPU: (field id, scope id, count), in first-asked order.
/// A monitor asks the same list every call, so the entry after the previously found one
/// is tried first and usually is the one; otherwise the (short) list is scanned.
#[derive(Debug, Default)]
struct FieldCounts {
    entries: Vec<(u32, u32, u64)>,
    /// Where the next entry is expected.
    next: usize,
}

impl FieldCounts {
    fn count(&mut self, field: u32, scope: u32) {
        let is = |e: &(u32, u32, u64)| e.0 == field && e.1 == scope;
        let k = match self.entries.get(self.next) {
            Some(e) if is(e) => self.next,
            _ => self.entries.iter().position(is).unwrap_or_else(|| {
                self.entries.push((field, scope, 0));
                self.entries.len() - 1
            }),
        };
        self.entries[k].2 += 1;
        self.next = k + 1;
    }
}

/// One GPU's bookkeeping, kept together so that a call touches few cache lines.
#[derive(Debug)]
struct GpuState {
    /// Calls of all functions: the clock of lost windows and events.
    calls: u64,
    /// Calls per function, by [`Function`].
    counts: [u64; Function::COUNT],
    /// Reads, by [`Reading`]: the index into each [`Value`].
    reads: [u64; Reading::COUNT],
    /// Its `unsupported` list, resolved at load.
    unsupported: Unsupported,
    /// Field-value entries asked.
    fields: FieldCounts,
    /// Reads per (NVLink error counter, link).
    link_reads: HashMap<(u32, u32), u64>,
    /// Which of its events were delivered.
    delivered: Vec<bool>,
    /// What its calls were charged under the cost model, in all.
    charged: CallCost,
    /// Its GPM, resolved at load, with its sampling streams; `None`: no GPM.
    gpm: Option<Gpm>,
}

impl GpuState {
    /// GPU `index`'s bookkeeping; an error (for stderr) when its `gpm` does not resolve.
    fn new(index: usize, g: &Gpu) -> Result<Self, String> {
        Ok(Self {
            calls: 0,
            counts: [0; Function::COUNT],
            reads: [0; Reading::COUNT],
            unsupported: Unsupported::new(&g.unsupported),
            fields: FieldCounts::default(),
            link_reads: HashMap::new(),
            delivered: vec![false; g.events.len()],
            charged: CallCost::FREE,
            gpm: Gpm::of(index, g)?,
        })
    }
}

#[derive(Debug)]
pub struct State {
    pub scenario: Scenario,
    /// `nvmlInit_v2` calls not yet matched by `nvmlShutdown`.
    pub inits: u32,
    /// Calls per system-level function, by [`Function`].
    system_counts: [u64; Function::COUNT],
    /// Per GPU (index as in the scenario): counts, reads, what it does not support.
    gpus: Vec<GpuState>,
    /// Event sets by handle - 1; `None` once freed.
    pub sets: Vec<Option<EventSet>>,
    /// The newest timestamp handed out (µs), to keep them strictly increasing.
    last_ts: u64,
    /// PCIe throughput calls waiting now (see `Gpu::pcie_sample_ms`), and the most that
    /// ever waited at once (in the counts file as `pcie_in_flight_max`).
    pub pcie_in_flight: u64,
    pub pcie_in_flight_max: u64,
    /// The cost model, resolved at load; `None`: calls owe nothing.
    costs: Option<Costs>,
    /// What the call in progress owes (set and taken under the lock, within one call).
    owed: CallCost,
    /// GPM sample handles given out and not freed (in the counts file as
    /// `gpm_samples_live` once any was given out).
    gpm_samples: Samples,
}

impl State {
    /// The state of a freshly loaded scenario; an error (for stderr) when its cost model
    /// or a GPU's `gpm` does not resolve.
    pub fn new(scenario: Scenario) -> Result<Self, String> {
        let costs = Costs::new(scenario.cost_model.as_deref(), &scenario.costs)?;
        let gpus = scenario
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| GpuState::new(i, g))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            gpus,
            scenario,
            inits: 1,
            system_counts: [0; Function::COUNT],
            sets: Vec::new(),
            last_ts: 0,
            pcie_in_flight: 0,
            pcie_in_flight_max: 0,
            costs,
            owed: CallCost::FREE,
            gpm_samples: Samples::default(),
        })
    }

    /// What the call in progress owes, leaving nothing owed.
    pub fn take_owed(&mut self) -> CallCost {
        std::mem::take(&mut self.owed)
    }

    /// Counts a system-level call.
    pub fn system_call(&mut self, f: Function) {
        self.system_counts[f as usize] += 1;
    }

    /// The GPU index of a handle (index + 1), without counting a call.
    pub fn gpu_of(&self, handle: usize) -> NvmlResult<usize> {
        handle
            .checked_sub(1)
            .filter(|i| *i < self.scenario.gpus.len())
            .ok_or(INVALID_ARGUMENT)
    }

    /// The (GPU, MIG device) of a MIG device handle.
    pub fn mig_of(&self, handle: usize) -> NvmlResult<(usize, usize)> {
        let h = handle.checked_sub(MIG_HANDLES).ok_or(INVALID_ARGUMENT)?;
        let (i, k) = (h / 256, h % 256);
        self.scenario
            .gpus
            .get(i)
            .filter(|g| k < g.mig_instances.len())
            .map(|_| (i, k))
            .ok_or(INVALID_ARGUMENT)
    }

    /// Like [`State::device_call`], for a function that also takes MIG device handles:
    /// the call counts (and the lost window applies) on the parent GPU.
    pub fn device_or_mig_call(
        &mut self,
        handle: usize,
        f: Function,
    ) -> NvmlResult<(usize, Option<usize>)> {
        match self.mig_of(handle) {
            Ok((i, k)) => self.device_call(i + 1, f).map(|i| (i, Some(k))),
            Err(_) => self.device_call(handle, f).map(|i| (i, None)),
        }
    }

    /// Counts a call of `f` on the GPU behind `handle`; answers GPU_IS_LOST inside the
    /// GPU's lost window and NOT_SUPPORTED when the scenario says so. Under a cost model
    /// the call owes `f`'s cost from here on, whatever it answers next (NOT_SUPPORTED
    /// included: the driver did the work); a bad handle or a lost GPU owes nothing.
    pub fn device_call(&mut self, handle: usize, f: Function) -> NvmlResult<usize> {
        let i = self.gpu_of(handle)?;
        let state = &mut self.gpus[i];
        state.counts[f as usize] += 1;
        let call = state.calls;
        state.calls += 1;
        let gpu = &self.scenario.gpus[i];
        if gpu.events.iter().any(|e| e.after_calls == call + 1) {
            EVENT_PENDING.notify_all();
        }
        if gpu.is_lost_at(call) {
            return Err(GPU_IS_LOST);
        }
        if let Some(costs) = &self.costs {
            // Set, not added: one device call per lock hold, so nothing stale is kept.
            let cost = costs.function(f);
            self.owed = cost;
            state.charged = state.charged.plus(cost);
        }
        if state.unsupported.function(f) {
            return Err(NOT_SUPPORTED);
        }
        Ok(i)
    }

    pub fn gpu(&self, i: usize) -> &Gpu {
        &self.scenario.gpus[i]
    }

    /// What GPU `i` does not support, beyond whole functions (which `device_call` answers).
    pub fn unsupported(&self, i: usize) -> &Unsupported {
        &self.gpus[i].unsupported
    }

    /// The next read of the value `key` of GPU `i`.
    pub fn read(&mut self, i: usize, key: Reading, pick: fn(&Gpu) -> &Value) -> u64 {
        let n = self.nth(i, key);
        pick(&self.scenario.gpus[i]).at(n)
    }

    /// The value `key` of GPU `i` as its latest read answered (its first if never read),
    /// without counting a read: a fill answering what its count query said.
    pub fn last_read(&self, i: usize, key: Reading, pick: fn(&Gpu) -> &Value) -> u64 {
        let n = self.gpus[i].reads[key as usize];
        pick(&self.scenario.gpus[i]).at(n.saturating_sub(1))
    }

    /// The next read of NVLink error counter `counter` of link `link` on GPU `i`: `None`
    /// for a link that is not active.
    pub fn read_link(
        &mut self,
        i: usize,
        counter: u32,
        link: u32,
        pick: fn(&Gpu) -> &[Value],
    ) -> Option<u64> {
        let g = &self.scenario.gpus[i];
        if link >= g.nvlinks {
            return None;
        }
        let n = self.gpus[i].link_reads.entry((counter, link)).or_insert(0);
        let v = pick(g).get(link as usize).map_or(0, |v| v.at(*n));
        *n += 1;
        Some(v)
    }

    /// The call number of `key` on GPU `i` (0-based), counting this one.
    pub fn nth(&mut self, i: usize, key: Reading) -> u64 {
        let n = &mut self.gpus[i].reads[key as usize];
        let v = *n;
        *n += 1;
        v
    }

    /// The processes of a list visible on its call number `call` (on MIG device `mig`
    /// only its own), and alive ([`Process::while_exists`]), looked at once.
    pub fn visible(list: &[Process], call: u64, mig: Option<usize>) -> Vec<&Process> {
        list.iter()
            .filter(|p| p.from_call <= call && (mig.is_none() || p.mig == mig) && alive(p))
            .collect()
    }

    /// A wall-clock timestamp in µs, strictly after the previous one.
    pub fn timestamp(&mut self) -> u64 {
        self.last_ts = wall_clock_us().max(self.last_ts + 1);
        self.last_ts
    }

    /// The timestamp after the previous one, without reading the clock: for the entries
    /// after a call's first. The same as [`State::timestamp`] while the entries take less
    /// than a µs each (the clock has not passed the previous stamp + 1), and a clock read
    /// per entry was most of the cost of a field-value call.
    pub fn next_timestamp(&mut self) -> u64 {
        self.last_ts += 1;
        self.last_ts
    }

    /// Takes the first pending event registered on set `set`.
    pub fn take_event(&mut self, set: usize) -> Option<Delivery> {
        let registered = self.sets.get(set)?.as_ref()?.registered.clone();
        for (gpu, mask) in registered {
            let Some(g) = self.scenario.gpus.get(gpu) else {
                continue;
            };
            for (k, ev) in g.events.iter().enumerate() {
                let event_type = event_type(ev.kind);
                if self.gpus[gpu].delivered[k]
                    || mask & event_type == 0
                    || self.gpus[gpu].calls < ev.after_calls
                {
                    continue;
                }
                self.gpus[gpu].delivered[k] = true;
                return Some(Delivery {
                    gpu,
                    event_type,
                    data: if ev.kind == EventKind::Xid {
                        ev.code
                    } else {
                        0
                    },
                });
            }
        }
        None
    }

    /// What `nvmlGpmQueryDeviceSupport` answers for GPU `i`; `None`: it has no GPM.
    pub fn gpm_support(&self, i: usize) -> Option<SupportQuery> {
        self.gpus[i].gpm.as_ref().map(|g| g.support)
    }

    /// A new GPM sample handle (never 0).
    pub fn gpm_alloc(&mut self) -> usize {
        self.gpm_samples.alloc()
    }

    /// Takes GPM sample handle `id` back; INVALID_ARGUMENT for one not live.
    pub fn gpm_free(&mut self, id: usize) -> NvmlResult<()> {
        self.gpm_samples.free(id)
    }

    /// A GPM sample of GPU `i` (after its call's `device_call`) into handle `sample`: of
    /// the whole GPU (`instance` `None`) or of GPU instance `instance`. NOT_SUPPORTED
    /// without GPM (or for a GPU instance with MIG off), INVALID_ARGUMENT for a handle not
    /// live, NOT_FOUND for a GPU instance it does not have, the injected failure inside
    /// the failure window.
    pub fn gpm_sample(&mut self, i: usize, instance: Option<u32>, sample: usize) -> NvmlResult<()> {
        let mig_off = self.scenario.gpus[i].mig_mode == 0;
        let Some(gpm) = self.gpus[i].gpm.as_mut() else {
            return Err(NOT_SUPPORTED);
        };
        if !self.gpm_samples.is_live(sample) {
            return Err(INVALID_ARGUMENT);
        }
        if instance.is_some() && mig_off {
            return Err(NOT_SUPPORTED);
        }
        let number = gpm.take_sample(instance)?;
        self.gpm_samples.fill(
            sample,
            Filled {
                gpu: i,
                instance,
                number,
            },
        )
    }

    /// The later sample of a metrics request over handles `first` and `second` (see
    /// [`Samples::window`]).
    pub fn gpm_window(&self, first: usize, second: usize) -> NvmlResult<Filled> {
        self.gpm_samples.window(first, second)
    }

    /// Metric `metric` over a window ending at sample `at`, in NVML's unit; `None`:
    /// NOT_SUPPORTED.
    pub fn gpm_value(&self, at: &Filled, metric: u32) -> Option<f64> {
        self.gpus
            .get(at.gpu)?
            .gpm
            .as_ref()?
            .value(at.instance, metric, at.number)
    }

    /// Counts one field-value entry asked of GPU `i` (after its call's `device_call`);
    /// under a cost model the call owes the entry's cost too.
    pub fn field_asked(&mut self, i: usize, field: u32, scope: u32) {
        let state = &mut self.gpus[i];
        state.fields.count(field, scope);
        if let Some(costs) = &self.costs {
            let cost = costs.field(field);
            self.owed = self.owed.plus(cost);
            state.charged = state.charged.plus(cost);
        }
    }

    /// The call counts as JSON: `{"gpu0.nvmlDeviceGetPowerUsage": 3, "nvmlInit_v2": 1}`,
    /// the field-value entries asked: `{"gpu0.field:138:4294967295": 3}`, and what the cost
    /// model charged each GPU (when not 0): `{"gpu0.charged_cpu_us": 3690,
    /// "gpu0.charged_wait_us": 20000}`, and the GPM sample handles not freed once any was
    /// given out: `{"gpm_samples_live": 0}`.
    pub fn counts_json(&self) -> String {
        // A function never called has no entry (a count is never 0 once it exists).
        let called = |counts: &[u64; Function::COUNT]| {
            Function::ALL
                .iter()
                .zip(*counts)
                .filter(|(_, n)| *n > 0)
                .map(|(f, n)| (f.name(), n))
                .collect::<Vec<_>>()
        };
        let system = called(&self.system_counts)
            .into_iter()
            .map(|(name, n)| (name.to_owned(), n));
        let gpus = self.gpus.iter().enumerate().flat_map(|(i, g)| {
            called(&g.counts)
                .into_iter()
                .map(move |(name, n)| (format!("gpu{i}.{name}"), n))
        });
        let fields = self.gpus.iter().enumerate().flat_map(|(i, g)| {
            g.fields
                .entries
                .iter()
                .map(move |(field, scope, n)| (format!("gpu{i}.field:{field}:{scope}"), *n))
        });
        let charged = self.gpus.iter().enumerate().flat_map(|(i, g)| {
            [
                ("charged_cpu_us", g.charged.cpu_us),
                ("charged_wait_us", g.charged.wait_us),
            ]
            .into_iter()
            .filter(|(_, us)| *us > 0)
            .map(move |(name, us)| (format!("gpu{i}.{name}"), us))
        });
        let overlap = (self.pcie_in_flight_max > 0)
            .then(|| ("pcie_in_flight_max".to_owned(), self.pcie_in_flight_max));
        let gpm = self.gpm_samples.any_allocated().then(|| {
            (
                "gpm_samples_live".to_owned(),
                self.gpm_samples.live() as u64,
            )
        });
        let map: BTreeMap<String, u64> = system
            .chain(gpus)
            .chain(fields)
            .chain(charged)
            .chain(overlap)
            .chain(gpm)
            .collect();
        serde_json::to_string_pretty(&map).unwrap_or_else(|_| "{}".into())
    }
}

/// NVML's event type bit for an event kind.
pub fn event_type(kind: EventKind) -> u64 {
    use nvml_wrapper_sys::bindings as b;
    match kind {
        EventKind::Xid => u64::from(b::nvmlEventTypeXidCriticalError),
        EventKind::EccDoubleBit => u64::from(b::nvmlEventTypeDoubleBitEccError),
        EventKind::EccSingleBit => u64::from(b::nvmlEventTypeSingleBitEccError),
    }
}

/// Whether a process is alive: always, unless its [`Process::while_exists`] path is gone.
pub fn alive(p: &Process) -> bool {
    p.while_exists.as_ref().is_none_or(|f| f.exists())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_tied_to_a_path_is_listed_only_while_the_path_exists() {
        let dir = tempfile::tempdir().expect("dir");
        let life = dir.path().join("alive");
        let list = vec![
            Process {
                pid: 1,
                ..Process::default()
            },
            Process {
                pid: 2,
                while_exists: Some(life.clone()),
                ..Process::default()
            },
        ];
        let pids = |list: &[Process]| -> Vec<u32> {
            State::visible(list, 0, None)
                .iter()
                .map(|p| p.pid)
                .collect()
        };
        assert_eq!(pids(&list), [1]);
        std::fs::write(&life, "").expect("born");
        assert_eq!(pids(&list), [1, 2]);
        std::fs::remove_file(&life).expect("ended");
        assert_eq!(pids(&list), [1]);
    }

    #[test]
    fn counts_name_system_calls_gpu_calls_and_field_entries() {
        let fanless = Gpu {
            unsupported: vec!["nvmlDeviceGetFanSpeed_v2".into()],
            ..Gpu::default()
        };
        let mut s = State::new(Scenario {
            gpus: vec![Gpu::default(), fanless],
            ..Scenario::default()
        })
        .expect("no cost model");
        s.system_call(Function::nvmlInit_v2);
        assert_eq!(s.device_call(1, Function::nvmlDeviceGetPowerUsage), Ok(0));
        assert_eq!(s.device_call(1, Function::nvmlDeviceGetPowerUsage), Ok(0));
        assert_eq!(
            s.device_call(2, Function::nvmlDeviceGetFanSpeed_v2),
            Err(NOT_SUPPORTED)
        );
        assert_eq!(
            s.device_call(3, Function::nvmlDeviceGetPowerUsage),
            Err(INVALID_ARGUMENT)
        );
        // Asked in one order, then in another: each (field, scope) keeps its own count.
        for (field, scope) in [(138, u32::MAX), (82, 0), (82, 0), (138, u32::MAX), (138, 0)] {
            s.field_asked(0, field, scope);
        }
        let expected = r#"{
  "gpu0.field:138:0": 1,
  "gpu0.field:138:4294967295": 2,
  "gpu0.field:82:0": 2,
  "gpu0.nvmlDeviceGetPowerUsage": 2,
  "gpu1.nvmlDeviceGetFanSpeed_v2": 1,
  "nvmlInit_v2": 1
}"#;
        assert_eq!(s.counts_json(), expected);
    }

    #[test]
    fn reads_count_per_gpu_and_value() {
        let ramp = Gpu {
            power_mw: Value::Ramp { start: 10, step: 1 },
            ..Gpu::default()
        };
        let mut s = State::new(Scenario {
            gpus: vec![ramp.clone(), ramp],
            ..Scenario::default()
        })
        .expect("no cost model");
        let power: fn(&Gpu) -> &Value = |g| &g.power_mw;
        assert_eq!(s.last_read(0, Reading::Power, power), 10);
        assert_eq!(s.read(0, Reading::Power, power), 10);
        assert_eq!(s.read(0, Reading::Power, power), 11);
        assert_eq!(s.last_read(0, Reading::Power, power), 11);
        assert_eq!(s.read(0, Reading::FieldPowerAverage, power), 10);
        assert_eq!(s.read(1, Reading::Power, power), 10);
    }

    #[test]
    fn without_a_cost_model_calls_owe_nothing() {
        let mut s = State::new(Scenario {
            gpus: vec![Gpu::default()],
            ..Scenario::default()
        })
        .expect("no cost model");
        assert_eq!(
            s.device_call(1, Function::nvmlDeviceGetTotalEnergyConsumption),
            Ok(0)
        );
        s.field_asked(0, 83, 0);
        assert_eq!(s.take_owed(), CallCost::FREE);
        assert!(!s.counts_json().contains("charged"));
    }

    #[test]
    fn calls_owe_their_cost_and_the_counts_show_what_was_charged() {
        let gpu = |lost_after_calls| Gpu {
            unsupported: vec!["nvmlDeviceGetFanSpeed_v2".into()],
            lost_after_calls,
            ..Gpu::default()
        };
        let mut s = State::new(Scenario {
            gpus: vec![gpu(None), gpu(Some(0))],
            cost_model: Some("h200".into()),
            costs: [(
                "nvmlDeviceGetPowerUsage".to_owned(),
                CallCost {
                    cpu_us: 90,
                    wait_us: 5,
                },
            )]
            .into_iter()
            .collect(),
            ..Scenario::default()
        })
        .expect("h200 resolves");
        assert_eq!(s.device_call(1, Function::nvmlDeviceGetPowerUsage), Ok(0));
        assert_eq!(
            s.take_owed(),
            CallCost {
                cpu_us: 90,
                wait_us: 5
            }
        );
        // Taken once.
        assert_eq!(s.take_owed(), CallCost::FREE);
        // NOT_SUPPORTED pays (the driver did the work) ...
        assert_eq!(
            s.device_call(1, Function::nvmlDeviceGetFanSpeed_v2),
            Err(NOT_SUPPORTED)
        );
        assert_eq!(s.take_owed(), CallCost::cpu(20));
        // ... a bad handle and a lost GPU do not.
        assert_eq!(
            s.device_call(9, Function::nvmlDeviceGetPowerUsage),
            Err(INVALID_ARGUMENT)
        );
        assert_eq!(s.take_owed(), CallCost::FREE);
        assert_eq!(
            s.device_call(2, Function::nvmlDeviceGetPowerUsage),
            Err(GPU_IS_LOST)
        );
        assert_eq!(s.take_owed(), CallCost::FREE);
        // A field-value call owes its own cost and each entry's.
        assert_eq!(s.device_call(1, Function::nvmlDeviceGetFieldValues), Ok(0));
        for (field, scope) in [(83, 0), (197, 0), (198, 0), (186, 0)] {
            s.field_asked(0, field, scope);
        }
        assert_eq!(s.take_owed(), CallCost::cpu(20 + 3_600 + 170 + 170 + 20));
        let counts: BTreeMap<String, u64> =
            serde_json::from_str(&s.counts_json()).expect("counts JSON");
        let total_cpu = 90 + 20 + (20 + 3_600 + 170 + 170 + 20);
        assert_eq!(counts.get("gpu0.charged_cpu_us"), Some(&total_cpu));
        assert_eq!(counts.get("gpu0.charged_wait_us"), Some(&5));
        assert!(!counts.keys().any(|k| k.starts_with("gpu1.charged")));
    }

    #[test]
    fn gpm_samples_fill_handles_and_metrics_read_the_later_sample() {
        use crate::scenario::{GpmSpec, MigSpec};
        use nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_ERROR_NOT_FOUND as NOT_FOUND;
        let hopper = Gpu {
            mig_mode: 1,
            mig_instances: vec![MigSpec {
                gpu_instance_id: 3,
                ..MigSpec::default()
            }],
            gpm: Some(GpmSpec {
                metrics: [(
                    "sm_util".to_owned(),
                    Value::Seq(vec![10_000, 20_000, 30_000]),
                )]
                .into_iter()
                .collect(),
                ..GpmSpec::default()
            }),
            lost_after_calls: Some(4),
            ..Gpu::default()
        };
        let mut s = State::new(Scenario {
            gpus: vec![hopper, Gpu::default()],
            ..Scenario::default()
        })
        .expect("loads");
        assert_eq!(s.gpm_support(0), Some(SupportQuery::Answer));
        assert_eq!(s.gpm_support(1), None);
        let (a, b, c) = (s.gpm_alloc(), s.gpm_alloc(), s.gpm_alloc());
        let sample =
            |s: &mut State, handle: usize, instance: Option<u32>, h: usize| -> NvmlResult<()> {
                let i = s.device_call(handle, Function::nvmlGpmSampleGet)?;
                s.gpm_sample(i, instance, h)
            };
        assert_eq!(sample(&mut s, 1, None, a), Ok(()));
        assert_eq!(sample(&mut s, 1, Some(3), c), Ok(()));
        assert_eq!(sample(&mut s, 1, Some(4), c), Err(NOT_FOUND));
        assert_eq!(sample(&mut s, 1, None, 99), Err(INVALID_ARGUMENT));
        // Call 4 of GPU 0: lost from here on.
        assert_eq!(sample(&mut s, 1, None, b), Err(GPU_IS_LOST));
        assert_eq!(sample(&mut s, 2, None, b), Err(NOT_SUPPORTED));
        assert_eq!(s.gpm_window(a, b), Err(INVALID_ARGUMENT));
        // Not the same stream.
        assert_eq!(s.gpm_window(a, c), Err(INVALID_ARGUMENT));
        // A fresh GPU without the lost window: two samples, the second's number read.
        let mut t = State::new(Scenario {
            gpus: vec![Gpu {
                lost_after_calls: None,
                ..s.scenario.gpus[0].clone()
            }],
            ..Scenario::default()
        })
        .expect("loads");
        let (x, y) = (t.gpm_alloc(), t.gpm_alloc());
        for h in [x, y, y] {
            assert_eq!(sample(&mut t, 1, None, h), Ok(()));
        }
        let at = t.gpm_window(x, y).expect("a window");
        assert_eq!(at.number, 2);
        assert_eq!(t.gpm_value(&at, 2), Some(30.0));
        assert_eq!(t.gpm_value(&at, 3), None);
        assert_eq!(t.gpm_free(x), Ok(()));
        assert_eq!(t.gpm_free(x), Err(INVALID_ARGUMENT));
        let counts: BTreeMap<String, u64> =
            serde_json::from_str(&t.counts_json()).expect("counts JSON");
        assert_eq!(counts.get("gpm_samples_live"), Some(&1));
        assert_eq!(counts.get("gpu0.nvmlGpmSampleGet"), Some(&3));
        assert_eq!(t.gpm_free(y), Ok(()));
        assert!(t.counts_json().contains("\"gpm_samples_live\": 0"));
        // MIG off: a GPU instance's sample is not supported.
        let mut u = State::new(Scenario {
            gpus: vec![Gpu {
                mig_mode: 0,
                ..t.scenario.gpus[0].clone()
            }],
            ..Scenario::default()
        })
        .expect("loads");
        let h = u.gpm_alloc();
        assert_eq!(sample(&mut u, 1, Some(3), h), Err(NOT_SUPPORTED));
        assert_eq!(sample(&mut u, 1, None, h), Ok(()));
    }

    #[test]
    fn a_bad_gpm_does_not_load() {
        let e = State::new(Scenario {
            gpus: vec![Gpu {
                gpm: Some(crate::scenario::GpmSpec {
                    fail_with: "busy".into(),
                    ..crate::scenario::GpmSpec::default()
                }),
                ..Gpu::default()
            }],
            ..Scenario::default()
        })
        .expect_err("unknown fail_with");
        assert!(e.contains("busy"), "{e}");
    }

    #[test]
    fn an_unknown_cost_model_does_not_load() {
        let e = State::new(Scenario {
            cost_model: Some("b200".into()),
            ..Scenario::default()
        })
        .expect_err("unknown preset");
        assert!(e.contains("b200"), "{e}");
    }
}
