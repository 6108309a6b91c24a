//! `gpufleet-agent exec` end to end, through the binary it runs (`gpufleet-exec`, which
//! takes the same arguments): the real binary runs a real command under the
//! seeded simulator; the report's energy is checked against the simulator's own energy
//! counters, recomputed here by replaying a second simulator with the same seed at the
//! sample times the report lists.

use gpufleet_core::GpuSource;
use gpufleet_report::Report;
use gpufleet_sim::{SimOptions, simulator};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_gpufleet-exec");

fn exec(dir: &std::path::Path, extra: &[&str], command: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args([
        "--simulate",
        "--sim-gpus",
        "2",
        "--sim-seed",
        "7",
        "--node",
        "n1",
    ])
    .args(["--all-gpus", "--interval", "200ms"])
    .args(extra)
    .arg("--report")
    .arg(dir.join("report.json"))
    .arg("--plot")
    .arg(dir.join("plot.png"))
    .arg("--")
    .args(command)
    .env("RUST_LOG", "info")
    .stdin(Stdio::null());
    cmd
}

fn read_report(dir: &std::path::Path) -> Report {
    let text = std::fs::read_to_string(dir.join("report.json")).expect("the report file");
    serde_json::from_str(&text).expect("the report is JSON")
}

#[test]
fn energy_equals_the_simulator_counters_over_the_run_and_the_exit_code_is_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = exec(
        dir.path(),
        &["--carbon-g-per-kwh", "200", "--pue", "1.5"],
        &["sh", "-c", "sleep 3; exit 3"],
    )
    .output()
    .expect("run exec");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("GPU energy"),
        "the table is printed: {stderr}"
    );
    let r = read_report(dir.path());
    assert_eq!(r.subject.kind, "command");
    assert_eq!(r.subject.exit_code, Some(3));
    assert_eq!(r.gpus.len(), 2);
    let elapsed = r.elapsed_s.expect("elapsed");
    assert!((3.0..10.0).contains(&elapsed), "{elapsed}");
    // Every sample time, from the series (one point per sample without --series-step).
    let times: Vec<i64> = r.series[0].points.iter().map(|p| p.time_ms).collect();
    assert!(
        times.len() >= 10,
        "{} samples in 3 s at 200 ms",
        times.len()
    );
    assert_eq!(r.series[1].points.len(), times.len());
    // Replay: the same simulator, sampled at the same times.
    let mut sim = simulator(SimOptions {
        seed: Some(7),
        ..SimOptions::new("n1", 2)
    })
    .expect("simulator");
    let mut first = None;
    let mut last = None;
    for &t in &times {
        let tick = sim.sample(t).expect("sample");
        let e: Vec<u64> = tick
            .gpus
            .iter()
            .map(|g| g.energy_mj.expect("the simulator has an energy counter"))
            .collect();
        first.get_or_insert(e.clone());
        last = Some(e);
    }
    let (first, last) = (first.expect("first"), last.expect("last"));
    let expected_mj: u64 = first.iter().zip(&last).map(|(a, b)| b - a).sum();
    assert!(expected_mj > 0);
    let got_mj = (r.energy.energy_j.expect("energy") * 1000.0).round() as u64;
    assert_eq!(got_mj, expected_mj, "report energy vs counter delta");
    assert_eq!(r.energy.counter_share, Some(1.0));
    // Static intensity: carbon = kWh × 200 g/kWh × PUE 1.5.
    let kwh = expected_mj as f64 / 3.6e9;
    let carbon = r.carbon.carbon_g.expect("carbon");
    assert!(
        (carbon - kwh * 300.0).abs() < 1e-9 * carbon.max(1.0),
        "{carbon} vs {}",
        kwh * 300.0
    );
    assert_eq!(r.carbon.pue, Some(1.5));
    assert_eq!(r.carbon.sources, ["static"]);
    assert!(r.metrics.power_avg_w.is_some() && r.metrics.util_gpu_avg_pct.is_some());
    let png = std::fs::read(dir.path().join("plot.png")).expect("the plot");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn sigterm_is_forwarded_and_the_report_still_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = exec(dir.path(), &[], &["sleep", "30"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn exec");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    // Wait until the command runs.
    loop {
        let line = lines
            .next()
            .expect("exec ended early")
            .expect("stderr line");
        if line.contains("command started") {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    let pid = child.id().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(Instant::now() < deadline, "exec did not end after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    // sleep died of the forwarded SIGTERM: 128 + 15.
    assert_eq!(status.code(), Some(143));
    let r = read_report(dir.path());
    assert_eq!(r.subject.exit_code, None);
    // Without a carbon provider the carbon figures are absent, not 0.
    assert_eq!(r.carbon.carbon_g, None);
    assert!(r.elapsed_s.expect("elapsed") < 20.0);
}

#[test]
fn simulate_without_all_gpus_and_unknown_report_extensions_are_refused() {
    let out = Command::new(BIN)
        .args(["--simulate", "--", "true"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--all-gpus"));
    let out = Command::new(BIN)
        .args([
            "--simulate",
            "--all-gpus",
            "--report",
            "r.xml",
            "--",
            "true",
        ])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains(".json, .yaml"));
    let out = Command::new(BIN)
        .args(["--simulate", "--all-gpus", "--", "/nonexistent/program"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot run"));
}
