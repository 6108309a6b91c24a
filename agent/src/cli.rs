//! The flags the agent's binaries share (`gpufleet-agent run` / `snapshot` and
//! `gpufleet-exec`): where readings come from ([`SourceArgs`], which opens the source), the
//! spool ([`SpoolArgs`]) and the credentials ([`CredentialArgs`]). Each flag also reads
//! `GPUFLEET_<FLAG>`; the config file's layer is `gpufleet-cli`'s.

use crate::host;
use crate::nvml::{Cadence, NvmlOptions, NvmlSource};
use crate::spool::{self, DEFAULT_MAX_BYTES, FsyncPolicy, SpoolConfig};
use gpufleet_core::{GpuSource, SourceError};
use gpufleet_sim::scenario::ScenarioError;
use gpufleet_sim::{Scenario, SimError, SimOptions, simulator};
use gpufleet_uplink::tls::CredentialFiles;
use std::path::{Path, PathBuf};
use thiserror::Error;
use tracing::{info, warn};

/// The environment variable through which `gpufleet-agent exec` tells `gpufleet-exec` the
/// agent's version; `gpufleet-exec` refuses to run for an agent of another version and
/// keeps the variable from the command it measures.
pub const AGENT_VERSION_ENV: &str = "GPUFLEET_EXEC_AGENT_VERSION";

/// Where readings come from.
#[derive(Debug, Clone, clap::Args)]
pub struct SourceArgs {
    /// Simulate a GPU node instead of reading NVML.
    #[arg(long, env = "GPUFLEET_SIMULATE")]
    pub simulate: bool,
    /// Number of simulated GPUs.
    #[arg(long, env = "GPUFLEET_SIM_GPUS", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub sim_gpus: u32,
    /// Scenario file for the simulator (TOML).
    #[arg(long, env = "GPUFLEET_SIM_SCENARIO", value_name = "FILE")]
    pub sim_scenario: Option<PathBuf>,
    /// Simulator seed [default: derived from the node name].
    #[arg(long, env = "GPUFLEET_SIM_SEED", value_name = "N")]
    pub sim_seed: Option<u64>,
    /// NVML library to load [default: the system's libnvidia-ml.so.1].
    #[arg(long, env = "GPUFLEET_NVML_LIB", value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// Where /proc is (processes, host metrics, boot id).
    #[arg(
        long,
        env = "GPUFLEET_PROC_ROOT",
        value_name = "DIR",
        default_value = "/proc"
    )]
    pub proc_root: PathBuf,
    /// How often GPU health counters are read (retired / remapped memory, lifetime ECC,
    /// PCIe replays, NVLink errors, persistence mode); also right after an Xid, ECC or
    /// GPU-lost event. Not 0.
    #[arg(long, env = "GPUFLEET_HEALTH_INTERVAL", value_name = "DURATION", default_value = "30s", value_parser = positive_duration)]
    pub health_interval: std::time::Duration,
    /// How often NVML's total-energy counter is read (3–4 ms of driver CPU per GPU on an
    /// H100): on the last tick of each such slot of wall time, so every minute ends on a
    /// reading; the collector spreads each delta over the power samples between. Must
    /// divide a minute. 0: every tick.
    #[arg(long, env = "GPUFLEET_ENERGY_EVERY", value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub energy_every: std::time::Duration,
    /// How often per-process utilization is fetched from the driver's buffer (2–3 ms of
    /// driver CPU per GPU); each tick since is completed from its own samples and sent
    /// then, so ticks with processes reach the collector up to this late. 0: every tick.
    #[arg(long, env = "GPUFLEET_PROCESS_UTIL_EVERY", value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub process_util_every: std::time::Duration,
    /// How often PCIe throughput is read (each direction samples the link for 20 ms);
    /// the ticks between carry the last reading. 0: every tick.
    #[arg(long, env = "GPUFLEET_PCIE_EVERY", value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub pcie_every: std::time::Duration,
    /// How often volatile ECC error counts are read (an uncorrectable error also raises
    /// an event at once); the ticks between carry the last reading. 0: every tick.
    #[arg(long, env = "GPUFLEET_ECC_EVERY", value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub ecc_every: std::time::Duration,
    /// How often the per-link NVLink throughput counters are read (the sums over the
    /// links are read every tick); each reading's rate covers the time since the last,
    /// carried between. 0: every tick.
    #[arg(long, env = "GPUFLEET_NVLINK_LINKS_EVERY", value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub nvlink_links_every: std::time::Duration,
    /// How often a GPM sample is taken (Hopper and newer: SM occupancy, tensor activity,
    /// DRAM bandwidth); each reading covers the time since the last, carried between.
    /// At least 100 ms apart whatever this says. 0: every tick.
    #[arg(long, env = "GPUFLEET_GPM_EVERY", value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub gpm_every: std::time::Duration,
}

fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    gpufleet_core::config::parse_duration(s)
}

/// A duration above zero (`30s`): a zero health interval would read NVML every tick.
fn positive_duration(s: &str) -> Result<std::time::Duration, String> {
    match gpufleet_core::config::parse_duration(s)? {
        d if d.is_zero() => Err(format!("{s:?}: must be more than 0 (e.g. 30s)")),
        d => Ok(d),
    }
}

/// Where workload names come from ([`crate::names`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NamesMode {
    /// Every runtime found on the node: the Kubernetes API when a client configuration
    /// is found, the Docker / Podman socket when one exists, Slurm's job environment.
    Auto,
    /// Workloads keep their ids only.
    Off,
}

/// Workload-name flags of `run` and `snapshot`.
#[derive(Debug, Clone, clap::Args)]
pub struct NameArgs {
    /// Where workload names come from (auto: every runtime found on the node; off: ids
    /// only). Simulated nodes carry their own names.
    #[arg(long, env = "GPUFLEET_NAMES", value_enum, default_value_t = NamesMode::Auto)]
    pub names: NamesMode,
    /// A Kubernetes pod label to carry with the pod's workloads (repeat, or separate with
    /// commas; none by default), e.g. app.kubernetes.io/name.
    #[arg(
        long = "kube-label",
        env = "GPUFLEET_KUBE_LABEL",
        value_name = "KEY",
        value_delimiter = ','
    )]
    pub kube_labels: Vec<String>,
    /// A Docker / Podman container label to carry with the container (repeat, or separate
    /// with commas; none by default).
    #[arg(
        long = "docker-label",
        env = "GPUFLEET_DOCKER_LABEL",
        value_name = "KEY",
        value_delimiter = ','
    )]
    pub docker_labels: Vec<String>,
    /// The longest one name look-up may take (it never delays a sample).
    #[arg(long, env = "GPUFLEET_NAMES_TIMEOUT", value_name = "DURATION", default_value = "5s", value_parser = positive_duration)]
    pub names_timeout: std::time::Duration,
}

impl NameArgs {
    /// `source` with the names the runtimes on this node give, resolved off the
    /// sampling path, and the cache they are kept in; `source` unchanged (and no cache)
    /// with `--names off` or for a simulated node.
    pub fn attach(
        &self,
        source: Box<dyn GpuSource>,
        simulated: bool,
        node: &str,
        proc_root: &Path,
    ) -> (
        Box<dyn GpuSource>,
        Option<std::sync::Arc<crate::names::NameCache>>,
    ) {
        if simulated || self.names == NamesMode::Off {
            return (source, None);
        }
        let env = |k: &str| std::env::var(k).ok();
        let sources = crate::names::NameSources {
            node: node.to_owned(),
            proc_root: proc_root.to_owned(),
            kubernetes: crate::names::kube::find_config(env, Path::exists),
            docker_socket: crate::names::docker::socket_path(
                std::env::var("DOCKER_HOST").ok().as_deref(),
                Path::exists,
            ),
            scontrol: crate::names::slurm::find_scontrol(std::env::var_os("PATH").as_deref()),
            kube_labels: self.kube_labels.clone(),
            docker_labels: self.docker_labels.clone(),
            timeout: self.names_timeout,
        };
        info!(
            kubernetes = sources.kubernetes.is_some(),
            docker = sources.docker_socket.is_some(),
            scontrol = sources.scontrol.is_some(),
            "workload names: sources found"
        );
        let cache = std::sync::Arc::new(crate::names::NameCache::new());
        if let Err(e) = crate::names::spawn_resolver(std::sync::Arc::clone(&cache), sources) {
            warn!(error = %e, "workload names: cannot start the resolver; workloads keep their ids");
            return (source, None);
        }
        let named = crate::names::Named::new(source, std::sync::Arc::clone(&cache));
        (Box::new(named), Some(cache))
    }
}

/// Why the source the flags ask for could not be opened.
#[derive(Debug, Error)]
pub enum OpenSourceError {
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    #[error(transparent)]
    Sim(#[from] SimError),
    #[error(transparent)]
    Nvml(#[from] SourceError),
    #[error("{0}")]
    Cadence(String),
}

impl SourceArgs {
    /// The NVML cadences the flags ask for.
    pub fn cadence(&self) -> Result<Cadence, OpenSourceError> {
        let cadence = Cadence {
            energy: self.energy_every,
            process_util: self.process_util_every,
            pcie: self.pcie_every,
            ecc: self.ecc_every,
            nvlink_links: self.nvlink_links_every,
            gpm: self.gpm_every,
        };
        cadence.check().map_err(OpenSourceError::Cadence)?;
        Ok(cadence)
    }

    /// Opens the source the flags ask for: the simulator of `node`, or NVML sampled
    /// every `interval` at the flags' cadences (`None`: every call every tick, for a
    /// one-off reading).
    pub fn open(
        &self,
        node: &str,
        interval: std::time::Duration,
        cadence: Option<Cadence>,
    ) -> Result<Box<dyn GpuSource>, OpenSourceError> {
        if self.simulate {
            if self.nvml_lib.is_some() {
                warn!("--nvml-lib is ignored with --simulate");
            }
            let scenario = match &self.sim_scenario {
                Some(path) => Scenario::from_file(path)?,
                None => Scenario::default(),
            };
            let mut sim = simulator(SimOptions {
                node: node.to_owned(),
                gpus: self.sim_gpus,
                seed: self.sim_seed,
                scenario,
            })?;
            sim.set_health_interval(self.health_interval);
            info!(
                node,
                gpus = self.sim_gpus,
                seed = sim.seed(),
                model = sim.model().key,
                "simulating"
            );
            Ok(Box::new(sim))
        } else {
            let nvml = NvmlSource::open(NvmlOptions {
                lib_path: self.nvml_lib.clone(),
                proc_root: self.proc_root.clone(),
                hostname: node.to_owned(),
                health_interval: self.health_interval,
                interval,
                cadence: cadence.unwrap_or(Cadence::EVERY_TICK),
            })?;
            Ok(Box::new(nvml))
        }
    }
}

/// The environment variable a Kubernetes DaemonSet fills with its node's name (the
/// downward API's `spec.nodeName`).
pub const NODE_NAME_ENV: &str = "NODE_NAME";

/// The node name: `given` (`--node`, `GPUFLEET_NODE`), else `$NODE_NAME` (in a pod, the
/// host name is the pod's, not the node's), else the host name under `proc_root`.
pub fn node_name(given: Option<String>, proc_root: &Path) -> Option<String> {
    node_name_from(given, std::env::var(NODE_NAME_ENV).ok(), proc_root)
}

fn node_name_from(
    given: Option<String>,
    node_name_env: Option<String>,
    proc_root: &Path,
) -> Option<String> {
    let nonempty = |s: String| {
        let s = s.trim().to_owned();
        (!s.is_empty()).then_some(s)
    };
    given
        .and_then(nonempty)
        .or_else(|| node_name_env.and_then(nonempty))
        .or_else(|| host::hostname(proc_root))
}

#[cfg(test)]
mod node_name_tests {
    use super::*;

    #[test]
    fn the_flag_then_node_name_then_the_host_name() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::create_dir_all(dir.path().join("sys/kernel")).expect("mkdir");
        std::fs::write(dir.path().join("sys/kernel/hostname"), "pod-abc12\n").expect("write");
        let root = dir.path();
        let name = |given: Option<&str>, env: Option<&str>| {
            node_name_from(given.map(Into::into), env.map(Into::into), root)
        };
        assert_eq!(name(Some("n1"), Some("k8s-7")).as_deref(), Some("n1"));
        assert_eq!(name(None, Some("k8s-7")).as_deref(), Some("k8s-7"));
        assert_eq!(name(None, Some(" ")).as_deref(), Some("pod-abc12"));
        assert_eq!(name(None, None).as_deref(), Some("pod-abc12"));
    }
}

/// Spool flags of `gpufleet-agent run`.
#[derive(Debug, Clone, clap::Args)]
pub struct SpoolArgs {
    /// Spool directory (one per agent) [default: <state dir>/spool/<node>; the state dir
    /// is $STATE_DIRECTORY, else $XDG_STATE_HOME/gpufleet, else ~/.local/state/gpufleet].
    #[arg(long, env = "GPUFLEET_SPOOL_DIR", value_name = "DIR")]
    pub spool_dir: Option<PathBuf>,
    /// Most bytes the spool holds; beyond, the oldest samples are dropped and counted.
    /// The default (1 GiB) holds about 4 days of 8 GPUs at 1 s.
    #[arg(long, env = "GPUFLEET_SPOOL_MAX_BYTES", value_name = "BYTES", default_value_t = DEFAULT_MAX_BYTES, value_parser = clap::value_parser!(u64).range(4096..))]
    pub spool_max_bytes: u64,
    /// When to fsync the spool: ticks still unacked after 1 s, grouped (acked); after each
    /// tick (batch); once a second (interval); never.
    #[arg(long, env = "GPUFLEET_SPOOL_FSYNC", value_name = "POLICY", value_enum, default_value_t = FsyncPolicy::Acked)]
    pub spool_fsync: FsyncPolicy,
}

impl SpoolArgs {
    /// The spool settings for node `node`.
    pub fn config(&self, node: &str) -> SpoolConfig {
        spool::config_for(
            node,
            self.spool_dir.clone(),
            self.spool_max_bytes,
            self.spool_fsync,
        )
    }
}

/// The credential options of `gpufleet-agent run` (flattened into its arguments).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct CredentialArgs {
    /// PEM CA certificate(s) that sign the collector's certificate; needed for https://
    /// collectors.
    #[arg(long, env = "GPUFLEET_CA", value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// PEM client certificate presented to the collector (mTLS); its DNS name must be
    /// this node's name.
    #[arg(long, env = "GPUFLEET_CERT", value_name = "FILE", requires = "key")]
    pub cert: Option<PathBuf>,
    /// PEM private key of --cert.
    #[arg(long, env = "GPUFLEET_KEY", value_name = "FILE", requires = "cert")]
    pub key: Option<PathBuf>,
    /// File holding this node's agent token (made by `gpufleet-collector tokens add`).
    #[arg(long, env = "GPUFLEET_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
}

impl CredentialArgs {
    /// The files the flags name.
    pub fn files(&self) -> CredentialFiles {
        CredentialFiles {
            ca: self.ca.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
            token_file: self.token_file.clone(),
        }
    }
}

#[cfg(test)]
mod cadence_tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Flags {
        #[command(flatten)]
        source: SourceArgs,
    }

    #[test]
    fn the_flags_defaults_are_the_cadence_defaults_and_a_bad_energy_cadence_is_refused() {
        let flags = Flags::try_parse_from(["agent"]).expect("parses");
        assert_eq!(flags.source.cadence().ok(), Some(Cadence::DEFAULT));
        let flags = Flags::try_parse_from(["agent", "--energy-every", "7s", "--pcie-every", "0"])
            .expect("parses");
        assert_eq!(flags.source.pcie_every, std::time::Duration::ZERO);
        assert!(
            matches!(flags.source.cadence(), Err(OpenSourceError::Cadence(e)) if e.contains("7s"))
        );
    }
}
