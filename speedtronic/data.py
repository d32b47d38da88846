"""Data: the synthetic token source, ``build_dataloader`` and the resumable ``DataStream``.

``build_dataloader`` turns the ``data`` section (or any user ``Dataset`` / ``IterableDataset``)
into a torch ``DataLoader``. ``DataStream`` wraps it into the endless, position-tracking
iterator of micro-batches the trainer consumes, so a run can report and restore where it is.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from speedtronic.config import SpeedtronicConfig
from speedtronic.errors import ConfigError


class SyntheticTokens(Dataset):
    """Deterministic token sequences with learnable structure.

    Each sequence walks a fixed random sparse Markov chain: every token has ``branching``
    possible successors. A model that learns the chain reaches a loss near ln(branching)
    (1.39 for 4), far below the ln(vocab) of uniform noise, so a short run visibly learns.
    Sample ``i`` depends only on ``(seed, i)``: any order, any worker, same tokens.
    """

    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        seed: int = 0,
        branching: int = 4,
        num_samples: int = 1 << 20,
    ):
        if branching & (branching - 1):
            raise ValueError(f"branching must be a power of two (got {branching})")
        chain = random.Random(f"speedtronic-synthetic-{seed}")
        self.successors = [
            [chain.randrange(vocab_size) for _ in range(branching)] for _ in range(vocab_size)
        ]
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed
        self.bits, self.num_samples = branching.bit_length() - 1, num_samples

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        rng = random.Random(self.seed * 0x9E3779B97F4A7C15 + index)
        token = rng.randrange(self.vocab_size)
        choices = rng.getrandbits(self.bits * self.seq_len)  # all branch picks in one call
        mask, successors = (1 << self.bits) - 1, self.successors
        tokens = [token]
        for _ in range(self.seq_len):
            token = successors[token][choices & mask]
            choices >>= self.bits
            tokens.append(token)
        sequence = torch.tensor(tokens, dtype=torch.long)
        return {"input_ids": sequence[:-1], "labels": sequence[1:]}


class ResumableSampler(Sampler[int]):
    """Seeded per-epoch order (shuffled or sequential) that can start mid-epoch."""

    def __init__(self, length: int, shuffle: bool, seed: int):
        self.length, self.shuffle, self.seed = length, shuffle, seed
        self.epoch, self.start = 0, 0

    def set_position(self, epoch: int, start: int) -> None:
        self.epoch, self.start = epoch, start

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            order = torch.randperm(self.length, generator=generator)[self.start :].tolist()
        else:
            order = range(self.start, self.length)
        return iter(order)

    def __len__(self) -> int:
        return self.length - self.start


def build_dataset(config: SpeedtronicConfig) -> Dataset:
    """The dataset named by ``data.source``."""
    if config.data.source == "synthetic":
        vocab = int(config.model.params.get("vocab_size", 256))
        return SyntheticTokens(vocab, config.seq_len, seed=config.run.seed)
    raise ConfigError(f"data.source: unknown source {config.data.source!r}")


def build_dataloader(
    config: SpeedtronicConfig,
    dataset: Dataset | None = None,
    tokenizer: Callable[[str], list[int]] | None = None,
    device: torch.device | None = None,
) -> DataLoader:
    """A DataLoader of micro-batches for ``config``; ``dataset`` replaces ``data.source``.

    Map-style datasets get a seeded ``ResumableSampler``; iterable datasets are read in
    their own order (no sampler shuffling). ``tokenizer`` (any ``str -> list[int]``) is used
    by text sources; the synthetic source does not need one.
    """
    del tokenizer  # text sources (data issue) tokenize; synthetic data is already tokens
    data = config.data
    dataset = dataset if dataset is not None else build_dataset(config)
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
    kwargs["generator"] = torch.Generator().manual_seed(config.run.seed)
    if not isinstance(dataset, IterableDataset):
        if len(dataset) < data.micro_batch_size:
            raise ConfigError(
                f"data: the dataset has {len(dataset)} samples, fewer than "
                f"data.micro_batch_size={data.micro_batch_size}"
            )
        kwargs["sampler"] = ResumableSampler(len(dataset), data.shuffle, config.run.seed)
    return DataLoader(dataset, **kwargs)


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
            except StopIteration:
                self._iterator = None
                self.epoch, self.batch = self.epoch + 1, 0
        raise ConfigError("data: the data source yields no complete micro-batch")

    def _start_epoch(self) -> Iterator[Any]:
        sampler = getattr(self.loader, "sampler", None)
        if isinstance(sampler, ResumableSampler):
            sampler.set_position(self.epoch, self.batch * self.loader.batch_size)
        if self._seed is not None:  # worker seeds depend on the epoch only, also after resume
            self.loader.generator.manual_seed(self._seed + self.epoch)
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
            self.log(f"data: this source cannot restore its position; skipping {self.batch} "
                     "batches to resume")
