"""Applying a round of ``global_dtype: deltas``: the one arithmetic, and a node's replay.

``apply_round`` is the only function that turns a round's deltas into the next weights: float32
on the CPU, the deltas in the record's order, ``w - lr * sum(coef * delta)``. The master computes
its outer step with it (``master.outer``) and every node replays the record with it
(``RoundReplayer``), so both produce the same bits on the same kind of CPU; a node checks that
against the record's ``weights_sha256`` and never trusts it (another CPU, a corrupted download).

``RoundReplayer`` keeps the last step it verified. Given a newer ``RoundChain`` it replays the
rounds after that step, or, when it holds none of the chain (a start, a rejoin, a node too far
behind), reads the chain's keyframe and replays from there. Every delta is read with its size
as the cap and checked against the record's sha256, then validated as any delta is
(``codec.decode_delta``). A round it cannot apply (a delta missing, damaged, oversized, or a
result that disagrees) is refused with one line naming the file or the round, counted, and the
node re-anchors on the next keyframe past it: until one comes, it keeps the weights it has.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import safetensors.torch
import torch
from torch import Tensor

from speedtronic.distributed.codec import canonical, decode_delta, expected_delta_bytes
from speedtronic.distributed.protocol import BadDelta
from speedtronic.distributed.round_record import Round, RoundChain
from speedtronic.errors import DamagedRepoFile

Tensors = dict[str, Tensor]


def weights_sha256(weights: Tensors) -> str:
    """The sha256 of float32 weights: names, shapes and bytes, in sorted name order."""
    digest = hashlib.sha256()
    for key in sorted(weights):
        value = weights[key].detach().to("cpu", torch.float32).contiguous()
        digest.update(f"{key}:{tuple(value.shape)};".encode())
        digest.update(value.numpy().tobytes())
    return digest.hexdigest()


@torch.no_grad()
def apply_round(weights: Tensors, parts: list[tuple[Tensors, float]], lr: float) -> Tensors:
    """New weights ``w - lr * sum(coef * delta)``: float32 on the CPU, ``parts`` in order.
    ``weights`` are not changed (a node's cached step stays valid if a later check fails)."""
    total = {key: torch.zeros_like(value, dtype=torch.float32) for key, value in weights.items()}
    for tensors, coef in parts:
        for key, acc in total.items():
            acc.add_(tensors[key].to("cpu", torch.float32), alpha=coef)
    return {
        key: value.to("cpu", torch.float32).sub(total[key], alpha=lr)
        for key, value in weights.items()
    }


def encode_round_file(chain: RoundChain) -> bytes:
    """The bytes published at ``global/latest.safetensors``: no tensors, the chain as metadata."""
    return canonical(safetensors.torch.save({}, metadata=chain.to_metadata()))


# (keyframe step, its file's sha256, the step that needs it, max bytes) -> (weights, bytes read)
# What a round record's file holds beside its rounds, and per delta it names (JSON, generous)
RECORD_BYTES, RECORD_BYTES_PER_DELTA = 400, 200


def deltas_bytes_per_round(
    reference: Tensors, delta_dtype: str, nodes: int, keyframe_every: int
) -> dict[str, int]:
    """Bytes per round with ``global_dtype: deltas`` when ``nodes`` nodes send one delta each:
    a node uploads its delta and downloads the others' and the record (up to ``keyframe_every``
    rounds long); the master uploads the record and a keyframe every ``keyframe_every`` rounds.
    Full weights reach a node only when it starts, rejoins or falls out of step."""
    delta = expected_delta_bytes(reference, delta_dtype)
    record = RECORD_BYTES + RECORD_BYTES_PER_DELTA * nodes * keyframe_every
    full = expected_delta_bytes(reference, "fp32")
    return {
        "node_up": delta,
        "node_down": (nodes - 1) * delta + record,
        "master_up": record + full // keyframe_every,
    }


KeyframeLoader = Callable[[int, str, int, int], tuple[Tensors, int]]


class RoundReplayer:
    """A node's replay of round records onto its last verified step (module doc)."""

    def __init__(self, transport: Any, reference: Tensors, load_keyframe: KeyframeLoader):
        self.transport, self.reference, self.load_keyframe = transport, reference, load_keyframe
        self.step: int | None = None  # the last verified outer step and its weights
        self.sha256: str | None = None
        self.weights: Tensors | None = None
        self.failed: int | None = None  # a round refused: wait for a keyframe past it
        self.refusal = ""  # ... and the line that said why
        # sha256 -> bytes this node holds already (its own sent deltas: ``worker.inflight``)
        self.held: Callable[[str], bytes | None] = lambda sha256: None
        self.counts = {"rounds_applied": 0, "rounds_refused": 0, "round_mismatches": 0}

    def read(self, chain: RoundChain, max_bytes: int) -> tuple[Tensors, int]:
        """The weights at ``chain.outer_step`` and the bytes it took; BadDelta if it cannot."""
        newest = chain.outer_step if chain.newest_sha256 else chain.keyframe_step
        if self.failed is not None and newest < self.failed:
            raise BadDelta(self.refusal)  # the same line: said once, not downloaded again
        reanchor, self.failed = self.failed is not None, None  # on the keyframe past it
        if self.step == chain.outer_step and self._verified(chain):
            return self.weights, 0
        read = 0
        if reanchor or not (self.step is not None and chain.keyframe_step <= self.step
                            < chain.outer_step and self._verified(chain)):  # fmt: skip
            # none of the chain here: its newest keyframe (the step itself), or its base
            at, sha = chain.keyframe_step, chain.keyframe_sha256
            if chain.newest_sha256:
                at, sha = chain.outer_step, chain.newest_sha256
            weights, read = self.load_keyframe(at, sha, chain.outer_step, max_bytes)
            self.step, self.weights, self.sha256 = at, weights, None
        for one in chain.since(self.step):
            read += self._apply(one)
        return self.weights, read

    def _verified(self, chain: RoundChain) -> bool:
        """Whether this node's step is the chain's (its sha256 as the record names it)."""
        if self.step == chain.keyframe_step:  # a step means the same weights (I3): verified
            return True  # at it (a round's sha256, or its keyframe), they are the keyframe's
        if self.sha256 is None:  # read as the newest keyframe of an earlier chain
            return self.step == chain.outer_step and bool(chain.newest_sha256)
        entry = chain.round_at(self.step)
        return entry is not None and entry.weights_sha256 == self.sha256

    def _apply(self, one: Round) -> int:
        parts, read = [], 0
        for delta in one.deltas:
            data = self.held(delta.sha256)
            if data is None:
                data = self._download(one, delta.path, delta.size)
                read += len(data)
            if len(data) != delta.size or hashlib.sha256(data).hexdigest() != delta.sha256:
                raise self._refuse(one, f"{delta.path} is not the delta the record names "
                                        "(its size or sha256 differs)")  # fmt: skip
            try:
                _, tensors = decode_delta(data, delta.path, self.weights)
            except BadDelta as exc:
                raise self._refuse(one, f"{delta.path} is damaged ({exc})") from None
            parts.append((tensors, delta.coef))
        weights = apply_round(self.weights, parts, one.lr)
        sha = weights_sha256(weights)
        if sha != one.weights_sha256:
            self.counts["round_mismatches"] += 1
            raise self._refuse(one, "the weights this node computed differ from the record's "
                                    "sha256 (another CPU, or a damaged download)")  # fmt: skip
        self.step, self.weights, self.sha256 = one.outer_step, weights, sha
        self.counts["rounds_applied"] += 1
        return read

    def _download(self, one: Round, path: str, size: int) -> bytes:
        try:  # a passing fault (TransportError) propagates: the next poll reads again
            data = self.transport.read(path, size)
        except DamagedRepoFile as exc:  # oversize, a link, not a file: refused by name
            raise self._refuse(one, f"{path} cannot be read ({exc})") from None
        if data is None:
            raise self._refuse(one, f"{path} is missing")
        return bytes(data)

    def _refuse(self, one: Round, why: str) -> BadDelta:
        self.failed = one.outer_step
        self.counts["rounds_refused"] += 1
        self.refusal = (
            f"outer step {one.outer_step} not applied: {why}; re-anchoring on the next keyframe"
        )
        return BadDelta(self.refusal)
