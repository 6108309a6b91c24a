//! Simulated workloads: training jobs, inference pods and notebooks, with the identities
//! (Kubernetes pod, Docker container, Slurm job, login session), processes and commands a
//! real cluster would show, and what each asks of its GPUs and host every tick.

use super::gpm;
use super::rng::{SimRng, chance, normal};
use super::scenario::{IdentityKind, JobKind};
use gpufleet_core::{Workload, WorkloadKind};
use rand::Rng;

/// Lower-case hex of `n` random digits.
pub(super) fn hex(rng: &mut SimRng, n: usize) -> String {
    const DIGITS: &[u8] = b"0123456789abcdef";
    (0..n)
        .map(|_| DIGITS[rng.random_range(0..16)] as char)
        .collect()
}

/// A random RFC 4122 version-4 style id.
pub(super) fn uuid(rng: &mut SimRng) -> String {
    format!(
        "{}-{}-4{}-{}{}-{}",
        hex(rng, 8),
        hex(rng, 4),
        hex(rng, 3),
        ["8", "9", "a", "b"][rng.random_range(0..4)],
        hex(rng, 3),
        hex(rng, 12)
    )
}

fn pick<'a, T>(rng: &mut SimRng, items: &'a [T]) -> &'a T {
    &items[rng.random_range(0..items.len())]
}

/// Characters Kubernetes uses in generated name suffixes.
const K8S_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

fn k8s_suffix(rng: &mut SimRng, n: usize) -> String {
    (0..n)
        .map(|_| K8S_ALPHABET[rng.random_range(0..K8S_ALPHABET.len())] as char)
        .collect()
}

/// Cluster users: login name and uid.
const USERS: &[(&str, u32)] = &[
    ("alice", 1001),
    ("bob", 1002),
    ("chen", 1003),
    ("dana", 1004),
    ("erik", 1005),
    ("fatima", 1006),
    ("gwen", 1007),
    ("hiro", 1008),
    ("ines", 1009),
    ("jonas", 1010),
    ("kwame", 1011),
    ("lena", 1012),
];

const TRAINING_NAMES: &[&str] = &[
    "llama3-8b-sft",
    "mistral-7b-dpo",
    "bert-large-pretrain",
    "vit-h14-imagenet",
    "whisper-medium-ft",
    "sdxl-lora",
    "gpt-neox-1b3",
    "t5-xl-summarize",
    "resnet152-ablation",
    "clip-vitl14-retrain",
    "qwen2-7b-grpo",
    "esm2-650m-protein",
];

const TRAINING_IMAGES: &[&str] = &[
    "nvcr.io/nvidia/pytorch:24.03-py3",
    "nvcr.io/nvidia/pytorch:24.05-py3",
    "ghcr.io/acme-ml/trainer:2.3.1-cu124",
    "huggingface/transformers-pytorch-gpu:4.41.0",
];

/// An inference service: (deployment, container, image, command, memory share range, video decode).
struct Service {
    name: &'static str,
    container: &'static str,
    image: &'static str,
    command: &'static str,
    mem_frac: (f64, f64),
    decoder: bool,
}

const SERVICES: &[Service] = &[
    Service {
        name: "triton-resnet50",
        container: "triton",
        image: "nvcr.io/nvidia/tritonserver:24.03-py3",
        command: "tritonserver --model-repository=/models --http-port=8000 --grpc-port=8001",
        mem_frac: (0.08, 0.15),
        decoder: false,
    },
    Service {
        name: "vllm-llama3-8b",
        container: "vllm",
        image: "vllm/vllm-openai:v0.4.2",
        command: "python3 -m vllm.entrypoints.openai.api_server --model meta-llama/Meta-Llama-3-8B-Instruct --gpu-memory-utilization 0.30",
        mem_frac: (0.29, 0.30),
        decoder: false,
    },
    Service {
        name: "tei-bge-large",
        container: "text-embeddings-inference",
        image: "ghcr.io/huggingface/text-embeddings-inference:1.2",
        command: "text-embeddings-router --model-id BAAI/bge-large-en-v1.5 --port 80",
        mem_frac: (0.04, 0.06),
        decoder: false,
    },
    Service {
        name: "whisper-asr",
        container: "whisper",
        image: "ghcr.io/acme-ml/whisper-asr:1.4.0",
        command: "python3 serve.py --model large-v3 --port 9000",
        mem_frac: (0.10, 0.14),
        decoder: false,
    },
    Service {
        name: "deepstream-traffic",
        container: "deepstream",
        image: "nvcr.io/nvidia/deepstream:7.0-triton-multiarch",
        command: "deepstream-app -c /config/traffic-cams.txt",
        mem_frac: (0.06, 0.10),
        decoder: true,
    },
];

/// The most memory the inference pods on one GPU may hold together.
pub(super) const MAX_SHARED_MEM_FRAC: f64 = 0.92;
/// The most inference pods sharing one GPU.
pub(super) const MAX_PODS_PER_GPU: usize = 3;
/// Memory a CUDA context takes before the workload allocates anything.
const CONTEXT_BYTES: u64 = 512 << 20;

/// One process of a simulated workload, on one GPU.
#[derive(Debug, Clone)]
pub(super) struct SimProcess {
    /// The GPU it runs on.
    pub gpu: u32,
    /// Its process id.
    pub pid: u32,
    /// Its user, as the agent would resolve it.
    pub user: String,
    /// Its command line.
    pub command: String,
    /// Who it belongs to.
    pub workload: Workload,
}

/// Constants of a job, drawn when it starts.
#[derive(Debug, Clone)]
struct Profile {
    /// Share of the GPU's memory each process holds once loaded.
    mem_frac: f64,
    /// Power per unit of load relative to the model's nominal (kernels differ).
    intensity: f64,
    /// Training: steady SM %. Inference: SM % at full load. Notebook: unused.
    peak_util: f64,
    /// Inference: the load the request rate reverts to (0..1).
    mean_load: f64,
    /// Training: time loading data and compiling before the steady phase.
    warmup_ms: i64,
    /// Training: checkpoint period.
    ckpt_every_ms: i64,
    /// Training: how long a checkpoint stalls the GPUs.
    ckpt_len_ms: i64,
    /// Training: share of NVLink bandwidth used at full load (0 for one GPU).
    nvlink_frac: f64,
    /// Training: host → GPU input pipeline at full load, bytes/s per GPU.
    pcie_rx_bps: f64,
    /// Training: dataset reads, bytes/s per job at full load.
    disk_read_bps: f64,
    /// Training: checkpoint write speed, bytes/s.
    disk_write_bps: f64,
    /// Inference: decodes video (NVDEC busy).
    decoder: bool,
}

/// A running (or scheduled) workload.
#[derive(Debug, Clone)]
pub(super) struct Job {
    /// What it is.
    pub kind: JobKind,
    /// GPUs it uses, one process each.
    pub gpus: Vec<u32>,
    /// When it started (may precede the first sample: the node was busy already).
    pub start_ms: i64,
    /// When it ends; an Xid can bring it forward.
    pub end_ms: i64,
    /// Its processes, in the order of `gpus`.
    pub procs: Vec<SimProcess>,
    /// Constants.
    profile: Profile,
    /// What its kernels do with the SMs, tensor cores and memory (GPM), per unit of load.
    pub gpm: gpm::Profile,
    /// Inference: current load (Ornstein–Uhlenbeck around `mean_load`).
    load: f64,
    /// Inference: a traffic burst, or notebook: a cell running, until then.
    burst_until_ms: i64,
    /// Extra load of the burst, or the SM % of the running cell.
    burst_level: f64,
}

/// What one process asks of its GPU this tick.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ProcDemand {
    /// SM utilization, percent of the GPU.
    pub sm: f64,
    /// Memory-bandwidth utilization, percent.
    pub mem_util: f64,
    /// Memory held.
    pub mem_bytes: u64,
    /// Decoder utilization, percent.
    pub dec: f64,
}

/// What a job asks of its GPUs and its host this tick.
#[derive(Debug, Clone, Default)]
pub(super) struct JobDemand {
    /// One entry per process, in the job's `gpus` order.
    pub procs: Vec<ProcDemand>,
    /// Power per unit of load relative to nominal.
    pub intensity: f64,
    /// Host → GPU bytes/s, per GPU.
    pub pcie_rx_bps: f64,
    /// GPU → host bytes/s, per GPU.
    pub pcie_tx_bps: f64,
    /// Share of NVLink bandwidth in use, per GPU.
    pub nvlink_frac: f64,
    /// Host CPU, percent of all CPUs.
    pub host_cpu_pct: f64,
    /// Host memory held.
    pub host_mem_bytes: f64,
    /// Disk reads, bytes/s.
    pub disk_read_bps: f64,
    /// Disk writes, bytes/s.
    pub disk_write_bps: f64,
    /// Network in, bytes/s.
    pub net_rx_bps: f64,
    /// Network out, bytes/s.
    pub net_tx_bps: f64,
}

/// The Slurm account a user's jobs are charged to: their group's, as a site assigns it.
fn slurm_account(user: &str) -> &'static str {
    const ACCOUNTS: [&str; 4] = ["physics", "nlp-lab", "vision-lab", "climate"];
    let h = user.bytes().fold(0usize, |h, b| {
        h.wrapping_mul(31).wrapping_add(usize::from(b))
    });
    ACCOUNTS[h % ACCOUNTS.len()]
}

/// Hands out process ids, Slurm job ids and session numbers, so they keep increasing
/// across the node's life like the kernel's and the scheduler's.
#[derive(Debug, Clone)]
pub(super) struct Identities {
    /// The next pid to hand out.
    next_pid: u32,
    /// The next Slurm job id.
    next_slurm_job: u64,
    /// The next login session number.
    next_session: u32,
}

impl Identities {
    /// Counters starting at seeded values, as on a node that has been up for a while.
    pub fn new(rng: &mut SimRng) -> Self {
        Self {
            next_pid: rng.random_range(20_000..900_000),
            next_slurm_job: rng.random_range(400_000..900_000),
            next_session: rng.random_range(2..400),
        }
    }

    fn pid(&mut self, rng: &mut SimRng) -> u32 {
        let pid = self.next_pid;
        self.next_pid += rng.random_range(1..300);
        if self.next_pid > 4_000_000 {
            self.next_pid = 1_000 + rng.random_range(0..1_000);
        }
        pid
    }

    /// A new job of `kind` on `gpus` from `start_ms` to `end_ms`, run by `who` (drawn when
    /// `None`), whose kernels do what `gpm` says (drawn by the caller from GPM's own
    /// stream, so the rest of the run does not depend on it). `gpu_mem_bytes` is the
    /// usable memory of one GPU.
    pub fn new_job(
        &mut self,
        rng: &mut SimRng,
        kind: JobKind,
        who: Option<IdentityKind>,
        gpus: Vec<u32>,
        (start_ms, end_ms): (i64, i64),
        gpm: gpm::Profile,
    ) -> Job {
        let who = who.unwrap_or_else(|| {
            let r: f64 = rng.random();
            match kind {
                JobKind::Training if r < 0.45 => IdentityKind::Kubernetes,
                JobKind::Training if r < 0.80 => IdentityKind::Slurm,
                JobKind::Training => IdentityKind::Docker,
                JobKind::Inference if r < 0.8 => IdentityKind::Kubernetes,
                JobKind::Inference => IdentityKind::Docker,
                JobKind::Notebook if r < 0.55 => IdentityKind::Host,
                JobKind::Notebook if r < 0.85 => IdentityKind::Kubernetes,
                JobKind::Notebook => IdentityKind::Docker,
            }
        });
        let &(user, uid) = pick(rng, USERS);
        let k = gpus.len();
        let (profile, commands, workload, proc_user) = match kind {
            JobKind::Training => {
                let name = *pick(rng, TRAINING_NAMES);
                let profile = Profile {
                    mem_frac: rng.random_range(0.55..0.93),
                    intensity: rng.random_range(0.92..1.15),
                    peak_util: rng.random_range(88.0..99.0),
                    mean_load: 1.0,
                    warmup_ms: rng.random_range(45_000..120_000),
                    ckpt_every_ms: rng.random_range(6..16) * 60_000,
                    ckpt_len_ms: rng.random_range(12_000..35_000),
                    nvlink_frac: if k > 1 {
                        rng.random_range(0.25..0.55)
                    } else {
                        0.0
                    },
                    pcie_rx_bps: rng.random_range(1.5e9..6.0e9),
                    disk_read_bps: rng.random_range(1.0e8..4.0e8),
                    disk_write_bps: rng.random_range(1.2e9..2.5e9),
                    decoder: false,
                };
                let script = *pick(rng, &["train.py", "finetune.py", "pretrain.py"]);
                let command = match who {
                    IdentityKind::Slurm => format!(
                        "python {script} --config configs/{name}.yaml --output /scratch/{user}/{name}"
                    ),
                    _ => format!(
                        "python -u {script} --config configs/{name}.yaml --nproc-per-node {k}"
                    ),
                };
                let image = *pick(rng, TRAINING_IMAGES);
                let (workload, proc_user) =
                    self.identity(rng, who, (user, uid), name, "pytorch", image, "guaranteed");
                (profile, vec![command; k], workload, proc_user)
            }
            JobKind::Inference => {
                let svc = pick(rng, SERVICES);
                let profile = Profile {
                    mem_frac: rng.random_range(svc.mem_frac.0..=svc.mem_frac.1),
                    intensity: rng.random_range(0.8..1.0),
                    peak_util: rng.random_range(55.0..90.0),
                    mean_load: rng.random_range(0.08..0.35),
                    warmup_ms: rng.random_range(15_000..60_000),
                    ckpt_every_ms: 0,
                    ckpt_len_ms: 0,
                    nvlink_frac: 0.0,
                    pcie_rx_bps: rng.random_range(3.0e8..1.2e9),
                    disk_read_bps: 0.0,
                    disk_write_bps: 0.0,
                    decoder: svc.decoder,
                };
                let (workload, proc_user) = self.identity(
                    rng,
                    who,
                    (user, uid),
                    svc.name,
                    svc.container,
                    svc.image,
                    "burstable",
                );
                (
                    profile,
                    vec![svc.command.to_owned(); k],
                    workload,
                    proc_user,
                )
            }
            JobKind::Notebook => {
                let profile = Profile {
                    mem_frac: rng.random_range(0.15..0.6),
                    intensity: 1.0,
                    peak_util: 0.0,
                    mean_load: 0.0,
                    warmup_ms: 10_000,
                    ckpt_every_ms: 0,
                    ckpt_len_ms: 0,
                    nvlink_frac: 0.0,
                    pcie_rx_bps: 0.0,
                    disk_read_bps: 0.0,
                    disk_write_bps: 0.0,
                    decoder: false,
                };
                let home = if who == IdentityKind::Kubernetes {
                    "jovyan"
                } else {
                    user
                };
                let command = match who {
                    IdentityKind::Docker => {
                        "jupyter-lab --ip=0.0.0.0 --no-browser --allow-root".to_owned()
                    }
                    _ => format!(
                        "python -m ipykernel_launcher -f /home/{home}/.local/share/jupyter/runtime/kernel-{}.json",
                        uuid(rng)
                    ),
                };
                let pod = format!("jupyter-{user}");
                let (workload, proc_user) = self.identity(
                    rng,
                    who,
                    (user, uid),
                    &pod,
                    "notebook",
                    "quay.io/jupyter/pytorch-notebook:cuda12-python-3.11",
                    "burstable",
                );
                (profile, vec![command; k], workload, proc_user)
            }
        };
        let procs = gpus
            .iter()
            .zip(commands)
            .map(|(&gpu, command)| SimProcess {
                gpu,
                pid: self.pid(rng),
                user: proc_user.clone(),
                command,
                workload: workload.clone(),
            })
            .collect();
        Job {
            kind,
            gpus,
            start_ms,
            end_ms,
            procs,
            load: profile.mean_load,
            profile,
            gpm,
            burst_until_ms: i64::MIN,
            burst_level: 0.0,
        }
    }

    /// The workload identity and the process user for a job named `name`.
    #[allow(clippy::too_many_arguments)]
    fn identity(
        &mut self,
        rng: &mut SimRng,
        who: IdentityKind,
        (user, uid): (&str, u32),
        name: &str,
        container: &str,
        image: &str,
        qos: &str,
    ) -> (Workload, String) {
        match who {
            IdentityKind::Kubernetes => {
                let (namespace, pod_name) = if name.starts_with("jupyter-") {
                    ("jupyterhub".to_owned(), name.to_owned())
                } else if container == "pytorch" {
                    let ns = *pick(rng, &["ml-research", "nlp", "vision", "speech"]);
                    (ns.to_owned(), format!("{name}-master-0"))
                } else {
                    let ns = *pick(rng, &["inference", "serving", "search-prod"]);
                    (
                        ns.to_owned(),
                        format!("{name}-{}-{}", k8s_suffix(rng, 10), k8s_suffix(rng, 5)),
                    )
                };
                let workload = Workload {
                    kind: WorkloadKind::Container,
                    runtime: "containerd".into(),
                    container_id: Some(hex(rng, 64)),
                    pod_uid: Some(uuid(rng)),
                    qos: Some(qos.into()),
                    container_name: Some(container.into()),
                    image: Some(image.into()),
                    pod_name: Some(pod_name),
                    namespace: Some(namespace),
                    ..Default::default()
                };
                (
                    workload,
                    if container == "notebook" {
                        "1000".into()
                    } else {
                        "root".into()
                    },
                )
            }
            IdentityKind::Docker => {
                let workload = Workload {
                    kind: WorkloadKind::Container,
                    runtime: "docker".into(),
                    container_id: Some(hex(rng, 64)),
                    container_name: Some(format!("{user}-{}", name.trim_start_matches("jupyter-"))),
                    image: Some(image.into()),
                    ..Default::default()
                };
                (workload, user.to_owned())
            }
            IdentityKind::Slurm => {
                let job = self.next_slurm_job;
                self.next_slurm_job += rng.random_range(1..40);
                let workload = Workload {
                    kind: WorkloadKind::Slurm,
                    runtime: "slurm".into(),
                    job_id: Some(job.to_string()),
                    step: Some(if rng.random_bool(0.7) { "0" } else { "batch" }.into()),
                    uid: Some(uid),
                    // What the job's environment names (SLURM_JOB_NAME, _ACCOUNT,
                    // _PARTITION, _USER): derived, so the random sequence is unchanged.
                    job_name: Some(name.to_owned()),
                    account: Some(slurm_account(user).to_owned()),
                    partition: Some("gpu".into()),
                    job_user: Some(user.to_owned()),
                    ..Default::default()
                };
                (workload, user.to_owned())
            }
            IdentityKind::Host => {
                let session = self.next_session;
                self.next_session += rng.random_range(1..5);
                let workload = Workload {
                    kind: WorkloadKind::Host,
                    runtime: "systemd".into(),
                    unit: Some(format!("session-{session}.scope")),
                    uid: Some(uid),
                    ..Default::default()
                };
                (workload, user.to_owned())
            }
        }
    }
}

impl Job {
    /// Memory share each process holds once loaded.
    pub fn mem_frac(&self) -> f64 {
        self.profile.mem_frac
    }

    /// Whether the job is saving a checkpoint at `now_ms` (training only).
    fn in_checkpoint(&self, now_ms: i64) -> bool {
        let p = &self.profile;
        let e = now_ms - self.start_ms - p.warmup_ms;
        self.kind == JobKind::Training
            && e >= 0
            && p.ckpt_every_ms > 0
            && e % p.ckpt_every_ms >= p.ckpt_every_ms - p.ckpt_len_ms
    }

    /// Advances the job to `now_ms` (`dt_ms` after the previous tick) and says what it asks
    /// of its GPUs and host. `gpu_mem_bytes` is one GPU's usable memory.
    pub fn step(
        &mut self,
        rng: &mut SimRng,
        now_ms: i64,
        dt_ms: i64,
        gpu_mem_bytes: u64,
    ) -> JobDemand {
        let p = self.profile.clone();
        let elapsed = (now_ms - self.start_ms).max(0);
        let loaded = (elapsed as f64 / p.warmup_ms.max(1) as f64).min(1.0);
        let mem_target = (gpu_mem_bytes as f64 * p.mem_frac) as u64;
        let mem_bytes = CONTEXT_BYTES.min(mem_target)
            + ((mem_target.saturating_sub(CONTEXT_BYTES)) as f64 * (loaded * 2.0).min(1.0)) as u64;
        let k = self.procs.len() as f64;
        let mut d = JobDemand {
            intensity: p.intensity,
            ..Default::default()
        };
        match self.kind {
            JobKind::Training => {
                let checkpoint = self.in_checkpoint(now_ms);
                let util = if loaded < 1.0 {
                    10.0 + 75.0 * loaded + 5.0 * normal(rng)
                } else if checkpoint {
                    3.0 + 1.5 * normal(rng)
                } else {
                    p.peak_util + 1.5 * normal(rng)
                };
                for _ in &self.procs {
                    let sm = (util + normal(rng)).clamp(0.0, 100.0);
                    d.procs.push(ProcDemand {
                        sm,
                        mem_util: (sm * 0.55 + 3.0 * normal(rng)).clamp(0.0, 100.0),
                        mem_bytes,
                        dec: 0.0,
                    });
                }
                let level = util.clamp(0.0, 100.0) / 100.0;
                d.nvlink_frac = p.nvlink_frac * level;
                d.pcie_rx_bps = if loaded < 1.0 {
                    8.0e9 * (1.0 - loaded)
                } else {
                    p.pcie_rx_bps * level
                };
                d.pcie_tx_bps = if checkpoint {
                    3.0e9
                } else {
                    p.pcie_rx_bps * 0.08 * level
                };
                d.host_cpu_pct = k * (0.6 + 3.0 * level);
                d.host_mem_bytes = k * 24.0 * f64::from(1u32 << 30);
                d.disk_read_bps = if loaded < 1.0 {
                    1.5e9
                } else {
                    p.disk_read_bps * level
                };
                d.disk_write_bps = if checkpoint { p.disk_write_bps } else { 2.0e6 };
                d.net_rx_bps = 1.5e6 * k;
                d.net_tx_bps = 0.8e6 * k;
            }
            JobKind::Inference => {
                // Request load: mean-reverting with exact discretisation for any dt, plus
                // bursts of traffic.
                let theta = 1.0 / 60.0;
                // Stationary spread sigma / sqrt(2 theta) ≈ 0.11 around the mean.
                let sigma = 0.02;
                let dt = dt_ms as f64 / 1000.0;
                let decay = (-theta * dt).exp();
                let spread = sigma * ((1.0 - decay * decay) / (2.0 * theta)).sqrt();
                self.load =
                    (p.mean_load + (self.load - p.mean_load) * decay + spread * normal(rng))
                        .clamp(0.0, 1.0);
                if now_ms >= self.burst_until_ms && chance(rng, 15.0, dt_ms) {
                    self.burst_until_ms = now_ms + rng.random_range(5_000..40_000);
                    self.burst_level = rng.random_range(0.2..0.5);
                }
                let burst = if now_ms < self.burst_until_ms {
                    self.burst_level
                } else {
                    0.0
                };
                let load = if loaded < 1.0 {
                    0.02
                } else {
                    (self.load + burst).min(1.0)
                };
                for _ in &self.procs {
                    let sm =
                        (2.0 + (p.peak_util - 2.0) * load + 1.5 * normal(rng)).clamp(0.0, 100.0);
                    d.procs.push(ProcDemand {
                        sm,
                        mem_util: (sm * 0.4 + 2.0 * normal(rng)).clamp(0.0, 100.0),
                        mem_bytes: mem_bytes + (mem_target as f64 * 0.03 * load) as u64,
                        dec: if p.decoder {
                            (15.0 + 55.0 * load).min(100.0)
                        } else {
                            0.0
                        },
                    });
                }
                d.pcie_rx_bps = p.pcie_rx_bps * load;
                d.pcie_tx_bps = p.pcie_rx_bps * 0.25 * load;
                d.host_cpu_pct = 0.4 + 2.0 * load;
                d.host_mem_bytes = 8.0 * f64::from(1u32 << 30);
                d.disk_read_bps = if loaded < 1.0 { 8.0e8 } else { 1.0e6 };
                d.disk_write_bps = 5.0e5;
                d.net_rx_bps = 6.0e7 * load;
                d.net_tx_bps = 2.5e7 * load;
            }
            JobKind::Notebook => {
                if now_ms >= self.burst_until_ms && chance(rng, 8.0, dt_ms) {
                    self.burst_until_ms = now_ms + rng.random_range(5_000..40_000);
                    self.burst_level = rng.random_range(20.0..70.0);
                }
                let running = now_ms < self.burst_until_ms;
                let mut sm = 0.0;
                for _ in &self.procs {
                    sm = if running {
                        (self.burst_level + 3.0 * normal(rng)).clamp(0.0, 100.0)
                    } else {
                        0.0
                    };
                    d.procs.push(ProcDemand {
                        sm,
                        mem_util: sm * 0.3,
                        mem_bytes,
                        dec: 0.0,
                    });
                }
                d.pcie_rx_bps = sm * 2.0e7;
                d.pcie_tx_bps = sm * 2.0e6;
                d.host_cpu_pct = 0.2 + sm * 0.02;
                d.host_mem_bytes = 6.0 * f64::from(1u32 << 30);
                d.net_rx_bps = 2.0e4;
                d.net_tx_bps = 1.0e4;
            }
        }
        d
    }
}
