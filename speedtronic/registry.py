"""Model registry: ``register_model`` and ``build_model``.

A model is any ``nn.Module`` whose forward maps a batch to a loss. It is found by a registered
name (``@register_model("name")``) or by an import path ``package.module:factory`` given as
``model.name`` in YAML; ``model.imports`` lists modules to import first (so their
``@register_model`` decorators run). Every other ``model.*`` key is passed to the factory.

Both import paths and ``model.imports`` run code named by the config: a config is as trusted as
a Python script. An import path must still name a class or a Python function outside the
standard library, so a config cannot call ``os:system`` and the like by surprise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

from speedtronic.config.sections import is_stdlib_module
from speedtronic.errors import ConfigError

_REGISTRY: dict[str, Callable[..., Any]] = {}


def register_model(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: make a factory (or an ``nn.Module`` class) buildable as ``model.name: name``."""

    def decorator(factory: Callable[..., Any]) -> Callable[..., Any]:
        _REGISTRY[name] = factory
        return factory

    return decorator


def registered_models() -> list[str]:
    return sorted(_REGISTRY)


@contextlib.contextmanager
def importable_from_cwd(module: str) -> Iterator[None]:
    """While importing ``module`` (named by the config), let it come from the working directory.

    A console script's ``sys.path`` starts with its own bin directory, not the working
    directory, so ``model.imports: [mymodels]`` beside the config would not be found, as it
    is with ``python -m``. The directory goes last and only for the config's own modules, then
    is removed: a local file never shadows an installed module or a library's optional import.
    """
    cwd = os.getcwd()
    add = module.split(".")[0] != "speedtronic" and "" not in sys.path and cwd not in sys.path
    if add:
        sys.path.append(cwd)
    try:
        yield
    finally:
        if add and cwd in sys.path:
            sys.path.remove(cwd)


def import_modules(modules: list[str]) -> None:
    for module in modules:
        try:
            with importable_from_cwd(module):
                importlib.import_module(module)
        except Exception as exc:  # any import failure is a config problem to the user
            raise ConfigError(f"model.imports: cannot import {module!r}: {exc}") from None


def import_object(path: str, key: str) -> Any:
    """Resolve ``package.module:attr.sub``; failures name the config ``key``."""
    module_name, _, attr = path.partition(":")
    try:
        with importable_from_cwd(module_name):
            target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except Exception as exc:  # ImportError, AttributeError, or the module failing to import
        raise ConfigError(f"{key}: cannot import {path!r}: {exc}") from None
    return target


def is_import_path(name: str) -> bool:
    return ":" in name


def resolve_factory(name: str) -> Callable[..., Any]:
    if name in _REGISTRY:
        return _REGISTRY[name]
    if is_import_path(name):
        target = import_object(name, "model.name")
        _require_model_factory(name, target)
        return target
    close = difflib.get_close_matches(name, list(_REGISTRY), n=1)
    hint = (
        f"did you mean {close[0]!r}?" if close else "or use an import path 'package.module:factory'"
    )
    raise ConfigError(
        f"model.name: unknown model {name!r}; registered: {', '.join(registered_models())}; {hint}"
    )


def _require_model_factory(name: str, target: Any) -> None:
    """Only a class or a Python function outside the standard library may build the model.

    A config is trusted like a script, but ``model: {name: 'os:system', command: ...}`` should
    not run a shell command just because it is callable with the keys given.
    """
    if not (inspect.isclass(target) or inspect.isfunction(target)):
        raise ConfigError(
            f"model.name: {name!r} is a {type(target).__name__}, not a class or a Python "
            "function; an import path must name a model class or a factory function"
        )
    module = getattr(target, "__module__", None) or "builtins"
    if is_stdlib_module(module):
        raise ConfigError(
            f"model.name: {name!r} is defined in the standard library ({module}), so it is not "
            "a model factory; name a model class or factory function of your own"
        )


def build_model(name: str, params: dict[str, Any], imports: list[str] | None = None) -> Any:
    """Build the module; bad parameters become a ConfigError naming ``model.<key>``."""
    import_modules(imports or [])
    factory = resolve_factory(name)
    _check_params(name, factory, params)
    try:
        return factory(**params)
    except ConfigError:  # already names its key (and is a ValueError: keep it as it is)
        raise
    except (TypeError, ValueError) as exc:
        raise _factory_error(name, params, exc) from None


def _factory_error(name: str, params: dict[str, Any], exc: Exception) -> ConfigError:
    """``model.<key>`` when the factory's message starts with a given key, else ``model.name``."""
    first = next((line for line in str(exc).splitlines() if line.strip()), "")
    key, sep, rule = first.partition(": ")
    if sep and key in params:
        return ConfigError(f"model.{key}: {rule}")
    return ConfigError(
        f"model.name: {name!r} failed to build the model ({type(exc).__name__}: {first})"
    )


def _check_params(name: str, factory: Callable[..., Any], params: dict[str, Any]) -> None:
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return
    accepted = signature.parameters.values()
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted):
        reject_unknown(name, params, [p.name for p in accepted])


def reject_unknown(name: str, params: dict[str, Any], known: list[str]) -> None:
    for key in params:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"accepted: {', '.join(known)}"
            raise ConfigError(f"model.{key}: unknown parameter for model {name!r}; {hint}")


@register_model("reference_transformer")
def reference_transformer(**params: Any) -> Any:
    """The shipped GPT-style decoder; params are ``ReferenceConfig`` fields."""
    from speedtronic.model import ReferenceTransformer

    return ReferenceTransformer(reference_config(params))


def reference_config(params: dict[str, Any]) -> Any:
    """The ``ReferenceConfig`` of ``model:`` params, every problem a ConfigError naming its key.

    Checks what building the reference model checks, without building it (issue 31: the
    checks that must pass before ``--overwrite`` deletes anything, and ``validate``'s
    parameter count).
    """
    from speedtronic.config import check_types
    from speedtronic.model import ReferenceConfig

    reject_unknown(
        "reference_transformer", params, [f.name for f in dataclasses.fields(ReferenceConfig)]
    )
    checked = check_types("model", ReferenceConfig, params)
    try:
        return ReferenceConfig(**checked)
    except ValueError as exc:  # its messages start with the field: "n_kv_head: must divide ..."
        raise ConfigError(f"model.{exc}") from None
