"""House rules from DESIGN.md that keep the layers honest."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "speedtronic"


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_cli_import_pulls_in_no_heavy_modules():
    code = (
        "import sys, speedtronic, speedtronic.cli.app; "
        "print([m for m in ('torch', 'safetensors', 'huggingface_hub') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_only_the_cli_imports_typer_or_rich():
    for path in modules():
        if "cli" not in path.relative_to(PACKAGE).parts:
            assert not {"typer", "rich"} & imported_modules(path), path


def test_only_the_hub_package_imports_huggingface_hub():
    for path in modules():
        if path.relative_to(PACKAGE).parts[:1] != ("hub",):  # speedtronic/hub/
            assert "huggingface_hub" not in imported_modules(path), path


def test_every_module_opens_with_a_docstring():
    for path in modules():
        if path.name == "__init__.py" and not path.read_text().strip():
            continue
        assert ast.get_docstring(ast.parse(path.read_text())), path
