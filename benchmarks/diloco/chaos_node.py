"""One node of the chaos benchmark: ``speedtronic train`` whose repo fails now and then.

Usage (``benchmarks/diloco/chaos.py`` starts it; the arguments after ``--`` are speedtronic's)::

    python benchmarks/diloco/chaos_node.py --seed 7 --fault-rate 0.1 --step-s 0.01 \\
        --faults-log runs/w1/faults.log -- train -c w1.yaml --output-dir runs/w1 --resume

It runs the package's own command line (``speedtronic.cli.app.main``) in this process, after two
patches that live here and never in the package:

- the transport ``distributed.setup`` opens is wrapped in ``FaultyTransport``, which fails about
  ``--fault-rate`` of the uploads, publishes, listings and reads the way the Hub's and S3's
  transports fail once their own retries gave up: ``HubError`` 503 and 429, and ``S3Error``
  timeouts, some of them after the write landed (``maybe_landed``, as a lost answer). The nodes'
  retry paths that handle them are the production ones;
- every optimizer step takes at least ``--step-s`` (a real fleet's steps take far longer than
  this tiny model's), so the schedule's seconds mean the same on a fast machine and a slow one.

Why a launcher: the package has no faults hook, and one read from the environment (a test
``sitecustomize``) or a ``chaos+file://`` repo spec would ship test code to every user and a
spec users could type. A launcher is the least invasive: the process is the one a user runs
(same CLI, config, transports and exit codes), and the faults stay in ``benchmarks/``.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the checkout this file is in, whatever is installed
WRITES = ("upload", "publish")
READS = ("list_deltas", "read", "read_step_count")


class FaultyTransport:
    """A transport whose calls fail at ``rate``, seeded; anything else passes through."""

    def __init__(self, inner: Any, rate: float, seed: Any, log: Path | None = None):
        self.inner, self.rate, self.log = inner, rate, log
        self.rng, self.lock = random.Random(str(seed)), threading.Lock()
        self.injected: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _fault(self, call: str, subject: str) -> Exception | None:
        """The error this call raises, or None; a write's may come after it landed."""
        with self.lock:
            if self.rng.random() >= self.rate:
                return None
            kind = self.rng.choice(("hub_503", "hub_429", "s3_timeout"))
        self.injected[kind] = self.injected.get(kind, 0) + 1
        if self.log is not None:
            with open(self.log, "a") as out:
                out.write(f"{time.time():.3f} {kind} {call} {subject}\n")
        return _error(kind, call, subject)

    def upload(self, path: str, data: bytes) -> None:
        error = self._fault("upload", path)
        if error is not None and getattr(error, "maybe_landed", False):
            self.inner.upload(path, data)  # landed, its answer lost
            self._landed(path, data)
        if error is not None:
            raise error
        self.inner.upload(path, data)
        self._landed(path, data)

    def _landed(self, path: str, data: bytes) -> None:
        """For the benchmark's account: a delta that landed, with its steps (killed processes'
        own logs lose what they sent after their checkpoint, ``--resume`` rewinds them)."""
        from speedtronic.distributed.worker.resume import header_of

        header = header_of(data) if self.log is not None and "/delta_" in path else None
        if header is not None:
            with open(self.log, "a") as out:
                out.write(f"{time.time():.3f} landed upload {path} {header.steps}\n")

    def publish(self, weights: bytes, step_count: dict, consumed: list[str]) -> None:
        if (error := self._fault("publish", "global/")) is not None:
            raise error  # a publish raises only when nothing landed (the Transport contract)
        self.inner.publish(weights, step_count, consumed)

    def list_deltas(self) -> list:
        if (error := self._fault("list_deltas", "nodes/")) is not None:
            raise error
        return self.inner.list_deltas()

    def read(self, path: str, max_bytes: int) -> bytes | None:
        if (error := self._fault("read", path)) is not None:
            raise error
        return self.inner.read(path, max_bytes)

    def read_step_count(self) -> dict | None:
        if (error := self._fault("read_step_count", "global/step_count.json")) is not None:
            raise error
        return self.inner.read_step_count()


def _error(kind: str, call: str, subject: str) -> Exception:
    """What ``HubClient`` / ``S3Client`` raise for a transient failure after their retries."""
    from speedtronic.distributed.s3.errors import S3Error
    from speedtronic.hub.errors import HubError

    if kind == "hub_503":
        return HubError(f"{call} {subject}: 503 Service Unavailable (chaos)", status=503)
    if kind == "hub_429":
        return HubError(f"{call} {subject}: 429 Too Many Requests (chaos)", status=429)
    landed = call == "upload"  # S3: a PUT whose answer timed out may have landed
    return S3Error(f"{call} {subject}: read timed out (chaos)", maybe_landed=landed)


def patch(seed: str, rate: float, step_s: float, log: Path | None) -> None:
    """The two patches (module docstring); before the CLI imports anything that uses them."""
    from speedtronic.distributed import setup
    from speedtronic.distributed.worker.plugin import WorkerPlugin

    opened = setup.open_transport
    setup.open_transport = lambda repo, settings=None: FaultyTransport(
        opened(repo, settings), rate, seed, log
    )
    stepped = WorkerPlugin.after_optimizer_step

    def paced(self: Any, trainer: Any) -> None:
        time.sleep(step_s)
        stepped(self, trainer)

    WorkerPlugin.after_optimizer_step = paced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", required=True)
    parser.add_argument("--fault-rate", type=float, default=0.1)
    parser.add_argument("--step-s", type=float, default=0.0)
    parser.add_argument("--faults-log", type=Path)
    args, rest = parser.parse_known_args()
    patch(args.seed, args.fault_rate, args.step_s, args.faults_log)
    from speedtronic.cli.app import main as speedtronic

    sys.argv = ["speedtronic", *[a for a in rest if a != "--"]]
    speedtronic()


if __name__ == "__main__":
    main()
