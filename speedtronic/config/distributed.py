"""The ``distributed`` section of the config: DumbDiLoCo's settings, validated.

Split from ``sections.py`` (every other section) only to keep modules readable; the
behaviour these settings drive lives in ``speedtronic.distributed``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

from speedtronic.config.messages import brief
from speedtronic.config.rules import NODE_ID_RE, STEPS, is_hub_user_name, ranged
from speedtronic.config.storage import endpoint_url_problem, is_s3_url, parse_s3_url


@dataclass
class DistributedConfig:
    """DumbDiLoCo settings (docs/diloco.md). The behaviour lives in ``speedtronic.distributed``.

    ``repo_id`` is a Hugging Face Hub repo id, an object-storage bucket (``s3://bucket/prefix``,
    with ``endpoint_url`` for stores other than AWS) or a shared directory (a path or ``file://``
    URL); ``path`` is an alias for a directory. ``node_id`` defaults to ``$HF_USERNAME``, then
    ``$USER``, then ``local``; it names the node's folder in the repo, so it must be path-safe.
    """

    enabled: bool = False
    mode: Literal["dumb_diloco"] = "dumb_diloco"
    role: Literal["worker", "master"] = "worker"
    node_id: str | None = None
    repo_id: str | None = None
    path: str | None = None  # alias: a shared directory
    endpoint_url: str | None = None  # s3:// repos: the store's URL; None: $AWS_ENDPOINT_URL, AWS
    token: str | None = field(default=None, repr=False)
    inner_steps: int = ranged(500, STEPS)  # optimizer steps between syncs (H)
    poll_interval: float = ranged(60.0, "(0, 86400]", "at most a day")  # seconds
    # false: AdamW moments carry across installs; a reset measured 4-5 points worse over 12 and
    # 48 rounds (docs/diloco.md, "Why the defaults"), though upstream DiLoCo resets
    reset_inner_optimizer: bool = False
    # install the global minus this node's deltas it lacks, at the master's share, so the node
    # does not train on from weights that lack its own work
    reapply_own_delta: bool = True
    # eager: install a newer global as soon as it is downloaded, carrying the progress since the
    # last boundary (the best measured at equal wall-clock); boundary: only at an inner loop's end
    install: Literal["eager", "boundary"] = "eager"
    train_locally: bool = True  # false: a master that only coordinates
    outer_steps: int | None = ranged(None, STEPS)  # a coordinating-only master stops here
    state_dir: str | None = None  # master state; default <output_dir>/diloco_master
    # Plain averaging: the best asynchronous setting measured (docs/benchmarks.md, DumbDiLoCo);
    # the DiLoCo paper's 0.7 / 0.9 needs synchronous rounds
    outer_lr: float = ranged(1.0, "(0, inf)")
    outer_momentum: float = ranged(0.0, "[0, 1)")
    min_deltas: int = ranged(2, "[1, 2**20]")  # quorum of deltas per round
    # Timeouts feed sleeps and lock waits, which overflow past ~292 years; a week is plenty
    max_wait_s: float = ranged(600.0, "[0, 604800]", "at most a week")  # or a partial round
    max_staleness: int = ranged(4, "[0, 2**20]")  # outer steps behind: older deltas are dropped
    staleness_discount: float = ranged(0.5, "(0, 1]")  # weight x discount ** staleness
    # fleet: each round counts as its share of the fleet's work, momentum once per fleet loop;
    # naive: every round's mean in full with momentum (diverges with uneven workers)
    outer_policy: Literal["fleet", "naive"] = "fleet"
    delta_dtype: Literal["fp32", "bf16", "int8", "int4", "int2"] = "bf16"
    # what quantization dropped is added to the node's next delta (node state, checkpointed)
    error_feedback: bool = True
    # the master's publishes: full float32 weights (fp32), or an int8 / int4 update on a
    # keyframe (full weights renewed every keyframe_every outer steps and at the run's end)
    # deltas: no weights per round, a round record every node repeats (docs/diloco.md)
    global_dtype: Literal["fp32", "int8", "int4", "deltas"] = "fp32"
    keyframe_every: int = ranged(10, "[1, 2**20]")
    upload_timeout_s: float = ranged(60.0, "[0, 86400]")  # waiting for uploads at the end
    # The end of a run (docs/diloco.md): how long a node may stay silent before the master's
    # final round goes without its last delta, and how long a worker waits for a global that
    # holds its own; None: sized from the fleet's inner-loop time (60 s to an hour)
    drain_timeout_s: float | None = ranged(None, "[0, 604800]", "at most a week")
    # A stop is not an end (SIGTERM, Ctrl-C): the node saves its checkpoint first, then sends
    # and waits at most this long (a container's stop kills it 10 s after SIGTERM)
    stop_grace_s: float = ranged(5.0, "[0, 3600]", "at most an hour")
    # Sent deltas no global includes yet: past 3 in memory they go to <output_dir> on disk, up
    # to this many bytes (8 GiB); past that, later inner loops wait in the outbox
    in_flight_disk_bytes: int = ranged(8 << 30, "[0, 2**50]")
    # > 0: at each boundary wait up to this long for the global holding this node's delta
    # (synchronous DiLoCo when min_deltas = the number of nodes); 0: never wait
    sync_wait_s: float = ranged(0.0, "[0, 604800]", "at most a week")
    # The Hub limits commits per repo (~128/hour): the master publishes at most this often
    min_publish_interval_s: float = ranged(60.0, "[0, 86400]", "at most a day")  # seconds
    # Squash the Hub repo's history every this many publishes so storage stays bounded; 0: never
    squash_every: int = ranged(0, "[0, 2**40]")
    collaborators: list[str] = field(default_factory=list)  # Hub users the master grants write
    cache_dir: str | None = None  # Hub downloads; None -> the platformdirs user cache dir

    @property
    def repo(self) -> str | None:
        return self.repo_id or self.path

    @property
    def resolved_node_id(self) -> str:
        return self.node_id or os.environ.get("HF_USERNAME") or os.environ.get("USER") or "local"

    def check(self) -> list[str]:
        problems = []
        node_id = self.resolved_node_id
        if not NODE_ID_RE.fullmatch(node_id):
            where = "" if self.node_id else " (taken from $HF_USERNAME or $USER: set it)"
            problems.append(
                f"distributed.node_id{where}: must be 1-64 characters of letters, digits, '_', "
                f"'.', '-' starting with a letter or digit (got {brief(node_id)})"
            )
        if self.repo_id and self.path and self.repo_id != self.path:
            problems.append("distributed: set repo_id or its alias path, not both")
        if self.enabled and not self.repo:
            problems.append(
                "distributed.repo_id: required when distributed is enabled "
                "(a Hub repo id, s3://bucket/prefix, or a shared directory path or file:// URL)"
            )
        problems += self._check_storage()
        if self.enabled and not self.train_locally and (self.role != "master"):
            problems.append("distributed.train_locally: only a master may set it to false")
        if self.enabled and not self.train_locally and self.outer_steps is None:
            problems.append("distributed.outer_steps: required when train_locally is false")
        if self.global_dtype == "deltas" and self.outer_momentum > 0:
            problems.append(
                f"distributed.outer_momentum: must be 0 with global_dtype deltas (got "
                f"{self.outer_momentum}): a keyframe carries weights, not the momentum a "
                "joining node would need to repeat the rounds"
            )
        return problems + [
            f"distributed.collaborators: {brief(name)} is not a Hugging Face user name "
            "(1-96 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)"
            for name in self.collaborators
            if not is_hub_user_name(name)
        ]

    def _check_storage(self) -> list[str]:
        """An ``s3://`` repo spec and ``endpoint_url``: the bucket, prefix and URL rules."""
        problems = []
        key = "distributed.repo_id" if self.repo_id else "distributed.path"
        if is_s3_url(self.repo):
            try:
                parse_s3_url(self.repo)
            except ValueError as exc:
                problems.append(f"{key}: {exc} (got {brief(self.repo)})")
        if self.endpoint_url is not None:
            problem = endpoint_url_problem(self.endpoint_url)
            if problem is None and self.repo and not is_s3_url(self.repo):
                problem = "only for an s3:// repo_id"
            if problem is not None:  # a URL holding credentials is not echoed
                shown = "not shown" if "@" in str(self.endpoint_url) else brief(self.endpoint_url)
                problems.append(f"distributed.endpoint_url: {problem} (got {shown})")
        return problems
