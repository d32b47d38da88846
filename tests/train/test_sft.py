"""Supervised fine-tuning (issue 56 item 2): ``train --init-from`` an imported model on a
``data tokenize --chat`` folder learns only from the assistant turns. transformers is the
oracle of the loss; the run's counts of tokens trained on are the shards' masks; a chat folder
rendered with another template than the model's, or for another context, is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml
from chat_support import CONVERSATIONS, TEMPLATE, chat_llama, tokenizer_dir, write_jsonl
from modelout_support import assert_one_line_error, invoke

transformers = pytest.importorskip("transformers")
pytest.importorskip("jinja2")
transformers.utils.logging.set_verbosity_error()
SEQ = 96
# 16 conversations: the three, each with its words in four orders
ROWS = [
    [{**m, "content": " ".join(m["content"].split()[k:] + m["content"].split()[:k])} for m in c]
    for k in range(4)
    for c in [*CONVERSATIONS, CONVERSATIONS[0][1:], CONVERSATIONS[1][:2]]
][:16]


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    """The tiny Llama, its import and 16 conversations tokenized with its template, a quarter
    held out."""
    tmp = tmp_path_factory.mktemp("sft")
    src, imported = chat_llama(tmp)
    source = write_jsonl(tmp / "chat.jsonl", ROWS)
    args = ("--tokenizer", imported, "--chat", "--seq-len", SEQ, "--val-fraction", "0.25")
    result = invoke("data", "tokenize", source, tmp / "data", *args, "--workers", 1)
    assert result.exit_code == 0, result.stderr
    return tmp, src, imported, tmp / "data"


def config(tmp, data, name, **data_keys) -> str:
    doc = {
        "run": {"device": "cpu", "seed": 0, "max_steps": 3, "output_dir": str(tmp / name)},
        "data": {"token_path": str(data), "seq_len": SEQ, "micro_batch_size": 2,
                 "target_batch_size": 4, **data_keys},
        "optimizer": {"name": "adamw", "lr": 1e-3},
        "logging": {"every_steps": 1, "json_file": "metrics.jsonl"},
    }  # fmt: skip
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_the_sft_loss_is_transformers_loss_on_the_same_labels(chat):
    from torch.utils.data import default_collate

    from speedtronic.data.shards import open_token_path
    from speedtronic.runtime import build_runtime

    tmp, src, imported, data = chat
    doc = yaml.safe_load(open(config(tmp, data, "loss")).read())
    doc["checkpoint"] = {"init_from": str(imported)}
    model = build_runtime(doc, console=False).model.float().eval()
    dataset = open_token_path(str(data), SEQ, "auto", 300, "data.token_path")
    batch = default_collate([dataset[i] for i in range(len(dataset))])
    labels = batch["labels"]
    assert (labels == -100).any() and (labels != -100).any()
    assert (labels[:, -1] == -100).all()  # padded: transformers' shift loses no label
    hf = transformers.LlamaForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    shifted = torch.cat([torch.full_like(labels[:, :1], -100), labels[:, :-1]], dim=1)
    with torch.no_grad():
        ours = model(**batch)
        theirs = hf(input_ids=batch["input_ids"], labels=shifted).loss
    assert abs(float(ours) - float(theirs)) < 1e-5, (float(ours), float(theirs))
    # and it is the loss of the assistant tokens alone: the prompt's would change it
    every = batch["input_ids"][:, 1:]
    with torch.no_grad():
        plain = model(batch["input_ids"][:, :-1], every)
    assert abs(float(plain) - float(ours)) > 1e-3


def test_a_fine_tune_counts_the_tokens_it_trained_on_and_scores_held_out_chats(chat):
    tmp, _, imported, data = chat
    manifest = json.loads((data / "manifest.json").read_text())
    train = manifest["parts"]["train"][0]
    mask = np.fromfile(data / train["mask"], dtype=np.uint8).reshape(-1, SEQ + 1)
    assert len(mask) >= 8 and manifest["parts"]["val"]
    steps = len(mask) // 4  # whole batches of one epoch: the trained count is the masks' sum
    rows = slice(0, steps * 4)
    path = config(tmp, data, "tuned", eval_path=str(data), eval_every=steps, shuffle=False)
    args = ("--init-from", imported, "--max-steps", steps)
    result = invoke("train", "-c", path, *args)
    assert result.exit_code == 0, result.stderr
    summary = json.loads((tmp / "tuned" / "summary.json").read_text())
    assert summary["tokens"] == steps * 4 * SEQ
    assert summary["trained_tokens"] == int(mask[rows, 1:].sum()) < summary["tokens"]
    assert "tokens trained on" in result.stderr + result.stdout
    assert summary["eval"]["val"]["loss"] > 0
    events = [json.loads(line) for line in (tmp / "tuned/metrics.jsonl").read_text().splitlines()]
    step = [e for e in events if e.get("event") == "train_step"][-1]
    assert step["trained_tokens"] == summary["trained_tokens"]
    assert step["trained_tokens_per_s"] < step["tokens_per_s"]


@pytest.mark.parametrize(
    "template, extra, needles",
    [
        (
            "{% for m in messages %}{{ m['content'] }}{% endfor %}",
            (),
            ("is rendered with the chat template of", "another chat template"),
        ),
        (TEMPLATE, ("<tool>",), ("is tokenized with tokenizer.json sha256", "was trained with")),
    ],
    ids=["template", "tokenizer"],
)
def test_a_chat_folder_of_another_template_or_tokenizer_is_refused(
    template, extra, needles, chat, tmp_path
):
    _, _, imported, _ = chat
    other = tokenizer_dir(tmp_path, template, extra=extra)
    source = write_jsonl(tmp_path / "chat.jsonl", ROWS)
    args = ("--tokenizer", other, "--chat", "--seq-len", SEQ, "--workers", 1)
    assert invoke("data", "tokenize", source, tmp_path / "data", *args).exit_code == 0
    data = config(tmp_path, tmp_path / "data", "x")
    assert_one_line_error(invoke("train", "-c", data, "--init-from", imported), *needles)


def test_a_chat_folder_for_another_context_is_refused(chat):
    tmp, _, imported, data = chat
    path = config(tmp, data, "short")
    doc = yaml.safe_load(open(path).read())
    doc["data"]["seq_len"] = 64
    open(path, "w").write(yaml.safe_dump(doc))
    result = invoke("train", "-c", path, "--init-from", imported)
    assert_one_line_error(result, "data.seq_len: 64", f"--seq-len {SEQ}")
