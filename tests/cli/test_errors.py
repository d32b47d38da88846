"""Every bad input to the CLI ends the same way: exit 2, one error line, no traceback.

Runs the real entry point (``speedtronic.cli.app.main``, as the console script does) in
process, so Typer's own usage errors are covered as users see them, and a seeded fuzz test
throws a few hundred single-fault command lines at it.
"""

from __future__ import annotations

import random
import sys

import pytest

from speedtronic.cli.app import main


def run_main(args: list[str], capsys, monkeypatch) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["speedtronic", *args])
    monkeypatch.setenv("SPEEDTRONIC_DEBUG", "0")
    with pytest.raises(SystemExit) as exit_info:
        main()
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def assert_one_line_usage_error(code: int, err: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    errors = [line for line in lines if line.startswith("speedtronic: error: ")]
    assert code == 2, err
    assert len(errors) == 1 and "Traceback" not in err, err
    assert all(line.startswith(("speedtronic: error: ", "hint: ")) for line in lines), err
    for needle in needles:
        assert needle in errors[0], err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["train", "--bogus"], "--bogus"),
        (["train", "--max-steps", "many"], "--max-steps"),
        (["validate", "--format", "xml"], "--format"),
        (["bench", "--format", "xml"], "--format"),
        (["bench", "--set", "model.nope=1"], "model.nope"),
        (["ckpt", "inspect"], "ckpt inspect: Missing argument"),
        (["ckpt", "prune", "."], "--keep"),
        (["no-such-command"], "no-such-command"),
        (["train", "--set", "optimizer.lr=["], "optimizer.lr"),
        (["train", "--set", "optimizer"], "--set"),
        (["train", "-c", "/nonexistent/config.yaml"], "/nonexistent/config.yaml"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(args, needle, capsys, monkeypatch):
    code, _, err = run_main(args, capsys, monkeypatch)
    assert_one_line_usage_error(code, err, needle)


def test_help_and_version_exit_0(capsys, monkeypatch):
    code, out, _ = run_main(["--help"], capsys, monkeypatch)
    assert code == 0 and "train" in out
    code, out, _ = run_main(["--version"], capsys, monkeypatch)
    assert code == 0 and out.startswith("speedtronic ")


# A single fault each: a command line that is right except for one thing.
COMMANDS = [["train"], ["validate"], ["bench", "--quick"], ["ckpt", "inspect", "."]]
BAD_SETS = [
    "optimizer.lr=.nan",
    "optimizer.lr=1e999",
    "optimizer.weight_decay=-.inf",
    "optimizer.grad_clip=.nan",
    "optimizer.lr=abc",
    "run.max_steps=1.5",
    "run.max_steps=0",
    "run.seed=" + "9" * 400,
    "run.device=tpu",
    "run.device='cpu\n'",
    "run.name=''",
    "data.seq_len=1e11",
    "data.micro_batch_size=-1",
    "model.nope=1",
    "optimizerr.lr=1",
    "scheduler.warmup_steps=[1",
    "precision.mode=fp8",
    "checkpoint.keep_last=true",
    "logging.every_steps={",
    "compile=maybe",
    "distributed.node_id='abc\n'",
    "=1",
]
BAD_OPTIONS = [
    ["--bogus"],
    ["--format", "yaml"],
    ["--config"],
    ["--max-steps", "x"],
    ["-c", "/nonexistent.yaml"],
    ["-c", "/dev/null/child.yaml"],
]


def fuzz_cases(seed: int, count: int) -> list[list[str]]:
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        command = list(rng.choice(COMMANDS[:3]))  # these take --set
        if rng.random() < 0.6:
            cases.append([*command, "--set", rng.choice(BAD_SETS)])
        else:
            cases.append([*rng.choice(COMMANDS), *rng.choice(BAD_OPTIONS)])
    return cases


@pytest.mark.parametrize("args", fuzz_cases(seed=10, count=200), ids=lambda a: " ".join(a)[:60])
def test_fuzzed_bad_command_lines_exit_2_with_one_line(args, capsys, monkeypatch):
    code, _, err = run_main(args, capsys, monkeypatch)
    assert_one_line_usage_error(code, err)
