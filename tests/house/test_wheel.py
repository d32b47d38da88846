"""The built distribution works outside the repository: build, install, run.

``python -m build`` makes an sdist and a wheel from a copy of the sources (so the checkout is
left untouched); both must carry the embedded default config and ``py.typed``. The wheel is
installed with ``--no-deps`` into a fresh virtual environment made with
``--system-site-packages``, which reuses the torch (and every other dependency) already
installed, and ``speedtronic --version``, ``train --max-steps 5`` and ``validate`` then run from
a directory outside the repository, with the venv's own copy of the package.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import site
import sys
import tarfile
import zipfile
from pathlib import Path

import proc_support
import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "speedtronic")
MUST_SHIP = ("speedtronic/defaults/smoke.yaml", "speedtronic/py.typed")

pytestmark = [pytest.mark.slow, pytest.mark.docs]


def run(command: list[str], cwd: Path, env: dict[str, str]) -> str:
    proc = proc_support.run(command, cwd=cwd, env=env)  # by progress: a loaded CI is slow
    assert proc.returncode == 0, (
        f"{' '.join(map(str, command))} exited {proc.returncode} in {cwd}\n"
        f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    )
    return proc.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """sdist and wheel built from a copy of the sources (no build isolation: offline, fast)."""
    if importlib.util.find_spec("build") is None:
        pytest.skip("the 'build' package is not installed (pip install -e '.[dev]')")
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools is not installed, so the wheel cannot be built offline")
    source = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(
                path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
            )
        else:
            shutil.copy2(path, source / name)
    out = tmp_path_factory.mktemp("dist")
    command = [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), "."]
    run(command, source, clean_env())
    return out


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update({"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"})
    return env


def test_the_sdist_and_the_wheel_ship_the_defaults_and_py_typed(dist: Path):
    (wheel,) = dist.glob("speedtronic-*.whl")
    (sdist,) = dist.glob("speedtronic-*.tar.gz")
    wheel_names = set(zipfile.ZipFile(wheel).namelist())
    with tarfile.open(sdist) as archive:
        sdist_names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    for name in MUST_SHIP:
        assert name in wheel_names, f"{wheel.name} lacks {name}"
        assert name in sdist_names, f"{sdist.name} lacks {name}"
    entry_points = next(n for n in wheel_names if n.endswith(".dist-info/entry_points.txt"))
    assert (
        "speedtronic = speedtronic.cli.app:main"
        in zipfile.ZipFile(wheel).read(entry_points).decode()
    )
    assert not any(name.startswith("tests/") for name in wheel_names)


def see_our_packages(python: Path, cwd: Path, env: dict[str, str]) -> None:
    """Let the new venv import this interpreter's packages (torch, typer, ...).

    ``--system-site-packages`` gives a venv its *base* interpreter's packages: made from inside
    a venv, the outer venv's own site-packages (where the deps are) stay out of sight. A path
    file adds them after the new venv's own, so the wheel's copy of speedtronic still wins and
    the outer editable install's import hook (a .pth there) is not run.
    """
    purelib = run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd, env
    ).strip()
    ours = [p for p in site.getsitepackages() + [site.getusersitepackages()] if Path(p).is_dir()]
    Path(purelib, "_outer_site_packages.pth").write_text("\n".join(ours) + "\n")


def test_the_installed_wheel_runs_outside_the_repo(dist: Path, tmp_path: Path):
    (wheel,) = dist.glob("speedtronic-*.whl")
    venv = tmp_path / "venv"
    env = clean_env()
    run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        tmp_path,
        env,
    )
    bindir = venv / ("Scripts" if os.name == "nt" else "bin")
    python = bindir / "python"
    see_our_packages(python, tmp_path, env)
    # The outer pip installs into the venv: no ensurepip, no index, the deps are already there.
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--force-reinstall",
            str(wheel),
        ],
        tmp_path,
        env,
    )
    env["PATH"] = str(bindir) + os.pathsep + env.get("PATH", "")
    outside = tmp_path / "elsewhere"
    outside.mkdir()

    where = run(
        [str(python), "-c", "import speedtronic; print(speedtronic.__file__)"], outside, env
    )
    assert Path(where.strip()).is_relative_to(venv), f"imported from {where.strip()}, not the venv"
    assert ROOT not in Path(where.strip()).parents

    speedtronic = str(bindir / "speedtronic")
    assert run([speedtronic, "--version"], outside, env).strip().startswith("speedtronic ")
    run(
        [speedtronic, "train", "--max-steps", "5", "--output-dir", str(tmp_path / "run")],
        outside,
        env,
    )
    assert (tmp_path / "run" / "checkpoints" / "latest.json").is_file()
    assert "max_steps: 150" in run([speedtronic, "validate"], outside, env)
