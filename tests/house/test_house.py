"""The house stays findable (issue 41): each concern in a room of its own, nothing by prefix.

A newcomer looks for "the training loop" or "the master" and finds one folder: the package's
top floor keeps at most 10 loose modules, no folder holds a family of three or more modules
named by a shared prefix (``master_*.py`` is a room waiting to be made), ``benchmarks/`` keeps
at most 8 loose files, and functions stay short (median at most 8 lines). The old module paths
users may hold keep working for one release, with a warning, as the very same module.
"""

from __future__ import annotations

import ast
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "speedtronic"
DIST = "speedtronic.distributed"


def prefix_families(folder: Path) -> dict[str, int]:
    """Prefixes (the part before the first '_') shared by 3+ modules of one folder."""
    stems = [p.stem for p in folder.glob("*.py") if "_" in p.stem.strip("_")]
    counts = Counter(stem.strip("_").split("_")[0] for stem in stems)
    return {prefix: n for prefix, n in counts.items() if n >= 3}


def test_the_top_floor_holds_at_most_ten_loose_modules():
    loose = sorted(
        p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")
    )
    assert len(loose) <= 10, loose


@pytest.mark.parametrize("folder", ["speedtronic", "benchmarks"])
def test_no_folder_names_a_family_by_prefix(folder):
    folders = [ROOT / folder, *(p for p in (ROOT / folder).rglob("*") if p.is_dir())]
    found = {str(f.relative_to(ROOT)): fam for f in folders if (fam := prefix_families(f))}
    assert not found, found


def test_benchmarks_keep_at_most_eight_loose_files():
    loose = sorted(p.name for p in (ROOT / "benchmarks").iterdir() if p.is_file())
    assert len(loose) <= 8, loose


def test_the_median_function_fits_in_eight_lines():
    lengths = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lengths.append(node.end_lineno - node.lineno + 1)
    assert statistics.median(lengths) <= 8


@pytest.mark.parametrize(
    ("old", "new", "name"),
    [
        ("speedtronic.trainer", "speedtronic.train.trainer", "Trainer"),
        ("speedtronic.metrics", "speedtronic.observe.metrics", "MetricLogger"),
        ("speedtronic.muon", "speedtronic.optim.muon", "Muon"),
        ("speedtronic.evaluation", "speedtronic.evaluate.loss_plugin", "EvalPlugin"),
        (
            "speedtronic.distributed.master_state",
            "speedtronic.distributed.master.state",
            "MasterState",
        ),
        (
            "speedtronic.distributed.worker_upload",
            "speedtronic.distributed.worker.upload",
            "Uploader",
        ),
    ],
)
def test_an_old_module_path_still_imports_with_a_warning(old, new, name):
    code = (
        "import importlib, warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        f"    old = importlib.import_module({old!r})\n"
        f"new = importlib.import_module({new!r})\n"
        "assert old is new, (old, new)\n"
        f"assert any({new!r} in str(w.message) and w.category is DeprecationWarning "
        "for w in caught), [str(w.message) for w in caught]\n"
        f"assert getattr(old, {name!r}, None) is not None\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def imported_names(path: Path) -> set[str]:
    """Every module an import statement in ``path`` names (``from a import b``: a and a.b)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_our_own_code_imports_no_old_module_path():
    """The old paths are for users' code; ours uses the new ones, so removing them breaks
    nothing here (the old-path tests above import them by string, on purpose)."""
    from speedtronic.moved import MOVED

    files = [p for d in ("speedtronic", "tests", "benchmarks", "examples") for p in
             (ROOT / d).rglob("*.py")]  # fmt: skip
    found = {str(p.relative_to(ROOT)): sorted(imported_names(p) & set(MOVED)) for p in files}
    assert not {path: names for path, names in found.items() if names}


def test_names_of_modules_that_became_packages_still_resolve():
    code = (
        "from speedtronic.optim import build_optimizer, MuonAdamW, Muon\n"
        "from speedtronic.distributed.master import MasterLoop, MasterPlugin\n"
        "from speedtronic.distributed.worker import WorkerPlugin\n"
        "from speedtronic.runtime import train_from_config\n"
        "from speedtronic import SpeedtronicConfig, register_model, MetricLogger\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
