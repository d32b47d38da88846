"""The package layout stays true as the code grows: who may import what, sizes, no cycles.

Reads every module's imports with ``ast`` (all of them, also those inside functions), so it
needs no torch and runs in milliseconds. The rules are the ones in README's "Code map".
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "speedtronic"
MAX_LINES = 500
MAX_CLASS_LINES = 250  # a class a reader holds in their head; split one that grows past it
# Modules that must import neither torch nor safetensors, directly or through the package.
TORCH_FREE = (
    "speedtronic",
    "speedtronic.errors",
    "speedtronic.lazy",
    "speedtronic.observe.metrics",
    "speedtronic.registry",
    "speedtronic.config",
    "speedtronic.checkpoint.layout",
    "speedtronic.checkpoint.inspection",
    "speedtronic.checkpoint.files",
    "speedtronic.checkpoint.start",
    "speedtronic.checkpoint.changes",
    "speedtronic.data.tokenizer",
    "speedtronic.data.manifest",
    "speedtronic.data.segments",
    "speedtronic.data.ingest.spec",
    "speedtronic.data.ingest.formats",
    "speedtronic.data.describe",
    "speedtronic.data.utf8",
    "speedtronic.cli.machine_facts",
    "speedtronic.cli.app",
    "speedtronic.cli.errors",
    "speedtronic.cli.options",
    "speedtronic.cli.hub",
    "speedtronic.cli.storage",
    "speedtronic.observe.history",
    "speedtronic.results.listing",
    "speedtronic.results.compare",
    "speedtronic.cli.runs",
    "speedtronic.distributed.protocol",
    "speedtronic.distributed.transport",
    "speedtronic.distributed.repo_files",
    "speedtronic.distributed.repos",
    "speedtronic.hub.names",
    "speedtronic.hub.budget",
    "speedtronic.distributed.hub.cadence",
    "speedtronic.hub.files",
    "speedtronic.hub.errors",
    "speedtronic.distributed.hub.transport",
    "speedtronic.hub.access",
    "speedtronic.distributed.hub.admin",
    "speedtronic.config.storage",
    "speedtronic.distributed.s3.errors",
    "speedtronic.distributed.s3.counter",
    "speedtronic.distributed.s3.costs",
    "speedtronic.distributed.s3.garbage",
    "speedtronic.distributed.s3.admin",
    "speedtronic.distributed.s3.transport",
)
HEAVY = ("torch", "safetensors", "huggingface_hub", "numpy", "boto3", "botocore")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, top_level_only: bool = False) -> set[str]:
    """Absolute names imported by a module (``from a import b`` gives ``a`` and ``a.b``)."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else ast.walk(tree)
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def top(name: str) -> str:
    return name.split(".")[0]


def test_only_cli_imports_typer_and_rich():
    offenders = {
        name: sorted(i for i in imports_of(name) if top(i) in ("typer", "rich", "click"))
        for name in MODULES
        if not name.startswith("speedtronic.cli")
    }
    assert not {k: v for k, v in offenders.items() if v}


HUB_PACKAGE = "speedtronic.hub"  # the one Hub client: DiLoCo, dataset downloads, model repos
DILOCO_HUB_PACKAGE = "speedtronic.distributed.hub"  # the DumbDiLoCo transport on top of it
COMPOSITION_ROOT = "speedtronic.distributed.repos"


def in_package(package: str, name: str) -> bool:
    return name == package or name.startswith(package + ".")


def in_hub_package(name: str) -> bool:
    return in_package(HUB_PACKAGE, name)


def in_diloco_hub(name: str) -> bool:
    return in_package(DILOCO_HUB_PACKAGE, name)


def test_only_the_hub_package_imports_huggingface_hub():
    users = {n for n in MODULES if any(top(i) == "huggingface_hub" for i in imports_of(n))}
    assert users and all(in_hub_package(n) for n in users), sorted(users)


PYARROW_MODULE = "speedtronic.data.ingest.arrow"  # Parquet and zstd; the `data` extra


def test_only_one_module_imports_pyarrow():
    users = {n for n in MODULES if any(top(i) == "pyarrow" for i in imports_of(n))}
    assert users == {PYARROW_MODULE}, sorted(users)


PEFT_MODULE = "speedtronic.train.lora"  # LoRA adapters; the `lora` extra


def test_only_one_module_imports_peft():
    users = {n for n in MODULES if any(top(i) == "peft" for i in imports_of(n))}
    assert users == {PEFT_MODULE}, sorted(users)


# The tokenize pipeline's processes: spawned once per core, so they must start without torch.
INGEST_TORCH_FREE = (
    "speedtronic.data.manifest",
    "speedtronic.data.segments",
    "speedtronic.data.ingest.spec",
    "speedtronic.data.ingest.formats",
    "speedtronic.data.ingest.encode",
    "speedtronic.data.ingest.work",
    "speedtronic.data.ingest.pool",
    "speedtronic.data.ingest.pipeline",
    "speedtronic.cli.data",
)


@pytest.mark.parametrize("name", INGEST_TORCH_FREE)
def test_the_tokenize_pipeline_loads_no_torch(name):
    assert name in MODULES, f"{name} was moved: update INGEST_TORCH_FREE"
    heavy = sorted(i for i in load_closure(name) if top(i) in ("torch", "safetensors"))
    assert not heavy, f"importing {name} loads {heavy}"


S3_PACKAGE = "speedtronic.distributed.s3"
S3_CLIENTS = ("boto3", "botocore", "obstore", "s3transfer", "aiobotocore")


def in_s3_package(name: str) -> bool:
    return name == S3_PACKAGE or name.startswith(S3_PACKAGE + ".")


def test_only_the_s3_package_imports_an_s3_client():
    users = {n for n in MODULES if any(top(i) in S3_CLIENTS for i in imports_of(n))}
    assert users and all(in_s3_package(n) for n in users), sorted(users)


@pytest.mark.parametrize("package", [in_diloco_hub, in_s3_package])
def test_the_distributed_core_speaks_only_to_the_transport_interface(package):
    """Outside ``distributed/hub/`` and ``distributed/s3/``, only the composition root (and
    the CLI's commands for them) may name one of their modules."""
    offenders = {
        name: sorted(i for i in imports_of(name) if package(resolve(i)))
        for name in MODULES
        if not package(name) and name != COMPOSITION_ROOT
        if name.startswith("speedtronic.") and not name.startswith("speedtronic.cli")
    }
    assert not {k: v for k, v in offenders.items() if v}


def test_the_distributed_core_does_not_name_the_hub_client():
    """DiLoCo reaches the Hub through its transport (``distributed/hub/``) only."""
    offenders = {
        name: sorted(i for i in imports_of(name) if in_hub_package(resolve(i)))
        for name in MODULES
        if name.startswith("speedtronic.distributed.") and not in_diloco_hub(name)
        if name != COMPOSITION_ROOT
    }
    assert not {k: v for k, v in offenders.items() if v}


def resolve(imported: str) -> str:
    """The module an imported name lives in (``speedtronic.x.name`` -> ``speedtronic.x``)."""
    if imported in MODULES or top(imported) != "speedtronic":
        return imported
    return imported.rsplit(".", 1)[0]


def load_closure(name: str) -> set[str]:
    """Every module that importing ``name`` loads, following module-level imports.

    Importing ``a.b.c`` also runs ``a/__init__`` and ``a/b/__init__``, so those count too.
    """
    seen: set[str] = set()
    todo = [name]
    while todo:
        current = todo.pop()
        if current in seen or current not in MODULES:
            seen.add(current)
            continue
        seen.add(current)
        parents = {".".join(current.split(".")[:i]) for i in range(1, current.count(".") + 1)}
        todo.extend(parents | {resolve(i) for i in imports_of(current, top_level_only=True)})
    return seen


@pytest.mark.parametrize("name", TORCH_FREE)
def test_torch_free_modules_stay_torch_free(name):
    assert name in MODULES, f"{name} was moved: update TORCH_FREE and the README code map"
    heavy = sorted(i for i in load_closure(name) if top(i) in HEAVY)
    assert not heavy, f"importing {name} loads {heavy}"


# What ``speedtronic --help`` and shell completion load: the app and every command module's
# option declarations. The config loader (YAML), Rich and the engine load in command bodies.
HELP_PATH_FORBIDDEN = ("rich", "yaml", "speedtronic.config", "speedtronic.runtime")


def test_the_help_path_loads_no_command_bodies():
    loaded = load_closure("speedtronic.cli.app")
    heavy = sorted(
        m for m in loaded if any(m == f or m.startswith(f + ".") for f in HELP_PATH_FORBIDDEN)
    )
    assert not heavy, f"importing speedtronic.cli.app loads {heavy}: import them where used"


def package_of(name: str) -> str:
    """The concern a module belongs to: ``speedtronic.cli.train`` -> ``speedtronic.cli``."""
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or name in _PACKAGES else name


_PACKAGES = {module_name(p) for p in PACKAGE.rglob("__init__.py")}


def test_no_import_cycles_between_concerns():
    graph: dict[str, set[str]] = {}
    for name in MODULES:
        for imported in imports_of(name, top_level_only=True):
            target = resolve(imported)
            if target in MODULES and package_of(target) != package_of(name):
                graph.setdefault(package_of(name), set()).add(package_of(target))
    assert not find_cycle(graph), f"import cycle: {' -> '.join(find_cycle(graph))}"


def module_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports, function-level imports included."""
    graph: dict[str, set[str]] = {}
    for name in MODULES:
        targets = {resolve(i) for i in imports_of(name)} - {name}
        graph[name] = {t for t in targets if t in MODULES and not is_ancestor(t, name)}
    return graph


def is_ancestor(package: str, name: str) -> bool:
    """``from speedtronic import errors`` in a submodule names the package, not a cycle."""
    return name.startswith(package + ".")


def test_no_import_cycles_between_modules_even_inside_functions():
    cycle = find_cycle(module_graph())
    assert not cycle, f"import cycle: {' -> '.join(cycle)}"


def test_the_module_cycle_check_sees_function_level_imports(tmp_path):
    source = "def f():\n    from speedtronic.b import x\n"
    tree = ast.parse(source)
    found = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert found == {"speedtronic.b"}  # ast.walk, as imports_of uses, reaches function bodies


def test_cli_command_modules_do_not_import_the_root_app():
    for name in MODULES:
        if name.startswith("speedtronic.cli.") and name != "speedtronic.cli.app":
            assert "speedtronic.cli.app" not in imports_of(name), name


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle in a directed graph as a node list, or [] (iterative DFS with colours)."""
    state: dict[str, int] = {}
    for start in graph:
        stack = [(start, iter(sorted(graph.get(start, ()))))]
        path = [start]
        state[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(child) == 1:
                return path[path.index(child) :] + [child]
            elif child not in state:
                state[child] = 1
                stack.append((child, iter(sorted(graph.get(child, ())))))
                path.append(child)
    return []


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}}) == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_stay_small_and_say_what_they_own(name):
    text = MODULES[name].read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_LINES, f"{name}: split it by concern"
    if text.strip():
        assert ast.get_docstring(ast.parse(text)), f"{name}: open with a docstring"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_classes_fit_in_a_head(name):
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            lines = node.end_lineno - node.lineno + 1
            assert lines <= MAX_CLASS_LINES, f"{name}.{node.name} is {lines} lines: split it"
