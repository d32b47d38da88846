"""Issue 31, items 6 and 7: what a new user reads and sees after the quick start.

6. The docs' times and install promises against a 2-core machine; the ``[dev]`` extra installed
   S3 and test servers for users who only train (now ``[test]`` holds what the suite needs).
7. The loss sparkline printed twice on a terminal, a command's help line cut short at 80
   columns, PyTorch's DataLoader worker-count warning from configs/gpt2_small.yaml on a 2-core
   machine, and three bf16 slowdown figures in the docs for one fact.
"""

from __future__ import annotations

import io
import re
import sys
import warnings
from pathlib import Path

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from speedtronic.cli.app import app

ROOT = Path(__file__).resolve().parents[2]


# ---- item 7: the sparkline ------------------------------------------------------------------


def test_a_terminal_shows_the_loss_sparkline_once(monkeypatch):
    """The live table's caption holds the sparkline while training; when the run ends the
    table stays on screen, so its last frame must not repeat what the summary prints."""
    import speedtronic.cli.display as display

    class FakeLive:  # what rich.live.Live leaves on screen: its renderable when stopped
        def __init__(self, renderable, **options):
            self.renderable = renderable

        def start(self):
            pass

        def update(self, renderable, refresh=False):
            self.renderable = renderable

        def stop(self):
            FakeLive.left = self.renderable

    monkeypatch.setattr(display, "Live", FakeLive)
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    table = display.LiveTable()
    table.on_event("run_start", {"name": "n", "model": "m", "params": 1, "device": "cpu"})
    for step in range(1, 5):
        row = {"step": step, "max_steps": 4, "loss": 5.0 - step, "lr": 1e-3, "grad_norm": 1.0}
        row |= {"tokens_per_s": 1.0, "steps_per_s": 1.0, "data_wait_share": 0.0}
        table.on_event("train_step", row)
    screen = io.StringIO()
    Console(file=screen, width=120).print(table.live.renderable)
    assert screen.getvalue().count("loss: ") == 1  # live: in the caption
    end = {"steps": 4, "final_loss": 1.0, "tokens": 4, "elapsed_s": 1.0, "tokens_per_s": 4.0}
    table.on_event("run_end", {**end, "status": "completed"})
    screen = io.StringIO()
    Console(file=screen, width=120).print(FakeLive.left)
    assert screen.getvalue().count("loss: ") + out.getvalue().count("loss: ") == 1
    assert "loss: ████" not in screen.getvalue() and "loss: " in out.getvalue()


# ---- item 7: help at 80 columns --------------------------------------------------------------


def groups() -> list[list[str]]:
    root = typer.main.get_command(app)
    return [[]] + [[name] for name, c in root.commands.items() if getattr(c, "commands", None)]


@pytest.mark.parametrize("path", groups(), ids=lambda p: " ".join(p) or "speedtronic")
def test_no_command_line_of_a_help_is_cut_short_at_80_columns(path):
    result = CliRunner().invoke(app, [*path, "--help"], terminal_width=80)
    assert result.exit_code == 0
    commands = result.stdout.split("Commands:")[1]
    cut = [line for line in commands.splitlines() if line.rstrip().endswith("...")]
    assert not cut, cut


# ---- item 7: DataLoader workers above the core count ----------------------------------------


def test_more_workers_than_cores_is_one_line_of_ours_not_pytorchs(tiny, monkeypatch):
    """configs/gpt2_small.yaml asks for 4 workers; a 2-core machine got PyTorch's warning. A
    map-style source is cut to the cores (its batches stay the same), and says so once."""
    import speedtronic.train.preflight as preflight
    from speedtronic.runtime import train_from_config

    monkeypatch.setattr(preflight, "cpu_cores", lambda: 1)
    tiny["data"]["num_workers"] = 3
    tiny["run"]["max_steps"] = 2
    seen = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_from_config(tiny, console=False, hooks=[lambda e, p: seen.append((e, p))])
    assert not [w for w in caught if "DataLoader will create" in str(w.message)]
    said = [p["message"] for e, p in seen if e in ("notice", "warning")]
    assert "data.num_workers: 3 workers for 1 CPU cores; using 1 (the batches are the same" in (
        " ".join(said)
    )


# ---- item 7: one bf16 slowdown figure ---------------------------------------------------------


def doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def prose_paragraphs(page: Path) -> list[str]:
    """The page's paragraphs outside code blocks (sample output quotes the probe's own ratio)."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return [" ".join(p.split()) for p in text.split("\n\n")]


def test_the_docs_give_one_figure_for_how_much_slower_emulated_bf16_trains():
    """The fact is measured and cited once (docs/benchmarks.md, benchmarks/engine/emulated_step.py);
    every other paragraph about emulated bf16's slowness refers to it, with the same figure."""
    bench = ROOT / "docs" / "benchmarks.md"
    [figure] = re.findall(
        r"\*\*How much slower bf16 trains there: about (\d+)x\.\*\*", bench.read_text()
    )
    for page in doc_pages():
        if page == bench:
            continue
        for paragraph in prose_paragraphs(page):
            if not ("bf16" in paragraph and "emulated" in paragraph and "slower" in paragraph):
                continue
            assert "benchmarks.md#slow-or-emulated-dtypes" in paragraph, (page.name, paragraph)
            assert set(re.findall(r"(\d+(?:\.\d+)?)x slower", paragraph)) <= {figure}, paragraph


# ---- item 6: what a user installs and how long things take ----------------------------------


def test_a_user_who_only_trains_installs_no_test_servers():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    test = " ".join(extras["test"])
    for needed in ("pytest", "moto", "boto3", "flask", "tokenizers"):
        assert needed in test
    assert "speedtronic[test]" in extras["dev"] and any("ruff" in r for r in extras["dev"])
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    install = next(line for line in quick.splitlines() if "pip install" in line)
    assert '".[dev]"' not in install and '".[test]"' not in install, install
    assert '".[test]"' in quick and "python -m pytest -q" in quick
    assert re.search(r"the tests take\s+\d+-\d+ min", quick, re.I), quick
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r'-e "\.\[[a-z,]*dev', ci)  # dev holds test: CI installs what tests need
