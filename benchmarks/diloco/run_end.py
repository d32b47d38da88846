"""How much of a DumbDiLoCo run's work is in its final global: the end of a run, measured.

Usage::

    python benchmarks/diloco/run_end.py                        # every scenario on every transport
    python benchmarks/diloco/run_end.py --transports dir --scenarios early3,uneven
    python benchmarks/diloco/run_end.py --code /path/to/other/checkout   # the same, other code

A master and two workers (tiny models) run as ``speedtronic train`` processes on a shared
directory, on a bucket (moto's S3 server, in this process) or on a Hub repo (the Hub emulator,
in this process, answering as the Hub does: LFS for every ``.safetensors``), with the settings
at their defaults but for ``poll_interval`` (1 s, so that a run takes seconds, not minutes) and
the tiny model's ``inner_steps`` (5). Scenarios, after issue 26:

- ``together``: the master and the workers start at once, equal ``max_steps`` (40);
- ``early3`` / ``early8``: the master starts 3 s / 8 s before the workers;
- ``coordinating``: a master that does not train (``train_locally: false``, ``outer_steps`` 2);
- ``uneven``: ``max_steps`` 20 for the master, 40 and 80 for the workers.

The work of a node is its optimizer steps. A delta is counted as in the final global when the
master consumed it (its file is gone from the repo) and neither dropped it as too stale nor
rejected it (each named in the master's log); a delta still in the repo at the end, or never
uploaded, is lost. Prints one line per run and one JSON line; ``--code`` runs the nodes on
another checkout (``PYTHONPATH``), e.g. main, for a before/after comparison in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import yaml  # noqa: E402

TOKEN = "hf_runEndWriterToken0123456789abcd"
KEYS = {"AWS_ACCESS_KEY_ID": "AKIARUNENDBENCH00000", "AWS_SECRET_ACCESS_KEY": "r" * 40}
MODEL = {
    "name": "reference_transformer",
    "vocab_size": 64,
    "seq_len": 32,
    "n_layer": 1,
    "n_head": 2,
    "d_model": 32,
}
SCENARIOS = {  # name -> (master max_steps or None when it only coordinates, workers', lead s)
    "together": (40, (40, 40), 0.0),
    "early3": (40, (40, 40), 3.0),
    "early8": (40, (40, 40), 8.0),
    "coordinating": (None, (40, 40), 0.0),
    "uneven": (20, (40, 80), 0.0),
}
STALE_RE = re.compile(r"(nodes/[^ ]+\.safetensors) is too stale")
REJECTED_RE = re.compile(r"rejected (nodes/[^ :]+\.safetensors)")


class Repo:
    """Where a run's nodes meet: a spec for ``repo_id``, the nodes' environment, a listing."""

    def __init__(self, kind: str, work: Path, servers: dict):
        self.kind, self.work, self.servers = kind, work, servers
        self.env: dict[str, str] = {}
        if kind == "dir":
            self.spec = str(work / "repo")
        elif kind == "s3":
            bucket = f"run-{int(time.time() * 1000) % 10**9}"
            servers["s3_raw"].create_bucket(Bucket=bucket)
            self.spec = f"s3://{bucket}/run"
            self.env = {"AWS_ENDPOINT_URL": servers["s3_url"], **KEYS}
        else:
            name = f"alice/run-{int(time.time() * 1000) % 10**9}"
            servers["hub"].create_repo(name, private=True)
            self.spec = name
            self.env = {
                "HF_ENDPOINT": servers["hub"].url,
                "HF_TOKEN": TOKEN,
                "HF_HOME": str(work / "hf_home"),
                "HF_HUB_DISABLE_TELEMETRY": "1",
                "SPEEDTRONIC_HUB_MAX_BACKOFF_S": "1",
            }

    def left_over(self) -> set[str]:
        """Deltas still in the repo: never applied."""
        from speedtronic.distributed.repos import open_transport

        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        try:
            settings = _Settings(self.spec)
            transport = open_transport(self.spec, settings)
            return {r.path for r in transport.list_deltas() if r.problem is None}
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def step_count(self) -> dict | None:
        from speedtronic.distributed.repos import open_transport

        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        try:
            return open_transport(self.spec, _Settings(self.spec)).read_step_count()
        except Exception:  # noqa: BLE001 - only reported
            return None
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


class _Settings:
    """What ``open_transport`` reads of a distributed section, for a read-only look."""

    def __init__(self, spec: str):
        self.repo, self.node_id, self.role = spec, "bench-reader", "worker"
        self.endpoint_url, self.token, self.cache_dir = None, None, None
        self.min_publish_interval_s, self.squash_every = 60.0, 0


def start_node(repo: Repo, work: Path, code: Path, node: str, role: str, steps: int, **more):
    config = {
        "run": {"seed": 0, "device": "cpu", "name": node, "max_steps": steps},
        "model": MODEL,
        "data": {"micro_batch_size": 8},
        "optimizer": {"lr": 1e-2},
        "scheduler": {"warmup_steps": 2},
        "logging": {"every_steps": 10, "json_file": "metrics.jsonl"},
        "distributed": {
            "enabled": True,
            "role": role,
            "node_id": node,
            "repo_id": repo.spec,
            "inner_steps": 5,
            "poll_interval": 1.0,
            **more,
        },
    }
    path = work / f"{node}.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "HF_"))}
    env.update(repo.env)
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": str(code)})
    log = open(work / f"{node}.log", "w")  # noqa: SIM115 - closed with the process
    command = [sys.executable, "-m", "speedtronic", "train", "-c", str(path)]
    command += ["--output-dir", str(work / node)]
    # cwd: the run's folder, so that ``-m speedtronic`` imports from ``code``, not from here
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work)


def uploads(work: Path, node: str) -> dict[str, int]:
    """``{repo path: steps}`` of every delta the node uploaded (its JSONL)."""
    path = work / node / "metrics.jsonl"
    if not path.exists():
        return {}
    found = {}
    for line in path.read_text().splitlines():
        record = json.loads(line) if line.strip() else {}
        if record.get("event") == "diloco_upload":
            found[f"nodes/{node}/delta_{record['seq']:08d}.safetensors"] = record["steps"]
    return found


def run(kind: str, scenario: str, code: Path, servers: dict, timeout_s: float) -> dict:
    master_steps, worker_steps, lead = SCENARIOS[scenario]
    work = Path(tempfile.mkdtemp(prefix=f"run_end_{kind}_{scenario}_"))
    repo = Repo(kind, work, servers)
    began = time.monotonic()
    if master_steps is None:
        master = start_node(repo, work, code, "master", "master", 1, train_locally=False,
                            outer_steps=2)  # fmt: skip
    else:
        master = start_node(repo, work, code, "master", "master", master_steps)
    time.sleep(lead)
    workers = [
        start_node(repo, work, code, f"worker-{i}", "worker", steps)
        for i, steps in enumerate(worker_steps, 1)
    ]
    codes = {}
    for name, process in [("master", master)] + [(f"worker-{i}", p) for i, p in
                                                  enumerate(workers, 1)]:  # fmt: skip
        try:
            codes[name] = process.wait(timeout=max(1.0, timeout_s - (time.monotonic() - began)))
        except subprocess.TimeoutExpired:
            process.kill()
            codes[name] = "timeout"
    wall = time.monotonic() - began
    trained = sum(worker_steps) + (master_steps or 0)
    sent: dict[str, int] = {}
    for node in ["master"] + [f"worker-{i}" for i in range(1, len(workers) + 1)]:
        sent.update(uploads(work, node))
    master_log = (work / "master.log").read_text()
    dropped = set(STALE_RE.findall(master_log)) | set(REJECTED_RE.findall(master_log))
    left = repo.left_over()
    applied = sum(steps for path, steps in sent.items() if path not in left | dropped)
    counted = repo.step_count() or {}
    logs = {p.stem: p.read_text() for p in work.glob("*.log")}
    lines = [line for text in logs.values() for line in text.splitlines()]
    finals = [line for line in lines if "final global" in line or "last delta" in line]
    return {
        "transport": kind,
        "scenario": scenario,
        "in_final_global": round(applied / trained, 4),
        "steps_trained": trained,
        "steps_applied": applied,
        "deltas_sent": len(sent),
        "deltas_left_in_repo": len(left),
        "deltas_dropped": len(dropped),
        "outer_step": counted.get("outer_step"),
        "exit_codes": codes,
        "wall_s": round(wall, 1),
        "tracebacks": sum("Traceback" in text for text in logs.values()),
        "final_lines": finals[:4],
        "work": str(work),
    }


def servers_for(kinds: list[str]):
    servers: dict = {}
    closers = []
    if "s3" in kinds:
        import logging

        import boto3
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        moto.start()
        host, port = moto.get_host_and_port()
        servers["s3_url"] = f"http://{host}:{port}"
        servers["s3_raw"] = boto3.client(
            "s3", endpoint_url=servers["s3_url"], region_name="us-east-1", **{
                "aws_access_key_id": KEYS["AWS_ACCESS_KEY_ID"],
                "aws_secret_access_key": KEYS["AWS_SECRET_ACCESS_KEY"]})  # fmt: skip
        closers.append(moto.stop)
    if "hub" in kinds:
        from hub_emulator import HubEmulator

        emulator = HubEmulator({TOKEN: "alice"}).start()
        servers["hub"] = emulator
        closers.append(emulator.close)
    return servers, closers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--transports", default="dir,s3,hub")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--code", type=Path, default=ROOT, help="checkout the nodes run")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per run")
    parser.add_argument("--out", type=Path, help="append each result as a JSON line here")
    args = parser.parse_args()
    kinds = args.transports.split(",")
    servers, closers = servers_for(kinds)
    results = []
    print(f"code {args.code}; load average {os.getloadavg()[0]:.2f}", flush=True)
    try:
        for kind in kinds:
            for scenario in args.scenarios.split(","):
                result = run(kind, scenario, args.code.resolve(), servers, args.timeout_s)
                results.append(result)
                print(
                    f"{kind:4} {scenario:13} in final global {result['in_final_global']:6.1%} "
                    f"({result['steps_applied']}/{result['steps_trained']} steps; "
                    f"{result['deltas_left_in_repo']} deltas left, {result['deltas_dropped']} "
                    f"dropped) outer step {result['outer_step']} exits {result['exit_codes']} "
                    f"{result['wall_s']} s",
                    flush=True,
                )
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps({**result, "code": str(args.code)}) + "\n")
    finally:
        for close in closers:
            close()
    print(json.dumps({"code": str(args.code), "results": results}))


if __name__ == "__main__":
    main()
