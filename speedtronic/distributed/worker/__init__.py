"""The worker's room: a node that trains, sends deltas and installs globals.

``plugin`` (WorkerPlugin, the node's Trainer plug-in), ``upload`` (sending deltas off the
training thread), ``inflight`` (what was sent and not yet in a global), ``resume`` (what a
restarted node announces), ``fetch`` (polling for and checking globals), ``end`` (the run's
end as the worker sees it).
"""

from speedtronic.lazy import lazy_exports

__getattr__ = lazy_exports(__name__, {"WorkerPlugin": "plugin"})
