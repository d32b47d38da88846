"""The master's room: it takes deltas in and publishes globals.

``loop`` (MasterLoop: polling and publishing), ``plugin`` (the master as a Trainer plug-in and
its end of the run), ``intake`` (deltas read, validated, counted once), ``roster`` (the nodes
it has heard from), ``outer`` (aggregation policy and the outer step), ``outer_optim`` (the
Nesterov outer optimizer), ``state`` (the master's own state dir, the source of truth),
``repo`` (the repo checked against that state), ``publish`` (one atomic publish at a time).
"""

from speedtronic.lazy import lazy_exports

__getattr__ = lazy_exports(__name__, {"MasterLoop": "loop", "MasterPlugin": "plugin"})
