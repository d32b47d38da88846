"""Old import paths of modules that moved into rooms (issue 41), kept for one release.

``import speedtronic.trainer`` still works: a finder at the end of ``sys.meta_path`` answers
the old names only (the new files exist, the old ones do not, so nothing else ever reaches
it), imports the module from its new home, warns once with ``DeprecationWarning`` and hands
back that same module object, so state and ``isinstance`` checks are shared between the two
names. The three old modules whose names became packages (``speedtronic.optim``,
``speedtronic.distributed.master``, ``speedtronic.distributed.worker``) re-export their old
public names from the package instead.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType

MOVED = {
    "speedtronic.trainer": "speedtronic.train.trainer",
    "speedtronic.step_log": "speedtronic.train.step_log",
    "speedtronic.failure": "speedtronic.train.failure",
    "speedtronic.rng": "speedtronic.train.rng",
    "speedtronic.precision": "speedtronic.train.precision",
    "speedtronic.parallel": "speedtronic.train.parallel",
    "speedtronic.preflight": "speedtronic.train.preflight",
    "speedtronic.muon": "speedtronic.optim.muon",
    "speedtronic.param_split": "speedtronic.optim.param_split",
    "speedtronic.metrics": "speedtronic.observe.metrics",
    "speedtronic.integrations": "speedtronic.observe.integrations",
    "speedtronic.history": "speedtronic.observe.history",
    "speedtronic.evaluation": "speedtronic.evaluate.loss_plugin",  # issue 48
    **{
        f"speedtronic.distributed.{old}": f"speedtronic.distributed.{new}"
        for old, new in {
            "master_end": "master.plugin",
            "master_intake": "master.intake",
            "master_publish": "master.publish",
            "master_repo": "master.repo",
            "master_roster": "master.roster",
            "master_state": "master.state",
            "outer": "master.outer",
            "outer_optim": "master.outer_optim",
            "worker_end": "worker.end",
            "worker_fetch": "worker.fetch",
            "worker_inflight": "worker.inflight",
            "worker_resume": "worker.resume",
            "worker_upload": "worker.upload",
        }.items()
    },
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old names and loads each as the module at its new path."""

    def find_spec(self, fullname: str, path: object = None, target: object = None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}; the old path is removed in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module was executed under its new name."""


def install() -> None:
    """Answers the old names from now on (idempotent: one finder per interpreter)."""
    if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
        sys.meta_path.append(_Alias())
