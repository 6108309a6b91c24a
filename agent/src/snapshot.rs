//! `gpufleet-agent snapshot`: one local reading, as an nvidia-smi / gpustat-style table or
//! as JSON (`{"inventory": …, "tick": …}`, the core types' serde form: absent is `null`).

use gpufleet_core::SourceError;
use gpufleet_core::{Inventory, Tick, WorkloadKind};
use gpufleet_uplink::sampler::Sampler;
use std::fmt::Write as _;
use std::time::Duration;

/// How the two readings of a snapshot are spaced.
#[derive(Debug, Clone, Copy)]
pub enum Spacing {
    /// Simulated time: the readings are 1 s apart without waiting.
    Simulated,
    /// Real time: wait this long between the readings (rates need two).
    Wait(Duration),
}

/// Takes a snapshot: the inventory and the second of two readings (so rates, CPU % and
/// per-process utilization cover a real interval), with the first's health counters.
pub fn take(
    sampler: &mut Sampler,
    now_ms: i64,
    spacing: Spacing,
) -> Result<(Inventory, Tick), SourceError> {
    let inventory = sampler.inventory()?;
    let (first, mut tick) = match spacing {
        Spacing::Simulated => (sampler.sample(now_ms - 1000)?, sampler.sample(now_ms)?),
        Spacing::Wait(d) => {
            let first = sampler.sample(now_ms)?;
            std::thread::sleep(d);
            let later = gpufleet_core::config::now_ms().max(now_ms + 1);
            (first, sampler.sample(later)?)
        }
    };
    // Health counters are read on the first reading (then every health interval).
    if tick.health.is_empty() {
        tick.health = first.health;
    }
    Ok((inventory, tick))
}

/// The JSON form.
pub fn to_json(inventory: &Inventory, tick: &Tick) -> Result<String, serde_json::Error> {
    serde_json::to_string_pretty(&serde_json::json!({ "inventory": inventory, "tick": tick }))
}

const NA: &str = "n/a";
const MIB: u64 = 1 << 20;

fn or_na<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| NA.to_owned(), |v| v.to_string())
}

fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

/// The table form: a header line, one row per GPU, then the processes.
pub fn to_table(inv: &Inventory, tick: &Tick) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}  driver {}  CUDA {}  {}",
        inv.host.hostname,
        inv.driver_version.as_deref().unwrap_or(NA),
        inv.cuda_driver_version.as_deref().unwrap_or(NA),
        gpufleet_core::config::format_time(tick.time_ms)
    );
    if let Some(h) = &tick.host {
        let gib = |b: Option<u64>| or_na(b.map(|b| b >> 30));
        let _ = writeln!(
            out,
            "host  cpu {}  mem {} / {} GiB  load {}",
            or_na(h.cpu_util_pct.map(|c| format!("{c:.0}%"))),
            gib(h.mem_used_bytes),
            gib(h.mem_total_bytes),
            or_na(h.load1.map(|l| format!("{l:.2}")))
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:>3}  {:<24} {:>5} {:>5} {:>6} {:>6} {:>5}  {:>17}  {:>11}  {:<6} {:>4}",
        "GPU",
        "NAME",
        "TEMP",
        "UTIL",
        "SMACT",
        "TENSOR",
        "DRAM",
        "MEMORY (MiB)",
        "POWER (W)",
        "PSTATE",
        "FAN"
    );
    for g in &tick.gpus {
        let info = inv.gpus.iter().find(|i| i.uuid == g.gpu_uuid);
        let name = info.map_or(g.gpu_uuid.as_str(), |i| i.name.as_str());
        let memory = format!(
            "{} / {}",
            or_na(g.mem_used_bytes.map(|b| b / MIB)),
            or_na(g.mem_total_bytes.map(|b| b / MIB))
        );
        let power = format!(
            "{} / {}",
            or_na(g.power_mw.map(|p| (p + 500) / 1000)),
            or_na(g.power_limit_mw.map(|p| (p + 500) / 1000))
        );
        // GPM (Hopper and newer): SMs active, tensor-core activity, DRAM bandwidth.
        let cpct = |v: Option<u32>| or_na(v.map(|c| format!("{:.0}%", f64::from(c) / 100.0)));
        let _ = writeln!(
            out,
            "{:>3}  {:<24} {:>5} {:>5} {:>6} {:>6} {:>5}  {:>17}  {:>11}  {:<6} {:>4}",
            or_na(info.map(|i| i.index)),
            truncate(name, 24),
            or_na(g.temp_gpu_c.map(|t| format!("{t}C"))),
            or_na(g.util_gpu_pct.map(|u| format!("{u}%"))),
            cpct(g.gpm.sm_active_cpct),
            cpct(g.gpm.tensor_active_cpct),
            cpct(g.gpm.dram_bw_cpct),
            memory,
            power,
            or_na(g.pstate.map(|p| format!("P{p}"))),
            or_na(g.fan_pct.map(|f| format!("{f}%"))),
        );
    }
    let _ = writeln!(out);
    if tick.processes.is_empty() {
        let _ = writeln!(out, "No running processes found");
        return out;
    }
    let _ = writeln!(
        out,
        "{:>3}  {:>8}  {:<10} {:<44} {:>9} {:>4}  COMMAND",
        "GPU", "PID", "USER", "WORKLOAD", "GPU MEM", "SM"
    );
    for p in &tick.processes {
        let index = inv
            .gpus
            .iter()
            .find(|i| i.uuid == p.gpu_uuid)
            .map(|i| i.index);
        let w = &p.workload;
        let workload = match (w.kind, &w.pod_name) {
            (WorkloadKind::Container, Some(pod)) => {
                let ns = w.namespace.as_deref().unwrap_or("?");
                match &w.container_name {
                    Some(c) => format!("pod {ns}/{pod} {c}"),
                    None => format!("pod {ns}/{pod}"),
                }
            }
            (WorkloadKind::Slurm, _) => {
                let mut s = format!("slurm job {}", w.job_id.as_deref().unwrap_or("?"));
                for part in [&w.job_name, &w.account].into_iter().flatten() {
                    s.push(' ');
                    s.push_str(part);
                }
                if let Some(step) = &w.step {
                    s.push_str(&format!(" step {step}"));
                }
                s
            }
            (kind, _) => format!("{} {}", kind.as_str(), w.label()),
        };
        let _ = writeln!(
            out,
            "{:>3}  {:>8}  {:<10} {:<44} {:>9} {:>4}  {}",
            or_na(index),
            p.pid,
            truncate(p.user.as_deref().unwrap_or(NA), 10),
            truncate(&workload, 44),
            or_na(p.gpu_mem_bytes.map(|b| format!("{}MiB", b / MIB))),
            or_na(p.sm_util_pct.map(|u| format!("{u}%"))),
            truncate(p.command.as_deref().unwrap_or(NA), 80),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufleet_sim::{SimOptions, simulator};

    #[test]
    fn table_shows_every_gpu_and_na_for_absent_values() {
        let sim = simulator(SimOptions::new("snap-node", 3)).expect("sim");
        let mut sampler = Sampler::new(Box::new(sim), None);
        let (inv, mut tick) =
            take(&mut sampler, 1_790_000_000_000, Spacing::Simulated).expect("snapshot");
        tick.gpus[1].temp_gpu_c = None;
        let table = to_table(&inv, &tick);
        assert!(
            table.starts_with("snap-node  driver 550.54.15  CUDA 12.4"),
            "{table}"
        );
        let rows: Vec<&str> = table
            .lines()
            .filter(|l| {
                l.trim_start().starts_with(|c: char| c.is_ascii_digit()) && l.contains("NVIDIA")
            })
            .collect();
        assert_eq!(rows.len(), 3, "{table}");
        assert!(
            rows.iter().all(|r| r.trim_end().ends_with("n/a")),
            "no fan on datacenter boards:\n{table}"
        );
        assert!(
            rows[1].contains(" n/a "),
            "absent temperature shown as n/a:\n{table}"
        );
        let json = to_json(&inv, &tick).expect("json");
        let v: serde_json::Value = serde_json::from_str(&json).expect("parses");
        assert!(v["tick"]["gpus"][0]["fan_pct"].is_null());
        // GPM in the JSON, null where the model has none (absent is not zero).
        for (g, json) in tick
            .gpus
            .iter()
            .zip(v["tick"]["gpus"].as_array().expect("gpus"))
        {
            let tensor = &json["gpm"]["tensor_active_cpct"];
            match g.gpm.tensor_active_cpct {
                Some(t) => assert_eq!(tensor.as_u64(), Some(u64::from(t))),
                None => assert!(tensor.is_null(), "{json}"),
            }
        }
        assert_eq!(v["inventory"]["gpus"].as_array().map(Vec::len), Some(3));
    }

    #[test]
    fn truncation_marks_what_was_cut() {
        assert_eq!(truncate("abcdef", 4), "abc…");
        assert_eq!(truncate("abc", 4), "abc");
    }
}
