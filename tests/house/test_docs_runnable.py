"""Runnable docs: every snippet marked runnable in README.md and docs/*.md runs as written.

Mark a fenced block by putting an HTML comment on the line right before its opening fence
(blank lines between are allowed); the comment is invisible on GitHub:

    <!-- runnable -->                        a ```bash block runs with bash -e -o pipefail,
                                             a ```python block with this Python
    <!-- runnable: slow -->                  also marked ``slow`` (skipped by -m "not slow")
    <!-- runnable: file my.yaml -->          not run: its text is written to my.yaml (any
                                             language), for the blocks after it to use
    <!-- runnable: needs tensorboard -->     skipped, with the reason, if the module is absent
    <!-- runnable: env KEY=VALUE ... -->     extra environment variables for this block
    <!-- runnable: hub -->                    runs against a local Hub emulator (tests/
                                             hub_emulator.py): HF_ENDPOINT points at it and
                                             HF_TOKEN is a write token of user "your-name"

Options combine (``<!-- runnable: slow needs tensorboard -->``). The blocks of one page run in
order in one fresh temporary directory holding a copy of what a fresh clone shows a user
(README.md, LICENSE, docs/, examples/, configs/), with the installed ``speedtronic`` on PATH:
a page is followed the way a user follows it, so a block may use what earlier blocks made.
Running one block alone (``-k``) first runs the blocks before it on its page. A failure names
the file, the line of the fence and the block, with the output's tail.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import proc_support
import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CLONE = ("README.md", "LICENSE", "docs", "examples", "configs")
MARKER = re.compile(r"^\s*<!--\s*runnable(?::\s*(?P<options>.*?))?\s*-->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
RUNS = {"bash": "bash", "sh": "bash", "shell": "bash", "python": "python", "py": "python"}


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    slow: bool = False
    file: str | None = None
    needs: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    hub: bool = False

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def parse_options(text: str, where: str) -> dict:
    """``slow``, ``hub``, ``file NAME``, ``needs MODULE``, ``env KEY=VALUE ...`` in any order."""
    words = text.split()
    options = {"slow": False, "file": None, "needs": [], "env": {}, "hub": False}
    i = 0
    while i < len(words):
        word = words[i]
        if word in ("slow", "hub"):
            options[word] = True
        elif word in ("file", "needs") and i + 1 < len(words):
            i += 1
            if word == "file":
                options["file"] = words[i]
            else:
                options["needs"].append(words[i])
        elif word == "env":
            while i + 1 < len(words) and "=" in words[i + 1]:
                i += 1
                key, _, value = words[i].partition("=")
                options["env"][key] = value
        else:
            raise ValueError(f"{where}: unknown runnable option {word!r} in {text!r}")
        i += 1
    return options


def extract(page: Path) -> list[Block]:
    """The runnable blocks of a page, in order; a marker without a block is an error."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    for n, line in enumerate(lines):
        marker = MARKER.match(line)
        if not marker:
            continue
        where = f"{page.relative_to(ROOT)}:{n + 1}"
        start = n + 1
        while start < len(lines) and not lines[start].strip():
            start += 1
        fence = FENCE.match(lines[start]) if start < len(lines) else None
        if fence is None:
            raise ValueError(f"{where}: runnable marker not followed by a fenced code block")
        options = parse_options(marker.group("options") or "", where)
        lang = fence.group("lang").lower()
        if options["file"] is None and lang not in RUNS:
            raise ValueError(f"{where}: cannot run a {lang or 'plain'} block (use: file NAME)")
        indent, close = len(fence.group("indent")), fence.group("fence")
        body: list[str] = []
        for end in range(start + 1, len(lines)):
            if lines[end].strip().startswith(close):
                break
            body.append(lines[end][indent:] if lines[end][:indent].isspace() else lines[end])
        else:
            raise ValueError(f"{where}: code block is never closed")
        blocks.append(Block(page, start + 1, lang, "\n".join(body) + "\n", **options))
    return blocks


BLOCKS = [block for page in PAGES for block in extract(page)]


class Page:
    """One page's working directory and how far through its blocks it has got."""

    def __init__(self, page: Path, root: Path):
        self.blocks = [b for b in BLOCKS if b.page == page]
        self.workdir = root
        self.done = 0
        for name in CLONE:
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("__pycache__"))
            elif source.exists():
                shutil.copy2(source, root / name)

    def run_through(self, block: Block) -> None:
        index = self.blocks.index(block)
        while self.done <= index:
            current = self.blocks[self.done]
            self.done += 1  # a failed prerequisite is not retried by every later block
            missing = [m for m in current.needs if importlib.util.find_spec(m) is None]
            if missing:
                if current is block:
                    pytest.skip(f"{block.where} needs {', '.join(missing)} (not installed)")
                continue  # a skipped step: later blocks fail loudly if they needed it
            self.run(current, prerequisite=current is not block)

    def run(self, block: Block, prerequisite: bool) -> None:
        if block.file is not None:
            target = self.workdir / block.file
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.code, encoding="utf-8")
            return
        script = (
            self.workdir / f".snippet_{block.line}.{'py' if RUNS[block.lang] == 'python' else 'sh'}"
        )
        script.write_text(block.code, encoding="utf-8")
        command = (
            [sys.executable, script.name]
            if RUNS[block.lang] == "python"
            else ["bash", "-e", "-o", "pipefail", script.name]
        )
        started = time.perf_counter()
        # waited for by its progress, not a clock: a loaded machine makes snippets slow
        with _hub_for(block) as hub_env:
            env = snippet_env({**block.env, **hub_env})
            if hub_env:
                env.pop("HF_HUB_OFFLINE")
            proc = proc_support.run(command, cwd=self.workdir, env=env)
        code, out, err = proc.returncode, proc.stdout, proc.stderr
        took = time.perf_counter() - started
        if code != 0:
            role = "a block this one follows on its page, " if prerequisite else ""
            pytest.fail(
                f"{block.where}: {role}this {block.lang} snippet failed (exit {code}, "
                f"{took:.1f} s):\n{_indent(block.code)}\n--- stdout (tail)\n{_tail(out)}"
                f"\n--- stderr (tail)\n{_tail(err)}",
                pytrace=False,
            )


DOCS_HUB_USER, DOCS_HUB_TOKEN = "your-name", "hf_docs_your_name_write_token"


@contextlib.contextmanager
def _hub_for(block: Block):
    """For a ``hub`` block, a Hub emulator serving while it runs, and the environment that
    points the snippet's commands at it; else nothing."""
    if not block.hub:
        yield {}
        return
    from hub_emulator import HubEmulator

    with HubEmulator({DOCS_HUB_TOKEN: DOCS_HUB_USER}) as emu:
        yield {"HF_ENDPOINT": emu.url, "HF_TOKEN": DOCS_HUB_TOKEN}


def snippet_env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)  # this Python's `python` and `speedtronic` first
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env.pop("PYTHONPATH", None)  # snippets see the installed package, as a user does
    # Not what the snippets say but how they run here: one thread per process on shared CI
    # cores (tiny models gain nothing from more), no network, no colour codes in the log.
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update({"HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "NO_COLOR": "1"})
    env.update(extra)
    return env


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:]) or "(nothing)"


def _indent(code: str) -> str:
    return "\n".join("    " + line for line in code.rstrip().splitlines())


_PAGES: dict[Path, Page] = {}


@pytest.fixture
def page_of(tmp_path_factory):
    def get(block: Block) -> Page:
        if block.page not in _PAGES:
            root = tmp_path_factory.mktemp(block.page.stem.replace(".", "_"))
            _PAGES[block.page] = Page(block.page, root)
        return _PAGES[block.page]

    return get


@pytest.mark.parametrize(
    "block",
    [
        pytest.param(
            b, id=b.where, marks=[pytest.mark.docs, *([pytest.mark.slow] if b.slow else [])]
        )
        for b in BLOCKS
    ],
)
def test_snippet_runs_as_written(block: Block, page_of):
    page_of(block).run_through(block)


def test_markers_are_well_formed():
    """Every marker sits on a block this test can run; re-parsing raises on the first bad one."""
    for page in PAGES:
        extract(page)


def test_the_new_user_path_is_runnable():
    """docs/getting-started.md is the new-user path: every code block on it is covered."""
    page = ROOT / "docs" / "getting-started.md"
    lines = page.read_text(encoding="utf-8").splitlines()
    covered = {b.line for b in extract(page)}
    fences = [
        n + 1
        for n, line in enumerate(lines)
        if FENCE.match(line) and FENCE.match(line).group("lang")
    ]
    uncovered = [n for n in fences if n not in covered and not _exempt(lines, n)]
    assert not uncovered, f"docs/getting-started.md: blocks not marked runnable at {uncovered}"
    titles = [line for line in lines if line.startswith("## ")]
    for topic in ("Install", "smoke", "text", "model", "Resume", "DiLoCo"):
        assert any(topic.lower() in t.lower() for t in titles), f"no section about {topic}"


def _exempt(lines: list[str], fence_line: int) -> bool:
    """A block may opt out with ``<!-- not runnable: reason -->`` right before it."""
    n = fence_line - 2
    while n >= 0 and not lines[n].strip():
        n -= 1
    return n >= 0 and lines[n].strip().startswith("<!-- not runnable:")
