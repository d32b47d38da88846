"""Shared by the DumbDiLoCo tests: a logger that records, and the distributed settings."""

from __future__ import annotations

from types import SimpleNamespace


class Log:
    def __init__(self):
        self.events, self.warnings = [], []

    def log(self, event, payload):
        self.events.append((event, payload))

    def warn(self, message):
        self.warnings.append(message)

    def notice(self, message):
        pass


def settings(**overrides):
    base = dict(
        node_id="node-a",
        inner_steps=2,
        poll_interval=0.01,
        reset_inner_optimizer=True,
        install="boundary",  # the unit tests of boundaries; test_diloco_eager sets eager
        delta_dtype="fp32",
        upload_timeout_s=5.0,
        outer_lr=1.0,
        outer_momentum=0.0,
        min_deltas=1,
        max_wait_s=0.0,
        max_staleness=4,
        staleness_discount=1.0,
        outer_policy="fleet",
        reapply_own_delta=False,
        sync_wait_s=0.0,
        drain_timeout_s=0.0,  # no test waits at the end unless it says so
        in_flight_disk_bytes=8 << 30,
        # no nodes/<id>/node.json: these tests count uploads and files; test_transport_contract
        # and the processes end to end send it
        announce=False,
    )
    return SimpleNamespace(**{**base, **overrides})
