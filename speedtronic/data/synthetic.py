"""The synthetic token source: learnable sequences with no data files, for smoke runs and tests."""

from __future__ import annotations

import random

import torch
from torch.utils.data import Dataset


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
