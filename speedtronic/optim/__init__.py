"""Optimizers and schedules: ``build`` (AdamW setup, MuonAdamW, the lr schedules), ``muon``
(the Muon update) and ``param_split`` (which parameters are hidden matrices, by module).

``speedtronic.optim`` was one module before issue 41; its names still resolve here.
"""

from speedtronic.lazy import lazy_exports

_BUILD = (
    "MuonAdamW build_adamw build_optimizer build_scheduler lr_factor muon_lr "
    "muon_weight_decay optimizer_label param_groups trainable"
).split()
__getattr__ = lazy_exports(
    __name__, {**dict.fromkeys(_BUILD, "build"), "Muon": "muon", "split_parameters": "param_split"}
)
