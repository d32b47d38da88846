"""A folder of source files (issue 48): ``data tokenize`` and ``data tokenizer train`` refuse a
directory of no known format with the glob and the option that read it, and ``--text-suffix``
reads its files as text, giving what the glob gives."""

from __future__ import annotations

import subprocess
import sys

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


@pytest.fixture
def venv_like(src):
    """``src`` with a venv's ``lib64 -> lib`` folder link and a link back to the folder itself
    (issue 55 item 3): a glob's ``**`` follows both, reading each file twice or dozens of times."""
    (src / "lib" / "site").mkdir(parents=True)
    (src / "lib" / "site" / "c.py").write_text("x = 3\n")
    (src / "lib64").symlink_to("lib", target_is_directory=True)
    (src / "pkg" / "up").symlink_to("..", target_is_directory=True)
    return src


@pytest.mark.parametrize("how", ["option", "glob"])
def test_folder_links_are_followed_once_and_never_loop(venv_like, tmp_path, how):
    by_option = [str(venv_like), "--text-suffix", ".py"]
    sources = by_option if how == "option" else [f"{venv_like}/**/*.py"]
    result = run("tokenize", *sources, str(tmp_path / "a.bin"))
    assert result.exit_code == 0, result.output
    tokens = np.fromfile(tmp_path / "a.bin", dtype=np.uint16).tolist()
    # each file once, by its first path in sorted order (lib before lib64), a separator before each
    assert tokens == [3, *A.encode(), 3, *b"x = 3\n", 3, *B.encode()]


def test_tokenizer_train_reads_each_linked_file_once(venv_like, tmp_path):
    pytest.importorskip("tokenizers")
    args = ["--vocab-size", "270", "--held-out", "0", "--text-suffix", ".py"]
    result = run("tokenizer", "train", str(venv_like), str(tmp_path / "t.json"), *args)
    assert result.exit_code == 0, result.output
    assert " 3 documents" in result.stdout and " 3 file(s)" in result.stdout, result.stdout


def test_two_links_to_the_folder_itself_finish(src):
    """Two links to ``.`` made the glob walk 2**40 paths; the walk visits each real folder once."""
    (src / "self1").symlink_to(".", target_is_directory=True)
    (src / "self2").symlink_to(".", target_is_directory=True)
    code = (
        "import sys; from speedtronic.data.ingest.spec import local_inputs\n"
        "print(len(local_inputs(sys.argv[1])))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, f"{src}/**/*.py"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2"
