"""Lazy re-exports (PEP 562) for packages whose public names would pull in torch.

A package maps each public name to the submodule that defines it; the submodule is imported
on first access only, so importing a light submodule (``checkpoint.inspection``) through its
package never loads the heavy ones beside it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` resolving ``exports`` (name -> submodule)."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)  # cache: later lookups skip __getattr__
        return value

    return __getattr__
