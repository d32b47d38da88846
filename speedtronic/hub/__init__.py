"""The one Hugging Face Hub client, for every feature that talks to the Hub; the only place
that imports ``huggingface_hub``.

``client`` (``HubClient``, the operations on one repo) over ``policy``, ``session``,
``classify`` and ``wording`` (how requests are counted, timed out, retried and worded),
``reads`` and ``commits`` (single reads; commits that land once) and ``cache``; ``errors`` and
``files`` (what callers catch and read, stdlib); ``budget`` (the Hub's limits and what this
process spent); ``access`` (can this token write?) and ``names`` (the repo-id rule). The
DumbDiLoCo transport on top of it lives in ``speedtronic.distributed.hub``. Importing this
package loads none of them.
"""
