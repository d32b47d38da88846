"""Publishes against a busy Hub repo: how often a fleet's commits refuse the master's publish,
and whether a publish ever fails for it (issue 26).

Usage::

    python benchmarks/diloco/hub_publish_race.py  # 8 nodes, 12 s loops, 6 min
    python benchmarks/diloco/hub_publish_race.py --nodes 5 --minutes 2      # a quick look
    PYTHONPATH=/path/to/main python benchmarks/diloco/hub_publish_race.py   # the same on other code

The Hub emulator (tests/hub_emulator.py, in this process) answers as the Hub does (LFS for every
``.safetensors``), with a commit latency: every commit waits ``--commit-latency-s`` before it is
applied, so a commit whose parent was the head when it was sent may find the head moved by then
(412), as on the Hub with large files and a slow link. ``--nodes`` threads each upload a real
bf16 delta of the model every ``--inner-loop-s`` (from a random phase) through a
``HubTransport`` of their own, as a worker does; the master is the real ``MasterLoop`` over the
real ``HubTransport`` (a round per poll once ``min_deltas`` are in, no publish pacing), polling
every ``--poll-s``; at the end it runs the final round, synchronously. Measured: publishes,
publish conflicts (412 answers to the master's commits) and failed publishes, per 100
publishes, and whether the final publish landed. Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

import torch  # noqa: E402

TOKEN = "hf_publishRaceWriterToken012345678"
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


class Events:
    """The master's logger: counts publish failures, keeps the warnings."""

    def __init__(self):
        self.warnings: list[str] = []
        self.lock = threading.Lock()

    def log(self, event, payload):
        pass

    def notice(self, message):
        pass

    def warn(self, message):
        with self.lock:
            self.warnings.append(message)


def settings(**more) -> SimpleNamespace:
    base = dict(
        node_id="master",
        inner_steps=100,
        poll_interval=1.0,
        min_deltas=2,
        max_wait_s=30.0,
        max_staleness=1000,
        staleness_discount=0.5,
        outer_lr=1.0,
        outer_momentum=0.0,
        outer_policy="fleet",
        upload_timeout_s=120.0,
        drain_timeout_s=0.0,
        min_publish_interval_s=0.0,
        delta_dtype="bf16",
        role="master",
    )
    return SimpleNamespace(**{**base, **more})


def hub_transport(url: str, repo: str, node: str, cache: Path):
    from speedtronic.distributed.hub.transport import HubTransport
    from speedtronic.hub.client import HubClient

    client = HubClient(repo, token=TOKEN, node_id=node, endpoint=url, cache_dir=cache / node)
    return HubTransport(client, min_publish_interval_s=0.0)


def delta_bytes(weights: dict, node: str, seq: int) -> bytes:
    from speedtronic.distributed.codec import encode_delta
    from speedtronic.distributed.protocol import DeltaHeader

    header = DeltaHeader(node, seq, 0, 100, 100 * 512, "bf16", "2026-01-01T00:00:00Z", "a1b2c3d4")
    delta = {k: torch.randn_like(v) * 1e-3 for k, v in weights.items()}
    return encode_delta(delta, header)


def node_thread(url, repo, node, cache, weights, args, stop, counts):
    from speedtronic.distributed.protocol import delta_path

    transport = hub_transport(url, repo, node, cache)
    rng = random.Random(node)
    stop.wait(rng.uniform(0, args.inner_loop_s))
    seq = 0
    while not stop.is_set():
        seq += 1
        try:
            transport.upload(delta_path(node, seq), delta_bytes(weights, node, seq))
            counts["uploads"] += 1
        except Exception:  # noqa: BLE001 - counted, the node goes on
            counts["upload_failures"] += 1
        stop.wait(args.inner_loop_s * rng.uniform(0.9, 1.1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--inner-loop-s", type=float, default=12.0)
    parser.add_argument("--commit-latency-s", type=float, default=0.5)
    parser.add_argument("--poll-s", type=float, default=1.0)
    parser.add_argument("--minutes", type=float, default=6.0)
    parser.add_argument("--params", type=int, default=256 * 1024, help="model parameters")
    args = parser.parse_args()

    from hub_emulator import HubEmulator

    import speedtronic
    from speedtronic.distributed.master.loop import MasterLoop

    print(f"code {Path(speedtronic.__file__).parents[1]}; load {os.getloadavg()[0]:.2f}")
    weights = {"w": torch.randn(args.params // 256, 256)}
    work = Path(tempfile.mkdtemp(prefix="hub_publish_race_"))
    with HubEmulator({TOKEN: "alice"}) as emu:
        repo = "alice/race"
        emu.create_repo(repo, private=True)
        emu.faults.add("slow", method="POST", path_re=r"/commit/", times=10**9,
                       delay_s=args.commit_latency_s)  # fmt: skip
        transport = hub_transport(emu.url, repo, "master", work)
        events = Events()
        loop = MasterLoop(settings(poll_interval=args.poll_s), weights, transport, events,
                          work / "state")  # fmt: skip
        loop.start()
        loop.start_sending()
        stop, counts = threading.Event(), {"uploads": 0, "upload_failures": 0}
        nodes = [
            threading.Thread(
                target=node_thread,
                args=(emu.url, repo, f"node-{i}", work, weights, args, stop, counts),
                daemon=True,
            )
            for i in range(args.nodes)
        ]
        for thread in nodes:
            thread.start()
        began = time.monotonic()
        while time.monotonic() - began < args.minutes * 60:
            loop.poll_safely()
            time.sleep(args.poll_s)
        loop.stop_sending(timeout=120)  # the last sends land (or fail) while nodes commit on
        final_ok = True
        try:
            loop.poll_once(force=True)  # the final round, synchronously, nodes still committing
        except Exception as exc:  # noqa: BLE001 - reported
            final_ok, final_error = False, str(exc)
        stop.set()
        for thread in nodes:
            thread.join(30)
        stats = transport.stats()
    publishes = stats["hub_publishes"]
    conflicts = stats["hub_publish_conflicts"]
    failed = [w for w in events.warnings if "publish failed" in w or "could not publish" in w]
    result = {
        "nodes": args.nodes,
        "inner_loop_s": args.inner_loop_s,
        "commit_latency_s": args.commit_latency_s,
        "minutes": args.minutes,
        "publishes": publishes,
        "publish_conflicts": conflicts,
        "conflicts_per_100_publishes": round(100 * conflicts / max(publishes, 1), 1),
        "failed_publishes": len(failed),
        "failed_per_100_publishes": round(100 * len(failed) / max(publishes, 1), 1),
        "final_publish_landed": final_ok and not loop.unpublished,
        "uploads": counts["uploads"],
        "upload_failures": counts["upload_failures"],
        "outer_step": loop.master.outer_step,
        "load_average": round(os.getloadavg()[0], 2),
    }
    if not final_ok:
        result["final_error"] = final_error
    print(
        f"{args.nodes} nodes, {args.inner_loop_s:g} s loops, commit latency "
        f"{args.commit_latency_s:g} s, {args.minutes:g} min: {publishes} publishes, {conflicts} "
        f"conflicts ({result['conflicts_per_100_publishes']} per 100), {len(failed)} failed "
        f"({result['failed_per_100_publishes']} per 100), final publish "
        f"{'landed' if result['final_publish_landed'] else 'FAILED'}; uploads {counts['uploads']}"
    )
    for line in failed[:3]:
        print("  ", line)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
