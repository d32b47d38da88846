"""Data loading: datasets from the config, ``build_dataloader`` and the resumable ``DataStream``.

``build_dataloader`` turns the ``data`` section (or any user ``Dataset`` / ``IterableDataset``)
into a torch ``DataLoader``. ``DataStream`` wraps it into the endless, position-tracking
iterator of micro-batches the trainer consumes, so a run can report and restore where it is.
"""

from __future__ import annotations

import functools
import itertools
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from speedtronic.config import SpeedtronicConfig
from speedtronic.data.describe import model_vocab
from speedtronic.data.manifest import data_tokenizer
from speedtronic.data.shards import TokenShardBlocks, open_token_path
from speedtronic.data.sources import ByteTextBlocks, TokenizedTextStream
from speedtronic.data.synthetic import SyntheticTokens
from speedtronic.data.tokenizer import (
    ByteTokenizer,
    check_vocab,
    is_byte_level,
    load_tokenizer,
)
from speedtronic.errors import DataError, SpeedtronicError


class ResumableSampler(Sampler[int]):
    """Seeded per-epoch order (shuffled or sequential) that can start mid-epoch.

    With ``world > 1`` (DDP) every rank draws the same epoch order, cut to a multiple of
    ``world``, and takes every ``world``-th index from ``rank``: no index twice, none missing,
    and the ranks' micro-batches of one optimizer step together hold exactly the samples a
    single process would use for that step. ``start`` counts within this rank's share.
    """

    def __init__(self, length: int, shuffle: bool, seed: int, rank: int = 0, world: int = 1):
        self.length, self.shuffle, self.seed = length, shuffle, seed
        self.rank, self.world = rank, world
        self.usable = length - length % world  # the same cut on every rank
        self.epoch, self.start = 0, 0

    def set_position(self, epoch: int, start: int) -> None:
        self.epoch, self.start = epoch, start

    def __iter__(self) -> Iterator[int]:
        first = self.rank + self.start * self.world
        if not self.shuffle:
            return iter(range(first, self.usable, self.world))
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        dtype = torch.int32 if self.length < 2**31 else torch.int64
        order = torch.randperm(self.length, generator=generator, dtype=dtype)
        order = order[first : self.usable : self.world]
        # 4 bytes per block, handed out in chunks: a Python list of every index of a 2 GB
        # file would cost ~300 MB of RSS.
        return (i for chunk in order.split(1 << 16) for i in chunk.tolist())

    def __len__(self) -> int:
        return self.usable // self.world - self.start


def build_datasets(
    config: SpeedtronicConfig, tokenizer: Callable[[str], list[int]] | None = None
) -> tuple[Dataset, Dataset | None]:
    """The training dataset named by ``data`` and its held-out evaluation set (or None)."""
    data, source = config.data, config.data.resolved_source
    vocab = model_vocab(config)
    if source == "synthetic":
        return SyntheticTokens(vocab or 256, config.seq_len, seed=config.run.seed), None
    if source == "tokens":
        dtype, seq_len = data.token_dtype, config.seq_len
        train = open_token_path(data.token_path, seq_len, dtype, vocab, "data.token_path")
        held = data.eval_path and open_token_path(
            data.eval_path, seq_len, dtype, vocab, "data.eval_path", eval_part(data)
        )
    else:
        for path, key in ((data.text_path, "data.text_path"), (data.eval_path, "data.eval_path")):
            if path:
                refuse_corpus(path, key)  # before any other check: it says what to do instead
        tokenizer = tokenizer or load_tokenizer(data.tokenizer)
        check_vocab(tokenizer, vocab)
        train = _text_source(config, data.text_path, tokenizer, "data.text_path")
        held = data.eval_path and _text_source(config, data.eval_path, tokenizer, "data.eval_path")
    if data.eval_fraction > 0:
        train, held = _hold_out(train, data.eval_fraction)
    return train, held or None


def eval_part(data: Any) -> str:
    """Which part of a shard folder ``data.eval_path`` names: the training folder itself means its
    held-out ``val`` part; another folder its ``val`` part when it has one, else its ``train``."""
    from speedtronic.data import manifest

    path = data.eval_path
    if not manifest.is_shard_dir(path):
        return "train"
    if Path(path).resolve() == Path(data.token_path or "").resolve():
        return "val"
    doc = manifest.read_manifest(path, "data.eval_path")
    return "val" if doc["parts"].get("val") else "train"


def _text_source(config: SpeedtronicConfig, path: str, tokenizer: Any, key: str) -> Dataset:
    if is_byte_level(tokenizer):
        return ByteTextBlocks(path, config.seq_len, key=key)
    buffer = config.data.shuffle_buffer if config.data.shuffle else 0
    return TokenizedTextStream(
        path, config.seq_len, tokenizer, seed=config.data_seed, shuffle_buffer=buffer, key=key
    )


def refuse_corpus(path: str, key: str) -> None:
    """A JSON Lines or Parquet file is no text to train on as it is: its keys, quotes and escapes
    would become the training text. Say how to tokenize it."""
    from speedtronic.data.ingest.spec import FORMAT_NAMES, corpus_format

    found = corpus_format(path)
    if found is not None:
        raise DataError(
            f"{key}: {path} is {FORMAT_NAMES[found]}, not plain text",
            hint=f"tokenize it first: speedtronic data tokenize {path} tokens (then train with "
            "data.token_path: tokens)",
        )


def _hold_out(train: Any, fraction: float) -> tuple[Dataset, Dataset]:
    if isinstance(train, TokenizedTextStream):
        return train.split(fraction)
    held = max(1, round(len(train) * fraction))
    if held >= len(train):
        raise DataError(f"data.eval_fraction: {fraction} leaves no training blocks")
    return train.split(held)


def bytes_per_token(dataset: Any, tokens: int) -> Callable[[], float | None] | None:
    """How many text bytes a token of held-out ``dataset`` stands for, when its bytes are
    known: 1 for byte-level text, else measured over the first ``tokens`` tokens' text (once,
    when first asked); for a token folder, from its manifest's bytes per shard (the shards those
    tokens lie in); None for a flat token file, an older folder and a caller's own data."""
    if isinstance(dataset, ByteTextBlocks):
        return lambda: 1.0
    if isinstance(dataset, TokenShardBlocks):
        return lambda: dataset.bytes_per_token(tokens)
    if isinstance(dataset, TokenizedTextStream):
        return functools.cache(lambda: dataset.bytes_per_token(tokens))
    return None


def run_tokenizer(
    config: SpeedtronicConfig, dataset: Any, given: Any = None, from_config: bool = True
) -> Any:
    """The tokenizer the run's training data was tokenized with, or None when it is unknown.

    The seam between the data sources and what outlives the run (``Runtime.tokenizer``, which
    each checkpoint records for ``speedtronic generate`` and ``export``): first the training
    dataset's own ``tokenizer`` attribute, where a source knows it; then, for a dataset built
    from the config (``from_config``), the tokenizer given to ``build_runtime`` for text, byte
    ids (``ByteTokenizer``) for synthetic data, and otherwise what the config's data says
    (``data.manifest.data_tokenizer``: ``data.tokenizer`` for text, a shard folder's manifest
    for tokens). A user's dataset, or a flat token file, give None.
    """
    own = getattr(dataset, "tokenizer", None)
    if own is not None or not from_config:
        return own
    source = config.data.resolved_source
    if source == "text" and given is not None:
        return given
    return ByteTokenizer() if source == "synthetic" else data_tokenizer(config)


def build_dataloader(
    config: SpeedtronicConfig,
    dataset: Dataset | None = None,
    tokenizer: Callable[[str], list[int]] | None = None,
    device: torch.device | None = None,
    shard: tuple[int, int] = (0, 1),
) -> DataLoader:
    """A DataLoader of micro-batches for ``config``; ``dataset`` replaces ``data.source``.

    Map-style datasets get a seeded ``ResumableSampler``; iterable datasets are read in
    their own order (no sampler shuffling). ``tokenizer`` (any ``str -> list[int]``) replaces
    ``data.tokenizer`` for text sources. ``shard=(rank, world)`` gives a DDP rank its share:
    by index for map-style datasets, per-rank iteration for iterable ones (``shard_iterable``).
    """
    data, (rank, world) = config.data, shard
    dataset = dataset if dataset is not None else build_datasets(config, tokenizer)[0]
    if world > 1 and isinstance(dataset, IterableDataset):
        dataset = shard_iterable(dataset, rank, world)
    pin = data.pin_memory if isinstance(data.pin_memory, bool) else _is_cuda(device)
    workers = data.num_workers
    kwargs: dict[str, Any] = dict(
        batch_size=data.micro_batch_size,
        num_workers=workers,
        pin_memory=pin,
        drop_last=True,
        persistent_workers=workers > 0,
    )
    if workers > 0:
        kwargs["prefetch_factor"] = data.prefetch_factor
    # Its own generator: starting an epoch must not draw from the global torch RNG, or a
    # resumed run (which starts a fresh iterator) would see different dropout masks.
    kwargs["generator"] = torch.Generator().manual_seed(config.data_seed)
    if not isinstance(dataset, IterableDataset):
        if len(dataset) < data.micro_batch_size:
            raise DataError(
                f"data: the dataset has {len(dataset)} samples (blocks), fewer than "
                f"data.micro_batch_size={data.micro_batch_size}"
            )
        sampler = ResumableSampler(len(dataset), data.shuffle, config.data_seed, rank, world)
        kwargs["sampler"] = sampler
    return DataLoader(dataset, **kwargs)


def shard_iterable(dataset: IterableDataset, rank: int, world: int) -> IterableDataset:
    """This rank's share of an iterable dataset: its own ``set_shard`` when it has one (it
    then reads only its part), else every ``world``-th item from ``rank``."""
    set_shard = getattr(dataset, "set_shard", None)
    if callable(set_shard):
        set_shard(rank, world)
        return dataset
    return EveryNth(dataset, rank, world)


class EveryNth(IterableDataset):
    """Items ``rank, rank + world, ...`` of an iterable dataset; everything else (set_epoch) is
    the wrapped dataset's. Its state is the wrapped one's plus whether this rank had read from
    it: after its k-th item the wrapped dataset stands just past it, so a resume must skip the
    ``world - 1`` items of the other ranks, not ``rank`` as at the start of an epoch."""

    def __init__(self, dataset: IterableDataset, rank: int, world: int):
        self.dataset, self.rank, self.world = dataset, rank, world
        self._read, self._mid = 0, False  # items read this epoch; resumed mid-epoch

    def __iter__(self) -> Iterator[Any]:
        first = self.world - 1 if self._mid else self.rank
        self._read, self._mid = 0, False
        for item in itertools.islice(iter(self.dataset), first, None, self.world):
            self._read += 1
            yield item

    def __getattr__(self, name: str) -> Any:
        if name == "dataset":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        inner = getattr(self.dataset, name)
        if name == "state_dict":
            return lambda: {"inner": inner(), "mid": self._read > 0}
        if name == "load_state_dict":
            return self._load_state_dict
        return inner

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        self.dataset.load_state_dict(state["inner"])
        self._mid = bool(state["mid"])


def build_eval_loader(
    config: SpeedtronicConfig, dataset: Dataset, device: torch.device | None = None
) -> DataLoader:
    """Held-out batches in a fixed order (no shuffling): every evaluation sees the same data."""
    pin = config.data.pin_memory
    return DataLoader(
        dataset,
        batch_size=config.data.micro_batch_size,
        drop_last=False,
        pin_memory=pin if isinstance(pin, bool) else _is_cuda(device),
    )


def _is_cuda(device: torch.device | None) -> bool:
    return device.type == "cuda" if device is not None else torch.cuda.is_available()


class DataStream:
    """Endless iterator of micro-batches over a DataLoader, epoch after epoch.

    Tracks ``(epoch, batch)`` so a run can save where it is. Restoring is exact for loaders
    with a ``ResumableSampler`` and for iterable datasets with ``state_dict()`` /
    ``load_state_dict()`` read without workers; other loaders skip ahead by reading and
    dropping batches, with a notice.
    """

    def __init__(self, loader: DataLoader | Any, log: Callable[[str], None] = print):
        self.loader, self.log = loader, log
        self.epoch, self.batch = 0, 0
        self._iterator: Iterator[Any] | None = None
        self._skip = 0  # batches to drop when the next epoch iterator starts
        generator = getattr(loader, "generator", None)
        self._seed = generator.initial_seed() if generator is not None else None

    def __iter__(self) -> DataStream:
        return self

    def __next__(self) -> Any:
        for _ in range(2):  # a fresh epoch that is empty at once means the data is empty
            if self._iterator is None:
                self._iterator = self._start_epoch()
            try:
                batch = next(self._iterator)
                self.batch += 1
                return batch
            except SpeedtronicError as exc:  # re-raised from a worker: keep the one-line cause
                raise _last_line(exc) from None
            except StopIteration:
                self._iterator = None
                self.epoch, self.batch = self.epoch + 1, 0
        raise DataError("data: the data source yields no complete micro-batch")

    def _start_epoch(self) -> Iterator[Any]:
        sampler = getattr(self.loader, "sampler", None)
        if isinstance(sampler, ResumableSampler):
            sampler.set_position(self.epoch, self.batch * self.loader.batch_size)
        set_epoch = getattr(self.loader.dataset, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(self.epoch)
        if self._seed is not None:  # worker seeds depend on the epoch only, also after resume
            self.loader.generator.manual_seed(self._seed + self.epoch)
        with warnings.catch_warnings():  # said once at start in our words (train/preflight.py)
            warnings.filterwarnings("ignore", message="This DataLoader will create")
            iterator = iter(self.loader)
        for _ in range(self._skip):
            next(iterator)
        self._skip = 0
        return iterator

    def _stateful_dataset(self) -> Any:
        dataset = getattr(self.loader, "dataset", None)
        exact = isinstance(dataset, IterableDataset) and hasattr(dataset, "state_dict")
        return dataset if exact and getattr(self.loader, "num_workers", 0) == 0 else None

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"epoch": self.epoch, "batch": self.batch}
        dataset = self._stateful_dataset()
        if dataset is not None:
            state["dataset"] = dataset.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])
        self._iterator, self._skip = None, 0
        dataset = self._stateful_dataset()
        if dataset is not None and "dataset" in state:
            dataset.load_state_dict(state["dataset"])
        elif not isinstance(getattr(self.loader, "sampler", None), ResumableSampler):
            self._skip = self.batch  # no random access: replay to the saved position
            self.log(
                f"data: this source cannot restore its position; skipping {self.batch} "
                "batches to resume"
            )


def _last_line(exc: SpeedtronicError) -> SpeedtronicError:
    """DataLoader workers re-raise with their traceback in the message; users need the cause."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    if len(lines) <= 1:
        return exc
    prefix, sep, cause = lines[-1].partition(": ")  # "speedtronic.errors.DataError: ..."
    return type(exc)(cause if sep and prefix.endswith(type(exc).__name__) else lines[-1])
