"""What a run tells the world: ``metrics`` (MetricLogger, its sinks and event lines),
``integrations`` (W&B and TensorBoard hooks), ``history`` (the run's recorded curves).
"""

from speedtronic.lazy import lazy_exports

__getattr__ = lazy_exports(__name__, {"MetricLogger": "metrics"})
