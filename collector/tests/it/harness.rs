//! Running the real binaries in tests: the collector on given (or ephemeral) ports, the
//! agent binary beside it, signals, and the agent's exit summary.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use std::time::Instant;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

/// The `gpufleet-agent` binary (cargo builds it beside the collector's).
pub fn agent_bin() -> PathBuf {
    let collector = PathBuf::from(env!("CARGO_BIN_EXE_gpufleet-collector"));
    let agent = collector.with_file_name("gpufleet-agent");
    assert!(
        agent.exists(),
        "{} not found: build it first (`cargo test --workspace` builds every binary)",
        agent.display()
    );
    agent
}

pub fn sigterm(child: &Child) {
    let pid = child.id().expect("child still running");
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -TERM {pid} failed");
}

/// A running collector and the addresses it listens on (`host:port`).
pub struct Collector {
    pub child: Child,
    pub grpc: String,
    pub http: String,
}

/// Starts `gpufleet-collector serve` on `grpc`/`http` (`127.0.0.1:0` for ephemeral
/// ports) with the database `db_url` and `extra` flags; waits for its address line.
pub async fn start_collector(db_url: &str, grpc: &str, http: &str, extra: &[&str]) -> Collector {
    start_collector_logging(db_url, grpc, http, extra, "warn", Stdio::inherit()).await
}

/// [`start_collector`] with the log level `log` (`GPUFLEET_LOG`) and its log (stderr) sent
/// to `stderr` (e.g. a file a test reads afterwards).
pub async fn start_collector_logging(
    db_url: &str,
    grpc: &str,
    http: &str,
    extra: &[&str],
    log: &str,
    stderr: Stdio,
) -> Collector {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpufleet-collector"))
        .args(["serve", "--db", db_url, "--grpc-listen", grpc])
        .args(["--http-listen", http])
        .args(extra)
        .env("GPUFLEET_LOG", log)
        .stderr(stderr)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start gpufleet-collector");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the collector printed its addresses in time")
        .expect("read")
        .expect("a line");
    let addr = |key: &str| -> String {
        first
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no {key}= in {first:?}"))
            .to_owned()
    };
    Collector {
        grpc: addr("grpc"),
        http: addr("http"),
        child,
    }
}

/// Waits for `child` to exit (bounded) and successfully; returns its stdout.
pub async fn wait_stdout(mut child: Child, what: &str) -> String {
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        stdout.read_to_string(&mut out).await.expect("read stdout");
    }
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .unwrap_or_else(|_| panic!("{what} did not exit within 60 s of SIGTERM"))
        .expect("wait");
    assert!(
        status.success(),
        "{what} exited with {status}; stdout: {out}"
    );
    out
}

/// Parses `summary sampled=N acked=N dropped=N unacked=N`.
pub fn summary(stdout: &str) -> [u64; 4] {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("summary "))
        .unwrap_or_else(|| panic!("no summary line in agent stdout: {stdout:?}"));
    let mut out = [0u64; 4];
    for (i, key) in ["sampled", "acked", "dropped", "unacked"]
        .iter()
        .enumerate()
    {
        out[i] = line
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{key} missing in {line:?}"));
    }
    out
}

/// Starts a simulated agent with `gpus` GPUs (50 ms unless `extra` says otherwise) that
/// spools in `spool`.
pub fn start_sim_agent(
    collector_grpc: &str,
    node: &str,
    spool: &std::path::Path,
    gpus: u32,
    extra: &[&str],
) -> Child {
    let interval = if extra.contains(&"--interval") {
        &[][..]
    } else {
        &["--interval", "50ms"][..]
    };
    Command::new(agent_bin())
        .args(["run", "--collector", &format!("http://{collector_grpc}")])
        .args([
            "--node",
            node,
            "--simulate",
            "--sim-gpus",
            &gpus.to_string(),
        ])
        .args(interval)
        .args(["--shutdown-timeout", "30s"])
        .arg("--spool-dir")
        .arg(spool)
        .args(extra)
        .env("GPUFLEET_LOG", "error")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start gpufleet-agent")
}

/// Starts the real agent on the fake libnvidia-ml playing `scenario` (a file of
/// `fake-nvml/scenarios/`), with the library, the scenario and the spool under `dir`.
pub fn start_fake_nvml_agent(
    dir: &std::path::Path,
    scenario: &str,
    collector_grpc: &str,
    node: &str,
    interval: &str,
    health_interval: &str,
) -> Child {
    let exe = std::env::current_exe().expect("own path");
    let library = fake_nvml::built_library(&exe).unwrap_or_else(|| {
        panic!(
            "{} not built beside {}",
            fake_nvml::LIBRARY_FILE,
            exe.display()
        )
    });
    let nvml = dir.join("nvml");
    std::fs::create_dir(&nvml).expect("mkdir");
    std::fs::copy(library, nvml.join("libnvidia-ml.so.1")).expect("copy lib");
    let scenario = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fake-nvml/scenarios")
        .join(scenario);
    std::fs::copy(&scenario, nvml.join(fake_nvml::SCENARIO_FILE)).expect("copy scenario");
    Command::new(agent_bin())
        .args(["run", "--collector", &format!("http://{collector_grpc}")])
        .args(["--node", node, "--interval", interval])
        .args(["--health-interval", health_interval])
        .arg("--nvml-lib")
        .arg(nvml.join("libnvidia-ml.so.1"))
        .arg("--spool-dir")
        .arg(dir.join("spool"))
        .env("GPUFLEET_LOG", "error")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start gpufleet-agent")
}

/// Agent summary, in GPU samples.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    pub sampled: u64,
    pub acked: u64,
    pub dropped: u64,
    pub unacked: u64,
}

/// SIGTERMs an agent, waits for it, and parses its summary line.
pub async fn stop_agent(child: Child, what: &str) -> Summary {
    sigterm(&child);
    let [sampled, acked, dropped, unacked] = summary(&wait_stdout(child, what).await);
    let s = Summary {
        sampled,
        acked,
        dropped,
        unacked,
    };
    assert_eq!(s.sampled, s.acked + s.dropped + s.unacked, "{what}: {s:?}");
    s
}

/// SIGTERMs every agent (`agents[i]` runs as `names[i]`), then checks each one's exit
/// summary: everything it sampled acked, nothing dropped or left unacked. Returns what
/// each sampled.
pub async fn stop_agents(agents: impl IntoIterator<Item = Child>, names: &[&str]) -> Vec<u64> {
    let agents: Vec<Child> = agents.into_iter().collect();
    for a in &agents {
        sigterm(a);
    }
    let mut sampled = Vec::new();
    for (a, name) in agents.into_iter().zip(names) {
        let [s, acked, dropped, unacked] = summary(&wait_stdout(a, name).await);
        assert_eq!(
            (acked, dropped, unacked),
            (s, 0, 0),
            "{name}: everything sampled must be acked"
        );
        sampled.push(s);
    }
    sampled
}

/// Waits (bounded: the bound only fails a hung run) until every node has stored at least
/// `min` GPU samples, per the API.
pub async fn wait_stored(http: &str, nodes: &[&str], min: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(resp) = reqwest::get(format!("http://{http}/api/v1/nodes")).await
            && let Ok(v) = resp.json::<serde_json::Value>().await
        {
            let ok = nodes.iter().all(|n| {
                v.as_array()
                    .into_iter()
                    .flatten()
                    .any(|x| x["name"] == *n && x["stored_samples"].as_u64().unwrap_or(0) >= min)
            });
            if ok {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "nodes {nodes:?} did not store {min} samples in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
