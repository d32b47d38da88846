"""A folder of source files (issue 48): ``data tokenize`` and ``data tokenizer train`` refuse a
directory of no known format with the glob and the option that read it, and ``--text-suffix``
reads its files as text, giving what the glob gives."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from speedtronic.cli.app import app

runner = CliRunner()
A, B = "def f(x):\n    return x + 1\n" * 5, "import os\nprint(os.getcwd())\n" * 5


@pytest.fixture
def src(tmp_path):
    folder = tmp_path / "src"
    (folder / "pkg").mkdir(parents=True)
    (folder / "a.py").write_text(A)
    (folder / "pkg" / "b.py").write_text(B)
    (folder / "notes.md").write_text("# not read\n")
    return folder


def run(*args: str):
    return runner.invoke(app, ["data", *args])


@pytest.mark.parametrize("command", [["tokenize"], ["tokenizer", "train"]])
def test_a_folder_of_py_files_is_refused_naming_the_glob_and_the_option(src, tmp_path, command):
    extra = ["--vocab-size", "300"] if command[0] == "tokenizer" else []
    result = run(*command, str(src), str(tmp_path / "out.json"), *extra)
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert f"'{src}/**/*.py'" in line and "--text-suffix .py" in line, line


def test_text_suffix_reads_the_folder_as_the_glob_does(src, tmp_path):
    by_option = run("tokenize", str(src), str(tmp_path / "a.bin"), "--text-suffix", ".py")
    assert by_option.exit_code == 0, by_option.output
    by_glob = run("tokenize", f"{src}/**/*.py", str(tmp_path / "b.bin"))
    assert by_glob.exit_code == 0, by_glob.output
    tokens = np.fromfile(tmp_path / "a.bin", dtype=np.uint16)
    assert tokens.tolist() == [3, *A.encode(), 3, *B.encode()]  # a separator before each file
    assert (tmp_path / "a.bin").read_bytes() == (tmp_path / "b.bin").read_bytes()


def test_tokenizer_train_reads_the_folder_with_text_suffix(src, tmp_path):
    pytest.importorskip("tokenizers")
    out = tmp_path / "mine.json"
    args = ["--vocab-size", "270", "--held-out", "0", "--text-suffix", ".py"]
    result = run("tokenizer", "train", str(src), str(out), *args)
    assert result.exit_code == 0, result.output
    assert "2 documents" in result.stdout and "2 file(s)" in result.stdout, result.stdout


def test_a_known_format_suffix_is_refused():
    result = run("tokenize", ".", "o.bin", "--text-suffix", ".jsonl")
    assert result.exit_code == 2 and "--text-suffix '.jsonl'" in result.stderr, result.output
