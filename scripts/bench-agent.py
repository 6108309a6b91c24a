"""Driver of scripts/bench-agent (run that, not this): whole-process CPU and RSS of the real
`gpufleet-agent run` (streaming to a real collector) against a pynvml loop, both on the
same fake libnvidia-ml with the same GPUs, at each interval; with --real-nvml, both on
the machine's own libnvidia-ml and GPUs instead (a GPU node).

CPU is read from outside the measured process: utime+stime of /proc/PID/stat (10 ms
ticks) and the process CPU clock (clock_gettime on the pid's CPU clock, in ns: the same
quantity without the tick rounding, threads that already exited included). Figures per
GPU-sample divide by the ticks due in the window (window / interval × GPUs). The ticks the
collector stored for the agent's node in the window, and their wall time and time in NVML
as the agent reported them, are printed too: a tick slower than the interval skips ticks.
"""

import argparse
import sqlite3
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, what, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"error: {what} exited with {proc.returncode} before listening")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"error: {what} does not listen on {port} after {timeout} s")


def cpu(pid):
    """(CPU seconds from the pid's CPU clock, CPU seconds from /proc/PID/stat)."""
    clock = ((~pid) << 3) | 2  # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)
    precise = time.clock_gettime(clock)
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime + stime
    return precise, ticks / CLK_TCK


def rss_mib(pid):
    """(VmRSS, VmHWM) in MiB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) / 1024
    return out.get("VmRSS", 0.0), out.get("VmHWM", 0.0)


def parse_interval(text):
    if text.endswith("ms"):
        return float(text[:-2]) / 1000
    if text.endswith("s"):
        return float(text[:-1])
    raise SystemExit(f"error: interval {text!r}: write e.g. 1s or 100ms")


def scenario(gpus, pids, node, cost_model):
    """GPUs of a busy HGX-like node: each process is a rank holding two GPUs. The UUIDs
    name the node: the collector refuses a second node claiming a GPU it knows. With a
    cost model, each call charges the CPU and wait measured on an H200 and the driver
    keeps per-process utilization samples (one a second) as a real one does."""
    out = []
    for g in range(gpus):
        procs = [
            {"pid": pid, "used_bytes": (20 + k) << 30, "sm_pct": 80 + k}
            for k, pid in enumerate(pids)
            if k == (g // 2) % len(pids)
        ]
        out.append(
            {
                "uuid": f"GPU-{node}-{g:02}",
                "util_gpu_pct": [90, 95, 99],
                "util_mem_pct": [40, 45, 50],
                "mem_used_bytes": 42 << 30,
                "power_mw": {"start": 300000, "step": 7},
                "power_instant_mw": {"start": 310000, "step": 11},
                "energy_mj": {"start": 1000000, "step": 30000},
                "temp_gpu_c": [61, 62, 63],
                "clock_sm_mhz": 1410,
                "clock_graphics_mhz": 1410,
                "nvlink_tx_kib": [{"start": 0, "step": 4096}] * 12,
                "nvlink_rx_kib": [{"start": 0, "step": 4096}] * 12,
                "compute_processes": procs,
                **({"process_sample_ms": 1000} if cost_model else {}),
            }
        )
    return {"gpus": out, **({"cost_model": cost_model} if cost_model else {})}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--intervals", default="1s,100ms")
    ap.add_argument("--work-dir", required=True, help="on a real disk: the spool fsyncs")
    ap.add_argument("--agent-arg", action="append", default=[])
    ap.add_argument(
        "--cost-model",
        default="h200",
        help="the fake's per-call cost model (h200: the driver's measured CPU and waits; none: calls answer at once)",
    )
    ap.add_argument(
        "--real-nvml",
        action="store_true",
        help="the machine's libnvidia-ml and all its GPUs, not the fake (--gpus is ignored)",
    )
    args = ap.parse_args()
    bins = args.bin_dir
    lib_built = os.path.join(bins, "libfake_nvml.so")
    needed = ["gpufleet-agent", "gpufleet-collector"]
    if args.real_nvml:
        import pynvml

        pynvml.nvmlInit()
        args.gpus = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    else:
        needed.append("libfake_nvml.so")
    for f in needed:
        if not os.path.exists(os.path.join(bins, f)):
            sys.exit(f"error: {f} not built in {bins}")
    os.makedirs(args.work_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="bench-agent-", dir=args.work_dir)
    children = []

    def spawn(cmd, **kw):
        p = subprocess.Popen(cmd, **kw)
        children.append(p)
        return p

    try:
        # Real processes for the GPU process lists: their /proc entries are read by the
        # agent (user, command, cgroup) as on a node.
        sleepers = [spawn(["sleep", "100000"]) for _ in range(args.procs)]
        kind = (
            "real GPUs (the machine's libnvidia-ml)"
            if args.real_nvml
            else f"fake GPUs (cost model: {args.cost_model})"
        )
        procs = "" if args.real_nvml else f", {args.procs} processes"
        print(
            f"{args.gpus} {kind}{procs}, {args.seconds:g} s per interval; work dir {tmp}",
            flush=True,
        )
        rows = []
        for text in args.intervals.split(","):
            text = text.strip()
            ivl = parse_interval(text)
            # A collector per interval: a real GPU's UUID belongs to the first node that
            # claims it, and each interval's agent is a node of its own.
            grpc, http = free_port(), free_port()
            db = os.path.join(tmp, f"collector-{text}.db")
            collector = spawn(
                [
                    os.path.join(bins, "gpufleet-collector"),
                    "serve",
                    "--db",
                    f"sqlite://{db}",
                    "--grpc-listen",
                    f"127.0.0.1:{grpc}",
                    "--http-listen",
                    f"127.0.0.1:{http}",
                ],
                stdout=open(os.path.join(tmp, f"collector-{text}.log"), "w"),
                stderr=subprocess.STDOUT,
            )
            wait_port(grpc, collector, "the collector")
            if args.real_nvml:
                lib, lib_dir = None, None
            else:
                # One copy of the fake per interval, shared by both monitors.
                lib_dir = os.path.join(tmp, f"lib-{text}")
                os.makedirs(lib_dir)
                lib = os.path.join(lib_dir, "libnvidia-ml.so.1")
                shutil.copy(lib_built, lib)
                with open(os.path.join(lib_dir, "fake-nvml.json"), "w") as f:
                    model = None if args.cost_model == "none" else args.cost_model
                    json.dump(scenario(args.gpus, [s.pid for s in sleepers], f"bench-{text}", model), f)
            row = run_interval(args, bins, tmp, lib, lib_dir, grpc, text, ivl, spawn)
            collector.send_signal(signal.SIGTERM)
            collector.wait(timeout=60)
            row.update(stored_ticks(db, *row.pop("window")))
            print(
                f"{text}: {row['ticks']} ticks stored in the window ({row['due']} due), tick wall "
                f"mean {row['wall_ms']:.2f} ms / max {row['wall_max_ms']:.2f} ms, "
                f"in NVML {row['nvml_ms']:.2f} ms",
                flush=True,
            )
            rows.append(row)
        print()
        print(
            "| interval | agent µs CPU / GPU-sample | agent % of a core | agent RSS MiB (peak) "
            "| pynvml µs CPU / GPU-sample | pynvml % of a core | pynvml RSS MiB (peak) | pynvml ÷ agent |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['interval']} | {r['agent_us']:.1f} | {r['agent_pct']:.3f} | "
                f"{r['agent_rss']:.1f} ({r['agent_hwm']:.1f}) | {r['py_us']:.1f} | "
                f"{r['py_pct']:.3f} | {r['py_rss']:.1f} ({r['py_hwm']:.1f}) | "
                f"{r['py_us'] / r['agent_us']:.1f}× |"
            )
        print()
        print("| interval | ticks stored / due | tick wall ms (mean / max) | in NVML ms (mean) |")
        print("|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['interval']} | {r['ticks']} / {r['due']} | {r['wall_ms']:.2f} / "
                f"{r['wall_max_ms']:.2f} | {r['nvml_ms']:.2f} |"
            )
    finally:
        for p in children:
            if p.poll() is None:
                p.kill()
                p.wait()
    if os.environ.get("KEEP") != "1":
        shutil.rmtree(tmp, ignore_errors=True)


def stored_ticks(db, start_ms, end_ms):
    """The agent's ticks the collector stored between start_ms and end_ms (its one node),
    with the tick wall time and time in NVML the agent reported for them."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
        n, wall, wall_max, nvml = c.execute(
            "SELECT count(*), avg(cost_wall_us), max(cost_wall_us), avg(cost_source_us) "
            "FROM host_samples WHERE ts_ms >= ? AND ts_ms < ?",
            (start_ms, end_ms),
        ).fetchone()
    ms = lambda us: (us or 0) / 1000  # noqa: E731
    return {"ticks": n, "wall_ms": ms(wall), "wall_max_ms": ms(wall_max), "nvml_ms": ms(nvml)}


def run_interval(args, bins, tmp, lib, lib_dir, grpc, text, ivl, spawn):
    node = f"bench-{text}"
    agent_log = open(os.path.join(tmp, f"agent-{text}.log"), "w")
    nvml = [] if lib is None else ["--nvml-lib", lib]
    agent = spawn(
        [
            os.path.join(bins, "gpufleet-agent"),
            "run",
            "--collector",
            f"http://127.0.0.1:{grpc}",
            "--node",
            node,
            "--interval",
            text,
            *nvml,
            "--spool-dir",
            os.path.join(tmp, f"spool-{text}"),
            *args.agent_arg,
        ],
        stdout=subprocess.PIPE,
        stderr=agent_log,
        text=True,
    )
    env = dict(os.environ) if lib_dir is None else dict(os.environ, LD_LIBRARY_PATH=lib_dir)
    loop = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench-agent-pynvml.py")
    py = spawn([sys.executable, loop, str(ivl)], stdout=subprocess.PIPE, env=env, text=True)
    # Warm up: NVML opened, inventory sent, first acks back, Python imports done.
    time.sleep(max(3.0, 5 * ivl))
    for p, what in ((agent, "the agent"), (py, "the pynvml loop")):
        if p.poll() is not None:
            sys.exit(f"error: {what} exited with {p.returncode}; see {tmp}")
    a0, p0 = cpu(agent.pid), cpu(py.pid)
    start_ms = time.time_ns() // 1_000_000
    time.sleep(args.seconds)
    a1, p1 = cpu(agent.pid), cpu(py.pid)
    end_ms = time.time_ns() // 1_000_000
    a_rss, a_hwm = rss_mib(agent.pid)
    p_rss, p_hwm = rss_mib(py.pid)
    agent.send_signal(signal.SIGTERM)
    py.send_signal(signal.SIGTERM)
    a_out, _ = agent.communicate(timeout=60)
    p_out, _ = py.communicate(timeout=60)
    summary = a_out.strip().splitlines()[-1] if a_out.strip() else ""
    if agent.returncode != 0 or "unacked=0" not in summary or "dropped=0" not in summary:
        sys.exit(f"error: the agent did not deliver everything: {summary!r} (rc {agent.returncode}); see {tmp}")
    samples = args.seconds / ivl * args.gpus
    r = {
        "interval": text,
        "agent_us": (a1[0] - a0[0]) * 1e6 / samples,
        "agent_pct": (a1[0] - a0[0]) / args.seconds * 100,
        "agent_stat_us": (a1[1] - a0[1]) * 1e6 / samples,
        "agent_rss": a_rss,
        "agent_hwm": a_hwm,
        "py_us": (p1[0] - p0[0]) * 1e6 / samples,
        "py_pct": (p1[0] - p0[0]) / args.seconds * 100,
        "py_stat_us": (p1[1] - p0[1]) * 1e6 / samples,
        "py_rss": p_rss,
        "py_hwm": p_hwm,
        "due": round(args.seconds / ivl),
        "window": (start_ms, end_ms),
    }
    print(
        f"{text}: agent {r['agent_us']:.1f} µs/GPU-sample (stat ticks: {r['agent_stat_us']:.1f}), "
        f"RSS {a_rss:.1f} MiB; pynvml {r['py_us']:.1f} µs/GPU-sample (stat ticks: "
        f"{r['py_stat_us']:.1f}), RSS {p_rss:.1f} MiB; ratio {r['py_us'] / r['agent_us']:.1f}×; "
        f"agent {summary}; pynvml {p_out.strip()}",
        flush=True,
    )
    return r


if __name__ == "__main__":
    main()
