"""Data: the synthetic source, build_dataloader for user datasets, the resumable stream."""

from __future__ import annotations

import itertools
import math

import torch
from torch.utils.data import Dataset, IterableDataset

from speedtronic.config import SpeedtronicConfig
from speedtronic.data import DataStream, ResumableSampler, SyntheticTokens, build_dataloader


def test_synthetic_is_deterministic_and_shifted():
    data = SyntheticTokens(vocab_size=50, seq_len=12, seed=3)
    a, b = data[7], SyntheticTokens(vocab_size=50, seq_len=12, seed=3)[7]
    assert torch.equal(a["input_ids"], b["input_ids"])
    assert torch.equal(a["input_ids"][1:], a["labels"][:-1])
    assert a["input_ids"].shape == (12,) and a["input_ids"].max() < 50
    assert not torch.equal(a["input_ids"], data[8]["input_ids"])
    other_seed = SyntheticTokens(vocab_size=50, seq_len=12, seed=4)[7]
    assert not torch.equal(a["input_ids"], other_seed["input_ids"])


def test_synthetic_has_learnable_structure():
    """Each token has at most `branching` successors: the best loss is ~ln(4), not ln(vocab)."""
    data = SyntheticTokens(vocab_size=64, seq_len=32, seed=0, branching=4)
    successors: dict[int, set[int]] = {}
    for i in range(200):
        sample = data[i]
        for x, y in zip(sample["input_ids"].tolist(), sample["labels"].tolist(), strict=True):
            successors.setdefault(x, set()).add(y)
    assert max(len(s) for s in successors.values()) <= 4
    assert len(successors) > 32  # and the walk visits much of the vocabulary
    assert math.log(4) < 0.4 * math.log(64)


def config(**data) -> SpeedtronicConfig:
    return SpeedtronicConfig.from_dict(
        {"data": {"micro_batch_size": 4, **data}, "model": {"vocab_size": 32, "seq_len": 8}}
    )


class Squares(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return torch.tensor([i, i * i])


class Counter(IterableDataset):
    def __iter__(self):
        return iter(torch.tensor([i]) for i in range(12))


def test_map_style_gets_a_seeded_shuffled_sampler():
    loader = build_dataloader(config(), dataset=Squares())
    assert isinstance(loader.sampler, ResumableSampler)
    first = [b[:, 0].tolist() for b in loader]
    again = [b[:, 0].tolist() for b in build_dataloader(config(), dataset=Squares())]
    assert first == again and len(first) == 2  # drop_last: 10 // 4
    assert sorted(sum(first, [])) != sum(first, [])  # shuffled
    ordered = [b[:, 0].tolist() for b in build_dataloader(config(shuffle=False), dataset=Squares())]
    assert ordered == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_iterable_datasets_skip_sampler_shuffling():
    loader = build_dataloader(config(), dataset=Counter())
    assert [b.flatten().tolist() for b in loader][0] == [0, 1, 2, 3]


def test_stream_runs_epochs_and_resumes_exactly_mid_epoch():
    def stream():
        return DataStream(build_dataloader(config(), dataset=Squares()))

    straight = [b.tolist() for b in itertools.islice(stream(), 7)]
    first = stream()
    head = [next(first).tolist() for _ in range(3)]
    resumed = stream()
    resumed.load_state_dict(first.state_dict())
    tail = [next(resumed).tolist() for _ in range(4)]
    assert head + tail == straight
    assert straight[0] != straight[2]  # epoch 2 is a different order


def test_stream_without_random_access_skips_ahead_with_a_notice():
    notices = []
    first = DataStream(build_dataloader(config(), dataset=Counter()))
    straight = [next(first).tolist() for _ in range(5)]
    resumed = DataStream(build_dataloader(config(), dataset=Counter()), log=notices.append)
    resumed.load_state_dict({"epoch": 1, "batch": 1})
    assert next(resumed).tolist() == straight[4]
    assert "skipping 1 batches" in notices[0]


def test_workers_produce_the_same_batches():
    serial = [b["input_ids"] for b in itertools.islice(build_dataloader(config()), 3)]
    loader = build_dataloader(config(num_workers=2))
    parallel = [b["input_ids"] for b in itertools.islice(loader, 3)]
    for a, b in zip(serial, parallel, strict=True):
        assert torch.equal(a, b)
