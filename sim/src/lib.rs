//! gpufleet's simulator: a seeded, deterministic [`GpuSource`] that behaves like a busy GPU
//! node. The agent runs it with `--simulate`; the collector's demo runs one per simulated
//! node; tests replay it to check figures.
//!
//! It models workloads, not noise (`workload.rs`): multi-GPU training jobs, inference pods
//! sharing a GPU, notebooks holding memory on an idle GPU, empty GPUs; they start and end.
//! Each GPU (`gpu.rs`) turns its load into power (between idle and the limit), an energy
//! counter that is exactly the integral of that power, lagging temperatures, clocks,
//! performance state, link traffic and the odd Xid or thermal throttle. On products with
//! GPU Performance Monitoring (Hopper and newer), `gpm.rs` says what each workload's
//! kernels do with the SMs, tensor cores and memory, consistent with that utilization.
//!
//! **Deterministic**: the same [`SimOptions`] and the same sequence of `sample(now_ms)`
//! calls give exactly the same ticks. Nothing reads the clock or iterates a hash map; all
//! randomness comes from ChaCha seeded by the seed and the node name. (`Tick::cost` is
//! left `None`: the sampler fills it with measured, hence varying, times.)

pub mod catalog;
mod gpm;
mod gpu;
mod rng;
pub mod scenario;
mod workload;

use catalog::GpuModel;
use gpu::{GpuLoad, GpuState};
use gpufleet_core::{
    Event, EventKind, GpuInfo, HostInfo, HostSample, Inventory, ProcessSample, ProcessType, Tick,
    UnixMs,
};
use gpufleet_core::{GpuSource, SourceError};
use rand::{Rng, SeedableRng};
use rng::{SimRng, chance, normal};
use scenario::{JobKind, ScenarioError};
use thiserror::Error;
use workload::{Identities, Job, hex};

pub use gpu::reasons;
pub use scenario::{IdentityKind, Mix, Scenario, ScriptedJob};

/// The most GPUs a simulated node may have (the collector's default limit per node).
pub const MAX_GPUS: u32 = 64;

/// Driver facts every simulated node reports.
const DRIVER_VERSION: &str = "550.54.15";
const CUDA_VERSION: &str = "12.4";
const NVML_VERSION: &str = "12.550.54.15";

/// What to simulate.
#[derive(Debug, Clone, Default)]
pub struct SimOptions {
    /// The node's name; also seeds the simulation, so nodes differ.
    pub node: String,
    /// Number of GPUs (1..=64).
    pub gpus: u32,
    /// Seed; `None` derives it from the node name ([`node_seed`]).
    pub seed: Option<u64>,
    /// Workload settings.
    pub scenario: Scenario,
}

impl SimOptions {
    /// A node named `node` with `gpus` GPUs, default seed and scenario.
    pub fn new(node: impl Into<String>, gpus: u32) -> Self {
        Self {
            node: node.into(),
            gpus,
            seed: None,
            scenario: Scenario::default(),
        }
    }
}

/// Why a simulator could not be built.
#[derive(Debug, Error)]
pub enum SimError {
    /// The GPU count is out of range.
    #[error("a simulated node has 1 to {MAX_GPUS} GPUs, not {0}")]
    Gpus(u32),
    /// The scenario is unreadable or inconsistent.
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
}

/// The default seed of a node: FNV-1a of its name (stable across Rust versions, unlike
/// `DefaultHasher`).
pub fn node_seed(node: &str) -> u64 {
    fnv1a(node.as_bytes(), 0xcbf2_9ce4_8422_2325)
}

fn fnv1a(bytes: &[u8], mut h: u64) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Builds a simulator (the library entry point the collector's demo uses).
pub fn simulator(opts: SimOptions) -> Result<Simulator, SimError> {
    Simulator::new(opts)
}

/// A simulated GPU node. See the module documentation.
#[derive(Debug)]
pub struct Simulator {
    /// Seed actually used (given or derived from the node name).
    seed: u64,
    /// Workload settings.
    scenario: Scenario,
    /// Static facts, built once from the seed.
    inventory: Inventory,
    /// The simulated node's boot id (a seeded UUID).
    boot_id: String,
    /// Per-GPU physical state, in index order.
    gpus: Vec<GpuState>,
    /// All dynamic randomness, drawn in a fixed order every tick.
    rng: SimRng,
    /// GPM's randomness (job profiles, per-tick spread): a stream of its own, so GPM
    /// changed no other value of a seeded run.
    gpm_rng: SimRng,
    /// Pid / Slurm job / session counters.
    ids: Identities,
    /// Running jobs, in start order.
    jobs: Vec<Job>,
    /// Whether each scripted job has started.
    script_started: Vec<bool>,
    /// When each GPU next gets a random workload decision (`i64::MAX`: when its exclusive
    /// job ends).
    next_decision_ms: Vec<i64>,
    /// Time of the first sample: scripted jobs are relative to it.
    t0_ms: Option<UnixMs>,
    /// Time of the previous sample.
    last_ms: Option<UnixMs>,
    /// Host load average state.
    load1: Option<f64>,
    /// When health counters were last sent (`None`: not yet; the first tick sends them).
    last_health_ms: Option<UnixMs>,
    /// How often they are sent ([`HEALTH_INTERVAL_MS`] unless set).
    health_every_ms: i64,
    /// The previous tick had an Xid / ECC / GPU-lost event: this one sends health.
    health_due: bool,
}

/// How often the simulator sends health counters by default (the agent's default
/// `--health-interval`).
pub const HEALTH_INTERVAL_MS: i64 = 30_000;

impl Simulator {
    /// Builds the node: draws its model, boards and counters from the seed.
    pub fn new(opts: SimOptions) -> Result<Self, SimError> {
        if opts.gpus == 0 || opts.gpus > MAX_GPUS {
            return Err(SimError::Gpus(opts.gpus));
        }
        opts.scenario.validate(opts.gpus)?;
        let seed = opts.seed.unwrap_or_else(|| node_seed(&opts.node));
        // Mix the node name in even when a seed is given, so two nodes never coincide.
        let master = fnv1a(&seed.to_le_bytes(), node_seed(&opts.node));
        let mut fixed = SimRng::seed_from_u64(master ^ 0x5354_4154_4943_0001);
        let model: &'static GpuModel = match &opts.scenario.model {
            Some(key) => catalog::by_key(key).ok_or_else(|| {
                ScenarioError::Invalid(format!("unknown model {key:?}; known: {}", catalog::keys()))
            })?,
            None => catalog::pick(fixed.random()),
        };
        let mut gpus = Vec::with_capacity(opts.gpus as usize);
        let mut infos = Vec::with_capacity(opts.gpus as usize);
        for index in 0..opts.gpus {
            let uuid = format!(
                "GPU-{}-{}-{}-{}-{}",
                hex(&mut fixed, 8),
                hex(&mut fixed, 4),
                hex(&mut fixed, 4),
                hex(&mut fixed, 4),
                hex(&mut fixed, 12)
            );
            let serial = format!("1654{:09}", fixed.random_range(0..1_000_000_000u32));
            let bus = model
                .bus_ids
                .get(index as usize)
                .copied()
                .unwrap_or(((0x10 + index * 7) % 0xF0) as u8);
            let state = GpuState::new(&mut fixed, model, uuid.clone());
            infos.push(GpuInfo {
                index,
                uuid,
                name: model.name.into(),
                serial: Some(serial),
                pci_bus_id: Some(format!("00000000:{bus:02X}:00.0")),
                architecture: Some(model.architecture.into()),
                brand: Some("NVIDIA".into()),
                memory_total_bytes: Some(model.memory_bytes),
                power_limit_default_mw: Some(model.tdp_w * 1000),
                power_limit_enforced_mw: Some(state.limit_mw),
                power_limit_min_mw: Some(model.min_limit_w * 1000),
                power_limit_max_mw: Some(model.tdp_w * 1000),
                max_clock_sm_mhz: Some(model.max_sm_mhz),
                max_clock_mem_mhz: Some(model.max_mem_mhz),
                max_clock_graphics_mhz: Some(model.max_sm_mhz),
                nvlink_count: Some(model.nvlinks),
                mig_enabled: model.mig_capable.then_some(false),
                compute_mode: Some("Default".into()),
                persistence_mode: Some(true),
                cuda_capability_major: Some(model.compute_capability.0),
                cuda_capability_minor: Some(model.compute_capability.1),
                pcie_link_gen_max: Some(model.pcie_gen),
                pcie_link_width_max: Some(16),
                vbios_version: Some(model.vbios.into()),
                mig_instances: Vec::new(),
                // Shaped like real boards: shutdown a few degrees above slowdown, the
                // maximum operating temperature below it; memory's only on HBM boards.
                temp_slowdown_c: Some(model.slowdown_c as u32),
                temp_shutdown_c: Some(model.slowdown_c as u32 + 5),
                temp_gpu_max_c: Some(model.slowdown_c as u32 - 2),
                temp_mem_max_c: model.has_mem_temp.then_some(95),
            });
            gpus.push(state);
        }
        let boot_id = workload::uuid(&mut fixed);
        let inventory = Inventory {
            driver_version: Some(DRIVER_VERSION.into()),
            cuda_driver_version: Some(CUDA_VERSION.into()),
            nvml_version: Some(NVML_VERSION.into()),
            gpus: infos,
            host: HostInfo {
                hostname: opts.node.clone(),
                kernel: Some("5.15.0-113-generic".into()),
                os: Some("Ubuntu 22.04.4 LTS".into()),
                cpu_count: Some(model.host_cpus),
                memory_total_bytes: Some(model.host_memory_bytes),
            },
        };
        let mut rng = SimRng::seed_from_u64(master);
        let gpm_rng = SimRng::seed_from_u64(master ^ 0x4750_4d00_0000_0001);
        let ids = Identities::new(&mut rng);
        Ok(Self {
            seed,
            script_started: vec![false; opts.scenario.jobs.len()],
            next_decision_ms: vec![i64::MIN; opts.gpus as usize],
            scenario: opts.scenario,
            inventory,
            boot_id,
            gpus,
            rng,
            gpm_rng,
            ids,
            jobs: Vec::new(),
            t0_ms: None,
            last_ms: None,
            load1: None,
            last_health_ms: None,
            health_every_ms: HEALTH_INTERVAL_MS,
            health_due: false,
        })
    }

    /// The seed in use (given, or derived from the node name).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Sends health counters every `every` (of tick time) instead of every 30 s.
    pub fn set_health_interval(&mut self, every: std::time::Duration) {
        self.health_every_ms = i64::try_from(every.as_millis()).unwrap_or(i64::MAX).max(1);
    }

    /// The GPU model of this node.
    pub fn model(&self) -> &'static GpuModel {
        self.gpus[0].model
    }

    fn usable_mem(&self) -> u64 {
        let m = self.model();
        m.memory_bytes - m.reserved_bytes
    }

    /// A pause before a free GPU's next decision: exponential around `mean_gap`.
    fn gap(&mut self) -> i64 {
        let mean = self.scenario.mean_gap.as_millis() as f64;
        let u: f64 = self.rng.random_range(f64::EPSILON..1.0);
        (-mean * u.ln()).min(mean * 20.0) as i64 + 1
    }

    fn draw(&mut self, [lo, hi]: [std::time::Duration; 2]) -> i64 {
        let (lo, hi) = (lo.as_millis() as i64, hi.as_millis() as i64);
        if lo >= hi {
            lo
        } else {
            self.rng.random_range(lo..=hi)
        }
    }

    /// Whether GPU `g` has no job at all.
    fn is_free(&self, g: u32) -> bool {
        !self.jobs.iter().any(|j| j.gpus.contains(&g))
    }

    /// Ends finished jobs, starts scripted ones that are due, and lets free GPUs whose
    /// decision time has come draw a workload. `warm` (the first sample) back-dates random
    /// jobs so the node looks like it has been busy for a while.
    fn schedule(&mut self, now: i64, warm: bool) {
        let mut i = 0;
        while i < self.jobs.len() {
            if self.jobs[i].end_ms <= now {
                let job = self.jobs.remove(i);
                for g in job.gpus {
                    if self.next_decision_ms[g as usize] == i64::MAX {
                        self.next_decision_ms[g as usize] = now + self.gap();
                    }
                }
            } else {
                i += 1;
            }
        }
        let t0 = self.t0_ms.unwrap_or(now);
        for s in 0..self.scenario.jobs.len() {
            let script = &self.scenario.jobs[s];
            let start = t0 + script.start.as_millis() as i64;
            if self.script_started[s] || start > now {
                continue;
            }
            self.script_started[s] = true;
            let end = start + script.duration.as_millis() as i64;
            let (kind, who, gpus) = (script.kind, script.identity, script.gpus.clone());
            let gpm = gpm::Profile::draw(&mut self.gpm_rng, kind);
            let job = self
                .ids
                .new_job(&mut self.rng, kind, who, gpus, (start, end), gpm);
            self.jobs.push(job);
        }
        if self.scenario.random_workloads {
            for g in 0..self.gpus.len() as u32 {
                if now >= self.next_decision_ms[g as usize] {
                    self.decide(g, now, warm);
                }
            }
        }
    }

    /// Draws what free GPU `g` gets next.
    fn decide(&mut self, g: u32, now: i64, warm: bool) {
        let mix = self.scenario.mix;
        let total = mix.training + mix.inference + mix.notebook + mix.empty;
        let r = self.rng.random_range(0.0..total);
        let exclusive = self
            .jobs
            .iter()
            .any(|j| j.gpus.contains(&g) && j.kind != JobKind::Inference);
        let pods: Vec<&Job> = self.jobs.iter().filter(|j| j.gpus.contains(&g)).collect();
        let shared_mem: f64 = pods.iter().map(|j| j.mem_frac()).sum();
        let free = !exclusive && pods.is_empty();
        let started = if r < mix.training && free {
            let candidates: Vec<u32> = (g..self.gpus.len() as u32)
                .filter(|&x| self.is_free(x))
                .collect();
            let sizes: Vec<(usize, f64)> = [(8, 3.0), (4, 3.0), (2, 2.0), (1, 2.0)]
                .into_iter()
                .filter(|(k, _)| *k <= candidates.len())
                .collect();
            let sum: f64 = sizes.iter().map(|s| s.1).sum();
            let mut pick = self.rng.random_range(0.0..sum);
            let mut k = 1;
            for (size, w) in sizes {
                if pick < w {
                    k = size;
                    break;
                }
                pick -= w;
            }
            let range = self.scenario.training_duration;
            Some((
                JobKind::Training,
                candidates[..k].to_vec(),
                self.draw(range),
            ))
        } else if r >= mix.training
            && r < mix.training + mix.inference
            && !exclusive
            && pods.len() < workload::MAX_PODS_PER_GPU
            && shared_mem + 0.30 <= workload::MAX_SHARED_MEM_FRAC
        {
            Some((
                JobKind::Inference,
                vec![g],
                self.draw(self.scenario.inference_duration),
            ))
        } else if r >= mix.training + mix.inference
            && r < mix.training + mix.inference + mix.notebook
            && free
        {
            Some((
                JobKind::Notebook,
                vec![g],
                self.draw(self.scenario.notebook_duration),
            ))
        } else {
            None
        };
        if let Some((kind, gpus, duration)) = started {
            let start = if warm {
                now - (duration as f64 * self.rng.random_range(0.1..0.7)) as i64
            } else {
                now
            };
            if kind != JobKind::Inference {
                for x in &gpus {
                    self.next_decision_ms[*x as usize] = i64::MAX;
                }
            }
            let gpm = gpm::Profile::draw(&mut self.gpm_rng, kind);
            let job = self.ids.new_job(
                &mut self.rng,
                kind,
                None,
                gpus,
                (start, start + duration),
                gpm,
            );
            self.jobs.push(job);
        }
        if self.next_decision_ms[g as usize] != i64::MAX {
            self.next_decision_ms[g as usize] = now + self.gap();
        }
    }

    /// Maybe an Xid on GPU `g` this tick. App errors on a training GPU may kill the job.
    fn xid(&mut self, g: usize, now: i64, dt_ms: i64) -> Option<Event> {
        if !chance(&mut self.rng, self.scenario.xid_per_gpu_hour, dt_ms) {
            return None;
        }
        const APP: &[(u64, &str)] = &[
            (13, "Graphics Engine Exception"),
            (31, "GPU memory page fault"),
            (43, "GPU stopped processing"),
        ];
        const HW: &[(u64, &str)] = &[
            (63, "ECC page retirement or row remapping recording event"),
            (92, "High single-bit ECC error rate"),
            (94, "Contained ECC error"),
            (48, "Double Bit ECC Error"),
            (74, "NVLink Error"),
            (119, "GSP RPC timeout"),
        ];
        let gpu = g as u32;
        let proc = self
            .jobs
            .iter()
            .flat_map(|j| j.procs.iter())
            .find(|p| p.gpu == gpu)
            .map(|p| {
                (
                    p.pid,
                    p.command.split_whitespace().next().unwrap_or("").to_owned(),
                )
            });
        let app = proc.is_some() && self.rng.random_bool(0.7);
        let nvlinks = self.gpus[g].model.nvlinks;
        let (code, text) = if app {
            APP[self.rng.random_range(0..APP.len())]
        } else {
            let hw: Vec<_> = HW.iter().filter(|(c, _)| *c != 74 || nvlinks > 0).collect();
            *hw[self.rng.random_range(0..hw.len())]
        };
        let state = &mut self.gpus[g];
        match code {
            48 | 94 => state.ecc_uncorrected += 1,
            92 => state.ecc_corrected += 50,
            _ => {}
        }
        let bus = self.inventory.gpus[g]
            .pci_bus_id
            .clone()
            .unwrap_or_default();
        // NVRM's form: `Xid (PCI:0000:61:00): 31, pid=…, name=…, <what>`.
        let pci = bus.get(4..).unwrap_or(&bus).trim_end_matches(".0");
        let mut detail = format!("NVRM: Xid (PCI:{pci}): {code}, ");
        if let (true, Some((pid, name))) = (app, &proc) {
            detail.push_str(&format!("pid={pid}, name={name}, {text}"));
            let kill = self.rng.random_bool(0.6);
            if let Some(job) = self
                .jobs
                .iter_mut()
                .find(|j| j.gpus.contains(&gpu) && j.kind == JobKind::Training)
                && kill
            {
                job.end_ms = job.end_ms.min(now + 1);
                detail.push_str("; the job exited");
            }
        } else {
            detail.push_str(text);
        }
        Some(Event {
            time_ms: now,
            gpu_uuid: self.gpus[g].uuid.clone(),
            kind: EventKind::Xid,
            code: Some(code),
            detail,
        })
    }

    fn host_sample(&mut self, dt_ms: i64, demands: &[workload::JobDemand]) -> HostSample {
        let m = self.model();
        let sum = |f: fn(&workload::JobDemand) -> f64| demands.iter().map(f).sum::<f64>();
        let rng = &mut self.rng;
        let mut jitter = |v: f64, rel: f64| (v * (1.0 + rel * normal(rng))).max(0.0);
        let cpu = jitter(1.5 + sum(|d| d.host_cpu_pct), 0.05).clamp(0.2, 100.0);
        let total = m.host_memory_bytes as f64;
        let mem = jitter(0.04 * total + sum(|d| d.host_mem_bytes), 0.002).min(total * 0.97);
        let disk_read = jitter(2.0e6 + sum(|d| d.disk_read_bps), 0.08);
        let disk_write = jitter(1.0e6 + sum(|d| d.disk_write_bps), 0.08);
        let net_rx = jitter(1.0e5 + sum(|d| d.net_rx_bps), 0.08);
        let net_tx = jitter(6.0e4 + sum(|d| d.net_tx_bps), 0.08);
        let target = cpu / 100.0 * f64::from(m.host_cpus) + 0.3;
        let load1 = match self.load1 {
            None => target,
            Some(l) => target + (l - target) * (-(dt_ms as f64) / 60_000.0).exp(),
        };
        self.load1 = Some(load1);
        HostSample {
            cpu_util_pct: Some(cpu as f32),
            mem_used_bytes: Some(mem as u64),
            mem_total_bytes: Some(m.host_memory_bytes),
            disk_read_bps: Some(disk_read as u64),
            disk_write_bps: Some(disk_write as u64),
            net_rx_bps: Some(net_rx as u64),
            net_tx_bps: Some(net_tx as u64),
            load1: Some(load1 as f32),
        }
    }
}

impl GpuSource for Simulator {
    fn name(&self) -> &'static str {
        "simulator"
    }

    fn inventory(&mut self) -> Result<Inventory, SourceError> {
        Ok(self.inventory.clone())
    }

    fn boot_id(&self) -> Option<String> {
        Some(self.boot_id.clone())
    }

    fn sample(&mut self, now: UnixMs) -> Result<Tick, SourceError> {
        let dt_ms = match self.last_ms {
            Some(last) if now <= last => {
                return Err(SourceError::TimeNotIncreasing {
                    now_ms: now,
                    last_ms: last,
                });
            }
            Some(last) => now - last,
            None => 0,
        };
        let warm = self.t0_ms.is_none();
        self.t0_ms.get_or_insert(now);
        self.last_ms = Some(now);
        self.schedule(now, warm);

        let usable = self.usable_mem();
        let mut demands = Vec::with_capacity(self.jobs.len());
        for job in &mut self.jobs {
            demands.push(job.step(&mut self.rng, now, dt_ms, usable));
        }

        let mut tick = Tick {
            time_ms: now,
            gpus: Vec::with_capacity(self.gpus.len()),
            ..Default::default()
        };
        for g in 0..self.gpus.len() {
            // Processes on this GPU, by pid: (job, process) indexes.
            let mut here: Vec<(usize, usize)> = Vec::new();
            for (j, job) in self.jobs.iter().enumerate() {
                for (p, proc) in job.procs.iter().enumerate() {
                    if proc.gpu == g as u32 {
                        here.push((j, p));
                    }
                }
            }
            here.sort_by_key(|&(j, p)| self.jobs[j].procs[p].pid);
            let sm_sum: f64 = here.iter().map(|&(j, p)| demands[j].procs[p].sm).sum();
            let scale = if sm_sum > 100.0 { 100.0 / sm_sum } else { 1.0 };
            let mem_sum: u64 = here
                .iter()
                .map(|&(j, p)| demands[j].procs[p].mem_bytes)
                .sum();
            let mem_cap = usable - (1 << 20);
            let mem_scale = if mem_sum > mem_cap {
                mem_cap as f64 / mem_sum as f64
            } else {
                1.0
            };
            let mut load = GpuLoad {
                util: ((sm_sum * scale).ceil() as u32).min(100),
                has_procs: !here.is_empty(),
                intensity: 1.0,
                ..Default::default()
            };
            let mut weighted = 0.0;
            let mut jobs_here: Vec<usize> = here.iter().map(|&(j, _)| j).collect();
            jobs_here.dedup();
            for &(j, p) in &here {
                let d = &demands[j].procs[p];
                let proc = &self.jobs[j].procs[p];
                let mem = (d.mem_bytes as f64 * mem_scale) as u64;
                load.mem_bytes += mem;
                load.mem_util += d.mem_util * scale;
                load.dec += d.dec;
                weighted += d.sm * demands[j].intensity;
                // GPM: each process weighted by its share of the GPU.
                let share = d.sm * scale / 100.0;
                let activity = gpm::Activity::of(&mut self.gpm_rng, &self.jobs[j].gpm, share);
                load.gpm.add(&activity);
                tick.processes.push(ProcessSample {
                    gpu_uuid: self.gpus[g].uuid.clone(),
                    pid: proc.pid,
                    process_type: ProcessType::Compute,
                    user: Some(proc.user.clone()),
                    command: Some(proc.command.clone()),
                    gpu_mem_bytes: Some(mem),
                    sm_util_pct: Some((d.sm * scale).floor() as u32),
                    mem_util_pct: Some((d.mem_util * scale).floor() as u32),
                    enc_util_pct: Some(0),
                    dec_util_pct: Some(d.dec.round().min(100.0) as u32),
                    workload: proc.workload.clone(),
                    mig_uuid: None,
                });
            }
            if sm_sum > 0.0 {
                load.intensity = weighted / sm_sum;
            } else if let Some(&j) = jobs_here.first() {
                load.intensity = demands[j].intensity;
            }
            load.mem_util = load.mem_util.min(100.0);
            load.dec = load.dec.min(100.0);
            jobs_here.sort_unstable();
            jobs_here.dedup();
            for &j in &jobs_here {
                load.pcie_rx_bps += demands[j].pcie_rx_bps;
                load.pcie_tx_bps += demands[j].pcie_tx_bps;
                load.nvlink_frac = load.nvlink_frac.max(demands[j].nvlink_frac);
            }
            let (ambient, thermal_rate) = (
                self.scenario.ambient_c,
                self.scenario.thermal_events_per_gpu_hour,
            );
            let (sample, event) =
                self.gpus[g].step(&mut self.rng, now, dt_ms, &load, ambient, thermal_rate);
            tick.gpus.push(sample);
            tick.events.extend(event);
            if let Some(e) = self.xid(g, now, dt_ms) {
                tick.events.push(e);
            }
        }
        tick.host = Some(self.host_sample(dt_ms, &demands));
        let due = self.health_due
            || self
                .last_health_ms
                .is_none_or(|last| now - last >= self.health_every_ms);
        if due {
            tick.health = self.gpus.iter().map(GpuState::health).collect();
            self.last_health_ms = Some(now);
        }
        self.health_due = tick.events.iter().any(|e| {
            matches!(
                e.kind,
                EventKind::Xid | EventKind::EccDoubleBit | EventKind::GpuLost
            )
        });
        Ok(tick)
    }
}

#[cfg(test)]
mod tests;
