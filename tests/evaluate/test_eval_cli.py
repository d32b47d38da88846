"""``speedtronic eval`` (issue 39): HellaSwag-form multiple choice and bits per byte on a text,
each equal to what transformers computes on the run's export; bad task files named in one line.

transformers is the oracle here (a test dependency only): the run is exported, loaded as
LlamaForCausalLM with its AutoTokenizer, and every ending is scored one at a time, unbatched
and unpadded, the way llm.c's hellaswag.py does it.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import transformers
from modelout_support import TEXT, assert_one_line_error, invoke, train_text, write_bpe

transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

ITEMS = [
    {"ctx": "It was the best of times, it was the", "label": 1,
     "endings": ["age of foolishness.", "worst of times,", "naïve café", "best"]},
    {"ctx": "it was the age of", "label": "0",
     "endings": ["wisdom,", "times, too: Ünïcode", "the worst of times, it was", "🙂"]},
    {"ctx": "Ünïcode, too:", "label": 2,
     "endings": ["foolishness", "it was", "naïve café, 🙂.", "of"]},
    {"ctx": "It was", "label": 3, "endings": ["café", "the age", "Ünïcode", "the best of times"]},
    {"ctx": "the worst", "label": 0, "endings": ["of times", "age", "of wisdom, it was"]},
]  # fmt: skip


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("eval")
    run = train_text(
        folder, str(write_bpe(folder)), model={"seq_len": 32}, data={"seq_len": 32},
        run={"max_steps": 30},
    )  # fmt: skip
    out = folder / "hf"
    assert invoke("export", run, out).exit_code == 0
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    return run, model, transformers.AutoTokenizer.from_pretrained(out)


def task_file(tmp_path, items=ITEMS, name="task.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items))
    return path


def oracle_logprob(model, tokenizer, context: str, continuation: str) -> tuple[float, int]:
    ctx = tokenizer(context, add_special_tokens=False)["input_ids"]
    end = tokenizer(continuation, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([ctx + end])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits.double(), dim=-1)[0]
    total = sum(logp[len(ctx) + i - 1, token].item() for i, token in enumerate(end))
    return total, len(end)


def test_hellaswag_scores_equal_a_transformers_oracle_on_the_export(bpe_run, tmp_path):
    run, model, tokenizer = bpe_run
    result = invoke(
        "eval", run, "--task", "hellaswag", "--data", task_file(tmp_path), "--batch-size", "3",
        "--format", "json", "--per-example",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["task"] == "hellaswag" and report["n"] == len(ITEMS)
    acc = acc_norm = 0
    for item, example in zip(ITEMS, report["examples"], strict=True):
        scored = [oracle_logprob(model, tokenizer, item["ctx"], " " + e) for e in item["endings"]]
        sums = [s for s, _ in scored]
        means = [s / n for s, n in scored]
        assert example["logprobs"] == pytest.approx(sums, abs=1e-3)
        assert example["tokens"] == [n for _, n in scored]
        assert example["pred"] == max(range(len(sums)), key=sums.__getitem__)
        assert example["pred_norm"] == max(range(len(means)), key=means.__getitem__)
        acc += example["pred"] == int(item["label"])
        acc_norm += example["pred_norm"] == int(item["label"])
    assert report["acc"] == acc / len(ITEMS) and report["acc_norm"] == acc_norm / len(ITEMS)
    assert "sequences scored" in result.stderr  # progress goes to stderr, never stdout
    limited = invoke("eval", run, "--task", "hellaswag", "--data", task_file(tmp_path),
                     "--limit", "2", "--format", "json")  # fmt: skip
    assert json.loads(limited.stdout)["n"] == 2 and "examples" not in json.loads(limited.stdout)


def test_bits_per_byte_of_a_text_file_equals_the_oracle_on_the_export(bpe_run, tmp_path):
    """Non-overlapping windows of the model's 32 positions, the first token unscored, bytes
    counted from the text: computed here from transformers' logits, block by block."""
    run, model, tokenizer = bpe_run
    text = tmp_path / "held_out.txt"
    text.write_text(TEXT[:900], encoding="utf-8")
    result = invoke("eval", run, "--text", text, "--format", "json")
    assert result.exit_code == 0, result.stderr
    (got,) = json.loads(result.stdout)["texts"]
    ids = tokenizer(TEXT[:900], add_special_tokens=False)["input_ids"]
    nats = 0.0
    for start in range(0, len(ids) - 1, 32):
        block = torch.tensor([ids[start : start + 33]])
        with torch.no_grad():
            logp = torch.log_softmax(model(block[:, :-1]).logits.double(), dim=-1)[0]
        nats -= logp.gather(1, block[0, 1:, None]).sum().item()
    nbytes = len(TEXT[:900].encode()) - len(tokenizer.decode(ids[:1]).encode())
    assert got["tokens"] == len(ids) - 1 and got["bytes"] == nbytes
    assert got["bits_per_byte"] == pytest.approx(nats / nbytes / math.log(2), rel=1e-4)
    assert got["loss"] == pytest.approx(nats / (len(ids) - 1), rel=1e-4)
    plain = invoke("eval", run, "--text", text)
    assert f"bits per byte {got['bits_per_byte']:.4f}" in plain.stdout


BAD = [
    ('{"ctx": "a", "endings": ["b", "c"], "label": 0}\nnot json at all\n', 2, "not JSON"),
    ('{"ctx": "a", "endings": ["b", "c"], "label": 2}\n', 1, "label 2 is out of range"),
    ('\n{"endings": ["b", "c"], "label": 0}\n', 2, "field 'ctx'"),
    ('{"ctx": "a", "label": 0}\n', 1, "field 'endings'"),
    ('{"ctx": "a", "endings": ["b", "c"]}\n', 1, "field 'label'"),
    ('{"ctx": "a", "endings": ["b", "c"], "label": "x"}\n', 1, "field 'label'"),
    ("[1, 2]\n", 1, "expected a JSON object"),
]


@pytest.mark.parametrize("body,line,needle", BAD, ids=[b[2] for b in BAD])
def test_a_bad_task_file_is_one_line_naming_file_and_line(bpe_run, tmp_path, body, line, needle):
    run = bpe_run[0]
    path = tmp_path / "bad.jsonl"
    path.write_text(body)
    result = invoke("eval", run, "--task", "hellaswag", "--data", path)
    assert_one_line_error(result, f"{path}:{line}: ", needle)
    assert result.stdout == ""


@pytest.mark.parametrize(
    "args,needle",
    [
        ((), "nothing to evaluate"),
        (("--task", "hellaswag"), "needs --data"),
        (("--task", "piqa", "--data", "x.jsonl"), "unknown task 'piqa'"),
        (("--text", "missing.txt"), "cannot read --text missing.txt"),
    ],
)
def test_usage_errors_are_one_line(bpe_run, tmp_path, args, needle, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.jsonl").write_text('{"ctx": "a", "endings": ["b", "c"], "label": 0}\n')
    assert_one_line_error(invoke("eval", bpe_run[0], *args), needle)
