"""``--format json`` is strict JSON (issue 46): a non-finite number is ``null``, never the bare
``NaN`` / ``Infinity`` that only Python's parser reads, and every command prints through the one
helper that guarantees it.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from modelout_support import invoke, latest, train

import speedtronic.cli
from speedtronic.cli.jsonout import json_text

# Commands another change is converting; each one leaves this list when it prints via json_text.
PENDING = {"train.py"}


def strict(text: str) -> object:
    def refuse(word: str) -> None:
        raise ValueError(f"not JSON: {word}")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_numbers_are_null_at_any_depth():
    doc = {"a": math.nan, "b": [math.inf, 1.5, (-math.inf,)], "c": {"d": {"e": math.nan}}}
    assert strict(json_text(doc)) == {"a": None, "b": [None, 1.5, [None]], "c": {"d": {"e": None}}}
    assert "\n" not in json_text(doc, indent=None)


def test_ckpt_inspect_of_a_nan_loss_prints_strict_json(tmp_path):
    run = train(tmp_path)
    meta = latest(run) / "meta.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "loss": math.nan}))
    result = invoke("ckpt", "inspect", run, "--format", "json")
    assert result.exit_code == 0, result.stderr
    (checkpoint,) = strict(result.stdout)["checkpoints"]
    assert checkpoint["loss"] is None


def test_every_command_prints_json_through_the_strict_helper():
    folder = Path(speedtronic.cli.__file__).parent
    loose = re.compile(r"print\(\s*json\.dumps\(")
    found = {p.name for p in folder.glob("*.py") if loose.search(p.read_text(encoding="utf-8"))}
    assert found <= PENDING, f"print(json_text(...)) instead of json.dumps in {found - PENDING}"
