"""Evaluation that tells models apart: one scorer, and what is scored with it.

``scorer`` computes log-probabilities of continuations given contexts, batched; ``text`` turns
a text into windows of that form and reports loss and bits per byte (from the bytes of the
text, never from token counts alone); ``choice`` scores multiple-choice items; ``tasks`` holds
the data adapters (HellaSwag's JSONL form) that turn a task file into those items. Another
multiple-choice task is one more adapter in ``tasks``, not another scorer. Two Trainer
plug-ins score during training: ``plugin`` the named sets (``eval.sets``), ``loss_plugin`` the
eval loss on the run's own held-out data. Nothing here knows Typer, Rich or the Hub client's
internals.
"""
