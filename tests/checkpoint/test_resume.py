"""Exact resume: N steps straight equal N/2 + resume + N/2, bit for bit, for every source."""

from __future__ import annotations

import json
import re

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

from speedtronic.checkpoint import load_checkpoint
from speedtronic.runtime import train_from_config


class StopAt:
    """A plug-in that ends the run early, as a preemption would (final checkpoint included)."""

    name = "stop_at"

    def __init__(self, step: int):
        self.step = step

    def after_optimizer_step(self, trainer):
        return "stop" if trainer.step == self.step else None


def run(config, stop_at=None, resume=False, **kwargs):
    config = {**config, "checkpoint": {**config.get("checkpoint", {}), "resume": resume}}
    losses = {}

    def record(event, payload):
        if event == "train_step":
            losses[payload["step"]] = payload["loss"]

    plugins = [StopAt(stop_at)] if stop_at else []
    result = train_from_config(config, console=False, hooks=[record], plugins=plugins, **kwargs)
    return result, losses


def final_weights(result):
    return load_checkpoint(result.checkpoint).model_state


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def straight_and_split(tiny, tmp_path, make_kwargs=dict):
    tiny["run"]["max_steps"] = 8
    straight, straight_losses = run(tiny, **make_kwargs())
    tiny["run"]["output_dir"] = str(tmp_path / "split")
    first, first_losses = run(tiny, stop_at=4, **make_kwargs())
    assert first.status == "stopped" and first.steps == 4
    second, second_losses = run(tiny, resume=True, **make_kwargs())
    assert second.steps == 8 and second.tokens == straight.tokens
    assert_same_weights(final_weights(straight), final_weights(second))
    assert {**first_losses, **second_losses} == straight_losses
    return second


def test_exact_resume_synthetic_with_accumulation(tiny, tmp_path):
    assert tiny["data"]["target_batch_size"] == 2 * tiny["data"]["micro_batch_size"]
    straight_and_split(tiny, tmp_path)


class Shuffled(Dataset):
    def __len__(self):
        return 37  # not a multiple of the batch: epochs end mid-way through a step

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, 64, (16,), generator=g)
        return {"input_ids": ids, "labels": torch.roll(ids, -1)}


def test_exact_resume_custom_map_style_dataset(tiny, tmp_path):
    straight_and_split(tiny, tmp_path, lambda: {"dataset": Shuffled()})


class Stream(IterableDataset):
    def __init__(self):
        self.position = 0

    def __iter__(self):
        while self.position < 50:
            self.position += 1
            yield Shuffled()[self.position % 37]
        self.position = 0


class StatefulStream(Stream):
    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def test_exact_resume_iterable_with_state_dict(tiny, tmp_path):
    straight_and_split(tiny, tmp_path, lambda: {"dataset": StatefulStream()})


def test_iterable_without_state_resumes_by_skipping_with_a_notice(tiny, tmp_path):
    notices = []
    tiny["run"]["max_steps"] = 8
    run(tiny, stop_at=4, dataset=Stream())
    train_from_config(
        {**tiny, "checkpoint": {"resume": True}},
        console=False,
        dataset=Stream(),
        hooks=[lambda e, p: e == "notice" and notices.append(p["message"])],
    )
    assert any("skipping 8 batches" in n for n in notices)
    tiny["run"]["output_dir"] = str(tmp_path / "straight")  # a run of its own
    straight_and_split(tiny, tmp_path, lambda: {"dataset": Stream()})


def test_jsonl_continues_without_gap_or_duplicate(tiny, tmp_path):
    tiny["logging"].update(every_steps=1, json_file="metrics.jsonl")
    tiny["checkpoint"] = {"interval": 2}
    tiny["run"]["max_steps"] = 8
    run(tiny, stop_at=5)
    path = tmp_path / "run" / "metrics.jsonl"
    # A crash after step 5 was logged but before anything was saved at 5: simulate with a
    # newest checkpoint at 4 by removing the final one.
    ckpts = tmp_path / "run" / "checkpoints"
    (ckpts / "latest.json").write_text(json.dumps({"step": 4, "path": "step_0000000004"}))
    import shutil

    shutil.rmtree(ckpts / "step_0000000005")
    with path.open("a") as f:
        f.write('{"event": "train_step", "step": 6, "lo')  # a line cut short by the kill
    run(tiny, resume=True)
    steps = [json.loads(line).get("step") for line in path.read_text().splitlines()]
    train_steps = [
        r["step"]
        for r in map(json.loads, path.read_text().splitlines())
        if r["event"] == "train_step"
    ]
    assert train_steps == list(range(1, 9)), steps


def test_resume_without_checkpoint_starts_fresh_with_a_notice(tiny):
    notices = []
    result = train_from_config(
        {**tiny, "checkpoint": {"resume": True}},
        console=False,
        hooks=[lambda e, p: e == "notice" and notices.append(p["message"])],
    )
    assert result.steps == 6
    assert "no checkpoint in" in notices[0] and "starting a fresh run" in notices[0]


def test_resume_at_target_does_nothing_and_says_so(tiny):
    first, _ = run(tiny)
    notices = []
    second = train_from_config(
        {**tiny, "checkpoint": {"resume": True}},
        console=False,
        hooks=[lambda e, p: e == "notice" and notices.append(p["message"])],
    )
    assert second.status == "at_target" and second.steps == first.steps
    assert any("already at step 6 of max_steps 6; nothing to do" in n for n in notices)


def test_retention_keeps_the_newest_of_this_run(tiny, tmp_path):
    tiny["checkpoint"] = {"interval": 1, "keep_last": 2}
    run(tiny)
    ckpts = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step_*"))
    assert ckpts == ["step_0000000005", "step_0000000006"]


def test_stored_config_is_redacted(tiny, tmp_path):
    tiny["distributed"] = {"token": "hf_dontleakme"}
    result, _ = run(tiny)
    for path in (tmp_path / "run" / "checkpoints").rglob("*"):
        if path.is_file():
            assert b"hf_dontleakme" not in path.read_bytes(), path
    assert load_checkpoint(result.checkpoint).meta["config"]["distributed"]["token"] == "<redacted>"


def test_damaged_newest_checkpoint_falls_back_to_the_previous(tiny, tmp_path):
    tiny["checkpoint"] = {"interval": 2}
    tiny["run"]["max_steps"] = 4
    run(tiny)
    model_file = tmp_path / "run" / "checkpoints" / "step_0000000004" / "model.safetensors"
    model_file.write_bytes(model_file.read_bytes()[:-10])
    warnings = []
    tiny["run"]["max_steps"] = 6
    result = train_from_config(
        {**tiny, "checkpoint": {"interval": 2, "resume": True}},
        console=False,
        hooks=[lambda e, p: e == "warning" and warnings.append(p["message"])],
    )
    assert "step_0000000004" in warnings[0] and "step_0000000002" in warnings[0]
    assert result.steps == 6 and result.tokens == 6 * 8 * 16


@pytest.mark.parametrize(
    ("resume_model", "why"),
    [
        ({"d_model": 64}, r"of another shape \(e\.g\. tok_emb\.weight is \[.*, 32\] there"),
        ({"n_layer": 3}, r": \d+ tensor\(s\) missing \(e\.g\. blocks\.1\.[a-z_.]+\)$"),
    ],
)
def test_resume_with_another_model_is_a_clear_error(tiny, resume_model, why):
    """A model handed over from Python is checked tensor by tensor (its config says nothing)."""
    from speedtronic.errors import CheckpointError
    from speedtronic.model import ReferenceConfig, ReferenceTransformer

    run(tiny)
    params = {k: v for k, v in tiny["model"].items() if k != "name"}
    model = ReferenceTransformer(ReferenceConfig(**{**params, **resume_model}))
    with pytest.raises(CheckpointError, match="does not fit this model: ") as caught:
        run(tiny, resume=True, model=model)
    assert re.search(why, str(caught.value)), caught.value


@pytest.mark.parametrize(("key", "value"), [("d_model", 64), ("n_layer", 3)])
def test_resume_with_another_model_config_names_the_key(tiny, key, value):
    """Issue 31, item 4: a model key that differs from the checkpoint's is refused by name."""
    from speedtronic.errors import ConfigError

    run(tiny)
    before = tiny["model"][key]
    tiny["model"][key] = value
    with pytest.raises(ConfigError, match=rf"model\.{key}: {before} -> {value} cannot change"):
        run(tiny, resume=True)


class DropoutLM(torch.nn.Module):
    """Uses the torch RNG every step: resume must restore it to be exact."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(64, 16)
        self.drop = torch.nn.Dropout(0.5)
        self.out = torch.nn.Linear(16, 64)

    def forward(self, input_ids, labels):
        logits = self.out(self.drop(self.emb(input_ids)))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def test_exact_resume_restores_rng_streams(tiny, tmp_path):
    straight_and_split(tiny, tmp_path, lambda: {"model": DropoutLM()})
