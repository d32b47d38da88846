"""The master's publish: save its state, then publish the weights and ``step_count.json``.

I3: ``Publisher.publish`` saves the master's state to ``state_dir`` *before* the repo sees the
new outer step, so a published step always has a saved state behind it and a restarted master
republishes the same weights. The publish itself is one transport call (the weights, the step
count and the deletes of consumed deltas: one Hub commit, or write-then-rename on a directory);
if it fails, ``unpublished`` stays set and the next poll publishes again. It also spaces
publishes by the transport's ``min_publish_interval_s`` (the Hub limits commits per repo).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from speedtronic.distributed.codec import encode_weights
from speedtronic.distributed.transport import Transport

Tensors = dict[str, torch.Tensor]


class Publisher:
    """Saves and publishes outer steps; remembers when it last did and whether one failed."""

    def __init__(self, transport: Transport, logger: Any, state_dir: Path, clock: Callable):
        self.transport, self.logger, self.state_dir, self.clock = (
            transport,
            logger,
            state_dir,
            clock,
        )
        # the Hub limits commits per repo, so its transport asks for a pause between publishes
        self.min_interval_s = getattr(transport, "min_publish_interval_s", 0.0)
        self.last_publish = -float("inf")  # on ``clock``
        # What the repo should hold: the step and weights sha256 this master last published
        self.last_step: int | None = None
        self.last_sha: str | None = None
        self.unpublished = False  # a saved step the repo does not have yet

    def due(self) -> bool:
        """Whether a round may publish now (``min_publish_interval_s`` since the last one)."""
        return self.clock() - self.last_publish >= self.min_interval_s

    def publish(
        self, master: Any, weights: Tensors, consumed: list[str], extra: dict[str, Any]
    ) -> None:
        """Save ``master``'s state, then publish ``weights`` at its outer step, deleting
        ``consumed``; ``extra`` joins the step count. Raises when it did not land."""
        self.unpublished = True
        outer_step = master.outer_step
        master.snapshot().save(self.state_dir)  # before publishing: I3
        data = encode_weights(weights, outer_step)
        step_count = {
            "outer_step": outer_step,
            "updated_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "weights_sha256": hashlib.sha256(data).hexdigest(),
            "format": 1,
            # the fleet's pace: a node reapplies its deltas a global lacks at its share of it
            "fleet_tokens_per_step": round(master.fleet_rate),
            **extra,
        }
        start = time.perf_counter()
        self.transport.publish(data, step_count, consumed)
        self.last_publish, self.unpublished = self.clock(), False
        self.last_step, self.last_sha = outer_step, step_count["weights_sha256"]
        self.logger.log(
            "diloco_publish",
            {"outer_step": outer_step, "bytes": len(data), "seconds": time.perf_counter() - start},
        )
