"""DumbDiLoCo: asynchronous multi-node training through a shared repo.

``protocol`` (the repo layout and delta header; stdlib), ``codec`` (delta and weight files:
encode, decode, validate), ``transport`` (the Transport interface and the shared-directory
one), ``outer`` (the master's aggregation policy, Nesterov step and persisted state),
``worker`` (the node's Trainer plug-in) and ``master`` (the master's polling and publishing
loop). The trainer knows none of this: the coordinator joins a run as a plug-in.
"""
