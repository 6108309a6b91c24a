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
use crate::scenario::{EventKind, Gpu, Process, Scenario, Value};
use crate::unsupported::Unsupported;
use nvml_wrapper_sys::bindings::{
    nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST as GPU_IS_LOST,
    nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT as INVALID_ARGUMENT,
    nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED as NOT_SUPPORTED,
    nvmlReturn_enum_NVML_ERROR_UNINITIALIZED as UNINITIALIZED, nvmlReturn_t,
};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The one fake machine of this copy of the library; `None` until `nvmlInit_v2`.
static STATE: Mutex<Option<State>> = Mutex::new(None);

/// MIG device handles are `MIG_HANDLES + gpu * 256 + k` (GPU handles are `index + 1`).
pub const MIG_HANDLES: usize = 0x10_0000;

/// An NVML result: the error is the return code.
pub type NvmlResult<T> = Result<T, nvmlReturn_t>;

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
}

impl GpuState {
    fn new(g: &Gpu) -> Self {
        Self {
            calls: 0,
            counts: [0; Function::COUNT],
            reads: [0; Reading::COUNT],
            unsupported: Unsupported::new(&g.unsupported),
            fields: FieldCounts::default(),
            link_reads: HashMap::new(),
            delivered: vec![false; g.events.len()],
            charged: CallCost::FREE,
        }
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
}

impl State {
    /// The state of a freshly loaded scenario; an error (for stderr) when its cost model
    /// does not resolve.
    pub fn new(scenario: Scenario) -> Result<Self, String> {
        let costs = Costs::new(scenario.cost_model.as_deref(), &scenario.costs)?;
        Ok(Self {
            gpus: scenario.gpus.iter().map(GpuState::new).collect(),
            scenario,
            inits: 1,
            system_counts: [0; Function::COUNT],
            sets: Vec::new(),
            last_ts: 0,
            pcie_in_flight: 0,
            pcie_in_flight_max: 0,
            costs,
            owed: CallCost::FREE,
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
    /// "gpu0.charged_wait_us": 20000}`.
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
        let map: BTreeMap<String, u64> = system
            .chain(gpus)
            .chain(fields)
            .chain(charged)
            .chain(overlap)
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
    fn an_unknown_cost_model_does_not_load() {
        let e = State::new(Scenario {
            cost_model: Some("b200".into()),
            ..Scenario::default()
        })
        .expect_err("unknown preset");
        assert!(e.contains("b200"), "{e}");
    }
}
