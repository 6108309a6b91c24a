//! Host metrics for real nodes, read from `/proc` (or any folder passed as `--proc-root`,
//! so fixtures exercise the same code): CPU %, memory, disk and network throughput, load.
//!
//! Rates (CPU %, bytes/s) need two readings: the first sample after start reports them
//! absent, as does any sample where a counter went backwards (a reset, a device removed).
//! Each metric is absent when its file cannot be read or parsed; nothing becomes 0.

use gpufleet_core::{HostInfo, HostSample, UnixMs};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Bytes per sector in `/proc/diskstats`, whatever the device's real sector size.
const DISKSTATS_SECTOR_BYTES: u64 = 512;

/// Reads host samples under one proc root, remembering the previous counters for rates.
#[derive(Debug)]
pub struct HostReader {
    /// Counters of the previous sample, to turn totals into rates.
    prev: Option<Counters>,
    /// `stat`, `diskstats`, `net/dev`, `meminfo`, `loadavg`: kept open and read again from
    /// offset 0 every tick (procfs regenerates the text on each read), so a tick costs no
    /// open/stat/close.
    files: [ProcFile; 5],
    /// The proc root, for the boot id.
    proc_root: PathBuf,
}

/// A `/proc` file kept open, and the buffer it is read into.
#[derive(Debug)]
struct ProcFile {
    /// Its path.
    path: PathBuf,
    /// The open file; `None` until opened, and after a failed read (opened again next time).
    file: Option<File>,
    /// Its text as last read.
    text: String,
}

impl ProcFile {
    /// The file's whole current text, or `None` when it cannot be read.
    fn read(&mut self) -> Option<&str> {
        if self.file.is_none() {
            self.file = File::open(&self.path).ok();
        }
        let file = self.file.as_ref()?;
        let mut buf = std::mem::take(&mut self.text).into_bytes();
        buf.clear();
        let mut chunk = [0u8; 4096];
        loop {
            match file.read_at(&mut chunk, buf.len() as u64) {
                Ok(0) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                Err(_) => {
                    self.file = None;
                    return None;
                }
            }
        }
        self.text = String::from_utf8(buf).ok()?;
        Some(&self.text)
    }
}

/// Cumulative counters at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Counters {
    /// When they were read.
    at_ms: UnixMs,
    /// `/proc/stat` totals.
    cpu: Option<CpuTimes>,
    /// Whole-disk byte totals.
    disk: Option<IoTotals>,
    /// Network byte totals over counted interfaces.
    net: Option<IoTotals>,
}

/// Aggregate CPU time from the `cpu` line of `/proc/stat`, in clock ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTimes {
    /// Ticks spent doing anything but idle and iowait.
    pub busy: u64,
    /// All ticks (busy + idle + iowait).
    pub total: u64,
}

/// Two monotonically increasing byte counters: read/write for disks, rx/tx for networks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoTotals {
    /// Bytes read (disks) or received (network).
    pub inbound: u64,
    /// Bytes written (disks) or transmitted (network).
    pub outbound: u64,
}

impl HostReader {
    /// A reader of `proc_root` (normally `/proc`).
    pub fn new(proc_root: impl Into<PathBuf>) -> Self {
        let proc_root = proc_root.into();
        let files = ["stat", "diskstats", "net/dev", "meminfo", "loadavg"].map(|name| ProcFile {
            path: proc_root.join(name),
            file: None,
            text: String::new(),
        });
        Self {
            prev: None,
            files,
            proc_root,
        }
    }

    /// The host sample at `now_ms`; rates are over the time since the previous call.
    pub fn sample(&mut self, now_ms: UnixMs) -> HostSample {
        let [stat, diskstats, net_dev, meminfo, loadavg] = &mut self.files;
        let now = Counters {
            at_ms: now_ms,
            cpu: stat.read().and_then(parse_cpu_times),
            disk: diskstats.read().and_then(parse_diskstats),
            net: net_dev.read().and_then(parse_net_dev),
        };
        let mem = meminfo.read().and_then(parse_meminfo);
        let load1 = loadavg.read().and_then(parse_loadavg);
        let prev = self.prev.replace(now);
        let elapsed_ms = prev.map(|p| now_ms - p.at_ms).filter(|ms| *ms > 0);

        let rates = |pick: fn(&Counters) -> Option<IoTotals>| -> (Option<u64>, Option<u64>) {
            match (prev.as_ref().and_then(pick), pick(&now), elapsed_ms) {
                (Some(a), Some(b), Some(ms)) => (
                    rate_per_s(a.inbound, b.inbound, ms),
                    rate_per_s(a.outbound, b.outbound, ms),
                ),
                _ => (None, None),
            }
        };
        let (disk_read_bps, disk_write_bps) = rates(|c| c.disk);
        let (net_rx_bps, net_tx_bps) = rates(|c| c.net);
        let cpu_util_pct = match (prev.and_then(|p| p.cpu), now.cpu) {
            (Some(a), Some(b)) => cpu_percent(a, b),
            _ => None,
        };
        HostSample {
            cpu_util_pct,
            mem_used_bytes: mem.map(|m| m.used),
            mem_total_bytes: mem.map(|m| m.total),
            disk_read_bps,
            disk_write_bps,
            net_rx_bps,
            net_tx_bps,
            load1,
        }
    }
}

impl gpufleet_core::HostSource for HostReader {
    fn sample(&mut self, now_ms: UnixMs) -> HostSample {
        HostReader::sample(self, now_ms)
    }

    fn boot_id(&self) -> Option<String> {
        boot_id(&self.proc_root)
    }
}

/// Static host facts for the inventory. `hostname` is the node name the agent reports.
pub fn host_info(proc_root: &Path, hostname: &str) -> HostInfo {
    let read = |name: &str| std::fs::read_to_string(proc_root.join(name)).ok();
    HostInfo {
        hostname: hostname.to_owned(),
        kernel: read("sys/kernel/osrelease").map(|s| s.trim().to_owned()),
        os: std::fs::read_to_string("/etc/os-release")
            .ok()
            .as_deref()
            .and_then(parse_os_release),
        cpu_count: read("stat").as_deref().map(count_cpus).filter(|n| *n > 0),
        memory_total_bytes: read("meminfo")
            .as_deref()
            .and_then(parse_meminfo)
            .map(|m| m.total),
    }
}

/// The boot id (`<proc_root>/sys/kernel/random/boot_id`), which changes on every reboot.
pub fn boot_id(proc_root: &Path) -> Option<String> {
    std::fs::read_to_string(proc_root.join("sys/kernel/random/boot_id"))
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// The kernel's host name (`<proc_root>/sys/kernel/hostname`), else `$HOSTNAME`, else
/// this machine's, from gethostname(2) (uname's node name): a `--proc-root` without
/// `sys/kernel/hostname` still has one.
pub fn hostname(proc_root: &Path) -> Option<String> {
    std::fs::read_to_string(proc_root.join("sys/kernel/hostname"))
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .or_else(|| {
            let name = rustix::system::uname()
                .nodename()
                .to_string_lossy()
                .trim()
                .to_owned();
            (!name.is_empty()).then_some(name)
        })
}

/// `(b - a)` per second over `ms`; `None` when the counter went backwards.
fn rate_per_s(a: u64, b: u64, ms: i64) -> Option<u64> {
    let delta = b.checked_sub(a)?;
    Some((u128::from(delta) * 1000 / ms as u128).min(u128::from(u64::MAX)) as u64)
}

/// Busy share of all CPU time between two readings, in percent.
pub fn cpu_percent(a: CpuTimes, b: CpuTimes) -> Option<f32> {
    let total = b.total.checked_sub(a.total)?;
    let busy = b.busy.checked_sub(a.busy)?;
    if total == 0 || busy > total {
        return None;
    }
    Some((busy as f64 * 100.0 / total as f64) as f32)
}

/// Parses the aggregate `cpu` line of `/proc/stat`:
/// `cpu user nice system idle iowait irq softirq steal guest guest_nice`. Guest time is
/// already counted in user/nice, so it is left out of the total.
pub fn parse_cpu_times(stat: &str) -> Option<CpuTimes> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let values: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    if values.len() < 4 {
        return None;
    }
    let total: u64 = values.iter().sum();
    let idle = values[3] + values.get(4).copied().unwrap_or(0);
    Some(CpuTimes {
        busy: total - idle,
        total,
    })
}

/// Number of `cpuN` lines in `/proc/stat` (online CPUs).
pub fn count_cpus(stat: &str) -> u32 {
    stat.lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count() as u32
}

/// Memory from `/proc/meminfo`: total and used (`MemTotal - MemAvailable`), in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// `MemTotal`.
    pub total: u64,
    /// `MemTotal - MemAvailable`: what `free` calls used, excluding reclaimable cache.
    pub used: u64,
}

/// Parses `MemTotal` and `MemAvailable` (kB) from `/proc/meminfo`.
pub fn parse_meminfo(meminfo: &str) -> Option<Memory> {
    let field = |name: &str| -> Option<u64> {
        let line = meminfo.lines().find(|l| l.starts_with(name))?;
        let rest = line.strip_prefix(name)?.strip_prefix(':')?;
        let kb: u64 = rest.split_whitespace().next()?.parse().ok()?;
        kb.checked_mul(1024)
    };
    let total = field("MemTotal")?;
    let available = field("MemAvailable")?;
    Some(Memory {
        total,
        used: total.saturating_sub(available),
    })
}

/// Whether a `/proc/diskstats` device name is a whole physical disk (not a partition, a
/// loop/ram device, device-mapper or md, which would count the same bytes twice).
pub fn is_whole_disk(name: &str) -> bool {
    let digits_only = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let letters_only = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_lowercase());
    if let Some(rest) = name.strip_prefix("nvme") {
        // nvme<ctrl>n<ns>, not nvme<ctrl>n<ns>p<part>.
        return match rest.split_once('n') {
            Some((ctrl, ns)) => digits_only(ctrl) && digits_only(ns),
            None => false,
        };
    }
    if let Some(rest) = name.strip_prefix("mmcblk") {
        return digits_only(rest);
    }
    ["sd", "vd", "xvd", "hd"]
        .iter()
        .any(|p| name.strip_prefix(p).is_some_and(letters_only))
}

/// Sums bytes read and written by whole disks in `/proc/diskstats`.
pub fn parse_diskstats(diskstats: &str) -> Option<IoTotals> {
    let mut totals = IoTotals::default();
    let mut any = false;
    for line in diskstats.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // major minor name reads merged sectors_read ms writes merged sectors_written ...
        if f.len() < 10 || !is_whole_disk(f[2]) {
            continue;
        }
        let (Ok(read), Ok(written)) = (f[5].parse::<u64>(), f[9].parse::<u64>()) else {
            continue;
        };
        totals.inbound = totals.inbound.saturating_add(read * DISKSTATS_SECTOR_BYTES);
        totals.outbound = totals
            .outbound
            .saturating_add(written * DISKSTATS_SECTOR_BYTES);
        any = true;
    }
    any.then_some(totals)
}

/// Whether a network interface carries the node's own traffic. Loopback and the virtual
/// interfaces of container networking (each packet also crosses a physical NIC, or never
/// leaves the host) are left out.
pub fn is_counted_interface(name: &str) -> bool {
    const VIRTUAL: [&str; 10] = [
        "veth", "docker", "br-", "cni", "flannel", "cali", "virbr", "tunl", "vxlan", "kube-",
    ];
    name != "lo" && !VIRTUAL.iter().any(|p| name.starts_with(p))
}

/// Sums received and transmitted bytes over counted interfaces in `/proc/net/dev`.
pub fn parse_net_dev(net_dev: &str) -> Option<IoTotals> {
    let mut totals = IoTotals::default();
    let mut any = false;
    for line in net_dev.lines() {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        let name = name.trim();
        if !is_counted_interface(name) {
            continue;
        }
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() < 9 {
            continue;
        }
        let (Ok(rx), Ok(tx)) = (f[0].parse::<u64>(), f[8].parse::<u64>()) else {
            continue;
        };
        totals.inbound = totals.inbound.saturating_add(rx);
        totals.outbound = totals.outbound.saturating_add(tx);
        any = true;
    }
    any.then_some(totals)
}

/// The 1-minute load average from `/proc/loadavg`.
pub fn parse_loadavg(loadavg: &str) -> Option<f32> {
    loadavg
        .split_whitespace()
        .next()?
        .parse::<f32>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
}

/// `PRETTY_NAME` from an os-release file.
pub fn parse_os_release(content: &str) -> Option<String> {
    let line = content.lines().find(|l| l.starts_with("PRETTY_NAME="))?;
    let v = line
        .trim_start_matches("PRETTY_NAME=")
        .trim()
        .trim_matches('"');
    (!v.is_empty()).then(|| v.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT_A: &str = "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 50 0 25 400 25 0 0 0 0 0\ncpu1 50 0 25 400 25 0 0 0 0 0\nintr 1 2\n";
    const STAT_B: &str = "cpu  160 0 90 1100 50 0 0 0 0 0\ncpu0 80 0 45 550 25 0 0 0 0 0\ncpu1 80 0 45 550 25 0 0 0 0 0\n";

    #[test]
    fn cpu_percent_is_busy_share_of_the_delta() {
        let a = parse_cpu_times(STAT_A).expect("parses");
        assert_eq!(
            a,
            CpuTimes {
                busy: 150,
                total: 1000
            }
        );
        let b = parse_cpu_times(STAT_B).expect("parses");
        // busy +100 of total +400
        assert_eq!(cpu_percent(a, b), Some(25.0));
        assert_eq!(
            cpu_percent(b, a),
            None,
            "counters going backwards give no rate"
        );
        assert_eq!(count_cpus(STAT_A), 2);
        assert_eq!(parse_cpu_times("intr 1 2\n"), None);
        assert_eq!(parse_cpu_times("cpu  1 x 3 4\n"), None);
    }

    #[test]
    fn meminfo_used_is_total_minus_available() {
        let m = "MemTotal:       16384000 kB\nMemFree:         1000000 kB\nMemAvailable:    4096000 kB\n";
        assert_eq!(
            parse_meminfo(m),
            Some(Memory {
                total: 16_384_000 * 1024,
                used: 12_288_000 * 1024
            })
        );
        assert_eq!(
            parse_meminfo("MemTotal: 10 kB\n"),
            None,
            "no MemAvailable: absent"
        );
    }

    #[test]
    fn diskstats_counts_whole_disks_only() {
        let d = "\
   8       0 sda 100 0 2000 10 50 0 1000 5 0 0 0\n\
   8       1 sda1 100 0 2000 10 50 0 1000 5 0 0 0\n\
 259       0 nvme0n1 10 0 100 1 20 0 300 1 0 0 0\n\
 259       1 nvme0n1p1 10 0 100 1 20 0 300 1 0 0 0\n\
   7       0 loop0 999 0 99999 1 0 0 0 0 0 0 0\n\
 253       0 dm-0 999 0 99999 1 0 0 0 0 0 0 0\n";
        assert_eq!(
            parse_diskstats(d),
            Some(IoTotals {
                inbound: (2000 + 100) * 512,
                outbound: (1000 + 300) * 512
            })
        );
        for whole in ["sda", "vdb", "xvdaa", "nvme12n3", "mmcblk0"] {
            assert!(is_whole_disk(whole), "{whole}");
        }
        for part in [
            "sda1",
            "nvme0n1p2",
            "mmcblk0p1",
            "loop3",
            "dm-1",
            "md0",
            "sr0",
            "nvme0",
        ] {
            assert!(!is_whole_disk(part), "{part}");
        }
        assert_eq!(parse_diskstats("   7 0 loop0 1 2 3 4 5 6 7 8 9 10\n"), None);
    }

    #[test]
    fn net_dev_excludes_loopback_and_container_plumbing() {
        let n = "Inter-|   Receive                                                |  Transmit\n \
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
lo: 5000 50 0 0 0 0 0 0 5000 50 0 0 0 0 0 0\n  \
eth0: 1000 10 0 0 0 0 0 0 2000 20 0 0 0 0 0 0\n  \
ib0: 300 3 0 0 0 0 0 0 400 4 0 0 0 0 0 0\n\
veth1a2b: 777 7 0 0 0 0 0 0 888 8 0 0 0 0 0 0\n";
        assert_eq!(
            parse_net_dev(n),
            Some(IoTotals {
                inbound: 1300,
                outbound: 2400
            })
        );
    }

    #[test]
    fn loadavg_and_os_release() {
        assert_eq!(parse_loadavg("0.52 0.58 0.59 2/1234 5678\n"), Some(0.52));
        assert_eq!(parse_loadavg(""), None);
        assert_eq!(
            parse_os_release("NAME=\"Ubuntu\"\nPRETTY_NAME=\"Ubuntu 22.04.4 LTS\"\n").as_deref(),
            Some("Ubuntu 22.04.4 LTS")
        );
    }

    fn write(dir: &Path, name: &str, content: &str) {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        std::fs::write(path, content).expect("write fixture");
    }

    #[test]
    fn reader_reports_rates_from_the_second_sample_and_absent_for_missing_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        write(root, "stat", STAT_A);
        write(root, "meminfo", "MemTotal: 1000 kB\nMemAvailable: 250 kB\n");
        write(
            root,
            "net/dev",
            "h\nh\n eth0: 1000 0 0 0 0 0 0 0 500 0 0 0 0 0 0 0\n",
        );
        let mut r = HostReader::new(root);
        let first = r.sample(10_000);
        assert_eq!(first.cpu_util_pct, None, "no rate from one reading");
        assert_eq!(first.net_rx_bps, None);
        assert_eq!(first.mem_used_bytes, Some(750 * 1024));
        assert_eq!(first.disk_read_bps, None, "no diskstats file");
        assert_eq!(first.load1, None, "no loadavg file");

        write(root, "stat", STAT_B);
        write(
            root,
            "net/dev",
            "h\nh\n eth0: 3000 0 0 0 0 0 0 0 1500 0 0 0 0 0 0 0\n",
        );
        let second = r.sample(12_000);
        assert_eq!(second.cpu_util_pct, Some(25.0));
        assert_eq!(second.net_rx_bps, Some(1000));
        assert_eq!(second.net_tx_bps, Some(500));
        assert_eq!(second.disk_write_bps, None);
        // Files are kept open between ticks; one missing until now is opened when it appears.
        write(root, "loadavg", "0.50 0.40 0.30 1/100 42\n");
        assert_eq!(r.sample(14_000).load1, Some(0.5), "read once it exists");

        write(
            root,
            "sys/kernel/random/boot_id",
            "35099d77-5d43-4c0a-9fee-dbbc0cd8c0a8\n",
        );
        assert_eq!(
            boot_id(root).as_deref(),
            Some("35099d77-5d43-4c0a-9fee-dbbc0cd8c0a8")
        );
        let info = host_info(root, "gpu-node-7");
        assert_eq!(info.hostname, "gpu-node-7");
        assert_eq!(info.cpu_count, Some(2));
        assert_eq!(info.memory_total_bytes, Some(1000 * 1024));
        assert_eq!(info.kernel, None);
    }
}
