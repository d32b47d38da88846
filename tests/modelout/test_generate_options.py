"""``generate``'s option values are range-checked at the command line (issue 35): each value it
used to crash on later (a segfault at ``--threads 100000``, torch's RuntimeError at
``--top-p 1e-300`` and ``--device tpu:3``, an overflow at ``--seed 2**64``) is one line naming the
option, the value and the rule, exit 2, before a model is loaded.
"""

from __future__ import annotations

import os

import pytest
import torch
from modelout_support import assert_one_line_error, invoke, train_text

from speedtronic.modelout.generate import Sampling, pick


@pytest.fixture(scope="module")
def byte_run(tmp_path_factory):
    return train_text(tmp_path_factory.mktemp("options"))


@pytest.mark.parametrize(
    ("option", "value", "rule"),
    [
        ("--threads", 100_000, f"must be in 1..{os.cpu_count()}"),
        ("--threads", (os.cpu_count() or 1) + 1, "this machine's cores"),
        ("--top-p", 0, "must be in (0, 1]"),
        ("--seed", 2**64, "must be in 0..9223372036854775807"),
        ("--seed", 2**63, "(2**63-1)"),
        ("--device", "tpu:3", "must be auto, cpu, cuda, cuda:N or mps"),
    ],
)
def test_an_option_out_of_range_is_one_line_naming_it(byte_run, option, value, rule):
    threads = torch.get_num_threads()
    result = invoke("generate", byte_run, "--max-new-tokens", 2, option, value)
    line = assert_one_line_error(result, f"{option}: ", rule, str(value))
    assert "RuntimeError" not in line and torch.get_num_threads() == threads


def test_the_edges_of_the_ranges_generate(byte_run):
    result = invoke(
        "generate", byte_run, "--max-new-tokens", 2, "--seed", 2**63 - 1, "--top-p", 1e-300,
        "--threads", 1, "--format", "json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr


def test_a_top_p_below_float32s_smallest_keeps_the_likeliest_token():
    """1e-300 is 0 in float32: every token was dropped and torch.multinomial raised."""
    logits = torch.tensor([1.0, 3.0, 2.0, 0.5])
    seeded = torch.Generator().manual_seed(0)
    assert {pick(logits, Sampling(top_p=1e-300, temperature=1), seeded) for _ in range(20)} == {1}
