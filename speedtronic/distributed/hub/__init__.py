"""Everything that knows the Hugging Face Hub: the only place that imports ``huggingface_hub``.

``client`` (``HubClient``, the operations on one repo) over ``policy``, ``session``,
``classify`` and ``wording`` (how requests are counted, timed out, retried and worded),
``reads`` and ``commits`` (single reads; commits that land once) and ``cache``; ``errors`` and
``files`` (what callers catch and read, stdlib); ``budget`` (the Hub's limits, cadence
warnings); ``transport`` (the DumbDiLoCo ``Transport`` over a ``HubClient``) with ``view``,
``publish``, ``rates`` and ``prepare``; ``access`` (can this token write?), ``admin``
(``hub init``, ``grant``, ``status``) and ``names``. Importing this package loads none of them.
"""
