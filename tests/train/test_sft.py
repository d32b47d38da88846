"""Supervised fine-tuning (issue 56 item 2): ``train --init-from`` an imported model on a
``data tokenize --chat`` folder learns only from the assistant turns. transformers is the
oracle of the loss, run on one conversation at a time: a packed example's loss and logits are
its conversations' alone; the run's counts of tokens trained on are the shards' masks; a chat
folder rendered with another template than the model's, or for another context, is refused, and
a packed one with a model that takes no ``doc_ids``."""

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
    held out: packed in ``data``, padded (``--pad``) in ``padded``."""
    tmp = tmp_path_factory.mktemp("sft")
    src, imported = chat_llama(tmp)
    source = write_jsonl(tmp / "chat.jsonl", ROWS)
    args = ("--tokenizer", imported, "--chat", "--seq-len", SEQ, "--val-fraction", "0.25")
    for name, pad in (("data", ()), ("padded", ("--pad",))):
        result = invoke("data", "tokenize", source, tmp / name, *args, "--workers", 1, *pad)
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


def conversations(batch) -> list[tuple[torch.Tensor, torch.Tensor, tuple]]:
    """Each conversation of a batch: its inputs, their labels, and where they lie (row,
    positions); a padded example is one, its padding included (never a label)."""
    found = []
    for row, ids in enumerate(batch["input_ids"]):
        docs = batch["doc_ids"][row] if "doc_ids" in batch else torch.zeros_like(ids)
        for doc in docs.unique():
            at = (docs == doc).nonzero().flatten()
            found.append((ids[at], batch["labels"][row, at], (row, at)))
    return found


def transformers_loss(hf, ids: torch.Tensor, labels: torch.Tensor) -> tuple[float, int]:
    """transformers' loss of one conversation alone, as a sum, and its count of labels: its
    labels are its next tokens, so the last one's token joins the inputs when it is trained."""
    shifted = torch.cat([torch.tensor([-100]), labels[:-1]])
    if labels[-1] != -100:
        ids, shifted = torch.cat([ids, labels[-1:]]), torch.cat([shifted, labels[-1:]])
    count = int((shifted != -100).sum())
    with torch.no_grad():
        loss = hf(input_ids=ids[None], labels=shifted[None]).loss
    return float(loss) * count, count


@pytest.mark.parametrize("masking", ["packed", "padded"])
def test_the_sft_loss_is_transformers_loss_on_each_conversation_alone(masking, chat):
    from torch.utils.data import default_collate

    from speedtronic.data.shards import open_token_path
    from speedtronic.runtime import build_runtime

    tmp, src, imported, data = chat
    data = data if masking == "packed" else tmp / "padded"
    doc = yaml.safe_load(open(config(tmp, data, "loss")).read())
    doc["checkpoint"] = {"init_from": str(imported)}
    model = build_runtime(doc, console=False).model.float().eval()
    dataset = open_token_path(str(data), SEQ, "auto", 300, "data.token_path")
    batch = default_collate([dataset[i] for i in range(len(dataset))])
    labels = batch["labels"]
    assert (labels == -100).any() and (labels != -100).any()
    assert ("doc_ids" in batch) == (masking == "packed")
    found = conversations(batch)
    assert (len(found) > len(labels)) == (masking == "packed")  # several in an example
    hf = transformers.LlamaForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    sums = [transformers_loss(hf, ids, labels) for ids, labels, _ in found]
    theirs = sum(total for total, _ in sums) / sum(count for _, count in sums)
    with torch.no_grad():
        ours, logits = model(**batch), model(**{k: v for k, v in batch.items() if k != "labels"})
        for ids, _, (row, at) in found:  # each packed conversation computed as if alone
            alone = model(ids[None])[0]
            assert (logits[row, at] - alone).abs().max() < 1e-5
    assert abs(float(ours) - theirs) < 1e-5, (float(ours), theirs)
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
    assert len(mask) >= 4 and manifest["parts"]["val"] and (mask & 2).sum(1).max() > 2
    steps = len(mask) // 2  # whole batches of one epoch: the trained count is the masks' sum
    rows = slice(0, steps * 2)
    batches = {"micro_batch_size": 1, "target_batch_size": 2}  # packed: a few examples
    path = config(tmp, data, "tuned", eval_path=str(data), eval_every=steps, shuffle=False,
                  **batches)  # fmt: skip
    args = ("--init-from", imported, "--max-steps", steps)
    result = invoke("train", "-c", path, *args)
    assert result.exit_code == 0, result.stderr
    summary = json.loads((tmp / "tuned" / "summary.json").read_text())
    assert summary["tokens"] == steps * 2 * SEQ
    assert summary["trained_tokens"] == int((mask[rows, 1:] & 1).sum()) < summary["tokens"]
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


def test_a_packed_folder_with_a_model_that_takes_no_doc_ids_is_refused(chat):
    from speedtronic.errors import ConfigError
    from speedtronic.runtime import build_runtime

    tmp, _, _, data = chat

    class Plain(torch.nn.Module):  # a user's model: inputs and labels only
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(300, 8)

        def forward(self, input_ids, labels=None):
            return self.emb(input_ids).sum()

    def run(folder, name):
        doc = yaml.safe_load(open(config(tmp, folder, name)).read())
        doc["model"] = {"vocab_size": 300}
        return build_runtime(doc, model=Plain(), console=False)

    with pytest.raises(ConfigError) as refused:
        run(data, "plain")
    message = str(refused.value)
    assert "data.token_path" in message and "takes no doc_ids" in message and "--pad" in message
    assert "\n" not in message
    run(tmp / "padded", "plain_padded")  # a padded folder's batches: inputs and labels alone
