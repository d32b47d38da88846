"""docs/continue-pretraining.md (issue 55 item 7): the before/after scores are comparable and
the packages the page needs are named before the first block that needs them. The page compared
the base at its whole context (2048) with the continued run at its training length (64): a
longer window gives each token more context, so the base looked better than it was."""

from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "continue-pretraining.md"


def test_both_runs_are_scored_at_one_window():
    evals = [line for line in PAGE.read_text().splitlines() if "speedtronic eval" in line]
    windows = {m.group(1) if (m := re.search(r"--window (\d+)", line)) else None for line in evals}
    assert len(evals) >= 2 and len(windows) == 1 and None not in windows, evals


def test_the_packages_are_named_before_the_first_runnable_block():
    text = PAGE.read_text()
    before = text[: text.index("<!-- runnable")]
    assert "`tokenizers`" in before and "`transformers`" in before
    assert 'pip install -e ".[export]"' in before
