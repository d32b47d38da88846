"""DumbDiLoCo: asynchronous multi-node training through a shared repo.

Two roles, a room each: ``master/`` (aggregation, the outer step, its state, publishing)
and ``worker/`` (the node's Trainer plug-in: uploads, installs, its end of the run). Beside
them what both share: ``protocol`` (the repo layout and delta header; stdlib), ``codec``
(delta and weight files: encode, decode, validate), ``transport`` (the Transport interface and
the shared-directory one), ``repos``/``repo_files`` (naming and touching a repo), ``setup``
(the composition root that picks a transport and a role), and the transports that know a
service: ``hub/`` and ``s3/``. The trainer knows none of this: the coordinator joins a run as
a plug-in.
"""
