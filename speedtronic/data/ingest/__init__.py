"""Ingest: real corpora (text, JSON Lines, gzip / zstd, Parquet; local or on the Hub) into tokens.

``pipeline.tokenize_corpus`` is the entry point (``speedtronic data tokenize``). The parts, one
job each: ``spec`` (SOURCE arguments -> input files), ``hub_source`` (Hub datasets and files
through ``speedtronic.hub``), ``formats`` (one reader per format, cut into units), ``arrow`` (the
only pyarrow importer), ``encode`` (separator, held-out rule, token ids), ``work`` and ``pool``
(worker processes, order kept), ``writer`` (shards and the journal), ``owner`` (what a tokenize
owns at OUT, and its lock), ``plan`` (what a tokenize will do, checked again on resume). No torch
anywhere here: workers start fast.
"""
