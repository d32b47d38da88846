"""A fleet on object storage: one coordinating master and 32 simulated nodes on a local S3 server.

Usage::

    python benchmarks/diloco/s3_fleet.py  # 32 nodes, 10M model, 30 s loops, 4 min
    python benchmarks/diloco/s3_fleet.py --nodes 8 --minutes 2 --model small    # a quick look

Three processes share the machine: moto's S3 server, this one (the master: the real
``MasterLoop`` over the real ``S3Transport``, polling every ``--master-poll-s`` and publishing
at most every ``--publish-interval-s``) and the fleet (``--nodes`` threads, each an
``S3Transport`` of its own that uploads a real bf16 delta of the model every ``--inner-loop-s``
from a random phase, polls ``step_count.json`` every ``--worker-poll-s`` and downloads each new
global, as a worker does). The nodes do not train: the benchmark is the repo's side of a fleet.
Measured: the master's round time (the poll that runs a round: the new deltas fetched and
validated, the outer step, the state saved, the weights and pointer published, the consumed
deltas deleted), its requests per round and per idle poll, how busy it is, and the requests
and bytes per hour of the fleet and the master, against the same cadence's Hub commit rate and
the fleet size a Hub repo's ~128 commits an hour allows. Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import boto3  # noqa: E402
import torch  # noqa: E402

from speedtronic.config import SpeedtronicConfig  # noqa: E402
from speedtronic.distributed.codec import encode_delta, expected_delta_bytes  # noqa: E402
from speedtronic.distributed.hub.cadence import estimate_commits_per_hour  # noqa: E402
from speedtronic.distributed.master.loop import MasterLoop  # noqa: E402
from speedtronic.distributed.protocol import GLOBAL_WEIGHTS, DeltaHeader, delta_path  # noqa: E402
from speedtronic.distributed.s3.client import S3Client  # noqa: E402
from speedtronic.distributed.s3.transport import S3Transport  # noqa: E402
from speedtronic.distributed.worker.plugin import parameters_of  # noqa: E402
from speedtronic.hub.budget import HUB_COMMITS_PER_HOUR  # noqa: E402
from speedtronic.registry import build_model  # noqa: E402

BUCKET, PREFIX = "fleet", "run"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "AKIAFLEETBENCH000000", "AWS_SECRET_ACCESS_KEY": "f" * 40}
MODELS = {  # 10m: benchmarks/engine/overhead.py's ~10M config; small: for a quick look
    "10m": {"seq_len": 256, "n_layer": 6, "n_head": 6, "n_kv_head": 3, "d_model": 384},
    "small": {"seq_len": 64, "n_layer": 2, "n_head": 4, "d_model": 128},
}
SERVER = (
    "import logging, sys, time\nfrom moto.server import ThreadedMotoServer\n"
    "logging.getLogger('werkzeug').setLevel(logging.ERROR)\n"
    "ThreadedMotoServer(ip_address='127.0.0.1', port=int(sys.argv[1]), verbose=False).start()\n"
    "print('ready', flush=True)\nwhile True: time.sleep(60)\n"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def weights_of(model_name: str) -> dict[str, torch.Tensor]:
    raw = SpeedtronicConfig.default().to_dict(redact=False)
    raw["model"].update(MODELS[model_name])
    torch.manual_seed(0)
    config = SpeedtronicConfig.from_dict(raw).model
    model = build_model(config.name, config.params, config.imports)
    return {k: p.detach().float().clone() for k, p in parameters_of(model).items()}


def transport(url: str, node_id: str, session, publish_interval_s: float = 0.0) -> S3Transport:
    client = S3Client(BUCKET, PREFIX, endpoint_url=url, node_id=node_id, session=session)
    return S3Transport(client, min_publish_interval_s=publish_interval_s)


# ---------------------------------------------------------------------------- the fleet


def run_fleet(args: argparse.Namespace) -> None:
    """The child process: ``--nodes`` threads for ``--minutes``, then its totals as JSON."""
    weights = weights_of(args.model)
    delta = {k: torch.randn_like(v) * 1e-3 for k, v in weights.items()}
    cap = expected_delta_bytes(weights, "fp32") + (1 << 20)
    session, deadline = boto3.session.Session(), time.monotonic() + args.minutes * 60
    stats: list[dict] = []

    def node(i: int) -> None:
        node_id, rng = f"node-{i:02d}", random.Random(i)
        link = transport(args.url, node_id, session)
        seq, known, upload_s, fetched = 0, -1, [], 0
        next_upload = time.monotonic() + rng.uniform(0, args.inner_loop_s)
        next_poll = time.monotonic() + rng.uniform(0, args.worker_poll_s)
        while (now := time.monotonic()) < deadline:
            if now >= next_upload:
                seq += 1
                header = DeltaHeader(node_id, seq, max(known, 0), 100, 100 * 8192, "bf16", "now")
                began = time.perf_counter()
                link.upload(delta_path(node_id, seq), encode_delta(delta, header))
                upload_s.append(time.perf_counter() - began)
                next_upload += args.inner_loop_s
            if now >= next_poll:
                counted = link.read_step_count()
                if counted and counted["outer_step"] > known:
                    if link.read(GLOBAL_WEIGHTS, cap) is not None:
                        known, fetched = counted["outer_step"], fetched + 1
                next_poll += args.worker_poll_s
            time.sleep(max(0.0, min(next_upload, next_poll) - time.monotonic()))
        stats.append({"uploads": seq, "globals": fetched, "upload_s": upload_s, **link.stats()})

    threads = [threading.Thread(target=node, args=(i,)) for i in range(args.nodes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps(stats), flush=True)


# ---------------------------------------------------------------------------- the master


class Events:
    def __init__(self) -> None:
        self.rounds: list[dict] = []
        self.warnings: list[str] = []

    def log(self, event: str, payload: dict) -> None:
        if event == "diloco_round":
            self.rounds.append(payload)

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def notice(self, message: str) -> None:
        pass


def run_master(args: argparse.Namespace, url: str) -> tuple[dict, list[dict]]:
    session, events = boto3.session.Session(), Events()
    boto3.client("s3", endpoint_url=url, region_name="us-east-1").create_bucket(Bucket=BUCKET)
    link = transport(url, "master", session, args.publish_interval_s)
    settings = SimpleNamespace(
        outer_lr=1.0,
        outer_momentum=0.0,
        min_deltas=1,
        max_wait_s=0.0,
        max_staleness=1000,
        staleness_discount=1.0,
        outer_policy="fleet",
        poll_interval=args.master_poll_s,
    )
    with tempfile.TemporaryDirectory(prefix="s3-fleet-") as state:
        loop = MasterLoop(settings, weights_of(args.model), link, events, state)
        loop.start()
        fleet = subprocess.Popen(
            [sys.executable, __file__, "--fleet-child", *sys.argv[1:], "--url", url],
            stdout=subprocess.PIPE,
        )
        began, polls = time.monotonic(), []
        while fleet.poll() is None:
            counter, t0 = link.client.counter, time.perf_counter()
            before, gets = counter.requests(), counter.requests("get")
            result = loop.poll_once()
            spent, fetched = counter.requests() - before, counter.requests("get") - gets
            polls.append((time.perf_counter() - t0, spent, result, fetched))
            time.sleep(max(0.0, args.master_poll_s - (time.perf_counter() - t0)))
        wall, timed_included = time.monotonic() - began, loop.counters["included"]
        fleet_stats = json.loads(fleet.stdout.read())
        loop.poll_once(force=True)  # what arrived at the end: counted, not timed
        totals = link.stats()
    rounds = [(s, n, r) for s, n, r, _ in polls if r is not None]
    idle = [(s, n) for s, n, r, fetched in polls if r is None and not fetched]  # nothing new
    return {
        "wall_s": wall,
        "polls": len(polls),
        "rounds": len(rounds),
        "deltas_per_round": statistics.median(len(r.included) for _, _, r in rounds),
        "round_s_median": statistics.median(s for s, _, _ in rounds),
        "round_s_max": max(s for s, _, _ in rounds),
        "requests_per_round_median": statistics.median(n for _, n, _ in rounds),
        "requests_per_idle_poll_median": statistics.median(n for _, n in idle) if idle else None,
        "idle_polls": len(idle),
        "busy_share": sum(p[0] for p in polls) / wall,
        # the master's seconds per delta it took in (fetch, validate, offer; its share of the
        # rounds' outer steps, saves and publishes): what bounds the fleet it keeps up with
        "s_per_delta": sum(p[0] for p in polls) / max(timed_included, 1),
        "included": loop.counters["included"],
        "rejected": loop.counters["rejected"],
        "stale": loop.counters["stale"],
        "warnings": events.warnings[:5],
        **{k: v for k, v in totals.items()},
    }, fleet_stats


def summarize(args: argparse.Namespace, master: dict, fleet: list[dict], weights: dict) -> dict:
    hours = master["wall_s"] / 3600
    per_hour = lambda n: n / hours  # noqa: E731
    fleet_requests = sum(s["s3_requests"] for s in fleet)
    uploads = [t for s in fleet for t in s["upload_s"]]
    commits = estimate_commits_per_hour(
        nodes=args.nodes,
        inner_steps=1,
        step_time_s=args.inner_loop_s,
        min_publish_interval_s=max(args.publish_interval_s, 60.0),  # the Hub's default pace
    )
    hub_max = max(0.0, (HUB_COMMITS_PER_HOUR - 3600 / 60.0) * args.inner_loop_s / 3600)
    return {
        "nodes": args.nodes,
        "model_params": sum(t.numel() for t in weights.values()),
        "delta_bytes": expected_delta_bytes(weights, "bf16"),
        "weights_bytes": expected_delta_bytes(weights, "fp32"),
        "inner_loop_s": args.inner_loop_s,
        "minutes": round(master["wall_s"] / 60, 2),
        "master": {k: v for k, v in master.items() if not k.startswith("s3_requests_1h")},
        "deltas_uploaded": sum(s["uploads"] for s in fleet),
        "upload_s_median": statistics.median(uploads),
        "globals_fetched_per_node": statistics.median(s["globals"] for s in fleet),
        "requests_per_hour": {
            "master": per_hour(master["s3_requests"]),
            "each_node": per_hour(fleet_requests / len(fleet)),
            "fleet_total": per_hour(fleet_requests + master["s3_requests"]),
        },
        "bytes_per_hour": {
            "up": per_hour(sum(s["s3_bytes_up"] for s in fleet) + master["s3_bytes_up"]),
            "down": per_hour(sum(s["s3_bytes_down"] for s in fleet) + master["s3_bytes_down"]),
        },
        "master_keeps_up_with_nodes": args.inner_loop_s / master["s_per_delta"],
        "hub_commits_per_hour_same_cadence": commits,
        "hub_max_nodes_same_cadence": hub_max,
    }


def print_table(row: dict) -> None:
    m = row["master"]
    print(
        f"{row['nodes']} nodes, {row['model_params'] / 1e6:.1f}M params "
        f"(delta {row['delta_bytes'] / 1e6:.1f} MB bf16, weights {row['weights_bytes'] / 1e6:.1f}"
        f" MB), inner loop {row['inner_loop_s']:g} s, {row['minutes']:.1f} min"
    )
    print(f"  deltas uploaded / applied   {row['deltas_uploaded']} / {m['included']}")
    print(f"  upload (PUT) median         {row['upload_s_median']:.2f} s")
    print(
        f"  master rounds               {m['rounds']} of median {m['deltas_per_round']} deltas, "
        f"round time median {m['round_s_median']:.2f} s, max {m['round_s_max']:.2f} s"
    )
    print(
        f"  master requests             {m['requests_per_round_median']} per round, "
        f"{m['requests_per_idle_poll_median']} per idle poll; busy {m['busy_share']:.0%}"
    )
    print(
        f"  master per delta            {m['s_per_delta']:.3f} s: keeps up with "
        f"{row['master_keeps_up_with_nodes']:.0f} nodes at this cadence on this machine"
    )
    rh, bh = row["requests_per_hour"], row["bytes_per_hour"]
    print(
        f"  requests per hour           master {rh['master']:,.0f}, each node "
        f"{rh['each_node']:,.0f}, all {rh['fleet_total']:,.0f}"
    )
    print(
        f"  bytes per hour              up {bh['up'] / 1e9:.1f} GB, down {bh['down'] / 1e9:.1f} GB"
    )
    print(
        f"  Hub at this cadence         {row['hub_commits_per_hour_same_cadence']:,.0f} commits/h "
        f"(limit ~{HUB_COMMITS_PER_HOUR}): at most {row['hub_max_nodes_same_cadence']:.1f} nodes"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--model", choices=sorted(MODELS), default="10m")
    parser.add_argument("--inner-loop-s", type=float, default=30.0)
    parser.add_argument("--minutes", type=float, default=4.0)
    parser.add_argument("--master-poll-s", type=float, default=2.0)
    parser.add_argument("--worker-poll-s", type=float, default=10.0)
    parser.add_argument("--publish-interval-s", type=float, default=30.0)
    parser.add_argument("--fleet-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.update(CREDENTIALS)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    if args.fleet_child:
        run_fleet(args)
        return 0
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], stdout=subprocess.PIPE)
    try:
        assert server.stdout.readline().strip() == b"ready"
        master, fleet = run_master(args, f"http://127.0.0.1:{port}")
    finally:
        server.terminate()
        server.wait()
    row = summarize(args, master, fleet, weights_of(args.model))
    print_table(row)
    print(json.dumps({"benchmark": "s3_fleet", **row}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
