#!/usr/bin/env python3
"""The checks of deploy/ that `scripts/check-deploy` runs (read that file first). Run by the
venv's python (it needs kubernetes-validate and PyYAML). Every check prints `ok   ...` or
`FAIL ...` and records it in the file named by $CHECK_DEPLOY_RESULTS; a command exits 1 if
any of its checks failed.

  combos ROOT OUT                 temporary kustomizations: each overlay with each component
  validate RENDER_DIR             strict schemas + cross-references of every rendered file
  flags ROOT RENDER_DIR BIN_DIR   every flag / GPUFLEET_* variable deploy/ passes exists
  dockerfile ROOT RENDER_DIR      the Dockerfile's structure against the workspace
  systemd ROOT                    what systemd-analyze does not check in the units
  runtime ROOT RENDER_DIR BIN_DIR WORK PG_URL
                                  the manifests' and units' own settings, run for real
"""

import glob
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import yaml

FAILED = False
BINARIES = ("gpufleet-agent", "gpufleet-collector")
# The node name the runtime check gives the agent through NODE_NAME (Kubernetes' downward
# API); nothing else in the check's environment names it.
TEST_NODE = "k8s-node-7"


def record(ok: bool, what: str) -> bool:
    global FAILED
    line = ("ok   " if ok else "FAIL ") + what
    print("  " + line, flush=True)
    if not ok:
        FAILED = True
    results = os.environ.get("CHECK_DEPLOY_RESULTS")
    if results:
        with open(results, "a") as f:
            f.write(line.replace("\n", " ") + "\n")
    return ok


def load_render(path: Path) -> list:
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def renders(render_dir: str) -> list:
    return [(Path(p).stem, load_render(Path(p))) for p in sorted(glob.glob(f"{render_dir}/*.yaml"))]


def name_of(doc: dict) -> str:
    return f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"


def workloads(docs: list):
    for d in docs:
        if d.get("kind") in ("Deployment", "DaemonSet", "StatefulSet"):
            yield d, d["spec"]["template"]["spec"]


def gpufleet_containers(docs: list):
    """(workload, pod spec, container, binary) for each container running a gpufleet binary."""
    for w, pod in workloads(docs):
        for c in pod.get("containers", []):
            cmd = c.get("command") or []
            binary = os.path.basename(cmd[0]) if cmd else None
            yield w, pod, c, binary


# ---------------------------------------------------------------------------- combos


def cmd_combos(root: str, out: str) -> None:
    """Writes OUT/<overlay>+<component>/kustomization.yaml for each overlay and each component
    it does not already hold, and one with every component over each overlay; prints
    `name<TAB>dir` per kustomization. Components go in the order their comments ask for
    (servicemonitor before tls)."""
    k8s = Path(root, "deploy/kubernetes")
    overlays = sorted(p.name for p in (k8s / "overlays").iterdir() if p.is_dir())
    order = ["nvidia-runtime-class", "servicemonitor", "tls"]
    # (a, b): a must be listed before b (tls patches the ServiceMonitor only if it is there).
    BEFORE = [("servicemonitor", "tls")]
    components = sorted(p.name for p in (k8s / "components").iterdir() if p.is_dir())
    unknown = set(components) - set(order)
    if unknown:
        sys.exit(f"check-deploy.py combos: components {sorted(unknown)} have no place in its order list")
    for overlay in overlays:
        own = yaml.safe_load(open(k8s / "overlays" / overlay / "kustomization.yaml"))
        held = {os.path.basename(c.rstrip("/")) for c in own.get("components", [])}
        # A component added over an overlay comes after the overlay's own: not one that
        # must come before a component the overlay holds.
        late = {first for first, then in BEFORE if then in held}
        extra = [c for c in order if c in components and c not in held and c not in late]
        sets = [[c] for c in extra] + ([extra] if len(extra) > 1 else [])
        for comps in sets:
            name = f"{overlay}+{'+'.join(comps)}" if len(comps) == 1 else f"{overlay}+all-components"
            d = Path(out, name)
            d.mkdir(parents=True, exist_ok=True)
            rel = lambda p: os.path.relpath(p, d)  # kustomize refuses absolute paths
            doc = {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [rel(k8s / "overlays" / overlay)],
                "components": [rel(k8s / "components" / c) for c in comps],
            }
            (d / "kustomization.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
            print(f"{name}\t{d}")


# ---------------------------------------------------------------------------- validate

# ServiceMonitor is a CRD (monitoring.coreos.com/v1): kubernetes-validate has no schema for
# it. Its fields are checked against this subset of the Prometheus Operator's API (the
# fields these manifests may use), and it is checked against the Service it selects.
SM_SPEC = {"selector", "endpoints", "namespaceSelector", "jobLabel", "targetLabels", "podTargetLabels"}
SM_ENDPOINT = {"port", "path", "scheme", "interval", "scrapeTimeout", "authorization",
               "tlsConfig", "honorLabels", "metricRelabelings", "relabelings"}
SM_TLS = {"ca", "serverName", "insecureSkipVerify"}


def check_servicemonitor(sm: dict, docs: list) -> list:
    errs = []
    if sm.get("apiVersion") != "monitoring.coreos.com/v1":
        errs.append(f"apiVersion {sm.get('apiVersion')!r}, not monitoring.coreos.com/v1")
    if set(sm) - {"apiVersion", "kind", "metadata", "spec"}:
        errs.append(f"unknown top-level fields {sorted(set(sm) - {'apiVersion', 'kind', 'metadata', 'spec'})}")
    spec = sm.get("spec", {})
    if set(spec) - SM_SPEC:
        errs.append(f"unknown spec fields {sorted(set(spec) - SM_SPEC)}")
    want = spec.get("selector", {}).get("matchLabels", {})
    services = [d for d in docs if d.get("kind") == "Service"
                and want and all(d["metadata"].get("labels", {}).get(k) == v for k, v in want.items())]
    if len(services) != 1:
        errs.append(f"its selector {want} matches {len(services)} Services, not 1")
        return errs
    svc_ports = {p.get("name") for p in services[0]["spec"].get("ports", [])}
    schemes = {(pr.get("httpGet") or {}).get("scheme", "HTTP").lower()
               for w, pod, c, b in gpufleet_containers(docs) if b == "gpufleet-collector"
               for pr in (c.get(k) for k in ("livenessProbe", "readinessProbe")) if pr}
    for ep in spec.get("endpoints", []):
        if set(ep) - SM_ENDPOINT:
            errs.append(f"unknown endpoint fields {sorted(set(ep) - SM_ENDPOINT)}")
        if ep.get("port") not in svc_ports:
            errs.append(f"endpoint port {ep.get('port')!r} is not a port of Service/{services[0]['metadata']['name']}")
        if set(ep.get("tlsConfig", {})) - SM_TLS:
            errs.append(f"unknown tlsConfig fields {sorted(set(ep['tlsConfig']) - SM_TLS)}")
        if ep.get("scheme", "http") not in ("http", "https"):
            errs.append(f"scheme {ep.get('scheme')!r}")
        elif schemes and {ep.get("scheme", "http")} != schemes:
            errs.append(f"scrapes with {ep.get('scheme', 'http')} while the collector serves {sorted(schemes)}"
                        " (list the servicemonitor component before tls)")
        auth = ep.get("authorization")
        if auth is not None and (auth.get("type") != "Bearer" or set(auth.get("credentials", {})) != {"name", "key"}):
            errs.append(f"authorization {auth} is not a Bearer credential from a Secret key")
    return errs


def cross_references(docs: list) -> list:
    """What the schemas cannot see: names that must point at something in the same render."""
    errs = []
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    sas = {(d["metadata"].get("namespace"), d["metadata"]["name"]) for d in by_kind.get("ServiceAccount", [])}
    for w, pod in workloads(docs):
        ns = w["metadata"].get("namespace")
        where = name_of(w)
        sa = pod.get("serviceAccountName")
        if sa and (ns, sa) not in sas:
            errs.append(f"{where}: serviceAccountName {sa} is no ServiceAccount here")
        volumes = {v["name"] for v in pod.get("volumes", [])}
        labels = w["spec"]["template"]["metadata"].get("labels", {})
        if any(labels.get(k) != v for k, v in w["spec"]["selector"].get("matchLabels", {}).items()):
            errs.append(f"{where}: its selector does not match its pod template's labels")
        for c in pod.get("containers", []):
            image = c.get("image", "")
            if "/" not in image or ":" not in image.rsplit("/", 1)[-1]:
                errs.append(f"{where}: image {image!r} has no registry and tag (the base's images: did not apply)")
            for m in c.get("volumeMounts", []):
                if m["name"] not in volumes:
                    errs.append(f"{where}: volumeMount {m['name']} is no volume of the pod")
            ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
            for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
                port = ((c.get(kind) or {}).get("httpGet") or {}).get("port")
                if isinstance(port, str) and port not in ports:
                    errs.append(f"{where}: {kind} port {port!r} is no named port of the container")
            env = [e["name"] for e in c.get("env", [])]
            for arg in (c.get("command") or []) + (c.get("args") or []):
                for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", arg):
                    if var not in env:
                        errs.append(f"{where}: {arg!r} refers to $({var}), which the container's env does not set")
    for svc in by_kind.get("Service", []):
        sel = svc["spec"].get("selector", {})
        pods = [(w, pod) for w, pod in workloads(docs)
                if sel and all(w["spec"]["template"]["metadata"].get("labels", {}).get(k) == v for k, v in sel.items())]
        if not pods:
            errs.append(f"{name_of(svc)}: its selector {sel} matches no pod template")
        names = {p.get("name") for w, pod in pods for c in pod["containers"] for p in c.get("ports", [])}
        for p in svc["spec"].get("ports", []):
            if isinstance(p.get("targetPort"), str) and p["targetPort"] not in names:
                errs.append(f"{name_of(svc)}: targetPort {p['targetPort']!r} is no named container port")
    for b in by_kind.get("ClusterRoleBinding", []) + by_kind.get("RoleBinding", []):
        for s in b.get("subjects", []):
            if s.get("kind") == "ServiceAccount" and (s.get("namespace"), s["name"]) not in sas:
                errs.append(f"{name_of(b)}: subject ServiceAccount {s.get('namespace')}/{s['name']} is not here")
        role_kind = b["roleRef"]["kind"]
        if b["roleRef"]["name"] not in {r["metadata"]["name"] for r in by_kind.get(role_kind, [])}:
            errs.append(f"{name_of(b)}: roleRef {role_kind}/{b['roleRef']['name']} is not here")
    errs += privileges(docs)
    return errs


def privileges(docs: list) -> list:
    """The least-privilege settings the README promises, so an edit cannot drop them quietly."""
    errs = []
    for w, pod, c, binary in gpufleet_containers(docs):
        where = f"{name_of(w)} ({binary})"
        sc = c.get("securityContext", {})
        psc = pod.get("securityContext", {})
        if sc.get("allowPrivilegeEscalation") is not False:
            errs.append(f"{where}: allowPrivilegeEscalation is not false")
        if sc.get("readOnlyRootFilesystem") is not True:
            errs.append(f"{where}: readOnlyRootFilesystem is not true")
        if sc.get("privileged"):
            errs.append(f"{where}: privileged")
        caps = sc.get("capabilities", {})
        if caps.get("drop") != ["ALL"] or caps.get("add"):
            errs.append(f"{where}: capabilities are not `drop: [ALL]` with none added")
        if (psc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
            errs.append(f"{where}: the pod's seccompProfile is not RuntimeDefault")
        if binary == "gpufleet-collector":
            if psc.get("runAsNonRoot") is not True or not psc.get("runAsUser"):
                errs.append(f"{where}: the collector must run as a non-root user")
            if pod.get("hostPID") or pod.get("hostNetwork") or any("hostPath" in v for v in pod.get("volumes", [])):
                errs.append(f"{where}: the collector needs no host namespace or hostPath")
        if binary == "gpufleet-agent":
            mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
            for v in pod.get("volumes", []):
                hp = v.get("hostPath")
                if hp and hp["path"] in ("/proc", "/sys") and not mounts.get(v["name"], {}).get("readOnly"):
                    errs.append(f"{where}: the host's {hp['path']} is mounted writable")
    return errs


def cmd_validate(render_dir: str) -> None:
    from kubernetes_validate import utils as kv

    versions = kv.all_versions()
    span = f"Kubernetes {kv.major_minor(versions[0])} to {kv.major_minor(versions[-1])}"
    print(f"  (each document against every version kubernetes-validate ships: {span}, --strict)")
    seen = {}
    failures = {}  # error -> renders it is in
    for name, docs in renders(render_dir):
        errs = []
        kinds = []
        for d in docs:
            kinds.append(d.get("kind"))
            if d.get("kind") == "ServiceMonitor":
                errs += [f"ServiceMonitor (CRD, checked for structure): {e}" for e in check_servicemonitor(d, docs)]
                continue
            key = json.dumps(d, sort_keys=True)
            if key not in seen:
                seen[key] = []
                for v in versions:
                    try:
                        kv.validate(d, v, strict=True)
                    except kv.ValidationError as e:
                        path = ".".join(str(p) for p in e.path)
                        seen[key].append(f"{name_of(d)}: {path}: {e.message} (Kubernetes {kv.major_minor(v)})")
                        break
                    except kv.SchemaNotFoundError:
                        seen[key].append(f"{name_of(d)}: no schema for {d.get('apiVersion')} {d.get('kind')}"
                                         f" in Kubernetes {kv.major_minor(v)} (a typo, or a CRD)")
                        break
            errs += seen[key]
        errs += cross_references(docs)
        for e in errs:
            failures.setdefault(e, []).append(name)
        if not errs:
            record(True, f"{name}: {len(docs)} documents valid, references resolve"
                         f" ({', '.join(sorted(set(kinds)))})")
    for e, names in failures.items():
        record(False, f"{e} [{in_renders(names)}]")


def in_renders(names: list) -> str:
    return names[0] if len(names) == 1 else f"in {len(names)} renders: {', '.join(names[:3])}{', …' if len(names) > 3 else ''}"


# ---------------------------------------------------------------------------- flags


def help_text(bin_dir: str, binary: str, sub: str) -> str:
    # A clean environment: clap shows each variable's current value in --help.
    out = subprocess.run([os.path.join(bin_dir, binary), sub, "--help"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"}, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"{binary} {sub} --help exited {out.returncode}: {out.stderr.strip()[:300]}")
    return out.stdout


def parse_help(text: str):
    flags = set(re.findall(r"(?m)^\s+(?:-[A-Za-z], )?(--[a-z0-9][a-z0-9-]*)", text))
    envs = set(re.findall(r"\[env: ([A-Z0-9_]+)=", text))
    return flags, envs


def unit_settings(path: Path) -> dict:
    """key -> [values] of a unit file (comments and sections dropped)."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        k, _, v = line.partition("=")
        out.setdefault(k.strip(), []).append(v.strip())
    return out


def default_file(root: str, env_file: str) -> Path:
    """The repository's template of an EnvironmentFile= (/etc/default/X -> deploy/systemd/X.default)."""
    return Path(root, "deploy/systemd", os.path.basename(env_file.lstrip("-")) + ".default")


def dockerfile_stages(root: str) -> dict:
    """stage name -> {'from', 'lines'} of deploy/docker/Dockerfile, ARG defaults substituted
    (continuation lines joined)."""
    text = Path(root, "deploy/docker/Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)
    args, stages, current = {}, {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "ARG" and current is None:
            k, _, v = rest.partition("=")
            args[k.strip()] = v.strip()
            continue
        rest = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), rest)
        if word == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.I)
            current = m.group(2) or f"stage{len(stages)}"
            stages[current] = {"from": m.group(1), "lines": []}
        elif current:
            stages[current]["lines"].append((word, rest))
    return {"args": args, "stages": stages}


def cmd_flags(root: str, render_dir: str, bin_dir: str) -> None:
    uses = {}  # (binary, sub) -> {flag or VAR: where}

    def use(binary, sub, item, where):
        uses.setdefault((binary, sub), {}).setdefault(item, where)

    for name, docs in renders(render_dir):
        for w, pod, c, binary in gpufleet_containers(docs):
            where = f"{name}: {name_of(w)}"
            if binary not in BINARIES:
                record(False, f"{where}: container {c['name']} runs {binary!r}, no gpufleet binary (command: is required)")
                continue
            argv = (c.get("command") or [])[1:] + (c.get("args") or [])
            sub = argv[0] if argv and not argv[0].startswith("-") else None
            if sub is None:
                record(False, f"{where}: no subcommand in {argv}")
                continue
            for a in argv[1:]:
                if a.startswith("--"):
                    use(binary, sub, a.split("=", 1)[0], where)
            for e in c.get("env", []):
                if e["name"].startswith("GPUFLEET_"):
                    use(binary, sub, e["name"], where)
    for unit in sorted(Path(root, "deploy/systemd").glob("*.service")):
        s = unit_settings(unit)
        argv = s.get("ExecStart", [""])[0].split()
        binary = os.path.basename(argv[0]) if argv else None
        if binary not in BINARIES or len(argv) < 2:
            record(False, f"{unit.name}: ExecStart {argv} does not run a gpufleet binary's subcommand")
            continue
        for a in argv[2:]:
            if a.startswith("--"):
                use(binary, argv[1], a.split("=", 1)[0], unit.name)
        for env_file in s.get("EnvironmentFile", []):
            template = default_file(root, env_file)
            if not template.is_file():
                record(False, f"{unit.name}: EnvironmentFile={env_file} has no template {template.relative_to(root)}")
                continue
            for var in sorted(set(re.findall(r"\bGPUFLEET_[A-Z0-9_]+", template.read_text()))):
                use(binary, argv[1], var, f"{template.relative_to(root)} (for {unit.name})")
    # Slurm's scripts (deploy/slurm/): the `exec BINARY SUB --flag …` they run.
    for script in sorted(Path(root, "deploy/slurm").glob("*")):
        text = script.read_text().replace("\\\n", " ")
        runs = re.findall(r"^\s*exec\s+(\S+)\s+([a-z][a-z-]*)(.*)$", text, re.M)
        if not runs:
            record(False, f"deploy/slurm/{script.name}: runs no gpufleet binary's subcommand")
        for path, sub, rest in runs:
            binary = os.path.basename(path)
            if binary not in BINARIES:
                record(False, f"deploy/slurm/{script.name}: runs {binary!r}, no gpufleet binary")
                continue
            for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", rest):
                use(binary, sub, flag, f"deploy/slurm/{script.name}")
    docker = dockerfile_stages(root)
    for stage, st in docker["stages"].items():
        entry = [json.loads(r) for w, r in st["lines"] if w == "ENTRYPOINT"]
        cmd = [json.loads(r) for w, r in st["lines"] if w == "CMD"]
        if not entry or os.path.basename(entry[-1][0]) not in BINARIES:
            continue
        binary = os.path.basename(entry[-1][0])
        argv = entry[-1][1:] + (cmd[-1] if cmd else [])
        if not argv:
            continue
        for a in argv[1:]:
            if a.startswith("--"):
                use(binary, argv[0], a.split("=", 1)[0], f"Dockerfile stage {stage}")
        for w, r in st["lines"]:
            if w == "ENV":
                for var in re.findall(r"\b(GPUFLEET_[A-Z0-9_]+)=", r):
                    use(binary, argv[0], var, f"Dockerfile stage {stage}")
    for (binary, sub), items in sorted(uses.items()):
        try:
            flags, envs = parse_help(help_text(bin_dir, binary, sub))
        except (OSError, RuntimeError) as e:
            record(False, f"{binary} {sub}: {e}")
            continue
        missing = [f"{i} (from {w})" for i, w in sorted(items.items()) if i not in (envs if i.startswith("GPUFLEET_") else flags)]
        for m in missing:
            record(False, f"`{binary} {sub} --help` has no {m}")
        if not missing:
            record(True, f"`{binary} {sub} --help` has all {len(items)} flags and variables deploy/ passes: "
                         + " ".join(sorted(items)))


# ---------------------------------------------------------------------------- dockerfile


def workspace_bins(root: str) -> dict:
    """binary name -> package name, over the workspace's members."""
    ws = tomllib.load(open(Path(root, "Cargo.toml"), "rb"))
    bins = {}
    for member in ws["workspace"]["members"]:
        manifest = tomllib.load(open(Path(root, member, "Cargo.toml"), "rb"))
        pkg = manifest["package"]["name"]
        for b in manifest.get("bin", []):
            bins[b["name"]] = pkg
        if not manifest.get("bin") and Path(root, member, "src/main.rs").is_file():
            bins[pkg] = pkg
    return bins


def cmd_dockerfile(root: str, render_dir: str) -> None:
    docker = dockerfile_stages(root)
    stages, args = docker["stages"], docker["args"]
    bins = workspace_bins(root)
    ws = tomllib.load(open(Path(root, "Cargo.toml"), "rb"))
    rust_version = ws["workspace"]["package"]["rust-version"]

    def check(ok, what):
        record(ok, f"Dockerfile: {what}")

    check(set(stages) >= {"build", "agent", "collector"}, f"stages build, agent and collector (has {list(stages)})")
    build = stages.get("build", {"from": "", "lines": []})
    check(build["from"].startswith("rust:") and args.get("RUST_VERSION") == rust_version,
          f"builds with rust:{args.get('RUST_VERSION')} (the workspace's rust-version is {rust_version}): {build['from']}")
    runs = " ".join(r for w, r in build["lines"] if w == "RUN")
    packages = [p for cmd in re.findall(r"cargo build[^&;|]*", runs) for p in re.findall(r"(?:-p|--package)\s+(\S+)", cmd)]
    check("--locked" in runs and packages and all(p in bins.values() for p in packages),
          f"cargo build --locked of workspace packages {packages}")
    envs = " ".join(r for w, r in build["lines"] if w == "ENV")
    check("GPUFLEET_WEB_DIST=" in envs and "web" in stages,
          "the dashboard bundle comes from the web stage (GPUFLEET_WEB_DIST), so the Rust stage needs no Node.js")
    for w, r in [l for st in stages.values() for l in st["lines"] if l[0] == "COPY" and "--from" not in l[1]]:
        for src in r.split()[:-1]:
            check(Path(root, src).exists(), f"COPY source {src} exists")
    distro = build["from"].rsplit("-", 1)[-1]
    for stage, binary, want_root in (("agent", "gpufleet-agent", True), ("collector", "gpufleet-collector", False)):
        st = stages.get(stage)
        if not st:
            continue
        base = st["from"]
        check(base.startswith("debian:") and distro in base and "alpine" not in base,
              f"stage {stage} runs on glibc Debian of the builder's release ({distro}): {base}")
        copies = [r.split() for w, r in st["lines"] if w == "COPY" and "--from=build" in r]
        dests = {os.path.basename(c[-2]): c[-1] for c in copies}
        check(list(dests) == [binary] and binary in bins and bins[binary] in packages,
              f"stage {stage} copies {list(dests)}, built by the build stage ({binary} of package {bins.get(binary)})")
        entry = [json.loads(r) for w, r in st["lines"] if w == "ENTRYPOINT"]
        check(bool(entry) and entry[-1][0] == dests.get(binary), f"stage {stage}: ENTRYPOINT {entry[-1] if entry else None}")
        users = [r for w, r in st["lines"] if w == "USER"]
        uid = users[-1].split(":")[0] if users else "0"
        if want_root:
            check(uid == "0", f"stage {stage} runs as root (host /proc, hostPath spool): USER {uid}")
        else:
            check(uid.isdigit() and uid != "0", f"stage {stage} runs as a non-root numeric user: USER {users[-1] if users else None}")
        mismatch = {}
        for name, docs in renders(render_dir):
            for w, pod, c, b in gpufleet_containers(docs):
                if b != binary:
                    continue
                errs = []
                if (c.get("command") or [None])[0] != dests.get(binary):
                    errs.append(f"{name_of(w)} runs {c.get('command')}, not the image's {dests.get(binary)}")
                image = c.get("image", "").rsplit(":", 1)[0]
                if not image.endswith("/" + binary):
                    errs.append(f"{name_of(w)} image {c.get('image')} is not named {binary} (stage {stage})")
                want = (pod.get("securityContext", {}) | c.get("securityContext", {})).get("runAsUser")
                if want is not None and str(want) != uid:
                    errs.append(f"{name_of(w)} runs as uid {want}, the image's USER is {uid}")
                for e in errs:
                    mismatch.setdefault(e, []).append(name)
        for e, names in mismatch.items():
            check(False, f"{e} [{in_renders(names)}]")
        if not mismatch:
            check(True, f"every manifest runs stage {stage}'s {dests.get(binary)} (image …/{binary}, uid {uid})")
    ignore = Path(root, ".dockerignore")
    entries = ignore.read_text().split() if ignore.is_file() else []
    check("target" in entries and "web/node_modules" in entries, ".dockerignore leaves target/ and web/node_modules out of the context")


# ---------------------------------------------------------------------------- systemd


def cmd_systemd(root: str) -> None:
    d = Path(root, "deploy/systemd")
    users = set(re.findall(r"(?m)^u\s+(\S+)", "".join(p.read_text() for p in d.glob("*.sysusers"))))
    for unit in sorted(d.glob("*.service")):
        s = unit_settings(unit)
        want = {"Type": "notify", "NotifyAccess": "main", "Restart": "always", "ProtectSystem": "strict",
                "NoNewPrivileges": "yes", "CapabilityBoundingSet": ""}
        bad = [f"{k}={s.get(k, ['<unset>'])[-1]} (want {v!r})" for k, v in want.items() if s.get(k, [None])[-1] != v]
        for k in ("StateDirectory", "EnvironmentFile"):
            if not s.get(k):
                bad.append(f"{k}= unset")
        env = [e for e in s.get("EnvironmentFile", []) if not e.startswith("/etc/default/gpufleet-")]
        if env:
            bad.append(f"EnvironmentFile={env} is not /etc/default/gpufleet-*")
        user = s.get("User", [None])[-1]
        if user and user not in users:
            bad.append(f"User={user} is made by no deploy/systemd/*.sysusers")
        record(not bad, f"{unit.name}: " + ("; ".join(bad) if bad else
               "Type=notify, Restart=always, StateDirectory, ProtectSystem=strict, NoNewPrivileges, no capability"
               + (f", User={user} from the sysusers file" if user else "")))


# ---------------------------------------------------------------------------- runtime


class Notify:
    """An sd_notify socket, as systemd gives a Type=notify service."""

    def __init__(self, path: Path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.2)
        self.messages = []

    def ready(self, timeout: float, proc=None) -> bool:
        """Whether READY=1 came within `timeout` (and before `proc` exited)."""
        end = time.time() + timeout
        while time.time() < end:
            if proc is not None and proc.poll() is not None:
                end = min(end, time.time() + 0.5)  # what it sent before it exited
            if any("READY=1" in m.split("\n") for m in self.messages):
                return True
            try:
                self.messages.append(self.sock.recv(4096).decode(errors="replace"))
            except socket.timeout:
                pass
        return False


class Proc:
    def __init__(self, argv: list, env: dict, log: Path, notify: Path):
        self.notify = Notify(notify)
        self.log = log
        self.argv = argv
        full = {"PATH": "/usr/bin:/bin", "NOTIFY_SOCKET": self.notify.path} | env
        self.p = subprocess.Popen(argv, env=full, stdout=subprocess.PIPE, stderr=open(log, "w"), text=True)

    def first_line(self, timeout: float) -> str:
        import select
        ready, _, _ = select.select([self.p.stdout], [], [], timeout)
        return self.p.stdout.readline().strip() if ready else ""

    def stop(self, timeout: float = 30):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        try:
            out, _ = self.p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            out, _ = self.p.communicate()
        return self.p.returncode, out

    def tail(self) -> str:
        text = re.sub(r"\x1b\[[0-9;]*m", "", self.log.read_text())
        return " | ".join(text.strip().splitlines()[-4:])


def run(argv, **kw):
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"}, **kw)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {out.returncode}: {out.stderr.strip()[-400:]}")
    return out.stdout


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args):  # a probe that is redirected (to /login) failed
        return None


def http_get(url: str, ca: Path | None, token: str | None = None):
    """(status, body) of GET url, redirects not followed, as the kubelet's probes count them."""
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    ctx = ssl.create_default_context(cafile=str(ca)) if url.startswith("https") else None
    opener = urllib.request.build_opener(NoRedirect, urllib.request.HTTPSHandler(context=ctx),
                                         urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError) as e:
        return None, str(e).encode()


class Fixture:
    """What the README tells an operator to create, made for real in WORK: the collector's
    certificates (`gpufleet-collector certs`), agent tokens and a viewer token
    (`gpufleet-collector tokens add`), and the Secrets' files as Kubernetes mounts them."""

    def __init__(self, bin_dir: str, work: Path, pg_url: str):
        self.bin_dir, self.work, self.pg_url = bin_dir, work, pg_url
        self.collector = os.path.join(bin_dir, "gpufleet-collector")
        self.certs = work / "certs"
        run([self.collector, "certs", "--out", str(self.certs), "--server-name", "127.0.0.1",
             "--server-name", "localhost"])

    def token(self, db_url: str, name: str, role: str = "agent") -> str:
        out = run([self.collector, "tokens", "add", name, "--role", role, "--db", db_url])
        return out.splitlines()[0].strip()

    def secret_files(self, secret: str, tokens: dict) -> dict:
        """The files of Secret `secret` as the README says to create it."""
        if secret == "gpufleet-collector-tls":
            return {"tls.crt": (self.certs / "server.pem").read_text(), "tls.key": (self.certs / "server.key").read_text()}
        if secret == "gpufleet-collector-ca":
            return {"ca.crt": (self.certs / "ca.pem").read_text()}
        if secret == "gpufleet-agent-tokens":
            return tokens
        if secret == "gpufleet-postgres":
            return {"url": self.pg_url}
        raise RuntimeError(f"Secret {secret}: the check (and the README) do not say how to make it")


def pod_paths(pod: dict, c: dict, work: Path, fixture: Fixture, tokens: dict) -> list:
    """(mountPath, local dir) per volumeMount: a read-only hostPath is the host's own path,
    a writable one, an emptyDir or a claim a fresh folder, a Secret a folder of its files."""
    out = []
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for m in c.get("volumeMounts", []):
        v = volumes[m["name"]]
        local = work / "volumes" / m["name"]
        if "hostPath" in v and m.get("readOnly"):
            local = Path(v["hostPath"]["path"])
        elif "secret" in v:
            local.mkdir(parents=True, exist_ok=True)
            for k, text in fixture.secret_files(v["secret"]["secretName"], tokens).items():
                (local / k).write_text(text)
        else:
            local.mkdir(parents=True, exist_ok=True)
        out.append((m["mountPath"], str(local)))
    return sorted(out, key=lambda p: -len(p[0]))


def localize(value: str, paths: list, bin_dir: str) -> str:
    """`value` with each mount path in it (a path of its own, or in a URL such as
    sqlite:///var/lib/...) replaced by its local folder, in one pass."""
    if value.startswith("/usr/bin/gpufleet-"):
        return os.path.join(bin_dir, os.path.basename(value))
    if not paths:
        return value
    local = dict(paths)
    pattern = "|".join(re.escape(m) for m, _ in paths)  # longest first
    return re.sub(rf"(?<!\w)({pattern})(?=/|$)", lambda m: local[m.group(1)], value)


def container_command(c: dict, paths: list, bin_dir: str, fixture: Fixture) -> tuple:
    env = {}
    for e in c.get("env", []):
        ref = e.get("valueFrom", {})
        if "value" in e:
            env[e["name"]] = localize(e["value"], paths, bin_dir)
        elif ref.get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
            env[e["name"]] = TEST_NODE
        elif "secretKeyRef" in ref:
            env[e["name"]] = fixture.secret_files(ref["secretKeyRef"]["name"], {})[ref["secretKeyRef"]["key"]]
        else:
            raise RuntimeError(f"env {e['name']} comes from {e.get('valueFrom')}, which this check cannot provide")
    argv = []
    for a in (c.get("command") or []) + (c.get("args") or []):
        a = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a)  # as the kubelet does
        if "=" in a and a.startswith("--"):
            k, v = a.split("=", 1)
            a = f"{k}={localize(v, paths, bin_dir)}"
        else:
            a = localize(a, paths, bin_dir)
        argv.append(a)
    return argv, env


def any_port(addr: str) -> str:
    """HOST:PORT -> HOST:0 (a free port; the real one is printed by the collector)."""
    return re.sub(r":\d+$", ":0", addr)


def with_listen_ports(argv: list, env: dict) -> tuple:
    """The listen addresses with port 0; returns the original ports too, to find which
    probe port is which listener."""
    orig = {}
    out = []
    for a in argv:
        m = re.match(r"(--(grpc|http)-listen)=(.*)", a)
        if m:
            orig[int(m.group(3).rsplit(":", 1)[1])] = m.group(2)
            a = f"{m.group(1)}={any_port(m.group(3))}"
        out.append(a)
    for k in ("GPUFLEET_GRPC_LISTEN", "GPUFLEET_HTTP_LISTEN"):
        if k in env:
            orig[int(env[k].rsplit(":", 1)[1])] = k.split("_")[1].lower()
            env[k] = any_port(env[k])
    return out, env, orig


def start_collector(label: str, argv: list, env: dict, work: Path):
    proc = Proc(argv, env, work / "collector.log", work / "collector.notify")
    line = proc.first_line(120)
    m = re.match(r"listening grpc=(\S+) http=(\S+)", line)
    if not m:
        proc.stop(5)
        record(False, f"{label}: the collector did not start ({' '.join(argv)}): {line!r} {proc.tail()}")
        return None, None
    ports = {"grpc": int(m.group(1).rsplit(":", 1)[1]), "http": int(m.group(2).rsplit(":", 1)[1])}
    record(proc.notify.ready(60, proc.p), f"{label}: the collector tells systemd READY=1 (Type=notify)")
    return proc, ports


def check_agent(label: str, argv: list, env: dict, node: str, grpc_url: str, http: str, ca, viewer: str,
                work: Path, spool_expect: Path | None = None) -> None:
    argv = argv + ["--simulate", "--sim-gpus", "2"]  # no GPU here: the simulator stands in for NVML
    agent = Proc(argv, env, work / "agent.log", work / "agent.notify")
    try:
        record(agent.notify.ready(60, agent.p), f"{label}: the agent tells systemd READY=1 (Type=notify)"
                                                + ("" if agent.p.poll() is None else f" (it exited: {agent.tail()})"))
        seen, body = False, b""
        end = time.time() + 60
        while time.time() < end and not seen and agent.p.poll() is None:
            status, body = http_get(f"{http}/api/v1/nodes", ca, viewer)
            seen = status == 200 and node in [n.get("name") for n in json.loads(body)]
            time.sleep(0.5)
        record(seen, f"{label}: the agent streams to {grpc_url} with the token of {node!r}, and the collector lists"
                     f" node {node!r}" + ("" if seen else f" (nodes: {body[:200]!r}; agent: {agent.tail()})"))
        if spool_expect is not None:
            record(spool_expect.is_dir(), f"{label}: the spool is {spool_expect} ($STATE_DIRECTORY/spool/<node>)")
    finally:
        rc, out = agent.stop(30)
    record(rc == 0 and "summary sampled=" in (out or ""),
           f"{label}: the agent stops on SIGTERM with its summary (exit {rc}: {(out or '').strip()[-120:]!r})")


def runtime_manifests(root: str, render_dir: str, bin_dir: str, work: Path, fixture: Fixture) -> None:
    for overlay in sorted(p.name for p in Path(root, "deploy/kubernetes/overlays").iterdir()):
        docs = load_render(Path(render_dir, f"overlays-{overlay}.yaml"))
        col = [(w, pod, c) for w, pod, c, b in gpufleet_containers(docs) if b == "gpufleet-collector"]
        agt = [(w, pod, c) for w, pod, c, b in gpufleet_containers(docs) if b == "gpufleet-agent"]
        label = f"overlays/{overlay}"
        (_, pod, c), (_, apod, ac) = col[0], agt[0]
        owork = work / overlay
        owork.mkdir(parents=True)
        paths = pod_paths(pod, c, owork / "collector", fixture, {})
        argv, env = container_command(c, paths, bin_dir, fixture)
        argv, env, orig = with_listen_ports(argv, env)
        db = env["GPUFLEET_DB"]
        viewer = fixture.token(db, "prometheus", "viewer")
        tokens = {TEST_NODE: fixture.token(db, TEST_NODE) + "\n"}
        proc, ports = start_collector(label, argv, env, owork)
        if not proc:
            continue
        try:
            names = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
            tls = "GPUFLEET_TLS_CERT" in env or any(a.startswith("--tls-cert") for a in argv)
            ca = fixture.certs / "ca.pem" if tls else None
            for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
                get = (c.get(kind) or {}).get("httpGet")
                if not get:
                    record(False, f"{label}: the collector has no {kind} httpGet")
                    continue
                port = ports[orig[names.get(get["port"], get["port"])]]
                url = f"{get.get('scheme', 'HTTP').lower()}://127.0.0.1:{port}{get['path']}"
                status, body = http_get(url, ca)
                record(status == 200, f"{label}: {kind} {url} answers {status} without a login"
                                      + ("" if status == 200 else f": {body[:200]!r}"))
            scheme = "https" if tls else "http"
            metrics = f"{scheme}://127.0.0.1:{ports['http']}/metrics"
            anon, _ = http_get(metrics, ca)
            status, _ = http_get(metrics, ca, viewer)
            record(anon == 401 and status == 200,
                   f"{label}: {metrics} needs the viewer token (ServiceMonitor): {anon} without, {status} with it")
            # The agent as the DaemonSet runs it, its collector URL pointed at this collector.
            apaths = pod_paths(apod, ac, owork / "agent", fixture, tokens)
            aargv, aenv = container_command(ac, apaths, bin_dir, fixture)
            url = aenv["GPUFLEET_COLLECTOR"]
            aenv["GPUFLEET_COLLECTOR"] = re.sub(r"//[^/]+", f"//127.0.0.1:{ports['grpc']}", url)
            record(url.startswith("https://") == tls, f"{label}: the agent dials {url} ({'TLS' if tls else 'plain'}, as the collector serves)")
            check_agent(label, aargv, aenv, TEST_NODE, aenv["GPUFLEET_COLLECTOR"],
                        f"{scheme}://127.0.0.1:{ports['http']}", ca, viewer, owork)
        finally:
            rc, _ = proc.stop(30)
            record(rc == 0, f"{label}: the collector stops on SIGTERM (exit {rc})")


def env_file(path: Path) -> dict:
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            k, _, v = line.partition("=")
            out[k.strip()] = v.strip()
    return out


def runtime_units(root: str, bin_dir: str, work: Path, fixture: Fixture) -> None:
    """The units' ExecStart with their /etc/default templates, in the environment systemd
    gives them (STATE_DIRECTORY, NOTIFY_SOCKET); /var/lib and /etc paths moved into WORK."""
    d = Path(root, "deploy/systemd")
    uwork = work / "systemd"
    moved = lambda v: re.sub(r"(?<!\w)/(var/lib|etc)/", lambda m: f"{uwork}/{m.group(1)}/", v)
    cunit = unit_settings(d / "gpufleet-collector.service")
    state = uwork / "var/lib" / cunit["StateDirectory"][0]
    state.mkdir(parents=True)
    env = {k: moved(v) for k, v in env_file(default_file(root, cunit["EnvironmentFile"][0])).items()}
    env["STATE_DIRECTORY"] = str(state)
    argv = [os.path.join(bin_dir, os.path.basename(a)) if a.startswith("/usr/bin/") else a
            for a in cunit["ExecStart"][0].split()]
    argv, env, _ = with_listen_ports(argv, env)
    viewer = fixture.token(env["GPUFLEET_DB"], "prometheus", "viewer")
    node = Path("/proc/sys/kernel/hostname").read_text().strip()  # the agent's default node name
    agent_token = fixture.token(env["GPUFLEET_DB"], node)
    proc, ports = start_collector("systemd", argv, env, uwork)
    if not proc:
        return
    try:
        aunit = unit_settings(d / "gpufleet-agent.service")
        astate = uwork / "var/lib" / aunit["StateDirectory"][0]
        astate.mkdir(parents=True)
        aenv = {k: moved(v) for k, v in env_file(default_file(root, aunit["EnvironmentFile"][0])).items()}
        aenv["STATE_DIRECTORY"] = str(astate)
        aenv["GPUFLEET_COLLECTOR"] = f"http://127.0.0.1:{ports['grpc']}"
        Path(aenv["GPUFLEET_TOKEN_FILE"]).parent.mkdir(parents=True, exist_ok=True)
        Path(aenv["GPUFLEET_TOKEN_FILE"]).write_text(agent_token + "\n")
        aargv = [os.path.join(bin_dir, os.path.basename(a)) if a.startswith("/usr/bin/") else a
                 for a in aunit["ExecStart"][0].split()]
        check_agent("systemd", aargv, aenv, node, aenv["GPUFLEET_COLLECTOR"], f"http://127.0.0.1:{ports['http']}",
                    None, viewer, uwork, spool_expect=astate / "spool" / node)
    finally:
        rc, _ = proc.stop(30)
        record(rc == 0, f"systemd: the collector stops on SIGTERM (exit {rc})")
        record((state / "gpufleet.db").is_file(), f"systemd: the database is in the StateDirectory ({state}/gpufleet.db)")


def cmd_runtime(root: str, render_dir: str, bin_dir: str, work: str, pg_url: str) -> None:
    """pg_url: a PostgreSQL database for the Secret gpufleet-postgres (a schema of its own is
    made in it, and dropped after)."""
    work = Path(work)
    schema = f"check_deploy_{os.getpid()}"
    run(["psql", pg_url, "-qc", f"CREATE SCHEMA {schema}"])
    sep = "&" if "?" in pg_url else "?"
    fixture = Fixture(bin_dir, work, f"{pg_url}{sep}options=-c%20search_path%3D{schema}")
    try:
        runtime_manifests(root, render_dir, bin_dir, work, fixture)
        runtime_units(root, bin_dir, work, fixture)
    finally:
        run(["psql", pg_url, "-qc", f"DROP SCHEMA {schema} CASCADE"])


def main() -> None:
    cmd, *args = sys.argv[1:]
    {"combos": cmd_combos, "validate": cmd_validate, "flags": cmd_flags, "dockerfile": cmd_dockerfile,
     "systemd": cmd_systemd, "runtime": cmd_runtime}[cmd](*args)
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
