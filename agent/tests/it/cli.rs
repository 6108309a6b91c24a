//! The real `gpufleet-agent` binary: snapshot table and JSON, config file, and `run`
//! against an unreachable collector stopped by SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_gpufleet-agent");

/// The binary with a clean environment (no GPUFLEET_* from the caller).
fn agent() -> Command {
    let mut cmd = Command::new(BIN);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("GPUFLEET_") {
            cmd.env_remove(&k);
        }
    }
    cmd.env("GPUFLEET_LOG", "info");
    cmd
}

fn run_ok(cmd: &mut Command) -> String {
    let out: Output = cmd.output().expect("the agent binary runs");
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

fn gpu_rows(table: &str) -> Vec<&str> {
    table
        .lines()
        .filter(|l| {
            l.trim_start().starts_with(|c: char| c.is_ascii_digit()) && l.contains("NVIDIA")
        })
        .collect()
}

#[test]
fn snapshot_table_lists_each_simulated_gpu_with_na_for_the_fan() {
    let table = run_ok(agent().args([
        "snapshot",
        "--simulate",
        "--sim-gpus",
        "2",
        "--node",
        "cli-node",
    ]));
    assert!(
        table.contains("cli-node")
            && table.contains("driver 550.54.15")
            && table.contains("CUDA 12.4"),
        "{table}"
    );
    assert!(table.contains("FAN"), "{table}");
    let rows = gpu_rows(&table);
    assert_eq!(rows.len(), 2, "{table}");
    for row in rows {
        assert!(
            row.trim_end().ends_with("n/a"),
            "fan absent on datacenter boards: {row}"
        );
        assert!(
            row.contains('%') && row.contains(" / "),
            "util, memory and power shown: {row}"
        );
    }
}

#[test]
fn snapshot_json_parses_and_keeps_absent_values_null() {
    let out = run_ok(agent().args([
        "snapshot",
        "--simulate",
        "--sim-gpus",
        "2",
        "--json",
        "--node",
        "cli-node",
    ]));
    let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
    let gpus = v["tick"]["gpus"].as_array().expect("tick.gpus");
    assert_eq!(gpus.len(), 2);
    for g in gpus {
        assert!(g["fan_pct"].is_null(), "absent fan is null, not 0: {g}");
        assert!(g["power_mw"].as_u64().is_some_and(|p| p > 0), "{g}");
        assert!(g["energy_mj"].as_u64().is_some_and(|e| e > 0), "{g}");
    }
    assert_eq!(v["inventory"]["gpus"].as_array().map(Vec::len), Some(2));
    assert_eq!(v["inventory"]["host"]["hostname"], "cli-node");
}

#[test]
fn a_zero_health_interval_is_refused_naming_the_flag() {
    let out = agent()
        .args(["snapshot", "--simulate", "--health-interval", "0s"])
        .output()
        .expect("the agent binary runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--health-interval") && err.contains("more than 0"),
        "{err}"
    );
    // A snapshot shows the health counters (read on its first reading) and the
    // inventory's temperature thresholds.
    let out = run_ok(agent().args(["snapshot", "--simulate", "--sim-gpus", "1", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
    assert_eq!(v["tick"]["health"].as_array().map(Vec::len), Some(1), "{v}");
    assert!(v["inventory"]["gpus"][0]["temp_slowdown_c"].is_u64());
}

#[test]
fn snapshot_needs_no_node_name_nor_a_hostname_file() {
    // A --proc-root without sys/kernel/hostname, no $HOSTNAME, no --node: the table is
    // labelled with this machine's name from gethostname(2).
    let empty = tempfile::tempdir().expect("tempdir");
    let out = run_ok(
        agent()
            .args(["snapshot", "--simulate", "--sim-gpus", "1", "--json"])
            .arg("--proc-root")
            .arg(empty.path())
            .env_remove("HOSTNAME"),
    );
    let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
    let uname = rustix::system::uname();
    let machine = uname.nodename().to_string_lossy();
    assert!(!machine.is_empty());
    assert_eq!(v["inventory"]["host"]["hostname"], machine.as_ref());
    assert_eq!(v["tick"]["gpus"].as_array().map(Vec::len), Some(1));
}

#[test]
fn config_file_supplies_flags_and_rejects_unknown_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = dir.path().join("agent.toml");
    std::fs::write(
        &good,
        "node = \"from-file\"\n[snapshot]\nsimulate = true\nsim_gpus = 3\n",
    )
    .expect("write");
    let table = run_ok(agent().args(["snapshot"]).arg("--config").arg(&good));
    assert_eq!(gpu_rows(&table).len(), 3, "{table}");
    assert!(table.starts_with("from-file"), "{table}");
    // The command line wins over the file.
    let table = run_ok(
        agent()
            .args(["snapshot", "--sim-gpus", "1"])
            .arg("--config")
            .arg(&good),
    );
    assert_eq!(gpu_rows(&table).len(), 1, "{table}");

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "simulat = true\n").expect("write");
    let out = agent()
        .args(["snapshot"])
        .arg("--config")
        .arg(&bad)
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown key `simulat`"), "{err}");
}

/// Waits for a stderr line containing `needle`, forwarding what it reads; panics after
/// `timeout`.
fn wait_for_log(
    child: &mut Child,
    needle: &'static str,
    timeout: Duration,
) -> mpsc::Receiver<String> {
    let stderr = child.stderr.take().expect("stderr piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + timeout;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return rx,
            Ok(line) => seen.push(line),
            Err(_) => panic!(
                "no {needle:?} in the agent's log within {timeout:?}:\n{}",
                seen.join("\n")
            ),
        }
    }
}

#[test]
fn run_against_an_unreachable_collector_stops_on_sigterm_with_a_consistent_summary() {
    let spool = tempfile::tempdir().expect("tempdir");
    let mut child = agent()
        .args([
            "run",
            "--collector",
            "http://127.0.0.1:1",
            "--simulate",
            "--sim-gpus",
            "2",
            "--node",
            "cli-run",
            "--interval",
            "50ms",
            "--shutdown-timeout",
            "300ms",
        ])
        .arg("--spool-dir")
        .arg(spool.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the agent");
    // Signal handlers are installed before this line is logged.
    let _log = wait_for_log(&mut child, "agent running", Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(500));
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the agent did not exit within 30 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    assert!(out.status.success(), "exit status {:?}", out.status);
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "exactly one line on stdout: {stdout:?}");
    let fields: Vec<(&str, u64)> = lines[0]
        .strip_prefix("summary ")
        .expect("summary line")
        .split(' ')
        .map(|kv| {
            let (k, v) = kv.split_once('=').expect("k=v");
            (k, v.parse().expect("a number"))
        })
        .collect();
    let names: Vec<&str> = fields.iter().map(|f| f.0).collect();
    assert_eq!(names, ["sampled", "acked", "dropped", "unacked"]);
    let [sampled, acked, dropped, unacked] = [fields[0].1, fields[1].1, fields[2].1, fields[3].1];
    assert_eq!(sampled, acked + dropped + unacked, "{stdout}");
    assert_eq!(acked, 0, "nothing can be acked without a collector");
    assert!(
        sampled > 0 && sampled % 2 == 0,
        "whole ticks of 2 GPUs were sampled: {stdout}"
    );
}

#[test]
fn exec_runs_the_gpufleet_exec_beside_it_with_the_rest_of_the_command_line() {
    use std::os::unix::fs::PermissionsExt;
    // A copy of the agent beside a stand-in gpufleet-exec that prints its arguments and
    // leaves with code 7: what `exec` hands on, and that the exit code comes back.
    let dir = tempfile::tempdir().expect("tempdir");
    let agent_copy = dir.path().join("gpufleet-agent");
    std::fs::copy(BIN, &agent_copy).expect("copy the agent");
    let stand_in = dir.path().join("gpufleet-exec");
    std::fs::write(&stand_in, "#!/bin/sh\nprintf '%s|' \"$@\"\nexit 7\n").expect("write");
    std::fs::set_permissions(&stand_in, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let out = Command::new(&agent_copy)
        .args([
            "--config",
            "f.toml",
            "exec",
            "--all-gpus",
            "--",
            "train",
            "--help",
        ])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "--config|f.toml|--all-gpus|--|train|--help|"
    );
    // Without gpufleet-exec beside it nor on PATH, the error says what is missing.
    std::fs::remove_file(&stand_in).expect("rm");
    let out = Command::new(&agent_copy)
        .args(["exec", "--", "true"])
        .env("PATH", dir.path())
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs the gpufleet-exec binary"), "{err}");
}

#[test]
fn exec_never_runs_a_gpufleet_exec_from_the_current_directory() {
    use std::os::unix::fs::PermissionsExt;
    // PATH entries that name the current directory ("", ".", relative) are skipped: a
    // gpufleet-exec planted there must not run.
    let dir = tempfile::tempdir().expect("tempdir");
    let agent_copy = dir.path().join("bin").join("gpufleet-agent");
    std::fs::create_dir(dir.path().join("bin")).expect("mkdir");
    std::fs::copy(BIN, &agent_copy).expect("copy the agent");
    let planted = dir.path().join("gpufleet-exec");
    std::fs::write(&planted, "#!/bin/sh\necho planted\nexit 9\n").expect("write");
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    for path in ["", ".", "bin/..", ":"] {
        let out = Command::new(&agent_copy)
            .args(["exec", "--", "true"])
            .current_dir(dir.path())
            .env("PATH", path)
            .output()
            .expect("runs");
        assert_ne!(
            out.status.code(),
            Some(9),
            "PATH={path:?} ran the planted binary"
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("needs the gpufleet-exec binary"),
            "PATH={path:?}: {err}"
        );
    }
}

/// The real gpufleet-exec, which `cargo test --workspace` builds beside the agent.
fn exec_bin() -> std::path::PathBuf {
    let exec = std::path::Path::new(BIN).with_file_name("gpufleet-exec");
    assert!(
        exec.is_file(),
        "{} not found: build it first (`cargo test --workspace` builds every binary)",
        exec.display()
    );
    exec
}

#[test]
fn exec_hands_over_to_the_real_gpufleet_exec_with_the_config_file() {
    // The agent's config file serves exec: top-level keys and the [exec] table apply,
    // the other commands' tables are skipped. The command runs under the measure and
    // its exit code comes back; the agent's version tag does not reach the command.
    let exec = exec_bin();
    let dir = tempfile::tempdir().expect("tempdir");
    let report = dir.path().join("report.json");
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "simulate = true\nsim-gpus = 2\nsim-seed = 7\nnode = \"n-from-file\"\n\n\
             [run]\ncollector = [\"http://127.0.0.1:1\"]\n\n\
             [exec]\nall-gpus = true\ninterval = \"200ms\"\nreport = {:?}\n",
            report.display().to_string()
        ),
    )
    .expect("write config");
    let out = agent()
        .current_dir(dir.path())
        .arg("--config")
        .arg(&config)
        .args([
            "exec",
            "--",
            "sh",
            "-c",
            "sleep 0.5; test -z \"$GPUFLEET_EXEC_AGENT_VERSION\" && exit 3",
        ])
        .output()
        .expect("runs");
    assert_eq!(
        out.status.code(),
        Some(3),
        "the command's own exit code; stderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).expect("report written")).expect("json");
    let text = json.to_string();
    assert!(text.contains("n-from-file"), "node from the file: {text}");
    // An agent of another version is refused by gpufleet-exec.
    let out = Command::new(&exec)
        .env("GPUFLEET_EXEC_AGENT_VERSION", "0.0.0-other")
        .args(["--simulate", "--node", "n", "--", "true"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("install both from the same release"), "{err}");
}
