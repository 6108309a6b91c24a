//! The GPU models the simulator knows, with the static facts NVML would report for them
//! and the physical constants that shape their readings.

/// One GPU product as a simulated node carries it (nodes are homogeneous, like real ones).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuModel {
    /// Short name used in scenario files (`model = "h100-sxm"`).
    pub key: &'static str,
    /// The product name NVML reports.
    pub name: &'static str,
    /// NVML's architecture name.
    pub architecture: &'static str,
    /// Framebuffer size NVML reports as total.
    pub memory_bytes: u64,
    /// Memory the driver reserves (`nvmlMemory_v2_t.reserved`); never usable by processes.
    pub reserved_bytes: u64,
    /// Default (and maximum) power limit.
    pub tdp_w: u32,
    /// Lowest power limit an administrator may set.
    pub min_limit_w: u32,
    /// Typical draw with nothing running, in P8 (each board varies a few percent).
    pub idle_w: f64,
    /// Highest SM / graphics clock.
    pub max_sm_mhz: u32,
    /// SM clock in P8.
    pub idle_sm_mhz: u32,
    /// Memory clock in P0.
    pub max_mem_mhz: u32,
    /// Memory clock in P8 (HBM boards keep it; GDDR boards drop it).
    pub idle_mem_mhz: u32,
    /// NVLink links per GPU (0: none; NVLink metrics are then absent).
    pub nvlinks: u32,
    /// Bandwidth of one link in one direction, bytes/s.
    pub nvlink_link_bps: u64,
    /// PCIe generation of the slot.
    pub pcie_gen: u32,
    /// Usable PCIe bandwidth in one direction, bytes/s (x16).
    pub pcie_bps: u64,
    /// Actively cooled boards report a fan; passively cooled SXM/PCIe datacenter boards
    /// answer NOT_SUPPORTED, which the simulator reproduces as an absent value.
    pub has_fan: bool,
    /// Whether `NVML_FI_DEV_POWER_INSTANT` is supported (absent otherwise).
    pub has_power_instant: bool,
    /// Whether a memory temperature sensor is exposed (HBM boards; absent on GDDR).
    pub has_mem_temp: bool,
    /// Whether MIG exists on the product (`mig_enabled` is absent otherwise).
    pub mig_capable: bool,
    /// Whether the product has GPU Performance Monitoring (Hopper and newer: compute
    /// capability 9.0 and up); every GPM metric is absent otherwise, never 0.
    pub gpm: bool,
    /// CUDA compute capability.
    pub compute_capability: (u32, u32),
    /// VBIOS version string.
    pub vbios: &'static str,
    /// Steady-state degrees above inlet air per watt drawn.
    pub c_per_w: f64,
    /// GPU temperature where the driver starts slowing clocks.
    pub slowdown_c: f64,
    /// PCI bus numbers of the GPU slots in the usual chassis for this model.
    pub bus_ids: &'static [u8],
    /// Logical CPUs of the usual host for this model.
    pub host_cpus: u32,
    /// Memory of the usual host for this model.
    pub host_memory_bytes: u64,
    /// Relative frequency when a node's model is drawn from the seed (0: only by name).
    pub weight: u32,
}

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Every model the simulator can play.
pub const MODELS: &[GpuModel] = &[
    GpuModel {
        key: "h100-sxm",
        name: "NVIDIA H100 80GB HBM3",
        architecture: "Hopper",
        memory_bytes: 81_559 * MIB,
        reserved_bytes: 579 * MIB,
        tdp_w: 700,
        min_limit_w: 200,
        idle_w: 72.0,
        max_sm_mhz: 1980,
        idle_sm_mhz: 345,
        max_mem_mhz: 2619,
        idle_mem_mhz: 2619,
        nvlinks: 18,
        nvlink_link_bps: 25_000_000_000,
        pcie_gen: 5,
        pcie_bps: 55_000_000_000,
        has_fan: false,
        has_power_instant: true,
        has_mem_temp: true,
        mig_capable: true,
        gpm: true,
        compute_capability: (9, 0),
        vbios: "96.00.99.00.01",
        c_per_w: 0.062,
        slowdown_c: 87.0,
        bus_ids: &[0x1B, 0x43, 0x52, 0x61, 0x9D, 0xC3, 0xD1, 0xDF],
        host_cpus: 224,
        host_memory_bytes: 2048 * GIB,
        weight: 45,
    },
    GpuModel {
        key: "a100-sxm4-40gb",
        name: "NVIDIA A100-SXM4-40GB",
        architecture: "Ampere",
        memory_bytes: 40_960 * MIB,
        reserved_bytes: 255 * MIB,
        tdp_w: 400,
        min_limit_w: 100,
        idle_w: 54.0,
        max_sm_mhz: 1410,
        idle_sm_mhz: 210,
        max_mem_mhz: 1215,
        idle_mem_mhz: 1215,
        nvlinks: 12,
        nvlink_link_bps: 25_000_000_000,
        pcie_gen: 4,
        pcie_bps: 26_000_000_000,
        has_fan: false,
        has_power_instant: false,
        has_mem_temp: true,
        mig_capable: true,
        gpm: false,
        compute_capability: (8, 0),
        vbios: "92.00.45.00.03",
        c_per_w: 0.095,
        slowdown_c: 85.0,
        bus_ids: &[0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD],
        host_cpus: 256,
        host_memory_bytes: 1024 * GIB,
        weight: 35,
    },
    GpuModel {
        key: "l40s",
        name: "NVIDIA L40S",
        architecture: "Ada",
        memory_bytes: 46_068 * MIB,
        reserved_bytes: 467 * MIB,
        tdp_w: 350,
        min_limit_w: 100,
        idle_w: 36.0,
        max_sm_mhz: 2520,
        idle_sm_mhz: 210,
        max_mem_mhz: 9001,
        idle_mem_mhz: 405,
        nvlinks: 0,
        nvlink_link_bps: 0,
        pcie_gen: 4,
        pcie_bps: 26_000_000_000,
        has_fan: false,
        has_power_instant: true,
        has_mem_temp: false,
        mig_capable: false,
        gpm: false,
        compute_capability: (8, 9),
        vbios: "95.02.5D.00.02",
        c_per_w: 0.13,
        slowdown_c: 87.0,
        bus_ids: &[0x17, 0x31, 0x4B, 0x65, 0x98, 0xB1, 0xCA, 0xE3],
        host_cpus: 128,
        host_memory_bytes: 768 * GIB,
        weight: 20,
    },
    GpuModel {
        key: "rtx-a6000",
        name: "NVIDIA RTX A6000",
        architecture: "Ampere",
        memory_bytes: 49_140 * MIB,
        reserved_bytes: 347 * MIB,
        tdp_w: 300,
        min_limit_w: 100,
        idle_w: 22.0,
        max_sm_mhz: 2100,
        idle_sm_mhz: 210,
        max_mem_mhz: 8001,
        idle_mem_mhz: 405,
        nvlinks: 0,
        nvlink_link_bps: 0,
        pcie_gen: 4,
        pcie_bps: 26_000_000_000,
        has_fan: true,
        has_power_instant: false,
        has_mem_temp: false,
        mig_capable: false,
        gpm: false,
        compute_capability: (8, 6),
        vbios: "94.02.5C.00.02",
        c_per_w: 0.16,
        slowdown_c: 86.0,
        bus_ids: &[0x01, 0x21, 0x41, 0x61, 0x81, 0xA1, 0xC1, 0xE1],
        host_cpus: 64,
        host_memory_bytes: 256 * GIB,
        weight: 0,
    },
];

/// The model named `key`.
pub fn by_key(key: &str) -> Option<&'static GpuModel> {
    MODELS.iter().find(|m| m.key == key)
}

/// The keys scenario files may use, for error messages.
pub fn keys() -> String {
    MODELS.iter().map(|m| m.key).collect::<Vec<_>>().join(", ")
}

/// Picks a model by weight from a uniform draw `u` in `[0, 1)`.
pub fn pick(u: f64) -> &'static GpuModel {
    let total: u32 = MODELS.iter().map(|m| m.weight).sum();
    let mut target = u * f64::from(total);
    for m in MODELS {
        let w = f64::from(m.weight);
        if target < w {
            return m;
        }
        target -= w;
    }
    &MODELS[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_is_consistent() {
        for m in MODELS {
            assert!(
                m.idle_w > 0.0 && m.idle_w < f64::from(m.min_limit_w),
                "{}",
                m.key
            );
            assert!(m.min_limit_w < m.tdp_w, "{}", m.key);
            assert!(m.reserved_bytes < m.memory_bytes / 10, "{}", m.key);
            assert!(
                m.idle_sm_mhz < m.max_sm_mhz && m.idle_mem_mhz <= m.max_mem_mhz,
                "{}",
                m.key
            );
            assert_eq!(m.nvlinks == 0, m.nvlink_link_bps == 0, "{}", m.key);
            assert_eq!(
                m.gpm,
                m.compute_capability.0 >= 9,
                "{}: GPM comes with Hopper",
                m.key
            );
            assert_eq!(m.bus_ids.len(), 8, "{}", m.key);
            assert_eq!(by_key(m.key).map(|f| f.name), Some(m.name));
        }
        assert_eq!(pick(0.0).key, "h100-sxm");
        assert_eq!(
            pick(0.999_999).key,
            "l40s",
            "weight 0 models are never drawn"
        );
    }
}
