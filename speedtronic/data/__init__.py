"""Data: sources (synthetic, byte text, token files, tokenized text streams), tokenizers, loading.

``loader`` builds datasets and the ``DataLoader`` from the config and wraps it in the
resumable ``DataStream``; ``sources`` reads real files without loading them; ``shards`` reads
a folder of token shards as one stream; ``manifest`` reads its manifest and says which tokenizer
a run's data was made with (``data_tokenizer``); ``synthetic`` makes learnable tokens without
files; ``tokenizer`` loads byte or Hugging Face tokenizers; ``ingest`` turns corpora into shards
(``speedtronic data tokenize``).
The public names below load lazily, so the torch-free ``tokenizer`` stays importable alone.
"""

from __future__ import annotations

from speedtronic.lazy import lazy_exports

_EXPORTS = {
    "DataStream": "loader",
    "ResumableSampler": "loader",
    "build_dataloader": "loader",
    "build_datasets": "loader",
    "build_eval_loader": "loader",
    "model_vocab": "describe",
    "SyntheticTokens": "synthetic",
    "ByteTextBlocks": "sources",
    "TokenFileBlocks": "sources",
    "TokenizedTextStream": "sources",
    "TokenShardBlocks": "shards",
    "data_tokenizer": "manifest",
    "tokenize_file": "sources",
    "ByteTokenizer": "tokenizer",
    "HFTokenizer": "tokenizer",
    "load_tokenizer": "tokenizer",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
