"""The peer of `gpufleet-agent run` in scripts/bench-agent: a plain pynvml monitoring loop
(nvidia-ml-py from PyPI) reading the agent's per-tick metric set every INTERVAL seconds,
on whatever libnvidia-ml.so.1 the dynamic loader finds (the bench points LD_LIBRARY_PATH
at a copy of the fake).

Per GPU and tick, like agent/src/nvml.rs: utilization, memory (v2), power, enforced power
limit, total energy, GPU temperature, fan, SM / memory / graphics clocks, performance
state, PCIe TX / RX, volatile ECC corrected / uncorrected, throttle reasons, encoder /
decoder utilization, one field-value batch (instant power, memory temperature, NVLink data
TX / RX summed and per active link), compute and graphics process lists and per-process
utilization since the previous call. Static facts (handles, active links) are read once.
A value the GPU does not support is absent (None), as in the agent.

usage: python bench-agent-pynvml.py INTERVAL_SECONDS
Runs until SIGTERM; prints the number of ticks it took on exit.
"""

import signal
import sys
import time

import pynvml as n

FI_POWER_INSTANT = 186
FI_MEMORY_TEMP = 82
FI_NVLINK_TX = 138
FI_NVLINK_RX = 139
ALL_LINKS = 0xFFFFFFFF
MAX_NVLINKS = 18


def maybe(fn, *args):
    """A value, or None when NVML cannot report it (absent is not zero)."""
    try:
        return fn(*args)
    except n.NVMLError:
        return None


def active_links(h):
    links = []
    for link in range(MAX_NVLINKS):
        try:
            if n.nvmlDeviceGetNvLinkState(h, link):
                links.append(link)
        except n.NVMLError:
            break
    return links


def sample_gpu(h, fields, last_ts):
    util = maybe(n.nvmlDeviceGetUtilizationRates, h)
    mem = maybe(n.nvmlDeviceGetMemoryInfo, h, n.nvmlMemory_v2)
    values = maybe(n.nvmlDeviceGetFieldValues, h, fields)
    fv = {}
    if values is not None:
        for (fid, scope), v in zip(fields, values):
            if v.nvmlReturn == n.NVML_SUCCESS:
                fv[(fid, scope)] = v.value.ullVal
    compute = maybe(n.nvmlDeviceGetComputeRunningProcesses, h) or []
    graphics = maybe(n.nvmlDeviceGetGraphicsRunningProcesses, h) or []
    try:
        putil = n.nvmlDeviceGetProcessUtilization(h, last_ts)
    except n.NVMLError:
        putil = []
    newest = max([p.timeStamp for p in putil], default=last_ts)
    by_pid = {p.pid: p for p in putil}
    procs = [
        (
            p.pid,
            p.usedGpuMemory,
            getattr(by_pid.get(p.pid), "smUtil", None),
            getattr(by_pid.get(p.pid), "memUtil", None),
        )
        for p in list(compute) + list(graphics)
    ]
    sample = {
        "util_gpu": util.gpu if util else None,
        "util_mem": util.memory if util else None,
        "mem_used": mem.used if mem else None,
        "mem_total": mem.total if mem else None,
        "power_mw": maybe(n.nvmlDeviceGetPowerUsage, h),
        "power_limit_mw": maybe(n.nvmlDeviceGetEnforcedPowerLimit, h),
        "energy_mj": maybe(n.nvmlDeviceGetTotalEnergyConsumption, h),
        "temp_gpu": maybe(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU),
        "fan": maybe(n.nvmlDeviceGetFanSpeed_v2, h, 0),
        "clock_sm": maybe(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM),
        "clock_mem": maybe(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_MEM),
        "clock_graphics": maybe(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_GRAPHICS),
        "pstate": maybe(n.nvmlDeviceGetPerformanceState, h),
        "pcie_tx": maybe(n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_TX_BYTES),
        "pcie_rx": maybe(n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_RX_BYTES),
        "ecc_corrected": maybe(
            n.nvmlDeviceGetTotalEccErrors,
            h,
            n.NVML_MEMORY_ERROR_TYPE_CORRECTED,
            n.NVML_VOLATILE_ECC,
        ),
        "ecc_uncorrected": maybe(
            n.nvmlDeviceGetTotalEccErrors,
            h,
            n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            n.NVML_VOLATILE_ECC,
        ),
        "throttle": maybe(n.nvmlDeviceGetCurrentClocksThrottleReasons, h),
        "enc": maybe(n.nvmlDeviceGetEncoderUtilization, h),
        "dec": maybe(n.nvmlDeviceGetDecoderUtilization, h),
        "fields": fv,
        "processes": procs,
    }
    return sample, newest


def main():
    interval = float(sys.argv[1])
    n.nvmlInit()
    gpus = []
    for i in range(n.nvmlDeviceGetCount()):
        h = n.nvmlDeviceGetHandleByIndex(i)
        links = active_links(h)
        fields = [(FI_POWER_INSTANT, 0), (FI_MEMORY_TEMP, 0)]
        if links:
            for scope in [ALL_LINKS] + links:
                fields += [(FI_NVLINK_TX, scope), (FI_NVLINK_RX, scope)]
        last_ts = int((time.time() - 1) * 1e6)
        gpus.append([h, fields, last_ts])
    ticks = 0
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    next_at = time.monotonic()
    while not stop:
        tick = []
        for g in gpus:
            sample, g[2] = sample_gpu(g[0], g[1], g[2])
            tick.append(sample)
        ticks += 1
        next_at += interval
        delay = next_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            next_at = time.monotonic()
    n.nvmlShutdown()
    print(f"ticks={ticks}", flush=True)


if __name__ == "__main__":
    main()
