"""DumbDiLoCo over the Hugging Face Hub, on top of the one Hub client (``speedtronic.hub``).

``transport`` (the DumbDiLoCo ``Transport`` over a ``HubClient``) with ``view``, ``publish``,
``rates`` and ``prepare``; ``cadence`` (what a run's cadence spends of the Hub's budgets, and
which knob to turn); ``admin`` (``hub init``, ``grant``, ``status``). Importing this package
loads none of them.
"""
