"""Everything that knows the Hugging Face Hub: the only place that imports ``huggingface_hub``.

``client`` (``HubClient``: requests, retries, budgets; the one ``huggingface_hub`` importer),
``errors`` and ``files`` (what callers catch and read, stdlib), ``cache`` (downloaded globals),
``budget`` (the Hub's limits, cadence warnings), ``access`` (can this token write?),
``transport`` (the DumbDiLoCo ``Transport`` over a ``HubClient``) and ``admin`` (``hub init``,
``grant``, ``status``). Importing this package loads none of them.
"""
