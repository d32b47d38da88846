"""The training loop's room: everything that runs one step after another.

``trainer`` (the Trainer: accumulation, precision, compile, plug-in points), ``step_log``
(what a step reports), ``failure`` (non-finite losses and what to do about them), ``rng``
(every random stream, saved and restored), ``precision`` (device and dtype resolution, the
bf16 probe), ``parallel`` (DDP), ``preflight`` (the checks before step 1). The runtime that
wires a config to these is ``speedtronic.runtime``, one floor up: it is the composition root.
"""

from speedtronic.lazy import lazy_exports

__getattr__ = lazy_exports(__name__, {"Trainer": "trainer", "TrainResult": "trainer"})
