"""Config text to plain data, safely: files, YAML/JSON, ``--set`` overrides, the default.

A config is as trusted as a script, but a malformed or hostile file must still fail fast
with a ConfigError that names the key path, never hang, exhaust memory or escape as another
exception. So files are checked before they are read (regular, at most 4 MiB), and YAML
(JSON is read as YAML, through the same loader) goes through ``PlainLoader``: only plain
types (strings, numbers, booleans, null, lists, mappings), no duplicate keys, bounded nesting
and a bounded number of values once aliases are expanded (no "billion laughs"). Python
dicts get the same bounds from ``plain_copy``. Typing and ranges come later, in ``build``.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from speedtronic.config.messages import brief, describe, key_text
from speedtronic.config.sections import RUN_ALIASES
from speedtronic.errors import ConfigError

MAX_FILE_BYTES = 4 * 1024 * 1024  # a config is a page of text; this is generous
MAX_DEPTH = 32  # levels of nesting; configs use three or four
MAX_VALUES = 100_000  # values once aliases are expanded
MAX_INT_DIGITS = 1000  # Python refuses int() of longer strings (> 4300 digits) with ValueError

_T = "tag:yaml.org,2002:"
PLAIN_TAGS = {_T + t for t in ("str", "int", "float", "bool", "null", "seq", "map", "merge")}
# Explicit tags (``!!int abc``) skip the resolver; their values must still look the part
_TAG_ACCEPTS = {
    _T + "int": {_T + "int"},
    _T + "float": {_T + "int", _T + "float"},
    _T + "bool": {_T + "bool"},
}


class PlainLoader(yaml.SafeLoader):
    """A SafeLoader for plain data only: it refuses, with the key path, anything else."""

    def __init__(self, stream: str, where: str = "config", root: str = ""):
        super().__init__(stream)
        self._where = where
        self._path: list[str] = [root] if root else []
        self._depth = 0
        self._sizes: dict[int, int] = {}  # id(node) -> values once aliases are expanded
        self._keys: dict[int, dict[tuple[str, str], Any]] = {}  # id(mapping) -> key -> mark

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        mark = self.peek_event().start_mark
        alias = self.check_event(AliasEvent)
        segment = _segment(parent, index)
        if segment is not None:
            self._path.append(segment)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise self._refuse(
                    f"must be nested at most {MAX_DEPTH} levels deep", "deeper", mark
                )
            if isinstance(parent, MappingNode) and isinstance(index, Node):
                self._check_duplicate(parent, index)
            node = super().compose_node(parent, index)
            self._measure(node, alias, mark)
            return node
        finally:
            self._depth -= 1
            if segment is not None:
                self._path.pop()

    def _measure(self, node: Node, alias: bool, mark: Any) -> None:
        if alias:
            if id(node) not in self._sizes:  # the anchor is still being read: it contains itself
                raise self._refuse("must not contain itself", "a recursive alias", mark)
            return
        self._admit(node, mark)
        children = node.value if isinstance(node, SequenceNode) else []
        if isinstance(node, MappingNode):
            children = [n for pair in node.value for n in pair]
        size = 1 + sum(self._sizes[id(child)] for child in children)
        if size > MAX_VALUES:
            rule = f"must hold at most {MAX_VALUES} values once aliases are expanded"
            raise self._refuse(rule, "more", mark, "; an alias bomb?")
        self._sizes[id(node)] = size

    def _admit(self, node: Node, mark: Any) -> None:
        if node.tag not in PLAIN_TAGS:
            kind = node.tag.replace(_T, "!!")
            scalar = isinstance(node, ScalarNode)
            shown = f" {brief(node.value)}" if scalar else ""
            hint = "; quote it if you meant a string" if scalar else ""
            rule = "must be plain data: a string, number, boolean, null, list or mapping"
            raise self._refuse(rule, f"a YAML {kind}{shown}", mark, hint)
        if not isinstance(node, ScalarNode):
            return
        if node.tag == _T + "int" and len(node.value) > MAX_INT_DIGITS:
            rule = f"must be an integer of at most {MAX_INT_DIGITS} digits"
            raise self._refuse(rule, f"{len(node.value)} characters", mark)
        accepts = _TAG_ACCEPTS.get(node.tag)
        if accepts and self.resolve(ScalarNode, node.value, (True, False)) not in accepts:
            kind = node.tag.replace(_T, "!!")
            raise self._refuse(f"must be a valid {kind} value", brief(node.value), mark)

    def _check_duplicate(self, mapping: MappingNode, key: Node) -> None:
        if not isinstance(key, ScalarNode) or key.tag == _T + "merge":
            return
        seen = self._keys.setdefault(id(mapping), {})
        first = seen.get((key.tag, key.value))
        if first is not None:
            got = f"a second {brief(key.value)}"
            hint = f", which would silently replace the one at {_line(first)}"
            raise self._refuse("must appear once in its mapping", got, key.start_mark, hint)
        seen[key.tag, key.value] = key.start_mark

    def _refuse(self, rule: str, got: str, mark: Any, hint: str = "") -> ConfigError:
        path = _join_path(self._path) or "config"
        at = f"{self._where} {_line(mark)}"
        return ConfigError(f"{path}: {rule} (got {got} at {at}{hint})")


def _line(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"


def _segment(parent: Node | None, index: Any) -> str | None:
    if parent is None:
        return None
    if isinstance(parent, SequenceNode):
        return f"[{index}]"
    if isinstance(index, ScalarNode):
        return key_text(index.value)
    return "<key>" if index is None else "<complex key>"


def _join_path(parts: list[str]) -> str:
    return "".join(p if p.startswith("[") or i == 0 else f".{p}" for i, p in enumerate(parts))


# YAML 1.1 reads ``1e-3`` as a string; YAML 1.2 and users read it as a float
PlainLoader.add_implicit_resolver(
    _T + "float",
    re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
    list("-+0123456789."),
)


def load_yaml(text: str, where: str = "config", root: str = "") -> Any:
    """Parse one YAML (or JSON) document of plain data; ``root`` prefixes key paths."""
    if not isinstance(text, str):
        raise ConfigError(f"{where}: must be YAML or JSON text (got {type(text).__name__})")
    if len(text) > MAX_FILE_BYTES:
        rule = f"must be at most {MAX_FILE_BYTES} characters (4 MiB)"
        raise ConfigError(f"{where}: {rule} (got {len(text)})")
    try:
        return _construct(text, where, root)
    except ConfigError:
        raise
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{where}: malformed YAML{at}: {problem}") from None
    except (ValueError, TypeError, KeyError, OverflowError, RecursionError) as exc:
        # PyYAML's constructors raise these for values the checks above did not foresee
        raise ConfigError(f"{where}: malformed YAML: {brief(str(exc))}") from None


def _construct(text: str, where: str, root: str) -> Any:
    loader = PlainLoader(text, where, root)  # may raise already: it checks the characters
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def parse_yaml(text: str, where: str) -> dict[str, Any]:
    """A config document: a mapping of sections (an empty document is an empty mapping)."""
    data = load_yaml(text, where)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: must be a mapping of sections (got {describe(data)})")
    return data


def read_config_file(path: str | Path) -> str:
    """The file's text; special files (a FIFO would block, /dev/zero never ends) are refused."""
    path = Path(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise ConfigError(f"cannot read config file {brief(str(path))}: {exc}") from None
    _check_regular(path, info)
    try:
        # Stat again through the open file: the path may have changed since the check above
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as handle:
            _check_regular(path, os.fstat(handle.fileno()))
            data = handle.read(MAX_FILE_BYTES + 1)
        _check_size(path, len(data))
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None


def _check_regular(path: Path, info: os.stat_result) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"config file {path} is a directory; pass a .yaml or .json file")
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(
            f"config file {path}: must be a regular file (got a FIFO, socket or device); "
            "pass a .yaml or .json file"
        )
    _check_size(path, info.st_size)


def _check_size(path: Path, size: int) -> None:
    if size > MAX_FILE_BYTES:
        raise ConfigError(
            f"config file {path}: must be at most {MAX_FILE_BYTES} bytes (4 MiB) (got {size})"
        )


def looks_like_path(text: str) -> bool:
    # lexists, not is_file: a FIFO or a dangling link is meant as a file and gets its error
    return "\n" not in text and (text.endswith((".yaml", ".yml", ".json")) or os.path.lexists(text))


# ---- plain copies and overrides ---------------------------------------------------------


def plain_copy(value: Any) -> Any:
    """A deep copy of dict/list data with string keys, bounded in depth and size.

    Shared references are expanded (as YAML aliases are) and a recursive structure, which
    would otherwise hang or overflow the stack later, fails at the depth bound.
    """
    return _copy(value, "", 0, [MAX_VALUES])


def _copy(value: Any, path: str, depth: int, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise ConfigError(f"{path or 'config'}: must hold at most {MAX_VALUES} values in all")
    if depth >= MAX_DEPTH:
        rule = f"must be nested at most {MAX_DEPTH} levels deep"
        raise ConfigError(f"{path}: {rule} (got deeper: a recursive structure?)")
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConfigError(f"{path or 'config'}: keys must be strings (got {brief(key)})")
            sub = f"{path}.{key_text(key)}" if path else key_text(key)
            out[key] = _copy(item, sub, depth + 1, budget)
        return out
    if isinstance(value, (list, tuple)):  # tuples become lists, as they would in YAML
        return [_copy(item, f"{path}[{i}]", depth + 1, budget) for i, item in enumerate(value)]
    return value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` strings; values parse as YAML (``1e-3``, ``true``, ``[1,2]``)."""
    out = plain_copy(raw)
    if not overrides:
        return out
    for item in overrides:
        parts, value = _parse_override(item)
        if len(parts) == 1 and parts[0] in RUN_ALIASES and parts[0] not in out and "run" in out:
            parts = ["run", parts[0]]  # write where the file keeps it, so they cannot conflict
        node = out
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"--set {'.'.join(parts)}: {part!r} is not a section")
            node = child
        node[parts[-1]] = value
    return plain_copy(out)  # the values may nest or alias: hold the result to the same bounds


def _parse_override(item: Any) -> tuple[list[str], Any]:
    if not isinstance(item, str):
        raise ConfigError(f"--set: must be a string key.path=value (got {describe(item)})")
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set {brief(item)}: expected key.path=value, e.g. optimizer.lr=1e-3")
    parts = key.split(".")
    if not all(part.strip() for part in parts):
        raise ConfigError(f"--set {brief(item)}: the key path {brief(key)} has an empty part")
    value = load_yaml(text, f"--set {brief(item)}", root=key) if text.strip() else None
    return parts, value


def default_config_text() -> str:
    """The packaged smoke config that `speedtronic train` runs with no arguments."""
    from importlib.resources import files

    return files("speedtronic.defaults").joinpath("smoke.yaml").read_text(encoding="utf-8")
