"""Runs side by side: every run under some directories as one row (``listing``), several
runs' differing config keys and curves (``compare``), and their picture (``plot``).

A room of its own because it reads what two others write: checkpoints (``checkpoint``) and
metrics (``observe``), plus the summary.json a run leaves at its end. Stdlib only, but for
``plot``'s matplotlib (the ``plot`` extra). Nothing but the CLI imports it.
"""
