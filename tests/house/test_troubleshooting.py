"""docs/troubleshooting.md quotes only messages the code really prints, and still prints.

A quoted message is a line in a code block that starts with ``speedtronic: error:``,
``hint:``, ``warning:`` or ``notice:``. Two checks:

- every quoted line matches a string of the code: each string literal and f-string in
  ``speedtronic/`` becomes a regex (a field matches any text), and the message must match one
  of them in full. Pure ``ast``, no torch: milliseconds.
- every ``console`` block is re-run in a fresh directory, each ``$`` command in turn through
  bash with ``speedtronic`` meaning this checkout, and every quoted line must be a line of the
  output of the command above it. The HTML comments before a block say how: ``fast`` or
  ``slow`` (it trains: the slow tier); ``setup: ...`` (run once per distinct command, its
  folder copied for each block that names it) and ``then: ...`` (the block's own set-up);
  ``hub`` (the local Hub emulator); ``env: NAME=value``; ``requires: module``. The page's
  last section says the same for its writers.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import proc_support
import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "troubleshooting.md"
PREFIXES = ("speedtronic: error: ", "hint: ", "warning: ", "notice: ")
MIN_LITERAL = 12  # a template must pin down at least this many characters of a message
# Files the examples name; each reproduces the message quoted next to it
FILES = {
    "my.yaml": b'optimizer:\n  lr: -0.1\ndata:\n  micro_batch_size: "8"\n',
    "broken.yaml": b"optimizer:\n  lr: [0.1\n",
    "tiny.txt": b"hello\n",
    "short.txt": (b"a short text file\n" * 30)[:500],
    "notes.txt": b"caf" * 2000 + b"\xe9\n" + b"z" * 3000,
    "corpus.bin": bytes(1001),
    "ids.bin": b"".join(i.to_bytes(2, "little") for i in range(1000)),
}
WRITER, READER = "hf_writer_token", "hf_read_only_token"  # hf_revoked_token: unknown -> 401


@dataclass
class Block:
    lang: str
    line: int  # 1-based line of the opening fence
    lines: list[str]
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def quoted(self) -> list[str]:
        return [text for text in self.lines if text.startswith(PREFIXES)]

    def steps(self) -> list[tuple[str, list[str]]]:
        """Each ``$`` command with the quoted lines that follow it."""
        steps: list[tuple[str, list[str]]] = []
        for text in self.lines:
            if text.startswith("$ "):
                steps.append((text[2:], []))
            elif text.startswith(PREFIXES):
                assert steps, f"line {self.line}: a quoted message before any command"
                steps[-1][1].append(text)
        return steps


def blocks(text: str) -> list[Block]:
    """The fenced code blocks of a Markdown page, with the ``<!-- ... -->`` notes above each."""
    found: list[Block] = []
    notes: dict[str, str] = {}
    current: Block | None = None
    for number, text_line in enumerate(text.splitlines(), start=1):
        if current is not None:
            if text_line.startswith("```"):
                found.append(current)
                current = None
            else:
                current.lines.append(text_line.rstrip())
        elif text_line.startswith("```"):
            current, notes = Block(text_line[3:].strip(), number, [], notes), {}
        elif match := re.fullmatch(r"<!-- ([a-z]+)(?:: (.*))? -->", text_line.strip()):
            notes[match[1]] = match[2] or ""
        elif text_line.strip():
            notes = {}  # notes belong to the block right below them
    return found


BLOCKS = blocks(PAGE.read_text(encoding="utf-8"))
CONSOLE = [b for b in BLOCKS if b.lang == "console"]


# ---- every quoted line is a message of the code --------------------------------------------


@functools.cache
def templates() -> list[tuple[re.Pattern[str], int]]:
    """(regex, literal characters) for every string literal and f-string in the package."""
    found = []
    for path in sorted((ROOT / "speedtronic").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.JoinedStr):
                parts = [
                    re.escape(v.value) if isinstance(v, ast.Constant) else "(.*?)"
                    for v in node.values
                ]
                literal = sum(len(v.value) for v in node.values if isinstance(v, ast.Constant))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                parts, literal = [re.escape(node.value)], len(node.value)
            else:
                continue
            if literal >= MIN_LITERAL:
                found.append((re.compile("".join(parts), re.S), literal))
    return found


def quoted_lines() -> list[tuple[int, str]]:
    return [(b.line, text) for b in BLOCKS for text in b.quoted]


def test_the_page_quotes_messages_and_runs_examples():
    assert len(quoted_lines()) >= 30 and len(CONSOLE) >= 15
    for block in CONSOLE:
        assert block.steps() and all(expected for _, expected in block.steps()), block.line
        assert ("fast" in block.notes) != ("slow" in block.notes), (
            f"troubleshooting.md line {block.line}: mark the block <!-- fast --> or <!-- slow -->"
        )


@pytest.mark.parametrize(("line", "message"), quoted_lines(), ids=lambda v: str(v)[:60])
def test_every_quoted_message_is_a_message_of_the_code(line, message):
    prefix = next(p for p in PREFIXES if message.startswith(p))
    body = message[len(prefix) :]
    candidates = {body, body.strip()}  # indented lines: one problem of several
    matched = any(t.fullmatch(text) for t, _ in templates() for text in candidates)
    assert matched, (
        f"docs/troubleshooting.md line {line} quotes a message no string in speedtronic/ "
        f"produces any more: {message!r}. Re-run its command and paste what it prints now."
    )


# ---- the console examples still print them -------------------------------------------------


@pytest.fixture(scope="module")
def hub_url():
    """The local Hub emulator: my-org (alice admin, rita read), my-run private, public-run."""
    sys.path.insert(0, str(ROOT / "tests"))
    from hub_emulator import HubEmulator, json_response

    with HubEmulator(tokens={WRITER: "alice", READER: "rita"}) as emu:
        answer = {"errors": [], "warnings": []}  # huggingface_hub validates README.md first
        route = ("POST", re.compile("/api/validate-yaml$"), lambda req: json_response(answer))
        emu.state.routes.append(route)
        emu.readonly(READER)
        emu.add_org("my-org", {"alice": "admin", "rita": "read"})
        emu.create_repo("my-org/my-run", private=True)
        emu.create_repo("my-org/public-run", private=False)
        yield emu.url


@pytest.fixture(scope="module")
def setups(tmp_path_factory) -> dict[str, Path]:
    """Folders left by each ``setup`` command, made once and copied for every block using it."""
    return {"": tmp_path_factory.mktemp("setups")}


def prepare(block: Block, folder: Path, run: dict, setups: dict[str, Path]) -> None:
    """The block's folder: its ``setup`` (shared, cached) and ``then`` (its own) commands run."""
    setup = block.notes.get("setup")
    if setup and setup not in setups:
        made = setups[""] / f"setup{len(setups)}"
        made.mkdir()
        done = proc_support.run(["bash", "-c", setup], **{**run, "cwd": made})
        assert done.returncode == 0, f"setup of line {block.line} failed:\n{done.stderr[-2000:]}"
        setups[setup] = made
    if setup:
        shutil.copytree(setups[setup], folder, symlinks=True)
    else:
        folder.mkdir()
    for name, data in FILES.items():
        (folder / name).write_bytes(data)
    if "then" in block.notes:
        done = proc_support.run(["bash", "-c", block.notes["then"]], **{**run, "cwd": folder})
        assert done.returncode == 0, f"'then' of line {block.line} failed:\n{done.stderr}"


def run_block(block: Block, folder: Path, env: dict[str, str], setups: dict[str, Path]) -> None:
    run = {"env": env}  # output captured; waited for by progress, not a clock
    prepare(block, folder, run, setups)
    run["cwd"] = folder
    for command, expected in block.steps():
        done = proc_support.run(["bash", "-c", command], **run)
        printed = [line.rstrip() for line in (done.stdout + done.stderr).splitlines()]
        missing = [line for line in expected if line not in printed]
        assert not missing, (
            f"docs/troubleshooting.md line {block.line}: `{command}` no longer prints\n"
            + "\n".join(missing)
            + "\nit printed:\n"
            + "\n".join(line for line in printed if line.startswith(PREFIXES))
        )


def console_cases() -> list:
    cases = []
    for block in CONSOLE:
        marks = [pytest.mark.docs, *([pytest.mark.slow] if "slow" in block.notes else [])]
        cases.append(pytest.param(block, marks=marks, id=f"line{block.line}"))
    return cases


@pytest.mark.parametrize("block", console_cases())
def test_console_examples_print_what_the_page_says(block, shim, setups, tmp_path, request):
    needed = block.notes.get("requires")
    if needed and importlib.util.find_spec(needed) is None:
        pytest.skip(f"needs the {needed} package")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPEEDTRONIC_", "HF_"))}
    env.update(
        PATH=f"{shim}{os.pathsep}{env.get('PATH', '')}",
        HF_HOME=str(tmp_path / "hf_home"),
        HF_HUB_DISABLE_TELEMETRY="1",
        XDG_CACHE_HOME=str(tmp_path / "cache"),
        NO_COLOR="1",
    )
    if "hub" in block.notes:
        env.update(HF_ENDPOINT=request.getfixturevalue("hub_url"), HF_TOKEN=WRITER)
    else:
        env.update(HF_HUB_OFFLINE="1")
    if "env" in block.notes:
        name, _, value = block.notes["env"].partition("=")
        env[name] = value
    run_block(block, tmp_path / "work", env, setups)
