"""The fleet's example configs resume as docs/diloco.md says (issue 55, item 11).

``--resume`` after a kill -9 continues from the newest checkpoint; a config with no checkpoint
interval saves only at the end, so the documented resume of ``examples/diloco_*.yaml`` started a
fresh run (the fleet did 650 steps instead of 600). Each example saves at least once per inner
loop, so a killed node loses at most one inner loop, as a worker that lost its state does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from speedtronic.config import SpeedtronicConfig

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("diloco_*.yaml"))


def test_there_are_fleet_examples():
    assert len(EXAMPLES) >= 2, EXAMPLES


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_each_fleet_example_saves_a_checkpoint_every_inner_loop(path):
    config = SpeedtronicConfig.load(path)
    interval, inner = config.checkpoint.interval, config.distributed.inner_steps
    assert 0 < interval <= inner, f"{path.name}: checkpoint.interval {interval}, inner {inner}"
    assert config.run.max_steps > interval  # a checkpoint before the end, to resume from


def test_docs_say_why_a_fleet_node_sets_a_checkpoint_interval():
    text = (Path(__file__).parents[2] / "docs" / "diloco.md").read_text()
    assert "checkpoint:\n  interval:" in text or "`checkpoint.interval`" in text
