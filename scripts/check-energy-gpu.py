"""Driver of scripts/check-energy-gpu (run that, not this): gpufleet's energy on a real GPU,
judged against what the GPU's own energy counter says, read by another program.

On one idle GPU node: a collector (temp SQLite), `gpufleet-agent run` at 1 s streaming to
it, and a pynvml reader of NVML's total-energy counter (every GPU, every 0.25 s) in this
process. The GPU idles IDLE seconds (long enough for the collector to learn its idle
power), then `gpufleet-agent exec` runs scripts/gpu-load.py for LOAD seconds (a CUDA spin
kernel on every SM, no toolkit needed), then the GPU idles AFTER seconds and the agent
stops. Checked, each with what it is compared against:

1. the collector's energy of the load's GPU over the agent's samples = the difference of
   the counter readings the agent sent (exact, in mJ);
2. the same energy against the outside reader's counter over the same span (≤ 0.5 %);
3. `exec`'s energy against the outside counter over the command's range (≤ 1 %);
4. the load's workload (`/api/v1/containers`): charged between 95 % and 100.5 % of what
   `exec` measured for it (the command's range also holds its start-up, before NVML lists
   its process, and the collector's whole minutes hold no more than the process's ticks);
5. the learned idle baseline against the outside reader's average power while the GPU
   showed 0 % utilization before the load (≤ 5 %);
6. `gpufleet-collector check-energy` over the run: 0 violations.

Prints a table; exits 1 if a check fails. The GPU must be idle at the start (no process,
0 % utilization): the expectations assume the load is the only work on it.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import pynvml


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def now_ms():
    return time.time_ns() // 1_000_000


def get_json(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return json.load(r)


def wait_http(port, proc, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"error: the collector exited with {proc.returncode} before listening")
        try:
            get_json(port, "/api/v1/health")
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"error: the collector does not answer on {port} after {timeout} s")


class Reader(threading.Thread):
    """NVML's counter, power and utilization of every GPU, read from outside gpufleet.
    Each reading is stamped with the middle of the calls that took it."""

    def __init__(self, period):
        super().__init__(daemon=True)
        self.period = period
        self.handles = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            self.handles[pynvml.nvmlDeviceGetUUID(h)] = h
        self.rows = {uuid: [] for uuid in self.handles}
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            for uuid, h in self.handles.items():
                t0 = time.time_ns()
                energy = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
                power = pynvml.nvmlDeviceGetPowerUsage(h)
                util = pynvml.nvmlDeviceGetUtilizationRates(h).gpu
                t1 = time.time_ns()
                self.rows[uuid].append(((t0 + t1) // 2_000_000, energy, power, util))
            self.stop.wait(self.period)

    def counter_at(self, uuid, t):
        """The counter at time t (ms), interpolated between the readings around it."""
        rows = self.rows[uuid]
        for a, b in zip(rows, rows[1:]):
            if a[0] <= t <= b[0]:
                return a[1] + (b[1] - a[1]) * (t - a[0]) / max(b[0] - a[0], 1)
        sys.exit(f"error: no outside readings around {t} for {uuid}")

    def idle_power_w(self, uuid, t0, t1):
        """Average power of the readings between t0 and t1 at 0 % utilization."""
        p = [r[2] for r in self.rows[uuid] if t0 <= r[0] <= t1 and r[3] == 0]
        return (sum(p) / len(p) / 1000, len(p)) if p else (None, 0)


class Checks:
    """The table of checks: what, gpufleet's figure, the reference, difference, tolerance,
    verdict."""

    def __init__(self):
        self.rows = []

    def record(self, good, what, got, want, diff="", tol=""):
        self.rows.append((what, got, want, diff, tol, "ok" if good else "FAIL"))

    def judge(self, what, got, want, lo, hi, unit="J"):
        """`got` against `want`, passing within want × (1 + lo) .. want × (1 + hi)."""
        diff = (got - want) / want if want else float("inf")
        tol = f"±{hi * 100:g} %" if lo == -hi else f"{lo * 100:+g} / {hi * 100:+g} %"
        self.record(lo <= diff <= hi, what, f"{got:,.3f} {unit}", f"{want:,.3f} {unit}",
                    f"{diff * 100:+.3f} %", tol)

    def ok(self):
        return bool(self.rows) and all(r[-1] == "ok" for r in self.rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--load", type=float, default=45, help="seconds of load")
    ap.add_argument("--idle", type=float, default=40, help="seconds idle before the load")
    ap.add_argument("--after", type=float, default=20, help="seconds idle after the load")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    bins = os.path.abspath(args.bin_dir)
    for f in ("gpufleet-agent", "gpufleet-exec", "gpufleet-collector"):
        if not os.path.exists(os.path.join(bins, f)):
            sys.exit(f"error: {f} not in {bins}")
    load_py = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu-load.py")

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        sys.exit(f"error: cannot open NVML ({e}); run on a GPU node with the NVIDIA driver")
    busy = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        if procs or pynvml.nvmlDeviceGetUtilizationRates(h).gpu > 0:
            busy.append(f"GPU {i}: {len(procs)} processes")
    if busy:
        sys.exit("error: a GPU is in use (" + "; ".join(busy) + "); run on an idle node")
    reader = Reader(0.25)

    tmp = tempfile.mkdtemp(prefix="check-energy-gpu-")
    children = []

    def spawn(cmd, log, **kw):
        p = subprocess.Popen(cmd, stderr=open(os.path.join(tmp, log), "w"), **kw)
        children.append(p)
        return p

    # The work dir goes only after a run that finished with every check passing: an error
    # message points into it.
    ok = False
    try:
        grpc, http = free_port(), free_port()
        db = f"sqlite://{tmp}/collector.db"
        collector = spawn(
            [f"{bins}/gpufleet-collector", "serve", "--db", db, "--grpc-listen",
             f"127.0.0.1:{grpc}", "--http-listen", f"127.0.0.1:{http}"],
            "collector.log", stdout=subprocess.DEVNULL,
        )
        wait_http(http, collector)
        reader.start()
        agent = spawn(
            [f"{bins}/gpufleet-agent", "run", "--collector", f"http://127.0.0.1:{grpc}",
             "--node", "check-energy", "--interval", "1s", "--spool-dir", f"{tmp}/spool"],
            "agent.log", stdout=subprocess.PIPE, text=True,
        )
        t_start = now_ms()
        print(f"work dir {tmp}; idle {args.idle:g} s, load {args.load:g} s, idle {args.after:g} s",
              flush=True)
        time.sleep(args.idle)
        if agent.poll() is not None:
            sys.exit(f"error: the agent exited with {agent.returncode}; see {tmp}/agent.log")
        t_load = now_ms()
        report = f"{tmp}/exec.json"
        # CUDA's device 0 is NVML's index 0 only in PCI bus order.
        env = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID")
        rc = subprocess.run(
            [f"{bins}/gpufleet-agent", "exec", "--interval", "1s", "--report", report, "--",
             sys.executable, load_py, str(args.load)],
            env=env, stderr=open(f"{tmp}/exec.log", "w"),
        ).returncode
        if rc != 0:
            sys.exit(f"error: exec (the load) exited with {rc}; see {tmp}/exec.log")
        time.sleep(args.after)
        agent.send_signal(signal.SIGTERM)
        out, _ = agent.communicate(timeout=60)
        summary = out.strip().splitlines()[-1] if out.strip() else ""
        if agent.returncode != 0 or "unacked=0" not in summary:
            sys.exit(f"error: the agent did not deliver everything: {summary!r}")
        reader.stop.set()
        reader.join()

        ex = json.load(open(report))
        uuid = ex["gpus"][0]["uuid"]
        lo = t_start // 60_000 * 60_000
        hi = (now_ms() // 60_000 + 1) * 60_000
        # The node is silent: its last minutes close within a pass of the accountant (5 s)
        # once the gap limit (3 intervals) has passed.
        deadline = time.monotonic() + 60
        while True:
            energy = get_json(http, f"/api/v1/energy?from={lo}&to={hi}")
            if energy["total"]["provisional_j"] == 0:
                break
            if time.monotonic() > deadline:
                print("warning: minutes still provisional after 60 s; judging them as they are")
                break
            time.sleep(1)
        gpu = next(g for g in energy["gpus"] if g["uuid"] == uuid)
        rows = get_json(http, f"/api/v1/containers?from={lo}&to={hi}")["rows"]
        series = get_json(http, f"/api/v1/gpus/{uuid}/series?metric=energy_mj&from={lo}&to={hi}")
        pts = [p for p in series["points"] if p[1] is not None]
        if len(pts) < 2:
            sys.exit(f"error: the collector holds {len(pts)} energy readings of {uuid}")
        check = subprocess.run(
            [f"{bins}/gpufleet-collector", "check-energy", "--db", db,
             "--from", str(lo), "--to", str(hi)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )

        checks = Checks()
        judge, record = checks.judge, checks.record

        (t0, e0), (t1, e1) = pts[0], pts[-1]
        judge("collector GPU energy vs the agent's counter readings", gpu["energy_mj"],
              int(e1) - int(e0), 0, 0, "mJ")
        outside = (reader.counter_at(uuid, t1) - reader.counter_at(uuid, t0)) / 1000
        judge("collector GPU energy vs the outside counter", gpu["energy_j"], outside,
              -0.005, 0.005)
        ex_j = ex["energy"]["energy_j"]
        ex_outside = reader.counter_at(uuid, ex["to_ms"]) - reader.counter_at(uuid, ex["from_ms"])
        judge("exec energy vs the outside counter", ex_j, ex_outside / 1000, -0.01, 0.01)
        mine = [r for r in rows if any(g["uuid"] == uuid for g in r["gpus"])]
        if mine:
            w = max(mine, key=lambda r: r["active_j"])
            judge(f"workload {w['key']} vs exec", w["energy_j"], ex_j, -0.05, 0.005)
        else:
            record(False, "the load's workload", "none", "one")
        base = gpu["baseline"]
        idle_w, n = reader.idle_power_w(uuid, t_start + 5_000, t_load)
        if base["source"] == "learned" and idle_w is not None:
            judge(f"learned idle baseline vs outside idle power ({n} readings)",
                  base["idle_w"], idle_w, -0.05, 0.05, "W")
        else:
            record(False, "idle baseline", f"{base['source']} {base['idle_w']} W", "learned")
        last = check.stdout.strip().splitlines()[-1:] or ["no output"]
        record(check.returncode == 0, "check-energy", last[0], "0 violations")
        ok = checks.ok()

        print()
        print(f"GPU {uuid} ({gpu['name']}); samples {t0}..{t1} ms; load {t_load} ms")
        print(f"collector: {gpu['energy_j']:,.3f} J, active {gpu['active_j']:,.3f} J, idle "
              f"{gpu['idle_j']:,.3f} J (bucket {gpu['idle_bucket_j']:,.3f}), unattributed "
              f"{gpu['unattributed_j']:,.3f} J, missing {gpu['missing_seconds']} s, provisional "
              f"{gpu['provisional_j']} J; baseline {base['idle_w']} W ({base['source']})")
        for r in rows:
            print(f"workload {r['key']}: {r['energy_j']:,.3f} J (active {r['active_j']:,.3f}, "
                  f"idle {r['idle_j']:,.3f}), {r['gpu_seconds']} GPU-s")
        print()
        print("| check | gpufleet | reference | difference | tolerance | |")
        print("|---|---|---|---|---|---|")
        for r in checks.rows:
            print("| " + " | ".join(r) + " |")
    finally:
        for p in children:
            if p.poll() is None:
                p.kill()
                p.wait()
        if args.keep or not ok:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
