//! Running the real binaries in tests: the collector on given (or ephemeral) ports, the
//! agent binary beside it, signals, and the agent's exit summary.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
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
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpufleet-collector"))
        .args(["serve", "--db", db_url, "--grpc-listen", grpc])
        .args(["--http-listen", http])
        .args(extra)
        .env("GPUFLEET_LOG", "warn")
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
