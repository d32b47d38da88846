"""Issue 27, defect 1, measured: a round that was never saved or published must not move the
master's outer step, so no delta is dropped as too stale for steps nobody could see.

Usage::

    python benchmarks/diloco/commit_point.py                    # both shapes, this checkout
    python benchmarks/diloco/commit_point.py --code /work/main  # the same on other code

Two shapes, after the issue, each a coordinating master and worker processes (tiny models,
``speedtronic train``), ``max_staleness`` at its default (4):

- ``full-disk``: the master's ``state_dir`` on a 2 MB tmpfs (mounted here: needs root), filled
  for 6 s once the run is under way, then freed; two workers on a shared directory;
- ``hub-conflicts``: five workers and the master on the Hub emulator (in this process) whose
  commits take 0.3 s each, so the fleet's delta commits keep moving the head under the master's
  publishes.

Measured: the deltas the workers uploaded, those the master dropped as too stale (each named in
its log), the outer step the master ended at, and the exit codes. One line per run and a JSON
line; the nodes run ``--code``'s checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run_end import STALE_RE, Repo, servers_for, start_node, uploads  # noqa: E402

STEPS = 150  # per worker, 5 per inner loop: 30 deltas each


def wait_for(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return False


def master_step(work: Path) -> int:
    import re

    text = (work / "master.log").read_text() if (work / "master.log").exists() else ""
    steps = [int(n) for n in re.findall(r"diloco round: outer step (\d+)", text)]
    return max(steps, default=0)


def fill(mount: Path) -> Path:
    """Fill the filesystem at ``mount`` to the last byte; returns the filler file."""
    filler = mount / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    return filler


def run_shape(shape: str, code: Path, servers: dict, timeout_s: float) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"commit_point_{shape}_"))
    more = {"poll_interval": 0.2, "min_deltas": 2, "max_wait_s": 1.0, "min_publish_interval_s": 0}
    mount = None
    if shape == "full-disk":
        repo = Repo("dir", work, servers)
        mount = work / "tiny"
        mount.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
        more["state_dir"] = str(mount / "state")
        workers = ("worker-1", "worker-2")
    else:
        repo = Repo("hub", work, servers)
        workers = tuple(f"worker-{i}" for i in range(1, 6))
    began = time.monotonic()
    master = start_node(repo, work, code, "master", "master", 1, train_locally=False,
                        outer_steps=10_000, **more)  # fmt: skip
    procs = [start_node(repo, work, code, w, "worker", STEPS, **more) for w in workers]
    if mount is not None:
        wait_for(lambda: master_step(work) >= 3, timeout_s)
        filler = fill(mount)
        time.sleep(6.0)
        filler.unlink()
    codes = {}
    for name, proc in zip(workers, procs, strict=True):
        try:
            codes[name] = proc.wait(timeout=max(1.0, timeout_s - (time.monotonic() - began)))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes[name] = "timeout"
    try:  # the fixed master ends by itself once every worker's last delta is in
        codes["master"] = master.wait(timeout=90)
    except subprocess.TimeoutExpired:
        master.kill()
        codes["master"] = "killed (still running 90 s after its workers)"
    sent = {}
    for name in workers:
        sent.update(uploads(work, name))
    text = (work / "master.log").read_text()
    stale = set(STALE_RE.findall(text)) & set(sent)
    result = {
        "shape": shape,
        "code": str(code),
        "deltas_sent": len(sent),
        "dropped_stale": len(stale),
        "dropped_fraction": round(len(stale) / max(1, len(sent)), 4),
        "outer_step": master_step(work),
        "left_in_repo": len(repo.left_over() & set(sent)),
        "exit_codes": codes,
        "no_space_lines": [ln for ln in text.splitlines() if "No space" in ln][:2],
        "wall_s": round(time.monotonic() - began, 1),
        "work": str(work),
    }
    if mount is not None:
        subprocess.run(["umount", str(mount)], check=False)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="full-disk,hub-conflicts")
    parser.add_argument("--code", type=Path, default=Path(__file__).resolve().parents[2])
    parser.add_argument("--timeout-s", type=float, default=600.0)
    args = parser.parse_args()
    shapes = args.shapes.split(",")
    if "full-disk" in shapes and os.geteuid() != 0:
        print("full-disk needs root (a tmpfs mount); skipped")
        shapes.remove("full-disk")
    servers, closers = servers_for(["hub"] if "hub-conflicts" in shapes else [])
    if "hub" in servers:  # every commit takes 0.3 s: the head moves under the master's publishes
        servers["hub"].faults.add("slow", method="POST", path_re=r"/commit/", times=10**9,
                                  delay_s=0.3)  # fmt: skip
    results = []
    try:
        for shape in shapes:
            result = run_shape(shape, args.code.resolve(), servers, args.timeout_s)
            results.append(result)
            print(
                f"{shape:13} dropped as too stale {result['dropped_stale']}/"
                f"{result['deltas_sent']} ({result['dropped_fraction']:.1%}), outer step "
                f"{result['outer_step']}, left in repo {result['left_in_repo']}, exits "
                f"{result['exit_codes']}, {result['wall_s']} s",
                flush=True,
            )
    finally:
        for close in closers:
            close()
    print(json.dumps({"load_average": os.getloadavg()[0], "results": results}))


if __name__ == "__main__":
    main()
